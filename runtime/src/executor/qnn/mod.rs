//! Qualcomm's HTP (the phone NPU) through QNN: the artifact's context binaries (`lladac
//! --target sm8650`...) created at session open, and each planned graph run as the executable
//! the compiler built for it. The op list never reaches this backend: it runs graph ids.
//!
//! Per pass the host does what lies at the executables' boundary: it embeds the token rows,
//! gathers the rotary rows at their positions, builds the attention mask from the run's
//! inputs (`io`), and afterwards stores the keys and values of the rows the run stores into
//! the window's KV cache and widens the logits into the window's logits value. The KV cache
//! itself is bound in place: each layer's key and value planes of the window are the
//! executable's cache inputs (client buffers: the simulator has no registered buffers, QNN.md).
//!
//! A mixture-of-experts model's graph runs as several executables per context, cut at each
//! MoE layer: between them the host routes and runs the routed experts (through the session's
//! expert runtime, as the host executor does) on the boundary tensors the executable before
//! wrote, and hands the experts' sum to the one after (`io::run_host_ops`).
//!
//! A model split by layers into several contexts runs them in order, the hidden states of
//! one the input of the next. The resident contexts are created at session open; the others
//! are created when their layers come and freed when a later one needs the room (the swap
//! schedule of the section: resident contexts plus the largest rotating one fit its budget).


#[cfg(all(feature = "qnn", not(target_env = "musl")))]
mod executor;
#[cfg(all(feature = "qnn", not(target_env = "musl")))]
mod io;

#[cfg(all(feature = "qnn", not(target_env = "musl")))]
pub use executor::QnnExecutor;
#[cfg(all(feature = "qnn", not(target_env = "musl")))]
pub use llada_qnn::{abi, library, QnnLibrary, HOW_TO_GET};

use super::Backend;

pub const BACKEND: Backend = Backend {
    name: "qnn",
    about: "Qualcomm's HTP running the NPU executables of an artifact compiled for sm8550, sm8650, sm8750 or sm8850, through the QNN library in LLADA_QNN_LIB (on x86-64, its simulator)",
    #[cfg(all(feature = "qnn", not(target_env = "musl")))]
    constructor: Ok(|model, threads, features| {
        let window = crate::window::Window::in_host_memory(&model.header)?;
        Ok((Box::new(QnnExecutor::new(model, threads, features)?), window))
    }),
    #[cfg(not(all(feature = "qnn", not(target_env = "musl"))))]
    constructor: Err("qnn: this build of llada-rt has no QNN backend (a static musl binary cannot load Qualcomm's bionic libraries, or the `qnn` feature is off); build for aarch64-linux-android with the NDK"),
};
