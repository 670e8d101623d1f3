//! Importer for Hugging Face LLaDA checkpoint directories.

pub mod checkpoint;
pub mod config;
pub mod tokenizer;

/// Names of a LLaDA checkpoint's tensors.
pub mod names {
    pub const EMBEDDING: &str = "model.transformer.wte.weight";
    pub const FINAL_NORM: &str = "model.transformer.ln_f.weight";
    pub const HEAD: &str = "model.transformer.ff_out.weight";

    pub fn block(layer: usize, part: &str) -> String {
        format!("model.transformer.blocks.{layer}.{part}.weight")
    }
}
