//! The settings a compile derives from its options and its source, every option checked
//! against the target, the checkpoint and the others before any work (one error, naming the
//! flag): the weights' storage, the NPU's forms, the window, the KV cache, the row buckets.

use llada_ir::npu::NpuWeights;
use llada_ir::window::{ActivationScales, ACTIVATION_BLOCK};
use llada_ir::KvDType;

use super::source::Source;
use super::{default_activation_scales, embedding_name, CompileOptions, NpuActivations, NpuLimitOverrides, Quant};
use crate::error::{Error, Result};
use crate::lower;

pub(super) struct Settings {
    /// The Snapdragon SoC whose NPU executables are built (none with `--host-only`).
    pub npu_soc: Option<(&'static str, u32)>,
    pub quant: Quant,
    pub npu_weights: NpuWeights,
    /// The calibration prompts of 16-bit NPU activations, and where they came from.
    pub calibration_set: Option<(Vec<String>, String)>,
    pub activation_scales: ActivationScales,
    pub window_bytes: u64,
    pub kv_dtype: KvDType,
}

/// Refuses, each by flag, the NPU's options where the compile builds no NPU executables
/// (`npu` false: another target, or --host-only), and --host-only or --qnn-lib where the target
/// has none to skip or build.
fn check_npu_flags(opts: &CompileOptions, target: &str, npu: bool) -> Result<()> {
    if crate::qnn::soc_of(target).is_none() && (opts.host_only || opts.qnn_lib.is_some()) {
        let flag = if opts.host_only { "--host-only" } else { "--qnn-lib" };
        return Err(Error::Options(format!("{flag}: target '{target}' has no NPU executables (only sm8550, sm8650, sm8750 and sm8850 do)")));
    }
    if opts.host_only && opts.qnn_lib.is_some() {
        return Err(Error::Options("--qnn-lib: --host-only builds no NPU executables, so no QNN library is used".into()));
    }
    if !npu {
        let sessions = if opts.npu_limits.sessions.is_some() { "--npu-sessions" } else { "--npu-session-bytes" };
        let refused = [
            (opts.npu_limits != NpuLimitOverrides::default(), sessions.to_string(), "are planned over HTP sessions"),
            (opts.npu_activations == NpuActivations::F16, "--npu-activations f16".to_string(), "have NPU activations"),
            (opts.npu_contexts.is_some(), format!("--npu-contexts {}", opts.npu_contexts.unwrap_or(0)), "are split into contexts"),
            (opts.npu_estimate_soc.is_some(), format!("--npu-estimate-soc {}", opts.npu_estimate_soc.unwrap_or(0)), "are estimated"),
            (opts.npu_shared_weights, "--npu-shared-weights".to_string(), "hold weights in contexts"),
        ];
        if let Some((_, flag, what)) = refused.into_iter().find(|r| r.0) {
            return Err(Error::Options(format!("{flag}: only the NPU executables of a Snapdragon target (without --host-only) {what}")));
        }
    }
    if opts.npu_limits.sessions == Some(0) || opts.npu_limits.session_bytes == Some(0) {
        return Err(Error::Options("--npu-sessions and --npu-session-bytes must be above 0".into()));
    }
    Ok(())
}

impl Settings {
    pub fn resolve(opts: &CompileOptions, src: &Source) -> Result<Settings> {
        let (cfg, ckpt, target) = (&src.cfg, &src.ckpt, &src.target);
        let (d, hd, f) = (cfg.dims.d_model, cfg.head_dim(), cfg.dims.mlp_hidden);
        let q_dim = cfg.dims.n_heads * hd;
        let embed_dtype = ckpt.expect(embedding_name(&cfg), &[cfg.dims.embedding_size, d], &format!("embedding_size {}, d_model {d}", cfg.dims.embedding_size))?.dtype;
        // An NPU target's executables hold fp16 weights unless --quant asks for int8 or int4, so
        // fp16 is its default storage too (with --host-only as well: its kernels take no f32).
        let npu_soc = if opts.host_only { None } else { crate::qnn::soc_of(&target.name) };
        check_npu_flags(opts, &target.name, npu_soc.is_some())?;
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
                    let given = if opts.activation_scales.is_some() { "--activation-scales block".to_string() } else { format!("{}'s default activation scales (block)", quant.name()) };
                    return Err(Error::Options(format!("{given}: {what} ({k}) is not whole blocks of {ACTIVATION_BLOCK} inputs; use --activation-scales row")));
                }
            }
        }
        if !target.weight_dtypes.iter().any(|t| t == quant.target_name()) {
            let given = if opts.quant.is_some() { format!("--quant {}", quant.target_name()) } else { format!("the checkpoint's {} weights (no --quant)", quant.target_name()) };
            return Err(Error::Options(format!("{given}: target '{}' supports {}; pass --quant with one of them", target.name, target.weight_dtypes.join(", "))));
        }
        if let Quant::Q4 { group } = quant {
            let widths = [("d_model", d), ("n_heads x head_dim", q_dim), ("mlp_hidden_size", f)];
            let fits = |g: usize| g > 0 && g % 8 == 0 && widths.iter().all(|(_, k)| k % g == 0);
            if !fits(group as usize) {
                let (what, k) = widths.iter().find(|(_, k)| group == 0 || k % group as usize != 0).unwrap_or(&widths[0]);
                // (DiffusionGemma's experts are 704 wide: 128 does not divide them.)
                let other = [128, 64, 32].into_iter().find(|&g| fits(g)).map_or(String::new(), |g| format!("; --group {g} divides every width of this model"));
                return Err(Error::Options(format!("--group {group}: q4 groups must be a multiple of 8 dividing {what} ({k}){other}")));
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
        Ok(Settings { npu_soc, quant, npu_weights, calibration_set, activation_scales, window_bytes, kv_dtype })
    }
}

