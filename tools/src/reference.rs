//! LLaDA in burn: an implementation independent of the runtime's kernels, written from the
//! reference modelling code's definitions (OLMo-style RMSNorm, half-split rotary embedding,
//! bidirectional multi-head attention with grouped key/value heads, SwiGLU). Tests compare
//! the runtime against it; the trainer trains it.

use std::path::Path;

use burn::module::{Module, Param};
use burn::tensor::{activation, Device, Int, Tensor, TensorData};

use crate::checkpoint::Shape;

#[derive(Module, Debug)]
pub struct Block {
    pub attn_norm: Param<Tensor<1>>,
    pub q_proj: Param<Tensor<2>>,
    pub k_proj: Param<Tensor<2>>,
    pub v_proj: Param<Tensor<2>>,
    pub attn_out: Param<Tensor<2>>,
    pub ff_norm: Param<Tensor<1>>,
    pub ff_proj: Param<Tensor<2>>,
    pub up_proj: Param<Tensor<2>>,
    pub ff_out: Param<Tensor<2>>,
}

#[derive(Module, Debug)]
pub struct Llada {
    pub wte: Param<Tensor<2>>,
    pub blocks: Vec<Block>,
    pub ln_f: Param<Tensor<1>>,
    pub lm_head: Param<Tensor<2>>,
}

/// Hyperparameters the forward pass needs.
#[derive(Debug, Clone, Copy)]
pub struct Hyper {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub rope_theta: f64,
    pub rms_eps: f64,
}

impl Hyper {
    pub fn of(shape: &Shape) -> Hyper {
        Hyper { n_heads: shape.n_heads, n_kv_heads: shape.n_kv_heads, rope_theta: shape.rope_theta, rms_eps: 1e-5 }
    }
}

/// `weight * x / sqrt(mean(x^2) + eps)` over the last dimension.
fn rms_norm<const D: usize>(x: Tensor<D>, weight: &Param<Tensor<1>>, eps: f64) -> Tensor<D> {
    let var = x.clone().powf_scalar(2.0).mean_dim(D - 1);
    let normed = x / (var + eps).sqrt();
    let w = weight.val().unsqueeze::<D>();
    normed * w
}

/// `x @ w^T` for a `[B, T, in]` input and an `[out, in]` weight.
fn linear(x: Tensor<3>, w: &Param<Tensor<2>>) -> Tensor<3> {
    x.matmul(w.val().transpose().unsqueeze::<3>())
}

