//! The cost model: a roofline per op. Each op of a graph moves some bytes and does some
//! operations on one engine; it takes as long as the slower of the two. A pass is the sum of
//! its ops, overlapped (or not) with staging weights into the window. Deliberately simple: it
//! ranks graphs and sizes speculation buckets, and a measured machine (`llada-rt roofline`)
//! feeds it real rates on the host.

use llada_ir::{DType, Graph, Header, Op, Rows, ValueId};
use serde::{Deserialize, Serialize};

use crate::{Rates, Target};

/// The arithmetic an op runs on: which of a machine's rates applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Engine {
    /// f32 multiply-adds (an NPU's vector unit).
    F32,
    /// f16 products (an NPU's matrix unit).
    F16,
    /// bf16 products, f32 sums.
    Bf16,
    /// int8 products, int32 sums.
    Int8,
}

impl Rates {
    /// Operations per second of `engine`. An absent engine (rate 0) falls back to the f32
    /// rate, because every kernel can widen its operands to f32 and run there.
    pub fn of(&self, engine: Engine) -> f64 {
        let rate = match engine {
            Engine::F32 => self.f32_flops,
            Engine::F16 => self.f16_flops,
            Engine::Bf16 => self.bf16_flops,
            Engine::Int8 => self.int8_ops,
        };
        if rate > 0.0 { rate } else { self.f32_flops }
    }
}

/// Rates and bandwidth one prediction uses: from a target file or measured (`llada-rt roofline`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Peak operations per second per engine.
    pub rates: Rates,
    /// DRAM bytes per second the ops' reads and writes move at.
    pub bandwidth: f64,
    /// Bytes per second weights are copied into the window.
    pub staging_bytes_per_second: f64,
    /// Seconds to map one buffer (setup only; a steady-state pass maps nothing).
    pub map_seconds: f64,
}

impl Target {
    /// The machine the accelerator graphs run on.
    pub fn accelerator_machine(&self) -> Machine {
        Machine {
            rates: self.accelerator,
            bandwidth: self.dram_bytes_per_second,
            staging_bytes_per_second: self.staging_bytes_per_second,
            map_seconds: self.map_seconds,
        }
    }

    /// The machine the CPU path (revision kernels) runs on: the same DRAM, and no mapping,
    /// since the CPU reads weights in place from the mapped artifact.
    pub fn cpu_machine(&self) -> Machine {
        Machine { rates: self.cpu, map_seconds: 0.0, ..self.accelerator_machine() }
    }
}

/// What one op costs: bytes it moves to or from DRAM, operations, and the engine they run on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpWork {
    /// Bytes read from and written to DRAM.
    pub bytes: f64,
    /// Operations (a multiply-add is 2).
    pub ops: f64,
    /// The engine whose rate the operations run at.
    pub engine: Engine,
}

/// `amount / rate`, where nothing to do takes no time even at rate 0 (and anything at rate 0
/// takes forever, which is what a machine without the resource means).
fn time(amount: f64, rate: f64) -> f64 {
    if amount <= 0.0 { 0.0 } else { amount / rate }
}

/// Seconds of one op: `max(bytes / bandwidth, ops / rate(engine))`; an engine the machine
/// lacks (rate 0) runs at the f32 rate (see [`Rates::of`]).
pub fn op_seconds(m: &Machine, w: &OpWork) -> f64 {
    time(w.bytes, m.bandwidth).max(time(w.ops, m.rates.of(w.engine)))
}

impl Engine {
    /// The engine's name in reports: the element type its products take.
    pub fn name(self) -> &'static str {
        match self {
            Engine::F32 => "f32",
            Engine::F16 => "f16",
            Engine::Bf16 => "bf16",
            Engine::Int8 => "int8",
        }
    }
}

