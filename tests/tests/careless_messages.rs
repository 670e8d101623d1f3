//! Issue 40, item 7: each message a careless user met names the real thing, and a flag that
//! would do nothing in its combination (the policy chosen, the weight format, no
//! `--generate`) is refused naming what uses it, instead of being ignored.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{assert_clean_failure, bin, run};
use llada_tools::checkpoint::{Shape, WeightType};

/// A tiny f32 checkpoint of `shape` in `dir/ckpt`.
fn ckpt(dir: &Path, shape: Shape) -> PathBuf {
    let ckpt = dir.join("ckpt");
    common::checkpoint(&ckpt, shape, WeightType::F32, u64::MAX, 0.02);
    ckpt
}

/// The tiny LLaDA checkpoint compiled into `dir/model.lad` with 64 positions.
fn artifact(dir: &Path) -> PathBuf {
    common::random_artifact(dir, Shape::tiny(), 0.02, "model.lad", Some(64))
}

/// `run` of `art` with a 4-token prompt, 16 tokens in blocks of 8 over 16 steps, and `extra`.
fn run_ids(art: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["run", art.to_str().unwrap(), "--prompt-ids", "1,2,3,4", "--gen-len", "16", "--block-len", "8", "--steps", "16"];
    args.extend_from_slice(extra);
    run("llada-rt", &args)
}

/// A usage error: one clean line naming every one of `needles`, exit status 2.
fn refused(out: &Output, needles: &[&str]) {
    assert_clean_failure(out, needles);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn an_artifact_that_is_a_directory_the_null_device_or_a_link_loop_is_called_that() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder.lad");
    std::fs::create_dir(&folder).unwrap();
    let looped = dir.path().join("loop.lad");
    std::os::unix::fs::symlink(dir.path().join("back.lad"), &looped).unwrap();
    std::os::unix::fs::symlink(&looped, dir.path().join("back.lad")).unwrap();
    for (path, says) in [(folder.as_path(), "directory"), (Path::new("/dev/null"), "character device"), (looped.as_path(), "symbolic links")] {
        let p = path.to_str().unwrap();
        for out in [run("llada-rt", &["run", p, "--prompt-ids", "1,2"]), run("lladac", &["inspect", p])] {
            assert_clean_failure(&out, &[p, says]);
            let e = stderr(&out);
            assert!(!e.contains("No such device") && !e.contains("does not exist"), "{e}");
        }
    }
}

#[test]
fn missing_required_arguments_are_named_on_the_error_line() {
    let out = run("llada-rt", &["run", "x.lad"]);
    refused(&out, &["required arguments were not provided: --prompt"]);
    let out = run("llada-rt", &["eval", "x.lad"]);
    refused(&out, &["required arguments were not provided: --tasks"]);
    let out = run("lladac", &["compile"]);
    refused(&out, &["--model", "--output"]);
}

#[test]
fn cpu_threads_0_names_its_own_flag() {
    let out = run("llada-rt", &["run", "x.lad", "--prompt-ids", "1", "--cpu-threads", "0"]);
    refused(&out, &["--cpu-threads", "at least 1"]);
    assert!(!stderr(&out).contains("omit --threads"), "{}", stderr(&out));
    let out = run("llada-rt", &["run", "x.lad", "--prompt-ids", "1", "--threads", "0"]);
    refused(&out, &["--threads", "omit --threads"]);
}

#[test]
fn llada_only_switches_on_dream_are_named_by_their_own_flag() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::random_artifact(dir.path(), Shape::tiny_dream(), 0.02, "dream.lad", Some(64));
    for flag in ["--logits-eos-inf", "--confidence-eos-eot-inf"] {
        let out = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", "1,2", "--gen-len", "16", "--block-len", "16", "--steps", "16", flag]);
        assert_clean_failure(&out, &[flag, "LLaDA's sampler options", "Dream"]);
        assert!(!stderr(&out).contains("--remasking"), "{}", stderr(&out));
    }
}

