//! A generation request: its prompt tokenized and its settings checked (beside the threads
//! that serve connections), its job queued, then its answer, whole or as an event stream.
//! A stream's events are made as hyper asks for the next piece of the body, which it does only
//! when the connection can take more: a client that reads slowly leaves the job's small event
//! buffer full, and its worker waits.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body::{Body, Frame};
use serde_json::{json, Value as Json};
use tokio::sync::mpsc::{self, Receiver};

use llada_rt::text::Text;
use llada_rt::Error;

use crate::openai::{self, Answer, ApiError, ApiRequest, Ending, Prompt};
use crate::workers::{Event, Job, Refused, EVENTS_BUFFERED};
use crate::Server;

/// What a generation request is answered with.
pub(crate) enum Generated {
    /// The whole answer (not streamed).
    Whole(Json),
    /// The event stream, begun: the sampler accepted the request.
    Stream(Box<EventStream>),
}

/// Runs `request`; `start` is when its head arrived.
pub(crate) async fn generate(server: Arc<Server>, request: ApiRequest, start: Instant) -> Result<Generated, ApiError> {
    let prompt_field = request.endpoint.prompt_field();
    // Tokenizing a long prompt takes a while: not on the threads that serve connections.
    let worker = server.clone();
    let (ids, params, request) = tokio::task::spawn_blocking(move || -> Result<_, ApiError> {
        let ids = prompt_ids(&request.prompt, &worker.text).map_err(|e| ApiError::from_runtime(&e).param(prompt_field))?;
        // A mask token or an id outside the vocabulary: refused here, naming the field, not by
        // the worker.
        worker.model.check_prompt(&ids).map_err(|e| ApiError::from_runtime(&e).param(prompt_field))?;
        let params = llada_rt::settings::sampler_params(&worker.model, &request.settings).map_err(|e| ApiError::from_runtime(&e))?;
        Ok((ids, params, request))
    })
    .await
    .map_err(|_| ApiError::new(500, "reading the prompt failed"))??;
    let capacity = server.model.max_exact_len() as usize;
    if ids.len() + params.gen_length > capacity {
        return Err(ApiError::new(400, format!("the prompt is {} tokens and max_tokens {}: together over the {capacity} positions this model was compiled for", ids.len(), params.gen_length))
            .param(prompt_field)
            .code("context_length_exceeded"));
    }
    if server.stopping.load(Ordering::SeqCst) {
        return Err(ApiError::shutting_down());
    }
    let (events_tx, mut events) = mpsc::channel(EVENTS_BUFFERED);
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job { prompt: ids.clone(), params, steps: request.stream, canvas: request.steps, events: events_tx, cancel: cancel.clone() };
    match server.queue.submit(job) {
        Ok(()) => {}
        Err(Refused::Busy) => {
            let c = &server.config;
            return Err(ApiError::new(429, format!("all {} sessions are busy and {} requests are waiting; try again", c.sessions, c.queue)).code("rate_limit_exceeded"));
        }
        Err(Refused::Closed) => return Err(ApiError::shutting_down()),
    }
    // Stops the generation on every way out (a finished one has nothing to stop): an error
    // here, the client going away (hyper drops this future, or the stream's body), a cut-off.
    let cancel = CancelOnDrop(cancel);
    // The sampler accepts the request (the head goes out only now: a request it refuses gets
    // its status) or refuses it.
    match next_event(&mut events, &server, true).await {
        Some(Event::Started) => {}
        Some(Event::ShuttingDown) => return Err(ApiError::shutting_down()),
        Some(Event::Done(Err(e))) => return Err(run_error(&e, &server)),
        Some(Event::Step(_) | Event::Done(Ok(_)) | Event::Cut(_)) | None => return Err(ended_without_answer(&server)),
    }
    let n = server.next_id.fetch_add(1, Ordering::SeqCst);
    let created = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let answer = Answer { id: format!("{}-{created:x}{n:04x}", request.endpoint.id_prefix()), created, model: server.model_id.clone(), sent: String::new(), stopped: false, request };
    let mut run = Run { server, answer, prompt: ids, events, cancel, start, first_text: false };
    if run.answer.request.stream {
        return Ok(Generated::Stream(Box::new(EventStream::new(run))));
    }
    loop {
        match next_event(&mut run.events, &run.server, false).await {
            Some(Event::Done(Ok(g))) => return Ok(Generated::Whole(run.answer.whole(run.ending(&g, false)))),
            Some(Event::Done(Err(e))) => return Err(run_error(&e, &run.server)),
            // Only a stream cuts its generation short (at a stop sequence).
            Some(Event::Cut(_)) => return Err(run_error(&Error::Cancelled, &run.server)),
            Some(Event::ShuttingDown) => return Err(ApiError::shutting_down()),
            Some(Event::Started | Event::Step(_)) => {}
            None => return Err(ended_without_answer(&run.server)),
        }
    }
}

