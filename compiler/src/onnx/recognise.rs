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
//! The walk also checks what must hold between them: scalar factors only on the way to the
//! attention scores, the norm's mean over the last axis of the square, SiLU (not a bare
//! sigmoid) on the gate, a softmax over the last axis between scores and values, rotary
//! tables on both q and k, nothing left over. Anything the walk cannot place is refused with
//! the node's name and op.

use std::collections::HashMap;

use super::fold::{Folded, Value};
use super::ops::{unknown_op, CARRY_OPS};
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

/// A value's origin, the scalar factor applied to it since, that factor's rounding, and which
/// of the nonlinear steps LLaDA's blocks check for it went through last.
#[derive(Clone, Copy)]
struct Trace {
    origin: Origin,
    factor: f64,
    tolerance: f64,
    sigmoid: bool,
    softmax: bool,
}

impl Trace {
    fn fresh(i: usize) -> Trace {
        Trace { origin: Origin::Node(i), factor: 1.0, tolerance: 0.0, sigmoid: false, softmax: false }
    }
    fn scaled(self, s: f64, elem: Elem) -> Trace {
        Trace { factor: self.factor * s, tolerance: self.tolerance + elem.epsilon(), ..self }
    }
    fn unscaled(&self) -> bool {
        (self.factor - 1.0).abs() <= 2.0 * self.tolerance + 1e-6
    }
}

fn op_name(node: &Node) -> &str {
    node.op.rsplit("::").next().unwrap_or(&node.op)
}

/// Whether a constant is all zeros (an attention bias with nothing masked).
fn all_zero(t: &Tensor) -> bool {
    t.f64s().map(|v| v.iter().all(|&x| x == 0.0)).unwrap_or(false)
}

fn all_nonzero(t: &Tensor) -> bool {
    t.f64s().map(|v| v.iter().all(|&x| x != 0.0)).unwrap_or(false)
}

/// What the walk over the live nodes records, by live-node index.
#[derive(Default)]
struct Walk<'g> {
    embedding: Option<Tensor>,
    d_model: usize,
    /// Each projection with its input's origin.
    linear: Vec<(usize, Origin)>,
    weights: HashMap<usize, (Tensor, bool)>,
    norm_weight: HashMap<usize, Tensor>,
    /// MatMuls of two token-dependent values: (node, left, right).
    two_dynamic: Vec<(usize, Trace, Trace)>,
    /// Products of two different origins (the gated feed-forward's).
    products: Vec<(usize, Origin, Origin)>,
    /// Origins `x` of `x * sigmoid(x)`.
    silu_of: Vec<Origin>,
    softmax: Vec<(usize, Trace)>,
    attention_ops: Vec<(usize, Trace, Trace, Origin)>,
    /// Sums of two different origins (the residual connections).
    residuals: usize,
    norm_eps: Vec<(&'g Node, f64, Elem)>,
    tables: Vec<(usize, Origin, RotaryTable<'g>)>,
    mean_outputs: Vec<&'g str>,
    trace: HashMap<&'g str, Trace>,
}

pub fn recognise<'g>(f: &Folded<'g>) -> Result<Recognised<'g>, String> {
    let [logits] = &f.graph.outputs[..] else {
        return Err(format!("the graph has {} outputs; a LLaDA export has one, the logits", f.graph.outputs.len()));
    };
    let w = walk(f)?;
    let out = w.trace.get(logits.as_str()).copied().ok_or_else(|| format!("the output '{logits}' does not depend on the tokens"))?;
    if !out.unscaled() {
        return Err(format!("the logits '{logits}' are scaled by {}; LLaDA's head scales nothing (config scale_logits is not supported)", out.factor));
    }
    assemble(f, w, out.origin, logits)
}

/// The rank of input `k` of `node`.
fn rank(f: &Folded, node: &Node, k: usize) -> usize {
    f.input(node, k).map_or(0, |v| v.dims().len())
}

