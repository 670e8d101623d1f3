//! The runtime's error type. Messages name the file, option or value at fault and say what to
//! change.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: does not exist", path.display())]
    NotFound { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: {source}", path.display())]
    Artifact { path: PathBuf, source: llada_ir::Error },
    /// A request the sampler or the plan cannot serve (bad settings, too long a prompt).
    #[error("{0}")]
    Request(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{}: {msg}", path.display())]
    Input { path: PathBuf, msg: String },
    /// The caller stopped a generation between steps.
    #[error("generation cancelled")]
    Cancelled,
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound { path }
        } else {
            Error::Io { path, source }
        }
    }

    pub fn request(msg: impl Into<String>) -> Self {
        Error::Request(msg.into())
    }
}

pub type Result<T> = std::result::Result<T, Error>;
