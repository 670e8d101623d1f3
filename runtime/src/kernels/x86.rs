//! x86-64 SIMD versions of the f32 dot-product tile. Same contract as the portable
//! `dot_tile`: dot products of `MR` rows of `x` with `NR` rows of `w`, each of length `k`.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

pub use super::tile::{Prefetch, QuantPanels, QuantRows, Spread, TileOut, TILE_ROWS};

/// AVX-512: 16 lanes, up to 4x4 independent accumulators.
///
/// # Safety
/// The CPU must support AVX-512F; every slice must hold at least `k` floats.
#[target_feature(enable = "avx512f")]
pub unsafe fn dot_tile_avx512<const MR: usize, const NR: usize>(x: [&[f32]; MR], w: [&[f32]; NR], k: usize) -> [[f32; NR]; MR] {
    for s in x.iter().chain(w.iter()) {
        assert!(s.len() >= k);
    }
    let mut acc = [[_mm512_setzero_ps(); NR]; MR];
    let full = k / 16 * 16;
    let mut c = 0;
    while c < full {
        // SAFETY: c + 16 <= full <= k <= every slice's length (asserted above).
        unsafe {
            let wv: [__m512; NR] = std::array::from_fn(|j| _mm512_loadu_ps(w[j].as_ptr().add(c)));
            for i in 0..MR {
                let xv = _mm512_loadu_ps(x[i].as_ptr().add(c));
                for j in 0..NR {
                    acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
        }
        c += 16;
    }
    let mut out = [[0f32; NR]; MR];
    for i in 0..MR {
        // Four sums at once where the tile is four wide (attention's), else one at a time.
        let sums: [f32; NR] = if NR == 4 {
            let r = reduce_add_4([acc[i][0], acc[i][1 % NR], acc[i][2 % NR], acc[i][3 % NR]]);
            std::array::from_fn(|j| r[j])
        } else {
            std::array::from_fn(|j| _mm512_reduce_add_ps(acc[i][j]))
        };
        for j in 0..NR {
            out[i][j] = super::dot_tail::<true>(x[i], w[j], full, k, sums[j]);
        }
    }
    out
}

/// The lane sums of four vectors, each added in `_mm512_reduce_add_ps`'s order (lane `i`
/// plus lane `i + 8`, then `i + 4`, `i + 2`, `i + 1`), so a dot product has the same bits
/// whatever shares its tile, in 13 instructions where four reductions take 32: the vectors
/// are folded together, two halves at a time.
#[target_feature(enable = "avx512f")]
fn reduce_add_4([a, b, c, d]: [__m512; 4]) -> [f32; 4] {
    // 128-bit blocks [a0 a1 b0 b1] + [a2 a3 b2 b3]: lanes 0-7 hold a's i + (i + 8), 8-15 b's.
    let ab = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xee>(a, b));
    let cd = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(c, d), _mm512_shuffle_f32x4::<0xee>(c, d));
    // Block k holds vector k's i + (i + 4) for i in 0..4.
    let abcd = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(ab, cd), _mm512_shuffle_f32x4::<0xdd>(ab, cd));
    // Within each block: i + (i + 2), then i + (i + 1); lane 0 of block k is vector k's sum.
    let t = _mm512_add_ps(abcd, _mm512_permute_ps::<0x4e>(abcd));
    let u = _mm512_add_ps(t, _mm512_permute_ps::<0xb1>(t));
    let sums = _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), u));
    let mut out = [0f32; 4];
    // SAFETY: `out` holds four floats.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), sums) };
    out
}

