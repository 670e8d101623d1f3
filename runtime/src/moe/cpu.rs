//! The CPU path's threads: a pool of its own, one of whose threads, from when the experts
//! are set up until they are dropped, serves the accelerator path's thread: it runs one job
//! at a time, which that thread hands it (under a mutex) and waits for. A job's parallel
//! loops so start on a thread of the pool: no job is sent into the pool from outside (the
//! accelerator's thread entering the pool, by `install` or a scope, would cost rayon a
//! queue allocation every 63 layers, and a scope's spawn a boxed job each), and a layer's
//! hand-off allocates nothing. While it waits for a job the serving thread is parked on a
//! condition variable; the pool's other threads take work from it when a job's loops split.
//!
//! A job borrows the accelerator thread's data (the layer's inputs, routing, outputs):
//! [`CpuPath::run_beside`] does not return or unwind before the job has finished, as
//! `std::thread::scope` does not.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::pool::Pool;

/// What a job computes with: the CPU path's threads and working memory (its own, outside the
/// window: a phone's CPU reads the artifact and its own memory), and where it records the
/// (rows, seconds) of each expert it computes.
pub struct CpuWork<'a> {
    pub pool: &'a rayon::ThreadPool,
    /// Both 64-byte aligned, as the window's scratch is.
    pub floats: &'a mut [f32],
    pub operand: &'a mut [u8],
    pub timings: &'a mut Vec<(usize, f64)>,
}

/// A job of the CPU path.
pub type Job<'a> = dyn Fn(&mut CpuWork) + Sync + 'a;

/// A requested job and the pool it runs on, borrows whose lifetimes
/// [`CpuPath::run_beside`] erased: it keeps both alive until the serving thread is done.
struct JobPtr {
    job: *const Job<'static>,
    pool: *const rayon::ThreadPool,
}

// SAFETY: the job is `Sync`, and so is the pool, so using them through shared pointers from
// another thread is sound; the pointers are valid while they are sent (see `run_beside`).
unsafe impl Send for JobPtr {}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// The serving thread has not started yet.
    Starting,
    /// The serving thread panicked outside a job (not expected) and stopped: every later
    /// job fails.
    Failed,
    Idle,
    /// Set by the accelerator's thread: the serving thread runs `job`.
    Requested,
    /// Set by the serving thread: the job has finished.
    Done,
    /// The path is being dropped: the serving thread returns to its pool.
    Quit,
}

/// The one job between the two threads. The serving thread holds the lock while it runs the
/// job.
struct Slot {
    state: State,
    job: Option<JobPtr>,
    /// The path's working memory (64 bytes of slack each, for `aligned`).
    floats: Vec<f32>,
    operand: Vec<u8>,
    /// The last job's seconds, and whether it panicked.
    seconds: f64,
    panicked: bool,
    /// (rows, seconds) of each expert of the last job.
    timings: Vec<(usize, f64)>,
}

struct Shared {
    slot: Mutex<Slot>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, slot: MutexGuard<'a, Slot>) -> MutexGuard<'a, Slot> {
        self.changed.wait(slot).unwrap_or_else(|e| e.into_inner())
    }
}

/// The CPU path as the accelerator path's thread sees it.
pub struct CpuPath {
    shared: Arc<Shared>,
    /// Dropped after the serving thread has been told to quit (`Drop`), which joins the
    /// pool's threads.
    pool: Option<Pool>,
    /// (rows, seconds) of each expert of the last job (swapped with the slot's: both sized
    /// for a layer's experts).
    timings: Vec<(usize, f64)>,
}

impl CpuPath {
    /// The CPU path's `threads` threads (named `llada-cpu-path-N`), with `floats` floats and
    /// `operand` bytes of working memory, computing up to `experts` experts a job; set up
    /// (threads started and serving) before this returns.
    pub fn new(threads: usize, floats: usize, operand: usize, experts: usize) -> Result<CpuPath> {
        let pool = Pool::new(threads, "llada-cpu-path").map_err(|e| Error::Internal(format!("starting the CPU path's threads: {e}")))?;
        let slot = Slot {
            state: State::Starting,
            job: None,
            floats: vec![0.0; floats + 16],
            operand: vec![0; operand + 64],
            seconds: 0.0,
            panicked: false,
            timings: Vec::with_capacity(experts),
        };
        let shared = Arc::new(Shared { slot: Mutex::new(slot), changed: Condvar::new() });
        let serving = shared.clone();
        // Sent into the pool from outside once, here: then the serving thread is the pool's.
        pool.spawn(move || serve(&serving));
        let mut slot = shared.lock();
        while slot.state == State::Starting {
            slot = shared.wait(slot);
        }
        drop(slot);
        Ok(CpuPath { shared, pool: Some(pool), timings: Vec::with_capacity(experts) })
    }

