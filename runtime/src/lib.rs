//! `llada-rt`: maps a llada artifact, verifies it once, and executes its plan: the dense
//! graphs on the accelerator path (here the host executor) and the sampler on the CPU.

pub mod conformance;
pub mod error;
pub mod executor;
pub mod kernels;
pub mod model;
pub mod sampler;
pub mod session;
pub mod text;

pub use error::{Error, Result};
pub use model::Model;
pub use sampler::{generate, Generation, Remasking, SamplerParams};
pub use session::Session;
