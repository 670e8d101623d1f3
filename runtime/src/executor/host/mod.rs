//! The host executor: the CPU's kernels standing in for an accelerator, under the target's
//! window, row buckets and dtypes. Also the CPU side path's executor (revision checks).

use llada_ir::window_sizes::attention_scratch as attention_scratch_size;
use llada_ir::program::Step;
use llada_ir::{Graph, Op, Rows, TensorId, ValueId};

use rayon::prelude::*;

use crate::error::Result;
use crate::kernels::cpu::Features;
use crate::kernels::gemm::gemm;
use crate::kernels;
use crate::model::Model;
use crate::pool::Pool;
use crate::moe::MoeStep;
use crate::operands::operands;
use crate::window::{homes, Home, KvView, SlotPtr, Window};

use super::{value_range, AttentionOp, Backend, Capabilities, Executor, Pass, RunInputs, SoftEmbed};

mod attend;

pub const BACKEND: Backend = Backend {
    name: "host",
    about: "the host CPU's kernels, standing in for an accelerator under the target's window, row buckets and dtypes",
    constructor: Ok(|model, threads, features| {
        let window = Window::in_host_memory(&model.header)?;
        Ok((Box::new(HostExecutor::new(model, threads, features)), window))
    }),
};

/// The CPU executor. Its scratch (prepared GEMM operands, attention scores) is in the
/// window, so running a graph does not allocate (beyond what the thread pool does
/// internally).
pub struct HostExecutor {
    pool: Pool,
    /// Instruction-set paths the matmul kernels may take.
    features: Features,
    /// Where each tensor lives in the window.
    homes: Vec<Home>,
    capabilities: Capabilities,
}

impl HostExecutor {
    /// An executor using `threads` threads (at least one, at most what the plan's scratch is
    /// sized for) and the kernel paths `features` allows (normally `cpu::features()`; fewer
    /// to force the portable fallbacks).
    pub fn new(model: &Model, threads: usize, features: Features) -> HostExecutor {
        let threads = threads.clamp(1, model.header.plan.window.scratch.threads.max(1) as usize);
        HostExecutor::with_pool(model, Pool::new(threads, "llada-worker").expect("the thread pool starts"), features)
    }

    fn with_pool(model: &Model, pool: Pool, features: Features) -> HostExecutor {
        let capabilities = Capabilities {
            backend: "host",
            device: format!("host CPU, kernel paths {features:?}"),
            runs_on_cpu: true,
            cost_per_row: true,
            max_allocation_bytes: u64::MAX,
            device_timestamps: false,
            int8_dot: features.avx512_vnni() || features.dotprod(),
        };
        HostExecutor { pool, features, homes: homes(&model.header), capabilities }
    }

    /// An executor for the CPU side path: it reads every weight from the artifact itself
    /// (never from the accelerator window's resident segments or slots), so it runs
    /// alongside the accelerator path without touching its weights or staging.
    /// Its kernels run on `pool`.
    pub fn cpu_side_path(model: &Model, pool: Pool, features: Features) -> HostExecutor {
        let mut e = HostExecutor::with_pool(model, pool, features);
        e.homes.iter_mut().for_each(|h| *h = Home::Host);
        e
    }
    /// Runs graph `graph` with every weight in its home on the host (an executor from
    /// [`cpu_side_path`](Self::cpu_side_path)): no staging, the experts through `moe` (one
    /// without an expert runtime: every expert here).
    pub fn run_unstaged(&mut self, model: &Model, graph: u32, inputs: RunInputs<'_>, window: &mut Window, moe: &mut MoeStep) -> Result<()> {
        self.run_program(model, Pass { graph, inputs, window, stager: None, moe, profile: None })
    }

