//! The build split by bucket ranges, the way the workers of a cluster run it
//! (docs/distributed.md §2), with bytes identical to the single-process build.
//!
//! Why it splits: a key's bucket `⌊hi · B / 2^64⌋` never decreases as `hi` grows, so a range of
//! buckets is a range of hash values; and a bucket's code depends only on its own keys and the
//! seed (spec §3–§7). The double Elias–Fano (spec §8) is the one global part, and it is a
//! function of per-bucket key counts and code lengths. The steps:
//! 1. [`route`]: each input share hashes its keys and hands every `(hi, lo)` to the owner of its
//!    bucket ([`BucketRanges`]).
//! 2. [`sort_part`]: each owner sorts its pairs by bucket and checks its buckets (size cap, no
//!    repeated `lo`). The seed is global, so if any owner's check fails, every owner starts again
//!    with the next seed, exactly as the single build re-seeds; hence both builds try the same seeds.
//! 3. [`solve_part`]: each owner solves and encodes its buckets into a [`Part`] (bucket sizes,
//!    a Rice segment, each bucket's bit offset in it).
//! 4. [`assemble`]: the segments are concatenated in bucket order, prefix sums give λ and σ,
//!    and the double Elias–Fano is built once.
//!
//! Here the owners are rayon tasks in one process; a cluster runs steps 2–3 on its workers and
//! ships the routed pairs and the parts. Invariant: for the same keys, parameters and seed, the
//! result's bytes equal [`Builder::build`]'s whatever the number of inputs and owners.

use std::fmt::Debug;

use rayon::prelude::*;

use super::build::{
    check_buckets, concat_chunks, reseed_or_fail, sort_by_bucket, BuildReport, Builder, KeySet, Solved, StageClock,
};
use super::elias_fano::DoubleEliasFano;
use super::hash::{bucket_of, Hash128, Key, KeyHashKind};
use super::mphf::Mphf;
use super::rice::RiceBuilder;
use crate::error::{MphfError, Result, SolveError};

/// The split of `B` buckets among `W` owners: owner `w` holds buckets `[⌊w·B/W⌋, ⌊(w+1)·B/W⌋)`
/// (some ranges are empty when `W > B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketRanges {
    num_buckets: u64,
    owners: usize,
}

impl BucketRanges {
    /// `num_buckets` buckets among `owners` owners (at least 1).
    pub fn new(num_buckets: u64, owners: usize) -> Self {
        BucketRanges {
            num_buckets,
            owners: owners.max(1),
        }
    }

    /// Number of owners.
    pub fn owners(&self) -> usize {
        self.owners
    }

    /// Number of buckets (B).
    pub fn num_buckets(&self) -> u64 {
        self.num_buckets
    }

    /// First bucket of owner `w` (`w = owners` gives B).
    pub fn first(&self, w: usize) -> u64 {
        (w as u128 * self.num_buckets as u128 / self.owners as u128) as u64
    }

    /// The owner of `bucket` (< B): the `w` with `first(w) ≤ bucket < first(w + 1)`, that is
    /// `⌈(bucket + 1)·W / B⌉ − 1`.
    pub fn owner_of(&self, bucket: u64) -> usize {
        ((((bucket as u128 + 1) * self.owners as u128).div_ceil(self.num_buckets as u128)) - 1) as usize
    }
}

/// Step 1: the `(hi, lo)` hashes of `keys` under `seed`, one list per owner of `ranges`.
pub fn route<K: KeySet + ?Sized>(keys: &K, seed: u64, ranges: &BucketRanges) -> Vec<Vec<Hash128>> {
    let num_buckets = ranges.num_buckets();
    let lists = (0..keys.len())
        .into_par_iter()
        .fold(
            || vec![Vec::new(); ranges.owners()],
            |mut lists: Vec<Vec<Hash128>>, i| {
                let h = keys.hash128(i, seed);
                lists[ranges.owner_of(bucket_of(h.hi, num_buckets))].push(h);
                lists
            },
        )
        .collect::<Vec<_>>();
    (0..ranges.owners())
        .into_par_iter()
        .map(|w| lists.iter().flat_map(|l| l[w].iter().copied()).collect())
        .collect()
}

/// One owner's buckets after step 2: the in-bucket hashes, bucket after bucket.
pub struct SortedPart {
    first_bucket: u64,
    lo: Vec<u64>,
    /// Bucket offsets into `lo` (length buckets + 1).
    offsets: Vec<u64>,
}

