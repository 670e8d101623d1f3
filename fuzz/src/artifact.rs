//! Target `artifact`: the artifact reader and verifier, and the runtime behind them. Inputs
//! are mutants of a small valid artifact: structure-aware (the decoded header edited as a
//! JSON tree, encoded again and both checksums recomputed, so edits reach the verifier),
//! raw edits of the encoded header (resealed), and raw edits of the whole file (the preamble,
//! the checksums, the data). A mutant the verifier accepts with a changed header is then
//! loaded by the runtime and run for one forward pass: whatever verifies must not panic.

use std::path::Path;

use llada_ir::format::Preamble;
use llada_ir::{Artifact, Header};
use serde_json::Value;

use crate::harness::Outcome;
use crate::mutate::{self, Rng};

pub struct Seed {
    file: Vec<u8>,
    header_offset: usize,
    /// The encoded `core` section (what the raw edits mutate), and the other sections kept
    /// as they are.
    header: Vec<u8>,
    extensions: Vec<llada_ir::Extension>,
    tree: Value,
}

impl Seed {
    pub fn new(file: Vec<u8>) -> Seed {
        let p = Preamble::decode(&file).expect("the seed artifact has a preamble");
        let (mut h, _) = llada_ir::sections::decode(&file[p.header_offset as usize..]).expect("the seed header decodes");
        let extensions = std::mem::take(&mut h.extensions);
        let header = postcard::to_allocvec(&h).expect("encodes");
        let tree = serde_json::to_value(&h).expect("a header is JSON-serialisable");
        Seed { header_offset: p.header_offset as usize, file, header, extensions, tree }
    }
}

/// The seed file with `core` as its core section (its other sections as they were), every
/// checksum recomputed.
fn reseal(seed: &Seed, core: &[u8]) -> Vec<u8> {
    let region = llada_ir::sections::encode_parts(core, &seed.extensions).expect("the seed's sections encode");
    let header = &region[..];
    let p = Preamble::decode(&seed.file).expect("seed");
    let p = Preamble { header_len: header.len() as u64, header_crc32: crc32fast::hash(header), ..p };
    let mut out = Vec::with_capacity(seed.header_offset + header.len());
    out.extend_from_slice(&p.encode());
    out.extend_from_slice(&seed.file[p.encode().len()..seed.header_offset]);
    out.extend_from_slice(header);
    out
}

/// A mutant: the file, and whether its header was edited (then resealed).
pub struct Input {
    pub file: Vec<u8>,
    header_changed: bool,
}

pub fn make(seed: &Seed, rng: &mut Rng) -> Input {
    let (file, header_changed) = match rng.below(10) {
        0..=4 => {
            let mut tree = seed.tree.clone();
            mutate::json(rng, &mut tree);
            match serde_json::from_value::<Header>(tree) {
                Ok(h) => (reseal(seed, &postcard::to_allocvec(&h).expect("encodes")), true),
                // Not a header any more (a type changed): edit the encoding instead.
                Err(_) => {
                    let mut header = seed.header.clone();
                    mutate::bytes(rng, &mut header);
                    (reseal(seed, &header), true)
                }
            }
        }
        5..=7 => {
            let mut header = seed.header.clone();
            mutate::bytes(rng, &mut header);
            (reseal(seed, &header), true)
        }
        _ => {
            let mut file = seed.file.clone();
            mutate::bytes(rng, &mut file);
            (file, false)
        }
    };
    Input { file, header_changed }
}

pub fn test(seed: &Seed, input: &Input, scratch: &Path) -> Outcome {
    let file = &input.file;
    let accepted = match Artifact::parse(file) {
        Ok(a) => a.verify_data().is_ok(),
        Err(_) => false,
    };
    if !accepted {
        return Outcome::Refused;
    }
    if input.header_changed && *file != seed.file {
        run_accepted(file, scratch);
    }
    Outcome::Accepted
}

/// Loads an accepted mutant in the runtime and runs one forward pass; errors are fine,
/// panics are not.
fn run_accepted(file: &[u8], scratch: &Path) {
    std::fs::write(scratch, file).expect("the scratch file is writable");
    let Ok(model) = llada_rt::Model::open(scratch, true) else { return };
    let _ = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special);
    let Ok(mut session) = llada_rt::Session::with_threads(&model, 1) else { return };
    let vocab = model.header.model.embedding_size.max(1);
    let ids: Vec<u32> = (0..8).map(|i| (i * 7 + 1) % vocab).collect();
    let _ = session.forward_full(&ids, &[6, 7]);
}
