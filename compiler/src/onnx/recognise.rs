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
    pub lm_head: Projection<'g>,
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

/// The dims of input `k` of `node` (empty where it has none).
fn input_dims(f: &Folded, node: &Node, k: usize) -> Vec<usize> {
    f.input(node, k).map(|v| v.dims().to_vec()).unwrap_or_default()
}

/// A live node's inputs by position: the token-dependent ones with their traces, and the
/// constants.
struct Inputs<'a> {
    dyns: Vec<(usize, Trace)>,
    consts: Vec<(usize, &'a Tensor)>,
}

impl<'a> Inputs<'a> {
    /// The first token-dependent input's trace, where all of them share its origin.
    fn same(&self) -> Option<Trace> {
        self.dyns.first().map(|d| d.1).filter(|t| self.dyns.iter().all(|d| d.1.origin == t.origin))
    }

    fn constant(&self, k: usize) -> Option<&'a Tensor> {
        self.consts.iter().find(|c| c.0 == k).map(|c| c.1)
    }
}

fn mixes(node: &Node) -> String {
    format!("{}: mixes values in a way LLaDA's blocks do not", node.label())
}

fn walk<'g>(f: &Folded<'g>) -> Result<Walk<'g>, String> {
    let mut w = Walk::default();
    w.trace.insert(f.ids, Trace { origin: Origin::Tokens, factor: 1.0, tolerance: 0.0, sigmoid: false, softmax: false });
    for (i, &node) in f.live.iter().enumerate() {
        let ins = w.inputs(f, node)?;
        let out = w.step(f, i, node, &ins)?;
        for o in &node.outputs {
            w.trace.insert(o.as_str(), out);
        }
    }
    Ok(w)
}

