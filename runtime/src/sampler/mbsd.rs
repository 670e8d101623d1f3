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
//! On a backend that pays for every row it computes (`Capabilities::cost_per_row`: the host
//! executor) idle rows are not free, so unless `--rows` asks for a bucket a row-set pass
//! computes the block's masked positions and its stale committed positions (each refreshed
//! once, by the pass after its commit, so later passes read its token; without that the tiny
//! Dream lost half a point), nothing else. Drafts are made once per position, by the pass
//! that empties the block (the freshest context before the next block starts), and only while
//! they pay: at least one in [`DRAFTS_PAY_ONE_IN`] of those judged was accepted, or, before
//! any was judged, some prediction of this generation already had the confidence a draft
//! needs to be accepted (`spec_threshold`; a model that is never that sure, such as random
//! weights, would have every draft dropped). A whole-sequence pass there computes no draft's
//! LM-logit row. (A speculative row costs one row once; an accepted draft saves a commit, and so a
//! step's pass of a dozen rows or more.)
//!
//! Drafts are never commitments. When a drafted position's block is current, the first pass
//! that predicts it accepts the draft if it predicts the same token with at least
//! `spec_threshold` confidence (a commit besides the step's scheduled ones) and drops it
//! otherwise. A block ends when nothing in it is masked, so accepted drafts save passes.
//! With `--revision dual-path`, committed tokens stay revisable and the CPU side path
//! re-checks them (`revision`).
//!
//! On Dream, whose prediction for position `q` is the output of the row at `q - 1`
//! (`Model::logit_shift`), a pass computes for each position it predicts the row before it
//! (the block's masked positions' rows are stored, a draft's row only read), and idle rows
//! fill with the block's other positions, so a bucket as large as the block is the `dual`
//! pass. Blocks commit as `dream.rs`'s blocked sampler does, with `--alg`'s confidence: a
//! block's first pass commits its first position; each later step of the block commits
//! `transfer_count` of its masked positions, and a step that commits none runs no pass.

use std::sync::Arc;

use super::ask::{Ask, PassContext, PassRequest, RowSet, SideChecks};
use super::canvas::{out_of_turn, Canvas, PolicyStep};
use super::dream::{self, DREAM_SAMPLE};
use super::revision::{Revisable, Reviser, SideReport, TokenState};
use super::{candidates, committed_prefix, Generation, Revision, SamplerParams, GUMBEL};
use crate::error::{Error, Result};
use crate::model::Model;
use super::ask::Predict;

/// What the dense and side paths of an `mbsd` generation did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct MbsdReport {
    pub dense_passes: u64,
    /// Dense rows by kind: masked positions of the current block, speculative rows,
    /// refreshed rows (committed tokens, and the rest of a whole-sequence pass) and padding (a
    /// graph's rows beyond those, where the backend computes them).
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
        self.side.add(&o.side);
    }
}

/// On a backend that pays for every row: drafts keep being made while at least one in this
/// many of those judged was accepted.
pub const DRAFTS_PAY_ONE_IN: u64 = 4;

/// Whether drafts pay (see the module documentation): at least one in [`DRAFTS_PAY_ONE_IN`]
/// of those judged was accepted, or none was judged yet and a prediction was `confident`
/// enough to accept one.
fn drafts_pay(accepted: u64, dropped: u64, confident: bool) -> bool {
    match accepted + dropped {
        0 => confident,
        judged => accepted * DRAFTS_PAY_ONE_IN >= judged,
    }
}

/// The row buckets of the plan a pass may run, at least `min_rows` rows each.
fn buckets(model: &Model, min_rows: usize) -> Result<Vec<usize>> {
    let plan = &model.header.plan;
    if plan.row_buckets.is_empty() {
        return Err(Error::request(format!("{} has no row-set latency buckets (plan.row_buckets): recompile it with this lladac", model.path.display())));
    }
    let mut b: Vec<usize> = plan.row_buckets.iter().map(|&r| r as usize).filter(|&r| r >= min_rows).collect();
    if b.is_empty() {
        // More rows than the largest bucket: the smallest graph that holds them.
        b.push(graph_rows(model, min_rows)?);
    }
    Ok(b)
}

/// Rows of the graph a pass over `rows` rows runs on.
fn graph_rows(model: &Model, rows: usize) -> Result<usize> {
    Ok(model.graph(model.graph_for_rows(rows)?).rows as usize)
}

