//! The official sampler's step and the cached policies that keep its commit rule: `exact`,
//! `prefix`, `dual` and `spec` (see the module documentation of `sampler`). One pass per step
//! over the rows the policy recomputes, then the step's commits.

use super::canvas::{Canvas, PolicyStep};
use super::{candidates, committed_prefix, Policy, SamplerParams, GUMBEL};
use crate::error::Result;
use crate::session::Session;

pub(super) struct Official {
    policy: Policy,
    /// Blocks drafted after the current one (`spec`).
    spec_blocks: usize,
    /// Official `prompt_index = (x != mask_id)`: the positions the unconditional pass masks.
    prompt_index: Vec<bool>,
    /// The unconditional pass's sequence (classifier-free guidance).
    uncond: Vec<u32>,
}

impl Official {
    pub(super) fn new(p: &SamplerParams, prompt: &[u32], len: usize, mask: u32) -> Official {
        let guided = p.cfg_scale > 0.0;
        let mut prompt_index = vec![false; if guided { len } else { 0 }];
        prompt_index.iter_mut().zip(prompt).for_each(|(i, &t)| *i = t != mask);
        Official {
            policy: p.policy,
            spec_blocks: if p.policy == Policy::Spec { p.spec_blocks } else { 0 },
            prompt_index,
            uncond: vec![mask; if guided { len } else { 0 }],
        }
    }
}

impl PolicyStep for Official {
    fn step(&mut self, session: &mut Session, c: &mut Canvas, scheduled: usize) -> Result<()> {
        let (mask, len) = (c.special.mask, c.x.len());
        let (block_start, block_end) = c.block_range();
        let draft_end = (block_end + self.spec_blocks * c.p.block_length).min(len);
        // Eligible: masked and not after the current block (later positions have -inf
        // confidence in the official code). Drafted: masked in the next blocks.
        c.logit_rows.clear();
        c.logit_rows.extend((0..block_end).filter(|&i| c.x[i] == mask).map(|i| i as u32));
        let eligible = c.logit_rows.len();
        c.logit_rows.extend((block_end..draft_end).filter(|&i| c.x[i] == mask).map(|i| i as u32));
        c.candidates.clear();
        if eligible > 0 && scheduled > 0 {
            let i = c.i;
            let full = self.policy == Policy::Exact || i == 0 || (c.p.refresh_every > 0 && i % c.p.refresh_every == 0);
            let span = match self.policy {
                _ if full => 0..len,
                Policy::Dual => block_start..block_end,
                _ => block_start..len,
            };
            // Logits of the logit rows (guided when cfg_scale > 0), predicted.
            let predictions = if c.p.cfg_scale > 0.0 {
                for (u, (&t, &is_prompt)) in self.uncond.iter_mut().zip(c.x.iter().zip(&self.prompt_index)) {
                    *u = if is_prompt { mask } else { t };
                }
                c.predictor.load(session.forward_full(&self.uncond, &c.logit_rows)?);
                let cond = session.forward_full(&c.x, &c.logit_rows)?;
                let w = (c.p.cfg_scale + 1.0) as f32;
                for (g, &l) in c.predictor.load_mut(cond.len()).iter_mut().zip(cond) {
                    *g += w * (l - *g);
                }
                c.predictor.run(&c.logit_rows, &c.p, &c.special, GUMBEL, c.step)
            } else {
                let logits = session.forward_span(&c.x, span, &c.logit_rows)?;
                c.predictor.run_on(logits, &c.logit_rows, &c.p, &c.special, GUMBEL, c.step)
            };
            c.candidates.extend(candidates(&c.logit_rows, predictions));
            c.settle_drafts(block_end);
        }
        c.commit_best(scheduled);
        c.settled = committed_prefix(&c.x[c.prompt_len..], mask);
        Ok(())
    }
}