/// The job's next event; `None` once its worker dropped the channel, or the workers are gone
/// (the server stopped while the job waited). A job still `queued` (not started) when the
/// server begins to stop hears `ShuttingDown` then, not once a session is free: its caller
/// returns, dropping the job's `CancelOnDrop`, so no worker runs it.
async fn next_event(events: &mut Receiver<Event>, server: &Server, queued: bool) -> Option<Event> {
    loop {
        match tokio::time::timeout(Duration::from_millis(100), events.recv()).await {
            Ok(event) => return event,
            Err(_) if server.workers_alive.load(Ordering::SeqCst) == 0 => return None,
            Err(_) if queued && server.stopping.load(Ordering::SeqCst) => return Some(Event::ShuttingDown),
            Err(_) => {}
        }
    }
}

/// A generation's failure as its client hears it: one the shutdown timeout cancelled is the
/// server's going away (503), not a fault.
fn run_error(e: &Error, server: &Server) -> ApiError {
    if matches!(e, Error::Cancelled) && server.cancel_all.load(Ordering::SeqCst) { ApiError::shutting_down() } else { ApiError::from_runtime(e) }
}

fn ended_without_answer(server: &Server) -> ApiError {
    if server.workers_alive.load(Ordering::SeqCst) == 0 { ApiError::shutting_down() } else { ApiError::new(500, "the generation ended without an answer") }
}

/// The prompt's token ids, as `llada-rt run` makes them (`--chat` for messages).
fn prompt_ids(prompt: &Prompt, text: &Text) -> Result<Vec<u32>, Error> {
    match prompt {
        Prompt::Messages(turns) => {
            let turns: Vec<(&str, &str)> = turns.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
            text.encode_messages(&turns)
        }
        Prompt::Text(t) => text.encode(t),
        Prompt::Ids(ids) => Ok(ids.clone()),
    }
}

/// Sets a generation's cancel flag when dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl CancelOnDrop {
    fn now(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.now();
    }
}

/// A generation the sampler accepted, as its answer is sent.
struct Run {
    server: Arc<Server>,
    answer: Answer,
    prompt: Vec<u32>,
    events: Receiver<Event>,
    cancel: CancelOnDrop,
    start: Instant,
    /// The stream sent text already (time to first token recorded).
    first_text: bool,
}

