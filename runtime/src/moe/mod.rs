//! Mixture-of-experts layers on a bounded window.
//!
//! The router picks experts per row at run time, so the plan cannot stage them ahead as it
//! stages the other weights: each MoE layer has a pool of expert slots in the window (an
//! expert cache), and an expert runs either on the accelerator path, from its slot, or on the
//! CPU path, on its own threads at the same time, from the artifact's mapping. The strategy
//! decides which ([`ExpertStrategy`]):
//! - `hybrid` (after HybriMoE): a decayed routing score per expert ranks what each pool keeps;
//!   after every layer its pool is refreshed toward its highest scores for the next pass
//!   (a diffusion step re-routes a block that changes little, so the last pass's routing is
//!   the best forecast of the next); before a layer computes, the next layer's router applied
//!   to the current hidden states predicts its experts and the most valuable missing ones are
//!   prefetched; and each layer's active experts are split between the paths by the cost model
//!   (`split`) to minimise the later of the two;
//! - `lru`: every expert on the accelerator path, a least-recently-used cache, misses staged
//!   when needed, no prefetch;
//! - `static`: every expert on the CPU path (as kTransformers places them), the accelerator
//!   path running the rest of the network.
//!
//! All three compute the same bits: each expert's output does not depend on the path, and
//! each row's picks are added in a fixed order (`compute::combine`).

pub mod cache;
pub mod compute;
pub mod cpu;
pub mod routing;
pub mod shares;
pub mod split;
pub mod stage;
pub mod step;

pub use step::MoeStep;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use llada_ir::{Header, Op, TensorId};

use crate::error::{Error, Result, Setting};
use crate::kernels::cpu::Features;
use crate::kernels::gemm::gemm;
use crate::model::{Matrix, Model};
use crate::window::{SlotMem, SlotPtr, Window};
use cache::ExpertCache;
use compute::{combine, ExpertShape, ExpertWeights, RankedOut, Scratch};
use cpu::{CpuPath, CpuWork};
use routing::{route_row, RouteScratch, Routing};
use shares::Shares;
use split::{Candidate, Place, Split};
use stage::ExpertStager;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertStrategy {
    Hybrid,
    Lru,
    Static,
}

impl ExpertStrategy {
    /// Every strategy's name, as [`parse`](Self::parse) takes it.
    pub const NAMES: &'static [&'static str] = &["hybrid", "lru", "static"];

    pub fn parse(s: &str) -> Option<ExpertStrategy> {
        match s {
            "hybrid" => Some(ExpertStrategy::Hybrid),
            "lru" => Some(ExpertStrategy::Lru),
            "static" => Some(ExpertStrategy::Static),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ExpertStrategy::Hybrid => "hybrid",
            ExpertStrategy::Lru => "lru",
            ExpertStrategy::Static => "static",
        }
    }
}

/// What the experts cost so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ExpertCounters {
    /// MoE layer runs.
    pub layers: u64,
    /// Experts with rows in a layer run, summed over runs.
    pub active: u64,
    /// Of those, the ones whose slot already held them (ready) when the layer ran.
    pub hits: u64,
    /// Experts computed by each path.
    pub accelerator_experts: u64,
    pub cpu_experts: u64,
    /// Experts copied into slots, and their bytes; of the copies, those a hybrid prefetch or
    /// refresh asked for ahead of need, and of the prefetched, those the layer then used.
    pub staged_experts: u64,
    pub staged_bytes: u64,
    pub prefetched: u64,
    pub prefetch_used: u64,
    pub refreshed: u64,
    /// Time the accelerator path waited for an expert's copy.
    pub stall_seconds: f64,
    /// Time the accelerator path waited for the CPU path at the end of a layer.
    pub cpu_wait_seconds: f64,
    /// Time each path spent computing experts.
    pub accelerator_seconds: f64,
    pub cpu_seconds: f64,
}

impl ExpertCounters {
    /// Share of active experts found in the cache.
    pub fn hit_rate(&self) -> f64 {
        if self.active == 0 { 0.0 } else { self.hits as f64 / self.active as f64 }
    }

    /// `self - earlier`, for one pass's figures.
    pub fn since(&self, earlier: &ExpertCounters) -> ExpertCounters {
        ExpertCounters {
            layers: self.layers - earlier.layers,
            active: self.active - earlier.active,
            hits: self.hits - earlier.hits,
            accelerator_experts: self.accelerator_experts - earlier.accelerator_experts,
            cpu_experts: self.cpu_experts - earlier.cpu_experts,
            staged_experts: self.staged_experts - earlier.staged_experts,
            staged_bytes: self.staged_bytes - earlier.staged_bytes,
            prefetched: self.prefetched - earlier.prefetched,
            prefetch_used: self.prefetch_used - earlier.prefetch_used,
            refreshed: self.refreshed - earlier.refreshed,
            stall_seconds: self.stall_seconds - earlier.stall_seconds,
            cpu_wait_seconds: self.cpu_wait_seconds - earlier.cpu_wait_seconds,
            accelerator_seconds: self.accelerator_seconds - earlier.accelerator_seconds,
            cpu_seconds: self.cpu_seconds - earlier.cpu_seconds,
        }
    }
}