/// One pass's rows, and the positions whose logits it returns, in buffers sized once.
struct Pass {
    rows: RowSet,
    /// Positions of the logit rows, and their indexes among the rows.
    logit_positions: Vec<u32>,
    logit_rows: Vec<u32>,
    /// Positions whose keys and values the pass stored.
    stored: Vec<u32>,
    /// A row-set pass's rows by kind (see `row_set`).
    masked: Vec<usize>,
    stale: Vec<usize>,
    speculative: Vec<usize>,
    /// Whether a position already has a row in the pass being built (cleared after it).
    in_rows: Vec<bool>,
}

/// The `mbsd` policy's state over a generation.
pub(super) struct Mbsd {
    buckets: Vec<usize>,
    states: Vec<TokenState>,
    /// Whether the cache holds each position's keys and values computed with its current
    /// token (set by passes that store it and by side-path merges, cleared by commits and
    /// revisions).
    kv_fresh: Vec<bool>,
    pass: Pass,
    report: MbsdReport,
    /// The revision policy, when the session's CPU side lane revises (dual path).
    side: Option<Reviser>,
    /// Rows before the position they predict: 0 for LLaDA, 1 for Dream.
    shift: usize,
    /// Dream: its blocked schedule's timesteps, `linspace(1, eps, steps_per_block + 1)`.
    dream_timesteps: Option<Vec<f32>>,
    /// Whether passes fill a bucket (idle rows are free on the backend, or `--rows` asked for
    /// one), else compute only the rows the step needs.
    fill_buckets: bool,
    /// Whether a prediction of this generation reached `spec_threshold`, the confidence an
    /// accepted draft needs.
    confident: bool,
    /// The artifact whose graphs the passes run on, and whether the backend computes (and
    /// charges) only the rows asked for.
    model: Arc<Model>,
    cost_per_row: bool,
    phase: Phase,
    /// The step is the generation's last (its revision launches no job).
    last: bool,
}

/// Where a step is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    /// Waiting for the dense pass's logits, for `commits` commits.
    Logits { commits: usize },
    /// Revision: the merge point, waiting for its checks, launching the next job.
    Merge,
    Checks,
    Launch,
    /// The step's settled prefix, then done.
    Settle,
}

/// What a row-set pass computes besides the rows of the block's masked positions.
struct Extra {
    /// Rows to add at most: the bucket's idle rows, or the speculative rows a step wants.
    rows: usize,
    /// Bucket filling: the idle rows bound the stale rows, and the block's other positions
    /// take what is left. Without it every stale row is computed and nothing else fills.
    refresh: bool,
}

impl Mbsd {
    pub(super) fn new(ctx: &PassContext, p: &SamplerParams, steps_per_block: usize, len: usize) -> Result<Mbsd> {
        let model = &ctx.model;
        let min_rows = p.rows.unwrap_or_else(|| model.header.plan.row_buckets.first().copied().unwrap_or(1) as usize);
        let buckets = buckets(model, min_rows)?;
        let side_rows = p.side_rows.unwrap_or(buckets[0]);
        let rows = model.header.graphs.iter().map(|g| g.rows as usize).max().unwrap_or(0);
        let cap = |n: usize| Vec::with_capacity(n);
        // `auto` on Dream's entropy rule: off (its confidence is no probability to compare).
        let entropy = model.is_dream() && p.alg == crate::params::Alg::Entropy;
        let side = match p.revision.resolve(ctx.runs_on_cpu || entropy) {
            Revision::DualPath => Some(Reviser::new((side_rows / 2).max(1), model.is_dream())),
            _ => None,
        };
        Ok(Mbsd {
            buckets,
            states: vec![TokenState::Masked; p.gen_length],
            kv_fresh: vec![false; len],
            pass: Pass {
                rows: RowSet { positions: cap(rows), tokens: cap(rows), stored: 0 },
                logit_positions: cap(len),
                logit_rows: cap(len),
                stored: cap(len),
                masked: Vec::with_capacity(len),
                stale: Vec::with_capacity(len),
                speculative: Vec::with_capacity(len),
                in_rows: vec![false; len],
            },
            report: MbsdReport::default(),
            side,
            shift: model.logit_shift() as usize,
            dream_timesteps: (model.is_dream()).then(|| dream::timesteps(steps_per_block, p.eps)),
            fill_buckets: p.rows.is_some() || !ctx.cost_per_row,
            confident: false,
            model: model.clone(),
            cost_per_row: ctx.cost_per_row,
            phase: Phase::Begin,
            last: false,
        })
    }
}

