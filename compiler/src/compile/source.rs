//! What a compile reads: the checkpoint (or its ONNX export) with its config and tokenizer,
//! the target, and for a Snapdragon target QNN's library. Opened and checked before any work.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use llada_ir::{SpecialTokens, TokenizerSpec};

use super::CompileOptions;
use crate::error::{Error, Result};
use crate::hf::checkpoint::Checkpoint;
use crate::hf::config::LladaConfig;
use crate::hf::{config, tokenizer};
use crate::{gguf, onnx};

pub(super) struct Source {
    /// The checkpoint's directory (an ONNX export's: its config and tokenizer sit beside it).
    pub dir: PathBuf,
    pub cfg: LladaConfig,
    pub ckpt: Checkpoint,
    pub tok_spec: TokenizerSpec,
    pub special: SpecialTokens,
    pub target: llada_targets::Target,
    pub qnn_library: Option<Arc<llada_qnn::QnnLibrary>>,
    /// What the compile has to say besides errors (unused tensors, ignored config keys).
    pub warnings: Vec<String>,
    /// A GGUF source's ggml types, with how many read tensors have each.
    pub gguf_types: Option<std::collections::BTreeMap<&'static str, usize>>,
}

impl Source {
    pub fn open(opts: &CompileOptions) -> Result<Source> {
        // `metadata`, not `exists`: a link loop or an unreadable folder says so, not "not found".
        std::fs::metadata(&opts.model).map_err(|e| Error::io(&opts.model, e))?;
        if opts.model.is_file() && gguf::is_gguf(&opts.model) {
            return Source::open_gguf(opts);
        }
        // An ONNX export's config and tokenizer files sit beside it; a directory holding one
        // `.onnx` file and no safetensors (as Optimum lays an export out) names that export.
        let onnx_file = if onnx::is_onnx(&opts.model) { Some(opts.model.clone()) } else { onnx::export_in(&opts.model) };
        if onnx_file.is_none() && opts.model.is_file() {
            return Err(Error::Options(format!(
                "--model {}: a file that is neither GGUF nor ONNX; give the Hugging Face checkpoint's folder (the one holding config.json), an .onnx export or a .gguf file",
                opts.model.display()
            )));
        }
        let dir = match &onnx_file {
            Some(f) => f.parent().unwrap_or(Path::new(".")).to_path_buf(),
            None => opts.model.clone(),
        };
        if onnx_file.is_some() && !dir.join("config.json").exists() {
            return Err(Error::Onnx {
                path: onnx_file.clone().unwrap_or_default(),
                msg: "no config.json beside it: an ONNX graph carries no model config or tokenizer, so lladac reads the checkpoint's config.json and tokenizer files from the .onnx file's directory (as Hugging Face Optimum's exports place them)".into(),
            });
        }
        // Everything the compile reads, which the output must not replace; checked now, before
        // the work, and again when the artifact is moved into place.
        let reads = [opts.model.as_path(), dir.as_path()];
        llada_ir::files::check_destination(&opts.output, &reads).map_err(|e| Error::io(&opts.output, e))?;
        let (cfg, warnings) = config::load(&dir)?;
        let target = llada_targets::by_name(&opts.target).map_err(Error::Options)?;
        let ckpt = match &onnx_file {
            Some(f) => onnx::open(f, &cfg)?,
            None => Checkpoint::open(&dir)?,
        };
        let (tok_spec, special) = tokenizer::load(&dir, &cfg)?;
        let qnn_library = qnn_library_for(opts, &target)?;
        Ok(Source { dir, cfg, ckpt, tok_spec, special, target, qnn_library, warnings, gguf_types: None })
    }

    /// A GGUF file (llama.cpp's): config, tokenizer and weights all in it.
    fn open_gguf(opts: &CompileOptions) -> Result<Source> {
        let dir = opts.model.parent().unwrap_or(Path::new(".")).to_path_buf();
        llada_ir::files::check_destination(&opts.output, &[opts.model.as_path()]).map_err(|e| Error::io(&opts.output, e))?;
        let target = llada_targets::by_name(&opts.target).map_err(Error::Options)?;
        let qnn_library = qnn_library_for(opts, &target)?;
        let g = gguf::open(&opts.model)?;
        Ok(Source { dir, cfg: g.cfg, ckpt: g.ckpt, tok_spec: g.tok_spec, special: g.special, target, qnn_library, warnings: g.warnings, gguf_types: Some(g.types) })
    }

    /// Everything the compile reads, which the output must not replace (for a GGUF, its
    /// directory too: harmless, as the output may not replace a directory).
    pub fn reads<'a>(&'a self, opts: &'a CompileOptions) -> [&'a Path; 2] {
        [opts.model.as_path(), self.dir.as_path()]
    }
}

/// QNN's library, for a Snapdragon target's NPU executables.
fn qnn_library_for(opts: &CompileOptions, target: &llada_targets::Target) -> Result<Option<Arc<llada_qnn::QnnLibrary>>> {
    Ok(match (opts.host_only, crate::qnn::soc_of(&target.name)) {
        (false, Some((soc, _))) => Some(crate::qnn::open_library(soc, opts.qnn_lib.as_deref())?),
        _ => None,
    })
}
