//! The embedded model's task family: synthetic, checked automatically, with answers of 64
//! tokens (two blocks of 32) so that block-wise decoding is exercised. The embedded model
//! learns FILL and SHIFT (`TrainConfig::embedded`); the others are kept because they show
//! what a small model on a CPU budget can and cannot learn (see `models/README.md`).
//!
//! - `CUMSUM:<64 digits>=` -> the running sum of the digits mod 10. Each answer digit is the
//!   previous answer digit plus one input digit, so later blocks depend on earlier ones: a
//!   decoder can only be confident about a digit once the digit before it is known.
//! - `PARITY:<64 bits>=` -> the running parity (XOR) of the bits: the same left-to-right
//!   chain as CUMSUM with a four-entry rule instead of a hundred-entry one.
//! - `FILL:<64 digits, half of them 0>=` -> each 0 replaced by the answer digit before it
//!   (0 at the start): a digit after a run of zeros depends on earlier answer digits, across
//!   block boundaries.
//! - `PEAK:<64 digits>=` -> a leaky running maximum, `max(previous - 1, digit)`.
//! - `SHIFT:<64 letters A-P>=` -> each letter moved one place on (P wraps to A): a copy with
//!   an edit, every answer token predictable from the prompt alone, so a decoder may commit
//!   many in one pass.
//!
//! Prompts are single user turns in LLaDA's chat format; the answer is the generated text
//! before the end-of-turn token.

use rand::RngExt;

/// Answer length of every task, in tokens (one byte token per character).
pub const ANSWER_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    CumSum,
    Parity,
    Fill,
    Peak,
    Shift,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::CumSum, Kind::Parity, Kind::Fill, Kind::Peak, Kind::Shift];

    pub fn tag(self) -> &'static str {
        match self {
            Kind::CumSum => "CUMSUM:",
            Kind::Parity => "PARITY:",
            Kind::Fill => "FILL:",
            Kind::Peak => "PEAK:",
            Kind::Shift => "SHIFT:",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.tag().trim_end_matches(':').eq_ignore_ascii_case(s))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub kind: Kind,
    /// The user's message (the chat template is applied around it).
    pub content: String,
    pub answer: String,
}

/// The answer to `kind` applied to `input`.
pub fn solve(kind: Kind, input: &str) -> String {
    match kind {
        Kind::CumSum => {
            let mut sum = 0u32;
            input
                .bytes()
                .map(|b| {
                    sum = (sum + (b - b'0') as u32) % 10;
                    char::from(b'0' + sum as u8)
                })
                .collect()
        }
        Kind::Parity => {
            let mut p = 0u8;
            input
                .bytes()
                .map(|b| {
                    p ^= b - b'0';
                    char::from(b'0' + p)
                })
                .collect()
        }
        Kind::Fill => {
            let mut last = b'0';
            input
                .bytes()
                .map(|b| {
                    if b != b'0' {
                        last = b;
                    }
                    char::from(last)
                })
                .collect()
        }
        Kind::Peak => {
            let mut s = 0u8;
            input
                .bytes()
                .map(|b| {
                    s = s.saturating_sub(1).max(b - b'0');
                    char::from(b'0' + s)
                })
                .collect()
        }
        Kind::Shift => input.bytes().map(|b| char::from(b'A' + (b - b'A' + 1) % 16)).collect(),
    }
}

pub fn sample(kind: Kind, rng: &mut impl RngExt) -> Task {
    let input: String = match kind {
        Kind::CumSum => (0..ANSWER_LEN).map(|_| char::from(b'0' + rng.random_range(0..10u8))).collect(),
        Kind::Parity => (0..ANSWER_LEN).map(|_| char::from(b'0' + rng.random_range(0..2u8))).collect(),
        // Half zeros, so runs of held digits cross block boundaries.
        Kind::Fill => (0..ANSWER_LEN).map(|_| char::from(if rng.random_range(0..2u8) == 0 { b'0' } else { b'0' + rng.random_range(1..10u8) })).collect(),
        Kind::Peak => (0..ANSWER_LEN).map(|_| char::from(b'0' + rng.random_range(0..10u8))).collect(),
        Kind::Shift => (0..ANSWER_LEN).map(|_| char::from(b'A' + rng.random_range(0..16u8))).collect(),
    };
    Task { kind, content: format!("{}{input}=", kind.tag()), answer: solve(kind, &input) }
}

/// The chat template of [`crate::checkpoint::CHAT_TEMPLATE`] applied to one user turn with the
/// generation prompt (what `llada-rt run --chat` renders).
pub fn chat_prompt(content: &str) -> String {
    format!("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(solve(Kind::CumSum, "19534"), "10582");
        assert_eq!(solve(Kind::Shift, "ABOP"), "BCPA");
        assert_eq!(solve(Kind::Parity, "1101001"), "1001110");
        assert_eq!(solve(Kind::Fill, "0305007"), "0335557");
        assert_eq!(solve(Kind::Peak, "0902001"), "0987654");
    }
}
