//! The window planner: places the KV cache, the activation region (laid out per graph by
//! `memory`), kernel scratch and the weights in the target's bounded window, decides which
//! weight segments stay resident and which rotate through slots, and writes each graph's
//! swap schedule. `llada_ir::verify` re-checks all of it.

use llada_ir::window_sizes::{attention_scratch, kv_bytes, largest_gemm_operand, segment_spans};
use llada_ir::{align_up, ExpertCosts, ExpertPlan, Graph, Header, KvDType, Region, ResidentSegment, Scratch, StageStep, WindowPlan};

use crate::error::{Error, Result};

/// Slots the rotating segments share: two, so one is staged while the other is read.
const SLOTS: usize = 2;

/// What the planner needs besides the header.
pub struct WindowOptions {
    pub bytes: u64,
    pub align: u64,
    pub kv_dtype: KvDType,
    /// Threads the attention scratch is sized for.
    pub threads: u32,
    /// Segment the CPU gathers from the artifact (the embedding).
    pub host_segment: u32,
    /// Segments of the experts, layer-major (empty for a dense model): they get per-layer
    /// slot pools of their own, never a resident place or the rotating ring.
    pub expert_segments: Vec<u32>,
    pub expert_costs: ExpertCosts,
    /// The most bytes the expert slots may take (`None`: all the window leaves): an NPU
    /// target keeps room for its contexts.
    pub max_expert_bytes: Option<u64>,
    /// For the error message: what set the window size.
    pub window_source: String,
    /// For the error message: whether a larger `--window-bytes` could help (not when the
    /// window is already a GPU's largest allocation).
    pub can_grow: bool,
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Segments in the order the graphs first read them (every graph reads them in the same
/// order: the lowering emits the same layers for every row count), the host segment and the
/// experts aside.
fn first_use_order(spans: &[Option<(usize, usize)>], host: u32, experts: &[u32]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..spans.len() as u32).filter(|&s| s != host && !experts.contains(&s) && spans[s as usize].is_some()).collect();
    order.sort_by_key(|&s| spans[s as usize].map(|(first, _)| first));
    order
}

/// Bytes the slots take when the largest rotating segment is `rotating_max` bytes.
fn slot_need(rotating_max: u64) -> u64 {
    SLOTS as u64 * rotating_max
}

/// The regions in front of the weights: the KV cache, the activations (every graph's values,
/// one graph at a time), the prepared GEMM operand and the attention scratch.
struct FixedRegions {
    kv: Region,
    activations: Region,
    gemm_operand: Region,
    attention: Region,
    /// The graph whose values need the most bytes (the activations' size), for the error
    /// message.
    largest_graph: String,
}

impl FixedRegions {
    fn of(h: &Header, o: &WindowOptions) -> Result<FixedRegions> {
        let m = &h.model;
        let al = |x: u64| align_up(x, o.align);
        let kv = kv_bytes(m, h.plan.kv_capacity, o.kv_dtype).ok_or_else(|| Error::Options("the KV cache size overflows".into()))?;
        let (largest_graph, act) = h.graphs.iter().map(|g| (g.name.clone(), g.window_bytes)).max_by_key(|g| g.1).unwrap_or_default();
        let operand = largest_gemm_operand(h);
        let attention = attention_scratch(m, h.plan.kv_capacity, o.kv_dtype, o.threads).2;
        let kv_r = Region { name: "kv".into(), offset: 0, bytes: kv };
        let act_r = Region { name: "activations".into(), offset: al(kv), bytes: act };
        let gemm_r = Region { name: "scratch.gemm_operand".into(), offset: al(act_r.offset + act), bytes: operand };
        let att_r = Region { name: "scratch.attention".into(), offset: al(gemm_r.offset + operand), bytes: attention };
        Ok(FixedRegions { kv: kv_r, activations: act_r, gemm_operand: gemm_r, attention: att_r, largest_graph })
    }

