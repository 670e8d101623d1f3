//! A session binds a loaded model to one window and one executor, and runs forward passes
//! the plan allows. It counts what it did, so every decoding policy reports the same figures.

mod encoder_decoder;

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Error, Result, Setting};
use crate::executor::{self, value_range, Backend, Capabilities, Executor, OpProfile, Pass, PassProfile, RunInputs};
use crate::model::{Model, SharedModel};
use crate::moe::{ExpertCounters, ExpertStrategy, Experts, MoeStep};
use crate::params::SessionParams;
pub use crate::sampler::RowSet;
use crate::sampler::{Predict, SideChecks, SideJob};
use crate::side_lane::SideLane;
use crate::staging::{PassStaging, Stager, StagingMode};
use crate::window::Window;

/// What a session has computed so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Graph runs.
    pub forward_passes: u64,
    /// Token rows computed: a graph's rows, padding included, where the backend computes them
    /// all; the rows asked for where it computes only those (`Capabilities::cost_per_row`).
    pub rows_computed: u64,
    /// Logit rows computed by the output head.
    pub logit_rows_computed: u64,
    /// Wall time spent inside graph runs.
    pub forward_seconds: f64,
    /// Weight bytes staged into slots, the compute path's waits for them, and the copies'
    /// own time, over all passes.
    pub staged_bytes: u64,
    pub stall_seconds: f64,
    pub copy_seconds: f64,
    /// CPU side paths set up (a thread and a window each): one per session and `side_rows`,
    /// however many generations revise.
    pub side_path_starts: u64,
    /// NPU contexts created during passes (the rotating ones of a model split across more
    /// contexts than its window holds at once), their bytes and the time it took.
    pub context_loads: u64,
    pub context_load_bytes: u64,
    pub context_load_seconds: f64,
    /// Of those, created while the context before them ran, and the time passes waited for
    /// such a creation to finish after that context's executable was done.
    pub context_loads_overlapped: u64,
    pub context_load_wait_seconds: f64,
}

impl Counters {
    /// Share of the staging copies' time hidden behind compute.
    pub fn overlap(&self) -> f64 {
        PassStaging { staged_bytes: self.staged_bytes, stall_seconds: self.stall_seconds, copy_seconds: self.copy_seconds }.overlap()
    }
}

/// Threads a session uses unless told otherwise: `LLADA_THREADS`, else every core the
/// process may run on (measured faster than one on the 2-core host: BENCHMARKS.md).
pub fn default_threads() -> usize {
    std::env::var("LLADA_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The most threads a session on `model` may use: what the plan's attention scratch holds.
pub fn max_threads(model: &Model) -> usize {
    model.header.plan.window.scratch.threads.max(1) as usize
}

/// Threads a session on `model` uses unless told otherwise: `LLADA_THREADS`, refused outside
/// `1..=max_threads(model)` (never ignored: an app's user set it for a reason), else every core,
/// at most what the plan provides for.
pub fn default_threads_for(model: &Model) -> Result<usize> {
    let max = max_threads(model);
    Ok(crate::params::env_threads(max)?.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(max)))
}

/// Refuses a thread count outside `1..=max_threads(model)`, naming `setting`.
pub fn check_threads(model: &Model, setting: Setting, threads: usize) -> Result<()> {
    let max = max_threads(model);
    if !(1..=max).contains(&threads) {
        return Err(Error::setting(setting, format!("{threads} is outside 1..={max} (the threads {} was compiled for: its kernel scratch holds {max})", model.path.display())));
    }
    Ok(())
}

/// How a session runs a mixture-of-experts model's experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertOptions {
    pub strategy: ExpertStrategy,
    /// Threads of the CPU path that computes experts beside the accelerator path.
    pub cpu_threads: usize,
}

impl Default for ExpertOptions {
    /// Hybrid, one CPU-path thread.
    fn default() -> Self {
        ExpertOptions { strategy: ExpertStrategy::Hybrid, cpu_threads: 1 }
    }
}

