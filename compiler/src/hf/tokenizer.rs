//! `tokenizer.json` and `tokenizer_config.json`: checked here (the tokenizer must load, the
//! special tokens must exist) and stored verbatim in the artifact for the runtime.

use std::path::Path;

use serde_json::Value;

use llada_ir::{files, SpecialTokens, TokenizerSpec};

use crate::error::{contain_panic, Error, Result};
use crate::hf::config::{Arch, LladaConfig};

/// The end-of-turn token of LLaDA's chat format, and of LLaDA-MoE's.
const EOT_TOKEN: &str = "<|eot_id|>";
const MOE_EOT_TOKEN: &str = "<|role_end|>";
/// Dream (Qwen2.5 chat format) ends a turn with this.
const DREAM_EOT_TOKEN: &str = "<|im_end|>";

/// The work the chat template may do to render one turn (minijinja's fuel): the runtime's
/// `text::CHAT_TEMPLATE_FUEL`, under which it renders (equal to it; README and
/// `tests/tests/careless_checkpoint.rs`).
pub const CHAT_TEMPLATE_FUEL: u64 = 10_000;
/// The runtime's `text::CHAT_TEMPLATE_OUTPUT`: what one turn may add.
pub const CHAT_TEMPLATE_OUTPUT: usize = 1 << 20;
/// The turn of the dry run.
const SAMPLE_TURN: &str = "Hello! What is 2 + 2?";

/// A writer that refuses to grow past its limit.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Compiles the chat template and renders one user turn with it, as the runtime does
/// (`runtime/src/text.rs`: the same minijinja set-up, Python-compatible methods and
/// `raise_exception`, the same context, fuel and output bound), so a template the runtime
/// would fail on is refused now.
fn dry_run(template: &str, bos: &str, eos: &str) -> std::result::Result<String, String> {
    use minijinja::{context, Environment, ErrorKind};
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
    env.add_template("chat", template).map_err(|e| e.to_string())?;
    let tpl = env.get_template("chat").map_err(|e| e.to_string())?;
    let ctx = context! {
        messages => vec![context! { role => "user", content => SAMPLE_TURN }],
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    };
    let mut out = Bounded { out: Vec::new(), limit: SAMPLE_TURN.len() + CHAT_TEMPLATE_OUTPUT };
    match tpl.render_captured_to(ctx, &mut out) {
        Ok(_) => String::from_utf8(out.out).map_err(|_| "renders text that is not UTF-8".to_string()),
        Err(e) if e.kind() == ErrorKind::OutOfFuel => {
            Err(format!("rendering one short turn took more than {CHAT_TEMPLATE_FUEL} steps of the template engine, the most the runtime allows (a loop that runs too long?)"))
        }
        Err(e) if e.kind() == ErrorKind::WriteFailure => {
            Err(format!("rendering one short turn wrote more than {CHAT_TEMPLATE_OUTPUT} bytes besides the turn, the most the runtime allows"))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// A special token in `tokenizer_config.json`: either a string or `{"content": ...}`.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

pub fn load(dir: &Path, cfg: &LladaConfig) -> Result<(TokenizerSpec, SpecialTokens)> {
    let tok_path = dir.join("tokenizer.json");
    let tokenizer_json = files::read_text_bounded(&tok_path, files::TOKENIZER_LIMIT).map_err(|e| Error::io(&tok_path, e))?;
    // `tokenizers` 0.23 panics on some malformed decoder sections (an `expect` in its
    // deserialiser, found by fuzzing): contain it as an error naming the file.
    let tokenizer = contain_panic(|| tokenizer_json.parse::<tokenizers::Tokenizer>().map_err(|e| e.to_string()))
        .unwrap_or_else(|| Err("its structure is malformed (the tokenizers library failed on it)".into()))
        .map_err(|e| Error::Tokenizer { path: tok_path.clone(), msg: format!("cannot be loaded: {e}") })?;

    let cfg_path = dir.join("tokenizer_config.json");
    let text = files::read_text_bounded(&cfg_path, files::CONFIG_LIMIT).map_err(|e| Error::io(&cfg_path, e))?;
    let tc: Value = serde_json::from_str(&text).map_err(|e| Error::Json { path: cfg_path.clone(), msg: e.to_string() })?;
    let chat_template = match tc.get("chat_template") {
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
    if let Some(template) = &chat_template {
        let (bos, eos) = (bos_token.as_deref().unwrap_or_default(), eos_token.as_deref().unwrap_or_default());
        dry_run(template, bos, eos).map_err(|e| Error::config(&cfg_path, "chat_template", format!("{e} (a dry run of one turn, as `llada-rt run --chat` renders it)")))?;
    }
    let add_bos_token = tc.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false);

    let id_of = |tok: &Option<String>, key: &str| -> Result<Option<u32>> {
        match tok {
            None => Ok(None),
            Some(t) => tokenizer.token_to_id(t).map(Some).ok_or_else(|| {
                Error::config(&cfg_path, key, format!("token \"{t}\" is not in tokenizer.json"))
            }),
        }
    };
    let bos = cfg.bos_token_id.or(id_of(&bos_token, "bos_token")?);
    let eos = cfg.eos_token_id.or(id_of(&eos_token, "eos_token")?);
    let eot = tokenizer.token_to_id(match cfg.arch {
        Arch::Llada => EOT_TOKEN,
        Arch::LladaMoe => MOE_EOT_TOKEN,
        Arch::Dream => DREAM_EOT_TOKEN,
    });
    for (what, id) in [("bos", bos), ("eos", eos), ("eot", eot)] {
        if let Some(id) = id {
            if id as usize >= cfg.embedding_size {
                return Err(Error::Tokenizer {
                    path: tok_path,
                    msg: format!("{what} token id {id} is outside the embedding ({} rows)", cfg.embedding_size),
                });
            }
        }
    }
    Ok((
        TokenizerSpec { tokenizer_json, chat_template, bos_token, eos_token, add_bos_token },
        SpecialTokens { mask: cfg.mask_token_id, bos, eos, eot },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dry_run_renders_real_templates_and_refuses_broken_or_runaway_ones() {
        let llada = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";
        let text = dry_run(llada, "<s>", "</s>").unwrap();
        assert_eq!(text, format!("<s><|start_header_id|>user<|end_header_id|>\n\n{SAMPLE_TURN}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"));
        // Python's string methods, as Hugging Face templates call them.
        assert_eq!(dry_run("{{ messages[0]['content'].strip().upper() }}", "", "").unwrap(), SAMPLE_TURN.to_uppercase());
        for (template, needle) in [
            ("{% for message in messages %}", "syntax error"),
            ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}", "steps"),
            ("{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}", "bytes"),
            ("{{ raise_exception('no system role') }}", "no system role"),
        ] {
            let msg = dry_run(template, "", "").unwrap_err();
            assert!(msg.contains(needle), "{template}: {msg}");
        }
    }
}
