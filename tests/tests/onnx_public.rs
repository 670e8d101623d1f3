//! ONNX exports a user makes: the conformance checkpoints exported by the public LLaDA
//! modeling code (`modeling_llada.py`) with PyTorch's dynamo and TorchScript exporters, in
//! every style `tests/data/onnx-public/` holds (opsets 17 to 23, static and dynamic shapes,
//! inline and external data, float32, bfloat16 and float16; written by
//! `tools/onnx/export_public_all.sh`, versions in its `exports.json`).
//!
//! Without the conformance kit: every float32 export of a checkpoint compiles to the same
//! tensors, and every bfloat16 or float16 one to those tensors rounded to its type. With the kit
//! (`$LLADA_SHARED` or `../shared`, as CI has it): each compiles to the tensors of the
//! checkpoint itself (a bfloat16 or float16 copy of it for those exports), float32 exports
//! replay the official sampler's golden outputs in full, and the narrower ones give the tokens
//! of the narrower checkpoint compiled directly.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::{generate, Model, SamplerParams, Session};
use llada_rt_tools::conformance;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn exports() -> Vec<(String, PathBuf)> {
    let dir = repo().join("tests/data/onnx-public");
    let mut v: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    v.sort();
    assert!(v.len() >= 12, "the kept exports are missing from {}", dir.display());
    v
}

/// The element type an export's name says it has.
fn dtype_of(name: &str) -> &'static str {
    if name.contains("bf16") {
        "bf16"
    } else if name.contains("f16") {
        "f16"
    } else {
        "f32"
    }
}

fn kit() -> Option<PathBuf> {
    let shared = std::env::var_os("LLADA_SHARED").map(PathBuf::from).unwrap_or_else(|| repo().join("../shared"));
    let kit = shared.join("conformance");
    kit.join("tiny-llada-A/model.safetensors").exists().then_some(kit)
}

fn tensors(path: &Path) -> Vec<(String, String, Vec<u8>)> {
    let m = Model::open(path, true).unwrap();
    (0..m.header.tensors.len()).map(|id| (m.header.tensors[id].name.clone(), format!("{:?}", m.header.tensors[id].dtype), m.tensor_bytes(id as u32).to_vec())).collect()
}

/// f32 little-endian bytes rounded to bf16 or f16 (to nearest even, as PyTorch's `.to()`).
fn narrowed(bytes: &[u8], dtype: &str) -> Vec<u8> {
    bytes
        .chunks_exact(4)
        .flat_map(|c| {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            match dtype {
                "bf16" => half::bf16::from_f32(x).to_le_bytes(),
                _ => half::f16::from_f32(x).to_le_bytes(),
            }
        })
        .collect()
}

fn widened(bytes: &[u8], dtype: &str) -> Vec<u8> {
    let wide = |c: &[u8]| match dtype {
        "bf16" => half::bf16::from_le_bytes([c[0], c[1]]).to_f32(),
        _ => half::f16::from_le_bytes([c[0], c[1]]).to_f32(),
    };
    bytes.chunks_exact(2).flat_map(|c| wide(c).to_le_bytes()).collect()
}

