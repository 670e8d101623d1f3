//! What a random checkpoint is: its shape and model family (LLaDA, LLaDA-MoE, LLaDA 2.x, Dream
//! or DiffusionGemma), the stored type of its weights, the ids of its special tokens, and the
//! spec `checkpoint` writes. Every layout's writer reads these: `checkpoint` (LLaDA's, the
//! shard writer and the tokenizer), `checkpoint_moe` (LLaDA-MoE's tensors and config),
//! `checkpoint_llada2`, `checkpoint_dream` and `checkpoint_diffusion_gemma`.

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
    /// DiffusionGemma's (`DiffusionGemmaForBlockDiffusion`, Gemma 4's MoE text layers under
    /// `model.decoder.*` and its vision tower under `model.encoder.*`): `mlp_hidden_size` each
    /// expert's width, `n_kv_heads` the sliding layers' key heads, `head_dim` its own.
    DiffusionGemma(DiffusionGemmaShape),
}

/// What a DiffusionGemma shape adds: its experts, the two kinds of attention layer, the
/// dense feed-forward beside the experts, the canvas and the vision tower.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiffusionGemmaShape {
    pub moe: MoeShape,
    /// The sliding-window layers' head width (`head_dim`).
    pub head_dim: usize,
    /// The full-attention layers' head width and key heads (`global_head_dim`,
    /// `num_global_key_value_heads`); they have no value projection.
    pub full_head_dim: usize,
    pub full_kv_heads: usize,
    /// Every this-many-th layer attends to everything (the published 5:1 pattern is 6); the
    /// last layer always does, as the published config forces it.
    pub full_every: usize,
    pub sliding_window: usize,
    /// The dense GELU feed-forward's width (`intermediate_size`), also the self-conditioning
    /// block's.
    pub dense_hidden: usize,
    pub full_rope_theta: f64,
    pub canvas_length: usize,
    pub vision: VisionShape,
}

impl DiffusionGemmaShape {
    /// `layer_types`: whether each of `n_layers` layers is a full-attention one.
    pub fn full_layers(&self, n_layers: usize) -> Vec<bool> {
        (0..n_layers).map(|l| (l + 1) % self.full_every == 0 || l + 1 == n_layers).collect()
    }
}

