//! Which checkpoint tensors become which artifact tensors, in which segments, in file order;
//! and, once written, where the lowering finds them. Segments are the unit the window plan
//! keeps resident or stages: half a transformer block each for dense LLaDA (two slots of the
//! larger half double-buffer a layer); for LLaDA-MoE a block's attention and router, then one
//! segment per expert (the unit of the expert cache).

pub mod diffusion_gemma;
pub mod llada2;

use std::borrow::Cow;
use std::collections::HashSet;

use llada_ir::{DType, TensorId};

use crate::error::{Error, Result};
use crate::hf::checkpoint::{Checkpoint, TensorLocation};
use crate::hf::config::{Family, LladaConfig};
use crate::hf::names;
use crate::lower::{BlockTensors, Ffn, NetworkTensors, RouteRule};

/// One artifact tensor: the checkpoint tensors whose rows it concatenates (a fused matrix
/// has several), and how it is stored.
pub struct Planned<'a> {
    pub name: String,
    pub sources: Vec<Cow<'a, TensorLocation>>,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

/// The artifact's tensors by segment, in file order.
pub struct Layout<'a> {
    pub family: Family,
    pub segments: Vec<(String, Vec<Planned<'a>>)>,
    /// Checkpoint tensor names the layout reads (the others are reported as ignored).
    pub consumed: HashSet<String>,
}

/// Storage of the weights: `matrix` for projections, `embedding` for the gathered table.
#[derive(Clone, Copy)]
pub struct Storage {
    pub matrix: DType,
    pub embedding: DType,
}

pub(crate) struct Builder<'c> {
    ckpt: &'c Checkpoint,
    consumed: HashSet<String>,
}

impl<'c> Builder<'c> {
    pub(crate) fn get(&mut self, name: &str, shape: &[usize], why: &str) -> Result<&'c TensorLocation> {
        self.consumed.insert(name.to_string());
        self.ckpt.expect(name, shape, why)
    }

    pub(crate) fn single(&mut self, name: &str, shape: &[usize], why: &str, dtype: DType) -> Result<Planned<'c>> {
        Ok(Planned { name: name.into(), sources: vec![Cow::Borrowed(self.get(name, shape, why)?)], dtype, shape: shape.iter().map(|&x| x as u64).collect() })
    }

    /// Vectors `parts` concatenated into one named `name` (fused biases).
    fn fused_vector(&mut self, name: String, parts: &[(&str, usize, &str)], dtype: DType) -> Result<Planned<'c>> {
        let sources = parts.iter().map(|(n, len, why)| self.get(n, &[*len], why).map(Cow::Borrowed)).collect::<Result<Vec<_>>>()?;
        Ok(Planned { name, sources, dtype, shape: vec![parts.iter().map(|p| p.1 as u64).sum()] })
    }

    /// Rows of `parts` stacked into one matrix named `name`.
    pub(crate) fn fused(&mut self, name: String, parts: &[(&str, [usize; 2], &str)], dtype: DType) -> Result<Planned<'c>> {
        let sources = parts.iter().map(|(n, shape, why)| self.get(n, shape, why).map(Cow::Borrowed)).collect::<Result<Vec<_>>>()?;
        let rows = parts.iter().map(|p| p.1[0] as u64).sum();
        Ok(Planned { name, sources, dtype, shape: vec![rows, parts[0].1[1] as u64] })
    }
}

/// Checks every tensor the config calls for (before anything is written) and lays them out.
pub fn plan<'c>(cfg: &LladaConfig, ckpt: &'c Checkpoint, storage: Storage) -> Result<Layout<'c>> {
    let mut b = Builder { ckpt, consumed: HashSet::new() };
    let segments = match cfg.family {
        Family::Llada => dense(cfg, &mut b, storage, &LLADA)?,
        Family::LladaMoe => moe(cfg, &mut b, storage)?,
        Family::Dream => dense(cfg, &mut b, storage, &DREAM)?,
        Family::Llada2Moe => llada2::segments(cfg, &mut b, storage)?,
        Family::DiffusionGemma => diffusion_gemma::segments(cfg, &mut b, storage)?,
    };
    Ok(Layout { family: cfg.family, segments, consumed: b.consumed })
}

