//! DiffusionGemma's section (`model.diffusion_gemma`): what its sampler needs besides the
//! graphs. Its network runs twice over the same layers: a causal encoder that stores a
//! sequence's keys and values in the cache (the prompt, then each finished canvas), and a
//! decoder that denoises a canvas against them without changing what came before. Both are
//! graphs of the core section; this section says which is which, and carries the
//! checkpoint's generation defaults.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::graph::Op;
use crate::header::{Extension, Family, Header};

/// The section's kind.
pub const EXTENSION_KEY: &str = "model.diffusion_gemma";
/// Its version: the postcard schema of [`DiffusionGemmaSection`].
pub const SECTION_VERSION: u32 = 1;

/// The published `generation_config.json`'s values (`None` where it has `null`, which turns
/// that part of the sampler off, as in the published code).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct GenerationDefaults {
    pub max_new_tokens: u32,
    pub max_denoising_steps: u32,
    pub t_min: Option<f64>,
    pub t_max: Option<f64>,
    pub entropy_bound: f64,
    pub stability_threshold: Option<u32>,
    pub confidence_threshold: Option<f64>,
    pub eos_ids: Vec<u32>,
    pub pad_id: Option<u32>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct DiffusionGemmaSection {
    /// Positions of a canvas (`canvas_length`): the decoder's rows.
    pub canvas_length: u32,
    /// Token ids a fresh canvas draws from, `0..vocab_size` (the text config's vocabulary).
    pub vocab_size: u32,
    /// The encoder's graphs, by increasing rows: causal, they store every row's keys and
    /// values and compute no logits that the sampler reads.
    pub encoder_graphs: Vec<u32>,
    /// The decoder's graphs, by increasing rows: a canvas over the cache, with the
    /// self-conditioning input, logits for every row.
    pub decoder_graphs: Vec<u32>,
    pub generation: GenerationDefaults,
}

impl DiffusionGemmaSection {
    pub fn extension(&self) -> Extension {
        Extension { key: EXTENSION_KEY.into(), version: SECTION_VERSION, required: true, bytes: postcard::to_stdvec(self).expect("section encodes") }
    }

    /// `h`'s section, checked against its graphs, or `None` for another family (which must
    /// not carry one).
    pub fn of(h: &Header) -> Result<Option<DiffusionGemmaSection>> {
        let found = h.extensions.iter().find(|e| e.key == EXTENSION_KEY);
        let dg = h.model.family() == Family::DiffusionGemma;
        let e = match (found, dg) {
            (None, false) => return Ok(None),
            (Some(_), false) => return Err(Error::invalid(format!("section '{EXTENSION_KEY}' in an artifact of architecture '{}'", h.model.architecture))),
            (None, true) => return Err(Error::invalid(format!("a DiffusionGemma artifact without its '{EXTENSION_KEY}' section"))),
            (Some(e), true) => e,
        };
        let s: DiffusionGemmaSection = postcard::from_bytes(&e.bytes).map_err(|err| Error::invalid(format!("section '{EXTENSION_KEY}': cannot decode it: {err}")))?;
        s.check(h)?;
        Ok(Some(s))
    }

    /// Graphs exist, ascend in rows, and each list holds what its role needs: the decoder's a
    /// soft input, the encoder's none; a canvas fits a decoder graph; the vocabulary fits the
    /// logits. Errors name the field.
    fn check(&self, h: &Header) -> Result<()> {
        let bad = |m: String| Err(Error::invalid(format!("section '{EXTENSION_KEY}': {m}")));
        for (field, ids, decoder) in [("encoder_graphs", &self.encoder_graphs, false), ("decoder_graphs", &self.decoder_graphs, true)] {
            if ids.is_empty() {
                return bad(format!("{field} is empty"));
            }
            let mut last = 0;
            for &id in ids {
                let Some(g) = h.graphs.get(id as usize) else { return bad(format!("{field} names graph {id}, of {}", h.graphs.len())) };
                if g.rows <= last {
                    return bad(format!("{field}: graph {id} '{}' does not have more rows than the one before it", g.name));
                }
                last = g.rows;
                let soft = g.ops.iter().any(|op| matches!(op, Op::SoftEmbed { .. }));
                if soft != decoder {
                    return bad(format!("{field}: graph {id} '{}' {} a self-conditioning input", g.name, if soft { "has" } else { "lacks" }));
                }
            }
        }
        let largest = self.decoder_graphs.last().and_then(|&g| h.graphs.get(g as usize)).map_or(0, |g| g.logit_rows);
        if self.canvas_length == 0 || self.canvas_length > largest {
            return bad(format!("canvas_length {} is not between 1 and the largest decoder graph's {largest} logit rows", self.canvas_length));
        }
        if self.vocab_size == 0 || self.vocab_size > h.model.embedding_size {
            return bad(format!("vocab_size {} is not between 1 and the logits' width {}", self.vocab_size, h.model.embedding_size));
        }
        let g = &self.generation;
        if g.max_denoising_steps == 0 || g.max_new_tokens == 0 || !(g.entropy_bound.is_finite() && g.entropy_bound > 0.0) {
            return bad(format!("generation: max_new_tokens {}, max_denoising_steps {} and entropy_bound {} must be above 0", g.max_new_tokens, g.max_denoising_steps, g.entropy_bound));
        }
        Ok(())
    }
}
