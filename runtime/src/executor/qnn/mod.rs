//! Qualcomm's HTP (the phone NPU) through QNN: the artifact's context binaries (`lladac
//! --target sm8650`...) created at session open, and each planned graph run as the executable
//! the compiler built for it. The op list never reaches this backend: it runs graph ids.
//!
//! Per pass the host does what lies at the executable's boundary: it embeds the token rows,
//! gathers the rotary rows at their positions, builds the attention mask from the run's
//! inputs (`io`), and afterwards stores the keys and values of the rows the run stores into
//! the window's KV cache and widens the logits into the window's logits value. The KV cache
//! itself is bound in place: each layer's key and value planes of the window are the
//! executable's cache inputs (client buffers: the simulator has no registered buffers, QNN.md).

mod io;

use std::ffi::CString;
use std::sync::Arc;

use half::f16;
use llada_ir::npu::{NpuGraph, NpuSection, NpuTensor, Role};
use llada_ir::Op;
use llada_qnn::abi::{DATATYPE_FLOAT_16, DATATYPE_INT_32};
use llada_qnn::context::Graph as QnnGraph;
use llada_qnn::{Context, Device, IoBuffer};

pub use llada_qnn::{abi, library, QnnLibrary, HOW_TO_GET};

use super::{value_range, Capabilities, Executor, OpProfile, RunInputs};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::moe::Experts;
use crate::pool::Pool;
use crate::staging::Stager;
use crate::window::{KvView, Window};

/// One prepared executable: its context, its QNN graph, its I/O table.
struct Prepared {
    context: usize,
    graph: QnnGraph,
    table: NpuGraph,
}

pub struct QnnExecutor {
    contexts: Vec<Context>,
    /// By planned graph id.
    graphs: Vec<Prepared>,
    pool: Pool,
    capabilities: Capabilities,
    /// Host-side staging of the boundary tensors, sized for the largest graph.
    scratch: io::Scratch,
    /// Keeps the library loaded while its contexts live (dropped last).
    _device: Arc<Device>,
}

impl QnnExecutor {
    /// Loads the QNN library (`LLADA_QNN_LIB`), creates every context of the artifact's
    /// section for its SoC and retrieves every graph.
    pub fn new(model: &Model, threads: usize) -> Result<QnnExecutor> {
        let h = &model.header;
        let artifact = |source: llada_ir::Error| Error::Artifact { path: model.path.clone(), source };
        let section = NpuSection::of(h).map_err(artifact)?.ok_or_else(|| {
            Error::request(format!(
                "{}: the artifact has no NPU executables (it was compiled for '{}'); compile it with `lladac compile --target sm8650` (or sm8550, sm8750, sm8850) and LLADA_QNN_LIB set",
                model.path.display(),
                h.compile.target
            ))
        })?;
        let lib = QnnLibrary::open(None)?;
        let backend = lib.backend()?;
        let device = Device::new(&backend, section.soc_id)?;
        let mut contexts = Vec::new();
        let mut prepared: Vec<Option<Prepared>> = (0..h.graphs.len()).map(|_| None).collect();
        for (ci, c) in section.contexts.iter().enumerate() {
            let seg = &h.segments[c.segment as usize];
            let binary = model.segment_bytes(c.segment);
            if crc32fast::hash(binary) != c.crc32 {
                return Err(artifact(llada_ir::Error::invalid(format!("the NPU context binary '{}' is corrupted (its CRC-32 is not the one recorded)", seg.name))));
            }
            check_binary(&lib, binary, &seg.name, &section, c)?;
            let context = Context::from_binary(&device, binary).map_err(|e| {
                Error::Device(format!("{}: QNN refused context binary '{}' (built for {} by QNN {}): {e}", model.path.display(), seg.name, section.soc, section.qnn_build))
            })?;
            for g in &c.graphs {
                let graph = context.graph(&g.name)?;
                prepared[g.graph as usize] = Some(Prepared { context: ci, graph, table: g.clone() });
            }
            contexts.push(context);
        }
        let graphs = prepared.into_iter().map(|p| p.expect("the verifier checked every graph has an executable")).collect();
        let pool = Pool::new(threads, "llada-worker").map_err(|e| Error::Internal(format!("the thread pool does not start: {e}")))?;
        let capabilities = Capabilities {
            backend: "qnn",
            device: format!(
                "Qualcomm HTP, {} ({}), QNN {}{}; I/O: {}",
                section.soc,
                lib.provider_name,
                lib.build_id,
                if cfg!(target_arch = "x86_64") { ", x86-64 simulator" } else { "" },
                llada_qnn::library::io_binding()
            ),
            // The simulator runs on this machine's CPU: its times are CPU figures.
            runs_on_cpu: cfg!(target_arch = "x86_64"),
            cost_per_row: false,
            max_allocation_bytes: u64::MAX,
            device_timestamps: false,
            int8_dot: false,
        };
        Ok(QnnExecutor { contexts, graphs, pool, capabilities, scratch: io::Scratch::new(h), _device: device })
    }
}