    /// Follows the graph's program: the stager's waits and releases, the dense ops on the
    /// host's kernels, the experts through the session's CPU step.
    fn run_program(&mut self, model: &Model, pass: Pass<'_>) -> Result<()> {
        let Pass { graph, inputs, window, mut stager, moe, mut profile } = pass;
        let g = model.graph(graph);
        let parts = window.parts();
        let staged_slots = stager.as_ref().map(|s| s.slots());
        let threads = self.pool.current_num_threads();
        let v = OpView {
            model,
            g,
            inp: &inputs,
            homes: &self.homes,
            resident: parts.resident,
            resident_offset: parts.resident_offset,
            // No stager: every home is the host (`cpu_side_path`), no slot is read.
            slots: staged_slots.as_deref().unwrap_or(&[]),
            base: parts.activations_offset,
            features: self.features,
            threads,
        };
        let plan = &model.header.plan;
        let (score_floats, widened_floats, _) = attention_scratch_size(&model.header.model, plan.kv_capacity, plan.window.kv_dtype, threads as u32);
        let (scores, widened) = parts.attention.split_at_mut(score_floats as usize * threads);
        let mut b = OpBuffers { win: parts.activations, kv: parts.kv, gemm: parts.gemm, scores, score_floats: score_floats as usize, widened: &mut widened[..widened_floats as usize] };
        for &step in model.program(graph) {
            let (ops, experts) = match step {
                Step::Wait { .. } | Step::Release { .. } => {
                    if let Some(s) = stager.as_deref_mut() {
                        s.follow(step)?;
                    }
                    continue;
                }
                Step::Embed { op } => (op..op + 1, false),
                Step::Dense { start, end } => (start..end, false),
                Step::Moe { start, end } => (start..end, true),
            };
            for index in ops.map(|i| i as usize) {
                let start = profile.as_ref().map(|_| std::time::Instant::now());
                let op = &g.ops[index];
                if experts {
                    moe.run(model, g, index, &inputs, b.win, v.base, b.gemm)?;
                } else {
                    self.run_op(&v, &mut b, op);
                }
                if let (Some(p), Some(t)) = (profile.as_deref_mut(), start) {
                    p.times.push((index, t.elapsed().as_secs_f64()));
                    if let (Some(ranges), &Op::MatMul { x, weight, out }) = (p.matmul_ranges.as_mut(), op) {
                        ranges.push(super::MatMulRange::of(weight, &b.win[v.range(x)], &b.win[v.range(out)]));
                    }
                }
            }
        }
        Ok(())
    }

