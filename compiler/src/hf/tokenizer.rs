//! `tokenizer.json` and `tokenizer_config.json`: checked here (the tokenizer must load, the
//! special tokens must exist) and stored verbatim in the artifact for the runtime.

use std::path::{Path, PathBuf};

use serde_json::Value;

use llada_ir::{files, SpecialTokens, TokenizerSpec};

use crate::error::{contain_panic, Error, Result};
use crate::hf::config::{Family, LladaConfig};
use crate::hf::config_common::first_outside;

/// The end-of-turn token of LLaDA's chat format, and of LLaDA-MoE's.
const EOT_TOKEN: &str = "<|eot_id|>";
const MOE_EOT_TOKEN: &str = "<|role_end|>";
/// Dream (Qwen2.5 chat format) ends a turn with this.
const DREAM_EOT_TOKEN: &str = "<|im_end|>";
/// LLaDA 2.x (Ling's chat format) ends a turn as LLaDA-MoE does.
const LLADA2_EOT_TOKEN: &str = "<|role_end|>";
/// Gemma's chat format (DiffusionGemma's) ends a turn with this.
const GEMMA_EOT_TOKEN: &str = "<turn|>";
/// Where newer checkpoints keep the chat template, beside `tokenizer_config.json` (which then
/// has none).
const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
/// LLaDA 2.x's mask token, and the id its published `generate` defaults to (`mask_id`), for
/// a checkpoint whose configs name no mask id (the released ones name none).
const LLADA2_MASK_TOKEN: &str = "<|mask|>";
const LLADA2_MASK_ID: u32 = 156895;

/// The turn of the dry run.
const SAMPLE_TURN: &str = "Hello! What is 2 + 2?";

/// A special token in `tokenizer_config.json`: either a string or `{"content": ...}`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// A tokenizer as read from its files (or rebuilt by another importer), before the checks:
/// `tok_path` and `cfg_path` are what errors about the tokenizer and its settings name.
pub struct Read {
    pub tok_path: PathBuf,
    pub cfg_path: PathBuf,
    pub tokenizer_json: String,
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub add_bos_token: bool,
}

pub fn load(dir: &Path, cfg: &LladaConfig) -> Result<(TokenizerSpec, SpecialTokens)> {
    let tok_path = dir.join("tokenizer.json");
    let tokenizer_json = files::read_text_bounded(&tok_path, files::TOKENIZER_LIMIT).map_err(|e| Error::io(&tok_path, e))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let text = files::read_text_bounded(&cfg_path, files::CONFIG_LIMIT).map_err(|e| Error::io(&cfg_path, e))?;
    let tc: Value = serde_json::from_str(&text).map_err(|e| Error::Json { path: cfg_path.clone(), msg: e.to_string() })?;
    let template_file = dir.join(CHAT_TEMPLATE_FILE);
    let chat_template = match tc.get("chat_template") {
        None | Some(Value::Null) if template_file.is_file() => Some(files::read_text_bounded(&template_file, files::CONFIG_LIMIT).map_err(|e| Error::io(&template_file, e))?),
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // The newer list form: [{"name": "default", "template": "..."}, ...].
        Some(Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .or(list.first())
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        Some(other) => {
            return Err(Error::config(&cfg_path, "chat_template", format!("expected a string, found {other}")));
        }
    };
    let bos_token = token_string(tc.get("bos_token"));
    let eos_token = token_string(tc.get("eos_token"));
    let add_bos_token = tc.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false);
    check(Read { tok_path, cfg_path, tokenizer_json, chat_template, bos_token, eos_token, add_bos_token }, cfg)
}

/// Loads `read`'s tokenizer, dry-runs its chat template and finds the special tokens' ids,
/// each checked inside the embedding.
pub fn check(read: Read, cfg: &LladaConfig) -> Result<(TokenizerSpec, SpecialTokens)> {
    let Read { tok_path, cfg_path, tokenizer_json, chat_template, bos_token, eos_token, add_bos_token } = read;
    // `tokenizers` 0.23 panics on some malformed decoder sections (an `expect` in its
    // deserialiser, found by fuzzing): contain it as an error naming the file.
    let tokenizer = contain_panic(|| tokenizer_json.parse::<tokenizers::Tokenizer>().map_err(|e| e.to_string()))
        .unwrap_or_else(|| Err("its structure is malformed (the tokenizers library failed on it)".into()))
        .map_err(|e| Error::Tokenizer { path: tok_path.clone(), msg: format!("cannot be loaded: {e}") })?;
    if let Some(template) = &chat_template {
        let (bos, eos) = (bos_token.as_deref().unwrap_or_default(), eos_token.as_deref().unwrap_or_default());
        llada_chat_template::render(template, SAMPLE_TURN, bos, eos).map_err(|e| Error::config(&cfg_path, "chat_template", format!("{e} (a dry run of one turn, as `llada-rt run --chat` renders it)")))?;
    }

    let id_of = |tok: &Option<String>, key: &str| -> Result<Option<u32>> {
        match tok {
            None => Ok(None),
            Some(t) => tokenizer.token_to_id(t).map(Some).ok_or_else(|| {
                Error::config(&cfg_path, key, format!("token \"{t}\" is not in tokenizer.json"))
            }),
        }
    };
    let bos = cfg.tokens.bos.or(id_of(&bos_token, "bos_token")?);
    let eos = cfg.tokens.eos.or(id_of(&eos_token, "eos_token")?);
    let eot = tokenizer.token_to_id(match cfg.family {
        Family::Llada => EOT_TOKEN,
        Family::LladaMoe => MOE_EOT_TOKEN,
        Family::Dream => DREAM_EOT_TOKEN,
        Family::Llada2Moe => LLADA2_EOT_TOKEN,
        Family::DiffusionGemma => GEMMA_EOT_TOKEN,
    });
    if let Some((what, msg)) = first_outside([("bos", bos), ("eos", eos), ("eot", eot)], cfg.dims.embedding_size) {
        return Err(Error::Tokenizer { path: tok_path, msg: format!("{what} {msg}") });
    }
    let mask = match cfg.llada2 {
        Some(l2) if l2.mask_from_tokenizer => match tokenizer.token_to_id(LLADA2_MASK_TOKEN) {
            Some(id) => id,
            None if (LLADA2_MASK_ID as usize) < cfg.dims.embedding_size => LLADA2_MASK_ID,
            None => {
                return Err(Error::Tokenizer {
                    path: tok_path,
                    msg: format!("has no {LLADA2_MASK_TOKEN} token and config.json no mask_token_id; the published generate's default {LLADA2_MASK_ID} is outside the embedding ({} rows)", cfg.dims.embedding_size),
                })
            }
        },
        _ => cfg.tokens.mask,
    };
    if let Some((what, msg)) = first_outside([("mask", Some(mask))], cfg.dims.embedding_size) {
        return Err(Error::Tokenizer { path: tok_path, msg: format!("{what} {msg}") });
    }
    Ok((
        TokenizerSpec { tokenizer_json, chat_template, bos_token, eos_token, add_bos_token },
        SpecialTokens { mask, bos, eos, eot },
    ))
}
