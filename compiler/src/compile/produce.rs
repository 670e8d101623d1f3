//! The sections of an artifact, each produced in turn by `compile()`: the weights (the data
//! section's segments and tensors), the core header (graphs, plan, window) and a Snapdragon
//! target's NPU executables (`npu.qnn`).

use indicatif::{ProgressBar, ProgressStyle};
use llada_ir::diffusion_gemma::DiffusionGemmaSection;
use llada_ir::{ArtifactWriter, CompileInfo, DType, GluActivation, Graph, Header, ModelConfig, MoeConfig, Plan, TensorId};

use super::settings::{Rows, Settings};
use super::source::Source;
use super::{add_npu_executables, calibrate_activations, check_whole_bindings, checkpoint_values, convert, first_overflow_raw, npu_limits, overflow, rope_tables, rope_tables_of_pairs, write_packed, CompileOptions, CHUNK_BYTES};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::hf::config_diffusion_gemma::DiffusionGemmaSettings;
use crate::hf::config::LladaConfig;
use crate::lower::{self, NetworkOptions};
use crate::lower_diffusion_gemma::{self, Role};
use crate::window::{self, WindowOptions};
use crate::{latency, memory};

/// What the weights' producer wrote: each segment's tensor ids, and the rotary tables (and
/// DiffusionGemma's full-attention layers' own).
pub(super) struct Weights {
    pub ids: Vec<Vec<TensorId>>,
    pub rope: (TensorId, TensorId),
    pub rope_full: Option<(TensorId, TensorId)>,
    /// DiffusionGemma's rotary tables' values: its NPU executables hold their own copy
    /// (`RopeHeads`), and the tables have no checkpoint source to read again.
    pub rope_values: Vec<(TensorId, Vec<f32>)>,
}

/// The data section: every planned segment's tensors streamed from the checkpoint (converted,
/// packed, checked for overflow), then the rotary tables.
pub(super) fn weights(src: &Source, layout: &Layout, rows: &Rows, w: &mut ArtifactWriter, progress: bool) -> Result<Weights> {
    let (cfg, ckpt, segments) = (&src.cfg, &src.ckpt, &layout.segments);
    let (hd, rope_rows) = (cfg.head_dim(), rows.rope_rows);
    let total_bytes: u64 = segments.iter().flat_map(|(_, p)| p.iter()).flat_map(|t| t.sources.iter()).map(|s| s.nbytes).sum();
    let bar = if progress { ProgressBar::new(total_bytes) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} {eta}").unwrap().progress_chars("=> "));

    let mut ids: Vec<Vec<TensorId>> = Vec::new();
    for (segment, tensors) in segments {
        bar.set_message(segment.clone());
        w.begin_segment(segment)?;
        let mut seg_ids = Vec::new();
        for t in tensors {
            seg_ids.push(w.begin_tensor(&t.name, t.dtype, &t.shape)?);
            if t.dtype.is_panel() {
                write_packed(ckpt, t, w, &bar)?;
            } else {
                let mut buf = Vec::with_capacity(CHUNK_BYTES * 2);
                for src in &t.sources {
                    let mut done = 0;
                    ckpt.for_each_row_chunk(src, CHUNK_BYTES, |raw| {
                        if let Some(i) = first_overflow_raw(src.dtype, raw, t.dtype) {
                            return Err(overflow(&ckpt, src, done + i, t.dtype));
                        }
                        done += src.dtype.elements(raw.len());
                        buf.clear();
                        convert(src.dtype, raw, t.dtype, &mut buf);
                        bar.inc(raw.len() as u64);
                        Ok(w.write(&buf)?)
                    })?;
                }
            }
            w.end_tensor()?;
        }
        w.end_segment()?;
        ids.push(seg_ids);
    }
    bar.finish_and_clear();
    w.begin_segment("rope")?;
    let (cos, sin) = rope_tables(cfg.dims.rope_theta, hd, cfg.llada2.map_or(hd, |l| l.rotary_dim), rope_rows as usize);
    let half = (hd / 2) as u64;
    let rope_cos = w.add_tensor("rope.cos", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&cos))?;
    let rope_sin = w.add_tensor("rope.sin", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&sin))?;
    let mut rope_values = Vec::new();
    let rope_full = match &cfg.diffusion_gemma {
        Some(g) => {
            let (cos, sin) = rope_tables_of_pairs(g.full_rope_theta, g.full_head_dim, g.full_head_dim, g.full_rotary_pairs, rope_rows as usize);
            let half = (g.full_head_dim / 2) as u64;
            let cos_id = w.add_tensor("rope.full.cos", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&cos))?;
            let sin_id = w.add_tensor("rope.full.sin", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&sin))?;
            rope_values = vec![(cos_id, cos), (sin_id, sin)];
            Some((cos_id, sin_id))
        }
        None => None,
    };
    w.end_segment()?;
    if cfg.diffusion_gemma.is_some() {
        rope_values.extend([(rope_cos, cos), (rope_sin, sin)]);
    }
    Ok(Weights { ids, rope: (rope_cos, rope_sin), rope_full, rope_values })
}

