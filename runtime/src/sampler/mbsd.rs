//! Multi-block speculative decoding (`--policy mbsd`): the dense path.
//!
//! Blocks commit left to right with the official commit rule (the step's scheduled top-k, or
//! the threshold rule). A block starts with a whole-sequence pass, as `dual` does; every other
//! pass is a row-set pass on the smallest latency bucket of the plan (`plan.row_buckets`, at
//! least `--rows`) that holds the block's masked positions. Committed tokens are read from
//! the cache, not recomputed. The rows the bucket leaves idle are filled, in this order, with:
//! - committed positions whose cached keys and values are stale (computed while they were
//!   masked, or before a revision), up to the block's end: *refresh* rows, their tokens as
//!   inputs, keys and values stored, so the pass after a commit already sees the token;
//! - masked positions of the next `spec_blocks` blocks (*speculative* rows: mask inputs, no
//!   keys or values stored, so nothing a committed row reads changes). Their predictions are
//!   drafts, the latest one per position;
//! - the other committed positions of the current block (refresh rows too), so a bucket as
//!   large as the block recomputes it whole, as `dual` does.
//!
//! Drafts are never commitments. When a drafted position's block is current, the first pass
//! that predicts it accepts the draft if it predicts the same token with at least
//! `spec_threshold` confidence (a commit besides the step's scheduled ones) and drops it
//! otherwise. A block ends when nothing in it is masked, so accepted drafts save passes.
//! With `--revision dual-path`, committed tokens stay revisable and the CPU side path
//! re-checks them (`revision`).

use std::ops::ControlFlow;

use super::revision::{SidePath, SideReport, TokenState};
use super::{commit_best, committed_prefix, commits_per_step, settle_predictions, Generation, Predictor, Revision, SamplerParams, StepView, GUMBEL};
use crate::error::{Error, Result};
use crate::session::{RowSet, Session};

/// What the dense and side paths of an `mbsd` generation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MbsdReport {
    pub dense_passes: u64,
    /// Dense rows by kind: masked positions of the current block, speculative rows,
    /// refreshed rows (committed tokens, and the rest of a whole-sequence pass) and padding.
    pub rows_masked: u64,
    pub rows_speculative: u64,
    pub rows_refresh: u64,
    pub rows_padding: u64,
    pub drafts_accepted: u64,
    pub drafts_dropped: u64,
    /// The CPU side path (zero with `--revision off`).
    pub side: SideReport,
}

impl MbsdReport {
    pub fn dense_rows(&self) -> u64 {
        self.rows_masked + self.rows_speculative + self.rows_refresh + self.rows_padding
    }

    pub fn add(&mut self, o: &MbsdReport) {
        self.dense_passes += o.dense_passes;
        self.rows_masked += o.rows_masked;
        self.rows_speculative += o.rows_speculative;
        self.rows_refresh += o.rows_refresh;
        self.rows_padding += o.rows_padding;
        self.drafts_accepted += o.drafts_accepted;
        self.drafts_dropped += o.drafts_dropped;
        let (s, t) = (&mut self.side, &o.side);
        s.side_passes += t.side_passes;
        s.side_rows += t.side_rows;
        s.checks += t.checks;
        s.revisions += t.revisions;
        s.stabilised += t.stabilised;
        s.stall_seconds += t.stall_seconds;
        s.side_seconds += t.side_seconds;
    }
}

/// The row buckets of the plan a pass may run, at least `min_rows` rows each.
fn buckets(session: &Session, min_rows: usize) -> Result<Vec<usize>> {
    let plan = &session.model.header.plan;
    if plan.row_buckets.is_empty() {
        return Err(Error::request(format!("{} has no row-set latency buckets (plan.row_buckets): recompile it with this lladac", session.model.path.display())));
    }
    let mut b: Vec<usize> = plan.row_buckets.iter().map(|&r| r as usize).filter(|&r| r >= min_rows).collect();
    if b.is_empty() {
        // More rows than the largest bucket: the smallest graph that holds them.
        b.push(session.model.graph(session.model.graph_for_rows(min_rows)?).rows as usize);
    }
    Ok(b)
}

/// One pass's rows, and the positions whose logits it returns.
#[derive(Default)]
struct Pass {
    rows: RowSet,
    /// Positions of the head rows, and their indexes among the rows.
    head_positions: Vec<u32>,
    head_rows: Vec<u32>,
    /// Positions whose keys and values the pass stored.
    stored: Vec<u32>,
}

