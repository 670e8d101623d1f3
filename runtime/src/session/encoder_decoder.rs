//! DiffusionGemma's two kinds of pass over one set of layers: the encoder's, causal, storing
//! a sequence's keys and values (the prompt, then each finished canvas), and the decoder's, a
//! canvas attending to what the encoder stored and to itself, with the previous step's
//! logits as its self-conditioning input. The decoder's rows store their keys and values at
//! the canvas's positions too (its graph is the encoder's layers); the encoder's pass over the
//! finished canvas overwrites them before anything reads them as the past.

use llada_ir::diffusion_gemma::DiffusionGemmaSection;

use super::{check_tokens, Session};
use crate::error::{Error, Result};
use crate::executor::OpProfile;

impl Session {
    fn diffusion_gemma_section(&self) -> Result<&DiffusionGemmaSection> {
        self.model.diffusion_gemma().ok_or_else(|| Error::request(format!("{} is a {} model: encoder and decoder passes are DiffusionGemma's", self.model.path.display(), self.model.header.model.architecture)))
    }

    /// The encoder over positions `span` of `seq`: each row stores its keys and values and
    /// attends causally (sliding-window layers: to the last window of positions). Every
    /// position before `span` must be encoded already (`span.start` at most what earlier
    /// encoder passes stored, contiguously from 0). A span longer than the largest encoder
    /// graph runs as several passes.
    pub fn encode(&mut self, seq: &[u32], span: std::ops::Range<usize>) -> Result<()> {
        let graphs = self.diffusion_gemma_section()?.encoder_graphs.clone();
        if span.start >= span.end || span.end > seq.len() || span.start > self.encoded || span.end > self.model.header.plan.kv_capacity as usize {
            return Err(Error::request(format!(
                "an encoder pass over positions {span:?} of a {}-token sequence needs them inside it, within the {} positions of the cache, after the {} encoded",
                seq.len(),
                self.model.header.plan.kv_capacity,
                self.encoded
            )));
        }
        check_tokens(&self.model, &seq[span.clone()])?;
        self.cached_len = None;
        self.block_prefix = 0;
        let largest = graphs.last().map_or(0, |&g| self.model.graph(g).rows as usize);
        let mut start = span.start;
        while start < span.end {
            let end = span.end.min(start + largest);
            let gid = *graphs.iter().find(|&&g| self.model.graph(g).rows as usize >= end - start).expect("a chunk fits the largest graph");
            self.tokens.clear();
            self.tokens.extend_from_slice(&seq[start..end]);
            self.positions.clear();
            self.positions.extend(start as u32..end as u32);
            self.logit_rows.clear();
            self.pad(gid);
            self.soft_rows = 0;
            // Causal: blocks of one row, each seeing the positions up to its own.
            let run = self.run_pass(gid, end - start, end, 0, end - start, Some(1), false);
            if let Err(e) = run {
                self.encoded = 0;
                return Err(e);
            }
            self.encoded = end;
            start = end;
        }
        Ok(())
    }

    /// The decoder over a canvas: `tokens` at positions from `start` (every position before
    /// it encoded), with `soft`, the previous step's logits (`[tokens, embedding_size]`;
    /// `None` on a canvas's first step). Returns the logits of every canvas position,
    /// `[tokens, embedding_size]`.
    pub fn denoise(&mut self, start: usize, tokens: &[u32], soft: Option<&[f32]>) -> Result<&[f32]> {
        let (gid, _) = self.decoder_pass(start, tokens, soft, false)?;
        Ok(self.logits(gid, tokens.len()))
    }

    /// [`Session::denoise`] timed op by op (for `llada-rt bench`): the decoder graph and its
    /// ops' times.
    pub fn denoise_profiled(&mut self, start: usize, tokens: &[u32], soft: Option<&[f32]>) -> Result<(u32, OpProfile)> {
        let (gid, profile) = self.decoder_pass(start, tokens, soft, true)?;
        Ok((gid, profile.unwrap_or_default()))
    }

    fn decoder_pass(&mut self, start: usize, tokens: &[u32], soft: Option<&[f32]>, profiled: bool) -> Result<(u32, Option<OpProfile>)> {
        let graphs = &self.diffusion_gemma_section()?.decoder_graphs;
        let n = tokens.len();
        let gid = graphs.iter().copied().find(|&g| self.model.graph(g).logit_rows as usize >= n);
        let capacity = self.model.header.plan.kv_capacity as usize;
        let Some(gid) = gid.filter(|_| n > 0 && start == self.encoded && start + n <= capacity) else {
            return Err(Error::request(format!(
                "a canvas of {n} tokens at position {start} needs a decoder graph of as many rows (the largest holds {}), every position before it encoded ({} are) and room in the {capacity} positions of the cache",
                graphs.last().map_or(0, |&g| self.model.graph(g).logit_rows),
                self.encoded
            )));
        };
        let width = self.model.header.model.embedding_size as usize;
        if let Some(s) = soft.filter(|s| s.len() != n * width) {
            return Err(Error::request(format!("the self-conditioning input has {} values; a canvas of {n} needs {n} x {width}", s.len())));
        }
        check_tokens(&self.model, tokens)?;
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
        self.positions.clear();
        self.positions.extend(start as u32..(start + n) as u32);
        self.logit_rows.clear();
        self.logit_rows.extend(0..n as u32);
        self.pad(gid);
        self.soft.clear();
        self.soft.extend_from_slice(soft.unwrap_or(&[]));
        self.soft_rows = if soft.is_some() { n } else { 0 };
        let run = self.run_pass(gid, n, start + n, n, n, None, profiled);
        self.soft_rows = 0;
        match run {
            Ok(profile) => Ok((gid, profile)),
            Err(e) => {
                self.encoded = 0;
                Err(e)
            }
        }
    }
}
