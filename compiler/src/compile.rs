//! `lladac compile`: checkpoint directory -> artifact.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use llada_ir::packing::{pack_panel, PANEL};
use llada_ir::window::{ActivationScales, ACTIVATION_BLOCK};
use llada_ir::npu::NpuWeights;
use llada_ir::{ArtifactWriter, CompileInfo, DType, Family, Header, KvDType, ModelConfig, MoeConfig, Plan, TensorId};

use crate::convert::{convert, first_overflow, first_overflow_raw, to_f32};
use crate::error::{Error, Result};
use crate::hf::checkpoint::{Checkpoint, SourceDType, TensorLocation};
use crate::hf::config::LladaConfig;
use crate::hf::{config, names, tokenizer};
use crate::layout::{self, Planned, Storage};
use crate::lower::{self, NetworkOptions};
use crate::window::{self, WindowOptions};
use crate::{latency, memory, onnx};

/// How the matrix weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quant {
    F32,
    Bf16,
    F16,
    /// int8 per output channel (activations quantised to int8 at run time: W8A8).
    Q8,
    /// int4 per `group` inputs with f16 scales (activations int8 at run time: W4A8).
    Q4 { group: u32 },
}

impl Quant {
    pub fn parse(name: &str, group: u32) -> Option<Quant> {
        match name {
            "f32" => Some(Quant::F32),
            "bf16" => Some(Quant::Bf16),
            "f16" => Some(Quant::F16),
            "q8" => Some(Quant::Q8),
            "q4" => Some(Quant::Q4 { group }),
            _ => None,
        }
    }

    fn of_source(src: SourceDType) -> Quant {
        match src {
            SourceDType::F32 => Quant::F32,
            SourceDType::Bf16 => Quant::Bf16,
            SourceDType::F16 => Quant::F16,
        }
    }

    pub fn name(self) -> String {
        match self {
            Quant::F32 => "f32".into(),
            Quant::Bf16 => "bf16".into(),
            Quant::F16 => "f16".into(),
            Quant::Q8 => "q8".into(),
            Quant::Q4 { group } => format!("q4 (group {group})"),
        }
    }

    /// Layout of the matrix weights.
    fn matrix_dtype(self) -> DType {
        match self {
            Quant::F32 => DType::PanelF32,
            Quant::Bf16 => DType::PanelBf16,
            Quant::F16 => DType::PanelF16,
            Quant::Q8 => DType::PanelQ8,
            Quant::Q4 { group } => DType::PanelQ4 { group },
        }
    }

    /// The embedding is only gathered a row at a time, so it stays row-major; quantised
    /// artifacts keep it in bf16.
    fn embedding_dtype(self) -> DType {
        match self {
            Quant::F32 => DType::F32,
            Quant::F16 => DType::F16,
            Quant::Bf16 | Quant::Q8 | Quant::Q4 { .. } => DType::Bf16,
        }
    }

    /// Name in target files.
    fn target_name(self) -> &'static str {
        match self {
            Quant::F32 => "f32",
            Quant::Bf16 => "bf16",
            Quant::F16 => "f16",
            Quant::Q8 => "q8",
            Quant::Q4 { .. } => "q4",
        }
    }
}

/// How an artifact of `quant` weights scales its int8 activations unless told, chosen by the
/// outlier study in BENCHMARKS.md (issue 29): q8 per 32-input block (against a few large
/// channels its logit error was 2.7x lower, for 2% more time); q4 per row (its error there is
/// the weights', which block scales do not touch, and blocks cost it 21% more time, as its
/// groups of 128 inputs then end every 32). Other weights have no int8 activations.
pub fn default_activation_scales(quant: Quant) -> ActivationScales {
    match quant {
        Quant::Q8 => ActivationScales::PerBlock,
        _ => ActivationScales::PerRow,
    }
}

#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// Hugging Face checkpoint directory, or an ONNX export (`*.onnx`) with the checkpoint's
    /// config and tokenizer files beside it.
    pub model: PathBuf,
    /// Artifact to write.
    pub output: PathBuf,
    /// Storage of the matrix weights; `None` keeps the checkpoint's element type.
    pub quant: Option<Quant>,
    /// Target name (see `llada_targets::names`).
    pub target: String,
    /// Longest sequence (prompt + generation) the artifact serves; `None`: the model's
    /// `max_sequence_length`, at most the target's `default_max_seq` (4096 on the host, 1024
    /// on phone NPUs, 512 on phone GPUs).
    pub max_seq: Option<u32>,
    /// Most positions whose logits one pass produces (the exact sampler needs one block's worth).
    pub head_rows: u32,
    /// Block length and speculation depth to serve with graphs of exactly their row counts.
    pub block_len: u32,
    pub spec_blocks: u32,
    /// Round activations to bf16 in matmuls over bf16 weights (needs `quant` bf16).
    pub bf16_activations: bool,
    /// Scales of the int8 activations of q8 and q4 matmuls; `None`: the default for the
    /// weights ([`default_activation_scales`]).
    pub activation_scales: Option<ActivationScales>,
    /// Accelerator window size; `None`: the target's. At most the target's
    /// [`max_window_bytes`](llada_targets::Target::max_window_bytes) (a GPU's largest allocation).
    pub window_bytes: Option<u64>,
    /// KV cache element type; `None`: the target's.
    pub kv_dtype: Option<KvDType>,
    /// Show a progress bar on a terminal.
    pub progress: bool,
    /// On a Snapdragon target (`sm8550`...), skip the NPU executables: build the host
    /// stand-in only (no QNN library needed).
    pub host_only: bool,
    /// Folder of Qualcomm's QNN libraries for an NPU target; `None`: `LLADA_QNN_LIB`.
    pub qnn_lib: Option<PathBuf>,
    /// Contexts to split an NPU target's layers into; `None`: the fewest that fit the window.
    pub npu_contexts: Option<u32>,
    /// Build each NPU context's row buckets over one copy of their weights (a phone's HTP
    /// loads it; QNN's x86-64 simulator cannot).
    pub npu_shared_weights: bool,
    /// Also estimate every executable with QNN's performance model for this SoC id.
    pub npu_estimate_soc: Option<u32>,
    /// The NPU's matmul activations: fp16, or 16-bit fixed point (with q4: block-scaled
    /// int4 weights, Qualcomm's LPBQ), calibrated on the host kernels.
    pub npu_activations: NpuActivations,
    /// The calibration set of 16-bit activations (`calibrate::read_prompts`); `None`: the
    /// built-in prompts through the model's chat template.
    pub calibration: Option<PathBuf>,
    /// The target's HTP limits as a phone grants them, where it grants otherwise.
    pub npu_limits: NpuLimitOverrides,
}

