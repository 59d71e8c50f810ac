//! `Words`: an immutable, shared `[u64]`, or a view into one.
//!
//! Every array of a serialized MPHF (Rice bits, Elias–Fano parts, keys) is a run of
//! little-endian `u64` words at an 8-byte-aligned offset, so a loaded index points straight
//! into the buffer the file was read into instead of copying each array out of it.
//! [`WordReader`] hands out such views with bounds checks; a truncated file becomes an error,
//! never an out-of-bounds read.
//!
//! Why no memory map: a mapped file that another process truncates or rewrites in place
//! (`cp other.mphf idx.mphf` during a query) raises SIGBUS, or changes bytes that were already
//! validated. Files are read once into owned memory, checksummed and validated there; the
//! copy costs no more I/O than the checksum, which reads every byte anyway.
//!
//! Invariant: the `[u64]` a `Words` derefs to lies inside its backing vector, which nobody
//! mutates and which the `Arc` keeps alive for as long as the `Words` (or a clone) lives.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::error::{MphfError, Result};

#[cfg(target_endian = "big")]
compile_error!("datafusion-mphf reads its files in place and supports little-endian targets only");

/// An immutable word array, or a view into one. Cheap to clone.
#[derive(Clone)]
pub struct Words {
    backing: Arc<Vec<u64>>,
    /// Start, in words, inside the backing.
    start: usize,
    /// Length in words.
    len: usize,
    /// The first word (`backing` + `start`), cached so that a deref in the query's hot path is
    /// a plain slice construction, not a pointer chase.
    ptr: *const u64,
}

// SAFETY: `ptr` points into the backing, an immutable `Vec<u64>` owned through an `Arc`
// (`Send + Sync`); a `Words` only ever reads through it.
unsafe impl Send for Words {}
// SAFETY: as above: shared read-only access to immutable memory kept alive by the `Arc`.
unsafe impl Sync for Words {}

impl Words {
    /// The view `[start, start+len)` of `backing` (the caller checked the range).
    fn new(backing: Arc<Vec<u64>>, start: usize, len: usize) -> Words {
        debug_assert!(start + len <= backing.len());
        // `start` words lie inside the backing (or start = 0 for an empty one), so the offset
        // pointer stays within the allocation or one past its end.
        let ptr = backing.as_ptr().wrapping_add(start);
        Words {
            backing,
            start,
            len,
            ptr,
        }
    }
}

impl Words {
    /// An empty array.
    pub fn empty() -> Words {
        Words::from(Vec::new())
    }

    /// Copies bytes (whose length must be a multiple of 8) into an owned, aligned array.
    ///
    /// # Errors
    /// [`MphfError::Format`] when the length is not a whole number of words.
    pub fn from_bytes(bytes: &[u8]) -> Result<Words> {
        if !bytes.len().is_multiple_of(8) {
            return Err(MphfError::Format(format!(
                "length {} is not a multiple of 8 bytes",
                bytes.len()
            )));
        }
        let v = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("chunk of 8")))
            .collect::<Vec<u64>>();
        Ok(Words::from(v))
    }

    /// A sub-range `[start, start+len)` of this array, sharing the backing.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn slice(&self, start: usize, len: usize) -> Words {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.len),
            "slice {start}+{len} out of {} words",
            self.len
        );
        Words::new(self.backing.clone(), self.start + start, len)
    }

    /// The words as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        let words: &[u64] = self;
        // SAFETY: a `[u64]` is a valid `[u8]` of 8× the length, in the same allocation.
        unsafe { std::slice::from_raw_parts(words.as_ptr() as *const u8, words.len() * 8) }
    }
}

impl From<Vec<u64>> for Words {
    fn from(v: Vec<u64>) -> Words {
        let len = v.len();
        Words::new(Arc::new(v), 0, len)
    }
}

impl Deref for Words {
    type Target = [u64];
    #[inline(always)]
    fn deref(&self) -> &[u64] {
        // SAFETY: `ptr..ptr+len` lies inside the backing (checked by every constructor and by
        // `slice`), a `Vec<u64>` is 8-byte aligned, and it lives as long as `self` through the
        // Arc.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl fmt::Debug for Words {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Words(len={})", self.len)
    }
}

impl PartialEq for Words {
    fn eq(&self, other: &Words) -> bool {
        **self == **other
    }
}
impl Eq for Words {}

/// Reads consecutive values and word arrays from a [`Words`], with bounds checks.
pub struct WordReader<'a> {
    data: &'a Words,
    pos: usize,
}

impl<'a> WordReader<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a Words) -> Self {
        WordReader { data, pos: 0 }
    }

    /// Position in words.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Words left.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Reads one word.
    ///
    /// # Errors
    /// [`MphfError::Format`] ("truncated") at the end of the data.
    pub fn u64(&mut self, what: &str) -> Result<u64> {
        let v = *self
            .data
            .get(self.pos)
            .ok_or_else(|| MphfError::Format(format!("truncated while reading {what}")))?;
        self.pos += 1;
        Ok(v)
    }

    /// Reads one word that must fit a `usize` below `limit`.
    ///
    /// # Errors
    /// [`MphfError::Format`] when truncated or when the value is `≥ limit`.
    pub fn bounded(&mut self, what: &str, limit: u64) -> Result<u64> {
        let v = self.u64(what)?;
        if v >= limit {
            return Err(MphfError::Format(format!(
                "{what} = {v} is out of range (limit {limit})"
            )));
        }
        Ok(v)
    }

    /// Takes the next `len` words as a shared view.
    ///
    /// # Errors
    /// [`MphfError::Format`] ("truncated") if fewer than `len` words remain.
    pub fn words(&mut self, len: u64, what: &str) -> Result<Words> {
        if len > self.remaining() as u64 {
            return Err(MphfError::Format(format!(
                "truncated while reading {what}: need {len} words, {} left",
                self.remaining()
            )));
        }
        let w = self.data.slice(self.pos, len as usize);
        self.pos += len as usize;
        Ok(w)
    }
}

/// Appends values and word arrays, the mirror of [`WordReader`].
#[derive(Default)]
pub struct WordWriter {
    /// The words written so far.
    pub out: Vec<u64>,
}

impl WordWriter {
    /// An empty writer.
    pub fn new() -> Self {
        WordWriter::default()
    }
    /// Appends one word.
    pub fn u64(&mut self, v: u64) {
        self.out.push(v);
    }
    /// Appends a word array (its length must be written separately by the caller).
    pub fn words(&mut self, w: &[u64]) {
        self.out.extend_from_slice(w);
    }
    /// The words as little-endian bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.out.iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_bounds() {
        let w = Words::from(vec![1, 2, 3]);
        let mut r = WordReader::new(&w);
        assert_eq!(r.u64("a").unwrap(), 1);
        assert_eq!(&*r.words(2, "b").unwrap(), &[2, 3]);
        assert_eq!(
            r.u64("c").unwrap_err().to_string(),
            "invalid index file: truncated while reading c"
        );
        let mut r = WordReader::new(&w);
        assert!(r.words(4, "x").is_err());
        assert!(r.bounded("y", 1).is_err());
    }

    #[test]
    fn bytes_round_trip() {
        let w = Words::from(vec![u64::MAX, 7]);
        let b = w.as_bytes().to_vec();
        assert_eq!(Words::from_bytes(&b).unwrap(), w);
        assert!(Words::from_bytes(&b[..5]).is_err());
    }
}
