//! The chat template as llada renders it, in one place: `lladac` dry-runs a checkpoint's
//! template with it when it compiles, and the runtime renders every `--chat` prompt with it, so
//! a template that compiles renders the same way on the phone. Hugging Face templates are
//! Jinja: minijinja with Python's string methods (minijinja-contrib's pycompat) and
//! `raise_exception`, under a bound on work (minijinja's fuel) and on output.

use minijinja::{context, Environment, ErrorKind};

/// The work the chat template may do to render one turn: minijinja's fuel, about one unit per
/// instruction of its compiled template. One user turn takes 37 units under LLaDA's template
/// (the embedded model's), 24 under LLaDA-MoE's and 43 under Qwen2.5-Instruct's with its tool
/// branches (the form Dream, built on Qwen2.5, uses), whatever the turn's length
/// (`fuel_of_real_templates` below); 10,000 is over 200 times the most, and stops a template
/// that loops without end within a millisecond (0.35 ms for nested loops here).
pub const FUEL: u64 = 10_000;

/// The most the chat template may write for one turn beyond the turn itself: a template that
/// writes more is refused rather than growing the prompt (and memory) without bound.
pub const OUTPUT: usize = 1 << 20;

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

/// Renders `template` as Hugging Face's `apply_chat_template(..., add_generation_prompt=True)`
/// does for one user turn, under [`FUEL`] and [`OUTPUT`]: the text, and the fuel it used. The
/// error says what went wrong, for the caller to put behind the template's name.
pub fn render(template: &str, user: &str, bos: &str, eos: &str) -> Result<(String, u64), String> {
    render_messages(template, &[("user", user)], bos, eos)
}

/// [`render`] for a conversation of `(role, content)` turns (a server's `messages`), under
/// [`FUEL`] per turn and [`OUTPUT`] beyond the turns' own text.
pub fn render_messages(template: &str, messages: &[(&str, &str)], bos: &str, eos: &str) -> Result<(String, u64), String> {
    let mut env = Environment::new();
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> { Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg)) });
    let fuel = FUEL.saturating_mul(messages.len().max(1) as u64);
    env.set_fuel(Some(fuel));
    env.add_template("chat", template).map_err(|e| e.to_string())?;
    let tpl = env.get_template("chat").map_err(|e| e.to_string())?;
    let turns: Vec<_> = messages.iter().map(|&(role, content)| context! { role => role, content => content }).collect();
    let ctx = context! {
        messages => turns,
        add_generation_prompt => true,
        bos_token => bos,
        eos_token => eos,
    };
    let own: usize = messages.iter().map(|(r, c)| r.len() + c.len()).sum();
    let limit = own.saturating_add(OUTPUT);
    let mut out = Bounded { out: Vec::new(), limit };
    let fuel = match tpl.render_captured_to(ctx, &mut out) {
        Ok(done) => done.state().fuel_levels().map_or(0, |(used, _)| used),
        Err(e) if e.kind() == ErrorKind::OutOfFuel => {
            return Err(format!("rendering took more than {fuel} steps of the template engine ({FUEL} a turn), the most llada allows (a loop that runs too long?); it was stopped"));
        }
        Err(e) if e.kind() == ErrorKind::WriteFailure => {
            return Err(format!("rendering wrote more than {limit} bytes (the turns and {OUTPUT} more), the most llada allows; it was stopped"));
        }
        Err(e) => return Err(e.to_string()),
    };
    let text = String::from_utf8(out.out).map_err(|_| "rendered text that is not UTF-8".to_string())?;
    Ok((text, fuel))
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

    /// What `FUEL` is measured against: real templates use a hundredth of it or
    /// less, whatever the length of the turn.
    #[test]
    fn fuel_of_real_templates() {
        for (name, template, want) in [("llada", LLADA, "<|start_header_id|>user"), ("llada-moe", LLADA_MOE, "<role>HUMAN</role>"), ("qwen", QWEN, "<|im_start|>user\n")] {
            for user in ["Hi", &"a long question ".repeat(2000)] {
                let (text, fuel) = render(template, user, "<s>", "</s>").unwrap();
                eprintln!("{name}: {fuel} fuel for a turn of {} bytes", user.len());
                assert!(text.contains(want) && text.contains(user.trim()), "{name}: {} bytes rendered", text.len());
                assert!(fuel > 0 && fuel * 200 < FUEL, "{name}: {fuel}");
            }
        }
    }

    #[test]
    fn python_methods_and_raise_exception_work_and_runaways_stop() {
        assert_eq!(render("{{ messages[0]['content'].strip().upper() }}", " hi ", "", "").unwrap().0, "HI");
        for (template, needle) in [
            ("{% for message in messages %}", "syntax error"),
            ("{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}", "steps"),
            ("{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}", "bytes"),
            ("{{ raise_exception('no system role') }}", "no system role"),
        ] {
            let msg = render(template, "hi", "", "").unwrap_err();
            assert!(msg.contains(needle), "{template}: {msg}");
        }
    }
}
