//! `lladac inspect`: what an artifact holds, for people (`text`) and scripts (`--json`).

use std::fs::File;
use std::path::Path;

use llada_ir::{Artifact, Header, Rows};
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Maps and fully verifies an artifact, then describes it.
pub fn inspect(path: &Path) -> Result<Value> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map of a file we only read; a concurrent writer could change bytes
    // under us, which the checksum pass below would then report.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let wrap = |source| Error::Artifact { path: path.to_path_buf(), source };
    let art = Artifact::parse(&map).map_err(wrap)?;
    art.verify_data().map_err(wrap)?;
    Ok(describe(&art.header, art.preamble.major, art.preamble.minor, map.len() as u64))
}

fn describe(h: &Header, major: u16, minor: u16, file_bytes: u64) -> Value {
    let segment_of = |offset: u64| h.segments.iter().position(|s| offset >= s.offset && offset < s.offset + s.nbytes);
    let tensors: Vec<Value> = h
        .tensors
        .iter()
        .map(|t| {
            json!({
                "name": t.name, "dtype": t.dtype.name(), "shape": t.shape, "bytes": t.nbytes,
                "offset": t.offset, "segment": segment_of(t.offset).map(|i| h.segments[i].name.clone()),
            })
        })
        .collect();
    let graphs: Vec<Value> = h
        .graphs
        .iter()
        .map(|g| {
            let head_values = g.values.iter().filter(|v| v.rows == Rows::Head).count();
            json!({
                "name": g.name, "rows": g.rows, "head_rows": g.head_rows, "ops": g.ops.len(),
                "values": g.values.len(), "head_values": head_values, "window_bytes": g.window_bytes,
            })
        })
        .collect();
    let mut by_dtype = std::collections::BTreeMap::<String, u64>::new();
    for t in &h.tensors {
        *by_dtype.entry(t.dtype.name()).or_default() += t.nbytes;
    }
    json!({
        "format": format!("{major}.{minor}"),
        "file_bytes": file_bytes,
        "model": h.model,
        "special_tokens": h.special,
        "tokenizer": {
            "tokenizer_json_bytes": h.tokenizer.tokenizer_json.len(),
            "chat_template": h.tokenizer.chat_template.is_some(),
            "bos_token": h.tokenizer.bos_token, "eos_token": h.tokenizer.eos_token,
        },
        "weight_bytes_by_dtype": by_dtype,
        "tensors": tensors,
        "segments": h.segments.iter().map(|s| json!({"name": s.name, "offset": s.offset, "bytes": s.nbytes})).collect::<Vec<_>>(),
        "graphs": graphs,
        "plan": {
            "by_rows": h.plan.by_rows.iter().map(|&g| h.graphs[g as usize].name.clone()).collect::<Vec<_>>(),
            "kv_capacity": h.plan.kv_capacity,
            "block_len": h.plan.block_len,
            "spec_blocks": h.plan.spec_blocks,
            "activations": if h.plan.bf16_activations { "bf16" } else { "f32" },
        },
        "compile": h.compile,
    })
}

/// The human-readable form of [`inspect`]'s description.
pub fn render_text(d: &Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let m = &d["model"];
    let _ = writeln!(s, "llada artifact, format {}, {} bytes (checksums verified)", d["format"].as_str().unwrap_or("?"), d["file_bytes"]);
    let _ = writeln!(
        s,
        "model: d_model {} layers {} heads {}/{} (kv) head_dim {} mlp {} vocab {} embedding {} max_seq {}",
        m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["head_dim"], m["mlp_hidden"], m["vocab_size"],
        m["embedding_size"], m["max_sequence_length"]
    );
    let _ = writeln!(s, "special tokens: {}", d["special_tokens"]);
    let _ = writeln!(s, "compiled by {} for target {} from {}", d["compile"]["compiler"], d["compile"]["target"], d["compile"]["source"]);
    let _ = writeln!(s, "weights by dtype: {}", d["weight_bytes_by_dtype"]);
    let _ = writeln!(s, "\ntensors ({}):", d["tensors"].as_array().map_or(0, |a| a.len()));
    for t in d["tensors"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  {:<48} {:>12} {:<18} {:>12} B  [{}]", t["name"].as_str().unwrap_or(""), t["dtype"].as_str().unwrap_or(""),
            t["shape"].to_string(), t["bytes"], t["segment"].as_str().unwrap_or("-"));
    }
    let _ = writeln!(s, "\ngraphs ({}):", d["graphs"].as_array().map_or(0, |a| a.len()));
    for g in d["graphs"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  {:<16} rows {:>5} head rows {:>4} ops {:>5} values {:>5} window {:>12} B", g["name"].as_str().unwrap_or(""),
            g["rows"], g["head_rows"], g["ops"], g["values"], g["window_bytes"]);
    }
    let p = &d["plan"];
    let _ = writeln!(s, "\nplan: graphs by rows -> {}", p["by_rows"]);
    let _ = writeln!(s, "      KV cache {} positions, block {} x (1 + {} speculative), matmul activations {}", p["kv_capacity"], p["block_len"], p["spec_blocks"], p["activations"].as_str().unwrap_or("?"));
    s
}
