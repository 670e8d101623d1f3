//! LLaDA-MoE in burn, written from `modeling_lladamoe.py`'s definitions and independent of the
//! runtime's kernels: RMSNorm on q and k per head before half-split rotary, bidirectional
//! attention with grouped key/value heads, and a mixture-of-experts SwiGLU whose router takes
//! the softmax over every expert in f32, keeps the top k (not renormalised) and adds each
//! chosen expert's output times its probability, in increasing expert id. Every expert is
//! computed over every token and weighted by zero where it was not chosen: slow, and plainly
//! the definition.

use std::path::Path;

use burn::tensor::{activation, Device, Int, Tensor, TensorData};

use crate::checkpoint::Shape;
use crate::reference::{load_tensors, rope_tables, rotate};

pub struct Expert {
    pub gate: Tensor<2>,
    pub up: Tensor<2>,
    pub down: Tensor<2>,
}

pub struct Layer {
    pub input_norm: Tensor<1>,
    pub q: Tensor<2>,
    pub k: Tensor<2>,
    pub v: Tensor<2>,
    pub o: Tensor<2>,
    pub q_norm: Tensor<1>,
    pub k_norm: Tensor<1>,
    pub post_norm: Tensor<1>,
    /// The router, `[experts, d]`.
    pub router: Tensor<2>,
    pub experts: Vec<Expert>,
}

pub struct LladaMoe {
    pub embed: Tensor<2>,
    pub layers: Vec<Layer>,
    pub norm: Tensor<1>,
    pub lm_head: Tensor<2>,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub top_k: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
}

fn rms_norm<const D: usize>(x: Tensor<D>, weight: &Tensor<1>, eps: f64) -> Tensor<D> {
    let var = x.clone().powf_scalar(2.0).mean_dim(D - 1);
    x / (var + eps).sqrt() * weight.clone().unsqueeze::<D>()
}

fn linear(x: Tensor<3>, w: &Tensor<2>) -> Tensor<3> {
    x.matmul(w.clone().transpose().unsqueeze::<3>())
}

/// The top `k` of one row of probabilities: (expert, probability), largest first, ties to
/// the lower id.
fn top_k(row: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    order[..k].iter().map(|&e| (e, row[e])).collect()
}

