//! Dream (Dream-org's Dream-v0 7B family: a Qwen2.5-style diffusion LM with q/k/v biases and
//! logits shifted by one position) against its published sampler: the project's own
//! conformance kit (`tests/data/dream-conformance/`, made by `tools/dream/` with the published
//! `modeling_dream.py` and `generation_utils.py` and PyTorch) replays exactly, and what Dream
//! does not run yet is refused by flag.

mod common;

use std::path::PathBuf;

use llada_rt::sampler::{Alg, Policy, Revision};
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

/// The trained tiny Dream's kit (its golden files).
fn trained_kit() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/dream-conformance/tiny-dream-tasks")
}

/// The trained tiny Dream (`models/dream-tiny-tasks`) compiled into `dir`.
fn trained(dir: &std::path::Path) -> PathBuf {
    let out = dir.join("dream-tiny.lad");
    common::compile(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/dream-tiny-tasks"), &out, None);
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

/// Dream's exact sampler predicts the whole generation in one pass: a generation longer than
/// the artifact's logit rows is refused with a fix that works (a shorter generation, a
/// blocked policy, or more logit rows), not a shorter block, which the sampler refuses.
#[test]
fn a_generation_past_the_logit_rows_is_refused_with_fixes_that_work() {
    let dir = tempfile::tempdir().unwrap();
    let lad = dir.path().join("rows64.lad");
    common::compile_quant(&kit(), &lad, None, 128, None);
    let model = Model::open(&lad, true).unwrap();
    let p = SamplerParams { gen_length: 65, block_length: 65, steps: 65, ..SamplerParams::for_model(&model, None, None, Policy::Exact) };
    let e = generate(&mut Session::new(&model).unwrap(), &[5, 6], &p, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("--gen-len 65 (Dream's sampler has no blocks") && e.contains("use --gen-len 64 or less, or the prefix or dual policy with --block-len 64 or less") && e.contains("--logit-rows 65"), "{e}");
}

/// A golden file holds LLaDA's sampler settings: on Dream it is refused naming the file, not
/// by a flag nobody typed.
#[test]
fn a_golden_file_is_refused_on_dream_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let lad = compiled(dir.path());
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/embedded.json");
    for extra in [&[][..], &["--write", dir.path().join("new.json").to_str().unwrap()][..]] {
        let out = common::run("llada-rt", &[&["golden", golden.to_str().unwrap(), "--model", lad.to_str().unwrap()], extra].concat());
        common::assert_clean_failure(&out, &["embedded.json", "a golden file holds LLaDA's sampler settings", "dream model"]);
    }
}

/// The trained tiny Dream's kit (`data/dream-conformance/tiny-dream-tasks`: eight held-out
/// tasks, the published sampler at gen 64 with 64, 32 and 16 steps, three rules): replayed
/// exactly on the host, ties included (the NPU replays it in CI within fp16's precision).
#[test]
fn the_trained_dreams_kit_replays_on_the_host_ties_included() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&trained(dir.path()), true).unwrap();
    let golden = trained_kit().join("golden.json");
    let r = conformance::run(&mut Session::new(&model).unwrap(), &golden, conformance::Selection::default(), &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.reveals_all_steps_matched, r.skipped), (72, 72, 72, 0));
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

/// Fast-dLLM's Dream code beyond the block kit (`fastdllm_golden.json` of both kits, written by
/// `tools/dream/make_fastdllm_golden.py` with that code loaded at run time): its threshold
/// decoding at 0.9, 0.5 and 0.3 under both caches, filtered or not, with as many forward passes
/// as it runs; the cached policies with top_p / top_k (filtered confidences tie exactly, and
/// the tie goes as Fast-dLLM's topk over its span decides); eps at 0 and 1, under the
/// published sampler too. Tokens and reveals at every step, on the random and the trained
/// checkpoint.
#[test]
fn fast_dllms_threshold_mode_filters_and_eps_bounds_replay_with_their_pass_counts() {
    let dir = tempfile::tempdir().unwrap();
    let trained = trained(dir.path());
    for (lad, golden) in [(compiled(dir.path()), kit().join("fastdllm_golden.json")), (trained, trained_kit().join("fastdllm_golden.json"))] {
        let model = Model::open(&lad, true).unwrap();
        let r = conformance::run(&mut Session::new(&model).unwrap(), &golden, conformance::Selection::default(), &mut |_| {}).unwrap();
        assert!(r.passed(), "{}: {:?}", golden.display(), r.failures);
        assert_eq!((r.cases, r.output_ids_matched, r.reveals_all_steps_matched, r.skipped), (204, 204, 204, 0), "{}", golden.display());
        assert_eq!((r.forward_calls_checked, r.forward_calls_matched), (108, 108), "{}", golden.display());
    }
}

