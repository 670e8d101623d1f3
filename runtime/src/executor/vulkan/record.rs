//! Recording the graphs once per session: each graph becomes a few command buffers
//! ("chunks"), split only where the host must act between dispatches: before an op whose
//! rotating weights must first be in their slot (the host waits for the staging copy), after
//! an op whose slot the swap schedule then releases (the host must know the device is done
//! with it), and around the embedding gather and DiffusionGemma's self-conditioning input,
//! which read the embedding from the artifact on the CPU. Every
//! dispatch's operands are fixed by the plan: value offsets in the activation region, weight
//! offsets in the resident region or their slot, one layer's KV cache; what changes per pass
//! (positions, logit rows, context) is read from the pass-inputs buffer.

use std::sync::Arc;

use ash::vk;
use llada_ir::packing::{panel_bytes, panels};
use llada_ir::window::{op_values_span, operand_layout};
use llada_ir::{DType, Graph, Header, KvDType, Op, Rows, TensorId, Value};
use llada_ir::program::Step as ProgramStep;

use super::gpu::{vk_error, Gpu};
use super::pipelines::{matmul_format, Pipelines};
use crate::error::{Error, Result};
use crate::executor::{AttentionOp, HeadShape};
use crate::model::Model;
use crate::window::Home;

/// `rms_norm.comp`'s weight offset for a norm without a weight.
const NO_WEIGHT: u32 = u32::MAX;

/// Storage-buffer descriptors a pool holds before another is made.
const SETS_PER_POOL: u32 = 512;

/// One part of a recorded graph: its program's steps, each dense run as a command buffer.
pub(super) enum Step {
    /// Ops `ops` as one command buffer.
    Device { cmd: vk::CommandBuffer, ops: std::ops::Range<usize> },
    /// The embedding gather, on the host.
    Embed { op: usize },
    /// DiffusionGemma's self-conditioning input (`Op::SoftEmbed`), on the host.
    SoftEmbed { op: usize },
    /// Routers and routed experts: the session's CPU step, on the rows the device computed.
    Experts { ops: std::ops::Range<usize> },
    /// A wait or release of the swap schedule, for the stager.
    Staging(ProgramStep),
}

pub(super) struct RecordedGraph {
    pub steps: Vec<Step>,
    /// Two timestamps per op (before, after), when the queue has timestamps.
    pub queries: Option<vk::QueryPool>,
}

#[derive(Clone, Copy)]
struct Bind {
    buffer: vk::Buffer,
    offset: u64,
    range: u64,
}

/// Records every graph of an artifact into command buffers from `command_pool`, allocating
/// descriptor sets from pools it makes (handed back in `descriptor_pools`).
pub(super) struct Recorder<'a> {
    pub gpu: &'a Arc<Gpu>,
    pub pipelines: &'a Pipelines,
    pub h: &'a Header,
    pub homes: &'a [Home],
    pub window: vk::Buffer,
    pub inputs: PassInputs,
    pub command_pool: vk::CommandPool,
    pub descriptor_pools: Vec<vk::DescriptorPool>,
    pub query_pools: Vec<vk::QueryPool>,
    sets_left: u32,
    /// The activation binding of the op being recorded: the span of the window its values
    /// occupy (a whole activation region may exceed what one binding reaches).
    act: Bind,
}

/// The pass-inputs buffer the shaders read (positions, logit rows, counts).
#[derive(Clone, Copy)]
pub(super) struct PassInputs {
    pub buffer: vk::Buffer,
    pub bytes: u64,
    /// Graph rows it holds positions (and logit rows) for.
    pub max_rows: u32,
}

impl<'a> Recorder<'a> {
    pub fn new(gpu: &'a Arc<Gpu>, pipelines: &'a Pipelines, h: &'a Header, homes: &'a [Home], window: vk::Buffer, inputs: PassInputs, command_pool: vk::CommandPool) -> Self {
        let act = Bind { buffer: window, offset: 0, range: 0 };
        Recorder { gpu, pipelines, h, homes, window, inputs, command_pool, descriptor_pools: Vec::new(), query_pools: Vec::new(), sets_left: 0, act }
    }

    /// Binding offsets: the device's alignment, and at least 16 bytes so 128-bit vectors of a
    /// binding sit at multiples of their size.
    fn align(&self) -> u64 {
        self.gpu.limits.min_storage_buffer_offset_alignment.max(16)
    }

