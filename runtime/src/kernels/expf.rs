//! `expf` computed as glibc's and musl's libm compute it, written so that it vectorises.
//!
//! Softmax over a 126k-entry vocabulary is mostly `exp`, and the C library's `expf` is a
//! call per element. Both libraries use the same algorithm (Arm's optimized-routines): `x *
//! 32 / ln 2 = k + r`, `exp(x) = 2^(k/32) * 2^(r/32)`, the first from a 32-entry table, the
//! second a cubic, all in double precision, then rounded to float. Written out with the same
//! constants and the same operations (fused where glibc's FMA build fuses them), it gives the
//! library's bits, which the sampler's confidences must keep: a confidence that rounds
//! differently can reorder a tie. The test sweeps the float range against `f32::exp`.
//! (Attention's softmax uses [`super::exp`], a cheaper f32 polynomial: nothing there ranks.)

use super::cpu::{multiversion, Features};

/// `2^(i/32)` as double bits, less `i << 47` (added back with the exponent).
const TABLE: [u64; 32] = [
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13, 0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
];
/// `32 / ln 2`.
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// `1.5 * 2^52`: adding it rounds to an integer, which the low bits then hold.
const SHIFT: u64 = 0x4338000000000000;
/// The cubic's coefficients, scaled for `r` in units of 1/32.
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;
/// Below `ln(2^-150)` the result is 0 (the library's underflow).
const UNDERFLOW: u32 = 0xc2cff1b4;

/// `exp(x)` for `x <= 88` (softmax's `x - max`), bit for bit as the C library's `expf`.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let xd = x as f64;
    let z = f64::from_bits(INV_LN2_N) * xd;
    let kd = z + f64::from_bits(SHIFT);
    let ki = kd.to_bits();
    let r = z - (kd - f64::from_bits(SHIFT));
    let s = f64::from_bits(TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
    let p = f64::from_bits(C0).mul_add(r, f64::from_bits(C1));
    let q = f64::from_bits(C2).mul_add(r, 1.0);
    let y = p.mul_add(r * r, q) * s;
    if x < f32::from_bits(UNDERFLOW) { 0.0 } else { y as f32 }
}

#[inline(always)]
fn sum_body<const FMA: bool>(_: Features, logits: &[f32], max: f32) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = logits.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += expf(v - max);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += expf(v - max);
    }
    let b: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
    ((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7]))
}

multiversion! {
    /// `sum(exp(x - max))` over `logits`, as PyTorch's vectorised softmax adds it: in 16
    /// lanes, then reduced pairwise.
    pub fn exp_sum(features: Features, logits: &[f32], max: f32) -> f32 => sum_body
}

#[inline(always)]
fn scaled_in_place_body<const FMA: bool>(_: Features, row: &mut [f32], max: f32, scale: f32) {
    for v in row {
        *v = expf(*v - max) * scale;
    }
}

#[inline(always)]
fn scaled_into_body<const FMA: bool>(_: Features, row: &[f32], max: f32, scale: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(row) {
        *o = expf(v - max) * scale;
    }
}

// Built for the CPU's vector width: [`expf`]'s fused multiply-adds are then instructions
// (a baseline x86-64 build calls the C library's software `fma` for each), with the same bits.
multiversion! {
    /// `row[i] = expf(row[i] - max) * scale`: a softmax's numerators times the reciprocal of
    /// their sum.
    pub fn exp_scaled_in_place(features: Features, row: &mut [f32], max: f32, scale: f32) => scaled_in_place_body
}

multiversion! {
    /// `out[i] = expf(row[i] - max) * scale`.
    pub fn exp_scaled_into(features: Features, row: &[f32], max: f32, scale: f32, out: &mut [f32]) => scaled_into_body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every 61st float from 0 down past the underflow, and the edges: the C library's bits.
    #[test]
    fn expf_is_the_c_librarys_bit_for_bit() {
        let mut differ = Vec::new();
        let mut check = |x: f32| {
            if expf(x).to_bits() != x.exp().to_bits() && differ.len() < 8 {
                differ.push((x, expf(x), x.exp()));
            }
        };
        // Negative floats: bits 0x8000_0000 (-0.0) up to -inf.
        for bits in (0x8000_0000u32..=0xff80_0000).step_by(61) {
            check(f32::from_bits(bits));
        }
        for x in [0.0, -0.0, f32::NEG_INFINITY, -103.97207, -103.972_08, -87.5, -1e-30, 1.0, 10.0, 88.0, f32::from_bits(UNDERFLOW)] {
            check(x);
        }
        assert!(differ.is_empty(), "(x, ours, libm): {differ:?}");
    }

    #[test]
    fn the_sum_is_the_scalar_sums_bits() {
        let mut s = 7u64;
        let logits: Vec<f32> = (0..1000 + 13)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 40.0 - 20.0
            })
            .collect();
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut lanes = [0f32; 16];
        for (i, &v) in logits.iter().enumerate() {
            lanes[i % 16] += (v - max).exp();
        }
        let b: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
        let want = ((b[0] + b[4]) + (b[2] + b[6])) + ((b[1] + b[5]) + (b[3] + b[7]));
        for features in [crate::kernels::cpu::features(), Features::PORTABLE] {
            assert_eq!(exp_sum(features, &logits, max).to_bits(), want.to_bits(), "{}", features.describe());
        }
    }
}
