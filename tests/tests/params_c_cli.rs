//! One set of settings, two front ends: every sampler and session setting given through the
//! C API (`llada_params`, `llada_session_params`) generates the tokens `llada-rt run` gives
//! with the same flags (the same tokens, commits step by step, passes, rows, confirmed drafts
//! and revisions), for every policy (and a mixture-of-experts model for the expert
//! settings).

mod common;

use std::ffi::{CStr, CString};
use std::path::Path;

use llada::*;
use llada_tools::checkpoint::{Shape, WeightType};

/// One case: the CLI's flags and the same settings for the C API.
struct Case {
    flags: &'static [&'static str],
    params: Params,
    session: SessionSettings,
}

fn cases() -> Vec<Case> {
    let p = Params { gen_len: 64, block_len: 16, steps: 32, chat: true, ..llada_default_params() };
    let s = SessionSettings { n_threads: 2, ..llada_default_session_params() };
    let common = ["--gen-len", "64", "--block-len", "16", "--steps", "32", "--chat"];
    let with = |rest: &'static [&'static str]| -> &'static [&'static str] { Box::leak([&common[..], rest].concat().into_boxed_slice()) };
    vec![
        Case {
            flags: with(&["--policy", "exact", "--temperature", "0.7", "--seed", "5", "--cfg", "0.5", "--remasking", "random", "--threads", "1", "--staging", "sync"]),
            params: Params { policy: Policy::Exact as u32, temperature: 0.7, seed: 5, cfg_scale: 0.5, remasking: Remasking::Random as u32, ..p },
            session: SessionSettings { n_threads: 1, staging: Staging::Sync as u32, ..s },
        },
        // Longer than the 64-token answer: the tail is end-of-text, which these two change.
        Case {
            flags: &["--gen-len", "96", "--block-len", "32", "--steps", "48", "--chat", "--policy", "exact", "--logits-eos-inf", "--threads", "2"],
            params: Params { gen_len: 96, block_len: 32, steps: 48, logits_eos_inf: true, ..p },
            session: s,
        },
        Case {
            flags: &["--gen-len", "96", "--block-len", "32", "--steps", "48", "--chat", "--policy", "exact", "--confidence-eos-eot-inf", "--threads", "2"],
            params: Params { gen_len: 96, block_len: 32, steps: 48, confidence_eos_eot_inf: true, ..p },
            session: s,
        },
        Case {
            flags: with(&["--policy", "prefix", "--refresh-every", "2", "--threshold", "0.8", "--threads", "2"]),
            params: Params { policy: Policy::Prefix as u32, refresh_every: 2, threshold: 0.8, ..p },
            session: s,
        },
        Case {
            flags: with(&["--policy", "dual", "--refresh-every", "3", "--temperature", "0.5", "--seed", "9", "--threads", "2"]),
            params: Params { policy: Policy::Dual as u32, refresh_every: 3, temperature: 0.5, seed: 9, ..p },
            session: s,
        },
        Case {
            flags: with(&["--policy", "spec", "--spec-blocks", "2", "--spec-threshold", "0", "--threads", "2"]),
            params: Params { policy: Policy::Spec as u32, spec_blocks: 2, spec_threshold: 0.0, ..p },
            session: s,
        },
        Case {
            flags: with(&[
                "--policy", "mbsd", "--spec-blocks", "1", "--rows", "32", "--revision", "dual-path", "--side-rows", "4",
                "--stable-confidence", "0.001", "--stable-checks", "3", "--revise-confidence", "0.01", "--threads", "2",
            ]),
            params: Params {
                policy: Policy::Mbsd as u32,
                spec_blocks: 1,
                rows: 32,
                revision: Revision::DualPath as u32,
                side_rows: 4,
                stable_confidence: 0.001,
                stable_checks: 3,
                revise_confidence: 0.01,
                ..p
            },
            session: s,
        },
        Case {
            flags: with(&["--policy", "mbsd", "--spec-blocks", "0", "--revision", "off", "--threads", "2"]),
            params: Params { policy: Policy::Mbsd as u32, spec_blocks: 0, revision: Revision::Off as u32, ..p },
            session: s,
        },
    ]
}

