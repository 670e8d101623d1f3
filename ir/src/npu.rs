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
//! A mixture-of-experts model's routers and routed experts run on the host: each planned
//! graph's ops in a context are cut at them into pieces ([`pieces`]), an executable each,
//! whose boundary roles ([`piece_roles`]) carry the residual stream, the experts' input, the
//! router's logits and the experts' sum across the host's ops.
//!
//! Residency, planned against the HTP's limits ([`NpuLimits`], QNN.md "Residency, load cost
//! and speed on a phone"): every context and the I/O allocation is one mapping of at most
//! `mapping_bytes`; the contexts spread over the HTP sessions (process domains) the phone
//! grants, each session mapping its contexts, the I/O its executables bind and one spill-fill
//! buffer its contexts share (QNN's `REGISTER_MULTI_CONTEXTS`) within `session_bytes`. Where
//! they all fit, every context is `resident`: created once at session open. Only where they
//! do not (a phone granting one session to a model that needs two) do the contexts of the
//! last session rotate through what is left of [`NpuSection::context_budget`], created before
//! their layers run and freed after (the swap schedule of the contexts).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use std::ops::Range;

use crate::header::Header;
use crate::{Graph, Op, ValueId};

/// The extension key of the section.
pub const EXTENSION_KEY: &str = "npu.qnn";
/// The section's own version: a reader refuses any other.
pub const SECTION_VERSION: u32 = 8;
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
    /// The HTP's limits the contexts were planned against (the target's, or the compile's).
    pub limits: NpuLimits,
    /// The HTP sessions the contexts spread over, in order (a context's `session` indexes it).
    pub sessions: Vec<NpuSession>,
    /// Bytes of contexts that may be created at once: all of them where every one is
    /// resident; else the resident ones and the room the last session leaves its rotating ones.
    pub context_budget: u64,
    /// Where every executable's inputs and outputs live ([`IoLayout::of`] the plan).
    pub io: IoLayout,
    /// The cache lengths the executables' attention is built for, ascending, the KV capacity
    /// last (Genie's context-length variants): each executable with attention exists once
    /// per length, reading that many cached positions; a pass runs the smallest that holds
    /// its keys ([`cache_len_for`]).
    pub cache_lens: Vec<u32>,
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
    /// Whether the executables' matmuls take 16-bit fixed-point activations: then the LM
    /// head's weights are int8 per output channel (the HTP's fast form for it: LPBQ's 4-bit
    /// factors would be expanded on its vector unit every pass) and the logits leave the
    /// executable as uint16 in the head's output encoding, which the host dequantizes
    /// ([`NpuSection::logits_encoding`]).
    pub fn fixed_point(self) -> bool {
        matches!(self, NpuWeights::Int4Lpbq { .. })
    }

    pub fn name(self) -> &'static str {
        match self {
            NpuWeights::F16 => "fp16",
            NpuWeights::Int8PerChannel => "int8 per output channel",
            NpuWeights::Int4PerChannel => "int4 per output channel",
            NpuWeights::Int4Lpbq { .. } => "int4 per block (LPBQ)",
        }
    }
}

/// What a phone's HTP maps (QNN.md): each context and the I/O allocation is one mapping of at
/// most `mapping_bytes`; one session maps at most `session_bytes`; a phone grants `sessions`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpuLimits {
    pub mapping_bytes: u64,
    pub session_bytes: u64,
    pub sessions: u32,
}

/// One HTP session of the plan: besides its contexts, the bytes of the I/O allocation its
/// executables bind ([`IoLayout::bound_bytes`]) and the one spill-fill buffer they share, the
/// largest any of its contexts needs.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct NpuSession {
    pub io_bytes: u64,
    pub spill_fill_bytes: u64,
}

/// QNN's estimate of one executable (planned graph `graph`, the context of layers `layers`)
/// prepared for SoC id `soc_id`: its simulated cycles and microseconds (point estimates).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuEstimate {
    pub graph: u32,
    pub layers: [u32; 2],
    /// The cache length of the executables estimated.
    pub cache_len: u32,
    pub soc_id: u32,
    pub cycles: u64,
    pub micros: u64,
    /// QNN's op trace of it grouped by kind (empty where the library gave no trace).
    pub groups: Vec<NpuOpGroup>,
}

/// What ops of one kind cost in QNN's op trace of an executable: the microseconds they kept
/// their units busy (HVX threads summed, so groups overlap each other and the DMA), and how
/// many ops QNN scheduled.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct NpuOpGroup {
    pub kind: NpuOpKind,
    pub busy_micros: f64,
    pub ops: u32,
}

/// The kinds QNN's traced ops are grouped in.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuOpKind {
    /// The weights' DMA from DRAM into VTCM.
    WeightRead,
    /// The linears' products, and their weights' unpacking.
    Matmul,
    /// Attention's products (over keys and values packed as dynamic weights) and softmax.
    Attention,
    Norm,
    Rope,
    /// SwiGLU's gates, residual adds and the like.
    Elementwise,
    /// Conversions between fp16 and 16-bit fixed point.
    Quantize,
    /// Layout changes, slices, concatenations, inputs and outputs moved.
    DataMovement,
    /// Intermediates that VTCM does not hold, spilled to DRAM and filled back.
    SpillFill,
    Other,
}

