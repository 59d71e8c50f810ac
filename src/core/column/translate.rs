//! [`SlotTranslation`]: the slots of one column index turned into the slots of another, for
//! keys compared across two indexed columns (a join of `orders.o_cname` with `customer.c_name`).
//!
//! Why: when the probe column of a join has its own index whose row slots
//! ([`row_slots`](super::row_slots)) give each probe row a slot `s` for free, the probe key is
//! `from.keys()[s]`, and its slot in the build side's index is a function of `s` alone. Looking
//! that up once per distinct probe key, instead of once per probe row (hash, MPHF query and a
//! verification, 40–50 ns for a string), leaves a table read per row.
//!
//! # Invariants
//! - `table[s]` is the result of `to.lookup_slots` on `from.keys()[s]` (`NONE` for absent),
//!   computed for every slot of `from` at once, in parallel: the translation is only worth it
//!   when the probe side is the probe table's own arrays, so every key is probed anyway.
//! - A translated slot is exactly what `to.lookup_slots` gives for the probe row itself: the
//!   row's key equals `from.keys()[s]` (the row slots are verified lookups in `from`), and the
//!   lookup casts the key to `to`'s type as it would cast the probe.

use arrow::array::Array;
use rayon::prelude::*;

use super::{ColumnIndex, ABSENT};
use crate::core::bits::bit_is_set;
use crate::error::{MphfError, Result};

/// Translated: the key is not in the target index.
const NONE: u32 = u32::MAX;
/// Keys of `from` looked up per parallel task.
const CHUNK: usize = 1 << 14;

/// The slots of one index mapped to the slots of another (see module docs).
#[derive(Debug)]
pub struct SlotTranslation {
    table: Vec<u32>,
}

