//! What the `config.json` parsers share: the network-shaping config they produce and the
//! reader that takes keys from the JSON object, remembering which were read. The dense LLaDA
//! config is parsed by `config`, LLaDA-MoE's by `config_moe`.

use std::path::Path;

use llada_ir::diffusion_gemma::GenerationDefaults;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// Which Hugging Face layout the checkpoint has is its model family ([`Family`], as the
/// artifact records it): `LLaDAModelLM` (`model.transformer.*` tensors) is `Llada`; `LLaDAMoEModelLM`
/// (`model.layers.*`, mixture-of-experts feed-forward) `LladaMoe`; `DreamModel` (`model.layers.*`
/// like LLaDA-MoE's, dense SwiGLU, q/k/v biases, logits shifted by one position) `Dream`;
/// `LLaDA2MoeModelLM` (a fused `query_key_value`, dense layers then experts with a shared one,
/// block-causal attention) `Llada2Moe`.
pub use llada_ir::Family;

/// What LLaDA 2.x adds to a mixture-of-experts config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llada2Settings {
    /// Rotary dimensions at the start of each head (half-split within them); the rest pass.
    pub rotary_dim: usize,
    /// The first layers, with a dense feed-forward of `dense_hidden`.
    pub dense_layers: usize,
    pub dense_hidden: usize,
    /// The shared expert's SwiGLU width (0: none).
    pub shared_hidden: usize,
    /// Router: `groups` groups of experts, the `top_groups` best kept.
    pub groups: usize,
    pub top_groups: usize,
    /// Picked weights divided by their sum, then multiplied by `scale`.
    pub normalize: bool,
    pub scale: f64,
    /// The output head is the embedding.
    pub tie_embeddings: bool,
    /// The configs name no mask id: the tokenizer's `<|mask|>` is the mask token.
    pub mask_from_tokenizer: bool,
}

/// What DiffusionGemma adds to the shared config.
#[derive(Debug, Clone, PartialEq)]
pub struct DiffusionGemmaSettings {
    /// The sliding-window layers' head width and key heads (`head_dim`,
    /// `num_key_value_heads`).
    pub head_dim: usize,
    pub kv_heads: usize,
    /// The full-attention layers' head width and key heads (`global_head_dim`,
    /// `num_global_key_value_heads`); they have no value projection (values are the keys).
    pub full_head_dim: usize,
    pub full_kv_heads: usize,
    /// Which layers attend to everything (`layer_types`); the others to a sliding window.
    pub full_layers: Vec<bool>,
    pub sliding_window: usize,
    /// The dense feed-forward's width, also the self-conditioning block's.
    pub dense_hidden: usize,
    /// The full layers' rotary: theta, and how many of the head's frequency pairs rotate
    /// (the rest have frequency 0), their exponents over the whole head width.
    pub full_rope_theta: f64,
    pub full_rotary_pairs: usize,
    pub softcap: f64,
    /// Positions of a canvas.
    pub canvas_length: usize,
    pub generation: GenerationDefaults,
}

/// The experts of a mixture-of-experts config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeSettings {
    pub experts: usize,
    pub top_k: usize,
}

/// The network-shaping part of a LLaDA config.
#[derive(Debug, Clone, PartialEq)]
pub struct LladaConfig {
    pub family: Family,
    /// The sizes (`mlp_hidden`: the SwiGLU width of each expert, with `moe`).
    pub dims: NetworkDims,
    pub tokens: TokenIds,
    pub input_emb_norm: bool,
    pub scale_logits: bool,
    /// RMSNorm on each query and key head before rotary.
    pub qk_norm: bool,
    pub moe: Option<MoeSettings>,
    pub llada2: Option<Llada2Settings>,
    pub diffusion_gemma: Option<DiffusionGemmaSettings>,
}

impl LladaConfig {
    /// The head width (DiffusionGemma: its sliding-window layers', given in the config).
    pub fn head_dim(&self) -> usize {
        self.diffusion_gemma.as_ref().map_or(self.dims.d_model / self.dims.n_heads, |g| g.head_dim)
    }

