//! The two paths' shares of one layer's experts, handed out one expert at a time. Each path
//! works through its own share heaviest first; a path that runs out takes the other's
//! lightest expert not yet started (the accelerator one its slots hold, else, while the CPU
//! path still has more than one left, one it stages first), so an error of the cost model
//! costs at most the tail of about one expert. (HybriMoE fills the accelerator from
//! the loaded end and the CPU from the light end; this does so as the layer runs.) Which path
//! takes an expert changes when the layer finishes, never what it computes.

use std::sync::Mutex;

#[derive(Debug, Clone, Copy)]
struct Item {
    expert: u32,
    /// In a slot, ready (the accelerator may take it).
    cached: bool,
    taken: bool,
}

#[derive(Debug, Default)]
struct Lists {
    accelerator: Vec<Item>,
    cpu: Vec<Item>,
    /// Experts the CPU path took.
    by_cpu: usize,
}

#[derive(Debug)]
pub struct Shares {
    lists: Mutex<Lists>,
    /// Whether a path may take from the other's share (not for the baselines, which fix
    /// where every expert runs).
    share: bool,
}

impl Shares {
    /// Empty shares with room for a layer of `experts` experts (no allocation setting them).
    pub fn with_capacity(experts: usize) -> Shares {
        Shares { lists: Mutex::new(Lists { accelerator: Vec::with_capacity(experts), cpu: Vec::with_capacity(experts), by_cpu: 0 }), share: false }
    }

    /// A layer's shares: `accelerator` and `cpu` are (expert, cached) in the order each path
    /// should take them.
    pub fn set(&mut self, accelerator: &[(u32, bool)], cpu: &[(u32, bool)], share: bool) {
        let l = self.lists.get_mut().unwrap_or_else(|e| e.into_inner());
        let item = |&(expert, cached): &(u32, bool)| Item { expert, cached, taken: false };
        l.accelerator.clear();
        l.accelerator.extend(accelerator.iter().map(item));
        l.cpu.clear();
        l.cpu.extend(cpu.iter().map(item));
        l.by_cpu = 0;
        self.share = share;
    }

    #[cfg(test)]
    fn new(accelerator: &[(u32, bool)], cpu: &[(u32, bool)], share: bool) -> Shares {
        let mut s = Shares::with_capacity(accelerator.len() + cpu.len());
        s.set(accelerator, cpu, share);
        s
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lists> {
        self.lists.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The accelerator's next expert and whether it was cached when the layer was planned
    /// (if not, it must be staged first: its own share's were, as the split planned; one
    /// taken from the CPU's share, only if `can_stage`, is not yet).
    pub fn next_for_accelerator(&self, can_stage: bool) -> Option<(u32, bool)> {
        let mut l = self.lock();
        if let Some(i) = l.accelerator.iter().position(|x| !x.taken) {
            l.accelerator[i].taken = true;
            return Some((l.accelerator[i].expert, l.accelerator[i].cached));
        }
        if !self.share {
            return None;
        }
        let left = l.cpu.iter().filter(|x| !x.taken).count();
        let i = l.cpu.iter().rposition(|x| !x.taken && x.cached).or_else(|| if can_stage && left > 1 { l.cpu.iter().rposition(|x| !x.taken) } else { None })?;
        l.cpu[i].taken = true;
        Some((l.cpu[i].expert, l.cpu[i].cached))
    }

    /// The CPU path's next expert.
    pub fn next_for_cpu(&self) -> Option<u32> {
        let mut l = self.lock();
        let pick = match l.cpu.iter().position(|x| !x.taken) {
            Some(i) => Some(&mut l.cpu[i]),
            None if self.share => l.accelerator.iter_mut().rev().find(|x| !x.taken),
            None => None,
        }?;
        pick.taken = true;
        let e = pick.expert;
        l.by_cpu += 1;
        Some(e)
    }

    /// How many experts the CPU path computed.
    pub fn taken_by_cpu(&self) -> usize {
        self.lock().by_cpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_path_takes_its_share_then_the_others_light_end() {
        let s = Shares::new(&[(1, true), (2, true), (3, false)], &[(4, false), (5, true), (6, false)], true);
        assert_eq!(s.next_for_cpu(), Some(4));
        assert_eq!(s.next_for_cpu(), Some(5));
        assert_eq!(s.next_for_cpu(), Some(6));
        // The CPU path's share is done: it takes the accelerator's lightest (last) one.
        assert_eq!(s.next_for_cpu(), Some(3));
        assert_eq!(s.next_for_accelerator(true), Some((1, true)));
        assert_eq!(s.next_for_accelerator(true), Some((2, true)));
        assert_eq!(s.next_for_accelerator(true), None);
        assert_eq!(s.taken_by_cpu(), 4);
        // The accelerator takes cached experts from the CPU's share first, then uncached ones
        // (to stage) while the CPU path has more than one left.
        let s = Shares::new(&[], &[(4, false), (5, true), (6, false)], true);
        assert_eq!(s.next_for_accelerator(true), Some((5, true)));
        assert_eq!(s.next_for_accelerator(true), Some((6, false)));
        assert_eq!(s.next_for_accelerator(true), None);
        assert_eq!(s.next_for_cpu(), Some(4));
        // ...and only if it has a slot to stage into.
        let s = Shares::new(&[], &[(4, false), (6, false)], true);
        assert_eq!(s.next_for_accelerator(false), None);
        // Without sharing, each path keeps to its own.
        let s = Shares::new(&[(1, true)], &[(4, true)], false);
        assert_eq!((s.next_for_accelerator(true), s.next_for_accelerator(true)), (Some((1, true)), None));
        assert_eq!((s.next_for_cpu(), s.next_for_cpu()), (Some(4), None));
    }
}
