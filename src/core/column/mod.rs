//! Column indexes: an MPHF over the distinct non-NULL keys of one Arrow column, plus those keys
//! in slot order, so that a slot maps back to its key and a lookup verifies membership
//! (a non-member gets "absent", never a wrong slot). Issue 2 item 6.
//!
//! - **Build** ([`ColumnIndex::build`]): one pass over the chunks counts rows and NULLs and drops
//!   the NULLs; the builder runs in deduplicate mode over the null-free keys (a `KeySet` over
//!   the Arrow array, see [`keys`]), and its report names the distinct keys; each distinct key is
//!   then queried once (batched, in parallel) and placed at its slot, giving the keys in slot
//!   order as an Arrow array of the key type.
//! - **Lookup** ([`ColumnIndex::lookup_slots`]): the probe is cast to the key type if needed
//!   (within a type family: integers, dates/timestamps, strings/binaries), queried in blocks with
//!   the batched MPHF query, then verified against `keys[slot]` with the next rows' keys
//!   prefetched. No per-row allocation; primitive keys compare native values, byte keys bytes.
//!   Optional accelerators give the same slots faster: a dense key → slot table for narrow
//!   integer ranges ([`dense`]), the slots of the build arrays' rows found by buffer identity
//!   ([`row_slots`]), and slot translation between two indexes ([`translate`]).
//! - **File** ([`file`]): a versioned, checksummed, 8-byte-aligned little-endian format that
//!   [`ColumnIndex::open`] reads in place from a memory map.
//!
//! Invariant: a lookup of `x` gives a slot `s` iff `x` is a non-NULL key of the build column,
//! and then `keys()[s] == x`; the slots of the distinct keys are exactly `0..len()`.

pub mod dense;
pub mod file;
pub mod keys;
pub mod row_slots;
pub mod translate;

use std::fmt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arrow::array::{new_empty_array, Array, ArrayRef, UInt32Array, UInt64Array};
use arrow::buffer::{BooleanBuffer, NullBuffer};
use arrow::datatypes::{DataType, TimeUnit};
use rayon::prelude::*;

use self::dense::DenseSlots;
use self::keys::{
    arrow_type_of, cast_probe_exact, key_type_of, probe_castable, with_col, with_pair, ColFn, ColKeySet, KeyCol, PairFn,
};
use self::row_slots::RowSlots;
use super::flat::FlatMphf;
use crate::core::build::BucketSolver;
use crate::core::words::{WordWriter, Words};
use crate::core::{Builder, Mphf, Params};
use crate::error::{MphfError, Result};

pub use self::file::{FORMAT_VERSION, MAGIC};

/// Slot value meaning "NULL or not in the index" in [`ColumnIndex::lookup_slots`].
pub const ABSENT: u64 = u64::MAX;

/// The Arrow key types an index supports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyType {
    /// Int8.
    Int8,
    /// Int16.
    Int16,
    /// Int32.
    Int32,
    /// Int64.
    Int64,
    /// UInt8.
    UInt8,
    /// UInt16.
    UInt16,
    /// UInt32.
    UInt32,
    /// UInt64.
    UInt64,
    /// Date32 (days).
    Date32,
    /// Date64 (milliseconds).
    Date64,
    /// Timestamp with unit and optional time zone.
    Timestamp(TimeUnit, Option<Arc<str>>),
    /// Utf8.
    Utf8,
    /// LargeUtf8.
    LargeUtf8,
    /// Utf8View.
    Utf8View,
    /// Binary.
    Binary,
    /// LargeBinary.
    LargeBinary,
}

impl KeyType {
    /// The key type of an Arrow type.
    ///
    /// # Errors
    /// [`crate::MphfError::UnsupportedType`] naming the type.
    pub fn from_arrow(dt: &DataType) -> Result<KeyType> {
        key_type_of(dt)
    }
    /// The Arrow type.
    pub fn to_arrow(&self) -> DataType {
        arrow_type_of(self)
    }
}

/// Options of an index build.
#[derive(Clone, Default)]
pub struct IndexOptions {
    /// MPHF parameters.
    pub params: Params,
    /// First hash seed.
    pub seed: u64,
    /// Worker threads (`None`: all).
    pub threads: Option<usize>,
    /// Optional GPU (or other) bucket solver.
    pub solver: Option<Arc<dyn BucketSolver>>,
}