fn last_error() -> String {
    // SAFETY: libllada returns a NUL-terminated string valid until this thread's next call.
    unsafe { CStr::from_ptr(llada_last_error()) }.to_string_lossy().into_owned()
}

/// What a generation did: its tokens, forward passes, rows, confirmed drafts and revisions,
/// and each step's commits (flattened `[position, token]` pairs).
type Outcome = (Vec<u32>, [u64; 4], Vec<Vec<u32>>);

/// Collects each step's commits.
unsafe extern "C" fn record(step: *const Step, user_data: *mut std::ffi::c_void) -> std::ffi::c_int {
    // SAFETY: libllada passes a valid step for the call; `user_data` is the `Vec` below.
    unsafe {
        let step = &*step;
        let steps = &mut *(user_data as *mut Vec<Vec<u32>>);
        steps.push(std::slice::from_raw_parts(step.committed, 2 * step.n_committed).to_vec());
    }
    0
}

/// What the C API generates for `prompt` on `artifact`.
fn c_tokens(artifact: &Path, prompt: &str, params: &Params, settings: &SessionSettings) -> Outcome {
    let path = CString::new(artifact.to_str().unwrap()).unwrap();
    let prompt = CString::new(prompt).unwrap();
    let (mut model, mut session) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid strings, params and out pointers; every handle is live until freed below,
    // and the output's arrays are read before it is freed.
    unsafe {
        assert_eq!(llada_model_load(path.as_ptr(), &mut model), Status::Ok, "{}", last_error());
        assert_eq!(llada_session_open(model, settings, &mut session), Status::Ok, "{}", last_error());
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        let mut steps: Vec<Vec<u32>> = Vec::new();
        let user_data = (&mut steps as *mut Vec<Vec<u32>>).cast();
        assert_eq!(llada_generate(session, prompt.as_ptr(), params, Some(record), user_data, out.as_mut_ptr()), Status::Ok, "{}", last_error());
        let mut out = out.assume_init();
        let tokens = std::slice::from_raw_parts(out.tokens, out.n_tokens).to_vec();
        let counts = [out.forward_passes, out.rows_computed, out.drafts_confirmed, out.revisions];
        llada_output_free(&mut out);
        llada_session_free(session);
        llada_model_free(model);
        (tokens, counts, steps)
    }
}

/// What `llada-rt run --json` prints for `prompt` with `flags`.
fn cli_tokens(artifact: &Path, prompt: &str, flags: &[&str]) -> Outcome {
    let mut args = vec!["run", artifact.to_str().unwrap(), "-p", prompt, "--json"];
    args.extend_from_slice(flags);
    let out = common::run("llada-rt", &args);
    assert!(out.status.success(), "llada-rt {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let revisions = json["revisions"].as_array().map_or(0, |steps| steps.iter().map(|s| s.as_array().unwrap().len() as u64).sum());
    let count = |key: &str| json[key].as_u64().unwrap();
    let numbers = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect() };
    let steps = json["reveals"].as_array().unwrap().iter().map(|step| step.as_array().unwrap().iter().flat_map(|pair| numbers(pair)).collect()).collect();
    (numbers(&json["output_ids"]), [count("forward_passes"), count("rows_computed"), count("drafts_confirmed"), revisions], steps)
}

/// On the embedded model (confident answers) and on a random-weight checkpoint, whose
/// near-ties make drafts fail and revisions happen, so a setting lost on the way would show.
#[test]
fn every_setting_through_the_c_api_gives_the_clis_tokens_for_every_policy() {
    let dir = tempfile::tempdir().unwrap();
    let random = common::random_artifact(dir.path(), Shape::tiny(), 0.05, "random.lad", Some(256));
    let (mut drafts, mut revisions) = (0, 0);
    for artifact in [common::embedded(dir.path()), random] {
        let prompt = "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=";
        for case in cases() {
            let cli = cli_tokens(&artifact, prompt, case.flags);
            assert_eq!(cli.0.len(), case.params.gen_len as usize);
            assert_eq!(c_tokens(&artifact, prompt, &case.params, &case.session), cli, "{:?}", case.flags);
            drafts += cli.1[2];
            revisions += cli.1[3];
        }
    }
    assert!(drafts > 0 && revisions > 0, "the cases confirm drafts ({drafts}) and revise tokens ({revisions})");
}

