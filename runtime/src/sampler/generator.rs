//! The stepping interface: a generation as a state machine, one dense pass and its commits
//! (and revisions) per [`Generator::step`]. `generate`, streaming, cancellation and the C
//! API's callback are loops over it; a policy is a [`PolicyStep`] (one file each).
//!
//! Everything a step touches is sized in [`Generator::start`]: the steps themselves allocate
//! nothing (the `alloc` end-to-end test counts).

use std::time::Instant;

use llada_ir::SpecialTokens;

use super::{check_prompt, commits_per_step, mbsd, official, Candidate, Generation, Limits, Policy, Predictor, SamplerParams, StepView};
use crate::error::{Error, Result};
use crate::session::{Counters, Session};
use crate::topk::topk_in;

/// One policy's part of a step: which rows the pass computes, and what follows from its
/// predictions. The block schedule, the records and the view are the generator's.
pub(crate) trait PolicyStep: Send {
    /// One step of block `c.block` (its step `c.i`), committing `scheduled` positions (or as
    /// the threshold rule says) into `c`.
    fn step(&mut self, session: &mut Session, c: &mut Canvas, scheduled: usize) -> Result<()>;
    /// Adds what the policy reports to the finished generation.
    fn report(&mut self, _g: &mut Generation) {}
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
    pub(crate) head: Vec<u32>,
    selection: Selection,
}

/// `commit_best`'s working memory: the whole sequence's confidences as the official `topk`
/// sees them.
struct Selection {
    confidence: Vec<f32>,
    token: Vec<Option<u32>>,
    queue: Vec<(f32, usize)>,
}

