//! Lowering DiffusionGemma: its layers as static graphs over the stored tensors, in the
//! published modeling code's order of operations. One network, two roles: the encoder's
//! graphs (causal, storing keys and values, each layer scaled by the encoder's
//! `layer_scalar`) and the decoder's (a canvas over the cache, with the self-conditioning
//! input and the decoder's `layer_scalar`, logits for every row).

use llada_ir::{Graph, ModelConfig, Op, Rows, TensorId, ValueId};

use crate::hf::config_diffusion_gemma::DiffusionGemmaSettings;
use crate::layout::diffusion_gemma::NetworkTensors;
use crate::lower::Builder;

/// Which of the two passes a graph is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Encoder,
    Decoder,
}

/// What every graph of the model is lowered from.
pub struct Network<'a> {
    pub model: &'a ModelConfig,
    pub settings: &'a DiffusionGemmaSettings,
    pub tensors: &'a NetworkTensors,
    /// Each layer's `layer_scalar`: the decoder's, the encoder's.
    pub layer_scalars: &'a [[f32; 2]],
    /// Rotary tables `(cos, sin)` of the sliding-window layers and of the full ones.
    pub rope: [(TensorId, TensorId); 2],
}

/// The graph of `role` over `rows` positions.
pub fn graph(n: &Network, role: Role, rows: u32) -> Graph {
    let (m, t) = (n.model, n.tensors);
    let mut b = Builder { values: Vec::new(), ops: Vec::new() };
    let d = m.d_model;
    let sqrt_d = (d as f64).sqrt() as f32;
    let x = b.value("x".into(), Rows::Tokens, d);
    b.ops.push(Op::Embed { table: t.embedding, out: x });
    // The decoder's self-conditioning product right after the embedding: both read the
    // embedding table on the CPU, before an NPU's first executable (`npu::host_prefix`).
    let soft = (role == Role::Decoder).then(|| soft_embedding(&mut b, n));
    b.ops.push(Op::Scale { x, factor: sqrt_d });
    if let Some(soft) = soft {
        self_conditioning(&mut b, n, x, soft);
    }
    for l in 0..m.n_layers as usize {
        layer(&mut b, n, role, x, l);
    }
    let logits = b.head(m, x, t.final_norm, t.lm_head);
    b.ops.push(Op::Softcap { x: logits, cap: n.settings.softcap as f32 });
    // The encoder's logits are never read: one row keeps the graph's shape valid.
    let (name, logit_rows) = match role {
        Role::Encoder => (format!("encoder-rows-{rows}"), 1),
        Role::Decoder => (format!("decoder-rows-{rows}"), rows),
    };
    Graph { name, rows, logit_rows, values: b.values, ops: b.ops, logits, window_bytes: 0, staging: Vec::new() }
}

/// The previous step's expected embedding (`Op::SoftEmbed`), its value.
fn soft_embedding(b: &mut Builder, n: &Network) -> ValueId {
    let d = n.model.d_model;
    let logits_in = b.value("self_conditioning.logits".into(), Rows::Tokens, n.model.embedding_size);
    let soft = b.value("self_conditioning.soft".into(), Rows::Tokens, d);
    b.ops.push(Op::SoftEmbed { x: logits_in, table: n.tensors.embedding, scale: (d as f64).sqrt() as f32, out: soft });
    soft
}

/// The decoder's input: the canvas's embeddings plus the self-conditioning signal `soft`
/// through a GELU block, normalised without a weight.
fn self_conditioning(b: &mut Builder, n: &Network, x: ValueId, soft: ValueId) {
    let (m, t, g) = (n.model, n.tensors, n.settings);
    let (d, eps) = (m.d_model, m.rms_eps as f32);
    let [pre_norm, gate_up, down] = t.self_conditioning;
    let normed = b.value("self_conditioning.normed".into(), Rows::Tokens, d);
    let gu = b.value("self_conditioning.gate_up".into(), Rows::Tokens, 2 * g.dense_hidden as u32);
    let h = b.value("self_conditioning.hidden".into(), Rows::Tokens, g.dense_hidden as u32);
    let out = b.value("self_conditioning.out".into(), Rows::Tokens, d);
    b.ops.extend([
        Op::RmsNorm { x: soft, weight: pre_norm, eps, out: normed },
        Op::MatMul { x: normed, weight: gate_up, out: gu },
        Op::GeluGlu { x: gu, out: h },
        Op::MatMul { x: h, weight: down, out },
        Op::Add { acc: x, x: out },
        Op::NormHeads { x, first_head: 0, heads: 1, head_dim: d, weight: None, eps },
    ]);
}

