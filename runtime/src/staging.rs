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
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Instant;

use llada_ir::program::Step;
use llada_ir::Header;

use crate::error::{Error, Result};
use crate::trace::{Trace, Track};
use crate::lease::{Failure, Slots};
use crate::window::{SlotMem, SlotPtr};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagingMode {
    /// A staging thread copies ahead of use (the plan's schedule).
    Async,
    /// Each segment is copied right before its first op, on the compute thread.
    Sync,
}

impl StagingMode {
    /// Every mode's name, as [`parse`](Self::parse) takes it.
    pub const NAMES: &'static [&'static str] = &["async", "sync"];

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

/// A slot as the copies see it: its bytes, the global step (pass * rotating + index) it
/// holds, and how long that copy took. The copy into a slot is requested by its global step.
struct RotatingSlot {
    mem: SlotMem,
    step: Option<u64>,
    copy_seconds: f64,
}

/// File range of each rotating segment, in the plan's order.
fn rotating_ranges(h: &Header, data_offset: u64) -> Vec<(u64, usize)> {
    h.plan.window.rotating.iter().map(|&s| (data_offset + h.segments[s as usize].offset, h.segments[s as usize].nbytes as usize)).collect()
}

/// What the staging thread reads and where it records its copies.
struct Source {
    file: Arc<File>,
    ranges: Vec<(u64, usize)>,
    /// Where copies are recorded, once a trace is attached.
    trace: OnceLock<Arc<Trace>>,
    /// Segment names, for the trace.
    names: Vec<String>,
}

pub struct Stager {
    mode: StagingMode,
    path: std::path::PathBuf,
    source: Arc<Source>,
    slots: Slots<RotatingSlot, u64>,
    /// Read handles on the slots, for the executor.
    reads: Arc<[SlotPtr]>,
    thread: Option<JoinHandle<()>>,
    /// Global step of the current pass's first rotating segment.
    pass_base: u64,
    pass: PassStaging,
}

impl Stager {
    /// A stager reading `file` (the verified artifact at `path`) into the window's `slots`.
    /// The window must outlive the stager (the session drops the stager, joining its thread,
    /// before the window), and this must be the slots' only stager.
    pub fn new(h: &Header, file: Arc<File>, path: &Path, data_offset: u64, slots: Vec<SlotPtr>, mode: StagingMode) -> Result<Stager> {
        let names = h.plan.window.rotating.iter().map(|&s| h.segments[s as usize].name.clone()).collect();
        let source = Arc::new(Source { file, ranges: rotating_ranges(h, data_offset), trace: OnceLock::new(), names });
        // SAFETY: one handle per slot (the caller's contract: the only stager of a window
        // that outlives it); the executor reads a slot only once its copy is home (`wait`).
        let mems = slots.iter().map(|&p| RotatingSlot { mem: unsafe { SlotMem::new(p) }, step: None, copy_seconds: 0.0 }).collect();
        let mut stager = Stager { mode, path: path.to_path_buf(), source, slots: Slots::new(mems), reads: slots.into(), thread: None, pass_base: 0, pass: PassStaging::default() };
        stager.start()?;
        Ok(stager)
    }

    /// Starts the staging thread (async mode, anything to stage) from global step 0: each
    /// slot's first segment is requested at once.
    fn start(&mut self) -> Result<()> {
        let rotating = self.source.ranges.len();
        if self.mode == StagingMode::Async && rotating > 0 {
            for s in 0..self.reads.len().min(rotating) {
                self.slots.request(s, s as u64);
            }
            let (source, slots) = (self.source.clone(), self.slots.clone());
            let thread = std::thread::Builder::new()
                .name("llada-staging".into())
                .spawn(move || slots.contain_panic(|| stage(&source, &slots)))
                .map_err(|e| Error::io("starting the staging thread", e))?;
            self.thread = Some(thread);
        }
        Ok(())
    }

    /// Stops the staging thread and joins it (a failed pass: nothing is staged until
    /// [`restart`](Self::restart)).
    pub fn stop(&mut self) {
        self.slots.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// After a pass that failed part-way (its slots never all released, the thread possibly
    /// ahead of it or failed): stops the thread if it still runs, forgets every slot and
    /// starts again from the first segment, as a new session would.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.slots.reopen(|s| (s.step, s.copy_seconds) = (None, 0.0));
        self.pass_base = 0;
        self.pass = PassStaging::default();
        self.start()
    }

    pub fn mode(&self) -> StagingMode {
        self.mode
    }

    /// Records copies and waits in `trace` from now on.
    pub fn set_trace(&mut self, trace: Arc<Trace>) {
        let _ = self.source.trace.set(trace);
    }

