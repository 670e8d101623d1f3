//! The plan's latency table: each graph's predicted pass time on the compile target, from
//! the target's rates through the cost model of `llada-targets`.

use llada_ir::Header;
use llada_targets::{cost, Target};

/// Bytes per activation element on a target.
pub fn activation_bytes(t: &Target) -> u32 {
    if t.activation_dtype == "f16" { 2 } else { 4 }
}

/// Predicted seconds of one pass of every graph: all its rows real, all its head rows asked
/// for, attending to as many positions as it has rows, with its swap schedule's staging
/// overlapped with compute.
pub fn record(h: &mut Header, t: &Target) {
    let machine = t.accelerator_machine();
    let kv = h.plan.window.kv_dtype.bytes() as u32;
    let act = activation_bytes(t);
    let latency = h
        .graphs
        .iter()
        .map(|g| {
            let work = cost::graph_work(h, g, g.head_rows, g.rows, kv, act);
            cost::pass_estimate(&machine, &work, crate::window::staged_bytes(h, g), true).seconds
        })
        .collect();
    h.plan.latency = latency;
    h.plan.latency_target = format!("{} ({})", t.name, if t.estimated { "estimate" } else { "rates from the target file" });
}
