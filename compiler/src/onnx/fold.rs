//! Evaluates what an export computes from shapes alone, for the one static shape a plan
//! compiles: exporters with dynamic axes build the sequence length at run time (Shape, Gather,
//! Range, ConstantOfShape, Equal and Where on shapes), and the rotary tables are cached tables
//! sliced to that length. With the token ids' shape fixed, every value that does not depend on
//! the ids' *values* is a constant; folding computes it. What is left, the nodes whose outputs
//! depend on the tokens, is the network the recogniser reads, each value with its shape.

use std::collections::HashMap;

use super::proto::{Attr, Graph, Node};
use super::ops::unknown_op;
use super::tensor::{strides, Elem, Tensor, FOLD_LIMIT};

/// A value of the graph at the compiled shape: a constant, or one that depends on the tokens.
#[derive(Clone)]
pub enum Value {
    Const(Tensor),
    Dyn { elem: Elem, dims: Vec<usize> },
}

impl Value {
    pub fn dims(&self) -> &[usize] {
        match self {
            Value::Const(t) => &t.dims,
            Value::Dyn { dims, .. } => dims,
        }
    }

    pub fn elem(&self) -> Elem {
        match self {
            Value::Const(t) => t.elem,
            Value::Dyn { elem, .. } => *elem,
        }
    }

    pub fn as_const(&self) -> Option<&Tensor> {
        match self {
            Value::Const(t) => Some(t),
            Value::Dyn { .. } => None,
        }
    }
}

pub struct Folded<'g> {
    pub graph: &'g Graph,
    pub values: HashMap<&'g str, Value>,
    /// The nodes whose outputs depend on the tokens, in graph order.
    pub live: Vec<&'g Node>,
    /// The token ids' input.
    pub ids: &'g str,
    pub seq_len: usize,
}

impl<'g> Folded<'g> {
    /// Input `i` of `node` (`None`: absent or optional and empty).
    pub fn input(&self, node: &Node, i: usize) -> Option<&Value> {
        node.inputs.get(i).filter(|n| !n.is_empty()).and_then(|n| self.values.get(n.as_str()))
    }

    pub fn value(&self, name: &str) -> Option<&Value> {
        self.values.get(name)
    }
}

/// Sequence length folded for when the export's sequence axis is dynamic: any length gives
/// the same weights; this one keeps the folded tables small.
pub const DYNAMIC_SEQ_LEN: usize = 16;

/// Binds the graph's inputs (the token ids as a `[1, seq]` dynamic value; an attention mask
/// as all ones and position ids as `0..seq`, which is what lladac's plans compute with) and
/// folds every node whose inputs are constants.
pub fn fold(g: &Graph) -> Result<Folded<'_>, String> {
    let ids = token_input(g)?;
    let input = g.inputs.iter().find(|i| i.name == ids).unwrap();
    let seq_len = match &input.dims[..] {
        [_, Some(s)] | [Some(s)] => *s,
        [_, None] | [None] => DYNAMIC_SEQ_LEN,
        d => return Err(format!("the token ids input '{ids}' has {} dimensions; a LLaDA export takes [batch, sequence]", d.len())),
    };
    if let [Some(b), _] = &input.dims[..] {
        if *b != 1 {
            return Err(format!("the token ids input '{ids}' has a static batch of {b}; lladac's plans run batch 1 (export with batch 1 or a dynamic batch axis)"));
        }
    }
    let id_dims: Vec<usize> = if input.dims.len() == 2 { vec![1, seq_len] } else { vec![seq_len] };
    let mut values: HashMap<&str, Value> = HashMap::new();
    for (name, t) in &g.initializers {
        values.insert(name.as_str(), Value::Const(t.clone()));
    }
    values.insert(ids, Value::Dyn { elem: input.elem.unwrap_or(Elem::I64), dims: id_dims.clone() });
    for other in g.inputs.iter().filter(|i| i.name != ids) {
        let elem = other.elem.unwrap_or(Elem::I64);
        let n = id_dims.iter().product::<usize>();
        let v = match other.name.as_str() {
            "attention_mask" => Tensor::ints(elem, id_dims.clone(), vec![1; n]),
            "position_ids" => Tensor::ints(elem, id_dims.clone(), (0..n as i64).collect()),
            name if other.elem.is_some_and(Elem::is_float) => {
                return Err(format!(
                    "graph input '{name}' is a float tensor: the weights are graph inputs rather than initializers; export with export_params=True (torch.onnx.export's default)"
                ))
            }
            name => {
                return Err(format!(
                    "graph input '{name}': a LLaDA export takes the token ids (and optionally attention_mask and position_ids); lladac does not know what to feed '{name}'"
                ))
            }
        };
        values.insert(other.name.as_str(), Value::Const(v));
    }

    let mut live = Vec::new();
    for node in &g.nodes {
        let inputs: Vec<Option<&Value>> = node.inputs.iter().map(|n| if n.is_empty() { None } else { values.get(n.as_str()) }).collect();
        let all_const = inputs.iter().all(|v| !matches!(v, Some(Value::Dyn { .. })));
        let outs = if node.op == "Shape" {
            let v = inputs.first().copied().flatten().ok_or_else(|| format!("{}: no input", node.label()))?;
            vec![Value::Const(shape_of(node, v.dims()))]
        } else if let (Some(Some(Value::Const(t))), true) = (inputs.first(), node.op == "CastLike") {
            // CastLike reads only its second input's type (`type_as` on a cached table).
            let to = inputs.get(1).copied().flatten().map_or(t.elem, Value::elem);
            vec![Value::Const(cast(t, to).map_err(|e| format!("{}: {e}", node.label()))?)]
        } else if all_const {
            let ins: Vec<Option<&Tensor>> = inputs.iter().map(|v| v.and_then(Value::as_const)).collect();
            eval(node, &ins, g.opset).map_err(|e| format!("{}: {e}", node.label()))?.into_iter().map(Value::Const).collect()
        } else {
            live.push(node);
            let outs = infer(node, &inputs, g.opset).map_err(|e| format!("{}: {e}", node.label()))?;
            // Token-dependent values are never built, but their sizes must be real ones.
            if let Some(v) = outs.iter().find(|v| v.dims().iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none_or(|n| n > isize::MAX as usize)) {
                return Err(format!("{}: an output of shape {:?}, past any memory", node.label(), v.dims()));
            }
            outs
        };
        for (name, v) in node.outputs.iter().zip(outs) {
            if !name.is_empty() {
                values.insert(name.as_str(), v);
            }
        }
    }
    Ok(Folded { graph: g, values, live, ids, seq_len })
}

