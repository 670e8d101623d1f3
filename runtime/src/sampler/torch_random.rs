//! PyTorch's CPU random stream, draw for draw: what `torch.manual_seed(seed)` followed by
//! `torch.randint` and `torch.multinomial` produce on the CPU, so that DiffusionGemma's
//! published sampler can be replayed exactly (`--rng torch`).
//!
//! What PyTorch does (ATen's `CPUGeneratorImpl`, `core/DistributionsHelper.h`,
//! `native/cpu/DistributionTemplates.h`, `native/Distributions.cpp`; each point checked against
//! torch 2.15 by `tools/diffusion_gemma/sampler_fixture.py` and the tests below):
//! - the engine is a standard MT19937 seeded with `seed mod 2^32` (`manual_seed` takes any
//!   64-bit seed; the high half is dropped), its first output being the first after the twist;
//! - `random64` is two outputs, the first the high half;
//! - `randint(low, high)` draws one value per element in row-major order: `low + u32 % range`
//!   when `range < 2^28`, else `low + random64 % range` (modulo bias and all);
//! - `multinomial(p, 1)` (one sample, any row count) is `argmax(p / q)` per row, with `q` a
//!   tensor like `p` (float32) filled in row-major order with `Exp(1)` draws, each
//!   `-log1p(-u)` in double from `u = (random64 & (2^53 - 1)) * 2^-53` and then rounded to
//!   float; `p / q` is a float32 division and `argmax` takes the first maximum (a NaN, from
//!   `0 / 0`, counts as the maximum). So every element costs two draws, zero probabilities
//!   included.

/// MT19937's state size, in words.
const N: usize = 624;
/// MT19937's middle offset.
const M: usize = 397;
const MATRIX_A: u32 = 0x9908_b0df;
const UPPER: u32 = 0x8000_0000;
const LOWER: u32 = 0x7fff_ffff;
/// `randint` uses one 32-bit draw below this range, a 64-bit one from it on.
const RANDINT_64_BIT_RANGE: u64 = 1 << 28;
/// 53 random bits make a double in [0, 1).
const MANTISSA_53: u64 = (1 << 53) - 1;

/// PyTorch's CPU generator (`at::CPUGeneratorImpl` over `at::mt19937`).
#[derive(Clone)]
pub(crate) struct TorchGenerator {
    state: Box<[u32; N]>,
    /// Next word of `state` to temper; `N` means the state must be twisted first.
    next: usize,
}

impl TorchGenerator {
    /// The generator after `torch.manual_seed(seed)` (for any seed PyTorch accepts, negative
    /// ones as their two's complement).
    pub(crate) fn manual_seed(seed: u64) -> TorchGenerator {
        let mut state = Box::new([0u32; N]);
        state[0] = seed as u32;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        TorchGenerator { state, next: N }
    }

