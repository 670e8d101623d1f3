//! `lladac compile`: checkpoint directory -> artifact.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use llada_ir::{ArtifactWriter, CompileInfo, DType, Header, ModelConfig, Plan, TensorId};

use crate::convert::{convert, source_to_dtype};
use crate::error::{Error, Result};
use crate::hf::checkpoint::{Checkpoint, TensorLocation};
use crate::hf::{config, names, tokenizer};
use crate::lower::{self, BlockTensors, NetworkOptions, NetworkTensors};
use crate::memory;

#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// Hugging Face checkpoint directory.
    pub model: PathBuf,
    /// Artifact to write.
    pub output: PathBuf,
    /// Stored type of the matrix weights; `None` keeps the checkpoint's.
    pub dtype: Option<DType>,
    /// Target name (see `llada_targets::names`).
    pub target: String,
    /// Longest sequence (prompt + generation) the artifact serves; `None`: the model's
    /// `max_sequence_length`, at most 4096.
    pub max_seq: Option<u32>,
    /// Most positions whose logits one pass produces (the exact sampler needs one block's worth).
    pub head_rows: u32,
    /// Show a progress bar on a terminal.
    pub progress: bool,
}

#[derive(Debug)]
pub struct CompileSummary {
    pub output: PathBuf,
    pub bytes: u64,
    pub tensors: usize,
    pub graphs: usize,
    pub dtype: DType,
    pub max_seq: u32,
    pub warnings: Vec<String>,
}

/// Chunk size for streaming tensors: large enough for fast I/O, small enough that compiling
/// an 8B checkpoint stays far below a gigabyte of resident memory.
const CHUNK_BYTES: usize = 16 << 20;

/// One tensor to copy from the checkpoint.
struct Planned<'a> {
    name: String,
    loc: &'a TensorLocation,
    dtype: DType,
}

