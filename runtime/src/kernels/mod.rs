//! Host kernels over f32 activations. Each public kernel is compiled for several instruction
//! sets (portable, and AVX2+FMA and AVX-512 on x86-64 or NEON on AArch64) and picks one at
//! run time (see [`cpu`]); the results agree to rounding.

pub mod attention;
pub mod cpu;
pub mod expf;
pub mod gemm;
pub mod gemma;
mod tile;
mod x86;
mod x86_avx2;
mod x86_attention;
mod arm;

use half::slice::HalfFloatSliceExt;

use crate::model::Weights;
use cpu::multiversion;

const LANES: usize = 16;

/// f32 to f16 or bf16 bits, rounded to nearest even (the KV cache's 16-bit types).
pub fn narrow_half(src: &[f32], dtype: llada_ir::KvDType, dst: &mut [u16]) {
    match dtype {
        llada_ir::KvDType::Bf16 => dst.iter_mut().zip(src).for_each(|(d, &v)| *d = half::bf16::from_f32(v).to_bits()),
        _ => {
            let dst: &mut [half::f16] = bytemuck::cast_slice_mut(dst);
            dst.convert_from_f32_slice(src);
        }
    }
}

/// f16 or bf16 bits to f32 (exact).
pub fn widen_half(src: &[u16], dtype: llada_ir::KvDType, dst: &mut [f32]) {
    match dtype {
        llada_ir::KvDType::Bf16 => {
            let src: &[half::bf16] = bytemuck::cast_slice(src);
            src.convert_to_f32_slice(dst);
        }
        _ => {
            let src: &[half::f16] = bytemuck::cast_slice(src);
            src.convert_to_f32_slice(dst);
        }
    }
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `sum` plus `x[t] * w[t]` for `t` in `from..k`, added one at a time in order: a dot
/// product's tail past its last full vector, the same in every tile (SIMD ones fused).
#[inline(always)]
fn dot_tail<const FMA: bool>(x: &[f32], w: &[f32], from: usize, k: usize, sum: f32) -> f32 {
    let mut s = sum;
    for t in from..k {
        s = madd::<FMA>(x[t], w[t], s);
    }
    s
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
/// widest vector unit `features` allows.
#[inline(always)]
pub(crate) fn dot_tile<const FMA: bool, const MR: usize, const NR: usize>(features: cpu::Features, x: [&[f32]; MR], w: [&[f32]; NR], k: usize) -> [[f32; NR]; MR] {
    #[cfg(target_arch = "x86_64")]
    match features.isa() {
        // SAFETY: a `Features` holds only features the CPU has; the tiles check the slice
        // lengths themselves.
        cpu::Isa::Avx512 => return unsafe { x86::dot_tile_avx512(x, w, k) },
        cpu::Isa::Avx2 => return unsafe { x86::dot_tile_avx2(x, w, k) },
        _ => {}
    }
    #[cfg(target_arch = "aarch64")]
    if features.isa() == cpu::Isa::Neon {
        return arm::dot_tile_neon(x, w, k);
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
            out[i][j] = dot_tail::<FMA>(x[i], w[j], full, k, hsum(&acc[i][j]));
        }
    }
    out
}

#[inline(always)]
fn dot_body<const FMA: bool>(features: cpu::Features, a: &[f32], b: &[f32]) -> f32 {
    dot_tile::<FMA, 1, 1>(features, [a], [b], a.len())[0][0]
}

multiversion! {
    pub fn dot(features: Features, a: &[f32], b: &[f32]) -> f32 => dot_body
}

/// `e^x` in a form the compiler vectorises (the library `expf` is a call per element):
/// Cody-Waite reduction `x = n ln2 + r`, `|r| <= ln2 / 2`, then a degree-7 Taylor polynomial,
/// about one ulp from the correctly rounded value. Inputs are clamped to the normal range
/// (below about -87.3 the result is the smallest normal instead of a subnormal or zero).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.3, 88.3);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    pow2i(n) * p
}

/// `2^n` for an integral `n` in -126..=127, from its bits: adding `127 + 2^23` leaves `n + 127`
/// exactly in the low mantissa bits. (A float-to-int cast would keep [`exp`] from
/// vectorising: its saturation is a scalar branch per element.)
#[inline(always)]
fn pow2i(n: f32) -> f32 {
    let biased = (n + (127.0 + 8_388_608.0)).to_bits() - 0x4b00_0000;
    f32::from_bits(biased << 23)
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

/// The embedding rows of `tokens`, `cols` wide each, into `out` as f32.
pub fn embed_rows(table: Weights<'_>, cols: usize, tokens: &[u32], out: &mut [f32]) {
    for (row, &t) in out.chunks_exact_mut(cols).zip(tokens) {
        embed_row(table, cols, t as usize, row);
    }
}

/// LLaDA's RMSNorm, in the reference's order of operations:
/// `weight * (x * rsqrt(mean(x^2) + eps))`.
pub fn rms_norm(features: cpu::Features, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let cols = weight.len();
    for (xr, or) in x.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        let ms = dot(features, xr, xr) / cols as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = w * (v * r);
        }
    }
}

