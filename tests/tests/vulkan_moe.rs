//! Mixture-of-experts models on `--backend vulkan`: the dense ops on the device, the routers and
//! experts on the CPU between its command buffers (the host executor's code on the shared
//! window). LLaDA-MoE gives the host backend's tokens under every expert strategy, in a window
//! holding every expert and in one holding a quarter; LLaDA 2.x replays its kit.

mod common;

use std::path::Path;

use llada_rt::executor::{self, Backend};
use llada_rt::kernels::cpu;
use llada_rt::moe::ExpertStrategy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::{generate, Model, SamplerParams, Session};

fn session<'m>(model: &'m Model, backend: &'static Backend, strategy: ExpertStrategy) -> Session {
    Session::with_backend(model, backend, 2, cpu::features(), StagingMode::Async, ExpertOptions { strategy, cpu_threads: 1 }).unwrap()
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn llada_moe_on_vulkan_gives_the_host_tokens_under_every_expert_strategy() {
    let dir = tempfile::tempdir().unwrap();
    // The tiny LLaDA-MoE with every expert resident (full.lad) and through a quarter of them.
    let quarter = common::moe_quarter_window(dir.path(), None);
    let full = dir.path().join("full.lad");
    let p = SamplerParams { gen_length: 32, steps: 32, block_length: 32, ..Default::default() };
    let prompt = [1u32, 2, 3, 40, 41];
    let m = Model::open(&full, true).unwrap();
    let want = generate(&mut session(&m, &executor::host::BACKEND, ExpertStrategy::Hybrid), &prompt, &p, &mut |_| {}).unwrap();
    for art in [&full, &quarter] {
        let m = Model::open(art, true).unwrap();
        for strategy in [ExpertStrategy::Hybrid, ExpertStrategy::Lru, ExpertStrategy::Static] {
            let mut s = session(&m, &executor::vulkan::BACKEND, strategy);
            assert_eq!(s.backend().backend, "vulkan");
            let got = generate(&mut s, &prompt, &p, &mut |_| {}).unwrap();
            assert_eq!((&got.output_ids, &got.reveals), (&want.output_ids, &want.reveals), "{} {}", art.display(), strategy.name());
            assert!(s.expert_counters().unwrap().active > 0);
        }
    }
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn llada2_replays_its_kit_on_vulkan() {
    let kit = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/llada2-conformance/tiny-llada2");
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("kit.lad");
    common::compile_quant(&kit, &art, None, 128, None);
    let model = Model::open(&art, true).unwrap();
    let mut s = session(&model, &executor::vulkan::BACKEND, ExpertStrategy::Hybrid);
    // A spread of the cases (every one takes a minute on lavapipe: CI replays them all).
    let every = llada_rt_tools::conformance::Selection::new(9, 4).unwrap();
    let r = llada_rt_tools::conformance::run(&mut s, &kit.join("golden.json"), every, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.reveals_all_steps_matched), (34, 34, 34));
    assert!(r.edits_checked > 0 && r.edits_checked == r.edits_matched);
}

/// The trained tiny LLaDA 2.x on Vulkan: its passes over several blocks of the block-causal
/// mask (the attention shader limits each row to the end of its block) give the host's
/// tokens in as many passes, under the published schedule and under mbsd.
#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn llada2_block_causal_passes_and_mbsd_on_vulkan_give_the_host_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("trained.lad");
    common::compile_quant(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llada2-tiny-tasks"), &art, None, 192, None);
    let model = Model::open(&art, true).unwrap();
    let text = llada_rt::text::Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let ids = text.encode_chat("FILL:8760330202380988009055401800690570160003300000000008000000130502=").unwrap();
    let published = SamplerParams { gen_length: 64, block_length: 32, steps: 32, ..Default::default() };
    let mbsd = SamplerParams { policy: llada_rt::sampler::Policy::Mbsd, spec_blocks: 1, ..published };
    for p in [published, mbsd] {
        let got = generate(&mut session(&model, &executor::vulkan::BACKEND, ExpertStrategy::Hybrid), &ids, &p, &mut |_| {}).unwrap();
        let want = generate(&mut session(&model, &executor::host::BACKEND, ExpertStrategy::Hybrid), &ids, &p, &mut |_| {}).unwrap();
        assert_eq!((&got.output_ids, &got.reveals, got.forward_passes), (&want.output_ids, &want.reveals, want.forward_passes), "{:?}", p.policy);
        assert_eq!(text.decode(&got.output_ids, true), "8766333222388988889955441888699577166663333333333338888888133552");
    }
}