impl Default for CompileOptions {
    /// What `lladac compile` does given no flags but `--model` and `-o` (both empty here:
    /// set them): the host target, the checkpoint's element type, 256 logit rows, blocks of 32
    /// and two speculative blocks' graphs.
    fn default() -> CompileOptions {
        CompileOptions {
            model: PathBuf::new(),
            output: PathBuf::new(),
            quant: None,
            target: "host".into(),
            max_seq: None,
            head_rows: 256,
            block_len: 32,
            spec_blocks: 2,
            bf16_activations: false,
            activation_scales: None,
            window_bytes: None,
            kv_dtype: None,
            progress: false,
            host_only: false,
            qnn_lib: None,
            npu_contexts: None,
            npu_shared_weights: false,
            npu_estimate_soc: None,
            npu_activations: NpuActivations::default(),
            calibration: None,
            npu_limits: NpuLimitOverrides::default(),
        }
    }
}

impl CompileOptions {
    /// Compiling `model` into `output`, every other option at its default.
    pub fn new(model: impl Into<PathBuf>, output: impl Into<PathBuf>) -> CompileOptions {
        CompileOptions { model: model.into(), output: output.into(), ..CompileOptions::default() }
    }
}

/// Overrides of a Snapdragon target's HTP limits (`--npu-sessions`, `--npu-session-bytes`):
/// for a phone that grants fewer sessions (Android 14 and before: one), or more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NpuLimitOverrides {
    pub sessions: Option<u32>,
    pub session_bytes: Option<u64>,
}

/// The HTP limits an NPU target's contexts are planned against: the target's, overridden.
pub fn npu_limits(target: &llada_targets::Target, o: NpuLimitOverrides) -> Option<llada_ir::npu::NpuLimits> {
    let m = target.npu_memory?;
    Some(llada_ir::npu::NpuLimits {
        mapping_bytes: m.mapping_bytes,
        session_bytes: o.session_bytes.unwrap_or(m.session_bytes),
        sessions: o.sessions.unwrap_or(target.sessions_per_process),
    })
}

/// The element type of the NPU's matmul activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NpuActivations {
    /// The weight format's fast form: 16-bit fixed point with q4 (QNN's performance model
    /// puts it at 2.5x the per-channel int4 with fp16 activations, BENCHMARKS.md), fp16 with
    /// f16 and q8 weights.
    #[default]
    ByFormat,
    F16,
    U16,
}

