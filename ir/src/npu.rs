//! Backend executables: graphs a backend compiled ahead of time (QNN context binaries for
//! Qualcomm's HTP), as IREE keeps per-backend executables and ExecuTorch delegate blobs. A
//! versioned section in the header's extensions (key [`EXTENSION_KEY`]); each context's binary
//! is a segment of the data section, which no window region holds (QNN maps it itself).
//!
//! A model too large for one context of the NPU's window is split by layers: context k holds
//! layers `layers[0]..layers[1]` of every planned graph (one executable per graph and
//! context), and a pass runs the contexts in order, each handing its rows' hidden states to
//! the next. The host embeds the token rows ([`Role::Hidden`] of the first context is the
//! embedding's output); the last context ends with the head. An executable's inputs and
//! outputs, by role: the rows' hidden states, their rotary tables and attention mask, the
//! head-row indices (last context), each of its layers' KV cache (bound to the window's KV
//! planes), each of its layers' new keys and values (which the runtime stores into the cache
//! for the rows the run stores), and the next context's hidden states or the logits.
//!
//! Residency: the contexts marked `resident` stay created for the whole session; the others
//! rotate through what is left of [`NpuSection::context_budget`], created before their
//! layers run and freed after (the swap schedule of the contexts).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::header::Header;

/// The extension key of the section.
pub const EXTENSION_KEY: &str = "npu.qnn";
/// The section's own version: a reader refuses any other.
pub const SECTION_VERSION: u32 = 4;
/// Masked attention scores: QNN.md found that an `-inf` mask gives wrong results on the HTP,
/// so a large finite negative stands in for it (f16's lowest).
pub const MASKED: f32 = -65504.0;

/// The Snapdragon SoCs the compiler prepares graphs for: target name, QNN's `socModel` id,
/// HTP architecture (QNN.md).
pub const SOCS: [(&str, u32, &str); 4] = [("sm8550", 43, "v73"), ("sm8650", 57, "v75"), ("sm8750", 69, "v79"), ("sm8850", 87, "v81")];

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuSection {
    pub version: u32,
    /// The SoC the binaries were prepared for: its target name and QNN `socModel` id.
    pub soc: String,
    pub soc_id: u32,
    /// The QNN build that prepared them (`backendGetBuildId`).
    pub qnn_build: String,
    /// How the executables hold the matmul weights (norms and biases stay fp16).
    pub weights: NpuWeights,
    /// Whether each context's row-bucket graphs share one copy of their weights (the phone's
    /// form: QNN's x86-64 simulator cannot load it) or each carry their own.
    pub shared_weights: bool,
    /// Bytes of the NPU window the contexts may occupy at once: the window less the I/O
    /// allocation (the KV cache and the largest pass's inputs and outputs, [`IoLayout`]).
    pub context_budget: u64,
    /// Where every executable's inputs and outputs live ([`IoLayout::of`] the plan).
    pub io: IoLayout,
    /// QNN's own performance estimates of the executables, made at finalize for a SoC id the
    /// library models (`lladac --npu-estimate-soc`; none for SM8650 or SM8750): one per
    /// planned graph and context.
    pub estimates: Vec<NpuEstimate>,
    /// In layer order.
    pub contexts: Vec<NpuContext>,
    /// The static encodings of the fixed-point activations (16-bit, [`NpuWeights::Int4Lpbq`]
    /// only): each matmul's input and output range, calibrated on the host kernels.
    pub activations: Vec<ActivationRange>,
    /// What the ranges were calibrated on (empty without fixed-point activations).
    pub calibration: String,
}

/// The range a matmul's 16-bit input and output cover (`[low, high]`, zero inside), by its
/// weight tensor: the same in every planned graph.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct ActivationRange {
    pub weight: crate::TensorId,
    pub input: [f32; 2],
    pub output: [f32; 2],
}