impl NpuOpKind {
    pub fn name(self) -> &'static str {
        match self {
            NpuOpKind::WeightRead => "weight reads (DMA)",
            NpuOpKind::Matmul => "matmuls",
            NpuOpKind::Attention => "attention",
            NpuOpKind::Norm => "norms",
            NpuOpKind::Rope => "RoPE",
            NpuOpKind::Elementwise => "elementwise",
            NpuOpKind::Quantize => "quantize/dequantize",
            NpuOpKind::DataMovement => "data movement",
            NpuOpKind::SpillFill => "spill-fill (DMA)",
            NpuOpKind::Other => "other",
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
    /// The HTP session it lives in ([`NpuSection::sessions`]).
    pub session: u32,
    /// The spill-fill buffer its executables need (what the binary says of itself).
    pub spill_fill_bytes: u64,
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

/// An executable of planned graph `graph`: its ops `ops[0]..ops[1]` over `cache_len` cached
/// positions. A context holds one per planned graph and cache length, or for a
/// mixture-of-experts model one per piece between the host's routing and routed experts
/// ([`pieces`]) and cache length, in op order.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct NpuGraph {
    pub graph: u32,
    pub ops: [u32; 2],
    /// The cached positions its attention reads (one of the section's `cache_lens`); 0 for an
    /// executable without attention (a mixture-of-experts piece after the host's experts),
    /// which every cache length shares.
    pub cache_len: u32,
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
    LogitIndex,
    /// Every layer's new key and value planes, `[kv_heads, R, head_dim]` each, layer-major.
    NewKv,
    Logits,
    ExpertIn,
    RouterLogits,
    ExpertOut,
    SharedIn,
    Positions,
    SoftIn,
    /// One [`Role::WindowMask`] per window of the model's windowed attention
    /// ([`attention_windows`]), each in a slot sized for the largest graph.
    WindowMasks,
}

impl IoKind {
    /// The regions in the order the allocation lays them out.
    pub const ORDER: [IoKind; 16] = [
        IoKind::Kv,
        IoKind::Hidden,
        IoKind::HiddenOut,
        IoKind::Cos,
        IoKind::Sin,
        IoKind::Mask,
        IoKind::LogitIndex,
        IoKind::NewKv,
        IoKind::Logits,
        IoKind::ExpertIn,
        IoKind::RouterLogits,
        IoKind::ExpertOut,
        IoKind::SharedIn,
        IoKind::Positions,
        IoKind::SoftIn,
        IoKind::WindowMasks,
    ];

    /// The one role whose tensor this region holds, at its start, sized for the largest
    /// graph; `None` for the regions of many tensors (every layer's KV planes, every window's
    /// mask).
    pub fn whole_role(self) -> Option<Role> {
        Some(match self {
            IoKind::Kv | IoKind::NewKv | IoKind::WindowMasks => return None,
            IoKind::Hidden => Role::Hidden,
            IoKind::HiddenOut => Role::HiddenOut,
            IoKind::Cos => Role::Cos,
            IoKind::Sin => Role::Sin,
            IoKind::Mask => Role::Mask,
            IoKind::LogitIndex => Role::LogitIndex,
            IoKind::Logits => Role::Logits,
            IoKind::ExpertIn => Role::ExpertIn,
            IoKind::RouterLogits => Role::RouterLogits,
            IoKind::ExpertOut => Role::ExpertOut,
            IoKind::SharedIn => Role::SharedIn,
            IoKind::Positions => Role::Positions,
            IoKind::SoftIn => Role::SoftIn,
        })
    }
}

/// Alignment of every region (a cache line; rpcmem allocations are page-aligned).
pub const IO_ALIGN: u64 = 64;

impl IoLayout {
    /// The layout the plan of `h` calls for.
    pub fn of(h: &Header) -> IoLayout {
        let m = &h.model;
        let n = m.n_layers as u64;
        let largest = |role: Role| h.graphs.iter().map(|g| role_bytes(h, role, g.rows, g.logit_rows)).max().unwrap_or(0);
        let sizes = IoKind::ORDER.map(|kind| {
            let bytes = match kind {
                IoKind::Kv => h.plan.window.kv.bytes,
                IoKind::NewKv => 2 * n * new_plane_bytes(h, h.graphs.iter().map(|g| g.rows).max().unwrap_or(0)),
                IoKind::WindowMasks => attention_windows(h).len() as u64 * window_mask_slot(h),
                _ => kind.whole_role().map_or(0, largest),
            };
            (kind, bytes)
        });
        let mut offset = 0;
        let mut regions = Vec::new();
        for (kind, bytes) in sizes {
            regions.push(IoRegion { kind, offset, bytes });
            offset = (offset + bytes).div_ceil(IO_ALIGN) * IO_ALIGN;
        }
        IoLayout { bytes: offset, regions }
    }

    /// Bytes of the allocation the executables of layers `layers` bind: every boundary region
    /// and those layers' key and value planes, cached and new (layer-major in their regions).
    pub fn bound_bytes(&self, h: &Header, layers: [u32; 2]) -> u64 {
        let n = h.model.n_layers.max(1) as u64;
        let share = layers[1].saturating_sub(layers[0]) as u64;
        self.regions
            .iter()
            .map(|r| match r.kind {
                IoKind::Kv | IoKind::NewKv => r.bytes / n * share,
                _ => r.bytes,
            })
            .sum()
    }

    pub fn region(&self, kind: IoKind) -> Option<&IoRegion> {
        self.regions.iter().find(|r| r.kind == kind)
    }

