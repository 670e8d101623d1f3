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
//! The merge point is fixed: after the dense pass that ran while the job ran, never when the
//! thread happens to finish; the dense path waits there if the job is late (counted as
//! stall). Then a check that agrees with at least `stable_confidence`, or the
//! `stable_checks`-th agreeing check, makes the token *stable* (never checked again); one that
//! disagrees with at least `revise_confidence` replaces the token (still visible, checked
//! again with fresh keys and values). The side window's cache mirrors the accelerator's: both
//! are brought level at every merge point (the side path's refreshed positions one way, the
//! positions the dense pass stored the other way; where both wrote, the dense pass, computed
//! with the newer canvas, wins).

use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use super::{predict_with, SamplerParams, REVISE};
use crate::error::{Error, Result};
use crate::executor::{value_range, HostExecutor, RunInputs};
use crate::model::Model;
use crate::session::Session;
use crate::trace::{Trace, Track};
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

/// The side path's executor and working memory, owned by whichever thread runs a job.
struct Worker<'m> {
    model: &'m Model,
    executor: HostExecutor,
    window: Window,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    head: Vec<u32>,
    logits: Vec<f32>,
}

/// A job's outcome: the checked positions and each one's prediction and confidence.
struct Outcome {
    positions: Vec<u32>,
    predictions: Vec<(u32, f32)>,
    /// The pass's time on the side thread.
    seconds: f64,
}

impl Worker<'_> {
    /// One side pass over `checked` (with `tokens` their committed tokens) in a `seq_len`
    /// sequence.
    fn check(&mut self, checked: &[u32], tokens: &[u32], seq_len: usize, p: &SamplerParams, step: usize) -> Result<Outcome> {
        let h = &self.model.header;
        let (mask, n) = (h.special.mask, checked.len());
        let gid = self.model.graph_for_rows(2 * n)?;
        let g = self.model.graph(gid);
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        self.tokens.extend(std::iter::repeat_n(mask, n));
        self.tokens.resize(g.rows as usize, mask);
        self.positions.clear();
        self.positions.extend_from_slice(checked);
        self.positions.extend_from_slice(checked);
        self.positions.resize(g.rows as usize, 0);
        self.head.clear();
        self.head.extend(n as u32..2 * n as u32);
        let inputs = RunInputs { tokens: &self.tokens, positions: &self.positions, stored_rows: n, context: seq_len, head_rows: &self.head, rows: 2 * n };
        self.executor.run_unstaged(self.model, g, &inputs, &mut self.window)?;
        let range = value_range(g, &g.values[g.logits as usize], n, h.plan.window.activations.offset);
        self.logits.clear();
        self.logits.extend_from_slice(&self.window.parts().activations[range]);
        let vocab = h.model.embedding_size as usize;
        let predictions = self.logits.chunks_exact_mut(vocab).zip(checked).map(|(row, &pos)| predict_with(row, p, &h.special, REVISE, step, pos as usize)).collect();
        Ok(Outcome { positions: checked.to_vec(), predictions, seconds: 0.0 })
    }
}

type Job<'scope, 'm> = ScopedJoinHandle<'scope, (Worker<'m>, Result<Outcome>)>;

/// The side path as the dense path's thread sees it: an idle worker or a running job.
pub(super) struct SidePath<'scope, 'm> {
    idle: Option<Worker<'m>>,
    running: Option<Job<'scope, 'm>>,
    /// Tokens checked per job.
    per_job: usize,
    trace: Option<std::sync::Arc<Trace>>,
    pub(super) report: SideReport,
}

