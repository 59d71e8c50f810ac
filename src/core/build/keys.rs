//! The key set a build runs over: [`KeySet`] (keys addressed by index, hashed under a seed),
//! its restriction to the distinct keys (deduplicate mode), and the search that tells a truly
//! repeated key from a hash collision after a failed bucket check (spec §2.3–2.4).

use std::fmt::Debug;

use rayon::prelude::*;

use super::try_filled;
use crate::core::hash::{bucket_of, Hash128, Key, KeyHashKind};
use crate::error::{try_with_capacity, Result};

/// A set of keys to build over, addressed by index.
pub trait KeySet: Sync {
    /// Number of keys.
    fn len(&self) -> usize;
    /// True when there are no keys.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// How keys are hashed (stored in the MPHF so queries hash the same way).
    fn hash_kind(&self) -> KeyHashKind;
    /// The 128-bit hash of key `i` under `seed`.
    fn hash128(&self, i: usize, seed: u64) -> Hash128;
    /// True when keys `i` and `j` are equal (used only to tell duplicates from collisions).
    fn keys_equal(&self, i: usize, j: usize) -> bool;
    /// Key `i` for error messages.
    fn describe(&self, i: usize) -> String;
}

impl<K: Key + Sync + PartialEq + Debug> KeySet for [K] {
    fn len(&self) -> usize {
        <[K]>::len(self)
    }
    fn hash_kind(&self) -> KeyHashKind {
        K::KIND
    }
    #[inline]
    fn hash128(&self, i: usize, seed: u64) -> Hash128 {
        self[i].hash128(seed)
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        self[i] == self[j]
    }
    fn describe(&self, i: usize) -> String {
        format!("{:?}", self[i])
    }
}

/// A vector of keys is the slice it holds.
impl<K: Key + Sync + PartialEq + Debug> KeySet for Vec<K> {
    fn len(&self) -> usize {
        <[K]>::len(self)
    }
    fn hash_kind(&self) -> KeyHashKind {
        self.as_slice().hash_kind()
    }
    #[inline]
    fn hash128(&self, i: usize, seed: u64) -> Hash128 {
        self.as_slice().hash128(i, seed)
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        self.as_slice().keys_equal(i, j)
    }
    fn describe(&self, i: usize) -> String {
        self.as_slice().describe(i)
    }
}

/// A key set restricted to some indices of another (the distinct keys after deduplication).
pub(super) struct Subset<'a, K: KeySet + ?Sized> {
    pub(super) inner: &'a K,
    pub(super) keep: &'a [usize],
}

impl<K: KeySet + ?Sized> KeySet for Subset<'_, K> {
    fn len(&self) -> usize {
        self.keep.len()
    }
    fn hash_kind(&self) -> KeyHashKind {
        self.inner.hash_kind()
    }
    #[inline]
    fn hash128(&self, i: usize, seed: u64) -> Hash128 {
        self.inner.hash128(self.keep[i], seed)
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        self.inner.keys_equal(self.keep[i], self.keep[j])
    }
    fn describe(&self, i: usize) -> String {
        self.inner.describe(self.keep[i])
    }
}

/// Indices of the first occurrence of each distinct key, ascending.
pub(super) fn distinct_indices<K: KeySet + ?Sized>(keys: &K, seed: u64) -> Result<Vec<usize>> {
    let mut pairs = try_filled(keys.len(), (Hash128::default(), 0usize), "the key hashes")?;
    pairs
        .par_iter_mut()
        .enumerate()
        .for_each(|(i, p)| *p = (keys.hash128(i, seed), i));
    pairs.par_sort_unstable();
    let mut drop = try_filled(keys.len(), false, "the duplicate marks")?;
    let mut run = 0;
    while run < pairs.len() {
        let mut end = run + 1;
        while end < pairs.len() && pairs[end].0 == pairs[run].0 {
            end += 1;
        }
        // Within a run of equal hashes, drop each key equal to an earlier kept one. Unequal keys
        // with equal 128-bit hashes stay and make the build re-seed.
        for j in run + 1..end {
            let (_, idx) = pairs[j];
            if pairs[run..j].iter().any(|&(_, k)| !drop[k] && keys.keys_equal(k, idx)) {
                drop[idx] = true;
            }
        }
        run = end;
    }
    std::mem::drop(pairs);
    let mut keep = try_with_capacity(keys.len(), || {
        format!("building an MPHF over {} keys: no memory for the kept keys", keys.len())
    })?;
    keep.extend((0..keys.len()).filter(|&i| !drop[i]));
    Ok(keep)
}

/// After a repeated `lo` in `bucket`: the description of a truly repeated key, or `None` for a
/// hash collision between distinct keys (then the caller re-seeds).
pub(super) fn find_duplicate<K: KeySet + ?Sized>(
    keys: &K,
    seed: u64,
    num_buckets: u64,
    bucket: u64,
    lo: u64,
) -> Option<String> {
    let same: Vec<usize> = (0..keys.len())
        .into_par_iter()
        .filter(|&i| {
            let h = keys.hash128(i, seed);
            h.lo == lo && bucket_of(h.hi, num_buckets) == bucket
        })
        .collect();
    for (a, &i) in same.iter().enumerate() {
        for &j in &same[a + 1..] {
            if keys.keys_equal(i, j) {
                return Some(keys.describe(i));
            }
        }
    }
    None
}