    /// Where the weights start.
    fn end(&self, align: u64) -> u64 {
        align_up(self.attention.offset + self.attention.bytes, align)
    }
}

/// Where the weights other than the experts' and the host's lie: the resident segments, the
/// slots the rotating ones are staged into, those in the order the graphs first read them,
/// and the end of it all.
struct WeightLayout {
    resident: Vec<ResidentSegment>,
    slots: Vec<Region>,
    rotating: Vec<u32>,
    end: u64,
}

/// Places the weights after the fixed regions: all resident where they fit, else the most bytes
/// resident and the rest rotating through the slots, leaving `expert_floor` bytes for the
/// experts' pools where the others fit beside them.
fn lay_out_weights(h: &Header, o: &WindowOptions, regions: &FixedRegions, expert_floor: u64) -> Result<WeightLayout> {
    let spans = segment_spans(h, &h.graphs[0]);
    let order = first_use_order(&spans, o.host_segment, &o.expert_segments);
    let size = |s: u32| align_up(h.segments[s as usize].nbytes, o.align);
    // A segment read across other segments' uses (the rotary tables, read by every layer)
    // would hold a slot for the whole pass and stall the ring behind it: it stays resident.
    let span = |s: u32| spans[s as usize].expect("segments in the order are read");
    // So does one that some graph does not read (DiffusionGemma's encoder graphs leave out the
    // self-conditioning and the head): every graph's schedule stages every rotating segment.
    let read_by: Vec<Vec<Option<(usize, usize)>>> = h.graphs.iter().map(|g| segment_spans(h, g)).collect();
    let read_by_all = |s: u32| read_by.iter().all(|spans| spans[s as usize].is_some());
    let pinned: Vec<u32> = order.iter().copied().filter(|&s| !read_by_all(s) || order.iter().any(|&o| o != s && span(s).0 <= span(o).0 && span(o).1 <= span(s).1)).collect();
    let pinned_bytes: u64 = pinned.iter().map(|&s| size(s)).sum();
    let fixed = regions.end(o.align) + pinned_bytes;
    let order_all = order.clone();
    let order: Vec<u32> = order.into_iter().filter(|s| !pinned.contains(s)).collect();
    // Most bytes resident: the largest segments first (each saves its bytes from every
    // pass's staging, and the slots only need to hold the largest segment that rotates).
    let mut by_size = order.clone();
    by_size.sort_by_key(|&s| std::cmp::Reverse(size(s)));
    let total: u64 = by_size.iter().map(|&s| size(s)).sum();
    let largest = by_size.first().map_or(0, |&s| size(s));
    // Room for the other weights: all of it if they fit beside one expert slot per layer,
    // else what leaves that slot.
    let budget = if fixed + total + expert_floor <= o.bytes || o.bytes < expert_floor { o.bytes } else { o.bytes - expert_floor };
    if fixed + total > o.bytes && fixed + slot_need(largest) > o.bytes {
        let big = by_size.first().map_or("-".into(), |&s| h.segments[s as usize].name.clone());
        let (kv, act, big_graph) = (regions.kv.bytes, regions.activations.bytes, &regions.largest_graph);
        return Err(Error::Options(format!(
            "the minimum working set does not fit the {} window ({}): KV cache {} ({} positions of {}), activations {} (graph '{big_graph}'), \
             kernel scratch {}, weights every layer reads {}, {SLOTS} slots of {} (largest weight segment '{big}'); total {}. \
             Lower --max-seq, {}or choose a smaller --quant or --kv-dtype",
            mib(o.bytes), o.window_source, mib(kv), h.plan.kv_capacity, o.kv_dtype.name(), mib(act), mib(regions.gemm_operand.bytes + regions.attention.bytes),
            mib(pinned_bytes), mib(largest), mib(fixed + slot_need(largest)), if o.can_grow { "raise --window-bytes, " } else { "" }
        )));
    }
    let mut resident: Vec<u32> = pinned;
    if fixed + total <= budget {
        resident.extend(&order);
    } else {
        resident.extend(most_bytes_resident(&by_size, fixed, budget, size));
    }
    let rotating: Vec<u32> = order.iter().copied().filter(|s| !resident.contains(s)).collect();
    let slot_bytes = rotating.iter().map(|&s| size(s)).max().unwrap_or(0);
    let mut cursor = regions.end(o.align);
    let mut placed = Vec::new();
    for &s in &order_all {
        if resident.contains(&s) {
            placed.push(ResidentSegment { segment: s, offset: cursor });
            cursor += size(s);
        }
    }
    let slots: Vec<Region> = (0..SLOTS.min(rotating.len()))
        .map(|i| {
            let r = Region { name: format!("slots[{i}]"), offset: cursor, bytes: slot_bytes };
            cursor += slot_bytes;
            r
        })
        .collect();
    debug_assert!(cursor <= o.bytes);
    Ok(WeightLayout { resident: placed, slots, rotating, end: cursor })
}

/// Of the segments `by_size` (largest first), which don't all fit `budget` bytes from `used`
/// on, those to keep resident: the largest prefix that fits with slots for the rest, then any
/// smaller segment that still fits beside the slots.
fn most_bytes_resident(by_size: &[u32], mut used: u64, budget: u64, size: impl Fn(u32) -> u64) -> Vec<u32> {
    let mut resident = Vec::new();
    for (i, &s) in by_size.iter().enumerate() {
        let next_max = by_size.get(i + 1).map_or(0, |&n| size(n));
        if used + size(s) + slot_need(next_max) > budget {
            break;
        }
        used += size(s);
        resident.push(s);
    }
    let slot = by_size.iter().find(|s| !resident.contains(s)).map_or(0, |&s| size(s));
    for &s in by_size {
        if !resident.contains(&s) && size(s) < slot && used + size(s) + slot_need(slot) <= budget {
            used += size(s);
            resident.push(s);
        }
    }
    resident
}

/// The experts' slot pools in the window from `start` on: every expert slot of `expert_slot`
/// bytes the rest holds, the same number per layer (routing spreads over layers alike), at
/// most one per expert.
fn expert_plan(h: &Header, o: &WindowOptions, start: u64, expert_slot: u64) -> ExpertPlan {
    let layers = h.model.moe_layers() as u64;
    let per_layer = h.model.moe.map_or(0, |m| m.experts as u64);
    let room = (o.bytes - start).min(o.max_expert_bytes.unwrap_or(u64::MAX));
    let slots_per_layer = if expert_slot == 0 { 0 } else { (room / (layers * expert_slot)).min(per_layer) };
    ExpertPlan {
        per_layer: per_layer as u32,
        segments: o.expert_segments.clone(),
        slots_per_layer: slots_per_layer as u32,
        slot_bytes: expert_slot,
        region: Region { name: "expert slots".into(), offset: start, bytes: layers * slots_per_layer * expert_slot },
        costs: o.expert_costs,
    }
}

/// Shifts every graph's values into the activation region at `activations_offset`, and writes
/// each graph's swap schedule of the `rotating` segments: the i-th staged into slot
/// `i % SLOTS` once the one before it in that slot is last read.
fn place_graphs(h: &mut Header, activations_offset: u64, rotating: &[u32]) {
    for g in &mut h.graphs {
        for v in &mut g.values {
            v.offset += activations_offset;
        }
    }
    let uses: Vec<Vec<(usize, usize)>> = h
        .graphs
        .iter()
        .map(|g| {
            let spans = segment_spans(h, g);
            rotating.iter().map(|&s| spans[s as usize].expect("every graph reads every segment")).collect()
        })
        .collect();
    for (g, uses) in h.graphs.iter_mut().zip(uses) {
        g.staging = uses
            .iter()
            .enumerate()
            .map(|(i, &(first, last))| StageStep {
                rotating: i as u32,
                slot: (i % SLOTS) as u32,
                stage_after_op: (i >= SLOTS).then(|| uses[i - SLOTS].1 as u32),
                first_op: first as u32,
                last_op: last as u32,
            })
            .collect();
    }
}

/// Plans the window of `h` (whose graphs' values are laid out from offset 0 of their own
/// activation space), shifting every value into the activation region and filling in each
/// graph's staging steps.
pub fn plan(h: &mut Header, o: &WindowOptions) -> Result<()> {
    let regions = FixedRegions::of(h, o)?;
    let expert_slot = o.expert_segments.iter().map(|&s| align_up(h.segments[s as usize].nbytes, o.align)).max().unwrap_or(0);
    // The experts' pools come out of what the other weights leave; they should leave room
    // for one expert per layer, rotating if they must, else the accelerator cannot compute
    // any expert.
    let expert_floor = if expert_slot > 0 { h.model.moe_layers() as u64 * expert_slot } else { 0 };
    let weights = lay_out_weights(h, o, &regions, expert_floor)?;
    let experts = expert_plan(h, o, weights.end, expert_slot);
    place_graphs(h, regions.activations.offset, &weights.rotating);
    h.plan.window = WindowPlan {
        bytes: o.bytes,
        kv: regions.kv,
        kv_dtype: o.kv_dtype,
        activations: regions.activations,
        scratch: Scratch { gemm_operand: regions.gemm_operand, attention: regions.attention, threads: o.threads },
        resident: weights.resident,
        slots: weights.slots,
        rotating: weights.rotating,
        host: vec![o.host_segment],
        experts,
    };
    Ok(())
}

/// The ranges the Vulkan backend binds whole, each as one storage buffer, which a GPU's
/// `maxStorageBufferRange` bounds (`runtime/src/executor/vulkan/record.rs`): the span of one
/// op's values (the widest over every graph), one layer's KV cache and the GEMM scratch (a
/// quantised operand is at most that). A weight matrix larger than one binding is bound in
/// slices of whole panels, so the weights need no such bound.
pub fn whole_bindings(h: &Header) -> Vec<(&'static str, u64)> {
    let (m, w) = (&h.model, &h.plan.window);
    let layer_kv = 2 * m.n_kv_heads as u64 * m.head_dim as u64 * h.plan.kv_capacity as u64 * w.kv_dtype.bytes();
    let widest_op = h.graphs.iter().flat_map(|g| g.ops.iter().filter_map(move |op| llada_ir::window::op_values_span(g, op))).map(|(s, e)| e - s).max().unwrap_or(0);
    vec![("the values of one op", widest_op), ("one layer's KV cache", layer_kv), ("the GEMM scratch", w.scratch.gemm_operand.bytes)]
}

/// Bytes a pass of `g` stages into slots.
pub fn staged_bytes(h: &Header, g: &Graph) -> u64 {
    g.staging.iter().map(|st| h.segments[h.plan.window.rotating[st.rotating as usize] as usize].nbytes).sum()
}

#[cfg(test)]
mod tests {
    use crate::lower::exact_buckets;
    use crate::testing::llada_8b_header;
    use llada_ir::verify;

