//! Bad input: each case gets one line of error naming the thing at fault, a non-zero exit,
//! no panic, and no partial artifact.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_clean_failure, leftovers, run};
use llada_tools::checkpoint::{Shape, WeightType};
use safetensors::tensor::TensorView;

/// A tiny single-file f32 checkpoint in `dir/ckpt`.
fn tiny(dir: &Path) -> std::path::PathBuf {
    let ckpt = dir.join("ckpt");
    common::checkpoint(&ckpt, Shape::tiny(), WeightType::F32, u64::MAX, 0.02);
    ckpt
}

/// Rewrites `model.safetensors` through `edit(name, shape) -> Some(new shape) | None (drop)`.
fn rewrite_weights(ckpt: &Path, edit: impl Fn(&str, &[usize]) -> Option<Vec<usize>>) {
    let path = ckpt.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        if let Some(shape) = edit(&name, view.shape()) {
            let n: usize = shape.iter().product();
            owned.push((name, shape, view.data()[..n * 4].to_vec()));
        }
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, s, d)| (n.clone(), TensorView::new(safetensors::Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

/// Runs `lladac compile` into `dir/out.lad`, which must not exist afterwards.
fn compile_fails(dir: &Path, ckpt: &Path, needles: &[&str]) {
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("model.lad");
    let o = run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_clean_failure(&o, needles);
    assert!(leftovers(&out_dir).is_empty(), "a failed compile left {:?}", leftovers(&out_dir));
}

/// A compiled tiny artifact.
fn artifact(dir: &Path, max_seq: Option<u32>) -> std::path::PathBuf {
    common::random_artifact(dir, Shape::tiny(), 0.02, "model.lad", max_seq)
}

fn run_ids(art: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", art.to_str().unwrap(), "--prompt-ids", "1,2,3,4", "--gen-len", "16", "--block-len", "8", "--steps", "16"];
    args.extend_from_slice(extra);
    run("llada-rt", &args)
}

/// The tiny checkpoint, damaged by `damage`, fails to compile as [`compile_fails`] checks.
fn damaged_checkpoint_fails(damage: impl FnOnce(&Path), needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny(dir.path());
    damage(&ckpt);
    compile_fails(dir.path(), &ckpt, needles);
}

#[test]
fn missing_tensor() {
    damaged_checkpoint_fails(|ckpt| rewrite_weights(ckpt, |name, shape| (!name.contains("blocks.1.k_proj")).then(|| shape.to_vec())), &["model.transformer.blocks.1.k_proj.weight", "missing"]);
}

#[test]
fn wrong_tensor_shape() {
    let narrower_up_proj = |name: &str, shape: &[usize]| Some(if name.contains("blocks.0.up_proj") { vec![shape[0] - 1, shape[1]] } else { shape.to_vec() });
    damaged_checkpoint_fails(|ckpt| rewrite_weights(ckpt, narrower_up_proj), &["model.transformer.blocks.0.up_proj.weight", "[383, 128]", "[384, 128]"]);
}

#[test]
fn unsupported_config_value() {
    damaged_checkpoint_fails(|ckpt| common::edit_json(&ckpt.join("config.json"), |cfg| cfg["alibi"] = serde_json::json!(true)), &["config.json", "alibi", "not supported"]);
}

#[test]
fn truncated_safetensors() {
    let cut_1000_bytes = |ckpt: &Path| {
        let path = ckpt.join("model.safetensors");
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len - 1000).unwrap();
    };
    damaged_checkpoint_fails(cut_1000_bytes, &["model.safetensors", "truncated"]);
}

#[test]
fn one_flipped_byte_anywhere_in_an_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let good = std::fs::read(&art).unwrap();
    assert!(run_ids(&art, &[]).status.success());
    // In the preamble, its padding, a weight, the padding between tensors, and the header.
    let header_at = u64::from_le_bytes(good[32..40].try_into().unwrap()) as usize;
    for (at, needle) in [(20, "preamble"), (1000, "preamble padding"), (4096 + 5000, "tensor 'model.transformer.wte.weight'"), (header_at + 10, "header")] {
        let mut bad = good.clone();
        bad[at] ^= 0x04;
        std::fs::write(&art, &bad).unwrap();
        let o = run_ids(&art, &[]);
        assert_clean_failure(&o, &["model.lad", needle]);
    }
}

#[test]
fn artifact_of_another_format_version() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let mut bytes = std::fs::read(&art).unwrap();
    bytes[8..10].copy_from_slice(&(llada_ir::FORMAT_MAJOR + 1).to_le_bytes());
    std::fs::write(&art, &bytes).unwrap();
    let o = run_ids(&art, &[]);
    assert_clean_failure(&o, &["model.lad", &format!("format version {}.0", llada_ir::FORMAT_MAJOR + 1), "recompile"]);
}

