//! The backends, by name. A backend runs one planned graph over the window ([`Executor`]):
//! the host's CPU kernels standing in for an accelerator, Vulkan for GPUs, QNN for
//! Qualcomm's NPU. Each is one folder here and one line in [`BACKENDS`]: its name, what it
//! runs on, and what opens it (or why this build lacks it). Front ends (the CLI's
//! `--backend`, the C API, Python, the server) take a backend by name from this table and
//! list it in their errors; nothing else knows which backends exist. The window comes from
//! the backend: where its device can address it, laid out by the plan.

mod head_shape;
mod inputs;
mod interface;
mod soft_embed;

pub mod host;
pub mod qnn;
#[cfg(feature = "test-backends")]
pub mod recording;
pub mod vulkan;

pub use host::HostExecutor;
pub use head_shape::{AttentionOp, HeadShape};
pub use inputs::*;
pub use interface::*;
pub use soft_embed::SoftEmbed;

use crate::error::{Error, Result, Setting};
use crate::kernels::cpu::Features;
use crate::model::Model;
use crate::window::Window;

/// What opens a backend for a model: `threads` CPU threads (the host's kernels, and the work
/// around the passes) and kernel paths `features`; it returns the executor and the window it
/// runs in.
pub type Open = fn(model: &Model, threads: usize, features: Features) -> Result<(Box<dyn Executor>, Window)>;

/// A registered backend.
pub struct Backend {
    pub name: &'static str,
    /// What it runs on, in words (`--help`, and the errors that list the backends).
    pub about: &'static str,
    /// What opens it, or why this build has none (a musl binary cannot load a device's driver).
    pub constructor: std::result::Result<Open, &'static str>,
}

/// Every backend, in the order front ends list them (the C API's backend numbers index it).
pub static BACKENDS: &[Backend] = &[
    host::BACKEND,
    vulkan::BACKEND,
    qnn::BACKEND,
    #[cfg(feature = "test-backends")]
    recording::BACKEND,
];

/// The registered backend named `name`, or an error naming `--backend` and listing them.
pub fn find(name: &str) -> Result<&'static Backend> {
    BACKENDS.iter().find(|b| b.name == name).ok_or_else(|| Error::setting(Setting::Backend, format!("'{name}' is not a backend; the backends are {}", names().join(", "))))
}

/// The registered backends' names, in order.
pub fn names() -> Vec<&'static str> {
    BACKENDS.iter().map(|b| b.name).collect()
}

/// The host backend, every session's default.
pub fn default_backend() -> &'static Backend {
    &BACKENDS[0]
}

impl Backend {
    /// Opens this backend for `model` (see [`Open`]).
    pub fn open(&self, model: &Model, threads: usize, features: Features) -> Result<(Box<dyn Executor>, Window)> {
        match self.constructor {
            Ok(open) => open(model, threads, features),
            Err(why) => Err(Error::setting(Setting::Backend, why.to_string())),
        }
    }

    /// Whether this build has the backend (its device may still be missing at run time).
    pub fn built(&self) -> bool {
        self.constructor.is_ok()
    }
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl PartialEq for Backend {
    fn eq(&self, other: &Backend) -> bool {
        self.name == other.name
    }
}

impl Eq for Backend {}

#[cfg(test)]
mod tests {
    #[test]
    fn backends_are_found_by_name_and_an_unknown_one_lists_them() {
        assert_eq!(super::find("host").unwrap().name, "host");
        assert_eq!(super::default_backend().name, "host");
        // The C API's numbers are indexes: host 0, vulkan 1, qnn 2.
        assert_eq!(&super::names()[..3], ["host", "vulkan", "qnn"]);
        let e = super::find("tpu").unwrap_err().to_string();
        assert!(e.contains("'tpu' is not a backend") && e.contains("host, vulkan, qnn"), "{e}");
    }
}