pub(super) fn run(session: &mut Session, prompt: &[u32], p: &SamplerParams, steps_per_block: usize, on_step: &mut dyn FnMut(&StepView) -> ControlFlow<()>) -> Result<Generation> {
    let special = session.model.header.special.clone();
    let mask = special.mask;
    let len = prompt.len() + p.gen_length;
    let min_rows = p.rows.unwrap_or_else(|| session.model.header.plan.row_buckets.first().copied().unwrap_or(1) as usize);
    let buckets = buckets(session, min_rows)?;
    let side_rows = p.side_rows.unwrap_or(buckets[0]);
    let mut x: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, p.gen_length)).collect();
    let mut states = vec![TokenState::Masked; p.gen_length];
    // Whether the cache holds each position's keys and values computed with its current
    // token (set by passes that store it and by side-path merges, cleared by commits and
    // revisions).
    let mut kv_fresh = vec![false; len];
    let mut drafts: Vec<Option<u32>> = vec![None; len];
    let mut report = MbsdReport::default();
    let mut reveals = Vec::with_capacity(p.steps.min(p.gen_length));
    let mut revisions = Vec::with_capacity(p.steps.min(p.gen_length));
    let blocks = p.gen_length / p.block_length;
    let mut predictor = Predictor::for_session(session, p.block_length * (1 + p.spec_blocks));
    let mut pass = Pass::default();
    let mut candidates = Vec::with_capacity(p.block_length);
    let mut step = 0;
    std::thread::scope(|scope| -> Result<()> {
        let mut side = match p.revision {
            Revision::DualPath => Some(SidePath::new(session, side_rows)?),
            Revision::Off => None,
        };
        for b in 0..blocks {
            let block_start = prompt.len() + b * p.block_length;
            let block_end = block_start + p.block_length;
            let draft_end = (block_end + p.spec_blocks * p.block_length).min(len);
            let block_masked = x[block_start..block_end].iter().filter(|&&t| t == mask).count();
            let schedule = commits_per_step(block_masked, steps_per_block);
            for i in 0.. {
                if !x[block_start..block_end].contains(&mask) {
                    break;
                }
                let scheduled = schedule.get(i).copied().unwrap_or(1).max(1);
                // Noise as `dual` numbers its steps (the same step, the same noise).
                let noise_step = b * steps_per_block + i;
                let full = i == 0 || (p.refresh_every > 0 && i % p.refresh_every == 0);
                let logits = if full {
                    whole_sequence(session, &x, mask, block_end, draft_end, &mut pass, &mut report)?
                } else {
                    row_set(session, &x, &kv_fresh, mask, (block_start, block_end, draft_end), &buckets, &mut pass, &mut report)?
                };
                for &q in &pass.stored {
                    kv_fresh[q as usize] = true;
                }
                predictor.load(logits);
                let predictions = predictor.run(session.pool(), &pass.head_positions, p, &special, GUMBEL, noise_step);
                candidates.clear();
                let mut committed: Vec<[u32; 2]> = Vec::new();
                let (accepted, dropped) =
                    settle_predictions(&pass.head_positions, predictions, block_end, &mut drafts, p, &mut x, prompt.len(), &mut committed, &mut candidates);
                report.drafts_accepted += accepted;
                report.drafts_dropped += dropped;
                commit_best(&candidates, scheduled, p, &mut x, prompt.len(), &mut committed);
                let state = if side.is_some() { TokenState::Visible { agreed: 0 } } else { TokenState::Stable };
                for &[at, _] in &committed {
                    states[at as usize] = state;
                    kv_fresh[prompt.len() + at as usize] = false;
                }
                let last = b + 1 == blocks && !x[block_start..block_end].contains(&mask);
                let mut revised: Vec<[u32; 2]> = Vec::new();
                if let Some(side) = side.as_mut() {
                    side.merge_and_launch(scope, session, &mut x, &mut states, &mut kv_fresh, prompt.len(), &pass.stored, p, noise_step, !last, &mut revised)?;
                }
                step += 1;
                // Under revision only stable tokens are final, until the last step ends it all.
                let settled = match side {
                    Some(_) if !last => states.iter().position(|s| *s != TokenState::Stable).unwrap_or(states.len()),
                    _ => committed_prefix(&x[prompt.len()..], mask),
                };
                if on_step(&StepView { step, steps: p.steps, canvas: &x, prompt_len: prompt.len(), committed: &committed, revised: &revised, settled }).is_break() {
                    return Err(Error::Cancelled);
                }
                reveals.push(committed);
                revisions.push(revised);
            }
        }
        if let Some(side) = side {
            report.side = side.report;
        }
        Ok(())
    })?;
    report.dense_passes = reveals.len() as u64;
    Ok(Generation {
        prompt_ids: prompt.to_vec(),
        output_ids: x[prompt.len()..].to_vec(),
        reveals,
        revisions: (p.revision == Revision::DualPath).then_some(revisions),
        forward_passes: 0,
        rows_computed: 0,
        drafts_confirmed: report.drafts_accepted,
        seconds: 0.0,
        mbsd: Some(report),
    })
}

