//! `llada-rt serve` end to end, over loopback with a plain HTTP client: the answers are
//! `llada-rt run`'s, streamed or not; extra diffusion settings take effect; every kind of bad
//! request gets its OpenAI-style error, framing errors a 400; a full queue is a 429; a client
//! that goes away cancels its generation (streamed or not), and one that stops reading is cut
//! off; SIGTERM lets a running generation finish, refuses the queued ones (503) and exits
//! within its timeout; Host, Origin and Content-Type are checked unless the key authorizes;
//! one connection carries many requests; `/metrics` counts them.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const FILL: &str = "FILL:3000705000000920000040015000608000070060300000004000000800900010=";

/// A server on a free port; killed when dropped.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(artifact: &Path, args: &[&str]) -> Server {
        let mut child = Command::new(common::bin("llada-rt"))
            .arg("serve")
            .arg(artifact)
            .args(["--port", "0", "--threads", "1"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("llada-rt starts");
        let mut line = String::new();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        stderr.read_line(&mut line).unwrap();
        let port = line.split("http://127.0.0.1:").nth(1).and_then(|r| r.split('/').next()).and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("no address in {line:?}"));
        // The rest of stderr is drained, so the server never blocks writing it.
        std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
        Server { child, port }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        s
    }

    /// Sends a request; the response's status, head and body.
    fn request(&self, method: &str, path: &str, headers: &[&str], body: &[u8]) -> (u16, String, Vec<u8>) {
        let mut s = self.connect();
        send(&mut s, method, path, headers, body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        split_response(&raw)
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, body) = self.request("POST", path, &[], body.to_string().as_bytes());
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    fn health(&self) -> Value {
        let (_, _, body) = self.request("GET", "/health", &[], b"");
        serde_json::from_slice(&body).unwrap()
    }

    /// Waits (at most a minute) until `/health`'s `field` is `value`; `what` names the wait.
    fn wait_for_health(&self, field: &str, value: u64, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.health()[field] != value {
            assert!(Instant::now() < deadline, "{what}: {}", self.health());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a streamed request and reads up to its first event: from then on it holds a
    /// session. The stream's reader, to read the rest or to drop. With no queue, a request
    /// that arrives before the worker waits for one (a server just started, on a loaded
    /// machine) is refused with a 429: it is sent again.
    /// A server whose one session a stream holds that cannot end: a stream of every step's
    /// canvas, which its client (returned) does not read, outgrows the sockets' buffers, and
    /// the stall and shutdown timeouts are long.
    fn held(artifact: &Path) -> (Server, BufReader<TcpStream>) {
        let server = Server::start(artifact, &["--shutdown-timeout", "600", "--stall-timeout", "600"]);
        let reader = server.open_stream(&chat(FILL, json!({"max_tokens": 128, "steps": 65536, "stream": true, "llada_steps": true})));
        (server, reader)
    }

    /// Sends the server `signal` (`TERM`, `INT`).
    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args([format!("-{signal}").as_str(), &pid]).status().unwrap().success());
    }

    /// A whole-answer request that waits in the queue (a session is held): its connection.
    fn queue_one(&self) -> TcpStream {
        let mut queued = self.connect();
        send(&mut queued, "POST", "/v1/chat/completions", &[], chat(FILL, json!({"max_tokens": 64, "steps": 64})).to_string().as_bytes());
        self.wait_for_health("queued", 1, "the second request was not queued");
        queued
    }

    fn open_stream(&self, body: &Value) -> BufReader<TcpStream> {
        for _ in 0..50 {
            let mut s = self.connect();
            send(&mut s, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
            let mut reader = BufReader::new(s);
            let mut line = String::new();
            let mut seen = String::new();
            while !line.starts_with("data: ") {
                line.clear();
                if reader.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                seen.push_str(&line);
            }
            if line.starts_with("data: ") {
                return reader;
            }
            assert!(seen.starts_with("HTTP/1.1 429"), "the stream ended before its first event:\n{seen}");
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the stream was refused 50 times");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends a request whose response ends with the connection (`Connection: close`), its body
/// as JSON unless `headers` say otherwise.
fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[&str], body: &[u8]) {
    let mut all = vec!["Connection: close"];
    if !headers.iter().any(|h| h.to_ascii_lowercase().starts_with("content-type:")) {
        all.push("Content-Type: application/json");
    }
    all.extend_from_slice(headers);
    send_raw(s, method, path, &all, body);
}

/// Sends a request with exactly `headers` besides `Host` and `Content-Length`.
fn send_raw(s: &mut TcpStream, method: &str, path: &str, headers: &[&str], body: &[u8]) {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n", body.len());
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
}

/// A whole response: its status, head, and body (de-chunked where it was sent in chunks).
fn split_response(raw: &[u8]) -> (u16, String, Vec<u8>) {
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head");
    let head = String::from_utf8_lossy(&raw[..at]).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    let body = &raw[at + 4..];
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    (status, head, if chunked { dechunk(body) } else { body.to_vec() })
}

/// A chunked body's data (as much of it as arrived).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..line_end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let data = &raw[line_end + 2..];
        out.extend_from_slice(&data[..size.min(data.len())]);
        raw = data.get(size + 2..).unwrap_or(&[]);
    }
    out
}

/// Reads one response off a kept-alive connection (its body by `Content-Length`).
fn read_one(reader: &mut BufReader<TcpStream>) -> (u16, String, Vec<u8>) {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the connection closed inside a response head: {head}");
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap();
    let length: usize = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap())).expect("a Content-Length");
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    (status, head, body)
}

