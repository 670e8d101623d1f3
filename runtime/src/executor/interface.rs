//! What a backend is to the session: the [`Executor`] trait, the [`Pass`] it runs, and the
//! figures it reports ([`Capabilities`], [`Loads`], [`OpProfile`]).

use super::RunInputs;

use crate::error::Result;
use crate::model::Model;
use crate::moe::MoeStep;
use crate::staging::Stager;
use crate::window::Window;

/// One pass a session asks of its backend: the graph, its rows, and what the session lends
/// the backend for the pass (the window, the staging of rotating weights, the CPU's
/// mixture-of-experts step, a profile to fill). No stager: every weight the pass reads is in
/// its home on the host (the side lane's passes).
pub struct Pass<'p> {
    pub graph: u32,
    pub inputs: RunInputs<'p>,
    pub window: &'p mut Window,
    pub stager: Option<&'p mut Stager>,
    pub moe: &'p mut MoeStep,
    pub profile: Option<&'p mut OpProfile>,
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
    /// Runs `pass`: its graph (by id: an interpreting backend follows its program,
    /// [`Model::program`], an ahead-of-time one runs the executable it prepared for that id)
    /// over its inputs and the session's window, following the program's waits and releases
    /// on the session's stager for rotating weights, and handing the program's
    /// mixture-of-experts steps to the session's [`MoeStep`]. With a profile, records each
    /// op's time.
    fn run(&mut self, model: &Model, pass: Pass<'_>) -> Result<()>;

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
    pub logit_rows: usize,
    pub ops: OpProfile,
}
