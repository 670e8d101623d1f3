//! Matrix multiplication over packed weights (layouts in `llada_ir::packing`):
//! `out[rows, n] = x[rows, k] @ W^T` with `W[n, k]` stored in 16-column panels.
//!
//! Activations are prepared once per call for the format: kept f32 (f32 and f16 weights, and
//! bf16 weights on the exact path), rounded to bf16 (bf16 weights when the artifact asks for
//! bf16 activations: bf16 products with f32 sums, as PyTorch and NPUs compute), or quantised
//! to int8 per row (W8A8 / W4A8, as llama.cpp quantises activations for its integer
//! dot products). The SIMD path then splits the columns into tiles of up to six panels (four
//! for q4), one task each; a task walks K in chunks small enough that its panels stay in L2
//! while every 4-row register tile passes over them (each activation broadcast feeds one
//! multiply-add per panel, which is what reaches the engine's peak), accumulating each chunk
//! into the output. The SIMD kernels are AVX-512 (`x86`) or, on CPUs without it or without
//! the format's extension, AVX2 (`x86_avx2`: same operands and contracts, narrower register
//! tiles); see [`Path`]. The portable path computes the same sums row by row.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use llada_ir::packing::{panel_bytes, panel_data_bytes, panels, PANEL};
use llada_ir::window::{Operand, ACTIVATION_BLOCK, OPERAND_TILE_ROWS};
use llada_ir::DType;
use rayon::prelude::*;

use super::cpu::Features;
use super::tile::Path;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::tile::{prefetch_line, BlockScales, Prefetch, QuantPanels, QuantRows, TileOut};
pub use crate::model::Matrix;

/// Rows per register tile; prepared activations are padded to a multiple.
const TILE_ROWS: usize = OPERAND_TILE_ROWS;

/// Activations prepared for one format, rows padded with zeros to a whole tile, in the
/// window's GEMM scratch (layout: `llada_ir::window::operand_layout`, so the compiler sizes
/// the scratch). Only the parts of the operand kind are non-empty.
pub struct Prepared<'s> {
    /// Padded row length in elements.
    stride: usize,
    f32s: &'s mut [f32],
    bf16s: &'s mut [bf16],
    /// int8 quants: as u8 with +128 for q8 with per-row scales (the unsigned operand), as i8
    /// bits for q4 and for q8 with per-block scales.
    bytes: &'s mut [u8],
    /// Per row: the activation scale, or with per-block scales one per block.
    scale: &'s mut [f32],
    scales_per_row: usize,
    /// Per row and q4 group: 8 x the sum of the quants (the zero-point correction); with
    /// per-block scales, per row and block (q8: 128 x the sum, the VNNI tile's correction).
    group_sums: &'s mut [i32],
    groups: usize,
}

/// Symmetric int8 quantisation of one row, `x ~= q * scale`, rounding half to even. Written
/// as 16-lane loops and compiled per instruction set: the scalar `round` of the baseline
/// target is a library call, which made quantising cost more than small matmuls.
#[inline(always)]
fn quantize_body<const FMA: bool>(_: Features, x: &[f32], q: &mut [i8]) -> f32 {
    let mut lanes = [0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v.abs());
        }
    }
    let max = chunks.remainder().iter().fold(lanes.iter().fold(0f32, |m, &v| m.max(v)), |m, v| m.max(v.abs()));
    let scale = max / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (d, &v) in q.iter_mut().zip(x) {
        *d = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    scale
}

super::cpu::multiversion! {
    fn quantize_row(features: Features, x: &[f32], q: &mut [i8]) -> f32 => quantize_body
}

