//! LLaDA 2.x's sampler: the published `generate` of `modeling_llada2_moe.py` (2.0), with 2.1's
//! greedy rule at temperature 0.
//!
//! The canvas is a grid of `block_length` blocks from position 0: the prompt, then masks up
//! to the end of the block holding position `prompt + gen_length - 1` (padding slots past
//! the generation included). Blocks are decoded in order from the one holding the prompt's
//! end (its prompt positions stay as they are). Each step is one model call: the block
//! attends to itself and every earlier position, never to later blocks (the block-causal
//! mask). Its masked positions get the prediction (2.1's rule at temperature 0: argmax, with
//! its softmax probability as the confidence; above it, the published filters and a draw
//! from our own random stream), and the step commits every masked position whose confidence
//! is above `threshold`, if there are at least `schedule[step]` of them, else the
//! `schedule[step]` most confident (`torch.topk` over the block); `schedule` spreads
//! `block_length` over `min(steps, gen_length)` steps. A block ends when it has no mask or
//! its steps are spent; the generation ends after the block whose generated part holds EOS,
//! or (`eos_early_stop`) at a step that commits EOS once every position before the first EOS
//! is committed. The result is the generation up to and including its first EOS.
//!
//! The passes: each step is a pass over the block's rows (a `PassRequest::Blocks`), the
//! earlier positions read from the KV cache. The cache holds each earlier block as the
//! published code's next call sees it: a block's keys and values are stored again with its
//! final tokens by the next block's first pass, whose rows of the finished block attend up to
//! its end (the mask's block-causal rows, two blocks in one pass), and the prompt's whole
//! blocks by the first pass; by a pass of their own only where no graph holds them with the
//! block (or the backend runs one block a pass). So passes = model calls.
//!
//! 2.0's own `generate` draws from the softmax with `torch.multinomial` even at temperature 0;
//! 2.1 made temperature 0 greedy, which is the rule here.
//!
//! With `editing_threshold`, 2.1's `generate` instead: no step schedule (a call commits every
//! masked position above `threshold`, or the most confident one); each call also edits the
//! block's committed tokens (not the prompt's): a position whose new prediction differs from
//! its token with a confidence above `editing_threshold` takes it (a revision). A block ends at
//! the first call that began with no mask and edited nothing, or when the calls that began
//! with no mask would pass `max_post_steps`. EOS ends the generation only with
//! `eos_early_stop`, after the block (the returned tokens are the same either way). Its
//! published code passes a 0/1 mask that its model adds to the scores, which masks nothing;
//! the block-causal mask is 2.0's, which this follows, as SGLang's and dInfer's prefix caches do.

use rand::RngExt;

use super::ask::{Ask, LogitCapacity, PassRequest};
use super::canvas::{out_of_turn, Canvas, PolicyStep};
use super::llada2_mbsd::Speculation;
use super::{argmax, committed_prefix, softmax_at, softmax_at_max, stream, Candidate, Generation};
use crate::error::{Error, Result};
use crate::params::{SamplerParams, MAX_STEPS};

/// The random stream of LLaDA 2.x's draws (temperature above 0).
const LLADA2_SAMPLE: u64 = 21;
/// The published `generate`'s default threshold.
pub const DEFAULT_THRESHOLD: f32 = 0.95;

pub(super) struct Llada2 {
    block_len: usize,
    prompt_len: usize,
    gen_len: usize,
    /// Blocks of the grid, the one decoded now, and its steps taken.
    blocks: usize,
    block: usize,
    step: usize,
    /// Commits each step's schedule asks for at least (`_get_num_transfer_tokens`).
    schedule: Vec<usize>,
    threshold: f32,
    /// Positions before this hold their final keys and values in the cache.
    stored: usize,
    eos: Option<u32>,
    /// 2.1's token editing, if on.
    editing: Option<Editing>,
    /// Editing: the block's calls that began with no mask (the published `post_steps`), and
    /// whether the last one began with none and edited nothing (which ends the block).
    post_steps: usize,
    idle: bool,
    /// `--policy mbsd` (`llada2_mbsd.rs`): its passes and drafts.
    spec: Option<Speculation>,
    /// This call's predictions of the next block's positions (mbsd's drafts).
    drafts: Vec<(usize, u32, f32)>,
    /// How many blocks one pass holds with their logits.
    capacity: LogitCapacity,
    phase: Phase,
}

