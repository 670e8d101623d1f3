//! The tokenizer a GGUF carries as `tokenizer.ggml.*` (llama.cpp's `gpt2` byte-level BPE:
//! tokens, their types, merges, and the pre-tokenizer's name), rebuilt as the Hugging Face
//! `tokenizer.json` the runtime loads.

use serde_json::{json, Value as Json};

use super::arch::Meta;
use super::container::Value;
use crate::error::Result;

/// llama.cpp's token types (`llama_token_type`).
const NORMAL: i64 = 1;
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;
const UNUSED: i64 = 5;
const BYTE: i64 = 6;

/// The pre-tokenizers read, by `tokenizer.ggml.pre` name: the split regex of the original
/// `tokenizer.json` (llama.cpp's `llama-vocab.cpp` keeps each as "original regex from
/// tokenizer.json"), `None` for GPT-2's byte-level regex itself.
const PRE_TOKENIZERS: &[(&str, Option<&str>)] = &[
    ("gpt-2", None),
    ("qwen2", Some(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    ("llama-bpe", Some(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    // LLaDA-MoE's files: llama.cpp's first LLaDA-MoE converter wrote `llada-moe`, later ones
    // name its (Ling's) tokenizer `bailingmoe`; llama.cpp reads all three names alike.
    ("llada-moe", Some(BAILINGMOE)),
    ("bailingmoe", Some(BAILINGMOE)),
    ("bailingmoe2", Some(BAILINGMOE)),
];

/// Ling's split regex, as its `tokenizer.json` writes it (possessive quantifiers and all); it
/// cuts the tested texts as Qwen's does.
const BAILINGMOE: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

fn strings<'a>(m: &'a Meta, key: &str) -> Result<Option<Vec<&'a str>>> {
    match m.get(key) {
        None => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Str(s) => Ok(s.as_str()),
                other => Err(m.err(key, format!("element {i} is {}, not a string", other.type_name()))),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(v) => Err(m.err(key, format!("expected an array of strings, found {}", v.type_name()))),
    }
}

/// `tokenizer.json`'s text for the GGUF's tokenizer.
pub fn tokenizer_json(m: &Meta) -> Result<String> {
    match m.str("tokenizer.ggml.model")? {
        Some("gpt2") => {}
        Some(other) => return Err(m.err("tokenizer.ggml.model", format!("\"{other}\" is not supported (only \"gpt2\", the byte-level BPE of LLaDA, LLaDA-MoE and Dream)"))),
        None => return Err(m.err("tokenizer.ggml.model", "missing")),
    }
    let tokens = strings(m, "tokenizer.ggml.tokens")?.ok_or_else(|| m.err("tokenizer.ggml.tokens", "missing"))?;
    let types: Vec<i64> = match m.get("tokenizer.ggml.token_type") {
        None => vec![NORMAL; tokens.len()],
        Some(Value::Array(items)) if items.len() == tokens.len() => items
            .iter()
            .map(|v| match v {
                Value::Int(t, _) => Ok(*t),
                Value::UInt(t, _) => Ok(*t as i64),
                other => Err(m.err("tokenizer.ggml.token_type", format!("an element is {}, not an integer", other.type_name()))),
            })
            .collect::<Result<_>>()?,
        Some(v) => return Err(m.err("tokenizer.ggml.token_type", format!("{} is not an array of one type per token ({} tokens)", v.type_name(), tokens.len()))),
    };
    let merges = strings(m, "tokenizer.ggml.merges")?.unwrap_or_default();
    let pre_name = m.str("tokenizer.ggml.pre")?.unwrap_or("gpt-2");
    let regex = match PRE_TOKENIZERS.iter().find(|p| p.0 == pre_name) {
        Some(p) => p.1,
        None => {
            let known: Vec<&str> = PRE_TOKENIZERS.iter().map(|p| p.0).collect();
            return Err(m.err("tokenizer.ggml.pre", format!("\"{pre_name}\" is not a pre-tokenizer lladac knows (it knows {})", known.join(", "))));
        }
    };

    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (&tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        match ty {
            NORMAL | BYTE => {
                if vocab.insert(tok.to_string(), json!(id)).is_some() {
                    return Err(m.err("tokenizer.ggml.tokens", format!("token \"{tok}\" (id {id}) appears twice")));
                }
            }
            CONTROL | USER_DEFINED => added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == CONTROL,
            })),
            // The converter's fillers of unused ids (`[PAD{id}]`): no token, as in the original.
            UNUSED => {}
            other => return Err(m.err("tokenizer.ggml.token_type", format!("token {id} has type {other}, not one a byte-level BPE vocabulary has"))),
        }
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, merge) in merges.iter().enumerate() {
        // llama.cpp splits a merge at its first space after the first character.
        let at = merge.char_indices().skip(1).find(|&(_, c)| c == ' ').map(|(i, _)| i);
        let Some(at) = at else {
            return Err(m.err("tokenizer.ggml.merges", format!("merge {i} \"{merge}\" is not two tokens separated by a space")));
        };
        pairs.push(json!([&merge[..at], &merge[at + 1..]]));
    }
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let pre_tokenizer = match regex {
        None => byte_level(true),
        Some(r) => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]}),
    };
    let doc: Json = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": pre_tokenizer, "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": pairs,
        },
    });
    Ok(doc.to_string())
}

/// The token text of `id`, from `tokenizer.ggml.tokens`.
pub fn token_text(m: &Meta, id: Option<u32>) -> Result<Option<String>> {
    let Some(id) = id else { return Ok(None) };
    let tokens = strings(m, "tokenizer.ggml.tokens")?.unwrap_or_default();
    Ok(tokens.get(id as usize).map(|s| s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::PRE_TOKENIZERS;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior};

    /// The pieces `pre`'s split regex cuts `text` into (before the byte-level mapping).
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let regex = PRE_TOKENIZERS.iter().find(|p| p.0 == pre).and_then(|p| p.1).unwrap();
        let split = Split::new(SplitPattern::Regex(regex.to_string()), SplitDelimiterBehavior::Isolated, false).unwrap();
        let mut s = PreTokenizedString::from(text);
        split.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(p, _, _)| p.to_string()).collect()
    }

    #[test]
    fn each_named_split_regex_compiles_and_cuts_as_its_tokenizer_does() {
        let text = "I'll go 12345!\n\nDON'T";
        let ling = ["I", "'ll", " go", " ", "1", "2", "3", "4", "5", "!\n\n", "DON", "'T"];
        for name in ["llada-moe", "bailingmoe", "bailingmoe2", "qwen2"] {
            assert_eq!(pieces(name, text), ling, "{name}");
        }
        assert_eq!(pieces("llama-bpe", text), ["I", "'ll", " go", " ", "123", "45", "!\n\n", "DON", "'T"]);
        // Runs of spaces and line breaks: the whitespace before a word stays with the word.
        for name in ["bailingmoe", "qwen2", "llama-bpe"] {
            assert_eq!(pieces(name, "a \n\n  b"), ["a", " \n\n", " ", " b"], "{name}");
        }
    }
}
