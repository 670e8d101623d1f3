//! Importer for ONNX exports of LLaDA, through `onnx-ir`. The graph gives the weights: its
//! blocks are recognised by their data flow (`recognise`), and each weight is handed to the
//! rest of the compiler under the Hugging Face checkpoint's name and layout, so an ONNX export
//! and its checkpoint compile to the same artifact. An ONNX graph carries no model config or
//! tokenizer: as in Hugging Face Optimum's exports, `config.json` and the tokenizer files sit
//! beside the `.onnx` file.
//!
//! The weights are copied into memory (a transpose for `[in, out]` MatMul weights), so an ONNX
//! import needs about the model's size in RAM, unlike the safetensors importer.

mod recognise;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use onnx_ir::ir::{Argument, DType, Node, NodeType, OnnxGraph, TensorDataExt};
use onnx_ir::{Message, ModelProto, OnnxGraphBuilder};

use crate::error::{contain_panic, Error, Result};
use crate::hf::checkpoint::{Checkpoint, MemoryTensor, SourceDType};
use crate::hf::config::{Arch, LladaConfig};
use crate::hf::names;
use recognise::{Projection, Recognised};

pub use recognise::recognise;

/// Whether `path` names an ONNX file rather than a checkpoint directory.
pub fn is_onnx(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx")) && !path.is_dir()
}

/// Parses `path`, recognises LLaDA's blocks and returns the weights as a checkpoint.
pub fn open(path: &Path, cfg: &LladaConfig) -> Result<Checkpoint> {
    let err = |msg: String| Error::Onnx { path: path.to_path_buf(), msg };
    if cfg.arch != Arch::Llada {
        return Err(err(format!("ONNX import covers the dense LLaDA architecture; config.json describes {:?}", cfg.arch)));
    }
    if !path.exists() {
        return Err(Error::NotFound { path: path.to_path_buf() });
    }
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let onnx_nodes = check_proto(&bytes).map_err(err)?;
    // As exported: simplification would fuse attention into one node and fold the norms.
    let parsed = contain_panic(|| OnnxGraphBuilder::new().simplify(false).parse_file(path))
        .ok_or_else(|| err("the ONNX parser failed on this file (truncated or malformed protobuf?)".into()))?;
    let graph = parsed.map_err(|e| err(parse_error(e)))?;
    let names = original_names(&graph, &onnx_nodes);
    let label = |n: &Node| format!("node '{}' ({})", names.get(n.name()).map_or(n.name(), |s| s.as_str()), n.node_type());
    let found = recognise(&graph, cfg.d_model, &label).map_err(err)?;
    check_against_config(&found, cfg, &label).map_err(err)?;
    let tensors = weights(&found, &label).map_err(err)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    Ok(Checkpoint::from_memory(dir, path, tensors))
}

/// An ONNX node as the file names it.
struct OnnxNode {
    name: String,
    op_type: String,
}

/// Checks on the file's own protobuf, before onnx-ir (which renames nodes and reports a
/// missing input as a type-inference failure elsewhere): every op is one LLaDA exports to,
/// every input is defined. Returns the nodes other than constants, in order.
fn check_proto(bytes: &[u8]) -> std::result::Result<Vec<OnnxNode>, String> {
    let model = ModelProto::parse_from_bytes(bytes).map_err(|e| format!("not a valid ONNX model (truncated or not protobuf): {e}"))?;
    let graph = model.graph.as_ref().ok_or("the ONNX model has no graph")?;
    let mut defined: HashSet<&str> = graph.input.iter().map(|i| i.name.as_str()).chain(graph.initializer.iter().map(|t| t.name.as_str())).collect();
    let mut nodes = Vec::new();
    for n in &graph.node {
        let op = if matches!(n.domain.as_str(), "" | "ai.onnx") { n.op_type.clone() } else { format!("{}::{}", n.domain, n.op_type) };
        if !recognise::LLADA_OPS.contains(&op.as_str()) {
            return Err(format!("node '{}' ({op}): not an op of LLaDA's forward pass; lladac recognises LLaDA blocks built from {}", n.name, recognise::known_ops()));
        }
        if let Some(missing) = n.input.iter().find(|i| !i.is_empty() && !defined.contains(i.as_str())) {
            return Err(format!("node '{}' ({op}): input '{missing}' is missing: not an initializer, a graph input or an earlier node's output", n.name));
        }
        defined.extend(n.output.iter().map(|o| o.as_str()));
        if op != "Constant" {
            nodes.push(OnnxNode { name: n.name.clone(), op_type: op });
        }
    }
    Ok(nodes)
}