/// One MoE op's operands, in the window.
pub struct MoeOperands<'a> {
    pub layer: usize,
    pub first: TensorId,
    /// The op's input, `[graph rows, d]`.
    pub x: &'a [f32],
    pub route: &'a [f32],
    pub out: &'a mut [f32],
    pub ranked: &'a mut [f32],
    pub work: &'a mut [f32],
    /// The window's GEMM operand scratch.
    pub operand: &'a mut [u8],
    /// Real rows (the rest are padding).
    pub rows: usize,
}

/// Where expert e of a layer is: its segment's file range (what staging copies) and its two
/// matrices' offsets inside the segment.
#[derive(Debug, Clone, Copy)]
struct ExpertHome {
    range: (u64, usize),
    gate_up: usize,
    down: usize,
}

/// The experts' shape, each layer's first expert tensor and router, and every expert's home.
struct Layout {
    shape: ExpertShape,
    top_k: usize,
    firsts: Vec<TensorId>,
    routers: Vec<Option<TensorId>>,
    homes: Vec<ExpertHome>,
}

fn expert_layout(h: &Header) -> Option<Layout> {
    let moe = h.model.moe?;
    let plan = &h.plan.window.experts;
    let g = h.graphs.first()?;
    // Indexed by MoE layer (the transformer layers after the dense ones).
    let layers = h.model.moe_layers() as usize;
    let (mut routers, mut firsts) = (vec![None; layers], vec![None; layers]);
    // A layer's router is the MatMul whose output the Route op before its MoE op reads.
    let (mut last_matmul, mut router) = (None, None);
    for op in &g.ops {
        match *op {
            Op::MatMul { weight, out, .. } => last_matmul = Some((weight, out)),
            Op::Route { logits, .. } | Op::RouteSigmoid { logits, .. } | Op::RouteScaled { logits, .. } => router = last_matmul.filter(|m: &(TensorId, u32)| m.1 == logits).map(|m| m.0),
            Op::MoeExperts { layer, first, .. } => {
                let l = h.model.moe_layer_index(layer)?;
                firsts[l] = Some(first);
                routers[l] = router.take();
            }
            _ => {}
        }
    }
    let first0 = firsts.iter().flatten().next().copied()?;
    let firsts: Vec<TensorId> = firsts.into_iter().map(|f| f.unwrap_or(first0)).collect();
    let t = &h.tensors[first0 as usize];
    let shape = ExpertShape { d: h.model.d_model as usize, hidden: h.model.mlp_hidden as usize, format: t.dtype, bf16_activations: h.plan.bf16_activations, activation_scales: h.plan.activation_scales, activation: moe.activation };
    let mut homes = Vec::with_capacity(layers * moe.experts as usize);
    for (l, &first) in firsts.iter().enumerate() {
        for e in 0..moe.experts {
            let seg = &h.segments[plan.segments[l * moe.experts as usize + e as usize] as usize];
            let within = |t: TensorId| (h.tensors[t as usize].offset - seg.offset) as usize;
            homes.push(ExpertHome { range: (seg.offset, seg.nbytes as usize), gate_up: within(first + 2 * e), down: within(first + 2 * e + 1) });
        }
    }
    Some(Layout { shape, top_k: moe.top_k as usize, firsts, routers, homes })
}

/// The expert slots: what each holds, the copies into them, and their figures.
struct Pools {
    cache: ExpertCache,
    stager: Option<ExpertStager>,
    slots: Vec<SlotPtr>,
    homes: Vec<ExpertHome>,
    per_layer: usize,
    slots_per_layer: usize,
    data_offset: u64,
    staged_experts: u64,
    staged_bytes: u64,
    prefetched: u64,
    refreshed: u64,
    stall_seconds: f64,
}

/// Why an expert is copied into a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The layer computes it on the accelerator now.
    Demand,
    /// Predicted for the next layer of this pass.
    Prefetch,
    /// Ranked high by its decayed score, for this layer's next run.
    Refresh,
}

impl Pools {
    fn global_slot(&self, layer: usize, slot: usize) -> usize {
        layer * self.slots_per_layer + slot
    }

    /// Whether `layer`'s `slot` holds its expert, copied.
    fn ready(&self, layer: usize, slot: usize) -> bool {
        let s = &self.cache.layers[layer].slots[slot];
        s.expert.is_some() && self.stager.as_ref().is_none_or(|st| st.is_done(self.global_slot(layer, slot), s.ticket))
    }

    /// Queues a copy of `expert` into `layer`'s `slot`.
    fn stage(&mut self, layer: usize, slot: usize, expert: u32, why: Why) {
        let home = self.homes[layer * self.per_layer + expert as usize];
        let g = self.global_slot(layer, slot);
        let stager = self.stager.as_mut().expect("a pool that does not hold every expert has a stager");
        let (ticket, replaced) = stager.stage(g, (self.data_offset + home.range.0, home.range.1), why == Why::Demand);
        self.cache.assign(layer, slot, expert, ticket, why == Why::Prefetch);
        // A replaced copy never ran: it is not counted as staged.
        self.staged_experts += 1 - u64::from(replaced.is_some());
        self.staged_bytes += home.range.1 as u64 - replaced.unwrap_or(0) as u64;
        self.prefetched += u64::from(why == Why::Prefetch);
        self.refreshed += u64::from(why == Why::Refresh);
    }

