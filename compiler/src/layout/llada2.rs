//! LLaDA 2.x's tensors (`modeling_llada2_moe.py`'s names): which checkpoint tensors become
//! which artifact tensors, and where the lowering finds them. A dense layer is two segments
//! like dense LLaDA's; an expert layer is its attention, router, expert bias and shared expert,
//! then one segment per routed expert (the unit of the expert cache), like LLaDA-MoE's.
//!
//! Partial rotary is stored, not computed: the rotated dimensions of every query and key head
//! (and of their norm weights) are permuted so that the lowering's half-split rotary over the
//! whole head, with zero frequencies on the passed dimensions, computes the published
//! `rotate_half` over the first `rotary_dim`. Scores are dot products of a query and a key
//! head, so one permutation of both leaves them unchanged; values are not permuted.

use std::borrow::Cow;
use std::ops::Range;

use llada_ir::{DType, TensorId};

use crate::error::{Error, Result};
use crate::hf::config::LladaConfig;
use crate::hf::names;
use super::{Builder, Planned, Segments, Storage};
use crate::lower::{BlockTensors, Ffn, RouteRule};

/// The source dimensions of one head, in stored order: the first half of the rotated
/// dimensions, the first half of the passed ones, the second half of the rotated, the second
/// half of the passed. Stored dimension `j < head_dim / 2` then pairs with `j + head_dim / 2`
/// as the published rotary pairs `j` with `j + rotary_dim / 2`.
pub fn rotary_order(head_dim: usize, rotary_dim: usize) -> [Range<usize>; 4] {
    let (r2, pass2) = (rotary_dim / 2, (head_dim - rotary_dim) / 2);
    [0..r2, rotary_dim..rotary_dim + pass2, r2..rotary_dim, rotary_dim + pass2..head_dim]
}

/// A head's partial rotary: of its `head_dim` dimensions, the first `rotary_dim` rotate.
#[derive(Clone, Copy)]
struct PartialRotary {
    head_dim: usize,
    rotary_dim: usize,
}

/// Tensor `name` (`shape`, `[heads * head_dim, ...]` or `[head_dim]`) with the first
/// `rotated` heads' rows in [`rotary_order`], the others as they are.
fn rotary_permuted<'c>(b: &mut Builder<'c>, name: &str, shape: &[usize], why: &str, rotated: usize, rotary: PartialRotary, dtype: DType) -> Result<Planned<'c>> {
    let PartialRotary { head_dim: hd, rotary_dim: rd } = rotary;
    let loc = b.get(name, shape, why)?;
    let mut sources = Vec::new();
    for h in 0..shape[0] / hd {
        let base = h * hd;
        if h < rotated {
            let runs = rotary_order(hd, rd);
            sources.extend(runs.into_iter().filter(|r| !r.is_empty()).map(|r| Cow::Owned(loc.rows(base + r.start..base + r.end))));
        } else {
            sources.push(Cow::Owned(loc.rows(base..base + hd)));
        }
    }
    Ok(Planned { name: name.into(), sources, dtype, shape: shape.iter().map(|&x| x as u64).collect() })
}

