//! GGUF import: llama.cpp's converter's files of the conformance checkpoints
//! (`tests/data/gguf/`, made by `tools/gguf/make_fixtures.py`) compile to the artifacts their
//! Hugging Face folders compile to, weight for weight, with a tokenizer that encodes and
//! decodes the same; broken GGUF files get one clear error each.

mod common;

use std::path::{Path, PathBuf};

use llada_rt::text::Text;
use llada_rt::Model;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/data/gguf").join(name)
}

/// (GGUF, the Hugging Face folder it was converted from, a golden file whose prompts to encode).
/// LLaDA-MoE's folder is written into `dir`: `gen-checkpoint --preset tiny-moe --dtype f32
/// --init-std 0.08 --seed 11`, as `tools/gguf/make_fixtures.py` converted it.
fn pairs(dir: &Path) -> Vec<(PathBuf, PathBuf, Option<PathBuf>)> {
    let shared = repo().join("../shared/conformance");
    let dream = repo().join("tests/data/dream-conformance");
    let moe = dir.join("tiny-llada-moe");
    common::checkpoint(&moe, llada_tools::checkpoint::Shape::tiny_moe(), llada_tools::checkpoint::WeightType::F32, u64::MAX, 0.08);
    vec![
        (fixture("tiny-llada-moe.f32.gguf"), moe, None),
        (fixture("tiny-llada-A.f32.gguf"), shared.join("tiny-llada-A"), Some(shared.join("tiny-llada-A/golden.json"))),
        (fixture("tiny-llada-B.f32.gguf"), shared.join("tiny-llada-B"), Some(shared.join("tiny-llada-B/golden.json"))),
        (fixture("tiny-dream-A.f32.gguf"), dream.join("tiny-dream-A"), Some(dream.join("tiny-dream-A/golden.json"))),
        (fixture("dream-tiny-tasks.f32.gguf"), repo().join("models/dream-tiny-tasks"), Some(dream.join("tiny-dream-tasks/golden.json"))),
        (fixture("llada-tiny-tasks.f32.gguf"), repo().join("models/llada-tiny-tasks"), None),
    ]
}

/// Every prompt text the check encodes: a golden file's, and the held-out tasks'.
fn prompts(golden: Option<&Path>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(g) = golden {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(g).unwrap()).unwrap();
        out.extend(v["cases"].as_array().unwrap().iter().filter_map(|c| c["prompt_text"].as_str().map(str::to_string)));
    }
    for line in std::fs::read_to_string(repo().join("models/tasks/heldout.jsonl")).unwrap().lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        out.push(v["prompt"].as_str().unwrap().to_string());
    }
    out
}

#[test]
fn f32_ggufs_compile_to_the_hugging_face_folders_weights_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    for (gguf, hf, golden) in pairs(dir.path()) {
        let (a, b) = (dir.path().join("gguf.lad"), dir.path().join("hf.lad"));
        common::compile(&gguf, &a, Some(128));
        common::compile(&hf, &b, Some(128));
        let (m, r) = (Model::open(&a, true).unwrap(), Model::open(&b, true).unwrap());
        let what = gguf.display();
        assert_eq!(m.header.tensors.len(), r.header.tensors.len(), "{what}: tensors");
        for (id, (x, y)) in m.header.tensors.iter().zip(&r.header.tensors).enumerate() {
            assert_eq!((&x.name, &x.dtype, &x.shape), (&y.name, &y.dtype, &y.shape), "{what}");
            assert!(m.tensor_bytes(id as u32) == r.tensor_bytes(id as u32), "{what}: tensor {} differs", x.name);
        }
        // BOS aside: llama.cpp's converter takes tokenizer_config's bos_token, the Hugging Face
        // importer config.json's bos_token_id, and Dream's two disagree (its plain encoding
        // adds no BOS, and its chat template names none).
        let (x, y) = (&m.header.special, &r.header.special);
        assert_eq!((x.mask, x.eos, x.eot), (y.mask, y.eos, y.eot), "{what}: special tokens");
        if !what.to_string().contains("dream") {
            assert_eq!(x.bos, y.bos, "{what}: bos");
        }
        assert_eq!(m.header.tokenizer.chat_template, r.header.tokenizer.chat_template, "{what}");
        let (t, u) = (Text::new(&m.header.tokenizer, &m.header.special).unwrap(), Text::new(&r.header.tokenizer, &r.header.special).unwrap());
        let texts = prompts(golden.as_deref());
        assert!(texts.len() >= 200, "{what}: {} prompts", texts.len());
        for p in &texts {
            assert_eq!(t.encode_chat(p).unwrap(), u.encode_chat(p).unwrap(), "{what}: chat {p:?}");
            // LLaDA's converter sets add_bos_token whatever the tokenizer said (llada.py): the
            // plain encoding then starts with BOS (unless the text's own first token is BOS),
            // and is otherwise the same.
            let (mut x, y) = (t.encode(p).unwrap(), u.encode(p).unwrap());
            let bos_added = y.first().copied() != m.header.special.bos;
            if m.header.tokenizer.add_bos_token && !r.header.tokenizer.add_bos_token && bos_added {
                assert_eq!(x.first().copied(), m.header.special.bos, "{what}");
                x.remove(0);
            }
            assert_eq!(x, y, "{what}: {p:?}");
        }
        let ids: Vec<u32> = (0..m.header.model.embedding_size).filter(|&i| u.check_ids(&[i]).is_ok()).collect();
        assert!(ids.iter().all(|&i| t.check_ids(&[i]).is_ok()), "{what}: ids");
        for &i in &ids {
            assert_eq!(t.decode(&[i], false), u.decode(&[i], false), "{what}: id {i}");
        }
    }
}

