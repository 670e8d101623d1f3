//! `llada-rt bench`: forward passes timed op by op against the roofline, and optionally a
//! whole generation.

use std::path::PathBuf;

use clap::Args;
use llada_cli::{outln, Failure};
use llada_rt::params::Limits;
use llada_rt::error::Setting;
use llada_rt::session::{check_threads, default_threads, max_threads};
use llada_rt::{generate, Model};
use llada_rt_tools::roofline;
use serde_json::json;

use crate::{peak_rss_bytes, print_experts, print_mbsd, window_report, Done, SamplerArgs, SessionArgs};

#[derive(Args)]
pub(crate) struct Bench {
    file: PathBuf,
    /// Token rows of the passes to time (each runs on the smallest graph that holds it).
    /// bench's own: the sampler's mbsd --rows (below) is not read here, so a --generate run
    /// of mbsd takes its default.
    #[arg(long, value_delimiter = ',', default_value = "32,64,96,128")]
    rows: Vec<usize>,
    /// Logit rows per pass [default: all rows, as multi-block decoding needs].
    #[arg(long)]
    logit_rows: Option<usize>,
    /// Timed repeats per pass (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = repeats_flag)]
    repeat: usize,
    #[command(flatten)]
    session: SessionArgs,
    /// Also time one generation with these sampler settings from a synthetic prompt.
    #[arg(long)]
    generate: bool,
    /// Prompt length of --generate.
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    #[command(flatten)]
    sampler: SamplerArgs,
    #[arg(long)]
    json: bool,
}

/// `--repeat`: at least one timed run (0 would report a time nothing measured).
fn repeats_flag(s: &str) -> std::result::Result<usize, String> {
    crate::at_least_one(s, "one timed run after the warm-up is the least")
}

