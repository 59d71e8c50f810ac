//! The occupied slots of a sparse build side, numbered `0..occupied` in slot order.
//!
//! Why: a slot table indexed by slot takes 4 bytes for every slot of the index, however few
//! build rows there are. A `Partitioned` join builds one table per partition, each holding
//! about 1/P of the keys, and a filtered build side may hold a small share of them; allocating
//! and sweeping tables of every slot then costs more than the build rows themselves. This
//! structure keeps one bit per slot and, per 64 slots, the count of occupied slots before them
//! (16 bytes per 64 slots, 1/16 of the dense table), so the rows can be laid out by position
//! among the occupied slots instead of by slot.
//!
//! # Invariants
//! - `blocks[w].rank` is the number of set bits in `blocks[..w]`.
//! - The position of an occupied slot `s` is `blocks[s / 64].rank` plus the set bits below `s`
//!   in its word; positions are `0..occupied`, ascending with the slot.

use std::sync::atomic::{AtomicU64, Ordering};

use super::build_threads::BuildThreads;
use crate::core::column::ABSENT;

/// Slots per block (one word of occupancy bits).
const BLOCK_SLOTS: usize = 64;

/// Rows per rayon task when marking slots on all cores.
const MARK_CHUNK: usize = 1 << 16;

/// Occupancy bits of 64 slots and the occupied slots before them; 16 bytes, so one read of
/// one cache line answers a query.
#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(16))]
struct Block {
    bits: u64,
    rank: u32,
}

/// Which of an index's slots hold build rows, and each one's position among them.
#[derive(Debug)]
pub struct RankedSlots {
    blocks: Vec<Block>,
    occupied: usize,
}

impl RankedSlots {
    /// Marks the slots of `slots` ([`ABSENT`] entries are skipped) among `n_slots`, on the
    /// build's `threads`.
    ///
    /// # Panics
    /// Never for slots below `n_slots`; a slot at or past `n_slots` is a caller bug (the build
    /// checks its slots first) and panics on the bounds check.
    pub fn mark(slots: &[u64], n_slots: usize, threads: BuildThreads) -> Self {
        let words: Vec<AtomicU64> = (0..n_slots.div_ceil(BLOCK_SLOTS)).map(|_| AtomicU64::new(0)).collect();
        threads.map_ranges(slots.len(), MARK_CHUNK, |rows| {
            for &s in slots[rows].iter().filter(|&&s| s != ABSENT) {
                let s = s as usize;
                // Relaxed: the words are read only after every range is marked.
                words[s / BLOCK_SLOTS].fetch_or(1 << (s % BLOCK_SLOTS), Ordering::Relaxed);
            }
        });
        let mut rank = 0u32;
        let blocks = words
            .into_iter()
            .map(|w| {
                let bits = w.into_inner();
                let block = Block { bits, rank };
                rank += bits.count_ones();
                block
            })
            .collect();
        Self {
            blocks,
            occupied: rank as usize,
        }
    }

    /// The position of `slot` among the occupied slots, or `None` when it holds no build row.
    #[inline]
    pub fn position(&self, slot: u64) -> Option<u64> {
        let slot = slot as usize;
        let block = self.blocks.get(slot / BLOCK_SLOTS)?;
        let bit = 1u64 << (slot % BLOCK_SLOTS);
        (block.bits & bit != 0).then(|| u64::from(block.rank + (block.bits & (bit - 1)).count_ones()))
    }

    /// `slots` with every occupied slot replaced by its position ([`ABSENT`] stays), on the
    /// build's `threads`.
    pub fn positions_of(&self, slots: &[u64], threads: BuildThreads) -> Vec<u64> {
        let position = |s: u64| match s {
            ABSENT => ABSENT,
            s => self.position(s).unwrap_or(ABSENT),
        };
        threads.concat_ranges(slots.len(), MARK_CHUNK, |rows| {
            slots[rows].iter().map(|&s| position(s)).collect()
        })
    }

    /// Number of occupied slots (distinct slots among the marked ones).
    pub fn occupied(&self) -> usize {
        self.occupied
    }

    /// Heap bytes.
    pub fn size(&self) -> usize {
        self.blocks.len() * std::mem::size_of::<Block>()
    }

    /// Bytes [`RankedSlots::mark`] allocates for `n_slots` slots (for the memory reservation).
    pub fn size_for(n_slots: usize) -> usize {
        n_slots.div_ceil(BLOCK_SLOTS) * std::mem::size_of::<Block>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_number_the_occupied_slots_in_slot_order() {
        // Across word boundaries, with a repeated slot and absent entries.
        let slots = [200, ABSENT, 3, 64, 63, 3, 129];
        let ranked = RankedSlots::mark(&slots, 201, BuildThreads::Caller);
        assert_eq!(ranked.occupied(), 5);
        let occupied = [3u64, 63, 64, 129, 200];
        for s in 0..201u64 {
            let expected = occupied.iter().position(|&o| o == s).map(|p| p as u64);
            assert_eq!(ranked.position(s), expected, "slot {s}");
        }
        assert_eq!(ranked.position(201), None);
        assert_eq!(
            ranked.positions_of(&slots, BuildThreads::Caller),
            vec![4, ABSENT, 0, 2, 1, 0, 3]
        );
    }

    #[test]
    fn positions_match_a_sorted_dedup_on_many_slots() {
        let n_slots = 1 << 20;
        // A pseudo-random spread, more rows than one marking task takes, with repeats.
        let slots: Vec<u64> = (0..300_000u64)
            .map(|i| (i * 2_654_435_761) % (n_slots as u64 / 3))
            .collect();
        let mut sorted = slots.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let expected: Vec<u64> = slots.iter().map(|s| sorted.binary_search(s).unwrap() as u64).collect();
        for threads in [BuildThreads::AllCores, BuildThreads::Caller] {
            let ranked = RankedSlots::mark(&slots, n_slots, threads);
            assert_eq!(ranked.occupied(), sorted.len());
            for (p, &s) in sorted.iter().enumerate() {
                assert_eq!(ranked.position(s), Some(p as u64));
            }
            assert_eq!(ranked.positions_of(&slots, threads), expected);
            assert_eq!(ranked.size(), RankedSlots::size_for(n_slots));
        }
    }
}
