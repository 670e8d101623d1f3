//! The GGUF container (version 3, little-endian, as llama.cpp's `gguf` package writes it): a
//! header of typed key/value pairs and tensor descriptions, then the tensors' data. Only the
//! header is parsed here, from the mapped file; the data stays mapped, read a chunk at a time
//! by the checkpoint. Every count and length in the header is checked against the bytes that
//! are left before anything is allocated for it, so a hostile header cannot ask for more
//! memory than the file's own size.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::quant::GgmlType;
use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"GGUF";
const VERSION: u32 = 3;
/// `general.alignment`'s default.
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;

/// A metadata value, with its GGUF type where the type matters to an error message.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    UInt(u64, &'static str),
    Int(i64, &'static str),
    Float(f64, &'static str),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::UInt(_, t) | Value::Int(_, t) | Value::Float(_, t) => t,
            Value::Bool(_) => "bool",
            Value::Str(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// Its type and, for a scalar, its value, as a message names what it found: `u32 0`,
    /// `f32 4`, `string "x"`, `array of 3`.
    pub fn described(&self) -> String {
        match self {
            Value::UInt(v, t) => format!("{t} {v}"),
            Value::Int(v, t) => format!("{t} {v}"),
            Value::Float(v, t) => format!("{t} {v:?}"),
            Value::Bool(b) => format!("bool {b}"),
            Value::Str(s) => format!("string {s:?}"),
            Value::Array(a) => format!("array of {}", a.len()),
        }
    }

    /// The value as a non-negative integer, whatever integer type holds it.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::UInt(v, _) => Some(v),
            Value::Int(v, _) => u64::try_from(v).ok(),
            _ => None,
        }
    }
}

/// One tensor's description: name, dimensions (`ne`, innermost first, as ggml orders them),
/// element type, and where its bytes are in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute offset of the data in the file.
    pub start: u64,
    pub nbytes: u64,
}

impl TensorInfo {
    /// The shape in row-major order (outermost first), as the checkpoint names shapes.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&n| n as usize).collect()
    }
}

/// One parsed GGUF file: its metadata and tensor descriptions, and the open file.
pub struct GgufFile {
    pub path: PathBuf,
    pub file: File,
    pub kvs: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
}

/// A header reader over the mapped file, naming `what` it is reading in its errors.
struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, what: &str, msg: impl Into<String>) -> Error {
        Error::Gguf { path: self.path.to_path_buf(), what: what.to_string(), msg: msg.into() }
    }

    fn left(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(what, format!("truncated: needs {n} bytes at offset {}, the file has {} left", self.at, self.left())));
        }
        let s = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }

    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }

    /// A count of items of at least `min_size` bytes each, refused when the rest of the file
    /// cannot hold that many.
    fn count(&mut self, what: &str, min_size: usize) -> Result<usize> {
        let n = self.u64(what)?;
        let most = (self.left() / min_size.max(1)) as u64;
        if n > most {
            return Err(self.err(what, format!("count {n} is more than the {} bytes left can hold (a truncated or corrupt file)", self.left())));
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> Result<String> {
        let n = self.count(what, 1)?;
        let raw = self.take(n, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| self.err(what, "a string is not valid UTF-8"))
    }

    fn value(&mut self, ty: u32, what: &str, in_array: bool) -> Result<Value> {
        Ok(match ty {
            0 => Value::UInt(self.take(1, what)?[0] as u64, "u8"),
            1 => Value::Int(self.take(1, what)?[0] as i8 as i64, "i8"),
            2 => Value::UInt(u16::from_le_bytes(self.take(2, what)?.try_into().expect("2")) as u64, "u16"),
            3 => Value::Int(i16::from_le_bytes(self.take(2, what)?.try_into().expect("2")) as i64, "i16"),
            4 => Value::UInt(self.u32(what)? as u64, "u32"),
            5 => Value::Int(self.u32(what)? as i32 as i64, "i32"),
            6 => Value::Float(f32::from_bits(self.u32(what)?) as f64, "f32"),
            7 => match self.take(1, what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.err(what, format!("a bool holds {b}, not 0 or 1"))),
            },
            8 => Value::Str(self.string(what)?),
            9 if in_array => return Err(self.err(what, "an array of arrays (nested arrays are not read)")),
            9 => {
                let elem = self.u32(what)?;
                let min = match elem {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    _ => 8,
                };
                let n = self.count(what, min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem, what, true)?);
                }
                Value::Array(items)
            }
            10 => Value::UInt(self.u64(what)?, "u64"),
            11 => Value::Int(self.u64(what)? as i64, "i64"),
            12 => Value::Float(f64::from_bits(self.u64(what)?), "f64"),
            other => return Err(self.err(what, format!("unknown value type {other}"))),
        })
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = llada_ir::files::open_regular(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the file is opened read-only and not expected to change while we compile
        // (as the safetensors checkpoint's map, hf/checkpoint.rs); only the header is read
        // from this map, which is dropped before returning.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let (kvs, tensors) = parse(path, &map)?;
        Ok(GgufFile { path: path.to_path_buf(), file, kvs, tensors })
    }

    /// The architecture, `general.architecture` (only a split's first file has it).
    pub fn architecture(&self) -> Option<&str> {
        match self.kvs.get("general.architecture") {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }
}

