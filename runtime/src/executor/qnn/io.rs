//! The host's side of an NPU pass: the boundary tensors an executable reads (embedded rows,
//! rotary rows, attention mask, head-row indices) built from the run's inputs, and the keys
//! and values it returns stored into the cache. Plain functions over slices, tested here
//! without the library.

use half::f16;
use llada_ir::npu::MASKED;
use llada_ir::{Header, TensorId};

use super::super::RunInputs;
use crate::model::Model;

/// Buffers for the largest graph, allocated once per session.
pub struct Scratch {
    /// The rows' hidden states a context reads, and those it writes for the next one.
    pub hidden: Vec<u16>,
    pub hidden_out: Vec<u16>,
    pub cos: Vec<u16>,
    pub sin: Vec<u16>,
    pub mask: Vec<u16>,
    pub head: Vec<i32>,
    pub new_kv: Vec<u16>,
    pub logits: Vec<u16>,
    embedded: Vec<f32>,
    stored: Vec<bool>,
}

impl Scratch {
    pub fn new(h: &Header) -> Scratch {
        let m = &h.model;
        let rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        let heads = h.graphs.iter().map(|g| g.head_rows).max().unwrap_or(0) as usize;
        let (hd, kvh) = (m.head_dim as usize, m.n_kv_heads as usize);
        Scratch {
            hidden: vec![0; rows * m.d_model as usize],
            hidden_out: vec![0; rows * m.d_model as usize],
            cos: vec![0; rows * hd / 2],
            sin: vec![0; rows * hd / 2],
            mask: vec![0; Scratch::mask_len_for(h, rows)],
            head: vec![0; heads],
            new_kv: vec![0; 2 * m.n_layers as usize * kvh * rows * hd],
            logits: vec![0; heads * m.embedding_size as usize],
            embedded: vec![0.0; rows * m.d_model as usize],
            stored: vec![false; h.plan.kv_capacity as usize],
        }
    }

    fn mask_len_for(h: &Header, rows: usize) -> usize {
        let group = (h.model.n_heads / h.model.n_kv_heads.max(1)) as usize;
        group * rows * (h.plan.kv_capacity as usize + rows)
    }

    pub fn mask_len(&self, h: &Header, rows: usize) -> usize {
        Scratch::mask_len_for(h, rows)
    }

    /// Every row's embedding (padding rows embed their placeholder token), as f16.
    pub fn embed(&mut self, model: &Model, table: TensorId, rows: usize, inp: &RunInputs) {
        let d = model.header.model.d_model as usize;
        let out = &mut self.embedded[..rows * d];
        crate::kernels::embed_rows(model.weights(table), d, &inp.tokens[..rows], out);
        narrow(out, &mut self.hidden[..rows * d]);
    }

    /// The rotary tables' rows at each row's position.
    pub fn rope(&mut self, model: &Model, cos: TensorId, sin: TensorId, rows: usize, inp: &RunInputs) {
        let half = model.header.model.head_dim as usize / 2;
        for (table, out) in [(cos, &mut self.cos), (sin, &mut self.sin)] {
            let t: &[f32] = bytemuck::cast_slice(model.tensor_bytes(table));
            for (r, &p) in inp.positions[..rows].iter().enumerate() {
                narrow(&t[p as usize * half..][..half], &mut out[r * half..][..half]);
            }
        }
    }

    /// The additive attention mask `[group * rows, capacity + rows]` (see [`fill_mask`]).
    pub fn mask(&mut self, h: &Header, rows: usize, inp: &RunInputs) {
        let len = Scratch::mask_len_for(h, rows);
        fill_mask(&mut self.mask[..len], &mut self.stored, h.plan.kv_capacity as usize, rows, inp);
    }

    /// The head rows, padded with row 0.
    pub fn head_index(&mut self, head_rows: usize, inp: &RunInputs) {
        let out = &mut self.head[..head_rows];
        out.fill(0);
        for (o, &r) in out.iter_mut().zip(inp.head_rows) {
            *o = r as i32;
        }
    }
}

fn narrow(from: &[f32], to: &mut [u16]) {
    for (t, &f) in to.iter_mut().zip(from) {
        *t = f16::from_f32(f).to_bits();
    }
}

/// What each query row may attend to, as the host's attention computes it: the cache's
/// first `context` positions, where the rows the run stores (`stored_rows`) replace the
/// cache at their positions with their own keys; a row that does not store sees its own key
/// at its position instead of the cache's (if that position is attended to at all). Columns
/// are the `capacity` cache positions, then the graph's `rows` own keys; 0 where attended,
/// [`MASKED`] elsewhere. Padding rows attend to their own key only (defined, never read).
/// The mask repeats to fill `mask` (a whole number of copies): the query heads of one KV
/// head are stacked as rows, each group member seeing the same.
pub fn fill_mask(mask: &mut [u16], stored: &mut [bool], capacity: usize, rows: usize, inp: &RunInputs) {
    let (open, shut) = (f16::from_f32(0.0).to_bits(), f16::from_f32(MASKED).to_bits());
    let width = capacity + rows;
    let (stored_rows, context) = (inp.stored_rows, inp.context);
    stored.fill(false);
    for &p in &inp.positions[..stored_rows] {
        stored[p as usize] = true;
    }
    let (first, rest) = mask.split_at_mut(rows * width);
    for (r, row) in first.chunks_exact_mut(width).enumerate() {
        row.fill(shut);
        if r >= inp.rows {
            row[capacity + r] = open;
            continue;
        }
        for (j, m) in row[..context].iter_mut().enumerate() {
            if !stored[j] {
                *m = open;
            }
        }
        for (s, &p) in inp.positions[..stored_rows].iter().enumerate() {
            if (p as usize) < context {
                row[capacity + s] = open;
            }
        }
        if r >= stored_rows {
            let p = inp.positions[r] as usize;
            if p < context {
                // Its own key replaces the cache's (or a stored row's) at its position.
                if p < capacity {
                    row[p] = shut;
                }
                for (s, &q) in inp.positions[..stored_rows].iter().enumerate() {
                    if q as usize == p {
                        row[capacity + s] = shut;
                    }
                }
                row[capacity + r] = open;
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
        RunInputs { tokens, positions, stored_rows: stored, context, head_rows: &[], rows }
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
