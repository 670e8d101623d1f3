//! Copying experts into expert slots on a staging thread: urgent copies (an expert the layer
//! running now computes from its slot) before speculative ones (prefetches, refreshes), each
//! kind in the order asked.
//!
//! Only the accelerator path's thread decides what goes where: it asks for a copy (slot,
//! expert) and gets a ticket; the slot holds that expert once the slot's finished ticket
//! reaches it. The protocol that makes the raw slot pointers safe: the thread writes only the
//! slots of queued jobs; the executor reads a slot only when its latest ticket is finished,
//! and never queues a copy into a slot it is reading (it queues before or after computing
//! from it, on the same thread).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::staging::{contain_panic, CopyFailure};
use crate::window::SlotPtr;
use std::path::PathBuf;

struct Job {
    slot: usize,
    /// File offset and length of the expert's segment.
    range: (u64, usize),
    ticket: u64,
    urgent: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Per slot: the last finished ticket, and whether a thread is copying into it now.
    done: Vec<u64>,
    copying: Vec<bool>,
    stop: bool,
    failed: Option<CopyFailure>,
    /// Bytes copied, wall seconds the copies took and CPU seconds they used, since the last
    /// `take_copied`.
    copied_bytes: u64,
    copy_seconds: f64,
    copy_cpu_seconds: f64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    file: Arc<File>,
    slots: Vec<SlotPtr>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the first queued job that `fits` and whose slot no thread is copying into (two
    /// copies into one slot at once would mix), marking its slot as being copied into.
    fn take(state: &mut State, fits: impl Fn(&Job) -> bool) -> Option<Job> {
        let i = state.queue.iter().position(|j| fits(j) && !state.copying[j.slot])?;
        let job = state.queue.remove(i)?;
        state.copying[job.slot] = true;
        Some(job)
    }

    /// Copies `job`, which the calling thread has [`take`](Self::take)n (so no other thread
    /// writes its slot), then publishes it; returns the state, locked again.
    fn copy(&self, job: Job) -> MutexGuard<'_, State> {
        let (start, cpu_start) = (Instant::now(), thread_cpu_seconds());
        // SAFETY: the executor queued this job and reads the slot only after its ticket is
        // marked done below (and queues no copy into a slot it is reading); `take` removed the
        // job under the lock while no other copy into its slot ran and marked the slot, so
        // this thread alone writes it; the window outlives the stager (its owner drops it
        // first).
        let dst = unsafe { self.slots[job.slot].bytes_mut() };
        let result = self.file.read_exact_at(&mut dst[..job.range.1], job.range.0);
        let mut state = self.lock();
        state.copying[job.slot] = false;
        match result {
            Ok(()) => {
                state.done[job.slot] = state.done[job.slot].max(job.ticket);
                state.copied_bytes += job.range.1 as u64;
                state.copy_seconds += start.elapsed().as_secs_f64();
                state.copy_cpu_seconds += thread_cpu_seconds() - cpu_start;
            }
            Err(e) => state.failed = Some(CopyFailure::Read(e)),
        }
        self.changed.notify_all();
        state
    }
}

/// What the copies of a while took (see [`ExpertStager::take_copied`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Copied {
    pub bytes: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
}

/// CPU time this thread has used, in seconds.
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill; the clock id is a constant the
    // platform defines. On failure `t` stays zero, which only makes a copy look free.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

pub struct ExpertStager {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
    next_ticket: u64,
}

impl ExpertStager {
    /// A staging thread reading `file` (the artifact) into `slots` (pointers into a window
    /// the owner drops after this stager).
    pub fn new(file: Arc<File>, path: PathBuf, slots: Vec<SlotPtr>) -> Result<ExpertStager> {
        // At most one queued job per slot (`enqueue`): the queue never outgrows this.
        let queue = VecDeque::with_capacity(slots.len());
        let state = Mutex::new(State { queue, done: vec![0; slots.len()], copying: vec![false; slots.len()], ..State::default() });
        let shared = Arc::new(Shared { state, changed: Condvar::new(), file, slots });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("llada-expert-staging".into())
                .spawn(move || {
                    contain_panic(
                        || copy_forever(&shared),
                        || {
                            shared.lock().failed = Some(CopyFailure::Panicked);
                            shared.changed.notify_all();
                        },
                    )
                })
                .map_err(|e| Error::io("starting the expert staging thread", e))?
        };
        Ok(ExpertStager { shared, thread: Some(thread), path, next_ticket: 1 })
    }

    /// Queues a copy of the segment at `range` into `slot`, ahead of every speculative copy
    /// if `urgent`; returns its ticket and the bytes of a queued copy into the same slot that
    /// this one replaces (it had not started, and now never will: the slot's newest ticket
    /// is the one its readers wait for).
    pub fn stage(&mut self, slot: usize, range: (u64, usize), urgent: bool) -> (u64, Option<usize>) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let mut state = self.shared.lock();
        let replaced = enqueue(&mut state.queue, Job { slot, range, ticket, urgent });
        drop(state);
        self.shared.changed.notify_all();
        (ticket, replaced)
    }

    /// Makes `slot`'s queued copy, if any, urgent (moving it ahead of the speculative ones).
    pub fn hurry(&self, slot: usize) {
        promote(&mut self.shared.lock().queue, slot);
    }

    /// Whether `slot`'s copy `ticket` has finished.
    pub fn is_done(&self, slot: usize, ticket: u64) -> bool {
        self.shared.lock().done[slot] >= ticket
    }

    /// Waits until `slot`'s copy `ticket` has finished; returns the seconds waited. A copy
    /// still queued is made by the waiting thread itself: it has nothing else to do, and on
    /// a host whose cores are all computing the staging thread may wait milliseconds for
    /// one (measured: 8-12 ms a copy with both cores on experts, against about 1 ms).
    pub fn wait(&self, slot: usize, ticket: u64) -> Result<f64> {
        let start = Instant::now();
        let mut state = self.shared.lock();
        while state.done[slot] < ticket {
            if let Some(f) = &state.failed {
                return Err(f.error(&self.path, "the expert staging thread"));
            }
            state = match Shared::take(&mut state, |j| j.slot == slot) {
                Some(job) => {
                    drop(state);
                    self.shared.copy(job)
                }
                None => self.shared.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
            };
        }
        Ok(start.elapsed().as_secs_f64())
    }

    /// Bytes copied, and the copies' wall seconds (how long one waits for a copy) and CPU
    /// seconds (what a copy takes from the cores), since the last call.
    pub fn take_copied(&self) -> Copied {
        let mut state = self.shared.lock();
        Copied {
            bytes: std::mem::take(&mut state.copied_bytes),
            seconds: std::mem::take(&mut state.copy_seconds),
            cpu_seconds: std::mem::take(&mut state.copy_cpu_seconds),
        }
    }
}

