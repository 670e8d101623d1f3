//! `llada-rt golden`: this project's own regression outputs (`tests/golden/embedded.json`:
//! what the embedded model generates for a matrix of sampler settings), produced and replayed
//! by the same code on every machine, so a build for another CPU (an ARM phone, an emulator)
//! is checked against what the x86 build pinned. Unlike `conformance` (the official sampler's
//! outputs), sampled cases are replayed too: their noise is this runtime's own seeded stream.
//!
//! A case pins its output tokens and every step's reveals exactly; first-pass logits are
//! pinned within the file's tolerance: [`LOGIT_TOLERANCE`] for float weights, and
//! [`INT8_LOGIT_TOLERANCE`] for files written from q8 or q4 artifacts, whose activations are
//! quantised to int8 per row: a rounding difference upstream (another instruction set sums
//! in another order) can move an activation across a quantisation step, which moves logits
//! without changing what is generated. On the embedded model at q8 x86's own AVX2 and
//! AVX-512 paths differ by up to 1.38e-2 in one logit (the AArch64 build sides with AVX2, the
//! portable one with AVX-512), so the bound is a few times that.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::conformance::Selection;
use llada_rt::error::{Error, Result};
use llada_rt::generate;
use llada_rt::sampler::{Policy, Remasking, SamplerParams};
use llada_rt::session::Session;
use llada_rt::text::Text;

/// Absolute tolerance on first-pass logits (stored rounded to 1e-5).
pub const LOGIT_TOLERANCE: f64 = 1e-4;

/// The tolerance for artifacts with int8 activations (see the module documentation).
pub const INT8_LOGIT_TOLERANCE: f64 = 5e-2;

fn default_tolerance() -> f64 {
    LOGIT_TOLERANCE
}

#[derive(Debug, Serialize, Deserialize)]
pub struct GoldenFile {
    /// Where the model came from (informative).
    pub model: String,
    /// Absolute tolerance on the first-pass logits.
    #[serde(default = "default_tolerance")]
    pub logit_tolerance: f64,
    pub cases: Vec<Case>,
    pub first_pass_logits: Vec<Logits>,
}

/// The tolerance a golden file written with this session's artifact gets.
fn tolerance_for(session: &Session) -> f64 {
    let int8 = session.model.header.tensors.iter().any(|t| matches!(t.dtype, llada_ir::DType::PanelQ8 | llada_ir::DType::PanelQ4 { .. }));
    if int8 { INT8_LOGIT_TOLERANCE } else { LOGIT_TOLERANCE }
}

/// One generation: a chat prompt under one setting.
#[derive(Debug, Serialize, Deserialize)]
pub struct Case {
    pub prompt: String,
    pub setting: String,
    pub params: Params,
    pub answer: String,
    pub output_ids: Vec<u32>,
    pub reveals: Vec<Vec<[u32; 2]>>,
}

/// The official sampler's settings a case ran with (golden files pin the exact policy).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Params {
    pub gen_length: usize,
    pub block_length: usize,
    pub steps: usize,
    pub temperature: f64,
    pub cfg_scale: f64,
    pub remasking: String,
    pub seed: u64,
    pub logits_eos_inf: bool,
    pub confidence_eos_eot_inf: bool,
}

impl Params {
    pub fn of(p: &SamplerParams) -> Result<Params> {
        if p.policy != Policy::Exact {
            return Err(Error::request(format!("golden cases pin the exact sampler, not --policy {}", p.policy.name())));
        }
        Ok(Params {
            gen_length: p.gen_length,
            block_length: p.block_length,
            steps: p.steps,
            temperature: p.temperature,
            cfg_scale: p.cfg_scale,
            remasking: p.remasking.name().into(),
            seed: p.seed,
            logits_eos_inf: p.logits_eos_inf,
            confidence_eos_eot_inf: p.confidence_eos_eot_inf,
        })
    }

