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
use llada_ir::npu::{ActivationRange, IoLayout, NpuContext, NpuDType, NpuEstimate, NpuGraph, NpuSection, NpuTensor, NpuWeights, Role, SECTION_VERSION, SOCS};
use llada_ir::{Graph, Header, Op, Rows, TensorId, ValueId};
use llada_qnn::abi::{QuantizeParams, DATATYPE_FLOAT_16, DATATYPE_INT_32, DATATYPE_UFIXED_POINT_16};
use llada_qnn::build::{Out, ParamSpec};
use llada_qnn::{Context, Device, GraphBuilder, Profile, QnnLibrary, TensorRef};

use crate::error::{Error, Result};

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
    QnnLibrary::open(dir).map_err(|e| match e {
        llada_qnn::Error::Missing(m) => Error::Options(format!("--target {target} builds NPU executables, which needs Qualcomm's QNN library: {m}; or add --host-only to build the host stand-in without it")),
        other => qnn_err(other),
    })
}

fn qnn_err(e: llada_qnn::Error) -> Error {
    match e {
        llada_qnn::Error::Missing(m) => Error::Options(format!("--target with an NPU: {m}")),
        other => Error::Options(format!("lowering to QNN: {other}")),
    }
}

/// How the executables are built, besides the SoC and the weight format.
#[derive(Debug, Clone, Copy, Default)]
pub struct NpuOptions {
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

/// Lowers every graph of `h` for `soc` as `opts` says. `weights` gives a tensor's values as
/// f32.
/// `calibration`: the activation ranges, which a format with 16-bit activations needs.
pub fn lower(h: &Header, weights: &dyn Fn(TensorId) -> Result<Vec<f32>>, format: NpuWeights, calibration: &Calibration, soc: (&str, u32), lib: &Arc<QnnLibrary>, opts: &NpuOptions) -> Result<Lowered> {
    let NpuOptions { contexts, shared_weights, estimate_soc } = *opts;
    let fixed_point = matches!(format, NpuWeights::Int4Lpbq { .. });
    if fixed_point == calibration.ranges.is_empty() {
        return Err(Error::Options(format!("lowering to QNN: {} weights with {} activation ranges", format.name(), calibration.ranges.len())));
    }
    let ranges: HashMap<TensorId, ActivationRange> = calibration.ranges.iter().map(|r| (r.weight, *r)).collect();
    let start = std::time::Instant::now();
    let io = IoLayout::of(h);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    let split = split_contexts(h, format, shared_weights, contexts).map_err(|e| Error::Options(format!("--target {}: {e}", soc.0)))?;
    let (budget, groups, bounds, n) = (split.budget, split.layers, split.bounds, h.model.n_layers);
    let backend = lib.backend().map_err(qnn_err)?;
    let device = Device::new(&backend, soc.1).map_err(qnn_err)?;
    let estimating = estimate_soc.map(|id| Device::new(&backend, id).map_err(qnn_err)).transpose()?;
    let mut estimates = Vec::new();
    let mut built = Vec::new();
    let mut binaries = Vec::new();
    for (ci, layers) in groups.into_iter().enumerate() {
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
        let weights: &dyn Fn(TensorId) -> Result<Vec<f32>> = &cached;
        let mut graphs = Vec::new();
        for (gi, b) in bounds.iter().enumerate() {
            // A mixture-of-experts layer cuts its graph: the router and routed experts run on
            // the host between the executables (`npu::pieces`).
            let ops = layer_ops(&h.graphs[gi], b, layers, n);
            let mut estimate = (0u64, 0u64);
            for piece in llada_ir::npu::pieces(&h.graphs[gi], ops) {
                graphs.push(lower_graph(h, gi as u32, &ctx, weights, format, &ranges, layers, piece.clone(), &io, None)?);
                if let Some(dev) = &estimating {
                    // The same executable for the modelled SoC, in a context of its own (dropped).
                    let scratch = Context::create(dev, false).map_err(qnn_err)?;
                    let profile = Profile::new(dev).map_err(qnn_err)?;
                    lower_graph(h, gi as u32, &scratch, weights, format, &ranges, layers, piece, &io, Some(&profile))?;
                    let e = Profile::estimate(&profile.events().map_err(qnn_err)?).ok_or_else(|| {
                        Error::Options(format!(
                            "--npu-estimate-soc {}: this QNN library has no performance model for that SoC id (it has one for 52, 62, 63, 72, 77, 95 and 114: QNN.md)",
                            dev.soc
                        ))
                    })?;
                    estimate = (estimate.0 + e.cycles, estimate.1 + e.micros);
                }
            }
            if let Some(dev) = &estimating {
                // The executables of a graph's pieces, summed (the host's experts between
                // them are not the NPU's time).
                estimates.push(NpuEstimate { graph: gi as u32, layers, soc_id: dev.soc, cycles: estimate.0, micros: estimate.1 });
            }
        }
        let binary = ctx.binary().map_err(qnn_err)?;
        if binary.len() as u64 > budget {
            return Err(Error::Options(format!(
                "--target {}: NPU context {ci} (layers {}..{}) is {}, more than the {} the window leaves for contexts; ask for more contexts (--npu-contexts), a larger --window-bytes, or smaller weights (--quant q4)",
                soc.0,
                layers[0],
                layers[1],
                mib(binary.len() as u64),
                mib(budget)
            )));
        }
        built.push(NpuContext { segment: u32::MAX, crc32: crc32fast::hash(&binary), layers, resident: false, graphs });
        binaries.push(binary);
    }
    let sizes: Vec<u64> = binaries.iter().map(|b| b.len() as u64).collect();
    for (c, resident) in built.iter_mut().zip(resident_prefix(&sizes, budget)) {
        c.resident = resident;
    }
    let section = NpuSection { version: SECTION_VERSION, soc: soc.0.to_string(), soc_id: soc.1, qnn_build: lib.build_id.clone(), weights: format, shared_weights, context_budget: budget, io, estimates, contexts: built, activations: calibration.ranges.clone(), calibration: calibration.source.clone() };
    drop(estimating);
    drop(device);
    drop(backend);
    Ok(Lowered { section, binaries, seconds: start.elapsed().as_secs_f64() })
}

/// How a plan's layers split into NPU contexts, before any is built.
pub struct ContextSplit {
    /// Bytes of the window the contexts may occupy at once.
    pub budget: u64,
    /// Each context's layers.
    pub layers: Vec<[u32; 2]>,
    /// Each context's binary bytes as predicted (its weights and the room the split leaves
    /// for the rest of a binary).
    pub bytes: Vec<u64>,
    /// Where each layer's ops start, per planned graph.
    pub bounds: Vec<Vec<usize>>,
}

impl ContextSplit {
    /// Which contexts stay resident (the rest rotate through the budget).
    pub fn resident(&self) -> Vec<bool> {
        resident_prefix(&self.bytes, self.budget)
    }
}

/// The split `lower` builds: `contexts` of them, or the fewest whose weights fit the window
/// less the I/O allocation and [`BUILD_BYTES`] of build memory; also what `lladac inspect
/// --estimate` predicts from for an artifact built without its NPU executables.
pub fn split_contexts(h: &Header, format: NpuWeights, shared_weights: bool, contexts: Option<u32>) -> std::result::Result<ContextSplit, String> {
    let w = &h.plan.window;
    let io = IoLayout::of(h);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    // A mixture-of-experts model's expert slots stay in the window beside the contexts (the
    // host's routed experts are staged there).
    let budget = w.bytes.checked_sub(io.bytes + w.experts.region.bytes).filter(|&b| b > 0).ok_or_else(|| {
        format!(
            "the {} window leaves no room for the NPU's contexts after the KV cache ({}), a pass's inputs and outputs ({} in all) and the expert slots ({}); lower --max-seq or raise --window-bytes",
            mib(w.bytes),
            mib(w.kv.bytes),
            mib(io.bytes),
            mib(w.experts.region.bytes)
        )
    })?;
    let LayerBytes { bounds, layer_bytes, build_bytes } = layer_weight_bytes(h, format, shared_weights)?;
    let layers = split_layers(&layer_bytes, &build_bytes, budget, contexts)?;
    let bytes = layers.iter().map(|g| context_bytes(&layer_bytes, g)).collect();
    Ok(ContextSplit { budget, layers, bytes, bounds })
}

/// Each layer's weight bytes in the executables, the head counted with the last layer: what
/// a context holds (once where the row buckets share them, else once per graph), and what
/// preparing it holds (every bucket's own copy, int4 unpacked); and each graph's layer bounds.
struct LayerBytes {
    bounds: Vec<Vec<usize>>,
    layer_bytes: Vec<u64>,
    build_bytes: Vec<u64>,
}

fn layer_weight_bytes(h: &Header, format: NpuWeights, shared_weights: bool) -> std::result::Result<LayerBytes, String> {
    let bounds: Vec<Vec<usize>> = h.graphs.iter().map(|g| layer_bounds(h, g)).collect::<Result<_>>().map_err(|e| e.to_string())?;
    let n = h.model.n_layers;
    let per_graph: Vec<Vec<u64>> = (0..n).map(|l| h.graphs.iter().zip(&bounds).map(|(g, b)| weight_bytes(h, g, format, layer_ops(g, b, [l, l + 1], n))).collect()).collect();
    let layer_bytes = per_graph.iter().map(|v| if shared_weights { v.iter().copied().max().unwrap_or(0) } else { v.iter().sum() }).collect();
    let unpacked = if matches!(format, NpuWeights::Int4PerChannel | NpuWeights::Int4Lpbq { .. }) { 2 } else { 1 };
    let build_bytes = per_graph.iter().map(|v| v.iter().sum::<u64>() * unpacked).collect();
    Ok(LayerBytes { bounds, layer_bytes, build_bytes })
}

/// The window room the executables need, as [`split_contexts`] predicts binaries: what a
/// mixture-of-experts model's expert slots leave them.
#[derive(Debug, Clone, Copy)]
pub struct ExecutablesRoom {
    /// Every context resident at once (split by `--npu-contexts`, or where preparing one
    /// context would hold more than [`BUILD_BYTES`]).
    pub all: u64,
    /// The least that runs: two one-layer contexts of the largest layer, one created while
    /// the other runs.
    pub rotating: u64,
}

pub fn executables_room(h: &Header, format: NpuWeights, shared_weights: bool, contexts: Option<u32>) -> std::result::Result<ExecutablesRoom, String> {
    let LayerBytes { layer_bytes, build_bytes, .. } = layer_weight_bytes(h, format, shared_weights)?;
    let groups = split_layers(&layer_bytes, &build_bytes, u64::MAX, contexts)?;
    let all = groups.iter().map(|g| context_bytes(&layer_bytes, g)).sum();
    let rotating = 2 * binary_bytes(layer_bytes.iter().copied().max().unwrap_or(0));
    Ok(ExecutablesRoom { all, rotating })
}

/// The predicted binary bytes of the context of layers `g`.
fn context_bytes(layer_bytes: &[u64], g: &[u32; 2]) -> u64 {
    binary_bytes(layer_bytes[g[0] as usize..g[1] as usize].iter().sum())
}

/// Where each layer's ops start in `g`: layer 0 right after the embedding, layer l after the
/// last residual addition before its attention. Only the residual stream crosses these
/// boundaries (the lowering refuses any other value read there).
fn layer_bounds(h: &Header, g: &Graph) -> Result<Vec<usize>> {
    let bad = |what: String| Error::Options(format!("lowering graph '{}' to QNN: {what}", g.name));
    let Some(Op::Embed { out: residual, .. }) = g.ops.first() else {
        return Err(bad("it does not start with the embedding".into()));
    };
    let after_last_add = |before: usize| g.ops[..before].iter().rposition(|o| matches!(o, Op::Add { acc, .. } if acc == residual)).map(|i| i + 1);
    let mut bounds = vec![1];
    for l in 1..h.model.n_layers {
        let attention = g.ops.iter().position(|o| matches!(o, Op::Attention { layer, .. } if *layer == l)).ok_or_else(|| bad(format!("no attention for layer {l}")))?;
        match after_last_add(attention) {
            Some(b) if b > *bounds.last().unwrap() => bounds.push(b),
            _ => return Err(bad(format!("no residual addition between layers {} and {l}", l - 1))),
        }
    }
    Ok(bounds)
}

/// What QNN may hold in memory while it prepares one context: every row bucket's copy of the
/// context's weights (int4 in its int8 container), before weight sharing deduplicates them at
/// serialization. The 8B q4 at 1024 positions in three contexts reached 23.6 GB and was
/// killed on a 24 GB machine; the automatic split keeps each context's build under this.
pub const BUILD_BYTES: u64 = 4 << 30;

/// The ops of layers `layers[0]..layers[1]` of `g` (`bounds` from [`layer_bounds`]), the head
/// with the last layer.
fn layer_ops(g: &Graph, bounds: &[usize], layers: [u32; 2], n_layers: u32) -> std::ops::Range<usize> {
    bounds[layers[0] as usize]..if layers[1] == n_layers { g.ops.len() } else { bounds[layers[1] as usize] }
}

/// Layers grouped into contexts: `count` of them balanced by bytes, or (no count) the fewest
/// that keep each within `budget` (by `layer_bytes`, what the binary holds) and within
/// [`BUILD_BYTES`] (by `build_bytes`, what preparing it holds).
fn split_layers(layer_bytes: &[u64], build_bytes: &[u64], budget: u64, count: Option<u32>) -> std::result::Result<Vec<[u32; 2]>, String> {
    let n = layer_bytes.len() as u32;
    let total: u64 = layer_bytes.iter().sum();
    let sum = |v: &[u64], g: &[u32; 2]| v[g[0] as usize..g[1] as usize].iter().sum::<u64>();
    let fits = |g: &[u32; 2]| binary_bytes(sum(layer_bytes, g)) <= budget && (sum(build_bytes, g) <= BUILD_BYTES || g[1] - g[0] == 1);
    let groups_of = |count: u32| -> Vec<[u32; 2]> {
        // `count` groups, each closing once it reaches its share of the bytes.
        let mut groups = Vec::new();
        let (mut first, mut acc) = (0u32, 0u64);
        for (l, &b) in layer_bytes.iter().enumerate() {
            acc += b;
            let left_groups = count - groups.len() as u32 - 1;
            let left_layers = n - l as u32 - 1;
            let share = total * (groups.len() as u64 + 1) / count as u64;
            if left_groups > 0 && (acc >= share || left_layers == left_groups) {
                groups.push([first, l as u32 + 1]);
                first = l as u32 + 1;
            }
        }
        groups.push([first, n]);
        groups
    };
    match count {
        Some(c) if c == 0 || c > n => Err(format!("--npu-contexts {c}: the model has {n} layers, so 1 to {n} contexts")),
        Some(c) => Ok(groups_of(c)),
        None => {
            if let Some(l) = (0..n).find(|&l| !fits(&[l, l + 1])) {
                return Err(format!(
                    "layer {l} alone ({} bytes of weights over all graphs) does not fit the {budget} bytes the window leaves for NPU contexts; raise --window-bytes, lower --max-seq, or use smaller weights (--quant q4)",
                    layer_bytes[l as usize]
                ));
            }
            // The fewest contexts (greedy in layer order is optimal for contiguous groups),
            // balanced by bytes where that still fits.
            let mut greedy = vec![[0, 1]];
            for l in 1..n {
                let last = greedy.last_mut().unwrap();
                if fits(&[last[0], l + 1]) {
                    last[1] = l + 1;
                } else {
                    greedy.push([l, l + 1]);
                }
            }
            let balanced = groups_of(greedy.len() as u32);
            Ok(if balanced.iter().all(fits) { balanced } else { greedy })
        }
    }
}

/// A context binary's size for `weights` bytes of weights, at most: a binary is a little more
/// than its weights (graphs, I/O descriptions), so the split leaves room for that.
fn binary_bytes(weights: u64) -> u64 {
    weights + weights / 16 + (1 << 20)
}

/// Which contexts stay resident: all of them when everything fits; else the longest prefix
/// that leaves room, within `budget`, for the two largest of the others (the runtime creates
/// the next while one runs: the schedule's double buffering, so creation does not stall the
/// NPU); where no prefix leaves that, the longest that leaves room for the largest (created
/// one at a time, before its layers).
fn resident_prefix(sizes: &[u64], budget: u64) -> Vec<bool> {
    let room = |k: usize, buffers: usize| {
        let mut rest = sizes[k..].to_vec();
        rest.sort_unstable_by(|a, b| b.cmp(a));
        sizes[..k].iter().sum::<u64>() + rest.iter().take(buffers).sum::<u64>() <= budget
    };
    let longest = |buffers: usize| (0..=sizes.len()).rev().find(|&k| room(k, buffers));
    let k = longest(2).or_else(|| longest(1)).unwrap_or(0);
    (0..sizes.len()).map(|i| i < k).collect()
}

/// Bytes of the weights the ops `ops` of a graph read, as the executables hold them (int4
/// packed).
fn weight_bytes(h: &Header, g: &Graph, format: NpuWeights, ops: std::ops::Range<usize>) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let matmul: std::collections::HashSet<TensorId> = g.ops.iter().filter_map(|o| if let Op::MatMul { weight, .. } = *o { Some(weight) } else { None }).collect();
    let bytes = |t: TensorId| {
        let n = h.tensors[t as usize].numel();
        match (matmul.contains(&t), format) {
            (true, NpuWeights::Int8PerChannel) => n,
            (true, NpuWeights::Int4PerChannel) => n.div_ceil(2),
            // Packed int4 and a byte of block scale per block (the smallest block, 32, bounds it).
            (true, NpuWeights::Int4Lpbq { block }) => n.div_ceil(2) + n / block as u64,
            _ => 2 * n,
        }
    };
    // The embedding and the MoE host ops' tensors (router bias, routed experts) stay outside.
    g.ops[ops].iter().filter(|o| !matches!(o, Op::Embed { .. }) && !llada_ir::npu::host_op(o)).flat_map(|o| o.tensors()).filter(|t| seen.insert(*t)).map(bytes).sum()
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

fn f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

/// One planned graph as a QNN graph.
struct Lowering<'a, 'c> {
    h: &'a Header,
    g: &'a Graph,
    b: GraphBuilder<'c>,
    values: HashMap<ValueId, TensorRef>,
    statics: HashMap<TensorId, TensorRef>,
    next: usize,
    format: NpuWeights,
    ranges: &'a HashMap<TensorId, ActivationRange>,
}

impl Lowering<'_, '_> {
    fn fresh(&mut self, what: &str) -> String {
        self.next += 1;
        format!("{what}.{}", self.next)
    }