#[test]
fn minus_inf_and_negative_numbers_are_values_the_option_checks() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path());
    refused(&run_ids(&art, &["--threshold", "-inf"]), &["--threshold -inf must be between 0 and 1"]);
    refused(&run_ids(&art, &["--temperature", "-inf"]), &["--temperature -inf"]);
    refused(&run_ids(&art, &["--cfg", "-inf"]), &["--cfg -inf"]);
    refused(&run_ids(&art, &["--policy", "mbsd", "--spec-threshold", "-1e-3"]), &["--spec-threshold -0.001"]);
    refused(&run_ids(&art, &["--policy", "mbsd", "--stable-confidence", "-inf"]), &["--stable-confidence -inf"]);
    let out = run("llada-rt", &["conformance", "golden.json", "--model", art.to_str().unwrap(), "--logit-tolerance", "-inf"]);
    refused(&out, &["--logit-tolerance", "-inf"]);
}

#[test]
fn a_sequence_longer_than_the_model_takes_is_not_advised_a_max_seq_it_cannot_take() {
    let dir = tempfile::tempdir().unwrap();
    // A model of 64 positions compiled for all of them: no recompile serves 76.
    let ckpt = ckpt(dir.path(), Shape { max_sequence_length: 64, ..Shape::tiny() });
    let art = dir.path().join("model.lad");
    common::compile(&ckpt, &art, None);
    let ids: Vec<String> = (0..60).map(|i| (i % 200).to_string()).collect();
    let out = run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", &ids.join(","), "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&out, &["76 positions", "at most 64", "max_sequence_length", "shorten"]);
    assert!(!stderr(&out).contains("--max-seq 76"), "{}", stderr(&out));
}

#[test]
fn compile_spec_blocks_beyond_the_positions_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = ckpt(dir.path(), Shape::tiny());
    let out_path = dir.path().join("x.lad");
    let o = out_path.to_str().unwrap();
    let c = ckpt.to_str().unwrap();
    for k in ["4294967295", "4"] {
        let out = run("lladac", &["compile", "--model", c, "-o", o, "--max-seq", "64", "--block-len", "16", "--spec-blocks", k]);
        refused(&out, &[&format!("--spec-blocks {k} is outside 0..=3"), "--max-seq"]);
        assert!(!stderr(&out).contains("rows-0"), "{}", stderr(&out));
        assert!(!out_path.exists());
    }
    // Without --max-seq, the target's default bounds it.
    let out = run("lladac", &["compile", "--model", c, "-o", o, "--spec-blocks", "4294967295"]);
    refused(&out, &["--spec-blocks 4294967295 is outside 0..=127", "host target"]);
    let out = run("lladac", &["compile", "--model", c, "-o", o, "--max-seq", "64", "--block-len", "16", "--spec-blocks", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Without --max-seq, the model's own maximum (64 positions here) bounds it too.
    std::fs::remove_file(&out_path).unwrap();
    let small = dir.path().join("small");
    common::checkpoint(&small, Shape { max_sequence_length: 64, ..Shape::tiny() }, WeightType::F32, u64::MAX, 0.02);
    let out = run("lladac", &["compile", "--model", small.to_str().unwrap(), "-o", o, "--block-len", "16", "--spec-blocks", "4"]);
    // (Known once the checkpoint is read, as the other flags the compile refuses: status 1.)
    assert_clean_failure(&out, &["--spec-blocks 4 is outside 0..=3", "64 positions", "max_sequence_length"]);
    assert!(!out_path.exists());
}

/// Compile mistakes refused before the work, each naming what was given (and not a flag that
/// was not): fewer logit rows than a block, a model that is a file of neither known kind, an
/// output that names a folder, a target that cannot hold the checkpoint's own weight type.
#[test]
fn compile_mistakes_name_what_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = ckpt(dir.path(), Shape::tiny());
    let out_path = dir.path().join("x.lad");
    let (c, o) = (ckpt.to_str().unwrap(), out_path.to_str().unwrap());
    let out = run("lladac", &["compile", "--model", c, "-o", o, "--logit-rows", "8"]);
    assert_clean_failure(&out, &["--logit-rows 8 is fewer than the block length 32 (--block-len)"]);
    let config = ckpt.join("config.json");
    let out = run("lladac", &["compile", "--model", config.to_str().unwrap(), "-o", o]);
    assert_clean_failure(&out, &["config.json: a file that is neither GGUF nor ONNX", "folder"]);
    let folder = format!("{}/", dir.path().join("new").display());
    let out = run("lladac", &["compile", "--model", c, "-o", &folder]);
    assert_clean_failure(&out, &["ends in a path separator, which names a folder"]);
    assert!(!dir.path().join("new").exists());
    let out = run("lladac", &["compile", "--model", c, "-o", o, "--target", "dimensity9400"]);
    assert_clean_failure(&out, &["the checkpoint's f32 weights (no --quant): target 'dimensity9400' supports"]);
    assert!(!out_path.exists());
}

