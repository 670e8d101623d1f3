//! The thread count changes nothing but speed: at `--threads 1` and `--threads 2` every
//! policy gives the same tokens and reveals, and the passes give the same logits bit for bit
//! (each output element is computed whole by one thread, in one order, whatever the split).
//! Checked on the embedded model (f32) and on a random-weight checkpoint at q8, whose
//! near-tied confidences would turn any drift into a different reveal.

mod common;

use llada_rt::sampler::{Policy, Revision};
use llada_rt::{generate, Model, SamplerParams, Session};
use llada_tools::checkpoint::{Shape, WeightType};

fn random_q8(dir: &std::path::Path) -> std::path::PathBuf {
    let ckpt = dir.join("ckpt");
    common::checkpoint(&ckpt, Shape::tiny(), WeightType::F32, u64::MAX, 0.05);
    let out = dir.join("q8.lad");
    let o = common::run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quant", "q8", "--max-seq", "128"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

fn policies() -> Vec<(&'static str, SamplerParams)> {
    let base = SamplerParams { gen_length: 64, block_length: 16, steps: 32, ..Default::default() };
    vec![
        ("exact", base.clone()),
        ("exact cfg", SamplerParams { cfg_scale: 0.5, ..base.clone() }),
        ("exact sampled", SamplerParams { temperature: 0.7, seed: 9, ..base.clone() }),
        ("prefix", SamplerParams { policy: Policy::Prefix, ..base.clone() }),
        ("prefix threshold", SamplerParams { policy: Policy::Prefix, threshold: Some(0.8), ..base.clone() }),
        ("dual", SamplerParams { policy: Policy::Dual, refresh_every: 4, ..base.clone() }),
        ("spec", SamplerParams { policy: Policy::Spec, ..base.clone() }),
        ("mbsd", SamplerParams { policy: Policy::Mbsd, revision: Revision::Off, ..base.clone() }),
        ("mbsd revision", SamplerParams { policy: Policy::Mbsd, ..base }),
    ]
}

fn same_at_one_and_two_threads(model: &Model, prompt: &[u32]) {
    for (name, p) in policies() {
        let one = generate(&mut Session::with_threads(model, 1).unwrap(), prompt, &p, &mut |_| {}).unwrap();
        let two = generate(&mut Session::with_threads(model, 2).unwrap(), prompt, &p, &mut |_| {}).unwrap();
        assert_eq!(one.output_ids, two.output_ids, "{name}: tokens");
        assert_eq!(one.reveals, two.reveals, "{name}: reveals");
    }
    // The passes the policies make: whole sequence, a span over the cache, and row sets.
    let seq: Vec<u32> = prompt.iter().copied().chain((0..64).map(|i| (i * 7 % 250) as u32)).collect();
    let heads: Vec<u32> = (prompt.len() as u32..seq.len() as u32).collect();
    let (mut s1, mut s2) = (Session::with_threads(model, 1).unwrap(), Session::with_threads(model, 2).unwrap());
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let full = (bits(s1.forward_full(&seq, &heads).unwrap()), bits(s2.forward_full(&seq, &heads).unwrap()));
    assert!(full.0 == full.1, "whole-sequence logits differ between 1 and 2 threads");
    let span = prompt.len() + 16..seq.len();
    let tail = &heads[16..];
    let cached = (bits(s1.forward_span(&seq, span.clone(), tail).unwrap()), bits(s2.forward_span(&seq, span, tail).unwrap()));
    assert!(cached.0 == cached.1, "cached-span logits differ between 1 and 2 threads");
}

#[test]
fn embedded_model_f32() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let text = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let prompt = text.encode_chat("SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=").unwrap();
    same_at_one_and_two_threads(&model, &prompt);
}

#[test]
fn random_weights_q8() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&random_q8(dir.path()), true).unwrap();
    let prompt: Vec<u32> = (0..24).map(|i| (i * 13 % 250) as u32).collect();
    same_at_one_and_two_threads(&model, &prompt);
}
