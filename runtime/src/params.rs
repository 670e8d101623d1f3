//! Every setting of a session and a generation, with its default and its range, defined
//! once: the CLI, the C API and the JSON reports all go through these types.

use crate::error::{Error, Result, Setting};
use llada_ir::Family;
use crate::executor::{self, Backend};
use crate::model::Model;
use crate::moe::ExpertStrategy;
use crate::staging::StagingMode;

mod diffusion_gemma;
pub use diffusion_gemma::{EosIds, Rng, MAX_EOS_IDS};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remasking {
    /// Commit the positions whose prediction has the highest probability.
    LowConfidence,
    /// Commit positions in a random order.
    Random,
}

impl Remasking {
    /// Every value's name, as `parse` takes them.
    pub const NAMES: &'static [&'static str] = &["low_confidence", "random"];

    pub fn parse(s: &str) -> Option<Remasking> {
        match s {
            "low_confidence" => Some(Remasking::LowConfidence),
            "random" => Some(Remasking::Random),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Remasking::LowConfidence => "low_confidence",
            Remasking::Random => "random",
        }
    }
}

/// Dream's confidence rule (`alg` of its published `diffusion_generate`): which masked
/// positions a step commits. LLaDA's sampler takes [`Remasking`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Alg {
    /// Each masked position independently, with probability `1 - s/t` (random order).
    Origin,
    /// The highest probability of the prediction.
    MaskgitPlus,
    /// The top probability minus the second.
    TopkMargin,
    /// The negative entropy of the distribution.
    Entropy,
}

impl Alg {
    /// Every value's name, as `parse` takes them.
    pub const NAMES: &'static [&'static str] = &["origin", "maskgit_plus", "topk_margin", "entropy"];

    pub fn parse(s: &str) -> Option<Alg> {
        match s {
            "origin" => Some(Alg::Origin),
            "maskgit_plus" => Some(Alg::MaskgitPlus),
            "topk_margin" => Some(Alg::TopkMargin),
            "entropy" => Some(Alg::Entropy),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Alg::Origin => "origin",
            Alg::MaskgitPlus => "maskgit_plus",
            Alg::TopkMargin => "topk_margin",
            Alg::Entropy => "entropy",
        }
    }
}

/// Which rows each forward pass recomputes (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    Exact,
    Prefix,
    Dual,
    Spec,
    Mbsd,
}

impl Policy {
    /// Every value's name, as `parse` takes them.
    pub const NAMES: &'static [&'static str] = &["exact", "prefix", "dual", "spec", "mbsd"];

    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "exact" => Some(Policy::Exact),
            "prefix" => Some(Policy::Prefix),
            "dual" => Some(Policy::Dual),
            "spec" => Some(Policy::Spec),
            "mbsd" => Some(Policy::Mbsd),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Exact => "exact",
            Policy::Prefix => "prefix",
            Policy::Dual => "dual",
            Policy::Spec => "spec",
            Policy::Mbsd => "mbsd",
        }
    }
}

/// `mbsd`: whether committed tokens stay revisable and are re-checked on the CPU side path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Revision {
    DualPath,
    Off,
    /// `dual-path` where the dense path leaves the CPU free (a GPU, an NPU), `off` where it
    /// runs on the same cores (the host backend, lavapipe): there the side path's work takes
    /// the dense path's time and revision makes a generation slower (BENCHMARKS.md).
    Auto,
}

impl Revision {
    /// Every value's name, as `parse` takes them.
    pub const NAMES: &'static [&'static str] = &["auto", "dual-path", "off"];

    pub fn parse(s: &str) -> Option<Revision> {
        match s {
            "dual-path" => Some(Revision::DualPath),
            "off" => Some(Revision::Off),
            "auto" => Some(Revision::Auto),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Revision::DualPath => "dual-path",
            Revision::Off => "off",
            Revision::Auto => "auto",
        }
    }

    /// What runs on a backend whose dense path does (`dense_on_cpu`) or does not run on the
    /// CPU cores the side path would use.
    pub fn resolve(self, dense_on_cpu: bool) -> Revision {
        match self {
            Revision::Auto if dense_on_cpu => Revision::Off,
            Revision::Auto => Revision::DualPath,
            r => r,
        }
    }
}

