//! `llada-rt eval`: accuracy and cost of the sampler on a file of tasks.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use llada_cli::outln;
use llada_rt::text::Text;
use llada_rt::Model;

use crate::{print_experts, print_mbsd, Done, SamplerArgs, SessionArgs};

#[derive(Args)]
pub(crate) struct Eval {
    /// The artifact.
    file: PathBuf,
    /// Tasks, one JSON object per line: {"prompt" | "prompt_ids", "expected", "chat"?}.
    #[arg(long)]
    tasks: PathBuf,
    #[command(flatten)]
    sampler: SamplerArgs,
    /// A previous `eval --json` output to compare with token for token.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// Print one JSON object (summary and per-task outputs): usable as a --reference.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    session: SessionArgs,
}

impl Eval {
    pub(crate) fn run(self, typed: &dyn Fn(&str) -> bool) -> Done {
        let Eval { file, tasks, sampler, reference, json, session: session_args } = self;
        let model = Model::open(&file, true)?;
        let text = Text::new(&model.header.tokenizer, &model.header.special)?;
        let tasks = llada_rt_tools::eval::load_tasks(&tasks, &text, &model)?;
        let reference = reference.map(|p| llada_rt_tools::eval::load_reference(&p)).transpose()?;
        let params = sampler.checked_params(&model, typed)?;
        let mut session = session_args.open(&model)?;
        let show = !json && std::io::stderr().is_terminal();
        let report = llada_rt_tools::eval::run(&mut session, &text, &tasks, &params, reference.as_ref(), &mut |i, r| {
            if show {
                eprint!("\r{}/{} {}", i + 1, tasks.len(), if r.correct { "ok  " } else { "FAIL" });
            }
        })?;
        if show {
            eprintln!();
        }
        if json {
            outln!("{}", serde_json::to_string(&report).expect("the report serializes"))?;
        } else {
            outln!("tasks:              {}", report.tasks)?;
            outln!("accuracy:           {:.4} ({}/{})", report.accuracy, report.correct, report.tasks)?;
            if let Some(m) = report.exact_match {
                outln!("exact match vs ref: {m:.4}")?;
            }
            outln!("forward passes:     {} ({:.1} per task)", report.forward_passes, report.forward_passes as f64 / report.tasks as f64)?;
            outln!("rows computed:      {}", report.rows_computed)?;
            if let Some(m) = &report.mbsd {
                print_mbsd(m)?;
            }
            outln!("generated tokens/s: {:.1} ({} tokens in {:.2} s)", report.tokens_per_second, report.generated_tokens, report.seconds)?;
            print_experts(&session)?;
        }
        Ok(())
    }
}
