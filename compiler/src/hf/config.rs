//! `config.json` of a LLaDA checkpoint. Every key the LLaDA configuration class defines is
//! read: the ones that shape the network become [`LladaConfig`], the ones that only matter
//! for training are accepted, and any value the compiler cannot honour is refused with a
//! message naming the key. Unknown keys are reported as warnings, not silently dropped.
//! LLaDA-MoE's keys (another configuration class under the same `model_type`) are read by
//! `config_moe`; what both read into, and their key reader, are in `config_common`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use super::config_common::{DimKeys, Family, LladaConfig, MoeSettings, NetworkDims, TokenIds};
use super::config_common::Keys;
use crate::error::{Error, Result};

/// Keys that only affect training, initialisation or the Python implementation.
const ACCEPTED_KEYS: &[&str] = &[
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "precision",
    "init_device", "init_fn", "init_std", "init_cutoff_factor", "attention_dropout", "residual_dropout",
    "embedding_dropout", "flash_attention", "use_cache", "block_group_size", "rope_full_precision",
    "alibi_bias_max", "attention_layer_norm_with_affine", "mlp_ratio", "_name_or_path", "return_dict",
    "output_hidden_states", "output_attentions", "tie_word_embeddings",
];

/// Parses `dir/config.json`; returns the config and warnings about keys it did not know.
/// (LLaDA-MoE's config.json names no mask token: its `generation_config.json` does.)
pub fn load(dir: &Path) -> Result<(LladaConfig, Vec<String>)> {
    let path: PathBuf = dir.join("config.json");
    let map = read_object(&path)?;
    if super::config_dream::is_dream(&map) {
        return super::config_dream::parse(&path, &map);
    }
    if super::config_diffusion_gemma::is_diffusion_gemma(&map) {
        let generation = dir.join("generation_config.json");
        let gmap = if generation.exists() { Some(read_object(&generation)?) } else { None };
        return super::config_diffusion_gemma::parse(&path, &map, gmap.as_ref().map(|m| (generation.as_path(), m)));
    }
    let llada2 = super::config_llada2::is_llada2(&map);
    if llada2 || super::config_moe::is_moe(&map) {
        let generation = dir.join("generation_config.json");
        let mask = match generation.exists() {
            true => {
                let map = read_object(&generation)?;
                Keys { path: &generation, map: &map, used: Vec::new() }.token("mask_token_id")?
            }
            false => None,
        };
        if llada2 {
            return super::config_llada2::parse(&path, &map, mask);
        }
        return super::config_moe::parse(&path, &map, mask);
    }
    parse(&path, &map)
}

fn read_object(path: &Path) -> Result<Map<String, Value>> {
    let text = llada_ir::files::read_text_bounded(path, llada_ir::files::CONFIG_LIMIT).map_err(|e| Error::io(path, e))?;
    let root: Value = serde_json::from_str(&text).map_err(|e| Error::Json { path: path.to_path_buf(), msg: e.to_string() })?;
    match root {
        Value::Object(map) => Ok(map),
        _ => Err(Error::Json { path: path.to_path_buf(), msg: "expected an object".into() }),
    }
}