    /// Moves `layer`'s `slot`'s queued copy, if any, ahead of the speculative ones.
    fn hurry(&mut self, layer: usize, slot: usize) {
        let g = self.global_slot(layer, slot);
        if let Some(st) = self.stager.as_mut() {
            st.hurry(g);
        }
    }

    /// Waits for `layer`'s `slot` to hold its expert, then returns its bytes.
    ///
    /// The caller must not queue a copy into this slot while it uses the bytes.
    fn read(&mut self, layer: usize, slot: usize) -> Result<&[u8]> {
        let g = self.global_slot(layer, slot);
        if let Some(st) = &self.stager {
            self.stall_seconds += st.wait(g, self.cache.layers[layer].slots[slot].ticket)?;
        }
        self.cache.touch(layer, slot);
        // SAFETY: the slot's latest copy is finished (waited above), and copies are queued
        // only by this thread, which does not queue one into this slot while the returned
        // bytes are used (the caller's contract; `&mut self` keeps `stage` out meanwhile).
        Ok(unsafe { self.slots[g].bytes() })
    }
}

/// A session's expert runtime (see the module docs).
pub struct Experts {
    model: Arc<Model>,
    strategy: ExpertStrategy,
    shape: ExpertShape,
    top_k: usize,
    firsts: Vec<TensorId>,
    /// Each layer's router, for predicting it one layer ahead.
    routers: Vec<Option<TensorId>>,
    pools: Pools,
    cpu: Option<CpuPath>,
    routing: Routing,
    split: Split,
    /// Scratch of the decisions, sized when the experts are set up (a layer's experts, its
    /// rows) and reused across layers: a layer allocates nothing.
    mass: Vec<f32>,
    candidates: Vec<Candidate>,
    places: Vec<Place>,
    order: Vec<usize>,
    /// Each path's share, (expert, cached) in the order it takes them, and lru's list.
    acc_share: Vec<(u32, bool)>,
    cpu_share: Vec<(u32, bool)>,
    lru_list: Vec<(u32, bool)>,
    shares: Shares,
    /// Lru's copies in flight: (list index, slot).
    inflight: VecDeque<(usize, usize)>,
    forecast: Forecast,
    /// `combine`'s order of a row's picks.
    combine_order: Vec<(u32, usize, f32)>,
    /// (rows, seconds) of each expert the accelerator path computed in the last layer.
    acc_timings: Vec<(usize, f64)>,
    counters: ExpertCounters,
}

/// Hybrid's forecast of a layer's next run (rows per expert) and what deciding on it works
/// in, sized once.
struct Forecast {
    load: Vec<usize>,
    /// The next layer's router logits and routes over this layer's rows (`predict_load`).
    routes: Vec<f32>,
    route: RouteScratch,
    candidates: Vec<Candidate>,
    wanted: Vec<usize>,
    places: Vec<Place>,
    order: Vec<usize>,
}

impl Forecast {
    fn new(experts: usize, rows: usize, top_k: usize) -> Forecast {
        Forecast {
            load: Vec::with_capacity(experts),
            routes: Vec::with_capacity(rows * (experts + 2 * top_k)),
            route: RouteScratch::new(experts),
            candidates: Vec::with_capacity(experts),
            wanted: Vec::with_capacity(experts),
            places: Vec::with_capacity(experts),
            order: Vec::with_capacity(experts),
        }
    }

    /// Hybrid's cross-layer forecast (HybriMoE's): the next layer's `router` (`[experts, d]`)
    /// applied to this layer's input rows `x` (`[rows, d]`, the real rows) predicts its
    /// routing; writes the rows each expert would get into `load`.
    fn predict_load(&mut self, router: &Matrix, x: &[f32], k: usize, operand: &mut [u8], pool: &rayon::ThreadPool, features: Features) {
        let (experts, rows) = (router.n, x.len() / router.k);
        self.routes.resize(rows * experts + rows * 2 * k, 0.0);
        let (logits, routes) = self.routes.split_at_mut(rows * experts);
        gemm(x, rows, router, logits, operand, pool, features);
        self.load.clear();
        self.load.resize(experts, 0);
        for (l, r) in logits.chunks_exact(experts).zip(routes.chunks_exact_mut(2 * k)) {
            route_row(l, k, r, &mut self.route);
            for &id in &r[..k] {
                self.load[id as usize] += 1;
            }
        }
    }
}

/// Seconds each path spent computing a layer's experts, and how long the accelerator path
/// then waited for the CPU path.
#[derive(Debug, Clone, Copy)]
struct PathTimes {
    accelerator: f64,
    cpu: f64,
    cpu_wait: f64,
}

