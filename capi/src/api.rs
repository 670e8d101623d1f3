//! The handles and the calls on them.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

use llada_rt::text::Text;
use llada_rt::{generate_until, Model as RtModel, Session as RtSession};

use crate::error::{guard, Failure, Status};
use crate::params::{llada_default_session_params, Params, SessionSettings};

/// A loaded, verified artifact and its tokenizer (`llada_model` in C).
pub struct Model {
    loaded: Arc<Loaded>,
}

struct Loaded {
    /// Shared with every session made from it.
    model: Arc<RtModel>,
    text: Text,
}

/// A model bound to a window and an executor, ready to generate (`llada_session` in C).
pub struct Session {
    /// Set by `llada_cancel` (any thread), read by the generation between steps.
    cancel: AtomicBool,
    /// One generation at a time: `try_lock` turns a second one into `Busy`.
    state: Mutex<SessionState>,
}

struct SessionState {
    /// Shares the model's `Arc`: it outlives `llada_model_free` as long as the session does.
    session: RtSession,
    loaded: Arc<Loaded>,
}

/// What one generation produced. Free its arrays with `llada_output_free`.
#[repr(C)]
pub struct Output {
    /// The answer: generated text up to the first end-of-text or end-of-turn token, special
    /// tokens skipped (what `llada-rt run` prints). UTF-8, NUL-terminated.
    pub text: *mut c_char,
    /// Every generated token id (`gen_len` of them, end-of-text padding included).
    pub tokens: *mut u32,
    pub n_tokens: usize,
    /// Forward passes the generation ran.
    pub forward_passes: u64,
    /// Token rows those passes computed, padding included.
    pub rows_computed: u64,
    /// Tokens committed by confirming a draft (SPEC, MBSD).
    pub drafts_confirmed: u64,
    /// Committed tokens the CPU side path revised (MBSD with dual-path revision).
    pub revisions: u64,
    /// Wall-clock seconds of the generation.
    pub seconds: f64,
}

/// The state after one denoising step, for showing the answer as it forms. Every pointer is
/// valid only during the callback.
#[repr(C)]
pub struct Step {
    /// Steps done (1-based) and the steps asked for; policies with early commits may finish
    /// in fewer. LLaDA 2.x's `steps` count one block's and DiffusionGemma's one canvas's, so
    /// there `step` passes `steps` after the first block or canvas.
    pub step: u32,
    pub steps: u32,
    /// The generated part of the sequence as the sampler holds it, `n_tokens` ids: `mask_id`
    /// where nothing is committed yet. LLaDA 2.x: to the end of its last block, which may pass
    /// `gen_len` (the output is the first `gen_len`, and `n_settled` stops there).
    /// DiffusionGemma has no mask: a canvas starts as random tokens that each step redraws,
    /// and `committed` lists the positions a step accepted.
    pub tokens: *const u32,
    pub n_tokens: usize,
    pub mask_id: u32,
    /// This step's commits, `n_committed` pairs of (position in `tokens`, token id), flat.
    pub committed: *const u32,
    pub n_committed: usize,
    /// This step's revisions of earlier commits, `n_revised` pairs of (position in `tokens`,
    /// new token id), flat, applied after the commits (LLADA_POLICY_MBSD's revision and LLaDA
    /// 2.1's token editing revise). Together with `committed` they are every position this
    /// step changed (DiffusionGemma: every position it accepted).
    pub revised: *const u32,
    pub n_revised: usize,
    /// Leading positions of `tokens` that can no longer change (committed, and stable under
    /// revision, with none before them still open).
    pub n_settled: usize,
    /// The answer as far as it is settled (the first `n_settled` tokens) as text: it only
    /// ever grows, and the output's `text` starts with it. UTF-8, NUL-terminated.
    pub text: *const c_char,
}

/// Called after every denoising step with the step's state and the `user_data` given to
/// `llada_generate`. Return 0 to go on, anything else to cancel the generation.
pub type StepCallback = Option<unsafe extern "C" fn(step: *const Step, user_data: *mut c_void) -> c_int>;

