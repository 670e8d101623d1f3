//! Sampler paths the conformance goldens do not exercise (they are all temperature 0 without
//! guidance): classifier-free guidance and seeded sampling, on a random-weight model.

mod common;

use llada_rt::sampler::softmax_at;
use llada_rt::{generate, Model, SamplerParams, Session};
use llada_tools::checkpoint::Shape;

fn tiny_model(dir: &std::path::Path) -> Model {
    Model::open(&common::random_artifact(dir, Shape::tiny(), 0.3, "model.lad", Some(64)), true).unwrap()
}

#[test]
fn guidance_combines_the_conditional_and_unconditional_passes() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mask = model.header.special.mask;
    let prompt: Vec<u32> = vec![5, 77, 120, 33, 200, 9, 61, 140];
    let p = SamplerParams { gen_length: 8, block_length: 8, steps: 8, cfg_scale: 1.5, ..Default::default() };
    let mut session = Session::new(&model).unwrap();
    let g = generate(&mut session, &prompt, &p, &mut |_| {}).unwrap();
    assert_eq!(g.forward_passes, 16, "two passes per step");

    // Step 0 by hand: un + (cfg + 1) * (cond - un), then the most confident position.
    let x: Vec<u32> = prompt.iter().copied().chain(std::iter::repeat_n(mask, 8)).collect();
    let un_x: Vec<u32> = x.iter().enumerate().map(|(i, &t)| if i < prompt.len() { mask } else { t }).collect();
    let rows: Vec<u32> = (8..16).collect();
    let cond = session.forward_full(&x, &rows).unwrap().to_vec();
    let un = session.forward_full(&un_x, &rows).unwrap().to_vec();
    let vocab = cond.len() / rows.len();
    let mut best: Option<(f32, usize, u32)> = None;
    for r in 0..rows.len() {
        let row: Vec<f32> = (0..vocab).map(|v| un[r * vocab + v] + 2.5 * (cond[r * vocab + v] - un[r * vocab + v])).collect();
        let tok = (0..vocab).fold(0, |b, v| if row[v] > row[b] { v } else { b });
        let conf = softmax_at(&row, tok);
        if best.is_none_or(|(c, _, _)| conf > c) {
            best = Some((conf, r, tok as u32));
        }
    }
    let (_, r, tok) = best.unwrap();
    assert_eq!(g.reveals[0], vec![[r as u32, tok]]);

    let plain = generate(&mut session, &prompt, &SamplerParams { cfg_scale: 0.0, ..p }, &mut |_| {}).unwrap();
    assert_eq!(plain.forward_passes, 8);
}

#[test]
fn same_seed_same_output_other_seed_other_output() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut session = Session::new(&model).unwrap();
    let prompt = [3u32, 1, 4, 1, 5, 9, 2, 6];
    let sample = |session: &mut Session, seed| {
        let p = SamplerParams { gen_length: 16, block_length: 8, steps: 16, temperature: 1.0, seed, ..Default::default() };
        generate(session, &prompt, &p, &mut |_| {}).unwrap().output_ids
    };
    let a = sample(&mut session, 1);
    assert_eq!(a, sample(&mut session, 1));
    assert_ne!(a, sample(&mut session, 2));
}
