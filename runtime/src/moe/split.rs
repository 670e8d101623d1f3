//! The per-layer split of the active experts between the accelerator path and the CPU path,
//! from the plan's cost figures (`ExpertCosts`, the target's rates), each path's scaled by
//! what its experts really took so far (the host's threads are not the target's engines, and
//! the rates are peaks). Greedy longest-first, as HybriMoE's scheduler: every expert, heaviest
//! first, goes to the path on which it would finish sooner, so cached, heavily loaded experts
//! land on the accelerator and light, uncached ones on the CPU, minimising the later of the
//! two. Which path computes an expert never changes its output (see `compute`), only time.

use llada_ir::ExpertCosts;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Accelerator,
    Cpu,
}

/// An active expert: its rows this pass, and whether its slot holds it ready (else the
/// accelerator must stage it first).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub expert: u32,
    pub rows: usize,
    pub cached: bool,
}

/// How much a newer measurement moves a path's scale.
const SCALE_STEP: f64 = 0.3;

#[derive(Debug, Clone)]
pub struct Split {
    pub costs: ExpertCosts,
    /// Measured over predicted seconds, per path and for copies (1 until measured).
    pub accelerator_scale: f64,
    pub cpu_scale: f64,
    pub stage_scale: f64,
}

impl Split {
    pub fn new(costs: ExpertCosts) -> Split {
        Split { costs, accelerator_scale: 1.0, cpu_scale: 1.0, stage_scale: 1.0 }
    }

    /// Predicted seconds of copying one expert into a slot.
    pub fn stage_seconds(&self) -> f64 {
        self.stage_scale * self.costs.stage_seconds
    }

    /// Predicted seconds of `c` on the accelerator (staging first if not cached).
    pub fn accelerator_seconds(&self, c: &Candidate) -> f64 {
        let stage = if c.cached { 0.0 } else { self.stage_seconds() };
        stage + self.accelerator_scale * self.costs.accelerator.seconds(c.rows)
    }

    pub fn cpu_seconds(&self, c: &Candidate) -> f64 {
        self.cpu_scale * self.costs.cpu.seconds(c.rows)
    }

    /// Places every candidate; at most `stage_budget` uncached ones on the accelerator (the
    /// slots it may stage into). Returns the places (in `candidates` order) and the two
    /// paths' predicted seconds.
    pub fn assign(&self, candidates: &[Candidate], stage_budget: usize, places: &mut Vec<Place>) -> (f64, f64) {
        let mut order: Vec<usize> = (0..candidates.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(candidates[i].rows), candidates[i].expert));
        places.clear();
        places.resize(candidates.len(), Place::Cpu);
        let (mut acc, mut cpu, mut staged) = (0.0, 0.0, 0);
        for i in order {
            let c = &candidates[i];
            let (a, p) = (acc + self.accelerator_seconds(c), cpu + self.cpu_seconds(c));
            if a <= p && (c.cached || staged < stage_budget) {
                places[i] = Place::Accelerator;
                acc = a;
                staged += usize::from(!c.cached);
            } else {
                cpu = p;
            }
        }
        (acc, cpu)
    }

    /// Folds in measured copies: `experts` experts' worth of bytes in `seconds`.
    pub fn observe_staging(&mut self, experts: f64, seconds: f64) {
        if experts > 0.0 && seconds > 0.0 && self.costs.stage_seconds > 0.0 {
            let ratio = (seconds / experts / self.costs.stage_seconds).clamp(1e-3, 1e3);
            self.stage_scale += SCALE_STEP * (ratio - self.stage_scale);
        }
    }

    /// Folds in a path's measured compute seconds against its unscaled prediction.
    pub fn observe(&mut self, place: Place, predicted_unscaled: f64, measured: f64) {
        if predicted_unscaled <= 0.0 || measured <= 0.0 {
            return;
        }
        let ratio = (measured / predicted_unscaled).clamp(1e-3, 1e3);
        let scale = match place {
            Place::Accelerator => &mut self.accelerator_scale,
            Place::Cpu => &mut self.cpu_scale,
        };
        *scale += SCALE_STEP * (ratio - *scale);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llada_ir::PathCost;

    fn split(acc_row: f64, cpu_row: f64, stage: f64) -> Split {
        Split::new(ExpertCosts {
            accelerator: PathCost { weight_seconds: 0.0, row_seconds: acc_row },
            cpu: PathCost { weight_seconds: 0.0, row_seconds: cpu_row },
            stage_seconds: stage,
        })
    }

    #[test]
    fn equal_paths_balance_and_staging_keeps_uncached_experts_on_the_cpu() {
        let s = split(1.0, 1.0, 100.0);
        let c = |expert, rows, cached| Candidate { expert, rows, cached };
        let cands = [c(0, 4, true), c(1, 4, true), c(2, 3, false), c(3, 1, false)];
        let mut places = Vec::new();
        let (acc, cpu) = s.assign(&cands, 4, &mut places);
        assert_eq!(places, [Place::Accelerator, Place::Cpu, Place::Cpu, Place::Cpu]);
        assert_eq!((acc, cpu), (4.0, 8.0));
        // A slow CPU makes staging worth it.
        let s = split(1.0, 50.0, 1.0);
        let (_, cpu) = s.assign(&cands, 4, &mut places);
        assert!(places.iter().all(|&p| p == Place::Accelerator) && cpu == 0.0, "{places:?}");
        // ...but only as many as there are slots to stage into.
        s.assign(&cands, 1, &mut places);
        assert_eq!(places, [Place::Accelerator, Place::Accelerator, Place::Accelerator, Place::Cpu]);
    }

    #[test]
    fn measurements_scale_a_path() {
        let mut s = split(1.0, 1.0, 0.0);
        for _ in 0..40 {
            s.observe(Place::Cpu, 1.0, 3.0);
        }
        assert!((s.cpu_scale - 3.0).abs() < 1e-3 && s.accelerator_scale == 1.0);
    }
}
