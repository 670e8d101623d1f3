//! `llada-rt bench`: where a forward pass spends its time, and how close each part runs to the
//! machine's roofline (`max(bytes / bandwidth, flops / peak)`, with bandwidth and peaks
//! measured in the same run by [`crate::roofline`]).

use std::collections::BTreeMap;

use llada_ir::{Op, Rows};
use serde::Serialize;

use llada_rt::error::Result;
use crate::roofline::Roofline;
use llada_rt::session::Session;
use llada_rt::Model;

/// One GEMM shape at one row count (the median over the layers that share it).
#[derive(Debug, Clone, Serialize)]
pub struct GemmTiming {
    pub weight: String,
    pub format: String,
    pub n: usize,
    pub k: usize,
    pub rows: usize,
    /// How many ops of the pass have this shape.
    pub count: usize,
    pub seconds: f64,
    pub flops_per_second: f64,
    pub bytes_per_second: f64,
    pub bound_seconds: f64,
    /// `seconds / bound_seconds`: 1.0 is the roofline.
    pub ratio: f64,
}

/// DiffusionGemma's encoder pass over a prompt (timed once).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct EncoderPass {
    pub prompt_rows: usize,
    pub seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct PassTiming {
    pub rows: usize,
    pub graph: String,
    pub graph_rows: u32,
    pub logit_rows: usize,
    /// DiffusionGemma: the encoder pass over the prompt before the timed decoder passes
    /// (`rows` is then the canvas's).
    pub encoder: Option<EncoderPass>,
    /// Wall time of the pass (median of the repeats).
    pub seconds: f64,
    /// Sum of every op's roofline bound.
    pub bound_seconds: f64,
    pub ratio: f64,
    /// Seconds per op kind (median pass).
    pub by_op: BTreeMap<String, f64>,
    pub gemms: Vec<GemmTiming>,
    /// Weight bytes the median pass staged into slots, the time it waited for them, and
    /// the share of the copies' time hidden behind compute.
    pub staged_bytes: u64,
    pub stall_seconds: f64,
    pub overlap: f64,
}

