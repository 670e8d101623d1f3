//! Finds LLaDA's blocks in the token-dependent part of an export (what `fold` leaves) by its
//! data flow, not by names: exporters rename and transpose weights freely (PyTorch's dynamo
//! folds `W^T` into an anonymous `val_6`), but the flow is fixed. Each value gets an origin,
//! the last node that mixed two values or applied a weight, and the product of the scalar
//! factors applied since (an attention scale can sit on the scores, on q, or on q and k as a
//! square root each). Layout, cast and elementwise ops between keep their input's origin:
//! rotary embedding in any of its exported forms (halves by Slice, Split or Gather, Neg and
//! Concat, products with the cos and sin tables, or one `RotaryEmbedding` op) stays on the
//! projection it rotates, and its tables are recorded for the config check. Then:
//! - attention is a MatMul of two projections (q, k) whose softmax multiplies a third (v), or
//!   one `Attention` op;
//! - the output projection reads attention's result;
//! - the gate is the projection a Sigmoid reads; the up projection is the other factor of the
//!   product with it; the down projection reads that product;
//! - an RMSNorm is a Mul by a constant vector of `d_model` or one `RMSNormalization` op: q, k
//!   and v read the attention norm, gate and up the feed-forward norm, the head the final norm.
//!
//! Anything the walk cannot place is refused with the node's name and op.

use std::collections::HashMap;

use super::fold::{Folded, Value};
use super::proto::Node;
use super::tensor::{Elem, Tensor};

/// The weights of one transformer block.
pub struct Block<'g> {
    pub attn_norm: Tensor,
    pub q: Projection<'g>,
    pub k: Projection<'g>,
    pub v: Projection<'g>,
    pub attn_out: Projection<'g>,
    pub ff_norm: Tensor,
    pub gate: Projection<'g>,
    pub up: Projection<'g>,
    pub down: Projection<'g>,
    pub attention: Attention<'g>,
}

/// A projection's weight and whether it is stored `[in, out]` (a MatMul's right operand) or
/// `[out, in]` (Gemm with `transB`, the checkpoint's layout).
#[derive(Clone)]
pub struct Projection<'g> {
    pub node: &'g Node,
    pub weight: Tensor,
    pub in_out: bool,
}

impl Projection<'_> {
    pub fn out_features(&self) -> usize {
        let d = &self.weight.dims;
        if self.in_out {
            d[1]
        } else {
            d[0]
        }
    }
}

/// What one attention computes: its scale on the scores (with the relative rounding the
/// exported constants allow) and its head layout.
#[derive(Clone, Copy)]
pub struct Attention<'g> {
    pub node: &'g Node,
    pub scale: f64,
    pub scale_tolerance: f64,
    pub heads: usize,
    pub head_dim: usize,
}

/// A constant multiplied into q or k: a rotary cos or sin table, `[.., positions, dim]`.
pub struct RotaryTable<'g> {
    pub node: &'g Node,
    pub table: Tensor,
    /// The table holds half a head's angles (ONNX's `RotaryEmbedding` caches), not both halves.
    pub half: bool,
}

pub struct Recognised<'g> {
    pub embedding: Tensor,
    pub blocks: Vec<Block<'g>>,
    pub final_norm: Tensor,
    pub head: Projection<'g>,
    /// Each norm's epsilon, with the node that adds it.
    pub norm_eps: Vec<(&'g Node, f64, Elem)>,
    pub rotary: Vec<RotaryTable<'g>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The graph's token-id input.
    Tokens,
    /// The output of live node `i`, which mixed values or applied a weight.
    Node(usize),
}

/// A value's origin, the scalar factor applied to it since, and that factor's rounding.
#[derive(Clone, Copy)]
struct Trace {
    origin: Origin,
    factor: f64,
    tolerance: f64,
}

