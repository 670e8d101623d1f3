//! Generation settings as a C struct, and their translation to the sampler's.

use llada_rt::executor;
use llada_rt::moe::ExpertStrategy;
use llada_rt::sampler::{Alg as RtAlg, Policy as RtPolicy, Revision as RtRevision};
use llada_rt::staging::StagingMode;
use llada_rt::params::{EosIds, Rng};
use llada_rt::{Model, Remasking as RtRemasking, SamplerParams, SessionParams};

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

/// Dream's confidence rule (llada-rt's `--alg`; LLaDA models take `remasking`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alg {
    /// The highest probability of the prediction.
    MaskgitPlus = 0,
    /// The top probability minus the second.
    TopkMargin = 1,
    /// The negative entropy of the prediction.
    Entropy = 2,
    /// Each masked position with probability 1 - s/t, in random order.
    Origin = 3,
}

/// DiffusionGemma: the random stream its sampler draws from (llada-rt's `--rng`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandomStream {
    /// A counter-based stream of the same distributions, rows in parallel.
    Fast = 0,
    /// PyTorch's CPU stream draw for draw: transformers' `generate` under the same seed.
    Torch = 1,
}

/// `MBSD`: whether committed tokens stay revisable (llada-rt's `--revision`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revision {
    /// Committed tokens are re-checked on a CPU side path and may be revised.
    DualPath = 0,
    /// Commits are final.
    Off = 1,
    /// DUAL_PATH where the dense path leaves the CPU free (a GPU), OFF where it runs on the
    /// same cores (the host backend, lavapipe).
    Auto = 2,
}

