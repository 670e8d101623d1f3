//! The QNN HTP library through `llada-rt qnn-info`: what a machine without it is told, and
//! (with `LLADA_QNN_LIB` naming `tools/qnn/fetch.sh`'s folder, as CI sets it) the pinned
//! library loaded through the runtime's own declarations of its ABI.

mod common;

use std::process::Command;

#[test]
fn without_the_library_one_line_says_how_to_get_it_and_the_status_is_2() {
    let empty = tempfile::tempdir().unwrap();
    for args in [&["qnn-info"][..], &["qnn-info", "--qnn-lib", empty.path().to_str().unwrap()]] {
        let out = Command::new(common::bin("llada-rt")).args(args).env_remove("LLADA_QNN_LIB").output().unwrap();
        common::assert_clean_failure(&out, &["libQnnHtp.so", "tools/qnn/fetch.sh", "QAIRT SDK"]);
        assert_eq!(out.status.code(), Some(2));
    }
}

#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_pinned_library_reports_its_versions_and_keeps_stdout_json() {
    assert!(std::env::var_os("LLADA_QNN_LIB").is_some(), "set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder");
    let out = Command::new(common::bin("llada-rt")).args(["qnn-info", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The library prints a line of its own to C's stdout; the JSON must stay alone there.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["provider"], "HTP_QTI_AISW");
    assert_eq!(v["backend_id"], 6);
    assert_eq!(v["core_api"], "2.40.0");
    assert_eq!(v["backend_api"], "5.51.0");
    assert!(v["build_id"].as_str().unwrap().starts_with("v2.51.0"), "{v}");
}

// ---- The NPU backend end to end (on QNN's x86-64 simulator, through `LLADA_QNN_LIB`). ----

use std::path::{Path, PathBuf};
use std::sync::Arc;

use llada_ir::npu::NpuSection;
use llada_ir::Header;
use llada_rt::executor::{self, Backend};
use llada_rt::kernels::cpu;
use llada_rt::params::Policy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::text::Text;
use llada_rt::{generate, Model, SamplerParams, Session};

const NEEDS_QNN: &str = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)";

fn lib() -> String {
    std::env::var("LLADA_QNN_LIB").expect("set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder")
}

