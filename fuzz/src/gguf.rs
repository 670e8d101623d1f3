//! Target `gguf`: the GGUF importer (`lladac::gguf::open`: the container reader, the
//! architecture's keys, the tokenizer rebuilt from `tokenizer.ggml.*`, the tensors' mapping),
//! then every tensor read a row chunk at a time and decoded to f32 (the ggml block decoders).
//! The seed is llama.cpp's Q4_0 file of the embedded model (`tests/data/gguf`, made by
//! `tools/gguf/`; `--model` picks another GGUF file). Each execution mutates it
//! structure-aware — the header's counts, a key's value type or length, a tensor's dimension
//! count, dimensions, ggml type or data offset, found where the seed's own parse puts them — or
//! as raw bytes (flips, splices, truncations), and imports it.

use std::path::{Path, PathBuf};

use lladac::convert::to_f32;
use lladac::gguf::container;

use crate::harness::Outcome;
use crate::mutate::{self, Rng};

/// Where the seed's fields lie, found by their names' bytes: the byte after each key's name
/// (its value type, then its value) and after each tensor's name (its dimension count).
pub struct Seed {
    bytes: Vec<u8>,
    keys: Vec<usize>,
    tensors: Vec<(usize, u32)>,
    /// Where mutants are written.
    path: PathBuf,
}

impl Seed {
    pub fn new(file: &Path, work: &Path) -> Seed {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let (kvs, infos) = container::parse(file, &bytes).expect("the seed parses");
        // A name is stored as its u64 length then its bytes: find that exact run.
        let after = |name: &str| -> Option<usize> {
            let mut needle = (name.len() as u64).to_le_bytes().to_vec();
            needle.extend_from_slice(name.as_bytes());
            bytes.windows(needle.len()).position(|w| w == needle.as_slice()).map(|p| p + needle.len())
        };
        let keys = kvs.keys().filter_map(|k| after(k)).collect();
        let tensors = infos.iter().filter_map(|t| after(&t.name).map(|p| (p, t.shape().len() as u32))).collect();
        let path = work.join("fuzz.gguf");
        std::fs::write(&path, &bytes).expect("the work dir is writable");
        read_all(&path).expect("the seed imports");
        Seed { bytes, keys, tensors, path }
    }
}

pub struct Input {
    pub bytes: Vec<u8>,
}

/// Counts, lengths and offsets worth trying.
const NUMBERS: &[u64] = &[0, 1, 2, 3, 4, 5, 31, 32, 33, 255, 256, 65_535, 1 << 31, 1 << 32, 1 << 40, u64::MAX / 2, u64::MAX];

fn number(rng: &mut Rng) -> u64 {
    NUMBERS[rng.below(NUMBERS.len())]
}

fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    if let Some(b) = bytes.get_mut(at..at + 4) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    if let Some(b) = bytes.get_mut(at..at + 8) {
        b.copy_from_slice(&v.to_le_bytes());
    }
}

pub fn make(seed: &Seed, rng: &mut Rng) -> Input {
    let mut bytes = seed.bytes.clone();
    if rng.chance(4) {
        mutate::bytes(rng, &mut bytes);
        return Input { bytes };
    }
    for _ in 0..1 + rng.below(2) {
        match rng.below(6) {
            // The header: version, tensor count, key count.
            0 => match rng.below(3) {
                0 => put_u32(&mut bytes, 4, number(rng) as u32),
                1 => put_u64(&mut bytes, 8, number(rng)),
                _ => put_u64(&mut bytes, 16, number(rng)),
            },
            // A key's value type (13 types, and beyond).
            1 if !seed.keys.is_empty() => {
                let at = seed.keys[rng.below(seed.keys.len())];
                put_u32(&mut bytes, at, rng.below(16) as u32);
            }
            // A key's string length or array element type and count.
            2 if !seed.keys.is_empty() => {
                let at = seed.keys[rng.below(seed.keys.len())];
                if rng.chance(2) {
                    put_u64(&mut bytes, at + 4, number(rng));
                } else {
                    put_u32(&mut bytes, at + 4, rng.below(16) as u32);
                    put_u64(&mut bytes, at + 8, number(rng));
                }
            }
            // A tensor's dimension count or one of its dimensions.
            3 if !seed.tensors.is_empty() => {
                let (at, dims) = seed.tensors[rng.below(seed.tensors.len())];
                if rng.chance(3) {
                    put_u32(&mut bytes, at, rng.below(6) as u32);
                } else {
                    put_u64(&mut bytes, at + 4 + 8 * rng.below(dims.max(1) as usize), number(rng));
                }
            }
            // A tensor's ggml type.
            4 if !seed.tensors.is_empty() => {
                let (at, dims) = seed.tensors[rng.below(seed.tensors.len())];
                put_u32(&mut bytes, at + 4 + 8 * dims as usize, rng.below(40) as u32);
            }
            // A tensor's data offset.
            _ if !seed.tensors.is_empty() => {
                let (at, dims) = seed.tensors[rng.below(seed.tensors.len())];
                let offset = at + 8 + 8 * dims as usize;
                let v = if rng.chance(2) { number(rng) } else { u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes")).wrapping_add(rng.below(64) as u64) };
                put_u64(&mut bytes, offset, v);
            }
            _ => mutate::bytes(rng, &mut bytes),
        }
    }
    Input { bytes }
}

/// Imports a GGUF file and decodes every tensor, a row chunk at a time.
fn read_all(path: &Path) -> lladac::Result<()> {
    let imported = lladac::gguf::open(path)?;
    let mut floats = Vec::new();
    crate::importer::read_every_tensor(&imported.ckpt, 4096, |loc, raw| {
        floats.clear();
        to_f32(loc.dtype, raw, &mut floats);
        std::hint::black_box(floats.iter().sum::<f32>());
    })
}

pub fn test(seed: &Seed, input: &Input) -> Outcome {
    std::fs::write(&seed.path, &input.bytes).expect("the work dir is writable");
    if read_all(&seed.path).is_ok() { Outcome::Accepted } else { Outcome::Refused }
}
