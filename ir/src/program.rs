//! Each graph's program: its ops as a flat list of steps for a backend to execute in order,
//! with the swap schedule's waits and releases and the CPU's mixture-of-experts step placed
//! where they fall. `lladac` writes it as the `program` section, so no backend walks a graph's
//! ops or staging list at run time to find them; the verifier checks it is exactly what the
//! graph and its schedule imply ([`derive`]).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::graph::{Graph, Op};
use crate::header::{Extension, Header};

/// The section's kind.
pub const EXTENSION_KEY: &str = "program";
/// Its version: the postcard schema of [`Programs`].
pub const SECTION_VERSION: u32 = 1;

/// One step of a graph's program.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Rotating segment `rotating` (index into `WindowPlan::rotating`) must be home in slot
    /// `slot` before the next op, its first use this pass.
    Wait { rotating: u32, slot: u32 },
    /// Op `op`: the embedding gather, which reads its table from the artifact (on the CPU
    /// where a backend runs the rest on a device).
    Embed { op: u32 },
    /// Ops `start..end`, dense, with no wait, release or CPU step between them (on a device,
    /// one submission).
    Dense { start: u32, end: u32 },
    /// Ops `start..end`: routers and routed experts, the session's CPU step (`MoeStep`).
    Moe { start: u32, end: u32 },
    /// Slot `slot`'s occupant is done with: its copy of rotating step `step` may start (steps
    /// at or past the rotating count are the next pass's).
    Release { slot: u32, step: u32 },
}

/// The programs of a header's graphs, in graph order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct Programs {
    pub graphs: Vec<Vec<Step>>,
}

/// Ops the session's CPU mixture-of-experts step runs.
pub fn is_moe_op(op: &Op) -> bool {
    matches!(op, Op::Route { .. } | Op::RouteSigmoid { .. } | Op::RouteScaled { .. } | Op::MoeExperts { .. })
}

/// What kind of run an op belongs to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Run {
    Embed,
    Dense,
    Moe,
}

fn run_of(op: &Op) -> Run {
    match op {
        Op::Embed { .. } => Run::Embed,
        op if is_moe_op(op) => Run::Moe,
        _ => Run::Dense,
    }
}

/// The program of `g` with `rotating` segments in the window's schedule: the ops in order,
/// cut into runs of one kind, a run ending wherever a wait or release falls. A segment is
/// waited for before its first op; its slot is released where the next occupant's copy may
/// start (`stage_after_op`), and after a slot's last segment of the pass, for the next pass's
/// first copy into it.
pub fn derive(g: &Graph, rotating: u32) -> Vec<Step> {
    let mut waits: Vec<Vec<Step>> = vec![Vec::new(); g.ops.len()];
    let mut releases: Vec<Vec<Step>> = vec![Vec::new(); g.ops.len()];
    for (i, st) in g.staging.iter().enumerate() {
        if let Some(w) = waits.get_mut(st.first_op as usize) {
            w.push(Step::Wait { rotating: st.rotating, slot: st.slot });
        }
        if let Some(r) = st.stage_after_op.and_then(|op| releases.get_mut(op as usize)) {
            r.push(Step::Release { slot: st.slot, step: st.rotating });
        }
        let last_in_slot = !g.staging[i + 1..].iter().any(|later| later.slot == st.slot);
        if let Some(r) = releases.get_mut(st.last_op as usize).filter(|_| last_in_slot) {
            r.push(Step::Release { slot: st.slot, step: rotating + st.slot });
        }
    }
    let mut out = Vec::new();
    let mut open: Option<(Run, u32)> = None;
    let close = |out: &mut Vec<Step>, open: &mut Option<(Run, u32)>, end: u32| {
        if let Some((run, start)) = open.take() {
            out.push(match run {
                Run::Embed => Step::Embed { op: start },
                Run::Dense => Step::Dense { start, end },
                Run::Moe => Step::Moe { start, end },
            });
        }
    };
    for (i, op) in g.ops.iter().enumerate() {
        let (i, run) = (i as u32, run_of(op));
        // An embedding is a run of its own; others extend a run of their kind.
        if !waits[i as usize].is_empty() || open.is_some_and(|(r, _)| r != run || r == Run::Embed) {
            close(&mut out, &mut open, i);
        }
        out.append(&mut waits[i as usize]);
        open.get_or_insert((run, i));
        if !releases[i as usize].is_empty() {
            close(&mut out, &mut open, i + 1);
            out.append(&mut releases[i as usize]);
        }
    }
    close(&mut out, &mut open, g.ops.len() as u32);
    out
}

impl Programs {
    /// The programs of `h`'s graphs, derived from them (what `lladac` writes).
    pub fn derive(h: &Header) -> Programs {
        let rotating = h.plan.window.rotating.len() as u32;
        Programs { graphs: h.graphs.iter().map(|g| derive(g, rotating)).collect() }
    }

    pub fn extension(&self) -> Extension {
        Extension { key: EXTENSION_KEY.into(), version: SECTION_VERSION, required: true, bytes: postcard::to_stdvec(self).expect("programs encode") }
    }

    /// `h`'s `program` section (the reader refused it at another version), checked against
    /// its graphs (the verifier's check).
    pub fn of(h: &Header) -> Result<Programs> {
        let programs = Programs::decode(&h.extensions)?;
        programs.check(&h.graphs, h.plan.window.rotating.len() as u32)?;
        Ok(programs)
    }

