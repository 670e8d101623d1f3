//! Structural verification of a header, once, at load (and by the compiler before it
//! writes). After this passes, the runtime trusts every index, offset and shape in the plan.
//! Errors name the element: `graphs[2] 'exact-64' ops[17] MatMul: ...`.

use crate::error::{Error, Result};
use crate::format::{MAX_THREADS, MAX_WINDOW_BYTES, SEGMENT_ALIGN, TENSOR_ALIGN, WINDOW_ALIGN};
use crate::graph::{Graph, Op, Rows, TensorId, Value, ValueId};
use crate::header::{Header, ModelConfig, TensorInfo};
use crate::packing::DType;

pub fn header(h: &Header, data_len: u64) -> Result<()> {
    model(&h.model)?;
    let m = &h.model;
    for (what, id) in [("mask", Some(h.special.mask)), ("bos", h.special.bos), ("eos", h.special.eos), ("eot", h.special.eot)] {
        if let Some(id) = id {
            if id >= m.embedding_size {
                return Err(Error::invalid(format!("special token {what} = {id} is outside the embedding ({})", m.embedding_size)));
            }
        }
    }
    tensors(h, data_len)?;
    // The KV cache, sized by its capacity, is the window's largest region: it holds no more
    // positions than the largest graph computes (the runtime serves no longer sequence).
    let rows = h.graphs.iter().map(|g| g.rows).max().unwrap_or(0);
    if h.plan.kv_capacity > rows {
        return Err(Error::invalid(format!("plan.kv_capacity {} is more than the {rows} rows of the largest graph", h.plan.kv_capacity)));
    }
    for (i, g) in h.graphs.iter().enumerate() {
        graph(h, g).map_err(|e| Error::invalid(format!("graphs[{i}] '{}' {e}", g.name)))?;
    }
    let mut last_rows = 0;
    for (i, &g) in h.plan.by_rows.iter().enumerate() {
        let graph = h.graphs.get(g as usize).ok_or_else(|| Error::invalid(format!("plan.by_rows[{i}] names graph {g}, which does not exist")))?;
        if graph.rows <= last_rows {
            return Err(Error::invalid(format!("plan.by_rows[{i}] is not in increasing row order")));
        }
        last_rows = graph.rows;
    }
    if h.plan.window.bytes > MAX_WINDOW_BYTES {
        return Err(Error::invalid(format!("plan.window.bytes {} is above the format's limit of {MAX_WINDOW_BYTES}", h.plan.window.bytes)));
    }
    if h.plan.window.scratch.threads > MAX_THREADS {
        return Err(Error::invalid(format!("plan.window.scratch.threads {} is above the format's limit of {MAX_THREADS}", h.plan.window.scratch.threads)));
    }
    let mut last_bucket = 0;
    for (i, &rows) in h.plan.row_buckets.iter().enumerate() {
        if rows <= last_bucket {
            return Err(Error::invalid(format!("plan.row_buckets[{i}] ({rows} rows) is not in increasing order")));
        }
        if !h.graphs.iter().any(|g| g.rows == rows) {
            return Err(Error::invalid(format!("plan.row_buckets[{i}] names {rows} rows, but no graph has exactly that many")));
        }
        last_bucket = rows;
    }
    if !h.plan.latency.is_empty() && h.plan.latency.len() != h.graphs.len() {
        return Err(Error::invalid(format!("plan.latency has {} entries for {} graphs", h.plan.latency.len(), h.graphs.len())));
    }
    crate::verify_window::window(h).map_err(|e| Error::invalid(format!("plan.window: {e}")))?;
    for (i, g) in h.graphs.iter().enumerate() {
        crate::verify_window::graph_in_window(h, g).map_err(|e| Error::invalid(format!("graphs[{i}] '{}' {e}", g.name)))?;
    }
    if let Some(npu) = crate::npu::NpuSection::if_readable(h)? {
        npu.verify(h)?;
    }
    crate::diffusion_gemma::DiffusionGemmaSection::of(h)?;
    // The runtime requires programs (`Programs::of`); a header without them is checked for
    // everything else, as the compiler's plans are before their programs are derived.
    if h.extensions.iter().any(|e| e.key == crate::program::EXTENSION_KEY) {
        crate::program::Programs::of(h)?;
    }
    Ok(())
}

