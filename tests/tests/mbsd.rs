//! Multi-block speculative decoding and dual-path revision on the embedded model: `mbsd`
//! without speculation or revision, on buckets as large as the block, is `dual` token for
//! token; with revision its outputs do not depend on the run or the thread count (the side
//! path merges at fixed points); rows that do not store their keys and values leave the
//! cache as it was.

mod common;

use llada_rt::sampler::{Policy, Revision};
use llada_rt::session::RowSet;
use llada_rt::text::Text;
use llada_rt::{generate, Generation, Model, Remasking, SamplerParams, Session};

fn prompts(model: &Model) -> Vec<Vec<u32>> {
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    [
        "FILL:0022001000121700300003040240606040000020037096000250158001600037=",
        "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=",
        "FILL:3000705000000920000040015000608000070060300000004000000800900010=",
    ]
    .iter()
    .map(|p| text.encode_chat(p).unwrap())
    .collect()
}

fn decode(model: &Model, threads: usize, prompt: &[u32], p: &SamplerParams) -> Generation {
    generate(&mut Session::with_threads(model, threads).unwrap(), prompt, p, &mut |_| {}).unwrap()
}

#[test]
fn mbsd_without_speculation_or_revision_on_whole_block_rows_is_dual() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let base = SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() };
    let settings = [
        base.clone(),
        SamplerParams { steps: 20, ..base.clone() },
        SamplerParams { block_length: 16, steps: 32, temperature: 0.8, seed: 4, ..base.clone() },
        SamplerParams { remasking: Remasking::Random, seed: 3, ..base.clone() },
        SamplerParams { threshold: Some(0.9), ..base },
    ];
    for prompt in prompts(&model) {
        for s in &settings {
            let dual = decode(&model, 2, &prompt, &SamplerParams { policy: Policy::Dual, ..s.clone() });
            let mbsd = SamplerParams { policy: Policy::Mbsd, spec_blocks: 0, revision: Revision::Off, rows: Some(s.block_length), ..s.clone() };
            let m = decode(&model, 2, &prompt, &mbsd);
            assert_eq!(m.output_ids, dual.output_ids, "{s:?}");
            assert_eq!(m.reveals, dual.reveals, "{s:?}");
            assert_eq!((m.forward_passes, m.rows_computed), (dual.forward_passes, dual.rows_computed), "{s:?}");
        }
    }
}

#[test]
fn mbsd_with_revision_is_the_same_across_runs_and_thread_counts() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let settings = [
        SamplerParams { gen_length: 64, block_length: 32, steps: 64, policy: Policy::Mbsd, revision: Revision::DualPath, ..Default::default() },
        // Hot sampling and low thresholds make checks disagree, so revisions happen.
        SamplerParams { gen_length: 64, block_length: 16, steps: 64, policy: Policy::Mbsd, revision: Revision::DualPath, temperature: 1.5, seed: 2, revise_confidence: 0.0, stable_checks: 3, stable_confidence: 1.0, ..Default::default() },
    ];
    let mut revised = 0;
    for prompt in prompts(&model) {
        for s in &settings {
            let first = decode(&model, 2, &prompt, s);
            let report = |g: &Generation| {
                let mut m = g.mbsd.expect("an mbsd report");
                (m.side.stall_seconds, m.side.side_seconds) = (0.0, 0.0);
                m
            };
            let m = report(&first);
            assert!(m.side.side_passes > 0 && m.side.checks > 0, "{m:?}");
            revised += m.side.revisions;
            for threads in [1, 2] {
                let again = decode(&model, threads, &prompt, s);
                assert_eq!(again.output_ids, first.output_ids, "{threads} threads, {s:?}");
                assert_eq!(again.reveals, first.reveals);
                assert_eq!(report(&again), m);
            }
        }
    }
    assert!(revised > 0, "no setting revised anything: the revision path went untested");
}

#[test]
fn the_side_path_is_the_sessions_kept_across_generations_with_unchanged_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let s = SamplerParams { gen_length: 64, block_length: 16, steps: 64, policy: Policy::Mbsd, revision: Revision::DualPath, temperature: 1.5, seed: 2, revise_confidence: 0.0, stable_checks: 3, ..Default::default() };
    let prompts = prompts(&model);
    let fresh: Vec<Generation> = prompts.iter().map(|p| decode(&model, 2, p, &s)).collect();
    let mut session = Session::with_threads(&model, 2).unwrap();
    // A generation stopped after three steps leaves its side job running: the next one waits
    // for it and starts clean.
    let mut g = llada_rt::Generator::start(&mut session, &prompts[1], &s).unwrap();
    for _ in 0..3 {
        g.step().unwrap();
    }
    drop(g);
    for (prompt, want) in prompts.iter().zip(&fresh) {
        let got = generate(&mut session, prompt, &s, &mut |_| {}).unwrap();
        assert_eq!((&got.output_ids, &got.reveals, &got.revisions), (&want.output_ids, &want.reveals, &want.revisions));
        let (a, b) = (got.mbsd.unwrap().side, want.mbsd.unwrap().side);
        assert_eq!((a.side_passes, a.checks, a.revisions, a.stabilised), (b.side_passes, b.checks, b.revisions, b.stabilised), "the report starts at zero");
        // One side path for the session, kept from the first generation on.
        assert_eq!(session.counters.side_path_starts, 1);
    }
    // Another side-row count needs another side path.
    generate(&mut session, &prompts[0], &SamplerParams { side_rows: Some(2), ..s }, &mut |_| {}).unwrap();
    assert_eq!(session.counters.side_path_starts, 2);
}

