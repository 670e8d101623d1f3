//! DiffusionGemma's uniform-noise denoising step, as the published code takes it
//! (transformers' `generation_diffusion_gemma.py`: `_denoising_step` with
//! `LinearTemperatureScheduleLogitsProcessor`, `EntropyBoundSampler` and
//! `StableAndConfidentStoppingCriteria`), over a `[canvas, vocab]` float32 logits slice. Pure
//! data in, data out: the policy that runs the model and keeps the canvases is elsewhere.
//!
//! One step, for raw logits `z` and the canvas `x` they were computed from, at `cur_step`
//! (which counts down from `N` to 1):
//! 1. processed logits `z / t`, with `t = t_min + (t_max - t_min) * (cur_step / N)` in float32
//!    (the published `cur_step` is an int32 tensor, so the ratio is a float32 division, the
//!    Python floats are rounded to float32 where they meet it, and `t_max - t_min` is taken in
//!    double first); these are also the next step's self-conditioning logits;
//! 2. a denoiser canvas: one sample per position from `softmax(z / t)` (the random stream);
//! 3. the argmax canvas: the first maximum of each processed row;
//! 4. entropies `H` of `Categorical(logits = z / t)`; positions in ascending `H` order are
//!    accepted while the sum of the entropies before them is `<= entropy_bound` (the cumulative
//!    sum is accumulated in double, as PyTorch's CPU `cumsum` does, then rounded to float;
//!    the subtraction and comparison are float32);
//! 5. accepted positions take the denoiser's token, the others fresh uniform noise (a full
//!    canvas of noise is drawn either way, after the samples);
//! 6. stop when the argmax canvas equals each of the last `stability_threshold` ones (a history
//!    that starts at -1, so never at a block's first step) and the mean entropy is below
//!    `confidence_threshold` (float32). The block's output is the argmax canvas of its last step.
//!
//! Exactness: decisions follow the published arithmetic, but two float32 pieces are
//! reproduced in structure, not in bits. PyTorch's vectorised `exp` and `log` differ from the
//! C library's in the last bit (torch 2.15, AVX-512: `exp` for about 1% of inputs, `log` near 1
//! for about 9%), and its float32 softmax (which the sampled probabilities come from) matched
//! neither a C-library nor a `torch.exp` reconstruction bit for bit; here `kernels::expf` (the
//! C library's `expf`) and `f32::ln` stand in, with
//! PyTorch's cascade summation (`sum`, `mean`) reproduced exactly for 16-lane (AVX-512) vectors.
//! Entropies therefore agree to a few ulps, which changes a decision only when a bound or
//! threshold falls within those ulps. Among bitwise-equal entropies the order is the
//! positions' (PyTorch's unstable CPU sort orders such ties its own, machine-dependent, way),
//! which matters only when equal entropies straddle the bound.

use super::fast_arithmetic::row_stats;
use super::fast_random::{FastStream, StepKey};
use super::torch_random::TorchGenerator;
use crate::kernels::cpu::{multiversion, Features};
use crate::kernels::expf::expf;
use rayon::prelude::*;

/// The sampler's settings (the published generation config's diffusion part).
#[derive(Clone, Debug)]
pub(crate) struct UniformNoiseConfig {
    pub(crate) vocab: usize,
    pub(crate) canvas: usize,
    /// `max_denoising_steps` (`N`).
    pub(crate) steps: u32,
    /// `(t_min, t_max)`; `None` leaves the logits as they are.
    pub(crate) temperature: Option<(f64, f64)>,
    pub(crate) entropy_bound: f64,
    /// `(stability_threshold, confidence_threshold)`; `None` never stops early.
    pub(crate) stopping: Option<(usize, f64)>,
    pub(crate) arithmetic: RowArithmetic,
}

/// How a step computes each row's probabilities, argmax and entropy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RowArithmetic {
    /// PyTorch's operations in its order (to reproduce the published generation with its
    /// random stream).
    Torch,
    /// The same quantities in one exponential an entry (`fast_arithmetic.rs`).
    Fast,
}

/// The temperature at `cur_step` of `steps`, bit for bit as the published processor computes it.
pub(crate) fn temperature(t_min: f64, t_max: f64, cur_step: u32, steps: u32) -> f32 {
    let ratio = cur_step as f32 / steps as f32;
    t_min as f32 + (t_max - t_min) as f32 * ratio
}

