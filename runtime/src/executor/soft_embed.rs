//! DiffusionGemma's self-conditioning input (`Op::SoftEmbed`) on the CPU, for every backend:
//! its table is the embedding, which the plan leaves in the artifact (a host segment, as the
//! embedding gather's), so the op runs where the artifact is mapped, on the window's rows.

use llada_ir::{Graph, TensorId, ValueId};
use rayon::prelude::*;

use super::{value_range, RunInputs};
use crate::kernels::{self, cpu::Features};
use crate::model::Model;
use crate::operands::operands;
use crate::pool::Pool;

/// The op's operands: the soft input `x` (`[tokens, vocab]`, written here from the run's
/// previous logits, then turned into probabilities in place), the embedding `table`, the
/// `scale` and the output `out`.
pub struct SoftEmbed {
    pub x: ValueId,
    pub table: TensorId,
    pub scale: f32,
    pub out: ValueId,
}

impl SoftEmbed {
    /// Runs the op on the real rows of `inp` in `win` (the activation region, which starts at
    /// window byte `base`): `out = softmax(soft) @ table * scale`, or 0 on a canvas's first
    /// step (no previous logits, the reference's zero signal).
    pub fn run(&self, model: &Model, g: &Graph, inp: &RunInputs<'_>, win: &mut [f32], base: u64, pool: &Pool, features: Features) {
        let range = |v: ValueId| {
            let value = &g.values[v as usize];
            let r = value_range(g, value, inp.logit_rows.len(), base);
            r.start..r.start + inp.rows * value.cols as usize
        };
        let (xr, or) = (range(self.x), range(self.out));
        let Some(soft) = inp.soft else {
            win[or].fill(0.0);
            return;
        };
        let cols = g.values[self.x as usize].cols as usize;
        let xs = &mut win[xr.clone()];
        xs.copy_from_slice(&soft[..xs.len()]);
        pool.install(|| xs.par_chunks_mut(cols).for_each(|row| kernels::gemma::softmax_in_place(features, row)));
        let ([xs], o) = operands(win, [xr], or);
        let width = g.values[self.out as usize].cols as usize;
        pool.install(|| kernels::gemma::soft_embed(xs, inp.rows, model.weights(self.table), width, self.scale, o));
    }
}