/// AVX2 + FMA: 8 lanes.
///
/// # Safety
/// The CPU must support AVX2 and FMA; every slice must hold at least `k` floats.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot_tile_avx2<const MR: usize, const NR: usize>(x: [&[f32]; MR], w: [&[f32]; NR], k: usize) -> [[f32; NR]; MR] {
    for s in x.iter().chain(w.iter()) {
        assert!(s.len() >= k);
    }
    let mut acc = [[_mm256_setzero_ps(); NR]; MR];
    let full = k / 8 * 8;
    let mut c = 0;
    while c < full {
        // SAFETY: c + 8 <= full <= k <= every slice's length (asserted above).
        unsafe {
            let wv: [__m256; NR] = std::array::from_fn(|j| _mm256_loadu_ps(w[j].as_ptr().add(c)));
            for i in 0..MR {
                let xv = _mm256_loadu_ps(x[i].as_ptr().add(c));
                for j in 0..NR {
                    acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
        }
        c += 8;
    }
    let mut out = [[0f32; NR]; MR];
    for i in 0..MR {
        for j in 0..NR {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[i][j]) };
            let s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
            out[i][j] = super::dot_tail::<true>(x[i], w[j], full, k, s);
        }
    }
    out
}

impl TileOut {
    /// Writes or accumulates one 16-column vector.
    ///
    /// # Safety
    /// `ptr` must address `rows` rows of `ldo` floats from which the tile's columns are
    /// writable by this thread alone (the GEMM driver gives each task its own columns).
    #[inline(always)]
    unsafe fn put(&self, i: usize, j: usize, nr: usize, v: __m512) {
        if i >= self.rows {
            return;
        }
        let cols = self.cols(j, nr);
        let mask: __mmask16 = if cols == 16 { 0xffff } else { (1u16 << cols) - 1 };
        // SAFETY: inside the tile the caller owns (see above); masked past the last column.
        unsafe {
            let p = self.ptr.add(i * self.ldo + 16 * j);
            let v = if self.first { v } else { _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, p)) };
            _mm512_mask_storeu_ps(p, mask, v);
        }
    }
}

impl TileOut {
    /// Writes or accumulates a whole tile of float sums.
    ///
    /// # Safety
    /// As [`TileOut::put`].
    #[inline(always)]
    unsafe fn put_tile<const NR: usize>(&self, acc: &[[__m512; NR]; TILE_ROWS]) {
        for (i, row) in acc.iter().enumerate() {
            for (j, &a) in row.iter().enumerate() {
                // SAFETY: the caller's contract.
                unsafe { self.put(i, j, NR, a) };
            }
        }
    }
}

/// One input step of the f32-activation tiles: `acc[i] += x[i * stride] * w` for the four
/// rows, each activation broadcast across the `NR` weight vectors.
///
/// # Safety
/// AVX-512F; `x` addresses 4 rows of `stride` floats.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fma_step<const NR: usize>(acc: &mut [[__m512; NR]; TILE_ROWS], x: *const f32, stride: usize, w: &[__m512; NR]) {
    for (i, row) in acc.iter_mut().enumerate() {
        // SAFETY: the caller's contract.
        let xv = _mm512_set1_ps(unsafe { *x.add(i * stride) });
        for (a, &wj) in row.iter_mut().zip(w) {
            *a = _mm512_fmadd_ps(xv, wj, *a);
        }
    }
}

/// f32 panels: `out[4 x 16*NR] (+)= x[4, kc] . W`, `kc` inputs from `x` and each panel at
/// the chunk's first input.
///
/// # Safety
/// AVX-512F. `x` holds 4 rows of `stride` floats with at least `kc` from its start; each
/// panel pointer addresses `kc` steps of 16 floats; `out` as in [`TileOut::put`].
#[target_feature(enable = "avx512f")]
pub unsafe fn tile_f32<const NR: usize>(x: *const f32, stride: usize, w: [*const u8; NR], kc: usize, out: &TileOut, pf: Prefetch<NR>) {
    let mut acc = [[_mm512_setzero_ps(); NR]; TILE_ROWS];
    let mut pf = Spread::new(pf, kc);
    for kk in 0..kc {
        pf.step();
        // SAFETY: kk < kc, inside the ranges the caller vouches for.
        unsafe {
            let wv: [__m512; NR] = std::array::from_fn(|j| _mm512_loadu_ps((w[j] as *const f32).add(16 * kk)));
            fma_step(&mut acc, x.add(kk), stride, &wv);
        }
    }
    // SAFETY: see the function's contract.
    unsafe { out.put_tile(&acc) };
}

