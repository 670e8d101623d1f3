use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{ArgMatches, Parser, Subcommand};
use llada_cli::{out, outln, typed, Failure};
use lladac::compile::Quant;
use lladac::{compile, CompileOptions};

#[derive(Parser)]
#[command(name = "lladac", version, about = "Compile a Hugging Face LLaDA checkpoint into one llada artifact")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Compile a checkpoint directory (or an ONNX export of one) into an artifact.
    Compile {
        /// Hugging Face checkpoint directory (config.json, safetensors, tokenizer files), or
        /// an ONNX export `*.onnx` with the checkpoint's config.json and tokenizer files beside it.
        #[arg(long)]
        model: PathBuf,
        /// Artifact to write (replaced atomically when the compile succeeds).
        #[arg(short, long)]
        output: PathBuf,
        /// Storage of the weight matrices [default: the checkpoint's element type; f16 on a
        /// Snapdragon target; a GGUF file's Q4_0 blocks stay q4, its other blocks become q8].
        /// q8: int8 per output channel; q4: int4 per --group inputs (both run with int8
        /// activations).
        #[arg(long, alias = "dtype", value_parser = ["f32", "bf16", "f16", "q8", "q4"])]
        quant: Option<String>,
        /// Inputs per q4 scale (--quant q4 only) [default: 64 on a Snapdragon target (the
        /// HTP's LPBQ block); 32 for a GGUF file of Q4_0 blocks (carried as they are); else 128].
        #[arg(long, value_parser = clap::builder::TypedValueParser::map(clap::builder::PossibleValuesParser::new(["32", "64", "128"]), |s: String| s.parse::<u32>().expect("one of the listed numbers")))]
        group: Option<u32>,
        /// Target to compile for (`lladac targets` lists them).
        #[arg(long, default_value = "host")]
        target: String,
        /// Longest prompt + generation the artifact serves [default: the model's
        /// max_sequence_length, at most the target's default: 4096 on the host, 1024 on phone
        /// NPUs, 512 on phone GPUs].
        #[arg(long)]
        max_seq: Option<u32>,
        /// Most positions whose logits one pass returns: at least the block length you decode with
        /// (`--head-rows`, its former name, is an alias).
        #[arg(long, alias = "head-rows", default_value_t = 256)]
        logit_rows: u32,
        /// Block length the cached and speculative policies decode with (graphs of exactly
        /// block x (1 + k) rows, k up to --spec-blocks, are added to the row buckets).
        #[arg(long, default_value_t = 32)]
        block_len: u32,
        /// How many blocks ahead `--policy spec` and `mbsd` may speculate: a block and those
        /// ahead of it, --block-len x (1 + K) rows, fit in --max-seq [default: 2, whose graphs
        /// past --max-seq are left out].
        #[arg(long)]
        spec_blocks: Option<u32>,
        /// Activations of matmuls over bf16 weights: f32 (exact: only the weights are
        /// rounded) or bf16 (bf16 products with f32 sums, like PyTorch's bf16 and NPUs; about
        /// twice the arithmetic rate here).
        #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
        activations: String,
        /// q8 and q4: scales of the int8 activations: one per row of a matmul's input, or
        /// one per block of 32 inputs (llama.cpp's Q8_0 blocks; a few large channels, which
        /// trained LLMs have, then cost precision only in their blocks) [default: block for
        /// q8, row for q4: BENCHMARKS.md's outlier study].
        #[arg(long, value_parser = ["row", "block"])]
        activation_scales: Option<String>,
        /// Accelerator window to plan for, in bytes or with a K/M/G suffix (2G, 512M)
        /// [default: the target's; on a GPU at most its largest allocation].
        #[arg(long, value_parser = parse_bytes)]
        window_bytes: Option<u64>,
        /// Element type of the KV cache [default: the target's].
        #[arg(long, value_parser = ["f32", "f16", "bf16"])]
        kv_dtype: Option<String>,
        /// On a Snapdragon target (sm8550, sm8650, sm8750, sm8850): build only the host
        /// stand-in (the CPU kernels under the target's window), without the NPU's QNN
        /// executables, so without Qualcomm's library.
        #[arg(long)]
        host_only: bool,
        /// Folder holding Qualcomm's libQnnHtp.so and libQnnSystem.so, which build the NPU
        /// executables of a Snapdragon target [default: LLADA_QNN_LIB].
        #[arg(long)]
        qnn_lib: Option<PathBuf>,
        /// On a Snapdragon target: split the model's layers into this many NPU contexts
        /// (at most one per layer) [default: the fewest whose binaries fit the window].
        #[arg(long)]
        npu_contexts: Option<u32>,
        /// On a Snapdragon target: build each context's row-bucket graphs over one copy of
        /// their weights, the form a phone loads (QNN's x86-64 simulator cannot reload it, so
        /// artifacts to run here are built without it).
        #[arg(long)]
        npu_shared_weights: bool,
        /// On a Snapdragon target: also prepare every executable for this QNN SoC id with
        /// profiling on and record QNN's own performance estimate of each (its model answers
        /// for 52, 62, 63, 72, 77, 95 and 114, not for SM8650 or SM8750: 72 models a v81 HTP,
        /// 77 a v73). `lladac inspect --estimate` sets them beside the cost model's.
        #[arg(long)]
        npu_estimate_soc: Option<u32>,
        /// On a Snapdragon target: the NPU's matmul activations. u16: 16-bit fixed point
        /// around block-scaled int4 weights (Qualcomm's LPBQ, blocks of --group inputs) and an
        /// int8 LM head, their ranges calibrated on the host kernels; f16: fp16 around int4
        /// per output channel [default: u16 with --quant q4, else f16].
        #[arg(long, value_parser = ["f16", "u16"])]
        npu_activations: Option<String>,
        /// --npu-activations u16: prompts to calibrate on, one JSON object with a "prompt"
        /// field per line (an eval task file) or one prompt per line [default: lladac's
        /// built-in set, through the model's chat template].
        #[arg(long)]
        calibration: Option<PathBuf>,
        /// On a Snapdragon target: the HTP sessions the phone grants this process, which the
        /// contexts spread over [default: the target's: 2 on sm8650/sm8750/sm8850, 1 on
        /// sm8550]; where too few hold every context, the last one's rotate.
        #[arg(long)]
        npu_sessions: Option<u32>,
        /// On a Snapdragon target: bytes one HTP session maps [default: the target's: 3000 MiB
        /// on sm8550, 3200 MiB on the others] (1M, 2G...).
        #[arg(long, value_parser = parse_bytes)]
        npu_session_bytes: Option<u64>,
    },
    /// Describe an artifact: model, tensors, graphs, plan (verifies all checksums).
    Inspect {
        file: PathBuf,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
        /// Predict pass and generation times of the plan (estimates on phone targets).
        #[arg(long)]
        estimate: bool,
        /// --estimate: decoding policy [default: dual; LLaDA 2.x and DiffusionGemma: exact, their published generate].
        #[arg(long, value_parser = ["exact", "prefix", "dual", "mbsd"], requires = "estimate")]
        policy: Option<String>,
        /// --estimate --policy mbsd: its dense passes per generation, as measured
        /// (`llada-rt run --json`'s forward_passes) [default: one per step, no draft confirmed].
        /// LLaDA 2.x: its model calls, as measured [default: the most its schedule takes].
        /// DiffusionGemma: its decoder passes, as measured (`llada-rt run --json`'s
        /// denoising_steps_per_canvas, summed) [default: --steps a canvas].
        #[arg(long, requires = "estimate")]
        passes: Option<u32>,
        /// --estimate: another target's rates for this plan (a Snapdragon artifact's plan is
        /// the same on every Snapdragon with its window and row multiple).
        #[arg(long, requires = "estimate")]
        on_target: Option<String>,
        /// --estimate: prompt tokens.
        #[arg(long, default_value_t = 32, requires = "estimate")]
        prompt_len: u32,
        /// --estimate: generated tokens.
        #[arg(long, default_value_t = 128, requires = "estimate")]
        gen_len: u32,
        /// --estimate: block length [default: 32; DiffusionGemma: its canvas].
        #[arg(long, requires = "estimate")]
        block_len: Option<u32>,
        /// --estimate: denoising steps [default: 128; LLaDA 2.x: 32 per block; DiffusionGemma:
        /// its max_denoising_steps per canvas].
        #[arg(long, requires = "estimate")]
        steps: Option<u32>,
        /// --estimate: single passes to predict, by token rows.
        #[arg(long, value_delimiter = ',', default_value = "32,64,128", requires = "estimate")]
        rows: Vec<u32>,
        /// --estimate: cached positions each --rows pass attends to besides its rows [default:
        /// as many as its rows].
        #[arg(long, requires = "estimate")]
        context: Option<u32>,
        /// --estimate of an artifact built --host-only: plan its NPU contexts for a phone that
        /// grants this many HTP sessions [default: the target's].
        #[arg(long, requires = "estimate")]
        npu_sessions: Option<u32>,
        /// --estimate of an artifact built --host-only: bytes one HTP session maps [default:
        /// the target's] (1M, 3G...).
        #[arg(long, requires = "estimate", value_parser = parse_bytes)]
        npu_session_bytes: Option<u64>,
        /// --estimate: take rates and bandwidth from `llada-rt roofline --json` output
        /// (this machine, measured) instead of the target file.
        #[arg(long, requires = "estimate")]
        rates: Option<PathBuf>,
    },
    /// List the built-in targets.
    Targets,
}