/// The token ids: the input named `input_ids`, or the one integer input.
fn token_input(g: &Graph) -> Result<&str, String> {
    if let Some(i) = g.inputs.iter().find(|i| i.name == "input_ids") {
        return Ok(&i.name);
    }
    let ints: Vec<&str> = g.inputs.iter().filter(|i| matches!(i.elem, Some(Elem::I64 | Elem::I32))).map(|i| i.name.as_str()).collect();
    match &ints[..] {
        [one] => Ok(one),
        _ => Err(format!(
            "cannot tell which graph input is the token ids (inputs: {}); name it 'input_ids'",
            g.inputs.iter().map(|i| format!("'{}'", i.name)).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Cast's target type, which the op must name.
fn cast_to(node: &Node) -> Result<Elem, String> {
    let to = node.int("to").ok_or("a Cast without its 'to' attribute")?;
    i32::try_from(to).ok().and_then(Elem::from_onnx).ok_or_else(|| format!("a Cast to element type {to}, which lladac does not read"))
}

fn shape_of(node: &Node, dims: &[usize]) -> Tensor {
    let r = dims.len() as i64;
    let clamp = |i: i64| (if i < 0 { i + r } else { i }).clamp(0, r) as usize;
    let start = clamp(node.int("start").unwrap_or(0));
    let end = clamp(node.int("end").unwrap_or(r));
    let v: Vec<i64> = dims[start..end.max(start)].iter().map(|&d| d as i64).collect();
    Tensor::ints(Elem::I64, vec![v.len()], v)
}

/// Flatten's axis: `-rank..=rank`, a negative one counted from the end.
fn flatten_axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&x) {
        return Err(format!("axis {a} is outside rank {rank}"));
    }
    Ok(x as usize)
}

fn axis(a: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let x = if a < 0 { a + r } else { a };
    if !(0..r).contains(&x) {
        return Err(format!("axis {a} is outside rank {rank}"));
    }
    Ok(x as usize)
}

/// Numpy broadcasting of two shapes.
fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        };
    }
    Ok(out)
}

/// For each element of `out`, the index of the element of `from` that broadcasting reads.
fn broadcast_index(from: &[usize], out: &[usize]) -> Vec<usize> {
    let n = out.len();
    let fs = strides(from);
    let total: usize = out.iter().product();
    let mut idx = Vec::with_capacity(total);
    let os = strides(out);
    for flat in 0..total {
        let mut src = 0;
        for d in 0..n {
            let coord = (flat / os[d]) % out[d].max(1);
            if d + from.len() >= n {
                let fd = d + from.len() - n;
                if from[fd] != 1 {
                    src += coord * fs[fd];
                }
            }
        }
        idx.push(src);
    }
    idx
}

/// Refuses to fold an output past `FOLD_LIMIT` elements (or whose size overflows): shape
/// arithmetic and tables are small, and a malformed file must not exhaust memory.
fn small(dims: &[usize]) -> Result<usize, String> {
    dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).filter(|&n| n <= FOLD_LIMIT).ok_or_else(|| format!("folding would build a constant of shape {dims:?}, past what lladac folds ({FOLD_LIMIT} elements)"))
}

/// A constant input that must be there.
fn need<'a>(ins: &[Option<&'a Tensor>], i: usize, what: &str) -> Result<&'a Tensor, String> {
    ins.get(i).copied().flatten().ok_or_else(|| format!("its {what} input is missing or depends on the token values (lladac folds it at a static shape)"))
}

/// An int-list operand (axes, shape, starts...): from input `i` where the opset puts it in
/// an input, else from attribute `attr`.
fn int_list(node: &Node, ins: &[Option<&Tensor>], i: usize, attr: &str) -> Result<Option<Vec<i64>>, String> {
    if let Some(t) = ins.get(i).copied().flatten() {
        return Ok(Some(t.i64s()?.into_owned()));
    }
    Ok(node.ints(attr).map(|v| v.to_vec()))
}

/// Slice parameters resolved against `dims`: for each axis, (start, step, count).
fn slice_plan(node: &Node, dims: &[usize], ins: &[Option<&Tensor>]) -> Result<Vec<(i64, i64, usize)>, String> {
    let starts = int_list(node, ins, 1, "starts")?.ok_or("needs starts")?;
    let ends = int_list(node, ins, 2, "ends")?.ok_or("needs ends")?;
    let axes = int_list(node, ins, 3, "axes")?.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = int_list(node, ins, 4, "steps")?.unwrap_or_else(|| vec![1; starts.len()]);
    let mut plan: Vec<(i64, i64, usize)> = dims.iter().map(|&d| (0, 1, d)).collect();
    for k in 0..starts.len() {
        let ax = axis(*axes.get(k).ok_or("fewer axes than starts")?, dims.len())?;
        let d = dims[ax] as i64;
        // A step past the axis takes one element, like one of exactly the axis's length.
        let step = steps.get(k).copied().unwrap_or(1).clamp(-(d + 1), d + 1);
        if step == 0 {
            return Err("a slice step of 0".into());
        }
        let norm = |v: i64, lo: i64, hi: i64| (if v < 0 { v + d } else { v }).clamp(lo, hi);
        let (start, end) = if step > 0 { (norm(starts[k], 0, d), norm(*ends.get(k).ok_or("fewer ends than starts")?, 0, d)) } else { (norm(starts[k], -1, d - 1), norm(*ends.get(k).ok_or("fewer ends than starts")?, -1, d - 1)) };
        let count = if step > 0 { (end - start + step - 1).max(0) / step } else { (start - end - step - 1).max(0) / -step };
        plan[ax] = (start, step, count as usize);
    }
    Ok(plan)
}

