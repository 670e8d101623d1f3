//! DiffusionGemma's layers on QNN's x86-64 simulator (`LLADA_QNN_LIB`, as CI sets it): the
//! ops the NPU lowering composes for them (`lladac::qnn_ops`), built alone into one graph and
//! compared with the host's kernels; and the conformance kit replayed from a Snapdragon
//! build.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use half::f16;
use lladac::error::{Error, Result};
use lladac::qnn_ops::{self, Emit};
use llada_qnn::abi::{DATATYPE_FLOAT_16, DATATYPE_INT_32};
use llada_qnn::build::{Out, Output, ParamSpec};
use llada_qnn::{Context, Device, GraphBuilder, IoBuffer, QnnLibrary, TensorRef};
use llada_rt::kernels::{self, cpu, gemma};

/// A graph of the compositions alone: intermediates named in order, outputs by their names.
struct Alone<'c> {
    b: GraphBuilder<'c>,
    next: usize,
}

fn qnn(e: llada_qnn::Error) -> Error {
    Error::Options(e.to_string())
}

fn f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

impl Emit for Alone<'_> {
    fn emit(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32], output: Option<&str>) -> Result<TensorRef> {
        self.next += 1;
        let (name, out) = match output {
            Some(name) => (name.to_string(), Out::AppRead),
            None => (format!("t{}", self.next), Out::Native),
        };
        self.b.op(ty, inputs, params, Output::new(&name, DATATYPE_FLOAT_16, dims, out)).map_err(qnn)
    }

    fn constant(&mut self, dims: &[u32], values: &[f32]) -> Result<TensorRef> {
        self.next += 1;
        self.b.static_f16(&format!("c{}", self.next), dims, &f16_bits(values)).map_err(qnn)
    }

    fn dims(&self, t: TensorRef) -> Vec<u32> {
        self.b.dims(t).to_vec()
    }
}

/// The simulator computed zeros for one graph while another was finalized on another thread
/// (`llada-qnn`'s tests): these tests take turns.
static SIMULATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The library (`LLADA_QNN_LIB`) and the simulator's turn, held for the test.
fn library() -> (std::sync::MutexGuard<'static, ()>, std::sync::Arc<QnnLibrary>) {
    let turn = SIMULATOR.lock().unwrap_or_else(|e| e.into_inner());
    (turn, QnnLibrary::open(None).expect("LLADA_QNN_LIB names tools/qnn/fetch.sh's folder"))
}

/// The device the tests build for: the newest SoC `lladac` knows.
fn device(lib: &std::sync::Arc<QnnLibrary>) -> std::sync::Arc<Device> {
    Device::new(&lib.backend().unwrap(), lladac::qnn::soc_of("sm8750").unwrap().1).unwrap()
}

/// An fp16 `[rows, cols]` tensor `name` (id `id`) bound for an execution.
fn buffer(id: u32, name: &str, dims: Vec<u32>, data: &mut [u16]) -> IoBuffer {
    IoBuffer { id, name: std::ffi::CString::new(name).unwrap(), data_type: DATATYPE_FLOAT_16, dims, data: data.as_mut_ptr().cast(), bytes: data.len() * 2 }
}

fn widened(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect()
}

/// `values` rounded to fp16, as the NPU reads them.
fn rounded(values: impl Iterator<Item = f32>) -> Vec<f32> {
    values.map(|v| f16::from_f32(v).to_f32()).collect()
}

/// The largest error of `got` against `want`, each relative to `max(|want|, 1)`.
fn error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0.0, f32::max)
}

