//! What every SIMD GEMM tile shares, whatever its instruction set: where its results go
//! ([`TileOut`]) and which weight lines it pulls into cache while it computes ([`Prefetch`]).
//! Each ISA module adds its own store methods to [`TileOut`].

/// Rows of every register tile.
pub const TILE_ROWS: usize = llada_ir::window::OPERAND_TILE_ROWS;

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

/// Weight lines to pull into L2 while a tile computes: `lines` consecutive 64-byte lines
/// from each pointer, issued evenly over the tile's loop. The GEMM driver points them at the
/// next chunk, so a chunk's weights arrive from memory while the previous chunk computes
/// from cache (a tile's first pass over its weights could not otherwise run at compute pace).
#[derive(Clone, Copy)]
pub struct Prefetch<const NR: usize> {
    pub ptr: [*const u8; NR],
    pub lines: usize,
}

impl<const NR: usize> Prefetch<NR> {
    /// Issues the share of prefetches due at loop step `step` of `steps`.
    #[inline(always)]
    pub fn at(&self, step: usize, steps: usize) {
        if self.lines == 0 {
            return;
        }
        // Lines due by the end of this step, minus those due before it.
        let (from, to) = (step * self.lines / steps, (step + 1) * self.lines / steps);
        for l in from..to {
            for p in self.ptr {
                prefetch_line(p.wrapping_add(64 * l));
            }
        }
    }
}

/// Asks for the cache line at `p` in L2. A hint: it never faults, whatever the address.
#[inline(always)]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching never faults and has no other effect.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p as *const i8)
    };
    #[cfg(target_arch = "aarch64")]
    // SAFETY: as above; `prfm` reads no memory architecturally.
    unsafe {
        std::arch::asm!("prfm pldl2keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = p;
}