/// `lladac compile` of `model` for `target` into `out`, with the library: its output.
fn compile_output(model: &Path, target: &str, out: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["compile", "--model", model.to_str().unwrap(), "--target", target, "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    Command::new(common::bin("lladac")).args(&args).env("LLADA_QNN_LIB", lib()).output().unwrap()
}

/// `lladac inspect --json` of `art`, which must succeed (it verifies the artifact).
fn inspect_json(art: &Path) -> serde_json::Value {
    let o = common::run("lladac", &["inspect", art.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "lladac inspect {}: {}", art.display(), String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `model` compiled for `target` into `out` by the `lladac` command.
fn lladac(model: &Path, target: &str, out: &Path, extra: &[&str]) {
    let o = compile_output(model, target, out, extra);
    assert!(o.status.success(), "lladac compile {} for {target} {extra:?}: {}", model.display(), String::from_utf8_lossy(&o.stderr));
}

fn embedded_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks")
}

/// The embedded model for SM8650, 128 positions (the chat prompt and 32 tokens).
fn embedded_npu(dir: &Path) -> PathBuf {
    let out = dir.join("embedded-sm8650.lad");
    lladac(&embedded_model(), "sm8650", &out, &["--max-seq", "160"]);
    out
}

fn session<'m>(model: &'m Model, backend: &'static Backend) -> Session {
    Session::with_backend(model, backend, 2, cpu::features(), StagingMode::Async, ExpertOptions::default()).unwrap()
}

fn prompt(model: &Model) -> Vec<u32> {
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    text.encode_chat("FILL:0022001000121700300003040240606040000020037096000250158001600037=").unwrap()
}

fn edit_section(h: &mut Header, edit: impl FnOnce(&mut NpuSection)) {
    let mut s = NpuSection::of(h).unwrap().unwrap();
    edit(&mut s);
    h.extensions.iter_mut().find(|e| e.key == llada_ir::npu::EXTENSION_KEY).unwrap().bytes = s.encode();
}

/// The artifact `good` with its NPU section edited by `edit`, written to `dir/name`:
/// `lladac inspect` (which verifies it) must refuse it, saying `words`.
fn refused_when_edited(dir: &Path, good: &[u8], name: &str, edit: &dyn Fn(&mut NpuSection), words: &[&str]) {
    let bytes = common::reseal(good, |h| edit_section(h, edit));
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    common::assert_clean_failure(&common::run("lladac", &["inspect", p.to_str().unwrap()]), words);
}

/// `llada-rt run --backend qnn` on `art`: its output.
fn run_qnn(art: &Path, env_lib: bool) -> std::process::Output {
    let mut c = Command::new(common::bin("llada-rt"));
    c.args(["run", art.to_str().unwrap(), "--backend", "qnn", "-p", "FILL:1=", "--gen-len", "32", "--steps", "4"]);
    if env_lib {
        c.env("LLADA_QNN_LIB", lib());
    } else {
        c.env_remove("LLADA_QNN_LIB");
    }
    c.output().unwrap()
}

#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn one_model_compiles_for_every_snapdragon_and_inspect_lists_its_contexts() {
    let _ = NEEDS_QNN;
    let dir = tempfile::tempdir().unwrap();
    let mut binaries = Vec::new();
    for (soc, id) in [("sm8550", 43), ("sm8650", 57), ("sm8750", 69), ("sm8850", 87)] {
        let out = dir.path().join(format!("{soc}.lad"));
        lladac(&embedded_model(), soc, &out, &["--max-seq", "64"]);
        let v = inspect_json(&out);
        let npu = &v["npu"];
        assert_eq!((npu["soc"].as_str(), npu["soc_id"].as_u64()), (Some(soc), Some(id)), "{npu}");
        let contexts = npu["contexts"].as_array().unwrap();
        assert!(!contexts.is_empty());
        let graphs: usize = contexts.iter().map(|c| c["graphs"].as_array().unwrap().len()).sum();
        assert_eq!(graphs, v["graphs"].as_array().unwrap().len(), "every planned graph has an executable");
        for c in contexts {
            assert_eq!(c["soc"].as_str(), Some(soc));
            assert!(c["bytes"].as_u64().unwrap() > 0);
        }
        let text = common::run("lladac", &["inspect", out.to_str().unwrap()]);
        assert!(String::from_utf8_lossy(&text.stdout).contains(&format!("NPU executables: QNN HTP for {soc}")));
        let file = std::fs::read(&out).unwrap();
        let h = common::stored_header(&file);
        let seg = &h.segments[NpuSection::of(&h).unwrap().unwrap().contexts[0].segment as usize];
        binaries.push(file[4096 + seg.offset as usize..][..seg.nbytes as usize].to_vec());
    }
    // Four SoCs, four different preparations of the same graphs.
    for i in 0..binaries.len() {
        for j in i + 1..binaries.len() {
            assert_ne!(binaries[i], binaries[j], "the binaries for two SoCs are identical");
        }
    }
}

/// `--quant q8|q4` for an NPU target: int8 or int4 weights per output channel inside the
/// executables (inspect says which; the binaries shrink accordingly), and the quantized NPU
/// path still answers the embedded model's task as the f32 host does.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn quantized_npu_weights_are_int8_and_int4_and_still_answer() {
    let dir = tempfile::tempdir().unwrap();
    let host = Model::open(&common::embedded(dir.path()), true).unwrap();
    let p0 = prompt(&host);
    let p = SamplerParams { gen_length: 32, block_length: 32, steps: 32, policy: Policy::Dual, ..Default::default() };
    let want = generate(&mut session(&host, &executor::host::BACKEND), &p0, &p, &mut |_| {}).unwrap();
    let mut sizes = Vec::new();
    // q4's default, int4 per block between 16-bit activations, is the next test's; with fp16
    // activations q4 is int4 per output channel.
    for (quant, format, extra) in [("f16", "fp16", None), ("q8", "int8 per output channel", None), ("q4", "int4 per output channel", Some("f16"))] {
        let out = dir.path().join(format!("sm8750-{quant}-{}.lad", extra.unwrap_or("default")));
        let mut args = vec!["--max-seq", "128", "--quant", quant];
        if let Some(a) = extra {
            args.extend(["--npu-activations", a]);
        }
        lladac(&embedded_model(), "sm8750", &out, &args);
        let v = inspect_json(&out);
        assert_eq!(v["npu"]["weights"].as_str(), Some(format), "{quant}");
        sizes.push(v["npu"]["contexts"].as_array().unwrap().iter().map(|c| c["bytes"].as_u64().unwrap()).sum::<u64>());
        if quant == "f16" {
            // Its tokens are checked by every policy's test.
            continue;
        }
        let model = Model::open(&out, true).unwrap();
        let got = generate(&mut session(&model, &executor::qnn::BACKEND), &p0, &p, &mut |_| {}).unwrap();
        assert_eq!(got.output_ids, want.output_ids, "{quant} on the NPU does not answer as the host does");
    }
    assert!(sizes[0] > sizes[1] && sizes[1] > sizes[2], "binary bytes f16, q8, q4: {sizes:?}");
}