/// The core section: the model's config, a graph per row bucket, the plan with its window
/// (planned again with fewer expert slots where an MoE model's NPU contexts need the room),
/// and the predicted latencies.
pub(super) fn core(opts: &CompileOptions, src: &Source, s: &Settings, rows: &Rows, layout: &Layout, weights: &Weights, w: &ArtifactWriter) -> Result<Header> {
    let (cfg, target, special, tok_spec) = (&src.cfg, &src.target, src.special.clone(), src.tok_spec.clone());
    let Settings { activation_scales, window_bytes, kv_dtype, .. } = *s;
    let Rows { max_seq, ref buckets, rope_rows, row_set_rows } = *rows;
    let (ids, (rope_cos, rope_sin)) = (&weights.ids, weights.rope);
    let model = model_config(cfg);
    let (mut graphs, expert_segments, by_rows, section) = match &cfg.diffusion_gemma {
        Some(g) => diffusion_gemma_graphs(src, g, &model, weights, buckets)?,
        None => {
            let (net, expert_segments) = layout.network(ids, cfg, (rope_cos, rope_sin))?;
            let net_opts = NetworkOptions { input_emb_norm: cfg.input_emb_norm, scale_logits: cfg.scale_logits };
            let graphs: Vec<_> = buckets.iter().map(|&rows| lower::full_sequence_graph(&model, &net, net_opts, rows, opts.logit_rows.min(rows))).collect();
            let by_rows = (0..graphs.len() as u32).collect();
            (graphs, expert_segments, by_rows, None)
        }
    };
    for g in &mut graphs {
        memory::plan(g, target.window_align);
    }
    let mut header = Header {
        model,
        special,
        tokenizer: tok_spec,
        tensors: Vec::new(),
        segments: Vec::new(),
        plan: Plan {
            by_rows,
            kv_capacity: rope_rows,
            block_len: opts.block_len,
            spec_blocks: opts.spec_blocks(),
            bf16_activations: opts.bf16_activations,
            activation_scales,
            ..Plan::default()
        },
        graphs,
        compile: compile_info(opts, src, s, max_seq),
        extensions: section.iter().map(|s| s.extension()).collect(),
    };
    header.tensors = w.tensors().to_vec();
    header.segments = w.segments().to_vec();
    let window_opts = WindowOptions {
        bytes: window_bytes,
        align: target.window_align,
        kv_dtype,
        threads: target.max_threads,
        host_segment: 0,
        expert_segments,
        expert_costs: latency::expert_costs(&header, &target),
        window_source: match (opts.window_bytes, target.max_window_bytes()) {
            (Some(_), _) => "--window-bytes".into(),
            // A GPU's window is already its largest allocation: --window-bytes cannot raise it.
            (None, Some((max, _))) if window_bytes == max => format!("target '{}', its GPU's largest allocation", target.name),
            (None, _) => format!("target '{}'", target.name),
        },
        can_grow: target.max_window_bytes().is_none_or(|(max, _)| window_bytes < max),
        max_expert_bytes: None,
    };
    plan_window(&mut header, window_opts, opts, s)?;
    if let Some(gpu) = target.gpu {
        check_whole_bindings(&header, &target.name, gpu.max_storage_buffer_bytes, gpu.storage_buffer_offset_align)?;
    }
    latency::record(&mut header, &target);
    latency::choose_row_buckets(&mut header, row_set_rows);
    Ok(header)
}

