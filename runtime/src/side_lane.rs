//! The CPU side lane: a persistent worker thread with its own host executor and window, whose
//! cache mirrors the accelerator's, running the revision checks of `mbsd --revision
//! dual-path` beside the dense passes. The session creates it from the model and keeps it
//! across generations, and serves a policy's asks one job at a time ([`SideLane::launch`],
//! then [`SideLane::merge`] at the next merge point): the positions to check, and what a
//! check row's logits predict. What the checks mean (stable,
//! revised) is the policy's (`sampler/revision.rs`).
//!
//! A job checks `n` tokens in one pass of `2n` rows on LLaDA (refresh rows storing the tokens,
//! then check rows of masks at the same positions, reading); on Dream, whose prediction for
//! `q` is the row at `q - 1`'s, two passes: masks stored at the checked positions with the
//! rows at `q - 1` reading, then the tokens stored (the refresh).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::executor::{value_range, HostExecutor, RunInputs};
use crate::kernels::cpu::Features;
use crate::lease::Slots;
use crate::model::Model;
use crate::moe::MoeStep;
use crate::params::SamplerParams;
use crate::pool::Pool;
use crate::sampler::{Predict, SideChecks, SideJob};
use crate::trace::{Trace, Track};
use crate::window::Window;


/// The lane as the dense path's thread sees it: the worker thread and the one job slot it
/// serves.
pub struct SideLane {
    jobs: Slots<Job, ()>,
    thread: Option<JoinHandle<()>>,
    /// A job was launched and not merged yet.
    running: bool,
    /// Tokens checked per job.
    per_job: usize,
    /// The last merged job's outcome, copied out of the job (which goes back to the thread).
    home: Home,
}

/// A merged job's outcome (see [`SideChecks`]), in buffers sized once.
struct Home {
    checked: Vec<u32>,
    predictions: Vec<(u32, f32)>,
    fresh: Vec<u32>,
    waited_seconds: f64,
    side_seconds: f64,
}

/// The one job between the dense path and the side path's thread, in buffers sized once: a
/// lease's value (see `lease`), so while the thread runs it the dense path cannot touch it,
/// and its merge waits for it to come home.
pub(crate) struct Job {
    /// The side path's window: its cache mirrors the accelerator's.
    pub(crate) window: Window,
    /// The checked positions and their committed tokens, in a `seq_len` sequence.
    pub(crate) checked: Vec<u32>,
    pub(crate) tokens: Vec<u32>,
    /// Dream: the tokens at the positions before the checked ones (the check rows' inputs).
    pub(crate) before: Vec<u32>,
    pub(crate) seq_len: usize,
    pub(crate) params: SamplerParams,
    pub(crate) step: usize,
    /// What a check row's logits predict (the policy's rule: LLaDA's or Dream's).
    pub(crate) predict: Predict,
    /// Where the side pass is recorded, if the session traces.
    pub(crate) trace: Option<Arc<Trace>>,
    /// Outcome: each checked position's prediction and confidence, the pass's time on the
    /// side thread, and whether it failed.
    pub(crate) predictions: Vec<(u32, f32)>,
    pub(crate) seconds: f64,
    pub(crate) error: Option<Error>,
}

/// The worker thread's own state: its handle on the artifact, its executor and scratch.
struct Worker {
    model: Model,
    executor: HostExecutor,
    /// Every expert of an MoE layer on this thread (no expert runtime).
    moe: MoeStep,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    logit_rows: Vec<u32>,
    logits: Vec<f32>,
}

