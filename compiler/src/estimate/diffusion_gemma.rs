//! DiffusionGemma's published `generate` as the estimate's passes: the prompt through the
//! encoder, then each canvas through the decoder once a denoising step, the sampler's step on
//! the CPU after each, and each finished canvas but the last through the encoder.

use llada_ir::diffusion_gemma::DiffusionGemmaSection;
use llada_ir::{Graph, Header};
use llada_targets::cost::{self, Engine, Machine, OpWork};

use super::EstimateRequest;
use crate::error::{Error, Result};

/// Refuses settings the published generate cannot have: a canvas other than the plan's (the
/// decoder graph is static), no steps, or measured passes outside one a canvas to `--steps`
/// a canvas.
pub(super) fn check_settings(req: &EstimateRequest, dg: &DiffusionGemmaSection) -> Result<()> {
    let canvases = req.gen_len.div_ceil(req.block_len.max(1));
    if req.policy != "exact" {
        return Err(Error::Options(format!("--policy {}: a DiffusionGemma estimate is of its published generate (--policy exact)", req.policy)));
    }
    if req.block_len != dg.canvas_length {
        return Err(Error::Options(format!("--block-len {}: DiffusionGemma's decoder runs on the plan's canvas of {} positions", req.block_len, dg.canvas_length)));
    }
    if req.gen_len == 0 || req.steps == 0 {
        return Err(Error::Options(format!("--gen-len {} --steps {}: both must be above 0", req.gen_len, req.steps)));
    }
    if let Some(n) = req.passes.filter(|&n| n < canvases || n > canvases * req.steps) {
        return Err(Error::Options(format!(
            "--passes {n}: {canvases} canvas(es) take 1 to --steps ({}) decoder passes each (`llada-rt run --json`'s denoising_steps_per_canvas, summed)",
            req.steps
        )));
    }
    Ok(())
}

/// The passes as `(rows, context, logit rows, count)`: encoder passes have no logits,
/// decoder passes the canvas's (see [`graph_for`]). Decoder passes per canvas: `--steps`, or
/// `--passes` (measured: adaptive stopping ends canvases early) spread over the canvases.
pub(super) fn schedule(req: &EstimateRequest, largest_encoder_rows: u32) -> Vec<(u32, u32, u32, u32)> {
    let (p, c) = (req.prompt_len, req.block_len);
    let canvases = req.gen_len.div_ceil(c);
    let steps: Vec<u32> = match req.passes {
        Some(n) => (0..canvases).map(|k| n / canvases + u32::from(k < n % canvases)).collect(),
        None => vec![req.steps; canvases as usize],
    };
    let mut v = Vec::new();
    let encode = |from: u32, to: u32, v: &mut Vec<(u32, u32, u32, u32)>| {
        let mut start = from;
        while start < to {
            let end = to.min(start + largest_encoder_rows.max(1));
            v.push((end - start, end, 0, 1));
            start = end;
        }
    };
    encode(0, p, &mut v);
    for (k, &n) in steps.iter().enumerate() {
        let end = p + (k as u32 + 1) * c;
        v.push((c, end, c, n));
        if k + 1 < steps.len() {
            encode(end - c, end, &mut v);
        }
    }
    v
}

/// The graph a pass runs: a pass with logits is the decoder's (the smallest holding its
/// rows), one without the encoder's.
pub(super) fn graph_for<'h>(h: &'h Header, dg: &DiffusionGemmaSection, rows: u32, logit_rows: u32) -> Result<&'h Graph> {
    let (graphs, what) = if logit_rows > 0 { (&dg.decoder_graphs, "decoder") } else { (&dg.encoder_graphs, "encoder") };
    graphs
        .iter()
        .map(|&g| &h.graphs[g as usize])
        .find(|g| g.rows >= rows)
        .ok_or_else(|| Error::Options(format!("no {what} graph of the plan holds {rows} rows (the largest has {})", graphs.iter().map(|&g| h.graphs[g as usize].rows).max().unwrap_or(0))))
}

/// The sampler's step after a decoder pass, on the CPU (`--rng fast`'s arithmetic): over
/// the canvas's logits, `[canvas, vocab]` floats, the temperature's division, one
/// exponential an entry (weights and entropy), the row's maximum, and the sample's two
/// walks over its weights; memory-bound on a phone's cores.
pub(super) fn sampler_seconds(cpu: &Machine, dg: &DiffusionGemmaSection) -> f64 {
    let entries = dg.canvas_length as f64 * dg.vocab_size as f64;
    // Read the logits, write the processed logits and the weights, read the weights twice.
    let work = OpWork { bytes: entries * 4.0 * 5.0, ops: entries * 20.0, engine: Engine::F32 };
    cost::pass_estimate(cpu, &[work], 0, true).seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(prompt_len: u32, gen_len: u32, steps: u32, passes: Option<u32>) -> EstimateRequest {
        EstimateRequest {
            policy: "exact".into(),
            prompt_len,
            gen_len,
            block_len: 256,
            steps,
            rows: vec![],
            context: None,
            npu_limits: Default::default(),
            rows_given: true,
            generation_given: true,
            rates: None,
            passes,
            on_target: None,
        }
    }

    #[test]
    fn canvases_follow_the_prompt_and_each_is_encoded_but_the_last() {
        // Prompt 40, two canvases of 256, 48 steps each, encoder graphs up to 256 rows.
        let v = schedule(&request(40, 300, 48, None), 256);
        assert_eq!(v, vec![(40, 40, 0, 1), (256, 296, 256, 48), (256, 296, 0, 1), (256, 552, 256, 48)]);
        // A prompt longer than the largest encoder graph runs in chunks; measured passes
        // spread over the canvases.
        let v = schedule(&request(600, 512, 48, Some(31)), 256);
        assert_eq!(v, vec![(256, 256, 0, 1), (256, 512, 0, 1), (88, 600, 0, 1), (256, 856, 256, 16), (256, 856, 0, 1), (256, 1112, 256, 15)]);
    }

    #[test]
    fn settings_outside_the_published_generate_are_refused() {
        let dg = DiffusionGemmaSection { canvas_length: 256, vocab_size: 1000, ..Default::default() };
        assert!(check_settings(&request(32, 300, 48, Some(96)), &dg).is_ok());
        let e = check_settings(&request(32, 300, 48, Some(97)), &dg).unwrap_err().to_string();
        assert!(e.contains("--passes 97"), "{e}");
        let e = check_settings(&EstimateRequest { block_len: 32, ..request(32, 300, 48, None) }, &dg).unwrap_err().to_string();
        assert!(e.contains("--block-len 32") && e.contains("256"), "{e}");
        let e = check_settings(&EstimateRequest { policy: "dual".into(), ..request(32, 300, 48, None) }, &dg).unwrap_err().to_string();
        assert!(e.contains("--policy dual"), "{e}");
    }
}