/// Segments of layers, in file order: `(name, tensors)`.
pub(crate) type Segments<'c> = Vec<(String, Vec<Planned<'c>>)>;

/// A dense family's checkpoint names and config keys: LLaDA's (`modeling_llada.py`) or Dream's
/// (`modeling_dream.py`, LLaDA-MoE's names with q, k and v biases).
struct DenseFamily {
    embedding: &'static str,
    final_norm: &'static str,
    lm_head: &'static str,
    /// A block's tensor: (layer, part) to its name.
    block: fn(usize, &str) -> String,
    /// The parts: attention norm, q, k, v, output, feed-forward norm, gate, up, down.
    parts: [&'static str; 9],
    /// The names of the q, k and v biases, where the family has them.
    qkv_bias: Option<fn(usize, &str) -> String>,
    /// Config keys for the errors: d_model, vocabulary, heads, kv heads, SwiGLU width.
    keys: [&'static str; 5],
}

const LLADA: DenseFamily = DenseFamily {
    embedding: names::EMBEDDING,
    final_norm: names::FINAL_NORM,
    lm_head: names::HEAD,
    block: names::block,
    parts: ["attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"],
    qkv_bias: None,
    keys: ["d_model", "embedding_size", "n_heads", "n_kv_heads", "mlp_hidden_size"],
};

/// Dream: the q, k and v biases fused as the projections are (`[q | k | v]`), stored f32
/// (they are added to f32 rows).
const DREAM: DenseFamily = DenseFamily {
    embedding: names::moe::EMBEDDING,
    final_norm: names::moe::FINAL_NORM,
    lm_head: names::moe::HEAD,
    block: names::moe::layer,
    parts: [
        "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    ],
    qkv_bias: Some(names::moe::layer_bias),
    keys: ["hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "intermediate_size"],
};

fn dense<'c>(cfg: &LladaConfig, b: &mut Builder<'c>, st: Storage, fam: &DenseFamily) -> Result<Vec<(String, Vec<Planned<'c>>)>> {
    let (d, hd, f, v) = (cfg.dims.d_model, cfg.head_dim(), cfg.dims.mlp_hidden, cfg.dims.embedding_size);
    let (q_dim, kv_dim) = (cfg.dims.n_heads * hd, cfg.dims.n_kv_heads * hd);
    let [key_d, key_v, key_h, key_kv, key_f] = fam.keys;
    let why_d = format!("{key_d} {d}");
    let why_v = format!("{key_v} {v}, {why_d}");
    let why_q = format!("{key_h} {} x head_dim {hd}, {why_d}", cfg.dims.n_heads);
    let why_kv = format!("{key_kv} {} x head_dim {hd}, {why_d}", cfg.dims.n_kv_heads);
    let why_f = format!("{key_f} {f}, {why_d}");
    let [attn_norm, q, k, vp, o, ff_norm, gate, up, down] = fam.parts;
    let mut segments = vec![("embedding".to_string(), vec![b.single(fam.embedding, &[v, d], &why_v, st.embedding)?])];
    for l in 0..cfg.dims.n_layers {
        let n = |part: &str| (fam.block)(l, part);
        // The fused names: the parts' with `qkv_proj` and `gate_up_proj` for the last word.
        let fused = |part: &str, whole: &str| n(&part.replace(part.rsplit('.').next().unwrap_or(part), whole));
        let mut attn = vec![
            b.single(&n(attn_norm), &[d], &why_d, DType::F32)?,
            b.fused(fused(q, "qkv_proj"), &[(&n(q), [q_dim, d], &why_q), (&n(k), [kv_dim, d], &why_kv), (&n(vp), [kv_dim, d], &why_kv)], st.matrix)?,
        ];
        if let Some(bias) = fam.qkv_bias {
            let (bq, bk, bv) = (bias(l, q), bias(l, k), bias(l, vp));
            attn.push(b.fused_vector(bias(l, &q.replace("q_proj", "qkv_proj")), &[(&bq, q_dim, &why_q), (&bk, kv_dim, &why_kv), (&bv, kv_dim, &why_kv)], DType::F32)?);
        }
        attn.push(b.single(&n(o), &[d, q_dim], &why_q, st.matrix)?);
        segments.push((format!("blocks.{l}.attn"), attn));
        segments.push((
            format!("blocks.{l}.ffn"),
            vec![
                b.single(&n(ff_norm), &[d], &why_d, DType::F32)?,
                b.fused(fused(gate, "gate_up_proj"), &[(&n(gate), [f, d], &why_f), (&n(up), [f, d], &why_f)], st.matrix)?,
                b.single(&n(down), &[d, f], &why_f, st.matrix)?,
            ],
        ));
    }
    segments.push(("head".into(), vec![b.single(fam.final_norm, &[d], &why_d, DType::F32)?, b.single(fam.lm_head, &[v, d], &why_v, st.matrix)?]));
    Ok(segments)
}

fn moe<'c>(cfg: &LladaConfig, b: &mut Builder<'c>, st: Storage) -> Result<Vec<(String, Vec<Planned<'c>>)>> {
    use names::moe as n;
    let moe = cfg.moe.expect("an MoE config has experts");
    let (d, hd, f, v) = (cfg.dims.d_model, cfg.head_dim(), cfg.dims.mlp_hidden, cfg.dims.embedding_size);
    let (q_dim, kv_dim) = (cfg.dims.n_heads * hd, cfg.dims.n_kv_heads * hd);
    let why_d = format!("hidden_size {d}");
    let why_v = format!("vocab_size {v}, {why_d}");
    let why_q = format!("num_attention_heads {} x head_dim {hd}, {why_d}", cfg.dims.n_heads);
    let why_kv = format!("num_key_value_heads {} x head_dim {hd}, {why_d}", cfg.dims.n_kv_heads);
    let why_hd = format!("head_dim {hd}");
    let why_e = format!("num_experts {}, {why_d}", moe.experts);
    let why_f = format!("expert_intermediate_size {f}, {why_d}");
    let mut segments = vec![("embedding".to_string(), vec![b.single(n::EMBEDDING, &[v, d], &why_v, st.embedding)?])];
    for l in 0..cfg.dims.n_layers {
        let p = |part: &str| n::layer(l, part);
        let mut attn = vec![
            b.single(&p("input_layernorm"), &[d], &why_d, DType::F32)?,
            b.fused(p("self_attn.qkv_proj"), &[(&p("self_attn.q_proj"), [q_dim, d], &why_q), (&p("self_attn.k_proj"), [kv_dim, d], &why_kv), (&p("self_attn.v_proj"), [kv_dim, d], &why_kv)], st.matrix)?,
        ];
        if cfg.qk_norm {
            attn.push(b.single(&p("self_attn.q_norm"), &[hd], &why_hd, DType::F32)?);
            attn.push(b.single(&p("self_attn.k_norm"), &[hd], &why_hd, DType::F32)?);
        }
        attn.push(b.single(&p("self_attn.o_proj"), &[d, q_dim], &why_q, st.matrix)?);
        attn.push(b.single(&p("post_attention_layernorm"), &[d], &why_d, DType::F32)?);
        // The router stays f32 whatever the experts' storage: a rounded router would pick
        // other experts for near-tied tokens, a discrete change no later layer smooths out.
        attn.push(b.single(&p("mlp.gate"), &[moe.experts, d], &why_e, DType::PanelF32)?);
        segments.push((format!("blocks.{l}.attn"), attn));
        for e in 0..moe.experts {
            let x = |part: &str| n::expert(l, e, part);
            segments.push((
                format!("blocks.{l}.experts.{e}"),
                vec![
                    b.fused(x("gate_up_proj"), &[(&x("gate_proj"), [f, d], &why_f), (&x("up_proj"), [f, d], &why_f)], st.matrix)?,
                    b.single(&x("down_proj"), &[d, f], &why_f, st.matrix)?,
                ],
            ));
        }
    }
    segments.push(("head".into(), vec![b.single(n::FINAL_NORM, &[d], &why_d, DType::F32)?, b.single(n::HEAD, &[v, d], &why_v, st.matrix)?]));
    Ok(segments)
}

impl Layout<'_> {
    /// The network's tensor ids, from the ids the writer gave each segment's tensors (in
    /// layout order), and the expert segments (layer-major) by writer segment index.
    pub fn network(&self, ids: &[Vec<TensorId>], cfg: &LladaConfig, rope: (TensorId, TensorId)) -> Result<(NetworkTensors, Vec<u32>)> {
        let mut blocks = Vec::new();
        let mut expert_segments = Vec::new();
        let mut seg = 1;
        for _ in 0..cfg.dims.n_layers {
            match self.family {
                Family::Llada => {
                    let (a, f) = (&ids[seg], &ids[seg + 1]);
                    blocks.push(BlockTensors { attn_norm: a[0], qkv: a[1], qkv_bias: None, qk_norm: None, attn_out: a[2], ff_norm: f[0], ffn: Ffn::Dense { gate_up: f[1], ff_out: f[2], hidden: cfg.dims.mlp_hidden as u32 } });
                    seg += 2;
                }
                Family::Dream => {
                    let (a, f) = (&ids[seg], &ids[seg + 1]);
                    blocks.push(BlockTensors { attn_norm: a[0], qkv: a[1], qkv_bias: Some(a[2]), qk_norm: None, attn_out: a[3], ff_norm: f[0], ffn: Ffn::Dense { gate_up: f[1], ff_out: f[2], hidden: cfg.dims.mlp_hidden as u32 } });
                    seg += 2;
                }
                Family::LladaMoe => {
                    let a = &ids[seg];
                    let experts = cfg.moe.expect("an MoE config has experts").experts;
                    let (qk_norm, rest) = if cfg.qk_norm { (Some((a[2], a[3])), &a[4..]) } else { (None, &a[2..]) };
                    let first = ids[seg + 1][0];
                    for e in 0..experts {
                        // The MoE op names expert e's matrices by position from the first.
                        if ids[seg + 1 + e] != [first + 2 * e as u32, first + 2 * e as u32 + 1] {
                            return Err(Error::Options(format!("internal: expert {e}'s tensors are not consecutive")));
                        }
                        expert_segments.push((seg + 1 + e) as u32);
                    }
                    blocks.push(BlockTensors { attn_norm: a[0], qkv: a[1], qkv_bias: None, qk_norm, attn_out: rest[0], ff_norm: rest[1], ffn: Ffn::Moe { router: rest[2], first, rule: RouteRule::Softmax, shared: None } });
                    seg += 1 + experts;
                }
                Family::Llada2Moe => seg = llada2::block(ids, seg, blocks.len(), cfg, &mut blocks, &mut expert_segments)?,
                // Its own network and lowering (`diffusion_gemma::network`).
                Family::DiffusionGemma => return Err(Error::Options("internal: DiffusionGemma's tensors are not LLaDA's network".into())),
            }
        }
        let lm_head = &ids[seg];
        let net = NetworkTensors { embedding: ids[0][0], blocks, final_norm: lm_head[0], lm_head: lm_head[1], rope_cos: rope.0, rope_sin: rope.1 };
        Ok((net, expert_segments))
    }
}