/// `--quant q4`'s NPU form (`--npu-activations u16`, the default with q4): int4 per block
/// (LPBQ) in a 1x1 convolution between 16-bit activations whose ranges `lladac` calibrates on
/// the host kernels (a task file here, the built-in set by default), records for every matmul,
/// verifies and shows; the NPU then answers the embedded model's task as the host's q4 does.
/// Bad flags and crafted ranges are one error each, naming the flag or the element.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn sixteen_bit_activations_with_block_scaled_int4_are_calibrated_recorded_and_answer() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tasks/train-sample.jsonl");
    let out = dir.path().join("lpbq.lad");
    lladac(&embedded_model(), "sm8750", &out, &["--max-seq", "128", "--quant", "q4", "--npu-activations", "u16", "--calibration", tasks.to_str().unwrap()]);
    let v = inspect_json(&out);
    let npu = &v["npu"];
    assert_eq!((npu["weights"].as_str(), npu["activations"].as_str()), (Some("int4 per block (LPBQ)"), Some("uint16")), "{npu}");
    assert!(npu["calibration"].as_str().unwrap().contains("100 prompts (") && npu["calibration"].as_str().unwrap().contains("train-sample.jsonl"), "{npu}");
    // One range per matmul weight: 4 per layer and the head.
    let ranges = npu["activation_ranges"].as_array().unwrap();
    assert_eq!(ranges.len(), 4 * 4 + 1, "{npu}");
    for r in ranges {
        for key in ["input", "output"] {
            let (lo, hi) = (r[key][0].as_f64().unwrap(), r[key][1].as_f64().unwrap());
            assert!(lo <= 0.0 && hi >= 0.0 && hi - lo > 0.1, "{r}");
        }
    }
    let text = String::from_utf8_lossy(&common::run("lladac", &["inspect", out.to_str().unwrap()]).stdout).to_string();
    assert!(text.contains("16-bit activation ranges of 17 matmuls, calibrated on 100 prompts"), "{text}");
    // The built-in calibration set needs no file; the library named by flag serves too.
    let default = dir.path().join("default.lad");
    let qnn_lib = lib();
    lladac(&embedded_model(), "sm8750", &default, &["--max-seq", "128", "--quant", "q4", "--qnn-lib", &qnn_lib]);
    let d = inspect_json(&default);
    assert!(d["npu"]["calibration"].as_str().unwrap().contains("built-in"), "{}", d["npu"]);
    assert_eq!((d["npu"]["weights"].as_str(), d["npu"]["activations"].as_str()), (Some("int4 per block (LPBQ)"), Some("uint16")), "q4's default on the NPU");
    // The task answered as the host's q4 answers it.
    let host_q4 = dir.path().join("host-q4.lad");
    lladac(&embedded_model(), "host", &host_q4, &["--max-seq", "128", "--quant", "q4"]);
    let p = SamplerParams { gen_length: 32, block_length: 32, steps: 32, policy: Policy::Dual, ..Default::default() };
    let host = Model::open(&host_q4, true).unwrap();
    let want = generate(&mut session(&host, &executor::host::BACKEND), &prompt(&host), &p, &mut |_| {}).unwrap();
    let model = Model::open(&out, true).unwrap();
    let got = generate(&mut session(&model, &executor::qnn::BACKEND), &prompt(&model), &p, &mut |_| {}).unwrap();
    assert_eq!(got.output_ids, want.output_ids, "LPBQ with 16-bit activations does not answer as the host's q4");
    // Bad flags.
    let x = dir.path().join("x.lad");
    common::assert_clean_failure(&compile_output(&embedded_model(), "sm8750", &x, &["--quant", "q8", "--npu-activations", "u16"]), &["--npu-activations u16", "--quant q4", "q8"]);
    common::assert_clean_failure(&compile_output(&embedded_model(), "sm8750", &x, &["--quant", "q4", "--npu-activations", "f16", "--calibration", tasks.to_str().unwrap()]), &["--calibration", "--npu-activations u16"]);
    let missing = dir.path().join("missing.jsonl");
    common::assert_clean_failure(&compile_output(&embedded_model(), "sm8750", &x, &["--quant", "q4", "--npu-activations", "u16", "--calibration", missing.to_str().unwrap()]), &["missing.jsonl"]);
    assert!(!x.exists(), "a failed compile left its output");
    assert!(std::fs::read_dir(dir.path()).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().contains("calibration")), "a calibration temporary was left behind");
    // Crafted ranges, refused when the artifact is read.
    let good = std::fs::read(&out).unwrap();
    let refused = |name: &str, edit: &dyn Fn(&mut NpuSection), words: &[&str]| refused_when_edited(dir.path(), &good, name, edit, words);
    refused("no-range.lad", &|s| { s.activations.pop(); }, &["has no activation range"]);
    refused("positive.lad", &|s| s.activations[3].input = [0.5, 2.0], &["activations[3]", "input range [0.5, 2]", "holding zero"]);
    refused("nan.lad", &|s| s.activations[0].output[1] = f32::NAN, &["activations[0]", "output range"]);
    refused("fp16-with-ranges.lad", &|s| s.weights = llada_ir::npu::NpuWeights::Int4PerChannel, &["activations[0]", "fp16 activations"]);
}

