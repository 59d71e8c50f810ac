//! The build side of [`MphfJoinExec`](super::MphfJoinExec): every build row in one batch, and
//! a slot → build rows table instead of a hash table.
//!
//! # Layouts
//! - [`SlotRows::Unique`]: one `u32` row number per slot ([`NO_ROW`] when the slot has no
//!   build row). Used while no slot receives a second row, the case of a key that is unique on
//!   the build side (a primary key such as `o_orderkey`, which the index knows from its build
//!   counts).
//! - [`SlotRows::Multi`]: compressed sparse rows (CSR) — `offsets[s]..offsets[s + 1]` indexes
//!   `rows`, the build rows of slot `s` in build order. The build switches to it on the first
//!   slot that receives a second row, so a key that turns out not to be unique on the build
//!   side (a filtered join result, a stale index) still joins correctly.
//!
//! Either layout is indexed by slot when the build rows fill many of the index's slots, and by
//! position among the occupied slots ([`RankedSlots`]) when at most one slot in
//! [`RANKED_FILL_RATIO`] holds a build row: a partition of a `Partitioned` join, a filtered
//! build side. The ranked form sweeps 16 bytes per 64 slots instead of 4 bytes per slot, and
//! its exact count of occupied slots tells up front whether the unique layout fits.
//!
//! Build rows whose key is non-NULL but not in the index (possible only when the index is
//! stale) go to [`BuildSide::strays`], looked up by value; NULL keys never match
//! (`NullEquality::NullEqualsNothing`, the only mode the rule accepts).
//!
//! A build runs on all cores when it is one of few at once (the collect form: one build feeds
//! every probe partition and the probes wait for it): a coalesced build side is read from its
//! own partitions by one task each, which also finds its rows' slots; the columns are
//! concatenated (one batch) column by column in parallel, and the table is laid out with rayon.
//! The builds of a `Partitioned` join, as many at once as there are cores, each run on the
//! thread that reads them instead ([`BuildThreads`]).
//!
//! A build side read by a slot-map scan (a Parquet table with slot maps, see
//! `crate::datafusion::slot_scan`) carries each row's slot in a column of its own: a batch
//! whose slots the scan vouches for takes them from there, any other batch looks its keys up.
//!
//! # Invariants
//! - Every build row with a non-NULL key is reachable from exactly one place: its key's slot,
//!   or the stray map when the key is not in the index.
//! - Build rows are numbered in the order the build stream delivered them (`u32`, so a build
//!   side has fewer than 2^32 − 1 rows; more is an error, not a wrong answer).
//! - Memory for the batch and the table is reserved in the session's pool before it is used.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use ::datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use ::datafusion::arrow::compute::{concat, concat_batches};
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::common::runtime::SpawnedTask;
use ::datafusion::common::{DataFusionError, Result, ScalarValue};
use ::datafusion::execution::memory_pool::MemoryReservation;
use ::datafusion::execution::SendableRecordBatchStream;
use ::datafusion::physical_expr::PhysicalExprRef;
use futures::StreamExt;

use super::build_threads::BuildThreads;
use super::ranked::RankedSlots;
use crate::core::column::ColumnIndex;
use crate::core::column::ABSENT;
use crate::datafusion::error::to_df;
use crate::datafusion::slot_scan::scan_slots_of;

/// Marks a slot without a build row in [`SlotRows::Unique`].
pub const NO_ROW: u32 = u32::MAX;

/// The slot table is laid out by position among the occupied slots ([`RankedSlots`]) when
/// the build rows occupy at most one slot in this many; by slot otherwise. At a quarter full,
/// the ranked form's bits and counts (0.25 bytes a slot) plus its rows (4 bytes a build row)
/// take less than a third of the dense table's 4 bytes a slot, and a probe that misses reads
/// only the bits.
pub const RANKED_FILL_RATIO: usize = 4;

/// Whether the slot table of `members` build rows among `n_slots` slots is laid out by position
/// among the occupied slots ([`RANKED_FILL_RATIO`]).
pub fn ranked_layout(members: usize, n_slots: usize) -> bool {
    members.saturating_mul(RANKED_FILL_RATIO) <= n_slots
}