/// Checks what a context binary says of itself (libQnnSystem) against the artifact's record:
/// the SoC it was prepared for, and each executable's inputs and outputs (ids, names, types,
/// shapes). The simulator would run a binary of another SoC without a word (QNN.md).
fn check_binary(lib: &QnnLibrary, binary: &[u8], segment: &str, section: &NpuSection, c: &llada_ir::npu::NpuContext) -> Result<()> {
    let desc = llada_qnn::system::describe(&lib.dir, binary)?;
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
    }
}

/// A client buffer over `data` for the table entry `t`.
fn buffer<T>(t: &NpuTensor, data: &mut [T]) -> IoBuffer {
    IoBuffer {
        id: t.id,
        name: CString::new(t.name.as_str()).unwrap_or_default(),
        data_type: qnn_dtype(t),
        dims: t.dims.clone(),
        data: data.as_mut_ptr().cast(),
        bytes: std::mem::size_of_val(data),
    }
}

impl Executor for QnnExecutor {
    fn run(&mut self, model: &Model, graph: u32, inp: &RunInputs, window: &mut Window, stager: &mut Stager, _experts: Option<&mut Experts>, _profile: Option<&mut OpProfile>) -> Result<()> {
        // One executable a pass: no op of the plan is timed, so a profile stays empty (the
        // pass's time is the session's).
        let h = &model.header;
        let g = model.graph(graph);
        let m = &h.model;
        // The weights live in the contexts: nothing of the window's swap schedule is read, but
        // its protocol is kept so a plan with rotating segments stays consistent.
        for i in 0..g.ops.len() {
            stager.before_op(g, i)?;
            stager.after_op(g, i);
        }
        let Some(Op::Embed { table, .. }) = g.ops.first() else {
            return Err(Error::Internal(format!("graph '{}' does not start with the embedding", g.name)));
        };
        let rope = g.ops.iter().find_map(|o| if let Op::Rope { cos, sin, .. } = *o { Some((cos, sin)) } else { None });
        let s = &mut self.scratch;
        s.embed(model, *table, g.rows as usize, inp);
        if let Some((cos, sin)) = rope {
            s.rope(model, cos, sin, g.rows as usize, inp);
        }
        s.mask(h, g.rows as usize, inp);
        s.head_index(g.head_rows as usize, inp);
        let p = &self.graphs[graph as usize];
        let parts = window.parts();
        let KvView::Half(kv, _) = parts.kv else {
            return Err(Error::Internal("the NPU executables read an f16 KV cache; the verifier checked the plan has one".into()));
        };
        let (c, hd, kvh) = (h.plan.kv_capacity as usize, m.head_dim as usize, m.n_kv_heads as usize);
        let plane = kvh * c * hd;
        let (rows, hr) = (g.rows as usize, g.head_rows as usize);
        let mask_len = s.mask_len(h, rows);
        let mut inputs = Vec::with_capacity(p.table.inputs.len());
        let mut kv_rest = &mut kv[..];
        for t in &p.table.inputs {
            inputs.push(match t.role {
                Role::Hidden => buffer(t, &mut s.hidden[..rows * m.d_model as usize]),
                Role::Cos => buffer(t, &mut s.cos[..rows * hd / 2]),
                Role::Sin => buffer(t, &mut s.sin[..rows * hd / 2]),
                Role::Mask => buffer(t, &mut s.mask[..mask_len]),
                Role::HeadIndex => buffer(t, &mut s.head[..hr]),
                // Layers in order, key planes then value planes: the window's layout.
                Role::KCache(_) | Role::VCache(_) => {
                    let (this, rest) = std::mem::take(&mut kv_rest).split_at_mut(plane);
                    kv_rest = rest;
                    buffer(t, this)
                }
                other => return Err(Error::Internal(format!("graph '{}': {other:?} is not an input", g.name))),
            });
        }
        let mut outputs = Vec::with_capacity(p.table.outputs.len());
        let mut new_rest = &mut s.new_kv[..];
        for t in &p.table.outputs {
            outputs.push(match t.role {
                Role::Logits => buffer(t, &mut s.logits[..hr * m.embedding_size as usize]),
                Role::KNew(_) | Role::VNew(_) => {
                    let (this, rest) = std::mem::take(&mut new_rest).split_at_mut(kvh * rows * hd);
                    new_rest = rest;
                    buffer(t, this)
                }
                other => return Err(Error::Internal(format!("graph '{}': {other:?} is not an output", g.name))),
            });
        }
        self.contexts[p.context].execute(&p.graph, &mut inputs, &mut outputs)?;
        drop(inputs);
        drop(outputs);
        // The rows the run stores: their keys and values into the cache at their positions.
        let new_plane = kvh * rows * hd;
        for layer in 0..m.n_layers as usize {
            for kind in 0..2 {
                let new = &s.new_kv[(2 * layer + kind) * new_plane..][..new_plane];
                let cache = &mut kv[(2 * layer + kind) * plane..][..plane];
                io::store_rows(new, cache, kvh, rows, c, hd, &inp.positions[..inp.stored_rows]);
            }
        }
        let range = value_range(g, &g.values[g.logits as usize], inp.head_rows.len(), parts.activations_offset);
        for (o, &b) in parts.activations[range].iter_mut().zip(&s.logits) {
            *o = f16::from_bits(b).to_f32();
        }
        Ok(())
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn pool(&self) -> &Pool {
        &self.pool
    }
}
