//! `llada-rt conformance` on DiffusionGemma's kit (`tests/data/diffusiongemma-conformance`,
//! made by `tools/diffusion_gemma/make_golden.py` with transformers' published `generate`):
//! each case replayed with PyTorch's random stream (`--rng torch`) must give the same output
//! ids and the same decoder passes per canvas; the first decoder pass's logits must be within
//! the tolerance. A case that differs is a divergence, explained where the kit's recorded
//! margins for it (its closest decisions, [`Margins::in_logits`]) are below what the
//! backend's logit error can move: twice the first pass's error, as the other kits' rule.

use std::path::Path;

use serde::Deserialize;

use llada_rt::error::{Error, Result};
use llada_rt::generate;
use llada_rt::sampler::{EosIds, Rng, SamplerParams};
use llada_rt::session::Session;

use super::{Divergence, Report, Selection};

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
    first_decoder_pass_logits: Option<LogitCase>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    prompt_ids: Vec<u32>,
    seed: u64,
    settings: Settings,
    output_ids: Vec<u32>,
    denoising_steps_per_canvas: Vec<u32>,
    /// The case's closest decisions (the kit's README).
    #[serde(default)]
    margins: Option<Margins>,
}

#[derive(Deserialize)]
struct Settings {
    max_new_tokens: usize,
    max_denoising_steps: usize,
    t_min: Option<f64>,
    t_max: Option<f64>,
    entropy_bound: f64,
    stability_threshold: Option<usize>,
    confidence_threshold: Option<f64>,
    eos_token_id: Option<EosList>,
    pad_token_id: Option<u32>,
}

/// `eos_token_id` as the published config takes it: one id or a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum EosList {
    One(u32),
    Many(Vec<u32>),
}

/// A case's closest decisions over its steps, each on the temperature-scaled logits (`None`
/// where the kit has no such decision).
#[derive(Deserialize, Clone, Copy, Default)]
struct Margins {
    /// `(r1 - r2) / r1` of the two largest sampling scores `p / q` at an accepted position.
    multinomial_rel_gap: Option<f64>,
    /// Distance of an entropy sum to the entropy bound.
    entropy_bound_gap: Option<f64>,
    /// Top-1 minus top-2 logit where the argmax canvas was read.
    argmax_logit_gap: Option<f64>,
    /// Distance of the mean entropy to the confidence threshold; none without a stopping rule.
    confidence_gap: Option<f64>,
}

impl Margins {
    /// The closest decision in units of the raw logits (those whose error the first pass
    /// measures), for a case whose temperature is at most `t_max`: a gap g of the scaled
    /// logits is g * T of the raw ones, so g * t_max bounds the closest raw gap from above and
    /// a divergence is explained only where even that bound is below the error. A sampling
    /// score's relative gap is the log-ratio -ln(1 - g), in which the row's normaliser cancels
    /// (only the two logits move it). An entropy's gradient is bounded by the spread of its
    /// logits, about 1 on a softmax's scale, so entropy gaps count as logit gaps, as the other
    /// kits count log-confidences.
    fn in_logits(&self, t_max: f64) -> Option<f64> {
        let score = self.multinomial_rel_gap.map(|g| -(-g).ln_1p());
        [score, self.entropy_bound_gap, self.argmax_logit_gap, self.confidence_gap].into_iter().flatten().reduce(f64::min).map(|m| m * t_max)
    }
}

#[derive(Deserialize)]
struct LogitCase {
    prompt_ids: Vec<u32>,
    canvas_ids: Vec<u32>,
    logits: Vec<Vec<f64>>,
}

