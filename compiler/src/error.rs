//! The compiler's error type. Every message names the file, key or tensor at fault and, where
//! there is one, what to do about it.

use std::path::PathBuf;

pub use llada_ir::FileError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    File(FileError),
    #[error("{}: invalid JSON: {msg}", path.display())]
    Json { path: PathBuf, msg: String },
    #[error("{}: {key}: {msg}", path.display())]
    Config { path: PathBuf, key: String, msg: String },
    #[error("{}: tensor '{name}' is missing{hint}", path.display())]
    MissingTensor { path: PathBuf, name: String, hint: String },
    #[error("{}: tensor '{name}' has shape {found:?}, expected {expected:?} ({why})", path.display())]
    TensorShape { path: PathBuf, name: String, found: Vec<usize>, expected: Vec<usize>, why: String },
    #[error("{}: tensor '{name}' has dtype {dtype}; supported: F32, BF16, F16", path.display())]
    TensorDType { path: PathBuf, name: String, dtype: String },
    /// A weight that is NaN or infinite: the model would compute NaN from it.
    #[error("{}: tensor '{name}' holds {value} at {index}; every weight must be finite (a damaged or diverged checkpoint)", path.display())]
    NonFinite { path: PathBuf, name: String, value: String, index: String },
    #[error("{}: not a valid safetensors file: {msg}", path.display())]
    Safetensors { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Tokenizer { path: PathBuf, msg: String },
    #[error("{}: {msg}", path.display())]
    Onnx { path: PathBuf, msg: String },
    /// A GGUF file's fault: `what` is the key, the tensor, or the part of the header.
    #[error("{}: {what}: {msg}", path.display())]
    Gguf { path: PathBuf, what: String, msg: String },
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Ir(#[from] llada_ir::Error),
    #[error("{}: {source}", path.display())]
    Artifact { path: PathBuf, source: llada_ir::Error },
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::File(FileError::new(path, source))
    }

    pub fn config(path: impl Into<PathBuf>, key: &str, msg: impl Into<String>) -> Self {
        Error::Config { path: path.into(), key: key.to_string(), msg: msg.into() }
    }
}

/// Runs `f`, turning a panic inside it into `None`: for third-party parsers that panic on
/// some malformed input. The panic hook is silenced meanwhile, so the caller's error stays
/// the only line printed.
pub fn contain_panic<T>(f: impl FnOnce() -> T) -> Option<T> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(hook);
    result.ok()
}

pub type Result<T> = std::result::Result<T, Error>;