/// onnx-ir's node names mapped back to the file's: its nodes other than constants follow the
/// file's in order, one for one except that a MatMul or Gemm becomes a Linear (and a bias Add
/// may join it). Where the two orders part, the rest keep onnx-ir's names.
fn original_names(g: &OnnxGraph, onnx: &[OnnxNode]) -> HashMap<String, String> {
    let mut names = HashMap::new();
    let mut j = 0;
    for n in g.nodes.iter().filter(|n| n.node_type() != NodeType::Constant) {
        let t = n.node_type().to_string();
        let fits = |o: &OnnxNode| o.op_type == t || (t == "Linear" && matches!(o.op_type.as_str(), "MatMul" | "Gemm"));
        if j < onnx.len() && !fits(&onnx[j]) && onnx[j].op_type == "Add" && j + 1 < onnx.len() && fits(&onnx[j + 1]) {
            j += 1; // a bias Add folded into the Linear before
        }
        match onnx.get(j) {
            Some(o) if fits(o) => {
                names.insert(n.name().to_string(), o.name.clone());
                j += 1;
            }
            _ => break,
        }
    }
    names
}

/// `onnx-ir`'s message, without its own copy of the path (ours leads the line).
fn parse_error(e: onnx_ir::Error) -> String {
    match e {
        onnx_ir::Error::InvalidFormat { error, .. } => error,
        onnx_ir::Error::Io { error, .. } => error.to_string(),
        e => e.to_string(),
    }
}

/// What the config says and the graph computes must agree where the graph states it.
fn check_against_config(found: &Recognised, cfg: &LladaConfig, label: recognise::Label) -> std::result::Result<(), String> {
    if found.blocks.len() != cfg.n_layers {
        return Err(format!("the graph has {} LLaDA blocks; config.json says n_layers {}", found.blocks.len(), cfg.n_layers));
    }
    let eps = cfg.rms_eps as f32;
    for (node, e) in &found.norm_eps {
        if *e as f32 != eps {
            return Err(format!("{}: RMSNorm epsilon {e}; config.json says rms_norm_eps {}", label(node), cfg.rms_eps));
        }
    }
    let scale = 1.0 / (cfg.head_dim() as f64).sqrt();
    for (node, s) in &found.score_scale {
        if ((s - scale) / scale).abs() > 1e-6 {
            return Err(format!("{}: attention scores scaled by {s}; head_dim {} needs 1/sqrt(head_dim) = {scale}", label(node), cfg.head_dim()));
        }
    }
    for (node, shape) in &found.q_split {
        let heads = shape.len().checked_sub(2).map(|i| &shape[i..]);
        if heads != Some(&[cfg.n_heads as i64, cfg.head_dim() as i64][..]) {
            return Err(format!(
                "{}: splits q into shape {shape:?}; config.json says {} heads of {}",
                label(node),
                cfg.n_heads,
                cfg.head_dim()
            ));
        }
    }
    Ok(())
}

/// The recognised weights under the checkpoint's names, matrices `[out, in]`.
fn weights(found: &Recognised, label: recognise::Label) -> std::result::Result<Vec<MemoryTensor>, String> {
    let mut out = vec![tensor(names::EMBEDDING, found.embedding, false)?];
    for (l, b) in found.blocks.iter().enumerate() {
        out.push(tensor(&names::block(l, "attn_norm"), b.attn_norm, false)?);
        out.push(tensor(&names::block(l, "ff_norm"), b.ff_norm, false)?);
        for (part, p) in [("q_proj", b.q), ("k_proj", b.k), ("v_proj", b.v), ("attn_out", b.attn_out), ("ff_proj", b.gate), ("up_proj", b.up), ("ff_out", b.down)] {
            out.push(projection(&names::block(l, part), p, label)?);
        }
    }
    out.push(tensor(names::FINAL_NORM, found.final_norm, false)?);
    out.push(projection(names::HEAD, found.head, label)?);
    Ok(out)
}

