//! Importer for ONNX exports of LLaDA. The file is read into plain data (`proto`), whatever
//! it computes from shapes alone is folded for the static shape a plan compiles (`fold`), the
//! token-dependent rest is recognised as LLaDA's blocks by its data flow (`recognise`), what
//! the graph fixes is checked against the config beside it (`check`), and each weight is handed
//! to the rest of the compiler under the Hugging Face checkpoint's name and layout, so an ONNX
//! export and its checkpoint compile to the same artifact. An ONNX graph carries no model config
//! or tokenizer: as in Hugging Face Optimum's exports, `config.json` and the tokenizer files sit
//! beside the `.onnx` file.
//!
//! The weights are copied into memory (a transpose for `[in, out]` MatMul weights), so an ONNX
//! import needs about the model's size in RAM, unlike the safetensors importer.

mod check;
mod fold;
mod ops;
mod proto;
mod recognise;
mod tensor;

use std::path::{Path, PathBuf};

use crate::error::{Error, FileError, Result};
use crate::hf::checkpoint::{Checkpoint, MemoryTensor, SourceDType};
use crate::hf::config::{Family, LladaConfig};
use crate::hf::names;
use recognise::{Projection, Recognised};
use tensor::{Elem, Tensor};

pub use ops::known_ops;

/// Whether `path` names an ONNX file rather than a checkpoint directory.
pub fn is_onnx(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx")) && !path.is_dir()
}

/// The export in a directory laid out as Optimum and `torch.onnx.export` leave one: a single
/// `.onnx` file (its external data beside it) and no safetensors checkpoint.
pub fn export_in(dir: &Path) -> Option<PathBuf> {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    if entries.iter().any(|p| p.extension().is_some_and(|e| e == "safetensors" || e == "json" && p.file_name().is_some_and(|n| n == "model.safetensors.index.json"))) {
        return None;
    }
    let mut onnx = entries.into_iter().filter(|p| is_onnx(p));
    match (onnx.next(), onnx.next()) {
        (Some(one), None) => Some(one),
        _ => None,
    }
}

/// Parses `path`, recognises LLaDA's blocks and returns the weights as a checkpoint.
pub fn open(path: &Path, cfg: &LladaConfig) -> Result<Checkpoint> {
    let err = |msg: String| Error::Onnx { path: path.to_path_buf(), msg };
    if cfg.family != Family::Llada {
        return Err(err(format!("ONNX import covers the dense LLaDA architecture; config.json describes {:?}", cfg.family)));
    }
    if !path.exists() {
        return Err(Error::File(FileError::NotFound { path: path.to_path_buf() }));
    }
    let graph = proto::read(path).map_err(err)?;
    let folded = fold::fold(&graph).map_err(err)?;
    let found = recognise::recognise(&folded).map_err(err)?;
    check::against_config(&found, cfg).map_err(err)?;
    let tensors = weights(&found).map_err(err)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    Ok(Checkpoint::from_memory(dir, path, tensors))
}

/// The recognised weights under the checkpoint's names, matrices `[out, in]`.
fn weights(found: &Recognised) -> std::result::Result<Vec<MemoryTensor>, String> {
    let mut out = vec![tensor(names::EMBEDDING, &found.embedding, false)?];
    for (l, b) in found.blocks.iter().enumerate() {
        out.push(tensor(&names::block(l, "attn_norm"), &b.attn_norm, false)?);
        out.push(tensor(&names::block(l, "ff_norm"), &b.ff_norm, false)?);
        for (part, p) in [("q_proj", &b.q), ("k_proj", &b.k), ("v_proj", &b.v), ("attn_out", &b.attn_out), ("ff_proj", &b.gate), ("up_proj", &b.up), ("ff_out", &b.down)] {
            out.push(projection(&names::block(l, part), p)?);
        }
    }
    out.push(tensor(names::FINAL_NORM, &found.final_norm, false)?);
    out.push(projection(names::HEAD, &found.lm_head)?);
    Ok(out)
}

fn projection(name: &str, p: &Projection) -> std::result::Result<MemoryTensor, String> {
    tensor(name, &p.weight, p.in_out).map_err(|e| format!("{}: {e}", p.node.label()))
}

/// The bytes of constant `t`, transposed when it is stored `[in, out]`.
fn tensor(name: &str, t: &Tensor, in_out: bool) -> std::result::Result<MemoryTensor, String> {
    // Errors name the weight by the checkpoint tensor it becomes (exporters rename initializers).
    let dtype = match t.elem {
        Elem::F32 => SourceDType::F32,
        Elem::Bf16 => SourceDType::Bf16,
        Elem::F16 => SourceDType::F16,
        other => return Err(format!("the weight for '{name}' has element type {other:?}; supported: float32, bfloat16, float16")),
    };
    let shape = t.dims.clone();
    let bytes = t.bytes();
    if !in_out {
        return Ok(MemoryTensor { name: name.into(), dtype, shape, bytes: bytes.into_owned() });
    }
    let &[rows, cols] = &shape[..] else {
        return Err(format!("the weight for '{name}' has shape {shape:?}, not a matrix"));
    };
    Ok(MemoryTensor { name: name.into(), dtype, shape: vec![cols, rows], bytes: transpose(&bytes, rows, cols, dtype.size_bytes()) })
}

/// A row-major `[rows, cols]` matrix of `size`-byte elements, transposed.
fn transpose(bytes: &[u8], rows: usize, cols: usize, size: usize) -> Vec<u8> {
    // In tiles, so both sides stay in cache on matrices of hundreds of megabytes.
    const TILE: usize = 64;
    let mut t = vec![0u8; bytes.len()];
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    let (from, to) = ((r * cols + c) * size, (c * rows + r) * size);
                    t[to..to + size].copy_from_slice(&bytes[from..from + size]);
                }
            }
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
        let graph = proto::read(&export()).unwrap();
        let folded = fold::fold(&graph).unwrap();
        let found = recognise::recognise(&folded).unwrap();
        assert_eq!(found.blocks.len(), 4);
        let b = &found.blocks[0];
        let order: Vec<&str> = [&b.q, &b.k, &b.v, &b.attn_out, &b.gate, &b.up, &b.down].iter().map(|p| p.node.name.as_str()).collect();
        assert_eq!(order, ["node_linear", "node_linear_1", "node_linear_2", "node_linear_3", "node_linear_4", "node_linear_5", "node_linear_6"]);
        assert!(b.q.in_out, "dynamo folds W^T into a [in, out] initializer");
        assert_eq!(found.norm_eps.len(), 9, "two norms a block and the final one");
        assert!(found.blocks.iter().all(|b| (b.attention.scale - 1.0 / 32f64.sqrt()).abs() < 1e-7));
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
