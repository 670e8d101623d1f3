//! A failed pass, and an artifact that changes on disk under a running app. A pass that fails
//! (here: staging reads a truncated artifact) leaves a session whose next generation gives the
//! answer a fresh session gives once the file is whole again, through the Rust library and the
//! C API; an artifact truncated under a running generation ends it with a clear error, never
//! a crash (SIGBUS); one renamed over by another file changes nothing for the loaded model,
//! which reads only through the file it verified.

mod common;

use std::ffi::{CStr, CString};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use llada::*;
use llada_rt::{generate, Error, Model as RtModel, SamplerParams, Session as RtSession};
use llada_tools::checkpoint::{Shape, WeightType};

/// A tiny artifact whose window holds half its weights: segments rotate through slots, read
/// with `pread` from the artifact every pass. Returns its path and where the last rotating
/// segments start in the file, past everything the runtime reads through its mapping.
fn rotating(dir: &Path) -> (PathBuf, u64) {
    let ckpt = dir.join("ckpt");
    // Four layers: with two, the fixed regions leave too little beside the two slots.
    common::checkpoint(&ckpt, Shape { n_layers: 4, ..Shape::tiny() }, WeightType::F32, u64::MAX, 0.02);
    let resident = dir.join("resident.lad");
    common::compile_quant(&ckpt, &resident, None, 64, None);
    let art = dir.join("rotating.lad");
    common::compile_quant(&ckpt, &art, None, 64, Some(common::half_the_weights(&resident)));
    let m = RtModel::open(&art, true).unwrap();
    let (h, w) = (&m.header, &m.header.plan.window);
    assert!(w.rotating.len() >= 2, "the small window should make segments rotate");
    // Everything read through the mapping (the host segments) must lie before the cut.
    let mapped_end = w.host.iter().map(|&s| h.segments[s as usize].offset + h.segments[s as usize].nbytes).max().unwrap_or(0);
    let cut = w.rotating.iter().map(|&s| h.segments[s as usize].offset).filter(|&o| o >= mapped_end).min().expect("a rotating segment after the host segments");
    (art, m.data_offset() + cut)
}

/// Truncates `path` at `at` and returns what was cut, to be written back.
fn truncate(path: &Path, at: u64) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(at).unwrap();
    bytes[at as usize..].to_vec()
}

fn restore(path: &Path, at: u64, tail: &[u8]) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().write_all_at(tail, at).unwrap();
}

fn params() -> SamplerParams {
    SamplerParams { gen_length: 16, block_length: 8, steps: 8, ..Default::default() }
}

const PROMPT: [u32; 4] = [5, 6, 7, 8];

#[test]
fn a_session_works_again_after_a_failed_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (art, cut) = rotating(dir.path());
    let model = RtModel::open(&art, true).unwrap();
    let want = generate(&mut RtSession::with_threads(&model, 2).unwrap(), &PROMPT, &params(), &mut |_| {}).unwrap();
    let mut session = RtSession::with_threads(&model, 2).unwrap();
    let tail = truncate(&art, cut);
    let err = generate(&mut session, &PROMPT, &params(), &mut |_| {}).unwrap_err();
    assert!(matches!(err, Error::Changed { .. }), "{err}");
    assert!(err.to_string().contains("changed on disk while in use") && err.to_string().contains("rename"), "{err}");
    restore(&art, cut, &tail);
    let again = generate(&mut session, &PROMPT, &params(), &mut |_| {}).unwrap();
    assert_eq!((again.output_ids, again.reveals), (want.output_ids, want.reveals), "the recovered session differs from a fresh one");
}

fn last_error() -> String {
    // SAFETY: libllada returns a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(llada_last_error()) }.to_string_lossy().into_owned()
}

