//! `lladac inspect --estimate`: predicted pass and generation times of an artifact's plan,
//! from its target's rates (labelled estimates on phones) or from rates measured on this
//! machine (`llada-rt roofline --json`), through the cost model of `llada-targets`.

use std::path::Path;

use std::collections::BTreeMap;

use llada_ir::{DType, ExpertCosts, Graph, Header, Op};
use llada_rt::moe::ExpertStrategy;
use llada_targets::cost::{self, Machine};
use llada_targets::{Rates, Target};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::latency::activation_bytes;
use crate::npu_estimate::NpuModel;
use crate::window::staged_bytes;
use llada_ir::diffusion_gemma::DiffusionGemmaSection;

mod diffusion_gemma;

/// What to predict.
#[derive(Debug, Clone)]
pub struct EstimateRequest {
    /// `exact`, `prefix` or `dual`.
    pub policy: String,
    pub prompt_len: u32,
    pub gen_len: u32,
    pub block_len: u32,
    pub steps: u32,
    /// Single passes to predict, by token rows.
    pub rows: Vec<u32>,
    /// The cached positions each of them attends to; `None`: as many as its rows.
    pub context: Option<u32>,
    /// The HTP limits to plan an artifact built `--host-only` for, where not the target's.
    pub npu_limits: crate::compile::NpuLimitOverrides,
    /// Whether `rows`, and the generation's settings, are the user's (else defaults, which
    /// keep to what the plan holds: the rows its graphs hold, no generation longer than its
    /// positions, each left out with a note).
    pub rows_given: bool,
    pub generation_given: bool,
    /// `llada-rt roofline --json` output to take rates and bandwidth from.
    pub rates: Option<std::path::PathBuf>,
    /// `mbsd`: dense passes per generation (it commits several tokens a pass where drafts
    /// confirm, so its count is measured: `llada-rt run --json`'s `forward_passes`);
    /// `None`: one per step, its count without a confirmed draft.
    pub passes: Option<u32>,
    /// Another target's rates for the same plan (a Snapdragon artifact's plan is the same for
    /// every Snapdragon with the same window and row multiple).
    pub on_target: Option<String>,
}

/// Rates and bandwidth measured by `llada-rt roofline --json` (all threads): the GEMM
/// kernels' sustained rates (int8: that of the artifact's own quantised format), the
/// memory read bandwidth; the staging rate stays the target's.
fn measured(path: &Path, target: &Target, h: &Header) -> Result<Machine> {
    let text = llada_ir::files::read_text_bounded(path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(path, e))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| Error::Json { path: path.to_path_buf(), msg: e.to_string() })?;
    let get = |key: &str| {
        v[key]["all_threads"].as_f64().ok_or_else(|| Error::config(path, key, "missing: expected `llada-rt roofline --json` output"))
    };
    let gemm = |key: &str| v["gemm"][key].as_f64().filter(|&r| r > 0.0).ok_or_else(|| Error::config(path, &format!("gemm.{key}"), "missing: expected `llada-rt roofline --json` output"));
    let int8 = if h.tensors.iter().any(|t| t.dtype == llada_ir::DType::PanelQ8) { gemm("q8")? } else { gemm("q4")? };
    Ok(Machine {
        rates: Rates { f32_flops: gemm("f32")?, f16_flops: 0.0, bf16_flops: gemm("bf16")?, int8_ops: int8 },
        bandwidth: get("read_bytes")?,
        ..target.accelerator_machine()
    })
}

/// What the plan's matmuls compute on `m`: per stored weight type, the arithmetic (q8 and q4
/// run W8A8 and W4A8: activations quantised to int8 per row), its engine and rate.
fn matmul_arithmetic(h: &Header, m: &Machine, act: u32) -> Vec<Value> {
    let mut dtypes: Vec<DType> = Vec::new();
    for t in h.tensors.iter().filter(|t| t.dtype.is_panel()) {
        if !dtypes.contains(&t.dtype) {
            dtypes.push(t.dtype);
        }
    }
    dtypes
        .into_iter()
        .map(|d| {
            let engine = cost::matmul_engine(d, h.plan.bf16_activations, act);
            let computes = match d {
                DType::PanelQ4 { .. } => "W4A8".to_string(),
                DType::PanelQ8 => "W8A8".to_string(),
                _ => format!("{} products", engine.name()),
            };
            json!({"weights": d.name(), "computes": computes, "engine": engine.name(), "ops_per_second": m.rates.of(engine)})
        })
        .collect()
}

/// What an MoE layer costs under an expert strategy, with routing assumed uniform (a random
/// choice of `top_k` of `experts` per row): each expert is touched by a pass of `r` rows with
/// probability `p = 1 - (1 - k/E)^r` and then computes `r k / (E p)` rows on average; a pool
/// of `S` slots holds `S p` of the touched ones (any fixed set of S experts does as well
/// under uniform routing, which is why real routing's skew and stability are what the
/// runtime's cache exploits beyond this).
struct ExpertModel {
    strategy: ExpertStrategy,
    costs: ExpertCosts,
    experts: f64,
    top_k: f64,
    slots: f64,
}