/// `2G`, `512M`, `64K` (powers of 1024) or a plain byte count.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, unit) = match t.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => t.split_at(i),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().trim_end_matches("IB").trim_end_matches('B') {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        _ => return Err(format!("'{s}': expected a byte count such as 2G, 512M or 1048576")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{s}': expected a byte count such as 2G, 512M or 1048576"))?;
    n.checked_mul(1 << shift).filter(|&b| b > 0).ok_or_else(|| format!("'{s}': must be between 1 byte and 16 EiB"))
}

fn run(cli: Cli, matches: &ArgMatches) -> Result<(), Failure<lladac::Error>> {
    match cli.command {
        Command::Compile { model, output, quant, group, target, max_seq, logit_rows, block_len, spec_blocks, activations, activation_scales, window_bytes, kv_dtype, host_only, qnn_lib, npu_contexts, npu_shared_weights, npu_estimate_soc, npu_activations, calibration, npu_sessions, npu_session_bytes } => {
            lladac::compile::check_flags(quant.as_deref(), group, &target, max_seq, block_len, spec_blocks).map_err(Failure::Usage)?;
            let group = group.unwrap_or_else(|| lladac::compile::default_group_for(&model, &target));
            let opts = CompileOptions {
                model,
                output,
                quant: quant.as_deref().and_then(|q| Quant::parse(q, group)),
                target,
                max_seq,
                logit_rows,
                block_len,
                spec_blocks,
                bf16_activations: activations == "bf16",
                activation_scales: activation_scales.as_deref().and_then(llada_ir::window::ActivationScales::parse),
                window_bytes,
                kv_dtype: kv_dtype.as_deref().and_then(llada_ir::KvDType::parse),
                progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
                host_only,
                qnn_lib,
                npu_contexts,
                npu_shared_weights,
                npu_estimate_soc,
                npu_activations: npu_activations.as_deref().and_then(lladac::compile::NpuActivations::parse).unwrap_or_default(),
                calibration,
                npu_limits: lladac::compile::NpuLimitOverrides { sessions: npu_sessions, session_bytes: npu_session_bytes },
            };
            let s = compile(&opts)?;
            // The artifact is written: a stderr that cannot take the report changes nothing.
            let mut err = std::io::stderr().lock();
            for w in &s.warnings {
                let _ = writeln!(err, "warning: {w}");
            }
            let _ = writeln!(
                err,
                "wrote {} ({:.1} MiB, {} tensors, {}, {} graphs up to {} tokens)",
                s.output.display(),
                s.bytes as f64 / (1 << 20) as f64,
                s.tensors,
                s.quant.name(),
                s.graphs,
                s.max_seq
            );
            if let Some((soc, contexts, bytes, seconds)) = &s.npu {
                let _ = writeln!(err, "  NPU: QNN executables for {soc} in {contexts} context(s), {:.1} MiB, built in {seconds:.1} s", *bytes as f64 / (1 << 20) as f64);
            }
        }
        Command::Inspect { file, json, estimate, policy, passes, on_target, prompt_len, gen_len, block_len, steps, rows, context, npu_sessions, npu_session_bytes, rates } => {
            let (header, major, minor, bytes) = lladac::inspect::open(&file)?;
            let mut d = lladac::inspect::describe(&header, major, minor, bytes);
            let e = if estimate {
                // LLaDA 2.x's own defaults: its published generate, 32 steps a block;
                // DiffusionGemma's: its published generate over the plan's canvas, with its
                // generation config's steps.
                let llada2 = header.model.family() == llada_ir::Family::Llada2Moe;
                let dg = llada_ir::diffusion_gemma::DiffusionGemmaSection::of(&header).ok().flatten();
                let policy = policy.unwrap_or_else(|| if llada2 || dg.is_some() { "exact" } else { "dual" }.to_string());
                let steps = steps.unwrap_or(match &dg {
                    Some(dg) => dg.generation.max_denoising_steps,
                    None if llada2 => 32,
                    None => 128,
                });
                let block_len = block_len.unwrap_or(match &dg {
                    Some(dg) => dg.canvas_length,
                    None => 32,
                });
                let npu_limits = lladac::compile::NpuLimitOverrides { sessions: npu_sessions, session_bytes: npu_session_bytes };
                let rows_given = typed(matches, "rows");
                let generation_given = ["policy", "passes", "prompt_len", "gen_len", "block_len", "steps"].iter().any(|id| typed(matches, id));
                let req = lladac::estimate::EstimateRequest { policy, prompt_len, gen_len, block_len, steps, rows, context, npu_limits, rows_given, generation_given, rates, passes, on_target };
                Some(lladac::estimate::estimate(&header, &req)?)
            } else {
                None
            };
            if json {
                if let Some(e) = e {
                    d["estimate"] = e;
                }
                outln!("{}", serde_json::to_string_pretty(&d).expect("a JSON value serializes"))?;
            } else {
                out!("{}", lladac::inspect::render_text(&d))?;
                if let Some(e) = e {
                    out!("\n{}", lladac::estimate::render_text(&e))?;
                }
            }
        }
        Command::Targets => {
            for name in llada_targets::names() {
                let t = llada_targets::by_name(name).map_err(lladac::Error::Options)?;
                outln!("{:<16} {}", t.name, t.description)?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    llada_cli::main::<Cli, _>("lladac", run, |_| false)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("2G"), Ok(2 << 30));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("64k"), Ok(64 << 10));
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        for bad in ["", "G", "2X", "-1G", "0", "99999999999G", "1.5G"] {
            assert!(parse_bytes(bad).is_err(), "{bad:?} accepted");
        }
    }
}
