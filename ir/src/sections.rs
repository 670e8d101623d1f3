//! The header region as a table of sections, each versioned on its own, so the artifact can
//! grow without a new format version:
//!
//! ```text
//! "SECT"  u32 count
//! count x { kind: 24 bytes (ASCII, NUL-padded), version: u32, flags: u32 (bit 0: required),
//!           offset: u64, len: u64 (from the start of the region), crc32: u32, 4 zero bytes }
//! the sections' bytes, in table order
//! ```
//!
//! The `core` section (required) is the postcard-encoded [`Header`] without its extensions:
//! the model, tokenizer, tensors, segments, graphs and plan. Every other section is an
//! [`Extension`] (the NPU's executables are `npu.qnn`). A reader refuses a required section
//! it does not know or cannot read at its version, naming it; it keeps the others, known or
//! not, for whoever reads them (`NpuSection::of` checks its own version), and a runtime that
//! does not know a section runs the artifact without it. Changing a section's contents bumps
//! that section's version only; the format's major version changes only with this table's
//! layout or the preamble's.

use crate::error::{Error, Result};
use crate::header::{Extension, Header};

pub const TABLE_MAGIC: [u8; 4] = *b"SECT";
/// The required section that holds the header proper.
pub const CORE: &str = "core";
/// The `core` section's version: its postcard schema (the header types of `header.rs`,
/// `graph.rs` and `window.rs`). Bump it with any change to them.
pub const CORE_VERSION: u32 = 2;
/// Bytes of a section's kind in the table.
pub const KIND_LEN: usize = 24;
const ENTRY_LEN: usize = KIND_LEN + 4 + 4 + 8 + 8 + 4 + 4;
const FLAG_REQUIRED: u32 = 1;

/// One entry of the table, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionEntry {
    pub kind: String,
    pub version: u32,
    /// A reader that cannot read this section must refuse the artifact.
    pub required: bool,
    /// From the start of the header region.
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

/// The version of section `kind` this build reads, if it knows the kind.
pub fn readable_version(kind: &str) -> Option<u32> {
    match kind {
        CORE => Some(CORE_VERSION),
        crate::npu::EXTENSION_KEY => Some(crate::npu::SECTION_VERSION),
        crate::program::EXTENSION_KEY => Some(crate::program::SECTION_VERSION),
        crate::diffusion_gemma::EXTENSION_KEY => Some(crate::diffusion_gemma::SECTION_VERSION),
        _ => None,
    }
}

/// The header region of `header`: the table, the `core` section, then each extension as its
/// own section.
pub fn encode(header: &Header) -> Result<Vec<u8>> {
    let core = Header { extensions: Vec::new(), ..header.clone() };
    let core = postcard::to_stdvec(&core).map_err(|e| Error::invalid(format!("cannot encode the header: {e}")))?;
    encode_parts(&core, &header.extensions)
}

