//! Dream's sampler (`diffusion_generate` of its published `generation_utils.py`), on the exact
//! policy. No blocks: each of `steps` steps is one pass over the whole sequence, whose logits
//! at position `p` are the network's output at `p - 1` (the session shifts them, see
//! `Model::logit_shift`). The step commits, among all masked positions, the
//! `int(masked * (1 - s / t))` (every remaining one at the last step) with the highest
//! confidence, `t` and `s` consecutive entries of `linspace(1, eps, steps + 1)` in float32 as
//! PyTorch computes it; the confidence is the rule `alg` names. `origin` instead commits each
//! masked position with probability `1 - s / t`.
//!
//! The cached policies block it as Fast-dLLM's Dream code (`generation_utils_block.py`) does:
//! `block_length` blocks of `steps / blocks` steps. Each block's first step is a pass over the
//! whole sequence that commits its first position (the prediction there, whatever its
//! confidence); the others are passes over the block and everything after it (`prefix`) or
//! over the block alone (`dual`), attending to the cache for the rest, each committing
//! `int(masked * (1 - s / t))` of the block's masked positions with `t`, `s` from
//! `linspace(1, eps, steps_per_block + 1)` from index 1 on (every remaining one at the block's
//! last step), by the negative-entropy confidence whatever `alg` says (that code passes
//! `neg_entropy=True` there). A pass over a span reads its first row's logits from that row
//! itself, as that code's shift over the span's logits does.
//!
//! Greedy settings (temperature 0, every rule but `origin`) reproduce the published tokens
//! and reveals: float32 arithmetic as PyTorch's, the selection by `topk.rs`. Sampling
//! (temperature above 0, `origin`) draws from the same distributions with this crate's own
//! random streams, not PyTorch's: the same distribution, not the same draws.

use rand::RngExt;

use super::ask::{Ask, PassRequest};
use super::canvas::{out_of_turn, Canvas, PolicyStep};
use super::{candidates, committed_prefix, stream};
use crate::error::Result;
use crate::params::{Alg, Policy, SamplerParams};

/// Random streams of Dream's draws (distinct from LLaDA's purposes): the commits' samples,
/// `origin`'s transfers, `alg_temp`'s picks, and the `mbsd` side path's checks.
pub(super) const DREAM_SAMPLE: u64 = 11;
const DREAM_TRANSFER: u64 = 12;
const DREAM_ALG_TEMP: u64 = 13;
pub(super) const DREAM_REVISE: u64 = 14;

pub(super) struct Dream {
    /// The schedule's timesteps: of the whole generation (exact), or of one block.
    timesteps: Vec<f32>,
    /// `prefix` or `dual` (Fast-dLLM's blocked sampler); `exact` the published one.
    policy: Policy,
    /// The rules of the blocked sampler's cached steps: `p` with the negative-entropy
    /// confidence.
    cached: SamplerParams,
    phase: Phase,
}

/// Where a step is: its pass asked for (which one, and what its commits need), or done.
#[derive(Clone, PartialEq)]
enum Phase {
    Begin,
    /// The published sampler's whole-sequence pass, for `count` commits.
    Exact { count: usize },
    /// The blocked sampler: a block's first pass (its first position), then passes for
    /// `count` commits ranked over `span`.
    BlockStart,
    Blocked { count: usize, span: std::ops::Range<usize> },
    End,
}

impl Dream {
    pub(super) fn new(p: &SamplerParams, steps_per_block: usize) -> Dream {
        let steps = if p.policy == Policy::Exact { p.steps } else { steps_per_block };
        // Fast-dLLM's cached steps take the negative entropy whatever `alg` says, and its
        // `confidence_threshold` mode the chosen token's probability.
        let alg = if p.threshold.is_some() { Alg::MaskgitPlus } else { Alg::Entropy };
        Dream { timesteps: timesteps(steps, p.eps), policy: p.policy, cached: SamplerParams { alg, ..*p }, phase: Phase::Begin }
    }

    /// The published sampler's step: its pass over the whole sequence, or its end where it
    /// commits nothing.
    fn exact_pass<'a>(&'a mut self, c: &'a mut Canvas) -> Ask<'a> {
        let (mask, len, steps, i) = (c.special.mask, c.x.len(), c.p.steps, c.i);
        c.logit_rows.clear();
        c.logit_rows.extend((0..len).filter(|&j| c.x[j] == mask).map(|j| j as u32));
        c.candidates.clear();
        let masked = c.logit_rows.len();
        let count = transfer_count(masked, i, steps, &self.timesteps);
        // A step that commits nothing changes nothing: its pass is skipped (the published
        // loop runs it and discards it).
        if masked == 0 || (count == 0 && c.p.alg != Alg::Origin) {
            return self.end(c);
        }
        self.phase = Phase::Exact { count };
        Ask::Pass(PassRequest::Span { seq: &c.x, span: 0..len, logit_positions: &c.logit_rows })
    }