/// Where a call is: the earlier blocks' keys and values stored, its pass asked for, or done.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    /// The stores are asked for; next the block pass from `from`, or mbsd's pass.
    BlocksPass { from: usize },
    SpeculativePass,
    /// Waiting for the pass's logits.
    Logits,
    End,
}

/// LLaDA 2.1's token editing settings.
#[derive(Debug, Clone, Copy)]
struct Editing {
    threshold: f32,
    max_post_steps: usize,
}

impl Llada2 {
    pub(super) fn new(capacity: LogitCapacity, p: &SamplerParams, prompt_len: usize, steps: usize, eos: Option<u32>) -> Llada2 {
        let b = p.block_length;
        let steps = steps.min(p.gen_length).max(1);
        let (base, extra) = (b / steps, b % steps);
        Llada2 {
            block_len: b,
            prompt_len,
            gen_len: p.gen_length,
            blocks: (prompt_len + p.gen_length).div_ceil(b),
            block: prompt_len / b,
            step: 0,
            schedule: (0..steps).map(|i| base + usize::from(i < extra)).collect(),
            threshold: p.threshold.unwrap_or(DEFAULT_THRESHOLD),
            stored: 0,
            eos,
            editing: p.editing_threshold.map(|threshold| Editing { threshold, max_post_steps: p.max_post_steps }),
            post_steps: 0,
            idle: false,
            spec: None,
            drafts: Vec::new(),
            capacity,
            phase: Phase::Begin,
        }
    }

    /// `--policy mbsd`: passes over the positions that need them, drafts of the next block
    /// with `spec_blocks` 1.
    pub(super) fn speculate(mut self, p: &SamplerParams) -> Llada2 {
        self.spec = Some(Speculation::new(self.grid_len(), p.spec_blocks > 0, p.spec_threshold));
        self.drafts.reserve(self.block_len);
        self
    }

    /// The rows whose logits one pass returns at most: the block's, and the next block's
    /// drafted with it.
    pub(super) fn logit_rows(&self) -> usize {
        if self.spec.is_some() { 2 * self.block_len } else { self.block_len }
    }

    /// The most revisions one model call can make: every position of the block (0 without
    /// editing).
    pub(super) fn revised_per_step(&self) -> usize {
        if self.editing.is_some() { self.block_len } else { 0 }
    }

    /// Positions of the block grid.
    pub(super) fn grid_len(&self) -> usize {
        self.blocks * self.block_len
    }

    /// Where the returned generation ends: after its first EOS, or at `gen_length`.
    fn output_end(&self, x: &[u32]) -> usize {
        let generated = &x[self.prompt_len..self.prompt_len + self.gen_len];
        self.prompt_len + self.eos.and_then(|eos| generated.iter().position(|&t| t == eos)).map_or(self.gen_len, |i| i + 1)
    }

    /// Whether the current block takes another model call. 2.0: while it has a mask and
    /// steps left. 2.1 (editing): while it has a mask; then unless the last call began with
    /// none and edited nothing, or the calls beginning with none would pass `max_post_steps`.
    fn block_goes_on(&mut self, block: &[u32], mask: u32) -> bool {
        let masked = block.contains(&mask);
        let Some(editing) = self.editing else { return masked && self.step < self.schedule.len() };
        if masked {
            return true;
        }
        if self.step > 0 && self.idle {
            return false;
        }
        self.post_steps += 1;
        self.post_steps <= editing.max_post_steps
    }

    /// 2.1's loop has no step bound while a block has masks: a call that changes nothing
    /// (every commit the mask token itself, no edit) is repeated as it is at temperature 0,
    /// where the published code would loop forever; this says so instead. A call commits at
    /// least one masked position, so a block takes as many calls as it has positions, plus its
    /// post steps, unless the model predicts the mask token (an edit may even re-mask a
    /// token): one still masked after eight times that many is taken to be stuck (its edits
    /// undoing each other, say) rather than run to [`MAX_STEPS`].
    fn check_progress(&self, c: &Canvas, first_new: usize, edits: usize) -> Result<()> {
        let mask = c.special.mask;
        let unmasked = c.reveals[first_new..].iter().any(|r| r[1] != mask);
        let masked = c.x[self.block * self.block_len..(self.block + 1) * self.block_len].contains(&mask);
        let bound = 8 * (self.block_len + self.editing.map_or(0, |e| e.max_post_steps) + 1);
        if masked && ((c.p.temperature == 0.0 && !unmasked && edits == 0) || self.step >= bound.min(MAX_STEPS)) {
            return Err(Error::request(format!(
                "LLaDA 2.1's generate cannot finish block {} (positions {}..{}): after {} model calls the model still predicts the mask token where the block is masked",
                self.block,
                self.block * self.block_len,
                (self.block + 1) * self.block_len,
                self.step
            )));
        }
        Ok(())
    }

