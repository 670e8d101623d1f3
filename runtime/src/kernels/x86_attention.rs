//! Attention on AVX-512 with the query rows in the vector lanes: up to 32 rows of one head
//! (two vectors of 16 lanes) against the cached keys and values, the keys in blocks of 16
//! with an online softmax (the running maximum and sum of each row, its output rescaled when
//! the maximum grows), so the whole call needs a few fixed buffers on the stack.
//!
//! Why lanes for rows: a score is then one fused multiply-add per input and row, a key's
//! element broadcast against 16 rows' query elements at once, with no horizontal reduction,
//! and `P V` broadcasts each weight against a key's value vectors. Both run at close to the
//! FMA units' rate on the row counts a decoding step computes, where dot products of four
//! rows by four keys (the kernel this replaced) spent a third of their time reducing lanes.
//!
//! Each row's arithmetic is its own lane's (or its own loop's), in an order fixed by the key
//! positions, so a row's output has the same bits whatever rows share its call.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;
use std::mem::MaybeUninit;

/// Most query rows one call takes: two vectors of lanes.
pub const ROWS: usize = 32;
/// Largest head dimension one call takes (its buffers are on the stack).
pub const MAX_HEAD_DIM: usize = 256;
/// Keys per online-softmax block: its keys' and values' rows stay in L1 while every row's
/// scores and sums use them.
pub const KEY_BLOCK: usize = 32;
/// Keys per score tile (register accumulators: `SCORE_KEYS x RV` vectors).
const SCORE_KEYS: usize = 8;
// A block's score tiles issue a 64-byte prefetch per input each: per input as many bytes as
// the next block's keys and values hold (2 * KEY_BLOCK floats), so the lines cover them.
const _: () = assert!(KEY_BLOCK / SCORE_KEYS * 64 == 2 * KEY_BLOCK * 4);
/// Attention weights below this (2^-100) are dropped, as `attention` drops them: their
/// products would be subnormal, which costs the FPU dearly, and add nothing an f32 can hold.
const NEGLIGIBLE: f32 = 7.888_609e-31;

/// A query row that attends with its own key and value at `position` instead of the cache's
/// (see `attention::OwnKv`).
#[derive(Clone, Copy)]
pub struct OwnRow<'a> {
    pub position: usize,
    pub key: &'a [f32],
    pub value: &'a [f32],
}