/// `n` made-up token ids spread over `model`'s vocabulary (`i * stride + offset`), none of
/// them the mask token: a prompt the sampler accepts.
pub fn spread_tokens(model: &Model, n: usize, stride: usize, offset: usize) -> Vec<u32> {
    let m = &model.header.model;
    let vocab = m.vocab_size.min(m.embedding_size) as usize;
    let mask = model.header.special.mask as usize;
    (0..n).map(|i| (i * stride + offset) % vocab).map(|t| if t == mask { (t + 1) % vocab } else { t } as u32).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times the exact-plan pass serving `rows` tokens, `repeat` times after one warm-up; on a
/// DiffusionGemma model, its decoder pass after an encoder pass of `rows` prompt tokens
/// ([`denoise_pass`]).
pub fn pass(session: &mut Session, roof: &Roofline, rows: usize, logit_rows: usize, repeat: usize) -> Result<PassTiming> {
    if session.model.diffusion_gemma().is_some() {
        return denoise_pass(session, roof, rows, repeat);
    }
    let seq = spread_tokens(&session.model, rows, 7919, 11);
    let logit_positions: Vec<u32> = (rows - logit_rows..rows).map(|r| r as u32).collect();
    session.forward_full(&seq, &logit_positions)?;
    let mut runs = Vec::new();
    for _ in 0..repeat.max(1) {
        let start = std::time::Instant::now();
        let (gid, profile) = session.forward_full_profiled(&seq, &logit_positions)?;
        runs.push(Run { seconds: start.elapsed().as_secs_f64(), graph: gid, profile, staging: session.last_pass_staging() });
    }
    Ok(timing(session, roof, rows, logit_rows, runs, None))
}

/// DiffusionGemma's decoder pass over a canvas (the decoder graph's rows, every one with
/// logits and a self-conditioning input) after an encoder pass of a `prompt_rows` prompt,
/// `repeat` times after one warm-up (the decoder stores nothing the next one reads). The
/// encoder pass is timed once, whole.
pub fn denoise_pass(session: &mut Session, roof: &Roofline, prompt_rows: usize, repeat: usize) -> Result<PassTiming> {
    let model = session.model.clone();
    let section = model.diffusion_gemma().expect("a DiffusionGemma model");
    let canvas = section.decoder_graphs.last().map_or(0, |&g| model.graph(g).logit_rows as usize);
    let m = &model.header.model;
    let width = m.embedding_size as usize;
    let prompt = spread_tokens(&model, prompt_rows, 7919, 11);
    let tokens = spread_tokens(&model, canvas, 104_729, 7);
    // Logits of the scale a soft-capped model gives (|z| < 30), spread over the vocabulary.
    let soft: Vec<f32> = (0..canvas * width).map(|i| ((i * 2_654_435_761) % 6007) as f32 / 6007.0 * 40.0 - 20.0).collect();
    let start = std::time::Instant::now();
    session.encode(&prompt, 0..prompt_rows)?;
    let encoder = EncoderPass { prompt_rows, seconds: start.elapsed().as_secs_f64() };
    session.denoise(prompt_rows, &tokens, Some(&soft))?;
    let mut runs = Vec::new();
    for _ in 0..repeat.max(1) {
        let start = std::time::Instant::now();
        let (gid, profile) = session.denoise_profiled(prompt_rows, &tokens, Some(&soft))?;
        runs.push(Run { seconds: start.elapsed().as_secs_f64(), graph: gid, profile, staging: session.last_pass_staging() });
    }
    Ok(timing(session, roof, canvas, canvas, runs, Some(encoder)))
}

/// One timed pass.
struct Run {
    seconds: f64,
    graph: u32,
    profile: llada_rt::executor::OpProfile,
    staging: llada_rt::staging::PassStaging,
}

/// The median of `runs` (passes of `rows` token rows, `logit_rows` of them with logits),
/// op by op against the roofline.
fn timing(session: &Session, roof: &Roofline, rows: usize, logit_rows: usize, mut runs: Vec<Run>, encoder: Option<EncoderPass>) -> PassTiming {
    let model = session.model.clone();
    let m = &model.header.model;
    let threads = session.threads();
    let (peak_f32, bw) = (roof.peak_for(llada_ir::DType::PanelF32, threads), roof.bandwidth(threads));
    // The arithmetic a weight format runs at: bf16 weights multiply f32 activations unless
    // the artifact asks for bf16 ones.
    let peak = |dtype: llada_ir::DType| match dtype {
        llada_ir::DType::PanelBf16 if !model.header.plan.bf16_activations => peak_f32,
        d => roof.peak_for(d, threads),
    };
    runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let Run { seconds, graph: gid, profile, staging } = runs.swap_remove(runs.len() / 2);
    let g = model.graph(gid);
    let rows_of = |rows: Rows| match rows {
        Rows::Tokens => g.rows as usize,
        Rows::Logits => logit_rows,
    };
    let mut by_op: BTreeMap<String, f64> = BTreeMap::new();
    let mut gemm_groups: BTreeMap<(String, usize, usize, usize), Vec<f64>> = BTreeMap::new();
    let mut gemm_names: BTreeMap<(String, usize, usize, usize), String> = BTreeMap::new();
    let mut bound = 0.0;
    for &(index, t) in &profile.times {
        let op = &g.ops[index];
        *by_op.entry(op.name().to_string()).or_default() += t;
        let value = |v: u32| &g.values[v as usize];
        let bytes_of = |v: u32| (rows_of(value(v).rows) * value(v).cols as usize * 4) as f64;
        match *op {
            Op::MatMul { x, weight, .. } => {
                let info = &model.header.tensors[weight as usize];
                let (n, k, r) = (info.shape[0] as usize, info.shape[1] as usize, rows_of(value(x).rows));
                let key = (info.dtype.name(), n, k, r);
                gemm_groups.entry(key.clone()).or_default().push(t);
                gemm_names.entry(key).or_insert_with(|| info.name.clone());
                let flops = 2.0 * (r * n * k) as f64;
                let bytes = info.nbytes as f64 + (r * (n + k) * 4) as f64;
                bound += (bytes / bw).max(flops / peak(info.dtype));
            }
            Op::Attention { qkv, out, heads, .. } => {
                let flops = 4.0 * (g.rows as usize * g.rows as usize * m.head_dim as usize * heads as usize) as f64;
                bound += ((bytes_of(qkv) + bytes_of(out)) / bw).max(flops / peak_f32);
            }
            _ => {
                let bytes: f64 = op.inputs().iter().chain(op.outputs().iter()).map(|&v| bytes_of(v)).sum();
                bound += bytes / bw;
            }
        }
    }
    let gemms = gemm_groups
        .into_iter()
        .map(|((format, n, k, rows), times)| {
            let count = times.len();
            let seconds = median(times);
            let name = gemm_names[&(format.clone(), n, k, rows)].clone();
            let weight_bytes = model.header.tensors.iter().find(|t| t.name == name).map_or(0, |t| t.nbytes) as f64;
            let flops = 2.0 * (rows * n * k) as f64;
            let bytes = weight_bytes + (rows * (n + k) * 4) as f64;
            let dtype = model.header.tensors.iter().find(|t| t.name == name).map(|t| t.dtype).unwrap_or(llada_ir::DType::PanelF32);
            let bound_seconds = (bytes / bw).max(flops / peak(dtype));
            GemmTiming {
                weight: name,
                format,
                n,
                k,
                rows,
                count,
                seconds,
                flops_per_second: flops / seconds,
                bytes_per_second: bytes / seconds,
                bound_seconds,
                ratio: seconds / bound_seconds,
            }
        })
        .collect();
    PassTiming {
        rows,
        graph: g.name.clone(),
        graph_rows: g.rows,
        logit_rows,
        encoder,
        seconds,
        bound_seconds: bound,
        ratio: seconds / bound,
        by_op,
        gemms,
        staged_bytes: staging.staged_bytes,
        stall_seconds: staging.stall_seconds,
        overlap: staging.overlap(),
    }
}
