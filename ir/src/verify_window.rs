//! Verification of the window plan (`Plan::window`) and of each graph's place in it: every
//! region inside the window and aligned, sized as the model and the kernels need, every
//! weight an op reads placed, every swap schedule consistent with its graph's op order, and
//! no two things (KV cache, activations, scratch, resident segments, slots) sharing bytes
//! while both are alive, and nothing larger than the plan needs (the runtime allocates what
//! the plan lays out). Errors name both things.

use crate::format::{align_up, WINDOW_ALIGN};
use crate::graph::{live_intervals, Graph, Op};
use crate::header::Header;
use crate::window::MAX_REGION_ALIGN;
use crate::window_sizes::{attention_scratch, kv_bytes, largest_gemm_operand, segment_spans};

/// One thing in the window: name, offset, bytes, and the ops it is alive over.
struct Item {
    name: String,
    offset: u64,
    bytes: u64,
    live: (usize, usize),
}

/// The regions alive for the whole session, each alive from op 0 to `last`.
fn session_items(h: &Header, last: usize) -> Vec<Item> {
    let w = &h.plan.window;
    let item = |name: String, offset: u64, bytes: u64| Item { name, offset, bytes, live: (0, last) };
    let mut items = vec![
        item("kv cache".into(), w.kv.offset, w.kv.bytes),
        item("activations".into(), w.activations.offset, w.activations.bytes),
        item("scratch.gemm_operand".into(), w.scratch.gemm_operand.offset, w.scratch.gemm_operand.bytes),
        item("scratch.attention".into(), w.scratch.attention.offset, w.scratch.attention.bytes),
    ];
    for r in &w.resident {
        let (name, bytes) = h.segments.get(r.segment as usize).map_or(("?".into(), 0), |s| (s.name.clone(), s.nbytes));
        items.push(item(format!("resident segment '{name}'"), r.offset, bytes));
    }
    for (i, s) in w.slots.iter().enumerate() {
        items.push(item(format!("slots[{i}]"), s.offset, s.bytes));
    }
    items.push(item("expert slots".into(), w.experts.region.offset, w.experts.region.bytes));
    items
}

/// The expert plan: one segment per expert of every layer (exactly the two matrices the
/// layer's MoE ops read for it), slot pools that hold the largest, and finite costs.
fn experts(h: &Header, home: &mut [&'static str]) -> Result<(), String> {
    let (w, m) = (&h.plan.window.experts, &h.model);
    let per_layer = m.moe.map_or(0, |moe| moe.experts);
    if w.per_layer != per_layer {
        return Err(format!("experts.per_layer {} but the model has {per_layer} experts", w.per_layer));
    }
    let count = per_layer as u64 * m.moe_layers() as u64;
    if w.segments.len() as u64 != count {
        return Err(format!("experts.segments lists {} segments for {count} experts", w.segments.len()));
    }
    for (i, &s) in w.segments.iter().enumerate() {
        let slot = home.get_mut(s as usize).ok_or_else(|| format!("expert segment {s} does not exist"))?;
        if !slot.is_empty() {
            return Err(format!("segment '{}' is both {slot} and expert {i}", h.segments[s as usize].name));
        }
        *slot = "expert";
        if w.slots_per_layer > 0 && h.segments[s as usize].nbytes > w.slot_bytes {
            return Err(format!("expert segment '{}' ({} bytes) does not fit a {}-byte expert slot", h.segments[s as usize].name, h.segments[s as usize].nbytes, w.slot_bytes));
        }
    }
    let largest = w.segments.iter().map(|&s| h.segments[s as usize].nbytes).max().unwrap_or(0);
    if w.slot_bytes > align_up(largest, MAX_REGION_ALIGN) {
        return Err(format!("experts.slot_bytes is {}; the largest expert segment needs {largest}", w.slot_bytes));
    }
    if w.slots_per_layer > per_layer || w.slot_bytes % WINDOW_ALIGN != 0 {
        return Err(format!("{} expert slots per layer of {} bytes for {per_layer} experts (at most one slot each, {WINDOW_ALIGN}-byte multiples)", w.slots_per_layer, w.slot_bytes));
    }
    let need = (w.slots_per_layer as u64).checked_mul(m.moe_layers() as u64).and_then(|n| n.checked_mul(w.slot_bytes));
    if need != Some(w.region.bytes) {
        return Err(format!("the expert slot region has {} bytes; {} layers of {} slots of {} bytes need {need:?}", w.region.bytes, m.moe_layers(), w.slots_per_layer, w.slot_bytes));
    }
    let c = &w.costs;
    let figures = [c.accelerator.weight_seconds, c.accelerator.row_seconds, c.cpu.weight_seconds, c.cpu.row_seconds, c.stage_seconds];
    if figures.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err(format!("expert costs must be finite and not negative: {c:?}"));
    }
    Ok(())
}

