//! A rayon thread pool whose drop joins its threads. Rayon's own pool only asks its threads
//! to stop; an app that frees a session and then unloads the library, or counts its threads,
//! must not find ours still running.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A handle on the pool: clones share it (so a generation can hold the session's pool while
/// it borrows the session), and the last one dropped joins the threads.
#[derive(Clone)]
pub struct Pool(Arc<Threads>);

struct Threads {
    /// `Some` until dropped.
    pool: Option<rayon::ThreadPool>,
    handles: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Pool {
    /// `threads` threads named `name-N`.
    pub fn new(threads: usize, name: &'static str) -> Result<Pool, rayon::ThreadPoolBuildError> {
        let handles = Arc::new(Mutex::new(Vec::with_capacity(threads)));
        let spawned = handles.clone();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .spawn_handler(move |t| {
                let handle = std::thread::Builder::new().name(format!("{name}-{}", t.index())).spawn(|| t.run())?;
                spawned.lock().unwrap_or_else(|e| e.into_inner()).push(handle);
                Ok(())
            })
            .build()?;
        // Every thread running before the pool is used: their setup is the pool's, not left
        // to its first jobs.
        pool.broadcast(|_| ());
        Ok(Pool(Arc::new(Threads { pool: Some(pool), handles })))
    }
}

impl std::ops::Deref for Pool {
    type Target = rayon::ThreadPool;

    fn deref(&self) -> &rayon::ThreadPool {
        self.0.pool.as_ref().expect("the pool lives until dropped")
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        // Dropping rayon's pool tells its threads to exit once idle; then wait until they have.
        drop(self.pool.take());
        for t in std::mem::take(&mut *self.handles.lock().unwrap_or_else(|e| e.into_inner())) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn threads_named(prefix: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    #[test]
    fn drop_returns_after_every_thread_exited() {
        let pool = Pool::new(3, "llada-pooltest").unwrap();
        assert_eq!(pool.install(rayon::current_num_threads), 3);
        // A thread names itself when it starts: once each has run a job, all three have.
        pool.broadcast(|_| ());
        assert_eq!(threads_named("llada-pooltest"), 3);
        drop(pool);
        // Joined threads have finished, but Linux wakes the joiner (clearing the thread id)
        // a moment before it removes the task from /proc: allow that moment, no more.
        let gone = (0..500).any(|_| {
            let n = threads_named("llada-pooltest");
            if n > 0 {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            n == 0
        });
        assert!(gone, "pool threads still listed 5 s after the pool was dropped");
    }
}
