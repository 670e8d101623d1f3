//! Dual-path progressive revision: the CPU side path of `mbsd`.
//!
//! A committed token is *visible*: later passes read it, but its keys and values in the cache
//! were computed while it was still masked (the dense path does not recompute committed
//! rows unless a bucket has idle rows). After every dense pass the side path takes up to
//! `side_rows / 2` visible tokens (lowest position first) and, on its own thread with its own
//! executor and window, runs one pass of two rows per token:
//! - a *refresh* row (the token as input, stored): its keys and values, merged into the
//!   accelerator's cache one dense pass later;
//! - a *check* row (the mask as input, not stored, so it sees its own position masked and
//!   every other visible token refreshed): the token predicted again under the newer context.
//!
//! On Dream, whose prediction for `q` is the output of the row at `q - 1`, a check row at
//! `q - 1` must see `q` masked, which only the cache can show it: the job runs two passes,
//! one storing the mask at each checked `q` with the rows at `q - 1` reading (the checks;
//! no two checked tokens adjacent, so each check row's own input is its token), then one
//! storing the tokens at the checked positions (the refresh).
//!
//! The merge point is fixed: after the dense pass that ran while the job ran, never when the
//! thread happens to finish; the dense path waits there if the job is late (counted as
//! stall). Then a check that agrees with at least `stable_confidence`, or the
//! `stable_checks`-th agreeing check, makes the token *stable* (never checked again); one that
//! disagrees with at least `revise_confidence` replaces the token (still visible, checked
//! again with fresh keys and values). The side window's cache mirrors the accelerator's: both
//! are brought level at every merge point (the side path's refreshed positions one way, the
//! positions the dense pass stored the other way; where both wrote, the dense pass, computed
//! with the newer canvas, wins).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::dream::{self, DREAM_REVISE};
use super::{predict_with, SamplerParams, REVISE};
use crate::error::{Error, Result};
use crate::lease::Slots;
use crate::executor::{value_range, HostExecutor, RunInputs};
use crate::kernels::cpu::Features;
use crate::model::Model;
use crate::pool::Pool;
use crate::session::Session;
use crate::trace::{Trace, Track};
use crate::moe::MoeStep;
use crate::window::Window;

/// Where a generated position is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenState {
    Masked,
    /// Committed, still revisable; `agreed` checks have confirmed it so far.
    Visible { agreed: u32 },
    /// Frozen.
    Stable,
}

/// What the side path did over a generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SideReport {
    pub side_passes: u64,
    /// Rows of the side passes (refresh and check rows; padding excluded).
    pub side_rows: u64,
    pub checks: u64,
    pub revisions: u64,
    pub stabilised: u64,
    /// Time the dense path waited for a late side pass.
    pub stall_seconds: f64,
    /// Time the side passes took on their thread.
    pub side_seconds: f64,
}

/// The one job between the dense path and the side path's thread, in buffers sized once: a
/// lease's value (see `lease`), so while the thread runs it the dense path cannot touch it,
/// and its merge waits for it to come home.
struct Job {
    /// The side path's window: its cache mirrors the accelerator's.
    window: Window,
    /// The checked positions and their committed tokens, in a `seq_len` sequence.
    checked: Vec<u32>,
    tokens: Vec<u32>,
    /// Dream: the tokens at the positions before the checked ones (the check rows' inputs).
    before: Vec<u32>,
    seq_len: usize,
    params: SamplerParams,
    step: usize,
    /// Where the side pass is recorded, if the session traces.
    trace: Option<Arc<Trace>>,
    /// Outcome: each checked position's prediction and confidence, the pass's time on the
    /// side thread, and whether it failed.
    predictions: Vec<(u32, f32)>,
    seconds: f64,
    error: Option<Error>,
}