    fn rows(&self, v: ValueId) -> u32 {
        match self.g.values[v as usize].rows {
            Rows::Tokens => self.g.rows,
            Rows::Head => self.g.head_rows,
        }
    }

    fn value(&self, v: ValueId) -> Result<TensorRef> {
        self.values.get(&v).copied().ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: value '{}' is read before it is written", self.g.name, self.g.values[v as usize].name)))
    }

    fn weight(&mut self, t: TensorId, dims: &[u32], weights: &dyn Fn(TensorId) -> Result<Vec<f32>>) -> Result<TensorRef> {
        if let Some(&r) = self.statics.get(&t) {
            return Ok(r);
        }
        let values = weights(t)?;
        let name = format!("w.{}", self.h.tensors[t as usize].name);
        let r = self.b.static_f16(&name, dims, &f16_bits(&values)).map_err(qnn_err)?;
        self.statics.insert(t, r);
        Ok(r)
    }

    /// A matmul's `[n, k]` weight in the section's format.
    fn matmul_weight(&mut self, t: TensorId, n: u32, k: u32, weights: &dyn Fn(TensorId) -> Result<Vec<f32>>) -> Result<TensorRef> {
        let bits = match self.format {
            NpuWeights::F16 => return self.weight(t, &[n, k], weights),
            NpuWeights::Int8PerChannel => 8,
            NpuWeights::Int4PerChannel => 4,
            NpuWeights::Int4Lpbq { .. } => unreachable!("LPBQ weights are convolution weights (lpbq_weight)"),
        };
        if let Some(&r) = self.statics.get(&t) {
            return Ok(r);
        }
        let (q, scales) = per_channel(&weights(t)?, n as usize, bits);
        let name = format!("w.{}", self.h.tensors[t as usize].name);
        let r = self.b.static_per_channel(&name, &[n, k], q, scales, bits).map_err(qnn_err)?;
        self.statics.insert(t, r);
        Ok(r)
    }

