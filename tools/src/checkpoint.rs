//! Random-weight checkpoints in exact Hugging Face layout: `config.json` with the keys of
//! LLaDA-8B-Instruct's (or LLaDA-MoE-7B-A1B's, see `checkpoint_moe`, LLaDA2.0-mini's, see
//! `checkpoint_llada2`, Dream-v0-Instruct-7B's, see `checkpoint_dream`, or
//! diffusiongemma-26B-A4B-it's, see `checkpoint_diffusion_gemma`), weights as safetensors
//! (sharded with `model.safetensors.index.json` when they exceed one shard), a byte-level BPE
//! `tokenizer.json` whose special tokens sit at the model's ids, and `tokenizer_config.json`
//! with its chat template.
//!
//! Tensors are generated one at a time while the shard is written, each from its own seeded
//! stream, so an 8B checkpoint never has to fit in memory and the bytes of a tensor do not
//! depend on how the checkpoint is sharded.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use safetensors::{Dtype, View};
use serde_json::{json, Value};

use crate::checkpoint_files::{write_json, write_safetensors};
pub use crate::checkpoint_spec::{ChatFormat, CheckpointSpec, DiffusionGemmaShape, FamilyShape, Llada2Shape, MoeShape, Outliers, Shape, SpecialIds, VisionShape, WeightType};
pub use crate::checkpoint_tokenizer::{bpe_vocab, tokenizer_json};
use crate::checkpoint_tokenizer::added_tokens_decoder;

/// The layouts of a shape, here where all (LLaDA's, LLaDA-MoE's from `checkpoint_moe` and
/// Dream's from `checkpoint_dream`) are known.
impl Shape {
    /// Every tensor of the checkpoint in the model's order, with its shape; norms are marked.
    pub fn tensors(&self) -> Vec<(String, Vec<usize>, bool)> {
        match self.family {
            FamilyShape::Llada => {}
            FamilyShape::LladaMoe(moe) => return crate::checkpoint_moe::tensors(self, moe),
            FamilyShape::Dream => return crate::checkpoint_dream::tensors(self),
            FamilyShape::Llada2(l2) => return crate::checkpoint_llada2::tensors(self, l2),
            FamilyShape::DiffusionGemma(dg) => return crate::checkpoint_diffusion_gemma::tensors(self, dg),
        }
        let (d, f, hd) = (self.d_model, self.mlp_hidden_size, self.head_dim());
        let mut t = vec![("model.transformer.wte.weight".to_string(), vec![self.embedding_size, d], false)];
        for l in 0..self.n_layers {
            let name = |part: &str| format!("model.transformer.blocks.{l}.{part}.weight");
            t.push((name("attn_norm"), vec![d], true));
            t.push((name("q_proj"), vec![self.n_heads * hd, d], false));
            t.push((name("k_proj"), vec![self.n_kv_heads * hd, d], false));
            t.push((name("v_proj"), vec![self.n_kv_heads * hd, d], false));
            t.push((name("attn_out"), vec![d, self.n_heads * hd], false));
            t.push((name("ff_norm"), vec![d], true));
            t.push((name("ff_proj"), vec![f, d], false));
            t.push((name("up_proj"), vec![f, d], false));
            t.push((name("ff_out"), vec![d, f], false));
        }
        t.push(("model.transformer.ln_f.weight".to_string(), vec![d], true));
        t.push(("model.transformer.ff_out.weight".to_string(), vec![self.embedding_size, d], false));
        t
    }

    pub fn parameters(&self) -> u64 {
        self.tensors().iter().map(|(_, s, _)| s.iter().product::<usize>() as u64).sum()
    }

    /// The token embedding's tensor, whose columns `Outliers` scales.
    pub fn embedding_tensor(&self) -> &'static str {
        match self.family {
            FamilyShape::Llada => "model.transformer.wte.weight",
            FamilyShape::LladaMoe(_) | FamilyShape::Dream => "model.embed_tokens.weight",
            FamilyShape::Llada2(_) => "model.word_embeddings.weight",
            FamilyShape::DiffusionGemma(_) => "model.decoder.embed_tokens.weight",
        }
    }
}