impl Worker {
    /// The side passes over the job's checked tokens.
    fn check(&mut self, job: &mut Job) -> Result<()> {
        let (mask, n) = (self.model.header.special.mask, job.checked.len());
        let dream = self.model.is_dream();
        // LLaDA: refresh rows (stored), then check rows at the same positions (masks, read
        // only). Dream: masks stored at the checked positions, then the rows before them.
        self.tokens.clear();
        self.positions.clear();
        if dream {
            self.tokens.extend(std::iter::repeat_n(mask, n));
            self.tokens.extend_from_slice(&job.before);
            self.positions.extend_from_slice(&job.checked);
            self.positions.extend(job.checked.iter().map(|&q| q - 1));
        } else {
            self.tokens.extend_from_slice(&job.tokens);
            self.tokens.extend(std::iter::repeat_n(mask, n));
            self.positions.extend_from_slice(&job.checked);
            self.positions.extend_from_slice(&job.checked);
        }
        self.logit_rows.clear();
        self.logit_rows.extend(n as u32..2 * n as u32);
        self.run(2 * n, n, job)?;
        let h = &self.model.header;
        let g = self.model.graph(self.model.graph_for_rows(2 * n)?);
        let range = value_range(g, &g.values[g.logits as usize], n, h.plan.window.activations.offset);
        self.logits.clear();
        self.logits.extend_from_slice(&job.window.parts().activations[range]);
        let vocab = h.model.embedding_size as usize;
        job.predictions.clear();
        let (p, step, special) = (&job.params, job.step, &self.model.header.special);
        if dream {
            job.predictions.extend(self.logits.chunks_exact_mut(vocab).zip(&job.checked).map(|(row, &pos)| (job.predict)(row, p, special, step, pos as usize)));
            // The refresh: the tokens' keys and values where the checks stored masks.
            self.tokens.clear();
            self.tokens.extend_from_slice(&job.tokens);
            self.positions.clear();
            self.positions.extend_from_slice(&job.checked);
            self.logit_rows.clear();
            self.run(n, n, job)?;
        } else {
            job.predictions.extend(self.logits.chunks_exact_mut(vocab).zip(&job.checked).map(|(row, &pos)| (job.predict)(row, p, special, step, pos as usize)));
        }
        Ok(())
    }

    /// Runs the graph for `rows` of the prepared rows (padded here), the first `stored`
    /// storing their keys and values, logits at `self.head`.
    fn run(&mut self, rows: usize, stored: usize, job: &mut Job) -> Result<()> {
        let graph = self.model.graph_for_rows(rows)?;
        let graph_rows = self.model.graph(graph).rows as usize;
        self.tokens.resize(graph_rows, self.model.header.special.mask);
        self.positions.resize(graph_rows, 0);
        let inputs = RunInputs { tokens: &self.tokens, positions: &self.positions, stored_rows: stored, context: job.seq_len, logit_rows: &self.logit_rows, rows, block_causal: None, soft: None };
        self.executor.run_unstaged(&self.model, graph, inputs, &mut job.window, &mut self.moe)
    }

    /// The thread's loop: runs each job lent to it until the side path closes its slot. The
    /// jobs run on the executor's own one-thread pool, entered once here, so their parallel
    /// loops start inside it and queue nothing. A job's failure or panic is its outcome.
    fn serve(mut self, pool: &Pool, jobs: &Slots<Job, ()>) {
        pool.install(|| {
            while let Some(mut lease) = jobs.take(|_, _| Some(())) {
                let (job, ()) = lease.parts();
                let start = Instant::now();
                let outcome = catch_unwind(AssertUnwindSafe(|| self.check(job))).unwrap_or_else(|_| Err(Error::Internal("the CPU side path's pass panicked".to_string())));
                let end = Instant::now();
                if let Some(t) = &job.trace {
                    t.span(Track::SidePath, format!("check {} tokens", job.checked.len()), start, end);
                }
                job.error = outcome.err();
                job.seconds = (end - start).as_secs_f64();
            }
        });
    }
}

impl SideLane {
    /// A side path with one CPU thread and its own window, checking `per_job` tokens a pass,
    /// set up (thread started, window allocated) before this returns.
    pub(crate) fn new(model: &Model, features: Features, per_job: usize) -> Result<SideLane> {
        let window = Window::cpu_side(&model.header).map_err(|e| Error::io("allocating the CPU side path's window", e))?;
        let pool = Pool::new(1, "llada-side-pool").map_err(|e| Error::Internal(format!("starting the CPU side path's thread pool: {e}")))?;
        let vocab = model.header.model.embedding_size as usize;
        // A pass's rows are padded to its graph's.
        let rows = model.graph_for_rows(2 * per_job).map_or(2 * per_job, |g| model.graph(g).rows as usize);
        let worker = Worker {
            executor: HostExecutor::cpu_side_path(model, pool.clone(), features),
            moe: MoeStep::new(model, None, pool.clone(), features),
            tokens: Vec::with_capacity(rows),
            positions: Vec::with_capacity(rows),
            logit_rows: Vec::with_capacity(per_job),
            logits: Vec::with_capacity(per_job * vocab),
            model: model.share(),
        };
        let job = Job {
            window,
            checked: Vec::with_capacity(per_job),
            tokens: Vec::with_capacity(per_job),
            before: Vec::with_capacity(per_job),
            seq_len: 0,
            params: SamplerParams::default(),
            step: 0,
            predict: |_, _, _, _, _| (0, 0.0),
            trace: None,
            predictions: Vec::with_capacity(per_job),
            seconds: 0.0,
            error: None,
        };
        let jobs = Slots::new(vec![job]);
        let helper = jobs.clone();
        let thread = std::thread::Builder::new()
            .name("llada-side".into())
            // The pool is dropped (joined) here, never from its own threads.
            .spawn(move || helper.contain_panic(|| worker.serve(&pool, &helper)))
            .map_err(|e| Error::io("starting the CPU side path's thread", e))?;
        let home = Home { checked: Vec::with_capacity(per_job), predictions: Vec::with_capacity(per_job), fresh: Vec::with_capacity(per_job), waited_seconds: 0.0, side_seconds: 0.0 };
        Ok(SideLane { jobs, thread: Some(thread), running: false, per_job, home })
    }