/// The graphs' row counts: every bucket, the longest sequence (the KV cache's and the rotary
/// tables' positions) and the largest row-set graph.
pub(super) struct Rows {
    pub max_seq: u32,
    pub buckets: Vec<u32>,
    pub rope_rows: u32,
    pub row_set_rows: u32,
}

impl Rows {
    pub fn resolve(opts: &CompileOptions, src: &Source) -> Result<Rows> {
        let (cfg, target) = (&src.cfg, &src.target);
        let max_seq = opts.max_seq.unwrap_or((cfg.dims.max_sequence_length as u32).min(target.default_max_seq));
        if max_seq == 0 || max_seq as usize > cfg.dims.max_sequence_length {
            return Err(Error::Options(format!(
                "--max-seq {max_seq}: must be between 1 and the model's max_sequence_length ({})",
                cfg.dims.max_sequence_length
            )));
        }
        if opts.logit_rows == 0 {
            return Err(Error::Options("--logit-rows must be at least 1".into()));
        }
        if opts.block_len == 0 || opts.block_len > max_seq {
            let positions = if opts.max_seq.is_some() { "--max-seq" } else { "the artifact's positions (the model's max_sequence_length, at most the target's default)" };
            return Err(Error::Options(format!("--block-len {}: must be between 1 and {positions}, {max_seq}", opts.block_len)));
        }
        // The exact sampler asks for a block's logits in one pass (DiffusionGemma's decoder
        // returns its whole canvas's whatever this says).
        if opts.logit_rows < opts.block_len && cfg.family != llada_ir::Family::DiffusionGemma {
            return Err(Error::Options(format!("--logit-rows {} is fewer than the block length {} (--block-len): a pass returns the logits of a whole block", opts.logit_rows, opts.block_len)));
        }
        let mut buckets = lower::exact_buckets(max_seq, target.row_multiple);
        let rope_rows = *buckets.last().unwrap();
        // Row-set graphs: every multiple of the target's row tile up to a block and its
        // speculative blocks, so the latency buckets can be chosen among them.
        let round = |r: u32| r.div_ceil(target.row_multiple) * target.row_multiple;
        // A depth given must fit the positions resolved here (the model's own maximum among
        // them), which the flags' early check could not know.
        if let Some(k) = opts.spec_blocks {
            super::check_spec_blocks(k, opts.block_len, max_seq, "this artifact (--max-seq, or the model's max_sequence_length)").map_err(Error::Options)?;
        }
        let spec_blocks = opts.spec_blocks();
        let row_set_rows = round(opts.block_len * (1 + spec_blocks)).min(rope_rows);
        let tiles = (1..).map(|i| i * target.row_multiple).take_while(|&r| r <= row_set_rows);
        let exact = (0..=spec_blocks).map(|k| round(opts.block_len * (1 + k))).filter(|&r| r <= rope_rows);
        for rows in tiles.chain(exact) {
            if !buckets.contains(&rows) {
                buckets.push(rows);
            }
        }
        buckets.sort_unstable();
        Ok(Rows { max_seq, buckets, rope_rows, row_set_rows })
    }
}
