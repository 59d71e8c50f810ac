//! The column index file format (version 1): little-endian `u64` words, every section 8-byte
//! aligned, so [`ColumnIndex::open`] reads the file into one buffer and the MPHF and the keys
//! are views into it, not copies.
//!
//! ```text
//! word  0      magic  b"MPHFIDX\0"
//! word  1      format version (1)
//! word  2      file length in bytes (checksum included)
//! word  3      header length in words (words 0..header end)
//! word  4      key type tag (see KeyType::tag)
//! word  5      timestamp unit tag (0 for other types)
//! word  6..8   rows, NULL rows, distinct keys
//! word  9      built at (Unix seconds)
//! then         three strings, each a byte length word + bytes padded to 8:
//!              time zone (length u64::MAX = none), device, provenance
//! MPHF         word count, then Mphf::write
//! keys         key count, width in bytes (0 = byte keys), then
//!              width > 0: the native values, padded to a word;
//!              width = 0: data length in bytes, n + 1 u64 offsets, the data padded to a word
//! checksum     xxh3-64 of every byte before it
//! ```
//!
//! Invariants: the reader checks magic, version, length and checksum on the raw bytes before
//! it interprets anything, and every later read is bounds-checked ([`WordReader`]), so a
//! truncated, corrupt or foreign file is a [`MphfError::Format`], never a panic. The writer is
//! deterministic: the bytes depend only on the index's content (the build time and device are
//! stored fields), so open + rewrite reproduces a file exactly.

use std::io::Write;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::builder::{make_view, StringViewBuilder};
use arrow::array::{ArrayRef, GenericByteArray, StringViewArray};
use arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow::datatypes::{
    ByteArrayType, Date32Type, Date64Type, GenericBinaryType, GenericStringType, Int16Type, Int32Type, Int64Type,
    Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};

use super::keys::{key_bytes, primitive_array, unit_tag, KeyBytes};
use super::{ColumnIndex, ColumnStats, KeyType};
use crate::atomic_file::AtomicFile;
use crate::core::words::{WordReader, WordWriter, Words};
use crate::core::Mphf;
use crate::error::{try_with_capacity, MphfError, Result};

/// The first 8 bytes of every column index file.
pub const MAGIC: [u8; 8] = *b"MPHFIDX\0";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u64 = 1;
/// Words before the strings of the header.
const FIXED_HEADER_WORDS: u64 = 10;
/// Smallest possible file: fixed header, three empty strings, MPHF length, key count and width,
/// checksum.
const MIN_FILE_BYTES: u64 = 8 * (FIXED_HEADER_WORDS + 3 + 1 + 2 + 1);
/// Length word of an absent time zone.
const NO_TZ: u64 = u64::MAX;

fn format_err(msg: impl Into<String>) -> MphfError {
    MphfError::Format(msg.into())
}

/// Words needed for `len` bytes.
fn words_for(len: u64) -> u64 {
    len.div_ceil(8)
}

/// Appends bytes, zero-padded to a whole word.
fn push_bytes(w: &mut WordWriter, bytes: &[u8]) {
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        w.u64(u64::from_le_bytes(c.try_into().expect("chunk of 8")));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 8];
        last[..rest.len()].copy_from_slice(rest);
        w.u64(u64::from_le_bytes(last));
    }
}

fn push_str(w: &mut WordWriter, s: &str) {
    w.u64(s.len() as u64);
    push_bytes(w, s.as_bytes());
}

/// Header words of strings of these lengths.
fn header_words(tz: Option<&str>, device: &str, provenance: &str) -> u64 {
    FIXED_HEADER_WORDS
        + 3
        + words_for(tz.map_or(0, |t| t.len() as u64))
        + words_for(device.len() as u64)
        + words_for(provenance.len() as u64)
}

/// Words of the keys section for `n` keys of byte width `width` (0: byte keys with `data` bytes).
pub(crate) fn key_section_words(n: u64, width: usize, data: u64) -> u64 {
    if width > 0 {
        2 + words_for(n * width as u64)
    } else {
        3 + (n + 1) + words_for(data)
    }
}

/// The serialized length of `idx` in bytes.
pub(crate) fn serialized_len(idx: &ColumnIndex) -> u64 {
    let tz = match &idx.key_type {
        KeyType::Timestamp(_, tz) => tz.as_deref(),
        _ => None,
    };
    8 * (header_words(tz, &idx.device, &idx.provenance) + 1 + idx.mphf_words + idx.key_words + 1)
}