/// The tanh-form GELU gate (gates out to ±300, where the composition's square overflows
/// fp16), soft-capping, and RMSNorm over some heads with a weight and over all heads without
/// one: each within fp16's precision of the host's f32 kernels on the same fp16 inputs.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn gemmas_element_wise_ops_on_the_simulator_give_the_hosts_values() {
    let (_turn, lib) = library();
    let device = device(&lib);
    let (rows, hidden, head_dim, heads, cap, eps) = (8u32, 64u32, 32u32, 4u32, 30.0f32, 1e-6f32);
    let width = heads * head_dim;
    let n = |cols: u32| (rows * cols) as usize;
    let mut gate_up = rounded((0..n(2 * hidden)).map(|i| ((i * 37 % 101) as f32 - 50.0) / 8.0));
    (gate_up[0], gate_up[1]) = (300.0, -300.0);
    let logits = rounded((0..n(hidden)).map(|i| ((i * 53 % 97) as f32 - 48.0) * 2.5));
    let qk = rounded((0..n(width)).map(|i| ((i * 29 % 89) as f32 - 44.0) / 10.0));
    let weight = rounded((0..head_dim).map(|i| 0.5 + (i % 7) as f32 / 6.0));

    // One graph: four inputs, four outputs.
    let ctx = Context::create(&device, false).unwrap();
    let mut a = Alone { b: GraphBuilder::new(&ctx, "gemma").unwrap(), next: 0 };
    let x = a.b.input("gate_up", DATATYPE_FLOAT_16, &[rows, 2 * hidden]).unwrap();
    let l = a.b.input("logits", DATATYPE_FLOAT_16, &[rows, hidden]).unwrap();
    let q = a.b.input("qk", DATATYPE_FLOAT_16, &[rows, width]).unwrap();
    let gelu = qnn_ops::gelu_glu(&mut a, x, rows, hidden, Some("gelu")).unwrap();
    let capped = qnn_ops::softcap(&mut a, l, cap, Some("capped")).unwrap();
    let gamma = a.constant(&[head_dim], &weight).unwrap();
    let normed = qnn_ops::norm_heads(&mut a, q, rows, 1..3, head_dim, gamma, eps, Some("normed")).unwrap();
    let ones = a.constant(&[head_dim], &vec![1.0; head_dim as usize]).unwrap();
    let all = qnn_ops::norm_heads(&mut a, q, rows, 0..heads, head_dim, ones, eps, Some("all")).unwrap();
    let ids: Vec<u32> = [x, l, q, gelu, capped, normed, all].iter().map(|&t| a.b.id(t)).collect();
    a.b.finalize().unwrap();
    let binary = ctx.binary().unwrap();
    drop(ctx);

    let mut ctx = Context::from_binary(&device, &binary).unwrap();
    let graph = ctx.graph("gemma").unwrap();
    let mut ins: Vec<Vec<u16>> = [&gate_up, &logits, &qk].iter().map(|v| f16_bits(v)).collect();
    let out_cols = [hidden, hidden, width, width];
    let mut outs: Vec<Vec<u16>> = out_cols.iter().map(|&c| vec![0u16; n(c)]).collect();
    let mut in_bufs: Vec<IoBuffer> = ins.iter_mut().zip([("gate_up", 2 * hidden), ("logits", hidden), ("qk", width)]).zip(&ids[..3]).map(|((d, (name, cols)), &id)| buffer(id, name, vec![rows, cols], d)).collect();
    let names = ["gelu", "capped", "normed", "all"];
    let mut out_bufs: Vec<IoBuffer> = outs.iter_mut().zip(names.iter().zip(out_cols)).zip(&ids[3..]).map(|((d, (name, cols)), &id)| buffer(id, name, vec![rows, cols], d)).collect();
    ctx.execute(&graph, &mut in_bufs, &mut out_bufs).unwrap();
    drop((in_bufs, out_bufs));
    let got: Vec<Vec<f32>> = outs.iter().map(|o| widened(o)).collect();

    // The host's kernels on the same values.
    let mut want_gelu = vec![0f32; n(hidden)];
    gemma::gelu_glu(&gate_up, hidden as usize, &mut want_gelu);
    let mut want_capped = logits.clone();
    gemma::softcap(&mut want_capped, cap);
    let features = cpu::features();
    let mut want_normed = qk.clone();
    for row in want_normed.chunks_exact_mut(width as usize) {
        gemma::norm_heads(features, &mut row[head_dim as usize..3 * head_dim as usize], head_dim as usize, Some(&weight), eps);
    }
    let mut want_all = qk.clone();
    gemma::norm_heads(features, &mut want_all, head_dim as usize, None, eps);

    for (name, got, want) in [("gelu_glu", &got[0], &want_gelu), ("softcap", &got[1], &want_capped), ("norm_heads with a weight", &got[2], &want_normed), ("norm_heads without one", &got[3], &want_all)] {
        let e = error(got, want);
        eprintln!("{name}: largest error {e:.2e} of max(|host|, 1)");
        assert!(e < 1e-2, "{name}: simulator {:?} against host {:?}", &got[..8], &want[..8]);
    }
    // Past the square's overflow: gelu(300) is 300 (checked above, to fp16's precision), and
    // gelu(-300) 0.
    assert!(got[0][1].abs() < 1e-3 && want_gelu[0].abs() > 1.0, "gelu(-300) * up is {} (0 on the host)", got[0][1]);
    assert!(want_capped.iter().any(|v| v.abs() > 25.0) && got[1].iter().all(|v| v.abs() <= cap), "capped at {cap}");
}

