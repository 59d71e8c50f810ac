//! Build parameters: leaf size ℓ, expected bucket size b, bijection rotation (spec §0).
//!
//! The parameters are stored in every serialized MPHF; a query uses exactly the values the
//! build used. The variant flags of the spec are fixed in this implementation: `H32` range
//! hashing, `Fixed3` seeds and the `RoundUp` split rule, the combination that the GPU build
//! reproduces byte for byte (spec §10.7).

use crate::error::{MphfError, Result};

/// Smallest supported leaf size ℓ.
pub const MIN_LEAF: usize = 2;
/// Largest supported leaf size ℓ (a leaf's hit mask must fit a `u32`, spec §2.3).
pub const MAX_LEAF: usize = 24;
/// Largest supported expected bucket size b.
pub const MAX_BUCKET: usize = 2000;
/// Hard cap on the keys in one bucket: all memo tables have this many entries (spec §0, §2.3).
pub const MAX_BUCKET_KEYS: usize = 3000;

/// The parameters of one RecSplit MPHF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Params {
    /// Leaf size ℓ in `2..=24`: larger is smaller and slower to build (cost grows ~e^ℓ).
    pub leaf: usize,
    /// Expected keys per bucket b in `1..=2000`: larger is smaller and slower to query.
    pub bucket: usize,
    /// Bijection rotation (spec §5.3): ~ℓ× faster leaf search for ≤0.05 bits/key.
    pub rotation: bool,
}

impl Params {
    /// ≈2.95 bits/key, fastest build and query: ℓ = 5, b = 5.
    pub const FAST: Params = Params {
        leaf: 5,
        bucket: 5,
        rotation: false,
    };
    /// ≈1.80 bits/key, the default trade-off: ℓ = 8, b = 100.
    pub const DEFAULT: Params = Params {
        leaf: 8,
        bucket: 100,
        rotation: false,
    };
    /// ≈1.56 bits/key, slow to build (use the GPU): ℓ = 16, b = 2000, rotation.
    pub const COMPACT: Params = Params {
        leaf: 16,
        bucket: 2000,
        rotation: true,
    };

    /// Creates parameters after checking their ranges.
    ///
    /// # Errors
    /// [`MphfError::InvalidParameter`] when ℓ is outside `2..=24` or b outside `1..=2000`.
    pub fn try_new(leaf: usize, bucket: usize, rotation: bool) -> Result<Self> {
        let p = Params { leaf, bucket, rotation };
        p.validate()?;
        Ok(p)
    }

    /// Checks the ranges of ℓ and b.
    ///
    /// # Errors
    /// [`MphfError::InvalidParameter`] naming the bad value.
    pub fn validate(&self) -> Result<()> {
        if !(MIN_LEAF..=MAX_LEAF).contains(&self.leaf) {
            return Err(MphfError::InvalidParameter(format!(
                "leaf size {} is outside {MIN_LEAF}..={MAX_LEAF}",
                self.leaf
            )));
        }
        if !(1..=MAX_BUCKET).contains(&self.bucket) {
            return Err(MphfError::InvalidParameter(format!(
                "bucket size {} is outside 1..={MAX_BUCKET}",
                self.bucket
            )));
        }
        Ok(())
    }

    /// Number of buckets for `n` keys: `B = max(1, ⌈n/b⌉)` (spec §0).
    pub fn num_buckets(&self, n: u64) -> u64 {
        n.div_ceil(self.bucket as u64).max(1)
    }
}

impl Default for Params {
    fn default() -> Self {
        Params::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert!(Params::try_new(2, 1, false).is_ok());
        assert!(Params::try_new(24, 2000, true).is_ok());
        let e = Params::try_new(25, 100, false).unwrap_err().to_string();
        assert_eq!(e, "invalid parameter: leaf size 25 is outside 2..=24");
        let e = Params::try_new(8, 0, false).unwrap_err().to_string();
        assert_eq!(e, "invalid parameter: bucket size 0 is outside 1..=2000");
        assert!(Params::try_new(1, 5, false).is_err());
        assert!(Params::try_new(8, 2001, false).is_err());
    }

    #[test]
    fn bucket_count() {
        let p = Params::DEFAULT;
        assert_eq!(p.num_buckets(0), 1);
        assert_eq!(p.num_buckets(1), 1);
        assert_eq!(p.num_buckets(100), 1);
        assert_eq!(p.num_buckets(101), 2);
    }
}