    /// Moves past finished blocks; the generation is done after the last block, or after the
    /// block whose generated part holds EOS (2.1: only with `eos_early_stop`, once nothing
    /// generated is masked).
    fn advance(&mut self, c: &mut Canvas) {
        let mask = c.special.mask;
        loop {
            let (s, e) = (self.block * self.block_len, (self.block + 1) * self.block_len);
            if self.block_goes_on(&c.x[s..e], mask) {
                return;
            }
            let generated = &c.x[self.prompt_len..e];
            let eos_seen = self.eos.is_some_and(|eos| generated.contains(&eos));
            let stop = match self.editing {
                None => eos_seen,
                Some(_) => eos_seen && c.p.eos_early_stop && !generated.contains(&mask),
            };
            self.block += 1;
            self.step = 0;
            (self.post_steps, self.idle) = (0, false);
            if stop || self.block == self.blocks {
                c.done = true;
                c.output_end = Some(self.output_end(&c.x));
                return;
            }
        }
    }
}

impl Llada2 {
    /// The call's first ask: the stores its pass needs first, or its pass.
    fn begin<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        let (mask, b) = (c.special.mask, self.block_len);
        let (s, e) = (self.block * b, (self.block + 1) * b);
        if let Some(spec) = &mut self.spec {
            self.phase = Phase::SpeculativePass;
            if let Some(from) = spec.blocks_to_store(&self.capacity, c, (s, e)) {
                return Ok(Ask::StoreBlocks { seq: &c.x[..s], from, block_len: b });
            }
            return self.pass(c);
        }
        // The masked positions; editing also predicts the block's committed ones.
        let editing = self.editing.is_some();
        c.logit_rows.clear();
        c.logit_rows.extend((s.max(self.prompt_len)..e).filter(|&i| editing || c.x[i] == mask).map(|i| i as u32));
        // The earlier blocks' final keys and values (the prompt's whole blocks before the
        // first step, the block just finished before the next): in this step's pass, whose
        // rows of each block attend up to its end, as many of them as a graph holds with the
        // block where the backend runs such passes; the others by a pass each.
        let fits = |rows: usize| self.capacity.fits(rows, c.logit_rows.len());
        let mut from = s;
        while from > self.stored && fits(e - (from - b)) {
            from -= b;
        }
        let stored = std::mem::replace(&mut self.stored, s);
        self.phase = Phase::BlocksPass { from };
        if from > stored {
            return Ok(Ask::StoreBlocks { seq: &c.x[..from], from: stored, block_len: b });
        }
        self.pass(c)
    }

    /// The call's pass.
    fn pass<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        let b = self.block_len;
        let (s, e) = (self.block * b, (self.block + 1) * b);
        let pass = match (self.phase, &mut self.spec) {
            (Phase::SpeculativePass, Some(spec)) => spec.pass(&self.capacity, c, (s, e), self.blocks * b),
            (Phase::BlocksPass { from }, _) => PassRequest::Blocks { seq: &c.x[..e], from, block_len: b, logit_positions: &c.logit_rows },
            _ => return Err(out_of_turn()),
        };
        self.phase = Phase::Logits;
        Ok(Ask::Pass(pass))
    }
}