/// f16 panels, widened on the fly. Contract as [`tile_f32`] with 16 halves per step.
///
/// # Safety
/// As [`tile_f32`].
#[target_feature(enable = "avx512f")]
pub unsafe fn tile_f16<const NR: usize>(x: *const f32, stride: usize, w: [*const u8; NR], kc: usize, out: &TileOut, pf: Prefetch<NR>) {
    let mut acc = [[_mm512_setzero_ps(); NR]; TILE_ROWS];
    let mut pf = Spread::new(pf, kc);
    for kk in 0..kc {
        pf.step();
        // SAFETY: inside the ranges the caller vouches for.
        unsafe {
            let wv: [__m512; NR] = std::array::from_fn(|j| _mm512_cvtph_ps(_mm256_loadu_si256(w[j].add(32 * kk) as *const __m256i)));
            fma_step(&mut acc, x.add(kk), stride, &wv);
        }
    }
    // SAFETY: see the function's contract.
    unsafe { out.put_tile(&acc) };
}

/// bf16 panels against f32 activations (the exact path: f32 products and sums, only the
/// weights rounded): each 64-byte step holds two inputs of 16 columns, the even input in the
/// low half of every 32-bit lane and the odd one in the high half, so a shift and a mask
/// widen them. `pairs` input pairs; `x` rows hold `2 * pairs` floats (zero past K).
///
/// # Safety
/// As [`tile_f32`], with each panel pointer addressing `pairs` steps of 64 bytes.
#[target_feature(enable = "avx512f")]
pub unsafe fn tile_bf16_f32<const NR: usize>(x: *const f32, stride: usize, w: [*const u8; NR], pairs: usize, out: &TileOut, pf: Prefetch<NR>) {
    let mut acc = [[_mm512_setzero_ps(); NR]; TILE_ROWS];
    let high = _mm512_set1_epi32(0xffff_0000u32 as i32);
    let mut pf = Spread::new(pf, pairs);
    for p in 0..pairs {
        pf.step();
        // SAFETY: inside the ranges the caller vouches for.
        unsafe {
            let wv: [__m512i; NR] = std::array::from_fn(|j| _mm512_loadu_si512(w[j].add(64 * p) as *const __m512i));
            let even: [__m512; NR] = std::array::from_fn(|j| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wv[j])));
            fma_step(&mut acc, x.add(2 * p), stride, &even);
            let odd: [__m512; NR] = std::array::from_fn(|j| _mm512_castsi512_ps(_mm512_and_si512(wv[j], high)));
            fma_step(&mut acc, x.add(2 * p + 1), stride, &odd);
        }
    }
    // SAFETY: see the function's contract.
    unsafe { out.put_tile(&acc) };
}

/// bf16 panels with `vdpbf16ps`: `pairs` input pairs; `x` points at bf16 activations.
///
/// # Safety
/// AVX-512 BF16. `x` holds 4 rows of `stride` halves (stride even) with `2 * pairs` from its
/// start; each panel pointer addresses `pairs` steps of 64 bytes; `out` as in
/// [`TileOut::put`].
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn tile_bf16<const NR: usize>(x: *const u16, stride: usize, w: [*const u8; NR], pairs: usize, out: &TileOut, pf: Prefetch<NR>) {
    let mut acc = [[_mm512_setzero_ps(); NR]; TILE_ROWS];
    let mut pf = Spread::new(pf, pairs);
    for p in 0..pairs {
        pf.step();
        // SAFETY: inside the ranges the caller vouches for; __m512bh and __m512i are the same
        // 64 bytes.
        unsafe {
            let wv: [__m512bh; NR] = std::array::from_fn(|j| std::mem::transmute(_mm512_loadu_si512(w[j].add(64 * p) as *const __m512i)));
            for (i, row) in acc.iter_mut().enumerate() {
                let pair = std::ptr::read_unaligned(x.add(i * stride + 2 * p) as *const i32);
                let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                for (a, &wj) in row.iter_mut().zip(&wv) {
                    *a = _mm512_dpbf16_ps(*a, xv, wj);
                }
            }
        }
    }
    // SAFETY: see the function's contract.
    unsafe { out.put_tile(&acc) };
}