impl Run {
    /// The answer's end: the whole text, the finish reason and the usage. `partial`: a stop
    /// sequence ended the generation early, `g` is what it did until then (its output is
    /// the text sent, not `g`'s canvas, which still holds masks).
    fn ending(&self, g: &llada_rt::Generation, partial: bool) -> Ending {
        let text = &self.server.text;
        let (full, answer_tokens, ended) = if partial {
            (self.answer.sent.clone(), 0, true)
        } else {
            let ids = text.answer_ids(&g.output_ids);
            (text.answer(&g.output_ids), ids.len(), ids.len() < g.output_ids.len())
        };
        let (visible, cut) = openai::cut_at_stop(&full, &self.answer.request.stop);
        let finish_reason = if cut || ended || self.answer.stopped { "stop" } else { "length" };
        let completion_tokens = if partial || cut { text_tokens(text, visible) } else { answer_tokens };
        let prompt = self.prompt.len();
        let usage = json!({"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens});
        let output_ids = (!partial).then_some(&g.output_ids);
        let llada = json!({"forward_passes": g.forward_passes, "rows_computed": g.rows_computed, "seconds": g.seconds, "output_ids": output_ids});
        self.server.metrics.answered_tokens(completion_tokens, g.forward_passes);
        Ending { text: visible.to_string(), finish_reason, usage, llada }
    }
}

/// Tokens of a text cut short (a stop sequence): what it encodes to.
fn text_tokens(text: &Text, s: &str) -> usize {
    if s.is_empty() { 0 } else { text.encode(s).map_or(0, |ids| ids.len()) }
}

/// A stream's body: Server-Sent Events in OpenAI's chunk format, each made from the job's
/// events when hyper asks for more.
pub(crate) struct EventStream {
    run: Run,
    /// Events made and not yet handed to hyper.
    pending: VecDeque<Bytes>,
    /// The last event is made (`[DONE]` or an error).
    ended: bool,
}

/// One event: `data` is one line (JSON has no raw newlines), `name` an optional event type.
fn sse(name: Option<&str>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(n) = name {
        out.push_str("event: ");
        out.push_str(n);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
    Bytes::from(out)
}

impl EventStream {
    fn new(run: Run) -> EventStream {
        let mut pending = VecDeque::with_capacity(4);
        if let Some(first) = run.answer.opening_chunk() {
            pending.push_back(sse(None, &first));
        }
        EventStream { run, pending, ended: false }
    }

    /// Makes the events that follow from the job's `event` (`None`: its worker is gone).
    fn on_event(&mut self, event: Option<Event>) {
        match event {
            None => self.fail(&ended_without_answer(&self.run.server)),
            Some(Event::ShuttingDown) => self.fail(&ApiError::shutting_down()),
            Some(Event::Started) => {}
            Some(Event::Step(step)) => self.on_step(step),
            Some(Event::Cut(g)) if self.run.answer.stopped => self.close(&g, true),
            Some(Event::Cut(_)) => self.fail(&run_error(&Error::Cancelled, &self.run.server)),
            Some(Event::Done(Err(e))) => self.fail(&run_error(&e, &self.run.server)),
            Some(Event::Done(Ok(g))) => self.close(&g, false),
        }
    }

    fn on_step(&mut self, step: crate::workers::Step) {
        let run = &mut self.run;
        let stop = &run.answer.request.stop;
        let (visible, stopped) = openai::cut_at_stop(&step.settled_text, stop);
        let upto = if stopped { visible.len() } else { openai::sendable(visible, stop) };
        if let Some(new) = visible[..upto].strip_prefix(run.answer.sent.as_str()).filter(|n| !n.is_empty()) {
            self.pending.push_back(sse(None, &run.answer.chunk(Some(new), false, None, None)));
            run.answer.sent = visible[..upto].to_string();
            if !run.first_text {
                run.first_text = true;
                run.server.metrics.first_token(run.start.elapsed());
            }
        }
        if run.answer.request.steps {
            let view = json!({
                "step": step.step, "steps": step.steps, "committed": step.committed, "revised": step.revised,
                "settled": step.settled, "settled_text": step.settled_text, "canvas": step.canvas, "seconds": run.start.elapsed().as_secs_f64(),
            });
            self.pending.push_back(sse(Some("step"), &view.to_string()));
        }
        if stopped {
            run.answer.stopped = true;
            run.cancel.now();
        }
    }

    /// The stream's end: the rest of the text, the finish and usage chunks, `[DONE]`.
    fn close(&mut self, g: &llada_rt::Generation, partial: bool) {
        let ending = self.run.ending(g, partial);
        for chunk in self.run.answer.closing_chunks(ending) {
            self.pending.push_back(sse(None, &chunk));
        }
        self.pending.push_back(sse(None, "[DONE]"));
        self.ended = true;
    }

    /// An error after the stream's head: its last event.
    fn fail(&mut self, e: &ApiError) {
        self.pending.push_back(sse(None, &e.body()));
        self.ended = true;
    }
}

impl Body for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let event = ready!(this.run.events.poll_recv(cx));
            this.on_event(event);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty()
    }
}

impl Drop for EventStream {
    /// A stream's request is over when its body is: sent whole, or dropped (the client left).
    fn drop(&mut self) {
        let endpoint = self.run.answer.request.endpoint.path();
        self.run.server.metrics.answered(endpoint, 200, self.run.start.elapsed());
    }
}
