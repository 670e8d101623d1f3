//! The router's choice: top-k experts per row from the softmax of its logits, and that
//! choice regrouped per expert (the rows each expert computes, with each row's probability).

use crate::error::{Error, Result};
use crate::kernels;
use crate::topk::topk;

/// `Route` for one row: `softmax(logits)` in f32 (max subtracted, as PyTorch computes it),
/// then the `top_k` largest as `torch.topk` orders them; writes `top_k` ids (as f32) then
/// their probabilities into `out`.
pub fn route_row(logits: &[f32], top_k: usize, out: &mut [f32]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut probs: Vec<f32> = logits.iter().map(|&v| kernels::exp(v - max)).collect();
    let sum: f32 = probs.iter().sum();
    for p in &mut probs {
        *p /= sum;
    }
    let (ids, weights) = out.split_at_mut(top_k);
    for ((id, w), e) in ids.iter_mut().zip(weights).zip(topk(&probs, top_k)) {
        *id = e as f32;
        *w = probs[e];
    }
}

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

/// A layer's routing of one pass, per expert.
#[derive(Debug, Default)]
pub struct Routing {
    /// `picks[e]`: the rows expert e computes, in increasing row order.
    pub picks: Vec<Vec<Pick>>,
}

impl Routing {
    /// Regroups `route` (rows of `top_k` ids then probabilities) by expert, for the first
    /// `rows` rows. Ids come from a value an artifact's ops wrote, so each is checked.
    pub fn from_route(&mut self, route: &[f32], rows: usize, top_k: usize, experts: usize) -> Result<()> {
        self.picks.resize_with(experts, Vec::new);
        self.picks.iter_mut().for_each(Vec::clear);
        for (row, r) in route.chunks_exact(2 * top_k).take(rows).enumerate() {
            let (ids, weights) = r.split_at(top_k);
            for (rank, (&id, &weight)) in ids.iter().zip(weights).enumerate() {
                let e = id as usize;
                if id != e as f32 || e >= experts {
                    return Err(Error::request(format!("a route names expert {id}, not one of the layer's {experts}")));
                }
                self.picks[e].push(Pick { row: row as u32, rank: rank as u32, weight });
            }
        }
        Ok(())
    }

    /// Rows routed to expert `e`.
    pub fn load(&self, e: usize) -> usize {
        self.picks[e].len()
    }

    /// Experts with at least one row.
    pub fn active(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.picks.len()).filter(|&e| !self.picks[e].is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_routes_to_its_largest_probabilities() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let mut out = [0f32; 4];
        route_row(&logits, 2, &mut out);
        assert_eq!(&out[..2], &[1.0, 3.0]);
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        assert!((out[2] as f64 - 2f64.exp() / z).abs() < 1e-6 && (out[3] as f64 - 1f64.exp() / z).abs() < 1e-6, "{out:?}");
    }

    #[test]
    fn routing_regroups_rows_by_expert_and_refuses_unknown_experts() {
        // Two rows, top 2: row 0 picks 3 then 1, row 1 picks 1 then 0.
        let route = [3.0, 1.0, 0.6, 0.4, 1.0, 0.0, 0.7, 0.3];
        let mut r = Routing::default();
        r.from_route(&route, 2, 2, 4).unwrap();
        assert_eq!(r.picks[1], vec![Pick { row: 0, rank: 1, weight: 0.4 }, Pick { row: 1, rank: 0, weight: 0.7 }]);
        assert_eq!((r.load(0), r.load(2), r.load(3)), (1, 0, 1));
        assert_eq!(r.active().collect::<Vec<_>>(), vec![0, 1, 3]);
        // Only the real rows count.
        r.from_route(&route, 1, 2, 4).unwrap();
        assert_eq!(r.active().collect::<Vec<_>>(), vec![1, 3]);
        assert!(r.from_route(&[4.0, 1.0, 0.5, 0.5], 1, 2, 4).is_err());
        assert!(r.from_route(&[1.5, 1.0, 0.5, 0.5], 1, 2, 4).is_err());
    }
}
