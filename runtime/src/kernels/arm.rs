//! AArch64 NEON kernels: the f32 dot-product tile (attention scores, RMSNorm) and the GEMM
//! tiles of every packed format, with the same operands and contracts as the x86 tiles
//! (`x86.rs`), so the GEMM driver calls either.
//!
//! A tile covers four rows and one 16-column panel at a time (sixteen 4-lane accumulators;
//! NEON has 32 registers), looping over the panels it was given. The integer tiles use the
//! best instruction the CPU has: `smmla` (i8mm: two rows by two columns by eight inputs),
//! `sdot` (dotprod: four inputs per lane), or widening multiplies with pairwise adds
//! (`smull` + `sadalp`, every ARMv8-A core). bf16 activations use `bfdot` where present and
//! are widened to f32 otherwise. The instructions the Rust standard library only offers as
//! unstable intrinsics (`sdot`, `smmla`, `bfdot`, `fcvtl`) are written as one-instruction
//! `asm!` blocks in functions compiled with the extension enabled.
//!
//! Integer sums are exact, and the float epilogues use the portable path's operations in its
//! order, so on one K chunk the integer formats give the portable path's results exactly.

#![cfg(target_arch = "aarch64")]

use std::arch::aarch64::*;
use std::arch::asm;

use super::tile::{Path, Prefetch, QuantPanels, QuantRows, Spread, TileOut, TILE_ROWS};

/// Dot products of `MR` rows of `x` with `NR` rows of `w`, all of length `k`: 4-lane
/// accumulators, reduced pairwise.
pub fn dot_tile_neon<const MR: usize, const NR: usize>(x: [&[f32]; MR], w: [&[f32]; NR], k: usize) -> [[f32; NR]; MR] {
    for s in x.iter().chain(w.iter()) {
        assert!(s.len() >= k);
    }
    let full = k / 4 * 4;
    // SAFETY: NEON is in the AArch64 base instruction set; every load reads c..c + 4 with
    // c + 4 <= full <= k <= the slice's length (asserted above).
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); NR]; MR];
        let mut c = 0;
        while c < full {
            let wv: [float32x4_t; NR] = std::array::from_fn(|j| vld1q_f32(w[j].as_ptr().add(c)));
            for i in 0..MR {
                let xv = vld1q_f32(x[i].as_ptr().add(c));
                for j in 0..NR {
                    acc[i][j] = vfmaq_f32(acc[i][j], xv, wv[j]);
                }
            }
            c += 4;
        }
        let mut out = [[0f32; NR]; MR];
        for i in 0..MR {
            for j in 0..NR {
                let a = acc[i][j];
                let s = (vgetq_lane_f32::<0>(a) + vgetq_lane_f32::<2>(a)) + (vgetq_lane_f32::<1>(a) + vgetq_lane_f32::<3>(a));
                out[i][j] = super::dot_tail::<true>(x[i], w[j], full, k, s);
            }
        }
        out
    }
}

impl TileOut {
    /// Writes or accumulates columns `4 q .. 4 q + 4` of panel `j` (of `nr`) in row `i`.
    ///
    /// # Safety
    /// `ptr` must address `rows` rows of `ldo` floats from which the tile's columns are
    /// writable by this thread alone (the GEMM driver gives each task its own columns).
    #[inline(always)]
    unsafe fn put4(&self, i: usize, j: usize, q: usize, nr: usize, v: float32x4_t) {
        let (cols, c0) = (self.cols(j, nr), 4 * q);
        if i >= self.rows || c0 >= cols {
            return;
        }
        // SAFETY: inside the tile the caller owns; partial vectors are written lane by lane.
        unsafe {
            let p = self.ptr.add(i * self.ldo + 16 * j + c0);
            if cols - c0 >= 4 {
                let v = if self.first { v } else { vaddq_f32(v, vld1q_f32(p)) };
                vst1q_f32(p, v);
            } else {
                let mut lanes = [0f32; 4];
                vst1q_f32(lanes.as_mut_ptr(), v);
                for (l, &val) in lanes.iter().enumerate().take(cols - c0) {
                    *p.add(l) = if self.first { val } else { *p.add(l) + val };
                }
            }
        }
    }

