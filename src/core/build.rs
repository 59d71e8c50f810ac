//! The parallel build (spec §10.1–10.5): hash, bucket, check, solve every bucket's splitting
//! tree, Golomb–Rice encode, and build the double Elias–Fano.
//!
//! Pipeline for `n` keys and `B = ⌈n/b⌉` buckets:
//! 1. **Bucketing** ([`bucketize`]): a two-step parallel counting sort. Keys are hashed on the
//!    fly (twice, to avoid keeping 16 B/key of hashes): first into ≤ 4096 ranges of consecutive
//!    buckets (per-chunk histograms, prefix sums, disjoint scatter), then each range is counting-
//!    sorted by bucket. Only `lo` reaches the output. Peak memory ≈ 24 B/key.
//! 2. **Checks** (spec §2.3–2.4): every bucket has < 3000 keys and no repeated `lo`; otherwise
//!    the build re-seeds (bounded), or reports the duplicated key.
//! 3. **Solving** (spec §5–6): contiguous ranges of buckets in parallel; each bucket's tree is
//!    solved in preorder into a list of descriptors. A [`BucketSolver`] (the GPU backend) may
//!    produce these descriptors instead of the CPU.
//! 4. **Encoding** (spec §7.4): descriptors → per-range Rice vectors and local σ, concatenated
//!    in range order; then λ, σ → Elias–Fano. Encoding is shared by every solver, so the bytes
//!    do not depend on who solved (spec §10.7).
//!
//! Determinism: every search returns the smallest valid index (spec §5.4), each node's predicate
//! depends only on its key set, and ranges are concatenated in bucket order; hence the bytes are
//! independent of thread count, chunking, key order and solver.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rayon::prelude::*;

use super::elias_fano::DoubleEliasFano;
use super::hash::{bucket_of, range_h32, Hash128, Key, KeyHashKind, SEED_AGG1, SEED_AGG2, SEED_LEAF, START_SEEDS};
use super::memo::Memo;
use super::mphf::Mphf;
use super::params::{Params, MAX_BUCKET_KEYS};
use super::rice::RiceBuilder;
use super::tree::{self, lower_aggr, split_left, upper_aggr};
use crate::error::{try_with_capacity, MphfError, Result, SolveError};

/// Default cap on the candidate index of one node (spec §2.4): far above any real search
/// (ℓ = 24 leaves need ~2·10^9 on average), far below "forever".
pub const DEFAULT_WATCHDOG: u64 = 1 << 44;
/// Default number of seeds tried before a persistent collision is reported (spec §2.4).
pub const DEFAULT_MAX_SEEDS: u32 = 8;

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

impl<K: Key + Sync + PartialEq + Debug> KeySet for Vec<K> {
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

/// A key set restricted to some indices of another (the distinct keys after deduplication).
struct Subset<'a, K: KeySet + ?Sized> {
    inner: &'a K,
    keep: &'a [usize],
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

/// Something that finds the descriptors of many buckets at once (the GPU backend).
///
/// Contract: for the same input it returns exactly the descriptors the CPU search finds
/// (smallest valid index per node, `Fixed3` seeds, `RoundUp` splits), bucket after bucket,
/// each bucket's in preorder. It may reorder keys inside each bucket.
pub trait BucketSolver: Send + Sync {
    /// Short name for notices and statistics (e.g. "gpu").
    fn name(&self) -> &str;
    /// Solves all buckets; bucket `i` holds `keys[offsets[i]..offsets[i+1]]`.
    ///
    /// # Errors
    /// A message when the device failed; the builder then falls back to the CPU.
    fn solve(&self, params: &Params, keys: &mut [u64], offsets: &[u64]) -> std::result::Result<Vec<u64>, String>;
}

/// What a build did besides producing the MPHF.
#[derive(Debug, Clone, Default)]
pub struct BuildReport {
    /// Seeds tried (1 when no re-seed was needed).
    pub attempts: u32,
    /// Input keys dropped as duplicates (deduplicate mode).
    pub duplicates_removed: u64,
    /// Who solved the buckets ("cpu", or the solver's name).
    pub solver: String,
    /// A one-line notice when a solver failed and the CPU took over.
    pub fallback_notice: Option<String>,
    /// Indices of the kept input keys in deduplicate mode (sorted ascending).
    pub kept: Option<Vec<usize>>,
}

/// Configures and runs a build.
///
/// # Examples
/// ```
/// use datafusion_mphf::core::{Builder, Params};
/// let keys: Vec<u64> = (0..1000).map(|i| i * 7919).collect();
/// let mphf = Builder::new(Params::DEFAULT).build(&keys).unwrap();
/// let mut seen = vec![false; 1000];
/// for k in &keys {
///     let v = mphf.index(k) as usize;
///     assert!(!seen[v]);
///     seen[v] = true;
/// }
/// ```
#[derive(Clone)]
pub struct Builder {
    pub(super) params: Params,
    pub(super) seed: u64,
    threads: Option<usize>,
    pub(super) dedup: bool,
    pub(super) max_seeds: u32,
    watchdog: u64,
    progress: Option<Arc<AtomicU64>>,
    solver: Option<Arc<dyn BucketSolver>>,
}

impl Builder {
    /// A builder with the given parameters, seed 0, all cores, duplicates rejected.
    pub fn new(params: Params) -> Self {
        Builder {
            params,
            seed: 0,
            threads: None,
            dedup: false,
            max_seeds: DEFAULT_MAX_SEEDS,
            watchdog: DEFAULT_WATCHDOG,
            progress: None,
            solver: None,
        }
    }
    /// First key-hash seed (the build may move to `seed + k` on collisions).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
    /// Number of worker threads (`None`: rayon's global pool).
    pub fn threads(mut self, threads: Option<usize>) -> Self {
        self.threads = threads;
        self
    }
    /// Drop repeated keys instead of failing with [`MphfError::DuplicateKey`].
    pub fn deduplicate(mut self, dedup: bool) -> Self {
        self.dedup = dedup;
        self
    }
    /// Number of seeds tried before giving up on collisions (at least 1).
    pub fn max_seeds(mut self, n: u32) -> Self {
        self.max_seeds = n.max(1);
        self
    }
    /// Cap on the candidate index of any node (spec §2.4).
    pub fn watchdog(mut self, limit: u64) -> Self {
        self.watchdog = limit;
        self
    }
    /// A counter the build advances by the number of keys whose bucket is solved.
    pub fn progress(mut self, counter: Arc<AtomicU64>) -> Self {
        self.progress = Some(counter);
        self
    }
    /// Solve buckets with `solver` (falls back to the CPU if it fails).
    pub fn solver(mut self, solver: Option<Arc<dyn BucketSolver>>) -> Self {
        self.solver = solver;
        self
    }
    /// The parameters.
    pub fn params(&self) -> Params {
        self.params
    }

