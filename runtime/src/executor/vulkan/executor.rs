//! The Vulkan executor: the window in device memory, each graph recorded once, a pass
//! submitted in order (see the module above).

use std::sync::Arc;
use std::time::Instant;

use ash::vk;
use llada_ir::Op;

use super::gpu::{vk_error, Gpu};
use super::pipelines::Pipelines;
use super::record::{PassInputs, RecordedGraph, Recorder, Step};

use crate::executor::{value_range, AttentionOp, Capabilities, Executor, OpProfile, Pass, RunInputs, SoftEmbed};
use crate::error::{Error, Result, Setting};
use crate::kernels::cpu::Features;
use crate::model::Model;
use crate::pool::Pool;
use crate::trace::{Trace, Track};
use crate::window::{homes, Window};

/// The window's device memory; freed when the window that holds it drops.
struct WindowMemory {
    gpu: Arc<Gpu>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
}

impl Drop for WindowMemory {
    fn drop(&mut self) {
        // The window drops before its session's executor: wait for the device here too (after
        // a failed wait for a pass, work on it may still be pending).
        // SAFETY: a live device.
        let _ = unsafe { self.gpu.device.device_wait_idle() };
        self.gpu.free_buffer(self.buffer, self.memory);
    }
}

/// The pass-inputs buffer's mapping (see `shaders/common.glsl`).
struct InputsMap(*mut u32, usize);

// SAFETY: the mapping is written only by the executor that owns it, between submits.
unsafe impl Send for InputsMap {}

/// Words before the positions in the pass-inputs buffer (`common.glsl`'s `IN_*`).
const INPUT_HEADER: usize = 5;

pub struct VulkanExecutor {
    gpu: Arc<Gpu>,
    pipelines: Pipelines,
    /// Each graph recorded, or why this device cannot run it.
    graphs: Vec<std::result::Result<RecordedGraph, String>>,
    command_pool: vk::CommandPool,
    descriptor_pools: Vec<vk::DescriptorPool>,
    query_pools: Vec<vk::QueryPool>,
    fence: vk::Fence,
    inputs: (vk::Buffer, vk::DeviceMemory),
    inputs_map: InputsMap,
    max_rows: usize,
    pool: Pool,
    /// The CPU kernels' paths, for the ops that run on the CPU between command buffers.
    features: Features,
    capabilities: Capabilities,
    trace: Option<Arc<Trace>>,
}