impl ExpertModel {
    fn layer_seconds(&self, rows: u32) -> f64 {
        let (e, k, s) = (self.experts, self.top_k, self.slots);
        let p = 1.0 - (1.0 - k / e).powf(rows as f64);
        let n = (rows as f64 * k / (e * p)).ceil().max(1.0) as usize;
        let (acc, cpu) = (self.costs.accelerator.seconds(n), self.costs.cpu.seconds(n));
        let (touched, cached) = (e * p, s * p);
        match self.strategy {
            // Every touched expert on the CPU path.
            ExpertStrategy::Static => touched * cpu,
            // Every touched expert on the accelerator; the uncached ones copied first, the
            // copies overlapping the computation of others.
            ExpertStrategy::Lru => (touched * acc).max((touched - cached) * self.costs.stage_seconds + acc),
            // The cached ones on the accelerator, the rest on the CPU path, at once; then the
            // split's balance: whole experts move to the path that ends sooner, uncached ones
            // to the accelerator with their copies overlapping its computation (as lru's).
            ExpertStrategy::Hybrid => {
                let uncached = touched - cached;
                let best_moving_uncached = (0..=uncached.ceil() as usize).map(|m| {
                    let m = (m as f64).min(uncached);
                    let acc_side = ((cached + m) * acc).max(m * self.costs.stage_seconds + acc * (m > 0.0) as u8 as f64);
                    acc_side.max((uncached - m) * cpu)
                });
                let best_moving_cached = (0..=cached.ceil() as usize).map(|c| {
                    let c = (c as f64).min(cached);
                    ((cached - c) * acc).max((uncached + c) * cpu)
                });
                best_moving_uncached.chain(best_moving_cached).fold(f64::INFINITY, f64::min)
            }
        }
    }
}

/// The plan of an artifact on the machine it is predicted on: the machine's rates, the bytes of
/// an activation element on its target, and the NPU's model where the target runs the plan's
/// graphs as NPU executables.
struct Predictor<'a> {
    h: &'a Header,
    machine: &'a Machine,
    act: u32,
    npu: Option<&'a NpuModel>,
    /// DiffusionGemma's graphs (encoder and decoder) and the CPU its sampler runs on.
    dg: Option<(DiffusionGemmaSection, Machine)>,
}