/// The pass that starts a block: every position, stored; logits of the masked positions up
/// to the block's end and of those drafted after it.
fn whole_sequence<'s>(session: &'s mut Session, x: &[u32], mask: u32, block_end: usize, draft_end: usize, pass: &mut Pass, report: &mut MbsdReport) -> Result<&'s [f32]> {
    pass.head_positions.clear();
    pass.head_positions.extend((0..draft_end).filter(|&i| x[i] == mask).map(|i| i as u32));
    let masked = pass.head_positions.iter().filter(|&&q| (q as usize) < block_end).count();
    let speculative = pass.head_positions.len() - masked;
    pass.stored.clear();
    pass.stored.extend(0..x.len() as u32);
    let rows = session.model.graph(session.model.graph_for_rows(x.len())?).rows as usize;
    report.rows_masked += masked as u64;
    report.rows_speculative += speculative as u64;
    report.rows_refresh += (x.len() - masked - speculative) as u64;
    report.rows_padding += (rows - x.len()) as u64;
    session.forward_full(x, &pass.head_positions)
}

/// A pass on the smallest bucket holding the block's masked positions, its idle rows filled
/// with speculative rows, then refresh rows (see the module documentation).
#[allow(clippy::too_many_arguments)]
fn row_set<'s>(
    session: &'s mut Session,
    x: &[u32],
    kv_fresh: &[bool],
    mask: u32,
    (block_start, block_end, draft_end): (usize, usize, usize),
    buckets: &[usize],
    pass: &mut Pass,
    report: &mut MbsdReport,
) -> Result<&'s [f32]> {
    let masked: Vec<usize> = (block_start..block_end).filter(|&i| x[i] == mask).collect();
    let bucket = buckets.iter().copied().find(|&r| r >= masked.len()).unwrap_or(masked.len());
    let mut idle = bucket.saturating_sub(masked.len());
    let stale: Vec<usize> = (0..block_end).filter(|&i| x[i] != mask && !kv_fresh[i]).take(idle).collect();
    idle -= stale.len();
    let speculative: Vec<usize> = (block_end..draft_end).filter(|&i| x[i] == mask).take(idle).collect();
    idle -= speculative.len();
    let refresh = (block_start..block_end).filter(|&i| x[i] != mask && kv_fresh[i]).take(idle);
    // Stored rows in position order (then a bucket of the whole block is `dual`'s pass).
    pass.stored.clear();
    pass.stored.extend(masked.iter().chain(&stale).map(|&i| i as u32).chain(refresh.map(|i| i as u32)));
    pass.stored.sort_unstable();
    pass.rows.clear();
    for &q in &pass.stored {
        pass.rows.push(q as usize, x[q as usize], true);
    }
    for &q in &speculative {
        pass.rows.push(q, mask, false);
    }
    pass.head_positions.clear();
    pass.head_rows.clear();
    for (row, &q) in pass.rows.positions.iter().enumerate() {
        if x[q as usize] == mask {
            pass.head_positions.push(q);
            pass.head_rows.push(row as u32);
        }
    }
    let rows = session.model.graph(session.model.graph_for_rows(bucket.max(pass.rows.len()))?).rows as usize;
    report.rows_masked += masked.len() as u64;
    report.rows_speculative += speculative.len() as u64;
    report.rows_refresh += (pass.rows.len() - masked.len() - speculative.len()) as u64;
    report.rows_padding += (rows - pass.rows.len()) as u64;
    session.forward_rows(x.len(), &pass.rows, bucket, &pass.head_rows)
}
