//! `lladac`: the llada ahead-of-time compiler. Hugging Face LLaDA checkpoint (or an ONNX
//! export of one) in, one verified, mmap-able artifact out (see `llada-ir`).

pub mod compile;
pub mod convert;
pub mod error;
pub mod estimate;
pub mod gguf;
pub mod hf;
pub mod inspect;
pub mod latency;
pub mod layout;
pub mod lower;
pub mod lower_diffusion_gemma;
pub mod memory;
pub mod npu_estimate;
pub mod npu_plan;
pub mod onnx;
pub mod optrace;
pub mod qnn;
pub mod qnn_ops;
pub mod calibrate;
pub mod window;

#[cfg(test)]
mod testing;

pub use compile::{compile, CompileOptions, CompileSummary, Quant};
pub use error::{Error, FileError, Result};
