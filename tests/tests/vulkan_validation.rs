//! The Vulkan backend under the Khronos validation layer reports no error: a resident and a
//! staged window, every weight format the shaders read, `mbsd` with revision, and
//! DiffusionGemma's encoder and self-conditioned decoder passes. Its own test
//! binary, because the layer is chosen by an environment variable read when a device opens.

mod common;

use std::path::Path;

use llada_rt::executor;
use llada_rt::kernels::cpu;
use llada_rt::sampler::Policy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::text::Text;
use llada_rt::{generate, Model, SamplerParams, Session};
use lladac::Quant;

#[test]
#[ignore = "needs a Vulkan driver and the validation layer: .ci/run installs them and runs this with --ignored"]
fn the_validation_layer_reports_no_error() {
    // SAFETY: this binary's only test sets it before any thread reads the environment.
    unsafe { std::env::set_var("LLADA_VULKAN_VALIDATION", "1") };
    let dir = tempfile::tempdir().unwrap();
    let model_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let resident = dir.path().join("q8.lad");
    common::compile_quant(&model_dir, &resident, Some(Quant::Q8), 256, None);
    let q4 = dir.path().join("q4.lad");
    common::compile_quant(&model_dir, &q4, Some(Quant::Q4 { group: 32 }), 256, None);
    let mut artifacts = vec![q4];
    let staged = dir.path().join("staged.lad");
    common::compile_quant(&model_dir, &staged, Some(Quant::Q8), 256, Some(common::half_the_weights(&resident)));
    artifacts.push(staged);
    for (i, quant) in [Some(Quant::F16), Some(Quant::Bf16), None].into_iter().enumerate() {
        let art = dir.path().join(format!("m{i}.lad"));
        common::compile_quant(&model_dir, &art, quant, 256, None);
        artifacts.push(art);
    }
    for art in &artifacts {
        let model = Model::open(art, true).unwrap();
        let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
        let prompt = text.encode_chat("FILL:0022001000121700300003040240606040000020037096000250158001600037=").unwrap();
        let mut s = Session::with_backend(&model, &executor::vulkan::BACKEND, 2, cpu::features(), StagingMode::Async, ExpertOptions::default()).unwrap();
        for policy in [Policy::Exact, Policy::Mbsd] {
            let p = SamplerParams { gen_length: 32, block_length: 16, steps: 16, policy, ..Default::default() };
            generate(&mut s, &prompt, &p, &mut |_| {}).unwrap();
        }
    }
    // DiffusionGemma's kit model: a prompt longer than its sliding window, two canvases.
    let dg = dir.path().join("dg.lad");
    common::compile_quant(&Path::new(env!("CARGO_MANIFEST_DIR")).join("data/diffusiongemma-conformance/tiny-dg-A"), &dg, None, 128, None);
    let model = Model::open(&dg, true).unwrap();
    let mut s = Session::with_backend(&model, &executor::vulkan::BACKEND, 2, cpu::features(), StagingMode::Async, ExpertOptions::default()).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| 17 + i * 19).collect();
    generate(&mut s, &prompt, &SamplerParams { gen_length: 32, block_length: 16, steps: 4, ..Default::default() }, &mut |_| {}).unwrap();
    assert_eq!(llada_rt::executor::vulkan::validation_errors(), 0, "the validation layer reported errors (printed above)");
}