    /// Binds window bytes `start..start + len` as 32-bit words: the binding (from `start`
    /// rounded down to the device's offset alignment) and the word `start` is at in it.
    fn window_words(&self, start: u64, len: u64, what: &dyn Fn() -> String) -> Result<(Bind, u32)> {
        let aligned = start - start % self.align();
        let range = (start + len - aligned).div_ceil(4) * 4;
        let max = self.gpu.limits.max_storage_buffer_range as u64;
        if range > max {
            return Err(Error::Request(format!("vulkan: {} span {range} bytes but {} binds at most {max} bytes at once", what(), self.gpu.name)));
        }
        Ok((Bind { buffer: self.window, offset: aligned, range }, ((start - aligned) / 4) as u32))
    }

    /// Window byte offset of tensor `t` (resident, or in its rotating segment's slot).
    fn weight_at(&self, t: TensorId) -> Result<u64> {
        let w = &self.h.plan.window;
        match self.homes[t as usize] {
            Home::Resident { offset } => Ok(offset),
            Home::Rotating { rotating, offset } => Ok(w.slots[rotating as usize % w.slots.len().max(1)].offset + offset),
            Home::Host => Err(Error::Request(format!("vulkan: tensor {} is not in the window (the plan reads it from the artifact on the CPU)", self.h.tensors[t as usize].name))),
        }
    }

    fn weight(&self, t: TensorId) -> Result<(Bind, u32)> {
        let at = self.weight_at(t)?;
        self.window_words(at, self.h.tensors[t as usize].nbytes, &|| format!("the bytes of tensor {}", self.h.tensors[t as usize].name))
    }