    /// Where the tensor of `role` in a graph of `rows` rows lives: its offset in the
    /// allocation.
    pub fn offset(&self, h: &Header, role: Role, rows: u32) -> Option<u64> {
        let m = &h.model;
        // Each layer's slot holds the model's kv heads of its head_dim; a layer with other
        // heads (verified to fit) keeps its values right after its keys, as the host's cache.
        let kv_plane = m.n_kv_heads as u64 * h.plan.kv_capacity as u64 * m.head_dim as u64 * 2;
        let new_plane = new_plane_bytes(h, rows);
        let keys_bytes = |l: u32| {
            let (kvh, hd) = layer_heads(h, l);
            kvh as u64 * h.plan.kv_capacity as u64 * hd as u64 * 2
        };
        let (kind, within) = match role {
            Role::KCache(l) => (IoKind::Kv, 2 * l as u64 * kv_plane),
            Role::VCache(l) => (IoKind::Kv, 2 * l as u64 * kv_plane + keys_bytes(l)),
            Role::KNew(l) => (IoKind::NewKv, 2 * l as u64 * new_plane),
            Role::VNew(l) => (IoKind::NewKv, (2 * l as u64 + 1) * new_plane),
            Role::WindowMask(w) => (IoKind::WindowMasks, attention_windows(h).iter().position(|&x| x == w)? as u64 * window_mask_slot(h)),
            _ => (IoKind::ORDER.into_iter().find(|k| k.whole_role() == Some(role))?, 0),
        };
        Some(self.region(kind)?.offset + within)
    }
}

/// Bytes of one layer's slot of new keys (or values) in a graph of `rows` rows: the model's
/// kv heads of its head_dim each.
fn new_plane_bytes(h: &Header, rows: u32) -> u64 {
    h.model.n_kv_heads as u64 * rows as u64 * h.model.head_dim as u64 * 2
}

/// Layer `layer`'s kv heads and head width: its attention op's (a `WindowAttention` has its
/// own), the model's where no graph has one.
pub fn layer_heads(h: &Header, layer: u32) -> (u32, u32) {
    let own = h.graphs.first().and_then(|g| {
        g.ops.iter().find_map(|o| match *o {
            Op::WindowAttention { kv_heads, head_dim, layer: l, .. } if l == layer => Some((kv_heads, head_dim)),
            _ => None,
        })
    });
    own.unwrap_or((h.model.n_kv_heads, h.model.head_dim))
}

/// The windows of the model's windowed attention ([`Role::WindowMask`]'s), ascending; 0 for
/// a `WindowAttention` without one.
pub fn attention_windows(h: &Header) -> Vec<u32> {
    let mut windows: Vec<u32> = h.graphs.iter().flat_map(|g| g.ops.iter()).filter_map(|o| if let Op::WindowAttention { window, .. } = *o { Some(window.unwrap_or(0)) } else { None }).collect();
    windows.sort_unstable();
    windows.dedup();
    windows
}

/// Bytes of one window's mask slot: the largest graph's mask at the longest cache length.
fn window_mask_slot(h: &Header) -> u64 {
    h.graphs.iter().map(|g| role_bytes(h, Role::WindowMask(0), g.rows, g.logit_rows)).max().unwrap_or(0)
}

fn role_bytes(h: &Header, role: Role, rows: u32, logit_rows: u32) -> u64 {
    // Every format gives a role elements of the same width (fp16 or uint16 logits alike).
    // Sized for the longest cache length: the capacity.
    role.dims(h, rows, logit_rows, h.plan.kv_capacity).iter().map(|&d| d as u64).product::<u64>() * role.dtype(NpuWeights::F16).bytes()
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NpuDType {
    F16,
    I32,
    /// Unsigned 16-bit fixed point in a static encoding (the logits of a fixed-point format).
    U16,
}

impl NpuDType {
    pub fn bytes(self) -> u64 {
        match self {
            NpuDType::F16 | NpuDType::U16 => 2,
            NpuDType::I32 => 4,
        }
    }
}

/// What an input or output holds, so the runtime binds it without names. R is the graph's
/// rows, C the KV capacity, H its logit rows, G the query heads per KV head.
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
    /// `[G * R, L + R]` f16 (L the executable's cache length): 0 where a query row may attend
    /// to a key (the cache's first L positions, then the graph's own rows), [`MASKED`]
    /// elsewhere; the rows of each KV head's group of query heads repeat it G times.
    Mask,
    /// `[H]` i32: the rows whose logits are wanted (padded with row 0).
    LogitIndex,
    /// `[kv_heads, C, head_dim]` f16: layer's cached keys (values), the window's KV planes.
    KCache(u32),
    VCache(u32),
    /// `[kv_heads, R, head_dim]` f16: the layer's keys (values) of the graph's rows, output.
    KNew(u32),
    VNew(u32),
    /// `[H, embedding_size]` f16: the logits of the logit rows, output.
    Logits,
    /// `[R, d_model]` f16: an MoE layer's normed FFN input, output of the piece before the
    /// host's routing (the routed experts' input).
    ExpertIn,
    /// `[R, experts]` f16: the router's logits, output of the piece before the routing.
    RouterLogits,
    /// `[R, d_model]` f16: the routed experts' weighted sum the host computed, input of the
    /// piece after them.
    ExpertOut,
    /// `[R, d_model]` f16: the same rows as [`Role::ExpertIn`], input of the piece after the
    /// host's experts where it reads them (the shared expert); a region of its own, as an
    /// executable's input and output never share memory.
    SharedIn,
    /// `[R]` i32: each row's position, by which an executable gathers its rows' rotary angles
    /// from a table of its own (DiffusionGemma's `RopeHeads`: a table per kind of layer).
    Positions,
    /// `[R, d_model]` f16: DiffusionGemma's self-conditioning input (`Op::SoftEmbed`'s
    /// result), which the host computes before the first executable, as it embeds the rows.
    SoftIn,
    /// `[R, L + R]` f16: a `WindowAttention`'s additive mask for its window (0: none), as
    /// [`Role::Mask`] but with the keys before each row's window masked too, once for every
    /// query head (the executable broadcasts it over them).
    WindowMask(u32),
}

impl Role {
    /// The shape this role has in an executable of a graph of `rows` rows and `logit_rows`
    /// logit rows whose attention reads `cache_len` cached positions.
    pub fn dims(self, h: &Header, rows: u32, logit_rows: u32, cache_len: u32) -> Vec<u32> {
        let m = &h.model;
        let (c, hd) = (h.plan.kv_capacity, m.head_dim);
        let group = m.n_heads / m.n_kv_heads.max(1);
        let own = |l: u32| layer_heads(h, l);
        match self {
            Role::Hidden | Role::HiddenOut => vec![rows, m.d_model],
            Role::Cos | Role::Sin => vec![rows, 1, hd / 2],
            Role::Mask => vec![group * rows, cache_len + rows],
            Role::LogitIndex => vec![logit_rows],
            Role::WindowMask(_) => vec![rows, cache_len + rows],
            Role::KCache(l) | Role::VCache(l) => {
                let (kvh, hd) = own(l);
                vec![kvh, c, hd]
            }
            Role::KNew(l) | Role::VNew(l) => {
                let (kvh, hd) = own(l);
                vec![kvh, rows, hd]
            }
            Role::Logits => vec![logit_rows, m.embedding_size],
            Role::ExpertIn | Role::ExpertOut | Role::SharedIn => if m.moe.is_some() { vec![rows, m.d_model] } else { vec![0] },
            Role::RouterLogits => vec![rows, m.moe.map_or(0, |e| e.experts)],
            Role::Positions => vec![rows],
            Role::SoftIn => if m.family() == crate::header::Family::DiffusionGemma { vec![rows, m.d_model] } else { vec![0] },
        }
    }