pub struct Session {
    /// The model, shared with the session's threads and with other sessions.
    pub model: Arc<Model>,
    /// Declared before the window: fields drop in order, so the staging threads are joined
    /// before the window they write is freed.
    stager: Stager,
    /// The CPU's mixture-of-experts step every backend's passes use (with the expert
    /// runtime of a mixture-of-experts model).
    moe: MoeStep,
    /// The CPU side lane that revises beside the dense passes (`mbsd --revision dual-path`),
    /// set up by the first generation that asks for it and kept for the next.
    side: Option<SideLane>,
    window: Window,
    /// Length of the sequence whose every position the cache holds (set by a whole-sequence
    /// pass): the condition for passes over fewer rows.
    cached_len: Option<usize>,
    /// Positions before this hold keys and values of block-causal passes (`forward_blocks`).
    block_prefix: usize,
    /// Declared after the window: a device backend's window lives in its device's memory.
    executor: Box<dyn Executor>,
    /// Kernel paths of the CPU work around the passes (and of the host backend's kernels).
    features: crate::kernels::cpu::Features,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    /// Rows of the current pass before padding.
    real_rows: usize,
    /// Logit rows of the current pass, as graph rows.
    logit_rows: Vec<u32>,
    /// A row-set pass's stored positions, sorted (to find a position stored twice).
    sorted_stored: Vec<u32>,
    pub counters: Counters,
    last_staging: PassStaging,
    /// Seconds spent reading the resident segments into the window at the start.
    pub load_seconds: f64,
    trace: Option<std::sync::Arc<crate::trace::Trace>>,
    /// How the experts were set up, to set them up again after a failed pass.
    expert_options: ExpertOptions,
    /// A pass failed: staging and the experts are set up afresh before the next one (not at
    /// once: what failed, a file being replaced say, may be mended by then).
    needs_reset: bool,
    /// Every pass's op times while [`profile_ops`](Self::profile_ops) is on (a diagnostic:
    /// timing ops and keeping them allocates).
    op_profiles: Option<Vec<PassProfile>>,
    /// Profiled passes also record their matmuls' ranges.
    matmul_ranges: bool,
    /// DiffusionGemma: positions `0..encoded` hold the encoder's keys and values
    /// (`session/encoder_decoder.rs`).
    encoded: usize,
    /// DiffusionGemma's decoder pass: the self-conditioning input it reads (`soft_rows`
    /// rows of logits; 0 rows: none, the first step).
    soft: Vec<f32>,
    soft_rows: usize,
}

impl Session {
    /// A session on all the default threads (see [`default_threads`]).
    pub fn new(model: impl SharedModel) -> Result<Session> {
        let model = model.into_shared();
        let threads = default_threads_for(&model)?;
        Session::with_threads(model, threads)
    }

    /// A session as `params` says, the defaults filled in (every core, hybrid experts on one
    /// CPU thread): what the CLI and the C API open.
    pub fn open(model: impl SharedModel, params: &SessionParams) -> Result<Session> {
        let model = model.into_shared();
        params.check_experts(&model)?;
        let defaults = ExpertOptions::default();
        let experts = ExpertOptions { strategy: params.experts.unwrap_or(defaults.strategy), cpu_threads: params.cpu_threads.unwrap_or(defaults.cpu_threads) };
        let threads = match params.threads {
            Some(n) => n,
            None => default_threads_for(&model)?,
        };
        Session::with_backend(model, params.backend, threads, crate::kernels::cpu::features(), params.staging, experts)
    }

    pub fn with_threads(model: impl SharedModel, threads: usize) -> Result<Session> {
        Session::with_options(model, threads, crate::kernels::cpu::features(), StagingMode::Async)
    }

    /// A session whose matmuls may use only `features` (fewer than detected forces the
    /// portable fallbacks, as `LLADA_ISA` does for a whole process), staging rotating
    /// weights as `staging` says. Allocates the window and reads the resident weight
    /// segments into it. Experts (of an MoE model) run as [`ExpertOptions::default`] says.
    pub fn with_options(model: impl SharedModel, threads: usize, features: crate::kernels::cpu::Features, staging: StagingMode) -> Result<Session> {
        Session::with_experts(model, threads, features, staging, ExpertOptions::default())
    }