/// Serializes `idx` (see the module docs for the layout).
pub(crate) fn write_bytes(idx: &ColumnIndex) -> Vec<u8> {
    let mut w = WordWriter::new();
    w.out.reserve_exact(serialized_len(idx) as usize / 8);
    let words = body_words(idx, w);
    let mut bytes = WordWriter { out: words }.into_bytes();
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes);
    bytes.extend_from_slice(&sum.to_le_bytes());
    debug_assert_eq!(bytes.len() as u64, serialized_len(idx));
    bytes
}

/// Every word of the file but the checksum, appended to `w` (whose capacity the callers size).
fn body_words(idx: &ColumnIndex, mut w: WordWriter) -> Vec<u64> {
    let tz = match &idx.key_type {
        KeyType::Timestamp(_, tz) => tz.as_deref(),
        _ => None,
    };
    let unit = match &idx.key_type {
        KeyType::Timestamp(u, _) => unit_tag(*u),
        _ => 0,
    };
    w.u64(u64::from_le_bytes(MAGIC));
    w.u64(FORMAT_VERSION);
    w.u64(0); // file length, patched below
    w.u64(header_words(tz, &idx.device, &idx.provenance));
    w.u64(idx.key_type.tag());
    w.u64(unit);
    w.u64(idx.stats.rows);
    w.u64(idx.stats.nulls);
    w.u64(idx.stats.distinct);
    w.u64(idx.built_at);
    match tz {
        Some(t) => push_str(&mut w, t),
        None => w.u64(NO_TZ),
    }
    push_str(&mut w, &idx.device);
    push_str(&mut w, &idx.provenance);
    debug_assert_eq!(w.out.len() as u64, header_words(tz, &idx.device, &idx.provenance));

    let len_at = w.out.len();
    w.u64(0);
    idx.mphf.write(&mut w);
    w.out[len_at] = (w.out.len() - len_at - 1) as u64;

    let n = idx.keys.len() as u64;
    w.u64(n);
    match key_bytes(&idx.key_type, &idx.keys) {
        KeyBytes::Fixed(bytes) => {
            w.u64(idx.key_type.width().expect("fixed keys have a width") as u64);
            push_bytes(&mut w, bytes);
        }
        KeyBytes::Var(offsets, data) => {
            w.u64(0);
            w.u64(data.len() as u64);
            w.words(&offsets);
            push_bytes(&mut w, &data);
        }
    }
    let total = (w.out.len() + 1) * 8;
    w.out[2] = total as u64;
    w.out
}

/// Writes `idx` to `path` atomically and safely (see [`AtomicFile`]). The words are built in
/// one buffer allocated up front (an error, not an abort, when it does not fit) and written
/// from it, with the checksum computed over the same bytes: no second copy of the file.
pub(crate) fn write_to_path(idx: &ColumnIndex, path: &Path) -> Result<()> {
    let len = serialized_len(idx);
    let out = try_with_capacity(len as usize / 8, || {
        format!("cannot allocate {len} bytes to write {}", path.display())
    })?;
    let words = Words::from(body_words(idx, WordWriter { out }));
    let bytes = words.as_bytes();
    let sum = xxhash_rust::xxh3::xxh3_64(bytes);
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)?;
    file.write_all(&sum.to_le_bytes())?;
    file.commit()
}

/// Reads `len` bytes of `f` into a fresh word buffer (the last word zero-padded), failing
/// cleanly when the buffer cannot be allocated or the file's length changed during the read.
///
/// # Errors
/// [`MphfError::OutOfMemory`], [`MphfError::Io`], or [`MphfError::Format`] for a file that
/// is shorter or longer than `len`.
pub(crate) fn read_words(f: &mut impl std::io::Read, len: u64) -> Result<Words> {
    let words = usize::try_from(words_for(len)).map_err(|_| format_err(format!("impossible file length {len}")))?;
    let mut buf: Vec<u64> = try_with_capacity(words, || format!("cannot allocate {len} bytes to read an index file"))?;
    buf.resize(words, 0);
    // SAFETY: the vector holds `words` initialized u64s, a valid run of 8·words bytes; the
    // byte view lives only while `buf` is borrowed here.
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut u8, words * 8) };
    let bytes = &mut bytes[..len as usize];
    f.read_exact(bytes).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => format_err("the file was truncated while it was read"),
        _ => MphfError::Io(e),
    })?;
    let mut probe = [0u8; 1];
    if f.read(&mut probe)? != 0 {
        return Err(format_err("the file grew while it was read"));
    }
    Ok(Words::from(buf))
}

