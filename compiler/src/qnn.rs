//! Lowering to Qualcomm's HTP through QNN: every planned graph (each row bucket) becomes one
//! QNN graph computing what its op list computes after the embedding, whole layers in one
//! graph (not op by op: a per-op graph pays a dispatch per op; a mixture-of-experts model's
//! graph is cut at each MoE layer's router and routed experts, which the host runs between
//! the pieces, `llada_ir::npu::pieces`), fp16 activations and KV,
//! fp16 or quantized matmul weights (block-scaled int4 between 16-bit activations). The graphs are finalized for the target's SoC, packed into as many contexts as
//! the NPU's window needs, and serialized; the artifact carries the binaries and each graph's
//! I/O table (`llada_ir::npu`). The QNN library must be on the build machine (`--qnn-lib` or
//! `LLADA_QNN_LIB`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use half::f16;
use llada_ir::npu::{ActivationRange, Bound, IoLayout, NpuContext, NpuDType, NpuEstimate, NpuGraph, NpuLimits, NpuOpGroup, NpuSection, NpuTensor, NpuWeights, Role, SECTION_VERSION, SOCS};
use llada_ir::{Graph, Header, Op, Rows, TensorId, ValueId};
use llada_qnn::abi::{QuantizeParams, DATATYPE_FLOAT_16, DATATYPE_INT_32, DATATYPE_UFIXED_POINT_16};
use llada_qnn::build::{Out, Output, ParamSpec};
use llada_qnn::{Context, Device, GraphBuilder, Profile, QnnLibrary, TensorRef};

use crate::error::{Error, Result};
use crate::npu_plan::{layer_ops, settle, split_contexts};
use crate::qnn_ops;

/// The SoC a target names, if it is one of QNN's (`sm8550`, `sm8650`, `sm8750`, `sm8850`).
pub fn soc_of(target: &str) -> Option<(&'static str, u32)> {
    SOCS.iter().find(|s| s.0 == target).map(|s| (s.0, s.1))
}

/// The compiled graphs: one binary per context, and the section describing them (its
/// contexts' `segment` fields are filled in when the binaries are written).
pub struct Lowered {
    pub section: NpuSection,
    pub binaries: Vec<Vec<u8>>,
    /// Seconds spent building and finalizing.
    pub seconds: f64,
}

/// The QNN library, opened before any work so a machine without it learns so at once.
pub fn open_library(target: &str, dir: Option<&Path>) -> Result<Arc<QnnLibrary>> {
    let flag = if dir.is_none() { " (or name the folder with --qnn-lib DIR)" } else { "" };
    QnnLibrary::open(dir).map_err(|e| match e {
        llada_qnn::Error::Missing(m) => Error::Options(format!("--target {target} builds NPU executables, which needs Qualcomm's QNN library: {m}{flag}; or add --host-only to build the host stand-in without it")),
        other => qnn_err(other),
    })
}

fn qnn_err(e: llada_qnn::Error) -> Error {
    match e {
        llada_qnn::Error::Missing(m) => Error::Options(format!("--target with an NPU: {m}")),
        other => Error::Options(format!("lowering to QNN: {other}")),
    }
}

