//! The official LLaDA sampler (`generate()` of the LLaDA repository), reproduced exactly:
//! semi-autoregressive blocks, a fixed number of commits per step, low-confidence or random
//! remasking, Gumbel-max sampling in float64, classifier-free guidance, and the two EOS/EoT
//! options of the official code.
//!
//! Ties: when several eligible positions have exactly the same confidence across the top-k
//! boundary, the official choice is the one PyTorch's CPU `topk` makes, which follows from
//! libstdc++'s selection algorithms; `topk.rs` reproduces them, so reveals match the official
//! ones at every step, ties included.
//!
//! Policies choose which rows each pass recomputes; the commit rule stays the official one:
//! - `exact`: every pass over the whole sequence (the official sampler);
//! - `prefix` (Fast-dLLM's prefix cache): a whole-sequence pass at the start of each block
//!   (and every `refresh_every` steps), then passes over the block and everything after it,
//!   attending to the cached keys and values of the prefix;
//! - `dual`: the same refreshes, then passes over the block only (prefix and suffix cached);
//! - `spec` (multi-block speculative decoding): `prefix` passes, whose rows already cover the
//!   next blocks; their predictions there are kept as drafts, one per position (the latest).
//!   Once a drafted position's block is current, a pass whose prediction for it equals the
//!   draft with confidence at least `spec_threshold` commits it, besides the step's scheduled
//!   commits. A block ends when nothing in it is masked, so confirmed drafts save passes. A
//!   draft is never committed while its block is speculative (the prefix it was predicted
//!   under was unfinished), and a disagreeing draft is dropped (re-masked in effect);
//! - `mbsd` (multi-block speculative decoding on the plan's row buckets, `mbsd.rs`), with
//!   dual-path progressive revision on a CPU side path (`revision.rs`);
//! - `threshold` (with any policy): each step commits every masked position of the block
//!   whose confidence reaches it, at least the best one, instead of the fixed schedule; a
//!   block then ends when it is full.

mod generator;
mod mbsd;
mod official;
mod revision;

use std::ops::ControlFlow;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

pub use generator::Generator;
pub use mbsd::MbsdReport;

use crate::error::{Error, Result};
use crate::session::Session;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remasking {
    /// Commit the positions whose prediction has the highest probability.
    LowConfidence,
    /// Commit positions in a random order.
    Random,
}

impl Remasking {
    pub fn parse(s: &str) -> Option<Remasking> {
        match s {
            "low_confidence" => Some(Remasking::LowConfidence),
            "random" => Some(Remasking::Random),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Remasking::LowConfidence => "low_confidence",
            Remasking::Random => "random",
        }
    }
}

/// Which rows each forward pass recomputes (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Exact,
    Prefix,
    Dual,
    Spec,
    Mbsd,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "exact" => Some(Policy::Exact),
            "prefix" => Some(Policy::Prefix),
            "dual" => Some(Policy::Dual),
            "spec" => Some(Policy::Spec),
            "mbsd" => Some(Policy::Mbsd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Exact => "exact",
            Policy::Prefix => "prefix",
            Policy::Dual => "dual",
            Policy::Spec => "spec",
            Policy::Mbsd => "mbsd",
        }
    }
}

/// `mbsd`: whether committed tokens stay revisable and are re-checked on the CPU side path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Revision {
    DualPath,
    Off,
}

impl Revision {
    pub fn parse(s: &str) -> Option<Revision> {
        match s {
            "dual-path" => Some(Revision::DualPath),
            "off" => Some(Revision::Off),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Revision::DualPath => "dual-path",
            Revision::Off => "off",
        }
    }
}