    /// The section among `extensions`, decoded, not checked again: for a loader whose header
    /// the verifier passed (`Artifact::parse`). An artifact without it was written before
    /// programs and must be recompiled.
    pub fn decode(extensions: &[Extension]) -> Result<Programs> {
        let Some(e) = extensions.iter().find(|e| e.key == EXTENSION_KEY) else {
            return Err(Error::invalid(format!("the artifact has no '{EXTENSION_KEY}' section (it was compiled before each graph carried its program): recompile it with this lladac")));
        };
        postcard::from_bytes(&e.bytes).map_err(|err| Error::invalid(format!("section '{EXTENSION_KEY}': cannot decode it: {err}")))
    }

    /// Each program is exactly what its graph's ops and swap schedule imply; errors name the
    /// graph and the first step that differs.
    fn check(&self, graphs: &[Graph], rotating: u32) -> Result<()> {
        if self.graphs.len() != graphs.len() {
            return Err(Error::invalid(format!("section '{EXTENSION_KEY}' has {} programs for {} graphs", self.graphs.len(), graphs.len())));
        }
        for (i, (got, g)) in self.graphs.iter().zip(graphs).enumerate() {
            let want = derive(g, rotating);
            if let Some(at) = (0..got.len().max(want.len())).find(|&s| got.get(s) != want.get(s)) {
                return Err(Error::invalid(format!(
                    "section '{EXTENSION_KEY}': graphs[{i}] '{}' step {at} is {:?}, where its ops and swap schedule put {:?}",
                    g.name,
                    got.get(at),
                    want.get(at)
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Rows, StageStep, Value};

    fn graph(ops: Vec<Op>, staging: Vec<StageStep>) -> Graph {
        let values = vec![Value { name: "x".into(), rows: Rows::Tokens, cols: 4, offset: 0 }; 3];
        Graph { name: "g".into(), rows: 8, logit_rows: 8, values, ops, logits: 0, window_bytes: 0, staging }
    }

    fn matmul(weight: u32) -> Op {
        Op::MatMul { x: 0, weight, out: 1 }
    }

    #[test]
    fn a_graph_without_staging_or_experts_is_its_embedding_then_one_dense_run() {
        let g = graph(vec![Op::Embed { table: 0, out: 0 }, matmul(1), matmul(2), matmul(3)], vec![]);
        assert_eq!(derive(&g, 0), [Step::Embed { op: 0 }, Step::Dense { start: 1, end: 4 }]);
    }

    #[test]
    fn waits_come_before_first_use_and_releases_after_the_op_that_frees_the_slot() {
        // Two slots, three rotating segments: segment 2 reuses slot 0 once op 2 is done.
        let st = |rotating, slot, stage_after_op, first_op, last_op| StageStep { rotating, slot, stage_after_op, first_op, last_op };
        let staging = vec![st(0, 0, None, 1, 2), st(1, 1, None, 3, 3), st(2, 0, Some(2), 4, 4)];
        let g = graph(vec![Op::Embed { table: 0, out: 0 }, matmul(1), matmul(2), matmul(3), matmul(4), matmul(5)], staging);
        let program = derive(&g, 3);
        assert_eq!(
            program,
            [
                Step::Embed { op: 0 },
                Step::Wait { rotating: 0, slot: 0 },
                Step::Dense { start: 1, end: 3 },
                Step::Release { slot: 0, step: 2 },
                Step::Wait { rotating: 1, slot: 1 },
                Step::Dense { start: 3, end: 4 },
                // Slot 1's last segment this pass: the next pass's segment 1 (step 3 + 1).
                Step::Release { slot: 1, step: 4 },
                Step::Wait { rotating: 2, slot: 0 },
                Step::Dense { start: 4, end: 5 },
                Step::Release { slot: 0, step: 3 },
                Step::Dense { start: 5, end: 6 },
            ]
        );
    }

    #[test]
    fn routers_and_experts_are_one_cpu_step_between_dense_runs() {
        let route = Op::Route { logits: 0, top_k: 2, out: 2 };
        let experts = Op::MoeExperts { x: 0, route: 2, out: 1, layer: 0, first: 2, experts: 4, ranked: 2, work: 2 };
        let g = graph(vec![Op::Embed { table: 0, out: 0 }, matmul(1), route, experts, matmul(3)], vec![]);
        assert_eq!(derive(&g, 0), [Step::Embed { op: 0 }, Step::Dense { start: 1, end: 2 }, Step::Moe { start: 2, end: 4 }, Step::Dense { start: 4, end: 5 }]);
    }

    #[test]
    fn a_program_that_differs_from_its_graph_is_refused_naming_the_step() {
        let graphs = [graph(vec![Op::Embed { table: 0, out: 0 }, matmul(1)], vec![])];
        let mut programs = Programs { graphs: vec![derive(&graphs[0], 0)] };
        assert!(programs.check(&graphs, 0).is_ok());
        programs.graphs[0][1] = Step::Dense { start: 1, end: 1 };
        let decoded = Programs::decode(&[programs.extension()]).unwrap();
        let e = decoded.check(&graphs, 0).unwrap_err().to_string();
        assert!(e.contains("graphs[0] 'g' step 1 is Some(Dense { start: 1, end: 1 })"), "{e}");
        let e = Programs::decode(&[]).unwrap_err().to_string();
        assert!(e.contains("no 'program' section") && e.contains("recompile"), "{e}");
    }
}
