//! The window planner: gives every value of a graph an offset in the accelerator window so
//! that values never alive at the same time share bytes. Greedy by decreasing size into the
//! best-fitting gap among the values whose lifetimes overlap, as TFLite's arena planner and
//! IREE's slice layout do. `llada_ir::verify` re-checks the result.

use llada_ir::{align_up, verify::live_intervals, Graph};

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

/// Bytes the graph would need if no value shared memory with another: what planning saves.
pub fn unshared_bytes(g: &Graph, align: u64) -> u64 {
    g.values.iter().map(|v| align_up(g.value_bytes(v), align)).sum()
}