    /// The element type of this role in executables holding `weights`.
    pub fn dtype(self, weights: NpuWeights) -> NpuDType {
        match self {
            Role::LogitIndex | Role::Positions => NpuDType::I32,
            Role::Logits if weights.fixed_point() => NpuDType::U16,
            _ => NpuDType::F16,
        }
    }
}

/// The cache length of `lens` (ascending) a pass whose rows attend to at most `keys` cached
/// positions runs: the smallest that holds them.
pub fn cache_len_for(lens: &[u32], keys: u32) -> u32 {
    lens.iter().copied().find(|&l| l >= keys).unwrap_or_else(|| lens.last().copied().unwrap_or(0))
}

/// Ops the host runs before a graph's first executable: the embedding, then DiffusionGemma's
/// self-conditioning product where it follows (both read the embedding table, which the plan
/// leaves in the artifact). Returns how many.
pub fn host_prefix(g: &Graph) -> usize {
    match g.ops.as_slice() {
        [Op::Embed { .. }, Op::SoftEmbed { .. }, ..] => 2,
        _ => 1,
    }
}

/// Whether `op` runs on the host between an MoE model's executables: the routers and the
/// routed experts, the program's CPU step (the router's projection and the shared expert are
/// dense ops).
pub fn host_op(op: &Op) -> bool {
    crate::program::is_moe_op(op)
}

/// The executables' op ranges within `ops` of planned graph `g`: `ops` cut at each run of
/// [`host_op`]s (a dense model's `ops` stay whole).
pub fn pieces(g: &Graph, ops: Range<usize>) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = ops.start;
    for i in ops.clone() {
        if host_op(&g.ops[i]) {
            if i > start {
                out.push(start..i);
            }
            start = i + 1;
        }
    }
    if start < ops.end || out.is_empty() {
        out.push(start..ops.end);
    }
    out
}

/// The host ops right before op `start` of `g` (the run a piece follows).
fn host_run_before(g: &Graph, start: usize) -> Range<usize> {
    let first = (0..start).rev().take_while(|&i| host_op(&g.ops[i])).last().unwrap_or(start);
    first..start
}

/// The host ops from op `end` of `g` on (the run a piece ending there precedes; empty where
/// none follows).
pub fn host_run_from(g: &Graph, end: usize) -> Range<usize> {
    end..(end..g.ops.len()).find(|&i| !host_op(&g.ops[i])).unwrap_or(g.ops.len())
}

/// The experts op of a run of host ops, if any.
fn experts_of(g: &Graph, run: Range<usize>) -> Option<(ValueId, ValueId)> {
    g.ops[run].iter().find_map(|o| if let Op::MoeExperts { x, out, .. } = *o { Some((x, out)) } else { None })
}

/// An executable's input or output: its role, and the value of the planned graph it binds
/// (none for the pass's tables and the KV cache).
pub type Bound = (Role, Option<ValueId>);

/// The roles, inputs then outputs, of the executable of ops `ops` of `g` (a piece,
/// [`pieces`]), and which value each binds: from what the ops read that they did not write
/// (the residual stream as [`Role::Hidden`]; after the host's experts their input and sum as
/// [`Role::SharedIn`] and [`Role::ExpertOut`]) and what later ops read (the residual as
/// [`Role::HiddenOut`], or the logits at the graph's end; before the host's routing its
/// input and the router's logits), with every attention layer's cache and new keys and
/// values. Errors name the value no role carries.
pub fn piece_roles(g: &Graph, ops: Range<usize>) -> std::result::Result<(Vec<Bound>, Vec<Bound>), String> {
    let Some(Op::Embed { out: residual, .. }) = g.ops.first() else {
        return Err(format!("graph '{}' does not start with the embedding", g.name));
    };
    let residual = *residual;
    let soft = match g.ops.get(1) {
        Some(Op::SoftEmbed { out, .. }) => Some(*out),
        _ => None,
    };
    let before = experts_of(g, host_run_before(g, ops.start));
    let after_run = host_run_from(g, ops.end);
    let mut written = std::collections::HashSet::new();
    let (mut reads_outside, mut uses) = (Vec::new(), [false; 4]);
    let (mut layers, mut windows) = (Vec::new(), Vec::new());
    for op in &g.ops[ops.clone()] {
        if host_op(op) || matches!(op, Op::Embed { .. } | Op::SoftEmbed { .. }) {
            return Err(format!("graph '{}': op {} inside an NPU executable", g.name, op.name()));
        }
        for v in op.inputs() {
            if !written.contains(&v) && !reads_outside.contains(&v) {
                reads_outside.push(v);
            }
        }
        written.extend(op.outputs());
        match op {
            Op::Rope { .. } => uses[0] = true,
            Op::Attention { layer, .. } => {
                uses[1] = true;
                layers.push(*layer);
            }
            Op::WindowAttention { layer, window, .. } => {
                layers.push(*layer);
                if !windows.contains(&window.unwrap_or(0)) {
                    windows.push(window.unwrap_or(0));
                }
            }
            Op::GatherLogitRows { .. } => uses[2] = true,
            Op::RopeHeads { .. } => uses[3] = true,
            _ => {}
        }
    }
    let name = |v: ValueId| g.values.get(v as usize).map_or("?".to_string(), |x| x.name.clone());
    let mut inputs = vec![(Role::Hidden, Some(residual))];
    for &v in &reads_outside {
        match before {
            _ if v == residual => {}
            _ if Some(v) == soft => inputs.push((Role::SoftIn, Some(v))),
            Some((x, _)) if v == x => inputs.push((Role::SharedIn, Some(v))),
            Some((_, out)) if v == out => inputs.push((Role::ExpertOut, Some(v))),
            _ => return Err(format!("graph '{}': ops {}..{} read value '{}', which no executable input carries", g.name, ops.start, ops.end, name(v))),
        }
    }
    if !reads_outside.contains(&residual) {
        return Err(format!("graph '{}': ops {}..{} do not read the residual stream", g.name, ops.start, ops.end));
    }
    // Inputs in a fixed order: the hidden states, the self-conditioning input or the MoE
    // boundary, then the pass's tables.
    inputs.sort_by_key(|(r, _)| match r {
        Role::Hidden => 0,
        Role::SharedIn | Role::SoftIn => 1,
        _ => 2,
    });
    for (used, role) in uses.iter().zip([Role::Cos, Role::Mask, Role::LogitIndex, Role::Positions]) {
        if *used {
            inputs.push((role, None));
            if role == Role::Cos {
                inputs.push((Role::Sin, None));
            }
        }
    }
    windows.sort_unstable();
    inputs.extend(windows.into_iter().map(|w| (Role::WindowMask(w), None)));
    let must_write = |v: ValueId, what: &str| if written.contains(&v) { Ok(Some(v)) } else { Err(format!("graph '{}': ops {}..{} do not write {what} '{}'", g.name, ops.start, ops.end, name(v))) };
    let mut outputs = Vec::new();
    if ops.end == g.ops.len() {
        outputs.push((Role::Logits, must_write(g.logits, "the logits")?));
    } else {
        outputs.push((Role::HiddenOut, must_write(residual, "the residual stream")?));
        if !after_run.is_empty() {
            let routed = g.ops[after_run.clone()].iter().find_map(|o| match *o {
                Op::Route { logits, .. } | Op::RouteSigmoid { logits, .. } | Op::RouteScaled { logits, .. } => Some(logits),
                _ => None,
            });
            let (Some(logits), Some((x, _))) = (routed, experts_of(g, after_run)) else {
                return Err(format!("graph '{}': the host ops after op {} are not a router and its experts", g.name, ops.end));
            };
            outputs.push((Role::ExpertIn, must_write(x, "the experts' input")?));
            outputs.push((Role::RouterLogits, must_write(logits, "the router's logits")?));
        }
    }
    for l in layers {
        inputs.extend([(Role::KCache(l), None), (Role::VCache(l), None)]);
        outputs.extend([(Role::KNew(l), None), (Role::VNew(l), None)]);
    }
    Ok((inputs, outputs))
}

