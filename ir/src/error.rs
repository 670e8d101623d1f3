//! The one error type of the artifact contract. Messages name the element that is wrong
//! (`tensors[12] 'model.transformer.wte.weight'`, `graphs[3].ops[40]`), so a user or a
//! bug report can point at it directly.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a llada artifact (the file does not start with the llada magic bytes)")]
    NotAnArtifact,
    #[error(
        "artifact format version {found_major}.{found_minor} is not supported by this build \
         (it reads {supported_major}.x); recompile the model with a matching lladac"
    )]
    FormatVersion { found_major: u16, found_minor: u16, supported_major: u16 },
    #[error("{}", section_version_message(kind, *found, *reads))]
    SectionVersion { kind: String, found: u32, reads: Option<u32> },
    #[error("truncated artifact: {what} needs bytes up to {need} but the file has {have}")]
    Truncated { what: String, need: u64, have: u64 },
    #[error("checksum mismatch in {what}: the artifact is corrupted; recompile or copy it again")]
    Checksum { what: String },
    #[error("invalid artifact: {0}")]
    Invalid(String),
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
}

/// A file the compiler or the runtime could not use, named by its path: a missing one is said
/// plainly, any other failure with the system's message.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}: does not exist", path.display())]
    NotFound { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

impl FileError {
    /// `source`, met on `path`.
    pub fn new(path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        if source.kind() == io::ErrorKind::NotFound {
            FileError::NotFound { path }
        } else {
            FileError::Io { path, source }
        }
    }
}

/// The message of a required section this build cannot read: a known one at another version,
/// or one it does not know at all.
fn section_version_message(kind: &str, found: u32, reads: Option<u32>) -> String {
    match reads {
        Some(v) => format!("the artifact's section '{kind}' is version {found} but this build reads version {v}; recompile the model with a matching lladac"),
        None => format!("the artifact needs section '{kind}' (version {found}), which this build does not know; run it with a newer llada-rt, or recompile the model with a matching lladac"),
    }
}

pub type Result<T> = std::result::Result<T, Error>;
