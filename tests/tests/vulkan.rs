//! The Vulkan backend against the host backend on the embedded model: first-pass logits in
//! every weight format and KV cache type, tokens on the golden settings, a window smaller
//! than the weights (staging overlapped with dispatches, shown by the trace), `mbsd` with
//! revision (deterministic, the side path running during dense passes), and what it refuses.
//!
//! These need a Vulkan driver: `.ci/run` installs lavapipe (Mesa's Vulkan on the CPU) and
//! runs them with `cargo test --release -p llada-e2e --test vulkan -- --ignored`.

mod common;

use std::path::Path;
use std::sync::Arc;

use llada_rt::executor::{self, Backend};
use llada_rt::kernels::cpu;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::text::Text;
use llada_rt::trace::Trace;
use llada_rt::{generate, Model, SamplerParams, Session};
use lladac::Quant;
use llada_ir::window::ActivationScales;

const NEEDS_VULKAN: &str = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored";

fn session<'m>(model: &'m Model, backend: &'static Backend) -> Session {
    session_with(model, backend, cpu::features())
}

/// A session whose CPU kernels may use only `features`.
fn session_with<'m>(model: &'m Model, backend: &'static Backend, features: cpu::Features) -> Session {
    Session::with_backend(model, backend, 2, features, StagingMode::Async, ExpertOptions::default()).unwrap()
}

fn embedded() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks")
}

fn prompt(model: &Model, i: usize) -> Vec<u32> {
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let p = ["FILL:0022001000121700300003040240606040000020037096000250158001600037=", "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA="][i];
    text.encode_chat(p).unwrap()
}

/// First-pass logits of `model` on `backend` over prompt 0 and a 64-token masked canvas.
fn first_pass(model: &Model, backend: &'static Backend) -> Vec<f32> {
    first_pass_with(model, backend, cpu::features())
}

/// [`first_pass`] with the CPU kernels `features` allows.
fn first_pass_with(model: &Model, backend: &'static Backend, features: cpu::Features) -> Vec<f32> {
    let prompt = prompt(model, 0);
    let seq: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(model.header.special.mask, 64)).collect();
    let logit_rows: Vec<u32> = (0..seq.len() as u32).collect();
    session_with(model, backend, features).forward_full(&seq, &logit_rows).unwrap().to_vec()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// The embedded model compiled as it is (f32) into `dir`.
fn embedded_f32(dir: &Path) -> std::path::PathBuf {
    let art = dir.join("embedded.lad");
    compile(&art, None, None, None);
    art
}

fn compile(out: &Path, quant: Option<Quant>, kv: Option<&str>, window_bytes: Option<u64>) {
    compile_with(out, quant, kv, window_bytes, None)
}

