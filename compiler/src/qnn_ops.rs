//! Compositions of QNN's fp16 ops that need nothing of the artifact: column slices, RMSNorm
//! over rows or over heads of any width, and DiffusionGemma's tanh-approximated GELU gate
//! and soft-capping, which QNN has no op for. `qnn.rs` lowers graphs through them; a test
//! builds them alone to compare the simulator with the host's kernels.

use llada_qnn::build::ParamSpec;
use llada_qnn::TensorRef;

use crate::error::Result;

/// A QNN graph being built, as these compositions add to it.
pub trait Emit {
    /// fp16 op `ty` of `inputs` with a result of `dims`: the executable's output named
    /// `output` where there is one, else an intermediate.
    fn emit(&mut self, ty: &str, inputs: &[TensorRef], params: Vec<ParamSpec>, dims: &[u32], output: Option<&str>) -> Result<TensorRef>;
    /// A static fp16 tensor holding `values`.
    fn constant(&mut self, dims: &[u32], values: &[f32]) -> Result<TensorRef>;
    fn dims(&self, t: TensorRef) -> Vec<u32>;
}

/// `sqrt(2 / pi)` and the cube's coefficient of PyTorch's `gelu(approximate='tanh')`.
const GELU_BETA: f32 = (std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI * 0.5) as f32;
const GELU_KAPPA: f32 = 0.044715;

/// Columns `from..to` of every row of a `[rows, cols]` tensor.
pub fn columns(e: &mut impl Emit, x: TensorRef, rows: u32, from: u32, to: u32) -> Result<TensorRef> {
    let ranges = vec![0, rows as i32, 1, from as i32, to as i32, 1];
    e.emit("StridedSlice", &[x], vec![ParamSpec::I32s("ranges", vec![2, 3], ranges)], &[rows, to - from], None)
}

pub fn reshape(e: &mut impl Emit, x: TensorRef, dims: &[u32], output: Option<&str>) -> Result<TensorRef> {
    e.emit("Reshape", &[x], vec![], dims, output)
}

/// Element-wise op `ty` of `a` and `b` in `a`'s shape (`b` the same or broadcast).
fn elementwise(e: &mut impl Emit, ty: &str, a: TensorRef, b: TensorRef, output: Option<&str>) -> Result<TensorRef> {
    let dims = e.dims(a);
    e.emit(ty, &[a, b], vec![], &dims, output)
}

/// `x` times the scalar `factor`.
fn scaled(e: &mut impl Emit, x: TensorRef, factor: f32, output: Option<&str>) -> Result<TensorRef> {
    let f = e.constant(&[1], &[factor])?;
    elementwise(e, "ElementWiseMultiply", x, f, output)
}

/// `x` (`[rows, cols]`: `dims`) RMS-normed over each row, times `gamma` (`[cols]`).
pub fn rms_norm(e: &mut impl Emit, x: TensorRef, gamma: TensorRef, eps: f32, dims: [u32; 2], output: Option<&str>) -> Result<TensorRef> {
    let beta = e.constant(&[dims[1]], &vec![0.0; dims[1] as usize])?;
    let params = vec![ParamSpec::F32("epsilon", eps), ParamSpec::U32s("axes", vec![1])];
    e.emit("RmsNorm", &[x, gamma, beta], params, &dims, output)
}

/// The heads `normed` (of `head_dim` columns each) of `x` (`[rows, width]`) RMS-normed over
/// each head, times `gamma` (`[head_dim]`): their columns as rows of `head_dim`, normed, put
/// back between the columns before and after.
pub fn norm_heads(e: &mut impl Emit, x: TensorRef, rows: u32, normed: std::ops::Range<u32>, head_dim: u32, gamma: TensorRef, eps: f32, output: Option<&str>) -> Result<TensorRef> {
    let width = e.dims(x)[1];
    let (from, to) = (normed.start * head_dim, normed.end * head_dim);
    let heads = normed.len() as u32;
    let whole = from == 0 && to == width;
    let part = if whole { x } else { columns(e, x, rows, from, to)? };
    let part = reshape(e, part, &[rows * heads, head_dim], None)?;
    let part = rms_norm(e, part, gamma, eps, [rows * heads, head_dim], None)?;
    if whole {
        return reshape(e, part, &[rows, width], output);
    }
    let mut pieces = Vec::new();
    if from > 0 {
        pieces.push(columns(e, x, rows, 0, from)?);
    }
    pieces.push(reshape(e, part, &[rows, to - from], None)?);
    if to < width {
        pieces.push(columns(e, x, rows, to, width)?);
    }
    e.emit("Concat", &pieces, vec![ParamSpec::U32("axis", 1)], &[rows, width], output)
}

