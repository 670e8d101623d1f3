//! Importer for GGUF files as llama.cpp's converter writes them for LLaDA, LLaDA-MoE and
//! Dream (`lladac compile --model FILE.gguf`): the metadata becomes the config, the
//! `tokenizer.ggml.*` keys the tokenizer, and the tensors, renamed to the Hugging Face names,
//! a checkpoint whose data stays in the mapped file.

pub mod arch;
pub mod container;
pub mod quant;
pub mod tokenizer;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use llada_ir::{SpecialTokens, TokenizerSpec};

use crate::error::{Error, Result};
use crate::hf::checkpoint::{Checkpoint, SourceDType, TensorLocation};
use crate::hf::config::LladaConfig;
use arch::Meta;
use container::{GgufFile, TensorInfo};
use quant::GgmlType;

/// What a GGUF import hands the compile.
pub struct Imported {
    pub cfg: LladaConfig,
    pub ckpt: Checkpoint,
    pub tok_spec: TokenizerSpec,
    pub special: SpecialTokens,
    pub warnings: Vec<String>,
    /// The tensors' ggml types, with how many of the read tensors have each.
    pub types: BTreeMap<&'static str, usize>,
}

/// Whether `path` names a GGUF file: its extension, or its first four bytes.
pub fn is_gguf(path: &Path) -> bool {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
        return true;
    }
    let mut magic = [0u8; 4];
    path.is_file() && std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok() && &magic == b"GGUF"
}

/// Whether the GGUF file `path` stores its embedding as Q4_0 (llama.cpp's Q4_0 files: their
/// matrices are then Q4_0 too, carried into q4 with groups of 32). Unreadable: false (the
/// compile names what is wrong).
pub fn is_q4_0(path: &Path) -> bool {
    GgufFile::open(path).is_ok_and(|f| f.tensors.iter().any(|t| t.name == "token_embd.weight" && t.ty == GgmlType::Q4_0))
}

/// The files of the model `path` names: itself, or, for one part of a split GGUF
/// (`NAME-00002-of-00003.gguf`), every part in order.
fn split_parts(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let Some(stem) = name.strip_suffix(".gguf") else { return vec![path.to_path_buf()] };
    let parts: Vec<&str> = stem.rsplitn(4, '-').collect();
    // [count, "of", index, base]
    match parts.as_slice() {
        [count, "of", index, base] if count.len() == 5 && index.len() == 5 && count.bytes().chain(index.bytes()).all(|b| b.is_ascii_digit()) => {
            let n: usize = count.parse().unwrap_or(0);
            (1..=n).map(|i| path.with_file_name(format!("{base}-{i:05}-of-{count}.gguf"))).collect()
        }
        _ => vec![path.to_path_buf()],
    }
}

fn split_key(f: &GgufFile, key: &str) -> Result<Option<u64>> {
    Meta { path: &f.path, kvs: &f.kvs }.uint(key)
}

/// Opens every part of the model at `path` and checks they form one split.
fn open_parts(path: &Path) -> Result<Vec<GgufFile>> {
    let paths = split_parts(path);
    let mut files = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        let f = GgufFile::open(p)?;
        let (no, count) = (split_key(&f, "split.no")?, split_key(&f, "split.count")?);
        if paths.len() > 1 && (no != Some(i as u64) || count != Some(paths.len() as u64)) {
            // split.no counts from 0, the file names from 1.
            let said = |v: Option<u64>, plus: u64| v.map_or("missing".to_string(), |v| (v + plus).to_string());
            let msg = format!("the file name says part {} of {}, but its split.no and split.count say part {} of {}", i + 1, paths.len(), said(no, 1), said(count, 0));
            return Err(Error::Gguf { path: p.clone(), what: "split.no".into(), msg });
        }
        if paths.len() == 1 && count.is_some_and(|c| c > 1) {
            return Err(Error::Gguf { path: p.clone(), what: "split.count".into(), msg: format!("this file is one of {} parts; name it NAME-00001-of-{:05}.gguf as llama.cpp does", count.unwrap_or(0), count.unwrap_or(0)) });
        }
        files.push(f);
    }
    if files.len() > 1 {
        let total: usize = files.iter().map(|f| f.tensors.len()).sum();
        if let Some(want) = split_key(&files[0], "split.tensors.count")? {
            if want != total as u64 {
                return Err(Error::Gguf { path: files[0].path.clone(), what: "split.tensors.count".into(), msg: format!("{want}, but the {} parts hold {total} tensors", files.len()) });
            }
        }
    }
    Ok(files)
}

