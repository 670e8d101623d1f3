//! AVX2 + FMA + F16C versions of the GEMM tiles of [`super::x86`], for x86-64 CPUs without
//! AVX-512 (x86-64-v3). Same operands, contracts and signatures, so the GEMM driver calls
//! either set the same way.
//!
//! A register holds 8 lanes, so a 16-column panel is two halves, and there are 16 registers
//! rather than 32: a tile walks its columns in register tiles of 4 rows by 24 columns (three
//! halves; 12 accumulators, enough to cover the FMA latency; in assembly, see below) for the
//! float formats, and of 4 rows by one panel for the integer ones (whose partial sums take
//! more registers).
//!
//! Integer dot products have no `vpdpbusd`. `vpmaddubsw` (u8 x i8 pairs summed to i16, with
//! saturation) followed by `vpmaddwd` by ones (i16 pairs to i32) computes the same sums
//! exactly while the i16 pair sums cannot saturate: true for q4 (nibbles 0..15 times int8),
//! not for q8's u8 activations (2 x 255 x 127 overflows), which use the sign trick instead.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::tile::{Prefetch, QuantPanels, QuantRows, Spread, TileOut, TILE_ROWS};

impl TileOut {
    /// Writes or accumulates 8 columns: row `i`, half-panel `h` (columns `8 * h ..` of the
    /// tile) of a tile of `nr` panels.
    ///
    /// # Safety
    /// AVX. As `TileOut::put` (x86.rs): the caller owns the tile's columns.
    #[inline(always)]
    unsafe fn put8(&self, i: usize, h: usize, nr: usize, v: __m256) {
        if i >= self.rows {
            return;
        }
        // Real columns of this half: all 8, except in the last panel.
        let cols = if h / 2 + 1 == nr { self.last_cols.saturating_sub(8 * (h % 2)).min(8) } else { 8 };
        // SAFETY: inside the tile the caller owns (see above); masked past the last column.
        unsafe {
            let p = self.ptr.add(i * self.ldo + 8 * h);
            if cols == 8 {
                let v = if self.first { v } else { _mm256_add_ps(v, _mm256_loadu_ps(p)) };
                _mm256_storeu_ps(p, v);
            } else if cols > 0 {
                let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(cols as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
                let v = if self.first { v } else { _mm256_add_ps(v, _mm256_maskload_ps(p, mask)) };
                _mm256_maskstore_ps(p, mask, v);
            }
        }
    }
}

/// Register tiles of the float formats (f32, f16 and bf16 weights, f32 activations), written
/// in assembly: 4 rows x 3 half panels = 12 accumulators, plus three weight vectors and one
/// broadcast activation, is all 16 registers. (With intrinsics, LLVM hoists the four rows'
/// broadcasts above the multiply-adds and spills accumulators, at about half the speed.)
/// The text below builds one input step of each kind; a block of 8 inputs runs unrolled
/// between two prefetch shares.
///
/// Activation row `r` of the tile, as an address: `x + r * s` (`x3` is row 3).
macro_rules! xrow {
    (0) => { "{x}" };
    (1) => { "{x} + {s}" };
    (2) => { "{x} + 2*{s}" };
    (3) => { "{x3}" };
}

/// Row `r`: the broadcast text (which leaves row r's activation in `xv`), then `xv` times
/// the three weight vectors into the row's accumulators.
macro_rules! fma_row {
    ($r:tt, $bcast:expr) => {
        concat!($bcast, "vfmadd231ps {a", $r, "0}, {xv}, {w0}\n", "vfmadd231ps {a", $r, "1}, {xv}, {w1}\n", "vfmadd231ps {a", $r, "2}, {xv}, {w2}\n")
    };
}

/// Input `k` of an f32 or f16 block: each half panel's 8 weights (`$ws` bytes per input)
/// loaded and widened by `$load` (`vmovups` or `vcvtph2ps`), then the four rows.
macro_rules! float_step {
    ($load:literal, $ws:literal, $k:literal) => {
        concat!(
            $load, " {w0}, [{p0} + ", $ws, "*", $k, "]\n",
            $load, " {w1}, [{p1} + ", $ws, "*", $k, "]\n",
            $load, " {w2}, [{p2} + ", $ws, "*", $k, "]\n",
            fma_row!(0, concat!("vbroadcastss {xv}, [", xrow!(0), " + 4*", $k, "]\n")),
            fma_row!(1, concat!("vbroadcastss {xv}, [", xrow!(1), " + 4*", $k, "]\n")),
            fma_row!(2, concat!("vbroadcastss {xv}, [", xrow!(2), " + 4*", $k, "]\n")),
            fma_row!(3, concat!("vbroadcastss {xv}, [", xrow!(3), " + 4*", $k, "]\n")),
        )
    };
}

/// Input pair `p` of a bf16 block. Each 32-bit weight lane holds the even input's bf16 in
/// its low half and the odd input's in its high half: a shift and a mask (`hi`: 0xffff0000
/// per lane) widen them to f32 exactly. The activations are f32, the pair's two 4 bytes
/// apart.
macro_rules! bf16_step {
    ($p:literal) => {
        concat!(
            "vmovdqu {w0}, [{p0} + 64*", $p, "]\n", "vpslld {w0}, {w0}, 16\n",
            "vmovdqu {w1}, [{p1} + 64*", $p, "]\n", "vpslld {w1}, {w1}, 16\n",
            "vmovdqu {w2}, [{p2} + 64*", $p, "]\n", "vpslld {w2}, {w2}, 16\n",
            fma_row!(0, concat!("vbroadcastss {xv}, [", xrow!(0), " + 8*", $p, "]\n")),
            fma_row!(1, concat!("vbroadcastss {xv}, [", xrow!(1), " + 8*", $p, "]\n")),
            fma_row!(2, concat!("vbroadcastss {xv}, [", xrow!(2), " + 8*", $p, "]\n")),
            fma_row!(3, concat!("vbroadcastss {xv}, [", xrow!(3), " + 8*", $p, "]\n")),
            "vmovdqu {w0}, [{p0} + 64*", $p, "]\n", "vpand {w0}, {w0}, [{hi}]\n",
            "vmovdqu {w1}, [{p1} + 64*", $p, "]\n", "vpand {w1}, {w1}, [{hi}]\n",
            "vmovdqu {w2}, [{p2} + 64*", $p, "]\n", "vpand {w2}, {w2}, [{hi}]\n",
            fma_row!(0, concat!("vbroadcastss {xv}, [", xrow!(0), " + 8*", $p, " + 4]\n")),
            fma_row!(1, concat!("vbroadcastss {xv}, [", xrow!(1), " + 8*", $p, " + 4]\n")),
            fma_row!(2, concat!("vbroadcastss {xv}, [", xrow!(2), " + 8*", $p, " + 4]\n")),
            fma_row!(3, concat!("vbroadcastss {xv}, [", xrow!(3), " + 8*", $p, " + 4]\n")),
        )
    };
}

/// Runs the text `$t` on the register tile `$a` (`[[__m256; 3]; 4]`, in registers
/// throughout): weights from `$p[0..3]`, activation rows from `$x` (row 3 at `$x3`, rows
/// `$s` bytes apart), plus any `$extra` operands.
macro_rules! tile_asm {
    ($a:ident, $p:ident, $x:expr, $x3:expr, $s:expr, [$($t:expr),+] $(, $($extra:tt)*)?) => {
        std::arch::asm!(
            $($t),+,
            p0 = in(reg) $p[0], p1 = in(reg) $p[1], p2 = in(reg) $p[2], x = in(reg) $x, x3 = in(reg) $x3, s = in(reg) $s,
            a00 = inout(ymm_reg) $a[0][0], a01 = inout(ymm_reg) $a[0][1], a02 = inout(ymm_reg) $a[0][2],
            a10 = inout(ymm_reg) $a[1][0], a11 = inout(ymm_reg) $a[1][1], a12 = inout(ymm_reg) $a[1][2],
            a20 = inout(ymm_reg) $a[2][0], a21 = inout(ymm_reg) $a[2][1], a22 = inout(ymm_reg) $a[2][2],
            a30 = inout(ymm_reg) $a[3][0], a31 = inout(ymm_reg) $a[3][1], a32 = inout(ymm_reg) $a[3][2],
            w0 = out(ymm_reg) _, w1 = out(ymm_reg) _, w2 = out(ymm_reg) _, xv = out(ymm_reg) _,
            $($($extra)*,)?
            options(nostack, readonly, preserves_flags),
        )
    };
}

/// The float tiles' kinds of weights (the activations are f32).
const F32: u8 = 0;
const F16: u8 = 1;
const BF16_F32X: u8 = 2;

/// The bf16 mask of [`bf16_step`].
static HIGH_HALVES: [u32; 8] = [0xffff_0000; 8];

/// One K chunk of 4 rows by the three half panels at `w` (each `steps` steps: inputs, or
/// input pairs for bf16) of a float tile of kind `KIND`; activation rows `stride` bytes
/// apart. Returns the 4 x 3 sums.
///
/// # Safety
/// AVX2 and FMA; `x` addresses 4 rows with the chunk's activations from its start; each
/// `w[h]` addresses `steps` steps of the kind's weights.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_strip<const KIND: u8, const NR: usize>(x: *const u8, stride: usize, w: [*const u8; 3], steps: usize, pf: &mut Spread<NR>) -> [[__m256; 3]; TILE_ROWS] {
    // Bytes per step of each weight stream and of the activations; steps per block of 8
    // inputs.
    let (wstep, xstep, block) = match KIND {
        F32 => (64, 4, 8),
        F16 => (32, 4, 8),
        _ => (64, 8, 4),
    };
    let hi = HIGH_HALVES.as_ptr();
    let mut a = [[_mm256_setzero_ps(); 3]; TILE_ROWS];
    let mut s = 0;
    while s < steps {
        let p = w.map(|p| p.wrapping_add(s * wstep));
        let (xs, x3) = (x.wrapping_add(s * xstep), x.wrapping_add(3 * stride + s * xstep));
        // SAFETY (every arm): the text reads steps s..s+block (or s) of each weight stream
        // and of the 4 activation rows, inside the ranges the caller vouches for, and writes
        // only its register operands.
        unsafe {
            if s + block <= steps {
                pf.step();
                match KIND {
                    F32 => tile_asm!(a, p, xs, x3, stride, [
                        float_step!("vmovups", 64, 0), float_step!("vmovups", 64, 1), float_step!("vmovups", 64, 2), float_step!("vmovups", 64, 3),
                        float_step!("vmovups", 64, 4), float_step!("vmovups", 64, 5), float_step!("vmovups", 64, 6), float_step!("vmovups", 64, 7)
                    ]),
                    F16 => tile_asm!(a, p, xs, x3, stride, [
                        float_step!("vcvtph2ps", 32, 0), float_step!("vcvtph2ps", 32, 1), float_step!("vcvtph2ps", 32, 2), float_step!("vcvtph2ps", 32, 3),
                        float_step!("vcvtph2ps", 32, 4), float_step!("vcvtph2ps", 32, 5), float_step!("vcvtph2ps", 32, 6), float_step!("vcvtph2ps", 32, 7)
                    ]),
                    _ => tile_asm!(a, p, xs, x3, stride, [
                        bf16_step!(0), bf16_step!(1),
                        bf16_step!(2), bf16_step!(3)
                    ], hi = in(reg) hi),
                }
                s += block;
            } else {
                match KIND {
                    F32 => tile_asm!(a, p, xs, x3, stride, [float_step!("vmovups", 64, 0)]),
                    F16 => tile_asm!(a, p, xs, x3, stride, [float_step!("vcvtph2ps", 32, 0)]),
                    _ => tile_asm!(a, p, xs, x3, stride, [bf16_step!(0)], hi = in(reg) hi),
                }
                s += 1;
            }
        }
    }
    a
}

