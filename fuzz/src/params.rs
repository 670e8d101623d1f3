//! Target `params`: the C API's generation settings. Every field of `llada_params` (and of
//! `llada_session_params`, for a fresh session) takes boundary values (0, 1, the plan's limits and one past them,
//! the integer maxima), NaN, infinities, negatives and random values, structure-aware: the
//! struct is built field by field, not from bytes. Each execution calls `llada_generate` on
//! one session of a small artifact; a generation the settings allow is cancelled by its step
//! callback after a few steps, so executions stay short. Whatever the settings, the call must
//! return a documented status with a one-line message: never abort (an allocation sized by
//! a setting), panic (`LLADA_STATUS_INTERNAL`) or hang.

use std::ffi::{c_int, c_void, CStr, CString};
use std::path::Path;

use llada::{
    llada_default_params, llada_default_session_params, llada_generate, llada_last_error, llada_model_load, llada_output_free, llada_session_free, llada_session_new,
    llada_session_open, Model, Output, Params, Session, SessionSettings, Status, Step,
};

use crate::harness::Outcome;
use crate::mutate::Rng;

/// A loaded artifact and one session on it, used by every execution.
pub struct Seed {
    model: *mut Model,
    session: *mut Session,
    /// Positions the artifact holds: the limits worth probing around.
    max_len: u32,
}

impl Seed {
    pub fn new(artifact: &Path) -> Seed {
        let path = CString::new(artifact.to_str().expect("a UTF-8 path")).expect("no NUL in the path");
        let mut model = std::ptr::null_mut();
        // SAFETY: a valid string and out pointer.
        assert_eq!(unsafe { llada_model_load(path.as_ptr(), &mut model) }, Status::Ok, "{}", last_error());
        let mut session = std::ptr::null_mut();
        // SAFETY: a live model handle and a valid out pointer.
        assert_eq!(unsafe { llada_session_new(model, 1, &mut session) }, Status::Ok, "{}", last_error());
        let max_len = llada_rt::Model::open(artifact, false).expect("the seed artifact loads").max_exact_len();
        Seed { model, session, max_len }
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        // SAFETY: live handles from `new`, no call running on them.
        unsafe {
            llada_session_free(self.session);
            llada::llada_model_free(self.model);
        }
    }
}

fn last_error() -> String {
    // SAFETY: libllada returns a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(llada_last_error()) }.to_string_lossy().into_owned()
}

/// One execution's input: the settings, those of a fresh session (or none), and after how
/// many steps the callback cancels.
#[derive(Debug, Clone)]
pub struct Input {
    params: Params,
    session: Option<SessionSettings>,
    cancel_after: u32,
    prompt: &'static str,
}

fn int(rng: &mut Rng, limit: u32) -> u32 {
    let near = [0, 1, 2, 3, limit.saturating_sub(1), limit, limit.saturating_add(1), limit.saturating_mul(2), u32::MAX, u32::MAX - 1, 0x8000_0000];
    match rng.below(3) {
        0 => rng.next() as u32,
        1 => rng.below(limit as usize + 3) as u32,
        _ => near[rng.below(near.len())],
    }
}

fn float(rng: &mut Rng) -> f64 {
    let special = [0.0, -0.0, 1.0, -1.0, 0.5, 0.99, 1.0 + f64::EPSILON, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e30, -1e-30, f64::MIN_POSITIVE, f64::MAX];
    match rng.below(2) {
        0 => special[rng.below(special.len())],
        _ => f64::from_bits(rng.next()),
    }
}