    /// A step of the blocked sampler (`prefix`, `dual`): its pass, or its end where it commits
    /// nothing.
    fn blocked_pass<'a>(&'a mut self, c: &'a mut Canvas) -> Ask<'a> {
        let (mask, len) = (c.special.mask, c.x.len());
        let (start, end) = c.block_range();
        c.candidates.clear();
        c.logit_rows.clear();
        if c.i == 0 {
            // The block's first position from a whole-sequence pass, which refreshes the cache.
            c.logit_rows.push(start as u32);
            self.phase = Phase::BlockStart;
            return Ask::Pass(PassRequest::Span { seq: &c.x, span: 0..len, logit_positions: &c.logit_rows });
        }
        // What Fast-dLLM ranks: the block and everything after it, or the block alone.
        let span = if self.policy == Policy::Dual { start..end } else { start..len };
        c.logit_rows.extend((start..end).filter(|&j| c.x[j] == mask).map(|j| j as u32));
        let steps = self.timesteps.len() - 1;
        let count = match c.p.threshold {
            // Every masked position of the block is ranked; the loop runs until none is left.
            Some(_) => c.logit_rows.len(),
            None => transfer_count(c.logit_rows.len(), c.i, steps, &self.timesteps),
        };
        if c.logit_rows.is_empty() || count == 0 {
            return self.end(c);
        }
        self.phase = Phase::Blocked { count, span: span.clone() };
        Ask::Pass(PassRequest::Span { seq: &c.x, span, logit_positions: &c.logit_rows })
    }

    /// The step's end: what is settled.
    fn end(&mut self, c: &mut Canvas) -> Ask<'static> {
        self.phase = Phase::Begin;
        c.settled = committed_prefix(&c.x[c.prompt_len..], c.special.mask);
        Ask::Done
    }

    /// The published sampler's commits from its pass's predictions (in `c.candidates`).
    fn exact_commits(&self, c: &mut Canvas, count: usize) {
        let (i, steps) = (c.i, c.p.steps);
        if let Some(t) = c.p.alg_temp.filter(|&t| t != 0.0 && c.p.alg != Alg::Origin) {
            commit_drawn(c, count, t);
        } else if c.p.alg == Alg::Origin {
            let p_transfer = if i + 1 < steps { 1.0 - self.timesteps[i + 1] / self.timesteps[i] } else { 1.0 };
            for cand in &c.candidates {
                let u: f32 = stream(c.p.seed, DREAM_TRANSFER, c.step, cand.position).random();
                if u < p_transfer {
                    c.x[cand.position] = cand.token;
                    c.reveals.push([(cand.position - c.prompt_len) as u32, cand.token]);
                }
            }
            c.candidates.clear();
        } else {
            c.commit_best(count);
        }
    }
}

/// The blocked sampler's commits after a block's first step: the `count` best candidates, or
/// `count` drawn with `alg_temp`.
pub(super) fn commit_blocked(c: &mut Canvas, count: usize, span: std::ops::Range<usize>) {
    match c.p.alg_temp.filter(|&t| t != 0.0) {
        Some(t) => commit_drawn(c, count, t),
        None => c.commit_ranked(span, count, |_, _| true),
    }
}

/// `torch.linspace(1, eps, steps + 1)` in float32 as PyTorch's CPU kernel computes it: the
/// step `(eps - 1) / steps` in float32, then `1 + step * i` for the first half and `eps - step *
/// (n - 1 - i)` for the second, each rounded once (a fused multiply-add). Checked against
/// PyTorch 2.15 for every step count up to 600.
pub(crate) fn timesteps(steps: usize, eps: f64) -> Vec<f32> {
    let n = steps + 1;
    let (start, end) = (1f32, eps as f32);
    let step = (end - start) / (n - 1) as f32;
    (0..n)
        .map(|i| if i < n / 2 { (step as f64).mul_add(i as f64, start as f64) as f32 } else { (-(step as f64)).mul_add((n - 1 - i) as f64, end as f64) as f32 })
        .collect()
}

/// How many of `masked` positions step `i` of `steps` commits: `int(masked * (1 - s / t))` in
/// float32 before the last step, every one at it.
pub(crate) fn transfer_count(masked: usize, i: usize, steps: usize, ts: &[f32]) -> usize {
    if i + 1 >= steps {
        return masked;
    }
    let (t, s) = (ts[i], ts[i + 1]);
    (masked as f32 * (1.0 - s / t)) as usize
}

