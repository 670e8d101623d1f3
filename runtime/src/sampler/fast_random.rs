//! The fast random stream (`--rng fast`): the same distributions as the torch stream
//! (`torch_random.rs`), drawn so that rows can be sampled in parallel.
//!
//! PyTorch's stream is one MT19937 consumed in order, and its `multinomial` spends two draws
//! and a logarithm on every vocabulary entry (67M per step at canvas 256, vocabulary 262,144).
//! Here every draw is a pure function of `(seed, purpose, block, step, position)`: Philox4x32-10
//! (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11; the counter-based
//! generator of cuRAND and of PyTorch's CUDA generator) keyed by the seed, with those
//! coordinates as its counter. No state is shared, so a row's draw does not depend on the
//! thread that computes it, on the order rows are computed, or on which other rows exist.
//! - A categorical sample is one uniform per row, inverted through the row's cumulative
//!   probabilities (summed in double): the first entry whose running sum exceeds `u * total`.
//!   Zero-probability entries are never chosen.
//! - A uniform token (canvas noise) is one 64-bit draw mapped onto `[0, vocab)` by a widening
//!   multiply (Lemire), whose bias (below `vocab / 2^64`) is far under anything observable.

use rayon::prelude::*;

/// What a draw is for: separate counters, so no two purposes share a draw.
#[derive(Clone, Copy)]
#[repr(u32)]
pub(crate) enum Purpose {
    /// A row's categorical sample (the denoiser's canvas).
    Sample = 1,
    /// A canvas token's uniform noise (initial canvas and renoising).
    Noise = 2,
}

/// Where a draw belongs: the canvas (block) and its denoising step (`cur_step`; 0 for the
/// initial canvas, whose noise no step has drawn).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StepKey {
    pub(crate) block: u32,
    pub(crate) step: u32,
}

/// The fast stream of one generation (its seed).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FastStream {
    pub(crate) seed: u64,
}

const PHILOX_M0: u32 = 0xd251_1f53;
const PHILOX_M1: u32 = 0xcd9e_8d57;
const PHILOX_W0: u32 = 0x9e37_79b9;
const PHILOX_W1: u32 = 0xbb67_ae85;

/// Philox4x32 with 10 rounds: 128 random bits for a 128-bit counter under a 64-bit key.
pub(crate) fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
        }
        let p0 = PHILOX_M0 as u64 * c[0] as u64;
        let p1 = PHILOX_M1 as u64 * c[2] as u64;
        c = [(p1 >> 32) as u32 ^ c[1] ^ k[0], p1 as u32, (p0 >> 32) as u32 ^ c[3] ^ k[1], p0 as u32];
    }
    c
}

impl FastStream {
    /// 64 random bits for `position` at `at`.
    fn bits(&self, purpose: Purpose, at: StepKey, position: usize) -> u64 {
        let key = [self.seed as u32, (self.seed >> 32) as u32];
        let out = philox4x32_10([position as u32, at.step, at.block, purpose as u32], key);
        ((out[0] as u64) << 32) | out[1] as u64
    }

    /// A uniform double in `[0, 1)` (53 bits).
    pub(crate) fn uniform(&self, purpose: Purpose, at: StepKey, position: usize) -> f64 {
        (self.bits(purpose, at, position) >> 11) as f64 * f64::from_bits(0x3ca0_0000_0000_0000)
    }

    /// One index per row of `vocab` probabilities (unnormalised allowed), row `i` being
    /// canvas position `i`, rows in parallel.
    pub(crate) fn sample_rows(&self, probs: &[f32], vocab: usize, at: StepKey, picks: &mut [u32]) {
        assert_eq!(probs.len(), vocab * picks.len(), "probs must be picks.len() rows of vocab");
        probs.par_chunks(vocab).zip(picks.par_iter_mut()).enumerate().for_each(|(position, (row, pick))| {
            *pick = inverse_cdf(row, self.uniform(Purpose::Sample, at, position)) as u32;
        });
    }

