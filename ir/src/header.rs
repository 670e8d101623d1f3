//! The artifact header: everything the runtime needs besides the tensor bytes.

use serde::{Deserialize, Serialize};

use crate::graph::{Graph, TensorId};
use crate::packing::DType;
use crate::window::WindowPlan;

/// Hyperparameters of a LLaDA-architecture network, as the runtime needs them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Architecture family: "llada" (dense), "llada-moe", "llada2-moe" or "dream". Dream predicts the token
    /// at position `i` from the network's output at `i - 1` (position 0 from its own), as its
    /// published sampler shifts the logits; the runtime reads its logit rows accordingly.
    pub architecture: String,
    pub d_model: u32,
    pub n_layers: u32,
    pub n_heads: u32,
    /// Key/value heads; fewer than `n_heads` means grouped-query attention.
    pub n_kv_heads: u32,
    pub head_dim: u32,
    /// SwiGLU hidden width (of each expert, in a mixture-of-experts model).
    pub mlp_hidden: u32,
    /// Tokenizer vocabulary size.
    pub vocab_size: u32,
    /// Rows of the embedding and of the output head: the width of the logits.
    pub embedding_size: u32,
    /// Longest sequence the checkpoint was trained for.
    pub max_sequence_length: u32,
    pub rope_theta: f64,
    pub rms_eps: f64,
    /// RMSNorm over `head_dim` on every query and key head, before rotary (LLaDA-MoE's
    /// `qk_layernorm`).
    pub qk_norm: bool,
    /// Mixture-of-experts feed-forward layers (every layer), if the model has them.
    pub moe: Option<MoeConfig>,
}

/// What a model is, by its family: what the sampler, the logit rows and the backends branch on
/// (never on a side effect such as the logit shift).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// LLaDA's dense network.
    Llada,
    /// LLaDA-MoE: the dense network with mixture-of-experts feed-forwards and q/k norms.
    LladaMoe,
    /// Dream: predicts the token at `i` from the output at `i - 1`, with its own sampler.
    Dream,
    /// LLaDA 2.x: mixture-of-experts layers after dense ones, a sigmoid group-limited router
    /// and a shared expert; block diffusion (block-causal attention) with its own sampler.
    Llada2Moe,
    /// DiffusionGemma: a causal encoder fills the KV cache, a decoder over the same layers
    /// denoises a canvas of uniform noise read against it; its own section
    /// ([`crate::diffusion_gemma`]) and sampler.
    DiffusionGemma,
}

impl Family {
    pub const ALL: [Family; 5] = [Family::Llada, Family::LladaMoe, Family::Dream, Family::Llada2Moe, Family::DiffusionGemma];

    /// The name `ModelConfig::architecture` stores.
    pub fn name(self) -> &'static str {
        match self {
            Family::Llada => "llada",
            Family::LladaMoe => "llada-moe",
            Family::Dream => "dream",
            Family::Llada2Moe => "llada2-moe",
            Family::DiffusionGemma => "diffusion-gemma",
        }
    }

    pub fn parse(name: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl ModelConfig {
    /// The model's family; the verifier has refused any other architecture name, so a
    /// verified header always has one (`Llada` stands in for an unverified unknown name).
    pub fn family(&self) -> Family {
        Family::parse(&self.architecture).unwrap_or(Family::Llada)
    }

    /// Layers with experts: those after the `dense_layers` first (none without experts).
    pub fn moe_layers(&self) -> u32 {
        self.moe.map_or(0, |m| self.n_layers.saturating_sub(m.dense_layers))
    }

    /// The index among the MoE layers of transformer layer `layer`, if it has experts.
    pub fn moe_layer_index(&self, layer: u32) -> Option<usize> {
        let moe = self.moe?;
        (layer >= moe.dense_layers && layer < self.n_layers).then(|| (layer - moe.dense_layers) as usize)
    }
}

/// The feed-forward of a mixture-of-experts model: a router picks `top_k` of `experts`
/// SwiGLU experts per token and weighs them (the `Route` op: softmax probabilities, not
/// renormalised, as LLaDA-MoE's reference code does; `RouteSigmoid`: LLaDA 2.x's rule).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeConfig {
    pub experts: u32,
    pub top_k: u32,
    /// The first `dense_layers` transformer layers have a dense feed-forward instead
    /// (LLaDA 2.x's `first_k_dense_replace`); the expert plan covers the others only.
    pub dense_layers: u32,
    /// The gate's activation in every expert.
    pub activation: GluActivation,
}

/// The activation of a gated feed-forward's gate: `out = act(gate) * up`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GluActivation {
    /// `silu` (SwiGLU: LLaDA, LLaDA-MoE, LLaDA 2.x, Dream).
    #[default]
    Silu,
    /// `gelu` with the tanh approximation (`gelu_pytorch_tanh`: DiffusionGemma).
    GeluTanh,
}

/// Token ids the sampler and the text front end need.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct SpecialTokens {
    /// `<|mdm_mask|>`: the token every generated position starts as.
    pub mask: u32,
    pub bos: Option<u32>,
    /// End of text; also padding in LLaDA.
    pub eos: Option<u32>,
    /// End of turn (`<|eot_id|>`), present in instruct models.
    pub eot: Option<u32>,
}