/// The worker thread's own state: its handle on the artifact, its executor and scratch.
struct Worker {
    model: Model,
    executor: HostExecutor,
    /// Every expert of an MoE layer on this thread (no expert runtime).
    moe: MoeStep<'static>,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    head: Vec<u32>,
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
        self.head.clear();
        self.head.extend(n as u32..2 * n as u32);
        self.run(2 * n, n, job)?;
        let h = &self.model.header;
        let g = self.model.graph(self.model.graph_for_rows(2 * n)?);
        let range = value_range(g, &g.values[g.logits as usize], n, h.plan.window.activations.offset);
        self.logits.clear();
        self.logits.extend_from_slice(&job.window.parts().activations[range]);
        let vocab = h.model.embedding_size as usize;
        job.predictions.clear();
        let (p, step) = (&job.params, job.step);
        if dream {
            job.predictions.extend(self.logits.chunks_exact_mut(vocab).zip(&job.checked).map(|(row, &pos)| dream::predict(row, p, DREAM_REVISE, step, pos as usize)));
            // The refresh: the tokens' keys and values where the checks stored masks.
            self.tokens.clear();
            self.tokens.extend_from_slice(&job.tokens);
            self.positions.clear();
            self.positions.extend_from_slice(&job.checked);
            self.head.clear();
            self.run(n, n, job)?;
        } else {
            let special = &self.model.header.special;
            job.predictions.extend(self.logits.chunks_exact_mut(vocab).zip(&job.checked).map(|(row, &pos)| predict_with(row, p, special, REVISE, step, pos as usize)));
        }
        Ok(())
    }

    /// Runs the graph for `rows` of the prepared rows (padded here), the first `stored`
    /// storing their keys and values, logits at `self.head`.
    fn run(&mut self, rows: usize, stored: usize, job: &mut Job) -> Result<()> {
        let g = self.model.graph(self.model.graph_for_rows(rows)?);
        self.tokens.resize(g.rows as usize, self.model.header.special.mask);
        self.positions.resize(g.rows as usize, 0);
        let inputs = RunInputs { tokens: &self.tokens, positions: &self.positions, stored_rows: stored, context: job.seq_len, head_rows: &self.head, rows, block_causal: None };
        self.executor.run_unstaged(&self.model, g, &inputs, &mut job.window, &mut self.moe)
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

/// The side path as the dense path's thread sees it: a persistent worker thread and the one
/// job slot it serves. A session keeps it across generations (its thread and window are set
/// up once); [`begin`](Self::begin) readies it for a generation.
pub struct SidePath {
    jobs: Slots<Job, ()>,
    thread: Option<JoinHandle<()>>,
    /// A job was launched and not merged yet.
    running: bool,
    /// Tokens checked per job.
    per_job: usize,
    /// The merged job's positions the dense pass did not store (scratch).
    fresh: Vec<u32>,
    pub(crate) report: SideReport,
}

impl SidePath {
    /// A side path with one CPU thread and its own window, checking `per_job` tokens a pass,
    /// set up (thread started, window allocated) before this returns.
    pub(crate) fn new(model: &Model, features: Features, per_job: usize) -> Result<SidePath> {
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
            head: Vec::with_capacity(per_job),
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
        Ok(SidePath { jobs, thread: Some(thread), running: false, per_job, fresh: Vec::with_capacity(per_job), report: SideReport::default() })
    }

    /// Tokens one side pass checks.
    pub(crate) fn per_job(&self) -> usize {
        self.per_job
    }

    /// Readies the side path for a new generation: a job left running by a generation that
    /// stopped early is waited for and dropped, and the report starts at zero.
    pub(crate) fn begin(&mut self) -> Result<()> {
        if std::mem::take(&mut self.running) {
            self.jobs.wait(0, |_, requested| !requested, |_| ()).map_err(|_| failed())?;
        }
        self.report = SideReport::default();
        Ok(())
    }

    /// The merge point after a dense pass that stored keys and values at `dense_stored`
    /// positions: waits for the running job if it is late, merges its keys and values (marking
    /// them fresh in `kv_fresh`) and applies its checks to `x` and `states`, brings the side
    /// cache level with the dense one; then, if `launch`, starts a job over the oldest
    /// visible tokens.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn merge_and_launch(
        &mut self,
        session: &mut Session,
        x: &mut [u32],
        states: &mut [TokenState],
        kv_fresh: &mut [bool],
        prompt_len: usize,
        dense_stored: &[u32],
        p: &SamplerParams,
        step: usize,
        launch: bool,
        revised: &mut Vec<[u32; 2]>,
    ) -> Result<()> {
        let wait = Instant::now();
        let running = std::mem::take(&mut self.running);
        let (report, fresh, per_job) = (&mut self.report, &mut self.fresh, self.per_job);
        // The job is home (the thread finished it) once its request is gone.
        let launched = self.jobs.wait(0, |_, requested| !requested, |job| -> Result<bool> {
            if running {
                report.stall_seconds += wait.elapsed().as_secs_f64();
                if let Some(e) = job.error.take() {
                    return Err(e);
                }
                // Its reads of the artifact may have seen zeros if the file was truncated meanwhile.
                session.model.check_intact()?;
                report.side_seconds += job.seconds;
                fresh.clear();
                fresh.extend(job.checked.iter().copied().filter(|p| !dense_stored.contains(p)));
                let model = session.model;
                session.window_mut().copy_kv_from(&job.window, fresh, &model.header);
                for &q in fresh.iter() {
                    kv_fresh[q as usize] = true;
                }
                apply_checks(report, &job.checked, &job.predictions, x, states, kv_fresh, prompt_len, p, revised);
            }
            job.window.copy_kv_from(session.window(), dense_stored, &session.model.header);
            if !launch {
                return Ok(false);
            }
            job.checked.clear();
            let dream = session.model.is_dream();
            for q in states.iter().enumerate().filter(|(_, s)| matches!(s, TokenState::Visible { .. })).map(|(i, _)| (prompt_len + i) as u32) {
                // Dream: never a token and the one before it (see the module documentation).
                if job.checked.len() == per_job {
                    break;
                }
                if !(dream && job.checked.last() == Some(&(q - 1))) {
                    job.checked.push(q);
                }
            }
            if job.checked.is_empty() {
                return Ok(false);
            }
            job.tokens.clear();
            job.tokens.extend(job.checked.iter().map(|&q| x[q as usize]));
            job.before.clear();
            if dream {
                job.before.extend(job.checked.iter().map(|&q| x[q as usize - 1]));
            }
            (job.seq_len, job.params, job.step) = (x.len(), *p, step);
            job.trace = session.trace();
            report.side_passes += if dream { 2 } else { 1 };
            report.side_rows += if dream { 3 } else { 2 } * job.checked.len() as u64;
            Ok(true)
        });
        if launched.map_err(|_| failed())?? {
            self.jobs.request(0, ());
            self.running = true;
        }
        Ok(())
    }
}

