//! Copying experts into expert slots on a staging thread, in the order they were asked for.
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
use crate::window::SlotPtr;

struct Job {
    slot: usize,
    /// File offset and length of the expert's segment.
    range: (u64, usize),
    ticket: u64,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Per slot: the last finished ticket.
    done: Vec<u64>,
    stop: bool,
    failed: Option<String>,
    /// Bytes copied, wall seconds the copies took and CPU seconds they used, since the last
    /// `take_copied`.
    copied_bytes: u64,
    copy_seconds: f64,
    copy_cpu_seconds: f64,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
    path: String,
    next_ticket: u64,
}

impl ExpertStager {
    /// A staging thread reading `file` (the artifact) into `slots` (pointers into a window
    /// the owner drops after this stager).
    pub fn new(file: File, path: String, slots: Vec<SlotPtr>) -> Result<ExpertStager> {
        let shared = Arc::new(Shared { state: Mutex::new(State { done: vec![0; slots.len()], ..State::default() }), changed: Condvar::new() });
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("llada-expert-staging".into())
                .spawn(move || copy_forever(&file, &slots, &shared))
                .map_err(|e| Error::io("starting the expert staging thread", e))?
        };
        Ok(ExpertStager { shared, thread: Some(thread), path, next_ticket: 1 })
    }

    /// Queues a copy of the segment at `range` into `slot`; returns its ticket.
    pub fn stage(&mut self, slot: usize, range: (u64, usize)) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.shared.lock().queue.push_back(Job { slot, range, ticket });
        self.shared.changed.notify_all();
        ticket
    }

    /// Whether `slot`'s copy `ticket` has finished.
    pub fn is_done(&self, slot: usize, ticket: u64) -> bool {
        self.shared.lock().done[slot] >= ticket
    }

    /// Waits until `slot`'s copy `ticket` has finished; returns the seconds waited.
    pub fn wait(&self, slot: usize, ticket: u64) -> Result<f64> {
        let start = Instant::now();
        let mut state = self.shared.lock();
        while state.done[slot] < ticket {
            if let Some(msg) = &state.failed {
                return Err(Error::io(&self.path, std::io::Error::other(msg.clone())));
            }
            state = self.shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
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

fn copy_forever(file: &File, slots: &[SlotPtr], shared: &Shared) {
    loop {
        let job = {
            let mut state = shared.lock();
            loop {
                if state.stop {
                    return;
                }
                if let Some(job) = state.queue.pop_front() {
                    break job;
                }
                state = shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
            }
        };
        let (start, cpu_start) = (Instant::now(), thread_cpu_seconds());
        // SAFETY: the executor queued this job and reads the slot only after its ticket is
        // marked done below (and queues no copy into a slot it is reading); the window
        // outlives this thread, which the stager joins on drop.
        let dst = unsafe { slots[job.slot].bytes_mut() };
        let result = file.read_exact_at(&mut dst[..job.range.1], job.range.0);
        let mut state = shared.lock();
        match result {
            Ok(()) => {
                state.done[job.slot] = job.ticket;
                state.copied_bytes += job.range.1 as u64;
                state.copy_seconds += start.elapsed().as_secs_f64();
                state.copy_cpu_seconds += thread_cpu_seconds() - cpu_start;
            }
            Err(e) => {
                state.failed = Some(format!("staging an expert failed: {e}"));
                drop(state);
                shared.changed.notify_all();
                return;
            }
        }
        drop(state);
        shared.changed.notify_all();
    }
}