    /// Writes or accumulates one panel's four rows.
    ///
    /// # Safety
    /// As [`TileOut::put4`].
    #[inline(always)]
    unsafe fn put_panel(&self, j: usize, nr: usize, acc: &[[float32x4_t; 4]; TILE_ROWS]) {
        for (i, row) in acc.iter().enumerate() {
            for (q, &v) in row.iter().enumerate() {
                // SAFETY: the caller's contract.
                unsafe { self.put4(i, j, q, nr, v) };
            }
        }
    }
}

/// The prefetches of a multi-panel tile, issued during its first panel's loop.
fn first_only<const NR: usize>(pf: Prefetch<NR>, j: usize) -> Prefetch<NR> {
    Prefetch { ptr: pf.ptr, lines: if j == 0 { pf.lines } else { 0 } }
}

/// `acc[i][q] += x_i * w[q]` for the four rows' activations `x`.
#[inline(always)]
fn fma_rows(acc: &mut [[float32x4_t; 4]; TILE_ROWS], x: [f32; TILE_ROWS], w: [float32x4_t; 4]) {
    for (row, xi) in acc.iter_mut().zip(x) {
        for (a, &wq) in row.iter_mut().zip(&w) {
            // SAFETY: NEON is in the base instruction set.
            *a = unsafe { vfmaq_n_f32(*a, wq, xi) };
        }
    }
}

/// 16 halves (f16 bits) widened to f32 with `fcvtl` / `fcvtl2` (base ARMv8-A; the standard
/// library's intrinsic needs the unstable `f16` type).
#[inline(always)]
fn widen_f16(h: [uint16x8_t; 2]) -> [float32x4_t; 4] {
    let widen = |half: uint16x8_t| {
        let (lo, hi): (float32x4_t, float32x4_t);
        // SAFETY: register-only conversion of the base instruction set.
        unsafe { asm!("fcvtl {lo:v}.4s, {h:v}.4h", "fcvtl2 {hi:v}.4s, {h:v}.8h", h = in(vreg) half, lo = out(vreg) lo, hi = out(vreg) hi, options(pure, nomem, nostack, preserves_flags)) };
        [lo, hi]
    };
    let ([a, b], [c, d]) = (widen(h[0]), widen(h[1]));
    [a, b, c, d]
}

/// The float formats' panel loop: `steps` input steps, `load(s)` the 16 weight columns of
/// step `s` and `x(i, s)` row `i`'s activation for it.
#[inline(always)]
fn float_panel(steps: usize, pf: Prefetch<6>, mut load: impl FnMut(usize) -> [float32x4_t; 4], mut x: impl FnMut(usize, usize) -> f32) -> [[float32x4_t; 4]; TILE_ROWS] {
    // SAFETY: NEON is in the base instruction set.
    let mut acc = [[unsafe { vdupq_n_f32(0.0) }; 4]; TILE_ROWS];
    let mut pf = Spread::new(pf, steps);
    for s in 0..steps {
        pf.step();
        fma_rows(&mut acc, std::array::from_fn(|i| x(i, s)), load(s));
    }
    acc
}

fn six<const NR: usize>(pf: Prefetch<NR>) -> Prefetch<6> {
    Prefetch { ptr: std::array::from_fn(|j| if j < NR { pf.ptr[j] } else { std::ptr::null() }), lines: if NR == 0 { 0 } else { pf.lines } }
}

/// Four 16-byte loads: one 64-byte step of a panel.
///
/// # Safety
/// `p` addresses 64 readable bytes.
#[inline(always)]
unsafe fn load64(p: *const u8) -> [uint8x16_t; 4] {
    // SAFETY: the caller's contract.
    std::array::from_fn(|q| unsafe { vld1q_u8(p.add(16 * q)) })
}

/// f32 panels. Contract as `x86::tile_f32` (`path` is NEON for every float format).
///
/// # Safety
/// As `x86::tile_f32`, with NEON instead of AVX-512.
pub unsafe fn tile_f32<const NR: usize>(_path: Path, x: *const f32, stride: usize, w: [*const u8; NR], kc: usize, out: &TileOut, pf: Prefetch<NR>) {
    for (j, &wj) in w.iter().enumerate() {
        // SAFETY: the loads stay inside the chunk the caller vouches for.
        let acc = float_panel(kc, six(first_only(pf, j)), |s| unsafe { load64(wj.add(64 * s)) }.map(|v| unsafe { vreinterpretq_f32_u8(v) }), |i, s| unsafe { *x.add(i * stride + s) });
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &acc) };
    }
}