fn model(m: &ModelConfig) -> Result<()> {
    let bad = |msg: String| Err(Error::invalid(format!("model: {msg}")));
    if crate::header::Family::parse(&m.architecture).is_none() {
        let known: Vec<&str> = crate::header::Family::ALL.iter().map(|f| f.name()).collect();
        return bad(format!("architecture '{}' is none this runtime knows ({})", m.architecture, known.join(", ")));
    }
    if m.d_model == 0 || m.n_layers == 0 || m.n_heads == 0 || m.n_kv_heads == 0 || m.head_dim == 0 || m.mlp_hidden == 0 || m.embedding_size == 0 {
        return bad("a dimension is zero".into());
    }
    if m.n_heads % m.n_kv_heads != 0 {
        return bad(format!("n_heads {} is not a multiple of n_kv_heads {}", m.n_heads, m.n_kv_heads));
    }
    let limit = 1 << 24;
    if [m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.mlp_hidden, m.embedding_size, m.vocab_size].iter().any(|&d| d > limit) || m.n_layers > 1 << 16 {
        return bad(format!("a dimension is above 2^24 (or n_layers above 2^16): {m:?}"));
    }
    if m.head_dim % 2 != 0 {
        return bad(format!("head_dim {} is odd; rotary embedding needs it even", m.head_dim));
    }
    if let Some(moe) = m.moe {
        if moe.experts == 0 || moe.experts > MAX_EXPERTS || moe.top_k == 0 || moe.top_k > moe.experts {
            return bad(format!("moe: {} experts with top_k {} (experts must be 1..={MAX_EXPERTS}, top_k 1..=experts)", moe.experts, moe.top_k));
        }
        if moe.dense_layers >= m.n_layers {
            return bad(format!("moe: {} dense layers of {} leave none with experts", moe.dense_layers, m.n_layers));
        }
    }
    Ok(())
}

/// The most groups a `RouteSigmoid` router may split its experts into (LLaDA 2.x's have 8).
pub const MAX_ROUTER_GROUPS: u32 = 64;

/// The most experts a layer may have: bounds the tensors an MoE op names before they are listed.
pub const MAX_EXPERTS: u32 = 4096;

fn tensors(h: &Header, data_len: u64) -> Result<()> {
    let mut spans: Vec<(u64, u64, usize)> = Vec::with_capacity(h.tensors.len());
    let mut names = std::collections::HashSet::new();
    for (i, t) in h.tensors.iter().enumerate() {
        let at = || format!("tensors[{i}] '{}'", t.name);
        if !names.insert(t.name.as_str()) {
            return Err(Error::invalid(format!("{} appears twice", at())));
        }
        if t.expected_nbytes() != Some(t.nbytes) {
            return Err(Error::invalid(format!("{}: {} bytes do not hold shape {:?} of {}", at(), t.nbytes, t.shape, t.dtype.name())));
        }
        if t.offset % TENSOR_ALIGN != 0 {
            return Err(Error::invalid(format!("{}: offset {} is not {}-byte aligned", at(), t.offset, TENSOR_ALIGN)));
        }
        if let Some(why) = t.shape.get(1).and_then(|&k| h.plan.activation_scales.unsupported(t.dtype, k as usize)) {
            return Err(Error::invalid(format!("{} under plan.activation_scales {}: {why}", at(), h.plan.activation_scales.name())));
        }
        match t.offset.checked_add(t.nbytes) {
            Some(end) if end <= data_len => spans.push((t.offset, end, i)),
            _ => {
                return Err(Error::Truncated { what: at(), need: t.offset.saturating_add(t.nbytes), have: data_len });
            }
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(Error::invalid(format!(
                "tensors[{}] '{}' overlaps tensors[{}] '{}'",
                w[0].2, h.tensors[w[0].2].name, w[1].2, h.tensors[w[1].2].name
            )));
        }
    }
    let mut segs: Vec<(u64, u64)> = Vec::new();
    for (i, s) in h.segments.iter().enumerate() {
        if s.offset % SEGMENT_ALIGN != 0 || s.offset.checked_add(s.nbytes).is_none_or(|e| e > data_len) {
            return Err(Error::invalid(format!("segments[{i}] '{}' is misaligned or outside the data section", s.name)));
        }
        segs.push((s.offset, s.offset + s.nbytes));
    }
    segs.sort();
    if segs.windows(2).any(|w| w[1].0 < w[0].1) {
        return Err(Error::invalid("two segments overlap"));
    }
    Ok(())
}