/// The engine a MatMul over weights stored as `dtype` runs on, given the plan's bf16 choice
/// and the target's activation width (`act_bytes`).
///
/// Quantised weights compute W8A8 and W4A8 on every target, as the kernels do: activations
/// are quantised to int8 per row and multiplied in int8 with int32 sums (VNNI or SDOT on a
/// CPU, 32-bit integer arithmetic in the Vulkan shaders, an NPU's int8 matrix unit). They
/// never run W4A16. Bf16 weights use bf16 products only when the plan rounds activations to
/// bf16. Float weights otherwise compute in the activation type.
pub fn matmul_engine(dtype: DType, bf16_activations: bool, act_bytes: u32) -> Engine {
    let act = if act_bytes == 2 { Engine::F16 } else { Engine::F32 };
    match dtype {
        DType::PanelQ8 | DType::PanelQ4 { .. } => Engine::Int8,
        DType::PanelBf16 | DType::Bf16 => if bf16_activations { Engine::Bf16 } else { Engine::F32 },
        DType::PanelF16 | DType::PanelF32 | DType::F16 | DType::F32 => act,
    }
}

/// The work of every op of `g` (a verified graph of `h`), in op order: token-row values have
/// `g.rows` rows (a static graph computes all of them, padding included), head-row values
/// `logit_rows`; attention reads `context` cached positions per layer from a KV cache of
/// `kv_bytes`-byte elements; activations are `act_bytes` per element (4 for f32, 2 for f16).
pub fn graph_work(h: &Header, g: &Graph, logit_rows: u32, context: u32, kv_bytes: u32, act_bytes: u32) -> Vec<OpWork> {
    let act = act_bytes as f64;
    let kv = kv_bytes as f64;
    let rows = |v: ValueId| match g.values[v as usize].rows {
        Rows::Tokens => g.rows as f64,
        Rows::Logits => logit_rows as f64,
    };
    let cols = |v: ValueId| g.values[v as usize].cols as f64;
    let elements = |v: ValueId| rows(v) * cols(v);
    let attention_engine = if act_bytes == 2 { Engine::F16 } else { Engine::F32 };
    g.ops
        .iter()
        .map(|op| match *op {
            // A gather: each row reads one table row (in its stored width) and writes it.
            Op::Embed { table, out } => {
                let t = &h.tensors[table as usize];
                let stored = t.nbytes as f64 / t.numel().max(1) as f64;
                OpWork { bytes: elements(out) * (stored + act), ops: 0.0, engine: Engine::F32 }
            }
            // Every weight byte is read once per pass (tiled GEMMs keep activations on chip).
            Op::MatMul { x, weight, out } => {
                let t = &h.tensors[weight as usize];
                let (r, k, n) = (rows(x), cols(x), cols(out));
                OpWork {
                    bytes: t.nbytes as f64 + r * (k + n) * act,
                    ops: 2.0 * r * n * k,
                    engine: matmul_engine(t.dtype, h.plan.bf16_activations, act_bytes),
                }
            }
            // Q.K^T and P.V over `context` keys per query head; reads the layer's cached K and
            // V, writes this graph's rows' K and V.
            Op::Attention { qkv, out, heads, kv_heads, .. } => {
                let r = rows(qkv);
                let hd = h.model.head_dim as f64;
                let kv_row = 2.0 * kv_heads as f64 * hd * kv;
                OpWork {
                    bytes: r * (cols(qkv) + cols(out)) * act + context as f64 * kv_row + r * kv_row,
                    ops: 4.0 * r * context as f64 * hd * heads as f64,
                    engine: attention_engine,
                }
            }
            // As Attention, with the op's own head shape; a sliding-window layer reads at most
            // its window of cached keys before the rows (their block's start) and the rows'.
            Op::WindowAttention { qkv, out, heads, kv_heads, head_dim, window, .. } => {
                let r = rows(qkv);
                let keys = match window {
                    Some(w) => (context as f64).min(w.saturating_sub(1) as f64 + r),
                    None => context as f64,
                };
                let hd = head_dim as f64;
                let kv_row = 2.0 * kv_heads as f64 * hd * kv;
                OpWork {
                    bytes: r * (cols(qkv) + cols(out)) * act + keys * kv_row + r * kv_row,
                    ops: 4.0 * r * keys * hd * heads as f64,
                    engine: attention_engine,
                }
            }
            // A softmax over each row's vocabulary, then those probabilities times the whole
            // embedding table: a matmul contracting over the vocabulary.
            Op::SoftEmbed { x, table, out, .. } => {
                let t = &h.tensors[table as usize];
                let (r, vocab, d) = (rows(x), cols(x), cols(out));
                OpWork {
                    bytes: t.nbytes as f64 + r * (vocab + d) * act,
                    ops: 2.0 * r * vocab * d + 4.0 * r * vocab,
                    engine: matmul_engine(t.dtype, h.plan.bf16_activations, act_bytes),
                }
            }
            // Routing spreads `rows * top_k` picks over the experts; expected uniform, they
            // touch `E (1 - (1 - k/E)^rows)` distinct experts, each of whose weights is read
            // once, wherever it is computed.
            Op::MoeExperts { x, first, experts, .. } => {
                let r = rows(x);
                let (bytes, row_ops, engine) = expert_work(h, first, act_bytes);
                let (e, k) = (experts as f64, h.model.moe.map_or(1, |m| m.top_k) as f64);
                let touched = e * (1.0 - (1.0 - k / e).powf(r));
                let d = h.model.d_model as f64;
                OpWork { bytes: touched * bytes + r * (d + 2.0 * k * d) * act, ops: r * k * row_ops, engine }
            }
            // Elementwise and row-wise ops: memory-bound in practice. They run on the vector
            // unit, whose rate the f32 figure stands for (an NPU's f16/int8 figures are its
            // matrix unit's). The small tensors they read (norm weights, rotary rows) are
            // left out.
            _ => {
                let (ins, outs) = (op.inputs(), op.outputs());
                let bytes = ins.iter().chain(&outs).map(|&v| elements(v) * act).sum();
                let ops = outs.iter().map(|&v| elements(v)).sum();
                OpWork { bytes, ops, engine: Engine::F32 }
            }
        })
        .collect()
}

