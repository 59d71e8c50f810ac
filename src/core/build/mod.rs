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
//!
//! One submodule per phase: `keys` (the key set, deduplication, naming a repeated key),
//! `bucketing` (steps 1–2), `solve` (step 3 on the CPU), `encode` (step 4). This module
//! holds the [`Builder`] that runs them, re-seeding when a check fails.

mod bucketing;
mod encode;
mod keys;
mod solve;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::elias_fano::DoubleEliasFano;
use super::mphf::Mphf;
use super::params::{Params, MAX_BUCKET_KEYS};
use super::rice::RiceBuilder;
use crate::error::{try_with_capacity, MphfError, Result, SolveError};

pub(in crate::core) use bucketing::sort_by_bucket;
pub use bucketing::{bucketize, check_buckets};
pub(in crate::core) use encode::concat_chunks;
pub use encode::{descriptor_starts, encode_bucket, preorder_taus};
pub use keys::KeySet;
pub use solve::{rotl, solve_bucket};

use encode::encode_from_descriptors;
use keys::{distinct_indices, find_duplicate, Subset};
use solve::solve_and_encode_cpu;

/// Default cap on the candidate index of one node (spec §2.4): far above any real search
/// (ℓ = 24 leaves need ~2·10^9 on average), far below "forever".
pub const DEFAULT_WATCHDOG: u64 = 1 << 44;
/// Default number of seeds tried before a persistent collision is reported (spec §2.4).
pub const DEFAULT_MAX_SEEDS: u32 = 8;

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
