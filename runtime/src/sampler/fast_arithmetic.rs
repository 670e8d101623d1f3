//! The row arithmetic of a denoising step under `--rng fast`: the same quantities as the
//! published code (processed logits, first argmax, the probabilities sampled from, entropy),
//! computed for speed rather than for PyTorch's bits.
//!
//! The torch-exact path (`uniform_noise.rs`) spends five exponentials an entry (softmax and
//! `Categorical.entropy` each normalise on their own, in the C library's double-precision
//! `expf`) and PyTorch's cascade sums: about 5 s a step at canvas 256 x vocabulary 262,144 on
//! two cores. Once the random stream is not PyTorch's, those bits decide nothing anyone can
//! compare against, so here one vectorised f32 exponential an entry gives both the sampling
//! weights and the entropy: with `e_i = exp(x_i - m)`, `S = sum e_i` and `W = sum e_i (x_i - m)`,
//! `H = -sum p_i ln p_i = ln S - W / S`, the sums in double: closer to the true entropy than
//! PyTorch's float32 `Categorical.entropy` (at 262,144 entries of spread 20: 2e-7 against
//! 1.3e-4; the test prints both). The weights stay unnormalised (the fast stream's inverse
//! CDF divides by their total).

use crate::kernels::cpu::{multiversion, Features};
use crate::kernels::exp;

/// One row's statistics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RowStats {
    pub(crate) argmax: u32,
    pub(crate) entropy: f32,
}

/// `exp(d)` for `d <= 0`, but 0 where the true value is below f32's normal range ([`exp`]
/// clamps there): an entry the exact softmax gives no weight must never be sampled.
#[inline(always)]
fn weight(d: f32) -> f32 {
    if d < -87.0 { 0.0 } else { exp(d) }
}

#[inline(always)]
fn weights_body<const FMA: bool>(_: Features, row: &[f32], max: f32, weights: &mut [f32]) -> (f64, f64) {
    // 16 partial sums in double: they vectorise, and 16,384 float terms each (at 262,144
    // entries) would lose the entropy's fifth digit in float.
    let (mut sum, mut weighted) = ([0f64; 16], [0f64; 16]);
    let mut rows = row.chunks_exact(16);
    let mut outs = weights.chunks_exact_mut(16);
    for (r, o) in (&mut rows).zip(&mut outs) {
        for l in 0..16 {
            let d = r[l] - max;
            let e = weight(d);
            o[l] = e;
            sum[l] += e as f64;
            weighted[l] += (e * d) as f64;
        }
    }
    for ((&x, o), l) in rows.remainder().iter().zip(outs.into_remainder()).zip(0..) {
        let d = x - max;
        let e = weight(d);
        *o = e;
        sum[l] += e as f64;
        weighted[l] += (e * d) as f64;
    }
    (sum.iter().sum(), weighted.iter().sum())
}

multiversion! {
    /// `weights[i] = exp(row[i] - max)`; returns their sum and `sum weights[i] * (row[i] - max)`.
    fn exp_weights(features: Features, row: &[f32], max: f32, weights: &mut [f32]) -> (f64, f64) => weights_body
}

#[inline(always)]
fn max_body<const FMA: bool>(_: Features, row: &[f32]) -> (f32, bool) {
    let (mut max, mut nan) = ([f32::NEG_INFINITY; 16], [false; 16]);
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            max[l] = if c[l] > max[l] { c[l] } else { max[l] };
            nan[l] |= c[l].is_nan();
        }
    }
    for (l, &x) in chunks.remainder().iter().enumerate() {
        max[l] = if x > max[l] { x } else { max[l] };
        nan[l] |= x.is_nan();
    }
    (max.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m }), nan.contains(&true))
}

multiversion! {
    /// The row's largest value, ignoring NaNs, and whether it holds one.
    fn max_and_nan(features: Features, row: &[f32]) -> (f32, bool) => max_body
}

