//! `llada-rt conformance`: replays a golden file made by the official LLaDA `generate()` (or
//! by Dream's published `diffusion_generate`: cases with an `alg`, no blocks) and checks that
//! this runtime produces the same tokens, the same reveals at every step (ties among equal
//! confidences included: the sampler selects as PyTorch's `topk` does) and the same
//! first-pass logits within 1e-4 (Dream's shifted by one position, as its sampler reads them).

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use llada_rt::error::{Error, Result};
use llada_rt::generate;
use llada_rt::sampler::{Alg, Policy, Remasking, SamplerParams};
use llada_rt::session::Session;

mod diffusion_gemma;

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
    /// Dream's filters, and Fast-dLLM's threshold (with alg `confidence_threshold`).
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    threshold: Option<f32>,
    /// The reference's forward calls: checked where the count is the sampler's own
    /// (threshold decoding), not a schedule's whose passes committing nothing are skipped.
    #[serde(default)]
    forward_calls: Option<usize>,
    /// LLaDA 2.x's `eos_early_stop`.
    #[serde(default)]
    eos_early_stop: bool,
    /// LLaDA 2.1's token editing: its `editing_threshold` and `max_post_steps`, and the
    /// tokens each model call edited (`[position from the prompt's end, new token]`).
    #[serde(default)]
    editing_threshold: Option<f32>,
    #[serde(default)]
    max_post_steps: Option<usize>,
    #[serde(default)]
    step_edits: Option<Vec<Vec<[u32; 2]>>>,
    mask_id: u32,
    output_ids: Vec<u32>,
    step_reveals: Vec<Vec<[u32; 2]>>,
    first_tied_step: Option<usize>,
}

#[derive(Deserialize)]
struct LogitCase {
    input_ids: Vec<u32>,
    gen_length: usize,
    /// LLaDA 2.x's: the block-causal mask's block length (the last `gen_length` rows are a
    /// block).
    #[serde(default)]
    block_length: Option<usize>,
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
    /// Threshold cases, and those that made as many model calls as the reference (forward passes;
    /// LLaDA 2.x's steps, its passes also storing finished blocks).
    pub forward_calls_checked: usize,
    pub forward_calls_matched: usize,
    /// LLaDA 2.1's editing cases, and those whose edits at every model call match.
    pub edits_checked: usize,
    pub edits_matched: usize,
    /// DiffusionGemma's kit: the cases whose decoder passes per canvas match (`None` for the
    /// others' kits).
    pub denoising_steps_matched: Option<usize>,
    pub logit_cases: usize,
    pub logit_cases_within_tolerance: usize,
    pub max_logit_abs_error: f64,
    pub failures: Vec<String>,
    /// Where each mismatching case left the golden trajectory, with the reference session's
    /// margins there (when a reference was given).
    pub divergences: Vec<Divergence>,
}

/// A case that left the golden trajectory at `step`, and how close the decision was there by
/// the reference session (the host's f32 activations over the same weights), in logit units:
/// the top-2 logit gap at a position where the two committed different tokens, or the gap in
/// log-confidence between a position one committed and the other did not. A margin below
/// twice the measured first-pass logit error (an error of e moves a log-probability by up to
/// 2e) is explained by the backend's precision.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Divergence {
    pub case: String,
    pub step: usize,
    pub margin: Option<f64>,
    pub explained: bool,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.cases > 0
    }

    /// Cases that left the golden trajectory, each at a decision closer than the measured
    /// precision: every mismatch in this report is one of them, and the logits are within
    /// tolerance.
    pub fn passed_but_for_explained(&self) -> bool {
        let logits_ok = self.logit_cases_within_tolerance == self.logit_cases;
        let trajectories = match self.denoising_steps_matched {
            Some(steps) => steps.min(self.output_ids_matched),
            None => self.reveals_all_steps_matched.min(self.output_ids_matched),
        };
        let mismatched = self.cases - self.skipped - trajectories + (self.edits_checked - self.edits_matched);
        logits_ok && self.cases > 0 && self.divergences.len() >= mismatched && self.divergences.iter().all(|d| d.explained)
    }
}

