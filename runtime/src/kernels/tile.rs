//! What every SIMD GEMM tile shares, whatever its instruction set: which tiles run
//! ([`Path`]), where their results go ([`TileOut`]) and which weight lines they pull into
//! cache while they compute ([`Prefetch`]). Each ISA module adds its own store methods to
//! [`TileOut`].

use llada_ir::DType;

use super::cpu::Features;
use crate::model::Matrix;

/// Rows of every register tile.
pub const TILE_ROWS: usize = llada_ir::window::OPERAND_TILE_ROWS;

/// The kernels a GEMM runs on. On x86-64: the AVX-512 tiles when the CPU has the format's
/// extension (`vdpbf16ps` for bf16 activations, `vpdpbusd` for the integer formats), else
/// the AVX2 tiles (every format: bf16 widened to f32, int8 dot products from `vpmaddubsw`).
/// On AArch64 (`arm`): NEON tiles for every format, with `sdot` (dotprod) or `smmla` (i8mm)
/// for the integer formats and `bfdot` for bf16 activations where the CPU has them. Else
/// portable code.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Path {
    Portable,
    Avx2,
    Avx512,
    /// NEON only: int8 by widening multiplies, bf16 widened to f32.
    Neon,
    /// NEON with `sdot`.
    NeonDotprod,
    /// NEON with `smmla` (and `sdot` for odd quads).
    NeonI8mm,
    /// NEON with `bfdot` (bf16 activations).
    NeonBf16,
}

impl Path {
    /// The path `features` allows for `w`.
    pub(crate) fn of(w: &Matrix, features: Features) -> Path {
        if matches!(w.format, DType::F32 | DType::Bf16 | DType::F16) {
            return Path::Portable;
        }
        if cfg!(target_arch = "aarch64") {
            return match w.format {
                _ if !features.neon() => Path::Portable,
                DType::PanelBf16 if w.bf16_activations && features.bf16() => Path::NeonBf16,
                DType::PanelQ8 | DType::PanelQ4 { .. } if features.i8mm() => Path::NeonI8mm,
                DType::PanelQ8 | DType::PanelQ4 { .. } if features.dotprod() => Path::NeonDotprod,
                _ => Path::Neon,
            };
        }
        let avx512 = match w.format {
            DType::PanelF32 | DType::PanelF16 => features.avx512(),
            DType::PanelBf16 if w.bf16_activations => features.avx512_bf16(),
            DType::PanelBf16 => features.avx512(),
            _ => features.avx512_vnni(),
        };
        if !cfg!(target_arch = "x86_64") {
            Path::Portable
        } else if avx512 {
            Path::Avx512
        } else if features.avx2() {
            Path::Avx2
        } else {
            Path::Portable
        }
    }
}

/// Where one tile's results go and what scales them. Row `i` of the tile is output row
/// `row0 + i`; panel `j` covers output columns `16 * j ..` of the tile.
pub struct TileOut {
    /// `out[row0 * ldo + col0]`.
    pub ptr: *mut f32,
    pub ldo: usize,
    /// Rows of the tile that are real output rows (the rest are padding and not written).
    pub rows: usize,
    /// Columns of the last panel that are real (1..=16).
    pub last_cols: usize,
    /// First K chunk: store; later chunks: add.
    pub first: bool,
}

impl TileOut {
    /// Columns of panel `j` (of `nr`) that are real.
    #[inline(always)]
    pub fn cols(&self, j: usize, nr: usize) -> usize {
        if j + 1 == nr { self.last_cols } else { 16 }
    }
}

/// Per-block activation scales of a tile's rows (`ActivationScales::PerBlock`): row `i`'s
/// scale of block `b` (counted from the chunk's first) at `ptr[i * stride + b]`.
#[derive(Clone, Copy)]
pub struct BlockScales {
    pub ptr: *const f32,
    pub stride: usize,
}

impl BlockScales {
    /// Row `i`'s scale of block `b`.
    ///
    /// # Safety
    /// The prepared operand holds that scale (the GEMM driver points `ptr` at the tile's
    /// first row and the chunk's first block, rows padded to whole tiles).
    #[inline(always)]
    pub unsafe fn at(&self, i: usize, b: usize) -> f32 {
        // SAFETY: the caller's contract.
        unsafe { *self.ptr.add(i * self.stride + b) }
    }
}