impl PolicyStep for Llada2 {
    fn next<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        match self.phase {
            Phase::Begin => self.begin(c),
            Phase::BlocksPass { .. } | Phase::SpeculativePass => self.pass(c),
            Phase::End => {
                self.phase = Phase::Begin;
                Ok(Ask::Done)
            }
            Phase::Logits => Err(out_of_turn()),
        }
    }

    fn logits(&mut self, c: &mut Canvas, logits: &[f32]) -> Result<()> {
        if self.phase != Phase::Logits {
            return Err(out_of_turn());
        }
        self.phase = Phase::End;
        let (mask, b) = (c.special.mask, self.block_len);
        let (s, e) = (self.block * b, (self.block + 1) * b);
        let editing = self.editing;
        c.predictor.load(logits);
        let (p, step) = (c.p, c.step);
        let predictions = c.predictor.each_row(&c.logit_rows, |row, pos| predict(row, &p, step, pos));
        c.candidates.clear();
        self.drafts.clear();
        let mut edits = 0;
        for (&pos, &(token, confidence)) in c.logit_rows.iter().zip(predictions) {
            let pos = pos as usize;
            if pos >= e {
                self.drafts.push((pos, token, confidence));
            } else if c.x[pos] == mask {
                c.candidates.push(Candidate { position: pos, token, confidence });
            } else if editing.is_some_and(|ed| confidence > ed.threshold) && token != c.x[pos] {
                // 2.1's edit: from this call's prediction, as the commits below are.
                c.x[pos] = token;
                c.revisions.push([(pos - self.prompt_len) as u32, token]);
                edits += 1;
            }
        }
        self.idle = c.candidates.is_empty() && edits == 0;
        // 2.1 commits at least one a call, 2.0 its schedule's count.
        let wanted = if editing.is_some() { 1 } else { self.schedule[self.step] };
        let t = self.threshold;
        let confident = c.candidates.iter().filter(|x| x.confidence > t).count();
        let first_new = c.reveals.len();
        // Every confident one (exactly the `confident` best of the block), or the schedule's.
        let k = if confident >= wanted { confident } else { wanted.min(c.candidates.len()) };
        c.commit_ranked(s..e, k, |_, _| true);
        if let Some(spec) = &mut self.spec {
            let committed = c.reveals.len() - first_new;
            spec.after_commits(c, (s, e), committed, &self.drafts);
        }
        self.step += 1;
        if editing.is_some() {
            self.check_progress(c, first_new, edits)?;
        }
        let committed_eos = self.eos.filter(|&eos| c.reveals[first_new..].iter().any(|r| r[1] == eos));
        if let (true, None, Some(eos)) = (c.p.eos_early_stop, editing, committed_eos) {
            // 2.0's check: the first EOS of the sequence (prompt included), every generated
            // position before it committed.
            if let Some(at) = c.x[..e].iter().position(|&t| t == eos) {
                if !c.x[self.prompt_len.min(at)..at].contains(&mask) {
                    c.done = true;
                    c.output_end = Some(at + 1);
                }
            }
        }
        if !c.done {
            self.advance(c);
        }
        // Editing may still change the current block's tokens; finished blocks are final. The
        // grid's padding slots past the generation (and anything after its EOS) are never
        // part of it.
        let open = if editing.is_none() || c.done { c.x.len() } else { (self.block * b).max(c.prompt_len) };
        // (An EOS in the prompt may put `output_end` inside it.)
        let open = open.min(c.output_end.unwrap_or(self.prompt_len + self.gen_len)).max(c.prompt_len);
        c.settled = committed_prefix(&c.x[c.prompt_len..open], mask);
        Ok(())
    }

    fn report(&mut self, g: &mut Generation) {
        g.mbsd = self.spec.as_ref().map(|s| s.report);
        if self.editing.is_some() {
            // Filled with every call's edits by the generator.
            g.revisions = Some(Vec::new());
        }
    }
}

