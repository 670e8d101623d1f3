//! Static graphs: one shape-specialised program each, a flat list of ops over activation
//! buffers ("values") placed at fixed offsets in the accelerator window.
//!
//! Every value is a row-major f32 matrix. Its row count is static: either the graph's token
//! rows, or the capacity of the logit rows (the positions whose logits the sampler needs,
//! chosen per run, at most `logit_rows`).

use serde::{Deserialize, Serialize};

/// Index into `Header::tensors`.
pub type TensorId = u32;
/// Index into `Graph::values`.
pub type ValueId = u32;

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// One row per token row of the graph (`Graph::rows`).
    Tokens,
    /// One row per logit row (`Graph::logit_rows` at most; the run says how many).
    Logits,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Value {
    pub name: String,
    pub rows: Rows,
    pub cols: u32,
    /// Byte offset in the window (inside its activation region); a multiple of
    /// [`crate::WINDOW_ALIGN`].
    pub offset: u64,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Op {
    /// `out[r] = table[token[r]]`.
    Embed { table: TensorId, out: ValueId },
    /// `x *= factor`.
    Scale { x: ValueId, factor: f32 },
    /// `out = x / sqrt(mean(x^2) + eps) * weight`, per row.
    RmsNorm { x: ValueId, weight: TensorId, eps: f32, out: ValueId },
    /// `out = x @ weight^T` with `weight` `[out_features, in_features]`, stored in a packed
    /// layout (`llada_ir::packing`).
    MatMul { x: ValueId, weight: TensorId, out: ValueId },
    /// Rotary embedding in place on the first `heads` heads of every row (the query and key
    /// heads of a fused q|k|v row), half-split ("rotate_half") convention, at each row's
    /// position; `cos` and `sin` are `[positions, head_dim / 2]` tables.
    Rope { x: ValueId, heads: u32, cos: TensorId, sin: TensorId },
    /// Bidirectional multi-head attention through the KV cache of transformer block `layer`:
    /// every real row first stores its keys and values at its position, then every row
    /// attends to the cache's first `context` positions (the run's inputs say which; padding
    /// rows are never stored). `qkv` rows hold `heads` query heads, then `kv_heads` key
    /// heads, then `kv_heads` value heads; query head `h` uses key/value head
    /// `h / (heads / kv_heads)`.
    Attention { qkv: ValueId, out: ValueId, heads: u32, kv_heads: u32, layer: u32 },
    /// `out = silu(gate) * up` where each row of `x` is `[gate | up]`.
    SwiGlu { x: ValueId, out: ValueId },
    /// `acc += x`.
    Add { acc: ValueId, x: ValueId },
    /// `out[i] = x[logit_row[i]]`: picks the rows whose logits the sampler needs.
    GatherLogitRows { x: ValueId, out: ValueId },
    /// RMSNorm over `head_dim` of heads `first_head .. first_head + heads` of every row of
    /// `x`, in place, all those heads sharing one `[head_dim]` weight (LLaDA-MoE's q and k
    /// norms on a fused q|k|v row).
    HeadRmsNorm { x: ValueId, first_head: u32, heads: u32, weight: TensorId, eps: f32 },
    /// The router's choice per row: `softmax(logits)` in f32 over every expert, then its
    /// `top_k` largest (ties broken as `torch.topk` on the CPU breaks them). `out` rows are
    /// `top_k` expert ids (exact as f32) followed by their `top_k` probabilities.
    Route { logits: ValueId, top_k: u32, out: ValueId },
    /// The experts of MoE layer `layer`: `out[r] = sum of p * down_e(silu(gate_e(x[r])) *
    /// up_e(x[r]))` over the experts e `route` picked for row r with probability p, summed in
    /// increasing expert id (as the reference's loop over experts adds them). Expert e's fused
    /// `[gate | up]` matrix is tensor `first + 2e`, its down matrix `first + 2e + 1`.
    /// `ranked` (`[top_k * d_model]` per row) holds every (row, pick) expert output before the
    /// sum; `work` is the expert kernels' scratch, `[d_model | 2 * hidden | hidden | d_model]`
    /// per row.
    MoeExperts { x: ValueId, route: ValueId, out: ValueId, layer: u32, first: TensorId, experts: u32, ranked: ValueId, work: ValueId },
    /// `x[r] += bias` for every row: a projection's bias (Dream's q, k and v), `[x.cols]` f32.
    Bias { x: ValueId, bias: TensorId },
    /// LLaDA 2.x's router per row: scores `s = sigmoid(logits)` in f32, experts chosen on `s +
    /// bias` (`bias`, `[experts]` f32, steers the choice only): the experts fall in `groups`
    /// equal consecutive groups, each scored by the sum of its two largest biased scores, the
    /// `top_groups` best groups are kept and the `top_k` largest biased scores among them
    /// picked (ties as `torch.topk`); each pick is weighted by its unbiased `s`, divided by
    /// the picks' sum (plus 1e-20) when `normalize`, times `scale`. `out` as `Route`'s.
    RouteSigmoid { logits: ValueId, bias: TensorId, top_k: u32, groups: u32, top_groups: u32, normalize: bool, scale: f32, out: ValueId },
    /// DiffusionGemma's router per row: `softmax(logits)` in f32, its `top_k` largest (ties as
    /// `torch.topk`), each divided by their sum, then times `expert_scale[e]` (`[experts]`
    /// f32) of its expert. `out` as `Route`'s.
    RouteScaled { logits: ValueId, expert_scale: TensorId, top_k: u32, out: ValueId },
    /// `out = gelu_tanh(gate) * up` where each row of `x` is `[gate | up]`.
    GeluGlu { x: ValueId, out: ValueId },
    /// `x = tanh(x / cap) * cap`: logit soft-capping.
    Softcap { x: ValueId, cap: f32 },
    /// [`Op::Rope`] with its own head width: the first `heads` heads of `head_dim` of every
    /// row; `cos` and `sin` are `[positions, head_dim / 2]`.
    RopeHeads { x: ValueId, heads: u32, head_dim: u32, cos: TensorId, sin: TensorId },
    /// RMSNorm over each of heads `first_head .. first_head + heads` (of `head_dim`) of every
    /// row of `x`, in place, times the shared `[head_dim]` `weight`, or by nothing without
    /// one (DiffusionGemma's value norm).
    NormHeads { x: ValueId, first_head: u32, heads: u32, head_dim: u32, weight: Option<TensorId>, eps: f32 },
    /// [`Op::Attention`] with its own head shape, score scale and window: `qkv` rows hold
    /// `heads` query heads, then `kv_heads` key heads, then `kv_heads` value heads, of
    /// `head_dim` each; scores are `q . k * scale`. A row attends to the keys before its
    /// block's end (the pass's rows, see `RunInputs`); with a `window` of W, only to those
    /// from W - 1 before its block's first position on (a block of one row: the last W
    /// positions, causal sliding-window attention). Layer `layer`'s cache holds
    /// `kv_heads * head_dim` at most the model's `n_kv_heads * head_dim` per position.
    WindowAttention { qkv: ValueId, out: ValueId, heads: u32, kv_heads: u32, head_dim: u32, layer: u32, scale: f32, window: Option<u32> },
    /// DiffusionGemma's self-conditioning embedding: with the run's soft input (each row the
    /// previous step's logits, written into `x`, `[tokens, vocab]`), `out = softmax(x) @ table
    /// * scale` (`table` the embedding, `[vocab, d_model]`, as `Embed` reads it: the expected
    /// embedding under the previous prediction); with none, `out = 0` (the first step).
    SoftEmbed { x: ValueId, table: TensorId, scale: f32, out: ValueId },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embed { .. } => "Embed",
            Op::Scale { .. } => "Scale",
            Op::RmsNorm { .. } => "RmsNorm",
            Op::MatMul { .. } => "MatMul",
            Op::Rope { .. } => "Rope",
            Op::Attention { .. } => "Attention",
            Op::SwiGlu { .. } => "SwiGlu",
            Op::Add { .. } => "Add",
            Op::GatherLogitRows { .. } => "GatherLogitRows",
            Op::HeadRmsNorm { .. } => "HeadRmsNorm",
            Op::Route { .. } => "Route",
            Op::MoeExperts { .. } => "MoeExperts",
            Op::Bias { .. } => "Bias",
            Op::RouteSigmoid { .. } => "RouteSigmoid",
            Op::RouteScaled { .. } => "RouteScaled",
            Op::GeluGlu { .. } => "GeluGlu",
            Op::Softcap { .. } => "Softcap",
            Op::RopeHeads { .. } => "RopeHeads",
            Op::NormHeads { .. } => "NormHeads",
            Op::WindowAttention { .. } => "WindowAttention",
            Op::SoftEmbed { .. } => "SoftEmbed",
        }
    }

    /// Values the op reads.
    pub fn inputs(&self) -> Vec<ValueId> {
        match *self {
            Op::Embed { .. } => vec![],
            Op::Scale { x, .. } | Op::Bias { x, .. } | Op::Softcap { x, .. } => vec![x],
            Op::RmsNorm { x, .. } | Op::MatMul { x, .. } | Op::GatherLogitRows { x, .. } => vec![x],
            Op::Rope { x, .. } | Op::RopeHeads { x, .. } => vec![x],
            Op::Attention { qkv, .. } | Op::WindowAttention { qkv, .. } => vec![qkv],
            Op::SwiGlu { x, .. } | Op::GeluGlu { x, .. } => vec![x],
            Op::Add { acc, x } => vec![acc, x],
            Op::HeadRmsNorm { x, .. } | Op::NormHeads { x, .. } => vec![x],
            // The soft input is written into `x` by the run, then read.
            Op::SoftEmbed { x, .. } => vec![x],
            Op::Route { logits, .. } | Op::RouteSigmoid { logits, .. } | Op::RouteScaled { logits, .. } => vec![logits],
            Op::MoeExperts { x, route, .. } => vec![x, route],
        }
    }

    /// Values the op writes (in-place ops list their operand here too).
    pub fn outputs(&self) -> Vec<ValueId> {
        match *self {
            Op::Embed { out, .. }
            | Op::RmsNorm { out, .. }
            | Op::MatMul { out, .. }
            | Op::Attention { out, .. }
            | Op::SwiGlu { out, .. }
            | Op::GatherLogitRows { out, .. }
            | Op::GeluGlu { out, .. }
            | Op::WindowAttention { out, .. } => vec![out],
            Op::Scale { x, .. } | Op::Rope { x, .. } | Op::HeadRmsNorm { x, .. } | Op::Bias { x, .. } | Op::Softcap { x, .. } | Op::RopeHeads { x, .. } | Op::NormHeads { x, .. } => vec![x],
            // Softmax in place over the soft input, then the product.
            Op::SoftEmbed { x, out, .. } => vec![x, out],
            Op::Add { acc, .. } => vec![acc],
            Op::Route { out, .. } | Op::RouteSigmoid { out, .. } | Op::RouteScaled { out, .. } => vec![out],
            Op::MoeExperts { out, ranked, work, .. } => vec![out, ranked, work],
        }
    }

    /// Tensors the op reads.
    pub fn tensors(&self) -> Vec<TensorId> {
        match *self {
            Op::Embed { table, .. } => vec![table],
            Op::RmsNorm { weight, .. } | Op::MatMul { weight, .. } => vec![weight],
            Op::Rope { cos, sin, .. } | Op::RopeHeads { cos, sin, .. } => vec![cos, sin],
            Op::HeadRmsNorm { weight, .. } | Op::Bias { bias: weight, .. } | Op::RouteSigmoid { bias: weight, .. } => vec![weight],
            Op::RouteScaled { expert_scale, .. } => vec![expert_scale],
            Op::NormHeads { weight, .. } => weight.into_iter().collect(),
            Op::SoftEmbed { table, .. } => vec![table],
            Op::MoeExperts { first, experts, .. } => (0..2 * experts).map(|i| first.saturating_add(i)).collect(),
            _ => vec![],
        }
    }
}

