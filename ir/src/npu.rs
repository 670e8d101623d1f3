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
pub const SECTION_VERSION: u32 = 3;
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
    /// Bytes of the NPU window the contexts may occupy at once: the window less the KV cache
    /// and the largest pass's inputs and outputs ([`io_bytes`]).
    pub context_budget: u64,
    /// In layer order.
    pub contexts: Vec<NpuContext>,
}

/// The matmul weights' format inside the executables: what the HTP computes natively with
/// fp16 activations (QNN.md's table; block-scaled int4 needs 16-bit activations, not built).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuWeights {
    F16,
    /// Signed int8, one scale per output channel (symmetric).
    Int8PerChannel,
    /// Signed int4 in an int8 container, one scale per output channel (symmetric).
    Int4PerChannel,
}

impl NpuWeights {
    pub fn name(self) -> &'static str {
        match self {
            NpuWeights::F16 => "fp16",
            NpuWeights::Int8PerChannel => "int8 per output channel",
            NpuWeights::Int4PerChannel => "int4 per output channel",
        }
    }
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

/// One input or output: QNN's tensor id and name, what it holds, its element type and shape.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuTensor {
    pub id: u32,
    pub name: String,
    pub role: Role,
    pub dtype: NpuDType,
    pub dims: Vec<u32>,
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

/// Bytes of the inputs and outputs of the largest pass, besides the KV cache they bind in
/// place: the hidden states in and out, rotary rows, mask, head-row indices, every layer's new
/// keys and values, and the logits. A phone registers them in the NPU's window beside the
/// cache, so they come out of what the contexts may use.
pub fn io_bytes(h: &Header) -> u64 {
    let n = h.model.n_layers;
    let (inputs, mut outputs) = Role::expected([0, n], n);
    outputs.push(Role::HiddenOut);
    h.graphs
        .iter()
        .map(|g| {
            inputs
                .iter()
                .chain(&outputs)
                .filter(|r| !matches!(r, Role::KCache(_) | Role::VCache(_)))
                .map(|r| r.dims(h, g.rows, g.head_rows).iter().map(|&d| d as u64).product::<u64>() * r.dtype().bytes())
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
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
        let n = h.model.n_layers;
        let w = &h.plan.window;
        let need = w.kv.bytes.saturating_add(io_bytes(h)).saturating_add(self.context_budget);
        if need > w.bytes {
            return bad(format!(
                "context_budget {} plus the KV cache ({} bytes) and the largest pass's I/O ({} bytes) exceeds the {}-byte window",
                self.context_budget,
                w.kv.bytes,
                io_bytes(h),
                w.bytes
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
        if resident.saturating_add(rotating) > self.context_budget {
            return bad(format!(
                "the resident contexts ({resident} bytes) and the largest rotating one ({rotating} bytes) exceed the context_budget of {} bytes",
                self.context_budget
            ));
        }
        Ok(())
    }
}
