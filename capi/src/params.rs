//! Generation settings as a C struct, and their translation to the sampler's.

use llada_rt::sampler::{Policy as RtPolicy, Revision};
use llada_rt::{Model, Remasking as RtRemasking, SamplerParams};

use crate::error::Failure;

/// Which rows each forward pass recomputes (llada-rt's `--policy`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// The whole sequence every step: the official sampler, exactly.
    Exact = 0,
    /// The block and what follows it; the prefix's keys and values cached.
    Prefix = 1,
    /// The block only; prefix and suffix cached.
    Dual = 2,
    /// `Prefix`, plus drafts of the next blocks confirmed once their block is current.
    Spec = 3,
    /// Multi-block speculative decoding on the plan's row buckets, committed tokens re-checked
    /// on the CPU side path.
    Mbsd = 4,
}

/// Which masked positions commit first (llada-rt's `--remasking`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remasking {
    /// The most confident predictions.
    LowConfidence = 0,
    /// A random order (seeded by `seed`).
    Random = 1,
}

/// Settings of one generation. Start from `llada_default_params()` and change what you need;
/// each field matches the llada-rt option named in its comment and has its range; a field out
/// of range is LLADA_STATUS_INVALID_ARGUMENT with a message naming it (`params.FIELD`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Tokens to generate, a multiple of the block length (`--gen-len`). Default 128.
    pub gen_len: u32,
    /// Semi-autoregressive block length (`--block-len`); 0 takes the length the artifact was
    /// compiled for. Default 0.
    pub block_len: u32,
    /// Denoising steps over all blocks, a multiple of the number of blocks (`--steps`).
    /// Default 128.
    pub steps: u32,
    /// 0 takes the most likely token; above 0, Gumbel-max sampling at this temperature
    /// (`--temperature`). Default 0.
    pub temperature: f64,
    /// Seed of the sampling and random-remasking noise: same seed, same output (`--seed`).
    /// Default 0.
    pub seed: u64,
    /// Classifier-free guidance scale, 0 for none (`--cfg`). Default 0.
    pub cfg_scale: f64,
    /// Which masked positions commit first, a llada_remasking value (`--remasking`).
    /// Default LLADA_REMASKING_LOW_CONFIDENCE.
    pub remasking: u32,
    /// Which rows each pass recomputes, a llada_policy value (`--policy`). Default
    /// LLADA_POLICY_EXACT.
    pub policy: u32,
    /// Cached policies: recompute the whole sequence every this many steps of a block, 0 for
    /// only at each block's start (`--refresh-every`). Default 0.
    pub refresh_every: u32,
    /// Above 0: commit every masked position of the block whose confidence reaches this
    /// value, at least one per step, instead of the fixed schedule (`--threshold`, at most 1).
    /// 0 keeps the fixed schedule. Default 0.
    pub threshold: f32,
    /// SPEC and MBSD: blocks drafted ahead of the current one, 0 for the default (SPEC 1, MBSD
    /// the artifact's compiled depth) (`--spec-blocks`). Default 0.
    pub spec_blocks: u32,
    /// True: the prompt is the user's turn, wrapped in the model's chat template (`--chat`).
    /// False: the prompt is tokenized as it is. Default true.
    pub chat: bool,
    /// Never predict end-of-text (the official `logits_eos_inf`). Default false.
    pub logits_eos_inf: bool,
    /// End-of-text and end-of-turn predictions get zero confidence (the official
    /// `confidence_eos_eot_inf`). Default false.
    pub confidence_eos_eot_inf: bool,
}

/// The settings `llada-rt run` uses when given no options, with `chat` on.
#[unsafe(no_mangle)]
pub extern "C" fn llada_default_params() -> Params {
    let d = SamplerParams::default();
    Params {
        gen_len: d.gen_length as u32,
        block_len: 0,
        steps: d.steps as u32,
        temperature: d.temperature,
        seed: d.seed,
        cfg_scale: d.cfg_scale,
        remasking: Remasking::LowConfidence as u32,
        policy: Policy::Exact as u32,
        refresh_every: d.refresh_every as u32,
        threshold: 0.0,
        spec_blocks: 0,
        chat: true,
        logits_eos_inf: d.logits_eos_inf,
        confidence_eos_eot_inf: d.confidence_eos_eot_inf,
    }
}

impl Params {
    /// The sampler's settings, the artifact's plan filling what is left at 0, as llada-rt
    /// does. The enum fields are plain integers (C may store any value in them; a Rust enum
    /// holding an undeclared value would be undefined behaviour): an undeclared one is refused.
    pub(crate) fn sampler(&self, model: &Model) -> Result<SamplerParams, Failure> {
        let plan = &model.header.plan;
        let policy = match self.policy {
            0 => RtPolicy::Exact,
            1 => RtPolicy::Prefix,
            2 => RtPolicy::Dual,
            3 => RtPolicy::Spec,
            4 => RtPolicy::Mbsd,
            n => return Err(Failure::argument(format!("params.policy: {n} is not a llada_policy"))),
        };
        let remasking = match self.remasking {
            0 => RtRemasking::LowConfidence,
            1 => RtRemasking::Random,
            n => return Err(Failure::argument(format!("params.remasking: {n} is not a llada_remasking"))),
        };
        // 0 is off; the rest of the range is the sampler's check (`validate`).
        let threshold = (self.threshold != 0.0).then_some(self.threshold);
        let block_length = if self.block_len == 0 { plan.block_len as usize } else { self.block_len as usize };
        let spec_default = SamplerParams::default_spec_blocks(policy, plan.spec_blocks as usize, self.gen_len as usize, block_length);
        let defaults = SamplerParams::default();
        Ok(SamplerParams {
            gen_length: self.gen_len as usize,
            block_length,
            steps: self.steps as usize,
            temperature: self.temperature,
            cfg_scale: self.cfg_scale,
            remasking,
            seed: self.seed,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
            policy,
            refresh_every: self.refresh_every as usize,
            threshold,
            spec_blocks: if self.spec_blocks == 0 { spec_default } else { self.spec_blocks as usize },
            revision: Revision::DualPath,
            ..defaults
        })
    }
}