/// The `data:` payloads of an event stream, with their event names.
fn events(body: &[u8]) -> Vec<(Option<String>, String)> {
    String::from_utf8_lossy(body)
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let name = b.lines().find_map(|l| l.strip_prefix("event: ")).map(str::to_string);
            let data = b.lines().filter_map(|l| l.strip_prefix("data: ")).collect::<String>();
            (name, data)
        })
        .collect()
}

fn chat(prompt: &str, extra: Value) -> Value {
    let mut body = json!({"model": "embedded", "messages": [{"role": "user", "content": prompt}]});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

/// `llada-rt run --json`'s answer text for the same settings.
fn run_text(artifact: &Path, args: &[&str]) -> (String, u64) {
    let mut all = vec!["run", artifact.to_str().unwrap(), "--chat", "-p", FILL, "--json", "--threads", "1"];
    all.extend_from_slice(args);
    let out = common::run("llada-rt", &all);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["text"].as_str().unwrap().to_string(), v["forward_passes"].as_u64().unwrap())
}

#[test]
fn chat_streamed_and_not_gives_runs_text_and_extra_settings_take_effect() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let server = Server::start(&artifact, &[]);
    let (models_status, _, models) = server.request("GET", "/v1/models", &[], b"");
    assert_eq!(models_status, 200);
    assert_eq!(serde_json::from_slice::<Value>(&models).unwrap()["data"][0]["id"], "embedded");

    for (settings, args) in [
        (json!({"max_tokens": 64, "steps": 64}), vec!["--gen-len", "64", "--steps", "64"]),
        (json!({"max_tokens": 64, "steps": 16, "policy": "dual", "block_len": 32}), vec!["--gen-len", "64", "--steps", "16", "--policy", "dual", "--block-len", "32"]),
        (json!({"max_tokens": 64, "steps": 64, "temperature": 0.7, "seed": 5}), vec!["--gen-len", "64", "--steps", "64", "--temperature", "0.7", "--seed", "5"]),
    ] {
        let (text, passes) = run_text(&artifact, &args);
        let (status, answer) = server.post("/v1/chat/completions", &chat(FILL, settings.clone()));
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["object"], "chat.completion");
        assert_eq!(answer["choices"][0]["message"]["content"], text.as_str(), "{settings}");
        assert_eq!(answer["llada"]["forward_passes"].as_u64(), Some(passes), "{settings}: the extra settings decide the passes");

        let mut streamed = settings.clone();
        streamed["stream"] = json!(true);
        let (status, head, body) = server.request("POST", "/v1/chat/completions", &[], chat(FILL, streamed).to_string().as_bytes());
        assert_eq!(status, 200);
        assert!(head.contains("text/event-stream"), "{head}");
        let events = events(&body);
        assert_eq!(events.last().unwrap().1, "[DONE]");
        let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
        let joined: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(joined, text, "{settings}: the stream's text");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"].is_string()));
        assert!(chunks.last().unwrap()["usage"]["completion_tokens"].as_u64().unwrap() > 0);
        // More than one text chunk: the settled prefix streams while the generation runs.
        assert!(chunks.iter().filter(|c| c["choices"][0]["delta"]["content"].as_str().is_some_and(|t| !t.is_empty())).count() > 1, "{settings}");
    }

    // The completions endpoint on plain text, and the opt-in step events.
    let (status, answer) = server.post("/v1/completions", &json!({"model": "embedded", "prompt": "REVERSE:ABC=", "max_tokens": 16, "steps": 16}));
    assert_eq!((status, answer["object"].as_str()), (200, Some("text_completion")), "{answer}");
    let body = chat(FILL, json!({"max_tokens": 64, "steps": 8, "stream": true, "llada_steps": true}));
    let (_, _, raw) = server.request("POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let steps: Vec<Value> = events(&raw).iter().filter(|(n, _)| n.as_deref() == Some("step")).map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(steps.len(), 8);
    assert_eq!(steps[7]["canvas"].as_array().unwrap().len(), 64);
    assert!(steps[7]["canvas"].as_array().unwrap().iter().all(|t| t.is_string()), "the last step leaves no mask");
    // A stop sequence cuts the answer.
    let (_, answer) = server.post("/v1/chat/completions", &chat(FILL, json!({"max_tokens": 64, "steps": 64, "stop": "22"})));
    assert_eq!(answer["choices"][0]["message"]["content"], "33337755555559");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    // Streamed, it stops the generation where the stop sequence settles; the passes it made
    // are reported and counted.
    let passes_counted = |server: &Server| {
        let (_, _, metrics) = server.request("GET", "/metrics", &[], b"");
        let metrics = String::from_utf8(metrics).unwrap();
        metrics.lines().find_map(|l| l.strip_prefix("llada_dense_passes_total ")).map_or(0, |v| v.trim().parse::<u64>().unwrap())
    };
    let before = passes_counted(&server);
    let body = chat(FILL, json!({"max_tokens": 64, "steps": 64, "stop": "22", "stream": true}));
    let (_, _, raw) = server.request("POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let chunks: Vec<Value> = events(&raw).iter().filter(|(_, d)| d != "[DONE]").map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    let joined: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(joined, "33337755555559");
    let end = chunks.iter().find(|c| c["choices"][0]["finish_reason"].is_string()).unwrap();
    assert_eq!(end["choices"][0]["finish_reason"], "stop");
    let passes = end["llada"]["forward_passes"].as_u64().unwrap();
    assert!(passes > 0 && passes < 64, "{passes} passes: the generation stopped before its 64 steps");
    assert!(end["llada"]["output_ids"].is_null(), "a cut canvas still holds masks: {end}");
    assert_eq!(passes_counted(&server) - before, passes);
}

#[test]
fn each_kind_of_bad_request_gets_one_openai_error() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let server = Server::start(&artifact, &["--api-key", "sekrit", "--max-body", "4096"]);
    let key = "Authorization: Bearer sekrit";
    let ok = chat("REVERSE:AB=", json!({"max_tokens": 8, "steps": 8})).to_string();
    let cases: Vec<(&str, Vec<&str>, String, u16, Option<&str>)> = vec![
        ("no key", vec![], ok.clone(), 401, None),
        ("wrong key", vec!["Authorization: Bearer nope"], ok.clone(), 401, None),
        ("malformed JSON", vec![key], "{\"model\":".into(), 400, None),
        ("not an object", vec![key], "[1,2]".into(), 400, None),
        ("unknown model", vec![key], chat("a", json!({})).to_string().replace("embedded", "gpt-9"), 404, Some("model")),
        ("wrong type", vec![key], chat("a", json!({"max_tokens": "many"})).to_string(), 400, Some("max_tokens")),
        ("out of range", vec![key], chat("a", json!({"max_tokens": 100000})).to_string(), 400, Some("max_tokens")),
        ("a setting out of range", vec![key], chat("a", json!({"threshold": 2.0})).to_string(), 400, Some("threshold")),
        ("a setting its policy ignores", vec![key], chat("a", json!({"rows": 8})).to_string(), 400, Some("rows")),
        ("unknown field", vec![key], chat("a", json!({"logprobs": true})).to_string(), 400, Some("logprobs")),
        ("n above 1", vec![key], chat("a", json!({"n": 3})).to_string(), 400, Some("n")),
        ("empty message", vec![key], chat("", json!({})).to_string(), 400, Some("messages")),
        ("bad role", vec![key], ok.replace("\"user\"", "\"robot\""), 400, Some("messages")),
        ("oversized body", vec![key], format!("{{\"x\":\"{}\"}}", "a".repeat(5000)), 413, None),
        // Whole numbers out of their range, however large: the field and its range.
        ("max_tokens 2^63", vec![key], chat("a", json!({"max_tokens": 1u64 << 63})).to_string(), 400, Some("max_tokens")),
        ("seed 2^64", vec![key], chat("a", json!({"max_tokens": 8, "steps": 8})).to_string().replace("\"steps\":8", "\"steps\":8,\"seed\":18446744073709551616"), 400, Some("seed")),
        ("negative seed", vec![key], chat("a", json!({"max_tokens": 8, "steps": 8, "seed": -1})).to_string(), 400, Some("seed")),
        // A prompt the model cannot take: its field, before it is queued.
        ("a mask in the prompt", vec![key], chat("REVERSE:<|mdm_mask|>=", json!({"max_tokens": 8, "steps": 8})).to_string(), 400, Some("messages")),
    ];
    let bodies: std::collections::HashMap<&str, String> = cases.iter().map(|c| (c.0, c.2.clone())).collect();
    for (what, headers, body, status, param) in cases {
        let (got, head, raw) = server.request("POST", "/v1/chat/completions", &headers, body.as_bytes());
        let v: Value = serde_json::from_slice(&raw).unwrap_or_else(|_| panic!("{what}: not JSON: {}", String::from_utf8_lossy(&raw)));
        assert_eq!(got, status, "{what}: {v}");
        assert!(head.contains("application/json"), "{what}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {v}");
        assert!(v["error"]["type"].is_string(), "{what}: {v}");
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{what}: {v}");
        }
    }
    let messages = [
        ("max_tokens 2^63", "max_tokens: 9223372036854775808 is outside 1..="),
        ("seed 2^64", "seed: 18446744073709551616 is outside 0..=18446744073709551615"),
        ("negative seed", "seed: -1 is outside 0..=18446744073709551615"),
        ("a mask in the prompt", "is the mask token"),
    ];
    for (what, words) in messages {
        let body = &bodies[what];
        let (_, _, raw) = server.request("POST", "/v1/chat/completions", &[key], body.as_bytes());
        let v: Value = serde_json::from_slice(&raw).unwrap();
        assert!(v["error"]["message"].as_str().unwrap().contains(words), "{what}: {v}");
    }
    // Seeds take the whole u64 range.
    for seed in [1u64 << 63, u64::MAX] {
        let body = chat("REVERSE:AB=", json!({"max_tokens": 8, "steps": 8, "temperature": 0.5, "seed": seed})).to_string();
        let (got, _, raw) = server.request("POST", "/v1/chat/completions", &[key], body.as_bytes());
        assert_eq!(got, 200, "seed {seed}: {}", String::from_utf8_lossy(&raw));
    }
    // Token ids outside the vocabulary, or the mask's id, name the completion's prompt.
    for (ids, words) in [(json!([1, 99999]), "token id 99999 is outside the vocabulary"), (json!([1, 275]), "prompt token 1 is the mask token (id 275)")] {
        let body = json!({"model": "embedded", "prompt": ids, "max_tokens": 8, "steps": 8}).to_string();
        let (got, _, raw) = server.request("POST", "/v1/completions", &[key], body.as_bytes());
        let v: Value = serde_json::from_slice(&raw).unwrap();
        assert_eq!((got, &v["error"]["param"]), (400, &json!("prompt")), "{ids}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(words), "{ids}: {v}");
    }
    // Wrong method, unknown path, a request that never finishes its head.
    assert_eq!(server.request("GET", "/v1/chat/completions", &[key], b"").0, 405);
    assert_eq!(server.request("GET", "/v2/nothing", &[key], b"").0, 404);
    let mut raw = server.connect();
    raw.write_all(b"garbage\r\n\r\n").unwrap();
    let mut out = Vec::new();
    raw.read_to_end(&mut out).unwrap();
    assert_eq!(split_response(&out).0, 400);
    // The server is still well: a good request is answered.
    assert_eq!(server.request("POST", "/v1/chat/completions", &[key], ok.as_bytes()).0, 200);
}