/// Ids laid out for the tokenizer of [`tokenizer_json`].
impl SpecialIds {
    /// Where the special tokens go for a shape: the model's ids when the vocabulary is the
    /// model's size, otherwise right after the byte tokens and merges of [`bpe_vocab`] (Gemma
    /// 4's low ones before them, from id 0, as in its vocabulary).
    pub fn for_shape(shape: &Shape) -> SpecialIds {
        let chat = shape.family.chat_format();
        let full = SpecialIds::of(chat);
        if shape.embedding_size > full.highest() as usize {
            return full;
        }
        let first = if chat == ChatFormat::Gemma4 { 0 } else { bpe_vocab().0.len() as u32 };
        SpecialIds::packed(chat, first)
    }
}

/// A tensor generated when the shard writer asks for its bytes.
struct LazyTensor {
    shape: Vec<usize>,
    weights: WeightType,
    /// Norm weights are ones, like an initialised LLaDA (the other families': one plus
    /// normal(0, 0.1), so tests see a norm's weight applied; DiffusionGemma's layer scalars and
    /// router scales too); matrices (and Dream's biases) are normal(0, std).
    is_norm: bool,
    norm_jitter: bool,
    /// What a norm's weights sit near: 1, but DiffusionGemma's q/k norms' (see
    /// `checkpoint_diffusion_gemma::norm_center`).
    norm_center: f32,
    std: f32,
    seed: u64,
    /// The embedding's outlier columns (`Outliers`): whether each column is one, and its gain.
    outlier_columns: Option<(Vec<bool>, f32)>,
}

impl View for LazyTensor {
    fn dtype(&self) -> Dtype {
        self.weights.dtype()
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        let n: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(n * self.weights.size());
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let normal = Normal::new(0.0f32, self.std).expect("a positive standard deviation");
        let jitter = Normal::new(0.0f32, 0.1).expect("a positive standard deviation");
        for i in 0..n {
            let mut v = match (self.is_norm, self.norm_jitter) {
                (false, _) => normal.sample(&mut rng),
                (true, false) => self.norm_center,
                (true, true) => self.norm_center * (1.0 + jitter.sample(&mut rng)),
            };
            // After the draw, so the other weights are those of the checkpoint without them.
            if let Some((columns, gain)) = &self.outlier_columns {
                if columns[i % columns.len()] {
                    v *= gain;
                }
            }
            match self.weights {
                WeightType::F32 => out.extend_from_slice(&v.to_le_bytes()),
                WeightType::Bf16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
                WeightType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
            }
        }
        Cow::Owned(out)
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.weights.size()
    }
}

