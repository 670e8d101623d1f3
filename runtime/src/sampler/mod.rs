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
//!
//! Every policy is a state machine over the canvas (`PolicyStep`, `canvas.rs`): it asks for
//! passes (and, revising, for the side lane's merges and jobs) and receives their logits
//! (`ask.rs`); it never holds the session, an executor or a window. The session's loop
//! (`Generator`, `runtime/src/generator.rs`) serves the asks, one step per `step()`;
//! `generate`, streaming, cancellation and the C API's callback are loops over it. A policy
//! is one file implementing `PolicyStep` (which rows a pass computes and what follows from
//! its predictions), plus its line in `start.rs`.

mod ask;
mod canvas;
#[cfg(test)]
mod dg_fixture;
mod diffusion_gemma;
mod dream;
mod fast_arithmetic;
mod fast_random;
mod llada2;
mod llada2_mbsd;
mod mbsd;
mod official;
mod revision;
mod start;
mod torch_random;
mod uniform_noise;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

pub use ask::RowSet;
pub use mbsd::MbsdReport;
pub(crate) use ask::{Ask, PassContext, PassRequest, Predict, SideChecks, SideJob};
pub(crate) use canvas::{Canvas, PolicyStep};
pub(crate) use start::start;
pub use crate::params::{Alg, EosIds, Limits, Policy, Remasking, Revision, Rng, SamplerParams, MAX_STEPS};


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
    softmax_at_max(logits, index, max)
}