    /// LLaDA-8B at q4 planned for `target` with its default positions (at most 1024).
    fn plan_8b(target: &str, window: Option<u64>) -> (llada_ir::Header, u64) {
        let t = llada_targets::by_name(target).unwrap();
        llada_8b_header(&exact_buckets(t.default_max_seq.min(1024), t.row_multiple), target, window)
    }

    /// LLaDA-8B at q4 with the target's default positions, at most 1024, on every target (the
    /// host with a 2 GiB window): the plan verifies, fits (a GPU's window its largest
    /// allocation), and rotates what the window cannot hold.
    #[test]
    fn the_llada_8b_plan_of_every_target_verifies() {
        for target in llada_targets::names() {
            let window = (target == "host").then_some(2u64 << 30);
            let (h, data_len) = plan_8b(target, window);
            verify::header(&h, data_len).unwrap_or_else(|e| panic!("{target}: {e}"));
            let w = &h.plan.window;
            assert!(w.bytes <= 2 << 30 && !w.rotating.is_empty() && w.slots.len() == 2, "{target}");
            let t = llada_targets::by_name(target).unwrap();
            if let Some((max, _)) = t.max_window_bytes() {
                assert!(w.bytes <= max, "{target}: window above the largest allocation");
            }
            assert!(h.plan.latency.iter().all(|&s| s > 0.0) && h.plan.latency.len() == h.graphs.len(), "{target}");
        }
    }