impl Predictor<'_> {
    /// The graph a pass over `rows` token rows with `logit_rows` logits runs.
    fn graph(&self, rows: u32, logit_rows: u32) -> Result<&Graph> {
        let h = self.h;
        match &self.dg {
            Some((dg, _)) => diffusion_gemma::graph_for(h, dg, rows, logit_rows),
            None => h
                .graph_for_rows(rows as usize)
                .map(|i| &h.graphs[i as usize])
                .ok_or_else(|| Error::Options(format!("no graph of the plan holds {rows} rows (the largest has {})", h.graphs.iter().map(|g| g.rows).max().unwrap_or(0)))),
        }
    }

    /// One pass over `rows` token rows attending to `context` positions, logits for `logit_rows` rows:
    /// (graph name, graph rows, estimate). MoE layers take the time `experts` gives them.
    fn pass(&self, rows: u32, context: u32, logit_rows: u32, experts: Option<&ExpertModel>) -> Result<(String, u32, cost::PassEstimate)> {
        let (h, m, act) = (self.h, self.machine, self.act);
        let g = self.graph(rows, logit_rows)?;
        let mut work = cost::graph_work(h, g, logit_rows.min(g.logit_rows), context, h.plan.window.kv_dtype.bytes() as u32, act);
        let mut moe_seconds = 0.0;
        if let Some(x) = experts {
            for (op, w) in g.ops.iter().zip(&mut work) {
                if matches!(op, Op::MoeExperts { .. }) {
                    // Timed by the strategy's model instead of as one accelerator op.
                    *w = cost::OpWork { bytes: 0.0, ops: 0.0, engine: w.engine };
                    moe_seconds += x.layer_seconds(rows);
                }
            }
        }
        if let Some(n) = self.npu {
            // An executable computes every row of its graph over its cache length: the smallest
            // the executables are built for that holds the pass's keys.
            let roofline = n.roofline(h, m, g, n.cache_len_for(context), act);
            let compute = n.timing.map_or(roofline, |t| t.seconds(roofline, g.ops.len()));
            let p = n.pass(compute, m.bandwidth);
            return Ok((g.name.clone(), g.rows, cost::PassEstimate { compute_seconds: compute, staging_seconds: p.create_seconds + p.copy_seconds, seconds: p.seconds }));
        }
        let mut e = cost::pass_estimate(m, &work, staged_bytes(h, g), true);
        e.compute_seconds += moe_seconds;
        e.seconds += moe_seconds;
        Ok((g.name.clone(), g.rows, e))
    }

    /// A pass's compute seconds by op kind (the MoE experts under `experts`' model), where
    /// the plan's own ops run (no NPU executable).
    fn seconds_by_op(&self, rows: u32, context: u32, logit_rows: u32, experts: Option<&ExpertModel>) -> Result<BTreeMap<&'static str, f64>> {
        let h = self.h;
        let g = self.graph(rows, logit_rows)?;
        let work = cost::graph_work(h, g, logit_rows.min(g.logit_rows), context, h.plan.window.kv_dtype.bytes() as u32, self.act);
        let mut by_op = BTreeMap::new();
        for (op, w) in g.ops.iter().zip(&work) {
            let seconds = match (op, experts) {
                (Op::MoeExperts { .. }, Some(x)) => x.layer_seconds(rows),
                _ => cost::op_seconds(self.machine, w),
            };
            *by_op.entry(op.name()).or_default() += seconds;
        }
        Ok(by_op)
    }

    /// The single passes of each of `rows` under each expert strategy, attending to `context`
    /// cached positions (`None`: as many as its rows).
    fn single_passes(&self, rows: &[u32], context: Option<u32>, strategies: &[Option<ExpertModel>]) -> Result<Vec<Value>> {
        let h = self.h;
        let mut passes = Vec::new();
        for &r in rows {
            for x in strategies {
                let context = context.unwrap_or(r);
                if context > h.plan.kv_capacity {
                    return Err(Error::Options(format!("--context {context}: the plan's KV cache holds {} positions", h.plan.kv_capacity)));
                }
                let (graph, graph_rows, e) = self.pass(r, context, r, x.as_ref())?;
                let mut one = json!({"rows": r, "experts": strategy_name(x), "graph": graph, "graph_rows": graph_rows, "seconds": e.seconds, "compute_seconds": e.compute_seconds, "staging_seconds": e.staging_seconds});
                if self.npu.is_none() {
                    one["compute_seconds_by_op"] = json!(self.seconds_by_op(r, context, r, x.as_ref())?);
                }
                if let (Some(n), Some(g)) = (self.npu, h.graphs.iter().find(|g| g.name == graph)) {
                    // The roofline the fit to QNN's model scales (its input, for refitting).
                    let cache = n.cache_len_for(context);
                    one["npu_roofline_seconds"] = json!(n.roofline(h, self.machine, g, cache, self.act));
                    one["npu_cache_len"] = json!(cache);
                    one["ops"] = json!(g.ops.len());
                }
                passes.push(one);
            }
        }
        Ok(passes)
    }

    /// One generation of `req`, its `passes` as `(rows, context, logit rows, count)`, under the
    /// expert strategy `x`: its passes, the graph rows they compute, its time and staging.
    fn generation(&self, req: &EstimateRequest, passes: &[(u32, u32, u32, u32)], x: &Option<ExpertModel>) -> Result<Value> {
        let (mut total, mut count, mut rows_computed, mut staged, mut waited) = (0.0, 0u32, 0u64, 0.0, 0.0);
        let mut sampler = 0.0;
        for &(rows, context, logit_rows, n) in passes {
            if n == 0 {
                continue;
            }
            let (_, graph_rows, e) = self.pass(rows, context, logit_rows, x.as_ref())?;
            if let (Some((dg, cpu)), true) = (&self.dg, logit_rows > 0) {
                // The next decoder pass needs the sampled canvas: the step adds to the time.
                sampler += diffusion_gemma::sampler_seconds(cpu, dg) * n as f64;
            }
            total += e.seconds * n as f64;
            staged += e.staging_seconds * n as f64;
            waited += (e.seconds - e.compute_seconds).max(0.0) * n as f64;
            count += n;
            rows_computed += graph_rows as u64 * n as u64;
        }
        let mut one = json!({
            "policy": req.policy, "experts": strategy_name(x), "prompt_len": req.prompt_len, "gen_len": req.gen_len, "block_len": req.block_len, "steps": req.steps,
            "forward_passes": count, "graph_rows_computed": rows_computed, "seconds": total + sampler, "staging_seconds": staged, "staging_critical_seconds": waited,
        });
        if self.dg.is_some() {
            one["sampler_seconds"] = json!(sampler);
        }
        if let Some(n) = self.npu {
            let (created, bytes) = n.created();
            one["npu_contexts_created"] = json!(created as u64 * count as u64);
            one["npu_bytes_staged"] = json!(bytes * count as u64);
        }
        Ok(one)
    }

    /// QNN's own estimates of the executables (`lladac --npu-estimate-soc`), beside the cost
    /// model's for the same graph: every row of it over the whole cache, as the executable
    /// computes.
    fn qnn_estimates(&self, target: &Target) -> Result<Vec<Value>> {
        let (h, machine, act, npu) = (self.h, self.machine, self.act, self.npu);
        let mut qnn = Vec::new();
        if let Some(n) = llada_ir::npu::NpuSection::of(h).map_err(|e| Error::Options(e.to_string()))? {
            let mut keys: Vec<(u32, u32)> = n.estimates.iter().map(|e| (e.graph, e.cache_len)).collect();
            keys.sort_unstable();
            keys.dedup();
            for (gi, cache_len) in keys {
                let g = &h.graphs[gi as usize];
                let mine: Vec<_> = n.estimates.iter().filter(|e| e.graph == gi && e.cache_len == cache_len).collect();
                let micros: u64 = mine.iter().map(|e| e.micros).sum();
                let cycles: u64 = mine.iter().map(|e| e.cycles).sum();
                let model = match npu {
                    Some(npu) => npu.roofline(h, machine, g, cache_len, act),
                    None => cost::pass_estimate(machine, &cost::graph_work(h, g, g.logit_rows, cache_len, h.plan.window.kv_dtype.bytes() as u32, act), 0, true).seconds,
                };
                let qnn_seconds = (micros as f64 * 1e-6).max(1e-9);
                let fitted = target.npu_timing.filter(|t| t.estimate_soc == mine[0].soc_id).map(|t| t.seconds(model, g.ops.len()));
                // QNN's op trace by kind, beside each kind's roofline.
                let rooflines = npu.map(|n| n.group_rooflines(h, machine, g, cache_len, act)).unwrap_or_default();
                let mut kinds: Vec<llada_ir::npu::NpuOpKind> = mine.iter().flat_map(|e| e.groups.iter().map(|x| x.kind)).chain(rooflines.iter().map(|r| r.0)).collect();
                kinds.sort_by_key(|k| *k as u32);
                kinds.dedup();
                let groups: Vec<Value> = kinds
                    .iter()
                    .map(|&k| {
                        let (busy, ops) = mine.iter().flat_map(|e| &e.groups).filter(|x| x.kind == k).fold((0.0, 0), |(b, o), x| (b + x.busy_micros, o + x.ops));
                        let roof = rooflines.iter().find(|r| r.0 == k).map(|r| r.1 * 1e6);
                        json!({"kind": k.name(), "qnn_busy_micros": busy, "qnn_ops": ops, "roofline_micros": roof})
                    })
                    .collect();
                qnn.push(json!({
                    "graph": g.name, "rows": g.rows, "cache_len": cache_len, "soc_id": mine[0].soc_id, "contexts": mine.len(), "ops": g.ops.len(),
                    "qnn_seconds": qnn_seconds, "qnn_cycles": cycles, "cost_model_seconds": model,
                    "ratio": model / qnn_seconds,
                    "fitted_seconds": fitted, "fitted_ratio": fitted.map(|f| f / qnn_seconds),
                    "groups": groups,
                }));
            }
        }
        Ok(qnn)
    }
}

