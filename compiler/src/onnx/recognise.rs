//! Finds LLaDA's blocks in an ONNX graph by its data flow, not by names: exporters rename
//! and transpose weights freely (PyTorch's folds `W^T` into an anonymous `val_6`), but the
//! flow is fixed. Each dynamic value gets an origin, the last node that mixed two values
//! (or applied a weight); elementwise and shape ops between keep their input's origin. Then:
//! - the score MatMul has two dynamic inputs from the q and k projections;
//! - the P·V MatMul has the scores' softmax and the v projection;
//! - the output projection reads the P·V result;
//! - the gate is the projection a Sigmoid reads; the up projection is the other factor of the
//!   product with it; the down projection reads that product;
//! - a Mul by a constant vector of `d_model` is an RMSNorm's weight: q, k and v read the
//!   attention norm, gate and up the feed-forward norm, the head the final norm.
//!
//! Anything the walk cannot place is refused with the node's name and op.

use std::collections::HashMap;

use onnx_ir::ir::{Argument, Node, NodeType, OnnxGraph, TensorDataExt, ValueSource};

/// Ops a LLaDA forward pass exports to (PyTorch's dynamo and TorchScript exporters, any
/// opset from 13), as ONNX names them; onnx-ir turns a MatMul or Gemm with a constant weight
/// into a Linear. The recogniser checks the data flow between them.
pub const LLADA_OPS: &[&str] = &[
    "Gather", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "ReduceMean", "Neg", "Softmax", "Sigmoid",
    "Reshape", "Transpose", "Slice", "Concat", "Unsqueeze", "Squeeze", "Expand", "Cast", "Identity", "Constant",
];

fn is_llada_op(t: &NodeType) -> bool {
    *t == NodeType::Linear || LLADA_OPS.contains(&t.to_string().as_str())
}

/// The weights of one transformer block, as the constant inputs that carry them.
pub struct Block<'g> {
    pub attn_norm: &'g Argument,
    pub q: Projection<'g>,
    pub k: Projection<'g>,
    pub v: Projection<'g>,
    pub attn_out: Projection<'g>,
    pub ff_norm: &'g Argument,
    pub gate: Projection<'g>,
    pub up: Projection<'g>,
    pub down: Projection<'g>,
}

/// A projection's weight and whether it is stored `[in, out]` (a MatMul's right operand) or
/// `[out, in]` (Gemm with `transB`, the checkpoint's layout).
#[derive(Clone, Copy)]
pub struct Projection<'g> {
    pub node: &'g Node,
    pub weight: &'g Argument,
    pub in_out: bool,
}