    /// [`with_options`](Self::with_options), running a mixture-of-experts model's experts as
    /// `experts` says.
    pub fn with_experts(model: impl SharedModel, threads: usize, features: crate::kernels::cpu::Features, staging: StagingMode, experts: ExpertOptions) -> Result<Session> {
        Session::with_backend(model, executor::default_backend(), threads, features, staging, experts)
    }

    /// [`with_experts`](Self::with_experts) on the `backend` that runs the dense graphs
    /// (`threads`: the host backend's kernel threads, and the CPU threads around the passes).
    pub fn with_backend(model: impl SharedModel, backend: &Backend, threads: usize, features: crate::kernels::cpu::Features, staging: StagingMode, experts: ExpertOptions) -> Result<Session> {
        let model = model.into_shared();
        let h = &model.header;
        check_threads(&model, Setting::Threads, threads)?;
        if h.model.moe.is_some() {
            check_threads(&model, Setting::CpuThreads, experts.cpu_threads)?;
        }
        let max_rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        let start = Instant::now();
        let (executor, mut window) = backend.open(&model, threads, features)?;
        load_resident(&model, &mut window)?;
        let stager = Stager::new(h, model.file(), &model.path, model.data_offset(), window.slot_ptrs(), staging)?;
        let expert_options = experts;
        let experts = Experts::new(&model, &window, experts.strategy, experts.cpu_threads)?;
        let moe = MoeStep::new(&model, experts, executor.pool().clone(), features);
        let load_seconds = start.elapsed().as_secs_f64();
        Ok(Session {
            model,
            stager,
            moe,
            side: None,
            window,
            cached_len: None,
            block_prefix: 0,
            executor,
            features,
            tokens: Vec::with_capacity(max_rows),
            positions: Vec::with_capacity(max_rows),
            real_rows: 0,
            logit_rows: Vec::with_capacity(max_rows),
            sorted_stored: Vec::with_capacity(max_rows),
            counters: Counters::default(),
            last_staging: PassStaging::default(),
            load_seconds,
            trace: None,
            expert_options,
            needs_reset: false,
            op_profiles: None,
            matmul_ranges: false,
            encoded: 0,
            soft: Vec::new(),
            soft_rows: 0,
        })
    }

    /// Records every pass (and the staging thread's copies) in `trace` from now on.
    pub fn set_trace(&mut self, trace: std::sync::Arc<crate::trace::Trace>) {
        self.stager.set_trace(trace.clone());
        self.executor.set_trace(trace.clone());
        self.trace = Some(trace);
    }

    /// Staging figures of the last pass.
    pub fn last_pass_staging(&self) -> PassStaging {
        self.last_staging
    }

    /// The experts' figures so far (a mixture-of-experts model only).
    pub fn expert_counters(&self) -> Option<ExpertCounters> {
        self.moe.experts().map(Experts::counters)
    }

    /// How the experts run (a mixture-of-experts model only).
    pub fn expert_strategy(&self) -> Option<ExpertStrategy> {
        self.moe.experts().map(Experts::strategy)
    }

    pub fn staging_mode(&self) -> StagingMode {
        self.stager.mode()
    }

    pub fn threads(&self) -> usize {
        self.executor.pool().current_num_threads()
    }

    /// What the backend running the dense graphs is.
    pub fn backend(&self) -> &Capabilities {
        self.executor.capabilities()
    }

    /// Bytes of the window this session allocated.
    pub fn window_bytes(&self) -> u64 {
        self.window.bytes()
    }

    /// Most logit rows one pass over `rows` positions can return.
    pub fn logit_capacity(&self, rows: usize) -> Result<usize> {
        self.model.logit_capacity(rows)
    }

