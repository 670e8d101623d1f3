//! The safetensors weights of a Hugging Face checkpoint: one `model.safetensors`, or shards
//! listed in `model.safetensors.index.json`. Only headers are read up front; tensor bytes are
//! mapped a chunk at a time and unmapped after use, so compiling never holds the checkpoint
//! (or even one large tensor) in memory. Other importers (ONNX) hand over their weights in
//! memory under the checkpoint's names, so everything after the import is shared.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, FileError, Result};
use crate::gguf::quant::{first_non_finite_block, GgmlType};

/// Element types the importers read: floats, or a GGUF's ggml blocks (decoded exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceDType {
    F32,
    Bf16,
    F16,
    /// Blocks of a ggml quantized type, whole blocks per row.
    Block(GgmlType),
}

impl SourceDType {
    /// Bytes of a unit the checks count in: an element, or a block.
    pub fn size_bytes(self) -> usize {
        match self {
            SourceDType::F32 => 4,
            SourceDType::Bf16 | SourceDType::F16 => 2,
            SourceDType::Block(t) => t.block_bytes() as usize,
        }
    }

    /// Elements in `bytes` of this type.
    pub fn elements(self, bytes: usize) -> usize {
        match self {
            SourceDType::Block(t) => bytes / t.block_bytes() as usize * t.block_elements() as usize,
            _ => bytes / self.size_bytes(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SourceDType::F32 => "f32",
            SourceDType::Bf16 => "bf16",
            SourceDType::F16 => "f16",
            SourceDType::Block(t) => t.name(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct TensorLocation {
    pub shard: usize,
    pub dtype: SourceDType,
    pub shape: Vec<usize>,
    /// Absolute byte offset of the tensor's data in its shard file.
    pub start: u64,
    pub nbytes: u64,
    /// Rows read in this order (of the stored rows) rather than as stored: a GGUF's LLaDA
    /// q/k projections, whose rows llama.cpp's converter reorders.
    pub row_order: Option<Arc<[u32]>>,
}

impl TensorLocation {
    /// Rows `rows` (along dimension 0) of this tensor, as a location of their own.
    pub fn rows(&self, rows: std::ops::Range<usize>) -> TensorLocation {
        let total = self.shape.first().copied().unwrap_or(1).max(1);
        let row_bytes = self.nbytes / total as u64;
        let mut shape = self.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = rows.len();
        }
        match &self.row_order {
            Some(order) => TensorLocation { shape, row_order: Some(order[rows].into()), ..self.clone() },
            None => TensorLocation { shard: self.shard, dtype: self.dtype, shape, start: self.start + rows.start as u64 * row_bytes, nbytes: rows.len() as u64 * row_bytes, row_order: None },
        }
    }
}

pub struct Checkpoint {
    pub dir: PathBuf,
    shards: Vec<(PathBuf, Shard)>,
    tensors: BTreeMap<String, TensorLocation>,
}

/// Where a shard's bytes are: a safetensors file mapped on demand, or a buffer an importer
/// filled (its tensors' `start` offsets index the buffer).
enum Shard {
    File(File),
    Memory(Vec<u8>),
}

/// One tensor handed over in memory: name (the checkpoint's), dtype, shape, little-endian bytes.
pub struct MemoryTensor {
    pub name: String,
    pub dtype: SourceDType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

/// One path component that is a name: not empty, `.` or `..`, no separator.
fn is_plain_file_name(f: &str) -> bool {
    let mut parts = Path::new(f).components();
    matches!((parts.next(), parts.next()), (Some(std::path::Component::Normal(n)), None) if n == f) && !f.contains(['/', '\\'])
}

impl Checkpoint {
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let index_path = dir.join(INDEX);
        let mut ckpt = Checkpoint { dir: dir.to_path_buf(), shards: Vec::new(), tensors: BTreeMap::new() };
        // Both: one is left over from an earlier checkpoint written here, and which is the
        // model's cannot be told (Hugging Face would read the single file, a sharded save
        // leaves the index).
        if index_path.exists() && dir.join(SINGLE).exists() {
            return Err(Error::Options(format!(
                "{}: holds both {SINGLE} and {INDEX}, two sets of weights; a checkpoint has one of them. Remove the one left over from an earlier checkpoint (and its shards)",
                dir.display()
            )));
        }
        if index_path.exists() {
            let text = llada_ir::files::read_text_bounded(&index_path, llada_ir::files::CONFIG_LIMIT).map_err(|e| Error::io(&index_path, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::Json { path: index_path.clone(), msg: e.to_string() })?;
            // The JSON parsed; what follows is wrong in what it says, not in how.
            let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| Error::config(&index_path, "weight_map", "missing, or not an object"))?;
            let mut files: Vec<&str> = Vec::with_capacity(map.len());
            for (name, v) in map {
                let f = v.as_str().ok_or_else(|| Error::config(&index_path, &format!("weight_map[\"{name}\"]"), "is not a file name"))?;
                // A shard is a file beside the index: a path (`../x`, `/etc/x`, `a/b`) would
                // read outside the checkpoint directory.
                if !is_plain_file_name(f) {
                    return Err(Error::config(&index_path, &format!("weight_map[\"{name}\"]"), format!("names shard \"{f}\", which is not a plain file name in this directory")));
                }
                files.push(f);
            }
            files.sort();
            files.dedup();
            for f in files {
                ckpt.add_shard(&dir.join(f))?;
            }
            for (name, file) in map {
                let file = file.as_str().unwrap_or_default();
                match ckpt.tensors.get(name) {
                    Some(loc) if ckpt.shards[loc.shard].0.file_name().is_some_and(|n| n == file) => {}
                    _ => {
                        return Err(Error::MissingTensor {
                            path: dir.join(file),
                            name: name.clone(),
                            hint: format!(" (listed in {INDEX})"),
                        })
                    }
                }
            }
        } else {
            let single = dir.join(SINGLE);
            if !dir.is_dir() {
                return Err(Error::File(FileError::NotFound { path: dir.to_path_buf() }));
            }
            if !single.exists() {
                return Err(Error::Options(format!(
                    "{}: neither {SINGLE} nor {INDEX} is present; is this a Hugging Face checkpoint directory?",
                    dir.display()
                )));
            }
            ckpt.add_shard(&single)?;
        }
        Ok(ckpt)
    }

    /// A checkpoint whose tensors an importer read from `source` (named in errors).
    pub fn from_memory(dir: &Path, source: &Path, tensors: Vec<MemoryTensor>) -> Checkpoint {
        // Each tensor its own in-memory shard: its bytes move in, never copied again.
        let mut ckpt = Checkpoint { dir: dir.to_path_buf(), shards: Vec::new(), tensors: BTreeMap::new() };
        for t in tensors {
            let loc = TensorLocation { shard: ckpt.shards.len(), dtype: t.dtype, shape: t.shape, start: 0, nbytes: t.bytes.len() as u64, row_order: None };
            ckpt.tensors.insert(t.name, loc);
            ckpt.shards.push((source.to_path_buf(), Shard::Memory(t.bytes)));
        }
        ckpt
    }

    /// A checkpoint over GGUF files (`files`, opened), whose tensors `tensors` name under the
    /// checkpoint's names with `shard` indexing `files`.
    pub fn from_files(dir: &Path, files: Vec<(PathBuf, File)>, tensors: BTreeMap<String, TensorLocation>) -> Checkpoint {
        Checkpoint { dir: dir.to_path_buf(), shards: files.into_iter().map(|(p, f)| (p, Shard::File(f))).collect(), tensors }
    }

    fn add_shard(&mut self, path: &Path) -> Result<()> {
        let file = llada_ir::files::open_regular(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the checkpoint is opened read-only and is not expected to change while we
        // compile; a concurrent writer could at worst give us wrong bytes, which the artifact's
        // checksums then faithfully record. Only the header pages are touched here.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let bad = |msg: String| Error::Safetensors { path: path.to_path_buf(), msg };
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| match e {
            safetensors::SafeTensorError::InvalidHeaderLength => bad(format!("truncated: the header's length runs past the file's {} bytes", map.len())),
            // A dtype safetensors does not know fails the whole header: name its tensor.
            e => match (unknown_dtype(&map), layout_problem(&map)) {
                (Some((name, dtype)), _) => Error::TensorDType { path: path.to_path_buf(), name, dtype },
                // safetensors names no tensor, or the one after a gap: say which and how.
                (None, Some(problem)) => bad(problem),
                (None, None) => bad(e.to_string()),
            },
        })?;
        let data_start = 8 + n as u64;
        let shard = self.shards.len();
        for (name, info) in meta.tensors() {
            let dtype = match info.dtype {
                Dtype::F32 => SourceDType::F32,
                Dtype::BF16 => SourceDType::Bf16,
                Dtype::F16 => SourceDType::F16,
                other => return Err(Error::TensorDType { path: path.to_path_buf(), name, dtype: format!("{other:?}") }),
            };
            let loc = TensorLocation {
                shard,
                dtype,
                shape: info.shape.clone(),
                start: data_start + info.data_offsets.0 as u64,
                nbytes: (info.data_offsets.1 - info.data_offsets.0) as u64,
                row_order: None,
            };
            if self.tensors.insert(name.clone(), loc).is_some() {
                return Err(bad(format!("tensor '{name}' also appears in another shard")));
            }
        }
        self.shards.push((path.to_path_buf(), Shard::File(file)));
        Ok(())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn shard_path(&self, shard: usize) -> &Path {
        &self.shards[shard].0
    }

    /// The location of a tensor, checked against the expected shape.
    pub fn expect(&self, name: &str, shape: &[usize], why: &str) -> Result<&TensorLocation> {
        let loc = self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            path: self.dir.clone(),
            name: name.to_string(),
            hint: String::new(),
        })?;
        if loc.shape != shape {
            return Err(Error::TensorShape {
                path: self.shards[loc.shard].0.clone(),
                name: name.to_string(),
                found: loc.shape.clone(),
                expected: shape.to_vec(),
                why: why.to_string(),
            });
        }
        Ok(loc)
    }

    /// The checkpoint's name of the tensor at `loc`.
    pub fn name_of(&self, loc: &TensorLocation) -> &str {
        // A tensor or rows of one (a permuted head's).
        let same = |l: &TensorLocation| l.shard == loc.shard && l.start <= loc.start && loc.start + loc.nbytes <= l.start + l.nbytes;
        self.tensors.iter().find(|(_, l)| same(l)).map_or("?", |(name, _)| name.as_str())
    }

    /// Calls `f` with the raw little-endian bytes of whole rows (dimension 0) of a tensor, a
    /// chunk of at most about `max_chunk_bytes` at a time, each chunk mapped only while `f`
    /// runs. Each chunk is checked as it passes (the weights are read once): a NaN or an
    /// infinity is refused, naming the tensor and the element.
    pub fn for_each_row_chunk(
        &self,
        loc: &TensorLocation,
        max_chunk_bytes: usize,
        mut f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut seen = 0usize;
        let mut f = |raw: &[u8]| -> Result<()> {
            if let Some(i) = first_non_finite(loc.dtype, raw) {
                return Err(self.non_finite(loc, raw, i, seen + i));
            }
            seen += raw.len() / loc.dtype.size_bytes();
            f(raw)
        };
        if let Some(order) = &loc.row_order {
            return self.for_each_gathered_chunk(loc, order, max_chunk_bytes, f);
        }
        let rows = loc.shape.first().copied().unwrap_or(1).max(1) as u64;
        let row_bytes = loc.nbytes / rows;
        let rows_per_chunk = (max_chunk_bytes as u64 / row_bytes.max(1)).max(1);
        let (path, shard) = &self.shards[loc.shard];
        let file = match shard {
            Shard::File(file) => file,
            Shard::Memory(blob) => {
                let bytes = &blob[loc.start as usize..(loc.start + loc.nbytes) as usize];
                let chunk = (rows_per_chunk * row_bytes).max(1) as usize;
                if bytes.is_empty() {
                    return f(&[]);
                }
                return bytes.chunks(chunk).try_for_each(f);
            }
        };
        let mut row = 0;
        while row < rows {
            let n = rows_per_chunk.min(rows - row);
            let len = (n * row_bytes) as usize;
            if len == 0 {
                f(&[])?;
                break;
            }
            // SAFETY: as in `add_shard`: a read-only map of a file we only read. The map
            // is dropped at the end of this iteration, which returns its pages.
            let map = unsafe { MmapOptions::new().offset(loc.start + row * row_bytes).len(len).map(file) }
                .map_err(|e| Error::io(path, e))?;
            f(&map)?;
            row += n;
        }
        Ok(())
    }
}

impl Checkpoint {
    /// [`Checkpoint::for_each_row_chunk`] of a tensor read in `order`: the stored rows mapped
    /// once, each chunk gathered into a buffer.
    fn for_each_gathered_chunk(&self, loc: &TensorLocation, order: &[u32], max_chunk_bytes: usize, mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let rows = order.len().max(1);
        let row_bytes = (loc.nbytes / rows as u64) as usize;
        let (path, shard) = &self.shards[loc.shard];
        let map;
        let bytes: &[u8] = match shard {
            Shard::Memory(blob) => &blob[loc.start as usize..(loc.start + loc.nbytes) as usize],
            Shard::File(file) => {
                // SAFETY: as in `add_shard`: a read-only map of a file we only read, dropped on return.
                map = unsafe { MmapOptions::new().offset(loc.start).len(loc.nbytes as usize).map(file) }.map_err(|e| Error::io(path, e))?;
                &map
            }
        };
        let rows_per_chunk = (max_chunk_bytes / row_bytes.max(1)).max(1);
        let mut buf = Vec::with_capacity(rows_per_chunk * row_bytes);
        for chunk in order.chunks(rows_per_chunk) {
            buf.clear();
            for &r in chunk {
                let r = r as usize;
                let row = bytes.get(r * row_bytes..(r + 1) * row_bytes).ok_or_else(|| Error::Options(format!("{}: tensor '{}': row {r} is outside it", path.display(), self.name_of(loc))))?;
                buf.extend_from_slice(row);
            }
            f(&buf)?;
        }
        Ok(())
    }
}

/// The first tensor of a safetensors file's header (`file`, its first bytes) whose dtype is
/// none of safetensors' own, with that dtype: the name a header that fails to parse as a
/// whole leaves out.
/// What is wrong with where a safetensors header puts its tensors, naming them: a byte range
/// that does not fit the tensor's shape and type, a gap or an overlap between two tensors, or
/// data after the last one or missing from the file. `None` where the header cannot be read
/// that far, or nothing of these is wrong.
fn layout_problem(file: &[u8]) -> Option<String> {
    let len = usize::try_from(u64::from_le_bytes(file.get(..8)?.try_into().ok()?)).ok()?;
    let header_end = 8usize.checked_add(len)?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(file.get(8..header_end)?).ok()?;
    let mut spans: Vec<(u64, u64, &str)> = Vec::new();
    for (name, info) in header.iter().filter(|(name, _)| name.as_str() != "__metadata__") {
        let dtype: Dtype = serde_json::from_value(info.get("dtype")?.clone()).ok()?;
        let shape: Vec<u64> = serde_json::from_value(info.get("shape")?.clone()).ok()?;
        let (start, end): (u64, u64) = serde_json::from_value(info.get("data_offsets")?.clone()).ok()?;
        let bits = shape.iter().try_fold(dtype.bitsize() as u64, |n, &d| n.checked_mul(d));
        let wanted = bits.map(|b| b.div_ceil(8));
        if end < start || Some(end - start) != wanted {
            let wanted = wanted.map_or("more than 2^64".to_string(), |w| w.to_string());
            return Some(format!("tensor '{name}': data_offsets [{start}, {end}] span {} bytes, but its shape {shape:?} of {dtype} takes {wanted}", end.saturating_sub(start)));
        }
        spans.push((start, end, name));
    }
    spans.sort_unstable();
    let mut covered = 0u64;
    let mut previous = "the start of the data".to_string();
    for &(start, end, name) in &spans {
        if start > covered {
            return Some(format!("bytes {covered}..{start} of the data belong to no tensor (between {previous} and '{name}')"));
        }
        if start < covered {
            return Some(format!("tensor '{name}' (bytes {start}..{end} of the data) overlaps {previous}"));
        }
        covered = end;
        previous = format!("'{name}'");
    }
    let held = (file.len() - header_end) as u64;
    if covered != held {
        let how = if covered > held { "the file is truncated" } else { "the rest belongs to no tensor" };
        return Some(format!("the tensors take {covered} bytes of data, but the file holds {held} after the header: {how}"));
    }
    None
}

fn unknown_dtype(file: &[u8]) -> Option<(String, String)> {
    let len = usize::try_from(u64::from_le_bytes(file.get(..8)?.try_into().ok()?)).ok()?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(file.get(8..8usize.checked_add(len)?)?).ok()?;
    header.iter().filter(|(name, _)| name.as_str() != "__metadata__").find_map(|(name, info)| {
        let dtype = info.get("dtype")?;
        let known = serde_json::from_value::<Dtype>(dtype.clone()).is_ok();
        (!known).then(|| (name.clone(), dtype.as_str().map_or_else(|| dtype.to_string(), str::to_string)))
    })
}

impl Checkpoint {
    /// The error for element `i` of chunk `raw`, element `flat` of the tensor at `loc`.
    fn non_finite(&self, loc: &TensorLocation, raw: &[u8], i: usize, flat: usize) -> Error {
        let n = loc.dtype.size_bytes();
        let bytes = &raw[i * n..(i + 1) * n];
        if let SourceDType::Block(t) = loc.dtype {
            return Error::NonFinite {
                path: self.shards[loc.shard].0.clone(),
                name: self.name_of(loc).to_string(),
                value: "a NaN or infinite scale".into(),
                index: format!("{} block {flat} (elements {}..{})", t.name(), flat as u64 * t.block_elements(), (flat as u64 + 1) * t.block_elements()),
            };
        }
        let value = match loc.dtype {
            SourceDType::F32 => f32::from_le_bytes(bytes.try_into().expect("4 bytes")),
            SourceDType::Bf16 => half::bf16::from_le_bytes(bytes.try_into().expect("2 bytes")).to_f32(),
            SourceDType::F16 => half::f16::from_le_bytes(bytes.try_into().expect("2 bytes")).to_f32(),
            SourceDType::Block(_) => unreachable!("returned above"),
        };
        // The element's place in each dimension, last dimension fastest.
        let mut rest = flat;
        let mut place: Vec<usize> = loc.shape.iter().rev().map(|&d| { let p = rest % d.max(1); rest /= d.max(1); p }).collect();
        place.reverse();
        let place: Vec<String> = place.iter().map(usize::to_string).collect();
        Error::NonFinite {
            path: self.shards[loc.shard].0.clone(),
            name: self.name_of(loc).to_string(),
            value: value.to_string(),
            index: format!("[{}] (flat index {flat})", place.join(", ")),
        }
    }
}

/// The index of the first element of `raw` (little-endian elements of `dtype`; for ggml
/// blocks, the first block whose scale is) that is NaN or infinite: all its exponent bits set. A block at a time without branches (which vectorises),
/// then the block with a hit element by element.
pub fn first_non_finite(dtype: SourceDType, raw: &[u8]) -> Option<usize> {
    fn find<const N: usize>(raw: &[u8], exponent: u32) -> Option<usize> {
        const BLOCK: usize = 1024;
        let bits = |c: &[u8]| if N == 4 { u32::from_le_bytes([c[0], c[1], c[2], c[3]]) } else { u16::from_le_bytes([c[0], c[1]]) as u32 };
        let bad = |c: &[u8]| bits(c) & exponent == exponent;
        raw.chunks(BLOCK * N).enumerate().find_map(|(b, block)| {
            let any = block.chunks_exact(N).fold(false, |any, c| any | bad(c));
            any.then(|| block.chunks_exact(N).position(bad).map(|i| b * BLOCK + i)).flatten()
        })
    }
    match dtype {
        SourceDType::F32 => find::<4>(raw, 0x7f80_0000),
        SourceDType::Bf16 => find::<2>(raw, 0x7f80),
        SourceDType::F16 => find::<2>(raw, 0x7c00),
        SourceDType::Block(t) => first_non_finite_block(t, raw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_elements_are_found_in_every_source_type() {
        let n = 3000;
        for at in [0, 1, 1023, 1024, 2999] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let mut v = vec![1.5f32; n];
                v[at] = bad;
                let f32s: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let bf16s: Vec<u8> = v.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect();
                let f16s: Vec<u8> = v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
                assert_eq!(first_non_finite(SourceDType::F32, &f32s), Some(at));
                assert_eq!(first_non_finite(SourceDType::Bf16, &bf16s), Some(at));
                assert_eq!(first_non_finite(SourceDType::F16, &f16s), Some(at));
            }
        }
        // The largest finite values, subnormals and zeros pass.
        let fine = [f32::MAX, -f32::MAX, f32::MIN_POSITIVE / 2.0, 0.0, -0.0];
        assert_eq!(first_non_finite(SourceDType::F32, &fine.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()), None);
        let halves = [half::f16::MAX, half::f16::MIN, half::f16::from_f32(6e-8)];
        assert_eq!(first_non_finite(SourceDType::F16, &halves.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()), None);
        assert_eq!(first_non_finite(SourceDType::Bf16, &half::bf16::MAX.to_le_bytes()), None);
    }

    #[test]
    fn shard_names_must_be_plain_file_names() {
        for ok in ["model-00001-of-00002.safetensors", "a.b", "..x"] {
            assert!(is_plain_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../x.safetensors", "/etc/passwd", "sub/x.safetensors", "a\\b", "./x"] {
            assert!(!is_plain_file_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_single_file_beside_a_shard_index_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(INDEX), r#"{"weight_map": {}}"#).unwrap();
        std::fs::write(dir.path().join(SINGLE), b"").unwrap();
        let err = Checkpoint::open(dir.path()).err().expect("refused").to_string();
        assert!(err.contains(INDEX) && err.contains(SINGLE), "{err}");
    }

    /// An index naming a shard outside the directory is refused before anything is opened.
    #[test]
    fn an_index_pointing_outside_the_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(INDEX), r#"{"weight_map": {"model.embed": "../outside.safetensors"}}"#).unwrap();
        let err = Checkpoint::open(dir.path()).err().expect("refused").to_string();
        assert!(err.contains(INDEX) && err.contains("model.embed") && err.contains("../outside.safetensors"), "{err}");
    }

    /// A safetensors file of two f32 tensors `a` `[2]` and `b` `[3]` with `offsets` and
    /// `data` bytes of data.
    fn two_tensors(offsets: [[u64; 2]; 2], data: usize) -> Vec<u8> {
        let header = format!(r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":{:?}}},"b":{{"dtype":"F32","shape":[3],"data_offsets":{:?}}}}}"#, offsets[0], offsets[1]);
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.resize(file.len() + data, 0);
        file
    }

    /// What safetensors refuses without a name (or naming the tensor after the fault) is
    /// said naming the tensors and the bytes.
    #[test]
    fn a_broken_layout_names_its_tensors() {
        assert_eq!(layout_problem(&two_tensors([[0, 8], [8, 20]], 20)), None);
        let cases = [
            (two_tensors([[0, 8], [8, 20]], 36), "the tensors take 20 bytes of data, but the file holds 36 after the header: the rest belongs to no tensor"),
            (two_tensors([[0, 8], [8, 20]], 12), "the file is truncated"),
            (two_tensors([[0, 8], [12, 24]], 24), "bytes 8..12 of the data belong to no tensor (between 'a' and 'b')"),
            (two_tensors([[0, 8], [4, 16]], 16), "tensor 'b' (bytes 4..16 of the data) overlaps 'a'"),
            (two_tensors([[0, 6], [6, 18]], 18), "tensor 'a': data_offsets [0, 6] span 6 bytes, but its shape [2] of F32 takes 8"),
        ];
        for (file, want) in cases {
            let got = layout_problem(&file).unwrap_or_default();
            assert!(got.contains(want), "{got}");
        }
    }
}
