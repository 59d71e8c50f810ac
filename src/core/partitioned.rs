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

/// Most owners of a partitioned build: far more than the workers of any cluster, few enough
/// that the per-owner lists and parts stay small.
pub const MAX_OWNERS: usize = 1 << 16;

/// Refuses an owner count outside `1..=MAX_OWNERS`.
fn check_owners(owners: usize) -> Result<()> {
    if owners == 0 {
        return Err(MphfError::InvalidParameter(
            "a partitioned build needs at least one owner".into(),
        ));
    }
    if owners > MAX_OWNERS {
        return Err(MphfError::InvalidParameter(format!(
            "a partitioned build of {owners} owners; at most {MAX_OWNERS}"
        )));
    }
    Ok(())
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
#[derive(Clone)]
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

/// First word of an encoded owner outcome ("mphfpart" in ASCII, little-endian).
const OUTCOME_MAGIC: u64 = u64::from_le_bytes(*b"mphfpart");
/// Version of the outcome encoding.
const OUTCOME_VERSION: u64 = 1;

/// What one owner sends back after steps 2–3: its part, or the check or search that failed.
pub type Outcome = std::result::Result<Part, SolveError>;

/// The bytes of an owner's outcome, for shipping it between processes: little-endian words
/// (magic, version, tag, fields); a text as its length (`u64::MAX`: none) and its bytes.
/// [`decode_outcome`] reads it back.
pub fn encode_outcome(outcome: &Outcome) -> Vec<u8> {
    let mut out = OutcomeWriter(Vec::new());
    out.words(&[OUTCOME_MAGIC, OUTCOME_VERSION]);
    match outcome {
        Ok(part) => {
            out.words(&[0, part.first_bucket, part.sizes.len() as u64]);
            out.words(&part.sizes);
            out.words(&part.starts);
            out.words(&[part.rice.len()]);
            out.words(part.rice.words());
            out.text(part.solver.as_deref());
            out.text(part.fallback_notice.as_deref());
        }
        Err(SolveError::DuplicateLo { bucket, lo }) => out.words(&[1, *bucket, *lo]),
        Err(SolveError::BucketTooLarge { bucket, size }) => out.words(&[2, *bucket, *size as u64]),
        Err(SolveError::Watchdog { keys }) => out.words(&[3, *keys as u64]),
    }
    out.0
}

/// Reads what [`encode_outcome`] wrote.
///
/// # Errors
/// [`MphfError::PartFormat`] for bytes that are truncated, too long, of another version, or not
/// a consistent part (offsets past the Rice bits, stray bits past their end).
pub fn decode_outcome(bytes: &[u8]) -> Result<Outcome> {
    let mut r = OutcomeReader(bytes);
    if r.word()? != OUTCOME_MAGIC {
        return Err(MphfError::PartFormat("not an encoded build part".into()));
    }
    let version = r.word()?;
    if version != OUTCOME_VERSION {
        return Err(MphfError::PartFormat(format!(
            "encoding version {version}, this build reads version {OUTCOME_VERSION}"
        )));
    }
    let outcome = match r.word()? {
        0 => {
            let first_bucket = r.word()?;
            let buckets = r.count()?;
            let sizes = r.words(buckets)?;
            let starts = r.words(buckets)?;
            let bits = r.word()?;
            let words = r.words(r.count_of(bits.div_ceil(64))?)?;
            let rice = RiceBuilder::from_words(words, bits)
                .ok_or_else(|| MphfError::PartFormat("Rice bits set past their length".into()))?;
            if starts.windows(2).any(|w| w[0] > w[1]) || starts.last().is_some_and(|&s| s > bits) {
                return Err(MphfError::PartFormat(
                    "bucket offsets out of order or past the Rice bits".into(),
                ));
            }
            let solver = r.text()?;
            let fallback_notice = r.text()?;
            Ok(Part {
                first_bucket,
                sizes,
                rice,
                starts,
                solver,
                fallback_notice,
            })
        }
        1 => Err(SolveError::DuplicateLo {
            bucket: r.word()?,
            lo: r.word()?,
        }),
        2 => Err(SolveError::BucketTooLarge {
            bucket: r.word()?,
            size: r.size()?,
        }),
        3 => Err(SolveError::Watchdog { keys: r.size()? }),
        tag => return Err(MphfError::PartFormat(format!("unknown outcome tag {tag}"))),
    };
    if !r.0.is_empty() {
        return Err(MphfError::PartFormat(format!("{} bytes after the part", r.0.len())));
    }
    Ok(outcome)
}

/// Appends little-endian words and texts (see [`encode_outcome`]).
struct OutcomeWriter(Vec<u8>);

impl OutcomeWriter {
    fn words(&mut self, words: &[u64]) {
        self.0.extend(words.iter().flat_map(|w| w.to_le_bytes()));
    }
    fn text(&mut self, text: Option<&str>) {
        match text {
            None => self.words(&[u64::MAX]),
            Some(t) => {
                self.words(&[t.len() as u64]);
                self.0.extend_from_slice(t.as_bytes());
            }
        }
    }
}

/// Reads what [`OutcomeWriter`] wrote, never past the end.
struct OutcomeReader<'a>(&'a [u8]);