/// [`rms_norm`] in place on every `weight.len()`-wide head of `heads` (one row's query or
/// key heads, which share the weight), with the same operations in the same order.
pub fn head_rms_norm(features: cpu::Features, heads: &mut [f32], weight: &[f32], eps: f32) {
    let cols = weight.len();
    for h in heads.chunks_exact_mut(cols) {
        let ms = dot(features, h, h) / cols as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for (v, &w) in h.iter_mut().zip(weight) {
            *v = w * (*v * r);
        }
    }
}

#[inline(always)]
fn rope_body<const FMA: bool>(_: cpu::Features, row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let half = head_dim / 2;
    let (cos, sin) = (&cos[..half], &sin[..half]);
    for head in row.chunks_exact_mut(head_dim) {
        let (x1, x2) = head.split_at_mut(half);
        for i in 0..half {
            let (a, b) = (x1[i], x2[i]);
            x1[i] = a * cos[i] + (-b) * sin[i];
            x2[i] = b * cos[i] + a * sin[i];
        }
    }
}

multiversion! {
    /// Rotary embedding in place on the heads of `row` (whole heads of `head_dim`), half-split
    /// convention: `[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]` (products rounded, then
    /// summed: no fused multiply-add on any path, so every path gives the same bits).
    pub fn rope_row(features: Features, row: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) => rope_body
}

#[inline(always)]
fn swiglu_body<const FMA: bool>(_: cpu::Features, x: &[f32], hidden: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(2 * hidden).zip(out.chunks_exact_mut(hidden)) {
        let (gate, up) = xr.split_at(hidden);
        for ((o, &g), &u) in or.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    }
}

multiversion! {
    /// `out = silu(gate) * up` for rows `[gate | up]` of `x`; `out` rows are `hidden` wide.
    pub fn swiglu(features: Features, x: &[f32], hidden: usize, out: &mut [f32]) => swiglu_body
}

