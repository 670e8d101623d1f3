//! x86-64 SIMD versions of the f32 dot-product tile. Same contract as the portable
//! `dot_tile`: dot products of `MR` rows of `x` with `NR` rows of `w`, each of length `k`.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

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
        for j in 0..NR {
            let mut s = _mm512_reduce_add_ps(acc[i][j]);
            for t in full..k {
                s = x[i][t].mul_add(w[j][t], s);
            }
            out[i][j] = s;
        }
    }
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
            let mut s = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
            for t in full..k {
                s = x[i][t].mul_add(w[j][t], s);
            }
            out[i][j] = s;
        }
    }
    out
}

/// Rows x 16 columns of results, as the GEMM driver passes them.
type Tile = [[f32; 16]; 16];

/// f32 panel (`[k][16]` f32) times 16 rows of f32 activations.
///
/// # Safety
/// The CPU must support AVX-512F. Checked here: 16 rows of `stride >= k` activations and a
/// whole panel.
#[target_feature(enable = "avx512f")]
pub unsafe fn panel_f32_avx512(x: &[f32], stride: usize, k: usize, panel: &[u8], tile: &mut Tile) {
    assert!(stride >= k && x.len() >= 15 * stride + k && panel.len() >= 64 * k);
    let (xp, wp) = (x.as_ptr(), panel.as_ptr() as *const f32);
    let mut acc = [_mm512_setzero_ps(); 16];
    for kk in 0..k {
        // SAFETY: kk < k, rows < 16: inside the asserted bounds.
        unsafe {
            let w = _mm512_loadu_ps(wp.add(16 * kk));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(*xp.add(i * stride + kk)), w, *a);
            }
        }
    }
    for (row, a) in tile.iter_mut().zip(acc) {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), a) };
    }
}

/// f16 panel (`[k][16]` f16), widened to f32 on the fly.
///
/// # Safety
/// The CPU must support AVX-512F. Bounds are checked as in [`panel_f32_avx512`].
#[target_feature(enable = "avx512f")]
pub unsafe fn panel_f16_avx512(x: &[f32], stride: usize, k: usize, panel: &[u8], tile: &mut Tile) {
    assert!(stride >= k && x.len() >= 15 * stride + k && panel.len() >= 32 * k);
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 16];
    for kk in 0..k {
        // SAFETY: inside the asserted bounds.
        unsafe {
            let w = _mm512_cvtph_ps(_mm256_loadu_si256(wp.add(32 * kk) as *const __m256i));
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(*xp.add(i * stride + kk)), w, *a);
            }
        }
    }
    for (row, a) in tile.iter_mut().zip(acc) {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), a) };
    }
}

/// bf16 panel (`[k/2][16][2]`) times 16 rows of bf16 activations with `vdpbf16ps`.
///
/// # Safety
/// The CPU must support AVX-512 BF16. `stride` is even; bounds are checked.
#[target_feature(enable = "avx512f,avx512bf16")]
pub unsafe fn panel_bf16_avx512(x: &[half::bf16], stride: usize, k: usize, panel: &[u8], tile: &mut Tile) {
    let pairs = k.div_ceil(2);
    assert!(stride % 2 == 0 && stride >= 2 * pairs && x.len() >= 16 * stride && panel.len() >= 64 * pairs);
    let (xp, wp) = (x.as_ptr() as *const u8, panel.as_ptr());
    let mut acc = [_mm512_setzero_ps(); 16];
    for p in 0..pairs {
        // SAFETY: inside the asserted bounds; unaligned reads of the activation pairs.
        unsafe {
            let w: __m512bh = std::mem::transmute(_mm512_loadu_si512(wp.add(64 * p) as *const __m512i));
            for (i, a) in acc.iter_mut().enumerate() {
                let pair = std::ptr::read_unaligned(xp.add(2 * (i * stride + 2 * p)) as *const i32);
                let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                *a = _mm512_dpbf16_ps(*a, xv, w);
            }
        }
    }
    for (row, a) in tile.iter_mut().zip(acc) {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), a) };
    }
}

