//! [`FlatMphf`]: a decoded, fixed-width copy of an MPHF's descriptors for fast in-memory
//! queries, with exactly the values of [`Mphf::index`].
//!
//! Why: a query of the compact form (spec §9) spends most of its time decoding. The Double
//! Elias–Fano scans up to a sampled position for λ and σ of the bucket, and the tree walk reads
//! Golomb–Rice codes and skips sibling subtrees by selecting unary terminators (measurements:
//! benches/RESULTS.md, "Where the planner's thresholds and device crossovers come from"). The
//! operators that query once per input row (GROUP BY and JOIN on keys without a dense table,
//! strings above all) pay that decoding per row. Here every bucket's first value and first
//! descriptor are stored plainly, and the descriptors in preorder as `u32`: the walk reads
//! `desc[i]` where the compact form decodes, and skips a run of subtrees by adding their
//! descriptor count (`Memo::nodes`) to `i`. The hashing and the walk's decisions are the shared
//! code of [`query`](super::query), so the values are the MPHF's by construction (the tests also
//! compare every key).
//!
//! # Invariants
//! - `buckets[2b]` = λ_b (first value of bucket b), `buckets[2b + 1]` = index in `desc` of its
//!   first descriptor, for b in 0..=B (entry B closes the last bucket).
//! - `desc` holds the descriptors of all buckets in bucket order, each bucket's in the preorder
//!   of its tree (spec §7.5), `Memo::nodes[size]` per bucket.
//! - Built only when every descriptor fits in `u32` (always in practice below ℓ = 20; the
//!   constructor returns `None` otherwise). Not persisted: derived from the MPHF in one pass.
//! - Costs 16 bytes per bucket plus 4 per descriptor: at ℓ = 8, b = 100 about 17.8 descriptors
//!   per bucket of 100 keys (Poisson sizes), 0.87 bytes per key.

use rayon::prelude::*;

use super::bits::prefetch;
use super::hash::{bucket_of, Hash128};
use super::memo::Memo;
use super::mphf::Mphf;
use super::query::{empty_batch, walk_any, Descriptors};
use super::rice::RiceCursor;
use super::tree::children;

/// Keys per group of the batched query (prefetches of a group overlap).
const GROUP: usize = 64;
/// Buckets decoded per parallel task.
const BUCKETS_PER_TASK: usize = 4096;

/// A decoded copy of an [`Mphf`]'s Elias–Fano and Golomb–Rice parts (see the module docs).
#[derive(Debug, Clone)]
pub struct FlatMphf {
    rotation: bool,
    n: u64,
    num_buckets: u64,
    memo: &'static Memo,
    /// (λ_b, first descriptor of b) for b in 0..=B, interleaved.
    buckets: Vec<u64>,
    /// All descriptors, bucket by bucket, each bucket in preorder.
    desc: Vec<u32>,
}

/// Reads descriptors from the decoded array.
pub(crate) struct FlatCursor<'a> {
    desc: &'a [u32],
    next: usize,
}

impl Descriptors for FlatCursor<'_> {
    #[inline(always)]
    fn read(&mut self, _tau: u32) -> u64 {
        let d = self.desc[self.next];
        self.next += 1;
        d as u64
    }
    #[inline(always)]
    fn skip(&mut self, nodes: u64, _fixed_bits: u64) {
        self.next += nodes as usize;
    }
}

/// Appends the descriptors of a subtree of `m` keys, in preorder, read from `cur`; false when
/// one does not fit in `u32`.
fn decode_subtree(memo: &Memo, m: usize, cur: &mut RiceCursor<'_>, out: &mut Vec<u32>) -> bool {
    if m <= 1 {
        return true;
    }
    let Ok(d) = u32::try_from(cur.read(memo.tau[m] as u32)) else {
        return false;
    };
    out.push(d);
    if m <= memo.leaf {
        return true;
    }
    let mut parts = [0usize; 9];
    let fanout = children(m, memo.leaf, &mut parts);
    parts[..fanout].iter().all(|&k| decode_subtree(memo, k, cur, out))
}

impl FlatMphf {
    /// Decodes `mphf` (all cores); `None` when a descriptor does not fit in `u32`.
    pub fn new(mphf: &Mphf) -> Option<FlatMphf> {
        let memo = mphf.memo;
        let nb = mphf.num_buckets as usize;
        let mut lambda = vec![0u64; nb + 1];
        let mut pos = vec![0u64; nb];
        if mphf.n > 0 {
            lambda[..nb]
                .par_iter_mut()
                .zip(pos.par_iter_mut())
                .enumerate()
                .for_each(|(b, (l, p))| (*l, _, *p) = mphf.ef.get(b as u64));
            lambda[nb] = mphf.n;
        }
        let tasks: Vec<Option<Vec<u32>>> = (0..nb.div_ceil(BUCKETS_PER_TASK))
            .into_par_iter()
            .map(|t| {
                let mut out = Vec::new();
                for b in t * BUCKETS_PER_TASK..((t + 1) * BUCKETS_PER_TASK).min(nb) {
                    let m = (lambda[b + 1] - lambda[b]) as usize;
                    let mut cur = RiceCursor::new(&mphf.rice.words, pos[b], pos[b] + memo.skip[m] as u64);
                    if !decode_subtree(memo, m, &mut cur, &mut out) {
                        return None;
                    }
                }
                Some(out)
            })
            .collect();
        let mut desc = Vec::with_capacity(tasks.iter().flatten().map(Vec::len).sum());
        for t in tasks {
            desc.extend_from_slice(&t?);
        }
        let mut buckets = Vec::with_capacity(2 * (nb + 1));
        let mut first = 0u64;
        for b in 0..=nb {
            buckets.push(lambda[b]);
            buckets.push(first);
            if b < nb {
                first += memo.nodes[(lambda[b + 1] - lambda[b]) as usize] as u64;
            }
        }
        debug_assert_eq!(first as usize, desc.len());
        Some(FlatMphf {
            rotation: mphf.params.rotation,
            n: mphf.n,
            num_buckets: mphf.num_buckets,
            memo,
            buckets,
            desc,
        })
    }

