//! The stepping interface: every policy driven one step at a time through `Generator` gives
//! the tokens, reveals and revisions `generate` gives, and each step's view shows exactly
//! that step's records.

mod common;

use llada_rt::sampler::{Policy, Revision};
use llada_rt::text::Text;
use llada_rt::{generate, Generator, Model, SamplerParams, Session};

fn every_policy() -> Vec<SamplerParams> {
    let base = SamplerParams { gen_length: 64, block_length: 16, steps: 32, ..Default::default() };
    vec![
        SamplerParams { policy: Policy::Exact, ..base },
        SamplerParams { policy: Policy::Exact, cfg_scale: 0.5, temperature: 0.7, seed: 3, ..base },
        SamplerParams { policy: Policy::Prefix, refresh_every: 2, ..base },
        SamplerParams { policy: Policy::Dual, threshold: Some(0.9), ..base },
        SamplerParams { policy: Policy::Spec, spec_blocks: 2, ..base },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 2, ..base },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, revision: Revision::Off, ..base },
    ]
}

#[test]
fn every_policy_stepped_from_outside_matches_generate() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let prompt = text.encode_chat("SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=").unwrap();
    let mut session = Session::with_threads(&model, 2).unwrap();
    for p in every_policy() {
        let want = generate(&mut session, &prompt, &p, &mut |_| {}).unwrap();
        let mut generator = Generator::start(&mut session, &prompt, &p).unwrap();
        let (mut reveals, mut revisions) = (Vec::new(), Vec::new());
        while let Some(view) = generator.step().unwrap() {
            assert_eq!(view.step, reveals.len() + 1, "{p:?}");
            reveals.push(view.committed.to_vec());
            revisions.push(view.revised.to_vec());
        }
        assert!(generator.step().unwrap().is_none(), "a finished generation stays finished");
        let got = generator.finish();
        assert_eq!(got.output_ids, want.output_ids, "{p:?}");
        assert_eq!(got.reveals, want.reveals, "{p:?}");
        assert_eq!(reveals, want.reveals, "the views' commits, {p:?}");
        assert_eq!(got.revisions, want.revisions, "{p:?}");
        if let Some(want) = &want.revisions {
            assert_eq!(&revisions, want, "the views' revisions, {p:?}");
        } else {
            assert!(revisions.iter().all(Vec::is_empty), "{p:?}");
        }
        assert_eq!((got.forward_passes, got.rows_computed, got.drafts_confirmed), (want.forward_passes, want.rows_computed, want.drafts_confirmed), "{p:?}");
        assert_eq!(got.mbsd.map(|m| (m.dense_passes, m.dense_rows(), m.side.checks)), want.mbsd.map(|m| (m.dense_passes, m.dense_rows(), m.side.checks)), "{p:?}");
        // Mid-way: a generation dropped part-way leaves the session as good as new.
        let mut part = Generator::start(&mut session, &prompt, &p).unwrap();
        part.step().unwrap();
        drop(part);
        assert_eq!(generate(&mut session, &prompt, &p, &mut |_| {}).unwrap().output_ids, want.output_ids, "{p:?}");
        // A generation's side-path threads end with it, finished or dropped part-way.
        assert_eq!(common::threads_after_join("llada-side"), Vec::<String>::new(), "{p:?}");
    }
}


/// `run --op-profile`'s source: with op profiling on, every pass of a generation is timed op
/// by op, and the sums account for every pass, every matmul and no more time than the passes
/// took; with it off, nothing is kept.
#[test]
fn an_op_profile_covers_every_pass_of_a_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let prompt = [5u32, 9, 11, 3];
    let mut session = Session::with_threads(&model, 2).unwrap();
    let p = SamplerParams { gen_length: 32, block_length: 16, steps: 16, policy: Policy::Mbsd, revision: Revision::Off, ..Default::default() };
    session.profile_ops(true);
    let before = session.counters.forward_seconds;
    let g = generate(&mut session, &prompt, &p, &mut |_| {}).unwrap();
    let passes = session.take_op_profiles();
    assert_eq!(passes.len() as u64, g.forward_passes);
    let split = llada_rt_tools::profile::split(&model, &passes);
    let matmuls_per_pass = model.graph(passes[0].graph).ops.iter().filter(|o| o.name() == "MatMul").count() as u64;
    assert_eq!(split.matmuls.iter().map(|m| m.calls).sum::<u64>(), matmuls_per_pass * g.forward_passes);
    assert_eq!(split.ops.iter().find(|t| t.op == "MatMul").map(|t| t.calls), Some(matmuls_per_pass * g.forward_passes));
    assert!(split.seconds > 0.0 && split.seconds <= session.counters.forward_seconds - before, "{split:?}");
    assert!(split.matmuls.iter().all(|m| m.gop > 0.0 && m.seconds > 0.0));
    session.profile_ops(false);
    generate(&mut session, &prompt, &p, &mut |_| {}).unwrap();
    assert!(session.take_op_profiles().is_empty());
}