#[test]
fn a_full_queue_is_a_429_and_a_client_that_leaves_cancels_its_generation() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    // No stall timeout in this test's time: only the client leaving may end a generation.
    let server = Server::start(&artifact, &["--queue", "0", "--stall-timeout", "600"]);
    // Generations that only a cancel ends in time. Streamed with every step's canvas, one is
    // held by its client (100 MB of events, more than the sockets buffer): it cannot finish
    // while the client does not read. A whole answer is only long: 65536 steps, about 2 s here.
    let long = |stream: bool| chat(FILL, json!({"max_tokens": 128, "steps": 65536, "stream": stream, "llada_steps": stream}));
    // A long generation, streamed: once its first chunk arrives it holds the one session.
    let first = server.open_stream(&long(true));
    let (status, refused) = server.post("/v1/chat/completions", &chat(FILL, json!({"max_tokens": 8, "steps": 8})));
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "rate_limit_exceeded");
    // The client goes away: its generation stops and the session serves the next request at
    // once (no queue: an idle session takes it whatever its worker is doing between jobs).
    drop(first);
    server.wait_for_health("cancelled", 1, "the abandoned generation was not cancelled");
    let reply = server.post("/v1/chat/completions", &chat(FILL, json!({"max_tokens": 64, "steps": 64})));
    assert_eq!(reply.0, 200, "{}", reply.1);
    assert_eq!(reply.1["choices"][0]["message"]["content"], "3333775555555922222244415555668888877766333333334444444888999911");

    // A client waiting for a whole (not streamed) answer that goes away cancels it too.
    let mut waiting = server.connect();
    send(&mut waiting, "POST", "/v1/chat/completions", &[], long(false).to_string().as_bytes());
    server.wait_for_health("running", 1, "the request never ran");
    drop(waiting);
    server.wait_for_health("cancelled", 2, "the abandoned request was not cancelled");
}

