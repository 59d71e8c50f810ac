//! Errors of the MPHF core and the column index.
//!
//! Two kinds, as in sux's `vbuilder`: [`MphfError`] is fatal for the caller (bad input, bad file,
//! a build that cannot succeed), [`SolveError`] is internal and retryable (the build tries another
//! seed). Only [`MphfError`] crosses the public API.

use thiserror::Error;

/// A fatal error: the operation cannot succeed with this input.
#[derive(Debug, Error)]
pub enum MphfError {
    /// The input holds the same key twice and deduplication was not requested.
    #[error("duplicate key {key} in the input (pass the deduplicate option to drop repeated keys)")]
    DuplicateKey {
        /// The repeated key, rendered for humans.
        key: String,
    },
    /// Distinct keys kept colliding on their 64-bit in-bucket hash after every allowed re-seed.
    #[error("hash collision between distinct keys persisted after {attempts} seeds (last seed {seed})")]
    PersistentCollision {
        /// Number of seeds tried.
        attempts: u32,
        /// The last seed tried.
        seed: u64,
    },
    /// A bucket reached the hard cap of keys (spec §2.3) under every allowed seed.
    #[error("a bucket holds {size} keys (limit {limit}) after {attempts} seeds")]
    BucketTooLarge {
        /// Keys in the offending bucket.
        size: usize,
        /// The cap (`MAX_BUCKET_KEYS`).
        limit: usize,
        /// Number of seeds tried.
        attempts: u32,
    },
    /// A node's candidate search passed the watchdog limit (spec §2.4).
    #[error("search for a node of {keys} keys passed the watchdog limit of {limit} candidates")]
    Watchdog {
        /// Keys in the node.
        keys: usize,
        /// The candidate limit.
        limit: u64,
    },
    /// A parameter is out of its range.
    #[error("invalid parameter: {0}")]
    InvalidParameter(String),
    /// The key column's type is not supported.
    #[error("unsupported key type {0}: supported are Int8-Int64, UInt8-UInt64, Date32, Date64, Timestamp, Utf8, LargeUtf8, Utf8View, Binary, LargeBinary")]
    UnsupportedType(String),
    /// A probe column's type does not match the index's key type.
    #[error("key type mismatch: the index holds {index} keys, the probe column is {probe}")]
    TypeMismatch {
        /// Type of the indexed keys.
        index: String,
        /// Type of the probe column.
        probe: String,
    },
    /// A serialized index could not be read: truncated, corrupt, foreign, or of another version.
    #[error("invalid index file: {0}")]
    Format(String),
    /// One owner's share of a partitioned build, shipped between processes, could not be read.
    #[error("invalid build part: {0}")]
    PartFormat(String),
    /// A slot-map file that cannot be used (corrupt, stale, or made for another index).
    #[error("slot map: {0}")]
    SlotMap(String),
    /// An I/O error while reading or writing an index file.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// An Arrow error while reading keys.
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// Not enough memory for the requested structure.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
}

/// An empty vector with room for `n` elements, or [`MphfError::OutOfMemory`] with the message
/// `what` gives: the large per-key and per-file buffers are allocated so, and a request too
/// large for the machine (or for `ulimit -v`) becomes an error instead of aborting the process.
///
/// # Errors
/// [`MphfError::OutOfMemory`] when the allocation fails.
pub(crate) fn try_with_capacity<T>(n: usize, what: impl FnOnce() -> String) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| MphfError::OutOfMemory(what()))?;
    Ok(v)
}

/// A retryable failure inside one build attempt: the caller re-seeds and tries again.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SolveError {
    /// Two keys of one bucket share their 64-bit in-bucket hash `lo` (spec §2.4).
    #[error("two keys of bucket {bucket} share the in-bucket hash {lo:#018x}")]
    DuplicateLo {
        /// The bucket.
        bucket: u64,
        /// The shared hash.
        lo: u64,
    },
    /// A bucket has `MAX_BUCKET_KEYS` keys or more (spec §2.3).
    #[error("bucket {bucket} holds {size} keys")]
    BucketTooLarge {
        /// The bucket.
        bucket: u64,
        /// Its size.
        size: usize,
    },
    /// The watchdog fired (spec §2.4).
    #[error("watchdog fired on a node of {keys} keys")]
    Watchdog {
        /// Keys in the node.
        keys: usize,
    },
}

/// Result alias for the crate's fatal errors.
pub type Result<T, E = MphfError> = std::result::Result<T, E>;
