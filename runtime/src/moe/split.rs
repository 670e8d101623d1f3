//! The per-layer split of the active experts between the accelerator path and the CPU path.
//! Each path's cost of one expert is linear in its rows, `a + b * rows` (HybriMoE's form),
//! fitted by least squares with forgetting to the experts the path really computed, starting
//! from the plan's figures (`ExpertCosts`, the target's rates: the host's threads are not the
//! target's engines, and rates are peaks). Greedy longest-first, as HybriMoE's scheduler:
//! every expert, heaviest first, goes to the path on which it would finish sooner, so
//! cached, heavily loaded experts land on the accelerator and light, uncached ones on the
//! CPU, minimising the later of the two. Which path computes an expert never changes its
//! output (see `compute`), only time.

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

/// How much a newer copy measurement moves the copy time's scale.
const SCALE_STEP: f64 = 0.3;
/// Weight each older observation keeps per newer one in a path's fit (about the last few
/// hundred experts count).
const FORGET: f64 = 0.995;
/// Weight of the plan's figures in a fit, in observations: they decide only until the path
/// has computed a few dozen experts.
const PRIOR: f64 = 4.0;

/// Least-squares line `seconds = a + b * rows` over weighted observations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearFit {
    w: f64,
    n: f64,
    nn: f64,
    t: f64,
    nt: f64,
}

impl LinearFit {
    /// A fit that starts as the plan's `cost` (its two ends, at 1 and at 64 rows).
    pub fn from_prior(cost: llada_ir::PathCost) -> LinearFit {
        let mut f = LinearFit { w: 0.0, n: 0.0, nn: 0.0, t: 0.0, nt: 0.0 };
        for rows in [1.0, 64.0] {
            f.add(rows, cost.seconds(rows as usize), PRIOR / 2.0);
        }
        f
    }

    fn add(&mut self, rows: f64, seconds: f64, weight: f64) {
        self.w += weight;
        self.n += weight * rows;
        self.nn += weight * rows * rows;
        self.t += weight * seconds;
        self.nt += weight * rows * seconds;
    }

    /// Folds in one expert of `rows` rows that took `seconds`.
    pub fn observe(&mut self, rows: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        for x in [&mut self.w, &mut self.n, &mut self.nn, &mut self.t, &mut self.nt] {
            *x *= FORGET;
        }
        self.add(rows as f64, seconds, 1.0);
    }

    /// Predicted seconds of an expert of `rows` rows (never negative).
    pub fn seconds(&self, rows: usize) -> f64 {
        let det = self.w * self.nn - self.n * self.n;
        let (a, b) = if det.abs() > 1e-12 * self.w * self.nn {
            let b = (self.w * self.nt - self.n * self.t) / det;
            ((self.t - b * self.n) / self.w, b.max(0.0))
        } else {
            (self.t / self.w, 0.0)
        };
        (a + b * rows as f64).max(0.0)
    }
}

#[derive(Debug, Clone)]
pub struct Split {
    pub costs: ExpertCosts,
    pub accelerator: LinearFit,
    pub cpu: LinearFit,
    /// Measured over predicted copy seconds (1 until measured): the wait for a copy, and
    /// the CPU time a copy takes (on a host whose cores also compute, what it costs them).
    pub stage_scale: f64,
    pub stage_cpu_scale: f64,
}

impl Split {
    pub fn new(costs: ExpertCosts) -> Split {
        Split { costs, accelerator: LinearFit::from_prior(costs.accelerator), cpu: LinearFit::from_prior(costs.cpu), stage_scale: 1.0, stage_cpu_scale: 1.0 }
    }

    /// Predicted seconds from queueing a copy of one expert to its arrival.
    pub fn stage_seconds(&self) -> f64 {
        self.stage_scale * self.costs.stage_seconds
    }

    /// Predicted cost of copying one expert ahead of need: the compute time it takes away.
    pub fn stage_cost(&self) -> f64 {
        self.stage_cpu_scale * self.costs.stage_seconds
    }