/// `mbsd` on Dream without drafts or revision, on a bucket as large as the block, is the
/// `dual` pass (the block's rows, the rest from the cache) with the blocked sampler's commits:
/// it replays Fast-dLLM's dual-cache cases (whose cached steps rank by negative entropy, so
/// `--alg entropy`), tokens and reveals at every step, passes skipped where a step commits
/// nothing.
#[test]
fn mbsd_without_drafts_or_revision_on_a_block_sized_bucket_is_fast_dllms_dual_cache() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&compiled(dir.path()), true).unwrap();
    let golden: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(kit().join("block_golden.json")).unwrap()).unwrap();
    let mut replayed = 0;
    for c in golden["cases"].as_array().unwrap().iter().filter(|c| c["dual_cache"] == true) {
        let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        let n = |k: &str| c[k].as_u64().unwrap() as usize;
        let p = SamplerParams {
            gen_length: n("gen_length"),
            block_length: n("block_length"),
            steps: n("steps"),
            eps: c["eps"].as_f64().unwrap(),
            alg: Alg::Entropy,
            policy: Policy::Mbsd,
            spec_blocks: 0,
            revision: Revision::Off,
            rows: Some(n("block_length")),
            ..Default::default()
        };
        let g = generate(&mut Session::new(&model).unwrap(), &ids(&c["prompt_ids"]), &p, &mut |_| {}).unwrap();
        assert_eq!(g.output_ids, ids(&c["output_ids"]), "{}", c["id"]);
        // A step's commits as a set (the golden file lists them by position).
        let sorted = |r: Vec<Vec<[u32; 2]>>| -> Vec<Vec<[u32; 2]>> { r.into_iter().map(|mut s| { s.sort_unstable(); s }).collect() };
        let reveals: Vec<Vec<[u32; 2]>> = serde_json::from_value(c["step_reveals"].clone()).unwrap();
        assert_eq!(sorted(g.reveals.clone()), sorted(reveals), "{}", c["id"]);
        let m = g.mbsd.unwrap();
        assert_eq!(m.dense_passes, g.forward_passes, "{}: a pass per step that commits", c["id"]);
        assert_eq!(m.rows_speculative, 0);
        replayed += 1;
    }
    assert_eq!(replayed, 32);
}

/// `mbsd` with drafts and the CPU side path's revision on Dream: it runs to the end, the side
/// path checks tokens (two passes a job: the masks, then the refresh), and it is
/// deterministic.
#[test]
fn mbsd_with_drafts_and_revision_runs_on_dream_and_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&compiled(dir.path()), true).unwrap();
    let p = SamplerParams { gen_length: 64, block_length: 16, steps: 64, policy: Policy::Mbsd, spec_blocks: 2, revision: Revision::DualPath, ..Default::default() };
    let prompt: Vec<u32> = (40..60).collect();
    let run = || generate(&mut Session::new(&model).unwrap(), &prompt, &p, &mut |_| {}).unwrap();
    let (a, b) = (run(), run());
    assert_eq!(a.output_ids, b.output_ids);
    assert!(!a.output_ids.contains(&model.header.special.mask));
    let m = a.mbsd.unwrap();
    assert!(m.side.checks > 0 && m.rows_speculative > 0, "{m:?}");
    assert_eq!(m.side.side_passes % 2, 0, "{m:?}");
    let counts = |m: &llada_rt::sampler::MbsdReport| (m.dense_passes, m.dense_rows(), m.drafts_accepted, m.side.checks, m.side.revisions, m.side.stabilised);
    assert_eq!(counts(&m), counts(&b.mbsd.unwrap()));
}

/// The trained tiny Dream (`models/dream-tiny-tasks`) on the first 20 held-out tasks: the
/// exact sampler answers every one, and `mbsd` (drafts, revision on the side path) too, with
/// fewer dense passes than exact (the full 200-task comparison is in BENCHMARKS.md).
#[test]
fn the_trained_tiny_dream_answers_its_tasks_under_exact_and_mbsd() {
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let model = Model::open(&trained(dir.path()), true).unwrap();
    let text = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let mut tasks = llada_rt_tools::eval::load_tasks(&root.join("models/tasks/heldout.jsonl"), &text, &model).unwrap();
    tasks.truncate(20);
    let mut session = Session::new(&model).unwrap();
    let exact = SamplerParams { gen_length: 64, block_length: 64, steps: 64, ..Default::default() };
    let e = llada_rt_tools::eval::run(&mut session, &text, &tasks, &exact, None, &mut |_, _| {}).unwrap();
    assert_eq!(e.correct, 20);
    let mbsd = SamplerParams { block_length: 32, policy: Policy::Mbsd, spec_blocks: 1, revision: Revision::DualPath, ..exact };
    let m = llada_rt_tools::eval::run(&mut session, &text, &tasks, &mbsd, None, &mut |_, _| {}).unwrap();
    assert_eq!(m.correct, 20);
    let report = m.mbsd.unwrap();
    assert!(report.dense_passes < e.forward_passes * 2 / 3 && report.drafts_accepted > 0 && report.side.checks > 0, "{report:?}");
}

