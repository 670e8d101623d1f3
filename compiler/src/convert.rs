//! Element-type conversion of weight bytes, chunk by chunk. Widening is exact; narrowing
//! rounds to nearest even (the `half` crate's conversions).

use half::{bf16, f16};
use llada_ir::DType;

use crate::hf::checkpoint::SourceDType;

fn decode(src: SourceDType, raw: &[u8]) -> Box<dyn Iterator<Item = f32> + '_> {
    if let SourceDType::Block(t) = src {
        // A GGUF's quantized blocks, decoded exactly (`gguf::quant`).
        let mut values = Vec::new();
        crate::gguf::quant::dequantize(t, raw, &mut values);
        return Box::new(values.into_iter());
    }
    Box::new(raw.chunks_exact(src.size_bytes()).map(move |c| match src {
        SourceDType::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
        SourceDType::Bf16 => bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
        SourceDType::F16 => f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32(),
        SourceDType::Block(_) => unreachable!("decoded above"),
    }))
}

/// Appends `raw` (little-endian elements of `src`) to `out` as elements of `dst`.
pub fn convert(src: SourceDType, raw: &[u8], dst: DType, out: &mut Vec<u8>) {
    let same = matches!((src, dst), (SourceDType::F32, DType::F32) | (SourceDType::Bf16, DType::Bf16) | (SourceDType::F16, DType::F16));
    if same {
        out.extend_from_slice(raw);
        return;
    }
    out.reserve(src.elements(raw.len()) * dst.element_bytes().unwrap_or(4) as usize);
    match dst {
        DType::F32 => decode(src, raw).for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        DType::Bf16 => decode(src, raw).for_each(|x| out.extend_from_slice(&bf16::from_f32(x).to_bits().to_le_bytes())),
        DType::F16 => decode(src, raw).for_each(|x| out.extend_from_slice(&f16::from_f32(x).to_bits().to_le_bytes())),
        packed => panic!("convert writes row-major tensors, not {}", packed.name()),
    }
}

/// The first of `values` that `dst` stores as infinity: a finite value past a 16-bit
/// format's range (f16's 65504) rounds to it. The source's own infinities and NaNs are
/// refused as it is read.
pub fn first_overflow(values: impl IntoIterator<Item = f32>, dst: DType) -> Option<usize> {
    match dst {
        DType::F16 | DType::PanelF16 => values.into_iter().position(|x| f16::from_f32(x).is_infinite()),
        DType::Bf16 | DType::PanelBf16 => values.into_iter().position(|x| bf16::from_f32(x).is_infinite()),
        _ => None,
    }
}

/// [`first_overflow`] of `raw`, little-endian elements of `src`.
pub fn first_overflow_raw(src: SourceDType, raw: &[u8], dst: DType) -> Option<usize> {
    match (src, dst) {
        (SourceDType::F32 | SourceDType::Block(_), DType::F16 | DType::Bf16) | (SourceDType::Bf16, DType::F16) => first_overflow(decode(src, raw), dst),
        _ => None,
    }
}

/// Appends `raw` (little-endian elements of `src`) to `out` as f32.
pub fn to_f32(src: SourceDType, raw: &[u8], out: &mut Vec<f32>) {
    out.extend(decode(src, raw));
}

pub fn source_to_dtype(src: SourceDType) -> DType {
    match src {
        SourceDType::F32 => DType::F32,
        SourceDType::Bf16 => DType::Bf16,
        SourceDType::F16 => DType::F16,
        SourceDType::Block(_) => DType::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_past_the_range_is_found() {
        let vals = [1.0f32, -65504.0, 65520.0, 3.0];
        let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(first_overflow_raw(SourceDType::F32, &raw, DType::F16), Some(2));
        assert_eq!(first_overflow(vals, DType::PanelF16), Some(2));
        assert_eq!(first_overflow_raw(SourceDType::F32, &raw, DType::Bf16), None);
        assert_eq!(first_overflow([f32::MAX], DType::PanelBf16), Some(0));
        assert_eq!(first_overflow([f32::MAX], DType::PanelF32), None);
    }

    #[test]
    fn widening_is_exact_and_narrowing_rounds_to_nearest() {
        let vals = [1.0f32, -2.5, 3.140625, 1.0e-3];
        let raw: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
        let mut out = Vec::new();
        convert(SourceDType::Bf16, &raw, DType::F32, &mut out);
        let back: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        for (a, b) in vals.iter().zip(&back) {
            assert_eq!(bf16::from_f32(*a).to_f32(), *b);
        }
        let mut narrowed = Vec::new();
        convert(SourceDType::F32, &out, DType::Bf16, &mut narrowed);
        assert_eq!(narrowed, raw);
        // 1 + 2^-8 + 2^-9 lies above the midpoint between two bf16 values: rounds up.
        let x = 1.0f32 + 2f32.powi(-8) + 2f32.powi(-9);
        let mut one = Vec::new();
        convert(SourceDType::F32, &x.to_le_bytes(), DType::Bf16, &mut one);
        assert_eq!(u16::from_le_bytes([one[0], one[1]]), bf16::from_f32(1.0 + 2f32.powi(-7)).to_bits());
    }
}
