//! `llada-targets`: each target accelerator (a phone SoC's NPU, a phone GPU driven through
//! Vulkan, or the host standing in for one) described as plain data in
//! `targets/data/<name>.toml`, every figure with a sentence saying where it came from. The
//! compiler reads a target to shape its graphs, plan its window and predict pass times
//! ([`cost`]); the runtime never needs it, because the plan already carries the result.
//!
//! What the kernels compute, which the rates must describe: activations are f32 (on an NPU
//! target, f16 where `activation_dtype` says so); q8 and q4 weights are multiplied with
//! activations quantised to int8 per row (W8A8 and W4A8) at the `int8_ops` rate on every
//! target; f16 and f32 weights run at the activation type's rate, bf16 weights at the bf16
//! rate only when the plan rounds activations to bf16.

pub mod cost;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Peak rates of one compute engine, in operations per second (one multiply-add counts as
/// 2). 0 means the engine has no such path; [`cost`] then falls back to the f32 rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rates {
    /// f32 multiply-adds (on an NPU: its vector unit, where elementwise ops also run; on a
    /// GPU: its shader ALUs, where everything but the quantised matmuls runs).
    pub f32_flops: f64,
    /// f16 products (on an NPU: its matrix unit).
    pub f16_flops: f64,
    /// bf16 products with f32 sums.
    pub bf16_flops: f64,
    /// int8 products with int32 sums: the rate of every q8 and q4 matmul (W8A8, W4A8).
    pub int8_ops: f64,
}

/// What a GPU target's Vulkan driver reports, which the plan must respect: the window is
/// one device allocation, and each shader binding covers at most a storage-buffer range.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuLimits {
    /// `maxMemoryAllocationSize`: the largest single allocation, so the largest window.
    pub max_allocation_bytes: u64,
    /// `maxStorageBufferRange`: the most bytes one storage-buffer binding may cover, so the
    /// most a region the backend binds whole may hold (a larger matrix is bound in slices).
    pub max_storage_buffer_bytes: u64,
    /// `minStorageBufferOffsetAlignment`: a binding's offset must be a multiple of it, so
    /// `window_align` is.
    pub storage_buffer_offset_align: u64,
    /// Threads of one subgroup (a wave): the width shaders reduce and share across.
    pub subgroup_size: u32,
    /// `shaderFloat16`: f16 arithmetic in shaders.
    pub shader_float16: bool,
    /// `VK_KHR_shader_integer_dot_product`: packed int8 dot products in shaders (the
    /// shaders use them where the driver reports them; `accelerator.int8_ops` stays the 32-bit
    /// integer rate, their rate being unpublished).
    pub integer_dot_product: bool,
}

/// One target: its accelerator window, graph shapes, dtypes and rates, with sources.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The name `--target` takes; also the data file's stem.
    pub name: String,
    /// One line for `lladac targets`.
    pub description: String,
    /// Bytes the accelerator can address in one session.
    pub window_bytes: u64,
    /// Alignment of every tensor placed in the window.
    pub window_align: u64,
    /// Static graph row counts are rounded up to a multiple of this.
    pub row_multiple: u32,
    /// Stored weight types the target's kernels read.
    pub weight_dtypes: Vec<String>,
    /// Accelerator sessions one process may open (on a Snapdragon target the HTP's process
    /// domains, which its contexts spread over: `npu_memory`).
    pub sessions_per_process: u32,
    /// What the accelerator computes activations in: "f32" or "f16".
    pub activation_dtype: String,
    /// The KV-cache element type the compiler picks by default: "f32", "f16" or "bf16".
    pub kv_dtype: String,
    /// DRAM bandwidth, bytes per second.
    pub dram_bytes_per_second: f64,
    /// Flash (UFS) read rate, bytes per second: what loading an artifact costs.
    pub storage_bytes_per_second: f64,
    /// Rate at which weights are copied into the window, bytes per second.
    pub staging_bytes_per_second: f64,
    /// Seconds to map one buffer into the accelerator's address space (once per slot or
    /// region; a steady state remaps nothing).
    pub map_seconds: f64,
    /// The accelerator's peak rates.
    pub accelerator: Rates,
    /// The CPU's peak rates, over the cores a runtime session uses (`max_threads`).
    pub cpu: Rates,
    /// Most CPU threads a runtime session uses (sizes per-thread kernel scratch).
    pub max_threads: u32,
    /// Longest sequence compiled when `--max-seq` is not given (the model's own maximum
    /// caps it): the KV cache of a phone's window cannot hold 4096 positions of an 8B model.
    pub default_max_seq: u32,
    /// The device's Vulkan limits, on a GPU target (absent on NPU and host targets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuLimits>,
    /// Where each numeric field's figure came from, keyed by field name (`accelerator.f16_flops`
    /// for a rate, `gpu.subgroup_size` for a GPU fact).
    pub sources: BTreeMap<String, String>,
    /// True when the rates are not measured on the machine, so tools label predictions
    /// "estimate".
    pub estimated: bool,
    /// On a Snapdragon target: the cost model's roofline fitted to QNN's own performance
    /// model of the HTP executables `lladac` builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npu_timing: Option<NpuTiming>,
    /// On a Snapdragon target: the HTP's memory limits the contexts are planned against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub npu_memory: Option<NpuMemory>,
}

