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
use llada_rt::{Model, Remasking, SamplerParams, Session};
use llada_rt_tools::golden;

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

/// Positions (in a 64-token generation) whose first-pass logits are pinned.
const LOGIT_POSITIONS: [u32; 4] = [0, 21, 40, 63];

/// The golden file is produced and replayed by `llada_rt_tools::golden`, the code behind
/// `llada-rt golden`, which replays it on other machines (the aarch64 build under qemu in
/// `.ci/run`).
#[test]
fn embedded_model_outputs_are_unchanged() {
    let path = repo().join("tests/golden/embedded.json");
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("embedded.lad");
    common::compile(&repo().join("models/llada-tiny-tasks"), &art, None);
    let model = Model::open(&art, true).unwrap();
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let mut session = Session::new(&model).unwrap();
    if std::env::var_os("LLADA_BLESS").is_some() {
        let now = golden::produce(&mut session, &text, "models/llada-tiny-tasks", &PROMPTS, &settings(), 64, &LOGIT_POSITIONS).unwrap();
        golden::write(&now, &path, &[]).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let file = golden::read(&path).expect("tests/golden/embedded.json exists (see the doc comment to create it)");
    assert_eq!(file.cases.len(), PROMPTS.len() * settings().len(), "the settings matrix changed; regenerate");
    for (case, (name, p)) in file.cases.iter().zip(PROMPTS.iter().flat_map(|_| settings())) {
        assert_eq!((case.setting.as_str(), serde_json::to_value(&case.params).unwrap()), (name, serde_json::to_value(golden::Params::of(&p).unwrap()).unwrap()), "the settings matrix changed; regenerate");
    }
    let report = golden::check(&mut session, &text, &file, &path, Default::default(), golden::Pin::Reveals).unwrap();
    assert!(report.passed(), "golden outputs changed (regenerate with LLADA_BLESS=1 if intended):\n{}", report.failures.join("\n"));
    assert_eq!((report.output_ids_matched, report.logit_cases_within_tolerance), (file.cases.len(), PROMPTS.len()));
}
