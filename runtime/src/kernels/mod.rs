//! Host kernels over f32 activations. Each public kernel is compiled three times (portable,
//! AVX2+FMA, AVX-512) and picks one at run time (see [`cpu`]); the results agree to rounding.

pub mod cpu;
mod x86;

use half::slice::HalfFloatSliceExt;

use crate::model::Weights;
use cpu::multiversion;

const LANES: usize = 16;

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn hsum(v: &[f32; LANES]) -> f32 {
    // Pairwise, so the vector lanes reduce in a tree.
    let mut w = *v;
    let mut n = LANES;
    while n > 1 {
        n /= 2;
        for i in 0..n {
            w[i] += w[i + n];
        }
    }
    w[0]
}

/// Dot products of `MR` rows of `x` with `NR` rows of `w`, all of length `k`, on the
/// widest vector unit the CPU has.
#[inline(always)]
fn dot_tile<const FMA: bool, const MR: usize, const NR: usize>(x: [&[f32]; MR], w: [&[f32]; NR], k: usize) -> [[f32; NR]; MR] {
    #[cfg(target_arch = "x86_64")]
    match cpu::isa() {
        // SAFETY: `isa()` reports these paths only when the CPU has their features; the
        // tiles check the slice lengths themselves.
        cpu::Isa::Avx512 => return unsafe { x86::dot_tile_avx512(x, w, k) },
        cpu::Isa::Avx2 => return unsafe { x86::dot_tile_avx2(x, w, k) },
        cpu::Isa::Portable => {}
    }
    dot_tile_portable::<FMA, MR, NR>(x, w, k)
}

/// The portable twin of the SIMD tiles.
#[inline(always)]
fn dot_tile_portable<const FMA: bool, const MR: usize, const NR: usize>(x: [&[f32]; MR], w: [&[f32]; NR], k: usize) -> [[f32; NR]; MR] {
    let x = x.map(|r| &r[..k]);
    let w = w.map(|r| &r[..k]);
    let mut acc = [[[0f32; LANES]; NR]; MR];
    let full = k / LANES * LANES;
    let mut c = 0;
    while c < full {
        for i in 0..MR {
            let xv: &[f32; LANES] = x[i][c..c + LANES].try_into().unwrap();
            for j in 0..NR {
                let wv: &[f32; LANES] = w[j][c..c + LANES].try_into().unwrap();
                for l in 0..LANES {
                    acc[i][j][l] = madd::<FMA>(xv[l], wv[l], acc[i][j][l]);
                }
            }
        }
        c += LANES;
    }
    let mut out = [[0f32; NR]; MR];
    for i in 0..MR {
        for j in 0..NR {
            let mut s = hsum(&acc[i][j]);
            for t in full..k {
                s = madd::<FMA>(x[i][t], w[j][t], s);
            }
            out[i][j] = s;
        }
    }
    out
}

/// `out[r][j] = x[r] . w[j]` for `rows` rows of `x` and the `w.len() / k` rows of `w`; `out`
/// has row stride `ldo`.
#[inline(always)]
fn matmul_block<const FMA: bool>(x: &[f32], rows: usize, k: usize, w: &[f32], out: &mut [f32], ldo: usize) {
    let n = w.len() / k;
    let xr = |r: usize| &x[r * k..(r + 1) * k];
    let wr = |j: usize| &w[j * k..(j + 1) * k];
    let mut j = 0;
    while j + 4 <= n {
        let ws = [wr(j), wr(j + 1), wr(j + 2), wr(j + 3)];
        let mut r = 0;
        while r + 4 <= rows {
            let t = dot_tile::<FMA, 4, 4>([xr(r), xr(r + 1), xr(r + 2), xr(r + 3)], ws, k);
            for (i, row) in t.iter().enumerate() {
                out[(r + i) * ldo + j..(r + i) * ldo + j + 4].copy_from_slice(row);
            }
            r += 4;
        }
        while r < rows {
            let t = dot_tile::<FMA, 1, 4>([xr(r)], ws, k);
            out[r * ldo + j..r * ldo + j + 4].copy_from_slice(&t[0]);
            r += 1;
        }
        j += 4;
    }
    while j < n {
        for r in 0..rows {
            out[r * ldo + j] = dot_tile::<FMA, 1, 1>([xr(r)], [wr(j)], k)[0][0];
        }
        j += 1;
    }
}

#[inline(always)]
fn matmul_body<const FMA: bool>(x: &[f32], rows: usize, w: Weights<'_>, k: usize, out: &mut [f32], scratch: &mut [f32]) {
    let n = match w {
        Weights::F32(s) => s.len() / k,
        Weights::Bf16(s) => s.len() / k,
        Weights::F16(s) => s.len() / k,
    };
    // Weight rows per block: converted rows stay in cache while every x row passes over them.
    let nb = (scratch.len() / k).clamp(1, n.max(1));
    let mut j0 = 0;
    while j0 < n {
        let nj = nb.min(n - j0);
        let block: &[f32] = match w {
            Weights::F32(s) => &s[j0 * k..(j0 + nj) * k],
            Weights::Bf16(s) => {
                s[j0 * k..(j0 + nj) * k].convert_to_f32_slice(&mut scratch[..nj * k]);
                &scratch[..nj * k]
            }
            Weights::F16(s) => {
                s[j0 * k..(j0 + nj) * k].convert_to_f32_slice(&mut scratch[..nj * k]);
                &scratch[..nj * k]
            }
        };
        matmul_block::<FMA>(x, rows, k, block, &mut out[j0..], n);
        j0 += nj;
    }
}

