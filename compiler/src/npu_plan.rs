//! Where an NPU target's executables live on the phone: the model's layers split into contexts
//! and the contexts spread over the HTP sessions the phone grants, each within the limits of
//! QNN.md's "Residency, load cost and speed on a phone" ([`llada_ir::npu::NpuLimits`]); every
//! context resident where they fit, else the last session's contexts rotating through the room
//! it leaves them (a costed fallback). Plain data from predicted or measured sizes, so `lladac
//! inspect --estimate` predicts the same plan for an artifact built without its executables.

use llada_ir::npu::{IoLayout, NpuLimits, NpuSession, NpuWeights};
use llada_ir::{Graph, Header, Op, TensorId};

use crate::error::{Error, Result};

/// The contexts of a plan and where they live.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextPlan {
    pub limits: NpuLimits,
    /// Each context's layers.
    pub layers: Vec<[u32; 2]>,
    /// Each context's binary bytes: predicted (its weights and the room left for the rest of a
    /// binary), or the built binary's.
    pub bytes: Vec<u64>,
    /// Each context's spill-fill buffer: predicted, or what the built binary says.
    pub spill_fill: Vec<u64>,
    /// Each context's session and residency.
    pub session: Vec<u32>,
    pub resident: Vec<bool>,
    pub sessions: Vec<NpuSession>,
    /// Bytes of contexts that may be created at once (`NpuSection::context_budget`).
    pub budget: u64,
}

/// The plan `inspect --estimate` predicts from: [`split_contexts`], then sessions and
/// residency from the predicted sizes ([`settle`]). Also each graph's layer bounds.
pub fn plan_contexts(h: &Header, format: NpuWeights, shared_weights: bool, limits: NpuLimits, count: Option<u32>) -> std::result::Result<(ContextPlan, Vec<Vec<usize>>), String> {
    let (groups, bounds) = split_contexts(h, format, shared_weights, limits, count)?;
    let LayerBytes { layer_bytes, .. } = layer_weight_bytes(h, format, shared_weights)?;
    let bytes: Vec<u64> = groups.iter().map(|g| context_bytes(&layer_bytes, g)).collect();
    let spills: Vec<u64> = groups.iter().map(|&g| predicted_spill_fill(h, &bounds, g)).collect();
    Ok((settle(h, &groups, &bytes, &spills, limits)?, bounds))
}

/// The contexts' layers `lower` builds (their sessions and residency are settled from the
/// built binaries' own sizes and spill-fill): `count` contexts balanced by bytes, or the fewest
/// that keep each within one mapping and [`BUILD_BYTES`] of build memory and, by predicted
/// sizes, the sessions within theirs; where the granted sessions do not hold them, the layers
/// past the first `sessions - 1` sessions split into the fewest contexts the last one's room
/// holds (they rotate). Also each graph's layer bounds.
pub fn split_contexts(h: &Header, format: NpuWeights, shared_weights: bool, limits: NpuLimits, count: Option<u32>) -> std::result::Result<(Vec<[u32; 2]>, Vec<Vec<usize>>), String> {
    let io = IoLayout::of(h);
    let LayerBytes { bounds, layer_bytes, build_bytes } = layer_weight_bytes(h, format, shared_weights)?;
    if count.is_some() {
        return Ok((split_layers(&layer_bytes, &build_bytes, u64::MAX, count)?, bounds));
    }
    let n = h.model.n_layers;
    let spill = |g: [u32; 2]| predicted_spill_fill(h, &bounds, g);
    let room = |g: [u32; 2], closed: u64| limits.session_bytes.saturating_sub(io.bound_bytes(h, g) + spill(g) + closed);
    let one_ok = |g: [u32; 2]| context_bytes(&layer_bytes, &g) <= limits.mapping_bytes && (g[1] - g[0] == 1 || build_bytes[g[0] as usize..g[1] as usize].iter().sum::<u64>() <= BUILD_BYTES);
    if let Some(l) = (0..n).find(|&l| context_bytes(&layer_bytes, &[l, l + 1]) > limits.mapping_bytes) {
        return Err(format!("layer {l} alone ({} bytes of weights over all graphs) exceeds one mapping of the NPU ({} bytes); use smaller weights (--quant q4)", layer_bytes[l as usize], limits.mapping_bytes));
    }
    // Layer by layer: the current context grows while it stays one mapping (and one build)
    // and its session holds it; else a new context, in the same session where that holds it,
    // else in the next.
    let mut groups: Vec<[u32; 2]> = vec![[0, 1]];
    let (mut session_first, mut closed, mut sessions) = (0u32, 0u64, 1u32);
    let mut first_of_last = 0usize;
    for l in 1..n {
        let cur = *groups.last().unwrap();
        let grown = [cur[0], l + 1];
        if one_ok(grown) && context_bytes(&layer_bytes, &grown) <= room([session_first, l + 1], closed) {
            *groups.last_mut().unwrap() = grown;
            continue;
        }
        let with_new = closed + context_bytes(&layer_bytes, &cur);
        if context_bytes(&layer_bytes, &[l, l + 1]) > room([session_first, l + 1], with_new) {
            (session_first, closed, sessions) = (l, 0, sessions + 1);
            if sessions == limits.sessions.max(1) {
                first_of_last = groups.len();
            }
        } else {
            closed = with_new;
        }
        groups.push([l, l + 1]);
    }
    if sessions <= limits.sessions.max(1) {
        return Ok((groups, bounds));
    }
    // Sessions too few for every context: the rest of the layers rotate through the last
    // session, split into the fewest contexts its room holds.
    let first = groups[first_of_last][0];
    let rest = [first, n];
    let room = limits.session_bytes.saturating_sub(io.bound_bytes(h, rest) + spill(rest));
    let mut split: Vec<[u32; 2]> = groups[..first_of_last].to_vec();
    let (tail, tail_build) = (&layer_bytes[first as usize..], &build_bytes[first as usize..]);
    split.extend(split_layers(tail, tail_build, room.min(limits.mapping_bytes), None)?.into_iter().map(|g| [g[0] + first, g[1] + first]));
    Ok((split, bounds))
}