/// The same file in three parts, as `gguf-split`/the converter's `--split-max-tensors` write
/// it: any part names the whole, and a missing part is named.
#[test]
fn a_split_gguf_compiles_from_its_first_part_and_a_missing_part_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("split.lad"), dir.path().join("whole.lad"));
    let first = fixture("split/tiny-llada-A-00001-of-00003.gguf");
    common::compile(&first, &a, Some(128));
    common::compile(&fixture("tiny-llada-A.f32.gguf"), &b, Some(128));
    let (m, r) = (Model::open(&a, true).unwrap(), Model::open(&b, true).unwrap());
    for id in 0..m.header.tensors.len() {
        assert!(m.tensor_bytes(id as u32) == r.tensor_bytes(id as u32), "tensor {} differs", m.header.tensors[id].name);
    }
    let copy = dir.path().join("part");
    std::fs::create_dir(&copy).unwrap();
    for i in [1, 3] {
        let name = format!("tiny-llada-A-{i:05}-of-00003.gguf");
        std::fs::copy(fixture("split").join(&name), copy.join(&name)).unwrap();
    }
    common::compile_refused(&copy.join("tiny-llada-A-00001-of-00003.gguf"), &["tiny-llada-A-00002-of-00003.gguf"]);
    // Parts 2 and 3 under each other's names.
    std::fs::copy(fixture("split/tiny-llada-A-00003-of-00003.gguf"), copy.join("tiny-llada-A-00002-of-00003.gguf")).unwrap();
    std::fs::copy(fixture("split/tiny-llada-A-00002-of-00003.gguf"), copy.join("tiny-llada-A-00003-of-00003.gguf")).unwrap();
    common::compile_refused(&copy.join("tiny-llada-A-00001-of-00003.gguf"), &["tiny-llada-A-00002-of-00003.gguf", "the file name says part 2 of 3, but its split.no and split.count say part 3 of 3"]);
}

