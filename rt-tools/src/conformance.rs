//! `llada-rt conformance`: replays a golden file made by the official LLaDA `generate()` (or
//! by Dream's published `diffusion_generate`: cases with an `alg`, no blocks) and checks that
//! this runtime produces the same tokens, the same reveals at every step (ties among equal
//! confidences included: the sampler selects as PyTorch's `topk` does) and the same
//! first-pass logits within 1e-4 (Dream's shifted by one position, as its sampler reads them).

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use llada_rt::error::{Error, Result};
use llada_rt::sampler::{generate, Alg, Policy, Remasking, SamplerParams};
use llada_rt::session::Session;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
    #[serde(default)]
    first_step_logits: Vec<LogitCase>,
}

#[derive(Deserialize)]
struct Case {
    id: String,
    prompt_ids: Vec<u32>,
    gen_length: usize,
    /// LLaDA's; Dream's sampler has none.
    block_length: Option<usize>,
    steps: usize,
    temperature: f64,
    /// LLaDA's confidence rule.
    remasking: Option<String>,
    #[serde(default)]
    cfg_scale: f64,
    /// Dream's confidence rule and schedule end.
    alg: Option<String>,
    eps: Option<f64>,
    /// Fast-dLLM's blocked Dream sampler: its dual cache (the `dual` policy) or its prefix
    /// cache (`prefix`); absent for the published sampler (`exact`).
    dual_cache: Option<bool>,
    mask_id: u32,
    output_ids: Vec<u32>,
    step_reveals: Vec<Vec<[u32; 2]>>,
    first_tied_step: Option<usize>,
}

#[derive(Deserialize)]
struct LogitCase {
    input_ids: Vec<u32>,
    gen_length: usize,
    logits: Vec<Vec<f64>>,
}

/// Absolute tolerance on first-pass logits (the golden values are rounded to 1e-5).
pub const LOGIT_TOLERANCE: f64 = 1e-4;

/// Which cases of a golden file to replay: cases `offset`, `offset + every`, ... (every case
/// by default). Under an emulator a forward pass of even a tiny model costs a second, so the
/// ARM check in CI replays a spread sample and the full replay is split into shards.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Selection {
    pub every: usize,
    pub offset: usize,
}

impl Default for Selection {
    fn default() -> Self {
        Selection { every: 1, offset: 0 }
    }
}

impl Selection {
    /// `every` must be at least 1 and `offset` below it.
    pub fn new(every: usize, offset: usize) -> Result<Selection> {
        if every == 0 || offset >= every {
            return Err(Error::request(format!("--every {every} --offset {offset}: need every >= 1 and offset < every")));
        }
        Ok(Selection { every, offset })
    }

    pub fn includes(&self, case: usize) -> bool {
        case % self.every == self.offset
    }
}

#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    /// Cases in the file.
    pub cases_in_file: usize,
    /// Cases replayed or skipped (the selection).
    pub cases: usize,
    pub output_ids_matched: usize,
    /// Cases whose reveals match as a set per step for every step before the first tie.
    pub reveals_before_tie_matched: usize,
    /// Cases whose reveals match as a set per step for every step, ties included (a golden
    /// file lists a step's reveals by position, not in selection order).
    pub reveals_all_steps_matched: usize,
    /// Cases that need PyTorch's own random stream (temperature > 0, random remasking).
    pub skipped: usize,
    pub logit_cases: usize,
    pub logit_cases_within_tolerance: usize,
    pub max_logit_abs_error: f64,
    pub failures: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.cases > 0
    }
}

fn as_set(step: &[[u32; 2]]) -> BTreeSet<[u32; 2]> {
    step.iter().copied().collect()
}

pub fn run(session: &mut Session, golden_path: &Path, select: Selection, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    run_with(session, golden_path, select, LOGIT_TOLERANCE, progress)
}

