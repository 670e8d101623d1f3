//! `llada-rt eval`: accuracy, agreement with a reference run, and cost of a decoding policy on
//! a file of tasks.
//!
//! A tasks file has one JSON object per line: `{"prompt": "...", "chat": true, "expected":
//! "..."}` or `{"prompt_ids": [...], "expected": "..."}`. An answer is correct when the text
//! generated before the first end-of-text or end-of-turn token equals `expected`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use llada_rt::error::{Error, Result};
use llada_rt::{generate, Model};
use llada_rt::sampler::{MbsdReport, SamplerParams};
use llada_rt::session::Session;
use llada_rt::text::Text;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskLine {
    prompt: Option<String>,
    prompt_ids: Option<Vec<u32>>,
    #[serde(default)]
    chat: bool,
    expected: String,
}

/// One task's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskResult {
    pub index: usize,
    pub output_ids: Vec<u32>,
    pub answer: String,
    pub correct: bool,
    pub forward_passes: u64,
    pub rows_computed: u64,
    pub seconds: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbsd: Option<MbsdReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    /// The sampler settings of the run, as `run --json` prints them (absent in reports
    /// written before they were recorded).
    #[serde(default)]
    pub settings: Option<SamplerParams>,
    pub tasks: usize,
    pub correct: usize,
    pub accuracy: f64,
    /// Share of tasks whose `output_ids` equal the reference run's (when one was given).
    pub exact_match: Option<f64>,
    pub forward_passes: u64,
    pub rows_computed: u64,
    pub generated_tokens: u64,
    pub seconds: f64,
    pub tokens_per_second: f64,
    /// `mbsd`: the dense and side paths' figures, summed over the tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mbsd: Option<MbsdReport>,
    pub results: Vec<TaskResult>,
}

/// The prompts and expected answers of a tasks file, each prompt checked as `model` takes one
/// (a fault named by its line).
pub fn load_tasks(path: &Path, text: &Text, model: &Model) -> Result<Vec<(Vec<u32>, String)>> {
    let content = llada_ir::files::read_text_bounded(path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(path, e))?;
    let bad = |line: usize, msg: String| Error::Input { path: path.to_path_buf(), msg: format!("line {line}: {msg}") };
    let mut tasks = Vec::new();
    for (i, line) in content.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let t: TaskLine = serde_json::from_str(line).map_err(|e| bad(i + 1, e.to_string()))?;
        let ids = match (t.prompt, t.prompt_ids) {
            (Some(p), None) if t.chat => text.encode_chat(&p).map_err(|e| bad(i + 1, e.to_string()))?,
            (Some(p), None) => text.encode(&p).map_err(|e| bad(i + 1, e.to_string()))?,
            // The template applies to text: ids are the prompt as given.
            (None, Some(_)) if t.chat => return Err(bad(i + 1, "\"chat\" applies the chat template to \"prompt\" text; \"prompt_ids\" are token ids as given, so it is refused with them".into())),
            (None, Some(ids)) => ids,
            _ => return Err(bad(i + 1, "needs exactly one of \"prompt\" and \"prompt_ids\"".into())),
        };
        model.check_prompt(&ids).map_err(|e| bad(i + 1, e.to_string()))?;
        tasks.push((ids, t.expected));
    }
    if tasks.is_empty() {
        return Err(Error::Input { path: path.to_path_buf(), msg: "no tasks".into() });
    }
    Ok(tasks)
}

pub fn load_reference(path: &Path) -> Result<EvalReport> {
    let content = llada_ir::files::read_text_bounded(path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&content)
        .map_err(|e| Error::Input { path: path.to_path_buf(), msg: format!("not the JSON output of `llada-rt eval --json`: {e}") })
}

pub fn run(
    session: &mut Session,
    text: &Text,
    tasks: &[(Vec<u32>, String)],
    params: &SamplerParams,
    reference: Option<&EvalReport>,
    progress: &mut dyn FnMut(usize, &TaskResult),
) -> Result<EvalReport> {
    if let Some(r) = reference {
        if r.results.len() != tasks.len() {
            return Err(Error::request(format!("the reference run has {} tasks, this file {}", r.results.len(), tasks.len())));
        }
    }
    let mut results = Vec::with_capacity(tasks.len());
    for (index, (prompt, expected)) in tasks.iter().enumerate() {
        // A fault of this task's request (its prompt and length) names the task.
        let g = generate(session, prompt, params, &mut |_| {}).map_err(|e| match e {
            Error::Request(msg) => Error::request(format!("task {} of {}: {msg}", index + 1, tasks.len())),
            other => other,
        })?;
        let answer = text.answer(&g.output_ids);
        let r = TaskResult {
            index,
            correct: answer == *expected,
            answer,
            output_ids: g.output_ids,
            forward_passes: g.forward_passes,
            rows_computed: g.rows_computed,
            seconds: g.seconds,
            mbsd: g.mbsd,
        };
        progress(index, &r);
        results.push(r);
    }
    let correct = results.iter().filter(|r| r.correct).count();
    let seconds: f64 = results.iter().map(|r| r.seconds).sum();
    let generated_tokens = (tasks.len() * params.gen_length) as u64;
    let exact_match = reference.map(|re| {
        results.iter().zip(&re.results).filter(|(a, b)| a.output_ids == b.output_ids).count() as f64 / tasks.len() as f64
    });
    Ok(EvalReport {
        settings: Some(*params),
        tasks: tasks.len(),
        correct,
        accuracy: correct as f64 / tasks.len() as f64,
        exact_match,
        forward_passes: results.iter().map(|r| r.forward_passes).sum(),
        rows_computed: results.iter().map(|r| r.rows_computed).sum(),
        generated_tokens,
        seconds,
        tokens_per_second: generated_tokens as f64 / seconds.max(1e-9),
        mbsd: results.iter().filter_map(|r| r.mbsd).reduce(|mut a, b| {
            a.add(&b);
            a
        }),
        results,
    })
}