    /// A matmul's `[n, k]` weight as an LPBQ 1x1-convolution weight.
    fn lpbq_weight(&mut self, t: TensorId, n: u32, k: u32, block: u32, weights: &dyn Fn(TensorId) -> Result<Vec<f32>>) -> Result<TensorRef> {
        if let Some(&r) = self.statics.get(&t) {
            return Ok(r);
        }
        let name = format!("w.{}", self.h.tensors[t as usize].name);
        if k % block != 0 {
            return Err(Error::Options(format!("lowering '{name}' to QNN: its {k} inputs are not whole blocks of {block} (--group)")));
        }
        let (q, channel, factors) = lpbq(&weights(t)?, n as usize, block as usize);
        let r = self.b.static_lpbq(&name, k, n, q, channel, factors).map_err(qnn_err)?;
        self.statics.insert(t, r);
        Ok(r)
    }

    /// `x` as 16-bit fixed point covering `range`.
    fn quantize(&mut self, x: TensorRef, range: [f32; 2]) -> Result<TensorRef> {
        let (scale, offset) = ActivationRange::u16_encoding(range);
        let name = self.fresh("quantize");
        let dims = self.b.dims(x).to_vec();
        self.b.op_quantized("Quantize", &[x], vec![], &name, DATATYPE_UFIXED_POINT_16, &dims, Out::Native, QuantizeParams::scale_offset(scale, offset)).map_err(qnn_err)
    }

