//! The QNN executor: the section's contexts, created at session open or in turn, and a
//! pass's executables run in order (see the module above).

use std::ffi::CString;
use std::sync::Arc;
use std::ops::Range;

use half::f16;
use llada_ir::npu::{IoKind, NpuGraph, NpuSection, NpuTensor, Role};
use llada_ir::program::Step;
use llada_ir::{Graph, Op};
use llada_qnn::abi::{DATATYPE_FLOAT_16, DATATYPE_INT_32};
use llada_qnn::context::Graph as QnnGraph;
use llada_qnn::{Context, Device, IoBuffer, LoadOptions};

/// Whether the HTP is a phone's (Android's QNN libraries): QNN's x86-64 simulator has no
/// spill-fill groups or I/O memory estimation (QNN.md), so they are asked for on Android only.
const PHONE: bool = cfg!(target_os = "android");

use llada_qnn::QnnLibrary;

use super::io;
use crate::executor::{value_range, Capabilities, Executor, Loads, Pass, RunInputs, SoftEmbed};
use crate::kernels::cpu::Features;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::pool::Pool;
use crate::window::{KvView, Window};

/// One context of the section: its layers and binary, its executables' I/O tables by
/// planned graph id, and while created, the context and its graphs (same order).
struct Stage {
    layers: [u32; 2],
    resident: bool,
    /// The HTP session it lives in, and the spill-fill buffer that session's contexts share.
    session: u32,
    spill_fill: u64,
    segment: u32,
    tables: Vec<Vec<NpuGraph>>,
    live: Option<(Context, Vec<Vec<QnnGraph>>)>,
}

pub struct QnnExecutor {
    stages: Vec<Stage>,
    /// Bytes the contexts may occupy at once (the section's budget).
    budget: u64,
    loads: Loads,
    trace: Option<Arc<crate::trace::Trace>>,
    pool: Pool,
    /// The CPU features the host's ops between and before the executables use.
    features: Features,
    capabilities: Capabilities,
    /// Host-side staging of the boundary tensors, sized for the largest graph.
    scratch: io::Scratch,
    /// The uint16 logits' `(scale, offset)` of a fixed-point format (fp16 logits: `None`).
    logits_encoding: Option<(f32, i32)>,
    /// The cache lengths the executables are built for, ascending (the section's).
    cache_lens: Vec<u32>,
    /// Per graph, the runs of its program's experts steps (the session's CPU step), each
    /// between the executable ending at its first op and the next, in op order.
    experts: Vec<Vec<Range<usize>>>,
    /// Each layer's kv heads and head width in the cache ([`llada_ir::npu::layer_heads`],
    /// found once: a pass does not search the op lists).
    layer_heads: Vec<(usize, usize)>,
    /// Per graph, the inputs the host computes before its first executable (found once).
    host_inputs: Vec<HostInputs>,
    /// Keeps the library loaded while its contexts live (dropped last).
    device: Arc<Device>,
}

