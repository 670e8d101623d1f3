//! The ops lladac reads in a LLaDA export, and the error for any other: what the folder and
//! the recogniser share.

/// Ops that carry their input's origin through: layout, casts, and the elementwise steps of
/// RMSNorm and rotary embedding.
pub const CARRY_OPS: &[&str] = &[
    "Identity", "Cast", "CastLike", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split", "Concat", "Expand", "Tile", "Flatten",
    "Neg", "Pow", "Sqrt", "Reciprocal", "ReduceMean", "Dropout", "Where",
];

/// Ops the walk gives a meaning of their own.
pub const MEANING_OPS: &[&str] = &["Gather", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Softmax", "Sigmoid", "RMSNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding", "Attention"];

/// The ops lladac reads in a LLaDA export (besides those it folds away: shape arithmetic).
pub fn known_ops() -> String {
    MEANING_OPS.iter().chain(CARRY_OPS).copied().collect::<Vec<_>>().join(", ")
}

/// The error for an op lladac does not read, with the fix where the op says what made it.
pub fn unknown_op(op: &str) -> String {
    let known = format!("lladac recognises LLaDA blocks built from {}, and folds the shape arithmetic around them", known_ops());
    let hint = if matches!(op, "QuantizeLinear" | "DequantizeLinear" | "DynamicQuantizeLinear" | "MatMulInteger" | "QLinearMatMul") || op.ends_with("MatMulNBits") {
        "; export float weights and quantise with `lladac compile --quant`"
    } else if op.starts_with("com.microsoft::") {
        "; this is ONNX Runtime's fused op: compile the graph as torch.onnx.export wrote it, before ONNX Runtime's transformer optimisation"
    } else {
        ""
    };
    format!("not an op of LLaDA's forward pass; {known}{hint}")
}
