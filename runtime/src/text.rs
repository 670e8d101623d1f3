//! The text front end: the model's own Hugging Face tokenizer and chat template, both read
//! from the artifact.

use llada_ir::{SpecialTokens, TokenizerSpec};
use minijinja::{context, Environment};

use crate::error::{Error, Result};

/// An empty prompt asks for nothing (the README promises `-p ""` is refused).
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

/// The work the chat template may do to render one turn: minijinja's fuel, about one unit per
/// instruction of its compiled template. One user turn takes 37 units under LLaDA's template
/// (the embedded model's), 24 under LLaDA-MoE's and 43 under Qwen2.5-Instruct's with its tool
/// branches (the form Dream, built on Qwen2.5, uses), whatever the turn's length
/// (`fuel_of_real_templates` below); 10,000 is over 200 times the most, and stops a template
/// that loops without end within a millisecond (0.35 ms for nested loops here). `lladac`
/// dry-runs the template under the same bound (its `CHAT_TEMPLATE_FUEL`, equal to this one;
/// `tests/tests/careless_checkpoint.rs`), so a template that needs more is refused when it is
/// compiled, not when a user runs it.
pub const CHAT_TEMPLATE_FUEL: u64 = 10_000;

/// The most the chat template may write for one turn beyond the turn itself: a template that
/// writes more is refused rather than growing the prompt (and memory) without bound.
pub const CHAT_TEMPLATE_OUTPUT: usize = 1 << 20;

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

/// Renders a chat template as Hugging Face's `apply_chat_template(..., add_generation_prompt=True)`
/// does for one user turn, under [`CHAT_TEMPLATE_FUEL`] and [`CHAT_TEMPLATE_OUTPUT`]; with the
/// fuel it used. `lladac` sets minijinja up the same way for its dry run (`hf/tokenizer.rs`).
fn render_template(template: &str, user: &str, bos: &str, eos: &str) -> std::result::Result<(String, u64), String> {
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
    });
    env.set_fuel(Some(CHAT_TEMPLATE_FUEL));
    env.add_template("chat", template).map_err(|e| e.to_string())?;
    let tpl = env.get_template("chat").map_err(|e| e.to_string())?;
    let ctx = context! {
        messages => vec![context! { role => "user", content => user }],
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    };
    let limit = user.len().saturating_add(CHAT_TEMPLATE_OUTPUT);
    let mut out = Bounded { out: Vec::new(), limit };
    let fuel = match tpl.render_captured_to(ctx, &mut out) {
        Ok(done) => done.state().fuel_levels().map_or(0, |(used, _)| used),
        Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
            return Err(format!("rendering one turn took more than {CHAT_TEMPLATE_FUEL} steps of the template engine (a loop that runs too long?); it was stopped"));
        }
        Err(e) if e.kind() == minijinja::ErrorKind::WriteFailure => {
            return Err(format!("rendering one turn wrote more than {limit} bytes (the turn and {CHAT_TEMPLATE_OUTPUT} more); it was stopped"));
        }
        Err(e) => return Err(e.to_string()),
    };
    let text = String::from_utf8(out.out).map_err(|_| "rendered text that is not UTF-8".to_string())?;
    Ok((text, fuel))
}

pub struct Text {
    tokenizer: tokenizers::Tokenizer,
    spec: TokenizerSpec,
    special: SpecialTokens,
}

impl Text {
    pub fn new(spec: &TokenizerSpec, special: &SpecialTokens) -> Result<Text> {
        // `tokenizers` 0.23 panics on some malformed decoder sections (an `expect` in its
        // deserialiser, found by fuzzing): contain it as an error.
        let parsed = contain_quietly(|| spec.tokenizer_json.parse::<tokenizers::Tokenizer>().map_err(|e| e.to_string()));
        let tokenizer = parsed
            .unwrap_or_else(|_| Err("its structure is malformed (the tokenizers library failed on it)".into()))
            .map_err(|e| Error::Tokenizer(format!("cannot load the stored tokenizer: {e}")))?;
        Ok(Text { tokenizer, spec: spec.clone(), special: special.clone() })
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
        let template = self.spec.chat_template.as_deref().ok_or_else(|| {
            Error::Template("this model has no chat template; run without --chat".into())
        })?;
        let bos = self.spec.bos_token.as_deref().unwrap_or_default();
        let eos = self.spec.eos_token.as_deref().unwrap_or_default();
        render_template(template, user, bos, eos).map(|(text, _)| text).map_err(|e| Error::Template(format!("the model's chat template: {e}")))
    }

    /// Token ids of a chat prompt: the rendered template already holds the special tokens,
    /// so nothing is added.
    pub fn encode_chat(&self, user: &str) -> Result<Vec<u32>> {
        // The template's own tokens would make an empty turn look like a prompt.
        not_empty(user)?;
        let text = self.render_chat(user)?;
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


#[cfg(test)]
mod tests {
    use super::*;

    /// LLaDA-8B-Instruct's template (the embedded model's and `gen-checkpoint`'s).
    const LLADA: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

    /// LLaDA-MoE's (`gen-checkpoint`'s copy).
    const LLADA_MOE: &str = "{% for message in messages %}<role>{% if message['role'] == 'user' %}HUMAN{% elif message['role'] == 'assistant' %}ASSISTANT{% else %}{{ message['role'] | upper }}{% endif %}</role>{{ message['content'] | trim }}<|role_end|>{% endfor %}{% if add_generation_prompt %}<role>ASSISTANT</role>{% endif %}";

    /// Qwen2.5-Instruct's template with its tool branches.
    const QWEN: &str = r#"{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

    /// What `CHAT_TEMPLATE_FUEL` is measured against: real templates use a hundredth of it or
    /// less, whatever the length of the turn.
    #[test]
    fn fuel_of_real_templates() {
        for (name, template, want) in [("llada", LLADA, "<|start_header_id|>user"), ("llada-moe", LLADA_MOE, "<role>HUMAN</role>"), ("qwen", QWEN, "<|im_start|>user\n")] {
            for user in ["Hi", &"a long question ".repeat(2000)] {
                let (text, fuel) = render_template(template, user, "<s>", "</s>").unwrap();
                eprintln!("{name}: {fuel} fuel for a turn of {} bytes", user.len());
                assert!(text.contains(want) && text.contains(user.trim()), "{name}: {} bytes rendered", text.len());
                assert!(fuel > 0 && fuel * 200 < CHAT_TEMPLATE_FUEL, "{name}: {fuel}");
            }
        }
    }

    /// A template that loops too long, or writes too much, stops at once, naming the template.
    #[test]
    fn runaway_templates_stop_naming_the_chat_template() {
        let spec = |t: &str| TokenizerSpec { tokenizer_json: String::new(), chat_template: Some(t.to_string()), bos_token: None, eos_token: None, add_bos_token: false };
        let special = SpecialTokens { mask: 0, bos: None, eos: None, eot: None };
        let text = |t: &str| Text { tokenizer: tokenizers::Tokenizer::new(tokenizers::models::bpe::BPE::default()), spec: spec(t), special: special.clone() };
        for (template, needle) in [
            ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}", "steps"),
            ("{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}", "bytes"),
            ("{% for message in messages %}", "syntax"),
        ] {
            let start = std::time::Instant::now();
            let msg = text(template).render_chat("hi").unwrap_err().to_string();
            assert!(msg.contains("chat template") && msg.contains(needle), "{msg}");
            eprintln!("{needle}: stopped after {:?}", start.elapsed());
            assert!(start.elapsed().as_secs_f64() < 5.0, "{template}: {:?}", start.elapsed());
        }
    }
}