impl ActivationRange {
    /// QNN's encoding of a 16-bit unsigned value covering `range`: `(scale, offset)` with a
    /// value `(q + offset) * scale`, zero exact.
    pub fn u16_encoding(range: [f32; 2]) -> (f32, i32) {
        let (low, high) = (range[0].min(0.0), range[1].max(0.0));
        let scale = ((high - low) / 65535.0).max(f32::MIN_POSITIVE);
        (scale, (low / scale).round() as i32)
    }
}

/// The matmul weights' format inside the executables: what the HTP computes natively
/// (QNN.md's table): per-channel formats with fp16 activations, block-scaled int4 with
/// 16-bit ones.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuWeights {
    F16,
    /// Signed int8, one scale per output channel (symmetric).
    Int8PerChannel,
    /// Signed int4 in an int8 container, one scale per output channel (symmetric).
    Int4PerChannel,
    /// Signed int4 with a scale per `block` inputs of each output channel, expressed as the
    /// channel's scale times a 4-bit factor (Qualcomm's LPBQ), in a 1x1 Conv2d whose input
    /// and output are 16-bit fixed point ([`NpuSection::activations`]).
    Int4Lpbq { block: u32 },
}

impl NpuWeights {
    pub fn name(self) -> &'static str {
        match self {
            NpuWeights::F16 => "fp16",
            NpuWeights::Int8PerChannel => "int8 per output channel",
            NpuWeights::Int4PerChannel => "int4 per output channel",
            NpuWeights::Int4Lpbq { .. } => "int4 per block (LPBQ)",
        }
    }
}

/// QNN's estimate of one executable (planned graph `graph`, the context of layers `layers`)
/// prepared for SoC id `soc_id`: its simulated cycles and microseconds (point estimates).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuEstimate {
    pub graph: u32,
    pub layers: [u32; 2],
    pub soc_id: u32,
    pub cycles: u64,
    pub micros: u64,
}

/// One context binary: layers `layers[0]..layers[1]` of every planned graph.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuContext {
    /// The segment holding the binary.
    pub segment: u32,
    /// CRC-32 of the binary (checked when a session creates the context).
    pub crc32: u32,
    pub layers: [u32; 2],
    /// Created once for the session (else created before each use and freed after).
    pub resident: bool,
    /// One executable per planned graph.
    pub graphs: Vec<NpuGraph>,
}

impl NpuContext {
    /// Whether the context holds the first (last) layer: it reads the embedded rows (ends
    /// with the head).
    pub fn first(&self) -> bool {
        self.layers[0] == 0
    }

    pub fn last(&self, n_layers: u32) -> bool {
        self.layers[1] == n_layers
    }
}

/// The executable of planned graph `graph`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuGraph {
    pub graph: u32,
    /// Its name inside the context.
    pub name: String,
    pub inputs: Vec<NpuTensor>,
    pub outputs: Vec<NpuTensor>,
}

/// One input or output: QNN's tensor id and name, what it holds, its element type and shape,
/// and its descriptor: where it lives in the I/O allocation ([`IoLayout`]), in bytes.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuTensor {
    pub id: u32,
    pub name: String,
    pub role: Role,
    pub dtype: NpuDType,
    pub dims: Vec<u32>,
    pub offset: u64,
}

impl NpuTensor {
    pub fn bytes(&self) -> u64 {
        self.dims.iter().map(|&d| d as u64).product::<u64>() * self.dtype.bytes()
    }
}

/// The one allocation every executable's inputs and outputs live in (on a phone one shared
/// buffer registered once, a descriptor per tensor at its offset, as ExecuTorch's QNN runtime
/// does): the KV cache first (the window's KV planes, in their layout), then one region per
/// kind of boundary tensor, each sized for the largest graph; a smaller graph's tensor uses
/// the start of its region.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct IoLayout {
    pub bytes: u64,
    pub regions: Vec<IoRegion>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoRegion {
    pub kind: IoKind,
    pub offset: u64,
    pub bytes: u64,
}

/// What a region of the I/O allocation holds.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    /// Every layer's key and value planes, `[kv_heads, C, head_dim]` each, layer-major.
    Kv,
    Hidden,
    HiddenOut,
    Cos,
    Sin,
    Mask,
    HeadIndex,
    /// Every layer's new key and value planes, `[kv_heads, R, head_dim]` each, layer-major.
    NewKv,
    Logits,
}