/// A C string argument as UTF-8, or an error naming the argument.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string that lives for the call.
unsafe fn text_arg<'a>(ptr: *const c_char, name: &str) -> Result<&'a str, Failure> {
    if ptr.is_null() {
        return Err(Failure::argument(format!("{name} is NULL")));
    }
    // SAFETY: non-null, and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(ptr) }.to_str().map_err(|e| Failure::argument(format!("{name} is not UTF-8: {e}")))
}

fn null(name: &str) -> Failure {
    Failure::argument(format!("{name} is NULL"))
}

/// Loads the artifact at `path` (mapped, every checksum verified) and its tokenizer into
/// `*out`. On failure `*out` is set to NULL: LLADA_STATUS_NOT_FOUND if nothing is at `path`,
/// LLADA_STATUS_IO if it is a directory or another thing that is not a regular file, or
/// cannot be read, LLADA_STATUS_INVALID_ARTIFACT if it is not a valid artifact. There is no
/// limit on how many models are loaded at once but memory.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` points to writable storage for a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_model_load(path: *const c_char, out: *mut *mut Model) -> Status {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: the caller's contract on `path`.
        let path = unsafe { text_arg(path, "path") }?;
        let model = RtModel::open(Path::new(path), true)?;
        let text = Text::new(&model.header.tokenizer, &model.header.special)?;
        let handle = Box::new(Model { loaded: Arc::new(Loaded { model: Arc::new(model), text }) });
        // SAFETY: as above.
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Releases a model handle (NULL is ignored). Sessions made from it stay valid.
///
/// # Safety
/// `model` is NULL or a handle from `llada_model_load` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_model_free(model: *mut Model) {
    // SAFETY: the caller's contract is `free_handle`'s.
    unsafe { free_handle(model) }
}

/// Drops a handle `Box::into_raw` gave out (NULL is ignored), inside the panic guard.
///
/// # Safety
/// `handle` is NULL or a live handle from `Box::into_raw`, freed once, with no call running
/// on it.
unsafe fn free_handle<T>(handle: *mut T) {
    let _ = guard(|| {
        if !handle.is_null() {
            // SAFETY: a live handle from `Box::into_raw`, freed once by the caller's contract.
            drop(unsafe { Box::from_raw(handle) });
        }
        Ok(())
    });
}

/// A session on `model` computing on `n_threads` threads (0: every core, or the
/// `LLADA_THREADS` environment variable), into `*out`. It allocates the model's window and
/// reads the resident weights into it. On failure `*out` is set to NULL. The same as
/// `llada_session_open` with `llada_default_session_params()` and `n_threads`.
///
/// # Safety
/// `model` is a live handle from `llada_model_load`; `out` points to writable storage.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_session_new(model: *const Model, n_threads: u32, out: *mut *mut Session) -> Status {
    let settings = SessionSettings { n_threads, ..llada_default_session_params() };
    // SAFETY: the caller's contract is this function's; `settings` lives across the call.
    unsafe { llada_session_open(model, &settings, out) }
}

/// `llada_session_new` with the dense graphs on `backend` (`n_threads`: the CPU threads; on
/// the host backend they also run the kernels).
///
/// # Safety
/// As `llada_session_new`. `backend` is an `llada_backend` value (another value is
/// `LLADA_STATUS_INVALID_ARGUMENT`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_session_new_on(model: *const Model, n_threads: u32, backend: u32, out: *mut *mut Session) -> Status {
    let settings = SessionSettings { n_threads, backend, ..llada_default_session_params() };
    // SAFETY: as above.
    unsafe { llada_session_open(model, &settings, out) }
}

/// A session on `model` as `params` say (NULL: `llada_default_session_params()`), into
/// `*out`: every session option llada-rt has. On failure `*out` is set to NULL and
/// `llada_last_error` names the field.
///
/// # Safety
/// `model` is a live handle from `llada_model_load`; `params` NULL or valid; `out` points to
/// writable storage.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_session_open(model: *const Model, params: *const SessionSettings, out: *mut *mut Session) -> Status {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { *out = std::ptr::null_mut() };
        // SAFETY: null or a live handle by the caller's contract.
        let model = unsafe { model.as_ref() }.ok_or_else(|| null("model"))?;
        // SAFETY: null or valid by the caller's contract.
        let settings = unsafe { params.as_ref() }.copied().unwrap_or_else(|| llada_default_session_params()).session()?;
        let loaded = model.loaded.clone();
        let session = RtSession::open(&loaded.model, &settings)?;
        let handle = Box::new(Session { cancel: AtomicBool::new(false), state: Mutex::new(SessionState { session, loaded }) });
        // SAFETY: as above.
        unsafe { *out = Box::into_raw(handle) };
        Ok(())
    })
}

