//! The safetensors weights of a Hugging Face checkpoint: one `model.safetensors`, or shards
//! listed in `model.safetensors.index.json`. Only headers are read up front; tensor bytes are
//! mapped a chunk at a time and unmapped after use, so compiling never holds the checkpoint
//! (or even one large tensor) in memory. Other importers (ONNX) hand over their weights in
//! memory under the checkpoint's names, so everything after the import is shared.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, MmapOptions};
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// Element types the importer reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceDType {
    F32,
    Bf16,
    F16,
}

impl SourceDType {
    pub fn size_bytes(self) -> usize {
        match self {
            SourceDType::F32 => 4,
            SourceDType::Bf16 | SourceDType::F16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SourceDType::F32 => "f32",
            SourceDType::Bf16 => "bf16",
            SourceDType::F16 => "f16",
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
        if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(|e| Error::io(&index_path, e))?;
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::Json { path: index_path.clone(), msg: e.to_string() })?;
            let map = json.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| Error::Json {
                path: index_path.clone(),
                msg: "no \"weight_map\" object".into(),
            })?;
            let mut files: Vec<&str> = Vec::with_capacity(map.len());
            for (name, v) in map {
                let f = v.as_str().ok_or_else(|| Error::Json { path: index_path.clone(), msg: format!("weight_map[\"{name}\"] is not a file name") })?;
                // A shard is a file beside the index: a path (`../x`, `/etc/x`, `a/b`) would
                // read outside the checkpoint directory.
                if !is_plain_file_name(f) {
                    return Err(Error::Json {
                        path: index_path.clone(),
                        msg: format!("weight_map[\"{name}\"] names shard \"{f}\", which is not a plain file name in this directory"),
                    });
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
                return Err(Error::NotFound { path: dir.to_path_buf() });
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
            let loc = TensorLocation { shard: ckpt.shards.len(), dtype: t.dtype, shape: t.shape, start: 0, nbytes: t.bytes.len() as u64 };
            ckpt.tensors.insert(t.name, loc);
            ckpt.shards.push((source.to_path_buf(), Shard::Memory(t.bytes)));
        }
        ckpt
    }

    fn add_shard(&mut self, path: &Path) -> Result<()> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the checkpoint is opened read-only and is not expected to change while we
        // compile; a concurrent writer could at worst give us wrong bytes, which the artifact's
        // checksums then faithfully record. Only the header pages are touched here.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let bad = |msg: String| Error::Safetensors { path: path.to_path_buf(), msg };
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| match e {
            safetensors::SafeTensorError::MetadataIncompleteBuffer | safetensors::SafeTensorError::InvalidHeaderLength => {
                bad(format!("truncated: the header describes more data than the file's {} bytes", map.len()))
            }
            e => bad(e.to_string()),
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

    /// Calls `f` with the raw little-endian bytes of whole rows (dimension 0) of a tensor, a
    /// chunk of at most about `max_chunk_bytes` at a time, each chunk mapped only while `f`
    /// runs.
    pub fn for_each_row_chunk(
        &self,
        loc: &TensorLocation,
        max_chunk_bytes: usize,
        mut f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_must_be_plain_file_names() {
        for ok in ["model-00001-of-00002.safetensors", "a.b", "..x"] {
            assert!(is_plain_file_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "../x.safetensors", "/etc/passwd", "sub/x.safetensors", "a\\b", "./x"] {
            assert!(!is_plain_file_name(bad), "{bad}");
        }
    }

    /// An index naming a shard outside the directory is refused before anything is opened.
    #[test]
    fn an_index_pointing_outside_the_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(INDEX), r#"{"weight_map": {"model.embed": "../outside.safetensors"}}"#).unwrap();
        let err = Checkpoint::open(dir.path()).err().expect("refused").to_string();
        assert!(err.contains(INDEX) && err.contains("model.embed") && err.contains("../outside.safetensors"), "{err}");
    }
}
