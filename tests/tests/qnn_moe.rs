//! Mixture-of-experts models on the NPU (QNN's x86-64 simulator, through `LLADA_QNN_LIB`):
//! the dense layers, router projections and shared experts as executables, cut at every MoE
//! layer, the routers and routed experts on the host between them (`llada_ir::npu::pieces`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use llada_rt::executor::{self, Backend};
use llada_rt::kernels::cpu;
use llada_rt::moe::ExpertStrategy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::text::Text;
use llada_rt::{generate, Model, SamplerParams, Session};
use llada_tools::checkpoint::{Shape, WeightType};

fn lib() -> String {
    std::env::var("LLADA_QNN_LIB").expect("set LLADA_QNN_LIB to tools/qnn/fetch.sh's folder")
}

/// `model` compiled for SM8650 by the `lladac` command, with `extra` flags.
fn lladac(model: &Path, out: &Path, extra: &[&str]) {
    let mut args = vec!["compile", "--model", model.to_str().unwrap(), "--target", "sm8650", "-o", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let o = Command::new(common::bin("lladac")).args(&args).env("LLADA_QNN_LIB", lib()).output().unwrap();
    assert!(o.status.success(), "lladac compile {} {extra:?}: {}", model.display(), String::from_utf8_lossy(&o.stderr));
}

fn session<'m>(model: &'m Model, backend: &'static Backend, strategy: ExpertStrategy) -> Session {
    Session::with_backend(model, backend, 2, cpu::features(), StagingMode::Async, ExpertOptions { strategy, cpu_threads: 1 }).unwrap()
}

fn sets(steps: &[Vec<[u32; 2]>]) -> Vec<std::collections::BTreeSet<[u32; 2]>> {
    steps.iter().map(|s| s.iter().copied().collect()).collect()
}

fn trained(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../models").join(name)
}

/// The trained LLaDA 2.0 and 2.1 answer held-out tasks on the NPU as on the host (2.1 with
/// its token editing, 2.0 under mbsd too), in as many passes, and a block pass's logits agree
/// to fp16 precision.
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn the_trained_llada2_models_answer_on_the_npu_as_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    for (name, editing) in [("llada2-tiny-tasks", None), ("llada2.1-tiny-tasks", Some(0.9))] {
        let art = dir.path().join(format!("{name}.lad"));
        lladac(&trained(name), &art, &["--max-seq", "192"]);
        let model = Model::open(&art, true).unwrap();
        let section = llada_ir::npu::NpuSection::of(&model.header).unwrap().unwrap();
        // Three MoE layers (the first is dense): four executables per planned graph.
        assert!(section.contexts[0].graphs.iter().all(|g| section.contexts[0].graphs.iter().filter(|h| h.graph == g.graph).count() == 4));
        let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
        let mut tasks = llada_rt_tools::eval::load_tasks(&trained("tasks/heldout.jsonl"), &text, &model).unwrap();
        tasks.truncate(4);
        // The published schedule: 64 tokens in blocks of 32, 32 steps a block.
        let p = SamplerParams { gen_length: 64, block_length: 32, steps: 32, editing_threshold: editing, ..Default::default() };
        let mut npu = session(&model, &executor::qnn::BACKEND, ExpertStrategy::Hybrid);
        assert_eq!(npu.backend().backend, "qnn");
        let mut host = session(&model, &executor::host::BACKEND, ExpertStrategy::Hybrid);
        let mut correct = 0;
        for (ids, expected) in &tasks {
            let got = generate(&mut npu, ids, &p, &mut |_| {}).unwrap();
            let want = generate(&mut host, ids, &p, &mut |_| {}).unwrap();
            // The same tokens, committed and edited at the same calls (within a call, fp16 may
            // order equal sets differently).
            assert_eq!((&got.output_ids, sets(&got.reveals), got.revisions.as_deref().map(sets)), (&want.output_ids, sets(&want.reveals), want.revisions.as_deref().map(sets)), "{name}: {expected}");
            // Block-causal passes over several blocks (the finished block stored by the next
            // block's first call): as many passes as model calls, as on the host.
            assert_eq!(got.forward_passes, want.forward_passes, "{name}");
            correct += (&text.decode(&got.output_ids, true) == expected) as usize;
            if editing.is_none() {
                // mbsd: the stale and masked rows only, the next block drafted in the pass
                // expected to empty this one.
                let p = SamplerParams { policy: llada_rt::sampler::Policy::Mbsd, spec_blocks: 1, ..p };
                let got = generate(&mut npu, ids, &p, &mut |_| {}).unwrap();
                let want = generate(&mut host, ids, &p, &mut |_| {}).unwrap();
                assert_eq!((&got.output_ids, sets(&got.reveals)), (&want.output_ids, sets(&want.reveals)), "{name} mbsd: {expected}");
            }
        }
        assert!(correct >= 3, "{name}: {correct} of 4 answered");
        assert!(npu.expert_counters().unwrap().active > 0, "the host ran the routed experts");
        // One block's pass after the prompt's blocks are stored.
        let seq: Vec<u32> = (0..64u32).map(|i| if i < 40 { (i * 7) % 300 } else { model.header.special.mask }).collect();
        let rows: Vec<u32> = (32..64).collect();
        let logits = |backend| {
            let mut s = session(&model, backend, ExpertStrategy::Hybrid);
            s.store_blocks(&seq[..32], 0, 32).unwrap();
            s.forward_blocks(&seq, 32, 32, &rows).unwrap().to_vec()
        };
        let err = common::relative_error(&logits(&executor::qnn::BACKEND), &logits(&executor::host::BACKEND));
        eprintln!("{name}: a block pass's logits, NPU against host: {err:.2e} relative");
        assert!(err < 2e-2, "{name}: relative error {err}");
    }
}

