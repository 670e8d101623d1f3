//! The byte-level BPE vocabulary every random checkpoint's tokenizer starts from: the 256 byte
//! tokens and a few merges. A leaf: the special-token layouts (`checkpoint_spec`) count it, the
//! tokenizer (`checkpoint_tokenizer`) writes it.

/// GPT-2's byte-to-character map of byte-level BPE: printable bytes stand for themselves,
/// the others are shifted above 255.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    if printable(b) {
        return b as char;
    }
    let shifted = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + shifted).expect("a valid code point")
}

/// Byte tokens (id = byte value) plus merges that make the chat template's words single
/// tokens, as LLaDA's tokenizer does. Returns the vocabulary in id order and the merges.
pub fn bpe_vocab() -> (Vec<String>, Vec<(String, String)>) {
    let mut vocab: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges = Vec::new();
    let newline = byte_char(b'\n').to_string();
    for word in ["user".to_string(), "assistant".to_string(), "system".to_string(), newline.repeat(2)] {
        let chars: Vec<String> = word.chars().map(|c| c.to_string()).collect();
        let mut left = chars[0].clone();
        for c in &chars[1..] {
            let merged = format!("{left}{c}");
            if !vocab.contains(&merged) {
                merges.push((left.clone(), c.clone()));
                vocab.push(merged.clone());
            }
            left = merged;
        }
    }
    (vocab, merges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_map_is_a_bijection_onto_gpt2_characters() {
        let chars: std::collections::HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b'A'), 'A');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b' '), 'Ġ');
    }
}