#[test]
fn a_slow_client_is_cut_off_and_null_settings_and_usage_chunks_are_as_openais() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let server = Server::start(&artifact, &[]);
    // A head that never ends: answered 408 within the request deadline, not held.
    let mut slow = server.connect();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 10\r\n").unwrap();
    let mut out = Vec::new();
    slow.read_to_end(&mut out).unwrap();
    assert_eq!(split_response(&out).0, 408);
    // null is "not given"; the usage-only chunk (no choices) comes only when asked for.
    let body = chat(FILL, json!({"max_tokens": 64, "steps": 64, "seed": null, "temperature": null, "stream": true}));
    let (_, _, raw) = server.request("POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    let chunks: Vec<Value> = events(&raw).iter().filter(|(_, d)| d != "[DONE]").map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    assert!(chunks.iter().all(|c| !c["choices"].as_array().unwrap().is_empty()), "a chunk without choices was not asked for");
    assert!(chunks.last().unwrap()["usage"]["total_tokens"].as_u64().is_some());
    let mut asked = body.clone();
    asked["stream_options"] = json!({"include_usage": true});
    let (_, _, raw) = server.request("POST", "/v1/chat/completions", &[], asked.to_string().as_bytes());
    let chunks: Vec<Value> = events(&raw).iter().filter(|(_, d)| d != "[DONE]").map(|(_, d)| serde_json::from_str(d).unwrap()).collect();
    assert_eq!(chunks.last().unwrap()["choices"], json!([]));
    // A request the sampler refuses after parsing (a prompt holding the mask token) gets its
    // status, not a 200 stream with an error in it.
    let (status, _, raw) = server.request("POST", "/v1/completions", &[], json!({"model": "embedded", "prompt": [1, 2, 275], "max_tokens": 32, "stream": true}).to_string().as_bytes());
    assert!(status == 400, "{status}: {}", String::from_utf8_lossy(&raw));
}