/// Settings of one generation. Start from `llada_default_params()` and change what you need;
/// each field matches the llada-rt option named in its comment and has its range; a field out
/// of range is LLADA_STATUS_INVALID_ARGUMENT with a message naming it (`params.FIELD`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Tokens to generate, a multiple of the block length (`--gen-len`); 0 takes the model's
    /// default (128; DiffusionGemma: its generation config's `max_new_tokens`). Default 0.
    pub gen_len: u32,
    /// Semi-autoregressive block length (`--block-len`); 0 takes the length the artifact was
    /// compiled for (DiffusionGemma: its canvas). Default 0.
    pub block_len: u32,
    /// Denoising steps over all blocks, a multiple of the number of blocks (`--steps`); for
    /// LLaDA 2.x, steps per block. 0 takes the model's default (128; LLaDA 2.x: its published
    /// 32 per block). Default 0.
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
    /// 0 keeps the fixed schedule (so `--threshold 0` itself has no equivalent here). Default 0.
    pub threshold: f32,
    /// SPEC and MBSD: blocks drafted ahead of the current one (`--spec-blocks`); below 0 the
    /// default (SPEC 1, MBSD the artifact's compiled depth). Default -1.
    pub spec_blocks: i32,
    /// SPEC and MBSD: confidence a draft needs when its block becomes current
    /// (`--spec-threshold`, 0 to 1). Default 0.99.
    pub spec_threshold: f32,
    /// MBSD: fewest rows a dense pass computes (`--rows`); 0 for the plan's smallest latency
    /// bucket. Default 0.
    pub rows: u32,
    /// MBSD: a llada_revision value (`--revision`). Default LLADA_REVISION_AUTO.
    pub revision: u32,
    /// MBSD revision: rows of one side-path pass, two per checked token (`--side-rows`); 0
    /// for the plan's smallest latency bucket. Default 0.
    pub side_rows: u32,
    /// MBSD revision: an agreeing check at or above this confidence makes a token stable
    /// (`--stable-confidence`, 0 to 1). Default 0.9.
    pub stable_confidence: f32,
    /// MBSD revision: this many agreeing checks make a token stable (`--stable-checks`, at
    /// least 1). Default 2.
    pub stable_checks: u32,
    /// MBSD revision: a disagreeing check at or above this confidence revises the token
    /// (`--revise-confidence`, 0 to 1). Default 0.5.
    pub revise_confidence: f32,
    /// True: the prompt is the user's turn, wrapped in the model's chat template (`--chat`).
    /// False: the prompt is tokenized as it is. Default true.
    pub chat: bool,
    /// Never predict end-of-text (the official `logits_eos_inf`). Default false.
    pub logits_eos_inf: bool,
    /// End-of-text and end-of-turn predictions get zero confidence (the official
    /// `confidence_eos_eot_inf`). Default false.
    pub confidence_eos_eot_inf: bool,
    /// Dream: its sampler's confidence rule, a llada_alg value (`--alg`). Default
    /// LLADA_ALG_MASKGIT_PLUS.
    pub alg: u32,
    /// Dream: its schedule runs from timestep 1 down to this (`--eps`, 0 to 1 inclusive).
    /// Default 0.001.
    pub eps: f64,
    /// Dream: nucleus filtering of each prediction (`--top-p` above 0; 1 or more keeps all); 0
    /// for none (`--top-p 0`, the most likely token only, is `top_k` 1 here). Default 0.
    pub top_p: f64,
    /// Dream: keep only the k most likely tokens of each prediction (`--top-k`); 0 for all.
    /// Default 0.
    pub top_k: u32,
    /// Dream: above 0, the positions a step commits are drawn from the softmax of their
    /// confidences over this temperature (`--alg-temp`); 0 takes the most confident. Default 0.
    pub alg_temp: f64,
    /// LLaDA 2.x: stop at the step that commits end-of-text once every position before it is
    /// committed; with `editing_threshold` (2.1's generate), after the block holding it (the
    /// published `eos_early_stop`, `--eos-early-stop`). Default false.
    pub eos_early_stop: bool,
    /// LLaDA 2.1: token editing (`--editing-threshold`, 0 to 1; its published default is 0.9):
    /// each call also replaces a committed token of the block whose new prediction differs
    /// with a confidence above this. Below 0: off (LLaDA 2.0's generate). Default -1.
    pub editing_threshold: f32,
    /// LLaDA 2.1 editing: the most calls a block takes after its last mask is committed
    /// (`--max-post-steps`). Default 16.
    pub max_post_steps: u32,
    /// DiffusionGemma: the temperature at the last step (`--t-min`); 0 takes the
    /// checkpoint's, below 0 is none (no schedule, with `t_max`). Default 0.
    pub t_min: f64,
    /// DiffusionGemma: the temperature at the first step (`--t-max`); as `t_min`. Default 0.
    pub t_max: f64,
    /// DiffusionGemma: a step accepts the lowest-entropy positions while the entropies
    /// before them sum to at most this (`--entropy-bound`); 0 takes the checkpoint's.
    /// Default 0.
    pub entropy_bound: f64,
    /// DiffusionGemma: a canvas ends once its argmax canvas held this many steps and the
    /// mean entropy is below `confidence_threshold` (`--stability-threshold`); -1 takes the
    /// checkpoint's, below -1 is none (never early). Default -1.
    pub stability_threshold: i32,
    /// DiffusionGemma: see `stability_threshold` (`--confidence-threshold`); 0 takes the
    /// checkpoint's, below 0 is none. Default 0.
    pub confidence_threshold: f64,
    /// DiffusionGemma: `n_eos_ids` token ids that end the generation (`--eos-ids`, at most
    /// 8); NULL takes the checkpoint's, a non-NULL pointer with `n_eos_ids` 0 is none. Read
    /// during `llada_generate` only. Default NULL.
    pub eos_ids: *const u32,
    pub n_eos_ids: usize,
    /// DiffusionGemma: a llada_random_stream value (`--rng`). Default
    /// LLADA_RANDOM_STREAM_FAST.
    pub rng: u32,
}

