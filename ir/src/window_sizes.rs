//! Sizes the compiler plans the window by and the verifier checks it against, computed from a
//! header: the KV cache, the attention scratch, the largest prepared GEMM operand, and each
//! weight segment's lifetime in a graph.

use crate::format::align_up;
use crate::graph::{Graph, Op, Rows, TensorId};
use crate::header::{Header, ModelConfig};
use crate::window::{operand_layout, KvDType};

/// Bytes of the KV cache for `capacity` positions.
pub fn kv_bytes(m: &ModelConfig, capacity: u32, dtype: KvDType) -> Option<u64> {
    (m.n_layers as u64)
        .checked_mul(2 * m.n_kv_heads as u64)?
        .checked_mul(m.head_dim as u64)?
        .checked_mul(capacity as u64)?
        .checked_mul(dtype.bytes())
}

/// Attention scratch: per thread, the scores of four query rows against `keys` positions
/// (floats, rounded up to a whole cache line); and, for a 16-bit KV cache, one layer's keys
/// and values widened to f32 and shared by every thread. Returns (score floats per thread,
/// widened floats, total bytes).
pub fn attention_scratch(m: &ModelConfig, keys: u32, kv_dtype: KvDType, threads: u32) -> (u64, u64, u64) {
    let scores = align_up(4 * keys as u64, 16);
    let widened = if kv_dtype == KvDType::F32 { 0 } else { 2 * m.n_kv_heads as u64 * m.head_dim as u64 * keys as u64 };
    (scores, widened, (scores * threads as u64 + widened) * 4)
}

/// Bytes of the largest prepared GEMM operand any graph of `h` needs (its ops' references
/// already verified).
pub fn largest_gemm_operand(h: &Header) -> u64 {
    let mut largest = 0;
    for g in &h.graphs {
        for op in &g.ops {
            let operand = |t: TensorId, rows: u32| {
                let t = &h.tensors[t as usize];
                operand_layout(t.dtype, h.plan.bf16_activations, h.plan.activation_scales, rows as usize, t.shape[1] as usize).bytes as u64
            };
            match *op {
                Op::MatMul { x, weight, .. } => {
                    let rows = if g.values[x as usize].rows == Rows::Tokens { g.rows } else { g.logit_rows };
                    largest = largest.max(operand(weight, rows));
                }
                // Every expert has the same shapes: the first one's [gate | up] and down
                // operands, over every row (all of a pass's rows may pick one expert).
                Op::MoeExperts { first, .. } => largest = largest.max(operand(first, g.rows)).max(operand(first + 1, g.rows)),
                _ => {}
            }
        }
    }
    largest
}

/// For each segment of `h` (by index), the first and last op of `g` that read one of its
/// tensors, or `None` if no op does: a segment's lifetime in the graph.
pub fn segment_spans(h: &Header, g: &Graph) -> Vec<Option<(usize, usize)>> {
    let mut spans = vec![None; h.segments.len()];
    for (i, op) in g.ops.iter().enumerate() {
        for t in op.tensors() {
            if let Some(span) = h.segment_of(t).and_then(|s| spans.get_mut(s as usize)) {
                *span = Some(span.map_or((i, i), |(first, _)| (first, i)));
            }
        }
    }
    spans
}
