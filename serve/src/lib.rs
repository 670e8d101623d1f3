//! `llada-rt serve`: an OpenAI-compatible HTTP server over one artifact.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI's bodies, with the diffusion
//!   settings as extra fields under the CLI's names; `stream: true` answers with Server-Sent
//!   Events in OpenAI's chunk format, each chunk carrying only text that can no longer change
//!   (a diffusion answer settles out of order), then the finish reason and usage.
//!   `llada_steps: true` adds an `event: step` per denoising step (the canvas, its reveals and
//!   revisions), which the live view draws.
//! - `GET /v1/models`, `GET /health`, and `GET /`: the live view (one page, no external assets).
//!
//! `--sessions` sessions on one mapped model take jobs from a bounded queue; a full queue is
//! a 429, a client that goes away cancels its generation, SIGTERM lets running generations
//! finish, refuses queued ones and exits. HTTP is this crate's: the runtime library has none.

pub mod http;
pub mod openai;
pub mod shutdown;
pub mod workers;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use llada_rt::text::Text;
use llada_rt::{Error, Model, Session, SessionParams};

use openai::{ApiError, ApiRequest, Endpoint, Prompt};
use workers::{Event, Job, Queue, Refused};

/// How the server runs; the CLI's flags map to it field for field.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// Sessions generating at once, each with its own window on the one mapped model.
    pub sessions: usize,
    /// Requests that may wait for a session; one more is refused with 429.
    pub queue: usize,
    /// Each session's backend and threads (`threads: None`: the cores shared out).
    pub session: SessionParams,
    /// Required as `Authorization: Bearer <key>` on `/v1/` when set.
    pub api_key: Option<String>,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config { host: "127.0.0.1".into(), port: 8080, sessions: 1, queue: 16, session: SessionParams::default(), api_key: None, max_body: 1 << 20, max_connections: 256 }
    }
}

/// What every connection thread reads.
struct Shared<'a> {
    model: &'a Model,
    text: &'a Text,
    model_id: String,
    config: &'a Config,
    queue: Queue,
    /// Set once the server stops taking requests.
    stopping: &'a AtomicBool,
    workers_alive: AtomicUsize,
    connections: AtomicUsize,
    next_id: AtomicU64,
}

/// The name `/v1/models` lists and requests give: the artifact's file name without `.lad`.
pub fn model_id(path: &Path) -> String {
    path.file_stem().map_or_else(|| "model".to_string(), |s| s.to_string_lossy().into_owned())
}

