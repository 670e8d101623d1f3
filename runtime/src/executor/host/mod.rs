//! The host executor: the CPU's kernels standing in for an accelerator, under the target's
//! window, row buckets and dtypes. Also the CPU side path's executor (revision checks).

use std::sync::atomic::{AtomicUsize, Ordering};

use llada_ir::window_sizes::attention_scratch as attention_scratch_size;
use llada_ir::{Graph, Op, Rows, TensorId};

use rayon::prelude::*;

use crate::error::Result;
use crate::kernels::cpu::Features;
use crate::kernels::gemm::gemm;
use crate::kernels::{self, attention};
use crate::model::Model;
use crate::pool::Pool;
use crate::moe::MoeStep;
use crate::operands::operands;
use crate::staging::Stager;
use crate::window::{homes, Home, KvView, Window};

use super::{value_range, Backend, Capabilities, Executor, OpProfile, Pass, RunInputs};

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

    /// Runs `g` with every weight in its home on the host (an executor from
    /// [`cpu_side_path`](Self::cpu_side_path)): no staging, the experts through `moe` (one
    /// without an expert runtime: every expert here).
    pub fn run_unstaged(&mut self, model: &Model, g: &Graph, inputs: &RunInputs, window: &mut Window, moe: &mut MoeStep) -> Result<()> {
        self.run_ops(model, g, inputs, window, None, moe, None)
    }
}

