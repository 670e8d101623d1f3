//! `llada-rt roofline`: this machine's measured ceilings.

use clap::Args;
use llada_cli::{outln, Failure};
use llada_rt::params::{env_threads, MAX_THREADS};
use llada_rt::session::default_threads;
use llada_rt_tools::roofline;

use crate::{roofline_threads_flag, Done};

#[derive(Args)]
pub(crate) struct Roofline {
    /// Threads for the all-threads figures, 1 to 1024 [default: every core, or LLADA_THREADS].
    #[arg(long, value_parser = roofline_threads_flag)]
    threads: Option<usize>,
    #[arg(long)]
    json: bool,
}

impl Roofline {
    pub(crate) fn run(self) -> Done {
        let Roofline { threads, json } = self;
        let threads = match threads {
            Some(n) => n,
            None => env_threads(MAX_THREADS).map_err(|e| Failure::Usage(e.to_string()))?.unwrap_or_else(default_threads),
        };
        let r = roofline::measure(threads);
        if json {
            outln!("{}", serde_json::to_string_pretty(&r).expect("the roofline serializes"))?;
        } else {
            let g = |x: f64| x / 1e9;
            // The peak probes exist for x86-64 only; elsewhere they print as not measured.
            let peak = |x: f64| if x > 0.0 { format!("{:>7.1}", x / 1e9) } else { "      -".to_string() };
            outln!("features:      {} (AMX {})", r.features, if r.amx_present { "present, not used" } else { "absent" })?;
            outln!("                 1 thread   {} threads", r.threads)?;
            outln!("f32 FMA:       {}     {}  GFLOP/s", peak(r.f32_flops.one_thread), peak(r.f32_flops.all_threads))?;
            outln!("bf16 dot:      {}     {}  GFLOP/s", peak(r.bf16_flops.one_thread), peak(r.bf16_flops.all_threads))?;
            outln!("int8 dot:      {}     {}  GOP/s", peak(r.int8_ops.one_thread), peak(r.int8_ops.all_threads))?;
            outln!("memory read:   {}     {}  GB/s", peak(r.read_bytes.one_thread), peak(r.read_bytes.all_threads))?;
            outln!("GEMM sustained (median of 6 shapes), {} threads: f32 {:.1}, bf16 {:.1} GFLOP/s; q8 {:.1}, q4 {:.1} GOP/s", r.threads, g(r.gemm.f32), g(r.gemm.bf16), g(r.gemm.q8), g(r.gemm.q4))?;
        }
        Ok(())
    }
}
