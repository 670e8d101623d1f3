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
    /// Positions per head plane of the KV cache (see [`kv_plane`]).
    pub capacity: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Cache positions attended to.
    pub keys: usize,
}

/// Offset of a head plane in one layer's KV cache, which holds `2 * kv_heads` planes of
/// `[capacity, head_dim]`: key heads, then value heads. Head-major, so the keys one query
/// head scans are contiguous (position-major rows, 2 * kv_heads * head_dim floats apart, put
/// every key of a head in the same L1 sets, a multiple of 4 KiB apart).
pub fn kv_plane(plane: usize, capacity: usize, head_dim: usize) -> usize {
    plane * capacity * head_dim
}

/// Stores the key and value heads of every real row of `qkv` (rows `width` floats wide,
/// `heads` query heads first) at the row's position in one layer's head planes.
#[allow(clippy::too_many_arguments)]
pub fn store_kv(qkv: &[f32], width: usize, heads: usize, kv_heads: usize, hd: usize, capacity: usize, positions: &[u32], planes: &mut [f32]) {
    for plane in 0..2 * kv_heads {
        let (from, base) = ((heads + plane) * hd, kv_plane(plane, capacity, hd));
        for (r, &p) in positions.iter().enumerate() {
            let at = base + p as usize * hd;
            planes[at..at + hd].copy_from_slice(&qkv[r * width + from..][..hd]);
        }
    }
}

/// [`store_kv`] into a 16-bit cache (f16 or bf16 bits, rounded to nearest even).
#[allow(clippy::too_many_arguments)]
pub fn store_kv_half(qkv: &[f32], width: usize, heads: usize, kv_heads: usize, hd: usize, capacity: usize, positions: &[u32], planes: &mut [u16], dtype: llada_ir::KvDType) {
    for plane in 0..2 * kv_heads {
        let (from, base) = ((heads + plane) * hd, kv_plane(plane, capacity, hd));
        for (r, &p) in positions.iter().enumerate() {
            let at = base + p as usize * hd;
            super::narrow_half(&qkv[r * width + from..][..hd], dtype, &mut planes[at..at + hd]);
        }
    }
}

/// Query rows that did not store their keys and values (speculative rows, revision checks,
/// padding): row `r >= from_row` of the q|k|v matrix attends with its own key and value at its
/// position `positions[r]` instead of the cache's, as if it had stored them, without changing
/// what other rows see there.
#[derive(Clone, Copy)]
pub struct OwnKv<'a> {
    pub from_row: usize,
    pub positions: &'a [u32],
}

impl OwnKv<'_> {
    /// Every row stored its keys and values.
    pub const NONE: OwnKv<'static> = OwnKv { from_row: usize::MAX, positions: &[] };

    fn position(&self, row: usize) -> Option<usize> {
        (row >= self.from_row).then(|| self.positions[row] as usize)
    }
}

/// Attention weights below this (2^-100) are skipped: against the largest weight (at least
/// 1 / keys) they are below f32 resolution by far.
const NEGLIGIBLE: f32 = 7.888_609e-31;

/// Head dimensions per register block of the `P V` product (two 16-lane vectors per row).
const V_CHUNK: usize = 32;

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
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
    pub fn attend(features: Features, qkv: &[f32], kv: &[f32], sh: Shape, own: OwnKv, first: usize, out: &mut [f32], scores: &mut [f32]) => attend_body
}