    /// Runs `job` on the CPU path's threads while this thread runs `here`; once both are
    /// done, returns what `here` returned and the job's seconds (an error if it panicked).
    /// The job's expert timings are then [`timings`](Self::timings).
    pub fn run_beside<R>(&mut self, job: &Job<'_>, here: impl FnOnce() -> R) -> (R, Result<f64>) {
        let pool: &rayon::ThreadPool = self.pool.as_ref().expect("the pool lives until dropped");
        let mut slot = self.shared.lock();
        if slot.state == State::Failed {
            drop(slot);
            return (here(), Err(Error::Internal("the CPU path's thread failed".into())));
        }
        // SAFETY (of erasing the job's lifetime): the serving thread uses the job and the pool
        // only while the state is `Requested`, and `Finish` waits for it to leave that state
        // before this function returns or unwinds, so both outlive every use (the pool is
        // `self`'s, borrowed meanwhile).
        let job = unsafe { std::mem::transmute::<*const Job<'_>, *const Job<'static>>(job) };
        slot.job = Some(JobPtr { job, pool });
        slot.state = State::Requested;
        drop(slot);
        self.shared.changed.notify_all();
        let mut finish = Finish { shared: &self.shared, waited: false };
        let r = here();
        let mut slot = finish.wait();
        std::mem::swap(&mut self.timings, &mut slot.timings);
        let outcome = match slot.state {
            State::Failed => Err(Error::Internal("the CPU path's thread failed".into())),
            _ if slot.panicked => Err(Error::Internal("the CPU path's job panicked".into())),
            _ => Ok(slot.seconds),
        };
        (r, outcome)
    }

    /// (rows, seconds) of each expert of the last job.
    pub fn timings(&self) -> &[(usize, f64)] {
        &self.timings
    }
}

impl Drop for CpuPath {
    fn drop(&mut self) {
        self.shared.lock().state = State::Quit;
        self.shared.changed.notify_all();
        // The serving thread returns to its pool, which then exits and joins its threads.
        drop(self.pool.take());
    }
}

/// Waits for the requested job to finish: when asked, or when dropped (unwinding from the
/// accelerator's part must not free what the job reads while it runs).
struct Finish<'a> {
    shared: &'a Shared,
    waited: bool,
}

impl<'a> Finish<'a> {
    fn wait(&mut self) -> MutexGuard<'a, Slot> {
        let mut slot = self.shared.lock();
        while slot.state == State::Requested {
            slot = self.shared.wait(slot);
        }
        if slot.state == State::Done {
            slot.state = State::Idle;
        }
        self.waited = true;
        slot
    }
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        if !self.waited {
            drop(self.wait());
        }
    }
}

/// The part of `buf` from its first 64-byte-aligned element on (its last 64 bytes are slack
/// for this).
pub fn aligned<T>(buf: &mut [T]) -> &mut [T] {
    let skip = buf.as_ptr().align_offset(64).min(buf.len());
    &mut buf[skip..]
}

/// The serving thread's loop: runs each requested job, until told to quit. A panic outside
/// a job (none is expected) fails the path rather than leaving its caller waiting.
fn serve(shared: &Shared) {
    let served = catch_unwind(AssertUnwindSafe(|| serve_jobs(shared)));
    if served.is_err() {
        shared.lock().state = State::Failed;
        shared.changed.notify_all();
    }
}

fn serve_jobs(shared: &Shared) {
    let mut slot = shared.lock();
    slot.state = State::Idle;
    shared.changed.notify_all();
    loop {
        match slot.state {
            State::Quit | State::Failed => return,
            State::Requested => {}
            State::Starting | State::Idle | State::Done => {
                slot = shared.wait(slot);
                continue;
            }
        }
        let start = Instant::now();
        let Slot { job, floats, operand, timings, .. } = &mut *slot;
        let job = job.take().expect("a requested job is set");
        timings.clear();
        // SAFETY: `run_beside` keeps the job and the pool alive until the state leaves
        // `Requested`, which only this thread changes, below.
        let (run, pool) = unsafe { (&*job.job, &*job.pool) };
        // This thread is one of `pool`'s: the job's loops split inside the pool.
        let mut work = CpuWork { pool, floats: aligned(floats), operand: aligned(operand), timings };
        let ran = catch_unwind(AssertUnwindSafe(|| run(&mut work)));
        slot.seconds = start.elapsed().as_secs_f64();
        slot.panicked = ran.is_err();
        slot.state = State::Done;
        shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_runs_beside_this_thread_on_borrowed_data_and_a_panic_is_reported() {
        let mut path = CpuPath::new(2, 64, 64, 4).unwrap();
        let input: Vec<u32> = (0..1000).collect();
        let sum = std::sync::atomic::AtomicU64::new(0);
        let job = |w: &mut CpuWork| {
            use rayon::prelude::*;
            // The job's loops split on the path's pool, from one of its threads.
            assert!(w.pool.current_thread_index().is_some());
            let s: u64 = w.pool.install(|| input.par_iter().map(|&v| v as u64).sum());
            sum.store(s, std::sync::atomic::Ordering::Relaxed);
            w.timings.push((3, 0.5));
            assert!(w.floats.len() >= 64 && w.operand.len() >= 64 && w.floats.as_ptr().align_offset(64) == 0);
        };
        let (here, seconds) = path.run_beside(&job, || 7);
        assert_eq!((here, sum.load(std::sync::atomic::Ordering::Relaxed)), (7, 499_500));
        assert!(seconds.unwrap() >= 0.0);
        assert_eq!(path.timings(), [(3, 0.5)]);
        let (_, failed) = path.run_beside(&|_: &mut CpuWork| panic!("a job's panic"), || ());
        assert!(failed.is_err());
        // The path still serves.
        let (_, again) = path.run_beside(&job, || ());
        assert!(again.is_ok());
    }
}