pub fn make(seed: &Seed, rng: &mut Rng) -> Input {
    let mut p = llada_default_params();
    // Most executions change a few fields of valid settings; some change them all.
    let every = rng.chance(4);
    let limit = seed.max_len;
    for field in 0..21 {
        if !every && !rng.chance(4) {
            continue;
        }
        match field {
            0 => p.gen_len = int(rng, limit),
            1 => p.block_len = int(rng, 32),
            2 => p.steps = int(rng, limit),
            3 => p.temperature = float(rng),
            4 => p.seed = rng.next(),
            5 => p.cfg_scale = float(rng),
            6 => p.remasking = int(rng, 2),
            7 => p.policy = int(rng, 5),
            8 => p.refresh_every = int(rng, 8),
            9 => p.threshold = float(rng) as f32,
            10 => p.spec_blocks = int(rng, 4) as i32,
            11 => p.chat = rng.chance(2),
            12 => p.spec_threshold = float(rng) as f32,
            13 => p.rows = int(rng, limit),
            14 => p.revision = int(rng, 2),
            15 => p.side_rows = int(rng, limit),
            16 => p.stable_confidence = float(rng) as f32,
            17 => p.stable_checks = int(rng, 4),
            18 => p.revise_confidence = float(rng) as f32,
            19 => p.spec_blocks = -(int(rng, 4) as i32),
            _ => (p.logits_eos_inf, p.confidence_eos_eot_inf) = (rng.chance(2), rng.chance(2)),
        }
    }
    // Small generations by default, so the ones the settings allow finish quickly.
    if !every && rng.chance(2) {
        p.gen_len = [8, 16, 32][rng.below(3)];
        p.steps = p.steps.min(p.gen_len);
    }
    let session = rng.chance(64).then(|| {
        let d = llada_default_session_params();
        let pick = |rng: &mut Rng, default: u32, limit: u32| if rng.chance(2) { int(rng, limit) } else { default };
        SessionSettings {
            n_threads: pick(rng, d.n_threads, 64),
            backend: pick(rng, d.backend, 2),
            staging: pick(rng, d.staging, 2),
            experts: pick(rng, d.experts, 4),
            cpu_threads: pick(rng, d.cpu_threads, 4),
        }
    });
    let prompts = ["FILL:30007050=", "SHIFT:PONM=", "", "x", "<|mdm_mask|>"];
    Input { params: p, session, cancel_after: 1 + rng.below(3) as u32, prompt: prompts[rng.below(prompts.len())] }
}

/// Cancels the generation once `*user_data` steps have run.
unsafe extern "C" fn cancel_after(step: *const Step, user_data: *mut c_void) -> c_int {
    // SAFETY: libllada passes a valid step; `user_data` is the `u32` `test` passes.
    let (step, limit) = unsafe { ((*step).step, *(user_data as *const u32)) };
    c_int::from(step >= limit)
}

pub fn test(seed: &Seed, input: &Input) -> Outcome {
    if let Some(settings) = &input.session {
        let mut session = std::ptr::null_mut();
        // SAFETY: a live model handle, valid settings and out pointer.
        let status = unsafe { llada_session_open(seed.model, settings, &mut session) };
        check(status, "llada_session_open", input);
        // SAFETY: null or a live session with no call running.
        unsafe { llada_session_free(session) };
    }
    let prompt = CString::new(input.prompt).expect("no NUL in the prompts");
    let mut limit = input.cancel_after;
    let mut out = std::mem::MaybeUninit::<Output>::uninit();
    // SAFETY: a live session, valid strings and params, a callback that honours its
    // `user_data` (a live `u32`), `out` writable.
    let status = unsafe { llada_generate(seed.session, prompt.as_ptr(), &input.params, Some(cancel_after), (&mut limit as *mut u32).cast(), out.as_mut_ptr()) };
    // SAFETY: `llada_generate` writes `out` whenever it is non-null.
    let mut out = unsafe { out.assume_init() };
    // SAFETY: filled by `llada_generate` (or zeroed).
    unsafe { llada_output_free(&mut out) };
    check(status, "llada_generate", input);
    if status == Status::Ok || status == Status::Cancelled { Outcome::Accepted } else { Outcome::Refused }
}

/// A status is a documented one, never the internal error, and a failure explains itself in
/// one line.
fn check(status: Status, call: &str, input: &Input) {
    if status == Status::Ok {
        return;
    }
    let msg = last_error();
    assert!(status != Status::Internal, "{call} failed internally on {input:?}: {msg}");
    assert!(!msg.is_empty() && !msg.contains('\n'), "{call} returned {status:?} on {input:?} with message {msg:?}");
}
