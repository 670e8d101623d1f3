//! `llada-qnn`: Qualcomm's QNN HTP library (the Hexagon NPU of Snapdragon phones), opened at
//! run time. Our own declarations of its C ABI ([`abi`], pinned by size and offset tests), the
//! library and its provider ([`library`]), graphs built and finalized for a chosen SoC and
//! serialized as context binaries (what `lladac` does, [`build`]), and context binaries
//! loaded and their graphs executed over client buffers (what `llada-rt` does, [`context`]).
//! It knows nothing of llada's artifact: the compiler and the runtime each map their own data
//! onto it, so the two still share only the artifact format.

pub mod abi;
pub mod build;
pub mod context;
pub mod library;
pub mod profile;
pub mod system;

pub use build::{GraphBuilder, TensorRef};
pub use context::{Context, Device, IoBuffer, LoadOptions};
pub use library::{Backend, QnnLibrary, HOW_TO_GET};
pub use profile::{Estimate, Profile};

/// What can go wrong, each naming what failed.
#[derive(Debug)]
pub enum Error {
    /// The library is not where the user said, or cannot be loaded: [`HOW_TO_GET`] says what to do.
    Missing(String),
    /// One QNN call failed: the call, the graph (where there is one) and QNN's code.
    Call { call: &'static str, graph: Option<String>, code: u64 },
    /// Anything else (a slot missing from the table, a malformed request).
    Other(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Missing(m) | Error::Other(m) => f.write_str(m),
            Error::Call { call, graph, code } => {
                let graph = graph.as_ref().map(|g| format!(" (graph '{g}')")).unwrap_or_default();
                write!(f, "QNN {call}{graph} failed with error {code}{}", describe(*code))
            }
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// QNN's error families by code range (`QnnCommon.h`), so a bare number says where it came from.
fn describe(code: u64) -> &'static str {
    match code {
        1000..=1999 => " (common)",
        4000..=4999 => " (backend)",
        5000..=5999 => " (context)",
        6000..=6999 => " (graph)",
        7000..=7999 => " (tensor)",
        8000..=8999 => " (memory)",
        14000..=14999 => " (device)",
        _ => "",
    }
}

/// One QNN call's result as a [`Result`], naming the call and the graph.
pub fn check(call: &'static str, graph: Option<&str>, e: abi::ErrorHandle) -> Result<()> {
    if e == 0 {
        return Ok(());
    }
    Err(Error::Call { call, graph: graph.map(str::to_string), code: abi::error_code(e) })
}
