//! Executors run one planned graph over the window. The host executor is the CPU standing in
//! for an accelerator; a phone backend would implement the same trait over the same plan.

use std::ops::Range;

use llada_ir::{Graph, Op, Rows, Value};

use rayon::prelude::*;

use crate::kernels::cpu::Features;
use crate::kernels::gemm::{gemm, Prepared};
use crate::kernels::{self, attention};
use crate::model::Model;

/// What one run of a graph needs besides the window: the token rows and which rows' logits
/// to produce.
pub struct RunInputs<'a> {
    /// One token per graph row (padding rows hold any valid token).
    pub tokens: &'a [u32],
    /// Position of each row (indexes the rotary tables and the KV cache).
    pub positions: &'a [u32],
    /// Rows `0..real_rows` are real; later rows are padding, never stored in the cache.
    pub real_rows: usize,
    /// Cache positions `0..context` are the keys every row attends to.
    pub context: usize,
    /// Rows whose logits the sampler needs, in output order.
    pub head_rows: &'a [u32],
}

pub trait Executor {
    /// Runs `graph` (verified at load) with `inputs`; values live in `window`, keys and
    /// values in `cache`.
    fn run(&mut self, model: &Model, graph: &Graph, inputs: &RunInputs, window: &mut Window, cache: &mut KvCache);
}

/// Keys and values of every layer: per layer `2 * kv_heads` head planes of `[capacity,
/// head_dim]` (see [`attention::kv_plane`]), f32, so a cached pass reads exactly what a
/// whole-sequence pass stored.
pub struct KvCache {
    /// Zeroed storage from `calloc`: positions never written never become resident.
    buf: Vec<f32>,
    capacity: usize,
    /// Floats per layer.
    layer: usize,
}

impl KvCache {
    pub fn new(model: &Model) -> KvCache {
        let m = &model.header.model;
        let capacity = model.header.plan.kv_capacity as usize;
        let layer = 2 * (m.n_kv_heads * m.head_dim) as usize * capacity;
        KvCache { buf: bytemuck::zeroed_vec(m.n_layers as usize * layer), capacity, layer }
    }

    fn layer_mut(&mut self, layer: usize) -> &mut [f32] {
        &mut self.buf[layer * self.layer..(layer + 1) * self.layer]
    }
}

/// The accelerator window: allocated once per session, sized by the plan, its start aligned
/// to 64 bytes so every value offset in the plan is a cache-line boundary.
pub struct Window {
    /// Zeroed storage from `calloc`: pages a run never touches never become resident. (A
    /// 64-byte-aligned type would make the allocator zero every page by hand.)
    buf: Vec<f32>,
    /// Floats before the first 64-byte boundary.
    start: usize,
    len: usize,
}

impl Window {
    pub fn new(bytes: u64) -> Window {
        let len = (bytes.div_ceil(64) * 16) as usize;
        let buf: Vec<f32> = bytemuck::zeroed_vec(len + 15);
        let start = buf.as_ptr().align_offset(64);
        assert!(start < 16, "f32 storage is 4-byte aligned");
        Window { buf, start, len }
    }

    pub fn bytes(&self) -> u64 {
        self.len as u64 * 4
    }

    pub fn floats(&self) -> &[f32] {
        &self.buf[self.start..self.start + self.len]
    }

