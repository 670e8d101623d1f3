//! Reading an artifact from bytes (normally a memory map). [`Artifact::parse`] checks the
//! preamble, bounds, the header checksum and the whole structure; [`Artifact::verify_data`]
//! checks every tensor checksum and that every gap byte is zero, so any flipped byte in the
//! file is caught before the runtime trusts it.

use crate::error::{Error, Result};
use crate::format::{Preamble, PREAMBLE_LEN};
use crate::graph::TensorId;
use crate::header::Header;
use crate::verify;

pub struct Artifact<'a> {
    pub preamble: Preamble,
    pub header: Header,
    /// The header region's section table.
    pub sections: Vec<crate::sections::SectionEntry>,
    /// The data section.
    data: &'a [u8],
    file: &'a [u8],
}

impl<'a> Artifact<'a> {
    pub fn parse(file: &'a [u8]) -> Result<Self> {
        let p = Preamble::decode(file)?;
        let have = file.len() as u64;
        let data_end = p.data_offset.checked_add(p.data_len).ok_or_else(|| Error::invalid("data section length overflows"))?;
        let header_end =
            p.header_offset.checked_add(p.header_len).ok_or_else(|| Error::invalid("header length overflows"))?;
        if header_end > have {
            return Err(Error::Truncated { what: "the header".into(), need: header_end, have });
        }
        if data_end > have {
            return Err(Error::Truncated { what: "the data section".into(), need: data_end, have });
        }
        // Tensors are cast in place from the mapping (page-aligned): the data section must
        // start on a segment boundary for their alignment to hold.
        if p.data_offset % crate::format::SEGMENT_ALIGN != 0 {
            return Err(Error::invalid(format!("the data section starts at {}, not a multiple of {}", p.data_offset, crate::format::SEGMENT_ALIGN)));
        }
        if p.data_offset < PREAMBLE_LEN as u64 || p.header_offset < data_end {
            return Err(Error::invalid("the preamble places the header inside the data section"));
        }
        if header_end != have {
            return Err(Error::invalid(format!("{} unexpected bytes after the header", have - header_end)));
        }
        let header_bytes = &file[p.header_offset as usize..header_end as usize];
        if crc32fast::hash(header_bytes) != p.header_crc32 {
            return Err(Error::Checksum { what: "the header".into() });
        }
        let (header, sections) = crate::sections::decode(header_bytes)?;
        verify::header(&header, p.data_len)?;
        Ok(Artifact { preamble: p, header, sections, data: &file[p.data_offset as usize..data_end as usize], file })
    }

    /// Checks every tensor's (and backend executable's) CRC-32 and that all bytes outside them (preamble padding,
    /// alignment gaps) are zero.
    pub fn verify_data(&self) -> Result<()> {
        self.verify_data_each(|_, _| {})
    }

    /// [`verify_data`](Self::verify_data), calling `checked(file_offset, len)` after each
    /// tensor (so a loader can release pages it has finished reading).
    pub fn verify_data_each(&self, mut checked: impl FnMut(u64, u64)) -> Result<()> {
        let zero_gap = |bytes: &[u8], what: &str| -> Result<()> {
            if bytes.iter().any(|&b| b != 0) {
                return Err(Error::Checksum { what: what.to_string() });
            }
            Ok(())
        };
        zero_gap(&self.file[PREAMBLE_LEN..self.preamble.data_offset as usize], "the preamble padding")?;
        // Every checksummed span: the tensors, and the backend executables (their CRC-32 in
        // the NPU section, which the header verification already decoded).
        let h = &self.header;
        let mut spans: Vec<(u64, u64, Option<u32>, String)> = h.tensors.iter().map(|t| (t.offset, t.nbytes, Some(t.crc32), format!("tensor '{}'", t.name))).collect();
        match crate::npu::NpuSection::if_readable(h)? {
            Some(npu) => {
                for c in &npu.contexts {
                    let seg = &h.segments[c.segment as usize];
                    spans.push((seg.offset, seg.nbytes, Some(c.crc32), format!("the NPU context binary '{}'", seg.name)));
                }
            }
            // A section this build does not read may own the segments no tensor is in: their
            // checksums are in it, so they go unchecked (nothing here reads them).
            None if h.extensions.iter().any(|e| e.key == crate::npu::EXTENSION_KEY) => {
                for (i, seg) in h.segments.iter().enumerate().filter(|(i, _)| (0..h.tensors.len() as u32).all(|t| h.segment_of(t) != Some(*i as u32))) {
                    spans.push((seg.offset, seg.nbytes, None, format!("segment {i} '{}'", seg.name)));
                }
            }
            None => {}
        }
        spans.sort_by_key(|s| s.0);
        let mut cursor = 0u64;
        for (offset, nbytes, crc, what) in spans {
            zero_gap(&self.data[cursor as usize..offset as usize], &format!("the padding before {what}"))?;
            if crc.is_some_and(|crc| crc32fast::hash(&self.data[offset as usize..(offset + nbytes) as usize]) != crc) {
                return Err(Error::Checksum { what });
            }
            checked(self.preamble.data_offset + offset, nbytes);
            cursor = offset + nbytes;
        }
        zero_gap(&self.data[cursor as usize..], "the padding after the last tensor")
    }

    /// The stored bytes of a tensor. `id` must come from this artifact's header (verified at
    /// parse time to lie inside the data section).
    pub fn tensor_bytes(&self, id: TensorId) -> &'a [u8] {
        let t = &self.header.tensors[id as usize];
        &self.data[t.offset as usize..(t.offset + t.nbytes) as usize]
    }

    pub fn data_section(&self) -> &'a [u8] {
        self.data
    }
}
