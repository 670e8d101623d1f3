//! Issue 40, items 1 and 2: no command replaces anything but a regular file, or a file it
//! reads, or leaves half a file; no command reads a FIFO, a device or a file past its bound.
//! Each case was reproduced against the tools before the fix (exit 0 and a destroyed file, or
//! a hang, or memory until the OOM killer).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_clean_failure, run};
use llada_tools::checkpoint::{Shape, WeightType};

fn tiny(dir: &Path) -> PathBuf {
    let ckpt = dir.join("ckpt");
    common::checkpoint(&ckpt, Shape::tiny(), WeightType::F32, u64::MAX, 0.02);
    ckpt
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success(), "mkfifo {}", path.display());
}

fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path).map(|m| m.file_type().is_fifo()).unwrap_or(false)
}

/// Runs a command, killing it after `limit` (a FIFO read blocks forever): the output, or a
/// failed assertion naming the hang.
fn run_within(binary: &str, args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(common::bin(binary)).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{binary} {args:?} still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn compile_args<'a>(model: &'a Path, out: &'a Path) -> Vec<&'a str> {
    vec!["compile", "--model", model.to_str().unwrap(), "-o", out.to_str().unwrap()]
}

#[test]
fn compile_output_onto_a_fifo_is_refused_and_the_fifo_stays() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny(dir.path());
    let fifo = dir.path().join("out.lad");
    mkfifo(&fifo);
    let o = run_within("lladac", &compile_args(&ckpt, &fifo), Duration::from_secs(120));
    assert_clean_failure(&o, &["out.lad", "FIFO"]);
    assert!(is_fifo(&fifo), "the FIFO was replaced");
}

#[test]
fn compile_output_onto_a_device_or_a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny(dir.path());
    // A device node of our own (as root, the case that replaced a system device); where nodes
    // cannot be made, /dev/null itself, which a correct lladac never touches.
    let node = dir.path().join("null");
    let device = if Command::new("mknod").arg(&node).args(["c", "1", "3"]).status().map(|s| s.success()).unwrap_or(false) { node } else { PathBuf::from("/dev/null") };
    let o = run("lladac", &compile_args(&ckpt, &device));
    assert_clean_failure(&o, &[device.to_str().unwrap(), "character device"]);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&device).unwrap().file_type().is_char_device(), "the device was replaced");
    let folder = dir.path().join("folder");
    std::fs::create_dir(&folder).unwrap();
    assert_clean_failure(&run("lladac", &compile_args(&ckpt, &folder)), &["folder", "directory"]);
    assert!(folder.is_dir());
}

#[test]
fn compile_output_onto_its_own_input_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny(dir.path());
    let weights = ckpt.join("model.safetensors");
    let before = std::fs::read(&weights).unwrap();
    assert_clean_failure(&run("lladac", &compile_args(&ckpt, &weights)), &["model.safetensors", "read by this command"]);
    // The same file under another name (a hard link) is the same input.
    let alias = dir.path().join("config-alias.lad");
    std::fs::hard_link(ckpt.join("config.json"), &alias).unwrap();
    let config = std::fs::read(&alias).unwrap();
    assert_clean_failure(&run("lladac", &compile_args(&ckpt, &alias)), &["config-alias.lad", "config.json"]);
    assert_eq!(std::fs::read(&weights).unwrap(), before, "the weights were overwritten");
    assert_eq!(std::fs::read(&alias).unwrap(), config, "the config was overwritten");
}

