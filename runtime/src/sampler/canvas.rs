//! What every policy shares over a generation: the canvas being denoised, where the
//! generation is, its records, and the `PolicyStep` a policy implements. The generator, which
//! owns the policy and the canvas, drives the steps.

use llada_ir::SpecialTokens;

use super::ask::{Ask, SideChecks};
use super::{commits_per_step, Candidate, Generation, Policy, Predictor, SamplerParams, StepView};
use crate::error::{Error, Result};
use super::ask::Predict;
use crate::topk::topk_in;

/// A policy as a state machine over the canvas: a step of block `c.block` (its step `c.i`,
/// committing `c.scheduled` positions, or as the threshold rule says) is a sequence of asks
/// (`next`), each pass's logits handed back (`logits`), until the policy answers
/// [`Ask::Done`]. Which rows each pass computes and what follows from its predictions are the
/// policy's; the block schedule, the records and the view are the generator's; the passes
/// are the session's.
pub(crate) trait PolicyStep: Send {
    /// What the current step needs next; [`Ask::Done`] ends it.
    fn next<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>>;
    /// The logits of the pass the last [`next`](Self::next) asked for.
    fn logits(&mut self, c: &mut Canvas, logits: &[f32]) -> Result<()>;
    /// What the side lane's merge brought back (`None`: no job was running), for a policy
    /// that asks [`Ask::MergeSide`].
    fn side_checks(&mut self, _c: &mut Canvas, _checks: Option<SideChecks>) -> Result<()> {
        Err(Error::Internal("a policy without a side lane was handed its checks".to_string()))
    }
    /// The side lane the policy uses, if any: tokens checked per job, and the rule that
    /// predicts a checked position.
    fn side_lane(&self) -> Option<(usize, Predict)> {
        None
    }
    /// Adds what the policy reports to the finished generation.
    fn report(&mut self, _g: &mut Generation) {}
}

/// The error of a policy handed a reply it did not ask for (the generator's loop keeps the
/// turns: a pass's logits, then the next ask).
pub(crate) fn out_of_turn() -> Error {
    Error::Internal("a policy was handed a reply it did not ask for".to_string())
}

/// The state every policy shares, in buffers sized when the generation starts.
pub(crate) struct Canvas {
    pub(crate) p: SamplerParams,
    pub(crate) special: SpecialTokens,
    /// Prompt then generation, masks where nothing is committed.
    pub(crate) x: Vec<u32>,
    pub(crate) prompt_len: usize,
    pub(crate) steps_per_block: usize,
    pub(crate) blocks: usize,
    /// The current block, the step within it, and the commits its schedule gives each step.
    pub(crate) block: usize,
    pub(crate) i: usize,
    /// The commits the schedule gives the current step.
    pub(crate) scheduled: usize,
    schedule: Vec<usize>,
    block_started: bool,
    /// The schedule ends a block when its steps are taken; the dynamic rules (a threshold,
    /// drafts, `mbsd`) when the block is full.
    dynamic: bool,
    /// Steps taken.
    pub(crate) step: usize,
    /// Every step's commits and revisions, `[position in generation, token]`, flat, and
    /// where each step's end.
    pub(crate) reveals: Vec<[u32; 2]>,
    reveal_ends: Vec<usize>,
    pub(crate) revisions: Vec<[u32; 2]>,
    revision_ends: Vec<usize>,
    /// Leading generated positions that can no longer change (set by the policy's step).
    pub(crate) settled: usize,
    /// Draft per position (`spec`, `mbsd`): the token predicted while its block was speculative.
    pub(crate) drafts: Vec<Option<u32>>,
    pub(crate) drafts_confirmed: u64,
    pub(crate) predictor: Predictor,
    pub(crate) candidates: Vec<Candidate>,
    /// Positions whose logits a pass returns.
    pub(crate) logit_rows: Vec<u32>,
    selection: Selection,
    /// The policy keeps its own schedule (LLaDA 2.x's): a step runs until it sets `done`.
    pub(crate) own_schedule: bool,
    pub(crate) done: bool,
    /// Where the returned generation ends (LLaDA 2.x's, at its first EOS), if not at the end.
    pub(crate) output_end: Option<usize>,
}