/// Layer `l`: attention, then the dense GELU feed-forward and the experts side by side, each
/// normalised, their sum normalised into the residual, the whole scaled by `layer_scalar`.
fn layer(b: &mut Builder, n: &Network, role: Role, x: ValueId, l: usize) {
    let (m, g, lt) = (n.model, n.settings, &n.tensors.layers[l]);
    let (d, eps) = (m.d_model, m.rms_eps as f32);
    let full = g.full_layers[l];
    let (hd, kvh) = if full { (g.full_head_dim, g.full_kv_heads) } else { (g.head_dim, g.kv_heads) };
    let (hd, kvh) = (hd as u32, kvh as u32);
    let (cos, sin) = n.rope[usize::from(full)];
    let heads = m.n_heads;
    let moe = m.moe.expect("DiffusionGemma has experts");
    let v = |b: &mut Builder, what: &str, cols: u32| b.value(format!("blocks.{l}.{what}"), Rows::Tokens, cols);
    let xn = v(b, "attn_in", d);
    let qkv = v(b, "qkv", (heads + 2 * kvh) * hd);
    let att = v(b, "attn", heads * hd);
    let o = v(b, "attn_proj", d);
    let o_n = v(b, "attn_normed", d);
    let [post_attn, pre_ff, post_ff_1, pre_ff_2, post_ff_2, post_ff] = lt.norms;
    b.ops.extend([
        Op::RmsNorm { x, weight: lt.input_norm, eps, out: xn },
        Op::MatMul { x: xn, weight: lt.qkv, out: qkv },
        Op::NormHeads { x: qkv, first_head: 0, heads, head_dim: hd, weight: Some(lt.q_norm), eps },
        Op::NormHeads { x: qkv, first_head: heads, heads: kvh, head_dim: hd, weight: Some(lt.k_norm), eps },
        Op::NormHeads { x: qkv, first_head: heads + kvh, heads: kvh, head_dim: hd, weight: None, eps },
        Op::RopeHeads { x: qkv, heads: heads + kvh, head_dim: hd, cos, sin },
        Op::WindowAttention { qkv, out: att, heads, kv_heads: kvh, head_dim: hd, layer: l as u32, scale: 1.0, window: (!full).then_some(g.sliding_window as u32) },
        Op::MatMul { x: att, weight: lt.attn_out, out: o },
        Op::RmsNorm { x: o, weight: post_attn, eps, out: o_n },
        Op::Add { acc: x, x: o_n },
    ]);
    // The experts, routed on the un-normalised residual (its norm has no weight; the router's
    // scale and 1/sqrt(d) follow it), then the dense feed-forward beside them: the router
    // and the experts adjacent, so that an NPU runs them on the host between two executables
    // that hand over nothing but the residual and the experts' input and sum
    // (`llada_ir::npu::piece_roles`; the sum of the two branches is the same either way).
    let r_in = v(b, "router_in", d);
    let r_logits = v(b, "router_logits", moe.experts);
    let route = v(b, "route", 2 * moe.top_k);
    let e_in = v(b, "experts_in", d);
    let e_out = v(b, "experts_out", d);
    let ranked = v(b, "expert_outputs", moe.top_k * d);
    let work = v(b, "expert_work", 2 * d + 3 * m.mlp_hidden);
    let f2 = v(b, "experts_normed", d);
    let f3 = v(b, "ff_sum_normed", d);
    let f_in = v(b, "ff_in", d);
    let gu = v(b, "gate_up", 2 * g.dense_hidden as u32);
    let h = v(b, "hidden", g.dense_hidden as u32);
    let f = v(b, "ff_out", d);
    let f1 = v(b, "ff_normed", d);
    let scalar = n.layer_scalars[l][usize::from(role == Role::Encoder)];
    b.ops.extend([
        Op::RmsNorm { x, weight: lt.router_scale, eps, out: r_in },
        Op::Scale { x: r_in, factor: (d as f64).powf(-0.5) as f32 },
        Op::MatMul { x: r_in, weight: lt.router, out: r_logits },
        Op::RmsNorm { x, weight: pre_ff_2, eps, out: e_in },
        Op::RouteScaled { logits: r_logits, expert_scale: lt.expert_scale, top_k: moe.top_k, out: route },
        Op::MoeExperts { x: e_in, route, out: e_out, layer: l as u32, first: lt.first_expert, experts: moe.experts, ranked, work },
        Op::RmsNorm { x, weight: pre_ff, eps, out: f_in },
        Op::MatMul { x: f_in, weight: lt.gate_up, out: gu },
        Op::GeluGlu { x: gu, out: h },
        Op::MatMul { x: h, weight: lt.down, out: f },
        Op::RmsNorm { x: f, weight: post_ff_1, eps, out: f1 },
        Op::RmsNorm { x: e_out, weight: post_ff_2, eps, out: f2 },
        Op::Add { acc: f1, x: f2 },
        Op::RmsNorm { x: f1, weight: post_ff, eps, out: f3 },
        Op::Add { acc: x, x: f3 },
        Op::Scale { x, factor: scalar },
    ]);
}
