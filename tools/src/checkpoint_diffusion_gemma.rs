//! DiffusionGemma's Hugging Face layout (google/diffusiongemma-26B-A4B-it; transformers 5.23's
//! `diffusion_gemma` and `gemma4` modeling code, and the project's conformance kit,
//! `tests/data/diffusiongemma-conformance/`, whose README records the real checkpoint's
//! `config.json` and `generation_config.json`): the tensors `save_pretrained` stores (the text
//! weights once, under `model.decoder.*`; the encoder's tied copies and `lm_head` absent but for
//! its own `layer_scalar`s; the vision tower and its projection under `model.encoder.*`), the
//! two configs with the real files' keys, Gemma 4's special tokens and its chat template. The
//! shard writer and the tokenizer are `checkpoint`'s.

use std::path::Path;

use serde_json::{json, Value};

use crate::checkpoint_spec::{CheckpointSpec, DiffusionGemmaShape, Shape, SpecialIds, VisionShape};
use crate::checkpoint_tokenizer::{added_tokens_decoder, tokenizer_json};

/// The `transformers_version` the real configs were saved with (its generation_config.json's).
const REAL_TRANSFORMERS_VERSION: &str = "5.8.0.dev0";

/// Every stored tensor in `state_dict` order, with its shape; the ones whose values sit near
/// one (RMSNorm weights, used as they are, not as `1 + w`; the layer scalars; the router's
/// scales; the vision tower's output scale) are marked.
pub fn tensors(s: &Shape, dg: DiffusionGemmaShape) -> Vec<(String, Vec<usize>, bool)> {
    let mut t: Vec<(String, Vec<usize>, bool)> = Vec::new();
    // Buffers, not parameters, so not tied to the decoder's: stored for the encoder as well.
    for l in 0..s.n_layers {
        t.push((format!("model.encoder.language_model.layers.{l}.layer_scalar"), vec![1], true));
    }
    vision_tensors(&mut t, dg.vision);
    t.push(("model.encoder.embed_vision.embedding_projection.weight".into(), vec![s.d_model, dg.vision.hidden], false));
    t.push(("model.decoder.embed_tokens.weight".into(), vec![s.embedding_size, s.d_model], false));
    for (l, full) in dg.full_layers(s.n_layers).into_iter().enumerate() {
        decoder_layer(&mut t, s, dg, l, full);
    }
    let (d, f) = (s.d_model, dg.dense_hidden);
    t.push(("model.decoder.norm.weight".into(), vec![d], true));
    t.push(("model.decoder.self_conditioning.pre_norm.weight".into(), vec![d], true));
    t.push(("model.decoder.self_conditioning.gate_proj.weight".into(), vec![f, d], false));
    t.push(("model.decoder.self_conditioning.up_proj.weight".into(), vec![f, d], false));
    t.push(("model.decoder.self_conditioning.down_proj.weight".into(), vec![d, f], false));
    t
}

/// What a norm's weights sit near: one, but `head_dim^-1/4` for the text layers' q and k
/// norms. Gemma 4 does not scale attention scores by `1/sqrt(head_dim)` (its trained q/k norms
/// carry the scale), so unit q/k norms would give scores of standard deviation
/// `sqrt(head_dim)` (16 at 256): near one-hot attention, which amplifies float32 rounding (the
/// tiny preset's first decoder pass then differed from a float64 run of the published code by
/// up to 8e-6 of its largest logit; 1e-6 with these). These weights give the scores unit
/// variance, as the usual scaling does.
pub fn norm_center(name: &str, shape: &[usize]) -> f32 {
    let qk = name.starts_with("model.decoder.") && (name.ends_with("self_attn.q_norm.weight") || name.ends_with("self_attn.k_norm.weight"));
    if qk { (shape[0] as f32).powf(-0.25) } else { 1.0 }
}

