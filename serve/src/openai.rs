//! OpenAI's wire format: request bodies of `/v1/chat/completions` and `/v1/completions` read
//! into what a generation needs, and the response objects, chunks and errors written back.
//! Diffusion settings travel as extra body fields with the CLI's names (`steps`, `block_len`,
//! `policy`, `threshold`, `alg`...); their types and ranges are checked by the runtime
//! (`llada_rt::settings`), in the one place every front end shares.

use serde_json::{json, Map, Value as Json};

use llada_rt::settings::{Value, NAMES};

/// An OpenAI-style error: HTTP status, message, `type`, and the request field at fault.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> ApiError {
        let kind = match status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    pub fn param(mut self, p: &str) -> ApiError {
        self.param = Some(p.to_string());
        self
    }

    /// The server stopped before the request's turn.
    pub fn shutting_down() -> ApiError {
        ApiError::new(503, "the server is shutting down")
    }

    pub fn code(mut self, c: &'static str) -> ApiError {
        self.code = Some(c);
        self
    }

    pub fn body(&self) -> String {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}).to_string()
    }

    /// A runtime error about a request: a setting out of range names it (as the body field);
    /// a fault of the server or its device is a 500.
    pub fn from_runtime(e: &llada_rt::Error) -> ApiError {
        use llada_rt::Error as E;
        match e {
            // Named as the body field, not the CLI's flag, as this layer's own errors are.
            E::Setting { setting, message } => {
                let field = setting.flag().trim_start_matches("--").replace('-', "_");
                let field = if field == "gen_len" { "max_tokens".to_string() } else { field };
                ApiError::new(400, format!("{field}: {message}")).param(&field)
            }
            E::Request(_) | E::Tokenizer(_) | E::Template(_) => ApiError::new(400, e.to_string()),
            _ => ApiError::new(500, e.to_string()),
        }
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }

    /// The body field that holds the prompt.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completion => "prompt",
        }
    }

    /// Of a response's `id`, as OpenAI's.
    pub fn id_prefix(self) -> &'static str {
        match self {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// `(role, content)` turns through the model's chat template.
    Messages(Vec<(String, String)>),
    /// Plain text, tokenized as `llada-rt run -p` does.
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
}

/// A request, read and type-checked; the settings are checked against the model later.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiRequest {
    pub endpoint: Endpoint,
    pub prompt: Prompt,
    pub stream: bool,
    /// `stream_options.include_usage`: OpenAI's usage-only chunk before `[DONE]` (the finish
    /// chunk carries the usage either way).
    pub include_usage: bool,
    /// Every step's canvas as `event: step` events (the live view's stream).
    pub steps: bool,
    pub stop: Vec<String>,
    /// Sampler settings by the CLI's names (`max_tokens` is `gen_len`).
    pub settings: Vec<(String, Value)>,
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::new(400, message).param(param)
}

fn setting_value(v: &Json) -> Option<Value> {
    Some(match v {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        // Every u64 (a seed) and every i64 is a whole number; the settings check its range.
        Json::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Value::Int(u.into()),
            (None, Some(i)) => Value::Int(i.into()),
            (None, None) => Value::Float(n.as_f64()?),
        },
        Json::String(s) => Value::Str(s.clone()),
        _ => return None,
    })
}

/// What a message's `content` says: a string, or OpenAI's list of text parts.
fn content(v: &Json, at: &str) -> Result<String, ApiError> {
    match v {
        Json::String(s) => Ok(s.clone()),
        Json::Array(parts) => {
            let mut text = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Json::as_str), p.get("text").and_then(Json::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    _ => return Err(bad(format!("{at}[{i}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are accepted"), at)),
                }
            }
            Ok(text)
        }
        _ => Err(bad(format!("{at}: expected a string or a list of text parts"), at)),
    }
}

fn messages(v: &Json) -> Result<Prompt, ApiError> {
    let list = v.as_array().ok_or_else(|| bad("messages: expected a list of messages", "messages"))?;
    if list.is_empty() {
        return Err(bad("messages: the list is empty; give at least one message", "messages"));
    }
    let mut turns = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m = m.as_object().ok_or_else(|| bad(format!("{at}: expected an object with role and content"), "messages"))?;
        let role = m.get("role").and_then(Json::as_str).ok_or_else(|| bad(format!("{at}.role: expected one of system, developer, user, assistant"), "messages"))?;
        // OpenAI's newer clients send the system turn as `developer`.
        let role = match role {
            "developer" => "system",
            "system" | "user" | "assistant" => role,
            _ => return Err(bad(format!("{at}.role: '{role}' is not one of system, developer, user, assistant"), "messages")),
        };
        if let Some(k) = m.keys().find(|k| !["role", "content"].contains(&k.as_str())) {
            return Err(bad(format!("{at}.{k}: not accepted (a message has role and content)"), "messages"));
        }
        let text = content(m.get("content").unwrap_or(&Json::Null), &format!("{at}.content"))?;
        turns.push((role.to_string(), text));
    }
    Ok(Prompt::Messages(turns))
}

