//! `llada-rt roofline`: this machine's ceilings, measured: peak multiply-add rates of each
//! engine the kernels use (f32 FMA, bf16 pair dot, int8 quad dot) and memory read bandwidth,
//! on one thread and on all threads. The bench compares every kernel with these.
//!
//! Each rate is that of the instructions the GEMM kernels run on this CPU (see
//! `kernels::gemm::Path`): AVX-512 where the CPU has the format's extension, else AVX2,
//! whose bf16 tiles widen to f32 (the bf16 rate is then the 256-bit f32 FMA rate) and whose
//! int8 tiles use `vpmaddubsw` + `vpmaddwd` (measured as the q4 tile issues them).

use std::time::Instant;

use serde::Serialize;

use llada_rt::kernels::cpu;

/// A rate on one thread and on all threads (0 when the engine is absent).
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct Rate {
    pub one_thread: f64,
    pub all_threads: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Roofline {
    pub threads: usize,
    pub features: String,
    /// FLOP/s of AVX-512 (or AVX2) f32 fused multiply-add.
    pub f32_flops: Rate,
    /// FLOP/s of AVX-512 BF16 `vdpbf16ps` (or, without it, of the AVX2 f32 FMA the widened
    /// bf16 products run on).
    pub bf16_flops: Rate,
    /// Integer ops/s (2 per multiply-add) of AVX-512 VNNI `vpdpbusd` (or, without it, of
    /// AVX2 `vpmaddubsw` + `vpmaddwd`).
    pub int8_ops: Rate,
    /// AMX is not used by this build; reported so a reader knows whether it was there.
    pub amx_present: bool,
    /// Bytes/s of streaming reads from memory.
    pub read_bytes: Rate,
    /// What the GEMM kernels sustain on all threads, per weight format: the rates a cost
    /// model should use for matmuls (the peaks above bound them).
    pub gemm: GemmRates,
}

/// (FL)OP/s the packed GEMM sustains on all threads: the median over 32, 64 and 128 rows of
/// LLaDA-8B's attention output (4096 x 4096) and LLaDA-1B's MLP down projection
/// (2048 x 5632), weights from memory, not cache; each the median of five runs.
#[derive(Debug, Clone, Copy, Serialize, Default)]
pub struct GemmRates {
    pub f32: f64,
    /// bf16 weights, f32 activations (the default).
    pub bf16: f64,
    pub q8: f64,
    /// q4, group 128.
    pub q4: f64,
}

/// Times the real GEMM on synthetic weights of each format.
fn measure_gemm(threads: usize) -> GemmRates {
    use llada_rt::kernels::gemm::{gemm, Matrix};
    use llada_ir::packing::{pack_panel, PANEL};
    use llada_ir::DType;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads.max(1)).build().expect("the thread pool starts");
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let one = |format: DType| {
        let mut rates = Vec::new();
        for (n, k) in [(4096usize, 4096usize), (2048, 5632)] {
            let row: Vec<f32> = (0..k).map(|i| ((i * 5) % 11) as f32 * 0.01 - 0.05).collect();
            let rows16: Vec<&[f32]> = (0..PANEL).map(|_| row.as_slice()).collect();
            let mut bytes = Vec::new();
            for _ in 0..n / PANEL {
                pack_panel(format, &rows16, k, &mut bytes);
            }
            let m = Matrix { format, n, k, bytes: &bytes, bf16_activations: false, activation_scales: Default::default() };
            for rows in [32usize, 64, 128] {
                let x: Vec<f32> = (0..rows * k).map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6).collect();
                let mut out = vec![0.0; rows * n];
                let mut scratch = vec![0u64; m.operand_layout(rows).bytes.div_ceil(8)];
                let scratch: &mut [u8] = bytemuck::cast_slice_mut(&mut scratch);
                gemm(&x, rows, &m, &mut out, scratch, &pool, cpu::features());
                let times = (0..5)
                    .map(|_| {
                        let t = Instant::now();
                        gemm(&x, rows, &m, &mut out, scratch, &pool, cpu::features());
                        t.elapsed().as_secs_f64()
                    })
                    .collect();
                rates.push(2.0 * (rows * n * k) as f64 / median(times));
            }
        }
        median(rates)
    };
    GemmRates { f32: one(DType::PanelF32), bf16: one(DType::PanelBf16), q8: one(DType::PanelQ8), q4: one(DType::PanelQ4 { group: 128 }) }
}

#[cfg(target_arch = "x86_64")]
mod probes {
    use std::arch::x86_64::*;

    const CHAINS: usize = 12;