/// Every policy on the NPU, twice: the same tokens both times, and (on this trained model,
/// whose margins are far above fp16's error) the host's tokens.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn every_policy_runs_on_the_npu_deterministically_with_the_hosts_tokens() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let art = embedded_npu(dir.path());
    let model = Model::open(&art, true).unwrap();
    let p0 = prompt(&model);
    // How I/O binds is chosen by what the machine has, and said.
    let device = session(&model, &executor::qnn::BACKEND).backend().device.clone();
    assert!(device.contains("I/O: client buffers (no libcdsprpc.so here"), "{device}");
    for policy in [Policy::Exact, Policy::Prefix, Policy::Dual, Policy::Spec, Policy::Mbsd] {
        let p = SamplerParams { gen_length: 32, block_length: 16, steps: 16, policy, ..Default::default() };
        let npu = generate(&mut session(&model, &executor::qnn::BACKEND), &p0, &p, &mut |_| {}).unwrap();
        let again = generate(&mut session(&model, &executor::qnn::BACKEND), &p0, &p, &mut |_| {}).unwrap();
        assert_eq!((&npu.output_ids, &npu.reveals), (&again.output_ids, &again.reveals), "{policy:?} changed between runs on the NPU");
        let host = generate(&mut session(&model, &executor::host::BACKEND), &p0, &p, &mut |_| {}).unwrap();
        let same = npu.output_ids.iter().zip(&host.output_ids).filter(|(a, b)| a == b).count();
        eprintln!("{policy:?}: {same}/{} tokens as the host's, {} passes", host.output_ids.len(), npu.forward_passes);
        assert_eq!(npu.output_ids, host.output_ids, "{policy:?}: the NPU's tokens differ from the host's");
    }
}

#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn mbsd_with_revision_on_the_npu_is_deterministic_with_the_side_path_during_dense_passes() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let art = embedded_npu(dir.path());
    let model = Model::open(&art, true).unwrap();
    common::assert_mbsd_repeats_with_the_side_path_during_dense_passes(|| session(&model, &executor::qnn::BACKEND), &prompt(&model), &common::revising_mbsd(32, 32), 1, "the NPU");
}

/// An AOT backend runs graph ids: the artifact's op lists can be emptied and it still runs
/// (the host backend, which interprets them, then computes nothing of the network).
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_npu_backend_never_reads_the_op_list() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let art = embedded_npu(dir.path());
    let model = Model::open(&art, true).unwrap();
    let p = SamplerParams { gen_length: 32, block_length: 32, steps: 8, ..Default::default() };
    let want = generate(&mut session(&model, &executor::qnn::BACKEND), &prompt(&model), &p, &mut |_| {}).unwrap();
    // Every op after the embedding (and the rotary op whose tables the host gathers) removed
    // from the header the session sees: the executables alone compute the pass.
    let mut stripped = model.share();
    let mut h = (*stripped.header).clone();
    for g in &mut h.graphs {
        g.ops.retain(|o| matches!(o, llada_ir::Op::Embed { .. } | llada_ir::Op::Rope { .. }));
        g.staging.clear();
    }
    stripped.header = Arc::new(h);
    let got = generate(&mut session(&stripped, &executor::qnn::BACKEND), &prompt(&model), &p, &mut |_| {}).unwrap();
    assert_eq!(got.output_ids, want.output_ids);
}