/// The index of the first maximum, a NaN counting as the maximum (PyTorch's `argmax`, as
/// [`super::uniform_noise::argmax`]), in vector passes: the maximum, then its first place.
fn first_argmax(row: &[f32]) -> usize {
    let (max, nan) = max_and_nan(crate::kernels::cpu::features(), row);
    let found = if nan { row.iter().position(|x| x.is_nan()) } else { row.iter().position(|&x| x == max) };
    found.unwrap_or(0)
}

/// For a row of processed logits: its first maximum, its unnormalised softmax weights (into
/// `weights`) and its entropy. A row holding a NaN or an infinite maximum has no finite
/// entropy: NaN, as PyTorch's would be.
pub(crate) fn row_stats(row: &[f32], weights: &mut [f32]) -> RowStats {
    let argmax = first_argmax(row);
    let max = row[argmax];
    if !max.is_finite() {
        weights.iter_mut().zip(row).for_each(|(w, &x)| *w = (x == max) as u32 as f32);
        return RowStats { argmax: argmax as u32, entropy: f32::NAN };
    }
    let (sum, weighted) = exp_weights(crate::kernels::cpu::features(), row, max, weights);
    RowStats { argmax: argmax as u32, entropy: (sum.ln() - weighted / sum) as f32 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::uniform_noise::{entropy, softmax_into};

    #[test]
    fn matches_the_exact_path_to_float_precision() {
        let mut seed = 11u64;
        for (len, spread) in [(5usize, 1.0f32), (17, 0.1), (1000, 8.0), (262_144, 20.0), (4096, 200.0)] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
                })
                .collect();
            let mut weights = vec![0.0; len];
            let stats = row_stats(&row, &mut weights);
            let (mut probs, mut scratch) = (vec![0.0; len], vec![0.0; len]);
            softmax_into(&row, &mut probs);
            let torch_path = entropy(&row, &mut scratch) as f64;
            // The entropy in double from double exponentials.
            let max = row.iter().fold(f32::MIN, |m, &x| m.max(x)) as f64;
            let (s, w) = row.iter().fold((0f64, 0f64), |(s, w), &x| (s + (x as f64 - max).exp(), w + (x as f64 - max).exp() * (x as f64 - max)));
            let truth = s.ln() - w / s;
            assert_eq!(stats.argmax as usize, super::super::uniform_noise::argmax(&row));
            let error = (stats.entropy as f64 - truth).abs();
            eprintln!("len {len}: error {error:e}, the torch path's {:e}", (torch_path - truth).abs());
            assert!(error <= 2e-6 * truth.max(1.0), "len {len}: {} vs {truth}", stats.entropy);
            let total: f32 = weights.iter().sum();
            for (w, p) in weights.iter().zip(&probs) {
                assert!((w / total - p).abs() <= 1e-6 + 1e-4 * p, "len {len}: {} vs {p}", w / total);
            }
        }
    }

    #[test]
    fn the_argmax_is_the_exact_paths() {
        let argmax = super::super::uniform_noise::argmax;
        for row in [vec![1.0f32, 3.0, 3.0, 2.0], vec![-1.0; 40], vec![f32::NEG_INFINITY; 3], vec![0.5, f32::NAN, 9.0, f32::NAN], (0..37).map(|i| ((i * 13) % 37) as f32).collect()] {
            assert_eq!(first_argmax(&row), argmax(&row), "{row:?}");
        }
    }

    #[test]
    fn a_one_hot_row_has_zero_entropy_and_an_infinite_one_none() {
        let mut row = vec![-200.0f32; 64];
        row[9] = 50.0;
        let mut weights = vec![0.0; 64];
        let stats = row_stats(&row, &mut weights);
        assert_eq!(stats, RowStats { argmax: 9, entropy: 0.0 });
        row[3] = f32::INFINITY;
        let stats = row_stats(&row, &mut weights);
        assert_eq!(stats.argmax, 3);
        assert!(stats.entropy.is_nan());
        assert_eq!(weights.iter().sum::<f32>(), 1.0);
    }
}