/// The prediction at one masked position and its confidence (the published
/// `_sample_with_temperature_topk_topp`, 2.1's): at temperature 0 the first maximum and its
/// float32 softmax probability; above it, the logits divided by the temperature, filtered to
/// the top `top_k` and the nucleus `top_p`, then a draw from their softmax (our stream, not
/// PyTorch's) and its probability.
fn predict(row: &mut [f32], p: &SamplerParams, step: usize, position: usize) -> (u32, f32) {
    if p.temperature == 0.0 {
        let token = crate::kernels::argmax(crate::kernels::cpu::features(), row);
        let confidence = if row[token].is_nan() { softmax_at(row, token) } else { softmax_at_max(row, token, row[token]) };
        return (token as u32, confidence);
    }
    if p.temperature != 1.0 {
        let t = p.temperature as f32;
        row.iter_mut().for_each(|l| *l /= t);
    }
    if let Some(k) = p.top_k.filter(|&k| k > 0 && k < row.len()) {
        // `logits < kth largest` become -inf (ties with the kth stay).
        let mut sorted: Vec<f32> = row.to_vec();
        sorted.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        let kth = sorted[k - 1];
        row.iter_mut().filter(|l| **l < kth).for_each(|l| *l = f32::NEG_INFINITY);
    }
    if let Some(top_p) = p.top_p.filter(|&v| v < 1.0) {
        // Sorted descending, the tokens after the cumulative probability first passes top_p.
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        let sum: f64 = row.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let mut cumulative = 0.0;
        let mut cut = false;
        for &i in &order {
            if cut {
                row[i] = f32::NEG_INFINITY;
                continue;
            }
            cumulative += ((row[i] - max) as f64).exp() / sum;
            cut = cumulative > top_p;
        }
    }
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let weights: Vec<f64> = row.iter().map(|&l| ((l - max) as f64).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut rng = stream(p.seed, LLADA2_SAMPLE, step, position);
    let mut u: f64 = rng.random::<f64>() * total;
    let mut token = argmax(weights.iter().copied());
    for (i, w) in weights.iter().enumerate() {
        if u < *w {
            token = i;
            break;
        }
        u -= w;
    }
    (token as u32, softmax_at(row, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_spreads_the_block_over_the_steps() {
        let p = SamplerParams { block_length: 8, gen_length: 20, steps: 3, ..Default::default() };
        let l = Llada2::new(LogitCapacity::default(), &p, 5, 3, None);
        assert_eq!(l.schedule, vec![3, 3, 2]);
        // The grid: 5 + 20 positions in blocks of 8 -> 4 blocks; the prompt's end is in block 0.
        assert_eq!((l.grid_len(), l.block), (32, 0));
        // More steps than the generation has tokens are cut to it.
        let l = Llada2::new(LogitCapacity::default(), &SamplerParams { block_length: 8, gen_length: 4, steps: 32, ..Default::default() }, 8, 32, None);
        assert_eq!(l.schedule, vec![2, 2, 2, 2]);
        assert_eq!((l.grid_len(), l.block), (16, 1));
    }

    #[test]
    fn an_editing_block_ends_after_an_idle_call_or_its_post_steps() {
        let (mask, p) = (9, SamplerParams { block_length: 4, gen_length: 4, editing_threshold: Some(0.9), max_post_steps: 2, ..Default::default() });
        let mut l = Llada2::new(LogitCapacity::default(), &p, 0, 32, None);
        // Masks left: always another call, whatever the last did.
        l.step = 3;
        l.idle = true;
        assert!(l.block_goes_on(&[1, mask, 2, 3], mask));
        // No mask: calls go on while each edits, up to max_post_steps of them...
        l.idle = false;
        assert!(l.block_goes_on(&[1, 4, 2, 3], mask));
        assert!(l.block_goes_on(&[1, 4, 2, 3], mask));
        assert!(!l.block_goes_on(&[1, 4, 2, 3], mask));
        // ...and end at the first that began with no mask and edited nothing.
        (l.post_steps, l.idle) = (1, true);
        assert!(!l.block_goes_on(&[1, 4, 2, 3], mask));
        // Without editing: while masked and steps are left.
        let mut l = Llada2::new(LogitCapacity::default(), &SamplerParams { editing_threshold: None, ..p }, 0, 2, None);
        assert!(l.block_goes_on(&[1, mask, 2, 3], mask));
        l.step = 2;
        assert!(!l.block_goes_on(&[1, mask, 2, 3], mask));
    }

    #[test]
    fn greedy_predictions_are_the_argmax_and_its_probability() {
        let p = SamplerParams::default();
        let mut row = vec![0.0f32, 3.0, 1.0, 3.0];
        let (t, c) = predict(&mut row, &p, 0, 0);
        assert_eq!(t, 1);
        assert!((c - softmax_at(&[0.0, 3.0, 1.0, 3.0], 1)).abs() < 1e-7);
    }

    #[test]
    fn top_k_sampling_draws_only_among_the_kept() {
        let p = SamplerParams { temperature: 1.0, top_k: Some(2), seed: 3, ..Default::default() };
        for pos in 0..200 {
            let (t, _) = predict(&mut vec![0.0, 2.0, 1.9, -1.0], &p, 0, pos);
            assert!(t == 1 || t == 2, "{t}");
        }
    }
}
