//! Test fixtures: LLaDA-8B's graphs and window plan over a tensor table with its real shapes
//! and segments (no data needed), as `lladac compile` would lay them out.

use llada_ir::{align_up, CompileInfo, DType, Graph, Header, KvDType, ModelConfig, Plan, Segment, SpecialTokens, TensorInfo, TokenizerSpec, SEGMENT_ALIGN};

use crate::lower::{full_sequence_graph, BlockTensors, Ffn, NetworkOptions, NetworkTensors};
use crate::window::{self, WindowOptions};

pub fn llada_8b_model() -> ModelConfig {
    ModelConfig {
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
        qk_norm: false,
        moe: None,
    }
}

/// The q4 LLaDA-8B header with graphs of `buckets` rows (the largest is the KV capacity),
/// planned for `target` (its window unless `window_bytes`), and the data section's length.
pub fn llada_8b_header(buckets: &[u32], target: &str, window_bytes: Option<u64>) -> (Header, u64) {
    let t = llada_targets::by_name(target).unwrap();
    let m = llada_8b_model();
    let capacity = *buckets.iter().max().unwrap();
    struct Table {
        tensors: Vec<TensorInfo>,
        segments: Vec<Segment>,
        offset: u64,
        seg_start: u64,
    }
    impl Table {
        fn add(&mut self, name: String, dtype: DType, shape: Vec<u64>) -> u32 {
            let nbytes = dtype.nbytes(&shape).unwrap();
            self.tensors.push(TensorInfo { name, dtype, shape, offset: self.offset, nbytes, crc32: 0 });
            self.offset = align_up(self.offset + nbytes, 64);
            self.tensors.len() as u32 - 1
        }
        /// Closes the segment opened at the last end; the next starts on a page.
        fn end_segment(&mut self, name: &str) {
            let end = self.tensors.last().map(|t| t.offset + t.nbytes).unwrap();
            self.segments.push(Segment { name: name.into(), offset: self.seg_start, nbytes: end - self.seg_start });
            self.seg_start = align_up(end, SEGMENT_ALIGN);
            self.offset = self.seg_start;
        }
    }
    let mut t_ = Table { tensors: Vec::new(), segments: Vec::new(), offset: 0, seg_start: 0 };
    let (d, f) = (4096u64, 12288u64);
    let q4 = DType::PanelQ4 { group: 128 };
    let embedding = t_.add("wte".into(), DType::Bf16, vec![126464, d]);
    t_.end_segment("embedding");
    let mut blocks = Vec::new();
    for l in 0..32 {
        let attn_norm = t_.add(format!("{l}.attn_norm"), DType::F32, vec![d]);
        let qkv = t_.add(format!("{l}.qkv"), q4, vec![3 * d, d]);
        let attn_out = t_.add(format!("{l}.o"), q4, vec![d, d]);
        t_.end_segment(&format!("blocks.{l}.attn"));
        let ff_norm = t_.add(format!("{l}.ff_norm"), DType::F32, vec![d]);
        let gate_up = t_.add(format!("{l}.gate_up"), q4, vec![2 * f, d]);
        let ff_out = t_.add(format!("{l}.ff_out"), q4, vec![d, f]);
        t_.end_segment(&format!("blocks.{l}.ffn"));
        blocks.push(BlockTensors { attn_norm, qkv, qkv_bias: None, qk_norm: None, attn_out, ff_norm, ffn: Ffn::Dense { gate_up, ff_out, hidden: f as u32 } });
    }
    let final_norm = t_.add("ln_f".into(), DType::F32, vec![d]);
    let lm_head = t_.add("head".into(), q4, vec![126464, d]);
    t_.end_segment("head");
    let rope_cos = t_.add("cos".into(), DType::F32, vec![capacity as u64, 64]);
    let rope_sin = t_.add("sin".into(), DType::F32, vec![capacity as u64, 64]);
    t_.end_segment("rope");
    let Table { tensors, segments, seg_start, .. } = t_;
    let data_len = seg_start;
    let net = NetworkTensors { embedding, blocks, final_norm, lm_head, rope_cos, rope_sin };
    let opts = NetworkOptions { input_emb_norm: false, scale_logits: false };
    let graphs: Vec<Graph> = buckets
        .iter()
        .map(|&r| {
            let mut g = full_sequence_graph(&m, &net, opts, r, r.min(256));
            crate::memory::plan(&mut g, t.window_align);
            g
        })
        .collect();
    let mut header = Header {
        model: m,
        special: SpecialTokens { mask: 126336, bos: Some(126080), eos: Some(126081), eot: Some(126348) },
        tokenizer: TokenizerSpec { tokenizer_json: String::new(), chat_template: None, bos_token: None, eos_token: None, add_bos_token: false },
        tensors,
        segments,
        plan: Plan { by_rows: (0..graphs.len() as u32).collect(), kv_capacity: capacity, ..Plan::default() },
        graphs,
        compile: CompileInfo { target: target.into(), ..CompileInfo::default() },
        extensions: Vec::new(),
    };
    let opts = WindowOptions {
        bytes: window_bytes.unwrap_or(t.window_bytes),
        align: t.window_align,
        kv_dtype: KvDType::parse(&t.kv_dtype).unwrap(),
        threads: t.max_threads,
        host_segment: 0,
        expert_segments: Vec::new(),
        expert_costs: Default::default(),
        window_source: "test".into(),
        can_grow: true,
        max_expert_bytes: None,
    };
    window::plan(&mut header, &opts).expect("the 8B plan fits");
    crate::latency::record(&mut header, &t);
    (header, data_len)
}