/// LLaDA-MoE (softmax router, QK-norm, no shared expert): a pass's logits agree with the
/// host's to fp16 precision, and every expert strategy gives the same tokens, in a window
/// holding every expert and in one holding a quarter beside the executables (the executables
/// are the same; only where the host's experts come from differs).
#[test]
#[ignore = "needs LLADA_QNN_LIB: tools/qnn/fetch.sh (CI runs it)"]
fn llada_moe_runs_its_dense_part_on_the_npu_under_every_expert_strategy() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    common::checkpoint(&ckpt, Shape::tiny_moe(), WeightType::F32, u64::MAX, 0.08);
    let art = dir.path().join("moe.lad");
    lladac(&ckpt, &art, &["--max-seq", "64"]);
    let m = Model::open(&art, true).unwrap();
    let section = llada_ir::npu::NpuSection::of(&m.header).unwrap().unwrap();
    // A window with room for the executables, the I/O and a quarter of the experts: the
    // expert slots leave the executables their room.
    let x = &m.header.plan.window.experts;
    assert_eq!(x.slots_per_layer, x.per_layer);
    let need = lladac::npu_plan::executables_room(&m.header, section.weights, false, None).unwrap().all;
    let quarter_pool = x.region.bytes / 4;
    let window = (section.io.bytes + need + quarter_pool).max(x.region.offset + quarter_pool);
    let quarter = dir.path().join("quarter.lad");
    lladac(&ckpt, &quarter, &["--max-seq", "64", "--window-bytes", &window.to_string()]);
    let q = Model::open(&quarter, true).unwrap();
    assert_eq!(q.header.plan.window.experts.slots_per_layer * 4, x.per_layer, "a quarter of the experts");
    let qs = llada_ir::npu::NpuSection::of(&q.header).unwrap().unwrap();
    assert!(qs.contexts.iter().all(|c| c.resident), "every executable stays beside the slots");
    // Too small for the executables and one slot: one clear error.
    let small = dir.path().join("small.lad");
    let o = Command::new(common::bin("lladac"))
        .args(["compile", "--model", ckpt.to_str().unwrap(), "--target", "sm8650", "--max-seq", "64", "--window-bytes", &(section.io.bytes + need).to_string(), "-o", small.to_str().unwrap()])
        .env("LLADA_QNN_LIB", lib())
        .output()
        .unwrap();
    common::assert_clean_failure(&o, &["--target sm8650", "no room for an expert slot", "--window-bytes"]);
    assert!(!small.exists());
    let moe_layers = m.header.model.moe_layers() as usize;
    assert_eq!(section.contexts.iter().map(|c| c.graphs.len()).sum::<usize>(), m.header.graphs.len() * (moe_layers + 1), "an executable before each MoE layer's host ops, one after the last");

    // The verifier: an executable that skips a dense op, or swallows a host op, is refused,
    // naming it.
    let good = std::fs::read(&art).unwrap();
    for (edit, words) in [(1u32, "do not continue graph"), (2, "op MoeExperts inside an NPU executable")] {
        let bytes = common::reseal(&good, |h| {
            let mut s = llada_ir::npu::NpuSection::of(h).unwrap().unwrap();
            let g = &mut s.contexts[0].graphs[1];
            match edit {
                1 => g.ops[0] += 1,
                _ => g.ops[0] -= 1,
            }
            h.extensions.iter_mut().find(|e| e.key == llada_ir::npu::EXTENSION_KEY).unwrap().bytes = s.encode();
        });
        let bad = dir.path().join(format!("bad{edit}.lad"));
        std::fs::write(&bad, bytes).unwrap();
        common::assert_clean_failure(&common::run("lladac", &["inspect", bad.to_str().unwrap()]), &["contexts[0].graphs[1]", words]);
    }

    let seq: Vec<u32> = (0..40u32).map(|i| if i < 24 { (i * 7) % 300 } else { m.header.special.mask }).collect();
    let logit_rows: Vec<u32> = (0..seq.len() as u32).collect();
    let host = session(&m, &executor::host::BACKEND, ExpertStrategy::Hybrid).forward_full(&seq, &logit_rows).unwrap().to_vec();
    let npu = session(&m, &executor::qnn::BACKEND, ExpertStrategy::Hybrid).forward_full(&seq, &logit_rows).unwrap().to_vec();
    let err = common::relative_error(&npu, &host);
    eprintln!("LLaDA-MoE first-pass logits, NPU against host: {err:.2e} relative");
    assert!(err < 2e-2, "relative error {err}");

    let p = SamplerParams { gen_length: 32, steps: 32, block_length: 32, ..Default::default() };
    let prompt = [1u32, 2, 3, 40, 41];
    let want = generate(&mut session(&m, &executor::qnn::BACKEND, ExpertStrategy::Hybrid), &prompt, &p, &mut |_| {}).unwrap();
    for (model, strategy) in [(&m, ExpertStrategy::Lru), (&m, ExpertStrategy::Static), (&q, ExpertStrategy::Hybrid), (&q, ExpertStrategy::Lru), (&q, ExpertStrategy::Static)] {
        let mut s = session(model, &executor::qnn::BACKEND, strategy);
        let got = generate(&mut s, &prompt, &p, &mut |_| {}).unwrap();
        assert_eq!((&got.output_ids, &got.reveals), (&want.output_ids, &want.reveals), "{} {}", model.path.display(), strategy.name());
        let c = s.expert_counters().unwrap();
        assert!(c.active > 0);
        if std::ptr::eq(model, &q) {
            eprintln!("quarter window, {}: {} experts staged, {} of {} ready", strategy.name(), c.staged_experts, c.hits, c.active);
            // `static` computes every expert on the CPU path from the artifact, staging none.
            let staged = if strategy == ExpertStrategy::Static { c.cpu_experts == c.active } else { c.staged_experts > 0 && c.hits < c.active };
            assert!(staged, "{}: {c:?}", strategy.name());
        }
    }
}
