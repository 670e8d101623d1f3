//! The router's choice: top-k experts per row from the softmax of its logits, and that
//! choice regrouped per expert (the rows each expert computes, with each row's probability).

use crate::error::{Error, Result};
use crate::kernels;
use crate::topk::topk_in;

/// What [`route_row`] works in: a row's probabilities and the top-k queue, sized once for a
/// layer's experts.
#[derive(Debug, Default)]
pub struct RouteScratch {
    probs: Vec<f32>,
    queue: Vec<(f32, usize)>,
}

impl RouteScratch {
    /// Scratch for rows of `experts` logits (no allocation routing them).
    pub fn new(experts: usize) -> RouteScratch {
        RouteScratch { probs: Vec::with_capacity(experts), queue: Vec::with_capacity(experts) }
    }
}

/// `Route` for one row: `softmax(logits)` in f32 (max subtracted, as PyTorch computes it),
/// then the `top_k` largest as `torch.topk` orders them; writes `top_k` ids (as f32) then
/// their probabilities into `out`.
pub fn route_row(logits: &[f32], top_k: usize, out: &mut [f32], s: &mut RouteScratch) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    s.probs.clear();
    s.probs.extend(logits.iter().map(|&v| kernels::exp(v - max)));
    let sum: f32 = s.probs.iter().sum();
    for p in &mut s.probs {
        *p /= sum;
    }
    let (ids, weights) = out.split_at_mut(top_k);
    let probs = &s.probs;
    for ((id, w), e) in ids.iter_mut().zip(weights).zip(topk_in(probs, top_k, &mut s.queue)) {
        *id = e as f32;
        *w = probs[e];
    }
}

/// `RouteScaled` for one row (DiffusionGemma's router): [`route_row`]'s picks, their
/// probabilities divided by their sum, then each times its expert's `expert_scale`.
pub fn route_scaled_row(logits: &[f32], expert_scale: &[f32], top_k: usize, out: &mut [f32], s: &mut RouteScratch) {
    route_row(logits, top_k, out, s);
    let (ids, weights) = out.split_at_mut(top_k);
    let sum: f32 = weights.iter().sum();
    for (w, &id) in weights.iter_mut().zip(ids.iter()) {
        *w = *w / sum * expert_scale[id as usize];
    }
}

/// LLaDA 2.x's routing rule (the `RouteSigmoid` op's operands besides the logits).
pub struct SigmoidRule<'a> {
    /// The learned expert bias, added to the scores for the choice only.
    pub bias: &'a [f32],
    pub groups: usize,
    pub top_groups: usize,
    pub normalize: bool,
    pub scale: f32,
}