/// Sampler settings, with the official code's defaults. The one definition of every
/// sampler setting: the CLI's flags take their defaults from [`Default`], the C API's
/// `llada_params` maps to it field for field, and `run --json` and `eval --json` print it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplerParams {
    /// Tokens to generate.
    pub gen_length: usize,
    /// Semi-autoregressive block size; `gen_length` must be a multiple of it.
    pub block_length: usize,
    /// Denoising steps over all blocks; a multiple of the number of blocks.
    pub steps: usize,
    /// 0 = take the most likely token; above 0, Gumbel-max sampling at this temperature.
    pub temperature: f64,
    /// Classifier-free guidance scale; 0 skips the unconditional pass.
    pub cfg_scale: f64,
    /// Which masked positions to commit first.
    pub remasking: Remasking,
    /// Seed of the noise (temperature > 0 and random remasking): same seed, same output.
    pub seed: u64,
    /// Official `logits_eos_inf`: EOS is never predicted.
    pub logits_eos_inf: bool,
    /// Official `confidence_eos_eot_inf`: predictions of EoT (and of EOS at temperature 0,
    /// where the official code's noisy and clean logits are one tensor) get zero confidence.
    pub confidence_eos_eot_inf: bool,
    /// Which rows each pass recomputes.
    pub policy: Policy,
    /// Cached policies: a whole-sequence pass every this many steps of a block (0: only at
    /// the start of each block; 1: every step, which is `exact`).
    pub refresh_every: usize,
    /// Commit every masked position of the block at or above this confidence (at least one)
    /// instead of the fixed schedule.
    pub threshold: Option<f32>,
    /// `spec`: how many blocks after the current one are drafted.
    pub spec_blocks: usize,
    /// `spec` and `mbsd`: confidence a draft's confirmation needs.
    pub spec_threshold: f32,
    /// `mbsd`: fewest rows a dense pass computes (None: the plan's smallest latency bucket, or
    /// on a backend that pays for every row, only the rows the step needs); the whole block
    /// makes every pass recompute the block, as `dual` does.
    pub rows: Option<usize>,
    /// `mbsd`: the CPU side path, on (`DualPath`), off, or chosen by the backend (`Auto`).
    pub revision: Revision,
    /// `mbsd` revision: rows of one side-path pass, two per checked token (None: the plan's
    /// smallest latency bucket).
    pub side_rows: Option<usize>,
    /// A check that agrees with this confidence or more makes a token stable.
    pub stable_confidence: f32,
    /// So many agreeing checks make a token stable whatever their confidence.
    pub stable_checks: u32,
    /// A check that disagrees with this confidence or more revises the token.
    pub revise_confidence: f32,
    /// Dream: the confidence rule (LLaDA: `remasking`).
    pub alg: Alg,
    /// Dream: the last timestep of its schedule, which runs from 1 down to `eps`.
    pub eps: f64,
    /// Dream and LLaDA 2.x: keep the smallest set of most likely tokens whose probability
    /// reaches this (nucleus), before sampling; `None` or 1 keeps all.
    pub top_p: Option<f64>,
    /// Dream and LLaDA 2.x: keep the `top_k` most likely tokens before sampling.
    pub top_k: Option<usize>,
    /// Dream: above 0, the positions a step commits are drawn (without replacement) from the
    /// softmax of their confidences divided by this, instead of the most confident.
    pub alg_temp: Option<f64>,
    /// LLaDA 2.x: stop at a step that commits EOS once every position before it is
    /// committed (the published `eos_early_stop`), not at the end of its block; with
    /// `editing_threshold` (2.1's generate), after the block holding EOS, not after every block.
    pub eos_early_stop: bool,
    /// LLaDA 2.x: 2.1's published `generate` with token editing: each model call also
    /// replaces a committed token of the block (not the prompt's) whose new prediction
    /// differs with a confidence above this; commits by `threshold` alone (at least one a
    /// call, no step schedule). `None`: 2.0's `generate`.
    pub editing_threshold: Option<f32>,
    /// LLaDA 2.1's token editing: the most model calls a block takes after its last mask is
    /// committed (each may edit; the block ends at the first that edits nothing).
    pub max_post_steps: usize,
    /// DiffusionGemma: the temperature at the first step (`t_max`) falling linearly to just
    /// above `t_min` at the last; `None` for either: no schedule (the raw logits).
    pub t_min: Option<f64>,
    pub t_max: Option<f64>,
    /// DiffusionGemma: a step accepts the lowest-entropy positions while the entropies ranked
    /// before each sum to at most this.
    pub entropy_bound: f64,
    /// DiffusionGemma: a canvas ends once its argmax canvas has held for this many steps and
    /// the mean entropy is below `confidence_threshold`; `None` for either: never early.
    pub stability_threshold: Option<usize>,
    pub confidence_threshold: Option<f64>,
    /// DiffusionGemma: the tokens that end the generation (the canvas holding one is the last).
    pub eos_ids: EosIds,
    /// DiffusionGemma: the random stream.
    pub rng: Rng,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            gen_length: 128,
            block_length: 32,
            steps: 128,
            temperature: 0.0,
            cfg_scale: 0.0,
            remasking: Remasking::LowConfidence,
            seed: 0,
            logits_eos_inf: false,
            confidence_eos_eot_inf: false,
            policy: Policy::Exact,
            refresh_every: 0,
            threshold: None,
            spec_blocks: 1,
            spec_threshold: 0.99,
            rows: None,
            revision: Revision::Auto,
            side_rows: None,
            stable_confidence: 0.9,
            stable_checks: 2,
            revise_confidence: 0.5,
            alg: Alg::MaskgitPlus,
            eps: 1e-3,
            top_p: None,
            top_k: None,
            alg_temp: None,
            eos_early_stop: false,
            editing_threshold: None,
            max_post_steps: LLADA21_MAX_POST_STEPS,
            t_min: Some(0.4),
            t_max: Some(0.8),
            entropy_bound: 0.1,
            stability_threshold: Some(1),
            confidence_threshold: Some(0.005),
            eos_ids: EosIds::NONE,
            rng: Rng::Fast,
        }
    }
}

/// LLaDA 2.x's published `generate`'s steps per block.
pub const LLADA2_STEPS: usize = 32;

/// LLaDA 2.1's published `generate`'s `max_post_steps`.
pub const LLADA21_MAX_POST_STEPS: usize = 16;

/// Most denoising steps a generation may ask for.
pub const MAX_STEPS: usize = 1 << 16;

/// What an artifact's plan can serve, the bounds of the sizes a request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest sequence (prompt + generation) the graphs and the KV cache hold.
    pub max_len: usize,
    /// Rows of the largest graph: the most one pass computes.
    pub max_rows: usize,
    /// The model is Dream, whose sampler is its own (see [`SamplerParams::validate`]).
    pub dream: bool,
    /// The model is LLaDA 2.x: `steps` are per block, and the generation need not fill
    /// whole blocks (its blocks lie on a grid from position 0, the prompt's included).
    pub llada2: bool,
    /// The model is DiffusionGemma, whose canvases are this long at most.
    pub canvas: Option<usize>,
}

impl Limits {
    pub fn of(model: &crate::Model) -> Limits {
        let h = &model.header;
        let canvas = model.diffusion_gemma().map(|s| s.canvas_length as usize);
        Limits { max_len: model.max_exact_len() as usize, max_rows: h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize, dream: model.is_dream(), llada2: model.family() == llada_ir::Family::Llada2Moe, canvas }
    }
}