/// One decoder layer: attention (full layers wider heads, fewer key heads and no value
/// projection: their values are the keys), the dense GELU feed-forward, the router and the
/// fused experts (`gate_up_proj` rows: gate, then up).
fn decoder_layer(t: &mut Vec<(String, Vec<usize>, bool)>, s: &Shape, dg: DiffusionGemmaShape, l: usize, full: bool) {
    let (d, f, e, i) = (s.d_model, dg.dense_hidden, dg.moe.experts, s.mlp_hidden_size);
    let (hd, kv) = if full { (dg.full_head_dim, dg.full_kv_heads) } else { (dg.head_dim, s.n_kv_heads) };
    let name = |part: &str| format!("model.decoder.layers.{l}.{part}");
    let mut push = |part: &str, shape: Vec<usize>, near_one: bool| t.push((name(part), shape, near_one));
    push("layer_scalar", vec![1], true);
    push("self_attn.q_proj.weight", vec![s.n_heads * hd, d], false);
    push("self_attn.k_proj.weight", vec![kv * hd, d], false);
    if !full {
        push("self_attn.v_proj.weight", vec![kv * hd, d], false);
    }
    push("self_attn.o_proj.weight", vec![d, s.n_heads * hd], false);
    push("self_attn.q_norm.weight", vec![hd], true);
    push("self_attn.k_norm.weight", vec![hd], true);
    push("mlp.gate_proj.weight", vec![f, d], false);
    push("mlp.up_proj.weight", vec![f, d], false);
    push("mlp.down_proj.weight", vec![d, f], false);
    for norm in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"] {
        push(&format!("{norm}.weight"), vec![d], true);
    }
    push("router.scale", vec![d], true);
    push("router.per_expert_scale", vec![e], true);
    push("router.proj.weight", vec![e, d], false);
    push("experts.gate_up_proj", vec![e, 2 * i, d], false);
    push("experts.down_proj", vec![e, d, i], false);
    for norm in ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"] {
        push(&format!("{norm}.weight"), vec![d], true);
    }
}

/// Gemma 4's vision tower (`Gemma4VisionModel` with `standardize` and no clipped linears):
/// the output standardisation, the patch embedder (a 2-D position table), and its layers.
fn vision_tensors(t: &mut Vec<(String, Vec<usize>, bool)>, v: VisionShape) {
    let tower = |part: &str| format!("model.encoder.vision_tower.{part}");
    t.push((tower("std_bias"), vec![v.hidden], false));
    t.push((tower("std_scale"), vec![v.hidden], true));
    t.push((tower("patch_embedder.position_embedding_table"), vec![2, v.position_embedding_size, v.hidden], false));
    t.push((tower("patch_embedder.input_proj.weight"), vec![v.hidden, 3 * v.patch * v.patch], false));
    let (q, kv) = (v.heads * v.head_dim, v.kv_heads * v.head_dim);
    for l in 0..v.layers {
        let name = |part: &str| tower(&format!("encoder.layers.{l}.{part}"));
        t.push((name("self_attn.q_proj.linear.weight"), vec![q, v.hidden], false));
        t.push((name("self_attn.k_proj.linear.weight"), vec![kv, v.hidden], false));
        t.push((name("self_attn.v_proj.linear.weight"), vec![kv, v.hidden], false));
        t.push((name("self_attn.o_proj.linear.weight"), vec![v.hidden, q], false));
        t.push((name("self_attn.q_norm.weight"), vec![v.head_dim], true));
        t.push((name("self_attn.k_norm.weight"), vec![v.head_dim], true));
        t.push((name("mlp.gate_proj.linear.weight"), vec![v.intermediate, v.hidden], false));
        t.push((name("mlp.up_proj.linear.weight"), vec![v.intermediate, v.hidden], false));
        t.push((name("mlp.down_proj.linear.weight"), vec![v.hidden, v.intermediate], false));
        for norm in ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"] {
            t.push((name(&format!("{norm}.weight")), vec![v.hidden], true));
        }
    }
}

/// A special token's id by its text.
fn id_of(special: SpecialIds, text: &str) -> u32 {
    special.named().into_iter().find(|&(t, _)| t == text).map(|(_, id)| id).unwrap_or_else(|| panic!("Gemma 4's tokens include {text}"))
}