/// One static-shape program.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Graph {
    pub name: String,
    /// Token rows (R): the static sequence length this graph computes.
    pub rows: u32,
    /// Most rows whose logits one run can ask for.
    pub logit_rows: u32,
    pub values: Vec<Value>,
    pub ops: Vec<Op>,
    /// The value holding the logits, `[logit rows, embedding_size]`.
    pub logits: ValueId,
    /// Bytes of the activation region this graph's values need.
    pub window_bytes: u64,
    /// The swap schedule: one step per rotating segment, in `WindowPlan::rotating` order.
    pub staging: Vec<StageStep>,
}

/// One entry of a graph's swap schedule: rotating segment `rotating` (index into
/// `WindowPlan::rotating`) is staged into `slot` before op `first_op` and released after op
/// `last_op`. Its copy may start once the slot's previous occupant is released: after op
/// `stage_after_op` of this graph, or (`None`) during the previous pass, which then copies
/// it behind that pass's last ops.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StageStep {
    pub rotating: u32,
    pub slot: u32,
    pub stage_after_op: Option<u32>,
    pub first_op: u32,
    pub last_op: u32,
}

impl Graph {
    pub fn row_count(&self, rows: Rows) -> u64 {
        match rows {
            Rows::Tokens => self.rows as u64,
            Rows::Logits => self.logit_rows as u64,
        }
    }