/// The int8 activations of a tile's rows over one K chunk, as the prepared operand
/// (`gemm::Prepared`) holds them: the quants, their correction sums and their scales. Every
/// ISA's integer tiles take them so.
#[derive(Clone, Copy)]
pub struct QuantRows {
    /// Row 0's quant of the chunk's first input; row `i`'s `i * stride` bytes on.
    pub x: *const u8,
    pub stride: usize,
    /// Row 0's correction sum of the chunk's first group (q4) or block (q8 with per-block
    /// scales); row `i`'s `i * sums_stride` on. (Unread by q8 with per-row scales.)
    pub sums: *const i32,
    pub sums_stride: usize,
    /// Each row's activation scale, with per-row scales.
    pub scale: [f32; TILE_ROWS],
    /// The rows' per-block scales, where the operand has them.
    pub blocks: Option<BlockScales>,
}

/// The int8 weight panels of a tile over one K chunk: each panel's quants and scales, as
/// `llada_ir::packing` lays them out.
#[derive(Clone, Copy)]
pub struct QuantPanels<const NR: usize> {
    /// Each panel's quants of the chunk's first input.
    pub w: [*const u8; NR],
    /// Each panel's scales: q8, its 16 f32 column scales; q4, its 16 f16 scales of the
    /// chunk's first scale group (the next group's 32 bytes on).
    pub scales: [*const u8; NR],
    /// Inputs per weight scale (q4's group; q8's scales cover all of K).
    pub scale_group: usize,
}

/// Weight lines to pull into cache ([`prefetch_line`]) while a tile computes: `lines` consecutive 64-byte lines
/// from each pointer, issued evenly over the tile's loop. The GEMM driver points them at the
/// next chunk, so a chunk's weights arrive from memory while the previous chunk computes
/// from cache (a tile's first pass over its weights could not otherwise run at compute pace).
#[derive(Clone, Copy)]
pub struct Prefetch<const NR: usize> {
    pub ptr: [*const u8; NR],
    pub lines: usize,
}

impl<const NR: usize> Prefetch<NR> {
    /// Part `i` of `parts` of these lines (split evenly, in order), for a loop that hands
    /// each of its parts to an inner loop: the part starts where the one before it ends.
    #[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
    pub fn part(&self, i: usize, parts: usize) -> Prefetch<NR> {
        let parts = parts.max(1);
        let (from, to) = (i * self.lines / parts, (i + 1) * self.lines / parts);
        Prefetch { ptr: self.ptr.map(|p| p.wrapping_add(64 * from)), lines: to - from }
    }
}

/// A tile's prefetches ([`Prefetch`]) spread evenly over its loop's `steps` steps: by the
/// end of step `s`, `(s + 1) * lines / steps` lines are issued. Counted by a running
/// remainder, as a line is drawn, not divided out: a division at every step took a tenth of
/// the q4 kernel's time on small row counts. (Issuing them all early instead made
/// memory-bound passes 8% slower.)
pub struct Spread<const NR: usize> {
    pf: Prefetch<NR>,
    steps: usize,
    /// `(steps so far) * lines mod steps`, and the next line.
    remainder: usize,
    next: usize,
}

impl<const NR: usize> Spread<NR> {
    #[inline(always)]
    pub fn new(pf: Prefetch<NR>, steps: usize) -> Self {
        Spread { pf, steps: steps.max(1), remainder: 0, next: 0 }
    }

    /// Issues this step's lines.
    #[inline(always)]
    pub fn step(&mut self) {
        self.remainder += self.pf.lines;
        while self.remainder >= self.steps {
            self.remainder -= self.steps;
            for p in self.pf.ptr {
                prefetch_line(p.wrapping_add(64 * self.next));
            }
            self.next += 1;
        }
    }
}

/// Asks for the cache line at `p`: on x86 into L1, on ARM into L2. A hint: it never faults,
/// whatever the address.
///
/// x86: into L1 (`prefetcht0`), measured against L2 (`prefetcht1`) on the 1B q4 artifact's
/// passes, interleaved: 7-13% faster from 9 to 24 rows, the same at 2-5 and 160 (see
/// BENCHMARKS, issue 29). ARM keeps L2, unmeasured there (qemu models no caches).
#[inline(always)]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching never faults and has no other effect.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above; `prfm` reads no memory architecturally.
    unsafe {
        std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts cover every line once, in order, each starting where the last ended.
    #[test]
    fn parts_cover_the_lines_in_order() {
        let base = [0x1000 as *const u8, 0x9000 as *const u8];
        for (lines, parts) in [(0, 3), (5, 8), (8, 8), (130, 16), (7, 1)] {
            let pf = Prefetch { ptr: base, lines };
            let mut next = 0;
            for i in 0..parts {
                let part = pf.part(i, parts);
                for (p, b) in part.ptr.iter().zip(base) {
                    assert_eq!(*p as usize, b as usize + 64 * next, "{lines} lines, part {i} of {parts}");
                }
                next += part.lines;
            }
            assert_eq!(next, lines);
        }
    }
}