/// What a phone's HTP maps, and what creating a context costs (QNN.md, "Residency, load cost
/// and speed on a phone"): every context and the I/O allocation is one mapping of at most
/// `mapping_bytes`; one session (process domain) maps at most `session_bytes` (its contexts,
/// the I/O its executables bind and their spill-fill buffer); a phone grants
/// `sessions_per_process` sessions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpuMemory {
    pub mapping_bytes: u64,
    pub session_bytes: u64,
    /// Seconds `contextCreateFromBinary` takes per byte of binary.
    pub create_seconds_per_byte: f64,
}

/// QNN's estimate of an executable as the cost model's roofline seconds times
/// `roofline_scale` plus `op_seconds` per planned op (what the roofline leaves out: each op's
/// dispatch, layout changes, the vector unit's small ops), fitted to the estimates QNN's
/// performance model gives at finalize for SoC id `estimate_soc`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpuTiming {
    pub estimate_soc: u32,
    pub roofline_scale: f64,
    pub op_seconds: f64,
}

impl NpuTiming {
    /// Seconds of an executable of `ops` planned ops whose roofline is `roofline` seconds.
    pub fn seconds(&self, roofline: f64, ops: usize) -> f64 {
        self.roofline_scale * roofline + self.op_seconds * ops as f64
    }
}

/// Weight types a target may list (the names `--quant` takes).
pub const WEIGHT_DTYPES: &[&str] = &["f32", "bf16", "f16", "q8", "q4"];

const BUILTIN: &[(&str, &str)] = &[
    ("host", include_str!("../data/host.toml")),
    ("sm8550", include_str!("../data/sm8550.toml")),
    ("sm8650", include_str!("../data/sm8650.toml")),
    ("sm8750", include_str!("../data/sm8750.toml")),
    ("sm8850", include_str!("../data/sm8850.toml")),
    ("dimensity9400", include_str!("../data/dimensity9400.toml")),
    ("adreno750", include_str!("../data/adreno750.toml")),
    ("adreno830", include_str!("../data/adreno830.toml")),
    ("immortalis-g925", include_str!("../data/immortalis-g925.toml")),
];

/// Names of the built-in targets.
pub fn names() -> Vec<&'static str> {
    BUILTIN.iter().map(|(n, _)| *n).collect()
}

/// A built-in target by name; the error lists the names that exist.
pub fn by_name(name: &str) -> Result<Target, String> {
    let (_, text) = BUILTIN
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| format!("unknown target '{name}'; known targets: {}", names().join(", ")))?;
    toml::from_str(text).map_err(|e| format!("built-in target '{name}' is malformed: {e}"))
}