/// How the executables are built: for which SoC, from which weight format, against which
/// limits.
#[derive(Debug, Clone, Copy)]
pub struct NpuOptions {
    /// The SoC's name and QNN's id of it (`soc_of`).
    pub soc: (&'static str, u32),
    pub weights: NpuWeights,
    /// The HTP's limits the contexts are planned against.
    pub limits: NpuLimits,
    /// Contexts to split the layers into (`None`: the fewest whose binaries fit the window's
    /// room for contexts).
    pub contexts: Option<u32>,
    /// Each context's row buckets over one copy of their weights (the phone's form).
    pub shared_weights: bool,
    /// Also prepare every executable for this SoC id with profiling on, for QNN's own
    /// performance estimate (recorded in the section; the binaries are not kept).
    pub estimate_soc: Option<u32>,
}

/// The calibrated ranges of 16-bit activations ([`NpuWeights::Int4Lpbq`]) and what they were
/// measured on.
#[derive(Debug, Clone, Default)]
pub struct Calibration {
    pub ranges: Vec<ActivationRange>,
    pub source: String,
}

/// Lowers every graph of `h` as `opts` says. `weights` gives a tensor's values as f32.
/// `calibration`: the activation ranges, which a format with 16-bit activations needs.
pub fn lower(h: &Header, weights: &dyn Fn(TensorId) -> Result<Vec<f32>>, calibration: &Calibration, lib: &Arc<QnnLibrary>, opts: &NpuOptions) -> Result<Lowered> {
    let NpuOptions { soc, weights: format, limits, contexts, shared_weights, estimate_soc } = *opts;
    let fixed_point = matches!(format, NpuWeights::Int4Lpbq { .. });
    if fixed_point == calibration.ranges.is_empty() {
        return Err(Error::Options(format!("lowering to QNN: {} weights with {} activation ranges", format.name(), calibration.ranges.len())));
    }
    let ranges: HashMap<TensorId, ActivationRange> = calibration.ranges.iter().map(|r| (r.weight, *r)).collect();
    let start = std::time::Instant::now();
    let io = IoLayout::of(h);
    let (groups, bounds) = split_contexts(h, format, shared_weights, limits, contexts).map_err(|e| Error::Options(format!("--target {}: {e}", soc.0)))?;
    let n = h.model.n_layers;
    let cache_lens = crate::npu_plan::cache_lens(h.plan.kv_capacity);
    let backend = lib.backend().map_err(qnn_err)?;
    let device = Device::new(&backend, soc.1).map_err(qnn_err)?;
    let estimating = estimate_soc.map(|id| Device::new(&backend, id).map_err(qnn_err)).transpose()?;
    let mut estimates = Vec::new();
    let mut built = Vec::new();
    let mut binaries = Vec::new();
    for layers in groups {
        let ctx = Context::create(&device, shared_weights).map_err(qnn_err)?;
        // Every row bucket of the context reads the same weights: read and widen each once
        // per context (an 8B checkpoint read once per bucket is most of a compile's time).
        let cache: std::cell::RefCell<HashMap<TensorId, Vec<f32>>> = Default::default();
        let cached = |t: TensorId| -> Result<Vec<f32>> {
            if let Some(v) = cache.borrow().get(&t) {
                return Ok(v.clone());
            }
            let v = weights(t)?;
            cache.borrow_mut().insert(t, v.clone());
            Ok(v)
        };
        let src = Source { h, weights: &cached, format, ranges: &ranges, io: &io };
        let mut graphs = Vec::new();
        for (gi, b) in bounds.iter().enumerate() {
            // A mixture-of-experts layer cuts its graph: the router and routed experts run on
            // the host between the executables (`npu::pieces`).
            let ops = layer_ops(&h.graphs[gi], b, layers, n);
            // Per cache length: QNN's estimate of the graph's executables (cycles, micros) and
            // its op trace by kind.
            let mut estimate: Vec<(u64, u64, Vec<NpuOpGroup>)> = vec![(0, 0, Vec::new()); cache_lens.len()];
            for piece in llada_ir::npu::pieces(&h.graphs[gi], ops) {
                // A piece with attention is built once per cache length, in op order for each.
                let (roles, _) = llada_ir::npu::piece_roles(&h.graphs[gi], piece.clone()).map_err(|e| Error::Options(format!("lowering to QNN: {e}")))?;
                let attends = roles.iter().any(|(r, _)| matches!(r, Role::KCache(_)));
                let lens: Vec<u32> = if attends { cache_lens.clone() } else { vec![0] };
                for &cache_len in &lens {
                    let at = Piece { graph: gi as u32, layers, ops: piece.clone(), cache_len };
                    graphs.push(lower_graph(&src, &at, &ctx, None)?);
                    let Some(dev) = &estimating else { continue };
                    let (e, traced) = estimate_executable(&src, &at, dev)?;
                    add_estimate(&mut estimate, &cache_lens, cache_len, e, &traced);
                }
            }
            if let Some(dev) = &estimating {
                // The executables of a graph's pieces, summed (the host's experts between
                // them are not the NPU's time).
                for (v, (cycles, micros, mut groups)) in estimate.into_iter().enumerate() {
                    groups.sort_by_key(|g| g.kind as u32);
                    estimates.push(NpuEstimate { graph: gi as u32, layers, cache_len: cache_lens[v], soc_id: dev.soc, cycles, micros, groups });
                }
            }
        }
        let binary = ctx.binary().map_err(qnn_err)?;
        // The spill-fill buffer its executables need, as the binary says (0 where it says none).
        let described = llada_qnn::system::describe(&lib.dir, &binary).map_err(qnn_err)?;
        let spill_fill_bytes = described.graphs.iter().filter_map(|g| g.spill_fill_bytes).max().unwrap_or(0);
        built.push(NpuContext { segment: u32::MAX, crc32: crc32fast::hash(&binary), layers, resident: false, session: 0, spill_fill_bytes, graphs });
        binaries.push(binary);
    }
    // Sessions and residency again from what was built (the plan's sizes were predictions).
    let sizes: Vec<u64> = binaries.iter().map(|b| b.len() as u64).collect();
    let spills: Vec<u64> = built.iter().map(|c| c.spill_fill_bytes).collect();
    let layers: Vec<[u32; 2]> = built.iter().map(|c| c.layers).collect();
    let plan = settle(h, &layers, &sizes, &spills, limits).map_err(|e| Error::Options(format!("--target {}: as built, {e}", soc.0)))?;
    for (k, c) in built.iter_mut().enumerate() {
        (c.session, c.resident) = (plan.session[k], plan.resident[k]);
    }
    let section = NpuSection { version: SECTION_VERSION, soc: soc.0.to_string(), soc_id: soc.1, qnn_build: lib.build_id.clone(), weights: format, shared_weights, limits, sessions: plan.sessions.clone(), context_budget: plan.budget, io, cache_lens, estimates, contexts: built, activations: calibration.ranges.clone(), calibration: calibration.source.clone() };
    drop(estimating);
    drop(device);
    drop(backend);
    Ok(Lowered { section, binaries, seconds: start.elapsed().as_secs_f64() })
}

/// Adds an executable's estimate `e` and op trace `traced` to its graph's totals per cache
/// length (`cache_lens`): merged over the graph's pieces, a piece without attention
/// (`cache_len` 0) counted at every length.
fn add_estimate(totals: &mut [(u64, u64, Vec<NpuOpGroup>)], cache_lens: &[u32], cache_len: u32, e: llada_qnn::Estimate, traced: &[NpuOpGroup]) {
    for (v, (cycles, micros, groups)) in totals.iter_mut().enumerate() {
        if cache_len != 0 && cache_lens[v] != cache_len {
            continue;
        }
        (*cycles, *micros) = (*cycles + e.cycles, *micros + e.micros);
        for g in traced {
            match groups.iter_mut().find(|x| x.kind == g.kind) {
                Some(x) => (x.busy_micros, x.ops) = (x.busy_micros + g.busy_micros, x.ops + g.ops),
                None => groups.push(*g),
            }
        }
    }
}

/// QNN's estimate of the executable `at` prepared for the modelled SoC `dev` (in a context of
/// its own, dropped), and its op trace grouped by kind.
fn estimate_executable(src: &Source, at: &Piece, dev: &Arc<Device>) -> Result<(llada_qnn::Estimate, Vec<NpuOpGroup>)> {
    let scratch = Context::create(dev, false).map_err(qnn_err)?;
    let profile = Profile::detailed(dev, true).map_err(qnn_err)?;
    lower_graph(src, at, &scratch, Some(&profile))?;
    let events = profile.events().map_err(qnn_err)?;
    let e = Profile::estimate(&events).ok_or_else(|| {
        Error::Options(format!(
            "--npu-estimate-soc {}: this QNN library has no performance model for that SoC id (it has one for 52, 62, 63, 72, 77, 95 and 114: QNN.md)",
            dev.soc
        ))
    })?;
    let traced: Vec<NpuOpGroup> = events.iter().filter_map(|e| e.object.as_deref()).flat_map(|t| crate::optrace::groups(t, src.format.fixed_point()).unwrap_or_default()).collect();
    Ok((e, traced))
}

/// Qualcomm's LPBQ of an `[n, k]` matrix: per output channel `c` and block `b` of `block`
/// inputs, the block's scale is the channel's scale times a factor 1..=16 (4 bits), rounded
/// up so that no value clips. Returns the int4 values in HWIO order (`[k][n]`, a 1x1
/// convolution's weight), the channel scales and the factors (`[c * blocks + b]`).
fn lpbq(values: &[f32], n: usize, block: usize) -> (Vec<i8>, Vec<f32>, Vec<u8>) {
    let k = values.len() / n.max(1);
    let blocks = k / block;
    let mut q = vec![0i8; n * k];
    let mut channel = Vec::with_capacity(n);
    let mut factors = Vec::with_capacity(n * blocks);
    for (c, row) in values.chunks_exact(k.max(1)).enumerate() {
        let wanted: Vec<f32> = row.chunks_exact(block).map(|b| b.iter().fold(0f32, |m, v| m.max(v.abs())) / 7.0).collect();
        let top = wanted.iter().copied().fold(0f32, f32::max);
        // An all-zero row still needs a positive scale.
        let scale = if top > 0.0 { top / 16.0 } else { 1.0 };
        for (b, &want) in wanted.iter().enumerate() {
            let f = (want / scale).ceil().clamp(1.0, 16.0);
            factors.push(f as u8);
            let step = scale * f;
            for (i, &v) in row[b * block..(b + 1) * block].iter().enumerate() {
                q[(b * block + i) * n + c] = (v / step).round().clamp(-8.0, 7.0) as i8;
            }
        }
        channel.push(scale);
    }
    (q, channel, factors)
}

/// Symmetric per-row quantization of an `[n, k]` matrix to signed `bits`: the values and one
/// scale per row (a zero row gets scale 1: QNN wants scales strictly positive).
fn per_channel(values: &[f32], n: usize, bits: u32) -> (Vec<i8>, Vec<f32>) {
    let qmax = ((1i32 << (bits - 1)) - 1) as f32;
    let k = values.len() / n.max(1);
    let mut q = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(n);
    for row in values.chunks_exact(k.max(1)) {
        let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
        let scale = if max > 0.0 { max / qmax } else { 1.0 };
        q.extend(row.iter().map(|v| (v / scale).round().clamp(-qmax, qmax) as i8));
        scales.push(scale);
    }
    (q, scales)
}

/// QNN's encoding of a 16-bit value covering `range`.
fn u16_params(range: [f32; 2]) -> QuantizeParams {
    let (scale, offset) = ActivationRange::u16_encoding(range);
    QuantizeParams::scale_offset(scale, offset)
}

/// The range of SiLU (`x * sigmoid(x)`) over `x` in `range`: its minimum, -0.2785 at
/// x = -1.2785, where the range holds that point.
fn silu_range(range: [f32; 2]) -> [f32; 2] {
    let silu = |x: f32| x / (1.0 + (-x).exp());
    let (lo, hi) = (range[0], range[1]);
    let low = if lo < -1.2785 && hi > -1.2785 { silu(-1.2785) } else { silu(lo).min(silu(hi)) };
    [low.min(0.0), silu(hi).max(silu(lo)).max(0.0)]
}

/// An `[n, k]` matrix (row-major) as `[k, n]`: a 1x1 convolution's HWIO weight.
fn hwio<T: Copy>(values: &[T], n: usize) -> Vec<T> {
    let k = values.len() / n.max(1);
    let mut out = Vec::with_capacity(values.len());
    for i in 0..k {
        out.extend((0..n).map(|c| values[c * k + i]));
    }
    out
}

fn f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

/// What every graph of a context is lowered from: the header, the weights' values (read once
/// per context), their NPU format, the calibrated activation ranges and the I/O layout.
struct Source<'a> {
    h: &'a Header,
    weights: &'a dyn Fn(TensorId) -> Result<Vec<f32>>,
    format: NpuWeights,
    ranges: &'a HashMap<TensorId, ActivationRange>,
    io: &'a IoLayout,
}