/// A float tile of kind `KIND`: its half panels three at a time through [`float_strip`].
/// Half 1 of a panel starts `half` bytes into each step. A last strip of one or two halves
/// repeats the tile's last half in the others (computed, not stored).
///
/// # Safety
/// As [`float_strip`], for each panel; `out` as in `TileOut::put` (x86.rs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_tile<const KIND: u8, const NR: usize>(x: *const u8, stride: usize, w: [*const u8; NR], half: usize, steps: usize, out: &TileOut, pf: Prefetch<NR>) {
    let halves = 2 * NR;
    let block = if KIND == F32 || KIND == F16 { 8 } else { 4 };
    let mut pf = Spread::new(pf, halves.div_ceil(3) * (steps / block).max(1));
    for h0 in (0..halves).step_by(3) {
        let ptr = std::array::from_fn(|h| {
            let hh = (h0 + h).min(halves - 1);
            w[hh / 2].wrapping_add(hh % 2 * half)
        });
        // SAFETY: the caller's contract.
        let acc = unsafe { float_strip::<KIND, NR>(x, stride, ptr, steps, &mut pf) };
        for (i, row) in acc.iter().enumerate() {
            for (h, &a) in row.iter().enumerate().take(halves - h0) {
                // SAFETY: the caller's contract.
                unsafe { out.put8(i, h0 + h, NR, a) };
            }
        }
    }
}

