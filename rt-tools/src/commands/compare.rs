//! `llada-rt compare`: an artifact against a reference compiled from the same checkpoint.

use std::path::PathBuf;

use clap::Args;
use llada_cli::outln;
use llada_rt::Model;

use crate::{parse_ids, Done, SamplerArgs, SessionArgs};

#[derive(Args)]
pub(crate) struct Compare {
    /// The reference artifact.
    reference: PathBuf,
    /// The artifact to measure against it.
    other: PathBuf,
    /// Prompt as comma-separated token ids.
    #[arg(long)]
    prompt_ids: String,
    #[command(flatten)]
    sampler: SamplerArgs,
    #[command(flatten)]
    session: SessionArgs,
    /// The reference's backend [default: --backend's]: e.g. an NPU artifact on qnn
    /// against the f32 host artifact on host.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(llada_rt::executor::names()))]
    reference_backend: Option<String>,
    #[arg(long)]
    json: bool,
}

impl Compare {
    pub(crate) fn run(self, typed: &dyn Fn(&str) -> bool) -> Done {
        let Compare { reference, other, prompt_ids, sampler, session: session_args, reference_backend, json } = self;
        let (a, b) = (Model::open(&reference, true)?, Model::open(&other, true)?);
        let params = sampler.checked_params(&a, typed)?;
        let mut reference_args = session_args.clone();
        if let Some(backend) = reference_backend {
            reference_args.backend.backend = backend;
        }
        let c = llada_rt_tools::compare::compare(&mut reference_args.open(&a)?, &mut session_args.open(&b)?, &parse_ids(&prompt_ids)?, &params)?;
        if json {
            outln!("{}", serde_json::to_string_pretty(&c).expect("serializes"))?;
        } else {
            outln!("{} against {}:", other.display(), reference.display())?;
            outln!("  first pass: logit error {:.3e} (L2, relative), largest {:.3e} (of the largest logit); top-1 agreement {:.1}%",
                c.logit_relative_error, c.logit_max_error, 100.0 * c.top1_agreement)?;
            outln!("  generation: {:.1}% of tokens the same; {:.2} s against {:.2} s", 100.0 * c.token_agreement, c.other_seconds, c.reference_seconds)?;
        }
        Ok(())
    }
}