/// q8 panels with `vpdpbusd` over `quads` groups of 4 inputs: activations are u8 (quant +
/// 128), with per-row scales. The chunk's result, `(acc - 128 * colsum) * scale_w *
/// scale_x`, is accumulated into `out`; `colsum` points at each panel's 16 column sums (the
/// whole-K sums on the first chunk, zeros on later ones, so the +128 comes out exactly
/// once). Only the tile's first `MR` rows (1 to 4) are computed, as in [`tile_q4_rows`].
///
/// # Safety
/// AVX-512 VNNI. `x` holds 4 rows with `4 * quads` quants each; each panel addresses
/// `quads` steps of 64 bytes and 16 f32 scales; `colsum` 16 values per panel; `out` as in
/// [`TileOut::put`].
#[target_feature(enable = "avx512f,avx512vnni")]
pub unsafe fn tile_q8_rows<const NR: usize, const MR: usize>(x: QuantRows, w: QuantPanels<NR>, colsum: [*const i32; NR], quads: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, scale: xs, .. } = x;
    let (w, ws) = (w.w, w.scales.map(|p| p as *const f32));
    let mut acc = [[_mm512_setzero_si512(); NR]; MR];
    let mut pf = Spread::new(pf, quads);
    for q in 0..quads {
        pf.step();
        // SAFETY: inside the ranges the caller vouches for.
        unsafe {
            let wv: [__m512i; NR] = std::array::from_fn(|j| _mm512_loadu_si512(w[j].add(64 * q) as *const __m512i));
            for (i, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 4 * q) as *const i32));
                for (a, &wj) in row.iter_mut().zip(&wv) {
                    *a = _mm512_dpbusd_epi32(*a, xv, wj);
                }
            }
        }
    }
    for j in 0..NR {
        // SAFETY: 16 values per panel (caller's contract).
        let (offset, scale) = unsafe { (_mm512_slli_epi32::<7>(_mm512_loadu_si512(colsum[j] as *const __m512i)), _mm512_loadu_ps(ws[j])) };
        for (i, row) in acc.iter().enumerate() {
            let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(row[j], offset));
            // SAFETY: see the function's contract.
            unsafe { out.put(i, j, NR, _mm512_mul_ps(v, _mm512_mul_ps(scale, _mm512_set1_ps(xs[i])))) };
        }
    }
}