/// f32 panels: `out[4 x 16*NR] (+)= x[4, kc] . W`.
///
/// # Safety
/// AVX2, FMA, F16C. Otherwise as [`super::x86::tile_f32`].
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_f32<const NR: usize>(x: *const f32, stride: usize, w: [*const u8; NR], kc: usize, out: &TileOut, pf: Prefetch<NR>) {
    // SAFETY: the function's contract; halves of a panel 32 bytes apart.
    unsafe { float_tile::<F32, NR>(x as *const u8, 4 * stride, w, 32, kc, out, pf) }
}

/// f16 panels, widened on the fly (`vcvtph2ps`).
///
/// # Safety
/// As [`tile_f32`] with 16 halves per step.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_f16<const NR: usize>(x: *const f32, stride: usize, w: [*const u8; NR], kc: usize, out: &TileOut, pf: Prefetch<NR>) {
    // SAFETY: the function's contract; halves of a panel 16 bytes apart.
    unsafe { float_tile::<F16, NR>(x as *const u8, 4 * stride, w, 16, kc, out, pf) }
}

/// bf16 panels against f32 activations (f32 products and sums, only the weights rounded).
///
/// # Safety
/// As [`super::x86::tile_bf16_f32`] (AVX2, FMA, F16C instead of AVX-512).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_bf16_f32<const NR: usize>(x: *const f32, stride: usize, w: [*const u8; NR], pairs: usize, out: &TileOut, pf: Prefetch<NR>) {
    // SAFETY: the function's contract; halves of a panel 32 bytes apart.
    unsafe { float_tile::<BF16_F32X, NR>(x as *const u8, 4 * stride, w, 32, pairs, out, pf) }
}

