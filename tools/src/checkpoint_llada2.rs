//! LLaDA 2.x's Hugging Face layout (LLaDA2.0-mini's `config.json` and
//! `modeling_llada2_moe.py`, read from public copies of the released files): the
//! `LLaDA2MoeModelLM` tensor names and its `config.json` keys. The chat format is LLaDA-MoE's
//! (the Ling tokenizer's roles) with `<|mask|>` the mask token; the shard writer and the
//! tokenizer are `checkpoint`'s.

use serde_json::{json, Value};

use crate::checkpoint_spec::{CheckpointSpec, Llada2Shape, Shape, SpecialIds};

/// Every tensor in the order `modeling_llada2_moe.py` registers them, with its shape; norms
/// are marked.
pub fn tensors(s: &Shape, l2: Llada2Shape) -> Vec<(String, Vec<usize>, bool)> {
    let (d, f, hd) = (s.d_model, s.mlp_hidden_size, s.head_dim());
    let mut t = vec![("model.word_embeddings.weight".to_string(), vec![s.embedding_size, d], false)];
    let swiglu = |t: &mut Vec<(String, Vec<usize>, bool)>, prefix: String, width: usize| {
        t.push((format!("{prefix}.gate_proj.weight"), vec![width, d], false));
        t.push((format!("{prefix}.up_proj.weight"), vec![width, d], false));
        t.push((format!("{prefix}.down_proj.weight"), vec![d, width], false));
    };
    for l in 0..s.n_layers {
        let name = |part: &str| format!("model.layers.{l}.{part}");
        t.push((name("attention.query_key_value.weight"), vec![(s.n_heads + 2 * s.n_kv_heads) * hd, d], false));
        t.push((name("attention.query_layernorm.weight"), vec![hd], true));
        t.push((name("attention.key_layernorm.weight"), vec![hd], true));
        t.push((name("attention.dense.weight"), vec![d, s.n_heads * hd], false));
        if l < l2.dense_layers {
            swiglu(&mut t, name("mlp"), l2.dense_hidden);
        } else {
            for e in 0..l2.moe.experts {
                swiglu(&mut t, name(&format!("mlp.experts.{e}")), f);
            }
            t.push((name("mlp.gate.weight"), vec![l2.moe.experts, d], false));
            t.push((name("mlp.gate.expert_bias"), vec![l2.moe.experts], false));
            if l2.shared_experts > 0 {
                swiglu(&mut t, name("mlp.shared_experts"), f * l2.shared_experts);
            }
        }
        t.push((name("input_layernorm.weight"), vec![d], true));
        t.push((name("post_attention_layernorm.weight"), vec![d], true));
    }
    t.push(("model.norm.weight".to_string(), vec![d], true));
    t.push(("lm_head.weight".to_string(), vec![s.embedding_size, d], false));
    t
}

/// `config.json` with LLaDA2.0-mini's keys (its configuration class `LLaDA2MoeConfig`): no
/// mask id and no EOS (the published `generate` takes them as arguments).
pub fn config_json(spec: &CheckpointSpec, l2: Llada2Shape, special: SpecialIds) -> Value {
    let s = &spec.shape;
    json!({
        "architectures": ["LLaDA2MoeModelLM"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
            "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
            "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"
        },
        "dtype": spec.weights.torch_name(),
        "embedding_dropout": 0.0,
        "first_k_dense_replace": l2.dense_layers,
        "head_dim": s.head_dim(),
        "hidden_act": "silu",
        "hidden_size": s.d_model,
        "initializer_range": spec.init_std,
        "intermediate_size": l2.dense_hidden,
        "max_position_embeddings": s.max_sequence_length,
        "max_window_layers": 28,
        "model_type": "llada2_moe",
        "moe_intermediate_size": s.mlp_hidden_size,
        "moe_router_enable_expert_bias": true,
        "n_group": l2.groups,
        "norm_head": false,
        "norm_softmax": false,
        "norm_topk_prob": true,
        "num_attention_heads": s.n_heads,
        "num_experts": l2.moe.experts,
        "num_experts_per_tok": l2.moe.top_k,
        "num_hidden_layers": s.n_layers,
        "num_key_value_heads": s.n_kv_heads,
        "num_shared_experts": l2.shared_experts,
        "output_dropout": 0.0,
        "output_router_logits": false,
        "pad_token_id": special.eos,
        "partial_rotary_factor": 0.5,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": s.rope_theta,
        "rotary_dim": s.head_dim() / 2,
        "routed_scaling_factor": 2.5,
        "router_dtype": "fp32",
        "score_function": "sigmoid",
        "sliding_window": 4096,
        "tie_word_embeddings": false,
        "topk_group": l2.top_groups,
        "transformers_version": "4.57.1",
        "use_bias": false,
        "use_cache": false,
        "use_qkv_bias": false,
        "use_rmsnorm": true,
        "use_sliding_window": false,
        "using_split_qkv_in_self_attention": false,
        "vocab_size": s.vocab_size
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mini_shape_has_the_published_parameter_count() {
        // 16B in all; about 1.4B active per token (8 of 256 experts and the shared one).
        let s = Shape::llada2_mini();
        let total = s.parameters() as f64;
        assert!((16.0e9..16.5e9).contains(&total), "{total}");
        let expert = 3.0 * (s.d_model * s.mlp_hidden_size) as f64;
        let active = total - expert * 248.0 * 19.0;
        assert!((1.3e9..1.6e9).contains(&active), "{active}");
    }
}