/// A stable per-tensor seed (FNV-1a of the name mixed with the checkpoint seed).
fn tensor_seed(seed: u64, name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325 ^ seed, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// What [`write`] produced.
#[derive(Debug, Clone)]
pub struct Written {
    pub shards: Vec<String>,
    pub bytes: u64,
    pub special: SpecialIds,
}

/// Refuses a spec [`write`] cannot honour, before anything is created: each message names the
/// `gen-checkpoint` flag that sets the value.
pub fn check(spec: &CheckpointSpec) -> std::io::Result<()> {
    let s = &spec.shape;
    let invalid = |m: String| Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, m));
    for (flag, v) in [("--d-model", s.d_model), ("--n-layers", s.n_layers), ("--mlp-hidden-size", s.mlp_hidden_size), ("--max-sequence-length", s.max_sequence_length)] {
        if v == 0 {
            return invalid(format!("{flag} 0: must be at least 1"));
        }
    }
    if !(spec.init_std.is_finite() && spec.init_std >= 0.0) {
        return invalid(format!("--init-std {}: the weights' standard deviation must be a finite number, 0 or more", spec.init_std));
    }
    if let Some(o) = spec.outliers {
        if o.channels > s.d_model || !(o.gain.is_finite() && o.gain > 0.0) {
            return invalid(format!("--outlier-channels {} --outlier-gain {}: at most d_model ({}) channels, and a positive finite gain", o.channels, o.gain, s.d_model));
        }
    }
    if spec.shard_bytes == 0 {
        return invalid("--shard-mb 0: a shard must hold at least one tensor".into());
    }
    // Every tensor's bytes, and all of them, must be countable (an absurd shape would wrap).
    let bytes = |shape: &[usize]| shape.iter().try_fold(spec.weights.size() as u64, |n, &d| n.checked_mul(d as u64));
    let total = s.tensors().iter().try_fold(0u64, |sum, (_, shape, _)| sum.checked_add(bytes(shape)?));
    if total.is_none_or(|t| t > isize::MAX as u64) {
        return invalid(format!("d_model {} n_layers {} mlp_hidden_size {} vocab_size {}: the checkpoint's size overflows", s.d_model, s.n_layers, s.mlp_hidden_size, s.vocab_size));
    }
    Ok(())
}

/// The files [`write`] and [`write_weights`] write: what `gen-checkpoint --replace` may remove.
pub fn is_written_here(name: &str) -> bool {
    const FIXED: &[&str] = &[
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "chat_template.jinja", "model.safetensors", "model.safetensors.index.json",
    ];
    // model-00001-of-00012.safetensors
    let shard = name.strip_prefix("model-").and_then(|r| r.strip_suffix(".safetensors")).and_then(|r| r.split_once("-of-"));
    let digits = |d: &str| d.len() == 5 && d.bytes().all(|b| b.is_ascii_digit());
    FIXED.contains(&name) || shard.is_some_and(|(k, n)| digits(k) && digits(n))
}

/// Makes `dir` ready for a new checkpoint: a folder that does not exist or is empty is used as
/// it is; one holding files is refused, naming it, unless `replace`, which removes the files
/// an earlier checkpoint written here left (only those [`is_written_here`] names: stale shards
/// and an index beside a new single file would otherwise be read as the model) and refuses a
/// folder holding anything else.
pub fn prepare_output(dir: &Path, replace: bool) -> std::io::Result<()> {
    let invalid = |m: String| Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, m));
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => return invalid("exists and is not a folder".into()),
        r => r?,
    };
    let mut ours = Vec::new();
    let mut others = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        match is_written_here(&name) && !entry.file_type()?.is_dir() {
            true => ours.push(entry.path()),
            false => others.push(name),
        }
    }
    others.sort();
    let count = ours.len() + others.len();
    if count == 0 {
        return Ok(());
    }
    if !replace {
        return invalid(format!(
            "is not empty ({count} entries); gen-checkpoint writes into a new or empty folder, or, with --replace, over a checkpoint it wrote there"
        ));
    }
    if let Some(first) = others.first() {
        return invalid(format!(
            "--replace removes only the files gen-checkpoint writes, and this folder also holds '{first}'{}: choose another folder",
            if others.len() > 1 { format!(" and {} more", others.len() - 1) } else { String::new() }
        ));
    }
    ours.iter().try_for_each(std::fs::remove_file)
}

