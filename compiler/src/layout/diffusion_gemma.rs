//! DiffusionGemma's tensors (transformers' `modeling_diffusion_gemma.py` names, stored under
//! `model.decoder.*`; the encoder shares them, except each layer's `layer_scalar`, which is a
//! constant of the lowering): which checkpoint tensors become which artifact tensors. A layer
//! is its attention, dense feed-forward, router and norms, then one segment per expert (the
//! unit of the expert cache), like LLaDA-MoE's. A full-attention layer has no value
//! projection: its values are its keys before their norm, so its fused `[q | k | v]` matrix
//! holds the key projection twice. The experts are stored as 3-D tensors, `[experts, rows,
//! d]`; each expert's rows are a matrix of its own. The head is the embedding, read again.

use std::borrow::Cow;

use llada_ir::{DType, TensorId};

use super::{Builder, Planned, Segments, Storage};
use crate::error::{Error, Result};
use crate::hf::checkpoint::Checkpoint;
use crate::hf::config::LladaConfig;
use crate::hf::config_diffusion_gemma::DiffusionGemmaSettings;

pub const EMBEDDING: &str = "model.decoder.embed_tokens.weight";
const FINAL_NORM: &str = "model.decoder.norm.weight";

fn layer(l: usize, part: &str) -> String {
    format!("model.decoder.layers.{l}.{part}")
}

fn self_conditioning(part: &str) -> String {
    format!("model.decoder.self_conditioning.{part}")
}

/// The `layer_scalar` of layer `l`: the decoder's, or the encoder's (stored apart).
pub fn layer_scalar_name(l: usize, encoder: bool) -> String {
    match encoder {
        true => format!("model.encoder.language_model.layers.{l}.layer_scalar"),
        false => layer(l, "layer_scalar"),
    }
}

/// The norms of a layer after its attention projection, in stored order.
const LAYER_NORMS: [&str; 6] = ["post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2", "post_feedforward_layernorm"];

fn settings(cfg: &LladaConfig) -> Result<&DiffusionGemmaSettings> {
    cfg.diffusion_gemma.as_ref().ok_or_else(|| Error::Options("internal: a DiffusionGemma layout without its settings".into()))
}

pub(crate) fn segments<'c>(cfg: &LladaConfig, b: &mut Builder<'c>, st: Storage) -> Result<Segments<'c>> {
    let g = settings(cfg)?;
    let Some(moe) = cfg.moe else { return Err(Error::Options("internal: a DiffusionGemma config without its experts".into())) };
    let (d, v, fe, fd) = (cfg.dims.d_model, cfg.dims.embedding_size, cfg.dims.mlp_hidden, g.dense_hidden);
    let why_d = format!("hidden_size {d}");
    let why_v = format!("vocab_size {v}, {why_d}");
    let why_dense = format!("intermediate_size {fd}, {why_d}");
    let why_e = format!("num_experts {}, {why_d}", moe.experts);
    let mut segments = vec![("embedding".to_string(), vec![b.single(EMBEDDING, &[v, d], &why_v, st.embedding)?])];
    let glu = |b: &mut Builder<'c>, name: &dyn Fn(&str) -> String, why: &str| -> Result<[Planned<'c>; 2]> {
        let (gate, up) = (name("gate_proj.weight"), name("up_proj.weight"));
        Ok([b.fused(name("gate_up_proj.weight"), &[(&gate, [fd, d], why), (&up, [fd, d], why)], st.matrix)?, b.single(&name("down_proj.weight"), &[d, fd], why, st.matrix)?])
    };
    for (l, &full) in g.full_layers.iter().enumerate() {
        let (hd, kvh) = if full { (g.full_head_dim, g.full_kv_heads) } else { (g.head_dim, cfg.dims.n_kv_heads) };
        let p = |part: &str| layer(l, part);
        let why_q = format!("num_attention_heads {} x head dim {hd}, {why_d}", cfg.dims.n_heads);
        let why_k = format!("{kvh} key heads x head dim {hd}, {why_d}");
        let (q, k) = (p("self_attn.q_proj.weight"), p("self_attn.k_proj.weight"));
        // A full layer's values are its keys (no v_proj): the key projection again.
        let v_name = if full { k.clone() } else { p("self_attn.v_proj.weight") };
        let qkv = b.fused(p("self_attn.qkv_proj.weight"), &[(&q, [cfg.dims.n_heads * hd, d], &why_q), (&k, [kvh * hd, d], &why_k), (&v_name, [kvh * hd, d], &why_k)], st.matrix)?;
        let mut attn = vec![
            b.single(&p("input_layernorm.weight"), &[d], &why_d, DType::F32)?,
            qkv,
            b.single(&p("self_attn.q_norm.weight"), &[hd], &format!("head dim {hd}"), DType::F32)?,
            b.single(&p("self_attn.k_norm.weight"), &[hd], &format!("head dim {hd}"), DType::F32)?,
            b.single(&p("self_attn.o_proj.weight"), &[d, cfg.dims.n_heads * hd], &why_q, st.matrix)?,
        ];
        for norm in LAYER_NORMS {
            attn.push(b.single(&p(&format!("{norm}.weight")), &[d], &why_d, DType::F32)?);
        }
        attn.extend(glu(b, &|part| p(&format!("mlp.{part}")), &why_dense)?);
        // The router stays f32 whatever the experts' storage (as LLaDA-MoE's).
        attn.push(b.single(&p("router.proj.weight"), &[moe.experts, d], &why_e, DType::PanelF32)?);
        attn.push(b.single(&p("router.scale"), &[d], &why_d, DType::F32)?);
        attn.push(b.single(&p("router.per_expert_scale"), &[moe.experts], &why_e, DType::F32)?);
        for encoder in [false, true] {
            b.get(&layer_scalar_name(l, encoder), &[1], "one scalar per layer")?;
        }
        segments.push((format!("blocks.{l}.attn"), attn));
        let why_x = format!("num_experts {} x (2 x moe_intermediate_size {fe}) x {why_d}", moe.experts);
        let gate_up = b.get(&p("experts.gate_up_proj"), &[moe.experts, 2 * fe, d], &why_x)?;
        let down = b.get(&p("experts.down_proj"), &[moe.experts, d, fe], &format!("num_experts {} x {why_d} x moe_intermediate_size {fe}", moe.experts))?;
        for e in 0..moe.experts {
            let expert = |loc: &crate::hf::checkpoint::TensorLocation, name: &str, shape: [usize; 2]| Planned {
                name: p(&format!("experts.{e}.{name}")),
                sources: vec![Cow::Owned(loc.rows(e..e + 1))],
                dtype: st.matrix,
                shape: shape.iter().map(|&x| x as u64).collect(),
            };
            segments.push((format!("blocks.{l}.experts.{e}"), vec![expert(gate_up, "gate_up_proj", [2 * fe, d]), expert(down, "down_proj", [d, fe])]));
        }
    }
    let mut sc = vec![b.single(&self_conditioning("pre_norm.weight"), &[d], &why_d, DType::F32)?];
    sc.extend(glu(b, &|part| self_conditioning(part), &why_dense)?);
    segments.push(("self_conditioning".into(), sc));
    let lm_head = Planned { name: "lm_head.weight".into(), sources: vec![Cow::Borrowed(b.get(EMBEDDING, &[v, d], &why_v)?)], dtype: st.matrix, shape: vec![v as u64, d as u64] };
    segments.push(("head".into(), vec![b.single(FINAL_NORM, &[d], &why_d, DType::F32)?, lm_head]));
    Ok(segments)
}

