//! `llada-rt serve`: the artifact behind the HTTP server (`llada_serve`).

use std::path::PathBuf;

use clap::Args;
use llada_rt::Model;

use crate::{serve_defaults, sessions_flag, Done, SessionArgs};

#[derive(Args)]
pub(crate) struct Serve {
    /// The artifact (from `lladac compile`).
    file: PathBuf,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value_t = serve_defaults().host)]
    host: String,
    /// Port to listen on (0: any free port, printed when ready).
    #[arg(long, default_value_t = serve_defaults().port)]
    port: u16,
    /// Sessions generating at once, each with its own window on the one mapped model;
    /// without --threads the cores are shared out among them.
    #[arg(long, default_value_t = serve_defaults().sessions, value_parser = sessions_flag)]
    sessions: usize,
    /// Requests that may wait once every session is busy, 0 to 4096; more are refused with 429.
    #[arg(long, default_value_t = serve_defaults().queue as u16, value_parser = clap::value_parser!(u16).range(0..=4096))]
    queue: u16,
    /// Require `Authorization: Bearer KEY` on /v1/ (default: LLADA_API_KEY, else none).
    #[arg(long)]
    api_key: Option<String>,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = serve_defaults().max_body)]
    max_body: usize,
    /// Connections served at once; more are answered 503.
    #[arg(long, default_value_t = serve_defaults().max_connections)]
    max_connections: usize,
    /// Connections one client address may hold at once; more are answered 429.
    #[arg(long, default_value_t = serve_defaults().max_connections_per_client)]
    max_connections_per_client: usize,
    /// After SIGTERM, seconds running generations may go on before they are cancelled.
    #[arg(long, value_name = "SECS", default_value_t = serve_defaults().shutdown_timeout.as_secs_f64())]
    shutdown_timeout: f64,
    /// Seconds a client may leave a response unread before it is cut off and its generation
    /// cancelled.
    #[arg(long, value_name = "SECS", default_value_t = serve_defaults().stall_timeout.as_secs_f64())]
    stall_timeout: f64,
    /// A host name clients may reach the server by, besides its address and localhost
    /// (repeatable); without an API key other names are refused (DNS rebinding).
    #[arg(long, value_name = "NAME")]
    allow_host: Vec<String>,
    /// An origin (`https://app.example`) whose pages may call the API without the key
    /// (repeatable); other sites' pages are refused.
    #[arg(long, value_name = "ORIGIN")]
    allow_origin: Vec<String>,
    #[command(flatten)]
    session: SessionArgs,
}

impl Serve {
    pub(crate) fn run(self) -> Done {
        let Serve { file, host, port, sessions, queue, api_key, max_body, max_connections, max_connections_per_client, shutdown_timeout, stall_timeout, allow_host, allow_origin, session: session_args } = self;
        let model = Model::open(&file, true)?;
        let config = llada_serve::Config {
            host,
            port,
            sessions,
            queue: queue.into(),
            session: session_args.params(&model)?,
            api_key: api_key.or_else(|| std::env::var("LLADA_API_KEY").ok()).filter(|k| !k.is_empty()),
            max_body,
            max_connections,
            max_connections_per_client,
            shutdown_timeout: seconds("--shutdown-timeout", shutdown_timeout)?,
            stall_timeout: seconds("--stall-timeout", stall_timeout)?,
            allow_hosts: allow_host,
            allow_origins: allow_origin,
        };
        let id = llada_serve::model_id(&file);
        llada_serve::serve(model, &config, |addr| {
            eprintln!("llada-rt serve: {id} on http://{addr}/ ({sessions} session(s), queue {queue}); SIGTERM or Ctrl-C stops it");
        })?;
        Ok(())
    }
}

/// A flag's seconds as a duration: finite and not negative.
fn seconds(flag: &str, secs: f64) -> Result<std::time::Duration, llada_rt::Error> {
    std::time::Duration::try_from_secs_f64(secs).map_err(|_| llada_rt::Error::request(format!("{flag} {secs}: expected seconds, 0 or more")))
}
