//! Calibration of the NPU's fixed-point activations: the range of every matmul's input and
//! output, measured by the runtime's host kernels while they generate answers to a
//! calibration set (ExecuTorch and Qualcomm's tools calibrate on the float model the same way).
//! The compiler reads the runtime here only as a library that runs an artifact; the runtime
//! knows nothing of the compiler.

use std::collections::BTreeMap;
use std::path::Path;

use llada_ir::npu::ActivationRange;
use llada_rt::executor::MatMulRange;
use llada_rt::text::Text;
use llada_rt::{Model, SamplerParams, Session};

use crate::error::{Error, Result};

/// The default calibration set: short requests of the kinds a chat model answers, each put
/// through the model's own chat template (plain text where it has none).
pub const DEFAULT_PROMPTS: [&str; 8] = [
    "What is 17 times 24?",
    "Write a short poem about the sea.",
    "Explain what a compiler does in two sentences.",
    "Translate 'good morning' into French and German.",
    "List three prime numbers greater than 50.",
    "def fibonacci(n):",
    "Summarize: The cat sat on the mat because the sun had warmed it.",
    "Lily has 12 apples and gives away 5. How many are left?",
];

/// Tokens generated per calibration prompt, and the steps that reveal them.
const GEN_LEN: usize = 32;
const STEPS: usize = 8;

/// The prompts of `--calibration FILE`: one JSON object with a `prompt` field per line (the
/// task files `llada-rt eval` reads), or one prompt per plain-text line; blank lines skipped.
pub fn read_prompts(path: &Path) -> Result<Vec<String>> {
    let text = llada_ir::files::read_text_bounded(path, llada_ir::files::DATA_LIMIT).map_err(|e| Error::io(path, e))?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let prompt = if line.trim_start().starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(line).map_err(|e| Error::Json { path: path.to_path_buf(), msg: format!("line {}: {e}", i + 1) })?;
            v["prompt"].as_str().map(str::to_string).ok_or_else(|| Error::config(path, &format!("line {}: prompt", i + 1), "missing or not a string"))?
        } else {
            line.to_string()
        };
        prompts.push(prompt);
    }
    if prompts.is_empty() {
        return Err(Error::config(path, "prompts", "the calibration file holds no prompt"));
    }
    Ok(prompts)
}

/// Generates an answer to each prompt with `artifact` (a host stand-in) on the host kernels,
/// recording every pass's matmul ranges; returns each matmul weight's widest ranges and a
/// line saying what they were measured on.
pub fn calibrate(artifact: &Path, prompts: &[String], source: &str) -> Result<(Vec<ActivationRange>, String)> {
    let rt = |e: llada_rt::Error| Error::Options(format!("calibrating the NPU's 16-bit activations on the host kernels: {e}"));
    let model = Model::open(artifact, false).map_err(rt)?;
    let text = Text::new(&model.header.tokenizer, &model.header.special).map_err(rt)?;
    let mut session = Session::new(&model).map_err(rt)?;
    let max_seq = model.max_exact_len() as usize;
    let logit_rows = model.header.graphs.iter().map(|g| g.logit_rows as usize).max().unwrap_or(1);
    let gen_len = GEN_LEN.min(logit_rows).min(max_seq / 2).max(1);
    let params = SamplerParams { gen_length: gen_len, block_length: gen_len, steps: STEPS.min(gen_len), ..SamplerParams::default() };
    session.profile_matmul_ranges(true);
    let mut ranges: BTreeMap<u32, MatMulRange> = BTreeMap::new();
    let (mut passes, mut tokens) = (0usize, 0usize);
    for prompt in prompts {
        let chat = model.header.tokenizer.chat_template.is_some();
        let mut ids = if chat { text.encode_chat(prompt) } else { text.encode(prompt) }.map_err(rt)?;
        // A prompt too long for the artifact keeps its end (the part next to the answer).
        let room = max_seq.saturating_sub(gen_len).max(1);
        if ids.len() > room {
            ids.drain(..ids.len() - room);
        }
        llada_rt::generate(&mut session, &ids, &params, &mut |_| {}).map_err(rt)?;
        for pass in session.take_op_profiles() {
            passes += 1;
            tokens += pass.rows;
            for r in pass.ops.matmul_ranges.unwrap_or_default() {
                ranges.entry(r.weight).and_modify(|have| have.widen(&r)).or_insert(r);
            }
        }
    }
    if ranges.is_empty() {
        return Err(Error::Options("calibrating the NPU's 16-bit activations: the host kernels recorded no matmul".into()));
    }
    // Zero inside every range (QNN's encodings hold zero exactly).
    let hold_zero = |r: [f32; 2]| [r[0].min(0.0), r[1].max(0.0)];
    let list = ranges.into_values().map(|r| ActivationRange { weight: r.weight, input: hold_zero(r.input), output: hold_zero(r.output) }).collect();
    Ok((list, format!("{} prompts ({source}), {passes} host passes over {tokens} rows, {gen_len} tokens generated each in {} steps", prompts.len(), params.steps)))
}

#[cfg(test)]
mod tests {
    use super::read_prompts;

    #[test]
    fn a_calibration_file_is_task_lines_or_plain_lines_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c.jsonl");
        std::fs::write(&f, "{\"prompt\": \"FILL:12=\", \"expected\": \"1\"}\n\nplain text prompt\n").unwrap();
        assert_eq!(read_prompts(&f).unwrap(), ["FILL:12=", "plain text prompt"]);
        std::fs::write(&f, "{\"prompt\": 3}\n").unwrap();
        let e = read_prompts(&f).unwrap_err().to_string();
        assert!(e.contains("c.jsonl") && e.contains("line 1: prompt"), "{e}");
        std::fs::write(&f, "\n  \n").unwrap();
        assert!(read_prompts(&f).unwrap_err().to_string().contains("no prompt"));
        let e = read_prompts(&dir.path().join("missing.jsonl")).unwrap_err().to_string();
        assert!(e.contains("missing.jsonl"), "{e}");
    }
}