impl<'scope, 'm: 'scope> SidePath<'scope, 'm> {
    /// A side path with one CPU thread and its own window, checking `side_rows / 2` tokens a
    /// pass.
    pub(super) fn new(session: &Session<'m>, side_rows: usize) -> Result<SidePath<'scope, 'm>> {
        let model = session.model;
        let window = Window::cpu_side(&model.header).map_err(|e| Error::io("allocating the CPU side path's window", e))?;
        let vocab = model.header.model.embedding_size as usize;
        let per_job = (side_rows / 2).max(1);
        let worker = Worker {
            model,
            executor: HostExecutor::cpu_side_path(model, 1, session.features()),
            window,
            tokens: Vec::new(),
            positions: Vec::new(),
            head: Vec::new(),
            logits: Vec::with_capacity(per_job * vocab),
        };
        Ok(SidePath { idle: Some(worker), running: None, per_job, trace: session.trace(), report: SideReport::default() })
    }

    /// The merge point after a dense pass that stored keys and values at `dense_stored`
    /// positions: waits for the running job if it is late, merges its keys and values (marking
    /// them fresh in `kv_fresh`) and applies its checks to `x` and `states`, brings the side cache level with the dense
    /// one; then, if `launch`, starts a job over the oldest visible tokens.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn merge_and_launch(
        &mut self,
        scope: &'scope Scope<'scope, '_>,
        session: &mut Session<'m>,
        x: &mut [u32],
        states: &mut [TokenState],
        kv_fresh: &mut [bool],
        prompt_len: usize,
        dense_stored: &[u32],
        p: &'scope SamplerParams,
        step: usize,
        launch: bool,
        revised: &mut Vec<[u32; 2]>,
    ) -> Result<()> {
        if let Some(job) = self.running.take() {
            let wait = Instant::now();
            let (worker, outcome) = job.join().map_err(|_| Error::Internal("the CPU side path's thread panicked".to_string()))?;
            self.report.stall_seconds += wait.elapsed().as_secs_f64();
            let outcome = outcome?;
            // Its reads of the artifact may have seen zeros if the file was truncated meanwhile.
            session.model.check_intact()?;
            self.report.side_seconds += outcome.seconds;
            let fresh: Vec<u32> = outcome.positions.iter().copied().filter(|p| !dense_stored.contains(p)).collect();
            let model = session.model;
            session.window_mut().copy_kv_from(&worker.window, &fresh, &model.header);
            for &q in &fresh {
                kv_fresh[q as usize] = true;
            }
            apply_checks(&mut self.report, &outcome.positions, &outcome.predictions, x, states, kv_fresh, prompt_len, p, revised);
            self.idle = Some(worker);
        }
        let worker = self.idle.as_mut().expect("no job runs after the merge");
        worker.window.copy_kv_from(session.window(), dense_stored, &session.model.header);
        if !launch {
            return Ok(());
        }
        let checked: Vec<u32> = states
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, TokenState::Visible { .. }))
            .map(|(i, _)| (prompt_len + i) as u32)
            .take(self.per_job)
            .collect();
        if checked.is_empty() {
            return Ok(());
        }
        let tokens: Vec<u32> = checked.iter().map(|&q| x[q as usize]).collect();
        let mut worker = self.idle.take().expect("checked above");
        let (seq_len, trace) = (x.len(), self.trace.clone());
        self.report.side_passes += 1;
        self.report.side_rows += 2 * checked.len() as u64;
        self.running = Some(scope.spawn(move || {
            let start = Instant::now();
            let outcome = worker.check(&checked, &tokens, seq_len, p, step);
            let end = Instant::now();
            if let Some(t) = trace {
                t.span(Track::SidePath, format!("check {} tokens", checked.len()), start, end);
            }
            // The job's own time travels with it (the report lives on the dense thread).
            (worker, outcome.map(|o| Outcome { seconds: (end - start).as_secs_f64(), ..o }))
        }));
        Ok(())
    }
}

impl Drop for SidePath<'_, '_> {
    /// A generation that ends early (an error, a cancel) joins its running job here: left to
    /// the scope, a job that panicked would panic the dense path's thread too.
    fn drop(&mut self) {
        if let Some(job) = self.running.take() {
            let _ = job.join();
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