/// Sampler settings, with the official code's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplerParams {
    /// Tokens to generate.
    pub gen_length: usize,
    /// Semi-autoregressive block size; `gen_length` must be a multiple of it.
    pub block_length: usize,
    /// Denoising steps over all blocks; a multiple of the number of blocks.
    pub steps: usize,
    /// 0 = take the most likely token; above 0, Gumbel-max sampling at this temperature.
    pub temperature: f64,
    /// Classifier-free guidance scale; 0 skips the unconditional pass.
    pub cfg_scale: f64,
    /// Which masked positions to commit first.
    pub remasking: Remasking,
    /// Seed of the noise (temperature > 0 and random remasking): same seed, same output.
    pub seed: u64,
    /// Official `logits_eos_inf`: EOS is never predicted.
    pub logits_eos_inf: bool,
    /// Official `confidence_eos_eot_inf`: predictions of EoT (and of EOS at temperature 0,
    /// where the official code's noisy and clean logits are one tensor) get zero confidence.
    pub confidence_eos_eot_inf: bool,
    /// Which rows each pass recomputes.
    pub policy: Policy,
    /// Cached policies: a whole-sequence pass every this many steps of a block (0: only at
    /// the start of each block; 1: every step, which is `exact`).
    pub refresh_every: usize,
    /// Commit every masked position of the block at or above this confidence (at least one)
    /// instead of the fixed schedule.
    pub threshold: Option<f32>,
    /// `spec`: how many blocks after the current one are drafted.
    pub spec_blocks: usize,
    /// `spec` and `mbsd`: confidence a draft's confirmation needs.
    pub spec_threshold: f32,
    /// `mbsd`: fewest rows a dense pass computes (None: the plan's smallest latency bucket);
    /// the whole block makes every pass recompute the block, as `dual` does.
    pub rows: Option<usize>,
    /// `mbsd`: the CPU side path, on (`DualPath`) or off.
    pub revision: Revision,
    /// `mbsd` revision: rows of one side-path pass, two per checked token (None: the plan's
    /// smallest latency bucket).
    pub side_rows: Option<usize>,
    /// A check that agrees with this confidence or more makes a token stable.
    pub stable_confidence: f32,
    /// So many agreeing checks make a token stable whatever their confidence.
    pub stable_checks: u32,
    /// A check that disagrees with this confidence or more revises the token.
    pub revise_confidence: f32,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            gen_length: 128,
            block_length: 32,
            steps: 128,
            temperature: 0.0,
            cfg_scale: 0.0,
            remasking: Remasking::LowConfidence,
            seed: 0,
            logits_eos_inf: false,
            confidence_eos_eot_inf: false,
            policy: Policy::Exact,
            refresh_every: 0,
            threshold: None,
            spec_blocks: 1,
            spec_threshold: 0.99,
            rows: None,
            revision: Revision::DualPath,
            side_rows: None,
            stable_confidence: 0.9,
            stable_checks: 2,
            revise_confidence: 0.5,
        }
    }
}

/// Most denoising steps a generation may ask for.
pub const MAX_STEPS: usize = 1 << 16;

/// What an artifact's plan can serve, the bounds of the sizes a request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest sequence (prompt + generation) the graphs and the KV cache hold.
    pub max_len: usize,
    /// Rows of the largest graph: the most one pass computes.
    pub max_rows: usize,
}

impl Limits {
    pub fn of(model: &crate::Model) -> Limits {
        let h = &model.header;
        Limits { max_len: model.max_exact_len() as usize, max_rows: h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize }
    }
}