/// A section that does not hold together, and why.
fn invalid<T>(msg: String) -> Result<T> {
    Err(Error::invalid(format!("extension '{EXTENSION_KEY}': {msg}")))
}

impl NpuSection {
    /// The uint16 logits' `(scale, offset)` (`(q + offset) * scale`) where the format has
    /// fixed-point logits: the LM head's calibrated output range. `None` for fp16 logits.
    pub fn logits_encoding(&self, h: &Header) -> Option<(f32, i32)> {
        if !self.weights.fixed_point() {
            return None;
        }
        let g = h.graphs.first()?;
        let lm_head = g.ops.iter().find_map(|o| match *o {
            Op::MatMul { weight, out, .. } if out == g.logits => Some(weight),
            _ => None,
        })?;
        self.activations.iter().find(|a| a.weight == lm_head).map(|a| ActivationRange::u16_encoding(a.output))
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a section always encodes")
    }

    /// The section of a header, if it has one.
    /// [`of`](Self::of), except that an optional section at a version this build does not
    /// read is `None`: every load verifies what it can read, and a runtime without the section
    /// runs the artifact on another backend (the QNN backend's `of` refuses it, naming the
    /// version).
    pub fn if_readable(h: &Header) -> Result<Option<NpuSection>> {
        match h.extensions.iter().find(|e| e.key == EXTENSION_KEY) {
            Some(e) if e.version != SECTION_VERSION && !e.required => Ok(None),
            _ => NpuSection::of(h),
        }
    }

    pub fn of(h: &Header) -> Result<Option<NpuSection>> {
        let Some(e) = h.extensions.iter().find(|e| e.key == EXTENSION_KEY) else {
            return Ok(None);
        };
        if e.version != SECTION_VERSION {
            return Err(Error::SectionVersion { kind: EXTENSION_KEY.into(), found: e.version, reads: Some(SECTION_VERSION) });
        }
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
        if self.version != SECTION_VERSION {
            return invalid(format!("section version {} is not the {SECTION_VERSION} this runtime reads", self.version));
        }
        match SOCS.iter().find(|(name, _, _)| *name == self.soc) {
            Some(&(_, id, _)) if id == self.soc_id => {}
            Some(&(_, id, _)) => return invalid(format!("soc '{}' is QNN socModel {id}, not {}", self.soc, self.soc_id)),
            None => return invalid(format!("soc '{}' is none of {}", self.soc, SOCS.map(|s| s.0).join(", "))),
        }
        let layout = self.verify_io(h)?;
        let n = h.model.n_layers;
        // The format's activation ranges first: they decide the logits' element type.
        self.verify_activations(h)?;
        let mut segments = std::collections::HashSet::new();
        let mut next_layer = 0;
        let lens = &self.cache_lens;
        if lens.is_empty() || lens.windows(2).any(|w| w[0] >= w[1]) || lens[0] == 0 || *lens.last().unwrap() != h.plan.kv_capacity {
            return invalid(format!("cache_lens {lens:?}: not ascending lengths ending at the KV capacity ({})", h.plan.kv_capacity));
        }
        // Where each planned graph's next executable starts, per cache length: after the
        // host's embedding.
        // Each graph's executables start after the host's ops before them (`host_prefix`).
        let mut next_op: Vec<Vec<usize>> = h.graphs.iter().map(|g| vec![host_prefix(g); lens.len()]).collect();
        for (ci, c) in self.contexts.iter().enumerate() {
            let at = format!("contexts[{ci}]");
            self.verify_context(h, &at, c, &mut segments, next_layer)?;
            next_layer = c.layers[1];
            for (gi, g) in c.graphs.iter().enumerate() {
                self.verify_executable(h, &layout, &format!("{at}.graphs[{gi}] '{}'", g.name), c, g, &mut next_op)?;
            }
            if let Some(missing) = (0..h.graphs.len()).find(|&gi| !c.graphs.iter().any(|g| g.graph as usize == gi)) {
                return invalid(format!("{at}: planned graph {missing} '{}' has no executable", h.graphs[missing].name));
            }
        }
        for (gi, per_len) in next_op.iter().enumerate() {
            if let Some(v) = per_len.iter().position(|&o| o != h.graphs[gi].ops.len()) {
                return invalid(format!("the executables of graph '{}' over {} cached positions stop at op {} of its {}", h.graphs[gi].name, lens[v], per_len[v], h.graphs[gi].ops.len()));
            }
        }
        if next_layer != n {
            return invalid(format!("the contexts hold layers 0..{next_layer} of the model's {n}"));
        }
        // The sessions, once the contexts' layers are known to be whole.
        self.verify_limits(h, &layout)?;
        for (i, e) in self.estimates.iter().enumerate() {
            if e.graph as usize >= h.graphs.len() || !self.contexts.iter().any(|c| c.layers == e.layers) || !lens.contains(&e.cache_len) {
                return invalid(format!("estimates[{i}]: graph {} with layers {}..{} is no executable of the section", e.graph, e.layers[0], e.layers[1]));
            }
        }
        if self.weights.fixed_point() && self.logits_encoding(h).is_none() {
            return invalid(format!("{} weights leave uint16 logits, but no matmul of graph 0 writes the logits", self.weights.name()));
        }
        // Every context's segment exists (checked above).
        let bytes = |c: &NpuContext| h.segments[c.segment as usize].nbytes;
        let resident: u64 = self.contexts.iter().filter(|c| c.resident).map(bytes).sum();
        let rotating = self.contexts.iter().filter(|c| !c.resident).map(bytes).max().unwrap_or(0);
        if resident.saturating_add(rotating) > self.context_budget {
            return invalid(format!(
                "the resident contexts ({resident} bytes) and the largest rotating one ({rotating} bytes) exceed the context_budget of {} bytes",
                self.context_budget
            ));
        }
        Ok(())
    }
}

