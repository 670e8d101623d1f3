//! `llada-rt-tools`: what a workstation runs around the runtime library, and the `llada-rt`
//! command line over both. An app links `llada-rt` alone; nothing here is on its path.
//!
//! - [`conformance`]: replays the official LLaDA sampler's golden outputs.
//! - [`golden`]: this project's own regression outputs, produced and replayed.
//! - [`eval`]: accuracy and cost of a decoding policy on a tasks file.
//! - [`roofline`]: this machine's measured peaks and memory bandwidth.
//! - [`bench`]: where a forward pass spends its time, against the roofline.
//! - [`compare`]: how far an artifact's logits and tokens are from a reference artifact's.
//! - [`profile`]: a whole generation's time op by op (`run --op-profile`).

pub mod bench;
pub mod compare;
pub mod conformance;
pub mod eval;
pub mod golden;
pub mod profile;
pub mod roofline;