/// Releases a session (NULL is ignored).
///
/// # Safety
/// `session` is NULL or a live handle from `llada_session_new`, with no call running on it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_session_free(session: *mut Session) {
    // SAFETY: the caller's contract is `free_handle`'s.
    unsafe { free_handle(session) }
}

/// Asks the generation running on `session` to stop after its current step; it then
/// returns LLADA_STATUS_CANCELLED. A cancel made while nothing runs stops the next
/// generation at its first step (so a cancel just before a start is not lost); every
/// generation's end clears it. Safe from any thread.
///
/// # Safety
/// `session` is NULL or a live handle from `llada_session_new`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_cancel(session: *const Session) {
    // SAFETY: null or a live handle by the caller's contract; only the atomic is touched.
    if let Some(s) = unsafe { session.as_ref() } {
        s.cancel.store(true, Ordering::SeqCst);
    }
}

/// Generates an answer to `prompt` as `params` say (NULL: `llada_default_params()`),
/// calling `callback` (may be NULL) with `user_data` after every step, and fills `*out`.
/// On failure `*out` is zeroed and `llada_last_error` says why.
///
/// # Safety
/// `session` is a live handle; `prompt` a NUL-terminated string; `params` NULL or valid (its
/// `eos_ids` NULL or `n_eos_ids` readable ids);
/// `callback`, if set, safe to call with `user_data`; `out` points to a writable `llada_output`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_generate(
    session: *const Session,
    prompt: *const c_char,
    params: *const Params,
    callback: StepCallback,
    user_data: *mut c_void,
    out: *mut Output,
) -> Status {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { out.write(Output::empty()) };
        // SAFETY: null or a live handle by the caller's contract.
        let handle = unsafe { session.as_ref() }.ok_or_else(|| null("session"))?;
        // SAFETY: the caller's contract on `prompt`.
        let prompt = unsafe { text_arg(prompt, "prompt") }?;
        // SAFETY: null or valid by the caller's contract.
        let params = unsafe { params.as_ref() }.copied().unwrap_or_else(|| crate::params::llada_default_params());
        let mut state = match handle.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::WouldBlock) => return Err(Failure(Status::Busy, "another generation is running on this session".into())),
            Err(TryLockError::Poisoned(_)) => {
                return Err(Failure(Status::Internal, "this session failed with an internal error earlier; free it and make a new one".into()));
            }
        };
        let result = run(&mut state, &handle.cancel, prompt, &params, callback, user_data);
        handle.cancel.store(false, Ordering::SeqCst);
        let output = result?;
        // SAFETY: as above.
        unsafe { out.write(output) };
        Ok(())
    })
}