#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn bad_npu_inputs_are_one_clear_error_each() {
    let dir = tempfile::tempdir().unwrap();
    let model = embedded_model();
    let (a, b) = (dir.path().join("sm8650.lad"), dir.path().join("sm8550.lad"));
    lladac(&model, "sm8650", &a, &["--max-seq", "64"]);
    lladac(&model, "sm8550", &b, &["--max-seq", "64"]);
    let good = std::fs::read(&a).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    // A missing library: how to get it, status 2.
    let out = run_qnn(&a, false);
    common::assert_clean_failure(&out, &["libQnnHtp.so", "tools/qnn/fetch.sh"]);
    assert_eq!(out.status.code(), Some(2));
    // An artifact without executables.
    let host = dir.path().join("host.lad");
    lladac(&model, "host", &host, &["--max-seq", "64"]);
    common::assert_clean_failure(&run_qnn(&host, true), &["no NPU executables", "--target sm8650"]);
    // A binary for another SoC than the artifact (and so the device) says: SM8550's binary
    // under an SM8650 record.
    let other = common::reseal(&std::fs::read(&b).unwrap(), |h| edit_section(h, |s| (s.soc, s.soc_id) = ("sm8650".into(), 57)));
    common::assert_clean_failure(&run_qnn(&write("other-soc.lad", &other), true), &["npu.context.0", "prepared for sm8550 (socModel 43)", "sm8650"]);
    // A corrupted binary: its checksum, at load.
    let h = common::stored_header(&good);
    let seg = &h.segments[NpuSection::of(&h).unwrap().unwrap().contexts[0].segment as usize];
    let mut bad = good.clone();
    bad[4096 + seg.offset as usize + seg.nbytes as usize / 2] ^= 0x40;
    common::assert_clean_failure(&run_qnn(&write("corrupt.lad", &bad), true), &["NPU context binary 'npu.context.0'"]);
    // Damaged past the checksum (its head zeroed, the CRC recorded anew): QNN's system library
    // refuses it with a bare code (30010); the error names the artifact and the context.
    let data = llada_ir::format::Preamble::decode(&good).unwrap().data_offset as usize + seg.offset as usize;
    let mut damaged = good.clone();
    damaged[data..data + 256].fill(0);
    let crc = crc32fast::hash(&damaged[data..data + seg.nbytes as usize]);
    let damaged = common::reseal(&damaged, |h| edit_section(h, |s| s.contexts[0].crc32 = crc));
    let path = write("damaged.lad", &damaged);
    common::assert_clean_failure(&run_qnn(&path, true), &[path.to_str().unwrap(), "NPU context 0 ('npu.context.0')", "QNN cannot read its context binary", "systemContextGetBinaryInfo"]);
    // An I/O table that disagrees with the binary (a tensor id), and one that disagrees with
    // the plan (a shape): the runtime's check and the verifier's.
    let ids = common::reseal(&good, |h| edit_section(h, |s| s.contexts[0].graphs[0].inputs[3].id += 1000));
    common::assert_clean_failure(&run_qnn(&write("ids.lad", &ids), true), &["input 'mask'", "in the artifact's I/O table, but the binary has"]);
    let shape = common::reseal(&good, |h| edit_section(h, |s| s.contexts[0].graphs[0].outputs[0].dims[1] += 1));
    common::assert_clean_failure(&run_qnn(&write("shape.lad", &shape), true), &["npu.qnn", "outputs 'logits'", "needs Logits"]);
}

#[test]
fn an_npu_target_without_the_library_says_how_to_get_it_or_build_the_stand_in() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.lad");
    let o = Command::new(common::bin("lladac"))
        .args(["compile", "--model", embedded_model().to_str().unwrap(), "--target", "sm8650", "--max-seq", "64", "-o", out.to_str().unwrap()])
        .env_remove("LLADA_QNN_LIB")
        .output()
        .unwrap();
    common::assert_clean_failure(&o, &["libQnnHtp.so", "tools/qnn/fetch.sh"]);
    assert!(!out.exists());
    let o = Command::new(common::bin("lladac"))
        .args(["compile", "--model", embedded_model().to_str().unwrap(), "--target", "sm8650", "--max-seq", "64", "--host-only", "-o", out.to_str().unwrap()])
        .env_remove("LLADA_QNN_LIB")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = inspect_json(&out);
    assert!(v["npu"].is_null());
    // --host-only where there is nothing to skip is refused by name.
    let o = Command::new(common::bin("lladac")).args(["compile", "--model", embedded_model().to_str().unwrap(), "--host-only", "-o", out.to_str().unwrap()]).output().unwrap();
    common::assert_clean_failure(&o, &["--host-only", "target 'host'"]);
    // So are the NPU's activations, either of them, where no executable has any.
    for a in ["f16", "u16"] {
        let o = Command::new(common::bin("lladac")).args(["compile", "--model", embedded_model().to_str().unwrap(), "--npu-activations", a, "-o", out.to_str().unwrap()]).output().unwrap();
        common::assert_clean_failure(&o, &[&format!("--npu-activations {a}"), "Snapdragon"]);
    }
}

/// Dream on the NPU (q/k/v biases, the shifted logits): the trained tiny Dream answers a
/// held-out task as on the host.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_trained_dream_answers_on_the_npu_as_on_the_host() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("dream-sm8650.lad");
    lladac(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/dream-tiny-tasks"), "sm8650", &art, &["--max-seq", "192"]);
    let model = Model::open(&art, true).unwrap();
    assert!(model.is_dream());
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let ids = text.encode_chat("FILL:8760330202380988009055401800690570160003300000000008000000130502=").unwrap();
    let p = SamplerParams { gen_length: 64, block_length: 64, steps: 32, ..Default::default() };
    let npu = generate(&mut session(&model, &executor::qnn::BACKEND), &ids, &p, &mut |_| {}).unwrap();
    let host = generate(&mut session(&model, &executor::host::BACKEND), &ids, &p, &mut |_| {}).unwrap();
    assert_eq!(npu.output_ids, host.output_ids, "Dream's tokens differ on the NPU");
    assert!(text.decode(&npu.output_ids, true).starts_with("8766333222388988889955441888699577166663333333333338888888133552"), "{:?}", text.decode(&npu.output_ids, true));
}