/// Alignment of every region (a cache line; rpcmem allocations are page-aligned).
pub const IO_ALIGN: u64 = 64;

impl IoLayout {
    /// The layout the plan of `h` calls for.
    pub fn of(h: &Header) -> IoLayout {
        let m = &h.model;
        let n = m.n_layers as u64;
        let largest = |role: Role| h.graphs.iter().map(|g| role_bytes(h, role, g.rows, g.head_rows)).max().unwrap_or(0);
        let sizes = [
            (IoKind::Kv, h.plan.window.kv.bytes),
            (IoKind::Hidden, largest(Role::Hidden)),
            (IoKind::HiddenOut, largest(Role::HiddenOut)),
            (IoKind::Cos, largest(Role::Cos)),
            (IoKind::Sin, largest(Role::Sin)),
            (IoKind::Mask, largest(Role::Mask)),
            (IoKind::HeadIndex, largest(Role::HeadIndex)),
            (IoKind::NewKv, 2 * n * largest(Role::KNew(0))),
            (IoKind::Logits, largest(Role::Logits)),
        ];
        let mut offset = 0;
        let mut regions = Vec::new();
        for (kind, bytes) in sizes {
            regions.push(IoRegion { kind, offset, bytes });
            offset = (offset + bytes).div_ceil(IO_ALIGN) * IO_ALIGN;
        }
        IoLayout { bytes: offset, regions }
    }

    pub fn region(&self, kind: IoKind) -> Option<&IoRegion> {
        self.regions.iter().find(|r| r.kind == kind)
    }

    /// Where the tensor of `role` in a graph of `rows` rows lives: its offset in the
    /// allocation.
    pub fn offset(&self, h: &Header, role: Role, rows: u32) -> Option<u64> {
        let m = &h.model;
        let kv_plane = m.n_kv_heads as u64 * h.plan.kv_capacity as u64 * m.head_dim as u64 * 2;
        let new_plane = m.n_kv_heads as u64 * rows as u64 * m.head_dim as u64 * 2;
        let (kind, within) = match role {
            Role::Hidden => (IoKind::Hidden, 0),
            Role::HiddenOut => (IoKind::HiddenOut, 0),
            Role::Cos => (IoKind::Cos, 0),
            Role::Sin => (IoKind::Sin, 0),
            Role::Mask => (IoKind::Mask, 0),
            Role::HeadIndex => (IoKind::HeadIndex, 0),
            Role::KCache(l) => (IoKind::Kv, 2 * l as u64 * kv_plane),
            Role::VCache(l) => (IoKind::Kv, (2 * l as u64 + 1) * kv_plane),
            Role::KNew(l) => (IoKind::NewKv, 2 * l as u64 * new_plane),
            Role::VNew(l) => (IoKind::NewKv, (2 * l as u64 + 1) * new_plane),
            Role::Logits => (IoKind::Logits, 0),
        };
        Some(self.region(kind)?.offset + within)
    }
}

fn role_bytes(h: &Header, role: Role, rows: u32, head_rows: u32) -> u64 {
    role.dims(h, rows, head_rows).iter().map(|&d| d as u64).product::<u64>() * role.dtype().bytes()
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuDType {
    F16,
    I32,
}

impl NpuDType {
    pub fn bytes(self) -> u64 {
        match self {
            NpuDType::F16 => 2,
            NpuDType::I32 => 4,
        }
    }
}

/// What an input or output holds, so the runtime binds it without names. R is the graph's
/// rows, C the KV capacity, H its head rows, G the query heads per KV head.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `[R, d_model]` f16: the rows' hidden states before the context's first layer (the
    /// embedded rows in the first context: the host runs the embedding).
    Hidden,
    /// `[R, d_model]` f16: the rows' hidden states after the context's last layer, output of
    /// every context but the last (the next one's `Hidden`).
    HiddenOut,
    /// `[R, 1, head_dim / 2]` f16: the rotary tables at each row's position.
    Cos,
    Sin,
    /// `[G * R, C + R]` f16: 0 where a query row may attend to a key (the cache's positions,
    /// then the graph's own rows), [`MASKED`] elsewhere; the rows of each KV head's group of
    /// query heads repeat it G times.
    Mask,
    /// `[H]` i32: the rows whose logits are wanted (padded with row 0).
    HeadIndex,
    /// `[kv_heads, C, head_dim]` f16: layer's cached keys (values), the window's KV planes.
    KCache(u32),
    VCache(u32),
    /// `[kv_heads, R, head_dim]` f16: the layer's keys (values) of the graph's rows, output.
    KNew(u32),
    VNew(u32),
    /// `[H, embedding_size]` f16: the logits of the head rows, output.
    Logits,
}

