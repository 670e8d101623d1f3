//! The official sampler's step and the cached policies that keep its commit rule: `exact`,
//! `prefix`, `dual` and `spec` (see the module documentation of `sampler`). One pass per step
//! over the rows the policy recomputes, then the step's commits.

use super::ask::{Ask, PassRequest};
use super::canvas::{out_of_turn, Canvas, PolicyStep};
use super::{candidates, committed_prefix, Policy, SamplerParams, GUMBEL};
use crate::error::Result;

pub(super) struct Official {
    policy: Policy,
    /// Blocks drafted after the current one (`spec`).
    spec_blocks: usize,
    /// Official `prompt_index = (x != mask_id)`: the positions the unconditional pass masks.
    prompt_index: Vec<bool>,
    /// The unconditional pass's sequence (classifier-free guidance).
    uncond: Vec<u32>,
    phase: Phase,
}

/// Where a step is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Begin,
    /// Waiting for the logits of the pass over the policy's rows.
    Unguided,
    /// Guidance: waiting for the unconditional pass's logits, asking for the conditional pass,
    /// waiting for its logits.
    Unconditional,
    AskConditional,
    Conditional,
    /// The predictions are in: the commits.
    Commit,
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
            phase: Phase::Begin,
        }
    }

    /// The step's pass, over the rows the policy recomputes (guided: the unconditional pass
    /// first), or its end where it commits nothing.
    fn begin<'a>(&'a mut self, c: &'a mut Canvas) -> Ask<'a> {
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
        if eligible == 0 || c.scheduled == 0 {
            return self.end(c);
        }
        if c.p.cfg_scale > 0.0 {
            for (u, (&t, &is_prompt)) in self.uncond.iter_mut().zip(c.x.iter().zip(&self.prompt_index)) {
                *u = if is_prompt { mask } else { t };
            }
            self.phase = Phase::Unconditional;
            return Ask::Pass(PassRequest::Span { seq: &self.uncond, span: 0..len, logit_positions: &c.logit_rows });
        }
        let i = c.i;
        let full = self.policy == Policy::Exact || i == 0 || (c.p.refresh_every > 0 && i % c.p.refresh_every == 0);
        let span = match self.policy {
            _ if full => 0..len,
            Policy::Dual => block_start..block_end,
            _ => block_start..len,
        };
        self.phase = Phase::Unguided;
        Ask::Pass(PassRequest::Span { seq: &c.x, span, logit_positions: &c.logit_rows })
    }

    /// The step's commits, from the predictions in `c.candidates`.
    fn end(&mut self, c: &mut Canvas) -> Ask<'static> {
        self.phase = Phase::Begin;
        c.commit_best(c.scheduled);
        c.settled = committed_prefix(&c.x[c.prompt_len..], c.special.mask);
        Ask::Done
    }
}

impl PolicyStep for Official {
    fn next<'a>(&'a mut self, c: &'a mut Canvas) -> Result<Ask<'a>> {
        match self.phase {
            Phase::Begin => Ok(self.begin(c)),
            Phase::AskConditional => {
                self.phase = Phase::Conditional;
                Ok(Ask::Pass(PassRequest::Span { seq: &c.x, span: 0..c.x.len(), logit_positions: &c.logit_rows }))
            }
            Phase::Commit => Ok(self.end(c)),
            Phase::Unguided | Phase::Unconditional | Phase::Conditional => Err(out_of_turn()),
        }
    }

