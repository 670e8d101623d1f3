//! `llada-rt`: maps a llada artifact, verifies it once, and executes its plan: the dense
//! graphs on the accelerator path (here the host executor) and the sampler on the CPU.

pub mod error;
pub mod executor;
mod fault;
mod generator;
pub mod kernels;
pub mod lease;
pub mod moe;
mod operands;
pub mod pool;
pub mod model;
pub mod params;
pub mod sampler;
pub mod session;
pub mod settings;
mod side_lane;
pub mod staging;
pub mod text;
pub mod topk;
pub mod trace;
pub mod window;

pub use error::{Error, FileError, Result, Setting};
pub use model::Model;
pub use params::{SamplerParams, SessionParams};
pub use generator::{generate, generate_until, Generator};
pub use sampler::{Generation, Remasking};
pub use session::Session;