#[test]
fn sigterm_lets_the_running_generation_finish_refuses_the_queued_and_exits() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    // The drain may take as long as the generation needs: a busy machine must not turn the
    // finished stream this test expects into a cancelled one.
    let mut server = Server::start(&artifact, &["--shutdown-timeout", "600"]);
    // Long enough (about 2 s here) that the second request is sure to find it running.
    let mut reader = server.open_stream(&chat(FILL, json!({"max_tokens": 64, "steps": 65536, "stream": true})));
    // A second request waits in the queue behind it.
    let mut queued = server.queue_one();
    server.signal("TERM");
    let mut raw = Vec::new();
    reader.read_to_end(&mut raw).unwrap();
    // The rest of the stream, read from inside its first chunk: its events, then the chunked
    // body's proper end.
    let rest = String::from_utf8_lossy(&raw).into_owned();
    assert!(rest.contains("\"finish_reason\":\"length\"") && rest.contains("data: [DONE]\n\n") && rest.ends_with("\r\n0\r\n\r\n"), "the running stream was cut: {rest}");
    let status = server.child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut reply = Vec::new();
    queued.read_to_end(&mut reply).unwrap();
    let (status, _, body) = split_response(&reply);
    assert_eq!(status, 503, "the queued request: {}", String::from_utf8_lossy(&body));
    assert!(TcpStream::connect(("127.0.0.1", server.port)).is_err(), "still listening after SIGTERM");
}