/// Gemma 4's vision tower (`gemma4_vision`), which a DiffusionGemma checkpoint carries under
/// `model.encoder.vision_tower` (its text-only importers skip it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisionShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub patch: usize,
    pub pooling_kernel: usize,
    pub position_embedding_size: usize,
    /// Soft tokens per image (`default_output_length`, `vision_soft_tokens_per_image`).
    pub soft_tokens: usize,
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
            FamilyShape::DiffusionGemma(_) => llada_ir::Family::DiffusionGemma,
        }
    }

    /// The experts, for the mixture-of-experts families.
    pub fn moe(self) -> Option<MoeShape> {
        match self {
            FamilyShape::LladaMoe(moe) => Some(moe),
            FamilyShape::Llada2(l2) => Some(l2.moe),
            FamilyShape::DiffusionGemma(dg) => Some(dg.moe),
            FamilyShape::Llada | FamilyShape::Dream => None,
        }
    }

    /// The experts, mutable: what `--experts` and `--top-k` override.
    pub fn moe_mut(&mut self) -> Option<&mut MoeShape> {
        match self {
            FamilyShape::LladaMoe(moe) => Some(moe),
            FamilyShape::Llada2(l2) => Some(&mut l2.moe),
            FamilyShape::DiffusionGemma(dg) => Some(&mut dg.moe),
            FamilyShape::Llada | FamilyShape::Dream => None,
        }
    }

    pub fn chat_format(self) -> ChatFormat {
        match self {
            FamilyShape::Llada => ChatFormat::Llada,
            FamilyShape::LladaMoe(_) => ChatFormat::LladaMoe,
            FamilyShape::Dream => ChatFormat::Dream,
            FamilyShape::Llada2(_) => ChatFormat::Llada2,
            FamilyShape::DiffusionGemma(_) => ChatFormat::Gemma4,
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

    /// google/diffusiongemma-26B-A4B-it (25.8B parameters, about 4B active): 30 layers of 2816
    /// (every sixth a full-attention one), 16 query heads; sliding layers 8 key heads of 256 and
    /// a window of 1024, full layers 2 key heads of 512; 128 experts of 704 (top 8) beside a
    /// dense GELU feed-forward of 2112; vocabulary 262,144; canvas 256; Gemma 4's vision tower
    /// (SigLIP-sized: 27 layers of 1152). The values of its config.json, as the conformance
    /// kit's README records them.
    pub fn diffusion_gemma_26b_a4b() -> Shape {
        let vision = VisionShape { hidden: 1152, layers: 27, heads: 16, kv_heads: 16, head_dim: 72, intermediate: 4304, patch: 16, pooling_kernel: 3, position_embedding_size: 10240, soft_tokens: 280 };
        let dg = DiffusionGemmaShape {
            moe: MoeShape { experts: 128, top_k: 8 },
            head_dim: 256,
            full_head_dim: 512,
            full_kv_heads: 2,
            full_every: 6,
            sliding_window: 1024,
            dense_hidden: 2112,
            full_rope_theta: 1e6,
            canvas_length: 256,
            vision,
        };
        Shape {
            d_model: 2816,
            n_layers: 30,
            n_heads: 16,
            n_kv_heads: 8,
            mlp_hidden_size: 704,
            vocab_size: 262144,
            embedding_size: 262144,
            max_sequence_length: 262144,
            rope_theta: 1e4,
            family: FamilyShape::DiffusionGemma(dg),
        }
    }

    /// The conformance kit's tiny DiffusionGemma (`tests/data/diffusiongemma-conformance/
    /// tiny-dg-A`): 6 layers of 64 (full attention at 2 and 5), 4 query heads; sliding layers 2
    /// key heads of 16 and a window of 8, full layers 1 of 32; 8 experts of 16 (top 2) beside a
    /// dense feed-forward of 64; vocabulary 320; canvas 16; a one-layer vision tower of 32.
    pub fn tiny_diffusion_gemma() -> Shape {
        let vision = VisionShape { hidden: 32, layers: 1, heads: 2, kv_heads: 2, head_dim: 16, intermediate: 64, patch: 4, pooling_kernel: 3, position_embedding_size: 64, soft_tokens: 4 };
        let dg = DiffusionGemmaShape {
            moe: MoeShape { experts: 8, top_k: 2 },
            head_dim: 16,
            full_head_dim: 32,
            full_kv_heads: 1,
            full_every: 3,
            sliding_window: 8,
            dense_hidden: 64,
            full_rope_theta: 1e6,
            canvas_length: 16,
            vision,
        };
        Shape {
            d_model: 64,
            n_layers: 6,
            n_heads: 4,
            n_kv_heads: 2,
            mlp_hidden_size: 16,
            vocab_size: 320,
            embedding_size: 320,
            max_sequence_length: 512,
            rope_theta: 1e4,
            family: FamilyShape::DiffusionGemma(dg),
        }
    }

    /// The experts, for the mixture-of-experts families.
    pub fn moe(&self) -> Option<MoeShape> {
        self.family.moe()
    }

    /// The head width: `d_model / n_heads`, but DiffusionGemma's sliding layers' own.
    pub fn head_dim(&self) -> usize {
        match self.family {
            FamilyShape::DiffusionGemma(dg) => dg.head_dim,
            _ => self.d_model / self.n_heads,
        }
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
    /// Gemma 4's (DiffusionGemma's): `<bos>`, then `<|turn>role\n...<turn|>\n`; tool, thinking
    /// and image tokens beside.
    Gemma4,
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

    /// Gemma 4's (DiffusionGemma's): `<bos>` 2, `<eos>` 1, `<mask>` 4 (Gemma 3's, which
    /// DiffusionGemma never uses: its canvas starts as noise), `<|turn>` 105 and `<turn|>` 106;
    /// the others are in [`GEMMA4_TOKENS`].
    pub const GEMMA4: SpecialIds = SpecialIds { bos: 2, eos: 1, mask: 4, start_header: 105, end_header: None, eot: 106, chat: ChatFormat::Gemma4 };

    /// The full-vocabulary ids of a chat format.
    pub fn of(chat: ChatFormat) -> SpecialIds {
        match chat {
            ChatFormat::Llada => SpecialIds::LLADA,
            ChatFormat::LladaMoe => SpecialIds::LLADA_MOE,
            ChatFormat::Llada2 => SpecialIds { chat, ..SpecialIds::LLADA_MOE },
            ChatFormat::Dream => SpecialIds::DREAM,
            ChatFormat::Gemma4 => SpecialIds::GEMMA4,
        }
    }

    /// The first ordinary (byte) token's id: 0, but right after Gemma 4's low special tokens,
    /// which start its vocabulary.
    pub fn ordinary_base(&self) -> u32 {
        match self.chat {
            ChatFormat::Gemma4 => self.eot + 1,
            _ => 0,
        }
    }

    /// The tokens' texts with their ids, in the order the small-vocabulary layout gives them
    /// ids (LLaDA's and LLaDA-MoE's as before; Dream's in its ids' order).
    pub fn named(&self) -> Vec<(&'static str, u32)> {
        let (start, end, eot) = match self.chat {
            ChatFormat::Gemma4 => return self.gemma4_named(),
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

    /// Gemma 4's tokens: at their real ids, or (packed, for a small vocabulary) the low ones at
    /// consecutive ids from `<pad>`'s and the image markers right after the ordinary tokens,
    /// as the conformance kit lays them out.
    fn gemma4_named(&self) -> Vec<(&'static str, u32)> {
        if self.start_header == SpecialIds::GEMMA4.start_header {
            return GEMMA4_TOKENS.iter().chain(&GEMMA4_IMAGE_TOKENS).copied().collect();
        }
        let first = self.eos - 1;
        let images = self.ordinary_base() + crate::checkpoint_vocab::bpe_vocab().0.len() as u32;
        let low = GEMMA4_TOKENS.iter().zip(first..).map(|(&(text, _), id)| (text, id));
        low.chain(GEMMA4_IMAGE_TOKENS.iter().zip(images..).map(|(&(text, _), id)| (text, id))).collect()
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
            ChatFormat::Gemma4 => SpecialIds { eos: at(1), bos: at(2), mask: at(4), start_header: at(15), eot: at(16), end_header: None, chat },
        }
    }
}

/// Gemma 4's special tokens below its ordinary ones, with their real ids, in id order (the
/// conformance kit's README lists where each id comes from).
pub const GEMMA4_TOKENS: [(&str, u32); 17] = [
    ("<pad>", 0),
    ("<eos>", 1),
    ("<bos>", 2),
    ("<unk>", 3),
    ("<mask>", 4),
    ("<|tool>", 46),
    ("<tool|>", 47),
    ("<|tool_call>", 48),
    ("<tool_call|>", 49),
    ("<|tool_response>", 50),
    ("<tool_response|>", 51),
    ("<|\"|>", 52),
    ("<|think|>", 98),
    ("<|channel>", 100),
    ("<channel|>", 101),
    ("<|turn>", 105),
    ("<turn|>", 106),
];

/// The image markers at the top of Gemma 4's vocabulary: begin of image (`boi_token_id`), the
/// image soft token (`image_token_id`), end of image (`eoi_token_id`).
pub const GEMMA4_IMAGE_TOKENS: [(&str, u32); 3] = [("<|image>", 255999), ("<|image|>", 258880), ("<image|>", 258882)];

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
