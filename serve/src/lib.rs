//! `llada-rt serve`: an OpenAI-compatible HTTP server over one artifact.
//!
//! - `POST /v1/chat/completions`, `POST /v1/completions`: OpenAI's bodies, with the diffusion
//!   settings as extra fields under the CLI's names; `stream: true` answers with Server-Sent
//!   Events in OpenAI's chunk format, each chunk carrying only text that can no longer change
//!   (a diffusion answer settles out of order), then the finish reason and usage.
//!   `llada_steps: true` adds an `event: step` per denoising step (the canvas, its reveals and
//!   revisions), which the live view draws.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus), and `GET /`: the live view
//!   (one page, no external assets).
//!
//! HTTP is hyper's (HTTP/1.1: keep-alive, chunked bodies both ways, RFC 9112 framing) on a
//! small tokio runtime (`listener.rs`); generation stays on `--sessions` worker threads, each
//! with its own session on the one mapped model, fed by a bounded queue (`workers.rs`): a
//! full queue is a 429. A stream's events pass through a small bounded buffer, so a client
//! that reads slowly makes its generation wait, and one that stops reading is cut off after
//! `--stall-timeout`. SIGTERM stops accepting, lets running generations finish for up to
//! `--shutdown-timeout`, then cancels them and exits. The runtime library has no HTTP and no
//! async: both are this crate's.

mod access;
mod generate;
mod listener;
mod metrics;
pub mod openai;
mod routes;
mod shutdown;
pub mod workers;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use llada_rt::text::Text;
use llada_rt::{Error, Model, Session, SessionParams};

use workers::Queue;

/// How the server runs; the CLI's flags map to it field for field.
#[derive(Debug, Clone)]
pub struct Config {
    pub host: String,
    pub port: u16,
    /// Sessions generating at once, each with its own window on the one mapped model.
    pub sessions: usize,
    /// Requests that may wait for a session once every session is busy; one more is refused
    /// with 429.
    pub queue: usize,
    /// Each session's backend and threads (`threads: None`: the cores shared out).
    pub session: SessionParams,
    /// Required as `Authorization: Bearer <key>` on `/v1/` when set; a request carrying it
    /// passes the Host and Origin checks too.
    pub api_key: Option<String>,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Connections served at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Connections one client address may hold at once (its share of `max_connections`).
    pub max_connections_per_client: usize,
    /// After SIGTERM, how long running generations may go on before they are cancelled.
    pub shutdown_timeout: Duration,
    /// How long a client may leave a response unread (no byte of it accepted) before its
    /// connection is closed and its generation cancelled.
    pub stall_timeout: Duration,
    /// Host names accepted besides the bound address and `localhost` (DNS rebinding).
    pub allow_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`) a browser page may call the API from, besides the
    /// server's own.
    pub allow_origins: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: 8080,
            sessions: 1,
            queue: 16,
            session: SessionParams::default(),
            api_key: None,
            max_body: 1 << 20,
            max_connections: 256,
            max_connections_per_client: 64,
            shutdown_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(30),
            allow_hosts: Vec::new(),
            allow_origins: Vec::new(),
        }
    }
}

/// What every connection and worker shares.
pub(crate) struct Server {
    pub(crate) model: Arc<Model>,
    pub(crate) text: Text,
    pub(crate) model_id: String,
    pub(crate) config: Config,
    /// The address the listener is bound to.
    pub(crate) bound: SocketAddr,
    pub(crate) queue: Queue,
    /// Set once the server stops taking requests (SIGTERM).
    pub(crate) stopping: AtomicBool,
    /// Set when the shutdown timeout has passed: running generations stop.
    pub(crate) cancel_all: AtomicBool,
    pub(crate) workers_alive: AtomicUsize,
    pub(crate) next_id: AtomicU64,
    pub(crate) metrics: metrics::Metrics,
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
    if config.max_connections == 0 || config.max_connections_per_client == 0 {
        return Err(Error::request("--max-connections and --max-connections-per-client: at least 1"));
    }
    let model = Arc::new(model);
    let text = Text::new(&model.header.tokenizer, &model.header.special)?;
    let mut params = config.session;
    if params.threads.is_none() {
        // The cores shared out, so that the sessions do not fight over them.
        let cores = llada_rt::session::default_threads_for(&model)?;
        params.threads = Some((cores / config.sessions).max(1));
    }
    let mut sessions = Vec::with_capacity(config.sessions);
    for _ in 0..config.sessions {
        sessions.push(Session::open(model.clone(), &params)?);
    }
    // Two threads serve every connection; tokenizing runs beside them (`spawn_blocking`).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .thread_name("llada-http")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the HTTP server's runtime", e))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((config.host.as_str(), config.port)))
        .map_err(|e| Error::request(format!("--host {} --port {}: cannot listen there: {e}", config.host, config.port)))?;
    let bound = listener.local_addr().map_err(|e| Error::request(format!("--host {}: {e}", config.host)))?;
    let (queue, jobs) = workers::queue(config.sessions, config.queue);
    let server = Arc::new(Server {
        model_id: model_id(&model.path),
        model,
        text,
        config: config.clone(),
        bound,
        queue,
        stopping: AtomicBool::new(false),
        cancel_all: AtomicBool::new(false),
        workers_alive: AtomicUsize::new(sessions.len()),
        next_id: AtomicU64::new(0),
        metrics: metrics::Metrics::new(),
    });
    let signals = runtime.block_on(async { shutdown::Signals::install() }).map_err(|e| Error::io("installing the SIGTERM and SIGINT handlers", e))?;
    let workers: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(i, mut session)| {
            let (server, jobs) = (server.clone(), jobs.clone());
            std::thread::Builder::new().name(format!("llada-session-{i}")).spawn(move || {
                workers::work(&mut session, &server, &jobs);
                server.workers_alive.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect::<Result<_, _>>()
        .map_err(|e| Error::io("starting the session threads", e))?;
    ready(bound);
    runtime.block_on(listener::run(listener, server.clone(), signals));
    // Every connection is closed: queued jobs are refused, running ones stop, workers exit.
    server.stopping.store(true, Ordering::SeqCst);
    server.cancel_all.store(true, Ordering::SeqCst);
    for w in workers {
        let _ = w.join();
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