fn run(state: &mut SessionState, cancel: &AtomicBool, prompt: &str, params: &Params, callback: StepCallback, user_data: *mut c_void) -> Result<Output, Failure> {
    let loaded = state.loaded.clone();
    let (model, text) = (&loaded.model, &loaded.text);
    // SAFETY: `params` came from `llada_generate`'s caller, whose contract covers `eos_ids`.
    let sampler = unsafe { params.sampler(model) }?;
    // Encoded on the session's own threads, not the caller's: `tokenizers` keeps a BPE cache
    // per thread and per tokenizer that lives as long as the thread, even after the tokenizer
    // is dropped. On an app's long-lived thread every loaded model would leave its entry
    // behind (kilobytes per load-generate-free cycle); the session's threads are joined
    // when it is freed, and their caches go with them.
    let chat = params.chat;
    let ids = state.session.pool().install(|| if chat { text.encode_chat(prompt) } else { text.encode(prompt) })?;
    let mask = model.header.special.mask;
    let g = generate_until(&mut state.session, &ids, &sampler, &mut |v| {
        if let Some(f) = callback {
            let generated = v.generated();
            let prefix = CString::new(text.settled_answer(&generated[..v.settled]).replace('\0', " ")).unwrap_or_default();
            let step = Step {
                step: v.step as u32,
                steps: v.steps as u32,
                tokens: generated.as_ptr(),
                n_tokens: generated.len(),
                mask_id: mask,
                committed: v.committed.as_ptr().cast(),
                n_committed: v.committed.len(),
                revised: v.revised.as_ptr().cast(),
                n_revised: v.revised.len(),
                n_settled: v.settled,
                text: prefix.as_ptr(),
            };
            // SAFETY: every pointer in `step` lives until this call returns; the callback
            // and `user_data` are the caller's, called as its contract allows.
            if unsafe { f(&step, user_data) } != 0 {
                return ControlFlow::Break(());
            }
        }
        if cancel.load(Ordering::SeqCst) { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    })?;
    let answer = CString::new(text.answer(&g.output_ids).replace('\0', " ")).unwrap_or_default();
    let tokens = g.output_ids.into_boxed_slice();
    let n_tokens = tokens.len();
    Ok(Output {
        text: answer.into_raw(),
        tokens: Box::into_raw(tokens).cast(),
        n_tokens,
        forward_passes: g.forward_passes,
        rows_computed: g.rows_computed,
        drafts_confirmed: g.drafts_confirmed,
        revisions: g.revisions.iter().flatten().map(|step| step.len() as u64).sum(),
        seconds: g.seconds,
    })
}

impl Output {
    fn empty() -> Output {
        Output { text: std::ptr::null_mut(), tokens: std::ptr::null_mut(), n_tokens: 0, forward_passes: 0, rows_computed: 0, drafts_confirmed: 0, revisions: 0, seconds: 0.0 }
    }
}

/// Frees the arrays of an output `llada_generate` filled and zeroes it (NULL, or an output
/// already freed or zeroed, is ignored).
///
/// # Safety
/// `output` is NULL or points to an output filled by `llada_generate` (or zeroed).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_output_free(output: *mut Output) {
    let _ = guard(|| {
        // SAFETY: null or valid by the caller's contract.
        let Some(o) = (unsafe { output.as_mut() }) else { return Ok(()) };
        if !o.text.is_null() {
            // SAFETY: from `CString::into_raw` in `run`, freed once (zeroed below).
            drop(unsafe { CString::from_raw(o.text) });
        }
        if !o.tokens.is_null() {
            // SAFETY: from `Box::into_raw` of a `n_tokens`-long boxed slice in `run`.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(o.tokens, o.n_tokens)) });
        }
        *o = Output::empty();
        Ok(())
    });
}

/// libllada's version, as "MAJOR.MINOR.PATCH" (static storage).
#[unsafe(no_mangle)]
pub extern "C" fn llada_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// How many backends this build registers; their numbers are `0..count`.
#[unsafe(no_mangle)]
pub extern "C" fn llada_backend_count() -> u32 {
    llada_rt::executor::BACKENDS.len() as u32
}

/// The name of backend number `index` (static storage), or NULL past the last.
#[unsafe(no_mangle)]
pub extern "C" fn llada_backend_name(index: u32) -> *const c_char {
    // The names with their NULs, made once (the registry is static).
    static NAMES: std::sync::OnceLock<Vec<CString>> = std::sync::OnceLock::new();
    let names = NAMES.get_or_init(|| llada_rt::executor::names().into_iter().map(|n| CString::new(n).unwrap_or_default()).collect());
    names.get(index as usize).map_or(std::ptr::null(), |n| n.as_ptr())
}

/// The number of the backend named `name` (as `--backend` takes it) into `*out`; an unknown
/// name is LLADA_STATUS_INVALID_ARGUMENT, and `llada_last_error` lists the backends.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` points to writable storage.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn llada_backend_find(name: *const c_char, out: *mut u32) -> Status {
    guard(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        // SAFETY: the caller's contract on `name`.
        let name = unsafe { text_arg(name, "name") }?;
        let backend = llada_rt::executor::find(name).map_err(|_| Failure::argument(format!("name: '{name}' is not a backend; the backends are {}", llada_rt::executor::names().join(", "))))?;
        let index = crate::params::backend_index(backend.name).expect("a registered backend has an index");
        // SAFETY: non-null and writable by the caller's contract.
        unsafe { *out = index };
        Ok(())
    })
}