    /// One dense op on the host's kernels.
    fn run_op(&self, v: &OpView<'_>, b: &mut OpBuffers<'_>, op: &Op) {
        let features = v.features;
        let hd = v.model.header.model.head_dim as usize;
        match *op {
            Op::Embed { table, out } => {
                let c = v.cols(out);
                let ([], o) = operands(b.win, [], v.range(out));
                kernels::embed_rows(v.model.weights(table), c, v.inp.tokens, o);
            }
            Op::Scale { x, factor } => kernels::scale(&mut b.win[v.range(x)], factor),
            Op::Bias { x, bias } => {
                let bias = v.f32s(bias);
                b.win[v.range(x)].chunks_exact_mut(bias.len()).for_each(|row| kernels::add(features, row, bias));
            }
            Op::RmsNorm { x, weight, eps, out } => {
                let ([xs], o) = operands(b.win, [v.range(x)], v.range(out));
                let (w, c) = (v.f32s(weight), v.cols(x));
                // A row at a time, as threads are free (see Attention).
                self.pool.install(|| o.par_chunks_mut(c).zip(xs.par_chunks(c)).for_each(|(o, x)| kernels::rms_norm(features, x, w, eps, o)));
            }
            Op::MatMul { x, weight: w, out } => {
                let ([xs], o) = operands(b.win, [v.range(x)], v.range(out));
                gemm(xs, v.rows_of(x), &v.model.matrix_at(w, v.weight(w)), o, b.gemm, &self.pool, features);
            }
            Op::Rope { x, heads, cos, sin } => self.rope(v, b, x, (heads, hd), (cos, sin)),
            Op::Attention { .. } | Op::WindowAttention { .. } => {
                let a = AttentionOp::of(op, &v.model.header.model).expect("an attention op");
                self.attention(v, b, a.qkv, a.out, a.shape, a.layer)
            }
            Op::GeluGlu { x, out } => {
                let ([xs], o) = operands(b.win, [v.range(x)], v.range(out));
                let hidden = v.cols(out);
                self.pool.install(|| o.par_chunks_mut(hidden).zip(xs.par_chunks(2 * hidden)).for_each(|(o, x)| kernels::gemma::gelu_glu(x, hidden, o)));
            }
            Op::Softcap { x, cap } => {
                // (A canvas's logits: 67M entries at DiffusionGemma's real shape.)
                let cols = v.cols(x);
                self.pool.install(|| b.win[v.range(x)].par_chunks_mut(cols).for_each(|row| kernels::gemma::softcap(row, cap)));
            }
            Op::RopeHeads { x, heads, head_dim, cos, sin } => self.rope(v, b, x, (heads, head_dim as usize), (cos, sin)),
            Op::NormHeads { x, first_head, heads, head_dim, weight, eps } => {
                let (c, hd) = (v.cols(x), head_dim as usize);
                let span = first_head as usize * hd..(first_head + heads) as usize * hd;
                let weight = weight.map(|w| v.f32s(w));
                for row in b.win[v.range(x)].chunks_exact_mut(c) {
                    kernels::gemma::norm_heads(features, &mut row[span.clone()], hd, weight, eps);
                }
            }
            Op::SoftEmbed { x, table, scale, out } => SoftEmbed { x, table, scale, out }.run(v.model, v.g, v.inp, b.win, v.base, &self.pool, features),
            Op::SwiGlu { x, out } => {
                // A row at a time, as threads are free (see Attention).
                let ([xs], o) = operands(b.win, [v.range(x)], v.range(out));
                let hidden = v.cols(out);
                self.pool.install(|| o.par_chunks_mut(hidden).zip(xs.par_chunks(2 * hidden)).for_each(|(o, x)| kernels::swiglu(features, x, hidden, o)));
            }
            Op::Add { acc, x } => {
                let ([xs], a) = operands(b.win, [v.range(x)], v.range(acc));
                // Four rows a task: a row's sum is about what handing it to a thread costs.
                let chunk = 4 * v.cols(acc);
                self.pool.install(|| a.par_chunks_mut(chunk).zip(xs.par_chunks(chunk)).for_each(|(a, x)| kernels::add(features, a, x)));
            }
            Op::GatherLogitRows { x, out } => {
                let c = v.cols(x);
                let ([xs], o) = operands(b.win, [v.range(x)], v.range(out));
                for (row, &r) in o.chunks_exact_mut(c).zip(v.inp.logit_rows) {
                    row.copy_from_slice(&xs[r as usize * c..(r as usize + 1) * c]);
                }
            }
            Op::HeadRmsNorm { x, first_head, heads, weight, eps } => {
                let c = v.cols(x);
                let span = first_head as usize * hd..(first_head + heads) as usize * hd;
                for row in b.win[v.range(x)].chunks_exact_mut(c) {
                    kernels::head_rms_norm(features, &mut row[span.clone()], v.f32s(weight), eps);
                }
            }
            // The program hands these to the session's CPU step (`Step::Moe`).
            Op::Route { .. } | Op::RouteSigmoid { .. } | Op::RouteScaled { .. } | Op::MoeExperts { .. } => unreachable!("the verified program runs op {} as an experts step", op.name()),
        }
    }
}

