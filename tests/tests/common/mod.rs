//! Helpers shared by the end-to-end tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use llada_tools::checkpoint::{self, CheckpointSpec, Shape, WeightType};

/// Path of a workspace binary, built (once per test process) with the profile the tests were
/// built with, so the tests never run a stale binary.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test executable has a path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("tests run from target/<profile>/deps").to_path_buf();
        let profile = profile_dir.file_name().unwrap().to_string_lossy().into_owned();
        // The whole workspace's binaries: cargo resolves features over the packages it is
        // given, and only the whole workspace resolves them as `cargo test --workspace` did
        // (a subset leaves out, say, the Python module's proc-macro features and rebuilds a
        // hundred crates).
        assert!(cargo_build(&profile, &["--workspace", "--bins"]), "building the binaries failed");
        profile_dir
    });
    dir.join(name)
}

pub fn run(binary: &str, args: &[&str]) -> Output {
    Command::new(bin(binary)).args(args).output().expect("the binary starts")
}

/// A random-weight checkpoint of `shape` in `dir`.
pub fn checkpoint(dir: &Path, shape: Shape, weights: WeightType, shard_bytes: u64, init_std: f32) -> checkpoint::Written {
    checkpoint::write(&CheckpointSpec { shape, weights, shard_bytes, seed: 11, init_std, outliers: None }, dir).expect("checkpoint written")
}

/// A random-weight f32 checkpoint of `shape` (one file, weights drawn with `init_std`) written
/// to `dir/ckpt` and compiled by [`compile`] into `dir/name` for `max_seq` positions: the
/// artifact's path.
pub fn random_artifact(dir: &Path, shape: Shape, init_std: f32, name: &str, max_seq: Option<u32>) -> PathBuf {
    let ckpt = dir.join("ckpt");
    checkpoint(&ckpt, shape, WeightType::F32, u64::MAX, init_std);
    let art = dir.join(name);
    compile(&ckpt, &art, max_seq);
    art
}

/// Compiles `model` into `out` through the library, keeping the checkpoint's element type
/// (matmuls over bf16 weights with f32 activations).
pub fn compile(model: &Path, out: &Path, max_seq: Option<u32>) -> lladac::CompileSummary {
    compile_in_window(model, out, max_seq, None)
}

/// Compiles `model` for the host with `quant` (the checkpoint's type when `None`), `max_seq`
/// positions and a window of `window_bytes` (the target's when `None`); one speculative block.
pub fn compile_quant(model: &Path, out: &Path, quant: Option<lladac::Quant>, max_seq: u32, window_bytes: Option<u64>) {
    compile_scaled(model, out, quant, max_seq, window_bytes, None)
}

/// [`compile_quant`] with the int8 activations' scales (`None`: the compiler's default).
pub fn compile_scaled(model: &Path, out: &Path, quant: Option<lladac::Quant>, max_seq: u32, window_bytes: Option<u64>, activation_scales: Option<llada_ir::window::ActivationScales>) {
    lladac::compile(&lladac::CompileOptions {
        model: model.to_path_buf(),
        output: out.to_path_buf(),
        quant,
        max_seq: Some(max_seq),
        logit_rows: 64,
        spec_blocks: Some(1),
        activation_scales,
        window_bytes,
        ..Default::default()
    })
    .expect("compiles");
}

/// Largest |ours - theirs| over largest |theirs| (which must not be degenerate), printed.
pub fn relative_error(ours: &[f32], theirs: &[f32]) -> f64 {
    assert_eq!(ours.len(), theirs.len());
    let scale = theirs.iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    let err = ours.iter().zip(theirs).fold(0f64, |m, (&a, &b)| m.max((a as f64 - b as f64).abs()));
    assert!(scale > 0.1, "degenerate logits (max {scale})");
    eprintln!("max |logit| {scale:.3}, max abs error {err:.2e}, relative {:.2e}", err / scale);
    err / scale
}