    /// Builds an MPHF over `keys`.
    ///
    /// # Errors
    /// [`MphfError::DuplicateKey`] (naming one repeated key) unless deduplicating;
    /// [`MphfError::PersistentCollision`], [`MphfError::BucketTooLarge`] after every seed;
    /// [`MphfError::Watchdog`]; [`MphfError::InvalidParameter`].
    pub fn build<K: KeySet + ?Sized>(&self, keys: &K) -> Result<Mphf> {
        self.build_with_report(keys).map(|(m, _)| m)
    }

    /// Builds and also reports what happened (seeds, duplicates, solver, fallback).
    ///
    /// # Errors
    /// As [`Builder::build`].
    pub fn build_with_report<K: KeySet + ?Sized>(&self, keys: &K) -> Result<(Mphf, BuildReport)> {
        self.params.validate()?;
        self.in_pool(|| self.build_inner(keys))
    }

    /// Runs `f` on a pool of the configured thread count (rayon's global pool by default).
    pub(super) fn in_pool<R: Send>(&self, f: impl FnOnce() -> Result<R> + Send) -> Result<R> {
        match self.threads {
            Some(t) => rayon::ThreadPoolBuilder::new()
                .num_threads(t.max(1))
                .build()
                .map_err(|e| MphfError::InvalidParameter(format!("cannot start {t} threads: {e}")))?
                .install(f),
            None => f(),
        }
    }

    fn build_inner<K: KeySet + ?Sized>(&self, keys: &K) -> Result<(Mphf, BuildReport)> {
        let mut report = BuildReport {
            solver: "cpu".into(),
            ..Default::default()
        };
        if self.dedup {
            let keep = distinct_indices(keys, self.seed)?;
            report.duplicates_removed = (keys.len() - keep.len()) as u64;
            let subset = Subset {
                inner: keys,
                keep: &keep,
            };
            let mphf = self.build_distinct(&subset, &mut report)?;
            report.kept = Some(keep);
            Ok((mphf, report))
        } else {
            let mphf = self.build_distinct(keys, &mut report)?;
            Ok((mphf, report))
        }
    }

    fn build_distinct<K: KeySet + ?Sized>(&self, keys: &K, report: &mut BuildReport) -> Result<Mphf> {
        let n = keys.len() as u64;
        let num_buckets = self.params.num_buckets(n);
        let mut seed = self.seed;
        let mut last_bucket_failure = 0usize;
        let mut clock = StageClock::from_env();
        for attempt in 1..=self.max_seeds {
            report.attempts = attempt;
            let (mut lo, offsets) = bucketize(keys, seed, num_buckets)?;
            clock.lap("bucketize");
            let checked = check_buckets(&mut lo, &offsets);
            clock.lap("check");
            if let Err(e) = checked {
                reseed_or_fail(keys, seed, num_buckets, e, &mut last_bucket_failure)?;
                seed = seed.wrapping_add(1);
                continue;
            }
            let solved = self.solve_and_encode(&mut lo, &offsets, &mut clock);
            solved.note(report);
            free_in_background(lo);
            let (rice, sigma) = solved.result.map_err(|e| self.search_failure(e))?;
            let ef = DoubleEliasFano::new(&offsets, &sigma);
            clock.lap("elias-fano");
            return Ok(Mphf::from_parts(
                self.params,
                n,
                seed,
                keys.hash_kind(),
                rice.finish(),
                ef,
            ));
        }
        Err(self.out_of_seeds(last_bucket_failure, seed))
    }

    /// The error of a failed search (solving reports only watchdog errors).
    pub(super) fn search_failure(&self, e: SolveError) -> MphfError {
        match e {
            SolveError::Watchdog { keys } => MphfError::Watchdog {
                keys,
                limit: self.watchdog,
            },
            e => unreachable!("solving reports only watchdog errors: {e}"),
        }
    }