fn reshape_dims(node: &Node, from: &[usize], shape: &[i64]) -> Result<Vec<usize>, String> {
    let allowzero = node.int("allowzero").unwrap_or(0) != 0;
    let total: usize = from.iter().product();
    let mut out = Vec::with_capacity(shape.len());
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        out.push(match s {
            0 if !allowzero => *from.get(i).ok_or("a 0 in the shape past the input's rank")?,
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                1
            }
            s if s >= 0 => s as usize,
            s => return Err(format!("shape entry {s}")),
        });
    }
    let product = |d: &[usize]| d.iter().try_fold(1usize, |n, &x| n.checked_mul(x));
    if let Some(i) = infer_at {
        let rest = product(&out).unwrap_or(0);
        if rest == 0 || total % rest != 0 {
            return Err(format!("cannot reshape {from:?} to {shape:?}"));
        }
        out[i] = total / rest;
    }
    if product(&out) != Some(total) {
        return Err(format!("cannot reshape {from:?} ({total} elements) to {out:?}"));
    }
    Ok(out)
}

fn split_sizes(node: &Node, ins: &[Option<&Tensor>], dim: usize, opset: i64) -> Result<Vec<usize>, String> {
    let n_out = node.outputs.len();
    let given = if opset >= 13 { ins.get(1).copied().flatten().map(|t| t.i64s().map(|v| v.into_owned())).transpose()? } else { node.ints("split").map(|v| v.to_vec()) };
    Ok(match given {
        Some(s) => {
            let s: Vec<usize> = s.into_iter().map(|x| x.max(0) as usize).collect();
            if s.len() != n_out || s.iter().try_fold(0usize, |a, &x| a.checked_add(x)) != Some(dim) {
                return Err(format!("split sizes {s:?} do not give {n_out} outputs adding up to the axis's {dim}"));
            }
            s
        }
        None => {
            let n = node.int("num_outputs").map_or(n_out, |n| n as usize).max(1);
            let each = dim.div_ceil(n);
            (0..n).map(|i| each.min(dim.saturating_sub(i * each))).collect()
        }
    })
}