/// The artifact's model config from the checkpoint's.
fn model_config(cfg: &LladaConfig) -> ModelConfig {
    ModelConfig {
        architecture: cfg.family.name().into(),
        d_model: cfg.dims.d_model as u32,
        n_layers: cfg.dims.n_layers as u32,
        n_heads: cfg.dims.n_heads as u32,
        // Each layer's cache holds these (DiffusionGemma's layers differ: their widest).
        n_kv_heads: cfg.cache_heads().0 as u32,
        head_dim: cfg.cache_heads().1 as u32,
        mlp_hidden: cfg.dims.mlp_hidden as u32,
        vocab_size: cfg.dims.vocab_size as u32,
        embedding_size: cfg.dims.embedding_size as u32,
        max_sequence_length: cfg.dims.max_sequence_length as u32,
        rope_theta: cfg.dims.rope_theta,
        rms_eps: cfg.dims.rms_eps,
        qk_norm: cfg.qk_norm,
        moe: cfg.moe.map(|m| MoeConfig {
            experts: m.experts as u32,
            top_k: m.top_k as u32,
            dense_layers: cfg.llada2.map_or(0, |l| l.dense_layers as u32),
            activation: if cfg.diffusion_gemma.is_some() { GluActivation::GeluTanh } else { GluActivation::Silu },
        }),
    }
}

/// What made the artifact: the compiler, the source, the target and the options that shaped it.
fn compile_info(opts: &CompileOptions, src: &Source, s: &Settings, max_seq: u32) -> CompileInfo {
    let Settings { quant, activation_scales, window_bytes, kv_dtype, .. } = *s;
    let target = &src.target;
    CompileInfo {
        compiler: format!("lladac {}", env!("CARGO_PKG_VERSION")),
        source: opts.model.display().to_string(),
        target: target.name.clone(),
        options: vec![
            ("quant".into(), quant.name()),
            ("max_seq".into(), max_seq.to_string()),
            ("logit_rows".into(), opts.logit_rows.to_string()),
            ("block_len".into(), opts.block_len.to_string()),
            ("spec_blocks".into(), opts.spec_blocks().to_string()),
            ("activations".into(), (if opts.bf16_activations { "bf16" } else { "f32" }).into()),
            ("activation_scales".into(), activation_scales.name().into()),
            ("window_bytes".into(), window_bytes.to_string()),
            ("kv_dtype".into(), kv_dtype.name().into()),
        ]
        .into_iter()
        .chain(src.gguf_types.as_ref().map(|t| ("gguf".into(), gguf_summary(t, &quant.name()))))
        .collect(),
    }
}

/// Plans the window; an MoE model's NPU target plans it again with fewer expert slots where its
/// contexts need the room.
fn plan_window(header: &mut Header, window_opts: WindowOptions, opts: &CompileOptions, s: &Settings) -> Result<()> {
    let Settings { npu_soc, npu_weights, window_bytes, .. } = *s;
    // An MoE model's NPU target may plan again with fewer expert slots (below).
    let unplanned = (npu_soc.is_some() && header.model.moe.is_some()).then(|| header.clone());
    window::plan(header, &window_opts)?;
    if let (Some((soc, _)), Some(moe), Some(unplanned)) = (npu_soc, header.model.moe, unplanned) {
        // The NPU's contexts share the window with the expert slots: the slots leave room for
        // every context at once where a token's experts still get a slot a layer each beside
        // them, else for two one-layer contexts (one created while the other runs).
        let room = crate::npu_plan::executables_room(header, npu_weights, opts.npu_shared_weights, opts.npu_contexts).map_err(|e| Error::Options(format!("--target {soc}: {e}")))?;
        let io = llada_ir::npu::IoLayout::of(header).bytes;
        let x = &header.plan.window.experts;
        let layer_slots = x.slot_bytes * header.model.moe_layers() as u64;
        let reserve = if window_bytes.saturating_sub(io + room.all) >= moe.top_k as u64 * layer_slots { room.all } else { room.rotating.min(room.all) };
        let cap = window_bytes.saturating_sub(io + reserve);
        if x.region.bytes > cap {
            *header = unplanned;
            window::plan(header, &WindowOptions { max_expert_bytes: Some(cap), ..window_opts })?;
            if header.plan.window.experts.slots_per_layer == 0 {
                let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
                return Err(Error::Options(format!(
                    "--target {soc}: the {} window leaves no room for an expert slot a layer ({}) beside the NPU's I/O ({}) and executables ({} to rotate them, {} all at once); raise --window-bytes or use smaller weights (--quant q4)",
                    mib(window_bytes),
                    mib(layer_slots),
                    mib(io),
                    mib(room.rotating),
                    mib(room.all)
                )));
            }
        }
    }
    Ok(())
}