pub struct Recognised<'g> {
    pub embedding: &'g Argument,
    pub blocks: Vec<Block<'g>>,
    pub final_norm: &'g Argument,
    pub head: Projection<'g>,
    /// Every Add with a scalar constant right after a ReduceMean: the norms' epsilon.
    pub norm_eps: Vec<(&'g Node, f64)>,
    /// Each block's score scaling (node, the factor the scores are multiplied by).
    pub score_scale: Vec<(&'g Node, f64)>,
    /// Each q projection's head split: the Reshape's target shape.
    pub q_split: Vec<(&'g Node, Vec<i64>)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The graph's token-id input.
    Tokens,
    /// The output of node `i`, which mixed values or applied a weight.
    Node(usize),
}

pub fn is_constant(a: &Argument) -> bool {
    matches!(a.value_source, ValueSource::Static(_) | ValueSource::Constant)
}

/// Names a node in errors: `node 'node_linear_3' (Linear)`, with the ONNX file's node name
/// (onnx-ir renames nodes; `Label` maps them back).
pub type Label<'a> = &'a dyn Fn(&Node) -> String;

fn dynamic_inputs(node: &Node) -> impl Iterator<Item = &Argument> {
    node.inputs().iter().filter(|a| !is_constant(a) && !a.is_optional())
}

fn shape_of(a: &Argument) -> Option<Vec<usize>> {
    a.ty.static_shape_known()
}

fn scalar(a: &Argument) -> Option<f64> {
    let v = a.value()?;
    (v.num_elements() == 1).then(|| v.scalar_f64().ok()).flatten()
}

pub fn recognise<'g>(g: &'g OnnxGraph, d_model: usize, op: Label) -> Result<Recognised<'g>, String> {
    let nodes = &g.nodes;
    if let Some(n) = nodes.iter().find(|n| !is_llada_op(&n.node_type())) {
        return Err(format!("{}: not an op of LLaDA's forward pass; lladac recognises LLaDA blocks built from {}", op(n), known_ops()));
    }
    let [ids] = &g.inputs[..] else {
        return Err(format!("the graph has {} inputs; a LLaDA export has one, the token ids", g.inputs.len()));
    };
    let [logits] = &g.outputs[..] else {
        return Err(format!("the graph has {} outputs; a LLaDA export has one, the logits", g.outputs.len()));
    };

    let mut origin: HashMap<&str, Origin> = HashMap::from([(ids.name.as_str(), Origin::Tokens)]);
    let mut embedding = None;
    // What the walk finds, by node index: each projection with its input's origin, the norms'
    // weights, MatMuls of two dynamic values, products of two origins, and so on.
    let mut linear_in: Vec<(usize, Origin)> = Vec::new();
    let mut norm_weight: HashMap<usize, &Argument> = HashMap::new();
    let mut two_dynamic_matmuls: Vec<(usize, Origin, Origin)> = Vec::new();
    let mut products: Vec<(usize, Origin, Origin)> = Vec::new();
    let mut sigmoid_of: Vec<Origin> = Vec::new();
    let mut scale_after: Vec<(usize, Origin, f64)> = Vec::new();
    let mut norm_eps = Vec::new();
    let mut reshapes: Vec<(usize, Origin, Vec<i64>)> = Vec::new();

    for (i, node) in nodes.iter().enumerate() {
        if node.node_type() == NodeType::Constant {
            continue;
        }
        let mut dyn_origins = Vec::new();
        for a in dynamic_inputs(node) {
            let o = origin.get(a.name.as_str()).copied().ok_or_else(|| {
                format!("{}: input '{}' is neither an initializer, a constant nor the output of an earlier node", op(node), a.name)
            })?;
            dyn_origins.push(o);
        }
        let consts: Vec<&Argument> = node.inputs().iter().filter(|a| is_constant(a)).collect();
        let same = dyn_origins.first().copied().filter(|o| dyn_origins.iter().all(|x| x == o));
        let out = match node.node_type() {
            NodeType::Gather => {
                let table = consts.first().filter(|t| node.inputs().first().is_some_and(|a| a.name == t.name));
                match (table, &dyn_origins[..]) {
                    (Some(t), [Origin::Tokens]) if embedding.is_none() => {
                        embedding = Some(*t);
                        Origin::Node(i)
                    }
                    _ => return Err(format!("{}: a Gather other than the one embedding lookup of the token ids", op(node))),
                }
            }
            NodeType::Linear => {
                let [x] = &dyn_origins[..] else { return Err(format!("{}: a projection needs one dynamic input and a constant weight", op(node))) };
                if node.inputs().get(2).is_some_and(|b| !b.is_optional()) {
                    return Err(format!("{}: a projection with a bias; LLaDA's projections have none", op(node)));
                }
                linear_in.push((i, *x));
                Origin::Node(i)
            }
            NodeType::MatMul => match &dyn_origins[..] {
                [a, b] => {
                    two_dynamic_matmuls.push((i, *a, *b));
                    Origin::Node(i)
                }
                _ => return Err(format!("{}: a MatMul that is neither a projection nor part of attention", op(node))),
            },
            NodeType::Mul => {
                let norm = consts.iter().find(|c| shape_of(c).is_some_and(|s| s == [d_model]));
                match (norm, &dyn_origins[..], same) {
                    (Some(w), [_], _) => {
                        norm_weight.insert(i, w);
                        Origin::Node(i)
                    }
                    (None, [a, b], None) => {
                        products.push((i, *a, *b));
                        Origin::Node(i)
                    }
                    (None, [x], _) => {
                        if let Some(s) = consts.iter().find_map(|c| scalar(c)) {
                            scale_after.push((i, *x, s));
                        }
                        *x
                    }
                    (_, _, Some(o)) => o,
                    _ => return Err(format!("{}: a product LLaDA's blocks do not compute", op(node))),
                }
            }
            NodeType::Add => match (&dyn_origins[..], same) {
                ([x], _) => {
                    if let Some(eps) = consts.iter().find_map(|c| scalar(c)) {
                        let after_mean = node.inputs().iter().filter(|a| !is_constant(a)).any(|a| {
                            nodes[..i].iter().any(|p| p.node_type() == NodeType::ReduceMean && p.outputs().iter().any(|o| o.name == a.name))
                        });
                        if after_mean {
                            norm_eps.push((node, eps));
                        }
                    }
                    *x
                }
                ([_, _], None) => Origin::Node(i),
                (_, Some(o)) => o,
                _ => return Err(format!("{}: an Add LLaDA's blocks do not compute", op(node))),
            },
            NodeType::Div => {
                let [x] = &dyn_origins[..] else { return Err(format!("{}: a division LLaDA's blocks do not compute", op(node))) };
                if let Some(s) = consts.iter().find(|c| node.inputs().get(1).is_some_and(|a| a.name == c.name)).and_then(|c| scalar(c)) {
                    scale_after.push((i, *x, 1.0 / s));
                }
                *x
            }
            NodeType::Sigmoid => {
                let o = same.ok_or_else(|| format!("{}: has no dynamic input", op(node)))?;
                sigmoid_of.push(o);
                o
            }
            NodeType::Reshape => {
                let o = same.ok_or_else(|| format!("{}: reshapes no dynamic value", op(node)))?;
                if let Some(shape) = consts.first().and_then(|c| c.value()).and_then(|v| v.to_i64_vec().ok()) {
                    reshapes.push((i, o, shape));
                }
                o
            }
            _ => same.ok_or_else(|| format!("{}: mixes values in a way LLaDA's blocks do not", op(node)))?,
        };
        for o in node.outputs() {
            origin.insert(o.name.as_str(), out);
        }
    }

    let embedding = embedding.ok_or("no embedding lookup: no Gather reads a constant table with the token ids")?;
    let proj = |i: usize| -> Result<Projection<'g>, String> {
        let node = &nodes[i];
        let weight = node.inputs().iter().find(|a| is_constant(a)).ok_or_else(|| format!("{}: its weight is not a constant", op(node)))?;
        let in_out = match node {
            Node::Linear(l) => !l.config.transpose_weight,
            _ => true,
        };
        Ok(Projection { node, weight, in_out })
    };
    let norm_of = |o: Origin, what: &str, n: &Node| -> Result<&'g Argument, String> {
        match o {
            Origin::Node(j) if norm_weight.contains_key(&j) => Ok(norm_weight[&j]),
            _ => Err(format!("{}: the {what} projection does not read an RMSNorm's output", op(n))),
        }
    };
    let linear_input = |i: usize| linear_in.iter().find(|(j, _)| *j == i).map(|(_, o)| *o);
    let linear_reading = |o: Origin| -> Vec<usize> { linear_in.iter().filter(|(_, x)| *x == o).map(|(j, _)| *j).collect() };

    // Attention: score MatMuls read two projections; P·V MatMuls read a score MatMul's softmax.
    let mut blocks = Vec::new();
    let mut used = Vec::new();
    let mut score_scale = Vec::new();
    let mut q_split = Vec::new();
    let scores: Vec<&(usize, Origin, Origin)> = two_dynamic_matmuls.iter().filter(|(_, a, b)| linear_input_of(a, &linear_in) && linear_input_of(b, &linear_in)).collect();
    for &&(s, qo, ko) in &scores {
        let node = &nodes[s];
        let pv = two_dynamic_matmuls.iter().find(|(_, a, _)| *a == Origin::Node(s)).ok_or_else(|| format!("{}: attention scores no MatMul multiplies with values", op(node)))?;
        // `scores` holds only MatMuls of two projections, so q and k are nodes.
        let (Origin::Node(q), Origin::Node(k), Origin::Node(v)) = (qo, ko, pv.2) else {
            return Err(format!("{}: the values are not a projection", op(&nodes[pv.0])));
        };
        if !linear_in.iter().any(|(j, _)| *j == v) {
            return Err(format!("{}: the values are not a projection", op(&nodes[pv.0])));
        }
        let o = match &linear_reading(Origin::Node(pv.0))[..] {
            [o] => *o,
            found => return Err(format!("{}: attention's result is read by {} projections, expected one (the output projection)", op(&nodes[pv.0]), found.len())),
        };
        // The feed-forward half: the projection after this block's output projection that
        // feeds a Sigmoid is the gate.
        let gate = linear_in.iter().map(|(j, _)| *j).find(|&j| j > o && sigmoid_of.contains(&Origin::Node(j))).ok_or_else(|| format!("{}: no gated feed-forward follows this attention", op(&nodes[o])))?;
        let &(m, a, b) = products.iter().find(|(_, a, b)| *a == Origin::Node(gate) || *b == Origin::Node(gate)).ok_or_else(|| format!("{}: the gate is not multiplied with an up projection", op(&nodes[gate])))?;
        let Origin::Node(up) = (if a == Origin::Node(gate) { b } else { a }) else {
            return Err(format!("{}: the gate is multiplied with the token ids", op(&nodes[m])));
        };
        let down = match &linear_reading(Origin::Node(m))[..] {
            [d] => *d,
            _ => return Err(format!("{}: the gated product is not read by one down projection", op(&nodes[m]))),
        };
        // q, k and v are projections (checked above), so each has an input origin.
        let (qn, kn, vn) = (linear_input(q).unwrap(), linear_input(k).unwrap(), linear_input(v).unwrap());
        let attn_norm = norm_of(qn, "q", &nodes[q])?;
        if kn != qn || vn != qn {
            return Err(format!("{}: q, k and v do not read the same RMSNorm", op(&nodes[k])));
        }
        let (gn, un) = (linear_input(gate).ok_or_else(|| format!("{}: not a projection", op(&nodes[gate])))?, linear_input(up).ok_or_else(|| format!("{}: not a projection", op(&nodes[up])))?);
        let ff_norm = norm_of(gn, "gate", &nodes[gate])?;
        if un != gn {
            return Err(format!("{}: gate and up do not read the same RMSNorm", op(&nodes[up])));
        }
        if let Some(&(n, _, f)) = scale_after.iter().find(|(_, x, _)| *x == Origin::Node(s)) {
            score_scale.push((&nodes[n], f));
        } else {
            return Err(format!("{}: attention scores are not scaled", op(node)));
        }
        if let Some((n, _, shape)) = reshapes.iter().find(|(_, x, _)| *x == Origin::Node(q)) {
            q_split.push((&nodes[*n], shape.clone()));
        }
        used.extend([q, k, v, o, gate, up, down]);
        blocks.push(Block {
            attn_norm,
            q: proj(q)?,
            k: proj(k)?,
            v: proj(v)?,
            attn_out: proj(o)?,
            ff_norm,
            gate: proj(gate)?,
            up: proj(up)?,
            down: proj(down)?,
        });
    }
    if blocks.is_empty() {
        return Err("no attention found: no MatMul multiplies two projections".into());
    }
    let head_node = match origin.get(logits.name.as_str()) {
        Some(Origin::Node(h)) if linear_in.iter().any(|(j, _)| j == h) && !used.contains(h) => *h,
        _ => return Err(format!("the output '{}' is not a projection after the last block (the LM head)", logits.name)),
    };
    let final_norm = norm_of(linear_input(head_node).unwrap(), "head", &nodes[head_node])?;
    used.push(head_node);
    if let Some((j, _)) = linear_in.iter().find(|(j, _)| !used.contains(j)) {
        return Err(format!("{}: a projection that is not part of any recognised LLaDA block", op(&nodes[*j])));
    }
    Ok(Recognised { embedding, blocks, final_norm, head: proj(head_node)?, norm_eps, score_scale, q_split })
}

fn linear_input_of(o: &Origin, linear_in: &[(usize, Origin)]) -> bool {
    matches!(o, Origin::Node(j) if linear_in.iter().any(|(k, _)| k == j))
}

pub fn known_ops() -> String {
    LLADA_OPS.join(", ")
}