/// The f32's shortest decimal (0.02, not 0.019999999552965164).
fn short(x: f32) -> f64 {
    x.to_string().parse().expect("a float's decimal parses")
}

/// `config.json` with the real checkpoint's key sets (top level, `text_config`,
/// `vision_config`) and, for the 26B-A4B shape, its values; `eos_token_id` is `<eos>` and
/// `<turn|>` there (the generation config adds `<|tool_response>`).
pub fn config_json(spec: &CheckpointSpec, dg: DiffusionGemmaShape, special: SpecialIds) -> Value {
    let s = &spec.shape;
    let dtype = spec.weights.torch_name();
    let init = short(spec.init_std);
    let layer_types: Vec<&str> = dg.full_layers(s.n_layers).into_iter().map(|full| if full { "full_attention" } else { "sliding_attention" }).collect();
    let text = json!({
        "attention_bias": false,
        "attention_dropout": 0.0,
        "bos_token_id": special.bos,
        "dtype": dtype,
        "eos_token_id": special.eos,
        "final_logit_softcapping": 30.0,
        "global_head_dim": dg.full_head_dim,
        "head_dim": dg.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": s.d_model,
        "initializer_range": init,
        "intermediate_size": dg.dense_hidden,
        "layer_types": layer_types,
        "max_position_embeddings": s.max_sequence_length,
        "model_type": "diffusion_gemma_text",
        "moe_intermediate_size": s.mlp_hidden_size,
        "num_attention_heads": s.n_heads,
        "num_experts": dg.moe.experts,
        "num_global_key_value_heads": dg.full_kv_heads,
        "num_hidden_layers": s.n_layers,
        "num_key_value_heads": s.n_kv_heads,
        "pad_token_id": id_of(special, "<pad>"),
        "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "full_attention": { "partial_rotary_factor": 0.25, "rope_theta": dg.full_rope_theta, "rope_type": "proportional" },
            "sliding_attention": { "rope_theta": s.rope_theta, "rope_type": "default" }
        },
        "sliding_window": dg.sliding_window,
        "tie_word_embeddings": true,
        "top_k_experts": dg.moe.top_k,
        // As the real config: only image tokens would attend both ways, so the window stays as stored.
        "use_bidirectional_attention": "vision",
        "vocab_size": s.vocab_size
    });
    let v = dg.vision;
    let vision = json!({
        "attention_bias": false,
        "attention_dropout": 0.0,
        "default_output_length": v.soft_tokens,
        "dtype": dtype,
        "global_head_dim": v.head_dim,
        "head_dim": v.head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": v.hidden,
        "initializer_range": init,
        "intermediate_size": v.intermediate,
        "max_position_embeddings": 131072,
        "model_type": "gemma4_vision",
        "num_attention_heads": v.heads,
        "num_hidden_layers": v.layers,
        "num_key_value_heads": v.kv_heads,
        "patch_size": v.patch,
        "pooling_kernel_size": v.pooling_kernel,
        "position_embedding_size": v.position_embedding_size,
        "rms_norm_eps": 1e-6,
        "rope_parameters": { "rope_theta": 100.0, "rope_type": "default" },
        "standardize": true,
        "use_clipped_linears": false
    });
    json!({
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "boi_token_id": id_of(special, "<|image>"),
        "canvas_length": dg.canvas_length,
        "dtype": dtype,
        "eoi_token_id": id_of(special, "<image|>"),
        "eos_token_id": [special.eos, special.eot],
        "image_token_id": id_of(special, "<|image|>"),
        "initializer_range": init,
        "model_type": "diffusion_gemma",
        "text_config": text,
        "tie_word_embeddings": true,
        "transformers_version": REAL_TRANSFORMERS_VERSION,
        "vision_config": vision,
        "vision_soft_tokens_per_image": v.soft_tokens
    })
}