impl<'s> Prepared<'s> {
    /// Prepares `rows` rows of `x` for `w` in `scratch` (at least
    /// `w.operand_layout(rows).bytes` bytes, 4-byte aligned). The SIMD quantisers share the
    /// rows among `pool`'s threads where one is given (the matmul's threads would otherwise
    /// wait for one of them to quantise every row).
    pub fn prepare(scratch: &'s mut [u8], x: &[f32], rows: usize, w: &Matrix, features: Features, pool: Option<&rayon::ThreadPool>) -> Prepared<'s> {
        let (k, format) = (w.k, w.format);
        let l = w.operand_layout(rows);
        assert!(scratch.len() >= l.bytes, "GEMM scratch of {} bytes; this operand needs {}", scratch.len(), l.bytes);
        let prows = l.padded_rows;
        let (values, rest) = scratch.split_at_mut(l.scales_at);
        let (scales, sums) = rest.split_at_mut(l.sums_at - l.scales_at);
        let mut p = Prepared { stride: l.stride, f32s: &mut [], bf16s: &mut [], bytes: &mut [], scale: &mut [], scales_per_row: l.scales_per_row, group_sums: &mut [], groups: l.groups };
        match l.operand {
            Operand::F32 => {
                p.f32s = bytemuck::cast_slice_mut(&mut values[..prows * l.stride * 4]);
                p.f32s.fill(0.0);
                for r in 0..rows {
                    p.f32s[r * p.stride..r * p.stride + k].copy_from_slice(&x[r * k..(r + 1) * k]);
                }
            }
            Operand::Bf16 => {
                p.bf16s = bytemuck::cast_slice_mut(&mut values[..prows * l.stride * 2]);
                p.bf16s.fill(bf16::ZERO);
                for r in 0..rows {
                    p.bf16s[r * p.stride..r * p.stride + k].convert_from_f32_slice(&x[r * k..(r + 1) * k]);
                }
            }
            Operand::Int8 => {
                let q8 = format == DType::PanelQ8;
                let per_block = l.scales_per_row > 1;
                // Per-row q8 is the unsigned operand (quant + 128); the others are signed.
                p.take_int8_parts(values, scales, sums, prows, if q8 && !per_block { 128 } else { 0 });
                if per_block {
                    p.quantize_blocks(x, rows, k, q8, features, pool);
                } else {
                    p.quantize_rows(x, rows, k, format, features, pool);
                }
            }
        }
        p
    }

    /// Makes the int8 operand's quants, scales and correction sums (of `prows` padded rows)
    /// the start of `values`, `scales` and `sums`: quants `fill`, the rest zero.
    fn take_int8_parts(&mut self, values: &'s mut [u8], scales: &'s mut [u8], sums: &'s mut [u8], prows: usize, fill: u8) {
        self.bytes = &mut values[..prows * self.stride];
        self.bytes.fill(fill);
        self.scale = bytemuck::cast_slice_mut(&mut scales[..prows * self.scales_per_row * 4]);
        self.scale.fill(0.0);
        self.group_sums = bytemuck::cast_slice_mut(&mut sums[..prows * self.groups * 4]);
        self.group_sums.fill(0);
    }

    /// Per-row int8 quantisation: one scale per row, the correction sums per q4 group (one
    /// per row for q8), q8's quants offset by 128 (the unsigned operand of its VNNI tile).
    fn quantize_rows(&mut self, x: &[f32], rows: usize, k: usize, format: DType, features: Features, pool: Option<&rayon::ThreadPool>) {
        let q8 = format == DType::PanelQ8;
        let group = match format {
            DType::PanelQ4 { group } => group as usize,
            _ => k.max(1),
        };
        // The NEON tiles read the portable quantiser's operand (compiled with NEON).
        #[cfg(target_arch = "x86_64")]
        {
            type QuantizeRow = unsafe fn(&[f32], &mut [u8], u8, usize, &mut [i32]) -> f32;
            // The widest SIMD quantiser whose lane multiple divides K and the group.
            let simd: Option<QuantizeRow> = if features.avx512() && k % 16 == 0 && group % 16 == 0 {
                Some(super::x86::quantize_row_avx512)
            } else if features.avx2() && k % 8 == 0 && group % 8 == 0 {
                Some(super::x86_avx2::quantize_row_avx2)
            } else {
                None
            };
            if let Some(quantize) = simd {
                let flip = if q8 { 0x80 } else { 0 };
                self.each_row(x, rows, k, pool, |((dst, sums), (scale, x))| {
                    // SAFETY: chosen above only when the CPU has its features and K and the
                    // group are multiples of its lanes, as its contract asks.
                    scale[0] = unsafe { quantize(x, &mut dst[..k], flip, group, sums) };
                });
                return;
            }
        }
        let _ = pool; // read only on x86-64
        for r in 0..rows {
            // The quants go straight into the operand row (as i8 bits), then get their q8
            // offset.
            let dst = &mut self.bytes[r * self.stride..r * self.stride + k];
            self.scale[r] = quantize_row(features, &x[r * k..(r + 1) * k], bytemuck::cast_slice_mut(dst));
            for g in 0..self.groups {
                self.group_sums[r * self.groups + g] = 8 * dst[g * group..((g + 1) * group).min(k)].iter().map(|&v| v as i8 as i32).sum::<i32>();
            }
            if q8 {
                dst.iter_mut().for_each(|d| *d = (*d as i8 as i16 + 128) as u8);
            }
        }
    }

    /// Per-block int8 quantisation (`ActivationScales::PerBlock`): each block of
    /// `ACTIVATION_BLOCK` inputs of a row quantised on its own, as signed quants (q8 too:
    /// its VNNI tile makes the weights the unsigned operand), with its scale and its
    /// correction sum (8 x the quant sum for q4's nibbles, 128 x for q8's offset weights).
    fn quantize_blocks(&mut self, x: &[f32], rows: usize, k: usize, q8: bool, features: Features, pool: Option<&rayon::ThreadPool>) {
        let blocks = self.groups;
        // The quantisers give 8 x the sum; q8's correction is 128 x.
        let factor = if q8 { 16 } else { 1 };
        self.each_row(x, rows, k, pool, |((dst, sums), (scales, x))| {
            for b in 0..blocks {
                let (from, to) = (b * ACTIVATION_BLOCK, ((b + 1) * ACTIVATION_BLOCK).min(k));
                let (src, dst, sum) = (&x[from..to], &mut dst[from..to], &mut sums[b]);
                #[cfg(target_arch = "x86_64")]
                if features.avx512() && src.len() % 16 == 0 {
                    // SAFETY: the CPU has AVX-512 F/BW (`avx512()` implies both); the block
                    // is a multiple of 16 and one group.
                    scales[b] = unsafe { super::x86::quantize_row_avx512(src, dst, 0, src.len(), std::slice::from_mut(sum)) };
                    *sum *= factor;
                    continue;
                }
                scales[b] = quantize_row(features, src, bytemuck::cast_slice_mut(dst));
                *sum = 8 * factor * dst.iter().map(|&v| v as i8 as i32).sum::<i32>();
            }
        });
    }

    /// Runs `quantize` on each of the first `rows` rows: its quants, its correction sums and
    /// scales (`self.groups` and `self.scales_per_row` of them), and its `k` activations. On
    /// `pool`'s threads from four rows (a row takes about a microsecond, about what handing
    /// work to another thread costs).
    fn each_row(&mut self, x: &[f32], rows: usize, k: usize, pool: Option<&rayon::ThreadPool>, quantize: impl Fn(OperandRow) + Sync + Send) {
        let (stride, groups, per_row) = (self.stride, self.groups, self.scales_per_row);
        let (bytes, sums, scales, x) = (&mut self.bytes[..rows * stride], &mut self.group_sums[..rows * groups], &mut self.scale[..rows * per_row], &x[..rows * k]);
        match pool.filter(|pool| rows >= 4 && pool.current_num_threads() > 1) {
            Some(pool) => pool.install(|| bytes.par_chunks_mut(stride).zip(sums.par_chunks_mut(groups)).zip(scales.par_chunks_mut(per_row).zip(x.par_chunks(k))).for_each(&quantize)),
            None => bytes.chunks_mut(stride).zip(sums.chunks_mut(groups)).zip(scales.chunks_mut(per_row).zip(x.chunks(k))).for_each(quantize),
        }
    }
}

/// One row of a prepared operand, as [`Prepared::each_row`] hands it out: its quants and
/// correction sums, its scales and its activations.
type OperandRow<'a> = ((&'a mut [u8], &'a mut [i32]), (&'a mut [f32], &'a [f32]));

/// Where the worker tasks write: rows of `n` floats, each task its own columns.
#[derive(Clone, Copy)]
struct Output {
    ptr: *mut f32,
}
// SAFETY: tasks write disjoint columns (their own panels), so sharing the pointer across
// threads never lets two of them touch the same element.
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

impl Output {
    /// The element `offset` floats in. (A method, so closures capture the `Sync` wrapper
    /// rather than the bare pointer.)
    fn at(self, offset: usize) -> *mut f32 {
        self.ptr.wrapping_add(offset)
    }
}

/// `out[rows, w.n] = x[rows, w.k] @ W^T`, using the threads of `pool` and the instruction-set
/// paths `features` allows.
pub fn gemm(x: &[f32], rows: usize, w: &Matrix, out: &mut [f32], scratch: &mut [u8], pool: &rayon::ThreadPool, features: Features) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= rows * k && out.len() >= rows * n, "gemm operands too small");
    let pbytes = panel_bytes(w.format, k).expect("a panel format");
    assert_eq!(w.bytes.len(), panels(n) * pbytes, "packed weights of the wrong size");
    let prepared = Prepared::prepare(scratch, x, rows, w, features, Some(pool));
    let path = Path::of(w, features);
    let output = Output { ptr: out.as_mut_ptr() };
    let prepared = &prepared;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if path != Path::Portable {
        // The integer formats, and exact bf16 on AVX-512, need registers for unpacked
        // weights: narrower tiles. (The AVX2 float tiles work in strips of three half
        // panels: six panels make four. The NEON tiles take one panel at a time, so the
        // width only sets a task's share.)
        let tile_panels = match w.format {
            DType::PanelQ4 { .. } | DType::PanelQ8 => 4,
            DType::PanelBf16 if path == Path::Avx512 && w.operand() == Operand::F32 => 4,
            _ => 6,
        };
        let tiles = panels(n).div_ceil(tile_panels);
        let run = |t: usize| {
            let p0 = t * tile_panels;
            let p1 = (p0 + tile_panels).min(panels(n));
            // SAFETY: this task owns the columns of panels p0..p1; the slices and sizes were
            // checked above against the format.
            unsafe { simd_tile_column(w, prepared, rows, p0, p1, output, path) };
        };
        if pool.current_num_threads() <= 1 || tiles < 2 {
            (0..tiles).for_each(run);
        } else {
            pool.install(|| (0..tiles).into_par_iter().for_each(run));
        }
        return;
    }
    let _ = path; // read only on x86-64
    let run = |p: usize| {
        for r in 0..rows {
            let vals = portable_panel_row(w, &w.bytes[p * pbytes..(p + 1) * pbytes], prepared, r);
            let cols = PANEL.min(n - p * PANEL);
            // SAFETY: panel p owns columns p*16 .. p*16 + cols of every row; in bounds by the
            // size check above.
            unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), output.at(r * n + p * PANEL), cols) };
        }
    };
    if pool.current_num_threads() <= 1 {
        (0..panels(n)).for_each(run);
    } else {
        pool.install(|| (0..panels(n)).into_par_iter().for_each(run));
    }
}