pub fn compile(opts: &CompileOptions) -> Result<CompileSummary> {
    let dir = &opts.model;
    if !dir.exists() {
        return Err(Error::NotFound { path: dir.clone() });
    }
    let (cfg, mut warnings) = config::load(dir)?;
    let target = llada_targets::by_name(&opts.target).map_err(Error::Options)?;
    let ckpt = Checkpoint::open(dir)?;
    let (tok_spec, special) = tokenizer::load(dir, &cfg)?;

    let (d, hd, f) = (cfg.d_model, cfg.head_dim(), cfg.mlp_hidden);
    let q_dim = cfg.n_heads * hd;
    let kv_dim = cfg.n_kv_heads * hd;
    let why_d = format!("d_model {d}");
    let expect = |name: &str, shape: &[usize], why: &str| ckpt.expect(name, shape, why);
    // Check every tensor before writing anything.
    let embed = expect(names::EMBEDDING, &[cfg.embedding_size, d], &format!("embedding_size {}, {why_d}", cfg.embedding_size))?;
    let dtype = opts.dtype.unwrap_or_else(|| source_to_dtype(embed.dtype));
    if !target.weight_dtypes.iter().any(|t| t == dtype.name()) {
        return Err(Error::Options(format!(
            "--dtype {}: target '{}' supports {}",
            dtype.name(),
            target.name,
            target.weight_dtypes.join(", ")
        )));
    }
    let mut segments: Vec<(String, Vec<Planned>)> = Vec::new();
    let plan = |name: String, loc, dtype| Planned { name, loc, dtype };
    segments.push(("embedding".into(), vec![plan(names::EMBEDDING.into(), embed, dtype)]));
    for l in 0..cfg.n_layers {
        let mut parts = Vec::new();
        for (part, shape, is_norm, why) in [
            ("attn_norm", vec![d], true, why_d.clone()),
            ("q_proj", vec![q_dim, d], false, format!("n_heads {} x head_dim {hd}, {why_d}", cfg.n_heads)),
            ("k_proj", vec![kv_dim, d], false, format!("n_kv_heads {} x head_dim {hd}, {why_d}", cfg.n_kv_heads)),
            ("v_proj", vec![kv_dim, d], false, format!("n_kv_heads {} x head_dim {hd}, {why_d}", cfg.n_kv_heads)),
            ("attn_out", vec![d, q_dim], false, format!("{why_d}, n_heads {} x head_dim {hd}", cfg.n_heads)),
            ("ff_norm", vec![d], true, why_d.clone()),
            ("ff_proj", vec![f, d], false, format!("mlp_hidden_size {f}, {why_d}")),
            ("up_proj", vec![f, d], false, format!("mlp_hidden_size {f}, {why_d}")),
            ("ff_out", vec![d, f], false, format!("{why_d}, mlp_hidden_size {f}")),
        ] {
            let name = names::block(l, part);
            let loc = expect(&name, &shape, &why)?;
            parts.push(plan(name, loc, if is_norm { DType::F32 } else { dtype }));
        }
        segments.push((format!("blocks.{l}"), parts));
    }
    let ln_f = expect(names::FINAL_NORM, &[d], &why_d)?;
    let head = expect(names::HEAD, &[cfg.embedding_size, d], &format!("embedding_size {}, {why_d}", cfg.embedding_size))?;
    segments.push(("head".into(), vec![plan(names::FINAL_NORM.into(), ln_f, DType::F32), plan(names::HEAD.into(), head, dtype)]));
    let expected: std::collections::HashSet<&str> = segments.iter().flat_map(|(_, p)| p.iter().map(|t| t.name.as_str())).collect();
    let extra: Vec<&str> = ckpt.names().filter(|n| !expected.contains(n)).collect();
    if !extra.is_empty() {
        warnings.push(format!("{}: {} tensor(s) not used by LLaDA ignored, e.g. '{}'", dir.display(), extra.len(), extra[0]));
    }

    let max_seq = opts.max_seq.unwrap_or(cfg.max_sequence_length.min(4096) as u32);
    if max_seq == 0 || max_seq as usize > cfg.max_sequence_length {
        return Err(Error::Options(format!(
            "--max-seq {max_seq}: must be between 1 and the model's max_sequence_length ({})",
            cfg.max_sequence_length
        )));
    }
    if opts.head_rows == 0 {
        return Err(Error::Options("--head-rows must be at least 1".into()));
    }
    let buckets = lower::exact_buckets(max_seq, target.row_multiple);
    let rope_rows = *buckets.last().unwrap();

    let model = ModelConfig {
        architecture: "llada".into(),
        d_model: d as u32,
        n_layers: cfg.n_layers as u32,
        n_heads: cfg.n_heads as u32,
        n_kv_heads: cfg.n_kv_heads as u32,
        head_dim: hd as u32,
        mlp_hidden: f as u32,
        vocab_size: cfg.vocab_size as u32,
        embedding_size: cfg.embedding_size as u32,
        max_sequence_length: cfg.max_sequence_length as u32,
        rope_theta: cfg.rope_theta,
        rms_eps: cfg.rms_eps,
    };

    let total_bytes: u64 = segments.iter().flat_map(|(_, p)| p.iter()).map(|t| t.loc.nbytes).sum();
    let bar = if opts.progress { ProgressBar::new(total_bytes) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} {eta}").unwrap().progress_chars("=> "));

    let mut w = ArtifactWriter::create(&opts.output)?;
    let mut ids: Vec<TensorId> = Vec::new();
    let mut buf = Vec::with_capacity(CHUNK_BYTES * 2);
    for (segment, tensors) in &segments {
        bar.set_message(segment.clone());
        w.begin_segment(segment)?;
        for t in tensors {
            let shape: Vec<u64> = t.loc.shape.iter().map(|&x| x as u64).collect();
            ids.push(w.begin_tensor(&t.name, t.dtype, &shape)?);
            ckpt.for_each_row_chunk(t.loc, CHUNK_BYTES, |raw| {
                buf.clear();
                convert(t.loc.dtype, raw, t.dtype, &mut buf);
                bar.inc(raw.len() as u64);
                Ok(w.write(&buf)?)
            })?;
            w.end_tensor()?;
        }
        w.end_segment()?;
    }
    bar.finish_and_clear();
    w.begin_segment("rope")?;
    let (cos, sin) = rope_tables(cfg.rope_theta, hd, rope_rows as usize);
    let half = (hd / 2) as u64;
    let rope_cos = w.add_tensor("rope.cos", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&cos))?;
    let rope_sin = w.add_tensor("rope.sin", DType::F32, &[rope_rows as u64, half], bytemuck::cast_slice(&sin))?;
    w.end_segment()?;

    let blocks = (0..cfg.n_layers)
        .map(|l| {
            let b = &ids[1 + 9 * l..1 + 9 * (l + 1)];
            BlockTensors {
                attn_norm: b[0],
                q: b[1],
                k: b[2],
                v: b[3],
                attn_out: b[4],
                ff_norm: b[5],
                ff_proj: b[6],
                up_proj: b[7],
                ff_out: b[8],
            }
        })
        .collect();
    let n = ids.len();
    let net = NetworkTensors { embedding: ids[0], blocks, final_norm: ids[n - 2], head: ids[n - 1], rope_cos, rope_sin };
    let net_opts = NetworkOptions { input_emb_norm: cfg.input_emb_norm, scale_logits: cfg.scale_logits };
    let mut graphs = Vec::new();
    for &rows in &buckets {
        let mut g = lower::full_sequence_graph(&model, &net, net_opts, rows, opts.head_rows.min(rows));
        memory::plan(&mut g, target.window_align);
        if g.window_bytes > target.window_bytes {
            return Err(Error::Options(format!(
                "graph '{}' needs a {} MiB window but target '{}' offers {} MiB; lower --max-seq or --head-rows",
                g.name,
                g.window_bytes >> 20,
                target.name,
                target.window_bytes >> 20
            )));
        }
        graphs.push(g);
    }
    let header = Header {
        model,
        special,
        tokenizer: tok_spec,
        tensors: Vec::new(),
        segments: Vec::new(),
        plan: Plan { exact: (0..graphs.len() as u32).collect() },
        graphs,
        compile: CompileInfo {
            compiler: format!("lladac {}", env!("CARGO_PKG_VERSION")),
            source: dir.display().to_string(),
            target: target.name.clone(),
            options: vec![
                ("dtype".into(), dtype.name().into()),
                ("max_seq".into(), max_seq.to_string()),
                ("head_rows".into(), opts.head_rows.to_string()),
            ],
        },
        extensions: Vec::new(),
    };
    let n_graphs = header.graphs.len();
    let bytes = w.finish(header)?;
    Ok(CompileSummary { output: opts.output.clone(), bytes, tensors: n + 2, graphs: n_graphs, dtype, max_seq, warnings })
}

/// Rotary tables `[rows, head_dim / 2]`, computed as LLaDA's reference does in float32:
/// `inv_freq = 1 / theta^(2i / head_dim)`, angle = position * inv_freq (rounded to f32), then
/// cos and sin of that angle, correctly rounded.
pub fn rope_tables(theta: f64, head_dim: usize, rows: usize) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|i| 1.0f32 / (theta as f32).powf((2 * i) as f32 / head_dim as f32)).collect();
    let mut cos = Vec::with_capacity(rows * half);
    let mut sin = Vec::with_capacity(rows * half);
    for p in 0..rows {
        for &f in &inv_freq {
            let angle = (p as f32 * f) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}