/// Reports the first two items that share bytes while both are alive.
fn disjoint(mut items: Vec<Item>) -> Result<(), String> {
    items.retain(|i| i.bytes > 0);
    items.sort_by_key(|i| i.offset);
    for a in 0..items.len() {
        let a_end = items[a].offset.saturating_add(items[a].bytes);
        for b in a + 1..items.len() {
            if items[b].offset >= a_end {
                break;
            }
            let (la, lb) = (items[a].live, items[b].live);
            if la.0 <= lb.1 && lb.0 <= la.1 {
                return Err(format!("'{}' and '{}' share window bytes while both are live", items[a].name, items[b].name));
            }
        }
    }
    Ok(())
}

pub(crate) fn window(h: &Header) -> Result<(), String> {
    let (w, m) = (&h.plan.window, &h.model);
    let need_kv = kv_bytes(m, h.plan.kv_capacity, w.kv_dtype).ok_or("the KV cache size overflows")?;
    // Before any other size is computed: the KV cache bounds the model's sizes by the window.
    if need_kv > w.bytes {
        return Err(format!("the KV cache needs {need_kv} bytes ({} positions of {}), more than the {}-byte window", h.plan.kv_capacity, w.kv_dtype.name(), w.bytes));
    }
    if w.kv.bytes != need_kv {
        return Err(format!("the KV cache has {} bytes; {} positions of {} need {need_kv}", w.kv.bytes, h.plan.kv_capacity, w.kv_dtype.name()));
    }
    let operand = largest_gemm_operand(h);
    if w.scratch.gemm_operand.bytes != operand {
        return Err(format!("scratch.gemm_operand has {} bytes; the largest prepared GEMM operand needs {operand}", w.scratch.gemm_operand.bytes));
    }
    if w.scratch.threads == 0 {
        return Err("scratch.threads is 0".into());
    }
    let attention = attention_scratch(m, h.plan.kv_capacity, w.kv_dtype, w.scratch.threads).2;
    if w.scratch.attention.bytes != attention {
        return Err(format!("scratch.attention has {} bytes; {} threads need {attention}", w.scratch.attention.bytes, w.scratch.threads));
    }
    // Each segment has at most one home.
    let mut home = vec![""; h.segments.len()];
    let ids = w.resident.iter().map(|r| (r.segment, "resident")).chain(w.rotating.iter().map(|&s| (s, "rotating"))).chain(w.host.iter().map(|&s| (s, "host")));
    for (s, kind) in ids {
        let slot = home.get_mut(s as usize).ok_or_else(|| format!("{kind} segment {s} does not exist"))?;
        if !slot.is_empty() {
            return Err(format!("segment '{}' is both {slot} and {kind}", h.segments[s as usize].name));
        }
        *slot = kind;
    }
    experts(h, &mut home)?;
    if !w.rotating.is_empty() && w.slots.is_empty() {
        return Err(format!("{} segments rotate but there are no slots", w.rotating.len()));
    }
    if w.slots.len() > w.rotating.len() {
        return Err(format!("slots[{}] receives no rotating segment ({} slots for {} rotating segments)", w.rotating.len(), w.slots.len(), w.rotating.len()));
    }
    for (i, &s) in w.rotating.iter().enumerate() {
        let (seg, slot) = (&h.segments[s as usize], &w.slots[i % w.slots.len()]);
        if seg.nbytes > slot.bytes {
            return Err(format!("rotating segment '{}' ({} bytes) does not fit slots[{}] ({} bytes)", seg.name, seg.nbytes, i % w.slots.len(), slot.bytes));
        }
    }
    let items = session_items(h, 0);
    for it in &items {
        if it.offset % WINDOW_ALIGN != 0 || it.offset.checked_add(it.bytes).is_none_or(|e| e > w.bytes) {
            return Err(format!("'{}' at {} ({} bytes) is misaligned or outside the {}-byte window", it.name, it.offset, it.bytes, w.bytes));
        }
    }
    no_larger_than_needed(h)?;
    // The runtime maps the resident segments as one region, first to last: they come in
    // increasing offset order and nothing else lies between them.
    if let (Some(first), Some(last)) = (w.resident.first(), w.resident.last()) {
        if let Some(i) = (1..w.resident.len()).find(|&i| w.resident[i].offset <= w.resident[i - 1].offset) {
            return Err(format!("resident[{i}] (offset {}) is not after resident[{}] (offset {})", w.resident[i].offset, i - 1, w.resident[i - 1].offset));
        }
        let end = last.offset.saturating_add(h.segments.get(last.segment as usize).map_or(0, |s| s.nbytes));
        let others = [(&w.kv, "kv cache"), (&w.activations, "activations"), (&w.scratch.gemm_operand, "scratch.gemm_operand"), (&w.scratch.attention, "scratch.attention"), (&w.experts.region, "expert slots")]
            .into_iter()
            .chain(w.slots.iter().map(|s| (s, "a slot")));
        for (r, name) in others {
            if r.bytes > 0 && r.offset < end && first.offset < r.offset.saturating_add(r.bytes) {
                return Err(format!("'{name}' lies between the resident segments ({}..{end})", first.offset));
            }
        }
    }
    disjoint(items)?;
    // Every weight an op reads is where the plan says the op's engine finds it.
    for (gi, g) in h.graphs.iter().enumerate() {
        for (oi, op) in g.ops.iter().enumerate() {
            for t in op.tensors() {
                let name = h.tensors.get(t as usize).map_or("?", |t| t.name.as_str());
                let at = || format!("graphs[{gi}] ops[{oi}] {}: tensor '{name}'", op.name());
                let kind = h.segment_of(t).map(|s| s as usize).map_or("", |s| home[s]);
                match *op {
                    // The embedding, gathered (and, for self-conditioning, averaged) from the
                    // artifact.
                    Op::Embed { .. } | Op::SoftEmbed { .. } if kind != "host" => return Err(format!("{} is gathered by the CPU but its segment is not a host segment", at())),
                    Op::Embed { .. } | Op::SoftEmbed { .. } => {}
                    // Expert e's two matrices are in the segment the plan lists for it, so
                    // the runtime stages and finds them by (layer, expert).
                    Op::MoeExperts { layer, first, .. } => {
                        let e = (t - first) / 2;
                        // Listed by MoE layer (the verifier checked this layer has experts).
                        let moe_layer = h.model.moe_layer_index(layer).unwrap_or(usize::MAX) as u64;
                        let listed = moe_layer.checked_mul(h.plan.window.experts.per_layer as u64).and_then(|i| h.plan.window.experts.segments.get((i + e as u64) as usize));
                        if listed.copied() != h.segment_of(t) {
                            return Err(format!("{} of expert {e} is not in the segment experts.segments lists for layer {layer}", at()));
                        }
                    }
                    _ if kind != "resident" && kind != "rotating" => return Err(format!("{} is in no resident or rotating segment", at())),
                    _ => {}
                }
            }
        }
    }
    // The runtime allocates up to the end of the last region: with every region no larger
    // than it needs, no gaps beyond alignment bound that by the plan's own needs.
    let items = session_items(h, 0);
    let used = items.iter().map(|i| align_up(i.bytes, MAX_REGION_ALIGN)).fold(0, u64::saturating_add);
    if let Some(last) = items.iter().max_by_key(|i| i.offset + i.bytes).filter(|i| i.offset + i.bytes > used) {
        return Err(format!(
            "'{}' ends at byte {}, but the regions, each rounded up to {MAX_REGION_ALIGN} bytes, need only {used}: the window has gaps the plan does not need",
            last.name,
            last.offset + last.bytes
        ));
    }
    Ok(())
}