    /// Uniform tokens in `[0, vocab)`, one per canvas position.
    pub(crate) fn random_canvas(&self, vocab: u32, at: StepKey, out: &mut [u32]) {
        for (position, o) in out.iter_mut().enumerate() {
            *o = ((self.bits(Purpose::Noise, at, position) as u128 * vocab as u128) >> 64) as u32;
        }
    }
}

/// The first index whose running sum (in double) exceeds `u` times the row's total; past the
/// end by rounding, the last positive entry.
fn inverse_cdf(row: &[f32], u: f64) -> usize {
    let total: f64 = row.iter().map(|&p| p as f64).sum();
    let target = u * total;
    let mut running = 0.0;
    let mut last_positive = 0;
    for (i, &p) in row.iter().enumerate() {
        if p > 0.0 {
            running += p as f64;
            last_positive = i;
            if running > target {
                return i;
            }
        }
    }
    last_positive
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_random123_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(philox4x32_10([u32::MAX; 4], [u32::MAX; 2]), [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]);
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    /// Pearson's chi-square statistic of `counts` against `expected` (same length).
    fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
        counts.iter().zip(expected).map(|(&c, &e)| (c as f64 - e).powi(2) / e).sum()
    }

    #[test]
    fn samples_follow_the_distribution() {
        // 64 categories with uneven weights (one zero), 200,000 rows sharing them.
        let weights: Vec<f32> = (0..64).map(|i| if i == 5 { 0.0 } else { 1.0 + (i % 7) as f32 }).collect();
        let rows = 200_000;
        let probs: Vec<f32> = (0..rows).flat_map(|_| weights.iter().copied()).collect();
        let mut picks = vec![0u32; rows];
        FastStream { seed: 17 }.sample_rows(&probs, 64, StepKey { block: 0, step: 3 }, &mut picks);
        let mut counts = vec![0u64; 64];
        picks.iter().for_each(|&p| counts[p as usize] += 1);
        assert_eq!(counts[5], 0, "a zero probability was sampled");
        let total: f32 = weights.iter().sum();
        let (counts, expected): (Vec<u64>, Vec<f64>) =
            counts.iter().zip(&weights).filter(|(_, w)| **w > 0.0).map(|(&c, &w)| (c, rows as f64 * (w / total) as f64)).unzip();
        // 62 degrees of freedom: the 99.9th percentile is about 104.
        let stat = chi_square(&counts, &expected);
        assert!(stat < 104.0, "chi-square {stat}");
    }

    #[test]
    fn canvas_noise_is_uniform() {
        let vocab = 50u32;
        let mut counts = vec![0u64; vocab as usize];
        let mut canvas = vec![0u32; 256];
        for step in 0..400 {
            FastStream { seed: 99 }.random_canvas(vocab, StepKey { block: 1, step }, &mut canvas);
            canvas.iter().for_each(|&t| counts[t as usize] += 1);
        }
        let expected = vec![400.0 * 256.0 / vocab as f64; vocab as usize];
        // 49 degrees of freedom: the 99.9th percentile is about 85.
        let stat = chi_square(&counts, &expected);
        assert!(stat < 85.0, "chi-square {stat}");
    }

    #[test]
    fn samples_do_not_depend_on_the_thread_count() {
        let vocab = 1000;
        let probs: Vec<f32> = (0..64 * vocab).map(|i| ((i * 7919) % 1013) as f32 / 1013.0).collect();
        let at = StepKey { block: 2, step: 9 };
        let sample = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut picks = vec![0u32; 64];
            pool.install(|| FastStream { seed: 4 }.sample_rows(&probs, vocab, at, &mut picks));
            picks
        };
        let one = sample(1);
        assert_eq!(one, sample(2));
        assert_eq!(one, sample(5));
        // And a row's pick does not depend on the other rows.
        let mut alone = [0u32; 1];
        FastStream { seed: 4 }.sample_rows(&probs[..vocab], vocab, at, &mut alone);
        assert_eq!(alone[0], one[0]);
    }
}