/// One expert of an MoE op whose experts start at tensor `first`: its weight bytes, the
/// operations one token row costs in it (`[gate | up]` then down), and its engine.
pub fn expert_work(h: &Header, first: u32, act_bytes: u32) -> (f64, f64, Engine) {
    let (gate_up, down) = (&h.tensors[first as usize], &h.tensors[first as usize + 1]);
    let ops = 2.0 * (gate_up.numel() + down.numel()) as f64;
    (gate_up.nbytes as f64 + down.nbytes as f64, ops, matmul_engine(gate_up.dtype, h.plan.bf16_activations, act_bytes))
}

/// An expert's cost on machine `m` (see [`llada_ir::PathCost`]): reading its weights, or
/// its operations per token row.
pub fn expert_path_cost(m: &Machine, h: &Header, first: u32, act_bytes: u32) -> llada_ir::PathCost {
    let (bytes, row_ops, engine) = expert_work(h, first, act_bytes);
    llada_ir::PathCost { weight_seconds: time(bytes, m.bandwidth), row_seconds: time(row_ops, m.rates.of(engine)) }
}

/// Predicted seconds of one pass: compute, staging, and the two combined.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PassEstimate {
    /// Sum of the ops' roofline times.
    pub compute_seconds: f64,
    /// Time to copy the staged weights into the window.
    pub staging_seconds: f64,
    /// The pass: compute and staging combined.
    pub seconds: f64,
}

