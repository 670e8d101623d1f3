//! LLaDA 2.x end to end: the project's kit (tests/data/llada2-conformance, made with the
//! published `modeling_llada2_moe.py` by tools/llada2/) replayed through the compiler and the
//! runtime; and every expert strategy, on a window that holds a quarter of the experts, giving
//! the resident plan's tokens (2.0's generate, 2.1's with token editing, and mbsd); mbsd's rows.

mod common;

use std::path::Path;

use llada_rt::kernels::cpu;
use llada_rt::moe::ExpertStrategy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::{generate, Model, SamplerParams, Session};

const KIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/llada2-conformance/tiny-llada2");

fn compile(out: &Path, window_bytes: Option<u64>) {
    common::compile_quant(Path::new(KIT), out, None, 128, window_bytes);
}

/// The kit's model compiled into `dir/kit.lad` (fully resident), opened.
fn kit_model(dir: &Path) -> Model {
    let art = dir.join("kit.lad");
    compile(&art, None);
    Model::open(&art, true).unwrap()
}

/// Every case of the kit: output ids, the reveals of every model call, the calls, 2.1's edits
/// of every model call, and the first call's logits within 1e-4.
#[test]
fn the_kit_replays_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = kit_model(dir.path());
    assert_eq!(model.header.model.architecture, "llada2-moe");
    let mut session = Session::new(&model).unwrap();
    let r = llada_rt_tools::conformance::run(&mut session, &Path::new(KIT).join("golden.json"), Default::default(), &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.reveals_all_steps_matched, r.forward_calls_matched), (306, 306, 306, 306));
    assert_eq!((r.edits_checked, r.edits_matched), (144, 144));
    assert_eq!(r.logit_cases_within_tolerance, 3);
}

/// A generation whose block grid outgrows the plan (max-seq 128) is refused with the numbers
/// and the fix, in the words LLaDA's refusal uses.
#[test]
fn a_grid_past_the_plan_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let model = kit_model(dir.path());
    let prompt: Vec<u32> = (0..100).map(|i| 7 + i % 50).collect();
    let e = generate(&mut Session::new(&model).unwrap(), &prompt, &published(), &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("192 positions,") && e.contains("at most 128") && e.contains("--max-seq 192"), "{e}");
}

/// The settled prefix a stream prints never reaches into the grid's padding past the
/// generation: at the end it is the output, under the published rule and mbsd alike.
#[test]
fn the_settled_prefix_stays_within_the_generation() {
    let dir = tempfile::tempdir().unwrap();
    let model = kit_model(dir.path());
    let mut session = Session::new(&model).unwrap();
    let prompt = [5, 9, 200, 31, 77];
    for policy in [llada_rt::sampler::Policy::Exact, llada_rt::sampler::Policy::Mbsd] {
        for gen_length in [1, 3, 20] {
            let p = SamplerParams { gen_length, block_length: 16, steps: 16, policy, eos_early_stop: false, ..Default::default() };
            let mut last = 0;
            let g = generate(&mut session, &prompt, &p, &mut |v| {
                assert!(v.settled <= gen_length, "{policy:?}, gen {gen_length}: {} settled", v.settled);
                last = v.settled;
            })
            .unwrap();
            assert_eq!(last, g.output_ids.len(), "{policy:?}, gen {gen_length}");
        }
    }
    // An EOS in the prompt, with the early stop (whose search starts at position 0), ends the
    // output inside the prompt: the settled prefix is empty there, not a slice that panics.
    let eos = model.header.special.eos.expect("the kit has an EOS");
    let p = SamplerParams { gen_length: 20, block_length: 16, steps: 16, eos_early_stop: true, ..Default::default() };
    let g = generate(&mut session, &[5, eos, 200, 31, 77], &p, &mut |v| assert!(v.settled <= 20)).unwrap();
    assert!(g.output_ids.len() <= 20);
}

