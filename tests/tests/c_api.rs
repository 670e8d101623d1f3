//! libllada: the C example against `llada-rt run`, and the C interface's contract (errors,
//! cancel, busy, reuse) called from Rust through the same functions the header declares.

mod common;

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;

use llada::*;

/// The README's prompt and settings.
const PROMPT: &str = "FILL:3000705000000920000040015000608000070060300000004000000800900010=";
const ANSWER: &str = "3333775555555922222244415555668888877766333333334444444888999911";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The C example built with the system's C compiler against `libllada.a`.
fn c_example(dir: &Path) -> PathBuf {
    let exe = dir.join("generate");
    let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .arg("-O2")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(repo().join("capi/include"))
        .arg(repo().join("capi/examples/generate.c"))
        .arg(common::libllada())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("a C compiler (cc) runs");
    assert!(out.status.success(), "building the C example failed:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

#[test]
fn the_c_example_prints_what_llada_rt_run_prints() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::embedded(dir.path());
    let model_arg = model.to_str().unwrap();
    let rt = common::run("llada-rt", &["run", model_arg, "--chat", "-p", PROMPT, "--gen-len", "64", "--steps", "64", "--threads", "2"]);
    assert!(rt.status.success(), "{}", String::from_utf8_lossy(&rt.stderr));
    let c = Command::new(c_example(dir.path())).args([model_arg, PROMPT, "64", "64"]).output().unwrap();
    assert!(c.status.success(), "{}", String::from_utf8_lossy(&c.stderr));
    assert_eq!(String::from_utf8_lossy(&c.stdout), String::from_utf8_lossy(&rt.stdout));
    assert_eq!(String::from_utf8_lossy(&c.stdout).trim_end(), ANSWER);
    // The step callback showed the answer forming: its last line is the whole answer.
    let progress = String::from_utf8_lossy(&c.stderr);
    assert!(progress.contains(&format!("step 64/64: {ANSWER}")), "{progress}");
}

#[test]
fn the_c_example_reports_a_missing_artifact_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(c_example(dir.path())).args(["/nonexistent/model.lad", "hello"]).output().unwrap();
    common::assert_clean_failure(&out, &["/nonexistent/model.lad", "does not exist"]);
}

fn last_error() -> String {
    // SAFETY: libllada returns a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(llada_last_error()) }.to_string_lossy().into_owned()
}

/// A model handle and a session of the embedded model, freed on drop.
struct Loaded {
    model: *mut Model,
    session: *mut Session,
}

impl Loaded {
    fn new(path: &Path) -> Loaded {
        let c_path = CString::new(path.to_str().unwrap()).unwrap();
        let mut model = std::ptr::null_mut();
        // SAFETY: valid string and out pointer.
        assert_eq!(unsafe { llada_model_load(c_path.as_ptr(), &mut model) }, Status::Ok, "{}", last_error());
        let mut session = std::ptr::null_mut();
        // SAFETY: a live model handle and a valid out pointer.
        assert_eq!(unsafe { llada_session_new(model, 2, &mut session) }, Status::Ok, "{}", last_error());
        Loaded { model, session }
    }

    /// Generates with the README's settings, `callback` after every step.
    fn generate(&self, callback: StepCallback, user_data: *mut c_void) -> (Status, Option<(String, Vec<u32>)>) {
        let prompt = CString::new(PROMPT).unwrap();
        let params = Params { gen_len: 64, steps: 64, ..llada_default_params() };
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        // SAFETY: live session, valid strings and params, `out` writable; callbacks below
        // honour their `user_data`.
        let status = unsafe { llada_generate(self.session, prompt.as_ptr(), &params, callback, user_data, out.as_mut_ptr()) };
        // SAFETY: `llada_generate` always writes `out` once it is non-null.
        let mut out = unsafe { out.assume_init() };
        let result = (status == Status::Ok).then(|| {
            // SAFETY: a successful output's text and tokens are valid until freed.
            let text = unsafe { CStr::from_ptr(out.text) }.to_string_lossy().into_owned();
            let tokens = unsafe { std::slice::from_raw_parts(out.tokens, out.n_tokens) }.to_vec();
            (text, tokens)
        });
        if status != Status::Ok {
            assert!(out.text.is_null() && out.tokens.is_null() && out.n_tokens == 0, "a failed generation leaves a zeroed output");
        }
        // SAFETY: filled by `llada_generate` (or zeroed); freeing twice is allowed.
        unsafe {
            llada_output_free(&mut out);
            llada_output_free(&mut out);
        }
        (status, result)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        // SAFETY: live handles, no call running; the session outlives its model handle.
        unsafe {
            llada_model_free(self.model);
            llada_session_free(self.session);
        }
    }
}

