//! `config.json` of a LLaDA-MoE checkpoint (`LLaDAMoEModelLM`; its configuration class reuses
//! `model_type` "llada"). Read as `modeling_lladamoe.py` uses it: the router's softmax over all
//! experts and its top k, never renormalised (the code fixes `norm_topk_prob` to false), no
//! group-limited routing and no scaling (`router_num_group`, `router_topk_group` and
//! `routed_scaling_factor` are stored but unused), q and k norms per head when
//! `qk_layernorm`, full half-split rotary. What the code would compute differently from that
//! (a shared expert, dense layers, a router bias, partial rotary, q/k/v clipping, biases) is
//! refused by key.

use std::path::Path;

use serde_json::{Map, Value};

use super::config_common::{qwen_style, Family, Keys, LladaConfig, MoeSettings};
use crate::error::Result;

/// Whether `config.json` describes LLaDA-MoE: its architecture, or its expert keys.
pub fn is_moe(map: &Map<String, Value>) -> bool {
    let arch = map.get("architectures").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).any(|a| a.starts_with("LLaDAMoE"));
    let model_type = map.get("model_type").and_then(Value::as_str).is_some_and(|t| t == "lladamoe" || t == "llada_moe");
    arch || model_type || map.contains_key("num_experts")
}

/// Keys that do not shape the forward pass (training, the Python implementation, or stored
/// but unused by `modeling_lladamoe.py`).
const ACCEPTED_KEYS: &[&str] = &[
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "initializer_range", "use_cache",
    "attention_dropout", "output_router_logits", "router_aux_loss_coef", "dense_intermediate_size", "router_num_group",
    "router_topk_group", "_name_or_path", "return_dict", "output_hidden_states", "output_attentions",
];

