use std::process::ExitCode;

use clap::{ArgMatches, Args, Parser, Subcommand};
use llada_cli::{outln, Failure};
use llada_rt::params::{env_threads, unused_setting, Limits, MAX_THREADS};
use llada_rt::sampler::{Alg, EosIds, Policy, Revision, Rng};
use llada_rt::moe::{ExpertCounters, ExpertStrategy};
use llada_rt::session::max_threads;
use llada_rt::staging::StagingMode;
use llada_rt::{Error, Model, Remasking, Result, SamplerParams, Session, SessionParams};
use llada_rt_tools::conformance;
use serde_json::json;

/// Each subcommand: its arguments (a variant of [`Command`]) and its `run`, which takes
/// [`typed`]'s answer where the sampler's flags need it.
mod commands {
    pub mod bench;
    pub mod compare;
    pub mod conformance;
    pub mod eval;
    pub mod golden;
    #[cfg(all(feature = "qnn", not(target_env = "musl")))]
    pub mod qnn_info;
    pub mod roofline;
    pub mod run;
    #[cfg(feature = "serve")]
    pub mod serve;
}

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
#[cfg(feature = "serve")]
fn serve_defaults() -> llada_serve::Config {
    llada_serve::Config::default()
}

/// A whole-number flag's value in `0..=max`: out of it, negative or too large, the message
/// names the range as the settings of every other front end do (`llada_rt::settings`).
fn whole_up_to(text: &str, max: u64) -> std::result::Result<u64, String> {
    let n: i128 = text.trim().parse().map_err(|e| format!("not a whole number: {e}"))?;
    u64::try_from(n).ok().filter(|&n| n <= max).ok_or_else(|| format!("{n} is outside 0..={max}"))
}

fn whole_u64(text: &str) -> std::result::Result<u64, String> {
    whole_up_to(text, u64::MAX)
}

fn whole_usize(text: &str) -> std::result::Result<usize, String> {
    whole_up_to(text, usize::MAX as u64).map(|n| n as usize)
}

fn whole_u32(text: &str) -> std::result::Result<u32, String> {
    whole_up_to(text, u32::MAX.into()).map(|n| n as u32)
}

