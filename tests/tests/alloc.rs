//! No allocation on the hot path: once a generation has started, its steps (the dense
//! passes with their staging, the predictions, the commits, and `mbsd`'s side path) allocate
//! nothing. A counting global allocator counts every allocation, on every thread, during
//! the steps of `exact`, `dual` and `mbsd` generations (with dual-path revision), on an
//! artifact whose weights do not all fit its window (so segments rotate through slots), in
//! a warm session.
//!
//! The one exception is rayon's: a step enters the session's thread pool once, as a job sent
//! from outside the pool, and rayon queues such jobs in blocks of 63 that it allocates as it
//! goes, so a pool allocates one block per 63 steps. The test allows exactly that: at most
//! one allocation per 63 steps, all of one size (inside a step every parallel loop starts
//! from a pool thread, which queues nothing).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

use llada_rt::sampler::{Generator, Policy};
use llada_rt::text::Text;
use llada_rt::{Model, SamplerParams, Session};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);
/// The sizes of the first allocations counted (0: none), to say what allocated.
static SIZES: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

// SAFETY: every call is passed to the system allocator unchanged; counting touches atomics only.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(layout);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn count(layout: Layout) {
    if COUNTING.load(Relaxed) {
        let n = ALLOCATIONS.fetch_add(1, Relaxed);
        if let Some(s) = SIZES.get(n) {
            s.store(layout.size(), Relaxed);
        }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Runs every step of a generation with `p`, counting; returns the steps and the sizes of
/// the allocations counted.
fn count_steps(session: &mut Session, prompt: &[u32], p: &SamplerParams) -> (usize, Vec<usize>) {
    let mut generator = Generator::start(session, prompt, p).unwrap();
    let mut steps = 0;
    ALLOCATIONS.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    while generator.step().unwrap().is_some() {
        steps += 1;
    }
    COUNTING.store(false, Relaxed);
    let n = ALLOCATIONS.load(Relaxed);
    let sizes = (0..n).map(|i| SIZES.get(i).map_or(0, |s| s.load(Relaxed))).collect();
    let g = generator.finish();
    assert!(!g.output_ids.is_empty());
    (steps, sizes)
}

#[test]
fn steps_allocate_nothing_for_exact_dual_and_mbsd() {
    let dir = tempfile::tempdir().unwrap();
    let resident = common::embedded(dir.path());
    let rotating = dir.path().join("rotating.lad");
    common::compile_in_window(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks"), &rotating, Some(256), Some(common::half_the_weights(&resident)));
    let model = Model::open(&rotating, true).unwrap();
    assert!(!model.header.plan.window.rotating.is_empty(), "the weights rotate through slots");
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let prompt = text.encode_chat("FILL:3000705000000920000040015000608000070060300000004000000800900010=").unwrap();
    let mut session = Session::with_threads(&model, 2).unwrap();
    let base = SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() };
    // A warm session: its threads (kernels, staging) have started and set themselves up,
    // which they do on their own time, not the steps'.
    llada_rt::generate(&mut session, &prompt, &base, &mut |_| {}).unwrap();
    for p in [
        SamplerParams { policy: Policy::Exact, ..base },
        SamplerParams { policy: Policy::Dual, ..base },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, ..base },
        SamplerParams { policy: Policy::Exact, temperature: 0.5, seed: 1, ..base },
    ] {
        let (steps, sizes) = count_steps(&mut session, &prompt, &p);
        let rayon_blocks = steps.div_ceil(63);
        assert!(sizes.len() <= rayon_blocks && sizes.windows(2).all(|w| w[0] == w[1]), "{:?}: {} allocations in {steps} steps (sizes {:?}), at most {rayon_blocks} of rayon's queue allowed", p.policy, sizes.len(), &sizes[..sizes.len().min(8)]);
        eprintln!("{:?}: {steps} steps, {} allocations (sizes {sizes:?})", p.policy, sizes.len());
    }
}
