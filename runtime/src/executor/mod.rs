//! Backends run one planned graph over the window. A backend is a small table: run a graph
//! (waiting on the staging of its rotating weights as the swap schedule says), its
//! capabilities as plain data, and the CPU threads that work around the passes. Two exist:
//! the host executor (the CPU's kernels standing in for an accelerator) and Vulkan (the GPUs
//! of phones and desktops). The window itself comes from the backend: where the accelerator
//! can address it, laid out by the plan.

use std::ops::Range;

use llada_ir::{Graph, Rows, Value};

use crate::error::Result;
use crate::kernels::cpu::Features;
use crate::model::Model;
use crate::moe::Experts;
use crate::staging::Stager;
use crate::window::Window;

pub mod host;
#[cfg(all(feature = "vulkan", not(target_env = "musl")))]
pub mod vulkan;
#[cfg(all(feature = "qnn", not(target_env = "musl")))]
pub mod qnn;

pub use host::HostExecutor;

/// What one run of a graph needs besides the window: the token rows and which rows' logits
/// to produce.
pub struct RunInputs<'a> {
    /// One token per graph row (padding rows hold any valid token).
    pub tokens: &'a [u32],
    /// Position of each row (indexes the rotary tables and the KV cache).
    pub positions: &'a [u32],
    /// Rows `0..stored_rows` store their keys and values in the cache at their positions;
    /// later rows (speculative rows, revision checks, padding) do not, and attend with their
    /// own key and value at their position instead of the cache's.
    pub stored_rows: usize,
    /// Cache positions `0..context` are the keys every row attends to.
    pub context: usize,
    /// Rows whose logits the sampler needs, in output order.
    pub head_rows: &'a [u32],
    /// Real rows (`tokens` beyond them pad the graph's rows; row-wise ops may skip them).
    pub rows: usize,
    /// `Some(b)`: a pass over several blocks of LLaDA 2.x's block-causal mask, whose rows lie
    /// in ascending position order: each row attends only to the keys before its block's end,
    /// `(position / b + 1) * b` (at most `context`, [`RunInputs::keys_of`]). Every backend
    /// runs such passes (the NPU's mask and Vulkan's attention shader apply the same rule).
    pub block_causal: Option<usize>,
}

impl RunInputs<'_> {
    /// The keys row `r` attends to: the first `context`, or in a block-causal pass those
    /// before the end of its block.
    pub fn keys_of(&self, r: usize) -> usize {
        match self.block_causal {
            Some(b) => ((self.positions[r] as usize / b + 1) * b).min(self.context),
            None => self.context,
        }
    }

    /// The real rows split into runs that attend to the same keys, `(rows, keys)` each in
    /// order: one run of every row over `context` unless the pass is block-causal.
    pub fn key_runs(&self) -> impl Iterator<Item = (std::ops::Range<usize>, usize)> + '_ {
        let keys = move |r: usize| self.keys_of(r);
        let mut start = 0;
        std::iter::from_fn(move || {
            if start >= self.rows {
                return None;
            }
            let k = keys(start);
            let end = (start..self.rows).find(|&r| keys(r) != k).unwrap_or(self.rows);
            let run = (start..end, k);
            start = end;
            Some(run)
        })
    }
}

/// Which backend runs the dense graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendKind {
    /// The host CPU's kernels.
    #[default]
    Host,
    /// A Vulkan 1.1 compute device (a phone's or desktop's GPU; lavapipe on a CPU).
    Vulkan,
    /// Qualcomm's HTP (a Snapdragon phone's NPU, or QNN's simulator on x86-64), running the
    /// executables `lladac` compiled into the artifact.
    Qnn,
}

impl BackendKind {
    pub const ALL: [BackendKind; 3] = [BackendKind::Host, BackendKind::Vulkan, BackendKind::Qnn];

