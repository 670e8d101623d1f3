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

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Slots per chunk of the registry. Not a limit: a full registry grows by another chunk.
const CHUNK: usize = 64;

struct Slot {
    start: AtomicUsize,
    /// 0: the slot is free.
    len: AtomicUsize,
    faulted: AtomicBool,
}

/// A fixed array of slots and the next chunk (null until the registry grows past this one).
struct Chunk {
    slots: [Slot; CHUNK],
    next: AtomicPtr<Chunk>,
}

impl Chunk {
    const fn new() -> Chunk {
        Chunk { slots: [const { Slot { start: AtomicUsize::new(0), len: AtomicUsize::new(0), faulted: AtomicBool::new(false) } }; CHUNK], next: AtomicPtr::new(std::ptr::null_mut()) }
    }
}

/// The guarded mappings: an append-only list of chunks, its first chunk inline. Slots are
/// claimed and released under `claim`, which also serialises growth; the signal handler walks
/// the list with atomic loads only, taking no lock and allocating nothing.
///
/// Invariant: a chunk, once published in a `next` pointer (with `Release`, after it is fully
/// initialised), is never moved or freed while its registry lives, and the process's registry
/// ([`GUARDED`]) lives forever. So every non-null `next` the handler loads (with `Acquire`)
/// points to a valid, initialised chunk. Chunks are freed only by dropping a whole registry,
/// which needs `&mut` (no reader left); the static one is never dropped.
struct Registry {
    first: Chunk,
    claim: Mutex<()>,
}

static GUARDED: Registry = Registry::new();

impl Registry {
    const fn new() -> Registry {
        Registry { first: Chunk::new(), claim: Mutex::new(()) }
    }

    /// The chunks in order, read with atomic loads only (async-signal-safe).
    fn chunks(&self) -> impl Iterator<Item = &Chunk> {
        std::iter::successors(Some(&self.first), |c| {
            // SAFETY: non-null `next` pointers point to published chunks that live as long as
            // `self` (the registry's invariant); `Acquire` pairs with the `Release` publishing.
            unsafe { c.next.load(Ordering::Acquire).as_ref() }
        })
    }

    /// A free slot, now holding `len` bytes from `start`; a new chunk if every slot is taken.
    /// Allocates (when growing): never call it from the signal handler.
    fn claim(&self, start: usize, len: usize) -> &Slot {
        debug_assert!(len > 0);
        let _claim = self.claim.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = &self.first;
        for chunk in self.chunks() {
            if let Some(s) = chunk.slots.iter().find(|s| s.len.load(Ordering::Acquire) == 0) {
                return Self::fill(s, start, len);
            }
            last = chunk;
        }
        // Every slot taken: a new chunk after the last, published once initialised. Only
        // `claim` holders write `next`, so `last.next` is still null.
        let chunk: &Chunk = Box::leak(Box::new(Chunk::new()));
        let slot = Self::fill(&chunk.slots[0], start, len);
        last.next.store(chunk as *const Chunk as *mut Chunk, Ordering::Release);
        slot
    }

    fn fill(s: &Slot, start: usize, len: usize) -> &Slot {
        s.faulted.store(false, Ordering::Release);
        s.start.store(start, Ordering::Release);
        // Last: the handler reads `len` first, so once it sees this one it sees this `start`.
        s.len.store(len, Ordering::Release);
        s
    }

    fn release(&self, slot: &Slot) {
        let _claim = self.claim.lock().unwrap_or_else(|e| e.into_inner());
        slot.len.store(0, Ordering::Release);
    }

