//! What a random checkpoint is: its shape and model family (LLaDA, LLaDA-MoE or Dream), the
//! stored type of its weights, the ids of its special tokens, and the spec `checkpoint`
//! writes. Every layout's writer reads these: `checkpoint` (LLaDA's, the shard writer and the
//! tokenizer), `checkpoint_moe` (LLaDA-MoE's tensors and config) and `checkpoint_dream`
//! (Dream's).

use safetensors::Dtype;

/// Network shape, in the terms of LLaDA's `config.json`, and the family whose Hugging Face
/// layout it is written in.
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
    pub family: FamilyShape,
}

/// A shape's model family with what only that family has (its experts, LLaDA 2.x's dense
/// layers and router groups): which tensors, `config.json` keys, special tokens and chat
/// template its checkpoint has. Which family it is, is [`FamilyShape::family`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FamilyShape {
    /// LLaDA-8B's (`LLaDAModelLM`, `model.transformer.*`).
    Llada,
    /// LLaDA-MoE-7B-A1B's (`LLaDAMoEModelLM`): a mixture-of-experts feed-forward, with
    /// `mlp_hidden_size` each expert's hidden width.
    LladaMoe(MoeShape),
    /// Dream-v0-7B's (`DreamModel`, Qwen2.5-style: biases on q, k and v).
    Dream,
    /// LLaDA 2.x's (`LLaDA2MoeModelLM`): a fused q|k|v, dense layers then experts with a
    /// shared one; `mlp_hidden_size` each expert's width.
    Llada2(Llada2Shape),
}

/// What a LLaDA 2.x shape adds to its experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llada2Shape {
    pub moe: MoeShape,
    pub groups: usize,
    pub top_groups: usize,
    /// `first_k_dense_replace`, and those layers' `intermediate_size`.
    pub dense_layers: usize,
    pub dense_hidden: usize,
    pub shared_experts: usize,
}

impl FamilyShape {
    /// The family, as the artifact and everything after the compiler name it.
    pub fn family(self) -> llada_ir::Family {
        match self {
            FamilyShape::Llada => llada_ir::Family::Llada,
            FamilyShape::LladaMoe(_) => llada_ir::Family::LladaMoe,
            FamilyShape::Dream => llada_ir::Family::Dream,
            FamilyShape::Llada2(_) => llada_ir::Family::Llada2Moe,
        }
    }

    /// The experts, for LLaDA-MoE.
    pub fn moe(self) -> Option<MoeShape> {
        match self {
            FamilyShape::LladaMoe(moe) => Some(moe),
            FamilyShape::Llada2(l2) => Some(l2.moe),
            FamilyShape::Llada | FamilyShape::Dream => None,
        }
    }