impl SlotTranslation {
    /// The translation of every slot of `from` into the slots of `to`; `None` when a slot of
    /// `to` does not fit the table's `u32` entries.
    ///
    /// # Errors
    /// The lookup's errors (a key type `to` cannot take).
    pub fn build(from: &ColumnIndex, to: &ColumnIndex) -> Result<Option<SlotTranslation>> {
        if to.len() >= NONE as u64 {
            return Ok(None);
        }
        let keys = from.keys();
        let parts: Vec<Vec<u32>> = (0..keys.len().div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let part = keys.slice(c * CHUNK, CHUNK.min(keys.len() - c * CHUNK));
                let mut slots = Vec::new();
                to.lookup_slots(part.as_ref(), &mut slots)?;
                Ok(slots
                    .iter()
                    .map(|&t| if t == ABSENT { NONE } else { t as u32 })
                    .collect())
            })
            .collect::<Result<_>>()?;
        Ok(Some(SlotTranslation { table: parts.concat() }))
    }

    /// Heap bytes.
    pub fn size_bytes(&self) -> usize {
        self.table.capacity() * 4
    }

    /// Slots of `from` in the translation.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether `from` has no slots.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The translation followed by `then`, a map of `to`'s slots: entry `s` is
    /// `then(slot of s in to)`, or [`u32::MAX`] when the key of `s` is not in `to`. Computed for
    /// every slot of `from` at once, in parallel.
    pub fn then_map(&self, then: impl Fn(u32) -> u32 + Sync) -> Vec<u32> {
        self.table
            .par_iter()
            .with_min_len(CHUNK)
            .map(|&t| if t == NONE { u32::MAX } else { then(t) })
            .collect()
    }

    /// The preimage of a set of `to`'s slots: `bits` holds bit `t % 64` of word `t / 64` for
    /// each slot `t` of `to` in the set, and the result holds the bits of the slots of `from`
    /// whose key translates into the set. Computed for every slot of `from` at once, in
    /// parallel; a slot past the end of `bits` is not in the set.
    pub fn preimage_bits(&self, bits: &[u64]) -> Vec<u64> {
        let in_set = |t: u32| t != NONE && bit_is_set(bits, u64::from(t));
        self.table
            .par_chunks(64)
            .with_min_len(CHUNK / 64)
            .map(|word| {
                word.iter()
                    .enumerate()
                    .fold(0u64, |acc, (i, &t)| acc | (u64::from(in_set(t)) << i))
            })
            .collect()
    }

    /// Rewrites `slots` of `from` (or [`ABSENT`]) into slots of `to` (or [`ABSENT`]).
    ///
    /// # Errors
    /// A slot outside `from`.
    pub fn translate(&self, slots: &mut [u64]) -> Result<()> {
        for s in slots.iter_mut().filter(|s| **s != ABSENT) {
            let t = *self.table.get(*s as usize).ok_or_else(|| {
                MphfError::InvalidParameter(format!(
                    "slot {s} outside the translated index of {} slots",
                    self.table.len()
                ))
            })?;
            *s = if t == NONE { ABSENT } else { t as u64 };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, StringArray, StringViewArray};

    use super::*;
    use crate::core::column::IndexOptions;

    #[test]
    fn the_preimage_of_a_slot_set_holds_the_keys_that_translate_into_it() {
        let from_keys: Vec<i64> = (0..1000).collect();
        let to_keys: Vec<i64> = (500..1700).collect();
        let from: ArrayRef = Arc::new(arrow::array::Int64Array::from(from_keys.clone()));
        let to: ArrayRef = Arc::new(arrow::array::Int64Array::from(to_keys));
        let (from, to) = (
            ColumnIndex::build(&[from], &IndexOptions::default()).unwrap(),
            ColumnIndex::build(&[to], &IndexOptions::default()).unwrap(),
        );
        let t = SlotTranslation::build(&from, &to).unwrap().unwrap();
        // The set: the slots in `to` of the even keys from 600 up.
        let slot_of = |index: &ColumnIndex, k: i64| {
            let mut out = Vec::new();
            index
                .lookup_slots(&arrow::array::Int64Array::from(vec![k]), &mut out)
                .unwrap();
            out[0]
        };
        let mut bits = vec![0u64; (to.len() as usize).div_ceil(64)];
        for k in (600..1700).step_by(2) {
            let s = slot_of(&to, k);
            bits[(s / 64) as usize] |= 1 << (s % 64);
        }
        let pre = t.preimage_bits(&bits);
        assert_eq!(pre.len(), (from.len() as usize).div_ceil(64));
        for k in from_keys {
            let s = slot_of(&from, k);
            let set = pre[(s / 64) as usize] >> (s % 64) & 1 == 1;
            assert_eq!(set, k >= 600 && k % 2 == 0, "key {k}");
        }
        assert!(t.preimage_bits(&[]).iter().all(|&w| w == 0), "an empty set");
    }

    #[test]
    fn a_map_after_the_translation_reads_each_translated_slot() {
        let from: ArrayRef = Arc::new(StringArray::from(vec!["a", "b", "c", "d"]));
        let to: ArrayRef = Arc::new(StringArray::from(vec!["d", "b", "x"]));
        let (from, to) = (
            ColumnIndex::build(&[from], &IndexOptions::default()).unwrap(),
            ColumnIndex::build(&[to], &IndexOptions::default()).unwrap(),
        );
        let t = SlotTranslation::build(&from, &to).unwrap().unwrap();
        let mapped = t.then_map(|s| s + 100);
        assert_eq!(mapped.len(), t.len());
        for (s, &m) in mapped.iter().enumerate() {
            let mut slots = vec![s as u64];
            t.translate(&mut slots).unwrap();
            let want = if slots[0] == ABSENT {
                u32::MAX
            } else {
                slots[0] as u32 + 100
            };
            assert_eq!(m, want, "slot {s}");
        }
        assert_eq!(mapped.iter().filter(|&&m| m != u32::MAX).count(), 2);
    }

    #[test]
    fn translated_slots_equal_the_target_lookup_of_each_row() {
        // Probe column: names with repeats and NULLs, some not in the target.
        let probe: ArrayRef = Arc::new(
            (0..5000)
                .map(|i| (i % 11 != 0).then(|| format!("Customer#{:09}", (i * 7) % 1300)))
                .collect::<StringArray>(),
        );
        let from = ColumnIndex::build(&[Arc::clone(&probe)], &IndexOptions::default())
            .unwrap()
            .with_row_slots(&[Arc::clone(&probe)]);
        let target: ArrayRef = Arc::new(StringViewArray::from_iter_values(
            (0..1000).map(|i| format!("Customer#{:09}", i)),
        ));
        let to = ColumnIndex::build(&[target], &IndexOptions::default()).unwrap();
        let xl = SlotTranslation::build(&from, &to).unwrap().unwrap();
        let mut expected = Vec::new();
        to.lookup_slots(probe.as_ref(), &mut expected).unwrap();
        for (start, len) in [(0, 5000), (100, 900), (4000, 1000)] {
            let part = probe.slice(start, len);
            let mut slots = Vec::new();
            assert!(from.lookup_row_slots(part.as_ref(), &mut slots));
            xl.translate(&mut slots).unwrap();
            assert_eq!(slots, expected[start..start + len]);
        }
        assert!(expected.contains(&ABSENT) && probe.null_count() > 0);
        let mut bad = vec![from.len()];
        assert!(xl.translate(&mut bad).is_err());
    }
}