impl SamplerParams {
    /// Checks every setting against its range and the plan's `limits`, before anything is
    /// allocated for it; returns the steps per block. The one place the CLI and the C API
    /// share: errors are [`Error::Setting`], naming the setting and its range.
    pub fn validate(&self, limits: &Limits) -> Result<usize> {
        use crate::error::Setting as S;
        let bad = |s: S, m: String| Err(Error::setting(s, m));
        // At least one prompt token beside the generation.
        let max_gen = limits.max_len.saturating_sub(1).max(1);
        if !(1..=max_gen).contains(&self.gen_length) {
            return bad(S::GenLength, format!("{} is outside 1..={max_gen} (the artifact holds {} positions, one at least for the prompt)", self.gen_length, limits.max_len));
        }
        if !(1..=self.gen_length).contains(&self.block_length) || self.gen_length % self.block_length != 0 {
            return bad(S::BlockLength, format!("{} must divide the gen length {}", self.block_length, self.gen_length));
        }
        let blocks = self.gen_length / self.block_length;
        // Steps beyond one per generated token commit nothing, but the official sampler runs
        // them (each a pass and an entry of `reveals`): allowed, up to a bound.
        if !(1..=MAX_STEPS).contains(&self.steps) || self.steps % blocks != 0 {
            return bad(S::Steps, format!("{} must be a multiple of the {blocks} blocks in 1..={MAX_STEPS}", self.steps));
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(S::Temperature, format!("{} must be a finite number >= 0", self.temperature));
        }
        if !(self.cfg_scale >= 0.0 && self.cfg_scale.is_finite()) {
            return bad(S::CfgScale, format!("{} must be a finite number >= 0", self.cfg_scale));
        }
        if self.cfg_scale > 0.0 && self.policy != Policy::Exact {
            // The unconditional pass would overwrite the conditional sequence's cache.
            return bad(S::CfgScale, format!("{} needs the exact policy (the {} policy caches one sequence)", self.cfg_scale, self.policy.name()));
        }
        let steps_per_block = self.steps / blocks;
        // A block takes its scheduled steps, or up to one per token under a threshold.
        let block_steps = steps_per_block.max(self.block_length);
        if self.refresh_every > block_steps {
            return bad(S::RefreshEvery, format!("{} is outside 0..={block_steps} (the most steps a block takes)", self.refresh_every));
        }
        if let Some(t) = self.threshold {
            if !(0.0..=1.0).contains(&t) {
                return bad(S::Threshold, format!("{t} must be between 0 and 1"));
            }
        }
        // Blocks drafted ahead: `blocks - 1` follow the first; one more is allowed (a one-block
        // generation with the `spec` default of 1), which drafts nothing further.
        if self.spec_blocks > blocks {
            return bad(S::SpecBlocks, format!("{} is outside 0..={blocks} (the generation has {blocks} blocks)", self.spec_blocks));
        }
        if !(0.0..=1.0).contains(&self.spec_threshold) {
            return bad(S::SpecThreshold, format!("{} must be between 0 and 1", self.spec_threshold));
        }
        if let Some(r) = self.rows.filter(|r| !(1..=limits.max_rows).contains(r)) {
            return bad(S::Rows, format!("{r} is outside 1..={} (the artifact's largest graph)", limits.max_rows));
        }
        // Two rows per checked token, in one graph.
        if let Some(r) = self.side_rows.filter(|r| !(2..=limits.max_rows).contains(r)) {
            return bad(S::SideRows, format!("{r} is outside 2..={} (two rows per checked token, in the artifact's largest graph)", limits.max_rows));
        }
        for (s, v) in [(S::StableConfidence, self.stable_confidence), (S::ReviseConfidence, self.revise_confidence)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(s, format!("{v} must be between 0 and 1"));
            }
        }
        if self.stable_checks == 0 {
            return bad(S::StableChecks, "0 must be at least 1".into());
        }
        Ok(steps_per_block)
    }

    /// `spec_blocks` when none is given: `spec` drafts one block ahead, `mbsd` as deep as
    /// the artifact was compiled for; never more blocks than follow the first.
    pub fn default_spec_blocks(policy: Policy, compiled: usize, gen_length: usize, block_length: usize) -> usize {
        let wanted = if policy == Policy::Mbsd { compiled } else { 1 };
        let after_first = gen_length.checked_div(block_length).unwrap_or(1).saturating_sub(1);
        wanted.min(after_first)
    }
}

/// How many tokens each step of a block commits, into `schedule`: `masked / steps` each, one
/// more for the first `masked % steps` steps (official `get_num_transfer_tokens`).
pub fn commits_per_step(masked: usize, steps: usize, schedule: &mut Vec<usize>) {
    let (base, extra) = (masked / steps, masked % steps);
    schedule.clear();
    schedule.extend((0..steps).map(|i| base + usize::from(i < extra)));
}

