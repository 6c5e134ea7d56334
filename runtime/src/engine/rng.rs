//! Counter-based random numbers for sampling: the draw for token `i` of a request is a pure function
//! of `(seed, i)`, so seeded sampling is the same whatever else shares the batch, after preemption
//! (recomputation) and after a restore from a checkpoint. The whole RNG state is the pair
//! [`SampleRng`] `{ seed, counter }`, which a snapshot stores as two integers.
//!
//! Design: SplitMix64's finalizer (Steele, Lea, Flood 2014) applied to a Weyl sequence keyed by the
//! seed, twice, as in counter-based generators (Salmon et al., "Parallel random numbers: as easy as
//! 1, 2, 3", 2011). Statistical quality is ample for choosing one token per draw.

/// Random stream of one request: `seed` chosen at submit, `counter` = draws taken so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRng {
    /// The request's seed.
    pub seed: u64,
    /// Draws taken so far (the position in the stream).
    pub counter: u64,
}

pub use crate::model::random::bits_at;

impl SampleRng {
    /// A stream at the start of `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed, counter: 0 }
    }

    /// A uniform number in [0, 1) (53 random bits), advancing the counter.
    pub fn next_uniform(&mut self) -> f64 {
        self.next_bits() as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// The next draw's 53 random bits (the uniform number times `2^53`), advancing the counter.
    pub fn next_bits(&mut self) -> u64 {
        let bits = self.peek_bits();
        self.counter += 1;
        bits
    }

    /// The 53 random bits the next draw will take, without taking them.
    pub fn peek_bits(&self) -> u64 {
        bits_at(self.seed, self.counter) >> 11
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_and_counter_give_same_draw() {
        let mut a = SampleRng::new(7);
        let draws: Vec<f64> = (0..5).map(|_| a.next_uniform()).collect();
        let mut b = SampleRng {
            seed: 7,
            counter: 3,
        };
        assert_eq!(b.next_uniform(), draws[3]);
        assert_ne!(draws[0], draws[1]);
        assert_ne!(SampleRng::new(8).next_uniform(), draws[0]);
    }

    #[test]
    fn uniform_is_roughly_uniform() {
        // 10 equal bins over 100k draws: each bin within 3% of its expectation.
        let mut rng = SampleRng::new(12345);
        let mut bins = [0usize; 10];
        let n = 100_000;
        for _ in 0..n {
            let u = rng.next_uniform();
            assert!((0.0..1.0).contains(&u));
            bins[(u * 10.0) as usize] += 1;
        }
        for b in bins {
            assert!((b as f64 - 10_000.0).abs() < 300.0, "bins {bins:?}");
        }
        // Consecutive seeds are not correlated in their first draw.
        let mean: f64 = (0..10_000)
            .map(|s| SampleRng::new(s).next_uniform())
            .sum::<f64>()
            / 10_000.0;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
    }
}
