//! The host's side of an NPU pass: the boundary tensors an executable reads (embedded rows,
//! rotary rows, attention mask, head-row indices) built from the run's inputs, and the keys
//! and values it returns stored into the cache. Plain functions over slices, tested here
//! without the library.

use half::f16;
use llada_ir::npu::{IoKind, IoLayout, NpuTensor, Role, MASKED};
use llada_ir::{Header, TensorId};

use llada_ir::{Graph, Op};

use crate::executor::{value_range, RunInputs};
use crate::model::Model;
use crate::moe::MoeStep;
use crate::window::Window;

/// The I/O allocation past the KV cache (which is the window's own), laid out as the
/// section's [`IoLayout`] says: every boundary tensor of every executable is bound at its
/// descriptor's offset (client buffers here; on a phone the same offsets of one registered
/// buffer). Allocated once per session, for the largest graph.
pub struct Scratch {
    layout: IoLayout,
    /// Where the regions after the KV cache start in the allocation.
    base: u64,
    io: Vec<u64>,
    embedded: Vec<f32>,
    stored: Vec<bool>,
    /// Each windowed attention's window and where its mask starts in the
    /// [`IoKind::WindowMasks`] region, in f16 elements (fixed by the layout: found once).
    window_slots: Vec<(u32, usize)>,
}

impl Scratch {
    pub fn new(h: &Header, layout: IoLayout) -> Scratch {
        let rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        let base = layout.region(IoKind::Hidden).map_or(layout.bytes, |r| r.offset);
        let io = vec![0u64; (layout.bytes - base).div_ceil(8) as usize];
        let region = layout.region(IoKind::WindowMasks).map_or(0, |r| r.offset);
        let window_slots = llada_ir::npu::attention_windows(h)
            .into_iter()
            .map(|w| (w, (layout.offset(h, Role::WindowMask(w), 0).expect("the verified layout (the plan's) has a slot for every window") - region) as usize / 2))
            .collect();
        Scratch { layout, base, io, embedded: vec![0.0; rows * h.model.d_model as usize], stored: vec![false; h.plan.kv_capacity as usize], window_slots }
    }