/// Grouped-query attention (4 query heads over 2 KV heads: each KV head's query heads folded
/// into rows) and a random checkpoint's first-pass logits: the NPU's fp16 against the host.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn grouped_query_attention_gives_the_hosts_logits_to_fp16_precision() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    common::checkpoint(&ckpt, llada_tools::checkpoint::Shape::tiny(), llada_tools::checkpoint::WeightType::F32, u64::MAX, 0.1);
    let art = dir.path().join("gqa.lad");
    lladac(&ckpt, "sm8650", &art, &["--max-seq", "64"]);
    let model = Model::open(&art, true).unwrap();
    assert!(model.header.model.n_kv_heads < model.header.model.n_heads);
    let seq: Vec<u32> = (0..40u32).map(|i| if i < 24 { (i * 7) % 300 } else { model.header.special.mask }).collect();
    let logit_rows: Vec<u32> = (0..seq.len() as u32).collect();
    let host = session(&model, &executor::host::BACKEND).forward_full(&seq, &logit_rows).unwrap().to_vec();
    let npu = session(&model, &executor::qnn::BACKEND).forward_full(&seq, &logit_rows).unwrap().to_vec();
    let err = common::relative_error(&npu, &host);
    eprintln!("first-pass logits, NPU against host: {err:.2e} relative");
    assert!(err < 2e-2, "relative error {err}");
    // A pass over part of the rows, reading the rest from the cache the first pass filled.
    let part: Vec<u32> = (24..40).collect();
    let host = session(&model, &executor::host::BACKEND);
    let (mut host, mut npu) = (host, session(&model, &executor::qnn::BACKEND));
    host.forward_full(&seq, &logit_rows).unwrap();
    npu.forward_full(&seq, &logit_rows).unwrap();
    let h = host.forward_span(&seq, 24..40, &part).unwrap().to_vec();
    let n = npu.forward_span(&seq, 24..40, &part).unwrap().to_vec();
    let err = common::relative_error(&n, &h);
    eprintln!("a span pass over the cache, NPU against host: {err:.2e} relative");
    assert!(err < 2e-2, "relative error {err}");
}

