//! What a policy asks of the session that runs it, and what comes back. A policy is a state
//! machine over the canvas: the generator (`generator.rs`, outside `sampler/`) asks it what
//! the step needs next, has the session do it, and hands the policy the reply; a policy never
//! holds the session, an executor or a window.

use std::ops::Range;
use std::sync::Arc;

use crate::model::Model;
use crate::params::SamplerParams;
use crate::pool::Pool;
use llada_ir::SpecialTokens;

/// What a check row's logits predict at a position: (token, confidence), given the
/// generation's settings, its special tokens and the step (the revising policy's rule, which
/// the side lane runs).
pub(crate) type Predict = fn(row: &mut [f32], p: &SamplerParams, special: &SpecialTokens, step: usize, position: usize) -> (u32, f32);

/// Rows of a row-set pass: positions and input tokens, the `stored` ones first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowSet {
    pub positions: Vec<u32>,
    pub tokens: Vec<u32>,
    pub stored: usize,
}

impl RowSet {
    pub fn clear(&mut self) {
        self.positions.clear();
        self.tokens.clear();
        self.stored = 0;
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Appends a row; stored rows must all come before the others.
    pub fn push(&mut self, position: usize, token: u32, store: bool) {
        debug_assert!(!store || self.stored == self.positions.len(), "stored rows come first");
        self.positions.push(position as u32);
        self.tokens.push(token);
        self.stored += usize::from(store);
    }
}

/// A dense pass: which rows of which sequence it computes, and whose logits come back.
pub(crate) enum PassRequest<'a> {
    /// Positions `span` of `seq` (all of it: a whole-sequence pass, which refills the cache);
    /// logits at `logit_positions`.
    Span { seq: &'a [u32], span: Range<usize>, logit_positions: &'a [u32] },
    /// A block-causal pass over the blocks of `block_len` from `from` to the end of `seq`
    /// (LLaDA 2.x); logits at `logit_positions`.
    Blocks { seq: &'a [u32], from: usize, block_len: usize, logit_positions: &'a [u32] },
    /// A block-causal pass over rows at `positions` of `seq`; logits of rows `logit_rows`
    /// (indexes into `positions`).
    BlockRows { seq: &'a [u32], positions: &'a [u32], block_len: usize, logit_rows: &'a [u32] },
    /// A row-set pass over `rows` of a `seq_len` sequence, on the graph of `bucket` rows;
    /// logits of rows `logit_rows` (indexes into the rows).
    Rows { seq_len: usize, rows: &'a RowSet, bucket: usize, logit_rows: &'a [u32] },
    /// DiffusionGemma's decoder over the canvas `tokens` at positions from `start`, with the
    /// previous step's logits as its self-conditioning input; logits of every canvas row.
    Canvas { start: usize, tokens: &'a [u32], soft: Option<&'a [f32]> },
}

/// What a policy's step needs next.
pub(crate) enum Ask<'a> {
    /// Nothing: the step is over (the next `next` begins the next step).
    Done,
    /// A dense pass, whose logits go to [`PolicyStep::logits`](super::canvas::PolicyStep::logits).
    Pass(PassRequest<'a>),
    /// The keys and values of `seq`'s blocks of `block_len` from `from` on, stored by
    /// block-causal passes without logits.
    StoreBlocks { seq: &'a [u32], from: usize, block_len: usize },
    /// The side lane's merge point after a dense pass that stored `dense_stored`: what its
    /// job checked goes to [`PolicyStep::side_checks`](super::canvas::PolicyStep::side_checks).
    MergeSide { dense_stored: &'a [u32] },
    /// A side job, run beside the next dense pass.
    LaunchSide(SideJob<'a>),
    /// DiffusionGemma's encoder over positions `span` of `seq`: their keys and values stored
    /// (causal), no logits.
    Encode { seq: &'a [u32], span: Range<usize> },
}

/// A revision job for the side lane: the committed `tokens` at `checked` positions of a
/// `seq_len` sequence (Dream: and the tokens `before` them), predicted with `params` at noise
/// step `step`.
pub(crate) struct SideJob<'a> {
    pub(crate) checked: &'a [u32],
    pub(crate) tokens: &'a [u32],
    pub(crate) before: &'a [u32],
    pub(crate) seq_len: usize,
    pub(crate) params: SamplerParams,
    pub(crate) step: usize,
}

/// What a merged side job brought back: each checked position's prediction and confidence,
/// the positions whose keys and values the merge refreshed in the dense cache (those the dense
/// pass did not store), the time the dense path waited for the job and the job's own time.
pub(crate) struct SideChecks<'a> {
    pub(crate) checked: &'a [u32],
    pub(crate) predictions: &'a [(u32, f32)],
    pub(crate) fresh: &'a [u32],
    pub(crate) waited_seconds: f64,
    pub(crate) side_seconds: f64,
}

/// What a policy may know of where its passes run: the artifact (its plan and graphs), what
/// the backend charges for rows, and the pool its predictions run on.
pub(crate) struct PassContext {
    pub(crate) model: Arc<Model>,
    /// The backend's clock is the CPU's that also runs the side lane.
    pub(crate) runs_on_cpu: bool,
    /// A pass costs every row it computes, and only those.
    pub(crate) cost_per_row: bool,
    pub(crate) pool: Pool,
}

/// The logit rows each graph returns, by the rows it computes (the plan's `by_rows` order):
/// how many blocks one pass can hold with their logits.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogitCapacity(Vec<(usize, usize)>);

impl LogitCapacity {
    pub(crate) fn of_model(model: &Model) -> LogitCapacity {
        let h = &model.header;
        LogitCapacity(h.plan.by_rows.iter().filter_map(|&g| h.graphs.get(g as usize)).map(|g| (g.rows as usize, g.logit_rows as usize)).collect())
    }

    /// Whether the graph that computes `rows` positions (the smallest that holds them)
    /// returns at least `logit_rows` logit rows.
    pub(crate) fn fits(&self, rows: usize, logit_rows: usize) -> bool {
        self.0.iter().find(|&&(r, _)| r >= rows).is_some_and(|&(_, l)| l >= logit_rows)
    }
}
