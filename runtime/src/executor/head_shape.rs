//! An attention op's heads, score scale and window, as every backend reads them from
//! `Op::Attention` (the model's heads, `1 / sqrt(head_dim)`, no window) or
//! `Op::WindowAttention` (its own).

use llada_ir::{ModelConfig, Op, ValueId};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadShape {
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub scale: f32,
    /// Rows see the keys from `window - 1` before their block's first position on.
    pub window: Option<u32>,
}

/// An attention op's operands: `qkv`, `out`, its cache `layer` and its [`HeadShape`].
pub struct AttentionOp {
    pub qkv: ValueId,
    pub out: ValueId,
    pub layer: u32,
    pub shape: HeadShape,
}

impl AttentionOp {
    /// `op`'s operands if it is an attention op of a model `m`.
    pub fn of(op: &Op, m: &ModelConfig) -> Option<AttentionOp> {
        match *op {
            Op::Attention { qkv, out, heads, kv_heads, layer } => {
                let shape = HeadShape { heads, kv_heads, head_dim: m.head_dim, scale: 1.0 / (m.head_dim as f32).sqrt(), window: None };
                Some(AttentionOp { qkv, out, layer, shape })
            }
            Op::WindowAttention { qkv, out, heads, kv_heads, head_dim, layer, scale, window } => Some(AttentionOp { qkv, out, layer, shape: HeadShape { heads, kv_heads, head_dim, scale, window } }),
            _ => None,
        }
    }
}