/// `raw / t` element by element (float32 division, as PyTorch's), or a copy without `t`.
pub(crate) fn process_logits(raw: &[f32], temperature: Option<f32>, out: &mut [f32]) {
    match temperature {
        Some(t) => out.iter_mut().zip(raw).for_each(|(o, &z)| *o = z / t),
        None => out.copy_from_slice(raw),
    }
}

/// `torch.softmax(row, -1)` in float32: `exp(x - max)` times the reciprocal of their sum.
pub(crate) fn softmax_into(row: &[f32], out: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let sum = crate::kernels::expf::exp_sum(crate::kernels::cpu::features(), row, max);
    crate::kernels::expf::exp_scaled_into(crate::kernels::cpu::features(), row, max, 1.0 / sum, out);
}

/// The index of the first maximum (a NaN counts as the maximum, as in PyTorch's `argmax`).
pub(crate) fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate().skip(1) {
        let b = row[best];
        if !b.is_nan() && (v.is_nan() || v > b) {
            best = i;
        }
    }
    best
}

/// Float32 vector lanes of PyTorch's AVX-512 kernels.
const LANES: usize = 16;
type Lanes = [f32; LANES];

fn add_lanes(acc: &mut Lanes, v: &Lanes) {
    acc.iter_mut().zip(v).for_each(|(a, &b)| *a += b);
}

/// `ceil(log2(x))`, 1 for `x <= 2` (ATen's `utils::CeilLog2`).
fn ceil_log2(x: usize) -> usize {
    if x <= 2 { 1 } else { 64 - (x as u64 - 1).leading_zeros() as usize }
}

/// ATen's `multi_row_sum` for 4 interleaved rows of vectors: `load(i, k)` is row `k`'s `i`-th.
/// Sums in chunks of `2^level_power`, carried up through 4 levels, so that only partial sums
/// of similar size meet.
fn multi_row_sum(size: usize, load: impl Fn(usize, usize) -> Lanes) -> [Lanes; 4] {
    const LEVELS: usize = 4;
    let level_power = (ceil_log2(size) / LEVELS).max(4);
    let level_step = 1 << level_power;
    let level_mask = level_step - 1;
    let mut acc = [[[0f32; LANES]; 4]; LEVELS];
    let mut i = 0;
    while i + level_step <= size {
        for _ in 0..level_step {
            for k in 0..4 {
                add_lanes(&mut acc[0][k], &load(i, k));
            }
            i += 1;
        }
        for j in 1..LEVELS {
            for k in 0..4 {
                let lower = std::mem::take(&mut acc[j - 1][k]);
                add_lanes(&mut acc[j][k], &lower);
            }
            if i & (level_mask << (j * level_power)) != 0 {
                break;
            }
        }
    }
    for i in i..size {
        for k in 0..4 {
            add_lanes(&mut acc[0][k], &load(i, k));
        }
    }
    for j in 1..LEVELS {
        for k in 0..4 {
            let upper = acc[j][k];
            add_lanes(&mut acc[0][k], &upper);
        }
    }
    acc[0]
}

/// `torch.sum(xs)` over a contiguous float32 row on the CPU (`vectorized_inner_sum`): the
/// vectors summed 4 apart by [`multi_row_sum`], the leftovers, then the scalar tail and the 16
/// lanes added in order.
pub(crate) fn torch_sum(xs: &[f32]) -> f32 {
    let vectors = xs.len() / LANES;
    let vector = |i: usize| -> Lanes { xs[i * LANES..(i + 1) * LANES].try_into().expect("16 lanes") };
    let interleaved = vectors / 4;
    let partial = multi_row_sum(interleaved, |i, k| vector(i * 4 + k));
    let mut lanes = partial[0];
    for i in interleaved * 4..vectors {
        add_lanes(&mut lanes, &vector(i));
    }
    for p in &partial[1..] {
        add_lanes(&mut lanes, p);
    }
    let mut total = 0f32;
    for &x in &xs[vectors * LANES..] {
        total += x;
    }
    lanes.iter().fold(total, |t, &l| t + l)
}