fn graph(h: &Header, g: &Graph) -> std::result::Result<(), String> {
    let m = &h.model;
    if g.rows == 0 || g.logit_rows == 0 || g.logit_rows > g.rows {
        return Err(format!("has {} rows and {} logit rows", g.rows, g.logit_rows));
    }
    if g.rows > h.plan.kv_capacity {
        return Err(format!("has {} rows, more than plan.kv_capacity {}", g.rows, h.plan.kv_capacity));
    }
    // Sizes first, overflow-checked: every later size computation on values relies on them
    // fitting in the window (itself bounded by the format).
    for (i, v) in g.values.iter().enumerate() {
        let end = g.checked_value_bytes(v).and_then(|b| b.checked_add(v.offset));
        if v.cols == 0 || v.offset % WINDOW_ALIGN != 0 || end.is_none_or(|e| e > h.plan.window.bytes) {
            return Err(format!("values[{i}] '{}' is empty, misaligned or larger than the window", v.name));
        }
    }
    let ids = Ids { h, g };
    let logits = ids.value(g.logits)?;
    if logits.rows != Rows::Logits || logits.cols != m.embedding_size {
        return Err(format!("logits value '{}' is not [logit rows, {}]", logits.name, m.embedding_size));
    }
    for (i, op) in g.ops.iter().enumerate() {
        let at = |msg: String| format!("ops[{i}] {}: {msg}", op.name());
        for v in op.inputs().into_iter().chain(op.outputs()) {
            ids.value(v).map_err(at)?;
        }
        // An MoE op names two tensors per expert: bound the count before listing them.
        if let Op::MoeExperts { experts, .. } = *op {
            if m.moe.is_none_or(|moe| moe.experts != experts) {
                return Err(at(format!("{experts} experts, but the model has {}", m.moe.map_or(0, |moe| moe.experts))));
            }
        }
        for t in op.tensors() {
            ids.tensor(t).map_err(at)?;
        }
        match *op {
            Op::Route { .. } | Op::RouteSigmoid { .. } | Op::RouteScaled { .. } | Op::MoeExperts { .. } => moe_op_shapes(&ids, op, &at)?,
            Op::GeluGlu { .. } | Op::Softcap { .. } | Op::RopeHeads { .. } | Op::NormHeads { .. } | Op::WindowAttention { .. } | Op::SoftEmbed { .. } => head_shaped_op_shapes(&ids, op, &at)?,
            _ => dense_op_shapes(&ids, op, &at)?,
        }
        outputs_apart_from_inputs(g, op, &at)?;
    }
    Ok(())
}

/// A graph's values and the header's tensors by id, or why not (an id out of range).
struct Ids<'a> {
    h: &'a Header,
    g: &'a Graph,
}

impl Ids<'_> {
    fn value(&self, id: ValueId) -> std::result::Result<&Value, String> {
        self.g.values.get(id as usize).ok_or_else(|| format!("refers to value {id}, which does not exist"))
    }

    fn tensor(&self, id: TensorId) -> std::result::Result<&TensorInfo, String> {
        self.h.tensors.get(id as usize).ok_or_else(|| format!("refers to tensor {id}, which does not exist"))
    }

    /// Whether values `a` and `b` have one shape (an error through `at` if not).
    fn same_shape(&self, a: ValueId, b: ValueId, at: &dyn Fn(String) -> String) -> std::result::Result<(), String> {
        let (va, vb) = (self.value(a)?, self.value(b)?);
        if va.rows != vb.rows || va.cols != vb.cols {
            return Err(at(format!("'{}' and '{}' differ in shape", va.name, vb.name)));
        }
        Ok(())
    }
}