pub fn write(spec: &CheckpointSpec, dir: &Path) -> std::io::Result<Written> {
    check(spec)?;
    let s = &spec.shape;
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
    // DiffusionGemma's head width is its own, not d_model / n_heads.
    let own_head_dim = matches!(s.family, FamilyShape::DiffusionGemma(_));
    if s.n_heads == 0 || (!own_head_dim && s.d_model % s.n_heads != 0) || s.n_kv_heads == 0 || s.n_heads % s.n_kv_heads != 0 || s.head_dim() % 2 != 0 {
        return Err(invalid(format!("inconsistent heads: d_model {} n_heads {} n_kv_heads {}", s.d_model, s.n_heads, s.n_kv_heads)));
    }
    let special = SpecialIds::for_shape(s);
    if special.highest() as usize >= s.embedding_size {
        return Err(invalid(format!("embedding_size {} is too small for the tokenizer's {} tokens", s.embedding_size, special.highest() + 1)));
    }
    match s.family {
        FamilyShape::LladaMoe(moe) | FamilyShape::Llada2(Llada2Shape { moe, .. }) | FamilyShape::DiffusionGemma(DiffusionGemmaShape { moe, .. })
            if moe.experts == 0 || moe.top_k == 0 || moe.top_k > moe.experts =>
        {
            return Err(invalid(format!("{} experts with top_k {}: top_k must be between 1 and the experts", moe.experts, moe.top_k)));
        }
        // Its full layers' key heads must divide the query heads as the sliding layers' do.
        FamilyShape::DiffusionGemma(dg) if dg.full_kv_heads == 0 || s.n_heads % dg.full_kv_heads != 0 => {
            return Err(invalid(format!("n_heads {} is not a multiple of the full layers' {} key heads", s.n_heads, dg.full_kv_heads)));
        }
        // Dream's config has one size for both, the embedding's rows.
        FamilyShape::Dream if s.vocab_size != s.embedding_size => {
            return Err(invalid(format!("vocab_size {} differs from embedding_size {}: Dream has one vocabulary size", s.vocab_size, s.embedding_size)));
        }
        _ => {}
    }
    std::fs::create_dir_all(dir)?;

    // Shards: consecutive tensors in model order, each shard at most shard_bytes.
    let tensors = s.tensors();
    let embedding = s.embedding_tensor();
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut fill = 0u64;
    for (i, (_, shape, _)) in tensors.iter().enumerate() {
        let bytes = shape.iter().product::<usize>() as u64 * spec.weights.size() as u64;
        if fill > 0 && fill + bytes > spec.shard_bytes {
            shards.push(Vec::new());
            fill = 0;
        }
        shards.last_mut().unwrap().push(i);
        fill += bytes;
    }
    let n = shards.len();
    let file_name = |k: usize| if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", k + 1) };
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    let metadata = Some([("format".to_string(), "pt".to_string())].into_iter().collect());
    for (k, members) in shards.iter().enumerate() {
        let views = members.iter().map(|&i| {
            let (name, shape, is_norm) = &tensors[i];
            weight_map.insert(name.clone(), file_name(k));
            let t = LazyTensor {
                shape: shape.clone(),
                weights: spec.weights,
                is_norm: *is_norm,
                norm_jitter: s.family != FamilyShape::Llada,
                norm_center: match s.family {
                    FamilyShape::DiffusionGemma(_) => crate::checkpoint_diffusion_gemma::norm_center(name, shape),
                    _ => 1.0,
                },
                std: spec.init_std,
                seed: tensor_seed(spec.seed, name),
                outlier_columns: spec.outliers.filter(|_| name == embedding).map(|o| {
                    let mut columns = vec![false; s.d_model];
                    o.dims(s.d_model).into_iter().for_each(|c| columns[c] = true);
                    (columns, o.gain)
                }),
            };
            total += t.data_len() as u64;
            (name.clone(), t)
        });
        let views: Vec<_> = views.collect();
        write_safetensors(&dir.join(file_name(k)), views, metadata.clone())?;
    }
    if n > 1 {
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        write_json(&dir.join("model.safetensors.index.json"), &index)?;
    }
    write_metadata(spec, special, dir)?;
    Ok(Written { shards: (0..n).map(file_name).collect(), bytes: total, special })
}