impl OutcomeReader<'_> {
    fn truncated() -> MphfError {
        MphfError::PartFormat("truncated".into())
    }
    fn word(&mut self) -> Result<u64> {
        let (head, rest) = self.0.split_first_chunk::<8>().ok_or_else(Self::truncated)?;
        self.0 = rest;
        Ok(u64::from_le_bytes(*head))
    }
    /// A count that must fit in the bytes left (8 bytes a word), so that no allocation is larger
    /// than the input.
    fn count(&mut self) -> Result<usize> {
        let n = self.word()?;
        self.count_of(n)
    }
    fn count_of(&self, n: u64) -> Result<usize> {
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.0.len() / 8)
            .ok_or_else(Self::truncated)
    }
    /// A number of keys.
    fn size(&mut self) -> Result<usize> {
        usize::try_from(self.word()?).map_err(|_| MphfError::PartFormat("a size beyond this platform".into()))
    }
    fn words(&mut self, n: usize) -> Result<Vec<u64>> {
        (0..n).map(|_| self.word()).collect()
    }
    fn text(&mut self) -> Result<Option<String>> {
        let len = self.word()?;
        if len == u64::MAX {
            return Ok(None);
        }
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n <= self.0.len())
            .ok_or_else(Self::truncated)?;
        let (text, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(text.to_vec())
            .map(Some)
            .map_err(|_| MphfError::PartFormat("a text that is not UTF-8".into()))
    }
}

/// The coordinator's side of a partitioned build whose owners run elsewhere (a cluster's
/// workers): which seed and bucket ranges the next round uses, and what a round's outcomes
/// lead to. It makes the choices of [`Builder::build_partitioned`], so both try the same seeds
/// and give the same bytes. The keys must be distinct: a shared in-bucket hash is then a
/// collision, and the next seed is tried.
pub struct SeedAgreement<'a> {
    builder: &'a Builder,
    n: u64,
    hash_kind: KeyHashKind,
    ranges: BucketRanges,
    seed: u64,
    attempts: u32,
    last_bucket_failure: usize,
}

impl<'a> SeedAgreement<'a> {
    /// The agreement over `n` distinct keys of kind `hash_kind` among `owners` owners, starting
    /// at `builder`'s seed.
    ///
    /// # Errors
    /// [`MphfError::InvalidParameter`] for bad parameters or `owners = 0`.
    pub fn new(builder: &'a Builder, n: u64, hash_kind: KeyHashKind, owners: usize) -> Result<Self> {
        builder.params.validate()?;
        check_owners(owners)?;
        Ok(SeedAgreement {
            builder,
            n,
            hash_kind,
            ranges: BucketRanges::new(builder.params.num_buckets(n), owners),
            seed: builder.seed,
            attempts: 1,
            last_bucket_failure: 0,
        })
    }

    /// The seed of the current round.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The owners' bucket ranges (the same in every round).
    pub fn ranges(&self) -> BucketRanges {
        self.ranges
    }

