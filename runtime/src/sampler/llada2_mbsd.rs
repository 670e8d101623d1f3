//! `--policy mbsd` on LLaDA 2.x: the published commit rule (`llada2.rs`) on fewer rows, and
//! drafts of the next block committed without waiting for it.
//!
//! Rows: a pass computes only the positions whose cached keys and values are not those of
//! their token (never stored, or computed while the position was masked: committed since their
//! last pass) and the current block's masked positions; the block's other committed positions
//! are read from the cache, as they were computed when more of the block was masked (the
//! approximation `dual` makes for LLaDA). The exact policy recomputes the whole block each
//! call, so a block of `n` calls costs `n` x the block's rows there.
//!
//! Drafts: under the block-causal mask, block b+1 may see blocks up to b+1 and never the other
//! way, so drafting b+1 in b's pass changes nothing b computes. A draft row of b+1 sees b as it
//! stands (its last masked positions still masks) and b+1's own rows, all masks but its
//! earlier drafts: a coarser context than b+1's first call, which sees b finished. Draft rows
//! (every position of b+1) join a pass when it is likely to empty b: b's masked positions are
//! no more than its previous call committed (at b's first call, b-1's first call). When the pass does empty b, b+1's drafts whose
//! confidence reaches `spec_threshold` are committed at once, as that call's commits, and b+1
//! starts with them: the calls they save are the gain. A draft pass that leaves b masked
//! committed nothing of b+1; its draft rows were spent. Under the published threshold rule a
//! draft confirmed by b+1's first call (LLaDA's `mbsd` rule) would save nothing: that call
//! commits every prediction above the threshold anyway.

use super::ask::{LogitCapacity, PassRequest};
use super::canvas::Canvas;
use super::mbsd::MbsdReport;

pub(super) struct Speculation {
    /// The token each position's cached keys and values were computed from (`None`: never).
    stored: Vec<Option<u32>>,
    /// Draft the next block (`spec_blocks` 1), and the confidence a draft needs.
    drafts: bool,
    spec_threshold: f32,
    /// The current block's start, its calls so far, the commits of its last call, and those
    /// of the previous block's first call: what the next call is expected to commit.
    block_start: usize,
    calls: usize,
    last_commits: usize,
    first_call_commits: usize,
    /// This pass's rows (positions, ascending) and where its draft rows start.
    rows: Vec<u32>,
    /// The rows whose logits the pass returns (indexes into `rows`).
    logit_rows: Vec<u32>,
    draft_from: usize,
    pub(super) report: MbsdReport,
}

impl Speculation {
    pub(super) fn new(grid: usize, drafts: bool, spec_threshold: f32) -> Speculation {
        Speculation { stored: vec![None; grid], drafts, spec_threshold, block_start: usize::MAX, calls: 0, last_commits: 0, first_call_commits: 0, rows: Vec::with_capacity(grid), logit_rows: Vec::with_capacity(grid), draft_from: usize::MAX, report: MbsdReport::default() }
    }

    /// The rows of a call on the block `s..e`, as above; where they and the block's logits
    /// overflow every graph, the prompt's whole blocks are stored first, a pass
    /// each: returns where those stores start (the blocks from `from` to `s`).
    pub(super) fn blocks_to_store(&mut self, capacity: &LogitCapacity, c: &Canvas, (s, e): (usize, usize)) -> Option<usize> {
        let (mask, b) = (c.special.mask, e - s);
        let stale = |st: &[Option<u32>], p: usize| c.x[p] == mask || st[p] != Some(c.x[p]);
        self.rows.clear();
        self.rows.extend((0..e).filter(|&p| stale(&self.stored, p)).map(|p| p as u32));
        let masked = c.x[s..e].iter().filter(|&&t| t == mask).count();
        if capacity.fits(self.rows.len(), masked) {
            return None;
        }
        // From the block of the first stale position (the blocks before it are stored).
        let from = self.rows.first().map_or(s, |&p| (p as usize / b * b).min(s));
        (from..s).for_each(|p| self.stored[p] = Some(c.x[p]));
        self.report.dense_passes += (s - from).div_ceil(b) as u64;
        self.report.rows_refresh += (s - from) as u64;
        self.rows.retain(|&p| p as usize >= s);
        (from < s).then_some(from)
    }

    /// The pass of a call on the block `s..e` (of `grid`, the grid's end) over the rows
    /// [`blocks_to_store`](Self::blocks_to_store) chose: logits for the block's masked
    /// positions and, drafting, for the next block's, into `c.logit_rows` (as positions).
    pub(super) fn pass<'a>(&'a mut self, capacity: &LogitCapacity, c: &'a mut Canvas, (s, e): (usize, usize), grid: usize) -> PassRequest<'a> {
        let (mask, b) = (c.special.mask, e - s);
        let masked = c.x[s..e].iter().filter(|&&t| t == mask).count();
        if self.block_start != s {
            (self.block_start, self.calls) = (s, 0);
        }
        // Expected to empty the block: no more masked than the block's last call committed
        // (at its first call: the previous block's first call).
        let expected = if self.calls == 0 { self.first_call_commits } else { self.last_commits };
        let draft = self.drafts && e < grid && masked > 0 && masked <= expected && {
            let logit_rows = masked + c.x[e..e + b].iter().filter(|&&t| t == mask).count();
            capacity.fits(self.rows.len() + b, logit_rows)
        };
        self.draft_from = self.rows.len();
        let end = if draft {
            self.rows.extend(e as u32..(e + b) as u32);
            e + b
        } else {
            e
        };
        // The logits of the masked rows from the block on: their positions, and their indexes
        // into the rows.
        c.logit_rows.clear();
        self.logit_rows.clear();
        for (i, &p) in self.rows.iter().enumerate().filter(|&(_, &p)| p as usize >= s && c.x[p as usize] == mask) {
            c.logit_rows.push(p);
            self.logit_rows.push(i as u32);
        }
        let r = &mut self.report;
        r.dense_passes += 1;
        r.rows_masked += masked as u64;
        r.rows_speculative += (self.rows.len() - self.draft_from) as u64;
        r.rows_refresh += (self.draft_from - masked) as u64;
        for &p in &self.rows {
            self.stored[p as usize] = Some(c.x[p as usize]);
        }
        PassRequest::BlockRows { seq: &c.x[..end], positions: &self.rows, block_len: b, logit_rows: &self.logit_rows }
    }

    /// After the call's commits on block `s..e` (`committed` of them): if the pass drafted and
    /// emptied the block, commits the drafts (`(position, token, confidence)`, the next
    /// block's) that reach `spec_threshold`, as this call's.
    pub(super) fn after_commits(&mut self, c: &mut Canvas, (s, e): (usize, usize), committed: usize, drafts: &[(usize, u32, f32)]) {
        if self.calls == 0 {
            self.first_call_commits = committed;
        }
        self.calls += 1;
        self.last_commits = committed;
        let emptied = !c.x[s..e].contains(&c.special.mask);
        if drafts.is_empty() || !emptied {
            self.report.drafts_dropped += drafts.len() as u64;
            return;
        }
        for &(position, token, confidence) in drafts {
            if confidence >= self.spec_threshold {
                c.x[position] = token;
                c.reveals.push([(position - c.prompt_len) as u32, token]);
                self.report.drafts_accepted += 1;
            } else {
                self.report.drafts_dropped += 1;
            }
        }
    }
}