/// Parses the header of `bytes` (a whole GGUF file): metadata and tensor descriptions, each
/// tensor's data range checked to lie inside the file, aligned, and apart from the others.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<(BTreeMap<String, Value>, Vec<TensorInfo>)> {
    let mut r = Reader { path, bytes, at: 0 };
    let magic = r.take(4, "header")?;
    if magic != MAGIC {
        return Err(r.err("header", format!("magic {magic:02x?} is not \"GGUF\"; not a GGUF file")));
    }
    let version = r.u32("header")?;
    if version != VERSION {
        let hint = if version.swap_bytes() == VERSION { " (a big-endian file; only little-endian GGUF is read)" } else { " (only version 3, what llama.cpp writes today, is read)" };
        return Err(r.err("header", format!("version {version}{hint}")));
    }
    // Each tensor description takes at least 8 (name length) + 4 + 8 + 4 + 8 bytes; each
    // key/value 8 + 4 + 1.
    let n_tensors = r.count("tensor count", 32)?;
    let n_kv = r.count("key/value count", 13)?;
    let mut kvs = BTreeMap::new();
    for i in 0..n_kv {
        let key = r.string(&format!("key #{i}"))?;
        let ty = r.u32(&key)?;
        let value = r.value(ty, &key, false)?;
        if kvs.insert(key.clone(), value).is_some() {
            return Err(r.err(&key, "appears twice"));
        }
    }
    let alignment = match kvs.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(Value::UInt(a, "u32")) if a.is_power_of_two() => *a,
        Some(v) => return Err(r.err("general.alignment", format!("{} is not a u32 power of two", v.described()))),
    };
    let mut infos = Vec::with_capacity(n_tensors);
    let mut names = std::collections::HashSet::new();
    for i in 0..n_tensors {
        let name = r.string(&format!("tensor info #{i}"))?;
        let n_dims = r.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(r.err(&name, format!("{n_dims} dimensions; a tensor has 1 to {MAX_DIMS}")));
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            ne.push(r.u64(&name)?);
        }
        let ty_id = r.u32(&name)?;
        let offset = r.u64(&name)?;
        let ty = GgmlType::from_id(ty_id).ok_or_else(|| r.err(&name, format!("ggml type {ty_id} is unknown")))?;
        let elements = ne.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n)).filter(|&n| n > 0);
        let Some(elements) = elements else {
            return Err(r.err(&name, format!("dimensions {ne:?} hold no elements or overflow")));
        };
        if ne[0] % ty.block_elements() != 0 {
            return Err(r.err(&name, format!("its rows of {} elements are not whole {} blocks of {}", ne[0], ty.name(), ty.block_elements())));
        }
        let nbytes = (elements / ty.block_elements()).checked_mul(ty.block_bytes()).ok_or_else(|| r.err(&name, "its size overflows"))?;
        if offset % alignment != 0 {
            return Err(r.err(&name, format!("data offset {offset} is not a multiple of the alignment {alignment}")));
        }
        if !names.insert(name.clone()) {
            return Err(r.err(&name, "two tensors have this name"));
        }
        infos.push(TensorInfo { name, ne, ty, start: offset, nbytes });
    }
    let data_start = (r.at as u64).div_ceil(alignment) * alignment;
    for t in &mut infos {
        t.start = t.start.checked_add(data_start).ok_or_else(|| r.err(&t.name, "its data offset overflows"))?;
        let end = t.start.checked_add(t.nbytes);
        if end.is_none_or(|e| e > bytes.len() as u64) {
            return Err(r.err(&t.name, format!("truncated: its {} bytes at offset {} run past the file's end ({} bytes)", t.nbytes, t.start, bytes.len())));
        }
    }
    let mut by_start: Vec<&TensorInfo> = infos.iter().collect();
    by_start.sort_by_key(|t| t.start);
    for pair in by_start.windows(2) {
        if pair[0].start + pair[0].nbytes > pair[1].start {
            return Err(r.err(&pair[1].name, format!("its data overlaps tensor '{}'", pair[0].name)));
        }
    }
    Ok((kvs, infos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Vec<u8> {
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/gguf/tiny-llada-A.f32.gguf")).unwrap()
    }

    /// Every prefix of a real file (cut inside the header and its first tensor's data) is
    /// refused with an error naming the file and a part, and never panics or over-allocates.
    #[test]
    fn every_truncation_is_refused_naming_the_part() {
        let file = fixture();
        let path = Path::new("x.gguf");
        assert!(parse(path, &file).is_ok());
        for len in (0..9400).chain([file.len() - 1]) {
            let msg = parse(path, &file[..len]).err().unwrap_or_else(|| panic!("prefix {len} accepted")).to_string();
            assert!(msg.starts_with("x.gguf: ") && msg.contains("truncated"), "prefix {len}: {msg}");
        }
    }

    /// A count past what the file holds is refused before anything is allocated for it.
    #[test]
    fn hostile_counts_are_refused() {
        let mut file = fixture();
        file[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let msg = parse(Path::new("x.gguf"), &file).unwrap_err().to_string();
        assert!(msg.contains("tensor count") && msg.contains("more than"), "{msg}");
        let mut file = fixture();
        // The first key's length.
        file[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
        let msg = parse(Path::new("x.gguf"), &file).unwrap_err().to_string();
        assert!(msg.contains("key #0") && msg.contains("more than"), "{msg}");
    }

    /// The reader's view of the fixture matches what llama.cpp's `gguf` package's
    /// `GGUFReader` reports for it (tools/gguf/make_fixtures.py writes that dump).
    #[test]
    fn the_header_matches_gguf_py() {
        let file = fixture();
        let (kvs, tensors) = parse(Path::new("x.gguf"), &file).unwrap();
        let dump: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/gguf/tiny-llada-A.dump.json")).unwrap()).unwrap();
        let keys: Vec<&str> = dump["kvs"].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(kvs.keys().map(String::as_str).collect::<Vec<_>>(), keys);
        for (k, want) in dump["kvs"].as_object().unwrap() {
            let got = match &kvs[k] {
                Value::UInt(v, _) => serde_json::json!(v),
                Value::Int(v, _) => serde_json::json!(v),
                Value::Float(v, _) => serde_json::json!(v),
                Value::Bool(b) => serde_json::json!(b),
                Value::Str(s) => serde_json::json!(s),
                Value::Array(items) => serde_json::json!(items.len()),
            };
            assert_eq!(&got, want, "{k}");
        }
        let infos = dump["tensors"].as_array().unwrap();
        assert_eq!(tensors.len(), infos.len());
        for (t, d) in tensors.iter().zip(infos) {
            assert_eq!(serde_json::json!([t.name, t.ne, t.ty.name(), t.start, t.nbytes]), *d);
        }
    }
}
