//! The CPU path's threads: a pool of its own, one of whose threads, from when the experts
//! are set up until they are dropped, serves the accelerator path's thread: it runs one job
//! at a time, lent to it through a one-slot [`Slots`] (see `lease`) and waited for. A job's
//! parallel loops so start on a thread of the pool: no job is sent into the pool from outside
//! (the accelerator's thread entering the pool, by `install` or a scope, would cost rayon a
//! queue allocation every 63 layers, and a scope's spawn a boxed job each), and a layer's
//! hand-off allocates nothing. While it waits for a job the serving thread sleeps in
//! `Slots::take`; the pool's other threads take work from it when a job's loops split.
//!
//! A job borrows the accelerator thread's data (the layer's inputs, routing, outputs):
//! [`CpuPath::run_beside`] does not return or unwind before the job has finished
//! (`Slots::run_beside`), as `std::thread::scope` does not.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::error::{Error, Result};
use crate::lease::{Borrowed, Slots};
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

/// The serving thread's working memory and the last job's outcome: the lent value.
struct Memory {
    /// 64 bytes of slack each, for `aligned`.
    floats: Vec<f32>,
    operand: Vec<u8>,
    /// The last job's seconds, and whether it panicked.
    seconds: f64,
    panicked: bool,
    /// (rows, seconds) of each expert of the last job.
    timings: Vec<(usize, f64)>,
}

/// The CPU path as the accelerator path's thread sees it.
pub struct CpuPath {
    jobs: Slots<Memory, Borrowed<Memory>>,
    /// Dropped after the serving thread has been told to stop (`Drop`), which joins the
    /// pool's threads.
    pool: Option<Pool>,
    /// (rows, seconds) of each expert of the last job (swapped with the memory's: both sized
    /// for a layer's experts).
    timings: Vec<(usize, f64)>,
}

impl CpuPath {
    /// The CPU path's `threads` threads (named `llada-cpu-path-N`), with `floats` floats and
    /// `operand` bytes of working memory, computing up to `experts` experts a job; set up
    /// (threads started and serving) before this returns.
    pub fn new(threads: usize, floats: usize, operand: usize, experts: usize) -> Result<CpuPath> {
        let pool = Pool::new(threads, "llada-cpu-path").map_err(|e| Error::Internal(format!("starting the CPU path's threads: {e}")))?;
        let memory = Memory { floats: vec![0.0; floats + 16], operand: vec![0; operand + 64], seconds: 0.0, panicked: false, timings: Vec::with_capacity(experts) };
        let jobs = Slots::new(vec![memory]);
        let serving = jobs.clone();
        // Sent into the pool from outside once, here: then the serving thread is the pool's.
        pool.spawn(move || {
            serving.contain_panic(|| {
                while let Some(mut lease) = serving.take(|_, _| Some(())) {
                    // The job records its own panic (`run_beside`).
                    lease.run();
                }
            })
        });
        let mut path = CpuPath { jobs, pool: Some(pool), timings: Vec::with_capacity(experts) };
        // The first job waits until the thread serves.
        path.run_beside(&|_: &mut CpuWork| (), || ()).1?;
        Ok(path)
    }

    /// Runs `job` on the CPU path's threads while this thread runs `here`; once both are
    /// done, returns what `here` returned and the job's seconds (an error if it panicked).
    /// The job's expert timings are then [`timings`](Self::timings).
    pub fn run_beside<R>(&mut self, job: &Job<'_>, here: impl FnOnce() -> R) -> (R, Result<f64>) {
        let pool: &rayon::ThreadPool = self.pool.as_ref().expect("the pool lives until dropped");
        let lent = |m: &mut Memory| {
            let start = Instant::now();
            m.timings.clear();
            // This thread is one of `pool`'s: the job's loops split inside the pool.
            let mut work = CpuWork { pool, floats: aligned(&mut m.floats), operand: aligned(&mut m.operand), timings: &mut m.timings };
            m.panicked = catch_unwind(AssertUnwindSafe(|| job(&mut work))).is_err();
            m.seconds = start.elapsed().as_secs_f64();
        };
        let (r, back) = self.jobs.run_beside(0, &lent, here);
        let timings = &mut self.timings;
        let outcome = match back {
            Err(_) => Err(Error::Internal("the CPU path's thread failed".into())),
            Ok(()) => self
                .jobs
                .with(0, |m, _| {
                    std::mem::swap(timings, &mut m.timings);
                    if m.panicked { Err(Error::Internal("the CPU path's job panicked".into())) } else { Ok(m.seconds) }
                })
                .unwrap_or_else(|| Err(Error::Internal("the CPU path's memory is still lent".into()))),
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
        self.jobs.close();
        // The serving thread returns to its pool, which then exits and joins its threads.
        drop(self.pool.take());
    }
}

/// The part of `buf` from its first 64-byte-aligned element on (its last 64 bytes are slack
/// for this).
pub fn aligned<T>(buf: &mut [T]) -> &mut [T] {
    let skip = buf.as_ptr().align_offset(64).min(buf.len());
    &mut buf[skip..]
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
