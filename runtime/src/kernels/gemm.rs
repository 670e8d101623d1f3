//! Matrix multiplication over packed weights (layouts in `llada_ir::packing`):
//! `out[rows, n] = x[rows, k] @ W^T` with `W[n, k]` stored in 16-column panels.
//!
//! Activations are prepared once per call for the format: kept f32, rounded to bf16, or
//! quantised to int8 per row (W8A8 / W4A8, as llama.cpp quantises activations for its
//! integer dot products). Each panel is then one task: a micro-kernel runs it over every
//! tile of rows. Micro-kernels exist for AVX-512 (F for f32/f16, BF16 for bf16, VNNI for q8
//! and q4) and as portable twins over the same layout, chosen at run time.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use llada_ir::packing::{panel_bytes, panel_data_bytes, panels, PANEL};
use llada_ir::DType;
use rayon::prelude::*;

use super::cpu::Features;

/// A packed weight matrix `[n, k]`.
#[derive(Clone, Copy)]
pub struct Matrix<'a> {
    pub format: DType,
    pub n: usize,
    pub k: usize,
    pub bytes: &'a [u8],
}

/// Rows per micro-kernel tile.
pub const TILE_ROWS: usize = 16;
/// The q4 kernel keeps two accumulators per row, so it takes half as many rows at a time.
const Q4_TILE_ROWS: usize = 8;

/// Activations prepared for one format, rows padded with zeros to a whole tile.
#[derive(Default)]
pub struct Prepared {
    rows: usize,
    /// Padded row length (k rounded up to the format's k-step).
    stride: usize,
    f32s: Vec<f32>,
    bf16s: Vec<bf16>,
    /// int8 quants: as u8 with +128 for q8 (the unsigned operand), as i8 bits for q4.
    bytes: Vec<u8>,
    /// Per row: the activation scale.
    scale: Vec<f32>,
    /// Per row and q4 group: 8 x the sum of the quants (the zero-point correction).
    group_sums: Vec<i32>,
}

fn padded_rows(rows: usize) -> usize {
    rows.div_ceil(TILE_ROWS) * TILE_ROWS
}