impl NpuSection {
    /// The I/O allocation: the plan's layout ([`IoLayout::of`]), region for region.
    fn verify_io(&self, h: &Header) -> Result<IoLayout> {
        let layout = IoLayout::of(h);
        if self.io.bytes != layout.bytes {
            return invalid(format!("io: the I/O allocation is {} bytes; the plan's is {}", self.io.bytes, layout.bytes));
        }
        for (i, (have, want)) in self.io.regions.iter().zip(&layout.regions).enumerate() {
            if have != want {
                return invalid(format!("io.regions[{i}]: {:?} at {} ({} bytes); the plan places {:?} at {} ({} bytes)", have.kind, have.offset, have.bytes, want.kind, want.offset, want.bytes));
            }
        }
        if self.io.regions.len() != layout.regions.len() {
            return invalid(format!("io: {} regions where the plan has {}", self.io.regions.len(), layout.regions.len()));
        }
        Ok(layout)
    }

    /// Context `c` (named `at`): a segment of its own (not yet in `segments`) that the window
    /// does not also hold, within the budget and one mapping, and layers continuing from
    /// `next_layer`.
    fn verify_context(&self, h: &Header, at: &str, c: &NpuContext, segments: &mut std::collections::HashSet<u32>, next_layer: u32) -> Result<()> {
        let (n, w) = (h.model.n_layers, &h.plan.window);
        let Some(seg) = h.segments.get(c.segment as usize) else {
            return invalid(format!("{at}: segment {} does not exist", c.segment));
        };
        if seg.nbytes == 0 || !segments.insert(c.segment) {
            return invalid(format!("{at}: segment '{}' is empty or holds another context too", seg.name));
        }
        if w.resident.iter().any(|r| r.segment == c.segment) || w.rotating.contains(&c.segment) || w.host.contains(&c.segment) {
            return invalid(format!("{at}: segment '{}' also has a home in the window", seg.name));
        }
        if c.layers[0] != next_layer || c.layers[1] <= c.layers[0] || c.layers[1] > n {
            return invalid(format!("{at}: layers {}..{} do not continue the contexts before it (layer {next_layer} next, of {n})", c.layers[0], c.layers[1]));
        }
        if seg.nbytes > self.context_budget {
            return invalid(format!("{at}: its {} bytes exceed the context_budget of {} bytes", seg.nbytes, self.context_budget));
        }
        if seg.nbytes > self.limits.mapping_bytes {
            return invalid(format!("{at}: its {} bytes exceed one mapping ({} bytes)", seg.nbytes, self.limits.mapping_bytes));
        }
        Ok(())
    }