/// A model split by layers into contexts: any split gives the single context's tokens, and so
/// does one HTP session too small to hold them all (`--npu-sessions 1 --npu-session-bytes`, a
/// phone that grants one), through which the rotating contexts are created and freed every
/// pass (counted). The verifier refuses contexts that overlap, exceed the room their session
/// leaves them, or leave no room for the rotating ones, sessions and I/O descriptors off the
/// plan, naming the element.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn contexts_split_by_layers_and_rotated_through_one_small_session_give_the_same_tokens() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let build = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec!["--max-seq", "128"];
        args.extend_from_slice(extra);
        lladac(&embedded_model(), "sm8650", &out, &args);
        let v = inspect_json(&out);
        (out, v["npu"].clone())
    };
    let (one, npu) = build("one.lad", &[]);
    assert_eq!(npu["contexts"].as_array().unwrap().len(), 1, "the default is the fewest contexts: {npu}");
    let (four, npu_four) = build("four.lad", &["--npu-contexts", "4"]);
    assert!(npu_four["contexts"].as_array().unwrap().iter().all(|c| c["resident"] == true && c["session"] == 0), "{npu_four}");
    // One session with room for one context of the four at a time; for two (one runs while
    // the next is created); and for the first resident beside two rotating ones (what the
    // session maps besides contexts, the I/O and spill-fill, does not depend on it).
    let bytes: Vec<u64> = npu_four["contexts"].as_array().unwrap().iter().map(|c| c["bytes"].as_u64().unwrap()).collect();
    let first = &npu_four["sessions"][0];
    let other = first["io_bytes"].as_u64().unwrap() + first["spill_fill_bytes"].as_u64().unwrap();
    let mut by_size = bytes.clone();
    by_size.sort_unstable_by(|a, b| b.cmp(a));
    let two_largest = by_size[0] + by_size[1];
    let mut rest = bytes[1..].to_vec();
    rest.sort_unstable_by(|a, b| b.cmp(a));
    let (small, double, medium) = ((other + by_size[0] + 4096).to_string(), (other + two_largest + 4096).to_string(), (other + bytes[0] + rest[0] + rest[1] + 4096).to_string());
    let one_session = |bytes: &str, name: &str| build(name, &["--npu-contexts", "4", "--npu-sessions", "1", "--npu-session-bytes", bytes]);
    let (swapped, npu_small) = one_session(&small, "swapped.lad");
    let (doubled, npu_double) = one_session(&double, "doubled.lad");
    let (mixed, npu_mixed) = one_session(&medium, "mixed.lad");
    for npu in [&npu_small, &npu_double, &npu_mixed] {
        let contexts = npu["contexts"].as_array().unwrap();
        let layers: Vec<[u64; 2]> = contexts.iter().map(|c| [c["layers"][0].as_u64().unwrap(), c["layers"][1].as_u64().unwrap()]).collect();
        assert_eq!(layers, [[0, 1], [1, 2], [2, 3], [3, 4]], "{npu}");
        let budget = npu["context_budget"].as_u64().unwrap();
        assert!(contexts.iter().all(|c| c["bytes"].as_u64().unwrap() <= budget), "{npu}");
        let total: u64 = contexts.iter().map(|c| c["bytes"].as_u64().unwrap()).sum();
        assert!(total > budget, "the session must be smaller than the contexts: {npu}");
    }
    let resident = |npu: &serde_json::Value| npu["contexts"].as_array().unwrap().iter().filter(|c| c["resident"] == true).count();
    assert_eq!((resident(&npu_small), resident(&npu_double), resident(&npu_mixed)), (0, 0, 1));
    let p = SamplerParams { gen_length: 32, block_length: 32, steps: 16, policy: Policy::Dual, ..Default::default() };
    let mut answers = Vec::new();
    // (artifact, contexts created a pass after the first, in the first, and of them while the
    // one before ran): the next context of a pass is created during the current one's run
    // where the budget holds both. One at a time: all four every pass, none overlapped; two at
    // a time: all four, the last three while the one before runs; the first resident and
    // three rotating through room for two: the one kept from the last pass alternates, so two
    // a pass (three in the first), every one while another runs.
    for (art, per_pass, first, overlapped_per_pass, overlapped_first) in [(&one, 0, 0, 0, 0), (&four, 0, 0, 0, 0), (&swapped, 4, 4, 0, 0), (&doubled, 4, 4, 3, 3), (&mixed, 2, 3, 2, 3)] {
        let model = Model::open(art, true).unwrap();
        let mut s = session(&model, &executor::qnn::BACKEND);
        let g = generate(&mut s, &prompt(&model), &p, &mut |_| {}).unwrap();
        let (loads, during) = (s.counters.context_loads, s.counters.context_loads_overlapped);
        eprintln!("{}: {} passes, {loads} contexts created during them, {during} while another ran", art.display(), g.forward_passes);
        let later = g.forward_passes - 1;
        assert_eq!((loads, during), (first + per_pass * later, overlapped_first + overlapped_per_pass * later), "{}", art.display());
        answers.push(g.output_ids);
    }
    assert!(answers.iter().all(|a| *a == answers[0]), "{answers:?}");
    // Bad splits, by flag.
    let o = common::run("lladac", &["compile", "--model", embedded_model().to_str().unwrap(), "--target", "host", "--npu-contexts", "2", "-o", dir.path().join("x.lad").to_str().unwrap()]);
    common::assert_clean_failure(&o, &["--npu-contexts 2", "Snapdragon"]);
    let o = compile_output(&embedded_model(), "sm8650", &dir.path().join("x.lad"), &["--npu-contexts", "9"]);
    common::assert_clean_failure(&o, &["--npu-contexts 9", "4 layers"]);
    // Crafted sections, refused when the artifact is read (`lladac inspect` verifies it).
    let good = std::fs::read(&mixed).unwrap();
    let refused = |name: &str, edit: &dyn Fn(&mut NpuSection), words: &[&str]| refused_when_edited(dir.path(), &good, name, edit, words);
    refused("overlap.lad", &|s| s.contexts[2].layers[0] = 1, &["contexts[2]", "layers 1..3"]);
    refused("gap.lad", &|s| s.contexts[3].layers = [3, 3], &["contexts[3]", "layers 3..3"]);
    refused("budget.lad", &|s| s.context_budget = 1 << 20, &["contexts[0]", "exceed the context_budget"]);
    refused("sessions.lad", &|s| s.context_budget = 8 << 20, &["context_budget 8388608", "the sessions leave"]);
    refused("session-io.lad", &|s| s.sessions[0].io_bytes += 1, &["sessions[0]", "io_bytes"]);
    refused("two-sessions.lad", &|s| s.contexts[3].session = 1, &["contexts[3]", "session 1 does not continue"]);
    refused("mapping.lad", &|s| s.limits.mapping_bytes = 1 << 10, &["contexts[0]", "exceed one mapping (1024 bytes)"]);
    refused("resident.lad", &|s| s.contexts.iter_mut().for_each(|c| c.resident = true), &["resident contexts", "largest rotating"]);
    // The I/O allocation's layout and its descriptors (what a phone registers per tensor).
    refused("region.lad", &|s| s.io.regions[2].offset += 64, &["io.regions[2]", "HiddenOut", "the plan places"]);
    refused("descriptor.lad", &|s| s.contexts[1].graphs[0].inputs[0].offset += 64, &["contexts[1].graphs[0]", "inputs 'hidden'", "descriptor at offset"]);
    refused("kv-descriptor.lad", &|s| s.contexts[3].graphs[2].inputs.last_mut().unwrap().offset = 0, &["contexts[3].graphs[2]", "'v_cache_3'", "descriptor at offset 0"]);
}

