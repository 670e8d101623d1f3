//! The loop every target shares: run `exec` on generated inputs until a number of
//! executions or seconds, catching panics (each a crash, its input saved) and timing every
//! execution (one over a second is reported as a hang). An abort kills the process: the
//! printed seed and execution number replay it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::mutate::Rng;

pub struct Limits {
    pub execs: u64,
    pub seconds: f64,
    pub seed: u64,
    pub crashes: PathBuf,
}

#[derive(Default)]
pub struct Report {
    pub execs: u64,
    /// Inputs the code under test accepted (parsed and verified, or loaded).
    pub accepted: u64,
    pub crashes: u64,
    pub hangs: u64,
    pub seconds: f64,
    pub slowest: Duration,
}

static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// What one execution did with its input.
pub enum Outcome {
    Refused,
    Accepted,
}

/// Runs `test(make(rng))` under `limits`; a crash saves `save(input)`.
pub fn run<I>(name: &str, limits: &Limits, mut make: impl FnMut(&mut Rng) -> I, mut test: impl FnMut(&I) -> Outcome, save: impl Fn(&I) -> Vec<u8>) -> Report {
    std::panic::set_hook(Box::new(|info| {
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = info.to_string();
    }));
    let mut rng = Rng::new(limits.seed);
    let mut r = Report::default();
    let start = Instant::now();
    println!("{name}: seed {} (replay: the same seed; executions are numbered from 0)", limits.seed);
    while r.execs < limits.execs && start.elapsed().as_secs_f64() < limits.seconds {
        let input = make(&mut rng);
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| test(&input)));
        let took = t.elapsed();
        r.slowest = r.slowest.max(took);
        match outcome {
            Ok(Outcome::Accepted) => r.accepted += 1,
            Ok(Outcome::Refused) => {}
            Err(_) => {
                r.crashes += 1;
                let path = limits.crashes.join(format!("{name}-{}", r.execs));
                let _ = std::fs::create_dir_all(&limits.crashes);
                let _ = std::fs::write(&path, save(&input));
                let msg = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).clone();
                println!("CRASH at execution {}: {msg} (input: {})", r.execs, path.display());
            }
        }
        if took > Duration::from_secs(1) {
            r.hangs += 1;
            println!("SLOW execution {}: {:.1} s", r.execs, took.as_secs_f64());
        }
        r.execs += 1;
        if r.execs.is_multiple_of(100_000) {
            println!("  {} executions, {} accepted, {} crashes, {:.0} s", r.execs, r.accepted, r.crashes, start.elapsed().as_secs_f64());
        }
    }
    r.seconds = start.elapsed().as_secs_f64();
    let _ = std::panic::take_hook();
    r
}
