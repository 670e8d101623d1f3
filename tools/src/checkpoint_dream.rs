//! Dream's Hugging Face layout (Dream-org/Dream-v0-Instruct-7B, a Qwen2.5-style diffusion LM;
//! the project's conformance kit, `tests/data/dream-conformance/`, was written with the
//! published code and is the reference here): the `DreamModel` tensor names (biases on q, k
//! and v, none on o; untied `lm_head`), its `config.json` and `generation_config.json` keys,
//! its tokenizer files and Qwen2's chat template. The shard writer and the tokenizer are
//! `checkpoint`'s.

use std::path::Path;

use serde_json::{json, Value};

use crate::checkpoint_tokenizer::{added_tokens_decoder, tokenizer_json};
use crate::checkpoint_spec::{CheckpointSpec, Shape, SpecialIds};

/// Every tensor in the order `modeling_dream.py` registers them (a module's weight before its
/// bias), with its shape; norms are marked (the biases are not: they are small random values).
pub fn tensors(s: &Shape) -> Vec<(String, Vec<usize>, bool)> {
    let (d, f, hd) = (s.d_model, s.mlp_hidden_size, s.head_dim());
    let (q, kv) = (s.n_heads * hd, s.n_kv_heads * hd);
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![s.embedding_size, d], false)];
    for l in 0..s.n_layers {
        let name = |part: &str| format!("model.layers.{l}.{part}");
        for (proj, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            t.push((name(&format!("self_attn.{proj}.weight")), vec![rows, d], false));
            t.push((name(&format!("self_attn.{proj}.bias")), vec![rows], false));
        }
        t.push((name("self_attn.o_proj.weight"), vec![d, q], false));
        t.push((name("mlp.gate_proj.weight"), vec![f, d], false));
        t.push((name("mlp.up_proj.weight"), vec![f, d], false));
        t.push((name("mlp.down_proj.weight"), vec![d, f], false));
        t.push((name("input_layernorm.weight"), vec![d], true));
        t.push((name("post_attention_layernorm.weight"), vec![d], true));
    }
    t.push(("model.norm.weight".to_string(), vec![d], true));
    t.push(("lm_head.weight".to_string(), vec![s.embedding_size, d], false));
    t
}

/// `config.json` with the key set and values of Dream-v0-Instruct-7B's, the shape's sizes in
/// place of the 7B's: `bos_token_id` is the end-of-text id, as published; `vocab_size` is the
/// embedding's rows (Dream has one size for both); `max_window_layers` the layer count.
pub fn config_json(spec: &CheckpointSpec, special: SpecialIds) -> Value {
    let s = &spec.shape;
    // The f32's shortest decimal (0.02, not 0.019999999552965164).
    let init_std: f64 = spec.init_std.to_string().parse().expect("a float's decimal parses");
    json!({
        "architectures": ["DreamModel"],
        "attention_dropout": 0.0,
        "auto_map": {
            "AutoConfig": "configuration_dream.DreamConfig",
            "AutoModel": "modeling_dream.DreamModel"
        },
        "bos_token_id": special.eos,
        "eos_token_id": special.eos,
        "hidden_act": "silu",
        "hidden_size": s.d_model,
        "initializer_range": init_std,
        "intermediate_size": s.mlp_hidden_size,
        "mask_token_id": special.mask,
        "max_position_embeddings": s.max_sequence_length,
        "max_window_layers": s.n_layers,
        "model_type": "Dream",
        "num_attention_heads": s.n_heads,
        "num_hidden_layers": s.n_layers,
        "num_key_value_heads": s.n_kv_heads,
        "pad_token_id": special.eos,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": s.rope_theta,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "torch_dtype": spec.weights.torch_name(),
        "transformers_version": "4.46.2",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": s.embedding_size
    })
}

/// `generation_config.json` as published: `diffusion_generate`'s defaults (alg `origin`, 512
/// steps, eps 0.001) and no mask id (the sampler takes it from `config.json`).
pub fn generation_config_json(special: SpecialIds) -> Value {
    json!({
        "_from_model_config": true,
        "alg": "origin",
        "alg_temp": null,
        "bos_token_id": special.eos,
        "eos_token_id": special.eos,
        "eps": 0.001,
        "mask_token_id": null,
        "output_history": false,
        "pad_token_id": special.eos,
        "steps": 512,
        "temperature": 0.0,
        "top_k": null,
        "top_p": null,
        "transformers_version": "4.46.2"
    })
}

