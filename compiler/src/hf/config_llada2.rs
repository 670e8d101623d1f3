//! `config.json` of a LLaDA 2.x checkpoint (`LLaDA2MoeModelLM`, `model_type` "llada2_moe":
//! inclusionAI's LLaDA2.0-mini/-flash and LLaDA2.1). Read as `modeling_llada2_moe.py` uses it:
//! a fused `[q | k | v]` projection, RMSNorm on every query and key head, rotary over the first
//! `partial_rotary_factor` of each head (half-split within it), grouped-query attention, the
//! first `first_k_dense_replace` layers dense and the rest mixtures of experts with a shared
//! expert, routed by the sigmoid of the router's logits plus a learned expert bias (for the
//! choice only), limited to the `topk_group` best of `n_group` groups, the picked weights
//! normalised (`norm_topk_prob`) and scaled by `routed_scaling_factor`. What the code would
//! compute differently (rope scaling, biases, a softmax router, another activation) is refused
//! by key.

use std::path::Path;

use serde_json::{Map, Value};

use super::config_common::{qwen_style, Family, Keys, Llada2Settings, LladaConfig, MoeSettings};
use crate::error::Result;

/// Whether `config.json` describes LLaDA 2.x: its architecture or its model type.
pub fn is_llada2(map: &Map<String, Value>) -> bool {
    let arch = map.get("architectures").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).any(|a| a.starts_with("LLaDA2"));
    arch || map.get("model_type").and_then(Value::as_str).is_some_and(|t| t == "llada2_moe")
}

/// Keys that do not shape the forward pass (training, the Python implementation, dropouts).
const ACCEPTED_KEYS: &[&str] = &[
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "initializer_range", "use_cache",
    "attention_dropout", "embedding_dropout", "output_dropout", "output_router_logits", "router_aux_loss_coef",
    "max_window_layers", "_name_or_path", "return_dict", "output_hidden_states", "output_attentions", "num_nextn_predict_layers",
    "mtp_loss_scaling_factor", "_attn_implementation", "router_dtype", "moe_router_topk_scaling_factor", "dtype",
    "sliding_window", "rotary_dim", "norm_topk_prob", "pad_token_id",
];