    /// The whole region `kind` (past the KV cache) as elements of `T`.
    pub fn region<T: bytemuck::Pod>(&mut self, kind: IoKind) -> &mut [T] {
        let r = *self.layout.region(kind).expect("the verifier checked the layout has every region");
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.io);
        bytemuck::cast_slice_mut(&mut bytes[(r.offset - self.base) as usize..][..r.bytes as usize])
    }

    /// Where tensor `t` (not the KV cache's) lives: its descriptor's offset in this
    /// allocation, if its bytes lie inside it.
    pub fn pointer(&mut self, t: &NpuTensor) -> Option<*mut u8> {
        let end = t.offset.checked_add(t.bytes())?;
        if t.offset < self.base || end > self.base + 8 * self.io.len() as u64 {
            return None;
        }
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.io);
        Some(bytes[(t.offset - self.base) as usize..].as_mut_ptr())
    }

    /// The hidden states an executable wrote become the next one's input.
    pub fn hand_on_hidden(&mut self, rows: usize, d: usize) {
        self.copy_region(IoKind::HiddenOut, IoKind::Hidden, rows * d);
    }

    /// The first `elements` f16 elements of region `from` into region `to`.
    pub fn copy_region(&mut self, from: IoKind, to: IoKind, elements: usize) {
        let region = |kind| *self.layout.region(kind).expect("the verifier checked the layout has every region");
        let (from, to) = (region(from), region(to));
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.io);
        let from = (from.offset - self.base) as usize;
        bytes.copy_within(from..from + elements * 2, (to.offset - self.base) as usize);
    }

    /// Every row's embedding (padding rows embed their placeholder token), as f16.
    pub fn embed(&mut self, model: &Model, table: TensorId, rows: usize, inp: &RunInputs) {
        let d = model.header.model.d_model as usize;
        let mut embedded = std::mem::take(&mut self.embedded);
        crate::kernels::embed_rows(model.weights(table), d, &inp.tokens[..rows], &mut embedded[..rows * d]);
        narrow(&embedded[..rows * d], &mut self.region(IoKind::Hidden)[..rows * d]);
        self.embedded = embedded;
    }

    /// The rotary tables' rows at each row's position.
    pub fn rope(&mut self, model: &Model, cos: TensorId, sin: TensorId, rows: usize, inp: &RunInputs) {
        let half = model.header.model.head_dim as usize / 2;
        for (table, kind) in [(cos, IoKind::Cos), (sin, IoKind::Sin)] {
            let t: &[f32] = bytemuck::cast_slice(model.tensor_bytes(table));
            let out = self.region::<u16>(kind);
            for (r, &p) in inp.positions[..rows].iter().enumerate() {
                narrow(&t[p as usize * half..][..half], &mut out[r * half..][..half]);
            }
        }
    }

    /// The additive attention mask `[group * rows, cache_len + rows]` of executables reading
    /// `cache_len` cached positions (see [`fill_mask`]).
    pub fn mask(&mut self, h: &Header, rows: usize, cache_len: usize, inp: &RunInputs) {
        let group = (h.model.n_heads / h.model.n_kv_heads.max(1)) as usize;
        let mut stored = std::mem::take(&mut self.stored);
        fill_mask(&mut self.region(IoKind::Mask)[..group * rows * (cache_len + rows)], &mut stored, cache_len, rows, inp);
        self.stored = stored;
    }

    /// Every windowed attention's mask `[rows, cache_len + rows]`, one per window
    /// ([`llada_ir::npu::attention_windows`]; see [`fill_window_mask`]).
    pub fn window_masks(&mut self, rows: usize, cache_len: usize, inp: &RunInputs) {
        let mut stored = std::mem::take(&mut self.stored);
        for i in 0..self.window_slots.len() {
            let (w, at) = self.window_slots[i];
            let mask = &mut self.region::<u16>(IoKind::WindowMasks)[at..][..rows * (cache_len + rows)];
            fill_window_mask(mask, &mut stored, cache_len, rows, inp, (w > 0).then_some(w as usize));
        }
        self.stored = stored;
    }

    /// The self-conditioning input of the `real` rows, `soft` (`[rows, d]` f32, the
    /// host's result), as f16; padding rows up to `rows` zero.
    pub fn soft_in(&mut self, soft: &[f32], real: usize, rows: usize, d: usize) {
        let (values, padding) = self.region::<u16>(IoKind::SoftIn)[..rows * d].split_at_mut(real * d);
        narrow(&soft[..real * d], values);
        padding.fill(0);
    }

    /// Each row's position (the executables gathering rotary angles by it read them).
    pub fn positions(&mut self, rows: usize, inp: &RunInputs) {
        let out = &mut self.region::<i32>(IoKind::Positions)[..rows];
        for (o, &p) in out.iter_mut().zip(&inp.positions[..rows]) {
            *o = p as i32;
        }
    }

    /// The logit rows, padded with row 0.
    pub fn logit_index(&mut self, logit_rows: usize, inp: &RunInputs) {
        let out = &mut self.region::<i32>(IoKind::LogitIndex)[..logit_rows];
        out.fill(0);
        for (o, &r) in out.iter_mut().zip(inp.logit_rows) {
            *o = r as i32;
        }
    }
}