    /// Takes the current round's outcomes, one per owner in owner order (`None`: the owner
    /// received no key; its empty part is made here). Returns the MPHF and its report, or
    /// `None` when an owner's check failed and the next round must run with [`Self::seed`].
    ///
    /// # Errors
    /// [`MphfError::InvalidParameter`] for a wrong number of outcomes or a part of another
    /// bucket range; after the last seed the errors of [`Builder::build`];
    /// [`MphfError::Watchdog`] when a search passed the cap.
    pub fn finish_round(&mut self, outcomes: Vec<Option<Outcome>>) -> Result<Option<(Mphf, BuildReport)>> {
        let owners = self.ranges.owners();
        if outcomes.len() != owners {
            return Err(MphfError::InvalidParameter(format!(
                "{} outcomes for {owners} owners",
                outcomes.len()
            )));
        }
        // A failed check of the lowest owner comes first, as in the single process (all checks
        // there precede all searches).
        let check = outcomes.iter().find_map(|o| match o {
            Some(Err(e @ (SolveError::DuplicateLo { .. } | SolveError::BucketTooLarge { .. }))) => Some(e.clone()),
            _ => None,
        });
        if let Some(failure) = check {
            if let SolveError::BucketTooLarge { size, .. } = failure {
                self.last_bucket_failure = size;
            }
            // The single build's seed loop ends one past the last seed tried, and says so.
            self.seed = self.seed.wrapping_add(1);
            if self.attempts >= self.builder.max_seeds {
                return Err(self.builder.out_of_seeds(self.last_bucket_failure, self.seed));
            }
            self.attempts += 1;
            return Ok(None);
        }
        let mut parts = Vec::with_capacity(owners);
        for (w, outcome) in outcomes.into_iter().enumerate() {
            let part = match outcome {
                Some(outcome) => outcome.map_err(|e| self.builder.search_failure(e))?,
                None => solve_owner(self.builder, &self.ranges, w, &[]).map_err(|e| self.builder.search_failure(e))?,
            };
            let (b0, b1) = (self.ranges.first(w), self.ranges.first(w + 1));
            if part.first_bucket != b0 || part.sizes.len() as u64 != b1 - b0 {
                return Err(MphfError::InvalidParameter(format!(
                    "owner {w}'s part holds buckets {}..{}, its range is {b0}..{b1}",
                    part.first_bucket,
                    part.first_bucket + part.sizes.len() as u64
                )));
            }
            parts.push(part);
        }
        let keys: u64 = parts.iter().flat_map(|p| &p.sizes).sum();
        if keys != self.n {
            return Err(MphfError::InvalidParameter(format!(
                "the parts hold {keys} keys, the build expected {}",
                self.n
            )));
        }
        let report = BuildReport {
            attempts: self.attempts,
            solver: parts
                .iter()
                .find_map(|p| p.solver.clone())
                .unwrap_or_else(|| "cpu".into()),
            fallback_notice: parts.iter().find_map(|p| p.fallback_notice.clone()),
            ..Default::default()
        };
        Ok(Some((
            assemble(self.builder, self.n, self.seed, self.hash_kind, parts),
            report,
        )))
    }
}