/// K per chunk: the weights of a column tile over one chunk stay in L2 (tens of KiB), and
/// the next chunk's are prefetched while it computes.
pub(crate) fn chunk_k(format: DType, k: usize) -> usize {
    let kc = match format {
        DType::PanelF32 => 256,
        DType::PanelF16 | DType::PanelBf16 => 512,
        DType::PanelQ8 => 512,
        DType::PanelQ4 { group } => (1024 / group as usize).max(1) * group as usize,
        _ => k,
    };
    kc.min(k)
}

/// Bytes of one panel's data per input for the formats' streams (scales and sums aside).
fn bytes_per_k(format: DType) -> usize {
    match format {
        DType::PanelF32 => 64,
        DType::PanelF16 | DType::PanelBf16 => 32,
        DType::PanelQ8 => 16,
        DType::PanelQ4 { .. } => 8,
        _ => 0,
    }
}

/// Runs the SIMD kernels of `path` over panels `p0..p1` (at most six) for every row.
///
/// # Safety
/// The CPU has the features of the format's kernels on that path (see [`Path::of`]); the
/// caller owns output columns `16 * p0 .. 16 * p1` (clipped to `n`) of every row; `w` and
/// `x` are consistent (checked by [`gemm`]).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
unsafe fn simd_tile_column(w: &Matrix, x: &Prepared, rows: usize, p0: usize, p1: usize, out: Output, path: Path) {
    let k = w.k;
    let pbytes = panel_bytes(w.format, k).unwrap();
    let column = ColumnTile { w, x, rows, p0, p1, out, path, pbytes, data: panel_data_bytes(w.format, k), bpk: bytes_per_k(w.format), kc: chunk_k(w.format, k) };
    for k0 in (0..k).step_by(column.kc) {
        let upcoming = column.upcoming(k0);
        if let Some(next) = upcoming {
            column.prefetch_scales(next);
        }
        for (ti, r0) in (0..rows).step_by(TILE_ROWS).enumerate() {
            // SAFETY: the caller's contract; r0 < rows.
            unsafe { column.row_tile(r0, ti, k0, upcoming) };
        }
    }
}

/// One task of the SIMD path ([`simd_tile_column`]): the output columns of panels `p0..p1`
/// of `w` for every row of `x`, computed K chunk by chunk with the kernels of `path`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
struct ColumnTile<'a> {
    w: &'a Matrix<'a>,
    x: &'a Prepared<'a>,
    rows: usize,
    p0: usize,
    p1: usize,
    out: Output,
    path: Path,
    /// Bytes of a panel, of its data (its scales and sums follow) and of its data per input.
    pbytes: usize,
    data: usize,
    bpk: usize,
    /// K per chunk ([`chunk_k`]).
    kc: usize,
}

/// The weights to prefetch while a chunk computes: `len` inputs from `k0` of the panels from
/// `panel`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[derive(Clone, Copy)]
struct Upcoming {
    panel: usize,
    k0: usize,
    len: usize,
}

/// The same kernel (same operands) from the path's instruction set; the ARM tiles take the
/// path too, for the extension they use.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! kernel {
    ($path:expr, $f:ident::<$nr:literal>($($a:expr),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        let r = if $path == Path::Avx2 { super::x86_avx2::$f::<$nr>($($a),*) } else { super::x86::$f::<$nr>($($a),*) };
        #[cfg(target_arch = "aarch64")]
        let r = super::arm::$f::<$nr>($path, $($a),*);
        r
    }};
}