impl Role {
    /// The shape this role has in a graph of `rows` rows and `head_rows` head rows.
    pub fn dims(self, h: &Header, rows: u32, head_rows: u32) -> Vec<u32> {
        let m = &h.model;
        let (c, hd, kvh) = (h.plan.kv_capacity, m.head_dim, m.n_kv_heads);
        let group = m.n_heads / m.n_kv_heads.max(1);
        match self {
            Role::Hidden | Role::HiddenOut => vec![rows, m.d_model],
            Role::Cos | Role::Sin => vec![rows, 1, hd / 2],
            Role::Mask => vec![group * rows, c + rows],
            Role::HeadIndex => vec![head_rows],
            Role::KCache(_) | Role::VCache(_) => vec![kvh, c, hd],
            Role::KNew(_) | Role::VNew(_) => vec![kvh, rows, hd],
            Role::Logits => vec![head_rows, m.embedding_size],
        }
    }

    pub fn dtype(self) -> NpuDType {
        match self {
            Role::HeadIndex => NpuDType::I32,
            _ => NpuDType::F16,
        }
    }

    /// The roles, inputs then outputs, of an executable of layers `layers[0]..layers[1]` of a
    /// model with `n_layers` layers.
    pub fn expected(layers: [u32; 2], n_layers: u32) -> (Vec<Role>, Vec<Role>) {
        let last = layers[1] == n_layers;
        let mut inputs = vec![Role::Hidden, Role::Cos, Role::Sin, Role::Mask];
        let mut outputs = vec![if last { Role::Logits } else { Role::HiddenOut }];
        if last {
            inputs.push(Role::HeadIndex);
        }
        for l in layers[0]..layers[1] {
            inputs.extend([Role::KCache(l), Role::VCache(l)]);
            outputs.extend([Role::KNew(l), Role::VNew(l)]);
        }
        (inputs, outputs)
    }
}

