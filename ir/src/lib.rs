//! `llada-ir`: the artifact contract between `lladac` (which writes it) and `llada-rt` (which
//! runs it). Types, serialization and verification; no compute. See `COMPATIBILITY.md`.

pub mod diffusion_gemma;
pub mod error;
pub mod files;
pub mod format;
pub mod graph;
pub mod header;
pub mod npu;
pub mod packing;
pub mod program;
pub mod read;
pub mod sections;
pub mod verify;
mod verify_window;
pub mod window;
pub mod window_sizes;
#[cfg(feature = "write")]
pub mod write;

pub use error::{Error, FileError, Result};
pub use format::{align_up, FORMAT_MAJOR, FORMAT_MINOR, SEGMENT_ALIGN, TENSOR_ALIGN, WINDOW_ALIGN};
pub use graph::{Graph, Op, Rows, StageStep, TensorId, Value, ValueId};
pub use header::{CompileInfo, Extension, Family, GluActivation, Header, ModelConfig, MoeConfig, Plan, Segment, SpecialTokens, TensorInfo, TokenizerSpec};
pub use packing::DType;
pub use read::Artifact;
pub use window::{ExpertCosts, ExpertPlan, KvDType, PathCost, Region, ResidentSegment, Scratch, WindowPlan};
#[cfg(feature = "write")]
pub use write::ArtifactWriter;

#[cfg(not(target_endian = "little"))]
compile_error!("llada artifacts are little-endian and are mapped in place; big-endian hosts are not supported");
