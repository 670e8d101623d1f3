//! A mapped artifact that shrinks under the runtime. Reading a page of a file mapping past the
//! file's end raises SIGBUS, which kills the process: an app whose artifact is truncated in
//! place (a copy over it, an interrupted download) would crash in the middle of a pass. Here a
//! process-wide SIGBUS handler, installed once, checks whether the faulting address lies in a
//! guarded artifact mapping; if so it maps a zero page over the faulting page (the read then
//! sees zeros, a valid value of every element type) and marks the mapping faulted, and the
//! session fails the pass with a clear error at its end ([`Guard::faulted`]). A fault anywhere
//! else goes to the handler that was installed before, or to the default action, as if this
//! one were not there.
//!
//! Replacing an artifact by renaming a new file over it needs none of this: the open file and
//! its mapping keep the old inode alive.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Mappings guarded at once (a process rarely holds more than a few models).
const GUARDED: usize = 64;

struct Slot {
    start: AtomicUsize,
    /// 0: the slot is free.
    len: AtomicUsize,
    faulted: AtomicBool,
}

static SLOTS: [Slot; GUARDED] = [const { Slot { start: AtomicUsize::new(0), len: AtomicUsize::new(0), faulted: AtomicBool::new(false) } }; GUARDED];
/// Serialises claiming and freeing slots (the handler only reads them).
static CLAIM: Mutex<()> = Mutex::new(());
/// The disposition SIGBUS had before ours, and the page size; set once, before the handler.
static INSTALLED: OnceLock<Option<(libc::sigaction, usize)>> = OnceLock::new();

/// A registered mapping; unregistered on drop, which must come before the mapping is unmapped.
pub struct Guard {
    slot: usize,
}

impl Guard {
    /// Guards `len` bytes from `start` (a file mapping). `None` if the handler cannot be
    /// installed or every slot is taken: the mapping is then unguarded, as any mmap is.
    pub fn new(start: *const u8, len: usize) -> Option<Guard> {
        if len == 0 || install().is_none() {
            return None;
        }
        let _claim = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
        let slot = SLOTS.iter().position(|s| s.len.load(Ordering::Acquire) == 0)?;
        let s = &SLOTS[slot];
        s.faulted.store(false, Ordering::Release);
        s.start.store(start as usize, Ordering::Release);
        s.len.store(len, Ordering::Release);
        Some(Guard { slot })
    }

    /// Whether a read of the mapping has faulted (the file shrank below it): everything read
    /// from it since may be zeros instead of the artifact's bytes.
    pub fn faulted(&self) -> bool {
        SLOTS[self.slot].faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _claim = CLAIM.lock().unwrap_or_else(|e| e.into_inner());
        SLOTS[self.slot].len.store(0, Ordering::Release);
    }
}

/// Installs the handler once; `None` if that failed.
fn install() -> Option<&'static (libc::sigaction, usize)> {
    INSTALLED
        .get_or_init(|| {
            // SAFETY: sysconf has no preconditions; sigaction gets a zeroed struct filled with
            // a handler of the signature SA_SIGINFO requires, and writes the old one into
            // `previous`, a valid out-pointer. `INSTALLED` is set before the handler can
            // run for a guarded address (no slot is registered until this returns).
            unsafe {
                let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)).ok().filter(|&p| p > 0)?;
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_sigbus as *const () as usize;
                action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
                libc::sigemptyset(&mut action.sa_mask);
                let mut previous: libc::sigaction = std::mem::zeroed();
                (libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0).then_some((previous, page))
            }
        })
        .as_ref()
}

/// The SIGBUS handler. Only async-signal-safe work: atomic loads and stores, `mmap`, and
/// `sigaction` to hand an unguarded fault back.
extern "C" fn on_sigbus(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(Some((previous, page))) = INSTALLED.get() else {
        // A fault between our sigaction and its record: nothing is guarded yet, so take the
        // default action (returning would re-run the faulting access forever).
        // SAFETY: as in `pass_on`.
        unsafe { pass_on(signal, info, &std::mem::zeroed()) };
        return;
    };
    // SAFETY: the kernel passes a valid siginfo for a SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &SLOTS {
        let (start, len) = (s.start.load(Ordering::Acquire), s.len.load(Ordering::Acquire));
        if len > 0 && addr >= start && addr - start < len {
            let at = addr & !(page - 1);
            // SAFETY: `at` is the page of a live, guarded read-only file mapping (its owner
            // unregisters before unmapping); a private anonymous page replaces it in place,
            // which only changes what reads of that page see (zeros), and unmapping the whole
            // mapping later removes it too.
            let mapped = unsafe { libc::mmap(at as *mut libc::c_void, *page, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0) };
            if mapped != libc::MAP_FAILED {
                s.faulted.store(true, Ordering::Release);
                return;
            }
        }
    }
    // Not ours: as if this handler did not exist.
    if previous.sa_sigaction == libc::SIG_DFL || previous.sa_sigaction == libc::SIG_IGN {
        // SAFETY: `info` is the kernel's; `previous` a disposition read by sigaction.
        unsafe { pass_on(signal, info, previous) };
    } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(previous.sa_sigaction) };
        f(signal, info, context);
    } else {
        // SAFETY: a plain handler installed without SA_SIGINFO.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(previous.sa_sigaction) };
        f(signal);
    }
}

/// What SIGBUS does without a handler (`previous`: SIG_DFL, or SIG_IGN; zeroed is SIG_DFL). A
/// signal sent by a process (`si_code` <= 0) is ignored under SIG_IGN, or re-raised with the
/// default action; a fault (`si_code` > 0) cannot be ignored: the default action is restored
/// and the faulting access, run again on return, takes it.
///
/// # Safety
/// Called from the SIGBUS handler with the kernel's `info`.
unsafe fn pass_on(signal: libc::c_int, info: *mut libc::siginfo_t, previous: &libc::sigaction) {
    // SAFETY: the kernel's siginfo.
    let sent = unsafe { (*info).si_code } <= 0;
    if sent && previous.sa_sigaction == libc::SIG_IGN {
        return;
    }
    // SAFETY: sigaction with a zeroed (SIG_DFL) disposition and raise are async-signal-safe.
    unsafe {
        let default: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, &default, std::ptr::null_mut());
        if sent {
            libc::raise(signal);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_truncated_mapping_reads_zeros_and_reports_it() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 3 * 65536]).unwrap();
        // SAFETY: a private read-only map of a file this test owns; it shrinks on purpose.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let guard = Guard::new(map.as_ptr(), map.len()).expect("the handler installs");
        assert_eq!(map[2 * 65536], 7);
        assert!(!guard.faulted());
        file.set_len(65536).unwrap();
        // Past the new end: without the guard this read raises SIGBUS and ends the process.
        let past = std::hint::black_box(&map[..])[2 * 65536 + 5];
        assert_eq!(past, 0);
        assert!(guard.faulted());
        assert_eq!(map[100], 7, "pages inside the file are untouched");
        drop(guard);
    }

    #[test]
    fn slots_are_reused_after_drop() {
        let buf = [0u8; 64];
        let guards: Vec<Guard> = (0..GUARDED / 2).map(|_| Guard::new(buf.as_ptr(), buf.len()).unwrap()).collect();
        drop(guards);
        let again: Vec<Guard> = (0..GUARDED / 2).map(|_| Guard::new(buf.as_ptr(), buf.len()).unwrap()).collect();
        assert!(again.iter().all(|g| !g.faulted()));
    }
}
