//! Packed weight layouts: how a matrix `W[n, k]` (output column `n`, input `k`) is stored so
//! the kernels can stream it. Part of the contract: the compiler packs with these functions,
//! the runtime's kernels read the same layout, and both sides' tests use them.
//!
//! Every packed format groups 16 output columns into a *panel* (one 512-bit vector of 16
//! lanes, one lane per column); panels are stored one after another, each contiguous, the
//! last one padded with zero columns.
//!
//! | format | panel data (per panel) | then |
//! |---|---|---|
//! | `PanelF32` | for each k: 16 x f32 | |
//! | `PanelF16` | for each k: 16 x f16 | |
//! | `PanelBf16` | for each pair of k: 16 x (bf16, bf16) | |
//! | `PanelQ8` | for each 4 k: 16 x 4 x s8 | 16 x f32 scale, 16 x i32 column sums of the quants |
//! | `PanelQ4 { group }` | for each 8 k: 64 bytes (below) | for each group: 16 x f16 scale |
//!
//! Q8 is symmetric per output channel: `w ~= q * scale`, `q` in -127..=127.
//! Q4 is per (column, group of k) like llama.cpp's Q4_0: `w ~= (u - 8) * scale`, `u` in 0..=15,
//! the scale chosen so the value of largest magnitude maps to -8. Each 64-byte block of 8 k
//! holds two 64-byte vectors of unsigned 4-bit values: byte `b` has vector A's byte `b` in its
//! low nibble and vector B's in its high nibble, where A (k..k+4) and B (k+4..k+8) each hold
//! 16 columns x 4 consecutive k (column `c` at bytes `4c..4c+4`). One load, a mask and a
//! shift give both.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

/// How a stored tensor's bytes are laid out: plain row-major elements, or one of the packed
/// matrix layouts of this module (16-column panels, possibly quantised).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
    F16,
    PanelF32,
    PanelF16,
    PanelBf16,
    /// int8, one f32 scale per output channel.
    PanelQ8,
    /// int4, one f16 scale per output channel and `group` inputs.
    PanelQ4 { group: u32 },
}

impl DType {
    /// Bytes per element of a row-major type (`None` for packed layouts).
    pub fn element_bytes(self) -> Option<u64> {
        match self {
            DType::F32 => Some(4),
            DType::Bf16 | DType::F16 => Some(2),
            _ => None,
        }
    }

    /// Bytes a tensor of `shape` takes in this layout (`None` if the layout cannot hold it;
    /// packed layouts need a 2-D `[n, k]` shape).
    pub fn nbytes(self, shape: &[u64]) -> Option<u64> {
        let numel = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
        match self.element_bytes() {
            Some(b) => numel.checked_mul(b),
            None => match *shape {
                [n, k] => {
                    let panel = panel_bytes(self, k as usize)? as u64;
                    (panels(n as usize) as u64).checked_mul(panel)
                }
                _ => None,
            },
        }
    }

    pub fn is_panel(self) -> bool {
        self.element_bytes().is_none()
    }

    pub fn name(self) -> String {
        match self {
            DType::F32 => "f32".into(),
            DType::Bf16 => "bf16".into(),
            DType::F16 => "f16".into(),
            DType::PanelF32 => "panel-f32".into(),
            DType::PanelF16 => "panel-f16".into(),
            DType::PanelBf16 => "panel-bf16".into(),
            DType::PanelQ8 => "panel-q8".into(),
            DType::PanelQ4 { group } => format!("panel-q4g{group}"),
        }
    }

    pub fn parse(name: &str) -> Option<DType> {
        match name {
            "f32" => Some(DType::F32),
            "bf16" => Some(DType::Bf16),
            "f16" => Some(DType::F16),
            _ => None,
        }
    }
}

/// Output columns per panel.
pub const PANEL: usize = 16;

pub fn panels(n: usize) -> usize {
    n.div_ceil(PANEL)
}

/// Bytes of one panel of a `k`-wide matrix in `format`; `None` for non-panel formats or a
/// `k` the format cannot hold.
pub fn panel_bytes(format: DType, k: usize) -> Option<usize> {
    match format {
        DType::PanelF32 => Some(64 * k),
        DType::PanelF16 => Some(32 * k),
        DType::PanelBf16 => Some(64 * k.div_ceil(2)),
        DType::PanelQ8 => Some(64 * k.div_ceil(4) + 128),
        DType::PanelQ4 { group } => {
            let g = group as usize;
            (g >= 8 && g % 8 == 0 && k % g == 0).then(|| 8 * k + 32 * (k / g))
        }
        DType::F32 | DType::Bf16 | DType::F16 => None,
    }
}

