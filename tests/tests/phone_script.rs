//! `tools/qnn/phone.sh`, the script a user with a phone runs to measure the NPU there, and the
//! report it prints (`tools/qnn/phone_report.py`). No phone is reachable here: its arguments,
//! its dry run and the report's parsing of real `llada-rt bench` output are tested, and (with
//! `LLADA_QNN_LIB`) the whole flow against a stand-in for adb whose "phone" is a folder of
//! this machine, running the x86-64 runtime on QNN's simulator.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tools() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/qnn")
}

fn phone(args: &[&str], adb: Option<&Path>) -> Output {
    let mut c = Command::new("bash");
    c.arg(tools().join("phone.sh")).args(args);
    // lladac on PATH: the script reads an artifact's HTP architecture with it.
    let bins = common::bin("lladac").parent().unwrap().to_path_buf();
    c.env("PATH", format!("{}:{}", bins.display(), std::env::var("PATH").unwrap_or_default()));
    if let Some(adb) = adb {
        c.env("ADB", adb);
    }
    c.output().unwrap()
}

/// A QAIRT SDK's layout with the files phone.sh pushes (empty stand-ins unless `real`: a
/// folder of QNN's x86-64 libraries whose two the runtime opens).
fn fake_qairt(root: &Path, arch: &str, real: Option<&Path>) -> PathBuf {
    let q = root.join("qairt");
    let (android, hexagon) = (q.join("lib/aarch64-android"), q.join(format!("lib/hexagon-{arch}/unsigned")));
    std::fs::create_dir_all(&android).unwrap();
    std::fs::create_dir_all(&hexagon).unwrap();
    let upper = arch.replace('v', "V");
    for name in ["libQnnHtp.so", "libQnnSystem.so"] {
        match real {
            Some(dir) => std::fs::copy(dir.join(name), android.join(name)).map(|_| ()).unwrap(),
            None => std::fs::write(android.join(name), b"").unwrap(),
        }
    }
    std::fs::write(android.join(format!("libQnnHtp{upper}Stub.so")), b"").unwrap();
    std::fs::write(hexagon.join(format!("libQnnHtp{upper}Skel.so")), b"").unwrap();
    q
}

/// An adb whose phone is this machine: `push` and `pull` copy, `shell` runs the command here,
/// `getprop` names a SoC. Every call is appended to `calls`.
fn fake_adb(root: &Path) -> PathBuf {
    let adb = root.join("adb");
    let calls = root.join("calls");
    std::fs::write(
        &adb,
        format!(
            r#"#!/usr/bin/env bash
echo "$*" >> '{}'
case "$1" in
  push|pull) cp "$2" "$3" ;;
  shell) shift; if [ "$1 $2" = "getprop ro.soc.model" ]; then echo SM8650; else sh -c "$*"; fi ;;
  *) exit 1 ;;
esac
"#,
            calls.display()
        ),
    )
    .unwrap();
    Command::new("chmod").args(["+x", adb.to_str().unwrap()]).status().unwrap();
    adb
}

