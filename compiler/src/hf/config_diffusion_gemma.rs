//! `config.json` and `generation_config.json` of a DiffusionGemma checkpoint
//! (`DiffusionGemmaForBlockDiffusion`, `model_type` "diffusion_gemma", transformers 5.23's
//! `configuration_diffusion_gemma.py`), read as its modeling code uses them: the text layers
//! of `text_config` (sliding-window layers and full-attention layers with their own head width
//! and key heads, proportional rotary on the full ones), a dense GELU feed-forward beside the
//! experts, logits soft-capped. The vision tower is not read (a text-only runtime); what the
//! code would compute differently from that is refused by key.

use std::path::Path;

use llada_ir::diffusion_gemma::GenerationDefaults;
use serde_json::{Map, Value};

pub use super::config_common::DiffusionGemmaSettings;
use super::config_common::{Family, Keys, LladaConfig, MoeSettings, NetworkDims, TokenIds};
use crate::error::{Error, Result};

/// Whether `config.json` describes DiffusionGemma.
pub fn is_diffusion_gemma(map: &Map<String, Value>) -> bool {
    map.get("model_type").and_then(Value::as_str) == Some("diffusion_gemma")
}

/// Keys of the top level that shape nothing a text-only runtime computes.
const ACCEPTED_TOP: &[&str] = &[
    "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "initializer_range", "vision_config", "boi_token_id", "eoi_token_id",
    "image_token_id", "vision_soft_tokens_per_image", "eos_token_id", "tie_word_embeddings", "_name_or_path", "bos_token_id", "pad_token_id",
];
/// Keys of `text_config` that do not shape the forward pass.
const ACCEPTED_TEXT: &[&str] = &["model_type", "dtype", "torch_dtype", "initializer_range", "attention_dropout", "use_cache", "transformers_version", "_name_or_path"];

/// Parses the config (`path`) and the generation config beside it (`generation`, absent: the
/// published code's global defaults).
pub fn parse(path: &Path, map: &Map<String, Value>, generation: Option<(&Path, &Map<String, Value>)>) -> Result<(LladaConfig, Vec<String>)> {
    let mut top = Keys { path, map, used: Vec::new() };
    top.require_model_type("DiffusionGemma", "diffusion_gemma", |t| t == "diffusion_gemma")?;
    top.require_bool("tie_word_embeddings", true, true, "the output head is the embedding; the checkpoint has no lm_head")?;
    let canvas_length = top.usize("canvas_length")?.unwrap_or(256);
    let Some(Value::Object(text)) = top.get("text_config") else {
        return Err(top.err("text_config", "missing or not an object: the text layers' config"));
    };
    let mut warnings = top.unknown(&[ACCEPTED_TOP, &["text_config", "canvas_length"]].concat());
    let text_path = path.with_file_name(format!("{} (text_config)", path.file_name().and_then(|f| f.to_str()).unwrap_or("config.json")));
    let mut k = Keys { path: &text_path, map: text, used: Vec::new() };
    let (cfg, settings) = text_config(&mut k, canvas_length)?;
    warnings.extend(k.unknown(ACCEPTED_TEXT));
    let generation = match generation {
        Some((gpath, gmap)) => generation_defaults(&mut Keys { path: gpath, map: gmap, used: Vec::new() }, cfg.dims.embedding_size)?,
        None => published_defaults(),
    };
    let cfg = LladaConfig { diffusion_gemma: Some(DiffusionGemmaSettings { generation, ..settings }), ..cfg };
    Ok((cfg, warnings))
}