/// `gelu_tanh(gate) * up` for rows `[gate | up]` of `x` (`[rows, 2 * hidden]`). QNN's Gelu is
/// the erf form, so the tanh form is built from its terms: `0.5 (1 + tanh(z))` is
/// `sigmoid(2z)`, so `gelu_tanh(g) = g * sigmoid(2 beta g (1 + kappa g^2))`. A square past
/// fp16's range is infinite, which the sigmoid takes to 0 or 1, the function's own limits.
pub fn gelu_glu(e: &mut impl Emit, x: TensorRef, rows: u32, hidden: u32, output: Option<&str>) -> Result<TensorRef> {
    let gate = columns(e, x, rows, 0, hidden)?;
    let up = columns(e, x, rows, hidden, 2 * hidden)?;
    let square = elementwise(e, "ElementWiseMultiply", gate, gate, None)?;
    let cubic = scaled(e, square, 2.0 * GELU_BETA * GELU_KAPPA, None)?;
    let linear = e.constant(&[1], &[2.0 * GELU_BETA])?;
    let slope = elementwise(e, "ElementWiseAdd", cubic, linear, None)?;
    let z = elementwise(e, "ElementWiseMultiply", slope, gate, None)?;
    let s = e.emit("Sigmoid", &[z], vec![], &[rows, hidden], None)?;
    let gelu = elementwise(e, "ElementWiseMultiply", gate, s, None)?;
    elementwise(e, "ElementWiseMultiply", gelu, up, output)
}

/// `tanh(x / cap) * cap`: logit soft-capping.
pub fn softcap(e: &mut impl Emit, x: TensorRef, cap: f32, output: Option<&str>) -> Result<TensorRef> {
    let dims = e.dims(x);
    let z = scaled(e, x, 1.0 / cap, None)?;
    let t = e.emit("Tanh", &[z], vec![], &dims, None)?;
    scaled(e, t, cap, output)
}

/// Rotary embedding of the first `rotated` heads (of `head_dim`) of `x` (`[rows, width]`),
/// half-split: each head's halves `x1`, `x2` become `x1 cos - x2 sin`, `x2 cos + x1 sin`, with
/// `cos` and `sin` `[rows, 1, head_dim / 2]` (each row's angles, broadcast over its heads).
pub fn rope(e: &mut impl Emit, x: TensorRef, rows: u32, rotated: u32, head_dim: u32, cos: TensorRef, sin: TensorRef, output: Option<&str>) -> Result<TensorRef> {
    let width = e.dims(x)[1];
    let (half, span) = (head_dim / 2, rotated * head_dim);
    let part = if span < width { columns(e, x, rows, 0, span)? } else { x };
    let part = reshape(e, part, &[rows, rotated, head_dim], None)?;
    let slice = |e: &mut _, from: u32| {
        let ranges = vec![0, rows as i32, 1, 0, rotated as i32, 1, from as i32, (from + half) as i32, 1];
        Emit::emit(e, "StridedSlice", &[part], vec![ParamSpec::I32s("ranges", vec![3, 3], ranges)], &[rows, rotated, half], None)
    };
    let (x1, x2) = (slice(e, 0)?, slice(e, half)?);
    let product = |e: &mut _, a: TensorRef, b: TensorRef| Emit::emit(e, "ElementWiseMultiply", &[a, b], vec![], &[rows, rotated, half], None);
    let (a1, a2) = (product(e, x1, cos)?, product(e, x2, sin)?);
    let a = e.emit("ElementWiseSubtract", &[a1, a2], vec![], &[rows, rotated, half], None)?;
    let (b1, b2) = (product(e, x2, cos)?, product(e, x1, sin)?);
    let b = e.emit("ElementWiseAdd", &[b1, b2], vec![], &[rows, rotated, half], None)?;
    let cat = e.emit("Concat", &[a, b], vec![ParamSpec::U32("axis", 2)], &[rows, rotated, head_dim], None)?;
    if span == width {
        return reshape(e, cat, &[rows, width], output);
    }
    let flat = reshape(e, cat, &[rows, span], None)?;
    let rest = columns(e, x, rows, span, width)?;
    e.emit("Concat", &[flat, rest], vec![ParamSpec::U32("axis", 1)], &[rows, width], output)
}

/// Rows `positions` (`[rows]` int32) of a rotary `table` (`[positions, head_dim / 2]`, static)
/// as `[rows, 1, head_dim / 2]`, the shape [`rope`] reads.
pub fn table_rows(e: &mut impl Emit, table: TensorRef, positions: TensorRef) -> Result<TensorRef> {
    let (rows, half) = (e.dims(positions)[0], e.dims(table)[1]);
    let picked = e.emit("Gather", &[table, positions], vec![ParamSpec::I32("axis", 0)], &[rows, half], None)?;
    reshape(e, picked, &[rows, 1, half], None)
}