/// A pass over several blocks, each block's rows attending up to its end, computes what a
/// pass per block computes: the store of a finished block folds into the next block's pass.
#[test]
fn a_pass_over_several_blocks_is_block_causal() {
    let dir = tempfile::tempdir().unwrap();
    let model = kit_model(dir.path());
    let mask = model.header.special.mask;
    let seq: Vec<u32> = (0..24u32).map(|i| if i % 5 == 3 || i > 19 { mask } else { 7 + 13 * i }).collect();
    let logit_rows: Vec<u32> = (16..24).collect();
    let logits = |from: usize| {
        let mut s = Session::new(&model).unwrap();
        s.store_blocks(&seq[..from], 0, 8).unwrap();
        s.forward_blocks(&seq, from, 8, &logit_rows).unwrap().to_vec()
    };
    // A pass per block, then the last two blocks in one, then all three.
    let one = logits(16);
    for folded in [logits(8), logits(0)] {
        let err = one.iter().zip(&folded).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(err < 1e-5, "{err}");
    }
    // The same blocks without the mask: the first blocks' rows seeing the last block change
    // the last block's logits (what the mask keeps out is there to keep out).
    let mut s = Session::new(&model).unwrap();
    let unmasked = s.forward_full(&seq, &logit_rows).unwrap().to_vec();
    assert!(one.iter().zip(&unmasked).any(|(a, b)| (a - b).abs() > 1e-3));
}

/// `--policy mbsd` on LLaDA 2.x: its first call is the exact one (every row of the block is
/// fresh), later calls compute fewer rows than the exact policy's whole blocks, and drafts of
/// the next block ride in the passes expected to empty the current one.
#[test]
fn mbsd_computes_fewer_rows_than_the_published_schedule() {
    let dir = tempfile::tempdir().unwrap();
    let model = kit_model(dir.path());
    let prompt = [5u32, 9, 200, 31, 77, 8, 8, 8, 8, 8];
    let exact = SamplerParams { gen_length: 60, block_length: 16, steps: 16, threshold: Some(0.2), ..Default::default() };
    let want = generate(&mut Session::new(&model).unwrap(), &prompt, &exact, &mut |_| {}).unwrap();
    for spec_blocks in [0, 1] {
        let mbsd = SamplerParams { policy: llada_rt::sampler::Policy::Mbsd, spec_blocks, spec_threshold: 0.0, ..exact };
        let got = generate(&mut Session::new(&model).unwrap(), &prompt, &mbsd, &mut |_| {}).unwrap();
        assert_eq!(got.reveals[0], want.reveals[0], "the first call sees what the exact one sees");
        let r = got.mbsd.unwrap();
        assert_eq!(r.dense_passes, got.forward_passes);
        assert_eq!(r.dense_rows(), got.rows_computed);
        assert!(got.rows_computed < want.rows_computed, "{} rows against {}", got.rows_computed, want.rows_computed);
        // Drafted only with a block to draft; each draft pass's rows are the next block's.
        assert_eq!(r.rows_speculative > 0, spec_blocks == 1, "{r:?}");
        assert_eq!(r.rows_speculative % 16, 0);
        // Every position of the generation is committed once.
        let mut committed: Vec<u32> = got.reveals.iter().flatten().map(|r| r[0]).collect();
        committed.sort_unstable();
        committed.dedup();
        assert_eq!(committed.len(), got.reveals.iter().flatten().count());
    }
}

/// The kit's model compiled with its expert pools holding a quarter of each layer's experts:
/// hybrid, lru and static generate the resident plan's tokens, staging as they should, under
/// 2.0's generate, 2.1's and mbsd.
#[test]
fn every_expert_strategy_in_a_quarter_window_gives_the_resident_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("full.lad");
    compile(&full, None);
    let m = Model::open(&full, false).unwrap();
    let x = &m.header.plan.window.experts;
    assert_eq!((x.slots_per_layer, x.per_layer, m.header.model.moe_layers()), (16, 16, 2));
    let quarter = dir.path().join("quarter.lad");
    compile(&quarter, Some(x.region.offset + x.region.bytes / 4));
    let q = Model::open(&quarter, true).unwrap();
    assert_eq!(q.header.plan.window.experts.slots_per_layer, 4);
    let v20 = SamplerParams { gen_length: 40, block_length: 16, steps: 16, threshold: Some(0.5), eos_early_stop: false, ..Default::default() };
    // 2.1's generate, editing.
    let v21 = SamplerParams { editing_threshold: Some(0.5), ..v20 };
    let mbsd = SamplerParams { policy: llada_rt::sampler::Policy::Mbsd, spec_threshold: 0.0, ..v20 };
    let prompt = [5u32, 9, 200, 31, 77];
    for p in [v20, v21, mbsd] {
        let want = generate(&mut Session::new(&m).unwrap(), &prompt, &p, &mut |_| {}).unwrap();
        // 2.1's run edits something, so its revisions are compared too.
        assert_eq!(want.revisions.as_ref().is_some_and(|r| r.iter().any(|call| !call.is_empty())), p.editing_threshold.is_some());
        for strategy in [ExpertStrategy::Hybrid, ExpertStrategy::Lru, ExpertStrategy::Static] {
            let mut s = Session::with_experts(&q, 2, cpu::features(), StagingMode::Async, ExpertOptions { strategy, cpu_threads: 1 }).unwrap();
            let got = generate(&mut s, &prompt, &p, &mut |_| {}).unwrap();
            assert_eq!((&got.output_ids, &got.reveals, &got.revisions), (&want.output_ids, &want.reveals, &want.revisions), "{}", strategy.name());
            let c = s.expert_counters().unwrap();
            match strategy {
                ExpertStrategy::Lru => assert!(c.cpu_experts == 0 && c.staged_experts > 0, "{c:?}"),
                ExpertStrategy::Static => assert!(c.accelerator_experts == 0 && c.staged_bytes == 0, "{c:?}"),
                ExpertStrategy::Hybrid => assert!(c.accelerator_experts > 0 && c.cpu_experts > 0, "{c:?}"),
            }
        }
    }
}