/// How many pool slots a hybrid refresh or prefetch may restage per layer run, as a share of
/// the pool: a bound on the copies one forecast can ask for.
const RESTAGE_SHARE: usize = 4;

impl Experts {
    /// The expert runtime of a session over `window`, or `None` for a dense model. The CPU path
    /// gets `cpu_threads` threads (`static` and `hybrid` need at least one). A pool that holds
    /// every expert of its layer is filled now, like the resident weights.
    pub fn new(model: &Arc<Model>, window: &Window, strategy: ExpertStrategy, cpu_threads: usize) -> Result<Option<Experts>> {
        let h = &model.header;
        let Some(layout) = expert_layout(h) else { return Ok(None) };
        let plan = &h.plan.window.experts;
        let (per_layer, slots_per_layer, layers) = (plan.per_layer as usize, plan.slots_per_layer as usize, h.model.moe_layers() as usize);
        if strategy != ExpertStrategy::Lru && cpu_threads == 0 {
            return Err(Error::setting(Setting::CpuThreads, format!("0 must be at least 1: experts {} runs experts on the CPU path", strategy.name())));
        }
        if strategy == ExpertStrategy::Lru && slots_per_layer == 0 {
            return Err(Error::setting(
                Setting::Experts,
                format!("lru runs every expert on the accelerator, but {}'s window has no expert slots; recompile with a larger --window-bytes or use hybrid experts", model.path.display()),
            ));
        }
        let (shape, top_k) = (layout.shape, layout.top_k);
        let max_rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        let cpu = match cpu_threads {
            0 => None,
            n => Some(CpuPath::new(n, shape.floats(max_rows), llada_ir::window_sizes::largest_gemm_operand(h) as usize, per_layer)?),
        };
        let mut pools = Pools {
            cache: ExpertCache::new(layers, slots_per_layer, per_layer),
            stager: None,
            slots: window.expert_slot_ptrs(),
            homes: layout.homes,
            per_layer,
            slots_per_layer,
            data_offset: model.data_offset(),
            staged_experts: 0,
            staged_bytes: 0,
            prefetched: 0,
            refreshed: 0,
            stall_seconds: 0.0,
        };
        if slots_per_layer == per_layer {
            // Every expert fits: load them all now, expert e into slot e.
            for l in 0..layers {
                for e in 0..per_layer {
                    let home = pools.homes[l * per_layer + e];
                    // SAFETY: the one handle of this slot, used once here: no staging thread
                    // exists, no slice of the window is alive, and the window outlives it.
                    let mut dst = unsafe { SlotMem::new(pools.slots[l * slots_per_layer + e]) };
                    model.read_data(&mut dst.bytes_mut()[..home.range.1], home.range.0)?;
                    pools.cache.assign(l, e, e as u32, 0, false);
                }
            }
        } else if slots_per_layer > 0 {
            // SAFETY: one handle per slot, owned by the one stager of these slots; the
            // window outlives the experts (the session drops them first).
            let mems = pools.slots.iter().map(|&p| unsafe { SlotMem::new(p) }).collect();
            pools.stager = Some(ExpertStager::new(model.file(), model.path.clone(), mems)?);
        }
        Ok(Some(Experts {
            model: model.clone(),
            strategy,
            shape,
            top_k,
            firsts: layout.firsts,
            routers: layout.routers,
            pools,
            cpu,
            routing: Routing::new(per_layer, max_rows, top_k),
            split: Split::new(plan.costs),
            mass: vec![0.0; per_layer],
            candidates: Vec::with_capacity(per_layer),
            places: Vec::with_capacity(per_layer),
            order: Vec::with_capacity(per_layer),
            acc_share: Vec::with_capacity(per_layer),
            cpu_share: Vec::with_capacity(per_layer),
            lru_list: Vec::with_capacity(per_layer),
            shares: Shares::with_capacity(per_layer),
            inflight: VecDeque::with_capacity(slots_per_layer),
            forecast: Forecast::new(per_layer, max_rows, top_k),
            combine_order: Vec::with_capacity(top_k),
            acc_timings: Vec::with_capacity(per_layer),
            counters: ExpertCounters::default(),
        }))
    }

    pub fn strategy(&self) -> ExpertStrategy {
        self.strategy
    }

    /// Every figure so far.
    pub fn counters(&self) -> ExpertCounters {
        let p = &self.pools;
        ExpertCounters { staged_experts: p.staged_experts, staged_bytes: p.staged_bytes, prefetched: p.prefetched, refreshed: p.refreshed, stall_seconds: p.stall_seconds, ..self.counters }
    }