/// `--npu-shared-weights`: the phone's form, each context's row buckets over one copy of
/// their weights (inspect says so; the binary shrinks about by the number of buckets), which
/// the x86-64 simulator cannot load: the runtime says so instead of failing inside QNN.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn shared_weights_are_the_phones_form_and_the_simulator_refuses_them_by_name() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let (shared, unshared) = (dir.path().join("shared.lad"), dir.path().join("unshared.lad"));
    lladac(&embedded_model(), "sm8750", &shared, &["--max-seq", "64", "--npu-shared-weights"]);
    lladac(&embedded_model(), "sm8750", &unshared, &["--max-seq", "64"]);
    let npu = |p: &Path| -> serde_json::Value { inspect_json(p)["npu"].clone() };
    let (a, b) = (npu(&shared), npu(&unshared));
    assert_eq!((a["shared_weights"].as_bool(), b["shared_weights"].as_bool()), (Some(true), Some(false)));
    let bytes = |n: &serde_json::Value| n["contexts"].as_array().unwrap().iter().map(|c| c["bytes"].as_u64().unwrap()).sum::<u64>();
    // Two row buckets at 64 positions: about half.
    assert!(10 * bytes(&a) < 6 * bytes(&b), "shared {} bytes, unshared {}", bytes(&a), bytes(&b));
    if cfg!(target_arch = "x86_64") {
        common::assert_clean_failure(&run_qnn(&shared, true), &["--npu-shared-weights", "simulator"]);
    }
    let o = common::run("lladac", &["compile", "--model", embedded_model().to_str().unwrap(), "--npu-shared-weights", "-o", dir.path().join("x.lad").to_str().unwrap()]);
    common::assert_clean_failure(&o, &["--npu-shared-weights", "Snapdragon"]);
}

/// `--npu-estimate-soc`: QNN's own performance model estimates every executable for a SoC id
/// it models (72, a v81 HTP), recorded in the section and set beside the cost model's by
/// `inspect --estimate`; an id it does not model (SM8650's 57) is refused by name.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn qnns_own_estimates_are_recorded_per_executable_beside_the_cost_models() {
    let _ = lib();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("est.lad");
    lladac(&embedded_model(), "sm8850", &out, &["--max-seq", "64", "--npu-contexts", "2", "--npu-estimate-soc", "72"]);
    let v = inspect_json(&out);
    let estimates = v["npu"]["estimates"].as_array().unwrap();
    assert_eq!(estimates.len(), 2 * v["graphs"].as_array().unwrap().len(), "one per graph and context: {estimates:?}");
    assert!(estimates.iter().all(|e| e["soc_id"] == 72 && e["micros"].as_u64().unwrap() > 0 && e["cycles"].as_u64().unwrap() > 0), "{estimates:?}");
    let e = common::run("lladac", &["inspect", out.to_str().unwrap(), "--estimate", "--json", "--prompt-len", "16", "--gen-len", "32", "--steps", "32", "--rows", "32,64"]);
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    let e: serde_json::Value = serde_json::from_slice(&e.stdout).unwrap();
    let q = e["estimate"]["qnn_estimates"].as_array().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(q.len(), v["graphs"].as_array().unwrap().len());
    assert!(q.iter().all(|g| g["ratio"].as_f64().unwrap() > 0.0 && g["contexts"] == 2), "{q:?}");
    // QNN's op trace by kind, beside each kind's roofline: the weights' reads and the
    // products are there in every graph, and the conversions the roofline does not have.
    for g in q {
        let kinds: Vec<&str> = g["groups"].as_array().unwrap().iter().map(|k| k["kind"].as_str().unwrap()).collect();
        let busy = |kind: &str| g["groups"].as_array().unwrap().iter().find(|k| k["kind"] == kind).map_or(0.0, |k| k["qnn_busy_micros"].as_f64().unwrap());
        assert!(busy("weight reads (DMA)") > 0.0 && busy("matmuls") > 0.0 && busy("attention") > 0.0, "{g}");
        let roof = |kind: &str| g["groups"].as_array().unwrap().iter().find(|k| k["kind"] == kind).map(|k| k["roofline_micros"].clone());
        assert!(roof("weight reads (DMA)").unwrap().as_f64().unwrap() > 0.0 && roof("quantize/dequantize").is_none_or(|r| r.is_null()), "{kinds:?}: {g}");
    }
    let text = String::from_utf8_lossy(&common::run("lladac", &["inspect", out.to_str().unwrap(), "--estimate", "--prompt-len", "16", "--gen-len", "32", "--steps", "32", "--rows", "32,64"]).stdout).to_string();
    assert!(text.contains("QNN's op trace by kind") && text.contains("weight reads (DMA)"), "{text}");
    let o = compile_output(&embedded_model(), "sm8650", &dir.path().join("x.lad"), &["--max-seq", "64", "--npu-estimate-soc", "57"]);
    common::assert_clean_failure(&o, &["--npu-estimate-soc 57", "no performance model"]);
}
