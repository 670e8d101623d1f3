//! Careless checkpoints (issue 40, items 4 and 6): what a damaged or hand-edited checkpoint
//! holds is checked as it is read, and `gen-checkpoint` never mixes two checkpoints in one
//! folder. Each case gets one line of error naming the thing at fault and leaves nothing behind.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_clean_failure, checkpoint, compile_refused, edit_json, leftovers, run, set_weight};
use llada_tools::checkpoint::{Shape, WeightType};

/// A random-weight checkpoint of `shape` in `dir/ckpt`.
fn ckpt(dir: &Path, shape: Shape, weights: WeightType, shard_bytes: u64) -> PathBuf {
    let ckpt = dir.join("ckpt");
    checkpoint(&ckpt, shape, weights, shard_bytes, 0.02);
    ckpt
}

/// `lladac compile` of `model` with `extra` flags fails with one line holding `needles` and
/// writes nothing.
fn refused_with(model: &Path, extra: &[&str], needles: &[&str]) -> String {
    let out_dir = model.parent().unwrap().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("model.lad");
    let mut args = vec!["compile", "--model", model.to_str().unwrap(), "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = run("lladac", &args);
    assert_clean_failure(&o, needles);
    assert!(leftovers(&out_dir).is_empty(), "a failed compile left {:?}", leftovers(&out_dir));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One NaN or infinity among the weights once compiled (q4 hiding it) and generated NUL
/// tokens: now refused under every --quant, naming the tensor and the element.
#[test]
fn a_non_finite_weight_is_refused_naming_the_tensor_and_its_index_under_every_quant() {
    let dir = tempfile::tempdir().unwrap();
    let model = ckpt(dir.path(), Shape::tiny(), WeightType::F32, u64::MAX);
    let d = Shape::tiny().d_model;
    set_weight(&model, "model.transformer.blocks.0.q_proj.weight", 3 * d + 5, &f32::NAN.to_le_bytes());
    for quant in ["f32", "bf16", "f16", "q8", "q4"] {
        refused_with(&model, &["--quant", quant], &["model.transformer.blocks.0.q_proj.weight", "NaN", "[3, 5]", &format!("flat index {}", 3 * d + 5)]);
    }
    // A norm (stored as it is, not packed) of a sharded bf16 checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let model = ckpt(dir.path(), Shape::tiny(), WeightType::Bf16, 200_000);
    set_weight(&model, "model.transformer.blocks.1.ff_norm.weight", 7, &half::bf16::INFINITY.to_le_bytes());
    refused_with(&model, &[], &["model.transformer.blocks.1.ff_norm.weight", "inf", "[7]"]);
    // Dream's head in f16.
    let dir = tempfile::tempdir().unwrap();
    let model = ckpt(dir.path(), Shape::tiny_dream(), WeightType::F16, u64::MAX);
    let d = Shape::tiny_dream().d_model;
    set_weight(&model, "lm_head.weight", 10 * d, &half::f16::NEG_INFINITY.to_le_bytes());
    refused_with(&model, &["--quant", "q4"], &["lm_head.weight", "-inf", "[10, 0]"]);
}

/// A finite weight past f16's range became infinity in an f16 artifact, and then NaN logits.
#[test]
fn a_weight_past_f16s_range_is_refused_under_quant_f16() {
    let dir = tempfile::tempdir().unwrap();
    let model = ckpt(dir.path(), Shape::tiny(), WeightType::F32, u64::MAX);
    set_weight(&model, "model.transformer.blocks.0.up_proj.weight", 9, &70000f32.to_le_bytes());
    refused_with(&model, &["--quant", "f16"], &["model.transformer.blocks.0.up_proj.weight", "element 9", "f16's range", "--quant bf16 or f32"]);
    let out = dir.path().join("bf16.lad");
    let o = common::run("lladac", &["compile", "--model", model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quant", "bf16"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// `rope_theta` 0 or negative and `rms_norm_eps` negative once compiled: refused by key, in
/// each family's config.
#[test]
fn config_floats_outside_their_range_are_refused_naming_the_key() {
    for (shape, key, value) in [
        (Shape::tiny(), "rope_theta", 0.0),
        (Shape::tiny(), "rope_theta", -500000.0),
        (Shape::tiny(), "rms_norm_eps", -1e-5),
        (Shape::tiny_moe(), "rope_theta", 0.0),
        (Shape::tiny_moe(), "rms_norm_eps", -1e-5),
        (Shape::tiny_dream(), "rope_theta", -1.0),
        (Shape::tiny_dream(), "rms_norm_eps", -1e-6),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let model = ckpt(dir.path(), shape, WeightType::F32, u64::MAX);
        edit_json(&model.join("config.json"), |c| c[key] = serde_json::json!(value));
        compile_refused(&model, &["config.json", key, "out of range"]);
    }
}

/// `max_sequence_length` 4294967396 became 100 and `mask_token_id` 4294967571 became 275
/// (wrapped to 32 bits past the range checks), and 2^62 reported a "--max-seq 0" no one gave:
/// every integer key is checked against its width, by key.
#[test]
fn integer_keys_wider_than_their_type_are_refused_naming_the_key() {
    let big = |low: u64| (1u64 << 32) + low;
    for (shape, file, key, value) in [
        (Shape::tiny(), "config.json", "max_sequence_length", big(100)),
        (Shape::tiny(), "config.json", "max_sequence_length", 1u64 << 62),
        (Shape::tiny(), "config.json", "mask_token_id", big(275)),
        (Shape::tiny(), "config.json", "eos_token_id", big(1)),
        (Shape::tiny(), "config.json", "n_layers", big(2)),
        (Shape::tiny_moe(), "generation_config.json", "mask_token_id", big(1)),
        (Shape::tiny_moe(), "config.json", "num_experts", big(8)),
        (Shape::tiny_dream(), "config.json", "max_position_embeddings", big(512)),
        (Shape::tiny_dream(), "config.json", "hidden_size", big(128)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let model = ckpt(dir.path(), shape, WeightType::F32, u64::MAX);
        edit_json(&model.join(file), |c| c[key] = serde_json::json!(value));
        let dir = model.parent().unwrap();
        let before = leftovers(dir);
        let o = run("lladac", &["compile", "--model", model.to_str().unwrap(), "-o", dir.join("out.lad").to_str().unwrap()]);
        assert_clean_failure(&o, &[file, key, &value.to_string()]);
        assert!(!String::from_utf8_lossy(&o.stderr).contains("--max-seq"), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(leftovers(dir), before);
    }
}

/// Templates with syntax errors were accepted by `lladac`, and one with nested loops compiled
/// and then took 80 s and 16 GB at run time: `lladac` compiles the template and renders one
/// turn as the runtime would, under the runtime's bounds.
#[test]
fn chat_templates_the_runtime_cannot_render_are_refused_at_compile_time() {
    for (template, needle) in [
        ("{% for message in messages %}{{ message['content'] }}", "syntax error"),
        ("{{ messages[0]['content'] | no_such_filter }}", "no_such_filter"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i ~ j }}{% endfor %}{% endfor %}", "steps"),
        ("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}", "bytes"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let model = ckpt(dir.path(), Shape::tiny(), WeightType::F32, u64::MAX);
        edit_json(&model.join("tokenizer_config.json"), |c| c["chat_template"] = serde_json::json!(template));
        compile_refused(&model, &["tokenizer_config.json", "chat_template", needle]);
    }
}

/// A template whose work grows with the prompt passes the dry run (one short turn) but not a
/// long prompt at run time: the runtime's fuel stops it at once, naming the chat template.
#[test]
fn a_chat_template_that_loops_on_the_prompt_stops_at_run_time_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = ckpt(dir.path(), Shape::tiny(), WeightType::F32, u64::MAX);
    let quadratic = "{% for a in messages[0]['content'] %}{% for b in messages[0]['content'] %}{% endfor %}{% endfor %}{{ messages[0]['content'] }}";
    edit_json(&model.join("tokenizer_config.json"), |c| c["chat_template"] = serde_json::json!(quadratic));
    let art = dir.path().join("model.lad");
    common::compile(&model, &art, Some(256));
    let short = run("llada-rt", &["run", art.to_str().unwrap(), "--chat", "-p", "hello", "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert!(short.status.success(), "{}", String::from_utf8_lossy(&short.stderr));
    let long = "x".repeat(3000);
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--chat", "-p", &long, "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&o, &["chat template", "steps"]);
}

/// A sharded checkpoint written over by a single-file one left its index and shards, and
/// `lladac` compiled the stale shards: both present are refused, naming both.
#[test]
fn a_single_file_beside_a_shard_index_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let model = ckpt(dir.path(), Shape::tiny(), WeightType::F32, 200_000);
    checkpoint(&model, Shape::tiny(), WeightType::F32, u64::MAX, 0.02);
    assert!(model.join("model.safetensors.index.json").exists() && model.join("model.safetensors").exists());
    compile_refused(&model, &["both model.safetensors and model.safetensors.index.json"]);
}

/// `gen-checkpoint` into a folder holding a checkpoint left the old shards and index beside the
/// new file: a non-empty folder is refused, naming it, unless --replace, which removes only
/// what gen-checkpoint writes.
#[test]
fn gen_checkpoint_refuses_a_non_empty_folder_unless_told_to_replace_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("ckpt");
    let o = out.to_str().unwrap();
    let sharded = run("gen-checkpoint", &["--dtype", "f32", "--shard-mb", "1", "-o", o]);
    assert!(sharded.status.success(), "{}", String::from_utf8_lossy(&sharded.stderr));
    let before = leftovers(&out);
    assert!(before.contains(&"model.safetensors.index.json".to_string()), "{before:?}");
    let config = std::fs::read(out.join("config.json")).unwrap();

    let again = run("gen-checkpoint", &["--n-layers", "1", "-o", o]);
    assert_clean_failure(&again, &[o, "not empty", "--replace"]);
    assert_eq!(leftovers(&out), before);
    assert_eq!(std::fs::read(out.join("config.json")).unwrap(), config);

    let replaced = run("gen-checkpoint", &["--n-layers", "1", "--replace", "-o", o]);
    assert!(replaced.status.success(), "{}", String::from_utf8_lossy(&replaced.stderr));
    let mut now = leftovers(&out);
    now.sort();
    assert_eq!(now, ["config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]);
    common::compile(&out, &dir.path().join("model.lad"), None);

    // Anything gen-checkpoint did not write is neither removed nor written beside.
    std::fs::write(out.join("notes.txt"), "mine").unwrap();
    let foreign = run("gen-checkpoint", &["--replace", "-o", o]);
    assert_clean_failure(&foreign, &[o, "notes.txt", "choose another folder"]);
    assert!(out.join("notes.txt").exists() && out.join("model.safetensors").exists());
}

/// `gen-checkpoint --init-std nan` panicked and left an empty folder: each nonsense number is
/// refused, naming its flag, before anything is created.
#[test]
fn gen_checkpoint_refuses_nonsense_numbers_before_creating_anything() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("new");
    for (args, flag) in [
        (&["--init-std", "nan"][..], "--init-std"),
        (&["--init-std=-1"][..], "--init-std"),
        (&["--init-std", "inf"][..], "--init-std"),
        (&["--shard-mb", "0"][..], "--shard-mb"),
        (&["--shard-mb", "18446744073709551615"][..], "--shard-mb"),
        (&["--d-model", "0"][..], "--d-model"),
        (&["--n-layers", "0"][..], "--n-layers"),
        (&["--outlier-channels", "2", "--outlier-gain", "nan"][..], "--outlier-gain"),
    ] {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", out.to_str().unwrap()]);
        assert_clean_failure(&run("gen-checkpoint", &all), &[flag]);
        assert!(!out.exists(), "{args:?} created {}", out.display());
    }
}