/// The text layers.
fn text_config(k: &mut Keys, canvas_length: usize) -> Result<(LladaConfig, DiffusionGemmaSettings)> {
    k.require_str("hidden_activation", "gelu_pytorch_tanh", &["gelu_pytorch_tanh"])?;
    k.require_bool("attention_bias", false, false, "projections with bias are not implemented")?;
    k.require_bool("tie_word_embeddings", true, true, "the output head is the embedding")?;
    match k.get("use_bidirectional_attention") {
        None => {}
        Some(Value::String(s)) if s == "vision" => {}
        Some(v) => return Err(k.err("use_bidirectional_attention", format!("{v} is not supported (null or \"vision\": the text encoder is causal)"))),
    }
    let d_model = k.required("hidden_size")?;
    let n_layers = k.required("num_hidden_layers")?;
    let n_heads = k.required("num_attention_heads")?;
    let n_kv_heads = k.required("num_key_value_heads")?;
    let head_dim = k.required("head_dim")?;
    let full_head_dim = k.usize("global_head_dim")?.unwrap_or(512);
    let full_kv_heads = k.usize("num_global_key_value_heads")?.unwrap_or(n_kv_heads);
    let dense_hidden = k.required("intermediate_size")?;
    let expert_hidden = k.required("moe_intermediate_size")?;
    let experts = k.required("num_experts")?;
    let top_k = k.required("top_k_experts")?;
    let vocab_size = k.required("vocab_size")?;
    let max_sequence_length = k.required("max_position_embeddings")?;
    let rms_eps = k.float("rms_norm_eps", 1e-6, true)?;
    let sliding_window = k.required("sliding_window")?;
    let softcap = k.float("final_logit_softcapping", 30.0, false)?;
    let full_layers = layer_types(k, n_layers)?;
    let (rope_theta, full_rope_theta, full_rotary_pairs) = rope_parameters(k, full_head_dim)?;
    let (bos, eos, pad) = (k.token("bos_token_id")?, first_token(k, "eos_token_id")?, k.token("pad_token_id")?);
    for (key, heads) in [("num_key_value_heads", n_kv_heads), ("num_global_key_value_heads", full_kv_heads)] {
        if n_heads % heads != 0 {
            return Err(k.err(key, format!("num_attention_heads {n_heads} is not a multiple of {heads}")));
        }
    }
    if head_dim % 2 != 0 || full_head_dim % 2 != 0 {
        return Err(k.err("head_dim", format!("head widths {head_dim} and {full_head_dim} must be even (rotary pairs)")));
    }
    if top_k > experts {
        return Err(k.err("top_k_experts", format!("{top_k} is more than num_experts {experts}")));
    }
    k.ids_inside(&[("bos_token_id", bos), ("eos_token_id", eos), ("pad_token_id", pad)], vocab_size)?;
    let dims = NetworkDims { d_model, n_layers, n_heads, n_kv_heads, mlp_hidden: expert_hidden, vocab_size, embedding_size: vocab_size, max_sequence_length, rope_theta, rms_eps };
    // No mask: the canvas starts as noise. The pad id stands in where a token must be named.
    let tokens = TokenIds { mask: pad.unwrap_or(0), bos, eos, pad };
    let cfg = LladaConfig { input_emb_norm: true, qk_norm: true, moe: Some(MoeSettings { experts, top_k }), ..LladaConfig::plain(Family::DiffusionGemma, dims, tokens) };
    let settings = DiffusionGemmaSettings { head_dim, kv_heads: n_kv_heads, full_head_dim, full_kv_heads, full_layers, sliding_window, dense_hidden, full_rope_theta, full_rotary_pairs, softcap, canvas_length, generation: GenerationDefaults::default() };
    Ok((cfg, settings))
}

/// `layer_types`: "sliding_attention" or "full_attention" per layer (default: every sixth
/// full), the last forced to full as the published config does.
fn layer_types(k: &mut Keys, n_layers: usize) -> Result<Vec<bool>> {
    let mut full: Vec<bool> = match k.get("layer_types") {
        None => (0..n_layers).map(|i| (i + 1) % 6 == 0).collect(),
        Some(Value::Array(a)) if a.len() == n_layers => a
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(true),
                Some("sliding_attention") => Ok(false),
                _ => Err(k.err("layer_types", format!("{t} is neither \"sliding_attention\" nor \"full_attention\""))),
            })
            .collect::<Result<_>>()?,
        Some(v) => return Err(k.err("layer_types", format!("expected {n_layers} layer types, found {v}"))),
    };
    if let Some(last) = full.last_mut() {
        *last = true;
    }
    Ok(full)
}