multiversion! {
    /// `out[rows, n] = x[rows, k] @ w[n, k]^T`. `scratch` holds converted weight rows when
    /// the weights are not f32 (at least `k` floats).
    pub fn matmul(x: &[f32], rows: usize, w: Weights<'_>, k: usize, out: &mut [f32], scratch: &mut [f32]) => matmul_body
}

#[inline(always)]
fn dot_body<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    dot_tile::<FMA, 1, 1>([a], [b], a.len())[0][0]
}

multiversion! {
    pub fn dot(a: &[f32], b: &[f32]) -> f32 => dot_body
}

/// Copies row `token` of the embedding table into `out` as f32.
pub fn embed_row(table: Weights<'_>, cols: usize, token: usize, out: &mut [f32]) {
    let span = token * cols..(token + 1) * cols;
    match table {
        Weights::F32(s) => out.copy_from_slice(&s[span]),
        Weights::Bf16(s) => s[span].convert_to_f32_slice(out),
        Weights::F16(s) => s[span].convert_to_f32_slice(out),
    }
}

/// LLaDA's RMSNorm, in the reference's order of operations:
/// `weight * (x * rsqrt(mean(x^2) + eps))`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let cols = weight.len();
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let ms = dot(xr, xr) / cols as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = w * (v * r);
        }
    }
}

/// Rotary embedding in place on one row of `heads` heads, half-split convention:
/// `[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]`.
pub fn rope_row(row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    for head in row.chunks_exact_mut(head_dim) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] + (-b) * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

/// `out = silu(gate) * up`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

pub fn add(acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

pub fn scale(x: &mut [f32], factor: f32) {
    for a in x {
        *a *= factor;
    }
}

/// Bidirectional attention for one query head: `out = softmax(q K^T * scale) V` over the
/// first `keys` rows of `k`/`v` (row strides `ld`, head offset already applied).
/// `scores` needs `keys` floats.
#[allow(clippy::too_many_arguments)]
pub fn attend_row(q: &[f32], k: &[f32], v: &[f32], ld: usize, keys: usize, head_dim: usize, scale: f32, scores: &mut [f32], out: &mut [f32]) {
    let mut max = f32::NEG_INFINITY;
    for j in 0..keys {
        let s = dot(q, &k[j * ld..j * ld + head_dim]) * scale;
        scores[j] = s;
        max = max.max(s);
    }
    let mut sum = 0.0;
    for s in &mut scores[..keys] {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out[..head_dim].fill(0.0);
    for j in 0..keys {
        let p = scores[j] * inv;
        for (o, &vv) in out[..head_dim].iter_mut().zip(&v[j * ld..j * ld + head_dim]) {
            *o += p * vv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    fn reference(x: &[f32], rows: usize, w: &[f32], k: usize) -> Vec<f32> {
        let n = w.len() / k;
        let mut out = vec![0.0; rows * n];
        for r in 0..rows {
            for j in 0..n {
                out[r * n + j] = (0..k).map(|t| x[r * k + t] as f64 * w[j * k + t] as f64).sum::<f64>() as f32;
            }
        }
        out
    }

    #[test]
    fn matmul_matches_reference_on_odd_shapes_and_dtypes() {
        let mut s = 7;
        for &(rows, k, n) in &[(1, 1, 1), (3, 17, 5), (7, 130, 9), (16, 64, 33)] {
            let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<f32> = (0..n * k).map(|_| lcg(&mut s)).collect();
            let wb: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
            let wb_f32: Vec<f32> = wb.iter().map(|v| v.to_f32()).collect();
            let mut scratch = vec![0.0; 4 * k];
            for (weights, wref) in [(Weights::F32(&w), &w), (Weights::Bf16(&wb), &wb_f32)] {
                let mut out = vec![0.0; rows * n];
                matmul(&x, rows, weights, k, &mut out, &mut scratch);
                for (a, b) in out.iter().zip(reference(&x, rows, wref, k)) {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{rows}x{k}x{n}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn attention_weights_sum_to_one() {
        // With all values equal to one, every output element must be one.
        let (keys, hd) = (5, 8);
        let mut s = 3;
        let q: Vec<f32> = (0..hd).map(|_| lcg(&mut s)).collect();
        let k: Vec<f32> = (0..keys * hd).map(|_| lcg(&mut s)).collect();
        let v = vec![1.0; keys * hd];
        let (mut scores, mut out) = (vec![0.0; keys], vec![0.0; hd]);
        attend_row(&q, &k, &v, hd, keys, hd, 0.5, &mut scores, &mut out);
        assert!(out.iter().all(|&o| (o - 1.0).abs() < 1e-6), "{out:?}");
    }
}