/// `generation_config.json` as published: the entropy-bound sampler's settings, one canvas of
/// new tokens, and `<eos>`, `<turn|>` and `<|tool_response>` as end ids.
pub fn generation_config_json(dg: DiffusionGemmaShape, special: SpecialIds) -> Value {
    json!({
        "confidence_threshold": 0.005,
        "eos_token_id": [special.eos, special.eot, id_of(special, "<|tool_response>")],
        "max_denoising_steps": 48,
        "max_new_tokens": dg.canvas_length,
        "pad_token_id": id_of(special, "<pad>"),
        "sampler_config": { "_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.1 },
        "stability_threshold": 1,
        "t_max": 0.8,
        "t_min": 0.4,
        "transformers_version": REAL_TRANSFORMERS_VERSION
    })
}

/// Gemma 4's chat template as the conformance kit has it (the 26B-A4B's turns and generation
/// prompt: `<bos>`, an optional system turn carrying `<|think|>` when thinking is enabled,
/// `<|turn>{role}\n{content}<turn|>\n` with the assistant as `model`, and `<|turn>model\n`
/// followed, unless thinking is enabled, by the closed empty thought channel). Tools and media
/// are left out.
pub const CHAT_TEMPLATE: &str = r#"{{- bos_token -}}
{%- if (enable_thinking is defined and enable_thinking) or messages[0]['role'] in ['system', 'developer'] -%}
    {{- '<|turn>system\n' -}}
    {%- if enable_thinking is defined and enable_thinking -%}
        {{- '<|think|>\n' -}}
    {%- endif -%}
    {%- if messages[0]['role'] in ['system', 'developer'] -%}
        {{- messages[0]['content'] | trim -}}
        {%- set loop_messages = messages[1:] -%}
    {%- else -%}
        {%- set loop_messages = messages -%}
    {%- endif -%}
    {{- '<turn|>\n' -}}
{%- else -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
    {{- '<|turn>' + role + '\n' -}}
    {{- message['content'] | trim -}}
    {{- '<turn|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|turn>model\n' -}}
    {%- if not enable_thinking | default(false) -%}
        {{- '<|channel>thought\n<channel|>' -}}
    {%- endif -%}
{%- endif -%}
"#;

/// `tokenizer_config.json` with the conformance kit's keys (the fast tokenizer class, which
/// reads the byte-level `tokenizer.json`, for the real repository's Gemma one).
pub fn tokenizer_config_json(special: SpecialIds, shape: &Shape) -> Value {
    json!({
        "added_tokens_decoder": added_tokens_decoder(special),
        "bos_token": "<bos>",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": false,
        "eos_token": "<eos>",
        "extra_special_tokens": ["<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>"],
        "mask_token": "<mask>",
        "model_max_length": shape.max_sequence_length,
        "pad_token": "<pad>",
        "padding_side": "left",
        "split_special_tokens": false,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>"
    })
}

/// Everything but the weights: `config.json`, `generation_config.json`, `tokenizer.json`,
/// `tokenizer_config.json` and `chat_template.jinja`.
pub fn write_metadata(spec: &CheckpointSpec, dg: DiffusionGemmaShape, special: SpecialIds, dir: &Path) -> std::io::Result<()> {
    let write = |name: &str, v: &Value| crate::checkpoint_files::write_json(&dir.join(name), v);
    write("config.json", &config_json(spec, dg, special))?;
    write("generation_config.json", &generation_config_json(dg, special))?;
    write("tokenizer.json", &tokenizer_json(special))?;
    write("tokenizer_config.json", &tokenizer_config_json(special, &spec.shape))?;
    llada_ir::files::write_atomic(&dir.join("chat_template.jinja"), &[], CHAT_TEMPLATE.as_bytes())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::checkpoint::{write_sharded, ChatFormat, WeightType};

    /// The conformance kit's checkpoint, written with the published code.
    const KIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/diffusiongemma-conformance/tiny-dg-A");

    /// google/diffusiongemma-26B-A4B-it's config.json, key for key, from the sources the kit's
    /// README names: the text config as two public ports quote it, the vision config as they
    /// and Gemma 4's (the same tower) give it; `eos_token_id` [1, 106] as the copies fetched
    /// from the repository have it; the version its generation_config.json carries.
    const REAL_CONFIG: &str = include_str!("../../compiler/tests/data/diffusiongemma-26b-a4b-it.config.json");

    /// Its generation_config.json, verbatim as public ports quote it.
    const REAL_GENERATION_CONFIG: &str = include_str!("../../compiler/tests/data/diffusiongemma-26b-a4b-it.generation_config.json");

    fn read_json(path: &Path) -> Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
    }

    fn keys(v: &Value) -> BTreeSet<String> {
        v.as_object().unwrap().keys().cloned().collect()
    }

    fn dg(s: &Shape) -> DiffusionGemmaShape {
        match s.family {
            crate::checkpoint::FamilyShape::DiffusionGemma(dg) => dg,
            _ => unreachable!("a DiffusionGemma shape"),
        }
    }

    fn spec(shape: Shape, weights: WeightType, shard_bytes: u64) -> CheckpointSpec {
        CheckpointSpec { shape, weights, shard_bytes, seed: 1, init_std: 0.02, outliers: None }
    }

    /// Tensor names and shapes of a safetensors file's header.
    fn header_shapes(path: &Path) -> BTreeMap<String, Vec<usize>> {
        let bytes = std::fs::read(path).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        meta.tensors().into_iter().map(|(name, info)| (name, info.shape.clone())).collect()
    }

    #[test]
    fn the_26b_config_and_generation_config_are_the_real_ones() {
        let s = Shape::diffusion_gemma_26b_a4b();
        let special = SpecialIds::for_shape(&s);
        assert_eq!(special, SpecialIds::GEMMA4);
        // Through `checkpoint::config_json`, which picks the layout by family.
        let cfg = crate::checkpoint::config_json(&spec(s.clone(), WeightType::Bf16, u64::MAX), special);
        let real: Value = serde_json::from_str(REAL_CONFIG).unwrap();
        for part in ["text_config", "vision_config"] {
            for key in keys(&real[part]) {
                assert_eq!(cfg[part][&key], real[part][&key], "{part}.{key}");
            }
        }
        assert_eq!(cfg, real);
        assert_eq!(generation_config_json(dg(&s), special), serde_json::from_str::<Value>(REAL_GENERATION_CONFIG).unwrap());
    }

    #[test]
    fn the_26b_shape_has_the_real_tensors() {
        // The real bf16 index: 1047 tensors, total_size 51,647,562,456 bytes (its
        // total_parameters, 25,823,778,864, leaves out the 2,364 values of buffers: the 60
        // layer scalars and the vision tower's std_bias and std_scale).
        let s = Shape::diffusion_gemma_26b_a4b();
        let t = s.tensors();
        assert_eq!(t.len(), 1047);
        assert_eq!(s.parameters() * 2, 51_647_562_456);
        let count = |prefix: &str| t.iter().filter(|(n, _, _)| n.starts_with(prefix)).count();
        assert_eq!((count("model.decoder."), count("model.encoder.vision_tower."), count("model.encoder.language_model.")), (661, 355, 30));
        // v_proj on the 25 sliding layers only: not on 5, 11, 17, 23, 29.
        let v: Vec<usize> = (0..30).filter(|l| t.iter().any(|(n, _, _)| *n == format!("model.decoder.layers.{l}.self_attn.v_proj.weight"))).collect();
        assert_eq!(v.len(), 25);
        assert!([5, 11, 17, 23, 29].iter().all(|l| !v.contains(l)));
        let shape = |name: &str| t.iter().find(|(n, _, _)| n == name).unwrap_or_else(|| panic!("{name}")).1.clone();
        assert_eq!(shape("model.decoder.layers.0.experts.gate_up_proj"), [128, 1408, 2816]);
        assert_eq!(shape("model.decoder.layers.0.experts.down_proj"), [128, 2816, 704]);
        assert_eq!(shape("model.decoder.layers.5.self_attn.q_proj.weight"), [8192, 2816]);
        assert_eq!(shape("model.decoder.layers.5.self_attn.k_proj.weight"), [1024, 2816]);
        assert_eq!(shape("model.decoder.layers.4.self_attn.v_proj.weight"), [2048, 2816]);
        assert_eq!(shape("model.decoder.layers.5.self_attn.o_proj.weight"), [2816, 8192]);
        assert_eq!(shape("model.decoder.self_conditioning.gate_proj.weight"), [2112, 2816]);
        assert_eq!(shape("model.encoder.embed_vision.embedding_projection.weight"), [2816, 1152]);
        assert_eq!(shape("model.encoder.vision_tower.patch_embedder.position_embedding_table"), [2, 10240, 1152]);
        assert_eq!(shape("model.encoder.vision_tower.patch_embedder.input_proj.weight"), [1152, 768]);
        assert_eq!(shape("model.encoder.vision_tower.encoder.layers.26.mlp.down_proj.linear.weight"), [1152, 4304]);

        // Fewer layers keep every other shape; the last layer is a full one, as the published
        // config forces it.
        let shallow = Shape { n_layers: 2, ..s };
        let cfg = crate::checkpoint::config_json(&spec(shallow.clone(), WeightType::Bf16, u64::MAX), SpecialIds::GEMMA4);
        assert_eq!(cfg["text_config"]["layer_types"], json!(["sliding_attention", "full_attention"]));
        // Decoder: 49 tensors for its two layers (22 and 21) and the 6 others, not 661; 2 encoder scalars, not 30.
        assert_eq!(shallow.tensors().len(), 1047 - (661 - 49) - (30 - 2));
    }

    #[test]
    fn the_tiny_preset_is_the_kits_checkpoint() {
        let spec = spec(Shape::tiny_diffusion_gemma(), WeightType::F32, 300_000);
        let (dir, w, map) = write_sharded(&spec);
        assert_eq!(w.bytes, spec.shape.parameters() * 4);
        // Every tensor under its name and shape in the kit (160, written by save_pretrained).
        let kit = Path::new(KIT);
        let want = header_shapes(&kit.join("model.safetensors"));
        let mut got = BTreeMap::new();
        for shard in &w.shards {
            got.extend(header_shapes(&dir.path().join(shard)));
        }
        assert_eq!(got, want);
        assert_eq!(map.len(), 160);
        // Norms near one, but the q/k norms near head_dim^-1/4 (16 on sliding layers, 32 on full ones).
        let values = |name: &str| -> Vec<f32> {
            let bytes = std::fs::read(dir.path().join(map[name].as_str().unwrap())).unwrap();
            let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            st.tensor(name).unwrap().data().chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
        };
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        for (name, center) in [
            ("model.decoder.layers.0.self_attn.q_norm.weight", 0.5),
            ("model.decoder.layers.2.self_attn.k_norm.weight", 32f32.powf(-0.25)),
            ("model.decoder.layers.2.input_layernorm.weight", 1.0),
            ("model.encoder.vision_tower.encoder.layers.0.self_attn.q_norm.weight", 1.0),
        ] {
            let v = values(name);
            assert!((mean(&v) - center).abs() < 0.1 * center && v.iter().all(|x| (x / center - 1.0).abs() < 0.5), "{name}: {v:?}");
        }

        // config.json: the kit's keys at every level and its values, but the ids of the image
        // markers (after this tokenizer's merges) and `eos_token_id` (the real config.json's two
        // ids; the kit gives the generation config's three); the version is the real one's.
        let cfg = read_json(&dir.path().join("config.json"));
        let kit_cfg = read_json(&kit.join("config.json"));
        let ours_only = ["boi_token_id", "eoi_token_id", "image_token_id", "eos_token_id", "transformers_version"];
        assert_eq!(keys(&cfg), keys(&kit_cfg));
        for key in keys(&kit_cfg).into_iter().filter(|k| !ours_only.contains(&k.as_str())) {
            assert_eq!(cfg[&key], kit_cfg[&key], "{key}");
        }
        let special = w.special;
        let first_image = 17 + crate::checkpoint::bpe_vocab().0.len() as u64;
        assert_eq!((cfg["boi_token_id"].as_u64(), cfg["image_token_id"].as_u64(), cfg["eoi_token_id"].as_u64()), (Some(first_image), Some(first_image + 1), Some(first_image + 2)));
        assert_eq!(cfg["eos_token_id"], json!([1, 16]));

        // generation_config.json: the real key set (the kit adds bos_token_id) and the kit's values.
        let generation = read_json(&dir.path().join("generation_config.json"));
        let kit_generation = read_json(&kit.join("generation_config.json"));
        assert_eq!(keys(&generation), keys(&serde_json::from_str::<Value>(REAL_GENERATION_CONFIG).unwrap()));
        for key in keys(&generation).into_iter().filter(|k| k != "transformers_version") {
            assert_eq!(generation[&key], kit_generation[&key], "{key}");
        }

        // The tokenizer: Gemma 4's low special tokens at the kit's ids, the kit's config keys and template.
        let tok = tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        let kit_tok = tokenizers::Tokenizer::from_file(kit.join("tokenizer.json")).unwrap();
        for (text, _) in crate::checkpoint_spec::GEMMA4_TOKENS {
            assert_eq!(tok.token_to_id(text), kit_tok.token_to_id(text), "{text}");
        }
        assert_eq!((special.chat, special.bos, special.eos, special.start_header, special.eot), (ChatFormat::Gemma4, 2, 1, 15, 16));
        let tc = read_json(&dir.path().join("tokenizer_config.json"));
        let kit_tc = read_json(&kit.join("tokenizer_config.json"));
        assert_eq!(keys(&tc), keys(&kit_tc));
        for key in ["bos_token", "eos_token", "pad_token", "mask_token", "unk_token", "extra_special_tokens", "model_max_length", "chat_template", "tokenizer_class"] {
            assert_eq!(tc[key], kit_tc[key], "{key}");
        }
        let template = std::fs::read_to_string(dir.path().join("chat_template.jinja")).unwrap();
        assert_eq!(template, std::fs::read_to_string(kit.join("chat_template.jinja")).unwrap());
        assert!(crate::checkpoint::is_written_here("chat_template.jinja"));
    }

    #[test]
    fn the_tokenizer_encodes_the_chat_templates_special_tokens() {
        let tiny = SpecialIds::for_shape(&Shape::tiny_diffusion_gemma());
        // What the template renders for one user message, with the generation prompt.
        let prompt = "<bos><|turn>user\nhi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";
        for (special, base) in [(SpecialIds::GEMMA4, 107), (tiny, 17)] {
            assert_eq!(special.ordinary_base(), base);
            let tok: tokenizers::Tokenizer = tokenizer_json(special).to_string().parse().unwrap();
            let ids = tok.encode(format!("{prompt}<|tool_response><|image><|image|><image|>").as_str(), false).unwrap().get_ids().to_vec();
            let id = |text: &str| tok.token_to_id(text).unwrap();
            let user = id("user");
            let newline = base + b'\n' as u32;
            assert_eq!(ids[..4], [special.bos, special.start_header, user, newline]);
            assert_eq!(ids[4..6], [base + b'h' as u32, base + b'i' as u32]);
            assert_eq!(ids[6..8], [special.eot, newline]);
            assert_eq!(ids.iter().filter(|&&i| i == special.start_header).count(), 2);
            let end = ids.len() - 4;
            assert_eq!(ids[end..], [id("<|tool_response>"), id("<|image>"), id("<|image|>"), id("<image|>")]);
            assert_eq!(tok.decode(&ids, false).unwrap(), format!("{prompt}<|tool_response><|image><|image|><image|>"));
        }
        let real = |text: &str| SpecialIds::GEMMA4.named().into_iter().find(|&(t, _)| t == text).unwrap().1;
        assert_eq!((real("<|tool_response>"), real("<|channel>"), real("<|image>"), real("<|image|>"), real("<image|>")), (50, 100, 255999, 258880, 258882));
        assert_eq!((tiny.lowest(), tiny.highest()), (0, 17 + crate::checkpoint::bpe_vocab().0.len() as u32 + 2));
    }
}