    /// The slot guarding `addr`, if any: atomic loads only (async-signal-safe).
    fn find(&self, addr: usize) -> Option<&Slot> {
        self.chunks().flat_map(|c| c.slots.iter()).find(|s| {
            let len = s.len.load(Ordering::Acquire);
            len > 0 && addr.wrapping_sub(s.start.load(Ordering::Acquire)) < len
        })
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Only a registry other than the static one is ever dropped (the tests'): `&mut self`
        // means no reader is left, so its chunks can go.
        let mut next = *self.first.next.get_mut();
        while !next.is_null() {
            // SAFETY: every published chunk came from `Box::leak` in `claim` and is owned by
            // this registry alone; each is freed once, following the list.
            let mut chunk = unsafe { Box::from_raw(next) };
            next = *chunk.next.get_mut();
        }
    }
}

/// The disposition SIGBUS had before ours, and the page size; set once, before the handler.
static INSTALLED: OnceLock<Option<(libc::sigaction, usize)>> = OnceLock::new();

/// A registered mapping; unregistered on drop, which must come before the mapping is unmapped.
pub struct Guard {
    slot: &'static Slot,
}

impl Guard {
    /// Guards `len` bytes from `start` (a file mapping). `None` only if `len` is 0 or the
    /// handler cannot be installed: the mapping is then unguarded, as any mmap is. There is no
    /// limit on the number of mappings guarded at once.
    pub fn new(start: *const u8, len: usize) -> Option<Guard> {
        if len == 0 || install().is_none() {
            return None;
        }
        Some(Guard { slot: GUARDED.claim(start as usize, len) })
    }

    /// Whether a read of the mapping has faulted (the file shrank below it): everything read
    /// from it since may be zeros instead of the artifact's bytes.
    pub fn faulted(&self) -> bool {
        self.slot.faulted.load(Ordering::Acquire)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        GUARDED.release(self.slot);
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

/// The SIGBUS handler. Only async-signal-safe work: atomic loads and stores (the registry's
/// walk, [`Registry::find`]), `mmap`, and `sigaction` to hand an unguarded fault back; no lock,
/// no allocation.
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
    if let Some(s) = GUARDED.find(addr) {
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
        let r = Registry::new();
        let claimed: Vec<&Slot> = (0..CHUNK / 2).map(|i| r.claim(0x1000 * (i + 1), 64)).collect();
        claimed.iter().for_each(|s| r.release(s));
        let again: Vec<&Slot> = (0..CHUNK / 2).map(|i| r.claim(0x1000 * (i + 1), 64)).collect();
        assert!(again.iter().all(|s| !s.faulted.load(Ordering::Acquire)));
        assert_eq!(r.chunks().count(), 1, "released slots are claimed again before the registry grows");
    }

    #[test]
    fn the_registry_grows_past_a_chunk_and_finds_every_mapping() {
        let r = Registry::new();
        let n = 3 * CHUNK + 5;
        // Mapping i: 0x1000 bytes from 0x10000 * (i + 1).
        let slots: Vec<&Slot> = (0..n).map(|i| r.claim(0x10000 * (i + 1), 0x1000)).collect();
        assert_eq!(r.chunks().count(), 4);
        for (i, s) in slots.iter().enumerate() {
            let start = 0x10000 * (i + 1);
            assert!(std::ptr::eq(r.find(start).unwrap(), *s));
            assert!(std::ptr::eq(r.find(start + 0xfff).unwrap(), *s));
            assert!(r.find(start + 0x1000).is_none(), "one past the end is not guarded");
            assert!(r.find(start - 1).is_none());
        }
        // A released slot in the second chunk no longer matches, and is the one claimed next.
        r.release(slots[CHUNK + 3]);
        assert!(r.find(0x10000 * (CHUNK + 4)).is_none());
        assert!(std::ptr::eq(r.claim(0x7000_0000, 16), slots[CHUNK + 3]));
        assert_eq!(r.chunks().count(), 4);
    }

    /// More mappings guarded at once than one chunk holds (the process's registry once held
    /// 64 and left the 65th unguarded): a truncated one past the first chunk still reads zeros.
    #[test]
    fn a_truncated_mapping_past_the_first_chunk_is_guarded() {
        let buf = [0u8; 64];
        let many: Vec<Guard> = (0..2 * CHUNK).map(|_| Guard::new(buf.as_ptr(), buf.len()).unwrap()).collect();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 3 * 65536]).unwrap();
        // SAFETY: a private read-only map of a file this test owns; it shrinks on purpose.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let guard = Guard::new(map.as_ptr(), map.len()).expect("the handler installs");
        assert!(GUARDED.chunks().count() >= 3);
        file.set_len(65536).unwrap();
        // Without a guard this read raises SIGBUS and ends the test process.
        assert_eq!(std::hint::black_box(&map[..])[2 * 65536 + 5], 0);
        assert!(guard.faulted());
        assert!(many.iter().all(|g| !g.faulted()), "only the truncated mapping is marked");
        drop(guard);
    }
}