    /// LLaDA-8B at 4096 positions needs more than a 128 MiB binding for one op's values.
    #[test]
    fn whole_bindings_measure_what_a_long_plan_binds() {
        let (h, _) = llada_8b_header(&exact_buckets(4096, 16), "host", None);
        let b = super::whole_bindings(&h);
        let names: Vec<&str> = b.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["the values of one op", "one layer's KV cache", "the GEMM scratch"]);
        assert!(b[0].1 <= h.plan.window.activations.bytes);
        // f32 KV on the host: keys and values of 32 heads of 128 for 4096 positions.
        assert_eq!(b[1].1, 2 * 32 * 128 * 4096 * 4);
        assert!(b[0].1 > 128 << 20);
    }

    /// On every GPU target the LLaDA-8B plan's whole bindings fit one storage buffer.
    #[test]
    fn the_llada_8b_plan_of_every_gpu_target_binds_within_its_storage_range() {
        for target in llada_targets::names() {
            let Some(gpu) = llada_targets::by_name(target).unwrap().gpu else { continue };
            let (h, _) = plan_8b(target, None);
            for (what, bytes) in super::whole_bindings(&h) {
                assert!(bytes > 0 && bytes <= gpu.max_storage_buffer_bytes, "{target}: {what} is {bytes} bytes");
            }
        }
    }

