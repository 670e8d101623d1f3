//! The verifier, rule by rule, on crafted artifacts: a valid tiny artifact whose header is
//! changed in one place and sealed again (header and preamble checksums valid), so only the
//! rule under test can refuse it. Each error must name the element at fault. Without the
//! rule the artifact would parse, and the assertion fails.

mod common;

use std::path::Path;

use llada_ir::format::Preamble;
use llada_ir::{Artifact, Header, Op, Region, Rows, Segment, StageStep};
use llada_tools::checkpoint::Shape;

/// A valid artifact of the tiny random checkpoint (2 layers, 4/2 heads, 64 positions).
fn valid() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::read(common::random_artifact(dir.path(), Shape::tiny(), 0.02, "m.lad", Some(64))).unwrap()
}

/// The random checkpoint of `shape` compiled for 64 positions into the window `window` picks
/// from its fully resident artifact: segments or experts that rotate through slots.
fn valid_in_window(shape: Shape, window: impl FnOnce(&Path) -> u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let resident = common::random_artifact(dir.path(), shape, 0.02, "resident.lad", Some(64));
    let windowed = dir.path().join("windowed.lad");
    common::compile_in_window(&dir.path().join("ckpt"), &windowed, Some(64), Some(window(&resident)));
    std::fs::read(windowed).unwrap()
}

fn refused(file: &[u8], needles: &[&str]) {
    let err = match Artifact::parse(file) {
        Ok(_) => panic!("the crafted artifact verified; expected an error naming {needles:?}"),
        Err(e) => e.to_string(),
    };
    for n in needles {
        assert!(err.contains(n), "error does not name '{n}': {err}");
    }
}

fn op_index(h: &Header, g: usize, pick: impl Fn(&Op) -> bool) -> usize {
    h.graphs[g].ops.iter().position(pick).expect("the op exists")
}

