//! [`FileStamp`]: what identifies the content of one data file, so that anything derived from
//! the file (a saved index's fingerprint, a slot map) is used only while the file is unchanged.
//!
//! A stamp is the file's canonical path, size, modification time (ns), Parquet footer row count
//! (-1 when the file is not Parquet) and an xxh3 hash of its last 64 KiB (the Parquet footer
//! with the page statistics of every column chunk) and of 16 blocks of 4 KiB spread over the
//! rest. Rewriting a file with other keys changes the footer's statistics and page sizes, so a
//! rewrite that keeps name, size and modification time is still seen; a file under 128 KiB is
//! hashed whole.
//!
//! Invariant: [`FileStamp::line`] is the text a saved index's fingerprint stores for the file
//! (one tab-separated line); two stamps of one file are equal iff their lines are.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use parquet::file::metadata::ParquetMetaDataReader;

use crate::error::Result;

/// Bytes read at each sampled offset of the file body.
const SAMPLE_BYTES: u64 = 4096;
/// Sampled offsets of the body.
const SAMPLES: u64 = 16;
/// Bytes hashed at the end of the file (the Parquet footer lives there).
const FOOTER_BYTES: u64 = 64 * 1024;

/// The identity of one data file's content (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Canonical path.
    pub path: PathBuf,
    /// Parquet footer row count (-1: not a Parquet file).
    pub rows: i64,
    /// The fingerprint line: `path \t size \t mtime_ns \t rows \t content hash`.
    pub line: String,
}

impl FileStamp {
    /// The stamp of the file at `path` now.
    ///
    /// # Errors
    /// I/O errors of canonicalizing, `stat` or reading the file.
    pub fn of(path: &Path) -> Result<FileStamp> {
        let path = path.canonicalize()?;
        let md = std::fs::metadata(&path)?;
        let mtime = md.modified()?.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let rows = parquet_rows(&path).unwrap_or(-1);
        let content = content_hash(&path, md.len())?;
        let line = format!("{}\t{}\t{}\t{}\t{content:016x}", path.display(), md.len(), mtime, rows);
        Ok(FileStamp { path, rows, line })
    }
}

/// The row count in a Parquet file's footer, or `None` when it is not a readable Parquet file.
fn parquet_rows(path: &Path) -> Option<i64> {
    let file = std::fs::File::open(path).ok()?;
    let md = ParquetMetaDataReader::new().parse_and_finish(&file).ok()?;
    Some(md.file_metadata().num_rows())
}

/// xxh3 of the last [`FOOTER_BYTES`] of a file of `len` bytes and of [`SAMPLES`] blocks of the
/// rest.
fn content_hash(path: &Path, len: u64) -> Result<u64> {
    let mut file = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    let mut read_at = |offset: u64, n: u64, buf: &mut Vec<u8>| -> std::io::Result<()> {
        file.seek(SeekFrom::Start(offset))?;
        (&mut file).take(n).read_to_end(buf)?;
        Ok(())
    };
    let footer = FOOTER_BYTES.min(len);
    read_at(len - footer, footer, &mut buf)?;
    let body = len - footer;
    if body > 0 {
        for i in 0..SAMPLES {
            read_at(body * i / SAMPLES, SAMPLE_BYTES.min(body), &mut buf)?;
        }
    }
    Ok(xxhash_rust::xxh3::xxh3_64(&buf))
}