    /// Tokens one side pass checks.
    pub(crate) fn per_job(&self) -> usize {
        self.per_job
    }

    /// Readies the lane for a new generation whose checks predict with `predict`: a job left
    /// running by a generation that stopped early is waited for and dropped.
    pub(crate) fn begin(&mut self, predict: Predict) -> Result<()> {
        self.running = false;
        self.jobs.wait(0, |_, requested| !requested, |job| job.predict = predict).map_err(|_| failed())
    }

    /// The merge point after a dense pass that stored keys and values at `dense_stored`
    /// positions of `dense`: waits for the running job if it is late, copies its refreshed keys
    /// and values into `dense` where the dense pass did not store them, and brings the side
    /// cache level with the dense one. Returns what the job checked (`None` if none was
    /// running), in the lane's buffers.
    pub(crate) fn merge(&mut self, dense: &mut Window, model: &Model, dense_stored: &[u32]) -> Result<Option<SideChecks<'_>>> {
        let wait = Instant::now();
        let running = std::mem::take(&mut self.running);
        let home = &mut self.home;
        self.jobs
            .wait(
                0,
                |_, requested| !requested,
                |job| -> Result<()> {
                    if running {
                        home.waited_seconds = wait.elapsed().as_secs_f64();
                        if let Some(e) = job.error.take() {
                            return Err(e);
                        }
                        // Its reads of the artifact may have seen zeros if the file was truncated meanwhile.
                        model.check_intact()?;
                        home.side_seconds = job.seconds;
                        home.checked.clear();
                        home.checked.extend_from_slice(&job.checked);
                        home.predictions.clear();
                        home.predictions.extend_from_slice(&job.predictions);
                        home.fresh.clear();
                        home.fresh.extend(job.checked.iter().copied().filter(|p| !dense_stored.contains(p)));
                        dense.copy_kv_from(&job.window, &home.fresh, &model.header);
                    }
                    job.window.copy_kv_from(dense, dense_stored, &model.header);
                    Ok(())
                },
            )
            .map_err(|_| failed())??;
        let home = &self.home;
        Ok(running.then(|| SideChecks { checked: &home.checked, predictions: &home.predictions, fresh: &home.fresh, waited_seconds: home.waited_seconds, side_seconds: home.side_seconds }))
    }

    /// Starts `job` on the lane's thread, where it runs beside the next dense pass (recorded
    /// in `trace`, if any); the next [`merge`](Self::merge) brings it home.
    pub(crate) fn launch(&mut self, job: &SideJob, trace: Option<Arc<Trace>>) -> Result<()> {
        self.jobs
            .wait(
                0,
                |_, requested| !requested,
                |j| {
                    for (to, from) in [(&mut j.checked, job.checked), (&mut j.tokens, job.tokens), (&mut j.before, job.before)] {
                        to.clear();
                        to.extend_from_slice(from);
                    }
                    (j.seq_len, j.params, j.step, j.trace) = (job.seq_len, job.params, job.step, trace);
                },
            )
            .map_err(|_| failed())?;
        self.jobs.request(0, ());
        self.running = true;
        Ok(())
    }
}

/// The error of a side path whose thread failed outside a job.
fn failed() -> Error {
    Error::Internal("the CPU side path's thread failed".to_string())
}

impl Drop for SideLane {
    /// Tells the worker to exit once its job (if any) is done, and joins it.
    fn drop(&mut self) {
        self.jobs.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

