//! The one hand-off between the accelerator path's thread (the *owner*) and a helper thread
//! (weight staging, expert staging, the experts' CPU path, the revision side path).
//!
//! A [`Slots`] is a fixed row of slots. Each holds a value `T` (a window slot's handle, a
//! job's buffers) that is at any moment in one of two places: *home*, where the owner reads
//! and changes it under the lock, or *lent* inside a [`Lease`], which owns it by value until
//! dropped. The owner puts a request `R` on a slot; a helper takes (value, request) as a
//! lease; dropping the lease brings the value home and wakes whoever waits. So who may touch
//! a value is decided by where the value is, not by a protocol written in comments: no raw
//! shared state, no erased lifetime. A helper that panics while it holds a lease (or outside
//! one, reported by [`Slots::fail`]) fails the slots: every wait then returns [`Failed`]
//! instead of waiting forever.
//!
//! [`Slots::run_beside`] lends a job that borrows the owner's data for the length of one call,
//! as `std::thread::scope` does: it does not return or unwind before the lease is back.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Why a helper stopped: its waiters get this.
#[derive(Debug)]
pub enum Failure {
    /// A read from the artifact failed.
    Read(std::io::Error),
    Panicked,
}

impl Failure {
    /// The error a waiter for the helper gets; `what` names the helper, `path` the artifact.
    pub fn error(&self, path: &std::path::Path, what: &str) -> crate::Error {
        match self {
            Failure::Read(e) => crate::model::read_error(path, std::io::Error::new(e.kind(), format!("{what} failed to read: {e}"))),
            Failure::Panicked => crate::Error::Internal(format!("{what} panicked")),
        }
    }
}

/// A wait ended because the helper failed (see [`Slots::failure`] for why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed;

struct Cell<T, R> {
    /// `None` while lent.
    value: Option<T>,
    /// Asked for and not taken yet.
    request: Option<R>,
}

struct Table<T, R> {
    cells: Vec<Cell<T, R>>,
    /// Helpers take nothing more (their `take` returns `None`).
    closed: bool,
    failure: Option<Failure>,
}

struct Shared<T, R> {
    table: Mutex<Table<T, R>>,
    changed: Condvar,
}

/// A row of slots shared by an owner and its helpers (clones share it).
pub struct Slots<T, R> {
    shared: Arc<Shared<T, R>>,
}

impl<T, R> Clone for Slots<T, R> {
    fn clone(&self) -> Self {
        Slots { shared: self.shared.clone() }
    }
}

impl<T, R> Slots<T, R> {
    /// Slots holding `values`, all home, none requested.
    pub fn new(values: Vec<T>) -> Slots<T, R> {
        let cells = values.into_iter().map(|v| Cell { value: Some(v), request: None }).collect();
        Slots { shared: Arc::new(Shared { table: Mutex::new(Table { cells, closed: false, failure: None }), changed: Condvar::new() }) }
    }