/// `Categorical(logits=row).entropy()` (float32): the logits normalised by their logsumexp,
/// clamped at the lowest float, times `softmax` of the normalised logits, summed and negated.
/// `scratch` holds `row.len()` floats.
pub(crate) fn entropy(row: &[f32], scratch: &mut [f32]) -> f32 {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    // logsumexp replaces an infinite maximum by 0.
    let max = if max.is_infinite() { 0.0 } else { max };
    // (Times 1: exact.)
    crate::kernels::expf::exp_scaled_into(crate::kernels::cpu::features(), row, max, 1.0, scratch);
    let lse = torch_sum(scratch).ln() + max;
    scratch.iter_mut().zip(row).for_each(|(s, &x)| *s = x - lse);
    let norm_max = scratch.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let scale = 1.0 / crate::kernels::expf::exp_sum(crate::kernels::cpu::features(), scratch, norm_max);
    entropy_terms(crate::kernels::cpu::features(), scratch, norm_max, scale);
    -torch_sum(scratch)
}

#[inline(always)]
fn entropy_terms_body<const FMA: bool>(_: Features, normalized: &mut [f32], max: f32, scale: f32) {
    normalized.iter_mut().for_each(|s| *s = s.max(f32::MIN) * (expf(*s - max) * scale));
}

multiversion! {
    /// `p log p` of each normalised logit (clamped at the lowest float, as PyTorch's
    /// `Categorical` clamps), with `p = softmax` from their maximum and the reciprocal sum.
    fn entropy_terms(features: Features, normalized: &mut [f32], max: f32, scale: f32) => entropy_terms_body
}

/// `torch.mean(entropies)` (float32): the cascade sum divided by the count.
pub(crate) fn mean(xs: &[f32]) -> f32 {
    torch_sum(xs) / xs.len() as f32
}

/// The entropy-bound acceptance: `accepted[i]` for the positions taken, lowest entropy first,
/// while the entropies before them sum to at most `bound`. `order` is scratch.
pub(crate) fn accept_by_entropy(entropies: &[f32], bound: f64, order: &mut Vec<usize>, accepted: &mut [bool]) {
    order.clear();
    order.extend(0..entropies.len());
    // Ascending; NaN last (PyTorch's sort comparator); equal values in position order.
    order.sort_by(|&a, &b| {
        let (x, y) = (entropies[a], entropies[b]);
        match (x.is_nan(), y.is_nan()) {
            (false, false) => x.partial_cmp(&y).expect("not NaN"),
            (nan_x, nan_y) => nan_x.cmp(&nan_y),
        }
    });
    let bound = bound as f32;
    let mut cumulative = 0f64;
    for &i in order.iter() {
        cumulative += entropies[i] as f64;
        accepted[i] = cumulative as f32 - entropies[i] <= bound;
    }
}

/// `StableAndConfidentStoppingCriteria` for one sequence.
#[derive(Clone, Debug)]
pub(crate) struct StableAndConfident {
    stability_threshold: usize,
    confidence_threshold: f32,
    /// The last `stability_threshold` argmax canvases, oldest first; `None` before a block's
    /// first step (the published history is then all -1, which no token equals).
    history: Option<Vec<Vec<u32>>>,
}

impl StableAndConfident {
    pub(crate) fn new(stability_threshold: usize, confidence_threshold: f64) -> StableAndConfident {
        StableAndConfident { stability_threshold, confidence_threshold: confidence_threshold as f32, history: None }
    }

    /// Forgets the history (a new block).
    pub(crate) fn reset(&mut self) {
        self.history = None;
    }

    /// Whether to stop after a step whose argmax canvas is `argmax` and entropies `entropies`.
    pub(crate) fn update(&mut self, argmax: &[u32], entropies: &[f32]) -> bool {
        let stable = if self.stability_threshold == 0 {
            true
        } else {
            let history = self.history.get_or_insert_with(Vec::new);
            let stable = history.len() == self.stability_threshold && history.iter().all(|h| h == argmax);
            if history.len() == self.stability_threshold {
                history.remove(0);
            }
            history.push(argmax.to_vec());
            stable
        };
        stable && mean(entropies) < self.confidence_threshold
    }
}

/// A random stream the step draws from: PyTorch's (in call order) or the fast one (by key).
pub(crate) trait NoiseStream {
    /// One sample per row of `vocab` probabilities.
    fn sample_rows(&mut self, probs: &[f32], vocab: usize, at: StepKey, picks: &mut [u32]);
    /// A canvas of uniform tokens in `[0, vocab)`.
    fn random_canvas(&mut self, vocab: usize, at: StepKey, out: &mut [u32]);
}

