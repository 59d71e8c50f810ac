//! Double Elias–Fano (spec §8): the cumulative key counts λ and Rice bit offsets σ of all
//! buckets, compressed together. (Skeleton: being implemented.)

use super::words::{WordReader, WordWriter};
use crate::error::Result;

/// λ_i (keys before bucket i) and σ_i (bit offset of bucket i in R) for i in 0..=B.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubleEliasFano {
    lambda: Vec<u64>,
    sigma: Vec<u64>,
}

impl DoubleEliasFano {
    /// Builds from `cum_keys` (λ) and `bit_pos` (σ), both of length `B+1`, nondecreasing,
    /// starting at 0.
    pub fn new(cum_keys: &[u64], bit_pos: &[u64]) -> Self {
        DoubleEliasFano { lambda: cum_keys.to_vec(), sigma: bit_pos.to_vec() }
    }
    /// Number of buckets B.
    pub fn num_buckets(&self) -> u64 {
        self.lambda.len() as u64 - 1
    }
    /// `(λ_i, λ_{i+1}, σ_i)` for `i < B`.
    #[inline]
    pub fn get(&self, i: u64) -> (u64, u64, u64) {
        let i = i as usize;
        (self.lambda[i], self.lambda[i + 1], self.sigma[i])
    }
    /// Prefetches the lines `get(i)` reads first.
    #[inline]
    pub fn prefetch(&self, _i: u64) {}
    /// Size in bits.
    pub fn size_bits(&self) -> u64 {
        (self.lambda.len() + self.sigma.len()) as u64 * 64
    }
    /// Serializes.
    pub fn write(&self, w: &mut WordWriter) {
        w.u64(self.lambda.len() as u64);
        w.words(&self.lambda);
        w.words(&self.sigma);
    }
    /// Deserializes (zero-copy where possible), validating structure.
    pub fn read(r: &mut WordReader) -> Result<Self> {
        let n = r.bounded("ef len", 1 << 40)?;
        let lambda = r.words(n, "lambda")?.to_vec();
        let sigma = r.words(n, "sigma")?.to_vec();
        Ok(DoubleEliasFano { lambda, sigma })
    }
}