    /// The error after every seed failed the checks; `last_bucket_failure` is the size of the
    /// last oversized bucket (0: every failure was a hash collision).
    pub(super) fn out_of_seeds(&self, last_bucket_failure: usize, seed: u64) -> MphfError {
        if last_bucket_failure > 0 {
            MphfError::BucketTooLarge {
                size: last_bucket_failure,
                limit: MAX_BUCKET_KEYS,
                attempts: self.max_seeds,
            }
        } else {
            MphfError::PersistentCollision {
                attempts: self.max_seeds,
                seed,
            }
        }
    }
}

/// After a failed bucket check: the duplicate-key error when two equal keys share a bucket,
/// else `Ok` (the caller re-seeds), recording an oversized bucket's size.
pub(super) fn reseed_or_fail<K: KeySet + ?Sized>(
    keys: &K,
    seed: u64,
    num_buckets: u64,
    failure: SolveError,
    last_bucket_failure: &mut usize,
) -> Result<()> {
    match failure {
        SolveError::DuplicateLo { bucket, lo } => match find_duplicate(keys, seed, num_buckets, bucket, lo) {
            Some(key) => Err(MphfError::DuplicateKey { key }),
            None => Ok(()),
        },
        SolveError::BucketTooLarge { size, .. } => {
            *last_bucket_failure = size;
            Ok(())
        }
        e @ SolveError::Watchdog { .. } => unreachable!("checks do not search: {e}"),
    }
}

impl Builder {
    /// Solves and encodes bucketed keys (bucket i holds `lo[offsets[i]..offsets[i+1]]`): with
    /// the solver when one is set, falling back to the CPU when it fails, else on the CPU.
    pub(super) fn solve_and_encode(&self, lo: &mut [u64], offsets: &[u64], clock: &mut StageClock) -> Solved {
        let mut solved = Solved {
            result: Ok((RiceBuilder::new(), Vec::new())),
            solver: None,
            fallback_notice: None,
        };
        let descriptors = match &self.solver {
            Some(solver) => match solver.solve(&self.params, lo, offsets) {
                Ok(d) => {
                    solved.solver = Some(solver.name().to_string());
                    Some(d)
                }
                Err(msg) => {
                    solved.fallback_notice =
                        Some(format!("{} build failed ({msg}); building on the CPU", solver.name()));
                    None
                }
            },
            None => None,
        };
        clock.lap("solve");
        solved.result = match descriptors {
            Some(d) => encode_from_descriptors(&self.params, offsets, &d),
            None => solve_and_encode_cpu(&self.params, lo, offsets, self.watchdog, self.progress.as_deref()),
        };
        clock.lap("encode");
        solved
    }
}

/// The outcome of [`Builder::solve_and_encode`].
pub(super) struct Solved {
    /// The Rice vector (unfinished, so that parts can be concatenated) and σ (length B+1).
    pub(super) result: std::result::Result<(RiceBuilder, Vec<u64>), SolveError>,
    /// The solver that produced the descriptors (None: the CPU).
    pub(super) solver: Option<String>,
    /// Why the solver was not used, when it failed.
    pub(super) fallback_notice: Option<String>,
}

impl Solved {
    /// Records who solved, and any fallback, in the build report.
    pub(super) fn note(&self, report: &mut BuildReport) {
        if let Some(name) = &self.solver {
            report.solver = name.clone();
        }
        if let Some(notice) = &self.fallback_notice {
            report.fallback_notice = Some(notice.clone());
        }
    }
}

/// Per-stage wall times of one build, printed to stderr when `MPHF_BUILD_PROFILE` is set
/// (a diagnostic for benchmarks; silent and free otherwise).
pub(super) struct StageClock {
    last: Option<std::time::Instant>,
}

impl StageClock {
    /// A clock that never prints (the parts of a partitioned build).
    pub(super) fn off() -> Self {
        Self { last: None }
    }

    pub(super) fn from_env() -> Self {
        Self {
            last: std::env::var_os("MPHF_BUILD_PROFILE").map(|_| std::time::Instant::now()),
        }
    }

    pub(super) fn lap(&mut self, stage: &str) {
        if let Some(last) = self.last.as_mut() {
            eprintln!("build: {stage:>10} {:9.2} ms", last.elapsed().as_secs_f64() * 1e3);
            *last = std::time::Instant::now();
        }
    }
}

/// A vector of `n` copies of `value`, allocated fallibly ([`try_with_capacity`]).
fn try_filled<T: Clone>(n: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut v = reserved_for_keys(n, what)?;
    v.resize(n, value);
    Ok(v)
}

/// Drops a large vector on a helper thread: returning hundreds of MB to the system takes tens
/// of milliseconds that the build need not wait for. Small vectors, or a failed thread start,
/// drop here.
fn free_in_background<T: Send + 'static>(v: Vec<T>) {
    if v.capacity().saturating_mul(std::mem::size_of::<T>()) >= 64 << 20 {
        // On a failed start the closure, and with it `v`, is dropped on this thread.
        let _ = std::thread::Builder::new()
            .name("mphf-free".into())
            .spawn(move || drop(v));
    }
}

/// An empty vector with room for `n` elements, allocated fallibly; the caller writes all `n`
/// through its pointer and then sets the length.
fn reserved_for_keys<T>(n: usize, what: &str) -> Result<Vec<T>> {
    try_with_capacity(n, || {
        format!(
            "building an MPHF over {n} keys: cannot allocate {} bytes for {what}",
            n.saturating_mul(std::mem::size_of::<T>())
        )
    })
}

