//! The mixture-of-experts step of a pass: the routers and the experts, run on the CPU whatever
//! backend runs the dense ops. The session owns it (its expert runtime, when the model has
//! one, and the routing scratch) and lends it to every pass; a backend reaches it through
//! [`MoeStep::run`] at the ops the plan gives the CPU, on the rows it computed.

use llada_ir::{Graph, Op};

use crate::error::Result;
use crate::executor::{value_range, RunInputs};
use crate::kernels::cpu::Features;
use crate::model::Model;
use crate::operands::{operands, operands_many};
use crate::pool::Pool;

use super::{routing, Experts, MoeOperands, OpScratch};

pub struct MoeStep {
    /// The expert runtime (slots in the window, the CPU path beside it); without one every
    /// expert runs here from the artifact's mapping (the CPU side path, a dense model).
    experts: Option<Experts>,
    scratch: OpScratch,
    pool: Pool,
    features: Features,
}

impl MoeStep {
    /// The step of a session on `model`: `experts` its expert runtime, if any; the routers
    /// and the experts without one run on `pool` with kernel paths `features`.
    pub fn new(model: &Model, experts: Option<Experts>, pool: Pool, features: Features) -> MoeStep {
        MoeStep { experts, scratch: OpScratch::new(&model.header), pool, features }
    }

    pub fn experts(&self) -> Option<&Experts> {
        self.experts.as_ref()
    }

    /// Replaces the expert runtime (after a failed pass: the old one is dropped first, its
    /// staging thread joined, so a failed setup leaves none behind).
    pub fn set_experts(&mut self, make: impl FnOnce() -> Result<Option<Experts>>) -> Result<()> {
        self.experts = None;
        self.experts = make()?;
        Ok(())
    }

    /// Runs op `op` of graph `g` (a router or an experts op) over the pass's real rows, in
    /// `activations` (the window's activation region, which starts at window byte
    /// `activations_offset`), with `gemm` as the operand scratch of experts run here.
    pub fn run(&mut self, model: &Model, g: &Graph, op: usize, inp: &RunInputs, activations: &mut [f32], activations_offset: u64, gemm: &mut [u8]) -> Result<()> {
        let m = &model.header.model;
        let cols = |v: u32| g.values[v as usize].cols as usize;
        let range = |v: u32| {
            let r = value_range(g, &g.values[v as usize], inp.logit_rows.len(), activations_offset);
            r.start..r.start + inp.rows * cols(v)
        };
        let rows = inp.rows;
        let scratch = &mut self.scratch;
        match g.ops[op] {
            Op::Route { logits, top_k, out } => {
                let (e, k) = (cols(logits), top_k as usize);
                let ([l], o) = operands(activations, [range(logits)], range(out));
                // Padding rows route to expert 0 with weight 0: defined, and never read.
                o.fill(0.0);
                for (l, o) in l.chunks_exact(e).zip(o.chunks_exact_mut(2 * k)).take(rows) {
                    routing::route_row(l, k, o, &mut scratch.route);
                }
            }
            Op::RouteSigmoid { logits, bias, top_k, groups, top_groups, normalize, scale, out } => {
                let (e, k) = (cols(logits), top_k as usize);
                let ([l], o) = operands(activations, [range(logits)], range(out));
                let bias: &[f32] = bytemuck::cast_slice(model.tensor_bytes(bias));
                let rule = routing::SigmoidRule { bias, groups: groups as usize, top_groups: top_groups as usize, normalize, scale };
                o.fill(0.0);
                for (l, o) in l.chunks_exact(e).zip(o.chunks_exact_mut(2 * k)).take(rows) {
                    routing::route_sigmoid_row(l, &rule, k, o, &mut scratch.route);
                }
            }
            Op::RouteScaled { logits, expert_scale, top_k, out } => {
                let (e, k) = (cols(logits), top_k as usize);
                let ([l], o) = operands(activations, [range(logits)], range(out));
                let expert_scale: &[f32] = bytemuck::cast_slice(model.tensor_bytes(expert_scale));
                o.fill(0.0);
                for (l, o) in l.chunks_exact(e).zip(o.chunks_exact_mut(2 * k)).take(rows) {
                    routing::route_scaled_row(l, expert_scale, k, o, &mut scratch.route);
                }
            }
            Op::MoeExperts { x, route, out, layer, first, experts: n, ranked, work } => {
                let ([xs, rs], [o, rk, wk]) = operands_many(activations, [range(x), range(route)], [range(out), range(ranked), range(work)]);
                // The verifier checked that the layer has experts.
                let layer = m.moe_layer_index(layer).unwrap_or(0);
                let op = MoeOperands { layer, first, x: xs, route: rs, out: o, ranked: rk, work: wk, operand: gemm, rows };
                match self.experts.as_mut() {
                    Some(e) => e.run(op, &self.pool, self.features)?,
                    None => super::run_local(model, op, n as usize, m.moe.map_or(1, |m| m.top_k) as usize, scratch, &self.pool, self.features)?,
                }
            }
            _ => unreachable!("only the mixture-of-experts ops are run here"),
        }
        Ok(())
    }
}