    pub fn parse(s: &str) -> Option<BackendKind> {
        BackendKind::ALL.into_iter().find(|b| b.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Vulkan => "vulkan",
            BackendKind::Qnn => "qnn",
        }
    }
}

/// What a backend is and can do, as plain data (for reports and for choosing shader paths).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Capabilities {
    pub backend: &'static str,
    /// The device, in words (the CPU's kernel paths, or the Vulkan device's name and driver).
    pub device: String,
    /// Whether the backend's clock runs on the CPU that also runs the side path (lavapipe, the
    /// host executor): its times are CPU figures, never a GPU's.
    pub runs_on_cpu: bool,
    /// Whether a pass costs every row it computes and computes only the rows asked for (the
    /// host executor), rather than a graph's whole row count (a dispatch shaped by the graph,
    /// a phone's latency bucket). Policies then fill no idle rows: they are not free.
    pub cost_per_row: bool,
    /// Largest single allocation the device makes (the window must fit one).
    pub max_allocation_bytes: u64,
    /// Whether op times in a profile come from device timestamps (else host wall time).
    pub device_timestamps: bool,
    /// Whether the int8 matmuls use the device's packed int8 dot-product instructions.
    pub int8_dot: bool,
}

pub trait Executor: Send {
    /// Runs planned graph `graph` (by id: an interpreting backend reads its op list from
    /// `model`, an ahead-of-time one runs the executable it prepared for that id) with
    /// `inputs` over `window` (values, KV cache, scratch and resident weights), waiting on
    /// `stager` for rotating weights as the graph's swap schedule says, and running MoE layers
    /// through `experts`. With `profile`, records each op's time.
    #[allow(clippy::too_many_arguments)]
    fn run(&mut self, model: &Model, graph: u32, inputs: &RunInputs, window: &mut Window, stager: &mut Stager, experts: Option<&mut Experts>, profile: Option<&mut OpProfile>) -> Result<()>;

    fn capabilities(&self) -> &Capabilities;

    /// Records the backend's own spans (a device's dispatches) in `trace` from now on.
    fn set_trace(&mut self, _trace: std::sync::Arc<crate::trace::Trace>) {}

    /// The CPU threads that work around the passes (the sampler's predictions; the host
    /// backend's kernels too).
    fn pool(&self) -> &crate::pool::Pool;
    /// The executables the backend created during passes since the last call (an NPU's
    /// rotating contexts; none for a backend whose weights the window's stager moves).
    fn take_loads(&mut self) -> Loads {
        Loads::default()
    }
}

/// Backend executables created during passes: how many, their bytes, and the time it took;
/// of them, how many were created while another executable ran (overlapped, off the critical
/// path) and the time a pass waited for those.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Loads {
    pub contexts: u64,
    pub bytes: u64,
    pub seconds: f64,
    pub overlapped: u64,
    pub wait_seconds: f64,
}

/// A backend of `kind` for `model` with `threads` CPU threads and kernel paths `features`,
/// and the window it runs in (allocated where the backend's device addresses it).
pub fn open(kind: BackendKind, model: &Model, threads: usize, features: Features) -> Result<(Box<dyn Executor>, Window)> {
    match kind {
        BackendKind::Host => {
            let h = &model.header;
            let window = Window::new(h).map_err(|e| crate::Error::io(format!("allocating the {}-byte window", h.plan.window.bytes), e))?;
            Ok((Box::new(HostExecutor::new(model, threads, features)), window))
        }
        #[cfg(all(feature = "vulkan", not(target_env = "musl")))]
        BackendKind::Vulkan => {
            let (e, w) = vulkan::VulkanExecutor::new(model, threads)?;
            Ok((Box::new(e), w))
        }
        #[cfg(not(all(feature = "vulkan", not(target_env = "musl"))))]
        BackendKind::Vulkan => Err(crate::Error::setting(
            crate::Setting::Backend,
            "vulkan: this build of llada-rt has no Vulkan backend (a static musl binary cannot load a Vulkan driver, or the `vulkan` feature is off); build for aarch64-linux-android with the NDK, or use --backend host".to_string(),
        )),
        #[cfg(all(feature = "qnn", not(target_env = "musl")))]
        BackendKind::Qnn => {
            let h = &model.header;
            let window = Window::new(h).map_err(|e| crate::Error::io(format!("allocating the {}-byte window", h.plan.window.bytes), e))?;
            Ok((Box::new(qnn::QnnExecutor::new(model, threads)?), window))
        }
        #[cfg(not(all(feature = "qnn", not(target_env = "musl"))))]
        BackendKind::Qnn => Err(crate::Error::setting(
            crate::Setting::Backend,
            "qnn: this build of llada-rt has no QNN backend (a static musl binary cannot load Qualcomm's bionic libraries, or the `qnn` feature is off); build for aarch64-linux-android with the NDK".to_string(),
        )),
    }
}