/// `RouteSigmoid` for one row (see `llada_ir::Op::RouteSigmoid`): as the published
/// `group_limited_topk` computes it in float32, the groups scored by their two best biased
/// scores, the `top_k` picks in `torch.topk`'s order; writes `top_k` ids then their weights.
pub fn route_sigmoid_row(logits: &[f32], rule: &SigmoidRule, top_k: usize, out: &mut [f32], s: &mut RouteScratch) {
    let experts = logits.len();
    let per_group = experts / rule.groups;
    // `probs` holds the unbiased scores, then the biased ones after them.
    s.probs.clear();
    s.probs.extend(logits.iter().map(|&v| 1.0 / (1.0 + kernels::exp(-v))));
    for e in 0..experts {
        s.probs.push(s.probs[e] + rule.bias[e]);
    }
    // Group scores: the sum of each group's two largest biased scores.
    let mut group_scores = [0f32; MAX_GROUPS];
    for (g, score) in group_scores.iter_mut().enumerate().take(rule.groups) {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in &s.probs[experts + g * per_group..][..per_group] {
            if v > a {
                b = a;
                a = v;
            } else if v > b {
                b = v;
            }
        }
        *score = a + b;
    }
    // The kept groups' biased scores, `-inf` elsewhere (`masked_fill`), ranked.
    let mut kept = [false; MAX_GROUPS];
    for g in topk_in(&group_scores[..rule.groups], rule.top_groups, &mut s.queue) {
        kept[g] = true;
    }
    for e in 0..experts {
        if !kept[e / per_group] {
            s.probs[experts + e] = f32::NEG_INFINITY;
        }
    }
    let (ids, weights) = out.split_at_mut(top_k);
    let (scores, biased) = s.probs.split_at(experts);
    for (id, e) in ids.iter_mut().zip(topk_in(biased, top_k, &mut s.queue)) {
        *id = e as f32;
    }
    for (w, id) in weights.iter_mut().zip(ids.iter()) {
        *w = scores[*id as usize];
    }
    if rule.normalize {
        // `scores / (scores.sum(-1) + 1e-20)`: PyTorch sums the k values left to right.
        let sum = weights.iter().fold(0f32, |a, &w| a + w) + 1e-20;
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    weights.iter_mut().for_each(|w| *w *= rule.scale);
}

/// The most router groups the verifier lets `RouteSigmoid` have.
const MAX_GROUPS: usize = llada_ir::verify::MAX_ROUTER_GROUPS as usize;

/// One row's use of one expert: the row, which of its picks this is (where its output goes in
/// `ranked`), and the probability it is weighted by.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pick {
    pub row: u32,
    pub rank: u32,
    pub weight: f32,
}

impl Pick {
    /// Where its output row starts in `ranked` (`[rows * top_k, d]` floats).
    pub fn ranked_at(&self, top_k: usize, d: usize) -> usize {
        (self.row as usize * top_k + self.rank as usize) * d
    }
}

/// A layer's routing of one pass, per expert: every pick grouped by expert (a counting sort),
/// in buffers sized once for the largest graph.
#[derive(Debug, Default)]
pub struct Routing {
    /// Expert e's picks are `picks[starts[e]..starts[e + 1]]`, in increasing row order.
    picks: Vec<Pick>,
    starts: Vec<usize>,
    /// Per expert, where its next pick goes while regrouping.
    next: Vec<usize>,
}

impl Routing {
    /// A routing of up to `rows` rows of `top_k` picks among `experts` (no allocation
    /// regrouping them).
    pub fn new(experts: usize, rows: usize, top_k: usize) -> Routing {
        Routing { picks: Vec::with_capacity(rows * top_k), starts: Vec::with_capacity(experts + 1), next: Vec::with_capacity(experts) }
    }

    /// Regroups `route` (rows of `top_k` ids then probabilities) by expert, for the first
    /// `rows` rows. Ids come from a value an artifact's ops wrote, so each is checked.
    pub fn from_route(&mut self, route: &[f32], rows: usize, top_k: usize, experts: usize) -> Result<()> {
        let route = || route.chunks_exact(2 * top_k).take(rows).map(|r| r.split_at(top_k));
        // Count each expert's picks (checking the ids), then place them, row by row.
        self.starts.clear();
        self.starts.resize(experts + 1, 0);
        for (ids, _) in route() {
            for &id in ids {
                let e = id as usize;
                if id != e as f32 || e >= experts {
                    return Err(Error::request(format!("a route names expert {id}, not one of the layer's {experts}")));
                }
                self.starts[e + 1] += 1;
            }
        }
        for e in 0..experts {
            self.starts[e + 1] += self.starts[e];
        }
        self.next.clear();
        self.next.extend_from_slice(&self.starts[..experts]);
        self.picks.clear();
        self.picks.resize(self.starts[experts], Pick { row: 0, rank: 0, weight: 0.0 });
        for (row, (ids, weights)) in route().enumerate() {
            for (rank, (&id, &weight)) in ids.iter().zip(weights).enumerate() {
                let at = &mut self.next[id as usize];
                self.picks[*at] = Pick { row: row as u32, rank: rank as u32, weight };
                *at += 1;
            }
        }
        Ok(())
    }