pub fn parse(path: &Path, map: &Map<String, Value>, generation_mask: Option<u32>) -> Result<(LladaConfig, Vec<String>)> {
    let mut k = Keys { path, map, used: Vec::new() };
    k.require_model_type("LLaDA 2.x", "llada2_moe", |t| t == "llada2_moe")?;
    k.require_str("hidden_act", "silu", &["silu"])?;
    k.require_bool("use_bias", false, false, "linear layers with bias are not implemented")?;
    k.require_bool("use_qkv_bias", false, false, "q/k/v projections with bias are not implemented")?;
    k.require_bool("use_rmsnorm", true, true, "only RMSNorm is implemented")?;
    k.require_bool("norm_head", false, false, "a normalised output head is not implemented")?;
    k.require_bool("norm_softmax", false, false, "a normalised softmax is not implemented")?;
    k.require_bool("using_split_qkv_in_self_attention", false, false, "the q/k/v projection must be the fused query_key_value")?;
    k.require_bool("use_sliding_window", false, false, "sliding-window attention is not implemented")?;
    let mut warnings = Vec::new();
    // Stored but not read by the published code, which always routes by the sigmoid with the
    // expert bias (a persistent buffer) and normalises the picks when it picks more than one.
    if k.get("score_function").is_some_and(|v| v.as_str() != Some("sigmoid")) {
        warnings.push(format!("{}: score_function is not \"sigmoid\", but modeling_llada2_moe.py routes by the sigmoid whatever it says; so does the compiled model", path.display()));
    }
    if !k.bool("moe_router_enable_expert_bias", true)? {
        warnings.push(format!("{}: moe_router_enable_expert_bias is false, but modeling_llada2_moe.py adds gate.expert_bias whatever it says; so does the compiled model", path.display()));
    }
    if let Some(v) = k.get("rope_scaling") {
        return Err(k.err("rope_scaling", format!("{v} is not supported (only null is)")));
    }
    let tie = k.bool("tie_word_embeddings", false)?;
    // The released configs name no mask id (the published generate takes `mask_id`): then
    // the tokenizer's mask token is it, resolved with the tokenizer (0 holds its place).
    let mask_from_tokenizer = map.get("mask_token_id").is_none_or(Value::is_null) && generation_mask.is_none();
    let base = qwen_style(&mut k, Family::Llada2Moe, "moe_intermediate_size", 1e-5, generation_mask.or(Some(0)))?;
    let hd = base.head_dim();
    if let Some(h) = k.usize("head_dim")? {
        if h != hd {
            return Err(k.err("head_dim", format!("{h} is not hidden_size / num_attention_heads ({hd}); only that head dimension is implemented")));
        }
    }
    // `int(head_dim * partial_rotary_factor)`, as the attention and the rotary tables take it
    // (the config's `rotary_dim`, if any, is not read by the code).
    let factor = k.f64("partial_rotary_factor", 0.5)?;
    let rotary = (hd as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || rotary == 0 || rotary > hd || rotary % 2 != 0 {
        return Err(k.err("partial_rotary_factor", format!("{factor} of head_dim {hd} is {rotary} rotary dimensions; expected an even number from 2 to {hd}")));
    }
    let experts = k.required("num_experts")?;
    let top_k = k.required("num_experts_per_tok")?;
    if top_k > experts {
        return Err(k.err("num_experts_per_tok", format!("{top_k} is more than num_experts {experts}")));
    }
    if experts > llada_ir::verify::MAX_EXPERTS as usize {
        return Err(k.err("num_experts", format!("{experts} is more than the {} the artifact format allows", llada_ir::verify::MAX_EXPERTS)));
    }
    let groups = k.usize("n_group")?.unwrap_or(1);
    let top_groups = k.usize("topk_group")?.unwrap_or(groups);
    if experts % groups != 0 || experts / groups < 2 || groups > llada_ir::verify::MAX_ROUTER_GROUPS as usize {
        return Err(k.err("n_group", format!("{groups} groups of {experts} experts: expected whole groups of at least two, at most {} groups", llada_ir::verify::MAX_ROUTER_GROUPS)));
    }
    if top_groups > groups || top_groups * (experts / groups) < top_k {
        return Err(k.err("topk_group", format!("{top_groups} of {groups} groups of {} experts cannot hold num_experts_per_tok {top_k}", experts / groups)));
    }
    // The gate divides by the picks' sum whenever it picks more than one (`norm_topk_prob`
    // is not read).
    let normalize = top_k > 1;
    let scale = k.float("routed_scaling_factor", 1.0, false)?;
    let dense_layers = k.integer("first_k_dense_replace", 0, u32::MAX as u64, "a layer count")?.unwrap_or(0) as usize;
    if dense_layers >= base.dims.n_layers {
        return Err(k.err("first_k_dense_replace", format!("{dense_layers} dense layers of {} leave none with experts", base.dims.n_layers)));
    }
    let dense_hidden = k.required("intermediate_size")?;
    let shared_experts = k.integer("num_shared_experts", 0, 64, "a count of shared experts")?.unwrap_or(0) as usize;
    let use_qk_norm = k.bool("use_qk_norm", true)?;
    warnings.extend(k.unknown(ACCEPTED_KEYS));
    if tie {
        warnings.push(format!("{}: tie_word_embeddings is true: the output head is the embedding (lm_head.weight is not read)", path.display()));
    }
    let cfg = LladaConfig {
        qk_norm: use_qk_norm,
        moe: Some(MoeSettings { experts, top_k }),
        llada2: Some(Llada2Settings { rotary_dim: rotary, dense_layers, dense_hidden, shared_hidden: shared_experts * base.dims.mlp_hidden, groups, top_groups, normalize, scale, tie_embeddings: tie, mask_from_tokenizer }),
        diffusion_gemma: None,
        ..base
    };
    Ok((cfg, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// LLaDA2.0-mini's shape, as its published config.json has it.
    pub(crate) fn mini() -> Value {
        json!({
            "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe", "vocab_size": 157184, "hidden_size": 2048,
            "intermediate_size": 5120, "moe_intermediate_size": 512, "num_hidden_layers": 20, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 128, "num_experts": 256, "num_experts_per_tok": 8, "num_shared_experts": 1,
            "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "score_function": "sigmoid", "norm_topk_prob": true,
            "moe_router_enable_expert_bias": true, "first_k_dense_replace": 1, "partial_rotary_factor": 0.5, "rope_theta": 600000,
            "use_qk_norm": true, "use_qkv_bias": false, "use_bias": false, "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
            "max_position_embeddings": 32768, "hidden_act": "silu", "rope_scaling": null, "pad_token_id": 156892, "rotary_dim": 64,
            "sliding_window": 4096, "use_sliding_window": false, "norm_head": false, "norm_softmax": false, "use_rmsnorm": true,
            "using_split_qkv_in_self_attention": false, "router_dtype": "fp32", "dtype": "bfloat16", "max_window_layers": 28,
        })
    }

    fn parse_json(v: Value) -> Result<(LladaConfig, Vec<String>)> {
        parse(Path::new("config.json"), v.as_object().unwrap(), None)
    }

    #[test]
    fn reads_the_mini_shape() {
        assert!(is_llada2(mini().as_object().unwrap()));
        let (c, warnings) = parse_json(mini()).unwrap();
        let l2 = c.llada2.unwrap();
        assert_eq!((c.family, c.dims.d_model, c.dims.n_kv_heads, c.head_dim(), c.dims.mlp_hidden, c.moe), (Family::Llada2Moe, 2048, 4, 128, 512, Some(MoeSettings { experts: 256, top_k: 8 })));
        assert_eq!((l2.rotary_dim, l2.dense_layers, l2.dense_hidden, l2.shared_hidden, l2.groups, l2.top_groups, l2.scale), (64, 1, 5120, 512, 8, 4, 2.5));
        assert!(c.qk_norm && l2.normalize && !l2.tie_embeddings);
        assert!(warnings.is_empty(), "{warnings:?}");
    }

    #[test]
    fn refuses_what_the_reference_would_compute_differently_naming_the_key() {
        for (key, value) in [
            ("rope_scaling", json!({"type": "yarn", "factor": 4.0})),
            ("use_sliding_window", json!(true)),
            ("use_qkv_bias", json!(true)),
            ("hidden_act", json!("gelu")),
            ("partial_rotary_factor", json!(1.5)),
            ("head_dim", json!(64)),
            ("n_group", json!(3)),
            ("topk_group", json!(9)),
            ("first_k_dense_replace", json!(20)),
            ("model_type", json!("bailing_moe")),
        ] {
            let mut v = mini();
            v[key] = value;
            let msg = parse_json(v).unwrap_err().to_string();
            assert!(msg.contains(key), "{key}: {msg}");
        }
    }
}