/// f16 panels, widened with `fcvtl`. Contract as `x86::tile_f16`.
///
/// # Safety
/// As `x86::tile_f16`, with NEON instead of AVX-512.
pub unsafe fn tile_f16<const NR: usize>(_path: Path, x: *const f32, stride: usize, w: [*const u8; NR], kc: usize, out: &TileOut, pf: Prefetch<NR>) {
    for (j, &wj) in w.iter().enumerate() {
        let load = |s: usize| {
            // SAFETY: 32 bytes of step s, inside the chunk the caller vouches for.
            let h = unsafe { [vld1q_u16(wj.add(32 * s) as *const u16), vld1q_u16(wj.add(32 * s + 16) as *const u16)] };
            widen_f16(h)
        };
        // SAFETY: inside the rows the caller vouches for.
        let acc = float_panel(kc, six(first_only(pf, j)), load, |i, s| unsafe { *x.add(i * stride + s) });
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &acc) };
    }
}

/// A 64-byte bf16 pair step of a panel as the even inputs' and the odd inputs' 16 columns
/// in f32 (exact: bf16 is the top half of an f32).
#[inline(always)]
fn widen_bf16_pairs(v: [uint8x16_t; 4]) -> ([float32x4_t; 4], [float32x4_t; 4]) {
    // SAFETY: register-only operations of the base instruction set.
    unsafe {
        let high = vdupq_n_u32(0xffff_0000);
        let lanes = v.map(|b| vreinterpretq_u32_u8(b));
        (lanes.map(|l| vreinterpretq_f32_u32(vshlq_n_u32::<16>(l))), lanes.map(|l| vreinterpretq_f32_u32(vandq_u32(l, high))))
    }
}

/// bf16 panels against f32 activations (weights widened; f32 products and sums). Contract as
/// `x86::tile_bf16_f32`.
///
/// # Safety
/// As `x86::tile_bf16_f32`, with NEON instead of AVX-512.
pub unsafe fn tile_bf16_f32<const NR: usize>(_path: Path, x: *const f32, stride: usize, w: [*const u8; NR], pairs: usize, out: &TileOut, pf: Prefetch<NR>) {
    for (j, &wj) in w.iter().enumerate() {
        // SAFETY: NEON is in the base instruction set.
        let mut acc = [[unsafe { vdupq_n_f32(0.0) }; 4]; TILE_ROWS];
        let mut pfj = Spread::new(first_only(pf, j), pairs);
        for p in 0..pairs {
            pfj.step();
            // SAFETY: step p of the panel and inputs 2p, 2p + 1 of each row are inside the
            // ranges the caller vouches for (rows hold 2 * pairs floats).
            let (even, odd) = widen_bf16_pairs(unsafe { load64(wj.add(64 * p)) });
            fma_rows(&mut acc, std::array::from_fn(|i| unsafe { *x.add(i * stride + 2 * p) }), even);
            fma_rows(&mut acc, std::array::from_fn(|i| unsafe { *x.add(i * stride + 2 * p + 1) }), odd);
        }
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &acc) };
    }
}

/// `acc += w . x` over bf16 pairs with `bfdot`: each lane of `w` holds a column's (even, odd)
/// pair, each lane of `x` the same activation pair.
#[inline]
#[target_feature(enable = "bf16")]
fn bfdot(acc: float32x4_t, w: uint8x16_t, x: uint32x4_t) -> float32x4_t {
    let mut a = acc;
    // SAFETY: register-only; the enclosing function is compiled with the bf16 extension and
    // called only where the CPU has it.
    unsafe { asm!("bfdot {a:v}.4s, {w:v}.8h, {x:v}.8h", a = inout(vreg) a, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags)) };
    a
}