impl Mbsd {
    /// The most tokens one step's merge can revise: those a side pass checks.
    pub(super) fn checked_per_step(&self) -> usize {
        self.side.as_ref().map_or(0, Reviser::per_job)
    }

    /// Without bucket filling: whether drafts pay so far.
    fn drafts_pay(&self) -> bool {
        drafts_pay(self.report.drafts_accepted, self.report.drafts_dropped, self.confident)
    }

    /// The extra rows of a row-set pass whose block has `masked` masked positions and whose
    /// step commits `commits`: a bucket's idle rows, or without bucket filling, the
    /// speculative rows of the pass that empties the block, while drafts pay.
    fn extra(&self, masked: usize, commits: usize) -> Extra {
        if self.fill_buckets {
            let bucket = self.buckets.iter().copied().find(|&r| r >= masked).unwrap_or(masked);
            return Extra { rows: bucket - masked, refresh: true };
        }
        let drafting = masked <= commits && self.drafts_pay();
        Extra { rows: if drafting { usize::MAX } else { 0 }, refresh: false }
    }
}

/// The step number whose noise a step of `c` draws: as `dual` numbers its steps (the same
/// step, the same noise).
fn noise_step(c: &Canvas) -> usize {
    c.block * c.steps_per_block + c.i
}

impl Mbsd {
    /// The step's dense pass, or `None` where it commits nothing (Dream's commits are known
    /// before the pass).
    fn begin<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Option<PassRequest<'a>>> {
        let (mask, len) = (c.special.mask, c.x.len());
        let (block_start, block_end) = c.block_range();
        let draft_end = (block_end + c.p.spec_blocks * c.p.block_length).min(len);
        let full = c.i == 0 || (c.p.refresh_every > 0 && c.i % c.p.refresh_every == 0);
        let commits = match &self.dream_timesteps {
            None => c.scheduled,
            Some(_) if c.i == 0 => 1,
            Some(ts) => dream::transfer_count(c.x[block_start..block_end].iter().filter(|&&t| t == mask).count(), c.i, ts.len() - 1, ts),
        };
        if commits == 0 {
            return Ok(None);
        }
        self.phase = Phase::Logits { commits };
        let pass = if full {
            // Without bucket filling, the block's last pass drafts (with fresher context).
            let draft_end = if self.fill_buckets { draft_end } else { block_end };
            self.whole_sequence(&c.x, mask, (block_end, draft_end))?
        } else {
            let masked = c.x[block_start..block_end].iter().filter(|&&t| t == mask).count();
            let extra = self.extra(masked, commits);
            self.row_set(&c.x, mask, (block_start, block_end, draft_end), extra)?
        };
        Ok(Some(pass))
    }

    /// The pass's predictions, the step's commits (and confirmed drafts), and the states
    /// they leave.
    fn commit(&mut self, c: &mut Canvas, logits: &[f32], commits: usize) {
        let (prompt_len, noise_step) = (c.prompt_len, noise_step(c));
        let (block_start, block_end) = c.block_range();
        let (pass, report) = (&mut self.pass, &mut self.report);
        for &q in &pass.stored {
            self.kv_fresh[q as usize] = true;
        }
        let predictions = match self.dream_timesteps {
            Some(_) => {
                c.predictor.load(logits);
                c.predictor.run_dream(&pass.logit_positions, &c.p, DREAM_SAMPLE, noise_step)
            }
            None => c.predictor.run_on(logits, &pass.logit_positions, &c.p, &c.special, GUMBEL, noise_step),
        };
        c.candidates.clear();
        c.candidates.extend(candidates(&pass.logit_positions, predictions));
        let first = c.reveals.len();
        let (accepted, dropped) = c.settle_drafts(block_end);
        report.drafts_accepted += accepted;
        report.drafts_dropped += dropped;
        self.confident = self.confident || c.candidates.iter().any(|k| k.confidence >= c.p.spec_threshold);
        match self.dream_timesteps {
            None => c.commit_best(commits),
            // The block's first position, whatever its confidence (unless a draft took it).
            Some(_) if c.i == 0 => {
                if let Some(k) = c.candidates.iter().find(|k| k.position == block_start) {
                    c.x[block_start] = k.token;
                    c.reveals.push([(block_start - prompt_len) as u32, k.token]);
                }
            }
            Some(_) => dream::commit_blocked(c, commits, 0..c.x.len()),
        }
        let state = if self.side.is_some() { TokenState::Visible { agreed: 0 } } else { TokenState::Stable };
        for &[at, _] in &c.reveals[first..] {
            self.states[at as usize] = state;
            self.kv_fresh[prompt_len + at as usize] = false;
        }
        self.last = c.block + 1 == c.blocks && !c.x[block_start..block_end].contains(&c.special.mask);
    }
}

