//! Bidirectional attention of the query heads of a fused q|k|v matrix against a KV cache:
//! for every query row and head, `softmax(q K^T / sqrt(head_dim)) V` over the cache's first
//! `keys` positions. Scores are computed four queries by four keys at a time, so each loaded
//! vector serves four dot products. The work is split into units of one query head and up to
//! four rows, which threads share without locks (see [`Out`]).

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
    /// Scores are `q . k * scale` (`1 / sqrt(head_dim)` in most models; DiffusionGemma's 1).
    pub scale: f32,
    /// Threads taking the call's units in turn: a thread's next unit is likely this many on
    /// (the lanes path prefetches its first keys and values).
    pub threads: usize,
}

/// Offset of a head plane in one layer's KV cache, which holds `2 * kv_heads` planes of
/// `[capacity, head_dim]`: key heads, then value heads. Head-major, so the keys one query
/// head scans are contiguous (position-major rows, 2 * kv_heads * head_dim floats apart, put
/// every key of a head in the same L1 sets, a multiple of 4 KiB apart).
pub fn kv_plane(plane: usize, capacity: usize, head_dim: usize) -> usize {
    plane * capacity * head_dim
}

/// Stores the key and value heads of every real row of `qkv` (rows `sh.width` floats wide,
/// `sh.heads` query heads first) at the row's position in one layer's head planes (of
/// `sh.capacity` positions).
pub fn store_kv(qkv: &[f32], sh: &Shape, positions: &[u32], planes: &mut [f32]) {
    let hd = sh.head_dim;
    for (from, at) in kv_moves(sh, positions) {
        planes[at..at + hd].copy_from_slice(&qkv[from..][..hd]);
    }
}

/// [`store_kv`] into a 16-bit cache (f16 or bf16 bits, rounded to nearest even).
pub fn store_kv_half(qkv: &[f32], sh: &Shape, positions: &[u32], planes: &mut [u16], dtype: llada_ir::KvDType) {
    let hd = sh.head_dim;
    for (from, at) in kv_moves(sh, positions) {
        super::narrow_half(&qkv[from..][..hd], dtype, &mut planes[at..at + hd]);
    }
}

