//! `llada-rt run`: one generation from a prompt, streamed as it settles (or redrawn step by
//! step, or printed as one JSON object).

use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::path::PathBuf;

use clap::Args;
use llada_cli::{out, outln, Failure};
use llada_rt::sampler::StepView;
use llada_rt::text::Text;
use llada_rt::{generate, generate_until, Error, Model};
use serde_json::json;

use crate::{parse_ids, print_experts, print_mbsd, window_report, Done, SamplerArgs, SessionArgs};

#[derive(Args)]
pub(crate) struct Run {
    /// The artifact (from `lladac compile`).
    file: PathBuf,
    /// Prompt text.
    #[arg(short, long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    prompt: Option<String>,
    /// Apply the model's chat template to the prompt (one user turn); not with
    /// --prompt-ids, which are token ids as given.
    #[arg(long, requires = "prompt", conflicts_with = "prompt_ids")]
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
    /// Write a Chrome/Perfetto trace of the run (dense passes, waits, staging copies).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Time every op of every pass and print the sums by op, and the matmuls' by shape
    /// and rows (with --json: as "op_profile"). Timing each op costs a little time.
    #[arg(long)]
    op_profile: bool,
    #[command(flatten)]
    session: SessionArgs,
}

impl Run {
    pub(crate) fn run(self, typed: &dyn Fn(&str) -> bool) -> Done {
        let Run { file, prompt, chat, prompt_ids, sampler, json, show_denoising, trace, op_profile, session: session_args } = self;
        if let Some(path) = &trace {
            llada_ir::files::check_destination(path, &[&file]).map_err(|e| Error::io(path, e))?;
        }
        let model = Model::open(&file, true)?;
        let text = Text::new(&model.header.tokenizer, &model.header.special)?;
        let ids = match (&prompt, &prompt_ids) {
            (Some(p), _) if chat => text.encode_chat(p)?,
            (Some(p), _) => text.encode(p)?,
            (None, Some(s)) => parse_ids(s)?,
            (None, None) => unreachable!("clap requires one of them"),
        };
        let params = sampler.checked_params(&model, typed)?;
        let mut session = session_args.open(&model)?;
        let timeline = trace.as_ref().map(|_| std::sync::Arc::new(llada_rt::trace::Trace::default()));
        if let Some(t) = &timeline {
            session.set_trace(t.clone());
        }
        session.profile_ops(op_profile);
        let mut display = Display { text: &text, mask: model.header.special.mask, denoising: show_denoising, printed: String::new(), canvas_lines: 0, failed: None };
        let g = if json {
            generate(&mut session, &ids, &params, &mut |_| {})
        } else {
            generate_until(&mut session, &ids, &params, &mut |v| display.step(v))
        };
        // A stream stdout stopped taking stopped the generation (`Error::Cancelled`).
        if let Some(e) = display.failed.take() {
            return Err(Failure::Stdout(e));
        }
        let g = g?;
        if let (Some(path), Some(t)) = (&trace, &timeline) {
            t.write(path, &[&file]).map_err(|e| Error::io(path, e))?;
        }
        let answer = text.answer(&g.output_ids);
        let ops = op_profile.then(|| llada_rt_tools::profile::split(&model, &session.take_op_profiles()));
        if json {
            let mut obj = json!({
                "prompt_ids": g.prompt_ids,
                "output_ids": g.output_ids,
                "reveals": g.reveals,
                "text": answer,
                "decoded": text.decode(&g.output_ids, false),
                "forward_passes": g.forward_passes,
                "rows_computed": g.rows_computed,
                "seconds": g.seconds,
                "settings": params,
                "drafts_confirmed": g.drafts_confirmed,
                "mbsd": g.mbsd,
                "window": window_report(&session),
            });
            // Only where commits can be revised: the official policies' output stays as it was.
            if let Some(r) = &g.revisions {
                obj["revisions"] = json!(r);
            }
            // DiffusionGemma: the decoder passes of each canvas (the published stopping rule's).
            if let Some(d) = &g.denoising_steps_per_canvas {
                obj["denoising_steps_per_canvas"] = json!(d);
            }
            if let Some(ops) = &ops {
                obj["op_profile"] = json!(ops);
            }
            outln!("{obj}")?;
        } else {
            if show_denoising {
                outln!("{answer}")?;
            } else {
                // Whatever the prefix streaming held back.
                out!("{}", answer.strip_prefix(display.printed.as_str()).unwrap_or(""))?;
                outln!()?;
            }
            if std::io::stderr().is_terminal() {
                eprintln!(
                    "[{} tokens, {} forward passes ({} policy), {} rows computed, {:.2} s]",
                    params.gen_length, g.forward_passes, params.policy.name(), g.rows_computed, g.seconds
                );
                if let Some(m) = &g.mbsd {
                    print_mbsd(m)?;
                }
                print_experts(&session)?;
            }
            if let Some(ops) = &ops {
                ops.print()?;
            }
        }
        Ok(())
    }
}

/// Streams the answer as far as it can no longer change (diffusion commits out of order, and
/// under revision a committed token may still be replaced, so only the settled prefix is
/// printed; the rest follows at the end), or redraws the canvas with `--show-denoising`.
struct Display<'t> {
    text: &'t Text,
    mask: u32,
    denoising: bool,
    printed: String,
    canvas_lines: usize,
    /// Why stdout refused a step: the generation stops there.
    failed: Option<std::io::Error>,
}

impl Display<'_> {
    /// Shows step `v`; once stdout fails, keeps its error and breaks off the generation.
    fn step(&mut self, v: &StepView) -> ControlFlow<()> {
        match self.show(v) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                self.failed = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    fn show(&mut self, v: &StepView) -> std::io::Result<()> {
        use llada_cli::print_stdout;
        let generated = v.generated();
        if self.denoising {
            let shown: String = generated
                .iter()
                .map(|&t| if t == self.mask { "░".to_string() } else { self.text.decode(&[t], false) })
                .collect();
            let up = if self.canvas_lines > 0 { format!("\x1b[{}F\x1b[J", self.canvas_lines) } else { String::new() };
            print_stdout(format_args!("{up}step {}/{}\n{shown}", v.step, v.steps), true)?;
            self.canvas_lines = 2 + shown.matches('\n').count();
        } else {
            let text = self.text.settled_answer(&generated[..v.settled]);
            // Print only what extends what is already shown.
            if let Some(new) = text.strip_prefix(self.printed.as_str()) {
                if !new.is_empty() {
                    print_stdout(format_args!("{new}"), false)?;
                    self.printed = text;
                }
            }
        }
        Ok(())
    }
}