    /// The key heads and head width that size each layer's KV cache: the model's, or
    /// DiffusionGemma's widest layers' (its full layers may hold more per position).
    pub fn cache_heads(&self) -> (usize, usize) {
        match &self.diffusion_gemma {
            Some(g) if g.full_kv_heads * g.full_head_dim > g.kv_heads * g.head_dim => (g.full_kv_heads, g.full_head_dim),
            _ => (self.dims.n_kv_heads, self.head_dim()),
        }
    }
}

/// The sizes and constants every family's config gives, whichever file they are read from
/// (`config.json`, GGUF's metadata).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetworkDims {
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub mlp_hidden: usize,
    pub vocab_size: usize,
    pub embedding_size: usize,
    pub max_sequence_length: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
}

/// The special token ids a config names (the mask id: the caller's default where it has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenIds {
    pub mask: u32,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
}

/// The keys a reader took [`NetworkDims`] and [`TokenIds`] from: what a failed check names.
pub struct DimKeys<'a> {
    pub d_model: &'a str,
    pub heads: &'a str,
    pub kv_heads: &'a str,
    pub embedding: &'a str,
    /// The mask, BOS, EOS and pad ids' keys.
    pub tokens: [&'a str; 4],
}

impl NetworkDims {
    /// The checks every reader makes of a dense head layout and its token ids: an even head
    /// width, query heads a multiple of the key heads, an embedding with a row for every
    /// vocabulary id and every special token. `Err` names the key and what is wrong.
    pub fn check(&self, tokens: &TokenIds, keys: &DimKeys) -> std::result::Result<(), (String, String)> {
        let (d, h, kv) = (self.d_model, self.n_heads, self.n_kv_heads);
        if d % h != 0 || (d / h) % 2 != 0 {
            return Err((keys.heads.into(), format!("{} {d} over {h} heads is not an even head width (rotary pairs)", keys.d_model)));
        }
        if h % kv != 0 {
            return Err((keys.kv_heads.into(), format!("{kv} key heads do not divide the {h} query heads")));
        }
        let rows = self.embedding_size;
        if rows < self.vocab_size {
            return Err((keys.embedding.into(), format!("{rows} embedding rows, fewer than the vocabulary's {}", self.vocab_size)));
        }
        let ids = [Some(tokens.mask), tokens.bos, tokens.eos, tokens.pad];
        match first_outside(keys.tokens.into_iter().zip(ids), rows) {
            Some((key, msg)) => Err((key.to_string(), msg)),
            None => Ok(()),
        }
    }
}

/// The first of `ids` (a key and the id it gives) outside an embedding of `rows` rows, with
/// what to say of it.
pub(super) fn first_outside<'k>(ids: impl IntoIterator<Item = (&'k str, Option<u32>)>, rows: usize) -> Option<(&'k str, String)> {
    ids.into_iter()
        .find_map(|(key, id)| id.filter(|&id| id as usize >= rows).map(|id| (key, format!("token id {id} is outside the embedding ({rows} rows)"))))
}

impl LladaConfig {
    /// A config of `family` over `dims` and `tokens` with none of the optional parts (input
    /// norm, logit scale, q/k norms, experts, a family's settings): each reader sets those it
    /// reads. The one place the whole config is written out.
    pub fn plain(family: Family, dims: NetworkDims, tokens: TokenIds) -> LladaConfig {
        LladaConfig {
            family,
            dims,
            tokens,
            input_emb_norm: false,
            scale_logits: false,
            qk_norm: false,
            moe: None,
            llada2: None,
            diffusion_gemma: None,
        }
    }
}

