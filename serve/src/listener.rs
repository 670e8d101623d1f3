//! The connections: accepted within `--max-connections` (each client address within its
//! share), each served by hyper's HTTP/1.1 (keep-alive, chunked bodies, RFC 9112 framing,
//! a bounded head read within a deadline), its writes watched so that a client that stops
//! reading is cut off; and the shutdown: stop accepting, drain for up to the timeout, cancel
//! what still runs, close every connection.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Sleep;

use crate::openai::ApiError;
use crate::routes;
use crate::shutdown::Signals;
use crate::Server;

/// How long a client may take to send a request's head (and, on a kept-alive connection, to
/// start the next one).
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// Most bytes of a request's line and headers.
const MAX_HEAD: usize = 16 << 10;
/// Most bytes a connection buffers each way.
const MAX_BUFFER: usize = 64 << 10;

/// Serves connections until the first stop signal, then drains and closes them.
pub(crate) async fn run(listener: TcpListener, server: Arc<Server>, mut signals: Signals) {
    let (drain, draining) = watch::channel(false);
    let admission = Arc::new(Admission::default());
    let mut connections = JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = signals.first() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of descriptors, say: the next accept may do better.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        match admission.admit(peer.ip(), &server.config) {
            Ok(ticket) => {
                connections.spawn(connection(stream, server.clone(), draining.clone(), ticket));
            }
            Err(e) => {
                tokio::spawn(refuse(stream, e));
            }
        }
    }
    signals.exit_on_second();
    drop(listener);
    // Queued jobs are refused from now on; running ones finish up to the timeout, and idle
    // connections close.
    server.stopping.store(true, Ordering::SeqCst);
    let _ = drain.send(true);
    let drained = tokio::time::timeout(server.config.shutdown_timeout, close_all(&mut connections)).await.is_ok();
    if !drained {
        // What still runs is cancelled; its streams end with an error event: a moment for
        // that, then every connection is closed (dropping the set aborts them).
        server.cancel_all.store(true, Ordering::SeqCst);
        let _ = tokio::time::timeout(Duration::from_millis(500), close_all(&mut connections)).await;
    }
}

/// Waits until every connection of the set has ended.
async fn close_all(connections: &mut JoinSet<()>) {
    while connections.join_next().await.is_some() {}
}

/// Connections open, by client address (their sum is all those open).
#[derive(Default)]
struct Admission {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place among those open; given back when dropped.
struct Ticket {
    admission: Arc<Admission>,
    client: IpAddr,
}

impl Admission {
    fn admit(self: &Arc<Self>, client: IpAddr, config: &crate::Config) -> Result<Ticket, ApiError> {
        let mut by_client = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let mine = by_client.get(&client).copied().unwrap_or(0);
        if by_client.values().sum::<usize>() >= config.max_connections {
            return Err(ApiError::new(503, format!("the server is at its {} connections; try again", config.max_connections)));
        }
        if mine >= config.max_connections_per_client {
            return Err(ApiError::new(429, format!("this client has {mine} connections open, the most one client may; close one or try again")).code("rate_limit_exceeded"));
        }
        by_client.insert(client, mine + 1);
        Ok(Ticket { admission: self.clone(), client })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut by_client = self.admission.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                by_client.remove(&self.client);
            }
        }
    }
}

