//! [`RowSlots`]: the slots of every row of the arrays an index was built from, found again by
//! buffer identity when those same arrays (or slices of them) are probed.
//!
//! Why: an in-memory table hands its query plans the very `ArrayRef`s it stores, so a GROUP BY
//! on an indexed column of such a table probes the build arrays themselves, query after query.
//! Without a dense-key table every row then costs a hash, an MPHF query and a verification
//! (about 40–50 ns per string key on the 2-core machine); a row's slot is already known when
//! the index is built. Keeping one `u32` per row (4 bytes per table row) turns the lookup of a
//! probe that *is* a build array, or a slice of one, into a copy. Probes of other arrays (a
//! Parquet scan, a filter's output, a cast) are not found and take the verified lookup.
//!
//! # Invariants
//! - `chunks[c].slots[r]` is the slot of row `r` of `chunks[c].array` as
//!   [`ColumnIndex::lookup_slots`](super::ColumnIndex::lookup_slots) gives it (`NONE` for NULL
//!   or absent keys), computed by that very lookup when the row slots are added.
//! - Each chunk keeps a clone of its array, so its buffers stay allocated and immutable (Arrow
//!   hands out mutable access to a buffer only to its sole owner). An array whose buffers point
//!   into them therefore holds the same bytes: a probe matches chunk `c` at row `r0` when its
//!   data type is the chunk's, both have ArrayData offset 0, its first buffer (offsets, views or
//!   values) starts at element `r0` of the chunk's first buffer with all `len + r0` rows inside
//!   the chunk, and every other buffer (string data) is the chunk's, pointer and length. Its
//!   own NULLs are applied on top (a probe may share the values but add NULLs).
//! - Chunks are sorted by the address of their first buffer, so a probe is matched with one
//!   binary search.

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::DataType;

use super::ABSENT;

/// Row slot of a NULL or absent key.
const NONE: u32 = u32::MAX;

/// One build array and the slots of its rows.
#[derive(Debug)]
struct Chunk {
    /// Keeps the buffers alive (see the module invariants).
    array: ArrayRef,
    /// Address and byte length of the first buffer.
    start: usize,
    end: usize,
    /// Slot of each row, or `NONE`.
    slots: Vec<u32>,
}

/// Row slots of the build arrays of an index (see the module docs).
#[derive(Debug, Default)]
pub struct RowSlots {
    /// Sorted by `start`.
    chunks: Vec<Chunk>,
}

/// Byte width of one element of the first buffer of an array of type `dt`: offsets, views or
/// values; `None` for types whose layout is not a single element-per-row buffer.
fn first_buffer_width(dt: &DataType) -> Option<usize> {
    match dt {
        DataType::Utf8 | DataType::Binary => Some(4),
        DataType::LargeUtf8 | DataType::LargeBinary => Some(8),
        DataType::Utf8View | DataType::BinaryView => Some(16),
        dt if dt.is_primitive() => dt.primitive_width(),
        _ => None,
    }
}

impl RowSlots {
    /// Row slots of `arrays`, each paired with the slots its rows look up to. Arrays of a type
    /// without a row-per-element first buffer, with an ArrayData offset, or whose slots do not
    /// fit in `u32`, are left out (their probes take the ordinary lookup).
    pub(crate) fn new(arrays: impl IntoIterator<Item = (ArrayRef, Vec<u64>)>) -> RowSlots {
        let mut chunks: Vec<Chunk> = arrays
            .into_iter()
            .filter_map(|(array, slots)| {
                let data = array.to_data();
                first_buffer_width(array.data_type())?;
                if array.is_empty() || data.offset() != 0 || slots.len() != array.len() {
                    return None;
                }
                let first = data.buffers().first()?;
                let slots = slots
                    .iter()
                    .map(|&s| match s {
                        ABSENT => Some(NONE),
                        s => u32::try_from(s).ok().filter(|&s| s != NONE),
                    })
                    .collect::<Option<Vec<u32>>>()?;
                Some(Chunk {
                    start: first.as_ptr() as usize,
                    end: first.as_ptr() as usize + first.len(),
                    array,
                    slots,
                })
            })
            .collect();
        chunks.sort_by_key(|c| c.start);
        RowSlots { chunks }
    }

    /// True when no array was kept.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Heap bytes of the slots (the arrays are shared with their table).
    pub fn size_bytes(&self) -> usize {
        self.chunks.iter().map(|c| c.slots.capacity() * 4).sum::<usize>()
            + self.chunks.capacity() * std::mem::size_of::<Chunk>()
    }

    /// The chunk and first row that `probe` is a slice of, if any (see the module invariants).
    fn locate(&self, probe: &dyn Array) -> Option<(&Chunk, usize)> {
        let width = first_buffer_width(probe.data_type())?;
        let data = probe.to_data();
        let first = data.buffers().first()?;
        if data.offset() != 0 {
            return None;
        }
        let addr = first.as_ptr() as usize;
        let c = self.chunks.partition_point(|c| c.start <= addr).checked_sub(1)?;
        let chunk = &self.chunks[c];
        if addr + first.len() > chunk.end || !(addr - chunk.start).is_multiple_of(width) {
            return None;
        }
        let row = (addr - chunk.start) / width;
        if chunk.array.data_type() != probe.data_type() || row + probe.len() > chunk.array.len() {
            return None;
        }
        let own = chunk.array.to_data();
        let same_rest = data.buffers().len() == own.buffers().len()
            && data.buffers()[1..]
                .iter()
                .zip(&own.buffers()[1..])
                .all(|(a, b)| a.as_ptr() == b.as_ptr() && a.len() == b.len());
        same_rest.then_some((chunk, row))
    }