    fn lock(&self) -> MutexGuard<'_, Table<T, R>> {
        // Nothing runs user code under the lock but the owner's own closures: a poisoned
        // lock means the owner panicked in one, and the table is still whole.
        self.shared.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sleep<'a>(&self, t: MutexGuard<'a, Table<T, R>>) -> MutexGuard<'a, Table<T, R>> {
        self.shared.changed.wait(t).unwrap_or_else(|e| e.into_inner())
    }

    fn notify(&self) {
        self.shared.changed.notify_all();
    }

    pub fn len(&self) -> usize {
        self.lock().cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Owner: asks for slot `i`'s work; returns the request this one replaces, if it had not
    /// been taken yet (it never will be).
    pub fn request(&self, i: usize, r: R) -> Option<R> {
        let replaced = self.lock().cells[i].request.replace(r);
        self.notify();
        replaced
    }

    /// Owner: changes slot `i`'s request if it has not been taken yet.
    pub fn update_request(&self, i: usize, f: impl FnOnce(&mut R)) {
        if let Some(r) = self.lock().cells[i].request.as_mut() {
            f(r);
        }
    }

    /// Owner: runs `f` on slot `i`'s value (and sees its request) if the value is home
    /// (`None` if lent). No request changes, so nobody is woken (a hot path: per expert and
    /// per staged segment).
    pub fn with<X>(&self, i: usize, f: impl FnOnce(&mut T, Option<&R>) -> X) -> Option<X> {
        let mut t = self.lock();
        let cell = &mut t.cells[i];
        cell.value.as_mut().map(|v| f(v, cell.request.as_ref()))
    }

    /// Owner: waits until slot `i`'s value is home and `ready(value, requested)`, then runs
    /// `f` on it under the lock. Fails if the helper failed first.
    pub fn wait<X>(&self, i: usize, ready: impl Fn(&T, bool) -> bool, f: impl FnOnce(&mut T) -> X) -> Result<X, Failed> {
        let mut t = self.lock();
        loop {
            let cell = &mut t.cells[i];
            let requested = cell.request.is_some();
            if let Some(v) = cell.value.as_mut().filter(|v| ready(v, requested)) {
                return Ok(f(v));
            }
            if t.failure.is_some() {
                return Err(Failed);
            }
            t = self.sleep(t);
        }
    }

    /// Helper: waits for a requested slot whose value is home, the one `rank` ranks lowest
    /// among them (`None`: not now), and takes it; `None` once the slots are closed or failed.
    pub fn take<K: Ord>(&self, rank: impl Fn(usize, &R) -> Option<K>) -> Option<Lease<T, R>> {
        let mut t = self.lock();
        loop {
            if t.closed || t.failure.is_some() {
                return None;
            }
            let best = t.cells.iter().enumerate().filter(|(_, c)| c.value.is_some()).filter_map(|(i, c)| Some((rank(i, c.request.as_ref()?)?, i))).min_by(|a, b| a.0.cmp(&b.0)).map(|(_, i)| i);
            if let Some(i) = best {
                return Some(self.lease(&mut t, i));
            }
            t = self.sleep(t);
        }
    }

    /// Owner or helper: takes slot `i` now if it is requested and home.
    pub fn try_take(&self, i: usize) -> Option<Lease<T, R>> {
        let mut t = self.lock();
        let c = &t.cells[i];
        (c.value.is_some() && c.request.is_some()).then(|| self.lease(&mut t, i))
    }

    fn lease(&self, t: &mut Table<T, R>, i: usize) -> Lease<T, R> {
        let cell = &mut t.cells[i];
        Lease { slots: self.clone(), index: i, value: cell.value.take(), request: cell.request.take() }
    }

    /// Owner: helpers take nothing more; a helper waiting in `take` gets `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify();
    }

    /// Owner: after the helpers have stopped (joined), forgets the requests, the failure and
    /// the closing, and sets every value with `reset`, for a helper to start again.
    pub fn reopen(&self, reset: impl Fn(&mut T)) {
        let mut t = self.lock();
        t.closed = false;
        t.failure = None;
        for c in &mut t.cells {
            c.request = None;
            c.value.as_mut().map(&reset);
        }
    }

    /// Helper: records why it stopped (the first reason is kept); every wait then fails.
    pub fn fail(&self, why: Failure) {
        self.lock().failure.get_or_insert(why);
        self.notify();
    }

    /// Why the helper stopped, if it did: `f` of the recorded failure.
    pub fn failure<X>(&self, f: impl FnOnce(&Failure) -> X) -> Option<X> {
        self.lock().failure.as_ref().map(f)
    }

    /// Helper threads' loop: runs `body`; a panic in it fails the slots instead of leaving
    /// the owner waiting.
    pub fn contain_panic(&self, body: impl FnOnce()) {
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).is_err() {
            self.fail(Failure::Panicked);
        }
    }
}

