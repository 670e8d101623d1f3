//! The DiffusionGemma sampler fixture (`testdata/diffusion_gemma_sampler.json`, written by
//! `tools/diffusion_gemma/sampler_fixture.py` with the published code), loaded once for tests.

use std::sync::OnceLock;

pub(crate) fn fixture() -> &'static serde_json::Value {
    static FIXTURE: OnceLock<serde_json::Value> = OnceLock::new();
    FIXTURE.get_or_init(|| serde_json::from_str(include_str!("testdata/diffusion_gemma_sampler.json")).expect("fixture parses"))
}

/// Floats stored as the hex of their bits, 8 digits each, back to the same bits.
pub(crate) fn parse_hex_f32(hex: &str) -> Vec<f32> {
    assert_eq!(hex.len() % 8, 0, "8 hex digits per float");
    (0..hex.len() / 8).map(|i| f32::from_bits(u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).expect("hex"))).collect()
}

/// A JSON array of integers as `u32`s.
pub(crate) fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("integer") as u32).collect()
}