/// The sampler's flags: each maps to the field of `SamplerParams` it names, whose
/// `Default` gives the defaults shown in `--help`.
#[derive(Args, Clone)]
struct SamplerArgs {
    /// Tokens to generate [default: 128; DiffusionGemma: its generation config's
    /// max_new_tokens, in whole canvases].
    #[arg(long, value_parser = whole_usize)]
    gen_len: Option<usize>,
    /// Semi-autoregressive block length (gen-len must be a multiple of it) [default: the
    /// block length the artifact was compiled for; Dream: the gen length, one block;
    /// DiffusionGemma: its canvas length].
    #[arg(long, value_parser = whole_usize)]
    block_len: Option<usize>,
    /// Denoising steps over all blocks (a multiple of the number of blocks) [default: 128].
    /// LLaDA 2.x: steps per block, as its published generate counts them [default: 32].
    /// DiffusionGemma: steps per canvas [default: its max_denoising_steps].
    #[arg(long, value_parser = whole_usize)]
    steps: Option<usize>,
    /// 0 = most likely token; above 0, Gumbel-max sampling.
    #[arg(long, default_value_t = defaults().temperature, allow_hyphen_values = true)]
    temperature: f64,
    /// Seed of the sampling noise.
    #[arg(long, default_value_t = defaults().seed, value_parser = whole_u64)]
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
    #[arg(long, default_value_t = defaults().refresh_every, value_parser = whole_usize)]
    refresh_every: usize,
    /// Commit every masked token of the block at or above this confidence (at least one) per
    /// step [default: none; LLaDA 2.x: 0.95, its generate's].
    #[arg(long, allow_hyphen_values = true)]
    threshold: Option<f32>,
    /// spec, mbsd: blocks drafted ahead of the current one [default: spec 1, mbsd the
    /// artifact's compiled speculation depth].
    #[arg(long, value_parser = whole_usize)]
    spec_blocks: Option<usize>,
    /// spec, mbsd: confidence a draft needs when its block becomes current.
    #[arg(long, default_value_t = defaults().spec_threshold, allow_hyphen_values = true)]
    spec_threshold: f32,
    /// mbsd: fewest rows a dense pass computes [default: the plan's smallest latency bucket].
    #[arg(long, value_parser = whole_usize)]
    rows: Option<usize>,
    /// mbsd: committed tokens stay revisable and a CPU side path re-checks them (dual-path),
    /// commits are final (off), or auto: dual-path where the dense path leaves the CPU free
    /// (a GPU), off where it runs on the same cores (the host backend, lavapipe).
    #[arg(long, default_value = defaults().revision.name(), value_parser = clap::builder::PossibleValuesParser::new(Revision::NAMES.iter().copied()))]
    revision: String,
    /// mbsd revision: rows of one side-path pass, two per checked token [default: the plan's
    /// smallest latency bucket].
    #[arg(long, value_parser = whole_usize)]
    side_rows: Option<usize>,
    /// mbsd revision: an agreeing check at or above this confidence makes a token stable.
    #[arg(long, default_value_t = defaults().stable_confidence, allow_hyphen_values = true)]
    stable_confidence: f32,
    /// mbsd revision: this many agreeing checks make a token stable.
    #[arg(long, default_value_t = defaults().stable_checks, value_parser = whole_u32)]
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
    /// Dream and LLaDA 2.x: nucleus filtering of each prediction, (0, 1]; Dream takes any
    /// value >= 0, as its published code does (0 keeps the most likely token, 1 or more all).
    #[arg(long, allow_hyphen_values = true)]
    top_p: Option<f64>,
    /// Dream and LLaDA 2.x: keep only the k most likely tokens of each prediction.
    #[arg(long, value_parser = whole_usize)]
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
    #[arg(long, default_value_t = defaults().max_post_steps, value_parser = whole_usize)]
    max_post_steps: usize,
    /// Dream: draw the positions a step commits from the softmax of their confidences over
    /// this temperature, instead of taking the most confident.
    #[arg(long, allow_hyphen_values = true)]
    alg_temp: Option<f64>,
    /// DiffusionGemma: the temperature at the last step ("none": no schedule) [default: the
    /// checkpoint's generation config].
    #[arg(long, value_parser = number_or_none, allow_hyphen_values = true)]
    t_min: Option<Off<f64>>,
    /// DiffusionGemma: the temperature at the first step ("none": no schedule) [default: the
    /// checkpoint's].
    #[arg(long, value_parser = number_or_none, allow_hyphen_values = true)]
    t_max: Option<Off<f64>>,
    /// DiffusionGemma: a step accepts the lowest-entropy positions while the entropies before
    /// each sum to at most this [default: the checkpoint's].
    #[arg(long, allow_hyphen_values = true)]
    entropy_bound: Option<f64>,
    /// DiffusionGemma: a canvas ends once its argmax canvas held this many steps and the mean
    /// entropy is below --confidence-threshold ("none": never early) [default: the checkpoint's].
    #[arg(long, value_parser = whole_or_none)]
    stability_threshold: Option<Off<usize>>,
    /// DiffusionGemma: see --stability-threshold ("none": never early) [default: the checkpoint's].
    #[arg(long, value_parser = number_or_none, allow_hyphen_values = true)]
    confidence_threshold: Option<Off<f64>>,
    /// DiffusionGemma: token ids that end the generation, "a,b,c" ("none": none do) [default:
    /// the checkpoint's].
    #[arg(long, value_parser = eos_ids_flag)]
    eos_ids: Option<EosIds>,
    /// DiffusionGemma: the random stream: torch (PyTorch's CPU generator draw for draw:
    /// transformers' generate under the same --seed) or fast (the same distributions, one draw
    /// per position, in parallel).
    #[arg(long, default_value = defaults().rng.name(), value_parser = clap::builder::PossibleValuesParser::new(Rng::NAMES.iter().copied()))]
    rng: String,
}

/// A flag's value, or "none": that part of the sampler off.
#[derive(Clone, Copy, Debug)]
struct Off<T>(Option<T>);

fn number_or_none(text: &str) -> std::result::Result<Off<f64>, String> {
    match text {
        "none" => Ok(Off(None)),
        t => t.parse::<f64>().map(|x| Off(Some(x))).map_err(|e| format!("not a number or \"none\": {e}")),
    }
}

fn whole_or_none(text: &str) -> std::result::Result<Off<usize>, String> {
    match text {
        "none" => Ok(Off(None)),
        t => whole_usize(t).map(|n| Off(Some(n))),
    }
}

/// `--eos-ids`: comma-separated token ids, or "none".
fn eos_ids_flag(text: &str) -> std::result::Result<EosIds, String> {
    let ids = match text {
        "none" => Vec::new(),
        t => t.split(',').map(|id| whole_u32(id.trim())).collect::<std::result::Result<Vec<u32>, String>>()?,
    };
    EosIds::new(&ids)
}