/// The shapes, dtypes and head counts of a dense op's operands against the model's.
fn dense_op_shapes(ids: &Ids, op: &Op, at: &dyn Fn(String) -> String) -> std::result::Result<(), String> {
    let (h, g) = (ids.h, ids.g);
    let m = &h.model;
    let hd = m.head_dim as u64;
    match *op {
        Op::Embed { table, out } => {
            let (t, o) = (ids.tensor(table)?, ids.value(out)?);
            if t.shape != [m.embedding_size as u64, o.cols as u64] || o.rows != Rows::Tokens || t.dtype.is_panel() {
                return Err(at(format!("table '{}' {:?} does not match output [{}, {}]", t.name, t.shape, m.embedding_size, o.cols)));
            }
        }
        Op::Scale { .. } => {}
        Op::Bias { x, bias } => {
            let t = ids.tensor(bias)?;
            if t.dtype != DType::F32 || t.shape != [ids.value(x)?.cols as u64] {
                return Err(at(format!("bias '{}' is not f32 [{}]", t.name, ids.value(x)?.cols)));
            }
        }
        Op::RmsNorm { x, weight, out, .. } => {
            ids.same_shape(x, out, at)?;
            let t = ids.tensor(weight)?;
            if t.dtype != DType::F32 || t.shape != [ids.value(x)?.cols as u64] {
                return Err(at(format!("weight '{}' is not f32 [{}]", t.name, ids.value(x)?.cols)));
            }
        }
        Op::MatMul { x, weight, out } => {
            let (vx, vo, t) = (ids.value(x)?, ids.value(out)?, ids.tensor(weight)?);
            if t.shape != [vo.cols as u64, vx.cols as u64] || vx.rows != vo.rows {
                return Err(at(format!("weight '{}' {:?} does not map [{}] to [{}]", t.name, t.shape, vx.cols, vo.cols)));
            }
            if !t.dtype.is_panel() {
                return Err(at(format!("weight '{}' is {}, not a packed layout", t.name, t.dtype.name())));
            }
        }
        Op::Rope { x, heads, cos, sin } => {
            let vx = ids.value(x)?;
            // Query and key heads (the model's), never more.
            if heads == 0 || heads as u64 > m.n_heads as u64 + m.n_kv_heads as u64 || (vx.cols as u64) < heads as u64 * hd {
                return Err(at(format!("'{}' has {} columns for {heads} heads of {hd} (the model has {} query and {} key heads)", vx.name, vx.cols, m.n_heads, m.n_kv_heads)));
            }
            for t in [ids.tensor(cos)?, ids.tensor(sin)?] {
                if t.dtype != DType::F32 || t.shape.len() != 2 || t.shape[1] != (hd / 2) as u64 || t.shape[0] < h.plan.kv_capacity.max(g.rows) as u64 {
                    return Err(at(format!("table '{}' {:?} is not f32 [>= {}, {}]", t.name, t.shape, h.plan.kv_capacity.max(g.rows), hd / 2)));
                }
            }
        }
        Op::Attention { qkv, out, heads, kv_heads, layer } => {
            let (vq, vo) = (ids.value(qkv)?, ids.value(out)?);
            if layer >= h.model.n_layers {
                return Err(at(format!("KV cache layer {layer} of a {}-layer model", h.model.n_layers)));
            }
            // The KV cache is sized by the model's head counts: an op with others would
            // read and write outside its layer.
            if heads != m.n_heads || kv_heads != m.n_kv_heads {
                return Err(at(format!("heads {heads}/{kv_heads}, but the model (which sizes the KV cache) has {}/{}", m.n_heads, m.n_kv_heads)));
            }
            let (heads, kv_heads) = (heads as u64, kv_heads as u64);
            if vq.cols as u64 != (heads + 2 * kv_heads) * hd || vo.cols as u64 != heads * hd || vq.rows != vo.rows {
                return Err(at(format!("heads {heads}/{kv_heads} do not match q|k|v [{}] and output [{}]", vq.cols, vo.cols)));
            }
        }
        Op::SwiGlu { x, out } => {
            let (vx, vo) = (ids.value(x)?, ids.value(out)?);
            if vx.cols as u64 != 2 * vo.cols as u64 || vx.rows != vo.rows {
                return Err(at(format!("'{}' [{}] is not [gate | up] for output [{}]", vx.name, vx.cols, vo.cols)));
            }
        }
        Op::Add { acc, x } => {
            ids.same_shape(acc, x, at)?;
            // `acc` is read and written while `x` is read: one value on both sides would
            // alias a mutable slice.
            if acc == x || overlaps(g, acc, x) {
                return Err(at(format!("adds '{}' to itself (or to bytes it overlaps)", ids.value(x)?.name)));
            }
        }
        Op::GatherLogitRows { x, out } => {
            let (vx, vo) = (ids.value(x)?, ids.value(out)?);
            if vx.rows != Rows::Tokens || vo.rows != Rows::Logits || vx.cols != vo.cols {
                return Err(at(format!("'{}' -> '{}' is not tokens -> logit rows of one width", vx.name, vo.name)));
            }
        }
        Op::HeadRmsNorm { x, first_head, heads, weight, .. } => {
            let (vx, t) = (ids.value(x)?, ids.tensor(weight)?);
            // Query and key heads only (the model's), inside the row.
            let end = first_head as u64 + heads as u64;
            if heads == 0 || end > m.n_heads as u64 + m.n_kv_heads as u64 || (vx.cols as u64) < end * hd {
                return Err(at(format!("heads {first_head}..{end} of '{}' [{}] (the model has {} query and {} key heads of {hd})", vx.name, vx.cols, m.n_heads, m.n_kv_heads)));
            }
            if t.dtype != DType::F32 || t.shape != [hd] {
                return Err(at(format!("weight '{}' is not f32 [{hd}]", t.name)));
            }
        }
        _ => unreachable!("moe_op_shapes and head_shaped_op_shapes check the others"),
    }
    Ok(())
}

