//! Status codes, the per-thread error message, and the guard that keeps panics out of C.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use llada_rt::FileError;

/// What a call did. Every code but `LLADA_STATUS_OK` leaves a message for `llada_last_error`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok = 0,
    /// A null pointer, text that is not UTF-8, or a value outside its field's range.
    InvalidArgument = 1,
    /// The artifact (or a file it names) does not exist.
    NotFound = 2,
    /// A file could not be used: reading it failed, the path names a directory (or another
    /// thing that is not a regular file), or the artifact changed on disk while loaded. The
    /// message names the path and what is wrong with it.
    Io = 3,
    /// The artifact is not a valid llada artifact (the message names the failing element).
    InvalidArtifact = 4,
    /// The request does not fit the sampler or the compiled plan (too long a prompt, a block
    /// length the plan cannot serve, a prompt containing the mask token, ...).
    InvalidRequest = 5,
    /// The tokenizer or chat template failed on the prompt.
    Text = 6,
    /// The generation was cancelled by `llada_cancel` or by the step callback.
    Cancelled = 7,
    /// Another generation is running on this session.
    Busy = 8,
    /// A bug in libllada (a caught panic, a worker thread that panicked); the message says
    /// whether the session that saw it can be used again.
    Internal = 9,
    /// The accelerator backend failed (a Vulkan call returned an error, the device was lost);
    /// the session fails its next pass too if the device stays unusable.
    Device = 10,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    // Interior NULs cannot be represented in a C string; none is expected in our messages.
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// The message of the last call on this thread that did not return `LLADA_STATUS_OK`
/// (empty if none failed). UTF-8, NUL-terminated, owned by libllada, valid until the
/// thread's next call into libllada.
#[unsafe(no_mangle)]
pub extern "C" fn llada_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// A failure: its code and message.
pub(crate) struct Failure(pub Status, pub String);

impl Failure {
    pub(crate) fn argument(msg: impl Into<String>) -> Failure {
        Failure(Status::InvalidArgument, msg.into())
    }
}

impl From<llada_rt::Error> for Failure {
    fn from(e: llada_rt::Error) -> Failure {
        use llada_rt::Error as E;
        let status = match &e {
            E::File(FileError::NotFound { .. }) => Status::NotFound,
            // `Input`: a path that names something other than the file it must be (a
            // directory): a problem with the file, not with the request.
            E::File(FileError::Io { .. }) | E::Changed { .. } | E::Input { .. } => Status::Io,
            E::Artifact { .. } => Status::InvalidArtifact,
            E::Request(_) => Status::InvalidRequest,
            E::Tokenizer(_) | E::Template(_) => Status::Text,
            E::Cancelled => Status::Cancelled,
            // Named as the C field, not the CLI flag.
            E::Setting { setting, message } => return Failure(Status::InvalidArgument, format!("{} {message}", setting.c_field())),
            E::Internal(_) => Status::Internal,
            E::Device(_) => Status::Device,
        };
        Failure(status, e.to_string())
    }
}

/// Runs one exported call: its failure becomes a status and the thread's message, a panic
/// becomes `Internal` instead of unwinding into C (undefined behaviour).
pub(crate) fn guard(call: impl FnOnce() -> Result<(), Failure>) -> Status {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(())) => Status::Ok,
        Ok(Err(Failure(status, msg))) => {
            set_last_error(&msg);
            status
        }
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            set_last_error(&format!("internal error in libllada: {}", what.as_deref().unwrap_or("a panic")));
            Status::Internal
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llada_rt::{Error, Setting};

    #[test]
    fn each_kind_of_failure_has_one_status() {
        assert_eq!(Failure::from(Error::Internal("the staging thread panicked".into())).0, Status::Internal);
        let f = Failure::from(Error::setting(Setting::SpecBlocks, "7 is outside 0..=1"));
        assert_eq!((f.0, f.1.as_str()), (Status::InvalidArgument, "params.spec_blocks 7 is outside 0..=1"));
        assert_eq!(Failure::from(Error::Changed { path: "m.lad".into() }).0, Status::Io);
        assert_eq!(Failure::from(Error::request("too long")).0, Status::InvalidRequest);
        let f = Failure::from(Error::Input { path: "models".into(), msg: "is a directory".into() });
        assert_eq!((f.0, f.1.as_str()), (Status::Io, "models: is a directory"));
    }
}