    /// Fills `out` (`probe.len()` entries) with the slots of `probe`'s rows when it is one of
    /// the kept arrays or a slice of one; false (and `out` untouched) otherwise.
    pub(crate) fn lookup(&self, probe: &dyn Array, out: &mut [u64]) -> bool {
        let Some((chunk, row)) = self.locate(probe) else {
            return false;
        };
        let slots = &chunk.slots[row..row + probe.len()];
        for (o, &s) in out.iter_mut().zip(slots) {
            *o = if s == NONE { ABSENT } else { s as u64 };
        }
        if let Some(nulls) = probe.logical_nulls() {
            for i in nulls.iter().enumerate().filter_map(|(i, valid)| (!valid).then_some(i)) {
                out[i] = ABSENT;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray, StringViewArray};
    use arrow::compute::{cast, nullif};

    use super::*;
    use crate::core::column::{ColumnIndex, IndexOptions};

    fn index_with_row_slots(chunks: &[ArrayRef]) -> ColumnIndex {
        ColumnIndex::build(chunks, &IndexOptions::default())
            .unwrap()
            .with_row_slots(chunks)
    }

    /// Slots of the verified lookup: an index built the same way (deterministic) without row slots.
    fn verified(chunks: &[ArrayRef], probe: &dyn Array) -> Vec<u64> {
        let plain = ColumnIndex::build(chunks, &IndexOptions::default()).unwrap();
        assert!(plain.row_slots.is_none());
        let mut out = Vec::new();
        plain.lookup_slots(probe, &mut out).unwrap();
        out
    }

    fn strings(range: std::ops::Range<usize>) -> StringArray {
        range.map(|i| Some(format!("Customer#{:09}", i % 700))).collect()
    }

    #[test]
    fn build_arrays_and_their_slices_are_found_with_the_verified_slots() {
        let a: ArrayRef = Arc::new(strings(0..1000));
        let b: ArrayRef = Arc::new(StringArray::from(vec![Some("x"), None, Some("Customer#000000003")]));
        let idx = index_with_row_slots(&[Arc::clone(&a), Arc::clone(&b)]);
        let rows = idx.row_slots.as_ref().expect("row slots kept");
        for probe in [
            a.clone(),
            a.slice(0, 10),
            a.slice(317, 400),
            a.slice(999, 1),
            b.clone(),
            b.slice(1, 2),
        ] {
            let mut out = vec![7; probe.len()];
            assert!(rows.lookup(probe.as_ref(), &mut out), "a build array or slice of one");
            assert_eq!(out, verified(&[a.clone(), b.clone()], probe.as_ref()));
        }
        let mut all = Vec::new();
        idx.lookup_slots(b.as_ref(), &mut all).unwrap();
        assert_eq!(all[1], ABSENT, "a NULL row keeps no slot");
    }

    #[test]
    fn copies_casts_and_rebuilt_arrays_are_not_found() {
        let a: ArrayRef = Arc::new(strings(0..1000));
        let idx = index_with_row_slots(&[Arc::clone(&a)]);
        let rows = idx.row_slots.as_ref().unwrap();
        let copy: ArrayRef = Arc::new(strings(0..1000));
        let view: ArrayRef = cast(&a, &DataType::Utf8View).unwrap();
        let sliced_copy: ArrayRef = Arc::new(strings(0..1000).slice(5, 5));
        for probe in [copy, view, sliced_copy] {
            let mut out = vec![7; probe.len()];
            assert!(!rows.lookup(probe.as_ref(), &mut out));
            assert!(out.iter().all(|&s| s == 7), "out untouched on a miss");
        }
    }

    #[test]
    fn nulls_added_over_shared_buffers_are_absent() {
        let a: ArrayRef = Arc::new(strings(0..64));
        let idx = index_with_row_slots(&[Arc::clone(&a)]);
        let mask = arrow::array::BooleanArray::from((0..64).map(|i| i % 3 == 0).collect::<Vec<_>>());
        let masked = nullif(&a, &mask).unwrap();
        let mut out = vec![0; 64];
        assert!(
            idx.row_slots.as_ref().unwrap().lookup(masked.as_ref(), &mut out),
            "nullif shares the buffers"
        );
        assert_eq!(out, verified(&[a], masked.as_ref()));
        assert_eq!(out.iter().filter(|&&s| s == ABSENT).count(), 22);
    }

    #[test]
    fn views_and_integers_are_found_by_their_first_buffer() {
        let v: ArrayRef = Arc::new(StringViewArray::from_iter_values(
            (0..500).map(|i| format!("key number {i:05}")),
        ));
        let i: ArrayRef = Arc::new(Int64Array::from_iter_values((0..500).map(|i| i * 1_000_003)));
        for a in [v, i] {
            let idx = index_with_row_slots(&[Arc::clone(&a)]);
            let rows = idx.row_slots.as_ref().unwrap();
            for probe in [a.clone(), a.slice(123, 200)] {
                let mut out = vec![0; probe.len()];
                assert!(rows.lookup(probe.as_ref(), &mut out));
                assert_eq!(out, verified(std::slice::from_ref(&a), probe.as_ref()));
                assert!(out.iter().all(|&s| s != ABSENT));
            }
        }
    }
}
