//! Qualcomm's HTP (the phone NPU) through QNN. So far: the library opened at run time, its C
//! ABI declared and pinned (`abi`), the provider chosen by version, a backend instance with
//! QNN's log routed to the runtime's. Graphs compiled ahead of time by `lladac` and run from
//! the artifact come next (issue 41); `--backend qnn` does not exist until they do.

pub mod abi;
pub mod library;

pub use library::{QnnLibrary, HOW_TO_GET};