impl QnnExecutor {
    /// Loads the QNN library (`LLADA_QNN_LIB`), checks every context binary of the artifact's
    /// section against its record, and creates the resident contexts for its SoC.
    pub fn new(model: &Model, threads: usize, features: Features) -> Result<QnnExecutor> {
        let h = &model.header;
        let artifact = |source: llada_ir::Error| Error::Artifact { path: model.path.clone(), source };
        let section = NpuSection::of(h).map_err(artifact)?.ok_or_else(|| {
            Error::request(format!(
                "{}: the artifact has no NPU executables (it was compiled for '{}'); compile it with `lladac compile --target sm8650` (or sm8550, sm8750, sm8850) and LLADA_QNN_LIB set",
                model.path.display(),
                h.compile.target
            ))
        })?;
        if section.shared_weights && cfg!(target_arch = "x86_64") {
            return Err(Error::request(format!(
                "{}: its NPU contexts share their weights across row buckets (lladac --npu-shared-weights), the form a phone's HTP loads; QNN's x86-64 simulator cannot reload such binaries, so compile without --npu-shared-weights to run it here",
                model.path.display()
            )));
        }
        let lib = QnnLibrary::open(None)?;
        let backend = lib.backend()?;
        let device = Device::new(&backend, section.soc_id)?;
        let mut stages = Vec::new();
        for (index, c) in section.contexts.iter().enumerate() {
            let seg = &h.segments[c.segment as usize];
            let binary = model.segment_bytes(c.segment);
            if crc32fast::hash(binary) != c.crc32 {
                return Err(artifact(llada_ir::Error::invalid(format!("the NPU context binary '{}' is corrupted (its CRC-32 is not the one recorded)", seg.name))));
            }
            let desc = llada_qnn::system::describe(&lib.dir, binary).map_err(|e| unreadable_binary(&model.path, index, &seg.name, e))?;
            check_binary(&desc, &seg.name, &section, c)?;
            // The verifier checked every graph has its executables in every context, in op order.
            let mut tables: Vec<Vec<NpuGraph>> = vec![Vec::new(); h.graphs.len()];
            for g in &c.graphs {
                tables[g.graph as usize].push(g.clone());
            }
            let spill_fill = section.sessions.get(c.session as usize).map_or(0, |s| s.spill_fill_bytes);
            stages.push(Stage { layers: c.layers, resident: c.resident, session: c.session, spill_fill, segment: c.segment, tables, live: None });
        }
        let pool = Pool::new(threads, "llada-worker").map_err(|e| Error::Internal(format!("the thread pool does not start: {e}")))?;
        let capabilities = Capabilities {
            backend: "qnn",
            device: format!(
                "Qualcomm HTP, {} ({}), QNN {}{}; {} context(s), {} resident; I/O: {}",
                section.soc,
                lib.provider_name,
                lib.build_id,
                if cfg!(target_arch = "x86_64") { ", x86-64 simulator" } else { "" },
                stages.len(),
                stages.iter().filter(|s| s.resident).count(),
                llada_qnn::library::io_binding()
            ),
            // The simulator runs on this machine's CPU: its times are CPU figures.
            runs_on_cpu: cfg!(target_arch = "x86_64"),
            cost_per_row: false,
            max_allocation_bytes: u64::MAX,
            device_timestamps: false,
            int8_dot: false,
        };
        let layer_heads = (0..h.model.n_layers).map(|l| llada_ir::npu::layer_heads(h, l)).map(|(kvh, hd)| (kvh as usize, hd as usize)).collect();
        let host_inputs = h.graphs.iter().map(HostInputs::of).collect::<Result<_>>()?;
        let mut e = QnnExecutor { stages, budget: section.context_budget, loads: Loads::default(), trace: None, pool, features, capabilities, scratch: io::Scratch::new(h, section.io.clone()), logits_encoding: section.logits_encoding(h), cache_lens: section.cache_lens.clone(), experts: (0..h.graphs.len() as u32).map(|g| experts_runs(model.program(g))).collect(), layer_heads, host_inputs, device };
        for k in 0..e.stages.len() {
            if e.stages[k].resident {
                e.create(model, k)?;
            }
        }
        // Session open is not a pass: its creations are not swaps.
        e.loads = Loads::default();
        Ok(e)
    }

    /// Creates context `k` (from its binary in the artifact) unless it is, freeing rotating
    /// contexts first while the live ones and it would exceed the budget.
    fn create(&mut self, model: &Model, k: usize) -> Result<()> {
        if self.stages[k].live.is_some() {
            return Ok(());
        }
        self.make_room(model, k, None);
        let start = std::time::Instant::now();
        // On a phone, a resident context joins its session's spill-fill group (the first one
        // created starts it): the plan's sessions, as data, switched on where the HTP has them.
        let st = &self.stages[k];
        let group = (PHONE && st.resident).then(|| {
            let first = self.stages[..k].iter().find(|o| o.session == st.session && o.resident).and_then(|o| o.live.as_ref()).map(|l| &l.0);
            (first, st.spill_fill)
        });
        let opts = LoadOptions { io_mem_estimation: PHONE, spill_fill_group: group };
        let live = create_context(&self.device, model, st.segment, &st.tables, &opts)?;
        self.created(model, k, live, start, std::time::Instant::now(), false);
        Ok(())
    }