/// Offsets inside a Q8 or Q4 panel: where the quantised data ends and scales (then Q8's
/// column sums) begin.
pub fn panel_data_bytes(format: DType, k: usize) -> usize {
    match format {
        DType::PanelQ8 => 64 * k.div_ceil(4),
        DType::PanelQ4 { .. } => 8 * k,
        other => panel_bytes(other, k).unwrap_or(0),
    }
}

/// Packs one panel: `rows` holds up to 16 rows of `k` weights (missing rows are zero
/// columns); the panel's bytes are appended to `out`.
pub fn pack_panel(format: DType, rows: &[&[f32]], k: usize, out: &mut Vec<u8>) {
    assert!(rows.len() <= PANEL && rows.iter().all(|r| r.len() == k));
    let w = |c: usize, kk: usize| rows.get(c).and_then(|r| r.get(kk)).copied().unwrap_or(0.0);
    match format {
        DType::PanelF32 => {
            for kk in 0..k {
                for c in 0..PANEL {
                    out.extend_from_slice(&w(c, kk).to_le_bytes());
                }
            }
        }
        DType::PanelF16 => {
            for kk in 0..k {
                for c in 0..PANEL {
                    out.extend_from_slice(&f16::from_f32(w(c, kk)).to_le_bytes());
                }
            }
        }
        DType::PanelBf16 => {
            for kp in 0..k.div_ceil(2) {
                for c in 0..PANEL {
                    out.extend_from_slice(&bf16::from_f32(w(c, 2 * kp)).to_le_bytes());
                    out.extend_from_slice(&bf16::from_f32(w(c, 2 * kp + 1)).to_le_bytes());
                }
            }
        }
        DType::PanelQ8 => {
            let scales: [f32; PANEL] = std::array::from_fn(|c| (0..k).fold(0f32, |m, kk| m.max(w(c, kk).abs())) / 127.0);
            let q = |c: usize, kk: usize| -> i8 {
                if scales[c] == 0.0 { 0 } else { (w(c, kk) / scales[c]).round().clamp(-127.0, 127.0) as i8 }
            };
            for kq in 0..k.div_ceil(4) {
                for c in 0..PANEL {
                    for j in 0..4 {
                        out.push(q(c, 4 * kq + j) as u8);
                    }
                }
            }
            for s in scales {
                out.extend_from_slice(&s.to_le_bytes());
            }
            for c in 0..PANEL {
                let sum: i32 = (0..k).map(|kk| q(c, kk) as i32).sum();
                out.extend_from_slice(&sum.to_le_bytes());
            }
        }
        DType::PanelQ4 { group } => {
            let g = group as usize;
            assert!(k % g == 0 && g % 8 == 0, "k {k} is not a multiple of the group {g}");
            // Scale per (group, column): the value of largest magnitude maps to -8.
            let scales: Vec<[f16; PANEL]> = (0..k / g)
                .map(|gi| {
                    std::array::from_fn(|c| {
                        let m = (gi * g..(gi + 1) * g).map(|kk| w(c, kk)).fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
                        f16::from_f32(m / -8.0)
                    })
                })
                .collect();
            let u = |c: usize, kk: usize| -> u8 {
                let d = scales[kk / g][c].to_f32();
                if d == 0.0 { 8 } else { ((w(c, kk) / d).round() + 8.0).clamp(0.0, 15.0) as u8 }
            };
            for kb in 0..k / 8 {
                for c in 0..PANEL {
                    for j in 0..4 {
                        out.push(u(c, 8 * kb + j) | (u(c, 8 * kb + 4 + j) << 4));
                    }
                }
            }
            for s in &scales {
                for v in s {
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        DType::F32 | DType::Bf16 | DType::F16 => panic!("{} is not a panel format", format.name()),
    }
}

/// Bytes of one llama.cpp Q4_0 block: an f16 scale, then 16 bytes of 32 four-bit values (low
/// nibbles the first 16, high nibbles the last 16), `w = (u - 8) * scale`.
pub const Q4_0_BLOCK_BYTES: usize = 18;

/// Packs one `PanelQ4 { group: 32 }` panel from up to 16 rows of llama.cpp Q4_0 blocks
/// (`k / 32` blocks a row): the same numbers, moved, not re-quantised. The two formats agree
/// on everything but the order (both `w = (u - 8) * f16 scale` per 32 inputs), so the unpacked
/// panel equals the blocks' dequantisation exactly. Missing rows are zero columns, as
/// [`pack_panel`] pads them (u 8, scale -0.0).
pub fn pack_q4_0_panel(rows: &[&[u8]], k: usize, out: &mut Vec<u8>) {
    assert!(rows.len() <= PANEL && k % 32 == 0 && rows.iter().all(|r| r.len() == k / 32 * Q4_0_BLOCK_BYTES));
    let u = |c: usize, kk: usize| -> u8 {
        match rows.get(c) {
            Some(r) => {
                let (block, e) = (kk / 32, kk % 32);
                (r[block * Q4_0_BLOCK_BYTES + 2 + e % 16] >> (4 * (e / 16))) & 15
            }
            None => 8,
        }
    };
    for kb in 0..k / 8 {
        for c in 0..PANEL {
            for j in 0..4 {
                out.push(u(c, 8 * kb + j) | (u(c, 8 * kb + 4 + j) << 4));
            }
        }
    }
    for block in 0..k / 32 {
        for c in 0..PANEL {
            match rows.get(c) {
                Some(r) => out.extend_from_slice(&r[block * Q4_0_BLOCK_BYTES..block * Q4_0_BLOCK_BYTES + 2]),
                None => out.extend_from_slice(&f16::from_f32(-0.0).to_le_bytes()),
            }
        }
    }
}

/// The weights a packed panel stands for, `[16][k]` (quantised formats dequantised): the
/// reference the kernels are tested against.
pub fn unpack_panel(format: DType, panel: &[u8], k: usize) -> Vec<[f32; PANEL]> {
    let mut w = vec![[0f32; PANEL]; k];
    let f32_at = |o: usize| f32::from_le_bytes(panel[o..o + 4].try_into().unwrap());
    let u16_at = |o: usize| u16::from_le_bytes([panel[o], panel[o + 1]]);
    match format {
        DType::PanelF32 => (0..k).for_each(|kk| (0..PANEL).for_each(|c| w[kk][c] = f32_at(4 * (kk * PANEL + c)))),
        DType::PanelF16 => (0..k).for_each(|kk| (0..PANEL).for_each(|c| w[kk][c] = f16::from_bits(u16_at(2 * (kk * PANEL + c))).to_f32())),
        DType::PanelBf16 => (0..k).for_each(|kk| {
            (0..PANEL).for_each(|c| w[kk][c] = bf16::from_bits(u16_at(64 * (kk / 2) + 4 * c + 2 * (kk % 2))).to_f32())
        }),
        DType::PanelQ8 => {
            let data = panel_data_bytes(format, k);
            for kk in 0..k {
                for c in 0..PANEL {
                    w[kk][c] = panel[64 * (kk / 4) + 4 * c + kk % 4] as i8 as f32 * f32_at(data + 4 * c);
                }
            }
        }
        DType::PanelQ4 { group } => {
            let g = group as usize;
            for kk in 0..k {
                for c in 0..PANEL {
                    let byte = panel[64 * (kk / 8) + 4 * c + kk % 4];
                    let u = if kk % 8 < 4 { byte & 0xf } else { byte >> 4 };
                    let d = f16::from_bits(u16_at(8 * k + 32 * (kk / g) + 2 * c)).to_f32();
                    w[kk][c] = (u as f32 - 8.0) * d;
                }
            }
        }
        DType::F32 | DType::Bf16 | DType::F16 => panic!("{} is not a panel format", format.name()),
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Q4_0 blocks carried into a panel unpack to exactly their own dequantisation, including
    /// blocks whose largest magnitude is not at u = 0 (which re-quantising floats would
    /// change); padding columns are the zero columns `pack_panel` writes.
    #[test]
    fn q4_0_blocks_carry_into_q4_panels_exactly() {
        let k = 64;
        let mut rows: Vec<Vec<u8>> = Vec::new();
        for r in 0..5u32 {
            let mut row = Vec::new();
            for b in 0..k / 32 {
                row.extend_from_slice(&f16::from_f32(0.01 * (r as f32 + 1.0) * if b % 2 == 0 { 1.0 } else { -1.0 }).to_le_bytes());
                // Values 3..=12 only: no u = 0 or 15 in the block.
                row.extend((0..16u32).map(|j| (3 + (j * 7 + r + b as u32) % 10) as u8 | ((3 + (j * 3 + r) % 10) as u8) << 4));
            }
            rows.push(row);
        }
        let refs: Vec<&[u8]> = rows.iter().map(|r| r.as_slice()).collect();
        let mut out = Vec::new();
        pack_q4_0_panel(&refs, k, &mut out);
        assert_eq!(out.len(), panel_bytes(DType::PanelQ4 { group: 32 }, k).unwrap());
        let back = unpack_panel(DType::PanelQ4 { group: 32 }, &out, k);
        for (c, row) in rows.iter().enumerate() {
            for kk in 0..k {
                let block = &row[kk / 32 * Q4_0_BLOCK_BYTES..];
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let e = kk % 32;
                let u = (block[2 + e % 16] >> (4 * (e / 16))) & 15;
                assert_eq!(back[kk][c].to_bits(), (d * (u as i32 - 8) as f32).to_bits(), "column {c} k {kk}");
            }
        }
        let mut zeros = Vec::new();
        pack_panel(DType::PanelQ4 { group: 32 }, &[], k, &mut zeros);
        let pad = |p: &[u8], c: usize| -> Vec<u8> { (0..k / 8).flat_map(|kb| p[64 * kb + 4 * c..64 * kb + 4 * c + 4].to_vec()).chain((0..k / 32).flat_map(|g| p[8 * k + 32 * g + 2 * c..8 * k + 32 * g + 2 * c + 2].to_vec())).collect() };
        for c in 5..PANEL {
            assert_eq!(pad(&out, c), pad(&zeros, c), "padding column {c}");
        }
        // Re-quantising the same values from floats gives other nibbles and scales.
        let floats: Vec<Vec<f32>> = (0..5).map(|c| (0..k).map(|kk| back[kk][c]).collect()).collect();
        let frefs: Vec<&[f32]> = floats.iter().map(|r| r.as_slice()).collect();
        let mut again = Vec::new();
        pack_panel(DType::PanelQ4 { group: 32 }, &frefs, k, &mut again);
        assert_ne!(again, out);
    }

    fn rows(n: usize, k: usize) -> Vec<Vec<f32>> {
        (0..n).map(|r| (0..k).map(|c| ((r * 31 + c * 17) % 23) as f32 / 7.0 - 1.5).collect()).collect()
    }

    #[test]
    fn every_format_round_trips_within_its_precision() {
        let (n, k) = (13, 128);
        let data = rows(n, k);
        let refs: Vec<&[f32]> = data.iter().map(|r| r.as_slice()).collect();
        for (format, tol) in [
            (DType::PanelF32, 0.0),
            (DType::PanelF16, 1e-3),
            (DType::PanelBf16, 1e-2),
            (DType::PanelQ8, 0.02),
            (DType::PanelQ4 { group: 32 }, 0.25),
            (DType::PanelQ4 { group: 128 }, 0.25),
        ] {
            let mut out = Vec::new();
            pack_panel(format, &refs, k, &mut out);
            assert_eq!(out.len(), panel_bytes(format, k).unwrap(), "{}", format.name());
            let back = unpack_panel(format, &out, k);
            for c in 0..PANEL {
                for kk in 0..k {
                    let want = if c < n { data[c][kk] } else { 0.0 };
                    assert!((back[kk][c] - want).abs() <= tol, "{} c{c} k{kk}: {} vs {want}", format.name(), back[kk][c]);
                }
            }
        }
    }

    #[test]
    fn q4_maps_the_largest_magnitude_exactly() {
        let row = [0.5f32, -2.0, 1.0, 0.25, 0.0, 0.0, 0.0, 0.0];
        let mut out = Vec::new();
        pack_panel(DType::PanelQ4 { group: 8 }, &[&row], 8, &mut out);
        let back = unpack_panel(DType::PanelQ4 { group: 8 }, &out, 8);
        assert_eq!(back[1][0], -2.0);
        assert_eq!(back[2][0], 1.0);
    }

    #[test]
    fn q4_needs_k_in_whole_groups() {
        assert_eq!(panel_bytes(DType::PanelQ4 { group: 64 }, 96), None);
        assert_eq!(panel_bytes(DType::PanelQ4 { group: 32 }, 96), Some(8 * 96 + 32 * 3));
    }
}