    /// Runs one MoE op: routes, places, computes on both paths at once, combines.
    pub fn run(&mut self, mut op: MoeOperands, pool: &rayon::ThreadPool, features: Features) -> Result<()> {
        let layer = op.layer;
        self.routing.from_route(op.route, op.rows, self.top_k, self.pools.per_layer)?;
        self.counters.layers += 1;
        self.tally_candidates(layer);
        self.place(layer);
        if self.strategy == ExpertStrategy::Hybrid {
            self.stage_accelerator_misses(layer);
        }
        let times = self.compute(&mut op, pool, features)?;
        self.learn_from_paths(times);
        combine(op.route, op.ranked, op.rows, self.top_k, self.shape.d, op.out, &mut self.combine_order);
        if let Some(st) = &self.pools.stager {
            let c = st.take_copied();
            let expert = self.pools.homes[0].range.1 as f64;
            self.split.observe_staging(c.bytes as f64 / expert, c.seconds, c.cpu_seconds);
        }
        if self.strategy == ExpertStrategy::Hybrid {
            self.refresh(layer);
        }
        Ok(())
    }

    /// This run's routing of `layer`: each expert's routing mass (its decayed score's new
    /// term) into the pool's scores, and the active experts as candidates, each cached or not
    /// (counted as hits, and as used prefetches).
    fn tally_candidates(&mut self, layer: usize) {
        for (e, m) in self.mass.iter_mut().enumerate() {
            *m = self.routing.picks(e).iter().map(|p| p.weight).sum();
        }
        self.pools.cache.update_scores(layer, &self.mass);
        self.candidates.clear();
        for e in self.routing.active() {
            let slot = self.pools.cache.slot_of(layer, e as u32);
            let cached = slot.is_some_and(|s| self.pools.ready(layer, s));
            self.counters.active += 1;
            self.counters.hits += u64::from(cached);
            self.counters.prefetch_used += u64::from(slot.is_some_and(|s| self.pools.cache.layers[layer].slots[s].prefetched));
            self.candidates.push(Candidate { expert: e as u32, rows: self.routing.load(e), cached });
        }
        // A prefetch counts for the run it was made for.
        self.pools.cache.layers[layer].slots.iter_mut().for_each(|s| s.prefetched = false);
    }

    /// Where each active expert of `layer` runs, by the strategy, and each path's share.
    fn place(&mut self, layer: usize) {
        let routing = &self.routing;
        let evictable = self.pools.cache.layers[layer].slots.iter().filter(|s| s.expert.is_none_or(|e| routing.load(e as usize) == 0)).count();
        match self.strategy {
            ExpertStrategy::Static => {
                self.places.clear();
                self.places.resize(self.candidates.len(), Place::Cpu);
            }
            ExpertStrategy::Lru => {
                self.places.clear();
                self.places.resize(self.candidates.len(), Place::Accelerator);
            }
            ExpertStrategy::Hybrid => {
                self.split.assign(&self.candidates, evictable, &mut self.places, &mut self.order);
            }
        }
        // Each path's share, heaviest first (`shares` lets a path that runs out take from the
        // other's end, hybrid only). The accelerator computes what its slots hold first,
        // giving the copies of the rest time to land (lru orders its list so too); those then
        // sit at its light end, where the CPU path takes from if it runs out first.
        share(&self.candidates, &self.places, Place::Accelerator, &mut self.order, &mut self.acc_share);
        share(&self.candidates, &self.places, Place::Cpu, &mut self.order, &mut self.cpu_share);
        self.shares.set(&self.acc_share, &self.cpu_share, self.strategy == ExpertStrategy::Hybrid);
    }

    /// Hybrid: the uncached experts the split gave the accelerator; their copies start now,
    /// into slots whose experts this layer does not use (the split's budget).
    fn stage_accelerator_misses(&mut self, layer: usize) {
        for &(e, cached) in &self.acc_share {
            let idle = |s: &cache::Slot| s.expert.is_none_or(|held| self.routing.load(held as usize) == 0) && s.expert != Some(e);
            if cached {
                continue;
            }
            match self.pools.cache.slot_of(layer, e) {
                // On its way (a prefetch or refresh): needed now.
                Some(slot) => self.pools.hurry(layer, slot),
                None => {
                    let (slot, _) = self.pools.cache.lowest_score(layer, |s| !idle(s)).expect("the split stages at most as many as there are idle slots");
                    self.pools.stage(layer, slot, e, Why::Demand);
                }
            }
        }
    }

