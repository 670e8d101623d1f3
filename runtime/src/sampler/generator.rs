//! The stepping interface: a generation as a state machine, one dense pass and its commits
//! (and revisions) per [`Generator::step`]. `generate`, streaming, cancellation and the C
//! API's callback are loops over it; a policy is a [`PolicyStep`] (one file each).
//!
//! Everything a step touches is sized in [`Generator::start`], so the steps allocate nothing
//! of their own (the `alloc` end-to-end test counts; what remains is rayon's queue block for
//! the step's entry into the pool, one per 63 steps, and the labels of a trace when tracing).

use std::time::Instant;

use super::canvas::{Canvas, PolicyStep};
use super::{check_prompt, dream, llada2, mbsd, official, Generation, Limits, Policy, Predictor, SamplerParams, StepView};
use crate::error::{Error, Result};
use crate::session::{Counters, Session};

/// A generation in progress over a session: [`start`](Self::start) it, call
/// [`step`](Self::step) until it returns `None`, then [`finish`](Self::finish). Dropping it
/// part-way leaves the session usable (the next generation starts afresh).
pub struct Generator<'s> {
    session: Lent<'s>,
    canvas: Canvas,
    policy: Box<dyn PolicyStep>,
    start: Instant,
    before: Counters,
    /// A step failed: the generation cannot go on.
    failed: bool,
}

/// The session a generation runs on: borrowed for it, or owned by it. A front end that drives
/// a generation one step at a time from elsewhere (Python's step iterator) hands the generator
/// its session ([`Generator::start_owned`]) and takes it back when it ends
/// ([`Generator::end`]).
enum Lent<'s> {
    Borrowed(&'s mut Session),
    Owned(Box<Session>),
}

impl std::ops::Deref for Lent<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        match self {
            Lent::Borrowed(s) => s,
            Lent::Owned(s) => s,
        }
    }
}

impl std::ops::DerefMut for Lent<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        match self {
            Lent::Borrowed(s) => s,
            Lent::Owned(s) => s,
        }
    }
}

/// What a generation starts with, made while the session is borrowed.
struct Prepared {
    canvas: Canvas,
    policy: Box<dyn PolicyStep>,
    before: Counters,
}

/// Refuses a block of `block_length` logit rows when the graph that computes `rows` positions
/// returns fewer.
fn check_logit_rows(session: &Session, rows: usize, block_length: usize) -> Result<()> {
    let capacity = session.logit_capacity(rows)?;
    if block_length > capacity {
        return Err(Error::request(format!(
            "--block-len {block_length} needs {block_length} logit rows per pass but {} was compiled for {capacity}; \
             use --block-len {capacity} or less, or recompile with `lladac compile --logit-rows {block_length}`",
            session.model.path.display(),
        )));
    }
    Ok(())
}