fn completion_prompt(v: &Json) -> Result<Prompt, ApiError> {
    match v {
        Json::String(s) => Ok(Prompt::Text(s.clone())),
        Json::Array(a) if a.len() == 1 && a[0].is_string() => Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_string())),
        Json::Array(a) if !a.is_empty() && a.iter().all(|t| t.is_u64()) => {
            a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()).ok_or_else(|| bad("prompt: a token id is too large", "prompt"))).collect::<Result<_, _>>().map(Prompt::Ids)
        }
        _ => Err(bad("prompt: expected a string, or a list of token ids (one prompt per request)", "prompt")),
    }
}

fn stop(v: &Json) -> Result<Vec<String>, ApiError> {
    let list = match v {
        Json::Null => vec![],
        Json::String(s) => vec![s.clone()],
        Json::Array(a) => a.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(|| bad("stop: expected a string or a list of strings", "stop"))).collect::<Result<_, _>>()?,
        _ => return Err(bad("stop: expected a string or a list of strings", "stop")),
    };
    if list.len() > 4 {
        return Err(bad(format!("stop: {} sequences; at most 4", list.len()), "stop"));
    }
    if list.iter().any(String::is_empty) {
        return Err(bad("stop: a stop sequence is empty", "stop"));
    }
    Ok(list)
}

fn flag(v: &Json, name: &str) -> Result<bool, ApiError> {
    v.as_bool().ok_or_else(|| bad(format!("{name}: expected true or false"), name))
}

/// Reads a request body of `endpoint` for the model `model_id`.
pub fn parse(endpoint: Endpoint, body: &[u8], model_id: &str) -> Result<ApiRequest, ApiError> {
    let json: Json = serde_json::from_slice(body).map_err(|e| ApiError::new(400, format!("the body is not valid JSON: {e}")))?;
    let Json::Object(fields) = json else { return Err(ApiError::new(400, "the body must be a JSON object")) };
    parse_fields(endpoint, &fields, model_id)
}

fn parse_fields(endpoint: Endpoint, fields: &Map<String, Json>, model_id: &str) -> Result<ApiRequest, ApiError> {
    let prompt_field = endpoint.prompt_field();
    let other_prompt = match endpoint {
        Endpoint::Chat => Endpoint::Completion,
        Endpoint::Completion => Endpoint::Chat,
    }
    .prompt_field();
    match fields.get("model") {
        Some(Json::String(m)) if m == model_id => {}
        Some(Json::String(m)) => return Err(ApiError::new(404, format!("The model '{m}' does not exist; this server serves '{model_id}'")).param("model").code("model_not_found")),
        Some(_) => return Err(bad("model: expected a string", "model")),
        None => return Err(bad(format!("model: missing; this server serves '{model_id}'"), "model")),
    }
    let prompt = match (endpoint, fields.get(prompt_field)) {
        (_, None) => return Err(bad(format!("{prompt_field}: missing"), prompt_field)),
        (Endpoint::Chat, Some(v)) => messages(v)?,
        (Endpoint::Completion, Some(v)) => completion_prompt(v)?,
    };
    let mut request = ApiRequest { endpoint, prompt, stream: false, include_usage: false, steps: false, stop: vec![], settings: vec![] };
    let mut gen_len_from: Option<&str> = None;
    for (key, v) in fields {
        let key = key.as_str();
        match key {
            "model" => {}
            k if k == prompt_field => {}
            k if k == other_prompt => return Err(bad(format!("{k}: not accepted here ({} takes {prompt_field})", endpoint.path()), k)),
            "stream" => request.stream = flag(v, key)?,
            "llada_steps" => request.steps = flag(v, key)?,
            "stream_options" => {
                let ok = v.is_null() || v.as_object().is_some_and(|o| o.iter().all(|(k, v)| k == "include_usage" && v.is_boolean()));
                if !ok {
                    return Err(bad("stream_options: only {\"include_usage\": true|false} is accepted", key));
                }
                request.include_usage = v.get("include_usage").and_then(Json::as_bool).unwrap_or(false);
            }
            "n" => {
                if v.as_u64() != Some(1) && !v.is_null() {
                    return Err(bad("n: only 1 is supported (one answer per request)", key));
                }
            }
            "stop" => request.stop = stop(v)?,
            "max_tokens" | "max_completion_tokens" | "gen_len" => {
                if let Some(other) = gen_len_from {
                    return Err(bad(format!("{key}: given together with {other}; give one"), key));
                }
                gen_len_from = Some(key);
                if !v.is_null() {
                    let value = setting_value(v).ok_or_else(|| bad(format!("{key}: expected a whole number"), key))?;
                    request.settings.push(("gen_len".to_string(), value));
                }
            }
            k if NAMES.contains(&k) => {
                let value = setting_value(v).ok_or_else(|| bad(format!("{k}: expected a number, a string, a boolean or null"), k))?;
                request.settings.push((k.to_string(), value));
            }
            k => return Err(bad(format!("Unrecognized request argument supplied: {k}"), k)),
        }
    }
    Ok(request)
}