impl Canvas {
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
        let s = &mut self.selection;
        s.confidence.fill(f32::NEG_INFINITY);
        s.token.fill(None);
        for c in &self.candidates {
            s.confidence[c.position] = c.confidence;
            s.token[c.position] = Some(c.token);
        }
        for position in topk_in(&s.confidence, k, &mut s.queue) {
            if let Some(t) = s.token[position] {
                self.x[position] = t;
                self.reveals.push([(position - self.prompt_len) as u32, t]);
            }
        }
    }

    /// The step's `scheduled` commits, or `None` when the generation is over; moves to the
    /// next block when the current one is done.
    fn next_step(&mut self) -> Option<usize> {
        let mask = self.special.mask;
        loop {
            if self.block == self.blocks {
                return None;
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
            if scheduled.is_some() {
                return scheduled;
            }
            self.block += 1;
            self.i = 0;
            self.block_started = false;
        }
    }

    fn view(&self) -> StepView<'_> {
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

/// A generation in progress over a session: [`start`](Self::start) it, call
/// [`step`](Self::step) until it returns `None`, then [`finish`](Self::finish). Dropping it
/// part-way leaves the session usable (the next generation starts afresh).
pub struct Generator<'s, 'm> {
    session: &'s mut Session<'m>,
    canvas: Canvas,
    policy: Box<dyn PolicyStep>,
    start: Instant,
    before: Counters,
    /// A step failed: the generation cannot go on.
    failed: bool,
}

impl<'s, 'm> Generator<'s, 'm> {
    /// Checks the request against the session's plan and sizes everything the steps use.
    pub fn start(session: &'s mut Session<'m>, prompt: &[u32], p: &SamplerParams) -> Result<Generator<'s, 'm>> {
        let steps_per_block = p.validate(&Limits::of(session.model))?;
        let special = session.model.header.special.clone();
        check_prompt(prompt, special.mask)?;
        let len = prompt.len() + p.gen_length;
        let capacity = session.head_capacity(len)?;
        if p.block_length > capacity {
            return Err(Error::request(format!(
                "--block-len {} needs {} logit rows per pass but {} was compiled for {capacity}; \
                 use --block-len {capacity} or less, or recompile with `lladac compile --head-rows {}`",
                p.block_length,
                p.block_length,
                session.model.path.display(),
                p.block_length
            )));
        }
        let blocks = p.gen_length / p.block_length;
        // A block takes its scheduled steps, or at most one per token under a dynamic rule
        // (every step then commits at least one).
        let most_steps = blocks * steps_per_block.max(p.block_length);
        let spec_blocks = if matches!(p.policy, Policy::Spec | Policy::Mbsd) { p.spec_blocks } else { 0 };
        let policy: Box<dyn PolicyStep> = match p.policy {
            Policy::Mbsd => Box::new(mbsd::Mbsd::new(session, p, len)?),
            _ => Box::new(official::Official::new(p, prompt, len, special.mask)),
        };
        let canvas = Canvas {
            special,
            x: prompt.iter().copied().chain(std::iter::repeat_n(session.model.header.special.mask, p.gen_length)).collect(),
            prompt_len: prompt.len(),
            steps_per_block,
            blocks,
            block: 0,
            i: 0,
            schedule: Vec::with_capacity(steps_per_block),
            block_started: false,
            dynamic: p.policy == Policy::Mbsd || p.threshold.is_some() || spec_blocks > 0,
            step: 0,
            // Each position is committed once (revisions replace tokens, never re-mask them).
            reveals: Vec::with_capacity(p.gen_length),
            reveal_ends: Vec::with_capacity(most_steps),
            revisions: Vec::with_capacity(if p.policy == Policy::Mbsd { most_steps * p.gen_length.min(p.side_rows.unwrap_or(p.gen_length)) } else { 0 }),
            revision_ends: Vec::with_capacity(most_steps),
            settled: 0,
            drafts: vec![None; len],
            drafts_confirmed: 0,
            predictor: Predictor::for_session(session, p.block_length * (1 + spec_blocks)),
            candidates: Vec::with_capacity(len),
            head: Vec::with_capacity(len),
            selection: Selection { confidence: vec![f32::NEG_INFINITY; len], token: vec![None; len], queue: Vec::with_capacity(len) },
            p: *p,
        };
        let before = session.counters;
        Ok(Generator { session, canvas, policy, start: Instant::now(), before, failed: false })
    }

    /// Runs the next step: one dense pass (none where the schedule commits nothing) and its
    /// commits and revisions. `None` once the generation is complete.
    pub fn step(&mut self) -> Result<Option<StepView<'_>>> {
        if self.failed {
            return Err(Error::request("a step of this generation failed: start a new one".to_string()));
        }
        let Some(scheduled) = self.canvas.next_step() else { return Ok(None) };
        let (session, canvas, policy) = (&mut *self.session, &mut self.canvas, &mut self.policy);
        // The whole step on a thread of the session's pool: the kernels' parallel loops then
        // start from inside it, not as jobs sent from outside, which rayon queues in
        // allocated blocks.
        let run = session.pool_handle().install(|| policy.step(session, canvas, scheduled));
        if let Err(e) = run {
            self.failed = true;
            return Err(e);
        }
        let c = &mut self.canvas;
        c.i += 1;
        c.step += 1;
        c.reveal_ends.push(c.reveals.len());
        c.revision_ends.push(c.revisions.len());
        Ok(Some(c.view()))
    }

    /// The state after the last step.
    pub fn view(&self) -> StepView<'_> {
        self.canvas.view()
    }

    /// What the generation did (called before it is complete: what it did so far).
    pub fn finish(mut self) -> Generation {
        let c = &self.canvas;
        let mut g = Generation {
            prompt_ids: c.x[..c.prompt_len].to_vec(),
            output_ids: c.x[c.prompt_len..].to_vec(),
            reveals: Canvas::per_step(&c.reveals, &c.reveal_ends),
            revisions: None,
            forward_passes: self.session.counters.forward_passes - self.before.forward_passes,
            rows_computed: self.session.counters.rows_computed - self.before.rows_computed,
            drafts_confirmed: c.drafts_confirmed,
            seconds: self.start.elapsed().as_secs_f64(),
            mbsd: None,
        };
        self.policy.report(&mut g);
        if g.revisions.is_some() {
            g.revisions = Some(Canvas::per_step(&c.revisions, &c.revision_ends));
        }
        g
    }
}
