//! Streaming artifact writer. Tensors go to disk as they are produced (the compiler never
//! holds a whole checkpoint in memory); the header follows them. Everything is written to a
//! new file beside the destination that gets its name only in [`ArtifactWriter::finish`]
//! ([`AtomicFile`]), so a compile that fails or is interrupted leaves no partial artifact
//! behind, and the destination is never a device, a FIFO or a file the compile reads.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::files::AtomicFile;
use crate::format::{align_up, Preamble, FORMAT_MAJOR, FORMAT_MINOR, SEGMENT_ALIGN, TENSOR_ALIGN};
use crate::graph::TensorId;
use crate::header::{Header, Segment, TensorInfo};
use crate::packing::DType;

struct OpenTensor {
    info: TensorInfo,
    hasher: crc32fast::Hasher,
    written: u64,
}

pub struct ArtifactWriter {
    path: PathBuf,
    tmp: AtomicFile,
    out: BufWriter<File>,
    /// Absolute position in the file.
    pos: u64,
    tensors: Vec<TensorInfo>,
    segments: Vec<Segment>,
    open_segment: Option<(String, u64)>,
    open_tensor: Option<OpenTensor>,
}

const DATA_OFFSET: u64 = SEGMENT_ALIGN;

impl ArtifactWriter {
    /// Starts an artifact that will appear at `path` once [`finish`](Self::finish) succeeds.
    /// `reads` are the files (or folders of files) the compile reads, which `path` must not be.
    pub fn create(path: &Path, reads: &[&Path]) -> Result<Self> {
        let ctx = |what: &str| format!("{}: {what}", path.display());
        let mut tmp = AtomicFile::create(path, reads).map_err(|e| Error::io(ctx("cannot write the artifact there"), e))?;
        let file = tmp.file().try_clone().map_err(|e| Error::io(ctx("cannot open the new file"), e))?;
        let mut w = ArtifactWriter {
            path: path.to_path_buf(),
            tmp,
            out: BufWriter::with_capacity(1 << 20, file),
            pos: 0,
            tensors: Vec::new(),
            segments: Vec::new(),
            open_segment: None,
            open_tensor: None,
        };
        w.pad_to(DATA_OFFSET)?;
        Ok(w)
    }

    fn io_err(&self, e: std::io::Error) -> Error {
        Error::io(format!("{}: writing the artifact", self.path.display()), e)
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes).map_err(|e| self.io_err(e))?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, target: u64) -> Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.pos < target {
            let n = ((target - self.pos) as usize).min(ZEROS.len());
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }

    /// Opens a page-aligned segment; tensors added until [`end_segment`](Self::end_segment)
    /// belong to it.
    pub fn begin_segment(&mut self, name: &str) -> Result<()> {
        assert!(self.open_segment.is_none(), "segment '{name}' opened inside another segment");
        self.pad_to(align_up(self.pos, SEGMENT_ALIGN))?;
        self.open_segment = Some((name.to_string(), self.pos));
        Ok(())
    }

    pub fn end_segment(&mut self) -> Result<()> {
        assert!(self.open_tensor.is_none(), "segment closed with a tensor still open");
        let (name, start) = self.open_segment.take().expect("end_segment without begin_segment");
        self.segments.push(Segment { name, offset: start - DATA_OFFSET, nbytes: self.pos - start });
        Ok(())
    }

    /// A segment of opaque bytes (a backend's executable), outside any tensor; returns its index.
    pub fn add_raw_segment(&mut self, name: &str, bytes: &[u8]) -> Result<u32> {
        self.begin_segment(name)?;
        self.put(bytes)?;
        self.end_segment()?;
        Ok(self.segments.len() as u32 - 1)
    }

    /// Opens a tensor; its bytes follow through [`write`](Self::write).
    pub fn begin_tensor(&mut self, name: &str, dtype: DType, shape: &[u64]) -> Result<TensorId> {
        assert!(self.open_segment.is_some(), "tensor '{name}' written outside a segment");
        assert!(self.open_tensor.is_none(), "tensor '{name}' opened inside another tensor");
        self.pad_to(align_up(self.pos, TENSOR_ALIGN))?;
        let nbytes = dtype.nbytes(shape).unwrap_or_else(|| panic!("tensor '{name}': {} cannot hold shape {shape:?}", dtype.name()));
        self.open_tensor = Some(OpenTensor {
            info: TensorInfo { name: name.to_string(), dtype, shape: shape.to_vec(), offset: self.pos - DATA_OFFSET, nbytes, crc32: 0 },
            hasher: crc32fast::Hasher::new(),
            written: 0,
        });
        Ok(self.tensors.len() as TensorId)
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let t = self.open_tensor.as_mut().expect("write without begin_tensor");
        t.hasher.update(bytes);
        t.written += bytes.len() as u64;
        assert!(t.written <= t.info.nbytes, "tensor '{}' got more bytes than its shape holds", t.info.name);
        self.put(bytes)
    }

    pub fn end_tensor(&mut self) -> Result<TensorId> {
        let t = self.open_tensor.take().expect("end_tensor without begin_tensor");
        assert_eq!(t.written, t.info.nbytes, "tensor '{}' got fewer bytes than its shape holds", t.info.name);
        let mut info = t.info;
        info.crc32 = t.hasher.finalize();
        self.tensors.push(info);
        Ok(self.tensors.len() as TensorId - 1)
    }

    /// A whole small tensor at once.
    pub fn add_tensor(&mut self, name: &str, dtype: DType, shape: &[u64], bytes: &[u8]) -> Result<TensorId> {
        self.begin_tensor(name, dtype, shape)?;
        self.write(bytes)?;
        self.end_tensor()
    }

    /// Tensors written so far, in id order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Verifies the header (its tensor table and segments are the ones recorded here), writes
    /// it and the preamble, syncs, and renames the file into place.
    pub fn finish(mut self, mut header: Header) -> Result<u64> {
        assert!(self.open_segment.is_none() && self.open_tensor.is_none(), "finish with an open segment or tensor");
        header.tensors = std::mem::take(&mut self.tensors);
        header.segments = std::mem::take(&mut self.segments);
        let data_len = self.pos - DATA_OFFSET;
        crate::verify::header(&header, data_len)?;
        let bytes = crate::sections::encode(&header)?;
        let header_offset = self.pos;
        self.put(&bytes)?;
        let preamble = Preamble {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            data_offset: DATA_OFFSET,
            data_len,
            header_offset,
            header_len: bytes.len() as u64,
            header_crc32: crc32fast::hash(&bytes),
        };
        let total = self.pos;
        self.out.flush().map_err(|e| self.io_err(e))?;
        let file = self.out.get_mut();
        file.seek(SeekFrom::Start(0)).map_err(|e| Error::io("seeking to the preamble", e))?;
        file.write_all(&preamble.encode()).map_err(|e| Error::io("writing the preamble", e))?;
        let path = self.path.clone();
        self.tmp.commit().map_err(|e| Error::io(format!("{}: cannot sync the artifact or move it into place", path.display()), e))?;
        Ok(total)
    }
}