    /// The rows expert `e` computes, in increasing row order.
    pub fn picks(&self, e: usize) -> &[Pick] {
        &self.picks[self.starts[e]..self.starts[e + 1]]
    }

    /// Rows routed to expert `e`.
    pub fn load(&self, e: usize) -> usize {
        self.starts[e + 1] - self.starts[e]
    }

    /// Experts with at least one row.
    pub fn active(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.starts.len().saturating_sub(1)).filter(|&e| self.load(e) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_routes_to_its_largest_probabilities() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let mut out = [0f32; 4];
        route_row(&logits, 2, &mut out, &mut RouteScratch::default());
        assert_eq!(&out[..2], &[1.0, 3.0]);
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        assert!((out[2] as f64 - 2f64.exp() / z).abs() < 1e-6 && (out[3] as f64 - 1f64.exp() / z).abs() < 1e-6, "{out:?}");
    }

    /// Eight experts in four groups of two, the best two groups kept, top 2: the bias moves
    /// the choice (and the groups) but never the weights, which are the unbiased sigmoids,
    /// normalised and scaled.
    #[test]
    fn sigmoid_routing_chooses_by_biased_groups_and_weighs_by_unbiased_scores() {
        let logits = [2.0f32, -1.0, 1.5, 1.4, -2.0, 0.0, 0.1, 0.2];
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let mut out = [0f32; 4];
        let mut s = RouteScratch::default();
        let no_bias = [0f32; 8];
        let rule = SigmoidRule { bias: &no_bias, groups: 4, top_groups: 2, normalize: false, scale: 1.0 };
        route_sigmoid_row(&logits, &rule, 2, &mut out, &mut s);
        // Groups (by two best): {0,1} 0.88+0.27, {2,3} 0.82+0.80: the top experts are 0 and 2.
        assert_eq!(&out[..2], &[0.0, 2.0]);
        assert!((out[2] - sig(2.0)).abs() < 1e-6 && (out[3] - sig(1.5)).abs() < 1e-6, "{out:?}");
        // A bias on group {6,7} makes it the best group and expert 7 the first pick; the
        // weights stay unbiased, then normalised and scaled by 2.5.
        let bias = [0.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0];
        let rule = SigmoidRule { bias: &bias, groups: 4, top_groups: 1, normalize: true, scale: 2.5 };
        route_sigmoid_row(&logits, &rule, 2, &mut out, &mut s);
        assert_eq!(&out[..2], &[7.0, 6.0]);
        let (a, b) = (sig(0.2), sig(0.1));
        assert!((out[2] - 2.5 * a / (a + b)).abs() < 1e-6 && (out[3] - 2.5 * b / (a + b)).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn routing_regroups_rows_by_expert_and_refuses_unknown_experts() {
        // Two rows, top 2: row 0 picks 3 then 1, row 1 picks 1 then 0.
        let route = [3.0, 1.0, 0.6, 0.4, 1.0, 0.0, 0.7, 0.3];
        let mut r = Routing::default();
        r.from_route(&route, 2, 2, 4).unwrap();
        assert_eq!(r.picks(1), [Pick { row: 0, rank: 1, weight: 0.4 }, Pick { row: 1, rank: 0, weight: 0.7 }]);
        assert_eq!((r.load(0), r.load(2), r.load(3)), (1, 0, 1));
        assert_eq!(r.active().collect::<Vec<_>>(), vec![0, 1, 3]);
        // Only the real rows count.
        r.from_route(&route, 1, 2, 4).unwrap();
        assert_eq!(r.active().collect::<Vec<_>>(), vec![1, 3]);
        assert!(r.from_route(&[4.0, 1.0, 0.5, 0.5], 1, 2, 4).is_err());
        assert!(r.from_route(&[1.5, 1.0, 0.5, 0.5], 1, 2, 4).is_err());
    }
}