    /// Predicted seconds of `c` on the accelerator (staging first if not cached).
    pub fn accelerator_seconds(&self, c: &Candidate) -> f64 {
        let stage = if c.cached { 0.0 } else { self.stage_seconds() };
        stage + self.accelerator.seconds(c.rows)
    }

    pub fn cpu_seconds(&self, c: &Candidate) -> f64 {
        self.cpu.seconds(c.rows)
    }

    /// Places every candidate; at most `stage_budget` uncached ones on the accelerator (the
    /// slots it may stage into). Writes the places (in `candidates` order) into `places` and
    /// returns the two paths' predicted seconds; `order` is scratch. Neither allocates once
    /// it holds a layer's experts.
    pub fn assign(&self, candidates: &[Candidate], stage_budget: usize, places: &mut Vec<Place>, order: &mut Vec<usize>) -> (f64, f64) {
        order.clear();
        order.extend(0..candidates.len());
        // Unstable (no scratch allocated): the keys are distinct, an expert being one candidate.
        order.sort_unstable_by_key(|&i| (std::cmp::Reverse(candidates[i].rows), candidates[i].expert));
        places.clear();
        places.resize(candidates.len(), Place::Cpu);
        let (mut acc, mut cpu, mut staged) = (0.0, 0.0, 0);
        for &i in order.iter() {
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

    /// Folds in measured copies: `experts` experts' worth of bytes in `seconds` of wall time
    /// and `cpu_seconds` of CPU time.
    pub fn observe_staging(&mut self, experts: f64, seconds: f64, cpu_seconds: f64) {
        if experts > 0.0 && self.costs.stage_seconds > 0.0 {
            for (scale, t) in [(&mut self.stage_scale, seconds), (&mut self.stage_cpu_scale, cpu_seconds)] {
                if t > 0.0 {
                    let ratio = (t / experts / self.costs.stage_seconds).clamp(1e-3, 1e3);
                    *scale += SCALE_STEP * (ratio - *scale);
                }
            }
        }
    }

    /// Folds in one expert of `rows` rows that `place` computed in `seconds`.
    pub fn observe(&mut self, place: Place, rows: usize, seconds: f64) {
        match place {
            Place::Accelerator => self.accelerator.observe(rows, seconds),
            Place::Cpu => self.cpu.observe(rows, seconds),
        }
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
        let (acc, cpu) = s.assign(&cands, 4, &mut places, &mut Vec::new());
        assert_eq!(places, [Place::Accelerator, Place::Cpu, Place::Cpu, Place::Cpu]);
        assert_eq!((acc, cpu), (4.0, 8.0));
        // A slow CPU makes staging worth it.
        let s = split(1.0, 50.0, 1.0);
        let (_, cpu) = s.assign(&cands, 4, &mut places, &mut Vec::new());
        assert!(places.iter().all(|&p| p == Place::Accelerator) && cpu == 0.0, "{places:?}");
        // ...but only as many as there are slots to stage into.
        s.assign(&cands, 1, &mut places, &mut Vec::new());
        assert_eq!(places, [Place::Accelerator, Place::Accelerator, Place::Accelerator, Place::Cpu]);
    }

    #[test]
    fn a_path_fits_the_line_its_experts_measure() {
        let mut s = split(1.0, 1.0, 0.0);
        assert!((s.cpu.seconds(10) - 10.0).abs() < 1e-9, "the prior is the plan's line");
        // The CPU path really takes 2 + 0.5 rows.
        for i in 0..2000 {
            let rows = 1 + (i * 7) % 40;
            s.observe(Place::Cpu, rows, 2.0 + 0.5 * rows as f64);
        }
        for rows in [1, 20, 64] {
            assert!((s.cpu.seconds(rows) - (2.0 + 0.5 * rows as f64)).abs() < 1e-3, "{rows}: {}", s.cpu.seconds(rows));
        }
        assert!((s.accelerator.seconds(10) - 10.0).abs() < 1e-9);
    }
}
