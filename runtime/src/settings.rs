//! Sampler settings given by name, as a server's request body or a Python call gives them:
//! the CLI's flag names with underscores (`gen_len`, `block_len`, `cfg`, `top_p`...). Each
//! value is type-checked here, naming the setting; its range is checked where every front end
//! checks it ([`SamplerParams::validate`]), and a setting the policy does not read is refused
//! as the CLI refuses its flag ([`unused_by_policy`]; another family's only away from its default).

use crate::error::{Error, Result, Setting};
use crate::model::Model;
use crate::params::{unused_by_policy, Alg, EosIds, Limits, Policy, Remasking, Revision, Rng, SamplerParams};

/// A setting's value as a request carries it. A whole number is an `i128`, wide enough for
/// every `u64` (a seed) and every negative `i64` a front end reads, so one range check here
/// refuses what is out of range, whatever the front end's own integer type.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i128),
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
    "t_min",
    "t_max",
    "entropy_bound",
    "stability_threshold",
    "confidence_threshold",
    "eos_ids",
    "rng",
];

/// The setting of `name` (one of [`NAMES`]), for errors that name it as every front end does.
fn setting(name: &str) -> Setting {
    Setting::of_flag(&format!("--{}", name.replace('_', "-"))).expect("every name in NAMES is a setting's flag")
}

fn type_error(name: &str, wanted: &str, v: &Value) -> Error {
    Error::setting(setting(name), format!("expected {wanted}, got {}", v.kind()))
}

/// `given` (a whole number as written) is outside what setting `name` can hold, `0..=max`: one
/// message for every front end, whichever integer type it read the number into.
fn out_of_range(name: &str, given: &str, max: u64) -> Error {
    Error::setting(setting(name), format!("{given} is outside 0..={max}"))
}

/// The largest whole number setting `name` holds (its type's range; `SamplerParams::validate`
/// checks the tighter range of the plan), for [`out_of_range`].
fn most(name: &str) -> u64 {
    match name {
        "seed" => u64::MAX,
        "stable_checks" | "eos_ids" => u64::from(u32::MAX),
        _ => usize::MAX as u64,
    }
}

/// A whole number in `0..=most(name)`. A float too large for any integer type (JSON's
/// `18446744073709551616` is one to a parser without big integers) is a whole number out of
/// range, not a number of the wrong type.
fn whole_up_to(name: &str, v: &Value) -> Result<u64> {
    let max = most(name);
    match v {
        Value::Int(n) => u64::try_from(*n).ok().filter(|n| *n <= max).ok_or_else(|| out_of_range(name, &n.to_string(), max)),
        Value::Float(x) if x.is_finite() && x.fract() == 0.0 && x.abs() >= 2f64.powi(63) => Err(out_of_range(name, &format!("{x:.0}"), max)),
        other => Err(type_error(name, "a whole number", other)),
    }
}