/// A GGUF broken in one place: one error naming the file and the key, tensor or header part.
#[test]
fn broken_ggufs_are_refused_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(fixture("tiny-llada-A.f32.gguf")).unwrap();
    let find = |needle: &[u8]| good.windows(needle.len()).position(|w| w == needle).unwrap();
    let cases: Vec<(&str, Vec<u8>, Vec<&str>)> = vec![
        ("magic", { let mut f = good.clone(); f[0] = b'X'; f }, vec!["header", "not a GGUF file"]),
        ("version", { let mut f = good.clone(); f[4..8].copy_from_slice(&3u32.to_be_bytes()); f }, vec!["header", "big-endian"]),
        ("header", good[..5000].to_vec(), vec!["truncated"]),
        // (token_embd.weight is the fixture's last tensor in the data.)
        ("data", good[..good.len() - 100].to_vec(), vec!["token_embd.weight", "truncated"]),
        ("arch", { let mut f = good.clone(); let at = find(b"llada"); f[at..at + 5].copy_from_slice(b"llama"); f }, vec!["general.architecture", "\"llama\"", "llada-moe"]),
        ("pre", { let mut f = good.clone(); let at = find(b"gpt-2"); f[at..at + 5].copy_from_slice(b"gpt-9"); f }, vec!["tokenizer.ggml.pre", "gpt-9"]),
        ("type", { let mut f = good.clone(); let at = find(b"blk.0.attn_norm.weight") + 22 + 4 + 8; f[at..at + 4].copy_from_slice(&99u32.to_le_bytes()); f }, vec!["blk.0.attn_norm.weight", "ggml type 99"]),
        ("unread type", { let mut f = good.clone(); let at = find(b"blk.0.attn_norm.weight") + 22 + 4 + 8; f[at..at + 4].copy_from_slice(&24u32.to_le_bytes()); f }, vec!["blk.0.attn_norm.weight", "I8 is not read"]),
        // A block count past the tensors is refused before anything is sized by it.
        ("blocks", { let mut f = good.clone(); let at = find(b"llada.block_count") + 17 + 4; f[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes()); f }, vec!["llada.block_count", "4294967295 blocks, but the file holds the tensors of 4 (blk.0 to blk.3)"]),
        ("block count type", { let mut f = good.clone(); let at = find(b"llada.block_count") + 17; f[at..at + 4].copy_from_slice(&6u32.to_le_bytes()); f }, vec!["llada.block_count", "found f32"]),
    ];
    for (what, bytes, needles) in cases {
        let path = dir.path().join(format!("{}.gguf", what.replace(' ', "-")));
        std::fs::write(&path, &bytes).unwrap();
        let mut needles = needles;
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        needles.push(&name);
        common::compile_refused(&path, &needles);
        std::fs::remove_file(&path).unwrap();
    }
}

/// `--quant q4` without `--group` on a Q4_0 file keeps its groups of 32 (the blocks carried as
/// they are); a typed `--group` is the user's.
#[test]
fn a_q4_0_files_groups_are_the_default_for_q4() {
    let dir = tempfile::tempdir().unwrap();
    let (q4_0, out) = (fixture("llada-tiny-tasks.q4_0.gguf"), dir.path().join("q4.lad"));
    for (group, want) in [(None, "q4 (group 32)"), (Some("64"), "q4 (group 64)")] {
        let mut args = vec!["compile", "--model", q4_0.to_str().unwrap(), "--quant", "q4", "-o", out.to_str().unwrap()];
        if let Some(g) = group {
            args.extend(["--group", g]);
        }
        let run = common::run("lladac", &args);
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
        let said = String::from_utf8_lossy(&run.stderr).to_string();
        assert!(said.contains(want), "{group:?}: {said}");
    }
}

/// Held-out accuracy (0 to 1) of an artifact: `llada-rt eval --json` over the 200 tasks, each
/// answer's 64 tokens generated in 64 steps (the README's setting; half the default's cost).
fn heldout_accuracy(artifact: &Path) -> f64 {
    let tasks = repo().join("models/tasks/heldout.jsonl");
    let run = common::run("llada-rt", &["eval", artifact.to_str().unwrap(), "--tasks", tasks.to_str().unwrap(), "--gen-len", "64", "--steps", "64", "--json"]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    v["accuracy"].as_f64().unwrap()
}

/// A real K-quant file: llama-quantize's Q4_K_M of the 256-wide trained model
/// (`tools/gguf/make_kquant.sh`; at that width every matrix takes K blocks, Q4_K and Q6_K). It
/// compiles with the documented re-quantization (decoded exactly, stored q8 by default; the
/// compile says so) and answers the held-out tasks within one point of our own q8 compile of
/// the Hugging Face folder it was made from.
#[test]
fn a_q4_k_m_file_answers_within_one_point_of_our_own_compile() {
    let dir = tempfile::tempdir().unwrap();
    let (kquant, ours) = (dir.path().join("q4_k_m.lad"), dir.path().join("q8.lad"));
    let file = fixture("llada-w256-tasks.q4_k_m.gguf");
    let run = common::run("lladac", &["compile", "--model", file.to_str().unwrap(), "-o", kquant.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let run = common::run("lladac", &["inspect", kquant.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&run.stdout).to_string();
    for needle in ["llada-w256-tasks.q4_k_m.gguf", "Q4_K x13", "Q6_K x3", "Q4_K decoded exactly, re-quantized", "stored as q8"] {
        assert!(said.contains(needle), "{needle:?} not in: {said}");
    }
    common::compile_quant(&repo().join("models/llada-w256-tasks"), &ours, Some(lladac::Quant::Q8), 512, None);
    let (k, q) = (heldout_accuracy(&kquant), heldout_accuracy(&ours));
    assert!((k - q).abs() <= 0.01, "Q4_K_M {k} against our q8 {q}");
}