/// What an owner computes in a round (steps 2 and 3) from the pairs routed to it.
pub fn solve_owner(builder: &Builder, ranges: &BucketRanges, w: usize, pairs: &[Vec<Hash128>]) -> Outcome {
    sort_part(ranges, w, pairs).and_then(|p| solve_part(builder, p))
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
        check_owners(owners)?;
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

    /// Every owner's outcome through the encoding, as a cluster ships it.
    fn shipped_outcomes(builder: &Builder, keys: &[u64], seed: u64, ranges: &BucketRanges) -> Vec<Option<Outcome>> {
        route(keys, seed, ranges)
            .into_iter()
            .enumerate()
            .map(|(w, pairs)| {
                (!pairs.is_empty()).then(|| {
                    let bytes = encode_outcome(&solve_owner(builder, ranges, w, &[pairs]));
                    decode_outcome(&bytes).unwrap()
                })
            })
            .collect()
    }

    #[test]
    fn a_seed_agreement_over_shipped_parts_gives_the_single_builds_bytes() {
        for (params, n, owners) in [
            (Params::DEFAULT, 0usize, 3usize),
            (Params::DEFAULT, 1, 4),
            (Params::try_new(8, 100, true).unwrap(), 5000, 7),
            (Params::try_new(5, 5, false).unwrap(), 20_000, 2),
            (Params::DEFAULT, 100_000, 16),
        ] {
            let keys = random_keys(n, 5 + n as u64);
            let builder = Builder::new(params).seed(9);
            let single = builder.build(&keys).unwrap().write_bytes();
            let mut agreement = SeedAgreement::new(&builder, n as u64, KeyHashKind::Integer, owners).unwrap();
            let ranges = agreement.ranges();
            let outcomes = shipped_outcomes(&builder, &keys, agreement.seed(), &ranges);
            let (mphf, report) = agreement.finish_round(outcomes).unwrap().expect("no check fails");
            assert!(
                mphf.write_bytes() == single,
                "{params:?}, n = {n}, {owners} owners: bytes differ"
            );
            assert_eq!((report.attempts, report.solver.as_str()), (1, "cpu"));
        }
    }

    #[test]
    fn a_failed_check_moves_every_owner_to_the_next_seed_and_the_last_seed_fails_as_the_single_build() {
        let keys = random_keys(3000, 1);
        let builder = Builder::new(Params::DEFAULT).seed(40).max_seeds(2);
        let mut agreement = SeedAgreement::new(&builder, 3000, KeyHashKind::Integer, 3).unwrap();
        let ranges = agreement.ranges();
        let mut outcomes = shipped_outcomes(&builder, &keys, 40, &ranges);
        outcomes[2] = Some(Err(SolveError::DuplicateLo { bucket: 29, lo: 7 }));
        outcomes[1] = Some(Err(SolveError::Watchdog { keys: 5 }));
        assert!(agreement.finish_round(outcomes).unwrap().is_none());
        assert_eq!(agreement.seed(), 41);
        // The second round at seed 41 builds what the single build from seed 41 builds.
        let outcomes = shipped_outcomes(&builder, &keys, 41, &ranges);
        let (mphf, report) = agreement.finish_round(outcomes).unwrap().unwrap();
        assert!(mphf.write_bytes() == builder.clone().seed(41).build(&keys).unwrap().write_bytes());
        assert_eq!(report.attempts, 2);
        // Out of seeds: the single build's error and message.
        let mut agreement = SeedAgreement::new(&builder, 3000, KeyHashKind::Integer, 3).unwrap();
        for round in 0..2 {
            let mut outcomes = shipped_outcomes(&builder, &keys, 40 + round, &ranges);
            outcomes[0] = Some(Err(SolveError::BucketTooLarge {
                bucket: 3,
                size: 40_000,
            }));
            let e = agreement.finish_round(outcomes);
            if round == 1 {
                let e = e.map(|_| ()).expect_err("out of seeds").to_string();
                assert_eq!(e, "a bucket holds 40000 keys (limit 3000) after 2 seeds");
            }
        }
        // A search failure with no failed check is fatal.
        let mut agreement = SeedAgreement::new(&builder, 3000, KeyHashKind::Integer, 3).unwrap();
        let mut outcomes = shipped_outcomes(&builder, &keys, 40, &ranges);
        outcomes[1] = Some(Err(SolveError::Watchdog { keys: 5 }));
        assert!(matches!(
            agreement.finish_round(outcomes),
            Err(MphfError::Watchdog { keys: 5, .. })
        ));
    }

    #[test]
    fn parts_that_do_not_fit_the_round_are_refused() {
        let keys = random_keys(2000, 2);
        let builder = Builder::new(Params::DEFAULT);
        let mut agreement = SeedAgreement::new(&builder, 2000, KeyHashKind::Integer, 4).unwrap();
        let ranges = agreement.ranges();
        let outcomes = shipped_outcomes(&builder, &keys, 0, &ranges);
        let e = agreement.finish_round(outcomes[..3].to_vec()).err().unwrap();
        assert_eq!(e.to_string(), "invalid parameter: 3 outcomes for 4 owners");
        let mut swapped = shipped_outcomes(&builder, &keys, 0, &ranges);
        swapped.swap(0, 1);
        let e = agreement.finish_round(swapped).err().unwrap().to_string();
        assert!(
            e.starts_with("invalid parameter: owner 0's part holds buckets 5..10, its range is 0..5"),
            "{e}"
        );
        let mut lost = shipped_outcomes(&builder, &keys, 0, &ranges);
        lost[3] = None;
        let e = agreement.finish_round(lost).err().unwrap().to_string();
        assert!(e.starts_with("invalid parameter: the parts hold "), "{e}");
        let e = SeedAgreement::new(&builder, 10, KeyHashKind::Integer, 0).err().unwrap();
        assert_eq!(
            e.to_string(),
            "invalid parameter: a partitioned build needs at least one owner"
        );
        let e = SeedAgreement::new(&builder, 10, KeyHashKind::Integer, usize::MAX)
            .err()
            .unwrap();
        assert_eq!(
            e.to_string(),
            format!(
                "invalid parameter: a partitioned build of {} owners; at most 65536",
                usize::MAX
            )
        );
        let e = builder.build_partitioned(&[&keys[..]], MAX_OWNERS + 1).err().unwrap();
        assert_eq!(
            e.to_string(),
            "invalid parameter: a partitioned build of 65537 owners; at most 65536"
        );
    }

    #[test]
    fn an_encoded_outcome_reads_back_and_damaged_bytes_are_refused() {
        let keys = random_keys(5000, 3);
        let builder = Builder::new(Params::try_new(8, 100, true).unwrap());
        let ranges = BucketRanges::new(builder.params.num_buckets(5000), 3);
        let pairs = route(&keys[..], 0, &ranges);
        let mut part = solve_owner(&builder, &ranges, 1, &[pairs[1].clone()]).unwrap();
        part.fallback_notice = Some("GPU: gone ✓".into());
        let outcomes = [
            Ok(part),
            Err(SolveError::DuplicateLo {
                bucket: 7,
                lo: u64::MAX,
            }),
            Err(SolveError::BucketTooLarge {
                bucket: 1,
                size: 40_000,
            }),
            Err(SolveError::Watchdog { keys: 12 }),
        ];
        for outcome in &outcomes {
            let bytes = encode_outcome(outcome);
            let back = decode_outcome(&bytes).unwrap();
            assert!(encode_outcome(&back) == bytes, "the outcome changed on its way");
            match (&back, outcome) {
                (Err(a), Err(b)) => assert_eq!(a, b),
                (Ok(a), Ok(b)) => {
                    assert_eq!(
                        (a.first_bucket, &a.sizes, &a.starts),
                        (b.first_bucket, &b.sizes, &b.starts)
                    );
                    assert_eq!((a.rice.len(), a.rice.words()), (b.rice.len(), b.rice.words()));
                    assert_eq!(a.fallback_notice.as_deref(), Some("GPU: gone ✓"));
                }
                _ => panic!("the outcome changed its kind"),
            }
            // Every truncation and one extra byte are refused, never a panic.
            for cut in 0..bytes.len() {
                assert!(
                    matches!(decode_outcome(&bytes[..cut]), Err(MphfError::PartFormat(_))),
                    "cut at {cut}"
                );
            }
            let mut long = bytes.clone();
            long.push(0);
            assert_eq!(
                decode_outcome(&long).err().unwrap().to_string(),
                "invalid build part: 1 bytes after the part"
            );
        }
        let good = encode_outcome(&outcomes[0]);
        let mut foreign = good.clone();
        foreign[0] ^= 1;
        assert_eq!(
            decode_outcome(&foreign).err().unwrap().to_string(),
            "invalid build part: not an encoded build part"
        );
        let mut newer = good.clone();
        newer[8] = 2;
        assert_eq!(
            decode_outcome(&newer).err().unwrap().to_string(),
            "invalid build part: encoding version 2, this build reads version 1"
        );
        let mut tagged = good;
        tagged[16] = 9;
        assert_eq!(
            decode_outcome(&tagged).err().unwrap().to_string(),
            "invalid build part: unknown outcome tag 9"
        );
        // Bits set past the Rice length.
        let mut stray = RiceBuilder::new();
        stray.push_bits(1, 3);
        assert!(RiceBuilder::from_words(vec![0b1001], 3).is_none());
        assert!(RiceBuilder::from_words(vec![1, 0], 3).is_none());
        assert_eq!(
            RiceBuilder::from_words(stray.words().to_vec(), 3).map(|r| r.len()),
            Some(3)
        );
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
