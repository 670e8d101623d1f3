//! ggml's tensor element types, as GGUF numbers them, and the exact dequantization of the
//! block-quantized ones that are read. Each block decodes in f32 with the same operations, in
//! the same order, as llama.cpp's `gguf` package (`gguf/quants.py`, `dequantize_blocks`), so
//! the values equal its `gguf.quants.dequantize` bit for bit (Rust does not fuse `a * b + c`).

use half::{bf16, f16};

/// A ggml type a GGUF tensor may have. The block-quantized types that are not read (Q2_K,
/// Q3_K, the IQ and TQ types, MXFP4) are named, so the error can say which one a tensor has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
    /// A type this reader knows the size of but does not decode: (id, name).
    Other(u32, &'static str),
}

/// (id, name, elements per block, bytes per block) of every type ggml defines today
/// (`ggml.h` `enum ggml_type`; ids 4, 5 and 31-33 are retired).
const TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 36),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        let &(id, name, _, _) = TYPES.iter().find(|t| t.0 == id)?;
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            30 => GgmlType::Bf16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            _ => GgmlType::Other(id, name),
        })
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Bf16 => 30,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Other(id, _) => id,
        }
    }

    fn entry(self) -> (u32, &'static str, u64, u64) {
        let id = self.id();
        *TYPES.iter().find(|t| t.0 == id).expect("every GgmlType is in TYPES")
    }

    pub fn name(self) -> &'static str {
        self.entry().1
    }

    pub fn block_elements(self) -> u64 {
        self.entry().2
    }

    pub fn block_bytes(self) -> u64 {
        self.entry().3
    }

    /// Whether [`dequantize`] decodes this block-quantized type.
    pub fn is_decoded_block(self) -> bool {
        matches!(self, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
    }
}

fn half(b: &[u8]) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// The scale of a block (its first f16; Q6_K's is its last), which a hostile file may make
/// NaN or infinite: the byte range, so the importer can check it.
pub fn scale_ranges(ty: GgmlType) -> &'static [std::ops::Range<usize>] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0..2],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0..2, 2..4],
        GgmlType::Q6K => &[208..210],
        _ => &[],
    }
}

/// The index (within `raw`'s blocks) of the first block whose f16 scale or minimum is NaN or
/// infinite.
pub fn first_non_finite_block(ty: GgmlType, raw: &[u8]) -> Option<usize> {
    let n = ty.block_bytes() as usize;
    raw.chunks_exact(n).position(|b| scale_ranges(ty).iter().any(|r| !half(&b[r.clone()]).is_finite()))
}