    pub fn chat_format(self) -> ChatFormat {
        match self {
            FamilyShape::Llada => ChatFormat::Llada,
            FamilyShape::LladaMoe(_) => ChatFormat::LladaMoe,
            FamilyShape::Dream => ChatFormat::Dream,
            FamilyShape::Llada2(_) => ChatFormat::Llada2,
        }
    }
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
            family: FamilyShape::Llada,
        }
    }

    /// The 1B-class shape the peer measurements in BACKGROUND.md use: d 2048, 16 layers,
    /// SwiGLU 5632, LLaDA's vocabulary.
    pub fn llada_1b() -> Shape {
        Shape { d_model: 2048, n_layers: 16, n_heads: 16, n_kv_heads: 16, mlp_hidden_size: 5632, ..Shape::llada_8b() }
    }

    /// The embedded default model's shape (`TrainConfig::embedded` trains it): 4 layers of
    /// 128, a 320-token vocabulary.
    pub fn embedded() -> Shape {
        Shape {
            d_model: 128,
            n_layers: 4,
            n_heads: 4,
            n_kv_heads: 4,
            mlp_hidden_size: 384,
            vocab_size: 320,
            embedding_size: 320,
            max_sequence_length: 512,
            rope_theta: 500000.0,
            family: FamilyShape::Llada,
        }
    }

    /// A few-megabyte model with grouped-query attention, for tests: the embedded model's
    /// shape at half its depth, 4 query heads over 2 key/value heads.
    pub fn tiny() -> Shape {
        Shape { n_layers: 2, n_kv_heads: 2, ..Shape::embedded() }
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
            family: FamilyShape::LladaMoe(MoeShape { experts: 64, top_k: 8 }),
        }
    }

    /// A small LLaDA-MoE for tests: 8 experts of 64, top 2, grouped-query attention.
    pub fn tiny_moe() -> Shape {
        Shape { mlp_hidden_size: 64, rope_theta: 50000.0, family: FamilyShape::LladaMoe(MoeShape { experts: 8, top_k: 2 }), ..Shape::tiny() }
    }

    /// Dream-v0-Instruct-7B (and -Base-7B; Qwen2.5-7B's shape): 28 layers of 3584, 28 query
    /// heads and 4 key/value heads, SwiGLU 18944, vocabulary 152064, RoPE base 1e6.
    pub fn dream_7b() -> Shape {
        Shape {
            d_model: 3584,
            n_layers: 28,
            n_heads: 28,
            n_kv_heads: 4,
            mlp_hidden_size: 18944,
            vocab_size: 152064,
            embedding_size: 152064,
            max_sequence_length: 131072,
            rope_theta: 1e6,
            family: FamilyShape::Dream,
        }
    }

    /// LLaDA2.0-mini's shape (16B parameters, about 1.4B active): 20 layers of 2048, 16
    /// query and 4 key/value heads of 128, the first layer dense (5120 wide), then 256
    /// experts of 512 (top 8, in 8 groups of which 4 are kept) and one shared expert;
    /// vocabulary 157,184; rope theta 600,000.
    pub fn llada2_mini() -> Shape {
        Shape {
            d_model: 2048,
            n_layers: 20,
            n_heads: 16,
            n_kv_heads: 4,
            mlp_hidden_size: 512,
            vocab_size: 157184,
            embedding_size: 157184,
            max_sequence_length: 32768,
            rope_theta: 600000.0,
            family: FamilyShape::Llada2(Llada2Shape { moe: MoeShape { experts: 256, top_k: 8 }, groups: 8, top_groups: 4, dense_layers: 1, dense_hidden: 5120, shared_experts: 1 }),
        }
    }

    /// A small LLaDA 2.x for tests: `tiny`'s attention (grouped-query, head dim 32, so 16
    /// rotary dimensions), one dense layer, then 16 experts of 64 in 4 groups (2 kept), top
    /// 4, and a shared expert.
    pub fn tiny_llada2() -> Shape {
        let l2 = Llada2Shape { moe: MoeShape { experts: 16, top_k: 4 }, groups: 4, top_groups: 2, dense_layers: 1, dense_hidden: 192, shared_experts: 1 };
        Shape { n_layers: 3, mlp_hidden_size: 64, rope_theta: 600000.0, family: FamilyShape::Llada2(l2), ..Shape::tiny() }
    }

    /// A small Dream for tests: `tiny`'s sizes (grouped-query attention, head dim 32) with
    /// Dream's RoPE base.
    pub fn tiny_dream() -> Shape {
        Shape { rope_theta: 1e6, family: FamilyShape::Dream, ..Shape::tiny() }
    }

    /// The experts, for LLaDA-MoE.
    pub fn moe(&self) -> Option<MoeShape> {
        self.family.moe()
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }
}

/// A family's chat format: which special tokens it has, their texts, and its template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    /// `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`, BOS first.
    Llada,
    /// `<role>ROLE</role>...<|role_end|>`, no BOS.
    LladaMoe,
    /// Qwen2's `<|im_start|>role\n...<|im_end|>\n`: no end-of-header token.
    Dream,
    /// LLaDA 2.x's: LLaDA-MoE's roles, mask token `<|mask|>`.
    Llada2,
}

/// Special tokens of a chat format, by id.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SpecialIds {
    /// `<|startoftext|>`; Dream's `<|beginoftext|>` (its tokenizer's BOS, which its template
    /// never emits; its config's `bos_token_id` is `eos`).
    pub bos: u32,
    /// `<|endoftext|>`, also the padding.
    pub eos: u32,
    pub mask: u32,
    /// Opens a turn's role: `<|start_header_id|>`, `<role>`, `<|im_start|>`.
    pub start_header: u32,
    /// Closes the role: `<|end_header_id|>`, `</role>`; `None` in Dream's format (a newline
    /// closes the role there).
    pub end_header: Option<u32>,
    /// Ends a turn: `<|eot_id|>`, `<|role_end|>`, `<|im_end|>`.
    pub eot: u32,
    pub chat: ChatFormat,
}

impl SpecialIds {
    /// LLaDA-8B's ids.
    pub const LLADA: SpecialIds =
        SpecialIds { bos: 126080, eos: 126081, mask: 126336, start_header: 126346, end_header: Some(126347), eot: 126348, chat: ChatFormat::Llada };

    /// LLaDA-MoE's: end of text 156892 and mask 156895 are the model's (BACKGROUND.md); its
    /// role tokens' ids are not published, so they take the free ids around them.
    pub const LLADA_MOE: SpecialIds =
        SpecialIds { bos: 156891, eos: 156892, mask: 156895, start_header: 156893, end_header: Some(156894), eot: 156896, chat: ChatFormat::LladaMoe };