    /// Executable `g` (named `at`) of context `c`: a planned graph's ops in op order,
    /// continuing where that graph's executables over the same cache length stopped
    /// (`next_op`, advanced past it; past host ops only), with the I/O table the plan gives
    /// those ops, each tensor at its descriptor's offset in `layout`.
    fn verify_executable(&self, h: &Header, layout: &IoLayout, at: &str, c: &NpuContext, g: &NpuGraph, next_op: &mut [Vec<usize>]) -> Result<()> {
        let lens = &self.cache_lens;
        let Some(planned) = h.graphs.get(g.graph as usize) else {
            return invalid(format!("{at}: planned graph {} does not exist", g.graph));
        };
        let (start, end) = (g.ops[0] as usize, g.ops[1] as usize);
        let (inputs, outputs) = piece_roles(planned, start..end).or_else(|e| invalid(format!("{at}: {e}")))?;
        // An executable with attention is one cache length's; one without, every one's.
        let attends = inputs.iter().any(|(r, _)| matches!(r, Role::KCache(_)));
        let variants: Vec<usize> = match (attends, lens.iter().position(|&l| l == g.cache_len)) {
            (true, Some(v)) => vec![v],
            (false, _) if g.cache_len == 0 => (0..lens.len()).collect(),
            _ => return invalid(format!("{at}: cache_len {} is not one of {lens:?}{}", g.cache_len, if attends { "" } else { " (0 for an executable without attention)" })),
        };
        for v in variants {
            let from = next_op[g.graph as usize][v];
            if start < from || end <= start || end > planned.ops.len() || !planned.ops[from..start].iter().all(host_op) {
                return invalid(format!("{at}: ops {start}..{end} do not continue graph '{}' over {} cached positions from op {from} (only host ops may lie between)", planned.name, lens[v]));
            }
            next_op[g.graph as usize][v] = end;
        }
        for (what, table, roles) in [("inputs", &g.inputs, inputs), ("outputs", &g.outputs, outputs)] {
            if table.len() != roles.len() {
                return invalid(format!("{at}: {} {what} where the plan has {}", table.len(), roles.len()));
            }
            for (t, (role, _)) in table.iter().zip(roles) {
                if let Role::KCache(l) | Role::KNew(l) = role
                    && (l < c.layers[0] || l >= c.layers[1])
                {
                    return invalid(format!("{at}: attention of layer {l} outside the context's layers {}..{}", c.layers[0], c.layers[1]));
                }
                let want = role.dims(h, planned.rows, planned.logit_rows, g.cache_len);
                if t.role != role || t.dtype != role.dtype(self.weights) || t.dims != want {
                    return invalid(format!(
                        "{at}: {what} '{}' is {:?} {:?} {:?}; the plan's graph '{}' ({} rows, {} logit rows) needs {role:?} {:?} {want:?}",
                        t.name, t.role, t.dtype, t.dims, planned.name, planned.rows, planned.logit_rows, role.dtype(self.weights)
                    ));
                }
                // Its descriptor: the plan's offset, inside its region.
                let offset = layout.offset(h, role, planned.rows).expect("every role has a region");
                if t.offset != offset {
                    return invalid(format!("{at}: {what} '{}' has its descriptor at offset {} of the I/O allocation; the plan places it at {offset}", t.name, t.offset));
                }
            }
        }
        Ok(())
    }

    /// The limits and sessions: the I/O allocation within one mapping; sessions granted;
    /// contexts in session order; each session's I/O and spill-fill as its contexts need
    /// them; each session's resident contexts (and the largest rotating one of the last)
    /// within `session_bytes`; `context_budget` as the sessions leave it.
    fn verify_limits(&self, h: &Header, layout: &IoLayout) -> Result<()> {
        let l = self.limits;
        if layout.bytes > l.mapping_bytes {
            return invalid(format!("io: the I/O allocation ({} bytes) exceeds one mapping ({} bytes)", layout.bytes, l.mapping_bytes));
        }
        if self.sessions.is_empty() || self.sessions.len() as u64 > l.sessions as u64 {
            return invalid(format!("sessions: {} where the limits grant 1 to {}", self.sessions.len(), l.sessions));
        }
        let mut next = 0u32;
        for (ci, c) in self.contexts.iter().enumerate() {
            if c.session != next && c.session != next + 1 || c.session as usize >= self.sessions.len() || (ci == 0 && c.session != 0) {
                return invalid(format!("contexts[{ci}]: session {} does not continue the sessions before it (of {})", c.session, self.sessions.len()));
            }
            next = c.session;
        }
        let (mut budget, last) = (0u64, self.sessions.len() - 1);
        for (si, s) in self.sessions.iter().enumerate() {
            let mine: Vec<&NpuContext> = self.contexts.iter().filter(|c| c.session as usize == si).collect();
            let at = format!("sessions[{si}]");
            let (Some(first), Some(end)) = (mine.first(), mine.last()) else {
                return invalid(format!("{at}: holds no context"));
            };
            let io = layout.bound_bytes(h, [first.layers[0], end.layers[1]]);
            let spill = mine.iter().map(|c| c.spill_fill_bytes).max().unwrap_or(0);
            if s.io_bytes != io || s.spill_fill_bytes != spill {
                return invalid(format!("{at}: io_bytes {} and spill_fill_bytes {}; its contexts bind {io} bytes of I/O and need {spill} of spill-fill", s.io_bytes, s.spill_fill_bytes));
            }
            let bytes = |c: &&NpuContext| h.segments.get(c.segment as usize).map_or(0, |g| g.nbytes);
            let resident: u64 = mine.iter().filter(|c| c.resident).map(bytes).sum();
            let rotating = mine.iter().filter(|c| !c.resident).map(bytes).max().unwrap_or(0);
            if rotating > 0 && si != last {
                return invalid(format!("{at}: rotating contexts in a session before the last"));
            }
            let room = l.session_bytes.saturating_sub(io + spill);
            if resident + rotating > room {
                return invalid(format!(
                    "{at}: its resident contexts ({resident} bytes) and largest rotating one ({rotating} bytes) exceed the {room} bytes the session leaves them ({} less {io} of I/O and {spill} of spill-fill)",
                    l.session_bytes
                ));
            }
            budget += if rotating > 0 { room } else { resident };
        }
        if self.context_budget != budget {
            return invalid(format!("context_budget {} is not the {budget} bytes the sessions leave the contexts", self.context_budget));
        }
        Ok(())
    }