/// The `bfdot` loop of one panel: `pairs` steps of 64 bytes at `w`, bf16 rows at `x`.
///
/// # Safety
/// The CPU has the bf16 extension; the pointers are inside the caller's ranges.
#[target_feature(enable = "bf16")]
unsafe fn bf16_panel_bfdot(x: *const u16, stride: usize, w: *const u8, pairs: usize, pf: Prefetch<6>) -> [[float32x4_t; 4]; TILE_ROWS] {
    // SAFETY: NEON is in the base set; step p of the panel and the pair at 2p of each row
    // are inside the caller's ranges.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); 4]; TILE_ROWS];
        let mut pf = Spread::new(pf, pairs);
        for p in 0..pairs {
            pf.step();
            let wv = load64(w.add(64 * p));
            for (i, row) in acc.iter_mut().enumerate() {
                let pair = vdupq_n_u32(std::ptr::read_unaligned(x.add(i * stride + 2 * p) as *const u32));
                for (a, &wq) in row.iter_mut().zip(&wv) {
                    *a = bfdot(*a, wq, pair);
                }
            }
        }
        acc
    }
}

/// bf16 panels with bf16 activations: `bfdot` on [`Path::NeonBf16`], else both operands
/// widened to f32 (exact products, f32 sums). Contract as `x86::tile_bf16`.
///
/// # Safety
/// As `x86::tile_bf16`; [`Path::NeonBf16`] only where the CPU has the bf16 extension.
pub unsafe fn tile_bf16<const NR: usize>(path: Path, x: *const u16, stride: usize, w: [*const u8; NR], pairs: usize, out: &TileOut, pf: Prefetch<NR>) {
    let widen = |h: u16| f32::from_bits((h as u32) << 16);
    for (j, &wj) in w.iter().enumerate() {
        let pfj = six(first_only(pf, j));
        let acc = if path == Path::NeonBf16 {
            // SAFETY: the path is chosen only where the CPU has bf16; ranges as the caller's.
            unsafe { bf16_panel_bfdot(x, stride, wj, pairs, pfj) }
        } else {
            // SAFETY: NEON is in the base instruction set.
            let mut acc = [[unsafe { vdupq_n_f32(0.0) }; 4]; TILE_ROWS];
            let mut pfj = Spread::new(pfj, pairs);
            for p in 0..pairs {
                pfj.step();
                // SAFETY: inside the ranges the caller vouches for.
                let (even, odd) = widen_bf16_pairs(unsafe { load64(wj.add(64 * p)) });
                fma_rows(&mut acc, std::array::from_fn(|i| widen(unsafe { *x.add(i * stride + 2 * p) })), even);
                fma_rows(&mut acc, std::array::from_fn(|i| widen(unsafe { *x.add(i * stride + 2 * p + 1) })), odd);
            }
            acc
        };
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &acc) };
    }
}

/// Integer sums of one panel: `[row][quarter]`, four columns per vector.
type IntSums = [[int32x4_t; 4]; TILE_ROWS];

fn zero_sums() -> IntSums {
    // SAFETY: NEON is in the base instruction set.
    [[unsafe { vdupq_n_s32(0) }; 4]; TILE_ROWS]
}

/// `acc += w . x[L]`: each lane of `acc` (a column) gains the dot product of its four bytes
/// of `w` with 32-bit lane `L` of `x`.
#[inline]
#[target_feature(enable = "dotprod")]
fn sdot<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut a = acc;
    // SAFETY (every arm): register-only; the enclosing function is compiled with dotprod and
    // called only where the CPU has it.
    unsafe {
        match L {
            0 => asm!("sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[0]", a = inout(vreg) a, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags)),
            1 => asm!("sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[1]", a = inout(vreg) a, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags)),
            2 => asm!("sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[2]", a = inout(vreg) a, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags)),
            _ => asm!("sdot {a:v}.4s, {w:v}.16b, {x:v}.4b[3]", a = inout(vreg) a, w = in(vreg) w, x = in(vreg) x, options(pure, nomem, nostack, preserves_flags)),
        }
    }
    a
}

/// `acc += x . w^T` for 2x8 int8 blocks: rows of `x` are two activation rows' eight inputs,
/// rows of `w` two columns' eight weights; `acc` is `[x0.w0, x0.w1, x1.w0, x1.w1]`.
#[inline]
#[target_feature(enable = "i8mm")]
fn smmla(acc: int32x4_t, x: int8x16_t, w: int8x16_t) -> int32x4_t {
    let mut a = acc;
    // SAFETY: register-only; compiled with i8mm, called only where the CPU has it.
    unsafe { asm!("smmla {a:v}.4s, {x:v}.16b, {w:v}.16b", a = inout(vreg) a, x = in(vreg) x, w = in(vreg) w, options(pure, nomem, nostack, preserves_flags)) };
    a
}