    /// Bytes of stage `j`'s binary.
    fn bytes(&self, model: &Model, j: usize) -> u64 {
        model.header.segments[self.stages[j].segment as usize].nbytes
    }

    /// Frees rotating contexts other than `keep`, the one needed last first (in use order after
    /// `k`), until context `k` fits the budget beside the live ones.
    fn make_room(&mut self, model: &Model, k: usize, keep: Option<usize>) {
        let need = self.bytes(model, k);
        let n = self.stages.len();
        let mut live: u64 = (0..n).filter(|&j| self.stages[j].live.is_some()).map(|j| self.bytes(model, j)).sum();
        for j in (1..n).map(|d| (k + n - d) % n) {
            if live + need <= self.budget {
                break;
            }
            if Some(j) != keep && !self.stages[j].resident && self.stages[j].live.take().is_some() {
                live -= self.bytes(model, j);
            }
        }
    }

    /// Whether context `k` could be created beside `keep` (and the resident ones) within the
    /// budget, freeing other rotating contexts: the room to create it while `keep` runs.
    fn fits_beside(&self, model: &Model, k: usize, keep: usize) -> bool {
        let fixed: u64 = (0..self.stages.len()).filter(|&j| j == keep || (self.stages[j].resident && self.stages[j].live.is_some())).map(|j| self.bytes(model, j)).sum();
        fixed + self.bytes(model, k) <= self.budget
    }

    /// Records context `k` as live, created between `start` and `end` (`overlapped`: while the
    /// context before it ran).
    fn created(&mut self, model: &Model, k: usize, live: (Context, Vec<Vec<QnnGraph>>), start: std::time::Instant, end: std::time::Instant, overlapped: bool) {
        let seg = &model.header.segments[self.stages[k].segment as usize];
        self.stages[k].live = Some(live);
        self.loads.contexts += 1;
        self.loads.bytes += seg.nbytes;
        self.loads.seconds += (end - start).as_secs_f64();
        self.loads.overlapped += overlapped as u64;
        if let Some(t) = &self.trace {
            let how = if overlapped { ", while the context before it ran" } else { "" };
            t.span(crate::trace::Track::Staging, format!("create NPU context '{}' (layers {}..{}){how}", seg.name, self.stages[k].layers[0], self.stages[k].layers[1]), start, end);
        }
    }
}

/// The context of `segment` created from its binary in the artifact, with the graphs of
/// `tables` retrieved.
fn create_context(device: &Arc<Device>, model: &Model, segment: u32, tables: &[Vec<NpuGraph>], opts: &LoadOptions) -> Result<(Context, Vec<Vec<QnnGraph>>)> {
    let seg = &model.header.segments[segment as usize];
    let context = Context::from_binary_with(device, model.segment_bytes(segment), opts).map_err(|e| Error::Device(format!("{}: QNN refused context binary '{}': {e}", model.path.display(), seg.name)))?;
    let graphs = tables.iter().map(|pieces| pieces.iter().map(|t| context.graph(&t.name)).collect::<std::result::Result<Vec<_>, _>>()).collect::<std::result::Result<Vec<_>, _>>()?;
    Ok((context, graphs))
}

