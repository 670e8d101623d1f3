//! What the graph fixes must agree with the `config.json` beside it: the compiled plan takes
//! its shapes, epsilon and rotary base from the config, so a disagreement would compile into
//! a model that computes something else. Each is reported as the config key and both values.

use crate::hf::config::LladaConfig;

use super::recognise::{Recognised, RotaryTable};
use super::tensor::Elem;

fn disagree(key: &str, config: impl std::fmt::Display, graph: String) -> String {
    format!("config.json says {key} {config}, but {graph}; correct config.json (or re-export from the checkpoint it belongs to)")
}

pub fn against_config(found: &Recognised, cfg: &LladaConfig) -> Result<(), String> {
    let [rows, d_model] = found.embedding.dims[..] else { unreachable!("the recogniser takes a 2-D embedding table") };
    if d_model != cfg.dims.d_model {
        return Err(disagree("d_model", cfg.dims.d_model, format!("the graph's embedding table is {rows} x {d_model} (d_model {d_model})")));
    }
    let vocab_key = if cfg.dims.embedding_size == cfg.dims.vocab_size { "vocab_size" } else { "embedding_size" };
    if rows != cfg.dims.embedding_size {
        return Err(disagree(vocab_key, cfg.dims.embedding_size, format!("the graph's embedding table has {rows} rows")));
    }
    if found.lm_head.out_features() != cfg.dims.embedding_size {
        return Err(disagree(vocab_key, cfg.dims.embedding_size, format!("{} (the LM head) gives {} logits", found.lm_head.node.label(), found.lm_head.out_features())));
    }
    if found.blocks.len() != cfg.dims.n_layers {
        return Err(disagree("n_layers", cfg.dims.n_layers, format!("the graph has {} LLaDA blocks", found.blocks.len())));
    }
    let hd = cfg.head_dim();
    for b in &found.blocks {
        let a = &b.attention;
        if a.heads != cfg.dims.n_heads || a.head_dim != hd {
            return Err(disagree("n_heads", cfg.dims.n_heads, format!("{} attends with {} heads of {} (config: {} heads of d_model/n_heads = {hd})", a.node.label(), a.heads, a.head_dim, cfg.dims.n_heads)));
        }
        let want = 1.0 / (hd as f64).sqrt();
        if ((a.scale - want) / want).abs() > a.scale_tolerance * 2.0 + 1e-6 {
            return Err(format!(
                "{}: attention scores scaled by {:.6}; head_dim {hd} (config.json's d_model/n_heads) needs 1/sqrt({hd}) = {want:.6}",
                a.node.label(),
                a.scale
            ));
        }
        for (what, p) in [("k", &b.k), ("v", &b.v)] {
            let kv = p.out_features() / hd.max(1);
            if kv != cfg.dims.n_kv_heads || p.out_features() % hd.max(1) != 0 {
                return Err(disagree("n_kv_heads", cfg.dims.n_kv_heads, format!("{} (the {what} projection) gives {} features, {kv} heads of {hd}", p.node.label(), p.out_features())));
            }
        }
        if b.gate.out_features() != cfg.dims.mlp_hidden {
            return Err(disagree("mlp_hidden_size", cfg.dims.mlp_hidden, format!("{} (the gate projection) is {} wide", b.gate.node.label(), b.gate.out_features())));
        }
    }
    for (node, eps, elem) in &found.norm_eps {
        // The exporter stores epsilon as a float32 (or narrower) constant.
        let tol = elem.epsilon().max(Elem::F32.epsilon()) * 2.0;
        if ((eps - cfg.dims.rms_eps) / cfg.dims.rms_eps).abs() > tol {
            return Err(disagree("rms_norm_eps", format!("{:e}", cfg.dims.rms_eps), format!("{} adds RMSNorm epsilon {:e}", node.label(), *eps as f32)));
        }
    }
    rotary(&found.rotary, cfg)
}

