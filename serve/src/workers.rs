//! The sessions that generate: `--sessions` worker threads, each with its own session on the
//! one mapped model, fed by a bounded queue. A request that finds every session busy and the
//! queue full is refused (429) at once rather than waiting without bound; one that finds a
//! session idle is always taken, whatever the worker is doing between jobs. A job's events go
//! to its connection through a channel of [`EVENTS_BUFFERED`] events: a client that reads
//! slowly makes the worker wait for room (backpressure, so memory stays bounded whatever the
//! client does). A job's client may go away: the job's `cancel` flag, or a closed event
//! channel, stops its generation after the current step (the generator is dropped; the
//! session stays usable for the next job).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use llada_rt::text::Text;
use llada_rt::{Error, Generation, Generator, SamplerParams, Session};

use crate::Server;

/// Events a job's channel holds before its worker waits for the client to read.
pub const EVENTS_BUFFERED: usize = 8;

/// A job's events, as its worker sends them.
pub type Events = tokio::sync::mpsc::Sender<Event>;

/// One generation asked for.
pub struct Job {
    pub prompt: Vec<u32>,
    pub params: SamplerParams,
    /// Send a `Step` per step (a stream); else only `Started` and `Done`.
    pub steps: bool,
    /// With each step, its canvas (the opt-in event stream), not only the settled text.
    pub canvas: bool,
    pub events: Events,
    pub cancel: Arc<AtomicBool>,
}

/// What a job's client hears: `Started` once the request is accepted by the sampler (its
/// settings fit the plan), a `Step` per step, then `Done`; or `Done` alone (the sampler refused
/// it), or `ShuttingDown` (the server stopped before the job's turn).
pub enum Event {
    Started,
    Step(Step),
    Done(Result<Generation, Error>),
    /// The client stopped the generation part-way (a stop sequence appeared in its stream):
    /// what it did until then, its passes counted as a whole answer's are.
    Cut(Generation),
    ShuttingDown,
}

/// One step of a generation, as the client streams it.
pub struct Step {
    pub step: usize,
    pub steps: usize,
    /// The answer as far as it can no longer change.
    pub settled_text: String,
    /// This step's commits and revisions, `[position in generation, token]`.
    pub committed: Vec<[u32; 2]>,
    pub revised: Vec<[u32; 2]>,
    pub settled: usize,
    /// The generated part, each position's text (`None` where still masked), when asked for.
    pub canvas: Option<Vec<Option<String>>>,
}

/// Counts for `/health`.
#[derive(Default)]
pub struct Load {
    pub queued: AtomicUsize,
    pub running: AtomicUsize,
    pub served: AtomicUsize,
    /// Generations stopped part-way (their client went away, or a stop sequence appeared).
    pub cancelled: AtomicUsize,
}

/// The queue's sending side. Admission counts jobs taken and not yet ended (waiting or
/// running) against the sessions plus the waiting places, rather than asking the channel
/// whether a worker happens to be waiting on it right now: with no waiting places, a worker
/// between two waits would refuse a request that an idle session can take.
pub struct Queue {
    jobs: SyncSender<Job>,
    /// Jobs submitted and not yet ended by a worker.
    admitted: AtomicUsize,
    /// Sessions plus waiting places.
    limit: usize,
    pub load: Load,
}

pub enum Refused {
    /// The queue is full.
    Busy,
    /// The workers are gone (shutting down).
    Closed,
}

