//! Trains the embedded default model (or a variant) and writes it in Hugging Face layout.
//!
//! `cargo run --release -p llada-tools --bin train -- -o models/llada-tiny-tasks` reproduces
//! the committed model from seed 0.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use llada_tools::tasks::Kind;
use llada_tools::train::{train, TrainConfig};

#[derive(Parser)]
#[command(about = "Train a small LLaDA on the task family of llada_tools::tasks (masked diffusion)")]
struct Args {
    /// Output checkpoint directory.
    #[arg(short, long)]
    output: PathBuf,
    #[arg(long)]
    steps: Option<usize>,
    #[arg(long)]
    batch: Option<usize>,
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    d_model: Option<usize>,
    #[arg(long)]
    n_layers: Option<usize>,
    /// Stop after this many minutes, keeping what was learnt.
    #[arg(long)]
    max_minutes: Option<f64>,
    /// Task kinds, comma-separated (cumsum, parity, shift).
    #[arg(long, value_delimiter = ',')]
    kinds: Option<Vec<String>>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let mut cfg = TrainConfig::embedded();
    cfg.steps = a.steps.unwrap_or(cfg.steps);
    cfg.batch = a.batch.unwrap_or(cfg.batch);
    cfg.lr = a.lr.unwrap_or(cfg.lr);
    cfg.seed = a.seed.unwrap_or(cfg.seed);
    cfg.shape.d_model = a.d_model.unwrap_or(cfg.shape.d_model);
    cfg.shape.n_heads = cfg.shape.d_model / 32;
    cfg.shape.n_kv_heads = cfg.shape.n_heads;
    cfg.shape.mlp_hidden_size = 3 * cfg.shape.d_model;
    cfg.shape.n_layers = a.n_layers.unwrap_or(cfg.shape.n_layers);
    cfg.max_minutes = a.max_minutes;
    if let Some(kinds) = a.kinds {
        cfg.kinds = match kinds.iter().map(|k| Kind::parse(k).ok_or(k)).collect::<Result<Vec<_>, _>>() {
            Ok(k) => k,
            Err(bad) => {
                eprintln!("error: --kinds: unknown task kind '{bad}' (cumsum, parity, shift)");
                return ExitCode::from(2);
            }
        };
    }
    eprintln!("training {:?} for {} steps of {} sequences", cfg.shape, cfg.steps, cfg.batch);
    match train(&cfg, &a.output, &mut |line| eprintln!("{line}")) {
        Ok(()) => {
            eprintln!("wrote {}", a.output.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", a.output.display());
            ExitCode::FAILURE
        }
    }
}