#[test]
fn a_killed_compile_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    // Large enough that the artifact takes a while to write.
    common::checkpoint(&ckpt, Shape { d_model: 512, n_layers: 8, n_heads: 8, n_kv_heads: 8, mlp_hidden_size: 1536, vocab_size: 4096, embedding_size: 4096, ..Shape::tiny() }, WeightType::F32, u64::MAX, 0.02);
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = out_dir.join("model.lad");
    let mut child = Command::new(common::bin("lladac")).args(compile_args(&ckpt, &out)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // Kill it once it has the output open: a file descriptor pointing into the output folder.
    let fds = PathBuf::from(format!("/proc/{}/fd", child.id()));
    let start = Instant::now();
    let mut writing = false;
    while !writing && child.try_wait().unwrap().is_none() && start.elapsed() < Duration::from_secs(60) {
        writing = std::fs::read_dir(&fds).into_iter().flatten().flatten().any(|fd| std::fs::read_link(fd.path()).map(|t| t.starts_with(&out_dir)).unwrap_or(false));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(writing, "the compile finished before it could be interrupted; make the checkpoint larger");
    assert!(common::leftovers(&out_dir).is_empty(), "an interrupted compile left {:?}", common::leftovers(&out_dir));
}

/// The embedded model, compiled, and a copy of its golden file, in `dir`.
fn embedded_and_golden(dir: &Path) -> (PathBuf, PathBuf) {
    let art = common::embedded(dir);
    let golden = dir.join("golden.json");
    std::fs::copy(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden/embedded.json"), &golden).unwrap();
    (art, golden)
}

#[test]
fn run_trace_onto_the_artifact_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (art, _) = embedded_and_golden(dir.path());
    let before = std::fs::read(&art).unwrap();
    let a = art.to_str().unwrap();
    let o = run("llada-rt", &["run", a, "--prompt-ids", "1,2,3", "--gen-len", "32", "--steps", "32", "--trace", a]);
    assert_clean_failure(&o, &["embedded.lad", "read by this command"]);
    assert_eq!(std::fs::read(&art).unwrap(), before, "the artifact was overwritten");
    // A trace to a new file is still written, whole.
    let trace = dir.path().join("trace.json");
    let o = run("llada-rt", &["run", a, "--prompt-ids", "1,2,3", "--gen-len", "32", "--steps", "32", "--trace", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(v["traceEvents"].is_array());
}

#[test]
fn golden_write_onto_its_inputs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (art, golden) = embedded_and_golden(dir.path());
    let (art_bytes, golden_bytes) = (std::fs::read(&art).unwrap(), std::fs::read(&golden).unwrap());
    let (a, g) = (art.to_str().unwrap(), golden.to_str().unwrap());
    assert_clean_failure(&run("llada-rt", &["golden", g, "--model", a, "--write", a, "--every", "100"]), &["embedded.lad", "read by this command"]);
    assert_clean_failure(&run("llada-rt", &["golden", g, "--model", a, "--write", g, "--every", "100"]), &["golden.json", "read by this command"]);
    assert_eq!(std::fs::read(&art).unwrap(), art_bytes, "the artifact was overwritten");
    assert_eq!(std::fs::read(&golden).unwrap(), golden_bytes, "the golden file was overwritten");
}

/// Replaces `name` in the checkpoint by a symbolic link to `target`.
fn link_in(ckpt: &Path, name: &str, target: &Path) {
    std::fs::remove_file(ckpt.join(name)).unwrap();
    std::os::unix::fs::symlink(target, ckpt.join(name)).unwrap();
}

#[test]
fn configs_and_tokenizers_that_never_end_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny(dir.path());
    let out = dir.path().join("out.lad");
    // Each was read until the machine's memory was gone.
    for (name, target) in [("config.json", "/dev/zero"), ("tokenizer.json", "/dev/urandom"), ("tokenizer_config.json", "/dev/zero"), ("model.safetensors", "/dev/zero")] {
        let saved = dir.path().join("saved");
        std::fs::copy(ckpt.join(name), &saved).unwrap();
        link_in(&ckpt, name, Path::new(target));
        let o = run_within("lladac", &compile_args(&ckpt, &out), Duration::from_secs(60));
        assert_clean_failure(&o, &[name, "character device"]);
        std::fs::remove_file(ckpt.join(name)).unwrap();
        std::fs::rename(&saved, ckpt.join(name)).unwrap();
    }
    // A FIFO blocked the read forever.
    std::fs::remove_file(ckpt.join("tokenizer.json")).unwrap();
    mkfifo(&ckpt.join("tokenizer.json"));
    assert_clean_failure(&run_within("lladac", &compile_args(&ckpt, &out), Duration::from_secs(60)), &["tokenizer.json", "FIFO"]);
    assert!(!out.exists());
}

#[test]
fn a_config_past_its_bound_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = tiny(dir.path());
    // A sparse file: 1 GiB of nothing costs no disk.
    std::fs::OpenOptions::new().write(true).open(ckpt.join("config.json")).unwrap().set_len(1 << 30).unwrap();
    let o = run_within("lladac", &compile_args(&ckpt, &dir.path().join("out.lad")), Duration::from_secs(60));
    assert_clean_failure(&o, &["config.json", "larger than"]);
}

#[test]
fn an_artifact_that_is_a_fifo_or_a_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.lad");
    mkfifo(&fifo);
    for file in [fifo.as_path(), Path::new("/dev/zero")] {
        let f = file.to_str().unwrap();
        assert_clean_failure(&run_within("llada-rt", &["run", f, "--prompt-ids", "1,2"], Duration::from_secs(60)), &[f, "not a regular file"]);
        assert_clean_failure(&run_within("lladac", &["inspect", f], Duration::from_secs(60)), &[f, "not a regular file"]);
    }
}