/// Where [`store_kv`] puts each head: (offset in `qkv`, offset in the planes) of every key
/// and value head of every row, plane by plane.
fn kv_moves<'a>(sh: &'a Shape, positions: &'a [u32]) -> impl Iterator<Item = (usize, usize)> + 'a {
    let hd = sh.head_dim;
    (0..2 * sh.kv_heads).flat_map(move |plane| {
        let (from, base) = ((sh.heads + plane) * hd, kv_plane(plane, sh.capacity, hd));
        positions.iter().enumerate().map(move |(r, &p)| (r * sh.width + from, base + p as usize * hd))
    })
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

/// One attention call's operands: the `rows` query rows of `qkv` (with their own keys and
/// values where `own` says so) against the head planes `kv`, of shape `shape`.
#[derive(Clone, Copy)]
pub struct Call<'a> {
    pub qkv: &'a [f32],
    pub kv: &'a [f32],
    pub shape: Shape,
    pub own: OwnKv<'a>,
    pub rows: usize,
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

/// Query rows per unit of work on the dot-product path: the score tile's rows (each loaded
/// key feeds this many dot products, each loaded value this many multiply-adds).
pub const UNIT_ROWS: usize = 4;

/// Whether this CPU and head shape take the AVX-512 kernel with the query rows in vector lanes
/// (`x86_attention`: units of one head and up to 32 rows), else the dot-product path.
#[cfg(target_arch = "x86_64")]
fn lanes_path(features: super::cpu::Features, sh: &Shape) -> bool {
    features.isa() == super::cpu::Isa::Avx512 && sh.head_dim % 16 == 0 && sh.head_dim <= super::x86_attention::MAX_HEAD_DIM
}

/// Query rows per unit of work on the path `features` takes for `sh`.
fn unit_rows(features: super::cpu::Features, sh: &Shape) -> usize {
    #[cfg(target_arch = "x86_64")]
    if lanes_path(features, sh) {
        return super::x86_attention::ROWS;
    }
    let _ = (features, sh);
    UNIT_ROWS
}

/// The units of work of an attention call over `rows` query rows (see [`attend`]): one query
/// head and a group of rows each, head-major.
pub fn units(features: super::cpu::Features, sh: &Shape, rows: usize) -> usize {
    sh.heads * rows.div_ceil(unit_rows(features, sh))
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Softmax of `s` in place, `s = exp(s - max) / sum`, with weights below [`NEGLIGIBLE`] set
/// to zero. The maximum and the sum run in 16 lanes, so both vectorise.
#[inline(always)]
fn softmax_body<const FMA: bool>(s: &mut [f32]) {
    let mut top = [f32::NEG_INFINITY; 16];
    let mut chunks = s.chunks_exact(16);
    for c in &mut chunks {
        for (m, &v) in top.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = chunks.remainder().iter().fold(top.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)), |m, &v| m.max(v));
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
    // Keys this far below the best one add nothing an f32 output can hold, and their
    // products would be subnormal, which costs the FPU dearly: zero them.
    for v in s.iter_mut() {
        let p = *v * inv;
        *v = if p < NEGLIGIBLE { 0.0 } else { p };
    }
}

/// The output of one attention call, `[rows, heads * head_dim]`, shared by the threads that
/// compute its units: each unit writes the head slices of its own rows, which no other unit
/// writes (so the threads need no lock and the output no split into contiguous chunks).
#[derive(Clone, Copy)]
pub struct Out {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: an `Out` is only written through `put`, whose callers write disjoint ranges (one
// unit per (head, row group), each unit on one thread); `new` borrows the slice mutably for
// as long as the call that shares it.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    pub fn new(out: &mut [f32]) -> Out {
        Out { ptr: out.as_mut_ptr(), len: out.len() }
    }

    /// Writes `v` at `at`.
    ///
    /// # Safety
    /// No other thread reads or writes `at..at + v.len()` during the call that shares this
    /// `Out` (the units are disjoint), and the slice given to `new` outlives it.
    #[inline(always)]
    unsafe fn put(&self, at: usize, v: &[f32]) {
        assert!(at + v.len() <= self.len, "attention output out of bounds");
        // SAFETY: in bounds (asserted); exclusive by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), self.ptr.add(at), v.len()) };
    }
}

multiversion! {
    /// Attention for units `units` (of [`units`]) of the call's `rows` query rows of `qkv`
    /// against the first `keys` rows of each plane of `kv`. Units are head-major: unit `u` is query head
    /// `u / groups` for the rows of group `u % groups` (groups of 32 rows on the AVX-512
    /// lanes path, else of [`UNIT_ROWS`]); splitting the units between threads keeps both busy
    /// even for a single row. `scores` holds at least `UNIT_ROWS * keys` floats (the
    /// dot-product path's). Compiled per instruction set as a whole, so the per-key helpers
    /// inline.
    pub fn attend(features: Features, call: &Call, units: std::ops::Range<usize>, out: Out, scores: &mut [f32]) => attend_body
}

#[inline(always)]
fn attend_body<const FMA: bool>(features: super::cpu::Features, call: &Call, units: std::ops::Range<usize>, out: Out, scores: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if lanes_path(features, &call.shape) {
        return attend_lanes(call, units, out);
    }
    let (rows, groups) = (call.rows, call.rows.div_ceil(UNIT_ROWS));
    // Four vectors of values per query row on AVX-512 (64 floats: 16 sums and room for the
    // loads in its 32 registers; head shapes the lanes path does not take), two on AVX2 (16
    // floats of its 16 registers).
    let wide = features.isa() == super::cpu::Isa::Avx512;
    for u in units {
        let (h, i0) = (u / groups, UNIT_ROWS * (u % groups));
        let m = UNIT_ROWS.min(rows - i0);
        macro_rules! unit {
            ($m:literal) => {
                if wide {
                    attend_unit::<FMA, $m, 64>(features, call, h, i0, out, scores)
                } else {
                    attend_unit::<FMA, $m, 16>(features, call, h, i0, out, scores)
                }
            };
        }
        match m {
            1 => unit!(1),
            2 => unit!(2),
            3 => unit!(3),
            _ => unit!(4),
        }
    }
}

/// [`attend`]'s units on the AVX-512 lanes path: query head `h` for up to 32 rows at a time.
#[cfg(target_arch = "x86_64")]
fn attend_lanes(call: &Call, units: std::ops::Range<usize>, out: Out) {
    let Call { qkv, kv, shape: sh, own, rows } = *call;
    use super::x86_attention::{attend_rows, HeadKv, OwnRow, ROWS};
    let hd = sh.head_dim;
    let (group, groups) = (sh.heads / sh.kv_heads, rows.div_ceil(ROWS));
    let scale = sh.scale;
    let out_width = sh.heads * hd;
    let row = |r: usize, off: usize| &qkv[r * sh.width + off..r * sh.width + off + hd];
    for u in units {
        let (h, r0) = (u / groups, ROWS * (u % groups));
        let n = ROWS.min(rows - r0);
        let kv_head = h / group;
        let q: [&[f32]; ROWS] = std::array::from_fn(|i| row(r0 + i.min(n - 1), h * hd));
        let owns: [Option<OwnRow>; ROWS] = std::array::from_fn(|i| {
            let p = (i < n).then(|| own.position(r0 + i)).flatten().filter(|&p| p < sh.keys)?;
            Some(OwnRow { position: p, key: row(r0 + i, (sh.heads + kv_head) * hd), value: row(r0 + i, (sh.heads + sh.kv_heads + kv_head) * hd) })
        });
        let k = &kv[kv_plane(kv_head, sh.capacity, hd)..][..sh.keys * hd];
        let v = &kv[kv_plane(sh.kv_heads + kv_head, sh.capacity, hd)..][..sh.keys * hd];
        let head = HeadKv { k, v, head_dim: hd, keys: sh.keys };
        // The unit this thread likely takes next (units go to the threads in turn): its first
        // keys and values, fetched during this unit's last key block.
        let later = u + sh.threads.max(1);
        let after = (later < sh.heads * groups).then(|| {
            let kv_head = later / groups / group;
            let first = super::x86_attention::KEY_BLOCK.min(sh.keys) * hd;
            (&kv[kv_plane(kv_head, sh.capacity, hd)..][..first], &kv[kv_plane(sh.kv_heads + kv_head, sh.capacity, hd)..][..first])
        });
        // SAFETY: row r0 + i's slice of head h is this unit's alone (see `Out`).
        let emit = |i: usize, o: &[f32]| unsafe { out.put((r0 + i) * out_width + h * hd, o) };
        // SAFETY: the lanes path is taken only where the CPU has AVX-512F.
        unsafe {
            if n > 16 {
                attend_rows::<2>(&q[..n], head, scale, &owns[..n], after, emit)
            } else {
                attend_rows::<1>(&q[..n], head, scale, &owns[..n], after, emit)
            }
        }
    }
}

/// Query head `h` for the `M` rows from `i0`: scores of every row against every key (four
/// keys at a time), softmax, then `P V` in slices of `V` head dimensions with the rows' sums
/// in registers.
#[inline(always)]
fn attend_unit<const FMA: bool, const M: usize, const V: usize>(features: super::cpu::Features, call: &Call, h: usize, i0: usize, out: Out, scores: &mut [f32]) {
    let Call { qkv, kv, shape: sh, own, .. } = *call;
    let hd = sh.head_dim;
    let out_width = sh.heads * hd;
    let group = sh.heads / sh.kv_heads;
    let scale = sh.scale;
    let keys = sh.keys;
    let row = |r: usize, off: usize| &qkv[r * sh.width + off..r * sh.width + off + hd];
    let cached = |r: usize, plane: usize| &kv[plane + r * hd..plane + (r + 1) * hd];
    let (q_off, k_off, v_off) = (h * hd, kv_plane(h / group, sh.capacity, hd), kv_plane(sh.kv_heads + h / group, sh.capacity, hd));
    let q: [&[f32]; M] = std::array::from_fn(|i| row(i0 + i, q_off));
    let mut j = 0;
    while j < keys {
        let n = 4.min(keys - j);
        let k: [&[f32]; 4] = std::array::from_fn(|t| cached(j + t.min(n - 1), k_off));
        let tile = dot_tile::<FMA, M, 4>(features, q, k, hd);
        for (i, t) in tile.iter().enumerate() {
            for (s, &v) in scores[i * keys + j..][..n].iter_mut().zip(t) {
                *s = v * scale;
            }
        }
        j += n;
    }
    // Rows using their own key and value: their score at their own position, and (after the
    // softmax) that weight, applied to their own value after `P V`.
    let own_at: [Option<usize>; M] = std::array::from_fn(|i| own.position(i0 + i).filter(|&p| p < keys));
    let mut own_weight = [0f32; M];
    for i in 0..M {
        if let Some(p) = own_at[i] {
            let k = row(i0 + i, (sh.heads + h / group) * hd);
            scores[i * keys + p] = q[i].iter().zip(k).fold(0.0, |a, (&x, &y)| madd::<FMA>(x, y, a)) * scale;
        }
    }
    for i in 0..M {
        let s = &mut scores[i * keys..(i + 1) * keys];
        softmax_body::<FMA>(s);
        if let Some(p) = own_at[i] {
            own_weight[i] = std::mem::take(&mut s[p]);
        }
    }
    // out = P V, `V` head dimensions at a time (a remainder one by one), each value slice
    // loaded feeding the `M` rows' sums.
    let p: [&[f32]; M] = std::array::from_fn(|i| &scores[i * keys..(i + 1) * keys]);
    let values = &kv[v_off..v_off + keys * hd];
    let full = hd / V * V;
    let mut c0 = 0;
    while c0 < hd {
        let w = if c0 < full { V } else { 1 };
        let mut acc = [[0f32; V]; M];
        if w == V {
            acc = weighted_values::<FMA, M, V>(features, p, values, hd, c0);
        } else {
            for (j, row) in values.chunks_exact(hd).enumerate() {
                for i in 0..M {
                    acc[i][0] = madd::<FMA>(p[i][j], row[c0], acc[i][0]);
                }
            }
        }
        for (i, a) in acc.iter_mut().enumerate() {
            if own_at[i].is_some() {
                let v = &row(i0 + i, (sh.heads + sh.kv_heads + h / group) * hd)[c0..c0 + w];
                for (x, &y) in a.iter_mut().zip(v) {
                    *x = madd::<FMA>(own_weight[i], y, *x);
                }
            }
            // SAFETY: row i0 + i's slice of head h is this unit's alone (see `Out`).
            unsafe { out.put((i0 + i) * out_width + q_off + c0, &a[..w]) };
        }
        c0 += w;
    }
}

/// `sum over keys j of p[i][j] * values[j][c0..c0 + V]` for each of the `M` rows (`values`
/// holds `p[i].len()` rows of `hd`). Its own function, with its bounds checked before the
/// loop, so the sums stay in registers (a check inside the loop makes the compiler store
/// them at every key, for the panic's sake).
#[inline(always)]
fn weighted_values<const FMA: bool, const M: usize, const V: usize>(features: super::cpu::Features, p: [&[f32]; M], values: &[f32], hd: usize, c0: usize) -> [[f32; V]; M] {
    let _ = features;
    let keys = values.len() / hd;
    assert!(c0 + V <= hd && p.iter().all(|r| r.len() >= keys));
    let p = p.map(|r| &r[..keys]);
    let mut acc = [[0f32; V]; M];
    // `j` from a range of `keys` (not an enumeration) lets the compiler drop the checks on
    // `p[i][j]`.
    for (row, j) in values.chunks_exact(hd).zip(0..keys) {
        let v: &[f32; V] = row[c0..c0 + V].try_into().unwrap();
        for i in 0..M {
            let pj = p[i][j];
            for d in 0..V {
                acc[i][d] = madd::<FMA>(pj, v[d], acc[i][d]);
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row's output has the same bits whether it is computed alone or in a unit with
    /// others (its sums run in one order whatever the unit's rows), on every path this CPU
    /// has, with keys not a whole number of score tiles or key blocks; head dimensions with
    /// and without a tail past whole vectors (40: the dot-product path on AVX-512 too), and
    /// wide enough for 64-column `P V`; 7 rows (one vector of lanes) and 21 (two).
    #[test]
    fn a_row_is_the_same_bits_whatever_rows_share_its_unit() {
        for (hd, rows) in [(40, 7), (80, 7), (80, 21), (128, 21)] {
            a_row_is_the_same_bits_alone(hd, rows);
        }
    }

    fn a_row_is_the_same_bits_alone(hd: usize, rows: usize) {
        let (heads, keys) = (3, 37);
        let width = 3 * heads * hd;
        let mut s = 11u64;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        };
        let qkv: Vec<f32> = (0..rows * width).map(|_| rnd()).collect();
        let kv: Vec<f32> = (0..2 * heads * keys * hd).map(|_| rnd()).collect();
        let sh = Shape { width, capacity: keys, heads, kv_heads: heads, head_dim: hd, keys, scale: 1.0 / (hd as f32).sqrt(), threads: 1 };
        let mut scores = vec![0f32; UNIT_ROWS * keys];
        use super::super::cpu::{FeatureRequest, Features};
        let avx2 = Features::request(FeatureRequest::level("avx2").expect("a level"));
        for features in [super::super::cpu::features(), avx2, Features::PORTABLE] {
            let mut all = vec![0f32; rows * heads * hd];
            attend(features, &Call { qkv: &qkv, kv: &kv, shape: sh, own: OwnKv::NONE, rows }, 0..units(features, &sh, rows), Out::new(&mut all), &mut scores);
            for r in 0..rows {
                let mut alone = vec![0f32; heads * hd];
                attend(features, &Call { qkv: &qkv[r * width..(r + 1) * width], kv: &kv, shape: sh, own: OwnKv::NONE, rows: 1 }, 0..units(features, &sh, 1), Out::new(&mut alone), &mut scores);
                assert!(alone.iter().zip(&all[r * heads * hd..]).all(|(a, b)| a.to_bits() == b.to_bits()), "row {r} differs alone ({})", features.describe());
            }
        }
    }

    /// Grouped-query attention against a double-precision reference, on the dot-product path
    /// (head dimension 8: 6 query rows against 11 of 16 cached positions) and, where the CPU
    /// has AVX-512, the lanes path (head dimension 32: 6 rows, one vector of lanes, and 21,
    /// two, against 37 of 40 positions, three key blocks); cache rows past the context hold
    /// garbage that must not leak. Rows from the fifth did not store: each sees its own key
    /// and value at its position.
    #[test]
    fn attends_to_the_cached_context_only() {
        attends_to_the_context(8, 6, 11, 16, &[0, 1, 2, 3, 7, 2]);
        attends_to_the_context(32, 6, 37, 40, &[0, 1, 2, 3, 36, 17]);
        let mut positions: Vec<u32> = (0..21).collect();
        positions[4..].iter_mut().enumerate().for_each(|(i, p)| *p = (i as u32 * 7 + 3) % 37);
        attends_to_the_context(32, 21, 37, 40, &positions);
    }

    fn attends_to_the_context(hd: usize, rows: usize, keys: usize, capacity: usize, positions: &[u32]) {
        let (heads, kv_heads) = (4, 2);
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
        let sh = Shape { width, capacity, heads, kv_heads, head_dim: hd, keys, scale: 1.0 / (hd as f32).sqrt(), threads: 2 };
        let mut out = vec![0f32; rows * heads * hd];
        let mut scores = vec![0f32; UNIT_ROWS * keys];
        let (features, portable_features) = (super::super::cpu::features(), super::super::cpu::Features::PORTABLE);
        let call = Call { qkv: &qkv, kv: &kv, shape: sh, own: OwnKv { from_row: 4, positions }, rows };
        attend(features, &call, 0..units(features, &sh, rows), Out::new(&mut out), &mut scores);
        // The portable twin (unfused, scalar order) of the dispatched kernel.
        let mut twin = vec![0f32; rows * heads * hd];
        let portable_units = 0..units(portable_features, &sh, rows);
        attend_body::<false>(portable_features, &call, portable_units.clone(), Out::new(&mut twin), &mut scores);
        for (i, (&a, &b)) in out.iter().zip(&twin).enumerate() {
            assert!((a - b).abs() < 1e-5, "[{i}]: {a} vs portable twin {b}");
        }
        // The features given reach the kernel: the portable set runs the twin, bit for bit.
        let mut portable = vec![0f32; rows * heads * hd];
        attend(portable_features, &call, portable_units, Out::new(&mut portable), &mut scores);
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