/// Published `top_k_logits`: every logit below the `k`-th largest becomes float32's lowest.
fn keep_top_k(row: &mut [f32], k: usize, sorted: &mut Vec<f32>) {
    let k = k.min(row.len());
    sorted.clear();
    sorted.extend_from_slice(row);
    let (_, kth, _) = sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    let kth = *kth;
    row.iter_mut().filter(|v| **v < kth).for_each(|v| *v = f32::MIN);
}

/// Published `top_p_logits`: sorted descending, the softmax's running sum; every token after
/// the first whose running sum passes `p` becomes float32's lowest.
fn keep_top_p(row: &mut [f32], p: f64, order: &mut Vec<usize>, sorted: &mut Vec<f32>) {
    order.clear();
    order.extend(0..row.len());
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
    sorted.clear();
    sorted.extend(order.iter().map(|&i| row[i]));
    softmax_in_place(sorted);
    let mut cumulative = 0f32;
    let mut remove_next = false;
    for (j, &i) in order.iter().enumerate() {
        cumulative += sorted[j];
        // The mask is shifted right by one: a token goes when the sum before it passed p.
        if remove_next {
            row[i] = f32::MIN;
        }
        remove_next = cumulative as f64 > p;
    }
}

/// `softmax(row)` in float32 into `row`, as PyTorch's vectorised CPU softmax computes it (see
/// `softmax_at`, whose arithmetic this is, for every entry).
fn softmax_in_place(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let mut lanes = [0f32; 16];
    for (i, v) in row.iter_mut().enumerate() {
        *v = (*v - max).exp();
        lanes[i % 16] += *v;
    }
    let b: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
    let inv = 1.0 / (((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7])));
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Dream's `sample_tokens` for one position: the token and its confidence under `alg`, from
/// its logits `row` (overwritten with the probabilities); a draw takes random stream `purpose`.
pub(crate) fn predict(row: &mut [f32], p: &SamplerParams, purpose: u64, step: usize, position: usize) -> (u32, f32) {
    if p.temperature > 0.0 {
        let t = p.temperature as f32;
        row.iter_mut().for_each(|v| *v /= t);
    }
    if p.top_p.is_some_and(|tp| tp < 1.0) || p.top_k.is_some() {
        // Rare settings: their working memory is allocated here, not sized ahead.
        let (mut order, mut sorted) = (Vec::new(), Vec::new());
        if let Some(tp) = p.top_p.filter(|&tp| tp < 1.0) {
            keep_top_p(row, tp, &mut order, &mut sorted);
        }
        if let Some(k) = p.top_k {
            keep_top_k(row, k, &mut sorted);
        }
    }
    softmax_in_place(row);
    let (mut confidence, token) = if p.temperature > 0.0 {
        // A categorical draw from the probabilities (the published code's is PyTorch's).
        let u: f64 = stream(p.seed, purpose, step, position).random();
        let total: f64 = row.iter().map(|&v| v as f64).sum();
        let mut acc = 0.0;
        let token = row.iter().position(|&v| {
            acc += v as f64;
            acc > u * total
        });
        let token = token.unwrap_or(row.len() - 1);
        (row[token], token)
    } else {
        // `probs.max(-1)`: the first largest.
        row.iter().enumerate().fold((f32::NEG_INFINITY, 0), |(b, bi), (i, &v)| if v > b { (v, i) } else { (b, bi) })
    };
    match p.alg {
        Alg::TopkMargin => {
            let (mut top1, mut top2) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for &v in row.iter() {
                if v > top1 {
                    (top1, top2) = (v, top1);
                } else if v > top2 {
                    top2 = v;
                }
            }
            confidence = top1 - top2;
        }
        Alg::Entropy => confidence = row.iter().map(|&v| v * (v + 1e-10).ln()).sum(),
        Alg::MaskgitPlus | Alg::Origin => {}
    }
    (token as u32, confidence)
}

