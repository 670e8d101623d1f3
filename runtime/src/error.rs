//! The runtime's error type. Messages name the file, option or value at fault and say what to
//! change.

use std::path::PathBuf;

pub use llada_ir::FileError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    File(FileError),
    #[error("{}: {source}", path.display())]
    Artifact { path: PathBuf, source: llada_ir::Error },
    /// A request the sampler or the plan cannot serve (bad settings, too long a prompt).
    #[error("{0}")]
    Request(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("{}: {msg}", path.display())]
    Input { path: PathBuf, msg: String },
    /// The artifact shrank on disk after it was loaded and verified.
    #[error(
        "{}: the artifact changed on disk while in use (truncated in place); load it again. To update an artifact under a running app, write the new one to another file and rename it over the old",
        path.display()
    )]
    Changed { path: PathBuf },
    /// The caller stopped a generation between steps.
    #[error("generation cancelled")]
    Cancelled,
    /// A setting a user or an app gave is outside its range (named as the CLI's flag; the C
    /// API names its field instead).
    #[error("{} {message}", setting.flag())]
    Setting { setting: Setting, message: String },
    /// The accelerator backend failed (a Vulkan call returned an error, the device was lost).
    #[error("{0}")]
    Device(String),
    /// A fault of the runtime itself (a worker thread panicked), not of the request.
    #[error("internal error: {0}")]
    Internal(String),
}

/// A value a user or an app sets: every one is range-checked in one place
/// (`SamplerParams::validate`, `Session` for threads) before anything is allocated for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    GenLength,
    BlockLength,
    Steps,
    Temperature,
    CfgScale,
    RefreshEvery,
    Threshold,
    SpecBlocks,
    SpecThreshold,
    Rows,
    SideRows,
    StableConfidence,
    StableChecks,
    ReviseConfidence,
    Threads,
    CpuThreads,
    Backend,
    Experts,
    Alg,
    Eps,
    Policy,
    Remasking,
    TopP,
    TopK,
    AlgTemp,
    Seed,
    Revision,
    LogitsEosInf,
    ConfidenceEosEotInf,
    EosEarlyStop,
    EditingThreshold,
    MaxPostSteps,
    TMin,
    TMax,
    EntropyBound,
    StabilityThreshold,
    ConfidenceThreshold,
    EosIds,
    Rng,
}

impl Setting {
    /// The setting whose `llada-rt` flag is `flag`.
    pub fn of_flag(flag: &str) -> Option<Setting> {
        use Setting::*;
        [GenLength, BlockLength, Steps, Temperature, CfgScale, RefreshEvery, Threshold, SpecBlocks, SpecThreshold, Rows, SideRows, StableConfidence, StableChecks, ReviseConfidence, Threads, CpuThreads, Backend, Experts, Alg, Eps, Policy, Remasking, TopP, TopK, AlgTemp, Seed, Revision, LogitsEosInf, ConfidenceEosEotInf, EosEarlyStop, EditingThreshold, MaxPostSteps, TMin, TMax, EntropyBound, StabilityThreshold, ConfidenceThreshold, EosIds, Rng]
            .into_iter()
            .find(|s| s.flag() == flag)
    }