/// `commit_best`'s working memory: the whole sequence's confidences as the official `topk`
/// sees them.
struct Selection {
    confidence: Vec<f32>,
    token: Vec<Option<u32>>,
    queue: Vec<(f32, usize)>,
}

impl Canvas {
    /// The canvas of a generation of `prompt` with `p` (`steps_per_block` from its
    /// validation), every buffer sized for the whole generation; `revised_per_step`: the
    /// most revisions one step can make (the tokens a side pass checks; 0 without one).
    pub(super) fn new(p: &SamplerParams, steps_per_block: usize, prompt: &[u32], special: SpecialTokens, predictor: Predictor, revised_per_step: usize) -> Canvas {
        let len = prompt.len() + p.gen_length;
        let blocks = p.gen_length / p.block_length;
        let drafting = matches!(p.policy, Policy::Spec | Policy::Mbsd) && p.spec_blocks > 0;
        let dynamic = p.policy == Policy::Mbsd || p.threshold.is_some() || drafting;
        // The schedule takes `steps`; a dynamic rule commits at least one token a step.
        let most_steps = if dynamic { p.gen_length } else { p.steps };
        Canvas {
            x: prompt.iter().copied().chain(std::iter::repeat_n(special.mask, p.gen_length)).collect(),
            special,
            prompt_len: prompt.len(),
            steps_per_block,
            blocks,
            block: 0,
            i: 0,
            scheduled: 0,
            schedule: Vec::with_capacity(steps_per_block),
            block_started: false,
            dynamic,
            step: 0,
            // Each position is committed once (revisions replace tokens, never re-mask them).
            reveals: Vec::with_capacity(p.gen_length),
            reveal_ends: Vec::with_capacity(most_steps),
            revisions: Vec::with_capacity(most_steps * revised_per_step),
            revision_ends: Vec::with_capacity(most_steps),
            settled: 0,
            drafts: vec![None; len],
            drafts_confirmed: 0,
            predictor,
            candidates: Vec::with_capacity(len),
            logit_rows: Vec::with_capacity(len),
            selection: Selection { confidence: vec![f32::NEG_INFINITY; len], token: vec![None; len], queue: Vec::with_capacity(len) },
            own_schedule: false,
            done: false,
            output_end: None,
            p: *p,
        }
    }

    /// Closes the step just taken: its records end here.
    pub(crate) fn end_step(&mut self) {
        self.i += 1;
        self.step += 1;
        self.reveal_ends.push(self.reveals.len());
        self.revision_ends.push(self.revisions.len());
    }

    pub(crate) fn reveals_per_step(&self) -> Vec<Vec<[u32; 2]>> {
        Canvas::per_step(&self.reveals, &self.reveal_ends)
    }

    pub(crate) fn revisions_per_step(&self) -> Vec<Vec<[u32; 2]>> {
        Canvas::per_step(&self.revisions, &self.revision_ends)
    }

    /// First and one-past-last position of the current block.
    pub(crate) fn block_range(&self) -> (usize, usize) {
        let start = self.prompt_len + self.block * self.p.block_length;
        (start, start + self.p.block_length)
    }

    /// Commits the top `scheduled` candidates by confidence (or as the threshold rule says)
    /// into `x` and this step's reveals, in the order they are selected. The selection is the
    /// official one: PyTorch's `topk` over the whole sequence's confidences, `-inf` where a
    /// position is not a candidate (`topk.rs`), so equal confidences at the k boundary are
    /// chosen as the official code chooses them. A position `topk` returns that is not a
    /// candidate (a draft was confirmed there, leaving fewer candidates than `k`) is kept as
    /// it is, as `torch.where(mask_index, x0, x)` keeps it.
    pub(crate) fn commit_best(&mut self, scheduled: usize) {
        let k = match self.p.threshold {
            Some(t) => self.candidates.iter().filter(|c| c.confidence >= t).count().max(1),
            None => scheduled,
        };
        self.commit_ranked(0..self.x.len(), k, |_, _| true);
    }

