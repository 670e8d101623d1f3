//! Staging weight segments into the window's slots, as the plan's swap schedule says.
//!
//! Every pass uses the rotating segments in the same order, and rotating segment `i` always
//! lives in slot `i % slots`. So the staging thread simply walks that order forever: it copies
//! the next segment into its slot as soon as the slot's previous occupant is released, which
//! also prefetches the first segments of the next pass behind the end of this one. The
//! executor waits before a segment's first op only if its copy is not done, and releases the
//! slot after the segment's last op. Reads go from the artifact file straight into the slot
//! (`pread`), not through a long-lived mapping, so staged weights are never resident twice.
//!
//! `StagingMode::Sync` is the naive strategy for comparison: each segment is read right
//! before its first op, on the compute thread, with no prefetch.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use llada_ir::{Graph, Header};

use crate::error::{Error, Result};
use crate::trace::{Trace, Track};
use crate::window::SlotPtr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagingMode {
    /// A staging thread copies ahead of use (the plan's schedule).
    Async,
    /// Each segment is copied right before its first op, on the compute thread.
    Sync,
}

impl StagingMode {
    pub fn parse(s: &str) -> Option<StagingMode> {
        match s {
            "async" => Some(StagingMode::Async),
            "sync" => Some(StagingMode::Sync),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StagingMode::Async => "async",
            StagingMode::Sync => "sync",
        }
    }
}

/// What staging cost one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PassStaging {
    /// Bytes of the segments this pass read from slots (copied in for it).
    pub staged_bytes: u64,
    /// Time the compute path waited for a copy.
    pub stall_seconds: f64,
    /// Time the copies this pass used took.
    pub copy_seconds: f64,
}

impl PassStaging {
    /// Share of the copy time hidden behind compute (1 when nothing was staged).
    pub fn overlap(&self) -> f64 {
        if self.copy_seconds > 0.0 { (1.0 - self.stall_seconds / self.copy_seconds).clamp(0.0, 1.0) } else { 1.0 }
    }

    pub fn add(&mut self, o: &PassStaging) {
        self.staged_bytes += o.staged_bytes;
        self.stall_seconds += o.stall_seconds;
        self.copy_seconds += o.copy_seconds;
    }
}

#[derive(Clone, Copy, Default)]
struct SlotState {
    /// Global step (pass * rotating + index) the slot holds or is receiving.
    step: Option<u64>,
    ready: bool,
    released: bool,
    copy_seconds: f64,
}

#[derive(Default)]
struct State {
    slots: Vec<SlotState>,
    stop: bool,
    /// The staging thread failed: reported by the next wait.
    failed: Option<CopyFailure>,
}

/// Why a staging thread stopped (this one, or the experts').
pub(crate) enum CopyFailure {
    Read(std::io::Error),
    Panicked,
}

impl CopyFailure {
    /// The error a waiter for the thread's copies gets; `what` names the thread.
    pub(crate) fn error(&self, path: &Path, what: &str) -> Error {
        match self {
            CopyFailure::Read(e) => crate::model::read_error(path, std::io::Error::new(e.kind(), format!("{what} failed to read: {e}"))),
            CopyFailure::Panicked => Error::Internal(format!("{what} panicked")),
        }
    }
}