/// q4 panels with `vpdpbusd` (weights the unsigned operand) over `groups` groups of `group`
/// inputs: per group, `(acc - 8 * sum of the group's activation quants) * scale_w[group]`,
/// then times the row's activation scale, accumulated into `out`. The weights' scales cover
/// `scale_group` inputs each (a multiple of `group`). With per-block activation scales
/// (`group` is one block), each group's term is multiplied by the row's scale of that block
/// instead. Only the tile's first `MR` rows (1 to 4) are computed: a last tile of fewer real
/// rows computes no padding. The rows' sums are per group.
///
/// # Safety
/// AVX-512 VNNI and BW. `x` holds 4 rows with `groups * group` quants each and `groups`
/// sums; each panel addresses `groups * group / 8` blocks of 64 bytes and 16 f16 scales per
/// `scale_group` inputs; `out` as in [`TileOut::put`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn tile_q4_rows<const NR: usize, const MR: usize>(x: QuantRows, w: QuantPanels<NR>, group: usize, groups: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, sums: gsums, sums_stride: gstride, scale: xs, blocks: act_blocks } = x;
    let QuantPanels { w, scales, scale_group } = w;
    let low = _mm512_set1_epi8(0x0f);
    let mut res = [[_mm512_setzero_ps(); NR]; MR];
    let mut pf = Spread::new(pf, groups * group / 8);
    for g in 0..groups {
        let mut acc = [[_mm512_setzero_si512(); NR]; MR];
        for b in g * group / 8..(g + 1) * group / 8 {
            pf.step();
            // SAFETY: inside the ranges the caller vouches for.
            unsafe {
                let xa: [__m512i; MR] = std::array::from_fn(|i| _mm512_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 8 * b) as *const i32)));
                let xb: [__m512i; MR] = std::array::from_fn(|i| _mm512_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 8 * b + 4) as *const i32)));
                for j in 0..NR {
                    let packed = _mm512_loadu_si512(w[j].add(64 * b) as *const __m512i);
                    let wa = _mm512_and_si512(packed, low);
                    let wb = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), low);
                    for i in 0..MR {
                        acc[i][j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc[i][j], wa, xa[i]), wb, xb[i]);
                    }
                }
            }
        }
        // SAFETY: row i's scale of block g (caller's contract).
        let xb: [__m512; MR] = std::array::from_fn(|i| _mm512_set1_ps(act_blocks.map_or(1.0, |b| unsafe { b.at(i, g) })));
        for j in 0..NR {
            // SAFETY: the group's 16 scales of panel j (caller's contract).
            let sw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(scales[j].add(32 * (g * group / scale_group)) as *const __m256i)) };
            for i in 0..MR {
                // SAFETY: row i's sum of group g (caller's contract).
                let corr = unsafe { _mm512_set1_epi32(*gsums.add(i * gstride + g)) };
                let sw = if act_blocks.is_some() { _mm512_mul_ps(sw, xb[i]) } else { sw };
                res[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[i][j], corr)), sw, res[i][j]);
            }
        }
    }
    for (i, row) in res.iter().enumerate() {
        for (j, &r) in row.iter().enumerate() {
            let r = if act_blocks.is_some() { r } else { _mm512_mul_ps(r, _mm512_set1_ps(xs[i])) };
            // SAFETY: see the function's contract.
            unsafe { out.put(i, j, NR, r) };
        }
    }
}

/// q8 panels with per-block activation scales: `blocks` blocks of 32 inputs (8 quads). The
/// activations are signed quants and the weights, XOR-ed with 0x80, the unsigned operand
/// (`w + 128`), so each block's sum carries `128 * sum of its activation quants`, which the
/// rows' sums hold (per block). Per block, `(acc - bsum) * scale_x[block]` is summed; the
/// total times `scale_w` is accumulated into `out`. Only the tile's first `MR` rows (1 to 4)
/// are computed.
///
/// # Safety
/// AVX-512 VNNI. `x` holds 4 rows with `32 * blocks` quants each and `blocks` sums and
/// scales (`x.blocks` is given); each panel addresses `8 * blocks` steps of 64 bytes and 16
/// f32 scales; `out` as in [`TileOut::put`].
#[target_feature(enable = "avx512f,avx512vnni")]
pub unsafe fn tile_q8_blocks_rows<const NR: usize, const MR: usize>(x: QuantRows, w: QuantPanels<NR>, blocks: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, sums: bsums, sums_stride: bstride, blocks: xs, .. } = x;
    let xs = xs.expect("per-block activation scales");
    let (w, ws) = (w.w, w.scales.map(|p| p as *const f32));
    let flip = _mm512_set1_epi8(-128);
    let mut res = [[_mm512_setzero_ps(); NR]; MR];
    let mut pf = Spread::new(pf, 8 * blocks);
    for b in 0..blocks {
        let mut acc = [[_mm512_setzero_si512(); NR]; MR];
        for q in 8 * b..8 * b + 8 {
            pf.step();
            // SAFETY: inside the ranges the caller vouches for.
            unsafe {
                let wv: [__m512i; NR] = std::array::from_fn(|j| _mm512_xor_si512(_mm512_loadu_si512(w[j].add(64 * q) as *const __m512i), flip));
                for (i, row) in acc.iter_mut().enumerate() {
                    let xv = _mm512_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 4 * q) as *const i32));
                    for (a, &wj) in row.iter_mut().zip(&wv) {
                        *a = _mm512_dpbusd_epi32(*a, wj, xv);
                    }
                }
            }
        }
        for (i, (r, a)) in res.iter_mut().zip(&acc).enumerate() {
            // SAFETY: row i's sum and scale of block b (caller's contract).
            let (corr, s) = unsafe { (_mm512_set1_epi32(*bsums.add(i * bstride + b)), _mm512_set1_ps(xs.at(i, b))) };
            for (rj, &aj) in r.iter_mut().zip(a) {
                *rj = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(aj, corr)), s, *rj);
            }
        }
    }
    for j in 0..NR {
        // SAFETY: 16 scales per panel (caller's contract).
        let scale = unsafe { _mm512_loadu_ps(ws[j]) };
        for (i, row) in res.iter().enumerate() {
            // SAFETY: see the function's contract.
            unsafe { out.put(i, j, NR, _mm512_mul_ps(row[j], scale)) };
        }
    }
}