/// bf16 panels against bf16 activations: the activations are widened too, so each product
/// of two bf16 values is exact in f32 and the sums are f32, as `vdpbf16ps` computes them
/// (summation order aside). The 4 rows are widened once per tile into a buffer, then the
/// tile runs as against f32 activations (rather than widening each broadcast in every strip).
///
/// # Safety
/// As [`super::x86::tile_bf16`] (AVX2, FMA, F16C instead of AVX-512 BF16).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_bf16<const NR: usize>(x: *const u16, stride: usize, w: [*const u8; NR], pairs: usize, out: &TileOut, pf: Prefetch<NR>) {
    // Pairs per pass: the driver's bf16 chunks (512 inputs) take one.
    const PASS: usize = 256;
    let mut buf = std::mem::MaybeUninit::<[f32; TILE_ROWS * 2 * PASS]>::uninit();
    let buf = buf.as_mut_ptr() as *mut f32;
    for p0 in (0..pairs).step_by(PASS) {
        let n = (pairs - p0).min(PASS);
        for i in 0..TILE_ROWS {
            // SAFETY: row i holds 2 * pairs halves (the function's contract); the buffer row
            // 2 * PASS >= 2 * n floats.
            unsafe {
                let (src, dst) = (x.add(i * stride + 2 * p0), buf.add(i * 2 * PASS));
                let mut c = 0;
                while c + 8 <= 2 * n {
                    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(src.add(c) as *const __m128i));
                    _mm256_storeu_ps(dst.add(c), _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)));
                    c += 8;
                }
                for c in c..2 * n {
                    *dst.add(c) = f32::from_bits((*src.add(c) as u32) << 16);
                }
            }
        }
        // Later passes add to what the first stored.
        let o = TileOut { ptr: out.ptr, ldo: out.ldo, rows: out.rows, last_cols: out.last_cols, first: out.first && p0 == 0 };
        // SAFETY: the buffer holds the pass's 2 * n activations of each row; the weights of
        // pairs p0..p0+n per the function's contract.
        unsafe { float_tile::<BF16_F32X, NR>(buf as *const u8, 4 * 2 * PASS, w.map(|p| p.add(64 * p0)), 32, n, &o, pf) };
    }
}

