use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use llada_rt::sampler::StepView;
use llada_rt::text::Text;
use llada_rt::{conformance, generate, Error, Model, Remasking, Result, SamplerParams, Session};
use serde_json::json;

#[derive(Parser)]
#[command(name = "llada-rt", version, about = "Run a compiled llada artifact")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct SamplerArgs {
    /// Tokens to generate.
    #[arg(long, default_value_t = 128)]
    gen_len: usize,
    /// Semi-autoregressive block length (gen-len must be a multiple of it).
    #[arg(long, default_value_t = 32)]
    block_len: usize,
    /// Denoising steps over all blocks (a multiple of the number of blocks).
    #[arg(long, default_value_t = 128)]
    steps: usize,
    /// 0 = most likely token; above 0, Gumbel-max sampling.
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// Seed of the sampling noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Classifier-free guidance scale (0 = off).
    #[arg(long, default_value_t = 0.0)]
    cfg: f64,
    /// Which masked positions to commit first.
    #[arg(long, default_value = "low_confidence", value_parser = ["low_confidence", "random"])]
    remasking: String,
    /// Never predict end-of-text (the official `logits_eos_inf`).
    #[arg(long)]
    logits_eos_inf: bool,
    /// Give end-of-text/end-of-turn predictions zero confidence (the official `confidence_eos_eot_inf`).
    #[arg(long)]
    confidence_eos_eot_inf: bool,
}

