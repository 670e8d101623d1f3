//! A mixture-of-experts artifact on `--backend vulkan` is refused with one clear error: its
//! experts run only on the host backend (README, "Backends").

mod common;

use llada_tools::checkpoint::{Shape, WeightType};

#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn a_mixture_of_experts_model_is_refused_on_vulkan() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    common::checkpoint(&ckpt, Shape::tiny_moe(), WeightType::F32, u64::MAX, 0.08);
    let art = dir.path().join("moe.lad");
    common::compile_quant(&ckpt, &art, None, 128, None);
    // Settings the artifact serves, so the backend is the one thing refused.
    let out = common::run("llada-rt", &["run", art.to_str().unwrap(), "--prompt-ids", "1,2,3", "--gen-len", "32", "--steps", "32", "--backend", "vulkan"]);
    common::assert_clean_failure(&out, &["--backend", "mixture-of-experts", "--backend host"]);
}