/// The expert strategy an estimate is made under (`None` for a dense model).
fn strategy_name(x: &Option<ExpertModel>) -> Option<&'static str> {
    x.as_ref().map(|x| x.strategy.name())
}

/// The target the plan was compiled for, and the one it is predicted on: the same, or
/// `--on-target`'s, which must share its window, row multiple and activations (for which the
/// plan is the same).
fn targets(h: &Header, req: &EstimateRequest) -> Result<(Target, Target)> {
    let compiled_for = llada_targets::by_name(&h.compile.target).map_err(Error::Options)?;
    let target = match &req.on_target {
        None => compiled_for.clone(),
        Some(name) => {
            let t = llada_targets::by_name(name).map_err(|e| Error::Options(format!("--on-target: {e}")))?;
            if t.window_bytes != compiled_for.window_bytes || t.row_multiple != compiled_for.row_multiple || t.activation_dtype != compiled_for.activation_dtype {
                return Err(Error::Options(format!(
                    "--on-target {name}: its window ({} bytes), row multiple ({}) or activations ({}) differ from '{}' ({}, {}, {}), for which this plan was made; compile for {name}",
                    t.window_bytes, t.row_multiple, t.activation_dtype, compiled_for.name, compiled_for.window_bytes, compiled_for.row_multiple, compiled_for.activation_dtype
                )));
            }
            t
        }
    };
    Ok((compiled_for, target))
}

/// The machine the plan is predicted on (the target's rates, or `--rates`' measured ones) and
/// the label saying which.
fn machine_and_label(h: &Header, req: &EstimateRequest, target: &Target) -> Result<(Machine, String)> {
    Ok(match &req.rates {
        Some(p) => (measured(p, target, h)?, format!("predicted from rates measured on this machine ({})", p.display())),
        None if target.estimated => (target.accelerator_machine(), format!("ESTIMATE for {} from its target file's rates (not measured)", target.name)),
        None => (target.accelerator_machine(), format!("predicted for {} from its target file's rates", target.name)),
    })
}

/// Refuses generation settings the estimate cannot follow: LLaDA 2.x's is of its published
/// generate only; the others' blocks must divide the generation and the steps.
fn check_generation_settings(req: &EstimateRequest, llada2: bool) -> Result<()> {
    let (b, g, s) = (req.block_len, req.gen_len, req.steps);
    if b == 0 || g == 0 {
        return Err(Error::Options(format!("--gen-len {g} --block-len {b}: both must be above 0")));
    }
    if llada2 && (s == 0 || req.policy != "exact" || req.passes.is_some_and(|n| n == 0)) {
        return Err(Error::Options(format!(
            "--policy {} --steps {s}: a LLaDA 2.x estimate is of its published generate (--policy exact), with steps per block above 0 (and --passes, its measured model calls, above 0)",
            req.policy
        )));
    }
    if !llada2 && (g % b != 0 || s % (g / b) != 0) {
        return Err(Error::Options(format!("--gen-len {g} must be a multiple of --block-len {b}, and --steps {s} a multiple of the block count")));
    }
    Ok(())
}