    /// Fixed-point activations: exactly one finite range, holding zero, for each matmul
    /// weight of the plan when the format needs them; none otherwise.
    fn verify_activations(&self, h: &Header) -> Result<()> {
        let needed = matches!(self.weights, NpuWeights::Int4Lpbq { .. });
        if !needed {
            return match self.activations.first() {
                Some(a) => invalid(format!("activations[0] (weight {}): {} weights have fp16 activations, no encodings", a.weight, self.weights.name())),
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
                return invalid(format!("{at}: not a matmul weight of the plan, or listed twice"));
            }
            for (what, r) in [("input", a.input), ("output", a.output)] {
                if !(r[0].is_finite() && r[1].is_finite() && r[0] <= 0.0 && r[1] >= 0.0) {
                    return invalid(format!("{at}: {what} range [{}, {}] is not a finite range holding zero", r[0], r[1]));
                }
            }
        }
        if let Some(&missing) = matmuls.iter().find(|w| !seen.contains(*w)) {
            return invalid(format!("matmul weight {missing} '{}' has no activation range", h.tensors[missing as usize].name));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rows, Value};

    /// One MoE layer as the compiler lowers it (attention, router, experts, a shared expert
    /// when `shared`) and the head.
    fn moe_graph(shared: bool) -> Graph {
        let names = ["x", "attn_in", "qkv", "attn", "attn_proj", "ff_in", "router_logits", "route", "ff_out", "ranked", "work", "shared_gate_up", "shared_hidden", "shared_out", "head_in", "head_normed", "logits"];
        let values = names.iter().map(|n| Value { name: n.to_string(), rows: if n.starts_with("head") || *n == "logits" { Rows::Logits } else { Rows::Tokens }, cols: 8, offset: 0 }).collect();
        let mut ops = vec![
            Op::Embed { table: 0, out: 0 },
            Op::RmsNorm { x: 0, weight: 1, eps: 1e-6, out: 1 },
            Op::MatMul { x: 1, weight: 2, out: 2 },
            Op::Rope { x: 2, heads: 2, cos: 3, sin: 4 },
            Op::Attention { qkv: 2, out: 3, heads: 1, kv_heads: 1, layer: 0 },
            Op::MatMul { x: 3, weight: 5, out: 4 },
            Op::Add { acc: 0, x: 4 },
            Op::RmsNorm { x: 0, weight: 6, eps: 1e-6, out: 5 },
            Op::MatMul { x: 5, weight: 7, out: 6 },
            Op::Route { logits: 6, top_k: 2, out: 7 },
            Op::MoeExperts { x: 5, route: 7, out: 8, layer: 0, first: 20, experts: 4, ranked: 9, work: 10 },
        ];
        if shared {
            ops.extend([Op::MatMul { x: 5, weight: 8, out: 11 }, Op::SwiGlu { x: 11, out: 12 }, Op::MatMul { x: 12, weight: 9, out: 13 }, Op::Add { acc: 8, x: 13 }]);
        }
        ops.extend([Op::Add { acc: 0, x: 8 }, Op::GatherLogitRows { x: 0, out: 14 }, Op::RmsNorm { x: 14, weight: 10, eps: 1e-6, out: 15 }, Op::MatMul { x: 15, weight: 11, out: 16 }]);
        Graph { name: "rows-8".into(), rows: 8, logit_rows: 8, values, ops, logits: 16, window_bytes: 0, staging: Vec::new() }
    }

    fn roles(list: &[(Role, Option<ValueId>)]) -> Vec<Role> {
        list.iter().map(|r| r.0).collect()
    }

    /// The router and experts cut the layer: the executable before hands on the residual,
    /// the experts' input and the router's logits; the one after takes the residual, the
    /// experts' sum and (for its shared expert) their input again, in a region of its own.
    #[test]
    fn an_moe_layer_is_cut_at_its_host_ops_and_each_piece_carries_what_crosses() {
        let g = moe_graph(true);
        let n = g.ops.len();
        assert_eq!(pieces(&g, 1..n), vec![1..9, 11..n]);
        let (i, o) = piece_roles(&g, 1..9).unwrap();
        assert_eq!(roles(&i), [Role::Hidden, Role::Cos, Role::Sin, Role::Mask, Role::KCache(0), Role::VCache(0)]);
        assert_eq!(o, [(Role::HiddenOut, Some(0)), (Role::ExpertIn, Some(5)), (Role::RouterLogits, Some(6)), (Role::KNew(0), None), (Role::VNew(0), None)]);
        let (i, o) = piece_roles(&g, 11..n).unwrap();
        assert_eq!(i, [(Role::Hidden, Some(0)), (Role::SharedIn, Some(5)), (Role::ExpertOut, Some(8)), (Role::LogitIndex, None)]);
        assert_eq!(o, [(Role::Logits, Some(16))]);
        // Without a shared expert the piece after reads only the residual and the sum.
        let g = moe_graph(false);
        let n = g.ops.len();
        assert_eq!(roles(&piece_roles(&g, 11..n).unwrap().0), [Role::Hidden, Role::ExpertOut, Role::LogitIndex]);
        // A dense graph (no host ops) stays one piece.
        assert_eq!(pieces(&g, 1..9), vec![1..9]);
    }

    /// A cut anywhere else leaves a value no role carries, and host ops inside a piece are
    /// refused, each error naming what.
    #[test]
    fn a_piece_that_reads_what_no_role_carries_is_refused_by_name() {
        let g = moe_graph(true);
        assert!(piece_roles(&g, 2..9).unwrap_err().contains("'attn_in'"));
        assert!(piece_roles(&g, 1..11).unwrap_err().contains("op Route inside"));
    }

    /// A rotary embedding with tables of its own (`RopeHeads`) reads the rows' positions, an
    /// int32 input after the pass's other tables.
    #[test]
    fn a_rotary_embedding_with_its_own_tables_reads_the_rows_positions() {
        let mut g = moe_graph(false);
        g.ops[3] = Op::RopeHeads { x: 2, heads: 2, head_dim: 4, cos: 3, sin: 4 };
        let (i, _) = piece_roles(&g, 1..9).unwrap();
        assert_eq!(roles(&i), [Role::Hidden, Role::Mask, Role::Positions, Role::KCache(0), Role::VCache(0)]);
        assert_eq!(Role::Positions.dtype(NpuWeights::F16), NpuDType::I32);
    }

    /// A self-conditioning product right after the embedding is the host's too: the first
    /// executable starts after it and reads its result, and none may hold it.
    #[test]
    fn a_self_conditioning_product_after_the_embedding_is_the_first_executables_input() {
        let mut g = moe_graph(false);
        assert_eq!(host_prefix(&g), 1);
        // The router's logits value stands in for the soft input, the experts' input for the
        // product, which the first layer's norm then reads in place of the residual.
        g.ops.insert(1, Op::SoftEmbed { x: 6, table: 0, scale: 1.0, out: 5 });
        g.ops[2] = Op::RmsNorm { x: 5, weight: 1, eps: 1e-6, out: 1 };
        assert_eq!(host_prefix(&g), 2);
        let (i, _) = piece_roles(&g, 2..8).unwrap();
        assert_eq!(i[..2], [(Role::Hidden, Some(0)), (Role::SoftIn, Some(5))]);
        assert!(piece_roles(&g, 1..8).unwrap_err().contains("op SoftEmbed inside"));
    }
}