/// Four input bytes broadcast to every 32-bit lane.
///
/// # Safety
/// `p` addresses 4 readable bytes.
#[inline(always)]
unsafe fn quad(p: *const u8, flip: u32) -> int8x16_t {
    // SAFETY: the caller's contract.
    unsafe { vreinterpretq_s8_u32(vdupq_n_u32(std::ptr::read_unaligned(p as *const u32) ^ flip)) }
}

/// Two rows' eight input bytes as one 2x8 block.
///
/// # Safety
/// `a` and `b` address 8 readable bytes.
#[inline(always)]
unsafe fn row_pair(a: *const u8, b: *const u8, flip: u64) -> int8x16_t {
    // SAFETY: the caller's contract.
    unsafe {
        let lo = vcreate_u64(std::ptr::read_unaligned(a as *const u64) ^ flip);
        let hi = vcreate_u64(std::ptr::read_unaligned(b as *const u64) ^ flip);
        vreinterpretq_s8_u64(vcombine_u64(lo, hi))
    }
}

/// Columns `(4m, 4m+1)` and `(4m+2, 4m+3)` of two 64-byte quad steps (`a`: inputs 0..4, `b`:
/// inputs 4..8) as 2x8 blocks for `smmla`.
#[inline(always)]
fn column_pairs(a: int8x16_t, b: int8x16_t) -> (int8x16_t, int8x16_t) {
    // SAFETY: register-only operations of the base instruction set.
    unsafe {
        let (a, b) = (vreinterpretq_s32_s8(a), vreinterpretq_s32_s8(b));
        (vreinterpretq_s8_s32(vzip1q_s32(a, b)), vreinterpretq_s8_s32(vzip2q_s32(a, b)))
    }
}

/// `smmla` results `[row pair][column pair]` as `[row][quarter]` sums added to `acc`.
#[inline(always)]
fn add_blocks(acc: &mut IntSums, blocks: &[[int32x4_t; 8]; 2]) {
    // SAFETY: register-only operations of the base instruction set.
    unsafe {
        for (rp, pair) in blocks.iter().enumerate() {
            for m in 0..4 {
                let (a, b) = (vreinterpretq_s64_s32(pair[2 * m]), vreinterpretq_s64_s32(pair[2 * m + 1]));
                acc[2 * rp][m] = vaddq_s32(acc[2 * rp][m], vreinterpretq_s32_s64(vzip1q_s64(a, b)));
                acc[2 * rp + 1][m] = vaddq_s32(acc[2 * rp + 1][m], vreinterpretq_s32_s64(vzip2q_s64(a, b)));
            }
        }
    }
}

/// Where the int8 inputs of an integer panel come from. q8 steps are quads (four inputs,
/// one 64-byte step); q4 steps are blocks of eight (a 64-byte step whose low nibbles are the
/// first four inputs and high nibbles the last four).
#[derive(Clone, Copy)]
struct IntPanel {
    x: *const u8,
    stride: usize,
    w: *const u8,
    /// q4: weights are nibbles.
    nibbles: bool,
    /// XOR-ed into every activation byte: 0x80 turns the q8 operand (`q + 128`) back into q.
    flip: u8,
}