/// Runs `settings` on the first 20 held-out tasks with the trained model in `models/NAME`.
fn eval_trained(name: &str, settings: &[SamplerParams]) -> Vec<llada_rt_tools::eval::EvalReport> {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lad = dir.path().join("trained.lad");
    common::compile(&root.join("models").join(name), &lad, None);
    let model = Model::open(&lad, true).unwrap();
    let text = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let mut tasks = llada_rt_tools::eval::load_tasks(&root.join("models/tasks/heldout.jsonl"), &text, &model).unwrap();
    tasks.truncate(20);
    let mut session = Session::new(&model).unwrap();
    settings.iter().map(|p| llada_rt_tools::eval::run(&mut session, &text, &tasks, p, None, &mut |_, _| {}).unwrap()).collect()
}

/// LLaDA 2.x's published schedule on the task set: gen 64 in blocks of 32, 32 steps a block.
fn published() -> SamplerParams {
    SamplerParams { gen_length: 64, block_length: 32, steps: 32, ..Default::default() }
}

/// The trained tiny LLaDA 2.x (`models/llada2-tiny-tasks`) on the first 20 held-out tasks:
/// its published schedule answers every one; under the schedule alone (threshold 1, 8 steps a
/// block) mbsd's drafts take fewer calls and rows and still answer them (the 200-task
/// comparison is in BENCHMARKS.md).
#[test]
fn the_trained_tiny_llada2_answers_its_tasks_and_mbsd_saves_calls() {
    let schedule = SamplerParams { steps: 8, threshold: Some(1.0), ..published() };
    let mbsd = SamplerParams { policy: llada_rt::sampler::Policy::Mbsd, spec_blocks: 1, ..schedule };
    let [p, e, m] = <[_; 3]>::try_from(eval_trained("llada2-tiny-tasks", &[published(), schedule, mbsd])).unwrap();
    assert_eq!(p.correct, 20);
    let r = m.mbsd.unwrap();
    assert!(m.correct >= 18 && r.drafts_accepted > 0, "{} correct, {r:?}", m.correct);
    assert!(m.forward_passes * 3 / 2 < e.forward_passes && m.rows_computed < e.rows_computed, "{} passes, {} rows against {}, {}", m.forward_passes, m.rows_computed, e.forward_passes, e.rows_computed);
}

/// The tiny LLaDA 2.x trained with 2.1's editing objective (`models/llada2.1-tiny-tasks`) on
/// the first 20 held-out tasks: 2.1's generate (token editing at its default 0.9) answers
/// them as well as 2.0's.
#[test]
fn the_editing_trained_tiny_llada2_answers_its_tasks_with_token_editing() {
    let editing = SamplerParams { editing_threshold: Some(0.9), ..published() };
    let [v20, v21] = <[_; 2]>::try_from(eval_trained("llada2.1-tiny-tasks", &[published(), editing])).unwrap();
    assert!(v20.correct >= 18 && v21.correct >= v20.correct, "2.0 {} / 2.1 {} of 20", v20.correct, v21.correct);
    // 2.1's loop verifies each block by a call after its last mask at least.
    assert!(v21.forward_passes > v20.forward_passes, "{} against {}", v21.forward_passes, v20.forward_passes);
}
