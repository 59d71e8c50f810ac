//! Queries (spec §9): one key, or a batch with software prefetching.
//!
//! A query hashes the key, reads `(λ_i, λ_{i+1}, σ_i)` of its bucket from the Elias–Fano, then
//! walks the bucket's tree: at each level it reads one descriptor, hashes once to pick the
//! child, and skips the fixed bits and unary terminators of the siblings before it (spec §7.5).
//!
//! The batched form ([`Mphf::index_batch`]) runs the lookups of a batch in groups of [`GROUP`]
//! keys, stage by stage (hash, Elias–Fano, Rice, tree walk), prefetching each stage's lines for
//! the whole group before reading them, so the cache misses of independent keys overlap instead
//! of queuing.

use super::bits::prefetch;
use super::hash::{bucket_of, range_h32, Hash128, Key, SEED_AGG1, SEED_AGG2, SEED_LEAF, START_SEEDS};
use super::memo::Memo;
use super::mphf::Mphf;
use super::rice::RiceCursor;
use super::tree::{lower_aggr, split_left, upper_aggr};

/// Keys per group of the batched query (see [`Mphf::index_batch_with`]).
const GROUP: usize = 128;

/// One in-flight lookup of the batched query.
#[derive(Clone, Copy, Default)]
struct InFlight {
    lo: u64,
    bucket: u64,
    cum: u64,
    size: u64,
    pos: u64,
}

impl Mphf {
    /// The value in `0..n` of `key` (n = 0: 0).
    ///
    /// Keys outside the build set get an arbitrary value; the column index verifies membership.
    ///
    /// # Panics
    /// In debug builds, if `K`'s hashing scheme differs from the one the MPHF was built with.
    #[inline]
    pub fn index<K: Key + ?Sized>(&self, key: &K) -> u64 {
        debug_assert_eq!(
            K::KIND,
            self.hash_kind,
            "key type hashes differently from the build keys"
        );
        self.index_hash(key.hash128(self.seed))
    }

    /// The value of a key given its 128-bit hash under [`Mphf::seed`].
    #[inline]
    pub fn index_hash(&self, h: Hash128) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let bucket = bucket_of(h.hi, self.num_buckets);
        let (cum, next, pos) = self.ef.get(bucket);
        self.walk(h.lo, cum, next - cum, pos)
    }

    /// Values of many keys; `out[i]` = `index(keys[i])`. Interleaves the lookups (see module docs).
    pub fn index_batch<K: Key>(&self, keys: &[K], out: &mut [u64]) {
        assert_eq!(
            keys.len(),
            out.len(),
            "index_batch: {} keys but {} outputs",
            keys.len(),
            out.len()
        );
        self.index_batch_with(keys.len(), |i| keys[i].hash128(self.seed), out);
    }

    /// Batched query over keys given by a hash function of their position: `out[i]` =
    /// `index_hash(hash_at(i))`. This is the entry point for Arrow arrays.
    pub fn index_batch_with(&self, len: usize, hash_at: impl Fn(usize) -> Hash128, out: &mut [u64]) {
        if empty_batch(self.n, len, out) {
            return;
        }
        // Wide batches: each dependent memory access of a lookup (EF lower bits and jump entry
        // → EF upper arrays → Rice bits) is prefetched for a whole group of keys before any of
        // them is read, so the cache misses of the group overlap instead of queuing. The group's
        // lines (about five per key) stay within L2.
        let mut group = [InFlight::default(); GROUP];
        for start in (0..len).step_by(GROUP) {
            let n = GROUP.min(len - start);
            let group = &mut group[..n];
            for (j, e) in group.iter_mut().enumerate() {
                let h = hash_at(start + j);
                let bucket = bucket_of(h.hi, self.num_buckets);
                self.ef.prefetch(bucket);
                *e = InFlight {
                    lo: h.lo,
                    bucket,
                    ..InFlight::default()
                };
            }
            for e in group.iter() {
                self.ef.prefetch_upper(e.bucket);
            }
            let words = self.rice.words.as_ptr();
            for e in group.iter_mut() {
                let (cum, next, pos) = self.ef.get(e.bucket);
                let size = next.wrapping_sub(cum);
                prefetch(words.wrapping_add((pos / 64) as usize));
                let fixed = pos + self.memo.skip.get(size as usize).copied().unwrap_or(0) as u64;
                prefetch(words.wrapping_add((fixed / 64) as usize));
                (e.cum, e.size, e.pos) = (cum, size, pos);
            }
            for (j, e) in group.iter().enumerate() {
                out[start + j] = self.walk(e.lo, e.cum, e.size, e.pos);
            }
        }
    }

    #[inline(always)]
    fn walk(&self, lo: u64, cum: u64, m: u64, pos: u64) -> u64 {
        if m <= 1 {
            return cum;
        }
        let m = m as usize;
        let cur = RiceCursor::new(&self.rice.words, pos, pos + self.memo.skip[m] as u64);
        walk_any(self.memo, self.params.rotation, lo, cum, m, cur)
    }
}