/// Indices of the first occurrence of each distinct key, ascending.
fn distinct_indices<K: KeySet + ?Sized>(keys: &K, seed: u64) -> Result<Vec<usize>> {
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
fn find_duplicate<K: KeySet + ?Sized>(keys: &K, seed: u64, num_buckets: u64, bucket: u64, lo: u64) -> Option<String> {
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

/// A raw pointer that rayon tasks may share; every user writes disjoint positions.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: used only for writes to disjoint indices, proven at each use site.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper, not the field).
    fn get(self) -> *mut T {
        self.0
    }
}

/// Sorts the keys' `lo` hashes by bucket: returns `lo` (bucket-contiguous) and bucket offsets
/// (λ, length B+1). See the module docs for the two-step counting sort.
///
/// # Errors
/// [`MphfError::OutOfMemory`] when the per-key arrays cannot be allocated.
pub fn bucketize<K: KeySet + ?Sized>(keys: &K, seed: u64, num_buckets: u64) -> Result<(Vec<u64>, Vec<u64>)> {
    let n = keys.len();
    let num_ranges = num_buckets.min(4096) as usize;
    let range_of = |b: u64| ((b as u128 * num_ranges as u128) / num_buckets as u128) as usize;
    let first_bucket = |p: usize| ((p as u128 * num_buckets as u128).div_ceil(num_ranges as u128)) as u64;
    let chunk = (n / (4 * rayon::current_num_threads()).max(1)).clamp(1 << 14, 1 << 22);
    let num_chunks = n.div_ceil(chunk).max(1);

    // Step 1a: per-chunk histograms over ranges.
    let hists: Vec<Vec<u64>> = (0..num_chunks)
        .into_par_iter()
        .map(|c| {
            let mut h = vec![0u64; num_ranges];
            for i in c * chunk..((c + 1) * chunk).min(n) {
                let hash = keys.hash128(i, seed);
                h[range_of(bucket_of(hash.hi, num_buckets))] += 1;
            }
            h
        })
        .collect();
    // Prefix sums in (range, chunk) order give each chunk's cursor per range.
    let mut cursors = vec![vec![0u64; num_ranges]; num_chunks];
    let mut range_start = vec![0u64; num_ranges + 1];
    let mut acc = 0u64;
    for p in 0..num_ranges {
        range_start[p] = acc;
        for c in 0..num_chunks {
            cursors[c][p] = acc;
            acc += hists[c][p];
        }
    }
    range_start[num_ranges] = acc;
    drop(hists);

    // Step 1b: scatter (hi, lo) into range order.
    // Neither array is zero-filled first: the scatters below write every position exactly once,
    // and they do it on all threads, so the pages are also first touched in parallel.
    let mut tmp: Vec<Hash128> = reserved_for_keys(n, "the bucket order")?;
    let out = SharedMut(tmp.as_mut_ptr());
    cursors.into_par_iter().enumerate().for_each(|(c, mut cur)| {
        for i in c * chunk..((c + 1) * chunk).min(n) {
            let hash = keys.hash128(i, seed);
            let p = range_of(bucket_of(hash.hi, num_buckets));
            // SAFETY: cursor (c, p) walks the slots [start(c,p), start(c,p)+hist[c][p]), and these
            // intervals are disjoint across (c, p) and cover 0..n exactly (prefix sums above).
            unsafe { out.get().add(cur[p] as usize).write(hash) };
            cur[p] += 1;
        }
    });
    // SAFETY: the cursor intervals cover 0..n exactly (prefix sums above), so every element of
    // the capacity-n allocation was written once; Hash128 is plain data.
    unsafe { tmp.set_len(n) };

    // Step 2: counting sort inside each range; fills λ for the range's buckets.
    let mut lo: Vec<u64> = reserved_for_keys(n, "the in-bucket hashes")?;
    let mut offsets = vec![0u64; num_buckets as usize + 1];
    let lo_ptr = SharedMut(lo.as_mut_ptr());
    let off_ptr = SharedMut(offsets.as_mut_ptr());
    (0..num_ranges).into_par_iter().for_each(|p| {
        let (s, e) = (range_start[p] as usize, range_start[p + 1] as usize);
        let (b0, b1) = (first_bucket(p), first_bucket(p + 1));
        // SAFETY: buckets b0..b1 belong to range p alone, so no other task touches these λ slots.
        let starts = unsafe { std::slice::from_raw_parts_mut(off_ptr.get().add(b0 as usize), (b1 - b0) as usize) };
        sort_by_bucket(tmp[s..e].iter(), b0, num_buckets, s as u64, starts, |at, lo| {
            // SAFETY: the positions of this range stay inside [s, e), which no other range touches.
            unsafe { lo_ptr.get().add(at).write(lo) }
        });
    });
    // SAFETY: range p writes exactly the positions [range_start[p], range_start[p+1]) (its
    // counting-sort cursors start at s and advance once per key of the range), and the ranges
    // tile 0..n; so all n elements of the capacity-n allocation were written.
    unsafe { lo.set_len(n) };
    offsets[num_buckets as usize] = n as u64;
    Ok((lo, offsets))
}

/// Counting sort by bucket of hashes whose buckets all lie in `b0 .. b0 + starts.len()`: sets
/// `starts[k]` to the position of bucket `b0 + k`'s first key (positions from `base`), and hands
/// every hash's `lo` to `put` with its position.
pub(super) fn sort_by_bucket<'a>(
    src: impl Iterator<Item = &'a Hash128> + Clone,
    b0: u64,
    num_buckets: u64,
    base: u64,
    starts: &mut [u64],
    mut put: impl FnMut(usize, u64),
) {
    starts.fill(0);
    for h in src.clone() {
        starts[(bucket_of(h.hi, num_buckets) - b0) as usize] += 1;
    }
    let mut pos = base;
    for start in starts.iter_mut() {
        let count = *start;
        *start = pos;
        pos += count;
    }
    let mut cursor = starts.to_vec();
    for h in src {
        let c = &mut cursor[(bucket_of(h.hi, num_buckets) - b0) as usize];
        put(*c as usize, h.lo);
        *c += 1;
    }
}

