//! Lowering: the LLaDA network as static-shape graphs over the stored tensors.

use llada_ir::{Graph, ModelConfig, Op, Rows, TensorId, Value, ValueId};

/// Tensor ids of one transformer block. The query, key and value projections are one fused
/// matrix (`[q | k | v]` output columns), and so are the SwiGLU gate and up projections
/// (`[gate | up]`): one pass over the activations feeds each pair.
#[derive(Debug, Clone, Copy)]
pub struct BlockTensors {
    pub attn_norm: TensorId,
    pub qkv: TensorId,
    /// The `[q | k | v]` projection biases (Dream), f32.
    pub qkv_bias: Option<TensorId>,
    /// Per-head RMSNorm weights of the query and of the key heads (LLaDA-MoE).
    pub qk_norm: Option<(TensorId, TensorId)>,
    pub attn_out: TensorId,
    pub ff_norm: TensorId,
    pub ffn: Ffn,
}

/// A block's feed-forward.
#[derive(Debug, Clone, Copy)]
pub enum Ffn {
    /// SwiGLU of width `hidden`.
    Dense { gate_up: TensorId, ff_out: TensorId, hidden: u32 },
    /// The router (`[experts, d]`) and the experts: `[gate | up]` then down for each, from
    /// tensor `first` on; and a shared expert added unweighted (`[gate | up]`, down, width).
    Moe { router: TensorId, first: TensorId, rule: RouteRule, shared: Option<(TensorId, TensorId, u32)> },
}

/// How a router picks and weighs experts.
#[derive(Debug, Clone, Copy)]
pub enum RouteRule {
    /// LLaDA-MoE's: softmax, top k (`Op::Route`).
    Softmax,
    /// LLaDA 2.x's (`Op::RouteSigmoid`).
    Sigmoid { bias: TensorId, groups: u32, top_groups: u32, normalize: bool, scale: f32 },
}

/// Tensor ids of the whole network, as written to the artifact.
#[derive(Debug, Clone)]
pub struct NetworkTensors {
    pub embedding: TensorId,
    pub blocks: Vec<BlockTensors>,
    pub final_norm: TensorId,
    pub lm_head: TensorId,
    pub rope_cos: TensorId,
    pub rope_sin: TensorId,
}

/// Options of the network that are not tensors.
#[derive(Debug, Clone, Copy)]
pub struct NetworkOptions {
    /// Multiply embeddings by sqrt(d_model) (`input_emb_norm`).
    pub input_emb_norm: bool,
    /// Multiply logits by 1/sqrt(d_model) (`scale_logits`).
    pub scale_logits: bool,
}

pub(crate) struct Builder {
    pub(crate) values: Vec<Value>,
    pub(crate) ops: Vec<Op>,
}

impl Builder {
    /// The output head over the residual `x`: the logit rows gathered, normed by `final_norm`
    /// and projected by `lm_head`; returns the logits.
    pub(crate) fn head(&mut self, m: &ModelConfig, x: ValueId, final_norm: TensorId, lm_head: TensorId) -> ValueId {
        let hx = self.value("head_in".into(), Rows::Logits, m.d_model);
        let hn = self.value("head_normed".into(), Rows::Logits, m.d_model);
        let logits = self.value("logits".into(), Rows::Logits, m.embedding_size);
        self.ops.extend([
            Op::GatherLogitRows { x, out: hx },
            Op::RmsNorm { x: hx, weight: final_norm, eps: m.rms_eps as f32, out: hn },
            Op::MatMul { x: hn, weight: lm_head, out: logits },
        ]);
        logits
    }

    pub(crate) fn value(&mut self, name: String, rows: Rows, cols: u32) -> ValueId {
        self.values.push(Value { name, rows, cols, offset: 0 });
        self.values.len() as ValueId - 1
    }
}

