use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, Args, Parser, Subcommand};
use llada_cli::{out, outln, Failure};
use llada_rt::params::{env_threads, unused_setting, Limits, MAX_THREADS};
use llada_rt::sampler::{Alg, Policy, Revision, StepView};
use llada_rt::text::Text;
use llada_rt::moe::{ExpertCounters, ExpertStrategy};
use llada_rt::session::{default_threads, max_threads};
use llada_rt::staging::StagingMode;
use llada_rt::{generate, generate_until, Error, Model, Remasking, Result, SamplerParams, Session, SessionParams};
use llada_rt_tools::{conformance, golden, roofline};
use serde_json::json;

/// What a command, or a part of one that prints, ends with: its error, a usage error, or
/// stdout's (see `llada_cli::Failure`).
type Done = std::result::Result<(), Failure<Error>>;

#[derive(Parser)]
#[command(name = "llada-rt", version, about = "Run a compiled llada artifact")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Every default is the library's (`SamplerParams`, `SessionParams`): none is written here.
fn defaults() -> SamplerParams {
    SamplerParams::default()
}

/// `serve`'s defaults are the server's (`llada_serve::Config`).
fn serve_defaults() -> llada_serve::Config {
    llada_serve::Config::default()
}

/// The sampler's flags: each maps to the field of `SamplerParams` it names, whose
/// `Default` gives the defaults shown in `--help`.
#[derive(Args, Clone)]
struct SamplerArgs {
    /// Tokens to generate.
    #[arg(long, default_value_t = defaults().gen_length)]
    gen_len: usize,
    /// Semi-autoregressive block length (gen-len must be a multiple of it) [default: the
    /// block length the artifact was compiled for].
    #[arg(long)]
    block_len: Option<usize>,
    /// Denoising steps over all blocks (a multiple of the number of blocks) [default: 128].
    /// LLaDA 2.x: steps per block, as its published generate counts them [default: 32].
    #[arg(long)]
    steps: Option<usize>,
    /// 0 = most likely token; above 0, Gumbel-max sampling.
    #[arg(long, default_value_t = defaults().temperature, allow_hyphen_values = true)]
    temperature: f64,
    /// Seed of the sampling noise.
    #[arg(long, default_value_t = defaults().seed)]
    seed: u64,
    /// Classifier-free guidance scale (0 = off).
    #[arg(long, default_value_t = defaults().cfg_scale, allow_hyphen_values = true)]
    cfg: f64,
    /// Which masked positions to commit first.
    #[arg(long, default_value = defaults().remasking.name(), value_parser = clap::builder::PossibleValuesParser::new(Remasking::NAMES.iter().copied()))]
    remasking: String,
    /// Never predict end-of-text (the official `logits_eos_inf`).
    #[arg(long)]
    logits_eos_inf: bool,
    /// Give end-of-text/end-of-turn predictions zero confidence (the official `confidence_eos_eot_inf`).
    #[arg(long)]
    confidence_eos_eot_inf: bool,
    /// Which rows each pass recomputes: exact (whole sequence), prefix (block and suffix,
    /// prefix cached), dual (block only, prefix and suffix cached), spec (prefix, plus drafts
    /// of the next blocks confirmed once their block is current), mbsd (multi-block
    /// speculative decoding on the plan's row buckets: the block's masked rows, idle rows
    /// drafting the next blocks). LLaDA 2.x: exact (its published generate, a pass over the
    /// block each call) or mbsd (the block's masked and stale rows, drafts of the next block).
    #[arg(long, default_value = defaults().policy.name(), value_parser = clap::builder::PossibleValuesParser::new(Policy::NAMES.iter().copied()))]
    policy: String,
    /// Cached policies: refresh the whole cache every N steps of a block (0 = at each block's start only).
    #[arg(long, default_value_t = defaults().refresh_every)]
    refresh_every: usize,
    /// Commit every masked token of the block at or above this confidence (at least one) per step.
    #[arg(long, allow_hyphen_values = true)]
    threshold: Option<f32>,
    /// spec, mbsd: blocks drafted ahead of the current one [default: spec 1, mbsd the
    /// artifact's compiled speculation depth].
    #[arg(long)]
    spec_blocks: Option<usize>,
    /// spec, mbsd: confidence a draft needs when its block becomes current.
    #[arg(long, default_value_t = defaults().spec_threshold, allow_hyphen_values = true)]
    spec_threshold: f32,
    /// mbsd: fewest rows a dense pass computes [default: the plan's smallest latency bucket].
    #[arg(long)]
    rows: Option<usize>,
    /// mbsd: committed tokens stay revisable and a CPU side path re-checks them (dual-path),
    /// commits are final (off), or auto: dual-path where the dense path leaves the CPU free
    /// (a GPU), off where it runs on the same cores (the host backend, lavapipe).
    #[arg(long, default_value = defaults().revision.name(), value_parser = clap::builder::PossibleValuesParser::new(Revision::NAMES.iter().copied()))]
    revision: String,
    /// mbsd revision: rows of one side-path pass, two per checked token [default: the plan's
    /// smallest latency bucket].
    #[arg(long)]
    side_rows: Option<usize>,
    /// mbsd revision: an agreeing check at or above this confidence makes a token stable.
    #[arg(long, default_value_t = defaults().stable_confidence, allow_hyphen_values = true)]
    stable_confidence: f32,
    /// mbsd revision: this many agreeing checks make a token stable.
    #[arg(long, default_value_t = defaults().stable_checks)]
    stable_checks: u32,
    /// mbsd revision: a disagreeing check at or above this confidence revises the token.
    #[arg(long, default_value_t = defaults().revise_confidence, allow_hyphen_values = true)]
    revise_confidence: f32,
    /// Dream: the confidence rule of its sampler (LLaDA models take --remasking).
    #[arg(long, default_value = defaults().alg.name(), value_parser = clap::builder::PossibleValuesParser::new(Alg::NAMES.iter().copied()))]
    alg: String,
    /// Dream: its schedule runs from timestep 1 down to this.
    #[arg(long, default_value_t = defaults().eps, allow_hyphen_values = true)]
    eps: f64,
    /// Dream and LLaDA 2.x: nucleus filtering of each prediction, (0, 1].
    #[arg(long, allow_hyphen_values = true)]
    top_p: Option<f64>,
    /// Dream and LLaDA 2.x: keep only the k most likely tokens of each prediction.
    #[arg(long)]
    top_k: Option<usize>,
    /// LLaDA 2.x: stop at the step that commits EOS once every position before it is
    /// committed, instead of after EOS's block (the published `eos_early_stop`); with
    /// --editing-threshold (2.1's generate), after the block holding EOS instead of after
    /// every block (the output is the same; the calls are fewer).
    #[arg(long)]
    eos_early_stop: bool,
    /// LLaDA 2.1: its generate's token editing (the published default is 0.9): each model
    /// call also replaces a committed token of the block whose new prediction differs with a
    /// confidence above this, and commits by --threshold alone (at least one token a call; no
    /// --steps). Unset: LLaDA 2.0's generate.
    #[arg(long, allow_hyphen_values = true)]
    editing_threshold: Option<f32>,
    /// LLaDA 2.1 editing: the most model calls a block takes after its last mask is committed.
    #[arg(long, default_value_t = defaults().max_post_steps)]
    max_post_steps: usize,
    /// Dream: draw the positions a step commits from the softmax of their confidences over
    /// this temperature, instead of taking the most confident.
    #[arg(long, allow_hyphen_values = true)]
    alg_temp: Option<f64>,
}