fn compile_with(out: &Path, quant: Option<Quant>, kv: Option<&str>, window_bytes: Option<u64>, activation_scales: Option<ActivationScales>) {
    lladac::compile(&lladac::CompileOptions {
        model: embedded(),
        output: out.to_path_buf(),
        quant,
        max_seq: Some(256),
        activation_scales,
        window_bytes,
        kv_dtype: kv.map(|k| llada_ir::KvDType::parse(k).unwrap()),
        ..Default::default()
    })
    .expect("compiles");
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn first_pass_logits_agree_with_the_host_in_every_format() {
    let _ = NEEDS_VULKAN;
    let dir = tempfile::tempdir().unwrap();
    // (weights, KV cache, bound), against the host's portable kernels. The shaders add in
    // the host kernels' order (the portable kernels' where the SIMD ones differ), so f32
    // weights agree within the conformance bound and int8 ones with the same bound: their
    // integer sums are exact, and their activations (quantised from the same bits) too. A
    // 16-bit cache rounds keys and values that differ in their last bits to different halves,
    // as two host instruction sets do (measured: 4.4e-4 between the host's portable and
    // AVX-512 kernels): 1e-3, and with int8 activations, whose quantisation a changed value
    // can flip, the golden files' int8 tolerance, 5e-2. The float formats are also held to
    // their bound against the host's own kernels (on AVX-512, attention with the rows in
    // vector lanes, whose sums run in another order: the int8 formats' quantisation can flip
    // there too, as with a 16-bit cache).
    let (row, block) = (Some(ActivationScales::PerRow), Some(ActivationScales::PerBlock));
    let cases: [(Option<Quant>, Option<&str>, Option<ActivationScales>, f32); 11] = [
        (None, None, None, 1e-4),
        (Some(Quant::F16), None, None, 1e-4),
        (Some(Quant::Bf16), None, None, 1e-4),
        (None, Some("f16"), None, 1e-3),
        (None, Some("bf16"), None, 1e-3),
        (Some(Quant::Q8), None, row, 1e-4),
        (Some(Quant::Q4 { group: 128 }), None, row, 1e-4),
        (Some(Quant::Q4 { group: 32 }), Some("f16"), row, 5e-2),
        // Per-block activation scales (the blocks' sums are exact too).
        (Some(Quant::Q8), None, block, 1e-4),
        (Some(Quant::Q4 { group: 128 }), None, block, 1e-4),
        (Some(Quant::Q4 { group: 32 }), None, block, 1e-4),
    ];
    let mut failures = Vec::new();
    for (i, (quant, kv, scales, bound)) in cases.into_iter().enumerate() {
        let art = dir.path().join(format!("m{i}.lad"));
        compile_with(&art, quant, kv, None, scales);
        let model = Model::open(&art, true).unwrap();
        let gpu = first_pass(&model, &executor::vulkan::BACKEND);
        let portable = first_pass_with(&model, &executor::host::BACKEND, cpu::Features::PORTABLE);
        let float = !matches!(quant, Some(Quant::Q8 | Quant::Q4 { .. }));
        let mut hosts = vec![("the host's portable kernels", portable)];
        if float {
            hosts.push(("the host's kernels", first_pass(&model, &executor::host::BACKEND)));
        }
        for (name, host) in hosts {
            let diff = max_abs_diff(&host, &gpu);
            eprintln!("{quant:?} kv {kv:?} {scales:?}: max abs difference {diff:.2e} from {name}");
            if diff > bound {
                failures.push(format!("{quant:?} kv {kv:?} {scales:?}: first-pass logits differ from {name}' by {diff:.2e} (bound {bound:.0e})"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn embedded_golden_outputs_hold_on_vulkan() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("embedded.lad");
    common::compile(&embedded(), &art, None);
    let model = Model::open(&art, true).unwrap();
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden/embedded.json");
    let file = llada_rt_tools::golden::read(&path).unwrap();
    // A spread quarter of the cases: lavapipe takes about 6 s a case here, and every case runs
    // the same shaders (the host's golden test replays them all; CI's conformance replays on
    // lavapipe cover the other settings).
    let quarter = llada_rt_tools::conformance::Selection::new(4, 0).unwrap();
    let report = llada_rt_tools::golden::check(&mut session(&model, &executor::vulkan::BACKEND), &text, &file, &path, quarter, llada_rt_tools::golden::Pin::Reveals).unwrap();
    assert!(report.passed(), "golden outputs differ on Vulkan:\n{}", report.failures.join("\n"));
    let sampled = (0..file.cases.len()).filter(|&c| quarter.includes(c)).count();
    assert_eq!((report.output_ids_matched, report.reveals_matched), (sampled, sampled));
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn a_window_smaller_than_the_weights_stages_on_vulkan_and_gives_the_resident_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let (resident, swapped) = (dir.path().join("resident.lad"), dir.path().join("swapped.lad"));
    compile(&resident, Some(Quant::Q8), None, None);
    compile(&swapped, Some(Quant::Q8), None, Some(common::half_the_weights(&resident)));
    let (a, b) = (Model::open(&resident, true).unwrap(), Model::open(&swapped, true).unwrap());
    assert!(a.header.plan.window.rotating.is_empty() && b.header.plan.window.rotating.len() >= 2, "the small window should make segments rotate");
    let p = SamplerParams { gen_length: 64, block_length: 32, steps: 32, ..Default::default() };
    let want = generate(&mut session(&a, &executor::vulkan::BACKEND), &prompt(&a, 0), &p, &mut |_| {}).unwrap();
    let mut s = session(&b, &executor::vulkan::BACKEND);
    let trace = Arc::new(Trace::default());
    s.set_trace(trace.clone());
    let got = generate(&mut s, &prompt(&b, 0), &p, &mut |_| {}).unwrap();
    assert_eq!((&got.output_ids, &got.reveals), (&want.output_ids, &want.reveals), "staged weights changed the tokens");
    assert!(s.counters.staged_bytes > 0, "nothing was staged");
    // The staging thread copies the next segments while the device runs the dispatches that
    // do not need them: some copy spans overlap device spans.
    let (copies, device) = (common::spans(&trace, common::track::STAGING), common::spans(&trace, common::track::DEVICE));
    assert!(!copies.is_empty() && !device.is_empty(), "the trace has no copies or no device spans");
    let overlapped = common::overlapping(&copies, &device);
    eprintln!("{overlapped} of {} copies overlapped device work", copies.len());
    assert!(overlapped > 0, "no staging copy overlapped a device span");
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn mbsd_with_revision_on_vulkan_is_deterministic_with_the_side_path_during_dense_passes() {
    let dir = tempfile::tempdir().unwrap();
    let art = embedded_f32(dir.path());
    let model = Model::open(&art, true).unwrap();
    common::assert_mbsd_repeats_with_the_side_path_during_dense_passes(|| session(&model, &executor::vulkan::BACKEND), &prompt(&model, 1), &common::revising_mbsd(64, 64), 2, "Vulkan");
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn bad_device_choices_are_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let art = embedded_f32(dir.path());
    let out = std::process::Command::new(common::bin("llada-rt"))
        .args(["run", art.to_str().unwrap(), "-p", "FILL:1=", "--backend", "vulkan"])
        .env("LLADA_VULKAN_DEVICE", "99")
        .output()
        .unwrap();
    common::assert_clean_failure(&out, &["--backend", "LLADA_VULKAN_DEVICE=99"]);
    assert_eq!(out.status.code(), Some(2), "a bad setting exits 2");
}
