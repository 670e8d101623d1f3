//! QNN's op trace of an executable (the HTP's performance model with `OPTRACE` on at
//! finalize: a Chrome trace of every op it scheduled on the HTP's units, in the modelled
//! chip's cycles), grouped by what the ops do, for `lladac inspect --estimate`'s per-op
//! breakdown. The trace names QNN's own ops (`q::ConvLayer_s1.opt`, `q::Softmax`...), not the
//! graph's nodes, so the groups come from those names: see [`kind_of`].

use llada_ir::npu::{NpuOpGroup, NpuOpKind};
use serde::Deserialize;

#[derive(Deserialize)]
struct Trace {
    #[serde(rename = "traceEvents")]
    events: Vec<Event>,
    #[serde(rename = "Hextimate Configuration")]
    config: Option<Config>,
}

#[derive(Deserialize)]
struct Config {
    sim_core_freq: f64,
}

#[derive(Deserialize)]
struct Event {
    name: String,
    ph: String,
    tid: Option<u32>,
    dur: Option<f64>,
    args: Option<Args>,
}

#[derive(Deserialize)]
struct Args {
    name: Option<String>,
    input_dims: Option<Vec<Vec<u32>>>,
    dims: Option<Vec<Vec<u32>>>,
}

/// The trace's groups: per kind, the microseconds its ops kept their units busy (summed over
/// the HVX threads they ran on) and how many ops; `None` if `object` holds no trace.
pub fn groups(object: &[u8], fixed_point: bool) -> Option<Vec<NpuOpGroup>> {
    // The object is a small binary header, then the JSON trace (then the graph's name).
    let start = object.iter().position(|&b| b == b'{')?;
    let mut de = serde_json::Deserializer::from_slice(&object[start..]);
    let trace = Trace::deserialize(&mut de).ok()?;
    let mhz = trace.config.as_ref().map_or(1.0, |c| c.sim_core_freq).max(1.0);
    let units: std::collections::HashMap<u32, String> = trace
        .events
        .iter()
        .filter(|e| e.ph == "M" && e.name == "thread_name")
        .filter_map(|e| Some((e.tid?, e.args.as_ref()?.name.clone()?)))
        .collect();
    let mut out: Vec<NpuOpGroup> = Vec::new();
    for e in trace.events.iter().filter(|e| e.ph == "X") {
        let unit = e.tid.and_then(|t| units.get(&t)).map_or("", |s| s.as_str());
        let broadcast = e.args.as_ref().is_some_and(|a| match (&a.input_dims, &a.dims) {
            (Some(ins), Some(outs)) => ins.iter().any(|d| outs.first().is_some_and(|o| d.len() == o.len() && d != o)),
            _ => false,
        });
        let Some(kind) = kind_of(&e.name, unit, broadcast, fixed_point) else { continue };
        let micros = e.dur.unwrap_or(0.0) / mhz;
        match out.iter_mut().find(|g| g.kind == kind) {
            Some(g) => {
                g.busy_micros += micros;
                g.ops += 1;
            }
            None => out.push(NpuOpGroup { kind, busy_micros: micros, ops: 1 }),
        }
    }
    out.sort_by_key(|g| g.kind as u32);
    Some(out)
}