impl SamplerArgs {
    /// The settings, with the artifact's plan filling what was not given.
    fn params(&self, model: &Model) -> SamplerParams {
        let policy = Policy::parse(&self.policy).expect("clap restricts the values");
        let defaults = SamplerParams::for_model(model, self.gen_len, self.block_len, policy);
        SamplerParams {
            gen_length: self.gen_len,
            block_length: defaults.block_length,
            steps: self.steps.unwrap_or(defaults.steps),
            temperature: self.temperature,
            cfg_scale: self.cfg,
            remasking: Remasking::parse(&self.remasking).expect("clap restricts the values"),
            seed: self.seed,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
            policy,
            refresh_every: self.refresh_every,
            threshold: self.threshold,
            spec_blocks: self.spec_blocks.unwrap_or(defaults.spec_blocks),
            spec_threshold: self.spec_threshold,
            rows: self.rows,
            revision: Revision::parse(&self.revision).expect("clap restricts the values"),
            side_rows: self.side_rows,
            stable_confidence: self.stable_confidence,
            stable_checks: self.stable_checks,
            revise_confidence: self.revise_confidence,
            alg: Alg::parse(&self.alg).expect("clap restricts the values"),
            eps: self.eps,
            top_p: self.top_p,
            top_k: self.top_k,
            alg_temp: self.alg_temp,
            eos_early_stop: self.eos_early_stop,
            editing_threshold: self.editing_threshold,
            max_post_steps: self.max_post_steps,
        }
    }

    /// [`params`](Self::params), each setting checked against its range and the plan's
    /// limits, then refused if it was typed (`typed`, by flag) under a policy that does not
    /// use it (`llada_rt::params::POLICY_SETTINGS`): it would do nothing.
    fn checked_params(&self, model: &Model, typed: &dyn Fn(&str) -> bool) -> std::result::Result<SamplerParams, Failure<Error>> {
        let params = self.params(model);
        params.validate(&Limits::of(model))?;
        match unused_setting(&params, typed) {
            Some(refusal) => Err(Failure::Usage(refusal)),
            None => Ok(params),
        }
    }
}

/// Whether the flag `--name` of the subcommand in `matches` was typed (not left at its
/// default): clap's source of the value of `name`'s id.
fn typed(matches: &ArgMatches) -> impl Fn(&str) -> bool + '_ {
    move |flag: &str| {
        llada_cli::typed(matches, &flag.trim_start_matches("--").replace('-', "_"))
    }
}

/// `--logit-tolerance`: a finite number, at least 0.
fn tolerance_flag(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t >= 0.0 && t.is_finite() => Ok(t),
        Ok(t) => Err(format!("{t} must be a finite number >= 0")),
        Err(e) => Err(format!("not a number: {e}")),
    }
}

/// `--threads`: a count of at least 1 (0 would mean nothing to run on).
fn threads_flag(s: &str) -> std::result::Result<usize, String> {
    at_least_one(s, "omit --threads to use every core")
}

/// `--sessions`: a count in 1..=64 (each session holds a window of the model's).
fn sessions_flag(s: &str) -> std::result::Result<usize, String> {
    match at_least_one(s, "one session serves requests one at a time")? {
        n if n > 64 => Err(format!("{n} is outside 1..=64")),
        n => Ok(n),
    }
}

/// `--cpu-threads`: a count of at least 1.
fn cpu_threads_flag(s: &str) -> std::result::Result<usize, String> {
    at_least_one(s, "omit --cpu-threads for one")
}

/// `roofline --threads`: a count in `1..=MAX_THREADS` (no plan bounds it there).
fn roofline_threads_flag(s: &str) -> std::result::Result<usize, String> {
    match at_least_one(s, "omit --threads to use every core")? {
        n if n > MAX_THREADS => Err(format!("{n} is outside 1..={MAX_THREADS}")),
        n => Ok(n),
    }
}