/// A mixture-of-experts plan is predicted under each expert strategy (see `ExpertModel`); its
/// expert costs are the plan's (the target's), or from the measured rates. A dense plan once,
/// under none.
fn expert_strategies(h: &Header, req: &EstimateRequest, machine: &Machine) -> Vec<Option<ExpertModel>> {
    let Some(moe) = h.model.moe else {
        return vec![None];
    };
    let costs = match &req.rates {
        Some(_) => {
            let first = h.graphs[0].ops.iter().find_map(|op| if let Op::MoeExperts { first, .. } = *op { Some(first) } else { None }).expect("an MoE plan has MoE ops");
            let path = cost::expert_path_cost(machine, h, first, 4);
            ExpertCosts { accelerator: path, cpu: path, stage_seconds: cost::expert_work(h, first, 4).0 / machine.staging_bytes_per_second }
        }
        None => h.plan.window.experts.costs,
    };
    [ExpertStrategy::Hybrid, ExpertStrategy::Lru, ExpertStrategy::Static]
        .into_iter()
        .map(|strategy| Some(ExpertModel { strategy, costs, experts: moe.experts as f64, top_k: moe.top_k as f64, slots: h.plan.window.experts.slots_per_layer as f64 }))
        .collect()
}

/// The token rows of the single passes to predict: the asked ones, or of the default ones those
/// the plan holds, with a note naming the rest.
fn rows_to_predict(h: &Header, req: &EstimateRequest) -> (Vec<u32>, Option<String>) {
    if req.rows_given {
        return (req.rows.clone(), None);
    }
    if let Ok(Some(dg)) = DiffusionGemmaSection::of(h) {
        // Its decoder computes a whole canvas whatever it holds.
        return (vec![dg.canvas_length], None);
    }
    let largest = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0);
    let (fit, left): (Vec<u32>, Vec<u32>) = req.rows.iter().partition(|&&r| r <= largest && req.context.unwrap_or(r) <= h.plan.kv_capacity);
    let note = (!left.is_empty()).then(|| format!("passes of {left:?} rows not estimated: the plan's graphs hold {largest} rows at most (--rows to ask)"));
    (fit, note)
}

/// The passes a generation runs under `req`'s policy, as `(rows, context, logit rows, count)`;
/// `max_rows`, the most rows a graph of the plan holds, shapes LLaDA 2.x's.
fn generation_passes(req: &EstimateRequest, llada2: bool, max_rows: u32) -> Result<Vec<(u32, u32, u32, u32)>> {
    let (b, g, s) = (req.block_len, req.gen_len, req.steps);
    let seq = req.prompt_len + g;
    if req.passes.is_some() && req.policy != "mbsd" && !llada2 {
        return Err(Error::Options(format!("--passes: only mbsd's pass count is measured; --policy {} runs {s} passes", req.policy)));
    }
    // (LLaDA 2.x's blocks lie on its own grid: `llada2_schedule`.)
    if llada2 {
        return Ok(llada2_schedule(req, max_rows));
    }
    let (blocks, per_block) = (g / b, s / (g / b));
    // As (rows, count), every pass attending to the whole sequence with a block's logits.
    let schedule: Vec<(u32, u32)> = match req.policy.as_str() {
        // A whole-sequence pass first (the prompt's cache), then passes of the smallest
        // graph holding a block: the block's masked rows and, in the rest, drafts of the next
        // blocks. Fewer passes than steps where drafts confirm.
        "mbsd" => {
            let passes = req.passes.unwrap_or(s);
            if passes == 0 || passes > s {
                return Err(Error::Options(format!("--passes {passes}: mbsd runs 1 to --steps ({s}) dense passes")));
            }
            vec![(seq, 1), (b, passes - 1)]
        }
        policy => {
            let mut v = Vec::new();
            for blk in 0..blocks {
                let block_start = req.prompt_len + blk * b;
                for step in 0..per_block {
                    let rows = match (policy, step) {
                        ("exact", _) | (_, 0) => seq,
                        ("prefix", _) => seq - block_start,
                        ("dual", _) => b,
                        (p, _) => return Err(Error::Options(format!("--policy {p}: the estimate knows exact, prefix, dual and mbsd"))),
                    };
                    v.push((rows, 1));
                }
            }
            v
        }
    };
    Ok(schedule.into_iter().map(|(rows, n)| (rows, seq, b, n)).collect())
}

/// Measured rates are this machine's: no NPU plan to shape, so the NPU session settings would
/// do nothing beside them.
fn check_rates_settings(req: &EstimateRequest) -> Result<()> {
    if req.rates.is_some() && req.npu_limits != crate::compile::NpuLimitOverrides::default() {
        let flag = if req.npu_limits.sessions.is_some() { "--npu-sessions" } else { "--npu-session-bytes" };
        return Err(Error::Options(format!("{flag}: --rates predicts the plan on this machine's measured rates, with no NPU sessions to plan, so it is refused")));
    }
    Ok(())
}

