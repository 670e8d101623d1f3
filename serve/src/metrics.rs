//! `GET /metrics`: what the server did, in Prometheus' text format, from a registry of its own
//! (the `prometheus` crate, without its protobuf part).

use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus::{Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

use crate::workers::Load;

pub(crate) struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    duration: HistogramVec,
    time_to_first_token: Histogram,
    connections: IntCounter,
    tokens: IntCounter,
    dense_passes: IntCounter,
    queue_depth: IntGauge,
    sessions_busy: IntGauge,
    resident: IntGauge,
}

/// Latency buckets from 5 ms to about 5 minutes.
fn seconds_buckets() -> Vec<f64> {
    prometheus::exponential_buckets(0.005, 2.0, 17).expect("valid buckets")
}

impl Metrics {
    pub(crate) fn new() -> Metrics {
        let requests = IntCounterVec::new(Opts::new("llada_requests_total", "HTTP requests answered, by endpoint and status"), &["endpoint", "status"]).expect("valid metric");
        let duration = HistogramVec::new(HistogramOpts::new("llada_request_duration_seconds", "From a request's head to its response's end, by endpoint").buckets(seconds_buckets()), &["endpoint"]).expect("valid metric");
        let time_to_first_token = Histogram::with_opts(HistogramOpts::new("llada_time_to_first_token_seconds", "Streams: from the request's head to its first chunk of text").buckets(seconds_buckets())).expect("valid metric");
        let connections = IntCounter::new("llada_connections_total", "Connections accepted").expect("valid metric");
        let tokens = IntCounter::new("llada_tokens_generated_total", "Tokens of the answers sent (their usage's completion_tokens)").expect("valid metric");
        let dense_passes = IntCounter::new("llada_dense_passes_total", "Dense passes of the generations answered").expect("valid metric");
        let queue_depth = IntGauge::new("llada_queue_depth", "Requests waiting for a session").expect("valid metric");
        let sessions_busy = IntGauge::new("llada_sessions_busy", "Sessions generating").expect("valid metric");
        let resident = IntGauge::new("process_resident_memory_bytes", "Resident memory of the server process").expect("valid metric");
        let registry = Registry::new();
        for m in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(time_to_first_token.clone()),
            Box::new(connections.clone()),
            Box::new(tokens.clone()),
            Box::new(dense_passes.clone()),
            Box::new(queue_depth.clone()),
            Box::new(sessions_busy.clone()),
            Box::new(resident.clone()),
        ] {
            registry.register(m).expect("each metric registered once");
        }
        Metrics { registry, requests, duration, time_to_first_token, connections, tokens, dense_passes, queue_depth, sessions_busy, resident }
    }

    /// A response to `endpoint` (a route's path, or `other`) with `status`, `took` after its head.
    pub(crate) fn answered(&self, endpoint: &str, status: u16, took: Duration) {
        let status = status.to_string();
        self.requests.with_label_values(&[endpoint, status.as_str()]).inc();
        self.duration.with_label_values(&[endpoint]).observe(took.as_secs_f64());
    }

    pub(crate) fn first_token(&self, after: Duration) {
        self.time_to_first_token.observe(after.as_secs_f64());
    }

    pub(crate) fn connection(&self) {
        self.connections.inc();
    }

    /// An answer's tokens (its usage's `completion_tokens`) and its generation's passes.
    pub(crate) fn answered_tokens(&self, tokens: usize, passes: u64) {
        self.tokens.inc_by(tokens as u64);
        self.dense_passes.inc_by(passes);
    }

    /// The text exposition, with the gauges read now.
    pub(crate) fn render(&self, load: &Load) -> String {
        self.queue_depth.set(load.queued.load(Ordering::SeqCst) as i64);
        self.sessions_busy.set(load.running.load(Ordering::SeqCst) as i64);
        self.resident.set(resident_bytes().unwrap_or(0) as i64);
        let mut out = Vec::new();
        // Encoding our own families into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The process's resident set (`VmRSS` of /proc/self/status), on Linux.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    Some(kib * 1024)
}