    fn descriptor_set(&mut self) -> Result<vk::DescriptorSet> {
        let d = &self.gpu.device;
        if self.sets_left == 0 {
            let sizes = [vk::DescriptorPoolSize { ty: vk::DescriptorType::STORAGE_BUFFER, descriptor_count: 4 * SETS_PER_POOL }];
            // SAFETY: valid create info; the pool is destroyed by the executor.
            let pool = unsafe { d.create_descriptor_pool(&vk::DescriptorPoolCreateInfo::default().max_sets(SETS_PER_POOL).pool_sizes(&sizes), None) }.map_err(|e| vk_error("creating a descriptor pool", e))?;
            self.descriptor_pools.push(pool);
            self.sets_left = SETS_PER_POOL;
        }
        self.sets_left -= 1;
        let layouts = [self.pipelines.set_layout];
        let pool = *self.descriptor_pools.last().expect("a pool");
        // SAFETY: the pool has a set left of this layout (counted above).
        let sets = unsafe { d.allocate_descriptor_sets(&vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts)) }.map_err(|e| vk_error("allocating a descriptor set", e))?;
        Ok(sets[0])
    }

    /// Records every graph of the artifact. A graph this device cannot run (values wider than
    /// one binding reaches, more workgroups than it dispatches: a [`Error::Request`]) is its
    /// reason instead, reported when a pass needs that graph; a failing Vulkan call fails all.
    pub fn record_all(&mut self, model: &Model) -> Result<Vec<std::result::Result<RecordedGraph, String>>> {
        let mut graphs = Vec::with_capacity(self.h.graphs.len());
        for (i, g) in self.h.graphs.iter().enumerate() {
            graphs.push(match self.record(g, model.program(i as u32)) {
                Ok(r) => Ok(r),
                Err(Error::Request(why)) => Err(format!("{why} (in graph {}, {} rows)", g.name, g.rows)),
                Err(e) => return Err(e),
            });
        }
        Ok(graphs)
    }

    /// Graph `g`'s program with each dense run recorded as a command buffer.
    fn record(&mut self, g: &Graph, program: &[ProgramStep]) -> Result<RecordedGraph> {
        let d = &self.gpu.device;
        let queries = if self.gpu.timestamp_bits > 0 {
            let info = vk::QueryPoolCreateInfo::default().query_type(vk::QueryType::TIMESTAMP).query_count(2 * g.ops.len().max(1) as u32);
            // SAFETY: valid create info; destroyed by the executor.
            let pool = unsafe { d.create_query_pool(&info, None) }.map_err(|e| vk_error("creating a timestamp query pool", e))?;
            self.query_pools.push(pool);
            Some(pool)
        } else {
            None
        };
        let mut steps = Vec::with_capacity(program.len());
        for &step in program {
            let next = match step {
                ProgramStep::Embed { op } => Step::Embed { op: op as usize },
                ProgramStep::Moe { start, end } => Step::Experts { ops: start as usize..end as usize },
                ProgramStep::Dense { start, end } => {
                    // A dense run's self-conditioning inputs read the artifact: host steps
                    // between the run's command buffers.
                    let mut from = start as usize;
                    for i in start as usize..end as usize {
                        if matches!(g.ops[i], Op::SoftEmbed { .. }) {
                            if from < i {
                                steps.push(Step::Device { cmd: self.record_chunk(g, from..i, queries)?, ops: from..i });
                            }
                            steps.push(Step::SoftEmbed { op: i });
                            from = i + 1;
                        }
                    }
                    if from == end as usize {
                        continue;
                    }
                    Step::Device { cmd: self.record_chunk(g, from..end as usize, queries)?, ops: from..end as usize }
                }
                ProgramStep::Wait { .. } | ProgramStep::Release { .. } => Step::Staging(step),
            };
            steps.push(next);
        }
        Ok(RecordedGraph { steps, queries })
    }

    fn record_chunk(&mut self, g: &Graph, ops: std::ops::Range<usize>, queries: Option<vk::QueryPool>) -> Result<vk::CommandBuffer> {
        let gpu = self.gpu.clone();
        let d = &gpu.device;
        let info = vk::CommandBufferAllocateInfo::default().command_pool(self.command_pool).level(vk::CommandBufferLevel::PRIMARY).command_buffer_count(1);
        // SAFETY: a live pool; the buffer is freed with it.
        let cmd = unsafe { d.allocate_command_buffers(&info) }.map_err(|e| vk_error("allocating a command buffer", e))?[0];
        // SAFETY: recording into a fresh command buffer; every handle used is live.
        unsafe { d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default()) }.map_err(|e| vk_error("beginning a command buffer", e))?;
        if let Some(q) = queries {
            // SAFETY: the queries are inside the pool (two per op).
            unsafe { d.cmd_reset_query_pool(cmd, q, 2 * ops.start as u32, 2 * ops.len() as u32) };
        }
        for i in ops {
            if let Some(q) = queries {
                // SAFETY: as above.
                unsafe { d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, q, 2 * i as u32) };
            }
            self.record_op(cmd, g, &g.ops[i])?;
            if let Some(q) = queries {
                // SAFETY: as above.
                unsafe { d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, q, 2 * i as u32 + 1) };
            }
        }
        // Results become visible to the host (logits, the KV cache the side path copies)
        // once the fence signals.
        let to_host = [vk::MemoryBarrier::default().src_access_mask(vk::AccessFlags::SHADER_WRITE).dst_access_mask(vk::AccessFlags::HOST_READ)];
        // SAFETY: recording state; valid barrier.
        unsafe {
            d.cmd_pipeline_barrier(cmd, vk::PipelineStageFlags::COMPUTE_SHADER, vk::PipelineStageFlags::HOST, vk::DependencyFlags::empty(), &to_host, &[], &[]);
            d.end_command_buffer(cmd)
        }
        .map_err(|e| vk_error("ending a command buffer", e))?;
        Ok(cmd)
    }

    /// One dispatch of `pipeline` with the activations at binding 0, `b1`/`b2` (the inputs
    /// buffer where unused) and the pass inputs at binding 3, then a barrier so the next
    /// dispatch sees its writes.
    fn dispatch(&mut self, cmd: vk::CommandBuffer, pipeline: vk::Pipeline, b1: Option<Bind>, b2: Option<Bind>, push: &[u32], groups: [u32; 3]) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        let set = self.descriptor_set()?;
        let act = self.act;
        let inputs = Bind { buffer: self.inputs.buffer, offset: 0, range: self.inputs.bytes };
        let infos = [act, b1.unwrap_or(inputs), b2.unwrap_or(inputs), inputs].map(|b| vk::DescriptorBufferInfo { buffer: b.buffer, offset: b.offset, range: b.range });
        let writes: Vec<_> = infos
            .iter()
            .enumerate()
            .map(|(i, info)| vk::WriteDescriptorSet::default().dst_set(set).dst_binding(i as u32).descriptor_type(vk::DescriptorType::STORAGE_BUFFER).buffer_info(std::slice::from_ref(info)))
            .collect();
        let d = &self.gpu.device;
        let barrier = [vk::MemoryBarrier::default().src_access_mask(vk::AccessFlags::SHADER_WRITE).dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
        let limit = self.gpu.limits.max_compute_work_group_count;
        if groups.iter().zip(limit).any(|(&g, l)| g > l) {
            return Err(Error::Request(format!("vulkan: a dispatch of {groups:?} workgroups exceeds {}'s limit {limit:?}", self.gpu.name)));
        }
        // SAFETY: the set is fresh and every binding is a live buffer range within the
        // device's limits (checked by `window_words`); recording state.
        unsafe {
            d.update_descriptor_sets(&writes, &[]);
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, self.pipelines.layout, 0, &[set], &[]);
            d.cmd_push_constants(cmd, self.pipelines.layout, vk::ShaderStageFlags::COMPUTE, 0, bytemuck::cast_slice(push));
            d.cmd_dispatch(cmd, groups[0], groups[1], groups[2]);
            d.cmd_pipeline_barrier(cmd, vk::PipelineStageFlags::COMPUTE_SHADER, vk::PipelineStageFlags::COMPUTE_SHADER, vk::DependencyFlags::empty(), &barrier, &[], &[]);
        }
        Ok(())
    }

    /// Word of value `v` in the activation binding of the op being recorded.
    fn at(&self, v: &Value) -> u32 {
        ((v.offset - self.act.offset) / 4) as u32
    }

    /// Binds the span of the window that `op`'s values occupy (at the graph's most rows) as
    /// the activations of its dispatches.
    fn bind_activations(&mut self, g: &Graph, op: &Op) -> Result<()> {
        if let Some((start, end)) = op_values_span(g, op) {
            self.act = self.window_words(start, end - start, &|| format!("the values of a {} op", op.name()))?.0;
        }
        Ok(())
    }

    fn record_op(&mut self, cmd: vk::CommandBuffer, g: &Graph, op: &Op) -> Result<()> {
        self.bind_activations(g, op)?;
        let p = self.pipelines;
        let h: &'a Header = self.h;
        let hd = h.model.head_dim;
        let val = |v: u32| &g.values[v as usize];
        let cols = |v: u32| val(v).cols;
        // Rows a dispatch covers (the graph's, or its most logit rows) and whether the pass's
        // head-row count limits them.
        let rows = |v: u32| match val(v).rows {
            Rows::Tokens => (g.rows, 0u32),
            Rows::Logits => (g.logit_rows, 1u32),
        };
        let act_base = self.act.offset;
        let off = |v: u32| ((val(v).offset - act_base) / 4) as u32;
        let groups_of = |n: u32| n.div_ceil(64);
        match *op {
            Op::Embed { .. } | Op::SoftEmbed { .. } => unreachable!("the host runs the ops that read the embedding"),
            Op::Route { .. } | Op::RouteSigmoid { .. } | Op::RouteScaled { .. } | Op::MoeExperts { .. } => unreachable!("the CPU runs the mixture-of-experts ops"),
            Op::GeluGlu { x, out } => {
                let (r, fh) = rows(out);
                self.dispatch(cmd, p.elementwise, None, None, &[5, off(out), off(x), cols(out), r, fh, 0, self.inputs.max_rows], [groups_of(cols(out)), r, 1])
            }
            Op::Softcap { x, cap } => {
                let (r, fh) = rows(x);
                self.dispatch(cmd, p.elementwise, None, None, &[6, off(x), 0, cols(x), r, fh, cap.to_bits(), self.inputs.max_rows], [groups_of(cols(x)), r, 1])
            }
            Op::NormHeads { x, first_head, heads, head_dim, weight, eps } => {
                let (r, fh) = rows(x);
                let (w, w_off) = match weight {
                    Some(t) => {
                        let (w, w_off) = self.weight(t)?;
                        (Some(w), w_off)
                    }
                    None => (None, NO_WEIGHT),
                };
                let at = off(x) + first_head * head_dim;
                self.dispatch(cmd, p.rms_norm, w, None, &[at, at, cols(x), cols(x), head_dim, r, fh, w_off, eps.to_bits()], [heads, r, 1])
            }
            Op::Bias { x, bias } => {
                let (r, fh) = rows(x);
                let (w, w_off) = self.weight(bias)?;
                self.dispatch(cmd, p.elementwise, Some(w), None, &[4, off(x), w_off, cols(x), r, fh, 0, self.inputs.max_rows], [groups_of(cols(x)), r, 1])
            }
            Op::Scale { x, factor } => {
                let (r, fh) = rows(x);
                self.dispatch(cmd, p.elementwise, None, None, &[1, off(x), 0, cols(x), r, fh, factor.to_bits(), self.inputs.max_rows], [groups_of(cols(x)), r, 1])
            }
            Op::Add { acc, x } => {
                let (r, fh) = rows(acc);
                self.dispatch(cmd, p.elementwise, None, None, &[0, off(acc), off(x), cols(acc), r, fh, 0, self.inputs.max_rows], [groups_of(cols(acc)), r, 1])
            }
            Op::SwiGlu { x, out } => {
                let (r, fh) = rows(out);
                self.dispatch(cmd, p.elementwise, None, None, &[2, off(out), off(x), cols(out), r, fh, 0, self.inputs.max_rows], [groups_of(cols(out)), r, 1])
            }
            Op::GatherLogitRows { x, out } => self.dispatch(cmd, p.elementwise, None, None, &[3, off(out), off(x), cols(x), g.logit_rows, 1, 0, self.inputs.max_rows], [groups_of(cols(x)), g.logit_rows, 1]),
            Op::RmsNorm { x, weight, eps, out } => {
                let (r, fh) = rows(x);
                let (w, w_off) = self.weight(weight)?;
                let c = cols(x);
                self.dispatch(cmd, p.rms_norm, Some(w), None, &[off(x), off(out), c, cols(out), c, r, fh, w_off, eps.to_bits()], [1, r, 1])
            }
            Op::HeadRmsNorm { x, first_head, heads, weight, eps } => {
                let (r, fh) = rows(x);
                let (w, w_off) = self.weight(weight)?;
                let at = off(x) + first_head * hd;
                self.dispatch(cmd, p.rms_norm, Some(w), None, &[at, at, cols(x), cols(x), hd, r, fh, w_off, eps.to_bits()], [heads, r, 1])
            }
            Op::Rope { x, heads, cos, sin } => self.record_rope(cmd, g, x, (heads, hd), (cos, sin)),
            Op::RopeHeads { x, heads, head_dim, cos, sin } => self.record_rope(cmd, g, x, (heads, head_dim), (cos, sin)),
            Op::Attention { .. } | Op::WindowAttention { .. } => self.record_attention(cmd, g, AttentionOp::of(op, &h.model).expect("an attention op")),
            Op::MatMul { x, weight, out } => self.record_matmul(cmd, x, weight, out, g),
        }
    }

    /// Rotary embedding on the first `heads` heads of `head_dim` of every row of `x`.
    fn record_rope(&mut self, cmd: vk::CommandBuffer, g: &Graph, x: u32, (heads, head_dim): (u32, u32), (cos, sin): (TensorId, TensorId)) -> Result<()> {
        let (c, c_off) = self.weight(cos)?;
        let (s, s_off) = self.weight(sin)?;
        let v = &g.values[x as usize];
        let push = [self.at(v), v.cols, heads, head_dim, g.rows, c_off, s_off];
        self.dispatch(cmd, self.pipelines.rope, Some(c), Some(s), &push, [(heads * head_dim / 2).div_ceil(64), g.rows, 1])
    }

    /// An attention layer: the stored rows' keys and values into layer `layer`'s cache, then
    /// every row attending to the keys its pass and its window let it see.
    fn record_attention(&mut self, cmd: vk::CommandBuffer, g: &Graph, a: AttentionOp) -> Result<()> {
        let AttentionOp { qkv, out, layer, shape: HeadShape { heads, kv_heads, head_dim: hd, scale, window } } = a;
        if hd % 4 != 0 {
            return Err(Error::Request(format!("vulkan: head dimension {hd} is not supported (the attention shader reads heads four elements at a time)")));
        }
        let (h, p) = (self.h, self.pipelines);
        let w = &h.plan.window;
        let (dtype, elem) = match w.kv_dtype {
            KvDType::F32 => (0u32, 4u64),
            KvDType::F16 => (1, 2),
            KvDType::Bf16 => (2, 2),
        };
        let cap = h.plan.kv_capacity;
        // Every layer's cache is sized by the model's heads; a layer with wider heads and
        // fewer of them (verified to fit) uses the start of it, as on the host.
        let layer_bytes = 2 * h.model.n_kv_heads as u64 * h.model.head_dim as u64 * cap as u64 * elem;
        let used = 2 * kv_heads as u64 * hd as u64 * cap as u64 * elem;
        let (kv, kv_off) = self.window_words(w.kv.offset + layer as u64 * layer_bytes, used, &|| format!("the keys and values of layer {layer}"))?;
        // The shaders read the layer four elements at a time.
        debug_assert!(kv_off % 4 == 0, "a layer's cache starts 16-byte aligned");
        let words = if dtype == 0 { hd } else { hd / 2 };
        let (q, o) = (&g.values[qkv as usize], &g.values[out as usize]);
        let (q_off, width, out_off) = (self.at(q), q.cols, self.at(o));
        self.dispatch(cmd, p.store_kv, None, Some(kv), &[q_off, width, heads, kv_heads, hd, cap, kv_off, dtype], [(2 * kv_heads * words).div_ceil(64), g.rows, 1])?;
        let push = [q_off, width, out_off, heads, kv_heads, hd, cap, kv_off, dtype, g.rows, scale.to_bits(), window.unwrap_or(0)];
        self.dispatch(cmd, p.attention, None, Some(kv), &push, [heads, g.rows, 1])
    }

    fn record_matmul(&mut self, cmd: vk::CommandBuffer, x: u32, weight: TensorId, out: u32, g: &Graph) -> Result<()> {
        let h = self.h;
        let t = &h.tensors[weight as usize];
        let (n, k, format) = (t.shape[0], t.shape[1], t.dtype);
        let unsupported = || Error::Request(format!("vulkan: matmul weights {} are {}, which no shader reads", t.name, format.name()));
        let fmt = matmul_format(format, h.plan.bf16_activations).ok_or_else(unsupported)?;
        if k % 4 != 0 {
            return Err(Error::Request(format!("vulkan: matmul weights {} have {k} inputs; the shader reads them four at a time", t.name)));
        }
        let pb = panel_bytes(format, k as usize).ok_or_else(unsupported)? as u64;
        let xv = &g.values[x as usize];
        let (rows, fh) = match xv.rows {
            Rows::Tokens => (g.rows, 0u32),
            Rows::Logits => (g.logit_rows, 1u32),
        };
        let (x_off, out_off) = (self.at(xv), self.at(&g.values[out as usize]));
        let group = match format {
            DType::PanelQ4 { group } => group,
            _ => 0,
        };
        let (mut q_off, mut q_stride, mut scale_off, mut operand, mut blocks) = (0, 0, 0, None, 1);
        if fmt >= 4 {
            let l = operand_layout(format, h.plan.bf16_activations, h.plan.activation_scales, rows as usize, k as usize);
            let s = &h.plan.window.scratch.gemm_operand;
            if l.bytes as u64 > s.bytes {
                return Err(Error::Request(format!("vulkan: {}'s quantised operand needs {} bytes; the plan's GEMM scratch has {}", t.name, l.bytes, s.bytes)));
            }
            let (b, base) = self.window_words(s.offset, l.bytes as u64, &|| format!("the quantised activations for {}", t.name))?;
            (q_off, q_stride, scale_off, operand, blocks) = (base, (l.stride / 4) as u32, base + (l.scales_at / 4) as u32, Some(b), l.scales_per_row as u32);
            self.dispatch(cmd, self.pipelines.quantize, None, operand, &[x_off, k as u32, rows, fh, q_off, q_stride, scale_off, blocks], [rows, 1, 1])?;
        }
        // The host kernels' K chunks, so both backends add the same partial sums.
        let chunk = crate::kernels::gemm::chunk_k(format, k as usize) as u32;
        // A matrix larger than one binding may span runs in column slices of whole panels.
        let max = self.gpu.limits.max_storage_buffer_range as u64 - self.align();
        let per = (max / pb).max(1);
        let total = panels(n as usize) as u64;
        let base = self.weight_at(weight)?;
        let mut p0 = 0;
        while p0 < total {
            let p1 = (p0 + per).min(total);
            let (w, w_off) = self.window_words(base + p0 * pb, (p1 - p0) * pb, &|| format!("the bytes of one panel of {}", t.name))?;
            let push = [x_off, out_off, k as u32, n as u32, rows, fh, w_off, (pb / 4) as u32, (p0 * 16) as u32, group, q_off, q_stride, scale_off, chunk, blocks];
            // 32 invocations per workgroup, four columns each.
            self.dispatch(cmd, self.pipelines.matmul[fmt as usize], Some(w), operand, &push, [((p1 - p0) * 16).div_ceil(128) as u32, rows.div_ceil(4), 1])?;
            p0 = p1;
        }
        Ok(())
    }
}
