//! Writes a tasks file for `llada-rt eval`: one JSON object per line with the chat prompt and
//! the expected answer. The held-out files in `models/` come from this with their own seeds.

use std::io::Write;
use std::path::PathBuf;

use clap::Parser;
use rand::SeedableRng;
use llada_tools::tasks::{sample, Kind};

#[derive(Parser)]
#[command(about = "Write an eval tasks file (task kinds taken in turn)")]
struct Args {
    #[arg(long, default_value_t = 100)]
    count: usize,
    #[arg(long)]
    seed: u64,
    #[arg(short, long)]
    output: PathBuf,
    /// Task kinds, comma-separated, taken in turn (cumsum, parity, shift).
    #[arg(long, value_delimiter = ',', default_value = "fill,shift")]
    kinds: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let a = Args::parse();
    match write(&a) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}: {e}", a.output.display());
            std::process::ExitCode::FAILURE
        }
    }
}

fn write(a: &Args) -> std::io::Result<()> {
    let kinds: Vec<Kind> = match a.kinds.iter().map(|k| Kind::parse(k).ok_or(k)).collect::<Result<_, _>>() {
        Ok(k) => k,
        Err(bad) => {
            eprintln!("error: --kinds: unknown task kind '{bad}' (cumsum, parity, shift)");
            std::process::exit(2);
        }
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
    // Whole or not at all, never over a device or FIFO (llada_ir::files).
    let mut file = llada_ir::files::AtomicFile::create(&a.output, &[])?;
    let mut out = std::io::BufWriter::new(file.file());
    for i in 0..a.count {
        let t = sample(kinds[i % kinds.len()], &mut rng);
        writeln!(out, "{}", serde_json::json!({ "prompt": t.content, "chat": true, "expected": t.answer }))?;
    }
    out.flush()?;
    drop(out);
    file.commit()
}