#[test]
fn the_expert_settings_through_the_c_api_give_the_clis_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    common::checkpoint(&ckpt, Shape::tiny_moe(), WeightType::F32, u64::MAX, 0.08);
    let artifact = dir.path().join("moe.lad");
    common::compile_quant(&ckpt, &artifact, None, 128, None);
    let params = Params { gen_len: 32, block_len: 16, steps: 16, chat: false, ..llada_default_params() };
    for (flags, experts) in [(&["--experts", "lru", "--cpu-threads", "1"][..], Experts::Lru), (&["--experts", "static", "--cpu-threads", "2"][..], Experts::Static)] {
        let cpu_threads = flags[3].parse().unwrap();
        let settings = SessionSettings { n_threads: 2, experts: experts as u32, cpu_threads, ..llada_default_session_params() };
        let mut all = vec!["--gen-len", "32", "--block-len", "16", "--steps", "16", "--threads", "2"];
        all.extend_from_slice(flags);
        assert_eq!(c_tokens(&artifact, "hello there", &params, &settings), cli_tokens(&artifact, "hello there", &all), "{flags:?}");
    }
}

/// DiffusionGemma's settings (its kit's tiny random-weight model, where a setting lost on the
/// way changes the tokens): the checkpoint's defaults, every one set, and every one off.
#[test]
fn diffusion_gemma_settings_through_the_c_api_give_the_clis_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = dir.path().join("dg.lad");
    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/diffusiongemma-conformance/tiny-dg-A");
    common::compile(&kit, &artifact, Some(128));
    let base = Params { gen_len: 32, seed: 3, chat: false, ..llada_default_params() };
    let eos = [1u32, 9];
    let set = Params { t_min: 0.3, t_max: 0.9, entropy_bound: 0.5, stability_threshold: 2, confidence_threshold: 0.01, eos_ids: eos.as_ptr(), n_eos_ids: 2, rng: RandomStream::Torch as u32, ..base };
    let off = Params { t_min: -1.0, t_max: -1.0, stability_threshold: -2, confidence_threshold: -1.0, eos_ids: eos.as_ptr(), n_eos_ids: 0, ..base };
    let cases: [(&[&str], Params); 3] = [
        (&[], base),
        (&["--t-min", "0.3", "--t-max", "0.9", "--entropy-bound", "0.5", "--stability-threshold", "2", "--confidence-threshold", "0.01", "--eos-ids", "1,9", "--rng", "torch"], set),
        (&["--t-min", "none", "--t-max", "none", "--stability-threshold", "none", "--confidence-threshold", "none", "--eos-ids", "none"], off),
    ];
    let mut outcomes = Vec::new();
    for (flags, params) in cases {
        let mut all = vec!["--gen-len", "32", "--seed", "3"];
        all.extend_from_slice(flags);
        let cli = cli_tokens(&artifact, "hello there", &all);
        assert_eq!(c_tokens(&artifact, "hello there", &params, &llada_default_session_params()), cli, "{flags:?}");
        outcomes.push(cli.0);
    }
    assert!(outcomes[0] != outcomes[1] && outcomes[0] != outcomes[2], "the settings change the tokens: {outcomes:?}");
    // Set on a model that is not DiffusionGemma: refused by name.
    let embedded = common::embedded(dir.path());
    let path = CString::new(embedded.to_str().unwrap()).unwrap();
    let (mut model, mut session) = (std::ptr::null_mut(), std::ptr::null_mut());
    let bad = Params { t_min: 0.3, ..llada_default_params() };
    // SAFETY: valid strings, params and out pointers; the handles are freed below.
    unsafe {
        assert_eq!(llada_model_load(path.as_ptr(), &mut model), Status::Ok, "{}", last_error());
        assert_eq!(llada_session_open(model, &llada_default_session_params(), &mut session), Status::Ok, "{}", last_error());
        let mut out = std::mem::MaybeUninit::<Output>::uninit();
        let prompt = CString::new("hi").unwrap();
        assert_ne!(llada_generate(session, prompt.as_ptr(), &bad, None, std::ptr::null_mut(), out.as_mut_ptr()), Status::Ok);
        assert!(last_error().contains("t_min"), "{}", last_error());
        llada_session_free(session);
        llada_model_free(model);
    }
}
