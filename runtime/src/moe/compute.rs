//! Computing experts over their routed rows, on whichever path: gather the rows, `[gate | up]`
//! GEMM, SwiGLU, down GEMM, and each row's output to its place among the row's picks. The
//! GEMM computes every row alone (a row's sums never depend on which other rows share the
//! call or on the thread count), so an expert's output is the same bits on either path, and
//! [`combine`] adds each row's picks in a fixed order: the layer's output never depends on
//! which path computed what.

use llada_ir::DType;

use super::routing::Pick;
use crate::kernels::cpu::Features;
use crate::kernels::gemm::gemm;
use crate::kernels::swiglu;
use crate::model::Matrix;

/// Working memory of one path: `[rows * d | rows * 2h | rows * h | rows * d]` floats (gathered
/// inputs, `[gate | up]` outputs, hidden, expert outputs) and the GEMM operand scratch.
pub struct Scratch<'a> {
    pub floats: &'a mut [f32],
    pub operand: &'a mut [u8],
}

/// The shapes every expert of a layer shares.
#[derive(Clone, Copy)]
pub struct ExpertShape {
    pub d: usize,
    pub hidden: usize,
    pub format: DType,
    pub bf16_activations: bool,
    pub activation_scales: llada_ir::window::ActivationScales,
    /// The gate's activation (`act(gate) * up`).
    pub activation: llada_ir::GluActivation,
}

impl ExpertShape {
    /// Floats of working memory for `rows` rows.
    pub fn floats(&self, rows: usize) -> usize {
        rows * (2 * self.d + 3 * self.hidden)
    }

    pub fn gate_up<'a>(&self, bytes: &'a [u8]) -> Matrix<'a> {
        Matrix { format: self.format, n: 2 * self.hidden, k: self.d, bytes, bf16_activations: self.bf16_activations, activation_scales: self.activation_scales }
    }

    pub fn down<'a>(&self, bytes: &'a [u8]) -> Matrix<'a> {
        Matrix { format: self.format, n: self.d, k: self.hidden, bytes, bf16_activations: self.bf16_activations, activation_scales: self.activation_scales }
    }
}

/// A layer's per-pick outputs (`[rows * top_k, d]`, row r's pick j at `r * top_k + j`), written
/// by both paths at once, each straight into its place: a pick belongs to one expert, and an
/// expert is computed by one path, so no two writers ever touch the same row.
pub struct RankedOut<'a> {
    ptr: *mut f32,
    len: usize,
    top_k: usize,
    d: usize,
    _buf: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: a view of a buffer the borrow keeps alive and unaliased; writers keep to their own
// picks (the contract of `write`).
unsafe impl Send for RankedOut<'_> {}
unsafe impl Sync for RankedOut<'_> {}

impl<'a> RankedOut<'a> {
    pub fn new(buf: &'a mut [f32], top_k: usize, d: usize) -> RankedOut<'a> {
        RankedOut { ptr: buf.as_mut_ptr(), len: buf.len(), top_k, d, _buf: std::marker::PhantomData }
    }

    /// Writes pick `p`'s output `y` (`d` floats).
    ///
    /// # Safety
    /// No other thread writes or reads pick `p`'s row meanwhile: `p` is a pick of an expert
    /// that only the calling path computes.
    pub unsafe fn write(&self, p: Pick, y: &[f32]) {
        let at = p.ranked_at(self.top_k, self.d);
        assert!(y.len() == self.d && at + self.d <= self.len, "pick ({}, {}) outside the ranked outputs", p.row, p.rank);
        // SAFETY: in bounds (checked above); no other thread uses these floats (the contract).
        unsafe { std::ptr::copy_nonoverlapping(y.as_ptr(), self.ptr.add(at), self.d) }
    }
}

/// One expert's weights: the bytes of its `[gate | up]` and down matrices, of the layer's shape.
#[derive(Clone, Copy)]
pub struct ExpertWeights<'a> {
    pub shape: ExpertShape,
    pub gate_up: &'a [u8],
    pub down: &'a [u8],
}