/// One layer's tensor ids, as [`segments`] laid them out.
#[derive(Debug, Clone, Copy)]
pub struct LayerTensors {
    pub input_norm: TensorId,
    pub qkv: TensorId,
    pub q_norm: TensorId,
    pub k_norm: TensorId,
    pub attn_out: TensorId,
    /// [`LAYER_NORMS`], in that order.
    pub norms: [TensorId; 6],
    pub gate_up: TensorId,
    pub down: TensorId,
    pub router: TensorId,
    pub router_scale: TensorId,
    pub expert_scale: TensorId,
    /// Expert e's `[gate | up]` is `first_expert + 2e`, its down matrix the next.
    pub first_expert: TensorId,
}

/// The network's tensor ids.
#[derive(Debug, Clone)]
pub struct NetworkTensors {
    pub embedding: TensorId,
    pub layers: Vec<LayerTensors>,
    /// The self-conditioning block: its norm, `[gate | up]` and down.
    pub self_conditioning: [TensorId; 3],
    pub final_norm: TensorId,
    pub lm_head: TensorId,
}

/// The tensor ids from the ids the writer gave each segment's tensors, and the expert
/// segments (layer-major) by writer segment index.
pub fn network(ids: &[Vec<TensorId>], cfg: &LladaConfig) -> Result<(NetworkTensors, Vec<u32>)> {
    let experts = cfg.moe.map_or(0, |m| m.experts);
    let (mut layers, mut expert_segments, mut seg) = (Vec::new(), Vec::new(), 1);
    for _ in 0..cfg.dims.n_layers {
        let a = &ids[seg];
        let first = ids[seg + 1][0];
        for e in 0..experts {
            // The MoE op names expert e's matrices by position from the first.
            if ids[seg + 1 + e] != [first + 2 * e as u32, first + 2 * e as u32 + 1] {
                return Err(Error::Options(format!("internal: expert {e}'s tensors are not consecutive")));
            }
            expert_segments.push((seg + 1 + e) as u32);
        }
        let norms = [a[5], a[6], a[7], a[8], a[9], a[10]];
        layers.push(LayerTensors { input_norm: a[0], qkv: a[1], q_norm: a[2], k_norm: a[3], attn_out: a[4], norms, gate_up: a[11], down: a[12], router: a[13], router_scale: a[14], expert_scale: a[15], first_expert: first });
        seg += 1 + experts;
    }
    let sc = &ids[seg];
    let head = &ids[seg + 1];
    Ok((NetworkTensors { embedding: ids[0][0], layers, self_conditioning: [sc[0], sc[1], sc[2]], final_norm: head[0], lm_head: head[1] }, expert_segments))
}

/// Each layer's `layer_scalar`, the decoder's and the encoder's, read from the checkpoint
/// (the lowering multiplies by them as constants).
pub fn layer_scalars(ckpt: &Checkpoint, n_layers: usize) -> Result<Vec<[f32; 2]>> {
    (0..n_layers)
        .map(|l| {
            let read = |encoder: bool| -> Result<f32> {
                let name = layer_scalar_name(l, encoder);
                let loc = ckpt.expect(&name, &[1], "one scalar per layer")?;
                let mut values = Vec::new();
                ckpt.for_each_row_chunk(loc, 64, |raw| {
                    crate::convert::to_f32(loc.dtype, raw, &mut values);
                    Ok(())
                })?;
                match values.first() {
                    Some(&x) if x.is_finite() => Ok(x),
                    other => Err(Error::Options(format!("{}: tensor '{name}' is {other:?}, not a finite scalar", ckpt.dir.display()))),
                }
            };
            Ok([read(false)?, read(true)?])
        })
        .collect()
}