    /// Settles the drafts against this pass's `candidates` (its predictions, in head order):
    /// one after `block_end` becomes its position's draft (the latest wins) and stops being a
    /// candidate; a current one with a draft accepts it, committing it now, when it predicts
    /// the same token with confidence at least `spec_threshold`, and drops it otherwise; every
    /// current one not committed stays a candidate. Returns the drafts accepted and dropped.
    pub(crate) fn settle_drafts(&mut self, block_end: usize) -> (u64, u64) {
        let (mut accepted, mut dropped) = (0, 0);
        let Canvas { candidates, drafts, x, reveals, prompt_len, p, .. } = self;
        candidates.retain(|k| {
            if k.position >= block_end {
                drafts[k.position] = Some(k.token);
                return false;
            }
            match drafts[k.position].take() {
                Some(d) if d == k.token && k.confidence >= p.spec_threshold => {
                    x[k.position] = k.token;
                    reveals.push([(k.position - *prompt_len) as u32, k.token]);
                    accepted += 1;
                    false
                }
                Some(_) => {
                    dropped += 1;
                    true
                }
                None => true,
            }
        });
        self.drafts_confirmed += accepted;
        (accepted, dropped)
    }

    /// PyTorch's `topk(k)` over the confidences of positions `span` (`-inf` where a position
    /// is not a candidate; every candidate lies in `span`): commits, in rank order, the
    /// candidates it returns that `keep(rank, confidence)` accepts. The span is the vector
    /// the reference ranks: the whole sequence for the official samplers; Fast-dLLM's Dream
    /// block code ranks the block and what follows it (`prefix`) or the block (`dual`), and
    /// among equal confidences which one `topk` picks depends on that vector.
    pub(crate) fn commit_ranked(&mut self, span: std::ops::Range<usize>, k: usize, keep: impl Fn(usize, f32) -> bool) {
        let s = &mut self.selection;
        s.confidence.fill(f32::NEG_INFINITY);
        s.token.fill(None);
        for c in &self.candidates {
            debug_assert!(span.contains(&c.position));
            s.confidence[c.position] = c.confidence;
            s.token[c.position] = Some(c.token);
        }
        let base = span.start;
        for (rank, i) in topk_in(&s.confidence[span], k, &mut s.queue).enumerate() {
            let position = base + i;
            if let Some(t) = s.token[position].filter(|_| keep(rank, s.confidence[position])) {
                self.x[position] = t;
                self.reveals.push([(position - self.prompt_len) as u32, t]);
            }
        }
    }

    /// Begins the next step, setting its `scheduled` commits; `false` when the generation is
    /// over. Moves to the next block when the current one is done.
    pub(crate) fn begin_step(&mut self) -> bool {
        if self.own_schedule {
            self.scheduled = 0;
            return !self.done;
        }
        let mask = self.special.mask;
        loop {
            if self.block == self.blocks {
                return false;
            }
            let (start, end) = self.block_range();
            if !self.block_started {
                let masked = self.x[start..end].iter().filter(|&&t| t == mask).count();
                commits_per_step(masked, self.steps_per_block, &mut self.schedule);
                self.block_started = true;
            }
            let scheduled = if self.dynamic {
                self.x[start..end].contains(&mask).then(|| self.schedule.get(self.i).copied().unwrap_or(1).max(1))
            } else {
                self.schedule.get(self.i).copied()
            };
            if let Some(scheduled) = scheduled {
                self.scheduled = scheduled;
                return true;
            }
            self.block += 1;
            self.i = 0;
            self.block_started = false;
        }
    }

    pub(crate) fn view(&self) -> StepView<'_> {
        let n = self.reveal_ends.len();
        let step_range = |ends: &[usize]| if n == 0 { 0..0 } else { n.checked_sub(2).map_or(0, |i| ends[i])..ends[n - 1] };
        StepView {
            step: self.step,
            steps: self.p.steps,
            canvas: &self.x,
            prompt_len: self.prompt_len,
            committed: &self.reveals[step_range(&self.reveal_ends)],
            revised: &self.revisions[step_range(&self.revision_ends)],
            settled: self.settled,
        }
    }

    /// Every step's records, one list per step.
    fn per_step(flat: &[[u32; 2]], ends: &[usize]) -> Vec<Vec<[u32; 2]>> {
        let mut start = 0;
        ends.iter()
            .map(|&end| {
                let step = flat[start..end].to_vec();
                start = end;
                step
            })
            .collect()
    }
}