impl SamplerArgs {
    fn params(&self) -> SamplerParams {
        SamplerParams {
            gen_length: self.gen_len,
            block_length: self.block_len,
            steps: self.steps,
            temperature: self.temperature,
            cfg_scale: self.cfg,
            remasking: Remasking::parse(&self.remasking).expect("clap restricts the values"),
            seed: self.seed,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Generate from a prompt.
    Run {
        /// The artifact (from `lladac compile`).
        file: PathBuf,
        /// Prompt text.
        #[arg(short, long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
        prompt: Option<String>,
        /// Apply the model's chat template to the prompt (one user turn).
        #[arg(long, requires = "prompt")]
        chat: bool,
        /// Prompt as comma-separated token ids.
        #[arg(long)]
        prompt_ids: Option<String>,
        #[command(flatten)]
        sampler: SamplerArgs,
        /// Print one JSON object (ids, reveals, text, counters) instead of streaming text.
        #[arg(long)]
        json: bool,
        /// Redraw the whole canvas after every step, masks and all.
        #[arg(long, conflicts_with = "json")]
        show_denoising: bool,
    },
    /// Check the runtime against a golden file from the official sampler.
    Conformance {
        /// golden.json (schema: the conformance kit's README).
        golden: PathBuf,
        /// The artifact compiled from the golden file's checkpoint.
        #[arg(long)]
        model: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().map_err(|_| Error::request(format!("--prompt-ids: '{t}' is not a token id"))))
        .collect()
}

/// Streams the answer as its leading tokens commit (diffusion commits out of order, so only
/// the unbroken prefix can be printed), or redraws the canvas with `--show-denoising`.
struct Display<'t> {
    text: &'t Text,
    mask: u32,
    denoising: bool,
    printed: String,
    canvas_lines: usize,
}

impl Display<'_> {
    fn step(&mut self, v: &StepView) {
        let generated = &v.canvas[v.prompt_len..];
        let mut out = std::io::stdout().lock();
        if self.denoising {
            let shown: String = generated
                .iter()
                .map(|&t| if t == self.mask { "░".to_string() } else { self.text.decode(&[t], false) })
                .collect();
            if self.canvas_lines > 0 {
                let _ = write!(out, "\x1b[{}F\x1b[J", self.canvas_lines);
            }
            let _ = writeln!(out, "step {}/{}\n{shown}", v.step, v.steps);
            self.canvas_lines = 2 + shown.matches('\n').count();
        } else {
            let done = generated.iter().position(|&t| t == self.mask).unwrap_or(generated.len());
            let text = self.text.answer(&generated[..done]);
            // Print only what extends what is already shown (a partial UTF-8 sequence decodes
            // differently once it completes).
            if let Some(new) = text.strip_prefix(self.printed.as_str()) {
                if !new.is_empty() && !new.ends_with('\u{fffd}') {
                    let _ = write!(out, "{new}");
                    self.printed = text;
                }
            }
        }
        let _ = out.flush();
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { file, prompt, chat, prompt_ids, sampler, json, show_denoising } => {
            let model = Model::open(&file, true)?;
            let text = Text::new(&model.header.tokenizer, &model.header.special)?;
            let ids = match (&prompt, &prompt_ids) {
                (Some(p), _) if chat => text.encode_chat(p)?,
                (Some(p), _) => text.encode(p)?,
                (None, Some(s)) => parse_ids(s)?,
                (None, None) => unreachable!("clap requires one of them"),
            };
            if ids.is_empty() {
                return Err(Error::request("the prompt is empty"));
            }
            let params = sampler.params();
            let mut session = Session::new(&model);
            let mut display = Display { text: &text, mask: model.header.special.mask, denoising: show_denoising, printed: String::new(), canvas_lines: 0 };
            let g = if json {
                generate(&mut session, &ids, &params, &mut |_| {})?
            } else {
                generate(&mut session, &ids, &params, &mut |v| display.step(v))?
            };
            let answer = text.answer(&g.output_ids);
            if json {
                let obj = json!({
                    "prompt_ids": g.prompt_ids,
                    "output_ids": g.output_ids,
                    "reveals": g.reveals,
                    "text": answer,
                    "decoded": text.decode(&g.output_ids, false),
                    "forward_passes": g.forward_passes,
                    "rows_computed": g.rows_computed,
                    "seconds": g.seconds,
                    "settings": {
                        "gen_length": params.gen_length, "block_length": params.block_length, "steps": params.steps,
                        "temperature": params.temperature, "cfg_scale": params.cfg_scale,
                        "remasking": params.remasking.name(), "seed": params.seed,
                        "logits_eos_inf": params.logits_eos_inf, "confidence_eos_eot_inf": params.confidence_eos_eot_inf,
                    },
                });
                println!("{obj}");
            } else {
                if show_denoising {
                    println!("{answer}");
                } else {
                    // Whatever the prefix streaming held back.
                    print!("{}", answer.strip_prefix(display.printed.as_str()).unwrap_or(""));
                    println!();
                }
                if std::io::stderr().is_terminal() {
                    eprintln!(
                        "[{} tokens, {} steps, {} forward passes, {:.2} s]",
                        params.gen_length, params.steps, g.forward_passes, g.seconds
                    );
                }
            }
        }
        Command::Conformance { golden, model, json } => {
            let m = Model::open(&model, true)?;
            let mut session = Session::new(&m);
            let report = conformance::run(&mut session, &golden, &mut |_| {})?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report).expect("the report serializes"));
            } else {
                for f in &report.failures {
                    println!("MISMATCH {f}");
                }
                let ran = report.cases - report.skipped;
                println!("{}: {}", golden.display(), if report.passed() { "PASS" } else { "FAIL" });
                println!("  output_ids:                {}/{} matched", report.output_ids_matched, ran);
                println!("  reveals before first tie:  {}/{} matched", report.reveals_before_tie_matched, ran);
                println!("  reveals at every step:     {}/{} matched (after a tie the order is PyTorch's)", report.reveals_all_steps_matched, ran);
                println!(
                    "  first_step_logits:         {}/{} within {:.0e} (max abs error {:.2e})",
                    report.logit_cases_within_tolerance, report.logit_cases, conformance::LOGIT_TOLERANCE, report.max_logit_abs_error
                );
                if report.skipped > 0 {
                    println!("  skipped: {} case(s) that need PyTorch's own random stream", report.skipped);
                }
            }
            if !report.passed() {
                return Err(Error::request(format!("{}: conformance failed", golden.display())));
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.render().to_string();
            let mut lines = text.lines().filter(|l| !l.trim().is_empty());
            let first = lines.next().unwrap_or("error: invalid arguments");
            let tip = lines.find(|l| l.trim_start().starts_with("tip:")).map(|t| format!(" ({})", t.trim())).unwrap_or_default();
            eprintln!("{first}{tip}; see llada-rt --help");
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