impl Bench {
    pub(crate) fn run(self, typed: &dyn Fn(&str) -> bool) -> Done {
        let Bench { file, rows, logit_rows, repeat, session: session_args, generate: time_generation, prompt_len, sampler, json } = self;
        // The sampler's flags (and --prompt-len) time the generation --generate adds:
        // without it they would do nothing. (`--rows` is bench's own.)
        if !time_generation {
            let sampler_flags = <SamplerArgs as Args>::augment_args(clap::Command::new("sampler"));
            let flags = sampler_flags.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).chain(["--prompt-len".to_string()]);
            if let Some(flag) = flags.filter(|f| f != "--rows").find(|f| typed(f)) {
                return Err(Failure::Usage(format!("{flag} sets the generation that --generate times; without --generate it does nothing, so it is refused")));
            }
        }
        // The threads checked against the plan before the roofline runs on them (its buffers
        // grow with them): the header and structure, unverified, say what the plan holds.
        let unverified = Model::open(&file, false)?;
        let plan_threads = max_threads(&unverified);
        // LLADA_THREADS within what the plan provides for, named as itself.
        let threads = session_args.threads(plan_threads)?.unwrap_or_else(|| default_threads().min(plan_threads));
        check_threads(&unverified, Setting::Threads, threads)?;
        drop(unverified);
        let staging = session_args.staging.clone();
        // Before loading: checksumming a large artifact leaves the kernel busy with the
        // page cache for a while, which would disturb the peak measurements.
        let roof = roofline::measure(threads);
        let model = Model::open(&file, true)?;
        let max_len = Limits::of(&model).max_len;
        if let Some(r) = rows.iter().find(|r| !(1..=max_len).contains(*r)) {
            return Err(Failure::Usage(format!("--rows {r} is outside 1..={max_len} (the positions {} serves)", file.display())));
        }
        // Logit rows given are a pass's (a pass of fewer rows returns all of its own): at most
        // the most rows any pass has.
        if let (Some(l), Some(&r)) = (logit_rows, rows.iter().max()) {
            if l == 0 || l > r {
                return Err(Failure::Usage(format!("--logit-rows {l} is outside 1..={r} (the most rows of a pass, --rows)")));
            }
        }
        let params = if time_generation { Some(sampler.checked_params(&model, &|f: &str| f != "--rows" && typed(f))?) } else { None };
        let mut session = SessionArgs { threads: Some(threads), ..session_args }.open(&model)?;
        let mut passes = Vec::new();
        if let (Some(_), true) = (model.diffusion_gemma(), logit_rows.is_some()) {
            return Err(Failure::Usage("--logit-rows: a DiffusionGemma decoder pass computes the logits of its whole canvas, so it is refused".into()));
        }
        for &r in &rows {
            // (DiffusionGemma: `r` is the prompt before the canvas; the canvas has its logits.)
            let pass_logit_rows = if model.diffusion_gemma().is_some() {
                r
            } else {
                let capacity = session.logit_capacity(r)?;
                if let Some(l) = logit_rows.map(|l| l.min(r)).filter(|&l| l > capacity) {
                    return Err(Failure::Usage(format!("--logit-rows {l}: the graph of {r} rows returns at most {capacity} (lladac compile --logit-rows)")));
                }
                logit_rows.unwrap_or(r).min(r).min(capacity)
            };
            passes.push(llada_rt_tools::bench::pass(&mut session, &roof, r, pass_logit_rows, repeat)?);
        }
        let generation = if let Some(params) = &params {
            let prompt = llada_rt_tools::bench::spread_tokens(&model, prompt_len, 104_729, 7);
            Some(generate(&mut session, &prompt, params, &mut |_| {})?)
        } else {
            None
        };
        if json {
            let g = generation.as_ref().map(|g| json!({"seconds": g.seconds, "forward_passes": g.forward_passes, "rows_computed": g.rows_computed, "mbsd": g.mbsd}));
            outln!(
                "{}",
                serde_json::to_string_pretty(&json!({"artifact": file, "threads": threads, "backend": session.backend(), "roofline": roof, "passes": passes, "generation": g, "window": window_report(&session), "peak_rss_bytes": peak_rss_bytes()}))
                    .expect("serializes")
            )?;
        } else {
            let b = session.backend();
            let op_times = if b.device_timestamps { "op times from device timestamps" } else { "op times from the host clock" };
            let cpu_note = if b.runs_on_cpu && b.backend != "host" { "; it runs on this CPU (a CPU implementation or a simulator): these are CPU figures, not the device's" } else { "" };
            outln!("backend {}: {} ({op_times}{cpu_note})", b.backend, b.device)?;
            outln!("{} on {} thread(s); roofline: f32 {:.0} / bf16 {:.0} GFLOP/s, int8 {:.0} GOP/s, read {:.1} GB/s", file.display(), threads,
                roof.f32_flops.all_threads / 1e9, roof.bf16_flops.all_threads / 1e9, roof.int8_ops.all_threads / 1e9, roof.read_bytes.all_threads / 1e9)?;
            for p in &passes {
                if let Some(e) = p.encoder {
                    outln!("\nDiffusionGemma: an encoder pass over a prompt of {} rows took {:.4} s, then a decoder pass over the canvas:", e.prompt_rows, e.seconds)?;
                }
                if p.by_op.is_empty() {
                    // An ahead-of-time backend: one executable a pass, no op of ours timed.
                    outln!("\nrows {} (graph {}, {} logit rows): {:.4} s (one executable; no roofline bound without op times)", p.rows, p.graph, p.logit_rows, p.seconds)?;
                } else {
                    outln!("\nrows {} (graph {}, {} logit rows): {:.4} s, roofline bound {:.4} s, ratio {:.2}", p.rows, p.graph, p.logit_rows, p.seconds, p.bound_seconds, p.ratio)?;
                }
                outln!("  staging ({}): {:.1} MiB staged, {:.4} s stalled, overlap {:.2}", staging, p.staged_bytes as f64 / (1u64 << 20) as f64, p.stall_seconds, p.overlap)?;
                let ops: Vec<String> = p.by_op.iter().map(|(k, v)| format!("{k} {:.4}", v)).collect();
                if !ops.is_empty() {
                    outln!("  by op (s): {}", ops.join(", "))?;
                }
                for g in &p.gemms {
                    outln!("  {:<12} {:>6} x {:>5} x {:>6} (x{:>2}) {:>9.5} s  {:>7.1} GFLOP/s {:>6.1} GB/s  bound {:>9.5} s  ratio {:.2}",
                        g.format, g.rows, g.k, g.n, g.count, g.seconds, g.flops_per_second / 1e9, g.bytes_per_second / 1e9, g.bound_seconds, g.ratio)?;
                }
            }
            if let Some(g) = &generation {
                outln!("\ngeneration: {:.2} s, {} forward passes, {} rows", g.seconds, g.forward_passes, g.rows_computed)?;
                if let Some(m) = &g.mbsd {
                    print_mbsd(m)?;
                }
            }
            print_experts(&session)?;
        }
        Ok(())
    }
}