impl<'s> Generator<'s> {
    /// Checks the request against the session's plan and sizes everything the steps use.
    pub fn start(session: &'s mut Session, prompt: &[u32], p: &SamplerParams) -> Result<Generator<'s>> {
        let ready = Generator::prepare(session, prompt, p)?;
        Ok(Generator::over(Lent::Borrowed(session), ready))
    }

    fn over(session: Lent<'s>, ready: Prepared) -> Generator<'s> {
        Generator { session, canvas: ready.canvas, policy: ready.policy, start: Instant::now(), before: ready.before, failed: false }
    }

    fn prepare(session: &mut Session, prompt: &[u32], p: &SamplerParams) -> Result<Prepared> {
        let steps_per_block = p.validate(&Limits::of(&session.model))?;
        let special = session.model.header.special.clone();
        check_prompt(prompt, special.mask)?;
        if session.model.family() == llada_ir::Family::Llada2Moe {
            return Generator::start_llada2(session, prompt, p, special, steps_per_block);
        }
        let len = prompt.len() + p.gen_length;
        check_logit_rows(session, len, p.block_length)?;
        let spec_blocks = if matches!(p.policy, Policy::Spec | Policy::Mbsd) { p.spec_blocks } else { 0 };
        let (policy, revised_per_step): (Box<dyn PolicyStep>, usize) = match p.policy {
            Policy::Mbsd => {
                let m = mbsd::Mbsd::new(session, p, steps_per_block, len)?;
                let checked = m.checked_per_step();
                (Box::new(m), checked)
            }
            // Dream's own sampler, unblocked or blocked as Fast-dLLM blocks it.
            _ if session.model.is_dream() => (Box::new(dream::Dream::new(p, steps_per_block)), 0),
            _ => (Box::new(official::Official::new(p, prompt, len, special.mask)), 0),
        };
        let predictor = Predictor::for_session(session, p.block_length * (1 + spec_blocks));
        let canvas = Canvas::new(p, steps_per_block, prompt, special, predictor, revised_per_step);
        Ok(Prepared { canvas, policy, before: session.counters })
    }

    /// LLaDA 2.x's published `generate` (`llada2.rs`): its canvas is the block grid from
    /// position 0, the prompt's partial block included.
    fn start_llada2(session: &mut Session, prompt: &[u32], p: &SamplerParams, special: llada_ir::SpecialTokens, steps: usize) -> Result<Prepared> {
        let mut policy = llada2::Llada2::new(p, prompt.len(), steps, special.eos);
        if p.policy == Policy::Mbsd {
            policy = policy.speculate(p);
        }
        let grid = policy.grid_len();
        let limit = Limits::of(&session.model).max_len;
        if grid > limit {
            return Err(Error::request(format!(
                "the prompt ({} tokens) and --gen-len {} fill {grid} positions of {}-token blocks, more than the {limit} {} holds",
                prompt.len(),
                p.gen_length,
                p.block_length,
                session.model.path.display()
            )));
        }
        // A block pass runs on the graph of the block's rows and returns a row per position.
        check_logit_rows(session, p.block_length, p.block_length)?;
        let canvas_p = SamplerParams { gen_length: grid - prompt.len(), ..*p };
        let predictor = Predictor::for_session(session, policy.logit_rows());
        let mut canvas = Canvas::new(&canvas_p, steps, prompt, special, predictor, policy.revised_per_step());
        canvas.own_schedule = true;
        Ok(Prepared { canvas, policy: Box::new(policy), before: session.counters })
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
        // Failed until it succeeds: a step left half done (an error, a caught panic) ends
        // the generation.
        self.failed = true;
        session.pool_handle().install(|| policy.step(session, canvas, scheduled))?;
        self.failed = false;
        self.canvas.end_step();
        Ok(Some(self.canvas.view()))
    }

    /// The state after the last step.
    pub fn view(&self) -> StepView<'_> {
        self.canvas.view()
    }

    /// What the generation did (called before it is complete: what it did so far; after a
    /// failed step, `output_ids` may hold commits of that step which `reveals` lacks).
    pub fn finish(self) -> Generation {
        self.end().0
    }

    /// [`finish`](Self::finish), and the session if the generator owns it.
    pub fn end(mut self) -> (Generation, Option<Box<Session>>) {
        let c = &self.canvas;
        let mut g = Generation {
            prompt_ids: c.x[..c.prompt_len].to_vec(),
            output_ids: c.x[c.prompt_len..c.output_end.unwrap_or(c.x.len()).max(c.prompt_len)].to_vec(),
            reveals: c.reveals_per_step(),
            revisions: None,
            forward_passes: self.session.counters.forward_passes - self.before.forward_passes,
            rows_computed: self.session.counters.rows_computed - self.before.rows_computed,
            drafts_confirmed: c.drafts_confirmed,
            seconds: self.start.elapsed().as_secs_f64(),
            mbsd: None,
        };
        self.policy.report(&mut g);
        if g.revisions.is_some() {
            g.revisions = Some(c.revisions_per_step());
        }
        let session = match self.session {
            Lent::Owned(s) => Some(s),
            Lent::Borrowed(_) => None,
        };
        (g, session)
    }
}

impl Generator<'static> {
    /// [`start`](Self::start) on a session the generator owns until [`end`](Self::end); on
    /// failure the session comes back with the error.
    pub fn start_owned(mut session: Box<Session>, prompt: &[u32], p: &SamplerParams) -> std::result::Result<Generator<'static>, (Error, Box<Session>)> {
        match Generator::prepare(&mut session, prompt, p) {
            Ok(ready) => Ok(Generator::over(Lent::Owned(session), ready)),
            Err(e) => Err((e, session)),
        }
    }
}
