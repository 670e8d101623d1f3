//! Golden regression tests: what the embedded default model (`models/llada-tiny-tasks`)
//! generates for a matrix of sampler settings, pinned token for token (output ids and the
//! per-step reveals), plus its first-pass logits at a few positions within 1e-4.
//!
//! Regenerate on purpose (after a change that is meant to alter outputs) with
//!
//! ```sh
//! LLADA_BLESS=1 cargo test --release -p llada-e2e --test golden
//! ```
//!
//! and review the diff of `tests/golden/embedded.json`.

mod common;

use std::path::PathBuf;

use llada_rt::text::Text;
use llada_rt::{generate, Model, Remasking, SamplerParams, Session};
use serde_json::{json, Value};

const LOGIT_TOLERANCE: f64 = 1e-4;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The prompts: one of each task kind (chat turns).
const PROMPTS: [&str; 2] = [
    "FILL:0022001000121700300003040240606040000020037096000250158001600037=",
    "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=",
];

/// (name, settings): lengths, schedules with remainders, guidance, sampling, remasking, EOS options.
fn settings() -> Vec<(&'static str, SamplerParams)> {
    let base = SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() };
    vec![
        ("g64_b32_s64", base.clone()),
        ("g64_b32_s20", SamplerParams { steps: 20, ..base.clone() }),
        ("g64_b64_s32", SamplerParams { block_length: 64, steps: 32, ..base.clone() }),
        ("g64_b16_s64", SamplerParams { block_length: 16, ..base.clone() }),
        ("g96_b32_s96", SamplerParams { gen_length: 96, steps: 96, ..base.clone() }),
        ("g96_b32_s48_eos_options", SamplerParams { gen_length: 96, steps: 48, logits_eos_inf: true, confidence_eos_eot_inf: true, ..base.clone() }),
        ("g64_b32_s32_cfg0.5", SamplerParams { steps: 32, cfg_scale: 0.5, ..base.clone() }),
        ("g64_b32_s64_t0.7_seed1", SamplerParams { temperature: 0.7, seed: 1, ..base.clone() }),
        ("g64_b32_s32_t1.0_seed2", SamplerParams { steps: 32, temperature: 1.0, seed: 2, ..base.clone() }),
        ("g64_b32_s64_random_seed3", SamplerParams { remasking: Remasking::Random, seed: 3, ..base }),
    ]
}

/// Positions (in the generation) whose first-pass logits are pinned.
const LOGIT_POSITIONS: [u32; 4] = [0, 21, 40, 63];

fn first_pass_logits(session: &mut Session, prompt: &[u32]) -> Vec<Vec<f64>> {
    let mask = session.model.header.special.mask;
    let seq: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, 64)).collect();
    let rows: Vec<u32> = LOGIT_POSITIONS.iter().map(|&p| prompt.len() as u32 + p).collect();
    let logits = session.forward_full(&seq, &rows).unwrap();
    let vocab = logits.len() / rows.len();
    logits.chunks(vocab).map(|r| r.iter().map(|&v| (v as f64 * 1e5).round() / 1e5).collect()).collect()
}

fn produce() -> Value {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("embedded.lad");
    common::compile(&repo().join("models/llada-tiny-tasks"), &art, None);
    let model = Model::open(&art, true).unwrap();
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let mut session = Session::new(&model).unwrap();
    let mut cases = Vec::new();
    let mut logits = Vec::new();
    for prompt in PROMPTS {
        let ids = text.encode_chat(prompt).unwrap();
        logits.push(json!({ "prompt": prompt, "positions": LOGIT_POSITIONS, "logits": first_pass_logits(&mut session, &ids) }));
        for (name, p) in settings() {
            let g = generate(&mut session, &ids, &p, &mut |_| {}).unwrap();
            cases.push(json!({
                "prompt": prompt,
                "setting": name,
                "answer": text.answer(&g.output_ids),
                "output_ids": g.output_ids,
                "reveals": g.reveals,
            }));
        }
    }
    json!({ "model": "models/llada-tiny-tasks", "cases": cases, "first_pass_logits": logits })
}

#[test]
fn embedded_model_outputs_are_unchanged() {
    let path = repo().join("tests/golden/embedded.json");
    let now = produce();
    if std::env::var_os("LLADA_BLESS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&now).unwrap() + "\n").unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("tests/golden/embedded.json exists (see the doc comment to create it)")).unwrap();
    let mut failures = Vec::new();
    for (want, got) in golden["cases"].as_array().unwrap().iter().zip(now["cases"].as_array().unwrap()) {
        let id = format!("{} / {}", want["setting"], want["prompt"]);
        if want["output_ids"] != got["output_ids"] {
            failures.push(format!("{id}: output changed: {} -> {}", want["answer"], got["answer"]));
        } else if want["reveals"] != got["reveals"] {
            failures.push(format!("{id}: same output, different reveal order"));
        }
    }
    for (want, got) in golden["first_pass_logits"].as_array().unwrap().iter().zip(now["first_pass_logits"].as_array().unwrap()) {
        let flat = |v: &Value| -> Vec<f64> { v["logits"].as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap())).collect() };
        let err = flat(want).iter().zip(flat(got)).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        if err > LOGIT_TOLERANCE {
            failures.push(format!("first-pass logits of {}: max abs change {err:.2e}", want["prompt"]));
        }
    }
    assert_eq!(golden["cases"].as_array().unwrap().len(), now["cases"].as_array().unwrap().len(), "the settings matrix changed; regenerate");
    assert!(failures.is_empty(), "golden outputs changed (regenerate with LLADA_BLESS=1 if intended):\n{}", failures.join("\n"));
}
