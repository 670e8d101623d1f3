//! LLaDA-MoE's Hugging Face layout (LLaDA-MoE-7B-A1B; facts and where they come from in
//! BACKGROUND.md section 2, checked against the public `modeling_lladamoe.py` copies): the
//! `LLaDAMoEModelLM` tensor names, its `config.json` keys, and its chat template. The shard
//! writer and the tokenizer are `checkpoint`'s.

use serde_json::{json, Value};

use crate::checkpoint_spec::{CheckpointSpec, MoeShape, Shape, SpecialIds};

/// Every tensor in the order `modeling_lladamoe.py` registers them, with its shape; norms
/// are marked.
pub fn tensors(s: &Shape, moe: MoeShape) -> Vec<(String, Vec<usize>, bool)> {
    let (d, f, hd) = (s.d_model, s.mlp_hidden_size, s.head_dim());
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![s.embedding_size, d], false)];
    for l in 0..s.n_layers {
        let name = |part: &str| format!("model.layers.{l}.{part}.weight");
        t.push((name("self_attn.q_proj"), vec![s.n_heads * hd, d], false));
        t.push((name("self_attn.k_proj"), vec![s.n_kv_heads * hd, d], false));
        t.push((name("self_attn.v_proj"), vec![s.n_kv_heads * hd, d], false));
        t.push((name("self_attn.o_proj"), vec![d, s.n_heads * hd], false));
        t.push((name("self_attn.q_norm"), vec![hd], true));
        t.push((name("self_attn.k_norm"), vec![hd], true));
        t.push((name("mlp.gate"), vec![moe.experts, d], false));
        for e in 0..moe.experts {
            t.push((name(&format!("mlp.experts.{e}.gate_proj")), vec![f, d], false));
            t.push((name(&format!("mlp.experts.{e}.up_proj")), vec![f, d], false));
            t.push((name(&format!("mlp.experts.{e}.down_proj")), vec![d, f], false));
        }
        t.push((name("input_layernorm"), vec![d], true));
        t.push((name("post_attention_layernorm"), vec![d], true));
    }
    t.push(("model.norm.weight".to_string(), vec![d], true));
    t.push(("lm_head.weight".to_string(), vec![s.embedding_size, d], false));
    t
}

/// `config.json` with the keys of `configuration_lladamoe.py` (its class is `LLaDAConfig` with
/// `model_type` "llada"; `LLaDAMoEModelLM` is the architecture). The released config sets no
/// mask id (it is in `generation_config.json`) and no BOS.
pub fn config_json(spec: &CheckpointSpec, moe: MoeShape, special: SpecialIds) -> Value {
    let s = &spec.shape;
    json!({
        "architectures": ["LLaDAMoEModelLM"],
        "auto_map": {
            "AutoConfig": "configuration_lladamoe.LLaDAConfig",
            "AutoModel": "modeling_lladamoe.LLaDAMoEModel",
            "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"
        },
        "model_type": "llada",
        "vocab_size": s.vocab_size,
        "hidden_size": s.d_model,
        "dense_intermediate_size": 4 * s.d_model,
        "expert_intermediate_size": s.mlp_hidden_size,
        "shared_expert_intermediate_size": null,
        "num_hidden_layers": s.n_layers,
        "num_attention_heads": s.n_heads,
        "num_key_value_heads": s.n_kv_heads,
        "hidden_act": "silu",
        "max_position_embeddings": s.max_sequence_length,
        "initializer_range": spec.init_std,
        "rms_norm_eps": 1e-5,
        "use_cache": false,
        "pad_token_id": special.eos,
        "bos_token_id": null,
        "eos_token_id": special.eos,
        "tie_word_embeddings": false,
        "rope_theta": s.rope_theta,
        "rope_scaling": null,
        "partial_rotary_factor": 1,
        "attention_bias": false,
        "attention_dropout": 0.0,
        "clip_qkv": null,
        "num_experts_per_tok": moe.top_k,
        "num_experts": moe.experts,
        "output_router_logits": false,
        "router_aux_loss_coef": 0.01,
        "norm_topk_prob": false,
        "qk_layernorm": true,
        "moe_layer_freq": vec![1; s.n_layers],
        "moe_router_enable_expert_bias": false,
        "moe_router_score_function": "softmax",
        "routed_scaling_factor": 1,
        "router_num_group": null,
        "router_topk_group": null,
        "torch_dtype": spec.weights.torch_name(),
        "transformers_version": "4.46.3"
    })
}

/// LLaDA-MoE's chat format as dInfer's benchmark writes it: `<role>HUMAN</role>` before the
/// user's words, `<|role_end|>` after each turn, and `<role>ASSISTANT</role>` to start the
/// answer.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}<role>{% if message['role'] == 'user' %}HUMAN{% elif message['role'] == 'assistant' %}ASSISTANT{% else %}{{ message['role'] | upper }}{% endif %}</role>{{ message['content'] | trim }}<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{tokenizer_json, write_sharded, WeightType};

    #[test]
    fn the_7b_shape_has_the_published_parameter_count() {
        // 7B in all; about 1B active per token besides the embedding and the head (8 of
        // 64 experts).
        let s = Shape::llada_moe_7b();
        let total = s.parameters() as f64;
        assert!((7.0e9..7.5e9).contains(&total), "{total}");
        let expert = 3.0 * (s.d_model * s.mlp_hidden_size) as f64;
        let active = total - expert * 64.0 * 16.0 + expert * 8.0 * 16.0 - 2.0 * (s.embedding_size * s.d_model) as f64;
        assert!((1.0e9..1.2e9).contains(&active), "{active}");
    }

    #[test]
    fn the_tokenizer_knows_the_role_tokens() {
        let special = SpecialIds::LLADA_MOE;
        let tok: tokenizers::Tokenizer = tokenizer_json(special).to_string().parse().unwrap();
        let ids = tok.encode("<role>HUMAN</role>Hi<|role_end|><|mdm_mask|>", false).unwrap().get_ids().to_vec();
        assert_eq!(ids[0], special.start_header);
        assert_eq!(*ids.last().unwrap(), 156895);
        assert!(ids.contains(&special.end_header.unwrap()) && ids.contains(&special.eot));
    }

    #[test]
    fn a_tiny_checkpoint_has_every_expert() {
        let spec = CheckpointSpec { shape: Shape::tiny_moe(), weights: WeightType::F32, shard_bytes: 100_000, seed: 1, init_std: 0.02, outliers: None };
        let (dir, _, map) = write_sharded(&spec);
        assert!(map.contains_key("model.layers.1.mlp.experts.7.down_proj.weight"));
        assert_eq!(map.len(), 1 + 2 * (7 + 3 * 8 + 2) + 2);
        let cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!((cfg["num_experts"].as_u64(), cfg["num_experts_per_tok"].as_u64()), (Some(8), Some(2)));
    }
}