impl Drop for ExpertStager {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Queues `job`: after the urgent jobs if it is urgent, else last. Keeps at most one queued
/// job per slot: a later copy overtaking an older one into the same slot must cancel it, or
/// the older would overwrite it; returns the cancelled job's bytes.
fn enqueue(queue: &mut VecDeque<Job>, job: Job) -> Option<usize> {
    let replaced = queue.iter().position(|j| j.slot == job.slot).and_then(|i| queue.remove(i)).map(|j| j.range.1);
    let at = if job.urgent { queue.iter().position(|j| !j.urgent).unwrap_or(queue.len()) } else { queue.len() };
    queue.insert(at, job);
    replaced
}

/// Makes `slot`'s queued speculative job, if any, urgent: it moves behind the urgent ones.
fn promote(queue: &mut VecDeque<Job>, slot: usize) {
    if let Some(mut job) = queue.iter().position(|j| j.slot == slot && !j.urgent).and_then(|i| queue.remove(i)) {
        job.urgent = true;
        enqueue(queue, job);
    }
}

/// Lowers the calling thread to the idle scheduling class: it then runs only on a core that
/// nothing else wants. Copies ahead of need must not slow the paths computing (on a host
/// whose every core computes experts they did: measured 8-12 ms waits for a 1 ms copy, and
/// slower experts); a copy needed now is made by its waiter (`wait`). A platform without the
/// class keeps the normal one.
fn run_when_idle() {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // SAFETY: sched_param is plain integers, all-zero valid (priority 0, which SCHED_IDLE
        // requires; musl's has more fields than glibc's). The call only reads `param` and
        // changes this thread's class: any thread may move itself to SCHED_IDLE, no privilege
        // needed; on failure it keeps its class, which costs only speed. (The pthread call,
        // not sched_setscheduler: musl's sched_setscheduler is ENOSYS by design.)
        let _ = unsafe {
            let param: libc::sched_param = std::mem::zeroed();
            libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_IDLE, &param)
        };
    }
}

fn copy_forever(shared: &Shared) {
    run_when_idle();
    let mut state = shared.lock();
    loop {
        if state.stop || state.failed.is_some() {
            return;
        }
        state = match Shared::take(&mut state, |_| true) {
            Some(job) => {
                drop(state);
                shared.copy(job)
            }
            None => shared.changed.wait(state).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urgent_jobs_overtake_speculative_ones_and_a_newer_job_replaces_a_queued_one() {
        let job = |slot, len, ticket, urgent| Job { slot, range: (0, len), ticket, urgent };
        let mut q = VecDeque::new();
        assert_eq!(enqueue(&mut q, job(0, 10, 1, false)), None);
        assert_eq!(enqueue(&mut q, job(1, 10, 2, false)), None);
        assert_eq!(enqueue(&mut q, job(2, 10, 3, true)), None);
        assert_eq!(enqueue(&mut q, job(3, 10, 4, true)), None);
        // Into slot 1 again: the queued speculative copy is cancelled.
        assert_eq!(enqueue(&mut q, job(1, 7, 5, true)), Some(10));
        assert_eq!(enqueue(&mut q, job(4, 10, 6, false)), None);
        let order: Vec<u64> = q.iter().map(|j| j.ticket).collect();
        assert_eq!(order, [3, 4, 5, 1, 6]);
        // Hurrying slot 4's prefetch puts it behind the urgent ones, ahead of slot 0's.
        promote(&mut q, 4);
        promote(&mut q, 9);
        let order: Vec<u64> = q.iter().map(|j| j.ticket).collect();
        assert_eq!(order, [3, 4, 5, 6, 1]);
    }

    #[test]
    fn copies_arrive_by_ticket_and_are_counted() {
        let len = 1 << 16;
        let path = std::env::temp_dir().join(format!("llada-stage-test-{}", std::process::id()));
        std::fs::write(&path, (0..3 * len).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let mut bufs = vec![vec![0u8; len]; 2];
        let slots = bufs.iter_mut().map(|b| SlotPtr::new_for_test(b)).collect();
        let mut st = ExpertStager::new(file, "test".into(), slots).unwrap();
        let (a, _) = st.stage(0, (len as u64, len), false);
        let (b, _) = st.stage(1, (2 * len as u64, len), true);
        st.wait(0, a).unwrap();
        st.wait(1, b).unwrap();
        assert!(st.is_done(0, a) && st.is_done(1, b));
        assert_eq!(st.take_copied().bytes, 2 * len as u64);
        drop(st);
        assert_eq!(bufs[0][0], (len % 251) as u8);
        assert_eq!(bufs[1][5], ((2 * len + 5) % 251) as u8);
    }
}
