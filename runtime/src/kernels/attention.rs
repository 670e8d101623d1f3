//! Bidirectional attention of the query heads of a fused q|k|v matrix against a KV cache:
//! for every query row and head, `softmax(q K^T / sqrt(head_dim)) V` over the cache's first
//! `keys` positions. Scores are computed four queries by four keys at a time, so each loaded
//! vector serves four dot products.

use super::{cpu::multiversion, dot_tile};

/// Shape of one attention call.
#[derive(Clone, Copy)]
pub struct Shape {
    /// Width of a q|k|v row: `(heads + 2 * kv_heads) * head_dim`.
    pub width: usize,
    /// Width of a KV cache row: `2 * kv_heads * head_dim` (keys, then values).
    pub kv_width: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Cache positions attended to.
    pub keys: usize,
}

/// `out += p * v` over a row.
#[inline(always)]
fn axpy_body<const FMA: bool>(p: f32, v: &[f32], out: &mut [f32]) {
    for (o, &x) in out.iter_mut().zip(v) {
        *o = if FMA { p.mul_add(x, *o) } else { p * x + *o };
    }
}

/// Softmax of `s` in place: `s = exp(s - max) / sum`.
#[inline(always)]
fn softmax_body<const FMA: bool>(s: &mut [f32]) {
    let max = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut lanes = [0f32; 16];
    let mut chunks = s.chunks_exact_mut(16);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v = super::exp(*v - max);
            *l += *v;
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for v in chunks.into_remainder() {
        *v = super::exp(*v - max);
        sum += *v;
    }
    let inv = 1.0 / sum;
    s.iter_mut().for_each(|v| *v *= inv);
}

multiversion! {
    /// Attention for query rows `first..first + out.len() / (heads * head_dim)` of `qkv`
    /// against the first `keys` rows of `kv`. `scores` holds at least `4 * keys` floats.
    /// Compiled per instruction set as a whole, so the per-key helpers inline.
    pub fn attend(qkv: &[f32], kv: &[f32], sh: Shape, first: usize, out: &mut [f32], scores: &mut [f32]) => attend_body
}

#[inline(always)]
fn attend_body<const FMA: bool>(qkv: &[f32], kv: &[f32], sh: Shape, first: usize, out: &mut [f32], scores: &mut [f32]) {
    let hd = sh.head_dim;
    let out_width = sh.heads * hd;
    let rows = out.len() / out_width;
    let group = sh.heads / sh.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let keys = sh.keys;
    let row = |r: usize, off: usize| &qkv[r * sh.width + off..r * sh.width + off + hd];
    let cached = |r: usize, off: usize| &kv[r * sh.kv_width + off..r * sh.kv_width + off + hd];
    for h in 0..sh.heads {
        let (q_off, k_off, v_off) = (h * hd, (h / group) * hd, (sh.kv_heads + h / group) * hd);
        for i0 in (0..rows).step_by(4) {
            let m = 4.min(rows - i0);
            // Scores of up to four queries against every key.
            let q: [&[f32]; 4] = std::array::from_fn(|i| row(first + i0 + i.min(m - 1), q_off));
            let mut j = 0;
            while j < keys {
                let n = 4.min(keys - j);
                let k: [&[f32]; 4] = std::array::from_fn(|t| cached(j + t.min(n - 1), k_off));
                let tile = dot_tile::<FMA, 4, 4>(q, k, hd);
                for i in 0..m {
                    for t in 0..n {
                        scores[i * keys + j + t] = tile[i][t] * scale;
                    }
                }
                j += n;
            }
            for i in 0..m {
                let s = &mut scores[i * keys..(i + 1) * keys];
                softmax_body::<FMA>(s);
                let o = &mut out[(i0 + i) * out_width + q_off..(i0 + i) * out_width + q_off + hd];
                o.fill(0.0);
                for (jj, &p) in s.iter().enumerate() {
                    axpy_body::<FMA>(p, cached(jj, v_off), o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Grouped-query attention of 6 query rows against 11 of 16 cached positions, against a
    /// double-precision reference; cache rows past the context hold garbage that must not leak.
    #[test]
    fn attends_to_the_cached_context_only() {
        let (heads, kv_heads, hd, rows, keys, capacity) = (4, 2, 8, 6, 11, 16);
        let width = (heads + 2 * kv_heads) * hd;
        let kv_width = 2 * kv_heads * hd;
        let mut s = 3u64;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let qkv: Vec<f32> = (0..rows * width).map(|_| rnd()).collect();
        let mut kv: Vec<f32> = (0..capacity * kv_width).map(|_| rnd()).collect();
        for v in &mut kv[keys * kv_width..] {
            *v = 1e6;
        }
        let sh = Shape { width, kv_width, heads, kv_heads, head_dim: hd, keys };
        let mut out = vec![0f32; rows * heads * hd];
        let mut scores = vec![0f32; 4 * keys];
        attend(&qkv, &kv, sh, 0, &mut out, &mut scores);
        for r in 0..rows {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let q = &qkv[r * width + h * hd..][..hd];
                let logits: Vec<f64> = (0..keys)
                    .map(|j| (0..hd).map(|d| q[d] as f64 * kv[j * kv_width + g * hd + d] as f64).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..keys).map(|j| (logits[j] - max).exp() / sum * kv[j * kv_width + (kv_heads + g) * hd + d] as f64).sum();
                    let got = out[r * heads * hd + h * hd + d] as f64;
                    assert!((got - want).abs() < 1e-5, "row {r} head {h} dim {d}: {got} vs {want}");
                }
            }
        }
    }
}