    /// Computes the layer's experts into `op.ranked`, both paths at once: the CPU path's job
    /// on its own threads while this thread runs the accelerator's (and, hybrid, forecasts
    /// the next layer and prefetches for it).
    fn compute(&mut self, op: &mut MoeOperands, pool: &rayon::ThreadPool, features: Features) -> Result<PathTimes> {
        let (layer, k, d) = (op.layer, self.top_k, self.shape.d);
        let (model, shape, first, routing, strategy) = (&*self.model, self.shape, self.firsts[layer], &self.routing, self.strategy);
        let (x, pools, cpu, split, forecast, acc_timings) = (op.x, &mut self.pools, &mut self.cpu, &self.split, &mut self.forecast, &mut self.acc_timings);
        let (lru_list, inflight) = (&mut self.lru_list, &mut self.inflight);
        let (acc_share, cpu_share) = (&self.acc_share, &self.cpu_share);
        acc_timings.clear();
        let next_router = self.routers.get(layer + 1).copied().flatten().filter(|_| strategy == ExpertStrategy::Hybrid && pools.stager.is_some());
        let shares = &self.shares;
        // Hybrid's CPU path runs even with an empty share: it may take the accelerator's.
        let cpu_takes = !cpu_share.is_empty() || (strategy == ExpertStrategy::Hybrid && !acc_share.is_empty());
        let cpu = match cpu.as_mut() {
            None if !cpu_share.is_empty() => return Err(Error::request("an expert was placed on the CPU path, which has no threads")),
            Some(c) if cpu_takes => Some(c),
            _ => None,
        };
        // The CPU path's job: its share, then what it takes from the accelerator's.
        let ranked = RankedOut::new(op.ranked, k, d);
        let ranked = &ranked;
        let cpu_job = |w: &mut CpuWork| {
            let mut s = Scratch { floats: &mut *w.floats, operand: &mut *w.operand };
            while let Some(e) = shares.next_for_cpu() {
                let one = Instant::now();
                let weights = ExpertWeights { shape, gate_up: model.tensor_bytes(first + 2 * e), down: model.tensor_bytes(first + 2 * e + 1) };
                // SAFETY: `shares` handed e to this path alone; its picks are its own.
                compute::expert(weights, x, routing.picks(e as usize), &mut s, w.pool, features, |p, y| unsafe { ranked.write(p, y) });
                w.timings.push((routing.load(e as usize), one.elapsed().as_secs_f64()));
            }
        };
        // This thread's part: the accelerator's experts, then (hybrid) the forecast of the
        // next layer and its prefetches, decided while the CPU path finishes (the copies run
        // on an idle core, mostly during the next layer's attention); returns the experts'
        // seconds and when it finished.
        let (work, operand, rows) = (&mut *op.work, &mut *op.operand, op.rows);
        let mut acc_job = || -> Result<(f64, Instant)> {
            let mut w = AcceleratorWork { shape, routing, layer, x, ranked, work: &mut *work, operand: &mut *operand, pool, features, timings: acc_timings };
            let acc = match strategy {
                ExpertStrategy::Lru => {
                    // Ready ones first (no waiting), then those to stage, pipelined.
                    lru_list.clear();
                    lru_list.extend_from_slice(acc_share);
                    lru_list.sort_unstable_by_key(|&(e, cached)| (!cached, e));
                    accelerator_part(pools, strategy, lru_list, inflight, &mut w)?
                }
                _ => accelerator_shared(pools, shares, &mut w)?,
            };
            if let Some(router) = next_router {
                let router = model.matrix_at(router, model.tensor_bytes(router));
                forecast.predict_load(&router, &x[..rows * shape.d], k, &mut *operand, pool, features);
                improve_pool(pools, split, layer + 1, forecast, Why::Prefetch);
            }
            Ok((acc, Instant::now()))
        };
        // Both at once: the CPU path's job goes to its own (long-lived) threads while this
        // thread runs the accelerator's; both are done when `run_beside` returns.
        let (acc, cpu_seconds) = match cpu {
            Some(c) => {
                let (acc, cpu_seconds) = c.run_beside(&cpu_job, acc_job);
                (acc, Some(cpu_seconds))
            }
            None => (acc_job(), None),
        };
        let (accelerator, acc_done) = acc?;
        let cpu_wait = acc_done.elapsed().as_secs_f64();
        Ok(PathTimes { accelerator, cpu: cpu_seconds.transpose()?.unwrap_or(0.0), cpu_wait })
    }

    /// Counts what each path computed and took, and teaches the cost model each expert's time.
    fn learn_from_paths(&mut self, t: PathTimes) {
        let by_cpu = self.shares.taken_by_cpu();
        self.counters.accelerator_experts += (self.candidates.len() - by_cpu) as u64;
        self.counters.cpu_experts += by_cpu as u64;
        self.counters.accelerator_seconds += t.accelerator;
        self.counters.cpu_seconds += t.cpu;
        if by_cpu > 0 {
            self.counters.cpu_wait_seconds += t.cpu_wait;
        }
        for &(rows, t) in &self.acc_timings {
            self.split.observe(Place::Accelerator, rows, t);
        }
        if let Some(c) = self.cpu.as_ref().filter(|_| by_cpu > 0) {
            for &(rows, t) in c.timings() {
                self.split.observe(Place::Cpu, rows, t);
            }
        }
    }

    /// Hybrid, after a layer ran: forecasts its next run (the next pass) by the routing it
    /// just had, which a diffusion step changes little, and improves its pool for it.
    fn refresh(&mut self, layer: usize) {
        if self.pools.stager.is_none() {
            return;
        }
        let routing = &self.routing;
        self.forecast.load.clear();
        self.forecast.load.extend((0..self.pools.per_layer).map(|e| routing.load(e)));
        improve_pool(&mut self.pools, &self.split, layer, &mut self.forecast, Why::Refresh);
    }
}