/// Replays the kit at `golden_path` on `session` (see the module documentation).
pub fn run(session: &mut Session, golden_path: &Path, select: Selection, logit_tolerance: f64, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let bad = |msg: String| Error::Input { path: golden_path.to_path_buf(), msg };
    let text = llada_ir::files::read_text_bounded(golden_path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(golden_path, e))?;
    let golden: Golden = serde_json::from_str(&text).map_err(|e| bad(format!("not a DiffusionGemma golden file: {e}")))?;
    let section = session.model.diffusion_gemma().ok_or_else(|| bad("a DiffusionGemma kit needs a DiffusionGemma model".into()))?;
    let (pad, canvas) = (section.generation.pad_id, section.canvas_length as usize);
    let mut r = Report { cases_in_file: golden.cases.len(), denoising_steps_matched: Some(0), ..Default::default() };
    if let Some(lc) = &golden.first_decoder_pass_logits {
        r.logit_cases = 1;
        let width = session.model.header.model.embedding_size as usize;
        session.encode(&lc.prompt_ids, 0..lc.prompt_ids.len())?;
        let logits = session.denoise(lc.prompt_ids.len(), &lc.canvas_ids, None)?;
        let err = lc.logits.iter().enumerate().flat_map(|(row, want)| want.iter().enumerate().map(move |(j, &w)| (row * width + j, w))).fold(0f64, |m, (i, w)| m.max((logits[i] as f64 - w).abs()));
        r.max_logit_abs_error = err;
        match err <= logit_tolerance {
            true => r.logit_cases_within_tolerance = 1,
            false => r.failures.push(format!("first_decoder_pass_logits: max abs error {err:.2e} > {logit_tolerance:.0e}")),
        }
    }
    for (i, c) in golden.cases.iter().enumerate() {
        if !select.includes(i) {
            continue;
        }
        r.cases += 1;
        if c.settings.pad_token_id != pad {
            r.failures.push(format!("{}: pad id {:?}, but the model's generation config has {pad:?}", c.name, c.settings.pad_token_id));
            continue;
        }
        let g = generate(session, &c.prompt_ids, &params(c, canvas).map_err(bad)?, &mut |_| {})?;
        let ids_ok = g.output_ids == c.output_ids;
        let steps_ok = g.denoising_steps_per_canvas.as_deref() == Some(&c.denoising_steps_per_canvas[..]);
        r.output_ids_matched += usize::from(ids_ok);
        r.denoising_steps_matched = r.denoising_steps_matched.map(|n| n + usize::from(steps_ok));
        if !(ids_ok && steps_ok) {
            r.failures.push(format!("{}: output {} and denoising steps per canvas {:?} (want {:?})", c.name, if ids_ok { "equal" } else { "differs" }, g.denoising_steps_per_canvas.unwrap_or_default(), c.denoising_steps_per_canvas));
            // The case's closest decision, in raw logit units (no schedule: T = 1).
            let t_max = match (c.settings.t_min, c.settings.t_max) {
                (Some(_), Some(t)) => t,
                _ => 1.0,
            };
            let margin = c.margins.and_then(|m| m.in_logits(t_max));
            r.divergences.push(Divergence { case: c.name.clone(), step: 0, margin, explained: false });
        }
        progress(&c.name);
    }
    // An error of e on each logit moves a gap between two by up to 2e.
    let bound = 2.0 * r.max_logit_abs_error;
    for d in &mut r.divergences {
        d.explained = d.margin.is_some_and(|m| m < bound);
    }
    Ok(r)
}

/// The sampler settings of case `c`, as its `generate` call was given them (on canvases of
/// `canvas`), with PyTorch's random stream.
fn params(c: &Case, canvas: usize) -> std::result::Result<SamplerParams, String> {
    let s = &c.settings;
    let eos = match &s.eos_token_id {
        None => Vec::new(),
        Some(EosList::One(id)) => vec![*id],
        Some(EosList::Many(ids)) => ids.clone(),
    };
    Ok(SamplerParams {
        gen_length: s.max_new_tokens,
        block_length: canvas,
        steps: s.max_denoising_steps,
        seed: c.seed,
        t_min: s.t_min,
        t_max: s.t_max,
        entropy_bound: s.entropy_bound,
        stability_threshold: s.stability_threshold,
        confidence_threshold: s.confidence_threshold,
        eos_ids: EosIds::new(&eos).map_err(|e| format!("{}: eos_token_id: {e}", c.name))?,
        rng: Rng::Torch,
        ..SamplerParams::default()
    })
}

#[cfg(test)]
mod tests {
    use super::Margins;

    /// The closest decision is the smallest gap, the score's as a log-ratio, scaled to raw
    /// logits by the temperature.
    #[test]
    fn margins_in_logit_units() {
        let m = Margins { multinomial_rel_gap: Some(1.0 - (-0.01f64).exp()), entropy_bound_gap: Some(0.02), argmax_logit_gap: Some(0.5), confidence_gap: None };
        assert!((m.in_logits(1.0).unwrap() - 0.01).abs() < 1e-12);
        assert!((m.in_logits(0.5).unwrap() - 0.005).abs() < 1e-12);
        let entropy = Margins { entropy_bound_gap: Some(1e-4), confidence_gap: Some(3e-4), ..Margins::default() };
        assert!((entropy.in_logits(0.8).unwrap() - 0.8e-4).abs() < 1e-15);
        assert_eq!(Margins::default().in_logits(1.0), None);
    }
}