/// Float range a value occupies in the activation region (which starts at window byte
/// `base`) for this run (head values use only the rows asked for).
pub fn value_range(g: &Graph, v: &Value, head_rows: usize, base: u64) -> Range<usize> {
    let rows = match v.rows {
        Rows::Tokens => g.rows as usize,
        Rows::Head => head_rows,
    };
    let start = ((v.offset - base) / 4) as usize;
    start..start + rows * v.cols as usize
}

/// Time spent per op in one run, for `llada-rt bench` and `run --op-profile`.
#[derive(Debug, Clone, Default)]
pub struct OpProfile {
    /// (op index, seconds).
    pub times: Vec<(usize, f64)>,
    /// Where `Some`, the range of every matmul's input and output in the run (the host
    /// executor records them; `lladac` calibrates fixed-point NPU activations with them).
    pub matmul_ranges: Option<Vec<MatMulRange>>,
}

/// The smallest and largest value of a matmul's input and of its output in one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatMulRange {
    pub weight: llada_ir::TensorId,
    pub input: [f32; 2],
    pub output: [f32; 2],
}

impl MatMulRange {
    pub fn of(weight: llada_ir::TensorId, input: &[f32], output: &[f32]) -> MatMulRange {
        let span = |v: &[f32]| v.iter().fold([f32::INFINITY, f32::NEG_INFINITY], |[lo, hi], &x| [lo.min(x), hi.max(x)]);
        MatMulRange { weight, input: span(input), output: span(output) }
    }

    /// The range covering both.
    pub fn widen(&mut self, other: &MatMulRange) {
        for (a, b) in [(&mut self.input, other.input), (&mut self.output, other.output)] {
            *a = [a[0].min(b[0]), a[1].max(b[1])];
        }
    }
}

/// One pass's op times with what it ran: the graph, its real rows and its logit rows.
#[derive(Debug, Clone)]
pub struct PassProfile {
    pub graph: u32,
    pub rows: usize,
    pub head_rows: usize,
    pub ops: OpProfile,
}

#[cfg(test)]
mod tests {
    use super::RunInputs;

    #[test]
    fn block_causal_rows_run_by_the_end_of_their_block() {
        let positions: Vec<u32> = (8..30).collect();
        let inp = |block_causal, rows| RunInputs { tokens: &[], positions: &positions, stored_rows: rows, context: 28, head_rows: &[], rows, block_causal };
        let runs = |i: &RunInputs| i.key_runs().collect::<Vec<_>>();
        // Rows at 8..28 in blocks of 8: 8..16 see 16 keys, 16..24 see 24, 24..28 the context.
        assert_eq!(runs(&inp(Some(8), 20)), vec![(0..8, 16), (8..16, 24), (16..20, 28)]);
        // Otherwise every row sees the context; no rows, no runs.
        assert_eq!(runs(&inp(None, 20)), vec![(0..20, 28)]);
        assert!(runs(&inp(Some(8), 0)).is_empty());
    }
}