/// One generation through the C API: its status and text.
fn c_generate(session: *mut Session) -> (Status, Option<String>) {
    let prompt = CString::new("FILL:30007=").unwrap();
    let params = Params { gen_len: 16, block_len: 8, steps: 8, chat: false, ..llada_default_params() };
    let mut out = std::mem::MaybeUninit::<Output>::uninit();
    // SAFETY: a live session, valid strings and params, `out` writable.
    let status = unsafe { llada_generate(session, prompt.as_ptr(), &params, None, std::ptr::null_mut(), out.as_mut_ptr()) };
    // SAFETY: `llada_generate` writes `out`; the text is valid until freed.
    let mut out = unsafe { out.assume_init() };
    let text = (status == Status::Ok).then(|| unsafe { CStr::from_ptr(out.text) }.to_string_lossy().into_owned());
    // SAFETY: filled by `llada_generate`.
    unsafe { llada_output_free(&mut out) };
    (status, text)
}

#[test]
fn a_c_session_works_again_after_a_failed_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (art, cut) = rotating(dir.path());
    let path = CString::new(art.to_str().unwrap()).unwrap();
    let (mut model, mut fresh, mut session) = (std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid strings and out pointers, live handles.
    unsafe {
        assert_eq!(llada_model_load(path.as_ptr(), &mut model), Status::Ok, "{}", last_error());
        assert_eq!(llada_session_new(model, 2, &mut fresh), Status::Ok);
        assert_eq!(llada_session_new(model, 2, &mut session), Status::Ok);
    }
    let (status, want) = c_generate(fresh);
    assert_eq!(status, Status::Ok, "{}", last_error());
    let tail = truncate(&art, cut);
    let (status, _) = c_generate(session);
    assert_eq!(status, Status::Io, "{}", last_error());
    assert!(last_error().contains("changed on disk while in use"), "{}", last_error());
    restore(&art, cut, &tail);
    assert_eq!(c_generate(session), (Status::Ok, want));
    // SAFETY: live handles, no call running.
    unsafe {
        llada_session_free(fresh);
        llada_session_free(session);
        llada_model_free(model);
    }
}

#[test]
fn truncating_the_artifact_under_a_running_generation_does_not_crash() {
    let dir = tempfile::tempdir().unwrap();
    for (name, art) in [("resident", common::embedded(dir.path())), ("rotating", rotating(dir.path()).0)] {
        let model = RtModel::open(&art, true).unwrap();
        let mut session = RtSession::with_threads(&model, 2).unwrap();
        let p = SamplerParams { gen_length: 32, block_length: 16, steps: 32, policy: llada_rt::sampler::Policy::Mbsd, ..Default::default() };
        // After the second step, cut the file to a page: the embedding (read through the
        // mapping), staged segments and everything else are gone.
        let result = generate(&mut session, &PROMPT, &p, &mut |v| {
            if v.step == 2 {
                std::fs::OpenOptions::new().write(true).open(&art).unwrap().set_len(4096).unwrap();
            }
        });
        let err = result.expect_err("a generation reading a truncated artifact cannot succeed");
        assert!(matches!(err, Error::Changed { .. }), "{name}: {err}");
        // The session and the model refuse to go on, saying why.
        let again = generate(&mut session, &PROMPT, &p, &mut |_| {}).unwrap_err().to_string();
        assert!(again.contains("changed on disk"), "{name}: {again}");
    }
}

#[test]
fn an_artifact_renamed_over_while_loaded_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (art, _) = rotating(dir.path());
    let model = RtModel::open(&art, true).unwrap();
    let mut session = RtSession::with_threads(&model, 2).unwrap();
    let want = generate(&mut session, &PROMPT, &params(), &mut |_| {}).unwrap();
    // Another artifact takes the path, as a recompile (temp file + rename) does.
    let other = dir.path().join("other.lad");
    std::fs::copy(common::embedded(dir.path()), &other).unwrap();
    std::fs::rename(&other, &art).unwrap();
    let got = generate(&mut session, &PROMPT, &params(), &mut |_| {}).unwrap();
    assert_eq!((&got.output_ids, &got.reveals), (&want.output_ids, &want.reveals));
    let mut second = RtSession::with_threads(&model, 2).unwrap();
    assert_eq!(generate(&mut second, &PROMPT, &params(), &mut |_| {}).unwrap().output_ids, want.output_ids);
}

#[test]
fn a_directory_as_the_model_is_named_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::run("llada-rt", &["run", dir.path().to_str().unwrap(), "-p", "x"]);
    common::assert_clean_failure(&out, &[dir.path().to_str().unwrap(), "is a directory"]);
}