/// Predicts the single passes and generations `req` asks for on the plan of `h`.
pub fn estimate(h: &Header, req: &EstimateRequest) -> Result<Value> {
    check_rates_settings(req)?;
    let (compiled_for, target) = targets(h, req)?;
    let (machine, label) = machine_and_label(h, req, &target)?;
    let npu = if req.rates.is_some() { None } else { NpuModel::of(h, &target, req.npu_limits)? };
    let dg = DiffusionGemmaSection::of(h).map_err(|e| Error::Options(e.to_string()))?;
    let llada2 = h.model.family() == llada_ir::Family::Llada2Moe;
    match &dg {
        Some(dg) => diffusion_gemma::check_settings(req, dg)?,
        None => check_generation_settings(req, llada2)?,
    }
    let p = Predictor { h, machine: &machine, act: activation_bytes(&target), npu: npu.as_ref(), dg: dg.map(|dg| (dg, target.cpu_machine())) };
    let strategies = expert_strategies(h, req, &machine);
    let mut notes: Vec<String> = Vec::new();
    let (rows, left_out) = rows_to_predict(h, req);
    notes.extend(left_out);
    let passes = p.single_passes(&rows, req.context, &strategies)?;
    // Default settings longer than the plan's positions: no generation, a note. (DiffusionGemma
    // generates whole canvases.)
    let generated = if p.dg.is_some() { req.gen_len.div_ceil(req.block_len) * req.block_len } else { req.gen_len };
    let generation_fits = req.generation_given || req.prompt_len + generated <= h.plan.kv_capacity;
    if !generation_fits {
        notes.push(format!(
            "generation not estimated: prompt {} + gen {generated} positions exceed the plan's {} (--prompt-len and --gen-len to ask)",
            req.prompt_len, h.plan.kv_capacity
        ));
    }
    let schedule = match &p.dg {
        Some((dg, _)) => diffusion_gemma::schedule(req, dg.encoder_graphs.iter().map(|&g| h.graphs[g as usize].rows).max().unwrap_or(0)),
        None => generation_passes(req, llada2, h.graphs.iter().map(|g| g.rows).max().unwrap_or(0))?,
    };
    let generations = strategies.iter().filter(|_| generation_fits).map(|x| p.generation(req, &schedule, x)).collect::<Result<Vec<Value>>>()?;
    // Session setup: the window is one shared buffer, mapped once; the resident segments
    // are read from storage into it. Steady-state passes map nothing.
    let resident: u64 = h.plan.window.resident.iter().map(|r| h.segments[r.segment as usize].nbytes).sum();
    let setup = machine.map_seconds + resident as f64 / target.storage_bytes_per_second;
    let qnn = p.qnn_estimates(&target)?;
    let npu_json = p.npu.map(|n| {
        let mut v = n.describe();
        v["load"] = n.load(target.storage_bytes_per_second);
        v
    });
    Ok(json!({
        "label": label,
        "compiled_for": compiled_for.name,
        "npu": npu_json,
        "machine": machine,
        "matmuls": matmul_arithmetic(h, &machine, p.act),
        "passes": passes,
        "qnn_estimates": qnn,
        "setup": {"mappings": 1, "resident_bytes": resident, "seconds": setup},
        "generation": generations.first(),
        "notes": notes,
        "generations": generations,
    }))
}

/// LLaDA 2.x's published `generate` as passes `(rows, context, logit rows, count)`: the block
/// grid from position 0; the first call a pass over the prompt's whole blocks and the first
/// block (where a graph of `max_rows` holds them; else the prompt's blocks but the last stored
/// by a pass each); each later block's first call a pass over it and the block before it
/// (which it stores with its final tokens: each block attending up to its end), its other
/// calls a pass over the block.
/// Calls per block: `--passes` (measured model calls) spread over the blocks, or the most the
/// schedule takes (every call committing only the schedule's count: `block_len` spread over
/// `min(steps, gen_len)` calls, until the block's generated positions are committed).
fn llada2_schedule(req: &EstimateRequest, max_rows: u32) -> Vec<(u32, u32, u32, u32)> {
    let (p, g, b) = (req.prompt_len, req.gen_len, req.block_len);
    let (first, blocks) = (p / b, (p + g).div_ceil(b));
    let steps = req.steps.min(g).max(1);
    let schedule: Vec<u32> = (0..steps).map(|i| b / steps + u32::from(i < b % steps)).collect();
    let calls_for = |masked: u32| {
        let mut done = 0;
        schedule.iter().take_while(|&&c| {
            let go = done < masked;
            done += c;
            go
        }).count().max(1) as u32
    };
    let mut calls: Vec<u32> = (first..blocks).map(|k| calls_for((k + 1) * b - p.max(k * b))).collect();
    if let Some(n) = req.passes {
        // The measured calls, one a block at least, the rest spread evenly.
        let n = n.max(calls.len() as u32);
        let (each, extra) = (n / calls.len() as u32, n % calls.len() as u32);
        calls = (0..calls.len() as u32).map(|i| each + u32::from(i < extra)).collect();
    }
    // Where no graph holds two blocks, a finished block is stored by a pass of its own.
    let (whole, fold) = ((first + 1) * b <= max_rows, 2 * b <= max_rows);
    let stored_apart = if whole { 0 } else if fold { first.saturating_sub(1) } else { first };
    let mut v: Vec<(u32, u32, u32, u32)> = (0..stored_apart).map(|k| (b, (k + 1) * b, 0, 1)).collect();
    for (k, c) in (first..blocks).zip(calls) {
        let end = (k + 1) * b;
        let first_rows = match k {
            _ if k == first && whole => end,
            0 => b,
            _ if fold => 2 * b,
            _ => {
                if k > first {
                    v.push((b, end - b, 0, 1));
                }
                b
            }
        };
        v.push((first_rows, end, b, 1));
        v.push((b, end, b, c - 1));
    }
    v
}

