//! What a Snapdragon artifact's passes cost on the phone's NPU, for `lladac inspect
//! --estimate`: its executables' time (the cost model's roofline over the bytes they read,
//! through the target's fit to QNN's own performance model), the contexts created at session
//! open (the load) and, where some rotate, every pass; and every byte the phone moves for
//! them, weights and copies alike, against one DRAM bandwidth (QNN.md, "Residency, load cost
//! and speed on a phone").

use llada_ir::npu::{NpuOpKind, NpuSection, NpuWeights};
use llada_ir::{DType, Graph, Header, Op};
use llada_targets::cost::{self, Engine, Machine};
use llada_targets::{NpuMemory, NpuTiming, Target};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::npu_plan::{self, ContextPlan};

/// The NPU side of a Snapdragon artifact: its format, where its contexts live and the
/// target's figures that time them.
pub struct NpuModel {
    pub format: NpuWeights,
    /// The cache lengths the executables are built for (a pass runs the smallest that holds
    /// its keys).
    pub cache_lens: Vec<u32>,
    pub plan: ContextPlan,
    pub timing: Option<NpuTiming>,
    pub memory: NpuMemory,
    pub source: &'static str,
}

/// One pass on the NPU: the executables' time, the contexts created during it and their
/// copies' DRAM time, and the pass in all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NpuPass {
    pub compute_seconds: f64,
    pub create_seconds: f64,
    pub copy_seconds: f64,
    pub seconds: f64,
}

impl NpuModel {
    /// The artifact's NPU contexts, or (built `--host-only`) those lladac would build for its
    /// weights in the phone's form (row buckets sharing their weights); `None` off Snapdragon
    /// targets and for mixture-of-experts models (their routed experts run on the CPU between
    /// the executables: `ExpertModel` times those passes).
    pub fn of(h: &Header, target: &Target, overrides: crate::compile::NpuLimitOverrides) -> Result<Option<NpuModel>> {
        let overridden = overrides != Default::default();
        let flag = if overrides.sessions.is_some() { "--npu-sessions" } else { "--npu-session-bytes" };
        if crate::qnn::soc_of(&h.compile.target).is_none() || h.model.moe.is_some() {
            if overridden {
                return Err(Error::Options(format!("{flag}: only a dense model's NPU contexts on a Snapdragon target are planned over HTP sessions")));
            }
            return Ok(None);
        }
        if overrides.sessions == Some(0) || overrides.session_bytes == Some(0) {
            return Err(Error::Options(format!("{flag}: must be above 0")));
        }
        let memory = target.npu_memory.ok_or_else(|| Error::Options(format!("target '{}' gives no HTP limits (npu_memory)", target.name)))?;
        if let Some(n) = NpuSection::of(h).map_err(|e| Error::Options(e.to_string()))? {
            if overridden {
                return Err(Error::Options(format!("{flag}: this artifact's NPU contexts were planned when it was built (its sessions are data); compile it again with `lladac compile {flag}`, or estimate an artifact built --host-only")));
            }
            let plan = ContextPlan {
                limits: n.limits,
                layers: n.contexts.iter().map(|c| c.layers).collect(),
                bytes: n.contexts.iter().map(|c| h.segments[c.segment as usize].nbytes).collect(),
                spill_fill: n.contexts.iter().map(|c| c.spill_fill_bytes).collect(),
                session: n.contexts.iter().map(|c| c.session).collect(),
                resident: n.contexts.iter().map(|c| c.resident).collect(),
                sessions: n.sessions.clone(),
                budget: n.context_budget,
            };
            return Ok(Some(NpuModel { format: n.weights, cache_lens: n.cache_lens.clone(), plan, timing: target.npu_timing, memory, source: "the artifact's NPU contexts" }));
        }
        // Built with --host-only: what lladac builds by default for these weights.
        let format = match h.tensors.iter().find(|t| t.dtype.is_panel()).map(|t| t.dtype) {
            Some(DType::PanelQ4 { group }) => NpuWeights::Int4Lpbq { block: group },
            Some(DType::PanelQ8) => NpuWeights::Int8PerChannel,
            _ => NpuWeights::F16,
        };
        let limits = crate::compile::npu_limits(target, overrides).expect("a target with npu_memory");
        let (plan, _) = npu_plan::plan_contexts(h, format, true, limits, None).map_err(|e| Error::Options(format!("predicting the NPU contexts: {e}")))?;
        Ok(Some(NpuModel {
            format,
            cache_lens: npu_plan::cache_lens(h.plan.kv_capacity),
            plan,
            timing: target.npu_timing,
            memory,
            source: "predicted: the contexts lladac would build with --npu-shared-weights, the phone's form (this artifact has no NPU executables)",
        }))
    }