/// Checks every bucket for the size cap and repeated `lo` (sorting each bucket); reports the
/// failure of the first offending bucket.
pub fn check_buckets(lo: &mut [u64], offsets: &[u64]) -> std::result::Result<(), SolveError> {
    let slices = split_buckets(lo, offsets, 1 << 16);
    let first_err = slices
        .into_par_iter()
        .map(|(b0, b1, keys)| {
            let base = offsets[b0];
            for b in b0..b1 {
                let (s, e) = ((offsets[b] - base) as usize, (offsets[b + 1] - base) as usize);
                if e - s >= MAX_BUCKET_KEYS {
                    return Err(SolveError::BucketTooLarge {
                        bucket: b as u64,
                        size: e - s,
                    });
                }
                let keys = &mut keys[s..e];
                keys.sort_unstable();
                if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
                    return Err(SolveError::DuplicateLo {
                        bucket: b as u64,
                        lo: w[0],
                    });
                }
            }
            Ok(())
        })
        .collect::<Vec<_>>();
    first_err.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
}

/// Splits the bucket-contiguous keys into chunks of whole buckets of about `target` keys;
/// yields (first bucket, end bucket, keys).
fn split_buckets<'a>(mut lo: &'a mut [u64], offsets: &[u64], target: u64) -> Vec<(usize, usize, &'a mut [u64])> {
    let num_buckets = offsets.len() - 1;
    let mut out = Vec::new();
    let mut b = 0usize;
    while b < num_buckets {
        let start = offsets[b];
        let mut e = b + 1;
        while e < num_buckets && offsets[e] - start < target {
            e += 1;
        }
        let len = (offsets[e] - start) as usize;
        let (head, tail) = std::mem::take(&mut lo).split_at_mut(len);
        out.push((b, e, head));
        lo = tail;
        b = e;
    }
    out
}

/// Chunk size (in keys) for the parallel solve: small enough for load balance, large enough
/// that per-chunk bookkeeping is negligible.
fn solve_chunk_keys(n: u64) -> u64 {
    let threads = rayon::current_num_threads() as u64;
    (n / (16 * threads).max(1)).clamp(1 << 10, 1 << 18)
}

/// Solves and encodes all buckets on the CPU; returns R and σ (length B+1).
fn solve_and_encode_cpu(
    params: &Params,
    lo: &mut [u64],
    offsets: &[u64],
    watchdog: u64,
    progress: Option<&AtomicU64>,
) -> std::result::Result<(RiceBuilder, Vec<u64>), SolveError> {
    let memo = Memo::get(params.leaf);
    let chunks = split_buckets(lo, offsets, solve_chunk_keys(*offsets.last().unwrap_or(&0)));
    let outs = chunks
        .into_par_iter()
        .map(|(b0, b1, keys)| {
            let mut rice = RiceBuilder::new();
            let mut sigma = Vec::with_capacity(b1 - b0);
            let mut desc = Vec::new();
            let mut scratch = vec![0u64; MAX_BUCKET_KEYS];
            let base = offsets[b0];
            for b in b0..b1 {
                let (s, e) = ((offsets[b] - base) as usize, (offsets[b + 1] - base) as usize);
                desc.clear();
                solve_bucket(params, &mut keys[s..e], &mut scratch, watchdog, &mut desc)?;
                sigma.push(rice.len());
                encode_bucket(memo, e - s, &desc, &mut rice);
                if let Some(p) = progress {
                    p.fetch_add((e - s) as u64, Ordering::Relaxed);
                }
            }
            Ok((b0, b1, rice, sigma))
        })
        .collect::<std::result::Result<Vec<_>, SolveError>>()?;
    Ok(concat_chunks(offsets.len() - 1, outs))
}

/// Concatenates per-chunk Rice vectors in bucket order; σ of empty trailing buckets continue
/// the running total.
pub(super) fn concat_chunks(
    num_buckets: usize,
    outs: Vec<(usize, usize, RiceBuilder, Vec<u64>)>,
) -> (RiceBuilder, Vec<u64>) {
    let mut rice = RiceBuilder::new();
    let mut sigma = vec![0u64; num_buckets + 1];
    let mut next = 0usize;
    for (b0, b1, chunk, local) in outs {
        for s in sigma.iter_mut().take(b0).skip(next) {
            *s = rice.len();
        }
        let base = rice.len();
        for (k, s) in local.iter().enumerate() {
            sigma[b0 + k] = base + s;
        }
        debug_assert_eq!(b0 + local.len(), b1);
        rice.append(&chunk);
        next = b1;
    }
    for s in sigma.iter_mut().skip(next) {
        *s = rice.len();
    }
    (rice, sigma)
}

