//! Sampler settings given by name, as a server's request body or a Python call gives them:
//! the CLI's flag names with underscores (`gen_len`, `block_len`, `cfg`, `top_p`...). Each
//! value is type-checked here, naming the setting; its range is checked where every front end
//! checks it ([`SamplerParams::validate`]), and a setting the policy does not read is refused
//! as the CLI refuses its flag ([`unused_setting`]).

use crate::error::{Error, Result, Setting};
use crate::model::Model;
use crate::params::{unused_setting, Alg, Limits, Policy, Remasking, Revision, SamplerParams};

/// A setting's value as a request carries it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
}

impl Value {
    /// What the value is, for an error that says what was given.
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) => "a whole number",
            Value::Float(_) => "a number",
            Value::Str(_) => "a string",
        }
    }
}

/// Every setting by name, in the CLI's order (`llada-rt run --help`).
pub const NAMES: &[&str] = &[
    "gen_len",
    "block_len",
    "steps",
    "temperature",
    "seed",
    "cfg",
    "remasking",
    "logits_eos_inf",
    "confidence_eos_eot_inf",
    "policy",
    "refresh_every",
    "threshold",
    "spec_blocks",
    "spec_threshold",
    "rows",
    "revision",
    "side_rows",
    "stable_confidence",
    "stable_checks",
    "revise_confidence",
    "alg",
    "eps",
    "top_p",
    "top_k",
    "alg_temp",
    "eos_early_stop",
    "editing_threshold",
    "max_post_steps",
];

/// The setting of `name` (one of [`NAMES`]), for errors that name it as every front end does.
fn setting(name: &str) -> Setting {
    Setting::of_flag(&format!("--{}", name.replace('_', "-"))).expect("every name in NAMES is a setting's flag")
}

fn type_error(name: &str, wanted: &str, v: &Value) -> Error {
    Error::setting(setting(name), format!("expected {wanted}, got {}", v.kind()))
}

fn whole(name: &str, v: &Value) -> Result<usize> {
    match v {
        Value::Int(n) if *n >= 0 => usize::try_from(*n).map_err(|_| Error::setting(setting(name), format!("{n} is too large"))),
        Value::Int(n) => Err(Error::setting(setting(name), format!("{n} must be a whole number >= 0"))),
        other => Err(type_error(name, "a whole number", other)),
    }
}

fn number(name: &str, v: &Value) -> Result<f64> {
    match v {
        Value::Int(n) => Ok(*n as f64),
        Value::Float(x) => Ok(*x),
        other => Err(type_error(name, "a number", other)),
    }
}

fn flag(name: &str, v: &Value) -> Result<bool> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(type_error(name, "true or false", other)),
    }
}

/// One of `names`, parsed by `parse`.
fn choice<T>(name: &str, v: &Value, names: &[&str], parse: fn(&str) -> Option<T>) -> Result<T> {
    match v {
        Value::Str(s) => parse(s).ok_or_else(|| Error::setting(setting(name), format!("'{s}' is not one of {}", names.join(", ")))),
        other => Err(type_error(name, &format!("one of {}", names.join(", ")), other)),
    }
}

/// `None` for null, else what `f` makes of the value.
fn optional<T>(v: &Value, f: impl FnOnce() -> Result<T>) -> Result<Option<T>> {
    if *v == Value::Null { Ok(None) } else { f().map(Some) }
}

