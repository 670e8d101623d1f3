//! What llama.cpp's converter (`convert_hf_to_gguf.py`, `conversion/llada.py` and `dream.py`)
//! writes for the three diffusion architectures it knows, read back into the Hugging Face
//! config and tensor names the rest of the compiler uses: `llada` (LLaDA-8B's
//! `LLaDAModelLM`), `llada-moe` (`LLaDAMoEModelLM`) and `dream` (`DreamModel`).

use std::collections::BTreeMap;
use std::path::Path;

use super::container::{TensorInfo, Value};
use crate::error::{Error, Result};
use crate::hf::config::{DimKeys, Family, LladaConfig, MoeSettings, NetworkDims, TokenIds};
use crate::hf::names;

/// The `general.architecture` names read, with their family.
pub const ARCHITECTURES: &[(&str, Family)] = &[("llada", Family::Llada), ("llada-moe", Family::LladaMoe), ("dream", Family::Dream)];

/// Typed access to the metadata, every error naming the key.
pub struct Meta<'a> {
    pub path: &'a Path,
    pub kvs: &'a BTreeMap<String, Value>,
}

impl Meta<'_> {
    pub fn err(&self, key: &str, msg: impl Into<String>) -> Error {
        Error::Gguf { path: self.path.to_path_buf(), what: key.to_string(), msg: msg.into() }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.kvs.get(key)
    }

    pub fn uint(&self, key: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.err(key, format!("expected a non-negative integer, found {}", v.described()))),
        }
    }

    /// A count or width: a positive integer below 2^32 (the artifact stores widths in 32 bits).
    pub fn size(&self, key: &str) -> Result<Option<usize>> {
        match self.uint(key)? {
            Some(0) => Err(self.err(key, "is 0")),
            Some(n) if n > u32::MAX as u64 => Err(self.err(key, format!("{n} is more than 32 bits"))),
            n => Ok(n.map(|n| n as usize)),
        }
    }

    pub fn required(&self, key: &str) -> Result<usize> {
        self.size(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    pub fn token(&self, key: &str) -> Result<Option<u32>> {
        match self.uint(key)? {
            Some(n) if n > u32::MAX as u64 => Err(self.err(key, format!("token id {n} is more than 32 bits"))),
            n => Ok(n.map(|n| n as u32)),
        }
    }

    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Float(x, _)) if x.is_finite() && *x >= 0.0 => Ok(Some(*x)),
            Some(v) => Err(self.err(key, format!("expected a finite non-negative float, found {}", v.described()))),
        }
    }

    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, format!("expected a bool, found {}", v.described()))),
        }
    }

    pub fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(key, format!("expected a string, found {}", v.described()))),
        }
    }
}

/// The family of `general.architecture`, or an error naming the key and what is read.
pub fn family(m: &Meta) -> Result<(Family, &'static str)> {
    let arch = m.str("general.architecture")?.ok_or_else(|| m.err("general.architecture", "missing (is this the first file of a split GGUF?)"))?;
    ARCHITECTURES.iter().find(|(a, _)| *a == arch).map(|&(a, f)| (f, a)).ok_or_else(|| {
        let known: Vec<&str> = ARCHITECTURES.iter().map(|a| a.0).collect();
        m.err("general.architecture", format!("\"{arch}\" is not a diffusion architecture lladac reads (it reads {})", known.join(", ")))
    })
}

