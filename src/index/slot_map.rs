//! [`SlotMaps`]: the slot of every row of an indexed column, one array per data file, in the
//! file's row order (row `r` of the file, counted over all its row groups, has slot
//! `slots[r]`).
//!
//! Why: over Parquet a scan decodes fresh arrays, so without slot maps every row of an
//! unclustered key costs an MPHF query and a verification, about what hashing it into a table
//! costs. The MPHF is paid for once, when the index is made: the slot of each row is stored
//! (4 bytes a row) and a scan that knows each batch's file and row numbers copies it.
//!
//! # File format (little-endian, one file per index, written atomically)
//! ```text
//! magic "MPHFSLT1" | u64 version | u64 index identity | u64 slot count | u64 files
//! per file: u64 stamp length | stamp line bytes | u64 rows | rows × u32 slots
//! u64 xxh3-64 of every byte before it
//! ```
//!
//! # Invariants
//! - A slot is below the index's slot count, or [`NO_SLOT`] for a NULL key (the index has no
//!   other non-members: it was built over these very rows).
//! - A slot map is used only for the index it was made with (its *identity*, see
//!   [`SlotMaps::identity_of`]) and for a file whose [`FileStamp`] equals the stored one;
//!   [`SlotMaps::read`] refuses anything else, and a reader that finds a file changed since must
//!   not use its slots (the scan re-stamps each file when it opens it).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use rayon::prelude::*;

use super::FileStamp;
use crate::atomic_file::AtomicFile;
use crate::core::column::{ColumnIndex, ABSENT};
use crate::error::{try_with_capacity, MphfError, Result};

/// The slot of a row whose key is NULL.
pub const NO_SLOT: u32 = u32::MAX;

/// First bytes of a slot-map file.
const MAGIC: &[u8; 8] = b"MPHFSLT1";
/// Format version.
const VERSION: u64 = 1;
/// Rows decoded per batch while building.
const BUILD_BATCH_ROWS: usize = 64 * 1024;

/// The slots of one data file's rows.
#[derive(Debug)]
pub struct FileSlots {
    /// The file's stamp when the slots were made.
    pub stamp: FileStamp,
    /// Slot of each row of the file, in file order.
    pub slots: Vec<u32>,
}

/// The slot maps of one index over the files of one table (see the module docs).
#[derive(Debug)]
pub struct SlotMaps {
    /// [`SlotMaps::identity_of`] the index they were made with.
    identity: u64,
    /// Slot count of that index.
    n_slots: u64,
    /// By canonical file path, in path order (the file format's order).
    files: BTreeMap<PathBuf, Arc<FileSlots>>,
    /// The same, hashed: planning asks for every file of a table's scan, and an ordered map's
    /// lookup compares paths component by component.
    by_path: HashMap<PathBuf, Arc<FileSlots>>,
}

fn corrupt(why: impl Into<String>) -> MphfError {
    MphfError::SlotMap(why.into())
}

impl SlotMaps {
    fn new(identity: u64, n_slots: u64, files: BTreeMap<PathBuf, Arc<FileSlots>>) -> Self {
        let by_path = files.iter().map(|(p, f)| (p.clone(), Arc::clone(f))).collect();
        Self {
            identity,
            n_slots,
            files,
            by_path,
        }
    }

