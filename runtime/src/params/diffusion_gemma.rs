//! DiffusionGemma's sampler settings: their types, their defaults from the checkpoint's
//! generation config (the artifact's section), and their ranges. Its sampler is its own
//! (uniform noise, entropy-bound acceptance, no masks, no blocks but canvases): it takes the
//! settings the published `generate` takes and refuses LLaDA's and Dream's, naming them; the
//! other families refuse its settings.

use llada_ir::diffusion_gemma::DiffusionGemmaSection;

use super::{Policy, SamplerParams, MAX_STEPS};
use crate::error::{Error, Result, Setting as S};

/// The most end-of-sequence ids a generation takes (the published configs name three).
pub const MAX_EOS_IDS: usize = 8;

/// A short list of token ids, kept inline so the settings stay `Copy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "Vec<u32>", try_from = "Vec<u32>")]
pub struct EosIds {
    ids: [u32; MAX_EOS_IDS],
    len: u8,
}

impl EosIds {
    pub const NONE: EosIds = EosIds { ids: [0; MAX_EOS_IDS], len: 0 };

    /// The ids, or an error when there are more than [`MAX_EOS_IDS`].
    pub fn new(ids: &[u32]) -> std::result::Result<EosIds, String> {
        if ids.len() > MAX_EOS_IDS {
            return Err(format!("{} ids given; at most {MAX_EOS_IDS} are taken", ids.len()));
        }
        let mut e = EosIds::NONE;
        e.ids[..ids.len()].copy_from_slice(ids);
        e.len = ids.len() as u8;
        Ok(e)
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.ids[..self.len as usize]
    }
}

impl From<EosIds> for Vec<u32> {
    fn from(e: EosIds) -> Vec<u32> {
        e.as_slice().to_vec()
    }
}

impl TryFrom<Vec<u32>> for EosIds {
    type Error = String;
    fn try_from(v: Vec<u32>) -> std::result::Result<EosIds, String> {
        EosIds::new(&v)
    }
}

/// The random stream of DiffusionGemma's sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rng {
    /// PyTorch's CPU generator, draw for draw: `generate()` under `torch.manual_seed(seed)`
    /// exactly (two draws per vocabulary entry and position each step).
    Torch,
    /// The same distributions from a counter-based stream (Philox), one draw per position,
    /// rows in parallel.
    Fast,
}

impl Rng {
    pub const NAMES: &'static [&'static str] = &["torch", "fast"];

    pub fn parse(s: &str) -> Option<Rng> {
        match s {
            "torch" => Some(Rng::Torch),
            "fast" => Some(Rng::Fast),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Rng::Torch => "torch",
            Rng::Fast => "fast",
        }
    }
}

impl SamplerParams {
    /// The defaults on a DiffusionGemma artifact: the checkpoint's generation config
    /// (`max_new_tokens` unless `gen_length` is given, its steps, schedule, bound, stopping
    /// and EOS ids) and its canvas length unless `block_length` is given.
    pub(super) fn for_diffusion_gemma(section: &DiffusionGemmaSection, gen_length: Option<usize>, block_length: Option<usize>, policy: Policy) -> SamplerParams {
        let g = &section.generation;
        SamplerParams {
            gen_length: gen_length.unwrap_or(g.max_new_tokens as usize),
            block_length: block_length.unwrap_or(section.canvas_length as usize),
            steps: g.max_denoising_steps as usize,
            policy,
            t_min: g.t_min,
            t_max: g.t_max,
            entropy_bound: g.entropy_bound,
            stability_threshold: g.stability_threshold.map(|s| s as usize),
            confidence_threshold: g.confidence_threshold,
            eos_ids: EosIds::new(&g.eos_ids[..g.eos_ids.len().min(MAX_EOS_IDS)]).unwrap_or(EosIds::NONE),
            ..SamplerParams::default()
        }
    }

