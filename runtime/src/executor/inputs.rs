//! What a pass computes, as every backend and the CPU's mixture-of-experts step read it: the
//! rows' inputs ([`RunInputs`]) and where a value lies in the window ([`value_range`]).

use std::ops::Range;

use llada_ir::{Graph, Rows, Value};

/// What one run of a graph needs besides the window: the token rows and which rows' logits
/// to produce.
pub struct RunInputs<'a> {
    /// One token per graph row (padding rows hold any valid token).
    pub tokens: &'a [u32],
    /// Position of each row (indexes the rotary tables and the KV cache).
    pub positions: &'a [u32],
    /// Rows `0..stored_rows` store their keys and values in the cache at their positions;
    /// later rows (speculative rows, revision checks, padding) do not, and attend with their
    /// own key and value at their position instead of the cache's.
    pub stored_rows: usize,
    /// Cache positions `0..context` are the keys every row attends to.
    pub context: usize,
    /// Rows whose logits the sampler needs, in output order.
    pub logit_rows: &'a [u32],
    /// Real rows (`tokens` beyond them pad the graph's rows; row-wise ops may skip them).
    pub rows: usize,
    /// `Some(b)`: a pass over several blocks of LLaDA 2.x's block-causal mask, whose rows lie
    /// in ascending position order: each row attends only to the keys before its block's end,
    /// `(position / b + 1) * b` (at most `context`, [`RunInputs::keys_of`]). Every backend
    /// runs such passes (the NPU's mask and Vulkan's attention shader apply the same rule).
    pub block_causal: Option<usize>,
    /// DiffusionGemma's decoder: the previous step's logits, `[rows, embedding_size]`, that
    /// its self-conditioning input (`Op::SoftEmbed`) reads; `None` on the first step (and for
    /// graphs without one).
    pub soft: Option<&'a [f32]>,
}

impl RunInputs<'_> {
    /// The keys row `r` attends to: the first `context`, or in a block-causal pass those
    /// before the end of its block.
    pub fn keys_of(&self, r: usize) -> usize {
        match self.block_causal {
            Some(b) => ((self.positions[r] as usize / b + 1) * b).min(self.context),
            None => self.context,
        }
    }

    /// The first position of row `r`'s block: in a block-causal pass its block's start, else
    /// the pass's first row's (where a windowed layer's keys count back from).
    pub fn block_start(&self, r: usize) -> usize {
        match self.block_causal {
            Some(b) => self.positions[r] as usize / b * b,
            None => self.positions.first().map_or(0, |&p| p as usize),
        }
    }

    /// The real rows split into runs that attend to the same keys, `(rows, keys)` each in
    /// order: one run of every row over `context` unless the pass is block-causal.
    pub fn key_runs(&self) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> + '_ {
        let keys = move |r: usize| self.keys_of(r);
        let mut start = 0;
        std::iter::from_fn(move || {
            if start >= self.rows {
                return None;
            }
            let k = keys(start);
            let end = (start..self.rows).find(|&r| keys(r) != k).unwrap_or(self.rows);
            let run = (start..end, k);
            start = end;
            Some(run)
        })
    }
}

/// Float range a value occupies in the activation region (which starts at window byte
/// `base`) for this run (head values use only the rows asked for).
pub fn value_range(g: &Graph, v: &Value, logit_rows: usize, base: u64) -> Range<usize> {
    let rows = match v.rows {
        Rows::Tokens => g.rows as usize,
        Rows::Logits => logit_rows,
    };
    let start = ((v.offset - base) / 4) as usize;
    start..start + rows * v.cols as usize
}

#[cfg(test)]
mod tests {
    use super::RunInputs;

    #[test]
    fn block_causal_rows_run_by_the_end_of_their_block() {
        let positions: Vec<u32> = (8..30).collect();
        let inp = |block_causal, rows| RunInputs { tokens: &[], positions: &positions, stored_rows: rows, context: 28, logit_rows: &[], rows, block_causal, soft: None };
        let runs = |i: &RunInputs| i.key_runs().collect::<Vec<_>>();
        // Rows at 8..28 in blocks of 8: 8..16 see 16 keys, 16..24 see 24, 24..28 the context.
        assert_eq!(runs(&inp(Some(8), 20)), vec![(0..8, 16), (8..16, 24), (16..20, 28)]);
        // Otherwise every row sees the context; no rows, no runs.
        assert_eq!(runs(&inp(None, 20)), vec![(0..20, 28)]);
        assert!(runs(&inp(Some(8), 0)).is_empty());
    }
}
