//! The plan's latency table: each graph's predicted pass time on the compile target, from
//! the target's rates through the cost model of `llada-targets`.

use llada_ir::{ExpertCosts, Header, Op};
use llada_targets::{cost, Target};

/// Bytes per activation element on a target.
pub fn activation_bytes(t: &Target) -> u32 {
    if t.activation_dtype == "f16" { 2 } else { 4 }
}

/// Predicted seconds of one pass of every graph: all its rows real, all its logit rows asked
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
            let work = cost::graph_work(h, g, g.logit_rows, g.rows, kv, act);
            cost::pass_estimate(&machine, &work, crate::window::staged_bytes(h, g), true).seconds
        })
        .collect();
    h.plan.latency = latency;
    h.plan.latency_target = format!("{} ({})", t.name, if t.estimated { "estimate" } else { "rates from the target file" });
}

/// What one expert costs on the target's accelerator (its activation type) and on its CPU
/// (f32 activations), and copying it into a slot; zero for a dense model.
pub fn expert_costs(h: &Header, t: &Target) -> ExpertCosts {
    let first = h.graphs.first().and_then(|g| g.ops.iter().find_map(|op| if let Op::MoeExperts { first, .. } = *op { Some(first) } else { None }));
    let Some(first) = first else { return ExpertCosts::default() };
    let bytes = cost::expert_work(h, first, 4).0;
    ExpertCosts {
        accelerator: cost::expert_path_cost(&t.accelerator_machine(), h, first, activation_bytes(t)),
        cpu: cost::expert_path_cost(&t.cpu_machine(), h, first, 4),
        stage_seconds: bytes / t.staging_bytes_per_second,
    }
}

/// A smaller row-set graph is worth a bucket only if the cost model predicts it at most this
/// share of the next larger bucket's time: below that saving, running the larger graph and
/// filling its idle rows with speculation is free.
const BUCKET_SAVING: f64 = 0.9;

/// The plan's latency buckets (needs `record` first): the row counts up to `largest` whose
/// graphs the cost model predicts meaningfully faster than the next larger kept one. The
/// largest is always kept.
pub fn choose_row_buckets(h: &mut Header, largest: u32) {
    let mut candidates: Vec<(u32, f64)> = h.graphs.iter().zip(&h.plan.latency).filter(|(g, _)| g.rows <= largest).map(|(g, &s)| (g.rows, s)).collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    let mut kept: Vec<(u32, f64)> = Vec::new();
    for (rows, seconds) in candidates {
        if kept.last().is_none_or(|&(_, faster_than)| seconds <= BUCKET_SAVING * faster_than) {
            kept.push((rows, seconds));
        }
    }
    h.plan.row_buckets = kept.iter().rev().map(|&(rows, _)| rows).collect();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_only_graphs_predicted_meaningfully_faster() {
        let (mut h, _) = crate::testing::llada_8b_header(&[16, 32, 48, 64, 256], "host", None);
        let rows: Vec<u32> = h.graphs.iter().map(|g| g.rows).collect();
        // Host-like: time grows with rows, every bucket pays. NPU-like: flat up to 64 rows.
        h.plan.latency = rows.iter().map(|&r| r as f64).collect();
        choose_row_buckets(&mut h, 64);
        let want: Vec<u32> = rows.iter().copied().filter(|&r| r <= 64).collect();
        assert_eq!(h.plan.row_buckets, want);
        h.plan.latency = rows.iter().map(|&r| (r.max(64)) as f64).collect();
        choose_row_buckets(&mut h, 64);
        assert_eq!(h.plan.row_buckets, vec![64]);
    }
}
