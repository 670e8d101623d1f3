//! The expert cache: each MoE layer's pool of window slots, what each slot holds (or is
//! receiving), and the two replacement orders the strategies use: least recently used, and
//! HybriMoE's decayed routing score, `S <- a * s + (1 - a) * S` per expert, where `s` is the
//! probability mass the layer's last pass routed to the expert (evict the lowest `S`).

/// One slot: the expert it holds or receives, the copy's ticket, when it was last used, and
/// whether a prefetch put it there for the layer's next run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slot {
    pub expert: Option<u32>,
    pub ticket: u64,
    pub last_use: u64,
    pub prefetched: bool,
}

#[derive(Debug, Clone)]
pub struct Pool {
    pub slots: Vec<Slot>,
    /// Decayed routing score per expert.
    pub score: Vec<f32>,
}

/// Weight of the newest pass in the decayed score (HybriMoE's code uses 0.5).
pub const SCORE_DECAY: f32 = 0.5;

#[derive(Debug, Clone)]
pub struct ExpertCache {
    pub layers: Vec<Pool>,
    /// Uses so far, the clock of `last_use`.
    clock: u64,
}

impl ExpertCache {
    pub fn new(layers: usize, slots: usize, experts: usize) -> ExpertCache {
        ExpertCache { layers: vec![Pool { slots: vec![Slot::default(); slots], score: vec![0.0; experts] }; layers], clock: 0 }
    }

    /// The slot of `layer`'s pool holding (or receiving) `expert`.
    pub fn slot_of(&self, layer: usize, expert: u32) -> Option<usize> {
        self.layers[layer].slots.iter().position(|s| s.expert == Some(expert))
    }

    /// Records a use of `slot` (for least-recently-used replacement).
    pub fn touch(&mut self, layer: usize, slot: usize) {
        self.clock += 1;
        self.layers[layer].slots[slot].last_use = self.clock;
    }

    /// Points `slot` at `expert`, arriving with copy `ticket`.
    pub fn assign(&mut self, layer: usize, slot: usize, expert: u32, ticket: u64, prefetched: bool) {
        self.clock += 1;
        self.layers[layer].slots[slot] = Slot { expert: Some(expert), ticket, last_use: self.clock, prefetched };
    }

    /// The least recently used slot of `layer` that `keep` does not protect (empty slots first).
    pub fn lru_victim(&self, layer: usize, keep: impl Fn(&Slot) -> bool) -> Option<usize> {
        let slots = &self.layers[layer].slots;
        (0..slots.len()).filter(|&i| !keep(&slots[i])).min_by_key(|&i| (slots[i].expert.is_some(), slots[i].last_use))
    }

    /// The slot of `layer` whose expert has the lowest score, among those `keep` does not
    /// protect (empty slots first), with that score.
    pub fn lowest_score(&self, layer: usize, keep: impl Fn(&Slot) -> bool) -> Option<(usize, f32)> {
        let pool = &self.layers[layer];
        let score = |s: &Slot| s.expert.map_or(f32::NEG_INFINITY, |e| pool.score[e as usize]);
        (0..pool.slots.len()).filter(|&i| !keep(&pool.slots[i])).map(|i| (i, score(&pool.slots[i]))).min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
    }

    /// Decays `layer`'s scores by one pass whose routing gave each expert `mass[e]`.
    pub fn update_scores(&mut self, layer: usize, mass: &[f32]) {
        for (s, &m) in self.layers[layer].score.iter_mut().zip(mass) {
            *s = SCORE_DECAY * m + (1.0 - SCORE_DECAY) * *s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_takes_empty_slots_then_the_oldest_use() {
        let mut c = ExpertCache::new(1, 3, 8);
        assert_eq!(c.lru_victim(0, |_| false), Some(0));
        c.assign(0, 0, 5, 1, false);
        c.assign(0, 1, 6, 2, false);
        c.assign(0, 2, 7, 3, false);
        c.touch(0, 0);
        assert_eq!(c.lru_victim(0, |_| false), Some(1));
        assert_eq!(c.lru_victim(0, |s| s.expert == Some(6)), Some(2));
        assert_eq!(c.slot_of(0, 7), Some(2));
    }

    #[test]
    fn the_lowest_decayed_score_is_evicted() {
        let mut c = ExpertCache::new(1, 2, 4);
        c.assign(0, 0, 1, 1, false);
        c.assign(0, 1, 2, 2, false);
        c.update_scores(0, &[0.0, 1.0, 0.2, 0.0]);
        c.update_scores(0, &[0.0, 0.0, 0.4, 0.0]);
        // Expert 1: 0.5, then halved; expert 2: 0.1, then 0.5 * 0.4 + 0.5 * 0.1.
        assert_eq!(c.layers[0].score[1], 0.25);
        assert!((c.layers[0].score[2] - 0.25).abs() < 1e-6);
        // Then 0.125 against 0.175: expert 1 (slot 0) goes.
        c.update_scores(0, &[0.0, 0.0, 0.1, 0.0]);
        assert_eq!(c.lowest_score(0, |_| false).map(|x| x.0), Some(0));
    }
}