fn whole(name: &str, v: &Value) -> Result<usize> {
    // `most` of every name read here fits a usize.
    whole_up_to(name, v).map(|n| n as usize)
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

/// `None` for the string "none" (DiffusionGemma's settings turned off, as `None` does in the
/// published code; null is "not given", the default), else what `f` makes of the value.
fn off_or<T>(v: &Value, f: impl FnOnce() -> Result<T>) -> Result<Option<T>> {
    if matches!(v, Value::Str(s) if s == "none") { Ok(None) } else { f().map(Some) }
}

/// Token ids: a whole number, a comma-separated string of them, or "none" (no EOS).
fn eos_ids(name: &str, v: &Value) -> Result<EosIds> {
    let list: Vec<u32> = match v {
        Value::Str(s) if s == "none" => Vec::new(),
        Value::Str(s) => s.split(',').map(|t| t.trim().parse::<u32>().map_err(|_| Error::setting(setting(name), format!("'{t}' is not a token id")))).collect::<Result<_>>()?,
        Value::Int(_) => vec![whole_up_to(name, v)? as u32],
        other => return Err(type_error(name, "token ids (\"1,106\") or \"none\"", other)),
    };
    EosIds::new(&list).map_err(|m| Error::setting(setting(name), m))
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
    let gen_length = get("gen_len").map(|v| whole("gen_len", v)).transpose()?;
    let policy = get("policy").map(|v| choice("policy", v, Policy::NAMES, Policy::parse)).transpose()?.unwrap_or(d.policy);
    let block_length = get("block_len").map(|v| whole("block_len", v)).transpose()?;
    let mut p = SamplerParams::for_model(model, gen_length, block_length, policy);
    let gen_length = p.gen_length;
    // A request names any length (OpenAI's `max_tokens`), where the CLI's defaults may not fit:
    // then, and only then, the block is the longest that divides the length (at most the
    // plan's) and the steps the fewest multiple of the blocks at or above the CLI's default.
    let canvases = model.diffusion_gemma().is_some();
    if block_length.is_none() && !canvases && gen_length > 0 && gen_length % p.block_length != 0 {
        p.block_length = (1..=p.block_length.min(gen_length)).rev().find(|b| gen_length % b == 0).unwrap_or(1);
        p.spec_blocks = SamplerParams::for_model(model, Some(gen_length), Some(p.block_length), policy).spec_blocks;
    }
    let blocks = gen_length.checked_div(p.block_length).unwrap_or(1).max(1);
    if get("steps").is_none() && !canvases && p.steps % blocks != 0 {
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
            "seed" => p.seed = whole_up_to(name, v)?,
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
            "stable_checks" => p.stable_checks = whole_up_to(name, v)? as u32,
            "revise_confidence" => p.revise_confidence = number(name, v)? as f32,
            "alg" => p.alg = choice(name, v, Alg::NAMES, Alg::parse)?,
            "eps" => p.eps = number(name, v)?,
            "top_p" => p.top_p = optional(v, || number(name, v))?,
            "top_k" => p.top_k = optional(v, || whole(name, v))?,
            "alg_temp" => p.alg_temp = optional(v, || number(name, v))?,
            "eos_early_stop" => p.eos_early_stop = flag(name, v)?,
            "editing_threshold" => p.editing_threshold = optional(v, || number(name, v).map(|x| x as f32))?,
            "max_post_steps" => p.max_post_steps = whole(name, v)?,
            "t_min" => p.t_min = off_or(v, || number(name, v))?,
            "t_max" => p.t_max = off_or(v, || number(name, v))?,
            "entropy_bound" => p.entropy_bound = number(name, v)?,
            "stability_threshold" => p.stability_threshold = off_or(v, || whole(name, v))?,
            "confidence_threshold" => p.confidence_threshold = off_or(v, || number(name, v))?,
            "eos_ids" => p.eos_ids = eos_ids(name, v)?,
            "rng" => p.rng = choice(name, v, Rng::NAMES, Rng::parse)?,
            _ => unreachable!("every name in NAMES is matched"),
        }
    }
    p.validate(&Limits::of(model))?;
    let was_given = |flag: &str| get(&flag.trim_start_matches("--").replace('-', "_")).is_some();
    if let Some(refusal) = unused_by_policy(&p, &was_given) {
        // Each refusal starts with the flag it refuses: named as that setting (a server's
        // `param`), the words unchanged.
        let (flag, rest) = refusal.split_once(' ').unwrap_or((&refusal, ""));
        return Err(Setting::of_flag(flag).map_or_else(|| Error::request(refusal.clone()), |s| Error::setting(s, rest)));
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

    /// Seeds take every u64; a whole number out of a setting's type range is one message
    /// naming the setting and the range, negative or too large, read as an int or a float.
    #[test]
    fn whole_numbers_out_of_range_name_the_setting_and_its_range() {
        assert_eq!(whole_up_to("seed", &Value::Int(u64::MAX as i128)).unwrap(), u64::MAX);
        assert_eq!(whole_up_to("seed", &Value::Int(1 << 63)).unwrap(), 1 << 63);
        let max = u64::MAX;
        assert_eq!(whole_up_to("seed", &Value::Int(1 << 64)).unwrap_err().to_string(), format!("--seed 18446744073709551616 is outside 0..={max}"));
        assert_eq!(whole_up_to("seed", &Value::Int(-1)).unwrap_err().to_string(), format!("--seed -1 is outside 0..={max}"));
        assert_eq!(whole_up_to("seed", &Value::Float(2f64.powi(64))).unwrap_err().to_string(), format!("--seed 18446744073709551616 is outside 0..={max}"));
        assert_eq!(whole("steps", &Value::Int(-1)).unwrap_err().to_string(), format!("--steps -1 is outside 0..={}", usize::MAX));
        assert_eq!(whole_up_to("stable_checks", &Value::Int(1 << 32)).unwrap_err().to_string(), format!("--stable-checks 4294967296 is outside 0..={}", u32::MAX));
        // A float that is not a whole number stays a number of the wrong type.
        assert_eq!(whole("steps", &Value::Float(2.5)).unwrap_err().to_string(), "--steps expected a whole number, got a number");
    }
}