impl SamplerParams {
    /// [`validate`](Self::validate) for LLaDA 2.x's published `generate`: `steps` per block,
    /// any block length up to the plan's rows, the threshold (0.95 when unset) in 0..=1,
    /// sampling at temperature 0 or above; only its own schedule (the exact policy) and no
    /// guidance. Returns the steps per block.
    fn validate_llada2(&self, limits: &Limits) -> Result<usize> {
        use crate::error::Setting as S;
        let bad = |s: S, m: String| Err(Error::setting(s, m));
        if !(1..=limits.max_rows.min(limits.max_len)).contains(&self.block_length) {
            return bad(S::BlockLength, format!("{} is outside 1..={} (the artifact's largest graph)", self.block_length, limits.max_rows.min(limits.max_len)));
        }
        if !(1..=MAX_STEPS).contains(&self.steps) {
            return bad(S::Steps, format!("{} is outside 1..={MAX_STEPS} (LLaDA 2.x's steps are per block)", self.steps));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(S::Temperature, format!("{} must be a finite number >= 0", self.temperature));
        }
        if let Some(t) = self.threshold.filter(|t| !(0.0..=1.0).contains(t)) {
            return bad(S::Threshold, format!("{t} must be between 0 and 1"));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return bad(S::TopP, format!("{p} must be above 0 and at most 1"));
        }
        match self.policy {
            Policy::Exact => {}
            // mbsd on LLaDA 2.x (`llada2_mbsd.rs`): row sets and drafts of one block, no side path.
            Policy::Mbsd => {
                if let Some(t) = self.editing_threshold {
                    return bad(S::EditingThreshold, format!("{t} with --policy mbsd: 2.1's editing predicts every committed token of the block each call, which is what mbsd's passes skip; use --policy exact"));
                }
                if self.spec_blocks > 1 {
                    return bad(S::SpecBlocks, format!("{} is outside 0..=1 (LLaDA 2.x's mbsd drafts the next block only)", self.spec_blocks));
                }
                if !(0.0..=1.0).contains(&self.spec_threshold) {
                    return bad(S::SpecThreshold, format!("{} must be between 0 and 1", self.spec_threshold));
                }
                if self.revision == Revision::DualPath {
                    return bad(S::Revision, "dual-path: LLaDA 2.x's mbsd has no CPU side path (use auto or off)".into());
                }
                for (s, set) in [(S::Rows, self.rows.is_some()), (S::SideRows, self.side_rows.is_some()), (S::RefreshEvery, self.refresh_every != 0)] {
                    if set {
                        return bad(s, "is not read by LLaDA 2.x's mbsd, whose passes compute the rows that need it".into());
                    }
                }
            }
            _ => return bad(S::Policy, format!("{}: LLaDA 2.x runs its published block schedule (exact) or mbsd; its passes already cover one block each", self.policy.name())),
        }
        if self.cfg_scale != 0.0 {
            return bad(S::CfgScale, format!("{}: LLaDA 2.x's generate has no guidance", self.cfg_scale));
        }
        // The other samplers' settings, which its generate never reads: refused, not ignored.
        let d = SamplerParams::default();
        let others = [
            (S::Remasking, self.remasking != d.remasking),
            (S::LogitsEosInf, self.logits_eos_inf),
            (S::ConfidenceEosEotInf, self.confidence_eos_eot_inf),
            (S::Alg, self.alg != d.alg),
            (S::Eps, self.eps != d.eps),
            (S::AlgTemp, self.alg_temp.is_some()),
        ];
        if let Some((s, _)) = others.into_iter().find(|(_, set)| *set) {
            return bad(s, "is an option of LLaDA's or Dream's sampler; LLaDA 2.x's generate commits by its --threshold (and --editing-threshold)".into());
        }
        if let Some(t) = self.editing_threshold.filter(|t| !(0.0..=1.0).contains(t)) {
            return bad(S::EditingThreshold, format!("{t} must be between 0 and 1"));
        }
        if self.max_post_steps > MAX_STEPS {
            return bad(S::MaxPostSteps, format!("{} is outside 0..={MAX_STEPS}", self.max_post_steps));
        }
        if self.editing_threshold.is_none() && self.max_post_steps != LLADA21_MAX_POST_STEPS {
            return bad(S::MaxPostSteps, format!("{}: applies to LLaDA 2.1's token editing only; give --editing-threshold too", self.max_post_steps));
        }
        Ok(self.steps)
    }

    /// Checks every setting against its range and the plan's `limits`, before anything is
    /// allocated for it; returns the steps per block. The one place the CLI and the C API
    /// share: errors are [`Error::Setting`], naming the setting and its range.
    pub fn validate(&self, limits: &Limits) -> Result<usize> {
        use crate::error::Setting as S;
        let bad = |s: S, m: String| Err(Error::setting(s, m));
        // At least one prompt token beside the generation.
        let max_gen = limits.max_len.saturating_sub(1).max(1);
        if !(1..=max_gen).contains(&self.gen_length) {
            return bad(S::GenLength, format!("{} is outside 1..={max_gen} (the artifact holds {} positions, one at least for the prompt)", self.gen_length, limits.max_len));
        }
        if let Some(canvas) = limits.canvas {
            return self.validate_diffusion_gemma(canvas);
        }
        self.refuse_diffusion_gemma_settings()?;
        if limits.llada2 {
            return self.validate_llada2(limits);
        }
        if self.eos_early_stop {
            return bad(S::EosEarlyStop, "applies to LLaDA 2.x's sampler only".into());
        }
        if let Some(t) = self.editing_threshold {
            return bad(S::EditingThreshold, format!("{t}: token editing is LLaDA 2.1's sampler's only"));
        }
        if self.max_post_steps != LLADA21_MAX_POST_STEPS {
            return bad(S::MaxPostSteps, format!("{}: applies to LLaDA 2.1's token editing only", self.max_post_steps));
        }
        if !(1..=self.gen_length).contains(&self.block_length) || self.gen_length % self.block_length != 0 {
            return bad(S::BlockLength, format!("{} must divide the gen length {}", self.block_length, self.gen_length));
        }
        let blocks = self.gen_length / self.block_length;
        // Steps beyond one per generated token commit nothing, but the official sampler runs
        // them (each a pass and an entry of `reveals`): allowed, up to a bound.
        if !(1..=MAX_STEPS).contains(&self.steps) || self.steps % blocks != 0 {
            return bad(S::Steps, format!("{} must be a multiple of the {blocks} blocks in 1..={MAX_STEPS}", self.steps));
        }
        // Dream's published `sample_tokens` divides by the temperature only above 0, so a
        // negative one is greedy there; LLaDA's official code has no meaning for it.
        if !(self.temperature.is_finite() && (self.temperature >= 0.0 || limits.dream)) {
            return bad(S::Temperature, format!("{} must be a finite number >= 0", self.temperature));
        }
        if !(self.cfg_scale >= 0.0 && self.cfg_scale.is_finite()) {
            return bad(S::CfgScale, format!("{} must be a finite number >= 0", self.cfg_scale));
        }
        if self.cfg_scale > 0.0 && self.policy != Policy::Exact {
            // The unconditional pass would overwrite the conditional sequence's cache.
            return bad(S::CfgScale, format!("{} needs the exact policy (the {} policy caches one sequence)", self.cfg_scale, self.policy.name()));
        }
        let steps_per_block = self.steps / blocks;
        // A block takes its scheduled steps, or up to one per token under a threshold.
        let block_steps = steps_per_block.max(self.block_length);
        if self.refresh_every > block_steps {
            return bad(S::RefreshEvery, format!("{} is outside 0..={block_steps} (the most steps a block takes)", self.refresh_every));
        }
        if let Some(t) = self.threshold {
            if !(0.0..=1.0).contains(&t) {
                return bad(S::Threshold, format!("{t} must be between 0 and 1"));
            }
        }
        // Blocks drafted ahead: `blocks - 1` follow the first; one more is allowed (a one-block
        // generation with the `spec` default of 1), which drafts nothing further.
        if self.spec_blocks > blocks {
            return bad(S::SpecBlocks, format!("{} is outside 0..={blocks} (the generation has {blocks} blocks)", self.spec_blocks));
        }
        if !(0.0..=1.0).contains(&self.spec_threshold) {
            return bad(S::SpecThreshold, format!("{} must be between 0 and 1", self.spec_threshold));
        }
        if let Some(r) = self.rows.filter(|r| !(1..=limits.max_rows).contains(r)) {
            return bad(S::Rows, format!("{r} is outside 1..={} (the artifact's largest graph)", limits.max_rows));
        }
        // Two rows per checked token, in one graph.
        if let Some(r) = self.side_rows.filter(|r| !(2..=limits.max_rows).contains(r)) {
            return bad(S::SideRows, format!("{r} is outside 2..={} (two rows per checked token, in the artifact's largest graph)", limits.max_rows));
        }
        for (s, v) in [(S::StableConfidence, self.stable_confidence), (S::ReviseConfidence, self.revise_confidence)] {
            if !(0.0..=1.0).contains(&v) {
                return bad(s, format!("{v} must be between 0 and 1"));
            }
        }
        if self.stable_checks == 0 {
            return bad(S::StableChecks, "0 must be at least 1".into());
        }
        self.validate_family(limits.dream)?;
        Ok(steps_per_block)
    }