/// Every region no larger than what the plan needs of it, computed from the graphs and the
/// segments and rounded up to at most [`MAX_REGION_ALIGN`] (the KV cache, the scratch and the
/// expert pools are checked where they are sized): the runtime allocates what the plan lays
/// out, so a verified plan uses no memory it cannot use.
fn no_larger_than_needed(h: &Header) -> Result<(), String> {
    let w = &h.plan.window;
    let round = |x: u64| align_up(x, MAX_REGION_ALIGN);
    // Value ends were checked not to overflow with the graphs.
    let values_end = h.graphs.iter().flat_map(|g| g.values.iter().map(|v| v.offset + g.value_bytes(v))).max().unwrap_or(0);
    let need = round(values_end.saturating_sub(w.activations.offset));
    if w.activations.bytes > need {
        return Err(format!("'activations' has {} bytes; the graphs' values need {need}", w.activations.bytes));
    }
    // Slots are equal-sized: each holds any rotating segment of the ring.
    let largest = w.rotating.iter().map(|&s| h.segments[s as usize].nbytes).max().unwrap_or(0);
    if let Some((i, s)) = w.slots.iter().enumerate().find(|(_, s)| s.bytes > round(largest)) {
        return Err(format!("slots[{i}] has {} bytes; the largest rotating segment needs {largest}", s.bytes));
    }
    Ok(())
}