/// Sessions and residency of contexts `layers` of `bytes` and `spill_fill`: each session takes
/// contexts in order while it holds them with the I/O they bind and their largest spill-fill;
/// every context resident where the granted sessions hold them all. Else the contexts past the
/// first `sessions - 1` sessions share the last one: the longest prefix of them resident that
/// leaves room for the two largest of the others (one created while another runs), else for
/// the largest ([`resident_prefix`]). Errors name the context or limit that does not fit.
pub fn settle(h: &Header, layers: &[[u32; 2]], bytes: &[u64], spill_fill: &[u64], limits: NpuLimits) -> std::result::Result<ContextPlan, String> {
    let io = IoLayout::of(h);
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    if io.bytes > limits.mapping_bytes {
        return Err(format!("the NPU's I/O allocation ({}: the KV cache and the largest pass's inputs and outputs) exceeds one mapping ({}); lower --max-seq", mib(io.bytes), mib(limits.mapping_bytes)));
    }
    if let Some(k) = (0..layers.len()).find(|&k| bytes[k] > limits.mapping_bytes) {
        return Err(format!("NPU context {k} (layers {}..{}) is {}, more than one mapping ({}); ask for more contexts (--npu-contexts) or use smaller weights (--quant q4)", layers[k][0], layers[k][1], mib(bytes[k]), mib(limits.mapping_bytes)));
    }
    let need = |from: usize, to: usize| -> (u64, u64) {
        let span = [layers[from][0], layers[to - 1][1]];
        (io.bound_bytes(h, span) + spill_fill[from..to].iter().copied().max().unwrap_or(0), bytes[from..to].iter().sum())
    };
    // Greedy in order: a session closes when the next context would not fit it.
    let mut starts = vec![0usize];
    for k in 1..layers.len() {
        let (fixed, held) = need(*starts.last().unwrap(), k + 1);
        if fixed + held > limits.session_bytes {
            starts.push(k);
        }
    }
    let granted = limits.sessions.max(1) as usize;
    let mut rotating_from = layers.len();
    if starts.len() > granted {
        starts.truncate(granted);
        rotating_from = *starts.last().unwrap();
    }
    let mut session = vec![0u32; layers.len()];
    let mut resident = vec![true; layers.len()];
    let (mut sessions, mut budget) = (Vec::new(), 0u64);
    for (si, &from) in starts.iter().enumerate() {
        let to = starts.get(si + 1).copied().unwrap_or(layers.len());
        session[from..to].iter_mut().for_each(|s| *s = si as u32);
        let span = [layers[from][0], layers[to - 1][1]];
        let spill = spill_fill[from..to].iter().copied().max().unwrap_or(0);
        let io_bytes = io.bound_bytes(h, span);
        let room = limits.session_bytes.saturating_sub(io_bytes + spill);
        if from == rotating_from {
            let keep = resident_prefix(&bytes[from..to], room);
            resident[from..to].copy_from_slice(&keep);
            let largest = bytes[from..to].iter().zip(&keep).filter(|(_, r)| !**r).map(|(b, _)| *b).max().unwrap_or(0);
            let kept: u64 = bytes[from..to].iter().zip(&keep).filter(|(_, r)| **r).map(|(b, _)| *b).sum();
            if kept + largest > room {
                return Err(format!(
                    "the NPU's contexts of layers {}..{} do not fit its last session even rotating: the largest is {}, and the session leaves {} of its {} beside {} of I/O and {} of spill-fill; raise --npu-sessions or --npu-session-bytes, lower --max-seq, or use smaller weights (--quant q4)",
                    span[0], span[1], mib(bytes[from..to].iter().copied().max().unwrap_or(0)), mib(room), mib(limits.session_bytes), mib(io_bytes), mib(spill)
                ));
            }
            budget += if largest > 0 { room } else { kept };
        } else {
            let held: u64 = bytes[from..to].iter().sum();
            if held > room {
                return Err(format!(
                    "NPU context {from} (layers {}..{}, {}) does not fit an HTP session: {} beside {} of I/O and {} of spill-fill; use smaller weights (--quant q4) or lower --max-seq",
                    layers[from][0], layers[from][1], mib(bytes[from]), mib(limits.session_bytes), mib(io_bytes), mib(spill)
                ));
            }
            budget += held;
        }
        sessions.push(NpuSession { io_bytes, spill_fill_bytes: spill });
    }
    Ok(ContextPlan { limits, layers: layers.to_vec(), bytes: bytes.to_vec(), spill_fill: spill_fill.to_vec(), session, resident, sessions, budget })
}

