//! Times one packed GEMM shape on one thread: `gemm_probe FORMAT ROWS N K [REPEAT]`
//! (FORMAT: f32, bf16, q8, q4g32, q4g64, q4g128). For tuning kernels; `llada-rt bench` is the
//! real measurement.
use llada_ir::packing::{pack_panel, PANEL};
use llada_ir::DType;
use llada_rt::kernels::{cpu, gemm};

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let format = match a[0].as_str() {
        "f32" => DType::PanelF32,
        "bf16" => DType::PanelBf16,
        "q8" => DType::PanelQ8,
        g if g.starts_with("q4g") => DType::PanelQ4 { group: g[3..].parse().unwrap() },
        _ => panic!("format"),
    };
    let (rows, n, k): (usize, usize, usize) = (a[1].parse().unwrap(), a[2].parse().unwrap(), a[3].parse().unwrap());
    let repeat: usize = a.get(4).map_or(5, |s| s.parse().unwrap());
    let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6).collect();
    let row: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 * 0.01 - 0.05).collect();
    let mut bytes = Vec::new();
    let rows16: Vec<&[f32]> = (0..PANEL).map(|_| row.as_slice()).collect();
    for _ in 0..n / PANEL {
        pack_panel(format, &rows16, k, &mut bytes);
    }
    let m = gemm::Matrix { format, n, k, bytes: &bytes };
    let mut out = vec![0.0; rows * n];
    let mut prep = gemm::Prepared::default();
    let threads: usize = std::env::var("THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    gemm::gemm(&x, rows, &m, &mut out, &mut prep, &pool, cpu::features());
    let mut best = f64::MAX;
    for _ in 0..repeat {
        let t = std::time::Instant::now();
        gemm::gemm(&x, rows, &m, &mut out, &mut prep, &pool, cpu::features());
        best = best.min(t.elapsed().as_secs_f64());
    }
    let ops = 2.0 * (rows * n * k) as f64;
    println!("{} {rows}x{n}x{k}: {:.3} ms, {:.1} G(FL)OP/s, {:.1} GB/s of weights", a[0], best * 1e3, ops / best / 1e9, bytes.len() as f64 / best / 1e9);
}
