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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::{exact_buckets, full_sequence_graph, BlockTensors, NetworkOptions, NetworkTensors};
    use llada_ir::{CompileInfo, DType, Header, ModelConfig, Plan, SpecialTokens, TensorInfo, TokenizerSpec};

    /// LLaDA-8B's graphs over a tensor table with its real shapes (no data needed).
    fn llada_8b_header(buckets: &[u32]) -> (Header, u64) {
        let m = ModelConfig {
            architecture: "llada".into(),
            d_model: 4096,
            n_layers: 32,
            n_heads: 32,
            n_kv_heads: 32,
            head_dim: 128,
            mlp_hidden: 12288,
            vocab_size: 126464,
            embedding_size: 126464,
            max_sequence_length: 4096,
            rope_theta: 500000.0,
            rms_eps: 1e-5,
        };
        let mut tensors = Vec::new();
        let mut offset = 0;
        let mut add = |name: String, dtype: DType, shape: Vec<u64>| {
            let nbytes = dtype.nbytes(&shape).unwrap();
            tensors.push(TensorInfo { name, dtype, shape, offset, nbytes, crc32: 0 });
            offset = align_up(offset + nbytes, 64);
            tensors.len() as u32 - 1
        };
        let (d, f) = (4096u64, 12288u64);
        let q4 = DType::PanelQ4 { group: 64 };
        let embedding = add("wte".into(), DType::Bf16, vec![126464, d]);
        let blocks = (0..32)
            .map(|l| BlockTensors {
                attn_norm: add(format!("{l}.attn_norm"), DType::F32, vec![d]),
                qkv: add(format!("{l}.qkv"), q4, vec![3 * d, d]),
                attn_out: add(format!("{l}.o"), q4, vec![d, d]),
                ff_norm: add(format!("{l}.ff_norm"), DType::F32, vec![d]),
                gate_up: add(format!("{l}.gate_up"), q4, vec![2 * f, d]),
                ff_out: add(format!("{l}.ff_out"), q4, vec![d, f]),
            })
            .collect();
        let final_norm = add("ln_f".into(), DType::F32, vec![d]);
        let head = add("head".into(), q4, vec![126464, d]);
        let rope_cos = add("cos".into(), DType::F32, vec![4096, 64]);
        let rope_sin = add("sin".into(), DType::F32, vec![4096, 64]);
        let net = NetworkTensors { embedding, blocks, final_norm, head, rope_cos, rope_sin };
        let opts = NetworkOptions { input_emb_norm: false, scale_logits: false };
        let graphs: Vec<Graph> = buckets
            .iter()
            .map(|&r| {
                let mut g = full_sequence_graph(&m, &net, opts, r, r.min(256));
                plan(&mut g, 64);
                g
            })
            .collect();
        let header = Header {
            model: m,
            special: SpecialTokens { mask: 126336, bos: Some(126080), eos: Some(126081), eot: Some(126348) },
            tokenizer: TokenizerSpec { tokenizer_json: String::new(), chat_template: None, bos_token: None, eos_token: None, add_bos_token: false },
            tensors,
            segments: Vec::new(),
            plan: Plan { by_rows: (0..graphs.len() as u32).collect(), kv_capacity: 4096, ..Plan::default() },
            graphs,
            compile: CompileInfo::default(),
            extensions: Vec::new(),
        };
        (header, offset)
    }

    #[test]
    fn plans_of_the_llada_8b_graphs_pass_the_verifier_and_share_memory() {
        let buckets = exact_buckets(4096, 16);
        let (h, data_len) = llada_8b_header(&buckets);
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
        let (mut h, data_len) = llada_8b_header(&[64]);
        let g = &mut h.graphs[0];
        // The residual stream and block 0's q|k|v are alive together: overlay them.
        let x = g.values.iter().position(|v| v.name == "x").unwrap();
        let qkv = g.values.iter().position(|v| v.name == "blocks.0.qkv").unwrap();
        g.values[qkv].offset = g.values[x].offset;
        let err = llada_ir::verify::header(&h, data_len).unwrap_err().to_string();
        assert!(err.contains("'x'") && err.contains("blocks.0.qkv"), "{err}");
    }
}
