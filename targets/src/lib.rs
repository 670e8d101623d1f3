//! `llada-targets`: each target SoC (or the host standing in for one) described as plain
//! data in `targets/data/<name>.toml`, every figure with a sentence saying where it came
//! from. The compiler reads a target to shape its graphs, plan its window and predict pass
//! times ([`cost`]); the runtime never needs it, because the plan already carries the result.

pub mod cost;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Peak rates of one compute engine, in operations per second (one multiply-add counts as
/// 2). 0 means the engine has no such path; [`cost`] then falls back to the f32 rate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rates {
    /// f32 multiply-adds (on an NPU: its vector unit, where elementwise ops also run).
    pub f32_flops: f64,
    /// f16 products (on an NPU: its matrix unit).
    pub f16_flops: f64,
    /// bf16 products with f32 sums.
    pub bf16_flops: f64,
    /// int8 products with int32 sums.
    pub int8_ops: f64,
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
    /// Accelerator sessions one process may open (`window_bytes` is per session).
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
    /// Where each numeric field's figure came from, keyed by field name (`accelerator.f16_flops`
    /// for a rate).
    pub sources: BTreeMap<String, String>,
    /// True when the rates are not measured on the machine, so tools label predictions
    /// "estimate".
    pub estimated: bool,
}

/// Weight types a target may list (the names `--quant` takes).
pub const WEIGHT_DTYPES: &[&str] = &["f32", "bf16", "f16", "q8", "q4"];

const BUILTIN: &[(&str, &str)] = &[
    ("host", include_str!("../data/host.toml")),
    ("sm8650", include_str!("../data/sm8650.toml")),
    ("sm8750", include_str!("../data/sm8750.toml")),
    ("dimensity9400", include_str!("../data/dimensity9400.toml")),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Dotted paths of every numeric field of `t` (`accelerator.f16_flops`...), found by
    /// serialising it, so a field added later cannot be forgotten by the sources test.
    fn numeric_fields(t: &Target) -> Vec<String> {
        fn walk(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
            for (k, v) in table {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                match v {
                    toml::Value::Integer(_) | toml::Value::Float(_) => out.push(path),
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

    #[test]
    fn unknown_target_lists_known_ones() {
        let err = by_name("toaster").unwrap_err();
        assert!(err.contains("toaster") && err.contains("host") && err.contains("sm8750"), "{err}");
    }
}