impl IntPanel {
    /// Weights of 64-byte step `s`: for q8 one quad step; for q4 the (low, high) nibbles.
    ///
    /// # Safety
    /// Step `s` is inside the panel's range.
    #[inline(always)]
    unsafe fn weights(&self, s: usize) -> ([int8x16_t; 4], [int8x16_t; 4]) {
        // SAFETY: the caller's contract.
        let raw = unsafe { load64(self.w.add(64 * s)) };
        // SAFETY: register-only operations of the base instruction set.
        unsafe {
            if self.nibbles {
                let low = vdupq_n_u8(0x0f);
                (raw.map(|v| vreinterpretq_s8_u8(vandq_u8(v, low))), raw.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v))))
            } else {
                let s8 = raw.map(|v| vreinterpretq_s8_u8(v));
                (s8, s8)
            }
        }
    }

    /// Bytes per step of an activation row: 4 (q8 quad) or 8 (q4 block).
    fn x_step(&self) -> usize {
        if self.nibbles { 8 } else { 4 }
    }

    fn flip32(&self) -> u32 {
        u32::from_ne_bytes([self.flip; 4])
    }

    fn flip64(&self) -> u64 {
        u64::from_ne_bytes([self.flip; 8])
    }

    /// Row `i`'s activations at input `k` (a byte offset).
    fn xrow(&self, i: usize, k: usize) -> *const u8 {
        self.x.wrapping_add(i * self.stride + k)
    }

    /// Integer sums of steps `s0..s1` on every core: `smull` of a column's four weights with
    /// the broadcast quad, pairwise-added into 32-bit lanes (`sadalp`), two rows at a time.
    ///
    /// # Safety
    /// Steps `s0..s1` of the panel and of four activation rows are readable.
    #[inline(always)]
    unsafe fn sums_neon(&self, s0: usize, s1: usize, pf: Prefetch<6>, acc: &mut IntSums) {
        let (flip, xs) = (self.flip32(), self.x_step());
        let mut pf = Spread::new(pf, s1 - s0);
        for rp in 0..2 {
            // SAFETY (the block): NEON is in the base instruction set; the loads are inside
            // the caller's ranges.
            unsafe {
                // [row of the pair][quarter]: lanes (column, first or second input pair).
                let mut lo = [[vdupq_n_s32(0); 4]; 2];
                let mut hi = [[vdupq_n_s32(0); 4]; 2];
                for s in s0..s1 {
                    if rp == 0 {
                        pf.step();
                    }
                    let (wa, wb) = self.weights(s);
                    for r in 0..2 {
                        let i = 2 * rp + r;
                        let halves = if self.nibbles { 2 } else { 1 };
                        for h in 0..halves {
                            let xq = quad(self.xrow(i, s * xs + 4 * h), flip);
                            let wv = if h == 0 { wa } else { wb };
                            for m in 0..4 {
                                lo[r][m] = vpadalq_s16(lo[r][m], vmull_s8(vget_low_s8(wv[m]), vget_low_s8(xq)));
                                hi[r][m] = vpadalq_s16(hi[r][m], vmull_high_s8(wv[m], xq));
                            }
                        }
                    }
                }
                for r in 0..2 {
                    for m in 0..4 {
                        acc[2 * rp + r][m] = vaddq_s32(acc[2 * rp + r][m], vpaddq_s32(lo[r][m], hi[r][m]));
                    }
                }
            }
        }
    }

    /// As [`IntPanel::sums_neon`] with `sdot`: each activation quad is a lane of one load.
    ///
    /// # Safety
    /// As [`IntPanel::sums_neon`]; the CPU has dotprod.
    #[target_feature(enable = "dotprod")]
    unsafe fn sums_sdot(&self, s0: usize, s1: usize, pf: Prefetch<6>, acc: &mut IntSums) {
        let (flip, xs) = (self.flip32(), self.x_step());
        let mut pf = Spread::new(pf, s1 - s0);
        for s in s0..s1 {
            pf.step();
            // SAFETY: inside the caller's ranges.
            let (wa, wb) = unsafe { self.weights(s) };
            for (i, row) in acc.iter_mut().enumerate() {
                if self.nibbles {
                    // Lanes 0 and 1: the block's first and last four inputs.
                    let xv = unsafe { vreinterpretq_s8_u64(vdupq_n_u64(std::ptr::read_unaligned(self.xrow(i, s * xs) as *const u64) ^ self.flip64())) };
                    for m in 0..4 {
                        row[m] = sdot::<1>(sdot::<0>(row[m], wa[m], xv), wb[m], xv);
                    }
                } else {
                    let xv = unsafe { quad(self.xrow(i, s * xs), flip) };
                    for m in 0..4 {
                        row[m] = sdot::<0>(row[m], wa[m], xv);
                    }
                }
            }
        }
    }

    /// As [`IntPanel::sums_neon`] with `smmla` on 2x8 blocks; a q8 chunk's odd last quad goes
    /// through `sdot`.
    ///
    /// # Safety
    /// As [`IntPanel::sums_neon`]; the CPU has i8mm and dotprod.
    #[target_feature(enable = "i8mm,dotprod")]
    unsafe fn sums_i8mm(&self, s0: usize, s1: usize, pf: Prefetch<6>, acc: &mut IntSums) {
        let mut blocks = [[vdupq_n_s32(0); 8]; 2];
        // q8 pairs two quad steps into eight inputs; q4 has eight in each step.
        let per = if self.nibbles { 1 } else { 2 };
        let mut s = s0;
        let mut spread = Spread::new(pf, (s1 - s0) / per);
        while s + per <= s1 {
            spread.step();
            // SAFETY: steps s..s + per are inside the caller's ranges.
            let (wa, wb) = unsafe { if self.nibbles { self.weights(s) } else { (self.weights(s).0, self.weights(s + 1).0) } };
            let k = s * self.x_step();
            let xr: [int8x16_t; 2] = std::array::from_fn(|rp| unsafe { row_pair(self.xrow(2 * rp, k), self.xrow(2 * rp + 1, k), self.flip64()) });
            for m in 0..4 {
                let (c01, c23) = column_pairs(wa[m], wb[m]);
                for (rp, pair) in blocks.iter_mut().enumerate() {
                    pair[2 * m] = smmla(pair[2 * m], xr[rp], c01);
                    pair[2 * m + 1] = smmla(pair[2 * m + 1], xr[rp], c23);
                }
            }
            s += per;
        }
        add_blocks(acc, &blocks);
        if s < s1 {
            // SAFETY: as above, with dotprod.
            unsafe { self.sums_sdot(s, s1, Prefetch { ptr: pf.ptr, lines: 0 }, acc) };
        }
    }

    /// Integer sums of steps `s0..s1` on `path`.
    ///
    /// # Safety
    /// As [`IntPanel::sums_neon`]; `path` is allowed on this CPU (`Path::of`).
    #[inline(always)]
    unsafe fn sums(&self, path: Path, s0: usize, s1: usize, pf: Prefetch<6>, acc: &mut IntSums) {
        // SAFETY: the caller's contract.
        unsafe {
            match path {
                Path::NeonI8mm => self.sums_i8mm(s0, s1, pf, acc),
                Path::NeonDotprod => self.sums_sdot(s0, s1, pf, acc),
                _ => self.sums_neon(s0, s1, pf, acc),
            }
        }
    }
}