    /// The cache length a pass whose rows attend to `keys` cached positions runs.
    pub fn cache_len_for(&self, keys: u32) -> u32 {
        llada_ir::npu::cache_len_for(&self.cache_lens, keys)
    }

    /// The contexts created every pass (those that rotate) and their bytes.
    pub fn created(&self) -> (usize, u64) {
        let rotating = self.plan.bytes.iter().zip(&self.plan.resident).filter(|(_, r)| !**r).map(|(b, _)| *b);
        (rotating.clone().count(), rotating.sum())
    }

    /// Whether the last session holds two rotating contexts beside its resident ones, so that
    /// each is created while the one before it runs.
    fn double_buffered(&self) -> bool {
        let p = &self.plan;
        let mut rotating: Vec<u64> = p.bytes.iter().zip(&p.resident).filter(|(_, r)| !**r).map(|(b, _)| *b).collect();
        if rotating.is_empty() {
            return false;
        }
        rotating.sort_unstable_by(|a, b| b.cmp(a));
        let last = p.sessions.len() as u32 - 1;
        let kept: u64 = (0..p.bytes.len()).filter(|&k| p.session[k] == last && p.resident[k]).map(|k| p.bytes[k]).sum();
        let s = p.sessions[last as usize];
        kept + rotating.iter().take(2).sum::<u64>() <= p.limits.session_bytes.saturating_sub(s.io_bytes + s.spill_fill_bytes)
    }

    /// The roofline of graph `g`'s executables on `m` reading `cache` cached positions: the
    /// cost model's work with every matmul reading the bytes the executables hold (int4 and
    /// its block scales, an int8 head...) on the engine that computes them.
    pub fn roofline(&self, h: &Header, m: &Machine, g: &Graph, cache: u32, act: u32) -> f64 {
        let mut work = cost::graph_work(h, g, g.logit_rows, cache, h.plan.window.kv_dtype.bytes() as u32, act);
        let lm_head = npu_plan::lm_head_weight(g);
        for (op, w) in g.ops.iter().zip(&mut work) {
            match *op {
                Op::MatMul { weight, .. } => {
                    let t = &h.tensors[weight as usize];
                    w.bytes += npu_plan::matmul_bytes(h, weight, self.format, Some(weight) == lm_head) as f64 - t.nbytes as f64;
                    w.engine = if self.format == NpuWeights::F16 { Engine::F16 } else { Engine::Int8 };
                }
                // The host embeds the rows.
                Op::Embed { .. } => *w = cost::OpWork { bytes: 0.0, ops: 0.0, engine: w.engine },
                _ => {}
            }
        }
        cost::pass_estimate(m, &work, 0, true).compute_seconds
    }

    /// Graph `g`'s roofline split by the kinds QNN's op trace is grouped in: the weights'
    /// reads from DRAM, the products' arithmetic, and each other kind of op's roofline (the
    /// roofline has no fixed-point conversions or spill-fill).
    pub fn group_rooflines(&self, h: &Header, m: &Machine, g: &Graph, cache: u32, act: u32) -> Vec<(NpuOpKind, f64)> {
        let work = cost::graph_work(h, g, g.logit_rows, cache, h.plan.window.kv_dtype.bytes() as u32, act);
        let lm_head = npu_plan::lm_head_weight(g);
        let mut out: Vec<(NpuOpKind, f64)> = Vec::new();
        let mut add = |kind: NpuOpKind, s: f64| match out.iter_mut().find(|x| x.0 == kind) {
            Some(x) => x.1 += s,
            None => out.push((kind, s)),
        };
        for (op, w) in g.ops.iter().zip(&work) {
            match *op {
                Op::MatMul { weight, .. } => {
                    add(NpuOpKind::WeightRead, npu_plan::matmul_bytes(h, weight, self.format, Some(weight) == lm_head) as f64 / m.bandwidth);
                    let engine = if self.format == NpuWeights::F16 { Engine::F16 } else { Engine::Int8 };
                    add(NpuOpKind::Matmul, w.ops / m.rates.of(engine));
                }
                Op::Attention { .. } => add(NpuOpKind::Attention, cost::op_seconds(m, w)),
                Op::RmsNorm { .. } | Op::HeadRmsNorm { .. } => add(NpuOpKind::Norm, cost::op_seconds(m, w)),
                Op::Rope { .. } => add(NpuOpKind::Rope, cost::op_seconds(m, w)),
                Op::GatherLogitRows { .. } => add(NpuOpKind::DataMovement, cost::op_seconds(m, w)),
                Op::Add { .. } | Op::SwiGlu { .. } | Op::Scale { .. } | Op::Bias { .. } => add(NpuOpKind::Elementwise, cost::op_seconds(m, w)),
                _ => {}
            }
        }
        out
    }