/// An MoE layer's host ops `ops` of `g` (its router and routed experts) between two
/// executables: the router's logits and the experts' input the executable before wrote are
/// widened into their values in the window, the session's MoE step runs them, and the experts' sum is narrowed into the next
/// executable's input (padding rows zero).
pub fn run_host_ops(
    model: &Model,
    g: &Graph,
    ops: std::ops::Range<usize>,
    inp: &RunInputs,
    scratch: &mut Scratch,
    window: &mut Window,
    moe: &mut MoeStep,
) -> crate::error::Result<()> {
    let parts = window.parts();
    let base = parts.activations_offset;
    let cols = |v: u32| g.values[v as usize].cols as usize;
    let range = |v: u32| {
        let r = value_range(g, &g.values[v as usize], inp.logit_rows.len(), base);
        r.start..r.start + inp.rows * cols(v)
    };
    for op in &g.ops[ops.clone()] {
        let boundary = match *op {
            Op::Route { logits, .. } | Op::RouteSigmoid { logits, .. } | Op::RouteScaled { logits, .. } => Some((IoKind::RouterLogits, logits)),
            Op::MoeExperts { x, .. } => Some((IoKind::ExpertIn, x)),
            _ => None,
        };
        if let Some((kind, v)) = boundary {
            widen(&scratch.region::<u16>(kind)[..inp.rows * cols(v)], &mut parts.activations[range(v)]);
        }
    }
    for (i, op) in ops.clone().zip(&g.ops[ops]) {
        moe.run(model, g, i, inp, parts.activations, base, parts.gemm)?;
        if let Op::MoeExperts { x, out, .. } = *op {
            // The experts' input stays the next executable's (the shared expert's).
            scratch.copy_region(IoKind::ExpertIn, IoKind::SharedIn, g.rows as usize * cols(x));
            let sum = &mut scratch.region::<u16>(IoKind::ExpertOut)[..g.rows as usize * cols(out)];
            let (real, padding) = sum.split_at_mut(inp.rows * cols(out));
            narrow(&parts.activations[range(out)], real);
            padding.fill(0);
        }
    }
    Ok(())
}

fn widen(from: &[u16], to: &mut [f32]) {
    for (t, &f) in to.iter_mut().zip(from) {
        *t = f16::from_bits(f).to_f32();
    }
}

fn narrow(from: &[f32], to: &mut [u16]) {
    for (t, &f) in to.iter_mut().zip(from) {
        *t = f16::from_f32(f).to_bits();
    }
}

/// What each query row may attend to, as the host's attention computes it: the cache's
/// first `context` positions (in a block-causal pass, those before the end of the row's
/// block, [`RunInputs::key_runs`]), where the rows the run stores (`stored_rows`) replace the
/// cache at their positions with their own keys; a row that does not store sees its own key
/// at its position instead of the cache's (if that position is attended to at all). Columns
/// are the cache's first `cache_len` positions (every row's keys among them), then the graph's
/// `rows` own keys; 0 where attended,
/// [`MASKED`] elsewhere. Padding rows attend to their own key only (defined, never read).
/// The mask repeats to fill `mask` (a whole number of copies): the query heads of one KV
/// head are stacked as rows, each group member seeing the same.
pub fn fill_mask(mask: &mut [u16], stored: &mut [bool], cache_len: usize, rows: usize, inp: &RunInputs) {
    let (open, shut) = (f16::from_f32(0.0).to_bits(), f16::from_f32(MASKED).to_bits());
    let width = cache_len + rows;
    let stored_rows = inp.stored_rows;
    stored.fill(false);
    for &p in &inp.positions[..stored_rows] {
        stored[p as usize] = true;
    }
    let (first, rest) = mask.split_at_mut(rows * width);
    for (r, row) in first.chunks_exact_mut(width).enumerate() {
        row.fill(shut);
        if r >= inp.rows {
            row[cache_len + r] = open;
            continue;
        }
        // A block-causal pass: the keys before the end of the row's block only.
        let context = inp.keys_of(r);
        for (j, m) in row[..context].iter_mut().enumerate() {
            if !stored[j] {
                *m = open;
            }
        }
        for (s, &p) in inp.positions[..stored_rows].iter().enumerate() {
            if (p as usize) < context {
                row[cache_len + s] = open;
            }
        }
        if r >= stored_rows {
            let p = inp.positions[r] as usize;
            if p < context {
                // Its own key replaces the cache's (or a stored row's) at its position.
                if p < cache_len {
                    row[p] = shut;
                }
                for (s, &q) in inp.positions[..stored_rows].iter().enumerate() {
                    if q as usize == p {
                        row[cache_len + s] = shut;
                    }
                }
                row[cache_len + r] = open;
            }
        }
    }
    for copy in rest.chunks_exact_mut(rows * width) {
        copy.copy_from_slice(first);
    }
}