impl HostExecutor {
    /// Rotary embedding in place on the first `heads` heads of `head_dim` of every row of `x`,
    /// at each row's position in the `(cos, sin)` tables.
    fn rope(&self, v: &OpView<'_>, b: &mut OpBuffers<'_>, x: ValueId, (heads, head_dim): (u32, usize), (cos, sin): (TensorId, TensorId)) {
        let (features, half) = (v.features, head_dim / 2);
        let (cos, sin) = (v.f32s(cos), v.f32s(sin));
        let c = v.cols(x);
        // A row at a time, as threads are free (see Attention).
        self.pool.install(|| {
            b.win[v.range(x)].par_chunks_exact_mut(c).zip(v.inp.positions.par_iter()).for_each(|(row, &p)| {
                let t = p as usize * half..(p as usize + 1) * half;
                kernels::rope_row(features, &mut row[..heads as usize * head_dim], head_dim, &cos[t.clone()], &sin[t]);
            })
        });
    }
}

/// What a pass's ops read in place: the model, graph and inputs, and each weight where the
/// plan put it (resident, in its slot, or in the artifact).
struct OpView<'p> {
    model: &'p Model,
    g: &'p Graph,
    inp: &'p RunInputs<'p>,
    homes: &'p [Home],
    resident: &'p [u8],
    resident_offset: u64,
    /// The stager's slots; rotating segment `i` is in slot `i % slots.len()`.
    slots: &'p [SlotPtr],
    /// First byte of the activation region.
    base: u64,
    features: Features,
    threads: usize,
}

impl<'p> OpView<'p> {
    fn cols(&self, v: ValueId) -> usize {
        self.g.values[v as usize].cols as usize
    }

    /// The real rows only: padding rows are never stored or read, and on the CPU every row
    /// computed costs its time, so a graph's padding costs nothing here.
    fn rows_of(&self, v: ValueId) -> usize {
        match self.g.values[v as usize].rows {
            Rows::Tokens => self.inp.rows,
            Rows::Logits => self.inp.logit_rows.len(),
        }
    }

    /// Value `v`'s real rows in the activation region.
    fn range(&self, v: ValueId) -> std::ops::Range<usize> {
        let r = value_range(self.g, &self.g.values[v as usize], self.inp.logit_rows.len(), self.base);
        r.start..r.start + self.rows_of(v) * self.cols(v)
    }

    /// The bytes of a tensor an op reads: in the window (resident or in its slot), or, for
    /// the embedding the CPU gathers, in the artifact.
    fn weight(&self, t: TensorId) -> &'p [u8] {
        let n = self.model.header.tensors[t as usize].nbytes as usize;
        match self.homes[t as usize] {
            Home::Resident { offset } => &self.resident[(offset - self.resident_offset) as usize..][..n],
            // SAFETY: the program waited for this segment's slot to be ready before its first
            // op, and releases the slot only after its last op, after this use.
            Home::Rotating { rotating, offset } => unsafe { &self.slots[rotating as usize % self.slots.len().max(1)].bytes()[offset as usize..][..n] },
            Home::Host => self.model.tensor_bytes(t),
        }
    }

    fn f32s(&self, t: TensorId) -> &'p [f32] {
        bytemuck::cast_slice(self.weight(t))
    }
}

/// What a pass's ops write: the activations, the KV cache and the kernels' scratch.
struct OpBuffers<'w> {
    win: &'w mut [f32],
    kv: KvView<'w>,
    gemm: &'w mut [u8],
    /// Each thread's attention scores, `score_floats` apiece.
    scores: &'w mut [f32],
    score_floats: usize,
    /// A half-precision cache's keys and values, widened to f32 for the kernels.
    widened: &'w mut [f32],
}

impl Executor for HostExecutor {
    fn run(&mut self, model: &Model, pass: Pass<'_>) -> Result<()> {
        // The whole pass on one of the pool's threads: each op's parallel part then starts
        // from inside the team instead of handing over from this thread and back (two
        // wake-ups per op, a few hundred ops per pass).
        let pool = self.pool.clone();
        pool.install(|| self.run_program(model, pass))
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn pool(&self) -> &Pool {
        &self.pool
    }
}
