//! `llada-rt compare`: how far one artifact's outputs are from another's compiled from the
//! same checkpoint (a quantised one against the unquantised reference): the first pass's
//! logits, the tokens a generation gives, and the time of each.

use serde::Serialize;

use llada_rt::error::{Error, Result};
use llada_rt::session::Session;
use llada_rt::{generate, SamplerParams};

/// The difference of `other` from `reference` on one prompt.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// First pass over the prompt and `gen_length` masks, logits of every masked position
    /// (DiffusionGemma: the first decoder pass, over a canvas of made-up tokens after the
    /// prompt's encoder pass, logits of every canvas position):
    /// `||other - reference|| / ||reference||` over all of them (L2).
    pub logit_relative_error: f64,
    /// Largest absolute difference, over the reference's largest absolute logit.
    pub logit_max_error: f64,
    /// Positions whose top token is the reference's, of the masked positions.
    pub top1_agreement: f64,
    /// Generated tokens equal to the reference's at the same position.
    pub token_agreement: f64,
    pub reference_seconds: f64,
    pub other_seconds: f64,
}

/// Compares `other` with `reference` on `prompt` under `p` (both sessions on their models).
pub fn compare(reference: &mut Session, other: &mut Session, prompt: &[u32], p: &SamplerParams) -> Result<Comparison> {
    let (ma, mb) = (reference.model.clone(), other.model.clone());
    let (a, b) = (&ma.header, &mb.header);
    if a.model.embedding_size != b.model.embedding_size || a.special.mask != b.special.mask {
        return Err(Error::request(format!(
            "{} and {} are not the same model (vocabulary {} and {}, mask id {} and {})",
            reference.model.path.display(),
            other.model.path.display(),
            a.model.embedding_size,
            b.model.embedding_size,
            a.special.mask,
            b.special.mask
        )));
    }
    let want = first_pass(reference, prompt, p)?;
    let got = first_pass(other, prompt, p)?;
    let got = got.as_slice();
    let vocab = a.model.embedding_size as usize;
    let (mut diff, mut norm, mut max_diff, mut max_ref) = (0f64, 0f64, 0f64, 0f64);
    for (&w, &g) in want.iter().zip(got) {
        let d = (g - w) as f64;
        diff += d * d;
        norm += (w as f64) * (w as f64);
        max_diff = max_diff.max(d.abs());
        max_ref = max_ref.max((w as f64).abs());
    }
    let top = |row: &[f32]| row.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0;
    let agree = want.chunks(vocab).zip(got.chunks(vocab)).filter(|(w, g)| top(w) == top(g)).count();
    let top1_agreement = agree as f64 / (want.len() / vocab).max(1) as f64;
    let r = generate(reference, prompt, p, &mut |_| {})?;
    let o = generate(other, prompt, p, &mut |_| {})?;
    let same = r.output_ids.iter().zip(&o.output_ids).filter(|(x, y)| x == y).count();
    Ok(Comparison {
        logit_relative_error: (diff / norm.max(f64::MIN_POSITIVE)).sqrt(),
        logit_max_error: max_diff / max_ref.max(f64::MIN_POSITIVE),
        top1_agreement,
        token_agreement: same as f64 / r.output_ids.len().max(1) as f64,
        reference_seconds: r.seconds,
        other_seconds: o.seconds,
    })
}

/// The logits `compare` measures: LLaDA's families, the pass over the prompt and
/// `gen_length` masks at the masked positions; DiffusionGemma, its first decoder pass (no
/// self-conditioning yet) over a canvas of `block_length` made-up tokens after the prompt's
/// encoder pass, at every canvas position.
fn first_pass(session: &mut Session, prompt: &[u32], p: &SamplerParams) -> Result<Vec<f32>> {
    let model = session.model.clone();
    if model.diffusion_gemma().is_some() {
        let canvas = crate::bench::spread_tokens(&model, p.block_length, 104_729, 7);
        session.encode(prompt, 0..prompt.len())?;
        return Ok(session.denoise(prompt.len(), &canvas, None)?.to_vec());
    }
    let mut seq = prompt.to_vec();
    seq.extend(std::iter::repeat_n(model.header.special.mask, p.gen_length));
    let rows: Vec<u32> = (prompt.len()..seq.len()).map(|q| q as u32).collect();
    Ok(session.forward_full(&seq, &rows)?.to_vec())
}
