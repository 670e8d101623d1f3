//! Revisions are events: under `mbsd` with dual-path revision every step reports its commits
//! and its revisions, the events replay to the final tokens, what a stream shows is only
//! what can no longer change, and the CLI's streamed text is exactly the final answer.

mod common;

use llada_rt::sampler::{Policy, Revision};
use llada_rt::text::Text;
use llada_rt::{generate, Model, SamplerParams, Session};

const PROMPTS: [&str; 3] = [
    "FILL:0022001000121700300003040240606040000020037096000250158001600037=",
    "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=",
    "FILL:3000705000000920000040015000608000070060300000004000000800900010=",
];

/// Hot sampling and a low revision bar make the side path's checks disagree: revisions happen.
fn revising() -> SamplerParams {
    SamplerParams {
        gen_length: 64,
        block_length: 16,
        steps: 64,
        policy: Policy::Mbsd,
        revision: Revision::DualPath,
        temperature: 1.5,
        seed: 2,
        revise_confidence: 0.0,
        stable_checks: 3,
        stable_confidence: 1.0,
        ..Default::default()
    }
}

/// `[position, token]` events applied to a masked generation.
fn replay(canvas: &mut [u32], events: &[[u32; 2]]) {
    for &[at, token] in events {
        canvas[at as usize] = token;
    }
}

#[test]
fn step_events_replay_to_the_final_tokens_and_settled_text_never_changes() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let mask = model.header.special.mask;
    let p = revising();
    let mut revisions = 0;
    for prompt in PROMPTS {
        let ids = text.encode_chat(prompt).unwrap();
        let mut canvas = vec![mask; p.gen_length];
        let mut settled_seen: Vec<Vec<u32>> = Vec::new();
        let mut mismatched_step = None;
        let g = generate(&mut Session::with_threads(&model, 2).unwrap(), &ids, &p, &mut |v| {
            replay(&mut canvas, v.committed);
            replay(&mut canvas, v.revised);
            if canvas != v.generated() && mismatched_step.is_none() {
                mismatched_step = Some(v.step);
            }
            settled_seen.push(v.generated()[..v.settled].to_vec());
        })
        .unwrap();
        assert_eq!(mismatched_step, None, "a step changed the canvas beyond its reported events");
        assert_eq!(canvas, g.output_ids);
        // The JSON form: every step's reveals, then its revisions.
        let logged = g.revisions.as_ref().expect("mbsd with revision reports revisions");
        assert_eq!(logged.len(), g.reveals.len());
        let mut again = vec![mask; p.gen_length];
        for (reveals, revised) in g.reveals.iter().zip(logged) {
            replay(&mut again, reveals);
            replay(&mut again, revised);
        }
        assert_eq!(again, g.output_ids);
        revisions += logged.iter().map(Vec::len).sum::<usize>();
        // What was settled at any step is where the final answer ends up.
        for s in &settled_seen {
            assert_eq!(s[..], g.output_ids[..s.len()], "a settled token changed later");
        }
        assert_eq!(settled_seen.last().map(Vec::len), Some(p.gen_length), "the last step settles everything");
    }
    assert!(revisions > 0, "no revision happened: the events went untested");
    // The official policies' output is unchanged: no revisions field at all.
    let ids = text.encode_chat(PROMPTS[0]).unwrap();
    let g = generate(&mut Session::with_threads(&model, 2).unwrap(), &ids, &SamplerParams { policy: Policy::Dual, ..revising() }, &mut |v| {
        assert!(v.revised.is_empty());
    })
    .unwrap();
    assert!(g.revisions.is_none());
    assert!(!serde_json::to_string(&g).unwrap().contains("revisions"));
}

#[test]
fn the_cli_streams_exactly_the_final_answer_under_revision() {
    let dir = tempfile::tempdir().unwrap();
    let art = common::embedded(dir.path());
    let art = art.to_str().unwrap();
    let mut replayed_revisions = 0;
    for prompt in PROMPTS {
        let args = [
            "run", art, "--chat", "-p", prompt, "--gen-len", "64", "--block-len", "16", "--steps", "64", "--policy", "mbsd", "--revision", "dual-path", "--temperature", "1.5", "--seed", "2",
            "--revise-confidence", "0", "--stable-checks", "3", "--stable-confidence", "1", "--threads", "2",
        ];
        let streamed = common::run("llada-rt", &args);
        assert!(streamed.status.success(), "{}", String::from_utf8_lossy(&streamed.stderr));
        let json = common::run("llada-rt", &[&args[..], &["--json"]].concat());
        assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        let stdout = String::from_utf8(streamed.stdout).unwrap();
        assert_eq!(stdout.strip_suffix('\n').unwrap(), v["text"].as_str().unwrap(), "the terminal shows something other than the answer");
        // The events of the JSON form replay to its output ids.
        let ids: Vec<u32> = serde_json::from_value(v["output_ids"].clone()).unwrap();
        let reveals: Vec<Vec<[u32; 2]>> = serde_json::from_value(v["reveals"].clone()).unwrap();
        let revisions: Vec<Vec<[u32; 2]>> = serde_json::from_value(v["revisions"].clone()).unwrap();
        let mut canvas = vec![u32::MAX; ids.len()];
        for (a, b) in reveals.iter().zip(&revisions) {
            replay(&mut canvas, a);
            replay(&mut canvas, b);
        }
        assert_eq!(canvas, ids);
        replayed_revisions += revisions.iter().map(Vec::len).sum::<usize>();
    }
    assert!(replayed_revisions > 0, "no revision happened: the stream went untested under revision");
}