/// q8 panels over `quads` groups of 4 inputs. The activations are u8 (quant + 128); flipping
/// the top bit gives back the signed quant `x`. With `|w|` as the unsigned operand and `x`
/// given `w`'s sign as the signed one, `vpmaddubsw` pair sums are at most 2 x 128 x 127
/// (`x` is clamped to -127..=127 by the quantiser; `|w|` of -128 reads as the u8 128), so
/// nothing saturates and the i32 sums are exactly `sum(x * w)`: the 128 offset never
/// enters, so `colsum` (which removes it on the VNNI path) is not needed. The chunk's
/// `acc * scale_w * scale_x` is accumulated into `out`.
///
/// # Safety
/// As [`super::x86::tile_q8_rows`] (AVX2, FMA, F16C instead of AVX-512 VNNI); `colsum` is unused.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q8_rows<const NR: usize, const MR: usize>(x: QuantRows, w: QuantPanels<NR>, _colsum: [*const i32; NR], quads: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, scale: xs, .. } = x;
    let (w, ws) = (w.w, w.scales.map(|p| p as *const f32));
    let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
    // A prefetch share per 8 quads.
    let mut pf = Spread::new(pf, NR * quads.div_ceil(8));
    for (j, &wj) in w.iter().enumerate() {
        let mut acc = [[_mm256_setzero_si256(); 2]; MR];
        for q in 0..quads {
            if q % 8 == 0 {
                pf.step();
            }
            // SAFETY: inside the ranges the caller vouches for.
            unsafe {
                let wv = [_mm256_loadu_si256(wj.add(64 * q) as *const __m256i), _mm256_loadu_si256(wj.add(64 * q + 32) as *const __m256i)];
                let wabs = wv.map(|v| _mm256_abs_epi8(v));
                for (i, row) in acc.iter_mut().enumerate() {
                    let xv = _mm256_xor_si256(_mm256_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 4 * q) as *const i32)), flip);
                    for h in 0..2 {
                        let pairs = _mm256_maddubs_epi16(wabs[h], _mm256_sign_epi8(xv, wv[h]));
                        row[h] = _mm256_add_epi32(row[h], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
        }
        for h in 0..2 {
            // SAFETY: 16 scales per panel (caller's contract).
            let scale = unsafe { _mm256_loadu_ps(ws[j].add(8 * h)) };
            for (i, row) in acc.iter().enumerate() {
                let v = _mm256_mul_ps(_mm256_cvtepi32_ps(row[h]), _mm256_mul_ps(scale, _mm256_set1_ps(xs[i])));
                // SAFETY: see the function's contract.
                unsafe { out.put8(i, 2 * j + h, NR, v) };
            }
        }
    }
}