/// Symmetric int8 quantisation of one row: `x ~= q * scale`.
fn quantize_row(x: &[f32], q: &mut [i8]) -> f32 {
    let max = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = max / 127.0;
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (d, &v) in q.iter_mut().zip(x) {
        *d = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    scale
}

impl Prepared {
    pub fn prepare(&mut self, x: &[f32], rows: usize, k: usize, format: DType) {
        let prows = padded_rows(rows);
        self.rows = rows;
        match format {
            DType::PanelF32 | DType::PanelF16 => {
                self.stride = k;
                self.f32s.clear();
                self.f32s.extend_from_slice(&x[..rows * k]);
                self.f32s.resize(prows * k, 0.0);
            }
            DType::PanelBf16 => {
                self.stride = k.div_ceil(2) * 2;
                self.bf16s.clear();
                self.bf16s.resize(prows * self.stride, bf16::ZERO);
                for r in 0..rows {
                    self.bf16s[r * self.stride..r * self.stride + k].convert_from_f32_slice(&x[r * k..(r + 1) * k]);
                }
            }
            DType::PanelQ8 | DType::PanelQ4 { .. } => {
                let q8 = format == DType::PanelQ8;
                self.stride = k.div_ceil(8) * 8;
                self.bytes.clear();
                self.bytes.resize(prows * self.stride, if q8 { 128 } else { 0 });
                self.scale.clear();
                self.scale.resize(prows, 0.0);
                let group = match format {
                    DType::PanelQ4 { group } => group as usize,
                    _ => k.max(1),
                };
                let groups = k.div_ceil(group);
                self.group_sums.clear();
                self.group_sums.resize(prows * groups, 0);
                let mut q = vec![0i8; k];
                for r in 0..rows {
                    self.scale[r] = quantize_row(&x[r * k..(r + 1) * k], &mut q);
                    let dst = &mut self.bytes[r * self.stride..r * self.stride + k];
                    for (d, &v) in dst.iter_mut().zip(&q) {
                        *d = if q8 { (v as i16 + 128) as u8 } else { v as u8 };
                    }
                    for g in 0..groups {
                        self.group_sums[r * groups + g] = 8 * q[g * group..((g + 1) * group).min(k)].iter().map(|&v| v as i32).sum::<i32>();
                    }
                }
            }
            DType::F32 | DType::Bf16 | DType::F16 => unreachable!("matmul weights are always packed"),
        }
    }
}

/// One tile of results: up to 16 rows x 16 columns.
type Tile = [[f32; PANEL]; TILE_ROWS];

/// Computes rows `r0..r0 + tile` (`tile` = TILE_ROWS or Q4_TILE_ROWS) of one panel.
fn panel_tile(features: Features, w: &Matrix, panel: &[u8], x: &Prepared, r0: usize, tile: &mut Tile) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::x86;
        // SAFETY (all arms): `features` comes from run-time detection, so the CPU has the
        // instructions each kernel is compiled for; the kernels index only inside `panel` and
        // the prepared rows, whose sizes `gemm` checks against the format.
        match w.format {
            DType::PanelF32 if features.avx512 => return unsafe { x86::panel_f32_avx512(&x.f32s[r0 * x.stride..], x.stride, w.k, panel, tile) },
            DType::PanelF16 if features.avx512 => return unsafe { x86::panel_f16_avx512(&x.f32s[r0 * x.stride..], x.stride, w.k, panel, tile) },
            DType::PanelBf16 if features.avx512_bf16 => {
                return unsafe { x86::panel_bf16_avx512(&x.bf16s[r0 * x.stride..], x.stride, w.k, panel, tile) }
            }
            DType::PanelQ8 if features.avx512_vnni => {
                return unsafe { x86::panel_q8_vnni(&x.bytes[r0 * x.stride..], x.stride, &x.scale[r0..], w.k, panel, tile) }
            }
            DType::PanelQ4 { group } if features.avx512_vnni => {
                let groups = w.k / group as usize;
                return unsafe {
                    x86::panel_q4_vnni(&x.bytes[r0 * x.stride..], x.stride, &x.scale[r0..], &x.group_sums[r0 * groups..], w.k, group as usize, panel, tile)
                };
            }
            _ => {}
        }
    }
    panel_tile_portable(w, panel, x, r0, tile)
}