/// [`softmax_at`] with the row's maximum known (a greedy prediction's logit).
fn softmax_at_max(logits: &[f32], index: usize, max: f32) -> f32 {
    // The C library's expf bits, vectorised (`kernels::expf`).
    let sum = crate::kernels::expf::exp_sum(crate::kernels::cpu::features(), logits, max);
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
    /// DiffusionGemma: the decoder passes each canvas took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub denoising_steps_per_canvas: Option<Vec<u32>>,
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


/// Predictions of a pass's logit rows, computed on the session's thread pool into buffers
/// allocated once per generation (a row is modified in place, as the official code modifies
/// its logits, so each is copied first).
pub(crate) struct Predictor {
    rows: Vec<f32>,
    out: Vec<(u32, f32)>,
    vocab: usize,
    /// The session's pool, held apart from the session the logits borrow.
    pool: crate::pool::Pool,
}

impl Predictor {
    /// Buffers for passes of up to `rows` logit rows of `vocab` each, predicting on `pool`.
    pub(crate) fn new(vocab: usize, rows: usize, pool: crate::pool::Pool) -> Predictor {
        Predictor { rows: vec![0.0; vocab * rows], out: Vec::with_capacity(rows), vocab, pool }
    }

    /// [`new`](Self::new) for `model`'s passes: at most what one of its graphs returns (a pass
    /// asking for more is refused before it runs).
    pub(crate) fn for_model(model: &crate::model::Model, rows: usize, pool: crate::pool::Pool) -> Predictor {
        let h = &model.header;
        let most = h.graphs.iter().map(|g| g.logit_rows as usize).max().unwrap_or(0);
        Predictor::new(h.model.embedding_size as usize, rows.min(most), pool)
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

    /// [`run`](Self::run) on `logits` where they lie (the session's output): rows are copied
    /// only when the settings mask logits (`logits_eos_inf`, `confidence_eos_eot_inf`), as
    /// copying every row costs about what predicting it does.
    pub(crate) fn run_on(&mut self, logits: &[f32], positions: &[u32], p: &SamplerParams, special: &llada_ir::SpecialTokens, purpose: u64, step: usize) -> &[(u32, f32)] {
        if p.logits_eos_inf || p.confidence_eos_eot_inf {
            self.load(logits);
            return self.run(positions, p, special, purpose, step);
        }
        let vocab = self.vocab;
        self.out.clear();
        self.out.resize(positions.len(), (0, 0.0));
        let out = &mut self.out;
        self.pool.install(|| {
            logits.par_chunks(vocab).zip(positions.par_iter()).zip(out.par_iter_mut()).for_each(|((row, &pos), o)| {
                let (token, max) = choose(row, p, purpose, step, pos as usize);
                *o = (token as u32, confidence(row, token, max, p, purpose, step, pos as usize));
            })
        });
        &self.out
    }

    /// Predicts the loaded rows, row `i` at `positions[i]`, noise of step `step`.
    pub(crate) fn run(&mut self, positions: &[u32], p: &SamplerParams, special: &llada_ir::SpecialTokens, purpose: u64, step: usize) -> &[(u32, f32)] {
        self.each_row(positions, |row, pos| predict_with(row, p, special, purpose, step, pos))
    }

    /// Dream's predictions at `positions` (`dream.rs`): the token and its confidence under
    /// `p.alg`, from the loaded logits.
    pub(crate) fn run_dream(&mut self, positions: &[u32], p: &SamplerParams, purpose: u64, step: usize) -> &[(u32, f32)] {
        self.each_row(positions, |row, pos| dream::predict(row, p, purpose, step, pos))
    }

    /// `predict` on each loaded row (its position beside it), in parallel on the pool.
    fn each_row(&mut self, positions: &[u32], predict: impl Fn(&mut [f32], usize) -> (u32, f32) + Sync) -> &[(u32, f32)] {
        let vocab = self.vocab;
        let rows = &mut self.rows[..positions.len() * vocab];
        self.out.clear();
        self.out.resize(positions.len(), (0, 0.0));
        let out = &mut self.out;
        self.pool.install(|| {
            rows.par_chunks_mut(vocab).zip(positions.par_iter()).zip(out.par_iter_mut()).for_each(|((row, &pos), o)| {
                *o = predict(row, pos as usize);
            })
        });
        &self.out
    }
}

/// A pass's predictions as candidates, each at its position in `logit_rows`.
pub(crate) fn candidates<'a>(logit_rows: &'a [u32], predictions: &'a [(u32, f32)]) -> impl Iterator<Item = Candidate> + 'a {
    logit_rows.iter().zip(predictions).map(|(&pos, &(token, confidence))| Candidate { position: pos as usize, token, confidence })
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
    let (token, mut max) = choose(row, p, purpose, step, position);
    if p.confidence_eos_eot_inf {
        if let Some(eot) = special.eot {
            row[eot as usize] = f32::NEG_INFINITY;
        }
        if p.temperature == 0.0 {
            if let Some(eos) = special.eos {
                row[eos as usize] = f32::NEG_INFINITY;
            }
        }
        // The masked entries may have been the maximum.
        max = None;
    }
    (token as u32, confidence(row, token, max, p, purpose, step, position))
}

/// The predicted token of `row` (the official code's choice), and the row's maximum when that
/// is the token's logit (greedy).
fn choose(row: &[f32], p: &SamplerParams, purpose: u64, step: usize, position: usize) -> (usize, Option<f32>) {
    if p.temperature > 0.0 {
        // Official add_gumbel_noise: exp(logits) / (-ln u)^temperature in float64.
        let mut rng = stream(p.seed, purpose, step, position);
        let token = argmax(row.iter().map(|&l| {
            let u: f64 = rng.random();
            (l as f64).exp() / (-u.ln()).powf(p.temperature)
        }));
        (token, None)
    } else {
        let token = crate::kernels::argmax(crate::kernels::cpu::features(), row);
        (token, Some(row[token]).filter(|m| !m.is_nan()))
    }
}

/// The confidence of `token` under the remasking rule (`max`: the row's maximum, if known).
fn confidence(row: &[f32], token: usize, max: Option<f32>, p: &SamplerParams, purpose: u64, step: usize, position: usize) -> f32 {
    match p.remasking {
        Remasking::LowConfidence => match max {
            Some(max) => softmax_at_max(row, token, max),
            None => softmax_at(row, token),
        },
        Remasking::Random => stream(p.seed, RANDOM_REMASK + purpose - GUMBEL, step, position).random::<f32>(),
    }
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