/// `kernels::exp` of each lane: the scalar function, which the compiler vectorises here.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512) -> __m512 {
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` holds 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), x) };
    for v in &mut lanes {
        *v = super::exp(*v);
    }
    // SAFETY: as above.
    unsafe { _mm512_loadu_ps(lanes.as_ptr()) }
}

/// The 16 x 16 transpose of `m` (row `i`, lane `j` to row `j`, lane `i`), in four rounds of
/// two-source shuffles.
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(m: [__m512; 16]) -> [__m512; 16] {
    // Pairs of rows interleaved by element, then by pairs of elements: block k of b[4g + c]
    // then holds column 4k + c of rows 4g..4g + 4.
    let mut a = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_ps(m[2 * i], m[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(m[2 * i], m[2 * i + 1]);
    }
    let mut b = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        for h in 0..2 {
            let (x, y) = (_mm512_castps_pd(a[4 * i + h]), _mm512_castps_pd(a[4 * i + 2 + h]));
            b[4 * i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            b[4 * i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    }
    // Gather the blocks of a column: blocks 0 and 2 (0x88), or 1 and 3 (0xdd), of two row
    // groups, then the same of two such pairs, which leaves rows 0..16 in order.
    let mut c = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        for i in 0..2 {
            let (x, y) = (b[8 * i + k], b[8 * i + 4 + k]);
            c[8 * i + k] = _mm512_shuffle_f32x4::<0x88>(x, y);
            c[8 * i + 4 + k] = _mm512_shuffle_f32x4::<0xdd>(x, y);
        }
    }
    let mut t = [_mm512_setzero_ps(); 16];
    for k in 0..4 {
        for h in 0..2 {
            let (x, y) = (c[4 * h + k], c[8 + 4 * h + k]);
            t[k + 4 * h] = _mm512_shuffle_f32x4::<0x88>(x, y);
            t[k + 8 + 4 * h] = _mm512_shuffle_f32x4::<0xdd>(x, y);
        }
    }
    t
}

/// One key-value head's cached rows: the first `keys` rows of `k` and `v`, `head_dim` floats
/// each.
#[derive(Clone, Copy)]
pub struct HeadKv<'a> {
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub head_dim: usize,
    pub keys: usize,
}

/// Attention of the `q.len()` (at most `16 * RV`) query rows of one head: row `i`'s output,
/// `softmax(q[i] K^T * scale) V` over the keys and values of `kv`, with its own key and value
/// at its position where `own[i]` says so, is given to `emit(i, row)`. `after` (keys and
/// values, at most [`KEY_BLOCK`] rows each) is prefetched during the last key block, for the
/// call that likely follows.
///
/// # Safety
/// The CPU must support AVX-512F. (Every slice is bounds-checked here.)
#[target_feature(enable = "avx512f")]
pub unsafe fn attend_rows<const RV: usize>(q: &[&[f32]], kv: HeadKv, scale: f32, own: &[Option<OwnRow>], after: Option<(&[f32], &[f32])>, mut emit: impl FnMut(usize, &[f32])) {
    let HeadKv { k, v, head_dim: hd, keys } = kv;
    let (n, lanes) = (q.len(), 16 * RV);
    assert!(RV <= 2 && n <= lanes && own.len() == n && hd % 16 == 0 && hd <= MAX_HEAD_DIM, "attention block shape");
    assert!(keys >= 1 && k.len() >= keys * hd && v.len() >= keys * hd && q.iter().all(|r| r.len() >= hd), "attention block bounds");
    assert!(own.iter().flatten().all(|o| o.position < keys && o.key.len() >= hd && o.value.len() >= hd), "attention own rows");
    let mut qt = MaybeUninit::<[f32; ROWS * MAX_HEAD_DIM]>::uninit();
    let mut sb = MaybeUninit::<[f32; KEY_BLOCK * ROWS]>::uninit();
    let mut ob = MaybeUninit::<[f32; ROWS * MAX_HEAD_DIM]>::uninit();
    let ws = Workspace { qt: qt.as_mut_ptr() as *mut f32, sb: sb.as_mut_ptr() as *mut f32, ob: ob.as_mut_ptr() as *mut f32, lanes, n, hd };
    // SAFETY (every raw access below, and the helpers' given `ws`): `qt` and `ob` hold ROWS *
    // MAX_HEAD_DIM floats and are addressed below hd * lanes and n * hd (hd <= MAX_HEAD_DIM,
    // lanes <= ROWS); `sb` holds KEY_BLOCK * ROWS and is addressed below KEY_BLOCK * lanes;
    // keys and values are read below keys * hd (asserted). Every float is written before it
    // is read.
    unsafe {
        ws.transpose_queries::<RV>(q);
        std::ptr::write_bytes(ws.ob, 0, n * hd);
    }
    let mut softmax = OnlineSoftmax::<RV>::new();
    let mut alpha = [0f32; ROWS];
    for kb in (0..keys).step_by(KEY_BLOCK) {
        let nk = KEY_BLOCK.min(keys - kb);
        // SAFETY: see above.
        unsafe { ws.block_scores::<RV>(k, kb, nk, scale, NextBlock::following(kv, kb, after)) };
        // A row with its own key at a position of this block: its score there, by the same
        // fused multiply-adds in the same order as a lane's.
        for (i, o) in own_in_block(own, kb, nk) {
            let dot = q[i][..hd].iter().zip(&o.key[..hd]).fold(0f32, |a, (&x, &y)| x.mul_add(y, a));
            // SAFETY: see above.
            unsafe { *ws.sb.add((o.position - kb) * lanes + i) = dot * scale };
        }
        // SAFETY: see above.
        unsafe { softmax.weigh(ws, nk, &mut alpha) };
        // A row's own position takes its weight out of the cache's value row; its own value
        // gets it after the block's `P V`.
        let mut own_weight = [0f32; ROWS];
        for (i, o) in own_in_block(own, kb, nk) {
            // SAFETY: see above.
            unsafe { own_weight[i] = std::mem::replace(&mut *ws.sb.add((o.position - kb) * lanes + i), 0.0) };
        }
        // SAFETY: see above; the value rows of the block are below keys * hd.
        unsafe { ws.weighted_values(&v[kb * hd..], nk, &alpha) };
        for (i, o) in own_in_block(own, kb, nk) {
            for (d, &y) in o.value[..hd].iter().enumerate() {
                // SAFETY: see above.
                unsafe { *ws.ob.add(i * hd + d) = own_weight[i].mul_add(y, *ws.ob.add(i * hd + d)) };
            }
        }
    }
    let inv = softmax.inverse_sums();
    let mut row = [0f32; MAX_HEAD_DIM];
    for i in 0..n {
        for c in (0..hd).step_by(16) {
            // SAFETY: see above; `row` holds MAX_HEAD_DIM >= hd floats.
            unsafe { _mm512_storeu_ps(row.as_mut_ptr().add(c), _mm512_mul_ps(_mm512_loadu_ps(ws.ob.add(i * hd + c)), _mm512_set1_ps(inv[i]))) };
        }
        emit(i, &row[..hd]);
    }
}

/// The rows of `own` whose own position is in the key block `kb..kb + nk`.
fn own_in_block<'a>(own: &'a [Option<OwnRow<'a>>], kb: usize, nk: usize) -> impl Iterator<Item = (usize, OwnRow<'a>)> + 'a {
    own.iter().enumerate().filter_map(move |(i, o)| o.filter(|o| (kb..kb + nk).contains(&o.position)).map(|o| (i, o)))
}

/// [`attend_rows`]' buffers (on its stack) and shape: the `n` query rows transposed,
/// `qt[hd][lanes]` (lanes past `n` zero); a key block's scores, then weights,
/// `sb[KEY_BLOCK][lanes]`; the rows' unnormalised outputs `ob[n][hd]`.
#[derive(Clone, Copy)]
struct Workspace {
    qt: *mut f32,
    sb: *mut f32,
    ob: *mut f32,
    lanes: usize,
    n: usize,
    hd: usize,
}

/// The lines to fetch while a key block computes: the next block's keys, then its values,
/// `bytes` of each. From memory, a head's planes otherwise arrive at the pace of the hardware
/// prefetcher finding the stream.
#[derive(Clone, Copy)]
struct NextBlock {
    keys: *const u8,
    values: *const u8,
    bytes: usize,
}

impl NextBlock {
    /// What follows key block `kb` of `kv`: its next block, or after the last one `after`.
    fn following(kv: HeadKv, kb: usize, after: Option<(&[f32], &[f32])>) -> Option<NextBlock> {
        let HeadKv { k, v, head_dim: hd, keys } = kv;
        if kb + KEY_BLOCK < keys {
            let rows = KEY_BLOCK.min(keys - kb - KEY_BLOCK) * hd;
            Some(NextBlock { keys: k[(kb + KEY_BLOCK) * hd..][..rows].as_ptr() as *const u8, values: v[(kb + KEY_BLOCK) * hd..][..rows].as_ptr() as *const u8, bytes: rows * 4 })
        } else {
            after.map(|(k, v)| {
                let rows = k.len().min(v.len()).min(KEY_BLOCK * hd);
                NextBlock { keys: k.as_ptr() as *const u8, values: v.as_ptr() as *const u8, bytes: rows * 4 }
            })
        }
    }

    /// Fetches line `line` of the keys, then of the values; nothing past them.
    #[inline(always)]
    fn fetch(&self, line: usize) {
        // SAFETY: prefetching never faults (the addresses are inside the slices anyway).
        unsafe {
            if line < self.bytes {
                _mm_prefetch::<_MM_HINT_T0>(self.keys.add(line) as *const i8);
            } else if line < 2 * self.bytes {
                _mm_prefetch::<_MM_HINT_T0>(self.values.add(line - self.bytes) as *const i8);
            }
        }
    }
}

impl Workspace {
    /// `qt` from the query rows `q` (at most `lanes`), 16 rows by 16 elements at a time.
    ///
    /// # Safety
    /// AVX-512F; `qt` as described on the type; every row of `q` holds `hd` floats.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose_queries<const RV: usize>(&self, q: &[&[f32]]) {
        let (qt, lanes, hd) = (self.qt, self.lanes, self.hd);
        // SAFETY: the caller's contract.
        unsafe {
            for r in 0..RV {
                for d0 in (0..hd).step_by(16) {
                    let mut block = [_mm512_setzero_ps(); 16];
                    for (i, x) in block.iter_mut().enumerate() {
                        if let Some(row) = q.get(16 * r + i) {
                            *x = _mm512_loadu_ps(row.as_ptr().add(d0));
                        }
                    }
                    let block = transpose16(block);
                    for (j, &x) in block.iter().enumerate() {
                        _mm512_storeu_ps(qt.add((d0 + j) * lanes + 16 * r), x);
                    }
                }
            }
        }
    }

    /// `sb` = the scores of the `nk` keys of `k` from `kb`, times `scale`: a tile of
    /// SCORE_KEYS keys at a time (a short last tile repeats its last key, not stored), each
    /// input of a tile fetching a line of `next` (4 * hd lines in all).
    ///
    /// # Safety
    /// AVX-512F; the buffers as described on the type; `k` holds rows `kb..kb + nk`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn block_scores<const RV: usize>(&self, k: &[f32], kb: usize, nk: usize, scale: f32, next: Option<NextBlock>) {
        let (qt, sb, lanes, hd) = (self.qt, self.sb, self.lanes, self.hd);
        for g in (0..nk).step_by(SCORE_KEYS) {
            let ng = SCORE_KEYS.min(nk - g);
            let mut kp = [k.as_ptr(); SCORE_KEYS];
            for (t, p) in kp.iter_mut().enumerate() {
                *p = k[(kb + g + t.min(ng - 1)) * hd..].as_ptr();
            }
            let mut acc = [[_mm512_setzero_ps(); RV]; SCORE_KEYS];
            // SAFETY: the caller's contract; kp[t] + d is below (kb + nk) * hd.
            unsafe {
                for d in 0..hd {
                    if let Some(next) = next {
                        // Line g / SCORE_KEYS * hd + d of the next block's keys, then values.
                        next.fetch(64 * ((g / SCORE_KEYS) * hd + d));
                    }
                    let mut qv = [_mm512_setzero_ps(); RV];
                    for (r, x) in qv.iter_mut().enumerate() {
                        *x = _mm512_loadu_ps(qt.add(d * lanes + 16 * r));
                    }
                    for (t, a) in acc.iter_mut().enumerate() {
                        let kv = _mm512_set1_ps(*kp[t].add(d));
                        for r in 0..RV {
                            a[r] = _mm512_fmadd_ps(kv, qv[r], a[r]);
                        }
                    }
                }
                for (t, a) in acc.iter().enumerate().take(ng) {
                    for r in 0..RV {
                        _mm512_storeu_ps(sb.add((g + t) * lanes + 16 * r), _mm512_mul_ps(a[r], _mm512_set1_ps(scale)));
                    }
                }
            }
        }
    }

    /// `o[i] = o[i] * alpha[i] + sum over t < nk of w[t][i] * v[t]` for the `n` rows: the
    /// block's weights `sb`, its value rows `v` (`nk` rows of `hd`), the outputs `ob`; four
    /// rows and up to four vectors of columns at a time, so each value vector loaded feeds
    /// four rows.
    ///
    /// # Safety
    /// AVX-512F; the buffers as described on the type; `hd` is a multiple of 16.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn weighted_values(&self, v: &[f32], nk: usize, alpha: &[f32; ROWS]) {
        let (n, hd) = (self.n, self.hd);
        for i0 in (0..n).step_by(4) {
            let mut c0 = 0;
            while c0 < hd {
                // SAFETY: the caller's contract.
                unsafe {
                    match ((n - i0).min(4), (hd - c0) / 16) {
                        (1, 1..=3) => self.rows_by_cols::<1, 1>(i0, c0, v, nk, alpha),
                        (2, 1..=3) => self.rows_by_cols::<2, 1>(i0, c0, v, nk, alpha),
                        (3, 1..=3) => self.rows_by_cols::<3, 1>(i0, c0, v, nk, alpha),
                        (_, 1..=3) => self.rows_by_cols::<4, 1>(i0, c0, v, nk, alpha),
                        (1, _) => self.rows_by_cols::<1, 4>(i0, c0, v, nk, alpha),
                        (2, _) => self.rows_by_cols::<2, 4>(i0, c0, v, nk, alpha),
                        (3, _) => self.rows_by_cols::<3, 4>(i0, c0, v, nk, alpha),
                        _ => self.rows_by_cols::<4, 4>(i0, c0, v, nk, alpha),
                    }
                }
                c0 += if hd - c0 >= 64 { 64 } else { 16 };
            }
        }
    }

    /// [`Workspace::weighted_values`] for rows `i0..i0 + MR` and columns `c0..c0 + 16 * VC`.
    ///
    /// # Safety
    /// As [`Workspace::weighted_values`], with those rows and columns inside it.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn rows_by_cols<const MR: usize, const VC: usize>(&self, i0: usize, c0: usize, v: &[f32], nk: usize, alpha: &[f32; ROWS]) {
        let (w, lanes, hd, o) = (self.sb as *const f32, self.lanes, self.hd, self.ob);
        // SAFETY: the caller's contract.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); VC]; MR];
            for (i, a) in acc.iter_mut().enumerate() {
                let scale = _mm512_set1_ps(alpha[i0 + i]);
                for (c, x) in a.iter_mut().enumerate() {
                    *x = _mm512_mul_ps(_mm512_loadu_ps(o.add((i0 + i) * hd + c0 + 16 * c)), scale);
                }
            }
            for t in 0..nk {
                let row = v.as_ptr().add(t * hd + c0);
                let mut vv = [_mm512_setzero_ps(); VC];
                for (c, x) in vv.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(row.add(16 * c));
                }
                for (i, a) in acc.iter_mut().enumerate() {
                    let p = _mm512_set1_ps(*w.add(t * lanes + i0 + i));
                    for c in 0..VC {
                        a[c] = _mm512_fmadd_ps(p, vv[c], a[c]);
                    }
                }
            }
            for (i, a) in acc.iter().enumerate() {
                for (c, &x) in a.iter().enumerate() {
                    _mm512_storeu_ps(o.add((i0 + i) * hd + c0 + 16 * c), x);
                }
            }
        }
    }
}

/// The online softmax's state: each row's running maximum score and sum of weights over the
/// key blocks so far, row `16 * r + i` in lane `i` of vector `r`.
struct OnlineSoftmax<const RV: usize> {
    max: [__m512; RV],
    sum: [__m512; RV],
}

impl<const RV: usize> OnlineSoftmax<RV> {
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        OnlineSoftmax { max: [_mm512_set1_ps(f32::NEG_INFINITY); RV], sum: [_mm512_setzero_ps(); RV] }
    }

    /// Takes in a block's `nk` scores (`sb`): the new maximum, the rescaling of the old sums
    /// (and, by the caller, outputs) into `alpha`, and the block's weights exp(score -
    /// maximum) in place of the scores, each row's summed in key order.
    ///
    /// # Safety
    /// AVX-512F; `ws.sb` holds the block's scores as described on [`Workspace`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn weigh(&mut self, ws: Workspace, nk: usize, alpha: &mut [f32; ROWS]) {
        let (sb, lanes) = (ws.sb, ws.lanes);
        let (max, sum) = (&mut self.max, &mut self.sum);
        let mut top = *max;
        // SAFETY: the caller's contract; `alpha` holds ROWS >= 16 * RV floats.
        unsafe {
            for t in 0..nk {
                for r in 0..RV {
                    top[r] = _mm512_max_ps(top[r], _mm512_loadu_ps(sb.add(t * lanes + 16 * r)));
                }
            }
            for r in 0..RV {
                let a = exp16(_mm512_sub_ps(max[r], top[r]));
                let a = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, _mm512_set1_ps(NEGLIGIBLE)), a);
                sum[r] = _mm512_mul_ps(sum[r], a);
                _mm512_storeu_ps(alpha.as_mut_ptr().add(16 * r), a);
                max[r] = top[r];
            }
            for t in 0..nk {
                for r in 0..RV {
                    let at = sb.add(t * lanes + 16 * r);
                    let p = exp16(_mm512_sub_ps(_mm512_loadu_ps(at), max[r]));
                    let p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(p, _mm512_set1_ps(NEGLIGIBLE)), p);
                    sum[r] = _mm512_add_ps(sum[r], p);
                    _mm512_storeu_ps(at, p);
                }
            }
        }
    }

    /// `1 / sum` of each row.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn inverse_sums(&self) -> [f32; ROWS] {
        let mut inv = [0f32; ROWS];
        for r in 0..RV {
            // SAFETY: `inv` holds ROWS >= 16 * RV floats.
            unsafe { _mm512_storeu_ps(inv.as_mut_ptr().add(16 * r), _mm512_div_ps(_mm512_set1_ps(1.0), self.sum[r])) };
        }
        inv
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose16_transposes() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512 here");
            return;
        }
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut t = [0f32; 256];
        // SAFETY: AVX-512F detected above; `m` and `t` hold 16 rows of 16 floats.
        unsafe {
            let rows: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(m.as_ptr().add(16 * i)));
            for (j, v) in transpose16(rows).iter().enumerate() {
                _mm512_storeu_ps(t.as_mut_ptr().add(16 * j), *v);
            }
        }
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(t[16 * j + i], m[16 * i + j], "[{i}][{j}]");
            }
        }
    }

    #[test]
    fn exp16_has_the_bits_of_exp() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512 here");
            return;
        }
        let mut xs: Vec<f32> = (-2000..2000).map(|i| i as f32 * 0.0511).collect();
        xs.extend([-1000.0, -87.3, -87.29, 0.0, -0.0, 88.2, 88.3, 1000.0, f32::NEG_INFINITY, 1e-30, -1e-30]);
        for chunk in xs.chunks(16) {
            let mut lanes = [0f32; 16];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let mut got = [0f32; 16];
            // SAFETY: AVX-512F detected above; both arrays hold 16 floats.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(lanes.as_ptr()))) };
            for (x, g) in lanes.iter().zip(got) {
                assert_eq!(g.to_bits(), super::super::exp(*x).to_bits(), "exp({x})");
            }
        }
    }
}
