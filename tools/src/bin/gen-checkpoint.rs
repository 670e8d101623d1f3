//! Writes a random-weight LLaDA, LLaDA-MoE, LLaDA 2.x, Dream or DiffusionGemma checkpoint in
//! Hugging Face layout.
//!
//! `gen-checkpoint --preset llada-8b --dtype bf16 -o /tmp/llada-8b` gives the exact LLaDA-8B
//! shapes (`--preset llada-moe-7b` LLaDA-MoE-7B-A1B's, `--preset dream-7b`
//! Dream-v0-Instruct-7B's, `--preset llada2-mini` LLaDA2.0-mini's, `--preset
//! diffusiongemma-26b-a4b` diffusiongemma-26B-A4B-it's, each in its own layout); any field can be
//! overridden (`--n-kv-heads 8` for grouped-query attention, `--experts 16` for fewer experts,
//! `--layers 2` for a shallow copy of a large shape).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use llada_tools::checkpoint::{check, prepare_output, write, CheckpointSpec, Outliers, Shape, WeightType};

#[derive(Parser)]
#[command(about = "Write a random-weight LLaDA, LLaDA-MoE, LLaDA 2.x, Dream or DiffusionGemma checkpoint in exact Hugging Face layout")]
struct Args {
    /// Starting shape and layout: LLaDA's tiny, llada-1b and llada-8b; the mixture-of-experts
    /// LLaDA-MoE's tiny-moe and llada-moe-7b; LLaDA 2.x's tiny-llada2 and llada2-mini
    /// (LLaDA2.0-mini); Dream's tiny-dream and dream-7b (Dream-v0-Instruct-7B); DiffusionGemma's
    /// tiny-diffusiongemma (the conformance kit's sizes) and diffusiongemma-26b-a4b
    /// (diffusiongemma-26B-A4B-it: about 52 GB in bf16; --layers 2 keeps every shape but the depth).
    #[arg(long, default_value = "tiny", value_parser = ["tiny", "llada-1b", "llada-8b", "tiny-moe", "llada-moe-7b", "tiny-llada2", "llada2-mini", "tiny-dream", "dream-7b", "tiny-diffusiongemma", "diffusiongemma-26b-a4b"])]
    preset: String,
    #[arg(long)]
    d_model: Option<usize>,
    #[arg(long, visible_alias = "layers")]
    n_layers: Option<usize>,
    #[arg(long)]
    n_heads: Option<usize>,
    #[arg(long)]
    n_kv_heads: Option<usize>,
    /// SwiGLU width (of each expert, for the MoE presets; Dream's intermediate_size;
    /// DiffusionGemma's moe_intermediate_size).
    #[arg(long)]
    mlp_hidden_size: Option<usize>,
    /// Experts per layer (MoE presets only).
    #[arg(long)]
    experts: Option<usize>,
    /// Experts per token (MoE presets only).
    #[arg(long)]
    top_k: Option<usize>,
    /// Vocabulary and embedding rows.
    #[arg(long)]
    vocab_size: Option<usize>,
    #[arg(long)]
    max_sequence_length: Option<usize>,
    /// Stored weight type.
    #[arg(long, default_value = "bf16", value_parser = ["f32", "bf16", "f16"])]
    dtype: String,
    /// Largest shard, in MB (10^6 bytes).
    #[arg(long, default_value_t = 2000)]
    shard_mb: u64,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Standard deviation of the weight matrices.
    #[arg(long, default_value_t = 0.02)]
    init_std: f32,
    /// Residual-stream outlier channels, as trained LLMs have: this many hidden dimensions
    /// whose embedding columns are multiplied by --outlier-gain (see `Outliers`).
    #[arg(long, default_value_t = 0)]
    outlier_channels: usize,
    /// The outlier channels' magnitude against the others.
    #[arg(long, default_value_t = 20.0)]
    outlier_gain: f32,
    /// Output directory: new or empty, unless --replace.
    #[arg(short, long)]
    output: PathBuf,
    /// Replace a checkpoint written into the output directory before: removes the files
    /// gen-checkpoint writes (config.json, generation_config.json, the tokenizer files,
    /// model*.safetensors, model.safetensors.index.json) first, so no stale shard or index is
    /// left beside the new weights; a directory holding anything else is refused.
    #[arg(long)]
    replace: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let mut shape = match a.preset.as_str() {
        "llada-8b" => Shape::llada_8b(),
        "llada-1b" => Shape::llada_1b(),
        "tiny-moe" => Shape::tiny_moe(),
        "llada-moe-7b" => Shape::llada_moe_7b(),
        "tiny-dream" => Shape::tiny_dream(),
        "dream-7b" => Shape::dream_7b(),
        "tiny-llada2" => Shape::tiny_llada2(),
        "llada2-mini" => Shape::llada2_mini(),
        "tiny-diffusiongemma" => Shape::tiny_diffusion_gemma(),
        "diffusiongemma-26b-a4b" => Shape::diffusion_gemma_26b_a4b(),
        _ => Shape::tiny(),
    };
    match shape.family.moe_mut() {
        Some(moe) => {
            moe.experts = a.experts.unwrap_or(moe.experts);
            moe.top_k = a.top_k.unwrap_or(moe.top_k);
        }
        None if a.experts.is_some() || a.top_k.is_some() => {
            eprintln!("error: --experts and --top-k need a mixture-of-experts preset (tiny-moe, llada-moe-7b, tiny-llada2, llada2-mini, tiny-diffusiongemma, diffusiongemma-26b-a4b), not '{}'", a.preset);
            return ExitCode::FAILURE;
        }
        None => {}
    }
    shape.d_model = a.d_model.unwrap_or(shape.d_model);
    shape.n_layers = a.n_layers.unwrap_or(shape.n_layers);
    shape.n_heads = a.n_heads.unwrap_or(shape.n_heads);
    shape.n_kv_heads = a.n_kv_heads.unwrap_or(shape.n_kv_heads);
    shape.mlp_hidden_size = a.mlp_hidden_size.unwrap_or(shape.mlp_hidden_size);
    if let Some(v) = a.vocab_size {
        shape.vocab_size = v;
        shape.embedding_size = v;
    }
    shape.max_sequence_length = a.max_sequence_length.unwrap_or(shape.max_sequence_length);
    let Some(shard_bytes) = a.shard_mb.checked_mul(1_000_000) else {
        eprintln!("error: --shard-mb {}: more bytes than a file can hold", a.shard_mb);
        return ExitCode::FAILURE;
    };
    let spec = CheckpointSpec {
        shape,
        weights: WeightType::parse(&a.dtype).expect("clap restricts the values"),
        shard_bytes,
        seed: a.seed,
        init_std: a.init_std,
        outliers: (a.outlier_channels > 0).then_some(Outliers { channels: a.outlier_channels, gain: a.outlier_gain }),
    };
    // Every number checked, then the folder, before anything is created or removed.
    if let Err(e) = check(&spec) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = prepare_output(&a.output, a.replace) {
        eprintln!("error: {}: {e}", a.output.display());
        return ExitCode::FAILURE;
    }
    match write(&spec, &a.output) {
        Ok(w) => {
            eprintln!(
                "wrote {} ({} parameters, {:.2} GB of {} weights in {} shard(s))",
                a.output.display(),
                spec.shape.parameters(),
                w.bytes as f64 / 1e9,
                a.dtype,
                w.shards.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", a.output.display());
            ExitCode::FAILURE
        }
    }
}
