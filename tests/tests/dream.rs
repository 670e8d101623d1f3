//! Dream (Dream-org's Dream-v0 7B family: a Qwen2.5-style diffusion LM with q/k/v biases and
//! logits shifted by one position) against its published sampler: the project's own
//! conformance kit (`tests/data/dream-conformance/`, made by `tools/dream/` with the published
//! `modeling_dream.py` and `generation_utils.py` and PyTorch) replays exactly, and what Dream
//! does not run yet is refused by flag.

mod common;

use std::path::PathBuf;

use llada_rt::sampler::Alg;
use llada_rt::{generate, Model, SamplerParams, Session};
use llada_rt_tools::conformance;

fn kit() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/dream-conformance/tiny-dream-A")
}

fn compiled(dir: &std::path::Path) -> PathBuf {
    let out = dir.join("dream.lad");
    common::compile(&kit(), &out, None);
    out
}

#[test]
fn the_dream_kit_replays_every_greedy_case_with_its_reveals_and_first_pass_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&compiled(dir.path()), true).unwrap();
    assert_eq!(model.header.model.architecture, "dream");
    let r = conformance::run(&mut Session::new(&model).unwrap(), &kit().join("golden.json"), conformance::Selection::default(), &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!(r.cases, 144, "every greedy case of the kit: 8 prompts, 2 lengths, 3 step counts, 3 rules");
    assert_eq!((r.output_ids_matched, r.reveals_all_steps_matched, r.skipped), (144, 144, 0));
    assert_eq!(r.logit_cases_within_tolerance, 3);
}

/// The prefix and dual policies on Dream against Fast-dLLM's blocked Dream sampler
/// (`block_golden.json`, written by `tools/dream/make_block_golden.py` with Fast-dLLM's
/// `generation_utils_block.py`): the same tokens and reveals at every step.
#[test]
fn prefix_and_dual_replay_fast_dllms_block_sampler() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&compiled(dir.path()), true).unwrap();
    let r = conformance::run(&mut Session::new(&model).unwrap(), &kit().join("block_golden.json"), conformance::Selection::default(), &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.reveals_all_steps_matched), (64, 64, 64));
}

#[test]
fn what_dream_does_not_run_yet_is_refused_by_flag() {
    let dir = tempfile::tempdir().unwrap();
    let lad = compiled(dir.path());
    let lad = lad.to_str().unwrap();
    let run = |extra: &[&str]| common::run("llada-rt", &[&["run", lad, "-p", "hi", "--gen-len", "16", "--steps", "8"], extra].concat());
    common::assert_clean_failure(&run(&["--policy", "mbsd"]), &["--policy mbsd is not implemented for Dream yet"]);
    common::assert_clean_failure(&run(&["--block-len", "8"]), &["--block-len 8: Dream's sampler has no blocks; use --block-len 16"]);
    common::assert_clean_failure(&run(&["--remasking", "random"]), &["--remasking random is LLaDA's; Dream's sampler takes --alg"]);
    common::assert_clean_failure(&run(&["--top-p", "1.5"]), &["--top-p 1.5 must be in (0, 1]"]);
    // Sampled settings run (the same distributions, this runtime's random streams).
    for extra in [&["--alg", "origin"][..], &["--temperature", "0.7", "--top-p", "0.9"], &["--alg-temp", "0.5"]] {
        let o = run(extra);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let ok = run(&["--alg", "topk_margin", "--eps", "0.01"]);
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// The published top_p and top_k filters at temperature 0 (`filtered.json`, written by
/// `tools/dream/make_filtered.py` with the published code): the same tokens.
#[test]
fn top_p_and_top_k_give_the_published_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&compiled(dir.path()), true).unwrap();
    let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(kit().join("filtered.json")).unwrap()).unwrap();
    let cases = cases["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 18);
    for c in cases {
        let ids = |k: &str| -> Vec<u32> { c[k].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        let gen_length = c["gen_length"].as_u64().unwrap() as usize;
        let p = SamplerParams {
            gen_length,
            block_length: gen_length,
            steps: c["steps"].as_u64().unwrap() as usize,
            alg: Alg::parse(c["alg"].as_str().unwrap()).unwrap(),
            eps: c["eps"].as_f64().unwrap(),
            top_p: c["top_p"].as_f64(),
            top_k: c["top_k"].as_u64().map(|k| k as usize),
            ..Default::default()
        };
        let g = generate(&mut Session::new(&model).unwrap(), &ids("prompt_ids"), &p, &mut |_| {}).unwrap();
        assert_eq!(g.output_ids, ids("output_ids"), "{}", c["id"]);
    }
}
