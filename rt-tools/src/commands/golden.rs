//! `llada-rt golden`: this project's own golden outputs, replayed or written again.

use std::path::PathBuf;

use clap::Args;
use llada_cli::outln;
use llada_rt::text::Text;
use llada_rt::{Error, Model};
use llada_rt_tools::golden;

use crate::{BackendArg, Done, SelectArgs};

#[derive(Args)]
pub(crate) struct Golden {
    /// A golden file (its prompts, settings, outputs and first-pass logits).
    golden: PathBuf,
    /// The artifact to replay it with.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    select: SelectArgs,
    /// Instead of comparing, write the selected cases and every logit case as this
    /// artifact produces them, to this file (to pin another weight format, then replay
    /// it on another machine).
    #[arg(long, conflicts_with = "tokens_only")]
    write: Option<PathBuf>,
    #[command(flatten)]
    backend: BackendArg,
    /// Require the output tokens (and logits) only; count reveal orders without requiring
    /// them (for quantised artifacts on another instruction set: see `llada_rt_tools::golden::Pin`).
    #[arg(long)]
    tokens_only: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

impl Golden {
    pub(crate) fn run(self) -> Done {
        let Golden { golden, model, select, write, tokens_only, backend, json } = self;
        let select = select.selection()?;
        if let Some(out) = &write {
            llada_ir::files::check_destination(out, &[&golden, &model]).map_err(|e| Error::io(out, e))?;
        }
        let file = golden::read(&golden)?;
        let m = Model::open(&model, true)?;
        let text = Text::new(&m.header.tokenizer, &m.header.special)?;
        let mut session = backend.open(&m)?;
        if let Some(out) = write {
            let produced = golden::reproduce(&mut session, &text, &file, &golden, select)?;
            golden::write(&produced, &out, &[&golden, &model])?;
            outln!("wrote {} ({} cases, {} logit cases)", out.display(), produced.cases.len(), produced.first_pass_logits.len())?;
            return Ok(());
        }
        let pin = if tokens_only { golden::Pin::Tokens } else { golden::Pin::Reveals };
        let report = golden::check(&mut session, &text, &file, &golden, select, pin)?;
        if json {
            outln!("{}", serde_json::to_string_pretty(&report).expect("the report serializes"))?;
        } else {
            for f in &report.failures {
                outln!("MISMATCH {f}")?;
            }
            outln!("{}: {}", golden.display(), if report.passed() { "PASS" } else { "FAIL" })?;
            outln!("  cases:             {} of {} (every {} from {})", report.cases, report.cases_in_file, select.every, select.offset)?;
            outln!("  output_ids:        {}/{} matched", report.output_ids_matched, report.cases)?;
            outln!("  reveals:           {}/{} matched at every step{}", report.reveals_matched, report.cases, if tokens_only { " (not required: --tokens-only)" } else { "" })?;
            outln!(
                "  first-pass logits: {}/{} within {:.0e} (max abs change {:.2e})",
                report.logit_cases_within_tolerance, report.logit_cases, report.logit_tolerance, report.max_logit_abs_error
            )?;
        }
        if !report.passed() {
            return Err(Error::request(format!("{}: golden outputs differ", golden.display())).into());
        }
        Ok(())
    }
}