/// `place`'s share of a layer's `candidates` (placed by `places`) into `out`, as (expert,
/// cached), heaviest first; the accelerator's with the cached ones first. `order` is scratch.
fn share(candidates: &[Candidate], places: &[Place], place: Place, order: &mut Vec<usize>, out: &mut Vec<(u32, bool)>) {
    order.clear();
    order.extend((0..candidates.len()).filter(|&i| places[i] == place));
    let cached_first = place == Place::Accelerator;
    // Unstable (no scratch allocated): the keys are distinct, an expert being one candidate.
    order.sort_unstable_by_key(|&i| (cached_first && !candidates[i].cached, std::cmp::Reverse(candidates[i].rows), candidates[i].expert));
    out.clear();
    out.extend(order.iter().map(|&i| (candidates[i].expert, candidates[i].cached)));
}

/// Hybrid: stages into `layer`'s pool the experts whose caching the cost model says shortens
/// the layer's next run, by the forecast `f.load` (rows per expert), more than the copy costs:
/// each candidate (heaviest first) is weighed by the layer's predicted finish time (the
/// later of the two paths, as `split` places the experts, from the pool alone) with it cached
/// in place of the lowest-scored expert the forecast leaves idle, against without; the
/// latency each copy saves decides it (HybriMoE's impact-driven prefetch). A copy made ahead
/// runs on the staging thread, off the layer's critical path, but it takes CPU time (and
/// memory bandwidth) from the cores that compute: its measured CPU time is its cost.
fn improve_pool(pools: &mut Pools, split: &Split, layer: usize, f: &mut Forecast, why: Why) {
    let budget = (pools.slots_per_layer / RESTAGE_SHARE).max(1);
    let Forecast { load, candidates: forecast, wanted, places, order, .. } = f;
    forecast.clear();
    forecast.extend((0..load.len()).filter(|&e| load[e] > 0).map(|e| Candidate { expert: e as u32, rows: load[e], cached: pools.cache.slot_of(layer, e as u32).is_some() }));
    wanted.clear();
    wanted.extend((0..forecast.len()).filter(|&i| !forecast[i].cached));
    // Unstable (no scratch allocated): the keys are distinct, an expert being one candidate.
    wanted.sort_unstable_by_key(|&i| (std::cmp::Reverse(forecast[i].rows), forecast[i].expert));
    let mut staged = 0;
    for &i in wanted.iter() {
        if staged == budget {
            break;
        }
        let idle = |s: &cache::Slot| s.expert.is_none_or(|held| load[held as usize] == 0);
        let Some((slot, _)) = pools.cache.lowest_score(layer, |s| !idle(s)) else { break };
        let (a, c) = split.assign(forecast, 0, places, order);
        forecast[i].cached = true;
        let (a2, c2) = split.assign(forecast, 0, places, order);
        if a.max(c) - a2.max(c2) <= split.stage_cost() {
            forecast[i].cached = false;
            continue;
        }
        pools.stage(layer, slot, forecast[i].expert, why);
        staged += 1;
    }
}

/// What the accelerator path computes a layer's experts with: the inputs, the outputs
/// (`ranked`), its working memory in the window, and each expert's (rows, seconds).
struct AcceleratorWork<'a> {
    shape: ExpertShape,
    routing: &'a Routing,
    layer: usize,
    x: &'a [f32],
    ranked: &'a RankedOut<'a>,
    work: &'a mut [f32],
    operand: &'a mut [u8],
    pool: &'a rayon::ThreadPool,
    features: Features,
    timings: &'a mut Vec<(usize, f64)>,
}

impl AcceleratorWork<'_> {
    /// Expert `e` from `slot` (waiting for its copy); returns the seconds computing it.
    fn expert(&mut self, pools: &mut Pools, e: u32, slot: usize) -> Result<f64> {
        let shape = self.shape;
        let (gu_len, dn_len) = (matrix_len(shape, true), matrix_len(shape, false));
        let home = pools.homes[self.layer * pools.per_layer + e as usize];
        let bytes = pools.read(self.layer, slot)?;
        let start = Instant::now();
        let mut s = Scratch { floats: &mut *self.work, operand: &mut *self.operand };
        let ranked = self.ranked;
        let weights = ExpertWeights { shape, gate_up: &bytes[home.gate_up..][..gu_len], down: &bytes[home.down..][..dn_len] };
        // SAFETY: the accelerator path alone computes e (`shares` or the fixed lru list gave
        // it), so its picks are its own.
        compute::expert(weights, self.x, self.routing.picks(e as usize), &mut s, self.pool, self.features, |p, y| unsafe { ranked.write(p, y) });
        let took = start.elapsed().as_secs_f64();
        self.timings.push((self.routing.load(e as usize), took));
        Ok(took)
    }
}