/// Checks magic, version, length and checksum on the raw bytes.
///
/// # Errors
/// [`MphfError::Format`] with the first problem found.
pub(crate) fn check_raw(bytes: &[u8]) -> Result<()> {
    let len = bytes.len() as u64;
    let word = |i: usize| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    if len < 8 {
        return Err(format_err(format!("truncated: the file has {len} bytes")));
    }
    if bytes[..8] != MAGIC {
        return Err(format_err("bad magic number: not an mphf column index"));
    }
    if len < 24 {
        return Err(format_err(format!("truncated: the file has {len} bytes")));
    }
    let version = word(1);
    if version != FORMAT_VERSION {
        return Err(format_err(format!(
            "unsupported format version {version} (this build reads version {FORMAT_VERSION})"
        )));
    }
    let stated = word(2);
    if len < stated {
        return Err(format_err(format!(
            "truncated: the file has {len} bytes, its header says {stated}"
        )));
    }
    if len > stated {
        return Err(format_err(format!(
            "trailing data: the file has {len} bytes, its header says {stated}"
        )));
    }
    if !len.is_multiple_of(8) || len < MIN_FILE_BYTES {
        return Err(format_err(format!("corrupt header: impossible file length {len}")));
    }
    let body = (len - 8) as usize;
    let stored = word(body / 8);
    let computed = xxhash_rust::xxh3::xxh3_64(&bytes[..body]);
    if stored != computed {
        return Err(format_err(format!(
            "checksum mismatch (stored {stored:#018x}, computed {computed:#018x}): the file is corrupt"
        )));
    }
    Ok(())
}

/// Reads a string written by `push_str` (`None` for the absent marker when `optional`).
fn read_str(r: &mut WordReader, what: &str, optional: bool) -> Result<Option<String>> {
    let len = r.u64(what)?;
    if optional && len == NO_TZ {
        return Ok(None);
    }
    let words = r.words(words_for(len.min(u64::MAX - 8)), what)?;
    let bytes = &words.as_bytes()[..len as usize];
    String::from_utf8(bytes.to_vec())
        .map(Some)
        .map_err(|_| format_err(format!("{what} is not valid UTF-8")))
}

/// The provenance string of a file whose raw bytes passed [`check_raw`].
pub(crate) fn provenance_of(words: &Words) -> Result<String> {
    let mut r = WordReader::new(words);
    for _ in 0..FIXED_HEADER_WORDS {
        r.u64("header")?;
    }
    read_str(&mut r, "time zone", true)?;
    read_str(&mut r, "device", false)?;
    Ok(read_str(&mut r, "provenance", false)?.unwrap_or_default())
}

/// An Arrow buffer over the first `len` bytes of `words`, sharing (not copying) its backing:
/// the memory map stays alive as long as any array over it.
fn shared_buffer(words: &Words, len: usize) -> Buffer {
    debug_assert!(len <= words.len() * 8);
    let ptr = NonNull::new(words.as_ptr() as *mut u8).expect("slice pointers are never null");
    // SAFETY: `ptr..ptr+len` lies inside `words` (len ≤ 8·words.len(), checked by the callers),
    // whose backing is immutable and owned by the `Words` clone moved into the owner Arc, so the
    // memory outlives the buffer; Arrow never writes through an immutable `Buffer`.
    unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(words.clone())) }
}