/// q8 panels: `quads` groups of 4 inputs. The activations arrive as the x86 operand (u8,
/// quant + 128) and are turned back into signed quants as they load, so no column-sum
/// correction is needed (`colsum` is unused). The chunk's result `acc * scale_w * scale_x`
/// is accumulated into `out`. Contract as `x86::tile_q8_rows` with 4 rows.
///
/// # Safety
/// As `x86::tile_q8_rows`; `path` is allowed on this CPU (`Path::of`).
pub unsafe fn tile_q8<const NR: usize>(path: Path, x: QuantRows, w: QuantPanels<NR>, _colsum: [*const i32; NR], quads: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, scale: xs, .. } = x;
    let (w, ws) = (w.w, w.scales.map(|p| p as *const f32));
    for (j, &wj) in w.iter().enumerate() {
        let panel = IntPanel { x, stride, w: wj, nibbles: false, flip: 0x80 };
        let mut acc = zero_sums();
        // SAFETY: the caller's contract.
        unsafe { panel.sums(path, 0, quads, six(first_only(pf, j)), &mut acc) };
        // SAFETY: the panel's 16 scales (caller's contract); NEON is in the base set.
        let res = unsafe {
            let scale: [float32x4_t; 4] = std::array::from_fn(|m| vld1q_f32(ws[j].add(4 * m)));
            std::array::from_fn(|i| std::array::from_fn(|m| vmulq_n_f32(vmulq_f32(vcvtq_f32_s32(acc[i][m]), scale[m]), xs[i])))
        };
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &res) };
    }
}