impl Queue {
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        if self.admitted.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < self.limit).then_some(n + 1)).is_err() {
            return Err(Refused::Busy);
        }
        self.load.queued.fetch_add(1, Ordering::SeqCst);
        // The channel holds `limit` jobs, more than are ever admitted at once: never full.
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.load.queued.fetch_sub(1, Ordering::SeqCst);
                self.end_job();
                Err(match e {
                    TrySendError::Full(_) => Refused::Busy,
                    TrySendError::Disconnected(_) => Refused::Closed,
                })
            }
        }
    }

    /// A job taken by `submit` has ended (run, refused at shutdown, or cancelled before its
    /// turn): its place is free.
    fn end_job(&self) {
        self.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A queue for `sessions` workers with `waiting` places for jobs that wait for one, and its
/// receiving side for the workers.
pub fn queue(sessions: usize, waiting: usize) -> (Queue, Arc<Mutex<Receiver<Job>>>) {
    let limit = sessions + waiting;
    let (tx, rx) = mpsc::sync_channel(limit);
    (Queue { jobs: tx, admitted: AtomicUsize::new(0), limit, load: Load::default() }, Arc::new(Mutex::new(rx)))
}

/// Runs jobs on `session` until the server is stopping and no job is waiting; jobs still
/// queued then are answered with an error instead of run.
pub(crate) fn work(session: &mut Session, server: &Server, jobs: &Mutex<Receiver<Job>>) {
    let (text, queue, stopping) = (&server.text, &server.queue, &server.stopping);
    let load = &queue.load;
    let mask = session.model.header.special.mask;
    loop {
        // The lock is held only while waiting: one idle worker waits, the others queue on it.
        // The wait is short so that a stopping server's idle workers notice and exit.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv_timeout(std::time::Duration::from_millis(50)),
            Err(_) => return,
        };
        let job = match job {
            Ok(job) => job,
            Err(mpsc::RecvTimeoutError::Timeout) if stopping.load(Ordering::SeqCst) => return,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        load.queued.fetch_sub(1, Ordering::SeqCst);
        if stopping.load(Ordering::SeqCst) {
            queue.end_job();
            let _ = job.events.blocking_send(Event::ShuttingDown);
            continue;
        }
        if job.cancel.load(Ordering::SeqCst) {
            queue.end_job();
            continue;
        }
        load.running.fetch_add(1, Ordering::SeqCst);
        // A panic in a pass is the runtime's fault, not the request's: the client hears an
        // error and the worker goes on (the session resets itself after a failed pass).
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(session, text, &job, mask, &server.cancel_all)))
            .unwrap_or_else(|_| Err(Error::Internal("a generation panicked".into())));
        load.running.fetch_sub(1, Ordering::SeqCst);
        load.served.fetch_add(1, Ordering::SeqCst);
        queue.end_job();
        if matches!(result, Ok(Finished::Cut(_)) | Err(Error::Cancelled)) {
            load.cancelled.fetch_add(1, Ordering::SeqCst);
        }
        let event = match result {
            Ok(Finished::Complete(g)) => Event::Done(Ok(g)),
            Ok(Finished::Cut(g)) => Event::Cut(g),
            Err(e) => Event::Done(Err(e)),
        };
        let _ = job.events.blocking_send(event);
    }
}

/// How a generation that ran ended.
enum Finished {
    Complete(Generation),
    /// Its client cancelled it part-way: what it did so far.
    Cut(Generation),
}

/// One job's generation, step by step, each step sent to its client (waiting while its
/// buffer is full); cut short once its cancel flag is set (the client went away, or its stream
/// met a stop sequence), and stopped (as `Error::Cancelled`) once the client's channel is gone
/// or the server's shutdown timeout has passed (`cancel_all`).
fn run(session: &mut Session, text: &Text, job: &Job, mask: u32, cancel_all: &AtomicBool) -> Result<Finished, Error> {
    let mut generator = Generator::start(session, &job.prompt, &job.params)?;
    if job.events.blocking_send(Event::Started).is_err() {
        return Err(Error::Cancelled);
    }
    while let Some(v) = generator.step()? {
        if cancel_all.load(Ordering::SeqCst) {
            return Err(Error::Cancelled);
        }
        if job.cancel.load(Ordering::SeqCst) {
            return Ok(Finished::Cut(generator.finish()));
        }
        if !job.steps {
            continue;
        }
        let generated = v.generated();
        let canvas = job.canvas.then(|| generated.iter().map(|&t| (t != mask).then(|| text.decode(&[t], false))).collect());
        let step = Step {
            step: v.step,
            steps: v.steps,
            settled_text: text.settled_answer(&generated[..v.settled]),
            committed: v.committed.to_vec(),
            revised: v.revised.to_vec(),
            settled: v.settled,
            canvas,
        };
        // A client that has gone (or was cut off for not reading) has dropped its receiver.
        if job.events.blocking_send(Event::Step(step)).is_err() {
            return Err(Error::Cancelled);
        }
    }
    Ok(Finished::Complete(generator.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        let (events, _) = tokio::sync::mpsc::channel(1);
        Job { prompt: vec![1], params: SamplerParams::default(), steps: false, canvas: false, events, cancel: Arc::new(AtomicBool::new(false)) }
    }

    #[test]
    fn admission_counts_sessions_and_waiting_places_not_waiting_workers() {
        // One session, no waiting place, and no worker waiting on the channel at this moment
        // (as between two of its waits): the idle session's job is taken, the next refused.
        let (queue, jobs) = queue(1, 0);
        assert!(queue.submit(job()).is_ok(), "an idle session refused a job");
        assert!(matches!(queue.submit(job()), Err(Refused::Busy)));
        // A worker takes the job: while it runs it holds the session; once it ends, its place
        // is free again.
        let _taken = jobs.lock().unwrap().try_recv().unwrap();
        assert!(matches!(queue.submit(job()), Err(Refused::Busy)), "a running job holds its session");
        queue.end_job();
        assert!(queue.submit(job()).is_ok());
        // Two waiting places behind two sessions: four jobs in, the fifth refused.
        let (queue, _jobs) = self::queue(2, 2);
        for _ in 0..4 {
            assert!(queue.submit(job()).is_ok());
        }
        assert!(matches!(queue.submit(job()), Err(Refused::Busy)));
        assert_eq!(queue.load.queued.load(Ordering::SeqCst), 4);
    }
}