/// What the slot table of about `members` build rows among `n_slots` slots sweeps whatever its
/// rows, in slots of a table laid out by slot (4 bytes each): all `n_slots`, or the ranked
/// form's bits and counts (for the cost model).
pub fn swept_slots(members: f64, n_slots: f64) -> f64 {
    // Saturating float-to-int casts: absurd estimates price as a table by slot.
    match ranked_layout(members as usize, n_slots as usize) {
        true => RankedSlots::size_for(n_slots as usize) as f64 / 4.0,
        false => n_slots,
    }
}

/// Build rows whose non-NULL key is not in the index, by key.
pub type Strays = HashMap<ScalarValue, Vec<u32>>;

/// The slot → build rows table, indexed by slot, or by position among the occupied slots
/// when [`BuildSide::is_ranked`] (a "slot" `s` below is then that position).
#[derive(Debug)]
pub enum SlotRows {
    /// `rows[slot]` is the only build row of the slot, or [`NO_ROW`].
    Unique(Vec<u32>),
    /// Build rows of slot `s`: `rows[offsets[s] as usize..offsets[s + 1] as usize]`.
    Multi {
        /// `slots + 1` prefix sums.
        offsets: Vec<u32>,
        /// Build row numbers grouped by slot.
        rows: Vec<u32>,
    },
}

impl SlotRows {
    /// Short name for `EXPLAIN ANALYZE` and tests.
    pub fn layout(&self) -> &'static str {
        match self {
            SlotRows::Unique(_) => "unique",
            SlotRows::Multi { .. } => "csr",
        }
    }

    fn size(&self) -> usize {
        match self {
            SlotRows::Unique(rows) => rows.len() * 4,
            SlotRows::Multi { offsets, rows } => (offsets.len() + rows.len()) * 4,
        }
    }
}

/// Where the time of one build went (the `build_*_time` metrics).
#[derive(Clone, Copy, Debug, Default)]
pub struct BuildTimings {
    /// Reading the input and concatenating it into one batch.
    pub input: std::time::Duration,
    /// Evaluating the key and looking up every build row's slot (all cores).
    pub slots: std::time::Duration,
    /// Laying out the slot table, strays, residual keys and visited bitmap.
    pub layout: std::time::Duration,
}

/// One build side, shared by the probe streams that read it.
#[derive(Debug)]
pub struct BuildSide {
    /// Where the build's time went.
    pub timings: BuildTimings,
    /// Build rows whose slots the slot-map scan gave (the others were looked up).
    pub stored_slot_rows: usize,
    /// All build rows.
    pub batch: RecordBatch,
    /// Slot (or position, see `ranked`) → build rows.
    pub table: SlotRows,
    /// The occupied slots, when `table` is indexed by position among them.
    ranked: Option<RankedSlots>,
    /// Build rows whose non-NULL key is not in the index, by key.
    pub strays: Strays,
    /// The other join keys evaluated on the build rows (residual equalities), in `on` order
    /// without the indexed key.
    pub residual_keys: Vec<ArrayRef>,
    /// One bit per build row that found a partner (kept only for join types that emit build
    /// rows at the end).
    visited: Vec<AtomicU64>,
    /// One bit per slot of the index, set where a build row has that slot (kept only for
    /// joins whose probe asks for membership alone, see `Prober::probe`): an eighth of a byte
    /// a slot, where the slot table takes four, so a probe row's test stays in cache.
    members: Vec<u64>,
    /// `members` carried back into the slots of the probe key's own index (those whose key
    /// translates into an occupied slot), made by the first probe stream that reads its own
    /// slots; every stream of one join probes with the same translation. Or why its memory
    /// could not be reserved (every stream then fails with it).
    probe_members: OnceLock<std::result::Result<Vec<u64>, String>>,
    /// The memory of `probe_members` (the same consumer as the build's).
    probe_members_reservation: MemoryReservation,
    /// Probe streams that have not finished; the last one emits the build side's final rows.
    probes_left: AtomicUsize,
    /// Where this build's work ran, and where work derived from it (a group join's groups) runs.
    pub threads: BuildThreads,
    /// The memory of the batch and the table.
    _reservation: MemoryReservation,
}

