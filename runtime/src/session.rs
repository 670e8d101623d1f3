//! A session binds a loaded model to one window and one executor, and runs forward passes
//! the plan allows. It counts what it did, so every decoding policy reports the same figures.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::executor::{value_range, Executor, HostExecutor, OpProfile, RunInputs, Window};
use crate::model::Model;

/// What a session has computed so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Graph runs.
    pub forward_passes: u64,
    /// Token rows computed, padding included (the static graphs compute every row).
    pub rows_computed: u64,
    /// Logit rows computed by the output head.
    pub head_rows_computed: u64,
    /// Wall time spent inside graph runs.
    pub forward_seconds: f64,
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

pub struct Session<'m> {
    pub model: &'m Model,
    window: Window,
    executor: HostExecutor,
    tokens: Vec<u32>,
    positions: Vec<u32>,
    pub counters: Counters,
}

impl<'m> Session<'m> {
    /// A session on all the default threads (see [`default_threads`]).
    pub fn new(model: &'m Model) -> Session<'m> {
        Session::with_threads(model, default_threads())
    }

    pub fn with_threads(model: &'m Model, threads: usize) -> Session<'m> {
        Session::with_features(model, threads, crate::kernels::cpu::features())
    }

    /// A session whose matmuls may use only `features` (fewer than detected forces the
    /// portable fallbacks, as `LLADA_ISA` does for a whole process).
    pub fn with_features(model: &'m Model, threads: usize, features: crate::kernels::cpu::Features) -> Session<'m> {
        let window_bytes = model.header.graphs.iter().map(|g| g.window_bytes).max().unwrap_or(0);
        let max_rows = model.header.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        Session {
            model,
            window: Window::new(window_bytes),
            executor: HostExecutor::new(model, threads, features),
            tokens: Vec::with_capacity(max_rows),
            positions: Vec::with_capacity(max_rows),
            counters: Counters::default(),
        }
    }

    pub fn threads(&self) -> usize {
        self.executor.threads()
    }

    /// Bytes of the window this session allocated.
    pub fn window_bytes(&self) -> u64 {
        self.window.bytes()
    }

    /// Most logit rows one pass over a sequence of `len` tokens can return.
    pub fn head_capacity(&self, len: usize) -> Result<usize> {
        Ok(self.model.graph(self.model.exact_graph_for(len)?).head_rows as usize)
    }

    /// [`forward_full`](Self::forward_full), timing every op: for `llada-rt bench`.
    pub fn forward_full_profiled(&mut self, seq: &[u32], head_rows: &[u32]) -> Result<(u32, OpProfile)> {
        let gid = self.model.exact_graph_for(seq.len())?;
        self.prepare_full(gid, seq, head_rows)?;
        let g = self.model.graph(gid);
        let inputs = RunInputs { tokens: &self.tokens, positions: &self.positions, valid_keys: seq.len(), head_rows };
        let profile = self.executor.run_profiled(self.model, g, &inputs, &mut self.window);
        self.counters.forward_passes += 1;
        self.counters.rows_computed += g.rows as u64;
        Ok((gid, profile))
    }

    /// Checks a whole-sequence request against graph `gid` and fills the token and position rows.
    fn prepare_full(&mut self, gid: u32, seq: &[u32], head_rows: &[u32]) -> Result<()> {
        let g = self.model.graph(gid);
        let m = &self.model.header.model;
        if head_rows.len() > g.head_rows as usize {
            return Err(Error::request(format!(
                "{} logit rows were requested in one pass but {} was compiled for at most {}; \
                 use a smaller --block-len or recompile with `lladac compile --head-rows {}`",
                head_rows.len(),
                self.model.path.display(),
                g.head_rows,
                head_rows.len()
            )));
        }
        if let Some(&bad) = seq.iter().find(|&&t| t >= m.embedding_size) {
            return Err(Error::request(format!("token id {bad} is outside the vocabulary (0..{})", m.embedding_size)));
        }
        if let Some(&bad) = head_rows.iter().find(|&&r| r as usize >= seq.len()) {
            return Err(Error::request(format!("logits asked for row {bad} of a {}-token sequence", seq.len())));
        }
        self.tokens.clear();
        self.tokens.extend_from_slice(seq);
        self.tokens.resize(g.rows as usize, self.model.header.special.mask);
        self.positions.clear();
        self.positions.extend(0..g.rows);
        Ok(())
    }

    /// One whole-sequence pass (the exact plan): returns the logits of `head_rows`
    /// (positions in `seq`), `[head_rows.len(), embedding_size]`, row-major.
    pub fn forward_full(&mut self, seq: &[u32], head_rows: &[u32]) -> Result<&[f32]> {
        let gid = self.model.exact_graph_for(seq.len())?;
        self.prepare_full(gid, seq, head_rows)?;
        let g = self.model.graph(gid);
        let inputs = RunInputs { tokens: &self.tokens, positions: &self.positions, valid_keys: seq.len(), head_rows };
        let start = Instant::now();
        self.executor.run(self.model, g, &inputs, &mut self.window);
        self.counters.forward_seconds += start.elapsed().as_secs_f64();
        self.counters.forward_passes += 1;
        self.counters.rows_computed += g.rows as u64;
        self.counters.head_rows_computed += head_rows.len() as u64;
        let range = value_range(g, &g.values[g.logits as usize], head_rows.len());
        Ok(&self.window.floats()[range])
    }
}
