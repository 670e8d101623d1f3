//! `llada-tools`: what the project needs to make its own models, since weights cannot be
//! downloaded here: random-weight checkpoints with real LLaDA, LLaDA-MoE, LLaDA 2.x, Dream and
//! DiffusionGemma shapes in exact Hugging Face layout (`checkpoint`, `checkpoint_moe`,
//! `checkpoint_llada2`, `checkpoint_dream`, `checkpoint_diffusion_gemma`), and LLaDA
//! and LLaDA-MoE written in burn (`reference`, `reference_moe`): the independent models the
//! tests check the runtime against, and the one the trainer trains.

#![recursion_limit = "256"]

pub mod checkpoint;
pub mod checkpoint_diffusion_gemma;
pub mod checkpoint_dream;
pub mod checkpoint_llada2;
mod checkpoint_files;
pub mod checkpoint_moe;
mod checkpoint_spec;
mod checkpoint_tokenizer;
mod checkpoint_vocab;
pub mod reference;
pub mod reference_moe;
pub mod tasks;
pub mod train;