/// Parses LLaDA-MoE's config; `generation_mask` is `generation_config.json`'s mask id, used
/// when `config.json` has none (the released one has none).
pub fn parse(path: &Path, map: &Map<String, Value>, generation_mask: Option<u32>) -> Result<(LladaConfig, Vec<String>)> {
    let mut k = Keys { path, map, used: Vec::new() };
    let mut warnings = Vec::new();
    k.require_model_type("LLaDA-MoE", "llada", |t| ["llada", "lladamoe", "llada_moe"].contains(&t))?;
    k.require_str("hidden_act", "silu", &["silu"])?;
    k.require_bool("attention_bias", false, false, "q/k/v/o projections with bias are not implemented")?;
    k.require_bool("tie_word_embeddings", false, false, "the output head must be its own tensor, lm_head.weight")?;
    k.require_bool("moe_router_enable_expert_bias", false, false, "the router's expert bias is not implemented")?;
    k.require_str("moe_router_score_function", "softmax", &["softmax"])?;
    for key in ["clip_qkv", "rope_scaling"] {
        if let Some(v) = k.get(key) {
            return Err(k.err(key, format!("{v} is not supported (only null is)")));
        }
    }
    if let Some(v) = k.get("shared_expert_intermediate_size") {
        if v.as_u64() != Some(0) {
            return Err(k.err("shared_expert_intermediate_size", format!("{v} is not supported (a shared expert is not implemented)")));
        }
    }
    match k.get("partial_rotary_factor").map(|v| (v, v.as_f64())) {
        None | Some((_, Some(1.0))) => {}
        Some((v, _)) => return Err(k.err("partial_rotary_factor", format!("{v} is not supported (rotary over the whole head only)"))),
    }
    if k.bool("norm_topk_prob", false)? {
        warnings.push(format!("{}: norm_topk_prob is true, but LLaDA-MoE's modelling code never renormalises the top-k weights; neither does the compiled model", path.display()));
    }
    if k.f64("routed_scaling_factor", 1.0)? != 1.0 {
        warnings.push(format!("{}: routed_scaling_factor is ignored, as LLaDA-MoE's modelling code ignores it", path.display()));
    }

    let base = qwen_style(&mut k, Family::LladaMoe, "expert_intermediate_size", 1e-5, generation_mask)?;
    let experts = k.required("num_experts")?;
    let top_k = k.required("num_experts_per_tok")?;
    let qk_norm = k.bool("qk_layernorm", false)?;
    let n_layers = base.dims.n_layers;
    match k.get("moe_layer_freq") {
        None => return Err(k.err("moe_layer_freq", "missing; LLaDA-MoE's modelling code reads it for every layer")),
        Some(Value::Array(f)) if f.len() == n_layers && f.iter().all(|x| x.as_u64().is_some_and(|x| x > 0)) => {}
        Some(v) => return Err(k.err("moe_layer_freq", format!("{v} is not supported (every one of the {n_layers} layers must be a mixture of experts; dense layers are not implemented)"))),
    }
    if top_k > experts {
        return Err(k.err("num_experts_per_tok", format!("{top_k} is more than num_experts {experts}")));
    }
    if experts > llada_ir::verify::MAX_EXPERTS as usize {
        return Err(k.err("num_experts", format!("{experts} is more than the {} the artifact format allows", llada_ir::verify::MAX_EXPERTS)));
    }
    warnings.extend(k.unknown(ACCEPTED_KEYS));
    let cfg = LladaConfig { qk_norm, moe: Some(MoeSettings { experts, top_k }), ..base };
    Ok((cfg, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({
            "architectures": ["LLaDAMoEModelLM"], "model_type": "llada", "vocab_size": 320, "hidden_size": 128,
            "expert_intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "num_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 512, "rope_theta": 50000.0,
            "qk_layernorm": true, "moe_layer_freq": [1, 1], "partial_rotary_factor": 1, "norm_topk_prob": false,
            "moe_router_enable_expert_bias": false, "moe_router_score_function": "softmax", "eos_token_id": 258,
        })
    }

    fn parse_json(v: Value, mask: Option<u32>) -> Result<(LladaConfig, Vec<String>)> {
        parse(Path::new("config.json"), v.as_object().unwrap(), mask)
    }

    #[test]
    fn reads_the_experts_and_takes_the_mask_from_generation_config() {
        assert!(is_moe(base().as_object().unwrap()));
        let (c, warnings) = parse_json(base(), Some(259)).unwrap();
        assert_eq!((c.family, c.moe, c.dims.mlp_hidden, c.dims.n_kv_heads, c.tokens.mask, c.qk_norm), (Family::LladaMoe, Some(MoeSettings { experts: 8, top_k: 2 }), 64, 2, 259, true));
        assert!(warnings.is_empty(), "{warnings:?}");
        let msg = parse_json(base(), None).unwrap_err().to_string();
        assert!(msg.contains("mask_token_id") && msg.contains("generation_config.json"), "{msg}");
    }

    #[test]
    fn refuses_what_the_reference_would_compute_differently_naming_the_key() {
        for (key, value) in [
            ("moe_router_enable_expert_bias", json!(true)),
            ("shared_expert_intermediate_size", json!(512)),
            ("partial_rotary_factor", json!(0.5)),
            ("moe_layer_freq", json!([1, 0])),
            ("clip_qkv", json!(8.0)),
            ("attention_bias", json!(true)),
            ("tie_word_embeddings", json!(true)),
            ("moe_router_score_function", json!("sigmoid")),
            ("num_experts_per_tok", json!(9)),
        ] {
            let mut v = base();
            v[key] = value;
            let msg = parse_json(v, Some(259)).unwrap_err().to_string();
            assert!(msg.contains(key), "{key}: {msg}");
        }
    }

    #[test]
    fn settings_the_code_ignores_are_accepted_with_a_warning() {
        let mut v = base();
        v["norm_topk_prob"] = json!(true);
        v["routed_scaling_factor"] = json!(2.5);
        let (_, warnings) = parse_json(v, Some(259)).unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
    }
}