/// One expert over the rows `picks` of `x` (`[rows, d]`); hands each pick's output row to
/// `write`.
pub fn expert(weights: ExpertWeights, x: &[f32], picks: &[Pick], s: &mut Scratch, pool: &rayon::ThreadPool, features: Features, mut write: impl FnMut(Pick, &[f32])) {
    let shape = weights.shape;
    let (d, h, n) = (shape.d, shape.hidden, picks.len());
    if n == 0 {
        return;
    }
    let (gathered, rest) = s.floats.split_at_mut(n * d);
    let (gu, rest) = rest.split_at_mut(n * 2 * h);
    let (hidden, rest) = rest.split_at_mut(n * h);
    let out = &mut rest[..n * d];
    for (row, p) in gathered.chunks_exact_mut(d).zip(picks) {
        row.copy_from_slice(&x[p.row as usize * d..][..d]);
    }
    gemm(gathered, n, &shape.gate_up(weights.gate_up), gu, s.operand, pool, features);
    match shape.activation {
        llada_ir::GluActivation::Silu => swiglu(features, gu, h, hidden),
        llada_ir::GluActivation::GeluTanh => crate::kernels::gemma::gelu_glu(gu, h, hidden),
    }
    gemm(hidden, n, &shape.down(weights.down), out, s.operand, pool, features);
    for (row, &p) in out.chunks_exact(d).zip(picks) {
        write(p, row);
    }
}

/// The layer's output: for each of the first `rows` rows, the sum over its picks in
/// increasing expert id of probability x expert output (`ranked` holds row r's pick j at
/// `(r * top_k + j) * d`); rows past `rows` (padding) are zero. `order` is scratch (no
/// allocation once it holds `top_k` entries).
pub fn combine(route: &[f32], ranked: &[f32], rows: usize, top_k: usize, d: usize, out: &mut [f32], order: &mut Vec<(u32, usize, f32)>) {
    for (r, o) in out.chunks_exact_mut(d).enumerate() {
        if r >= rows {
            o.fill(0.0);
            continue;
        }
        let (ids, weights) = route[r * 2 * top_k..(r + 1) * 2 * top_k].split_at(top_k);
        order.clear();
        order.extend(ids.iter().zip(weights).enumerate().map(|(j, (&id, &w))| (id as u32, j, w)));
        order.sort_unstable_by_key(|&(id, j, _)| (id, j));
        for (n, &(_, j, w)) in order.iter().enumerate() {
            let y = &ranked[(r * top_k + j) * d..][..d];
            if n == 0 {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o = y * w);
            } else {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combine_adds_picks_in_expert_order_and_zeroes_padding() {
        // One real row of d = 2 with picks (expert 5, p 0.5) then (expert 1, p 0.25); a
        // padding row.
        let route = [5.0, 1.0, 0.5, 0.25, 0.0, 0.0, 0.0, 0.0];
        let ranked = [1.0, 2.0, 4.0, 8.0, 9.0, 9.0, 9.0, 9.0];
        let mut out = [7.0f32; 4];
        combine(&route, &ranked, 1, 2, 2, &mut out, &mut Vec::new());
        assert_eq!(out, [4.0 * 0.25 + 1.0 * 0.5, 8.0 * 0.25 + 2.0 * 0.5, 0.0, 0.0]);
    }

    #[test]
    fn two_threads_write_their_own_picks_into_one_buffer() {
        let (rows, top_k, d) = (5, 3, 4);
        let mut buf = vec![0f32; rows * top_k * d];
        let out = RankedOut::new(&mut buf, top_k, d);
        let pick = |row, rank| Pick { row, rank, weight: 0.0 };
        std::thread::scope(|s| {
            for parity in 0..2u32 {
                let out = &out;
                s.spawn(move || {
                    for row in 0..rows as u32 {
                        for rank in (0..top_k as u32).filter(|r| (row + r) % 2 == parity) {
                            // SAFETY: the two threads write disjoint (row, rank) pairs.
                            unsafe { out.write(pick(row, rank), &[(row * 10 + rank) as f32; 4]) };
                        }
                    }
                });
            }
        });
        for (i, v) in buf.chunks_exact(d).enumerate() {
            assert_eq!(v, [((i / top_k) * 10 + i % top_k) as f32; 4]);
        }
    }
}