/// Index of each bucket's first descriptor in the flat preorder list (length B+1; the last
/// entry is the total). The shape of a bucket depends only on its size, so this is known
/// before any search.
pub fn descriptor_starts(memo: &Memo, offsets: &[u64]) -> Vec<usize> {
    let mut starts = Vec::with_capacity(offsets.len());
    let mut total = 0usize;
    for w in offsets.windows(2) {
        starts.push(total);
        total += memo.nodes[(w[1] - w[0]) as usize] as usize;
    }
    starts.push(total);
    starts
}

/// Encodes descriptors produced by a [`BucketSolver`] (bucket after bucket, preorder), in
/// parallel over ranges of buckets joined like the CPU path's ([`concat_chunks`]).
fn encode_from_descriptors(
    params: &Params,
    offsets: &[u64],
    descriptors: &[u64],
) -> std::result::Result<(RiceBuilder, Vec<u64>), SolveError> {
    let memo = Memo::get(params.leaf);
    let num_buckets = offsets.len() - 1;
    let dstart = descriptor_starts(memo, offsets);
    let used = dstart[num_buckets];
    assert_eq!(
        used,
        descriptors.len(),
        "solver returned {} descriptors, the shapes need {used}",
        descriptors.len()
    );
    let target = solve_chunk_keys(*offsets.last().unwrap_or(&0));
    let mut ranges = Vec::new();
    let mut b = 0usize;
    while b < num_buckets {
        let mut e = b + 1;
        while e < num_buckets && offsets[e] - offsets[b] < target {
            e += 1;
        }
        ranges.push((b, e));
        b = e;
    }
    let outs = ranges
        .into_par_iter()
        .map(|(b0, b1)| {
            let mut rice = RiceBuilder::new();
            let mut sigma = Vec::with_capacity(b1 - b0);
            for b in b0..b1 {
                sigma.push(rice.len());
                let m = (offsets[b + 1] - offsets[b]) as usize;
                encode_bucket(memo, m, &descriptors[dstart[b]..dstart[b + 1]], &mut rice);
            }
            (b0, b1, rice, sigma)
        })
        .collect();
    Ok(concat_chunks(num_buckets, outs))
}

/// Appends one bucket's code: fixed parts in preorder, then unary parts in preorder (spec §7.4).
pub fn encode_bucket(memo: &Memo, m: usize, desc: &[u64], rice: &mut RiceBuilder) {
    let mut taus = Vec::with_capacity(desc.len());
    preorder_taus(memo, m, &mut taus);
    debug_assert_eq!(taus.len(), desc.len());
    for (&d, &t) in desc.iter().zip(&taus) {
        rice.push_bits(d, t as u32);
    }
    for (&d, &t) in desc.iter().zip(&taus) {
        rice.push_unary(d >> t);
    }
}

/// The Rice parameters of a subtree's nodes in preorder.
pub fn preorder_taus(memo: &Memo, m: usize, out: &mut Vec<u8>) {
    if m <= 1 {
        return;
    }
    out.push(memo.tau[m]);
    if m > memo.leaf {
        let mut parts = [0usize; 9];
        let f = tree::children(m, memo.leaf, &mut parts);
        for &k in &parts[..f] {
            preorder_taus(memo, k, out);
        }
    }
}

/// Solves one bucket (keys may be reordered); appends its descriptors in preorder.
///
/// # Errors
/// [`SolveError::Watchdog`] when a node's search passes `watchdog` candidates.
pub fn solve_bucket(
    params: &Params,
    keys: &mut [u64],
    scratch: &mut [u64],
    watchdog: u64,
    out: &mut Vec<u64>,
) -> std::result::Result<(), SolveError> {
    macro_rules! dispatch {
        ($($l:literal)*) => {
            match params.leaf {
                $($l => Solver::<$l> { rotation: params.rotation, watchdog }.node(keys, scratch, 0, out),)*
                other => unreachable!("leaf size {other} passed validation"),
            }
        };
    }
    dispatch!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
}

/// Lanes evaluated together; the inner loops are written so LLVM vectorizes them (AVX2).
const LANES: usize = 8;

/// The search for one leaf size `L` (monomorphized per ℓ).
struct Solver<const L: usize> {
    rotation: bool,
    watchdog: u64,
}

impl<const L: usize> Solver<L> {
    /// First-aggregation unit A1 for this ℓ (a compile-time constant per instance).
    const A1: usize = lower_aggr(L);
    /// Second-aggregation unit A2 for this ℓ.
    const A2: usize = upper_aggr(L);