/// Rotary embedding of the query and key heads of a q|k|v row at angles gathered in the graph
/// from a static table by each row's position (DiffusionGemma's own tables, one per kind of
/// layer): within fp16's precision of the host's rotation.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn rotary_angles_gathered_by_position_give_the_hosts_rotation() {
    let (_turn, lib) = library();
    let device = device(&lib);
    let (rows, head_dim, heads, kv_heads, positions) = (8u32, 32u32, 4u32, 2u32, 64u32);
    let (half, width) = (head_dim / 2, (heads + 2 * kv_heads) * head_dim);
    let qkv = rounded((0..rows * width).map(|i| ((i * 41 % 103) as f32 - 51.0) / 20.0));
    let angle = |p: u32, i: u32| p as f32 * 10000f32.powf(-2.0 * i as f32 / head_dim as f32);
    let cos = rounded((0..positions * half).map(|j| angle(j / half, j % half).cos()));
    let sin = rounded((0..positions * half).map(|j| angle(j / half, j % half).sin()));
    let mut at: Vec<i32> = vec![3, 10, 11, 40, 63, 0, 5, 5];

    let ctx = Context::create(&device, false).unwrap();
    let mut a = Alone { b: GraphBuilder::new(&ctx, "rope").unwrap(), next: 0 };
    let x = a.b.input("qkv", DATATYPE_FLOAT_16, &[rows, width]).unwrap();
    let p = a.b.input("positions", DATATYPE_INT_32, &[rows]).unwrap();
    let (cos_t, sin_t) = (a.constant(&[positions, half], &cos).unwrap(), a.constant(&[positions, half], &sin).unwrap());
    let (c, s) = (qnn_ops::table_rows(&mut a, cos_t, p).unwrap(), qnn_ops::table_rows(&mut a, sin_t, p).unwrap());
    let y = qnn_ops::rope(&mut a, x, rows, heads + kv_heads, head_dim, c, s, Some("rotated")).unwrap();
    let ids = [a.b.id(x), a.b.id(p), a.b.id(y)];
    a.b.finalize().unwrap();
    let binary = ctx.binary().unwrap();
    drop(ctx);

    let mut ctx = Context::from_binary(&device, &binary).unwrap();
    let graph = ctx.graph("rope").unwrap();
    let mut xs = f16_bits(&qkv);
    let mut ys = vec![0u16; (rows * width) as usize];
    let index = IoBuffer { id: ids[1], name: c"positions".into(), data_type: DATATYPE_INT_32, dims: vec![rows], data: at.as_mut_ptr().cast(), bytes: at.len() * 4 };
    let mut ins = [buffer(ids[0], "qkv", vec![rows, width], &mut xs), index];
    let mut outs = [buffer(ids[2], "rotated", vec![rows, width], &mut ys)];
    ctx.execute(&graph, &mut ins, &mut outs).unwrap();
    let got = widened(&ys);

    let mut want = qkv.clone();
    for (row, &p) in want.chunks_exact_mut(width as usize).zip(&at) {
        let table = |t: &[f32]| t[(p as u32 * half) as usize..][..half as usize].to_vec();
        kernels::rope_row(cpu::features(), &mut row[..((heads + kv_heads) * head_dim) as usize], head_dim as usize, &table(&cos), &table(&sin));
    }
    let e = error(&got, &want);
    eprintln!("rope: largest error {e:.2e} of max(|host|, 1)");
    assert!(e < 1e-2, "simulator {:?} against host {:?}", &got[..8], &want[..8]);
    let values = ((heads + kv_heads) * head_dim) as usize..width as usize;
    assert_eq!(got[values.clone()], qkv[values], "the value heads pass through");
    assert_ne!(got[..head_dim as usize], qkv[..head_dim as usize], "row 0 (position 3) is rotated");
}