/// Step 2: sorts owner `w`'s pairs (from every input) by bucket and checks its buckets.
///
/// # Errors
/// The owner's first failing bucket, numbered globally: [`SolveError::BucketTooLarge`] or
/// [`SolveError::DuplicateLo`] (the caller re-seeds, or reports a duplicate key).
pub fn sort_part(
    ranges: &BucketRanges,
    w: usize,
    pairs: &[Vec<Hash128>],
) -> std::result::Result<SortedPart, SolveError> {
    let num_buckets = ranges.num_buckets();
    let (b0, b1) = (ranges.first(w), ranges.first(w + 1));
    let nb = (b1 - b0) as usize;
    let keys: usize = pairs.iter().map(Vec::len).sum();
    let mut offsets = vec![0u64; nb + 1];
    let mut lo = vec![0u64; keys];
    sort_by_bucket(
        pairs.iter().flatten(),
        b0,
        num_buckets,
        0,
        &mut offsets[..nb],
        |at, l| lo[at] = l,
    );
    offsets[nb] = keys as u64;
    check_buckets(&mut lo, &offsets).map_err(|e| match e {
        SolveError::BucketTooLarge { bucket, size } => SolveError::BucketTooLarge {
            bucket: bucket + b0,
            size,
        },
        SolveError::DuplicateLo { bucket, lo } => SolveError::DuplicateLo {
            bucket: bucket + b0,
            lo,
        },
        e => e,
    })?;
    Ok(SortedPart {
        first_bucket: b0,
        lo,
        offsets,
    })
}

/// One owner's share of the finished MPHF (step 3's output).
pub struct Part {
    first_bucket: u64,
    /// Keys per bucket.
    sizes: Vec<u64>,
    /// The Rice codes of the owner's buckets, in bucket order.
    rice: RiceBuilder,
    /// Bit offset of each bucket's code in `rice`.
    starts: Vec<u64>,
    /// The solver that found the descriptors (None: the CPU).
    solver: Option<String>,
    /// Why the solver was not used, when it failed.
    fallback_notice: Option<String>,
}

/// Step 3: solves and encodes a sorted part with `builder`'s parameters and solver.
///
/// # Errors
/// [`SolveError::Watchdog`] when a search passed the builder's cap.
pub fn solve_part(builder: &Builder, part: SortedPart) -> std::result::Result<Part, SolveError> {
    let SortedPart {
        first_bucket,
        mut lo,
        offsets,
    } = part;
    let Solved {
        result,
        solver,
        fallback_notice,
    } = builder.solve_and_encode(&mut lo, &offsets, &mut StageClock::off());
    let (rice, mut starts) = result?;
    starts.truncate(offsets.len() - 1);
    Ok(Part {
        first_bucket,
        sizes: offsets.windows(2).map(|w| w[1] - w[0]).collect(),
        rice,
        starts,
        solver,
        fallback_notice,
    })
}

/// Step 4: the MPHF of all parts (in owner order) over `n` keys hashed with `seed`.
pub fn assemble(builder: &Builder, n: u64, seed: u64, hash_kind: KeyHashKind, parts: Vec<Part>) -> Mphf {
    let num_buckets: usize = parts.iter().map(|p| p.sizes.len()).sum();
    let mut offsets = Vec::with_capacity(num_buckets + 1);
    offsets.push(0u64);
    for size in parts.iter().flat_map(|p| &p.sizes) {
        offsets.push(offsets.last().unwrap_or(&0) + size);
    }
    let chunks = parts
        .into_iter()
        .map(|p| {
            let b0 = p.first_bucket as usize;
            (b0, b0 + p.sizes.len(), p.rice, p.starts)
        })
        .collect();
    let (rice, sigma) = concat_chunks(num_buckets, chunks);
    let ef = DoubleEliasFano::new(&offsets, &sigma);
    Mphf::from_parts(builder.params, n, seed, hash_kind, rice.finish(), ef)
}

/// Several slices of keys read as one, in order (the inputs of a partitioned build).
struct Chained<'a, T> {
    inputs: &'a [&'a [T]],
    /// Global index of each input's first key (length inputs + 1).
    starts: Vec<usize>,
}

impl<'a, T> Chained<'a, T> {
    fn new(inputs: &'a [&'a [T]]) -> Self {
        let mut starts = vec![0usize];
        for k in inputs {
            starts.push(starts.last().unwrap_or(&0) + k.len());
        }
        Chained { inputs, starts }
    }

    fn get(&self, i: usize) -> &T {
        let input = self.starts.partition_point(|&s| s <= i) - 1;
        &self.inputs[input][i - self.starts[input]]
    }
}

