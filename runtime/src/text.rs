//! The text front end: the model's own Hugging Face tokenizer and chat template, both read
//! from the artifact.

use llada_ir::{SpecialTokens, TokenizerSpec};

use crate::error::{Error, Result};

/// An empty prompt asks for nothing (docs/usage.md promises `-p ""` is refused).
fn not_empty(text: &str) -> Result<()> {
    if text.is_empty() {
        return Err(Error::request("the prompt is empty: give at least one character".to_string()));
    }
    Ok(())
}

thread_local! {
    /// Set while this thread runs a [`contain_quietly`] call.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, turning a panic into `Err` without printing it; panics of other threads, and of
/// this one outside such calls, reach whatever hook the process has. The library never
/// replaces the app's hook: it wraps it, once, in one that stays silent only for this.
fn contain_quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static WRAPPED: std::sync::Once = std::sync::Once::new();
    WRAPPED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info);
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result
}

pub struct Text {
    tokenizer: tokenizers::Tokenizer,
    spec: TokenizerSpec,
    special: SpecialTokens,
    /// The most bytes of text one token stands for (at most its vocabulary entry's length),
    /// for refusing a prompt too long for the model before tokenizing it.
    longest_token: usize,
}

impl Text {
    pub fn new(spec: &TokenizerSpec, special: &SpecialTokens) -> Result<Text> {
        // `tokenizers` 0.23 panics on some malformed decoder sections (an `expect` in its
        // deserialiser, found by fuzzing): contain it as an error.
        let parsed = contain_quietly(|| spec.tokenizer_json.parse::<tokenizers::Tokenizer>().map_err(|e| e.to_string()));
        let tokenizer = parsed
            .unwrap_or_else(|_| Err("its structure is malformed (the tokenizers library failed on it)".into()))
            .map_err(|e| Error::Tokenizer(format!("cannot load the stored tokenizer: {e}")))?;
        let longest_token = longest_token(&tokenizer);
        Ok(Text { tokenizer, spec: spec.clone(), special: special.clone(), longest_token })
    }

    /// Refuses `text` if it cannot be `max_tokens` tokens or fewer, without tokenizing it: a
    /// token stands for at most `longest_token` bytes of the normalized text (byte-level and
    /// SentencePiece entries are at least as long as the bytes they stand for), so a 10 MB
    /// prompt is refused at once rather than after seconds of tokenizing. Text that passes may
    /// still be too long; the count of its tokens decides.
    pub fn check_length(&self, text: &str, max_tokens: usize) -> Result<()> {
        let bytes = match self.tokenizer.get_normalizer() {
            // A normalizer may shorten the text (NFC composes), so it is measured normalized.
            Some(n) if text.len() > max_tokens.saturating_mul(self.longest_token) => {
                let mut normalized = tokenizers::NormalizedString::from(text);
                tokenizers::Normalizer::normalize(n, &mut normalized).map_err(|e| Error::Tokenizer(e.to_string()))?;
                normalized.get().len()
            }
            _ => text.len(),
        };
        if bytes > max_tokens.saturating_mul(self.longest_token) {
            return Err(Error::request(format!(
                "the prompt is {bytes} bytes, more than {max_tokens} tokens of this tokenizer can hold (a token stands for {} bytes at most); shorten it",
                self.longest_token
            )));
        }
        Ok(())
    }