    /// # Safety
    /// AVX-512F required.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn f32_fma(iters: usize) -> f32 {
        let mut acc = [_mm512_set1_ps(0.5); CHAINS];
        let (a, b) = (_mm512_set1_ps(0.999), _mm512_set1_ps(0.001));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_fmadd_ps(*x, a, b);
            }
        }
        acc.iter().fold(0.0, |s, &x| s + _mm512_reduce_add_ps(x))
    }

    /// # Safety
    /// AVX-512 BF16 required.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn bf16_dot(iters: usize) -> f32 {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        // SAFETY: __m512bh and __m512i are the same 64 bytes.
        let (a, b): (__m512bh, __m512bh) = unsafe { (std::mem::transmute(_mm512_set1_epi16(0x3f80)), std::mem::transmute(_mm512_set1_epi16(0x3a00))) };
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_dpbf16_ps(*x, a, b);
            }
        }
        acc.iter().fold(0.0, |s, &x| s + _mm512_reduce_add_ps(x))
    }

    /// # Safety
    /// AVX-512 VNNI required.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn int8_dot(iters: usize) -> i32 {
        let mut acc = [_mm512_setzero_si512(); CHAINS];
        let (a, b) = (_mm512_set1_epi8(1), _mm512_set1_epi8(-1));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm512_dpbusd_epi32(*x, a, b);
            }
        }
        acc.iter().fold(0, |s, &x| s.wrapping_add(_mm512_reduce_add_epi32(x)))
    }

    /// # Safety
    /// AVX-512F required.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn read(buf: &[u8]) -> u64 {
        let mut acc = [_mm512_setzero_si512(); 4];
        let chunks = buf.len() / 256;
        for c in 0..chunks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: c * 256 + j * 64 + 64 <= buf.len().
                let v = unsafe { _mm512_loadu_si512(buf.as_ptr().add(c * 256 + j * 64) as *const __m512i) };
                *a = _mm512_xor_si512(*a, v);
            }
        }
        acc.iter().fold(0u64, |s, &x| s ^ _mm512_reduce_add_epi64(x) as u64)
    }

    pub const OPS_PER_ITER_F32: f64 = (CHAINS * 32) as f64;
    pub const OPS_PER_ITER_BF16: f64 = (CHAINS * 64) as f64;
    pub const OPS_PER_ITER_INT8: f64 = (CHAINS * 128) as f64;

    /// # Safety
    /// AVX2 and FMA required.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn f32_fma_avx2(iters: usize) -> f32 {
        let mut acc = [_mm256_set1_ps(0.5); CHAINS];
        let (a, b) = (_mm256_set1_ps(0.999), _mm256_set1_ps(0.001));
        for _ in 0..iters {
            for x in acc.iter_mut() {
                *x = _mm256_fmadd_ps(*x, a, b);
            }
        }
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc.iter().fold(_mm256_setzero_ps(), |s, &x| _mm256_add_ps(s, x))) };
        lanes.iter().sum()
    }

    /// Chains of the q4 tile's integer steps (`kernels::x86_avx2::tile_q4`).
    const INT8_CHAINS: usize = 8;

    /// The AVX2 q4 tile's instruction mix: per block of 8 inputs, two `vpmaddubsw` summed
    /// into i16, and per four blocks a `vpmaddwd` widening to i32. Each chain feeds its i16
    /// sum back as an operand (values are meaningless; only the issue rate matters), so
    /// nothing is loop-invariant and 8 chains keep the multipliers busy.
    ///
    /// # Safety
    /// AVX2 required.
    #[target_feature(enable = "avx2")]
    pub unsafe fn int8_maddubs(iters: usize) -> i32 {
        let mut s = [_mm256_set1_epi8(3); INT8_CHAINS];
        let mut acc = [_mm256_setzero_si256(); 2];
        let (w, ones) = (_mm256_set1_epi8(7), _mm256_set1_epi16(1));
        for _ in 0..iters {
            for _ in 0..4 {
                for v in s.iter_mut() {
                    *v = _mm256_add_epi16(*v, _mm256_add_epi16(_mm256_maddubs_epi16(w, *v), _mm256_maddubs_epi16(*v, w)));
                }
            }
            for (c, &v) in s.iter().enumerate() {
                acc[c % 2] = _mm256_add_epi32(acc[c % 2], _mm256_madd_epi16(v, ones));
            }
        }
        let mut lanes = [0i32; 8];
        // SAFETY: `lanes` holds 8 ints.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, _mm256_add_epi32(acc[0], acc[1])) };
        lanes.iter().fold(0, |s, &x| s.wrapping_add(x))
    }

    /// 4 blocks x 2 `vpmaddubsw` x 32 products x 2 ops, per chain.
    pub const OPS_PER_ITER_INT8_AVX2: f64 = (INT8_CHAINS * 4 * 2 * 64) as f64;

    /// # Safety
    /// AVX2 required.
    #[target_feature(enable = "avx2")]
    pub unsafe fn read_avx2(buf: &[u8]) -> u64 {
        let mut acc = [_mm256_setzero_si256(); 4];
        let chunks = buf.len() / 128;
        for c in 0..chunks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: c * 128 + j * 32 + 32 <= buf.len().
                let v = unsafe { _mm256_loadu_si256(buf.as_ptr().add(c * 128 + j * 32) as *const __m256i) };
                *a = _mm256_xor_si256(*a, v);
            }
        }
        let mut lanes = [0u64; 4];
        // SAFETY: `lanes` holds 4 u64.
        unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, acc.iter().fold(_mm256_setzero_si256(), |s, &x| _mm256_xor_si256(s, x))) };
        lanes.iter().fold(0, |s, &x| s ^ x)
    }
}

