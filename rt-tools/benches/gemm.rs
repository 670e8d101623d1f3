//! `cargo bench -p llada-rt-tools --bench gemm`: the packed GEMM on LLaDA-8B's shapes in every
//! weight format, on synthetic weights, against the machine's peaks measured in the same run.
//! (`llada-rt bench` times the same kernels inside real artifacts' forward passes.)
//!
//! `GEMM_ROWS=32,64`, `GEMM_THREADS=1`, `GEMM_SHAPES=5632x2048,2048x5632` (n x k; LLaDA-1B's
//! MLP) and `GEMM_FORMATS=q4,f32` narrow the sweep; `GEMM_REPEAT=N` times N runs (default
//! 5, the median reported); `LLADA_ISA=portable|avx2` caps the path. `GEMM_COPIES=N` cycles
//! each timed run through N copies of the weights (all the copies in one run), so that with
//! enough copies they stream from memory as a model's do, not from the last-level cache.

use llada_ir::packing::{pack_panel, PANEL};
use llada_ir::DType;
use llada_rt::kernels::{cpu, gemm};
use llada_rt_tools::roofline;

fn main() {
    let rows: Vec<usize> = std::env::var("GEMM_ROWS").ok().map_or(vec![32, 64, 128], |s| s.split(',').filter_map(|r| r.parse().ok()).collect());
    let threads = std::env::var("GEMM_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or_else(llada_rt::session::default_threads);
    // LLaDA-8B: q|k|v, attention output, gate|up, down.
    let shapes: Vec<(usize, usize)> = std::env::var("GEMM_SHAPES").ok().map_or(vec![(12288, 4096), (4096, 4096), (24576, 4096), (4096, 12288)], |s| {
        s.split(',').filter_map(|p| p.split_once('x').and_then(|(n, k)| Some((n.parse().ok()?, k.parse().ok()?)))).collect()
    });
    let repeat: usize = std::env::var("GEMM_REPEAT").ok().and_then(|t| t.parse().ok()).unwrap_or(5).max(1);
    let copies: usize = std::env::var("GEMM_COPIES").ok().and_then(|t| t.parse().ok()).unwrap_or(1).max(1);
    let only: Option<Vec<String>> = std::env::var("GEMM_FORMATS").ok().map(|s| s.split(',').map(str::to_string).collect());
    let roof = roofline::measure(threads);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    println!("{threads} thread(s), {}; peaks: f32 {:.0}, bf16 {:.0} GFLOP/s, int8 {:.0} GOP/s", roof.features, roof.f32_flops.all_threads / 1e9, roof.bf16_flops.all_threads / 1e9, roof.int8_ops.all_threads / 1e9);
    println!("{:<12} {:>5} {:>6} {:>6} {:>10} {:>10} {:>7}", "format", "rows", "n", "k", "ms", "G(FL)OP/s", "of peak");
    // (name, format, bf16 activations): bf16 weights run both ways.
    for (name, format, bf16_activations) in [
        ("q4", DType::PanelQ4 { group: 128 }, false),
        ("q8", DType::PanelQ8, false),
        ("bf16", DType::PanelBf16, true),
        ("bf16-f32x", DType::PanelBf16, false),
        ("f16", DType::PanelF16, false),
        ("f32", DType::PanelF32, false),
    ] {
        if only.as_ref().is_some_and(|o| !o.iter().any(|f| f == name)) {
            continue;
        }
        let peak = if format == DType::PanelBf16 && !bf16_activations { roof.peak_for(DType::PanelF32, threads) } else { roof.peak_for(format, threads) };
        for &(n, k) in &shapes {
            let row: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 * 0.01 - 0.05).collect();
            let rows16: Vec<&[f32]> = (0..PANEL).map(|_| row.as_slice()).collect();
            let mut bytes = Vec::new();
            for _ in 0..n / PANEL {
                pack_panel(format, &rows16, k, &mut bytes);
            }
            let all: Vec<Vec<u8>> = (0..copies).map(|_| bytes.clone()).collect();
            let ms: Vec<gemm::Matrix> = all.iter().map(|b| gemm::Matrix { format, n, k, bytes: b, bf16_activations, activation_scales: Default::default() }).collect();
            let m = &ms[0];
            for &r in &rows {
                let x: Vec<f32> = (0..r * k).map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6).collect();
                let mut out = vec![0.0; r * n];
                // 8-byte aligned, as the window's scratch is (64).
                let mut scratch = vec![0u64; m.operand_layout(r).bytes.div_ceil(8)];
                let scratch: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch);
                gemm::gemm(&x, r, m, &mut out, scratch, &pool, cpu::features());
                let times: Vec<f64> = (0..repeat)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for m in &ms {
                            gemm::gemm(&x, r, m, &mut out, scratch, &pool, cpu::features());
                        }
                        t.elapsed().as_secs_f64() / copies as f64
                    })
                    .collect();
                let mut sorted = times.clone();
                sorted.sort_by(f64::total_cmp);
                let secs = sorted[sorted.len() / 2];
                let rate = 2.0 * (r * n * k) as f64 / secs;
                let of_peak = if peak > 0.0 { format!("{:>6.0}%", 100.0 * rate / peak) } else { "      -".into() };
                println!("{:<12} {:>5} {:>6} {:>6} {:>10.3} {:>10.1} {}", name, r, n, k, secs * 1e3, rate / 1e9, of_peak);
            }
        }
    }
}