    /// LLaDA's and Dream's samplers take different settings: each refuses the other's, set
    /// away from its default, naming it. Dream's sampler has no blocks (the cached policies
    /// block it); `spec` is not implemented for it.
    fn validate_family(&self, dream: bool) -> Result<()> {
        use crate::error::Setting as S;
        let d = SamplerParams::default();
        let bad = |s: S, m: String| Err(Error::setting(s, m));
        if !dream {
            if self.alg != d.alg {
                return bad(S::Alg, format!("{} is Dream's confidence rule; this is a LLaDA model, whose sampler takes --remasking", self.alg.name()));
            }
            if self.eps != d.eps {
                return bad(S::Eps, format!("{} is Dream's schedule end; this is a LLaDA model, whose sampler has none", self.eps));
            }
            let (filters, draws) = ("an option of Dream's and LLaDA 2.x's samplers", "an option of Dream's sampler");
            for (s, set, whose) in [(S::TopP, self.top_p.is_some(), filters), (S::TopK, self.top_k.is_some(), filters), (S::AlgTemp, self.alg_temp.is_some(), draws)] {
                if set {
                    return bad(s, format!("is {whose}; this is a LLaDA model"));
                }
            }
            return Ok(());
        }
        // The published filter keeps the most likely token and every next one until the
        // running probability passes top_p: 0 keeps only the most likely, 1 and above keep all.
        if let Some(p) = self.top_p.filter(|p| !(*p >= 0.0 && p.is_finite())) {
            return bad(S::TopP, format!("{p} must be a finite number >= 0 (0 keeps only the most likely token, 1 or more keeps all)"));
        }
        if self.top_k == Some(0) {
            return bad(S::TopK, "0 must be at least 1".into());
        }
        // The published code draws the commits from softmax(confidence / alg_temp) unless it is
        // 0 (or absent): a negative one prefers the least confident.
        if let Some(t) = self.alg_temp.filter(|t| !t.is_finite()) {
            return bad(S::AlgTemp, format!("{t} must be a finite number (0: the most confident first)"));
        }
        // The schedule runs from 1 down to eps: at 0 the last step reveals what is left; above
        // 1 or below 0 a step would commit a negative number, or more than are masked, which
        // the published code's topk refuses.
        if !(0.0..=1.0).contains(&self.eps) {
            return bad(S::Eps, format!("{} must be between 0 and 1, both included (the schedule runs from 1 down to it)", self.eps));
        }
        match self.policy {
            Policy::Exact if self.block_length != self.gen_length => {
                return bad(S::BlockLength, format!("{}: Dream's sampler has no blocks; use --block-len {} (the gen length), or the prefix or dual policy, which block it as Fast-dLLM does", self.block_length, self.gen_length));
            }
            Policy::Exact | Policy::Prefix | Policy::Dual => {}
            // Drafts and revision compare the confidence with thresholds that are
            // probabilities: `entropy`'s is not one, and `origin` has none.
            Policy::Mbsd if self.alg == Alg::Origin => {
                return bad(S::Alg, "origin commits at random, without the confidence --policy mbsd orders its commits by; use maskgit_plus, topk_margin or entropy".into());
            }
            Policy::Mbsd if self.alg == Alg::Entropy && (self.spec_blocks > 0 || self.revision == Revision::DualPath) => {
                return bad(S::Alg, "entropy's confidence is not a probability, which the drafts' and the revision's thresholds are: with --policy mbsd use it with --spec-blocks 0 (and --revision auto or off), or use maskgit_plus or topk_margin".into());
            }
            Policy::Mbsd => {}
            Policy::Spec => return bad(S::Policy, "spec is not implemented for Dream; Dream runs the exact, prefix, dual and mbsd policies".into()),
        }
        if self.refresh_every != 0 {
            return bad(S::RefreshEvery, format!("{}: Dream's cached policies refresh at each block's start only, as Fast-dLLM's Dream code does", self.refresh_every));
        }
        if self.remasking != d.remasking {
            return bad(S::Remasking, format!("{} is LLaDA's; Dream's sampler takes --alg", self.remasking.name()));
        }
        let llada_only = "is one of LLaDA's sampler options, which Dream's published sampler does not have";
        if self.cfg_scale != 0.0 {
            return bad(S::CfgScale, llada_only.into());
        }
        // Fast-dLLM's `alg='confidence_threshold'` exists in its block code only.
        if let (Some(t), Policy::Exact | Policy::Mbsd) = (self.threshold, self.policy) {
            return bad(S::Threshold, format!("{t}: Dream's threshold decoding is Fast-dLLM's block sampler's (alg='confidence_threshold'): use --policy prefix or dual; the published sampler (exact) and mbsd have none"));
        }
        if self.threshold.is_some() && self.alg != d.alg {
            return bad(S::Alg, format!("{} with --threshold: Fast-dLLM's threshold mode is an alg of its own ('confidence_threshold': the chosen token's probability), so --threshold takes no --alg", self.alg.name()));
        }
        if let (Some(_), Some(t)) = (self.threshold, self.alg_temp) {
            return bad(S::AlgTemp, format!("{t} with --threshold: Fast-dLLM's threshold mode commits by the threshold, not by drawing"));
        }
        // Switches without a range, so without a `Setting`: named by their flag.
        for (set, flag) in [(self.logits_eos_inf, "--logits-eos-inf"), (self.confidence_eos_eot_inf, "--confidence-eos-eot-inf")] {
            if set {
                return Err(Error::request(format!("{flag} {llada_only}")));
            }
        }
        Ok(())
    }

    /// The defaults on `model` for a generation of `gen_length` tokens under `policy`: the
    /// block length the artifact was compiled for (Dream's sampler has no blocks: one block of
    /// the whole generation) unless `block_length` is given, and the speculation depth its plan
    /// says. What every front end starts from before the settings it was given.
    pub fn for_model(model: &Model, gen_length: Option<usize>, block_length: Option<usize>, policy: Policy) -> SamplerParams {
        if let Some(section) = model.diffusion_gemma() {
            return SamplerParams::for_diffusion_gemma(section, gen_length, block_length, policy);
        }
        let gen_length = gen_length.unwrap_or(SamplerParams::default().gen_length);
        let plan = &model.header.plan;
        let block_length = block_length.unwrap_or(if model.is_dream() { gen_length } else { plan.block_len as usize });
        let spec_blocks = SamplerParams::default_spec_blocks(policy, plan.spec_blocks as usize, gen_length, block_length);
        // LLaDA 2.x's steps are per block: its published default; its mbsd drafts one block.
        let llada2 = model.family() == llada_ir::Family::Llada2Moe;
        let steps = if llada2 { LLADA2_STEPS } else { SamplerParams::default().steps };
        let spec_blocks = if llada2 { spec_blocks.min(1) } else { spec_blocks };
        SamplerParams { gen_length, block_length, policy, spec_blocks, steps, ..SamplerParams::default() }
    }