    /// Times every op of every pass from now on (`on`), keeping the times for
    /// [`take_op_profiles`](Self::take_op_profiles), or stops.
    pub fn profile_ops(&mut self, on: bool) {
        self.op_profiles = on.then(Vec::new);
        self.matmul_ranges = false;
    }

    /// [`profile_ops`](Self::profile_ops), each profile also holding the range of every
    /// matmul's input and output ([`OpProfile::matmul_ranges`]; the host executor records
    /// them, others leave them empty).
    pub fn profile_matmul_ranges(&mut self, on: bool) {
        self.profile_ops(on);
        self.matmul_ranges = on;
    }

    /// The op times of the passes since [`profile_ops`](Self::profile_ops) was turned on or
    /// last taken.
    pub fn take_op_profiles(&mut self) -> Vec<PassProfile> {
        self.op_profiles.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// [`forward_full`](Self::forward_full), timing every op: for `llada-rt bench`.
    pub fn forward_full_profiled(&mut self, seq: &[u32], logit_rows: &[u32]) -> Result<(u32, OpProfile)> {
        let (gid, profile) = self.pass(seq, 0..seq.len(), logit_rows, true)?;
        Ok((gid, profile.unwrap_or_default()))
    }

    /// Checks a request for positions `span` of `seq` with logits at `logit_positions`, picks
    /// the graph and fills the token, position and logit rows.
    /// `block_causal`: the caller checked that the cache holds every position before `span`
    /// from block passes (`forward_blocks`).
    fn prepare(&mut self, seq: &[u32], span: Range<usize>, logit_positions: &[u32], block_causal: bool) -> Result<u32> {
        if span.start >= span.end || span.end > seq.len() {
            return Err(Error::request(format!("rows {span:?} are not inside a {}-token sequence", seq.len())));
        }
        // The whole sequence must fit a graph (and so the cache, which holds the largest).
        self.model.graph_for_rows(seq.len())?;
        if span.len() < seq.len() && self.cached_len != Some(seq.len()) && !block_causal {
            return Err(Error::request(format!(
                "a pass over rows {span:?} reuses the KV cache, which does not hold this {}-token sequence: run a whole-sequence pass first",
                seq.len()
            )));
        }
        let gid = self.model.graph_for_rows(span.len())?;
        self.check_logit_rows(gid, logit_positions.len())?;
        check_tokens(&self.model, seq)?;
        if let Some(&bad) = logit_positions.iter().find(|&&r| !span.contains(&(r as usize))) {
            return Err(Error::request(format!("logits asked for position {bad}, outside the rows {span:?} of this pass")));
        }
        // Dream predicts position p from the pass's output at p - 1; the pass's first row from
        // its own (Dream's samplers shift the logits of whatever rows a pass computed).
        let shift = self.model.logit_shift();
        self.tokens.clear();
        self.tokens.extend_from_slice(&seq[span.clone()]);
        self.positions.clear();
        self.positions.extend(span.start as u32..span.end as u32);
        self.logit_rows.clear();
        self.logit_rows.extend(logit_positions.iter().map(|&p| p.saturating_sub(shift).max(span.start as u32) - span.start as u32));
        self.pad(gid);
        Ok(gid)
    }

    fn check_logit_rows(&self, gid: u32, logit_rows: usize) -> Result<()> {
        let g = self.model.graph(gid);
        if logit_rows > g.logit_rows as usize {
            return Err(Error::request(format!(
                "{logit_rows} logit rows were requested in one pass but {} was compiled for at most {}; \
                 use a smaller --block-len or recompile with `lladac compile --logit-rows {logit_rows}`",
                self.model.path.display(),
                g.logit_rows,
            )));
        }
        Ok(())
    }

    /// Pads the token and position rows to graph `gid`'s row count. Padding rows are never
    /// stored and their outputs never read; any valid token and rotary row will do.
    fn pad(&mut self, gid: u32) {
        let rows = self.model.graph(gid).rows as usize;
        self.real_rows = self.tokens.len();
        self.tokens.resize(rows, self.model.header.special.mask);
        self.positions.resize(rows, 0);
    }

    /// A row-set pass: graph rows at arbitrary positions of a `seq_len`-token sequence whose
    /// every position the cache holds. Rows are `rows.positions[i]` with input token
    /// `rows.tokens[i]`; the first `rows.stored` store their keys and values, the others only
    /// read (see [`RunInputs::stored_rows`]). The pass runs the graph of `bucket` rows (or
    /// the smallest that holds them all) and returns the logits of rows `logit_rows` (indexes into
    /// `rows`), `[logit_rows.len(), embedding_size]`.
    pub fn forward_rows(&mut self, seq_len: usize, rows: &RowSet, bucket: usize, logit_rows: &[u32]) -> Result<&[f32]> {
        let n = rows.positions.len();
        if n == 0 || rows.tokens.len() != n || rows.stored > n {
            return Err(Error::request(format!("a row-set pass needs at least one row, a token per row and at most {n} stored rows")));
        }
        if self.cached_len != Some(seq_len) {
            return Err(Error::request(format!(
                "a row-set pass reuses the KV cache, which does not hold this {seq_len}-token sequence: run a whole-sequence pass first"
            )));
        }
        if let Some(&bad) = rows.positions.iter().find(|&&p| p as usize >= seq_len) {
            return Err(Error::request(format!("row position {bad} is outside the {seq_len}-token sequence")));
        }
        let stored = &mut self.sorted_stored;
        stored.clear();
        stored.extend_from_slice(&rows.positions[..rows.stored]);
        stored.sort_unstable();
        if let Some(w) = stored.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::request(format!("two rows of one pass store position {}", w[0])));
        }
        if let Some(&bad) = logit_rows.iter().find(|&&r| r as usize >= n) {
            return Err(Error::request(format!("logits asked for row {bad} of a {n}-row pass")));
        }
        check_tokens(&self.model, &rows.tokens)?;
        let gid = self.model.graph_for_rows(bucket.max(n))?;
        self.check_logit_rows(gid, logit_rows.len())?;
        self.tokens.clear();
        self.tokens.extend_from_slice(&rows.tokens);
        self.positions.clear();
        self.positions.extend_from_slice(&rows.positions);
        self.logit_rows.clear();
        self.logit_rows.extend_from_slice(logit_rows);
        self.pad(gid);
        self.run_pass(gid, rows.stored, seq_len, logit_rows.len(), n, None, false)?;
        Ok(self.logits(gid, logit_rows.len()))
    }

    /// The thread pool the kernels run on, so work around the passes (predictions) honours
    /// `--threads` too.
    pub fn pool(&self) -> &rayon::ThreadPool {
        self.executor.pool()
    }

    /// A handle on that pool, to enter it while the session is borrowed.
    pub fn pool_handle(&self) -> crate::pool::Pool {
        self.executor.pool().clone()
    }

    /// Readies the side lane for a generation checking `per_job` tokens a side pass with
    /// `predict`: the one kept from an earlier generation if it checks as many, else a new one
    /// (thread started, window allocated; counted in `Counters::side_path_starts`).
    pub(crate) fn begin_side_lane(&mut self, per_job: usize, predict: Predict) -> Result<()> {
        if self.side.as_ref().is_none_or(|s| s.per_job() != per_job) {
            self.side = None;
            self.counters.side_path_starts += 1;
            self.side = Some(SideLane::new(&self.model, self.features, per_job)?);
        }
        self.side.as_mut().expect("set above").begin(predict)
    }

    /// The side lane's merge point after a dense pass that stored keys and values at
    /// `dense_stored` (see [`SideLane::merge`]): what its job checked, if one was running.
    pub(crate) fn merge_side(&mut self, dense_stored: &[u32]) -> Result<Option<SideChecks<'_>>> {
        let side = self.side.as_mut().ok_or_else(no_side_lane)?;
        side.merge(&mut self.window, &self.model, dense_stored)
    }

    /// Starts a job on the side lane, beside the next dense pass.
    pub(crate) fn launch_side(&mut self, job: &SideJob) -> Result<()> {
        let trace = self.trace.clone();
        self.side.as_mut().ok_or_else(no_side_lane)?.launch(job, trace)
    }

    /// The trace passes are recorded in, if any.
    pub fn trace(&self) -> Option<std::sync::Arc<crate::trace::Trace>> {
        self.trace.clone()
    }

    /// Instruction-set paths the session's kernels may take.
    pub fn features(&self) -> crate::kernels::cpu::Features {
        self.features
    }

    fn logits(&mut self, gid: u32, logit_rows: usize) -> &[f32] {
        let g = self.model.graph(gid);
        let range = value_range(g, &g.values[g.logits as usize], logit_rows, self.model.header.plan.window.activations.offset);
        &self.window.parts().activations[range]
    }

    /// One whole-sequence pass (the exact plan): returns the logits of `logit_rows`
    /// (positions in `seq`), `[logit_rows.len(), embedding_size]`, row-major. It also fills
    /// the KV cache with every position of `seq`.
    pub fn forward_full(&mut self, seq: &[u32], logit_rows: &[u32]) -> Result<&[f32]> {
        self.forward_span(seq, 0..seq.len(), logit_rows)
    }

    /// A pass over positions `span` of `seq` only: those rows store fresh keys and values,
    /// and attend to the cache for the rest of `seq` (as the last whole-sequence pass, or
    /// later passes over them, left it). Returns the logits at `logit_positions`.
    pub fn forward_span(&mut self, seq: &[u32], span: Range<usize>, logit_positions: &[u32]) -> Result<&[f32]> {
        let (gid, _) = self.pass(seq, span, logit_positions, false)?;
        Ok(self.logits(gid, logit_positions.len()))
    }

    /// A block-causal pass (LLaDA 2.x's block diffusion) over every block of `block_len` from
    /// position `from` (a block's start, every position before it stored by earlier block
    /// passes, contiguously from 0) to the end of `seq` (a block's end): each block's rows
    /// store their keys and values and attend to the positions before its end, the earlier
    /// ones from the cache, as the published mask lets them, with no rows for the blocks after
    /// `seq`. Over two blocks, what a finished block's store and the next block's first step
    /// compute, at once. Returns the logits at `logit_positions`.
    pub fn forward_blocks(&mut self, seq: &[u32], from: usize, block_len: usize, logit_positions: &[u32]) -> Result<&[f32]> {
        if block_len == 0 || from % block_len != 0 || seq.len() % block_len != 0 || from >= seq.len() || from > self.block_prefix || (self.cached_len.is_some() && from > 0) {
            return Err(Error::request(format!(
                "a block-causal pass over positions {from}..{} in blocks of {block_len} needs whole blocks and every position before {from} stored by earlier block passes ({} are)",
                seq.len(),
                if self.cached_len.is_some() { 0 } else { self.block_prefix }
            )));
        }
        self.cached_len = None;
        let span = from..seq.len();
        let gid = self.prepare(seq, span.clone(), logit_positions, true)?;
        // One block's rows all attend to the whole context: no runs to split (any backend).
        let causal = (span.len() > block_len).then_some(block_len);
        self.run_pass(gid, span.len(), seq.len(), logit_positions.len(), span.len(), causal, false)?;
        self.block_prefix = span.end;
        Ok(self.logits(gid, logit_positions.len()))
    }

    /// A block-causal pass over some positions of `seq` (which ends at a block's end): rows at
    /// `positions` (ascending) with their tokens of `seq`, each storing its keys and values
    /// and attending to the positions before its block's end, the others from the cache.
    /// Every position of `seq` that is not a row must be stored already (by block passes since
    /// the last whole-sequence pass): positions from where those reached must all be rows.
    /// Returns the logits of rows `logit_rows` (indexes into `positions`). LLaDA 2.x's `mbsd`.
    pub fn forward_block_rows(&mut self, seq: &[u32], positions: &[u32], block_len: usize, logit_rows: &[u32]) -> Result<&[f32]> {
        let n = positions.len();
        let prefix = if self.cached_len.is_some() { 0 } else { self.block_prefix };
        let ascending = positions.windows(2).all(|w| w[0] < w[1]);
        let reached = positions.iter().filter(|&&p| p as usize >= prefix).count() == seq.len().saturating_sub(prefix);
        if n == 0 || block_len == 0 || seq.len() % block_len != 0 || !ascending || positions[n - 1] as usize >= seq.len() || !reached {
            return Err(Error::request(format!(
                "a block-causal row-set pass over {n} rows of a {}-token sequence in blocks of {block_len} needs ascending rows inside it, whole blocks, and every position from {prefix} (what earlier block passes stored) among its rows",
                seq.len()
            )));
        }
        if let Some(&bad) = logit_rows.iter().find(|&&r| r as usize >= n) {
            return Err(Error::request(format!("logits asked for row {bad} of a {n}-row pass")));
        }
        check_tokens(&self.model, seq)?;
        let gid = self.model.graph_for_rows(n)?;
        self.check_logit_rows(gid, logit_rows.len())?;
        self.cached_len = None;
        self.tokens.clear();
        self.tokens.extend(positions.iter().map(|&p| seq[p as usize]));
        self.positions.clear();
        self.positions.extend_from_slice(positions);
        self.logit_rows.clear();
        self.logit_rows.extend_from_slice(logit_rows);
        self.pad(gid);
        self.run_pass(gid, n, seq.len(), logit_rows.len(), n, Some(block_len), false)?;
        self.block_prefix = self.block_prefix.max(seq.len());
        Ok(self.logits(gid, logit_rows.len()))
    }

    /// Stores the keys and values of `seq`'s blocks of `block_len` from position `from` on
    /// (`seq` ends at a block's end): one block-causal pass each, no logits. What a
    /// [`forward_blocks`](Self::forward_blocks) after them needs of the positions before it.
    pub fn store_blocks(&mut self, seq: &[u32], from: usize, block_len: usize) -> Result<()> {
        for start in (from..seq.len()).step_by(block_len.max(1)) {
            let end = (start + block_len).min(seq.len());
            self.forward_blocks(&seq[..end], start, block_len, &[])?;
        }
        Ok(())
    }

    /// Runs the pass over `span` (timing every op when `profiled`) and counts it.
    fn pass(&mut self, seq: &[u32], span: Range<usize>, logit_positions: &[u32], profiled: bool) -> Result<(u32, Option<OpProfile>)> {
        let gid = self.prepare(seq, span.clone(), logit_positions, false)?;
        let profile = self.run_pass(gid, span.len(), seq.len(), logit_positions.len(), span.len(), None, profiled)?;
        if span.len() == seq.len() {
            self.cached_len = Some(seq.len());
        }
        self.block_prefix = 0;
        Ok((gid, profile))
    }

    /// Runs graph `gid` over the prepared rows (`real_rows` of them before padding; the first
    /// `stored` store their keys and values; `context` cache positions are attended to, each
    /// row's only up to its block's end with `block_causal`) and counts it. After a pass that
    /// failed, the next one first sets the session up as a new one (see [`reset`](Self::reset)),
    /// or fails saying why it cannot.
    fn run_pass(&mut self, gid: u32, stored: usize, context: usize, logit_rows: usize, real_rows: usize, block_causal: Option<usize>, profiled: bool) -> Result<Option<OpProfile>> {
        if self.needs_reset {
            // Still failing (the artifact unreadable, say): this pass fails as that, and the
            // next one tries again.
            self.reset()?;
        }
        let g = self.model.graph(gid);
        let soft = (self.soft_rows > 0).then(|| &self.soft[..]);
        let inputs = RunInputs { tokens: &self.tokens, positions: &self.positions, stored_rows: stored, context, logit_rows: &self.logit_rows, rows: self.real_rows, block_causal, soft };
        let start = Instant::now();
        let mut profile = (profiled || self.op_profiles.is_some()).then(|| OpProfile { times: Vec::new(), matmul_ranges: self.matmul_ranges.then(Vec::new) });
        let pass = Pass { graph: gid, inputs, window: &mut self.window, stager: Some(&mut self.stager), moe: &mut self.moe, profile: profile.as_mut() };
        let run = self.executor.run(&self.model, pass).map(|()| profile);
        // Reads of a truncated artifact saw zeros: the pass computed nothing trustworthy.
        let profile = match run.and_then(|p| self.model.check_intact().map(|()| p)) {
            Ok(p) => p,
            Err(e) => {
                // The pass may have written part of the cache and left slots unreleased;
                // staging stops until the next pass sets everything up again.
                self.cached_len = None;
                self.block_prefix = 0;
                self.stager.stop();
                self.needs_reset = true;
                return Err(e);
            }
        };
        self.counters.forward_seconds += start.elapsed().as_secs_f64();
        if let Some(t) = &self.trace {
            t.span(crate::trace::Track::Dense, format!("pass {} ({real_rows} rows)", g.name), start, Instant::now());
        }
        let st = self.stager.end_pass();
        self.counters.staged_bytes += st.staged_bytes;
        self.counters.stall_seconds += st.stall_seconds;
        self.counters.copy_seconds += st.copy_seconds;
        self.last_staging = st;
        let loads = self.executor.take_loads();
        self.counters.context_loads += loads.contexts;
        self.counters.context_load_bytes += loads.bytes;
        self.counters.context_load_seconds += loads.seconds;
        self.counters.context_loads_overlapped += loads.overlapped;
        self.counters.context_load_wait_seconds += loads.wait_seconds;
        self.counters.forward_passes += 1;
        self.counters.rows_computed += if self.executor.capabilities().cost_per_row { real_rows } else { g.rows as usize } as u64;
        self.counters.logit_rows_computed += logit_rows as u64;
        match (self.op_profiles.as_mut(), profile) {
            // Kept for `take_op_profiles` (a copy only when the caller wants it too).
            (Some(all), Some(ops)) => {
                let returned = profiled.then(|| ops.clone());
                all.push(PassProfile { graph: gid, rows: real_rows, logit_rows, ops });
                Ok(returned)
            }
            (_, profile) => Ok(profile),
        }
    }

    /// Brings the session back to the state a new one has, after a pass failed part-way: the
    /// staging thread starts again from the first segment and the experts are set up afresh
    /// (the cache was emptied when the pass failed). Fails, for this pass, if the artifact no
    /// longer reads; the next pass tries again.
    fn reset(&mut self) -> Result<()> {
        self.model.check_intact()?;
        self.stager.restart()?;
        if self.model.header.model.moe.is_some() {
            // The old runtime is dropped first (its staging thread joined), so a failed setup
            // leaves none behind and the next reset tries again.
            let (model, window, options) = (&self.model, &self.window, self.expert_options);
            self.moe.set_experts(|| Experts::new(model, window, options.strategy, options.cpu_threads))?;
        }
        self.needs_reset = false;
        Ok(())
    }
}

/// The error of a side-lane ask before the lane was set up.
fn no_side_lane() -> Error {
    Error::Internal("the session's CPU side lane is not set up".to_string())
}

fn check_tokens(model: &Model, tokens: &[u32]) -> Result<()> {
    let vocab = model.header.model.embedding_size;
    match tokens.iter().find(|&&t| t >= vocab) {
        Some(&bad) => Err(Error::request(format!("token id {bad} is outside the vocabulary (0..{vocab})"))),
        None => Ok(()),
    }
}

/// Reads every resident segment from the artifact into its place in the window (with
/// `pread`, so the bytes are resident once: in the window, not also in a mapping).
fn load_resident(model: &Model, window: &mut Window) -> Result<()> {
    let h = &model.header;
    let (region, base) = window.resident_mut();
    for r in &h.plan.window.resident {
        let seg = &h.segments[r.segment as usize];
        model.read_data(&mut region[(r.offset - base) as usize..][..seg.nbytes as usize], seg.offset)?;
    }
    Ok(())
}
