//! The accelerator window: one bounded address range holding every byte a graph touches.
//!
//! ```text
//! 0 ─ KV cache ─ activations ─ kernel scratch ─ resident weight segments ─ slots ─ bytes
//! ```
//! The compiler places each region; the runtime allocates the window once and applies the
//! plan. Weight segments either stay resident for the whole session or rotate through the
//! slots: rotating segment `i` (in the order every pass uses them) always stages into slot
//! `i % slots`, so every graph and every pass assigns slots the same way and a steady state
//! remaps nothing. The embedding is gathered row by row by the CPU from the artifact
//! (as phone deployments feed embeddings, not token ids, to the accelerator), so its segment
//! never enters the window.
//!
//! Sizes computed from a whole header (the KV cache, the attention scratch, the largest GEMM
//! operand, segments' lifetimes) are in `window_sizes`.

use serde::{Deserialize, Serialize};

use crate::graph::{Graph, Op, Rows};
use crate::packing::DType;

/// Element type of the KV cache.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDType {
    F32,
    F16,
    Bf16,
}

impl KvDType {
    pub fn bytes(self) -> u64 {
        match self {
            KvDType::F32 => 4,
            KvDType::F16 | KvDType::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDType::F32 => "f32",
            KvDType::F16 => "f16",
            KvDType::Bf16 => "bf16",
        }
    }

    pub fn parse(name: &str) -> Option<KvDType> {
        match name {
            "f32" => Some(KvDType::F32),
            "f16" => Some(KvDType::F16),
            "bf16" => Some(KvDType::Bf16),
            _ => None,
        }
    }
}

/// A named run of window bytes, alive for the whole session.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Region {
    pub name: String,
    pub offset: u64,
    pub bytes: u64,
}

impl Region {
    pub fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.bytes)
    }
}

/// A weight segment that stays in the window for the whole session.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ResidentSegment {
    /// Index into `Header::segments`.
    pub segment: u32,
    pub offset: u64,
}

/// Kernel scratch in the window: the prepared (padded, converted or quantised) GEMM operand,
/// and per thread the attention scores plus, for a 16-bit KV cache, one layer's keys and
/// values widened to f32.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Scratch {
    pub gemm_operand: Region,
    pub attention: Region,
    /// Threads the attention scratch is sized for (a session uses at most this many).
    pub threads: u32,
}

/// Every byte the accelerator touches, placed.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct WindowPlan {
    /// Size of the window (the target's, or `--window-bytes`); every region lies below it.
    pub bytes: u64,
    /// `n_layers` layers of `2 * n_kv_heads` head planes of `[kv_capacity, head_dim]`
    /// (key heads, then value heads), elements of `kv_dtype`.
    pub kv: Region,
    pub kv_dtype: KvDType,
    /// Every graph's values lie here (one graph runs at a time).
    pub activations: Region,
    pub scratch: Scratch,
    pub resident: Vec<ResidentSegment>,
    /// Equal-sized slots the rotating segments are staged into.
    pub slots: Vec<Region>,
    /// Segments staged every pass, in the order every graph first uses them.
    pub rotating: Vec<u32>,
    /// Segments the CPU reads from the artifact itself (the embedding gather).
    pub host: Vec<u32>,
    /// The experts of a mixture-of-experts model and their cache in the window.
    pub experts: ExpertPlan,
}

/// Experts are the one weight a pass cannot name ahead of time: the router picks them. Each
/// expert (its `[gate | up]` and down matrices) is a segment of its own; every MoE layer has
/// a pool of equal slots in the window that the runtime fills as an expert cache, and an
/// expert not in its layer's pool is computed by the CPU path from the artifact or staged
/// into a slot first. Which, is the runtime's expert strategy; the plan fixes only the slots
/// and the cost figures the strategy weighs.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct ExpertPlan {
    /// Experts per layer (the model's).
    pub per_layer: u32,
    /// Expert segments, layer-major: expert e of layer l is `segments[l * per_layer + e]`.
    pub segments: Vec<u32>,
    /// Slots of each layer's pool; `slot_bytes` each, layer l's pool starting at
    /// `region.offset + l * slots_per_layer * slot_bytes`.
    pub slots_per_layer: u32,
    pub slot_bytes: u64,
    /// Every layer's pool, one after another.
    pub region: Region,
    /// Predicted costs of one expert on each path, for the runtime's split.
    pub costs: ExpertCosts,
}