/// The shapes of the ops that carry their own head shape (DiffusionGemma's layers, whose
/// full-attention layers have heads of their own width) and of their activations, against
/// the model's KV cache and tables.
fn head_shaped_op_shapes(ids: &Ids, op: &Op, at: &dyn Fn(String) -> String) -> std::result::Result<(), String> {
    let (h, g) = (ids.h, ids.g);
    let m = &h.model;
    // A head count and width that fit inside `cols` columns after `first_head` heads.
    let heads_fit = |name: &str, cols: u32, first_head: u32, heads: u32, head_dim: u32| {
        let end = first_head as u64 + heads as u64;
        if heads == 0 || head_dim == 0 || head_dim % 2 != 0 || end * head_dim as u64 > cols as u64 {
            return Err(at(format!("heads {first_head}..{end} of {head_dim} do not fit '{name}' [{cols}]")));
        }
        Ok(())
    };
    let f32_vector = |t: TensorId, len: u64, what: &str| -> std::result::Result<(), String> {
        let t = ids.tensor(t)?;
        if t.dtype != DType::F32 || t.shape != [len] {
            return Err(at(format!("{what} '{}' is not f32 [{len}]", t.name)));
        }
        Ok(())
    };
    match *op {
        Op::GeluGlu { x, out } => {
            let (vx, vo) = (ids.value(x)?, ids.value(out)?);
            if vx.cols as u64 != 2 * vo.cols as u64 || vx.rows != vo.rows {
                return Err(at(format!("'{}' [{}] is not [gate | up] for output [{}]", vx.name, vx.cols, vo.cols)));
            }
        }
        Op::Softcap { cap, .. } => {
            if !(cap.is_finite() && cap > 0.0) {
                return Err(at(format!("cap {cap} is not a finite number above 0")));
            }
        }
        Op::RopeHeads { x, heads, head_dim, cos, sin } => {
            let vx = ids.value(x)?;
            heads_fit(&vx.name, vx.cols, 0, heads, head_dim)?;
            let rows = h.plan.kv_capacity.max(g.rows) as u64;
            for t in [ids.tensor(cos)?, ids.tensor(sin)?] {
                if t.dtype != DType::F32 || t.shape.len() != 2 || t.shape[1] != (head_dim / 2) as u64 || t.shape[0] < rows {
                    return Err(at(format!("table '{}' {:?} is not f32 [>= {rows}, {}]", t.name, t.shape, head_dim / 2)));
                }
            }
        }
        Op::NormHeads { x, first_head, heads, head_dim, weight, .. } => {
            let vx = ids.value(x)?;
            heads_fit(&vx.name, vx.cols, first_head, heads, head_dim)?;
            if let Some(w) = weight {
                f32_vector(w, head_dim as u64, "weight")?;
            }
        }
        Op::WindowAttention { qkv, out, heads, kv_heads, head_dim, layer, scale, window } => {
            let (vq, vo) = (ids.value(qkv)?, ids.value(out)?);
            if layer >= m.n_layers {
                return Err(at(format!("KV cache layer {layer} of a {}-layer model", m.n_layers)));
            }
            // Each layer's cache holds the model's kv heads of its head_dim per position: an op
            // whose keys and values are wider would write past its layer.
            if kv_heads == 0 || heads % kv_heads != 0 || kv_heads as u64 * head_dim as u64 > m.n_kv_heads as u64 * m.head_dim as u64 {
                return Err(at(format!("heads {heads}/{kv_heads} of {head_dim}: the model's cache holds {} key heads of {} per layer", m.n_kv_heads, m.head_dim)));
            }
            heads_fit(&vq.name, vq.cols, 0, heads + 2 * kv_heads, head_dim)?;
            if vq.cols as u64 != (heads as u64 + 2 * kv_heads as u64) * head_dim as u64 || vo.cols as u64 != heads as u64 * head_dim as u64 || vq.rows != vo.rows {
                return Err(at(format!("heads {heads}/{kv_heads} of {head_dim} do not match q|k|v [{}] and output [{}]", vq.cols, vo.cols)));
            }
            if !scale.is_finite() || window == Some(0) {
                return Err(at(format!("scale {scale} and window {window:?}: a finite scale and a window of at least 1")));
            }
        }
        Op::SoftEmbed { x, table, scale, out } => {
            let (vx, vo, t) = (ids.value(x)?, ids.value(out)?, ids.tensor(table)?);
            if t.shape != [m.embedding_size as u64, vo.cols as u64] || vx.rows != Rows::Tokens || vo.rows != Rows::Tokens || vx.cols != m.embedding_size {
                return Err(at(format!("table '{}' {:?} does not map the logits [{}] to [{}]", t.name, t.shape, m.embedding_size, vo.cols)));
            }
            if t.dtype.is_panel() || !scale.is_finite() {
                return Err(at(format!("table '{}' is {}, not an embedding's layout, or scale {scale} is not finite", t.name, t.dtype.name())));
            }
        }
        _ => unreachable!("dense_op_shapes and moe_op_shapes check the others"),
    }
    Ok(())
}

