//! LLaDA-MoE end to end: random-weight checkpoints in LLaDA-MoE's Hugging Face layout, through
//! the compiler, against an independent forward pass in burn; and every expert strategy
//! generating the same bits on a window that holds a quarter of the experts.

mod common;

use std::path::Path;

use llada_rt::kernels::cpu;
use llada_rt::moe::ExpertStrategy;
use llada_rt::sampler::Policy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::{generate, Model, SamplerParams, Session};
use llada_tools::checkpoint::{Shape, WeightType};
use llada_tools::reference_moe::LladaMoe;
use lladac::Quant;

fn compile(ckpt: &Path, out: &Path, quant: Option<Quant>, window_bytes: Option<u64>) {
    common::compile_quant(ckpt, out, quant, 128, window_bytes);
}

/// Largest |runtime - reference| over largest |reference|, for `len` tokens.
fn relative_error(shape: Shape, weights: WeightType, shard_bytes: u64, len: usize) -> f64 {
    let compiled = |ckpt: &Path, art: &Path| {
        compile(ckpt, art, None, None);
        assert_eq!(Model::open(art, true).unwrap().header.model.architecture, "llada-moe");
    };
    common::error_against_reference(&shape, weights, shard_bytes, len, compiled, |ckpt, input, device| LladaMoe::load(ckpt, &shape, device).unwrap().forward(input).into_data().try_to_vec().unwrap())
}

#[test]
fn tiny_moe_matches_burn() {
    // 8 experts, top 2, q/k norms, 4 query heads over 2 key/value heads; 37 tokens on a
    // 48-row graph (padding rows must not route); sharded.
    let err = relative_error(Shape::tiny_moe(), WeightType::F32, 400_000, 37);
    assert!(err <= 1e-4, "relative error {err:.2e}");
}

#[test]
fn bf16_moe_with_more_experts_matches_burn() {
    let shape = Shape { n_layers: 3, family: llada_tools::checkpoint::FamilyShape::LladaMoe(llada_tools::checkpoint::MoeShape { experts: 16, top_k: 4 }), ..Shape::tiny_moe() };
    let err = relative_error(shape, WeightType::Bf16, u64::MAX, 64);
    assert!(err <= 1e-4, "relative error {err:.2e}");
}

type Run = (Vec<u32>, Vec<Vec<[u32; 2]>>, Vec<u32>);

/// Tokens, reveals and first-pass logit bits of the dual-cache policy under a strategy.
fn run(model: &Model, strategy: ExpertStrategy) -> (Run, llada_rt::moe::ExpertCounters) {
    let mut s = Session::with_experts(model, 2, cpu::features(), StagingMode::Async, ExpertOptions { strategy, cpu_threads: 1 }).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 250).collect();
    let mask = model.header.special.mask;
    let seq: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, 32)).collect();
    let logit_rows: Vec<u32> = (20..52).collect();
    let logits: Vec<u32> = s.forward_full(&seq, &logit_rows).unwrap().iter().map(|v| v.to_bits()).collect();
    let p = SamplerParams { gen_length: 64, block_length: 32, steps: 64, policy: Policy::parse("dual").unwrap(), ..SamplerParams::default() };
    let g = generate(&mut s, &prompt, &p, &mut |_| {}).unwrap();
    ((g.output_ids, g.reveals, logits), s.expert_counters().unwrap())
}

fn strategies_agree(quant: Option<Quant>) {
    let dir = tempfile::tempdir().unwrap();
    let art = common::moe_quarter_window(dir.path(), quant);
    let model = Model::open(&art, true).unwrap();
    let (want, hybrid) = run(&model, ExpertStrategy::Hybrid);
    for strategy in [ExpertStrategy::Lru, ExpertStrategy::Static] {
        let (got, counters) = run(&model, strategy);
        assert!(got == want, "{} differs from hybrid", strategy.name());
        match strategy {
            ExpertStrategy::Lru => assert!(counters.cpu_experts == 0 && counters.staged_bytes > 0, "{counters:?}"),
            _ => assert!(counters.accelerator_experts == 0 && counters.staged_bytes == 0, "{counters:?}"),
        }
    }
    // Hybrid used both paths and its cache.
    assert!(hybrid.accelerator_experts > 0 && hybrid.cpu_experts > 0 && hybrid.hits > 0, "{hybrid:?}");
}

#[test]
fn every_expert_strategy_generates_the_same_bits_f32() {
    strategies_agree(None);
}

#[test]
fn every_expert_strategy_generates_the_same_bits_q4() {
    strategies_agree(Some(Quant::Q4 { group: 32 }));
}