impl Trace {
    fn fresh(i: usize) -> Trace {
        Trace { origin: Origin::Node(i), factor: 1.0, tolerance: 0.0 }
    }
    fn scaled(self, s: f64, elem: Elem) -> Trace {
        Trace { factor: self.factor * s, tolerance: self.tolerance + elem.epsilon(), ..self }
    }
}

/// Ops that carry their input's origin through: layout, casts, and the elementwise steps of
/// RMSNorm and rotary embedding.
const CARRY_OPS: &[&str] = &[
    "Identity", "Cast", "CastLike", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split", "Concat", "Expand", "Tile", "Flatten",
    "Neg", "Pow", "Sqrt", "Reciprocal", "ReduceMean", "Dropout", "Where",
];

/// The ops lladac reads in a LLaDA export (besides those it folds away: shape arithmetic).
pub const LLADA_OPS: &[&str] = &[
    "Gather", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Softmax", "Sigmoid", "RMSNormalization", "SimplifiedLayerNormalization",
    "RotaryEmbedding", "Attention", "Identity", "Cast", "CastLike", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split",
    "Concat", "Expand", "Tile", "Flatten", "Neg", "Pow", "Sqrt", "Reciprocal", "ReduceMean", "Dropout", "Where",
];

pub fn known_ops() -> String {
    LLADA_OPS.join(", ")
}

fn op_name(node: &Node) -> &str {
    node.op.rsplit("::").next().unwrap_or(&node.op)
}

/// Whether a constant is all zeros (an attention bias with nothing masked).
fn all_zero(t: &Tensor) -> bool {
    t.f64s().map(|v| v.iter().all(|&x| x == 0.0)).unwrap_or(false)
}