#[test]
fn every_rule_refuses_its_crafted_artifact() {
    let good = valid();
    Artifact::parse(&good).expect("the untouched artifact verifies");
    let h0 = common::stored_header(&good);
    let attention = op_index(&h0, 0, |o| matches!(o, Op::Attention { .. }));
    let add = op_index(&h0, 0, |o| matches!(o, Op::Add { .. }));
    let rope = op_index(&h0, 0, |o| matches!(o, Op::Rope { .. }));
    let swiglu = op_index(&h0, 0, |o| matches!(o, Op::SwiGlu { .. }));
    let matmul = op_index(&h0, 0, |o| matches!(o, Op::MatMul { .. }));
    let norm = op_index(&h0, 0, |o| matches!(o, Op::RmsNorm { .. }));
    let embed = op_index(&h0, 0, |o| matches!(o, Op::Embed { .. }));
    let gather = op_index(&h0, 0, |o| matches!(o, Op::GatherLogitRows { .. }));
    let w0 = h0.plan.window.clone();
    let last_resident = h0.segments[w0.resident.last().unwrap().segment as usize].name.clone();
    let cases: Vec<Case> = vec![
        // The model.
        ("zero dimension", Box::new(|h| h.model.d_model = 0), vec!["model: a dimension is zero".into()]),
        ("unknown family", Box::new(|h| h.model.architecture = "gpt2".into()), vec!["architecture 'gpt2'".into(), "llada, llada-moe, dream".into()]),
        ("heads not a multiple", Box::new(|h| h.model.n_kv_heads = 3), vec!["n_heads 4 is not a multiple of n_kv_heads 3".into()]),
        ("odd head_dim", Box::new(|h| h.model.head_dim = 31), vec!["head_dim 31 is odd".into()]),
        ("huge dimension", Box::new(|h| h.model.mlp_hidden = u32::MAX), vec!["above 2^24".into()]),
        ("special token", Box::new(|h| h.special.mask = h.model.embedding_size), vec!["special token mask".into()]),
        // Tensors and segments.
        ("duplicate tensor", Box::new(|h| h.tensors[1].name = h.tensors[0].name.clone()), vec!["tensors[1]".into(), "appears twice".into()]),
        ("bytes vs shape", Box::new(|h| h.tensors[2].shape[0] += 1), vec!["tensors[2]".into(), "do not hold shape".into()]),
        ("tensor alignment", Box::new(|h| h.tensors[0].offset += 4), vec!["tensors[0]".into(), "64-byte aligned".into()]),
        ("tensor past the data", Box::new(|h| h.tensors[0].offset = u64::MAX - 63), vec!["tensors[0]".into()]),
        ("tensors overlap", Box::new(|h| h.tensors[1].offset = h.tensors[0].offset), vec!["overlaps".into(), "tensors[".into()]),
        ("segment alignment", Box::new(|h| h.segments[0].offset += 64), vec!["segments[0]".into(), "misaligned".into()]),
        ("segments overlap", Box::new(|h| h.segments[1].offset = h.segments[0].offset), vec!["two segments overlap".into()]),
        // Graphs, values, ops.
        ("logit rows", Box::new(|h| h.graphs[0].logit_rows = h.graphs[0].rows + 1), vec!["graphs[0]".into(), "logit rows".into()]),
        ("KV capacity above the largest graph", Box::new(|h| h.plan.kv_capacity += 16), vec![format!("plan.kv_capacity {} is more than the {} rows of the largest graph", h0.plan.kv_capacity + 16, h0.plan.kv_capacity)]),
        ("graph above the KV capacity", Box::new(|h| { let g = h.graphs.len() - 1; h.graphs[g].rows = h.plan.kv_capacity + 4; h.plan.by_rows.retain(|&i| i as usize != g); h.plan.row_buckets.clear(); }), vec!["more than plan.kv_capacity".into()]),
        ("value alignment", Box::new(|h| h.graphs[0].values[1].offset += 4), vec!["graphs[0]".into(), "values[1]".into()]),
        ("value size overflow", Box::new(|h| { h.graphs[0].values[1].cols = u32::MAX; h.graphs[0].rows = u32::MAX; h.plan.kv_capacity = u32::MAX; }), vec!["values[0]".into(), "larger than the window".into()]),
        ("missing value", Box::new(move |h| if let Op::Add { x, .. } = &mut h.graphs[0].ops[add] { *x = 9999 }), vec![format!("ops[{add}] Add"), "value 9999".into()]),
        ("missing tensor", Box::new(move |h| if let Op::MatMul { weight, .. } = &mut h.graphs[0].ops[matmul] { *weight = 9999 }), vec![format!("ops[{matmul}] MatMul"), "tensor 9999".into()]),
        ("logits shape", Box::new(|h| { let l = h.graphs[0].logits as usize; h.graphs[0].values[l].rows = Rows::Tokens }), vec!["logits value".into()]),
        ("embed table", Box::new(move |h| if let Op::Embed { table, .. } = &mut h.graphs[0].ops[embed] { *table = 1 }), vec![format!("ops[{embed}] Embed"), "does not match output".into()]),
        ("norm weight", Box::new(move |h| if let Op::RmsNorm { weight, .. } = &mut h.graphs[0].ops[norm] { *weight = 0 }), vec![format!("ops[{norm}] RmsNorm"), "is not f32".into()]),
        ("matmul weight", Box::new(move |h| if let (Op::MatMul { weight, .. }, Some(t)) = (&mut h.graphs[0].ops[matmul], h0.tensors.iter().position(|t| t.shape.len() == 1)) { *weight = t as u32 }), vec![format!("ops[{matmul}] MatMul")]),
        ("rope heads", Box::new(move |h| if let Op::Rope { heads, .. } = &mut h.graphs[0].ops[rope] { *heads = 7 }), vec![format!("ops[{rope}] Rope"), "7 heads".into()]),
        ("rope heads overflow", Box::new(move |h| if let Op::Rope { heads, .. } = &mut h.graphs[0].ops[rope] { *heads = u32::MAX }), vec![format!("ops[{rope}] Rope")]),
        ("attention layer", Box::new(move |h| if let Op::Attention { layer, .. } = &mut h.graphs[0].ops[attention] { *layer = 2 }), vec![format!("ops[{attention}] Attention"), "layer 2 of a 2-layer model".into()]),
        ("attention heads vs model", Box::new(move |h| if let Op::Attention { heads, kv_heads, .. } = &mut h.graphs[0].ops[attention] { (*heads, *kv_heads) = (2, 1) }), vec![format!("ops[{attention}] Attention"), "the model (which sizes the KV cache) has 4/2".into()]),
        ("attention heads overflow", Box::new(move |h| { h.model.n_heads = 1 << 24; if let Op::Attention { heads, .. } = &mut h.graphs[0].ops[attention] { *heads = 1 << 24 } }), vec![format!("ops[{attention}] Attention"), "do not match".into()]),
        ("swiglu shape", Box::new(move |h| if let Op::SwiGlu { x, out } = &mut h.graphs[0].ops[swiglu] { *x = *out }), vec![format!("ops[{swiglu}] SwiGlu")]),
        ("add to itself", Box::new(move |h| if let Op::Add { acc, x } = &mut h.graphs[0].ops[add] { *x = *acc }), vec![format!("ops[{add}] Add"), "to itself".into()]),
        ("gather shape", Box::new(move |h| if let Op::GatherLogitRows { x, out } = &mut h.graphs[0].ops[gather] { *out = *x }), vec![format!("ops[{gather}] GatherLogitRows")]),
        ("output over an input", Box::new(move |h| if let Op::MatMul { x, out, .. } = h.graphs[0].ops[matmul].clone() { let o = h.graphs[0].values[x as usize].offset; h.graphs[0].values[out as usize].offset = o; }), vec!["graphs[0]".into(), "overlaps".into()]),
        ("matmul in place", Box::new(move |h| { let sq = h.graphs[0].ops.iter().position(|o| matches!(o, Op::MatMul { x, out, .. } if h.graphs[0].values[*x as usize].cols == h.graphs[0].values[*out as usize].cols)).unwrap(); if let Op::MatMul { x, out, .. } = &mut h.graphs[0].ops[sq] { *out = *x } }), vec!["graphs[0]".into(), "MatMul".into(), "overlaps input".into()]),
        // The plan.
        ("by_rows order", Box::new(|h| h.plan.by_rows.reverse()), vec!["plan.by_rows".into()]),
        ("by_rows names a missing graph", Box::new(|h| h.plan.by_rows.push(9999)), vec!["plan.by_rows[".into(), "names graph 9999, which does not exist".into()]),
        ("row bucket", Box::new(|h| h.plan.row_buckets = vec![3]), vec!["plan.row_buckets[0]".into()]),
        ("latency count", Box::new(|h| h.plan.latency = vec![1.0]), vec!["plan.latency".into()]),
        ("window above the limit", Box::new(|h| h.plan.window.bytes = u64::MAX), vec!["plan.window.bytes".into(), "limit".into()]),
        ("threads above the limit", Box::new(|h| h.plan.window.scratch.threads = 1 << 20), vec!["scratch.threads".into()]),
        ("threads zero", Box::new(|h| h.plan.window.scratch.threads = 0), vec!["scratch.threads is 0".into()]),
        ("KV past the window", Box::new(|h| { h.model.n_layers = 1 << 16; h.plan.window.bytes = 1 << 30 }), vec!["KV cache needs".into(), "1073741824-byte window".into()]),
        ("KV bytes", Box::new(|h| h.plan.window.kv.bytes -= 64), vec!["KV cache has".into()]),
        ("GEMM scratch", Box::new(|h| h.plan.window.scratch.gemm_operand.bytes = 64), vec!["scratch.gemm_operand".into()]),
        ("attention scratch", Box::new(|h| h.plan.window.scratch.attention.bytes = 64), vec!["scratch.attention".into()]),
        ("GEMM scratch above its need", Box::new(|h| h.plan.window.scratch.gemm_operand.bytes += 64), vec![format!("scratch.gemm_operand has {} bytes; the largest prepared GEMM operand needs {}", w0.scratch.gemm_operand.bytes + 64, w0.scratch.gemm_operand.bytes)]),
        ("attention scratch above its need", Box::new(|h| h.plan.window.scratch.attention.bytes += 64), vec![format!("scratch.attention has {} bytes; {} threads need {}", w0.scratch.attention.bytes + 64, w0.scratch.threads, w0.scratch.attention.bytes)]),
        ("activations above the values' need", Box::new(|h| h.plan.window.activations.bytes += 1 << 20), vec![format!("'activations' has {} bytes; the graphs' values need", w0.activations.bytes + (1 << 20))]),
        ("slot without a rotating segment", Box::new(|h| { let end = h.plan.window.bytes - 4096; h.plan.window.slots.push(Region { name: "slots[0]".into(), offset: end, bytes: 64 }) }), vec!["slots[0] receives no rotating segment (1 slots for 0 rotating segments)".into()]),
        ("gap in the window", Box::new(|h| h.plan.window.resident.last_mut().unwrap().offset += 1 << 20), vec![format!("'resident segment '{last_resident}'' ends at byte"), "the window has gaps the plan does not need".into()]),
        ("region outside", Box::new(|h| h.plan.window.activations.offset = h.plan.window.bytes), vec!["'activations'".into(), "outside".into()]),
        ("regions share bytes", Box::new(|h| h.plan.window.scratch.attention.offset = h.plan.window.kv.offset), vec!["'kv cache'".into(), "'scratch.attention'".into()]),
        ("resident out of order", Box::new(|h| h.plan.window.resident.swap(0, 1)), vec!["resident[1]".into(), "is not after resident[0]".into()]),
        ("region between resident segments", Box::new(|h| { let w = &mut h.plan.window; let n = w.resident.len(); w.resident[n - 1].offset = 1 << 30; w.scratch.attention.offset = (1 << 30) - (w.scratch.attention.bytes / 4096 + 2) * 4096; }), vec!["'scratch.attention' lies between the resident segments".into()]),
        ("segment with two homes", Box::new(|h| { let s = h.plan.window.resident[0].segment; h.plan.window.host.push(s) }), vec!["is both resident and host".into()]),
        ("segment home missing", Box::new(|h| h.plan.window.host.push(9999)), vec!["host segment 9999 does not exist".into()]),
        ("embedding not in a host segment", Box::new(move |h| if let Op::Embed { table, .. } = h.graphs[0].ops[embed].clone() { let s = h.segment_of(table).unwrap(); h.plan.window.host.retain(|&x| x != s) }), vec![format!("graphs[0] ops[{embed}] Embed"), "gathered by the CPU but its segment is not a host segment".into()]),
        ("weight without a home", Box::new(|h| { h.plan.window.resident.remove(0); }), vec!["is in no resident or rotating segment".into()]),
        ("value outside activations", Box::new(|h| { let end = h.plan.window.activations.offset + h.plan.window.activations.bytes; h.graphs[0].values[1].offset = end + 4096 * 64; }), vec!["graphs[0]".into()]),
        ("rotating without slots", Box::new(|h| { let r = h.plan.window.resident.remove(0); h.plan.window.rotating.push(r.segment) }), vec!["1 segments rotate but there are no slots".into()]),
    ];
    all_refused(&good, cases);
}

