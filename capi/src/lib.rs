//! libllada: the runtime behind a C interface, so that an Android or iOS app (or any C
//! program) can load an artifact and generate. `include/llada.h` is generated from this crate
//! by cbindgen and checked in; its opening comment states the thread-safety rules.
//!
//! Every exported function returns a [`Status`] (or a plain value that cannot fail), keeps a
//! message for [`llada_last_error`], and never lets a Rust panic unwind into C.

mod api;
mod error;
mod params;

pub use api::*;
pub use error::{llada_last_error, Status};
pub use params::{llada_default_params, llada_default_session_params, Alg, Backend, Experts, Params, Policy, RandomStream, Remasking, Revision, SessionSettings, Staging};
