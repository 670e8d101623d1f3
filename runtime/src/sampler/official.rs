//! The official sampler's loop and the cached policies that keep its commit rule: `exact`,
//! `prefix`, `dual` and `spec` (see the module documentation of `sampler`). One pass per step
//! over the rows the policy recomputes, then the step's commits.

use std::ops::ControlFlow;

use super::{commit_best, committed_prefix, commits_per_step, settle_predictions, Generation, Policy, Predictor, SamplerParams, StepView, GUMBEL};
use crate::error::{Error, Result};
use crate::session::Session;

pub(super) fn run(session: &mut Session, prompt: &[u32], p: &SamplerParams, steps_per_block: usize, on_step: &mut dyn FnMut(&StepView) -> ControlFlow<()>) -> Result<Generation> {
    let special = session.model.header.special.clone();
    let mask = special.mask;
    let len = prompt.len() + p.gen_length;
    let mut x: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, p.gen_length)).collect();
    // Official `prompt_index = (x != mask_id)`: the positions the unconditional pass masks.
    let prompt_index: Vec<bool> = x.iter().map(|&t| t != mask).collect();
    let mut uncond = x.clone();
    let mut reveals = Vec::with_capacity(p.steps.min(p.gen_length));
    let blocks = p.gen_length / p.block_length;
    let spec_blocks = if p.policy == Policy::Spec { p.spec_blocks } else { 0 };
    // Draft per position (spec): the token predicted while its block was speculative.
    let mut drafts: Vec<Option<u32>> = vec![None; len];
    let mut drafts_confirmed = 0;
    let dynamic = p.threshold.is_some() || spec_blocks > 0;
    let mut predictor = Predictor::for_session(session, p.block_length * (1 + spec_blocks));
    let (mut head, mut candidates) = (Vec::with_capacity(len), Vec::with_capacity(len));
    let mut step = 0;
    for b in 0..blocks {
        let block_start = prompt.len() + b * p.block_length;
        let block_end = block_start + p.block_length;
        let draft_end = (block_end + spec_blocks * p.block_length).min(len);
        let block_masked = x[block_start..block_end].iter().filter(|&&t| t == mask).count();
        let schedule = commits_per_step(block_masked, steps_per_block);
        for i in 0.. {
            // The official schedule runs its steps whatever they commit; the dynamic rules
            // stop when the block is full.
            let scheduled = match schedule.get(i) {
                Some(&k) if !dynamic => k,
                None if !dynamic => break,
                k => {
                    if !x[block_start..block_end].contains(&mask) {
                        break;
                    }
                    k.copied().unwrap_or(1).max(1)
                }
            };
            // Eligible: masked and not after the current block (later positions have -inf
            // confidence in the official code). Drafted: masked in the next blocks.
            head.clear();
            head.extend((0..block_end).filter(|&i| x[i] == mask).map(|i| i as u32));
            let eligible = head.len();
            head.extend((block_end..draft_end).filter(|&i| x[i] == mask).map(|i| i as u32));
            candidates.clear();
            let mut committed: Vec<[u32; 2]> = Vec::new();
            if eligible > 0 && scheduled > 0 {
                let full = p.policy == Policy::Exact || i == 0 || (p.refresh_every > 0 && i % p.refresh_every == 0);
                let span = match p.policy {
                    _ if full => 0..len,
                    Policy::Dual => block_start..block_end,
                    _ => block_start..len,
                };
                // Logits of the head rows (guided when cfg_scale > 0).
                if p.cfg_scale > 0.0 {
                    for (u, (&t, &is_prompt)) in uncond.iter_mut().zip(x.iter().zip(&prompt_index)) {
                        *u = if is_prompt { mask } else { t };
                    }
                    predictor.load(session.forward_full(&uncond, &head)?);
                    let cond = session.forward_full(&x, &head)?;
                    let w = (p.cfg_scale + 1.0) as f32;
                    for (g, &c) in predictor.load_mut(cond.len()).iter_mut().zip(cond) {
                        *g += w * (c - *g);
                    }
                } else {
                    predictor.load(session.forward_span(&x, span, &head)?);
                }
                let predictions = predictor.run(session.pool(), &head, p, &special, GUMBEL, step);
                let (accepted, _) = settle_predictions(&head, predictions, block_end, &mut drafts, p, &mut x, prompt.len(), &mut committed, &mut candidates);
                drafts_confirmed += accepted;
            }
            commit_best(&candidates, scheduled, p, &mut x, prompt.len(), &mut committed);
            step += 1;
            let settled = committed_prefix(&x[prompt.len()..], mask);
            if on_step(&StepView { step, steps: p.steps, canvas: &x, prompt_len: prompt.len(), committed: &committed, revised: &[], settled }).is_break() {
                return Err(Error::Cancelled);
            }
            reveals.push(committed);
        }
    }
    Ok(Generation {
        prompt_ids: prompt.to_vec(),
        output_ids: x[prompt.len()..].to_vec(),
        reveals,
        revisions: None,
        forward_passes: 0,
        rows_computed: 0,
        drafts_confirmed,
        seconds: 0.0,
        mbsd: None,
    })
}