/// q8 panels with per-block activation scales, as [`super::x86::tile_q8_blocks_rows`]: the
/// activations are signed quants here, and the products are exact signed sums as in
/// [`tile_q8_rows`], so no block sum is needed (the rows' sums are unread). Per block of 8
/// quads, `acc * scale_x[block]` is summed; the total times `scale_w` is accumulated into
/// `out`.
///
/// # Safety
/// As [`super::x86::tile_q8_blocks_rows`] (AVX2, FMA, F16C instead of AVX-512 VNNI).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q8_blocks_rows<const NR: usize, const MR: usize>(x: QuantRows, w: QuantPanels<NR>, blocks: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, blocks: xs, .. } = x;
    let xs = xs.expect("per-block activation scales");
    let (w, ws) = (w.w, w.scales.map(|p| p as *const f32));
    let ones = _mm256_set1_epi16(1);
    let mut pf = Spread::new(pf, NR * blocks);
    for (j, &wj) in w.iter().enumerate() {
        let mut res = [[_mm256_setzero_ps(); 2]; MR];
        for b in 0..blocks {
            pf.step();
            let mut acc = [[_mm256_setzero_si256(); 2]; MR];
            for q in 8 * b..8 * b + 8 {
                // SAFETY: inside the ranges the caller vouches for.
                unsafe {
                    let wv = [_mm256_loadu_si256(wj.add(64 * q) as *const __m256i), _mm256_loadu_si256(wj.add(64 * q + 32) as *const __m256i)];
                    let wabs = wv.map(|v| _mm256_abs_epi8(v));
                    for (i, row) in acc.iter_mut().enumerate() {
                        let xv = _mm256_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 4 * q) as *const i32));
                        for h in 0..2 {
                            let pairs = _mm256_maddubs_epi16(wabs[h], _mm256_sign_epi8(xv, wv[h]));
                            row[h] = _mm256_add_epi32(row[h], _mm256_madd_epi16(pairs, ones));
                        }
                    }
                }
            }
            for (i, (r, a)) in res.iter_mut().zip(&acc).enumerate() {
                // SAFETY: row i's scale of block b (caller's contract).
                let s = _mm256_set1_ps(unsafe { xs.at(i, b) });
                for h in 0..2 {
                    r[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[h]), s, r[h]);
                }
            }
        }
        for h in 0..2 {
            // SAFETY: 16 scales per panel (caller's contract).
            let scale = unsafe { _mm256_loadu_ps(ws[j].add(8 * h)) };
            for (i, row) in res.iter().enumerate() {
                // SAFETY: see the function's contract.
                unsafe { out.put8(i, 2 * j + h, NR, _mm256_mul_ps(row[h], scale)) };
            }
        }
    }
}

/// q4 panels over `groups` groups of `group` inputs, weights the unsigned operand: per
/// group, `(acc - 8 * sum of the group's activation quants) * scale_w[group]`, then times
/// the row's activation scale, accumulated into `out`.
///
/// A block of 8 inputs adds at most 2 x 2 x 15 x 128 = 7680 to an i16 lane, so up to four
/// blocks are summed in i16 (exactly) before one `vpmaddwd` widens them: about one
/// multiply instruction per 32 products rather than two.
///
/// Only the tile's first `MR` rows (1 to 4) are computed.
///
/// # Safety
/// As [`super::x86::tile_q4_rows`] (AVX2, FMA, F16C instead of AVX-512).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tile_q4_rows<const NR: usize, const MR: usize>(x: QuantRows, w: QuantPanels<NR>, group: usize, groups: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, sums: gsums, sums_stride: gstride, scale: xs, blocks: act_blocks } = x;
    let QuantPanels { w, scales, scale_group } = w;
    let (low, ones) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1));
    // A prefetch share per batch of four blocks.
    let mut pf = Spread::new(pf, NR * groups * (group / 8).div_ceil(4));
    for (j, &wj) in w.iter().enumerate() {
        let mut res = [[_mm256_setzero_ps(); 2]; MR];
        for g in 0..groups {
            let mut acc = [[_mm256_setzero_si256(); 2]; MR];
            let (mut b, end) = (g * group / 8, (g + 1) * group / 8);
            while b < end {
                let batch = (end - b).min(4);
                pf.step();
                let mut sum16 = [[_mm256_setzero_si256(); 2]; MR];
                for bb in b..b + batch {
                    // SAFETY: inside the ranges the caller vouches for.
                    unsafe {
                        let packed = [_mm256_loadu_si256(wj.add(64 * bb) as *const __m256i), _mm256_loadu_si256(wj.add(64 * bb + 32) as *const __m256i)];
                        let wa = packed.map(|v| _mm256_and_si256(v, low));
                        let wb = packed.map(|v| _mm256_and_si256(_mm256_srli_epi16::<4>(v), low));
                        for (i, s) in sum16.iter_mut().enumerate() {
                            let xa = _mm256_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 8 * bb) as *const i32));
                            let xb = _mm256_set1_epi32(std::ptr::read_unaligned(x.add(i * stride + 8 * bb + 4) as *const i32));
                            for h in 0..2 {
                                s[h] = _mm256_add_epi16(s[h], _mm256_add_epi16(_mm256_maddubs_epi16(wa[h], xa), _mm256_maddubs_epi16(wb[h], xb)));
                            }
                        }
                    }
                }
                for (a, s) in acc.iter_mut().zip(&sum16) {
                    for h in 0..2 {
                        a[h] = _mm256_add_epi32(a[h], _mm256_madd_epi16(s[h], ones));
                    }
                }
                b += batch;
            }
            for h in 0..2 {
                // SAFETY: the group's 16 scales of panel j, this half's 8 (caller's contract).
                let sw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(scales[j].add(32 * (g * group / scale_group) + 16 * h) as *const __m128i)) };
                for (i, (r, a)) in res.iter_mut().zip(&acc).enumerate() {
                    // SAFETY: row i's sum (and, per block, scale) of group g (caller's contract).
                    let corr = unsafe { _mm256_set1_epi32(*gsums.add(i * gstride + g)) };
                    let sw = match act_blocks {
                        Some(b) => _mm256_mul_ps(sw, _mm256_set1_ps(unsafe { b.at(i, g) })),
                        None => sw,
                    };
                    r[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(a[h], corr)), sw, r[h]);
                }
            }
        }
        for (i, row) in res.iter().enumerate() {
            for (h, &r) in row.iter().enumerate() {
                let r = if act_blocks.is_some() { r } else { _mm256_mul_ps(r, _mm256_set1_ps(xs[i])) };
                // SAFETY: see the function's contract.
                unsafe { out.put8(i, 2 * j + h, NR, r) };
            }
        }
    }
}

