//! The swap-optimized window: a plan whose window cannot hold every weight (segments rotate
//! through slots, staged ahead by a thread or right before use) computes exactly what the
//! fully resident plan computes, bit for bit, on the embedded model and on a 1B-shape q4
//! checkpoint; a window too small for the minimum working set is refused with its sizes.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::kernels::cpu;
use llada_rt::staging::StagingMode;
use llada_rt::{generate, Model, SamplerParams, Session};
use llada_tools::checkpoint::{Shape, WeightType};
use lladac::Quant;

fn compile(model: &Path, out: &Path, quant: Option<Quant>, max_seq: u32, window_bytes: Option<u64>) {
    common::compile_quant(model, out, quant, max_seq, window_bytes);
}

/// What a run computes: first-pass logits and the tokens and reveals of two policies.
fn outputs(model: &Model, staging: StagingMode, prompt: &[u32], p: &SamplerParams) -> (Vec<f32>, Vec<(Vec<u32>, Vec<Vec<[u32; 2]>>)>) {
    let mut s = Session::with_options(model, 2, cpu::features(), staging).unwrap();
    let mask = model.header.special.mask;
    let seq: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, p.block_length)).collect();
    let logit_rows: Vec<u32> = (prompt.len() as u32..seq.len() as u32).collect();
    let logits = s.forward_full(&seq, &logit_rows).unwrap().to_vec();
    let mut runs = Vec::new();
    for policy in ["exact", "dual"] {
        let p = SamplerParams { policy: llada_rt::sampler::Policy::parse(policy).unwrap(), ..p.clone() };
        let g = generate(&mut s, prompt, &p, &mut |_| {}).unwrap();
        runs.push((g.output_ids, g.reveals));
    }
    if !model.header.plan.window.rotating.is_empty() {
        assert!(s.counters.staged_bytes > 0, "a swapping plan staged nothing");
    }
    (logits, runs)
}

fn window_plan_matches_resident(resident: &Path, swapped: &Path, prompt: &[u32], p: &SamplerParams) {
    let (a, b) = (Model::open(resident, true).unwrap(), Model::open(swapped, true).unwrap());
    assert!(a.header.plan.window.rotating.is_empty(), "the reference plan should keep every weight resident");
    assert!(b.header.plan.window.rotating.len() >= 2, "the small window should force segments to rotate");
    let want = outputs(&a, StagingMode::Async, prompt, p);
    for staging in [StagingMode::Async, StagingMode::Sync] {
        let got = outputs(&b, staging, prompt, p);
        let same_bits = want.0.len() == got.0.len() && want.0.iter().zip(&got.0).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same_bits, "{staging:?}: first-pass logits differ from the resident plan's");
        assert_eq!(want.1, got.1, "{staging:?}: tokens or reveals differ from the resident plan's");
    }
}

/// Compiles `ckpt` twice into `dir`: fully resident, and with a window of the resident
/// plan's fixed regions and half its weights. Returns (resident, swapped).
fn resident_and_swapped(dir: &Path, ckpt: &Path, quant: Option<Quant>, max_seq: u32) -> (PathBuf, PathBuf) {
    let (res, swap) = (dir.join("resident.lad"), dir.join("swap.lad"));
    compile(ckpt, &res, quant, max_seq, None);
    compile(ckpt, &swap, quant, max_seq, Some(common::half_the_weights(&res)));
    (res, swap)
}

#[test]
fn embedded_model_swapping_equals_resident() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let (res, swap) = resident_and_swapped(dir.path(), &ckpt, None, 256);
    let model = Model::open(&res, false).unwrap();
    let text = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let prompt = text.encode_chat("FILL:0022001000121700300003040240606040000020037096000250158001600037=").unwrap();
    window_plan_matches_resident(&res, &swap, &prompt, &SamplerParams { gen_length: 64, block_length: 32, steps: 16, ..Default::default() });
}

#[test]
fn llada_1b_shape_q4_swapping_equals_resident() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    common::checkpoint(&ckpt, Shape::llada_1b(), WeightType::Bf16, u64::MAX, 0.02);
    let (res, swap) = resident_and_swapped(dir.path(), &ckpt, Some(Quant::Q4 { group: 128 }), 64);
    std::fs::remove_dir_all(&ckpt).unwrap();
    // Few steps: random weights commit one token per pass anyway, and every pass already
    // stages every rotating segment.
    let prompt: Vec<u32> = (0..16u32).map(|i| 300 + i * 37).collect();
    window_plan_matches_resident(&res, &swap, &prompt, &SamplerParams { gen_length: 32, block_length: 32, steps: 4, ..Default::default() });
}

