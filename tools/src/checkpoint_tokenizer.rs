//! The byte-level BPE tokenizer every random checkpoint carries (LLaDA's, LLaDA-MoE's, Dream's
//! and Gemma 4's chat formats differ only in their special tokens): its vocabulary, `tokenizer.json`
//! and the special tokens' entries of `tokenizer_config.json`.

use serde_json::{json, Value};

use crate::checkpoint_spec::SpecialIds;
pub use crate::checkpoint_vocab::bpe_vocab;

/// A byte-level BPE tokenizer: [`bpe_vocab`] (from id 0, or after Gemma 4's low special
/// tokens: [`SpecialIds::ordinary_base`]) and the chat format's special tokens at their ids.
pub fn tokenizer_json(special: SpecialIds) -> Value {
    let (vocab, merges) = bpe_vocab();
    let base = special.ordinary_base() as usize;
    // The special tokens are in the model vocabulary at their ids as well (as in LLaDA's own
    // tokenizer.json): an added token only keeps its id if the model already knows it.
    let vocab: serde_json::Map<String, Value> = vocab
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, json!(base + i)))
        .chain(special.named().iter().map(|(content, id)| (content.to_string(), json!(id))))
        .collect();
    let merges: Vec<Value> = merges.into_iter().map(|(a, b)| json!([a, b])).collect();
    let added: Vec<Value> = special
        .named()
        .iter()
        .map(|(content, id)| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true },
        "post_processor": null,
        "decoder": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges
        }
    })
}

/// `tokenizer_config.json`'s `added_tokens_decoder`: every special token by id.
pub(crate) fn added_tokens_decoder(special: SpecialIds) -> serde_json::Map<String, Value> {
    special
        .named()
        .iter()
        .map(|(content, id)| (id.to_string(), json!({"content": content, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true})))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_loads_and_knows_the_chat_words() {
        let special = SpecialIds::LLADA;
        let tok: tokenizers::Tokenizer = tokenizer_json(special).to_string().parse().unwrap();
        let ids = tok.encode("<|start_header_id|>assistant<|end_header_id|>\n\nHi", false).unwrap().get_ids().to_vec();
        assert_eq!(ids[0], special.start_header);
        assert_eq!(Some(ids[2]), special.end_header);
        // header, assistant, header, \n, \n, H, i: the byte-level pre-tokenizer splits a
        // newline run before a letter, as in the conformance kit's tokenizer.
        assert_eq!(ids, [special.start_header, 266, ids[2], 10, 10, 72, 105]);
        assert_eq!(tok.decode(&[b'H' as u32, b'i' as u32], true).unwrap(), "Hi");
    }
}