/// Readies the session's CPU side path for a generation checking `per_job` tokens a side
/// pass: the one kept from an earlier generation if it checks as many, else a new one
/// (thread started, window allocated; counted in `Counters::side_path_starts`).
pub(super) fn begin(session: &mut Session, per_job: usize) -> Result<usize> {
    let kept = session.take_side_path().and_then(|s| s.downcast::<SidePath>().ok()).filter(|s| s.per_job() == per_job);
    let mut side = match kept {
        Some(s) => s,
        None => {
            session.counters.side_path_starts += 1;
            Box::new(SidePath::new(session.model, session.features(), per_job)?)
        }
    };
    let begun = side.begin();
    session.put_side_path(side);
    begun.map(|()| per_job)
}

/// Runs `f` with the session's side path taken out of it (so `f` may borrow the session).
pub(super) fn with_side_path<R>(session: &mut Session, f: impl FnOnce(&mut SidePath, &mut Session) -> Result<R>) -> Result<R> {
    let Some(mut side) = session.take_side_path().and_then(|s| s.downcast::<SidePath>().ok()) else {
        return Err(Error::Internal("the session's CPU side path is gone".to_string()));
    };
    let r = f(&mut side, session);
    session.put_side_path(side);
    r
}

/// The error of a side path whose thread failed outside a job.
fn failed() -> Error {
    Error::Internal("the CPU side path's thread failed".to_string())
}

