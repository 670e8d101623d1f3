//! What a random checkpoint is: its shape (LLaDA's or LLaDA-MoE's), the stored type of its
//! weights, the ids of its special tokens, and the spec `checkpoint` writes. Both layouts'
//! writers read these: `checkpoint` (LLaDA's, the shard writer and the tokenizer) and
//! `checkpoint_moe` (LLaDA-MoE's tensors and config).

use safetensors::Dtype;

/// Network shape, in the terms of LLaDA's `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub mlp_hidden_size: usize,
    pub vocab_size: usize,
    pub embedding_size: usize,
    pub max_sequence_length: usize,
    pub rope_theta: f64,
    /// Mixture-of-experts feed-forward (LLaDA-MoE's layout); `mlp_hidden_size` is then each
    /// expert's hidden width.
    pub moe: Option<MoeShape>,
}

/// Experts per layer and experts per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: usize,
}

impl Shape {
    /// LLaDA-8B-Base/Instruct.
    pub fn llada_8b() -> Shape {
        Shape {
            d_model: 4096,
            n_layers: 32,
            n_heads: 32,
            n_kv_heads: 32,
            mlp_hidden_size: 12288,
            vocab_size: 126464,
            embedding_size: 126464,
            max_sequence_length: 4096,
            rope_theta: 500000.0,
            moe: None,
        }
    }

    /// The 1B-class shape the peer measurements in BACKGROUND.md use: d 2048, 16 layers,
    /// SwiGLU 5632, LLaDA's vocabulary.
    pub fn llada_1b() -> Shape {
        Shape { d_model: 2048, n_layers: 16, n_heads: 16, n_kv_heads: 16, mlp_hidden_size: 5632, ..Shape::llada_8b() }
    }

    /// A few-megabyte model with grouped-query attention, for tests.
    pub fn tiny() -> Shape {
        Shape {
            d_model: 128,
            n_layers: 2,
            n_heads: 4,
            n_kv_heads: 2,
            mlp_hidden_size: 384,
            vocab_size: 320,
            embedding_size: 320,
            max_sequence_length: 512,
            rope_theta: 500000.0,
            moe: None,
        }
    }

    /// LLaDA-MoE-7B-A1B (BACKGROUND.md section 2): 16 layers of 2048, 16 heads, 64 experts of
    /// 1024, top 8, LLaDA-MoE's vocabulary.
    pub fn llada_moe_7b() -> Shape {
        Shape {
            d_model: 2048,
            n_layers: 16,
            n_heads: 16,
            n_kv_heads: 16,
            mlp_hidden_size: 1024,
            vocab_size: 157184,
            embedding_size: 157184,
            max_sequence_length: 8192,
            rope_theta: 50000.0,
            moe: Some(MoeShape { experts: 64, top_k: 8 }),
        }
    }

    /// A small LLaDA-MoE for tests: 8 experts of 64, top 2, grouped-query attention.
    pub fn tiny_moe() -> Shape {
        Shape { mlp_hidden_size: 64, rope_theta: 50000.0, moe: Some(MoeShape { experts: 8, top_k: 2 }), ..Shape::tiny() }
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }
}

/// Special tokens of LLaDA's chat format, by id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecialIds {
    pub bos: u32,
    pub eos: u32,
    pub mask: u32,
    pub start_header: u32,
    pub end_header: u32,
    pub eot: u32,
    /// LLaDA-MoE's chat format (`<role>`, `</role>`, `<|role_end|>` in the header and
    /// end-of-turn places) rather than LLaDA's.
    pub moe: bool,
}

impl SpecialIds {
    /// LLaDA-8B's ids.
    pub const LLADA: SpecialIds =
        SpecialIds { bos: 126080, eos: 126081, mask: 126336, start_header: 126346, end_header: 126347, eot: 126348, moe: false };

    /// LLaDA-MoE's: end of text 156892 and mask 156895 are the model's (BACKGROUND.md); its
    /// role tokens' ids are not published, so they take the free ids around them.
    pub const LLADA_MOE: SpecialIds =
        SpecialIds { bos: 156891, eos: 156892, mask: 156895, start_header: 156893, end_header: 156894, eot: 156896, moe: true };

    /// The tokens' texts with their ids.
    pub fn named(&self) -> [(&'static str, u32); 6] {
        let (start, end, eot) = if self.moe { ("<role>", "</role>", "<|role_end|>") } else { ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>") };
        [("<|startoftext|>", self.bos), ("<|endoftext|>", self.eos), ("<|mdm_mask|>", self.mask), (start, self.start_header), (end, self.end_header), (eot, self.eot)]
    }
}

/// Stored element type of the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightType {
    F32,
    Bf16,
    F16,
}

impl WeightType {
    pub fn parse(s: &str) -> Option<WeightType> {
        match s {
            "f32" => Some(WeightType::F32),
            "bf16" => Some(WeightType::Bf16),
            "f16" => Some(WeightType::F16),
            _ => None,
        }
    }

    pub(crate) fn dtype(self) -> Dtype {
        match self {
            WeightType::F32 => Dtype::F32,
            WeightType::Bf16 => Dtype::BF16,
            WeightType::F16 => Dtype::F16,
        }
    }

    pub(crate) fn size(self) -> usize {
        match self {
            WeightType::F32 => 4,
            WeightType::Bf16 | WeightType::F16 => 2,
        }
    }

    pub(crate) fn torch_name(self) -> &'static str {
        match self {
            WeightType::F32 => "float32",
            WeightType::Bf16 => "bfloat16",
            WeightType::F16 => "float16",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CheckpointSpec {
    pub shape: Shape,
    pub weights: WeightType,
    /// Largest shard in bytes; one `model.safetensors` when everything fits.
    pub shard_bytes: u64,
    pub seed: u64,
    /// Standard deviation of the weight matrices (LLaDA's `init_std`).
    pub init_std: f32,
}