    fn rejected(h: &llada_ir::Header, data_len: u64, names: &[&str]) {
        let err = verify::header(h, data_len).expect_err("a broken plan verified").to_string();
        for n in names {
            assert!(err.contains(n), "error does not name '{n}': {err}");
        }
    }

    #[test]
    fn broken_window_plans_are_rejected_naming_both_things() {
        let (good, len) = plan_8b("sm8750", None);
        // A slot over the KV cache.
        let mut h = good.clone();
        h.plan.window.slots[0].offset = h.plan.window.kv.offset;
        rejected(&h, len, &["'kv cache'", "'slots[0]'", "share window bytes"]);
        // A resident segment over the GEMM scratch.
        let mut h = good.clone();
        h.plan.window.resident[0].offset = h.plan.window.scratch.gemm_operand.offset;
        rejected(&h, len, &["'scratch.gemm_operand'", "resident segment"]);
        // A graph value over the attention scratch, in one graph.
        let mut h = good.clone();
        let v = h.graphs[3].values.iter().position(|v| v.name == "blocks.5.qkv").unwrap();
        h.graphs[3].values[v].offset = h.plan.window.scratch.attention.offset;
        rejected(&h, len, &["graphs[3]", "'blocks.5.qkv'", "'scratch.attention'"]);
        // Two values alive together over the same bytes.
        let mut h = good.clone();
        let (x, up) = (h.graphs[0].values.iter().position(|v| v.name == "x").unwrap(), h.graphs[0].values.iter().position(|v| v.name == "blocks.0.gate_up").unwrap());
        h.graphs[0].values[up].offset = h.graphs[0].values[x].offset;
        rejected(&h, len, &["'x'", "'blocks.0.gate_up'"]);
        // A slot past the end of the window.
        let mut h = good.clone();
        h.plan.window.slots[1].offset = h.plan.window.bytes;
        rejected(&h, len, &["'slots[1]'", "outside"]);
        // A slot too small for a segment staged into it.
        let mut h = good.clone();
        h.plan.window.slots[1].bytes = 4096;
        rejected(&h, len, &["does not fit slots[1]"]);
        // A copy into a slot that starts while its previous segment is still being read.
        let mut h = good.clone();
        let early = h.graphs[0].staging[0].last_op - 1;
        h.graphs[0].staging[2].stage_after_op = Some(early);
        rejected(&h, len, &["graphs[0]", "staging[2]", "slot 0 is still used by staging[0]"]);
        // A KV cache smaller than its positions need.
        let mut h = good;
        h.plan.window.kv.bytes -= 64;
        rejected(&h, len, &["KV cache", "positions"]);
    }
}
