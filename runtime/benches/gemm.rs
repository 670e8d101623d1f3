//! `cargo bench -p llada-rt --bench gemm`: the packed GEMM on LLaDA-8B's shapes in every
//! weight format, on synthetic weights, against the machine's peaks measured in the same run.
//! (`llada-rt bench` times the same kernels inside real artifacts' forward passes.)
//!
//! `GEMM_ROWS=32,64` and `GEMM_THREADS=1` narrow the sweep.

use llada_ir::packing::{pack_panel, PANEL};
use llada_ir::DType;
use llada_rt::kernels::{cpu, gemm};
use llada_rt::roofline;

fn main() {
    let rows: Vec<usize> = std::env::var("GEMM_ROWS").ok().map_or(vec![32, 64, 128], |s| s.split(',').filter_map(|r| r.parse().ok()).collect());
    let threads = std::env::var("GEMM_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or_else(llada_rt::session::default_threads);
    let roof = roofline::measure(threads);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    println!("{threads} thread(s), {}; peaks: f32 {:.0}, bf16 {:.0} GFLOP/s, int8 {:.0} GOP/s", roof.features, roof.f32_flops.all_threads / 1e9, roof.bf16_flops.all_threads / 1e9, roof.int8_ops.all_threads / 1e9);
    println!("{:<12} {:>5} {:>6} {:>6} {:>10} {:>10} {:>7}", "format", "rows", "n", "k", "ms", "G(FL)OP/s", "of peak");
    // LLaDA-8B: q|k|v, attention output, gate|up, down.
    let shapes = [(12288, 4096), (4096, 4096), (24576, 4096), (4096, 12288)];
    // (format, bf16 activations): bf16 weights run both ways.
    for (format, bf16_activations) in [(DType::PanelQ4 { group: 128 }, false), (DType::PanelQ8, false), (DType::PanelBf16, true), (DType::PanelBf16, false), (DType::PanelF32, false)] {
        let name = if format == DType::PanelBf16 && !bf16_activations { "bf16 (f32 x)".to_string() } else { format.name() };
        let peak = if format == DType::PanelBf16 && !bf16_activations { roof.peak_for(DType::PanelF32, threads) } else { roof.peak_for(format, threads) };
        for &(n, k) in &shapes {
            let row: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 * 0.01 - 0.05).collect();
            let rows16: Vec<&[f32]> = (0..PANEL).map(|_| row.as_slice()).collect();
            let mut bytes = Vec::new();
            for _ in 0..n / PANEL {
                pack_panel(format, &rows16, k, &mut bytes);
            }
            let m = gemm::Matrix { format, n, k, bytes: &bytes, bf16_activations };
            for &r in &rows {
                let x: Vec<f32> = (0..r * k).map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6).collect();
                let mut out = vec![0.0; r * n];
                let mut prep = gemm::Prepared::default();
                gemm::gemm(&x, r, &m, &mut out, &mut prep, &pool, cpu::features());
                let times: Vec<f64> = (0..5)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        gemm::gemm(&x, r, &m, &mut out, &mut prep, &pool, cpu::features());
                        t.elapsed().as_secs_f64()
                    })
                    .collect();
                let mut sorted = times.clone();
                sorted.sort_by(f64::total_cmp);
                let secs = sorted[sorted.len() / 2];
                let rate = 2.0 * (r * n * k) as f64 / secs;
                println!("{:<12} {:>5} {:>6} {:>6} {:>10.3} {:>10.1} {:>6.0}%", name, r, n, k, secs * 1e3, rate / 1e9, 100.0 * rate / peak);
            }
        }
    }
}