/// A connection over the limits: its error, then the close.
async fn refuse(stream: TcpStream, e: ApiError) {
    use tokio::io::AsyncWriteExt;
    let mut stream = stream;
    let response = canned(&e);
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// A whole response written by hand, for the cases hyper is not there to write one: a
/// connection refused, or one whose head never came whole.
fn canned(e: &ApiError) -> String {
    let body = e.body();
    let reason = hyper::StatusCode::from_u16(e.status).ok().and_then(|s| s.canonical_reason()).unwrap_or("");
    let retry = if e.status == 429 || e.status == 503 { "Retry-After: 1\r\n" } else { "" };
    format!("HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{retry}Connection: close\r\n\r\n{body}", e.status, body.len())
}

/// Serves one connection until it closes, fails, or the drain ends it.
async fn connection(stream: TcpStream, server: Arc<Server>, mut draining: watch::Receiver<bool>, _ticket: Ticket) {
    server.metrics.connection();
    let _ = stream.set_nodelay(true);
    let head = Arc::new(HeadState::default());
    let io = TokioIo::new(Watched { stream, stall_timeout: server.config.stall_timeout, stalled: None, head: head.clone(), head_deadline: None });
    let service = {
        let (server, head) = (server.clone(), head.clone());
        service_fn(move |request| {
            // A whole head is in: the response is hyper's to write now.
            head.in_request.store(true, Ordering::SeqCst);
            head.pending.store(false, Ordering::SeqCst);
            routes::handle(request, server.clone())
        })
    };
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        // An idle kept-alive connection closes after this; a head begun has `HEAD_TIMEOUT`
        // from its first byte (`Watched`), which answers it.
        .header_read_timeout(2 * HEAD_TIMEOUT)
        .max_buf_size(MAX_BUFFER)
        .max_header_size(MAX_HEAD)
        .keep_alive(true)
        .serve_connection(io, service);
    tokio::pin!(connection);
    let mut drained = false;
    let result = loop {
        tokio::select! {
            result = connection.as_mut() => break result,
            // The drain: the response in progress finishes, then the connection closes.
            _ = draining.wait_for(|d| *d), if !drained => {
                drained = true;
                connection.as_mut().graceful_shutdown();
            }
        }
    };
    // hyper's own errors (a broken connection, its idle timeout) need no answer: those that
    // do are answered by hyper (framing) or by `Watched` (a head cut short or too slow).
    let _ = result;
}

/// Where a connection is between requests, as its reads and writes show it.
#[derive(Default)]
struct HeadState {
    /// Bytes of a head came and hyper has not had it whole yet.
    pending: AtomicBool,
    /// A request is being answered (from its whole head to its response's first byte).
    in_request: AtomicBool,
}

/// A connection's socket as hyper sees it. A write that cannot proceed for the stall timeout
/// fails (the client stopped reading), which ends the connection and so the generation it
/// was streaming. A head begun and not finished within `HEAD_TIMEOUT`, or cut short by the
/// client's close, is answered here (408, 400) before hyper sees the end: hyper would close
/// such a connection without a word.
struct Watched {
    stream: TcpStream,
    stall_timeout: Duration,
    /// When a blocked write gives up.
    stalled: Option<Pin<Box<Sleep>>>,
    head: Arc<HeadState>,
    /// When the head begun must be whole.
    head_deadline: Option<Pin<Box<Sleep>>>,
}

impl Watched {
    /// A write is blocked: fails once it has been for the stall timeout.
    fn poll_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let timeout = self.stall_timeout;
        let stalled = self.stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client stopped reading"))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// After a write (or flush) returned `result`: a blocked one may stall; bytes of a
    /// response (`wrote_bytes`; not a flush, which hyper calls between reads of a request too)
    /// end the request, and a head can begin after them.
    fn wrote<T>(&mut self, result: Poll<std::io::Result<T>>, wrote_bytes: bool, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        match result {
            Poll::Pending => self.poll_stall(cx),
            ready => {
                self.stalled = None;
                if wrote_bytes {
                    self.head.in_request.store(false, Ordering::SeqCst);
                    self.head.pending.store(false, Ordering::SeqCst);
                    self.head_deadline = None;
                }
                ready
            }
        }
    }

    /// Answers the head begun with `e` (best effort: a short response fits the socket's empty
    /// send buffer) and ends the reading: hyper then sees the end of the stream.
    fn refuse_head(&mut self, e: ApiError) -> Poll<std::io::Result<()>> {
        let _ = self.stream.try_write(canned(&e).as_bytes());
        self.head.pending.store(false, Ordering::SeqCst);
        self.head_deadline = None;
        Poll::Ready(Ok(()))
    }
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                // Between requests, bytes begin a head.
                if !this.head.in_request.load(Ordering::SeqCst) && !this.head.pending.swap(true, Ordering::SeqCst) {
                    this.head_deadline = Some(Box::pin(tokio::time::sleep(HEAD_TIMEOUT)));
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Ok(())) if this.head.pending.load(Ordering::SeqCst) => this.refuse_head(ApiError::new(400, "the connection closed before the request head was whole")),
            Poll::Pending if this.head.pending.load(Ordering::SeqCst) => match this.head_deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
                Some(Poll::Ready(())) => this.refuse_head(ApiError::new(408, format!("the request head was not sent within {} s", HEAD_TIMEOUT.as_secs()))),
                _ => Poll::Pending,
            },
            other => other,
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write(cx, buf);
        let wrote_bytes = matches!(result, Poll::Ready(Ok(n)) if n > 0);
        self.wrote(result, wrote_bytes, cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let result = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        let wrote_bytes = matches!(result, Poll::Ready(Ok(n)) if n > 0);
        self.wrote(result, wrote_bytes, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let result = Pin::new(&mut self.stream).poll_flush(cx);
        self.wrote(result, false, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_bounded_in_all_and_per_client() {
        let config = crate::Config { max_connections: 3, max_connections_per_client: 2, ..crate::Config::default() };
        let admission = Arc::new(Admission::default());
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let first = admission.admit(a, &config).unwrap();
        let _second = admission.admit(a, &config).unwrap();
        assert_eq!(admission.admit(a, &config).err().map(|e| e.status), Some(429), "a client past its share");
        let _other = admission.admit(b, &config).unwrap();
        assert_eq!(admission.admit(b, &config).err().map(|e| e.status), Some(503), "the server past its connections");
        drop(first);
        assert!(admission.admit(a, &config).is_ok(), "a closed connection gives its place back");
    }
}
