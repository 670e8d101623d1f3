//! `config.json` of a Dream checkpoint (`DreamModel`, `model_type` "Dream": Dream-org's
//! Dream-v0-Instruct-7B and -Base-7B). Read as `modeling_dream.py` uses it: a Qwen2.5-style
//! transformer with biases on the q, k and v projections (none on o), grouped-query attention,
//! full half-split rotary at `rope_theta`, RMSNorm, SwiGLU, bidirectional attention, its own
//! mask token. What the code would compute differently from that (rope scaling, sliding-window
//! attention, tied embeddings, another activation) is refused by key.

use std::path::Path;

use serde_json::{Map, Value};

use super::config_common::{qwen_style, Family, Keys, LladaConfig};
use crate::error::Result;

/// Whether `config.json` describes Dream: its architecture or its model type.
pub fn is_dream(map: &Map<String, Value>) -> bool {
    let arch = map.get("architectures").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).any(|a| a.starts_with("Dream"));
    arch || map.get("model_type").and_then(Value::as_str).is_some_and(|t| t.eq_ignore_ascii_case("dream"))
}

/// Keys that do not shape the forward pass (training, the Python implementation).
const ACCEPTED_KEYS: &[&str] = &[
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "initializer_range", "use_cache",
    "attention_dropout", "max_window_layers", "sliding_window", "_name_or_path", "return_dict", "output_hidden_states",
    "output_attentions", "_attn_implementation",
];

pub fn parse(path: &Path, map: &Map<String, Value>) -> Result<(LladaConfig, Vec<String>)> {
    let mut k = Keys { path, map, used: Vec::new() };
    k.require_model_type("Dream", "Dream", |t| t.eq_ignore_ascii_case("dream"))?;
    k.require_str("hidden_act", "silu", &["silu"])?;
    k.require_bool("tie_word_embeddings", false, false, "the output head must be its own tensor, lm_head.weight")?;
    k.require_bool("use_sliding_window", false, false, "sliding-window attention is not implemented; Dream attends to the whole sequence")?;
    if let Some(v) = k.get("rope_scaling") {
        return Err(k.err("rope_scaling", format!("{v} is not supported (only null is)")));
    }
    // Dream's mask id is in config.json (its generation_config.json has none); 151666 is the 7B's.
    let cfg = qwen_style(&mut k, Family::Dream, "intermediate_size", 1e-6, Some(151666))?;
    let warnings = k.unknown(ACCEPTED_KEYS);
    Ok((cfg, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Dream-v0-Instruct-7B's config.json, as published (the generator's Dream preset is checked against the same file).
    fn dream_7b() -> Value {
        serde_json::from_str(include_str!("../../tests/data/dream-v0-instruct-7b.config.json")).unwrap()
    }

    fn parse_json(v: Value) -> Result<(LladaConfig, Vec<String>)> {
        parse(Path::new("config.json"), v.as_object().unwrap())
    }

    #[test]
    fn reads_dream_7b() {
        assert!(is_dream(dream_7b().as_object().unwrap()));
        let (c, warnings) = parse_json(dream_7b()).unwrap();
        assert_eq!((c.family, c.dims.d_model, c.dims.n_heads, c.dims.n_kv_heads, c.head_dim(), c.dims.mlp_hidden, c.dims.vocab_size), (Family::Dream, 3584, 28, 4, 128, 18944, 152064));
        assert_eq!((c.dims.rope_theta, c.dims.rms_eps, c.tokens.mask), (1e6, 1e-6, 151666));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn refuses_what_the_reference_would_compute_differently_naming_the_key() {
        for (key, value) in [("rope_scaling", json!({"type": "yarn", "factor": 4.0})), ("use_sliding_window", json!(true)), ("tie_word_embeddings", json!(true)), ("hidden_act", json!("gelu")), ("num_key_value_heads", json!(5))] {
            let mut v = dream_7b();
            v[key] = value;
            let msg = parse_json(v).unwrap_err().to_string();
            assert!(msg.contains(key), "{key}: {msg}");
        }
    }
}