/// The cache lengths an NPU plan's attention is built for (Genie's context-length variants):
/// the KV capacity, half and a quarter of it, each kept if at least 128 positions (smaller
/// caches read little either way) and a whole number of 32-position tiles.
pub fn cache_lens(capacity: u32) -> Vec<u32> {
    let mut lens: Vec<u32> = (0..3).map(|k| capacity >> k).filter(|&l| l == capacity || (l >= 128 && l % 32 == 0)).collect();
    lens.reverse();
    lens
}

/// The spill-fill buffer predicted for the context of layers `g` before it is built: four times
/// its largest fp16 intermediate (what the 1B shape's binaries report is within that, from
/// one to three times it). The built binary's own figure replaces it.
fn predicted_spill_fill(h: &Header, bounds: &[Vec<usize>], g: [u32; 2]) -> u64 {
    let n = h.model.n_layers;
    h.graphs
        .iter()
        .zip(bounds)
        .flat_map(|(graph, b)| {
            graph.ops[layer_ops(graph, b, g, n)].iter().flat_map(|o| o.outputs()).map(|v| {
                let value = &graph.values[v as usize];
                let rows = match value.rows {
                    llada_ir::Rows::Tokens => graph.rows,
                    llada_ir::Rows::Logits => graph.logit_rows,
                };
                4 * 2 * rows as u64 * value.cols as u64
            })
        })
        .max()
        .unwrap_or(0)
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
    // Without sharing, every row bucket and cache length carries its own copy.
    let variants = cache_lens(h.plan.kv_capacity).len() as u64;
    let layer_bytes = per_graph.iter().map(|v| if shared_weights { v.iter().copied().max().unwrap_or(0) } else { variants * v.iter().sum::<u64>() }).collect();
    let unpacked = if matches!(format, NpuWeights::Int4PerChannel | NpuWeights::Int4Lpbq { .. }) { 2 } else { 1 };
    let build_bytes = per_graph.iter().map(|v| v.iter().sum::<u64>() * unpacked * variants).collect();
    Ok(LayerBytes { bounds, layer_bytes, build_bytes })
}

