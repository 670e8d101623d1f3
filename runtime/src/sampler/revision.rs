//! Dual-path progressive revision: the CPU side path of `mbsd`.
//!
//! A committed token is *visible*: later passes read it, but its keys and values in the cache
//! were computed while it was still masked (the dense path does not recompute committed
//! rows unless a bucket has idle rows). After every dense pass the side path takes up to
//! `side_rows / 2` visible tokens (lowest position first) and, on the session's side lane (a
//! thread of its own, with its own cache; `side_lane.rs`), runs one pass of two rows per token:
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

use super::ask::{SideChecks, SideJob};
use super::dream::{self, DREAM_REVISE};
use super::{predict_with, SamplerParams, REVISE};
use super::ask::Predict;

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

impl SideReport {
    pub fn add(&mut self, o: &SideReport) {
        self.side_passes += o.side_passes;
        self.side_rows += o.side_rows;
        self.checks += o.checks;
        self.revisions += o.revisions;
        self.stabilised += o.stabilised;
        self.stall_seconds += o.stall_seconds;
        self.side_seconds += o.side_seconds;
    }
}

/// The generation as revision sees it: the canvas `x` (prompt then generation), each
/// generated position's state, whether each position's cached keys and values hold its
/// current token, and the revisions made (`[position in generation, new token]`).
pub(super) struct Revisable<'a> {
    pub(super) x: &'a mut [u32],
    pub(super) prompt_len: usize,
    pub(super) states: &'a mut [TokenState],
    pub(super) kv_fresh: &'a mut [bool],
    pub(super) revised: &'a mut Vec<[u32; 2]>,
}

/// The revision policy's side of the lane: the job it prepares, and what its checks did.
pub(super) struct Reviser {
    /// Tokens checked per job.
    per_job: usize,
    /// Dream: a check row reads the position before the checked one.
    dream: bool,
    /// The next job: the checked positions, their tokens, and (Dream) the tokens before them.
    checked: Vec<u32>,
    tokens: Vec<u32>,
    before: Vec<u32>,
    pub(super) report: SideReport,
}

impl Reviser {
    /// A reviser checking `per_job` tokens a side pass, with Dream's checks if `dream`.
    pub(super) fn new(per_job: usize, dream: bool) -> Reviser {
        let cap = || Vec::with_capacity(per_job);
        Reviser { per_job, dream, checked: cap(), tokens: cap(), before: cap(), report: SideReport::default() }
    }

    /// Tokens one side pass checks.
    pub(super) fn per_job(&self) -> usize {
        self.per_job
    }

    /// What a check row's logits predict: LLaDA's rule or Dream's.
    pub(super) fn predict(&self) -> Predict {
        if self.dream { check_dream } else { check_llada }
    }

    /// The merge point after a dense pass: the merged job's `checks` (if one ran), whose
    /// refreshed keys and values are now the dense cache's (marked fresh in `t.kv_fresh`), are
    /// applied to `t`.
    pub(super) fn merge(&mut self, t: &mut Revisable, checks: Option<SideChecks>, p: &SamplerParams) {
        let Some(checks) = checks else { return };
        self.report.stall_seconds += checks.waited_seconds;
        self.report.side_seconds += checks.side_seconds;
        for &q in checks.fresh {
            t.kv_fresh[q as usize] = true;
        }
        apply_checks(&mut self.report, checks.checked, checks.predictions, t, p);
    }

    /// Chooses the next job: up to `per_job` visible tokens, lowest position first (Dream:
    /// never a token and the one before it; see the module documentation). `false` when
    /// there is none to check.
    pub(super) fn prepare_job(&mut self, t: &Revisable) -> bool {
        self.checked.clear();
        for q in t.states.iter().enumerate().filter(|(_, s)| matches!(s, TokenState::Visible { .. })).map(|(i, _)| (t.prompt_len + i) as u32) {
            if self.checked.len() == self.per_job {
                break;
            }
            if !(self.dream && self.checked.last() == Some(&(q - 1))) {
                self.checked.push(q);
            }
        }
        if self.checked.is_empty() {
            return false;
        }
        self.tokens.clear();
        self.tokens.extend(self.checked.iter().map(|&q| t.x[q as usize]));
        self.before.clear();
        if self.dream {
            self.before.extend(self.checked.iter().map(|&q| t.x[q as usize - 1]));
        }
        self.report.side_passes += if self.dream { 2 } else { 1 };
        self.report.side_rows += if self.dream { 3 } else { 2 } * self.checked.len() as u64;
        true
    }

    /// The job [`prepare_job`](Self::prepare_job) chose, in a `seq_len` sequence, predicted
    /// with `params` at noise step `step`.
    pub(super) fn job(&self, seq_len: usize, params: SamplerParams, step: usize) -> SideJob<'_> {
        SideJob { checked: &self.checked, tokens: &self.tokens, before: &self.before, seq_len, params, step }
    }
}

/// LLaDA's check: the official prediction at the position.
fn check_llada(row: &mut [f32], p: &SamplerParams, special: &llada_ir::SpecialTokens, step: usize, position: usize) -> (u32, f32) {
    predict_with(row, p, special, REVISE, step, position)
}

/// Dream's check: its sampler's prediction from the row before the position.
fn check_dream(row: &mut [f32], p: &SamplerParams, _special: &llada_ir::SpecialTokens, step: usize, position: usize) -> (u32, f32) {
    dream::predict(row, p, DREAM_REVISE, step, position)
}

/// Applies a job's checks (`predictions` of `positions`) to `t`: agreements count towards
/// stability, confident disagreements revise the token (appended to `t.revised`).
fn apply_checks(report: &mut SideReport, positions: &[u32], predictions: &[(u32, f32)], t: &mut Revisable, p: &SamplerParams) {
    let Revisable { x, prompt_len, states, kv_fresh, revised } = t;
    let prompt_len = *prompt_len;
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
        let mut t = Revisable { x: &mut x, prompt_len: 2, states: &mut states, kv_fresh: &mut fresh, revised: &mut revised };
        apply_checks(&mut r, &[2, 3, 4, 5], &checks, &mut t, &p);
        assert_eq!(*t.revised, vec![[2, 99]], "the revision is reported in generation positions");
        assert_eq!(*t.kv_fresh, [true, true, true, true, false, true], "a revised token's keys and values are stale");
        // Confident agreement: stable. Second agreement: stable. Confident disagreement:
        // revised, checked afresh. A stable token is never checked.
        assert_eq!(*t.states, [TokenState::Stable, TokenState::Stable, TokenState::Visible { agreed: 0 }, TokenState::Stable]);
        assert_eq!(*t.x, [0, 0, 10, 11, 99, 13]);
        assert_eq!((r.checks, r.stabilised, r.revisions), (3, 2, 1));
        // A weak agreement counts; a weak disagreement changes nothing.
        apply_checks(&mut r, &[4], &[(99, 0.3)], &mut t, &p);
        assert_eq!(t.states[2], TokenState::Visible { agreed: 1 });
        apply_checks(&mut r, &[4], &[(7, 0.3)], &mut t, &p);
        assert_eq!(t.revised.len(), 1, "weak checks revise nothing");
        assert_eq!((t.states[2], t.x[4]), (TokenState::Visible { agreed: 1 }, 99));
    }
}