/// A context binary QNN's system library cannot read (damaged past the artifact's checksums,
/// or from a QNN it does not know), named by the artifact and the context: QNN's own message
/// is a call and a code. A missing library stays what it is (how to get it).
fn unreadable_binary(artifact: &std::path::Path, index: usize, segment: &str, e: llada_qnn::Error) -> Error {
    match e {
        llada_qnn::Error::Missing(_) => e.into(),
        other => Error::Device(format!("{}: NPU context {index} ('{segment}'): QNN cannot read its context binary: {other}", artifact.display())),
    }
}

/// Checks what a context binary says of itself (libQnnSystem) against the artifact's record:
/// the SoC it was prepared for, and each executable's inputs and outputs (ids, names, types,
/// shapes). The simulator would run a binary of another SoC without a word (QNN.md).
fn check_binary(desc: &llada_qnn::system::BinaryDesc, segment: &str, section: &NpuSection, c: &llada_ir::npu::NpuContext) -> Result<()> {
    let soc_name = |id: u32| llada_ir::npu::SOCS.iter().find(|s| s.1 == id).map_or(format!("socModel {id}"), |s| s.0.to_string());
    if let Some(soc) = desc.soc_model.filter(|&s| s != section.soc_id) {
        return Err(Error::Device(format!(
            "NPU context binary '{segment}' was prepared for {} (socModel {soc}), but the artifact says {} (socModel {}): recompile with `lladac compile --target {}`",
            soc_name(soc),
            section.soc,
            section.soc_id,
            section.soc
        )));
    }
    for g in &c.graphs {
        let Some(found) = desc.graphs.iter().find(|d| d.name == g.name) else {
            return Err(Error::Device(format!("NPU context binary '{segment}' holds no graph '{}' (it holds {})", g.name, desc.graphs.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "))));
        };
        for (what, table, actual) in [("input", &g.inputs, &found.inputs), ("output", &g.outputs, &found.outputs)] {
            if table.len() != actual.len() {
                return Err(Error::Device(format!("NPU executable '{}' in '{segment}': the binary has {} {what}s, the artifact's I/O table {}", g.name, actual.len(), table.len())));
            }
            for t in table.iter() {
                let ok = actual.iter().any(|a| a.id == t.id && a.name == t.name && a.dims == t.dims && a.data_type == qnn_dtype(t));
                if !ok {
                    let have = actual.iter().find(|a| a.name == t.name).map_or("nothing of that name".to_string(), |a| format!("id {} shape {:?} type {:#x}", a.id, a.dims, a.data_type));
                    return Err(Error::Device(format!(
                        "NPU executable '{}' in '{segment}': {what} '{}' is id {} shape {:?} in the artifact's I/O table, but the binary has {have}",
                        g.name, t.name, t.id, t.dims
                    )));
                }
            }
        }
    }
    Ok(())
}

/// QNN's data type of a table entry.
fn qnn_dtype(t: &NpuTensor) -> u32 {
    match t.dtype {
        llada_ir::npu::NpuDType::F16 => DATATYPE_FLOAT_16,
        llada_ir::npu::NpuDType::I32 => DATATYPE_INT_32,
        llada_ir::npu::NpuDType::U16 => llada_qnn::abi::DATATYPE_UFIXED_POINT_16,
    }
}

/// Runs one executable: every tensor bound at its descriptor, the KV cache's in the
/// window's cache (the allocation's first region), the others in the scratch allocation.
fn execute(context: &mut Context, executable: &QnnGraph, table: &NpuGraph, scratch: &mut io::Scratch, window: &mut Window, g: &llada_ir::Graph) -> Result<()> {
    let parts = window.parts();
    let KvView::Half(kv, _) = parts.kv else {
        return Err(Error::Internal("the NPU executables read an f16 KV cache; the verifier checked the plan has one".into()));
    };
    let kv_bytes: &mut [u8] = bytemuck::cast_slice_mut(kv);
    let mut bind = |t: &NpuTensor| -> Result<IoBuffer> {
        let data = match t.role {
            Role::KCache(_) | Role::VCache(_) => t.offset.checked_add(t.bytes()).filter(|&end| end <= kv_bytes.len() as u64).map(|_| kv_bytes[t.offset as usize..].as_mut_ptr()),
            _ => scratch.pointer(t),
        };
        let data = data.ok_or_else(|| Error::Internal(format!("graph '{}': the descriptor of '{}' lies outside the I/O allocation", g.name, t.name)))?;
        Ok(IoBuffer { id: t.id, name: CString::new(t.name.as_str()).unwrap_or_default(), data_type: qnn_dtype(t), dims: t.dims.clone(), data: data.cast(), bytes: t.bytes() as usize })
    };
    let mut inputs = table.inputs.iter().map(&mut bind).collect::<Result<Vec<_>>>()?;
    let mut outputs = table.outputs.iter().map(&mut bind).collect::<Result<Vec<_>>>()?;
    context.execute(executable, &mut inputs, &mut outputs)?;
    Ok(())
}

/// The runs of `program`'s experts steps, in op order: consecutive steps (a release of the
/// swap schedule may fall between them) run as one.
fn experts_runs(program: &[Step]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    let mut open = false;
    for step in program {
        match *step {
            Step::Moe { start, end } => {
                match runs.last_mut().filter(|r| open && r.end == start as usize) {
                    Some(r) => r.end = end as usize,
                    None => runs.push(start as usize..end as usize),
                }
                open = true;
            }
            Step::Wait { .. } | Step::Release { .. } => {}
            Step::Embed { .. } | Step::Dense { .. } => open = false,
        }
    }
    runs
}

/// What the host computes before a graph's first executable ([`llada_ir::npu::host_prefix`]),
/// and the rotary tables it gathers the rows' angles from.
struct HostInputs {
    /// The embedding table (the graph's first op gathers its rows).
    table: llada_ir::TensorId,
    /// DiffusionGemma's self-conditioning product, where it follows the embedding.
    soft_embed: Option<SoftEmbed>,
    /// The cos and sin tables of the graph's first `Rope`, where it has one.
    rope: Option<(llada_ir::TensorId, llada_ir::TensorId)>,
}

impl HostInputs {
    fn of(g: &Graph) -> Result<HostInputs> {
        let Some(&Op::Embed { table, .. }) = g.ops.first() else {
            return Err(Error::Internal(format!("graph '{}' does not start with the embedding", g.name)));
        };
        let soft_embed = match g.ops.get(1) {
            Some(&Op::SoftEmbed { x, table, scale, out }) => Some(SoftEmbed { x, table, scale, out }),
            _ => None,
        };
        let rope = g.ops.iter().find_map(|o| if let Op::Rope { cos, sin, .. } = *o { Some((cos, sin)) } else { None });
        Ok(HostInputs { table, soft_embed, rope })
    }
}

impl QnnExecutor {
    /// Fills the executables' inputs the host computes: the embedded rows (and DiffusionGemma's
    /// self-conditioning input after them), the rotary rows, masks, logit rows and positions.
    /// Returns the cache length whose executables hold every row's keys.
    fn fill_inputs(&mut self, model: &Model, graph: u32, inp: &RunInputs<'_>, window: &mut Window) -> Result<u32> {
        let (h, m, g) = (&model.header, &model.header.model, model.graph(graph));
        let host = &self.host_inputs[graph as usize];
        let s = &mut self.scratch;
        s.embed(model, host.table, g.rows as usize, inp);
        // DiffusionGemma's self-conditioning input, on the CPU as the embedding is, into the
        // first executable's input.
        if let Some(soft) = &host.soft_embed {
            let parts = window.parts();
            soft.run(model, g, inp, parts.activations, parts.activations_offset, &self.pool, self.features);
            let range = value_range(g, &g.values[soft.out as usize], inp.logit_rows.len(), parts.activations_offset);
            s.soft_in(&parts.activations[range], inp.rows, g.rows as usize, m.d_model as usize);
        }
        if let Some((cos, sin)) = host.rope {
            s.rope(model, cos, sin, g.rows as usize, inp);
        }
        // The executables of the smallest cache length that holds every row's keys.
        let keys = (0..inp.rows).map(|r| inp.keys_of(r)).max().unwrap_or(0);
        let cache_len = llada_ir::npu::cache_len_for(&self.cache_lens, keys as u32);
        s.mask(h, g.rows as usize, cache_len as usize, inp);
        s.window_masks(g.rows as usize, cache_len as usize, inp);
        s.logit_index(g.logit_rows as usize, inp);
        s.positions(g.rows as usize, inp);
        Ok(cache_len)
    }

    /// Reads what the executables wrote back: the stored rows' keys and values into the cache
    /// at their positions, and the logits into the graph's logits value.
    fn read_outputs(&mut self, model: &Model, g: &Graph, inp: &RunInputs<'_>, window: &mut Window) -> Result<()> {
        let (h, m) = (&model.header, &model.header.model);
        let (c, rows) = (h.plan.kv_capacity as usize, g.rows as usize);
        // Each layer's slots, cached and new, hold the model's kv heads of its head_dim (a
        // layer with other heads fills the start of them: `IoLayout::offset`).
        let slot = m.n_kv_heads as usize * m.head_dim as usize;
        let s = &mut self.scratch;
        let parts = window.parts();
        let KvView::Half(kv, _) = parts.kv else {
            return Err(Error::Internal("the NPU executables read an f16 KV cache; the verifier checked the plan has one".into()));
        };
        // The rows the run stores: their keys and values into the cache at their positions.
        let new_kv = s.region::<u16>(IoKind::NewKv);
        for (layer, &(kvh, hd)) in self.layer_heads.iter().enumerate() {
            for kind in 0..2 {
                let new = &new_kv[(2 * layer + kind) * slot * rows..][..kvh * rows * hd];
                // The values right after the keys in the layer's slot, as the host's cache.
                let cache = &mut kv[2 * layer * slot * c + kind * kvh * c * hd..][..kvh * c * hd];
                io::store_rows(new, cache, kvh, rows, c, hd, &inp.positions[..inp.stored_rows]);
            }
        }
        let logits = s.region::<u16>(IoKind::Logits);
        let range = value_range(g, &g.values[g.logits as usize], inp.logit_rows.len(), parts.activations_offset);
        let out = parts.activations[range].iter_mut().zip(logits.iter());
        match self.logits_encoding {
            // A fixed-point format's uint16 logits, in the LM head's output encoding.
            Some((scale, offset)) => out.for_each(|(o, &q)| *o = (q as i32 + offset) as f32 * scale),
            None => out.for_each(|(o, &b)| *o = f16::from_bits(b).to_f32()),
        }
        Ok(())
    }
}

impl Executor for QnnExecutor {
    fn run(&mut self, model: &Model, pass: Pass<'_>) -> Result<()> {
        let Pass { graph, inputs, window, stager, moe, profile: _ } = pass;
        let inp = &inputs;
        // One executable per context a pass: no op of the plan is timed, so a profile stays
        // empty (the pass's time is the session's).
        let g = model.graph(graph);
        let m = &model.header.model;
        // The weights live in the contexts: nothing of the window's swap schedule is read, but
        // its protocol is kept so a plan with rotating segments stays consistent.
        if let Some(stager) = stager {
            model.program(graph).iter().try_for_each(|&step| stager.follow(step))?;
        }
        let cache_len = self.fill_inputs(model, graph, inp, window)?;
        let rows = g.rows as usize;
        let n = self.stages.len();
        // The executables this pass runs (a context's pieces, [`llada_ir::npu::pieces`]): each
        // but the last hands its hidden states on.
        let runs = |t: &NpuGraph| t.cache_len == cache_len || t.cache_len == 0;
        let total: usize = self.stages.iter().map(|st| st.tables[graph as usize].iter().filter(|t| runs(t)).count()).sum();
        let mut done = 0;
        for k in 0..n {
            self.create(model, k)?;
            // The next context of this pass, created while this one runs where the budget
            // holds both (the swap schedule's double buffering): off the critical path.
            let next = (k + 1 < n && self.stages[k + 1].live.is_none() && self.fits_beside(model, k + 1, k)).then_some(k + 1);
            if let Some(j) = next {
                self.make_room(model, j, Some(k));
            }
            let device = Arc::clone(&self.device);
            let (before, after) = self.stages.split_at_mut(k + 1);
            let upcoming: Option<(u32, &[Vec<NpuGraph>])> = next.map(|j| (after[j - k - 1].segment, after[j - k - 1].tables.as_slice()));
            let stage = &mut before[k];
            let tables = &stage.tables[graph as usize];
            let (context, graphs) = stage.live.as_mut().expect("created above");
            let scratch = &mut self.scratch;
            let experts = &self.experts[graph as usize];
            let moe = &mut *moe;
            let (ran, prefetched) = std::thread::scope(|scope| {
                let creating = upcoming.map(|(segment, tables)| {
                    scope.spawn(move || {
                        let start = std::time::Instant::now();
                        let live = create_context(&device, model, segment, tables, &LoadOptions { io_mem_estimation: PHONE, spill_fill_group: None });
                        (live, start, std::time::Instant::now())
                    })
                });
                let mut ran = || -> Result<()> {
                    for (table, executable) in tables.iter().zip(&graphs[graph as usize]).filter(|(t, _)| runs(t)) {
                        execute(context, executable, table, scratch, window, g)?;
                        // An MoE layer's router and routed experts, on the host, between this
                        // executable and the next.
                        if let Ok(i) = experts.binary_search_by_key(&(table.ops[1] as usize), |run| run.start) {
                            io::run_host_ops(model, g, experts[i].clone(), inp, scratch, window, moe)?;
                        }
                        done += 1;
                        if done < total {
                            scratch.hand_on_hidden(rows, m.d_model as usize);
                        }
                    }
                    Ok(())
                };
                let ran = ran();
                let waited = std::time::Instant::now();
                (ran, creating.map(|c| (c.join(), waited)))
            });
            if let (Some(j), Some((joined, waited))) = (next, prefetched) {
                let (live, start, end) = joined.map_err(|_| Error::Internal("the thread creating an NPU context panicked".into()))?;
                self.loads.wait_seconds += end.saturating_duration_since(waited).as_secs_f64();
                self.created(model, j, live?, start, end, true);
            }
            ran?;
        }
        self.read_outputs(model, g, inp, window)
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn set_trace(&mut self, trace: Arc<crate::trace::Trace>) {
        self.trace = Some(trace);
    }

    fn take_loads(&mut self) -> Loads {
        std::mem::take(&mut self.loads)
    }

    fn pool(&self) -> &Pool {
        &self.pool
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QNN's own words for a damaged binary are a call and a code: the error names the
    /// artifact and the context; a missing library is still the backend's setting.
    #[test]
    fn an_unreadable_binary_names_the_artifact_and_the_context() {
        let call = llada_qnn::Error::Call { call: "systemContextGetBinaryInfo", graph: None, code: 30010 };
        let e = unreadable_binary(std::path::Path::new("/m/phone.lad"), 1, "npu.context.1", call).to_string();
        assert_eq!(e, "/m/phone.lad: NPU context 1 ('npu.context.1'): QNN cannot read its context binary: QNN systemContextGetBinaryInfo failed with error 30010");
        let missing = unreadable_binary(std::path::Path::new("/m/phone.lad"), 0, "npu.context.0", llada_qnn::Error::Missing("libQnnSystem.so: cannot be loaded".into()));
        assert!(matches!(missing, Error::Setting { setting: crate::Setting::Backend, .. }), "{missing}");
    }
}