impl PolicyStep for Mbsd {
    fn next<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        match self.phase {
            Phase::Begin => match self.begin(c)? {
                Some(pass) => Ok(Ask::Pass(pass)),
                None => Ok(Ask::Done),
            },
            Phase::Merge => {
                self.phase = Phase::Checks;
                Ok(Ask::MergeSide { dense_stored: &self.pass.stored })
            }
            Phase::Launch => {
                self.phase = Phase::Settle;
                let side = self.side.as_ref().ok_or_else(out_of_turn)?;
                Ok(Ask::LaunchSide(side.job(c.x.len(), c.p, noise_step(c))))
            }
            Phase::Settle => {
                self.phase = Phase::Begin;
                let prompt_len = c.prompt_len;
                // Under revision only stable tokens are final, until the last step ends it all.
                c.settled = match self.side {
                    Some(_) if !self.last => self.states.iter().position(|s| *s != TokenState::Stable).unwrap_or(self.states.len()),
                    _ => committed_prefix(&c.x[prompt_len..], c.special.mask),
                };
                Ok(Ask::Done)
            }
            Phase::Logits { .. } | Phase::Checks => Err(out_of_turn()),
        }
    }

    fn logits(&mut self, c: &mut Canvas, logits: &[f32]) -> Result<()> {
        let Phase::Logits { commits } = self.phase else { return Err(out_of_turn()) };
        self.commit(c, logits, commits);
        self.phase = if self.side.is_some() { Phase::Merge } else { Phase::Settle };
        Ok(())
    }

    fn side_checks(&mut self, c: &mut Canvas, checks: Option<SideChecks>) -> Result<()> {
        let (Phase::Checks, Some(side)) = (self.phase, self.side.as_mut()) else { return Err(out_of_turn()) };
        let mut tokens = Revisable { x: &mut c.x, prompt_len: c.prompt_len, states: &mut self.states, kv_fresh: &mut self.kv_fresh, revised: &mut c.revisions };
        side.merge(&mut tokens, checks, &c.p);
        let launch = !self.last && side.prepare_job(&tokens);
        self.phase = if launch { Phase::Launch } else { Phase::Settle };
        Ok(())
    }

    fn side_lane(&self) -> Option<(usize, Predict)> {
        self.side.as_ref().map(|s| (s.per_job(), s.predict()))
    }

    fn report(&mut self, g: &mut Generation) {
        if let Some(side) = &self.side {
            self.report.side = side.report;
            // The generator fills in the steps' revisions.
            g.revisions = Some(Vec::new());
        }
        g.mbsd = Some(self.report);
    }
}

impl Mbsd {
    /// The pass that starts a block: every position, stored; logits of the masked positions up
    /// to the block's end and of those drafted after it.
    fn whole_sequence<'a>(&'a mut self, x: &'a [u32], mask: u32, (block_end, draft_end): (usize, usize)) -> Result<PassRequest<'a>> {
        let (pass, report) = (&mut self.pass, &mut self.report);
        pass.logit_positions.clear();
        pass.logit_positions.extend((0..draft_end).filter(|&i| x[i] == mask).map(|i| i as u32));
        let masked = pass.logit_positions.iter().filter(|&&q| (q as usize) < block_end).count();
        let speculative = pass.logit_positions.len() - masked;
        pass.stored.clear();
        pass.stored.extend(0..x.len() as u32);
        let rows = graph_rows(&self.model, x.len())?;
        report.rows_masked += masked as u64;
        report.rows_speculative += speculative as u64;
        report.rows_refresh += (x.len() - masked - speculative) as u64;
        report.rows_padding += padding_rows(self.cost_per_row, rows - x.len());
        report.dense_passes += 1;
        Ok(PassRequest::Span { seq: x, span: 0..x.len(), logit_positions: &pass.logit_positions })
    }
}