pub fn recognise<'g>(f: &Folded<'g>) -> Result<Recognised<'g>, String> {
    let live = &f.live;
    let [logits] = &f.graph.outputs[..] else {
        return Err(format!("the graph has {} outputs; a LLaDA export has one, the logits", f.graph.outputs.len()));
    };
    // d_model is the embedding's width: the one Gather of a constant table by the tokens.
    let mut trace: HashMap<&str, Trace> = HashMap::from([(f.ids, Trace { origin: Origin::Tokens, factor: 1.0, tolerance: 0.0 })]);
    let mut embedding: Option<Tensor> = None;
    let mut d_model = 0;
    let mut linear: Vec<(usize, Origin)> = Vec::new();
    let mut weights: HashMap<usize, (Tensor, bool)> = HashMap::new();
    let mut norm_weight: HashMap<usize, Tensor> = HashMap::new();
    let mut two_dynamic: Vec<(usize, Trace, Trace)> = Vec::new();
    let mut products: Vec<(usize, Origin, Origin)> = Vec::new();
    let mut sigmoid_of: Vec<Origin> = Vec::new();
    let mut softmax: Vec<(usize, Trace)> = Vec::new();
    let mut attention_ops: Vec<(usize, Trace, Trace, Origin)> = Vec::new();
    let mut norm_eps = Vec::new();
    let mut tables: Vec<(usize, Origin, RotaryTable)> = Vec::new();
    let mut mean_outputs: Vec<&str> = Vec::new();

    for (i, &node) in live.iter().enumerate() {
        let op = op_name(node);
        let mut dyns: Vec<(usize, Trace)> = Vec::new();
        let mut consts: Vec<(usize, &Tensor)> = Vec::new();
        for (k, name) in node.inputs.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            match f.value(name) {
                Some(Value::Const(t)) => consts.push((k, t)),
                Some(Value::Dyn { .. }) => {
                    let t = trace.get(name.as_str()).copied().ok_or_else(|| format!("{}: input '{name}' has no traced origin", node.label()))?;
                    dyns.push((k, t));
                }
                None => return Err(format!("{}: input '{name}' is not defined before it", node.label())),
            }
        }
        if op == "CastLike" {
            dyns.retain(|d| d.0 == 0); // the second input gives only the type
        }
        let same = dyns.first().map(|d| d.1).filter(|t| dyns.iter().all(|d| d.1.origin == t.origin));
        let mixes = || format!("{}: mixes values in a way LLaDA's blocks do not", node.label());
        let scalar = |t: &Tensor| t.scalar();
        let out: Trace = match op {
            "Gather" => match (&dyns[..], consts.first()) {
                ([(1, Trace { origin: Origin::Tokens, .. })], Some((0, table))) if embedding.is_none() && table.dims.len() == 2 => {
                    d_model = table.dims[1];
                    embedding = Some((*table).clone());
                    Trace::fresh(i)
                }
                ([(0, t)], _) => *t, // a piece of one value (an unbind of the rotary halves)
                _ => return Err(format!("{}: a Gather other than the one embedding lookup of the token ids", node.label())),
            },
            "MatMul" | "Gemm" => match (&dyns[..], &consts[..]) {
                ([(0, x)], [(1, w), rest @ ..]) if w.dims.len() == 2 => {
                    let bias = rest.iter().find(|(k, _)| *k == 2);
                    if bias.is_some_and(|(_, b)| !all_zero(b)) {
                        return Err(format!("{}: a projection with a bias; LLaDA's projections have none", node.label()));
                    }
                    if op == "Gemm" && (node.int("transA").unwrap_or(0) != 0 || node.float("alpha").is_some_and(|a| a != 1.0)) {
                        return Err(format!("{}: a Gemm with transA or alpha; LLaDA's projections are plain x·Wᵀ", node.label()));
                    }
                    let in_out = op == "MatMul" || node.int("transB").unwrap_or(0) == 0;
                    linear.push((i, x.origin));
                    weights.insert(i, ((*w).clone(), in_out));
                    Trace::fresh(i)
                }
                ([(0, a), (1, b)], []) if op == "MatMul" => {
                    two_dynamic.push((i, *a, *b));
                    Trace { origin: Origin::Node(i), factor: a.factor * b.factor, tolerance: a.tolerance + b.tolerance }
                }
                _ => return Err(format!("{}: a matrix product that is neither a projection by a constant weight nor part of attention", node.label())),
            },
            "Mul" => match (&dyns[..], &consts[..]) {
                ([(_, x)], [(_, c)]) => {
                    if let Some(s) = scalar(c) {
                        x.scaled(s, c.elem)
                    } else if c.numel() == d_model && c.dims.last() == Some(&d_model) {
                        norm_weight.insert(i, c.reshaped(vec![d_model]));
                        Trace::fresh(i)
                    } else {
                        tables.push((i, x.origin, RotaryTable { node, table: (*c).clone(), half: false }));
                        *x
                    }
                }
                ([(_, a), (_, b)], []) if a.origin == b.origin => *a,
                ([(_, a), (_, b)], []) => {
                    products.push((i, a.origin, b.origin));
                    Trace::fresh(i)
                }
                _ => return Err(mixes()),
            },
            "Div" => match (&dyns[..], &consts[..]) {
                ([(0, x)], [(1, c)]) => match scalar(c) {
                    Some(s) => x.scaled(1.0 / s, c.elem),
                    None => return Err(format!("{}: divides by a constant that is not a scalar", node.label())),
                },
                // 1 / sqrt(mean + eps): a step of RMSNorm on one value.
                ([(1, x)], [(0, _)]) => *x,
                _ => same.ok_or_else(mixes)?,
            },
            "Add" | "Sub" => match (&dyns[..], &consts[..]) {
                ([(_, x)], [(_, c)]) => {
                    if let Some(eps) = scalar(c) {
                        let after_mean = node.inputs.iter().any(|n| mean_outputs.contains(&n.as_str()));
                        if after_mean && op == "Add" {
                            norm_eps.push((node, eps, c.elem));
                        }
                    } else if !all_zero(c) {
                        return Err(format!("{}: adds a constant of shape {:?} (an attention mask or bias?); LLaDA's bidirectional attention adds none: export without a mask, or with a mask of all ones", node.label(), c.dims));
                    }
                    *x
                }
                ([(_, a), (_, b)], []) if a.origin == b.origin => *a,
                ([_, _], []) if op == "Add" => Trace::fresh(i),
                _ => return Err(mixes()),
            },
            "Softmax" => {
                let x = same.ok_or_else(mixes)?;
                softmax.push((i, x));
                Trace { factor: 1.0, tolerance: 0.0, ..x }
            }
            "Sigmoid" => {
                let x = same.ok_or_else(mixes)?;
                sigmoid_of.push(x.origin);
                x
            }
            "RMSNormalization" | "SimplifiedLayerNormalization" => {
                let w = consts.iter().find(|(k, _)| *k == 1).map(|c| c.1).filter(|w| w.numel() == d_model);
                let (Some(w), [_]) = (w, &dyns[..]) else {
                    return Err(format!("{}: an RMSNorm whose scale is not a constant vector of d_model {d_model}", node.label()));
                };
                let rank = f.input(node, 0).map_or(0, |v| v.dims().len()) as i64;
                if !matches!(node.int("axis").unwrap_or(-1), -1) && node.int("axis") != Some(rank - 1) {
                    return Err(format!("{}: normalises from axis {:?}; LLaDA's RMSNorm normalises the last axis", node.label(), node.int("axis")));
                }
                norm_eps.push((node, node.float("epsilon").unwrap_or(1e-5), Elem::F32));
                norm_weight.insert(i, w.reshaped(vec![d_model]));
                Trace::fresh(i)
            }
            "RotaryEmbedding" => {
                let x = same.ok_or_else(mixes)?;
                if node.int("interleaved").unwrap_or(0) != 0 {
                    return Err(format!("{}: interleaved rotary embedding; LLaDA rotates the two halves of each head", node.label()));
                }
                // ONNX's op takes (x, cos, sin, positions); Microsoft's (x, positions, cos, sin).
                let (positions, cos, sin) = if node.op.starts_with("com.microsoft") { (1, 2, 3) } else { (3, 1, 2) };
                for k in [cos, sin] {
                    let t = consts.iter().find(|c| c.0 == k).map(|c| c.1).ok_or_else(|| format!("{}: its cos and sin caches are not constants", node.label()))?;
                    tables.push((i, x.origin, RotaryTable { node, table: t.clone(), half: true }));
                }
                if let Some(p) = consts.iter().find(|c| c.0 == positions) {
                    let pos = p.1.i64s()?;
                    if pos.iter().enumerate().any(|(j, &v)| v != (j % f.seq_len) as i64) {
                        return Err(format!("{}: position ids other than 0..{}", node.label(), f.seq_len));
                    }
                }
                x
            }
            "Attention" => {
                let (q, k, v) = match &dyns[..] {
                    [(0, q), (1, k), (2, v), ..] => (*q, *k, *v),
                    _ => return Err(format!("{}: q, k and v are not all computed from the tokens", node.label())),
                };
                if node.int("is_causal").unwrap_or(0) != 0 {
                    return Err(format!("{}: causal attention; LLaDA's attention is bidirectional (export with is_causal=False)", node.label()));
                }
                if node.float("softcap").is_some_and(|s| s != 0.0) {
                    return Err(format!("{}: soft-capped attention scores; LLaDA's are not", node.label()));
                }
                if dyns.len() > 3 || consts.iter().any(|(k, t)| *k == 3 && !all_zero(t)) || consts.iter().any(|(k, _)| *k > 3) {
                    return Err(format!("{}: an attention mask, bias or cache; LLaDA's bidirectional attention has none", node.label()));
                }
                attention_ops.push((i, q, k, v.origin));
                Trace::fresh(i)
            }
            op if CARRY_OPS.contains(&op) => {
                if op == "Where" && consts.first().is_none_or(|c| c.0 != 0) {
                    return Err(format!("{}: selects by a token-dependent condition", node.label()));
                }
                if op == "ReduceMean" {
                    mean_outputs.extend(node.outputs.iter().map(|o| o.as_str()));
                }
                same.ok_or_else(mixes)?
            }
            _ => {
                return Err(format!("{}: {}", node.label(), super::fold::unknown_op(&node.op)));
            }
        };
        for o in &node.outputs {
            trace.insert(o.as_str(), out);
        }
    }

    let embedding = embedding.ok_or("no embedding lookup: no Gather reads a constant table with the token ids")?;
    let nodes = live;
    let proj = |i: usize| -> Projection<'g> {
        let (weight, in_out) = weights[&i].clone();
        Projection { node: nodes[i], weight, in_out }
    };
    let is_linear = |o: Origin| matches!(o, Origin::Node(j) if weights.contains_key(&j));
    let norm_of = |o: Origin, what: &str, n: &Node| -> Result<Tensor, String> {
        match o {
            Origin::Node(j) if norm_weight.contains_key(&j) => Ok(norm_weight[&j].clone()),
            _ => Err(format!("{}: the {what} projection does not read an RMSNorm's output", n.label())),
        }
    };
    let linear_input = |i: usize| linear.iter().find(|(j, _)| *j == i).map(|(_, o)| *o);
    let linear_reading = |o: Origin| -> Vec<usize> { linear.iter().filter(|(_, x)| *x == o).map(|(j, _)| *j).collect() };
    let node_of = |o: Origin| match o {
        Origin::Node(j) => Some(j),
        Origin::Tokens => None,
    };
    let dims_of = |node: &Node, k: usize| f.input(node, k).map(|v| v.dims().to_vec()).unwrap_or_default();

    // Attention, either form: (q, k, v projections, the node whose output is the result, the
    // attention's description).
    let mut attentions: Vec<(usize, usize, usize, usize, Attention)> = Vec::new();
    for &(s, a, b) in two_dynamic.iter().filter(|(_, a, b)| is_linear(a.origin) && is_linear(b.origin)) {
        let node = nodes[s];
        let (_, p) = *softmax.iter().find(|(_, t)| t.origin == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores without a softmax", node.label()))?;
        let &(pv, _, v) = two_dynamic.iter().find(|(_, x, _)| x.origin == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores no MatMul multiplies with values", node.label()))?;
        let v = node_of(v.origin).filter(|&j| weights.contains_key(&j)).ok_or_else(|| format!("{}: the values are not a projection", nodes[pv].label()))?;
        let scores = dims_of(node, 0);
        let (q_dims, out) = (scores.clone(), f.value(&node.outputs[0]).map(|v| v.dims().to_vec()).unwrap_or_default());
        let heads = out.iter().rev().skip(2).product::<usize>();
        let head_dim = q_dims.last().copied().unwrap_or(0);
        let att = Attention { node, scale: p.factor, scale_tolerance: p.tolerance, heads, head_dim };
        attentions.push((node_of(a.origin).unwrap(), node_of(b.origin).unwrap(), v, pv, att));
    }
    for &(i, q, k, v) in &attention_ops {
        let node = nodes[i];
        let (Some(qi), Some(ki), Some(vi)) = (node_of(q.origin).filter(|&j| weights.contains_key(&j)), node_of(k.origin).filter(|&j| weights.contains_key(&j)), node_of(v).filter(|&j| weights.contains_key(&j))) else {
            return Err(format!("{}: q, k and v are not projections", node.label()));
        };
        let qd = dims_of(node, 0);
        let (heads, head_dim) = match qd.len() {
            4 => (qd[1], qd[3]),
            3 => {
                let h = node.int("q_num_heads").unwrap_or(1).max(1) as usize;
                (h, qd[2] / h)
            }
            _ => (0, 0),
        };
        let (scale, tol) = match node.float("scale") {
            Some(s) => (s, Elem::F32.epsilon()),
            None => (1.0 / (head_dim as f64).sqrt(), 0.0),
        };
        let att = Attention { node, scale: scale * q.factor * k.factor, scale_tolerance: tol + q.tolerance + k.tolerance, heads, head_dim };
        attentions.push((qi, ki, vi, i, att));
    }
    attentions.sort_by_key(|a| a.3);

    let mut blocks = Vec::new();
    let mut used = Vec::new();
    for &(q, k, v, result, attention) in &attentions {
        let o = match &linear_reading(Origin::Node(result))[..] {
            [o] => *o,
            found => return Err(format!("{}: attention's result is read by {} projections, expected one (the output projection)", nodes[result].label(), found.len())),
        };
        // The feed-forward half: the projection after this block's output projection that
        // feeds a Sigmoid is the gate.
        let gate = linear.iter().map(|(j, _)| *j).find(|&j| j > o && sigmoid_of.contains(&Origin::Node(j))).ok_or_else(|| format!("{}: no gated feed-forward (SiLU) follows this attention", nodes[o].label()))?;
        let &(m, a, b) = products.iter().find(|(_, a, b)| *a == Origin::Node(gate) || *b == Origin::Node(gate)).ok_or_else(|| format!("{}: the gate is not multiplied with an up projection", nodes[gate].label()))?;
        let up = node_of(if a == Origin::Node(gate) { b } else { a }).filter(|&j| weights.contains_key(&j)).ok_or_else(|| format!("{}: the gate is multiplied with something other than a projection", nodes[m].label()))?;
        let down = match &linear_reading(Origin::Node(m))[..] {
            [d] => *d,
            _ => return Err(format!("{}: the gated product is not read by one down projection", nodes[m].label())),
        };
        let (qn, kn, vn) = (linear_input(q).unwrap(), linear_input(k).unwrap(), linear_input(v).unwrap());
        let attn_norm = norm_of(qn, "q", nodes[q])?;
        if kn != qn || vn != qn {
            return Err(format!("{}: q, k and v do not read the same RMSNorm", nodes[k].label()));
        }
        let (gn, un) = (linear_input(gate).unwrap(), linear_input(up).unwrap());
        let ff_norm = norm_of(gn, "gate", nodes[gate])?;
        if un != gn {
            return Err(format!("{}: gate and up do not read the same RMSNorm", nodes[up].label()));
        }
        used.extend([q, k, v, o, gate, up, down]);
        blocks.push(Block { attn_norm, q: proj(q), k: proj(k), v: proj(v), attn_out: proj(o), ff_norm, gate: proj(gate), up: proj(up), down: proj(down), attention });
    }
    if blocks.is_empty() {
        return Err("no attention found: no MatMul multiplies two projections and no Attention op reads three".into());
    }
    let head_node = match trace.get(logits.as_str()).map(|t| t.origin) {
        Some(Origin::Node(h)) if weights.contains_key(&h) && !used.contains(&h) => h,
        _ => return Err(format!("the output '{logits}' is not a projection after the last block (the LM head)")),
    };
    let final_norm = norm_of(linear_input(head_node).unwrap(), "head", nodes[head_node])?;
    used.push(head_node);
    if let Some((j, _)) = linear.iter().find(|(j, _)| !used.contains(j)) {
        return Err(format!("{}: a projection that is not part of any recognised LLaDA block", nodes[*j].label()));
    }
    // Rotary tables multiply q or k, nothing else.
    let rotated: Vec<Origin> = blocks.iter().flat_map(|b| [b.q.node, b.k.node]).map(|n| Origin::Node(nodes.iter().position(|m| std::ptr::eq(*m, n)).unwrap())).collect();
    if let Some((_, _, t)) = tables.iter().find(|(_, o, _)| !rotated.contains(o)) {
        return Err(format!("{}: multiplies by a constant of shape {:?} that is neither an RMSNorm weight nor a rotary table on q or k", t.node.label(), t.table.dims));
    }
    let rotary = tables.into_iter().map(|(_, _, t)| t).collect();
    Ok(Recognised { embedding, blocks, final_norm, head: proj(head_node), norm_eps, rotary })
}