/// Runs `probe` on `threads` threads at once; returns the summed rate (ops/s).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the peak probes are x86-64 only
fn parallel_rate(threads: usize, ops_per_call: f64, probe: impl Fn() + Sync) -> f64 {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(&probe);
        }
    });
    threads as f64 * ops_per_call / start.elapsed().as_secs_f64()
}

/// Best of five: a peak is a maximum, and on a shared virtual machine a run is sometimes
/// slowed from outside.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn rate(threads: usize, ops_per_call: f64, probe: impl Fn() + Sync + Copy) -> Rate {
    probe(); // warm up (clock ramp, page faults)
    let best = |n: usize| (0..5).map(|_| parallel_rate(n, ops_per_call, probe)).fold(0.0, f64::max);
    Rate { one_thread: best(1), all_threads: best(threads) }
}

pub fn measure(threads: usize) -> Roofline {
    let f = cpu::features();
    let mut r = Roofline {
        threads,
        features: f.describe(),
        f32_flops: Rate::default(),
        bf16_flops: Rate::default(),
        int8_ops: Rate::default(),
        amx_present: f.amx(),
        read_bytes: Rate::default(),
        gemm: GemmRates::default(),
    };
    r.gemm = measure_gemm(threads);
    #[cfg(target_arch = "x86_64")]
    {
        use std::hint::black_box;
        const ITERS: usize = 4_000_000;
        // SAFETY (each probe): called only when the feature it needs was detected.
        // 256-bit FMA: half the lanes of the AVX-512 probe's.
        let f32_avx2 = || {
            rate(threads, ITERS as f64 * probes::OPS_PER_ITER_F32 / 2.0, || {
                black_box(unsafe { probes::f32_fma_avx2(ITERS) });
            })
        };
        if f.avx512() {
            r.f32_flops = rate(threads, ITERS as f64 * probes::OPS_PER_ITER_F32, || {
                black_box(unsafe { probes::f32_fma(ITERS) });
            });
        } else if f.avx2() {
            r.f32_flops = f32_avx2();
        }
        if f.avx512_bf16() {
            r.bf16_flops = rate(threads, ITERS as f64 * probes::OPS_PER_ITER_BF16, || {
                black_box(unsafe { probes::bf16_dot(ITERS) });
            });
        } else if f.avx2() {
            // The AVX2 tiles (bf16 widened to f32) run bf16 activations.
            r.bf16_flops = if f.avx512() { f32_avx2() } else { r.f32_flops };
        }
        if f.avx512_vnni() {
            r.int8_ops = rate(threads, ITERS as f64 * probes::OPS_PER_ITER_INT8, || {
                black_box(unsafe { probes::int8_dot(ITERS) });
            });
        } else if f.avx2() {
            // A quarter of the iterations: each is four blocks.
            r.int8_ops = rate(threads, (ITERS / 4) as f64 * probes::OPS_PER_ITER_INT8_AVX2, || {
                black_box(unsafe { probes::int8_maddubs(ITERS / 4) });
            });
        }
        // Memory last: its large buffer can leave the kernel reclaiming pages for a while.
        if f.avx2() {
            // 128 MiB per thread: far beyond the caches.
            let per = 128usize << 20;
            let buf = vec![1u8; per * threads];
            let one = |i: usize| {
                let part = &buf[i * per..(i + 1) * per];
                black_box(unsafe { if f.avx512() { probes::read(part) } else { probes::read_avx2(part) } });
            };
            one(0);
            let time = |n: usize| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for i in 0..n {
                        s.spawn(move || one(i));
                    }
                });
                (n * per) as f64 / start.elapsed().as_secs_f64()
            };
            r.read_bytes = Rate {
                one_thread: (0..5).map(|_| time(1)).fold(0.0, f64::max),
                all_threads: (0..5).map(|_| time(threads)).fold(0.0, f64::max),
            };
        }
    }
    r
}

impl Roofline {
    /// Peak multiply-add rate (all threads) of the engine a weight layout runs on (bf16:
    /// with bf16 activations; with f32 ones it runs at the f32 rate).
    pub fn peak_for(&self, format: llada_ir::DType, threads: usize) -> f64 {
        use llada_ir::DType::*;
        let pick = |r: Rate| if threads <= 1 { r.one_thread } else { r.all_threads };
        match format {
            PanelBf16 if self.bf16_flops.all_threads > 0.0 => pick(self.bf16_flops),
            PanelQ8 | PanelQ4 { .. } if self.int8_ops.all_threads > 0.0 => pick(self.int8_ops),
            _ => pick(self.f32_flops),
        }
    }

    pub fn bandwidth(&self, threads: usize) -> f64 {
        if threads <= 1 { self.read_bytes.one_thread } else { self.read_bytes.all_threads }
    }
}