impl NoiseStream for TorchGenerator {
    fn sample_rows(&mut self, probs: &[f32], vocab: usize, _: StepKey, picks: &mut [u32]) {
        self.multinomial_one_par(probs, vocab, picks);
    }

    fn random_canvas(&mut self, vocab: usize, _: StepKey, out: &mut [u32]) {
        self.randint_tokens(vocab as u32, out);
    }
}

impl NoiseStream for FastStream {
    fn sample_rows(&mut self, probs: &[f32], vocab: usize, at: StepKey, picks: &mut [u32]) {
        FastStream::sample_rows(self, probs, vocab, at, picks);
    }

    fn random_canvas(&mut self, vocab: usize, at: StepKey, out: &mut [u32]) {
        FastStream::random_canvas(self, vocab as u32, at, out);
    }
}

/// What one step produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct StepOutcome {
    /// The denoiser's samples, one per position.
    pub(crate) denoised: Vec<u32>,
    pub(crate) accepted: Vec<bool>,
    /// The next step's canvas (accepted samples, noise elsewhere).
    pub(crate) canvas: Vec<u32>,
    /// The argmax canvas: the block's output if it ends here.
    pub(crate) argmax: Vec<u32>,
    pub(crate) entropies: Vec<f32>,
    /// The stopping rule fired: the block ends with `argmax`.
    pub(crate) stop: bool,
}

/// The sampler's buffers and stopping state across the steps of a generation.
pub(crate) struct UniformNoiseSampler {
    config: UniformNoiseConfig,
    stopping: Option<StableAndConfident>,
    processed: Vec<f32>,
    probs: Vec<f32>,
    order: Vec<usize>,
}

impl UniformNoiseSampler {
    pub(crate) fn new(config: UniformNoiseConfig) -> UniformNoiseSampler {
        let n = config.canvas * config.vocab;
        let stopping = config.stopping.map(|(stability, confidence)| StableAndConfident::new(stability, confidence));
        UniformNoiseSampler { config, stopping, processed: vec![0.0; n], probs: vec![0.0; n], order: Vec::new() }
    }

    /// A new block's starting canvas (uniform noise), and a fresh stopping history.
    pub(crate) fn start_block(&mut self, block: u32, noise: &mut impl NoiseStream) -> Vec<u32> {
        if let Some(s) = &mut self.stopping {
            s.reset();
        }
        let mut canvas = vec![0; self.config.canvas];
        noise.random_canvas(self.config.vocab, StepKey { block, step: 0 }, &mut canvas);
        canvas
    }

    /// The last step's processed logits: the next step's self-conditioning input.
    pub(crate) fn processed_logits(&self) -> &[f32] {
        &self.processed
    }

