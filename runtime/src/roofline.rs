//! `llada-rt roofline`: this machine's ceilings, measured: peak multiply-add rates of each
//! engine the kernels use (f32 FMA, bf16 pair dot, int8 quad dot) and memory read bandwidth,
//! on one thread and on all threads. The bench compares every kernel with these.

use std::time::Instant;

use serde::Serialize;

use crate::kernels::cpu;

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
    /// FLOP/s of AVX-512 BF16 `vdpbf16ps`.
    pub bf16_flops: Rate,
    /// Integer ops/s (2 per multiply-add) of AVX-512 VNNI `vpdpbusd`.
    pub int8_ops: Rate,
    /// AMX is not used by this build; reported so a reader knows whether it was there.
    pub amx_present: bool,
    /// Bytes/s of streaming reads from memory.
    pub read_bytes: Rate,
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
}

/// Runs `probe` on `threads` threads at once; returns the summed rate (ops/s).
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
        amx_present: f.amx,
        read_bytes: Rate::default(),
    };
    #[cfg(target_arch = "x86_64")]
    {
        use std::hint::black_box;
        const ITERS: usize = 4_000_000;
        // SAFETY (each probe): called only when the feature it needs was detected.
        if f.avx512 {
            r.f32_flops = rate(threads, ITERS as f64 * probes::OPS_PER_ITER_F32, || {
                black_box(unsafe { probes::f32_fma(ITERS) });
            });
        }
        if f.avx512_bf16 {
            r.bf16_flops = rate(threads, ITERS as f64 * probes::OPS_PER_ITER_BF16, || {
                black_box(unsafe { probes::bf16_dot(ITERS) });
            });
        }
        if f.avx512_vnni {
            r.int8_ops = rate(threads, ITERS as f64 * probes::OPS_PER_ITER_INT8, || {
                black_box(unsafe { probes::int8_dot(ITERS) });
            });
        }
        // Memory last: its large buffer can leave the kernel reclaiming pages for a while.
        if f.avx512 {
            // 128 MiB per thread: far beyond the caches.
            let per = 128usize << 20;
            let buf = vec![1u8; per * threads];
            let one = |i: usize| {
                black_box(unsafe { probes::read(&buf[i * per..(i + 1) * per]) });
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
    /// Peak multiply-add rate (all threads) of the engine a weight layout runs on.
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