/// A slot's value and request, taken by a helper (or the owner): nobody else can reach them
/// until it is dropped, which brings the value home and drops the request.
pub struct Lease<T, R> {
    slots: Slots<T, R>,
    index: usize,
    value: Option<T>,
    request: Option<R>,
}

impl<T, R> Lease<T, R> {
    pub fn index(&self) -> usize {
        self.index
    }

    /// The value (lent) and the request it was taken for.
    pub fn parts(&mut self) -> (&mut T, &R) {
        (self.value.as_mut().expect("a lease holds its value until dropped"), self.request.as_ref().expect("a lease holds its request until dropped"))
    }
}

impl<T, R> Drop for Lease<T, R> {
    fn drop(&mut self) {
        let mut t = self.slots.lock();
        t.cells[self.index].value = self.value.take();
        if std::thread::panicking() {
            t.failure.get_or_insert(Failure::Panicked);
        }
        // The request goes after the value is home: a borrowed job (`Borrowed`) must not
        // outlive the wait in `run_beside`, which ends only when the value is home.
        drop(self.request.take());
        drop(t);
        self.slots.notify();
    }
}

/// A job that borrows the owner's data for one [`Slots::run_beside`] call: an address and the
/// function that calls it, no lifetime to erase.
pub struct Borrowed<T> {
    job: *const (),
    call: unsafe fn(*const (), &mut T),
}

// SAFETY: the job behind the address is `Sync` (required by `run_beside`), so calling it from
// the helper's thread through a shared reference is sound.
unsafe impl<T> Send for Borrowed<T> {}

/// Calls the `J` at `job`.
///
/// # Safety
/// `job` points to a live `J`.
unsafe fn call_job<T, J: Fn(&mut T)>(job: *const (), value: &mut T) {
    // SAFETY: the caller's contract.
    unsafe { (*job.cast::<J>())(value) }
}

impl<T> Lease<T, Borrowed<T>> {
    /// Runs the borrowed job on the lent value; whether it panicked (the panic is contained:
    /// the helper goes on serving).
    pub fn run(&mut self) -> bool {
        let (value, job) = (self.value.as_mut().expect("a lease holds its value until dropped"), self.request.as_ref().expect("a lease holds its request"));
        // SAFETY: `run_beside` lent this job and does not return or unwind before this
        // lease is dropped (it waits for the value to come home), so the job is alive.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { (job.call)(job.job, value) })).is_err()
    }
}

impl<T> Slots<T, Borrowed<T>> {
    /// Owner: lends `job` (which may borrow this thread's data) on slot `i` to a helper and
    /// runs `here` meanwhile; returns what `here` returned once the job has run and its lease
    /// is back (also when `here` unwinds), or `Failed` if the helper failed.
    pub fn run_beside<J: Fn(&mut T) + Sync, X>(&self, i: usize, job: &J, here: impl FnOnce() -> X) -> (X, Result<(), Failed>) {
        self.request(i, Borrowed { job: (job as *const J).cast(), call: call_job::<T, J> });
        let mut back = Back { slots: self, index: i, waited: false };
        let x = here();
        (x, back.wait())
    }
}

/// Waits until the job lent on `index` is back: when asked, or when dropped (unwinding from
/// the owner's part must not free what the job borrows while it runs).
struct Back<'a, T> {
    slots: &'a Slots<T, Borrowed<T>>,
    index: usize,
    waited: bool,
}

impl<T> Back<'_, T> {
    fn wait(&mut self) -> Result<(), Failed> {
        self.waited = true;
        let r = self.slots.wait(self.index, |_, requested| !requested, |_| ());
        // Whatever happened, the job must not be reachable once this returns: an untaken
        // request is withdrawn, and a lease still out (a helper unwinding through it, or
        // failed by another) is waited for, failure or not: it drops the job only after its
        // value is home (`Lease::drop`).
        let mut t = self.slots.lock();
        t.cells[self.index].request = None;
        while t.cells[self.index].value.is_none() {
            t = self.slots.sleep(t);
        }
        r
    }
}