impl<T: Key + Sync + PartialEq + Debug> KeySet for Chained<'_, T> {
    fn len(&self) -> usize {
        *self.starts.last().unwrap_or(&0)
    }
    fn hash_kind(&self) -> KeyHashKind {
        T::KIND
    }
    fn hash128(&self, i: usize, seed: u64) -> Hash128 {
        self.get(i).hash128(seed)
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        self.get(i) == self.get(j)
    }
    fn describe(&self, i: usize) -> String {
        format!("{:?}", self.get(i))
    }
}

impl Builder {
    /// Builds over the union of `inputs` split among `owners` bucket ranges, as a cluster of
    /// `owners` workers would (see the module docs). The bytes equal those of
    /// [`Builder::build`] over the same keys in any order.
    ///
    /// # Errors
    /// As [`Builder::build`]; [`MphfError::InvalidParameter`] for `owners = 0` or
    /// deduplication (a partitioned build takes distinct keys).
    pub fn build_partitioned<T: Key + Sync + PartialEq + Debug>(&self, inputs: &[&[T]], owners: usize) -> Result<Mphf> {
        self.build_partitioned_with_report(inputs, owners).map(|(m, _)| m)
    }

    /// [`Builder::build_partitioned`], also reporting seeds tried, the solver and any fallback
    /// (the first owner's notice).
    ///
    /// # Errors
    /// As [`Builder::build_partitioned`].
    pub fn build_partitioned_with_report<T: Key + Sync + PartialEq + Debug>(
        &self,
        inputs: &[&[T]],
        owners: usize,
    ) -> Result<(Mphf, BuildReport)> {
        self.params.validate()?;
        self.in_pool(|| self.partitioned_inner(inputs, owners))
    }