/// Serves `model` as `config` says until SIGTERM or SIGINT; `ready` hears the bound address
/// once every session is open.
pub fn serve(model: Model, config: &Config, ready: impl FnOnce(SocketAddr)) -> Result<(), Error> {
    if config.sessions == 0 {
        return Err(Error::request("--sessions 0: at least one session is needed"));
    }
    let artifact = model.path.clone();
    let text = Text::new(&model.header.tokenizer, &model.header.special)?;
    let listener = TcpListener::bind((config.host.as_str(), config.port))
        .map_err(|e| Error::request(format!("--host {} --port {}: cannot listen there: {e}", config.host, config.port)))?;
    let addr = listener.local_addr().map_err(|e| Error::request(format!("--host {}: {e}", config.host)))?;
    let mut params = config.session;
    if params.threads.is_none() {
        // The cores shared out, so that the sessions do not fight over them.
        let cores = llada_rt::session::default_threads_for(&model)?;
        params.threads = Some((cores / config.sessions).max(1));
    }
    let mut sessions = Vec::with_capacity(config.sessions);
    for _ in 0..config.sessions {
        sessions.push(Session::open(&model, &params)?);
    }
    let (queue, jobs) = workers::queue(config.queue);
    let stopping = AtomicBool::new(false);
    let shared = Shared {
        model: &model,
        text: &text,
        model_id: model_id(&artifact),
        config,
        queue,
        stopping: &stopping,
        workers_alive: AtomicUsize::new(sessions.len()),
        connections: AtomicUsize::new(0),
        next_id: AtomicU64::new(0),
    };
    shutdown::install();
    listener.set_nonblocking(true).map_err(|e| Error::request(format!("--port {}: {e}", config.port)))?;
    std::thread::scope(|scope| {
        let listener = listener;
        for mut session in sessions {
            let (jobs, shared) = (&jobs, &shared);
            scope.spawn(move || {
                let _alive = Release(&shared.workers_alive);
                workers::work(&mut session, shared.text, jobs, &shared.queue.load, shared.stopping);
            });
        }
        ready(addr);
        while !shutdown::requested() {
            match listener.accept() {
                Ok((stream, _)) => {
                    let shared = &shared;
                    if shared.connections.fetch_add(1, Ordering::SeqCst) >= config.max_connections {
                        shared.connections.fetch_sub(1, Ordering::SeqCst);
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
                        let e = ApiError::new(503, format!("the server is at its {} connections; try again", config.max_connections));
                        let _ = http::respond(&stream, 503, "application/json", &[("Retry-After", "1")], e.body().as_bytes());
                        continue;
                    }
                    scope.spawn(move || {
                        let _open = Release(&shared.connections);
                        connection(&stream, shared);
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // No new connections (they would wait in the backlog); running generations finish,
        // queued ones are refused, and the workers then exit.
        drop(listener);
        stopping.store(true, Ordering::SeqCst);
    });
    Ok(())
}

/// Takes one off a count when dropped: a thread's count stays right even if it panics.
struct Release<'a>(&'a AtomicUsize);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn send_error(stream: &TcpStream, e: &ApiError) {
    let retry: &[(&str, &str)] = if e.status == 429 || e.status == 503 { &[("Retry-After", "1")] } else { &[] };
    let _ = http::respond(stream, e.status, "application/json", retry, e.body().as_bytes());
}

fn send_json(stream: &TcpStream, body: &serde_json::Value) {
    let _ = http::respond(stream, 200, "application/json", &[], body.to_string().as_bytes());
}

fn connection(stream: &TcpStream, shared: &Shared) {
    if stream.set_nonblocking(false).is_err() || stream.set_write_timeout(Some(http::WRITE_TIMEOUT)).is_err() {
        return;
    }
    let request = match http::read_request(stream, shared.config.max_body) {
        Ok(Some(r)) => r,
        Ok(None) => return,
        Err(refusal) => {
            send_error(stream, &ApiError::new(refusal.status, refusal.message));
            return http::close_unread(stream);
        }
    };
    if let Err(e) = route(stream, &request, shared) {
        send_error(stream, &e);
    }
}

fn route(stream: &TcpStream, r: &http::Request, shared: &Shared) -> Result<(), ApiError> {
    let endpoint = match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/") => {
            let _ = http::respond(stream, 200, "text/html; charset=utf-8", &[], PAGE.as_bytes());
            return Ok(());
        }
        ("GET", "/health") => {
            let load = &shared.queue.load;
            send_json(stream, &json!({
                "status": if shared.stopping.load(Ordering::SeqCst) { "stopping" } else { "ok" },
                "model": shared.model_id, "sessions": shared.config.sessions,
                "queued": load.queued.load(Ordering::SeqCst), "running": load.running.load(Ordering::SeqCst), "served": load.served.load(Ordering::SeqCst), "cancelled": load.cancelled.load(Ordering::SeqCst),
            }));
            return Ok(());
        }
        (_, "/" | "/health") => return Err(ApiError::new(405, format!("{} takes GET", r.path))),
        (_, p) if p.starts_with("/v1/") => {
            authorize(r, shared)?;
            match (r.method.as_str(), p) {
                ("GET", "/v1/models") => {
                    let created = shared.model.path.metadata().ok().and_then(|m| m.modified().ok()).map_or(0, unix_seconds);
                    send_json(stream, &json!({"object": "list", "data": [{"id": shared.model_id, "object": "model", "created": created, "owned_by": "llada"}]}));
                    return Ok(());
                }
                ("POST", "/v1/chat/completions") => Endpoint::Chat,
                ("POST", "/v1/completions") => Endpoint::Completion,
                (_, "/v1/models") => return Err(ApiError::new(405, "/v1/models takes GET")),
                (_, "/v1/chat/completions" | "/v1/completions") => return Err(ApiError::new(405, format!("{p} takes POST"))),
                _ => return Err(ApiError::new(404, format!("no endpoint {p}; this server has /v1/chat/completions, /v1/completions and /v1/models"))),
            }
        }
        (_, p) => return Err(ApiError::new(404, format!("no page {p}"))),
    };
    // The body is read as JSON whatever its Content-Type says (curl's `-d` says a form).
    let request = openai::parse(endpoint, &r.body, &shared.model_id)?;
    generate(stream, request, shared)
}

fn authorize(r: &http::Request, shared: &Shared) -> Result<(), ApiError> {
    let Some(key) = &shared.config.api_key else { return Ok(()) };
    match r.header("authorization").and_then(|h| h.strip_prefix("Bearer ")) {
        Some(given) if given.trim() == key => Ok(()),
        Some(_) => Err(ApiError::new(401, "Incorrect API key provided").code("invalid_api_key")),
        None => Err(ApiError::new(401, "No API key provided: send Authorization: Bearer <key>").code("invalid_api_key")),
    }
}

fn unix_seconds(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The prompt's token ids, as `llada-rt run` makes them (`--chat` for messages).
fn prompt_ids(prompt: &Prompt, text: &Text) -> Result<Vec<u32>, llada_rt::Error> {
    match prompt {
        Prompt::Messages(turns) => {
            let turns: Vec<(&str, &str)> = turns.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
            text.encode_messages(&turns)
        }
        Prompt::Text(t) => text.encode(t),
        Prompt::Ids(ids) => Ok(ids.clone()),
    }
}

/// The state of one answer as it is sent.
struct Answer<'a> {
    request: &'a ApiRequest,
    id: String,
    created: u64,
    model: &'a str,
    /// Text already sent (streams).
    sent: String,
    /// A stop sequence appeared: the generation was stopped there.
    stopped: bool,
    /// The event stream's head is out: errors go as an event, not a status.
    streaming: bool,
}

impl Answer<'_> {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.request.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// A response object or stream chunk around `choices` (OpenAI's id, object, created, model).
    fn envelope(&self, chunk: bool, choices: serde_json::Value) -> serde_json::Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// An error: as the response, or after a stream's head, as its last event.
    fn fail(&self, stream: &TcpStream, e: ApiError) -> Result<(), ApiError> {
        if !self.streaming {
            return Err(e);
        }
        let _ = http::event(stream, None, &e.body());
        Ok(())
    }

    /// A stream chunk carrying `delta` (text, or the assistant role first), `finish`, and the
    /// fields of `extra` (the last chunk's usage).
    fn chunk(&self, delta: Option<&str>, role: bool, finish: Option<&str>, extra: Option<&serde_json::Value>) -> String {
        let choice = match self.request.endpoint {
            Endpoint::Chat => {
                let mut d = serde_json::Map::new();
                if role {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = delta {
                    d.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completion => json!({"index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": finish}),
        };
        let mut chunk = self.envelope(true, json!([choice]));
        if let Some(serde_json::Value::Object(fields)) = extra {
            chunk.as_object_mut().expect("a chunk is an object").extend(fields.clone());
        }
        chunk.to_string()
    }
}

fn generate(stream: &TcpStream, request: ApiRequest, shared: &Shared) -> Result<(), ApiError> {
    let prompt_field = request.endpoint.prompt_field();
    let ids = prompt_ids(&request.prompt, shared.text).map_err(|e| ApiError::from_runtime(&e).param(prompt_field))?;
    // A mask token or an id outside the vocabulary: refused here, naming the field, not by the worker.
    shared.model.check_prompt(&ids).map_err(|e| ApiError::from_runtime(&e).param(prompt_field))?;
    let params = llada_rt::settings::sampler_params(shared.model, &request.settings).map_err(|e| ApiError::from_runtime(&e))?;
    if ids.len() + params.gen_length > shared.model.max_exact_len() as usize {
        return Err(ApiError::new(400, format!("the prompt is {} tokens and max_tokens {}: together over the {} positions this model was compiled for", ids.len(), params.gen_length, shared.model.max_exact_len())).param(prompt_field).code("context_length_exceeded"));
    }
    if shared.stopping.load(Ordering::SeqCst) {
        return Err(ApiError::shutting_down());
    }
    let (events_tx, events) = mpsc::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Job { prompt: ids.clone(), params, steps: request.stream, canvas: request.steps, events: events_tx, cancel: cancel.clone() };
    match shared.queue.submit(job) {
        Ok(()) => {}
        Err(Refused::Busy) => return Err(ApiError::new(429, format!("all {} sessions are busy and {} requests are waiting; try again", shared.config.sessions, shared.config.queue)).code("rate_limit_exceeded")),
        Err(Refused::Closed) => return Err(ApiError::shutting_down()),
    }
    // Stops the generation on every way out of here (a finished one has nothing to stop).
    let _cancel = CancelOnDrop(cancel.clone());
    let n = shared.next_id.fetch_add(1, Ordering::SeqCst);
    let created = unix_seconds(SystemTime::now());
    let mut answer = Answer { request: &request, id: format!("{}-{created:x}{n:04x}", request.endpoint.id_prefix()), created, model: &shared.model_id, sent: String::new(), stopped: false, streaming: false };
    let start = Instant::now();
    let mut checked = Instant::now();
    loop {
        // The client may go away however fast the events come: checked every PEER_CHECK.
        if checked.elapsed() >= PEER_CHECK {
            checked = Instant::now();
            if http::peer_closed(stream) {
                return Ok(());
            }
        }
        let event = match events.recv_timeout(PEER_CHECK) {
            Ok(e) => e,
            Err(RecvTimeoutError::Timeout) => {
                // The workers are gone while this job waited (the server is stopping).
                if !answer.streaming && shared.workers_alive.load(Ordering::SeqCst) == 0 {
                    return Err(ApiError::shutting_down());
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return answer.fail(stream, ApiError::new(500, "the generation ended without an answer")),
        };
        match event {
            Event::ShuttingDown => return answer.fail(stream, ApiError::shutting_down()),
            Event::Started => {
                if request.stream {
                    // The head goes out only now: a request the sampler refuses gets its status.
                    answer.streaming = true;
                    let first = (request.endpoint == Endpoint::Chat).then(|| answer.chunk(Some(""), true, None, None));
                    if http::start_events(stream).is_err() || first.is_some_and(|c| http::event(stream, None, &c).is_err()) {
                        return Ok(());
                    }
                }
            }
            Event::Step(step) => {
                let (visible, stopped) = openai::cut_at_stop(&step.settled_text, &request.stop);
                let upto = if stopped { visible.len() } else { openai::sendable(visible, &request.stop) };
                let mut ok = true;
                if let Some(new) = visible[..upto].strip_prefix(answer.sent.as_str()).filter(|n| !n.is_empty()) {
                    ok &= http::event(stream, None, &answer.chunk(Some(new), false, None, None)).is_ok();
                    answer.sent = visible[..upto].to_string();
                }
                if request.steps {
                    let view = json!({
                        "step": step.step, "steps": step.steps, "committed": step.committed, "revised": step.revised,
                        "settled": step.settled, "settled_text": step.settled_text, "canvas": step.canvas, "seconds": start.elapsed().as_secs_f64(),
                    });
                    ok &= http::event(stream, Some("step"), &view.to_string()).is_ok();
                }
                if !ok {
                    return Ok(());
                }
                if stopped {
                    answer.stopped = true;
                    cancel.store(true, Ordering::SeqCst);
                }
            }
            Event::Done(Err(Error::Cancelled)) if answer.stopped => return finish(stream, &mut answer, &ids, None, shared),
            Event::Done(Err(e)) => return answer.fail(stream, ApiError::from_runtime(&e)),
            Event::Done(Ok(g)) => return finish(stream, &mut answer, &ids, Some(&g), shared),
        }
    }
}

/// Sets a generation's cancel flag when dropped.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// How often a waiting request checks that its client is still there.
const PEER_CHECK: Duration = Duration::from_millis(100);

/// The answer's end: the whole text (or, in a stream, what was not sent yet), the finish
/// reason and the usage. `g` is `None` when a stop sequence ended the generation early.
fn finish(stream: &TcpStream, answer: &mut Answer, prompt: &[u32], g: Option<&llada_rt::Generation>, shared: &Shared) -> Result<(), ApiError> {
    let text = shared.text;
    let (full, answer_tokens, ended) = match g {
        Some(g) => {
            let ids = text.answer_ids(&g.output_ids);
            (text.answer(&g.output_ids), ids.len(), ids.len() < g.output_ids.len())
        }
        None => (answer.sent.clone(), 0, true),
    };
    let (visible, cut) = openai::cut_at_stop(&full, &answer.request.stop);
    let finish_reason = if cut || ended || answer.stopped { "stop" } else { "length" };
    let completion_tokens = if g.is_some() && !cut { answer_tokens } else { text_tokens(text, visible) };
    let usage = json!({"prompt_tokens": prompt.len(), "completion_tokens": completion_tokens, "total_tokens": prompt.len() + completion_tokens});
    let llada = g.map(|g| json!({"forward_passes": g.forward_passes, "rows_computed": g.rows_computed, "seconds": g.seconds, "output_ids": g.output_ids}));
    if !answer.request.stream {
        let choice = match answer.request.endpoint {
            Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": visible}, "logprobs": null, "finish_reason": finish_reason}),
            Endpoint::Completion => json!({"index": 0, "text": visible, "logprobs": null, "finish_reason": finish_reason}),
        };
        let mut whole = answer.envelope(false, json!([choice]));
        whole["usage"] = usage;
        whole["llada"] = json!(llada);
        send_json(stream, &whole);
        return Ok(());
    }
    // What the stream has not sent: the final text extends the settled text it sent (settled
    // tokens do not change); were it ever not so, the whole text is sent rather than dropped.
    let rest = visible.strip_prefix(answer.sent.as_str()).unwrap_or(visible);
    let mut events = Vec::new();
    if !rest.is_empty() {
        events.push(answer.chunk(Some(rest), false, None, None));
    }
    // The finish chunk carries the usage (and llada's figures); OpenAI's usage-only chunk,
    // with no choices, follows where `stream_options.include_usage` asks for it.
    let extra = json!({"usage": usage, "llada": llada});
    events.push(answer.chunk(None, false, Some(finish_reason), Some(&extra)));
    if answer.request.include_usage {
        let mut usage_only = answer.envelope(true, json!([]));
        usage_only["usage"] = usage;
        events.push(usage_only.to_string());
    }
    for e in events {
        if http::event(stream, None, &e).is_err() {
            return Ok(());
        }
    }
    let _ = http::event(stream, None, "[DONE]");
    Ok(())
}

/// Tokens of a text cut short (a stop sequence): what it encodes to.
fn text_tokens(text: &Text, s: &str) -> usize {
    if s.is_empty() { 0 } else { text.encode(s).map_or(0, |ids| ids.len()) }
}

/// The live view: one self-contained page.
const PAGE: &str = include_str!("page.html");
