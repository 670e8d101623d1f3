//! The window planner: gives every value of a graph an offset in the accelerator window so
//! that values never alive at the same time share bytes. Greedy by decreasing size into the
//! best-fitting gap among the values whose lifetimes overlap, as TFLite's arena planner and
//! IREE's slice layout do. `llada_ir::verify` re-checks the result.

use llada_ir::{align_up, graph::live_intervals, Graph};

/// Assigns `offset` to every value and sets `window_bytes`.
pub fn plan(g: &mut Graph, align: u64) {
    let live = live_intervals(g);
    let sizes: Vec<u64> = g.values.iter().map(|v| align_up(g.value_bytes(v), align)).collect();
    let mut order: Vec<usize> = (0..g.values.len()).filter(|&i| live[i].is_some()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), live[i].unwrap().0));
    let mut placed: Vec<(u64, u64, (usize, usize))> = Vec::new();
    let mut top = 0;
    for i in order {
        let (lo, hi) = live[i].unwrap();
        let mut conflicts: Vec<(u64, u64)> =
            placed.iter().filter(|p| p.2 .0 <= hi && lo <= p.2 .1).map(|p| (p.0, p.1)).collect();
        conflicts.sort();
        let (mut best, mut best_gap, mut cursor) = (None, u64::MAX, 0u64);
        for (start, end) in conflicts {
            if start >= cursor && start - cursor >= sizes[i] && start - cursor < best_gap {
                best = Some(cursor);
                best_gap = start - cursor;
            }
            cursor = cursor.max(align_up(end, align));
        }
        let offset = best.unwrap_or(cursor);
        g.values[i].offset = offset;
        placed.push((offset, offset + sizes[i], (lo, hi)));
        top = top.max(offset + sizes[i]);
    }
    g.window_bytes = top.max(align);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::exact_buckets;
    use crate::testing::llada_8b_header;

    #[test]
    fn plans_of_the_llada_8b_graphs_pass_the_verifier_and_share_memory() {
        let buckets = exact_buckets(4096, 16);
        let (h, data_len) = llada_8b_header(&buckets, "host", None);
        llada_ir::verify::header(&h, data_len).expect("the planned graphs verify");
        for g in &h.graphs {
            // No plan can beat the largest total of bytes alive at one op; greedy best-fit
            // should come close to it.
            let live = live_intervals(g);
            let peak = (0..=g.ops.len())
                .map(|i| {
                    g.values.iter().zip(&live).filter(|(_, l)| l.is_some_and(|(a, b)| a <= i && i <= b)).map(|(v, _)| align_up(g.value_bytes(v), 64)).sum::<u64>()
                })
                .max()
                .unwrap();
            assert!(g.window_bytes as f64 <= 1.25 * peak as f64, "{}: window {} vs live peak {peak}", g.name, g.window_bytes);
        }
    }

    #[test]
    fn the_verifier_rejects_two_live_values_sharing_bytes() {
        let (mut h, data_len) = llada_8b_header(&[64], "host", None);
        let g = &mut h.graphs[0];
        // The residual stream and block 0's q|k|v are alive together: overlay them.
        let x = g.values.iter().position(|v| v.name == "x").unwrap();
        let qkv = g.values.iter().position(|v| v.name == "blocks.0.qkv").unwrap();
        g.values[qkv].offset = g.values[x].offset;
        let err = llada_ir::verify::header(&h, data_len).unwrap_err().to_string();
        assert!(err.contains("'x'") && err.contains("blocks.0.qkv"), "{err}");
    }
}