#[test]
fn bench_rows_0_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path());
    for rows in ["0", "16,0", "65"] {
        let out = run("llada-rt", &["bench", art.to_str().unwrap(), "--rows", rows, "--repeat", "1"]);
        refused(&out, &["--rows", "is outside 1..=64"]);
        assert!(!stderr(&out).contains("0-token"), "{}", stderr(&out));
    }
}

#[test]
fn a_safetensors_dtype_safetensors_does_not_know_names_its_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = ckpt(dir.path(), Shape::tiny());
    let path = ckpt.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = header.keys().find(|k| k.as_str() != "__metadata__").unwrap().clone();
    header[&name]["dtype"] = "F33".into();
    let mut text = serde_json::to_vec(&header).unwrap();
    assert!(text.len() <= n);
    text.resize(n, b' ');
    bytes[8..8 + n].copy_from_slice(&text);
    std::fs::write(&path, &bytes).unwrap();
    let out = run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", dir.path().join("x.lad").to_str().unwrap()]);
    assert_clean_failure(&out, &["model.safetensors", &format!("tensor '{name}'"), "F33", "supported: F32, BF16, F16"]);
}

#[test]
fn chat_with_prompt_ids_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path());
    for order in [&["--chat", "--prompt-ids", "1,2"][..], &["--prompt-ids", "1,2", "--chat"]] {
        let mut args = vec!["run", art.to_str().unwrap(), "--gen-len", "16", "--block-len", "8", "--steps", "16"];
        args.extend_from_slice(order);
        refused(&run("llada-rt", &args), &["--chat", "--prompt-ids"]);
    }
}

