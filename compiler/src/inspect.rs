//! `lladac inspect`: what an artifact holds, for people (`text`) and scripts (`--json`).

use std::fmt::Write;
use std::path::Path;

use llada_ir::{Artifact, Header, Rows};
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// Maps and fully verifies an artifact, then describes it.
pub fn inspect(path: &Path) -> Result<Value> {
    let (header, major, minor, bytes) = open(path)?;
    Ok(describe(&header, major, minor, bytes))
}

/// Maps and fully verifies an artifact: its header, format version and size.
pub fn open(path: &Path) -> Result<(Header, u16, u16, u64)> {
    let file = llada_ir::files::open_regular(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: read-only map of a file we only read; a concurrent writer could change bytes
    // under us, which the checksum pass below would then report.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let wrap = |source| Error::Artifact { path: path.to_path_buf(), source };
    let art = Artifact::parse(&map).map_err(wrap)?;
    art.verify_data().map_err(wrap)?;
    Ok((art.header, art.preamble.major, art.preamble.minor, map.len() as u64))
}

/// Everything in the window, by offset: what lives there, its bytes and its lifetime.
fn window_map(h: &Header) -> Vec<Value> {
    let w = &h.plan.window;
    let seg = |s: u32| &h.segments[s as usize];
    let mut rows = vec![
        json!({"offset": w.kv.offset, "bytes": w.kv.bytes, "lifetime": "session", "what": format!("KV cache: {} positions x {} layers, {}", h.plan.kv_capacity, h.model.n_layers, w.kv_dtype.name())}),
        json!({"offset": w.activations.offset, "bytes": w.activations.bytes, "lifetime": "per op (each graph's values, planned by lifetime)", "what": "activations"}),
        json!({"offset": w.scratch.gemm_operand.offset, "bytes": w.scratch.gemm_operand.bytes, "lifetime": "per op", "what": "scratch: prepared GEMM operand"}),
        json!({"offset": w.scratch.attention.offset, "bytes": w.scratch.attention.bytes, "lifetime": "per op", "what": format!("scratch: attention scores for {} threads{}", w.scratch.threads, if w.kv_dtype == llada_ir::KvDType::F32 { "" } else { " + one layer's KV widened to f32" })}),
    ];
    for r in &w.resident {
        rows.push(json!({"offset": r.offset, "bytes": seg(r.segment).nbytes, "lifetime": "session", "what": format!("resident segment '{}'", seg(r.segment).name)}));
    }
    for (i, s) in w.slots.iter().enumerate() {
        let held: Vec<&str> = w.rotating.iter().enumerate().filter(|(j, _)| j % w.slots.len() == i).map(|(_, &r)| seg(r).name.as_str()).collect();
        rows.push(json!({"offset": s.offset, "bytes": s.bytes, "lifetime": "per segment (swap schedule)", "what": format!("slots[{i}]: {} rotating segments ({} .. {})", held.len(), held.first().unwrap_or(&"-"), held.last().unwrap_or(&"-"))}));
    }
    let x = &w.experts;
    if x.region.bytes > 0 {
        let what = format!("expert slots: {} layers x {} slots of {} B, for {} experts a layer", h.model.moe_layers(), x.slots_per_layer, x.slot_bytes, x.per_layer);
        rows.push(json!({"offset": x.region.offset, "bytes": x.region.bytes, "lifetime": "session (an expert cache the runtime fills)", "what": what}));
    }
    rows.sort_by_key(|r| r["offset"].as_u64());
    rows
}

pub fn describe(h: &Header, major: u16, minor: u16, file_bytes: u64) -> Value {
    let tensors: Vec<Value> = h
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({
                "name": t.name, "dtype": t.dtype.name(), "shape": t.shape, "bytes": t.nbytes,
                "offset": t.offset, "segment": h.segment_of(i as u32).map(|s| h.segments[s as usize].name.clone()),
            })
        })
        .collect();
    let graphs: Vec<Value> = h
        .graphs
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let logit_values = g.values.iter().filter(|v| v.rows == Rows::Logits).count();
            json!({
                "name": g.name, "rows": g.rows, "logit_rows": g.logit_rows, "ops": g.ops.len(),
                "values": g.values.len(), "logit_values": logit_values, "activation_bytes": g.window_bytes,
                "staged_bytes_per_pass": crate::window::staged_bytes(h, g),
                "staging": g.staging.iter().map(|st| json!({
                    "segment": h.segments[h.plan.window.rotating[st.rotating as usize] as usize].name, "slot": st.slot,
                    "stage_after_op": st.stage_after_op, "first_op": st.first_op, "last_op": st.last_op,
                })).collect::<Vec<_>>(),
                "predicted_seconds": h.plan.latency.get(i),
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
        "sections": std::iter::once(json!({"kind": llada_ir::sections::CORE, "version": llada_ir::sections::CORE_VERSION, "required": true}))
            .chain(h.extensions.iter().map(|e| json!({"kind": e.key, "version": e.version, "required": e.required, "bytes": e.bytes.len()})))
            .collect::<Vec<_>>(),
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
            "row_buckets": h.plan.row_buckets,
            "activations": if h.plan.bf16_activations { "bf16" } else { "f32" },
            "activation_scales": h.plan.activation_scales.name(),
            "latency_target": h.plan.latency_target,
        },
        "window": {
            "bytes": h.plan.window.bytes,
            "used_bytes": window_map(h).iter().map(|r| r["offset"].as_u64().unwrap_or(0) + r["bytes"].as_u64().unwrap_or(0)).max().unwrap_or(0),
            "kv_dtype": h.plan.window.kv_dtype.name(),
            "resident_segments": h.plan.window.resident.iter().map(|r| h.segments[r.segment as usize].name.clone()).collect::<Vec<_>>(),
            "rotating_segments": h.plan.window.rotating.iter().map(|&r| h.segments[r as usize].name.clone()).collect::<Vec<_>>(),
            "host_segments": h.plan.window.host.iter().map(|&r| h.segments[r as usize].name.clone()).collect::<Vec<_>>(),
            "map": window_map(h),
            "experts": h.model.moe.map(|moe| json!({
                "per_layer": moe.experts,
                "top_k": moe.top_k,
                "slots_per_layer": h.plan.window.experts.slots_per_layer,
                "slot_bytes": h.plan.window.experts.slot_bytes,
                "costs": {
                    "accelerator": {"weight_seconds": h.plan.window.experts.costs.accelerator.weight_seconds, "row_seconds": h.plan.window.experts.costs.accelerator.row_seconds},
                    "cpu": {"weight_seconds": h.plan.window.experts.costs.cpu.weight_seconds, "row_seconds": h.plan.window.experts.costs.cpu.row_seconds},
                    "stage_seconds": h.plan.window.experts.costs.stage_seconds,
                },
            })),
        },
        "compile": h.compile,
        "npu": npu(h),
    })
}