/// The network over `rows` consecutive positions, attending through the KV cache (see
/// `llada_ir::Plan`): the whole sequence for the exact sampler, fewer rows for the cached
/// policies; logits for up to `logit_rows` chosen rows. Window offsets are left at zero for
/// the memory planner.
pub fn full_sequence_graph(m: &ModelConfig, t: &NetworkTensors, opts: NetworkOptions, rows: u32, logit_rows: u32) -> Graph {
    let mut b = Builder { values: Vec::new(), ops: Vec::new() };
    let (d, hd) = (m.d_model, m.head_dim);
    let eps = m.rms_eps as f32;
    let x = b.value("x".into(), Rows::Tokens, d);
    b.ops.push(Op::Embed { table: t.embedding, out: x });
    if opts.input_emb_norm {
        b.ops.push(Op::Scale { x, factor: (d as f32).sqrt() });
    }
    for (l, bt) in t.blocks.iter().enumerate() {
        let v = |b: &mut Builder, what: &str, cols: u32| b.value(format!("blocks.{l}.{what}"), Rows::Tokens, cols);
        let xn = v(&mut b, "attn_in", d);
        let qkv = v(&mut b, "qkv", (m.n_heads + 2 * m.n_kv_heads) * hd);
        let att = v(&mut b, "attn", m.n_heads * hd);
        let o = v(&mut b, "attn_proj", d);
        let fin = v(&mut b, "ff_in", d);
        let f = v(&mut b, "ff_proj_out", d);
        b.ops.extend([Op::RmsNorm { x, weight: bt.attn_norm, eps, out: xn }, Op::MatMul { x: xn, weight: bt.qkv, out: qkv }]);
        if let Some(bias) = bt.qkv_bias {
            b.ops.push(Op::Bias { x: qkv, bias });
        }
        if let Some((q_norm, k_norm)) = bt.qk_norm {
            b.ops.extend([
                Op::HeadRmsNorm { x: qkv, first_head: 0, heads: m.n_heads, weight: q_norm, eps },
                Op::HeadRmsNorm { x: qkv, first_head: m.n_heads, heads: m.n_kv_heads, weight: k_norm, eps },
            ]);
        }
        b.ops.extend([
            Op::Rope { x: qkv, heads: m.n_heads + m.n_kv_heads, cos: t.rope_cos, sin: t.rope_sin },
            Op::Attention { qkv, out: att, heads: m.n_heads, kv_heads: m.n_kv_heads, layer: l as u32 },
            Op::MatMul { x: att, weight: bt.attn_out, out: o },
            Op::Add { acc: x, x: o },
            Op::RmsNorm { x, weight: bt.ff_norm, eps, out: fin },
        ]);
        match (bt.ffn, m.moe) {
            (Ffn::Dense { gate_up: w_gate_up, ff_out, hidden }, _) => {
                let gate_up = v(&mut b, "gate_up", 2 * hidden);
                let h = v(&mut b, "hidden", hidden);
                b.ops.extend([
                    Op::MatMul { x: fin, weight: w_gate_up, out: gate_up },
                    Op::SwiGlu { x: gate_up, out: h },
                    Op::MatMul { x: h, weight: ff_out, out: f },
                ]);
            }
            (Ffn::Moe { router, first, rule, shared }, Some(moe)) => {
                let logits = v(&mut b, "router_logits", moe.experts);
                let route = v(&mut b, "route", 2 * moe.top_k);
                let ranked = v(&mut b, "expert_outputs", moe.top_k * d);
                let work = v(&mut b, "expert_work", 2 * d + 3 * m.mlp_hidden);
                let routing = match rule {
                    RouteRule::Softmax => Op::Route { logits, top_k: moe.top_k, out: route },
                    RouteRule::Sigmoid { bias, groups, top_groups, normalize, scale } => Op::RouteSigmoid { logits, bias, top_k: moe.top_k, groups, top_groups, normalize, scale, out: route },
                };
                b.ops.extend([
                    Op::MatMul { x: fin, weight: router, out: logits },
                    routing,
                    Op::MoeExperts { x: fin, route, out: f, layer: l as u32, first, experts: moe.experts, ranked, work },
                ]);
                if let Some((w_gate_up, down, hidden)) = shared {
                    let gate_up = v(&mut b, "shared_gate_up", 2 * hidden);
                    let h = v(&mut b, "shared_hidden", hidden);
                    let out = v(&mut b, "shared_out", d);
                    b.ops.extend([
                        Op::MatMul { x: fin, weight: w_gate_up, out: gate_up },
                        Op::SwiGlu { x: gate_up, out: h },
                        Op::MatMul { x: h, weight: down, out },
                        Op::Add { acc: f, x: out },
                    ]);
                }
            }
            (Ffn::Moe { .. }, None) => unreachable!("expert tensors for a model without experts"),
        }
        b.ops.push(Op::Add { acc: x, x: f });
    }
    let logits = b.head(m, x, t.final_norm, t.lm_head);
    if opts.scale_logits {
        b.ops.push(Op::Scale { x: logits, factor: 1.0 / (d as f32).sqrt() });
    }
    Graph { name: format!("rows-{rows}"), rows, logit_rows, values: b.values, ops: b.ops, logits, window_bytes: 0, staging: Vec::new() }
}

/// Row counts of the exact graphs: every multiple of the target's row multiple from twice it
/// up to 256 (typical prompt + answer lengths, where padding is costly), then about 25% apart
/// up to `max_seq` (padding wastes at most about a fifth of a pass).
pub fn exact_buckets(max_seq: u32, row_multiple: u32) -> Vec<u32> {
    const FINE_UP_TO: u32 = 256;
    let round = |x: u32| x.div_ceil(row_multiple) * row_multiple;
    let top = round(max_seq);
    let mut out = Vec::new();
    let mut r = round(2 * row_multiple).min(top);
    loop {
        out.push(r);
        if r >= top {
            return out;
        }
        let step = if r < FINE_UP_TO { row_multiple } else { r / 4 };
        r = round(r + step).max(r + row_multiple).min(top);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_up_to_the_maximum() {
        let fine: Vec<u32> = (2..=16).map(|i| 16 * i).collect();
        let b = exact_buckets(512, 16);
        assert_eq!(&b[..fine.len()], &fine[..]);
        assert_eq!(&b[fine.len()..], &[320, 400, 512]);
        assert_eq!(exact_buckets(20, 16), vec![32]);
        let b = exact_buckets(4096, 32);
        // Above 256 each step grows by a quarter, rounded up to the row multiple.
        assert!(b.windows(2).all(|w| w[0] < w[1] && (w[0] < 256 || w[1] <= (w[0] + w[0] / 4).div_ceil(32) * 32)));
        assert_eq!(*b.last().unwrap(), 4096);
    }
}