    fn node(
        &self,
        keys: &mut [u64],
        scratch: &mut [u64],
        depth: usize,
        out: &mut Vec<u64>,
    ) -> std::result::Result<(), SolveError> {
        let m = keys.len();
        if m <= 1 {
            return Ok(());
        }
        if m <= L {
            let d = if self.rotation && m == L {
                self.leaf_rotated(keys)?
            } else {
                self.leaf(keys)?
            };
            out.push(d);
            return Ok(());
        }
        let (a1, a2) = (Self::A1, Self::A2);
        let (unit, seed) = if m <= a1 {
            (L, SEED_AGG1)
        } else if m <= a2 {
            (a1, SEED_AGG2)
        } else {
            let left = split_left(m, a2);
            let seed = START_SEEDS[depth];
            let d = self.split_high(keys, left, seed)?;
            out.push(d);
            redistribute(
                keys,
                scratch,
                |y| (range_h32(y.wrapping_add(seed).wrapping_add(d), m as u32) as usize >= left) as usize,
                &[0, left],
            );
            let (l, r) = keys.split_at_mut(left);
            self.node(l, scratch, depth + 1, out)?;
            return self.node(r, scratch, depth + 1, out);
        };
        let d = if unit == L {
            self.split_agg::<false>(keys)?
        } else {
            self.split_agg::<true>(keys)?
        };
        out.push(d);
        let fanout = m.div_ceil(unit);
        let mut starts = [0usize; 9];
        for (j, s) in starts.iter_mut().enumerate().take(fanout) {
            *s = j * unit;
        }
        redistribute(
            keys,
            scratch,
            |y| range_h32(y.wrapping_add(seed).wrapping_add(d), m as u32) as usize / unit,
            &starts[..fanout],
        );
        for child in keys.chunks_mut(unit) {
            self.node(child, scratch, depth, out)?;
        }
        Ok(())
    }

    /// First `d` with `{R_m(y + S19 + d)}` a bijection onto `[m]` (spec §5.1–5.2).
    fn leaf(&self, keys: &[u64]) -> std::result::Result<u64, SolveError> {
        let m = keys.len();
        let full = (1u32 << m) - 1;
        // Midstop (spec §5.2): with α = 2 from m ≥ 9 on, most candidates fail on the first keys.
        let p = if m >= 9 {
            ((2.0 * (m as f64).sqrt()).ceil() as usize).min(m)
        } else {
            m
        };
        let (head, tail) = keys.split_at(p);
        let mut base = 0u64;
        loop {
            let mut masks = [0u32; LANES];
            for &y in head {
                let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                for (j, mask) in masks.iter_mut().enumerate() {
                    *mask |= 1 << range_h32(x.wrapping_add(j as u64), m as u32);
                }
            }
            if masks.iter().any(|k| k.count_ones() as usize == p) {
                for &y in tail {
                    let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                    for (j, mask) in masks.iter_mut().enumerate() {
                        *mask |= 1 << range_h32(x.wrapping_add(j as u64), m as u32);
                    }
                }
                if let Some(j) = masks.iter().position(|&k| k == full) {
                    return Ok(base + j as u64);
                }
            }
            base += LANES as u64;
            if base > self.watchdog {
                return Err(SolveError::Watchdog { keys: m });
            }
        }
    }

    /// Rotation search for a full leaf (spec §5.3): bases step by ℓ; the smallest base, then
    /// the smallest rotation r, gives `D = base + r`.
    fn leaf_rotated(&self, keys: &[u64]) -> std::result::Result<u64, SolveError> {
        let mut even = [0u64; L];
        let mut odd = [0u64; L];
        let (mut ne, mut no) = (0usize, 0usize);
        for &y in keys {
            if y & 1 == 0 {
                even[ne] = y;
                ne += 1;
            } else {
                odd[no] = y;
                no += 1;
            }
        }
        let full = (1u32 << L) - 1;
        let mut base = 0u64;
        loop {
            let mut ma = [0u32; LANES];
            for &y in &even[..ne] {
                let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                for (j, mask) in ma.iter_mut().enumerate() {
                    *mask |= 1 << range_h32(x.wrapping_add((j * L) as u64), L as u32);
                }
            }
            if ma.iter().any(|k| k.count_ones() as usize == ne) {
                let mut mb = [0u32; LANES];
                for &y in &odd[..no] {
                    let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                    for (j, mask) in mb.iter_mut().enumerate() {
                        *mask |= 1 << range_h32(x.wrapping_add((j * L) as u64), L as u32);
                    }
                }
                for j in 0..LANES {
                    if ma[j].count_ones() as usize == ne && mb[j].count_ones() as usize == no {
                        for r in 0..L as u32 {
                            if ma[j] | rotl(mb[j], r, L as u32) == full {
                                return Ok(base + (j * L) as u64 + r as u64);
                            }
                        }
                    }
                }
            }
            base += (LANES * L) as u64;
            if base > self.watchdog {
                return Err(SolveError::Watchdog { keys: L });
            }
        }
    }

    /// First `d` splitting the keys into chunks of `unit` (spec §6.1), with 8-bit packed
    /// counters (spec §6.3): byte j counts child j; fanout ≤ 9, so child 8 adds nothing and the
    /// whole word is compared with the target.
    ///
    /// `LEVEL2` selects Agg2 (unit A1, seed S17) over Agg1 (unit ℓ, seed S18); both units are
    /// compile-time constants, so `/ unit` becomes a multiply and shift (spec §6.1).
    fn split_agg<const LEVEL2: bool>(&self, keys: &[u64]) -> std::result::Result<u64, SolveError> {
        let (unit, seed) = if LEVEL2 { (Self::A1, SEED_AGG2) } else { (L, SEED_AGG1) };
        let m = keys.len();
        let fanout = m.div_ceil(unit);
        let mut target = 0u64;
        for j in 0..fanout.min(8) {
            let count = if j + 1 < fanout { unit } else { m - (fanout - 1) * unit };
            target |= (count as u64) << (8 * j);
        }
        // One candidate at a time, vectorized across keys: the packed counters are a plain
        // wrapping-sum reduction, which LLVM turns into AVX2 lanes (8 keys per step).
        let mut d = 0u64;
        loop {
            let x0 = seed.wrapping_add(d);
            let counters = keys.iter().fold(0u64, |acc, &y| {
                let child = range_h32(y.wrapping_add(x0), m as u32) / unit as u32;
                // Branch-free: child 8 (fanout 9) adds nothing.
                acc.wrapping_add((1u64 << (child.wrapping_mul(8) & 63)) & 0u64.wrapping_sub((child < 8) as u64))
            });
            if counters == target {
                return Ok(d);
            }
            d += 1;
            if d > self.watchdog {
                return Err(SolveError::Watchdog { keys: m });
            }
        }
    }

