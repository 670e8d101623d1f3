//! Just enough HTTP/1.1 for an API server on loopback or behind a proxy: one request per
//! connection (every response says `Connection: close`), bodies by `Content-Length` only, and
//! every size and wait bounded, so a slow or hostile client costs one thread for a bounded time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Most bytes of the request line and headers together.
pub const MAX_HEAD: usize = 16 << 10;
/// How long a client may take to send its whole request, head and body: a client that trickles
/// bytes holds a thread no longer than this.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);
/// How long one response write may block on a client that does not read.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads from a stream until a deadline: each read waits at most what is left of it.
struct Deadline<'a> {
    stream: &'a TcpStream,
    until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or(std::io::ErrorKind::TimedOut)?;
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

pub struct Request {
    pub method: String,
    /// The path without its query.
    pub path: String,
    pub query: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Why a request could not be read: the status to answer with and why.
#[derive(Debug)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

fn refuse(status: u16, message: impl Into<String>) -> Refusal {
    Refusal { status, message: message.into() }
}

/// Reads one request from `stream` within [`REQUEST_DEADLINE`]; a body over `max_body` bytes is
/// refused (413) before it is read. `Ok(None)`: the client closed the connection without
/// sending a request.
pub fn read_request(stream: &TcpStream, max_body: usize) -> Result<Option<Request>, Refusal> {
    let timed = Deadline { stream, until: Instant::now() + REQUEST_DEADLINE };
    let mut reader = BufReader::new(timed.take(MAX_HEAD as u64));
    let mut line = String::new();
    let mut read_line = |line: &mut String| -> Result<usize, Refusal> {
        line.clear();
        let n = reader.read_line(line).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => refuse(408, format!("the request was not sent within {} s", REQUEST_DEADLINE.as_secs())),
            std::io::ErrorKind::InvalidData => refuse(400, "the request head is not UTF-8"),
            _ => refuse(400, format!("reading the request: {e}")),
        })?;
        if n > 0 && !line.ends_with('\n') {
            return Err(refuse(431, format!("the request line and headers exceed {MAX_HEAD} bytes")));
        }
        Ok(n)
    };
    if read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.trim_end().splitn(3, ' ');
    let (method, target, version) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method.is_empty() || !target.starts_with('/') || !version.starts_with("HTTP/1.") {
        return Err(refuse(400, "malformed request line"));
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (method, path, query) = (method.to_string(), path.to_string(), query.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if read_line(&mut h)? == 0 {
            return Err(refuse(400, "the connection closed inside the request head"));
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        let (name, value) = h.split_once(':').ok_or_else(|| refuse(400, format!("malformed header line '{}'", h.chars().take(64).collect::<String>())))?;
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let mut request = Request { method, path, query, headers, body: Vec::new() };
    if request.header("transfer-encoding").is_some() {
        return Err(refuse(411, "chunked request bodies are not accepted: send Content-Length"));
    }
    let length = match request.header("content-length") {
        None => 0,
        Some(v) => v.parse::<usize>().map_err(|_| refuse(400, format!("Content-Length '{v}' is not a byte count")))?,
    };
    if length > max_body {
        return Err(refuse(413, format!("the body is {length} bytes; this server takes at most {max_body}")));
    }
    // A client that waits for leave to send its body (curl, for bodies over 1 KiB) gets it.
    if request.header("expect").is_some_and(|e| e.eq_ignore_ascii_case("100-continue")) {
        let mut out = stream;
        out.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").map_err(|e| refuse(400, format!("writing 100 Continue: {e}")))?;
    }
    // What the head's reader buffered belongs to the body; the rest is read as it arrives.
    let mut body = reader.buffer().to_vec();
    reader.consume(body.len());
    body.truncate(length);
    let timed = reader.into_inner().into_inner();
    let want = (length - body.len()) as u64;
    let got = timed.take(want).read_to_end(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => refuse(408, "the body was not sent in time"),
        _ => refuse(400, format!("reading the body: {e}")),
    })?;
    if (got as u64) < want {
        return Err(refuse(400, format!("the body ended before its Content-Length ({length} bytes)")));
    }
    request.body = body;
    Ok(Some(request))
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Payload Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// Writes a whole response.
pub fn respond(mut stream: &TcpStream, status: u16, content_type: &str, extra: &[(&str, &str)], body: &[u8]) -> std::io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n", reason(status), body.len());
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// Starts a Server-Sent Events response; events follow with [`event`], the end is the close.
pub fn start_events(mut stream: &TcpStream) -> std::io::Result<()> {
    stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\nX-Accel-Buffering: no\r\n\r\n")?;
    stream.flush()
}

/// One event: `data` is one line (JSON has no raw newlines), `name` an optional event type.
pub fn event(mut stream: &TcpStream, name: Option<&str>, data: &str) -> std::io::Result<()> {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(n) = name {
        out.push_str("event: ");
        out.push_str(n);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
    stream.write_all(out.as_bytes())?;
    stream.flush()
}

/// Ends a response sent before the request was read whole (an error about its head or size):
/// closes our side, then reads what the client still sends for a moment, so that the close
/// does not reset the connection before the client has read the response.
pub fn close_unread(stream: &TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let until = Instant::now() + Duration::from_millis(500);
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < (4 << 20) {
        let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) else { break };
        if stream.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match (&*stream).read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

/// Whether the peer has closed its side (a read would return end of file), checked without
/// blocking or consuming anything: how a generation notices its client went away.
pub fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let closed = match stream.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => true,
    };
    closed || stream.set_nonblocking(false).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A request sent by a raw client, read back by `read_request` (bounds included).
    fn roundtrip(raw: &[u8], max_body: usize) -> Result<Option<Request>, Refusal> {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let raw = raw.to_vec();
        let client = std::thread::spawn(move || {
            let mut c = TcpStream::connect(addr).unwrap();
            // The server may close before reading everything (a head over the bound).
            let _ = c.write_all(&raw);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let mut sink = Vec::new();
            let _ = c.read_to_end(&mut sink);
        });
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let r = read_request(&s, max_body);
        drop(s);
        client.join().unwrap();
        r
    }

    #[test]
    fn a_request_with_a_body_is_read_whole() {
        let r = roundtrip(b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", 100).unwrap().unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str(), r.query.as_str(), r.body.as_slice()), ("POST", "/v1/x", "a=1", b"hello".as_slice()));
        assert_eq!(r.header("host"), Some("h"));
    }

    #[test]
    fn oversized_short_and_malformed_requests_are_refused_with_their_status() {
        assert_eq!(roundtrip(b"POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", 100).err().unwrap().status, 413);
        assert_eq!(roundtrip(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 100).err().unwrap().status, 400);
        assert_eq!(roundtrip(b"GET\r\n\r\n", 100).err().unwrap().status, 400);
        assert_eq!(roundtrip(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 100).err().unwrap().status, 411);
        let mut huge = b"GET / HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        assert_eq!(roundtrip(&huge, 100).err().unwrap().status, 431);
        assert!(roundtrip(b"", 100).unwrap().is_none());
    }
}