pub fn open(path: &Path) -> Result<Imported> {
    let files = open_parts(path)?;
    let first = &files[0];
    let meta = Meta { path: &first.path, kvs: &first.kvs };
    // Every tensor by GGUF name, with the part it is in.
    let mut infos: BTreeMap<String, (usize, TensorInfo)> = BTreeMap::new();
    for (i, f) in files.iter().enumerate() {
        for t in &f.tensors {
            if infos.insert(t.name.clone(), (i, t.clone())).is_some() {
                return Err(Error::Gguf { path: f.path.clone(), what: t.name.clone(), msg: "this tensor is also in another part of the split".into() });
            }
        }
    }
    let by_name: BTreeMap<String, TensorInfo> = infos.iter().map(|(n, (_, t))| (n.clone(), t.clone())).collect();
    let (cfg, mut warnings) = arch::config(&meta, &by_name)?;
    let map = arch::tensor_map(&cfg, &meta, &by_name)?;
    let mut tensors = BTreeMap::new();
    let mut types: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut used = std::collections::HashSet::new();
    for (hf, src) in &map {
        let Some((part, t)) = infos.get(&src.gguf) else {
            // Missing tensors are named by the layout, under their Hugging Face names; say
            // which GGUF tensor that is here.
            return Err(Error::Gguf { path: first.path.clone(), what: src.gguf.clone(), msg: format!("tensor missing (read as {hf})") });
        };
        let dtype = match t.ty {
            GgmlType::F32 => SourceDType::F32,
            GgmlType::F16 => SourceDType::F16,
            GgmlType::Bf16 => SourceDType::Bf16,
            ty if ty.is_decoded_block() => SourceDType::Block(ty),
            ty => return Err(Error::Gguf { path: files[*part].path.clone(), what: t.name.clone(), msg: format!("ggml type {} is not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K are)", ty.name()) }),
        };
        if used.insert(src.gguf.clone()) {
            *types.entry(t.ty.name()).or_default() += 1;
        }
        let mut loc = TensorLocation { shard: *part, dtype, shape: t.shape(), start: t.start, nbytes: t.nbytes, row_order: None };
        if let Some(rows) = &src.rows {
            if loc.shape.len() == 3 {
                // Stacked experts: read as one (experts x out) x in matrix.
                loc.shape = vec![loc.shape[0] * loc.shape[1], loc.shape[2]];
            }
            loc = loc.rows(rows.clone());
        }
        if let Some(heads) = src.unpermute_heads {
            let hd = cfg.head_dim();
            if loc.shape.first() != Some(&(heads * hd)) {
                return Err(Error::Gguf { path: files[*part].path.clone(), what: t.name.clone(), msg: format!("shape {:?}, expected {} rows ({heads} heads of {hd})", loc.shape, heads * hd) });
            }
            loc.row_order = Some(Arc::from(arch::unpermuted_rows(heads, hd)));
        }
        tensors.insert(hf.clone(), loc);
    }
    let unused: Vec<&String> = infos.keys().filter(|n| !used.contains(*n)).collect();
    if let Some(n) = unused.first() {
        warnings.push(format!("{}: {} tensor(s) not used by the model ignored, e.g. '{n}'", first.path.display(), unused.len()));
    }
    let read = crate::hf::tokenizer::Read {
        tok_path: first.path.clone(),
        cfg_path: first.path.clone(),
        tokenizer_json: tokenizer::tokenizer_json(&meta)?,
        chat_template: meta.str("tokenizer.chat_template")?.map(str::to_string),
        bos_token: tokenizer::token_text(&meta, cfg.tokens.bos)?,
        eos_token: tokenizer::token_text(&meta, cfg.tokens.eos)?,
        add_bos_token: meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false),
    };
    let (tok_spec, special) = crate::hf::tokenizer::check(read, &cfg)?;
    let dir = first.path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let parts = files.into_iter().map(|f| (f.path, f.file)).collect();
    let ckpt = Checkpoint::from_files(&dir, parts, tensors);
    Ok(Imported { cfg, ckpt, tok_spec, special, warnings, types })
}