    /// One denoising step at `cur_step` (counting down from `steps`) of `block`, from the raw
    /// logits `raw` of the step's canvas. The canvas itself does not enter: the published
    /// acceptance keeps a rejected position's old token, but renoising then replaces every
    /// rejected position, so only the model sees it.
    pub(crate) fn step(&mut self, raw: &[f32], block: u32, cur_step: u32, noise: &mut impl NoiseStream) -> StepOutcome {
        let (vocab, positions) = (self.config.vocab, self.config.canvas);
        assert_eq!(raw.len(), vocab * positions, "raw logits must be canvas x vocab");
        let t = self.config.temperature.map(|(t_min, t_max)| temperature(t_min, t_max, cur_step, self.config.steps));
        let (processed, probs, arithmetic) = (&mut self.processed, &mut self.probs, self.config.arithmetic);
        let mut argmax_canvas = vec![0u32; positions];
        let mut entropies = vec![0f32; positions];
        processed
            .par_chunks_mut(vocab)
            .zip(raw.par_chunks(vocab))
            .zip(probs.par_chunks_mut(vocab))
            .zip(argmax_canvas.par_iter_mut().zip(entropies.par_iter_mut()))
            .for_each_init(
                || if arithmetic == RowArithmetic::Torch { vec![0f32; vocab] } else { Vec::new() },
                |scratch, (((row, raw_row), prob_row), (best, h))| {
                    process_logits(raw_row, t, row);
                    match arithmetic {
                        RowArithmetic::Torch => {
                            softmax_into(row, prob_row);
                            *best = argmax(row) as u32;
                            *h = entropy(row, scratch);
                        }
                        RowArithmetic::Fast => {
                            let stats = row_stats(row, prob_row);
                            (*best, *h) = (stats.argmax, stats.entropy);
                        }
                    }
                },
            );
        let at = StepKey { block, step: cur_step };
        let mut out = StepOutcome { denoised: vec![0; positions], accepted: vec![false; positions], ..Default::default() };
        noise.sample_rows(&self.probs, vocab, at, &mut out.denoised);
        accept_by_entropy(&entropies, self.config.entropy_bound, &mut self.order, &mut out.accepted);
        let mut fresh = vec![0u32; positions];
        noise.random_canvas(vocab, at, &mut fresh);
        out.canvas = (0..positions).map(|i| if out.accepted[i] { out.denoised[i] } else { fresh[i] }).collect();
        out.stop = match &mut self.stopping {
            Some(s) => s.update(&argmax_canvas, &entropies),
            None => false,
        };
        out.argmax = argmax_canvas;
        out.entropies = entropies;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::dg_fixture::{fixture, parse_hex_f32, u32s};

    fn fixture_config() -> UniformNoiseConfig {
        let c = &fixture()["config"];
        let f = |k: &str| c[k].as_f64().unwrap();
        UniformNoiseConfig {
            vocab: c["vocab"].as_u64().unwrap() as usize,
            canvas: c["canvas"].as_u64().unwrap() as usize,
            steps: c["max_denoising_steps"].as_u64().unwrap() as u32,
            temperature: Some((f("t_min"), f("t_max"))),
            entropy_bound: f("entropy_bound"),
            stopping: Some((c["stability_threshold"].as_u64().unwrap() as usize, f("confidence_threshold"))),
            arithmetic: RowArithmetic::Torch,
        }
    }

    #[test]
    fn temperature_is_the_published_float32_arithmetic() {
        let c = fixture_config();
        let (t_min, t_max) = c.temperature.unwrap();
        for step in fixture()["steps"].as_array().unwrap() {
            let cur = step["cur_step"].as_u64().unwrap() as u32;
            let theirs = parse_hex_f32(step["temperature"].as_str().unwrap())[0];
            assert_eq!(temperature(t_min, t_max, cur, c.steps).to_bits(), theirs.to_bits(), "cur_step {cur}");
        }
        // Where double arithmetic would differ (checked against torch: 0.4..0.8 over 48 steps).
        assert_eq!(temperature(0.4, 0.8, 48, 48), 0.8);
    }

    #[test]
    fn torch_sum_is_exact_for_integers_and_sums_in_cascade() {
        let xs: Vec<f32> = (0..1000).map(|i| (i % 17) as f32).collect();
        assert_eq!(torch_sum(&xs), xs.iter().map(|&x| x as f64).sum::<f64>() as f32);
        // A large first element then small ones: a running float32 sum would drop every one,
        // the cascade keeps their partial sums.
        let mut xs = vec![1.0e-8f32; 1 << 16];
        xs[0] = 1.0;
        assert!(torch_sum(&xs) > 1.0 + 5.0e-4, "{}", torch_sum(&xs));
    }

    #[test]
    fn acceptance_counts_the_entropies_before_each_position() {
        let mut accepted = [false; 5];
        // Ascending: 0.0 (pos 3), 0.2 (pos 1), 0.5 (pos 4), 0.7 (pos 0), 2.0 (pos 2).
        // Sums before: 0, 0, 0.2, 0.7, 1.4 -> with bound 0.7 the first four.
        accept_by_entropy(&[0.7, 0.2, 2.0, 0.0, 0.5], 0.7, &mut Vec::new(), &mut accepted);
        assert_eq!(accepted, [true, true, false, true, true]);
        // The lowest-entropy position is always accepted.
        accept_by_entropy(&[9.0, 8.0, 7.0, 6.0, 5.0], 0.01, &mut Vec::new(), &mut accepted);
        assert_eq!(accepted, [false, false, false, false, true]);
    }

    #[test]
    fn stopping_needs_a_full_stable_history_and_low_entropy() {
        let mut s = StableAndConfident::new(2, 0.5);
        let low = [0.1f32; 3];
        assert!(!s.update(&[1, 2, 3], &low), "first step: history is -1");
        assert!(!s.update(&[1, 2, 3], &low), "one equal canvas of two");
        assert!(s.update(&[1, 2, 3], &low));
        assert!(!s.update(&[1, 2, 3], &[0.1, 0.1, 2.0]), "stable but not confident");
        assert!(!s.update(&[1, 2, 4], &low));
        s.reset();
        assert!(!s.update(&[1, 2, 4], &low));
        let mut always_stable = StableAndConfident::new(0, 0.5);
        assert!(always_stable.update(&[7], &[0.1]));
    }

    /// Feeds the published run's raw logits to the sampler with PyTorch's stream from the same
    /// seed: every step's draws, acceptance, canvas, argmax and stop decision must be the
    /// published ones, and so must the generated sequence.
    #[test]
    fn replays_the_published_generation_step_for_step() {
        let fx = fixture();
        let config = fixture_config();
        let (vocab, canvas_len) = (config.vocab, config.canvas);
        let mut sampler = UniformNoiseSampler::new(config.clone());
        let mut torch = TorchGenerator::manual_seed(fx["config"]["seed"].as_u64().unwrap());
        let mut sequence = u32s(&fx["config"]["prompt"]);
        let steps = fx["steps"].as_array().unwrap();
        let (mut block, mut canvas, mut entropy_errors) = (0u32, sampler.start_block(0, &mut torch), Vec::new());
        let mut first_of_block = true;
        for (k, step) in steps.iter().enumerate() {
            let cur_step = step["cur_step"].as_u64().unwrap() as u32;
            assert_eq!(canvas, u32s(&step["canvas_in"]), "step {k}: canvas in");
            if !first_of_block {
                // The previous step's processed logits are this step's self-conditioning input.
                let crc = crc32fast::hash(bytemuck::cast_slice(sampler.processed_logits()));
                assert_eq!(crc as u64, step["self_conditioning_crc32"].as_u64().unwrap(), "step {k}: self-conditioning logits");
            }
            let raw = parse_hex_f32(step["logits"].as_str().unwrap());
            let out = sampler.step(&raw, block, cur_step, &mut torch);
            let crc = crc32fast::hash(bytemuck::cast_slice(sampler.processed_logits()));
            assert_eq!(crc as u64, step["processed_crc32"].as_u64().unwrap(), "step {k}: processed logits");
            assert_eq!(out.denoised, u32s(&step["denoised"]), "step {k}: multinomial samples");
            let accepted: Vec<u32> = out.accepted.iter().map(|&a| a as u32).collect();
            assert_eq!(accepted, u32s(&step["accepted"]), "step {k}: accepted");
            assert_eq!(out.canvas, u32s(&step["canvas_out"]), "step {k}: canvas out");
            assert_eq!(out.argmax, u32s(&step["argmax"]), "step {k}: argmax");
            assert_eq!(out.stop, step["stop"].as_bool().unwrap(), "step {k}: stop");
            let theirs = parse_hex_f32(step["entropy"].as_str().unwrap());
            entropy_errors.extend(out.entropies.iter().zip(&theirs).map(|(&a, &b)| (a as f64 - b as f64).abs()));
            canvas = out.canvas;
            first_of_block = false;
            if out.stop || cur_step == 1 {
                sequence.extend(&out.argmax);
                block += 1;
                first_of_block = true;
                if sequence.len() < fx["sequence"].as_array().unwrap().len() {
                    canvas = sampler.start_block(block, &mut torch);
                }
            }
        }
        assert_eq!(sequence, u32s(&fx["sequence"]));
        assert_eq!(canvas_len * vocab, raw_len(fx));
        // Entropies are not bit-exact (module comment); near zero a few ulps of the terms are
        // many ulps of the sum, so the error is judged absolutely, against the fixture's
        // closest decision margin (0.003).
        let worst = entropy_errors.iter().fold(0f64, |m, &e| m.max(e));
        let exact = entropy_errors.iter().filter(|&&e| e == 0.0).count();
        eprintln!("entropies: {exact} of {} bit-exact, worst error {worst:e}", entropy_errors.len());
        assert!(worst < 1e-5, "entropies drifted {worst} from torch's");
    }

    fn raw_len(fx: &serde_json::Value) -> usize {
        fx["steps"][0]["logits"].as_str().unwrap().len() / 8
    }

    /// The published softmax's bits, for the record (the samples above depend on them only
    /// through near-ties).
    #[test]
    fn softmax_bits_against_torch() {
        let fx = fixture();
        let config = fixture_config();
        let (mut same, mut total) = (0, 0);
        for step in fx["steps"].as_array().unwrap() {
            let raw = parse_hex_f32(step["logits"].as_str().unwrap());
            let t = temperature(config.temperature.unwrap().0, config.temperature.unwrap().1, step["cur_step"].as_u64().unwrap() as u32, config.steps);
            let mut processed = vec![0.0; raw.len()];
            process_logits(&raw, Some(t), &mut processed);
            let mut probs = vec![0.0; raw.len()];
            for (row, out) in processed.chunks(config.vocab).zip(probs.chunks_mut(config.vocab)) {
                softmax_into(row, out);
            }
            same += (crc32fast::hash(bytemuck::cast_slice(&probs)) as u64 == step["probs_crc32"].as_u64().unwrap()) as usize;
            total += 1;
        }
        eprintln!("softmax: {same} of {total} steps bit-exact with torch's");
    }
}

/// One step at DiffusionGemma's real shape, torch stream against fast stream:
/// `cargo test --release -p llada-rt --lib uniform_noise::bench -- --ignored --nocapture`
/// (timings are printed, never asserted).
#[cfg(test)]
mod bench {
    use super::*;
    use std::time::Instant;

