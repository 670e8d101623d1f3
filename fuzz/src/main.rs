//! `llada-fuzz`: fuzzing on the stable toolchain (no `cargo fuzz`, which needs nightly), with
//! its own mutators, structure-aware where the input is structured.
//!
//!     llada-fuzz artifact [--execs N] [--seconds S] [--seed N] [--model DIR] [--crashes DIR]
//!     llada-fuzz importer [same options]
//!     llada-fuzz onnx [same options; --model: an ONNX export's directory]
//!     llada-fuzz gguf [same options; --model: a GGUF file]
//!     llada-fuzz params [same options]
//!
//! Stops at N executions or S seconds, whichever comes first; exits 1 if anything crashed or
//! hung. `--model` is the checkpoint the seeds come from (default: the embedded model).

mod artifact;
mod gguf;
mod harness;
mod importer;
mod mutate;
mod onnx;
mod params;

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = run(&args) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let target = args.first().ok_or("usage: llada-fuzz artifact|importer|onnx|gguf|params [--execs N] [--seconds S] [--seed N] [--model DIR] [--crashes DIR]")?;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut limits = harness::Limits { execs: u64::MAX, seconds: f64::INFINITY, seed: 1, crashes: PathBuf::from("fuzz-crashes") };
    let mut model = root.join(match target.as_str() {
        "onnx" => "tests/data/onnx/external",
        "gguf" => "tests/data/gguf/llada-tiny-tasks.q4_0.gguf",
        _ => "models/llada-tiny-tasks",
    });
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().ok_or(format!("{flag} needs a value"))?;
        let number = |v: &str| v.parse::<u64>().map_err(|_| format!("{flag} {v}: not a whole number"));
        match flag.as_str() {
            "--execs" => limits.execs = number(value)?,
            "--seconds" => limits.seconds = number(value)? as f64,
            "--seed" => limits.seed = number(value)?,
            "--model" => model = PathBuf::from(value),
            "--crashes" => limits.crashes = PathBuf::from(value),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if limits.execs == u64::MAX && limits.seconds.is_infinite() {
        return Err("give --execs or --seconds".into());
    }
    let tmp = if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    let work = tmp.join(format!("llada-fuzz-{}-{target}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let report = match target.as_str() {
        "artifact" => {
            let seed_path = small_artifact(&model, &work)?;
            let seed = artifact::Seed::new(std::fs::read(&seed_path).map_err(|e| e.to_string())?);
            let scratch = work.join("accepted.lad");
            harness::run("artifact", &limits, |rng| artifact::make(&seed, rng), |i| artifact::test(&seed, i, &scratch), |i| i.file.clone())
        }
        "importer" => {
            let seeds = importer::Seeds::new(&model, &work);
            harness::run("importer", &limits, |rng| importer::make(&seeds, rng), |i| importer::test(&seeds, i), |i| i.bytes.clone())
        }
        "onnx" => {
            let seed = onnx::Seed::new(&model, &work);
            harness::run("onnx", &limits, |rng| onnx::make(&seed, rng), |i| onnx::test(&seed, i), |i| i.bytes.clone())
        }
        "gguf" => {
            let seed = gguf::Seed::new(&model, &work);
            harness::run("gguf", &limits, |rng| gguf::make(&seed, rng), |i| gguf::test(&seed, i), |i| i.bytes.clone())
        }
        "params" => {
            let seed = params::Seed::new(&small_artifact(&model, &work)?);
            harness::run("params", &limits, |rng| params::make(&seed, rng), |i| params::test(&seed, i), |i| format!("{i:?}").into_bytes())
        }
        other => return Err(format!("unknown target '{other}' (artifact, importer, onnx, gguf or params)")),
    };
    let _ = std::fs::remove_dir_all(&work);
    println!(
        "{target}: {} executions in {:.0} s ({:.0}/s), {} accepted, {} crashes, {} hangs (slowest {:.3} s)",
        report.execs,
        report.seconds,
        report.execs as f64 / report.seconds.max(1e-9),
        report.accepted,
        report.crashes,
        report.hangs,
        report.slowest.as_secs_f64()
    );
    if report.crashes > 0 || report.hangs > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// The model at q4 with 64 positions (small, so every execution is fast), in `work`.
fn small_artifact(model: &std::path::Path, work: &std::path::Path) -> Result<PathBuf, String> {
    let path = work.join("seed.lad");
    lladac::compile(&lladac::CompileOptions {
        model: model.to_path_buf(),
        output: path.clone(),
        quant: Some(lladac::Quant::Q4 { group: 32 }),
        max_seq: Some(64),
        logit_rows: 64,
        spec_blocks: Some(1),
        ..Default::default()
    })
    .map_err(|e| format!("compiling the seed: {e}"))?;
    Ok(path)
}