/// The rotary tables must be LLaDA's for the config: cos and sin of `p * theta^(-2j/hd)` for
/// position `p` and frequency `j`, the half-split layout (both halves of a head share angles).
fn rotary(tables: &[RotaryTable], cfg: &LladaConfig) -> Result<(), String> {
    if tables.is_empty() {
        return Err("no rotary embedding found: no constant cos or sin table multiplies q or k, and no RotaryEmbedding op rotates them".into());
    }
    let hd = cfg.head_dim();
    for t in tables {
        let cols = *t.table.dims.last().unwrap_or(&0);
        let dim = if t.half { cols * 2 } else { cols };
        if dim != hd {
            return Err(disagree("n_heads", cfg.dims.n_heads, format!("{}'s rotary tables rotate {dim} dimensions per head, while d_model/n_heads is {hd} (LLaDA rotates whole heads)", t.node.label())));
        }
        let values = t.table.f64s()?;
        if cols == 0 || values.len() < cols {
            return Err(format!("{}: a rotary table of shape {:?} holds no position", t.node.label(), t.table.dims));
        }
        let rows = values.len() / cols;
        let is_cos = values[..cols].iter().all(|&v| (v - 1.0).abs() < 1e-3);
        if !is_cos && !values[..cols].iter().all(|&v| v.abs() < 1e-3) {
            return Err(format!("{}: multiplies q or k by a constant of shape {:?} that is not a rotary cos or sin table (position 0 is not all 1 or all 0)", t.node.label(), t.table.dims));
        }
        let tol = if t.table.elem == Elem::F32 || t.table.elem == Elem::F64 { 2e-3 } else { 2e-2 };
        let expected = |theta: f64, p: usize, c: usize| {
            let j = c % (hd / 2);
            let angle = p as f64 * theta.powf(-2.0 * j as f64 / hd as f64);
            if is_cos {
                angle.cos()
            } else {
                angle.sin()
            }
        };
        let worst = (0..rows).flat_map(|p| (0..cols).map(move |c| (p, c))).map(|(p, c)| (values[p * cols + c] - expected(cfg.dims.rope_theta, p, c)).abs()).fold(0.0, f64::max);
        if worst > tol {
            let graph = match graph_theta(tables, hd) {
                Some(theta) => format!("the rotary tables {} multiplies by are those of rope_theta {}", t.node.label(), round_sig(theta)),
                None => format!("the rotary tables {} multiplies by differ from that base's by up to {worst:.3}", t.node.label()),
            };
            return Err(disagree("rope_theta", cfg.dims.rope_theta, graph));
        }
    }
    Ok(())
}

/// The rotary base the tables were built with, from the angle of frequency 1 at position 1
/// (`theta^(-2/hd)`), where a cos and a sin table are both present.
fn graph_theta(tables: &[RotaryTable], hd: usize) -> Option<f64> {
    let at = |t: &RotaryTable| -> Option<f64> {
        let cols = *t.table.dims.last()?;
        let v = t.table.f64s().ok()?;
        (v.len() >= 2 * cols && cols >= 2).then(|| v[cols + 1])
    };
    let row0 = |t: &RotaryTable| t.table.f64s().ok().and_then(|v| v.first().copied());
    let cos = tables.iter().find(|t| row0(t).is_some_and(|x| (x - 1.0).abs() < 1e-3)).and_then(at)?;
    let sin = tables.iter().find(|t| row0(t).is_some_and(|x| x.abs() < 1e-3)).and_then(at)?;
    let freq = sin.atan2(cos);
    (freq > 0.0).then(|| freq.powf(-(hd as f64) / 2.0))
}

fn round_sig(x: f64) -> String {
    if !x.is_normal() {
        return format!("{x}");
    }
    let digits = 3 - (x.abs().log10().floor() as i32).clamp(-300, 300);
    if digits > 0 {
        format!("{:.*}", digits as usize, x)
    } else {
        let p = 10f64.powi(-digits);
        format!("{}", (x / p).round() * p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_base_is_read_back_to_four_figures() {
        assert_eq!(round_sig(500000.3), "500000");
        assert_eq!(round_sig(10000.0), "10000");
        assert_eq!(round_sig(1234567.0), "1235000");
    }
}