#[test]
fn settings_a_policy_does_not_use_are_refused_naming_the_policies_that_do() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path());
    let cases: &[(&[&str], &str, &str)] = &[
        (&["--rows", "8"], "--rows does nothing under --policy exact", "only --policy mbsd"),
        (&["--spec-blocks", "1"], "--spec-blocks does nothing under --policy exact", "only --policy spec or mbsd"),
        (&["--spec-threshold", "0.5"], "--spec-threshold does nothing under --policy exact", "only --policy spec or mbsd"),
        (&["--refresh-every", "2"], "--refresh-every does nothing under --policy exact", "only --policy prefix, dual, spec or mbsd"),
        (&["--revision", "off"], "--revision does nothing under --policy exact", "only --policy mbsd"),
        (&["--policy", "dual", "--side-rows", "4"], "--side-rows does nothing under --policy dual", "only --policy mbsd"),
        (&["--policy", "prefix", "--stable-checks", "3"], "--stable-checks does nothing under --policy prefix", "only --policy mbsd"),
        // A value equal to the default, typed, is still a setting given.
        (&["--policy", "dual", "--spec-threshold", "0.99"], "--spec-threshold does nothing under --policy dual", "only --policy spec or mbsd"),
    ];
    for (flags, says, users) in cases {
        refused(&run_ids(&art, flags), &[says, users]);
    }
    // Where they are used, they run.
    for flags in [&["--policy", "mbsd", "--rows", "8", "--revision", "off", "--spec-blocks", "1"][..], &["--policy", "prefix", "--refresh-every", "2"], &["--policy", "spec", "--spec-threshold", "0.5"]] {
        let out = run_ids(&art, flags);
        assert!(out.status.success(), "{flags:?}: {}", stderr(&out));
    }
    // eval and compare take the same settings, and the same refusal.
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt_ids\": [1, 2, 3], \"expected\": \"x\"}\n").unwrap();
    let out = run("llada-rt", &["eval", art.to_str().unwrap(), "--tasks", tasks.to_str().unwrap(), "--gen-len", "16", "--block-len", "8", "--steps", "16", "--rows", "8"]);
    refused(&out, &["--rows does nothing under --policy exact"]);
    let a = art.to_str().unwrap();
    let out = run("llada-rt", &["compare", a, a, "--prompt-ids", "1,2", "--gen-len", "16", "--block-len", "8", "--steps", "16", "--policy", "dual", "--side-rows", "4"]);
    refused(&out, &["--side-rows does nothing under --policy dual"]);
    // A task's "chat" with "prompt_ids" is --chat with --prompt-ids.
    std::fs::write(&tasks, "{\"prompt_ids\": [1, 2, 3], \"chat\": true, \"expected\": \"x\"}\n").unwrap();
    let out = run("llada-rt", &["eval", art.to_str().unwrap(), "--tasks", tasks.to_str().unwrap(), "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    assert_clean_failure(&out, &["line 1", "\"chat\"", "\"prompt_ids\""]);
    // bench's sampler flags time --generate's generation: without it they do nothing.
    let out = run("llada-rt", &["bench", a, "--rows", "8", "--repeat", "1", "--policy", "mbsd"]);
    refused(&out, &["--policy", "without --generate it does nothing"]);
}

#[test]
fn group_without_q4_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = ckpt(dir.path(), Shape::tiny());
    let out_path = dir.path().join("x.lad");
    for quant in [&["--quant", "q8"][..], &["--quant", "bf16"], &[]] {
        let mut args = vec!["compile", "--model", ckpt.to_str().unwrap(), "-o", out_path.to_str().unwrap(), "--group", "64", "--max-seq", "64"];
        args.extend_from_slice(quant);
        refused(&run("lladac", &args), &["--group 64 does nothing", "only --quant q4 uses it"]);
        assert!(!out_path.exists());
    }
    let out = run("lladac", &["compile", "--model", ckpt.to_str().unwrap(), "-o", out_path.to_str().unwrap(), "--group", "64", "--quant", "q4", "--max-seq", "64"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn llada_threads_that_is_not_a_count_in_range_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let art = artifact(dir.path());
    let with_env = |value: &str, args: &[&str]| Command::new(bin("llada-rt")).args(args).env("LLADA_THREADS", value).output().unwrap();
    let run_args = ["run", art.to_str().unwrap(), "--prompt-ids", "1,2", "--gen-len", "16", "--block-len", "8", "--steps", "16"];
    for value in ["abc", "0", "-1", "99999", "2.5"] {
        refused(&with_env(value, &run_args), &["LLADA_THREADS", "1..="]);
        refused(&with_env(value, &["roofline", "--json"]), &["LLADA_THREADS", "1..=1024"]);
    }
    // The plan's bound, named as LLADA_THREADS's rather than --threads's.
    let max = llada_rt::session::max_threads(&llada_rt::Model::open(&art, false).unwrap());
    let over = (max + 1).to_string();
    let out = with_env(&over, &run_args);
    refused(&out, &["LLADA_THREADS", &format!("1..={max}")]);
    assert!(!stderr(&out).contains("--threads"), "{}", stderr(&out));
    // In range it runs; --threads overrides it.
    assert!(with_env("1", &run_args).status.success());
    let mut given = run_args.to_vec();
    given.extend(["--threads", "1"]);
    assert!(with_env("abc", &given).status.success());
}