impl PolicyStep for Dream {
    fn next<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        match self.phase {
            Phase::Begin if self.policy == Policy::Exact => Ok(self.exact_pass(c)),
            Phase::Begin => Ok(self.blocked_pass(c)),
            Phase::End => Ok(self.end(c)),
            Phase::Exact { .. } | Phase::BlockStart | Phase::Blocked { .. } => Err(out_of_turn()),
        }
    }

    fn logits(&mut self, c: &mut Canvas, logits: &[f32]) -> Result<()> {
        c.predictor.load(logits);
        match std::mem::replace(&mut self.phase, Phase::End) {
            Phase::Exact { count } => {
                let predictions = c.predictor.run_dream(&c.logit_rows, &c.p, DREAM_SAMPLE, c.step);
                c.candidates.extend(candidates(&c.logit_rows, predictions));
                self.exact_commits(c, count);
            }
            Phase::BlockStart => {
                let start = c.block_range().0;
                let (token, _) = c.predictor.run_dream(&c.logit_rows, &c.p, DREAM_SAMPLE, c.step)[0];
                c.x[start] = token;
                c.reveals.push([(start - c.prompt_len) as u32, token]);
            }
            Phase::Blocked { count, span } => {
                let predictions = c.predictor.run_dream(&c.logit_rows, &self.cached, DREAM_SAMPLE, c.step);
                c.candidates.extend(candidates(&c.logit_rows, predictions));
                match c.p.threshold {
                    // `confidence_threshold`: the most confident, and every other at or above it.
                    Some(t) => c.commit_ranked(span, count, |rank, confidence| rank == 0 || confidence >= t),
                    None => commit_blocked(c, count, span),
                }
            }
            Phase::Begin | Phase::End => return Err(out_of_turn()),
        }
        Ok(())
    }
}

/// Published `alg_temp`: `count` positions drawn without replacement, each with probability
/// proportional to `exp(confidence / alg_temp)` among the candidates left (PyTorch's
/// `multinomial` over the softmax; this runtime's random stream).
fn commit_drawn(c: &mut Canvas, count: usize, alg_temp: f64) {
    let max = c.candidates.iter().map(|k| k.confidence as f64 / alg_temp).fold(f64::NEG_INFINITY, f64::max);
    // A rare setting: its weights are allocated here, not sized ahead.
    let mut weights: Vec<f64> = c.candidates.iter().map(|k| (k.confidence as f64 / alg_temp - max).exp()).collect();
    let mut rng = stream(c.p.seed, DREAM_ALG_TEMP, c.step, 0);
    for _ in 0..count.min(weights.len()) {
        let total: f64 = weights.iter().sum();
        let u: f64 = rng.random::<f64>() * total;
        let mut acc = 0.0;
        let pick = weights.iter().position(|&w| {
            acc += w;
            w > 0.0 && acc > u
        });
        let Some(j) = pick.or_else(|| weights.iter().rposition(|&w| w > 0.0)) else { break };
        weights[j] = 0.0;
        let (position, token) = (c.candidates[j].position, c.candidates[j].token);
        c.x[position] = token;
        c.reveals.push([(position - c.prompt_len) as u32, token]);
    }
    c.candidates.clear();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timesteps_are_pytorchs_float32_linspace() {
        // torch.linspace(1, 1e-3, 9) in float32, and one where a plain `1 + step * i` in float32
        // rounds differently (steps 8 is the first such count).
        let ts = timesteps(8, 1e-3);
        assert_eq!(ts, [1.0, 0.875125, 0.75025, 0.625375, 0.5005, 0.375625, 0.25075, 0.125875, 0.001]);
        assert_eq!((ts[0], ts[8]), (1.0, 0.001));
    }

    #[test]
    fn the_schedule_commits_int_of_the_masked_fraction_and_everything_at_the_end() {
        let ts = timesteps(4, 1e-3);
        // 1 - s/t for t=1, s=0.75025: 0.24975 of 16 masks is 3.996 -> 3.
        assert_eq!(transfer_count(16, 0, 4, &ts), 3);
        assert_eq!(transfer_count(5, 3, 4, &ts), 5);
    }

    #[test]
    fn confidences_follow_the_rule() {
        let p = |alg| SamplerParams { alg, ..Default::default() };
        let logits = [0.0f32, 2.0, 1.0, -1.0];
        let (t, c) = predict(&mut logits.clone(), &p(Alg::MaskgitPlus), DREAM_SAMPLE, 0, 0);
        let probs: Vec<f32> = {
            let e: Vec<f32> = logits.iter().map(|&l| (l - 2.0).exp()).collect();
            let s: f32 = e.iter().sum();
            e.iter().map(|&x| x / s).collect()
        };
        assert_eq!(t, 1);
        assert!((c - probs[1]).abs() < 1e-6);
        let (_, m) = predict(&mut logits.clone(), &p(Alg::TopkMargin), DREAM_SAMPLE, 0, 0);
        assert!((m - (probs[1] - probs[2])).abs() < 1e-6);
        let (_, e) = predict(&mut logits.clone(), &p(Alg::Entropy), DREAM_SAMPLE, 0, 0);
        let want: f32 = probs.iter().map(|&q| q * (q + 1e-10).ln()).sum();
        assert!((e - want).abs() < 1e-6 && e < 0.0);
    }
}