/// `softmax(logits)[index]` in float32, as PyTorch's vectorised CPU softmax computes it:
/// max, then `exp(x - max)` summed in 16 lanes and reduced pairwise, then `exp(x_i - max) * (1 /
/// sum)`. Matching its rounding matters: many confidences round to exactly 1.0 and tie.
pub fn softmax_at(logits: &[f32], index: usize) -> f32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let mut lanes = [0f32; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += (v - max).exp();
        }
    }
    for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += (v - max).exp();
    }
    let b: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
    let sum = ((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7]));
    (logits[index] - max).exp() * (1.0 / sum)
}

/// Index of the first maximum.
fn argmax<T: PartialOrd + Copy>(xs: impl Iterator<Item = T>) -> usize {
    let mut best: Option<(usize, T)> = None;
    for (i, x) in xs.enumerate() {
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// A random stream per (purpose, step, position), so the noise a position sees does not depend
/// on which other positions a policy computes.
fn stream(seed: u64, purpose: u64, step: usize, position: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    rng.set_stream(((step as u64) << 32) | position as u64);
    rng
}

const GUMBEL: u64 = 1;
const RANDOM_REMASK: u64 = 2;
/// Noise of the revision checks (their random-remasking stream is `REVISE + 1`).
const REVISE: u64 = 3;

/// What the sampler did, for scripts and comparisons.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    /// The generated part only.
    pub output_ids: Vec<u32>,
    /// For each step, the `[position in generation, token]` pairs committed, in commit order.
    pub reveals: Vec<Vec<[u32; 2]>>,
    /// Policies whose commits can be revised (`mbsd` with dual-path revision): for each step,
    /// the `[position in generation, new token]` pairs revised after that step's reveals.
    /// Replaying every step's reveals, then its revisions, onto the masked generation gives
    /// `output_ids`. Absent for the other policies, whose commits are final.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revisions: Option<Vec<Vec<[u32; 2]>>>,
    pub forward_passes: u64,
    pub rows_computed: u64,
    /// Tokens committed by confirming a draft (`spec`).
    pub drafts_confirmed: u64,
    pub seconds: f64,
    /// `mbsd`: what the dense and side paths did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mbsd: Option<MbsdReport>,
}

/// The state after a step, for live display.
pub struct StepView<'a> {
    pub step: usize,
    pub steps: usize,
    /// The whole sequence: prompt then generation, masks where nothing is committed yet.
    pub canvas: &'a [u32],
    pub prompt_len: usize,
    /// This step's commits, `[position in generation, token]`.
    pub committed: &'a [[u32; 2]],
    /// This step's revisions of earlier commits, `[position in generation, new token]`
    /// (after `committed`; only `mbsd` with revision makes any).
    pub revised: &'a [[u32; 2]],
    /// Leading generated positions that can no longer change: committed (and, under
    /// revision, stable) with none before them still open. What a stream may print.
    pub settled: usize,
}

impl StepView<'_> {
    /// The generated part of the canvas.
    pub fn generated(&self) -> &[u32] {
        &self.canvas[self.prompt_len..]
    }
}

/// Leading positions of `generated` that are not `mask`: where commits are final, what
/// can no longer change.
pub(crate) fn committed_prefix(generated: &[u32], mask: u32) -> usize {
    generated.iter().position(|&t| t == mask).unwrap_or(generated.len())
}

/// A candidate for commitment at one step.
pub(crate) struct Candidate {
    pub(crate) position: usize,
    pub(crate) token: u32,
    pub(crate) confidence: f32,
}

/// Runs the sampler on `prompt` with `p.policy`. `on_step` sees the canvas after every step.
pub fn generate(session: &mut Session, prompt: &[u32], p: &SamplerParams, on_step: &mut dyn FnMut(&StepView)) -> Result<Generation> {
    generate_until(session, prompt, p, &mut |v| {
        on_step(v);
        ControlFlow::Continue(())
    })
}