    /// `spec_blocks` when none is given: `spec` drafts one block ahead, `mbsd` as deep as
    /// the artifact was compiled for; never more blocks than follow the first.
    pub fn default_spec_blocks(policy: Policy, compiled: usize, gen_length: usize, block_length: usize) -> usize {
        let wanted = if policy == Policy::Mbsd { compiled } else { 1 };
        let after_first = gen_length.checked_div(block_length).unwrap_or(1).saturating_sub(1);
        wanted.min(after_first)
    }
}


/// A sampler setting that only some policies read, and which: under any other policy it does
/// nothing. The settings not listed apply to every policy (`--threshold`, the temperature, the
/// confidences) or to one model family (refused for the other by [`SamplerParams::validate`]).
#[derive(Debug, Clone, Copy)]
pub struct PolicySetting {
    /// The CLI's flag.
    pub flag: &'static str,
    /// The policies that read it.
    pub policies: &'static [Policy],
}

/// Which policies use which setting: the sampler's `official.rs` reads `refresh_every` on the
/// cached passes and `spec_blocks` under `spec`; `mbsd.rs` reads those, `spec_threshold`,
/// `rows` and `revision`, and its side path (`revision.rs`) the revision settings.
pub const POLICY_SETTINGS: &[PolicySetting] = &[
    PolicySetting { flag: "--refresh-every", policies: &[Policy::Prefix, Policy::Dual, Policy::Spec, Policy::Mbsd] },
    PolicySetting { flag: "--spec-blocks", policies: &[Policy::Spec, Policy::Mbsd] },
    PolicySetting { flag: "--spec-threshold", policies: &[Policy::Spec, Policy::Mbsd] },
    PolicySetting { flag: "--rows", policies: &[Policy::Mbsd] },
    PolicySetting { flag: "--revision", policies: &[Policy::Mbsd] },
    PolicySetting { flag: "--side-rows", policies: &[Policy::Mbsd] },
    PolicySetting { flag: "--stable-confidence", policies: &[Policy::Mbsd] },
    PolicySetting { flag: "--stable-checks", policies: &[Policy::Mbsd] },
    PolicySetting { flag: "--revise-confidence", policies: &[Policy::Mbsd] },
];

/// Sampler settings that only some model families' samplers read. Set away from its default
/// on another family, a setting is refused by [`SamplerParams::validate`] by its value; given
/// at its default, by [`unused_setting`] by its flag (the CLI and the settings maps know what
/// was given).
#[derive(Debug, Clone, Copy)]
pub struct FamilySettings {
    pub flags: &'static [&'static str],
    pub families: &'static [Family],
}

/// Which families read which settings (every setting not listed is read by every family).
pub const FAMILY_SETTINGS: &[FamilySettings] = &[
    FamilySettings { flags: &["--remasking", "--cfg", "--logits-eos-inf", "--confidence-eos-eot-inf"], families: &[Family::Llada, Family::LladaMoe] },
    FamilySettings { flags: &["--alg", "--eps", "--alg-temp"], families: &[Family::Dream] },
    FamilySettings { flags: &["--top-p", "--top-k"], families: &[Family::Dream, Family::Llada2Moe] },
    FamilySettings { flags: &["--eos-early-stop", "--editing-threshold", "--max-post-steps"], families: &[Family::Llada2Moe] },
    FamilySettings { flags: &["--policy", "--temperature", "--threshold"], families: &[Family::Llada, Family::LladaMoe, Family::Dream, Family::Llada2Moe] },
    FamilySettings {
        flags: &["--t-min", "--t-max", "--entropy-bound", "--stability-threshold", "--confidence-threshold", "--eos-ids", "--rng"],
        families: &[Family::DiffusionGemma],
    },
];

/// Whose sampler, in a refusal's words.
fn sampler_of(family: Family) -> &'static str {
    match family {
        Family::Llada | Family::LladaMoe => "LLaDA's",
        Family::Dream => "Dream's",
        Family::Llada2Moe => "LLaDA 2.x's",
        Family::DiffusionGemma => "DiffusionGemma's",
    }
}

