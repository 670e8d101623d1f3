//! Decoding policies reduce to their definitions (on the embedded model, whose answers are
//! confident, and on a random-weight checkpoint, whose near-ties would expose any drift):
//! a pass over some rows against the KV cache reproduces the whole-sequence pass when
//! nothing changed; `prefix` refreshed every step is `exact`; `spec` drafting no blocks is
//! `prefix`; and `eval --reference` compares two runs token for token.

mod common;


use llada_rt::sampler::Policy;
use llada_rt::text::Text;
use llada_rt::{generate, Generation, Model, Remasking, SamplerParams, Session};
use llada_tools::checkpoint::Shape;

fn prompts(model: &Model) -> Vec<Vec<u32>> {
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    ["FILL:0022001000121700300003040240606040000020037096000250158001600037=", "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA="]
        .iter()
        .map(|p| text.encode_chat(p).unwrap())
        .collect()
}

fn decode(model: &Model, prompt: &[u32], p: &SamplerParams) -> Generation {
    generate(&mut Session::new(model).unwrap(), prompt, p, &mut |_| {}).unwrap()
}

fn settings() -> Vec<SamplerParams> {
    let base = SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() };
    vec![
        base.clone(),
        SamplerParams { steps: 20, ..base.clone() },
        SamplerParams { block_length: 16, steps: 32, temperature: 0.8, seed: 4, ..base.clone() },
        SamplerParams { remasking: Remasking::Random, seed: 3, ..base.clone() },
        SamplerParams { threshold: Some(0.9), ..base },
    ]
}

#[test]
fn a_pass_over_some_rows_reproduces_the_whole_sequence_pass_when_nothing_changed() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::random_artifact(dir.path(), Shape::tiny(), 0.05, "m.lad", Some(128));
    let model = Model::open(&art, true).unwrap();
    let mut s = Session::new(&model).unwrap();
    let mask = model.header.special.mask;
    let seq: Vec<u32> = (0..90u32).map(|i| if i < 40 || i % 3 == 0 { i * 7 % 250 } else { mask }).collect();
    let logit_rows: Vec<u32> = (50..70).collect();
    // Before any whole-sequence pass there is no cache to reuse.
    let err = s.forward_span(&seq, 40..72, &logit_rows).unwrap_err().to_string();
    assert!(err.contains("KV cache"), "{err}");
    let full = s.forward_full(&seq, &logit_rows).unwrap().to_vec();
    for span in [40..90, 40..72, 48..70] {
        let part = s.forward_span(&seq, span.clone(), &logit_rows).unwrap();
        assert_eq!(part, &full[..], "rows {span:?}");
    }
    // Changing a token inside the span changes the logits; outside it (cached), it does not.
    let mut changed = seq.clone();
    changed[60] = 5;
    let moved = s.forward_span(&changed, 40..72, &logit_rows).unwrap().to_vec();
    assert_ne!(moved, full);
    let _ = s.forward_full(&seq, &logit_rows).unwrap();
    let mut outside = seq.clone();
    outside[80] = 5;
    assert_eq!(s.forward_span(&outside, 40..72, &logit_rows).unwrap(), &full[..]);
}

#[test]
fn prefix_refreshed_every_step_is_exact_and_spec_without_drafts_is_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    for prompt in prompts(&model) {
        for p in settings() {
            let exact = decode(&model, &prompt, &p);
            let refreshed = decode(&model, &prompt, &SamplerParams { policy: Policy::Prefix, refresh_every: 1, ..p.clone() });
            assert_eq!((&refreshed.output_ids, &refreshed.reveals), (&exact.output_ids, &exact.reveals), "{p:?}");
            assert_eq!(refreshed.forward_passes, exact.forward_passes);
            let dual_refreshed = decode(&model, &prompt, &SamplerParams { policy: Policy::Dual, refresh_every: 1, ..p.clone() });
            assert_eq!(dual_refreshed.reveals, exact.reveals, "{p:?}");

            let prefix = decode(&model, &prompt, &SamplerParams { policy: Policy::Prefix, ..p.clone() });
            let spec0 = decode(&model, &prompt, &SamplerParams { policy: Policy::Spec, spec_blocks: 0, ..p.clone() });
            assert_eq!((&spec0.output_ids, &spec0.reveals), (&prefix.output_ids, &prefix.reveals), "{p:?}");
            assert_eq!((spec0.forward_passes, spec0.rows_computed), (prefix.forward_passes, prefix.rows_computed));
            // Cached passes compute fewer rows than whole-sequence ones (with a threshold a
            // confident block may take only its whole-sequence pass).
            assert!(prefix.rows_computed < exact.rows_computed || p.threshold.is_some() && prefix.rows_computed == exact.rows_computed, "{p:?}");
        }
    }
}

#[test]
fn spec_confirms_drafts_and_saves_passes() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let p = SamplerParams { gen_length: 96, block_length: 32, steps: 96, ..Default::default() };
    for prompt in prompts(&model) {
        let prefix = decode(&model, &prompt, &SamplerParams { policy: Policy::Prefix, ..p.clone() });
        let spec = decode(&model, &prompt, &SamplerParams { policy: Policy::Spec, spec_blocks: 1, ..p.clone() });
        assert!(spec.drafts_confirmed > 0);
        // One commit per scheduled step, so each confirmed draft saves a pass, except that a
        // block whose drafts were all confirmed still took its confirming pass.
        let blocks = (p.gen_length / p.block_length) as u64;
        assert!(spec.forward_passes + spec.drafts_confirmed <= prefix.forward_passes + blocks, "{} + {} vs {}", spec.forward_passes, spec.drafts_confirmed, prefix.forward_passes);
        assert!(spec.forward_passes < prefix.forward_passes);
        assert!(!spec.output_ids.contains(&model.header.special.mask));
    }
}

#[test]
fn eval_compares_a_policy_with_a_reference_run() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let tasks = dir.path().join("tasks.jsonl");
    let lines: Vec<&str> = include_str!("../../models/tasks/heldout.jsonl").lines().take(4).collect();
    std::fs::write(&tasks, lines.join("\n")).unwrap();
    let eval = |extra: &[&str]| {
        let mut args = vec!["eval", art.to_str().unwrap(), "--tasks", tasks.to_str().unwrap(), "--gen-len", "64", "--steps", "64", "--json"];
        args.extend_from_slice(extra);
        let o = common::run("llada-rt", &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        o.stdout
    };
    let reference = dir.path().join("exact.json");
    std::fs::write(&reference, eval(&[])).unwrap();
    let r = reference.to_str().unwrap();
    let same: serde_json::Value = serde_json::from_slice(&eval(&["--policy", "prefix", "--refresh-every", "1", "--reference", r])).unwrap();
    assert_eq!(same["exact_match"], 1.0);
    let dual: serde_json::Value = serde_json::from_slice(&eval(&["--policy", "dual", "--reference", r])).unwrap();
    let exact: serde_json::Value = serde_json::from_slice(&std::fs::read(&reference).unwrap()).unwrap();
    assert!(dual["rows_computed"].as_u64() < exact["rows_computed"].as_u64());
    assert!(dual["exact_match"].as_f64().is_some());
}