/// [`generate`], stopped by `on_step` returning `Break` after a step: the result is then
/// [`Error::Cancelled`] and the session stays usable (the next generation starts afresh).
pub fn generate_until(session: &mut Session, prompt: &[u32], p: &SamplerParams, on_step: &mut dyn FnMut(&StepView) -> ControlFlow<()>) -> Result<Generation> {
    let mut generator = Generator::start(session, prompt, p)?;
    while let Some(view) = generator.step()? {
        if on_step(&view).is_break() {
            return Err(Error::Cancelled);
        }
    }
    Ok(generator.finish())
}

/// A prompt is at least one token and holds no mask token: masks mark the positions the
/// sampler fills, and the official code would fill a masked prompt position too (its
/// confidence is not `-inf`), which is infilling, not prompting. Other special tokens are
/// ordinary prompt tokens.
pub(super) fn check_prompt(prompt: &[u32], mask: u32) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::request("the prompt is empty: give at least one token".to_string()));
    }
    if let Some(i) = prompt.iter().position(|&t| t == mask) {
        return Err(Error::request(format!(
            "prompt token {i} is the mask token (id {mask}); a prompt cannot contain masks (they mark the positions to generate)"
        )));
    }
    Ok(())
}

/// Predictions of a pass's logit rows, computed on the session's thread pool into buffers
/// allocated once per generation (a row is modified in place, as the official code modifies
/// its logits, so each is copied first).
pub(crate) struct Predictor {
    rows: Vec<f32>,
    out: Vec<(u32, f32)>,
    vocab: usize,
}

impl Predictor {
    /// Buffers for passes of up to `rows` logit rows, at most what one of `session`'s graphs
    /// returns (a pass asking for more is refused before it runs).
    pub(crate) fn for_session(session: &Session, rows: usize) -> Predictor {
        let h = &session.model.header;
        let most = h.graphs.iter().map(|g| g.head_rows as usize).max().unwrap_or(0);
        let rows = rows.min(most);
        Predictor { rows: vec![0.0; h.model.embedding_size as usize * rows], out: Vec::with_capacity(rows), vocab: h.model.embedding_size as usize }
    }

    /// Copies `logits` (`rows x vocab`) in, to be predicted by [`run`](Self::run).
    pub(crate) fn load(&mut self, logits: &[f32]) -> &mut [f32] {
        let n = logits.len();
        if self.rows.len() < n {
            self.rows.resize(n, 0.0);
        }
        self.rows[..n].copy_from_slice(logits);
        &mut self.rows[..n]
    }

    /// The first `n` floats of the buffer, to be filled in place (guidance).
    pub(crate) fn load_mut(&mut self, n: usize) -> &mut [f32] {
        &mut self.rows[..n]
    }

    /// Predicts the loaded rows, row `i` at `positions[i]`, noise of step `step`.
    pub(crate) fn run(&mut self, pool: &rayon::ThreadPool, positions: &[u32], p: &SamplerParams, special: &llada_ir::SpecialTokens, purpose: u64, step: usize) -> &[(u32, f32)] {
        let vocab = self.vocab;
        let rows = &mut self.rows[..positions.len() * vocab];
        self.out.clear();
        self.out.resize(positions.len(), (0, 0.0));
        let out = &mut self.out;
        pool.install(|| {
            rows.par_chunks_mut(vocab).zip(positions.par_iter()).zip(out.par_iter_mut()).for_each(|((row, &pos), o)| {
                *o = predict_with(row, p, special, purpose, step, pos as usize);
            })
        });
        &self.out
    }
}