    fn floats_mut(&mut self) -> &mut [f32] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// Float range a value occupies for this run (head values use only the rows asked for).
pub fn value_range(g: &Graph, v: &Value, head_rows: usize) -> Range<usize> {
    let rows = match v.rows {
        Rows::Tokens => g.rows as usize,
        Rows::Head => head_rows,
    };
    let start = (v.offset / 4) as usize;
    start..start + rows * v.cols as usize
}

/// Shared views of an op's inputs and a mutable view of its output, all in one window.
fn operands<'w, const N: usize>(win: &'w mut [f32], ins: [Range<usize>; N], out: Range<usize>) -> ([&'w [f32]; N], &'w mut [f32]) {
    assert!(out.end <= win.len(), "output outside the window");
    for r in &ins {
        assert!(r.end <= win.len(), "input outside the window");
        assert!(r.end <= out.start || out.end <= r.start, "output overlaps an input");
    }
    let base = win.as_mut_ptr();
    // SAFETY: every range lies inside `win` and the output range is disjoint from every input
    // range (both asserted above), so the one mutable slice aliases none of the shared ones;
    // all borrow `win` mutably for 'w, so nothing else can touch it meanwhile.
    unsafe {
        (
            ins.map(|r| std::slice::from_raw_parts(base.add(r.start), r.len())),
            std::slice::from_raw_parts_mut(base.add(out.start), out.len()),
        )
    }
}

/// The CPU executor. Scratch space is sized once for the model, so running a graph does
/// not allocate (beyond what the thread pool does internally).
pub struct HostExecutor {
    /// Activations prepared for the matmul kernels (quantised or converted).
    prepared: Prepared,
    /// Attention scores: four query rows of keys per thread.
    scores: Vec<f32>,
    pool: rayon::ThreadPool,
    /// Instruction-set paths the matmul kernels may take.
    features: Features,
}

impl HostExecutor {
    /// An executor using `threads` threads (at least one) and the kernel paths `features`
    /// allows (normally `cpu::features()`; fewer to force the portable fallbacks).
    pub fn new(model: &Model, threads: usize, features: Features) -> HostExecutor {
        let max_rows = model.header.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("llada-worker-{i}"))
            .build()
            .expect("the thread pool starts");
        let keys = max_rows.max(model.header.plan.kv_capacity as usize).max(1);
        HostExecutor { prepared: Prepared::default(), scores: vec![0.0; threads * 4 * keys], pool, features }
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }
}

/// Time spent per kind of op in one run, for `llada-rt bench`.
#[derive(Debug, Clone, Default)]
pub struct OpProfile {
    /// (op index, seconds).
    pub times: Vec<(usize, f64)>,
}

impl HostExecutor {
    /// Runs `g` and records each op's wall time.
    pub fn run_profiled(&mut self, model: &Model, g: &Graph, inputs: &RunInputs, window: &mut Window, cache: &mut KvCache) -> OpProfile {
        let mut profile = OpProfile::default();
        self.run_ops(model, g, inputs, window, cache, Some(&mut profile));
        profile
    }