fn kit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/diffusiongemma-conformance/tiny-dg-A")
}

/// The kit replays on the simulator from a Snapdragon build (fp16 weights and activations,
/// every op but the host's lowered): first-pass logits within 0.25 of the reference's (the
/// bound CI gives LLaDA's fp16 kit), and each case's ids and decoder passes per canvas as the
/// kit's, or differing only where its recorded closest decision is below twice that error
/// (`--accept-explained`). A spread twentieth of the cases, about a minute and a half. The
/// kit's closest decisions (about 1e-4 in logit units) lie far below fp16's error, so its ids
/// say little here: the trained model's answers below are the sharper check.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_kit_replays_on_the_simulator_within_its_margins() {
    let lib = std::env::var("LLADA_QNN_LIB").expect("set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder");
    let dir = tempfile::tempdir().unwrap();
    let (kit, art) = (kit(), dir.path().join("kit.lad"));
    let built = Command::new(common::bin("lladac")).args(["compile", "--model", kit.to_str().unwrap(), "--target", "sm8750", "--max-seq", "128", "-o", art.to_str().unwrap()]).env("LLADA_QNN_LIB", &lib).output().unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let golden = kit.join("golden.json");
    let args = ["conformance", golden.to_str().unwrap(), "--model", art.to_str().unwrap(), "--backend", "qnn", "--every", "20", "--logit-tolerance", "0.25", "--accept-explained"];
    let replay = Command::new(common::bin("llada-rt")).args(args).env("LLADA_QNN_LIB", &lib).output().unwrap();
    let said = String::from_utf8_lossy(&replay.stdout);
    assert!(replay.status.success(), "{said}{}", String::from_utf8_lossy(&replay.stderr));
    assert!(said.contains("cases:                     3 of 60"), "{said}");
    assert!(said.contains("first_step_logits:         1/1 within"), "{said}");
}

