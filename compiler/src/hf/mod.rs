//! Importer for Hugging Face LLaDA checkpoint directories.

pub mod checkpoint;
pub mod config;
mod config_common;
pub mod config_diffusion_gemma;
pub mod config_dream;
pub mod config_llada2;
pub mod config_moe;
pub mod tokenizer;

/// Names of a LLaDA checkpoint's tensors.
pub mod names {
    pub const EMBEDDING: &str = "model.transformer.wte.weight";
    pub const FINAL_NORM: &str = "model.transformer.ln_f.weight";
    pub const HEAD: &str = "model.transformer.ff_out.weight";

    pub fn block(layer: usize, part: &str) -> String {
        format!("model.transformer.blocks.{layer}.{part}.weight")
    }

    /// LLaDA 2.x's (`modeling_llada2_moe.py`) embedding; its layers use the names below.
    pub const LLADA2_EMBEDDING: &str = "model.word_embeddings.weight";

    /// LLaDA-MoE's (`modeling_lladamoe.py`); Dream's (`modeling_dream.py`) use the same names
    /// for the tensors they share.
    pub mod moe {
        pub const EMBEDDING: &str = "model.embed_tokens.weight";
        pub const FINAL_NORM: &str = "model.norm.weight";
        pub const HEAD: &str = "lm_head.weight";

        /// `part` of layer `layer`: `self_attn.q_proj`, `mlp.gate`, `input_layernorm`...
        pub fn layer(layer: usize, part: &str) -> String {
            format!("model.layers.{layer}.{part}.weight")
        }

        /// The bias of `part` of layer `layer` (Dream's `self_attn.q_proj`...).
        pub fn layer_bias(layer: usize, part: &str) -> String {
            format!("model.layers.{layer}.{part}.bias")
        }

        /// The router's expert bias of layer `layer` (LLaDA 2.x).
        pub fn expert_bias(layer: usize) -> String {
            format!("model.layers.{layer}.mlp.gate.expert_bias")
        }

        /// `part` (`gate_proj`, `up_proj`, `down_proj`) of expert `expert` of layer `layer`.
        pub fn expert(layer: usize, expert: usize, part: &str) -> String {
            format!("model.layers.{layer}.mlp.experts.{expert}.{part}.weight")
        }
    }
}
