//! The file layout.
//!
//! ```text
//! 0      preamble (64 bytes, zero-padded to SEGMENT_ALIGN)
//! 4096   data section: segments (page-aligned), tensors inside them (TENSOR_ALIGN-aligned),
//!        every gap zero-filled
//! ...    header (postcard), right after the data section
//! ```
//! Putting the header last lets the compiler stream tensors to disk and learn their
//! checksums before it writes the table that records them.

use crate::error::{Error, Result};

pub const MAGIC: [u8; 8] = *b"LLADA\0AF";
/// The layout of the preamble and of the section table (`sections.rs`): a reader refuses any
/// other major version. What the sections hold is versioned per section.
pub const FORMAT_MAJOR: u16 = 10;
/// Additions an older reader of the same major version can ignore (see COMPATIBILITY.md).
pub const FORMAT_MINOR: u16 = 0;
pub const PREAMBLE_LEN: usize = 64;
/// Alignment of segments and of the data section: one page, so segments map straight in.
pub const SEGMENT_ALIGN: u64 = 4096;
/// Alignment of every tensor inside a segment.
pub const TENSOR_ALIGN: u64 = 64;
/// Alignment of every value in the window.
pub const WINDOW_ALIGN: u64 = 64;
/// The largest accelerator window an artifact may plan (1 TiB: phone NPU windows are a few
/// GiB, the host's default 16 GiB), so a crafted size cannot make a loader map absurd memory
/// or overflow the arithmetic that places regions in it.
pub const MAX_WINDOW_BYTES: u64 = 1 << 40;
/// The most threads a plan may size its scratch for.
pub const MAX_THREADS: u32 = 1024;

pub fn align_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// The fixed-size record at the start of every artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preamble {
    pub major: u16,
    pub minor: u16,
    pub data_offset: u64,
    pub data_len: u64,
    pub header_offset: u64,
    pub header_len: u64,
    pub header_crc32: u32,
}

impl Preamble {
    pub fn encode(&self) -> [u8; PREAMBLE_LEN] {
        let mut b = [0u8; PREAMBLE_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&self.major.to_le_bytes());
        b[10..12].copy_from_slice(&self.minor.to_le_bytes());
        b[12..16].copy_from_slice(&self.header_crc32.to_le_bytes());
        b[16..24].copy_from_slice(&self.data_offset.to_le_bytes());
        b[24..32].copy_from_slice(&self.data_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.header_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.header_len.to_le_bytes());
        let crc = crc32fast::hash(&b[0..48]);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses and checks the preamble; the version is checked before anything else so an
    /// artifact from another format version gets that message, not a checksum error.
    pub fn decode(bytes: &[u8]) -> Result<Preamble> {
        if bytes.len() < 8 || bytes[0..8] != MAGIC {
            return Err(Error::NotAnArtifact);
        }
        if bytes.len() < PREAMBLE_LEN {
            return Err(Error::Truncated {
                what: "the preamble".into(),
                need: PREAMBLE_LEN as u64,
                have: bytes.len() as u64,
            });
        }
        let u16_at = |o: usize| u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let (major, minor) = (u16_at(8), u16_at(10));
        if major != FORMAT_MAJOR {
            return Err(Error::FormatVersion {
                found_major: major,
                found_minor: minor,
                supported_major: FORMAT_MAJOR,
            });
        }
        if crc32fast::hash(&bytes[0..48]) != u32_at(48) || bytes[52..PREAMBLE_LEN].iter().any(|&b| b != 0) {
            return Err(Error::Checksum { what: "the preamble".into() });
        }
        Ok(Preamble {
            major,
            minor,
            header_crc32: u32_at(12),
            data_offset: u64_at(16),
            data_len: u64_at(24),
            header_offset: u64_at(32),
            header_len: u64_at(40),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Preamble {
        Preamble {
            major: FORMAT_MAJOR,
            minor: FORMAT_MINOR,
            data_offset: 4096,
            data_len: 8192,
            header_offset: 12288,
            header_len: 100,
            header_crc32: 0xdead_beef,
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(Preamble::decode(&sample().encode()).unwrap(), sample());
    }

    #[test]
    fn other_major_version_is_named() {
        let mut p = sample();
        p.major = FORMAT_MAJOR + 1;
        let err = Preamble::decode(&p.encode()).unwrap_err();
        assert!(matches!(err, Error::FormatVersion { found_major, .. } if found_major == FORMAT_MAJOR + 1));
        // An artifact from before the section table (major 9) gets the one message: recompile.
        p.major = 9;
        let err = Preamble::decode(&p.encode()).unwrap_err().to_string();
        assert!(err.contains("format version 9.0 is not supported by this build (it reads 10.x); recompile"), "{err}");
    }

    #[test]
    fn any_flipped_byte_is_caught() {
        let good = sample().encode();
        for i in 0..PREAMBLE_LEN {
            let mut b = good;
            b[i] ^= 0x10;
            assert!(Preamble::decode(&b).is_err(), "flip at byte {i} went unnoticed");
        }
    }
}