/// What one expert costs on a path that computes it over `n` token rows:
/// `max(weight_seconds, n * row_seconds)` (reading its weights, or its arithmetic).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct PathCost {
    pub weight_seconds: f64,
    pub row_seconds: f64,
}

impl PathCost {
    pub fn seconds(&self, rows: usize) -> f64 {
        self.weight_seconds.max(rows as f64 * self.row_seconds)
    }
}

/// The cost model's figures for experts, from the target the artifact was compiled for.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Default)]
pub struct ExpertCosts {
    pub accelerator: PathCost,
    pub cpu: PathCost,
    /// Copying one expert into a slot.
    pub stage_seconds: f64,
}

impl Default for WindowPlan {
    fn default() -> Self {
        WindowPlan {
            bytes: 0,
            kv: Region::default(),
            kv_dtype: KvDType::F32,
            activations: Region::default(),
            scratch: Scratch::default(),
            resident: Vec::new(),
            slots: Vec::new(),
            rotating: Vec::new(),
            host: Vec::new(),
            experts: ExpertPlan::default(),
        }
    }
}

/// The coarsest alignment a plan may round its regions and values to: a page (a target
/// aligns to its accelerator's mapping granule, 64 bytes to 4 KiB). The verifier lets every
/// size it computes a region needs be rounded up to it, and no more.
pub const MAX_REGION_ALIGN: u64 = 4096;

/// Rows per register tile of the host GEMM; prepared operands are padded to a multiple.
pub const OPERAND_TILE_ROWS: usize = 4;
/// Bytes added to every prepared operand row (rows a power of two apart would all fall in the
/// same L1 set, 4 KiB aliasing).
pub const OPERAND_ROW_PAD_BYTES: usize = 64;

/// What a GEMM's activations become before the products.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Operand {
    F32,
    Bf16,
    Int8,
}

/// The operand kind of a weight format (`bf16_activations`: the plan's choice for bf16 weights).
pub fn operand_of(format: DType, bf16_activations: bool) -> Operand {
    match format {
        DType::PanelBf16 if bf16_activations => Operand::Bf16,
        DType::PanelQ8 | DType::PanelQ4 { .. } => Operand::Int8,
        _ => Operand::F32,
    }
}

/// How int8 activations are scaled: one scale per row of a GEMM's input (its largest
/// magnitude maps to 127), or one per block of [`ACTIVATION_BLOCK`] inputs of a row, as
/// llama.cpp's Q8_0 quantises them: a few large channels (trained LLMs have them) then cost
/// precision in their own blocks only.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum ActivationScales {
    #[default]
    PerRow,
    PerBlock,
}

/// Inputs per activation scale with [`ActivationScales::PerBlock`].
pub const ACTIVATION_BLOCK: usize = 32;

impl ActivationScales {
    pub fn name(self) -> &'static str {
        match self {
            ActivationScales::PerRow => "row",
            ActivationScales::PerBlock => "block",
        }
    }

    pub fn parse(s: &str) -> Option<ActivationScales> {
        match s {
            "row" => Some(ActivationScales::PerRow),
            "block" => Some(ActivationScales::PerBlock),
            _ => None,
        }
    }

    /// Why a weight format of `k` inputs per row cannot take these scales, if it cannot:
    /// blocks need a `k` of whole blocks and, for q4, groups of whole blocks (each block's
    /// sum then has one weight scale).
    pub fn unsupported(self, format: DType, k: usize) -> Option<String> {
        if self == ActivationScales::PerRow || operand_of(format, false) != Operand::Int8 {
            return None;
        }
        match format {
            DType::PanelQ4 { group } if group as usize % ACTIVATION_BLOCK != 0 => Some(format!("per-block activation scales need q4 groups of a multiple of {ACTIVATION_BLOCK} inputs, not {group}")),
            _ if k % ACTIVATION_BLOCK != 0 => Some(format!("per-block activation scales need rows of whole {ACTIVATION_BLOCK}-input blocks; this matrix has {k} inputs")),
            _ => None,
        }
    }
}

