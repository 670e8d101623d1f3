//! Trains a small LLaDA with the masked-diffusion objective of LLaDA's supervised fine-tuning:
//! the prompt stays clean; each answer token is masked with probability `t ~ U(0, 1)` (per
//! sequence); the loss is the cross-entropy of the masked tokens weighted by `1 / t`, averaged
//! over the answer length. Data, masks and initialisation come from seeded streams, and the
//! burn CPU backend runs on one thread, so a run is reproducible from its seed.

use std::path::Path;
use std::time::Instant;

use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{activation, Device, Int, Tensor, TensorData};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{self, CheckpointSpec, Shape, SpecialIds, WeightType};
use crate::reference::{Hyper, Llada};
use crate::tasks::{self, Kind, ANSWER_LEN};

#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub shape: Shape,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Peak learning rate (after linear warm-up, then cosine decay to a tenth).
    pub lr: f64,
    pub warmup: usize,
    pub weight_decay: f32,
    pub seed: u64,
    /// Answer region lengths to train on: the answer, then end-of-turn and end-of-text padding.
    pub response_lengths: Vec<usize>,
    /// Write the checkpoint every this many steps (and at the end).
    pub save_every: usize,
    /// Stop early after this many minutes (the checkpoint is written either way).
    pub max_minutes: Option<f64>,
    /// Task kinds, taken in turn, one kind per batch (sequences of a batch share a length).
    pub kinds: Vec<Kind>,
}

impl TrainConfig {
    /// The embedded default model's recipe.
    pub fn embedded() -> TrainConfig {
        TrainConfig {
            shape: Shape::embedded(),
            steps: 2400,
            batch: 16,
            lr: 2e-3,
            warmup: 100,
            weight_decay: 0.01,
            seed: 0,
            response_lengths: vec![64, 96],
            save_every: 400,
            max_minutes: None,
            kinds: vec![Kind::Fill, Kind::Shift],
        }
    }
}

/// One training batch: token ids, the masked input, and per-position loss weights.
struct Batch {
    len: usize,
    input: Vec<i64>,
    target: Vec<i64>,
    /// `1 / t` on masked answer positions divided by the answer length, 0 elsewhere.
    weight: Vec<f32>,
}

pub struct Trainer {
    tokenizer: tokenizers::Tokenizer,
    special: SpecialIds,
    rng: ChaCha8Rng,
}

impl Trainer {
    pub fn new(shape: &Shape, seed: u64) -> Trainer {
        let special = SpecialIds::for_shape(shape);
        let tokenizer = checkpoint::tokenizer_json(special).to_string().parse().expect("the generated tokenizer loads");
        Trainer { tokenizer, special, rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7a5c) }
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(text, false).expect("task text encodes").get_ids().to_vec()
    }

    /// Prompt ids and the answer region (answer, end-of-turn, end-of-text padding).
    pub fn example(&self, task: &tasks::Task, response_len: usize) -> (Vec<u32>, Vec<u32>) {
        let prompt = self.encode(&tasks::chat_prompt(&task.content));
        let mut response = self.encode(&task.answer);
        assert_eq!(response.len(), ANSWER_LEN, "one token per answer character");
        if response_len > ANSWER_LEN {
            response.push(self.special.eot);
            response.resize(response_len, self.special.eos);
        }
        (prompt, response)
    }

    fn batch(&mut self, kind: Kind, size: usize, response_len: usize) -> Batch {
        let mut b = Batch { len: 0, input: Vec::new(), target: Vec::new(), weight: Vec::new() };
        for _ in 0..size {
            let task = tasks::sample(kind, &mut self.rng);
            let (prompt, response) = self.example(&task, response_len);
            b.len = prompt.len() + response.len();
            let t: f32 = self.rng.random();
            let p = (1.0 - 1e-3) * t + 1e-3;
            for &id in &prompt {
                b.input.push(id as i64);
                b.target.push(id as i64);
                b.weight.push(0.0);
            }
            for &id in &response {
                let masked = self.rng.random::<f32>() < p;
                b.input.push(if masked { self.special.mask } else { id } as i64);
                b.target.push(id as i64);
                b.weight.push(if masked { 1.0 / (p * response.len() as f32) } else { 0.0 });
            }
        }
        b
    }
}

fn learning_rate(cfg: &TrainConfig, step: usize) -> f64 {
    if step < cfg.warmup {
        return cfg.lr * (step + 1) as f64 / cfg.warmup as f64;
    }
    let progress = (step - cfg.warmup) as f64 / (cfg.steps - cfg.warmup).max(1) as f64;
    cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()))
}