    fn sampler(&self, path: &Path, case: &str) -> Result<SamplerParams> {
        let remasking = Remasking::parse(&self.remasking)
            .ok_or_else(|| Error::Input { path: path.to_path_buf(), msg: format!("{case}: unknown remasking '{}'", self.remasking) })?;
        Ok(SamplerParams {
            gen_length: self.gen_length,
            block_length: self.block_length,
            steps: self.steps,
            temperature: self.temperature,
            cfg_scale: self.cfg_scale,
            remasking,
            seed: self.seed,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
            ..Default::default()
        })
    }
}

/// First-pass logits of a prompt followed by `gen_length` masks, at generation positions.
#[derive(Debug, Serialize, Deserialize)]
pub struct Logits {
    pub prompt: String,
    pub gen_length: usize,
    pub positions: Vec<u32>,
    pub logits: Vec<Vec<f64>>,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub cases_in_file: usize,
    pub cases: usize,
    pub output_ids_matched: usize,
    pub reveals_matched: usize,
    pub logit_cases: usize,
    pub logit_tolerance: f64,
    pub logit_cases_within_tolerance: usize,
    pub max_logit_abs_error: f64,
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.cases > 0
    }
}

/// Golden files hold LLaDA's sampler settings (remasking, guidance, blocks): refused, naming
/// the file, on a model whose sampler takes others.
fn check_family(session: &Session, path: &Path) -> Result<()> {
    match session.model.family() {
        llada_ir::Family::Llada | llada_ir::Family::LladaMoe => Ok(()),
        other => Err(Error::Input {
            path: path.to_path_buf(),
            msg: format!("a golden file holds LLaDA's sampler settings, which this {} model's sampler does not take; its conformance kit is checked with `llada-rt conformance`", other.name()),
        }),
    }
}

/// What the session generates for each case of `cases` (prompt, setting name, settings).
fn run_case(session: &mut Session, text: &Text, prompt: &str, setting: &str, params: Params, path: &Path) -> Result<Case> {
    let ids = text.encode_chat(prompt)?;
    // The case's settings, not the command's flags: a refusal names the case.
    let g = generate(session, &ids, &params.sampler(path, setting)?, &mut |_| {}).map_err(|e| match e {
        Error::Setting { .. } | Error::Request(_) => Error::Input { path: path.to_path_buf(), msg: format!("case '{setting}' ({prompt}): {e}") },
        other => other,
    })?;
    Ok(Case { prompt: prompt.into(), setting: setting.into(), params, answer: text.answer(&g.output_ids), output_ids: g.output_ids, reveals: g.reveals })
}

fn first_pass_logits(session: &mut Session, text: &Text, prompt: &str, gen_length: usize, positions: &[u32]) -> Result<Logits> {
    let ids = text.encode_chat(prompt)?;
    let mask = session.model.header.special.mask;
    let seq: Vec<u32> = ids.iter().copied().chain(std::iter::repeat_n(mask, gen_length)).collect();
    let rows: Vec<u32> = positions.iter().map(|&p| ids.len() as u32 + p).collect();
    let logits = session.forward_full(&seq, &rows)?;
    let vocab = logits.len() / rows.len();
    let logits = logits.chunks(vocab).map(|r| r.iter().map(|&v| (v as f64 * 1e5).round() / 1e5).collect()).collect();
    Ok(Logits { prompt: prompt.into(), gen_length, positions: positions.to_vec(), logits })
}

/// A new golden file: for each prompt, its first-pass logits at `logit_positions` of a
/// `logit_gen_length` generation, and its generation under each setting.
pub fn produce(session: &mut Session, text: &Text, model: &str, prompts: &[&str], settings: &[(&str, SamplerParams)], logit_gen_length: usize, logit_positions: &[u32]) -> Result<GoldenFile> {
    let mut file = GoldenFile { model: model.into(), logit_tolerance: tolerance_for(session), cases: Vec::new(), first_pass_logits: Vec::new() };
    for &prompt in prompts {
        file.first_pass_logits.push(first_pass_logits(session, text, prompt, logit_gen_length, logit_positions)?);
        for (name, p) in settings {
            file.cases.push(run_case(session, text, prompt, name, Params::of(p)?, Path::new(model))?);
        }
    }
    Ok(file)
}