pub(crate) fn segments<'c>(cfg: &LladaConfig, b: &mut Builder<'c>, st: Storage) -> Result<Segments<'c>> {
    use names::moe as n;
    let (Some(moe), Some(l2)) = (cfg.moe, cfg.llada2) else { return Err(Error::Options("internal: a LLaDA 2.x config without its experts".into())) };
    let (d, hd, f, v, rd) = (cfg.dims.d_model, cfg.head_dim(), cfg.dims.mlp_hidden, cfg.dims.embedding_size, l2.rotary_dim);
    let qkv_rows = (cfg.dims.n_heads + 2 * cfg.dims.n_kv_heads) * hd;
    let rotary = PartialRotary { head_dim: hd, rotary_dim: rd };
    let why_d = format!("hidden_size {d}");
    let why_v = format!("vocab_size {v}, {why_d}");
    let why_qkv = format!("(num_attention_heads {} + 2 x num_key_value_heads {}) x head_dim {hd}, {why_d}", cfg.dims.n_heads, cfg.dims.n_kv_heads);
    let why_q = format!("num_attention_heads {} x head_dim {hd}, {why_d}", cfg.dims.n_heads);
    let why_hd = format!("head_dim {hd}");
    let why_e = format!("num_experts {}, {why_d}", moe.experts);
    let why_f = format!("moe_intermediate_size {f}, {why_d}");
    let why_dense = format!("intermediate_size {}, {why_d}", l2.dense_hidden);
    let why_shared = format!("moe_intermediate_size x num_shared_experts {}, {why_d}", l2.shared_hidden);
    let mut segments = vec![("embedding".to_string(), vec![b.single(names::LLADA2_EMBEDDING, &[v, d], &why_v, st.embedding)?])];
    let swiglu = |b: &mut Builder<'c>, gate: String, up: String, down: String, fused: String, width: usize, why: &str| -> Result<[Planned<'c>; 2]> {
        Ok([b.fused(fused, &[(&gate, [width, d], why), (&up, [width, d], why)], st.matrix)?, b.single(&down, &[d, width], why, st.matrix)?])
    };
    for l in 0..cfg.dims.n_layers {
        let p = |part: &str| n::layer(l, part);
        let mut attn = vec![
            b.single(&p("input_layernorm"), &[d], &why_d, DType::F32)?,
            rotary_permuted(b, &p("attention.query_key_value"), &[qkv_rows, d], &why_qkv, cfg.dims.n_heads + cfg.dims.n_kv_heads, rotary, st.matrix)?,
        ];
        if cfg.qk_norm {
            attn.push(rotary_permuted(b, &p("attention.query_layernorm"), &[hd], &why_hd, 1, rotary, DType::F32)?);
            attn.push(rotary_permuted(b, &p("attention.key_layernorm"), &[hd], &why_hd, 1, rotary, DType::F32)?);
        }
        attn.push(b.single(&p("attention.dense"), &[d, cfg.dims.n_heads * hd], &why_q, st.matrix)?);
        attn.push(b.single(&p("post_attention_layernorm"), &[d], &why_d, DType::F32)?);
        let mlp = |part: &str| p(&format!("mlp.{part}"));
        if l < l2.dense_layers {
            segments.push((format!("blocks.{l}.attn"), attn));
            let ffn = swiglu(b, mlp("gate_proj"), mlp("up_proj"), mlp("down_proj"), mlp("gate_up_proj"), l2.dense_hidden, &why_dense)?;
            segments.push((format!("blocks.{l}.ffn"), ffn.into()));
            continue;
        }
        // The router and its bias stay f32 whatever the experts' storage (as LLaDA-MoE's).
        attn.push(b.single(&mlp("gate"), &[moe.experts, d], &why_e, DType::PanelF32)?);
        attn.push(b.single(&n::expert_bias(l), &[moe.experts], &why_e, DType::F32)?);
        if l2.shared_hidden > 0 {
            let s = |part: &str| mlp(&format!("shared_experts.{part}"));
            attn.extend(swiglu(b, s("gate_proj"), s("up_proj"), s("down_proj"), s("gate_up_proj"), l2.shared_hidden, &why_shared)?);
        }
        segments.push((format!("blocks.{l}.attn"), attn));
        for e in 0..moe.experts {
            let x = |part: &str| n::expert(l, e, part);
            let expert = swiglu(b, x("gate_proj"), x("up_proj"), x("down_proj"), x("gate_up_proj"), f, &why_f)?;
            segments.push((format!("blocks.{l}.experts.{e}"), expert.into()));
        }
    }
    let lm_head = match l2.tie_embeddings {
        // The embedding, read again as the head's matrix.
        true => Planned { name: n::HEAD.into(), sources: vec![Cow::Borrowed(b.get(names::LLADA2_EMBEDDING, &[v, d], &why_v)?)], dtype: st.matrix, shape: vec![v as u64, d as u64] },
        false => b.single(n::HEAD, &[v, d], &why_v, st.matrix)?,
    };
    segments.push(("head".into(), vec![b.single(n::FINAL_NORM, &[d], &why_d, DType::F32)?, lm_head]));
    Ok(segments)
}

/// Transformer block `l`'s tensor ids from segment `seg` on (as [`segments`] laid them out);
/// returns the segment after it. Expert segments are appended to `expert_segments`.
pub(crate) fn block(ids: &[Vec<TensorId>], seg: usize, l: usize, cfg: &LladaConfig, blocks: &mut Vec<BlockTensors>, expert_segments: &mut Vec<u32>) -> Result<usize> {
    let (Some(moe), Some(l2)) = (cfg.moe, cfg.llada2) else { return Err(Error::Options("internal: a LLaDA 2.x config without its experts".into())) };
    let a = &ids[seg];
    let (qk_norm, rest) = if cfg.qk_norm { (Some((a[2], a[3])), &a[4..]) } else { (None, &a[2..]) };
    let (attn_out, ff_norm) = (rest[0], rest[1]);
    if l < l2.dense_layers {
        let f = &ids[seg + 1];
        blocks.push(BlockTensors { attn_norm: a[0], qkv: a[1], qkv_bias: None, qk_norm, attn_out, ff_norm, ffn: Ffn::Dense { gate_up: f[0], ff_out: f[1], hidden: l2.dense_hidden as u32 } });
        return Ok(seg + 2);
    }
    let rule = RouteRule::Sigmoid { bias: rest[3], groups: l2.groups as u32, top_groups: l2.top_groups as u32, normalize: l2.normalize, scale: l2.scale as f32 };
    let shared = (l2.shared_hidden > 0).then(|| (rest[4], rest[5], l2.shared_hidden as u32));
    let first = ids[seg + 1][0];
    for e in 0..moe.experts {
        // The MoE op names expert e's matrices by position from the first.
        if ids[seg + 1 + e] != [first + 2 * e as u32, first + 2 * e as u32 + 1] {
            return Err(Error::Options(format!("internal: expert {e}'s tensors are not consecutive")));
        }
        expert_segments.push((seg + 1 + e) as u32);
    }
    blocks.push(BlockTensors { attn_norm: a[0], qkv: a[1], qkv_bias: None, qk_norm, attn_out, ff_norm, ffn: Ffn::Moe { router: rest[2], first, rule, shared } });
    Ok(seg + 1 + moe.experts)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored order pairs dimension j with j + head_dim / 2 exactly where the published
    /// rotary pairs j with j + rotary_dim / 2, and keeps every dimension once.
    #[test]
    fn the_rotary_order_pairs_what_rotate_half_pairs() {
        for (hd, rd) in [(8, 4), (128, 64), (16, 16), (12, 4)] {
            let order: Vec<usize> = rotary_order(hd, rd).into_iter().flatten().collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..hd).collect::<Vec<_>>());
            for j in 0..hd / 2 {
                let (a, b) = (order[j], order[j + hd / 2]);
                match j < rd / 2 {
                    true => assert_eq!((a, b), (j, j + rd / 2), "hd {hd} rd {rd}"),
                    false => assert!(a >= rd && b >= rd, "hd {hd} rd {rd}: a passed pair"),
                }
            }
        }
    }
}