/// Parses a dense LLaDA config (`config_moe::parse` reads LLaDA-MoE's).
pub fn parse(path: &Path, map: &Map<String, Value>) -> Result<(LladaConfig, Vec<String>)> {
    let mut k = Keys { path, map, used: Vec::new() };

    k.require_model_type("LLaDA", "llada", |t| t == "llada")?;
    k.require_bool("alibi", false, false, "LLaDA uses rotary position embeddings")?;
    k.require_bool("rope", true, true, "only rotary position embeddings are implemented")?;
    k.require_bool("weight_tying", false, false, "the output head must be its own tensor, model.transformer.ff_out.weight")?;
    k.require_bool("include_bias", false, false, "linear layers with bias are not implemented")?;
    k.require_bool("include_qkv_bias", false, false, "q/k/v projections with bias are not implemented")?;
    k.require_bool("bias_for_layer_norm", false, false, "norms with bias are not implemented")?;
    k.require_bool("layer_norm_with_affine", true, true, "norms without a weight are not implemented")?;
    k.require_bool("attention_layer_norm", false, false, "OLMo's query/key layer norm over all heads is not implemented")?;
    k.require_str("layer_norm_type", "rms", &["rms"])?;
    k.require_str("block_type", "llama", &["llama"])?;
    k.require_str("activation_type", "silu", &["silu"])?;
    if let Some(v) = k.get("clip_qkv") {
        return Err(k.err("clip_qkv", format!("{v} is not supported (q/k/v clipping is not implemented)")));
    }

    let d_model = k.required("d_model")?;
    let n_heads = k.required("n_heads")?;
    let multi_query = k.bool("multi_query_attention", false)?;
    let n_kv_heads = match (k.usize("n_kv_heads")?, multi_query) {
        (_, true) => 1,
        (Some(n), false) => n,
        (None, false) => n_heads,
    };
    let mlp_hidden = match k.usize("mlp_hidden_size")? {
        Some(h) => h,
        None => match k.required("mlp_ratio")? * d_model {
            h if h > u32::MAX as usize => return Err(k.err("mlp_ratio", format!("mlp_ratio times d_model ({h}) is more than the 32 bits the artifact stores a width in"))),
            h => h,
        },
    };
    let vocab_size = k.required("vocab_size")?;
    let dims = NetworkDims {
        d_model,
        n_layers: k.required("n_layers")?,
        n_heads,
        n_kv_heads,
        mlp_hidden,
        vocab_size,
        embedding_size: k.usize("embedding_size")?.unwrap_or(vocab_size),
        max_sequence_length: k.required("max_sequence_length")?,
        rope_theta: k.float("rope_theta", 10000.0, false)?,
        rms_eps: k.float("rms_norm_eps", 1e-5, true)?,
    };
    let input_emb_norm = k.bool("input_emb_norm", false)?;
    let scale_logits = k.bool("scale_logits", false)?;
    let tokens = TokenIds { mask: k.token("mask_token_id")?.unwrap_or(126336), bos: k.token("bos_token_id")?, eos: k.token("eos_token_id")?, pad: k.token("pad_token_id")? };
    dims.check(&tokens, &DimKeys::LLADA).map_err(|(key, msg)| k.err(&key, msg))?;

    let warnings = k.unknown(ACCEPTED_KEYS);
    let cfg = LladaConfig { input_emb_norm, scale_logits, ..LladaConfig::plain(Family::Llada, dims, tokens) };
    Ok((cfg, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "model_type": "llada", "d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 4,
            "mlp_hidden_size": 384, "vocab_size": 320, "embedding_size": 320, "max_sequence_length": 512,
            "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "mask_token_id": 270, "alibi": false,
            "weight_tying": false, "rope": true, "layer_norm_type": "rms", "block_type": "llama",
        })
    }

    fn parse_json(v: Value) -> Result<(LladaConfig, Vec<String>)> {
        parse(Path::new("config.json"), v.as_object().unwrap())
    }

    #[test]
    fn reads_the_shape() {
        let (c, warnings) = parse_json(base()).unwrap();
        assert_eq!((c.dims.d_model, c.dims.n_layers, c.head_dim(), c.dims.mlp_hidden, c.tokens.mask), (128, 4, 32, 384, 270));
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn refuses_unsupported_values_naming_the_key() {
        for (key, value) in [("alibi", json!(true)), ("weight_tying", json!(true)), ("layer_norm_type", json!("default")), ("include_bias", json!(true))] {
            let mut v = base();
            v[key] = value;
            let msg = parse_json(v).unwrap_err().to_string();
            assert!(msg.contains(key) && msg.contains("not supported"), "{msg}");
        }
    }

    #[test]
    fn grouped_query_and_multi_query() {
        let mut v = base();
        v["n_kv_heads"] = json!(2);
        assert_eq!(parse_json(v.clone()).unwrap().0.dims.n_kv_heads, 2);
        v["n_kv_heads"] = json!(3);
        assert!(parse_json(v.clone()).unwrap_err().to_string().contains("n_kv_heads"));
        v["multi_query_attention"] = json!(true);
        assert_eq!(parse_json(v).unwrap().0.dims.n_kv_heads, 1);
    }

    /// Out of their range or their width (a wrapped 64-bit integer once passed the range
    /// checks as its low 32 bits): refused, by key.
    #[test]
    fn values_outside_their_range_or_width_are_refused_naming_the_key() {
        for (key, value) in [
            ("rope_theta", json!(0.0)),
            ("rope_theta", json!(-10000.0)),
            ("rope_theta", json!(1e300)),
            ("rms_norm_eps", json!(-1e-5)),
            ("max_sequence_length", json!(4294967396u64)),
            ("max_sequence_length", json!(1u64 << 62)),
            ("mask_token_id", json!(4294967571u64)),
            ("eos_token_id", json!(-1)),
            ("d_model", json!(0)),
            ("n_layers", json!(2.5)),
            ("mlp_ratio", json!(1u64 << 31)),
        ] {
            let mut v = base();
            v[key] = value.clone();
            if key == "mlp_ratio" {
                v.as_object_mut().unwrap().remove("mlp_hidden_size");
            }
            let msg = parse_json(v).unwrap_err().to_string();
            assert!(msg.contains(&format!("config.json: {key}: ")), "{key} = {value}: {msg}");
        }
        let mut v = base();
        v["rms_norm_eps"] = json!(0.0);
        assert_eq!(parse_json(v).unwrap().0.dims.rms_eps, 0.0);
    }

    #[test]
    fn unknown_keys_are_warned_about() {
        let mut v = base();
        v["frobnicate"] = json!(1);
        assert!(parse_json(v).unwrap().1[0].contains("frobnicate"));
    }
}