/// The NPU executables (`null` when the artifact has none): the SoC, and each context with its
/// bytes and the planned graphs it runs.
fn npu(h: &Header) -> Value {
    let Ok(Some(n)) = llada_ir::npu::NpuSection::of(h) else {
        return Value::Null;
    };
    let arch = llada_ir::npu::SOCS.iter().find(|s| s.0 == n.soc).map_or("?", |s| s.2);
    json!({
        "backend": "qnn",
        "section_version": n.version,
        "soc": n.soc,
        "soc_id": n.soc_id,
        "htp_arch": arch,
        "qnn_build": n.qnn_build,
        "weights": n.weights.name(),
        "shared_weights": n.shared_weights,
        "activations": if n.activations.is_empty() { "fp16" } else { "uint16" },
        "calibration": n.calibration,
        "activation_ranges": n.activations.iter().map(|a| json!({"weight": h.tensors[a.weight as usize].name, "input": a.input, "output": a.output})).collect::<Vec<_>>(),
        "estimates": n.estimates.iter().map(|e| json!({
            "graph": h.graphs[e.graph as usize].name, "layers": e.layers, "cache_len": e.cache_len, "soc_id": e.soc_id, "cycles": e.cycles, "micros": e.micros,
            "groups": e.groups.iter().map(|g| json!({"kind": g.kind.name(), "busy_micros": g.busy_micros, "ops": g.ops})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "io": {"bytes": n.io.bytes, "regions": n.io.regions.iter().map(|r| json!({"kind": format!("{:?}", r.kind), "offset": r.offset, "bytes": r.bytes})).collect::<Vec<_>>()},
        "context_budget": n.context_budget,
        "cache_lens": n.cache_lens,
        "window_bytes": h.plan.window.bytes,
        "limits": {"mapping_bytes": n.limits.mapping_bytes, "session_bytes": n.limits.session_bytes, "sessions": n.limits.sessions},
        "sessions": n.sessions.iter().enumerate().map(|(si, x)| {
            let held: u64 = n.contexts.iter().filter(|c| c.session as usize == si).map(|c| h.segments[c.segment as usize].nbytes).sum();
            json!({"io_bytes": x.io_bytes, "spill_fill_bytes": x.spill_fill_bytes, "context_bytes": held})
        }).collect::<Vec<_>>(),
        "contexts": n.contexts.iter().map(|c| {
            let seg = &h.segments[c.segment as usize];
            json!({
                "soc": n.soc,
                "segment": seg.name,
                "bytes": seg.nbytes,
                "crc32": c.crc32,
                "layers": c.layers,
                "resident": c.resident,
                "session": c.session,
                "mapping_bytes": seg.nbytes,
                "spill_fill_bytes": c.spill_fill_bytes,
                "graphs": c.graphs.iter().map(|g| json!({
                    "name": g.name, "graph": h.graphs[g.graph as usize].name, "ops": g.ops, "cache_len": g.cache_len,
                    "inputs": g.inputs.len(), "outputs": g.outputs.len(),
                })).collect::<Vec<_>>(),
            })
        }).collect::<Vec<_>>(),
    })
}

/// The human-readable form of [`inspect`]'s description.
pub fn render_text(d: &Value) -> String {
    let mut s = String::new();
    write_summary(&mut s, d);
    write_tensors(&mut s, d);
    write_graphs(&mut s, d);
    write_window(&mut s, d);
    write_npu(&mut s, &d["npu"]);
    write_plan(&mut s, &d["plan"]);
    s
}

fn mib(v: &Value) -> f64 {
    v.as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64
}

/// The report's head: the file, the model's shape, the sections, tokens, provenance and
/// weight bytes.
fn write_summary(s: &mut String, d: &Value) {
    let m = &d["model"];
    let _ = writeln!(s, "llada artifact, format {}, {} bytes (checksums verified)", d["format"].as_str().unwrap_or("?"), d["file_bytes"]);
    let _ = writeln!(
        s,
        "model: d_model {} layers {} heads {}/{} (kv) head_dim {} mlp {} vocab {} embedding {} max_seq {}",
        m["d_model"], m["n_layers"], m["n_heads"], m["n_kv_heads"], m["head_dim"], m["mlp_hidden"], m["vocab_size"],
        m["embedding_size"], m["max_sequence_length"]
    );
    let sections: Vec<String> = d["sections"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| format!("{} v{}{}", x["kind"].as_str().unwrap_or("?"), x["version"], if x["required"] == true { " (required)" } else { " (optional)" }))
        .collect();
    let _ = writeln!(s, "sections: {}", sections.join(", "));
    let _ = writeln!(s, "special tokens: {}", d["special_tokens"]);
    let _ = writeln!(s, "compiled by {} for target {} from {}", d["compile"]["compiler"], d["compile"]["target"], d["compile"]["source"]);
    // A GGUF source: its quantization, and what each of its types became.
    let gguf = d["compile"]["options"].as_array().into_iter().flatten().find(|o| o[0] == "gguf").and_then(|o| o[1].as_str());
    if let Some(g) = gguf {
        let _ = writeln!(s, "GGUF weights: {g}");
    }
    let _ = writeln!(s, "weights by dtype: {}", d["weight_bytes_by_dtype"]);
}

/// A line a tensor; experts after a layer's first as one line: they repeat its shapes.
fn write_tensors(s: &mut String, d: &Value) {
    let _ = writeln!(s, "\ntensors ({}):", d["tensors"].as_array().map_or(0, |a| a.len()));
    let mut skipped: Option<(String, usize)> = None;
    for t in d["tensors"].as_array().into_iter().flatten() {
        let segment = t["segment"].as_str().unwrap_or("-");
        let later_expert = segment.split_once(".experts.").filter(|(_, e)| *e != "0").map(|(layer, _)| layer.to_string());
        if let Some(layer) = later_expert {
            let count = skipped.take().filter(|(l, _)| *l == layer).map_or(0, |(_, n)| n);
            skipped = Some((layer, count + 1));
            continue;
        }
        if let Some((layer, n)) = skipped.take() {
            let _ = writeln!(s, "  ... {n} more tensors of {layer}'s other experts, shaped as expert 0's");
        }
        let _ = writeln!(s, "  {:<48} {:>12} {:<18} {:>12} B  [{}]", t["name"].as_str().unwrap_or(""), t["dtype"].as_str().unwrap_or(""),
            t["shape"].to_string(), t["bytes"], segment);
    }
}

fn write_graphs(s: &mut String, d: &Value) {
    let _ = writeln!(s, "\ngraphs ({}; latency predicted for {}):", d["graphs"].as_array().map_or(0, |a| a.len()), d["plan"]["latency_target"].as_str().unwrap_or("-"));
    for g in d["graphs"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  {:<16} rows {:>5} logit rows {:>4} ops {:>5} values {:>5} activations {:>12} B staged/pass {:>12} B predicted {:.4} s", g["name"].as_str().unwrap_or(""),
            g["rows"], g["logit_rows"], g["ops"], g["values"], g["activation_bytes"], g["staged_bytes_per_pass"], g["predicted_seconds"].as_f64().unwrap_or(f64::NAN));
    }
}

/// The window's map by offset, and the experts' pools and costs.
fn write_window(s: &mut String, d: &Value) {
    let w = &d["window"];
    let _ = writeln!(s, "\nwindow: {:.1} MiB of {:.1} MiB used; KV {}; {} resident segments, {} rotating, host-side: {}",
        mib(&w["used_bytes"]), mib(&w["bytes"]), w["kv_dtype"].as_str().unwrap_or("?"),
        w["resident_segments"].as_array().map_or(0, |a| a.len()), w["rotating_segments"].as_array().map_or(0, |a| a.len()), w["host_segments"]);
    for r in w["map"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  {:>14} {:>14} B  {:<48} {}", r["offset"], r["bytes"], r["what"].as_str().unwrap_or(""), r["lifetime"].as_str().unwrap_or(""));
    }
    let x = &w["experts"];
    if !x.is_null() {
        let _ = writeln!(
            s,
            "experts: {} a layer, top {}; {} slots a layer ({:.1} MiB each) hold {:.0}% of them; one expert costs {:.2e} s + {:.2e} s/row on the accelerator, {:.2e} s + {:.2e} s/row on the CPU, {:.2e} s to stage",
            x["per_layer"], x["top_k"], x["slots_per_layer"], mib(&x["slot_bytes"]),
            100.0 * x["slots_per_layer"].as_f64().unwrap_or(0.0) / x["per_layer"].as_f64().unwrap_or(1.0),
            x["costs"]["accelerator"]["weight_seconds"].as_f64().unwrap_or(0.0), x["costs"]["accelerator"]["row_seconds"].as_f64().unwrap_or(0.0),
            x["costs"]["cpu"]["weight_seconds"].as_f64().unwrap_or(0.0), x["costs"]["cpu"]["row_seconds"].as_f64().unwrap_or(0.0),
            x["costs"]["stage_seconds"].as_f64().unwrap_or(0.0)
        );
    }
}

/// The NPU executables (nothing where there are none): the SoC and build, the calibrated
/// activation ranges, the sessions and I/O allocation, and each context.
fn write_npu(s: &mut String, n: &Value) {
    if n.is_null() {
        return;
    }
    let _ = writeln!(
        s,
        "\nNPU executables: QNN HTP for {} (socModel {}, {}), prepared by QNN {}; matmul weights {}, activations {}",
        n["soc"].as_str().unwrap_or("?"),
        n["soc_id"],
        n["htp_arch"].as_str().unwrap_or("?"),
        n["qnn_build"].as_str().unwrap_or("?"),
        n["weights"].as_str().unwrap_or("?"),
        n["activations"].as_str().unwrap_or("?")
    );
    if let Some(ranges) = n["activation_ranges"].as_array().filter(|r| !r.is_empty()) {
        // The span of the ranges: the narrowest and widest a matmul's input and output cover.
        let width = |r: &Value| r[1].as_f64().unwrap_or(0.0) - r[0].as_f64().unwrap_or(0.0);
        let span = |key: &str| {
            let w: Vec<f64> = ranges.iter().map(|a| width(&a[key])).collect();
            (w.iter().copied().fold(f64::INFINITY, f64::min), w.iter().copied().fold(0.0, f64::max))
        };
        let ((ilo, ihi), (olo, ohi)) = (span("input"), span("output"));
        let _ = writeln!(
            s,
            "  16-bit activation ranges of {} matmuls, calibrated on {}: inputs {:.3}..{:.3} wide, outputs {:.3}..{:.3} wide (`--json`: each)",
            ranges.len(),
            n["calibration"].as_str().unwrap_or("?"),
            ilo,
            ihi,
            olo,
            ohi
        );
    }
    let l = &n["limits"];
    let _ = writeln!(
        s,
        "  planned for {} HTP session(s) of {:.1} MiB, each context and the I/O one mapping of at most {:.1} MiB; contexts may use {:.1} MiB at once",
        l["sessions"], mib(&l["session_bytes"]), mib(&l["mapping_bytes"]), mib(&n["context_budget"])
    );
    let _ = writeln!(s, "  attention built for cache lengths {} (a pass runs the smallest that holds its keys)", n["cache_lens"]);
    for (si, x) in n["sessions"].as_array().into_iter().flatten().enumerate() {
        let _ = writeln!(s, "  session {si}: {:.1} MiB of contexts, {:.1} MiB of the I/O allocation bound, a {:.1} MiB spill-fill buffer its contexts share", mib(&x["context_bytes"]), mib(&x["io_bytes"]), mib(&x["spill_fill_bytes"]));
    }
    let regions: Vec<String> = n["io"]["regions"].as_array().into_iter().flatten().map(|r| format!("{} @{} ({} B)", r["kind"].as_str().unwrap_or("?"), r["offset"], r["bytes"])).collect();
    let _ = writeln!(s, "  I/O allocation {:.1} MiB, a descriptor per tensor: {}", mib(&n["io"]["bytes"]), regions.join(", "));
    let _ = writeln!(
        s,
        "  {}",
        if n["shared_weights"].as_bool() == Some(true) {
            "row buckets share their weights in each context (the phone's form; QNN's x86-64 simulator cannot load it)"
        } else {
            "each row bucket carries its own weights (loads on the simulator and on a phone)"
        }
    );
    for c in n["contexts"].as_array().into_iter().flatten() {
        write_npu_context(s, c);
    }
}

/// One NPU context: its layers, session, mapping, whether it stays, and its executables.
fn write_npu_context(s: &mut String, c: &Value) {
    let executables = c["graphs"].as_array().map_or(0, |g| g.len());
    let mut graphs: Vec<&str> = c["graphs"].as_array().into_iter().flatten().filter_map(|g| g["graph"].as_str()).collect();
    graphs.dedup();
    let _ = writeln!(
        s,
        "  context '{}' for {}: layers {}..{}, session {}, mapping {:.1} MiB, {}, {} executables of {} graphs: {}",
        c["segment"].as_str().unwrap_or("?"),
        c["soc"].as_str().unwrap_or("?"),
        c["layers"][0],
        c["layers"][1],
        c["session"],
        mib(&c["mapping_bytes"]),
        if c["resident"].as_bool() == Some(true) { "resident (created once)" } else { "rotating (created every pass)" },
        executables,
        graphs.len(),
        graphs.join(", ")
    );
    if executables > graphs.len() {
        let _ = writeln!(s, "    each graph cut at its MoE layers: the routers and routed experts run on the CPU between its executables");
    }
}

fn write_plan(s: &mut String, p: &Value) {
    let _ = writeln!(s, "\nplan: graphs by rows -> {}", p["by_rows"]);
    let _ = writeln!(s, "      row-set latency buckets (rows) -> {}", p["row_buckets"]);
    let _ = writeln!(s, "      KV cache {} positions, block {} x (1 + {} speculative), matmul activations {} (int8 scales per {})", p["kv_capacity"], p["block_len"], p["spec_blocks"], p["activations"].as_str().unwrap_or("?"), p["activation_scales"].as_str().unwrap_or("?"));
}
