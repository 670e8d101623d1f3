//! `llada-targets`: each target SoC (or the host standing in for one) described as plain
//! data in `targets/data/<name>.toml`. The compiler reads a target to shape its graphs and
//! plan its window; the runtime never needs it, because the plan already carries the result.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub name: String,
    pub description: String,
    /// Bytes the accelerator can address in one session.
    pub window_bytes: u64,
    /// Alignment of every tensor placed in the window.
    pub window_align: u64,
    /// Static graph row counts are rounded up to a multiple of this.
    pub row_multiple: u32,
    /// Stored weight types the target's kernels read.
    pub weight_dtypes: Vec<String>,
}

const BUILTIN: &[(&str, &str)] = &[("host", include_str!("../data/host.toml"))];

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
    #[test]
    fn every_builtin_target_parses_and_is_consistent() {
        for name in super::names() {
            let t = super::by_name(name).unwrap();
            assert_eq!(t.name, name);
            assert!(t.row_multiple > 0 && t.window_align.is_power_of_two() && t.window_bytes > 0);
        }
    }

    #[test]
    fn unknown_target_lists_known_ones() {
        let err = super::by_name("toaster").unwrap_err();
        assert!(err.contains("toaster") && err.contains("host"), "{err}");
    }
}
