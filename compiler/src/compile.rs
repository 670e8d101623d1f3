//! `lladac compile`: checkpoint directory -> artifact.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use indicatif::ProgressBar;
use llada_ir::packing::{pack_panel, PANEL};
use llada_ir::window::ActivationScales;
use llada_ir::{ArtifactWriter, DType, Family, Header, KvDType, TensorId};

use crate::convert::{convert, first_overflow, first_overflow_raw, to_f32};
use crate::error::{Error, Result};
use crate::gguf::quant::GgmlType;
use crate::hf::checkpoint::{Checkpoint, SourceDType, TensorLocation};
use crate::hf::config::LladaConfig;
use crate::hf::names;
use crate::layout::{self, Planned, Storage};
use crate::window;

mod produce;
mod settings;
mod source;

use settings::{Rows, Settings};
use source::Source;

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
            // A GGUF's blocks: Q4_0 is q4 with groups of 32 (carried as is); the others are
            // decoded and stored as per-channel q8 unless --quant says otherwise.
            SourceDType::Block(GgmlType::Q4_0) => Quant::Q4 { group: 32 },
            SourceDType::Block(_) => Quant::Q8,
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
    pub logit_rows: u32,
    /// Block length and speculation depth to serve with graphs of exactly their row counts.
    pub block_len: u32,
    /// `None`: [`DEFAULT_SPEC_BLOCKS`], whose graphs past the artifact's positions are left
    /// out; a depth given is refused where a block and those drafted ahead outgrow them.
    pub spec_blocks: Option<u32>,
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
            logit_rows: 256,
            block_len: 32,
            spec_blocks: None,
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

/// [`default_group`] for compiling `model`: 32 for a GGUF file of Q4_0 blocks (whose numbers
/// are then carried as they are), else the target's.
pub fn default_group_for(model: &std::path::Path, target: &str) -> u32 {
    if model.is_file() && crate::gguf::is_gguf(model) && crate::gguf::is_q4_0(model) { 32 } else { default_group(target) }
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
    match spec_blocks {
        Some(k) if (1..=positions).contains(&block_len) => check_spec_blocks(k, block_len, positions, &whose),
        _ => Ok(()),
    }
}

/// Refuses `k` blocks drafted ahead where a block and those `k` outgrow `positions` (`whose`
/// says which limit they are); `block_len` is in `1..=positions`.
pub(crate) fn check_spec_blocks(k: u32, block_len: u32, positions: u32, whose: &str) -> std::result::Result<(), String> {
    if u64::from(block_len) * (1 + u64::from(k)) <= u64::from(positions) {
        return Ok(());
    }
    let most = positions / block_len - 1;
    Err(format!("--spec-blocks {k} is outside 0..={most}: a block and the {k} drafted ahead take --block-len {block_len} x (1 + {k}) rows, more than the {positions} positions of {whose}"))
}

/// Blocks drafted ahead that a compile plans graphs for unless told.
pub const DEFAULT_SPEC_BLOCKS: u32 = 2;

impl CompileOptions {
    /// The speculation depth the plan records: the one given, else the default.
    pub fn spec_blocks(&self) -> u32 {
        self.spec_blocks.unwrap_or(DEFAULT_SPEC_BLOCKS)
    }
}

pub fn compile(opts: &CompileOptions) -> Result<CompileSummary> {
    let mut src = Source::open(opts)?;
    let s = Settings::resolve(opts, &src)?;
    // Check every tensor before writing anything.
    let layout = layout::plan(&src.cfg, &src.ckpt, Storage { matrix: s.quant.matrix_dtype(), embedding: s.quant.embedding_dtype() })?;
    let unused: Vec<&str> = src.ckpt.names().filter(|n| !layout.consumed.contains(*n)).collect();
    if let Some(first) = unused.first() {
        src.warnings.push(format!("{}: {} tensor(s) not used by the model ignored, e.g. '{first}'", src.dir.display(), unused.len()));
    }
    let rows = Rows::resolve(opts, &src)?;
    // The sections, in the order they are produced: the weights (the data section), the core
    // header (graphs, plan, window), each graph's program, and a Snapdragon target's NPU
    // executables.
    let mut w = ArtifactWriter::create(&opts.output, &src.reads(opts))?;
    let weights = produce::weights(&src, &layout, &rows, &mut w, opts.progress)?;
    let mut header = produce::core(opts, &src, &s, &rows, &layout, &weights, &w)?;
    header.extensions.push(llada_ir::program::Programs::derive(&header).extension());
    let npu = produce::npu(opts, &src, &s, &layout, &weights, &mut header, &mut w)?;
    let (tensors, graphs) = (w.tensors().len(), header.graphs.len());
    let bytes = w.finish(header)?;
    Ok(CompileSummary { output: opts.output.clone(), bytes, tensors, graphs, quant: s.quant, max_seq: rows.max_seq, warnings: src.warnings, npu })
}
/// The f32 values of an artifact tensor, read again from its checkpoint sources (`segments`'
/// planned tensors, with the ids `ids` they were written as).
fn checkpoint_values<'a>(ckpt: &'a Checkpoint, segments: &'a [(String, Vec<Planned<'a>>)], ids: &[Vec<TensorId>]) -> impl Fn(TensorId) -> Result<Vec<f32>> + 'a {
    let planned: HashMap<TensorId, &Planned> = ids.iter().flatten().copied().zip(segments.iter().flat_map(|(_, p)| p.iter())).collect();
    move |t: TensorId| -> Result<Vec<f32>> {
        let p = planned.get(&t).ok_or_else(|| Error::Options(format!("lowering to QNN: tensor {t} has no checkpoint source")))?;
        let mut out = Vec::new();
        for src in &p.sources {
            ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
                to_f32(src.dtype, raw, &mut out);
                Ok(())
            })?;
        }
        Ok(out)
    }
}