    /// The `llada-rt` flag.
    pub fn flag(self) -> &'static str {
        match self {
            Setting::GenLength => "--gen-len",
            Setting::BlockLength => "--block-len",
            Setting::Steps => "--steps",
            Setting::Temperature => "--temperature",
            Setting::CfgScale => "--cfg",
            Setting::RefreshEvery => "--refresh-every",
            Setting::Threshold => "--threshold",
            Setting::SpecBlocks => "--spec-blocks",
            Setting::SpecThreshold => "--spec-threshold",
            Setting::Rows => "--rows",
            Setting::SideRows => "--side-rows",
            Setting::StableConfidence => "--stable-confidence",
            Setting::StableChecks => "--stable-checks",
            Setting::ReviseConfidence => "--revise-confidence",
            Setting::Threads => "--threads",
            Setting::CpuThreads => "--cpu-threads",
            Setting::Backend => "--backend",
            Setting::Experts => "--experts",
            Setting::Alg => "--alg",
            Setting::Eps => "--eps",
            Setting::Policy => "--policy",
            Setting::Remasking => "--remasking",
            Setting::TopP => "--top-p",
            Setting::TopK => "--top-k",
            Setting::AlgTemp => "--alg-temp",
            Setting::Seed => "--seed",
            Setting::Revision => "--revision",
            Setting::LogitsEosInf => "--logits-eos-inf",
            Setting::ConfidenceEosEotInf => "--confidence-eos-eot-inf",
            Setting::EosEarlyStop => "--eos-early-stop",
            Setting::EditingThreshold => "--editing-threshold",
            Setting::MaxPostSteps => "--max-post-steps",
            Setting::TMin => "--t-min",
            Setting::TMax => "--t-max",
            Setting::EntropyBound => "--entropy-bound",
            Setting::StabilityThreshold => "--stability-threshold",
            Setting::ConfidenceThreshold => "--confidence-threshold",
            Setting::EosIds => "--eos-ids",
            Setting::Rng => "--rng",
        }
    }

    /// The field of the C API's `llada_params` (or argument) that carries it.
    pub fn c_field(self) -> &'static str {
        match self {
            Setting::GenLength => "params.gen_len",
            Setting::BlockLength => "params.block_len",
            Setting::Steps => "params.steps",
            Setting::Temperature => "params.temperature",
            Setting::CfgScale => "params.cfg_scale",
            Setting::RefreshEvery => "params.refresh_every",
            Setting::Threshold => "params.threshold",
            Setting::SpecBlocks => "params.spec_blocks",
            Setting::SpecThreshold => "params.spec_threshold",
            Setting::Rows => "params.rows",
            Setting::SideRows => "params.side_rows",
            Setting::StableConfidence => "params.stable_confidence",
            Setting::StableChecks => "params.stable_checks",
            Setting::ReviseConfidence => "params.revise_confidence",
            Setting::Threads => "n_threads",
            Setting::CpuThreads => "cpu_threads",
            Setting::Backend => "backend",
            Setting::Experts => "experts",
            Setting::Alg => "params.alg",
            Setting::Eps => "params.eps",
            Setting::Policy => "params.policy",
            Setting::Remasking => "params.remasking",
            Setting::TopP => "params.top_p",
            Setting::TopK => "params.top_k",
            Setting::AlgTemp => "params.alg_temp",
            Setting::Seed => "params.seed",
            Setting::Revision => "params.revision",
            Setting::LogitsEosInf => "params.logits_eos_inf",
            Setting::ConfidenceEosEotInf => "params.confidence_eos_eot_inf",
            Setting::EosEarlyStop => "params.eos_early_stop",
            Setting::EditingThreshold => "params.editing_threshold",
            Setting::MaxPostSteps => "params.max_post_steps",
            Setting::TMin => "params.t_min",
            Setting::TMax => "params.t_max",
            Setting::EntropyBound => "params.entropy_bound",
            Setting::StabilityThreshold => "params.stability_threshold",
            Setting::ConfidenceThreshold => "params.confidence_threshold",
            Setting::EosIds => "params.eos_ids",
            Setting::Rng => "params.rng",
        }
    }
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::File(FileError::new(path, source))
    }

    pub fn request(msg: impl Into<String>) -> Self {
        Error::Request(msg.into())
    }

    /// `setting` is out of range: `message` follows the setting's name and says the range.
    pub fn setting(setting: Setting, message: impl Into<String>) -> Self {
        Error::Setting { setting, message: message.into() }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A QNN failure: a missing library is the user's to fix, named as `--backend qnn` (status 2,
/// with how to get it); a failed call is the device's.
#[cfg(all(feature = "qnn", not(target_env = "musl")))]
impl From<llada_qnn::Error> for Error {
    fn from(e: llada_qnn::Error) -> Error {
        match e {
            llada_qnn::Error::Missing(m) => Error::setting(Setting::Backend, format!("qnn: {m}")),
            other => Error::Device(other.to_string()),
        }
    }
}