/// One pass of `work` with `staged_bytes` copied into the window: `max(compute, staging)`
/// when the copies overlap compute (double-buffered slots), else their sum. Mapping adds
/// nothing: in a steady state every segment stages into the slot it used last pass.
/// Optimistic when both sides are memory-bound, since copies and ops share the DRAM.
pub fn pass_estimate(m: &Machine, work: &[OpWork], staged_bytes: u64, overlapped: bool) -> PassEstimate {
    let compute_seconds: f64 = work.iter().map(|w| op_seconds(m, w)).sum();
    let staging_seconds = time(staged_bytes as f64, m.staging_bytes_per_second);
    let seconds = if overlapped { compute_seconds.max(staging_seconds) } else { compute_seconds + staging_seconds };
    PassEstimate { compute_seconds, staging_seconds, seconds }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llada_ir::{CompileInfo, ModelConfig, Plan, SpecialTokens, TensorInfo, TokenizerSpec, Value};

    /// A LLaDA-shaped network (`layers` blocks of `d` wide, MHA of 128-wide heads, SwiGLU
    /// `f`, vocabulary `vocab`), matmul weights in `w`, with one full-sequence graph per entry
    /// of `rows` built as the compiler lowers it. Offsets are left 0: nothing here is placed.
    fn network(layers: u32, d: u32, f: u32, vocab: u32, w: DType, rows: &[u32]) -> Header {
        let heads = d / 128;
        let model = ModelConfig {
            architecture: "llada".into(),
            d_model: d,
            n_layers: layers,
            n_heads: heads,
            n_kv_heads: heads,
            head_dim: 128,
            mlp_hidden: f,
            vocab_size: vocab,
            embedding_size: vocab,
            max_sequence_length: 4096,
            rope_theta: 500000.0,
            rms_eps: 1e-5,
            qk_norm: false,
            moe: None,
        };
        let mut tensors = Vec::new();
        let mut add = |name: String, dtype: DType, shape: Vec<u64>| {
            let nbytes = dtype.nbytes(&shape).unwrap();
            tensors.push(TensorInfo { name, dtype, shape, offset: 0, nbytes, crc32: 0 });
            tensors.len() as u32 - 1
        };
        let (d64, f64_, v64) = (d as u64, f as u64, vocab as u64);
        let table = add("wte".into(), DType::Bf16, vec![v64, d64]);
        let blocks: Vec<[u32; 6]> = (0..layers)
            .map(|l| {
                [
                    add(format!("{l}.attn_norm"), DType::F32, vec![d64]),
                    add(format!("{l}.qkv"), w, vec![3 * d64, d64]),
                    add(format!("{l}.o"), w, vec![d64, d64]),
                    add(format!("{l}.ff_norm"), DType::F32, vec![d64]),
                    add(format!("{l}.gate_up"), w, vec![2 * f64_, d64]),
                    add(format!("{l}.ff_out"), w, vec![d64, f64_]),
                ]
            })
            .collect();
        let final_norm = add("ln_f".into(), DType::F32, vec![d64]);
        let lm_head = add("head".into(), w, vec![v64, d64]);
        let (cos, sin) = (add("cos".into(), DType::F32, vec![4096, 64]), add("sin".into(), DType::F32, vec![4096, 64]));

        let graph = |r: u32| {
            let mut values = Vec::new();
            let mut value = |name: &str, rows: Rows, cols: u32| {
                values.push(Value { name: name.into(), rows, cols, offset: 0 });
                values.len() as u32 - 1
            };
            let x = value("x", Rows::Tokens, d);
            let mut ops = vec![Op::Embed { table, out: x }];
            for (l, &[attn_norm, qkv_w, o_w, ff_norm, gate_up_w, ff_out_w]) in blocks.iter().enumerate() {
                let (xn, qkv, att, o) = (value("xn", Rows::Tokens, d), value("qkv", Rows::Tokens, 3 * d), value("att", Rows::Tokens, d), value("o", Rows::Tokens, d));
                let (fin, gu, hid, fo) = (value("fin", Rows::Tokens, d), value("gu", Rows::Tokens, 2 * f), value("h", Rows::Tokens, f), value("fo", Rows::Tokens, d));
                ops.extend([
                    Op::RmsNorm { x, weight: attn_norm, eps: 1e-5, out: xn },
                    Op::MatMul { x: xn, weight: qkv_w, out: qkv },
                    Op::Rope { x: qkv, heads: 2 * heads, cos, sin },
                    Op::Attention { qkv, out: att, heads, kv_heads: heads, layer: l as u32 },
                    Op::MatMul { x: att, weight: o_w, out: o },
                    Op::Add { acc: x, x: o },
                    Op::RmsNorm { x, weight: ff_norm, eps: 1e-5, out: fin },
                    Op::MatMul { x: fin, weight: gate_up_w, out: gu },
                    Op::SwiGlu { x: gu, out: hid },
                    Op::MatMul { x: hid, weight: ff_out_w, out: fo },
                    Op::Add { acc: x, x: fo },
                ]);
            }
            let (hx, hn, logits) = (value("hx", Rows::Logits, d), value("hn", Rows::Logits, d), value("logits", Rows::Logits, vocab));
            ops.extend([
                Op::GatherLogitRows { x, out: hx },
                Op::RmsNorm { x: hx, weight: final_norm, eps: 1e-5, out: hn },
                Op::MatMul { x: hn, weight: lm_head, out: logits },
            ]);
            Graph { name: format!("rows-{r}"), rows: r, logit_rows: r, values, ops, logits, window_bytes: 0, staging: Vec::new() }
        };
        let graphs = rows.iter().map(|&r| graph(r)).collect();
        Header {
            model,
            special: SpecialTokens { mask: 126336, bos: None, eos: None, eot: None },
            tokenizer: TokenizerSpec { tokenizer_json: String::new(), chat_template: None, bos_token: None, eos_token: None, add_bos_token: false },
            tensors,
            segments: Vec::new(),
            graphs,
            plan: Plan::default(),
            compile: CompileInfo::default(),
            extensions: Vec::new(),
        }
    }

    fn machine(f32_flops: f64, int8_ops: f64, bandwidth: f64) -> Machine {
        Machine { rates: Rates { f32_flops, f16_flops: 0.0, bf16_flops: 0.0, int8_ops }, bandwidth, staging_bytes_per_second: bandwidth / 2.0, map_seconds: 0.0 }
    }

    #[test]
    fn an_op_takes_the_slower_of_its_bytes_and_its_ops() {
        let m = machine(1e9, 4e9, 1e9);
        let memory_bound = OpWork { bytes: 2e9, ops: 1e9, engine: Engine::F32 };
        let compute_bound = OpWork { bytes: 1e9, ops: 3e9, engine: Engine::F32 };
        assert_eq!(op_seconds(&m, &memory_bound), 2.0);
        assert_eq!(op_seconds(&m, &compute_bound), 3.0);
        assert_eq!(op_seconds(&m, &OpWork { engine: Engine::Int8, ..compute_bound }), 1.0);
        // No bf16 engine: it runs at the f32 rate.
        assert_eq!(op_seconds(&m, &OpWork { engine: Engine::Bf16, ..compute_bound }), 3.0);
        assert_eq!(op_seconds(&m, &OpWork { bytes: 0.0, ops: 0.0, engine: Engine::F16 }), 0.0);
    }

    #[test]
    fn matmul_work_follows_its_shape_and_engine_its_weights() {
        let q4 = DType::PanelQ4 { group: 64 };
        let h = network(1, 256, 512, 1000, q4, &[48]);
        let g = &h.graphs[0];
        let work = graph_work(&h, g, 16, 100, 2, 4);
        assert_eq!(work.len(), g.ops.len());
        for (op, w) in g.ops.iter().zip(&work) {
            if let Op::MatMul { x, weight, out } = *op {
                let t = &h.tensors[weight as usize];
                let (n, k) = (t.shape[0] as f64, t.shape[1] as f64);
                let r = if g.values[x as usize].rows == Rows::Logits { 16.0 } else { 48.0 };
                assert_eq!((g.values[x as usize].cols as f64, g.values[out as usize].cols as f64), (k, n));
                assert_eq!(w.ops, 2.0 * r * n * k);
                assert_eq!(w.bytes, t.nbytes as f64 + r * (k + n) * 4.0);
                assert_eq!(w.engine, Engine::Int8, "the host quantises activations for q4 weights");
            }
            if let Op::Attention { heads, .. } = *op {
                assert_eq!(w.ops, 4.0 * 48.0 * 100.0 * 128.0 * heads as f64);
            }
            if let Op::Embed { .. } = op {
                assert_eq!((w.bytes, w.ops), (48.0 * 256.0 * (2.0 + 4.0), 0.0));
            }
        }
        // With f16 activations (a phone NPU) the same weights still compute W4A8, as the
        // kernels do: the activations are quantised to int8 per row, never multiplied in f16.
        let phone = graph_work(&h, g, 16, 100, 2, 2);
        assert!(g.ops.iter().zip(&phone).all(|(op, w)| !matches!(op, Op::MatMul { .. }) || w.engine == Engine::Int8));
        assert_eq!(matmul_engine(DType::PanelQ8, false, 2), Engine::Int8);
        // Bf16 weights use bf16 products only when the plan says so.
        assert_eq!(matmul_engine(DType::PanelBf16, false, 4), Engine::F32);
        assert_eq!(matmul_engine(DType::PanelBf16, true, 4), Engine::Bf16);
        assert_eq!(matmul_engine(DType::PanelF16, false, 2), Engine::F16);
        assert_eq!(matmul_engine(DType::PanelF16, false, 4), Engine::F32);
    }

    /// Every target's q4 matmuls run at its int8 rate: a GPU's (32-bit integer shader
    /// arithmetic) and a phone NPU's (its int8 matrix unit) alike, never its f16 rate.
    #[test]
    fn q4_matmuls_run_at_each_targets_int8_rate() {
        let h = network(1, 256, 512, 1000, DType::PanelQ4 { group: 64 }, &[64]);
        let g = &h.graphs[0];
        for name in crate::names() {
            let t = crate::by_name(name).unwrap();
            let m = t.accelerator_machine();
            let act = if t.activation_dtype == "f16" { 2 } else { 4 };
            let work = graph_work(&h, g, 16, 64, 2, act);
            for (op, w) in g.ops.iter().zip(&work) {
                if matches!(op, Op::MatMul { .. }) {
                    assert_eq!(w.engine, Engine::Int8, "{name}");
                    let compute = w.ops / t.accelerator.int8_ops;
                    assert_eq!(op_seconds(&m, w), compute.max(w.bytes / t.dram_bytes_per_second), "{name}");
                }
            }
        }
    }

    #[test]
    fn an_8b_q4_pass_on_sm8750_is_plausible_and_monotone() {
        let t = crate::by_name("sm8750").unwrap();
        let buckets = [32, 64, 96, 128, 256];
        let h = network(32, 4096, 12288, 126464, DType::PanelQ4 { group: 64 }, &buckets);
        // Every block's weights rotate through the window each pass (4.2 GB > 2 GiB).
        let staged: u64 = h.tensors.iter().filter(|t| t.dtype.is_panel() && t.name != "head").map(|t| t.nbytes).sum();
        assert!(staged > t.window_bytes);
        let predict = |m: &Machine, g: &Graph| pass_estimate(m, &graph_work(&h, g, g.rows.min(64), 1024, 2, 2), staged, true);
        let m = t.accelerator_machine();
        let times: Vec<f64> = h.graphs.iter().map(|g| predict(&m, g).seconds).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "more rows predicted less time: {times:?}");
        // R = 64: about 1e12 ops of int8 (W4A8) and ~4 GB of weights; tens to hundreds of ms.
        let p = predict(&m, &h.graphs[1]);
        assert!(p.seconds > 0.02 && p.seconds < 2.0, "{p:?}");
        assert!(p.compute_seconds > 0.0 && p.staging_seconds > 0.0 && p.seconds >= p.compute_seconds.max(p.staging_seconds));
        let serial = pass_estimate(&m, &graph_work(&h, &h.graphs[1], 64, 1024, 2, 2), staged, false);
        assert!(serial.seconds >= p.seconds);
        let faster = Machine { bandwidth: 2.0 * m.bandwidth, staging_bytes_per_second: 2.0 * m.staging_bytes_per_second, ..m };
        for g in &h.graphs {
            assert!(predict(&faster, g).seconds <= predict(&m, g).seconds, "{}", g.name);
        }
    }
}
