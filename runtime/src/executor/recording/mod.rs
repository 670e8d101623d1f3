//! A backend for tests (feature `test-backends`): it runs every pass on the host executor and
//! records what the session asked of it, so a test can show that every policy runs through a
//! backend nothing else knows about, and what each pass was. It is also the smallest example
//! of a backend: one folder, one line in the registry.

use std::sync::{Arc, Mutex};

use super::{host, Backend, Capabilities, Executor, Loads, Pass};
use crate::error::Result;
use crate::model::Model;
use crate::pool::Pool;
use crate::trace::Trace;

pub const BACKEND: Backend = Backend {
    name: "recording",
    about: "the host's kernels, recording every pass (tests only)",
    constructor: Ok(|model, threads, features| {
        let (host, window) = host::BACKEND.open(model, threads, features)?;
        let capabilities = Capabilities { backend: "recording", ..host.capabilities().clone() };
        Ok((Box::new(Recording { host, capabilities }), window))
    }),
};

/// What one pass asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedPass {
    pub graph: u32,
    /// Real rows, and of them the ones that store their keys and values.
    pub rows: usize,
    pub stored_rows: usize,
    /// Cache positions attended to.
    pub context: usize,
    /// Rows whose logits the pass returns.
    pub logit_rows: usize,
    pub block_causal: Option<usize>,
}

/// Every pass of every recording backend in this process, in order.
static PASSES: Mutex<Vec<RecordedPass>> = Mutex::new(Vec::new());

/// Takes the passes recorded since the last call.
pub fn take_recorded() -> Vec<RecordedPass> {
    std::mem::take(&mut PASSES.lock().unwrap_or_else(|p| p.into_inner()))
}

struct Recording {
    host: Box<dyn Executor>,
    capabilities: Capabilities,
}

impl Executor for Recording {
    fn run(&mut self, model: &Model, pass: Pass<'_>) -> Result<()> {
        let i = &pass.inputs;
        let recorded = RecordedPass { graph: pass.graph, rows: i.rows, stored_rows: i.stored_rows, context: i.context, logit_rows: i.logit_rows.len(), block_causal: i.block_causal };
        PASSES.lock().unwrap_or_else(|p| p.into_inner()).push(recorded);
        self.host.run(model, pass)
    }

    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn set_trace(&mut self, trace: Arc<Trace>) {
        self.host.set_trace(trace)
    }

    fn pool(&self) -> &Pool {
        self.host.pool()
    }

    fn take_loads(&mut self) -> Loads {
        self.host.take_loads()
    }
}