/// [`compile`] with a window of `window_bytes` (the target's when `None`).
pub fn compile_in_window(model: &Path, out: &Path, max_seq: Option<u32>, window_bytes: Option<u64>) -> lladac::CompileSummary {
    lladac::compile(&lladac::CompileOptions {
        model: model.to_path_buf(),
        output: out.to_path_buf(),
        max_seq,
        window_bytes,
        ..Default::default()
    })
    .expect("compiles")
}

/// Asserts a command failed the way bad input must: non-zero exit, no panic, exactly one
/// line on stderr, mentioning every one of `needles`.
pub fn assert_clean_failure(out: &Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert_ne!(out.status.code(), Some(101), "the process panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "the process panicked: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "expected one line of error, got: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "error does not mention '{n}': {stderr}");
    }
}

/// Files in `dir` other than `keep`: what a failed compile must not leave behind.
pub fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// The embedded default model compiled into `dir` with `--max-seq 256`.
pub fn embedded(dir: &Path) -> PathBuf {
    let out = dir.join("embedded.lad");
    compile(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks"), &out, Some(256));
    out
}

/// The window that holds a fully resident artifact's fixed regions and half its weights:
/// compiled for it, the same checkpoint's segments must rotate through slots.
pub fn half_the_weights(resident: &Path) -> u64 {
    let m = llada_rt::Model::open(resident, false).unwrap();
    let w = &m.header.plan.window;
    let weights: u64 = w.resident.iter().map(|r| m.header.segments[r.segment as usize].nbytes).sum();
    let end = w.resident.iter().map(|r| r.offset + m.header.segments[r.segment as usize].nbytes).max().unwrap();
    end - weights / 2
}

/// The tiny MoE checkpoint compiled into `dir` (with `quant`) with its experts' pools holding
/// a quarter of each layer's experts: staging and the CPU path both run.
pub fn moe_quarter_window(dir: &Path, quant: Option<lladac::Quant>) -> PathBuf {
    let ckpt = dir.join("ckpt");
    checkpoint(&ckpt, Shape::tiny_moe(), WeightType::F32, u64::MAX, 0.08);
    let full = dir.join("full.lad");
    compile_quant(&ckpt, &full, quant, 128, None);
    let m = llada_rt::Model::open(&full, false).unwrap();
    let x = &m.header.plan.window.experts;
    assert_eq!(x.slots_per_layer, x.per_layer, "the host's window holds every expert");
    // The same plan minus three quarters of each pool.
    let window = x.region.offset + x.region.bytes / 4;
    let out = dir.join("quarter.lad");
    compile_quant(&ckpt, &out, quant, 128, Some(window));
    let q = llada_rt::Model::open(&out, false).unwrap();
    assert_eq!(q.header.plan.window.experts.slots_per_layer * 4, x.per_layer);
    out
}

/// Path of `libllada.a`, built (once per test process) with the tests' profile, as [`bin`]
/// builds the binaries.
pub fn libllada() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let profile_dir = bin("llada-rt").parent().expect("binaries sit in the profile directory").to_path_buf();
            let profile = profile_dir.file_name().unwrap().to_string_lossy().into_owned();
            // The workspace's libraries, for the features `bin` explains.
            assert!(cargo_build(&profile, &["--workspace", "--lib"]), "building libllada failed");
            profile_dir.join("libllada.a")
        })
        .clone()
}

/// `cargo build --quiet ARGS` with the tests' own profile (`debug`, `release` or a named one);
/// whether it succeeded.
fn cargo_build(profile: &str, args: &[&str]) -> bool {
    let mut cmd = Command::new(option_env!("CARGO").unwrap_or("cargo"));
    cmd.args(["build", "--quiet"]).args(args);
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    cmd.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("cargo runs").success()
}