unsafe extern "C" fn stop_after_three(step: *const Step, _user: *mut c_void) -> c_int {
    // SAFETY: libllada passes a valid step.
    c_int::from(unsafe { (*step).step } >= 3)
}

#[test]
fn a_generation_cancelled_by_its_callback_leaves_the_session_usable() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = Loaded::new(&common::embedded(dir.path()));
    let (status, out) = loaded.generate(Some(stop_after_three), std::ptr::null_mut());
    assert_eq!(status, Status::Cancelled);
    assert!(out.is_none());
    assert_eq!(last_error(), "generation cancelled");
    let (status, out) = loaded.generate(None, std::ptr::null_mut());
    assert_eq!(status, Status::Ok, "{}", last_error());
    let (text, tokens) = out.unwrap();
    assert_eq!(text, ANSWER);
    assert_eq!(tokens.len(), 64);
}

/// Passes the session to the test thread at the first step, then waits for its word.
struct Handshake {
    session: mpsc::Sender<usize>,
    go_on: mpsc::Receiver<()>,
    own: *const Session,
    steps_seen: u32,
}

unsafe extern "C" fn hold_first_step(step: *const Step, user: *mut c_void) -> c_int {
    // SAFETY: `user` is the `Handshake` the test passed, used by this thread only.
    let h = unsafe { &mut *user.cast::<Handshake>() };
    h.steps_seen = unsafe { (*step).step };
    if h.steps_seen == 1 {
        h.session.send(h.own as usize).unwrap();
        h.go_on.recv().unwrap();
    }
    0
}

#[test]
fn a_second_generation_on_a_busy_session_is_refused_and_cancel_stops_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = Loaded::new(&common::embedded(dir.path()));
    let (to_test, from_worker) = mpsc::channel();
    let (to_worker, from_test) = mpsc::channel();
    let session = loaded.session as usize;
    let worker = std::thread::spawn(move || {
        let mut h = Handshake { session: to_test, go_on: from_test, own: session as *const Session, steps_seen: 0 };
        let prompt = CString::new(PROMPT).unwrap();
        let params = Params { gen_len: 64, steps: 64, ..llada_default_params() };
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        // SAFETY: the session outlives this thread (joined below); `h` lives for the call.
        let status = unsafe { llada_generate(session as *const Session, prompt.as_ptr(), &params, Some(hold_first_step), (&mut h as *mut Handshake).cast(), out.as_mut_ptr()) };
        (status, h.steps_seen)
    });
    // The worker is inside its generation, waiting in the first step's callback.
    let session = from_worker.recv().unwrap() as *const Session;
    let prompt = CString::new(PROMPT).unwrap();
    let mut out = std::mem::MaybeUninit::<Output>::uninit();
    // SAFETY: a live session; the call must refuse rather than run.
    let status = unsafe { llada_generate(session, prompt.as_ptr(), std::ptr::null(), None, std::ptr::null_mut(), out.as_mut_ptr()) };
    assert_eq!(status, Status::Busy);
    assert!(last_error().contains("another generation"), "{}", last_error());
    // SAFETY: cancel is allowed from any thread while the session lives.
    unsafe { llada_cancel(session) };
    to_worker.send(()).unwrap();
    let (status, steps_seen) = worker.join().unwrap();
    assert_eq!(status, Status::Cancelled);
    assert_eq!(steps_seen, 1, "the generation stopped at the step after the cancel");
    // The cancel ended with that generation: the next one runs whole.
    let (status, out) = loaded.generate(None, std::ptr::null_mut());
    assert_eq!(status, Status::Ok, "{}", last_error());
    assert_eq!(out.unwrap().0, ANSWER);
}