/// One pass's predictions at `head`: a position after `block_end` gets it as its draft (the
/// latest wins); a current position with a draft accepts it, committing it now, when the
/// prediction equals it with confidence at least `spec_threshold`, and drops it otherwise;
/// every current position not committed becomes a candidate. Returns the drafts accepted and
/// dropped.
#[allow(clippy::too_many_arguments)]
pub(crate) fn settle_predictions(
    head: &[u32],
    predictions: &[(u32, f32)],
    block_end: usize,
    drafts: &mut [Option<u32>],
    p: &SamplerParams,
    x: &mut [u32],
    prompt_len: usize,
    committed: &mut Vec<[u32; 2]>,
    candidates: &mut Vec<Candidate>,
) -> (u64, u64) {
    let (mut accepted, mut dropped) = (0, 0);
    for (&pos, &(token, confidence)) in head.iter().zip(predictions) {
        let pos = pos as usize;
        if pos >= block_end {
            drafts[pos] = Some(token);
            continue;
        }
        match drafts[pos].take() {
            Some(d) if d == token && confidence >= p.spec_threshold => {
                x[pos] = token;
                committed.push([(pos - prompt_len) as u32, token]);
                accepted += 1;
                continue;
            }
            Some(_) => dropped += 1,
            None => {}
        }
        candidates.push(Candidate { position: pos, token, confidence });
    }
    (accepted, dropped)
}

/// The prediction `x0` and its confidence for one position, from its logits `row`
/// (modified in place as the official code modifies its logits).
#[cfg(test)]
fn predict(row: &mut [f32], p: &SamplerParams, special: &llada_ir::SpecialTokens, step: usize, position: usize) -> (u32, f32) {
    predict_with(row, p, special, GUMBEL, step, position)
}