/// The selected cases of `golden` (and all its logits) produced again with this session:
/// how another artifact (another weight format) or another machine pins the same settings.
pub fn reproduce(session: &mut Session, text: &Text, golden: &GoldenFile, path: &Path, select: Selection) -> Result<GoldenFile> {
    check_family(session, path)?;
    let mut file = GoldenFile { model: golden.model.clone(), logit_tolerance: tolerance_for(session), cases: Vec::new(), first_pass_logits: Vec::new() };
    for l in &golden.first_pass_logits {
        file.first_pass_logits.push(first_pass_logits(session, text, &l.prompt, l.gen_length, &l.positions)?);
    }
    for (i, c) in golden.cases.iter().enumerate() {
        if select.includes(i) {
            file.cases.push(run_case(session, text, &c.prompt, &c.setting, c.params.clone(), path)?);
        }
    }
    Ok(file)
}

/// What a replay must reproduce besides the output tokens and the first-pass logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Pin {
    /// Every step's reveals, in order: the default, and what one machine reproduces.
    Reveals,
    /// The output tokens only; reveal orders are counted but not required. For another
    /// instruction set on a quantised artifact: where two positions' confidences differ
    /// in the last bits, the order of their commits follows the summation order (x86's
    /// portable and AVX2 paths differ there too) while the tokens do not.
    Tokens,
}

/// Replays the selected cases of `golden` and compares.
pub fn check(session: &mut Session, text: &Text, golden: &GoldenFile, path: &Path, select: Selection, pin: Pin) -> Result<Report> {
    check_family(session, path)?;
    let mut r = Report { cases_in_file: golden.cases.len(), logit_tolerance: golden.logit_tolerance, ..Default::default() };
    for (i, want) in golden.cases.iter().enumerate() {
        if !select.includes(i) {
            continue;
        }
        r.cases += 1;
        let got = run_case(session, text, &want.prompt, &want.setting, want.params.clone(), path)?;
        let id = format!("{} / {}", want.setting, want.prompt);
        if want.output_ids != got.output_ids {
            r.failures.push(format!("{id}: output changed: {} -> {}", want.answer, got.answer));
            continue;
        }
        r.output_ids_matched += 1;
        if want.reveals == got.reveals {
            r.reveals_matched += 1;
        } else if pin == Pin::Reveals {
            r.failures.push(format!("{id}: same output, different reveal order"));
        }
    }
    for want in &golden.first_pass_logits {
        r.logit_cases += 1;
        let got = first_pass_logits(session, text, &want.prompt, want.gen_length, &want.positions)?;
        let err = want.logits.iter().flatten().zip(got.logits.iter().flatten()).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        let same_shape = want.logits.len() == got.logits.len() && want.logits.iter().zip(&got.logits).all(|(a, b)| a.len() == b.len());
        r.max_logit_abs_error = r.max_logit_abs_error.max(err);
        if same_shape && err <= golden.logit_tolerance {
            r.logit_cases_within_tolerance += 1;
        } else {
            r.failures.push(format!("first-pass logits of {}: max abs change {err:.2e} (shape {})", want.prompt, if same_shape { "same" } else { "differs" }));
        }
    }
    Ok(r)
}

/// Reads a golden file.
pub fn read(path: &Path) -> Result<GoldenFile> {
    let text = llada_ir::files::read_text_bounded(path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::Input { path: path.to_path_buf(), msg: format!("not a golden file: {e}") })
}

/// Writes a golden file (keys sorted, so diffs stay small) whole or not at all, never over a
/// file of `reads` (see `llada_ir::files`).
pub fn write(file: &GoldenFile, path: &Path, reads: &[&Path]) -> Result<()> {
    let value = serde_json::to_value(file).expect("a golden file serializes");
    let body = serde_json::to_string_pretty(&value).expect("a JSON value serializes") + "\n";
    llada_ir::files::write_atomic(path, reads, body.as_bytes()).map_err(|e| Error::io(path, e))
}
