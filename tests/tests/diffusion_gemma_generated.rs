//! `gen-checkpoint`'s DiffusionGemma preset against the published code: the tiny preset's
//! first decoder pass gives the logits transformers 5.23 computes on the same checkpoint
//! (`tests/data/diffusiongemma-generated/first_decoder_pass.json`, written by
//! `tools/diffusion_gemma/check_generated_checkpoint.py logits`), and the command-line path
//! (gen-checkpoint, lladac compile, llada-rt run) works on it.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::{Model, Session};
use llada_tools::checkpoint::{self, CheckpointSpec, Shape, WeightType};

fn golden() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/diffusiongemma-generated/first_decoder_pass.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The float64 sum of every stored f32 value: the golden's fingerprint of the weights.
fn weights_sum(file: &Path) -> (f64, usize) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let sum = st.tensors().iter().map(|(_, t)| t.data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64).sum::<f64>()).sum();
    (sum, st.len())
}

/// The first decoder pass (the chat-framed prompt encoded, then a fixed canvas without
/// self-conditioning) of the checkpoint `gen-checkpoint --preset tiny-diffusiongemma --dtype
/// f32` writes gives transformers' logits on every canvas row.
#[test]
fn the_tiny_presets_first_decoder_pass_gives_the_published_logits() {
    let g = golden();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    // gen-checkpoint's defaults: seed 0, init-std 0.02, one shard.
    let spec = CheckpointSpec { shape: Shape::tiny_diffusion_gemma(), weights: WeightType::F32, shard_bytes: 2_000_000_000, seed: 0, init_std: 0.02, outliers: None };
    checkpoint::write(&spec, &ckpt).unwrap();
    let (sum, tensors) = weights_sum(&ckpt.join("model.safetensors"));
    let want_sum = g["weights_sum"].as_f64().unwrap();
    assert!(
        (sum - want_sum).abs() <= 1e-9 * want_sum.abs() && tensors as u64 == g["tensors"].as_u64().unwrap(),
        "the generator's weights changed ({tensors} tensors summing to {sum}, the golden's {want_sum}): regenerate the golden with tools/diffusion_gemma/check_generated_checkpoint.py logits"
    );

    let lad = dir.path().join("tiny.lad");
    common::compile(&ckpt, &lad, Some(128));
    let model = Model::open(&lad, true).unwrap();
    assert_eq!(model.header.model.architecture, "diffusion-gemma");
    let (prompt, canvas) = (ids(&g["prompt_ids"]), ids(&g["canvas_ids"]));
    assert_eq!(ids(&g["decoder_position_ids"])[0] as usize, prompt.len());
    let mut s = Session::new(&model).unwrap();
    s.encode(&prompt, 0..prompt.len()).unwrap();
    let logits = s.denoise(prompt.len(), &canvas, None).unwrap();
    let width = model.header.model.embedding_size as usize;
    let want: Vec<Vec<f32>> = g["logits"].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()).collect();
    assert_eq!(want.len(), canvas.len());
    let mut worst = 0f64;
    for (r, row) in want.iter().enumerate() {
        let err = common::relative_error(&logits[r * width..(r + 1) * width], row);
        assert!(err < 1e-5, "row {r}: relative error {err}");
        worst = worst.max(err);
    }
    eprintln!("worst row's relative error: {worst:.2e}");
}

/// The command-line path on the tiny preset as written by default (bf16): gen-checkpoint,
/// `lladac compile`, `llada-rt run`.
#[test]
fn gen_checkpoints_tiny_preset_compiles_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, lad) = (dir.path().join("ckpt"), dir.path().join("x.lad"));
    let (ckpt, lad) = (ckpt.to_str().unwrap(), lad.to_str().unwrap());
    for (binary, args) in [
        ("gen-checkpoint", &["--preset", "tiny-diffusiongemma", "-o", ckpt][..]),
        ("lladac", &["compile", "--model", ckpt, "-o", lad]),
        ("llada-rt", &["run", lad, "-p", "hello", "--gen-len", "16"]),
    ] {
        let o = common::run(binary, args);
        assert!(o.status.success(), "{binary} {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}
