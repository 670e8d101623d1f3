//! Constant tensors of an ONNX graph: initializers as stored (raw little-endian bytes, weights
//! stay that way) and the small values that folding computes (shapes, indices, rotary tables),
//! held as numbers.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use half::{bf16, f16};

/// ONNX element types lladac meets (`TensorProto.DataType` numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    Bf16,
    F64,
    I64,
    I32,
    I8,
    U8,
    Bool,
}

impl Elem {
    pub fn from_onnx(code: i32) -> Option<Elem> {
        Some(match code {
            1 => Elem::F32,
            2 => Elem::U8,
            3 => Elem::I8,
            6 => Elem::I32,
            7 => Elem::I64,
            9 => Elem::Bool,
            10 => Elem::F16,
            11 => Elem::F64,
            16 => Elem::Bf16,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Elem::F64 | Elem::I64 => 8,
            Elem::F32 | Elem::I32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
            Elem::I8 | Elem::U8 | Elem::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Elem::F32 | Elem::F16 | Elem::Bf16 | Elem::F64)
    }

    /// The relative rounding error of one value of this type: how far a constant such as the
    /// attention scale may sit from its exact value after the exporter rounded it.
    pub fn epsilon(self) -> f64 {
        match self {
            Elem::Bf16 => 1.0 / 256.0,
            Elem::F16 => 1.0 / 2048.0,
            Elem::F32 => 1.0 / 16_777_216.0,
            _ => 0.0,
        }
    }

    /// `x` as this type would store it.
    pub fn round(self, x: f64) -> f64 {
        match self {
            Elem::F32 => x as f32 as f64,
            Elem::F16 => f16::from_f64(x).to_f64(),
            Elem::Bf16 => bf16::from_f64(x).to_f64(),
            Elem::F64 => x,
            Elem::Bool => (x != 0.0) as u8 as f64,
            // Integer casts truncate toward zero, as ONNX's Cast does.
            _ => x.trunc(),
        }
    }
}

/// The values of a constant: the file's bytes, or numbers folding produced.
#[derive(Clone)]
pub enum Data {
    /// Little-endian elements as the file stores them: a slice of the mapped model or external
    /// data file (an initializer is not copied until the compiler takes it).
    Raw(Bytes),
    Float(Arc<[f64]>),
    Int(Arc<[i64]>),
}

#[derive(Clone)]
pub struct Tensor {
    pub elem: Elem,
    pub dims: Vec<usize>,
    pub data: Data,
}

/// Folding refuses to turn more elements than this into numbers: what LLaDA's exports fold
/// (shapes, index ranges, rotary tables) is small, a weight is not.
pub const FOLD_LIMIT: usize = 1 << 24;

impl Tensor {
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    pub fn floats(elem: Elem, dims: Vec<usize>, v: Vec<f64>) -> Tensor {
        let v: Vec<f64> = v.into_iter().map(|x| elem.round(x)).collect();
        if elem.is_float() {
            Tensor { elem, dims, data: Data::Float(v.into()) }
        } else {
            Tensor { elem, dims, data: Data::Int(v.into_iter().map(|x| x as i64).collect::<Vec<_>>().into()) }
        }
    }

    pub fn ints(elem: Elem, dims: Vec<usize>, v: Vec<i64>) -> Tensor {
        if elem.is_float() {
            return Tensor::floats(elem, dims, v.into_iter().map(|x| x as f64).collect());
        }
        let v = if elem == Elem::Bool { v.into_iter().map(|x| (x != 0) as i64).collect() } else { v };
        Tensor { elem, dims, data: Data::Int(v.into()) }
    }

    pub fn scalar_i64(v: i64) -> Tensor {
        Tensor::ints(Elem::I64, vec![], vec![v])
    }

    /// The values as f64, decoding raw bytes (an error past `FOLD_LIMIT` elements).
    pub fn f64s(&self) -> Result<Cow<'_, [f64]>, String> {
        Ok(match &self.data {
            Data::Float(v) => Cow::Borrowed(v),
            Data::Int(v) => Cow::Owned(v.iter().map(|&x| x as f64).collect()),
            Data::Raw(b) => {
                self.check_size()?;
                Cow::Owned(decode(self.elem, b))
            }
        })
    }

