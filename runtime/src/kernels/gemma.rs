//! The element-wise kernels DiffusionGemma's layers add to LLaDA's: the tanh-approximated
//! GELU gate, logit soft-capping, RMSNorm over heads with or without a weight, and the
//! softmax of its self-conditioning input. Each follows PyTorch's order of operations in f32.

use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::cpu::{multiversion, Features};
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
    expf::exp_scaled_in_place(features, row, max, inv);
}

/// Columns of the output one task of [`soft_embed`] owns.
const SOFT_EMBED_COLUMNS: usize = 64;
/// Rows one register tile of [`soft_embed`] accumulates (4 x 64 floats: 16 AVX-512 registers).
const SOFT_EMBED_ROWS: usize = 4;
/// Vocabulary entries whose table columns a task converts to f32 at a time (128 KiB: they
/// stay in the L2 cache while every row tile passes over them).
const SOFT_EMBED_VOCAB_BLOCK: usize = 512;

/// `a * b + c`: fused where the instruction set has it (as the GEMM kernels fuse), else a
/// product then a sum.
#[inline(always)]
fn multiply_add<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn accumulate_block_body<const FMA: bool>(_: Features, acc: &mut [f32], block: &[f32], p: &[f32], vocab: usize, v0: usize) {
    let width = block.len() / SOFT_EMBED_VOCAB_BLOCK.min(vocab - v0);
    let rows = acc.len() / width;
    let mut r0 = 0;
    if width == SOFT_EMBED_COLUMNS {
        // Whole tiles: their sums in registers across the block.
        while r0 + SOFT_EMBED_ROWS <= rows {
            let mut tile = [[0f32; SOFT_EMBED_COLUMNS]; SOFT_EMBED_ROWS];
            for (r, t) in tile.iter_mut().enumerate() {
                t.copy_from_slice(&acc[(r0 + r) * width..][..width]);
            }
            for (i, table_row) in block.chunks_exact(SOFT_EMBED_COLUMNS).enumerate() {
                let table_row: &[f32; SOFT_EMBED_COLUMNS] = table_row.try_into().expect("a whole row");
                for (r, t) in tile.iter_mut().enumerate() {
                    let pv = p[(r0 + r) * vocab + v0 + i];
                    for (a, &e) in t.iter_mut().zip(table_row) {
                        *a = multiply_add::<FMA>(pv, e, *a);
                    }
                }
            }
            for (r, t) in tile.iter().enumerate() {
                acc[(r0 + r) * width..][..width].copy_from_slice(t);
            }
            r0 += SOFT_EMBED_ROWS;
        }
    }
    for r in r0..rows {
        let a = &mut acc[r * width..][..width];
        for (i, table_row) in block.chunks_exact(width).enumerate() {
            let pv = p[r * vocab + v0 + i];
            a.iter_mut().zip(table_row).for_each(|(a, &e)| *a = multiply_add::<FMA>(pv, e, *a));
        }
    }
}

multiversion! {
    /// `acc[r] += sum over i of p[r][v0 + i] * block[i]` for every row `r` of `acc`, `i` in
    /// increasing order (`block` holds table rows `v0..` of `acc`'s width, converted to f32).
    fn accumulate_block(features: Features, acc: &mut [f32], block: &[f32], p: &[f32], vocab: usize, v0: usize) => accumulate_block_body
}

/// `out[r] = (sum over v of p[r][v] * table[v]) * scale` for the `rows` rows of `p` (`[rows,
/// vocab]`, probabilities), `table` `[vocab, cols]` in its stored type: the expected embedding
/// under each row's distribution. The table is streamed once: each task owns a slice of the
/// columns for every row and walks the vocabulary in blocks, so a row's sum runs in vocabulary
/// order (the blocking changes no bit; fused multiply-adds where the CPU has them).
pub fn soft_embed(p: &[f32], rows: usize, table: Weights<'_>, cols: usize, scale: f32, out: &mut [f32]) {
    let vocab = p.len() / rows.max(1);
    let features = super::cpu::features();
    let chunks: Vec<(usize, Vec<f32>)> = (0..cols)
        .step_by(SOFT_EMBED_COLUMNS)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|c0| {
            let width = SOFT_EMBED_COLUMNS.min(cols - c0);
            let (mut acc, mut block) = (vec![0f32; rows * width], vec![0f32; SOFT_EMBED_VOCAB_BLOCK * width]);
            for v0 in (0..vocab).step_by(SOFT_EMBED_VOCAB_BLOCK) {
                let n = SOFT_EMBED_VOCAB_BLOCK.min(vocab - v0);
                for (i, row) in block[..n * width].chunks_exact_mut(width).enumerate() {
                    let span = (v0 + i) * cols + c0..(v0 + i) * cols + c0 + width;
                    match table {
                        Weights::F32(t) => row.copy_from_slice(&t[span]),
                        Weights::Bf16(t) => t[span].convert_to_f32_slice(row),
                        Weights::F16(t) => t[span].convert_to_f32_slice(row),
                    }
                }
                accumulate_block(features, &mut acc, &block[..n * width], p, vocab, v0);
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
    fn soft_embed_sums_in_vocabulary_order_bit_for_bit() {
        // Whole tiles and leftover rows, whole chunks and a narrow one, three vocabulary blocks.
        let (rows, cols, vocab) = (9, 130, 1100);
        let mut seed = 5u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let table: Vec<half::bf16> = (0..vocab * cols).map(|_| half::bf16::from_f32(next())).collect();
        let p: Vec<f32> = (0..rows * vocab).map(|_| next().abs() * 1e-3).collect();
        let mut out = vec![0f32; rows * cols];
        soft_embed(&p, rows, Weights::Bf16(&table), cols, 0.75, &mut out);
        for r in 0..rows {
            for c in 0..cols {
                let fused = crate::kernels::cpu::features().isa() != crate::kernels::cpu::Isa::Portable;
                let sum = (0..vocab).fold(0f32, |s, v| {
                    let (pv, e) = (p[r * vocab + v], table[v * cols + c].to_f32());
                    if fused { pv.mul_add(e, s) } else { s + pv * e }
                });
                assert_eq!(out[r * cols + c].to_bits(), (sum * 0.75).to_bits(), "row {r} column {c}");
            }
        }
    }

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

/// `cargo test --release -p llada-rt --lib kernels::gemma::bench -- --ignored --nocapture`:
/// the self-conditioning product's rate (printed, never asserted).
#[cfg(test)]
mod bench {
    use super::*;

    #[test]
    #[ignore = "a benchmark"]
    fn soft_embed_rate() {
        let (rows, cols, vocab) = (256, 2816, 16_384);
        let table: Vec<half::bf16> = (0..vocab * cols).map(|i| half::bf16::from_f32(((i * 7) % 13) as f32 * 0.01)).collect();
        let p: Vec<f32> = (0..rows * vocab).map(|i| ((i * 11) % 17) as f32 * 1e-5).collect();
        let mut out = vec![0f32; rows * cols];
        for _ in 0..3 {
            let start = std::time::Instant::now();
            soft_embed(&p, rows, Weights::Bf16(&table), cols, 1.0, &mut out);
            let s = start.elapsed().as_secs_f64();
            eprintln!("soft_embed {rows} x {vocab} x {cols}: {s:.3} s, {:.1} GFLOP/s ({} threads)", 2.0 * (rows * vocab * cols) as f64 / s / 1e9, rayon::current_num_threads());
        }
    }
}
