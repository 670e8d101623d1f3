//! DiffusionGemma on `--backend vulkan`: its layers' ops on the device (GELU gate, soft-capping,
//! per-head norms and rotary, windowed attention with its own heads), the self-conditioning
//! input and the experts on the CPU between command buffers. The decoder's passes give the host
//! backend's logits, and the kit replays.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::executor::{self, Backend};
use llada_rt::kernels::cpu;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_ir::window::ActivationScales;
use llada_rt::{Model, Session};

fn kit() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/diffusiongemma-conformance/tiny-dg-A")
}

fn session<'m>(model: &'m Model, backend: &'static Backend, features: cpu::Features) -> Session {
    Session::with_backend(model, backend, 2, features, StagingMode::Async, ExpertOptions::default()).unwrap()
}

/// A prompt longer than the sliding window encoded, then two decoder passes over a canvas (the
/// second self-conditioned on the first's logits), on each backend.
fn passes(model: &Model, backend: &'static Backend, features: cpu::Features) -> (Vec<f32>, Vec<f32>) {
    let mut s = session(model, backend, features);
    let prompt: Vec<u32> = (0..21).map(|i| 17 + (i * 37) % 256).collect();
    let canvas: Vec<u32> = (0..16).map(|i| (i * 53 + 7) % 320).collect();
    s.encode(&prompt, 0..prompt.len()).unwrap();
    let first = s.denoise(prompt.len(), &canvas, None).unwrap().to_vec();
    let second = s.denoise(prompt.len(), &canvas, Some(&first)).unwrap().to_vec();
    (first, second)
}

/// The decoder's passes (the second self-conditioned) on Vulkan against the host's portable
/// kernels and its own: f32 weights within the conformance kits' logit bound (measured on
/// lavapipe: 1.2e-5 and 3.1e-5 from the portable kernels, 4.3e-5 from AVX-512's), q8 weights
/// too (measured: 4.8e-6; a changed activation can flip a quant, hence the same bound).
#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn decoder_passes_on_vulkan_give_the_host_logits() {
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (name, quant, scales) in [("f32", None, None), ("q8", Some(lladac::Quant::Q8), Some(ActivationScales::PerRow))] {
        let art = dir.path().join(format!("{name}.lad"));
        // Per-row activation scales: the experts' 16 inputs are not whole blocks of 32.
        common::compile_scaled(&kit(), &art, quant, 128, None, scales);
        let model = Model::open(&art, true).unwrap();
        let vk = passes(&model, &executor::vulkan::BACKEND, cpu::features());
        for (kernels, f) in [("portable", cpu::Features::PORTABLE), ("own", cpu::features())] {
            let host = passes(&model, &executor::host::BACKEND, f);
            for (which, h, v) in [("first", &host.0, &vk.0), ("second", &host.1, &vk.1)] {
                assert_eq!(h.len(), v.len());
                let diff = h.iter().zip(v).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                eprintln!("{name}, {which} pass: max abs difference {diff:.2e} from the host's {kernels} kernels");
                if !(diff <= 1e-4) {
                    failures.push(format!("{name}, {which} pass: logits differ from the host's {kernels} kernels' by {diff:.2e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The kit replays on Vulkan under PyTorch's random stream: a spread fifth of its cases (CI
/// replays another spread on the command line), every one exact (ids and decoder passes per
/// canvas), none needing its margins.
#[test]
#[ignore = "needs a Vulkan driver (lavapipe): .ci/run installs it and runs these with --ignored"]
fn the_kit_replays_on_vulkan() {
    let dir = tempfile::tempdir().unwrap();
    let art = dir.path().join("kit.lad");
    common::compile_quant(&kit(), &art, None, 128, None);
    let model = Model::open(&art, true).unwrap();
    let mut s = session(&model, &executor::vulkan::BACKEND, cpu::features());
    assert_eq!(s.backend().backend, "vulkan");
    let every = llada_rt_tools::conformance::Selection::new(5, 2).unwrap();
    let r = llada_rt_tools::conformance::run(&mut s, &kit().join("golden.json"), every, &mut |_| {}).unwrap();
    assert!(r.passed(), "{:?}", r.failures);
    assert_eq!((r.cases, r.output_ids_matched, r.denoising_steps_matched, r.logit_cases_within_tolerance), (12, 12, Some(12), 1));
}