    /// Bytes the value occupies in the window (its static capacity).
    pub fn value_bytes(&self, v: &Value) -> u64 {
        self.row_count(v.rows) * v.cols as u64 * 4
    }

    /// [`value_bytes`](Self::value_bytes), `None` if it overflows (for the verifier, before
    /// which sizes are untrusted).
    pub fn checked_value_bytes(&self, v: &Value) -> Option<u64> {
        self.row_count(v.rows).checked_mul(v.cols as u64)?.checked_mul(4)
    }
}

/// Live interval (first op that touches it, last op that touches it) of every value; the
/// logits stay live to the end because the sampler reads them after the run.
pub fn live_intervals(g: &Graph) -> Vec<Option<(usize, usize)>> {
    let mut live: Vec<Option<(usize, usize)>> = vec![None; g.values.len()];
    for (i, op) in g.ops.iter().enumerate() {
        for v in op.inputs().into_iter().chain(op.outputs()) {
            let e = &mut live[v as usize];
            *e = Some(e.map_or((i, i), |(a, _)| (a, i)));
        }
    }
    if let Some(e) = live.get_mut(g.logits as usize) {
        *e = Some(e.map_or((g.ops.len(), g.ops.len()), |(a, _)| (a, g.ops.len())));
    }
    live
}