/// Lowers every graph of `header` to QNN as `npu` says (`weights`: a tensor's values, as
/// [`checkpoint_values`] reads them), writes each context binary as a segment and adds the
/// section; returns (SoC, contexts, binary bytes, seconds).
fn add_npu_executables(header: &mut Header, w: &mut ArtifactWriter, weights: &dyn Fn(TensorId) -> Result<Vec<f32>>, calibration: &crate::qnn::Calibration, lib: &std::sync::Arc<llada_qnn::QnnLibrary>, npu: &crate::qnn::NpuOptions) -> Result<(String, usize, u64, f64)> {
    let (soc, format) = (npu.soc, npu.weights);
    let mut lowered = crate::qnn::lower(header, weights, calibration, lib, npu)?;
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
        // No NPU executables, so none of their activations (an explicit form is refused).
        npu_activations: NpuActivations::ByFormat,
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
             Lower --max-seq or --logit-rows, or choose a smaller --kv-dtype",
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
        Family::DiffusionGemma => crate::layout::diffusion_gemma::EMBEDDING,
    }
}

/// Streams the rows of `t`'s sources into 16-row panels and packs them.
fn write_packed(ckpt: &Checkpoint, t: &Planned, w: &mut ArtifactWriter, bar: &ProgressBar) -> Result<()> {
    let k = t.shape[1] as usize;
    if t.dtype == (DType::PanelQ4 { group: 32 }) && t.sources.iter().all(|s| s.dtype == SourceDType::Block(GgmlType::Q4_0)) {
        return carry_q4_0(ckpt, t, w, bar);
    }
    let mut panels = PanelStream::new(k);
    let pack = |rows: &[&[f32]], out: &mut Vec<u8>| pack_panel(t.dtype, rows, k, out);
    for src in &t.sources {
        let mut done = 0;
        ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
            let from = panels.pending.len();
            to_f32(src.dtype, raw, &mut panels.pending);
            if let Some(i) = first_overflow(panels.pending[from..].iter().copied(), t.dtype) {
                return Err(overflow(ckpt, src, done + i, t.dtype));
            }
            done += panels.pending.len() - from;
            bar.inc(raw.len() as u64);
            panels.flush(false, w, pack)
        })?;
    }
    panels.flush(true, w, pack)
}

/// Rows gathered until a panel's `PANEL` rows are whole, then packed and written: the
/// streaming [`write_packed`] and [`carry_q4_0`] share. A row is `row_len` elements of `T`.
struct PanelStream<T> {
    pending: Vec<T>,
    packed: Vec<u8>,
    row_len: usize,
}

impl<T> PanelStream<T> {
    fn new(row_len: usize) -> Self {
        PanelStream { pending: Vec::new(), packed: Vec::new(), row_len }
    }

    /// Packs and writes every whole panel pending (with `all`, the last partial one too).
    fn flush(&mut self, all: bool, w: &mut ArtifactWriter, pack: impl Fn(&[&[T]], &mut Vec<u8>)) -> Result<()> {
        let panel = PANEL * self.row_len;
        let mut start = 0;
        while self.pending.len() - start >= panel || (all && self.pending.len() > start) {
            let end = (start + panel).min(self.pending.len());
            let rows: Vec<&[T]> = self.pending[start..end].chunks(self.row_len).collect();
            self.packed.clear();
            pack(&rows, &mut self.packed);
            w.write(&self.packed)?;
            start = end;
        }
        self.pending.drain(..start);
        Ok(())
    }
}

/// [`write_packed`] of a matrix whose sources are all GGUF Q4_0: the blocks' nibbles and
/// scales moved into the panels as they are (`pack_q4_0_panel`), so the kernels compute with
/// exactly the file's numbers.
fn carry_q4_0(ckpt: &Checkpoint, t: &Planned, w: &mut ArtifactWriter, bar: &ProgressBar) -> Result<()> {
    let k = t.shape[1] as usize;
    let mut panels = PanelStream::new(k / 32 * llada_ir::packing::Q4_0_BLOCK_BYTES);
    let pack = |rows: &[&[u8]], out: &mut Vec<u8>| llada_ir::packing::pack_q4_0_panel(rows, k, out);
    for src in &t.sources {
        ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
            panels.pending.extend_from_slice(raw);
            bar.inc(raw.len() as u64);
            panels.flush(false, w, pack)
        })?;
    }
    panels.flush(true, w, pack)
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
    rope_tables_of_pairs(theta, head_dim, rotary_dim, rotary_dim / 2, rows)
}

/// [`rope_tables`] with the first `pairs` frequency pairs rotating, their exponents over
/// `exponent_width` (`2i / exponent_width`); the rest frequency 0. DiffusionGemma's
/// "proportional" rotary: a quarter of the pairs, exponents over the whole head.
pub fn rope_tables_of_pairs(theta: f64, head_dim: usize, exponent_width: usize, pairs: usize, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| if i < pairs { 1.0f32 / (theta as f32).powf((2 * i) as f32 / exponent_width as f32) } else { 0.0 }).collect();
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
            logit_rows: 64,
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