    /// A pass whose executables take `compute` seconds: the rotating contexts are created
    /// (at the target's creation rate) and their bytes copied (read from the artifact,
    /// written where the HTP maps them: twice their bytes against the DRAM the executables
    /// stream their weights from); double buffered, creation overlaps the runs, the copies'
    /// DRAM time never does.
    pub fn pass(&self, compute: f64, dram_bytes_per_second: f64) -> NpuPass {
        let (_, bytes) = self.created();
        let create = bytes as f64 * self.memory.create_seconds_per_byte;
        let copy = 2.0 * bytes as f64 / dram_bytes_per_second;
        let seconds = if self.double_buffered() { (compute + copy).max(create) } else { compute + copy + create };
        NpuPass { compute_seconds: compute, create_seconds: create, copy_seconds: copy, seconds }
    }

    /// Session open: the resident contexts created once, after their binaries are read from
    /// storage.
    pub fn load(&self, storage_bytes_per_second: f64) -> Value {
        let bytes: u64 = self.plan.bytes.iter().zip(&self.plan.resident).filter(|(_, r)| **r).map(|(b, _)| *b).sum();
        let contexts = self.plan.resident.iter().filter(|r| **r).count();
        let create = bytes as f64 * self.memory.create_seconds_per_byte;
        let read = bytes as f64 / storage_bytes_per_second;
        json!({"contexts_created": contexts, "bytes": bytes, "create_seconds": create, "storage_seconds": read, "seconds": create + read})
    }

    /// The plan as `inspect --estimate --json` reports it.
    pub fn describe(&self) -> Value {
        let p = &self.plan;
        let (created, bytes) = self.created();
        json!({
            "weights": self.format.name(),
            "cache_lens": self.cache_lens,
            "contexts": p.bytes.len(),
            "resident": p.resident.iter().filter(|r| **r).count(),
            "sessions": p.sessions.len(),
            "limits": {"mapping_bytes": p.limits.mapping_bytes, "session_bytes": p.limits.session_bytes, "sessions": p.limits.sessions},
            "created_per_pass": created,
            "bytes_per_pass": bytes,
            "double_buffered": self.double_buffered(),
            "create_seconds_per_gib": self.memory.create_seconds_per_byte * (1u64 << 30) as f64,
            "source": self.source,
            "timing": self.timing.map(|t| json!({"estimate_soc": t.estimate_soc, "roofline_scale": t.roofline_scale, "op_seconds": t.op_seconds})),
            "per_context": (0..p.bytes.len()).map(|k| json!({
                "layers": p.layers[k], "session": p.session[k], "mapping_bytes": p.bytes[k], "spill_fill_bytes": p.spill_fill[k], "resident": p.resident[k],
            })).collect::<Vec<_>>(),
            "per_session": p.sessions.iter().enumerate().map(|(s, x)| {
                let held: u64 = (0..p.bytes.len()).filter(|&k| p.session[k] == s as u32).map(|k| p.bytes[k]).sum();
                json!({"io_bytes": x.io_bytes, "spill_fill_bytes": x.spill_fill_bytes, "context_bytes": held, "mapped_bytes": x.io_bytes + x.spill_fill_bytes + held})
            }).collect::<Vec<_>>(),
        })
    }
}
