//! The element-wise kernels DiffusionGemma's layers add to LLaDA's: the tanh-approximated
//! GELU gate, logit soft-capping, RMSNorm over heads with or without a weight, and the
//! softmax of its self-conditioning input. Each follows PyTorch's order of operations in f32.

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::cpu::Features;
use super::{dot, expf};
use crate::model::Weights;

/// `sqrt(2 / pi)`, as PyTorch's `gelu(approximate='tanh')` writes it (`M_SQRT2 * M_2_SQRTPI *
/// 0.5`, rounded to f32).
const GELU_BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
const GELU_KAPPA: f32 = 0.044715;

/// `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let inner = GELU_BETA * (x + GELU_KAPPA * (x * x * x));
    0.5 * x * (1.0 + inner.tanh())
}

/// `out = gelu_tanh(gate) * up` for rows `[gate | up]` of `x`; `out` rows are `hidden` wide.
pub fn gelu_glu(x: &[f32], hidden: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(2 * hidden).zip(out.chunks_exact_mut(hidden)) {
        let (gate, up) = xr.split_at(hidden);
        for ((o, &g), &u) in or.iter_mut().zip(gate).zip(up) {
            *o = gelu_tanh(g) * u;
        }
    }
}

/// `x = tanh(x / cap) * cap`, element by element.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = (*v / cap).tanh() * cap;
    }
}

/// RMSNorm in place on every `head_dim`-wide head of `heads`: `x * rsqrt(mean(x^2) + eps)`,
/// times `weight` where there is one (PyTorch's `pow(mean + eps, -0.5)` is `1 / sqrt`).
pub fn norm_heads(features: Features, heads: &mut [f32], head_dim: usize, weight: Option<&[f32]>, eps: f32) {
    for h in heads.chunks_exact_mut(head_dim) {
        let ms = dot(features, h, h) / head_dim as f32;
        let r = 1.0 / (ms + eps).sqrt();
        match weight {
            Some(w) => h.iter_mut().zip(w).for_each(|(v, &w)| *v = *v * r * w),
            None => h.iter_mut().for_each(|v| *v *= r),
        }
    }
}

/// `row = softmax(row)` in place, in f32 as PyTorch's vectorised CPU softmax computes it (see
/// `sampler::softmax_at`).
pub fn softmax_in_place(features: Features, row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    let inv = 1.0 / expf::exp_sum(features, row, max);
    for v in row {
        *v = expf::expf(*v - max) * inv;
    }
}

/// Columns of the output one task of [`soft_embed`] owns.
const SOFT_EMBED_COLUMNS: usize = 64;

/// `out[r] = (sum over v of p[r][v] * table[v]) * scale` for the `rows` rows of `p` (`[rows,
/// vocab]`, probabilities), `table` `[vocab, cols]` in its stored type: the expected embedding
/// under each row's distribution. The table is streamed once: each task owns a slice of the
/// columns for every row and walks the vocabulary, so a row's sum runs in vocabulary order.
pub fn soft_embed(p: &[f32], rows: usize, table: Weights<'_>, cols: usize, scale: f32, out: &mut [f32]) {
    let vocab = p.len() / rows.max(1);
    let chunks: Vec<(usize, Vec<f32>)> = (0..cols)
        .step_by(SOFT_EMBED_COLUMNS)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|c0| {
            let width = SOFT_EMBED_COLUMNS.min(cols - c0);
            let (mut acc, mut row) = (vec![0f32; rows * width], vec![0f32; width]);
            for v in 0..vocab {
                let span = v * cols + c0..v * cols + c0 + width;
                match table {
                    Weights::F32(t) => row.copy_from_slice(&t[span]),
                    Weights::Bf16(t) => t[span].convert_to_f32_slice(&mut row),
                    Weights::F16(t) => t[span].convert_to_f32_slice(&mut row),
                }
                for (r, a) in acc.chunks_exact_mut(width).enumerate() {
                    let pv = p[r * vocab + v];
                    a.iter_mut().zip(&row).for_each(|(a, &e)| *a += pv * e);
                }
            }
            (c0, acc)
        })
        .collect();
    for (c0, acc) in chunks {
        let width = acc.len() / rows.max(1);
        for (r, a) in acc.chunks_exact(width).enumerate() {
            out[r * cols + c0..][..width].iter_mut().zip(a).for_each(|(o, &a)| *o = a * scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tanh form against its formula in f64.
    #[test]
    fn gelu_tanh_matches_the_formula() {
        for (x, want) in [(0.0f64, 0.0f64), (1.0, 0.841_191_990_608_276_8), (-1.0, -0.158_808_009_391_723_2), (3.0, 2.996_362_607_918_227), (-3.0, -0.003_637_392_081_773)] {
            let got = gelu_tanh(x as f32) as f64;
            // f32: a few ulps of the result, or of 1 + tanh where it cancels (large negative x).
            assert!((got - want).abs() <= 1e-7 + 4e-7 * want.abs(), "{x}: {got} vs {want}");
        }
    }

    #[test]
    fn softcap_bounds_and_keeps_small_values() {
        let mut v = [0.0f32, 1.0, -1.0, 1e6, -1e6];
        softcap(&mut v, 30.0);
        assert_eq!(v[0], 0.0);
        assert!((v[1] - 1.0).abs() < 1e-3 && (v[2] + 1.0).abs() < 1e-3);
        assert_eq!((v[3], v[4]), (30.0, -30.0));
    }

    /// Heads normalise to a mean square of one (before the weight), each on its own.
    #[test]
    fn norm_heads_normalises_each_head() {
        let f = crate::kernels::cpu::features();
        let mut x = vec![1.0f32, 2.0, 3.0, 4.0, 10.0, 0.0, 0.0, 0.0];
        norm_heads(f, &mut x, 4, None, 0.0);
        for h in x.chunks(4) {
            let ms: f32 = h.iter().map(|v| v * v).sum::<f32>() / 4.0;
            assert!((ms - 1.0).abs() < 1e-5, "{h:?}");
        }
        let mut y = vec![1.0f32, 2.0, 3.0, 4.0];
        norm_heads(f, &mut y, 4, Some(&[2.0, 2.0, 2.0, 2.0]), 0.0);
        assert!((y[3] - 2.0 * 4.0 / 7.5f32.sqrt()).abs() < 1e-5);
    }

    /// The expected embedding: a one-hot row picks its table row; a mixed one averages.
    #[test]
    fn soft_embed_is_the_expected_embedding() {
        let table: Vec<f32> = (0..3 * 70).map(|i| i as f32).collect();
        let p = [0.0f32, 1.0, 0.0, 0.5, 0.0, 0.5];
        let mut out = vec![0f32; 2 * 70];
        soft_embed(&p, 2, Weights::F32(&table), 70, 2.0, &mut out);
        assert_eq!(&out[..70], &table[70..140].iter().map(|v| v * 2.0).collect::<Vec<_>>()[..]);
        assert_eq!(out[70], table[0] + table[140]);
    }

    #[test]
    fn softmax_sums_to_one() {
        let f = crate::kernels::cpu::features();
        let mut row: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 7.0).collect();
        softmax_in_place(f, &mut row);
        let sum: f64 = row.iter().map(|&v| v as f64).sum();
        assert!((sum - 1.0).abs() < 1e-5 && row.iter().all(|&v| v > 0.0));
    }
}
