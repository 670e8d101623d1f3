//! How a checkpoint's files are written: JSON whole or not at all through `llada_ir::files`,
//! safetensors shards under a hidden name renamed when complete.

use std::path::Path;

use serde_json::Value;

/// Writes a JSON file of a checkpoint whole or not at all (`llada_ir::files`).
pub fn write_json(path: &Path, v: &Value) -> std::io::Result<()> {
    llada_ir::files::write_atomic(path, &[], serde_json::to_string_pretty(v)?.as_bytes())
}

/// Writes a safetensors file under a hidden name beside `path`, renamed to it when complete
/// (safetensors writes through a path and streams the lazily made tensors, so the whole
/// shard is never in memory; an interrupted run can leave the hidden `.NAME.partial`).
pub fn write_safetensors<V: safetensors::View>(path: &Path, views: Vec<(String, V)>, metadata: Option<std::collections::HashMap<String, String>>) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.partial"));
    let written = safetensors::serialize_to_file(views, metadata, &tmp).map_err(|e| std::io::Error::other(e.to_string())).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}