/// Lru's accelerator path: `list`'s experts from their slots, staging the uncached ones first
/// (into slots no later expert of the list needs, as many ahead as there are such slots).
/// `inflight` is scratch for the copies in flight (list index, slot), with room for a pool's
/// slots. Returns the seconds spent computing (waits for copies aside).
fn accelerator_part(pools: &mut Pools, strategy: ExpertStrategy, list: &[(u32, bool)], inflight: &mut VecDeque<(usize, usize)>, w: &mut AcceleratorWork) -> Result<f64> {
    let layer = w.layer;
    let mut computing = 0.0;
    inflight.clear();
    let mut next_miss = list.iter().position(|&(_, cached)| !cached).unwrap_or(list.len());
    for i in 0..list.len() {
        while next_miss < list.len() && inflight.len() < pools.slots_per_layer {
            let needed = |s: &cache::Slot| s.expert.is_some_and(|e| list[i..].iter().any(|&(x, cached)| x == e && cached) || inflight.iter().any(|&(j, _)| list[j].0 == e));
            let victim = match strategy {
                ExpertStrategy::Lru => pools.cache.lru_victim(layer, needed),
                _ => pools.cache.lowest_score(layer, needed).map(|v| v.0),
            };
            let Some(slot) = victim else { break };
            pools.stage(layer, slot, list[next_miss].0, Why::Demand);
            inflight.push_back((next_miss, slot));
            next_miss += 1;
        }
        let e = list[i].0;
        let slot = match inflight.front() {
            Some(&(j, slot)) if j == i => {
                inflight.pop_front();
                slot
            }
            _ => pools.cache.slot_of(layer, e).ok_or_else(|| Error::request(format!("expert {e} of layer {layer} has no slot and none could be freed")))?,
        };
        computing += w.expert(pools, e, slot)?;
    }
    Ok(computing)
}

/// Hybrid's accelerator path: the experts `shares` hands it, from their slots (waiting for
/// the copies of those the split staged, staging those it takes from the CPU's share).
/// Returns the seconds spent computing.
fn accelerator_shared(pools: &mut Pools, shares: &Shares, w: &mut AcceleratorWork) -> Result<f64> {
    let (layer, routing) = (w.layer, w.routing);
    let mut computing = 0.0;
    // A slot this layer does not use, to stage an expert taken from the CPU's share into.
    let idle = |s: &cache::Slot| s.expert.is_none_or(|held| routing.load(held as usize) == 0);
    loop {
        let free = pools.cache.lowest_score(layer, |s| !idle(s)).map(|v| v.0);
        let Some((e, cached)) = shares.next_for_accelerator(free.is_some()) else { break };
        let slot = match (pools.cache.slot_of(layer, e), free) {
            (Some(slot), _) => slot,
            (None, Some(slot)) if !cached => {
                pools.stage(layer, slot, e, Why::Demand);
                slot
            }
            _ => return Err(Error::request(format!("expert {e} of layer {layer} was given to the accelerator without a slot"))),
        };
        computing += w.expert(pools, e, slot)?;
    }
    Ok(computing)
}

/// Bytes of an expert's `[gate | up]` (or down) matrix.
fn matrix_len(shape: ExpertShape, gate_up: bool) -> usize {
    let (n, k) = if gate_up { (2 * shape.hidden, shape.d) } else { (shape.d, shape.hidden) };
    shape.format.nbytes(&[n as u64, k as u64]).expect("a packed format") as usize
}

/// An MoE op without an expert runtime (the revision side path, which reads every weight from
/// the artifact): every expert on `pool`, in increasing id.
pub fn run_local(model: &Model, op: MoeOperands, experts: usize, top_k: usize, scratch: &mut OpScratch, pool: &rayon::ThreadPool, features: Features) -> Result<()> {
    let h = &model.header;
    let t = &h.tensors[op.first as usize];
    let activation = h.model.moe.map_or(Default::default(), |m| m.activation);
    let shape = ExpertShape { d: h.model.d_model as usize, hidden: h.model.mlp_hidden as usize, format: t.dtype, bf16_activations: h.plan.bf16_activations, activation_scales: h.plan.activation_scales, activation };
    let routing = &mut scratch.routing;
    routing.from_route(op.route, op.rows, top_k, experts)?;
    let d = shape.d;
    let mut s = Scratch { floats: op.work, operand: op.operand };
    for e in routing.active() {
        let weights = ExpertWeights { shape, gate_up: model.tensor_bytes(op.first + 2 * e as u32), down: model.tensor_bytes(op.first + 2 * e as u32 + 1) };
        let ranked = &mut *op.ranked;
        compute::expert(weights, op.x, routing.picks(e), &mut s, pool, features, |p, y| ranked[p.ranked_at(top_k, d)..][..d].copy_from_slice(y));
    }
    combine(op.route, op.ranked, op.rows, top_k, d, op.out, &mut scratch.combine_order);
    Ok(())
}

/// What a host executor's MoE ops work in, sized once for the model (empty for a dense one):
/// the router's per-row scratch (`Route`), and a layer's routing and combine order
/// ([`run_local`]).
#[derive(Debug, Default)]
pub struct OpScratch {
    pub route: RouteScratch,
    routing: Routing,
    combine_order: Vec<(u32, usize, f32)>,
}

impl OpScratch {
    pub fn new(h: &Header) -> OpScratch {
        let Some(moe) = h.model.moe else { return OpScratch::default() };
        let (experts, top_k) = (moe.experts as usize, moe.top_k as usize);
        let rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0) as usize;
        OpScratch { route: RouteScratch::new(experts), routing: Routing::new(experts, rows, top_k), combine_order: Vec::with_capacity(top_k) }
    }
}