/// Counts taken while building.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ColumnStats {
    /// Rows scanned.
    pub rows: u64,
    /// NULL rows skipped.
    pub nulls: u64,
    /// Distinct keys (= slots).
    pub distinct: u64,
}

impl ColumnStats {
    /// True when some non-NULL key occurred more than once.
    pub fn had_duplicates(&self) -> bool {
        self.rows - self.nulls > self.distinct
    }
}

/// An MPHF index over one column.
#[derive(Clone)]
pub struct ColumnIndex {
    /// The MPHF over the distinct keys.
    pub(crate) mphf: Mphf,
    /// Type of the keys.
    pub(crate) key_type: KeyType,
    /// Distinct keys in slot order (no NULLs), of type `key_type.to_arrow()`.
    pub(crate) keys: ArrayRef,
    /// Counts taken while building.
    pub(crate) stats: ColumnStats,
    /// Free-form provenance.
    pub(crate) provenance: String,
    /// Who solved the buckets ("cpu", "gpu", ...).
    pub(crate) device: String,
    /// Build time, Unix seconds.
    pub(crate) built_at: u64,
    /// Words of the serialized MPHF.
    pub(crate) mphf_words: u64,
    /// Words of the serialized keys section.
    pub(crate) key_words: u64,
    /// Direct key → slot table for dense integer keys ([`ColumnIndex::with_dense_lookup`]).
    pub(crate) dense: Option<Arc<DenseSlots>>,
    /// Decoded copy of the MPHF for faster queries ([`FlatMphf`]; built with the index, or by
    /// [`ColumnIndex::with_flat_lookup`] after loading).
    pub(crate) flat: Option<Arc<FlatMphf>>,
    /// Slots of the rows of the arrays the index was built from, found by buffer identity
    /// ([`ColumnIndex::with_row_slots`]).
    pub(crate) row_slots: Option<Arc<RowSlots>>,
    /// Smallest and largest key of integer-like keys, once computed.
    pub(crate) key_range: std::sync::OnceLock<Option<(i64, i64)>>,
}

impl fmt::Debug for ColumnIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ColumnIndex")
            .field("key_type", &self.key_type)
            .field("len", &self.len())
            .field("stats", &self.stats)
            .field("params", &self.mphf.params())
            .field("seed", &self.mphf.seed())
            .field("device", &self.device)
            .field("built_at", &self.built_at)
            .field("provenance", &self.provenance)
            .finish()
    }
}

/// The value type of a dictionary column, or the type itself.
pub(crate) fn value_type(dt: &DataType) -> &DataType {
    match dt {
        DataType::Dictionary(_, v) => v,
        other => other,
    }
}

/// Rows per block of the lookup: the batched query of a block, then its verification, stay in
/// L1/L2 (8 KiB of slots).
const LOOKUP_BLOCK: usize = 1024;
/// How many rows ahead the verification prefetches `keys[slot]`.
const VERIFY_AHEAD: usize = 8;
/// A block with fewer than one repeated key in this many rows turns the run detection off...
const RARE_REPEATS: usize = 8;
/// ... for this many blocks.
const SKIP_RUN_BLOCKS: usize = 15;
/// Keys per parallel task when placing the distinct keys at their slots.
const PLACE_CHUNK: usize = 1 << 16;

/// The build body, generic over the key column.
struct BuildFn<'a> {
    builder: &'a Builder,
}

impl ColFn for BuildFn<'_> {
    type Out = Result<(Mphf, Option<Arc<FlatMphf>>, Vec<u64>, String)>;
    fn call<C: KeyCol>(self, col: &C, _arr: &dyn Array) -> Self::Out {
        let (mphf, report) = self.builder.build_with_report(&ColKeySet(col))?;
        let kept = report.kept.unwrap_or_else(|| (0..col.rows()).collect());
        let seed = mphf.seed();
        let flat = FlatMphf::new(&mphf).map(Arc::new);
        let mut slots = vec![0u64; kept.len()];
        slots.par_chunks_mut(PLACE_CHUNK).enumerate().for_each(|(c, out)| {
            let base = c * PLACE_CHUNK;
            let hash_at = |i: usize| col.hash_at(kept[base + i], seed);
            match &flat {
                Some(flat) => flat.index_batch_with(out.len(), hash_at, out),
                None => mphf.index_batch_with(out.len(), hash_at, out),
            }
        });
        let n = kept.len();
        let mut order = vec![u64::MAX; n];
        for (i, &s) in slots.iter().enumerate() {
            // A violation means the MPHF is not a bijection on its own build keys: a bug.
            assert!(
                s < n as u64 && order[s as usize] == u64::MAX,
                "MPHF is not minimal perfect: slot {s} of {n}"
            );
            order[s as usize] = kept[i] as u64;
        }
        Ok((mphf, flat, order, report.solver))
    }
}