    /// Read handles on the slots; rotating segment `i` lives in slot `i % slots.len()`. (An
    /// owned copy of the handles, so the executor can read slots while it tells the stager
    /// about ops.)
    pub fn slots(&self) -> Arc<[SlotPtr]> {
        self.reads.clone()
    }

    /// Follows a program's staging steps (waits and releases); its other steps are the
    /// backend's.
    pub fn follow(&mut self, step: Step) -> Result<()> {
        match step {
            Step::Wait { rotating, slot } => self.wait(rotating, slot),
            Step::Release { slot, step } => {
                self.release(slot, step);
                Ok(())
            }
            Step::Embed { .. } | Step::Dense { .. } | Step::Moe { .. } => Ok(()),
        }
    }

    /// A program's [`Step::Wait`](llada_ir::program::Step::Wait): rotating segment
    /// `rotating` is in slot `slot` when this returns (copied here in sync mode).
    fn wait(&mut self, rotating: u32, slot: u32) -> Result<()> {
        let (i, s) = (rotating as usize, slot as usize);
        let (offset, len) = self.source.ranges[i];
        match self.mode {
            StagingMode::Sync => {
                let start = Instant::now();
                // No thread: the slot's handle is always home.
                let read = self.slots.with(s, |slot, _| self.source.file.read_exact_at(&mut slot.mem.bytes_mut()[..len], offset));
                read.unwrap_or(Ok(())).map_err(|e| crate::model::read_error(&self.path, e))?;
                if let Some(t) = self.source.trace.get() {
                    t.span(Track::Dense, format!("copy {} (sync)", self.source.names[i]), start, Instant::now());
                }
                let t = start.elapsed().as_secs_f64();
                self.pass.stall_seconds += t;
                self.pass.copy_seconds += t;
            }
            StagingMode::Async => {
                let want = Some(self.pass_base + i as u64);
                let start = Instant::now();
                let copy_seconds = match self.slots.with(s, |slot, _| (slot.step == want).then_some(slot.copy_seconds)).flatten() {
                    Some(t) => t,
                    None => {
                        let t = self.slots.wait(s, |slot, _| slot.step == want, |slot| slot.copy_seconds);
                        let t = t.map_err(|_| self.slots.failure(|f| f.error(&self.path, "the staging thread")).unwrap_or_else(|| Error::Internal("the staging thread stopped".into())))?;
                        self.pass.stall_seconds += start.elapsed().as_secs_f64();
                        if let Some(tr) = self.source.trace.get() {
                            tr.span(Track::Dense, format!("wait for {}", self.source.names[i]), start, Instant::now());
                        }
                        t
                    }
                };
                self.pass.copy_seconds += copy_seconds;
            }
        }
        self.pass.staged_bytes += len as u64;
        Ok(())
    }

    /// A program's [`Step::Release`](llada_ir::program::Step::Release): slot `slot` is free
    /// for its copy of the pass's rotating step `step` (the next pass's where `step` is past
    /// the rotating count). A release is the request for that copy, by its global step.
    fn release(&mut self, slot: u32, step: u32) {
        if self.mode == StagingMode::Async {
            self.slots.request(slot as usize, self.pass_base + step as u64);
        }
    }

    /// Ends a pass: returns its staging figures.
    pub fn end_pass(&mut self) -> PassStaging {
        self.pass_base += self.source.ranges.len() as u64;
        std::mem::take(&mut self.pass)
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The staging thread: copies each requested step, the earliest first, into its slot, until
/// the stager closes its slots; a failed read fails them (the executor's wait reports it).
fn stage(source: &Source, slots: &Slots<RotatingSlot, u64>) {
    while let Some(mut lease) = slots.take(|_, &step| Some(step)) {
        let s = lease.index();
        let (slot, &step) = lease.parts();
        let i = (step % source.ranges.len() as u64) as usize;
        let (offset, len) = source.ranges[i];
        let start = Instant::now();
        if let Err(e) = source.file.read_exact_at(&mut slot.mem.bytes_mut()[..len], offset) {
            slot.step = None;
            drop(lease);
            slots.fail(Failure::Read(e));
            return;
        }
        (slot.step, slot.copy_seconds) = (Some(step), start.elapsed().as_secs_f64());
        if let Some(t) = source.trace.get() {
            t.span(Track::Staging, format!("copy {} into slot {s}", source.names[i]), start, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_copy_names_the_artifact() {
        let e = Failure::Panicked.error(Path::new("m.lad"), "the staging thread");
        assert!(matches!(e, Error::Internal(_)), "{e}");
        let e = Failure::Read(std::io::Error::from(std::io::ErrorKind::UnexpectedEof)).error(Path::new("m.lad"), "the staging thread");
        assert!(matches!(e, Error::Changed { .. }), "{e}");
    }
}