#[test]
fn the_phone_script_checks_its_arguments_and_dry_runs_without_a_phone() {
    let dir = tempfile::tempdir().unwrap();
    let o = phone(&[], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--runtime, --artifact and --qairt are required"));
    let o = phone(&["--bogus"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown argument '--bogus'"));
    let (runtime, artifact) = (dir.path().join("llada-rt"), dir.path().join("model.lad"));
    std::fs::write(&runtime, b"").unwrap();
    std::fs::write(&artifact, b"").unwrap();
    let qairt = fake_qairt(dir.path(), "v79", None);
    let (r, a, q) = (runtime.to_str().unwrap(), artifact.to_str().unwrap(), qairt.to_str().unwrap());
    for (args, words) in [
        (vec!["--runtime", "/nowhere/llada-rt", "--artifact", a, "--qairt", q, "--arch", "v79"], &["--runtime /nowhere/llada-rt", "no such file"][..]),
        (vec!["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v99"], &["--arch v99", "v73, v75, v79, v81"]),
        (vec!["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v75"], &["libQnnHtpV75Stub.so is missing"]),
        (vec!["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v79", "--rows", "32;64"], &["--rows 32;64"]),
        (vec!["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v79", "--gen-len", "0"], &["--gen-len 0"]),
        (vec!["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v79", "--policy", "fast"], &["--policy fast"]),
        (vec!["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v79", "--dir", "relative"], &["--dir relative"]),
    ] {
        let o = phone(&args, None);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(words.iter().all(|w| err.contains(w)), "{args:?}: {err}");
    }
    // The dry run: the folder made, the runtime, artifact and four libraries pushed, the
    // benchmark run with the libraries beside it, its output pulled.
    let o = phone(&["--runtime", r, "--artifact", a, "--qairt", q, "--arch", "v79", "--serial", "ABC", "--dry-run"], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.iter().all(|l| l.starts_with("adb -s ABC ")), "{out}");
    assert_eq!(lines.iter().filter(|l| l.contains(" push ")).count(), 6, "{out}");
    assert!(out.contains("libQnnHtpV79Skel.so /data/local/tmp/llada/libQnnHtpV79Skel.so"), "{out}");
    let bench = lines.iter().find(|l| l.contains("bench")).unwrap();
    assert!(["ADSP_LIBRARY_PATH=/data/local/tmp/llada", "--backend\\ qnn", "--policy\\ mbsd", "--gen-len\\ 128", "--rows\\ 32\\,64\\,128"].iter().all(|w| bench.contains(w)), "{bench}");
    assert_eq!(lines.iter().filter(|l| l.contains(" pull ")).count(), 3, "{out}");
}

#[test]
fn the_report_reads_real_bench_output_and_names_a_missing_field() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let o = common::run("llada-rt", &["bench", art.to_str().unwrap(), "--rows", "32,64", "--repeat", "1", "--generate", "--gen-len", "64", "--policy", "mbsd", "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bench = dir.path().join("bench.json");
    std::fs::write(&bench, &o.stdout).unwrap();
    let report = |file: &Path| Command::new("python3").arg(tools().join("phone_report.py")).arg(file).args(["--device", "SM8750", "--arch", "v79", "--gen-len", "64"]).output().unwrap();
    let o = report(&bench);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((v["device"].as_str(), v["arch"].as_str()), (Some("SM8750"), Some("v79")));
    let passes = v["passes"].as_array().unwrap();
    assert_eq!(passes.iter().map(|p| p["rows"].as_u64().unwrap()).collect::<Vec<_>>(), [32, 64]);
    assert!(passes.iter().all(|p| p["seconds"].as_f64().unwrap() > 0.0));
    let g = &v["generation"];
    assert!(g["forward_passes"].as_u64().unwrap() > 0 && g["seconds"].as_f64().unwrap() > 0.0, "{v}");
    assert!((g["tokens_per_second"].as_f64().unwrap() - 64.0 / g["seconds"].as_f64().unwrap()).abs() < 1e-9);
    assert!(v["contexts"]["session_open_seconds"].as_f64().unwrap() > 0.0 && v["contexts"]["created_during_generation"] == 0, "{v}");
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 1 << 20, "{v}");
    // A file cut short of a field: one error naming it.
    let mut cut: serde_json::Value = serde_json::from_slice(&std::fs::read(&bench).unwrap()).unwrap();
    cut["window"].as_object_mut().unwrap().remove("npu_context_loads");
    std::fs::write(&bench, cut.to_string()).unwrap();
    let o = report(&bench);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("'window.npu_context_loads' is missing"), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::write(&bench, "not json").unwrap();
    assert!(String::from_utf8_lossy(&report(&bench).stderr).contains("not JSON"));
}

/// The whole flow: pushed, run and pulled through the stand-in adb (the x86-64 runtime on
/// QNN's simulator, an SM8650 artifact), the report printed and written.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_phone_script_runs_end_to_end_through_a_stand_in_adb() {
    let lib = PathBuf::from(std::env::var_os("LLADA_QNN_LIB").expect("set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder"));
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("tiny.lad");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let o = Command::new(common::bin("lladac")).args(["compile", "--model", model.to_str().unwrap(), "--target", "sm8650", "--max-seq", "64", "-o", art.to_str().unwrap()]).env("LLADA_QNN_LIB", &lib).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let qairt = fake_qairt(dir.path(), "v75", Some(&lib));
    // The "phone's" folder, holding beforehand the C++ runtime QNN's x86-64 libraries load.
    let device = dir.path().join("device");
    std::fs::create_dir(&device).unwrap();
    for e in std::fs::read_dir(&lib).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("lib") && !e.file_name().to_string_lossy().starts_with("libQnn") {
            std::fs::copy(e.path(), device.join(e.file_name())).unwrap();
        }
    }
    let adb = fake_adb(dir.path());
    let report = dir.path().join("report.json");
    let o = phone(
        &["--runtime", common::bin("llada-rt").to_str().unwrap(), "--artifact", art.to_str().unwrap(), "--qairt", qairt.to_str().unwrap(), "--dir", device.to_str().unwrap(), "--rows", "32", "--gen-len", "32", "--out", report.to_str().unwrap()],
        Some(&adb),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!((v["device"].as_str(), v["arch"].as_str()), (Some("SM8650"), Some("v75")), "the arch read from the artifact with lladac");
    assert!(v["backend"].as_str().unwrap().contains("Qualcomm HTP"), "{v}");
    assert!(v["generation"]["forward_passes"].as_u64().unwrap() > 0 && v["contexts"]["session_open_seconds"].as_f64().unwrap() > 0.0, "{v}");
    let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
    assert_eq!(calls.lines().filter(|l| l.starts_with("push")).count(), 6, "{calls}");
}