impl BuildSide {
    /// Collects the build rows from `inputs`, computes every build row's slot with `index` and
    /// lays out the table.
    ///
    /// `inputs` are the build side's streams (several when a collected build side is read from
    /// its own partitions: each is read, and its keys looked up, by a task of its own); rows are
    /// numbered in input order. `key` is the indexed join key on the build side, `residual` the
    /// other keys; `track_visits` keeps the visited bitmap, `member_bits` the bitmap of
    /// occupied slots ([`BuildSide::members`]); `probes` is the number of probe
    /// streams that will read it. `stored_slots` is the position of the slots a slot-map scan
    /// appended to the build side, if it did. `threads` says where the lookups, concatenation
    /// and layout run (see [`BuildThreads`]).
    ///
    /// # Errors
    /// Input errors, memory-pool refusals, more than 2^32 − 2 build rows.
    #[allow(clippy::too_many_arguments)]
    pub async fn collect(
        inputs: Vec<SendableRecordBatchStream>,
        schema: SchemaRef,
        index: &Arc<ColumnIndex>,
        key: &PhysicalExprRef,
        stored_slots: Option<usize>,
        residual: &[PhysicalExprRef],
        track_visits: bool,
        member_bits: bool,
        probes: usize,
        reservation: MemoryReservation,
        threads: BuildThreads,
    ) -> Result<BuildSide> {
        let start = std::time::Instant::now();
        let reservation = Arc::new(reservation);
        // Slots found batch by batch, by the reading tasks; otherwise after the read, on all cores.
        let per_batch = inputs.len() > 1 || stored_slots.is_some();
        let tasks: Vec<_> = inputs
            .into_iter()
            .map(|stream| {
                let index = per_batch.then(|| Arc::clone(index));
                let (key, reservation) = (Arc::clone(key), Arc::clone(&reservation));
                SpawnedTask::spawn(read_input(stream, index, stored_slots, key, reservation))
            })
            .collect();
        let mut batches = Vec::new();
        let mut slots = Vec::new();
        let mut stored_slot_rows = 0;
        for task in tasks {
            let (b, s, stored) = task
                .join_unwind()
                .await
                .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
            batches.extend(b);
            slots.extend(s);
            stored_slot_rows += stored;
        }
        let mut reservation = Arc::try_unwrap(reservation)
            .map_err(|_| DataFusionError::Internal("MphfJoinExec: build reservation still shared".into()))?;
        let batch = concat_batches_by_column(&schema, &batches, threads)?;
        drop(batches);
        reservation.try_resize(batch.get_array_memory_size())?;
        let input_done = std::time::Instant::now();
        let keys = key.evaluate(&batch)?.into_array(batch.num_rows())?;
        // One input without stored slots: its lookups were left to this step, on the build's threads.
        if !per_batch {
            slots = slots_of_keys(index, &keys, threads)?;
        }
        let slots_done = std::time::Instant::now();
        let rows = batch.num_rows();
        if slots.len() != rows {
            return Err(DataFusionError::Internal(format!(
                "MphfJoinExec: {} slots for {rows} build rows",
                slots.len()
            )));
        }
        if rows >= NO_ROW as usize {
            return Err(DataFusionError::Execution(format!(
                "MphfJoinExec: the build side has {rows} rows; at most {} are supported",
                NO_ROW - 1
            )));
        }
        let n_slots = usize::try_from(index.len())
            .map_err(|_| DataFusionError::Execution("MphfJoinExec: index too large".into()))?;
        let keys_repeat = index.stats().had_duplicates();
        let (table, strays, ranked) =
            slot_table(&slots, keys.as_ref(), n_slots, keys_repeat, threads, &mut reservation)?;
        let members = match member_bits {
            true => {
                reservation.try_grow(n_slots.div_ceil(64) * 8)?;
                occupied_bits(&slots, n_slots)
            }
            false => Vec::new(),
        };
        drop(slots);
        let residual_keys = residual
            .iter()
            .map(|e| e.evaluate(&batch)?.into_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let visited = if track_visits {
            reservation.try_grow(rows.div_ceil(64) * 8)?;
            (0..rows.div_ceil(64)).map(|_| AtomicU64::new(0)).collect()
        } else {
            Vec::new()
        };
        let ranked_size = ranked.as_ref().map_or(0, RankedSlots::size);
        let bitmaps = (visited.len() + members.len()) * 8;
        reservation.try_resize(batch.get_array_memory_size() + table.size() + ranked_size + bitmaps)?;
        let timings = BuildTimings {
            input: input_done - start,
            slots: slots_done - input_done,
            layout: slots_done.elapsed(),
        };
        Ok(BuildSide {
            timings,
            stored_slot_rows,
            batch,
            table,
            ranked,
            strays,
            residual_keys,
            visited,
            members,
            probe_members: OnceLock::new(),
            probe_members_reservation: reservation.new_empty(),
            probes_left: AtomicUsize::new(probes.max(1)),
            threads,
            _reservation: reservation,
        })
    }

    /// Whether `table` is indexed by position among the occupied slots.
    pub fn is_ranked(&self) -> bool {
        self.ranked.is_some()
    }

    /// Whether no slot has two build rows ([`BuildSide::only_row`] answers).
    pub fn is_unique(&self) -> bool {
        matches!(self.table, SlotRows::Unique(_))
    }

    /// The build row of `slot` when the table is unique; [`NO_ROW`] when the slot has none, or
    /// is not a slot of the index, or the table is not unique.
    #[inline]
    pub fn only_row(&self, slot: u64) -> u32 {
        let SlotRows::Unique(rows) = &self.table else {
            return NO_ROW;
        };
        self.table_index(slot)
            .and_then(|at| rows.get(at as usize).copied())
            .unwrap_or(NO_ROW)
    }

    /// Where `slot`'s build rows are in [`BuildSide::table`]: the slot itself, or its position
    /// among the occupied slots (`None`: it holds no build row).
    #[inline]
    fn table_index(&self, slot: u64) -> Option<u64> {
        match &self.ranked {
            None => Some(slot),
            Some(ranked) => ranked.position(slot),
        }
    }

    /// The bitmap of occupied slots, when the build kept it (`member_bits`): bit `s` of word
    /// `s / 64` is set where some build row has slot `s`. Build rows whose key is not in the
    /// index are not in it; they are [`BuildSide::strays`].
    pub fn members(&self) -> Option<&[u64]> {
        (!self.members.is_empty()).then_some(&self.members[..])
    }

    /// [`BuildSide::members`] in the slots of the probe key's own index (`slots` of them),
    /// made by `make` the first time it is asked for (see the field's docs), its memory
    /// reserved first.
    ///
    /// # Errors
    /// The memory pool refuses the bitmap (a resources-exhausted error, to every stream).
    pub fn probe_members(&self, slots: usize, make: impl FnOnce() -> Vec<u64>) -> Result<&[u64]> {
        let made = self.probe_members.get_or_init(|| {
            let bytes = slots.div_ceil(64) * 8;
            self.probe_members_reservation.try_grow(bytes).map_err(|e| match e {
                DataFusionError::ResourcesExhausted(why) => why,
                other => other.to_string(),
            })?;
            Ok(make())
        });
        match made {
            Ok(bits) => Ok(bits),
            Err(why) => Err(DataFusionError::ResourcesExhausted(why.clone())),
        }
    }

    /// Number of build rows.
    pub fn rows(&self) -> usize {
        self.batch.num_rows()
    }

    /// Appends the build rows of `slot` (or of a stray `key` when `slot` is [`ABSENT`]) to
    /// `out`, with `probe_row` to `probes`.
    #[inline]
    pub fn matches(&self, slot: u64, probe_row: u32, out: &mut Vec<u32>, probes: &mut Vec<u32>) {
        let Some(slot) = self.table_index(slot) else {
            return;
        };
        match &self.table {
            SlotRows::Unique(rows) => {
                let r = rows[slot as usize];
                if r != NO_ROW {
                    out.push(r);
                    probes.push(probe_row);
                }
            }
            SlotRows::Multi { offsets, rows } => {
                let (a, b) = (offsets[slot as usize] as usize, offsets[slot as usize + 1] as usize);
                out.extend_from_slice(&rows[a..b]);
                probes.extend(std::iter::repeat_n(probe_row, b - a));
            }
        }
    }

    /// Marks build rows as matched.
    pub fn visit(&self, rows: &[u32]) {
        if self.visited.is_empty() {
            return;
        }
        for &r in rows {
            let (w, b) = (r as usize / 64, r as usize % 64);
            // Relaxed: the bits are read only after every probe stream finished
            // (`finish_probe`'s AcqRel decrement orders them).
            self.visited[w].fetch_or(1 << b, Ordering::Relaxed);
        }
    }

    /// Whether build row `r` was matched.
    pub fn was_visited(&self, r: usize) -> bool {
        self.visited[r / 64].load(Ordering::Relaxed) & (1 << (r % 64)) != 0
    }

    /// Called once by every probe stream when it ends; true for the last one.
    pub fn finish_probe(&self) -> bool {
        self.probes_left.fetch_sub(1, Ordering::AcqRel) == 1
    }
}

/// Reads one build input: its batches, and (with `index`) their rows' slots: the stored ones
/// at column `stored_slots` where the scan vouches for them, else the keys' lookups.
async fn read_input(
    mut stream: SendableRecordBatchStream,
    index: Option<Arc<ColumnIndex>>,
    stored_slots: Option<usize>,
    key: PhysicalExprRef,
    reservation: Arc<MemoryReservation>,
) -> Result<(Vec<RecordBatch>, Vec<u64>, usize)> {
    let mut batches = Vec::new();
    let mut slots = Vec::new();
    let mut stored_rows = 0;
    let mut chunk = Vec::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        reservation.try_grow(batch.get_array_memory_size())?;
        if let Some(index) = &index {
            let stored = stored_slots
                .and_then(|c| batch.columns().get(c))
                .is_some_and(|c| scan_slots_of(c, &mut chunk));
            if stored {
                stored_rows += batch.num_rows();
            } else {
                let keys = key.evaluate(&batch)?.into_array(batch.num_rows())?;
                index.lookup_slots(keys.as_ref(), &mut chunk).map_err(to_df)?;
            }
            slots.extend_from_slice(&chunk);
        }
        batches.push(batch);
    }
    Ok((batches, slots, stored_rows))
}