/// The text front end: the Hugging Face tokenizer and the chat template, stored verbatim.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TokenizerSpec {
    /// Contents of `tokenizer.json`.
    pub tokenizer_json: String,
    /// Jinja chat template from `tokenizer_config.json`, if the model has one.
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// `add_bos_token` from `tokenizer_config.json`.
    pub add_bos_token: bool,
}

/// One stored tensor: row-major, little-endian, `offset` bytes into the data section.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Offset from the start of the data section; a multiple of [`crate::TENSOR_ALIGN`].
    pub offset: u64,
    pub nbytes: u64,
    /// CRC-32 of the tensor's bytes.
    pub crc32: u32,
}

impl TensorInfo {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The size the layout and shape call for.
    pub fn expected_nbytes(&self) -> Option<u64> {
        self.dtype.nbytes(&self.shape)
    }
}

/// A page-aligned run of the data section holding whole tensors (one transformer block, the
/// embedding, the head...). Segments are the unit a swap schedule stages into the window.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Segment {
    pub name: String,
    /// Offset from the start of the data section; a multiple of [`crate::SEGMENT_ALIGN`].
    pub offset: u64,
    pub nbytes: u64,
}

/// Which graph serves which decoding state.
///
/// Every graph computes `rows` consecutive positions of the canvas (a whole sequence, a
/// block and what follows it, one block, or a block and its speculative successors): its
/// rows store their keys and values in the KV cache at their positions, then attend to the
/// cache's first `context` positions. A pass over the whole sequence is the exact sampler's;
/// a pass over fewer rows reuses what earlier passes cached for the others. So one set of
/// row buckets serves every policy, and a policy is only a choice of which rows to recompute.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// Graphs by increasing row count: R rows run on the first graph whose `rows >= R`, the
    /// padding rows neither stored nor attended to.
    pub by_rows: Vec<u32>,
    /// Positions the KV cache holds (the longest sequence; also the rotary tables' length).
    pub kv_capacity: u32,
    /// The block length and speculation depth the compile was asked to serve exactly (their
    /// row counts, `block_len * (1 + k)` for `k <= spec_blocks`, are buckets of their own).
    pub block_len: u32,
    pub spec_blocks: u32,
    /// Row counts a row-set pass (`--policy mbsd`) may run, ascending: the target's latency
    /// buckets. Chosen from `latency` by the compiler (a smaller graph is kept only when the
    /// cost model predicts it meaningfully faster than the next larger one: an NPU computes 8
    /// rows about as slowly as 32, the host does not). Each names a graph of exactly that
    /// many rows.
    pub row_buckets: Vec<u32>,
    /// MatMuls over bf16 weights round their activations to bf16 too (bf16 products, f32
    /// sums, as PyTorch's bf16 and NPUs compute) instead of multiplying in f32.
    pub bf16_activations: bool,
    /// How the int8 matmuls (q8, q4) scale their activations.
    pub activation_scales: crate::window::ActivationScales,
    /// Every byte the accelerator touches: KV cache, activations, scratch, weights.
    pub window: WindowPlan,
    /// Predicted seconds of one pass of each graph (by graph index) on `latency_target`,
    /// from its cost model: the latency table speculation sizes its buckets from.
    pub latency: Vec<f64>,
    /// The machine `latency` was predicted for, with "(estimate)" when its rates are not
    /// measured ones.
    pub latency_target: String,
}

/// How the artifact was made, for `lladac inspect` and bug reports.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CompileInfo {
    /// `lladac <version>`.
    pub compiler: String,
    /// The checkpoint directory it was compiled from.
    pub source: String,
    pub target: String,
    /// The options, as `key=value` pairs.
    pub options: Vec<(String, String)>,
}

/// A section of the artifact besides the core header (the NPU's executables are `npu.qnn`),
/// versioned on its own: readers keep sections they do not know for whoever reads them, and
/// refuse only a required one they cannot read ([`crate::sections`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Extension {
    /// The section's kind: at most 24 ASCII bytes, `area.name`.
    pub key: String,
    pub version: u32,
    /// Whether a reader that cannot read it must refuse the artifact (a runtime runs without
    /// an optional section: the host backend without the NPU's executables).
    pub required: bool,
    pub bytes: Vec<u8>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Header {
    pub model: ModelConfig,
    pub special: SpecialTokens,
    pub tokenizer: TokenizerSpec,
    pub tensors: Vec<TensorInfo>,
    pub segments: Vec<Segment>,
    pub graphs: Vec<Graph>,
    pub plan: Plan,
    pub compile: CompileInfo,
    pub extensions: Vec<Extension>,
}

impl Header {
    pub fn tensor_index(&self, name: &str) -> Option<u32> {
        self.tensors.iter().position(|t| t.name == name).map(|i| i as u32)
    }

    /// The graph that computes `rows` positions: the smallest bucket of the plan that holds
    /// them.
    pub fn graph_for_rows(&self, rows: usize) -> Option<u32> {
        self.plan.by_rows.iter().copied().find(|&g| self.graphs.get(g as usize).is_some_and(|g| g.rows as usize >= rows))
    }

    /// The segment holding tensor `t` whole, if any.
    pub fn segment_of(&self, t: TensorId) -> Option<u32> {
        let t = self.tensors.get(t as usize)?;
        let end = t.offset.checked_add(t.nbytes)?;
        self.segments.iter().position(|s| t.offset >= s.offset && s.offset.checked_add(s.nbytes).is_some_and(|e| end <= e)).map(|s| s as u32)
    }
}