/// Stores the new keys (or values) `new` (`[kv_heads, rows, head_dim]`) of the rows at
/// `positions` (the stored rows, in row order) into one layer's cache planes `cache`
/// (`[kv_heads, capacity, head_dim]`).
/// [`fill_mask`]'s mask of one query head (`[rows, cache_len + rows]`), and with a `window`
/// the keys before each row's window shut too: those before `window - 1` positions ahead
/// of its block's start, as the host's windowed attention reads them.
pub fn fill_window_mask(mask: &mut [u16], stored: &mut [bool], cache_len: usize, rows: usize, inp: &RunInputs, window: Option<usize>) {
    fill_mask(mask, stored, cache_len, rows, inp);
    let Some(w) = window else { return };
    let (width, shut) = (cache_len + rows, f16::from_f32(MASKED).to_bits());
    for (r, row) in mask.chunks_exact_mut(width).enumerate().take(inp.rows) {
        let first = inp.block_start(r).saturating_sub(w - 1);
        row[..first.min(cache_len)].fill(shut);
        for (s, &p) in inp.positions[..inp.stored_rows].iter().enumerate() {
            if (p as usize) < first {
                row[cache_len + s] = shut;
            }
        }
    }
}

pub fn store_rows(new: &[u16], cache: &mut [u16], kv_heads: usize, rows: usize, capacity: usize, hd: usize, positions: &[u32]) {
    for k in 0..kv_heads {
        for (r, &p) in positions.iter().enumerate() {
            let from = &new[(k * rows + r) * hd..][..hd];
            cache[(k * capacity + p as usize) * hd..][..hd].copy_from_slice(from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs<'a>(tokens: &'a [u32], positions: &'a [u32], stored: usize, context: usize, rows: usize) -> RunInputs<'a> {
        RunInputs { tokens, positions, stored_rows: stored, context, logit_rows: &[], rows, block_causal: None, soft: None }
    }

    fn open(mask: &[u16], width: usize, r: usize) -> Vec<usize> {
        mask[r * width..][..width].iter().enumerate().filter(|&(_, &m)| m == 0).map(|(j, _)| j).collect()
    }

    /// A pass over positions 2 and 3 of a 4-token sequence whose cache holds all four (a
    /// block recomputed), plus a speculative row at position 5 that does not store, and a
    /// padding row: stored rows replace the cache at 2 and 3; the speculative row sees the
    /// cache 0..6 with its own key at 5; padding sees only itself.
    #[test]
    fn the_mask_is_the_host_attentions_rule() {
        let (capacity, rows) = (8, 4);
        let positions = [2, 3, 5, 0];
        let inp = inputs(&[0; 4], &positions, 2, 6, 3);
        let mut mask = vec![0u16; 2 * rows * (capacity + rows)];
        let mut stored = vec![false; capacity];
        fill_mask(&mut mask, &mut stored, capacity, rows, &inp);
        let width = capacity + rows;
        // Cache 0, 1, 4, 5 (2 and 3 are the stored rows' own, columns 8 and 9).
        assert_eq!(open(&mask, width, 0), vec![0, 1, 4, 5, 8, 9]);
        assert_eq!(open(&mask, width, 1), vec![0, 1, 4, 5, 8, 9]);
        // The speculative row: its own key (column 10) instead of the cache's at 5.
        assert_eq!(open(&mask, width, 2), vec![0, 1, 4, 8, 9, 10]);
        assert_eq!(open(&mask, width, 3), vec![11]);
        // The second query head of the group sees the same.
        assert_eq!(mask[..rows * width], mask[rows * width..]);
    }

    /// A windowed layer (window 3) in a block-causal pass of blocks of 4 over a cache of 6:
    /// the first block's rows (positions 4..8) see keys from 2 (its start 4, less 2), the
    /// second's (8..12) from 6, the stored rows' own keys included, and the window without
    /// one sees what the plain mask does.
    #[test]
    fn a_window_mask_shuts_the_keys_before_each_rows_window() {
        let (cache_len, rows) = (12, 8);
        let positions: Vec<u32> = (4..12).collect();
        let mut inp = inputs(&[0; 8], &positions, 8, 12, 8);
        inp.block_causal = Some(4);
        let width = cache_len + rows;
        let (mut mask, mut plain) = (vec![0u16; rows * width], vec![0u16; rows * width]);
        let mut stored = vec![false; cache_len];
        fill_window_mask(&mut mask, &mut stored, cache_len, rows, &inp, Some(3));
        for r in 0..4 {
            assert_eq!(open(&mask, width, r), vec![2, 3, 12, 13, 14, 15]);
        }
        for r in 4..8 {
            assert_eq!(open(&mask, width, r), vec![14, 15, 16, 17, 18, 19]);
        }
        fill_window_mask(&mut mask, &mut stored, cache_len, rows, &inp, None);
        fill_mask(&mut plain, &mut stored, cache_len, rows, &inp);
        assert_eq!(mask, plain);
    }

    /// Two blocks of 4 in one block-causal pass over a stored prefix of 4: the first block's
    /// rows see the prefix and themselves, the second's the prefix and both blocks.
    #[test]
    fn a_block_causal_pass_masks_each_row_to_the_end_of_its_block() {
        let (capacity, rows) = (12, 8);
        let positions: Vec<u32> = (4..12).collect();
        let mut inp = inputs(&[0; 8], &positions, 8, 12, 8);
        inp.block_causal = Some(4);
        let mut mask = vec![0u16; rows * (capacity + rows)];
        let mut stored = vec![false; capacity];
        fill_mask(&mut mask, &mut stored, capacity, rows, &inp);
        let width = capacity + rows;
        for r in 0..4 {
            assert_eq!(open(&mask, width, r), vec![0, 1, 2, 3, 12, 13, 14, 15]);
        }
        for r in 4..8 {
            assert_eq!(open(&mask, width, r), vec![0, 1, 2, 3, 12, 13, 14, 15, 16, 17, 18, 19]);
        }
    }

    /// An executable reading the cache's first 8 of 12 positions: the mask is that wide; the
    /// pass's 8 keys are open but at 6 and 7, which the two stored rows' own keys (the columns
    /// after the cache's) replace.
    #[test]
    fn the_mask_is_as_wide_as_the_executables_cache_length() {
        let (capacity, cache_len, rows) = (12, 8, 2);
        let positions = [6, 7];
        let inp = inputs(&[0; 2], &positions, 2, 8, 2);
        let mut mask = vec![0u16; rows * (cache_len + rows)];
        let mut stored = vec![false; capacity];
        fill_mask(&mut mask, &mut stored, cache_len, rows, &inp);
        for r in 0..2 {
            assert_eq!(open(&mask, cache_len + rows, r), vec![0, 1, 2, 3, 4, 5, 8, 9]);
        }
    }

    #[test]
    fn a_whole_sequence_pass_sees_only_its_own_rows() {
        let (capacity, rows) = (6, 4);
        let positions = [0, 1, 2, 0];
        let inp = inputs(&[0; 4], &positions, 3, 3, 3);
        let mut mask = vec![0u16; rows * (capacity + rows)];
        let mut stored = vec![false; capacity];
        fill_mask(&mut mask, &mut stored, capacity, rows, &inp);
        for r in 0..3 {
            assert_eq!(open(&mask, capacity + rows, r), vec![6, 7, 8]);
        }
    }

    #[test]
    fn stored_rows_land_at_their_positions_per_head() {
        let (kvh, rows, cap, hd) = (2, 3, 5, 2);
        let new: Vec<u16> = (0..(kvh * rows * hd) as u16).collect();
        let mut cache = vec![0u16; kvh * cap * hd];
        store_rows(&new, &mut cache, kvh, rows, cap, hd, &[4, 1]);
        assert_eq!(&cache[8..10], &[0, 1]);
        assert_eq!(&cache[2..4], &[2, 3]);
        assert_eq!(&cache[10 + 8..10 + 10], &[6, 7]);
        assert_eq!(&cache[10 + 2..10 + 4], &[8, 9]);
    }
}