/// Layout of a prepared operand of `rows` rows of `k` inputs: elements per row (`stride`),
/// rows after padding, sums per row (q4 groups, or activation blocks; int8 only), scales per
/// row, and byte offsets of its parts inside the scratch region: the values, the scales and
/// the sums.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OperandLayout {
    pub operand: Operand,
    pub stride: usize,
    pub padded_rows: usize,
    pub groups: usize,
    /// Activation scales per row: 1, or one per block.
    pub scales_per_row: usize,
    pub scales_at: usize,
    pub sums_at: usize,
    pub bytes: usize,
}

pub fn operand_layout(format: DType, bf16_activations: bool, scales: ActivationScales, rows: usize, k: usize) -> OperandLayout {
    let operand = operand_of(format, bf16_activations);
    let blocks = scales == ActivationScales::PerBlock && operand == Operand::Int8;
    let padded_rows = rows.div_ceil(OPERAND_TILE_ROWS) * OPERAND_TILE_ROWS;
    let (stride, elem) = match operand {
        Operand::F32 => (k + OPERAND_ROW_PAD_BYTES / 4, 4),
        Operand::Bf16 => (k.div_ceil(2) * 2 + OPERAND_ROW_PAD_BYTES / 2, 2),
        Operand::Int8 => (k.div_ceil(8) * 8 + OPERAND_ROW_PAD_BYTES, 1),
    };
    let groups = match format {
        _ if blocks => k.div_ceil(ACTIVATION_BLOCK),
        DType::PanelQ4 { group } if group > 0 => k.div_ceil(group as usize),
        _ => 1,
    };
    let scales_per_row = if blocks { groups } else { 1 };
    let a64 = |x: usize| x.div_ceil(64) * 64;
    let scales_at = a64(padded_rows * stride * elem);
    let (sums_at, bytes) = if operand == Operand::Int8 {
        let sums_at = a64(scales_at + padded_rows * scales_per_row * 4);
        (sums_at, a64(sums_at + padded_rows * groups * 4))
    } else {
        (scales_at, scales_at)
    };
    OperandLayout { operand, stride, padded_rows, groups, scales_per_row, scales_at, sums_at, bytes }
}

/// Bytes a value occupies in the activation region at its graph's most rows.
pub fn value_bytes(g: &Graph, v: u32) -> u64 {
    let v = &g.values[v as usize];
    let rows = match v.rows {
        Rows::Tokens => g.rows,
        Rows::Logits => g.logit_rows,
    };
    rows as u64 * v.cols as u64 * 4
}

/// The window bytes `[start, end)` that `op`'s values occupy together (None for an op with
/// none): what an accelerator binding one range per op must reach.
pub fn op_values_span(g: &Graph, op: &Op) -> Option<(u64, u64)> {
    op.inputs().into_iter().chain(op.outputs()).map(|v| (g.values[v as usize].offset, g.values[v as usize].offset + value_bytes(g, v))).reduce(|(s, e), (a, b)| (s.min(a), e.max(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_block_scales_say_which_weights_cannot_take_them() {
        let block = ActivationScales::PerBlock;
        assert_eq!(block.unsupported(DType::PanelQ8, 64), None);
        assert_eq!(block.unsupported(DType::PanelQ4 { group: 128 }, 256), None);
        assert!(block.unsupported(DType::PanelQ4 { group: 24 }, 96).unwrap().contains("not 24"));
        assert!(block.unsupported(DType::PanelQ8, 40).unwrap().contains("40 inputs"));
        // Float weights have no int8 activations to scale; per row is always fine.
        assert_eq!(block.unsupported(DType::PanelF32, 40), None);
        assert_eq!(ActivationScales::PerRow.unsupported(DType::PanelQ4 { group: 24 }, 96), None);
        // Per block: one scale and one sum per block of each row.
        let l = operand_layout(DType::PanelQ4 { group: 128 }, false, block, 5, 256);
        assert_eq!((l.groups, l.scales_per_row, l.padded_rows), (8, 8, 8));
        assert!(l.sums_at >= l.scales_at + 8 * 8 * 4 && l.bytes >= l.sums_at + 8 * 8 * 4);
        let r = operand_layout(DType::PanelQ4 { group: 128 }, false, ActivationScales::PerRow, 5, 256);
        assert_eq!((r.groups, r.scales_per_row), (2, 1));
    }
}