/// "a, b or c".
fn either(names: &[&str]) -> String {
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// The mbsd settings only its CPU side path (the revision) reads.
const REVISION_FLAGS: [&str; 4] = ["--side-rows", "--stable-confidence", "--stable-checks", "--revise-confidence"];

impl Policy {
    /// Whether this policy reads the setting of `flag` (every setting not in
    /// [`POLICY_SETTINGS`] is read by every policy).
    pub fn uses(self, flag: &str) -> bool {
        POLICY_SETTINGS.iter().find(|s| s.flag == flag).is_none_or(|s| s.policies.contains(&self))
    }
}

/// The first setting `given` says was given (by flag) that `p` on a `family` model does not
/// use (another family's, its policy's, the revision's when it is off, the drafts' when there
/// are none, LLaDA 2.1's editing loop's), as a refusal naming what uses it; `None` if every
/// given setting is used. The CLI asks with the flags typed, not those left at their
/// defaults; the C API has no such distinction (every field has a value), so it does not ask.
pub fn unused_setting(p: &SamplerParams, family: Family, given: impl Fn(&str) -> bool) -> Option<String> {
    unused_by_family(p, family, &given).or_else(|| unused_by_policy(p, &given))
}

/// The family-level part of [`unused_setting`]: another family's settings, the policy
/// settings a family's sampler does not read, LLaDA 2.x's filters at temperature 0 and
/// `--alg` under Dream's block policies. Only the CLI asks it: the settings maps (serve,
/// Python) take OpenAI's habitual fields (`temperature`, `top_p`) and the page's `policy`
/// at their defaults on any model, refusing another family's only away from its default.
pub fn unused_by_family(p: &SamplerParams, family: Family, given: &dyn Fn(&str) -> bool) -> Option<String> {
    let others = FAMILY_SETTINGS.iter().filter(|s| !s.families.contains(&family));
    if let Some((flag, s)) = others.flat_map(|s| s.flags.iter().map(move |&f| (f, s))).find(|&(f, _)| given(f)) {
        let mut users: Vec<&str> = s.families.iter().map(|&f| sampler_of(f)).collect();
        users.dedup();
        return Some(format!("{flag} does nothing on this {} model, so it is refused: only {} sampler reads it", family.name(), either(&users)));
    }
    // DiffusionGemma has no policies; LLaDA 2.x's mbsd computes the rows that need it and has
    // no CPU side path.
    let not_read = match family {
        Family::DiffusionGemma => POLICY_SETTINGS.iter().map(|s| s.flag).find(|&f| given(f)),
        Family::Llada2Moe => ["--rows", "--refresh-every"].into_iter().chain(REVISION_FLAGS).find(|&f| given(f)),
        _ => None,
    };
    if let Some(flag) = not_read {
        return Some(format!("{flag} does nothing on this {} model ({} sampler does not read it), so it is refused", family.name(), sampler_of(family)));
    }
    // LLaDA 2.x draws from the filtered distribution only above temperature 0; at 0 it
    // takes the argmax, which the filters keep.
    if family == Family::Llada2Moe && p.temperature == 0.0 {
        if let Some(flag) = ["--top-p", "--top-k"].into_iter().find(|&f| given(f)) {
            return Some(format!("{flag} does nothing at --temperature 0 (LLaDA 2.x then takes the most likely token, which the filter keeps), so it is refused: give a temperature above 0 to sample"));
        }
    }
    // Fast-dLLM's Dream block code ranks a block's commits by negative entropy whatever alg is.
    if family == Family::Dream && matches!(p.policy, Policy::Prefix | Policy::Dual) && given("--alg") {
        return Some(format!("--alg does nothing under Dream's --policy {} (Fast-dLLM's block code ranks by negative entropy whatever alg says), so it is refused: only --policy exact or mbsd reads it", p.policy.name()));
    }
    None
}

/// The policy-level part of [`unused_setting`]: a setting its policy, the revision when off,
/// the drafts when there are none or LLaDA 2.1's editing loop does not read.
pub fn unused_by_policy(p: &SamplerParams, given: &dyn Fn(&str) -> bool) -> Option<String> {
    // LLaDA 2.1's editing loop has no step schedule; its post steps belong to that loop.
    if p.editing_threshold.is_some() && given("--steps") {
        return Some("--steps does nothing under --editing-threshold (LLaDA 2.1's generate commits by the threshold, at least one token a model call, with no step schedule), so it is refused".into());
    }
    if p.editing_threshold.is_none() && given("--max-post-steps") {
        return Some("--max-post-steps does nothing without --editing-threshold (it bounds LLaDA 2.1's editing calls), so it is refused".into());
    }
    let policy = p.policy;
    if let Some(s) = POLICY_SETTINGS.iter().find(|s| given(s.flag) && !policy.uses(s.flag)) {
        let names: Vec<&str> = s.policies.iter().map(|p| p.name()).collect();
        return Some(format!("{} does nothing under --policy {}, so it is refused: only --policy {} uses it", s.flag, policy.name(), either(&names)));
    }
    if policy == Policy::Mbsd && p.revision == Revision::Off {
        if let Some(flag) = REVISION_FLAGS.into_iter().find(|&f| given(f)) {
            return Some(format!("{flag} does nothing with --revision off (it sets the CPU side path's checks), so it is refused"));
        }
    }
    if matches!(policy, Policy::Spec | Policy::Mbsd) && p.spec_blocks == 0 && given("--spec-threshold") {
        return Some("--spec-threshold does nothing with --spec-blocks 0 (it is the confidence a draft's confirmation needs, and nothing is drafted), so it is refused".into());
    }
    None
}

/// The most threads a thread count may ask for where no plan bounds it (`llada-rt roofline`,
/// `LLADA_THREADS` before a model is open): far above any plan's scratch (the host target's
/// 64), a bound on the threads a typo can make a tool start.
pub const MAX_THREADS: usize = 1024;

/// `LLADA_THREADS`, which replaces "every core" as the default thread count: `None` when
/// unset or empty, else a whole number in `1..=max` (`max`: what the plan provides for, or
/// [`MAX_THREADS`]), or an error naming it and that range: a value that is not one is refused,
/// not ignored.
pub fn env_threads(max: usize) -> Result<Option<usize>> {
    let Some(value) = std::env::var_os("LLADA_THREADS") else { return Ok(None) };
    let text = value.to_string_lossy();
    if text.trim().is_empty() {
        return Ok(None);
    }
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(Error::request(format!("LLADA_THREADS={text:?} must be a whole number in 1..={max} (the threads this run can use); set it in that range, or unset it to use every core"))),
    }
}

/// How a session runs, with the CLI's defaults: the one definition the CLI's session flags
/// and the C API's `llada_session_params` map to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionParams {
    /// The backend that runs the dense graphs.
    pub backend: &'static Backend,
    /// Threads of the host backend's kernels and of the CPU work around the passes, in
    /// `1..=` what the plan provides for. `None`: every core (or `LLADA_THREADS`), at most that.
    pub threads: Option<usize>,
    /// How rotating weights reach their window slots.
    pub staging: StagingMode,
    /// Mixture-of-experts models: where experts run (`None`: hybrid). Refused for a dense
    /// model, as every expert setting is.
    pub experts: Option<ExpertStrategy>,
    /// Mixture-of-experts models: threads of the CPU path beside the accelerator path
    /// (`None`: 1).
    pub cpu_threads: Option<usize>,
}

impl Default for SessionParams {
    fn default() -> Self {
        SessionParams { backend: executor::default_backend(), threads: None, staging: StagingMode::Async, experts: None, cpu_threads: None }
    }
}