/// The trained tiny Dream's first 8 held-out tasks under exact and `mbsd`: in a window that
/// holds half its weights (they rotate through slots) the tokens are the resident artifact's;
/// quantized to q8 and q4 it still answers them.
#[test]
fn dream_runs_in_a_rotating_window_and_quantized() {
    let dir = tempfile::tempdir().unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let ckpt = root.join("models/dream-tiny-tasks");
    let resident = dir.path().join("resident.lad");
    common::compile(&ckpt, &resident, Some(256));
    let rotating = dir.path().join("rotating.lad");
    common::compile_in_window(&ckpt, &rotating, Some(256), Some(common::half_the_weights(&resident)));
    let settings = [
        SamplerParams { gen_length: 64, block_length: 64, steps: 64, ..Default::default() },
        SamplerParams { gen_length: 64, block_length: 32, steps: 64, policy: Policy::Mbsd, spec_blocks: 1, ..Default::default() },
    ];
    let answers = |lad: &std::path::Path, p: &SamplerParams| -> (Vec<Vec<u32>>, usize) {
        let model = Model::open(lad, true).unwrap();
        let text = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special).unwrap();
        let mut tasks = llada_rt_tools::eval::load_tasks(&root.join("models/tasks/heldout.jsonl"), &text, &model).unwrap();
        tasks.truncate(8);
        let r = llada_rt_tools::eval::run(&mut Session::new(&model).unwrap(), &text, &tasks, p, None, &mut |_, _| {}).unwrap();
        (r.results.into_iter().map(|t| t.output_ids).collect(), r.correct)
    };
    assert!(!Model::open(&rotating, true).unwrap().header.plan.window.rotating.is_empty(), "the weights rotate through slots");
    for p in &settings {
        assert_eq!(answers(&rotating, p), answers(&resident, p), "{:?}", p.policy);
    }
    for quant in [lladac::Quant::Q8, lladac::Quant::Q4 { group: 32 }] {
        let lad = dir.path().join("quantized.lad");
        common::compile_quant(&ckpt, &lad, Some(quant), 256, None);
        for p in &settings {
            assert_eq!(answers(&lad, p).1, 8, "{quant:?} {:?}", p.policy);
        }
    }
}

#[test]
fn what_dream_does_not_run_yet_is_refused_by_flag() {
    let dir = tempfile::tempdir().unwrap();
    let lad = compiled(dir.path());
    let lad = lad.to_str().unwrap();
    let run = |extra: &[&str]| common::run("llada-rt", &[&["run", lad, "-p", "hi", "--gen-len", "16", "--steps", "8"], extra].concat());
    common::assert_clean_failure(&run(&["--policy", "spec"]), &["--policy spec is not implemented for Dream"]);
    common::assert_clean_failure(&run(&["--policy", "mbsd", "--alg", "origin"]), &["--alg origin commits at random"]);
    common::assert_clean_failure(&run(&["--policy", "mbsd", "--alg", "entropy", "--revision", "dual-path"]), &["--alg entropy's confidence is not a probability"]);
    common::assert_clean_failure(&run(&["--block-len", "8"]), &["--block-len 8: Dream's sampler has no blocks; use --block-len 16"]);
    common::assert_clean_failure(&run(&["--remasking", "random"]), &["--remasking random is LLaDA's; Dream's sampler takes --alg"]);
    common::assert_clean_failure(&run(&["--top-p", "-0.5"]), &["--top-p -0.5 must be a finite number >= 0"]);
    common::assert_clean_failure(&run(&["--eps", "1.5"]), &["--eps 1.5 must be between 0 and 1, both included"]);
    common::assert_clean_failure(&run(&["--threshold", "0.9"]), &["--threshold 0.9: Dream's threshold decoding is Fast-dLLM's", "--policy prefix or dual"]);
    common::assert_clean_failure(&run(&["--policy", "dual", "--block-len", "8", "--threshold", "0.9", "--alg", "entropy"]), &["--alg entropy with --threshold"]);
    // Sampled settings run (the same distributions, this runtime's random streams).
    for extra in [&["--alg", "origin"][..], &["--temperature", "0.7", "--top-p", "0.9"], &["--alg-temp", "0.5"]] {
        let o = run(extra);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
    // The published code's whole ranges: eps at both ends, top_p 0 and above 1, a negative
    // alg_temp; and Fast-dLLM's threshold mode on its cached policies.
    for extra in [&["--alg", "topk_margin", "--eps", "0.01"][..], &["--eps", "0"], &["--eps", "1"], &["--top-p", "0"], &["--top-p", "1.5"], &["--alg-temp", "-0.5"], &["--policy", "dual", "--block-len", "8", "--threshold", "0.9"], &["--policy", "prefix", "--block-len", "8", "--threshold", "0.3", "--top-k", "8"]] {
        let o = run(extra);
        assert!(o.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
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