/// One planned graph's piece as a QNN graph.
struct Lowering<'a, 'c> {
    src: &'a Source<'a>,
    /// Values held as 16-bit fixed point, with the range of their encoding (a product read
    /// only by a SwiGLU, and the SwiGLU's result).
    fixed: HashMap<ValueId, (TensorRef, [f32; 2])>,
    g: &'a Graph,
    /// Cached positions the piece's attention reads (0: it has none).
    cache_len: u32,
    b: GraphBuilder<'c>,
    /// The executable's inputs and outputs, by role.
    inputs: Vec<(Role, TensorRef)>,
    outputs: Vec<(Role, TensorRef)>,
    values: HashMap<ValueId, TensorRef>,
    statics: HashMap<TensorId, TensorRef>,
    /// Rotary tables' rows at the rows' positions, gathered once per executable and table.
    angles: HashMap<TensorId, TensorRef>,
    next: usize,
}

impl Lowering<'_, '_> {
    fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{what}.{}", self.next)
    }

    fn rows(&self, v: ValueId) -> u32 {
        match self.g.values[v as usize].rows {
            Rows::Tokens => self.g.rows,
            Rows::Logits => self.g.logit_rows,
        }
    }

    fn value(&self, v: ValueId) -> Result<TensorRef> {
        self.values.get(&v).copied().ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: value '{}' is read before it is written", self.g.name, self.g.values[v as usize].name)))
    }

    /// The executable's inputs, one per role crossing into it; a role that carries a value
    /// (the residual stream, an MoE layer's host results) binds it.
    fn bind_inputs(&mut self, roles: &[Bound]) -> Result<()> {
        let (h, g) = (self.src.h, self.g);
        for &(role, value) in roles {
            let dtype = if role.dtype(self.src.format) == NpuDType::I32 { DATATYPE_INT_32 } else { DATATYPE_FLOAT_16 };
            let t = self.b.input(&role_name(role), dtype, &role.dims(h, g.rows, g.logit_rows, self.cache_len)).map_err(qnn_err)?;
            self.inputs.push((role, t));
            if let Some(v) = value {
                self.values.insert(v, t);
            }
        }
        Ok(())
    }

    fn input(&self, role: Role) -> TensorRef {
        self.inputs.iter().find(|(r, _)| *r == role).map(|(_, t)| *t).expect("every role the ops read is an input of this context")
    }

    /// The I/O table of `roles`, each found in `bound`: its tensor's id, shape and region.
    fn io_table(&self, bound: &[(Role, TensorRef)], roles: &[Bound]) -> Result<Vec<NpuTensor>> {
        let (h, g, b) = (self.src.h, self.g, &self.b);
        roles
            .iter()
            .map(|&(role, _)| {
                let t = bound.iter().find(|(r, _)| *r == role).map(|(_, t)| *t).ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: no {role:?}", g.name)))?;
                let offset = self.src.io.offset(h, role, g.rows).expect("every role has a region");
                Ok(NpuTensor { id: b.id(t), name: role_name(role), role, dtype: role.dtype(self.src.format), dims: b.dims(t).to_vec(), offset })
            })
            .collect()
    }

    fn weight(&mut self, t: TensorId, dims: &[u32]) -> Result<TensorRef> {
        if let Some(&r) = self.statics.get(&t) {
            return Ok(r);
        }
        let values = (self.src.weights)(t)?;
        let name = format!("w.{}", self.src.h.tensors[t as usize].name);
        let r = self.b.static_f16(&name, dims, &f16_bits(&values)).map_err(qnn_err)?;
        self.statics.insert(t, r);
        Ok(r)
    }

    /// A matmul's `[n, k]` weight as a 1x1-convolution weight `[1, 1, k, n]` (HWIO): fp16
    /// (`bits` 16), or signed `bits` (8, or 4 in an int8 container) with one symmetric scale
    /// per output channel.
    fn conv_weight(&mut self, t: TensorId, n: u32, k: u32, bits: u32) -> Result<TensorRef> {
        if let Some(&r) = self.statics.get(&t) {
            return Ok(r);
        }
        let mut values = (self.src.weights)(t)?;
        // Output channels padded to `n` with zero rows (`Lowering::padded`).
        values.resize((n * k) as usize, 0.0);
        let name = format!("w.{}", self.src.h.tensors[t as usize].name);
        let r = if bits == 16 {
            self.b.static_f16(&name, &[1, 1, k, n], &f16_bits(&hwio(&values, n as usize))).map_err(qnn_err)?
        } else {
            let (q, scales) = per_channel(&values, n as usize, bits);
            self.b.static_per_channel_on(&name, &[1, 1, k, n], 3, hwio(&q, n as usize), scales, bits).map_err(qnn_err)?
        };
        self.statics.insert(t, r);
        Ok(r)
    }

    /// A matmul's `[n, k]` weight as an LPBQ 1x1-convolution weight.
    fn lpbq_weight(&mut self, t: TensorId, n: u32, k: u32, block: u32) -> Result<TensorRef> {
        if let Some(&r) = self.statics.get(&t) {
            return Ok(r);
        }
        let name = format!("w.{}", self.src.h.tensors[t as usize].name);
        if k % block != 0 {
            return Err(Error::Options(format!("lowering '{name}' to QNN: its {k} inputs are not whole blocks of {block} (--group)")));
        }
        let mut values = (self.src.weights)(t)?;
        values.resize((n * k) as usize, 0.0);
        let (q, channel, factors) = lpbq(&values, n as usize, block as usize);
        let r = self.b.static_lpbq(&name, k, n, q, channel, factors).map_err(qnn_err)?;
        self.statics.insert(t, r);
        Ok(r)
    }

    /// A product's `[1, 1, rows, padded]` result cut to its `n` real channels (the padding
    /// rows of its weight are zeros), fixed point in the encoding of `range` where given.
    fn unpad(&mut self, y: TensorRef, rows: u32, n: u32, fixed: Option<[f32; 2]>) -> Result<TensorRef> {
        if self.b.dims(y)[3] == n {
            return Ok(y);
        }
        let ranges = ParamSpec::I32s("ranges", vec![4, 3], vec![0, 1, 1, 0, 1, 1, 0, rows as i32, 1, 0, n as i32, 1]);
        let name = self.fresh("stridedslice");
        let (ty, q) = match fixed {
            Some(range) => (DATATYPE_UFIXED_POINT_16, u16_params(range)),
            None => (DATATYPE_FLOAT_16, QuantizeParams::NONE),
        };
        self.b.op("StridedSlice", &[y], vec![ranges], Output::new(&name, ty, &[1, 1, rows, n], Out::Native).quantized(q)).map_err(qnn_err)
    }

    /// Columns `from..to` of a fixed-point `[rows, cols]` tensor in the encoding of `range`.
    fn fixed_columns(&mut self, x: TensorRef, range: [f32; 2], rows: u32, from: u32, to: u32) -> Result<TensorRef> {
        let ranges = vec![0, rows as i32, 1, from as i32, to as i32, 1];
        let name = self.fresh("stridedslice");
        let dims = [rows, to - from];
        let out = Output::new(&name, DATATYPE_UFIXED_POINT_16, &dims, Out::Native).quantized(u16_params(range));
        self.b.op("StridedSlice", &[x], vec![ParamSpec::I32s("ranges", vec![2, 3], ranges)], out).map_err(qnn_err)
    }

    /// A fixed-point op whose result covers `range`.
    fn fixed_op(&mut self, ty: &str, inputs: &[TensorRef], range: [f32; 2], dims: &[u32]) -> Result<TensorRef> {
        let name = self.fresh(&ty.to_lowercase());
        self.b.op(ty, inputs, vec![], Output::new(&name, DATATYPE_UFIXED_POINT_16, dims, Out::Native).quantized(u16_params(range))).map_err(qnn_err)
    }

    /// `x` as 16-bit fixed point covering `range`.
    fn quantize(&mut self, x: TensorRef, range: [f32; 2]) -> Result<TensorRef> {
        let name = self.fresh("quantize");
        let dims = self.b.dims(x).to_vec();
        self.b.op("Quantize", &[x], vec![], Output::new(&name, DATATYPE_UFIXED_POINT_16, &dims, Out::Native).quantized(u16_params(range))).map_err(qnn_err)
    }

    fn constant(&mut self, dims: &[u32], v: &[f32]) -> Result<TensorRef> {
        let name = self.fresh("const");
        self.b.static_f16(&name, dims, &f16_bits(v)).map_err(qnn_err)
    }

    fn op(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32]) -> Result<TensorRef> {
        let name = self.fresh(&ty.to_lowercase());
        self.b.op(ty, inputs, params, Output::new(&name, DATATYPE_FLOAT_16, dims, Out::Native)).map_err(qnn_err)
    }

    fn output(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, name: &str, dims: &[u32]) -> Result<TensorRef> {
        self.b.op(ty, inputs, params, Output::new(name, DATATYPE_FLOAT_16, dims, Out::AppRead)).map_err(qnn_err)
    }

    /// An op's result: the executable's output `leaves_as` where it leaves the executable,
    /// else an intermediate.
    fn result(&mut self, leaves_as: Option<Role>, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32]) -> Result<TensorRef> {
        match leaves_as {
            Some(role) => self.output(ty, inputs, params, &role_name(role), dims),
            None => self.op(ty, inputs, params, dims),
        }
    }

    /// Elementwise op `ty` of `a` and `b` in `a`'s shape (`b` broadcast), as an op's result.
    fn elementwise(&mut self, leaves_as: Option<Role>, ty: &str, a: TensorRef, b: TensorRef) -> Result<TensorRef> {
        let dims = self.b.dims(a).to_vec();
        self.result(leaves_as, ty, &[a, b], vec![], &dims)
    }

    fn columns(&mut self, x: TensorRef, rows: u32, from: u32, to: u32) -> Result<TensorRef> {
        qnn_ops::columns(self, x, rows, from, to)
    }

    fn reshape(&mut self, x: TensorRef, dims: &[u32]) -> Result<TensorRef> {
        qnn_ops::reshape(self, x, dims, None)
    }

    fn transpose(&mut self, x: TensorRef, perm: &[u32]) -> Result<TensorRef> {
        let from = self.b.dims(x).to_vec();
        let dims: Vec<u32> = perm.iter().map(|&p| from[p as usize]).collect();
        self.op("Transpose", &[x], vec![ParamSpec::U32s("perm", perm.to_vec())], &dims)
    }

    fn binary(&mut self, ty: &str, a: TensorRef, b: TensorRef) -> Result<TensorRef> {
        let dims = broadcast(self.b.dims(a), self.b.dims(b));
        self.op(ty, &[a, b], vec![], &dims)
    }

    /// `x` (`[rows, cols]`: `dims`) RMS-normed over each row, scaled by `weight`.
    fn rms_norm(&mut self, x: TensorRef, weight: TensorId, eps: f32, dims: [u32; 2], leaves_as: Option<Role>) -> Result<TensorRef> {
        let gamma = self.weight(weight, &[dims[1]])?;
        qnn_ops::rms_norm(self, x, gamma, eps, dims, leaves_as.map(role_name).as_deref())
    }

    /// Lowers `op`, whose result leaves the executable as `leaves_as` where it does.
    fn lower_op(&mut self, op: &Op, leaves_as: Option<Role>) -> Result<()> {
        let (g, m) = (self.g, &self.src.h.model);
        match *op {
            Op::Embed { .. } | Op::SoftEmbed { .. } => return Err(Error::Options(format!("lowering graph '{}' to QNN: {} after the host's ops before the executables", g.name, op.name()))),
            Op::Scale { x, factor } => {
                let xs = self.value(x)?;
                let f = self.constant(&[1], &[factor])?;
                let t = self.elementwise(leaves_as, "ElementWiseMultiply", xs, f)?;
                self.values.insert(x, t);
            }
            Op::Bias { x, bias } => {
                let xs = self.value(x)?;
                let bt = self.weight(bias, &[g.values[x as usize].cols])?;
                let t = self.elementwise(leaves_as, "ElementWiseAdd", xs, bt)?;
                self.values.insert(x, t);
            }
            Op::RmsNorm { x, weight, eps, out } => {
                let xs = self.value(x)?;
                let dims = [self.rows(x), g.values[x as usize].cols];
                let t = self.rms_norm(xs, weight, eps, dims, leaves_as)?;
                self.values.insert(out, t);
            }
            Op::MatMul { x, weight, out } => self.matmul(x, weight, out, leaves_as)?,
            Op::Rope { x, heads, .. } => self.rope(x, heads, leaves_as)?,
            Op::Attention { qkv, out, heads, kv_heads, layer } => {
                if heads != m.n_heads || kv_heads != m.n_kv_heads {
                    return Err(Error::Options(format!("lowering graph '{}' to QNN: attention with {heads}/{kv_heads} heads, the model has {}/{}", g.name, m.n_heads, m.n_kv_heads)));
                }
                let shape = (m.n_heads, m.n_kv_heads, m.head_dim, 1.0 / (m.head_dim as f32).sqrt());
                self.attention(qkv, out, layer, shape, None, leaves_as)?;
            }
            Op::WindowAttention { qkv, out, heads, kv_heads, head_dim, layer, scale, window } => {
                self.attention(qkv, out, layer, (heads, kv_heads, head_dim, scale), Some(window.unwrap_or(0)), leaves_as)?;
            }
            Op::SwiGlu { x, out } if self.fixed.contains_key(&x) => self.fixed_swiglu(x, out)?,
            Op::SwiGlu { x, out } => {
                let (xs, r) = (self.value(x)?, g.rows);
                let hidden = g.values[out as usize].cols;
                let gate = self.columns(xs, r, 0, hidden)?;
                let up = self.columns(xs, r, hidden, 2 * hidden)?;
                let s = self.op("Sigmoid", &[gate], vec![], &[r, hidden])?;
                let silu = self.binary("ElementWiseMultiply", gate, s)?;
                let t = self.result(leaves_as, "ElementWiseMultiply", &[silu, up], vec![], &[r, hidden])?;
                self.values.insert(out, t);
            }
            Op::Add { acc, x } => {
                let (a, xs) = (self.value(acc)?, self.value(x)?);
                let t = self.elementwise(leaves_as, "ElementWiseAdd", a, xs)?;
                self.values.insert(acc, t);
            }
            Op::GatherLogitRows { x, out } => {
                let xs = self.value(x)?;
                let cols = g.values[x as usize].cols;
                let index = self.input(Role::LogitIndex);
                let t = self.result(leaves_as, "Gather", &[xs, index], vec![ParamSpec::I32("axis", 0)], &[g.logit_rows, cols])?;
                self.values.insert(out, t);
            }
            Op::HeadRmsNorm { x, first_head, heads, weight, eps } => self.norm_heads(x, first_head..first_head + heads, m.head_dim, Some(weight), eps, leaves_as)?,
            Op::NormHeads { x, first_head, heads, head_dim, weight, eps } => self.norm_heads(x, first_head..first_head + heads, head_dim, weight, eps, leaves_as)?,
            Op::GeluGlu { x, out } => {
                let xs = self.value(x)?;
                let hidden = g.values[out as usize].cols;
                let t = qnn_ops::gelu_glu(self, xs, g.rows, hidden, leaves_as.map(role_name).as_deref())?;
                self.values.insert(out, t);
            }
            Op::Softcap { x, cap } => {
                if leaves_as == Some(Role::Logits) && self.src.format.fixed_point() {
                    // Such logits leave as the LM head's 16-bit product, which a cap would follow.
                    return Err(Error::Options(format!("lowering graph '{}' to QNN: soft-capped logits with {} weights (16-bit activations): build with fp16, int8 or int4 weights", g.name, self.src.format.name())));
                }
                let xs = self.value(x)?;
                let t = qnn_ops::softcap(self, xs, cap, leaves_as.map(role_name).as_deref())?;
                self.values.insert(x, t);
            }
            Op::RopeHeads { x, heads, head_dim, cos, sin } => {
                let xs = self.value(x)?;
                let (cos, sin) = (self.angles(cos, head_dim)?, self.angles(sin, head_dim)?);
                let t = qnn_ops::rope(self, xs, g.rows, heads, head_dim, cos, sin, leaves_as.map(role_name).as_deref())?;
                self.values.insert(x, t);
            }
            // The routers and experts run on the CPU between executables.
            Op::Route { .. } | Op::RouteSigmoid { .. } | Op::RouteScaled { .. } | Op::MoeExperts { .. } => {
                return Err(Error::Options(format!("lowering graph '{}' to QNN: op {} has no NPU lowering", g.name, op.name())));
            }
        }
        Ok(())
    }

    /// The rows' angles of rotary table `table` (`[positions, head_dim / 2]`): its first rows
    /// a static tensor (as many as a row's position may reach: the cache's capacity, or the
    /// graph's rows where more), gathered at the rows' positions (`Role::Positions`).
    fn angles(&mut self, table: TensorId, head_dim: u32) -> Result<TensorRef> {
        if let Some(&t) = self.angles.get(&table) {
            return Ok(t);
        }
        let (half, reach) = (head_dim / 2, self.src.h.plan.kv_capacity.max(self.g.rows));
        let mut values = (self.src.weights)(table)?;
        values.truncate((reach * half) as usize);
        let name = format!("w.{}", self.src.h.tensors[table as usize].name);
        let rows = self.b.static_f16(&name, &[reach, half], &f16_bits(&values)).map_err(qnn_err)?;
        let t = qnn_ops::table_rows(self, rows, self.input(Role::Positions))?;
        self.angles.insert(table, t);
        Ok(t)
    }

    /// `x` times the `[n, k]` matrix `weight`, into `out`: a 1x1 Conv2d over `[1, 1, rows, k]`
    /// (ExecuTorch's and AI Hub's form; with LPBQ the only reliable one, QNN.md).
    fn matmul(&mut self, x: ValueId, weight: TensorId, out: ValueId, leaves_as: Option<Role>) -> Result<()> {
        let (h, g) = (self.src.h, self.g);
        let shape = &h.tensors[weight as usize].shape;
        let (n, k) = (shape[0] as u32, shape[1] as u32);
        // The HTP computes channels in tiles of 32: a product with fewer output
        // channels than a whole number of tiles gets zero ones, cut off after it.
        let np = n.next_multiple_of(32);
        let rows = self.rows(x);
        // (A fixed-point input has no fp16 form: `Lowering::fixed`.)
        let x4 = if self.fixed.contains_key(&x) {
            None
        } else {
            let xs = self.value(x)?;
            Some(self.reshape(xs, &[1, 1, rows, k])?)
        };
        let params = || vec![ParamSpec::U32s("stride", vec![1, 1]), ParamSpec::U32Grid("pad_amount", vec![2, 2], vec![0; 4])];
        let t = if let NpuWeights::Int4Lpbq { block } = self.src.format {
            // 16-bit activations around the product, calibrated; the graph around it
            // stays fp16. The LM head holds int8 per output channel (no block factors
            // to expand on the vector unit), and its uint16 product leaves the
            // executable as it is: the host dequantizes the logits.
            let range = *self.src.ranges.get(&weight).ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: matmul weight '{}' has no calibrated range", g.name, h.tensors[weight as usize].name)))?;
            let xq = match self.fixed.get(&x) {
                // Already 16-bit in this product's input encoding (a SwiGLU's result).
                Some(&(fixed, _)) => self.fixed_op("Reshape", &[fixed], range.input, &[1, 1, rows, k])?,
                None => self.quantize(x4.expect("an fp16 input"), range.input)?,
            };
            let lm_head = out == g.logits;
            let w = if lm_head { self.conv_weight(weight, np, k, 8)? } else { self.lpbq_weight(weight, np, k, block)? };
            let encoding = u16_params(range.output);
            let name = self.fresh("conv2d");
            let yq = self.b.op("Conv2d", &[xq, w], params(), Output::new(&name, DATATYPE_UFIXED_POINT_16, &[1, 1, rows, np], Out::Native).quantized(encoding)).map_err(qnn_err)?;
            let yq = self.unpad(yq, rows, n, Some(range.output))?;
            // A product read only by a SwiGLU stays fixed point (see `Op::SwiGlu`).
            let gated = leaves_as.is_none() && g.ops.iter().filter(|o| o.inputs().contains(&out)).all(|o| matches!(o, Op::SwiGlu { .. }));
            match leaves_as {
                Some(Role::Logits) => {
                    let name = role_name(Role::Logits);
                    self.b.op("Reshape", &[yq], vec![], Output::new(&name, DATATYPE_UFIXED_POINT_16, &[rows, n], Out::AppRead).quantized(encoding)).map_err(qnn_err)?
                }
                None if gated => {
                    let y = self.fixed_op("Reshape", &[yq], range.output, &[rows, n])?;
                    self.fixed.insert(out, (y, range.output));
                    return Ok(());
                }
                _ => {
                    let y4 = self.op("Dequantize", &[yq], vec![], &[1, 1, rows, n])?;
                    self.result(leaves_as, "Reshape", &[y4], vec![], &[rows, n])?
                }
            }
        } else {
            let bits = match self.src.format {
                NpuWeights::Int8PerChannel => 8,
                NpuWeights::Int4PerChannel => 4,
                _ => 16,
            };
            let w = self.conv_weight(weight, np, k, bits)?;
            let x4 = x4.ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: a fixed-point input to {} weights", g.name, self.src.format.name())))?;
            let y4 = self.op("Conv2d", &[x4, w], params(), &[1, 1, rows, np])?;
            let y4 = self.unpad(y4, rows, n, None)?;
            self.result(leaves_as, "Reshape", &[y4], vec![], &[rows, n])?
        };
        self.values.insert(out, t);
        Ok(())
    }

    /// Rotary embedding of the first `rotated` heads of `x`, in place, at the rows' angles
    /// the host gathered (`Role::Cos`, `Role::Sin`).
    fn rope(&mut self, x: ValueId, rotated: u32, leaves_as: Option<Role>) -> Result<()> {
        let xs = self.value(x)?;
        let (cos, sin) = (self.input(Role::Cos), self.input(Role::Sin));
        let t = qnn_ops::rope(self, xs, self.g.rows, rotated, self.src.h.model.head_dim, cos, sin, leaves_as.map(role_name).as_deref())?;
        self.values.insert(x, t);
        Ok(())
    }

    /// Layer `layer`'s attention of the queries in `qkv` over the cached keys and values and
    /// the new ones (which leave the executable for the cache), into `out`: `shape`'s heads,
    /// kv heads, head width and score scale; masked by `Role::Mask` (the model's heads), or
    /// for a windowed attention by the `Role::WindowMask` of its window, broadcast over the
    /// query heads.
    fn attention(&mut self, qkv: ValueId, out: ValueId, layer: u32, shape: (u32, u32, u32, f32), window: Option<u32>, leaves_as: Option<Role>) -> Result<()> {
        let (r, c, cl) = (self.g.rows, self.src.h.plan.kv_capacity, self.cache_len);
        let (heads, kvh, hd, scale) = shape;
        let group = heads / kvh;
        let x = self.value(qkv)?;
        let q = self.columns(x, r, 0, heads * hd)?;
        let q = self.reshape(q, &[r, heads, hd])?;
        let q = self.transpose(q, &[1, 0, 2])?;
        let q = self.reshape(q, &[kvh, group * r, hd])?;
        let mut new = Vec::new();
        for (i, role) in [Role::KNew(layer), Role::VNew(layer)].into_iter().enumerate() {
            let from = (heads + i as u32 * kvh) * hd;
            let t = self.columns(x, r, from, from + kvh * hd)?;
            let t = self.reshape(t, &[r, kvh, hd])?;
            let t = self.output("Transpose", &[t], vec![ParamSpec::U32s("perm", vec![1, 0, 2])], &role_name(role), &[kvh, r, hd])?;
            self.outputs.push((role, t));
            new.push(t);
        }
        // The cache's first `cache_len` positions (the planes are bound whole; QNN's
        // model reads only what the slice takes).
        let cached = |l: &mut Lowering, t: TensorRef| -> Result<TensorRef> {
            if cl == c {
                return Ok(t);
            }
            let ranges = vec![0, kvh as i32, 1, 0, cl as i32, 1, 0, hd as i32, 1];
            l.op("StridedSlice", &[t], vec![ParamSpec::I32s("ranges", vec![3, 3], ranges)], &[kvh, cl, hd])
        };
        let (k_plane, v_plane) = (self.input(Role::KCache(layer)), self.input(Role::VCache(layer)));
        let (k_cache, v_cache) = (cached(self, k_plane)?, cached(self, v_plane)?);
        let keys = self.op("Concat", &[k_cache, new[0]], vec![ParamSpec::U32("axis", 1)], &[kvh, cl + r, hd])?;
        let values = self.op("Concat", &[v_cache, new[1]], vec![ParamSpec::U32("axis", 1)], &[kvh, cl + r, hd])?;
        let params = vec![ParamSpec::Bool("transpose_in0", false), ParamSpec::Bool("transpose_in1", true)];
        let scores = self.op("MatMul", &[q, keys], params, &[kvh, group * r, cl + r])?;
        let scores = match window {
            None => {
                let mask = self.input(Role::Mask);
                self.binary("ElementWiseAdd", scores, mask)?
            }
            Some(w) => {
                // One mask row per query row, the same for every head of the group.
                let mask = self.input(Role::WindowMask(w));
                let scores = self.reshape(scores, &[kvh, group, r, cl + r])?;
                let scores = self.binary("ElementWiseAdd", scores, mask)?;
                self.reshape(scores, &[kvh, group * r, cl + r])?
            }
        };
        // The score scale as the softmax's own (no multiply on the vector unit; the masked
        // scores stay far below the rest).
        let p = self.op("Softmax", &[scores], vec![ParamSpec::U32("axis", 2), ParamSpec::F32("beta", scale)], &[kvh, group * r, cl + r])?;
        let params = vec![ParamSpec::Bool("transpose_in0", false), ParamSpec::Bool("transpose_in1", false)];
        let o = self.op("MatMul", &[p, values], params, &[kvh, group * r, hd])?;
        let o = self.reshape(o, &[heads, r, hd])?;
        let o = self.transpose(o, &[1, 0, 2])?;
        let t = self.result(leaves_as, "Reshape", &[o], vec![], &[r, heads * hd])?;
        self.values.insert(out, t);
        Ok(())
    }

    /// A SwiGLU whose gate and up rows stay 16-bit fixed point from the product before to the
    /// one after: no conversion of the widest activations (QNN's model put the fp16 round
    /// trip at a third of a 64-row pass). The encodings follow from the calibrated ranges: the
    /// sigmoid's [0, 1], SiLU's over the gate's range, the next product's input range for the
    /// result.
    fn fixed_swiglu(&mut self, x: ValueId, out: ValueId) -> Result<()> {
        let (g, r) = (self.g, self.g.rows);
        let (xs, range) = self.fixed[&x];
        let hidden = g.values[out as usize].cols;
        let next = g.ops.iter().find_map(|o| match *o {
            Op::MatMul { x: input, weight, .. } if input == out => self.src.ranges.get(&weight).map(|r| r.input),
            _ => None,
        });
        let next = next.ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: SwiGLU '{}' feeds no calibrated product", g.name, g.values[out as usize].name)))?;
        let gate = self.fixed_columns(xs, range, r, 0, hidden)?;
        let up = self.fixed_columns(xs, range, r, hidden, 2 * hidden)?;
        let s = self.fixed_op("Sigmoid", &[gate], [0.0, 1.0], &[r, hidden])?;
        let silu = self.fixed_op("ElementWiseMultiply", &[gate, s], silu_range(range), &[r, hidden])?;
        let t = self.fixed_op("ElementWiseMultiply", &[silu, up], next, &[r, hidden])?;
        self.fixed.insert(out, (t, next));
        Ok(())
    }

    /// The heads `normed` (of `head_dim`) of `x` RMS-normed over each head, in place, times
    /// `weight` (or by nothing without one).
    fn norm_heads(&mut self, x: ValueId, normed: std::ops::Range<u32>, head_dim: u32, weight: Option<TensorId>, eps: f32, leaves_as: Option<Role>) -> Result<()> {
        let xs = self.value(x)?;
        let gamma = match weight {
            Some(w) => self.weight(w, &[head_dim])?,
            None => self.constant(&[head_dim], &vec![1.0; head_dim as usize])?,
        };
        let t = qnn_ops::norm_heads(self, xs, self.g.rows, normed, head_dim, gamma, eps, leaves_as.map(role_name).as_deref())?;
        self.values.insert(x, t);
        Ok(())
    }
}

