//! Which policy a request runs, and the canvas it starts with: the request checked against
//! the artifact's plan, every buffer the steps use sized here.

use super::ask::{LogitCapacity, PassContext};
use super::canvas::{Canvas, PolicyStep};
use super::{diffusion_gemma, dream, llada2, mbsd, official, Limits, Policy, Predictor, SamplerParams};
use crate::error::{Error, Result};
use crate::model::Model;

/// A generation ready to step: its canvas and its policy.
pub(crate) struct Start {
    pub(crate) canvas: Canvas,
    pub(crate) policy: Box<dyn PolicyStep>,
}

/// Refuses a block of `p.block_length` logit rows when the graph that computes `rows`
/// positions returns fewer. Dream's exact sampler is one block of the whole generation, so
/// there the fix is a shorter generation, not a shorter block.
fn check_logit_rows(model: &Model, rows: usize, p: &SamplerParams) -> Result<()> {
    let capacity = model.logit_capacity(rows)?;
    let block_length = p.block_length;
    if block_length > capacity {
        let (what, shorter) = if model.is_dream() && p.policy == Policy::Exact {
            (format!("--gen-len {block_length} (Dream's sampler has no blocks: one pass predicts every generated position)"), format!("--gen-len {capacity} or less, or the prefix or dual policy with --block-len {capacity} or less"))
        } else {
            (format!("--block-len {block_length}"), format!("--block-len {capacity} or less"))
        };
        return Err(Error::request(format!(
            "{what} needs {block_length} logit rows per pass but {} was compiled for {capacity}; use {shorter}, or recompile with `lladac compile --logit-rows {block_length}`",
            model.path.display(),
        )));
    }
    Ok(())
}

/// The policy and canvas of a generation of `prompt` with `p`, whose passes run as `ctx` says.
pub(crate) fn start(ctx: &PassContext, prompt: &[u32], p: &SamplerParams) -> Result<Start> {
    let model = &ctx.model;
    let steps_per_block = p.validate(&Limits::of(model))?;
    let special = model.header.special.clone();
    model.check_prompt(prompt)?;
    if model.family() == llada_ir::Family::Llada2Moe {
        return start_llada2(ctx, prompt, p, special, steps_per_block);
    }
    if let Some(section) = model.diffusion_gemma() {
        return start_diffusion_gemma(ctx, section, prompt, p, special, steps_per_block);
    }
    let len = prompt.len() + p.gen_length;
    check_logit_rows(model, len, p)?;
    let spec_blocks = if matches!(p.policy, Policy::Spec | Policy::Mbsd) { p.spec_blocks } else { 0 };
    let (policy, revised_per_step): (Box<dyn PolicyStep>, usize) = match p.policy {
        Policy::Mbsd => {
            let m = mbsd::Mbsd::new(ctx, p, steps_per_block, len)?;
            let checked = m.checked_per_step();
            (Box::new(m), checked)
        }
        // Dream's own sampler, unblocked or blocked as Fast-dLLM blocks it.
        _ if model.is_dream() => (Box::new(dream::Dream::new(p, steps_per_block)), 0),
        _ => (Box::new(official::Official::new(p, prompt, len, special.mask)), 0),
    };
    let predictor = Predictor::for_model(model, p.block_length * (1 + spec_blocks), ctx.pool.clone());
    let canvas = Canvas::new(p, steps_per_block, prompt, special, predictor, revised_per_step);
    Ok(Start { canvas, policy })
}

/// DiffusionGemma's published `generate` (`diffusion_gemma.rs`): its canvas is the prompt
/// and whole canvases after it, which must all fit the cache.
fn start_diffusion_gemma(ctx: &PassContext, section: &llada_ir::diffusion_gemma::DiffusionGemmaSection, prompt: &[u32], p: &SamplerParams, special: llada_ir::SpecialTokens, steps: usize) -> Result<Start> {
    let model = &ctx.model;
    // An end token outside the vocabulary could never be drawn: refused, not ignored.
    if let Some(&id) = p.eos_ids.as_slice().iter().find(|&&id| id >= section.vocab_size) {
        return Err(Error::setting(crate::error::Setting::EosIds, format!("{id} is outside the vocabulary (0..{})", section.vocab_size)));
    }
    let policy = diffusion_gemma::DiffusionGemma::new(p, section, prompt.len(), section.generation.pad_id);
    let len = prompt.len() + policy.generated_len();
    let limit = model.header.plan.kv_capacity as usize;
    if len > limit {
        let what = format!("the prompt ({} tokens) and --gen-len {} in whole canvases of {}", prompt.len(), p.gen_length, p.block_length);
        return Err(model.too_long(&what, len, limit));
    }
    let canvas_p = SamplerParams { gen_length: policy.generated_len(), ..*p };
    let predictor = Predictor::for_model(model, 0, ctx.pool.clone());
    let mut canvas = Canvas::new(&canvas_p, steps, prompt, special, predictor, 0);
    canvas.own_schedule = true;
    Ok(Start { canvas, policy: Box::new(policy) })
}

/// LLaDA 2.x's published `generate` (`llada2.rs`): its canvas is the block grid from
/// position 0, the prompt's partial block included.
fn start_llada2(ctx: &PassContext, prompt: &[u32], p: &SamplerParams, special: llada_ir::SpecialTokens, steps: usize) -> Result<Start> {
    let model = &ctx.model;
    let mut policy = llada2::Llada2::new(LogitCapacity::of_model(model), p, prompt.len(), steps, special.eos);
    if p.policy == Policy::Mbsd {
        policy = policy.speculate(p);
    }
    let grid = policy.grid_len();
    let limit = Limits::of(model).max_len;
    if grid > limit {
        let what = format!("the prompt ({} tokens) and --gen-len {} on a grid of whole {}-token blocks", prompt.len(), p.gen_length, p.block_length);
        return Err(model.too_long(&what, grid, limit));
    }
    // A block pass runs on the graph of the block's rows and returns a row per position.
    check_logit_rows(model, p.block_length, p)?;
    let canvas_p = SamplerParams { gen_length: grid - prompt.len(), ..*p };
    let predictor = Predictor::for_model(model, policy.logit_rows(), ctx.pool.clone());
    let mut canvas = Canvas::new(&canvas_p, steps, prompt, special, predictor, policy.revised_per_step());
    canvas.own_schedule = true;
    Ok(Start { canvas, policy: Box::new(policy) })
}