impl SamplerArgs {
    /// The settings, with the artifact's plan filling what was not given.
    fn params(&self, model: &Model) -> SamplerParams {
        let policy = Policy::parse(&self.policy).expect("clap restricts the values");
        let defaults = SamplerParams::for_model(model, self.gen_len, self.block_len, policy);
        let off_or = |given: Option<Off<f64>>, default: Option<f64>| given.map_or(default, |o| o.0);
        SamplerParams {
            gen_length: defaults.gen_length,
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
            t_min: off_or(self.t_min, defaults.t_min),
            t_max: off_or(self.t_max, defaults.t_max),
            entropy_bound: self.entropy_bound.unwrap_or(defaults.entropy_bound),
            stability_threshold: self.stability_threshold.map_or(defaults.stability_threshold, |o| o.0),
            confidence_threshold: off_or(self.confidence_threshold, defaults.confidence_threshold),
            eos_ids: self.eos_ids.unwrap_or(defaults.eos_ids),
            rng: Rng::parse(&self.rng).expect("clap restricts the values"),
        }
    }

    /// [`params`](Self::params), each setting checked against its range and the plan's
    /// limits, then refused if it was typed (`typed`, by flag) under a policy that does not
    /// use it (`llada_rt::params::POLICY_SETTINGS`): it would do nothing.
    fn checked_params(&self, model: &Model, typed: &dyn Fn(&str) -> bool) -> std::result::Result<SamplerParams, Failure<Error>> {
        let params = self.params(model);
        params.validate(&Limits::of(model))?;
        match unused_setting(&params, model.family(), typed) {
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
#[cfg(feature = "serve")]
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
    Run(commands::run::Run),
    /// Serve the artifact over HTTP: OpenAI's chat and completion endpoints (streamed as
    /// Server-Sent Events), /v1/models, /health, and a live view of the denoising at /.
    #[cfg(feature = "serve")]
    Serve(commands::serve::Serve),
    /// Measure this machine's ceilings: peak f32, bf16 and int8 rates and memory bandwidth.
    Roofline(commands::roofline::Roofline),
    /// Load Qualcomm's QNN HTP library and report what it is (provider, API versions, build),
    /// with a backend instance created and freed: the check that the NPU backend's library is
    /// usable here.
    #[cfg(all(feature = "qnn", not(target_env = "musl")))]
    QnnInfo(commands::qnn_info::QnnInfo),
    /// Time forward passes op by op against the roofline, and optionally a whole generation.
    #[command(allow_negative_numbers = true)]
    Bench(commands::bench::Bench),
    /// Accuracy and cost of the sampler on a file of tasks.
    #[command(allow_negative_numbers = true)]
    Eval(commands::eval::Eval),
    /// Replay this project's own golden outputs (tests/golden/embedded.json) with an
    /// artifact, or write them again for another artifact with --write.
    Golden(commands::golden::Golden),
    /// How far an artifact is from a reference compiled from the same checkpoint (a quantised
    /// one against the unquantised): first-pass logit error, top-1 and generated-token
    /// agreement, and the time of each generation.
    #[command(allow_negative_numbers = true)]
    Compare(commands::compare::Compare),
    /// Check the runtime against a golden file from the official sampler.
    Conformance(commands::conformance::Conformance),
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
    #[arg(long, default_value = SessionParams::default().staging.name(), value_parser = clap::builder::PossibleValuesParser::new(StagingMode::NAMES.iter().copied()))]
    staging: String,
    /// Mixture-of-experts models: where experts run. hybrid: a score-ranked expert cache in
    /// the window, refreshed from the last pass's routing and prefetched from the next
    /// layer's predicted routing, each layer's experts split between the accelerator and CPU
    /// paths by the cost model; lru: all on the accelerator, least-recently-used cache, no
    /// prefetch; static: all on the CPU path [default: hybrid].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(ExpertStrategy::NAMES.iter().copied()))]
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

/// This process's peak resident memory (`VmHWM` of /proc/self/status, Linux and Android);
/// `None` where the system has no such file.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The window and what staging cost, over the session's passes.
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

fn run(cli: Cli, matches: &ArgMatches) -> Done {
    let typed = typed(matches);
    match cli.command {
        Command::Run(command) => command.run(&typed),
        #[cfg(feature = "serve")]
        Command::Serve(command) => command.run(),
        Command::Roofline(command) => command.run(),
        #[cfg(all(feature = "qnn", not(target_env = "musl")))]
        Command::QnnInfo(command) => command.run(),
        Command::Bench(command) => command.run(&typed),
        Command::Eval(command) => command.run(&typed),
        Command::Golden(command) => command.run(),
        Command::Compare(command) => command.run(&typed),
        Command::Conformance(command) => command.run(),
    }
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