/// A copy of checkpoint `src` with its weights rounded to `dtype`, as `model.to(dtype)` saves it.
fn narrow_checkpoint(src: &Path, dst: &Path, dtype: &str) {
    std::fs::create_dir_all(dst).unwrap();
    for f in std::fs::read_dir(src).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|e| e == "json") {
            std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let to = if dtype == "bf16" { safetensors::Dtype::BF16 } else { safetensors::Dtype::F16 };
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = st.tensors().into_iter().map(|(n, v)| (n, v.shape().to_vec(), narrowed(v.data(), dtype))).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data.iter().map(|(n, s, d)| (n.clone(), safetensors::tensor::TensorView::new(to, s.clone(), d).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

#[test]
fn every_export_style_compiles_to_the_checkpoints_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let all = exports();
    for ck in ['A', 'B'] {
        let of_ck: Vec<&(String, PathBuf)> = all.iter().filter(|(n, _)| n.starts_with(ck)).collect();
        let (f32_name, f32_path) = of_ck.iter().find(|(n, _)| dtype_of(n) == "f32").expect("an f32 export of each checkpoint");
        // What each element type's artifact must hold: the f32 export's weights, rounded by
        // lladac to that type (to nearest even, as PyTorch's `.to()` rounds).
        let reference = |dtype: &str| {
            let out = dir.path().join(format!("{ck}-reference-{dtype}.lad"));
            let quant = match dtype {
                "bf16" => lladac::Quant::Bf16,
                "f16" => lladac::Quant::F16,
                _ => lladac::Quant::F32,
            };
            common::compile_quant(f32_path, &out, Some(quant), 128, None);
            tensors(&out)
        };
        let references: std::collections::HashMap<&str, _> = ["f32", "bf16", "f16"].into_iter().map(|d| (d, reference(d))).collect();
        for (name, path) in of_ck {
            let out = dir.path().join(format!("{name}.lad"));
            // The directory itself: one .onnx file beside the config, as Optimum lays it out.
            common::compile_quant(path, &out, None, 128, None);
            let (got, want) = (tensors(&out), &references[dtype_of(name)]);
            assert_eq!(got.len(), want.len(), "{name}: tensor count");
            for (((n, t, b), (wn, wt, wb)), (_, _, full)) in got.iter().zip(want).zip(&references["f32"]) {
                assert_eq!((n, t), (wn, wt), "{name}");
                // Norm weights stay float32 in the artifact: a narrow export's are its narrow
                // values widened back. (Tables lladac computes, such as rope.*, are the same.)
                let rounded;
                let wb = match (dtype_of(name), t.as_str()) {
                    ("bf16" | "f16", "F32") if n.starts_with("model.") => {
                        rounded = widened(&narrowed(full, dtype_of(name)), dtype_of(name));
                        &rounded
                    }
                    _ => wb,
                };
                assert!(b == wb, "{name}'s {n} is not {f32_name}'s in {}", dtype_of(name));
            }
        }
    }
}

#[test]
fn exports_replay_the_official_goldens_and_narrow_ones_give_the_narrow_checkpoints_tokens() {
    let Some(kit) = kit() else {
        eprintln!("conformance kit not found (set LLADA_SHARED): golden replay of the ONNX exports not run");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (name, path) in exports() {
        let ck = if name.starts_with('A') { "tiny-llada-A" } else { "tiny-llada-B" };
        let dtype = dtype_of(&name);
        let checkpoint = match dtype {
            "f32" => kit.join(ck),
            narrow => {
                let d = dir.path().join(format!("{ck}-{narrow}"));
                if !d.exists() {
                    narrow_checkpoint(&kit.join(ck), &d, narrow);
                }
                d
            }
        };
        let direct = dir.path().join(format!("{ck}-{dtype}.lad"));
        if !direct.exists() {
            common::compile(&checkpoint, &direct, None);
        }
        let out = dir.path().join(format!("{name}.lad"));
        common::compile(&path.join("model.onnx"), &out, None);
        assert!(tensors(&out) == tensors(&direct), "{name}: tensors differ from {}", checkpoint.display());

        let golden = kit.join(ck).join("golden.json");
        let (export, reference) = (Model::open(&out, true).unwrap(), Model::open(&direct, true).unwrap());
        if dtype == "f32" {
            let r = conformance::run(&mut Session::new(&export).unwrap(), &golden, conformance::Selection::new(1, 0).unwrap(), &mut |_| {}).unwrap();
            assert!(r.passed(), "{name}: {:?}", r.failures);
            assert_eq!((r.output_ids_matched, r.reveals_before_tie_matched), (r.cases, r.cases), "{name}");
        } else {
            // The golden prompts through both artifacts: the same tokens and reveals.
            let cases: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
            for c in cases["cases"].as_array().unwrap().iter().step_by(15) {
                let prompt: Vec<u32> = c["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
                let p = SamplerParams { gen_length: c["gen_length"].as_u64().unwrap() as usize, block_length: c["block_length"].as_u64().unwrap() as usize, steps: c["steps"].as_u64().unwrap() as usize, ..Default::default() };
                let a = generate(&mut Session::new(&export).unwrap(), &prompt, &p, &mut |_| {}).unwrap();
                let b = generate(&mut Session::new(&reference).unwrap(), &prompt, &p, &mut |_| {}).unwrap();
                assert_eq!((&a.output_ids, &a.reveals), (&b.output_ids, &b.reveals), "{name}: case {}", c["id"]);
            }
        }
    }
}

/// A copy of export `name` whose config.json has `edit` applied to its text.
fn with_config(dir: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let src = repo().join("tests/data/onnx-public").join(name);
    let dst = dir.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for f in std::fs::read_dir(&src).unwrap() {
        let p = f.unwrap().path();
        std::fs::copy(&p, dst.join(p.file_name().unwrap())).unwrap();
    }
    let cfg = dst.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&cfg, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    dst.join("model.onnx")
}

/// A config that disagrees with what the graph fixes is refused naming the key and both
/// values, for the decomposed ops of opset 18 and the fused ones of opset 23 alike.
#[test]
fn a_config_that_disagrees_with_the_graph_is_refused_naming_the_key_and_both_values() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, serde_json::Value, &[&str])] = &[
        ("rope_theta", 10000.0.into(), &["config.json says rope_theta 10000", "rope_theta 500000"]),
        ("rms_norm_eps", 1e-6.into(), &["config.json says rms_norm_eps 1e-6", "epsilon 1e-5"]),
        ("n_heads", 8.into(), &["config.json says n_heads 8", "4 heads of 32"]),
        ("d_model", 256.into(), &["config.json says d_model 256", "d_model 128"]),
        ("n_kv_heads", 2.into(), &["config.json says n_kv_heads 2", "the k projection) gives 128 features, 4 heads"]),
        ("mlp_hidden_size", 512.into(), &["config.json says mlp_hidden_size 512", "384 wide"]),
        ("n_layers", 3.into(), &["config.json says n_layers 3", "4 LLaDA blocks"]),
    ];
    for export in ["A-dynamo-opset18-dynamic", "A-dynamo-opset23-static", "A-torchscript-opset17-bf16"] {
        for (key, value, want) in cases {
            let path = with_config(dir.path(), export, |c| c[*key] = value.clone());
            let needles: Vec<&str> = want.iter().copied().chain(["model.onnx"]).collect();
            common::compile_refused(&path, &needles);
        }
    }
    // The vocabulary: embedding_size where the config separates it from vocab_size.
    let path = with_config(dir.path(), "A-dynamo-default-static", |c| {
        c["vocab_size"] = 400.into();
        c["embedding_size"] = 400.into();
    });
    common::compile_refused(&path, &["config.json says vocab_size 400", "320 rows"]);
}

/// A copy of export `name` with its graph rewritten by `edit`, as a user's tool would.
fn with_graph(dir: &Path, name: &str, edit: impl FnOnce(&mut onnx_ir::ModelProto)) -> PathBuf {
    use onnx_ir::Message;
    let path = with_config(dir, name, |_| {});
    let mut model = onnx_ir::ModelProto::parse_from_bytes(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut model);
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path
}

fn set_raw(model: &mut onnx_ir::ModelProto, initializer: &str, bytes: Vec<u8>) {
    let t = model.graph.as_mut().unwrap().initializer.iter_mut().find(|t| t.name == initializer).unwrap();
    t.raw_data = bytes.into();
}

/// Adds an initializer of ONNX element type `elem` (7: int64) and shape `dims`.
fn add_initializer(model: &mut onnx_ir::ModelProto, name: &str, elem: i32, dims: &[i64], bytes: Vec<u8>) {
    let mut t = onnx_ir::TensorProto::new();
    t.name = name.into();
    t.data_type = elem;
    t.dims = dims.to_vec();
    t.raw_data = bytes.into();
    model.graph.as_mut().unwrap().initializer.push(t);
}

fn rewire(model: &mut onnx_ir::ModelProto, node: &str, input: usize, to: &str) {
    let n = model.graph.as_mut().unwrap().node.iter_mut().find(|n| n.name == node).unwrap();
    n.input[input] = to.into();
}

/// Graphs that are not LLaDA's are refused, not compiled into something else: a wrong
/// attention scale, a mean over the wrong axis, a cube for a square, GLU for SwiGLU.
#[test]
fn a_graph_that_computes_something_else_than_llada_is_refused_naming_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let export = "A-dynamo-opset18-dynamic";
    let sub = |name: &str| dir.path().join(name);
    let cases: Vec<(&str, Box<dyn FnOnce(&mut onnx_ir::ModelProto)>, &[&str])> = vec![
        ("scale", Box::new(|m| set_raw(m, "val_119", 0.5f32.to_le_bytes().to_vec())), &["attention scores scaled by 0.25", "needs 1/sqrt(32) = 0.176777"]),
        ("mean-axis", Box::new(|m| {
            add_initializer(m, "axis_1", 7, &[1], 1i64.to_le_bytes().to_vec());
            rewire(m, "node_mean", 1, "axis_1")
        }), &["node 'node_mean' (ReduceMean)", "a mean over other axes than the last"]),
        ("cube", Box::new(|m| set_raw(m, "val_2", 3f32.to_le_bytes().to_vec())), &["node 'node_pow_1' (Pow)", "a power other than the square"]),
        ("glu", Box::new(|m| rewire(m, "node_mul_8", 0, "val_138")), &["node 'node_mul_8' (Mul)", "GLU", "silu(gate) * up"]),
        ("values-before-softmax", Box::new(|m| rewire(m, "node_scaled_dot_product_attention", 0, "val_124")), &["node 'node_scaled_dot_product_attention' (MatMul)", "before their softmax"]),
    ];
    for (what, edit, needles) in cases {
        std::fs::create_dir_all(sub(what)).unwrap();
        let path = with_graph(&sub(what), export, edit);
        let needles: Vec<&str> = needles.iter().copied().chain(["model.onnx"]).collect();
        common::compile_refused(&path, &needles);
    }
}