impl<T> Drop for Back<'_, T> {
    fn drop(&mut self) {
        if !self.waited {
            let _ = self.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lent_value_is_out_of_reach_until_its_lease_drops() {
        let slots: Slots<u32, &str> = Slots::new(vec![1, 2]);
        assert_eq!(slots.request(1, "a"), None);
        assert_eq!(slots.request(1, "b"), Some("a"), "an untaken request is replaced");
        let mut lease = slots.try_take(1).unwrap();
        assert_eq!(*lease.parts().1, "b");
        *lease.parts().0 = 20;
        assert_eq!(slots.with(1, |v, _| *v), None, "lent");
        assert!(slots.try_take(1).is_none());
        drop(lease);
        assert_eq!(slots.with(1, |v, r| (*v, r.is_some())), Some((20, false)));
    }

    #[test]
    fn helpers_take_by_rank_and_stop_when_closed() {
        let slots: Slots<u32, u32> = Slots::new(vec![0; 4]);
        for (i, key) in [(0, 30), (1, 10), (2, 20)] {
            slots.request(i, key);
        }
        let helper = slots.clone();
        let taken = std::thread::spawn(move || {
            let mut order = Vec::new();
            while let Some(mut l) = helper.take(|_, &k| Some(k)) {
                *l.parts().0 += 1;
                order.push(l.index());
            }
            order
        });
        slots.wait(0, |&v, _| v == 1, |_| ()).unwrap();
        slots.wait(3, |_, _| true, |_| ()).unwrap();
        slots.close();
        assert_eq!(taken.join().unwrap(), [1, 2, 0]);
    }

    #[test]
    fn a_helper_that_panics_fails_every_wait() {
        let slots: Slots<u32, ()> = Slots::new(vec![0, 0]);
        slots.request(0, ());
        let helper = slots.clone();
        std::thread::spawn(move || {
            helper.contain_panic(|| {
                let _lease = helper.take(|_, _| Some(0)).unwrap();
                panic!("a bug in the helper");
            })
        })
        .join()
        .unwrap();
        assert_eq!(slots.wait(1, |&v, _| v == 9, |_| ()), Err(Failed));
        assert!(slots.failure(|f| matches!(f, Failure::Panicked)).unwrap());
        // The value came home all the same.
        assert_eq!(slots.with(0, |v, _| *v), Some(0));
        slots.reopen(|v| *v = 5);
        assert_eq!(slots.failure(|_| ()), None);
        assert_eq!(slots.with(1, |v, _| *v), Some(5));
    }

    #[test]
    fn a_borrowed_job_runs_beside_the_owner_and_a_panic_is_reported() {
        let slots: Slots<Vec<u64>, Borrowed<Vec<u64>>> = Slots::new(vec![Vec::with_capacity(4)]);
        let helper = slots.clone();
        let serving = std::thread::spawn(move || {
            let mut panics = 0;
            while let Some(mut l) = helper.take(|_, _| Some(())) {
                panics += u32::from(l.run());
            }
            panics
        });
        let input: Vec<u64> = (0..1000).collect();
        let job = |out: &mut Vec<u64>| out.push(input.iter().sum());
        let (here, done) = slots.run_beside(0, &job, || 7);
        assert_eq!((here, done), (7, Ok(())));
        assert_eq!(slots.with(0, |v, _| v.clone()), Some(vec![499_500]));
        let (_, done) = slots.run_beside(0, &|_: &mut Vec<u64>| panic!("a job's panic"), || ());
        assert_eq!(done, Ok(()), "a contained panic is the job's, reported by the helper");
        let (_, again) = slots.run_beside(0, &job, || ());
        assert_eq!(again, Ok(()));
        slots.close();
        assert_eq!(serving.join().unwrap(), 1);
    }
}