impl qnn_ops::Emit for Lowering<'_, '_> {
    fn emit(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32], output: Option<&str>) -> Result<TensorRef> {
        match output {
            Some(name) => self.output(ty, inputs, params, name, dims),
            None => self.op(ty, inputs, params, dims),
        }
    }

    fn constant(&mut self, dims: &[u32], values: &[f32]) -> Result<TensorRef> {
        Lowering::constant(self, dims, values)
    }

    fn dims(&self, t: TensorRef) -> Vec<u32> {
        self.b.dims(t).to_vec()
    }
}

/// The numpy-broadcast shape of two operands.
fn broadcast(a: &[u32], b: &[u32]) -> Vec<u32> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
            let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
            x.max(y)
        })
        .collect()
}

/// What one executable computes: ops `ops` of planned graph `graph` (layers `layers`), its
/// attention over `cache_len` cached positions (0: it has none).
struct Piece {
    graph: u32,
    layers: [u32; 2],
    ops: std::ops::Range<usize>,
    cache_len: u32,
}

/// `piece` as one QNN graph in `ctx`, finalized (recording into `profile` where given).
fn lower_graph(src: &Source, piece: &Piece, ctx: &Context, profile: Option<&Profile>) -> Result<NpuGraph> {
    let Piece { graph: gi, layers, ref ops, cache_len } = *piece;
    let ops = ops.clone();
    let g = &src.h.graphs[gi as usize];
    // One executable per piece and cache length: its first op and the length in the name.
    let name = format!("g{gi}_l{}_{}_o{}_c{cache_len}_{}", layers[0], layers[1], ops.start, g.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    // Prepared at the HTP's highest optimization level, as ExecuTorch prepares its offline
    // graphs: QNN's model puts the 1B shape's layers a sixth to a quarter faster there than
    // at the library's default (BENCHMARKS.md).
    let b = GraphBuilder::with_optimization(ctx, &name, Some(3)).map_err(qnn_err)?;
    let mut l = Lowering { src, fixed: HashMap::new(), g, cache_len, b, inputs: Vec::new(), outputs: Vec::new(), values: HashMap::new(), statics: HashMap::new(), angles: HashMap::new(), next: 0 };
    let bad = |e: String| Error::Options(format!("lowering graph '{}' to QNN: {e}", g.name));
    // What crosses the executable's boundary: the residual stream (the embedding's output in
    // the first context), and around an MoE layer's host ops their input and results.
    let (input_roles, output_roles) = llada_ir::npu::piece_roles(g, ops.clone()).map_err(bad)?;
    l.bind_inputs(&input_roles)?;
    // The ops whose results leave the executable: each boundary value's last writer.
    let mut leaving: Vec<(usize, Role, ValueId)> = Vec::new();
    for &(role, value) in &output_roles {
        if let Some(v) = value {
            let op = g.ops[ops.clone()].iter().rposition(|o| o.outputs().contains(&v)).map(|i| i + ops.start).ok_or_else(|| bad(format!("ops {}..{} do not write {role:?}", ops.start, ops.end)))?;
            leaving.push((op, role, v));
        }
    }
    for (index, op) in g.ops.iter().enumerate().skip(ops.start).take(ops.len()) {
        l.lower_op(op, leaving.iter().find(|o| o.0 == index).map(|o| o.1))?;
        for &(_, role, v) in leaving.iter().filter(|o| o.0 == index) {
            let t = l.value(v)?;
            l.outputs.push((role, t));
        }
    }
    let io_in = l.io_table(&l.inputs, &input_roles)?;
    let io_out = l.io_table(&l.outputs, &output_roles)?;
    l.b.finalize_with(profile).map_err(qnn_err)?;
    Ok(NpuGraph { graph: gi, ops: [ops.start as u32, ops.end as u32], cache_len, name, inputs: io_in, outputs: io_out })
}

/// A role's tensor name in every graph.
fn role_name(role: Role) -> String {
    match role {
        Role::Hidden => "hidden".into(),
        Role::HiddenOut => "hidden_out".into(),
        Role::Cos => "rope_cos".into(),
        Role::Sin => "rope_sin".into(),
        Role::Mask => "mask".into(),
        Role::WindowMask(w) => format!("window_mask_{w}"),
        Role::LogitIndex => "logit_index".into(),
        Role::KCache(l) => format!("k_cache_{l}"),
        Role::VCache(l) => format!("v_cache_{l}"),
        Role::KNew(l) => format!("k_new_{l}"),
        Role::VNew(l) => format!("v_new_{l}"),
        Role::Logits => "logits".into(),
        Role::ExpertIn => "expert_in".into(),
        Role::SharedIn => "shared_in".into(),
        Role::RouterLogits => "router_logits".into(),
        Role::ExpertOut => "expert_out".into(),
        Role::Positions => "positions".into(),
        Role::SoftIn => "soft_in".into(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn per_channel_quantization_is_symmetric_per_row() {
        use super::per_channel;
        let (q, s) = per_channel(&[1.0, -0.5, 0.25, 0.0, 0.0, 0.0, -2.0, 2.0, 1.0], 3, 8);
        assert_eq!(s, [1.0 / 127.0, 1.0, 2.0 / 127.0]);
        assert_eq!(q, [127, -64, 32, 0, 0, 0, -127, 127, 64]);
        let (q, s) = per_channel(&[3.5, -1.0, 0.5, 0.0], 1, 4);
        assert_eq!(s, [0.5]);
        assert_eq!(q, [7, -2, 1, 0]);
    }

    /// LPBQ: values in HWIO order, a 4-bit factor per block, every value within half a step
    /// of its block's scale and none clipped; a zero row keeps a positive scale.
    #[test]
    fn lpbq_scales_each_block_by_a_four_bit_factor_of_its_channels_scale() {
        use super::lpbq;
        let (n, k, block) = (3usize, 8usize, 4usize);
        // Row 0: blocks of very different magnitude; row 1: zeros; row 2: one block only.
        let w: Vec<f32> = [[7.0, -3.5, 1.0, 0.5, 0.07, 0.01, -0.03, 0.02], [0.0; 8], [0.0, 0.0, 0.0, 0.0, -1.4, 0.7, 0.0, 0.35]].concat();
        let (q, channel, factors) = lpbq(&w, n, block);
        assert_eq!((q.len(), channel.len(), factors.len()), (n * k, n, n * k / block));
        assert_eq!(channel[0], 1.0 / 16.0, "the largest block's scale (7/7) over 16");
        assert_eq!(factors[..2], [16, 1], "a block 100x smaller gets the smallest factor");
        assert_eq!((channel[1], &factors[2..4]), (1.0, &[1u8, 1][..]));
        assert_eq!(factors[4..6], [1, 16]);
        for c in 0..n {
            for i in 0..k {
                let step = channel[c] * factors[c * (k / block) + i / block] as f32;
                let back = q[i * n + c] as f32 * step;
                assert!((back - w[c * k + i]).abs() <= step / 2.0 + 1e-6, "w[{c}][{i}] = {} came back as {back}", w[c * k + i]);
                assert!((-8..=7).contains(&q[i * n + c]));
            }
        }
        assert_eq!(q[0], 7, "w[0][0] is the largest: 7 steps of 1/16 x 16");
    }

    #[test]
    fn broadcast_follows_numpy() {
        assert_eq!(super::broadcast(&[4, 2, 16], &[4, 1, 16]), vec![4, 2, 16]);
        assert_eq!(super::broadcast(&[2, 8, 40], &[8, 40]), vec![2, 8, 40]);
        assert_eq!(super::broadcast(&[5, 3], &[1]), vec![5, 3]);
    }
}
