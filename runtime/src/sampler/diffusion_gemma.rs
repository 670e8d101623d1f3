//! DiffusionGemma's published `generate` (transformers 5.23's `generation_diffusion_gemma.py`)
//! as a policy: canvases one after another, each encoded into the cache once finished. A
//! canvas starts as uniform noise; each of up to `steps` denoising steps runs the decoder over
//! it with the previous step's logits as self-conditioning, and the uniform-noise sampler
//! (`uniform_noise.rs`) accepts the positions it is sure of and renoises the rest, until the
//! steps run out or the stopping rule fires. The canvas's output is the last step's argmax
//! canvas; one holding an end-of-sequence id ends the generation (its tokens after the first
//! such id become the pad id). The output is whole canvases, not cut at `gen_length`.
//!
//! A generator step is one denoising step (preceded, at a canvas's start, by the encoder pass
//! over what came before it). The canvas shown between steps is the one the decoder reads next:
//! accepted tokens among fresh noise; its reveals are the positions a step accepted.

use super::ask::{Ask, PassRequest};
use super::canvas::{out_of_turn, Canvas, PolicyStep};
use super::fast_random::FastStream;
use super::torch_random::TorchGenerator;
use super::uniform_noise::{RowArithmetic, UniformNoiseConfig, UniformNoiseSampler};
use super::{Generation, Rng, SamplerParams};
use crate::error::Result;
use llada_ir::diffusion_gemma::DiffusionGemmaSection;

/// The random stream a generation draws from.
enum Noise {
    Torch(Box<TorchGenerator>),
    Fast(FastStream),
}

/// Where the policy is within a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The canvas's context must be encoded first (the prompt, or the canvas before).
    Encode,
    /// The decoder pass of this step is next.
    Denoise,
    /// Its logits came back: the step is over.
    Stepped,
}

pub(crate) struct DiffusionGemma {
    prompt_len: usize,
    canvas_len: usize,
    canvases: usize,
    steps: u32,
    eos: Vec<u32>,
    pad: Option<u32>,
    sampler: UniformNoiseSampler,
    noise: Noise,
    /// The canvas being denoised, its number, and the step it is at (counting down).
    canvas: usize,
    cur_step: u32,
    current: Vec<u32>,
    /// Whether the next decoder pass has the previous step's logits (not at a canvas's start).
    self_conditioned: bool,
    phase: Phase,
    /// The step after this one begins a canvas: with the encoder pass.
    encode_next: bool,
    steps_per_canvas: Vec<u32>,
}

impl DiffusionGemma {
    /// The policy of a generation of `gen_length` tokens after a `prompt_len` prompt, in
    /// canvases of `block_length`.
    pub(crate) fn new(p: &SamplerParams, section: &DiffusionGemmaSection, prompt_len: usize, pad: Option<u32>) -> DiffusionGemma {
        let canvas_len = p.block_length;
        let temperature = match (p.t_min, p.t_max) {
            (Some(lo), Some(hi)) => Some((lo, hi)),
            _ => None,
        };
        let stopping = match (p.stability_threshold, p.confidence_threshold) {
            (Some(s), Some(c)) => Some((s, c)),
            _ => None,
        };
        // Reproducing the published generation needs PyTorch's stream and its arithmetic;
        // without its stream, its arithmetic's bits buy nothing.
        let arithmetic = match p.rng {
            Rng::Torch => RowArithmetic::Torch,
            Rng::Fast => RowArithmetic::Fast,
        };
        let config = UniformNoiseConfig { vocab: section.vocab_size as usize, canvas: canvas_len, steps: p.steps as u32, temperature, entropy_bound: p.entropy_bound, stopping, arithmetic };
        let noise = match p.rng {
            Rng::Torch => Noise::Torch(Box::new(TorchGenerator::manual_seed(p.seed))),
            Rng::Fast => Noise::Fast(FastStream { seed: p.seed }),
        };
        let canvases = p.gen_length.div_ceil(canvas_len);
        DiffusionGemma {
            prompt_len,
            canvas_len,
            canvases,
            steps: p.steps as u32,
            eos: p.eos_ids.as_slice().to_vec(),
            pad,
            sampler: UniformNoiseSampler::new(config),
            noise,
            canvas: 0,
            cur_step: p.steps as u32,
            current: Vec::new(),
            self_conditioned: false,
            phase: Phase::Encode,
            encode_next: false,
            steps_per_canvas: Vec::with_capacity(canvases),
        }
    }

    /// Positions the generation covers: whole canvases.
    pub(crate) fn generated_len(&self) -> usize {
        self.canvases * self.canvas_len
    }

    fn canvas_start(&self) -> usize {
        self.prompt_len + self.canvas * self.canvas_len
    }