impl NpuActivations {
    pub fn parse(s: &str) -> Option<NpuActivations> {
        match s {
            "f16" => Some(NpuActivations::F16),
            "u16" => Some(NpuActivations::U16),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct CompileSummary {
    pub output: PathBuf,
    pub bytes: u64,
    pub tensors: usize,
    pub graphs: usize,
    pub quant: Quant,
    pub max_seq: u32,
    pub warnings: Vec<String>,
    /// NPU executables built: (SoC, contexts, binary bytes, seconds to build them).
    pub npu: Option<(String, usize, u64, f64)>,
}

/// Chunk size for streaming tensors: large enough for fast I/O, small enough that compiling
/// an 8B checkpoint stays far below a gigabyte of resident memory.
const CHUNK_BYTES: usize = 16 << 20;

/// Refuses compile flags typed with values that would do nothing or cannot be served, naming
/// the flag, before the checkpoint is read. `group` and `spec_blocks` are `Some` where the
/// user gave them (the CLI's typed flags, the Python module's arguments).
/// Inputs per q4 scale where `--group` is not given: 64 for a Snapdragon target (the block
/// of the HTP's LPBQ, ExecuTorch's and AI Hub's w4a16; the host stand-in takes the same), 128
/// elsewhere.
pub fn default_group(target: &str) -> u32 {
    if crate::qnn::soc_of(target).is_some() { 64 } else { 128 }
}

pub fn check_flags(quant: Option<&str>, group: Option<u32>, target: &str, max_seq: Option<u32>, block_len: u32, spec_blocks: Option<u32>) -> std::result::Result<(), String> {
    if let (Some(group), false) = (group, quant == Some("q4")) {
        let stored = quant.map_or("the checkpoint's own type".to_string(), |q| format!("--quant {q}"));
        return Err(format!("--group {group} does nothing with {stored}, so it is refused: only --quant q4 uses it (inputs per int4 scale)"));
    }
    // The positions the artifact will hold at most: --max-seq, else the target's default (the
    // model's own maximum may be smaller still; the compile then drops graphs beyond it).
    let (positions, whose) = match (max_seq, llada_targets::by_name(target)) {
        (Some(m), _) => (m, "--max-seq".to_string()),
        (None, Ok(t)) => (t.default_max_seq, format!("the {} target's default --max-seq", t.name)),
        // An unknown target: the compile names it.
        (None, Err(_)) => return Ok(()),
    };
    // A --block-len outside 1..=positions: the compile names it.
    if let (Some(spec_blocks), true) = (spec_blocks, (1..=positions).contains(&block_len)) {
        let most = positions / block_len - 1;
        if spec_blocks > most {
            return Err(format!(
                "--spec-blocks {spec_blocks} is outside 0..={most}: a block and the {spec_blocks} drafted ahead take --block-len {block_len} x (1 + {spec_blocks}) rows, more than the {positions} positions of {whose}"
            ));
        }
    }
    Ok(())
}

pub fn compile(opts: &CompileOptions) -> Result<CompileSummary> {
    // `metadata`, not `exists`: a link loop or an unreadable folder says so, not "not found".
    std::fs::metadata(&opts.model).map_err(|e| Error::io(&opts.model, e))?;
    // An ONNX export's config and tokenizer files sit beside it; a directory holding one
    // `.onnx` file and no safetensors (as Optimum lays an export out) names that export.
    let onnx_file = if onnx::is_onnx(&opts.model) { Some(opts.model.clone()) } else { onnx::export_in(&opts.model) };
    let dir = &match &onnx_file {
        Some(f) => f.parent().unwrap_or(Path::new(".")).to_path_buf(),
        None => opts.model.clone(),
    };
    if onnx_file.is_some() && !dir.join("config.json").exists() {
        return Err(Error::Onnx {
            path: onnx_file.clone().unwrap_or_default(),
            msg: "no config.json beside it: an ONNX graph carries no model config or tokenizer, so lladac reads the checkpoint's config.json and tokenizer files from the .onnx file's directory (as Hugging Face Optimum's exports place them)".into(),
        });
    }
    // Everything the compile reads, which the output must not replace; checked now, before
    // the work, and again when the artifact is moved into place.
    let reads = [opts.model.as_path(), dir.as_path()];
    llada_ir::files::check_destination(&opts.output, &reads).map_err(|e| Error::io(&opts.output, e))?;
    let (cfg, mut warnings) = config::load(dir)?;
    let target = llada_targets::by_name(&opts.target).map_err(Error::Options)?;
    let qnn_library = match (opts.host_only, crate::qnn::soc_of(&target.name)) {
        (false, Some((soc, _))) => Some(crate::qnn::open_library(soc, opts.qnn_lib.as_deref())?),
        _ => None,
    };
    let ckpt = match &onnx_file {
        Some(f) => onnx::open(f, &cfg)?,
        None => Checkpoint::open(dir)?,
    };
    let (tok_spec, special) = tokenizer::load(dir, &cfg)?;

    let (d, hd, f) = (cfg.d_model, cfg.head_dim(), cfg.mlp_hidden);
    let q_dim = cfg.n_heads * hd;
    let embed_dtype = ckpt.expect(embedding_name(&cfg), &[cfg.embedding_size, d], &format!("embedding_size {}, d_model {d}", cfg.embedding_size))?.dtype;
    // An NPU target's executables hold fp16 weights unless --quant asks for int8 or int4, so
    // fp16 is its default storage too (with --host-only as well: its kernels take no f32).
    let npu_soc = if opts.host_only { None } else { crate::qnn::soc_of(&target.name) };
    if crate::qnn::soc_of(&target.name).is_none() && (opts.host_only || opts.qnn_lib.is_some()) {
        let flag = if opts.host_only { "--host-only" } else { "--qnn-lib" };
        return Err(Error::Options(format!("{flag}: target '{}' has no NPU executables (only sm8550, sm8650, sm8750 and sm8850 do)", target.name)));
    }
    if opts.host_only && opts.qnn_lib.is_some() {
        return Err(Error::Options("--qnn-lib: --host-only builds no NPU executables, so no QNN library is used".into()));
    }
    if opts.npu_limits != NpuLimitOverrides::default() && npu_soc.is_none() {
        let flag = if opts.npu_limits.sessions.is_some() { "--npu-sessions" } else { "--npu-session-bytes" };
        return Err(Error::Options(format!("{flag}: only the NPU executables of a Snapdragon target (without --host-only) are planned over HTP sessions")));
    }
    if opts.npu_limits.sessions == Some(0) || opts.npu_limits.session_bytes == Some(0) {
        return Err(Error::Options("--npu-sessions and --npu-session-bytes must be above 0".into()));
    }
    if let (Some(n), None) = (opts.npu_contexts, npu_soc) {
        return Err(Error::Options(format!("--npu-contexts {n}: only the NPU executables of a Snapdragon target (without --host-only) are split into contexts")));
    }
    if let (Some(id), None) = (opts.npu_estimate_soc, npu_soc) {
        return Err(Error::Options(format!("--npu-estimate-soc {id}: only the NPU executables of a Snapdragon target (without --host-only) are estimated")));
    }
    if opts.npu_shared_weights && npu_soc.is_none() {
        return Err(Error::Options("--npu-shared-weights: only the NPU executables of a Snapdragon target (without --host-only) hold weights in contexts".into()));
    }
    let quant = opts.quant.unwrap_or_else(|| if crate::qnn::soc_of(&target.name).is_some() { Quant::F16 } else { Quant::of_source(embed_dtype) });
    let npu_activations = match opts.npu_activations {
        NpuActivations::ByFormat if npu_soc.is_some() && matches!(quant, Quant::Q4 { .. }) => NpuActivations::U16,
        NpuActivations::ByFormat => NpuActivations::F16,
        chosen => chosen,
    };
    let npu_weights = match quant {
        Quant::F16 => NpuWeights::F16,
        Quant::Q8 => NpuWeights::Int8PerChannel,
        // The HTP's int4 with fp16 activations is per output channel (QNN.md); the host
        // stand-in keeps its groups.
        Quant::Q4 { group } if npu_activations == NpuActivations::U16 => NpuWeights::Int4Lpbq { block: group },
        Quant::Q4 { .. } => NpuWeights::Int4PerChannel,
        Quant::F32 | Quant::Bf16 => {
            if let Some((soc, _)) = npu_soc {
                return Err(Error::Options(format!(
                    "--quant {}: the NPU executables for '{soc}' hold fp16, int8 or int4 weights; use --quant f16, q8 or q4, or --host-only to build the host stand-in with {} weights",
                    quant.name(),
                    quant.name()
                )));
            }
            NpuWeights::F16
        }
    };
    // The calibration set, read before any work (a bad file is one error up front).
    let mut calibration_set = None;
    if npu_activations == NpuActivations::U16 {
        if npu_soc.is_none() {
            return Err(Error::Options("--npu-activations u16: only the NPU executables of a Snapdragon target (without --host-only) have 16-bit activations".into()));
        }
        if !matches!(quant, Quant::Q4 { .. }) {
            return Err(Error::Options(format!("--npu-activations u16 runs with block-scaled int4 weights (--quant q4), not {}", quant.name())));
        }
        calibration_set = Some(match &opts.calibration {
            Some(file) => (crate::calibrate::read_prompts(file)?, file.display().to_string()),
            None => (crate::calibrate::DEFAULT_PROMPTS.map(str::to_string).to_vec(), "lladac's built-in set".to_string()),
        });
    } else if let Some(file) = &opts.calibration {
        return Err(Error::Options(format!("--calibration {}: only 16-bit NPU activations (--npu-activations u16) are calibrated", file.display())));
    }
    if opts.bf16_activations && quant != Quant::Bf16 {
        return Err(Error::Options(format!("--activations bf16 needs bf16 weights (--quant bf16), not {}", quant.name())));
    }
    let int8 = matches!(quant, Quant::Q8 | Quant::Q4 { .. });
    if let (Some(scales), false) = (opts.activation_scales, int8) {
        return Err(Error::Options(format!("--activation-scales {}: only q8 and q4 weights run with int8 activations, not {}", scales.name(), quant.name())));
    }
    let activation_scales = opts.activation_scales.unwrap_or_else(|| default_activation_scales(quant));
    if let (Quant::Q4 { group }, ActivationScales::PerBlock) = (quant, activation_scales) {
        if group as usize % ACTIVATION_BLOCK != 0 {
            return Err(Error::Options(format!("--activation-scales block: q4 groups must be whole blocks of {ACTIVATION_BLOCK} inputs, not --group {group}")));
        }
    }
    if activation_scales == ActivationScales::PerBlock {
        for (what, k) in [("d_model", d), ("n_heads x head_dim", q_dim), ("mlp_hidden_size", f)] {
            if k % ACTIVATION_BLOCK != 0 {
                return Err(Error::Options(format!("--activation-scales block: {what} ({k}) is not whole blocks of {ACTIVATION_BLOCK} inputs; use --activation-scales row")));
            }
        }
    }
    if !target.weight_dtypes.iter().any(|t| t == quant.target_name()) {
        return Err(Error::Options(format!("--quant {}: target '{}' supports {}", quant.target_name(), target.name, target.weight_dtypes.join(", "))));
    }
    if let Quant::Q4 { group } = quant {
        for (what, k) in [("d_model", d), ("n_heads x head_dim", q_dim), ("mlp_hidden_size", f)] {
            if group == 0 || group % 8 != 0 || k % group as usize != 0 {
                return Err(Error::Options(format!("--group {group}: q4 groups must be a multiple of 8 dividing {what} ({k})")));
            }
        }
    }
    let window_bytes = opts.window_bytes.unwrap_or(target.window_bytes);
    if let Some((max, why)) = target.max_window_bytes().filter(|(max, _)| window_bytes > *max) {
        return Err(Error::Options(format!(
            "--window-bytes {window_bytes}: the accelerator holds at most {max} bytes in its window ({why}); ask for {max} or less"
        )));
    }
    let kv_dtype = match &opts.kv_dtype {
        Some(k) => *k,
        None => KvDType::parse(&target.kv_dtype).ok_or_else(|| Error::Options(format!("target '{}' names KV dtype '{}'", target.name, target.kv_dtype)))?,
    };
    if let (Some((soc, _)), false) = (npu_soc, kv_dtype == KvDType::F16) {
        return Err(Error::Options(format!("--kv-dtype {}: the NPU executables for '{soc}' read an f16 KV cache in place; use --kv-dtype f16, or --host-only", kv_dtype.name())));
    }
    // Check every tensor before writing anything.
    let layout = layout::plan(&cfg, &ckpt, Storage { matrix: quant.matrix_dtype(), embedding: quant.embedding_dtype() })?;
    let unused: Vec<&str> = ckpt.names().filter(|n| !layout.consumed.contains(*n)).collect();
    if let Some(first) = unused.first() {
        warnings.push(format!("{}: {} tensor(s) not used by the model ignored, e.g. '{first}'", dir.display(), unused.len()));
    }
    let segments = &layout.segments;

    let max_seq = opts.max_seq.unwrap_or((cfg.max_sequence_length as u32).min(target.default_max_seq));
    if max_seq == 0 || max_seq as usize > cfg.max_sequence_length {
        return Err(Error::Options(format!(
            "--max-seq {max_seq}: must be between 1 and the model's max_sequence_length ({})",
            cfg.max_sequence_length
        )));
    }
    if opts.head_rows == 0 {
        return Err(Error::Options("--head-rows must be at least 1".into()));
    }
    if opts.block_len == 0 || opts.block_len > max_seq {
        return Err(Error::Options(format!("--block-len {}: must be between 1 and --max-seq ({max_seq})", opts.block_len)));
    }
    let mut buckets = lower::exact_buckets(max_seq, target.row_multiple);
    let rope_rows = *buckets.last().unwrap();
    // Row-set graphs: every multiple of the target's row tile up to a block and its
    // speculative blocks, so the latency buckets can be chosen among them.
    let round = |r: u32| r.div_ceil(target.row_multiple) * target.row_multiple;
    let row_set_rows = round(opts.block_len * (1 + opts.spec_blocks)).min(rope_rows);
    let tiles = (1..).map(|i| i * target.row_multiple).take_while(|&r| r <= row_set_rows);
    let exact = (0..=opts.spec_blocks).map(|k| round(opts.block_len * (1 + k))).filter(|&r| r <= rope_rows);
    for rows in tiles.chain(exact) {
        if !buckets.contains(&rows) {
            buckets.push(rows);
        }
    }
    buckets.sort_unstable();

    let model = ModelConfig {
        architecture: cfg.family.name().into(),
        d_model: d as u32,
        n_layers: cfg.n_layers as u32,
        n_heads: cfg.n_heads as u32,
        n_kv_heads: cfg.n_kv_heads as u32,
        head_dim: hd as u32,
        mlp_hidden: f as u32,
        vocab_size: cfg.vocab_size as u32,
        embedding_size: cfg.embedding_size as u32,
        max_sequence_length: cfg.max_sequence_length as u32,
        rope_theta: cfg.rope_theta,
        rms_eps: cfg.rms_eps,
        qk_norm: cfg.qk_norm,
        moe: cfg.moe.map(|m| MoeConfig { experts: m.experts as u32, top_k: m.top_k as u32, dense_layers: cfg.llada2.map_or(0, |l| l.dense_layers as u32) }),
    };

    let total_bytes: u64 = segments.iter().flat_map(|(_, p)| p.iter()).flat_map(|t| t.sources.iter()).map(|s| s.nbytes).sum();
    let bar = if opts.progress { ProgressBar::new(total_bytes) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} {eta}").unwrap().progress_chars("=> "));

    let mut w = ArtifactWriter::create(&opts.output, &reads)?;
    let mut ids: Vec<Vec<TensorId>> = Vec::new();
    for (segment, tensors) in segments {
        bar.set_message(segment.clone());
        w.begin_segment(segment)?;
        let mut seg_ids = Vec::new();
        for t in tensors {
            seg_ids.push(w.begin_tensor(&t.name, t.dtype, &t.shape)?);
            if t.dtype.is_panel() {
                write_packed(&ckpt, t, &mut w, &bar)?;
            } else {
                let mut buf = Vec::with_capacity(CHUNK_BYTES * 2);
                for src in &t.sources {
                    let mut done = 0;
                    ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
                        if let Some(i) = first_overflow_raw(src.dtype, raw, t.dtype) {
                            return Err(overflow(&ckpt, src, done + i, t.dtype));
                        }
                        done += raw.len() / src.dtype.size_bytes();
                        buf.clear();
                        convert(src.dtype, raw, t.dtype, &mut buf);
                        bar.inc(raw.len() as u64);
                        Ok(w.write(&buf)?)
                    })?;
                }
            }
            w.end_tensor()?;
        }
        w.end_segment()?;
        ids.push(seg_ids);
    }
    bar.finish_and_clear();
    w.begin_segment("rope")?;
    let (cos, sin) = rope_tables(cfg.rope_theta, hd, cfg.llada2.map_or(hd, |l| l.rotary_dim), rope_rows as usize);
    let half = (hd / 2) as u64;
    let rope_cos = w.add_tensor("rope.cos", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&cos))?;
    let rope_sin = w.add_tensor("rope.sin", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&sin))?;
    w.end_segment()?;

    let (net, expert_segments) = layout.network(&ids, &cfg, (rope_cos, rope_sin))?;
    let net_opts = NetworkOptions { input_emb_norm: cfg.input_emb_norm, scale_logits: cfg.scale_logits };
    let mut graphs = Vec::new();
    for &rows in &buckets {
        let mut g = lower::full_sequence_graph(&model, &net, net_opts, rows, opts.head_rows.min(rows));
        memory::plan(&mut g, target.window_align);
        graphs.push(g);
    }
    let tensor_count = w.tensors().len();
    let mut header = Header {
        model,
        special,
        tokenizer: tok_spec,
        tensors: Vec::new(),
        segments: Vec::new(),
        plan: Plan {
            by_rows: (0..graphs.len() as u32).collect(),
            kv_capacity: rope_rows,
            block_len: opts.block_len,
            spec_blocks: opts.spec_blocks,
            bf16_activations: opts.bf16_activations,
            activation_scales,
            ..Plan::default()
        },
        graphs,
        compile: CompileInfo {
            compiler: format!("lladac {}", env!("CARGO_PKG_VERSION")),
            source: opts.model.display().to_string(),
            target: target.name.clone(),
            options: vec![
                ("quant".into(), quant.name()),
                ("max_seq".into(), max_seq.to_string()),
                ("head_rows".into(), opts.head_rows.to_string()),
                ("block_len".into(), opts.block_len.to_string()),
                ("spec_blocks".into(), opts.spec_blocks.to_string()),
                ("activations".into(), (if opts.bf16_activations { "bf16" } else { "f32" }).into()),
                ("activation_scales".into(), activation_scales.name().into()),
                ("window_bytes".into(), window_bytes.to_string()),
                ("kv_dtype".into(), kv_dtype.name().into()),
            ],
        },
        extensions: Vec::new(),
    };
    header.tensors = w.tensors().to_vec();
    header.segments = w.segments().to_vec();
    let window_opts = WindowOptions {
        bytes: window_bytes,
        align: target.window_align,
        kv_dtype,
        threads: target.max_threads,
        host_segment: 0,
        expert_segments,
        expert_costs: latency::expert_costs(&header, &target),
        window_source: match (opts.window_bytes, target.max_window_bytes()) {
            (Some(_), _) => "--window-bytes".into(),
            // A GPU's window is already its largest allocation: --window-bytes cannot raise it.
            (None, Some((max, _))) if window_bytes == max => format!("target '{}', its GPU's largest allocation", target.name),
            (None, _) => format!("target '{}'", target.name),
        },
        can_grow: target.max_window_bytes().is_none_or(|(max, _)| window_bytes < max),
        max_expert_bytes: None,
    };
    // An MoE model's NPU target may plan again with fewer expert slots (below).
    let unplanned = (npu_soc.is_some() && header.model.moe.is_some()).then(|| header.clone());
    window::plan(&mut header, &window_opts)?;
    if let (Some((soc, _)), Some(moe), Some(unplanned)) = (npu_soc, header.model.moe, unplanned) {
        // The NPU's contexts share the window with the expert slots: the slots leave room for
        // every context at once where a token's experts still get a slot a layer each beside
        // them, else for two one-layer contexts (one created while the other runs).
        let room = crate::npu_plan::executables_room(&header, npu_weights, opts.npu_shared_weights, opts.npu_contexts).map_err(|e| Error::Options(format!("--target {soc}: {e}")))?;
        let io = llada_ir::npu::IoLayout::of(&header).bytes;
        let x = &header.plan.window.experts;
        let layer_slots = x.slot_bytes * header.model.moe_layers() as u64;
        let reserve = if window_bytes.saturating_sub(io + room.all) >= moe.top_k as u64 * layer_slots { room.all } else { room.rotating.min(room.all) };
        let cap = window_bytes.saturating_sub(io + reserve);
        if x.region.bytes > cap {
            header = unplanned;
            window::plan(&mut header, &WindowOptions { max_expert_bytes: Some(cap), ..window_opts })?;
            if header.plan.window.experts.slots_per_layer == 0 {
                let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
                return Err(Error::Options(format!(
                    "--target {soc}: the {} window leaves no room for an expert slot a layer ({}) beside the NPU's I/O ({}) and executables ({} to rotate them, {} all at once); raise --window-bytes or use smaller weights (--quant q4)",
                    mib(window_bytes),
                    mib(layer_slots),
                    mib(io),
                    mib(room.rotating),
                    mib(room.all)
                )));
            }
        }
    }
    if let Some(gpu) = target.gpu {
        check_whole_bindings(&header, &target.name, gpu.max_storage_buffer_bytes, gpu.storage_buffer_offset_align)?;
    }
    latency::record(&mut header, &target);
    latency::choose_row_buckets(&mut header, row_set_rows);
    let npu = match (npu_soc, &qnn_library) {
        (Some(soc), Some(lib)) => {
            let calibration = match &calibration_set {
                Some((prompts, source)) => calibrate_activations(opts, prompts, source)?,
                None => Default::default(),
            };
            let limits = npu_limits(&target, opts.npu_limits).ok_or_else(|| Error::Options(format!("--target {}: the target file gives no HTP limits (npu_memory)", target.name)))?;
            let npu_opts = crate::qnn::NpuOptions { limits, contexts: opts.npu_contexts, shared_weights: opts.npu_shared_weights, estimate_soc: opts.npu_estimate_soc };
            Some(add_npu_executables(&mut header, &mut w, &ckpt, segments, &ids, soc, npu_weights, &calibration, lib, &npu_opts)?)
        }
        _ => None,
    };
    let n_graphs = header.graphs.len();
    let bytes = w.finish(header)?;
    Ok(CompileSummary { output: opts.output.clone(), bytes, tensors: tensor_count, graphs: n_graphs, quant, max_seq, warnings, npu })
}