/// The group of a traced op, from QNN's op name and the unit it ran on; `None` for the main
/// thread's scheduling entries (a spawn, a DMA start or sync: the ops they launch are traced
/// on their own units). Elementwise ops with a broadcast operand are RoPE's (the rotary
/// tables are the graphs' only broadcast operands besides a bias, where a model has one).
/// In a fixed-point format QNN's fp16 convolutions are attention's products (its linears run
/// as 16-bit convolutions); in an fp16 one they are the linears too, and count as matmuls.
pub fn kind_of(name: &str, unit: &str, broadcast: bool, fixed_point: bool) -> Option<NpuOpKind> {
    if let Some(inner) = name.strip_prefix("default_dma (") {
        return Some(if inner.contains("@Fill") || inner.contains("@Spill") {
            NpuOpKind::SpillFill
        } else if inner.contains("weights_to_vtcm") || inner.contains("bias_to_vtcm") {
            NpuOpKind::WeightRead
        } else {
            NpuOpKind::DataMovement
        });
    }
    if name.starts_with("default_") || unit.starts_with("FG") {
        return None;
    }
    let op = name.trim_start_matches("q::");
    let has = |s: &str| op.contains(s);
    Some(if has("pack_fp16_pkweights_dynamic") || has("Softmax") || (has("ConvLayer.fp16") && fixed_point) || has("MatMul") {
        NpuOpKind::Attention
    } else if has("ConvLayer") || has("quant_to") || has("expand_block") || has("pack_") {
        NpuOpKind::Matmul
    } else if has("rmsnorm") || has("RmsNorm") || has("LayerNorm") {
        NpuOpKind::Norm
    } else if has("Quantize") || has("Dequantize") || has("Requant") || has("Convert") {
        NpuOpKind::Quantize
    } else if ["Reshape", "Transpose", "Concat", "Slice", "ForceFormat", "flat_", "Gather", "Pad", "Split", "Tile"].iter().any(|s| has(s)) {
        NpuOpKind::DataMovement
    } else if ["Mul", "mul_op", "Add", "Sub", "Swish", "Sigmoid", "Neg", "Exp", "Div", "Rsqrt", "Sin", "Cos"].iter().any(|s| has(s)) {
        if broadcast { NpuOpKind::Rope } else { NpuOpKind::Elementwise }
    } else {
        NpuOpKind::Other
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace as QNN writes it (binary header, JSON, the graph's name after it), each op in
    /// its group, the main thread's scheduling left out, cycles turned into microseconds at the
    /// modelled clock.
    #[test]
    fn a_trace_groups_its_ops_by_kind_in_microseconds() {
        let json = r#"{"traceEvents": [
            {"name": "thread_name", "ph": "M", "tid": 0, "pid": 0, "args": {"name": "FG:"}},
            {"name": "thread_name", "ph": "M", "tid": 1, "pid": 0, "args": {"name": "HVX 1:"}},
            {"name": "thread_name", "ph": "M", "tid": 9, "pid": 0, "args": {"name": "HMX 1:"}},
            {"name": "thread_name", "ph": "M", "tid": 10, "pid": 0, "args": {"name": "DMA:"}},
            {"name": "default_dma_start (q::ConvLayer.opt.weights_to_vtcm)", "ph": "X", "tid": 0, "ts": 0, "dur": 150, "args": {}},
            {"name": "default_dma (q::ConvLayer.opt.weights_to_vtcm)", "ph": "X", "tid": 10, "ts": 0, "dur": 2000, "args": {}},
            {"name": "default_dma (@Spill)", "ph": "X", "tid": 10, "ts": 0, "dur": 1000, "args": {}},
            {"name": "q::ConvLayer_s1.opt", "ph": "X", "tid": 9, "ts": 0, "dur": 1000, "args": {}},
            {"name": "q::ConvLayer.fp16.s1.tcm", "ph": "X", "tid": 9, "ts": 0, "dur": 500, "args": {}},
            {"name": "q::Softmax", "ph": "X", "tid": 1, "ts": 0, "dur": 500, "args": {}},
            {"name": "q::Mul.fp16", "ph": "X", "tid": 1, "ts": 0, "dur": 100, "args": {"input_dims": [[1, 8, 32, 64], [1, 8, 1, 64]], "dims": [[1, 8, 32, 64]]}},
            {"name": "q::Mul.fp16", "ph": "X", "tid": 1, "ts": 0, "dur": 100, "args": {"input_dims": [[1, 8, 8, 736], [1, 8, 8, 736]], "dims": [[1, 8, 8, 736]]}},
            {"name": "q::Dequantize", "ph": "X", "tid": 1, "ts": 0, "dur": 1000, "args": {}},
            {"name": "q::Reshape", "ph": "X", "tid": 1, "ts": 0, "dur": 1000, "args": {}},
            {"name": "q::rmsnorm_fp16.tcm", "ph": "X", "tid": 1, "ts": 0, "dur": 1000, "args": {}}
        ], "Hextimate Configuration": {"sim_core_freq": 1000.0}}"#;
        let mut object = vec![0u8; 56];
        object.extend_from_slice(json.as_bytes());
        object.extend_from_slice(b"\nname");
        let g = groups(&object, true).unwrap();
        let of = |k: NpuOpKind| g.iter().find(|x| x.kind == k).map(|x| (x.busy_micros, x.ops));
        assert_eq!(of(NpuOpKind::WeightRead), Some((2.0, 1)), "the DMA's weight reads; the main thread's start is scheduling");
        assert_eq!(of(NpuOpKind::SpillFill), Some((1.0, 1)));
        assert_eq!(of(NpuOpKind::Matmul), Some((1.0, 1)));
        assert_eq!(of(NpuOpKind::Attention), Some((1.0, 2)), "the fp16 product and the softmax");
        assert_eq!(of(NpuOpKind::Rope), Some((0.1, 1)));
        assert_eq!(of(NpuOpKind::Elementwise), Some((0.1, 1)));
        assert_eq!((of(NpuOpKind::Quantize), of(NpuOpKind::DataMovement), of(NpuOpKind::Norm)), (Some((1.0, 1)), Some((1.0, 1)), Some((1.0, 1))));
        // An fp16 format's convolutions are its linears.
        assert_eq!(kind_of("q::ConvLayer.fp16.s1.tcm", "HMX 1:", false, false), Some(NpuOpKind::Matmul));
        assert!(groups(b"no trace here", true).is_none());
    }
}