    /// Refuses an id the tokenizer has no token for, naming it (decoding would drop it).
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().position(|&id| self.tokenizer.id_to_token(id).is_none()) {
            Some(i) => Err(Error::request(format!("token id {} (at {i}) is not in the tokenizer's vocabulary of {} tokens", ids[i], self.tokenizer.get_vocab_size(true)))),
            None => Ok(()),
        }
    }

    /// Token ids of plain text (the tokenizer's own post-processing, plus BOS when
    /// `add_bos_token` asks for it). Empty text is refused, as it is in a chat turn.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        not_empty(text)?;
        let enc = self.tokenizer.encode(text, true).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let mut ids = enc.get_ids().to_vec();
        if let (true, Some(bos)) = (self.spec.add_bos_token, self.special.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The chat template applied to one user turn with the generation prompt, as
    /// `apply_chat_template(..., add_generation_prompt=True)` renders it.
    pub fn render_chat(&self, user: &str) -> Result<String> {
        self.render_messages(&[("user", user)])
    }

    /// [`render_chat`](Self::render_chat) of a conversation of `(role, content)` turns.
    pub fn render_messages(&self, messages: &[(&str, &str)]) -> Result<String> {
        let template = self.spec.chat_template.as_deref().ok_or_else(|| {
            Error::Template("this model has no chat template; run without --chat".into())
        })?;
        let bos = self.spec.bos_token.as_deref().unwrap_or_default();
        let eos = self.spec.eos_token.as_deref().unwrap_or_default();
        llada_chat_template::render_messages(template, messages, bos, eos).map(|(text, _)| text).map_err(|e| Error::Template(format!("the model's chat template: {e}")))
    }

    /// Token ids of a chat prompt: the rendered template already holds the special tokens,
    /// so nothing is added.
    pub fn encode_chat(&self, user: &str) -> Result<Vec<u32>> {
        self.encode_messages(&[("user", user)])
    }

    /// [`encode_chat`](Self::encode_chat) of a conversation; every turn must have text.
    pub fn encode_messages(&self, messages: &[(&str, &str)]) -> Result<Vec<u32>> {
        // The template's own tokens would make an empty turn look like a prompt.
        if messages.is_empty() {
            return Err(Error::request("the conversation is empty: give at least one message".to_string()));
        }
        for (_, content) in messages {
            not_empty(content)?;
        }
        let text = self.render_messages(messages)?;
        let enc = self.tokenizer.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        self.tokenizer.decode(ids, skip_special).unwrap_or_default()
    }

    /// The answer: generated ids up to the first end-of-text or end-of-turn token.
    pub fn answer_ids<'a>(&self, output: &'a [u32]) -> &'a [u32] {
        let stop = output
            .iter()
            .position(|&t| Some(t) == self.special.eos || Some(t) == self.special.eot)
            .unwrap_or(output.len());
        &output[..stop]
    }

    /// The answer as text, special tokens skipped.
    pub fn answer(&self, output: &[u32]) -> String {
        self.decode(self.answer_ids(output), true)
    }

    /// [`answer`](Self::answer) of the leading tokens that can no longer change, for showing
    /// while a generation runs: a character whose bytes span tokens not all settled yet decodes
    /// as U+FFFD until they are, so it is held back, and the text only ever grows.
    pub fn settled_answer(&self, settled: &[u32]) -> String {
        let mut text = self.answer(settled);
        text.truncate(text.trim_end_matches('\u{fffd}').len());
        text
    }
}

/// The longest vocabulary entry in bytes (at least 1).
fn longest_token(tokenizer: &tokenizers::Tokenizer) -> usize {
    tokenizer.get_vocab(true).keys().map(String::len).max().unwrap_or(1).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template that loops too long, or writes too much, stops at once, naming the template.
    #[test]
    fn runaway_templates_stop_naming_the_chat_template() {
        let spec = |t: &str| TokenizerSpec { tokenizer_json: String::new(), chat_template: Some(t.to_string()), bos_token: None, eos_token: None, add_bos_token: false };
        let special = SpecialTokens { mask: 0, bos: None, eos: None, eot: None };
        let text = |t: &str| Text { tokenizer: tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default()), spec: spec(t), special: special.clone(), longest_token: 1 };
        for (template, needle) in [
            ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}", "steps"),
            ("{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}", "bytes"),
            ("{% for message in messages %}", "syntax"),
        ] {
            let msg = text(template).render_chat("hi").unwrap_err().to_string();
            assert!(msg.contains("chat template") && msg.contains(needle), "{msg}");
        }
    }

    /// The embedded model's tokenizer: a prompt that cannot fit is refused before it is
    /// tokenized, and decoding refuses an id the tokenizer lacks, naming it.
    #[test]
    fn too_long_prompts_and_unknown_ids_are_refused_by_name() {
        let json = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/llada-tiny-tasks/tokenizer.json")).unwrap();
        let spec = TokenizerSpec { tokenizer_json: json, chat_template: None, bos_token: None, eos_token: None, add_bos_token: false };
        let text = Text::new(&spec, &SpecialTokens { mask: 0, bos: None, eos: None, eot: None }).unwrap();
        let longest = text.longest_token;
        assert!(longest >= 1);
        text.check_length(&"1".repeat(100 * longest), 100).unwrap();
        let big = "1".repeat(10 << 20);
        let t = std::time::Instant::now();
        let e = text.check_length(&big, 100).unwrap_err().to_string();
        assert!(e.contains(&format!("the prompt is {} bytes", 10 << 20)) && e.contains("100 tokens"), "{e}");
        assert!(t.elapsed().as_secs_f64() < 0.5, "refused at once, not tokenized");
        // The bound holds: no token stands for more than `longest` bytes.
        let ids = text.encode(&"1".repeat(100 * longest)).unwrap();
        assert!(ids.len() * longest >= 100 * longest, "{} tokens", ids.len());
        text.check_ids(&ids).unwrap();
        let e = text.check_ids(&[ids[0], 99999]).unwrap_err().to_string();
        assert!(e.contains("token id 99999 (at 1)"), "{e}");
    }
}