/// A count of at least 1, or why not (with what to do instead of 0: `instead`).
fn at_least_one(s: &str, instead: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err(format!("must be at least 1 ({instead})")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("not a whole number: {e}")),
    }
}

/// The subcommands with sampler options take negative numbers as values (`--cfg -1`), so that
/// the sampler's validation names the flag and its range instead of clap reporting an unknown
/// argument.
#[derive(Subcommand)]
enum Command {
    /// Generate from a prompt.
    #[command(allow_negative_numbers = true)]
    Run {
        /// The artifact (from `lladac compile`).
        file: PathBuf,
        /// Prompt text.
        #[arg(short, long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
        prompt: Option<String>,
        /// Apply the model's chat template to the prompt (one user turn); not with
        /// --prompt-ids, which are token ids as given.
        #[arg(long, requires = "prompt", conflicts_with = "prompt_ids")]
        chat: bool,
        /// Prompt as comma-separated token ids.
        #[arg(long)]
        prompt_ids: Option<String>,
        #[command(flatten)]
        sampler: SamplerArgs,
        /// Print one JSON object (ids, reveals, text, counters) instead of streaming text.
        #[arg(long)]
        json: bool,
        /// Redraw the whole canvas after every step, masks and all.
        #[arg(long, conflicts_with = "json")]
        show_denoising: bool,
        /// Write a Chrome/Perfetto trace of the run (dense passes, waits, staging copies).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Time every op of every pass and print the sums by op, and the matmuls' by shape
        /// and rows (with --json: as "op_profile"). Timing each op costs a little time.
        #[arg(long)]
        op_profile: bool,
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Serve the artifact over HTTP: OpenAI's chat and completion endpoints (streamed as
    /// Server-Sent Events), /v1/models, /health, and a live view of the denoising at /.
    Serve {
        /// The artifact (from `lladac compile`).
        file: PathBuf,
        /// Address to listen on (0.0.0.0 for every interface).
        #[arg(long, default_value_t = serve_defaults().host)]
        host: String,
        /// Port to listen on (0: any free port, printed when ready).
        #[arg(long, default_value_t = serve_defaults().port)]
        port: u16,
        /// Sessions generating at once, each with its own window on the one mapped model;
        /// without --threads the cores are shared out among them.
        #[arg(long, default_value_t = serve_defaults().sessions, value_parser = sessions_flag)]
        sessions: usize,
        /// Requests that may wait for a session, 0 to 4096; more are refused with 429.
        #[arg(long, default_value_t = serve_defaults().queue as u16, value_parser = clap::value_parser!(u16).range(0..=4096))]
        queue: u16,
        /// Require `Authorization: Bearer KEY` on /v1/ (default: LLADA_API_KEY, else none).
        #[arg(long)]
        api_key: Option<String>,
        /// Largest request body, in bytes.
        #[arg(long, default_value_t = serve_defaults().max_body)]
        max_body: usize,
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Measure this machine's ceilings: peak f32, bf16 and int8 rates and memory bandwidth.
    Roofline {
        /// Threads for the all-threads figures, 1 to 1024 [default: every core, or LLADA_THREADS].
        #[arg(long, value_parser = roofline_threads_flag)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Load Qualcomm's QNN HTP library and report what it is (provider, API versions, build),
    /// with a backend instance created and freed: the check that the NPU backend's library is
    /// usable here.
    #[cfg(all(feature = "qnn", not(target_env = "musl")))]
    QnnInfo {
        /// Folder holding libQnnHtp.so and libQnnSystem.so [default: LLADA_QNN_LIB].
        #[arg(long)]
        qnn_lib: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Time forward passes op by op against the roofline, and optionally a whole generation.
    #[command(allow_negative_numbers = true)]
    Bench {
        file: PathBuf,
        /// Token rows of the passes to time (each runs on the smallest graph that holds it).
        #[arg(long, value_delimiter = ',', default_value = "32,64,96,128")]
        rows: Vec<usize>,
        /// Logit rows per pass [default: all rows, as multi-block decoding needs].
        #[arg(long)]
        head_rows: Option<usize>,
        /// Timed repeats per pass (the median is reported).
        #[arg(long, default_value_t = 5)]
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
    },
    /// Accuracy and cost of the sampler on a file of tasks.
    #[command(allow_negative_numbers = true)]
    Eval {
        /// The artifact.
        file: PathBuf,
        /// Tasks, one JSON object per line: {"prompt" | "prompt_ids", "expected", "chat"?}.
        #[arg(long)]
        tasks: PathBuf,
        #[command(flatten)]
        sampler: SamplerArgs,
        /// A previous `eval --json` output to compare with token for token.
        #[arg(long)]
        reference: Option<PathBuf>,
        /// Print one JSON object (summary and per-task outputs): usable as a --reference.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        session: SessionArgs,
    },
    /// Replay this project's own golden outputs (tests/golden/embedded.json) with an
    /// artifact, or write them again for another artifact with --write.
    Golden {
        /// A golden file (its prompts, settings, outputs and first-pass logits).
        golden: PathBuf,
        /// The artifact to replay it with.
        #[arg(long)]
        model: PathBuf,
        #[command(flatten)]
        select: SelectArgs,
        /// Instead of comparing, write the selected cases and every logit case as this
        /// artifact produces them, to this file (to pin another weight format, then replay
        /// it on another machine).
        #[arg(long, conflicts_with = "tokens_only")]
        write: Option<PathBuf>,
        #[command(flatten)]
        backend: BackendArg,
        /// Require the output tokens (and logits) only; count reveal orders without requiring
        /// them (for quantised artifacts on another instruction set: see `llada_rt_tools::golden::Pin`).
        #[arg(long)]
        tokens_only: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// How far an artifact is from a reference compiled from the same checkpoint (a quantised
    /// one against the unquantised): first-pass logit error, top-1 and generated-token
    /// agreement, and the time of each generation.
    #[command(allow_negative_numbers = true)]
    Compare {
        /// The reference artifact.
        reference: PathBuf,
        /// The artifact to measure against it.
        other: PathBuf,
        /// Prompt as comma-separated token ids.
        #[arg(long)]
        prompt_ids: String,
        #[command(flatten)]
        sampler: SamplerArgs,
        #[command(flatten)]
        session: SessionArgs,
        /// The reference's backend [default: --backend's]: e.g. an NPU artifact on qnn
        /// against the f32 host artifact on host.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(llada_rt::executor::names()))]
        reference_backend: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Check the runtime against a golden file from the official sampler.
    Conformance {
        /// golden.json (schema: the conformance kit's README).
        golden: PathBuf,
        /// The artifact compiled from the golden file's checkpoint.
        #[arg(long)]
        model: PathBuf,
        #[command(flatten)]
        select: SelectArgs,
        #[command(flatten)]
        backend: BackendArg,
        /// Largest absolute error allowed on the first-pass logits.
        #[arg(long, default_value_t = conformance::LOGIT_TOLERANCE, value_parser = tolerance_flag, allow_hyphen_values = true)]
        logit_tolerance: f64,
        /// Pass when every case that left the golden trajectory did so at a decision closer,
        /// by the host's f32 margins there, than twice the first-pass logit error (a backend
        /// computing in fp16, such as qnn); each is listed as DIVERGED either way.
        #[arg(long)]
        accept_explained: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// What runs the dense graphs.
#[derive(Args, Clone)]
struct BackendArg {
    /// The backend that runs the dense graphs, by name (each is described below).
    #[arg(long, default_value = SessionParams::default().backend.name, value_parser = clap::builder::PossibleValuesParser::new(llada_rt::executor::names()), long_help = backends_help())]
    backend: String,
}

/// `--backend`'s long help: every registered backend and what it runs on.
fn backends_help() -> String {
    let mut help = String::from("The backend that runs the dense graphs:");
    for b in llada_rt::executor::BACKENDS {
        help += &format!("\n  {}: {}{}", b.name, b.about, if b.built() { "" } else { " (not in this build)" });
    }
    help
}

impl BackendArg {
    fn kind(&self) -> &'static llada_rt::executor::Backend {
        llada_rt::executor::find(&self.backend).expect("clap restricts the values")
    }

    /// A session on `model` on this backend, every other option at its default.
    fn open<'m>(&self, model: &'m Model) -> Result<Session> {
        Session::open(model, &SessionParams { backend: self.kind(), ..SessionParams::default() })
    }
}

/// How a session runs: its backend, its threads, its staging and, for a mixture-of-experts
/// model, where the experts run.
#[derive(Args, Clone)]
struct SessionArgs {
    #[command(flatten)]
    backend: BackendArg,
    /// Worker threads of the accelerator path, at least 1 [default: every core, or LLADA_THREADS].
    #[arg(long, value_parser = threads_flag)]
    threads: Option<usize>,
    /// How rotating weights reach their window slots: async (a staging thread copies
    /// ahead, as the plan schedules) or sync (each copied right before its first op).
    #[arg(long, default_value = SessionParams::default().staging.name(), value_parser = ["async", "sync"])]
    staging: String,
    /// Mixture-of-experts models: where experts run. hybrid: a score-ranked expert cache in
    /// the window, refreshed from the last pass's routing and prefetched from the next
    /// layer's predicted routing, each layer's experts split between the accelerator and CPU
    /// paths by the cost model; lru: all on the accelerator, least-recently-used cache, no
    /// prefetch; static: all on the CPU path [default: hybrid].
    #[arg(long, value_parser = ["hybrid", "lru", "static"])]
    experts: Option<String>,
    /// Mixture-of-experts models: threads of the CPU path, which computes experts beside the
    /// accelerator path [default: 1].
    #[arg(long, value_parser = cpu_threads_flag)]
    cpu_threads: Option<usize>,
}

impl SessionArgs {
    /// The thread count: `--threads`, else `LLADA_THREADS` (refused, naming it, outside
    /// `1..=max`), else `None` (every core).
    fn threads(&self, max: usize) -> std::result::Result<Option<usize>, Failure<Error>> {
        match self.threads {
            Some(n) => Ok(Some(n)),
            None => env_threads(max).map_err(|e| Failure::Usage(e.to_string())),
        }
    }

    /// The session settings these flags give on `model`.
    fn params(&self, model: &Model) -> std::result::Result<SessionParams, Failure<Error>> {
        let d = SessionParams::default();
        Ok(SessionParams {
            backend: self.backend.kind(),
            threads: self.threads(max_threads(model))?,
            staging: StagingMode::parse(&self.staging).expect("clap restricts the values"),
            experts: self.experts.as_deref().map(|e| ExpertStrategy::parse(e).expect("clap restricts the values")),
            cpu_threads: self.cpu_threads.or(d.cpu_threads),
        })
    }

    /// A session on `model` as these options say; expert options on a dense model are an error.
    fn open<'m>(&self, model: &'m Model) -> std::result::Result<Session, Failure<Error>> {
        Ok(Session::open(model, &self.params(model)?)?)
    }
}

/// Which cases of a golden file to replay.
#[derive(Args)]
struct SelectArgs {
    /// Replay every Nth case only (a spread sample, for slow machines and emulators).
    #[arg(long, default_value_t = 1)]
    every: usize,
    /// With --every N: start at this case (0..N), so N runs with offsets 0..N cover the file.
    #[arg(long, default_value_t = 0)]
    offset: usize,
}

impl SelectArgs {
    fn selection(&self) -> Result<conformance::Selection> {
        conformance::Selection::new(self.every, self.offset)
    }
}

/// The window and what staging cost, over the session's passes.
/// This process's peak resident memory (`VmHWM` of /proc/self/status, Linux and Android);
/// `None` where the system has no such file.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn window_report(session: &Session) -> serde_json::Value {
    let c = &session.counters;
    let w = &session.model.header.plan.window;
    let passes = c.forward_passes.max(1) as f64;
    json!({
        "bytes": session.window_bytes(),
        "kv_dtype": w.kv_dtype.name(),
        "resident_segments": w.resident.len(),
        "rotating_segments": w.rotating.len(),
        "slots": w.slots.len(),
        "load_seconds": session.load_seconds,
        "staging": session.staging_mode().name(),
        "staged_bytes": c.staged_bytes,
        "stall_seconds": c.stall_seconds,
        "copy_seconds": c.copy_seconds,
        "overlap": c.overlap(),
        "per_pass": {"staged_bytes": c.staged_bytes as f64 / passes, "stall_seconds": c.stall_seconds / passes},
        "experts": session.expert_counters().map(|x| expert_report(session, &x)),
        "npu_context_loads": {"contexts": c.context_loads, "bytes": c.context_load_bytes, "seconds": c.context_load_seconds, "overlapped": c.context_loads_overlapped, "wait_seconds": c.context_load_wait_seconds},
    })
}

/// What the experts cost, over the session's passes.
fn expert_report(session: &Session, x: &ExpertCounters) -> serde_json::Value {
    let passes = session.counters.forward_passes.max(1) as f64;
    let plan = &session.model.header.plan.window.experts;
    json!({
        "strategy": session.expert_strategy().map(ExpertStrategy::name),
        "slots_per_layer": plan.slots_per_layer,
        "experts_per_layer": plan.per_layer,
        "hit_rate": x.hit_rate(),
        "counters": x,
        "per_pass": {
            "staged_bytes": x.staged_bytes as f64 / passes,
            "stall_seconds": x.stall_seconds / passes,
            "cpu_wait_seconds": x.cpu_wait_seconds / passes,
            "accelerator_experts": x.accelerator_experts as f64 / passes,
            "cpu_experts": x.cpu_experts as f64 / passes,
        },
    })
}

/// The experts' figures, for people.
fn print_experts(session: &Session) -> Done {
    if let Some(x) = session.expert_counters() {
        let passes = session.counters.forward_passes.max(1) as f64;
        outln!(
            "experts ({}):      hit rate {:.3}, per pass {:.1} on the accelerator / {:.1} on the CPU path, {:.1} MiB staged, {:.4} s stalled on copies, {:.4} s waiting for the CPU path",
            session.expert_strategy().map_or("-", ExpertStrategy::name),
            x.hit_rate(),
            x.accelerator_experts as f64 / passes,
            x.cpu_experts as f64 / passes,
            x.staged_bytes as f64 / passes / (1u64 << 20) as f64,
            x.stall_seconds / passes,
            x.cpu_wait_seconds / passes
        )?;
    }
    Ok(())
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| Error::request(format!("--prompt-ids: '{t}' is not a token id"))))
        .collect()
}

/// Streams the answer as far as it can no longer change (diffusion commits out of order, and
/// under revision a committed token may still be replaced, so only the settled prefix is
/// printed; the rest follows at the end), or redraws the canvas with `--show-denoising`.
struct Display<'t> {
    text: &'t Text,
    mask: u32,
    denoising: bool,
    printed: String,
    canvas_lines: usize,
    /// Why stdout refused a step: the generation stops there.
    failed: Option<std::io::Error>,
}

impl Display<'_> {
    /// Shows step `v`; once stdout fails, keeps its error and breaks off the generation.
    fn step(&mut self, v: &StepView) -> ControlFlow<()> {
        match self.show(v) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                self.failed = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    fn show(&mut self, v: &StepView) -> std::io::Result<()> {
        use llada_cli::print_stdout;
        let generated = v.generated();
        if self.denoising {
            let shown: String = generated
                .iter()
                .map(|&t| if t == self.mask { "░".to_string() } else { self.text.decode(&[t], false) })
                .collect();
            let up = if self.canvas_lines > 0 { format!("\x1b[{}F\x1b[J", self.canvas_lines) } else { String::new() };
            print_stdout(format_args!("{up}step {}/{}\n{shown}", v.step, v.steps), true)?;
            self.canvas_lines = 2 + shown.matches('\n').count();
        } else {
            let text = self.text.settled_answer(&generated[..v.settled]);
            // Print only what extends what is already shown.
            if let Some(new) = text.strip_prefix(self.printed.as_str()) {
                if !new.is_empty() {
                    print_stdout(format_args!("{new}"), false)?;
                    self.printed = text;
                }
            }
        }
        Ok(())
    }
}

fn run(cli: Cli, matches: &ArgMatches) -> Done {
    let typed = typed(matches);
    match cli.command {
        Command::Compare { reference, other, prompt_ids, sampler, session: session_args, reference_backend, json } => {
            let (a, b) = (Model::open(&reference, true)?, Model::open(&other, true)?);
            let params = sampler.checked_params(&a, &typed)?;
            let mut reference_args = session_args.clone();
            if let Some(backend) = reference_backend {
                reference_args.backend.backend = backend;
            }
            let c = llada_rt_tools::compare::compare(&mut reference_args.open(&a)?, &mut session_args.open(&b)?, &parse_ids(&prompt_ids)?, &params)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&c).expect("serializes"))?;
            } else {
                outln!("{} against {}:", other.display(), reference.display())?;
                outln!("  first pass: logit error {:.3e} (L2, relative), largest {:.3e} (of the largest logit); top-1 agreement {:.1}%",
                    c.logit_relative_error, c.logit_max_error, 100.0 * c.top1_agreement)?;
                outln!("  generation: {:.1}% of tokens the same; {:.2} s against {:.2} s", 100.0 * c.token_agreement, c.other_seconds, c.reference_seconds)?;
            }
        }
        Command::Run { file, prompt, chat, prompt_ids, sampler, json, show_denoising, trace, op_profile, session: session_args } => {
            if let Some(path) = &trace {
                llada_ir::files::check_destination(path, &[&file]).map_err(|e| Error::io(path, e))?;
            }
            let model = Model::open(&file, true)?;
            let text = Text::new(&model.header.tokenizer, &model.header.special)?;
            let ids = match (&prompt, &prompt_ids) {
                (Some(p), _) if chat => text.encode_chat(p)?,
                (Some(p), _) => text.encode(p)?,
                (None, Some(s)) => parse_ids(s)?,
                (None, None) => unreachable!("clap requires one of them"),
            };
            let params = sampler.checked_params(&model, &typed)?;
            let mut session = session_args.open(&model)?;
            let timeline = trace.as_ref().map(|_| std::sync::Arc::new(llada_rt::trace::Trace::default()));
            if let Some(t) = &timeline {
                session.set_trace(t.clone());
            }
            session.profile_ops(op_profile);
            let mut display = Display { text: &text, mask: model.header.special.mask, denoising: show_denoising, printed: String::new(), canvas_lines: 0, failed: None };
            let g = if json {
                generate(&mut session, &ids, &params, &mut |_| {})
            } else {
                generate_until(&mut session, &ids, &params, &mut |v| display.step(v))
            };
            // A stream stdout stopped taking stopped the generation (`Error::Cancelled`).
            if let Some(e) = display.failed.take() {
                return Err(Failure::Stdout(e));
            }
            let g = g?;
            if let (Some(path), Some(t)) = (&trace, &timeline) {
                t.write(path, &[&file]).map_err(|e| Error::io(path, e))?;
            }
            let answer = text.answer(&g.output_ids);
            let ops = op_profile.then(|| llada_rt_tools::profile::split(&model, &session.take_op_profiles()));
            if json {
                let mut obj = json!({
                    "prompt_ids": g.prompt_ids,
                    "output_ids": g.output_ids,
                    "reveals": g.reveals,
                    "text": answer,
                    "decoded": text.decode(&g.output_ids, false),
                    "forward_passes": g.forward_passes,
                    "rows_computed": g.rows_computed,
                    "seconds": g.seconds,
                    "settings": params,
                    "drafts_confirmed": g.drafts_confirmed,
                    "mbsd": g.mbsd,
                    "window": window_report(&session),
                });
                // Only where commits can be revised: the official policies' output stays as it was.
                if let Some(r) = &g.revisions {
                    obj["revisions"] = json!(r);
                }
                if let Some(ops) = &ops {
                    obj["op_profile"] = json!(ops);
                }
                outln!("{obj}")?;
            } else {
                if show_denoising {
                    outln!("{answer}")?;
                } else {
                    // Whatever the prefix streaming held back.
                    out!("{}", answer.strip_prefix(display.printed.as_str()).unwrap_or(""))?;
                    outln!()?;
                }
                if std::io::stderr().is_terminal() {
                    eprintln!(
                        "[{} tokens, {} forward passes ({} policy), {} rows computed, {:.2} s]",
                        params.gen_length, g.forward_passes, params.policy.name(), g.rows_computed, g.seconds
                    );
                    if let Some(m) = &g.mbsd {
                        print_mbsd(m)?;
                    }
                    print_experts(&session)?;
                }
                if let Some(ops) = &ops {
                    ops.print()?;
                }
            }
        }
        Command::Serve { file, host, port, sessions, queue, api_key, max_body, session: session_args } => {
            let model = Model::open(&file, true)?;
            let config = llada_serve::Config {
                host,
                port,
                sessions,
                queue: queue.into(),
                session: session_args.params(&model)?,
                api_key: api_key.or_else(|| std::env::var("LLADA_API_KEY").ok()).filter(|k| !k.is_empty()),
                max_body,
                ..llada_serve::Config::default()
            };
            let id = llada_serve::model_id(&file);
            llada_serve::serve(model, &config, |addr| {
                eprintln!("llada-rt serve: {id} on http://{addr}/ ({sessions} session(s), queue {queue}); SIGTERM or Ctrl-C stops it");
            })?;
        }
        Command::Eval { file, tasks, sampler, reference, json, session: session_args } => {
            let model = Model::open(&file, true)?;
            let text = Text::new(&model.header.tokenizer, &model.header.special)?;
            let tasks = llada_rt_tools::eval::load_tasks(&tasks, &text)?;
            let reference = reference.map(|p| llada_rt_tools::eval::load_reference(&p)).transpose()?;
            let params = sampler.checked_params(&model, &typed)?;
            let mut session = session_args.open(&model)?;
            let show = !json && std::io::stderr().is_terminal();
            let report = llada_rt_tools::eval::run(&mut session, &text, &tasks, &params, reference.as_ref(), &mut |i, r| {
                if show {
                    eprint!("\r{}/{} {}", i + 1, tasks.len(), if r.correct { "ok  " } else { "FAIL" });
                }
            })?;
            if show {
                eprintln!();
            }
            if json {
                outln!("{}", serde_json::to_string(&report).expect("the report serializes"))?;
            } else {
                outln!("tasks:              {}", report.tasks)?;
                outln!("accuracy:           {:.4} ({}/{})", report.accuracy, report.correct, report.tasks)?;
                if let Some(m) = report.exact_match {
                    outln!("exact match vs ref: {m:.4}")?;
                }
                outln!("forward passes:     {} ({:.1} per task)", report.forward_passes, report.forward_passes as f64 / report.tasks as f64)?;
                outln!("rows computed:      {}", report.rows_computed)?;
                if let Some(m) = &report.mbsd {
                    print_mbsd(m)?;
                }
                outln!("generated tokens/s: {:.1} ({} tokens in {:.2} s)", report.tokens_per_second, report.generated_tokens, report.seconds)?;
                print_experts(&session)?;
            }
        }
        #[cfg(all(feature = "qnn", not(target_env = "musl")))]
        Command::QnnInfo { qnn_lib, json } => {
            use llada_rt::executor::qnn::QnnLibrary;
            // No library (or one that cannot be used) is the machine's setup, as a usage error.
            let lib = QnnLibrary::open(qnn_lib.as_deref()).map_err(|e| Failure::Usage(e.to_string()))?;
            let table = lib.backend_api_version().map_err(llada_rt::Error::from)?;
            drop(lib.backend().map_err(llada_rt::Error::from)?);
            let v = |v: llada_rt::executor::qnn::abi::Version| format!("{}.{}.{}", v.major, v.minor, v.patch);
            if json {
                let report = serde_json::json!({
                    "dir": lib.dir, "provider": lib.provider_name, "backend_id": lib.backend_id,
                    "core_api": v(lib.api_version.core), "backend_api": v(lib.api_version.backend), "build_id": lib.build_id,
                });
                outln!("{}", serde_json::to_string_pretty(&report).expect("a JSON value serializes"))?;
            } else {
                outln!("library:      {}", lib.dir.join(llada_rt::executor::qnn::library::HTP_LIBRARY).display())?;
                outln!("provider:     {} (backend id {})", lib.provider_name, lib.backend_id)?;
                outln!("core API:     {} (backendGetApiVersion: {})", v(lib.api_version.core), v(table.core))?;
                outln!("backend API:  {}", v(lib.api_version.backend))?;
                outln!("build:        {}", lib.build_id)?;
                outln!("backend:      created and freed")?;
            }
        }
        Command::Roofline { threads, json } => {
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
        }
        Command::Bench { file, rows, head_rows, repeat, session: session_args, generate: time_generation, prompt_len, sampler, json } => {
            // The sampler's flags (and --prompt-len) time the generation --generate adds:
            // without it they would do nothing. (`--rows` is bench's own.)
            if !time_generation {
                let sampler_flags = <SamplerArgs as Args>::augment_args(clap::Command::new("sampler"));
                let flags = sampler_flags.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).chain(["--prompt-len".to_string()]);
                if let Some(flag) = flags.filter(|f| f != "--rows").find(|f| typed(f)) {
                    return Err(Failure::Usage(format!("{flag} sets the generation that --generate times; without --generate it does nothing, so it is refused")));
                }
            }
            let threads = session_args.threads(MAX_THREADS)?.unwrap_or_else(default_threads);
            let staging = session_args.staging.clone();
            // Before loading: checksumming a large artifact leaves the kernel busy with the
            // page cache for a while, which would disturb the peak measurements.
            let roof = roofline::measure(threads);
            let model = Model::open(&file, true)?;
            // LLADA_THREADS within what the plan provides for, named as itself.
            session_args.threads(max_threads(&model))?;
            let max_len = Limits::of(&model).max_len;
            if let Some(r) = rows.iter().find(|r| !(1..=max_len).contains(*r)) {
                return Err(Failure::Usage(format!("--rows {r} is outside 1..={max_len} (the positions {} serves)", file.display())));
            }
            let params = if time_generation { Some(sampler.checked_params(&model, &|f: &str| f != "--rows" && typed(f))?) } else { None };
            let mut session = SessionArgs { threads: Some(threads), ..session_args }.open(&model)?;
            let mut passes = Vec::new();
            for &r in &rows {
                let head = head_rows.unwrap_or(r).min(r).min(session.head_capacity(r)?);
                passes.push(llada_rt_tools::bench::pass(&mut session, &roof, r, head, repeat)?);
            }
            let generation = if let Some(params) = &params {
                let m = &model.header.model;
                let vocab = m.vocab_size.min(m.embedding_size) as usize;
                let prompt: Vec<u32> = (0..prompt_len).map(|i| ((i * 104729 + 7) % vocab) as u32).collect();
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
                    if p.by_op.is_empty() {
                        // An ahead-of-time backend: one executable a pass, no op of ours timed.
                        outln!("\nrows {} (graph {}, {} logit rows): {:.4} s (one executable; no roofline bound without op times)", p.rows, p.graph, p.head_rows, p.seconds)?;
                    } else {
                        outln!("\nrows {} (graph {}, {} logit rows): {:.4} s, roofline bound {:.4} s, ratio {:.2}", p.rows, p.graph, p.head_rows, p.seconds, p.bound_seconds, p.ratio)?;
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
        }
        Command::Golden { golden, model, select, write, tokens_only, backend, json } => {
            let select = select.selection()?;
            if let Some(out) = &write {
                llada_ir::files::check_destination(out, &[&golden, &model]).map_err(|e| Error::io(out, e))?;
            }
            let file = golden::read(&golden)?;
            let m = Model::open(&model, true)?;
            let text = Text::new(&m.header.tokenizer, &m.header.special)?;
            let mut session = backend.open(&m)?;
            if let Some(out) = write {
                let produced = golden::reproduce(&mut session, &text, &file, &golden, select)?;
                golden::write(&produced, &out, &[&golden, &model])?;
                outln!("wrote {} ({} cases, {} logit cases)", out.display(), produced.cases.len(), produced.first_pass_logits.len())?;
                return Ok(());
            }
            let pin = if tokens_only { golden::Pin::Tokens } else { golden::Pin::Reveals };
            let report = golden::check(&mut session, &text, &file, &golden, select, pin)?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&report).expect("the report serializes"))?;
            } else {
                for f in &report.failures {
                    outln!("MISMATCH {f}")?;
                }
                outln!("{}: {}", golden.display(), if report.passed() { "PASS" } else { "FAIL" })?;
                outln!("  cases:             {} of {} (every {} from {})", report.cases, report.cases_in_file, select.every, select.offset)?;
                outln!("  output_ids:        {}/{} matched", report.output_ids_matched, report.cases)?;
                outln!("  reveals:           {}/{} matched at every step{}", report.reveals_matched, report.cases, if tokens_only { " (not required: --tokens-only)" } else { "" })?;
                outln!(
                    "  first-pass logits: {}/{} within {:.0e} (max abs change {:.2e})",
                    report.logit_cases_within_tolerance, report.logit_cases, report.logit_tolerance, report.max_logit_abs_error
                )?;
            }
            if !report.passed() {
                return Err(Error::request(format!("{}: golden outputs differ", golden.display())).into());
            }
        }
        Command::Conformance { golden, model, select, backend, logit_tolerance, accept_explained, json } => {
            let select = select.selection()?;
            let m = Model::open(&model, true)?;
            let mut session = backend.open(&m)?;
            // Off the host, each mismatch is explained by the host's margins where it diverged.
            let mut host = if backend.kind() == llada_rt::executor::default_backend() { None } else { Some(Session::open(&m, &SessionParams::default())?) };
            let report = conformance::run_explained(&mut session, host.as_mut(), &golden, select, logit_tolerance, &mut |_| {})?;
            let passed = report.passed() || (accept_explained && report.passed_but_for_explained());
            if json {
                outln!("{}", serde_json::to_string_pretty(&report).expect("the report serializes"))?;
            } else {
                for f in &report.failures {
                    outln!("MISMATCH {f}")?;
                }
                let bound = 2.0 * report.max_logit_abs_error;
                for d in &report.divergences {
                    let margin = d.margin.map_or("not computed (guidance)".to_string(), |m| format!("{m:.3e}"));
                    let why = if d.explained { format!("below 2 x the first-pass logit error ({bound:.2e}): explained by precision") } else { format!("not below 2 x the first-pass logit error ({bound:.2e}): NOT explained") };
                    outln!("DIVERGED {} at step {}: the host's margin there {margin}, {why}", d.case, d.step)?;
                }
                let ran = report.cases - report.skipped;
                let verdict = match (report.passed(), passed) {
                    (true, _) => "PASS",
                    (false, true) => "PASS (every mismatch explained by precision)",
                    _ => "FAIL",
                };
                outln!("{}: {verdict}", golden.display())?;
                if report.cases < report.cases_in_file {
                    outln!("  cases:                     {} of {} (every {} from {})", report.cases, report.cases_in_file, select.every, select.offset)?;
                }
                outln!("  output_ids:                {}/{} matched", report.output_ids_matched, ran)?;
                outln!("  reveals before first tie:  {}/{} matched", report.reveals_before_tie_matched, ran)?;
                outln!("  reveals at every step:     {}/{} matched (ties included)", report.reveals_all_steps_matched, ran)?;
                if report.forward_calls_checked > 0 {
                    outln!("  model calls:               {}/{} threshold cases as many as the reference", report.forward_calls_matched, report.forward_calls_checked)?;
                }
                if report.edits_checked > 0 {
                    outln!("  edits at every model call: {}/{} editing cases matched", report.edits_matched, report.edits_checked)?;
                }
                outln!(
                    "  first_step_logits:         {}/{} within {:.0e} (max abs error {:.2e})",
                    report.logit_cases_within_tolerance, report.logit_cases, logit_tolerance, report.max_logit_abs_error
                )?;
                if report.skipped > 0 {
                    outln!("  skipped: {} case(s) that need PyTorch's own random stream", report.skipped)?;
                }
            }
            if !passed {
                return Err(Error::request(format!("{}: conformance failed", golden.display())).into());
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // A setting out of range is a usage error, as clap's own are.
    llada_cli::main::<Cli, _>("llada-rt", run, |e| matches!(e, Error::Setting { .. }))
}

/// The dense and side paths' figures of `mbsd` runs, for people.
fn print_mbsd(m: &llada_rt::sampler::MbsdReport) -> Done {
    let s = &m.side;
    outln!("dense passes:       {}", m.dense_passes)?;
    outln!(
        "dense rows:         {} (masked {}, speculative {}, refresh {}, padding {})",
        m.dense_rows(),
        m.rows_masked,
        m.rows_speculative,
        m.rows_refresh,
        m.rows_padding
    )?;
    outln!("drafts:             {} accepted, {} dropped", m.drafts_accepted, m.drafts_dropped)?;
    outln!(
        "side path:          {} passes, {} rows, {} checks, {} revisions, {} stabilised, {:.3} s on its thread, dense path stalled {:.3} s",
        s.side_passes, s.side_rows, s.checks, s.revisions, s.stabilised, s.side_seconds, s.stall_seconds
    )
}