impl Target {
    /// The largest window the accelerator can hold, with what sets it: on a GPU, its largest
    /// single allocation (the Vulkan backend allocates the window as one); elsewhere none
    /// beyond the window format's own.
    pub fn max_window_bytes(&self) -> Option<(u64, String)> {
        self.gpu.map(|g| (g.max_allocation_bytes, format!("target '{}': its GPU's largest single allocation (maxMemoryAllocationSize)", self.name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dotted paths of every figure of `t`: its numeric fields (`accelerator.f16_flops`...)
    /// and the yes-or-no facts of its tables (`gpu.shader_float16`), found by serialising it,
    /// so a field added later cannot be forgotten by the sources test. (`estimated`, a
    /// top-level flag, is a label, not a fact about the hardware.)
    fn numeric_fields(t: &Target) -> Vec<String> {
        fn walk(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in table {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                match v {
                    toml::Value::Integer(_) | toml::Value::Float(_) => out.push(path),
                    toml::Value::Boolean(_) if !prefix.is_empty() => out.push(path),
                    // `sources` is a table of strings, never numbers: nothing to find there.
                    toml::Value::Table(inner) => walk(&path, inner, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk("", &toml::Table::try_from(t).unwrap(), &mut out);
        out
    }

    #[test]
    fn every_builtin_target_parses_and_is_consistent() {
        for name in names() {
            let t = by_name(name).unwrap();
            assert_eq!(t.name, name);
            assert!(t.row_multiple > 0 && t.window_align.is_power_of_two() && t.window_bytes > 0, "{name}");
            assert!(t.window_align.is_multiple_of(llada_ir::WINDOW_ALIGN), "{name}: window_align below the format's");
            // The verifier lets a region's size round up to at most this much.
            assert!(t.window_align <= llada_ir::window::MAX_REGION_ALIGN, "{name}: window_align above what the verifier allows");
            assert!(t.sessions_per_process > 0 && t.max_threads > 0, "{name}");
            assert!(t.weight_dtypes.iter().all(|d| WEIGHT_DTYPES.contains(&d.as_str())), "{name}: {:?}", t.weight_dtypes);
            assert!(["f32", "f16"].contains(&t.activation_dtype.as_str()), "{name}");
            assert!(["f32", "f16", "bf16"].contains(&t.kv_dtype.as_str()), "{name}");
            for rate in [t.dram_bytes_per_second, t.storage_bytes_per_second, t.staging_bytes_per_second] {
                assert!(rate.is_finite() && rate > 0.0, "{name}");
            }
            assert!(t.map_seconds.is_finite() && t.map_seconds >= 0.0, "{name}");
            // Every Snapdragon target plans its contexts against the HTP's limits.
            assert_eq!(t.npu_memory.is_some(), name.starts_with("sm"), "{name}");
            if let Some(m) = t.npu_memory {
                assert!(m.mapping_bytes > 0 && m.session_bytes >= m.mapping_bytes && m.create_seconds_per_byte > 0.0, "{name}");
                assert!(t.window_bytes <= m.mapping_bytes, "{name}: the window is one mapping");
            }
            for r in [t.accelerator, t.cpu] {
                // f32 is every engine's fallback, so it must be present.
                assert!(r.f32_flops > 0.0, "{name}");
                assert!([r.f16_flops, r.bf16_flops, r.int8_ops].iter().all(|x| x.is_finite() && *x >= 0.0), "{name}");
            }
        }
    }

    #[test]
    fn every_numeric_figure_has_a_source_and_phone_npu_rates_say_estimate() {
        for name in names() {
            let t = by_name(name).unwrap();
            let fields = numeric_fields(&t);
            assert!(fields.len() >= 17, "{name}: {fields:?}");
            for f in &fields {
                let s = t.sources.get(f).unwrap_or_else(|| panic!("{name}: no source for {f}"));
                assert!(s.len() > 20, "{name}: source of {f} is too thin: {s:?}");
            }
            // A key that names no field is a typo that would leave a figure unexplained.
            for k in t.sources.keys() {
                assert!(fields.contains(k), "{name}: source for unknown field {k}");
            }
            // Nobody publishes phone NPU rates: every one must say it is an estimate.
            assert_eq!(t.estimated, name != "host", "{name}");
            if t.estimated {
                for f in fields.iter().filter(|f| f.starts_with("accelerator.")) {
                    assert!(t.sources[f].to_lowercase().contains("estimate"), "{name}: source of {f} must say estimate");
                }
            }
        }
    }

    /// A GPU target's window is one Vulkan allocation: it must fit the device's largest, its
    /// tensors must sit at offsets a binding may start at, and its shaders compute in f32.
    #[test]
    fn gpu_targets_fit_their_device_limits() {
        let gpus: Vec<Target> = names().into_iter().map(|n| by_name(n).unwrap()).filter(|t| t.gpu.is_some()).collect();
        let gpu_names: Vec<&str> = gpus.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(gpu_names, ["adreno750", "adreno830", "immortalis-g925"]);
        for t in &gpus {
            let (name, g) = (&t.name, t.gpu.unwrap());
            assert!(t.window_bytes <= g.max_allocation_bytes, "{name}: window above the largest allocation");
            assert_eq!(t.max_window_bytes().map(|m| m.0), Some(g.max_allocation_bytes), "{name}");
            // Vulkan guarantees at least these (its required limits), and caps the alignment.
            assert!(g.max_allocation_bytes >= 1 << 30 && g.max_storage_buffer_bytes >= 1 << 27, "{name}");
            assert!(g.storage_buffer_offset_align.is_power_of_two() && g.storage_buffer_offset_align <= 256, "{name}");
            assert!(t.window_align.is_multiple_of(g.storage_buffer_offset_align), "{name}: a tensor could start where no binding may");
            assert!(g.subgroup_size.is_power_of_two(), "{name}");
            assert_eq!((t.activation_dtype.as_str(), t.estimated), ("f32", true), "{name}: the shaders compute activations in f32");
            // The quantised matmuls run at `int8_ops`, so it must be a real rate, not a fallback.
            assert!(t.accelerator.int8_ops > 0.0, "{name}");
        }
        for name in ["host", "sm8650", "sm8750", "dimensity9400"] {
            assert!(by_name(name).unwrap().max_window_bytes().is_none(), "{name}");
        }
    }

    #[test]
    fn unknown_target_lists_known_ones() {
        let err = by_name("toaster").unwrap_err();
        assert!(err.contains("toaster") && err.contains("host") && err.contains("sm8750"), "{err}");
    }
}
