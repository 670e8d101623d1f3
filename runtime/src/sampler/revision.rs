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

use std::time::Instant;

use super::dream::{self, DREAM_REVISE};
use super::{predict_with, SamplerParams, REVISE};
use crate::error::{Error, Result};
use crate::session::Session;
use crate::side_lane::Predict;

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

/// The revision policy's side of the lane: what its checks did, and scratch.
pub(super) struct Reviser {
    /// Tokens checked per job.
    per_job: usize,
    /// The merged job's positions the dense pass did not store (scratch).
    fresh: Vec<u32>,
    pub(super) report: SideReport,
}

impl Reviser {
    /// Readies the session's side lane for a generation checking `per_job` tokens a side pass
    /// (kept from an earlier generation if it checks as many, else set up anew).
    pub(super) fn begin(session: &mut Session, per_job: usize) -> Result<Reviser> {
        let predict: Predict = if session.model.is_dream() { check_dream } else { check_llada };
        session.begin_side_lane(per_job, predict)?;
        Ok(Reviser { per_job, fresh: Vec::with_capacity(per_job), report: SideReport::default() })
    }

    /// Tokens one side pass checks.
    pub(super) fn per_job(&self) -> usize {
        self.per_job
    }

    /// The merge point after a dense pass that stored keys and values at `dense_stored`
    /// positions: waits for the running job if it is late, merges its keys and values (marking
    /// them fresh in `t.kv_fresh`) and applies its checks to `t`, brings the side cache level
    /// with the dense one; then, if `launch`, starts a job over the oldest visible tokens.
    pub(super) fn merge_and_launch(&mut self, session: &mut Session, mut t: Revisable, dense_stored: &[u32], p: &SamplerParams, step: usize, launch: bool) -> Result<()> {
        let wait = Instant::now();
        let prompt_len = t.prompt_len;
        let (report, fresh, per_job) = (&mut self.report, &mut self.fresh, self.per_job);
        let Some(mut lane) = session.take_side_lane() else {
            return Err(Error::Internal("the session's CPU side lane is gone".to_string()));
        };
        // The job is home (the thread finished it) when `exchange` calls back.
        let exchanged = lane.exchange(|job, running| -> Result<bool> {
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
                let model = session.model.clone();
                session.window_mut().copy_kv_from(&job.window, fresh, &model.header);
                for &q in fresh.iter() {
                    t.kv_fresh[q as usize] = true;
                }
                apply_checks(report, &job.checked, &job.predictions, &mut t, p);
            }
            job.window.copy_kv_from(session.window(), dense_stored, &session.model.header);
            if !launch {
                return Ok(false);
            }
            job.checked.clear();
            let dream = session.model.is_dream();
            for q in t.states.iter().enumerate().filter(|(_, s)| matches!(s, TokenState::Visible { .. })).map(|(i, _)| (prompt_len + i) as u32) {
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
            job.tokens.extend(job.checked.iter().map(|&q| t.x[q as usize]));
            job.before.clear();
            if dream {
                job.before.extend(job.checked.iter().map(|&q| t.x[q as usize - 1]));
            }
            (job.seq_len, job.params, job.step) = (t.x.len(), *p, step);
            job.trace = session.trace();
            report.side_passes += if dream { 2 } else { 1 };
            report.side_rows += if dream { 3 } else { 2 } * job.checked.len() as u64;
            Ok(true)
        });
        session.put_side_lane(lane);
        exchanged
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