#[test]
fn bad_arguments_get_a_status_and_a_message_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut model = std::ptr::null_mut();
    // SAFETY: every pointer below is null or valid; libllada must check, not crash.
    unsafe {
        assert_eq!(llada_model_load(std::ptr::null(), &mut model), Status::InvalidArgument);
        assert_eq!(last_error(), "path is NULL");
        let missing = CString::new(dir.path().join("missing.lad").to_str().unwrap()).unwrap();
        assert_eq!(llada_model_load(missing.as_ptr(), &mut model), Status::NotFound);
        assert!(model.is_null());
        assert!(last_error().contains("missing.lad: does not exist"), "{}", last_error());
        let junk = dir.path().join("junk.lad");
        std::fs::write(&junk, b"not an artifact").unwrap();
        let junk = CString::new(junk.to_str().unwrap()).unwrap();
        assert_eq!(llada_model_load(junk.as_ptr(), &mut model), Status::InvalidArtifact, "{}", last_error());
        assert!(last_error().contains("junk.lad"), "{}", last_error());
        let mut session = std::ptr::null_mut();
        assert_eq!(llada_session_new(std::ptr::null(), 0, &mut session), Status::InvalidArgument);
        assert_eq!(last_error(), "model is NULL");
        llada_model_free(std::ptr::null_mut());
        llada_session_free(std::ptr::null_mut());
        llada_cancel(std::ptr::null());
        llada_output_free(std::ptr::null_mut());
        assert_eq!(CStr::from_ptr(llada_version()).to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    let loaded = Loaded::new(&common::embedded(dir.path()));
    // SAFETY: a live model; `session` is writable.
    unsafe {
        let mut session = std::ptr::null_mut();
        assert_eq!(llada_session_new_on(loaded.model, 1, 7, &mut session), Status::InvalidArgument);
        assert!(session.is_null());
        assert!(last_error().contains("backend 7 is not an llada_backend value"), "{}", last_error());
        // Backends by name: the built-in numbers are their indexes in the registry.
        let mut index = u32::MAX;
        for (name, expected) in [("host", 0), ("vulkan", 1), ("qnn", 2)] {
            let c = CString::new(name).unwrap();
            assert_eq!(llada_backend_find(c.as_ptr(), &mut index), Status::Ok);
            assert_eq!(index, expected);
            assert_eq!(CStr::from_ptr(llada_backend_name(index)).to_str().unwrap(), name);
        }
        assert!(llada_backend_count() >= 3);
        assert!(llada_backend_name(llada_backend_count()).is_null());
        let tpu = CString::new("tpu").unwrap();
        assert_eq!(llada_backend_find(tpu.as_ptr(), &mut index), Status::InvalidArgument);
        assert!(last_error().contains("'tpu' is not a backend") && last_error().contains("host, vulkan, qnn"), "{}", last_error());
    }
    let prompt = CString::new(PROMPT).unwrap();
    let mut out = std::mem::MaybeUninit::<Output>::uninit();
    let mut generate = |params: &Params| unsafe {
        // SAFETY: live session, valid prompt, params and out.
        llada_generate(loaded.session, prompt.as_ptr(), params, None, std::ptr::null_mut(), out.as_mut_ptr())
    };
    let cases: [(Params, Status, &str); 6] = [
        (Params { policy: 9, ..llada_default_params() }, Status::InvalidArgument, "params.policy: 9 is not a llada_policy"),
        (Params { remasking: 2, ..llada_default_params() }, Status::InvalidArgument, "params.remasking: 2 is not a llada_remasking"),
        (Params { threshold: f32::NAN, ..llada_default_params() }, Status::InvalidArgument, "params.threshold"),
        (Params { gen_len: 60, ..llada_default_params() }, Status::InvalidArgument, "params.block_len 32 must divide the gen length 60"),
        (Params { gen_len: 4096, steps: 4096, ..llada_default_params() }, Status::InvalidArgument, "params.gen_len 4096 is outside 1..=255"),
        // In range alone, too long with the prompt: the request, not the field.
        (Params { gen_len: 224, steps: 224, ..llada_default_params() }, Status::InvalidRequest, "serves at most 256"),
    ];
    for (params, status, needle) in cases {
        assert_eq!(generate(&params), status, "{params:?}: {}", last_error());
        assert!(last_error().contains(needle), "{params:?}: {}", last_error());
    }
    // SAFETY: as above; a NUL-free but non-UTF-8 prompt.
    let latin1 = CString::new(vec![b'h', 0xe9]).unwrap();
    let status = unsafe { llada_generate(loaded.session, latin1.as_ptr(), std::ptr::null(), None, std::ptr::null_mut(), out.as_mut_ptr()) };
    assert_eq!(status, Status::InvalidArgument);
    assert!(last_error().starts_with("prompt is not UTF-8"), "{}", last_error());
    let status = unsafe { llada_generate(loaded.session, prompt.as_ptr(), std::ptr::null(), None, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_eq!(status, Status::InvalidArgument);
    assert_eq!(last_error(), "out is NULL");
}

/// Dream through the C interface: its sampler's settings (`alg`, `eps`, the dual policy with
/// blocks) give the tokens the Rust sampler gives, and LLaDA's `remasking` is refused naming
/// the field.
#[test]
fn dream_generates_through_the_c_interface_as_through_rust() {
    let dir = tempfile::tempdir().unwrap();
    let lad = dir.path().join("dream.lad");
    common::compile(&repo().join("tests/data/dream-conformance/tiny-dream-A"), &lad, None);
    let loaded = Loaded::new(&lad);
    let rust_model = llada_rt::Model::open(&lad, true).unwrap();
    let prompt = CString::new("hello").unwrap();
    for (alg, policy, block_len, rt_alg, rt_policy) in [
        (Alg::Entropy as u32, Policy::Exact as u32, 0, llada_rt::sampler::Alg::Entropy, llada_rt::sampler::Policy::Exact),
        (Alg::MaskgitPlus as u32, Policy::Dual as u32, 8, llada_rt::sampler::Alg::MaskgitPlus, llada_rt::sampler::Policy::Dual),
    ] {
        let params = Params { gen_len: 16, steps: 8, block_len, alg, policy, ..llada_default_params() };
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        // SAFETY: live session, valid strings and params, `out` writable.
        let status = unsafe { llada_generate(loaded.session, prompt.as_ptr(), &params, None, std::ptr::null_mut(), out.as_mut_ptr()) };
        assert_eq!(status, Status::Ok, "{}", last_error());
        // SAFETY: written by `llada_generate`; its tokens are valid until freed.
        let mut out = unsafe { out.assume_init() };
        let tokens = unsafe { std::slice::from_raw_parts(out.tokens, out.n_tokens) }.to_vec();
        unsafe { llada_output_free(&mut out) };
        let text = llada_rt::text::Text::new(&rust_model.header.tokenizer, &rust_model.header.special).unwrap();
        let ids = text.encode_chat("hello").unwrap();
        let p = llada_rt::SamplerParams { gen_length: 16, block_length: if block_len == 0 { 16 } else { 8 }, steps: 8, alg: rt_alg, policy: rt_policy, ..Default::default() };
        let want = llada_rt::generate(&mut llada_rt::Session::new(&rust_model).unwrap(), &ids, &p, &mut |_| {}).unwrap();
        assert_eq!(tokens, want.output_ids, "{rt_policy:?}");
    }
    let params = Params { gen_len: 16, steps: 8, remasking: Remasking::Random as u32, ..llada_default_params() };
    let mut out = std::mem::MaybeUninit::<Output>::uninit();
    // SAFETY: as above.
    let status = unsafe { llada_generate(loaded.session, prompt.as_ptr(), &params, None, std::ptr::null_mut(), out.as_mut_ptr()) };
    assert_ne!(status, Status::Ok);
    assert!(last_error().contains("params.remasking"), "{}", last_error());
    unsafe { llada_output_free(out.as_mut_ptr()) };
}

/// With the default settings (`llada_default_params()`, or none) a generation is `llada-rt run
/// --chat` with no options on every family: DiffusionGemma's length is its generation
/// config's, not 128.
#[test]
fn the_default_settings_are_runs_on_diffusion_gemma() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("dg.lad");
    common::compile(&repo().join("tests/data/diffusiongemma-conformance/tiny-dg-A"), &art, Some(128));
    let out = common::run("llada-rt", &["run", art.to_str().unwrap(), "--chat", "-p", "hello", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cli_ids: Vec<u32> = cli["output_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let loaded = Loaded::new(&art);
    let prompt = CString::new("hello").unwrap();
    for params in [std::ptr::null(), &llada_default_params() as *const Params] {
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        // SAFETY: live session, valid strings, `params` null or valid, `out` writable.
        let status = unsafe { llada_generate(loaded.session, prompt.as_ptr(), params, None, std::ptr::null_mut(), out.as_mut_ptr()) };
        assert_eq!(status, Status::Ok, "{}", last_error());
        // SAFETY: a successful output's tokens are valid until freed.
        let mut out = unsafe { out.assume_init() };
        let ids = unsafe { std::slice::from_raw_parts(out.tokens, out.n_tokens) }.to_vec();
        // SAFETY: filled by `llada_generate`.
        unsafe { llada_output_free(&mut out) };
        assert_eq!(ids, cli_ids);
    }
}