#[inline(always)]
fn add_body<const FMA: bool>(_: cpu::Features, acc: &mut [f32], x: &[f32]) {
    for (a, &b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

multiversion! {
    /// `acc += x`, element by element.
    pub fn add(features: Features, acc: &mut [f32], x: &[f32]) => add_body
}

pub fn scale(x: &mut [f32], factor: f32) {
    for a in x {
        *a *= factor;
    }
}

#[inline(always)]
fn argmax_body<const FMA: bool>(_: cpu::Features, row: &[f32]) -> usize {
    // A scan from the first element keeps it when it is NaN (nothing compares greater).
    if row.first().is_none_or(|x| x.is_nan()) {
        return 0;
    }
    // The largest value that is not NaN, in 16 lanes (`x > m` is false for NaN)...
    let mut top = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &x) in top.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let max = chunks.remainder().iter().chain(&top).fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if max == f32::NEG_INFINITY {
        // Nothing is greater than -inf: the scan keeps the first element.
        return 0;
    }
    // ... then its first index: the first chunk holding it, then the place in that chunk.
    let chunk = row.chunks(LANES).position(|c| c.iter().fold(false, |any, &x| any | (x == max))).expect("the maximum is in the row");
    chunk * LANES + row[chunk * LANES..].iter().position(|&x| x == max).expect("in this chunk")
}

multiversion! {
    /// The index of the first largest element of `row`, as a scan that keeps its first element
    /// and takes each one strictly greater finds it (so NaN is never taken, unless first), in
    /// 16 lanes. The greedy prediction over a vocabulary row.
    pub fn argmax(features: Features, row: &[f32]) -> usize => argmax_body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }

    #[test]
    fn dot_tiles_match_a_double_precision_reference_on_odd_lengths() {
        let mut s = 7;
        for k in [1, 15, 16, 17, 130] {
            let a: Vec<Vec<f32>> = (0..4).map(|_| (0..k).map(|_| lcg(&mut s)).collect()).collect();
            let b: Vec<Vec<f32>> = (0..4).map(|_| (0..k).map(|_| lcg(&mut s)).collect()).collect();
            let t = dot_tile::<true, 4, 4>(cpu::features(), std::array::from_fn(|i| a[i].as_slice()), std::array::from_fn(|j| b[j].as_slice()), k);
            let p = dot_tile_portable::<false, 4, 4>(std::array::from_fn(|i| a[i].as_slice()), std::array::from_fn(|j| b[j].as_slice()), k);
            for i in 0..4 {
                for j in 0..4 {
                    let want: f64 = (0..k).map(|t| a[i][t] as f64 * b[j][t] as f64).sum();
                    assert!((t[i][j] as f64 - want).abs() < 1e-5 && (p[i][j] as f64 - want).abs() < 1e-5, "k {k}");
                }
            }
        }
    }

    /// A request for every feature is cut to the CPU's, and each kernel family runs on the
    /// features it is given: with the portable set, dot, RMSNorm and SwiGLU give their
    /// portable twins bit for bit and every matmul format takes its portable path (attention:
    /// `attention::tests`; the matmuls' results: `gemm::tests`).
    #[test]
    fn every_kernel_family_runs_on_the_features_it_is_given() {
        use llada_ir::DType;
        let all = cpu::Features::request(cpu::FeatureRequest::ALL);
        assert_eq!(all, cpu::features());
        let portable = cpu::Features::PORTABLE;
        let mut s = 5;
        let a: Vec<f32> = (0..131).map(|_| lcg(&mut s)).collect();
        let b: Vec<f32> = (0..131).map(|_| lcg(&mut s)).collect();
        assert_eq!(dot(portable, &a, &b).to_bits(), dot_body::<false>(portable, &a, &b).to_bits());
        assert!((dot(all, &a, &b) - dot_body::<false>(portable, &a, &b)).abs() < 1e-5);
        let w: Vec<f32> = (0..131).map(|_| 1.0 + lcg(&mut s)).collect();
        let mut out = vec![0f32; 131];
        rms_norm(portable, &a, &w, 1e-5, &mut out);
        let r = 1.0 / (dot_body::<false>(portable, &a, &a) / 131.0 + 1e-5).sqrt();
        let want: Vec<f32> = a.iter().zip(&w).map(|(&v, &wv)| wv * (v * r)).collect();
        assert_eq!(out, want);
        let x: Vec<f32> = (0..2 * 40).map(|_| lcg(&mut s) * 6.0).collect();
        let (mut fast, mut twin) = (vec![0f32; 40], vec![0f32; 40]);
        swiglu(portable, &x, 40, &mut fast);
        swiglu_body::<false>(portable, &x, 40, &mut twin);
        assert_eq!(fast, twin);
        for format in [DType::PanelF32, DType::PanelF16, DType::PanelBf16, DType::PanelQ8, DType::PanelQ4 { group: 32 }] {
            for bf16_activations in [false, true] {
                let m = crate::model::Matrix { format, n: 16, k: 64, bytes: &[], bf16_activations, activation_scales: Default::default() };
                assert_eq!(tile::Path::of(&m, portable), tile::Path::Portable, "{}", format.name());
                assert_eq!(tile::Path::of(&m, all), tile::Path::of(&m, cpu::features()), "{}", format.name());
            }
        }
    }

    /// RMSNorm against a double-precision reference: tolerance a few f32 ulps of the output.
    #[test]
    fn rms_norm_matches_a_double_precision_reference() {
        let mut s = 11;
        let cols = 200;
        let x: Vec<f32> = (0..3 * cols).map(|_| lcg(&mut s) * 8.0).collect();
        let w: Vec<f32> = (0..cols).map(|_| 1.0 + lcg(&mut s)).collect();
        let mut out = vec![0f32; x.len()];
        rms_norm(cpu::features(), &x, &w, 1e-5, &mut out);
        for (r, (xr, or)) in x.chunks(cols).zip(out.chunks(cols)).enumerate() {
            let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64;
            for ((&v, &o), &wv) in xr.iter().zip(or).zip(&w) {
                let want = wv as f64 * v as f64 / (ms + 1e-5).sqrt();
                assert!((o as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()), "row {r}: {o} vs {want}");
            }
        }
    }

    /// Rotary embedding, half-split convention, against the rotation written out in f64.
    #[test]
    fn rope_rotates_each_head_half_split() {
        let (hd, heads) = (8, 3);
        let mut s = 5;
        let row: Vec<f32> = (0..hd * heads).map(|_| lcg(&mut s)).collect();
        let angle: Vec<f64> = (0..hd / 2).map(|i| 0.3 + i as f64).collect();
        let cos: Vec<f32> = angle.iter().map(|a| a.cos() as f32).collect();
        let sin: Vec<f32> = angle.iter().map(|a| a.sin() as f32).collect();
        let mut out = row.clone();
        rope_row(cpu::features(), &mut out, hd, &cos, &sin);
        let mut portable = row.clone();
        rope_row(cpu::Features::PORTABLE, &mut portable, hd, &cos, &sin);
        assert_eq!(out, portable, "the dispatched and portable paths' bits");
        for h in 0..heads {
            for i in 0..hd / 2 {
                let (a, b) = (row[h * hd + i] as f64, row[h * hd + hd / 2 + i] as f64);
                let (c, sn) = (cos[i] as f64, sin[i] as f64);
                assert!((out[h * hd + i] as f64 - (a * c - b * sn)).abs() < 1e-6);
                assert!((out[h * hd + hd / 2 + i] as f64 - (b * c + a * sn)).abs() < 1e-6);
            }
        }
    }

    /// The dispatched element-wise kernels (AVX or NEON, with FMA) against their portable
    /// twins (unfused) and a double-precision reference.
    #[test]
    fn dispatched_kernels_match_their_portable_twins() {
        let mut s = 13;
        let (hidden, rows) = (72, 3);
        let x: Vec<f32> = (0..rows * 2 * hidden).map(|_| lcg(&mut s) * 12.0).collect();
        let (mut fast, mut twin) = (vec![0f32; rows * hidden], vec![0f32; rows * hidden]);
        swiglu(cpu::features(), &x, hidden, &mut fast);
        swiglu_body::<false>(cpu::Features::PORTABLE, &x, hidden, &mut twin);
        for (i, (&a, &b)) in fast.iter().zip(&twin).enumerate() {
            let (r, c) = (i / hidden, i % hidden);
            let (g, u) = (x[r * 2 * hidden + c] as f64, x[r * 2 * hidden + hidden + c] as f64);
            let want = g / (1.0 + (-g).exp()) * u;
            assert!((a as f64 - want).abs() <= 1e-6 * (1.0 + want.abs()) && (a - b).abs() <= 1e-6 * (1.0 + b.abs()), "swiglu [{i}]: {a} vs twin {b} vs {want}");
        }
        for k in [3, 64, 131] {
            let a: Vec<f32> = (0..k).map(|_| lcg(&mut s)).collect();
            let b: Vec<f32> = (0..k).map(|_| lcg(&mut s)).collect();
            let want: f64 = a.iter().zip(&b).map(|(&p, &q)| p as f64 * q as f64).sum();
            let (fast, twin) = (dot(cpu::features(), &a, &b), dot_body::<false>(cpu::Features::PORTABLE, &a, &b));
            assert!((fast as f64 - want).abs() < 1e-5 && (twin as f64 - want).abs() < 1e-5, "dot k {k}: {fast} vs twin {twin} vs {want}");
        }
    }

    #[test]
    fn swiglu_reads_gate_then_up() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let mut out = [0.0f32; 2];
        swiglu(cpu::features(), &x, 2, &mut out);
        let silu = |g: f32| g / (1.0 + (-g).exp());
        for (o, want) in out.iter().zip([silu(1.0) * 3.0, silu(-2.0) * 0.5]) {
            assert!((o - want).abs() <= 1e-6 * want.abs(), "{o} vs {want}");
        }
    }

    /// The lanes find the scan's index: ties (the first wins, also across lanes), NaN
    /// anywhere, first or not, infinities, lengths with a tail, on every path.
    #[test]
    fn argmax_is_the_scans_index() {
        let scan = |row: &[f32]| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &x) in row.iter().enumerate() {
                if best.is_none_or(|(_, b)| x > b) {
                    best = Some((i, x));
                }
            }
            best.map_or(0, |(i, _)| i)
        };
        let mut s = 5u64;
        for len in [0, 1, 5, 16, 17, 40, 1000] {
            for case in 0..60 {
                let mut row: Vec<f32> = (0..len).map(|_| (lcg(&mut s) * 8.0).round()).collect();
                if len > 0 && case % 5 == 1 {
                    row[case % len] = f32::NAN;
                }
                if len > 0 && case % 7 == 2 {
                    row[0] = f32::NAN;
                }
                if len > 0 && case % 3 == 0 {
                    row[(case * 7) % len] = f32::INFINITY;
                }
                if case % 11 == 4 {
                    row.iter_mut().for_each(|x| *x = f32::NEG_INFINITY);
                }
                for features in [cpu::features(), cpu::Features::PORTABLE] {
                    assert_eq!(argmax(features, &row), scan(&row), "{row:?}");
                }
            }
        }
    }

    #[test]
    fn powers_of_two_from_bits_are_exact() {
        for n in -126..=127 {
            assert_eq!(pow2i(n as f32), 2f32.powi(n), "2^{n}");
        }
    }

    #[test]
    fn exp_is_within_two_ulps_over_the_range_that_matters() {
        let mut worst = 0f64;
        for i in -870_000..=880_000 {
            let x = i as f32 * 1e-4;
            let want = (x as f64).exp();
            worst = worst.max((exp(x) as f64 - want).abs() / want);
        }
        assert!(worst < 2.5e-7, "max relative error {worst:.2e}");
        assert_eq!(exp(0.0), 1.0);
    }
}