/// The portable twin of every micro-kernel: same layout, same arithmetic (integer dot
/// products are exact, so q8/q4 agree with the SIMD kernels up to the final f32 scaling).
pub fn panel_tile_portable(w: &Matrix, panel: &[u8], x: &Prepared, r0: usize, tile: &mut Tile) {
    let k = w.k;
    let rows = match w.format {
        DType::PanelQ4 { .. } => Q4_TILE_ROWS,
        _ => TILE_ROWS,
    };
    let u16_at = |o: usize| u16::from_le_bytes([panel[o], panel[o + 1]]);
    let f32_at = |o: usize| f32::from_le_bytes(panel[o..o + 4].try_into().unwrap());
    for i in 0..rows {
        let r = r0 + i;
        let row = &mut tile[i];
        match w.format {
            DType::PanelF32 | DType::PanelF16 => {
                let xr = &x.f32s[r * x.stride..r * x.stride + k];
                *row = [0.0; PANEL];
                for (kk, &xv) in xr.iter().enumerate() {
                    for (c, o) in row.iter_mut().enumerate() {
                        let wv = if w.format == DType::PanelF32 { f32_at(4 * (kk * PANEL + c)) } else { f16::from_bits(u16_at(2 * (kk * PANEL + c))).to_f32() };
                        *o += xv * wv;
                    }
                }
            }
            DType::PanelBf16 => {
                let xr = &x.bf16s[r * x.stride..(r + 1) * x.stride];
                *row = [0.0; PANEL];
                for (kk, &xv) in xr.iter().enumerate() {
                    for (c, o) in row.iter_mut().enumerate() {
                        *o += xv.to_f32() * bf16::from_bits(u16_at(64 * (kk / 2) + 4 * c + 2 * (kk % 2))).to_f32();
                    }
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
                let g = group as usize;
                let groups = k / g;
                let xr = &x.bytes[r * x.stride..(r + 1) * x.stride];
                for (c, o) in row.iter_mut().enumerate() {
                    let mut total = 0f32;
                    for gi in 0..groups {
                        let mut acc: i32 = 0;
                        for kk in gi * g..(gi + 1) * g {
                            let byte = panel[64 * (kk / 8) + 4 * c + kk % 4];
                            let u = if kk % 8 < 4 { byte & 0xf } else { byte >> 4 };
                            acc += u as i32 * xr[kk] as i8 as i32;
                        }
                        let d = f16::from_bits(u16_at(8 * k + 32 * gi + 2 * c)).to_f32();
                        total += (acc - x.group_sums[r * groups + gi]) as f32 * d;
                    }
                    *o = total * x.scale[r];
                }
            }
            DType::F32 | DType::Bf16 | DType::F16 => unreachable!("matmul weights are always packed"),
        }
    }
}

/// Where the worker tasks write: rows of `n` floats, each task its own columns.
struct Output {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: tasks write disjoint columns (one panel each), so sharing the pointer across
// threads never lets two of them touch the same element.
unsafe impl Sync for Output {}

impl Output {
    /// Writes `vals` at `out[r * n + c0 ..]`.
    ///
    /// # Safety
    /// No other thread may write the same elements concurrently.
    unsafe fn write(&self, at: usize, vals: &[f32]) {
        assert!(at + vals.len() <= self.len, "write outside the output");
        // SAFETY: in bounds (asserted); exclusive by the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(vals.as_ptr(), self.ptr.add(at), vals.len()) };
    }
}

/// `out[rows, w.n] = x[rows, w.k] @ W^T`, using the threads of `pool` and the instruction-set
/// paths `features` allows.
pub fn gemm(x: &[f32], rows: usize, w: &Matrix, out: &mut [f32], prepared: &mut Prepared, pool: &rayon::ThreadPool, features: Features) {
    let (n, k) = (w.n, w.k);
    assert!(x.len() >= rows * k && out.len() >= rows * n, "gemm operands too small");
    let pbytes = panel_bytes(w.format, k).expect("a panel format");
    assert_eq!(w.bytes.len(), panels(n) * pbytes, "packed weights of the wrong size");
    prepared.prepare(x, rows, k, w.format);
    let tile_rows = match w.format {
        DType::PanelQ4 { .. } => Q4_TILE_ROWS,
        _ => TILE_ROWS,
    };
    let output = Output { ptr: out.as_mut_ptr(), len: rows * n };
    let prepared = &*prepared;
    let run_panel = |p: usize| {
        let panel = &w.bytes[p * pbytes..(p + 1) * pbytes];
        let cols = PANEL.min(n - p * PANEL);
        let mut tile: Tile = [[0.0; PANEL]; TILE_ROWS];
        for r0 in (0..rows).step_by(tile_rows) {
            panel_tile(features, w, panel, prepared, r0, &mut tile);
            for i in 0..tile_rows.min(rows - r0) {
                // SAFETY: panel `p` owns columns p*16 .. p*16 + cols of every row.
                unsafe { output.write((r0 + i) * n + p * PANEL, &tile[i][..cols]) };
            }
        }
    };
    let n_panels = panels(n);
    if pool.current_num_threads() <= 1 || n_panels < 4 {
        (0..n_panels).for_each(run_panel);
    } else {
        pool.install(|| (0..n_panels).into_par_iter().with_min_len(2).for_each(run_panel));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu;
    use llada_ir::packing::{pack_panel, unpack_panel};

    fn pack(format: DType, w: &[Vec<f32>], k: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for chunk in w.chunks(PANEL) {
            let refs: Vec<&[f32]> = chunk.iter().map(|r| r.as_slice()).collect();
            pack_panel(format, &refs, k, &mut out);
        }
        out
    }

    fn lcg(s: &mut u64) -> f32 {
        *s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Every format against a double-precision product with the dequantised weights, on
    /// the detected path and on the portable path; tolerances cover the activation rounding
    /// (bf16) or quantisation (int8).
    #[test]
    fn every_format_matches_the_reference_on_both_paths() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let mut s = 5;
        for &(rows, n, k) in &[(1, 16, 64), (19, 37, 128), (33, 50, 256)] {
            let x: Vec<f32> = (0..rows * k).map(|_| lcg(&mut s)).collect();
            let w: Vec<Vec<f32>> = (0..n).map(|_| (0..k).map(|_| lcg(&mut s) * 0.1).collect()).collect();
            for (format, tol) in [
                (DType::PanelF32, 1e-5),
                (DType::PanelF16, 1e-5),
                (DType::PanelBf16, 2e-2),
                (DType::PanelQ8, 2e-2),
                (DType::PanelQ4 { group: 32 }, 2e-2),
                (DType::PanelQ4 { group: 64 }, 2e-2),
            ] {
                let bytes = pack(format, &w, k);
                let m = Matrix { format, n, k, bytes: &bytes };
                let pbytes = panel_bytes(format, k).unwrap();
                // Reference: x times the weights the packed form stands for.
                let deq: Vec<Vec<[f32; PANEL]>> = bytes.chunks(pbytes).map(|p| unpack_panel(format, p, k)).collect();
                let scale = (0..rows * n).fold(0f64, |m, i| {
                    let (r, c) = (i / n, i % n);
                    m.max((0..k).map(|kk| x[r * k + kk] as f64 * deq[c / PANEL][kk][c % PANEL] as f64).sum::<f64>().abs())
                });
                let mut out = vec![0.0; rows * n];
                let mut prep = Prepared::default();
                gemm(&x, rows, &m, &mut out, &mut prep, &pool, cpu::features());
                let mut portable = vec![[[0f32; PANEL]; TILE_ROWS]; 0];
                let _ = &mut portable;
                for r in 0..rows {
                    for c in 0..n {
                        let want: f64 = (0..k).map(|kk| x[r * k + kk] as f64 * deq[c / PANEL][kk][c % PANEL] as f64).sum();
                        let err = (out[r * n + c] as f64 - want).abs() / scale.max(1e-9);
                        assert!(err <= tol, "{} {rows}x{n}x{k} [{r},{c}]: {} vs {want} (rel {err:.1e})", format.name(), out[r * n + c]);
                    }
                }
                // The portable twin on the same prepared activations gives the same tiles.
                let tile_rows = if matches!(format, DType::PanelQ4 { .. }) { Q4_TILE_ROWS } else { TILE_ROWS };
                for p in 0..panels(n) {
                    let panel = &bytes[p * pbytes..(p + 1) * pbytes];
                    for r0 in (0..rows).step_by(tile_rows) {
                        let (mut a, mut b): (Tile, Tile) = ([[0.0; PANEL]; TILE_ROWS], [[0.0; PANEL]; TILE_ROWS]);
                        panel_tile(cpu::features(), &m, panel, &prep, r0, &mut a);
                        panel_tile_portable(&m, panel, &prep, r0, &mut b);
                        for i in 0..tile_rows {
                            for c in 0..PANEL {
                                assert!((a[i][c] - b[i][c]).abs() <= 1e-4 * (1.0 + b[i][c].abs()), "{} simd vs portable", format.name());
                            }
                        }
                    }
                }
            }
        }
    }
}
