//! The stepping interface: a generation as a loop of steps over a session. Each
//! [`Generator::step`] asks the policy (a state machine over the canvas, `sampler/`) what the
//! step needs, has the session do it (a dense pass, stores, the side lane's merge or launch)
//! and hands the policy the reply, until the policy says the step is done. `generate`,
//! streaming, cancellation and the C API's callback are loops over it.
//!
//! Everything a step touches is sized in [`Generator::start`], so the steps allocate nothing
//! of their own (the `alloc` end-to-end test counts; what remains is rayon's queue block for
//! the step's entry into the pool, one per 63 steps, and the labels of a trace when tracing).

use std::ops::ControlFlow;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::sampler::{Ask, Canvas, Generation, PassContext, PassRequest, PolicyStep, SamplerParams, StepView};
use crate::session::{Counters, Session};

/// What a generation starts with, made while the session is borrowed.
struct Prepared {
    canvas: Canvas,
    policy: Box<dyn PolicyStep>,
    before: Counters,
}

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
        let caps = session.backend();
        let ctx = PassContext { model: session.model.clone(), runs_on_cpu: caps.runs_on_cpu, cost_per_row: caps.cost_per_row, pool: session.pool_handle() };
        let start = crate::sampler::start(&ctx, prompt, p)?;
        if let Some((per_job, predict)) = start.policy.side_lane() {
            session.begin_side_lane(per_job, predict)?;
        }
        Ok(Prepared { canvas: start.canvas, policy: start.policy, before: session.counters })
    }

    /// Runs the next step: its dense passes (usually one; none where the schedule commits
    /// nothing) and its commits and revisions. `None` once the generation is complete.
    pub fn step(&mut self) -> Result<Option<StepView<'_>>> {
        if self.failed {
            return Err(Error::request("a step of this generation failed: start a new one".to_string()));
        }
        if !self.canvas.begin_step() {
            return Ok(None);
        }
        let (session, canvas, policy) = (&mut *self.session, &mut self.canvas, &mut *self.policy);
        // The whole step on a thread of the session's pool: the kernels' parallel loops then
        // start from inside it, not as jobs sent from outside, which rayon queues in
        // allocated blocks.
        // Failed until it succeeds: a step left half done (an error, a caught panic) ends
        // the generation.
        self.failed = true;
        session.pool_handle().install(|| run_step(session, policy, canvas))?;
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
            denoising_steps_per_canvas: None,
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

/// One step: the policy's asks, each done by the session and its reply handed back, until the
/// policy says the step is done.
fn run_step(session: &mut Session, policy: &mut dyn PolicyStep, c: &mut Canvas) -> Result<()> {
    loop {
        match policy.next(c)? {
            Ask::Done => return Ok(()),
            Ask::Pass(pass) => {
                let logits = run_pass(session, pass)?;
                policy.logits(c, logits)?;
            }
            Ask::StoreBlocks { seq, from, block_len } => session.store_blocks(seq, from, block_len)?,
            Ask::MergeSide { dense_stored } => {
                let checks = session.merge_side(dense_stored)?;
                policy.side_checks(c, checks)?;
            }
            Ask::LaunchSide(job) => session.launch_side(&job)?,
            Ask::Encode { seq, span } => session.encode(seq, span)?,
        }
    }
}

/// The session's pass for a policy's request.
fn run_pass<'s>(session: &'s mut Session, pass: PassRequest) -> Result<&'s [f32]> {
    match pass {
        PassRequest::Span { seq, span, logit_positions } => session.forward_span(seq, span, logit_positions),
        PassRequest::Blocks { seq, from, block_len, logit_positions } => session.forward_blocks(seq, from, block_len, logit_positions),
        PassRequest::BlockRows { seq, positions, block_len, logit_rows } => session.forward_block_rows(seq, positions, block_len, logit_rows),
        PassRequest::Rows { seq_len, rows, bucket, logit_rows } => session.forward_rows(seq_len, rows, bucket, logit_rows),
        PassRequest::Canvas { start, tokens, soft } => session.denoise(start, tokens, soft),
    }
}

/// Runs the sampler on `prompt` with `p.policy`. `on_step` sees the canvas after every step.
pub fn generate(session: &mut Session, prompt: &[u32], p: &SamplerParams, on_step: &mut dyn FnMut(&StepView)) -> Result<Generation> {
    generate_until(session, prompt, p, &mut |v| {
        on_step(v);
        ControlFlow::Continue(())
    })
}

/// [`generate`], stopped by `on_step` returning `Break` after a step: the result is then
/// [`Error::Cancelled`] and the session stays usable (the next generation starts afresh).
pub fn generate_until(session: &mut Session, prompt: &[u32], p: &SamplerParams, on_step: &mut dyn FnMut(&StepView) -> ControlFlow<()>) -> Result<Generation> {
    let mut generator = Generator::start(session, prompt, p)?;
    while let Some(view) = generator.step()? {
        if on_step(&view).is_break() {
            return Err(Error::Cancelled);
        }
    }
    Ok(generator.finish())
}