/// The config the metadata describes; `tensors` (by GGUF name) give the embedding's rows and
/// whether LLaDA-MoE has its q/k norms.
pub fn config(m: &Meta, tensors: &BTreeMap<String, TensorInfo>) -> Result<(LladaConfig, Vec<String>)> {
    let (family, arch) = family(m)?;
    let key = |k: &str| format!("{arch}.{k}");
    let d_model = m.required(&key("embedding_length"))?;
    let n_heads = m.required(&key("attention.head_count"))?;
    let rope_theta = m.float(&key("rope.freq_base"))?.unwrap_or(10000.0);
    if rope_theta <= 0.0 {
        return Err(m.err(&key("rope.freq_base"), "is 0"));
    }
    let embd = tensors.get("token_embd.weight").ok_or_else(|| m.err("token_embd.weight", "tensor missing"))?;
    if embd.ne.len() != 2 || embd.ne[0] != d_model as u64 {
        return Err(m.err("token_embd.weight", format!("dimensions {:?}, expected [{d_model}, rows] ({} {d_model})", embd.ne, key("embedding_length"))));
    }
    let tokens = match m.get("tokenizer.ggml.tokens") {
        Some(Value::Array(t)) => t.len(),
        _ => return Err(m.err("tokenizer.ggml.tokens", "missing or not an array")),
    };
    // The blocks the tensors hold bound the count before anything is sized by it.
    let n_layers = m.required(&key("block_count"))?;
    let blocks = tensors.keys().filter_map(|n| n.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok()).max().map_or(0, |last| last + 1);
    if n_layers > blocks {
        let held = if blocks == 0 { "no block's tensors (blk.N.*)".to_string() } else { format!("the tensors of {blocks} (blk.0 to blk.{})", blocks - 1) };
        return Err(m.err(&key("block_count"), format!("{n_layers} blocks, but the file holds {held}")));
    }
    let dims = NetworkDims {
        d_model,
        n_layers,
        n_heads,
        n_kv_heads: m.size(&key("attention.head_count_kv"))?.unwrap_or(n_heads),
        mlp_hidden: match family {
            Family::LladaMoe => m.required(&key("expert_feed_forward_length"))?,
            _ => m.required(&key("feed_forward_length"))?,
        },
        vocab_size: m.size(&key("vocab_size"))?.unwrap_or(tokens),
        embedding_size: embd.ne[1] as usize,
        max_sequence_length: m.required(&key("context_length"))?,
        rope_theta,
        rms_eps: m.float(&key("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| m.err(&key("attention.layer_norm_rms_epsilon"), "missing"))?,
    };
    const TOKEN_KEYS: [&str; 4] = ["tokenizer.ggml.mask_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"];
    let ids = TokenIds {
        mask: m.token(TOKEN_KEYS[0])?.ok_or_else(|| m.err(TOKEN_KEYS[0], "missing; the sampler needs the mask token"))?,
        bos: m.token(TOKEN_KEYS[1])?,
        eos: m.token(TOKEN_KEYS[2])?,
        pad: m.token(TOKEN_KEYS[3])?,
    };
    let (heads_key, kv_key) = (key("attention.head_count"), key("attention.head_count_kv"));
    let embedding_key = key("embedding_length");
    let keys = DimKeys { d_model: &embedding_key, heads: &heads_key, kv_heads: &kv_key, embedding: "token_embd.weight", tokens: TOKEN_KEYS };
    dims.check(&ids, &keys).map_err(|(k, msg)| m.err(&k, msg))?;
    let hd = d_model / n_heads;
    for k in ["rope.dimension_count", "attention.key_length", "attention.value_length"] {
        if let Some(n) = m.size(&key(k))? {
            if n != hd {
                return Err(m.err(&key(k), format!("{n}, but the head width is {hd}: partial rotary or a separate head width is not implemented")));
            }
        }
    }
    if m.bool(&key("attention.causal"))? == Some(true) {
        return Err(m.err(&key("attention.causal"), "true: these models attend both ways"));
    }
    // Dream shifts its logits by one position (the converter writes no key for it); LLaDA's
    // families do not, and say so.
    let shift = m.bool("diffusion.shift_logits")?;
    if shift.is_some_and(|s| s != (family == Family::Dream)) {
        return Err(m.err("diffusion.shift_logits", format!("{shift:?} does not match {arch}, whose logits are{} shifted", if family == Family::Dream { "" } else { " not" })));
    }
    for k in m.kvs.keys().filter(|k| k.starts_with(&key("rope.scaling."))) {
        if k != &key("rope.scaling.type") || m.str(k)? != Some("none") {
            return Err(m.err(k, "rope scaling is not supported"));
        }
    }
    let moe = match family {
        Family::LladaMoe => {
            let experts = m.required(&key("expert_count"))?;
            let top_k = m.required(&key("expert_used_count"))?;
            if top_k > experts {
                return Err(m.err(&key("expert_used_count"), format!("{top_k} is more than {} {experts}", key("expert_count"))));
            }
            if experts > llada_ir::verify::MAX_EXPERTS as usize {
                return Err(m.err(&key("expert_count"), format!("{experts} is more than the {} the artifact format allows", llada_ir::verify::MAX_EXPERTS)));
            }
            // ggml's gating function ids: 1 softmax, 2 sigmoid.
            if let Some(g) = m.uint(&key("expert_gating_func"))? {
                if g != 1 {
                    return Err(m.err(&key("expert_gating_func"), format!("{g} is not supported (only softmax, 1)")));
                }
            }
            Some(MoeSettings { experts, top_k })
        }
        _ => None,
    };
    let qk_norm = family == Family::LladaMoe && tensors.contains_key("blk.0.attn_q_norm.weight");
    let cfg = LladaConfig { qk_norm, moe, ..LladaConfig::plain(family, dims, ids) };
    Ok((cfg, Vec::new()))
}

/// Where a checkpoint tensor's rows come from in the GGUF: a tensor, a run of its rows (one
/// expert of a stacked tensor), and whether the rows are LLaDA's rotary-permuted q/k rows
/// (`heads` heads) to be put back in Hugging Face's order.
pub struct Source {
    pub gguf: String,
    pub rows: Option<std::ops::Range<usize>>,
    pub unpermute_heads: Option<usize>,
}

/// The Hugging Face name of every GGUF tensor the family reads, with where it comes from.
/// GGUF tensors left out of the map are reported as unused; MoE extras llama.cpp has for
/// other models (shared experts, expert biases) are refused by name.
pub fn tensor_map(cfg: &LladaConfig, m: &Meta, tensors: &BTreeMap<String, TensorInfo>) -> Result<BTreeMap<String, Source>> {
    let plain = |g: String| Source { gguf: g, rows: None, unpermute_heads: None };
    let mut map = BTreeMap::new();
    let (embedding, final_norm, head) = match cfg.family {
        Family::Llada => (names::EMBEDDING, names::FINAL_NORM, names::HEAD),
        _ => (names::moe::EMBEDDING, names::moe::FINAL_NORM, names::moe::HEAD),
    };
    map.insert(embedding.to_string(), plain("token_embd.weight".into()));
    map.insert(final_norm.to_string(), plain("output_norm.weight".into()));
    if !tensors.contains_key("output.weight") {
        return Err(m.err("output.weight", "tensor missing: a head tied to the embedding is not supported, as from a Hugging Face checkpoint"));
    }
    map.insert(head.to_string(), plain("output.weight".into()));
    for t in tensors.keys() {
        for extra in ["_shexp", "exp_probs_b", "ffn_gate_up_exps"] {
            if t.contains(extra) {
                return Err(m.err(t, "this tensor (a shared expert, an expert bias or fused gate/up experts) is not supported"));
            }
        }
    }
    for l in 0..cfg.dims.n_layers {
        let g = |part: &str| format!("blk.{l}.{part}.weight");
        match cfg.family {
            Family::Llada => {
                let parts = [("attn_norm", "attn_norm"), ("attn_q", "q_proj"), ("attn_k", "k_proj"), ("attn_v", "v_proj"), ("attn_output", "attn_out"), ("ffn_norm", "ff_norm"), ("ffn_gate", "ff_proj"), ("ffn_up", "up_proj"), ("ffn_down", "ff_out")];
                for (gg, hf) in parts {
                    let heads = match gg {
                        "attn_q" => Some(cfg.dims.n_heads),
                        "attn_k" => Some(cfg.dims.n_kv_heads),
                        _ => None,
                    };
                    map.insert(names::block(l, hf), Source { gguf: g(gg), rows: None, unpermute_heads: heads });
                }
            }
            Family::Dream | Family::LladaMoe => {
                let mut parts = vec![("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"), ("ffn_norm", "post_attention_layernorm")];
                if cfg.family == Family::Dream {
                    parts.extend([("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")]);
                    for (gg, hf) in [("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"), ("attn_v", "self_attn.v_proj")] {
                        map.insert(names::moe::layer_bias(l, hf), plain(format!("blk.{l}.{gg}.bias")));
                    }
                } else {
                    parts.push(("ffn_gate_inp", "mlp.gate"));
                    if cfg.qk_norm {
                        parts.extend([("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm")]);
                    }
                }
                for (gg, hf) in parts {
                    map.insert(names::moe::layer(l, hf), plain(g(gg)));
                }
                if let Some(moe) = cfg.moe {
                    // Stacked [experts, out, in]: expert e is rows e*out..(e+1)*out of the
                    // (experts*out) x in matrix.
                    for (gg, hf, out) in [("ffn_gate_exps", "gate_proj", cfg.dims.mlp_hidden), ("ffn_up_exps", "up_proj", cfg.dims.mlp_hidden), ("ffn_down_exps", "down_proj", cfg.dims.d_model)] {
                        let name = g(gg);
                        match tensors.get(&name) {
                            Some(t) if t.ne.len() == 3 && t.ne[1] == out as u64 && t.ne[2] == moe.experts as u64 => {}
                            Some(t) => return Err(m.err(&name, format!("dimensions {:?}, expected [in, {out}, {}] (experts stacked)", t.ne, moe.experts))),
                            None => return Err(m.err(&name, "tensor missing")),
                        }
                        for e in 0..moe.experts {
                            map.insert(names::moe::expert(l, e, hf), Source { gguf: name.clone(), rows: Some(e * out..(e + 1) * out), unpermute_heads: None });
                        }
                    }
                }
            }
            Family::Llada2Moe | Family::DiffusionGemma => unreachable!("not a GGUF architecture"),
        }
    }
    Ok(map)
}

/// The GGUF row of each Hugging Face row of a q or k projection of `heads` heads of `hd`
/// rows: the converter (`LLaDAModel.permute`) reorders each head's rows from halves
/// `(2, hd/2)` to pairs `(hd/2, 2)`, so Hugging Face's row `a*hd/2 + b` of a head is its
/// row `2b + a`.
pub fn unpermuted_rows(heads: usize, hd: usize) -> Vec<u32> {
    let half = hd / 2;
    (0..heads * hd).map(|r| {
        let (h, i) = (r / hd, r % hd);
        let (a, b) = (i / half, i % half);
        (h * hd + 2 * b + a) as u32
    }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The converter's permutation (numpy's reshape/swapaxes, written out) then ours is the
    /// identity.
    #[test]
    fn unpermuting_inverts_the_converters_permutation() {
        let (heads, hd) = (3, 8);
        // permute: out[h, b, a] = in[h, a, b] over (heads, hd/2, 2) <- (heads, 2, hd/2).
        let permuted: Vec<usize> = (0..heads * hd).map(|r| {
            let (h, i) = (r / hd, r % hd);
            let (b, a) = (i / 2, i % 2);
            h * hd + a * hd / 2 + b
        }).collect();
        let order = unpermuted_rows(heads, hd);
        let back: Vec<usize> = order.iter().map(|&g| permuted[g as usize]).collect();
        assert_eq!(back, (0..heads * hd).collect::<Vec<_>>());
    }
}