impl Drop for SidePath {
    /// Tells the worker to exit once its job (if any) is done, and joins it.
    fn drop(&mut self) {
        self.jobs.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Applies a job's checks (`predictions` of `positions`): agreements count towards
/// stability, confident disagreements revise the token (appended to `revised` as
/// `[position in generation, new token]`).
#[allow(clippy::too_many_arguments)]
fn apply_checks(
    report: &mut SideReport,
    positions: &[u32],
    predictions: &[(u32, f32)],
    x: &mut [u32],
    states: &mut [TokenState],
    kv_fresh: &mut [bool],
    prompt_len: usize,
    p: &SamplerParams,
    revised: &mut Vec<[u32; 2]>,
) {
    for (&pos, &(token, confidence)) in positions.iter().zip(predictions) {
        let pos = pos as usize;
        let TokenState::Visible { agreed } = states[pos - prompt_len] else { continue };
        report.checks += 1;
        states[pos - prompt_len] = if token == x[pos] {
            if confidence >= p.stable_confidence || agreed + 1 >= p.stable_checks {
                report.stabilised += 1;
                TokenState::Stable
            } else {
                TokenState::Visible { agreed: agreed + 1 }
            }
        } else if confidence >= p.revise_confidence {
            // Its cached keys and values are now the old token's: the dense path refreshes it.
            x[pos] = token;
            kv_fresh[pos] = false;
            report.revisions += 1;
            revised.push([(pos - prompt_len) as u32, token]);
            TokenState::Visible { agreed: 0 }
        } else {
            TokenState::Visible { agreed }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_stabilise_agreeing_tokens_and_revise_confident_disagreements() {
        let p = SamplerParams { stable_confidence: 0.9, stable_checks: 2, revise_confidence: 0.5, ..Default::default() };
        let mut x = vec![0, 0, 10, 11, 12, 13];
        let mut states = vec![TokenState::Visible { agreed: 0 }, TokenState::Visible { agreed: 1 }, TokenState::Visible { agreed: 0 }, TokenState::Stable];
        let mut r = SideReport::default();
        // Prompt of 2: positions 2..6 are generated.
        let checks = [(10, 0.95), (11, 0.6), (99, 0.7), (5, 1.0)];
        let mut fresh = vec![true; 6];
        let mut revised = Vec::new();
        apply_checks(&mut r, &[2, 3, 4, 5], &checks, &mut x, &mut states, &mut fresh, 2, &p, &mut revised);
        assert_eq!(revised, vec![[2, 99]], "the revision is reported in generation positions");
        assert_eq!(fresh, vec![true, true, true, true, false, true], "a revised token's keys and values are stale");
        // Confident agreement: stable. Second agreement: stable. Confident disagreement:
        // revised, checked afresh. A stable token is never checked.
        assert_eq!(states, vec![TokenState::Stable, TokenState::Stable, TokenState::Visible { agreed: 0 }, TokenState::Stable]);
        assert_eq!(x, vec![0, 0, 10, 11, 99, 13]);
        assert_eq!((r.checks, r.stabilised, r.revisions), (3, 2, 1));
        // A weak agreement counts; a weak disagreement changes nothing.
        apply_checks(&mut r, &[4], &[(99, 0.3)], &mut x, &mut states, &mut fresh, 2, &p, &mut revised);
        assert_eq!(states[2], TokenState::Visible { agreed: 1 });
        apply_checks(&mut r, &[4], &[(7, 0.3)], &mut x, &mut states, &mut fresh, 2, &p, &mut revised);
        assert_eq!(revised.len(), 1, "weak checks revise nothing");
        assert_eq!((states[2], x[4]), (TokenState::Visible { agreed: 1 }, 99));
    }
}