/// Total bytes of a byte-key column (for size accounting).
struct DataLen;

impl ColFn for DataLen {
    type Out = u64;
    fn call<C: KeyCol>(self, col: &C, _arr: &dyn Array) -> u64 {
        (0..col.rows()).map(|i| col.byte_len_at(i) as u64).sum()
    }
}

/// The verified batched lookup, generic over the key column.
struct ProbeFn<'a> {
    mphf: &'a Mphf,
    flat: Option<&'a FlatMphf>,
    nulls: Option<&'a NullBuffer>,
    out: &'a mut [u64],
}

impl PairFn for ProbeFn<'_> {
    type Out = ();
    fn call<C: KeyCol>(self, keys: &C, probe: &C) {
        let len = keys.rows() as u64;
        let seed = self.mphf.seed();
        let valid = |row: usize| self.nulls.is_none_or(|n| n.is_valid(row));
        // Rows that start a run of equal keys; only they are queried and verified. Key columns
        // are often clustered (TPC-H lineitem by order key: four rows per key on average), so
        // this skips most MPHF queries there and costs one comparison per row elsewhere.
        let mut heads: Vec<u32> = Vec::with_capacity(LOOKUP_BLOCK);
        let mut head_slots = vec![0u64; LOOKUP_BLOCK];
        // Blocks left before runs are looked for again, after a block with few repeats (a
        // comparison of long keys costs a fraction of a query; unclustered input has no runs).
        let mut skip_runs = 0usize;
        for (b, block) in self.out.chunks_mut(LOOKUP_BLOCK).enumerate() {
            let base = b * LOOKUP_BLOCK;
            heads.clear();
            if skip_runs > 0 {
                skip_runs -= 1;
                heads.extend(0..block.len() as u32);
            } else {
                for i in 0..block.len() {
                    let row = base + i;
                    let repeat = i > 0 && valid(row) && valid(row - 1) && probe.eq_at(row - 1, probe, row);
                    if !repeat {
                        heads.push(i as u32);
                    }
                }
                if (block.len() - heads.len()) * RARE_REPEATS < block.len() {
                    skip_runs = SKIP_RUN_BLOCKS;
                }
            }
            let queried = &mut head_slots[..heads.len()];
            let hash_at = |j: usize| probe.hash_at(base + heads[j] as usize, seed);
            match self.flat {
                Some(flat) => flat.index_batch_with(heads.len(), hash_at, queried),
                None => self.mphf.index_batch_with(heads.len(), hash_at, queried),
            }
            for j in 0..heads.len() {
                if let Some(&ahead) = queried.get(j + 2 * VERIFY_AHEAD) {
                    if ahead < len {
                        keys.prefetch_at(ahead as usize);
                    }
                }
                if let Some(&ahead) = queried.get(j + VERIFY_AHEAD) {
                    if ahead < len {
                        keys.prefetch_value_at(ahead as usize);
                    }
                }
                let row = base + heads[j] as usize;
                let s = queried[j];
                if !(valid(row) && s < len && keys.eq_at(s as usize, probe, row)) {
                    queried[j] = ABSENT;
                }
            }
            let mut next_head = 0;
            for (i, out) in block.iter_mut().enumerate() {
                if heads.get(next_head) == Some(&(i as u32)) {
                    *out = queried[next_head];
                    next_head += 1;
                } else {
                    // A repeat of the previous row's key: same slot (set just before).
                    *out = queried[next_head - 1];
                }
            }
        }
    }
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ColumnIndex {
    /// Builds over the chunks of one column: skips NULLs, removes duplicates.
    ///
    /// Dictionary chunks are decoded to their value type.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use arrow::array::{Array, ArrayRef, Int64Array};
    /// use datafusion_mphf::core::column::{ColumnIndex, IndexOptions};
    /// let col: ArrayRef = Arc::new(Int64Array::from(vec![Some(10), None, Some(30), Some(10)]));
    /// let idx = ColumnIndex::build(&[col], &IndexOptions::default()).unwrap();
    /// assert_eq!(idx.len(), 2);
    /// assert!(idx.stats().had_duplicates());
    /// let probe = Int64Array::from(vec![30, 20]);
    /// let slots = idx.lookup(&probe).unwrap();
    /// assert!(slots.is_valid(0) && slots.is_null(1));
    /// ```
    ///
    /// # Errors
    /// [`MphfError::UnsupportedType`] naming the column type; [`MphfError::InvalidParameter`]
    /// for no chunks, chunks of different types or bad parameters; the builder's errors.
    pub fn build(chunks: &[ArrayRef], opts: &IndexOptions) -> Result<ColumnIndex> {
        Self::build_with_progress(chunks, opts, None)
    }

    /// As [`ColumnIndex::build`], advancing `progress` by the keys whose bucket is solved (see
    /// `Builder::progress`; it ends at the number of distinct keys).
    ///
    /// # Errors
    /// As [`ColumnIndex::build`].
    pub fn build_with_progress(
        chunks: &[ArrayRef],
        opts: &IndexOptions,
        progress: Option<Arc<AtomicU64>>,
    ) -> Result<ColumnIndex> {
        match opts.threads {
            Some(t) => rayon::ThreadPoolBuilder::new()
                .num_threads(t.max(1))
                .build()
                .map_err(|e| MphfError::InvalidParameter(format!("cannot start {t} threads: {e}")))?
                .install(|| Self::build_inner(chunks, opts, progress)),
            None => Self::build_inner(chunks, opts, progress),
        }
    }

    fn build_inner(chunks: &[ArrayRef], opts: &IndexOptions, progress: Option<Arc<AtomicU64>>) -> Result<ColumnIndex> {
        opts.params.validate()?;
        let first = chunks
            .first()
            .ok_or_else(|| MphfError::InvalidParameter("no column chunks: the key type is unknown".into()))?;
        let dt = value_type(first.data_type()).clone();
        let key_type = KeyType::from_arrow(&dt)?;
        let (mut rows, mut nulls) = (0u64, 0u64);
        let mut parts: Vec<ArrayRef> = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            if value_type(chunk.data_type()) != &dt {
                return Err(MphfError::InvalidParameter(format!(
                    "column chunks have different types: {dt} and {}",
                    chunk.data_type()
                )));
            }
            let chunk = if chunk.data_type() != &dt {
                arrow::compute::cast(chunk, &dt)?
            } else {
                chunk.clone()
            };
            rows += chunk.len() as u64;
            let null_count = chunk.logical_null_count();
            nulls += null_count as u64;
            let chunk = if null_count > 0 {
                arrow::compute::filter(&chunk, &arrow::compute::is_not_null(&chunk)?)?
            } else {
                chunk
            };
            if !chunk.is_empty() {
                parts.push(chunk);
            }
        }
        let all: ArrayRef = match parts.len() {
            0 => new_empty_array(&dt),
            1 => parts.pop().expect("one part"),
            _ => {
                let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                let all = arrow::compute::concat(&refs)?;
                drop(parts);
                all
            }
        };
        let mut builder = Builder::new(opts.params)
            .seed(opts.seed)
            .deduplicate(true)
            .solver(opts.solver.clone());
        if let Some(p) = progress {
            builder = builder.progress(p);
        }
        let (mphf, flat, order, device) = with_col(&key_type, all.as_ref(), BuildFn { builder: &builder })?;
        let keys = arrow::compute::take(all.as_ref(), &UInt64Array::from(order), None)?;
        drop(all);
        let distinct = keys.len() as u64;
        let mut idx = ColumnIndex {
            mphf,
            key_type,
            keys,
            stats: ColumnStats { rows, nulls, distinct },
            provenance: String::new(),
            device,
            built_at: now_unix(),
            mphf_words: 0,
            key_words: 0,
            dense: None,
            flat,
            row_slots: None,
            key_range: std::sync::OnceLock::new(),
        };
        let mut w = WordWriter::new();
        idx.mphf.write(&mut w);
        idx.mphf_words = w.out.len() as u64;
        let data = match idx.key_type.width() {
            Some(_) => 0,
            None => with_col(&idx.key_type, idx.keys.as_ref(), DataLen),
        };
        idx.key_words = file::key_section_words(distinct, idx.key_type.width().unwrap_or(0), data);
        Ok(idx)
    }

    /// An upper estimate of the memory [`ColumnIndex::build`] allocates beyond its input, for
    /// `rows` keys whose arrays take `input_bytes`: the NULL-free copy, the key hashes and
    /// their sort, the keys in slot order and the MPHF. Callers reserve it before building.
    ///
    /// Why these factors: besides the input, a build holds up to three more copies of the key
    /// data (the concatenated, NULL-free column, the deduplication's working copy and the keys
    /// in slot order) and up to 80 bytes per row of hashes, bucket order and codes (about 40
    /// per row for the deduplication, as much again per distinct key for the rest; the number
    /// of distinct keys is not known before the build, so every row is counted as one). The peaks
    /// measured with `mphf build` on TPC-H columns lie under this estimate (benches/RESULTS.md,
    /// "Build memory").
    pub fn build_bytes_estimate(rows: u64, input_bytes: u64) -> u64 {
        const COPIES_OF_KEYS: u64 = 3;
        const BYTES_PER_ROW: u64 = 80;
        input_bytes
            .saturating_mul(COPIES_OF_KEYS)
            .saturating_add(rows.saturating_mul(BYTES_PER_ROW))
    }

    /// The MPHF.
    pub fn mphf(&self) -> &Mphf {
        &self.mphf
    }
    /// Key type.
    pub fn key_type(&self) -> &KeyType {
        &self.key_type
    }
    /// Keys in slot order (the key of slot s is `keys()[s]`).
    pub fn keys(&self) -> &ArrayRef {
        &self.keys
    }
    /// Number of slots (distinct keys).
    pub fn len(&self) -> u64 {
        self.keys.len() as u64
    }
    /// True when the index has no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Build statistics.
    pub fn stats(&self) -> &ColumnStats {
        &self.stats
    }
    /// `UInt32`, or `UInt64` when the index has more than 2^32 keys ([`slot_type_for`]).
    pub fn slot_type(&self) -> DataType {
        slot_type_for(self.len())
    }
    /// Who solved the buckets at build time ("cpu", or the solver's name).
    pub fn device(&self) -> &str {
        &self.device
    }
    /// Build time in Unix seconds.
    pub fn built_at(&self) -> u64 {
        self.built_at
    }
    /// The file format version ([`FORMAT_VERSION`]).
    pub fn format_version(&self) -> u64 {
        FORMAT_VERSION
    }
    /// The probe cast to the key type (`None`: already of the key type).
    pub(crate) fn cast_probe(&self, probe: &dyn Array) -> Result<Option<ArrayRef>> {
        let dt = self.key_type.to_arrow();
        if probe.data_type() == &dt {
            return Ok(None);
        }
        if !probe_castable(probe.data_type(), &dt) {
            return Err(MphfError::TypeMismatch {
                index: dt.to_string(),
                probe: probe.data_type().to_string(),
            });
        }
        Ok(Some(cast_probe_exact(probe, &dt)?))
    }

    /// Slots of a probe array as an Arrow array of [`ColumnIndex::slot_type`]; NULL for NULL
    /// and non-member keys. The probe may be any type castable to the key type.
    ///
    /// # Errors
    /// [`MphfError::TypeMismatch`] when the probe's type cannot hold keys of the index's type.
    pub fn lookup(&self, probe: &dyn Array) -> Result<ArrayRef> {
        let mut slots = Vec::new();
        self.lookup_slots(probe, &mut slots)?;
        Ok(slot_array(slots, self.len()))
    }

    /// Raw slots: `out[i]` is the slot of row i, or [`ABSENT`].
    ///
    /// # Errors
    /// As [`ColumnIndex::lookup`].
    pub fn lookup_slots(&self, probe: &dyn Array, out: &mut Vec<u64>) -> Result<()> {
        if self.lookup_row_slots(probe, out) {
            return Ok(());
        }
        let cast = self.cast_probe(probe)?;
        let probe: &dyn Array = cast.as_deref().unwrap_or(probe);
        out.clear();
        out.resize(probe.len(), ABSENT);
        if self.is_empty() || probe.is_empty() || probe.logical_null_count() == probe.len() {
            return Ok(());
        }
        if let Some(dense) = &self.dense {
            if dense.lookup(probe, out) {
                return Ok(());
            }
        }
        let nulls = probe.logical_nulls();
        let f = ProbeFn {
            mphf: &self.mphf,
            flat: self.flat.as_deref(),
            nulls: nulls.as_ref(),
            out,
        };
        with_pair(&self.key_type, self.keys.as_ref(), probe, f);
        Ok(())
    }

    /// Checks that every stored key maps to its own slot (so the MPHF and the keys agree, and
    /// no key is stored twice): the last check of a loaded file, one query per key on all
    /// cores.
    ///
    /// # Errors
    /// [`MphfError::Format`] naming the first key that does not.
    pub(crate) fn check_slots(&self) -> Result<()> {
        const CHUNK: usize = 1 << 15;
        let n = self.keys.len();
        let first_bad = (0..n.div_ceil(CHUNK)).into_par_iter().find_map_first(|c| {
            let start = c * CHUNK;
            let part = self.keys.slice(start, CHUNK.min(n - start));
            let mut slots = Vec::new();
            if self.lookup_slots(part.as_ref(), &mut slots).is_err() {
                return Some(start);
            }
            let wrong = slots.iter().enumerate().find(|&(i, &s)| s != (start + i) as u64);
            wrong.map(|(i, _)| start + i)
        });
        match first_bad {
            None => Ok(()),
            Some(i) => Err(MphfError::Format(format!(
                "stored key {i} does not map to its slot: the MPHF and the keys disagree"
            ))),
        }
    }

    /// Free-form provenance (the DataFusion layer stores its data fingerprint here).
    pub fn provenance(&self) -> &str {
        &self.provenance
    }
    /// Replaces the provenance.
    pub fn set_provenance(&mut self, provenance: String) {
        self.provenance = provenance;
    }
    /// Adds the dense-key table (see [`dense`]) when the keys are integers whose range costs at
    /// most `max_bytes_per_key` bytes (4 per value in the range) per key; lookups then read the
    /// table instead of querying the MPHF, with identical answers. `0` disables it.
    pub fn with_dense_lookup(mut self, max_bytes_per_key: f64) -> Self {
        self.dense = DenseSlots::build(self.keys.as_ref(), max_bytes_per_key).map(Arc::new);
        self
    }

    /// Adds the decoded copy of the MPHF ([`FlatMphf`]: same slots, about 3× faster queries,
    /// under a byte per key at the default parameters) if the index does not have one yet.
    pub fn with_flat_lookup(mut self) -> Self {
        if self.flat.is_none() {
            self.flat = FlatMphf::new(&self.mphf).map(Arc::new);
        }
        self
    }

    /// Keeps the slot of every row of `arrays` (usually the very arrays the index was built
    /// from, as an in-memory table stores them), so that later lookups of these arrays or of
    /// slices of them copy the slots instead of querying (see [`row_slots`]; 4 bytes per row).
    /// Arrays of other layouts are left out; a no-op for an index with a dense-key table, which
    /// is as fast.
    pub fn with_row_slots(mut self, arrays: &[ArrayRef]) -> Self {
        if self.dense.is_some() {
            return self;
        }
        self.row_slots = None;
        let looked_up: Vec<(ArrayRef, Vec<u64>)> = arrays
            .par_iter()
            .filter_map(|a| {
                let mut slots = Vec::new();
                self.lookup_slots(a.as_ref(), &mut slots).ok()?;
                Some((Arc::clone(a), slots))
            })
            .collect();
        let rows = RowSlots::new(looked_up);
        self.row_slots = (!rows.is_empty()).then(|| Arc::new(rows));
        self
    }

    /// The slots of `probe` from the row slots ([`ColumnIndex::with_row_slots`]) when it is one
    /// of their arrays or a slice of one (then `out` holds what [`ColumnIndex::lookup_slots`]
    /// gives); false, and `out` unspecified, otherwise.
    pub fn lookup_row_slots(&self, probe: &dyn Array, out: &mut Vec<u64>) -> bool {
        let Some(rows) = &self.row_slots else {
            return false;
        };
        out.clear();
        out.resize(probe.len(), ABSENT);
        rows.lookup(probe, out)
    }

    /// True when the index keeps row slots.
    pub fn has_row_slots(&self) -> bool {
        self.row_slots.is_some()
    }

    /// Bytes of the row slots (0 without them).
    pub fn row_slot_bytes(&self) -> u64 {
        self.row_slots.as_ref().map_or(0, |r| r.size_bytes() as u64)
    }

    /// Bytes of the decoded MPHF copy (0 without one).
    pub fn flat_lookup_bytes(&self) -> u64 {
        self.flat.as_ref().map_or(0, |f| f.size_bytes() as u64)
    }

    /// Smallest and largest key when the keys are integer-like (computed once).
    pub fn integer_key_range(&self) -> Option<(i64, i64)> {
        *self.key_range.get_or_init(|| dense::integer_range(self.keys.as_ref()))
    }

    /// Bytes of the dense-key table (0 without one).
    pub fn dense_lookup_bytes(&self) -> u64 {
        self.dense.as_ref().map_or(0, |d| d.size_bytes() as u64)
    }

    /// Bytes of the serialized index.
    pub fn size_bytes(&self) -> u64 {
        file::serialized_len(self)
    }
    /// Serializes into bytes.
    pub fn write_bytes(&self) -> Vec<u8> {
        file::write_bytes(self)
    }
    /// Writes to `path` atomically (temporary file, then rename).
    ///
    /// # Errors
    /// [`MphfError::Io`].
    pub fn write_to_path(&self, path: &Path) -> Result<()> {
        file::write_to_path(self, path)
    }
    /// Reads a file into memory and validates it (magic, version, checksum, then every
    /// structure, see [`file::parse`]). The file is read once into owned memory, never mapped,
    /// so a rewrite or truncation of the file while the index is in use cannot affect it.
    ///
    /// # Errors
    /// [`MphfError::Io`] when the file cannot be read; [`MphfError::OutOfMemory`] when its
    /// buffer cannot be allocated; [`MphfError::Format`] when it is not a regular file, changed
    /// while it was read, or is not a valid index of this format version.
    pub fn open(path: &Path) -> Result<ColumnIndex> {
        file::parse(read_checked(path)?)
    }
    /// The provenance string of an index file, read after the checksum check but without the
    /// structural validation of [`ColumnIndex::open`] (for a caller that only needs to know
    /// what the file says it is, and opens it fully later).
    ///
    /// # Errors
    /// As [`ColumnIndex::open`], for the checks it makes.
    pub fn read_provenance(path: &Path) -> Result<String> {
        file::provenance_of(&read_checked(path)?)
    }
    /// Reads from bytes (copied).
    ///
    /// # Errors
    /// [`MphfError::Format`] when the bytes are not a valid index of this format version.
    pub fn from_bytes(bytes: &[u8]) -> Result<ColumnIndex> {
        file::check_raw(bytes)?;
        file::parse(Words::from_bytes(bytes)?)
    }
}