/// Lowers every graph to QNN for `soc`, writes each context binary as a segment and records
/// the section; returns (SoC, contexts, binary bytes, seconds).
#[allow(clippy::too_many_arguments)]
fn add_npu_executables(
    header: &mut Header,
    w: &mut ArtifactWriter,
    ckpt: &Checkpoint,
    segments: &[(String, Vec<Planned>)],
    ids: &[Vec<TensorId>],
    soc: (&str, u32),
    format: NpuWeights,
    calibration: &crate::qnn::Calibration,
    lib: &std::sync::Arc<llada_qnn::QnnLibrary>,
    npu: &crate::qnn::NpuOptions,
) -> Result<(String, usize, u64, f64)> {
    let planned: HashMap<TensorId, &Planned> = ids.iter().flatten().copied().zip(segments.iter().flat_map(|(_, p)| p.iter())).collect();
    let weights = |t: TensorId| -> Result<Vec<f32>> {
        let p = planned.get(&t).ok_or_else(|| Error::Options(format!("lowering to QNN: tensor {t} has no checkpoint source")))?;
        let mut out = Vec::new();
        for src in &p.sources {
            ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
                to_f32(src.dtype, raw, &mut out);
                Ok(())
            })?;
        }
        Ok(out)
    };
    let mut lowered = crate::qnn::lower(header, &weights, format, calibration, soc, lib, npu)?;
    let mut bytes = 0;
    for (i, (context, binary)) in lowered.section.contexts.iter_mut().zip(&lowered.binaries).enumerate() {
        context.segment = w.add_raw_segment(&format!("npu.context.{i}"), binary)?;
        bytes += binary.len() as u64;
    }
    header.extensions.push(llada_ir::Extension { key: llada_ir::npu::EXTENSION_KEY.into(), version: llada_ir::npu::SECTION_VERSION, required: false, bytes: lowered.section.encode() });
    header.compile.options.push(("npu".into(), format!("qnn {} ({}), {} weights", soc.0, lowered.section.qnn_build, format.name())));
    Ok((soc.0.to_string(), lowered.section.contexts.len(), bytes, lowered.seconds))
}

