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