#[test]
fn prompt_longer_than_the_compiled_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let ids: Vec<String> = (0..60).map(|i| (i % 200).to_string()).collect();
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", &ids.join(","), "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&o, &["76 positions", "at most 64", "--max-seq 76"]);
}

#[test]
fn gen_length_not_a_multiple_of_block_length() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", "1,2", "--gen-len", "20", "--block-len", "8", "--steps", "20"]);
    assert_clean_failure(&o, &["--block-len 8 must divide the gen length 20"]);
}

#[test]
fn steps_not_a_multiple_of_the_block_count() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", "1,2", "--gen-len", "16", "--block-len", "8", "--steps", "5"]);
    assert_clean_failure(&o, &["--steps 5", "multiple of the 2 blocks"]);
}

#[test]
fn paths_that_do_not_exist() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nowhere");
    let out = dir.path().join("x.lad");
    let o = run("lladac", &["compile", "--model", missing.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert_clean_failure(&o, &["nowhere", "does not exist"]);
    assert!(!out.exists());
    let o = run("llada-rt", &["run", dir.path().join("none.lad").to_str().unwrap(), "-p", "hi"]);
    assert_clean_failure(&o, &["none.lad", "does not exist"]);
    let o = run("lladac", &["inspect", dir.path().join("none.lad").to_str().unwrap()]);
    assert_clean_failure(&o, &["none.lad", "does not exist"]);
    let o = run("llada-rt", &["conformance", dir.path().join("golden.json").to_str().unwrap(), "--model", out.to_str().unwrap()]);
    assert_clean_failure(&o, &["does not exist"]);
}

#[test]
fn wrong_flag() {
    let o = run("llada-rt", &["run", "x.lad", "-p", "hi", "--gen-lenght", "8"]);
    assert_clean_failure(&o, &["--gen-lenght"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn policy_options_that_do_not_combine() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    assert_clean_failure(&run_ids(&art, &["--policy", "dual", "--cfg", "0.5"]), &["--cfg 0.5 needs the exact policy"]);
    assert_clean_failure(&run_ids(&art, &["--threshold", "1.5"]), &["--threshold 1.5"]);
    assert_clean_failure(&run_ids(&art, &["--policy", "spec", "--spec-threshold", "2"]), &["--spec-threshold 2"]);
    let ckpt = dir.path().join("ckpt");
    let out = dir.path().join("q4.lad");
    let o = run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quant", "q4", "--activations", "bf16"]);
    assert_clean_failure(&o, &["--activations bf16", "--quant bf16"]);
    assert!(!out.exists());
    // Activation scales are for int8 activations (q8, q4) only.
    let o = run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quant", "f16", "--activation-scales", "block"]);
    assert_clean_failure(&o, &["--activation-scales block", "q8 and q4", "f16"]);
    assert!(!out.exists());
    let o = run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--max-seq", "64", "--block-len", "100"]);
    assert_clean_failure(&o, &["--block-len 100"]);
}

#[test]
fn golden_replay_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let not_golden = dir.path().join("not-golden.json");
    std::fs::write(&not_golden, "{\"cases\": 3}").unwrap();
    let o = run("llada-rt", &["golden", not_golden.to_str().unwrap(), "--model", art.to_str().unwrap()]);
    assert_clean_failure(&o, &["not-golden.json", "not a golden file"]);
    let embedded = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/embedded.json");
    let o = run("llada-rt", &["golden", embedded.to_str().unwrap(), "--model", art.to_str().unwrap(), "--every", "4", "--offset", "4"]);
    assert_clean_failure(&o, &["--every 4 --offset 4"]);
    let o = run("llada-rt", &["conformance", embedded.to_str().unwrap(), "--model", art.to_str().unwrap(), "--every", "0"]);
    assert_clean_failure(&o, &["--every 0"]);
}

// Inputs a user can type to `llada-rt run` (docs/usage.md).

/// The mask token in a prompt, as text or as an id, is refused by name: the official sampler
/// would fill a masked prompt position too, which is infilling, not a prompt.
#[test]
fn mask_token_in_a_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let art = art.to_str().unwrap();
    let o = run("llada-rt", &["run", art, "-p", "<|mdm_mask|>hello", "--gen-len", "32", "--steps", "32"]);
    assert_clean_failure(&o, &["prompt token 0 is the mask token (id 275)", "cannot contain masks"]);
    let o = run("llada-rt", &["run", art, "--prompt-ids", "65,66,275,67", "--gen-len", "32", "--steps", "32"]);
    assert_clean_failure(&o, &["prompt token 2 is the mask token (id 275)"]);
}

/// Other special tokens in prompt text are those tokens (as Hugging Face `encode` reads them),
/// not their characters.
#[test]
fn special_tokens_in_prompt_text_are_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "-p", "A<|eot_id|>B<|endoftext|>", "--gen-len", "32", "--steps", "32", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ids: Vec<u64> = v["prompt_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).collect();
    assert_eq!(ids, vec![65, 278, 66, 274]);
}

/// eval names a tasks file's line for a prompt the model refuses and for a field it does not
/// know; bench refuses no timed run and more logit rows than a pass has.
#[test]
fn eval_and_bench_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let a = art.to_str().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    let eval = |lines: &str| {
        std::fs::write(&tasks, lines).unwrap();
        run("llada-rt", &["eval", a, "--tasks", tasks.to_str().unwrap(), "--gen-len", "16", "--block-len", "16", "--steps", "16"])
    };
    let ok = r#"{"prompt":"FILL:10=","chat":true,"expected":"11"}"#;
    assert_clean_failure(&eval(&format!("{ok}\n\n{{\"prompt\":\"A<|mdm_mask|>\",\"expected\":\"x\"}}\n")), &["tasks.jsonl", "line 3", "mask token"]);
    assert_clean_failure(&eval(r#"{"prompt":"a","expected":"b","extra":3}"#), &["tasks.jsonl", "line 1", "unknown field `extra`"]);
    let bench = |extra: &[&str]| run("llada-rt", &[&["bench", a, "--rows", "16"], extra].concat());
    assert_clean_failure(&bench(&["--repeat", "0"]), &["--repeat", "must be at least 1"]);
    assert_clean_failure(&bench(&["--logit-rows", "17"]), &["--logit-rows 17 is outside 1..=16"]);
}

/// bench's made-up prompt never holds the mask token, however long (one of 173 tokens or more
/// once did, and the sampler refused it).
#[test]
fn a_long_bench_prompt_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let o = run("llada-rt", &["bench", art.to_str().unwrap(), "--rows", "8", "--repeat", "1", "--generate", "--gen-len", "16", "--steps", "16", "--block-len", "8", "--prompt-len", "200"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn empty_prompt_and_zero_threads_and_negative_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "-p", "", "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&o, &["the prompt is empty"]);
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", " , ", "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&o, &["the prompt is empty"]);
    // The chat template's own tokens do not make an empty turn a prompt.
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--chat", "-p", "", "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&o, &["the prompt is empty"]);
    assert_clean_failure(&run_ids(&art, &["--threads", "0"]), &["--threads", "must be at least 1"]);
    // bench checks the threads against the plan before its roofline runs on them (1,000
    // threads' buffers once aborted it for want of memory).
    let a = art.to_str().unwrap();
    assert_clean_failure(&run("llada-rt", &["bench", a, "--rows", "8", "--repeat", "1", "--threads", "1000"]), &["--threads 1000 is outside 1..="]);
    let o = std::process::Command::new(common::bin("llada-rt")).args(["bench", a, "--rows", "8", "--repeat", "1"]).env("LLADA_THREADS", "1000").output().unwrap();
    assert_clean_failure(&o, &["LLADA_THREADS=\"1000\"", "1..="]);
    // Negative numbers reach the option's own check, which names it and its range.
    assert_clean_failure(&run_ids(&art, &["--cfg", "-1"]), &["--cfg -1 must be a finite number >= 0"]);
    assert_clean_failure(&run_ids(&art, &["--temperature", "-0.5"]), &["--temperature -0.5"]);
    assert_clean_failure(&run_ids(&art, &["--threshold", "-0.1"]), &["--threshold -0.1"]);
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", "1,2", "--steps", "-3"]);
    assert_clean_failure(&o, &["'-3'", "--steps"]);
}

/// A prompt that fills the compiled maximum exactly (with the generation) runs; one token
/// more is refused with the numbers and the fix.
#[test]
fn prompt_at_exactly_the_compiled_maximum() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path(), Some(64));
    let ids: Vec<String> = (0..48).map(|i| (i % 200).to_string()).collect();
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", &ids.join(","), "--gen-len", "16", "--block-len", "8", "--steps", "16", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["output_ids"].as_array().unwrap().len(), 16);
    let ids: Vec<String> = (0..49).map(|i| (i % 200).to_string()).collect();
    let o = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", &ids.join(","), "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&o, &["65 positions", "at most 64"]);
}

/// A decoder section that is not JSON made the `tokenizers` library panic (found by
/// `llada-fuzz importer`); the importer names the file instead.
#[test]
fn malformed_tokenizer_section() {
    let dir = tempfile::tempdir().unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, ckpt.join(f.file_name().unwrap())).unwrap();
    }
    let tok = std::fs::read_to_string(ckpt.join("tokenizer.json")).unwrap();
    let at = tok.find("\"decoder\"").unwrap();
    let broken = format!("{}{}", &tok[..at], tok[at..].replacen("\"trim_offsets\": true", "\"trim_offsets\" true", 1));
    std::fs::write(ckpt.join("tokenizer.json"), broken).unwrap();
    compile_fails(dir.path(), &ckpt, &["tokenizer.json", "malformed"]);
}