/// `batches` as one batch, its columns concatenated on the build's `threads`.
fn concat_batches_by_column(schema: &SchemaRef, batches: &[RecordBatch], threads: BuildThreads) -> Result<RecordBatch> {
    if batches.len() == 1 {
        return Ok(batches[0].clone());
    }
    if schema.fields().is_empty() {
        return Ok(concat_batches(schema, batches)?);
    }
    let column = |c: usize| -> Result<ArrayRef> {
        let arrays: Vec<&dyn Array> = batches.iter().map(|b| b.column(c).as_ref()).collect();
        if arrays.is_empty() {
            Ok(::datafusion::arrow::array::new_empty_array(schema.field(c).data_type()))
        } else {
            Ok(concat(&arrays)?)
        }
    };
    let columns = threads
        .map_ranges(schema.fields().len(), 1, |cs| {
            cs.map(column).collect::<Result<Vec<_>>>()
        })
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .concat();
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Rows per task of the parallel build (lookups and table fill).
const PAR_CHUNK: usize = 1 << 16;

/// The slots of every build key, looked up in chunks on the build's `threads` (the build side
/// is collected into one batch, so without this a collected build would run on one core).
fn slots_of_keys(index: &ColumnIndex, keys: &ArrayRef, threads: BuildThreads) -> Result<Vec<u64>> {
    threads.try_concat_ranges(keys.len(), PAR_CHUNK, |rows| {
        let mut out = Vec::new();
        index
            .lookup_slots(keys.slice(rows.start, rows.len()).as_ref(), &mut out)
            .map_err(to_df)?;
        Ok(out)
    })
}

/// The slot table of the build rows' `slots` among the index's `n_slots`: by slot, or by
/// position among the occupied slots when at most one slot in [`RANKED_FILL_RATIO`] is
/// occupied (see the module docs); with the strays of [`lay_out`]. Laid out on the build's
/// `threads`.
fn slot_table(
    slots: &[u64],
    keys: &dyn Array,
    n_slots: usize,
    keys_repeat: bool,
    threads: BuildThreads,
    reservation: &mut MemoryReservation,
) -> Result<(SlotRows, Strays, Option<RankedSlots>)> {
    let members = members_in_range(slots, n_slots, threads)?;
    if !ranked_layout(members, n_slots) {
        reservation.try_grow(n_slots * 4)?;
        let (table, strays) = lay_out(slots, keys, n_slots, keys_repeat, threads, reservation)?;
        return Ok((table, strays, None));
    }
    // Bits and counts, each row's position, then a unique table of `members` entries (the CSR
    // layout reserves its own).
    reservation.try_grow(RankedSlots::size_for(n_slots) + slots.len() * 8 + members * 4)?;
    let ranked = RankedSlots::mark(slots, n_slots, threads);
    let positions = ranked.positions_of(slots, threads);
    // Known exactly here: some slot holds two rows when fewer slots than rows are occupied.
    let repeated = ranked.occupied() < members;
    let (table, strays) = lay_out(&positions, keys, ranked.occupied(), repeated, threads, reservation)?;
    Ok((table, strays, Some(ranked)))
}

/// Number of build rows with a slot (not [`ABSENT`]), after checking that every slot is one of
/// the index's `n_slots`: the layouts index by slot, and a slot past them (which no lookup
/// returns, and slot maps are checked against at open) is an error naming the slot, not a panic.
fn members_in_range(slots: &[u64], n_slots: usize, threads: BuildThreads) -> Result<usize> {
    let (members, largest) = threads
        .map_ranges(slots.len(), PAR_CHUNK, |rows| {
            slots[rows]
                .iter()
                .filter(|&&s| s != ABSENT)
                .fold((0usize, 0u64), |(n, max), &s| (n + 1, max.max(s)))
        })
        .into_iter()
        .fold((0, 0), |(n, a), (m, b)| (n + m, a.max(b)));
    if members > 0 && largest >= n_slots as u64 {
        return Err(DataFusionError::Execution(format!(
            "MphfJoinExec: build row slot {largest} is out of range (the index has {n_slots} slots)"
        )));
    }
    Ok(members)
}

/// One bit per slot of `n_slots`, set for the slots in `slots` (`ABSENT` skipped; slots were
/// checked to lie below `n_slots` by [`members_in_range`]).
fn occupied_bits(slots: &[u64], n_slots: usize) -> Vec<u64> {
    let mut bits = vec![0u64; n_slots.div_ceil(64)];
    for &s in slots.iter().filter(|&&s| s != ABSENT) {
        bits[(s / 64) as usize] |= 1 << (s % 64);
    }
    bits
}

/// Builds the slot table from the build rows' slots (`ABSENT` for NULL or non-member keys).
/// Where the indexed table's keys repeat (`keys_repeat`), the build goes straight to the CSR
/// layout; otherwise the unique layout is tried first (on the build's `threads`), and a slot
/// found twice (a stale index, never a fresh one) falls back to CSR.
fn lay_out(
    slots: &[u64],
    keys: &dyn Array,
    n_slots: usize,
    keys_repeat: bool,
    threads: BuildThreads,
    reservation: &mut MemoryReservation,
) -> Result<(SlotRows, Strays)> {
    let mut strays = Strays::new();
    let nulls = keys.logical_nulls();
    for (r, _) in slots.iter().enumerate().filter(|(_, &s)| s == ABSENT) {
        if nulls.as_ref().is_none_or(|n| n.is_valid(r)) {
            strays
                .entry(ScalarValue::try_from_array(keys, r)?)
                .or_default()
                .push(r as u32);
        }
    }
    if !keys_repeat {
        if let Some(unique) = unique_layout(slots, n_slots, threads) {
            return Ok((SlotRows::Unique(unique), strays));
        }
    }
    // Counting sort of the rows by slot: counts, their running sums (each slot's end), then
    // the rows placed from the last, so that each slot's start is left behind and its rows stay
    // in build order.
    let mut offsets = vec![0u32; n_slots + 1];
    for &s in slots.iter().filter(|&&s| s != ABSENT) {
        offsets[s as usize] += 1;
    }
    let mut end = 0u32;
    for o in &mut offsets[..n_slots] {
        end += *o;
        *o = end;
    }
    offsets[n_slots] = end;
    // The last running sum is the member count.
    let members = end as usize;
    reservation.try_grow((members + 1) * 4)?;
    let mut rows = vec![0u32; members];
    for (r, &s) in slots.iter().enumerate().rev() {
        if s != ABSENT {
            let at = &mut offsets[s as usize];
            *at -= 1;
            rows[*at as usize] = r as u32;
        }
    }
    Ok((SlotRows::Multi { offsets, rows }, strays))
}

/// The unique layout (each slot's one row), filled in parallel; `None` once a slot is found to
/// hold two rows.
fn unique_layout(slots: &[u64], n_slots: usize, threads: BuildThreads) -> Option<Vec<u32>> {
    let cells: Vec<AtomicU32> = threads.concat_ranges(n_slots, PAR_CHUNK, |range| {
        range.map(|_| AtomicU32::new(NO_ROW)).collect()
    });
    let duplicated = AtomicBool::new(false);
    threads.map_ranges(slots.len(), PAR_CHUNK, |rows| {
        for (r, &s) in rows.clone().zip(&slots[rows]) {
            // Relaxed: the cells are read only after every range is laid out.
            if s != ABSENT
                && cells[s as usize]
                    .compare_exchange(NO_ROW, r as u32, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                // The cells are dropped: the other ranges skip what is left of theirs.
                duplicated.store(true, Ordering::Relaxed);
            }
            if duplicated.load(Ordering::Relaxed) {
                return;
            }
        }
    });
    (!duplicated.into_inner()).then(|| cells.into_iter().map(AtomicU32::into_inner).collect())
}

/// The shared handle probe streams hold.
pub type SharedBuild = Arc<BuildSide>;

#[cfg(test)]
mod tests {
    use super::*;
    use ::datafusion::arrow::array::Int64Array;
    use ::datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};

    /// The layout of `slots` on all cores, after checking that the caller's thread lays them out
    /// alike.
    fn layout_of(slots: &[u64], n_slots: usize, keys_repeat: bool) -> SlotRows {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 20));
        let mut reservation = MemoryConsumer::new("test").register(&pool);
        let keys = Int64Array::from_iter_values(slots.iter().map(|&s| s as i64));
        let [on_all_cores, on_caller] = [BuildThreads::AllCores, BuildThreads::Caller].map(|threads| {
            lay_out(slots, &keys, n_slots, keys_repeat, threads, &mut reservation)
                .unwrap()
                .0
        });
        assert_eq!(on_caller.layout(), on_all_cores.layout());
        assert_eq!(rows_by_slot(&on_caller, n_slots), rows_by_slot(&on_all_cores, n_slots));
        on_all_cores
    }

    /// Each slot's rows, read back through the layout.
    fn rows_by_slot(table: &SlotRows, n_slots: usize) -> Vec<Vec<u32>> {
        (0..n_slots)
            .map(|s| match table {
                SlotRows::Unique(rows) => [rows[s]].into_iter().filter(|&r| r != NO_ROW).collect(),
                SlotRows::Multi { offsets, rows } => rows[offsets[s] as usize..offsets[s + 1] as usize].to_vec(),
            })
            .collect()
    }

    /// Each slot's rows read back through [`slot_table`]'s layout, and whether it was ranked;
    /// the same whether the build runs on all cores or on the caller.
    fn slot_table_rows(slots: &[u64], n_slots: usize, keys_repeat: bool) -> (Vec<Vec<u32>>, &'static str, bool) {
        let on_all_cores = slot_table_rows_on(slots, n_slots, keys_repeat, BuildThreads::AllCores);
        assert_eq!(
            slot_table_rows_on(slots, n_slots, keys_repeat, BuildThreads::Caller),
            on_all_cores
        );
        on_all_cores
    }

    fn slot_table_rows_on(
        slots: &[u64],
        n_slots: usize,
        keys_repeat: bool,
        threads: BuildThreads,
    ) -> (Vec<Vec<u32>>, &'static str, bool) {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 24));
        let mut reservation = MemoryConsumer::new("test").register(&pool);
        let keys = Int64Array::from_iter_values(slots.iter().map(|&s| s as i64));
        let (table, _, ranked) = slot_table(slots, &keys, n_slots, keys_repeat, threads, &mut reservation).unwrap();
        let positions = ranked.as_ref().map_or(n_slots, RankedSlots::occupied);
        let by_position = rows_by_slot(&table, positions);
        let rows = (0..n_slots as u64)
            .map(|s| match &ranked {
                None => by_position[s as usize].clone(),
                Some(r) => r.position(s).map_or_else(Vec::new, |p| by_position[p as usize].clone()),
            })
            .collect();
        (rows, table.layout(), ranked.is_some())
    }

    #[test]
    fn sparse_build_sides_index_their_table_by_position_with_the_same_rows() {
        let n_slots = 1000;
        // At most a quarter of the slots occupied: ranked; the rows of every slot as when the
        // same slots fill a table indexed by slot (`lay_out` directly).
        let unique: Vec<u64> = vec![997, 3, ABSENT, 64, 500, 0];
        let repeated: Vec<u64> = vec![64, 3, 997, 3, ABSENT, 64, 64];
        for (slots, layout) in [(&unique, "unique"), (&repeated, "csr")] {
            let direct = rows_by_slot(&layout_of(slots, n_slots, true), n_slots);
            // The ranked form finds the repeat itself, whatever the index says.
            for keys_repeat in [false, true] {
                let (rows, got_layout, ranked) = slot_table_rows(slots, n_slots, keys_repeat);
                assert!(ranked);
                assert_eq!(got_layout, layout);
                assert_eq!(rows, direct);
            }
        }
        // More than a quarter occupied: indexed by slot.
        let dense: Vec<u64> = (0..8).rev().collect();
        let (rows, layout, ranked) = slot_table_rows(&dense, 10, false);
        assert!(!ranked);
        assert_eq!(layout, "unique");
        assert_eq!(rows, rows_by_slot(&layout_of(&dense, 10, false), 10));
    }

    #[test]
    fn a_slot_past_the_index_is_an_error_in_either_layout() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 24));
        let mut reservation = MemoryConsumer::new("test").register(&pool);
        // Sparse (ranked) and dense (by slot) tables both check before laying out.
        let cases = [(vec![3, ABSENT, 1000], 1000), (vec![0, 1, 2, 7], 5)];
        for ((slots, n_slots), threads) in cases.into_iter().zip([BuildThreads::AllCores, BuildThreads::Caller]) {
            let keys = Int64Array::from_iter_values(slots.iter().map(|&s| s as i64));
            let err = slot_table(&slots, &keys, n_slots, false, threads, &mut reservation).unwrap_err();
            let largest = slots.iter().filter(|&&s| s != ABSENT).max().unwrap();
            assert_eq!(
                err.strip_backtrace(),
                format!(
                    "Execution error: MphfJoinExec: build row slot {largest} is out of range (the index has {n_slots} slots)"
                )
            );
        }
    }

    #[test]
    fn the_csr_layout_keeps_each_slots_rows_in_build_order() {
        let slots = [3, 0, 3, ABSENT, 1, 3, 0];
        let expected = vec![vec![1, 6], vec![4], vec![], vec![0, 2, 5], vec![]];
        // Keys known to repeat go straight to CSR; otherwise the unique attempt finds slot 3
        // twice and falls back to it.
        for keys_repeat in [true, false] {
            let table = layout_of(&slots, 5, keys_repeat);
            assert_eq!(table.layout(), "csr");
            assert_eq!(rows_by_slot(&table, 5), expected);
        }
    }

    #[test]
    fn unique_keys_take_the_unique_layout_unless_the_index_says_they_repeat() {
        let slots = [2, ABSENT, 0, 3];
        let expected = vec![vec![2], vec![], vec![0], vec![3]];
        let unique = layout_of(&slots, 4, false);
        assert_eq!(unique.layout(), "unique");
        assert_eq!(rows_by_slot(&unique, 4), expected);
        let csr = layout_of(&slots, 4, true);
        assert_eq!(csr.layout(), "csr");
        assert_eq!(rows_by_slot(&csr, 4), expected);
    }
}
