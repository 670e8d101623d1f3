//! SIGTERM and SIGINT ask the server to stop: the handler only sets a flag (all a signal
//! handler may safely do); the accept loop polls it. A second one exits at once.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // A second signal while the first drains: exit at once (`_exit` is async-signal-safe).
    if REQUESTED.swap(true, Ordering::SeqCst) {
        // SAFETY: `_exit` ends the process without running anything of it; always safe.
        unsafe { libc::_exit(130) };
    }
}

/// Installs the handler for SIGTERM and SIGINT.
pub fn install() {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: `on_signal` only stores to an atomic, which is async-signal-safe; `signal` with a
    // valid function pointer has no other precondition.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