/// The settings `llada-rt run` uses when given no options, with `chat` on.
#[unsafe(no_mangle)]
pub extern "C" fn llada_default_params() -> Params {
    let d = SamplerParams::default();
    Params {
        gen_len: 0,
        block_len: 0,
        steps: 0,
        temperature: d.temperature,
        seed: d.seed,
        cfg_scale: d.cfg_scale,
        remasking: match d.remasking {
            RtRemasking::LowConfidence => Remasking::LowConfidence,
            RtRemasking::Random => Remasking::Random,
        } as u32,
        policy: match d.policy {
            RtPolicy::Exact => Policy::Exact,
            RtPolicy::Prefix => Policy::Prefix,
            RtPolicy::Dual => Policy::Dual,
            RtPolicy::Spec => Policy::Spec,
            RtPolicy::Mbsd => Policy::Mbsd,
        } as u32,
        refresh_every: d.refresh_every as u32,
        threshold: d.threshold.unwrap_or(0.0),
        spec_blocks: -1,
        spec_threshold: d.spec_threshold,
        rows: d.rows.unwrap_or(0) as u32,
        revision: match d.revision {
            RtRevision::DualPath => Revision::DualPath,
            RtRevision::Off => Revision::Off,
            RtRevision::Auto => Revision::Auto,
        } as u32,
        side_rows: d.side_rows.unwrap_or(0) as u32,
        stable_confidence: d.stable_confidence,
        stable_checks: d.stable_checks,
        revise_confidence: d.revise_confidence,
        chat: true,
        logits_eos_inf: d.logits_eos_inf,
        confidence_eos_eot_inf: d.confidence_eos_eot_inf,
        alg: match d.alg {
            RtAlg::MaskgitPlus => Alg::MaskgitPlus,
            RtAlg::TopkMargin => Alg::TopkMargin,
            RtAlg::Entropy => Alg::Entropy,
            RtAlg::Origin => Alg::Origin,
        } as u32,
        eps: d.eps,
        top_p: d.top_p.unwrap_or(0.0),
        top_k: d.top_k.unwrap_or(0) as u32,
        alg_temp: d.alg_temp.unwrap_or(0.0),
        eos_early_stop: d.eos_early_stop,
        editing_threshold: d.editing_threshold.unwrap_or(-1.0),
        max_post_steps: d.max_post_steps as u32,
        t_min: 0.0,
        t_max: 0.0,
        entropy_bound: 0.0,
        stability_threshold: -1,
        confidence_threshold: 0.0,
        eos_ids: std::ptr::null(),
        n_eos_ids: 0,
        rng: RandomStream::Fast as u32,
    }
}

/// A DiffusionGemma setting that `None` turns off: 0 takes `default`, below 0 is none (a NaN
/// is neither: the sampler's check refuses it).
fn or_none(value: f64, default: Option<f64>) -> Option<f64> {
    match value {
        0.0 => default,
        v if v < 0.0 => None,
        v => Some(v),
    }
}

