//! Target `onnx`: the ONNX importer (`lladac::onnx::open`: the protobuf reader, the folding
//! of shape arithmetic, the recogniser, the config checks, the weights' extraction). The seed
//! is the PyTorch export of the embedded model with external data (`tests/data/onnx/external`:
//! a 214 KB graph, so each execution is quick; `--model` picks another, such as the dynamic
//! public export `tests/data/onnx-public/A-dynamo-opset18-external`); each execution mutates the graph file, structure-aware (nodes'
//! ops, inputs and order; initializers' shapes, element types and external-data ranges and
//! paths; the graph's inputs) or as raw bytes, and imports it.

use std::path::{Path, PathBuf};

use lladac::hf::config::{self, LladaConfig};
use onnx_ir::{Message, ModelProto};

use crate::harness::Outcome;
use crate::mutate::{self, Rng};

pub struct Seed {
    graph: Vec<u8>,
    model: ModelProto,
    /// Where mutants are written: a copy of the export's directory.
    path: PathBuf,
    config: LladaConfig,
}

impl Seed {
    pub fn new(export: &Path, work: &Path) -> Seed {
        let dir = work.join("onnx");
        std::fs::create_dir_all(&dir).expect("work dir");
        for f in std::fs::read_dir(export).unwrap_or_else(|e| panic!("{}: {e}", export.display())) {
            let f = f.expect("dir entry").path();
            std::fs::copy(&f, dir.join(f.file_name().expect("a file"))).expect("copy");
        }
        let path = dir.join("model.onnx");
        let graph = std::fs::read(&path).expect("the seed graph");
        let model = ModelProto::parse_from_bytes(&graph).expect("the seed parses");
        let (config, _) = config::load(&dir).expect("the seed config loads");
        lladac::onnx::open(&path, &config).expect("the seed imports");
        Seed { graph, model, path, config }
    }
}

pub struct Input {
    pub bytes: Vec<u8>,
}

/// Names, ops and numbers worth trying: the graph's own, LLaDA's, and edge values.
const OPS: &[&str] = &["MatMul", "Gemm", "Add", "Mul", "Softmax", "Sigmoid", "Reshape", "Transpose", "Gather", "Constant", "Hardmax", "Attention", "Loop", "If", ""];
const NUMBERS: &[i64] = &[0, 1, -1, 2, 3, 7, 64, 128, 65535, 1 << 31, 1 << 40, i64::MAX, i64::MIN];

fn number(rng: &mut Rng) -> i64 {
    NUMBERS[rng.below(NUMBERS.len())]
}

pub fn make(seed: &Seed, rng: &mut Rng) -> Input {
    if rng.chance(4) {
        let mut bytes = seed.graph.clone();
        mutate::bytes(rng, &mut bytes);
        return Input { bytes };
    }
    let mut m = seed.model.clone();
    for _ in 0..1 + rng.below(3) {
        let g = m.graph.as_mut().expect("the seed has a graph");
        let names: Vec<String> = g.node.iter().flat_map(|n| n.output.clone()).chain(g.initializer.iter().map(|t| t.name.clone())).collect();
        match rng.below(9) {
            0 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                g.node[i].op_type = OPS[rng.below(OPS.len())].into();
            }
            1 if !g.node.is_empty() => {
                let n = rng.below(g.node.len());
                let node = &mut g.node[n];
                if !node.input.is_empty() {
                    let i = rng.below(node.input.len());
                    node.input[i] = if rng.chance(4) { String::new() } else { names[rng.below(names.len())].clone() };
                }
            }
            2 if !g.node.is_empty() => {
                let i = rng.below(g.node.len());
                g.node.remove(i);
            }
            3 if g.node.len() > 1 => {
                let (a, b) = (rng.below(g.node.len()), rng.below(g.node.len()));
                g.node.swap(a, b);
            }
            4 if !g.initializer.is_empty() => {
                let t = rng.below(g.initializer.len());
                let dims = &mut g.initializer[t].dims;
                match (dims.is_empty(), rng.below(3)) {
                    (false, 0) => {
                        let d = rng.below(dims.len());
                        dims[d] = number(rng);
                    }
                    (false, 1) => {
                        dims.pop();
                    }
                    _ => dims.push(number(rng)),
                }
            }
            5 if !g.initializer.is_empty() => {
                let t = rng.below(g.initializer.len());
                g.initializer[t].data_type = rng.below(24) as i32;
            }
            6 if !g.initializer.is_empty() => {
                let t = rng.below(g.initializer.len());
                let entries = &mut g.initializer[t].external_data;
                if !entries.is_empty() {
                    let e = rng.below(entries.len());
                    entries[e].value = match entries[e].key.as_str() {
                        "location" => ["../model.onnx.data", "/etc/passwd", "missing.data", "model.onnx", ""][rng.below(5)].into(),
                        _ => number(rng).to_string(),
                    };
                }
            }
            7 if !g.initializer.is_empty() => {
                let t = rng.below(g.initializer.len());
                g.initializer.remove(t);
            }
            _ => {
                // The token-id input's name: another value's, or its own.
                if let Some(input) = g.input.first_mut() {
                    input.name = if rng.chance(2) { names[rng.below(names.len())].clone() } else { "input_ids".into() };
                }
            }
        }
    }
    Input { bytes: m.write_to_bytes().unwrap_or_else(|_| seed.graph.clone()) }
}

pub fn test(seed: &Seed, input: &Input) -> Outcome {
    std::fs::write(&seed.path, &input.bytes).expect("the work dir is writable");
    let accepted = lladac::onnx::open(&seed.path, &seed.config).is_ok();
    if accepted { Outcome::Accepted } else { Outcome::Refused }
}