    /// A fresh canvas of noise (the published `initialize_canvas`, drawn after the encoder).
    fn start_canvas(&mut self) {
        let block = self.canvas as u32;
        self.current = match &mut self.noise {
            Noise::Torch(t) => self.sampler.start_block(block, t.as_mut()),
            Noise::Fast(f) => self.sampler.start_block(block, f),
        };
        self.cur_step = self.steps;
        self.self_conditioned = false;
        self.steps_per_canvas.push(0);
    }

    /// The canvas ends with its argmax: written into the sequence, cut after an
    /// end-of-sequence id (which ends the generation), the next canvas encoded first.
    fn finish_canvas(&mut self, c: &mut Canvas, argmax: &[u32]) {
        let start = self.canvas_start();
        let out = &mut c.x[start..start + self.canvas_len];
        out.copy_from_slice(argmax);
        let first_eos = out.iter().position(|t| self.eos.contains(t));
        if let Some(i) = first_eos {
            if let Some(pad) = self.pad {
                out[i + 1..].fill(pad);
            }
            c.output_end = Some(start + self.canvas_len);
        }
        self.canvas += 1;
        c.settled = self.canvas * self.canvas_len;
        if first_eos.is_some() || self.canvas == self.canvases {
            c.done = true;
        } else {
            // The next step begins with the encoder pass over this canvas.
            self.encode_next = true;
        }
    }
}

impl PolicyStep for DiffusionGemma {
    fn next<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        match self.phase {
            Phase::Encode => {
                // The prompt, or the canvas just finished, into the cache.
                let start = self.canvas_start();
                let from = if self.canvas == 0 { 0 } else { start - self.canvas_len };
                self.start_canvas();
                self.phase = Phase::Denoise;
                Ok(Ask::Encode { seq: &c.x[..start], span: from..start })
            }
            Phase::Denoise => {
                self.phase = Phase::Stepped;
                let soft = self.self_conditioned.then(|| self.sampler.processed_logits());
                Ok(Ask::Pass(PassRequest::Canvas { start: self.canvas_start(), tokens: &self.current, soft }))
            }
            Phase::Stepped => {
                self.phase = if std::mem::take(&mut self.encode_next) { Phase::Encode } else { Phase::Denoise };
                Ok(Ask::Done)
            }
        }
    }

    fn logits(&mut self, c: &mut Canvas, logits: &[f32]) -> Result<()> {
        if self.phase != Phase::Stepped {
            return Err(out_of_turn());
        }
        let block = self.canvas as u32;
        let outcome = match &mut self.noise {
            Noise::Torch(t) => self.sampler.step(logits, block, self.cur_step, t.as_mut()),
            Noise::Fast(f) => self.sampler.step(logits, block, self.cur_step, f),
        };
        if let Some(n) = self.steps_per_canvas.last_mut() {
            *n += 1;
        }
        let start = self.canvas_start();
        for (i, (&accepted, &token)) in outcome.accepted.iter().zip(&outcome.canvas).enumerate() {
            if accepted {
                c.reveals.push([(start - self.prompt_len + i) as u32, token]);
            }
        }
        self.cur_step -= 1;
        self.self_conditioned = true;
        if outcome.stop || self.cur_step == 0 {
            self.finish_canvas(c, &outcome.argmax);
        } else {
            c.x[start..start + self.canvas_len].copy_from_slice(&outcome.canvas);
            self.current = outcome.canvas;
        }
        Ok(())
    }

    fn report(&mut self, g: &mut Generation) {
        g.denoising_steps_per_canvas = Some(self.steps_per_canvas.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EOS in a canvas: the tokens after the first one become the pad id, the output ends
    /// with that canvas, and the generation is done.
    #[test]
    fn an_end_of_sequence_id_ends_the_generation_after_its_canvas() {
        let section = DiffusionGemmaSection { canvas_length: 4, vocab_size: 16, ..Default::default() };
        let p = SamplerParams { gen_length: 12, block_length: 4, steps: 2, eos_ids: super::super::EosIds::new(&[9]).unwrap(), ..SamplerParams::default() };
        let mut policy = DiffusionGemma::new(&p, &section, 2, Some(0));
        let mut c = Canvas::new(&SamplerParams { gen_length: policy.generated_len(), ..p }, 2, &[5, 6], llada_ir::SpecialTokens { mask: 0, bos: None, eos: None, eot: None }, super::super::Predictor::new(16, 4, crate::pool::Pool::new(1, "t").unwrap()), 0);
        c.own_schedule = true;
        policy.finish_canvas(&mut c, &[3, 9, 4, 9]);
        assert_eq!(&c.x[2..6], &[3, 9, 0, 0]);
        assert_eq!((c.output_end, c.done), (Some(6), true));
    }
}