    /// First `d` sending exactly `left` keys below `left` (spec §6.1, high levels).
    fn split_high(&self, keys: &[u64], left: usize, seed: u64) -> std::result::Result<u64, SolveError> {
        let m = keys.len();
        let mut d = 0u64;
        loop {
            let x0 = seed.wrapping_add(d);
            let below = keys
                .iter()
                .map(|&y| ((range_h32(y.wrapping_add(x0), m as u32) as usize) < left) as u32)
                .sum::<u32>();
            if below as usize == left {
                return Ok(d);
            }
            d += 1;
            if d > self.watchdog {
                return Err(SolveError::Watchdog { keys: m });
            }
        }
    }
}

/// `rotl_m(v, r)` on the low `m` bits (spec §0).
#[inline(always)]
pub fn rotl(v: u32, r: u32, m: u32) -> u32 {
    if r == 0 {
        v
    } else {
        ((v << r) | (v >> (m - r))) & ((1u32 << m) - 1)
    }
}

/// Moves keys so that child j occupies `[starts[j], starts[j+1])` (spec §6.2).
#[inline]
fn redistribute(keys: &mut [u64], scratch: &mut [u64], child_of: impl Fn(u64) -> usize, starts: &[usize]) {
    let mut cur = [0usize; 9];
    cur[..starts.len()].copy_from_slice(starts);
    for &y in keys.iter() {
        let c = child_of(y);
        scratch[cur[c]] = y;
        cur[c] += 1;
    }
    keys.copy_from_slice(&scratch[..keys.len()]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_vectors() {
        // Spec §5.3 tiny example: plain search gives d = 2, rotation with ℓ = 4 gives D = 2.
        let keys = [
            0x1111111111111111u64,
            0x2222222222222222,
            0x3333333333333334,
            0x4444444444444447,
        ];
        let plain = Solver::<8> {
            rotation: false,
            watchdog: DEFAULT_WATCHDOG,
        }
        .leaf(&keys)
        .unwrap();
        assert_eq!(plain, 2);
        let vals: Vec<u32> = keys
            .iter()
            .map(|&y| range_h32(y.wrapping_add(SEED_LEAF).wrapping_add(2), 4))
            .collect();
        assert_eq!(vals, [0, 1, 2, 3]);
        let rot = Solver::<4> {
            rotation: true,
            watchdog: DEFAULT_WATCHDOG,
        }
        .leaf_rotated(&keys)
        .unwrap();
        assert_eq!(rot, 2);
    }

    #[test]
    fn watchdog_fires() {
        // Two equal keys can never be separated.
        let keys = [5u64, 5];
        let s = Solver::<8> {
            rotation: false,
            watchdog: 1000,
        };
        assert_eq!(s.leaf(&keys), Err(SolveError::Watchdog { keys: 2 }));
    }

    #[test]
    fn rotl_examples() {
        assert_eq!(rotl(0b1001, 2, 4), 0b0110);
        assert_eq!(rotl(0b1001, 0, 4), 0b1001);
        assert_eq!(rotl(0b1000, 1, 4), 0b0001);
    }
}

#[cfg(test)]
mod speed_probe {
    use super::*;

    #[test]
    #[ignore = "timing probe, run by hand"]
    fn leaf_speed() {
        for m in [8usize, 12, 14] {
            let mut total = 0u64;
            let t = std::time::Instant::now();
            let s = Solver::<16> {
                rotation: false,
                watchdog: DEFAULT_WATCHDOG,
            };
            for leaf in 0..20u64 {
                let keys: Vec<u64> = (0..m as u64)
                    .map(|i| crate::core::hash::mix64(leaf * 100 + i + 1))
                    .collect();
                total += s.leaf(&keys).unwrap();
            }
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "m={m}: {} candidates, {:.2} ns/candidate, {:.3} ns/eval",
                total,
                secs * 1e9 / total as f64,
                secs * 1e9 / (total * m as u64) as f64
            );
        }
        for (level2, m) in [(false, 112usize), (true, 560)] {
            let s = Solver::<16> {
                rotation: false,
                watchdog: DEFAULT_WATCHDOG,
            };
            let t = std::time::Instant::now();
            let mut total = 0u64;
            for node in 0..2u64 {
                let keys: Vec<u64> = (0..m as u64)
                    .map(|i| crate::core::hash::mix64(node * 10000 + i + 1))
                    .collect();
                total += if level2 {
                    s.split_agg::<true>(&keys).unwrap()
                } else {
                    s.split_agg::<false>(&keys).unwrap()
                };
            }
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "split m={m}: {} candidates, {:.3} ns/eval",
                total,
                secs * 1e9 / (total * m as u64) as f64
            );
        }
    }
}