/// Everything but the weights: `config.json`, `generation_config.json`, `tokenizer.json`,
/// LLaDA-8B-Instruct's chat template: one header per message, BOS before the first, and the
/// assistant header as the generation prompt.
pub const CHAT_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// `tokenizer_config.json` and `special_tokens_map.json`.
pub fn write_metadata(spec: &CheckpointSpec, special: SpecialIds, dir: &Path) -> std::io::Result<()> {
    let s = &spec.shape;
    match s.family {
        FamilyShape::Dream => return crate::checkpoint_dream::write_metadata(spec, special, dir),
        FamilyShape::DiffusionGemma(dg) => return crate::checkpoint_diffusion_gemma::write_metadata(spec, dg, special, dir),
        _ => {}
    }
    let moe = matches!(special.chat, ChatFormat::LladaMoe | ChatFormat::Llada2);
    write_json(&dir.join("config.json"), &config_json(spec, special))?;
    // LLaDA-MoE's config.json sets no BOS and no mask id: the mask id is here. LLaDA 2.x's
    // names only the padding (its mask is the tokenizer's `<|mask|>`).
    let bos = if moe { Value::Null } else { json!(special.bos) };
    let generation = match special.chat {
        ChatFormat::Llada2 => json!({ "pad_token_id": special.eos }),
        _ => json!({ "bos_token_id": bos, "eos_token_id": special.eos, "pad_token_id": special.eos, "mask_token_id": special.mask }),
    };
    write_json(&dir.join("generation_config.json"), &generation)?;
    write_json(&dir.join("tokenizer.json"), &tokenizer_json(special))?;
    write_json(&dir.join("tokenizer_config.json"), &tokenizer_config_json(special, s))?;
    let bos = if moe { Value::Null } else { json!("<|startoftext|>") };
    write_json(&dir.join("special_tokens_map.json"), &json!({
        "bos_token": bos, "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": special.named()[2].0,
    }))?;
    Ok(())
}