pub(crate) fn graph_in_window(h: &Header, g: &Graph) -> Result<(), String> {
    let w = &h.plan.window;
    let act_end = w.activations.offset.saturating_add(w.activations.bytes);
    let live = live_intervals(g);
    let mut items = session_items(h, g.ops.len());
    for (i, v) in g.values.iter().enumerate() {
        if let Some(l) = live[i] {
            items.push(Item { name: v.name.clone(), offset: v.offset, bytes: g.value_bytes(v), live: l });
        }
    }
    // Values share the activation region by lifetime; the region itself must not count.
    items.retain(|i| i.name != "activations");
    disjoint(items)?;
    for (i, v) in g.values.iter().enumerate() {
        if v.offset < w.activations.offset || v.offset.saturating_add(g.value_bytes(v)) > act_end {
            return Err(format!("values[{i}] '{}' lies outside the activation region", v.name));
        }
    }
    let slots = w.slots.len();
    let spans = segment_spans(h, g);
    if g.staging.len() != w.rotating.len() {
        return Err(format!("has {} staging steps for {} rotating segments", g.staging.len(), w.rotating.len()));
    }
    for (i, st) in g.staging.iter().enumerate() {
        let at = |msg: String| format!("staging[{i}]: {msg}");
        let seg = w.rotating[i] as usize;
        if st.rotating as usize != i || st.slot as usize != i % slots {
            return Err(at(format!("stages rotating segment {} into slot {}; the plan's order says {i} into {}", st.rotating, st.slot, i % slots)));
        }
        let Some((first, last)) = spans[seg] else {
            return Err(at(format!("segment '{}' is staged but no op reads it", h.segments[seg].name)));
        };
        if st.first_op as usize != first || (st.last_op as usize) < last || st.last_op as usize >= g.ops.len() {
            return Err(at(format!("segment '{}' is used by ops {first}..={last} but staged for ops {}..={}", h.segments[seg].name, st.first_op, st.last_op)));
        }
        if let Some(a) = st.stage_after_op {
            if a >= st.first_op {
                return Err(at(format!("the copy starts after op {a}, not before its first use (op {})", st.first_op)));
            }
        }
        // The staging thread copies the steps in order, each once its slot is released: for
        // i >= slots after op `stage_after_op`, which precedes the step's first use; for
        // i < slots by the previous pass. With first uses in step order, when the executor
        // waits before op k for step i, every step up to i is first used at k or before, so
        // every release their copies wait for came at an op before k or in the previous pass:
        // the copy arrives. A step j > i used before step i could have the executor wait for
        // j while the thread waits to copy i behind a release later in the pass: deadlock.
        if let Some(prev) = i.checked_sub(1).map(|p| &g.staging[p]).filter(|p| st.first_op < p.first_op) {
            return Err(at(format!("first used at op {}, before staging[{}] (op {}): steps must be first used in order", st.first_op, i - 1, prev.first_op)));
        }
        if i < slots {
            // The slot's previous occupant was the previous pass's, and this segment was copied
            // behind it; a release in this pass before the first use would let the staging
            // thread overwrite the segment before it is read.
            if let Some(a) = st.stage_after_op {
                return Err(at(format!("releases slot {} after op {a}, before its first use (op {}); the first {slots} steps fill their slots during the previous pass", st.slot, st.first_op)));
            }
        } else {
            let prev = &g.staging[i - slots];
            if st.stage_after_op.is_none_or(|a| a < prev.last_op) {
                return Err(at(format!("slot {} is still used by staging[{}] until op {}", st.slot, i - slots, prev.last_op)));
            }
        }
    }
    Ok(())
}