/// q8 panels with per-block activation scales: the activations are signed quants (no flip),
/// each block of 8 quads summed on its own and multiplied by the row's scale of that block;
/// the total times `scale_w` is accumulated into `out` (the rows' sums are unread: the sums
/// are exact signed ones). Contract as `x86::tile_q8_blocks_rows` with 4 rows.
///
/// # Safety
/// As `x86::tile_q8_blocks_rows`; `path` is allowed on this CPU (`Path::of`).
pub unsafe fn tile_q8_blocks<const NR: usize>(path: Path, x: QuantRows, w: QuantPanels<NR>, blocks: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, blocks: xs, .. } = x;
    let xs = xs.expect("per-block activation scales");
    let (w, ws) = (w.w, w.scales.map(|p| p as *const f32));
    for (j, &wj) in w.iter().enumerate() {
        let panel = IntPanel { x, stride, w: wj, nibbles: false, flip: 0 };
        let pfj = six(first_only(pf, j));
        // SAFETY: NEON is in the base instruction set.
        let mut res = [[unsafe { vdupq_n_f32(0.0) }; 4]; TILE_ROWS];
        for b in 0..blocks {
            let mut acc = zero_sums();
            let spread = pfj.part(b, blocks);
            // SAFETY: the block's quads are inside the caller's ranges; its scales too; NEON
            // is in the base set. Multiply then add, unfused, in the portable path's order.
            unsafe {
                panel.sums(path, 8 * b, 8 * b + 8, spread, &mut acc);
                for (i, row) in res.iter_mut().enumerate() {
                    let s = xs.at(i, b);
                    for m in 0..4 {
                        row[m] = vaddq_f32(row[m], vmulq_n_f32(vcvtq_f32_s32(acc[i][m]), s));
                    }
                }
            }
        }
        // SAFETY: the panel's 16 scales (caller's contract); NEON is in the base set.
        let res = unsafe {
            let scale: [float32x4_t; 4] = std::array::from_fn(|m| vld1q_f32(ws[j].add(4 * m)));
            std::array::from_fn(|i| std::array::from_fn(|m| vmulq_f32(res[i][m], scale[m])))
        };
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &res) };
    }
}

/// q4 panels over `groups` groups of `group` inputs: per group, `(acc - 8 * sum of the
/// group's activation quants) * scale_w[group]`, then times the row's activation scale,
/// accumulated into `out`. Contract as `x86::tile_q4_rows` with 4 rows.
///
/// # Safety
/// As `x86::tile_q4_rows`; `path` is allowed on this CPU (`Path::of`).
pub unsafe fn tile_q4<const NR: usize>(path: Path, x: QuantRows, w: QuantPanels<NR>, group: usize, groups: usize, out: &TileOut, pf: Prefetch<NR>) {
    let QuantRows { x, stride, sums: gsums, sums_stride: gstride, scale: xs, blocks: act_blocks } = x;
    let QuantPanels { w, scales, scale_group } = w;
    let blocks = group / 8;
    for (j, &wj) in w.iter().enumerate() {
        let panel = IntPanel { x, stride, w: wj, nibbles: true, flip: 0 };
        let pfj = six(first_only(pf, j));
        // SAFETY: NEON is in the base instruction set.
        let mut res = [[unsafe { vdupq_n_f32(0.0) }; 4]; TILE_ROWS];
        for g in 0..groups {
            let mut acc = zero_sums();
            let spread = pfj.part(g, groups);
            // SAFETY: the group's blocks are inside the caller's ranges.
            unsafe { panel.sums(path, g * blocks, (g + 1) * blocks, spread, &mut acc) };
            // SAFETY: the group's 16 f16 scales of panel j and each row's sum of group g
            // (caller's contract); NEON is in the base set. Multiply then add, unfused, in
            // the portable path's order.
            unsafe {
                let at = 32 * (g * group / scale_group);
                let sw = widen_f16([vld1q_u16(scales[j].add(at) as *const u16), vld1q_u16(scales[j].add(at + 16) as *const u16)]);
                for (i, row) in res.iter_mut().enumerate() {
                    let corr = vdupq_n_s32(*gsums.add(i * gstride + g));
                    // Per block: the group's scales times the row's scale of this block.
                    let swi = match act_blocks {
                        Some(b) => sw.map(|v| vmulq_n_f32(v, b.at(i, g))),
                        None => sw,
                    };
                    for m in 0..4 {
                        row[m] = vaddq_f32(row[m], vmulq_f32(vcvtq_f32_s32(vsubq_s32(acc[i][m], corr)), swi[m]));
                    }
                }
            }
        }
        // SAFETY: NEON is in the base set.
        let res: [[float32x4_t; 4]; TILE_ROWS] = match act_blocks {
            Some(_) => res,
            None => std::array::from_fn(|i| res[i].map(|v| unsafe { vmulq_n_f32(v, xs[i]) })),
        };
        // SAFETY: the caller's contract.
        unsafe { out.put_panel(j, NR, &res) };
    }
}