fn transpose_perm(node: &Node, rank: usize) -> Result<Vec<usize>, String> {
    let perm: Vec<usize> = match node.ints("perm") {
        Some(p) => p.iter().map(|&a| axis(a, rank)).collect::<Result<_, _>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort_unstable();
    if seen != (0..rank).collect::<Vec<_>>() {
        return Err(format!("perm {perm:?} is not a permutation of rank {rank}"));
    }
    Ok(perm)
}

fn unsqueeze_dims(dims: &[usize], axes: &[i64]) -> Result<Vec<usize>, String> {
    let rank = dims.len() + axes.len();
    let mut ax: Vec<usize> = axes.iter().map(|&a| axis(a, rank)).collect::<Result<_, _>>()?;
    ax.sort_unstable();
    let mut out = Vec::with_capacity(rank);
    let mut src = dims.iter();
    for i in 0..rank {
        out.push(if ax.contains(&i) { 1 } else { *src.next().ok_or("too many axes")? });
    }
    Ok(out)
}

fn squeeze_dims(dims: &[usize], axes: Option<&[i64]>) -> Result<Vec<usize>, String> {
    let ax: Vec<usize> = match axes {
        Some(a) => a.iter().map(|&a| axis(a, dims.len())).collect::<Result<_, _>>()?,
        None => (0..dims.len()).filter(|&i| dims[i] == 1).collect(),
    };
    if let Some(&a) = ax.iter().find(|&&a| dims[a] != 1) {
        return Err(format!("squeezes axis {a} of size {}", dims[a]));
    }
    Ok(dims.iter().enumerate().filter(|(i, _)| !ax.contains(i)).map(|(_, &d)| d).collect())
}

fn reduce_axes(node: &Node, ins: &[Option<&Tensor>], rank: usize, opset: i64) -> Result<Vec<usize>, String> {
    let from_input = node.op != "ReduceMean" || opset >= 18;
    let axes = if from_input { int_list(node, ins, 1, "axes")? } else { node.ints("axes").map(|v| v.to_vec()) };
    match axes {
        Some(a) if !a.is_empty() => a.iter().map(|&x| axis(x, rank)).collect(),
        // Empty axes reduce everything, unless noop_with_empty_axes makes the op an identity.
        _ if node.int("noop_with_empty_axes").unwrap_or(0) != 0 => Ok(Vec::new()),
        _ => Ok((0..rank).collect()),
    }
}

fn matmul_dims(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    if a.len() < 2 || b.len() < 2 {
        return Err(format!("MatMul of shapes {a:?} and {b:?}: lladac folds matrix products only"));
    }
    let (m, k) = (a[a.len() - 2], a[a.len() - 1]);
    let (k2, n) = (b[b.len() - 2], b[b.len() - 1]);
    if k != k2 {
        return Err(format!("MatMul of shapes {a:?} and {b:?}: inner dimensions differ"));
    }
    let mut out = broadcast(&a[..a.len() - 2], &b[..b.len() - 2])?;
    out.extend([m, n]);
    Ok(out)
}

/// Unsqueeze's axes: an input from opset 13, an attribute before.
fn unsqueeze_axes(node: &Node, ins: &[Option<&Tensor>], opset: i64) -> Result<Vec<i64>, String> {
    Ok(if opset >= 13 { need(ins, 1, "axes")?.i64s()?.into_owned() } else { node.ints("axes").ok_or("needs axes")?.to_vec() })
}

/// Squeeze's axes where given (none squeezes every axis of size 1): an optional input from
/// opset 13, an attribute before.
fn squeeze_axes(node: &Node, ins: &[Option<&Tensor>], opset: i64) -> Result<Option<Vec<i64>>, String> {
    if opset >= 13 {
        ins.get(1).copied().flatten().map(|t| t.i64s().map(|v| v.into_owned())).transpose()
    } else {
        Ok(node.ints("axes").map(|v| v.to_vec()))
    }
}

/// Flatten's output: the dims before its axis multiplied out, then those from it.
fn flatten_dims(node: &Node, dims: &[usize]) -> Result<Vec<usize>, String> {
    let ax = flatten_axis(node.int("axis").unwrap_or(1), dims.len())?;
    Ok(vec![dims[..ax].iter().product(), dims[ax..].iter().product()])
}

/// Expand's target shape (a negative entry reads as 0).
fn expand_shape(ins: &[Option<&Tensor>]) -> Result<Vec<usize>, String> {
    Ok(need(ins, 1, "shape")?.i64s()?.iter().map(|&x| x.max(0) as usize).collect())
}

/// Tile's output: each axis `reps` times as long.
fn tile_dims(dims: &[usize], reps: &[i64]) -> Result<Vec<usize>, String> {
    if reps.len() != dims.len() {
        return Err("repeats of another rank than the input".into());
    }
    Ok(dims.iter().zip(reps).map(|(&d, &r)| d.saturating_mul(r.max(0) as usize)).collect())
}

/// Gather's output: the data's dims with axis `ax` replaced by the indices' dims.
fn gather_dims(data: &[usize], idx: &[usize], ax: usize) -> Vec<usize> {
    let mut out = data[..ax].to_vec();
    out.extend(idx);
    out.extend(&data[ax + 1..]);
    out
}

/// A reduction's output: the reduced axes kept as 1, or dropped.
fn reduced_dims(dims: &[usize], axes: &[usize], keep: bool) -> Vec<usize> {
    dims.iter().enumerate().filter_map(|(i, &x)| if axes.contains(&i) { keep.then_some(1) } else { Some(x) }).collect()
}

/// Split's axis and each output's dims.
fn split_dims(node: &Node, ins: &[Option<&Tensor>], dims: &[usize], opset: i64) -> Result<(usize, Vec<Vec<usize>>), String> {
    let ax = axis(node.int("axis").unwrap_or(0), dims.len())?;
    let sizes = split_sizes(node, ins, dims[ax], opset)?;
    let parts = sizes
        .into_iter()
        .map(|s| {
            let mut d = dims.to_vec();
            d[ax] = s;
            d
        })
        .collect();
    Ok((ax, parts))
}

/// Gemm's output `[m, n]`, each read across its transpose flag.
fn gemm_dims(node: &Node, a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let [m0, m1] = a[..] else { return Err("Gemm of a non-matrix".into()) };
    let [n0, n1] = b[..] else { return Err("Gemm with a non-matrix weight".into()) };
    let m = if node.int("transA").unwrap_or(0) != 0 { m1 } else { m0 };
    let n = if node.int("transB").unwrap_or(0) != 0 { n0 } else { n1 };
    Ok(vec![m, n])
}

/// The result of an `Attention` op on q and v of these shapes: 4-D `[batch, heads, seq,
/// head_dim]`, or 3-D with the heads folded into the last axis (counted by the attributes).
fn attention_dims(node: &Node, q: &[usize], v: &[usize]) -> Result<Vec<usize>, String> {
    Ok(match (q.len(), v.len()) {
        (4, 4) => vec![q[0], q[1], q[2], v[3]],
        (3, 3) => {
            let heads = |k: &str| node.int(k).and_then(|h| usize::try_from(h).ok()).filter(|&h| h > 0).ok_or(format!("3-D inputs need a positive {k}"));
            let (qh, kvh) = (heads("q_num_heads")?, heads("kv_num_heads")?);
            vec![q[0], q[1], qh.saturating_mul(v[2] / kvh)]
        }
        _ => return Err(format!("inputs of shapes {q:?} and {v:?}")),
    })
}

/// Shapes and types of a node whose inputs include a token-dependent value.
fn infer(node: &Node, inputs: &[Option<&Value>], opset: i64) -> Result<Vec<Value>, String> {
    let dims = |i: usize| inputs.get(i).copied().flatten().map(|v| v.dims().to_vec()).ok_or_else(|| format!("needs input {i}"));
    let elem0 = inputs.first().copied().flatten().map_or(Elem::F32, Value::elem);
    let consts: Vec<Option<&Tensor>> = inputs.iter().map(|v| v.and_then(Value::as_const)).collect();
    let one = |elem: Elem, dims: Vec<usize>| Ok(vec![Value::Dyn { elem, dims }]);
    // A mix of constants and token-dependent values has the token-dependent one's type.
    let dyn_elem = || inputs.iter().flatten().find(|v| matches!(v, Value::Dyn { .. })).map_or(elem0, |v| v.elem());
    let op = node.op.as_str();
    match op {
        "Identity" | "Neg" | "Sqrt" | "Reciprocal" | "Sigmoid" | "Softmax" | "Exp" | "Tanh" | "Relu" | "Abs" | "Erf" | "Dropout" | "Sin" | "Cos" | "Floor" => {
            one(elem0, dims(0)?)
        }
        "Cast" => one(cast_to(node)?, dims(0)?),
        "CastLike" => one(inputs.get(1).copied().flatten().map_or(elem0, Value::elem), dims(0)?),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" => one(if op == "Pow" { elem0 } else { dyn_elem() }, broadcast(&dims(0)?, &dims(1)?)?),
        "Equal" | "Less" | "Greater" | "Not" | "And" | "Or" => {
            let d = if op == "Not" { dims(0)? } else { broadcast(&dims(0)?, &dims(1)?)? };
            one(Elem::Bool, d)
        }
        "Where" => {
            let elem = inputs.get(1).copied().flatten().map_or(Elem::F32, Value::elem);
            one(elem, broadcast(&broadcast(&dims(0)?, &dims(1)?)?, &dims(2)?)?)
        }
        "MatMul" => one(elem0, matmul_dims(&dims(0)?, &dims(1)?)?),
        "Gemm" => one(elem0, gemm_dims(node, &dims(0)?, &dims(1)?)?),
        "Gather" => {
            let (data, idx) = (dims(0)?, dims(1)?);
            let ax = axis(node.int("axis").unwrap_or(0), data.len())?;
            one(inputs[0].map_or(elem0, Value::elem), gather_dims(&data, &idx, ax))
        }
        "Reshape" => {
            let shape = need(&consts, 1, "shape")?.i64s()?;
            one(elem0, reshape_dims(node, &dims(0)?, &shape)?)
        }
        "Flatten" => one(elem0, flatten_dims(node, &dims(0)?)?),
        "Transpose" => {
            let d = dims(0)?;
            one(elem0, transpose_perm(node, d.len())?.iter().map(|&p| d[p]).collect())
        }
        "Unsqueeze" => {
            let axes = unsqueeze_axes(node, &consts, opset)?;
            one(elem0, unsqueeze_dims(&dims(0)?, &axes)?)
        }
        "Squeeze" => {
            let axes = squeeze_axes(node, &consts, opset)?;
            one(elem0, squeeze_dims(&dims(0)?, axes.as_deref())?)
        }
        "Slice" => {
            let d = dims(0)?;
            one(elem0, slice_plan(node, &d, &consts)?.iter().map(|p| p.2).collect())
        }
        "Split" => {
            let (_, parts) = split_dims(node, &consts, &dims(0)?, opset)?;
            Ok(parts.into_iter().map(|dims| Value::Dyn { elem: elem0, dims }).collect())
        }
        "Concat" => {
            let parts: Vec<Vec<usize>> = inputs.iter().flatten().map(|v| v.dims().to_vec()).collect();
            let first = parts.first().ok_or("no inputs")?.clone();
            let ax = axis(node.int("axis").ok_or("needs axis")?, first.len())?;
            if parts.iter().any(|p| p.len() != first.len()) {
                return Err("concatenates tensors of different ranks".into());
            }
            let mut out = first;
            out[ax] = parts.iter().map(|p| p.get(ax).copied().unwrap_or(0)).sum();
            one(dyn_elem(), out)
        }
        "Expand" => {
            let shape = expand_shape(&consts)?;
            one(elem0, broadcast(&dims(0)?, &shape)?)
        }
        "Tile" => {
            let reps = need(&consts, 1, "repeats")?.i64s()?.into_owned();
            one(elem0, tile_dims(&dims(0)?, &reps)?)
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" => {
            let d = dims(0)?;
            let axes = reduce_axes(node, &consts, d.len(), opset)?;
            one(elem0, reduced_dims(&d, &axes, node.int("keepdims").unwrap_or(1) != 0))
        }
        "RMSNormalization" | "LayerNormalization" | "SimplifiedLayerNormalization" | "com.microsoft::SimplifiedLayerNormalization" | "RotaryEmbedding" | "com.microsoft::RotaryEmbedding" => {
            let d = dims(0)?;
            let mut outs = vec![Value::Dyn { elem: elem0, dims: d }];
            // Optional statistics outputs (mean, inverse std) are not read by a LLaDA graph.
            outs.extend((1..node.outputs.len()).map(|_| Value::Dyn { elem: Elem::F32, dims: vec![] }));
            Ok(outs)
        }
        "Attention" => {
            let out = attention_dims(node, &dims(0)?, &dims(2)?)?;
            let mut outs = vec![Value::Dyn { elem: elem0, dims: out }];
            outs.extend((1..node.outputs.len()).map(|_| Value::Dyn { elem: elem0, dims: vec![] }));
            Ok(outs)
        }
        _ => Err(unknown_op(op)),
    }
}

/// Evaluates a node whose inputs are all constants.
fn eval(node: &Node, ins: &[Option<&Tensor>], opset: i64) -> Result<Vec<Tensor>, String> {
    let op = node.op.as_str();
    let x = || need(ins, 0, "first");
    let single = |t: Tensor| Ok(vec![t]);
    match op {
        "Constant" => single(constant(node)?),
        "Identity" | "Dropout" => single(x()?.clone()),
        "Cast" | "CastLike" => {
            let to = if op == "Cast" { cast_to(node)? } else { need(ins, 1, "target")?.elem };
            single(cast(x()?, to)?)
        }
        "Size" => single(Tensor::scalar_i64(x()?.numel() as i64)),
        "Neg" | "Sqrt" | "Reciprocal" | "Sin" | "Cos" | "Exp" | "Abs" | "Floor" | "Ceil" | "Sigmoid" | "Not" | "Tanh" | "Relu" => single(unary(op, x()?)?),
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Max" | "Min" | "Mod" | "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" => {
            single(binary(node, x()?, need(ins, 1, "second")?)?)
        }
        "Where" => single(select_where(x()?, need(ins, 1, "second")?, need(ins, 2, "third")?)?),
        "Range" => single(range(x()?, ins)?),
        "ConstantOfShape" => single(constant_of_shape(node, x()?)?),
        "OneHot" => single(one_hot(node, x()?, ins)?),
        "Reshape" => {
            let t = x()?;
            single(t.reshaped(reshape_dims(node, &t.dims, &need(ins, 1, "shape")?.i64s()?)?))
        }
        "Flatten" => {
            let t = x()?;
            single(t.reshaped(flatten_dims(node, &t.dims)?))
        }
        "Unsqueeze" => {
            let t = x()?;
            single(t.reshaped(unsqueeze_dims(&t.dims, &unsqueeze_axes(node, ins, opset)?)?))
        }
        "Squeeze" => {
            let t = x()?;
            single(t.reshaped(squeeze_dims(&t.dims, squeeze_axes(node, ins, opset)?.as_deref())?))
        }
        "Transpose" => single(transpose(node, x()?)?),
        "Slice" => single(slice(node, x()?, ins)?),
        "Gather" => single(gather(node, x()?, need(ins, 1, "indices")?)?),
        "Concat" => single(concat(node, ins)?),
        "Split" => split(node, x()?, ins, opset),
        "Expand" => {
            let t = x()?;
            single(expand(t, &expand_shape(ins)?)?)
        }
        "Tile" => {
            let t = x()?;
            single(tile(t, &need(ins, 1, "repeats")?.i64s()?)?)
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd" => single(reduce(node, x()?, ins, opset)?),
        "MatMul" => single(matmul(x()?, need(ins, 1, "second")?)?),
        _ => Err(unknown_op(op)),
    }
}

/// A Constant's value, from whichever attribute holds it.
fn constant(node: &Node) -> Result<Tensor, String> {
    let a = |k: &str| node.attrs.get(k);
    Ok(match (a("value"), a("value_float"), a("value_floats"), a("value_int"), a("value_ints")) {
        (Some(Attr::Tensor(t)), ..) => t.clone(),
        (_, Some(Attr::Float(f)), ..) => Tensor::floats(Elem::F32, vec![], vec![*f]),
        (_, _, Some(Attr::Floats(f)), ..) => Tensor::floats(Elem::F32, vec![f.len()], f.clone()),
        (.., Some(Attr::Int(i)), _) => Tensor::scalar_i64(*i),
        (.., Some(Attr::Ints(v))) => Tensor::ints(Elem::I64, vec![v.len()], v.clone()),
        _ => return Err("a Constant without a numeric value".into()),
    })
}

/// `t` converted to element type `to` (`t` itself where it has that type).
fn cast(t: &Tensor, to: Elem) -> Result<Tensor, String> {
    if t.elem == to {
        return Ok(t.clone());
    }
    Ok(Tensor::floats(to, t.dims.clone(), t.f64s()?.into_owned()))
}

/// An elementwise op of one input.
fn unary(op: &str, t: &Tensor) -> Result<Tensor, String> {
    let f: fn(f64) -> f64 = match op {
        "Neg" => |v| -v,
        "Sqrt" => f64::sqrt,
        "Reciprocal" => |v| 1.0 / v,
        "Sin" => f64::sin,
        "Cos" => f64::cos,
        "Exp" => f64::exp,
        "Abs" => f64::abs,
        "Floor" => f64::floor,
        "Ceil" => f64::ceil,
        "Sigmoid" => |v| 1.0 / (1.0 + (-v).exp()),
        "Tanh" => f64::tanh,
        "Relu" => |v| v.max(0.0),
        _ => |v| (v == 0.0) as u8 as f64,
    };
    // Rounded through the element type once, as the exporter's runtime would compute.
    Ok(Tensor::floats(t.elem, t.dims.clone(), t.f64s()?.iter().map(|&v| f(t.elem.round(v))).collect()))
}

/// An elementwise op of two broadcast inputs: arithmetic (in `a`'s type) or a comparison or
/// logic op (boolean).
fn binary(node: &Node, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let op = node.op.as_str();
    let out = broadcast(&a.dims, &b.dims)?;
    small(&out)?;
    let (ia, ib) = (broadcast_index(&a.dims, &out), broadcast_index(&b.dims, &out));
    let (va, vb) = (a.f64s()?, b.f64s()?);
    let int = !a.elem.is_float();
    // Mod's fmod=1 keeps the dividend's sign (C's fmod); the default floors.
    let fmod = node.int("fmod").unwrap_or(0) != 0;
    let f = |p: f64, q: f64| -> f64 {
        match op {
            "Add" => p + q,
            "Sub" => p - q,
            "Mul" => p * q,
            "Div" if int => (p / q).trunc(),
            "Div" => p / q,
            "Pow" => p.powf(q),
            "Max" => p.max(q),
            "Min" => p.min(q),
            "Mod" if fmod => p % q,
            "Mod" => p - q * (p / q).floor(),
            "Equal" => (p == q) as u8 as f64,
            "Less" => (p < q) as u8 as f64,
            "Greater" => (p > q) as u8 as f64,
            "LessOrEqual" => (p <= q) as u8 as f64,
            "GreaterOrEqual" => (p >= q) as u8 as f64,
            "And" => (p != 0.0 && q != 0.0) as u8 as f64,
            _ => (p != 0.0 || q != 0.0) as u8 as f64,
        }
    };
    let v: Vec<f64> = ia.iter().zip(&ib).map(|(&i, &j)| f(va[i], vb[j])).collect();
    let elem = if matches!(op, "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or") { Elem::Bool } else { a.elem };
    Ok(Tensor::floats(elem, out, v))
}

/// Where: `a` where the condition `c` holds, else `b`, all three broadcast.
fn select_where(c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let out = broadcast(&broadcast(&c.dims, &a.dims)?, &b.dims)?;
    small(&out)?;
    let (ic, ia, ib) = (broadcast_index(&c.dims, &out), broadcast_index(&a.dims, &out), broadcast_index(&b.dims, &out));
    let (vc, va, vb) = (c.f64s()?, a.f64s()?, b.f64s()?);
    let v = (0..ic.len()).map(|k| if vc[ic[k]] != 0.0 { va[ia[k]] } else { vb[ib[k]] }).collect();
    Ok(Tensor::floats(a.elem, out, v))
}

/// Range: from `start` below the limit (input 1) by the delta (input 2).
fn range(start: &Tensor, ins: &[Option<&Tensor>]) -> Result<Tensor, String> {
    let (s, l, d) = (start.scalar().ok_or("start")?, need(ins, 1, "limit")?.scalar().ok_or("limit")?, need(ins, 2, "delta")?.scalar().ok_or("delta")?);
    let n = ((l - s) / d).ceil().max(0.0).min(usize::MAX as f64) as usize;
    small(&[n])?;
    Ok(Tensor::floats(start.elem, vec![n], (0..n).map(|i| s + i as f64 * d).collect()))
}

/// ConstantOfShape: a tensor of `shape` filled with the `value` attribute (0.0 as f32 without).
fn constant_of_shape(node: &Node, shape: &Tensor) -> Result<Tensor, String> {
    let dims: Vec<usize> = shape.i64s()?.iter().map(|&d| d.max(0) as usize).collect();
    small(&dims)?;
    let (elem, v) = match node.attrs.get("value") {
        Some(Attr::Tensor(t)) => (t.elem, t.scalar().unwrap_or(0.0)),
        _ => (Elem::F32, 0.0),
    };
    let n = dims.iter().product();
    Ok(Tensor::floats(elem, dims, vec![v; n]))
}

/// OneHot of the indices `idx`: TorchScript's repeat_interleave (grouped-query attention)
/// builds its index pattern from shapes with it.
fn one_hot(node: &Node, idx: &Tensor, ins: &[Option<&Tensor>]) -> Result<Tensor, String> {
    let depth = need(ins, 1, "depth")?.scalar().ok_or("a depth that is not a scalar")? as i64;
    let values = need(ins, 2, "values")?;
    let [off, on] = values.f64s()?[..] else { return Err("values that are not [off, on]".into()) };
    let rank = idx.dims.len() + 1;
    let ax = axis(node.int("axis").unwrap_or(-1), rank)?;
    let mut out = idx.dims.clone();
    out.insert(ax, depth.max(0) as usize);
    small(&out)?;
    let (outer, inner) = (idx.dims[..ax].iter().product::<usize>(), idx.dims[ax..].iter().product::<usize>());
    let ids = idx.i64s()?;
    let mut v = vec![off; out.iter().product()];
    for o in 0..outer {
        for i in 0..inner {
            let raw = ids[o * inner + i];
            let k = if raw < 0 { raw + depth } else { raw };
            if (0..depth).contains(&k) {
                v[(o * depth as usize + k as usize) * inner + i] = on;
            }
        }
    }
    Ok(Tensor::floats(values.elem, out, v))
}

fn transpose(node: &Node, t: &Tensor) -> Result<Tensor, String> {
    let perm = transpose_perm(node, t.dims.len())?;
    let out: Vec<usize> = perm.iter().map(|&p| t.dims[p]).collect();
    let (is, os) = (strides(&t.dims), strides(&out));
    let index = (0..t.numel()).map(|flat| perm.iter().enumerate().map(|(d, &p)| ((flat / os[d]) % out[d]) * is[p]).sum());
    Ok(t.select(out.clone(), index))
}

fn slice(node: &Node, t: &Tensor, ins: &[Option<&Tensor>]) -> Result<Tensor, String> {
    let plan = slice_plan(node, &t.dims, ins)?;
    let out: Vec<usize> = plan.iter().map(|p| p.2).collect();
    let (is, os) = (strides(&t.dims), strides(&out));
    let index = (0..out.iter().product::<usize>()).map(|flat| plan.iter().enumerate().map(|(d, &(s, st, _))| ((s + ((flat / os[d]) % out[d]) as i64 * st) as usize) * is[d]).sum());
    Ok(t.select(out.clone(), index))
}

/// Gather: the slices of `t` along its axis at the indices `idx` (a negative one counted from
/// the end).
fn gather(node: &Node, t: &Tensor, idx: &Tensor) -> Result<Tensor, String> {
    let ax = axis(node.int("axis").unwrap_or(0), t.dims.len())?;
    let ids: Vec<usize> = idx.i64s()?.iter().map(|&i| if i < 0 { (i + t.dims[ax] as i64) as usize } else { i as usize }).collect();
    if let Some(bad) = ids.iter().find(|&&i| i >= t.dims[ax]) {
        return Err(format!("index {bad} outside axis of {}", t.dims[ax]));
    }
    let outer: usize = t.dims[..ax].iter().product();
    let inner: usize = t.dims[ax + 1..].iter().product();
    let out = gather_dims(&t.dims, &idx.dims, ax);
    if out.iter().product::<usize>() > t.numel() {
        small(&out)?;
    }
    let index = (0..outer).flat_map(|o| ids.iter().flat_map(move |&i| (0..inner).map(move |j| (o * t.dims[ax] + i) * inner + j)));
    Ok(t.select(out, index.collect::<Vec<_>>().into_iter()))
}

fn concat(node: &Node, ins: &[Option<&Tensor>]) -> Result<Tensor, String> {
    let parts: Vec<&Tensor> = ins.iter().flatten().copied().collect();
    let first = parts.first().ok_or("no inputs")?;
    let ax = axis(node.int("axis").ok_or("needs axis")?, first.dims.len())?;
    if parts.iter().any(|p| p.dims.len() != first.dims.len() || (0..first.dims.len()).any(|d| d != ax && p.dims[d] != first.dims[d])) {
        return Err("concatenates tensors whose other axes differ".into());
    }
    let mut out = first.dims.clone();
    out[ax] = parts.iter().map(|p| p.dims[ax]).sum();
    small(&out)?;
    let outer: usize = out[..ax].iter().product();
    let values = parts.iter().map(|p| p.f64s()).collect::<Result<Vec<_>, _>>()?;
    let mut v = Vec::with_capacity(out.iter().product());
    for o in 0..outer {
        for (p, pv) in parts.iter().zip(&values) {
            let chunk: usize = p.dims[ax..].iter().product();
            v.extend_from_slice(&pv[o * chunk..(o + 1) * chunk]);
        }
    }
    Ok(Tensor::floats(first.elem, out, v))
}

/// Split's outputs: consecutive pieces of `t` along its axis.
fn split(node: &Node, t: &Tensor, ins: &[Option<&Tensor>], opset: i64) -> Result<Vec<Tensor>, String> {
    let (ax, parts) = split_dims(node, ins, &t.dims, opset)?;
    let mut start = 0;
    let mut outs = Vec::new();
    for d in parts {
        let (is, os) = (strides(&t.dims), strides(&d));
        let index = (0..d.iter().product::<usize>()).map(|flat| (0..d.len()).map(|k| ((flat / os[k]) % d[k] + if k == ax { start } else { 0 }) * is[k]).sum());
        outs.push(t.select(d.clone(), index));
        start += d[ax];
    }
    Ok(outs)
}

fn expand(t: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    let out = broadcast(&t.dims, shape)?;
    small(&out)?;
    let index = broadcast_index(&t.dims, &out);
    Ok(t.select(out, index.into_iter()))
}

fn tile(t: &Tensor, reps: &[i64]) -> Result<Tensor, String> {
    let out = tile_dims(&t.dims, reps)?;
    small(&out)?;
    let (is, os) = (strides(&t.dims), strides(&out));
    let index = (0..out.iter().product::<usize>()).map(|flat| (0..out.len()).map(|k| ((flat / os[k]) % out[k] % t.dims[k]) * is[k]).sum());
    Ok(t.select(out.clone(), index))
}

/// ReduceMean, ReduceSum, ReduceMax, ReduceMin or ReduceProd of `t` over the node's axes.
fn reduce(node: &Node, t: &Tensor, ins: &[Option<&Tensor>], opset: i64) -> Result<Tensor, String> {
    let axes = reduce_axes(node, ins, t.dims.len(), opset)?;
    let keep = node.int("keepdims").unwrap_or(1) != 0;
    let kept = reduced_dims(&t.dims, &axes, true);
    let (is, ks) = (strides(&t.dims), strides(&kept));
    let n_out: usize = kept.iter().product();
    let mut acc: Vec<Vec<f64>> = vec![Vec::new(); n_out];
    let v = t.f64s()?;
    for (flat, &x) in v.iter().enumerate() {
        let o: usize = (0..t.dims.len()).map(|d| if axes.contains(&d) { 0 } else { ((flat / is[d]) % t.dims[d]) * ks[d] }).sum();
        acc[o].push(x);
    }
    let r: Vec<f64> = acc
        .iter()
        .map(|a| match node.op.as_str() {
            "ReduceMean" => a.iter().sum::<f64>() / a.len().max(1) as f64,
            "ReduceSum" => a.iter().sum(),
            "ReduceMax" => a.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            "ReduceMin" => a.iter().copied().fold(f64::INFINITY, f64::min),
            _ => a.iter().product(),
        })
        .collect();
    Ok(Tensor::floats(t.elem, reduced_dims(&t.dims, &axes, keep), r))
}

fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let out = matmul_dims(&a.dims, &b.dims)?;
    small(&out)?;
    small(&[out.iter().product::<usize>(), a.dims[a.dims.len() - 1]])?;
    let (m, k, n) = (a.dims[a.dims.len() - 2], a.dims[a.dims.len() - 1], b.dims[b.dims.len() - 1]);
    let batch: Vec<usize> = out[..out.len() - 2].to_vec();
    let ia = broadcast_index(&a.dims[..a.dims.len() - 2], &batch);
    let ib = broadcast_index(&b.dims[..b.dims.len() - 2], &batch);
    let (va, vb) = (a.f64s()?, b.f64s()?);
    let mut v = Vec::with_capacity(out.iter().product());
    for (ba, bb) in ia.iter().zip(&ib) {
        for i in 0..m {
            for j in 0..n {
                v.push((0..k).map(|p| va[ba * m * k + i * k + p] * vb[bb * k * n + p * n + j]).sum());
            }
        }
    }
    Ok(Tensor::floats(a.elem, out, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn node(op: &str, attrs: &[(&str, Attr)]) -> Node {
        Node {
            name: "n".into(),
            op: op.into(),
            inputs: vec![],
            outputs: vec!["y".into()],
            attrs: attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<HashMap<_, _>>(),
        }
    }

    fn ints(v: &[i64]) -> Tensor {
        Tensor::ints(Elem::I64, vec![v.len()], v.to_vec())
    }

    #[test]
    fn slices_of_a_cached_table_to_the_sequence_fold() {
        // [1, 1, 4, 2] table, sliced on axis 2 to 0..3 (the rotary cache sliced to the length).
        let t = Tensor::floats(Elem::F32, vec![1, 1, 4, 2], (0..8).map(|x| x as f64).collect());
        let out = eval(&node("Slice", &[]), &[Some(&t), Some(&ints(&[0])), Some(&ints(&[3])), Some(&ints(&[2])), None], 18).unwrap();
        assert_eq!(out[0].dims, [1, 1, 3, 2]);
        assert_eq!(&*out[0].f64s().unwrap(), &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        // A negative step walks backwards; an end past the axis clamps.
        let out = eval(&node("Slice", &[]), &[Some(&ints(&[5, 6, 7])), Some(&ints(&[-1])), Some(&ints(&[i64::MIN])), Some(&ints(&[0])), Some(&ints(&[-1]))], 18).unwrap();
        assert_eq!(&*out[0].i64s().unwrap(), &[7, 6, 5]);
    }

    #[test]
    fn shape_arithmetic_folds_through_gather_range_and_where() {
        let shape = ints(&[1, 16]);
        let g = eval(&node("Gather", &[("axis", Attr::Int(0))]), &[Some(&shape), Some(&Tensor::scalar_i64(1))], 18).unwrap();
        assert_eq!(g[0].scalar(), Some(16.0));
        let r = eval(&node("Range", &[]), &[Some(&Tensor::scalar_i64(0)), Some(&g[0]), Some(&Tensor::scalar_i64(4))], 18).unwrap();
        assert_eq!(&*r[0].i64s().unwrap(), &[0, 4, 8, 12]);
        let eq = eval(&node("Equal", &[]), &[Some(&r[0]), Some(&Tensor::scalar_i64(8))], 18).unwrap();
        let w = eval(&node("Where", &[]), &[Some(&eq[0]), Some(&Tensor::scalar_i64(-1)), Some(&r[0])], 18).unwrap();
        assert_eq!(&*w[0].i64s().unwrap(), &[0, 4, -1, 12]);
    }

    #[test]
    fn reshape_resolves_zero_and_minus_one_and_transpose_moves_elements() {
        let n = node("Reshape", &[]);
        assert_eq!(reshape_dims(&n, &[1, 16, 128], &[0, 0, 4, -1]).unwrap(), [1, 16, 4, 32]);
        assert!(reshape_dims(&n, &[1, 16, 128], &[3, -1]).is_err());
        let t = Tensor::floats(Elem::F32, vec![2, 3], (0..6).map(|x| x as f64).collect());
        let tt = eval(&node("Transpose", &[("perm", Attr::Ints(vec![1, 0]))]), &[Some(&t)], 18).unwrap();
        assert_eq!(&*tt[0].f64s().unwrap(), &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn one_hot_puts_on_values_at_the_indices_along_its_axis() {
        let idx = ints(&[1, -1]);
        let out = eval(&node("OneHot", &[]), &[Some(&idx), Some(&Tensor::scalar_i64(3)), Some(&ints(&[0, 5]))], 18).unwrap();
        assert_eq!(out[0].dims, [2, 3]);
        assert_eq!(&*out[0].i64s().unwrap(), &[0, 5, 0, 0, 0, 5]);
        let out = eval(&node("OneHot", &[("axis", Attr::Int(0))]), &[Some(&idx), Some(&Tensor::scalar_i64(3)), Some(&ints(&[0, 5]))], 18).unwrap();
        assert_eq!(out[0].dims, [3, 2]);
        assert_eq!(&*out[0].i64s().unwrap(), &[0, 0, 5, 0, 0, 5]);
    }

    #[test]
    fn dynamic_shapes_follow_broadcast_and_matmul_rules() {
        assert_eq!(broadcast(&[1, 4, 16, 32], &[1, 1, 16, 32]).unwrap(), [1, 4, 16, 32]);
        assert!(broadcast(&[3], &[4]).is_err());
        assert_eq!(matmul_dims(&[1, 4, 16, 32], &[1, 4, 32, 16]).unwrap(), [1, 4, 16, 16]);
    }
}