/// The reference session's margin at the step where a replay left the golden trajectory (see
/// [`Divergence`]); `None` for a case whose logits mix two passes (classifier-free guidance).
fn margin_at(reference: &mut Session, c: &Case, step: usize, ours: &[[u32; 2]]) -> Result<Option<f64>> {
    if c.cfg_scale != 0.0 {
        return Ok(None);
    }
    let (plen, mask) = (c.prompt_ids.len(), c.mask_id);
    let block_diffusion = reference.model.family() == llada_ir::Family::Llada2Moe;
    // LLaDA 2.x's canvas runs to the end of the block grid (its padding slots).
    let grid = match c.block_length {
        Some(b) if block_diffusion && b > 0 => (plen + c.gen_length).div_ceil(b) * b - plen,
        _ => c.gen_length,
    };
    let mut seq: Vec<u32> = c.prompt_ids.iter().copied().chain(std::iter::repeat_n(mask, grid)).collect();
    let edits = c.step_edits.as_deref().unwrap_or_default();
    for s in 0..step {
        for &[p, t] in c.step_reveals[s].iter().chain(edits.get(s).map_or(&[][..], |e| e.as_slice())) {
            if let Some(x) = seq.get_mut(plen + p as usize) {
                *x = t;
            }
        }
    }
    let (logits, first, rows) = match c.block_length {
        // The blocks the step decodes (mbsd's steps may span two), each seeing itself and the
        // blocks before it.
        Some(b) if block_diffusion && b > 0 => {
            let positions = ours.iter().chain(&c.step_reveals[step]).map(|r| plen + r[0] as usize);
            let (Some(first), Some(last)) = (positions.clone().min(), positions.max()) else {
                return Ok(None);
            };
            let start = first / b * b;
            let end = ((last / b + 1) * b).min(seq.len());
            let heads: Vec<u32> = (start..end).map(|p| p as u32).collect();
            (reference.forward_blocks(&seq[..end], 0, b, &heads)?, start, heads.len())
        }
        _ => {
            let heads: Vec<u32> = (plen..seq.len()).map(|p| p as u32).collect();
            (reference.forward_full(&seq, &heads)?, plen, heads.len())
        }
    };
    // A reveal's row among the logits' (`None` outside them: no margin from it).
    let row = |p: u32| (plen + p as usize).checked_sub(first);
    if rows == 0 {
        return Ok(None);
    }
    let vocab = logits.len() / rows;
    // Per generated position: its top-2 logit gap and its top-1 log-probability.
    let stats: Vec<(f64, f64)> = logits
        .chunks_exact(vocab)
        .map(|row| {
            let (mut a, mut b) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
            for &x in row {
                let x = x as f64;
                if x > a {
                    (a, b) = (x, a);
                } else if x > b {
                    b = x;
                }
            }
            let lse = a + row.iter().map(|&x| (x as f64 - a).exp()).sum::<f64>().ln();
            (a - b, a - lse)
        })
        .collect();
    let golden = &c.step_reveals[step];
    let pos = |set: &[[u32; 2]]| set.iter().map(|r| r[0]).collect::<BTreeSet<u32>>();
    let (gp, op) = (pos(golden), pos(ours));
    let mut margin = f64::INFINITY;
    let stat = |p: u32| row(p).and_then(|r| stats.get(r)).copied();
    for &[p, t] in ours {
        if let (true, Some((gap, _))) = (golden.iter().any(|&[q, u]| q == p && u != t), stat(p)) {
            margin = margin.min(gap);
        }
    }
    for a in gp.difference(&op) {
        for b in op.difference(&gp) {
            if let (Some((_, la)), Some((_, lb))) = (stat(*a), stat(*b)) {
                margin = margin.min((la - lb).abs());
            }
        }
    }
    Ok(margin.is_finite().then_some(margin))
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
    run_explained(session, None, golden_path, select, logit_tolerance, progress)
}

/// [`run_with`], explaining each mismatch by `reference`'s margins where it diverged (see
/// [`Divergence`]).
pub fn run_explained(session: &mut Session, mut reference: Option<&mut Session>, golden_path: &Path, select: Selection, logit_tolerance: f64, progress: &mut dyn FnMut(&str)) -> Result<Report> {
    if session.model.diffusion_gemma().is_some() {
        return diffusion_gemma::run(session, golden_path, select, logit_tolerance, progress);
    }
    let text = llada_ir::files::read_text_bounded(golden_path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(golden_path, e))?;
    let golden: Golden = serde_json::from_str(&text)
        .map_err(|e| Error::Input { path: golden_path.to_path_buf(), msg: format!("not a golden file: {e}") })?;
    let mask = session.model.header.special.mask;
    let llada2 = session.model.family() == llada_ir::Family::Llada2Moe;
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
        let Some(params) = case_params(c, golden_path, llada2)? else {
            r.skipped += 1;
            continue;
        };
        replay_case(&mut r, session, reference.as_deref_mut(), c, &params, llada2)?;
        progress(&c.id);
    }
    for (i, lc) in golden.first_step_logits.iter().enumerate() {
        r.logit_cases += 1;
        let err = first_pass_error(session, lc, i, golden_path)?;
        r.max_logit_abs_error = r.max_logit_abs_error.max(err);
        if err <= logit_tolerance {
            r.logit_cases_within_tolerance += 1;
        } else {
            r.failures.push(format!("first_step_logits[{i}]: max abs error {err:.2e} > {logit_tolerance:.0e}"));
        }
    }
    let bound = 2.0 * r.max_logit_abs_error;
    for d in &mut r.divergences {
        d.explained = d.margin.is_some_and(|m| m < bound);
    }
    Ok(r)
}