    /// A stream that draws nothing (to time the rest of a step).
    struct NoDraws;

    impl NoiseStream for NoDraws {
        fn sample_rows(&mut self, _: &[f32], _: usize, _: StepKey, _: &mut [u32]) {}
        fn random_canvas(&mut self, _: usize, _: StepKey, _: &mut [u32]) {}
    }

    #[test]
    #[ignore = "a benchmark: 256 x 262,144 logits (1 GiB of buffers), seconds per step"]
    fn one_step_at_the_real_vocabulary() {
        let (canvas, vocab) = (256, 262_144);
        let mut seed = 7u64;
        let raw: Vec<f32> = (0..canvas * vocab)
            .map(|_| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 40.0 - 20.0
            })
            .collect();
        let config = UniformNoiseConfig { vocab, canvas, steps: 48, temperature: Some((0.4, 0.8)), entropy_bound: 0.1, stopping: Some((1, 0.005)), arithmetic: RowArithmetic::Torch };
        let mut sampler = UniformNoiseSampler::new(config.clone());
        let mut fast_sampler = UniformNoiseSampler::new(UniformNoiseConfig { arithmetic: RowArithmetic::Fast, ..config });
        let threads = rayon::current_num_threads();
        let time = |name: &str, run: &mut dyn FnMut() -> StepOutcome| {
            let start = Instant::now();
            let out = run();
            eprintln!("{name}: {:.3} s per step ({threads} threads; {} accepted)", start.elapsed().as_secs_f64(), out.accepted.iter().filter(|&&a| a).count());
        };
        let mut torch = TorchGenerator::manual_seed(0);
        let mut fast = FastStream { seed: 0 };
        // `--rng torch` is the torch stream with PyTorch's arithmetic, `--rng fast` the fast
        // stream with the fast arithmetic; the fast stream over PyTorch's arithmetic shows
        // what each part saves.
        for _ in 0..2 {
            time("--rng torch                  ", &mut || sampler.step(&raw, 0, 48, &mut torch));
            time("fast stream, torch arithmetic", &mut || sampler.step(&raw, 0, 48, &mut fast));
            time("--rng fast                   ", &mut || fast_sampler.step(&raw, 0, 48, &mut fast));
        }
        // The pieces: the row arithmetic alone (processed logits, softmax, argmax, entropy),
        // then the torch stream's draws alone.
        time("torch arithmetic, no draws   ", &mut || sampler.step(&raw, 0, 48, &mut NoDraws));
        time("fast arithmetic, no draws    ", &mut || fast_sampler.step(&raw, 0, 48, &mut NoDraws));
        let start = Instant::now();
        let mut g = TorchGenerator::manual_seed(0);
        let mut x = 0u64;
        for _ in 0..canvas * vocab {
            x ^= g.random_u64();
        }
        eprintln!("torch stream, the MT19937 draws alone: {:.3} s ({x:x})", start.elapsed().as_secs_f64());
    }
}
