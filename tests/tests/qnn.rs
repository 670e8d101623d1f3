//! The QNN HTP library through `llada-rt qnn-info`: what a machine without it is told, and
//! (with `LLADA_QNN_LIB` naming `tools/qnn/fetch.sh`'s folder, as CI sets it) the pinned
//! library loaded through the runtime's own declarations of its ABI.

mod common;

use std::process::Command;

#[test]
fn without_the_library_one_line_says_how_to_get_it_and_the_status_is_2() {
    let empty = tempfile::tempdir().unwrap();
    for args in [&["qnn-info"][..], &["qnn-info", "--qnn-lib", empty.path().to_str().unwrap()]] {
        let out = Command::new(common::bin("llada-rt")).args(args).env_remove("LLADA_QNN_LIB").output().unwrap();
        common::assert_clean_failure(&out, &["libQnnHtp.so", "tools/qnn/fetch.sh", "QAIRT SDK"]);
        assert_eq!(out.status.code(), Some(2));
    }
}

#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_pinned_library_reports_its_versions_and_keeps_stdout_json() {
    assert!(std::env::var_os("LLADA_QNN_LIB").is_some(), "set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder");
    let out = Command::new(common::bin("llada-rt")).args(["qnn-info", "--json"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The library prints a line of its own to C's stdout; the JSON must stay alone there.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(v["provider"], "HTP_QTI_AISW");
    assert_eq!(v["backend_id"], 6);
    assert_eq!(v["core_api"], "2.40.0");
    assert_eq!(v["backend_api"], "5.51.0");
    assert!(v["build_id"].as_str().unwrap().starts_with("v2.51.0"), "{v}");
}