/// The sampler settings golden case `c` was made with (of `golden_path`, for errors);
/// `None` for a sampled case, which follows PyTorch's random stream that no other
/// implementation has.
fn case_params(c: &Case, golden_path: &Path, llada2: bool) -> Result<Option<SamplerParams>> {
    let unknown = |what: &str, v: &str| Error::Input { path: golden_path.to_path_buf(), msg: format!("{}: unknown {what} '{v}'", c.id) };
    let d = SamplerParams::default();
    let remasking = c.remasking.as_deref().map(|v| Remasking::parse(v).ok_or_else(|| unknown("remasking", v))).transpose()?.unwrap_or(d.remasking);
    // Fast-dLLM's threshold decoding is an alg of its own there, a setting here.
    let threshold_alg = c.alg.as_deref() == Some("confidence_threshold");
    // (LLaDA 2.x's threshold is its sampler's own.)
    if threshold_alg != c.threshold.is_some() && !llada2 {
        return Err(Error::Input { path: golden_path.to_path_buf(), msg: format!("{}: alg confidence_threshold goes with a threshold, and only it", c.id) });
    }
    let alg = c.alg.as_deref().filter(|_| !threshold_alg).map(|v| Alg::parse(v).ok_or_else(|| unknown("alg", v))).transpose()?;
    if c.temperature > 0.0 || remasking == Remasking::Random || alg == Some(Alg::Origin) {
        return Ok(None);
    }
    Ok(Some(SamplerParams {
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
        top_p: c.top_p,
        top_k: c.top_k,
        threshold: c.threshold,
        eos_early_stop: c.eos_early_stop,
        editing_threshold: c.editing_threshold,
        max_post_steps: c.max_post_steps.unwrap_or(d.max_post_steps),
        ..d
    }))
}

/// Generates case `c` with `params` and counts into `r` what matches the golden trajectory:
/// model calls, edits, output tokens, reveals before the first tie and at every step, with
/// where it diverged by `reference`'s margins.
fn replay_case(r: &mut Report, session: &mut Session, reference: Option<&mut Session>, c: &Case, params: &SamplerParams, llada2: bool) -> Result<()> {
    let g = generate(session, &c.prompt_ids, params, &mut |_| {})?;
    // LLaDA 2.x's model calls are its steps (its passes also store finished blocks).
    let calls = if llada2 { g.reveals.len() } else { g.forward_passes as usize };
    if let (Some(want), Some(_)) = (c.forward_calls, c.threshold) {
        r.forward_calls_checked += 1;
        if calls == want {
            r.forward_calls_matched += 1;
        } else {
            r.failures.push(format!("{}: {calls} model calls, the reference {want}", c.id));
        }
    }
    if let Some(golden_edits) = &c.step_edits {
        r.edits_checked += 1;
        let ours = g.revisions.as_deref().unwrap_or_default();
        let differs = (0..golden_edits.len().max(ours.len())).find(|&s| ours.get(s).map(|e| as_set(e)) != golden_edits.get(s).map(|e| as_set(e)));
        match differs {
            None => r.edits_matched += 1,
            Some(s) => r.failures.push(format!("{}: model call {s} edited {:?}, golden {:?}", c.id, ours.get(s), golden_edits.get(s))),
        }
    }
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
    if let (Some(reference), Some(s)) = (reference, (0..c.step_reveals.len()).find(|&s| !step_matches(s))) {
        let ours = g.reveals.get(s).cloned().unwrap_or_default();
        let margin = margin_at(reference, c, s, &ours)?;
        r.divergences.push(Divergence { case: c.id.clone(), step: s, margin, explained: false });
    }
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
    Ok(())
}

/// The largest absolute difference between `session`'s first-pass logits and logit case
/// `lc` (`first_step_logits[i]` of `golden_path`, for errors).
fn first_pass_error(session: &mut Session, lc: &LogitCase, i: usize, golden_path: &Path) -> Result<f64> {
    let prompt_len = lc.input_ids.len() - lc.gen_length;
    let rows: Vec<u32> = (prompt_len..lc.input_ids.len()).map(|p| p as u32).collect();
    let logits = match lc.block_length {
        // Block-causal: each block a pass attending to itself and the blocks before it.
        Some(b) if b > 0 && lc.input_ids.len() % b == 0 && lc.gen_length == b => {
            let n = lc.input_ids.len();
            session.store_blocks(&lc.input_ids[..n - b], 0, b)?;
            session.forward_blocks(&lc.input_ids, n - b, b, &rows)?
        }
        Some(b) => return Err(Error::Input { path: golden_path.to_path_buf(), msg: format!("first_step_logits[{i}]: block_length {b} must divide the input and be its gen_length") }),
        None => session.forward_full(&lc.input_ids, &rows)?,
    };
    let vocab = logits.len() / rows.len();
    let mut err: f64 = 0.0;
    for (ri, want) in lc.logits.iter().enumerate() {
        for (v, &w) in want.iter().enumerate() {
            err = err.max((logits[ri * vocab + v] as f64 - w).abs());
        }
    }
    Ok(err)
}