/// The generation `given` asks for on `model`: every setting not given at its default (the
/// CLI's: the block length and the speculation depth from the artifact's plan), each given
/// one type-checked, then every range checked against the plan. An unknown name, a value of
/// the wrong type, one out of range, or one the policy does not read is an error naming it.
pub fn sampler_params(model: &Model, given: &[(impl AsRef<str>, Value)]) -> Result<SamplerParams> {
    let given: Vec<(&str, &Value)> = given.iter().map(|(n, v)| (n.as_ref(), v)).collect();
    for (name, _) in &given {
        if !NAMES.contains(name) {
            return Err(Error::request(format!("unknown setting '{name}'; the settings are {}", NAMES.join(", "))));
        }
    }
    if let Some(dup) = given.iter().enumerate().find(|(i, (n, _))| given[..*i].iter().any(|(m, _)| m == n)) {
        return Err(Error::setting(setting(dup.1.0), "is given twice"));
    }
    // Null is "not given" (OpenAI's clients send `"seed": null`): the default stands.
    let get = |name: &str| given.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).filter(|v| **v != Value::Null);
    let d = SamplerParams::default();
    let gen_length = get("gen_len").map(|v| whole("gen_len", v)).transpose()?.unwrap_or(d.gen_length);
    let policy = get("policy").map(|v| choice("policy", v, Policy::NAMES, Policy::parse)).transpose()?.unwrap_or(d.policy);
    let block_length = get("block_len").map(|v| whole("block_len", v)).transpose()?;
    let mut p = SamplerParams::for_model(model, gen_length, block_length, policy);
    // A request names any length (OpenAI's `max_tokens`), where the CLI's defaults may not fit:
    // then, and only then, the block is the longest that divides the length (at most the
    // plan's) and the steps the fewest multiple of the blocks at or above the CLI's default.
    if block_length.is_none() && gen_length > 0 && gen_length % p.block_length != 0 {
        p.block_length = (1..=p.block_length.min(gen_length)).rev().find(|b| gen_length % b == 0).unwrap_or(1);
        p.spec_blocks = SamplerParams::for_model(model, gen_length, Some(p.block_length), policy).spec_blocks;
    }
    let blocks = gen_length.checked_div(p.block_length).unwrap_or(1).max(1);
    if get("steps").is_none() && p.steps % blocks != 0 {
        p.steps = p.steps.div_ceil(blocks) * blocks;
    }
    for &(name, v) in &given {
        if *v == Value::Null {
            continue;
        }
        match name {
            "gen_len" | "block_len" | "policy" => {}
            "steps" => p.steps = whole(name, v)?,
            "temperature" => p.temperature = number(name, v)?,
            "seed" => p.seed = whole(name, v)? as u64,
            "cfg" => p.cfg_scale = number(name, v)?,
            "remasking" => p.remasking = choice(name, v, Remasking::NAMES, Remasking::parse)?,
            "logits_eos_inf" => p.logits_eos_inf = flag(name, v)?,
            "confidence_eos_eot_inf" => p.confidence_eos_eot_inf = flag(name, v)?,
            "refresh_every" => p.refresh_every = whole(name, v)?,
            "threshold" => p.threshold = optional(v, || number(name, v).map(|x| x as f32))?,
            "spec_blocks" => {
                if let Some(n) = optional(v, || whole(name, v))? {
                    p.spec_blocks = n;
                }
            }
            "spec_threshold" => p.spec_threshold = number(name, v)? as f32,
            "rows" => p.rows = optional(v, || whole(name, v))?,
            "revision" => p.revision = choice(name, v, Revision::NAMES, Revision::parse)?,
            "side_rows" => p.side_rows = optional(v, || whole(name, v))?,
            "stable_confidence" => p.stable_confidence = number(name, v)? as f32,
            "stable_checks" => p.stable_checks = u32::try_from(whole(name, v)?).map_err(|_| Error::setting(setting(name), "is too large"))?,
            "revise_confidence" => p.revise_confidence = number(name, v)? as f32,
            "alg" => p.alg = choice(name, v, Alg::NAMES, Alg::parse)?,
            "eps" => p.eps = number(name, v)?,
            "top_p" => p.top_p = optional(v, || number(name, v))?,
            "top_k" => p.top_k = optional(v, || whole(name, v))?,
            "alg_temp" => p.alg_temp = optional(v, || number(name, v))?,
            "eos_early_stop" => p.eos_early_stop = flag(name, v)?,
            "editing_threshold" => p.editing_threshold = optional(v, || number(name, v).map(|x| x as f32))?,
            "max_post_steps" => p.max_post_steps = whole(name, v)?,
            _ => unreachable!("every name in NAMES is matched"),
        }
    }
    p.validate(&Limits::of(model))?;
    let was_given = |flag: &str| get(&flag.trim_start_matches("--").replace('-', "_")).is_some();
    if let Some(refusal) = unused_setting(&p, was_given) {
        return Err(Error::request(refusal));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_of_the_wrong_type_name_the_setting() {
        assert_eq!(whole("steps", &Value::Str("8".into())).unwrap_err().to_string(), "--steps expected a whole number, got a string");
        assert!(whole("steps", &Value::Int(-1)).unwrap_err().to_string().contains("--steps -1"));
        assert!(number("temperature", &Value::Bool(true)).unwrap_err().to_string().contains("--temperature"));
        let e = choice("policy", &Value::Str("fast".into()), &["exact", "dual"], Policy::parse).err().unwrap().to_string();
        assert!(e.contains("--policy 'fast' is not one of exact, dual"), "{e}");
        for name in NAMES {
            setting(name);
        }
        // Each enum's names are what its `parse` takes, and what `name` gives back.
        for n in Policy::NAMES {
            assert_eq!(Policy::parse(n).map(Policy::name), Some(*n));
        }
        for n in Remasking::NAMES {
            assert_eq!(Remasking::parse(n).map(Remasking::name), Some(*n));
        }
        for n in Revision::NAMES {
            assert_eq!(Revision::parse(n).map(Revision::name), Some(*n));
        }
        for n in Alg::NAMES {
            assert_eq!(Alg::parse(n).map(Alg::name), Some(*n));
        }
        assert_eq!(optional(&Value::Null, || whole("rows", &Value::Null)).unwrap(), None);
    }
}
