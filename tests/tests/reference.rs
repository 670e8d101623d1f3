//! The runtime's forward pass against an independent LLaDA written in burn, on random-weight
//! checkpoints in exact Hugging Face layout (bf16 and f16, sharded, grouped-query attention).

mod common;

use std::path::Path;

use llada_tools::checkpoint::{Shape, WeightType};
use llada_tools::reference::{Hyper, Llada};

/// Largest |runtime - reference| over largest |reference|.
fn relative_error(shape: Shape, weights: WeightType, shard_bytes: u64, len: usize) -> f64 {
    let compiled = |ckpt: &Path, art: &Path| {
        common::compile(ckpt, art, None);
    };
    common::error_against_reference(&shape, weights, shard_bytes, len, compiled, |ckpt, input, device| Llada::load(ckpt, &shape, device).unwrap().forward(input, Hyper::of(&shape)).into_data().try_to_vec().unwrap())
}

#[test]
fn bf16_sharded_grouped_query_matches_burn() {
    // 2 layers, 4 query heads sharing 2 key/value heads, three shards; 37 tokens run on a
    // 48-row graph, so the padding rows must be masked out.
    let err = relative_error(Shape::tiny(), WeightType::Bf16, 300_000, 37);
    assert!(err <= 1e-4, "relative error {err:.2e}");
}

#[test]
fn f16_multi_query_matches_burn() {
    let shape = Shape { d_model: 192, n_layers: 3, n_heads: 6, n_kv_heads: 1, mlp_hidden_size: 512, ..Shape::tiny() };
    let err = relative_error(shape, WeightType::F16, u64::MAX, 64);
    assert!(err <= 1e-4, "relative error {err:.2e}");
}