    fn partitioned_inner<T: Key + Sync + PartialEq + Debug>(
        &self,
        inputs: &[&[T]],
        owners: usize,
    ) -> Result<(Mphf, BuildReport)> {
        if owners == 0 {
            return Err(MphfError::InvalidParameter(
                "a partitioned build needs at least one owner".into(),
            ));
        }
        if self.dedup {
            return Err(MphfError::InvalidParameter(
                "a partitioned build takes distinct keys; it does not deduplicate".into(),
            ));
        }
        let keys = Chained::new(inputs);
        let n = keys.len() as u64;
        let num_buckets = self.params.num_buckets(n);
        let ranges = BucketRanges::new(num_buckets, owners);
        let mut seed = self.seed;
        let mut last_bucket_failure = 0usize;
        let mut report = BuildReport {
            solver: "cpu".into(),
            ..Default::default()
        };
        for attempt in 1..=self.max_seeds {
            report.attempts = attempt;
            // Step 1 on every input, then each owner gathers its lists from all inputs.
            let mut routed: Vec<Vec<Vec<Hash128>>> = inputs.par_iter().map(|k| route(*k, seed, &ranges)).collect();
            let per_owner: Vec<Vec<Vec<Hash128>>> = (0..owners)
                .map(|w| routed.iter_mut().map(|r| std::mem::take(&mut r[w])).collect())
                .collect();
            drop(routed);
            let sorted: Vec<_> = per_owner
                .par_iter()
                .enumerate()
                .map(|(w, pairs)| sort_part(&ranges, w, pairs))
                .collect();
            drop(per_owner);
            // The first failing bucket overall is the first failing owner's first (the single
            // build reports its lowest failing bucket too).
            let parts = match sorted.into_iter().collect::<std::result::Result<Vec<_>, _>>() {
                Ok(parts) => parts,
                Err(e) => {
                    reseed_or_fail(&keys, seed, num_buckets, e, &mut last_bucket_failure)?;
                    seed = seed.wrapping_add(1);
                    continue;
                }
            };
            let solved = parts
                .into_par_iter()
                .map(|p| solve_part(self, p))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| self.search_failure(e))?;
            if let Some(name) = solved.iter().find_map(|p| p.solver.clone()) {
                report.solver = name;
            }
            report.fallback_notice = solved.iter().find_map(|p| p.fallback_notice.clone());
            return Ok((assemble(self, n, seed, keys.hash_kind(), solved), report));
        }
        Err(self.out_of_seeds(last_bucket_failure, seed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::hash::mix64;
    use crate::core::Params;

    #[test]
    fn every_bucket_has_the_owner_whose_range_holds_it() {
        for b in [1u64, 2, 7, 100, 1000] {
            for w in [1usize, 2, 3, 8, 13] {
                let r = BucketRanges::new(b, w);
                assert_eq!((r.first(0), r.first(w)), (0, b));
                for bucket in 0..b {
                    let o = r.owner_of(bucket);
                    assert!(
                        r.first(o) <= bucket && bucket < r.first(o + 1),
                        "B = {b}, W = {w}: bucket {bucket} given to {o}"
                    );
                }
            }
        }
    }

    fn random_keys(n: usize, salt: u64) -> Vec<u64> {
        (0..n as u64).map(|i| mix64(i ^ mix64(salt))).collect()
    }

    /// Splits `keys` into inputs of uneven sizes (one of them empty).
    fn uneven(keys: &[u64]) -> Vec<&[u64]> {
        let (a, rest) = keys.split_at(keys.len() / 7);
        let (b, c) = rest.split_at(rest.len() / 2);
        vec![c, &a[..0], a, b]
    }

    #[test]
    fn same_bytes_as_the_single_build() {
        for (params, n) in [
            (Params::DEFAULT, 0usize),
            (Params::DEFAULT, 1),
            (Params::try_new(8, 100, true).unwrap(), 1000),
            (Params::try_new(5, 5, false).unwrap(), 10_000),
            (Params::DEFAULT, 200_000),
        ] {
            let keys = random_keys(n, n as u64);
            let builder = Builder::new(params).seed(3);
            let single = builder.build(&keys).unwrap().write_bytes();
            let inputs = uneven(&keys);
            for owners in [1, 2, 5, 64] {
                let parted = builder.build_partitioned(&inputs, owners).unwrap().write_bytes();
                assert!(parted == single, "{params:?}, n = {n}, {owners} owners: bytes differ");
            }
        }
    }

    /// The sizes: 10^6 and 10^7 here, 10^8 in the ignored test below.
    fn large_build_gives_the_same_bytes(n: usize) {
        let keys = random_keys(n, 77);
        let builder = Builder::new(Params::DEFAULT);
        let single = builder.build(&keys).unwrap().write_bytes();
        let inputs: Vec<&[u64]> = keys.chunks(n / 3 + 1).collect();
        for owners in [4, 16] {
            let parted = builder.build_partitioned(&inputs, owners).unwrap().write_bytes();
            assert!(parted == single, "n = {n}, {owners} owners: bytes differ");
        }
    }

    #[test]
    fn a_million_and_ten_million_keys_give_the_same_bytes() {
        large_build_gives_the_same_bytes(1_000_000);
        large_build_gives_the_same_bytes(10_000_000);
    }

    /// About 80 s and 3.4 GB on 2 cores: `cargo test --lib hundred_million -- --ignored`.
    #[test]
    #[ignore]
    fn a_hundred_million_keys_give_the_same_bytes() {
        large_build_gives_the_same_bytes(100_000_000);
    }

    #[test]
    fn string_keys_give_the_same_bytes() {
        let keys: Vec<String> = (0..5000).map(|i| format!("session-{:016x}", mix64(i))).collect();
        let builder = Builder::new(Params::DEFAULT);
        let single = builder.build(&keys).unwrap().write_bytes();
        let inputs: Vec<&[String]> = keys.chunks(1700).collect();
        assert!(builder.build_partitioned(&inputs, 3).unwrap().write_bytes() == single);
        let one_thread = builder.clone().threads(Some(1));
        assert!(one_thread.build_partitioned(&inputs, 7).unwrap().write_bytes() == single);
    }

    #[test]
    fn a_key_repeated_across_inputs_is_named() {
        let mut keys = random_keys(10_000, 9);
        let repeated = keys[17];
        keys.push(repeated);
        let single = Builder::new(Params::DEFAULT).build(&keys).unwrap_err();
        let (a, b) = keys.split_at(5000);
        let parted = Builder::new(Params::DEFAULT).build_partitioned(&[a, b], 4).unwrap_err();
        assert_eq!(parted.to_string(), single.to_string());
        assert!(matches!(parted, MphfError::DuplicateKey { ref key } if *key == format!("{repeated}")));
    }

    #[test]
    fn bad_requests_are_refused() {
        let keys = random_keys(100, 1);
        let inputs = [keys.as_slice()];
        let b = Builder::new(Params::DEFAULT);
        assert_eq!(
            b.build_partitioned(&inputs, 0).unwrap_err().to_string(),
            MphfError::InvalidParameter("a partitioned build needs at least one owner".into()).to_string()
        );
        assert_eq!(
            b.clone()
                .deduplicate(true)
                .build_partitioned(&inputs, 2)
                .unwrap_err()
                .to_string(),
            MphfError::InvalidParameter("a partitioned build takes distinct keys; it does not deduplicate".into())
                .to_string()
        );
    }
}