    fn run_ops(&mut self, model: &Model, g: &Graph, inp: &RunInputs, window: &mut Window, cache: &mut KvCache, mut profile: Option<&mut OpProfile>) {
        let m = &model.header.model;
        let hd = m.head_dim as usize;
        let nh = inp.head_rows.len();
        let range = |v: u32| value_range(g, &g.values[v as usize], nh);
        let cols = |v: u32| g.values[v as usize].cols as usize;
        let rows_of = |v: u32| match g.values[v as usize].rows {
            Rows::Tokens => g.rows as usize,
            Rows::Head => nh,
        };
        let win = window.floats_mut();
        for (index, op) in g.ops.iter().enumerate() {
            let start = profile.as_ref().map(|_| std::time::Instant::now());
            match *op {
                Op::Embed { table, out } => {
                    let c = cols(out);
                    let ([], o) = operands(win, [], range(out));
                    for (row, &t) in o.chunks_exact_mut(c).zip(inp.tokens) {
                        kernels::embed_row(model.weights(table), c, t as usize, row);
                    }
                }
                Op::Scale { x, factor } => kernels::scale(&mut win[range(x)], factor),
                Op::RmsNorm { x, weight, eps, out } => {
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    kernels::rms_norm(xs, model.f32s(weight), eps, o);
                }
                Op::MatMul { x, weight, out } => {
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    gemm(xs, rows_of(x), &model.matrix(weight), o, &mut self.prepared, &self.pool, self.features);
                }
                Op::Rope { x, heads, cos, sin } => {
                    let half = hd / 2;
                    let (cos, sin) = (model.f32s(cos), model.f32s(sin));
                    let c = cols(x);
                    for (row, &p) in win[range(x)].chunks_exact_mut(c).zip(inp.positions) {
                        let t = p as usize * half..(p as usize + 1) * half;
                        kernels::rope_row(&mut row[..heads as usize * hd], hd, &cos[t.clone()], &sin[t]);
                    }
                }
                Op::Attention { qkv, out, heads, kv_heads, layer } => {
                    let ([q], o) = operands(win, [range(qkv)], range(out));
                    let width = cols(qkv);
                    let capacity = cache.capacity;
                    let kv = cache.layer_mut(layer as usize);
                    // Each row's key and value heads (after the query heads) go to their planes.
                    for plane in 0..2 * kv_heads as usize {
                        let (from, base) = ((heads as usize + plane) * hd, attention::kv_plane(plane, capacity, hd));
                        for (r, &p) in inp.positions[..inp.real_rows].iter().enumerate() {
                            let at = base + p as usize * hd;
                            kv[at..at + hd].copy_from_slice(&q[r * width + from..r * width + from + hd]);
                        }
                    }
                    let kv = &*kv;
                    let shape = attention::Shape { width, capacity, heads: heads as usize, kv_heads: kv_heads as usize, head_dim: hd, keys: inp.context };
                    let out_width = cols(out);
                    let threads = self.pool.current_num_threads();
                    let rows = g.rows as usize;
                    let per = rows.div_ceil(threads).max(1);
                    let scores_per = self.scores.len() / threads;
                    self.pool.install(|| {
                        o.par_chunks_mut(per * out_width).zip(self.scores.par_chunks_mut(scores_per)).enumerate().for_each(|(t, (chunk, scores))| {
                            attention::attend(q, kv, shape, t * per, chunk, scores);
                        })
                    });
                }
                Op::SwiGlu { x, out } => {
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    let hidden = cols(out);
                    let per = rows_of(out).div_ceil(self.pool.current_num_threads()).max(1);
                    self.pool.install(|| {
                        o.par_chunks_mut(per * hidden).zip(xs.par_chunks(per * 2 * hidden)).for_each(|(o, x)| kernels::swiglu(x, hidden, o))
                    });
                }
                Op::Add { acc, x } => {
                    let ([xs], a) = operands(win, [range(x)], range(acc));
                    kernels::add(a, xs);
                }
                Op::GatherHeadRows { x, out } => {
                    let c = cols(x);
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    for (row, &r) in o.chunks_exact_mut(c).zip(inp.head_rows) {
                        row.copy_from_slice(&xs[r as usize * c..(r as usize + 1) * c]);
                    }
                }
            }
            if let (Some(p), Some(t)) = (profile.as_deref_mut(), start) {
                p.times.push((index, t.elapsed().as_secs_f64()));
            }
        }
    }
}

impl Executor for HostExecutor {
    fn run(&mut self, model: &Model, g: &Graph, inputs: &RunInputs, window: &mut Window, cache: &mut KvCache) {
        self.run_ops(model, g, inputs, window, cache, None);
    }
}

#[cfg(test)]
mod tests {
    use super::operands;

    #[test]
    fn operands_are_the_requested_ranges() {
        let mut win: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let ([a, b], out) = operands(&mut win, [0..4, 2..6], 8..12);
        assert_eq!((a, b), (&[0.0, 1.0, 2.0, 3.0][..], &[2.0, 3.0, 4.0, 5.0][..]));
        out.copy_from_slice(&[9.0; 4]);
        assert_eq!(&win[8..12], &[9.0; 4]);
    }

    #[test]
    #[should_panic(expected = "output overlaps an input")]
    fn an_output_overlapping_an_input_is_refused() {
        let mut win = vec![0.0f32; 16];
        let _ = operands(&mut win, [0..8], 4..12);
    }

    #[test]
    #[should_panic(expected = "outside the window")]
    fn a_range_outside_the_window_is_refused() {
        let mut win = vec![0.0f32; 16];
        let _ = operands(&mut win, [0..8], 12..20);
    }
}