impl HostExecutor {
    #[allow(clippy::too_many_arguments)]
    fn run_ops(
        &mut self,
        model: &Model,
        g: &Graph,
        inp: &RunInputs,
        window: &mut Window,
        mut stager: Option<&mut Stager>,
        moe: &mut MoeStep,
        mut profile: Option<&mut OpProfile>,
    ) -> Result<()> {
        let m = &model.header.model;
        let plan = &model.header.plan;
        let hd = m.head_dim as usize;
        let nh = inp.head_rows.len();
        let parts = window.parts();
        let base = parts.activations_offset;
        let cols = |v: u32| g.values[v as usize].cols as usize;
        // The real rows only: padding rows are never stored or read, and on the CPU every row
        // computed costs its time, so a graph's padding costs nothing here.
        let rows_of = |v: u32| match g.values[v as usize].rows {
            Rows::Tokens => inp.rows,
            Rows::Head => nh,
        };
        let range = |v: u32| {
            let r = value_range(g, &g.values[v as usize], nh, base);
            r.start..r.start + rows_of(v) * cols(v)
        };
        let (win, resident, resident_offset) = (parts.activations, parts.resident, parts.resident_offset);
        let (kv, gemm_scratch, attention_scratch) = (parts.kv, parts.gemm, parts.attention);
        let homes = &self.homes;
        let features = self.features;
        // No stager: every home is the host (`cpu_side_path`), no slot is read.
        let staged_slots = stager.as_ref().map(|s| s.slots());
        let slots: &[crate::window::SlotPtr] = staged_slots.as_deref().unwrap_or(&[]);
        let slot_count = slots.len().max(1);
        // The bytes of a tensor an op reads: in the window (resident or in its slot), or, for
        // the embedding the CPU gathers, in the artifact.
        let weight = |t: TensorId| -> &[u8] {
            let n = model.header.tensors[t as usize].nbytes as usize;
            match homes[t as usize] {
                Home::Resident { offset } => &resident[(offset - resident_offset) as usize..][..n],
                // SAFETY: `before_op` waited for this segment's slot to be ready, and the
                // slot is released only after the segment's last op, after this use.
                Home::Rotating { rotating, offset } => unsafe { &slots[rotating as usize % slot_count].bytes()[offset as usize..][..n] },
                Home::Host => model.tensor_bytes(t),
            }
        };
        let f32s = |t: TensorId| -> &[f32] { bytemuck::cast_slice(weight(t)) };
        let kv_capacity = plan.kv_capacity as usize;
        let kv_layer = 2 * m.n_kv_heads as usize * hd * kv_capacity;
        let threads = self.pool.current_num_threads();
        let (score_floats, widened_floats, _) = attention_scratch_size(m, plan.kv_capacity, plan.window.kv_dtype, threads as u32);
        let (scores, widened) = attention_scratch.split_at_mut(score_floats as usize * threads);
        let widened = &mut widened[..widened_floats as usize];
        let mut kv = kv;
        for (index, op) in g.ops.iter().enumerate() {
            if let Some(s) = stager.as_deref_mut() {
                s.before_op(g, index)?;
            }
            let start = profile.as_ref().map(|_| std::time::Instant::now());
            match *op {
                Op::Embed { table, out } => {
                    let c = cols(out);
                    let ([], o) = operands(win, [], range(out));
                    kernels::embed_rows(model.weights(table), c, inp.tokens, o);
                }
                Op::Scale { x, factor } => kernels::scale(&mut win[range(x)], factor),
                Op::Bias { x, bias } => {
                    let b = f32s(bias);
                    win[range(x)].chunks_exact_mut(b.len()).for_each(|row| kernels::add(features, row, b));
                }
                Op::RmsNorm { x, weight, eps, out } => {
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    let (w, c) = (f32s(weight), cols(x));
                    // A row at a time, as threads are free (see Attention).
                    self.pool.install(|| o.par_chunks_mut(c).zip(xs.par_chunks(c)).for_each(|(o, x)| kernels::rms_norm(features, x, w, eps, o)));
                }
                Op::MatMul { x, weight: w, out } => {
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    gemm(xs, rows_of(x), &model.matrix_at(w, weight(w)), o, gemm_scratch, &self.pool, features);
                }
                Op::Rope { x, heads, cos, sin } => {
                    let half = hd / 2;
                    let (cos, sin) = (f32s(cos), f32s(sin));
                    let c = cols(x);
                    // A row at a time, as threads are free (see Attention).
                    self.pool.install(|| {
                        win[range(x)].par_chunks_exact_mut(c).zip(inp.positions.par_iter()).for_each(|(row, &p)| {
                            let t = p as usize * half..(p as usize + 1) * half;
                            kernels::rope_row(features, &mut row[..heads as usize * hd], hd, &cos[t.clone()], &sin[t]);
                        })
                    });
                }
                Op::Attention { qkv, out, heads, kv_heads, layer } => {
                    let ([q], o) = operands(win, [range(qkv)], range(out));
                    let width = cols(qkv);
                    let layer = layer as usize * kv_layer..(layer as usize + 1) * kv_layer;
                    let real = &inp.positions[..inp.stored_rows];
                    let own = attention::OwnKv { from_row: inp.stored_rows, positions: inp.positions };
                    let shape = |capacity| attention::Shape { width, capacity, heads: heads as usize, kv_heads: kv_heads as usize, head_dim: hd, keys: inp.context, threads };
                    let (planes, sh) = match &mut kv {
                        KvView::F32(all) => {
                            let planes = &mut all[layer];
                            attention::store_kv(q, width, heads as usize, kv_heads as usize, hd, kv_capacity, real, planes);
                            (&*planes, shape(kv_capacity))
                        }
                        KvView::Half(all, dtype) => {
                            let planes = &mut all[layer];
                            attention::store_kv_half(q, width, heads as usize, kv_heads as usize, hd, kv_capacity, real, planes, *dtype);
                            // The kernels read f32: widen the keys and values attended to
                            // into scratch, planes of `context` positions.
                            let planes = &*planes;
                            let ctx = inp.context;
                            self.pool.install(|| {
                                widened[..2 * kv_heads as usize * ctx * hd].par_chunks_mut(ctx * hd).enumerate().for_each(|(p, dst)| {
                                    let src = &planes[attention::kv_plane(p, kv_capacity, hd)..][..ctx * hd];
                                    kernels::widen_half(src, *dtype, dst);
                                })
                            });
                            (&*widened, shape(ctx))
                        }
                    };
                    // Units of one head and a group of rows, claimed one at a time by whichever
                    // thread is free: a core of a shared host can run at half speed for
                    // seconds (a neighbour on its sibling hyperthread), and a fixed share would
                    // leave the other waiting for it.
                    // A block-causal pass over several blocks: each run of rows attends to
                    // the keys before its block's end (one run otherwise).
                    for (run, keys) in inp.key_runs() {
                        let (rows, oc) = (run.len(), cols(out));
                        let sh = attention::Shape { keys, ..sh };
                        let q = &q[run.start * width..];
                        let own = attention::OwnKv { from_row: own.from_row.saturating_sub(run.start), positions: &own.positions[run.start..] };
                        let units = attention::units(features, &sh, rows);
                        let next = AtomicUsize::new(0);
                        let out = attention::Out::new(&mut o[run.start * oc..run.end * oc]);
                        self.pool.install(|| {
                            scores.par_chunks_mut(score_floats as usize).for_each(|scores| loop {
                                let u = next.fetch_add(1, Ordering::Relaxed);
                                if u >= units {
                                    break;
                                }
                                attention::attend(features, q, planes, sh, own, rows, u..u + 1, out, scores);
                            })
                        });
                    }
                }
                Op::SwiGlu { x, out } => {
                    // A row at a time, as threads are free (see Attention).
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    let hidden = cols(out);
                    self.pool.install(|| o.par_chunks_mut(hidden).zip(xs.par_chunks(2 * hidden)).for_each(|(o, x)| kernels::swiglu(features, x, hidden, o)));
                }
                Op::Add { acc, x } => {
                    let ([xs], a) = operands(win, [range(x)], range(acc));
                    // Four rows a task: a row's sum is about what handing it to a thread costs.
                    let chunk = 4 * cols(acc);
                    self.pool.install(|| a.par_chunks_mut(chunk).zip(xs.par_chunks(chunk)).for_each(|(a, x)| kernels::add(features, a, x)));
                }
                Op::GatherHeadRows { x, out } => {
                    let c = cols(x);
                    let ([xs], o) = operands(win, [range(x)], range(out));
                    for (row, &r) in o.chunks_exact_mut(c).zip(inp.head_rows) {
                        row.copy_from_slice(&xs[r as usize * c..(r as usize + 1) * c]);
                    }
                }
                Op::HeadRmsNorm { x, first_head, heads, weight, eps } => {
                    let c = cols(x);
                    let span = first_head as usize * hd..(first_head + heads) as usize * hd;
                    for row in win[range(x)].chunks_exact_mut(c) {
                        kernels::head_rms_norm(features, &mut row[span.clone()], f32s(weight), eps);
                    }
                }
                Op::Route { .. } | Op::RouteSigmoid { .. } | Op::MoeExperts { .. } => moe.run(model, g, index, inp, win, base, gemm_scratch)?,
            }
            if let (Some(p), Some(t)) = (profile.as_deref_mut(), start) {
                p.times.push((index, t.elapsed().as_secs_f64()));
                if let (Some(ranges), &Op::MatMul { x, weight, out }) = (p.matmul_ranges.as_mut(), op) {
                    ranges.push(super::MatMulRange::of(weight, &win[range(x)], &win[range(out)]));
                }
            }
            if let Some(s) = stager.as_deref_mut() {
                s.after_op(g, index);
            }
        }
        Ok(())
    }
}

impl Executor for HostExecutor {
    fn run(&mut self, model: &Model, pass: Pass<'_>) -> Result<()> {
        let Pass { graph, inputs, window, stager, moe, profile } = pass;
        let g = model.graph(graph);
        // The whole pass on one of the pool's threads: each op's parallel part then starts
        // from inside the team instead of handing over from this thread and back (two
        // wake-ups per op, a few hundred ops per pass).
        let pool = self.pool.clone();
        pool.install(|| self.run_ops(model, g, &inputs, window, Some(stager), moe, profile))
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn pool(&self) -> &Pool {
        &self.pool
    }
}
