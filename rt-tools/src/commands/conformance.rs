//! `llada-rt conformance`: the runtime against the official sampler's golden file.

use std::path::PathBuf;

use clap::Args;
use llada_cli::outln;
use llada_rt::{Error, Model, Session, SessionParams};
use llada_rt_tools::conformance;

use crate::{tolerance_flag, BackendArg, Done, SelectArgs};

#[derive(Args)]
pub(crate) struct Conformance {
    /// golden.json (schema: the conformance kit's README).
    golden: PathBuf,
    /// The artifact compiled from the golden file's checkpoint.
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    select: SelectArgs,
    #[command(flatten)]
    backend: BackendArg,
    /// Largest absolute error allowed on the first-pass logits.
    #[arg(long, default_value_t = conformance::LOGIT_TOLERANCE, value_parser = tolerance_flag, allow_hyphen_values = true)]
    logit_tolerance: f64,
    /// Pass when every case that left the golden trajectory did so at a decision closer,
    /// by the host's f32 margins there, than twice the first-pass logit error (a backend
    /// computing in fp16, such as qnn); each is listed as DIVERGED either way.
    #[arg(long)]
    accept_explained: bool,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

impl Conformance {
    pub(crate) fn run(self) -> Done {
        let Conformance { golden, model, select, backend, logit_tolerance, accept_explained, json } = self;
        let select = select.selection()?;
        let m = Model::open(&model, true)?;
        let mut session = backend.open(&m)?;
        // Off the host, each mismatch is explained by the host's margins where it diverged.
        let mut host = if backend.kind() == llada_rt::executor::default_backend() { None } else { Some(Session::open(&m, &SessionParams::default())?) };
        let report = conformance::run_explained(&mut session, host.as_mut(), &golden, select, logit_tolerance, &mut |_| {})?;
        let passed = report.passed() || (accept_explained && report.passed_but_for_explained());
        if json {
            outln!("{}", serde_json::to_string_pretty(&report).expect("the report serializes"))?;
        } else {
            for f in &report.failures {
                outln!("MISMATCH {f}")?;
            }
            let bound = 2.0 * report.max_logit_abs_error;
            for d in &report.divergences {
                let margin = d.margin.map_or("not computed (guidance)".to_string(), |m| format!("{m:.3e}"));
                let why = if d.explained { format!("below 2 x the first-pass logit error ({bound:.2e}): explained by precision") } else { format!("not below 2 x the first-pass logit error ({bound:.2e}): NOT explained") };
                match report.denoising_steps_matched {
                    // DiffusionGemma's kit records each case's closest decision itself.
                    Some(_) => outln!("DIVERGED {}: the kit's closest decision {margin} (in logit units), {why}", d.case)?,
                    None => outln!("DIVERGED {} at step {}: the host's margin there {margin}, {why}", d.case, d.step)?,
                }
            }
            let ran = report.cases - report.skipped;
            let verdict = match (report.passed(), passed) {
                (true, _) => "PASS",
                (false, true) => "PASS (every mismatch explained by precision)",
                _ => "FAIL",
            };
            outln!("{}: {verdict}", golden.display())?;
            if report.cases < report.cases_in_file {
                outln!("  cases:                     {} of {} (every {} from {})", report.cases, report.cases_in_file, select.every, select.offset)?;
            }
            outln!("  output_ids:                {}/{} matched", report.output_ids_matched, ran)?;
            match report.denoising_steps_matched {
                Some(n) => outln!("  denoising steps per canvas: {n}/{ran} matched")?,
                None => {
                    outln!("  reveals before first tie:  {}/{} matched", report.reveals_before_tie_matched, ran)?;
                    outln!("  reveals at every step:     {}/{} matched (ties included)", report.reveals_all_steps_matched, ran)?;
                }
            }
            if report.forward_calls_checked > 0 {
                outln!("  model calls:               {}/{} threshold cases as many as the reference", report.forward_calls_matched, report.forward_calls_checked)?;
            }
            if report.edits_checked > 0 {
                outln!("  edits at every model call: {}/{} editing cases matched", report.edits_matched, report.edits_checked)?;
            }
            outln!(
                "  first_step_logits:         {}/{} within {:.0e} (max abs error {:.2e})",
                report.logit_cases_within_tolerance, report.logit_cases, logit_tolerance, report.max_logit_abs_error
            )?;
            if report.skipped > 0 {
                outln!("  skipped: {} case(s) that need PyTorch's own random stream", report.skipped)?;
            }
        }
        if !passed {
            return Err(Error::request(format!("{}: conformance failed", golden.display())).into());
        }
        Ok(())
    }
}