impl VulkanExecutor {
    /// Opens the Vulkan device, allocates the window in its memory and records every graph of
    /// `model`; `threads` CPU threads work around the passes, with kernel paths `features`.
    pub fn new(model: &Model, threads: usize, features: Features) -> Result<(VulkanExecutor, Window)> {
        let h = &model.header;
        let gpu = Arc::new(Gpu::open()?);
        let bytes = Window::bytes_for(h, true);
        let (buffer, memory, ptr) = gpu.mapped_buffer(bytes as u64, "window")?;
        let owner = WindowMemory { gpu: gpu.clone(), buffer, memory };
        // SAFETY: the mapping covers `bytes` host-writable bytes until `owner` drops, and
        // nothing else uses it; the device touches it only in this executor's submits.
        let window = unsafe { Window::over_device(h, ptr, bytes, Box::new(owner)) };
        let max_rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        let inputs_bytes = (INPUT_HEADER as u64 + 2 * max_rows as u64) * 4;
        let pool = Pool::new(threads.max(1), "llada-cpu").map_err(|e| Error::Internal(format!("starting the CPU thread pool: {e}")))?;
        let capabilities = Capabilities {
            backend: "vulkan",
            device: format!("{} (Vulkan)", gpu.name),
            runs_on_cpu: gpu.is_cpu,
            // The shaders dispatch the graph's rows, whatever the pass asks for.
            cost_per_row: false,
            max_allocation_bytes: gpu.max_allocation,
            device_timestamps: gpu.timestamp_bits > 0,
            int8_dot: gpu.int8_dot,
        };
        // The executor owns each object as soon as it exists (null until then), so a failure
        // part-way frees what was made through `drop`.
        let mut e = VulkanExecutor {
            gpu: gpu.clone(),
            pipelines: Pipelines::new(gpu.clone(), h.plan.kv_capacity, widest_head(h))?,
            graphs: Vec::new(),
            command_pool: vk::CommandPool::null(),
            descriptor_pools: Vec::new(),
            query_pools: Vec::new(),
            fence: vk::Fence::null(),
            inputs: (vk::Buffer::null(), vk::DeviceMemory::null()),
            inputs_map: InputsMap(std::ptr::null_mut(), 0),
            max_rows,
            pool,
            features,
            capabilities,
            trace: None,
        };
        let (ib, im, iptr) = gpu.mapped_buffer(inputs_bytes, "pass inputs")?;
        (e.inputs, e.inputs_map) = ((ib, im), InputsMap(iptr as *mut u32, inputs_bytes as usize / 4));
        let d = &gpu.device;
        let info = vk::CommandPoolCreateInfo::default().queue_family_index(gpu.family);
        // SAFETY (both): valid create infos on a live device; destroyed in `drop`.
        e.command_pool = unsafe { d.create_command_pool(&info, None) }.map_err(|e| vk_error("creating a command pool", e))?;
        e.fence = unsafe { d.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(|e| vk_error("creating a fence", e))?;
        let command_pool = e.command_pool;
        let homes = homes(h);
        let mut r = Recorder::new(&gpu, &e.pipelines, h, &homes, buffer, PassInputs { buffer: ib, bytes: inputs_bytes, max_rows: max_rows as u32 }, command_pool);
        let recorded = r.record_all(model);
        e.descriptor_pools = std::mem::take(&mut r.descriptor_pools);
        e.query_pools = std::mem::take(&mut r.query_pools);
        e.graphs = recorded?;
        if let Some(Err(why)) = e.graphs.first().filter(|_| e.graphs.iter().all(|g| g.is_err())) {
            return Err(Error::setting(Setting::Backend, format!("vulkan: {} has no graph this device can run; the first: {why}", model.path.display())));
        }
        Ok((e, window))
    }

    /// Writes the pass inputs the shaders read (positions, logit rows, counts).
    fn write_inputs(&mut self, inp: &RunInputs) {
        // SAFETY: the mapping holds `len` words and the device reads it only during this
        // executor's submits, none of which is pending (each was waited for).
        let words = unsafe { std::slice::from_raw_parts_mut(self.inputs_map.0, self.inputs_map.1) };
        let block = inp.block_causal.unwrap_or(0) as u32;
        words[..INPUT_HEADER].copy_from_slice(&[inp.stored_rows as u32, inp.context as u32, inp.logit_rows.len() as u32, inp.rows as u32, block]);
        words[INPUT_HEADER..INPUT_HEADER + inp.positions.len()].copy_from_slice(inp.positions);
        words[INPUT_HEADER + self.max_rows..INPUT_HEADER + self.max_rows + inp.logit_rows.len()].copy_from_slice(inp.logit_rows);
    }

    /// Submits `cmd` and waits for it.
    fn submit(&self, cmd: vk::CommandBuffer) -> Result<()> {
        let d = &self.gpu.device;
        let cmds = [cmd];
        let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
        // SAFETY: a recorded command buffer that is not pending (the previous submit was
        // waited for); the fence is unsignalled (reset after every wait).
        unsafe {
            d.queue_submit(self.gpu.queue, &submit, self.fence).map_err(|e| vk_error("submitting a graph", e))?;
            if let Err(e) = d.wait_for_fences(&[self.fence], true, u64::MAX) {
                // Nothing may be reset or resubmitted while the work could still run.
                let _ = d.device_wait_idle();
                let _ = d.reset_fences(&[self.fence]);
                return Err(vk_error("waiting for a graph", e));
            }
            d.reset_fences(&[self.fence]).map_err(|e| vk_error("resetting a fence", e))
        }
    }

    /// Seconds each op of `ops` took on the device, from the timestamps written around it.
    fn op_times(&self, queries: vk::QueryPool, ops: std::ops::Range<usize>, profile: &mut OpProfile) -> Result<()> {
        let mut stamps = vec![0u64; 2 * ops.len()];
        // SAFETY: the queries were written by the submit just waited for.
        unsafe { self.gpu.device.get_query_pool_results(queries, 2 * ops.start as u32, &mut stamps, vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT) }.map_err(|e| vk_error("reading timestamps", e))?;
        let mask = if self.gpu.timestamp_bits >= 64 { u64::MAX } else { (1u64 << self.gpu.timestamp_bits) - 1 };
        let period = self.gpu.limits.timestamp_period as f64 * 1e-9;
        for (i, pair) in ops.zip(stamps.chunks_exact(2)) {
            profile.times.push((i, (pair[1].wrapping_sub(pair[0]) & mask) as f64 * period));
        }
        Ok(())
    }
}

/// The widest head an attention op of `h` has (the model's, or a layer's own), rounded up to
/// the four elements the attention shader reads at a time.
fn widest_head(h: &llada_ir::Header) -> u32 {
    let ops = h.graphs.iter().flat_map(|g| &g.ops);
    let widest = ops.filter_map(|op| AttentionOp::of(op, &h.model).map(|a| a.shape.head_dim));
    widest.max().unwrap_or(h.model.head_dim).next_multiple_of(4)
}

impl Executor for VulkanExecutor {
    fn run(&mut self, model: &Model, pass: Pass<'_>) -> Result<()> {
        let Pass { graph, inputs, window, mut stager, moe, mut profile } = pass;
        let inp = &inputs;
        let (g, gid) = (model.graph(graph), graph as usize);
        let recorded = match &self.graphs[gid] {
            Ok(r) => r,
            Err(why) => {
                return Err(Error::request(format!("{why}; a shorter prompt and generation use a smaller graph, or compile with a smaller --max-seq (or for a GPU --target)")));
            }
        };
        let queries = recorded.queries;
        self.write_inputs(inp);
        for step in &self.graphs[gid].as_ref().expect("checked above").steps {
            match step {
                Step::Staging(step) => {
                    if let Some(s) = stager.as_deref_mut() {
                        s.follow(*step)?;
                    }
                }
                Step::Embed { op } => {
                    let start = Instant::now();
                    let parts = window.parts();
                    let Op::Embed { table, out } = g.ops[*op] else { unreachable!("the verified program's embedding step names an Embed op") };
                    let v = &g.values[out as usize];
                    let range = value_range(g, v, inp.logit_rows.len(), parts.activations_offset);
                    crate::kernels::embed_rows(model.weights(table), v.cols as usize, inp.tokens, &mut parts.activations[range]);
                    if let Some(p) = profile.as_deref_mut() {
                        p.times.push((*op, start.elapsed().as_secs_f64()));
                    }
                }
                Step::SoftEmbed { op } => {
                    let start = Instant::now();
                    let Op::SoftEmbed { x, table, scale, out } = g.ops[*op] else { unreachable!("a recorded SoftEmbed step names a SoftEmbed op") };
                    let parts = window.parts();
                    SoftEmbed { x, table, scale, out }.run(model, g, inp, parts.activations, parts.activations_offset, &self.pool, self.features);
                    if let Some(p) = profile.as_deref_mut() {
                        p.times.push((*op, start.elapsed().as_secs_f64()));
                    }
                }
                Step::Experts { ops } => {
                    // The routers and experts: the session's CPU step, on the rows the device
                    // computed (the command buffer before made them visible).
                    for op in ops.clone() {
                        let start = Instant::now();
                        let parts = window.parts();
                        moe.run(model, g, op, inp, parts.activations, parts.activations_offset, parts.gemm)?;
                        if let Some(p) = profile.as_deref_mut() {
                            p.times.push((op, start.elapsed().as_secs_f64()));
                        }
                    }
                }
                Step::Device { cmd, ops } => {
                    let start = Instant::now();
                    self.submit(*cmd)?;
                    if let Some(t) = &self.trace {
                        t.span(Track::Device, format!("{} ops {}..{}", g.name, ops.start, ops.end), start, Instant::now());
                    }
                    match (profile.as_deref_mut(), queries) {
                        (Some(p), Some(q)) => self.op_times(q, ops.clone(), p)?,
                        // No timestamps: the chunk's wall time, charged to its first op.
                        (Some(p), None) => {
                            p.times.push((ops.start, start.elapsed().as_secs_f64()));
                            p.times.extend(ops.clone().skip(1).map(|i| (i, 0.0)));
                        }
                        (None, _) => {}
                    }
                }
            }
        }
        Ok(())
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn set_trace(&mut self, trace: Arc<Trace>) {
        self.trace = Some(trace);
    }

    fn pool(&self) -> &Pool {
        &self.pool
    }
}

impl Drop for VulkanExecutor {
    fn drop(&mut self) {
        let d = &self.gpu.device;
        // SAFETY: nothing is pending (every submit was waited for; waiting for idle makes sure
        // after a failed wait); each object was made by this executor and is destroyed once.
        unsafe {
            let _ = d.device_wait_idle();
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.command_pool, None);
            for &p in &self.descriptor_pools {
                d.destroy_descriptor_pool(p, None);
            }
            for &q in &self.query_pools {
                d.destroy_query_pool(q, None);
            }
        }
        self.gpu.free_buffer(self.inputs.0, self.inputs.1);
    }
}