/// The model's tensors under their Hugging Face names.
pub fn named_tensors(model: &Llada) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    fn t2(name: String, p: &burn::module::Param<Tensor<2>>) -> (String, Vec<usize>, Vec<f32>) {
        let v = p.val();
        (name, v.dims().to_vec(), v.into_data().try_to_vec().expect("f32 weights"))
    }
    fn t1(name: String, p: &burn::module::Param<Tensor<1>>) -> (String, Vec<usize>, Vec<f32>) {
        let v = p.val();
        (name, v.dims().to_vec(), v.into_data().try_to_vec().expect("f32 weights"))
    }
    let mut out = vec![t2("model.transformer.wte.weight".into(), &model.wte)];
    for (l, b) in model.blocks.iter().enumerate() {
        let n = |p: &str| format!("model.transformer.blocks.{l}.{p}.weight");
        out.push(t1(n("attn_norm"), &b.attn_norm));
        out.push(t2(n("q_proj"), &b.q_proj));
        out.push(t2(n("k_proj"), &b.k_proj));
        out.push(t2(n("v_proj"), &b.v_proj));
        out.push(t2(n("attn_out"), &b.attn_out));
        out.push(t1(n("ff_norm"), &b.ff_norm));
        out.push(t2(n("ff_proj"), &b.ff_proj));
        out.push(t2(n("up_proj"), &b.up_proj));
        out.push(t2(n("ff_out"), &b.ff_out));
    }
    out.push(t1("model.transformer.ln_f.weight".into(), &model.ln_f));
    out.push(t2("model.transformer.ff_out.weight".into(), &model.lm_head));
    out
}

/// Trains and writes the checkpoint to `out` (f32 safetensors and metadata); `log` gets a
/// line every 50 steps.
pub fn train(cfg: &TrainConfig, out: &Path, log: &mut dyn FnMut(&str)) -> std::io::Result<()> {
    let device = Device::autodiff(Device::default());
    let hyper = Hyper::of(&cfg.shape);
    let mut model = Llada::init(&cfg.shape, 0.02, cfg.seed, &device);
    let mut optim = AdamWConfig::new().with_weight_decay(cfg.weight_decay).init();
    let mut trainer = Trainer::new(&cfg.shape, cfg.seed);
    let spec = CheckpointSpec { shape: cfg.shape.clone(), weights: WeightType::F32, shard_bytes: u64::MAX, seed: cfg.seed, init_std: 0.02, outliers: None };
    let start = Instant::now();
    let mut loss_sum = 0.0f64;
    // Masked-token accuracy per kind over the last logging interval.
    let mut seen = vec![(0usize, 0usize); cfg.kinds.len()];
    for step in 0..cfg.steps {
        let kind_index = step % cfg.kinds.len();
        let kind = cfg.kinds[kind_index];
        let response_len = cfg.response_lengths[trainer.rng.random_range(0..cfg.response_lengths.len())];
        let b = trainer.batch(kind, cfg.batch, response_len);
        let shape = [cfg.batch, b.len];
        let input = Tensor::<2, Int>::from_data(TensorData::new(b.input.clone(), shape), &device);
        let target = Tensor::<2, Int>::from_data(TensorData::new(b.target.clone(), shape), &device);
        let weight = Tensor::<2>::from_data(TensorData::new(b.weight.clone(), shape), &device);
        let logits = model.forward(input, hyper);
        let logp = activation::log_softmax(logits.clone(), 2).gather(2, target.unsqueeze_dim::<3>(2)).squeeze_dim::<2>(2);
        let loss = (logp * weight).sum().neg() / cfg.batch as f64;
        if step % 50 >= 50 - cfg.kinds.len() {
            let pred: Vec<i64> = logits.argmax(2).into_data().try_to_vec().unwrap_or_default();
            for i in 0..pred.len() {
                if b.weight[i] > 0.0 {
                    seen[kind_index].1 += 1;
                    seen[kind_index].0 += usize::from(pred[i] == b.target[i]);
                }
            }
        }
        loss_sum += loss.clone().into_data().try_to_vec::<f32>().map(|v| v[0] as f64).unwrap_or(f64::NAN);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(learning_rate(cfg, step), model, grads);
        let done = cfg.max_minutes.is_some_and(|m| start.elapsed().as_secs_f64() > m * 60.0) || step + 1 == cfg.steps;
        if step % 50 == 49 || done {
            let accuracy: Vec<String> = cfg
                .kinds
                .iter()
                .zip(&seen)
                .map(|(k, (c, n))| format!("{}{:.3}", k.tag(), *c as f64 / (*n).max(1) as f64))
                .collect();
            log(&format!(
                "step {:>5}  loss {:.4}  masked-token accuracy {}  lr {:.2e}  {:.0} s",
                step + 1,
                loss_sum / 50.0,
                accuracy.join(" "),
                learning_rate(cfg, step),
                start.elapsed().as_secs_f64()
            ));
            loss_sum = 0.0;
            seen.iter_mut().for_each(|s| *s = (0, 0));
        }
        if (step + 1) % cfg.save_every == 0 || done {
            checkpoint::write_weights(&spec, out, named_tensors(&model))?;
        }
        if done {
            break;
        }
    }
    Ok(())
}