fn projection(name: &str, p: Projection, label: recognise::Label) -> std::result::Result<MemoryTensor, String> {
    tensor(name, p.weight, p.in_out).map_err(|e| format!("{}: {e}", label(p.node)))
}

/// The bytes of constant `a`, transposed when it is stored `[in, out]`.
fn tensor(name: &str, a: &Argument, in_out: bool) -> std::result::Result<MemoryTensor, String> {
    // Errors name the weight by the checkpoint tensor it becomes (onnx-ir renames initializers).
    let data = a.value().ok_or_else(|| format!("the weight for '{name}' has no data"))?;
    let dtype = match data.elem_type() {
        DType::F32 => SourceDType::F32,
        DType::BF16 => SourceDType::Bf16,
        DType::F16 => SourceDType::F16,
        other => return Err(format!("the weight for '{name}' has element type {other:?}; supported: float32, bfloat16, float16")),
    };
    let shape: Vec<usize> = data.shape().to_vec();
    let bytes = data.as_bytes();
    if !in_out {
        return Ok(MemoryTensor { name: name.into(), dtype, shape, bytes: bytes.to_vec() });
    }
    let &[rows, cols] = &shape[..] else {
        return Err(format!("the weight for '{name}' has shape {shape:?}, not a matrix"));
    };
    Ok(MemoryTensor { name: name.into(), dtype, shape: vec![cols, rows], bytes: transpose(bytes, rows, cols, dtype.size_bytes()) })
}

/// A row-major `[rows, cols]` matrix of `size`-byte elements, transposed.
fn transpose(bytes: &[u8], rows: usize, cols: usize, size: usize) -> Vec<u8> {
    let mut t = vec![0u8; bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
            t[to..to + size].copy_from_slice(&bytes[from..from + size]);
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/onnx/inline/model.onnx")
    }

    /// The committed PyTorch export: four blocks, each projection found where the file puts
    /// it, and errors name nodes as the file does.
    #[test]
    fn recognises_the_blocks_of_a_pytorch_export_by_their_data_flow() {
        let path = export();
        let onnx_nodes = check_proto(&std::fs::read(&path).unwrap()).unwrap();
        let graph = OnnxGraphBuilder::new().simplify(false).parse_file(&path).unwrap();
        let names = original_names(&graph, &onnx_nodes);
        let label = |n: &Node| names[n.name()].clone();
        let found = recognise(&graph, 128, &label).unwrap();
        assert_eq!(found.blocks.len(), 4);
        let b = &found.blocks[0];
        let order: Vec<String> = [b.q, b.k, b.v, b.attn_out, b.gate, b.up, b.down].iter().map(|p| label(p.node)).collect();
        assert_eq!(order, ["node_linear", "node_linear_1", "node_linear_2", "node_linear_3", "node_linear_4", "node_linear_5", "node_linear_6"]);
        assert!(b.q.in_out, "dynamo folds W^T into a [in, out] initializer");
        assert_eq!(found.norm_eps.len(), 9, "two norms a block and the final one");
        assert!(found.score_scale.iter().all(|(_, s)| (s - 1.0 / 32f64.sqrt()).abs() < 1e-7));
    }

    #[test]
    fn a_matrix_stored_in_out_is_transposed_to_the_checkpoints_out_in() {
        // [in 2, out 3] -> [out 3, in 2], bf16-sized elements moved whole.
        let m = [1u16, 2, 3, 4, 5, 6];
        let bytes: Vec<u8> = m.iter().flat_map(|x| x.to_le_bytes()).collect();
        let t = transpose(&bytes, 2, 3, 2);
        let back: Vec<u16> = t.chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(back, [1, 4, 2, 5, 3, 6]);
    }
}