/// The ranges of the NPU's 16-bit activations: the same model compiled as a host stand-in
/// into a temporary file beside the output (removed after), generating answers to the
/// calibration set `prompts` (from `source`) on the host kernels.
fn calibrate_activations(opts: &CompileOptions, prompts: &[String], source: &str) -> Result<crate::qnn::Calibration> {
    let name = opts.output.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = opts.output.with_file_name(format!(".{name}.calibration.{}.tmp", std::process::id()));
    // Never write through, or remove, something already there (a link, another's file).
    if std::fs::symlink_metadata(&temp).is_ok() {
        return Err(Error::io(&temp, std::io::Error::new(std::io::ErrorKind::AlreadyExists, "the calibration's temporary artifact would replace it; remove it")));
    }
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&temp);
    let host = CompileOptions {
        output: temp.clone(),
        host_only: true,
        // The host stand-in needs no QNN library (and --host-only refuses one).
        qnn_lib: None,
        progress: false,
        npu_contexts: None,
        npu_shared_weights: false,
        npu_estimate_soc: None,
        npu_activations: NpuActivations::F16,
        calibration: None,
        npu_limits: Default::default(),
        ..opts.clone()
    };
    compile(&host)?;
    let (ranges, source) = crate::calibrate::calibrate(&temp, prompts, source)?;
    Ok(crate::qnn::Calibration { ranges, source })
}

