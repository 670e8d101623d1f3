//! `cargo bench -p llada-rt-tools --bench attention`: one layer's attention on LLaDA-1B's
//! shape (16 query heads of 128, no grouping) for the row counts a decoding step computes,
//! against keys cached in the layer's head planes, split into units between the threads the
//! way the host executor splits them. Reports GFLOP/s (`4 * rows * keys * heads * head_dim`:
//! `q K^T` and `P V`) against the machine's f32 peak measured in the same run.
//!
//! `ATTN_ROWS=1,4,32`, `ATTN_KEYS=160,1024`, `ATTN_THREADS=1`, `ATTN_HEADS=32`,
//! `ATTN_REPEAT=N` (default 20, the median reported); `LLADA_ISA=portable|avx2` caps the path.
//! `ATTN_LAYERS=16` times a pass's worth of layers, each with its own KV planes and q|k|v rows,
//! so that (as in a generation) the keys and values come from memory, not a cache that holds
//! them from the previous run; the time reported is per layer.

use llada_rt::kernels::attention::{self, OwnKv, Shape, UNIT_ROWS};
use llada_rt::kernels::cpu;
use llada_rt_tools::roofline;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn list(var: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(var).ok().map_or(default.to_vec(), |s| s.split(',').filter_map(|r| r.parse().ok()).collect())
}

fn main() {
    let rows_list = list("ATTN_ROWS", &[1, 4, 16, 32, 160]);
    let keys_list = list("ATTN_KEYS", &[160, 1024]);
    let threads = list("ATTN_THREADS", &[llada_rt::session::default_threads()])[0].max(1);
    let heads = list("ATTN_HEADS", &[16])[0].max(1);
    let repeat = list("ATTN_REPEAT", &[20])[0].max(1);
    let layers = list("ATTN_LAYERS", &[1])[0].max(1);
    let hd = 128;
    let roof = roofline::measure(threads);
    let peak = roof.f32_flops.all_threads;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let features = cpu::features();
    println!("{threads} thread(s), {}; f32 peak {:.0} GFLOP/s; {heads} heads of {hd}", roof.features, peak / 1e9);
    println!("{:>5} {:>6} {:>10} {:>10} {:>7}", "rows", "keys", "ms", "GFLOP/s", "of peak");
    let mut seed = 7u64;
    let mut rnd = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    for &keys in &keys_list {
        let kvs: Vec<Vec<f32>> = (0..layers).map(|_| (0..2 * heads * keys * hd).map(|_| rnd()).collect()).collect();
        for &rows in &rows_list {
            let width = 3 * heads * hd;
            let qkvs: Vec<Vec<f32>> = (0..layers).map(|_| (0..rows * width).map(|_| rnd()).collect()).collect();
            let mut out = vec![0f32; rows * heads * hd];
            let mut scores = vec![0f32; threads * UNIT_ROWS * keys];
            let sh = Shape { width, capacity: keys, heads, kv_heads: heads, head_dim: hd, keys, threads };
            let units = attention::units(features, &sh, rows);
            let mut once = || {
                for (qkv, kv) in qkvs.iter().zip(&kvs) {
                    let o = attention::Out::new(&mut out);
                    // Units claimed one at a time by whichever thread is free, as the executor does.
                    let next = AtomicUsize::new(0);
                    pool.install(|| {
                        scores.par_chunks_mut(UNIT_ROWS * keys).for_each(|scores| loop {
                            let u = next.fetch_add(1, Ordering::Relaxed);
                            if u >= units {
                                break;
                            }
                            attention::attend(features, &attention::Call { qkv, kv, shape: sh, own: OwnKv::NONE, rows }, u..u + 1, o, scores);
                        })
                    });
                }
            };
            once();
            let mut times: Vec<f64> = (0..repeat)
                .map(|_| {
                    let t = std::time::Instant::now();
                    once();
                    t.elapsed().as_secs_f64() / layers as f64
                })
                .collect();
            times.sort_by(f64::total_cmp);
            // `ATTN_STAT=min`: the fastest run instead of the median (on a shared host, the run
            // least slowed by neighbours).
            let secs = if std::env::var("ATTN_STAT").is_ok_and(|s| s == "min") { times[0] } else { times[times.len() / 2] };
            let rate = 4.0 * (rows * keys * heads * hd) as f64 / secs;
            println!("{:>5} {:>6} {:>10.3} {:>10.1} {:>6.0}%", rows, keys, secs * 1e3, rate / 1e9, 100.0 * rate / peak);
        }
    }
}