/// Appends the f32 values of `raw`, whole blocks of `ty`, to `out`.
pub fn dequantize(ty: GgmlType, raw: &[u8], out: &mut Vec<f32>) {
    let n = ty.block_bytes() as usize;
    out.reserve(raw.len() / n * ty.block_elements() as usize);
    for b in raw.chunks_exact(n) {
        match ty {
            GgmlType::F32 => out.push(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            GgmlType::F16 => out.push(half(b)),
            GgmlType::Bf16 => out.push(bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
            GgmlType::Q8_0 => {
                let d = half(b);
                out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
            }
            GgmlType::Q4_0 => {
                let d = half(b);
                out.extend((0..32).map(|e| d * (nibble(&b[2..18], e) as i8 - 8) as f32));
            }
            GgmlType::Q4_1 => {
                let (d, m) = (half(b), half(&b[2..]));
                out.extend((0..32).map(|e| d * nibble(&b[4..20], e) as f32 + m));
            }
            GgmlType::Q5_0 => {
                let d = half(b);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                out.extend((0..32).map(|e| d * ((nibble(&b[6..22], e) | (((qh >> e) & 1) as u8) << 4) as i8 - 16) as f32));
            }
            GgmlType::Q5_1 => {
                let (d, m) = (half(b), half(&b[2..]));
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                out.extend((0..32).map(|e| d * (nibble(&b[8..24], e) | (((qh >> e) & 1) as u8) << 4) as f32 + m));
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                let (d, dmin) = (half(b), half(&b[2..]));
                let (sc, mn) = scale_min(&b[4..16]);
                let (qh, qs) = if ty == GgmlType::Q5K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
                for j in 0..8 {
                    let (dl, ml) = (d * sc[j] as f32, dmin * mn[j] as f32);
                    for l in 0..32 {
                        let low = (qs[(j / 2) * 32 + l] >> (4 * (j % 2))) & 15;
                        let high = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
                        out.push(dl * (low | high) as f32 - ml);
                    }
                }
            }
            GgmlType::Q6K => {
                let (ql, qh, scales, d) = (&b[..128], &b[128..192], &b[192..208], half(&b[208..]));
                for e in 0..256 {
                    let (h, r) = (e / 128, e % 128);
                    let low = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 15;
                    let high = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 3;
                    let q = (low | high << 4) as i8 - 32;
                    out.push(d * scales[e / 16] as i8 as f32 * q as f32);
                }
            }
            GgmlType::Other(..) => unreachable!("the importer refuses {} before decoding", ty.name()),
        }
    }
}

/// Element `e` (0..32) of a 16-byte nibble array: low nibbles hold elements 0..16, high
/// nibbles 16..32.
fn nibble(qs: &[u8], e: usize) -> u8 {
    (qs[e % 16] >> (4 * (e / 16))) & 15
}

/// The eight 6-bit scales and minimums of a Q4_K/Q5_K block's 12 scale bytes.
fn scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 63;
        mn[j] = s[j + 4] & 63;
        sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_round_trips_its_id_and_has_whole_blocks() {
        for &(id, name, elems, bytes) in TYPES {
            let t = GgmlType::from_id(id).unwrap();
            assert_eq!((t.id(), t.name(), t.block_elements(), t.block_bytes()), (id, name, elems, bytes));
        }
        assert_eq!(GgmlType::from_id(4), None);
    }

    /// Random blocks of every decoded type (tools/gguf/block_golden.py) decode to exactly what
    /// llama.cpp's `gguf.quants.dequantize` made of them, bit for bit.
    #[test]
    fn blocks_decode_as_gguf_py_decodes_them() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/gguf/blocks");
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let raw = std::fs::read(format!("{dir}/{}.blocks", ty.name())).unwrap();
            let want: Vec<u32> = std::fs::read(format!("{dir}/{}.f32", ty.name())).unwrap().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())).collect();
            let mut got = Vec::new();
            dequantize(ty, &raw, &mut got);
            assert_eq!(got.len(), want.len(), "{}", ty.name());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), *w, "{} element {i}: {g} vs {}", ty.name(), f32::from_bits(*w));
            }
            assert_eq!(first_non_finite_block(ty, &raw), None);
        }
    }

    /// Every quantized tensor of the fixtures made by tools/gguf/quantize.py decodes to values
    /// whose CRC-32 is that of `gguf.quants.dequantize`'s (recorded beside each file).
    #[test]
    fn every_block_of_the_quantized_fixtures_decodes_as_gguf_py() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/gguf");
        for mix in ["q8_0", "q4_0", "q4_k_m"] {
            let path = std::path::PathBuf::from(format!("{dir}/llada-tiny-tasks.{mix}.gguf"));
            let bytes = std::fs::read(&path).unwrap();
            let (_, tensors) = super::super::container::parse(&path, &bytes).unwrap();
            let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{dir}/llada-tiny-tasks.{mix}.dequant.json")).unwrap()).unwrap();
            let want = want.as_object().unwrap();
            assert_eq!(tensors.iter().filter(|t| t.ty != GgmlType::F32).count(), want.len(), "{mix}");
            for t in tensors.iter().filter(|t| t.ty != GgmlType::F32) {
                let mut values = Vec::new();
                dequantize(t.ty, &bytes[t.start as usize..(t.start + t.nbytes) as usize], &mut values);
                let crc = crc32fast::hash(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>());
                let w = &want[&t.name];
                assert_eq!((t.ty.name(), values.len() as u64, crc as u64), (w[0].as_str().unwrap(), w[1].as_u64().unwrap(), w[2].as_u64().unwrap()), "{mix} {}", t.name);
            }
        }
    }

    /// A Q4_0 block by hand: scale 0.5, element e has nibble e % 16.
    #[test]
    fn q4_0_low_nibbles_are_the_first_half() {
        let mut b = f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | (15 - j) << 4));
        let mut out = Vec::new();
        dequantize(GgmlType::Q4_0, &b, &mut out);
        assert_eq!(out[0], -4.0);
        assert_eq!(out[15], 3.5);
        assert_eq!(out[16], 3.5);
        assert_eq!(out[31], -4.0);
    }
}