/// The network keys LLaDA-MoE's and Dream's configs share (Hugging Face's Qwen and Llama
/// names), checked for a consistent head layout; the mask id, when `config.json` has none, is
/// `mask_default` (the caller's rule: refused when `None`).
pub(super) fn qwen_style(k: &mut Keys, family: Family, mlp_key: &'static str, eps_default: f64, mask_default: Option<u32>) -> Result<LladaConfig> {
    let d_model = k.required("hidden_size")?;
    let n_heads = k.required("num_attention_heads")?;
    let vocab_size = k.required("vocab_size")?;
    let dims = NetworkDims {
        d_model,
        n_layers: k.required("num_hidden_layers")?,
        n_heads,
        n_kv_heads: k.usize("num_key_value_heads")?.unwrap_or(n_heads),
        mlp_hidden: k.required(mlp_key)?,
        vocab_size,
        embedding_size: vocab_size,
        max_sequence_length: k.required("max_position_embeddings")?,
        rope_theta: k.float("rope_theta", 10000.0, false)?,
        rms_eps: k.float("rms_norm_eps", eps_default, true)?,
    };
    let tokens = TokenIds {
        mask: match k.token("mask_token_id")?.or(mask_default) {
            Some(m) => m,
            None => return Err(k.err("mask_token_id", "missing here and in generation_config.json; the sampler needs the mask token")),
        },
        bos: k.token("bos_token_id")?,
        eos: k.token("eos_token_id")?,
        pad: k.token("pad_token_id")?,
    };
    dims.check(&tokens, &DimKeys::HF_QWEN).map_err(|(key, msg)| k.err(&key, msg))?;
    Ok(LladaConfig::plain(family, dims, tokens))
}

impl DimKeys<'static> {
    /// Hugging Face's names of the special token ids, in every family's `config.json`.
    const HF_TOKENS: [&'static str; 4] = ["mask_token_id", "bos_token_id", "eos_token_id", "pad_token_id"];

    /// Hugging Face's Qwen and Llama names.
    const HF_QWEN: DimKeys<'static> = DimKeys { d_model: "hidden_size", heads: "num_attention_heads", kv_heads: "num_key_value_heads", embedding: "vocab_size", tokens: Self::HF_TOKENS };

    /// LLaDA's own `config.json` names.
    pub(super) const LLADA: DimKeys<'static> = DimKeys { d_model: "d_model", heads: "n_heads", kv_heads: "n_kv_heads", embedding: "embedding_size", tokens: Self::HF_TOKENS };
}

pub(super) struct Keys<'a> {
    pub(super) path: &'a Path,
    pub(super) map: &'a Map<String, Value>,
    pub(super) used: Vec<&'static str>,
}

impl<'a> Keys<'a> {
    pub(super) fn err(&self, key: &str, msg: impl Into<String>) -> Error {
        Error::config(self.path, key, msg)
    }

    pub(super) fn get(&mut self, key: &'static str) -> Option<&'a Value> {
        self.used.push(key);
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// An integer key between `min` and `max`, both given as what the key means (`what`): every
    /// integer the config gives goes through here, so none is cast to a narrower type unchecked.
    pub(super) fn integer(&mut self, key: &'static str, min: u64, max: u64, what: &str) -> Result<Option<u64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(self.err(key, format!("expected {what} from {min} to {max}, found {v}"))),
            },
        }
    }

    /// A size (of a dimension, a count of layers, heads or positions): positive, and at most
    /// what the artifact's 32-bit header fields hold.
    pub(super) fn usize(&mut self, key: &'static str) -> Result<Option<usize>> {
        Ok(self.integer(key, 1, u32::MAX as u64, "an integer (32 bits, as the artifact stores it)")?.map(|n| n as usize))
    }

    pub(super) fn required(&mut self, key: &'static str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| self.err(key, "missing; this family's config.json must set it"))
    }