/// `lladac compile` of `model` fails with one line holding `needles`, a non-zero exit, and
/// leaves nothing behind in the model's directory.
pub fn compile_refused(model: &Path, needles: &[&str]) {
    let dir = model.parent().unwrap();
    let before = leftovers(dir);
    let out = dir.join("out.lad");
    let o = run("lladac", &["compile", "--model", model.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_clean_failure(&o, needles);
    assert_eq!(leftovers(dir), before, "a failed compile left files behind");
}

/// Threads of this process whose name starts with `prefix`.
pub fn threads_now(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with(prefix))
        .collect()
}

/// [`threads_now`], once threads that were joined have left /proc: Linux wakes a joiner
/// (clearing the thread id) a moment before it removes the finished task from
/// /proc/self/task, so a count taken right after a join may still see it. Waits up to 5 s for
/// none to be listed, then returns those still listed.
pub fn threads_after_join(prefix: &str) -> Vec<String> {
    for _ in 0..500 {
        if threads_now(prefix).is_empty() {
            return Vec::new();
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    threads_now(prefix)
}

/// Rewrites the JSON file `path` through `edit`.
pub fn edit_json(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

/// Overwrites element `index` (flat, row-major) of tensor `name` in the checkpoint `ckpt`
/// (single file or sharded) with `bits`, the little-endian bytes of one element of its type.
pub fn set_weight(ckpt: &Path, name: &str, index: usize, bits: &[u8]) {
    use std::os::unix::fs::FileExt;
    let index_path = ckpt.join("model.safetensors.index.json");
    let file = match index_path.exists() {
        true => {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
            ckpt.join(v["weight_map"][name].as_str().expect("the tensor is in the index"))
        }
        false => ckpt.join("model.safetensors"),
    };
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&file).unwrap();
    let mut len = [0u8; 8];
    f.read_exact_at(&mut len, 0).unwrap();
    let n = u64::from_le_bytes(len);
    let mut header = vec![0u8; n as usize];
    f.read_exact_at(&mut header, 8).unwrap();
    let header: serde_json::Value = serde_json::from_slice(&header).unwrap();
    let start = header[name]["data_offsets"][0].as_u64().expect("the tensor is in its shard");
    f.write_all_at(bits, 8 + n + start + (index * bits.len()) as u64).unwrap();
}

/// `file`'s header as stored (after its preamble).
pub fn stored_header(file: &[u8]) -> llada_ir::Header {
    let p = llada_ir::format::Preamble::decode(file).unwrap();
    llada_ir::sections::decode(&file[p.header_offset as usize..]).unwrap().0
}

/// `file` with its header changed by `edit` and both checksums recomputed (header and
/// preamble valid), so only what `edit` changed can refuse it.
pub fn reseal(file: &[u8], edit: impl FnOnce(&mut llada_ir::Header)) -> Vec<u8> {
    let p = llada_ir::format::Preamble::decode(file).unwrap();
    let mut h = stored_header(file);
    edit(&mut h);
    let header = llada_ir::sections::encode(&h).unwrap();
    let p = llada_ir::format::Preamble { header_len: header.len() as u64, header_crc32: crc32fast::hash(&header), ..p };
    let mut out = file[..p.header_offset as usize].to_vec();
    out[..p.encode().len()].copy_from_slice(&p.encode());
    out.extend_from_slice(&header);
    out
}

/// Spans of `track` (its trace id, see `llada_rt::trace::Track`) in a Chrome trace: (start,
/// end) in microseconds.
pub fn spans(trace: &llada_rt::trace::Trace, track: u64) -> Vec<(f64, f64)> {
    let json = trace.to_json();
    json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"].as_u64() == Some(track))
        .map(|e| (e["ts"].as_f64().unwrap(), e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap()))
        .collect()
}

/// How many spans of `a` overlap some span of `b`.
pub fn overlapping(a: &[(f64, f64)], b: &[(f64, f64)]) -> usize {
    a.iter().filter(|x| b.iter().any(|y| x.0 < y.1 && y.0 < x.1)).count()
}

/// Track ids of the trace (see `llada_rt::trace::Track`).
pub mod track {
    pub const DENSE: u64 = 1;
    pub const STAGING: u64 = 2;
    pub const SIDE_PATH: u64 = 3;
    pub const DEVICE: u64 = 4;
}

/// `mbsd` with dual-path revision over `gen_length` tokens in blocks of 16: hot sampling and
/// low thresholds make checks disagree, so revisions happen.
pub fn revising_mbsd(gen_length: usize, steps: usize) -> llada_rt::SamplerParams {
    use llada_rt::sampler::{Policy, Revision};
    llada_rt::SamplerParams { gen_length, block_length: 16, steps, policy: Policy::Mbsd, revision: Revision::DualPath, temperature: 1.5, seed: 2, revise_confidence: 0.0, stable_checks: 3, stable_confidence: 1.0, ..Default::default() }
}

/// `prompt` generated with `p` (see [`revising_mbsd`]) on a session from `new_session`, traced,
/// then `reruns` times more untraced: the side path ran checks, every rerun gives the first
/// run's tokens, reveals and revisions, and some side-path check ran during a dense pass.
/// `device` names the backend in the messages ("Vulkan", "the NPU").
pub fn assert_mbsd_repeats_with_the_side_path_during_dense_passes(new_session: impl Fn() -> llada_rt::Session, prompt: &[u32], p: &llada_rt::SamplerParams, reruns: usize, device: &str) {
    use llada_rt::trace::Trace;
    use std::sync::Arc;
    let run = |trace: Option<Arc<Trace>>| -> llada_rt::Generation {
        let mut s = new_session();
        if let Some(t) = trace {
            s.set_trace(t);
        }
        llada_rt::generate(&mut s, prompt, p, &mut |_| {}).unwrap()
    };
    let trace = Arc::new(Trace::default());
    let first = run(Some(trace.clone()));
    let m = first.mbsd.clone().expect("an mbsd report");
    assert!(m.side.side_passes > 0 && m.side.checks > 0, "{m:?}");
    for _ in 0..reruns {
        let again = run(None);
        assert_eq!((&again.output_ids, &again.reveals, &again.revisions), (&first.output_ids, &first.reveals, &first.revisions), "mbsd on {device} changed between runs");
    }
    let (side, dense) = (spans(&trace, track::SIDE_PATH), spans(&trace, track::DENSE));
    let during = overlapping(&side, &dense);
    eprintln!("{during} of {} side-path checks ran during a dense pass ({} revisions)", side.len(), m.side.revisions);
    assert!(during > 0, "no side-path span overlapped a dense pass");
}

/// Largest |runtime - reference| over largest |reference| (see [`relative_error`]) on the
/// first-pass logits of `len` token ids (a fixed spread below BOS) over a random checkpoint of
/// `shape` in `weights` (init std 0.08, shards of `shard_bytes`): `compile` turns the
/// checkpoint into an artifact, `reference` loads the checkpoint and runs its independent
/// forward pass (in burn) over the ids as a batch of one.
pub fn error_against_reference(
    shape: &Shape,
    weights: WeightType,
    shard_bytes: u64,
    len: usize,
    compile: impl FnOnce(&Path, &Path),
    reference: impl FnOnce(&Path, burn::tensor::Tensor<2, burn::tensor::Int>, &burn::tensor::Device) -> Vec<f32>,
) -> f64 {
    use burn::tensor::{Device, Int, Tensor, TensorData};
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let written = checkpoint(&ckpt, shape.clone(), weights, shard_bytes, 0.08);
    let art = dir.path().join("model.lad");
    compile(&ckpt, &art);

    let ids: Vec<u32> = (0..len).map(|i| ((i * 7919 + 13) % written.special.bos as usize) as u32).collect();
    let model = llada_rt::Model::open(&art, true).unwrap();
    let mut session = llada_rt::Session::new(&model).unwrap();
    let rows: Vec<u32> = (0..len as u32).collect();
    let ours = session.forward_full(&ids, &rows).unwrap().to_vec();

    let device = Device::default();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, len]), &device);
    let theirs = reference(&ckpt, input, &device);

    relative_error(&ours, &theirs)
}