/// The text form of [`estimate`].
pub fn render_text(e: &Value) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "{}", e["label"].as_str().unwrap_or(""));
    for m in e["matmuls"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "  matmuls over {} weights compute {} at {:.3e} ops/s ({} engine)",
            m["weights"].as_str().unwrap_or(""), m["computes"].as_str().unwrap_or(""), m["ops_per_second"].as_f64().unwrap_or(0.0), m["engine"].as_str().unwrap_or("")
        );
    }
    let experts = |v: &Value| v["experts"].as_str().map_or(String::new(), |x| format!(", experts {x}"));
    for p in e["passes"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "  pass of {:>5} rows (graph {}{}): {:.4} s (compute {:.4} s, staging {:.4} s, overlapped)",
            p["rows"], p["graph"].as_str().unwrap_or(""), experts(p), p["seconds"].as_f64().unwrap_or(0.0), p["compute_seconds"].as_f64().unwrap_or(0.0),
            p["staging_seconds"].as_f64().unwrap_or(0.0)
        );
    }
    let n = &e["npu"];
    if !n.is_null() {
        let timing = match n["timing"].as_object() {
            Some(t) => format!("roofline x {:.2} + {:.2} us per op (fitted to QNN's model for SoC id {})", t["roofline_scale"].as_f64().unwrap_or(0.0), t["op_seconds"].as_f64().unwrap_or(0.0) * 1e6, t["estimate_soc"]),
            None => "the roofline (no fit to QNN's model)".into(),
        };
        let mib = |v: &Value| v.as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64;
        let _ = writeln!(s, "  NPU ({} weights): {} contexts over {} HTP session(s) ({}), {} resident; executables timed as {}", n["weights"].as_str().unwrap_or(""), n["contexts"], n["sessions"], n["source"].as_str().unwrap_or(""), n["resident"], timing);
        for (k, c) in n["per_context"].as_array().into_iter().flatten().enumerate() {
            let _ = writeln!(
                s,
                "    context {k}: layers {}..{}, session {}, mapping {:.1} MiB, spill-fill {:.1} MiB, {}",
                c["layers"][0], c["layers"][1], c["session"], mib(&c["mapping_bytes"]), mib(&c["spill_fill_bytes"]),
                if c["resident"] == true { "resident" } else { "rotating" }
            );
        }
        if n["created_per_pass"].as_u64().unwrap_or(0) > 0 {
            let _ = writeln!(
                s,
                "    {} contexts ({:.1} MiB) created every pass at {:.2} s/GiB, {}",
                n["created_per_pass"], mib(&n["bytes_per_pass"]), n["create_seconds_per_gib"].as_f64().unwrap_or(0.0),
                if n["double_buffered"] == true { "each but a pass's first while the context before it runs" } else { "each before it runs" }
            );
        }
        let l = &n["load"];
        let _ = writeln!(
            s,
            "    session open (the load, once): {} contexts, {:.1} MiB: {:.2} s creating them at {:.2} s/GiB, {:.2} s reading them from storage",
            l["contexts_created"], mib(&l["bytes"]), l["create_seconds"].as_f64().unwrap_or(0.0), n["create_seconds_per_gib"].as_f64().unwrap_or(0.0), l["storage_seconds"].as_f64().unwrap_or(0.0)
        );
    }
    for q in e["qnn_estimates"].as_array().into_iter().flatten() {
        let fitted = q["fitted_seconds"].as_f64().map_or(String::new(), |f| format!("; fitted {:.0} us, ratio {:.2}", f * 1e6, q["fitted_ratio"].as_f64().unwrap_or(0.0)));
        let _ = writeln!(
            s,
            "  graph {} ({} rows over {} cached positions): QNN's estimate for SoC id {} {:.0} us ({} cycles over {} context(s)); the cost model's roofline {:.0} us, ratio {:.2}{fitted}",
            q["graph"].as_str().unwrap_or(""), q["rows"], q["cache_len"], q["soc_id"], q["qnn_seconds"].as_f64().unwrap_or(0.0) * 1e6, q["qnn_cycles"], q["contexts"],
            q["cost_model_seconds"].as_f64().unwrap_or(0.0) * 1e6, q["ratio"].as_f64().unwrap_or(0.0)
        );
        let groups = q["groups"].as_array().map_or(&[][..], |g| g.as_slice());
        if !groups.is_empty() {
            let _ = writeln!(s, "    QNN's op trace by kind (busy time of the units, HVX threads summed) | roofline:");
            for g in groups {
                let roof = g["roofline_micros"].as_f64().map_or("-".to_string(), |r| format!("{r:.0} us"));
                let _ = writeln!(s, "      {:<22} {:>9.0} us in {:>6} ops | {roof}", g["kind"].as_str().unwrap_or(""), g["qnn_busy_micros"].as_f64().unwrap_or(0.0), g["qnn_ops"]);
            }
        }
    }
    let st = &e["setup"];
    let _ = writeln!(
        s,
        "  session setup: {} mapping, {:.1} MiB of resident weights read from storage: {:.3} s (once)",
        st["mappings"], st["resident_bytes"].as_u64().unwrap_or(0) as f64 / (1u64 << 20) as f64, st["seconds"].as_f64().unwrap_or(0.0)
    );
    for n in e["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  note: {}", n.as_str().unwrap_or(""));
    }
    for g in e["generations"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "  generation ({} policy{}, prompt {}, gen {}, block {}, {} steps): {} passes, {} graph rows, {:.3} s{}",
            g["policy"].as_str().unwrap_or(""), experts(g), g["prompt_len"], g["gen_len"], g["block_len"], g["steps"], g["forward_passes"], g["graph_rows_computed"], g["seconds"].as_f64().unwrap_or(0.0),
            g["npu_contexts_created"].as_u64().map_or(String::new(), |c| format!(
                " ({c} NPU contexts created, {:.2} GiB in {:.3} s, {:.3} s of it not hidden behind a pass)",
                g["npu_bytes_staged"].as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64,
                g["staging_seconds"].as_f64().unwrap_or(0.0),
                g["staging_critical_seconds"].as_f64().unwrap_or(0.0)
            ))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt_len: u32, gen_len: u32, steps: u32, passes: Option<u32>) -> EstimateRequest {
        EstimateRequest { policy: "exact".into(), prompt_len, gen_len, block_len: 32, steps, rows: vec![], context: None, npu_limits: Default::default(), rows_given: true, generation_given: true, rates: None, passes, on_target: None }
    }

    #[test]
    fn measured_rates_refuse_the_npu_session_settings() {
        let rates = Some(std::path::PathBuf::from("roofline.json"));
        for (limits, flag) in [(crate::compile::NpuLimitOverrides { sessions: Some(1), session_bytes: None }, "--npu-sessions"), (crate::compile::NpuLimitOverrides { sessions: None, session_bytes: Some(1 << 30) }, "--npu-session-bytes")] {
            let req = EstimateRequest { rates: rates.clone(), npu_limits: limits, ..request(32, 64, 64, None) };
            let e = check_rates_settings(&req).unwrap_err().to_string();
            assert!(e.contains(flag) && e.contains("--rates"), "{e}");
        }
        check_rates_settings(&EstimateRequest { rates, ..request(32, 64, 64, None) }).unwrap();
    }

    #[test]
    fn llada2_passes_follow_its_block_grid() {
        // Prompt 32 (block 0 whole), gen 64: blocks 1 and 2, 32 calls each; each block's first
        // call also stores the block before it.
        let v = llada2_schedule(&request(32, 64, 32, None), 512);
        assert_eq!(v, vec![(64, 64, 32, 1), (32, 64, 32, 31), (64, 96, 32, 1), (32, 96, 32, 31)]);
        // Prompt 100: blocks 0 to 2 in block 3's first call; block 3 holds 28 generated
        // positions, which 8 steps of 4 commit in 7 calls.
        let v = llada2_schedule(&request(100, 60, 8, None), 512);
        assert_eq!(&v[..2], &[(128, 128, 32, 1), (32, 128, 32, 6)]);
        // Where no graph holds them: blocks 0 and 1 by a pass each, block 2 with block 3.
        let v = llada2_schedule(&request(100, 60, 8, None), 64);
        assert_eq!(&v[..4], &[(32, 32, 0, 1), (32, 64, 0, 1), (64, 128, 32, 1), (32, 128, 32, 6)]);
        // Where none holds two blocks: every finished block by a pass of its own.
        let v = llada2_schedule(&request(32, 64, 32, None), 32);
        assert_eq!(v, vec![(32, 32, 0, 1), (32, 64, 32, 1), (32, 64, 32, 31), (32, 64, 0, 1), (32, 96, 32, 1), (32, 96, 32, 31)]);
        // Measured model calls spread over the blocks, one each at least.
        let v = llada2_schedule(&request(40, 64, 32, Some(7)), 512);
        let calls: Vec<u32> = v.chunks(2).map(|c| c[0].3 + c[1].3).collect();
        assert_eq!(calls, vec![3, 2, 2]);
    }
}