    pub(super) fn f64(&mut self, key: &'static str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.err(key, format!("expected a number, found {v}"))),
        }
    }

    /// A float the network computes with: finite as a float32 (the models compute their rotary
    /// tables and norms in float32), and positive, or with `zero_ok` also 0.
    pub(super) fn float(&mut self, key: &'static str, default: f64, zero_ok: bool) -> Result<f64> {
        let x = self.f64(key, default)?;
        let in_range = x.is_finite() && x.abs() <= f32::MAX as f64 && (x > 0.0 || (zero_ok && x == 0.0));
        if !in_range {
            let what = if zero_ok { "0 or a positive" } else { "a positive" };
            return Err(self.err(key, format!("{x} is out of range: expected {what} number a float32 can hold")));
        }
        Ok(x)
    }

    pub(super) fn bool(&mut self, key: &'static str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.err(key, format!("expected true or false, found {v}"))),
        }
    }

    /// A boolean the compiler supports only at one value.
    pub(super) fn require_bool(&mut self, key: &'static str, default: bool, supported: bool, why: &str) -> Result<()> {
        let v = self.bool(key, default)?;
        if v != supported {
            return Err(self.err(key, format!("{v} is not supported ({why})")));
        }
        Ok(())
    }

    /// The config's `model_type`, where it names one, must be one `accepts`: else it is refused
    /// as not a `model` model, `expected` being the type to give.
    pub(super) fn require_model_type(&mut self, model: &str, expected: &str, accepts: impl Fn(&str) -> bool) -> Result<()> {
        if let Some(Value::String(t)) = self.get("model_type")
            && !accepts(t)
        {
            return Err(self.err("model_type", format!("\"{t}\" is not a {model} model (expected \"{expected}\")")));
        }
        Ok(())
    }

    pub(super) fn require_str(&mut self, key: &'static str, default: &str, supported: &[&str]) -> Result<()> {
        let v = match self.get(key) {
            None => default.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => return Err(self.err(key, format!("expected a string, found {v}"))),
        };
        if !supported.contains(&v.as_str()) {
            return Err(self.err(key, format!("\"{v}\" is not supported (supported: {})", supported.join(", "))));
        }
        Ok(())
    }

    /// Refuses, by key, a token id outside an embedding of `rows` rows.
    pub(super) fn ids_inside(&self, ids: &[(&str, Option<u32>)], rows: usize) -> Result<()> {
        match first_outside(ids.iter().copied(), rows) {
            Some((key, msg)) => Err(self.err(key, msg)),
            None => Ok(()),
        }
    }

    /// Warnings for the keys neither read nor in `accepted`.
    pub(super) fn unknown(&self, accepted: &[&str]) -> Vec<String> {
        self.map
            .keys()
            .filter(|key| !self.used.contains(&key.as_str()) && !accepted.contains(&key.as_str()))
            .map(|key| format!("{}: unknown key '{key}' ignored", self.path.display()))
            .collect()
    }

    /// A token id: 32 bits, as the artifact and the runtime hold ids (then checked against the
    /// embedding by [`ids_inside`](Self::ids_inside)).
    pub(super) fn token(&mut self, key: &'static str) -> Result<Option<u32>> {
        Ok(self.integer(key, 0, u32::MAX as u64, "a token id (32 bits)")?.map(|n| n as u32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEYS: DimKeys<'static> = DimKeys { d_model: "d", heads: "h", kv_heads: "kv", embedding: "emb", tokens: ["mask", "bos", "eos", "pad"] };

    fn dims() -> NetworkDims {
        NetworkDims { d_model: 64, n_layers: 2, n_heads: 4, n_kv_heads: 2, mlp_hidden: 128, vocab_size: 100, embedding_size: 104, max_sequence_length: 64, rope_theta: 1e4, rms_eps: 1e-5 }
    }

    /// Each broken value is refused naming the key the reader took it from.
    #[test]
    fn every_check_names_its_key() {
        let tokens = TokenIds { mask: 103, bos: Some(1), eos: None, pad: None };
        assert_eq!(dims().check(&tokens, &KEYS), Ok(()));
        let key = |d: NetworkDims, t: TokenIds| d.check(&t, &KEYS).unwrap_err().0;
        assert_eq!(key(NetworkDims { n_heads: 3, ..dims() }, tokens), "h");
        assert_eq!(key(NetworkDims { d_model: 72, n_heads: 8, n_kv_heads: 2, ..dims() }, tokens), "h"); // head width 9: odd
        assert_eq!(key(NetworkDims { n_kv_heads: 3, ..dims() }, tokens), "kv");
        assert_eq!(key(NetworkDims { embedding_size: 99, ..dims() }, tokens), "emb");
        assert_eq!(key(dims(), TokenIds { mask: 104, ..tokens }), "mask");
        assert_eq!(key(dims(), TokenIds { pad: Some(200), ..tokens }), "pad");
    }
}
