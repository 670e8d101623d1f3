//! The runtime's forward pass against an independent LLaDA written in burn, on random-weight
//! checkpoints in exact Hugging Face layout (bf16 and f16, sharded, grouped-query attention).

mod common;

use burn::tensor::{Device, Int, Tensor, TensorData};
use llada_rt::{Model, Session};
use llada_tools::checkpoint::{Shape, WeightType};
use llada_tools::reference::{Hyper, Llada};

/// Largest |runtime - reference| over largest |reference|.
fn relative_error(shape: Shape, weights: WeightType, shard_bytes: u64, len: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let written = common::checkpoint(&ckpt, shape.clone(), weights, shard_bytes, 0.08);
    let art = dir.path().join("model.lad");
    common::compile(&ckpt, &art, None);

    let ids: Vec<u32> = (0..len).map(|i| ((i * 7919 + 13) % written.special.bos as usize) as u32).collect();
    let model = Model::open(&art, true).unwrap();
    let mut session = Session::new(&model).unwrap();
    let rows: Vec<u32> = (0..len as u32).collect();
    let ours = session.forward_full(&ids, &rows).unwrap().to_vec();

    let device = Device::default();
    let reference = Llada::load(&ckpt, &shape, &device).unwrap();
    let input = Tensor::<2, Int>::from_data(TensorData::new(ids.iter().map(|&t| t as i64).collect::<Vec<_>>(), [1, len]), &device);
    let theirs: Vec<f32> = reference.forward(input, Hyper::of(&shape)).into_data().try_to_vec().unwrap();

    common::relative_error(&ours, &theirs)
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