impl Params {
    /// The sampler's settings, the artifact's plan filling what is left to it, as llada-rt
    /// does. The enum fields are plain integers (C may store any value in them; a Rust enum
    /// holding an undeclared value would be undefined behaviour): an undeclared one is refused.
    /// # Safety
    /// `eos_ids`, where not NULL, points to `n_eos_ids` readable ids (the header's contract).
    pub(crate) unsafe fn sampler(&self, model: &Model) -> Result<SamplerParams, Failure> {
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
        let revision = match self.revision {
            0 => RtRevision::DualPath,
            1 => RtRevision::Off,
            2 => RtRevision::Auto,
            n => return Err(Failure::argument(format!("params.revision: {n} is not a llada_revision"))),
        };
        // 0 is off; the rest of the range is the sampler's check (`validate`).
        let threshold = (self.threshold != 0.0).then_some(self.threshold);
        let alg = match self.alg {
            0 => RtAlg::MaskgitPlus,
            1 => RtAlg::TopkMargin,
            2 => RtAlg::Entropy,
            3 => RtAlg::Origin,
            n => return Err(Failure::argument(format!("params.alg: {n} is not a llada_alg"))),
        };
        let gen_length = match self.gen_len {
            0 => SamplerParams::for_model(model, None, None, policy).gen_length,
            n => n as usize,
        };
        // Dream's sampler has no blocks: 0 takes the whole generation as one.
        let block_length = match self.block_len {
            0 if model.is_dream() => gen_length,
            // DiffusionGemma: its canvas.
            0 if model.diffusion_gemma().is_some() => model.diffusion_gemma().map_or(0, |dg| dg.canvas_length as usize),
            0 => plan.block_len as usize,
            n => n as usize,
        };
        let defaults = SamplerParams::for_model(model, Some(gen_length), Some(block_length), policy);
        let given = |n: u32| (n != 0).then_some(n as usize);
        Ok(SamplerParams {
            gen_length,
            block_length,
            steps: if self.steps == 0 { defaults.steps } else { self.steps as usize },
            temperature: self.temperature,
            cfg_scale: self.cfg_scale,
            remasking,
            seed: self.seed,
            logits_eos_inf: self.logits_eos_inf,
            confidence_eos_eot_inf: self.confidence_eos_eot_inf,
            policy,
            refresh_every: self.refresh_every as usize,
            threshold,
            spec_blocks: usize::try_from(self.spec_blocks).unwrap_or(defaults.spec_blocks),
            spec_threshold: self.spec_threshold,
            rows: given(self.rows),
            revision,
            side_rows: given(self.side_rows),
            stable_confidence: self.stable_confidence,
            stable_checks: self.stable_checks,
            revise_confidence: self.revise_confidence,
            alg,
            eps: self.eps,
            // 0 is off, as for `threshold`; the rest of the range is the sampler's check.
            top_p: (self.top_p != 0.0).then_some(self.top_p),
            top_k: (self.top_k != 0).then_some(self.top_k as usize),
            alg_temp: (self.alg_temp != 0.0).then_some(self.alg_temp),
            eos_early_stop: self.eos_early_stop,
            // Below 0 is off; the rest of the range is the sampler's check. (A NaN is not
            // below 0: refused there.)
            editing_threshold: (!(self.editing_threshold < 0.0)).then_some(self.editing_threshold),
            max_post_steps: self.max_post_steps as usize,
            // DiffusionGemma: 0 (-1, NULL) the checkpoint's; below it none; the rest of the
            // range is the sampler's check (which also refuses them set on another model).
            t_min: or_none(self.t_min, defaults.t_min),
            t_max: or_none(self.t_max, defaults.t_max),
            entropy_bound: if self.entropy_bound == 0.0 { defaults.entropy_bound } else { self.entropy_bound },
            stability_threshold: match self.stability_threshold {
                -1 => defaults.stability_threshold,
                n if n < -1 => None,
                n => Some(n as usize),
            },
            confidence_threshold: or_none(self.confidence_threshold, defaults.confidence_threshold),
            eos_ids: match self.eos_ids.is_null() {
                true => defaults.eos_ids,
                false => {
                    // SAFETY: not NULL, so `n_eos_ids` readable ids (this function's contract);
                    // counts past the sampler's limit are refused before the read.
                    if self.n_eos_ids > llada_rt::params::MAX_EOS_IDS {
                        return Err(Failure::argument(format!("params.n_eos_ids: {} is more than {}", self.n_eos_ids, llada_rt::params::MAX_EOS_IDS)));
                    }
                    let ids = unsafe { std::slice::from_raw_parts(self.eos_ids, self.n_eos_ids) };
                    EosIds::new(ids).map_err(|e| Failure::argument(format!("params.eos_ids: {e}")))?
                }
            },
            rng: match self.rng {
                n if n == RandomStream::Fast as u32 => Rng::Fast,
                n if n == RandomStream::Torch as u32 => Rng::Torch,
                n => return Err(Failure::argument(format!("params.rng: {n} is not a llada_random_stream"))),
            },
        })
    }
}

