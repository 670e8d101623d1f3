//! Backend executables: graphs a backend compiled ahead of time (QNN context binaries for
//! Qualcomm's HTP), as IREE keeps per-backend executables and ExecuTorch delegate blobs. A
//! versioned section in the header's extensions (key [`EXTENSION_KEY`]); each context's binary
//! is a segment of the data section, which no window region holds (QNN maps it itself).
//!
//! A planned graph's executable computes what its op list computes, from the boundary the
//! compiler recorded: the host embeds the token rows ([`Role::Hidden`] is the embedding's
//! output), and the executable runs every op after it. Its inputs and outputs, by role:
//! the rows' hidden states, their rotary tables and attention mask, the head-row indices, each
//! layer's KV cache (bound to the window's KV planes), each layer's new keys and values (which
//! the runtime stores into the cache for the rows the run stores), and the logits.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::header::Header;

/// The extension key of the section.
pub const EXTENSION_KEY: &str = "npu.qnn";
/// The section's own version: a reader refuses any other.
pub const SECTION_VERSION: u32 = 2;
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

/// One context binary and the graphs it holds.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuContext {
    /// The segment holding the binary.
    pub segment: u32,
    /// CRC-32 of the binary (checked when a session creates the context).
    pub crc32: u32,
    pub graphs: Vec<NpuGraph>,
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
    /// `[R, d_model]` f16: the embedded rows (the host runs the embedding).
    Hidden,
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
            Role::Hidden => vec![rows, m.d_model],
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

    /// The roles every executable of a model with `layers` layers has, inputs then outputs.
    pub fn expected(layers: u32) -> (Vec<Role>, Vec<Role>) {
        let mut inputs = vec![Role::Hidden, Role::Cos, Role::Sin, Role::Mask, Role::HeadIndex];
        let mut outputs = vec![Role::Logits];
        for l in 0..layers {
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

    /// Checks the section against the header it sits in: its version and SoC, every
    /// context's segment, every executable's graph (each planned graph exactly once) and its
    /// I/O table against the plan's shapes. Errors name the element.
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
        let mut seen = vec![false; h.graphs.len()];
        let mut segments = std::collections::HashSet::new();
        for (ci, c) in self.contexts.iter().enumerate() {
            let at = format!("contexts[{ci}]");
            let Some(seg) = h.segments.get(c.segment as usize) else {
                return bad(format!("{at}: segment {} does not exist", c.segment));
            };
            if seg.nbytes == 0 || !segments.insert(c.segment) {
                return bad(format!("{at}: segment '{}' is empty or holds another context too", seg.name));
            }
            let w = &h.plan.window;
            if w.resident.iter().any(|r| r.segment == c.segment) || w.rotating.contains(&c.segment) || w.host.contains(&c.segment) {
                return bad(format!("{at}: segment '{}' also has a home in the window", seg.name));
            }
            if c.graphs.is_empty() {
                return bad(format!("{at} holds no graph"));
            }
            for (gi, g) in c.graphs.iter().enumerate() {
                let at = format!("{at}.graphs[{gi}] '{}'", g.name);
                let Some(planned) = h.graphs.get(g.graph as usize) else {
                    return bad(format!("{at}: planned graph {} does not exist", g.graph));
                };
                if std::mem::replace(&mut seen[g.graph as usize], true) {
                    return bad(format!("{at}: planned graph {} has two executables", g.graph));
                }
                let (inputs, outputs) = Role::expected(h.model.n_layers);
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
        }
        if let Some(missing) = seen.iter().position(|s| !s) {
            return bad(format!("planned graph {missing} '{}' has no executable", h.graphs[missing].name));
        }
        Ok(())
    }
}