/// Parses a file whose raw bytes passed [`check_raw`]; arrays borrow from `words`.
///
/// Every field is checked against the others: the header's counts, each section's length,
/// the MPHF's buckets and codes (`Mphf::read`), the key offsets, and last that every stored
/// key maps to its own slot. A file that passes can be queried without a panic and answers
/// every member key; a checksum-valid file that fails any check is a [`MphfError::Format`].
pub(crate) fn parse(words: Words) -> Result<ColumnIndex> {
    let total = words.len() as u64;
    let mut r = WordReader::new(&words);
    r.u64("magic")?;
    r.u64("format version")?;
    r.u64("file length")?;
    let header_words = r.bounded("header length", total)?;
    let tag = r.u64("key type")?;
    let unit = r.u64("timestamp unit")?;
    let rows = r.u64("row count")?;
    let nulls = r.u64("null count")?;
    let distinct = r.u64("distinct count")?;
    let built_at = r.u64("build time")?;
    let tz = read_str(&mut r, "time zone", true)?;
    let device = read_str(&mut r, "device", false)?.unwrap_or_default();
    let provenance = read_str(&mut r, "provenance", false)?.unwrap_or_default();
    if r.position() as u64 != header_words {
        return Err(format_err(format!(
            "header length {header_words} does not match its fields ({})",
            r.position()
        )));
    }
    let key_type = KeyType::from_tag(tag, unit, tz.map(Arc::from))
        .ok_or_else(|| format_err(format!("unknown key type tag {tag} (timestamp unit {unit})")))?;
    if nulls > rows || distinct > rows - nulls {
        return Err(format_err(format!(
            "inconsistent counts: {rows} rows, {nulls} NULLs, {distinct} distinct"
        )));
    }

    let mphf_words = r.u64("MPHF length")?;
    let start = r.position();
    let mphf = Mphf::read(&mut r)?;
    if (r.position() - start) as u64 != mphf_words {
        return Err(format_err(format!(
            "MPHF section is {} words, its length says {mphf_words}",
            r.position() - start
        )));
    }
    if mphf.len() != distinct {
        return Err(format_err(format!(
            "the MPHF has {} keys, the header says {distinct}",
            mphf.len()
        )));
    }
    if mphf.hash_kind() != key_type.hash_kind() {
        return Err(format_err(format!(
            "the MPHF hashes keys as {:?}, not as {} keys",
            mphf.hash_kind(),
            key_type.name()
        )));
    }

    let n = r.u64("key count")?;
    if n != distinct {
        return Err(format_err(format!(
            "the keys section has {n} keys, the header says {distinct}"
        )));
    }
    let width = r.u64("key width")?;
    let expected_width = key_type.width().unwrap_or(0) as u64;
    if width != expected_width {
        return Err(format_err(format!(
            "key width {width} does not match {} keys",
            key_type.name()
        )));
    }
    let dt = key_type.to_arrow();
    let (keys, key_words) = if width > 0 {
        let byte_len = n
            .checked_mul(width)
            .ok_or_else(|| format_err("key section size overflows"))?;
        let data = r.words(words_for(byte_len), "keys")?;
        (
            fixed_keys(&key_type, shared_buffer(&data, byte_len as usize), n as usize, &dt)?,
            2 + data.len() as u64,
        )
    } else {
        let data_len = r.u64("key data length")?;
        let offsets = r.words(
            n.checked_add(1).ok_or_else(|| format_err("key count overflows"))?,
            "key offsets",
        )?;
        let data = r.words(words_for(data_len), "key data")?;
        check_offsets(&offsets, data_len)?;
        let keys = var_keys(&key_type, &offsets, shared_buffer(&data, data_len as usize))?;
        (keys, 3 + offsets.len() as u64 + data.len() as u64)
    };
    r.u64("checksum")?;
    if r.remaining() != 0 {
        return Err(format_err(format!("{} unread words after the checksum", r.remaining())));
    }
    let index = ColumnIndex {
        mphf,
        key_type,
        keys,
        stats: ColumnStats { rows, nulls, distinct },
        provenance,
        device,
        built_at,
        mphf_words,
        key_words,
        dense: None,
        flat: None,
        row_slots: None,
        key_range: std::sync::OnceLock::new(),
    };
    index.check_slots()?;
    Ok(index)
}

/// Offsets must start at 0, never decrease and end at the data length.
fn check_offsets(offsets: &[u64], data_len: u64) -> Result<()> {
    if offsets.first() != Some(&0) || offsets.last() != Some(&data_len) {
        return Err(format_err("key offsets do not span the key data"));
    }
    if offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(format_err("key offsets decrease"));
    }
    Ok(())
}