    fn logits(&mut self, c: &mut Canvas, logits: &[f32]) -> Result<()> {
        let predictions = match self.phase {
            Phase::Unconditional => {
                c.predictor.load(logits);
                self.phase = Phase::AskConditional;
                return Ok(());
            }
            // Guided: the unconditional logits moved towards the conditional ones.
            Phase::Conditional => {
                let w = (c.p.cfg_scale + 1.0) as f32;
                for (g, &l) in c.predictor.load_mut(logits.len()).iter_mut().zip(logits) {
                    *g += w * (l - *g);
                }
                c.predictor.run(&c.logit_rows, &c.p, &c.special, GUMBEL, c.step)
            }
            Phase::Unguided => c.predictor.run_on(logits, &c.logit_rows, &c.p, &c.special, GUMBEL, c.step),
            Phase::Begin | Phase::AskConditional | Phase::Commit => return Err(out_of_turn()),
        };
        c.candidates.extend(candidates(&c.logit_rows, predictions));
        c.settle_drafts(c.block_range().1);
        self.phase = Phase::Commit;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The policy driven as the generator drives it, with made-up logits and no session: it
    //! asks for passes and receives logits, nothing else.

    use super::*;
    use crate::sampler::Predictor;

    const VOCAB: usize = 10;
    const MASK: u32 = 9;

    fn canvas(p: &SamplerParams, prompt: &[u32]) -> Canvas {
        let special = llada_ir::SpecialTokens { mask: MASK, bos: None, eos: None, eot: None };
        let pool = crate::pool::Pool::new(1, "llada-test-pool").unwrap();
        let steps_per_block = p.steps / (p.gen_length / p.block_length);
        Canvas::new(p, steps_per_block, prompt, special, Predictor::new(VOCAB, p.gen_length, pool), 0)
    }

    /// Logits whose argmax at every asked position is token 5, more confident the later the
    /// position.
    fn logits(positions: &[u32]) -> Vec<f32> {
        positions.iter().flat_map(|&q| (0..VOCAB).map(move |t| if t == 5 { 1.0 + q as f32 } else { 0.0 })).collect()
    }

    /// The next ask, which must be a pass over `span`: its sequence and logit positions.
    fn expect_pass(policy: &mut Official, c: &mut Canvas, span: std::ops::Range<usize>) -> (Vec<u32>, Vec<u32>) {
        match policy.next(c).unwrap() {
            Ask::Pass(PassRequest::Span { seq, span: s, logit_positions }) => {
                assert_eq!(s, span);
                (seq.to_vec(), logit_positions.to_vec())
            }
            _ => panic!("expected a pass over {span:?}"),
        }
    }

    #[test]
    fn a_step_asks_for_its_pass_and_commits_from_the_logits_it_is_handed() {
        let p = SamplerParams { gen_length: 4, block_length: 4, steps: 2, ..Default::default() };
        let (prompt, len) = ([3, 4], 6);
        let (mut policy, mut c) = (Official::new(&p, &prompt, len, MASK), canvas(&p, &prompt));
        assert!(policy.logits(&mut c, &[]).is_err(), "logits nobody asked for are refused");
        assert!(c.begin_step());
        let (seq, asked) = expect_pass(&mut policy, &mut c, 0..len);
        assert_eq!((seq, asked.clone()), (vec![3, 4, MASK, MASK, MASK, MASK], vec![2, 3, 4, 5]));
        policy.logits(&mut c, &logits(&asked)).unwrap();
        assert!(matches!(policy.next(&mut c).unwrap(), Ask::Done));
        // Two commits a step: the two most confident.
        assert_eq!((c.x.as_slice(), c.settled), ([3, 4, MASK, MASK, 5, 5].as_slice(), 0));
        c.end_step();
        assert!(c.begin_step());
        let (_, asked) = expect_pass(&mut policy, &mut c, 0..len);
        assert_eq!(asked, [2, 3]);
        policy.logits(&mut c, &logits(&asked)).unwrap();
        assert!(matches!(policy.next(&mut c).unwrap(), Ask::Done));
        c.end_step();
        assert_eq!((c.x.as_slice(), c.settled), ([3, 4, 5, 5, 5, 5].as_slice(), 4));
        assert!(!c.begin_step(), "the schedule is spent");
    }

    #[test]
    fn guidance_asks_for_the_unconditional_pass_then_the_conditional_one() {
        let p = SamplerParams { gen_length: 2, block_length: 2, steps: 1, cfg_scale: 1.0, ..Default::default() };
        let (prompt, len) = ([3], 3);
        let (mut policy, mut c) = (Official::new(&p, &prompt, len, MASK), canvas(&p, &prompt));
        assert!(c.begin_step());
        let (uncond, asked) = expect_pass(&mut policy, &mut c, 0..len);
        assert_eq!(uncond, [MASK, MASK, MASK], "the prompt masked");
        policy.logits(&mut c, &logits(&asked)).unwrap();
        let (cond, _) = expect_pass(&mut policy, &mut c, 0..len);
        assert_eq!(cond, [3, MASK, MASK]);
        policy.logits(&mut c, &logits(&asked)).unwrap();
        assert!(matches!(policy.next(&mut c).unwrap(), Ask::Done));
        assert_eq!(c.x, [3, 5, 5]);
    }
}