type Case = (&'static str, Box<dyn Fn(&mut Header)>, Vec<String>);

/// Applies each case's edit to `good`, reseals it, and checks that it is refused with the
/// case's words; reports every case that is not.
fn all_refused(good: &[u8], cases: Vec<Case>) {
    let mut failures = Vec::new();
    for (name, edit, needles) in cases {
        let crafted = common::reseal(good, edit);
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        if let Err(e) = std::panic::catch_unwind(|| refused(&crafted, &needles)) {
            failures.push(format!("{name}: {}", e.downcast_ref::<String>().cloned().unwrap_or_default()));
        }
    }
    assert!(failures.is_empty(), "{} rule(s) did not refuse as expected:\n{}", failures.len(), failures.join("\n"));
}

/// The tiny checkpoint with four layers (two leave too little besides the two slots the
/// largest segment needs), compiled for a window that holds half its weights: segments
/// rotate through slots and every graph carries a staging schedule.
fn valid_swapping() -> Vec<u8> {
    valid_in_window(Shape { n_layers: 4, ..Shape::tiny() }, common::half_the_weights)
}

/// The swap schedule's rules, each on the swapping artifact with one edit.
#[test]
fn every_staging_rule_refuses_its_crafted_artifact() {
    let good = valid_swapping();
    Artifact::parse(&good).expect("the untouched swapping artifact verifies");
    let h0 = common::stored_header(&good);
    let (rotating, slots) = (h0.plan.window.rotating.len(), h0.plan.window.slots.len());
    assert!(rotating > slots && slots > 0, "{rotating} rotating segments, {slots} slots: the window should make slots be reused");
    let first = h0.graphs[0].staging[0].first_op;
    assert!(first > 0, "op 0 (the embedding) reads no rotating segment");
    let (first_1, largest) = (h0.graphs[0].staging[1].first_op, h0.plan.window.rotating.iter().map(|&s| h0.segments[s as usize].nbytes).max().unwrap());
    let slot_bytes = h0.plan.window.slots[0].bytes;
    let cases: Vec<Case> = vec![
        ("staging count", Box::new(|h| { h.graphs[0].staging.pop(); }), vec!["graphs[0]".into(), format!("has {} staging steps for {rotating} rotating segments", rotating - 1)]),
        ("staging order", Box::new(|h| h.graphs[0].staging.swap(0, 1)), vec!["graphs[0]".into(), "staging[0]: stages rotating segment 1".into(), "the plan's order says 0".into()]),
        ("staging slot", Box::new(move |h| h.graphs[0].staging[0].slot = 1), vec!["staging[0]: stages rotating segment 0 into slot".into()]),
        (
            "staged but unread",
            Box::new(move |h| {
                // An empty segment no op reads, rotating last (it fits every slot).
                h.segments.push(Segment { name: "unread".into(), offset: 0, nbytes: 0 });
                h.plan.window.rotating.push(h.segments.len() as u32 - 1);
                let n = h.plan.window.rotating.len() as u32 - 1;
                for g in &mut h.graphs {
                    g.staging.push(StageStep { rotating: n, slot: n % slots as u32, stage_after_op: Some(0), first_op: 1, last_op: 1 });
                }
            }),
            vec!["graphs[0]".into(), format!("staging[{rotating}]: segment 'unread' is staged but no op reads it")],
        ),
        ("staged for too few ops", Box::new(|h| h.graphs[0].staging[0].last_op = h.graphs[0].staging[0].first_op.saturating_sub(1)), vec!["staging[0]: segment".into(), "but staged for ops".into()]),
        ("staged for another first op", Box::new(|h| h.graphs[0].staging[0].first_op += 1), vec!["staging[0]: segment".into(), "but staged for ops".into()]),
        ("staged past the last op", Box::new(|h| h.graphs[0].staging[0].last_op = h.graphs[0].ops.len() as u32), vec!["staging[0]: segment".into(), "but staged for ops".into()]),
        ("copy after the first use", Box::new(move |h| h.graphs[0].staging[0].stage_after_op = Some(first)), vec![format!("staging[0]: the copy starts after op {first}, not before its first use (op {first})")]),
        ("slot still used", Box::new(move |h| h.graphs[0].staging[slots].stage_after_op = None), vec![format!("staging[{slots}]: slot 0 is still used by staging[0]")]),
        ("released before its first use", Box::new(|h| h.graphs[0].staging[0].stage_after_op = Some(0)), vec!["graphs[0]".into(), format!("staging[0]: releases slot 0 after op 0, before its first use (op {first})")]),
        (
            "first uses out of order",
            Box::new(move |h| {
                // The plan rotates segments 1 and 0 in that order; every graph's steps follow
                // the plan (so step 1's segment is first used before step 0's), each copy
                // after its slot's previous segment, as the compiler schedules them.
                h.plan.window.rotating.swap(0, 1);
                for g in &mut h.graphs {
                    let (a, b) = ((g.staging[0].first_op, g.staging[0].last_op), (g.staging[1].first_op, g.staging[1].last_op));
                    (g.staging[0].first_op, g.staging[0].last_op, g.staging[1].first_op, g.staging[1].last_op) = (b.0, b.1, a.0, a.1);
                    for i in slots..g.staging.len() {
                        g.staging[i].stage_after_op = Some(g.staging[i - slots].last_op);
                    }
                }
            }),
            vec!["graphs[0]".into(), format!("staging[1]: first used at op {first}, before staging[0] (op {first_1})")],
        ),
        ("slot larger than the largest rotating segment", Box::new(|h| h.plan.window.slots[0].bytes += 4096), vec![format!("slots[0] has {} bytes; the largest rotating segment needs {largest}", slot_bytes + 4096)]),
        ("rotating segment larger than its slot", Box::new(|h| h.plan.window.slots[0].bytes = 64), vec!["plan.window".into(), "does not fit slots[0] (64 bytes)".into()]),
    ];
    all_refused(&good, cases);
}

/// The data section must start on a page: tensors are cast in place from the mapping.
#[test]
fn a_misaligned_data_section_is_refused() {
    let good = valid();
    let p = Preamble::decode(&good).unwrap();
    // Shift everything after the preamble by 64 bytes (the header CRC stays valid).
    let shift = 64u64;
    let mut out = good[..p.data_offset as usize].to_vec();
    out.extend(std::iter::repeat_n(0u8, shift as usize));
    out.extend_from_slice(&good[p.data_offset as usize..]);
    let q = Preamble { data_offset: p.data_offset + shift, header_offset: p.header_offset + shift, ..p };
    out[..q.encode().len()].copy_from_slice(&q.encode());
    refused(&out, &["data section starts at 4160", "4096"]);
}

/// Through the CLI: one line naming the element, a non-zero exit, no panic.
#[test]
fn llada_rt_reports_a_crafted_artifact_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let crafted = common::reseal(&valid(), |h| {
        let i = h.graphs[0].ops.iter().position(|o| matches!(o, Op::Add { .. })).unwrap();
        if let Op::Add { acc, x } = &mut h.graphs[0].ops[i] {
            *x = *acc;
        }
    });
    let path = dir.path().join("crafted.lad");
    std::fs::write(&path, crafted).unwrap();
    let o = common::run("llada-rt", &["run", path.to_str().unwrap(), "--prompt-ids", "1,2,3", "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    common::assert_clean_failure(&o, &["crafted.lad", "graphs[0]", "Add", "to itself"]);
}

/// The same malformed tokenizer stored in an artifact: the runtime names it in one line.
#[test]
fn llada_rt_reports_a_malformed_stored_tokenizer_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let crafted = common::reseal(&valid(), |h| {
        let at = h.tokenizer.tokenizer_json.find("\"decoder\"").unwrap();
        let tail = h.tokenizer.tokenizer_json[at..].replacen("\"type\":", "\"type\"", 1);
        h.tokenizer.tokenizer_json = format!("{}{tail}", &h.tokenizer.tokenizer_json[..at]);
    });
    let path = dir.path().join("crafted.lad");
    std::fs::write(&path, crafted).unwrap();
    let o = common::run("llada-rt", &["run", path.to_str().unwrap(), "-p", "hi", "--gen-len", "16", "--block-len", "8", "--steps", "16"]);
    common::assert_clean_failure(&o, &["stored tokenizer", "malformed"]);
}

/// The tiny LLaDA-MoE checkpoint, compiled with each layer's expert pool holding a quarter
/// of its experts (so slots, staging and the CPU path all have work).
fn valid_moe() -> Vec<u8> {
    let quarter_of_the_experts = |full: &Path| {
        let x = llada_rt::Model::open(full, false).unwrap().header.plan.window.experts.clone();
        x.region.offset + x.region.bytes / 4
    };
    valid_in_window(Shape::tiny_moe(), quarter_of_the_experts)
}

/// The mixture-of-experts rules: the model's expert counts, the three MoE ops, and the
/// expert plan (segments, pools, costs).
#[test]
fn every_moe_rule_refuses_its_crafted_artifact() {
    let good = valid_moe();
    Artifact::parse(&good).expect("the untouched MoE artifact verifies");
    let h0 = common::stored_header(&good);
    assert_eq!(h0.plan.window.experts.slots_per_layer, 2, "a quarter of 8 experts per layer");
    let moe = op_index(&h0, 0, |o| matches!(o, Op::MoeExperts { .. }));
    let route = op_index(&h0, 0, |o| matches!(o, Op::Route { .. }));
    let qnorm = op_index(&h0, 0, |o| matches!(o, Op::HeadRmsNorm { .. }));
    let with_moe = move |f: fn(&mut Op)| Box::new(move |h: &mut Header| f(&mut h.graphs[0].ops[moe])) as Box<dyn Fn(&mut Header)>;
    let cases: Vec<Case> = vec![
        // The model.
        ("top_k above the experts", Box::new(|h| h.model.moe.as_mut().unwrap().top_k = 9), vec!["model: moe: 8 experts with top_k 9".into()]),
        ("no experts", Box::new(|h| h.model.moe.as_mut().unwrap().experts = 0), vec!["model: moe: 0 experts".into()]),
        // The ops.
        ("expert count", with_moe(|o| if let Op::MoeExperts { experts, .. } = o { *experts = 1 << 30 }), vec![format!("graphs[0] 'rows-16' ops[{moe}] MoeExperts: 1073741824 experts, but the model has 8")]),
        ("expert layer", with_moe(|o| if let Op::MoeExperts { layer, .. } = o { *layer = 2 }), vec![format!("ops[{moe}] MoeExperts: layer 2 of a 2-layer model")]),
        ("expert tensors", with_moe(|o| if let Op::MoeExperts { first, .. } = o { *first += 1 }), vec![format!("ops[{moe}] MoeExperts: expert 0:")]),
        ("expert work", with_moe(|o| if let Op::MoeExperts { work, x, .. } = o { *work = *x }), vec![format!("ops[{moe}] MoeExperts"), "is not [tokens, ".into()]),
        ("expert outputs", with_moe(|o| if let Op::MoeExperts { ranked, route, .. } = o { *ranked = *route }), vec![format!("ops[{moe}] MoeExperts"), "is not [tokens, ".into()]),
        ("route top_k", Box::new(move |h| if let Op::Route { top_k, .. } = &mut h.graphs[0].ops[route] { *top_k = 3 }), vec![format!("ops[{route}] Route:"), "the model routes 8 experts, top 2".into()]),
        ("head norm heads", Box::new(move |h| if let Op::HeadRmsNorm { heads, .. } = &mut h.graphs[0].ops[qnorm] { *heads = 7 }), vec![format!("ops[{qnorm}] HeadRmsNorm: heads 0..7")]),
        ("head norm weight", Box::new(move |h| if let Op::HeadRmsNorm { weight, .. } = &mut h.graphs[0].ops[qnorm] { *weight = 1 }), vec![format!("ops[{qnorm}] HeadRmsNorm: weight"), "is not f32 [32]".into()]),
        // The expert plan.
        ("experts per layer", Box::new(|h| h.plan.window.experts.per_layer = 4), vec!["plan.window: experts.per_layer 4 but the model has 8 experts".into()]),
        ("expert segment count", Box::new(|h| { h.plan.window.experts.segments.pop(); }), vec!["experts.segments lists 15 segments for 16 experts".into()]),
        ("expert segment also resident", Box::new(|h| { let s = h.plan.window.resident[0].segment; h.plan.window.experts.segments[3] = s }), vec!["is both resident and expert 3".into()]),
        ("expert segments swapped", Box::new(|h| h.plan.window.experts.segments.swap(0, 1)), vec!["of expert 0 is not in the segment experts.segments lists for layer 0".into()]),
        ("expert slot too small", Box::new(|h| h.plan.window.experts.slot_bytes = 4096), vec!["does not fit a 4096-byte expert slot".into()]),
        ("expert slot above the largest expert", Box::new(|h| h.plan.window.experts.slot_bytes += 4096), vec![format!("plan.window: experts.slot_bytes is {}; the largest expert segment needs {}", h0.plan.window.experts.slot_bytes + 4096, h0.plan.window.experts.segments.iter().map(|&s| h0.segments[s as usize].nbytes).max().unwrap())]),
        ("expert slots above the experts", Box::new(|h| h.plan.window.experts.slots_per_layer = 9), vec!["9 expert slots per layer".into()]),
        ("expert region size", Box::new(|h| h.plan.window.experts.region.bytes += 64), vec!["the expert slot region has".into()]),
        ("expert region over the KV cache", Box::new(|h| h.plan.window.experts.region.offset = h.plan.window.kv.offset), vec!["'kv cache' and 'expert slots' share window bytes".into()]),
        ("expert costs", Box::new(|h| h.plan.window.experts.costs.stage_seconds = f64::NAN), vec!["expert costs must be finite".into()]),
    ];
    all_refused(&good, cases);
}

/// The section table: a section this build does not know is skipped when optional (the
/// artifact loads and runs) and refused by name when required; an NPU section at a version
/// this build does not read is skipped by a load that does not need it.
#[test]
fn unknown_sections_are_skipped_unless_required() {
    let good = valid();
    let with = |key: &str, version: u32, required: bool| {
        common::reseal(&good, |h| h.extensions.push(llada_ir::Extension { key: key.into(), version, required, bytes: vec![7; 9] }))
    };
    let dir = tempfile::tempdir().unwrap();
    for (key, version) in [("later.thing", 3), (llada_ir::npu::EXTENSION_KEY, llada_ir::npu::SECTION_VERSION + 1)] {
        let file = with(key, version, false);
        let a = Artifact::parse(&file).unwrap_or_else(|e| panic!("an optional '{key}' is skipped: {e}"));
        assert!(a.sections.iter().any(|s| s.kind == key && s.version == version && !s.required));
        a.verify_data().unwrap();
        // The runtime loads it and runs a pass on the host.
        let path = dir.path().join("optional.lad");
        std::fs::write(&path, &file).unwrap();
        let model = llada_rt::Model::open(&path, true).unwrap();
        let mut s = llada_rt::Session::with_threads(&model, 1).unwrap();
        assert_eq!(s.forward_full(&[1, 2, 3, 4], &[3]).unwrap().len(), model.header.model.embedding_size as usize);
    }
    refused(&with("later.thing", 3, true), &["needs section 'later.thing' (version 3)", "does not know"]);
    refused(&with(llada_ir::npu::EXTENSION_KEY, 99, true), &["section 'npu.qnn' is version 99", "recompile"]);
}
