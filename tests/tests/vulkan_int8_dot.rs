//! The q8 and q4 matmul shaders compute the same bits with the device's packed int8 dot
//! products (VK_KHR_shader_integer_dot_product, which lavapipe reports) and without them
//! (`LLADA_VULKAN_INT8_DOT=0`): integer sums are exact either way, with activation scales
//! per row or per block. Its own test binary, because
//! the choice is an environment variable read when a device opens.

mod common;

use std::path::Path;

use llada_rt::executor;
use llada_rt::kernels::cpu;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::{Model, Session};
use llada_ir::window::ActivationScales;
use lladac::Quant;

fn first_pass(model: &Model) -> (bool, Vec<u32>) {
    let mut s = Session::with_backend(model, &executor::vulkan::BACKEND, 2, cpu::features(), StagingMode::Async, ExpertOptions::default()).unwrap();
    let seq: Vec<u32> = (0..96).map(|i| (i * 7 + 3) % 60 + 3).collect();
    let logit_rows: Vec<u32> = (32..seq.len() as u32).collect();
    let dot = s.backend().int8_dot;
    (dot, s.forward_full(&seq, &logit_rows).unwrap().iter().map(|v| v.to_bits()).collect())
}

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn int8_matmuls_are_the_same_bits_with_and_without_dot_product_instructions() {
    let dir = tempfile::tempdir().unwrap();
    let model_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    let cases = [Quant::Q8, Quant::Q4 { group: 32 }].into_iter().flat_map(|q| [(q, ActivationScales::PerRow), (q, ActivationScales::PerBlock)]);
    for (i, (quant, scales)) in cases.enumerate() {
        let art = dir.path().join(format!("m{i}.lad"));
        common::compile_scaled(&model_dir, &art, Some(quant), 256, None, Some(scales));
        let model = Model::open(&art, true).unwrap();
        // SAFETY: this binary's only test changes the environment, with no other thread
        // reading it (sessions read it when they open, on this thread).
        unsafe { std::env::set_var("LLADA_VULKAN_INT8_DOT", "0") };
        let (off, plain) = first_pass(&model);
        unsafe { std::env::remove_var("LLADA_VULKAN_INT8_DOT") };
        let (on, dot) = first_pass(&model);
        assert!(!off, "LLADA_VULKAN_INT8_DOT=0 left the dot products on");
        assert!(on, "the device reports no integer dot products, so the path went untested (lavapipe reports them)");
        assert!(plain == dot, "{quant:?} {scales:?}: logits differ with the dot-product instructions");
    }
}