impl NpuSection {
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a section always encodes")
    }

    /// The section of a header, if it has one.
    pub fn of(h: &Header) -> Result<Option<NpuSection>> {
        let Some(e) = h.extensions.iter().find(|e| e.key == EXTENSION_KEY) else {
            return Ok(None);
        };
        // The version first: an older section's fields do not decode as this one's.
        let (version, _) = postcard::take_from_bytes::<u32>(&e.bytes).map_err(|err| Error::invalid(format!("extension '{EXTENSION_KEY}' does not decode: {err}")))?;
        if version != SECTION_VERSION {
            return Err(Error::invalid(format!("extension '{EXTENSION_KEY}': section version {version} is not the {SECTION_VERSION} this runtime reads; compile the artifact again")));
        }
        let s: NpuSection = postcard::from_bytes(&e.bytes).map_err(|err| Error::invalid(format!("extension '{EXTENSION_KEY}' does not decode: {err}")))?;
        Ok(Some(s))
    }

    /// Checks the section against the header it sits in: its version and SoC, the window's
    /// room for the contexts, every context's segment, size and layers (in order, covering
    /// the model), every executable's graph (each planned graph exactly once per context) and
    /// its I/O table against the plan's shapes, and that the resident contexts leave room for
    /// the rotating ones. Errors name the element.
    pub fn verify(&self, h: &Header) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid(format!("extension '{EXTENSION_KEY}': {msg}")));
        if self.version != SECTION_VERSION {
            return bad(format!("section version {} is not the {SECTION_VERSION} this runtime reads", self.version));
        }
        match SOCS.iter().find(|(name, _, _)| *name == self.soc) {
            Some(&(_, id, _)) if id == self.soc_id => {}
            Some(&(_, id, _)) => return bad(format!("soc '{}' is QNN socModel {id}, not {}", self.soc, self.soc_id)),
            None => return bad(format!("soc '{}' is none of {}", self.soc, SOCS.map(|s| s.0).join(", "))),
        }
        if h.model.moe.is_some() {
            return bad("a mixture-of-experts model has no NPU executables (its experts run on the CPU path)".into());
        }
        let layout = IoLayout::of(h);
        if self.io.bytes != layout.bytes {
            return bad(format!("io: the I/O allocation is {} bytes; the plan's is {}", self.io.bytes, layout.bytes));
        }
        for (i, (have, want)) in self.io.regions.iter().zip(&layout.regions).enumerate() {
            if have != want {
                return bad(format!("io.regions[{i}]: {:?} at {} ({} bytes); the plan places {:?} at {} ({} bytes)", have.kind, have.offset, have.bytes, want.kind, want.offset, want.bytes));
            }
        }
        if self.io.regions.len() != layout.regions.len() {
            return bad(format!("io: {} regions where the plan has {}", self.io.regions.len(), layout.regions.len()));
        }
        let (n, w) = (h.model.n_layers, &h.plan.window);
        if layout.bytes.saturating_add(self.context_budget) > w.bytes {
            return bad(format!(
                "context_budget {} plus the I/O allocation ({} bytes: the KV cache and the largest pass's inputs and outputs) exceeds the {}-byte window",
                self.context_budget, layout.bytes, w.bytes
            ));
        }
        let mut segments = std::collections::HashSet::new();
        let mut next_layer = 0;
        let (mut resident, mut rotating) = (0u64, 0u64);
        for (ci, c) in self.contexts.iter().enumerate() {
            let at = format!("contexts[{ci}]");
            let Some(seg) = h.segments.get(c.segment as usize) else {
                return bad(format!("{at}: segment {} does not exist", c.segment));
            };
            if seg.nbytes == 0 || !segments.insert(c.segment) {
                return bad(format!("{at}: segment '{}' is empty or holds another context too", seg.name));
            }
            if w.resident.iter().any(|r| r.segment == c.segment) || w.rotating.contains(&c.segment) || w.host.contains(&c.segment) {
                return bad(format!("{at}: segment '{}' also has a home in the window", seg.name));
            }
            if c.layers[0] != next_layer || c.layers[1] <= c.layers[0] || c.layers[1] > n {
                return bad(format!("{at}: layers {}..{} do not continue the contexts before it (layer {next_layer} next, of {n})", c.layers[0], c.layers[1]));
            }
            next_layer = c.layers[1];
            if seg.nbytes > self.context_budget {
                return bad(format!("{at}: its {} bytes exceed the context_budget of {} bytes", seg.nbytes, self.context_budget));
            }
            if c.resident {
                resident += seg.nbytes;
            } else {
                rotating = rotating.max(seg.nbytes);
            }
            let mut seen = vec![false; h.graphs.len()];
            for (gi, g) in c.graphs.iter().enumerate() {
                let at = format!("{at}.graphs[{gi}] '{}'", g.name);
                let Some(planned) = h.graphs.get(g.graph as usize) else {
                    return bad(format!("{at}: planned graph {} does not exist", g.graph));
                };
                if std::mem::replace(&mut seen[g.graph as usize], true) {
                    return bad(format!("{at}: planned graph {} has two executables in this context", g.graph));
                }
                let (inputs, outputs) = Role::expected(c.layers, n);
                for (what, table, roles) in [("inputs", &g.inputs, inputs), ("outputs", &g.outputs, outputs)] {
                    if table.len() != roles.len() {
                        return bad(format!("{at}: {} {what} where the plan has {}", table.len(), roles.len()));
                    }
                    for (t, role) in table.iter().zip(roles) {
                        let want = role.dims(h, planned.rows, planned.head_rows);
                        if t.role != role || t.dtype != role.dtype() || t.dims != want {
                            return bad(format!(
                                "{at}: {what} '{}' is {:?} {:?} {:?}; the plan's graph '{}' ({} rows, {} head rows) needs {role:?} {:?} {want:?}",
                                t.name, t.role, t.dtype, t.dims, planned.name, planned.rows, planned.head_rows, role.dtype()
                            ));
                        }
                        // Its descriptor: the plan's offset, inside its region.
                        let offset = layout.offset(h, role, planned.rows).expect("every role has a region");
                        if t.offset != offset {
                            return bad(format!("{at}: {what} '{}' has its descriptor at offset {} of the I/O allocation; the plan places it at {offset}", t.name, t.offset));
                        }
                    }
                }
            }
            if let Some(missing) = seen.iter().position(|s| !s) {
                return bad(format!("{at}: planned graph {missing} '{}' has no executable", h.graphs[missing].name));
            }
        }
        if next_layer != n {
            return bad(format!("the contexts hold layers 0..{next_layer} of the model's {n}"));
        }
        for (i, e) in self.estimates.iter().enumerate() {
            if e.graph as usize >= h.graphs.len() || !self.contexts.iter().any(|c| c.layers == e.layers) {
                return bad(format!("estimates[{i}]: graph {} with layers {}..{} is no executable of the section", e.graph, e.layers[0], e.layers[1]));
            }
        }
        self.verify_activations(h)?;
        if resident.saturating_add(rotating) > self.context_budget {
            return bad(format!(
                "the resident contexts ({resident} bytes) and the largest rotating one ({rotating} bytes) exceed the context_budget of {} bytes",
                self.context_budget
            ));
        }
        Ok(())
    }
}