#[inline(always)]
fn attend_body<const FMA: bool>(features: super::cpu::Features, qkv: &[f32], kv: &[f32], sh: Shape, own: OwnKv, first: usize, out: &mut [f32], scores: &mut [f32]) {
    let hd = sh.head_dim;
    let out_width = sh.heads * hd;
    let rows = out.len() / out_width;
    let group = sh.heads / sh.kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let keys = sh.keys;
    let row = |r: usize, off: usize| &qkv[r * sh.width + off..r * sh.width + off + hd];
    let cached = |r: usize, plane: usize| &kv[plane + r * hd..plane + (r + 1) * hd];
    for h in 0..sh.heads {
        let (q_off, k_off, v_off) = (h * hd, kv_plane(h / group, sh.capacity, hd), kv_plane(sh.kv_heads + h / group, sh.capacity, hd));
        for i0 in (0..rows).step_by(4) {
            let m = 4.min(rows - i0);
            // Scores of up to four queries against every key.
            let q: [&[f32]; 4] = std::array::from_fn(|i| row(first + i0 + i.min(m - 1), q_off));
            let mut j = 0;
            while j < keys {
                let n = 4.min(keys - j);
                let k: [&[f32]; 4] = std::array::from_fn(|t| cached(j + t.min(n - 1), k_off));
                let tile = dot_tile::<FMA, 4, 4>(features, q, k, hd);
                for i in 0..m {
                    for t in 0..n {
                        scores[i * keys + j + t] = tile[i][t] * scale;
                    }
                }
                j += n;
            }
            // Rows using their own key and value: their score at their own position, and
            // (after the softmax) that weight, applied to their own value after `P V`.
            let own_at: [Option<usize>; 4] = std::array::from_fn(|i| if i < m { own.position(first + i0 + i).filter(|&p| p < keys) } else { None });
            let mut own_weight = [0f32; 4];
            for i in 0..m {
                if let Some(p) = own_at[i] {
                    let k = row(first + i0 + i, (sh.heads + h / group) * hd);
                    scores[i * keys + p] = q[i].iter().zip(k).fold(0.0, |a, (&x, &y)| madd::<FMA>(x, y, a)) * scale;
                }
            }
            for i in 0..m {
                let s = &mut scores[i * keys..(i + 1) * keys];
                softmax_body::<FMA>(s);
                // Keys this far below the best one add nothing an f32 output can hold, and
                // their products would be subnormal, which costs the FPU dearly: zero them.
                s.iter_mut().filter(|p| **p < NEGLIGIBLE).for_each(|p| *p = 0.0);
                if let Some(p) = own_at[i] {
                    own_weight[i] = std::mem::take(&mut s[p]);
                }
            }
            // out = P V, a slice of head dimensions at a time with the up-to-four query rows'
            // sums in registers, so each value row loaded feeds four multiply-adds.
            let p: [&[f32]; 4] = std::array::from_fn(|i| &scores[i.min(m - 1) * keys..(i.min(m - 1) + 1) * keys]);
            let mut c0 = 0;
            while c0 < hd {
                let w = V_CHUNK.min(hd - c0);
                let mut acc = [[0f32; V_CHUNK]; 4];
                for jj in 0..keys {
                    let v = &cached(jj, v_off)[c0..c0 + w];
                    if w == V_CHUNK {
                        let v: &[f32; V_CHUNK] = v.try_into().unwrap();
                        for (a, pi) in acc.iter_mut().zip(&p) {
                            let pj = pi[jj];
                            for (x, &y) in a.iter_mut().zip(v) {
                                *x = madd::<FMA>(pj, y, *x);
                            }
                        }
                    } else {
                        for (a, pi) in acc.iter_mut().zip(&p) {
                            let pj = pi[jj];
                            for (x, &y) in a.iter_mut().zip(v) {
                                *x = madd::<FMA>(pj, y, *x);
                            }
                        }
                    }
                }
                for (i, a) in acc.iter_mut().enumerate().take(m) {
                    if own_at[i].is_some() {
                        let v = &row(first + i0 + i, (sh.heads + sh.kv_heads + h / group) * hd)[c0..c0 + w];
                        for (x, &y) in a.iter_mut().zip(v) {
                            *x = madd::<FMA>(own_weight[i], y, *x);
                        }
                    }
                    let at = (i0 + i) * out_width + q_off + c0;
                    out[at..at + w].copy_from_slice(&a[..w]);
                }
                c0 += w;
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
        let planes = 2 * kv_heads;
        let mut s = 3u64;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let qkv: Vec<f32> = (0..rows * width).map(|_| rnd()).collect();
        let mut kv: Vec<f32> = (0..planes * capacity * hd).map(|_| rnd()).collect();
        for plane in 0..planes {
            for v in &mut kv[kv_plane(plane, capacity, hd) + keys * hd..kv_plane(plane + 1, capacity, hd)] {
                *v = 1e6;
            }
        }
        let at = |plane: usize, j: usize, d: usize| kv[kv_plane(plane, capacity, hd) + j * hd + d] as f64;
        let sh = Shape { width, capacity, heads, kv_heads, head_dim: hd, keys };
        let mut out = vec![0f32; rows * heads * hd];
        let mut scores = vec![0f32; 4 * keys];
        // Rows 4 and 5 did not store: each sees its own key and value at its position.
        let positions = [0u32, 1, 2, 3, 7, 2];
        attend(super::super::cpu::features(), &qkv, &kv, sh, OwnKv { from_row: 4, positions: &positions }, 0, &mut out, &mut scores);
        // The portable twin (unfused, scalar order) of the dispatched kernel.
        let mut twin = vec![0f32; rows * heads * hd];
        attend_body::<false>(super::super::cpu::Features::PORTABLE, &qkv, &kv, sh, OwnKv { from_row: 4, positions: &positions }, 0, &mut twin, &mut scores);
        for (i, (&a, &b)) in out.iter().zip(&twin).enumerate() {
            assert!((a - b).abs() < 1e-5, "[{i}]: {a} vs portable twin {b}");
        }
        // The features given reach the kernel: the portable set runs the twin, bit for bit.
        let mut portable = vec![0f32; rows * heads * hd];
        attend(super::super::cpu::Features::PORTABLE, &qkv, &kv, sh, OwnKv { from_row: 4, positions: &positions }, 0, &mut portable, &mut scores);
        assert_eq!(portable, twin);
        for r in 0..rows {
            for h in 0..heads {
                let g = h / (heads / kv_heads);
                let q = &qkv[r * width + h * hd..][..hd];
                let own = |plane: usize, d: usize| qkv[r * width + (heads + plane) * hd + d] as f64;
                let key = |j: usize, d: usize| if r >= 4 && j == positions[r] as usize { own(g, d) } else { at(g, j, d) };
                let value = |j: usize, d: usize| if r >= 4 && j == positions[r] as usize { own(kv_heads + g, d) } else { at(kv_heads + g, j, d) };
                let logits: Vec<f64> = (0..keys).map(|j| (0..hd).map(|d| q[d] as f64 * key(j, d)).sum::<f64>() / (hd as f64).sqrt()).collect();
                let max = logits.iter().cloned().fold(f64::MIN, f64::max);
                let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
                for d in 0..hd {
                    let want: f64 = (0..keys).map(|j| (logits[j] - max).exp() / sum * value(j, d)).sum();
                    let got = out[r * heads * hd + h * hd + d] as f64;
                    assert!((got - want).abs() < 1e-5, "row {r} head {h} dim {d}: {got} vs {want}");
                }
            }
        }
    }
}