/// The trained tiny DiffusionGemma (models/README.md) on the simulator: its first six held-out
/// tasks give the host's output ids from the same Snapdragon build (a trained model is far
/// from its decisions, so fp16 keeps its answers where a lowering mistake would not), and
/// answer at least five right, as the host does.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_trained_model_answers_on_the_simulator_as_on_the_host() {
    let lib = std::env::var("LLADA_QNN_LIB").expect("set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder");
    let dir = tempfile::tempdir().unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let (model, art, tasks) = (repo.join("models/diffusiongemma-tiny-tasks"), dir.path().join("dg.lad"), dir.path().join("tasks.jsonl"));
    let heldout = std::fs::read_to_string(repo.join("models/tasks/heldout.jsonl")).unwrap();
    std::fs::write(&tasks, heldout.lines().take(6).map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let built = Command::new(common::bin("lladac")).args(["compile", "--model", model.to_str().unwrap(), "--target", "sm8750", "--max-seq", "192", "-o", art.to_str().unwrap()]).env("LLADA_QNN_LIB", &lib).output().unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let eval = |backend: &str| -> serde_json::Value {
        let args = ["eval", art.to_str().unwrap(), "--tasks", tasks.to_str().unwrap(), "--backend", backend, "--json"];
        let run = Command::new(common::bin("llada-rt")).args(args).env("LLADA_QNN_LIB", &lib).output().unwrap();
        assert!(run.status.success(), "{backend}: {}", String::from_utf8_lossy(&run.stderr));
        serde_json::from_slice(&run.stdout).unwrap()
    };
    let (npu, host) = (eval("qnn"), eval("host"));
    for (got, want) in npu["results"].as_array().unwrap().iter().zip(host["results"].as_array().unwrap()) {
        assert_eq!(got["output_ids"], want["output_ids"], "task {}", want["index"]);
    }
    assert!(npu["correct"].as_u64().unwrap() >= 5, "{}", npu["correct"]);
}

/// What an NPU runs on the host sits between executables that carry everything across: the
/// decoder's self-conditioning product right after the embedding, its result the first
/// executable's input beside the embedded rows; each MoE layer's router and experts as
/// adjacent ops, the executable before one handing over the experts' input and the router's
/// logits, the one after reading back only the residual stream and the experts' sum.
#[test]
fn the_hosts_ops_sit_between_executables_that_carry_what_crosses() {
    use llada_ir::npu::{host_prefix, piece_roles, pieces, Role};
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("kit.lad");
    common::compile_quant(&kit(), &art, None, 128, None);
    let model = llada_rt::Model::open(&art, true).unwrap();
    let moe_layers = model.header.model.moe_layers() as usize;
    for g in &model.header.graphs {
        let decoder = g.name.starts_with("decoder");
        assert_eq!(host_prefix(g), if decoder { 2 } else { 1 }, "graph '{}'", g.name);
        let cut = pieces(g, host_prefix(g)..g.ops.len());
        let (inputs, _) = piece_roles(g, cut[0].clone()).unwrap_or_else(|e| panic!("{e}"));
        let carried: Vec<Role> = inputs.iter().filter(|(_, v)| v.is_some()).map(|(r, _)| *r).collect();
        assert_eq!(carried, if decoder { vec![Role::Hidden, Role::SoftIn] } else { vec![Role::Hidden] }, "graph '{}'", g.name);
        assert_eq!(cut.len(), moe_layers + 1, "graph '{}': an executable before each layer's host ops and one after the last", g.name);
        for (before, after) in cut.iter().zip(&cut[1..]) {
            let host: Vec<&str> = g.ops[before.end..after.start].iter().map(|o| o.name()).collect();
            assert_eq!(host, ["RouteScaled", "MoeExperts"], "graph '{}' ops {}..{}", g.name, before.end, after.start);
            let (inputs, _) = piece_roles(g, after.clone()).unwrap_or_else(|e| panic!("{e}"));
            let carried: Vec<Role> = inputs.iter().filter(|(_, v)| v.is_some()).map(|(r, _)| *r).collect();
            assert_eq!(carried, [Role::Hidden, Role::ExpertOut], "graph '{}' ops {after:?}", g.name);
            let (_, outputs) = piece_roles(g, before.clone()).unwrap_or_else(|e| panic!("{e}"));
            let handed: Vec<Role> = outputs.iter().filter(|(_, v)| v.is_some()).map(|(r, _)| *r).collect();
            assert_eq!(handed, [Role::HiddenOut, Role::ExpertIn, Role::RouterLogits], "graph '{}' ops {before:?}", g.name);
        }
    }
}