/// `text` cut before the first of `stop` it contains, and whether it was cut.
pub fn cut_at_stop<'a>(text: &'a str, stop: &[String]) -> (&'a str, bool) {
    match stop.iter().filter_map(|s| text.find(s.as_str())).min() {
        Some(at) => (&text[..at], true),
        None => (text, false),
    }
}

/// How much of `text` (with no stop sequence in it) a stream may send: all but a tail that
/// could be the start of a stop sequence still being written.
pub fn sendable(text: &str, stop: &[String]) -> usize {
    let mut keep = text.len();
    for s in stop {
        for (i, _) in s.char_indices().skip(1) {
            if text.ends_with(&s[..i]) {
                keep = keep.min(text.len() - i);
            }
        }
    }
    keep
}

/// One answer as it is sent: OpenAI's response object, or its stream of chunks, around the
/// text.
pub struct Answer {
    pub request: ApiRequest,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Text already sent (streams).
    pub sent: String,
    /// A stop sequence appeared: the generation was stopped there.
    pub stopped: bool,
}

/// How an answer ends: its text, why it ended, its usage, and the runtime's figures.
pub struct Ending {
    pub text: String,
    pub finish_reason: &'static str,
    pub usage: Json,
    pub llada: Json,
}

impl Answer {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.request.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// A response object or stream chunk around `choices` (OpenAI's id, object, created, model).
    fn envelope(&self, chunk: bool, choices: Json) -> Json {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// A stream chunk carrying `delta` (text, or the assistant role first), `finish`, and the
    /// fields of `extra` (the last chunk's usage).
    pub fn chunk(&self, delta: Option<&str>, role: bool, finish: Option<&str>, extra: Option<&Json>) -> String {
        let choice = match self.request.endpoint {
            Endpoint::Chat => {
                let mut d = Map::new();
                if role {
                    d.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = delta {
                    d.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": d, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completion => json!({"index": 0, "text": delta.unwrap_or(""), "logprobs": null, "finish_reason": finish}),
        };
        let mut chunk = self.envelope(true, json!([choice]));
        if let Some(Json::Object(fields)) = extra {
            chunk.as_object_mut().expect("a chunk is an object").extend(fields.clone());
        }
        chunk.to_string()
    }

    /// The stream's first chunk, if its endpoint has one (chat: the assistant's role).
    pub fn opening_chunk(&self) -> Option<String> {
        (self.request.endpoint == Endpoint::Chat).then(|| self.chunk(Some(""), true, None, None))
    }

    /// The whole response object of an answer not streamed.
    pub fn whole(&self, end: Ending) -> Json {
        let choice = match self.request.endpoint {
            Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": end.text}, "logprobs": null, "finish_reason": end.finish_reason}),
            Endpoint::Completion => json!({"index": 0, "text": end.text, "logprobs": null, "finish_reason": end.finish_reason}),
        };
        let mut whole = self.envelope(false, json!([choice]));
        whole["usage"] = end.usage;
        whole["llada"] = end.llada;
        whole
    }

    /// A stream's last chunks: what it has not sent of the text, the finish chunk with the
    /// usage (and the runtime's figures), and OpenAI's usage-only chunk, with no choices,
    /// where `stream_options.include_usage` asks for it.
    pub fn closing_chunks(&self, end: Ending) -> Vec<String> {
        // The final text extends the settled text sent (settled tokens do not change); were
        // it ever not so, the whole text is sent rather than dropped.
        let rest = end.text.strip_prefix(self.sent.as_str()).unwrap_or(&end.text);
        let mut chunks = Vec::new();
        if !rest.is_empty() {
            chunks.push(self.chunk(Some(rest), false, None, None));
        }
        let extra = json!({"usage": end.usage, "llada": end.llada});
        chunks.push(self.chunk(None, false, Some(end.finish_reason), Some(&extra)));
        if self.request.include_usage {
            let mut usage_only = self.envelope(true, json!([]));
            usage_only["usage"] = end.usage;
            chunks.push(usage_only.to_string());
        }
        chunks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(body: &str) -> Result<ApiRequest, ApiError> {
        parse(Endpoint::Chat, body.as_bytes(), "m")
    }

    #[test]
    fn a_chat_request_with_diffusion_settings_is_read() {
        let r = chat(r#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":32,"steps":16,"policy":"dual","stream":true,"stop":"\n"}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Messages(vec![("system".into(), "be brief".into()), ("user".into(), "hi".into())]));
        assert!(r.stream);
        assert_eq!(r.stop, vec!["\n".to_string()]);
        // serde_json's map is sorted by key.
        assert_eq!(r.settings, vec![("gen_len".into(), Value::Int(32)), ("policy".into(), Value::Str("dual".into())), ("steps".into(), Value::Int(16))]);
    }

    #[test]
    fn each_bad_field_is_named_with_its_status() {
        let case = |body: &str| chat(body).unwrap_err();
        assert_eq!(case("[1]").status, 400);
        assert!(case("{").message.contains("not valid JSON"));
        let e = case(r#"{"model":"x","messages":[{"role":"user","content":"a"}]}"#);
        assert_eq!((e.status, e.code), (404, Some("model_not_found")));
        assert_eq!(case(r#"{"model":"m"}"#).param.as_deref(), Some("messages"));
        assert_eq!(case(r#"{"model":"m","messages":[{"role":"robot","content":"a"}]}"#).param.as_deref(), Some("messages"));
        assert_eq!(case(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"n":2}"#).param.as_deref(), Some("n"));
        assert_eq!(case(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"frequency_penalty":1}"#).param.as_deref(), Some("frequency_penalty"));
        assert_eq!(case(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"stream":"yes"}"#).param.as_deref(), Some("stream"));
        let both = case(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":8,"gen_len":8}"#);
        assert!(both.message.contains("given together with"), "{}", both.message);
        assert_eq!(case(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"steps":[1]}"#).param.as_deref(), Some("steps"));
        assert_eq!(case(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"stop":["a","b","c","d","e"]}"#).param.as_deref(), Some("stop"));
        assert_eq!(parse(Endpoint::Completion, br#"{"model":"m","messages":[]}"#, "m").unwrap_err().param.as_deref(), Some("prompt"));
    }

    /// Whole numbers keep their value whatever their size, so seed 2^64 - 1 is read and 2^63
    /// `max_tokens` is refused for its range, not its type; a setting's error names the field.
    #[test]
    fn whole_numbers_are_read_whole_and_setting_errors_name_the_field() {
        let r = chat(r#"{"model":"m","messages":[{"role":"user","content":"a"}],"seed":18446744073709551615,"max_tokens":9223372036854775808,"steps":-1}"#).unwrap();
        assert_eq!(r.settings, vec![("gen_len".into(), Value::Int(1 << 63)), ("seed".into(), Value::Int(u64::MAX.into())), ("steps".into(), Value::Int(-1))]);
        let e = ApiError::from_runtime(&llada_rt::Error::setting(llada_rt::Setting::GenLength, "9223372036854775808 is outside 1..=255"));
        assert_eq!((e.status, e.param.as_deref(), e.message.as_str()), (400, Some("max_tokens"), "max_tokens: 9223372036854775808 is outside 1..=255"));
    }

    #[test]
    fn stop_sequences_cut_the_text_and_hold_back_their_starts() {
        let stop = vec!["END".to_string()];
        assert_eq!(cut_at_stop("abcENDdef", &stop), ("abc", true));
        assert_eq!(cut_at_stop("abc", &stop), ("abc", false));
        assert_eq!(sendable("abcEN", &stop), 3);
        assert_eq!(sendable("abcE", &stop), 3);
        assert_eq!(sendable("abc", &stop), 3);
    }
}