/// A queued request hears 503 as SIGTERM comes, not once a session is free: here the running
/// generation cannot end (its client reads nothing of an every-step canvas stream, and the
/// timeouts are long), so a 503 that waited for it would never come (the read times out).
/// A generation that the shutdown timeout cancels is a 503 too, not a fault.
#[test]
fn sigterm_refuses_the_queued_at_once_and_a_timed_out_answer_is_503() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let (mut server, held) = Server::held(&artifact);
    let mut queued = server.queue_one();
    server.signal("TERM");
    let mut reply = Vec::new();
    queued.read_to_end(&mut reply).unwrap();
    let (status, _, body) = split_response(&reply);
    assert_eq!(status, 503, "the queued request: {}", String::from_utf8_lossy(&body));
    drop(held);
    assert!(server.child.wait().unwrap().success());

    // A whole answer still running when the shutdown timeout passes: 503 with Retry-After.
    // (Every row, 160 tokens in 65535 steps: about 8 s here; the timeout 0 cancels it at once.)
    let mut server = Server::start(&artifact, &["--shutdown-timeout", "0"]);
    let mut running = server.connect();
    send(&mut running, "POST", "/v1/chat/completions", &[], chat(FILL, json!({"max_tokens": 160, "steps": 65535, "policy": "exact"})).to_string().as_bytes());
    server.wait_for_health("running", 1, "the generation never ran");
    server.signal("TERM");
    let mut reply = Vec::new();
    running.read_to_end(&mut reply).unwrap();
    let (status, headers, body) = split_response(&reply);
    assert_eq!(status, 503, "the cancelled answer: {}", String::from_utf8_lossy(&body));
    assert!(headers.to_ascii_lowercase().contains("retry-after: 1"), "{headers}");
    assert!(server.child.wait().unwrap().success());
}