/// Quantises one row to int8 (`x ~= q * scale`, half to even) into `out`, XOR-ing each byte
/// with `flip` (0x80 turns q into the u8 `q + 128` of the q8 kernel), and stores 8 x each
/// `group`'s quant sum into `sums`. Returns the scale.
///
/// # Safety
/// AVX-512 F/BW. `x` and `out` hold `k` elements, `k` a multiple of 16 and of `group` (a
/// multiple of 16); `sums` holds `k / group`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn quantize_row_avx512(x: &[f32], out: &mut [u8], flip: u8, group: usize, sums: &mut [i32]) -> f32 {
    let k = x.len();
    assert!(k % 16 == 0 && group % 16 == 0 && k % group == 0 && out.len() >= k && sums.len() >= k / group);
    let mut m = _mm512_setzero_ps();
    for c in (0..k).step_by(16) {
        // SAFETY: c + 16 <= k.
        m = _mm512_max_ps(m, _mm512_abs_ps(unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) }));
    }
    let scale = _mm512_reduce_max_ps(m) / 127.0;
    let inv = _mm512_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
    let flip = _mm_set1_epi8(flip as i8);
    for (g, sum) in sums.iter_mut().enumerate().take(k / group) {
        let mut acc = _mm512_setzero_si512();
        for c in (g * group..(g + 1) * group).step_by(16) {
            // SAFETY: c + 16 <= k; `out` holds k bytes.
            unsafe {
                let q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(c)), inv));
                acc = _mm512_add_epi32(acc, q);
                _mm_storeu_si128(out.as_mut_ptr().add(c) as *mut __m128i, _mm_xor_si128(_mm512_cvtsepi32_epi8(q), flip));
            }
        }
        *sum = 8 * _mm512_reduce_add_epi32(acc);
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The four-way fold adds each vector's lanes in `_mm512_reduce_add_ps`'s order: the same
    /// bits for values whose sums round differently in other orders.
    #[test]
    fn four_sums_at_once_have_the_bits_of_one_at_a_time() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: no AVX-512 here");
            return;
        }
        let mut s = 7u64;
        let mut rnd = || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Magnitudes over 2^-20..2^20, either sign: rounding depends on the order.
            let m = ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
            m * 2f32.powi(((s >> 8) % 41) as i32 - 20)
        };
        for _ in 0..2000 {
            let lanes: [[f32; 16]; 4] = std::array::from_fn(|_| std::array::from_fn(|_| rnd()));
            // SAFETY: AVX-512F detected above; each array holds 16 floats.
            let (four, one) = unsafe {
                let v: [__m512; 4] = std::array::from_fn(|i| _mm512_loadu_ps(lanes[i].as_ptr()));
                (reduce_add_4(v), v.map(|x| _mm512_reduce_add_ps(x)))
            };
            assert_eq!(four.map(f32::to_bits), one.map(f32::to_bits), "{lanes:?}");
        }
    }
}