/// Writes given f32 weights as one `model.safetensors` in the spec's weight type, plus the
/// metadata files: how a trained model becomes a Hugging Face checkpoint.
pub fn write_weights(spec: &CheckpointSpec, dir: &Path, tensors: Vec<(String, Vec<usize>, Vec<f32>)>) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let special = SpecialIds::for_shape(&spec.shape);
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, shape, values)| {
            let bytes = values
                .iter()
                .flat_map(|&v| match spec.weights {
                    WeightType::F32 => v.to_le_bytes().to_vec(),
                    WeightType::Bf16 => bf16::from_f32(v).to_le_bytes().to_vec(),
                    WeightType::F16 => f16::from_f32(v).to_le_bytes().to_vec(),
                })
                .collect();
            (name, shape, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = encoded
        .iter()
        .map(|(n, shape, b)| Ok((n.clone(), safetensors::tensor::TensorView::new(spec.weights.dtype(), shape.clone(), b).map_err(|e| std::io::Error::other(e.to_string()))?)))
        .collect::<std::io::Result<_>>()?;
    let metadata = Some([("format".to_string(), "pt".to_string())].into_iter().collect());
    write_safetensors(&dir.join("model.safetensors"), views, metadata)?;
    write_metadata(spec, special, dir)
}

/// `config.json` with every key of LLaDA-8B-Instruct's (or of LLaDA-MoE's, or of Dream's).
pub fn config_json(spec: &CheckpointSpec, special: SpecialIds) -> Value {
    let s = &spec.shape;
    match s.family {
        FamilyShape::Llada => {}
        FamilyShape::LladaMoe(moe) => return crate::checkpoint_moe::config_json(spec, moe, special),
        FamilyShape::Dream => return crate::checkpoint_dream::config_json(spec, special),
        FamilyShape::Llada2(l2) => return crate::checkpoint_llada2::config_json(spec, l2, special),
        FamilyShape::DiffusionGemma(dg) => return crate::checkpoint_diffusion_gemma::config_json(spec, dg, special),
    }
    json!({
        "activation_type": "silu",
        "alibi": false,
        "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0,
        "attention_layer_norm": false,
        "attention_layer_norm_with_affine": true,
        "auto_map": {
            "AutoConfig": "configuration_llada.LLaDAConfig",
            "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
            "AutoModel": "modeling_llada.LLaDAModelLM"
        },
        "bias_for_layer_norm": false,
        "block_group_size": 1,
        "block_type": "llama",
        "d_model": s.d_model,
        "embedding_dropout": 0.0,
        "embedding_size": s.embedding_size,
        "eos_token_id": special.eos,
        "flash_attention": false,
        "include_bias": false,
        "include_qkv_bias": false,
        "init_cutoff_factor": null,
        "init_device": "meta",
        "init_fn": "mitchell",
        "init_std": spec.init_std,
        "input_emb_norm": false,
        "layer_norm_type": "rms",
        "layer_norm_with_affine": true,
        "mask_token_id": special.mask,
        "max_sequence_length": s.max_sequence_length,
        "mlp_hidden_size": s.mlp_hidden_size,
        "mlp_ratio": 4,
        "model_type": "llada",
        "multi_query_attention": null,
        "n_heads": s.n_heads,
        "n_kv_heads": s.n_kv_heads,
        "n_layers": s.n_layers,
        "pad_token_id": special.eos,
        "precision": "amp_bf16",
        "residual_dropout": 0.0,
        "rms_norm_eps": 1e-5,
        "rope": true,
        "rope_full_precision": true,
        "rope_theta": s.rope_theta,
        "scale_logits": false,
        "torch_dtype": spec.weights.torch_name(),
        "transformers_version": "4.46.3",
        "use_cache": false,
        "vocab_size": s.vocab_size,
        "weight_tying": false
    })
}

pub fn tokenizer_config_json(special: SpecialIds, shape: &Shape) -> Value {
    let template = match special.chat {
        ChatFormat::Llada => CHAT_TEMPLATE,
        ChatFormat::LladaMoe | ChatFormat::Llada2 => crate::checkpoint_moe::CHAT_TEMPLATE,
        ChatFormat::Dream => return crate::checkpoint_dream::tokenizer_config_json(special, shape),
        ChatFormat::Gemma4 => return crate::checkpoint_diffusion_gemma::tokenizer_config_json(special, shape),
    };
    let bos = if matches!(special.chat, ChatFormat::LladaMoe | ChatFormat::Llada2) { Value::Null } else { json!("<|startoftext|>") };
    let decoder = added_tokens_decoder(special);
    json!({
        "add_bos_token": false,
        "add_eos_token": false,
        "bos_token": bos,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|mdm_mask|>",
        "clean_up_tokenization_spaces": false,
        "model_max_length": shape.max_sequence_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template,
        "added_tokens_decoder": decoder,
    })
}

/// For tests: `spec` written into a new temporary directory, in more than one shard, and the
/// weight map of its index.
#[cfg(test)]
pub(crate) fn write_sharded(spec: &CheckpointSpec) -> (tempfile::TempDir, Written, serde_json::Map<String, Value>) {
    let dir = tempfile::tempdir().unwrap();
    let w = write(spec, dir.path()).unwrap();
    assert!(w.shards.len() > 1);
    let index: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap()).unwrap();
    let map = index["weight_map"].as_object().unwrap().clone();
    (dir, w, map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharded_bf16_checkpoint_has_an_index_and_every_tensor() {
        let spec = CheckpointSpec { shape: Shape::tiny(), weights: WeightType::Bf16, shard_bytes: 200_000, seed: 1, init_std: 0.02, outliers: None };
        let (_dir, w, map) = write_sharded(&spec);
        assert_eq!(map.len(), Shape::tiny().tensors().len());
        assert_eq!(w.bytes, Shape::tiny().parameters() * 2);
    }

    #[test]
    fn nonsense_numbers_are_refused_before_anything_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("ckpt");
        let good = CheckpointSpec { shape: Shape::tiny(), weights: WeightType::F32, shard_bytes: u64::MAX, seed: 1, init_std: 0.02, outliers: None };
        let mut wide = Shape::tiny();
        wide.d_model = usize::MAX / 2;
        let mut zero = Shape::tiny();
        zero.n_layers = 0;
        for (spec, flag) in [
            (CheckpointSpec { init_std: f32::NAN, ..good.clone() }, "--init-std"),
            (CheckpointSpec { init_std: -0.5, ..good.clone() }, "--init-std"),
            (CheckpointSpec { init_std: f32::INFINITY, ..good.clone() }, "--init-std"),
            (CheckpointSpec { outliers: Some(Outliers { channels: 2, gain: f32::NAN }), ..good.clone() }, "--outlier-gain"),
            (CheckpointSpec { shard_bytes: 0, ..good.clone() }, "--shard-mb"),
            (CheckpointSpec { shape: zero, ..good.clone() }, "--n-layers"),
            (CheckpointSpec { shape: wide, ..good.clone() }, "overflows"),
        ] {
            let msg = write(&spec, &out).unwrap_err().to_string();
            assert!(msg.contains(flag), "{msg}");
            assert!(!out.exists(), "{flag}: created {}", out.display());
        }
    }

    #[test]
    fn replace_removes_only_what_gen_checkpoint_writes() {
        let dir = tempfile::tempdir().unwrap();
        let spec = CheckpointSpec { shape: Shape::tiny(), weights: WeightType::F32, shard_bytes: 200_000, seed: 1, init_std: 0.02, outliers: None };
        write(&spec, dir.path()).unwrap();
        let msg = prepare_output(dir.path(), false).unwrap_err().to_string();
        assert!(msg.contains("not empty") && msg.contains("--replace"), "{msg}");
        prepare_output(dir.path(), true).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        // Something gen-checkpoint does not write is neither removed nor written beside.
        write(&spec, dir.path()).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
        let msg = prepare_output(dir.path(), true).unwrap_err().to_string();
        assert!(msg.contains("notes.txt"), "{msg}");
        assert!(dir.path().join("model.safetensors.index.json").exists() && dir.path().join("notes.txt").exists());
        for (name, ours) in [("model-00001-of-00012.safetensors", true), ("model-1-of-2.safetensors", false), ("model.safetensors", true), ("pytorch_model.bin", false)] {
            assert_eq!(is_written_here(name), ours, "{name}");
        }
    }

    #[test]
    fn outliers_scale_the_embeddings_columns_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let plain = CheckpointSpec { shape: Shape::tiny(), weights: WeightType::F32, shard_bytes: u64::MAX, seed: 1, init_std: 0.02, outliers: None };
        let outliers = Outliers { channels: 3, gain: 40.0 };
        let with = CheckpointSpec { outliers: Some(outliers), ..plain.clone() };
        write(&plain, &dir.path().join("plain")).unwrap();
        write(&with, &dir.path().join("with")).unwrap();
        let read = |d: &str| std::fs::read(dir.path().join(d).join("model.safetensors")).unwrap();
        let (a, b) = (read("plain"), read("with"));
        let (a, b) = (safetensors::SafeTensors::deserialize(&a).unwrap(), safetensors::SafeTensors::deserialize(&b).unwrap());
        let d = Shape::tiny().d_model;
        let dims = outliers.dims(d);
        assert_eq!(dims.len(), 3);
        assert!(dims.iter().all(|&c| c < d) && dims.windows(2).all(|w| w[0] < w[1]));
        for (name, _, _) in Shape::tiny().tensors() {
            let floats = |t: &safetensors::SafeTensors| -> Vec<f32> { t.tensor(&name).unwrap().data().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
            let (x, y) = (floats(&a), floats(&b));
            for (i, (x, y)) in x.iter().zip(&y).enumerate() {
                let want = if name == "model.transformer.wte.weight" && dims.contains(&(i % d)) { x * 40.0 } else { *x };
                assert_eq!(*y, want, "{name}[{i}]");
            }
        }
    }
}
