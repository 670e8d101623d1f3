//! Target `importer`: the checkpoint importer's readers of `config.json`, the tokenizer files
//! (`tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`), the safetensors
//! header of a single-file checkpoint, and a sharded checkpoint's index and shards. Each
//! execution mutates one file of a valid checkpoint (structure-aware when it is JSON,
//! safetensors headers included, or raw bytes), writes it, and runs the readers of that file,
//! reading every tensor's bytes when the checkpoint opens.

use std::path::{Path, PathBuf};

use lladac::hf::checkpoint::{Checkpoint, TensorLocation};
use lladac::hf::config::{self, LladaConfig};
use lladac::hf::tokenizer;
use serde_json::Value;

use crate::harness::Outcome;
use crate::mutate::{self, Rng};

/// A small safetensors file: `tensors` of (name, dtype, shape, element bytes).
fn safetensors(tensors: &[(&str, &str, &[usize], usize)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut offset = 0;
    for &(name, dtype, shape, elem) in tensors {
        let n = shape.iter().product::<usize>() * elem;
        header.insert(name.into(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}));
        offset += n;
    }
    with_header(&Value::Object(header), offset)
}

/// A safetensors file with header `json` and `data` bytes of data (a counting pattern).
fn with_header(json: &Value, data: usize) -> Vec<u8> {
    let mut h = serde_json::to_vec(json).expect("serialises");
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend((0..data).map(|i| i as u8));
    out
}

struct File {
    /// Where it is written (the single-file or the sharded checkpoint).
    path: PathBuf,
    seed: Vec<u8>,
    kind: Kind,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Config,
    Tokenizer,
    Safetensors,
    Index,
}

pub struct Seeds {
    files: Vec<File>,
    single: PathBuf,
    sharded: PathBuf,
    config: LladaConfig,
}

impl Seeds {
    /// A valid single-file checkpoint (the embedded model's config and tokenizer, small
    /// tensors) and a sharded one, written under `work`.
    pub fn new(model: &Path, work: &Path) -> Seeds {
        let (single, sharded) = (work.join("single"), work.join("sharded"));
        let mut files = Vec::new();
        for dir in [&single, &sharded] {
            std::fs::create_dir_all(dir).expect("work dir");
            // generation_config.json: where LLaDA-MoE keeps its mask id (others may lack it).
            let generation = model.join("generation_config.json").exists().then_some(("generation_config.json", Kind::Config));
            let named = [("config.json", Kind::Config), ("tokenizer.json", Kind::Tokenizer), ("tokenizer_config.json", Kind::Tokenizer), ("special_tokens_map.json", Kind::Tokenizer)];
            for (name, kind) in named.into_iter().chain(generation) {
                let seed = std::fs::read(model.join(name)).unwrap_or_else(|e| panic!("{}: {e}", model.join(name).display()));
                std::fs::write(dir.join(name), &seed).expect("write");
                if dir == &single {
                    files.push(File { path: dir.join(name), seed, kind });
                }
            }
        }
        let st = safetensors(&[("model.a", "F32", &[4, 4], 4), ("model.b", "BF16", &[8], 2), ("model.c", "F16", &[2, 3], 2)]);
        let shard1 = safetensors(&[("model.a", "F32", &[4, 4], 4), ("model.b", "BF16", &[3, 8], 2)]);
        let shard2 = safetensors(&[("model.c", "F16", &[2, 3], 2)]);
        let index = serde_json::to_vec(&serde_json::json!({
            "metadata": {"total_size": 118},
            "weight_map": {"model.a": "model-00001-of-00002.safetensors", "model.b": "model-00001-of-00002.safetensors", "model.c": "model-00002-of-00002.safetensors"}
        }))
        .expect("serialises");
        for (path, seed, kind) in [
            (single.join("model.safetensors"), st, Kind::Safetensors),
            (sharded.join("model.safetensors.index.json"), index, Kind::Index),
            (sharded.join("model-00001-of-00002.safetensors"), shard1, Kind::Safetensors),
            (sharded.join("model-00002-of-00002.safetensors"), shard2, Kind::Safetensors),
        ] {
            std::fs::write(&path, &seed).expect("write");
            files.push(File { path, seed, kind });
        }
        let (config, _) = config::load(&single).expect("the seed config loads");
        let seeds = Seeds { files, single, sharded, config };
        for dir in [&seeds.single, &seeds.sharded] {
            read_checkpoint(dir).expect("the seed checkpoint opens");
        }
        tokenizer::load(&seeds.single, &seeds.config).expect("the seed tokenizer loads");
        seeds
    }
}

