//! One request: which endpoint it is for, who may call it (`access.rs`), its body read within
//! bounds, and its answer or OpenAI-style error; every answer counted in the metrics.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body::Body as _;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value as Json};

use crate::access::{self, Key};
use crate::generate::{generate, EventStream, Generated};
use crate::openai::{self, ApiError, Endpoint};
use crate::Server;

/// A response's body: whole, or an event stream.
pub(crate) type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// How long a client may take to send a request's body once its head is in.
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What a route answers with: a whole response, or an event stream (counted when it ends).
enum Routed {
    Whole(Response<ResponseBody>),
    Stream(Box<EventStream>),
}

/// Answers `request` (the service hyper runs for every request of a connection).
pub(crate) async fn handle(request: Request<Incoming>, server: Arc<Server>) -> Result<Response<ResponseBody>, Infallible> {
    let start = Instant::now();
    let endpoint = endpoint_label(request.uri().path());
    let response = match route(request, &server, start).await {
        Ok(Routed::Stream(events)) => return Ok(stream_response(events)),
        Ok(Routed::Whole(response)) => response,
        Err(e) => error_response(&e),
    };
    server.metrics.answered(endpoint, response.status().as_u16(), start.elapsed());
    Ok(response)
}

/// The metrics' name of a path: its route, or `other`.
fn endpoint_label(path: &str) -> &'static str {
    ["/", "/health", "/metrics", "/v1/models", "/v1/chat/completions", "/v1/completions"].into_iter().find(|&p| p == path).unwrap_or("other")
}

async fn route(request: Request<Incoming>, server: &Arc<Server>, start: Instant) -> Result<Routed, ApiError> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let key = access::key(&parts.headers, &server.config);
    if key != Key::Valid {
        access::check_site(&parts.headers, &server.config, server.bound)?;
    }
    let endpoint = match (&parts.method, path) {
        (&Method::GET, "/") => return Ok(Routed::Whole(whole(StatusCode::OK, "text/html; charset=utf-8", PAGE))),
        (&Method::GET, "/health") => return Ok(json_response(&health(server))),
        (&Method::GET, "/metrics") => return Ok(Routed::Whole(whole(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", server.metrics.render(&server.queue.load)))),
        (_, "/" | "/health" | "/metrics") => return Err(ApiError::new(405, format!("{path} takes GET"))),
        (method, p) if p.starts_with("/v1/") => {
            match key {
                Key::Missing => return Err(ApiError::new(401, "No API key provided: send Authorization: Bearer <key>").code("invalid_api_key")),
                Key::Wrong => return Err(ApiError::new(401, "Incorrect API key provided").code("invalid_api_key")),
                Key::Valid | Key::NotRequired => {}
            }
            match (method, p) {
                (&Method::GET, "/v1/models") => return Ok(json_response(&models(server))),
                (&Method::POST, "/v1/chat/completions") => Endpoint::Chat,
                (&Method::POST, "/v1/completions") => Endpoint::Completion,
                (_, "/v1/models") => return Err(ApiError::new(405, "/v1/models takes GET")),
                (_, "/v1/chat/completions" | "/v1/completions") => return Err(ApiError::new(405, format!("{p} takes POST"))),
                _ => return Err(ApiError::new(404, format!("no endpoint {p}; this server has /v1/chat/completions, /v1/completions and /v1/models"))),
            }
        }
        (_, p) => return Err(ApiError::new(404, format!("no page {p}"))),
    };
    access::check_json(&parts.headers)?;
    check_transfer_coding(&parts.headers)?;
    let body = read_body(body, server.config.max_body).await?;
    let request = openai::parse(endpoint, &body, &server.model_id)?;
    Ok(match generate(server.clone(), request, start).await? {
        Generated::Whole(answer) => json_response(&answer),
        Generated::Stream(events) => Routed::Stream(events),
    })
}

/// Refuses (501) a body sent with a transfer coding besides `chunked` (`gzip, chunked`, say):
/// hyper frames it as chunked and would hand over the coded bytes as if plain. A coding
/// without `chunked` last is hyper's to refuse (400), as RFC 9112 asks.
fn check_transfer_coding(headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    let codings: Vec<&str> = headers.get_all(hyper::header::TRANSFER_ENCODING).iter().flat_map(|v| v.to_str().unwrap_or("?").split(',')).map(str::trim).filter(|c| !c.is_empty()).collect();
    match codings.iter().find(|c| !c.eq_ignore_ascii_case("chunked")) {
        Some(other) => Err(ApiError::new(501, format!("Transfer-Encoding '{other}' is not supported: send the body plain, with Content-Length or chunked"))),
        None => Ok(()),
    }
}

/// The body, at most `max` bytes (413 beyond), within [`BODY_TIMEOUT`] (408 after).
async fn read_body(body: Incoming, max: usize) -> Result<Bytes, ApiError> {
    let too_large = |length: String| ApiError::new(413, format!("the body is {length} bytes; this server takes at most {max}"));
    if let Some(length) = body.size_hint().exact().filter(|&n| n > max as u64) {
        return Err(too_large(length.to_string()));
    }
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, max).collect()).await {
        Err(_) => Err(ApiError::new(408, format!("the request body was not sent within {} s", BODY_TIMEOUT.as_secs()))),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(format!("over {max}"))),
        Ok(Err(e)) => Err(ApiError::new(400, format!("reading the request body: {e}"))),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

fn health(server: &Server) -> Json {
    let load = &server.queue.load;
    json!({
        "status": if server.stopping.load(Ordering::SeqCst) { "draining" } else { "ready" },
        "model": server.model_id, "sessions": server.config.sessions,
        "queued": load.queued.load(Ordering::SeqCst), "running": load.running.load(Ordering::SeqCst), "served": load.served.load(Ordering::SeqCst), "cancelled": load.cancelled.load(Ordering::SeqCst),
    })
}

fn models(server: &Server) -> Json {
    let modified = server.model.path.metadata().ok().and_then(|m| m.modified().ok());
    let created = modified.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    json!({"object": "list", "data": [{"id": server.model_id, "object": "model", "created": created, "owned_by": "llada"}]})
}

fn whole(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(body.into()).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response(v: &Json) -> Routed {
    Routed::Whole(whole(StatusCode::OK, "application/json", v.to_string()))
}

/// An OpenAI-style error; 429 and 503 say when to try again.
pub(crate) fn error_response(e: &ApiError) -> Response<ResponseBody> {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = whole(status, "application/json", e.body());
    if e.status == 429 || e.status == 503 {
        response.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn stream_response(events: Box<EventStream>) -> Response<ResponseBody> {
    let mut response = Response::new(events.boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx and similar proxies: pass each event on at once.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// The live view: one self-contained page.
const PAGE: &str = include_str!("page.html");