#[test]
fn rows_that_do_not_store_leave_the_cache_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let model = Model::open(&common::embedded(dir.path()), true).unwrap();
    let prompt = &prompts(&model)[0];
    let mask = model.header.special.mask;
    let seq: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, 64)).collect();
    let block: Vec<u32> = (prompt.len() as u32..prompt.len() as u32 + 32).collect();
    let span = prompt.len()..prompt.len() + 32;
    let mut plain = Session::new(&model).unwrap();
    plain.forward_full(&seq, &block).unwrap();
    let want = plain.forward_span(&seq, span.clone(), &block).unwrap().to_vec();
    let mut s = Session::new(&model).unwrap();
    s.forward_full(&seq, &block).unwrap();
    // Unstored rows with other tokens at positions of the block and after it.
    let mut rows = RowSet::default();
    for q in [span.start, span.start + 5, span.end + 3] {
        rows.push(q, 7, false);
    }
    let logits = s.forward_rows(seq.len(), &rows, 16, &[0, 1, 2]).unwrap().to_vec();
    assert_eq!(logits.len(), 3 * model.header.model.embedding_size as usize);
    let got = s.forward_span(&seq, span, &block).unwrap().to_vec();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "an unstored row changed the cache");
    // Bad requests are named.
    let err = s.forward_rows(seq.len() + 1, &rows, 16, &[0]).unwrap_err().to_string();
    assert!(err.contains("KV cache"), "{err}");
    let mut twice = RowSet::default();
    twice.push(prompt.len(), mask, true);
    twice.push(prompt.len(), mask, true);
    let err = s.forward_rows(seq.len(), &twice, 16, &[0]).unwrap_err().to_string();
    assert!(err.contains("two rows of one pass store position"), "{err}");
}

/// On the host, which pays for every row it computes, `mbsd` without `--rows` computes no
/// padding and no bucket fill: a row-set pass has the block's masked rows and its stale ones
/// (each committed token once), and drafts come only from the pass that empties a block, while
/// they pay. Random weights never predict with the confidence an accepted draft needs, so
/// they make no draft; on the trained embedded model drafts pay and save passes.
#[test]
fn mbsd_on_the_host_computes_the_rows_a_step_needs() {
    let dir = tempfile::tempdir().unwrap();
    let p = SamplerParams { gen_length: 64, block_length: 16, steps: 64, policy: Policy::Mbsd, spec_blocks: 1, revision: Revision::Off, ..Default::default() };
    let rows_of = |g: &Generation| {
        let m = g.mbsd.unwrap();
        assert_eq!(m.rows_padding, 0);
        assert_eq!(g.rows_computed, m.dense_rows());
        m
    };

    let ckpt = dir.path().join("random");
    common::checkpoint(&ckpt, llada_tools::checkpoint::Shape::tiny(), llada_tools::checkpoint::WeightType::F32, u64::MAX, 0.05);
    let lad = dir.path().join("random.lad");
    common::compile(&ckpt, &lad, None);
    let random = Model::open(&lad, true).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| 3 + 7 * i).collect();
    let g = decode(&random, 2, &prompt, &p);
    let m = rows_of(&g);
    assert_eq!((m.drafts_accepted, m.drafts_dropped, m.rows_speculative), (0, 0, 0), "{m:?}");
    // Per block, a whole-sequence pass (all 76 positions, 16 of them masked) and one row per
    // masked position in each later step; besides, each committed token's refresh at most once.
    assert_eq!(m.rows_masked, 4 * (16 + (1..=15).sum::<u64>()), "{m:?}");
    assert!(m.rows_refresh <= 4 * (76 - 16) + 64, "{m:?}");

    let embedded = Model::open(&common::embedded(dir.path()), true).unwrap();
    for prompt in prompts(&embedded) {
        let dual = decode(&embedded, 2, &prompt, &SamplerParams { policy: Policy::Dual, ..p.clone() });
        let g = decode(&embedded, 2, &prompt, &p);
        let m = rows_of(&g);
        assert!(m.drafts_accepted > 0 && g.forward_passes < dual.forward_passes && g.rows_computed < dual.rows_computed, "{m:?}");
    }
}
