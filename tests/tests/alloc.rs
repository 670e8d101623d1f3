//! No allocation on the hot path: once a generation has started, its steps (the dense
//! passes with their staging, the predictions, the commits, and `mbsd`'s side path) allocate
//! nothing. A counting global allocator counts every allocation, on every thread, during
//! the steps of `exact`, `dual` and `mbsd` generations (with dual-path revision), in a warm
//! session: on an artifact whose weights do not all fit its window (so segments rotate
//! through slots), and on a mixture-of-experts artifact whose expert pools hold a quarter
//! of each layer's experts, under each expert strategy (so experts are routed, staged, and
//! computed on the accelerator path and on the CPU path's own threads).
//!
//! The one exception is rayon's: a step enters the session's thread pool once, as a job sent
//! from outside the pool, and rayon queues such jobs in blocks of 63 that it allocates as it
//! goes, so a pool allocates one block per 63 steps. The test allows exactly that: at most
//! one allocation per 63 steps, all of one size (inside a step every parallel loop starts
//! from a pool thread, which queues nothing; so does the CPU expert path's job, handed to
//! one of its pool's threads, not sent into the pool).

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use llada_rt::moe::ExpertStrategy;
use llada_rt::sampler::Policy;
use llada_rt::session::ExpertOptions;
use llada_rt::staging::StagingMode;
use llada_rt::text::Text;
use llada_rt::{Generator, Model, SamplerParams, Session};

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

/// The count is the process's: one test at a time (held for the whole test), so no other
/// test's allocations land in a count.
fn alone() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

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

/// The policies counted, over `base`: exact, dual, mbsd (one speculative block, dual-path
/// revision) and exact sampling at a temperature.
fn policies(base: SamplerParams) -> [SamplerParams; 5] {
    [
        SamplerParams { policy: Policy::Exact, ..base },
        SamplerParams { policy: Policy::Dual, ..base },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, ..base },
        // Side passes of a size no graph has: padded to the next one.
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, side_rows: Some(6), revise_confidence: 0.01, ..base },
        SamplerParams { policy: Policy::Exact, temperature: 0.5, seed: 1, ..base },
    ]
}

/// Warms `session` with one generation with `base` (its threads, kernels, staging and CPU
/// path, start and set themselves up on their own time, not the steps'), then counts the steps
/// of a generation with each of `policies(base)`; returns what each one that allocated more
/// than rayon's queue blocks did (`what` names the session).
fn over_rayons_blocks(what: &str, session: &mut Session, prompt: &[u32], base: SamplerParams) -> Vec<String> {
    over_rayons_blocks_of(what, session, prompt, &base, &policies(base))
}

/// [`over_rayons_blocks`] for the generations `each`, the session warmed with `warm`.
fn over_rayons_blocks_of(what: &str, session: &mut Session, prompt: &[u32], warm: &SamplerParams, each: &[SamplerParams]) -> Vec<String> {
    llada_rt::generate(session, prompt, warm, &mut |_| {}).unwrap();
    let mut failed = Vec::new();
    for p in each {
        let (steps, sizes) = count_steps(session, prompt, p);
        let rayon_blocks = steps.div_ceil(63);
        eprintln!("{what} {:?}: {steps} steps, {} allocations (sizes {:?})", p.policy, sizes.len(), &sizes[..sizes.len().min(8)]);
        if !(sizes.len() <= rayon_blocks && sizes.windows(2).all(|w| w[0] == w[1])) {
            failed.push(format!("{what} {:?}: {} allocations in {steps} steps (sizes {:?}), at most {rayon_blocks} of rayon's queue allowed", p.policy, sizes.len(), &sizes[..sizes.len().min(8)]));
        }
    }
    failed
}

#[test]
fn steps_allocate_nothing_for_exact_dual_and_mbsd() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let resident = common::embedded(dir.path());
    let rotating = dir.path().join("rotating.lad");
    common::compile_in_window(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/llada-tiny-tasks"), &rotating, Some(256), Some(common::half_the_weights(&resident)));
    let model = Model::open(&rotating, true).unwrap();
    assert!(!model.header.plan.window.rotating.is_empty(), "the weights rotate through slots");
    let text = Text::new(&model.header.tokenizer, &model.header.special).unwrap();
    let prompt = text.encode_chat("FILL:3000705000000920000040015000608000070060300000004000000800900010=").unwrap();
    let mut session = Session::with_threads(&model, 2).unwrap();
    let failed = over_rayons_blocks("dense", &mut session, &prompt, SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() });
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The same for Dream (logits shifted by a row; its own sampler): exact unblocked, sampled,
/// `dual` blocked as Fast-dLLM blocks it, and `mbsd` with drafts and the two-pass side path.
#[test]
fn dream_steps_allocate_nothing() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let lad = dir.path().join("dream.lad");
    common::compile(&std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/dream-conformance/tiny-dream-A"), &lad, None);
    let model = Model::open(&lad, true).unwrap();
    let prompt: Vec<u32> = (40..70).collect();
    let mut session = Session::with_threads(&model, 2).unwrap();
    let exact = SamplerParams { gen_length: 64, block_length: 64, steps: 64, ..Default::default() };
    let blocked = SamplerParams { block_length: 16, ..exact };
    let each = [
        exact,
        SamplerParams { temperature: 0.5, seed: 1, ..exact },
        SamplerParams { policy: Policy::Dual, ..blocked },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, ..blocked },
        SamplerParams { policy: Policy::Mbsd, spec_blocks: 1, side_rows: Some(6), revise_confidence: 0.01, ..blocked },
    ];
    let failed = over_rayons_blocks_of("dream", &mut session, &prompt, &exact, &each);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// The same for a mixture-of-experts model whose expert pools hold a quarter of each layer's
/// experts (experts are staged, and computed on both paths), under every expert strategy.
#[test]
fn moe_steps_allocate_nothing_under_every_expert_strategy() {
    let _alone = alone();
    let dir = tempfile::tempdir().unwrap();
    let art = common::moe_quarter_window(dir.path(), None);
    let model = Model::open(&art, true).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 5) % 250).collect();
    let mut failed = Vec::new();
    for strategy in [ExpertStrategy::Hybrid, ExpertStrategy::Lru, ExpertStrategy::Static] {
        let mut session = Session::with_experts(&model, 2, llada_rt::kernels::cpu::features(), StagingMode::Async, ExpertOptions { strategy, cpu_threads: 1 }).unwrap();
        failed.extend(over_rayons_blocks(strategy.name(), &mut session, &prompt, SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() }));
        // What the strategy runs, ran.
        let x = session.expert_counters().unwrap();
        let ran = match strategy {
            ExpertStrategy::Hybrid => x.accelerator_experts > 0 && x.cpu_experts > 0 && x.staged_experts > 0,
            ExpertStrategy::Lru => x.staged_experts > 0 && x.cpu_experts == 0,
            ExpertStrategy::Static => x.cpu_experts > 0 && x.accelerator_experts == 0,
        };
        assert!(ran, "{}: {x:?}", strategy.name());
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