#[test]
fn host_origin_and_content_type_are_checked_unless_the_key_authorizes() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let ok = chat("REVERSE:AB=", json!({"max_tokens": 8, "steps": 8})).to_string();
    let server = Server::start(&artifact, &["--allow-origin", "https://app.example"]);
    let post = |headers: &[&str], content_type: &str| {
        let mut s = server.connect();
        let mut all = vec!["Connection: close", content_type];
        all.extend_from_slice(headers);
        send_raw(&mut s, "POST", "/v1/chat/completions", &all, ok.as_bytes());
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let (status, _, body) = split_response(&raw);
        (status, serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null))
    };
    let json_type = "Content-Type: application/json";
    // `send_raw` names the server `localhost`; a second Host line is what a rebinding page's
    // request looks like only in its value, so these send their own Host instead.
    let with_host = |host: &str, extra: &[&str]| {
        let mut s = server.connect();
        let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{json_type}\r\nContent-Length: {}\r\n{}\r\n", ok.len(), extra.iter().map(|h| format!("{h}\r\n")).collect::<String>());
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(ok.as_bytes()).unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        split_response(&raw).0
    };
    assert_eq!(with_host("evil.example:8080", &[]), 403, "DNS rebinding: another name");
    assert_eq!(with_host(&format!("127.0.0.1:{}", server.port), &[]), 200);
    let evil = post(&["Origin: http://evil.example"], json_type);
    assert_eq!((evil.0, evil.1["error"]["code"].as_str()), (403, Some("forbidden_origin")), "{}", evil.1);
    assert_eq!(post(&["Origin: https://app.example"], json_type).0, 200, "an allowed origin");
    // The server's own page: its origin is the Host the browser sends.
    assert_eq!(with_host(&format!("localhost:{}", server.port), &[&format!("Origin: http://localhost:{}", server.port)]), 200, "the server's own page");
    assert_eq!(with_host(&format!("localhost:{}", server.port), &["Origin: http://localhost:1"]), 403, "another port is another site");
    // A form or text body is not JSON, whatever it holds (a cross-site form needs no preflight).
    assert_eq!(post(&[], "Content-Type: text/plain").0, 415);
    assert_eq!(post(&[], "Content-Type: application/x-www-form-urlencoded").0, 415);
    drop(server);

    // With a key, the key decides: any Host or Origin, the scheme in any case.
    let keyed = Server::start(&artifact, &["--api-key", "sekrit"]);
    let mut s = keyed.connect();
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: evil.example\r\nOrigin: http://evil.example\r\nAuthorization: bearer sekrit\r\nConnection: close\r\n{json_type}\r\nContent-Length: {}\r\n\r\n", ok.len());
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(ok.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    assert_eq!(split_response(&raw).0, 200, "{}", String::from_utf8_lossy(&raw));
}