/// The integer kernels by the tile's real rows: on x86 a last tile of 1-3 rows computes those
/// rows only (on the host every row computed costs its time). `$rows_f` is the x86 kernel
/// with a row count, `$f` the NEON one.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! int_kernel {
    ($path:expr, $real:expr, $rows_f:ident, $f:ident::<$nr:literal>($($a:expr),* $(,)?)) => {{
        #[cfg(target_arch = "x86_64")]
        let r = match ($real, $path == Path::Avx2) {
            (1, true) => super::x86_avx2::$rows_f::<$nr, 1>($($a),*),
            (1, false) => super::x86::$rows_f::<$nr, 1>($($a),*),
            (2, true) => super::x86_avx2::$rows_f::<$nr, 2>($($a),*),
            (2, false) => super::x86::$rows_f::<$nr, 2>($($a),*),
            (3, true) => super::x86_avx2::$rows_f::<$nr, 3>($($a),*),
            (3, false) => super::x86::$rows_f::<$nr, 3>($($a),*),
            (_, true) => super::x86_avx2::$rows_f::<$nr, 4>($($a),*),
            (_, false) => super::x86::$rows_f::<$nr, 4>($($a),*),
        };
        #[cfg(target_arch = "aarch64")]
        let r = {
            let _ = $real;
            super::arm::$f::<$nr>($path, $($a),*)
        };
        r
    }};
}

/// `$call!(NR)` with the tile's width in panels as a constant.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! by_width {
    ($nr:expr, $call:ident) => {
        match $nr {
            1 => $call!(1),
            2 => $call!(2),
            3 => $call!(3),
            4 => $call!(4),
            5 => $call!(5),
            _ => $call!(6),
        }
    };
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
impl ColumnTile<'_> {
    /// The first byte of panel `p`.
    fn panel(&self, p: usize) -> *const u8 {
        self.w.bytes[p * self.pbytes..].as_ptr()
    }

    /// Each of the tile's panels at input `k0` of its data.
    fn chunk_weights<const NR: usize>(&self, k0: usize) -> [*const u8; NR] {
        std::array::from_fn(|j| self.panel(self.p0 + j).wrapping_add(self.bpk * k0))
    }

    /// The tile's int8 panels over the chunk from `k0`: quants and scales.
    fn quant_panels<const NR: usize>(&self, k0: usize) -> QuantPanels<NR> {
        let (scales_at, scale_group) = match self.w.format {
            DType::PanelQ4 { group } => (self.data + 32 * (k0 / group as usize), group as usize),
            _ => (self.data, self.w.k),
        };
        QuantPanels { w: self.chunk_weights(k0), scales: std::array::from_fn(|j| self.panel(self.p0 + j).wrapping_add(scales_at)), scale_group }
    }

    /// The weights to prefetch while chunk `k0` computes: the next chunk of these panels, or
    /// the first chunk of the next column tile (usually this thread's next task).
    fn upcoming(&self, k0: usize) -> Option<Upcoming> {
        let (k, kc) = (self.w.k, self.kc);
        if k0 + kc < k {
            Some(Upcoming { panel: self.p0, k0: k0 + kc, len: kc.min(k - k0 - kc) })
        } else if self.p1 < panels(self.w.n) {
            Some(Upcoming { panel: self.p1, k0: 0, len: kc })
        } else {
            None
        }
    }

    /// The upcoming chunk's scales (q4: a line per two groups; q8: scales and sums at the end
    /// of the panel) are a separate stream from the data: fetched as the chunk before starts,
    /// long before the group ends that reads them.
    fn prefetch_scales(&self, next: Upcoming) {
        let (from, lines) = match self.w.format {
            DType::PanelQ4 { group } => (self.data + 32 * (next.k0 / group as usize), (32 * next.len / group as usize).div_ceil(64)),
            DType::PanelQ8 if next.k0 == 0 => (self.data, 2),
            _ => (0, 0),
        };
        for j in next.panel..(next.panel + (self.p1 - self.p0)).min(panels(self.w.n)) {
            for l in 0..lines {
                prefetch_line(self.panel(j).wrapping_add(from + 64 * l));
            }
        }
    }

    /// Row tile `ti`'s share of the upcoming chunk's data lines, for a kernel of `NR` panels.
    fn prefetch_share<const NR: usize>(&self, upcoming: Option<Upcoming>, ti: usize) -> Prefetch<NR> {
        let Some(next) = upcoming else { return Prefetch { ptr: [std::ptr::null(); NR], lines: 0 } };
        let (lines, row_tiles) = ((next.len * self.bpk).div_ceil(64), self.rows.div_ceil(TILE_ROWS));
        let (from, to) = (ti * lines / row_tiles, (ti + 1) * lines / row_tiles);
        let last = panels(self.w.n) - 1;
        Prefetch { ptr: std::array::from_fn(|j| self.panel((next.panel + j).min(last)).wrapping_add(next.k0 * self.bpk + 64 * from)), lines: to - from }
    }

    /// Rows `r0..r0 + 4` (row tile `ti`) over the chunk from `k0`: the format's kernel at the
    /// tile's width, prefetching the tile's share of the upcoming chunk.
    ///
    /// # Safety
    /// As [`simd_tile_column`]; `r0 < rows`.
    unsafe fn row_tile(&self, r0: usize, ti: usize, k0: usize, upcoming: Option<Upcoming>) {
        // Column sums past the first chunk: the +128 of q8's operand comes out once.
        static ZEROS: [i32; PANEL] = [0; PANEL];
        let (w, x, path, n) = (self.w, self.x, self.path, self.w.n);
        let len = self.kc.min(w.k - k0);
        let o = TileOut {
            // Row r0, column 16 * p0 of the output (in bounds: r0 < rows, p0 < panels).
            ptr: self.out.at(r0 * n + self.p0 * PANEL),
            ldo: n,
            rows: TILE_ROWS.min(self.rows - r0),
            last_cols: PANEL.min(n - (self.p1 - 1) * PANEL),
            first: k0 == 0,
        };
        let width = self.p1 - self.p0;
        // SAFETY (every arm): the pointers address the chunk's part of each panel and of the
        // prepared rows r0..r0+4 (padded to whole tiles), per the kernels' contracts.
        unsafe {
            match w.format {
                DType::PanelF32 => {
                    let xp = x.f32s.as_ptr().add(r0 * x.stride + k0);
                    macro_rules! call { ($nr:literal) => { kernel!(path, tile_f32::<$nr>(xp, x.stride, self.chunk_weights(k0), len, &o, self.prefetch_share(upcoming, ti))) } }
                    by_width!(width, call)
                }
                DType::PanelF16 => {
                    let xp = x.f32s.as_ptr().add(r0 * x.stride + k0);
                    macro_rules! call { ($nr:literal) => { kernel!(path, tile_f16::<$nr>(xp, x.stride, self.chunk_weights(k0), len, &o, self.prefetch_share(upcoming, ti))) } }
                    by_width!(width, call)
                }
                DType::PanelBf16 if !w.bf16_activations => {
                    let xp = x.f32s.as_ptr().add(r0 * x.stride + k0);
                    macro_rules! call { ($nr:literal) => { kernel!(path, tile_bf16_f32::<$nr>(xp, x.stride, self.chunk_weights(k0), len.div_ceil(2), &o, self.prefetch_share(upcoming, ti))) } }
                    by_width!(width, call)
                }
                DType::PanelBf16 => {
                    let xp = (x.bf16s.as_ptr() as *const u16).add(r0 * x.stride + k0);
                    macro_rules! call { ($nr:literal) => { kernel!(path, tile_bf16::<$nr>(xp, x.stride, self.chunk_weights(k0), len.div_ceil(2), &o, self.prefetch_share(upcoming, ti))) } }
                    by_width!(width, call)
                }
                DType::PanelQ8 => {
                    // Sums (and scales) per activation block, where the operand has them.
                    let rows = x.quant_rows(r0, k0, ACTIVATION_BLOCK);
                    if rows.blocks.is_some() {
                        macro_rules! call { ($nr:literal) => { int_kernel!(path, o.rows, tile_q8_blocks_rows, tile_q8_blocks::<$nr>(rows, self.quant_panels(k0), len / ACTIVATION_BLOCK, &o, self.prefetch_share(upcoming, ti))) } }
                        by_width!(width, call)
                    } else {
                        let colsum = |j: usize| if k0 == 0 { self.panel(self.p0 + j).add(self.data + 64) as *const i32 } else { ZEROS.as_ptr() };
                        macro_rules! call { ($nr:literal) => { int_kernel!(path, o.rows, tile_q8_rows, tile_q8::<$nr>(rows, self.quant_panels(k0), std::array::from_fn(colsum), len.div_ceil(4), &o, self.prefetch_share(upcoming, ti))) } }
                        by_width!(width, call)
                    }
                }
                DType::PanelQ4 { group } => {
                    // Sums per weight group, or per activation block (a part of one).
                    let g = if x.scales_per_row > 1 { ACTIVATION_BLOCK } else { group as usize };
                    let rows = x.quant_rows(r0, k0, g);
                    macro_rules! call { ($nr:literal) => { int_kernel!(path, o.rows, tile_q4_rows, tile_q4::<$nr>(rows, self.quant_panels(k0), g, len / g, &o, self.prefetch_share(upcoming, ti))) } }
                    by_width!(width, call)
                }
                _ => unreachable!("matmul weights are always packed"),
            }
        }
    }
}