fn fixed_keys(kt: &KeyType, buf: Buffer, n: usize, dt: &arrow::datatypes::DataType) -> Result<ArrayRef> {
    match kt {
        KeyType::Int8 => primitive_array::<Int8Type>(buf, n, dt),
        KeyType::Int16 => primitive_array::<Int16Type>(buf, n, dt),
        KeyType::Int32 => primitive_array::<Int32Type>(buf, n, dt),
        KeyType::Int64 => primitive_array::<Int64Type>(buf, n, dt),
        KeyType::UInt8 => primitive_array::<UInt8Type>(buf, n, dt),
        KeyType::UInt16 => primitive_array::<UInt16Type>(buf, n, dt),
        KeyType::UInt32 => primitive_array::<UInt32Type>(buf, n, dt),
        KeyType::UInt64 => primitive_array::<UInt64Type>(buf, n, dt),
        KeyType::Date32 => primitive_array::<Date32Type>(buf, n, dt),
        KeyType::Date64 => primitive_array::<Date64Type>(buf, n, dt),
        KeyType::Timestamp(TimeUnit::Second, _) => primitive_array::<TimestampSecondType>(buf, n, dt),
        KeyType::Timestamp(TimeUnit::Millisecond, _) => primitive_array::<TimestampMillisecondType>(buf, n, dt),
        KeyType::Timestamp(TimeUnit::Microsecond, _) => primitive_array::<TimestampMicrosecondType>(buf, n, dt),
        KeyType::Timestamp(TimeUnit::Nanosecond, _) => primitive_array::<TimestampNanosecondType>(buf, n, dt),
        other => unreachable!("{} keys have no fixed width", other.name()),
    }
}

/// A byte array with i32/i64 offsets over `data`: i64 offsets are the file's words read in
/// place; i32 offsets are narrowed (copied), the data is shared either way.
fn offset_array<T: ByteArrayType>(offsets: &Words, data: Buffer) -> Result<ArrayRef>
where
    T::Offset: TryFrom<u64>,
{
    let narrowed: Result<Vec<T::Offset>> = offsets
        .iter()
        .map(|&o| T::Offset::try_from(o).map_err(|_| format_err("key data too large for 32-bit offsets")))
        .collect();
    let offsets = OffsetBuffer::new(ScalarBuffer::from(narrowed?));
    Ok(Arc::new(
        GenericByteArray::<T>::try_new(offsets, data, None).map_err(|e| format_err(format!("invalid keys: {e}")))?,
    ))
}

fn large_offset_array<T: ByteArrayType<Offset = i64>>(offsets: &Words, data: Buffer) -> Result<ArrayRef> {
    if offsets.last().is_some_and(|&o| o > i64::MAX as u64) {
        return Err(format_err("key data too large"));
    }
    let buf = shared_buffer(offsets, offsets.len() * 8);
    // Offsets were checked to start at 0, never decrease and stay ≤ i64::MAX.
    let offsets = OffsetBuffer::new(ScalarBuffer::<i64>::new(buf, 0, offsets.len()));
    Ok(Arc::new(
        GenericByteArray::<T>::try_new(offsets, data, None).map_err(|e| format_err(format!("invalid keys: {e}")))?,
    ))
}

/// A string view array over `data` (one block, shared) when it fits the 32-bit view offsets,
/// else a copy.
fn view_array(offsets: &Words, data: Buffer) -> Result<StringViewArray> {
    let n = offsets.len() - 1;
    if data.len() <= u32::MAX as usize {
        let views: Vec<u128> = (0..n)
            .map(|i| {
                let (s, e) = (offsets[i] as usize, offsets[i + 1] as usize);
                make_view(&data[s..e], 0, s as u32)
            })
            .collect();
        StringViewArray::try_new(ScalarBuffer::from(views), vec![data], None)
            .map_err(|e| format_err(format!("invalid keys: {e}")))
    } else {
        let mut b = StringViewBuilder::with_capacity(n);
        for i in 0..n {
            let bytes = &data[offsets[i] as usize..offsets[i + 1] as usize];
            let s = std::str::from_utf8(bytes)
                .map_err(|_| format_err("invalid keys: a Utf8View key is not valid UTF-8"))?;
            b.append_value(s);
        }
        Ok(b.finish())
    }
}

fn var_keys(kt: &KeyType, offsets: &Words, data: Buffer) -> Result<ArrayRef> {
    Ok(match kt {
        KeyType::Utf8 => offset_array::<GenericStringType<i32>>(offsets, data)?,
        KeyType::Binary => offset_array::<GenericBinaryType<i32>>(offsets, data)?,
        KeyType::LargeUtf8 => large_offset_array::<GenericStringType<i64>>(offsets, data)?,
        KeyType::LargeBinary => large_offset_array::<GenericBinaryType<i64>>(offsets, data)?,
        KeyType::Utf8View => Arc::new(view_array(offsets, data)?),
        other => unreachable!("{} keys have a fixed width", other.name()),
    })
}
