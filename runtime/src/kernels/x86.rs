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