/// Runs a staging thread's loop; a panic in it is recorded by `on_panic` (so that waiters
/// fail instead of waiting forever) instead of ending the thread silently.
pub(crate) fn contain_panic(body: impl FnOnce(), on_panic: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
        on_panic();
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Where copies are recorded, once a trace is attached.
    trace: std::sync::OnceLock<Arc<Trace>>,
    /// Segment names, for the trace.
    names: Vec<String>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock means the other side panicked; its state is still consistent
        // enough to report and stop.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// File range of each rotating segment, in the plan's order.
fn rotating_ranges(h: &Header, data_offset: u64) -> Vec<(u64, usize)> {
    h.plan.window.rotating.iter().map(|&s| (data_offset + h.segments[s as usize].offset, h.segments[s as usize].nbytes as usize)).collect()
}

pub struct Stager {
    mode: StagingMode,
    file: Arc<File>,
    path: std::path::PathBuf,
    ranges: Vec<(u64, usize)>,
    slots: Arc<[SlotPtr]>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Global step of the current pass's first rotating segment.
    pass_base: u64,
    pass: PassStaging,
}

impl Stager {
    /// A stager reading `file` (the verified artifact at `path`). `slots` must point into a
    /// window that outlives the stager (the session drops the stager, joining its thread,
    /// before the window).
    pub fn new(h: &Header, file: Arc<File>, path: &Path, data_offset: u64, slots: Vec<SlotPtr>, mode: StagingMode) -> Result<Stager> {
        let ranges = rotating_ranges(h, data_offset);
        let names = h.plan.window.rotating.iter().map(|&s| h.segments[s as usize].name.clone()).collect();
        let shared = Arc::new(Shared {
            state: Mutex::new(State { slots: vec![SlotState::default(); slots.len()], ..State::default() }),
            changed: Condvar::new(),
            trace: std::sync::OnceLock::new(),
            names,
        });
        let mut stager = Stager { mode, file, path: path.to_path_buf(), ranges, slots: slots.into(), shared, thread: None, pass_base: 0, pass: PassStaging::default() };
        stager.start()?;
        Ok(stager)
    }

    /// Starts the staging thread (async mode, anything to stage) from global step 0.
    fn start(&mut self) -> Result<()> {
        if self.mode == StagingMode::Async && !self.ranges.is_empty() {
            let (file, ranges, slots, shared) = (self.file.clone(), self.ranges.clone(), self.slots.clone(), self.shared.clone());
            let thread = std::thread::Builder::new()
                .name("llada-staging".into())
                .spawn(move || {
                    contain_panic(
                        || stage_forever(&file, &ranges, &slots, &shared),
                        || {
                            shared.lock().failed = Some(CopyFailure::Panicked);
                            shared.changed.notify_all();
                        },
                    )
                })
                .map_err(|e| Error::io("starting the staging thread", e))?;
            self.thread = Some(thread);
        }
        Ok(())
    }

    /// Stops the staging thread and joins it (a failed pass: nothing is staged until
    /// [`restart`](Self::restart)).
    pub fn stop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// After a pass that failed part-way (its slots never all released, the thread possibly
    /// ahead of it or failed): stops the thread if it still runs, forgets every slot and
    /// starts again from the first segment, as a new session would.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        *self.shared.lock() = State { slots: vec![SlotState::default(); self.slots.len()], ..State::default() };
        self.pass_base = 0;
        self.pass = PassStaging::default();
        self.start()
    }

    pub fn mode(&self) -> StagingMode {
        self.mode
    }

    /// Records copies and waits in `trace` from now on.
    pub fn set_trace(&mut self, trace: Arc<Trace>) {
        let _ = self.shared.trace.set(trace);
    }

    /// The slots; rotating segment `i` lives in slot `i % slots.len()`. (An owned copy of
    /// the handles, so the executor can read slots while it tells the stager about ops.)
    pub fn slots(&self) -> Arc<[SlotPtr]> {
        self.slots.clone()
    }

    /// Before op `op` of `g`: makes sure every segment first used there is in its slot.
    pub fn before_op(&mut self, g: &Graph, op: usize) -> Result<()> {
        for st in g.staging.iter().filter(|st| st.first_op as usize == op) {
            let i = st.rotating as usize;
            let s = st.slot as usize;
            let (offset, len) = self.ranges[i];
            match self.mode {
                StagingMode::Sync => {
                    let start = Instant::now();
                    // SAFETY: in sync mode no other thread touches the slots, and no slice of
                    // this slot is alive between ops.
                    let dst = unsafe { self.slots[s].bytes_mut() };
                    self.file.read_exact_at(&mut dst[..len], offset).map_err(|e| crate::model::read_error(&self.path, e))?;
                    if let Some(t) = self.shared.trace.get() {
                        t.span(Track::Dense, format!("copy {} (sync)", self.shared.names[i]), start, Instant::now());
                    }
                    let t = start.elapsed().as_secs_f64();
                    self.pass.stall_seconds += t;
                    self.pass.copy_seconds += t;
                }
                StagingMode::Async => {
                    let want = self.pass_base + i as u64;
                    let mut state = self.shared.lock();
                    let start = Instant::now();
                    let mut waited = false;
                    while !(state.slots[s].step == Some(want) && state.slots[s].ready) {
                        if let Some(f) = &state.failed {
                            return Err(f.error(&self.path, "the staging thread"));
                        }
                        waited = true;
                        state = self.shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
                    }
                    if waited {
                        self.pass.stall_seconds += start.elapsed().as_secs_f64();
                        if let Some(t) = self.shared.trace.get() {
                            t.span(Track::Dense, format!("wait for {}", self.shared.names[i]), start, Instant::now());
                        }
                    }
                    self.pass.copy_seconds += state.slots[s].copy_seconds;
                }
            }
            self.pass.staged_bytes += len as u64;
        }
        Ok(())
    }

    /// After op `op` of `g`: releases a slot for its next segment where the schedule says
    /// that segment's copy may start (`stage_after_op`), and, for a slot's last segment of the
    /// pass (whose successor is the next pass's and is staged behind this one), after its
    /// last use.
    pub fn after_op(&mut self, g: &Graph, op: usize) {
        if self.mode == StagingMode::Sync {
            return;
        }
        let mut released = false;
        let mut state = None;
        let steps = &g.staging;
        for (i, st) in steps.iter().enumerate() {
            let copy_may_start = st.stage_after_op == Some(op as u32);
            let last_in_slot = st.last_op as usize == op && !steps[i + 1..].iter().any(|later| later.slot == st.slot);
            if copy_may_start || last_in_slot {
                let state = state.get_or_insert_with(|| self.shared.lock());
                state.slots[st.slot as usize].released = true;
                released = true;
            }
        }
        drop(state);
        if released {
            self.shared.changed.notify_all();
        }
    }

    /// Ends a pass: returns its staging figures.
    pub fn end_pass(&mut self) -> PassStaging {
        self.pass_base += self.ranges.len() as u64;
        std::mem::take(&mut self.pass)
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The staging thread: copies rotating segment `n % R` of global step `n` into its slot as
/// soon as the slot is free, for n = 0, 1, 2, ... until told to stop.
fn stage_forever(file: &File, ranges: &[(u64, usize)], slots: &[SlotPtr], shared: &Shared) {
    for n in 0u64.. {
        let i = (n % ranges.len() as u64) as usize;
        let s = i % slots.len();
        {
            let mut state = shared.lock();
            while !state.stop && !(state.slots[s].step.is_none() || state.slots[s].released) {
                state = shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            if state.stop {
                return;
            }
            state.slots[s] = SlotState { step: Some(n), ready: false, released: false, copy_seconds: 0.0 };
        }
        let (offset, len) = ranges[i];
        let start = Instant::now();
        // SAFETY: the executor released this slot and will not read it until it is marked
        // ready below; the session joins this thread before freeing the window.
        let dst = unsafe { slots[s].bytes_mut() };
        let result = file.read_exact_at(&mut dst[..len], offset);
        let mut state = shared.lock();
        match result {
            Ok(()) => {
                state.slots[s].ready = true;
                state.slots[s].copy_seconds = start.elapsed().as_secs_f64();
                if let Some(t) = shared.trace.get() {
                    t.span(Track::Staging, format!("copy {} into slot {s}", shared.names[i]), start, Instant::now());
                }
            }
            Err(e) => {
                state.failed = Some(CopyFailure::Read(e));
                drop(state);
                shared.changed.notify_all();
                return;
            }
        }
        drop(state);
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_staging_loop_is_recorded_not_lost() {
        let mut recorded = false;
        contain_panic(|| panic!("a bug in the copy loop"), || recorded = true);
        assert!(recorded);
        let mut recorded = false;
        contain_panic(|| {}, || recorded = true);
        assert!(!recorded);
        let e = CopyFailure::Panicked.error(Path::new("m.lad"), "the staging thread");
        assert!(matches!(e, Error::Internal(_)), "{e}");
        let e = CopyFailure::Read(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)).error(Path::new("m.lad"), "the staging thread");
        assert!(matches!(e, Error::Changed { .. }), "{e}");
    }
}