/// Quantises one row to int8 as `super::x86::quantize_row_avx512` does (`x ~= q * scale`,
/// half to even, each byte XOR-ed with `flip`, 8 x each `group`'s quant sum into `sums`),
/// giving the same quants as the portable path. Returns the scale.
///
/// # Safety
/// AVX2. `x` and `out` hold `k` elements, `k` a multiple of 8 and of `group` (a multiple of
/// 8); `sums` holds `k / group`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_row_avx2(x: &[f32], out: &mut [u8], flip: u8, group: usize, sums: &mut [i32]) -> f32 {
    let k = x.len();
    assert!(k % 8 == 0 && group % 8 == 0 && k % group == 0 && out.len() >= k && sums.len() >= k / group);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for c in (0..k).step_by(8) {
        // SAFETY: c + 8 <= k.
        m = _mm256_max_ps(m, _mm256_and_ps(unsafe { _mm256_loadu_ps(x.as_ptr().add(c)) }, abs));
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 floats.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), m) };
    let scale = lanes.iter().fold(0f32, |a, &b| a.max(b)) / 127.0;
    let inv = _mm256_set1_ps(if scale > 0.0 { 1.0 / scale } else { 0.0 });
    let flip = u64::from_ne_bytes([flip; 8]);
    for (g, sum) in sums.iter_mut().enumerate().take(k / group) {
        let mut acc = _mm256_setzero_si256();
        for c in (g * group..(g + 1) * group).step_by(8) {
            // SAFETY: c + 8 <= k; `out` holds k bytes.
            unsafe {
                // Rounds half to even (the default MXCSR mode); |q| <= 127 as the scale maps
                // the largest magnitude to 127, so the saturating packs never clamp.
                let q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(c)), inv));
                acc = _mm256_add_epi32(acc, q);
                // i32 -> i8 within each 128-bit lane: lane 0's low 4 bytes hold q0..q3, lane
                // 1's q4..q7.
                let b = _mm256_packs_epi16(_mm256_packs_epi32(q, q), _mm256_setzero_si256());
                let lo = _mm_cvtsi128_si32(_mm256_castsi256_si128(b)) as u32 as u64;
                let hi = _mm_cvtsi128_si32(_mm256_extracti128_si256::<1>(b)) as u32 as u64;
                std::ptr::write_unaligned(out.as_mut_ptr().add(c) as *mut u64, (lo | hi << 32) ^ flip);
            }
        }
        let mut s = [0i32; 8];
        // SAFETY: `s` holds 8 ints.
        unsafe { _mm256_storeu_si256(s.as_mut_ptr() as *mut __m256i, acc) };
        *sum = 8 * s.iter().sum::<i32>();
    }
    scale
}