impl LladaMoe {
    /// Logits `[1, T, vocab]` for token ids `[1, T]`.
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = ids.dims();
        assert_eq!(b, 1, "one sequence at a time");
        let device = ids.device();
        let d = self.embed.dims()[1];
        let hd = d / self.n_heads;
        let (nh, nkv) = (self.n_heads, self.n_kv_heads);
        let mut x = self.embed.clone().select(0, ids.reshape([t])).reshape([1, t, d]);
        let (cos, sin) = rope_tables(t, hd, self.rope_theta, &device);
        let group = nh / nkv;
        for l in &self.layers {
            let xn = rms_norm(x.clone(), &l.input_norm, self.rms_eps);
            // [1, T, n, hd] -> per-head norm over hd -> [1, n, T, hd].
            let heads = |y: Tensor<3>, n: usize| y.reshape([1, t, n, hd]);
            let q = rms_norm(heads(linear(xn.clone(), &l.q), nh), &l.q_norm, self.rms_eps).swap_dims(1, 2);
            let k = rms_norm(heads(linear(xn.clone(), &l.k), nkv), &l.k_norm, self.rms_eps).swap_dims(1, 2);
            let v = heads(linear(xn, &l.v), nkv).swap_dims(1, 2);
            let (q, k) = (rotate(q, &cos, &sin), rotate(k, &cos, &sin));
            let expand = |y: Tensor<4>| if group == 1 { y } else { y.unsqueeze_dim::<5>(2).repeat_dim(2, group).reshape([1, nh, t, hd]) };
            let (k, v) = (expand(k), expand(v));
            let scores = q.matmul(k.swap_dims(2, 3)) / (hd as f64).sqrt();
            let att = activation::softmax(scores, 3).matmul(v).swap_dims(1, 2).reshape([1, t, nh * hd]);
            x = x + linear(att, &l.o);

            let h = rms_norm(x.clone(), &l.post_norm, self.rms_eps);
            let probs: Vec<f32> = activation::softmax(linear(h.clone(), &l.router), 2).into_data().try_to_vec().unwrap();
            let n_experts = l.experts.len();
            // weight[e][token]: the token's probability for e if e is among its top k, else 0.
            let mut weight = vec![vec![0f32; t]; n_experts];
            for (tok, row) in probs.chunks_exact(n_experts).enumerate() {
                for (e, p) in top_k(row, self.top_k) {
                    weight[e][tok] = p;
                }
            }
            let mut out = Tensor::<3>::zeros([1, t, d], &device);
            for (e, ex) in l.experts.iter().enumerate() {
                if weight[e].iter().all(|&w| w == 0.0) {
                    continue;
                }
                let y = linear(activation::silu(linear(h.clone(), &ex.gate)) * linear(h.clone(), &ex.up), &ex.down);
                let w = Tensor::<3>::from_data(TensorData::new(weight[e].clone(), [1, t, 1]), &device);
                out = out + y * w;
            }
            x = x + out;
        }
        linear(rms_norm(x, &self.norm, self.rms_eps), &self.lm_head)
    }

    /// Loads a Hugging Face LLaDA-MoE checkpoint as f32.
    pub fn load(dir: &Path, shape: &Shape, device: &Device) -> std::io::Result<LladaMoe> {
        let moe = shape.moe().ok_or_else(|| std::io::Error::other("not a mixture-of-experts shape"))?;
        let mut store = load_tensors(dir)?;
        let mut take = |name: &str| store.remove(name).ok_or_else(|| std::io::Error::other(format!("missing tensor {name}")));
        let mut t2 = |name: &str| -> std::io::Result<Tensor<2>> {
            let (v, s) = take(name)?;
            Ok(Tensor::from_data(TensorData::new(v, [s[0], s[1]]), device))
        };
        let embed = t2("model.embed_tokens.weight")?;
        let lm_head = t2("lm_head.weight")?;
        let mut mats = Vec::new();
        for l in 0..shape.n_layers {
            let n = |p: &str| format!("model.layers.{l}.{p}.weight");
            let [q, k, v, o, router] = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate"].map(|p| t2(&n(p)));
            let experts = (0..moe.experts)
                .map(|e| {
                    let p = |w: &str| n(&format!("mlp.experts.{e}.{w}"));
                    Ok(Expert { gate: t2(&p("gate_proj"))?, up: t2(&p("up_proj"))?, down: t2(&p("down_proj"))? })
                })
                .collect::<std::io::Result<Vec<_>>>()?;
            mats.push((q?, k?, v?, o?, router?, experts));
        }
        let mut t1 = |name: &str| -> std::io::Result<Tensor<1>> {
            let (v, s) = take(name)?;
            Ok(Tensor::from_data(TensorData::new(v, [s[0]]), device))
        };
        let mut layers = Vec::new();
        for (l, (q, k, v, o, router, experts)) in mats.into_iter().enumerate() {
            let n = |p: &str| format!("model.layers.{l}.{p}.weight");
            layers.push(Layer {
                input_norm: t1(&n("input_layernorm"))?,
                q,
                k,
                v,
                o,
                q_norm: t1(&n("self_attn.q_norm"))?,
                k_norm: t1(&n("self_attn.k_norm"))?,
                post_norm: t1(&n("post_attention_layernorm"))?,
                router,
                experts,
            });
        }
        let norm = t1("model.norm.weight")?;
        Ok(LladaMoe {
            embed,
            layers,
            norm,
            lm_head,
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            top_k: moe.top_k,
            rope_theta: shape.rope_theta,
            rms_eps: 1e-5,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::top_k;

    #[test]
    fn top_k_is_largest_first_with_ties_to_the_lower_id() {
        assert_eq!(top_k(&[0.1, 0.4, 0.4, 0.1], 2), vec![(1, 0.4), (2, 0.4)]);
        assert_eq!(top_k(&[0.3, 0.1, 0.6], 1), vec![(2, 0.6)]);
    }
}
