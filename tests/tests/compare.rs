//! `llada-rt compare`: an artifact against itself agrees exactly; q8 and q4 artifacts of the
//! same checkpoint differ from the unquantised reference measurably, q4 more, also on a
//! checkpoint with residual-stream outliers (`gen-checkpoint --outlier-channels`).

mod common;

use llada_rt::{Model, SamplerParams, Session};
use llada_rt_tools::compare::compare;
use llada_tools::checkpoint::{write, CheckpointSpec, Outliers, Shape, WeightType};

#[test]
fn quantisation_error_is_measured() {
    let dir = tempfile::tempdir().unwrap();
    let p = SamplerParams { gen_length: 32, block_length: 32, steps: 32, ..Default::default() };
    let prompt: Vec<u32> = (0..16).map(|i| 5 + 11 * i).collect();
    for outliers in [None, Some(Outliers { channels: 4, gain: 30.0 })] {
        let ckpt = dir.path().join("ckpt");
        let spec = CheckpointSpec { shape: Shape::tiny(), weights: WeightType::F32, shard_bytes: u64::MAX, seed: 5, init_std: 0.05, outliers };
        write(&spec, &ckpt).unwrap();
        let f32_lad = dir.path().join("f32.lad");
        common::compile(&ckpt, &f32_lad, Some(128));
        let reference = Model::open(&f32_lad, true).unwrap();
        let same = compare(&mut Session::new(&reference).unwrap(), &mut Session::new(&reference).unwrap(), &prompt, &p).unwrap();
        assert_eq!((same.logit_relative_error, same.logit_max_error, same.top1_agreement, same.token_agreement), (0.0, 0.0, 1.0, 1.0));
        let mut errors = Vec::new();
        for quant in [lladac::Quant::Q8, lladac::Quant::Q4 { group: 32 }] {
            let lad = dir.path().join("quantised.lad");
            common::compile_quant(&ckpt, &lad, Some(quant), 128, None);
            let c = compare(&mut Session::new(&reference).unwrap(), &mut Session::new(&Model::open(&lad, true).unwrap()).unwrap(), &prompt, &p).unwrap();
            assert!(c.logit_relative_error > 0.0 && c.logit_relative_error < 1.0 && c.logit_max_error > 0.0, "{quant:?} {c:?}");
            assert!((0.0..=1.0).contains(&c.top1_agreement) && (0.0..=1.0).contains(&c.token_agreement), "{c:?}");
            errors.push(c.logit_relative_error);
        }
        assert!(errors[0] < errors[1], "q8 against q4: {errors:?}");
    }
}