/// q8 panel (`[k/4][16][4]` s8, then f32 scales and i32 column sums) times 16 rows of u8
/// activations (quants + 128) with `vpdpbusd`; the +128 comes back out through the column
/// sums.
///
/// # Safety
/// The CPU must support AVX-512 VNNI. Bounds are checked.
#[target_feature(enable = "avx512f,avx512vnni")]
pub unsafe fn panel_q8_vnni(x: &[u8], stride: usize, scale: &[f32], k: usize, panel: &[u8], tile: &mut Tile) {
    let quads = k.div_ceil(4);
    assert!(stride >= 4 * quads && x.len() >= 16 * stride && scale.len() >= 16 && panel.len() >= 64 * quads + 128);
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    let mut acc = [_mm512_setzero_si512(); 16];
    for q in 0..quads {
        // SAFETY: inside the asserted bounds; unaligned 4-byte activation reads.
        unsafe {
            let w = _mm512_loadu_si512(wp.add(64 * q) as *const __m512i);
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_set1_epi32(std::ptr::read_unaligned(xp.add(i * stride + 4 * q) as *const i32));
                *a = _mm512_dpbusd_epi32(*a, xv, w);
            }
        }
    }
    // SAFETY: the scales and column sums are the panel's last 128 bytes (asserted).
    let (ws, colsum) = unsafe {
        (_mm512_loadu_ps(wp.add(64 * quads) as *const f32), _mm512_loadu_si512(wp.add(64 * quads + 64) as *const __m512i))
    };
    let offset = _mm512_slli_epi32::<7>(colsum);
    for (i, (row, a)) in tile.iter_mut().zip(acc).enumerate() {
        let v = _mm512_cvtepi32_ps(_mm512_sub_epi32(a, offset));
        let r = _mm512_mul_ps(_mm512_mul_ps(v, ws), _mm512_set1_ps(scale[i]));
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), r) };
    }
}

/// q4 panel (64 bytes per 8 k holding two vectors of 4-bit values, then f16 scales per group)
/// times 8 rows of int8 activations with `vpdpbusd` (weights as the unsigned operand); the
/// zero point 8 comes back out through the per-group activation sums.
///
/// # Safety
/// The CPU must support AVX-512 VNNI. Bounds are checked.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub unsafe fn panel_q4_vnni(x: &[u8], stride: usize, scale: &[f32], group_sums: &[i32], k: usize, group: usize, panel: &[u8], tile: &mut Tile) {
    const ROWS: usize = 8;
    let groups = k / group;
    assert!(group % 8 == 0 && k % group == 0 && stride >= k && x.len() >= ROWS * stride);
    assert!(scale.len() >= ROWS && group_sums.len() >= ROWS * groups && panel.len() >= 8 * k + 32 * groups);
    let (xp, wp) = (x.as_ptr(), panel.as_ptr());
    let low = _mm512_set1_epi8(0x0f);
    let mut out = [_mm512_setzero_ps(); ROWS];
    for g in 0..groups {
        let mut acc = [_mm512_setzero_si512(); ROWS];
        for b in g * group / 8..(g + 1) * group / 8 {
            // SAFETY: b < k / 8 and rows < 8: inside the asserted bounds.
            unsafe {
                let packed = _mm512_loadu_si512(wp.add(64 * b) as *const __m512i);
                let wa = _mm512_and_si512(packed, low);
                let wb = _mm512_and_si512(_mm512_srli_epi16::<4>(packed), low);
                for (i, a) in acc.iter_mut().enumerate() {
                    let at = xp.add(i * stride + 8 * b);
                    let xa = _mm512_set1_epi32(std::ptr::read_unaligned(at as *const i32));
                    let xb = _mm512_set1_epi32(std::ptr::read_unaligned(at.add(4) as *const i32));
                    *a = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(*a, wa, xa), wb, xb);
                }
            }
        }
        // SAFETY: the group's 16 f16 scales lie after the data (asserted).
        let ws = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(wp.add(8 * k + 32 * g) as *const __m256i)) };
        for (i, (o, a)) in out.iter_mut().zip(acc).enumerate() {
            let v = _mm512_sub_epi32(a, _mm512_set1_epi32(group_sums[i * groups + g]));
            *o = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), ws, *o);
        }
    }
    for (i, (row, o)) in tile.iter_mut().zip(out).enumerate() {
        // SAFETY: a tile row holds 16 floats.
        unsafe { _mm512_storeu_ps(row.as_mut_ptr(), _mm512_mul_ps(o, _mm512_set1_ps(scale[i]))) };
    }
}