/// The walk's steps, one per kind of op: each records what a live node means for LLaDA's
/// blocks and gives its outputs' trace.
impl<'g> Walk<'g> {
    fn inputs<'f>(&self, f: &'f Folded<'g>, node: &Node) -> Result<Inputs<'f>, String> {
        let mut ins = Inputs { dyns: Vec::new(), consts: Vec::new() };
        for (k, name) in node.inputs.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
            match f.value(name) {
                Some(Value::Const(t)) => ins.consts.push((k, t)),
                Some(Value::Dyn { .. }) => {
                    let t = self.trace.get(name.as_str()).copied().ok_or_else(|| format!("{}: input '{name}' is not computed before it", node.label()))?;
                    ins.dyns.push((k, t));
                }
                None => return Err(format!("{}: input '{name}' is not defined before it", node.label())),
            }
        }
        if op_name(node) == "CastLike" {
            ins.dyns.retain(|d| d.0 == 0); // the second input gives only the type
        }
        Ok(ins)
    }

    /// Live node `i`'s outputs' trace.
    fn step(&mut self, f: &Folded<'g>, i: usize, node: &'g Node, ins: &Inputs) -> Result<Trace, String> {
        let op = op_name(node);
        match op {
            "Gather" => self.gather(i, node, ins),
            "MatMul" | "Gemm" => self.matrix_product(i, node, op, ins),
            "Mul" => self.mul(i, node, ins),
            "Div" => div(node, ins),
            "Add" | "Sub" => self.add_or_sub(i, node, op, ins),
            "Softmax" => self.softmax(f, i, node, ins),
            "Sigmoid" => Ok(Trace { sigmoid: true, ..ins.same().ok_or_else(|| mixes(node))? }),
            "RMSNormalization" | "SimplifiedLayerNormalization" => self.rms_norm_op(f, i, node, ins),
            "RotaryEmbedding" => self.rotary_op(f, i, node, ins),
            "Attention" => self.attention_op(i, node, ins),
            op if CARRY_OPS.contains(&op) => self.carry(f, node, op, ins),
            _ => Err(format!("{}: {}", node.label(), unknown_op(&node.op))),
        }
    }

    /// The one embedding lookup of the token ids, or a piece of one value.
    fn gather(&mut self, i: usize, node: &Node, ins: &Inputs) -> Result<Trace, String> {
        match (&ins.dyns[..], ins.consts.first()) {
            ([(1, Trace { origin: Origin::Tokens, .. })], Some((0, table))) if self.embedding.is_none() && table.dims.len() == 2 && node.int("axis").unwrap_or(0) == 0 => {
                self.d_model = table.dims[1];
                self.embedding = Some((*table).clone());
                Ok(Trace::fresh(i))
            }
            ([(0, t)], _) => Ok(*t), // a piece of one value (an unbind of the rotary halves)
            _ => Err(format!("{}: a Gather other than the one embedding lookup of the token ids", node.label())),
        }
    }

    /// A projection by a constant weight, or a product of two token-dependent values (the
    /// attention scores, or the probabilities applied to the values).
    fn matrix_product(&mut self, i: usize, node: &Node, op: &str, ins: &Inputs) -> Result<Trace, String> {
        match (&ins.dyns[..], &ins.consts[..]) {
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
                self.linear.push((i, x.origin));
                self.weights.insert(i, ((*wt).clone(), in_out));
                Ok(Trace::fresh(i))
            }
            ([(0, a), (1, b)], []) if op == "MatMul" => {
                if self.two_dynamic.iter().any(|(j, ..)| a.origin == Origin::Node(*j)) && !a.softmax {
                    return Err(format!("{}: multiplies the values by the scores before their softmax", node.label()));
                }
                self.two_dynamic.push((i, *a, *b));
                Ok(Trace { factor: a.factor * b.factor, tolerance: a.tolerance + b.tolerance, ..Trace::fresh(i) })
            }
            _ => Err(format!("{}: a matrix product that is neither a projection by a constant weight nor part of attention", node.label())),
        }
    }

    /// A product with a constant (a scale, an RMSNorm weight or a rotary table), of a value
    /// with itself (SiLU and RMSNorm's steps), or of two values (the gated feed-forward's).
    fn mul(&mut self, i: usize, node: &'g Node, ins: &Inputs) -> Result<Trace, String> {
        match (&ins.dyns[..], &ins.consts[..]) {
            ([(_, x)], [(_, c)]) => {
                if let Some(s) = c.scalar() {
                    Ok(x.scaled(s, c.elem))
                } else if c.numel() == self.d_model && c.dims.last() == Some(&self.d_model) {
                    self.norm_weight.insert(i, c.reshaped(vec![self.d_model]));
                    Ok(Trace::fresh(i))
                } else {
                    self.tables.push((i, x.origin, RotaryTable { node, table: (*c).clone(), half: false }));
                    Ok(*x)
                }
            }
            // x * sigmoid(x): SiLU; x * x and x * rsqrt(...): steps of RMSNorm.
            ([(_, a), (_, b)], []) if a.origin == b.origin => {
                if a.sigmoid != b.sigmoid {
                    self.silu_of.push(a.origin);
                }
                Ok(Trace { sigmoid: false, ..*a })
            }
            ([(_, a), (_, b)], []) => {
                self.products.push((i, a.origin, b.origin));
                if a.sigmoid || b.sigmoid {
                    return Err(format!("{}: multiplies a sigmoid by another value (GLU); LLaDA's feed-forward is SwiGLU, silu(gate) * up", node.label()));
                }
                Ok(Trace::fresh(i))
            }
            _ => Err(mixes(node)),
        }
    }

    /// A constant added (RMSNorm's epsilon after the mean, or zeros) or subtracted (zeros), or
    /// a residual sum of two values.
    fn add_or_sub(&mut self, i: usize, node: &'g Node, op: &str, ins: &Inputs) -> Result<Trace, String> {
        match (&ins.dyns[..], &ins.consts[..]) {
            ([(_, x)], [(_, c)]) => {
                let after_mean = node.inputs.iter().any(|n| self.mean_outputs.contains(&n.as_str()));
                match c.scalar() {
                    Some(eps) if after_mean && op == "Add" => self.norm_eps.push((node, eps, c.elem)),
                    _ if all_zero(c) => {}
                    Some(v) => return Err(format!("{}: adds the constant {v}; LLaDA adds a constant only as RMSNorm's epsilon", node.label())),
                    None => return Err(format!("{}: adds a constant of shape {:?} (an attention mask or bias?); LLaDA's bidirectional attention adds none: export without a mask, or with a mask of all ones", node.label(), c.dims)),
                }
                Ok(*x)
            }
            ([(_, a), (_, b)], []) if a.origin == b.origin && op == "Add" => Ok(*a),
            ([(_, a), (_, b)], []) if op == "Add" => {
                if !a.unscaled() || !b.unscaled() {
                    return Err(format!("{}: a residual sum of values scaled by {} and {}; LLaDA scales neither", node.label(), a.factor, b.factor));
                }
                self.residuals += 1;
                Ok(Trace::fresh(i))
            }
            _ => Err(format!("{}: subtracts in a way LLaDA's blocks do not (a LayerNorm's centring?); LLaDA normalises with RMSNorm", node.label())),
        }
    }

    /// Attention's softmax, over the last axis of the scores.
    fn softmax(&mut self, f: &Folded, i: usize, node: &Node, ins: &Inputs) -> Result<Trace, String> {
        let x = ins.same().ok_or_else(|| mixes(node))?;
        let r = rank(f, node, 0) as i64;
        let default = if f.graph.opset >= 13 { -1 } else { 1 };
        if axis_of(node.int("axis").unwrap_or(default), r) != Some(r - 1) || (f.graph.opset < 13 && r != 2) {
            return Err(format!("{}: a softmax over another axis than the last; attention's is over the keys", node.label()));
        }
        self.softmax.push((i, x));
        Ok(Trace { factor: 1.0, tolerance: 0.0, softmax: true, ..x })
    }

    /// One RMSNorm op over the last axis, with a `d_model` weight.
    fn rms_norm_op(&mut self, f: &Folded, i: usize, node: &'g Node, ins: &Inputs) -> Result<Trace, String> {
        let wt = ins.constant(1).filter(|wt| wt.numel() == self.d_model);
        let (Some(wt), [_]) = (wt, &ins.dyns[..]) else {
            return Err(format!("{}: an RMSNorm whose scale is not a constant vector of d_model {}", node.label(), self.d_model));
        };
        let r = rank(f, node, 0) as i64;
        if axis_of(node.int("axis").unwrap_or(-1), r) != Some(r - 1) {
            return Err(format!("{}: normalises from axis {:?}; LLaDA's RMSNorm normalises the last axis", node.label(), node.int("axis")));
        }
        self.norm_eps.push((node, node.float("epsilon").unwrap_or(1e-5), Elem::F32));
        self.norm_weight.insert(i, wt.reshaped(vec![self.d_model]));
        Ok(Trace::fresh(i))
    }

    /// One rotary embedding op: whole heads, halves rotated, positions `0..seq`; its cos and sin
    /// caches are recorded for the config check.
    fn rotary_op(&mut self, f: &Folded, i: usize, node: &'g Node, ins: &Inputs) -> Result<Trace, String> {
        let x = ins.same().ok_or_else(|| mixes(node))?;
        if node.int("interleaved").unwrap_or(0) != 0 {
            return Err(format!("{}: interleaved rotary embedding; LLaDA rotates the two halves of each head", node.label()));
        }
        if node.float("scale").is_some_and(|s| s != 1.0) || node.int("rotary_embedding_dim").is_some_and(|d| d != 0 && d as usize != rank_last(f, node)) {
            return Err(format!("{}: a scaled or partial rotary embedding; LLaDA rotates whole heads unscaled", node.label()));
        }
        // ONNX's op takes (x, cos, sin, positions); Microsoft's (x, positions, cos, sin).
        let (positions, cos, sin) = if node.op.starts_with("com.microsoft") { (1, 2, 3) } else { (3, 1, 2) };
        for k in [cos, sin] {
            let t = ins.constant(k).ok_or_else(|| format!("{}: its cos and sin caches are not constants", node.label()))?;
            self.tables.push((i, x.origin, RotaryTable { node, table: t.clone(), half: true }));
        }
        if let Some(p) = ins.constant(positions) {
            let pos = p.i64s()?;
            if pos.iter().enumerate().any(|(j, &v)| v != (j % f.seq_len) as i64) {
                return Err(format!("{}: position ids other than 0..{}", node.label(), f.seq_len));
            }
        }
        Ok(x)
    }

    /// One attention op: bidirectional, unmasked, of q, k and v computed from the tokens.
    fn attention_op(&mut self, i: usize, node: &Node, ins: &Inputs) -> Result<Trace, String> {
        let (q, k, v) = match &ins.dyns[..] {
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
        if ins.consts.iter().any(|(k, t)| *k == 3 && !mask_ok(t)) || ins.consts.iter().any(|(k, _)| *k > 3) {
            return Err(format!("{}: an attention mask or cache; LLaDA's bidirectional attention has none", node.label()));
        }
        if !v.unscaled() {
            return Err(format!("{}: the values are scaled by {}", node.label(), v.factor));
        }
        self.attention_ops.push((i, q, k, v.origin));
        Ok(Trace::fresh(i))
    }

    /// An op that keeps its input's origin, with the checks RMSNorm's steps (the mean of the
    /// square) and a constant Where need.
    fn carry(&mut self, f: &Folded, node: &'g Node, op: &str, ins: &Inputs) -> Result<Trace, String> {
        match op {
            "Where" => {
                // A constant condition that picks the token-dependent branch everywhere.
                let picks = match (ins.constant(0), &ins.dyns[..]) {
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
                let axes = ins.constant(1).map(|c| c.i64s().map(|v| v.into_owned())).transpose()?.or_else(|| node.ints("axes").map(|a| a.to_vec()));
                if axes.as_deref().map(|a| a.iter().map(|&x| axis_of(x, r)).collect::<Vec<_>>()) != Some(vec![Some(r - 1)]) || node.int("keepdims") == Some(0) {
                    return Err(format!("{}: a mean over other axes than the last; RMSNorm's is over each row's features", node.label()));
                }
                self.mean_outputs.extend(node.outputs.iter().map(|o| o.as_str()));
            }
            "Pow" => {
                if ins.constant(1).and_then(|c| c.scalar()) != Some(2.0) {
                    return Err(format!("{}: a power other than the square; RMSNorm squares", node.label()));
                }
            }
            _ => {}
        }
        ins.same().ok_or_else(|| mixes(node))
    }
}

/// A division by a scalar (a scale), or a step of RMSNorm on one value (`1 / sqrt(mean + eps)`).
fn div(node: &Node, ins: &Inputs) -> Result<Trace, String> {
    match (&ins.dyns[..], &ins.consts[..]) {
        ([(0, x)], [(1, c)]) => match c.scalar() {
            Some(s) => Ok(x.scaled(1.0 / s, c.elem)),
            None => Err(format!("{}: divides by a constant that is not a scalar", node.label())),
        },
        // 1 / sqrt(mean + eps): a step of RMSNorm on one value.
        ([(1, x)], [(0, _)]) => Ok(*x),
        ([(_, a), (_, b)], []) if a.origin == b.origin => Ok(*a),
        _ => Err(mixes(node)),
    }
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

/// One attention, either form, by live-node index: its q, k and v projections, the node whose
/// output is its result, and what it computes.
struct FoundAttention<'g> {
    q: usize,
    k: usize,
    v: usize,
    result: usize,
    attention: Attention<'g>,
}

/// Reading the walk's records into blocks.
impl<'g> Walk<'g> {
    fn projection(&self, f: &Folded<'g>, i: usize) -> Projection<'g> {
        let (weight, in_out) = self.weights[&i].clone();
        Projection { node: f.live[i], weight, in_out }
    }

    /// The projection whose output is `o`, if it is one.
    fn projection_at(&self, o: Origin) -> Option<usize> {
        match o {
            Origin::Node(j) if self.weights.contains_key(&j) => Some(j),
            _ => None,
        }
    }

    /// The origin projection `i` reads.
    fn linear_input(&self, i: usize) -> Option<Origin> {
        self.linear.iter().find(|(j, _)| *j == i).map(|(_, o)| *o)
    }

    /// The projections that read `o`.
    fn linear_reading(&self, o: Origin) -> Vec<usize> {
        self.linear.iter().filter(|(_, x)| *x == o).map(|(j, _)| *j).collect()
    }

    /// The weight of the RMSNorm whose output is `o`, which the `what` projection `n` reads.
    fn norm_of(&self, o: Origin, what: &str, n: &Node) -> Result<Tensor, String> {
        match o {
            Origin::Node(j) if self.norm_weight.contains_key(&j) => Ok(self.norm_weight[&j].clone()),
            _ => Err(format!("{}: the {what} projection does not read an RMSNorm's output", n.label())),
        }
    }

    /// Attentions written out: scores of two projections, their softmax, and its product with a
    /// third; every product of two token-dependent values and every softmax must belong to one.
    fn explicit_attentions(&self, f: &Folded<'g>) -> Result<Vec<FoundAttention<'g>>, String> {
        let nodes = &f.live;
        let mut found = Vec::new();
        for &(s, a, b) in self.two_dynamic.iter().filter(|(_, a, b)| self.projection_at(a.origin).is_some() && self.projection_at(b.origin).is_some()) {
            let node = nodes[s];
            let (_, p) = *self.softmax.iter().find(|(_, t)| t.origin == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores without a softmax", node.label()))?;
            let &(pv, probs, v) = self.two_dynamic.iter().find(|(_, x, _)| x.origin == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores no MatMul multiplies with values", node.label()))?;
            if !probs.softmax {
                return Err(format!("{}: multiplies the values by the scores before their softmax", nodes[pv].label()));
            }
            let v = self.projection_at(v.origin).ok_or_else(|| format!("{}: the values are not a projection", nodes[pv].label()))?;
            let out = f.value(&node.outputs[0]).map(|v| v.dims().to_vec()).unwrap_or_default();
            let heads = out.iter().rev().skip(2).product::<usize>();
            let head_dim = input_dims(f, node, 0).last().copied().unwrap_or(0);
            let attention = Attention { node, scale: p.factor, scale_tolerance: p.tolerance, heads, head_dim };
            found.push(FoundAttention { q: self.projection_at(a.origin).unwrap(), k: self.projection_at(b.origin).unwrap(), v, result: pv, attention });
        }
        let explicit = found.len();
        if explicit * 2 != self.two_dynamic.len() || explicit != self.softmax.len() {
            return Err(format!(
                "{} products of two token-dependent values and {} softmaxes, where {explicit} attentions of two projections account for {} and {explicit}",
                self.two_dynamic.len(),
                self.softmax.len(),
                explicit * 2
            ));
        }
        Ok(found)
    }

    /// `Attention` ops, each of three projections; the scale is the op's (or `1/sqrt(head_dim)`)
    /// times what q and k were scaled by.
    fn fused_attentions(&self, f: &Folded<'g>) -> Result<Vec<FoundAttention<'g>>, String> {
        let mut found = Vec::new();
        for &(i, q, k, v) in &self.attention_ops {
            let node = f.live[i];
            let (Some(qi), Some(ki), Some(vi)) = (self.projection_at(q.origin), self.projection_at(k.origin), self.projection_at(v)) else {
                return Err(format!("{}: q, k and v are not projections", node.label()));
            };
            let qd = input_dims(f, node, 0);
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
            let attention = Attention { node, scale: scale * q.factor * k.factor, scale_tolerance: tol + q.tolerance + k.tolerance, heads, head_dim };
            found.push(FoundAttention { q: qi, k: ki, v: vi, result: i, attention });
        }
        Ok(found)
    }

    /// The gated feed-forward after output projection `o` and before live node `next` (the next
    /// block's attention): its (gate, up, down) projections. The gate is the SiLU'd one.
    fn feed_forward(&self, f: &Folded<'g>, o: usize, next: usize) -> Result<(usize, usize, usize), String> {
        let nodes = &f.live;
        let gate = self.linear.iter().map(|(j, _)| *j).find(|&j| j > o && j < next && self.silu_of.contains(&Origin::Node(j))).ok_or_else(|| format!("{}: no gated feed-forward (SiLU) follows this attention", nodes[o].label()))?;
        let &(m, a, b) = self.products.iter().find(|(_, a, b)| *a == Origin::Node(gate) || *b == Origin::Node(gate)).ok_or_else(|| format!("{}: the gate is not multiplied with an up projection", nodes[gate].label()))?;
        let up = self.projection_at(if a == Origin::Node(gate) { b } else { a }).ok_or_else(|| format!("{}: the gate is multiplied with something other than a projection", nodes[m].label()))?;
        let down = match &self.linear_reading(Origin::Node(m))[..] {
            [d] => *d,
            _ => return Err(format!("{}: the gated product is not read by one down projection", nodes[m].label())),
        };
        Ok((gate, up, down))
    }

    /// The block around attention `at`, ending before live node `next`; its projections join
    /// `used`, which must not hold them already.
    fn block(&self, f: &Folded<'g>, at: &FoundAttention<'g>, next: usize, used: &mut Vec<usize>) -> Result<Block<'g>, String> {
        let nodes = &f.live;
        let &FoundAttention { q, k, v, result, attention } = at;
        if q == k || k == v || q == v {
            return Err(format!("{}: q, k and v are not three projections", attention.node.label()));
        }
        let o = match &self.linear_reading(Origin::Node(result))[..] {
            [o] => *o,
            found => return Err(format!("{}: attention's result is read by {} projections, expected one (the output projection)", nodes[result].label(), found.len())),
        };
        let (gate, up, down) = self.feed_forward(f, o, next)?;
        let (qn, kn, vn) = (self.linear_input(q).unwrap(), self.linear_input(k).unwrap(), self.linear_input(v).unwrap());
        let attn_norm = self.norm_of(qn, "q", nodes[q])?;
        if kn != qn || vn != qn {
            return Err(format!("{}: q, k and v do not read the same RMSNorm", nodes[k].label()));
        }
        let (gn, un) = (self.linear_input(gate).unwrap(), self.linear_input(up).unwrap());
        let ff_norm = self.norm_of(gn, "gate", nodes[gate])?;
        if un != gn {
            return Err(format!("{}: gate and up do not read the same RMSNorm", nodes[up].label()));
        }
        for (what, p) in [("q", q), ("k", k)] {
            if self.tables.iter().filter(|(_, origin, _)| *origin == Origin::Node(p)).count() < 2 {
                return Err(format!("{}: the {what} projection is not rotated (no cos and sin tables multiply it)", nodes[p].label()));
            }
        }
        for p in [q, k, v, o, gate, up, down] {
            if used.contains(&p) {
                return Err(format!("{}: a projection two blocks share", nodes[p].label()));
            }
            used.push(p);
        }
        let proj = |i| self.projection(f, i);
        Ok(Block { attn_norm, q: proj(q), k: proj(k), v: proj(v), attn_out: proj(o), ff_norm, gate: proj(gate), up: proj(up), down: proj(down), attention })
    }
}

fn assemble<'g>(f: &Folded<'g>, w: Walk<'g>, lm_head_origin: Origin, logits: &str) -> Result<Recognised<'g>, String> {
    let nodes = &f.live;
    let embedding = w.embedding.clone().ok_or("no embedding lookup: no Gather reads a constant table with the token ids")?;
    let mut attentions = w.explicit_attentions(f)?;
    attentions.extend(w.fused_attentions(f)?);
    attentions.sort_by_key(|a| a.result);

    let mut blocks = Vec::new();
    let mut used: Vec<usize> = Vec::new();
    for (n, at) in attentions.iter().enumerate() {
        // The feed-forward half ends where the next block's attention projections begin.
        let next = attentions.get(n + 1).map_or(usize::MAX, |a| a.q.min(a.k).min(a.v));
        blocks.push(w.block(f, at, next, &mut used)?);
    }
    if blocks.is_empty() {
        return Err("no attention found: no MatMul multiplies two projections and no Attention op reads three".into());
    }
    let lm_head_node = match lm_head_origin {
        Origin::Node(h) if w.weights.contains_key(&h) && !used.contains(&h) => h,
        _ => return Err(format!("the output '{logits}' is not a projection after the last block (the LM head)")),
    };
    let final_norm = w.norm_of(w.linear_input(lm_head_node).unwrap(), "head", nodes[lm_head_node])?;
    used.push(lm_head_node);
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
    let lm_head = w.projection(f, lm_head_node);
    let rotary = w.tables.into_iter().map(|(_, _, t)| t).collect();
    Ok(Recognised { embedding, blocks, final_norm, lm_head, norm_eps: w.norm_eps, rotary })
}
