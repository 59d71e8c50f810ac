//! Column indexes: an MPHF over the distinct non-NULL keys of one Arrow column, plus those keys
//! in slot order, so that a slot maps back to its key and a lookup verifies membership
//! (a non-member gets "absent", never a wrong slot). SKELETON: API fixed, bodies in progress.

use std::path::Path;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{DataType, TimeUnit};

use crate::core::build::BucketSolver;
use crate::core::{Mphf, Params};
use crate::error::Result;

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
        let _ = dt;
        todo!()
    }
    /// The Arrow type.
    pub fn to_arrow(&self) -> DataType {
        todo!()
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
#[derive(Clone, Debug)]
pub struct ColumnIndex {
    _p: (),
}

impl ColumnIndex {
    /// Builds over the chunks of one column: skips NULLs, removes duplicates.
    pub fn build(chunks: &[ArrayRef], opts: &IndexOptions) -> Result<ColumnIndex> {
        let _ = (chunks, opts);
        todo!()
    }
    /// The MPHF.
    pub fn mphf(&self) -> &Mphf {
        todo!()
    }
    /// Key type.
    pub fn key_type(&self) -> &KeyType {
        todo!()
    }
    /// Keys in slot order (the key of slot s is `keys()[s]`).
    pub fn keys(&self) -> &ArrayRef {
        todo!()
    }
    /// Number of slots (distinct keys).
    pub fn len(&self) -> u64 {
        todo!()
    }
    /// True when the index has no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Build statistics.
    pub fn stats(&self) -> &ColumnStats {
        todo!()
    }
    /// `UInt32`, or `UInt64` when the index has more than 2^32 keys.
    pub fn slot_type(&self) -> DataType {
        todo!()
    }
    /// Slots of a probe array as an Arrow array of [`ColumnIndex::slot_type`]; NULL for NULL
    /// and non-member keys. The probe may be any type castable to the key type.
    pub fn lookup(&self, probe: &dyn Array) -> Result<ArrayRef> {
        let _ = probe;
        todo!()
    }
    /// Raw slots: `out[i]` is the slot of row i, or [`ABSENT`].
    pub fn lookup_slots(&self, probe: &dyn Array, out: &mut Vec<u64>) -> Result<()> {
        let _ = (probe, out);
        todo!()
    }
    /// Free-form provenance (the DataFusion layer stores its data fingerprint here).
    pub fn provenance(&self) -> &str {
        todo!()
    }
    /// Replaces the provenance.
    pub fn set_provenance(&mut self, provenance: String) {
        let _ = provenance;
        todo!()
    }
    /// Bytes of the serialized index.
    pub fn size_bytes(&self) -> u64 {
        todo!()
    }
    /// Serializes into bytes.
    pub fn write_bytes(&self) -> Vec<u8> {
        todo!()
    }
    /// Writes to `path` atomically (temporary file, then rename).
    pub fn write_to_path(&self, path: &Path) -> Result<()> {
        let _ = path;
        todo!()
    }
    /// Opens a file through a memory map (no copy); verifies magic, version and checksum.
    pub fn open(path: &Path) -> Result<ColumnIndex> {
        let _ = path;
        todo!()
    }
    /// Reads from bytes (copied).
    pub fn from_bytes(bytes: &[u8]) -> Result<ColumnIndex> {
        let _ = bytes;
        todo!()
    }
}