/// [`run`] with first-pass logits checked to `logit_tolerance` (absolute) instead of
/// [`LOGIT_TOLERANCE`].
pub fn run_with(session: &mut Session, golden_path: &Path, select: Selection, logit_tolerance: f64, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    let text = llada_ir::files::read_text_bounded(golden_path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(golden_path, e))?;
    let golden: Golden = serde_json::from_str(&text)
        .map_err(|e| Error::Input { path: golden_path.to_path_buf(), msg: format!("not a golden file: {e}") })?;
    let mask = session.model.header.special.mask;
    let mut r = Report { cases_in_file: golden.cases.len(), ..Default::default() };
    for (i, c) in golden.cases.iter().enumerate() {
        if !select.includes(i) {
            continue;
        }
        r.cases += 1;
        if c.mask_id != mask {
            r.failures.push(format!("{}: golden mask id {} but the model's is {mask}", c.id, c.mask_id));
            continue;
        }
        let unknown = |what: &str, v: &str| Error::Input { path: golden_path.to_path_buf(), msg: format!("{}: unknown {what} '{v}'", c.id) };
        let d = SamplerParams::default();
        let remasking = c.remasking.as_deref().map(|v| Remasking::parse(v).ok_or_else(|| unknown("remasking", v))).transpose()?.unwrap_or(d.remasking);
        let alg = c.alg.as_deref().map(|v| Alg::parse(v).ok_or_else(|| unknown("alg", v))).transpose()?;
        // Sampled cases follow PyTorch's random stream, which no other implementation has.
        if c.temperature > 0.0 || remasking == Remasking::Random || alg == Some(Alg::Origin) {
            r.skipped += 1;
            continue;
        }
        let params = SamplerParams {
            gen_length: c.gen_length,
            block_length: c.block_length.unwrap_or(c.gen_length),
            steps: c.steps,
            temperature: c.temperature,
            cfg_scale: c.cfg_scale,
            remasking,
            alg: alg.unwrap_or(d.alg),
            eps: c.eps.unwrap_or(d.eps),
            policy: match c.dual_cache {
                None => d.policy,
                Some(true) => Policy::Dual,
                Some(false) => Policy::Prefix,
            },
            ..d
        };
        let g = generate(session, &c.prompt_ids, &params, &mut |_| {})?;
        if g.output_ids == c.output_ids {
            r.output_ids_matched += 1;
        } else {
            r.failures.push(format!("{}: output_ids {:?}, golden {:?}", c.id, g.output_ids, c.output_ids));
        }
        let before_tie = c.first_tied_step.unwrap_or(c.step_reveals.len()).min(c.step_reveals.len());
        let step_matches = |s: usize| g.reveals.get(s).is_some_and(|ours| as_set(ours) == as_set(&c.step_reveals[s]));
        match (0..before_tie).find(|&s| !step_matches(s)) {
            None => r.reveals_before_tie_matched += 1,
            Some(s) => r.failures.push(format!(
                "{}: step {s} (before the first tie at {before_tie}) committed {:?}, golden {:?}",
                c.id,
                g.reveals.get(s),
                c.step_reveals[s]
            )),
        }
        let steps_agree = g.reveals.len() == c.step_reveals.len();
        match (0..c.step_reveals.len()).find(|&s| !step_matches(s)) {
            None if steps_agree => r.reveals_all_steps_matched += 1,
            None => r.failures.push(format!("{}: {} steps, golden {}", c.id, g.reveals.len(), c.step_reveals.len())),
            // Reported once: a step before the first tie already failed above.
            Some(s) if s < before_tie => {}
            Some(s) => r.failures.push(format!(
                "{}: step {s} (at or after the first tie at {before_tie}) committed {:?}, golden {:?}",
                c.id,
                g.reveals.get(s),
                c.step_reveals[s]
            )),
        }
        progress(&c.id);
    }
    for (i, lc) in golden.first_step_logits.iter().enumerate() {
        r.logit_cases += 1;
        let prompt_len = lc.input_ids.len() - lc.gen_length;
        let rows: Vec<u32> = (prompt_len..lc.input_ids.len()).map(|p| p as u32).collect();
        let logits = session.forward_full(&lc.input_ids, &rows)?;
        let vocab = logits.len() / rows.len();
        let mut err: f64 = 0.0;
        for (ri, want) in lc.logits.iter().enumerate() {
            for (v, &w) in want.iter().enumerate() {
                err = err.max((logits[ri * vocab + v] as f64 - w).abs());
            }
        }
        r.max_logit_abs_error = r.max_logit_abs_error.max(err);
        if err <= logit_tolerance {
            r.logit_cases_within_tolerance += 1;
        } else {
            r.failures.push(format!("first_step_logits[{i}]: max abs error {err:.2e} > {logit_tolerance:.0e}"));
        }
    }
    Ok(r)
}
