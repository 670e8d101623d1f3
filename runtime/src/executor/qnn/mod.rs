//! Qualcomm's HTP (the phone NPU) through QNN: the library (`llada-qnn`) opened at run time.
pub use llada_qnn::{abi, library, QnnLibrary, HOW_TO_GET};