/// What runs a session's dense graphs: the built-in backends' numbers, which are their
/// indexes among the registered ones (`llada_backend_count`, `llada_backend_name`,
/// `llada_backend_find` give every backend of this build by name).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The CPU's kernels.
    Host = 0,
    /// A Vulkan device (the phone's GPU), found when the session is made; where there is none
    /// `llada_session_new_on` fails with `LLADA_STATUS_INVALID_ARGUMENT` naming `backend`.
    Vulkan = 1,
    /// Qualcomm's HTP (the phone's NPU) through the QNN library in `LLADA_QNN_LIB`, running
    /// the executables of an artifact compiled for a Snapdragon target; without the library
    /// `llada_session_new_on` fails with `LLADA_STATUS_INVALID_ARGUMENT` naming `backend`,
    /// and on an artifact without NPU executables with `LLADA_STATUS_INVALID_REQUEST`.
    Qnn = 2,
}

/// How rotating weights reach their window slots (llada-rt's `--staging`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// A staging thread copies each segment ahead of the pass that needs it.
    Async = 0,
    /// Each segment is read when it is needed (for comparison).
    Sync = 1,
}

/// Mixture-of-experts models: where experts run (llada-rt's `--experts`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experts {
    /// Not set: hybrid for a mixture-of-experts model; a dense model accepts only this.
    Default = 0,
    Hybrid = 1,
    Lru = 2,
    Static = 3,
}

/// Settings of a session. Start from `llada_default_session_params()`; each field matches
/// the llada-rt option named in its comment.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    /// Threads of the host backend's kernels and of the CPU work around the passes
    /// (`--threads`); 0 for every core (or the LLADA_THREADS environment variable), at most
    /// what the artifact provides for. Default 0.
    pub n_threads: u32,
    /// A backend's number (`--backend`): a llada_backend value, or the index
    /// `llada_backend_find` gives for a backend's name. Default LLADA_BACKEND_HOST.
    pub backend: u32,
    /// A llada_staging value (`--staging`). Default LLADA_STAGING_ASYNC.
    pub staging: u32,
    /// A llada_experts value (`--experts`). Default LLADA_EXPERTS_DEFAULT.
    pub experts: u32,
    /// Mixture-of-experts models: threads of the CPU path beside the accelerator path
    /// (`--cpu-threads`); 0 for the default, 1. Default 0.
    pub cpu_threads: u32,
}

/// The session settings `llada-rt run` uses when given no options.
#[unsafe(no_mangle)]
pub extern "C" fn llada_default_session_params() -> SessionSettings {
    let d = SessionParams::default();
    SessionSettings {
        n_threads: d.threads.unwrap_or(0) as u32,
        backend: backend_index(d.backend.name).unwrap_or(Backend::Host as u32),
        staging: match d.staging {
            StagingMode::Async => Staging::Async,
            StagingMode::Sync => Staging::Sync,
        } as u32,
        experts: Experts::Default as u32,
        cpu_threads: d.cpu_threads.unwrap_or(0) as u32,
    }
}

impl SessionSettings {
    /// The runtime's settings; an undeclared enum value is refused, naming the field.
    pub(crate) fn session(&self) -> Result<SessionParams, Failure> {
        let backend = executor::BACKENDS.get(self.backend as usize).ok_or_else(|| {
            let listed: Vec<String> = executor::names().iter().enumerate().map(|(i, n)| format!("{i} {n}")).collect();
            Failure::argument(format!("backend {} is not an llada_backend value nor a registered backend's number; the backends are {}", self.backend, listed.join(", ")))
        })?;
        let staging = match self.staging {
            0 => StagingMode::Async,
            1 => StagingMode::Sync,
            other => return Err(Failure::argument(format!("staging {other} is not an llada_staging value"))),
        };
        let experts = match self.experts {
            0 => None,
            1 => Some(ExpertStrategy::Hybrid),
            2 => Some(ExpertStrategy::Lru),
            3 => Some(ExpertStrategy::Static),
            other => return Err(Failure::argument(format!("experts {other} is not an llada_experts value"))),
        };
        let given = |n: u32| (n != 0).then_some(n as usize);
        Ok(SessionParams { backend, threads: given(self.n_threads), staging, experts, cpu_threads: given(self.cpu_threads) })
    }
}

/// The number of the registered backend named `name` (its index in the registry).
pub(crate) fn backend_index(name: &str) -> Option<u32> {
    executor::BACKENDS.iter().position(|b| b.name == name).map(|i| i as u32)
}