/// The words of the index file at `path`, read into memory, with magic, version, length and
/// checksum checked.
fn read_checked(path: &Path) -> Result<Words> {
    // Only regular files: opening a FIFO blocks until a writer comes, and a device such as
    // /dev/zero reads without end.
    if !std::fs::metadata(path)?.is_file() {
        return Err(MphfError::Format(format!("{} is not a regular file", path.display())));
    }
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let words = file::read_words(&mut f, len).map_err(|e| match e {
        MphfError::Format(m) => MphfError::Format(format!("{}: {m}", path.display())),
        other => other,
    })?;
    file::check_raw(&words.as_bytes()[..len as usize])?;
    Ok(words)
}

/// The Arrow type of the slots of an index with `n_slots` slots: `UInt32` while every slot
/// (at most `n_slots − 1`) fits 32 bits, else `UInt64`.
pub fn slot_type_for(n_slots: u64) -> DataType {
    if n_slots > 1 << 32 {
        DataType::UInt64
    } else {
        DataType::UInt32
    }
}

/// Raw slots (`ABSENT` for NULL or absent keys) as an Arrow array of
/// [`slot_type_for`]`(n_slots)`, NULL where absent. Used by the CPU and GPU lookups alike.
pub fn slot_array(slots: Vec<u64>, n_slots: u64) -> ArrayRef {
    let valid = BooleanBuffer::collect_bool(slots.len(), |i| slots[i] != ABSENT);
    let nulls = NullBuffer::new(valid);
    let nulls = (nulls.null_count() > 0).then_some(nulls);
    if slot_type_for(n_slots) == DataType::UInt32 {
        let values: Vec<u32> = slots.iter().map(|&s| s as u32).collect();
        Arc::new(UInt32Array::new(values.into(), nulls))
    } else {
        Arc::new(UInt64Array::new(slots.into(), nulls))
    }
}