    /// Dream-v0-7B's (Qwen2.5's `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, and Dream's
    /// own `<|beginoftext|>` and `<|mask|>`), as in the conformance kit's README.
    pub const DREAM: SpecialIds =
        SpecialIds { bos: 151665, eos: 151643, mask: 151666, start_header: 151644, end_header: None, eot: 151645, chat: ChatFormat::Dream };

    /// The full-vocabulary ids of a chat format.
    pub fn of(chat: ChatFormat) -> SpecialIds {
        match chat {
            ChatFormat::Llada => SpecialIds::LLADA,
            ChatFormat::LladaMoe => SpecialIds::LLADA_MOE,
            ChatFormat::Llada2 => SpecialIds { chat, ..SpecialIds::LLADA_MOE },
            ChatFormat::Dream => SpecialIds::DREAM,
        }
    }

    /// The tokens' texts with their ids, in the order the small-vocabulary layout gives them
    /// ids (LLaDA's and LLaDA-MoE's as before; Dream's in its ids' order).
    pub fn named(&self) -> Vec<(&'static str, u32)> {
        let (start, end, eot) = match self.chat {
            ChatFormat::Llada => ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
            ChatFormat::LladaMoe | ChatFormat::Llada2 => ("<role>", "</role>", "<|role_end|>"),
            ChatFormat::Dream => {
                return vec![
                    ("<|endoftext|>", self.eos),
                    ("<|im_start|>", self.start_header),
                    ("<|im_end|>", self.eot),
                    ("<|beginoftext|>", self.bos),
                    ("<|mask|>", self.mask),
                ];
            }
        };
        let mask = if self.chat == ChatFormat::Llada2 { "<|mask|>" } else { "<|mdm_mask|>" };
        let mut t = vec![("<|startoftext|>", self.bos), ("<|endoftext|>", self.eos), (mask, self.mask), (start, self.start_header)];
        t.extend(self.end_header.map(|id| (end, id)));
        t.push((eot, self.eot));
        t
    }

    /// The smallest special id: ids below it are ordinary tokens.
    pub fn lowest(&self) -> u32 {
        self.named().iter().map(|&(_, id)| id).min().expect("every format has special tokens")
    }

    /// The largest special id: the embedding must have more rows.
    pub fn highest(&self) -> u32 {
        self.named().iter().map(|&(_, id)| id).max().expect("every format has special tokens")
    }

    /// The same tokens at consecutive ids from `first`, in [`named`](Self::named)'s order.
    pub fn packed(chat: ChatFormat, first: u32) -> SpecialIds {
        let at = |i: u32| first + i;
        match chat {
            ChatFormat::Llada | ChatFormat::LladaMoe | ChatFormat::Llada2 => {
                SpecialIds { bos: at(0), eos: at(1), mask: at(2), start_header: at(3), end_header: Some(at(4)), eot: at(5), chat }
            }
            ChatFormat::Dream => SpecialIds { eos: at(0), start_header: at(1), eot: at(2), bos: at(3), mask: at(4), end_header: None, chat },
        }
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
    /// Large channels in the residual stream, as trained LLMs have (None: none).
    pub outliers: Option<Outliers>,
}

/// A few channels of the residual stream with large magnitudes, as trained LLMs have: the
/// embedding's columns of `channels` hidden dimensions (spread evenly) are multiplied by
/// `gain`. Every position's residual stream then carries them through every layer (a random
/// layer adds nothing that cancels them), so every matmul that reads the normalised stream (q,
/// k and v, the SwiGLU's two inputs, the LM head) sees a few inputs `gain` times the others,
/// in every row. The model: Dettmers et al. 2022 ("LLM.int8()", arXiv 2208.07339) find, from
/// about 6.7B parameters on, outlier features of magnitude 6 to 20x the rest confined to about
/// six hidden dimensions and present in most layers and tokens; Sun et al. 2024 ("Massive
/// activations in large language models", arXiv 2402.17762) find a few fixed residual-stream
/// channels (two in LLaMA2-7B) with values up to thousands of times the median. Per-row int8
/// activation scales are set by those channels, so the other channels lose precision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outliers {
    pub channels: usize,
    pub gain: f32,
}

impl Outliers {
    /// The hidden dimensions that carry the outliers, of `d_model`.
    pub fn dims(&self, d_model: usize) -> Vec<usize> {
        let n = self.channels.min(d_model);
        (0..n).map(|i| i * d_model / n + d_model / (2 * n)).collect()
    }
}