/// The shapes of a mixture-of-experts op's operands (routers and experts) against the
/// model's experts.
fn moe_op_shapes(ids: &Ids, op: &Op, at: &dyn Fn(String) -> String) -> std::result::Result<(), String> {
    let m = &ids.h.model;
    // A router's logits and picks (`Route`, `RouteSigmoid`): the model's experts and top k.
    let route = |logits: ValueId, top_k: u32, out: ValueId| -> std::result::Result<crate::header::MoeConfig, String> {
        let (vl, vo) = (ids.value(logits)?, ids.value(out)?);
        let Some(moe) = m.moe else { return Err(at("the model has no experts".into())) };
        if top_k != moe.top_k || vl.cols != moe.experts || vo.cols as u64 != 2 * top_k as u64 || vl.rows != vo.rows {
            return Err(at(format!("'{}' [{}] -> '{}' [{}] with top_k {top_k}; the model routes {} experts, top {}", vl.name, vl.cols, vo.name, vo.cols, moe.experts, moe.top_k)));
        }
        Ok(moe)
    };
    match *op {
        Op::Route { logits, top_k, out } => route(logits, top_k, out).map(|_| ())?,
        Op::RouteScaled { logits, expert_scale, top_k, out } => {
            let moe = route(logits, top_k, out)?;
            let t = ids.tensor(expert_scale)?;
            if t.dtype != DType::F32 || t.shape != [moe.experts as u64] {
                return Err(at(format!("expert scale '{}' is not f32 [{}]", t.name, moe.experts)));
            }
        }
        Op::RouteSigmoid { logits, bias, top_k, groups, top_groups, scale, out, .. } => {
            let moe = route(logits, top_k, out)?;
            let t = ids.tensor(bias)?;
            if t.dtype != DType::F32 || t.shape != [moe.experts as u64] {
                return Err(at(format!("expert bias '{}' is not f32 [{}]", t.name, moe.experts)));
            }
            // Whole groups of at least two (a group is scored by its two best), enough
            // kept groups to pick from, and a finite weight scale.
            let per_group = if groups == 0 { 0 } else { moe.experts / groups };
            if groups == 0 || groups > MAX_ROUTER_GROUPS || moe.experts % groups != 0 || per_group < 2 || top_groups == 0 || top_groups > groups || (top_groups as u64 * per_group as u64) < top_k as u64 || !scale.is_finite() {
                return Err(at(format!("{groups} groups (top {top_groups}) of {} experts with top_k {top_k} and scale {scale} cannot route", moe.experts)));
            }
        }
        Op::MoeExperts { x, route, out, layer, first, experts, ranked, work } => {
            let moe = m.moe.expect("checked above");
            if m.moe_layer_index(layer).is_none() {
                return Err(at(format!("layer {layer} of a {}-layer model whose first {} are dense", m.n_layers, moe.dense_layers)));
            }
            ids.same_shape(x, out, at)?;
            let (vx, vr, vk, vw) = (ids.value(x)?, ids.value(route)?, ids.value(ranked)?, ids.value(work)?);
            let (d, f) = (m.d_model as u64, m.mlp_hidden as u64);
            if vx.rows != Rows::Tokens || vx.cols as u64 != d {
                return Err(at(format!("input '{}' is not [tokens, {d}]", vx.name)));
            }
            for (v, cols) in [(vr, 2 * moe.top_k as u64), (vk, moe.top_k as u64 * d), (vw, 2 * d + 3 * f)] {
                if v.rows != Rows::Tokens || v.cols as u64 != cols {
                    return Err(at(format!("'{}' is not [tokens, {cols}]", v.name)));
                }
            }
            let format = ids.tensor(first)?.dtype;
            for e in 0..experts {
                for (t, shape) in [(first.saturating_add(2 * e), [2 * f, d]), (first.saturating_add(2 * e + 1), [d, f])] {
                    let t = ids.tensor(t)?;
                    if t.shape != shape || t.dtype != format || !t.dtype.is_panel() {
                        return Err(at(format!("expert {e}: '{}' {:?} {} is not {} {shape:?} like expert 0", t.name, t.shape, t.dtype.name(), format.name())));
                    }
                }
            }
        }
        _ => unreachable!("dense_op_shapes checks the dense ops"),
    }
    Ok(())
}