/// `rope_parameters`: the sliding layers' default rotary and the full layers' proportional
/// one. Returns (sliding theta, full theta, full rotating pairs).
fn rope_parameters(k: &mut Keys, full_head_dim: usize) -> Result<(f64, f64, usize)> {
    let key = "rope_parameters";
    let (sliding, full) = match k.get(key) {
        None => return Ok((10_000.0, 1_000_000.0, full_head_dim / 8)),
        Some(Value::Object(m)) => (m.get("sliding_attention").and_then(Value::as_object), m.get("full_attention").and_then(Value::as_object)),
        Some(v) => return Err(k.err(key, format!("expected an object, found {v}"))),
    };
    let (Some(sliding), Some(full)) = (sliding, full) else { return Err(k.err(key, "needs \"sliding_attention\" and \"full_attention\" entries")) };
    let theta = |m: &Map<String, Value>, which: &str| match m.get("rope_theta").and_then(Value::as_f64) {
        Some(t) if t.is_finite() && t > 0.0 && t <= f32::MAX as f64 => Ok(t),
        _ => Err(k.err(key, format!("{which}.rope_theta must be a positive number"))),
    };
    // A value of the wrong type is refused, not read as absent.
    let number = |m: &Map<String, Value>, which: &str, name: &str| match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().map(Some).ok_or_else(|| k.err(key, format!("{which}.{name}: expected a number, found {v}"))),
    };
    let kind = |m: &Map<String, Value>, which: &str| match m.get("rope_type") {
        None | Some(Value::Null) => Ok("default".to_string()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(k.err(key, format!("{which}.rope_type: expected a string, found {v}"))),
    };
    let sliding_kind = kind(sliding, "sliding_attention")?;
    if sliding_kind != "default" || number(sliding, "sliding_attention", "partial_rotary_factor")?.is_some_and(|f| f != 1.0) {
        return Err(k.err(key, format!("sliding_attention: rope {sliding_kind} is not supported (the default, whole-head rotary is)")));
    }
    let full_kind = kind(full, "full_attention")?;
    if full_kind != "proportional" || number(full, "full_attention", "factor")?.is_some_and(|f| f != 1.0) {
        return Err(k.err(key, format!("full_attention: rope {full_kind} is not supported (proportional, factor 1, is)")));
    }
    let factor = number(full, "full_attention", "partial_rotary_factor")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&factor) {
        return Err(k.err(key, format!("full_attention.partial_rotary_factor {factor} is outside 0..=1")));
    }
    // The published `int(factor * head_dim // 2)`.
    let pairs = ((factor * full_head_dim as f64) / 2.0).floor() as usize;
    Ok((theta(sliding, "sliding_attention")?, theta(full, "full_attention")?, pairs))
}

/// A token id, or the first of a list of them.
fn first_token(k: &mut Keys, key: &'static str) -> Result<Option<u32>> {
    Ok(token_list(k, key)?.and_then(|l| l.first().copied()))
}

/// A token id or a list of them (`eos_token_id`).
fn token_list(k: &mut Keys, key: &'static str) -> Result<Option<Vec<u32>>> {
    let list = match k.get(key) {
        None => return Ok(None),
        Some(Value::Array(a)) => a.clone(),
        Some(v) => vec![v.clone()],
    };
    list.iter()
        .map(|v| v.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).ok_or_else(|| k.err(key, format!("{v} is not a token id"))))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// The published `_get_default_generation_params`, used where `generation_config.json` leaves
/// a value unset (and for all of it when there is none; no EOS then).
fn published_defaults() -> GenerationDefaults {
    GenerationDefaults { max_new_tokens: 256, max_denoising_steps: 48, t_min: Some(0.4), t_max: Some(0.8), entropy_bound: 0.1, stability_threshold: Some(1), confidence_threshold: Some(0.005), eos_ids: Vec::new(), pad_id: None }
}