impl SessionParams {
    /// Refuses expert settings for a dense model, naming the first one given.
    pub fn check_experts(&self, model: &Model) -> Result<()> {
        if model.header.model.moe.is_some() {
            return Ok(());
        }
        let given = [(Setting::Experts, self.experts.is_some()), (Setting::CpuThreads, self.cpu_threads.is_some())];
        match given.iter().find(|g| g.1) {
            Some(&(setting, _)) => Err(Error::setting(setting, format!("is refused: {} is a dense model; it has no experts", model.path.display()))),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_options() {
        let limits = Limits { max_len: 256, max_rows: 256, dream: false, llada2: false, canvas: None };
        let p = SamplerParams { gen_length: 30, block_length: 8, ..Default::default() };
        assert!(p.validate(&limits).unwrap_err().to_string().contains("--block-len 8 must divide the gen length 30"));
        let p = SamplerParams { gen_length: 32, block_length: 8, steps: 6, ..Default::default() };
        assert!(p.validate(&limits).unwrap_err().to_string().contains("--steps 6"));
    }

    #[test]
    fn llada2_refuses_the_other_samplers_settings_by_flag() {
        let limits = Limits { max_len: 256, max_rows: 256, dream: false, llada2: true, canvas: None };
        let p = SamplerParams { gen_length: 32, block_length: 32, steps: 32, ..Default::default() };
        p.validate(&limits).unwrap();
        let refused = [
            (SamplerParams { remasking: Remasking::Random, ..p }, "--remasking"),
            (SamplerParams { logits_eos_inf: true, ..p }, "--logits-eos-inf"),
            (SamplerParams { confidence_eos_eot_inf: true, ..p }, "--confidence-eos-eot-inf"),
            (SamplerParams { alg: Alg::Entropy, ..p }, "--alg"),
            (SamplerParams { eps: 0.5, ..p }, "--eps"),
            (SamplerParams { alg_temp: Some(1.0), ..p }, "--alg-temp"),
        ];
        for (q, flag) in refused {
            let msg = q.validate(&limits).unwrap_err().to_string();
            assert!(msg.contains(flag) && msg.contains("LLaDA 2.x"), "{msg}");
        }
    }

    #[test]
    fn llada_and_dream_each_refuse_the_others_settings_by_flag() {
        let llada = Limits { max_len: 256, max_rows: 256, dream: false, llada2: false, canvas: None };
        let dream = Limits { dream: true, ..llada };
        let p = SamplerParams { gen_length: 32, block_length: 32, steps: 32, ..Default::default() };
        p.validate(&llada).unwrap();
        p.validate(&dream).unwrap();
        let refused = |q: SamplerParams, l: &Limits, want: &str| {
            let msg = q.validate(l).unwrap_err().to_string();
            assert!(msg.contains(want), "{msg}");
        };
        refused(SamplerParams { alg: Alg::Entropy, ..p }, &llada, "--alg entropy is Dream's");
        refused(SamplerParams { eps: 0.01, ..p }, &llada, "--eps 0.01 is Dream's");
        refused(SamplerParams { top_k: Some(5), ..p }, &llada, "--top-k is an option of Dream's and LLaDA 2.x's samplers");
        refused(SamplerParams { top_k: Some(0), ..p }, &dream, "--top-k 0 must be at least 1");
        refused(SamplerParams { alg_temp: Some(f64::NAN), ..p }, &dream, "--alg-temp NaN must be a finite number");
        // The published code's ranges: a negative alg_temp prefers the least confident, top_p
        // 0 keeps the most likely token only, eps runs to 0, a negative temperature is greedy.
        for q in [SamplerParams { alg_temp: Some(-1.0), ..p }, SamplerParams { top_p: Some(0.0), ..p }, SamplerParams { top_p: Some(1.5), ..p }, SamplerParams { eps: 0.0, ..p }, SamplerParams { eps: 1.0, ..p }, SamplerParams { temperature: -0.5, ..p }] {
            q.validate(&dream).unwrap();
        }
        refused(SamplerParams { temperature: -0.5, ..p }, &llada, "--temperature -0.5 must be a finite number >= 0");
        refused(SamplerParams { top_p: Some(-0.1), ..p }, &dream, "--top-p -0.1 must be a finite number >= 0");
        // Fast-dLLM's threshold mode: its block code's cached policies only, its own confidence.
        SamplerParams { policy: Policy::Dual, block_length: 8, threshold: Some(0.9), ..p }.validate(&dream).unwrap();
        SamplerParams { policy: Policy::Prefix, block_length: 8, threshold: Some(0.3), ..p }.validate(&dream).unwrap();
        refused(SamplerParams { threshold: Some(0.9), ..p }, &dream, "--threshold 0.9: Dream's threshold decoding is Fast-dLLM's block sampler's");
        refused(SamplerParams { policy: Policy::Mbsd, threshold: Some(0.9), ..p }, &dream, "use --policy prefix or dual");
        refused(SamplerParams { policy: Policy::Dual, threshold: Some(0.9), alg: Alg::Entropy, ..p }, &dream, "--alg entropy with --threshold");
        refused(SamplerParams { policy: Policy::Dual, threshold: Some(0.9), alg_temp: Some(0.5), ..p }, &dream, "--alg-temp 0.5 with --threshold");
        refused(SamplerParams { block_length: 8, ..p }, &dream, "--block-len 8: Dream's sampler has no blocks; use --block-len 32");
        refused(SamplerParams { policy: Policy::Spec, ..p }, &dream, "--policy spec is not implemented for Dream");
        refused(SamplerParams { policy: Policy::Mbsd, alg: Alg::Origin, ..p }, &dream, "--alg origin commits at random");
        refused(SamplerParams { policy: Policy::Mbsd, alg: Alg::Entropy, spec_blocks: 1, ..p }, &dream, "--alg entropy's confidence is not a probability");
        SamplerParams { policy: Policy::Mbsd, alg: Alg::Entropy, spec_blocks: 0, revision: Revision::Off, ..p }.validate(&dream).unwrap();
        SamplerParams { policy: Policy::Mbsd, ..p }.validate(&dream).unwrap();
        refused(SamplerParams { remasking: Remasking::Random, ..p }, &dream, "--remasking random is LLaDA's");
        refused(SamplerParams { eps: 1.5, ..p }, &dream, "--eps 1.5 must be between 0 and 1, both included");
        refused(SamplerParams { eps: -0.1, ..p }, &dream, "--eps -0.1 must be between 0 and 1");
    }

    #[test]
    fn a_setting_given_under_a_policy_that_does_not_read_it_is_named_with_its_policies() {
        let given = |flags: &'static [&'static str]| move |f: &str| flags.contains(&f);
        let under = |policy: Policy| SamplerParams { policy, ..Default::default() };
        assert_eq!(unused_setting(&under(Policy::Exact), Family::Llada, given(&["--threshold", "--temperature"])), None);
        assert_eq!(unused_setting(&under(Policy::Mbsd), Family::Llada, given(&["--rows", "--side-rows", "--refresh-every", "--revision"])), None);
        let refused = unused_setting(&under(Policy::Exact), Family::Llada, given(&["--rows"])).unwrap();
        assert_eq!(refused, "--rows does nothing under --policy exact, so it is refused: only --policy mbsd uses it");
        let refused = unused_setting(&under(Policy::Exact), Family::Llada, given(&["--refresh-every"])).unwrap();
        assert!(refused.ends_with("only --policy prefix, dual, spec or mbsd uses it"), "{refused}");
        assert!(unused_setting(&under(Policy::Dual), Family::Llada, given(&["--side-rows"])).unwrap().starts_with("--side-rows does nothing under --policy dual"));
        assert!(unused_setting(&under(Policy::Prefix), Family::Llada, given(&["--spec-threshold"])).unwrap().contains("only --policy spec or mbsd uses it"));
        assert!(Policy::Exact.uses("--threshold") && !Policy::Exact.uses("--spec-blocks") && Policy::Spec.uses("--spec-blocks"));
        // LLaDA 2.1's editing loop has no step schedule; its post steps need it.
        let editing = SamplerParams { editing_threshold: Some(0.9), ..Default::default() };
        assert!(unused_setting(&editing, Family::Llada2Moe, given(&["--steps"])).unwrap().starts_with("--steps does nothing under --editing-threshold"));
        assert_eq!(unused_setting(&editing, Family::Llada2Moe, given(&["--max-post-steps", "--threshold"])), None);
        let llada2 = |p: SamplerParams, flags| unused_setting(&p, Family::Llada2Moe, given(flags));
        assert!(llada2(under(Policy::Exact), &["--max-post-steps"]).unwrap().starts_with("--max-post-steps does nothing without"));
    }

    /// A setting typed at its default is refused where the model's family, or the way the
    /// given settings run, never reads it (set away from its default, `validate` refuses it).
    #[test]
    fn a_setting_given_where_nothing_reads_it_is_refused_even_at_its_default() {
        let given = |flags: &'static [&'static str]| move |f: &str| flags.contains(&f);
        let p = SamplerParams::default();
        let refusal = |p: &SamplerParams, family, flags| unused_setting(p, family, given(flags)).unwrap_or_default();
        assert_eq!(refusal(&p, Family::Llada, &["--alg"]), "--alg does nothing on this llada model, so it is refused: only Dream's sampler reads it");
        assert!(refusal(&p, Family::Dream, &["--remasking"]).ends_with("only LLaDA's sampler reads it"));
        assert!(refusal(&p, Family::Llada, &["--top-k"]).ends_with("only Dream's or LLaDA 2.x's sampler reads it"));
        assert!(refusal(&p, Family::DiffusionGemma, &["--temperature"]).ends_with("only LLaDA's, Dream's or LLaDA 2.x's sampler reads it"));
        assert!(refusal(&p, Family::DiffusionGemma, &["--spec-threshold"]).starts_with("--spec-threshold does nothing on this diffusion-gemma model"));
        assert!(refusal(&p, Family::Llada, &["--rng"]).ends_with("only DiffusionGemma's sampler reads it"));
        assert_eq!(unused_setting(&p, Family::Llada, given(&["--remasking", "--cfg", "--temperature", "--policy"])), None);
        assert_eq!(unused_setting(&p, Family::DiffusionGemma, given(&["--t-min", "--rng", "--eos-ids", "--seed", "--steps"])), None);
        // LLaDA 2.x: the filters at temperature 0, and mbsd's rows and side path.
        assert!(refusal(&p, Family::Llada2Moe, &["--top-p"]).starts_with("--top-p does nothing at --temperature 0"));
        assert_eq!(unused_setting(&SamplerParams { temperature: 0.5, ..p }, Family::Llada2Moe, given(&["--top-p", "--top-k"])), None);
        let mbsd = SamplerParams { policy: Policy::Mbsd, ..p };
        assert!(refusal(&mbsd, Family::Llada2Moe, &["--side-rows"]).starts_with("--side-rows does nothing on this llada2-moe model"));
        // Dream's block code and its alg; mbsd's side path when off; drafts' threshold without drafts.
        assert!(refusal(&SamplerParams { policy: Policy::Dual, ..p }, Family::Dream, &["--alg"]).starts_with("--alg does nothing under Dream's --policy dual"));
        assert_eq!(unused_setting(&p, Family::Dream, given(&["--alg"])), None);
        assert!(refusal(&SamplerParams { revision: Revision::Off, ..mbsd }, Family::Llada, &["--stable-checks"]).starts_with("--stable-checks does nothing with --revision off"));
        assert_eq!(unused_setting(&mbsd, Family::Llada, given(&["--stable-checks"])), None);
        assert!(refusal(&SamplerParams { spec_blocks: 0, ..mbsd }, Family::Llada, &["--spec-threshold"]).starts_with("--spec-threshold does nothing with --spec-blocks 0"));
        assert_eq!(unused_setting(&SamplerParams { spec_blocks: 1, ..mbsd }, Family::Llada, given(&["--spec-threshold"])), None);
    }