/// A GPU binds each of the plan's whole bindings (`window::whole_bindings`) as one storage
/// buffer of at most `range` bytes, starting up to `align` bytes early (its offset rounded down
/// to the device's alignment): a plan with a larger one cannot run there.
fn check_whole_bindings(h: &Header, target: &str, range: u64, align: u64) -> Result<()> {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    match window::whole_bindings(h).into_iter().find(|&(_, bytes)| bytes.saturating_add(align) > range) {
        None => Ok(()),
        Some((what, bytes)) => Err(Error::Options(format!(
            "{what} ({}) exceeds the {} one storage buffer binds on target '{target}' (maxStorageBufferRange), and the Vulkan backend binds it whole. \
             Lower --max-seq or --head-rows, or choose a smaller --kv-dtype",
            mib(bytes), mib(range)
        ))),
    }
}

/// The checkpoint's embedding tensor name.
fn embedding_name(cfg: &LladaConfig) -> &'static str {
    match cfg.family {
        Family::Llada => names::EMBEDDING,
        Family::LladaMoe | Family::Dream => names::moe::EMBEDDING,
        Family::Llada2Moe => names::LLADA2_EMBEDDING,
    }
}

/// Streams the rows of `t`'s sources into 16-row panels and packs them.
fn write_packed(ckpt: &Checkpoint, t: &Planned, w: &mut ArtifactWriter, bar: &ProgressBar) -> Result<()> {
    let k = t.shape[1] as usize;
    let mut pending: Vec<f32> = Vec::new();
    let mut packed = Vec::new();
    let mut flush = |pending: &mut Vec<f32>, all: bool, w: &mut ArtifactWriter| -> Result<()> {
        let mut start = 0;
        while pending.len() - start >= PANEL * k || (all && pending.len() > start) {
            let end = (start + PANEL * k).min(pending.len());
            let rows: Vec<&[f32]> = pending[start..end].chunks(k).collect();
            packed.clear();
            pack_panel(t.dtype, &rows, k, &mut packed);
            w.write(&packed)?;
            start = end;
        }
        pending.drain(..start);
        Ok(())
    };
    for src in &t.sources {
        let mut done = 0;
        ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
            let from = pending.len();
            to_f32(src.dtype, raw, &mut pending);
            if let Some(i) = first_overflow(pending[from..].iter().copied(), t.dtype) {
                return Err(overflow(ckpt, src, done + i, t.dtype));
            }
            done += pending.len() - from;
            bar.inc(raw.len() as u64);
            flush(&mut pending, false, w)
        })?;
    }
    flush(&mut pending, true, w)
}