    /// What ties slot maps to one index: a hash of its provenance, build time and slot count
    /// (two builds with the same keys, parameters and seed give the same MPHF).
    pub fn identity_of(index: &ColumnIndex) -> u64 {
        let mut bytes = index.provenance().as_bytes().to_vec();
        bytes.extend_from_slice(&index.built_at().to_le_bytes());
        bytes.extend_from_slice(&index.len().to_le_bytes());
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// Reads `column` of every Parquet file of `stamps` and looks each row up in `index`
    /// (files in parallel).
    ///
    /// # Errors
    /// [`MphfError::SlotMap`] when the index has too many slots for `u32`, a file is not Parquet
    /// or lacks the column, or a non-NULL key is not in the index (the index is not of these
    /// files); I/O and allocation failures.
    pub fn build(stamps: &[FileStamp], column: &str, index: &ColumnIndex) -> Result<SlotMaps> {
        Self::build_with(stamps, column, index, &CpuSlots(index))
    }

    /// As [`SlotMaps::build`], with the lookups made by `source` (e.g. the GPU's). The result
    /// is the same: every source gives every row the index's slot.
    ///
    /// # Errors
    /// As [`SlotMaps::build`], and the source's failures.
    pub fn build_with(
        stamps: &[FileStamp],
        column: &str,
        index: &ColumnIndex,
        source: &dyn SlotSource,
    ) -> Result<SlotMaps> {
        if index.len() >= u64::from(NO_SLOT) {
            return Err(corrupt(format!("{} slots do not fit in 32 bits", index.len())));
        }
        let files = stamps
            .par_iter()
            .map(|stamp| {
                let slots = file_slots(&stamp.path, column, source)?;
                Ok((
                    stamp.path.clone(),
                    Arc::new(FileSlots {
                        stamp: stamp.clone(),
                        slots,
                    }),
                ))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        Ok(Self::new(Self::identity_of(index), index.len(), files))
    }

    /// The slots of the file at canonical path `path`.
    pub fn file(&self, path: &Path) -> Option<&Arc<FileSlots>> {
        self.by_path.get(path)
    }

    /// The canonical paths of the files, in order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.files.keys().map(PathBuf::as_path)
    }

    /// Number of files.
    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Bytes held.
    pub fn size_bytes(&self) -> u64 {
        self.files
            .values()
            .map(|f| f.slots.capacity() as u64 * 4 + f.stamp.line.len() as u64)
            .sum()
    }

    /// Bytes [`SlotMaps::write`] writes: what reading them back needs too.
    pub fn serialized_len(&self) -> u64 {
        40 + self
            .files
            .values()
            .map(|f| 16 + f.stamp.line.len() as u64 + 4 * f.slots.len() as u64)
            .sum::<u64>()
            + 8
    }

    /// Writes the slot maps to `path` atomically.
    ///
    /// # Errors
    /// I/O and allocation failures (the target is then unchanged).
    pub fn write(&self, path: &Path) -> Result<()> {
        let len = self.serialized_len() as usize;
        let mut bytes: Vec<u8> = try_with_capacity(len, || format!("{len} bytes of slot maps"))?;
        bytes.extend_from_slice(MAGIC);
        for v in [VERSION, self.identity, self.n_slots, self.files.len() as u64] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        for f in self.files.values() {
            bytes.extend_from_slice(&(f.stamp.line.len() as u64).to_le_bytes());
            bytes.extend_from_slice(f.stamp.line.as_bytes());
            bytes.extend_from_slice(&(f.slots.len() as u64).to_le_bytes());
            for s in &f.slots {
                bytes.extend_from_slice(&s.to_le_bytes());
            }
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        let mut out = AtomicFile::create(path)?;
        out.write_all(&bytes)?;
        out.commit()
    }

    /// Reads the slot maps at `path`, made for `index` over the files of `stamps` as they are
    /// now.
    ///
    /// # Errors
    /// [`MphfError::SlotMap`] saying why they cannot be used: corrupt (magic, version, length,
    /// checksum, a slot out of range), made for another index, or stale (a file's stamp
    /// differs, a file is missing or extra); I/O and allocation failures.
    pub fn read(path: &Path, index: &ColumnIndex, stamps: &[FileStamp]) -> Result<SlotMaps> {
        let meta = std::fs::metadata(path)?;
        if !meta.is_file() {
            return Err(corrupt(format!("{} is not a regular file", path.display())));
        }
        let len = meta.len() as usize;
        let mut bytes: Vec<u8> = try_with_capacity(len, || format!("{len} bytes of slot maps"))?;
        std::io::Read::read_to_end(&mut std::fs::File::open(path)?, &mut bytes)?;
        if bytes.len() < 48 || &bytes[..8] != MAGIC {
            return Err(corrupt("not a slot-map file (bad magic or too short)"));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 8);
        let stored = u64::from_le_bytes(tail.try_into().expect("8 bytes"));
        if xxhash_rust::xxh3::xxh3_64(body) != stored {
            return Err(corrupt("checksum mismatch: the file is corrupt"));
        }
        let mut r = Reader { bytes: body, at: 8 };
        let version = r.u64()?;
        if version != VERSION {
            return Err(corrupt(format!("format version {version}, expected {VERSION}")));
        }
        if r.u64()? != Self::identity_of(index) {
            return Err(corrupt("made for another build of the index"));
        }
        let n_slots = r.u64()?;
        if n_slots != index.len() {
            return Err(corrupt(format!(
                "made for {n_slots} slots, the index has {}",
                index.len()
            )));
        }
        let n_files = r.u64()?;
        if n_files != stamps.len() as u64 {
            return Err(corrupt(format!(
                "stale: made for {n_files} files, the table has {}",
                stamps.len()
            )));
        }
        let mut files = BTreeMap::new();
        for stamp in stamps {
            let line_len = r.len_of(1)?;
            let line = std::str::from_utf8(r.take(line_len)?).map_err(|_| corrupt("a file stamp is not UTF-8"))?;
            if line != stamp.line {
                return Err(corrupt(format!(
                    "stale: {} changed since the slot map was made",
                    stamp.path.display()
                )));
            }
            let rows = r.len_of(4)?;
            let mut slots: Vec<u32> = try_with_capacity(rows, || format!("{rows} slots"))?;
            slots.extend(
                r.take(rows * 4)?
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes"))),
            );
            if let Some(bad) = slots.iter().find(|&&s| s != NO_SLOT && u64::from(s) >= n_slots) {
                return Err(corrupt(format!(
                    "slot {bad} out of range (the index has {n_slots} slots)"
                )));
            }
            files.insert(
                stamp.path.clone(),
                Arc::new(FileSlots {
                    stamp: stamp.clone(),
                    slots,
                }),
            );
        }
        if r.at != body.len() {
            return Err(corrupt(format!("{} bytes after the last file", body.len() - r.at)));
        }
        Ok(Self::new(Self::identity_of(index), n_slots, files))
    }
}

/// Who looks up the slots of a file's rows for [`SlotMaps::build_with`]: the CPU
/// ([`CpuSlots`]) or an accelerator. One interface, so that the file format and its checks do
/// not depend on where the lookups ran.
pub trait SlotSource: Send + Sync {
    /// Appends the slot of every row of `keys` (consecutive batches of one file) to `out`:
    /// the index's slot, or [`NO_SLOT`] for a NULL or absent key (the caller tells the two
    /// apart).
    ///
    /// # Errors
    /// Lookup failures (a key type the index cannot take, a device failure).
    fn append_slots(&self, keys: &[ArrayRef], out: &mut Vec<u32>) -> Result<()>;

    /// Rows to gather before each call (the CPU takes one batch at a time; a device wants
    /// millions of rows per round trip).
    fn rows_per_call(&self) -> usize;
}

/// The CPU's lookups ([`ColumnIndex::lookup_slots`]), one batch at a time.
pub struct CpuSlots<'a>(pub &'a ColumnIndex);

impl SlotSource for CpuSlots<'_> {
    fn append_slots(&self, keys: &[ArrayRef], out: &mut Vec<u32>) -> Result<()> {
        let mut found = Vec::new();
        for batch in keys {
            self.0.lookup_slots(batch.as_ref(), &mut found)?;
            out.extend(found.iter().map(|&s| if s == ABSENT { NO_SLOT } else { s as u32 }));
        }
        Ok(())
    }

    fn rows_per_call(&self) -> usize {
        1
    }
}

/// The slots of the rows of `column` of the Parquet file at `path`, looked up by `source`.
fn file_slots(path: &Path, column: &str, source: &dyn SlotSource) -> Result<Vec<u32>> {
    let parquet_err = |e: parquet::errors::ParquetError| corrupt(format!("{}: {e}", path.display()));
    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path)?).map_err(parquet_err)?;
    let Some(root) = builder.schema().fields().iter().position(|f| f.name() == column) else {
        return Err(corrupt(format!("{} has no column '{column}'", path.display())));
    };
    let rows = builder.metadata().file_metadata().num_rows().max(0) as usize;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [root]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(BUILD_BATCH_ROWS)
        .build()
        .map_err(parquet_err)?;
    let mut slots: Vec<u32> = try_with_capacity(rows, || format!("the slots of {rows} rows"))?;
    let mut pending: Vec<ArrayRef> = Vec::new();
    let mut pending_rows = 0usize;
    let flush = |pending: &mut Vec<ArrayRef>, slots: &mut Vec<u32>| -> Result<()> {
        let start = slots.len();
        source.append_slots(pending, slots)?;
        let expected: usize = pending.iter().map(|k| k.len()).sum();
        if slots.len() - start != expected {
            return Err(corrupt(format!(
                "{}: the lookups gave {} slots for {expected} rows",
                path.display(),
                slots.len() - start
            )));
        }
        let mut at = start;
        for keys in pending.iter() {
            let got = &slots[at..at + keys.len()];
            if let Some(i) = (0..keys.len()).find(|&i| got[i] == NO_SLOT && keys.is_valid(i)) {
                return Err(corrupt(format!(
                    "a key of {} is not in the index (row {})",
                    path.display(),
                    at + i
                )));
            }
            at += keys.len();
        }
        pending.clear();
        Ok(())
    };
    for batch in reader {
        let batch = batch?;
        pending_rows += batch.num_rows();
        pending.push(Arc::clone(batch.column(0)));
        if pending_rows >= source.rows_per_call() {
            flush(&mut pending, &mut slots)?;
            pending_rows = 0;
        }
    }
    if !pending.is_empty() {
        flush(&mut pending, &mut slots)?;
    }
    Ok(slots)
}