/// Rotary tables `[T, head_dim / 2]` computed in double precision.
pub(crate) fn rope_tables(t: usize, head_dim: usize, theta: f64, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    for p in 0..t {
        for i in 0..half {
            let angle = p as f64 / theta.powf(2.0 * i as f64 / head_dim as f64);
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (
        Tensor::from_data(TensorData::new(cos, [t, half]), device),
        Tensor::from_data(TensorData::new(sin, [t, half]), device),
    )
}

/// Half-split rotation of `[B, H, T, hd]` by `[T, hd/2]` tables.
pub(crate) fn rotate(x: Tensor<4>, cos: &Tensor<2>, sin: &Tensor<2>) -> Tensor<4> {
    let hd = x.dims()[3];
    let half = hd / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.narrow(3, half, half);
    let (c, s) = (cos.clone().unsqueeze::<4>(), sin.clone().unsqueeze::<4>());
    Tensor::cat(vec![x1.clone() * c.clone() - x2.clone() * s.clone(), x2 * c + x1 * s], 3)
}

impl Llada {
    /// Logits `[B, T, embedding_size]` for token ids `[B, T]`.
    pub fn forward(&self, ids: Tensor<2, Int>, h: Hyper) -> Tensor<3> {
        let [b, t] = ids.dims();
        let device = ids.device();
        let d = self.wte.val().dims()[1];
        let hd = d / h.n_heads;
        let mut x = self.wte.val().select(0, ids.reshape([b * t])).reshape([b, t, d]);
        let (cos, sin) = rope_tables(t, hd, h.rope_theta, &device);
        let group = h.n_heads / h.n_kv_heads;
        for blk in &self.blocks {
            let xn = rms_norm(x.clone(), &blk.attn_norm, h.rms_eps);
            let heads = |y: Tensor<3>, n: usize| y.reshape([b, t, n, hd]).swap_dims(1, 2);
            let q = rotate(heads(linear(xn.clone(), &blk.q_proj), h.n_heads), &cos, &sin);
            let k = rotate(heads(linear(xn.clone(), &blk.k_proj), h.n_kv_heads), &cos, &sin);
            let v = heads(linear(xn, &blk.v_proj), h.n_kv_heads);
            // Grouped-query attention: query head i uses key/value head i / group.
            let expand = |y: Tensor<4>| if group == 1 { y } else { y.unsqueeze_dim::<5>(2).repeat_dim(2, group).reshape([b, h.n_heads, t, hd]) };
            let (k, v) = (expand(k), expand(v));
            let scores = q.matmul(k.swap_dims(2, 3)) / (hd as f64).sqrt();
            let att = activation::softmax(scores, 3).matmul(v);
            let att = att.swap_dims(1, 2).reshape([b, t, h.n_heads * hd]);
            x = x + linear(att, &blk.attn_out);
            let fin = rms_norm(x.clone(), &blk.ff_norm, h.rms_eps);
            let hidden = activation::silu(linear(fin.clone(), &blk.ff_proj)) * linear(fin, &blk.up_proj);
            x = x + linear(hidden, &blk.ff_out);
        }
        linear(rms_norm(x, &self.ln_f, h.rms_eps), &self.lm_head)
    }

    /// Loads a Hugging Face LLaDA checkpoint (single file or sharded) as f32.
    pub fn load(dir: &Path, shape: &Shape, device: &Device) -> std::io::Result<Llada> {
        let mut store = load_tensors(dir)?;
        let mut take = |name: &str| -> std::io::Result<(Vec<f32>, Vec<usize>)> {
            store.remove(name).ok_or_else(|| std::io::Error::other(format!("missing tensor {name}")))
        };
        let mut t2 = |name: &str| -> std::io::Result<Param<Tensor<2>>> {
            let (v, s) = take(name)?;
            Ok(Param::from_tensor(Tensor::from_data(TensorData::new(v, [s[0], s[1]]), device)))
        };
        let wte = t2("model.transformer.wte.weight")?;
        let lm_head = t2("model.transformer.ff_out.weight")?;
        let mut blocks = Vec::new();
        for l in 0..shape.n_layers {
            let n = |p: &str| format!("model.transformer.blocks.{l}.{p}.weight");
            blocks.push(Block {
                attn_norm: Param::from_tensor(Tensor::zeros([1], device)),
                q_proj: t2(&n("q_proj"))?,
                k_proj: t2(&n("k_proj"))?,
                v_proj: t2(&n("v_proj"))?,
                attn_out: t2(&n("attn_out"))?,
                ff_norm: Param::from_tensor(Tensor::zeros([1], device)),
                ff_proj: t2(&n("ff_proj"))?,
                up_proj: t2(&n("up_proj"))?,
                ff_out: t2(&n("ff_out"))?,
            });
        }
        let mut t1 = |name: &str| -> std::io::Result<Param<Tensor<1>>> {
            let (v, s) = take(name)?;
            Ok(Param::from_tensor(Tensor::from_data(TensorData::new(v, [s[0]]), device)))
        };
        for (l, blk) in blocks.iter_mut().enumerate() {
            blk.attn_norm = t1(&format!("model.transformer.blocks.{l}.attn_norm.weight"))?;
            blk.ff_norm = t1(&format!("model.transformer.blocks.{l}.ff_norm.weight"))?;
        }
        let ln_f = t1("model.transformer.ln_f.weight")?;
        Ok(Llada { wte, blocks, ln_f, lm_head })
    }
}

impl Llada {
    /// A freshly initialised model: weight matrices normal(0, `std`) from a seeded stream,
    /// norm weights one.
    pub fn init(shape: &Shape, std: f32, seed: u64, device: &Device) -> Llada {
        use rand::SeedableRng;
        use rand_distr::{Distribution, Normal};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let normal = Normal::new(0.0f32, std).expect("positive std");
        let mut matrix = |rows: usize, cols: usize| {
            let v: Vec<f32> = (0..rows * cols).map(|_| normal.sample(&mut rng)).collect();
            Param::from_tensor(Tensor::from_data(TensorData::new(v, [rows, cols]), device))
        };
        let (d, f, hd) = (shape.d_model, shape.mlp_hidden_size, shape.head_dim());
        let ones = |n: usize| Param::from_tensor(Tensor::ones([n], device));
        let wte = matrix(shape.embedding_size, d);
        let blocks = (0..shape.n_layers)
            .map(|_| Block {
                attn_norm: ones(d),
                q_proj: matrix(shape.n_heads * hd, d),
                k_proj: matrix(shape.n_kv_heads * hd, d),
                v_proj: matrix(shape.n_kv_heads * hd, d),
                attn_out: matrix(d, shape.n_heads * hd),
                ff_norm: ones(d),
                ff_proj: matrix(f, d),
                up_proj: matrix(f, d),
                ff_out: matrix(d, f),
            })
            .collect();
        let lm_head = matrix(shape.embedding_size, d);
        Llada { wte, blocks, ln_f: ones(d), lm_head }
    }
}

/// Every tensor of a Hugging Face checkpoint (single file or sharded) as f32, by name.
pub fn load_tensors(dir: &Path) -> std::io::Result<std::collections::HashMap<String, (Vec<f32>, Vec<usize>)>> {
    let mut store = std::collections::HashMap::new();
    let index = dir.join("model.safetensors.index.json");
    let files: Vec<std::path::PathBuf> = if index.exists() {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index)?)?;
        let mut f: Vec<String> = v["weight_map"].as_object().into_iter().flatten().filter_map(|(_, f)| f.as_str().map(String::from)).collect();
        f.sort();
        f.dedup();
        f.into_iter().map(|f| dir.join(f)).collect()
    } else {
        vec![dir.join("model.safetensors")]
    };
    for f in files {
        let bytes = std::fs::read(&f)?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| std::io::Error::other(e.to_string()))?;
        for (name, view) in st.tensors() {
            let vals: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect(),
                safetensors::Dtype::BF16 => view.data().chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
                safetensors::Dtype::F16 => view.data().chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
                other => return Err(std::io::Error::other(format!("{name}: unsupported dtype {other:?}"))),
            };
            store.insert(name, (vals, view.shape().to_vec()));
        }
    }
    Ok(store)
}
