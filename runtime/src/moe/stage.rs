//! Copying experts into expert slots on a staging thread: urgent copies (an expert the layer
//! running now computes from its slot) before speculative ones (prefetches, refreshes), each
//! kind in the order asked.
//!
//! Only the accelerator path's thread decides what goes where: it requests a copy (slot,
//! expert) and gets a ticket; the slot holds that expert once the slot's finished ticket
//! reaches it. Each slot's writing handle is a lease's value (`lease::Slots`): the thread
//! copying into a slot holds it, so no two copies into one slot can overlap, and the executor
//! reads a slot only when the handle is home with its latest ticket finished (and never
//! requests a copy into a slot it is reading: it requests before or after computing from it,
//! on the same thread).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::lease::{Failure, Lease, Slots};
use crate::window::SlotMem;

/// A slot as the copies see it: its bytes and the last ticket copied into it.
struct ExpertSlot {
    mem: SlotMem,
    done: u64,
}

/// A requested copy.
struct Copy {
    /// File offset and length of the expert's segment.
    range: (u64, usize),
    ticket: u64,
    urgent: bool,
    /// When it was asked for (or made urgent): its place among its kind.
    order: u64,
}

/// The order copies are taken in: urgent ones first, each kind in the order asked.
fn rank(c: &Copy) -> (bool, u64) {
    (!c.urgent, c.order)
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

/// Makes the copy a lease was taken for, by whichever thread took it.
fn copy(file: &File, copied: &Mutex<Copied>, mut lease: Lease<ExpertSlot, Copy>) -> std::io::Result<()> {
    let (slot, job) = lease.parts();
    let (start, cpu_start) = (Instant::now(), thread_cpu_seconds());
    file.read_exact_at(&mut slot.mem.bytes_mut()[..job.range.1], job.range.0)?;
    slot.done = slot.done.max(job.ticket);
    let mut c = copied.lock().unwrap_or_else(|e| e.into_inner());
    c.bytes += job.range.1 as u64;
    c.seconds += start.elapsed().as_secs_f64();
    c.cpu_seconds += thread_cpu_seconds() - cpu_start;
    Ok(())
}

pub struct ExpertStager {
    slots: Slots<ExpertSlot, Copy>,
    file: Arc<File>,
    copied: Arc<Mutex<Copied>>,
    thread: Option<JoinHandle<()>>,
    path: PathBuf,
    next_ticket: u64,
    next_order: u64,
}

impl ExpertStager {
    /// A staging thread reading `file` (the artifact) into the slots `mems` write.
    pub fn new(file: Arc<File>, path: PathBuf, mems: Vec<SlotMem>) -> Result<ExpertStager> {
        let slots = Slots::new(mems.into_iter().map(|mem| ExpertSlot { mem, done: 0 }).collect());
        let copied = Arc::new(Mutex::new(Copied::default()));
        let thread = {
            let (slots, file, copied) = (slots.clone(), file.clone(), copied.clone());
            std::thread::Builder::new()
                .name("llada-expert-staging".into())
                .spawn(move || {
                    run_when_idle();
                    slots.contain_panic(|| {
                        while let Some(lease) = slots.take(|_, c| Some(rank(c))) {
                            if let Err(e) = copy(&file, &copied, lease) {
                                slots.fail(Failure::Read(e));
                                return;
                            }
                        }
                    })
                })
                .map_err(|e| Error::io("starting the expert staging thread", e))?
        };
        Ok(ExpertStager { slots, file, copied, thread: Some(thread), path, next_ticket: 1, next_order: 0 })
    }

    /// Queues a copy of the segment at `range` into `slot`, ahead of every speculative copy
    /// if `urgent`; returns its ticket and the bytes of a queued copy into the same slot that
    /// this one replaces (it had not started, and now never will: the slot's newest ticket
    /// is the one its readers wait for).
    pub fn stage(&mut self, slot: usize, range: (u64, usize), urgent: bool) -> (u64, Option<usize>) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.next_order += 1;
        let replaced = self.slots.request(slot, Copy { range, ticket, urgent, order: self.next_order });
        (ticket, replaced.map(|c| c.range.1))
    }

    /// Makes `slot`'s queued copy, if any, urgent (moving it behind the urgent ones, ahead of
    /// the speculative ones).
    pub fn hurry(&mut self, slot: usize) {
        self.next_order += 1;
        let order = self.next_order;
        self.slots.update_request(slot, |c| hurried(c, order));
    }

    /// Whether `slot`'s copy `ticket` has finished.
    pub fn is_done(&self, slot: usize, ticket: u64) -> bool {
        self.slots.with(slot, |s, _| s.done >= ticket).unwrap_or(false)
    }

    /// Waits until `slot`'s copy `ticket` has finished; returns the seconds waited. A copy
    /// still queued is made by the waiting thread itself: it has nothing else to do, and on
    /// a host whose cores are all computing the staging thread may wait milliseconds for
    /// one (measured: 8-12 ms a copy with both cores on experts, against about 1 ms).
    pub fn wait(&self, slot: usize, ticket: u64) -> Result<f64> {
        let start = Instant::now();
        loop {
            let done = self.slots.wait(slot, |s, requested| s.done >= ticket || requested, |s| s.done >= ticket);
            match done {
                Ok(true) => return Ok(start.elapsed().as_secs_f64()),
                // Home with a copy requested: make it here (unless the thread took it meanwhile).
                Ok(false) => {
                    if let Some(lease) = self.slots.try_take(slot) {
                        copy(&self.file, &self.copied, lease).map_err(|e| crate::model::read_error(&self.path, e))?;
                    }
                }
                Err(_) => return Err(self.slots.failure(|f| f.error(&self.path, "the expert staging thread")).unwrap_or_else(|| Error::Internal("the expert staging thread failed".into()))),
            }
        }
    }

    /// Bytes copied, and the copies' wall seconds (how long one waits for a copy) and CPU
    /// seconds (what a copy takes from the cores), since the last call.
    pub fn take_copied(&self) -> Copied {
        std::mem::take(&mut *self.copied.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for ExpertStager {
    fn drop(&mut self) {
        self.slots.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A speculative copy made urgent at `order`: it goes behind the urgent ones asked so far.
fn hurried(c: &mut Copy, order: u64) {
    if !c.urgent {
        (c.urgent, c.order) = (true, order);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urgent_copies_overtake_speculative_ones_and_a_newer_copy_replaces_a_queued_one() {
        let copy = |len, ticket, urgent| Copy { range: (0, len), ticket, urgent, order: ticket };
        let slots: Slots<(), Copy> = Slots::new(vec![(); 5]);
        assert!(slots.request(0, copy(10, 1, false)).is_none());
        assert!(slots.request(1, copy(10, 2, false)).is_none());
        assert!(slots.request(2, copy(10, 3, true)).is_none());
        assert!(slots.request(3, copy(10, 4, true)).is_none());
        // Into slot 1 again: the queued speculative copy is cancelled.
        assert_eq!(slots.request(1, copy(7, 5, true)).map(|c| c.range.1), Some(10));
        assert!(slots.request(4, copy(10, 6, false)).is_none());
        // Hurrying slot 4's prefetch puts it behind the urgent ones, ahead of slot 0's.
        slots.update_request(4, |c| hurried(c, 7));
        slots.update_request(3, |c| hurried(c, 8));
        // The order the staging thread's `take` ranks them in.
        let order: Vec<u64> = std::iter::from_fn(|| {
            let (_, best) = (0..5).filter_map(|i| slots.with(i, |_, r| r.map(|c| (rank(c), i))).flatten()).min()?;
            Some(slots.try_take(best)?.parts().1.ticket)
        })
        .collect();
        assert_eq!(order, [3, 4, 5, 6, 1], "an urgent copy keeps its place when hurried");
    }

    #[test]
    fn copies_arrive_by_ticket_and_are_counted() {
        let len = 1 << 16;
        let path = std::env::temp_dir().join(format!("llada-stage-test-{}", std::process::id()));
        std::fs::write(&path, (0..3 * len).map(|i| (i % 251) as u8).collect::<Vec<_>>()).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        let mut bufs = vec![vec![0u8; len]; 2];
        // SAFETY: one handle per buffer; the buffers are read only after the stager is dropped.
        let slots = bufs.iter_mut().map(|b| unsafe { SlotMem::new(crate::window::SlotPtr::new_for_test(b)) }).collect();
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
