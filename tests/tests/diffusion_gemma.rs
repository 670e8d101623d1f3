//! DiffusionGemma (Google's encoder-decoder diffusion LM) against its published code: the
//! project's own conformance kit (`tests/data/diffusiongemma-conformance/`, made by
//! `tools/diffusion_gemma/` with transformers 5.23's `diffusion_gemma` and PyTorch).

mod common;

use std::path::{Path, PathBuf};

use llada_rt::{Model, Session};

fn kit(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/diffusiongemma-conformance").join(name)
}

fn golden() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(kit("tiny-dg-A").join("golden.json")).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn compiled(dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(format!("{name}.lad"));
    common::compile(&kit(name), &out, Some(128));
    out
}

/// The first decoder pass of the kit's first case (its prompt encoded, then its first
/// canvas of noise without self-conditioning) gives the published code's logits, from the
/// f32 file and from the bf16 shards (the kit's weights are bf16 values).
#[test]
fn the_first_decoder_pass_gives_the_published_logits() {
    let g = golden();
    let f = &g["first_decoder_pass_logits"];
    let (prompt, canvas) = (ids(&f["prompt_ids"]), ids(&f["canvas_ids"]));
    let want: Vec<Vec<f32>> = f["logits"].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()).collect();
    let dir = tempfile::tempdir().unwrap();
    for name in ["tiny-dg-A", "tiny-dg-A-bf16"] {
        let model = Model::open(&compiled(dir.path(), name), true).unwrap();
        assert_eq!(model.header.model.architecture, "diffusion-gemma");
        let mut s = Session::new(&model).unwrap();
        s.encode(&prompt, 0..prompt.len()).unwrap();
        let logits = s.denoise(prompt.len(), &canvas, None).unwrap();
        let width = model.header.model.embedding_size as usize;
        for (r, row) in want.iter().enumerate() {
            let got = &logits[r * width..(r + 1) * width];
            let err = common::relative_error(got, row);
            assert!(err < 1e-4, "{name}: row {r}: relative error {err}");
        }
    }
}

/// The kit replays under PyTorch's random stream: every case's output ids and decoder passes
/// per canvas, from the f32 file (`.ci/run` replays it from the bf16 shards).
#[test]
fn the_kit_replays_every_case_with_its_denoising_steps() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&compiled(dir.path(), "tiny-dg-A"), true).unwrap();
    let golden = kit("tiny-dg-A").join("golden.json");
    let r = llada_rt_tools::conformance::run(&mut Session::new(&model).unwrap(), &golden, Default::default(), &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.denoising_steps_matched), (60, 60, Some(60)));
    assert_eq!(r.logit_cases_within_tolerance, 1);
}

/// Through a window of 1 MiB the layers rotate through the swap slots (the self-conditioning
/// segment, which the encoder graphs do not read, stays resident) and the kit still replays.
#[test]
fn the_kit_replays_through_a_window_where_the_layers_rotate() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("window.lad");
    common::compile_in_window(&kit("tiny-dg-A"), &out, Some(128), Some(1 << 20));
    let model = Model::open(&out, true).unwrap();
    let w = &model.header.plan.window;
    assert!(w.rotating.len() >= 6, "{} rotating segments", w.rotating.len());
    let golden = kit("tiny-dg-A").join("golden.json");
    let every_fifth = llada_rt_tools::conformance::Selection { every: 5, offset: 0 };
    let r = llada_rt_tools::conformance::run(&mut Session::new(&model).unwrap(), &golden, every_fifth, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.denoising_steps_matched), (12, 12, Some(12)));
}

/// `llada-rt bench` times the decoder's canvas pass after an encoder pass over the prompt, and
/// `lladac inspect --estimate` predicts the published generate: the prompt through the
/// encoder, the decoder once a step, each finished canvas but the last through the encoder.
#[test]
fn bench_and_estimate_follow_the_encoder_and_decoder() {
    let dir = tempfile::tempdir().unwrap();
    let lad = compiled(dir.path(), "tiny-dg-A");
    let lad = lad.to_str().unwrap();
    let out = common::run("llada-rt", &["bench", lad, "--rows", "8", "--repeat", "1", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pass = &v["passes"][0];
    let canvas = golden()["canvas_length"].as_u64().unwrap();
    assert_eq!(pass["encoder"]["prompt_rows"], 8);
    assert!(pass["graph"].as_str().unwrap().starts_with("decoder"), "{pass}");
    assert_eq!(pass["rows"].as_u64().unwrap(), canvas);
    assert_eq!(pass["logit_rows"].as_u64().unwrap(), canvas);
    assert!(pass["by_op"]["SoftEmbed"].as_f64().is_some(), "{pass}");
    // Prompt 20 over encoder graphs, two canvases of 5 decoder passes (measured: --passes 10),
    // the first canvas encoded after.
    let out = common::run("lladac", &["inspect", lad, "--estimate", "--prompt-len", "20", "--gen-len", &(2 * canvas).to_string(), "--passes", "10", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let g = &v["estimate"]["generation"];
    assert_eq!(g["forward_passes"], 12, "{g}");
    assert_eq!(g["block_len"].as_u64().unwrap(), canvas);
    assert!(g["sampler_seconds"].as_f64().unwrap() > 0.0, "{g}");
    let out = common::run("lladac", &["inspect", lad, "--estimate", "--block-len", "4"]);
    common::assert_clean_failure(&out, &["--block-len 4", "canvas"]);
}

/// An end token outside the vocabulary could never be drawn: refused by its flag.
#[test]
fn an_end_token_outside_the_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lad = compiled(dir.path(), "tiny-dg-A");
    let out = common::run("llada-rt", &["run", lad.to_str().unwrap(), "--prompt-ids", "5,6", "--eos-ids", "1,999999"]);
    common::assert_clean_failure(&out, &["--eos-ids 999999 is outside the vocabulary (0..320)"]);
}

/// `compare` measures the first decoder pass and the generation: nothing apart against the
/// artifact itself, a little apart for f16 weights.
#[test]
fn compare_measures_the_decoder_pass() {
    let dir = tempfile::tempdir().unwrap();
    let f32 = compiled(dir.path(), "tiny-dg-A");
    let f16 = dir.path().join("f16.lad");
    common::compile_quant(&kit("tiny-dg-A"), &f16, Some(lladac::Quant::F16), 128, None);
    let compare = |other: &Path| {
        let out = common::run("llada-rt", &["compare", f32.to_str().unwrap(), other.to_str().unwrap(), "--prompt-ids", "5,6,7", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (v["logit_relative_error"].as_f64().unwrap(), v["top1_agreement"].as_f64().unwrap(), v["token_agreement"].as_f64().unwrap())
    };
    assert_eq!(compare(&f32), (0.0, 1.0, 1.0));
    let (error, top1, _) = compare(&f16);
    assert!(error > 0.0 && error < 0.1 && top1 > 0.5, "f16: error {error}, top-1 {top1}");
}

/// A prompt and canvases that outgrow the cache (max-seq 128) are refused with the numbers
/// and the fix, in the words LLaDA's refusal uses.
#[test]
fn canvases_past_the_cache_are_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let lad = compiled(dir.path(), "tiny-dg-A");
    let prompt: Vec<String> = (0..100).map(|i| (300 + i % 10).to_string()).collect();
    let out = common::run("llada-rt", &["run", lad.to_str().unwrap(), "--prompt-ids", &prompt.join(","), "--gen-len", "32"]);
    common::assert_clean_failure(&out, &["132 positions,", "at most 128", "--max-seq 132"]);
}