/// DiffusionGemma's graphs: the encoder's for every row bucket (prompts, and canvases being
/// stored), the decoder's for a canvas; its section naming them, with the checkpoint's
/// generation defaults. Returns (graphs, expert segments, the plan's `by_rows`, the section).
fn diffusion_gemma_graphs(src: &Source, g: &DiffusionGemmaSettings, model: &ModelConfig, weights: &Weights, buckets: &[u32]) -> Result<(Vec<Graph>, Vec<u32>, Vec<u32>, Option<DiffusionGemmaSection>)> {
    let (tensors, expert_segments) = crate::layout::diffusion_gemma::network(&weights.ids, &src.cfg)?;
    let layer_scalars = crate::layout::diffusion_gemma::layer_scalars(&src.ckpt, src.cfg.dims.n_layers)?;
    let rope_full = weights.rope_full.ok_or_else(|| Error::Options("internal: DiffusionGemma's full-layer rotary tables were not written".into()))?;
    let net = lower_diffusion_gemma::Network { model, settings: g, tensors: &tensors, layer_scalars: &layer_scalars, rope: [weights.rope, rope_full] };
    let canvas = g.canvas_length as u32;
    let largest = buckets.last().copied().unwrap_or(0);
    if canvas > largest {
        return Err(Error::Options(format!("canvas_length {canvas} is longer than --max-seq {largest}: a canvas must fit the cache after a prompt; raise --max-seq")));
    }
    // The decoder first: the window plan orders the weights by graph 0's first reads, and the
    // decoder reads every segment (the self-conditioning block too), the encoder a subset in
    // the same order.
    let mut graphs = vec![lower_diffusion_gemma::graph(&net, Role::Decoder, canvas)];
    graphs.extend(buckets.iter().map(|&rows| lower_diffusion_gemma::graph(&net, Role::Encoder, rows)));
    let encoder_graphs: Vec<u32> = (1..=buckets.len() as u32).collect();
    let section = DiffusionGemmaSection { canvas_length: canvas, vocab_size: src.cfg.dims.vocab_size as u32, encoder_graphs: encoder_graphs.clone(), decoder_graphs: vec![0], generation: g.generation.clone() };
    Ok((graphs, expert_segments, encoder_graphs, Some(section)))
}

/// A Snapdragon target's NPU executables (without `--host-only`): its activations calibrated
/// where they are 16-bit, every graph lowered to QNN, each context binary a segment, and the
/// `npu.qnn` section. Returns (SoC, contexts, binary bytes, seconds to build them).
pub(super) fn npu(opts: &CompileOptions, src: &Source, s: &Settings, layout: &Layout, weights: &Weights, header: &mut Header, w: &mut ArtifactWriter) -> Result<Option<(String, usize, u64, f64)>> {
    let Settings { npu_soc, npu_weights, ref calibration_set, .. } = *s;
    let target = &src.target;
    Ok(match (npu_soc, &src.qnn_library) {
        (Some(soc), Some(lib)) => {
            let calibration = match &calibration_set {
                Some((prompts, source)) => calibrate_activations(opts, prompts, source)?,
                None => Default::default(),
            };
            let limits = npu_limits(&target, opts.npu_limits).ok_or_else(|| Error::Options(format!("--target {}: the target file gives no HTP limits (npu_memory)", target.name)))?;
            let npu_opts = crate::qnn::NpuOptions { soc, weights: npu_weights, limits, contexts: opts.npu_contexts, shared_weights: opts.npu_shared_weights, estimate_soc: opts.npu_estimate_soc };
            let from_checkpoint = checkpoint_values(&src.ckpt, &layout.segments, &weights.ids);
            let values = |t: TensorId| match weights.rope_values.iter().find(|(id, _)| *id == t) {
                Some((_, v)) => Ok(v.clone()),
                None => from_checkpoint(t),
            };
            Some(add_npu_executables(header, w, &values, &calibration, lib, &npu_opts)?)
        }
        _ => None,
    })
}

/// What a GGUF source's weights became: its types, which were carried and which decoded.
fn gguf_summary(types: &std::collections::BTreeMap<&'static str, usize>, quant: &str) -> String {
    let list: Vec<String> = types.iter().map(|(t, n)| format!("{t} x{n}")).collect();
    let fate = |t: &str| match t {
        "F32" | "F16" | "BF16" => "as is",
        "Q4_0" if quant == "q4 (group 32)" => "matrices carried bit-exact",
        _ => "decoded exactly, re-quantized",
    };
    let mut fates: Vec<String> = types.keys().map(|t| format!("{t} {}", fate(t))).collect();
    fates.dedup();
    format!("{} ({}; stored as {quant})", list.join(", "), fates.join(", "))
}