/// An op's output must not share bytes with its inputs: kernels read inputs while writing
/// outputs. Only the in-place operands (Scale's and Rope's `x`, Add's `acc`) are both; every
/// other op runs out of place, even on a value of the right shape.
fn outputs_apart_from_inputs(g: &Graph, op: &Op, at: &dyn Fn(String) -> String) -> std::result::Result<(), String> {
    let in_place = |o: ValueId, inp: ValueId| {
        o == inp
            && match *op {
                Op::Scale { x, .. } | Op::Rope { x, .. } | Op::HeadRmsNorm { x, .. } | Op::Bias { x, .. } => x == o,
                Op::Softcap { x, .. } | Op::RopeHeads { x, .. } | Op::NormHeads { x, .. } | Op::SoftEmbed { x, .. } => x == o,
                Op::Add { acc, .. } => acc == o,
                _ => false,
            }
    };
    for o in op.outputs() {
        for inp in op.inputs() {
            if !in_place(o, inp) && overlaps(g, o, inp) {
                return Err(at(format!("output '{}' overlaps input '{}' in the window", g.values[o as usize].name, g.values[inp as usize].name)));
            }
        }
    }
    Ok(())
}

fn overlaps(g: &Graph, a: ValueId, b: ValueId) -> bool {
    let (va, vb) = (&g.values[a as usize], &g.values[b as usize]);
    va.offset < vb.offset.saturating_add(g.value_bytes(vb)) && vb.offset < va.offset.saturating_add(g.value_bytes(va))
}