fn walk<'g>(f: &Folded<'g>) -> Result<Walk<'g>, String> {
    let mut w = Walk::default();
    w.trace.insert(f.ids, Trace { origin: Origin::Tokens, factor: 1.0, tolerance: 0.0, sigmoid: false, softmax: false });
    for (i, &node) in f.live.iter().enumerate() {
        let op = op_name(node);
        let mut dyns: Vec<(usize, Trace)> = Vec::new();
        let mut consts: Vec<(usize, &Tensor)> = Vec::new();
        for (k, name) in node.inputs.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            match f.value(name) {
                Some(Value::Const(t)) => consts.push((k, t)),
                Some(Value::Dyn { .. }) => {
                    let t = w.trace.get(name.as_str()).copied().ok_or_else(|| format!("{}: input '{name}' is not computed before it", node.label()))?;
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
        let out: Trace = match op {
            "Gather" => match (&dyns[..], consts.first()) {
                ([(1, Trace { origin: Origin::Tokens, .. })], Some((0, table))) if w.embedding.is_none() && table.dims.len() == 2 && node.int("axis").unwrap_or(0) == 0 => {
                    w.d_model = table.dims[1];
                    w.embedding = Some((*table).clone());
                    Trace::fresh(i)
                }
                ([(0, t)], _) => *t, // a piece of one value (an unbind of the rotary halves)
                _ => return Err(format!("{}: a Gather other than the one embedding lookup of the token ids", node.label())),
            },
            "MatMul" | "Gemm" => match (&dyns[..], &consts[..]) {
                ([(0, x)], [(1, wt), rest @ ..]) if wt.dims.len() == 2 => {
                    if rest.iter().any(|(k, b)| *k == 2 && !all_zero(b)) {
                        return Err(format!("{}: a projection with a bias; LLaDA's projections have none", node.label()));
                    }
                    if op == "Gemm" && (node.int("transA").unwrap_or(0) != 0 || node.float("alpha").is_some_and(|a| a != 1.0)) {
                        return Err(format!("{}: a Gemm with transA or alpha; LLaDA's projections are plain x·Wᵀ", node.label()));
                    }
                    if !x.unscaled() {
                        return Err(format!("{}: its input is scaled by {}; LLaDA scales nothing a projection reads", node.label(), x.factor));
                    }
                    let in_out = op == "MatMul" || node.int("transB").unwrap_or(0) == 0;
                    w.linear.push((i, x.origin));
                    w.weights.insert(i, ((*wt).clone(), in_out));
                    Trace::fresh(i)
                }
                ([(0, a), (1, b)], []) if op == "MatMul" => {
                    if w.two_dynamic.iter().any(|(j, ..)| a.origin == Origin::Node(*j)) && !a.softmax {
                        return Err(format!("{}: multiplies the values by the scores before their softmax", node.label()));
                    }
                    w.two_dynamic.push((i, *a, *b));
                    Trace { factor: a.factor * b.factor, tolerance: a.tolerance + b.tolerance, ..Trace::fresh(i) }
                }
                _ => return Err(format!("{}: a matrix product that is neither a projection by a constant weight nor part of attention", node.label())),
            },
            "Mul" => match (&dyns[..], &consts[..]) {
                ([(_, x)], [(_, c)]) => {
                    if let Some(s) = c.scalar() {
                        x.scaled(s, c.elem)
                    } else if c.numel() == w.d_model && c.dims.last() == Some(&w.d_model) {
                        w.norm_weight.insert(i, c.reshaped(vec![w.d_model]));
                        Trace::fresh(i)
                    } else {
                        w.tables.push((i, x.origin, RotaryTable { node, table: (*c).clone(), half: false }));
                        *x
                    }
                }
                // x * sigmoid(x): SiLU; x * x and x * rsqrt(...): steps of RMSNorm.
                ([(_, a), (_, b)], []) if a.origin == b.origin => {
                    if a.sigmoid != b.sigmoid {
                        w.silu_of.push(a.origin);
                    }
                    Trace { sigmoid: false, ..*a }
                }
                ([(_, a), (_, b)], []) => {
                    w.products.push((i, a.origin, b.origin));
                    if a.sigmoid || b.sigmoid {
                        return Err(format!("{}: multiplies a sigmoid by another value (GLU); LLaDA's feed-forward is SwiGLU, silu(gate) * up", node.label()));
                    }
                    Trace::fresh(i)
                }
                _ => return Err(mixes()),
            },
            "Div" => match (&dyns[..], &consts[..]) {
                ([(0, x)], [(1, c)]) => match c.scalar() {
                    Some(s) => x.scaled(1.0 / s, c.elem),
                    None => return Err(format!("{}: divides by a constant that is not a scalar", node.label())),
                },
                // 1 / sqrt(mean + eps): a step of RMSNorm on one value.
                ([(1, x)], [(0, _)]) => *x,
                ([(_, a), (_, b)], []) if a.origin == b.origin => *a,
                _ => return Err(mixes()),
            },
            "Add" | "Sub" => match (&dyns[..], &consts[..]) {
                ([(_, x)], [(_, c)]) => {
                    let after_mean = node.inputs.iter().any(|n| w.mean_outputs.contains(&n.as_str()));
                    match c.scalar() {
                        Some(eps) if after_mean && op == "Add" => w.norm_eps.push((node, eps, c.elem)),
                        _ if all_zero(c) => {}
                        Some(v) => return Err(format!("{}: adds the constant {v}; LLaDA adds a constant only as RMSNorm's epsilon", node.label())),
                        None => return Err(format!("{}: adds a constant of shape {:?} (an attention mask or bias?); LLaDA's bidirectional attention adds none: export without a mask, or with a mask of all ones", node.label(), c.dims)),
                    }
                    *x
                }
                ([(_, a), (_, b)], []) if a.origin == b.origin && op == "Add" => *a,
                ([(_, a), (_, b)], []) if op == "Add" => {
                    if !a.unscaled() || !b.unscaled() {
                        return Err(format!("{}: a residual sum of values scaled by {} and {}; LLaDA scales neither", node.label(), a.factor, b.factor));
                    }
                    w.residuals += 1;
                    Trace::fresh(i)
                }
                _ => return Err(format!("{}: subtracts in a way LLaDA's blocks do not (a LayerNorm's centring?); LLaDA normalises with RMSNorm", node.label())),
            },
            "Softmax" => {
                let x = same.ok_or_else(mixes)?;
                let r = rank(f, node, 0) as i64;
                let default = if f.graph.opset >= 13 { -1 } else { 1 };
                if axis_of(node.int("axis").unwrap_or(default), r) != Some(r - 1) || (f.graph.opset < 13 && r != 2) {
                    return Err(format!("{}: a softmax over another axis than the last; attention's is over the keys", node.label()));
                }
                w.softmax.push((i, x));
                Trace { factor: 1.0, tolerance: 0.0, softmax: true, ..x }
            }
            "Sigmoid" => Trace { sigmoid: true, ..same.ok_or_else(mixes)? },
            "RMSNormalization" | "SimplifiedLayerNormalization" => {
                let wt = consts.iter().find(|(k, _)| *k == 1).map(|c| c.1).filter(|wt| wt.numel() == w.d_model);
                let (Some(wt), [_]) = (wt, &dyns[..]) else {
                    return Err(format!("{}: an RMSNorm whose scale is not a constant vector of d_model {}", node.label(), w.d_model));
                };
                let r = rank(f, node, 0) as i64;
                if axis_of(node.int("axis").unwrap_or(-1), r) != Some(r - 1) {
                    return Err(format!("{}: normalises from axis {:?}; LLaDA's RMSNorm normalises the last axis", node.label(), node.int("axis")));
                }
                w.norm_eps.push((node, node.float("epsilon").unwrap_or(1e-5), Elem::F32));
                w.norm_weight.insert(i, wt.reshaped(vec![w.d_model]));
                Trace::fresh(i)
            }
            "RotaryEmbedding" => {
                let x = same.ok_or_else(mixes)?;
                if node.int("interleaved").unwrap_or(0) != 0 {
                    return Err(format!("{}: interleaved rotary embedding; LLaDA rotates the two halves of each head", node.label()));
                }
                if node.float("scale").is_some_and(|s| s != 1.0) || node.int("rotary_embedding_dim").is_some_and(|d| d != 0 && d as usize != rank_last(f, node)) {
                    return Err(format!("{}: a scaled or partial rotary embedding; LLaDA rotates whole heads unscaled", node.label()));
                }
                // ONNX's op takes (x, cos, sin, positions); Microsoft's (x, positions, cos, sin).
                let (positions, cos, sin) = if node.op.starts_with("com.microsoft") { (1, 2, 3) } else { (3, 1, 2) };
                for k in [cos, sin] {
                    let t = consts.iter().find(|c| c.0 == k).map(|c| c.1).ok_or_else(|| format!("{}: its cos and sin caches are not constants", node.label()))?;
                    w.tables.push((i, x.origin, RotaryTable { node, table: t.clone(), half: true }));
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
                    [(0, q), (1, k), (2, v)] => (*q, *k, *v),
                    _ => return Err(format!("{}: q, k and v are not all computed from the tokens, or a mask or cache is", node.label())),
                };
                if node.int("is_causal").unwrap_or(0) != 0 {
                    return Err(format!("{}: causal attention; LLaDA's attention is bidirectional (export with is_causal=False)", node.label()));
                }
                if node.float("softcap").is_some_and(|s| s != 0.0) {
                    return Err(format!("{}: soft-capped attention scores; LLaDA's are not", node.label()));
                }
                // A float mask is added to the scores; a boolean one keeps where it is true.
                let mask_ok = |t: &Tensor| if t.elem == Elem::Bool { all_nonzero(t) } else { all_zero(t) };
                if consts.iter().any(|(k, t)| *k == 3 && !mask_ok(t)) || consts.iter().any(|(k, _)| *k > 3) {
                    return Err(format!("{}: an attention mask or cache; LLaDA's bidirectional attention has none", node.label()));
                }
                if !v.unscaled() {
                    return Err(format!("{}: the values are scaled by {}", node.label(), v.factor));
                }
                w.attention_ops.push((i, q, k, v.origin));
                Trace::fresh(i)
            }
            op if CARRY_OPS.contains(&op) => {
                match op {
                    "Where" => {
                        // A constant condition that picks the token-dependent branch everywhere.
                        let cond = consts.iter().find(|c| c.0 == 0).map(|c| c.1);
                        let picks = match (cond, &dyns[..]) {
                            (Some(c), [(1, _)]) => all_nonzero(c),
                            (Some(c), [(2, _)]) => all_zero(c),
                            _ => false,
                        };
                        if !picks {
                            return Err(format!("{}: selects between values by a mask (causal attention?); LLaDA's bidirectional attention masks nothing", node.label()));
                        }
                    }
                    "ReduceMean" => {
                        let r = rank(f, node, 0) as i64;
                        let axes = consts.iter().find(|c| c.0 == 1).map(|c| c.1.i64s().map(|v| v.into_owned())).transpose()?.or_else(|| node.ints("axes").map(|a| a.to_vec()));
                        if axes.as_deref().map(|a| a.iter().map(|&x| axis_of(x, r)).collect::<Vec<_>>()) != Some(vec![Some(r - 1)]) || node.int("keepdims") == Some(0) {
                            return Err(format!("{}: a mean over other axes than the last; RMSNorm's is over each row's features", node.label()));
                        }
                        w.mean_outputs.extend(node.outputs.iter().map(|o| o.as_str()));
                    }
                    "Pow" => {
                        if consts.iter().find(|c| c.0 == 1).and_then(|c| c.1.scalar()) != Some(2.0) {
                            return Err(format!("{}: a power other than the square; RMSNorm squares", node.label()));
                        }
                    }
                    _ => {}
                }
                same.ok_or_else(mixes)?
            }
            _ => return Err(format!("{}: {}", node.label(), unknown_op(&node.op))),
        };
        for o in &node.outputs {
            w.trace.insert(o.as_str(), out);
        }
    }
    Ok(w)
}

/// `a` resolved against rank `r` (`None` outside it).
fn axis_of(a: i64, r: i64) -> Option<i64> {
    let x = if a < 0 { a + r } else { a };
    (0..r).contains(&x).then_some(x)
}

/// The last dimension of a node's first input (a head's width for a rotary op on 4-D input).
fn rank_last(f: &Folded, node: &Node) -> usize {
    f.input(node, 0).and_then(|v| v.dims().last().copied()).unwrap_or(0)
}

fn assemble<'g>(f: &Folded<'g>, w: Walk<'g>, head_origin: Origin, logits: &str) -> Result<Recognised<'g>, String> {
    let nodes = &f.live;
    let embedding = w.embedding.clone().ok_or("no embedding lookup: no Gather reads a constant table with the token ids")?;
    let proj = |i: usize| -> Projection<'g> {
        let (weight, in_out) = w.weights[&i].clone();
        Projection { node: nodes[i], weight, in_out }
    };
    let is_linear = |o: Origin| matches!(o, Origin::Node(j) if w.weights.contains_key(&j));
    let norm_of = |o: Origin, what: &str, n: &Node| -> Result<Tensor, String> {
        match o {
            Origin::Node(j) if w.norm_weight.contains_key(&j) => Ok(w.norm_weight[&j].clone()),
            _ => Err(format!("{}: the {what} projection does not read an RMSNorm's output", n.label())),
        }
    };
    let linear_input = |i: usize| w.linear.iter().find(|(j, _)| *j == i).map(|(_, o)| *o);
    let linear_reading = |o: Origin| -> Vec<usize> { w.linear.iter().filter(|(_, x)| *x == o).map(|(j, _)| *j).collect() };
    let projection_at = |o: Origin| match o {
        Origin::Node(j) if w.weights.contains_key(&j) => Some(j),
        _ => None,
    };
    let dims_of = |node: &Node, k: usize| f.input(node, k).map(|v| v.dims().to_vec()).unwrap_or_default();

    // Attention, either form: (q, k, v projections, the node whose output is the result, the
    // attention's description).
    let mut attentions: Vec<(usize, usize, usize, usize, Attention)> = Vec::new();
    let mut explicit = 0;
    for &(s, a, b) in w.two_dynamic.iter().filter(|(_, a, b)| is_linear(a.origin) && is_linear(b.origin)) {
        let node = nodes[s];
        let (_, p) = *w.softmax.iter().find(|(_, t)| t.origin == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores without a softmax", node.label()))?;
        let &(pv, probs, v) = w.two_dynamic.iter().find(|(_, x, _)| x.origin == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores no MatMul multiplies with values", node.label()))?;
        if !probs.softmax {
            return Err(format!("{}: multiplies the values by the scores before their softmax", nodes[pv].label()));
        }
        let v = projection_at(v.origin).ok_or_else(|| format!("{}: the values are not a projection", nodes[pv].label()))?;
        let out = f.value(&node.outputs[0]).map(|v| v.dims().to_vec()).unwrap_or_default();
        let heads = out.iter().rev().skip(2).product::<usize>();
        let head_dim = dims_of(node, 0).last().copied().unwrap_or(0);
        let att = Attention { node, scale: p.factor, scale_tolerance: p.tolerance, heads, head_dim };
        attentions.push((projection_at(a.origin).unwrap(), projection_at(b.origin).unwrap(), v, pv, att));
        explicit += 1;
    }
    if explicit * 2 != w.two_dynamic.len() || explicit != w.softmax.len() {
        return Err(format!(
            "{} products of two token-dependent values and {} softmaxes, where {explicit} attentions of two projections account for {} and {explicit}",
            w.two_dynamic.len(),
            w.softmax.len(),
            explicit * 2
        ));
    }
    for &(i, q, k, v) in &w.attention_ops {
        let node = nodes[i];
        let (Some(qi), Some(ki), Some(vi)) = (projection_at(q.origin), projection_at(k.origin), projection_at(v)) else {
            return Err(format!("{}: q, k and v are not projections", node.label()));
        };
        let qd = dims_of(node, 0);
        let (heads, head_dim) = match qd.len() {
            4 => (qd[1], qd[3]),
            3 => {
                let h = node.int("q_num_heads").and_then(|h| usize::try_from(h).ok()).filter(|&h| h > 0).unwrap_or(1);
                (h, qd[2] / h)
            }
            _ => (0, 0),
        };
        let (scale, tol) = match node.float("scale") {
            Some(s) => (s, Elem::F32.epsilon()),
            None => (1.0 / (head_dim.max(1) as f64).sqrt(), 0.0),
        };
        let att = Attention { node, scale: scale * q.factor * k.factor, scale_tolerance: tol + q.tolerance + k.tolerance, heads, head_dim };
        attentions.push((qi, ki, vi, i, att));
    }
    attentions.sort_by_key(|a| a.3);

    let mut blocks = Vec::new();
    let mut used: Vec<usize> = Vec::new();
    for (n, &(q, k, v, result, attention)) in attentions.iter().enumerate() {
        if q == k || k == v || q == v {
            return Err(format!("{}: q, k and v are not three projections", attention.node.label()));
        }
        let o = match &linear_reading(Origin::Node(result))[..] {
            [o] => *o,
            found => return Err(format!("{}: attention's result is read by {} projections, expected one (the output projection)", nodes[result].label(), found.len())),
        };
        // The feed-forward half: the SiLU'd projection between this block's output projection
        // and the next block's attention is the gate.
        let next = attentions.get(n + 1).map_or(usize::MAX, |a| a.0.min(a.1).min(a.2));
        let gate = w.linear.iter().map(|(j, _)| *j).find(|&j| j > o && j < next && w.silu_of.contains(&Origin::Node(j))).ok_or_else(|| format!("{}: no gated feed-forward (SiLU) follows this attention", nodes[o].label()))?;
        let &(m, a, b) = w.products.iter().find(|(_, a, b)| *a == Origin::Node(gate) || *b == Origin::Node(gate)).ok_or_else(|| format!("{}: the gate is not multiplied with an up projection", nodes[gate].label()))?;
        let up = projection_at(if a == Origin::Node(gate) { b } else { a }).ok_or_else(|| format!("{}: the gate is multiplied with something other than a projection", nodes[m].label()))?;
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
        for (what, p) in [("q", q), ("k", k)] {
            if w.tables.iter().filter(|(_, origin, _)| *origin == Origin::Node(p)).count() < 2 {
                return Err(format!("{}: the {what} projection is not rotated (no cos and sin tables multiply it)", nodes[p].label()));
            }
        }
        for p in [q, k, v, o, gate, up, down] {
            if used.contains(&p) {
                return Err(format!("{}: a projection two blocks share", nodes[p].label()));
            }
            used.push(p);
        }
        blocks.push(Block { attn_norm, q: proj(q), k: proj(k), v: proj(v), attn_out: proj(o), ff_norm, gate: proj(gate), up: proj(up), down: proj(down), attention });
    }
    if blocks.is_empty() {
        return Err("no attention found: no MatMul multiplies two projections and no Attention op reads three".into());
    }
    let head_node = match head_origin {
        Origin::Node(h) if w.weights.contains_key(&h) && !used.contains(&h) => h,
        _ => return Err(format!("the output '{logits}' is not a projection after the last block (the LM head)")),
    };
    let final_norm = norm_of(linear_input(head_node).unwrap(), "head", nodes[head_node])?;
    used.push(head_node);
    if let Some((j, _)) = w.linear.iter().find(|(j, _)| !used.contains(j)) {
        return Err(format!("{}: a projection that is not part of any recognised LLaDA block", nodes[*j].label()));
    }
    if w.products.len() != blocks.len() || w.residuals != 2 * blocks.len() || w.norm_eps.len() != 2 * blocks.len() + 1 {
        return Err(format!(
            "{} gated products, {} residual sums and {} RMSNorms, where {} LLaDA blocks have {}, {} and {} (with the final norm)",
            w.products.len(),
            w.residuals,
            w.norm_eps.len(),
            blocks.len(),
            blocks.len(),
            2 * blocks.len(),
            2 * blocks.len() + 1
        ));
    }
    // Rotary tables multiply q or k, nothing else.
    let rotated: Vec<Origin> = blocks.iter().flat_map(|b| [b.q.node, b.k.node]).map(|n| Origin::Node(nodes.iter().position(|m| std::ptr::eq(*m, n)).unwrap())).collect();
    if let Some((_, _, t)) = w.tables.iter().find(|(_, o, _)| !rotated.contains(o)) {
        return Err(format!("{}: multiplies by a constant of shape {:?} that is neither an RMSNorm weight nor a rotary table on q or k", t.node.label(), t.table.dims));
    }
    let rotary = w.tables.into_iter().map(|(_, _, t)| t).collect();
    Ok(Recognised { embedding, blocks, final_norm, head: proj(head_node), norm_eps: w.norm_eps, rotary })
}