/// The window room the executables need, as [`plan_contexts`] predicts binaries: what a
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
pub(crate) fn layer_bounds(h: &Header, g: &Graph) -> Result<Vec<usize>> {
    let bad = |what: String| Error::Options(format!("lowering graph '{}' to QNN: {what}", g.name));
    let Some(Op::Embed { out: residual, .. }) = g.ops.first() else {
        return Err(bad("it does not start with the embedding".into()));
    };
    let after_last_add = |before: usize| g.ops[..before].iter().rposition(|o| matches!(o, Op::Add { acc, .. } if acc == residual)).map(|i| i + 1);
    let mut bounds = vec![llada_ir::npu::host_prefix(g)];
    for l in 1..h.model.n_layers {
        let attention = g.ops.iter().position(|o| matches!(o, Op::Attention { layer, .. } | Op::WindowAttention { layer, .. } if *layer == l)).ok_or_else(|| bad(format!("no attention for layer {l}")))?;
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
pub(crate) fn layer_ops(g: &Graph, bounds: &[usize], layers: [u32; 2], n_layers: u32) -> std::ops::Range<usize> {
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
                    "layer {l} alone ({} bytes of weights over all graphs) does not fit the {budget} bytes its HTP session leaves for NPU contexts; raise --npu-sessions or --npu-session-bytes, lower --max-seq, or use smaller weights (--quant q4)",
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
    let lm_head = lm_head_weight(g);
    let bytes = |t: TensorId| if matmul.contains(&t) { matmul_bytes(h, t, format, Some(t) == lm_head) } else { 2 * h.tensors[t as usize].numel() };
    // The embedding and the MoE host ops' tensors (router bias, routed experts) stay outside.
    g.ops[ops].iter().filter(|o| !matches!(o, Op::Embed { .. } | Op::SoftEmbed { .. }) && !llada_ir::npu::host_op(o)).flat_map(|o| o.tensors()).filter(|t| seen.insert(*t)).map(bytes).sum()
}

/// The LM head's weight: the matmul writing `g`'s logits.
pub fn lm_head_weight(g: &Graph) -> Option<TensorId> {
    g.ops.iter().find_map(|o| match *o {
        Op::MatMul { weight, out, .. } if out == g.logits => Some(weight),
        _ => None,
    })
}

/// Bytes of matmul weight `t` in the executables of `format` (`lm_head`: the LM head's).
pub fn matmul_bytes(h: &Header, t: TensorId, format: NpuWeights, lm_head: bool) -> u64 {
    let n = h.tensors[t as usize].numel();
    match format {
        NpuWeights::Int8PerChannel => n,
        // The LM head of a fixed-point format: int8 per output channel.
        NpuWeights::Int4Lpbq { .. } if lm_head => n,
        NpuWeights::Int4PerChannel => n.div_ceil(2),
        // Packed int4 and a byte of block scale per block.
        NpuWeights::Int4Lpbq { block } => n.div_ceil(2) + n / block as u64,
        NpuWeights::F16 => 2 * n,
    }
}


#[cfg(test)]
mod tests {
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


    /// LLaDA-8B q4 for SM8750: every context resident over the two sessions the phone grants,
    /// each within one mapping and each session within its bytes; granted one session, the
    /// contexts rotate through it (the fallback), the budget its room; too small a session
    /// for one layer is one error naming the flags.
    #[test]
    fn an_8b_model_is_resident_over_two_sessions_and_rotates_through_one() {
        use super::{plan_contexts, settle};
        use llada_ir::npu::{IoLayout, NpuLimits, NpuWeights};
        let (h, _) = crate::testing::llada_8b_header(&[32, 64, 160, 1024], "sm8750", None);
        let format = NpuWeights::Int4Lpbq { block: 64 };
        let limits = NpuLimits { mapping_bytes: 2 << 30, session_bytes: 3200 << 20, sessions: 2 };
        let (plan, _) = plan_contexts(&h, format, true, limits, None).unwrap();
        assert!(plan.resident.iter().all(|r| *r), "{plan:?}");
        assert_eq!(plan.sessions.len(), 2, "an 8B model needs two sessions: {plan:?}");
        assert_eq!(plan.budget, plan.bytes.iter().sum::<u64>());
        assert!(plan.bytes.iter().all(|&b| b <= limits.mapping_bytes));
        let io = IoLayout::of(&h);
        for (si, s) in plan.sessions.iter().enumerate() {
            let mine: Vec<usize> = (0..plan.bytes.len()).filter(|&k| plan.session[k] == si as u32).collect();
            let held: u64 = mine.iter().map(|&k| plan.bytes[k]).sum();
            assert!(s.io_bytes + s.spill_fill_bytes + held <= limits.session_bytes, "session {si}: {s:?}, {held}");
            assert_eq!(s.io_bytes, io.bound_bytes(&h, [plan.layers[mine[0]][0], plan.layers[*mine.last().unwrap()][1]]));
        }
        // Layers in order across the contexts, sessions in order across them.
        assert!(plan.layers.windows(2).all(|w| w[0][1] == w[1][0]) && plan.layers[0][0] == 0 && plan.layers.last().unwrap()[1] == 32);
        assert!(plan.session.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1));
        // One session: what does not fit rotates through the room it leaves.
        let one = NpuLimits { sessions: 1, ..limits };
        let (plan, _) = plan_contexts(&h, format, true, one, None).unwrap();
        assert_eq!(plan.sessions.len(), 1);
        assert!(plan.resident.iter().any(|r| !*r), "{plan:?}");
        let s = plan.sessions[0];
        let room = one.session_bytes - s.io_bytes - s.spill_fill_bytes;
        assert_eq!(plan.budget, room);
        let kept: u64 = (0..plan.bytes.len()).filter(|&k| plan.resident[k]).map(|k| plan.bytes[k]).sum();
        let largest = (0..plan.bytes.len()).filter(|&k| !plan.resident[k]).map(|k| plan.bytes[k]).max().unwrap();
        assert!(kept + largest <= room);
        // The same contexts settled again with their sizes: the same plan.
        assert_eq!(settle(&h, &plan.layers, &plan.bytes, &plan.spill_fill, one).unwrap(), plan);
        let tiny = NpuLimits { session_bytes: 600 << 20, sessions: 1, ..limits };
        let e = plan_contexts(&h, format, true, tiny, None).unwrap_err();
        assert!(e.contains("--npu-session-bytes") || e.contains("does not fit"), "{e}");
    }
}