#[test]
fn framing_errors_are_400_and_one_connection_carries_many_requests() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let server = Server::start(&artifact, &[]);
    let ok = chat("REVERSE:AB=", json!({"max_tokens": 8, "steps": 8})).to_string();
    let raw_exchange = |raw: &[u8], half_close: bool| {
        let mut s = server.connect();
        s.write_all(raw).unwrap();
        if half_close {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    };
    let status = |out: &[u8]| if out.is_empty() { 0 } else { split_response(out).0 };
    let framed = |headers: &str| format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n{headers}\r\n\r\n{ok}");
    // RFC 9112 section 6.3: differing lengths, a signed length, a coding that is not chunked.
    let len = ok.len();
    assert_eq!(status(&raw_exchange(framed(&format!("Content-Length: {len}\r\nContent-Length: {}", len + 1)).as_bytes(), false)), 400, "two lengths");
    assert_eq!(status(&raw_exchange(framed(&format!("Content-Length: +{len}")).as_bytes(), false)), 400, "a signed length");
    assert_eq!(status(&raw_exchange(framed("Transfer-Encoding: identity").as_bytes(), false)), 400, "a coding other than chunked");
    // A coding before chunked: framed as chunked, but its bytes are not plain JSON: 501 (RFC
    // 9112 section 6.1), with the error object.
    let (first, rest) = ok.split_at(ok.len() / 2);
    let coded = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{rest}\r\n0\r\n\r\n", first.len(), rest.len());
    let out = raw_exchange(coded.as_bytes(), false);
    let (code, _, body) = split_response(&out);
    assert_eq!(code, 501, "{}", String::from_utf8_lossy(&out));
    assert!(String::from_utf8_lossy(&body).contains("Transfer-Encoding 'gzip'"), "{}", String::from_utf8_lossy(&body));
    // A short head, half-closed: the connection ended inside the head, not a head too large.
    let out = raw_exchange(b"POST /v1/chat/completions HTTP/1.1\r\nHost: local", true);
    let (code, _, body) = split_response(&out);
    assert_eq!(code, 400, "{}", String::from_utf8_lossy(&out));
    assert!(String::from_utf8_lossy(&body).contains("before the request head was whole"));

    // One connection, many requests (keep-alive), then a chunked body on it.
    let mut s = server.connect();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    for i in 0..100 {
        send_raw(&mut s, "GET", "/v1/models", &[], b"");
        let (code, _, body) = read_one(&mut reader);
        assert_eq!(code, 200, "request {i} on the kept-alive connection");
        assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["data"][0]["id"], "embedded");
    }
    let (first, rest) = ok.split_at(ok.len() / 2);
    let chunked = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{first}\r\n{:x}\r\n{rest}\r\n0\r\n\r\n", first.len(), rest.len());
    s.write_all(chunked.as_bytes()).unwrap();
    let (code, _, body) = read_one(&mut reader);
    assert_eq!(code, 200, "a chunked body: {}", String::from_utf8_lossy(&body));
    let whole = server.post("/v1/chat/completions", &serde_json::from_str(&ok).unwrap()).1;
    assert_eq!(serde_json::from_slice::<Value>(&body).unwrap()["choices"], whole["choices"], "a chunked body reads as the same request");
    // `/metrics`: this connection counted once, and the requests by endpoint and status.
    let (_, _, metrics) = server.request("GET", "/metrics", &[], b"");
    let metrics = String::from_utf8(metrics).unwrap();
    let sample = |name: &str| metrics.lines().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    assert_eq!(sample("llada_requests_total{endpoint=\"/v1/models\",status=\"200\"}"), 100.0, "{metrics}");
    assert_eq!(sample("llada_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"), 2.0, "{metrics}");
    let chunked_answer: Value = serde_json::from_slice(&body).unwrap();
    let completion = |v: &Value| v["usage"]["completion_tokens"].as_f64().unwrap();
    assert_eq!(sample("llada_tokens_generated_total"), completion(&chunked_answer) + completion(&whole), "{metrics}");
    assert_eq!(sample("llada_dense_passes_total"), 16.0, "two answers of 8 steps: {metrics}");
    assert!(sample("process_resident_memory_bytes") > 0.0, "{metrics}");
}

#[test]
fn a_reader_that_stalls_is_cut_off_and_sigterm_ends_within_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    let mut server = Server::start(&artifact, &["--stall-timeout", "2", "--shutdown-timeout", "2"]);
    // A stream of every step's canvas from a client that never reads: its buffers fill, the
    // generation waits, and after the stall timeout it is cancelled and its session freed.
    let body = chat(FILL, json!({"max_tokens": 128, "steps": 65536, "stream": true, "llada_steps": true}));
    let mut stalled = server.connect();
    send(&mut stalled, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    server.wait_for_health("cancelled", 1, "the stalled stream was not cancelled");
    let (status, _) = server.post("/v1/chat/completions", &chat(FILL, json!({"max_tokens": 8, "steps": 8})));
    assert_eq!(status, 200, "the freed session serves the next request");
    // SIGTERM with another stalled stream: the server exits 0 within the shutdown timeout
    // (plus a margin), not when the client leaves.
    let mut second = server.connect();
    send(&mut second, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    server.wait_for_health("running", 1, "the second stream never ran");
    let signalled = Instant::now();
    server.signal("TERM");
    // Both stalled clients stay connected until the server is gone: it must not wait for
    // them. (A bound, not a timing figure: the drain lasts the 2 s timeout; the margin is wide.)
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(signalled.elapsed() < Duration::from_secs(60), "still running {:?} after SIGTERM with stalled readers", signalled.elapsed());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
    eprintln!("exited {:?} after SIGTERM, shutdown timeout 2 s", signalled.elapsed());
    drop((stalled, second));
}

#[test]
fn a_second_signal_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let artifact = common::embedded(dir.path());
    // The held stream keeps the first signal's drain going.
    let (mut server, _reader) = Server::held(&artifact);
    server.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    assert!(server.child.try_wait().unwrap().is_none(), "the first signal drains: the running stream may finish");
    server.signal("INT");
    let status = server.child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "the second signal exits at once: {status}");
}