    /// The values as i64: integers as held, anything else through its f64 values (truncated).
    pub fn i64s(&self) -> Result<Cow<'_, [i64]>, String> {
        Ok(match &self.data {
            Data::Int(v) => Cow::Borrowed(v),
            Data::Float(_) | Data::Raw(_) => Cow::Owned(self.f64s()?.iter().map(|&x| x as i64).collect()),
        })
    }

    fn check_size(&self) -> Result<(), String> {
        if self.numel() > FOLD_LIMIT {
            return Err(format!("a constant of {} elements would be computed on; folding covers shapes and tables, not weights", self.numel()));
        }
        Ok(())
    }

    /// The one value of a single-element tensor.
    pub fn scalar(&self) -> Option<f64> {
        (self.numel() == 1).then(|| self.f64s().ok().map(|v| v[0])).flatten()
    }

    /// The elements as little-endian bytes of `self.elem`.
    pub fn bytes(&self) -> Cow<'_, [u8]> {
        match &self.data {
            Data::Raw(b) => Cow::Borrowed(b),
            Data::Float(v) => Cow::Owned(v.iter().flat_map(|&x| encode(self.elem, x)).collect()),
            Data::Int(v) => Cow::Owned(v.iter().flat_map(|&x| encode(self.elem, x as f64)).collect()),
        }
    }

    /// Elements moved whole in the order `index` gives (a transpose, slice or gather of any
    /// size, weights included, without decoding them).
    pub fn select(&self, dims: Vec<usize>, index: impl Iterator<Item = usize>) -> Tensor {
        let data = match &self.data {
            Data::Raw(b) => {
                let s = self.elem.size();
                Data::Raw(Bytes::from(index.flat_map(|i| b[i * s..(i + 1) * s].iter().copied()).collect::<Vec<u8>>()))
            }
            Data::Float(v) => Data::Float(index.map(|i| v[i]).collect::<Vec<_>>().into()),
            Data::Int(v) => Data::Int(index.map(|i| v[i]).collect::<Vec<_>>().into()),
        };
        Tensor { elem: self.elem, dims, data }
    }

    pub fn reshaped(&self, dims: Vec<usize>) -> Tensor {
        Tensor { elem: self.elem, dims, data: self.data.clone() }
    }
}

fn decode(elem: Elem, b: &[u8]) -> Vec<f64> {
    let s = elem.size();
    b.chunks_exact(s)
        .map(|c| match elem {
            Elem::F32 => f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            Elem::F16 => f16::from_le_bytes([c[0], c[1]]).to_f64(),
            Elem::Bf16 => bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            Elem::F64 => f64::from_le_bytes(c.try_into().unwrap()),
            Elem::I64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            Elem::I32 => i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64,
            Elem::I8 => c[0] as i8 as f64,
            Elem::U8 | Elem::Bool => c[0] as f64,
        })
        .collect()
}

fn encode(elem: Elem, x: f64) -> Vec<u8> {
    match elem {
        Elem::F32 => (x as f32).to_le_bytes().to_vec(),
        Elem::F16 => f16::from_f64(x).to_le_bytes().to_vec(),
        Elem::Bf16 => bf16::from_f64(x).to_le_bytes().to_vec(),
        Elem::F64 => x.to_le_bytes().to_vec(),
        Elem::I64 => (x as i64).to_le_bytes().to_vec(),
        Elem::I32 => (x as i32).to_le_bytes().to_vec(),
        Elem::I8 => vec![x as i8 as u8],
        Elem::U8 | Elem::Bool => vec![x as u8],
    }
}

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_bytes_decode_per_element_type_and_round_trip() {
        let b: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = Tensor { elem: Elem::F32, dims: vec![2], data: Data::Raw(Bytes::from(b.clone())) };
        assert_eq!(&*t.f64s().unwrap(), &[1.5, -2.0]);
        let f = Tensor::floats(Elem::F32, vec![2], vec![1.5, -2.0]);
        assert_eq!(&*f.bytes(), &b[..]);
        assert_eq!(Elem::Bf16.round(1.0 / 32f64.sqrt()), 0.1767578125);
    }

    #[test]
    fn select_moves_raw_elements_whole() {
        let b: Vec<u8> = [1u16, 2, 3, 4, 5, 6].iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = Tensor { elem: Elem::Bf16, dims: vec![2, 3], data: Data::Raw(Bytes::from(b)) };
        // Transpose [2, 3] -> [3, 2].
        let tt = t.select(vec![3, 2], (0..6).map(|i| (i % 2) * 3 + i / 2));
        let got: Vec<u16> = tt.bytes().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(got, [1, 4, 2, 5, 3, 6]);
    }
}