/// A header region of an encoded `core` section and `extensions` (for tools that edit the
/// encoding itself, as the fuzzer does).
pub fn encode_parts(core: &[u8], extensions: &[Extension]) -> Result<Vec<u8>> {
    let mut sections: Vec<(&str, u32, bool, &[u8])> = vec![(CORE, CORE_VERSION, true, core)];
    for e in extensions {
        if e.key == CORE || e.key.len() > KIND_LEN || !e.key.is_ascii() || e.key.contains('\0') {
            return Err(Error::invalid(format!("extension '{}': a section kind is at most {KIND_LEN} ASCII bytes and not '{CORE}'", e.key)));
        }
        sections.push((&e.key, e.version, e.required, &e.bytes));
    }
    let table_len = 8 + sections.len() * ENTRY_LEN;
    let mut out = Vec::with_capacity(table_len + sections.iter().map(|s| s.3.len()).sum::<usize>());
    out.extend_from_slice(&TABLE_MAGIC);
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    let mut offset = table_len as u64;
    for &(kind, version, required, bytes) in &sections {
        let mut name = [0u8; KIND_LEN];
        name[..kind.len()].copy_from_slice(kind.as_bytes());
        out.extend_from_slice(&name);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(if required { FLAG_REQUIRED } else { 0 }).to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        offset += bytes.len() as u64;
    }
    for &(.., bytes) in &sections {
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// The table of a header region, every entry checked: inside the region, in order without
/// overlap, its bytes matching its CRC-32.
pub fn table(region: &[u8]) -> Result<Vec<SectionEntry>> {
    let bad = |msg: String| Err(Error::invalid(format!("the section table: {msg}")));
    if region.len() < 8 || region[..4] != TABLE_MAGIC {
        return bad("it does not start with its magic bytes".into());
    }
    let count = u32::from_le_bytes(region[4..8].try_into().expect("4 bytes")) as usize;
    let Some(table_end) = count.checked_mul(ENTRY_LEN).and_then(|n| n.checked_add(8)).filter(|&end| end <= region.len()) else {
        return bad(format!("{count} entries do not fit its {} bytes", region.len()));
    };
    let mut entries = Vec::with_capacity(count);
    let mut cursor = table_end as u64;
    for i in 0..count {
        let e = &region[8 + i * ENTRY_LEN..][..ENTRY_LEN];
        let u32_at = |o: usize| u32::from_le_bytes(e[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(e[o..o + 8].try_into().expect("8 bytes"));
        let name = &e[..KIND_LEN];
        let len = name.iter().position(|&b| b == 0).unwrap_or(KIND_LEN);
        let Some(kind) = std::str::from_utf8(&name[..len]).ok().filter(|k| !k.is_empty() && k.is_ascii() && name[len..].iter().all(|&b| b == 0)) else {
            return bad(format!("entry {i} has no ASCII kind"));
        };
        let entry = SectionEntry { kind: kind.to_string(), version: u32_at(KIND_LEN), required: u32_at(KIND_LEN + 4) & FLAG_REQUIRED != 0, offset: u64_at(KIND_LEN + 8), len: u64_at(KIND_LEN + 16), crc32: u32_at(KIND_LEN + 24) };
        if u32_at(KIND_LEN + 4) & !FLAG_REQUIRED != 0 || u32_at(KIND_LEN + 28) != 0 {
            return bad(format!("section '{kind}' has flags this reader does not know"));
        }
        let end = entry.offset.checked_add(entry.len).filter(|&end| end <= region.len() as u64);
        if entry.offset != cursor || end.is_none() {
            return bad(format!("section '{kind}' at {}..+{} is not where the table's order puts it ({cursor}) or lies outside the {} bytes", entry.offset, entry.len, region.len()));
        }
        if entries.iter().any(|x: &SectionEntry| x.kind == entry.kind) {
            return bad(format!("section '{kind}' is listed twice"));
        }
        if crc32fast::hash(&region[entry.offset as usize..][..entry.len as usize]) != entry.crc32 {
            return Err(Error::Checksum { what: format!("section '{kind}'") });
        }
        cursor += entry.len;
        entries.push(entry);
    }
    if cursor != region.len() as u64 {
        return bad(format!("{} bytes after the last section", region.len() as u64 - cursor));
    }
    Ok(entries)
}

/// The header of a header region (its `core` section, and every other section as an
/// extension), with the table. Refuses, naming it, a required section this build does not
/// know or cannot read at its version.
pub fn decode(region: &[u8]) -> Result<(Header, Vec<SectionEntry>)> {
    let entries = table(region)?;
    for e in entries.iter().filter(|e| e.required) {
        match readable_version(&e.kind) {
            Some(v) if v == e.version => {}
            Some(v) => return Err(Error::SectionVersion { kind: e.kind.clone(), found: e.version, reads: Some(v) }),
            None => return Err(Error::SectionVersion { kind: e.kind.clone(), found: e.version, reads: None }),
        }
    }
    let bytes = |e: &SectionEntry| &region[e.offset as usize..][..e.len as usize];
    let Some(core) = entries.iter().find(|e| e.kind == CORE) else {
        return Err(Error::invalid("the section table has no 'core' section"));
    };
    if !core.required {
        return Err(Error::invalid("the 'core' section is not marked required"));
    }
    let mut header: Header = postcard::from_bytes(bytes(core)).map_err(|e| Error::invalid(format!("cannot decode the header: {e}")))?;
    if !header.extensions.is_empty() {
        return Err(Error::invalid("the 'core' section holds extensions: each is a section of its own"));
    }
    header.extensions = entries.iter().filter(|e| e.kind != CORE).map(|e| Extension { key: e.kind.clone(), version: e.version, required: e.required, bytes: bytes(e).to_vec() }).collect();
    Ok((header, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(key: &str, version: u32, required: bool, bytes: &[u8]) -> Extension {
        Extension { key: key.into(), version, required, bytes: bytes.to_vec() }
    }

    /// Byte offset of entry `i`'s field at `at` (past its kind) in a region.
    fn field(i: usize, at: usize) -> usize {
        8 + i * ENTRY_LEN + KIND_LEN + at
    }

    #[test]
    fn the_table_lists_every_section_in_order_with_its_version_and_checksum() {
        let region = encode_parts(b"core bytes", &[ext("npu.qnn", 6, false, b"npu"), ext("later.thing", 3, true, b"xyz!")]).unwrap();
        let t = table(&region).unwrap();
        let kinds: Vec<(&str, u32, bool, u64)> = t.iter().map(|e| (e.kind.as_str(), e.version, e.required, e.len)).collect();
        assert_eq!(kinds, [("core", CORE_VERSION, true, 10), ("npu.qnn", 6, false, 3), ("later.thing", 3, true, 4)]);
        assert_eq!(t[0].offset, 8 + 3 * ENTRY_LEN as u64);
        assert_eq!(&region[t[2].offset as usize..], b"xyz!");
    }

    #[test]
    fn a_required_section_this_build_cannot_read_is_refused_by_name() {
        let unknown = encode_parts(b"core", &[ext("later.thing", 3, true, b"x")]).unwrap();
        let e = decode(&unknown).unwrap_err().to_string();
        assert!(e.contains("needs section 'later.thing' (version 3), which this build does not know"), "{e}");
        // The core section at another version: recompile.
        let mut newer = encode_parts(b"core", &[]).unwrap();
        newer[field(0, 0)..field(0, 4)].copy_from_slice(&(CORE_VERSION + 1).to_le_bytes());
        let e = decode(&newer).unwrap_err().to_string();
        assert!(e.contains(&format!("section 'core' is version {} but this build reads version {CORE_VERSION}; recompile", CORE_VERSION + 1)), "{e}");
    }

    #[test]
    fn damaged_or_misplaced_sections_are_refused() {
        let good = encode_parts(b"core", &[ext("npu.qnn", 6, false, b"npu")]).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(table(&flipped), Err(Error::Checksum { what }) if what == "section 'npu.qnn'"));
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(table(&trailing).unwrap_err().to_string().contains("1 bytes after the last section"));
        let mut moved = good.clone();
        moved[field(1, 8)] += 1;
        assert!(table(&moved).unwrap_err().to_string().contains("section 'npu.qnn'"));
        let mut flags = good;
        flags[field(1, 4)] = 2;
        assert!(table(&flags).unwrap_err().to_string().contains("flags this reader does not know"));
        assert!(table(b"SECT").unwrap_err().to_string().contains("does not start with its magic bytes"));
        assert!(table(b"SECT\x09\0\0\0").unwrap_err().to_string().contains("9 entries do not fit its 8 bytes"));
        assert!(encode_parts(b"core", &[ext("core", 1, false, b"")]).is_err(), "a second core section");
        assert!(encode_parts(b"core", &[ext("a.kind.longer.than.twenty.four", 1, false, b"")]).is_err());
    }
}