    /// DiffusionGemma's ranges (`canvas`: the artifact's canvas length): the published
    /// config's checks, and LLaDA's and Dream's settings refused by name. Returns the steps
    /// per canvas.
    pub(super) fn validate_diffusion_gemma(&self, canvas: usize) -> Result<usize> {
        let bad = |s: S, m: String| Err(Error::setting(s, m));
        if !(1..=canvas).contains(&self.block_length) {
            return bad(S::BlockLength, format!("{} is outside 1..={canvas} (the canvas length the artifact was compiled for)", self.block_length));
        }
        if !(1..=MAX_STEPS).contains(&self.steps) {
            return bad(S::Steps, format!("{} is outside 1..={MAX_STEPS} (DiffusionGemma's steps are per canvas, its max_denoising_steps)", self.steps));
        }
        for (s, t) in [(S::TMin, self.t_min), (S::TMax, self.t_max)] {
            if let Some(t) = t.filter(|t| !(t.is_finite() && *t >= 0.0)) {
                return bad(s, format!("{t} must be a finite number >= 0"));
            }
        }
        if let (Some(lo), Some(hi)) = (self.t_min, self.t_max)
            && hi <= lo
        {
            return bad(S::TMax, format!("{hi} must be above --t-min {lo}"));
        }
        if !(self.entropy_bound.is_finite() && self.entropy_bound > 0.0) {
            return bad(S::EntropyBound, format!("{} must be a finite number above 0", self.entropy_bound));
        }
        if let Some(c) = self.confidence_threshold.filter(|c| !(c.is_finite() && *c > 0.0)) {
            return bad(S::ConfidenceThreshold, format!("{c} must be a finite number above 0"));
        }
        if self.stability_threshold.is_some_and(|s| s > MAX_STEPS) {
            return bad(S::StabilityThreshold, format!("{} is outside 0..={MAX_STEPS}", self.stability_threshold.unwrap_or(0)));
        }
        let d = SamplerParams::default();
        let theirs = "is an option of LLaDA's and Dream's samplers; DiffusionGemma's denoises uniform noise with its own settings (--t-min, --t-max, --entropy-bound, --stability-threshold, --confidence-threshold, --eos-ids, --rng)";
        let changed = [
            (S::Temperature, self.temperature != d.temperature),
            (S::CfgScale, self.cfg_scale != d.cfg_scale),
            (S::Remasking, self.remasking != d.remasking),
            (S::Policy, self.policy != d.policy),
            (S::RefreshEvery, self.refresh_every != d.refresh_every),
            (S::Threshold, self.threshold.is_some()),
            (S::Alg, self.alg != d.alg),
            (S::Eps, self.eps != d.eps),
            (S::TopP, self.top_p.is_some()),
            (S::TopK, self.top_k.is_some()),
            (S::AlgTemp, self.alg_temp.is_some()),
            (S::EosEarlyStop, self.eos_early_stop),
            (S::EditingThreshold, self.editing_threshold.is_some()),
            (S::LogitsEosInf, self.logits_eos_inf),
            (S::ConfidenceEosEotInf, self.confidence_eos_eot_inf),
        ];
        if let Some((s, _)) = changed.into_iter().find(|(_, c)| *c) {
            return bad(s, theirs.into());
        }
        Ok(self.steps)
    }

    /// The other families: DiffusionGemma's settings away from their defaults are refused.
    pub(super) fn refuse_diffusion_gemma_settings(&self) -> Result<()> {
        let d = SamplerParams::default();
        let changed = [
            (S::TMin, self.t_min != d.t_min),
            (S::TMax, self.t_max != d.t_max),
            (S::EntropyBound, self.entropy_bound != d.entropy_bound),
            (S::StabilityThreshold, self.stability_threshold != d.stability_threshold),
            (S::ConfidenceThreshold, self.confidence_threshold != d.confidence_threshold),
            (S::EosIds, self.eos_ids != d.eos_ids),
            (S::Rng, self.rng != d.rng),
        ];
        match changed.into_iter().find(|(_, c)| *c) {
            Some((s, _)) => Err(Error::setting(s, "is an option of DiffusionGemma's sampler; this model's sampler has none".to_string())),
            None => Ok(()),
        }
    }
}