    fn twist(&mut self) {
        let s = &mut self.state;
        for i in 0..N {
            let y = (s[i] & UPPER) | (s[(i + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX_A } else { 0 };
            s[i] = s[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.next = 0;
    }

    /// The next 32-bit output (`generator->random()`).
    pub(crate) fn random_u32(&mut self) -> u32 {
        if self.next == N {
            self.twist();
        }
        let mut y = self.state[self.next];
        self.next += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// Two outputs, the first one high (`generator->random64()`).
    pub(crate) fn random_u64(&mut self) -> u64 {
        let high = self.random_u32() as u64;
        (high << 32) | self.random_u32() as u64
    }

    /// One `randint` value in `[low, high)`.
    pub(crate) fn randint_one(&mut self, low: i64, high: i64) -> i64 {
        let range = high.wrapping_sub(low) as u64;
        debug_assert!(high > low, "randint needs low < high");
        let offset = if range < RANDINT_64_BIT_RANGE { self.random_u32() as u64 % range } else { self.random_u64() % range };
        low.wrapping_add(offset as i64)
    }

    /// `torch.randint(low, high, (out.len(),))` into `out`.
    #[cfg(test)]
    pub(crate) fn randint(&mut self, low: i64, high: i64, out: &mut [i64]) {
        for o in out {
            *o = self.randint_one(low, high);
        }
    }

    /// `torch.randint(0, high, ...)` as token ids (a canvas).
    pub(crate) fn randint_tokens(&mut self, high: u32, out: &mut [u32]) {
        for o in out {
            *o = self.randint_one(0, high as i64) as u32;
        }
    }

    /// The `u` of one `Exp(1)` draw: PyTorch's `uniform_real_distribution<double>(0, 1)`.
    #[cfg(test)]
    fn uniform_f64(&mut self) -> f64 {
        (self.random_u64() & MANTISSA_53) as f64 * f64::from_bits(0x3ca0_0000_0000_0000) // 2^-53
    }

    /// `torch.multinomial(probs.view(-1, vocab), 1)`: one index per row of `vocab` float32
    /// probabilities (unnormalised ones too, as PyTorch allows), into `picks`.
    #[cfg(test)]
    pub(crate) fn multinomial_one(&mut self, probs: &[f32], vocab: usize, picks: &mut [u32]) {
        assert_eq!(probs.len(), vocab * picks.len(), "probs must be picks.len() rows of vocab");
        for (row, pick) in probs.chunks_exact(vocab).zip(picks.iter_mut()) {
            let mut best = FirstMax::default();
            for (i, &p) in row.iter().enumerate() {
                let u = self.uniform_f64();
                best.offer(i, ratio(p, u));
            }
            *pick = best.index as u32;
        }
    }

    /// [`multinomial_one`](Self::multinomial_one) with the rows' arithmetic spread over the
    /// rayon pool: the draws stay serial (one MT19937), in batches of rows held as raw 64-bit
    /// words, and each batch's rows are then reduced in parallel. Same picks, same state after.
    pub(crate) fn multinomial_one_par(&mut self, probs: &[f32], vocab: usize, picks: &mut [u32]) {
        use rayon::prelude::*;
        assert_eq!(probs.len(), vocab * picks.len(), "probs must be picks.len() rows of vocab");
        let batch = rayon::current_num_threads().max(1) * 2;
        let mut words = vec![0u64; batch * vocab];
        for (rows, picks) in probs.chunks(batch * vocab).zip(picks.chunks_mut(batch)) {
            let words = &mut words[..rows.len()];
            for w in words.iter_mut() {
                *w = self.random_u64();
            }
            rows.par_chunks(vocab).zip(words.par_chunks(vocab)).zip(picks.par_iter_mut()).for_each(|((row, words), pick)| {
                let mut best = FirstMax::default();
                for (i, (&p, &w)) in row.iter().zip(words).enumerate() {
                    best.offer(i, ratio(p, (w & MANTISSA_53) as f64 * f64::from_bits(0x3ca0_0000_0000_0000)));
                }
                *pick = best.index as u32;
            });
        }
    }
}

/// `-log1p(-u)` in double, stored as float (PyTorch's CPU `exponential` transformation).
fn exponential_of(u: f64) -> f32 {
    (-1.0 * (-u).ln_1p()) as f32
}

/// `p / q` in float32 for the draw `u`. A zero probability gives 0 whatever `q` is, except
/// for `u == 0` (then `q == 0` and PyTorch's `0 / 0` is NaN): the logarithm is skipped for it.
fn ratio(p: f32, u: f64) -> f32 {
    if p == 0.0 && u != 0.0 && !p.is_sign_negative() {
        0.0
    } else {
        p / exponential_of(u)
    }
}

/// The first maximum, NaN above everything (PyTorch's CPU `argmax`).
#[derive(Default)]
struct FirstMax {
    index: usize,
    value: Option<f32>,
}

impl FirstMax {
    fn offer(&mut self, index: usize, value: f32) {
        let better = match self.value {
            None => true,
            Some(best) => !best.is_nan() && (value.is_nan() || value > best),
        };
        if better {
            self.index = index;
            self.value = Some(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::dg_fixture::{fixture, parse_hex_f32};

    #[test]
    fn mt19937_matches_the_reference_sequence() {
        // The C++ standard's check: the 10000th output of a default-seeded (5489) mt19937.
        let mut g = TorchGenerator::manual_seed(5489);
        let tenth_thousand = (0..10_000).map(|_| g.random_u32()).last();
        assert_eq!(tenth_thousand, Some(4_123_659_995));
    }

    #[test]
    fn first_outputs_match_torch_for_every_seed_width() {
        for case in fixture()["streams"]["u32"].as_array().unwrap() {
            let seed: u64 = case["seed"].as_str().unwrap().parse().unwrap();
            let mut g = TorchGenerator::manual_seed(seed);
            let ours: Vec<u64> = (0..16).map(|_| g.random_u32() as u64).collect();
            let theirs: Vec<u64> = case["values"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert_eq!(ours, theirs, "seed {seed}");
        }
    }

    #[test]
    fn randint_matches_torch_on_both_sides_of_the_64_bit_range() {
        for case in fixture()["streams"]["randint"].as_array().unwrap() {
            let seed: u64 = case["seed"].as_str().unwrap().parse().unwrap();
            let high = case["high"].as_i64().unwrap();
            let mut g = TorchGenerator::manual_seed(seed);
            let mut ours = vec![0i64; 16];
            g.randint(0, high, &mut ours);
            let theirs: Vec<i64> = case["values"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
            assert_eq!(ours, theirs, "seed {seed}, high {high}");
            // The same number of draws: the next output agrees.
            assert_eq!(g.random_u32() as u64, case["next_u32"].as_u64().unwrap(), "seed {seed}, high {high}");
        }
    }

    /// The fixture's real-vocabulary rows: an unnormalised hash below 2^24, every third zero.
    fn formula_probs(rows: usize, vocab: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(rows * vocab);
        for r in 0..rows as u64 {
            out.extend((0..vocab as u64).map(|i| {
                let h = (i.wrapping_mul(2_654_435_761) + r * 40_503 + 12_345) % (1 << 32) >> 8;
                if i % 3 == 2 { 0.0 } else { h as f32 }
            }));
        }
        out
    }

    #[test]
    fn multinomial_matches_torch_serial_and_parallel() {
        for case in fixture()["streams"]["multinomial"].as_array().unwrap() {
            let (rows, vocab) = (case["rows"].as_u64().unwrap() as usize, case["vocab"].as_u64().unwrap() as usize);
            let probs = match case.get("probs") {
                Some(bits) => parse_hex_f32(bits.as_str().unwrap()),
                None => formula_probs(rows, vocab),
            };
            let theirs: Vec<u32> = case["picks"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
            let seed = case["seed"].as_u64().unwrap();
            for parallel in [false, true] {
                let mut g = TorchGenerator::manual_seed(seed);
                let mut picks = vec![0u32; rows];
                if parallel {
                    g.multinomial_one_par(&probs, vocab, &mut picks);
                } else {
                    g.multinomial_one(&probs, vocab, &mut picks);
                }
                assert_eq!(picks, theirs, "seed {seed}, vocab {vocab}, parallel {parallel}");
                assert_eq!(g.random_u32() as u64, case["next_u32"].as_u64().unwrap(), "draw count, vocab {vocab}");
            }
        }
    }

    #[test]
    fn zero_probabilities_lose_unless_everything_is_zero() {
        let mut g = TorchGenerator::manual_seed(1);
        let mut picks = [0u32; 200];
        let probs: Vec<f32> = (0..200).flat_map(|_| [0.0, 0.25, 0.0, 0.75]).collect();
        g.multinomial_one(&probs, 4, &mut picks);
        assert!(picks.iter().all(|&p| p == 1 || p == 3));
        let ones = picks.iter().filter(|&&p| p == 1).count();
        assert!((30..70).contains(&ones), "{ones} of 200 picked the 0.25 token");
    }
}