    fn constant(&mut self, dims: &[u32], v: &[f32]) -> Result<TensorRef> {
        let name = self.fresh("const");
        self.b.static_f16(&name, dims, &f16_bits(v)).map_err(qnn_err)
    }

    fn op(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32]) -> Result<TensorRef> {
        let name = self.fresh(&ty.to_lowercase());
        self.b.op(ty, inputs, params, &name, DATATYPE_FLOAT_16, dims, Out::Native).map_err(qnn_err)
    }

    fn output(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, name: &str, dims: &[u32]) -> Result<TensorRef> {
        self.b.op(ty, inputs, params, name, DATATYPE_FLOAT_16, dims, Out::AppRead).map_err(qnn_err)
    }

    /// Columns `from..to` of every row of a `[rows, cols]` tensor.
    fn columns(&mut self, x: TensorRef, rows: u32, from: u32, to: u32) -> Result<TensorRef> {
        let ranges = vec![0, rows as i32, 1, from as i32, to as i32, 1];
        self.op("StridedSlice", &[x], vec![ParamSpec::I32s("ranges", vec![2, 3], ranges)], &[rows, to - from])
    }

    fn reshape(&mut self, x: TensorRef, dims: &[u32]) -> Result<TensorRef> {
        self.op("Reshape", &[x], vec![], dims)
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

/// Layers `layers` of planned graph `gi` (its ops `ops`) as one QNN graph in `ctx`.
#[allow(clippy::too_many_arguments)]
fn lower_graph(
    h: &Header,
    gi: u32,
    ctx: &Context,
    weights: &dyn Fn(TensorId) -> Result<Vec<f32>>,
    format: NpuWeights,
    ranges: &HashMap<TensorId, ActivationRange>,
    layers: [u32; 2],
    ops: std::ops::Range<usize>,
    io: &IoLayout,
    profile: Option<&Profile>,
) -> Result<NpuGraph> {
    let g = &h.graphs[gi as usize];
    let m = &h.model;
    // One executable per piece: its first op in the name.
    let name = format!("g{gi}_l{}_{}_o{}_{}", layers[0], layers[1], ops.start, g.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let b = GraphBuilder::new(ctx, &name).map_err(qnn_err)?;
    let mut l = Lowering { h, g, b, values: HashMap::new(), statics: HashMap::new(), next: 0, format, ranges };
    let (r, hr, c, hd) = (g.rows, g.head_rows, h.plan.kv_capacity, m.head_dim);
    let (heads, kvh) = (m.n_heads, m.n_kv_heads);
    let group = heads / kvh;
    let bad = |e: String| Error::Options(format!("lowering graph '{}' to QNN: {e}", g.name));
    // What crosses the executable's boundary: the residual stream (the embedding's output in
    // the first context), and around an MoE layer's host ops their input and results.
    let (input_roles, output_roles) = llada_ir::npu::piece_roles(g, ops.clone()).map_err(bad)?;
    let mut inputs: Vec<(Role, TensorRef)> = Vec::new();
    for &(role, value) in &input_roles {
        let dtype = if role.dtype() == NpuDType::I32 { DATATYPE_INT_32 } else { DATATYPE_FLOAT_16 };
        let t = l.b.input(&role_name(role), dtype, &role.dims(h, r, hr)).map_err(qnn_err)?;
        inputs.push((role, t));
        if let Some(v) = value {
            l.values.insert(v, t);
        }
    }
    let input = |role: Role| inputs.iter().find(|(r, _)| *r == role).map(|(_, t)| *t).expect("every role the ops read is an input of this context");
    let mut outputs: Vec<(Role, TensorRef)> = Vec::new();
    // The ops whose results leave the executable: each boundary value's last writer.
    let mut leaving: Vec<(usize, Role, ValueId)> = Vec::new();
    for &(role, value) in &output_roles {
        if let Some(v) = value {
            let op = g.ops[ops.clone()].iter().rposition(|o| o.outputs().contains(&v)).map(|i| i + ops.start).ok_or_else(|| bad(format!("ops {}..{} do not write {role:?}", ops.start, ops.end)))?;
            leaving.push((op, role, v));
        }
    }
    for (index, op) in g.ops.iter().enumerate().skip(ops.start).take(ops.len()) {
        let out_role = leaving.iter().find(|o| o.0 == index).map(|o| o.1);
        let result = |l: &mut Lowering, ty: &str, ins: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32]| -> Result<TensorRef> {
            match out_role {
                Some(role) => l.output(ty, ins, params, &role_name(role), dims),
                None => l.op(ty, ins, params, dims),
            }
        };
        match *op {
            Op::Embed { .. } => return Err(Error::Options(format!("lowering graph '{}' to QNN: a second embedding", g.name))),
            Op::Scale { x, factor } => {
                let xs = l.value(x)?;
                let f = l.constant(&[1], &[factor])?;
                let dims = l.b.dims(xs).to_vec();
                let t = result(&mut l, "ElementWiseMultiply", &[xs, f], vec![], &dims)?;
                l.values.insert(x, t);
            }
            Op::Bias { x, bias } => {
                let xs = l.value(x)?;
                let cols = g.values[x as usize].cols;
                let bt = l.weight(bias, &[cols], weights)?;
                let dims = l.b.dims(xs).to_vec();
                let t = result(&mut l, "ElementWiseAdd", &[xs, bt], vec![], &dims)?;
                l.values.insert(x, t);
            }
            Op::RmsNorm { x, weight, eps, out } => {
                let xs = l.value(x)?;
                let cols = g.values[x as usize].cols;
                let gamma = l.weight(weight, &[cols], weights)?;
                let beta = l.constant(&[cols], &vec![0.0; cols as usize])?;
                let params = vec![ParamSpec::F32("epsilon", eps), ParamSpec::U32s("axes", vec![1])];
                let rows = l.rows(x);
                let t = result(&mut l, "RmsNorm", &[xs, gamma, beta], params, &[rows, cols])?;
                l.values.insert(out, t);
            }
            Op::MatMul { x, weight, out } => {
                let xs = l.value(x)?;
                let shape = &h.tensors[weight as usize].shape;
                let (n, k) = (shape[0] as u32, shape[1] as u32);
                let rows = l.rows(x);
                let t = if let NpuWeights::Int4Lpbq { block } = format {
                    // QNN.md: LPBQ runs as a 1x1 Conv2d between 16-bit activations (on
                    // FullyConnected it is unreliable); the graph around it stays fp16.
                    let range = *l.ranges.get(&weight).ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: matmul weight '{}' has no calibrated range", g.name, h.tensors[weight as usize].name)))?;
                    let x4 = l.reshape(xs, &[1, 1, rows, k])?;
                    let xq = l.quantize(x4, range.input)?;
                    let w = l.lpbq_weight(weight, n, k, block, weights)?;
                    let (scale, offset) = ActivationRange::u16_encoding(range.output);
                    let name = l.fresh("conv2d");
                    let params = vec![ParamSpec::U32s("stride", vec![1, 1]), ParamSpec::U32Grid("pad_amount", vec![2, 2], vec![0; 4])];
                    let yq = l.b.op_quantized("Conv2d", &[xq, w], params, &name, DATATYPE_UFIXED_POINT_16, &[1, 1, rows, n], Out::Native, QuantizeParams::scale_offset(scale, offset)).map_err(qnn_err)?;
                    let y4 = l.op("Dequantize", &[yq], vec![], &[1, 1, rows, n])?;
                    result(&mut l, "Reshape", &[y4], vec![], &[rows, n])?
                } else {
                    let w = l.matmul_weight(weight, n, k, weights)?;
                    result(&mut l, "FullyConnected", &[xs, w], vec![], &[rows, n])?
                };
                l.values.insert(out, t);
            }
            Op::Rope { x, heads: rotated, .. } => {
                let xs = l.value(x)?;
                let width = g.values[x as usize].cols;
                let half = hd / 2;
                let span = rotated * hd;
                let part = l.columns(xs, r, 0, span)?;
                let part = l.reshape(part, &[r, rotated, hd])?;
                let slice = |l: &mut Lowering, from: u32| {
                    let ranges = vec![0, r as i32, 1, 0, rotated as i32, 1, from as i32, (from + half) as i32, 1];
                    l.op("StridedSlice", &[part], vec![ParamSpec::I32s("ranges", vec![3, 3], ranges)], &[r, rotated, half])
                };
                let (x1, x2) = (slice(&mut l, 0)?, slice(&mut l, half)?);
                let (cos, sin) = (input(Role::Cos), input(Role::Sin));
                let (a1, a2) = (l.binary("ElementWiseMultiply", x1, cos)?, l.binary("ElementWiseMultiply", x2, sin)?);
                let a = l.binary("ElementWiseSubtract", a1, a2)?;
                let (b1, b2) = (l.binary("ElementWiseMultiply", x2, cos)?, l.binary("ElementWiseMultiply", x1, sin)?);
                let bsum = l.binary("ElementWiseAdd", b1, b2)?;
                let cat = l.op("Concat", &[a, bsum], vec![ParamSpec::U32("axis", 2)], &[r, rotated, hd])?;
                let flat = l.reshape(cat, &[r, span])?;
                let t = if span < width {
                    let rest = l.columns(xs, r, span, width)?;
                    result(&mut l, "Concat", &[flat, rest], vec![ParamSpec::U32("axis", 1)], &[r, width])?
                } else {
                    flat
                };
                l.values.insert(x, t);
            }
            Op::Attention { qkv, out, heads: hq, kv_heads, layer } => {
                if hq != heads || kv_heads != kvh {
                    return Err(Error::Options(format!("lowering graph '{}' to QNN: attention with {hq}/{kv_heads} heads, the model has {heads}/{kvh}", g.name)));
                }
                let x = l.value(qkv)?;
                let q = l.columns(x, r, 0, heads * hd)?;
                // The softmax scale folded into the queries (fewer elements than the scores).
                let scale = l.constant(&[1], &[1.0 / (hd as f32).sqrt()])?;
                let q = l.binary("ElementWiseMultiply", q, scale)?;
                let q = l.reshape(q, &[r, heads, hd])?;
                let q = l.transpose(q, &[1, 0, 2])?;
                let q = l.reshape(q, &[kvh, group * r, hd])?;
                let mut new = Vec::new();
                for (i, role) in [Role::KNew(layer), Role::VNew(layer)].into_iter().enumerate() {
                    let from = (heads + i as u32 * kvh) * hd;
                    let t = l.columns(x, r, from, from + kvh * hd)?;
                    let t = l.reshape(t, &[r, kvh, hd])?;
                    let t = l.output("Transpose", &[t], vec![ParamSpec::U32s("perm", vec![1, 0, 2])], &role_name(role), &[kvh, r, hd])?;
                    outputs.push((role, t));
                    new.push(t);
                }
                let keys = l.op("Concat", &[input(Role::KCache(layer)), new[0]], vec![ParamSpec::U32("axis", 1)], &[kvh, c + r, hd])?;
                let values = l.op("Concat", &[input(Role::VCache(layer)), new[1]], vec![ParamSpec::U32("axis", 1)], &[kvh, c + r, hd])?;
                let params = vec![ParamSpec::Bool("transpose_in0", false), ParamSpec::Bool("transpose_in1", true)];
                let scores = l.op("MatMul", &[q, keys], params, &[kvh, group * r, c + r])?;
                let scores = l.binary("ElementWiseAdd", scores, input(Role::Mask))?;
                let p = l.op("Softmax", &[scores], vec![ParamSpec::U32("axis", 2), ParamSpec::F32("beta", 1.0)], &[kvh, group * r, c + r])?;
                let params = vec![ParamSpec::Bool("transpose_in0", false), ParamSpec::Bool("transpose_in1", false)];
                let o = l.op("MatMul", &[p, values], params, &[kvh, group * r, hd])?;
                let o = l.reshape(o, &[heads, r, hd])?;
                let o = l.transpose(o, &[1, 0, 2])?;
                let t = result(&mut l, "Reshape", &[o], vec![], &[r, heads * hd])?;
                l.values.insert(out, t);
            }
            Op::SwiGlu { x, out } => {
                let xs = l.value(x)?;
                let hidden = g.values[out as usize].cols;
                let gate = l.columns(xs, r, 0, hidden)?;
                let up = l.columns(xs, r, hidden, 2 * hidden)?;
                let s = l.op("Sigmoid", &[gate], vec![], &[r, hidden])?;
                let silu = l.binary("ElementWiseMultiply", gate, s)?;
                let t = result(&mut l, "ElementWiseMultiply", &[silu, up], vec![], &[r, hidden])?;
                l.values.insert(out, t);
            }
            Op::Add { acc, x } => {
                let (a, xs) = (l.value(acc)?, l.value(x)?);
                let dims = l.b.dims(a).to_vec();
                let t = result(&mut l, "ElementWiseAdd", &[a, xs], vec![], &dims)?;
                l.values.insert(acc, t);
            }
            Op::GatherHeadRows { x, out } => {
                let xs = l.value(x)?;
                let cols = g.values[x as usize].cols;
                let t = result(&mut l, "Gather", &[xs, input(Role::HeadIndex)], vec![ParamSpec::I32("axis", 0)], &[hr, cols])?;
                l.values.insert(out, t);
            }
            Op::HeadRmsNorm { x, first_head, heads: normed, weight, eps } => {
                // The heads' columns as rows of head_dim, normed over them, put back between
                // the columns before and after.
                let xs = l.value(x)?;
                let width = g.values[x as usize].cols;
                let (from, to) = (first_head * hd, (first_head + normed) * hd);
                let part = l.columns(xs, r, from, to)?;
                let part = l.reshape(part, &[r * normed, hd])?;
                let gamma = l.weight(weight, &[hd], weights)?;
                let beta = l.constant(&[hd], &vec![0.0; hd as usize])?;
                let params = vec![ParamSpec::F32("epsilon", eps), ParamSpec::U32s("axes", vec![1])];
                let part = l.op("RmsNorm", &[part, gamma, beta], params, &[r * normed, hd])?;
                let part = l.reshape(part, &[r, to - from])?;
                let mut pieces = Vec::new();
                if from > 0 {
                    pieces.push(l.columns(xs, r, 0, from)?);
                }
                pieces.push(part);
                if to < width {
                    pieces.push(l.columns(xs, r, to, width)?);
                }
                let t = if pieces.len() == 1 { part } else { result(&mut l, "Concat", &pieces, vec![ParamSpec::U32("axis", 1)], &[r, width])? };
                l.values.insert(x, t);
            }
            Op::Route { .. } | Op::RouteSigmoid { .. } | Op::MoeExperts { .. } => {
                return Err(Error::Options(format!("lowering graph '{}' to QNN: op {} has no NPU lowering", g.name, op.name())));
            }
        }
        for &(_, role, v) in leaving.iter().filter(|o| o.0 == index) {
            outputs.push((role, l.value(v)?));
        }
    }
    let table = |b: &GraphBuilder, list: &[(Role, TensorRef)], roles: &[llada_ir::npu::Bound]| -> Result<Vec<NpuTensor>> {
        roles
            .iter()
            .map(|&(role, _)| {
                let t = list.iter().find(|(r, _)| *r == role).map(|(_, t)| *t).ok_or_else(|| Error::Options(format!("lowering graph '{}' to QNN: no {role:?}", g.name)))?;
                let offset = io.offset(h, role, g.rows).expect("every role has a region");
                Ok(NpuTensor { id: b.id(t), name: role_name(role), role, dtype: role.dtype(), dims: b.dims(t).to_vec(), offset })
            })
            .collect()
    };
    let io_in = table(&l.b, &inputs, &input_roles)?;
    let io_out = table(&l.b, &outputs, &output_roles)?;
    l.b.finalize_with(profile).map_err(qnn_err)?;
    Ok(NpuGraph { graph: gi, ops: [ops.start as u32, ops.end as u32], name, inputs: io_in, outputs: io_out })
}

/// A role's tensor name in every graph.
fn role_name(role: Role) -> String {
    match role {
        Role::Hidden => "hidden".into(),
        Role::HiddenOut => "hidden_out".into(),
        Role::Cos => "rope_cos".into(),
        Role::Sin => "rope_sin".into(),
        Role::Mask => "mask".into(),
        Role::HeadIndex => "head_index".into(),
        Role::KCache(l) => format!("k_cache_{l}"),
        Role::VCache(l) => format!("v_cache_{l}"),
        Role::KNew(l) => format!("k_new_{l}"),
        Role::VNew(l) => format!("v_new_{l}"),
        Role::Logits => "logits".into(),
        Role::ExpertIn => "expert_in".into(),
        Role::SharedIn => "shared_in".into(),
        Role::RouterLogits => "router_logits".into(),
        Role::ExpertOut => "expert_out".into(),
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

    /// Residency: all when all fit; else the longest prefix leaving room for two rotating
    /// contexts (one runs while the next is created); else for one.
    #[test]
    fn resident_contexts_leave_room_to_create_the_next_while_one_runs() {
        use super::resident_prefix;
        assert_eq!(resident_prefix(&[3, 3, 3], 9), [true, true, true]);
        // 3 + (3 + 3) fits 9: one resident, two rotating with room for both.
        assert_eq!(resident_prefix(&[3, 3, 3, 3], 9), [true, false, false, false]);
        // Two resident would leave room for one rotating only: double buffering wins.
        assert_eq!(resident_prefix(&[3, 3, 3, 3], 10), [true, false, false, false]);
        // Room for one context at a time: none resident, created before their layers.
        assert_eq!(resident_prefix(&[3, 3, 3, 3], 4), [false; 4]);
        // No prefix leaves room for two (the largest are 5 and 5), one for the largest: 2 + 5.
        assert_eq!(resident_prefix(&[2, 5, 5], 8), [true, false, false]);
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

    /// The fewest contexts within the window's room, balanced where that fits; more where
    /// preparing them would hold too much; a count given is balanced by bytes.
    #[test]
    fn layers_split_into_the_fewest_contexts_that_fit_both_budgets() {
        use super::{split_layers, BUILD_BYTES};
        let mib = 1u64 << 20;
        let small = [10 * mib; 8];
        assert_eq!(split_layers(&small, &small, 1 << 30, None).unwrap(), vec![[0, 8]]);
        // Room for three layers a context: three contexts, balanced 3/3/2 by bytes.
        assert_eq!(split_layers(&small, &small, 36 * mib, None).unwrap(), vec![[0, 3], [3, 6], [6, 8]]);
        // The window holds everything, but preparing it would not: a build budget's worth each.
        let build = [BUILD_BYTES / 2; 8];
        assert_eq!(split_layers(&small, &build, 1 << 30, None).unwrap(), vec![[0, 2], [2, 4], [4, 6], [6, 8]]);
        assert_eq!(split_layers(&small, &small, 1 << 30, Some(2)).unwrap(), vec![[0, 4], [4, 8]]);
        assert!(split_layers(&small, &small, 1 << 30, Some(9)).unwrap_err().contains("--npu-contexts 9"));
        assert!(split_layers(&small, &small, 5 * mib, None).unwrap_err().contains("layer 0 alone"));
    }

    #[test]
    fn broadcast_follows_numpy() {
        assert_eq!(super::broadcast(&[4, 2, 16], &[4, 1, 16]), vec![4, 2, 16]);
        assert_eq!(super::broadcast(&[2, 8, 40], &[8, 40]), vec![2, 8, 40]);
        assert_eq!(super::broadcast(&[5, 3], &[1]), vec![5, 3]);
    }
}
