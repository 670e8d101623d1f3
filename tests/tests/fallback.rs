//! The fast kernel paths (AVX-512 F, BF16, VNNI, and the AVX2 tiles CPUs without them run)
//! against their portable twins, end to end: the same artifact in every weight format gives
//! the same logits within the format's tolerance on the detected path, on the AVX2 path
//! alone, and on the portable path, and `LLADA_ISA=portable` / `LLADA_ISA=avx2` (the
//! process-wide switch) generate the same tokens.

mod common;

use llada_rt::kernels::cpu::{self, FeatureRequest, Features};
use llada_rt::staging::StagingMode;
use llada_rt::{Model, Session};
use llada_tools::checkpoint::{Shape, WeightType};

fn artifact(dir: &std::path::Path, quant: &str) -> std::path::PathBuf {
    let ckpt = dir.join("ckpt");
    if !ckpt.exists() {
        common::checkpoint(&ckpt, Shape::tiny(), WeightType::F32, u64::MAX, 0.05);
    }
    compile_quant(&ckpt, dir, quant, "64")
}

/// `quant` is a `--quant` value, or `bf16a` for bf16 weights with bf16 activations.
fn compile_quant(ckpt: &std::path::Path, dir: &std::path::Path, quant: &str, max_seq: &str) -> std::path::PathBuf {
    let out = dir.join(format!("{quant}.lad"));
    let (q, acts) = if quant == "bf16a" { ("bf16", "bf16") } else { (quant, "f32") };
    // q4 in groups of 32; --group is refused with the other formats, which do not use it.
    let mut args = vec!["compile", "--model", ckpt.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quant", q, "--activations", acts, "--max-seq", max_seq];
    if q == "q4" {
        args.extend(["--group", "32"]);
    }
    let o = common::run("lladac", &args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// The SIMD feature sets to compare with the portable path: the detected one, and AVX2
/// alone where the CPU has more (so the AVX2 tiles are tested on AVX-512 machines too).
fn simd_feature_sets() -> Vec<(&'static str, Features)> {
    let f = cpu::features();
    let avx2 = Features::request(FeatureRequest::level("avx2").unwrap());
    let mut sets = Vec::new();
    if f.avx512() || f.avx2() {
        sets.push(("detected", f));
    }
    if f.avx2() && f != avx2 {
        sets.push(("avx2", avx2));
    }
    if !f.avx2() {
        eprintln!("no AVX2 + FMA + F16C on this machine (or LLADA_ISA caps it): the AVX2 path is not tested");
    }
    sets
}

#[test]
fn every_format_agrees_with_its_portable_path() {
    let sets = simd_feature_sets();
    if sets.is_empty() {
        eprintln!("no SIMD path on this machine: nothing to compare");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 % 250) as u32).collect();
    let rows: Vec<u32> = (0..40).collect();
    for quant in ["f32", "f16", "bf16", "bf16a", "q8", "q4"] {
        let model = Model::open(&artifact(dir.path(), quant), true).unwrap();
        let portable = Session::with_options(&model, 1, Features::PORTABLE, StagingMode::Async).unwrap().forward_full(&ids, &rows).unwrap().to_vec();
        for &(name, f) in &sets {
            let fast = Session::with_options(&model, 2, f, StagingMode::Async).unwrap().forward_full(&ids, &rows).unwrap().to_vec();
            compare(quant, name, &fast, &portable);
        }
    }
}

/// Logits of a SIMD path against the portable path's.
fn compare(quant: &str, path: &str, fast: &[f32], portable: &[f32]) {
    let scale = portable.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = fast.iter().zip(portable).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    // The paths differ only in float summation order (integer dot products are exact).
    // Where activations are rounded before the product (bf16a, int8) that difference is
    // amplified: an activation one f32 ulp apart can round to the neighbouring bf16 value
    // (2^-8 relative) or int8 step (1/127 of the row's largest), and such flips compound
    // over the layers (seen here: bf16 3.4e-3 and q8 1.4e-3 of the largest logit, from
    // 6e-6 after the first attention output). Those formats get the activation-rounding
    // tolerance of the GEMM unit tests; a kernel bug (a wrong pair, panel or chunk) moves
    // logits by their own size.
    let tol = if matches!(quant, "f32" | "f16" | "bf16") { 1e-4 } else { 1.5e-2 };
    assert!(err <= tol * scale.max(1.0), "{quant} on the {path} path: max abs difference {err:.2e} (logits up to {scale:.2})");
}

/// On the trained embedded model (confident answers, so summation order cannot flip a
/// near-tie as it can on random weights).
#[test]
fn portable_process_generates_the_same_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let embedded = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks");
    for quant in ["bf16", "bf16a", "q8", "q4"] {
        let art = compile_quant(&embedded, dir.path(), quant, "256");
        let prompt = "SHIFT:PONMLKJIHGFEDCBAABCDEFGHIJKLMNOPAEIMBFJNCGKODHLPPLHDOKGCNJFBMIEA=";
        let args = ["run", art.to_str().unwrap(), "--chat", "-p", prompt, "--gen-len", "64", "--steps", "16", "--json"];
        let detected = common::run("llada-rt", &args);
        let capped = |isa: &str| std::process::Command::new(common::bin("llada-rt")).args(args).env("LLADA_ISA", isa).output().unwrap();
        let (portable, avx2) = (capped("portable"), capped("avx2"));
        assert!(detected.status.success() && portable.status.success() && avx2.status.success());
        let ids = |o: &std::process::Output| serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["output_ids"].clone();
        assert_eq!(ids(&detected), ids(&portable), "{quant}");
        assert_eq!(ids(&avx2), ids(&portable), "{quant} with LLADA_ISA=avx2");
    }
}