/// `generation_config.json`: each key the published config reads, unset ones from
/// [`published_defaults`] (an explicit null turns that part off, as in the published code only
/// where the code tests for None: the temperature schedule and the stopping rule).
fn generation_defaults(k: &mut Keys, vocab: usize) -> Result<GenerationDefaults> {
    let d = published_defaults();
    let present = |k: &Keys, key: &str| k.map.contains_key(key);
    let optional_float = |k: &mut Keys, key: &'static str, default: Option<f64>| -> Result<Option<f64>> {
        match (present(k, key), k.get(key)) {
            (true, None) => Ok(None),
            (_, Some(v)) => v.as_f64().filter(|x| x.is_finite() && *x >= 0.0).map(Some).ok_or_else(|| k.err(key, format!("{v} is not a number >= 0"))),
            (false, None) => Ok(default),
        }
    };
    let max_new_tokens = k.usize("max_new_tokens")?.unwrap_or(d.max_new_tokens as usize) as u32;
    let max_denoising_steps = k.usize("max_denoising_steps")?.unwrap_or(d.max_denoising_steps as usize) as u32;
    let t_min = optional_float(k, "t_min", d.t_min)?;
    let t_max = optional_float(k, "t_max", d.t_max)?;
    let confidence_threshold = optional_float(k, "confidence_threshold", d.confidence_threshold)?;
    let stability_threshold = match (present(k, "stability_threshold"), k.integer("stability_threshold", 0, u32::MAX as u64, "a count of steps")?) {
        (true, None) => None,
        (_, Some(n)) => Some(n as u32),
        (false, None) => d.stability_threshold,
    };
    let entropy_bound = match k.get("sampler_config") {
        None => d.entropy_bound,
        Some(Value::Object(m)) => match m.get("entropy_bound").and_then(Value::as_f64) {
            Some(b) if b.is_finite() && b > 0.0 => b,
            _ => return Err(k.err("sampler_config", "entropy_bound must be a number above 0")),
        },
        Some(v) => return Err(k.err("sampler_config", format!("expected an object with entropy_bound, found {v}"))),
    };
    if let (Some(lo), Some(hi)) = (t_min, t_max)
        && hi <= lo
    {
        return Err(k.err("t_max", format!("{hi} must be above t_min {lo}")));
    }
    let eos_ids = token_list(k, "eos_token_id")?.unwrap_or_default();
    let pad_id = k.token("pad_token_id")?;
    let _ = k.token("bos_token_id")?;
    let ids: Vec<(&str, Option<u32>)> = eos_ids.iter().map(|&e| ("eos_token_id", Some(e))).chain([("pad_token_id", pad_id)]).collect();
    k.ids_inside(&ids, vocab)?;
    if let Some(key) = k.map.keys().find(|key| !k.used.contains(&key.as_str()) && !["transformers_version", "_from_model_config", "return_dict_in_generate", "cache_implementation"].contains(&key.as_str())) {
        return Err(Error::config(k.path, key, "is not a setting of DiffusionGemma's generation config"));
    }
    Ok(GenerationDefaults { max_new_tokens, max_denoising_steps, t_min, t_max, entropy_bound, stability_threshold, confidence_threshold, eos_ids, pad_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kit(file: &str) -> Map<String, Value> {
        let path = format!("{}/../tests/data/diffusiongemma-conformance/tiny-dg-A/{file}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn reads_the_conformance_kits_config() {
        let (map, generation) = (kit("config.json"), kit("generation_config.json"));
        assert!(is_diffusion_gemma(&map));
        let (c, warnings) = parse(Path::new("config.json"), &map, Some((Path::new("generation_config.json"), &generation))).unwrap();
        let g = c.diffusion_gemma.as_ref().unwrap();
        assert_eq!((c.dims.d_model, c.dims.n_layers, c.dims.n_heads, c.dims.n_kv_heads, c.head_dim(), c.dims.mlp_hidden), (64, 6, 4, 2, 16, 16));
        assert_eq!((g.full_head_dim, g.full_kv_heads, g.full_rotary_pairs, g.canvas_length, g.sliding_window), (32, 1, 4, 16, 8));
        assert_eq!(g.full_layers, [false, false, true, false, false, true]);
        assert!(g.generation.max_denoising_steps > 0 && g.generation.entropy_bound > 0.0);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    /// Full layers that hold more per position than the sliding ones size the cache (the
    /// published defaults do: `global_head_dim` 512 against a smaller `head_dim`).
    #[test]
    fn the_widest_layers_size_the_cache() {
        let mut map = kit("config.json");
        let (c, _) = parse(Path::new("config.json"), &map, None).unwrap();
        assert_eq!((c.cache_heads(), c.head_dim()), ((2, 16), 16));
        let text = map.get_mut("text_config").unwrap().as_object_mut().unwrap();
        text.remove("global_head_dim");
        let (c, _) = parse(Path::new("config.json"), &map, None).unwrap();
        assert_eq!((c.cache_heads(), c.head_dim()), ((1, 512), 16));
    }

    #[test]
    fn refuses_what_the_reference_would_compute_differently_naming_the_key() {
        for (key, value) in [("use_bidirectional_attention", serde_json::json!("all")), ("hidden_activation", serde_json::json!("silu")), ("attention_bias", serde_json::json!(true))] {
            let mut map = kit("config.json");
            map.get_mut("text_config").unwrap().as_object_mut().unwrap().insert(key.into(), value);
            let msg = parse(Path::new("config.json"), &map, None).unwrap_err().to_string();
            assert!(msg.contains(key), "{key}: {msg}");
        }
    }

    /// A rotary setting of the wrong type is refused by name, not read as its default.
    #[test]
    fn a_rotary_setting_of_the_wrong_type_is_refused() {
        for (which, name, value) in [("full_attention", "partial_rotary_factor", serde_json::json!("x")), ("full_attention", "factor", serde_json::json!([1.0])), ("sliding_attention", "rope_type", serde_json::json!(3))] {
            let mut map = kit("config.json");
            let rope = map.get_mut("text_config").unwrap().get_mut("rope_parameters").unwrap();
            rope.get_mut(which).unwrap().as_object_mut().unwrap().insert(name.into(), value);
            let msg = parse(Path::new("config.json"), &map, None).unwrap_err().to_string();
            assert!(msg.contains(&format!("{which}.{name}: expected a")), "{which}.{name}: {msg}");
        }
    }
}
