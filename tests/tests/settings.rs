//! Every size a user or an app can type is checked before anything is allocated for it, in
//! one place the CLI and the C API share: at 0, one past its limit and u32::MAX, a setting is
//! refused with one line naming it and its range: exit 2 from `llada-rt`, one status
//! (`LLADA_STATUS_INVALID_ARGUMENT`) from the C API, whichever side of the range it falls on.

mod common;

use std::ffi::{CStr, CString};
use std::path::Path;

use common::{assert_clean_failure, run};
use llada::*;

const U32_MAX: &str = "4294967295";

/// `run` with a 4-token prompt, 64 tokens in blocks of 32 over 64 steps on one thread, `extra`
/// flags replacing those.
fn run_embedded(art: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["run", art.to_str().unwrap(), "--prompt-ids", "1,2,3,4"];
    for pair in [["--gen-len", "64"], ["--block-len", "32"], ["--steps", "64"], ["--threads", "1"]] {
        if !extra.contains(&pair[0]) {
            args.extend(pair);
        }
    }
    args.extend_from_slice(extra);
    run("llada-rt", &args)
}

fn refused_with_usage_status(out: &std::process::Output, needles: &[&str]) {
    assert_clean_failure(out, needles);
    assert_eq!(out.status.code(), Some(2), "a setting out of range exits 2: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn the_cli_refuses_each_size_at_its_bounds_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    // The embedded model compiled with 256 positions: 255 generated at most beside a prompt.
    for gen_len in ["0", "256", U32_MAX] {
        refused_with_usage_status(&run_embedded(&art, &["--gen-len", gen_len]), &[&format!("--gen-len {gen_len} is outside 1..=255")]);
    }
    for steps in ["0", "65538", U32_MAX] {
        refused_with_usage_status(&run_embedded(&art, &["--steps", steps]), &[&format!("--steps {steps}"), "1..=65536"]);
    }
    // Two blocks: at most two drafted ahead, whatever the policy.
    for spec in ["3", U32_MAX] {
        for policy in ["mbsd", "exact"] {
            refused_with_usage_status(&run_embedded(&art, &["--policy", policy, "--spec-blocks", spec]), &[&format!("--spec-blocks {spec} is outside 0..=2")]);
        }
    }
    let largest = llada_rt::Model::open(&art, false).unwrap().header.graphs.iter().map(|g| g.rows).max().unwrap();
    for side in ["0".to_string(), (largest + 1).to_string(), U32_MAX.to_string()] {
        let o = run_embedded(&art, &["--policy", "mbsd", "--side-rows", &side]);
        refused_with_usage_status(&o, &[&format!("--side-rows {side} is outside 2..={largest}")]);
    }
    for rows in ["0", U32_MAX] {
        refused_with_usage_status(&run_embedded(&art, &["--policy", "mbsd", "--rows", rows]), &[&format!("--rows {rows} is outside 1..={largest}")]);
    }
    refused_with_usage_status(&run_embedded(&art, &["--threads", "100000"]), &["--threads 100000 is outside 1..="]);
    // Seeds take every u64; past it or negative, the flag and its range, as the server and
    // Python say it (issue 58); a whole number past usize likewise.
    let top = run_embedded(&art, &["--seed", "18446744073709551615", "--temperature", "0.5"]);
    assert!(top.status.success(), "{}", String::from_utf8_lossy(&top.stderr));
    for seed in ["18446744073709551616", "-1"] {
        refused_with_usage_status(&run_embedded(&art, &["--seed", seed]), &["--seed", &format!("{seed} is outside 0..=18446744073709551615")]);
    }
    refused_with_usage_status(&run_embedded(&art, &["--gen-len", "-5"]), &["--gen-len", "-5 is outside 0..="]);
    // Inside the ranges the same flags run: 0 blocks drafted is speculation off, a setting.
    // More steps than tokens (the default 128 with a shorter --gen-len) commit nothing in the
    // extra steps, as the official sampler does, and run.
    for ok in [&["--policy", "mbsd", "--spec-blocks", "0", "--side-rows", "2", "--rows", "1", "--steps", "2", "--gen-len", "64"][..], &["--gen-len", "32", "--steps", "32"], &["--gen-len", "32", "--steps", "128"]] {
        let o = run_embedded(&art, ok);
        assert!(o.status.success(), "{ok:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

fn last_error() -> String {
    // SAFETY: libllada returns a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(llada_last_error()) }.to_string_lossy().into_owned()
}

#[test]
fn the_c_api_refuses_each_field_at_its_bounds_with_one_status() {
    let dir = tempfile::tempdir().unwrap();
    let art = CString::new(common::embedded(dir.path()).to_str().unwrap()).unwrap();
    let mut model = std::ptr::null_mut();
    // SAFETY: valid string and out pointer.
    assert_eq!(unsafe { llada_model_load(art.as_ptr(), &mut model) }, Status::Ok, "{}", last_error());
    let mut session = std::ptr::null_mut();
    for threads in [100_000, u32::MAX] {
        // SAFETY: a live model and a valid out pointer.
        assert_eq!(unsafe { llada_session_new(model, threads, &mut session) }, Status::InvalidArgument);
        assert!(last_error().starts_with(&format!("n_threads {threads} is outside 1..=")), "{}", last_error());
        assert!(session.is_null());
    }
    // SAFETY: as above.
    assert_eq!(unsafe { llada_session_new(model, 1, &mut session) }, Status::Ok, "{}", last_error());
    let generate = |params: Params| {
        let prompt = CString::new("FILL:3000705=").unwrap();
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        // SAFETY: a live session, valid strings and params, `out` writable.
        let status = unsafe { llada_generate(session, prompt.as_ptr(), &params, None, std::ptr::null_mut(), out.as_mut_ptr()) };
        // SAFETY: written by `llada_generate`; freed once.
        unsafe { llada_output_free(out.as_mut_ptr()) };
        (status, last_error())
    };
    let base = Params { gen_len: 64, steps: 64, block_len: 32, ..llada_default_params() };
    let cases: Vec<(Params, String)> = vec![
        (Params { gen_len: 256, ..base }, "params.gen_len 256 is outside 1..=255".into()),
        (Params { gen_len: u32::MAX, ..base }, "params.gen_len 4294967295".into()),
        (Params { steps: 65538, ..base }, "params.steps 65538".into()),
        (Params { steps: u32::MAX, ..base }, "params.steps 4294967295".into()),
        (Params { spec_blocks: 3, policy: Policy::Mbsd as u32, ..base }, "params.spec_blocks 3 is outside 0..=2".into()),
        (Params { spec_blocks: i32::MAX, policy: Policy::Mbsd as u32, ..base }, "params.spec_blocks 2147483647".into()),
        (Params { spec_blocks: i32::MAX, ..base }, "params.spec_blocks 2147483647".into()),
        // Both sides of a float field's range get the same status.
        (Params { temperature: -1.0, ..base }, "params.temperature -1".into()),
        (Params { temperature: f64::NAN, ..base }, "params.temperature NaN".into()),
        (Params { cfg_scale: -1.0, ..base }, "params.cfg_scale -1".into()),
        (Params { cfg_scale: 1.0, policy: Policy::Dual as u32, ..base }, "params.cfg_scale 1 needs the exact policy".into()),
        (Params { threshold: -0.5, ..base }, "params.threshold -0.5".into()),
        (Params { threshold: 1.5, ..base }, "params.threshold 1.5".into()),
        // LLaDA 2.x's settings, on a LLaDA model.
        (Params { eos_early_stop: true, ..base }, "params.eos_early_stop applies to LLaDA 2.x's sampler only".into()),
        (Params { editing_threshold: 0.9, ..base }, "params.editing_threshold 0.9: token editing is LLaDA 2.1's".into()),
        (Params { max_post_steps: 3, ..base }, "params.max_post_steps 3: applies to LLaDA 2.1's token editing only".into()),
    ];
    for (params, want) in cases {
        let (status, msg) = generate(params);
        assert_eq!(status, Status::InvalidArgument, "{want}: {msg}");
        assert!(msg.starts_with(&want), "{msg} does not start with {want}");
        assert!(!msg.contains('\n'));
    }
    // The session is fine after all of that; steps 0 (and gen_len 0) take the model's default.
    assert_eq!(generate(Params { gen_len: 16, steps: 16, block_len: 16, ..base }).0, Status::Ok);
    assert_eq!(generate(Params { gen_len: 16, steps: 0, block_len: 16, ..base }).0, Status::Ok);
    assert_eq!(generate(Params { gen_len: 0, steps: 0, ..base }).0, Status::Ok);
    // SAFETY: live handles, no call running.
    unsafe {
        llada_session_free(session);
        llada_model_free(model);
    }
}