#[test]
fn a_window_below_the_minimum_working_set_is_refused_with_its_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let out = dir.path().join("m.lad");
    let o = common::run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--window-bytes", "4M"]);
    common::assert_clean_failure(&o, &["4.0 MiB window", "--window-bytes", "KV cache", "activations", "slots", "--max-seq", "--quant"]);
    assert!(common::leftovers(dir.path()).is_empty(), "a failed compile left files behind");
    let o = common::run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--window-bytes", "2X"]);
    common::assert_clean_failure(&o, &["--window-bytes", "2X"]);
}

#[test]
fn phone_targets_plan_and_label_their_estimates() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    for target in ["sm8650", "sm8750", "dimensity9400"] {
        let out = dir.path().join(format!("{target}.lad"));
        // The host stand-in of a Snapdragon target (its q4 weights are not yet an NPU's).
        let mut args = vec!["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--target", target, "--quant", "q4"];
        if target.starts_with("sm") {
            args.push("--host-only");
        }
        let o = common::run("lladac", &args);
        assert!(o.status.success(), "{target}: {}", String::from_utf8_lossy(&o.stderr));
        let m = Model::open(&out, true).unwrap();
        assert_eq!(m.header.plan.window.kv_dtype, llada_ir::KvDType::F16, "{target}: phones keep an f16 KV cache");
        assert!(m.header.plan.latency_target.contains("estimate"), "{target}: {}", m.header.plan.latency_target);
        let o = common::run("lladac", &["inspect", out.to_str().unwrap(), "--estimate", "--policy", "dual", "--gen-len", "64", "--steps", "64"]);
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && text.contains("ESTIMATE") && text.contains("generation (dual policy"), "{target}: {text}");
        // A phone artifact runs on the host under the same plan (f16 KV cache).
        let o = common::run("llada-rt", &["run", out.to_str().unwrap(), "--chat", "-p", "FILL:30007050=", "--gen-len", "32", "--steps", "32"]);
        assert!(o.status.success(), "{target}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// `inspect --estimate` of a Snapdragon artifact built without its NPU executables: the
/// contexts lladac would build (rotating through a window too small for all), created before
/// every pass and counted in the generation; mbsd's passes from a measured count; another
/// Snapdragon's rates for the same plan; each bad combination one error naming the flag.
#[test]
fn npu_estimates_count_the_contexts_created_each_pass_and_mbsd_passes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let estimate = |art: &std::path::Path, extra: &[&str]| -> (std::process::Output, serde_json::Value) {
        let mut args = vec!["inspect", art.to_str().unwrap(), "--json", "--estimate", "--gen-len", "64", "--steps", "64"];
        args.extend_from_slice(extra);
        let o = common::run("lladac", &args);
        let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
        (o, v["estimate"].clone())
    };
    let build = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec!["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--target", "sm8750", "--quant", "q4", "--host-only", "--max-seq", "128"];
        args.extend_from_slice(extra);
        let o = common::run("lladac", &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    };
    let roomy = build("roomy.lad", &[]);
    // The defaults keep to the plan: no 128-row pass and no 160-position generation on its
    // 128 positions, each said in a note; asked for, one error.
    let o = common::run("lladac", &["inspect", roomy.to_str().unwrap(), "--json", "--estimate"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let notes = d["estimate"]["notes"].as_array().unwrap();
    assert!(d["estimate"]["generation"].is_null() && notes.iter().any(|n| n.as_str().unwrap().contains("generation not estimated")), "{}", d["estimate"]);
    assert_eq!(d["estimate"]["passes"].as_array().unwrap().iter().map(|p| p["rows"].as_u64().unwrap()).collect::<Vec<_>>(), [32, 64, 128]);
    let o = common::run("lladac", &["inspect", roomy.to_str().unwrap(), "--estimate", "--gen-len", "256"]);
    common::assert_clean_failure(&o, &["no graph of the plan holds"]);
    let (o, e) = estimate(&roomy, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!((e["npu"]["contexts"].as_u64(), e["npu"]["created_per_pass"].as_u64()), (Some(1), Some(0)), "{}", e["npu"]);
    assert!(e["npu"]["source"].as_str().unwrap().starts_with("predicted"), "{}", e["npu"]);
    // A phone granting one session with room for few of the contexts: what does not fit
    // rotates, created every pass.
    let tight = build("tight.lad", &[]);
    let one = ["--npu-sessions", "1", "--npu-session-bytes", "3000K"];
    let estimate = |art: &std::path::Path, extra: &[&str]| estimate(art, &[&one[..], extra].concat());
    let (o, e) = estimate(&tight, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (contexts, created) = (e["npu"]["contexts"].as_u64().unwrap(), e["npu"]["created_per_pass"].as_u64().unwrap());
    assert!(contexts > 1 && created > 0 && created <= contexts, "{}", e["npu"]);
    let g = &e["generation"];
    let passes = g["forward_passes"].as_u64().unwrap();
    assert_eq!(passes, 64);
    assert_eq!(g["npu_contexts_created"].as_u64(), Some(created * passes), "{g}");
    assert_eq!(g["npu_bytes_staged"].as_u64(), Some(e["npu"]["bytes_per_pass"].as_u64().unwrap() * passes), "{g}");
    assert!(g["staging_seconds"].as_f64().unwrap() > 0.0 && g["seconds"].as_f64().unwrap() > g["staging_seconds"].as_f64().unwrap(), "{g}");
    // mbsd: a whole-sequence pass, then block-sized ones; fewer when measured so.
    let (_, m) = estimate(&tight, &["--policy", "mbsd"]);
    assert_eq!(m["generation"]["forward_passes"].as_u64(), Some(64), "{m}");
    let (_, fewer) = estimate(&tight, &["--policy", "mbsd", "--passes", "34"]);
    assert_eq!(fewer["generation"]["forward_passes"].as_u64(), Some(34));
    assert!(fewer["generation"]["seconds"].as_f64().unwrap() < m["generation"]["seconds"].as_f64().unwrap());
    // Another Snapdragon's rates over the same plan; the labels say whose.
    let (o, other) = estimate(&tight, &["--on-target", "sm8850"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(other["label"].as_str().unwrap().contains("sm8850") && other["compiled_for"] == "sm8750", "{other}");
    let (o, _) = estimate(&tight, &["--on-target", "host"]);
    common::assert_clean_failure(&o, &["--on-target host", "compile for host"]);
    let (o, _) = estimate(&tight, &["--passes", "10"]);
    common::assert_clean_failure(&o, &["--passes", "mbsd"]);
    let (o, _) = estimate(&tight, &["--policy", "mbsd", "--passes", "65"]);
    common::assert_clean_failure(&o, &["--passes 65", "1 to --steps (64)"]);
}

/// `run --trace` writes a Chrome trace in which the staging thread's copies run during dense
/// passes. Not a timing check: by the swap protocol, a pass's copies after its first two
/// start when one of its ops releases a slot and end before one of its ops needs the segment.
#[test]
fn the_trace_shows_copies_inside_dense_passes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let (_, swap) = resident_and_swapped(dir.path(), &ckpt, None, 256);
    let trace = dir.path().join("trace.json");
    let o = common::run("llada-rt", &["run", swap.to_str().unwrap(), "--chat", "-p", "FILL:30007050=", "--gen-len", "32", "--steps", "8", "--trace", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let spans = |tid: u64, prefix: &str| -> Vec<(f64, f64)> {
        v["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X" && e["tid"] == tid && e["name"].as_str().unwrap().starts_with(prefix))
            .map(|e| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap()))
            .collect()
    };
    let (passes, copies) = (spans(1, "pass"), spans(2, "copy"));
    let rotating = Model::open(&swap, false).unwrap().header.plan.window.rotating.len();
    assert_eq!(passes.len(), 8);
    let inside = copies.iter().filter(|c| passes.iter().any(|p| p.0 <= c.0 && c.1 <= p.1)).count();
    assert!(inside >= passes.len() * (rotating - 2), "{inside} of {} copies inside the {} passes", copies.len(), passes.len());
}