/// The padding rows a graph of `padding` more rows than the pass's costs: none where the
/// backend computes only real rows.
fn padding_rows(cost_per_row: bool, padding: usize) -> u64 {
    if cost_per_row { 0 } else { padding as u64 }
}

impl Mbsd {
    /// A pass on the rows of the block's masked positions and up to `extra.rows` more: stale rows
    /// (with `extra.refresh`), speculative rows, then the block's other positions (with
    /// `extra.refresh`; see the module documentation). A position `q`'s logits are those of the
    /// row at `q - shift`.
    fn row_set<'a>(&'a mut self, x: &[u32], mask: u32, (block_start, block_end, draft_end): (usize, usize, usize), extra: Extra) -> Result<PassRequest<'a>> {
        let (kv_fresh, shift, pass, report) = (&self.kv_fresh, self.shift, &mut self.pass, &mut self.report);
        let in_rows = &mut pass.in_rows;
        pass.masked.clear();
        pass.masked.extend((block_start..block_end).filter(|&i| x[i] == mask).map(|q| q.saturating_sub(shift)));
        pass.masked.iter().for_each(|&r| in_rows[r] = true);
        let mut idle = extra.rows;
        pass.stale.clear();
        pass.stale.extend((0..block_end).filter(|&i| x[i] != mask && !kv_fresh[i] && !in_rows[i]).take(if extra.refresh { idle } else { usize::MAX }));
        idle = idle.saturating_sub(pass.stale.len());
        pass.stale.iter().for_each(|&r| in_rows[r] = true);
        // A draft whose row is there already costs nothing.
        pass.speculative.clear();
        for q in (block_end..draft_end).filter(|&q| x[q] == mask) {
            let r = q - shift;
            if in_rows[r] {
                continue;
            }
            if idle == 0 {
                break;
            }
            in_rows[r] = true;
            pass.speculative.push(r);
            idle -= 1;
        }
        // Stored rows in position order (then a bucket of the whole block is `dual`'s pass).
        pass.stored.clear();
        pass.stored.extend(pass.masked.iter().chain(&pass.stale).map(|&i| i as u32));
        for i in block_start..block_end {
            if idle == 0 || !extra.refresh {
                break;
            }
            if !in_rows[i] {
                in_rows[i] = true;
                pass.stored.push(i as u32);
                idle -= 1;
            }
        }
        pass.stored.sort_unstable();
        pass.rows.clear();
        for &q in &pass.stored {
            pass.rows.push(q as usize, x[q as usize], true);
        }
        for &r in &pass.speculative {
            pass.rows.push(r, x[r], false);
        }
        // Every row whose prediction is of a masked position of this block or a drafted one.
        pass.logit_positions.clear();
        pass.logit_rows.clear();
        for (row, &r) in pass.rows.positions.iter().enumerate() {
            in_rows[r as usize] = false;
            let q = r as usize + shift;
            if q >= block_start && q < draft_end && x[q] == mask {
                pass.logit_positions.push(q as u32);
                pass.logit_rows.push(row as u32);
            }
        }
        // A filled bucket's rows, or the rows computed (a graph's padding rows, if any).
        let bucket = if extra.refresh { pass.masked.len().saturating_add(extra.rows) } else { pass.rows.len() }.max(pass.rows.len());
        let rows = graph_rows(&self.model, bucket)?;
        report.rows_masked += pass.masked.len() as u64;
        report.rows_speculative += pass.speculative.len() as u64;
        report.rows_refresh += (pass.rows.len() - pass.masked.len() - pass.speculative.len()) as u64;
        report.rows_padding += padding_rows(self.cost_per_row, rows - pass.rows.len());
        report.dense_passes += 1;
        Ok(PassRequest::Rows { seq_len: x.len(), rows: &pass.rows, bucket, logit_rows: &pass.logit_rows })
    }
}

#[cfg(test)]
mod tests {
    use super::drafts_pay;

    #[test]
    fn drafts_pay_while_one_in_four_is_accepted_or_before_any_is_judged_if_confident() {
        assert!(!drafts_pay(0, 0, false), "a model never sure enough for a draft");
        assert!(drafts_pay(0, 0, true));
        assert!(drafts_pay(1, 3, false) && drafts_pay(1, 3, true));
        assert!(!drafts_pay(1, 4, true) && !drafts_pay(0, 16, true));
    }
}