    /// Heap bytes of the decoded copy.
    pub fn size_bytes(&self) -> usize {
        self.buckets.len() * 8 + self.desc.len() * 4
    }

    /// The value of a key given its 128-bit hash (as [`Mphf::index_hash`]).
    #[inline]
    pub fn index_hash(&self, h: Hash128) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let b = bucket_of(h.hi, self.num_buckets) as usize;
        self.walk(h.lo, b)
    }

    /// Values of `len` keys given by their hashes; `out[i]` = `index_hash(hash_at(i))`. Runs
    /// the lookups in groups whose bucket entries and first descriptors are prefetched first.
    pub fn index_batch_with(&self, len: usize, hash_at: impl Fn(usize) -> Hash128, out: &mut [u64]) {
        if empty_batch(self.n, len, out) {
            return;
        }
        let mut lo = [0u64; GROUP];
        let mut bucket = [0usize; GROUP];
        for start in (0..len).step_by(GROUP) {
            let g = GROUP.min(len - start);
            for j in 0..g {
                let h = hash_at(start + j);
                lo[j] = h.lo;
                bucket[j] = bucket_of(h.hi, self.num_buckets) as usize;
                prefetch(self.buckets.as_ptr().wrapping_add(2 * bucket[j]));
            }
            for &b in &bucket[..g] {
                prefetch(self.desc.as_ptr().wrapping_add(self.buckets[2 * b + 1] as usize));
            }
            for j in 0..g {
                out[start + j] = self.walk(lo[j], bucket[j]);
            }
        }
    }

    #[inline(always)]
    fn walk(&self, lo: u64, b: usize) -> u64 {
        let cum = self.buckets[2 * b];
        let m = (self.buckets[2 * b + 2] - cum) as usize;
        if m <= 1 {
            return cum;
        }
        let cur = FlatCursor {
            desc: &self.desc,
            next: self.buckets[2 * b + 1] as usize,
        };
        walk_any(self.memo, self.rotation, lo, cum, m, cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::Key;
    use crate::core::{Builder, Params};

    fn check(params: Params, n: u64) {
        let keys: Vec<u64> = (0..n).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234).collect();
        let mphf = Builder::new(params).build(&keys).unwrap();
        let flat = FlatMphf::new(&mphf).expect("descriptors fit u32");
        let hashes: Vec<Hash128> = keys.iter().map(|k| k.hash128(mphf.seed())).collect();
        let mut batch = vec![u64::MAX; hashes.len()];
        flat.index_batch_with(hashes.len(), |i| hashes[i], &mut batch);
        let mut seen = vec![false; n as usize];
        for (i, &h) in hashes.iter().enumerate() {
            let v = mphf.index_hash(h);
            assert_eq!(flat.index_hash(h), v, "{params:?} key {i}");
            assert_eq!(batch[i], v, "{params:?} key {i} (batch)");
            assert!(!seen[v as usize]);
            seen[v as usize] = true;
        }
        // Non-members land where the compact form puts them too.
        for k in 0..1000u64 {
            let h = (k ^ 0xdead_beef_0000).hash128(mphf.seed());
            assert_eq!(flat.index_hash(h), mphf.index_hash(h));
        }
    }

    #[test]
    fn same_values_as_the_compact_form() {
        for (leaf, bucket, rotation) in [
            (8, 100, false),
            (5, 5, true),
            (2, 7, false),
            (12, 300, true),
            (16, 2000, true),
        ] {
            let params = Params::try_new(leaf, bucket, rotation).unwrap();
            for n in [0u64, 1, 2, 17, 1000, 30_000] {
                if leaf >= 12 && n > 1000 {
                    continue; // slow to build on the CPU
                }
                check(params, n);
            }
        }
    }

    #[test]
    fn size_counts_buckets_and_descriptors() {
        let keys: Vec<u64> = (0..10_000).collect();
        let mphf = Builder::new(Params::DEFAULT).build(&keys).unwrap();
        let flat = FlatMphf::new(&mphf).unwrap();
        let buckets = mphf.num_buckets() as usize;
        assert_eq!(flat.buckets.len(), 2 * (buckets + 1));
        assert!(flat.size_bytes() < 10_000 * 2, "{} bytes", flat.size_bytes());
    }
}