    #[test]
    fn every_size_is_bounded_before_anything_is_allocated() {
        let limits = Limits { max_len: 160, max_rows: 64, dream: false, llada2: false, canvas: None };
        let base = SamplerParams { gen_length: 128, block_length: 32, steps: 128, policy: Policy::Mbsd, ..Default::default() };
        base.validate(&limits).unwrap();
        let cases: Vec<(SamplerParams, &str)> = vec![
            (SamplerParams { gen_length: 0, ..base.clone() }, "--gen-len 0 is outside 1..=159"),
            (SamplerParams { gen_length: 160, block_length: 32, ..base.clone() }, "--gen-len 160 is outside 1..=159"),
            (SamplerParams { gen_length: u32::MAX as usize, ..base.clone() }, "--gen-len 4294967295"),
            (SamplerParams { steps: 0, ..base.clone() }, "--steps 0"),
            (SamplerParams { steps: MAX_STEPS + 4, ..base.clone() }, "--steps 65540"),
            (SamplerParams { steps: u32::MAX as usize, ..base.clone() }, "--steps 4294967295"),
            (SamplerParams { spec_blocks: 5, ..base.clone() }, "--spec-blocks 5 is outside 0..=4"),
            (SamplerParams { spec_blocks: u32::MAX as usize, ..base.clone() }, "--spec-blocks 4294967295"),
            (SamplerParams { side_rows: Some(0), ..base.clone() }, "--side-rows 0 is outside 2..=64"),
            (SamplerParams { side_rows: Some(65), ..base.clone() }, "--side-rows 65"),
            (SamplerParams { rows: Some(0), ..base.clone() }, "--rows 0 is outside 1..=64"),
            (SamplerParams { refresh_every: 33, ..base.clone() }, "--refresh-every 33 is outside 0..=32"),
            (SamplerParams { cfg_scale: f64::NAN, ..base.clone() }, "--cfg NaN"),
            (SamplerParams { threshold: Some(1.5), ..base.clone() }, "--threshold 1.5"),
        ];
        for (p, want) in cases {
            let e = p.validate(&limits).unwrap_err();
            assert!(matches!(e, Error::Setting { .. }), "{e}");
            assert!(e.to_string().contains(want), "{e} does not say {want}");
        }
        assert_eq!(SamplerParams { spec_blocks: 4, side_rows: Some(64), rows: Some(1), ..base.clone() }.validate(&limits).unwrap(), 32);
        // Whatever the policy: a size typed is checked even where it is not used.
        let exact = SamplerParams { policy: Policy::Exact, spec_blocks: u32::MAX as usize, ..base.clone() };
        assert!(exact.validate(&limits).unwrap_err().to_string().contains("--spec-blocks 4294967295"));
        assert_eq!(SamplerParams::default_spec_blocks(Policy::Mbsd, 2, 32, 32), 0);
        assert_eq!(SamplerParams::default_spec_blocks(Policy::Mbsd, 2, 128, 32), 2);
        assert_eq!(SamplerParams::default_spec_blocks(Policy::Spec, 2, 128, 32), 1);
    }

}