/// The start of a batched query of `len` keys into `out`: checks `out` is long enough; true
/// (with `out` zeroed) when the MPHF has no keys, so there is nothing to walk.
#[inline]
pub(crate) fn empty_batch(n: u64, len: usize, out: &mut [u64]) -> bool {
    assert!(
        out.len() >= len,
        "index_batch_with: {len} keys but {} outputs",
        out.len()
    );
    if n == 0 {
        out[..len].fill(0);
    }
    n == 0
}

/// [`walk_with`] for the leaf size of `memo` (the const parameter chosen at run time), from a
/// bucket of `m ≥ 2` keys.
#[inline(always)]
pub(crate) fn walk_any<C: Descriptors>(memo: &Memo, rotation: bool, lo: u64, cum: u64, m: usize, cur: C) -> u64 {
    macro_rules! dispatch {
        ($($l:literal)*) => {
            match memo.leaf {
                $($l => walk_with::<$l, C>(memo, rotation, lo, cum, m, cur),)*
                other => unreachable!("leaf size {other} passed validation"),
            }
        };
    }
    dispatch!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
}

/// Where a tree walk reads its descriptors: the Golomb–Rice codes ([`RiceCursor`]) or a
/// decoded copy ([`FlatCursor`](super::flat::FlatCursor)).
pub(crate) trait Descriptors {
    /// The next descriptor in preorder, of a subtree root with Rice parameter `tau`.
    fn read(&mut self, tau: u32) -> u64;
    /// Skips whole subtrees holding `nodes` descriptors and `fixed_bits` fixed-part bits.
    fn skip(&mut self, nodes: u64, fixed_bits: u64);
}

impl Descriptors for RiceCursor<'_> {
    #[inline(always)]
    fn read(&mut self, tau: u32) -> u64 {
        RiceCursor::read(self, tau)
    }
    #[inline(always)]
    fn skip(&mut self, nodes: u64, fixed_bits: u64) {
        RiceCursor::skip(self, nodes, fixed_bits)
    }
}

/// The tree walk of spec §9 for leaf size `L`: from a bucket of `m` keys whose first value is
/// `cum`, down to the key's leaf, reading descriptors from `cur`.
#[inline(always)]
pub(crate) fn walk_with<const L: usize, C: Descriptors>(
    memo: &Memo,
    rotation: bool,
    lo: u64,
    mut cum: u64,
    mut m: usize,
    mut cur: C,
) -> u64 {
    let a1 = lower_aggr(L);
    let a2 = upper_aggr(L);
    let mut depth = 0usize;
    while m > a2 {
        let d = cur.read(memo.tau[m] as u32);
        let left = split_left(m, a2);
        if (range_h32(lo.wrapping_add(START_SEEDS[depth]).wrapping_add(d), m as u32) as usize) < left {
            m = left;
        } else {
            cur.skip(memo.nodes[left] as u64, memo.skip[left] as u64);
            cum += left as u64;
            m -= left;
        }
        depth += 1;
    }
    if m > a1 {
        let d = cur.read(memo.tau[m] as u32);
        let j = range_h32(lo.wrapping_add(SEED_AGG2).wrapping_add(d), m as u32) as usize / a1;
        if j > 0 {
            cur.skip(j as u64 * memo.nodes[a1] as u64, j as u64 * memo.skip[a1] as u64);
            cum += (j * a1) as u64;
        }
        m = a1.min(m - j * a1);
    }
    if m > L {
        let d = cur.read(memo.tau[m] as u32);
        let j = range_h32(lo.wrapping_add(SEED_AGG1).wrapping_add(d), m as u32) as usize / L;
        if j > 0 {
            cur.skip(j as u64, j as u64 * memo.skip[L] as u64);
            cum += (j * L) as u64;
        }
        m = L.min(m - j * L);
    }
    if m <= 1 {
        return cum;
    }
    let d = cur.read(memo.tau[m] as u32);
    let v = if rotation && m == L {
        let r = d % L as u64;
        let v = range_h32(lo.wrapping_add(SEED_LEAF).wrapping_add(d - r), L as u32) as u64;
        if lo & 1 == 1 {
            (v + r) % L as u64
        } else {
            v
        }
    } else {
        range_h32(lo.wrapping_add(SEED_LEAF).wrapping_add(d), m as u32) as u64
    };
    cum + v
}