/// A bounds-checked cursor over the file's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(corrupt("truncated"));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A count of items of `width` bytes that must fit in what is left.
    fn len_of(&mut self, width: usize) -> Result<usize> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.at) / width;
        if n > left as u64 {
            return Err(corrupt("truncated"));
        }
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::column::IndexOptions;
    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use parquet::arrow::ArrowWriter;

    /// One Parquet file of one Int64 column `k` with `rows` (written in batches of 1000).
    fn write(path: &Path, rows: &[Option<i64>]) -> FileStamp {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), Arc::clone(&schema), None).unwrap();
        for chunk in rows.chunks(1000) {
            let col = Arc::new(Int64Array::from(chunk.to_vec())) as ArrayRef;
            w.write(&RecordBatch::try_new(Arc::clone(&schema), vec![col]).unwrap())
                .unwrap();
        }
        w.close().unwrap();
        FileStamp::of(path).unwrap()
    }

    /// Looks up through the CPU, but as a device would: whole gathers of `rows` rows in one
    /// call, NO_SLOT for NULL and absent alike. `drop_last` loses a row, `miss` reports that
    /// key as absent.
    struct Gathered<'a> {
        index: &'a ColumnIndex,
        rows: usize,
        drop_last: bool,
        miss: Option<i64>,
    }

    impl SlotSource for Gathered<'_> {
        fn append_slots(&self, keys: &[ArrayRef], out: &mut Vec<u32>) -> Result<()> {
            let refs: Vec<&dyn Array> = keys.iter().map(|k| k.as_ref()).collect();
            let all = arrow::compute::concat(&refs)?;
            let mut found = Vec::new();
            self.index.lookup_slots(all.as_ref(), &mut found)?;
            let values = all.as_any().downcast_ref::<Int64Array>().unwrap();
            for (i, &s) in found.iter().enumerate() {
                let missed = values.is_valid(i) && Some(values.value(i)) == self.miss;
                out.push(if s == ABSENT || missed { NO_SLOT } else { s as u32 });
            }
            if self.drop_last {
                out.pop();
            }
            Ok(())
        }

        fn rows_per_call(&self) -> usize {
            self.rows
        }
    }

    /// A source that gathers many batches per call makes the same slot maps as the CPU's
    /// batch-at-a-time lookups, NULL rows included; a source that loses a row or misses a key
    /// is an error naming the file, never a shifted or wrong map.
    #[test]
    fn every_source_makes_the_same_slot_maps() {
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<i64> = (0..5000).map(|i| i * 37 + 11).collect();
        let rows_a: Vec<Option<i64>> = (0..150_000)
            .map(|i| (i % 13 != 0).then_some(keys[(i * 7919) % keys.len()]))
            .collect();
        let rows_b: Vec<Option<i64>> = keys.iter().rev().map(|&k| Some(k)).collect();
        let stamps = vec![
            write(&dir.path().join("a.parquet"), &rows_a),
            write(&dir.path().join("b.parquet"), &rows_b),
        ];
        let index = ColumnIndex::build(
            &[Arc::new(Int64Array::from(keys.clone())) as ArrayRef],
            &IndexOptions {
                params: crate::core::Params::DEFAULT,
                seed: 0,
                threads: None,
                solver: None,
            },
        )
        .unwrap();
        let cpu = SlotMaps::build(&stamps, "k", &index).unwrap();
        for rows in [1, 100_000, 1 << 20] {
            let source = Gathered {
                index: &index,
                rows,
                drop_last: false,
                miss: None,
            };
            let gathered = SlotMaps::build_with(&stamps, "k", &index, &source).unwrap();
            for stamp in &stamps {
                assert_eq!(
                    gathered.file(&stamp.path).unwrap().slots,
                    cpu.file(&stamp.path).unwrap().slots
                );
            }
        }
        let a = cpu.file(&stamps[0].path).unwrap();
        assert_eq!(a.slots.len(), rows_a.len());
        assert!(a.slots.iter().zip(&rows_a).all(|(&s, r)| (s == NO_SLOT) == r.is_none()));

        let lossy = Gathered {
            index: &index,
            rows: 2500,
            drop_last: true,
            miss: None,
        };
        let err = SlotMaps::build_with(&stamps[1..], "k", &index, &lossy)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("b.parquet: the lookups gave 4999 slots for 5000 rows"),
            "{err}"
        );
        let missing = Gathered {
            index: &index,
            rows: 2500,
            drop_last: false,
            miss: Some(rows_b[4321].unwrap()),
        };
        let err = SlotMaps::build_with(&stamps[1..], "k", &index, &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("b.parquet is not in the index (row 4321)"), "{err}");
    }
}