/// A finite weight that `dtype` would store as infinity (the source is checked finite as read).
fn overflow(ckpt: &Checkpoint, src: &TensorLocation, element: usize, dtype: DType) -> Error {
    let range = if matches!(dtype, DType::F16 | DType::PanelF16) { "f16's range (largest 65504)" } else { "bf16's range (largest 3.39e38)" };
    Error::Options(format!("{}: tensor '{}': element {element} is beyond {range}; compile with --quant bf16 or f32", ckpt.dir.display(), ckpt.name_of(src)))
}

/// Rotary tables `[rows, head_dim / 2]`, computed as LLaDA's reference does in float32:
/// `inv_freq = 1 / theta^(2i / rotary_dim)`, angle = position * inv_freq (rounded to f32), then
/// cos and sin of that angle, correctly rounded. Pairs past `rotary_dim / 2` get frequency 0
/// (cos 1, sin 0): partial rotary, with the heads stored in `layout::llada2::rotary_order`.
pub fn rope_tables(theta: f64, head_dim: usize, rotary_dim: usize, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| if i < rotary_dim / 2 { 1.0f32 / (theta as f32).powf((2 * i) as f32 / rotary_dim as f32) } else { 0.0 })
        .collect();
    let mut cos = Vec::with_capacity(rows * half);
    let mut sin = Vec::with_capacity(rows * half);
    for p in 0..rows {
        for &f in &inv_freq {
            let angle = (p as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::{estimate, EstimateRequest};

    /// The embedded model (in the repository), q4, for `target`.
    fn tiny_q4(target: &str, output: &Path) -> CompileOptions {
        CompileOptions {
            model: PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/llada-tiny-tasks")),
            output: output.to_path_buf(),
            quant: Some(Quant::Q4 { group: 32 }),
            target: target.into(),
            head_rows: 64,
            npu_activations: NpuActivations::F16,
            ..Default::default()
        }
    }

    /// Every GPU target compiles a plan whose window is the device's largest allocation at
    /// most, and predicts it W4A8 at the GPU's int8 rate; a larger window is refused, naming
    /// the limit.
    #[test]
    fn gpu_targets_compile_within_their_allocation_limit() {
        let dir = tempfile::tempdir().unwrap();
        for name in llada_targets::names().into_iter().filter(|n| llada_targets::by_name(n).unwrap().gpu.is_some()) {
            let t = llada_targets::by_name(name).unwrap();
            let max = t.gpu.unwrap().max_allocation_bytes;
            let out = dir.path().join(format!("{name}.lad"));
            compile(&tiny_q4(name, &out)).unwrap();
            let (h, ..) = crate::inspect::open(&out).unwrap();
            assert!(h.plan.window.bytes <= max, "{name}");
            assert_eq!(h.plan.latency_target, format!("{name} (estimate)"));

            let req = EstimateRequest { policy: "dual".into(), prompt_len: 32, gen_len: 128, block_len: 32, steps: 128, rows: vec![32, 64], context: None, npu_limits: Default::default(), rows_given: true, generation_given: true, rates: None, passes: None, on_target: None };
            let e = estimate(&h, &req).unwrap();
            assert!(e["label"].as_str().unwrap().starts_with("ESTIMATE"), "{name}");
            let m = &e["matmuls"][0];
            assert_eq!((m["computes"].as_str(), m["engine"].as_str()), (Some("W4A8"), Some("int8")), "{name}");
            assert_eq!(m["ops_per_second"].as_f64(), Some(t.accelerator.int8_ops), "{name}");
            assert!(e["generation"]["seconds"].as_f64().unwrap() > 0.0, "{name}");

            let mut too_big = tiny_q4(name, &dir.path().join("too-big.lad"));
            too_big.window_bytes = Some(max + 1);
            let err = compile(&too_big).unwrap_err().to_string();
            assert!(err.contains("maxMemoryAllocationSize") && err.contains(&max.to_string()), "{err}");
            assert!(!dir.path().join("too-big.lad").exists());
        }
    }

    /// A plan one of whose ops' values exceed a GPU's storage-buffer range is refused, saying
    /// what to change (LLaDA-8B at 4096 positions: hundreds of MiB for one matmul's values).
    #[test]
    fn a_binding_above_the_storage_range_is_refused() {
        let (h, _) = crate::testing::llada_8b_header(&crate::lower::exact_buckets(4096, 16), "host", None);
        let err = check_whole_bindings(&h, "adreno750", 128 << 20, 256).unwrap_err().to_string();
        for want in ["the values of one op", "128.0 MiB", "adreno750", "maxStorageBufferRange", "--max-seq"] {
            assert!(err.contains(want), "{want}: {err}");
        }
        assert!(check_whole_bindings(&h, "host", u64::MAX, 0).is_ok());
    }
}