/// Opens a checkpoint and reads every tensor's bytes, a row chunk at a time.
fn read_checkpoint(dir: &Path) -> lladac::Result<()> {
    let ck = Checkpoint::open(dir)?;
    read_every_tensor(&ck, 16, |_, bytes| {
        std::hint::black_box(bytes.iter().map(|&b| b as u64).sum::<u64>());
    })
}

/// Calls `f` on every tensor of `ck` (at whatever shape it has), a chunk of rows of at most
/// about `chunk_bytes` at a time.
pub fn read_every_tensor(ck: &Checkpoint, chunk_bytes: usize, mut f: impl FnMut(&TensorLocation, &[u8])) -> lladac::Result<()> {
    let names: Vec<String> = ck.names().map(str::to_string).collect();
    for name in names {
        let shape = ck.expect(&name, &[], "").map(|l| l.shape.clone()).or_else(|e| match e {
            lladac::Error::TensorShape { found, .. } => Ok(found),
            e => Err(e),
        })?;
        let loc = ck.expect(&name, &shape, "fuzz")?;
        ck.for_each_row_chunk(loc, chunk_bytes, |bytes| {
            f(loc, bytes);
            Ok(())
        })?;
    }
    Ok(())
}

/// Structure-aware mutation of a safetensors file: its JSON header edited as a tree (data
/// kept), else raw bytes.
fn mutate_safetensors(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let n = u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")) as usize;
    if rng.chance(2) {
        if let Ok(mut tree) = serde_json::from_slice::<Value>(&seed[8..8 + n]) {
            mutate::json(rng, &mut tree);
            let mut out = with_header(&tree, 0);
            out.extend_from_slice(&seed[8 + n..]);
            return out;
        }
    }
    let mut out = seed.to_vec();
    mutate::bytes(rng, &mut out);
    out
}

/// A mutant of one file of the checkpoints.
pub struct Input {
    file: usize,
    pub bytes: Vec<u8>,
}

pub fn make(seeds: &Seeds, rng: &mut Rng) -> Input {
    let index = rng.below(seeds.files.len());
    let file = &seeds.files[index];
    let bytes = match file.kind {
        Kind::Safetensors => mutate_safetensors(rng, &file.seed),
        _ => match serde_json::from_slice::<Value>(&file.seed) {
            Ok(mut tree) if rng.chance(2) => {
                mutate::json(rng, &mut tree);
                serde_json::to_vec(&tree).expect("serialises")
            }
            _ => {
                let mut out = file.seed.clone();
                mutate::bytes(rng, &mut out);
                out
            }
        },
    };
    Input { file: index, bytes }
}

pub fn test(seeds: &Seeds, input: &Input) -> Outcome {
    let file = &seeds.files[input.file];
    /// Puts the seed back however the readers return (a panic included).
    struct Restore<'f>(&'f File);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            let _ = std::fs::write(&self.0.path, &self.0.seed);
        }
    }
    let _restore = Restore(file);
    std::fs::write(&file.path, &input.bytes).expect("the work dir is writable");
    let dir = file.path.parent().expect("in a dir");
    let accepted = match file.kind {
        Kind::Config => config::load(dir).is_ok(),
        Kind::Tokenizer => tokenizer::load(dir, &seeds.config).is_ok(),
        Kind::Safetensors | Kind::Index => read_checkpoint(dir).is_ok(),
    };
    if accepted { Outcome::Accepted } else { Outcome::Refused }
}
