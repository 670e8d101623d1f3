//! `llada_session_free` returns after the session's threads have exited: an app that frees a
//! session and then counts its threads, or unloads the library, finds none of ours. (Its own
//! test binary: no other test's sessions run meanwhile.)

mod common;

use std::ffi::{CStr, CString};

use llada::*;

#[test]
fn freeing_a_session_joins_its_threads() {
    let dir = tempfile::tempdir().unwrap();
    let art = CString::new(common::embedded(dir.path()).to_str().unwrap()).unwrap();
    let mut model = std::ptr::null_mut();
    // SAFETY: valid string and out pointer.
    assert_eq!(unsafe { llada_model_load(art.as_ptr(), &mut model) }, Status::Ok);
    assert_eq!(common::threads_now("llada-"), Vec::<String>::new());
    for _ in 0..3 {
        let mut session = std::ptr::null_mut();
        // SAFETY: a live model and a valid out pointer.
        assert_eq!(unsafe { llada_session_new(model, 2, &mut session) }, Status::Ok);
        // An mbsd generation also runs the side path's worker.
        let prompt = CString::new("FILL:30007=").unwrap();
        let params = Params { gen_len: 32, block_len: 16, steps: 32, policy: Policy::Mbsd as u32, ..llada_default_params() };
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        // SAFETY: a live session, valid strings and params, `out` writable.
        let status = unsafe { llada_generate(session, prompt.as_ptr(), &params, None, std::ptr::null_mut(), out.as_mut_ptr()) };
        // SAFETY: the message is valid until this thread's next call.
        assert_eq!(status, Status::Ok, "{}", unsafe { CStr::from_ptr(llada_last_error()) }.to_string_lossy());
        // SAFETY: written by `llada_generate`.
        unsafe { llada_output_free(out.as_mut_ptr()) };
        assert!(!common::threads_now("llada-").is_empty(), "the session runs worker threads");
        // SAFETY: a live session with no call running.
        unsafe { llada_session_free(session) };
        assert_eq!(common::threads_after_join("llada-"), Vec::<String>::new(), "threads outlived llada_session_free");
    }
    // SAFETY: a live model handle.
    unsafe { llada_model_free(model) };
}
