//! Issue 40, item 3: stdout closed early ends a command quietly with success (as Unix tools
//! end when the reader has had enough, `| head`); any other error writing stdout (a full
//! disk) is one line, `error: writing to stdout: ...`, and exit status 1. Never a panic.

mod common;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::bin;

/// The embedded model (it answers with text) and a task file for `eval`.
fn embedded(dir: &Path) -> (PathBuf, PathBuf) {
    let art = common::embedded(dir);
    let tasks = dir.join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"FILL:30007050=\", \"chat\": true, \"expected\": \"33377755\"}\n").unwrap();
    (art, tasks)
}

/// The commands that print to stdout, each with enough output to go on printing after the
/// first byte.
fn printing_commands(art: &Path, tasks: &Path) -> Vec<(&'static str, Vec<String>)> {
    let a = art.to_str().unwrap().to_string();
    let run = |extra: &[&str]| {
        let mut v: Vec<String> = ["run", &a, "--chat", "-p", "FILL:3000705000000920000040015000608000070060300000004000000800900010=", "--gen-len", "64", "--steps", "64"].iter().map(|s| s.to_string()).collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    vec![
        ("llada-rt", run(&[])),
        ("llada-rt", run(&["--show-denoising"])),
        ("llada-rt", run(&["--json"])),
        ("llada-rt", run(&["--op-profile"])),
        ("llada-rt", vec!["eval".into(), a.clone(), "--tasks".into(), tasks.to_str().unwrap().into(), "--gen-len".into(), "32".into(), "--steps".into(), "32".into()]),
        ("lladac", vec!["inspect".into(), a.clone()]),
        ("lladac", vec!["inspect".into(), a.clone(), "--json".into()]),
        ("lladac", vec!["inspect".into(), a.clone(), "--estimate".into()]),
        ("lladac", vec!["targets".into()]),
    ]
}

fn no_panic(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what}: panicked: {stderr}");
    assert_ne!(out.status.code(), Some(101), "{what}: {stderr}");
}

/// Runs every printing command (on the embedded model, stderr piped) through `run`, which
/// gives it a stdout and returns its output; checks that output did not panic, then `check`s
/// it. Both get the command line, for their messages.
fn each_printing_command(run: impl Fn(&str, &mut Command) -> Output, check: impl Fn(&str, &Output)) {
    let dir = tempfile::tempdir().unwrap();
    let (art, tasks) = embedded(dir.path());
    for (binary, args) in printing_commands(&art, &tasks) {
        let what = format!("{binary} {}", args.join(" "));
        let out = run(&what, Command::new(bin(binary)).args(&args).stderr(Stdio::piped()));
        no_panic(&what, &out);
        check(&what, &out);
    }
}

/// Success with nothing on stderr.
fn ended_quietly(what: &str, out: &Output) {
    assert_eq!(out.status.code(), Some(0), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stderr.is_empty(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_reader_that_stops_after_one_byte_ends_the_command_quietly() {
    let read_one_byte = |what: &str, command: &mut Command| {
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(stdout.read(&mut byte).unwrap(), 1, "{what}: printed nothing");
        // `head -c 1`: the reader goes away while the command still has output to write.
        drop(stdout);
        child.wait_with_output().unwrap()
    };
    each_printing_command(read_one_byte, ended_quietly);
}

#[test]
fn a_stdout_closed_before_the_first_write_ends_the_command_quietly() {
    let reader_gone = |_: &str, command: &mut Command| {
        // A pipe whose reader is gone before the command starts: its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        command.stdout(writer).output().unwrap()
    };
    each_printing_command(reader_gone, ended_quietly);
}

#[test]
fn a_full_disk_on_stdout_is_one_error_line_and_status_1() {
    let full_disk = |_: &str, command: &mut Command| command.stdout(File::create("/dev/full").unwrap()).output().unwrap();
    each_printing_command(full_disk, |what, out| {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: {stderr}");
        assert!(stderr.starts_with("error: writing to stdout: "), "{what}: {stderr}");
        assert!(stderr.contains("No space left on device"), "{what}: {stderr}");
    });
}