impl Prepared<'_> {
    /// The int8 rows of the register tile from row `r0` over the K chunk from input `k0`,
    /// their correction sums counted per `sum_span` inputs (a q4 group or an activation block).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn quant_rows(&self, r0: usize, k0: usize, sum_span: usize) -> QuantRows {
        QuantRows {
            x: self.bytes.as_ptr().wrapping_add(r0 * self.stride + k0),
            stride: self.stride,
            sums: self.group_sums.as_ptr().wrapping_add(r0 * self.groups + k0 / sum_span),
            sums_stride: self.groups,
            scale: std::array::from_fn(|i| self.scale.get(r0 + i).copied().unwrap_or(0.0)),
            // Per-block scales: the tile's first row, the chunk's first block.
            blocks: (self.scales_per_row > 1).then(|| BlockScales { ptr: self.scale.as_ptr().wrapping_add(r0 * self.scales_per_row + k0 / ACTIVATION_BLOCK), stride: self.scales_per_row }),
        }
    }
}

/// One row times one panel on the portable path: the same sums as the SIMD kernels (integer
/// dot products exactly; float ones in another order).
fn portable_panel_row(w: &Matrix, panel: &[u8], x: &Prepared, r: usize) -> [f32; PANEL] {
    let k = w.k;
    let u16_at = |o: usize| u16::from_le_bytes([panel[o], panel[o + 1]]);
    let f32_at = |o: usize| f32::from_le_bytes(panel[o..o + 4].try_into().unwrap());
    let mut row = [0f32; PANEL];
    match w.format {
        DType::PanelF32 | DType::PanelF16 => {
            for (kk, &xv) in x.f32s[r * x.stride..r * x.stride + k].iter().enumerate() {
                for (c, o) in row.iter_mut().enumerate() {
                    let wv = if w.format == DType::PanelF32 { f32_at(4 * (kk * PANEL + c)) } else { f16::from_bits(u16_at(2 * (kk * PANEL + c))).to_f32() };
                    *o += xv * wv;
                }
            }
        }
        DType::PanelBf16 => {
            let weight = |kk: usize, c: usize| bf16::from_bits(u16_at(64 * (kk / 2) + 4 * c + 2 * (kk % 2))).to_f32();
            for kk in 0..k {
                let xv = if w.bf16_activations { x.bf16s[r * x.stride + kk].to_f32() } else { x.f32s[r * x.stride + kk] };
                for (c, o) in row.iter_mut().enumerate() {
                    *o += xv * weight(kk, c);
                }
            }
        }
        DType::PanelQ8 if x.scales_per_row > 1 => {
            // Signed quants, each block scaled on its own.
            let xr = &x.bytes[r * x.stride..(r + 1) * x.stride];
            let data = panel_data_bytes(w.format, k);
            for (c, o) in row.iter_mut().enumerate() {
                let mut total = 0f32;
                for b in 0..x.scales_per_row {
                    let mut acc: i32 = 0;
                    for kk in b * ACTIVATION_BLOCK..((b + 1) * ACTIVATION_BLOCK).min(k) {
                        acc += xr[kk] as i8 as i32 * panel[64 * (kk / 4) + 4 * c + kk % 4] as i8 as i32;
                    }
                    total += acc as f32 * x.scale[r * x.scales_per_row + b];
                }
                *o = total * f32_at(data + 4 * c);
            }
        }
        DType::PanelQ8 => {
            let xr = &x.bytes[r * x.stride..(r + 1) * x.stride];
            let data = panel_data_bytes(w.format, k);
            for (c, o) in row.iter_mut().enumerate() {
                let mut acc: i32 = 0;
                for kk in 0..k.div_ceil(4) * 4 {
                    acc += xr[kk] as i32 * panel[64 * (kk / 4) + 4 * c + kk % 4] as i8 as i32;
                }
                let colsum = i32::from_le_bytes(panel[data + 64 + 4 * c..data + 68 + 4 * c].try_into().unwrap());
                *o = (acc - 128 * colsum) as f32 * f32_at(data + 4 * c) * x.scale[r];
            }
        }
        DType::PanelQ4 { group } => {
            // Sums per weight group, or per activation block (a part of one).
            let sg = group as usize;
            let g = if x.scales_per_row > 1 { ACTIVATION_BLOCK } else { sg };
            let xr = &x.bytes[r * x.stride..(r + 1) * x.stride];
            for (c, o) in row.iter_mut().enumerate() {
                let mut total = 0f32;
                for gi in 0..k / g {
                    let mut acc: i32 = 0;
                    for kk in gi * g..(gi + 1) * g {
                        let byte = panel[64 * (kk / 8) + 4 * c + kk % 4];
                        let u = if kk % 8 < 4 { byte & 0xf } else { byte >> 4 };
                        acc += u as i32 * xr[kk] as i8 as i32;
                    }
                    let d = f16::from_bits(u16_at(8 * k + 32 * (gi * g / sg) + 2 * c)).to_f32();
                    // Per block (groups of one block): the group's scale times the block's.
                    let d = if x.scales_per_row > 1 { d * x.scale[r * x.scales_per_row + gi] } else { d };
                    total += (acc - x.group_sums[r * x.groups + gi]) as f32 * d;
                }
                *o = if x.scales_per_row > 1 { total } else { total * x.scale[r] };
            }
        }
        DType::F32 | DType::Bf16 | DType::F16 => unreachable!("matmul weights are always packed"),
    }
    row
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::{self, FeatureRequest};
    use llada_ir::packing::{pack_panel, unpack_panel};
    use llada_ir::window::ActivationScales;

    fn pack(format: DType, w: &[Vec<f32>], k: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in w.chunks(PANEL) {
            let refs: Vec<&[f32]> = chunk.iter().map(|r| r.as_slice()).collect();
            pack_panel(format, &refs, k, &mut out);
        }
        out
    }

    fn w_operand(format: DType) -> Operand {
        llada_ir::window::operand_of(format, false)
    }

    /// Scratch for an operand of `rows` rows, 8-byte aligned (as the window's is 64).
    fn scratch_for(m: &Matrix, rows: usize) -> Vec<u64> {
        vec![0u64; m.operand_layout(rows).bytes.div_ceil(8)]
    }

    fn lcg(s: &mut u64) -> f32 {
        *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// A row's output is the same bits whatever other rows share the call, in whatever order,
    /// on one thread or two: what lets an MoE layer compute an expert's rows on either path
    /// (`moe::compute`) and still give the same answer.
    #[test]
    fn a_row_is_the_same_bits_whatever_rows_share_the_call() {
        let pools: Vec<rayon::ThreadPool> = [1, 2].map(|t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap()).into();
        let mut s = 11;
        let (rows, n, k) = (9, 70, 256);
        let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
        let w: Vec<Vec<f32>> = (0..n).map(|_| (0..k).map(|_| lcg(&mut s) * 0.1).collect()).collect();
        for features in [cpu::features(), Features::PORTABLE] {
            for (format, bf16_activations, activation_scales) in [
                (DType::PanelF32, false, ActivationScales::PerRow),
                (DType::PanelF16, false, ActivationScales::PerRow),
                (DType::PanelBf16, false, ActivationScales::PerRow),
                (DType::PanelBf16, true, ActivationScales::PerRow),
                (DType::PanelQ8, false, ActivationScales::PerRow),
                (DType::PanelQ4 { group: 32 }, false, ActivationScales::PerRow),
                (DType::PanelQ8, false, ActivationScales::PerBlock),
                (DType::PanelQ4 { group: 32 }, false, ActivationScales::PerBlock),
            ] {
                let bytes = pack(format, &w, k);
                let m = Matrix { format, n, k, bytes: &bytes, bf16_activations, activation_scales };
                let mut scratch = scratch_for(&m, rows);
                let mut all = vec![0.0f32; rows * n];
                gemm(&x, rows, &m, &mut all, bytemuck::cast_slice_mut(&mut scratch), &pools[1], features);
                for pool in &pools {
                    for subset in [vec![4], vec![8, 0, 5], vec![1, 2, 3, 6, 7]] {
                        let xs: Vec<f32> = subset.iter().flat_map(|&r| x[r * k..(r + 1) * k].iter().copied()).collect();
                        let mut out = vec![0.0f32; subset.len() * n];
                        gemm(&xs, subset.len(), &m, &mut out, bytemuck::cast_slice_mut(&mut scratch), pool, features);
                        for (i, &r) in subset.iter().enumerate() {
                            let same = out[i * n..(i + 1) * n].iter().zip(&all[r * n..(r + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(same, "{} ({}), row {r} in {subset:?} on {} thread(s)", format.name(), features.describe(), pool.current_num_threads());
                        }
                    }
                }
            }
        }
    }

    /// Every format against a double-precision product with the dequantised weights, on the
    /// path `features` selects and on the portable path; tolerances cover the activation
    /// rounding (bf16) or quantisation (int8). Shapes cover partial tiles of rows and panels,
    /// K over several chunks and not in whole unrolled blocks, the column tiles of both
    /// widths, and q4 groups of whole and partial batches of four blocks.
    fn check_against_reference(features: Features, path: Option<Path>) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut s = 5;
        for &(rows, n, k) in &[(1, 16, 64), (19, 37, 128), (33, 150, 256), (6, 100, 4608), (40, 256, 128), (40, 128, 384), (40, 320, 128), (40, 768, 128), (5, 40, 37), (9, 70, 300)] {
            let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<Vec<f32>> = (0..n).map(|_| (0..k).map(|_| lcg(&mut s) * 0.1).collect()).collect();
            for case in [
                (DType::PanelF32, false, 1e-5),
                (DType::PanelF16, false, 1e-5),
                (DType::PanelBf16, false, 1e-5),
                (DType::PanelBf16, true, 2e-2),
                (DType::PanelQ8, false, 2e-2),
                (DType::PanelQ4 { group: 8 }, false, 2e-2),
                (DType::PanelQ4 { group: 24 }, false, 2e-2),
                (DType::PanelQ4 { group: 32 }, false, 2e-2),
                (DType::PanelQ4 { group: 64 }, false, 2e-2),
                (DType::PanelQ4 { group: 128 }, false, 2e-2),
            ]
            .into_iter()
            .flat_map(|f| [(f, ActivationScales::PerRow), (f, ActivationScales::PerBlock)])
            {
                let ((format, bf16_activations, tol), activation_scales) = case;
                if panel_bytes(format, k).is_none() {
                    continue; // q4: K is not whole groups
                }
                if activation_scales == ActivationScales::PerBlock && (w_operand(format) != Operand::Int8 || activation_scales.unsupported(format, k).is_some()) {
                    continue;
                }
                let bytes = pack(format, &w, k);
                let m = Matrix { format, n, k, bytes: &bytes, bf16_activations, activation_scales };
                if let Some(path) = path {
                    assert_eq!(Path::of(&m, features), path, "{}", format.name());
                }
                let pbytes = panel_bytes(format, k).unwrap();
                let deq: Vec<Vec<[f32; PANEL]>> = bytes.chunks(pbytes).map(|p| unpack_panel(format, p, k)).collect();
                let want = |r: usize, c: usize| (0..k).map(|kk| x[r * k + kk] as f64 * deq[c / PANEL][kk][c % PANEL] as f64).sum::<f64>();
                let scale = (0..rows * n).fold(0f64, |m, i| m.max(want(i / n, i % n).abs()));
                let mut scratch = scratch_for(&m, rows);
                let (mut fast, mut portable) = (vec![0.0; rows * n], vec![0.0; rows * n]);
                gemm(&x, rows, &m, &mut fast, bytemuck::cast_slice_mut(&mut scratch), &pool, features);
                gemm(&x, rows, &m, &mut portable, bytemuck::cast_slice_mut(&mut scratch), &pool, Features::PORTABLE);
                // The integer formats see identical quants on both paths.
                if matches!(format, DType::PanelQ8 | DType::PanelQ4 { .. }) && k % 16 == 0 {
                    let mut other = scratch_for(&m, rows);
                    let prep = Prepared::prepare(bytemuck::cast_slice_mut(&mut scratch), &x, rows, &m, features, Some(&pool));
                    let again = Prepared::prepare(bytemuck::cast_slice_mut(&mut other), &x, rows, &m, Features::PORTABLE, None);
                    assert_eq!((&prep.bytes, &prep.group_sums), (&again.bytes, &again.group_sums), "{}", format.name());
                    assert_eq!(prep.scale, again.scale);
                }
                for r in 0..rows {
                    for c in 0..n {
                        let (a, b, t) = (fast[r * n + c] as f64, portable[r * n + c] as f64, want(r, c));
                        assert!((a - t).abs() / scale.max(1e-9) <= tol, "{} {activation_scales:?} {rows}x{n}x{k} [{r},{c}]: {a} vs {t}", format.name());
                        assert!((a - b).abs() <= 1e-4 * (1.0 + t.abs()), "{} {activation_scales:?} {rows}x{n}x{k} [{r},{c}]: simd {a} vs portable {b}", format.name());
                    }
                }
            }
        }
    }

    /// The detected path (AVX-512, or AVX2 on CPUs without it) against the portable one.
    #[test]
    fn every_format_matches_the_reference_on_both_paths() {
        check_against_reference(cpu::features(), None);
    }

    /// The AVX2 tiles on their own, also where AVX-512 would be chosen.
    #[test]
    fn avx2_tiles_match_the_reference() {
        if !cpu::features().avx2() {
            eprintln!("skipped: this CPU has no AVX2 + FMA + F16C (or LLADA_ISA caps it)");
            return;
        }
        check_against_reference(avx2_only(), Some(Path::Avx2));
    }

    /// AVX2 alone (where the CPU has it).
    fn avx2_only() -> Features {
        Features::request(FeatureRequest::level("avx2").expect("a level"))
    }

    /// The SIMD q8 and q4 tiles of `features` give the portable path's integer sums exactly:
    /// one K chunk (so one conversion to float), integer-valued weights and activations of
    /// every magnitude the quants can take, and the same float epilogue, leave nothing to
    /// round differently.
    fn integer_sums_are_exact(features: Features) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let (rows, n, k) = (7, 40, 256);
        let mut s = 11;
        // Each row's largest magnitude is 127 (scale 1), so the quants are the values.
        let x: Vec<f32> = (0..rows * k).map(|i| if i % k == 3 { -127.0 } else { (lcg(&mut s) * 127.0).round() }).collect();
        for format in [DType::PanelQ8, DType::PanelQ4 { group: 32 }, DType::PanelQ4 { group: 128 }, DType::PanelQ4 { group: 8 }] {
            // Weights at the quants' extremes (q8: +-127 with scale 1; q4: -8..7 times a
            // power-of-two scale), so the products' sums are large.
            let w: Vec<Vec<f32>> = (0..n)
                .map(|c| (0..k).map(|kk| if format == DType::PanelQ8 { if (c + kk) % 3 == 0 { -127.0 } else { 127.0 } } else { [-8.0, 7.0, -8.0, 1.0][(c * 7 + kk) % 4] * 0.25 }).collect())
                .collect();
            let bytes = pack(format, &w, k);
            let m = Matrix { format, n, k, bytes: &bytes, bf16_activations: false, activation_scales: Default::default() };
            assert!(chunk_k(format, k) >= k);
            assert_ne!(Path::of(&m, features), Path::Portable);
            let mut scratch = scratch_for(&m, rows);
            let (mut fast, mut portable) = (vec![0.0; rows * n], vec![0.0; rows * n]);
            gemm(&x, rows, &m, &mut fast, bytemuck::cast_slice_mut(&mut scratch), &pool, features);
            gemm(&x, rows, &m, &mut portable, bytemuck::cast_slice_mut(&mut scratch), &pool, Features::PORTABLE);
            assert_eq!(fast, portable, "{} on {:?}", format.name(), Path::of(&m, features));
        }
    }

    #[test]
    fn avx2_integer_sums_are_exact() {
        if !cpu::features().avx2() {
            eprintln!("skipped: this CPU has no AVX2 + FMA + F16C (or LLADA_ISA caps it)");
            return;
        }
        integer_sums_are_exact(avx2_only());
    }

    /// The NEON feature level of this CPU (or of its `LLADA_ISA` cap), with the path it gives
    /// the bf16-activation and the integer formats: NEON alone (`qemu -cpu cortex-a53`), with
    /// `sdot` (cortex-a76), with `smmla` and `bfdot` (ARMv8.6, `-cpu max`). CI runs these
    /// tests once per emulated CPU, so each level is tested on a CPU that has exactly it.
    fn neon_level() -> Option<(Features, Path, Path)> {
        let f = cpu::features();
        let level = |name| Features::request(FeatureRequest::level(name).expect("a level"));
        let level = if f.i8mm() && f.bf16() {
            (Features::request(FeatureRequest { neon: true, dotprod: true, i8mm: true, bf16: true, ..FeatureRequest::default() }), Path::NeonBf16, Path::NeonI8mm)
        } else if f.dotprod() {
            (level("dotprod"), Path::Neon, Path::NeonDotprod)
        } else if f.neon() {
            (level("neon"), Path::Neon, Path::Neon)
        } else {
            eprintln!("skipped: not an AArch64 CPU with NEON (or LLADA_ISA caps it)");
            return None;
        };
        Some(level)
    }

    /// The NEON level against the f64 reference and the portable path, every format.
    #[test]
    fn neon_tiles_match_the_reference() {
        if let Some((features, bf16_path, int_path)) = neon_level() {
            let probe = |format, bf16_activations| Path::of(&Matrix { format, n: 16, k: 64, bytes: &[], bf16_activations, activation_scales: Default::default() }, features);
            assert_eq!(probe(DType::PanelF32, false), Path::Neon);
            assert_eq!(probe(DType::PanelBf16, false), Path::Neon);
            assert_eq!(probe(DType::PanelBf16, true), bf16_path);
            assert_eq!(probe(DType::PanelQ8, false), int_path);
            assert_eq!(probe(DType::PanelQ4 { group: 32 }, false), int_path);
            eprintln!("{}: checked", features.describe());
            check_against_reference(features, None);
        }
    }

    #[test]
    fn neon_integer_sums_are_exact() {
        if let Some((features, _, _)) = neon_level() {
            integer_sums_are_exact(features);
        }
    }

    /// Two activation channels 25 to 50 times the others (as trained LLMs have): per-block
    /// scales keep the precision of the blocks without them, so q8 and q4 come several times
    /// closer to the exact product than with one scale per row.
    #[test]
    fn per_block_activation_scales_hold_up_against_outlier_channels() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let (rows, n, k) = (8, 64, 512);
        let mut s = 3;
        let plain: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
        let outliers: Vec<f32> = plain.iter().enumerate().map(|(i, &v)| if [37, 300].contains(&(i % k)) { 25.0 + 25.0 * v.abs() } else { v }).collect();
        let w: Vec<Vec<f32>> = (0..n).map(|_| (0..k).map(|_| lcg(&mut s) * 0.1).collect()).collect();
        for features in [cpu::features(), Features::PORTABLE] {
            for format in [DType::PanelQ8, DType::PanelQ4 { group: 32 }] {
                let bytes = pack(format, &w, k);
                let deq: Vec<Vec<[f32; PANEL]>> = bytes.chunks(panel_bytes(format, k).unwrap()).map(|p| unpack_panel(format, p, k)).collect();
                // RMS error against the product with the same (dequantised) weights, over the
                // RMS of the result without the outlier channels' share: the others' error.
                let error = |x: &[f32], scales: ActivationScales| {
                    let m = Matrix { format, n, k, bytes: &bytes, bf16_activations: false, activation_scales: scales };
                    let mut out = vec![0.0; rows * n];
                    gemm(x, rows, &m, &mut out, bytemuck::cast_slice_mut(&mut scratch_for(&m, rows)), &pool, features);
                    let (mut e, mut norm) = (0f64, 0f64);
                    for r in 0..rows {
                        for c in 0..n {
                            let dot = |skip: bool| (0..k).filter(|kk| !skip || ![37, 300].contains(kk)).map(|kk| x[r * k + kk] as f64 * deq[c / PANEL][kk][c % PANEL] as f64).sum::<f64>();
                            e += (out[r * n + c] as f64 - dot(false)).powi(2);
                            norm += dot(true).powi(2);
                        }
                    }
                    (e / norm).sqrt()
                };
                let (row_plain, block_plain) = (error(&plain, ActivationScales::PerRow), error(&plain, ActivationScales::PerBlock));
                let (row_out, block_out) = (error(&outliers, ActivationScales::PerRow), error(&outliers, ActivationScales::PerBlock));
                let name = format!("{} on {}", format.name(), features.describe());
                assert!(block_plain < 0.02 && row_plain < 0.02, "{name}: {row_plain} {block_plain}");
                assert!(row_out > 2.0 * block_out, "{name}: per row {row_out}, per block {block_out}");
            }
        }
    }
}