/// Dream's (Qwen2's) chat template, as in the conformance kit's `tokenizer_config.json`: a
/// default system turn when the first message is not one, `<|im_start|>role\n...<|im_end|>\n`
/// per message, and `<|im_start|>assistant\n` as the generation prompt.
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// `tokenizer_config.json` with the conformance kit's keys (the published ones, but
/// `PreTrainedTokenizerFast` for the published `DreamTokenizer`, which needs
/// `tokenization_dream.py`).
pub fn tokenizer_config_json(special: SpecialIds, shape: &Shape) -> Value {
    let decoder = added_tokens_decoder(special);
    json!({
        "add_prefix_space": false,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": "<|beginoftext|>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": shape.max_sequence_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": null
    })
}

/// Everything but the weights: `config.json`, `generation_config.json`, `tokenizer.json`,
/// `tokenizer_config.json` and `special_tokens_map.json`.
pub fn write_metadata(spec: &CheckpointSpec, special: SpecialIds, dir: &Path) -> std::io::Result<()> {
    let write = |name: &str, v: &Value| crate::checkpoint_files::write_json(&dir.join(name), v);
    write("config.json", &config_json(spec, special))?;
    write("generation_config.json", &generation_config_json(special))?;
    write("tokenizer.json", &tokenizer_json(special))?;
    write("tokenizer_config.json", &tokenizer_config_json(special, &spec.shape))?;
    write(
        "special_tokens_map.json",
        &json!({
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": "<|beginoftext|>",
            "eos_token": "<|endoftext|>",
            "mask_token": "<|mask|>",
            "pad_token": "<|endoftext|>"
        }),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::checkpoint::{bpe_vocab, write_sharded, ChatFormat, WeightType};

    /// The conformance kit's checkpoint, written with the published code.
    const KIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/dream-conformance/tiny-dream-A");

    fn read_json(path: &Path) -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
    }

    fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn the_7b_shape_has_the_published_parameter_count() {
        // Qwen2.5-7B's 7.62B (7.07B besides the embedding and the untied head).
        let s = Shape::dream_7b();
        assert_eq!(s.parameters(), 7_615_616_512);
        let embeddings = 2 * (s.embedding_size * s.d_model) as u64;
        assert_eq!(s.parameters() - embeddings, 6_525_621_760);
        assert_eq!(SpecialIds::for_shape(&s), SpecialIds::DREAM);
    }

    #[test]
    fn the_7b_config_is_the_published_one() {
        // Dream-v0-Instruct-7B's config.json, as published (the file compiler/src/hf/config_dream.rs parses).
        let published: Value = serde_json::from_str(include_str!("../../compiler/tests/data/dream-v0-instruct-7b.config.json")).unwrap();
        let spec = CheckpointSpec { shape: Shape::dream_7b(), weights: WeightType::Bf16, shard_bytes: u64::MAX, seed: 0, init_std: 0.02, outliers: None };
        // Through `checkpoint::config_json`, which picks the layout by family.
        assert_eq!(crate::checkpoint::config_json(&spec, SpecialIds::for_shape(&spec.shape)), published);
    }

    #[test]
    fn a_tiny_checkpoint_has_every_tensor_and_the_kits_keys() {
        let spec = CheckpointSpec { shape: Shape::tiny_dream(), weights: WeightType::F32, shard_bytes: 300_000, seed: 1, init_std: 0.02, outliers: None };
        let (dir, w, map) = write_sharded(&spec);
        assert_eq!(w.bytes, spec.shape.parameters() * 4);
        assert_eq!(map.len(), 1 + 2 * 12 + 2);
        for l in 0..2 {
            for part in ["q_proj", "k_proj", "v_proj"] {
                for what in ["weight", "bias"] {
                    assert!(map.contains_key(&format!("model.layers.{l}.self_attn.{part}.{what}")), "layer {l} {part}.{what}");
                }
            }
            assert!(!map.contains_key(&format!("model.layers.{l}.self_attn.o_proj.bias")));
        }
        assert!(map.contains_key("model.embed_tokens.weight") && map.contains_key("lm_head.weight") && map.contains_key("model.norm.weight"));

        // Biases are small random values, norms near one.
        let name = "model.layers.1.self_attn.k_proj.bias";
        let bytes = std::fs::read(dir.path().join(map[name].as_str().unwrap())).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let values: Vec<f32> = st.tensor(name).unwrap().data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        assert_eq!(values.len(), 2 * 32);
        assert!(values.iter().all(|v| v.abs() < 0.2) && values.iter().any(|&v| v != 0.0), "{values:?}");
        let name = "model.layers.1.input_layernorm.weight";
        let bytes = std::fs::read(dir.path().join(map[name].as_str().unwrap())).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(st.tensor(name).unwrap().data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).all(|v| (0.5..1.5).contains(&v)));

        // config.json: the kit's key set; its sizes are the kit's but for the layer count.
        let kit = Path::new(KIT);
        let cfg = read_json(&dir.path().join("config.json"));
        assert_eq!(keys(&cfg), keys(&read_json(&kit.join("config.json"))));
        let kit_cfg = read_json(&kit.join("config.json"));
        for key in [
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "max_position_embeddings",
            "rope_theta",
            "torch_dtype",
        ] {
            assert_eq!(cfg[key], kit_cfg[key], "{key}");
        }
        // At this vocabulary size the special tokens come right after the byte tokens and merges.
        let first = bpe_vocab().0.len() as u64;
        assert_eq!((cfg["eos_token_id"].as_u64(), cfg["bos_token_id"].as_u64(), cfg["mask_token_id"].as_u64()), (Some(first), Some(first), Some(first + 4)));
        for file in ["generation_config.json", "tokenizer_config.json"] {
            assert_eq!(keys(&read_json(&dir.path().join(file))), keys(&read_json(&kit.join(file))), "{file}");
        }
        let tc = read_json(&dir.path().join("tokenizer_config.json"));
        let kit_tc = read_json(&kit.join("tokenizer_config.json"));
        assert_eq!(tc["chat_template"], kit_tc["chat_template"]);
        assert_eq!(tc["model_max_length"], kit_tc["model_max_length"]);
        assert_eq!(read_json(&dir.path().join("special_tokens_map.json")), read_json(&kit.join("special_tokens_map.json")));
        let contents = |v: &Value| -> Vec<Value> { v["added_tokens_decoder"].as_object().unwrap().values().map(|t| t["content"].clone()).collect() };
        assert_eq!(contents(&tc), contents(&kit_tc));
        let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        assert_eq!(tok.token_to_id("<|mask|>"), Some(first as u32 + 4));
    }

    #[test]
    fn the_tokenizer_encodes_the_chat_templates_special_tokens() {
        let tiny = SpecialIds::for_shape(&Shape::tiny_dream());
        let first = bpe_vocab().0.len() as u32;
        assert_eq!((tiny.eos, tiny.start_header, tiny.eot, tiny.bos, tiny.mask, tiny.end_header), (first, first + 1, first + 2, first + 3, first + 4, None));
        assert_eq!((tiny.chat, tiny.lowest(), tiny.highest()), (ChatFormat::Dream, first, first + 4));
        // What the template renders for one user message, then a masked answer.
        let prompt = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
        for special in [SpecialIds::DREAM, tiny] {
            let tok: tokenizers::Tokenizer = tokenizer_json(special).to_string().parse().unwrap();
            let text = format!("{prompt}<|mask|><|mask|><|endoftext|><|beginoftext|>");
            let ids = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
            assert_eq!(ids[0], special.start_header);
            assert_eq!(ids.iter().filter(|&&i| i == special.start_header).count(), 3);
            assert_eq!(ids.iter().filter(|&&i| i == special.eot).count(), 2);
            assert_eq!(ids[ids.len() - 4..], [special.mask, special.mask, special.eos, special.bos]);
            // "system", "user" and "assistant" are single tokens, as in Qwen2's vocabulary.
            let system = tok.token_to_id("system").unwrap();
            assert_eq!(ids[1], system);
            assert_eq!(tok.decode(&ids, false).unwrap(), text);
        }
        assert_eq!(
            (SpecialIds::DREAM.eos, SpecialIds::DREAM.start_header, SpecialIds::DREAM.eot, SpecialIds::DREAM.bos, SpecialIds::DREAM.mask),
            (151643, 151644, 151645, 151665, 151666)
        );
    }
}
