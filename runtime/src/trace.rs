//! A timeline of what the runtime did, written as a Chrome trace (the JSON format
//! `chrome://tracing` and Perfetto open): dense passes and their waits for slots on one track,
//! the staging thread's copies on another, so a person can see the copies overlap compute.

use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::json;

/// A track of the timeline (a "thread" in the trace viewer).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Track {
    Dense,
    Staging,
    /// The CPU side path's revision passes.
    SidePath,
    /// A device backend's queue: each span a submitted run of dispatches, from submit until its
    /// fence signalled.
    Device,
}

impl Track {
    fn id(self) -> u32 {
        match self {
            Track::Dense => 1,
            Track::Staging => 2,
            Track::SidePath => 3,
            Track::Device => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Track::Dense => "dense path",
            Track::Staging => "staging",
            Track::SidePath => "CPU side path (revision)",
            Track::Device => "device queue (dispatches)",
        }
    }
}

struct Event {
    name: String,
    track: Track,
    start: f64,
    duration: f64,
}

/// Spans recorded from any thread, in microseconds since the trace began.
pub struct Trace {
    origin: Instant,
    events: Mutex<Vec<Event>>,
}

impl Default for Trace {
    fn default() -> Self {
        Trace { origin: Instant::now(), events: Mutex::new(Vec::new()) }
    }
}

impl Trace {
    /// Records that `name` ran on `track` from `start` to `end`.
    pub fn span(&self, track: Track, name: impl Into<String>, start: Instant, end: Instant) {
        let us = |t: Instant| t.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        let event = Event { name: name.into(), track, start: us(start), duration: us(end) - us(start) };
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }

    /// The trace as Chrome's JSON object format.
    pub fn to_json(&self) -> serde_json::Value {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<serde_json::Value> = [Track::Dense, Track::Staging, Track::SidePath, Track::Device]
            .iter()
            .map(|t| json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": t.id(), "args": {"name": t.name()}}))
            .collect();
        out.extend(events.iter().map(|e| json!({"name": e.name, "ph": "X", "pid": 1, "tid": e.track.id(), "ts": e.start, "dur": e.duration})));
        json!({"traceEvents": out, "displayTimeUnit": "ms"})
    }

    /// Writes the trace to `path` whole or not at all, never over a file of `reads` (the
    /// artifact being run) or anything but a regular file.
    pub fn write(&self, path: &Path, reads: &[&Path]) -> std::io::Result<()> {
        llada_ir::files::write_atomic(path, reads, &serde_json::to_vec(&self.to_json())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_become_complete_events_on_their_tracks() {
        let t = Trace::default();
        let a = Instant::now();
        let b = a + std::time::Duration::from_millis(3);
        t.span(Track::Staging, "blocks.0.ffn", a, b);
        let v = t.to_json();
        let events = v["traceEvents"].as_array().unwrap();
        let x: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(x.len(), 1);
        assert_eq!((x[0]["tid"].as_u64(), x[0]["name"].as_str()), (Some(2), Some("blocks.0.ffn")));
        assert!((x[0]["dur"].as_f64().unwrap() - 3000.0).abs() < 1.0);
        assert_eq!(events.iter().filter(|e| e["ph"] == "M").count(), 4);
    }
}
