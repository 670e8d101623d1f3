//! ONNX import: PyTorch's exports of the embedded model (`tests/data/onnx/`, written by
//! `tools/onnx/export_llada.py`, one with the weights inline and one with external data)
//! compile to the artifact its Hugging Face directory compiles to, and broken ONNX files get one
//! clear error each.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::sampler::Policy;
use llada_rt::text::Text;
use llada_rt::{generate, Model, SamplerParams, Session};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn export(variant: &str) -> PathBuf {
    repo().join("tests/data/onnx").join(variant).join("model.onnx")
}

const PROMPT: &str = "FILL:3000705000000920000040015000608000070060300000004000000800900010=";

#[test]
fn onnx_exports_give_the_checkpoints_weights_tokens_and_logits_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let reference = Model::open(&common::embedded(dir.path()), true).unwrap();
    let text = Text::new(&reference.header.tokenizer, &reference.header.special).unwrap();
    let prompt = text.encode_chat(PROMPT).unwrap();
    let base = SamplerParams { gen_length: 64, block_length: 32, steps: 64, ..Default::default() };
    let settings = [base.clone(), SamplerParams { policy: Policy::Dual, refresh_every: 4, ..base }];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let seq: Vec<u32> = prompt.iter().copied().chain((0..64).map(|i| (i * 7 % 250) as u32)).collect();
    let heads: Vec<u32> = (0..seq.len() as u32).collect();
    let logits = |m: &Model| bits(Session::new(m).unwrap().forward_full(&seq, &heads).unwrap());
    let want_logits = logits(&reference);
    let want: Vec<_> = settings.iter().map(|p| generate(&mut Session::new(&reference).unwrap(), &prompt, p, &mut |_| {}).unwrap()).collect();
    assert_eq!(text.answer(&want[0].output_ids), "3333775555555922222244415555668888877766333333334444444888999911");

    for variant in ["inline", "external"] {
        let out = dir.path().join(format!("{variant}.lad"));
        common::compile(&export(variant), &out, Some(256));
        let m = Model::open(&out, true).unwrap();
        assert_eq!(m.header.tensors.len(), reference.header.tensors.len(), "{variant}: tensors");
        for (a, b) in m.header.tensors.iter().zip(&reference.header.tensors) {
            assert_eq!((&a.name, &a.dtype, &a.shape), (&b.name, &b.dtype, &b.shape), "{variant}");
        }
        for id in 0..m.header.tensors.len() {
            assert!(m.tensor_bytes(id as u32) == reference.tensor_bytes(id as u32), "{variant}: tensor {} differs", m.header.tensors[id].name);
        }
        assert!(logits(&m) == want_logits, "{variant}: logits differ");
        for (p, w) in settings.iter().zip(&want) {
            let got = generate(&mut Session::new(&m).unwrap(), &prompt, p, &mut |_| {}).unwrap();
            assert_eq!((&got.output_ids, &got.reveals), (&w.output_ids, &w.reveals), "{variant} {:?}", p.policy);
        }
    }
}

/// A copy of the inline export and its config and tokenizer files in `dir`, with the graph
/// rewritten by `edit` (protobuf through onnx-ir's re-export, as a user's tool would).
fn edited(dir: &Path, edit: impl FnOnce(&mut onnx_ir::ModelProto)) -> PathBuf {
    use onnx_ir::Message;
    let src = export("inline");
    for f in std::fs::read_dir(src.parent().unwrap()).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "json") {
            std::fs::copy(&f, dir.join(f.file_name().unwrap())).unwrap();
        }
    }
    let mut model = onnx_ir::ModelProto::parse_from_bytes(&std::fs::read(&src).unwrap()).unwrap();
    edit(&mut model);
    let path = dir.join("model.onnx");
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    path
}

#[test]
fn a_missing_initializer_is_named_with_the_node_that_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut taken = String::new();
    let path = edited(dir.path(), |m| {
        let g = m.graph.as_mut().unwrap();
        // The first block's q projection weight (an anonymous, transposed initializer).
        let reader = g.node.iter().find(|n| n.op_type == "MatMul").unwrap();
        taken = reader.input[1].clone();
        g.initializer.retain(|t| t.name != taken);
    });
    common::compile_refused(&path, &["model.onnx", "node 'node_linear' (MatMul)", &format!("input '{taken}' is missing")]);
}

#[test]
fn an_unsupported_op_is_named_with_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited(dir.path(), |m| {
        let g = m.graph.as_mut().unwrap();
        let n = g.node.iter_mut().find(|n| n.op_type == "Softmax").unwrap();
        n.op_type = "Hardmax".into();
    });
    common::compile_refused(&path, &["model.onnx", "node 'node_softmax' (Hardmax)", "not an op of LLaDA's forward pass"]);

    // An op outside the standard domain (a vendor's fused kernel) is named with its domain.
    let dir = tempfile::tempdir().unwrap();
    let path = edited(dir.path(), |m| {
        let n = m.graph.as_mut().unwrap().node.iter_mut().find(|n| n.op_type == "Softmax").unwrap();
        (n.op_type, n.domain) = ("FusedSoftmax".into(), "com.example".into());
    });
    common::compile_refused(&path, &["node 'node_softmax' (com.example::FusedSoftmax)"]);
}

#[test]
fn a_truncated_onnx_file_or_external_data_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited(dir.path(), |_| {});
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    common::compile_refused(&path, &["model.onnx", "not a valid ONNX model (truncated or not protobuf)"]);

    // External data shorter than the graph says.
    let dir = tempfile::tempdir().unwrap();
    let src = export("external");
    for f in std::fs::read_dir(src.parent().unwrap()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let data = dir.path().join("model.onnx.data");
    let len = std::fs::metadata(&data).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&data).unwrap().set_len(len / 2).unwrap();
    common::compile_refused(&dir.path().join("model.onnx"), &["model.onnx", "model.onnx.data", "exceeds"]);
}

/// What the graph computes must agree with the config beside it.
#[test]
fn a_graph_that_disagrees_with_its_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = edited(dir.path(), |_| {});
    let cfg = dir.path().join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace("\"n_layers\": 4", "\"n_layers\": 3")).unwrap();
    common::compile_refused(&path, &["model.onnx", "4 LLaDA blocks", "n_layers 3"]);

    std::fs::write(&cfg, text.replace("\"rms_norm_eps\": 0.00001", "\"rms_norm_eps\": 0.000001")).unwrap();
    common::compile_refused(&path, &["node 'node_add' (Add)", "RMSNorm epsilon"]);

    std::fs::remove_file(&cfg).unwrap();
    common::compile_refused(&path, &["model.onnx", "no config.json beside it"]);
}