/// [`predict`] with the Gumbel noise of stream `purpose` (the revision checks draw their
/// own noise, so they never replay a commit's).
fn predict_with(row: &mut [f32], p: &SamplerParams, special: &llada_ir::SpecialTokens, purpose: u64, step: usize, position: usize) -> (u32, f32) {
    if p.logits_eos_inf {
        if let Some(eos) = special.eos {
            row[eos as usize] = f32::NEG_INFINITY;
        }
    }
    let token = if p.temperature > 0.0 {
        // Official add_gumbel_noise: exp(logits) / (-ln u)^temperature in float64.
        let mut rng = stream(p.seed, purpose, step, position);
        argmax(row.iter().map(|&l| {
            let u: f64 = rng.random();
            (l as f64).exp() / (-u.ln()).powf(p.temperature)
        }))
    } else {
        argmax(row.iter().copied())
    };
    if p.confidence_eos_eot_inf {
        if let Some(eot) = special.eot {
            row[eot as usize] = f32::NEG_INFINITY;
        }
        if p.temperature == 0.0 {
            if let Some(eos) = special.eos {
                row[eos as usize] = f32::NEG_INFINITY;
            }
        }
    }
    let confidence = match p.remasking {
        Remasking::LowConfidence => softmax_at(row, token),
        Remasking::Random => stream(p.seed, RANDOM_REMASK + purpose - GUMBEL, step, position).random::<f32>(),
    };
    (token as u32, confidence)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_spreads_the_remainder_over_the_first_steps() {
        let schedule = |masked, steps| {
            let mut s = Vec::new();
            commits_per_step(masked, steps, &mut s);
            s
        };
        assert_eq!(schedule(32, 32), vec![1; 32]);
        assert_eq!(schedule(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(schedule(3, 5), vec![1, 1, 1, 0, 0]);
        assert_eq!(schedule(8, 8).iter().sum::<usize>(), 8);
    }

    #[test]
    fn validation_names_the_options() {
        let limits = Limits { max_len: 256, max_rows: 256 };
        let p = SamplerParams { gen_length: 30, block_length: 8, ..Default::default() };
        assert!(p.validate(&limits).unwrap_err().to_string().contains("--block-len 8 must divide the gen length 30"));
        let p = SamplerParams { gen_length: 32, block_length: 8, steps: 6, ..Default::default() };
        assert!(p.validate(&limits).unwrap_err().to_string().contains("--steps 6"));
    }

    #[test]
    fn every_size_is_bounded_before_anything_is_allocated() {
        let limits = Limits { max_len: 160, max_rows: 64 };
        let base = SamplerParams { gen_length: 128, block_length: 32, steps: 128, policy: Policy::Mbsd, ..Default::default() };
        base.validate(&limits).unwrap();
        let cases: Vec<(SamplerParams, &str)> = vec![
            (SamplerParams { gen_length: 0, ..base.clone() }, "--gen-len 0 is outside 1..=159"),
            (SamplerParams { gen_length: 160, block_length: 32, ..base.clone() }, "--gen-len 160 is outside 1..=159"),
            (SamplerParams { gen_length: u32::MAX as usize, ..base.clone() }, "--gen-len 4294967295"),
            (SamplerParams { steps: 0, ..base.clone() }, "--steps 0"),
            (SamplerParams { steps: MAX_STEPS + 4, ..base.clone() }, "--steps 65540"),
            (SamplerParams { steps: u32::MAX as usize, ..base.clone() }, "--steps 4294967295"),
            (SamplerParams { spec_blocks: 5, ..base.clone() }, "--spec-blocks 5 is outside 0..=4"),
            (SamplerParams { spec_blocks: u32::MAX as usize, ..base.clone() }, "--spec-blocks 4294967295"),
            (SamplerParams { side_rows: Some(0), ..base.clone() }, "--side-rows 0 is outside 2..=64"),
            (SamplerParams { side_rows: Some(65), ..base.clone() }, "--side-rows 65"),
            (SamplerParams { rows: Some(0), ..base.clone() }, "--rows 0 is outside 1..=64"),
            (SamplerParams { refresh_every: 33, ..base.clone() }, "--refresh-every 33 is outside 0..=32"),
            (SamplerParams { cfg_scale: f64::NAN, ..base.clone() }, "--cfg NaN"),
            (SamplerParams { threshold: Some(1.5), ..base.clone() }, "--threshold 1.5"),
        ];
        for (p, want) in cases {
            let e = p.validate(&limits).unwrap_err();
            assert!(matches!(e, Error::Setting { .. }), "{e}");
            assert!(e.to_string().contains(want), "{e} does not say {want}");
        }
        assert_eq!(SamplerParams { spec_blocks: 4, side_rows: Some(64), rows: Some(1), ..base.clone() }.validate(&limits).unwrap(), 32);
        // Whatever the policy: a size typed is checked even where it is not used.
        let exact = SamplerParams { policy: Policy::Exact, spec_blocks: u32::MAX as usize, ..base.clone() };
        assert!(exact.validate(&limits).unwrap_err().to_string().contains("--spec-blocks 4294967295"));
        assert_eq!(SamplerParams::default_spec_blocks(Policy::Mbsd, 2, 32, 32), 0);
        assert_eq!(SamplerParams::default_spec_blocks(Policy::Mbsd, 2, 128, 32), 2);
        assert_eq!(SamplerParams::default_spec_blocks(Policy::Spec, 2, 128, 32), 1);
    }

    #[test]
    fn softmax_matches_a_double_precision_reference() {
        let logits: Vec<f32> = (0..300).map(|i| ((i * 37) % 101) as f32 * 0.13 - 4.0).collect();
        let max = logits.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        for i in [0, 17, 299] {
            let want = (logits[i] as f64 - max).exp() / sum;
            assert!((softmax_at(&logits, i) as f64 - want).abs() < 1e-6);
        }
        // A dominant logit gives exactly 1.0 in float32, as in PyTorch: this is where ties come from.
        let mut peaked = vec![0.0f32; 320];
        peaked[5] = 40.0;
        assert_eq!(softmax_at(&peaked, 5), 1.0);
    }

    fn special() -> llada_ir::SpecialTokens {
        llada_ir::SpecialTokens { mask: 9, bos: None, eos: Some(1), eot: Some(2) }
    }

    #[test]
    fn logits_eos_inf_never_predicts_eos() {
        let p = SamplerParams { logits_eos_inf: true, ..Default::default() };
        let mut row = vec![0.0, 5.0, 1.0, 0.5];
        assert_eq!(predict(&mut row, &p, &special(), 0, 0).0, 2);
        let mut row = vec![0.0, 5.0, 1.0, 0.5];
        assert_eq!(predict(&mut row, &SamplerParams::default(), &special(), 0, 0).0, 1);
    }

    #[test]
    fn confidence_eos_eot_inf_zeroes_their_confidence_as_the_official_code_does() {
        let p = SamplerParams { confidence_eos_eot_inf: true, ..Default::default() };
        // EoT predicted: still predicted, but with zero confidence.
        let (tok, conf) = predict(&mut vec![0.0, 1.0, 5.0, 0.5], &p, &special(), 0, 0);
        assert_eq!((tok, conf), (2, 0.0));
        // At temperature 0 the official code's noisy logits are the clean ones, so EOS too.
        let (tok, conf) = predict(&mut vec![0.0, 5.0, 1.0, 0.5], &p, &special(), 0, 0);
        assert_eq!((tok, conf), (1, 0.0));
        // Another token keeps a confidence computed without EOS and EoT in the softmax.
        let (tok, conf) = predict(&mut vec![3.0, 1.0, 1.0, 0.5], &p, &special(), 0, 0);
        assert_eq!(tok, 0);
        assert!((conf - softmax_at(&[3.0, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.5], 0)).abs() < 1e-7);
        // Above temperature 0 only EoT is excluded (EOS keeps its probability mass).
        let hot = SamplerParams { temperature: 1e-3, ..p };
        let (tok, conf) = predict(&mut vec![0.0, 5.0, 1.0, 0.5], &hot, &special(), 0, 0);
        assert_eq!(tok, 1);
        assert!(conf > 0.9);
    }

    #[test]
    fn gumbel_sampling_follows_the_distribution_and_the_seed() {
        // p = (0.7, 0.3): over many positions the first token wins about 70% of the time.
        let p = SamplerParams { temperature: 1.0, seed: 5, ..Default::default() };
        let logits = [0.7f32.ln(), 0.3f32.ln()];
        let picks: Vec<u32> = (0..4000).map(|pos| predict(&mut logits.to_vec(), &p, &special(), 3, pos).0).collect();
        let share = picks.iter().filter(|&&t| t == 0).count() as f64 / picks.len() as f64;
        assert!((share - 0.7).abs() < 0.03, "share {share}");
        let again: Vec<u32> = (0..4000).map(|pos| predict(&mut logits.to_vec(), &p, &special(), 3, pos).0).collect();
        assert_eq!(picks, again);
        let other = SamplerParams { seed: 6, ..p.clone() };
        let moved: Vec<u32> = (0..4000).map(|pos| predict(&mut logits.to_vec(), &other, &special(), 3, pos).0).collect();
        assert_ne!(picks, moved);
    }

    #[test]
    fn random_remasking_confidence_is_uniform_and_seeded() {
        let p = SamplerParams { remasking: Remasking::Random, seed: 9, ..Default::default() };
        let confs: Vec<f32> = (0..2000).map(|pos| predict(&mut vec![0.0, 9.0], &p, &special(), 1, pos).1).collect();
        assert!(confs.iter().all(|&c| (0.0..1.0).contains(&c)));
        let mean = confs.iter().sum::<f32>() / confs.len() as f32;
        assert!((mean - 0.5).abs() < 0.03, "mean {mean}");
        assert_eq!(predict(&mut vec![0.0, 9.0], &p, &special(), 1, 7), predict(&mut vec![0.0, 9.0], &p, &special(), 1, 7));
    }

    #[test]
    fn noise_streams_are_reproducible_and_distinct() {
        let a: f64 = stream(1, GUMBEL, 3, 40).random();
        let b: f64 = stream(1, GUMBEL, 3, 40).random();
        let c: f64 = stream(1, GUMBEL, 3, 41).random();
        let d: f64 = stream(2, GUMBEL, 3, 40).random();
        assert_eq!(a, b);
        assert!(a != c && a != d);
    }
}