impl NpuSection {
    /// Fixed-point activations: exactly one finite range, holding zero, for each matmul
    /// weight of the plan when the format needs them; none otherwise.
    fn verify_activations(&self, h: &Header) -> Result<()> {
        let bad = |msg: String| Err(Error::invalid(format!("extension '{EXTENSION_KEY}': {msg}")));
        let needed = matches!(self.weights, NpuWeights::Int4Lpbq { .. });
        if !needed {
            return match self.activations.first() {
                Some(a) => bad(format!("activations[0] (weight {}): {} weights have fp16 activations, no encodings", a.weight, self.weights.name())),
                None => Ok(()),
            };
        }
        let mut matmuls: Vec<crate::TensorId> = h.graphs.iter().flat_map(|g| g.ops.iter()).filter_map(|op| match *op { crate::Op::MatMul { weight, .. } => Some(weight), _ => None }).collect();
        matmuls.sort_unstable();
        matmuls.dedup();
        let mut seen = std::collections::HashSet::new();
        for (i, a) in self.activations.iter().enumerate() {
            let name = h.tensors.get(a.weight as usize).map_or("?", |t| t.name.as_str());
            let at = format!("activations[{i}] (weight {} '{name}')", a.weight);
            if matmuls.binary_search(&a.weight).is_err() || !seen.insert(a.weight) {
                return bad(format!("{at}: not a matmul weight of the plan, or listed twice"));
            }
            for (what, r) in [("input", a.input), ("output", a.output)] {
                if !(r[0].is_finite() && r[1].is_finite() && r[0] <= 0.0 && r[1] >= 0.0) {
                    return bad(format!("{at}: {what} range [{}, {}] is not a finite range holding zero", r[0], r[1]));
                }
            }
        }
        if let Some(&missing) = matmuls.iter().find(|w| !seen.contains(*w)) {
            return bad(format!("matmul weight {missing} '{}' has no activation range", h.tensors[missing as usize].name));
        }
        Ok(())
    }
}
