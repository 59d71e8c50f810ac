//! The slot-range form of the SlotMerge aggregation: rows scattered by slot range, then each
//! range aggregated in cache straight to final values (issue 19, item 5).
//!
//! # Why
//! Over a key that is not clustered and has few rows per slot (sparse ids, session strings,
//! rows in random order), every input partition touches most of the index's slots. The
//! partials form then keeps one accumulator group per touched slot in *every* partition
//! (memory and work multiplied by the partition count), updates them at random far outside
//! the caches, and merges P sets of states of nearly the full slot count.
//!
//! Here the rows are moved instead of the states:
//! 1. **Scatter** (one task per input partition): each batch gets its rows' slots (the scan's
//!    slot column itself when the scan hands them over, or looked up once), whose ranges are
//!    counted on arrival, while they are in cache. A chunk of batches at a time is then
//!    reordered by slot range (the counts are a counting sort's histogram), with one write per
//!    value or one `interleave` per column. Rows without a slot (NULL key, key not in the
//!    index) keep their columns in a side list.
//! 2. **Aggregate** (output partition `p`): for each range that `p` owns, one
//!    [`SlotGroups`] window of the range's slots takes the range's slice of every chunk of every
//!    input partition, then evaluates the final values. A range is at most [`MAX_RANGE_SLOTS`]
//!    slots, so its group array and accumulators stay in the core's cache. No partial states,
//!    no merge. When a range has at least as many rows as slots, a row's group is its slot's
//!    offset in the range ([`SlotGroups::use_window_offsets`]), with no group table lookup.
//!    Partition 0 also aggregates the rows without a slot.
//!
//! # Invariants
//! - Range `r` holds the slots `[r·2^shift, (r+1)·2^shift)`; output partition `p` of `P` owns
//!   the ranges `[p·R/P, (p+1)·R/P)`. Each slot, hence each group, is aggregated by exactly one
//!   output partition; the rows without a slot by partition 0.
//! - The scattered chunks carry only the columns that the aggregate arguments and the dependent
//!   group expressions read; every other column (the key itself, unless an aggregate reads it,
//!   and a slot-map scan's slot column) is an all-NULL placeholder: a row with a slot never
//!   reads its key (the group's key is emitted from the index).
//! - Fixed-width columns without NULLs are scattered straight into their new positions (one
//!   write per value); others go through arrow's `interleave`.
//! - Slots are u32 (`NO_SLOT`: none), as the slot maps store them: the rule takes the range form
//!   only for indexes of fewer than `u32::MAX` slots. A scan's slot column is kept, not
//!   copied: every fresh byte per row is paid for again in page faults.
//! - The placeholder columns are slices of one all-NULL array per column, made once per scatter
//!   task.
//! - Memory: the scattered chunks (O(rows)) and each output partition's current range are
//!   reserved in the memory pool.

use std::sync::Arc;

use ::datafusion::arrow::array::{
    make_array, new_null_array, Array, ArrayData, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions,
};
use ::datafusion::arrow::buffer::{MutableBuffer, ScalarBuffer};
use ::datafusion::arrow::compute::{filter_record_batch, interleave};
use ::datafusion::arrow::datatypes::ArrowNativeType;
use ::datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use ::datafusion::common::runtime::SpawnedTask;
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::physical_expr::utils::collect_columns;
use ::datafusion::physical_plan::aggregates::AggregateExec;
use ::datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, Time};
use ::datafusion::physical_plan::ExecutionPlanProperties;
use futures::StreamExt;

use super::grouping::Grouping;
use super::groups::{batch_slots, SlotGroups, SlotMetrics};
use crate::core::column::ABSENT;
use crate::datafusion::registry::IndexHandle;
use crate::datafusion::slot_scan::scan_slot_values;
use crate::index::NO_SLOT;

/// Most slots in one range: a range's group array (4 bytes a slot) and a few accumulator
/// states (8–16 bytes a group) then fit a core's L2 cache.
pub(super) const MAX_RANGE_SLOTS: usize = 1 << 16;
/// Ranges per output partition aimed at (more balance the partitions better when ranges
/// differ in rows; each costs a slice per chunk).
const RANGES_PER_PARTITION: usize = 4;
/// Fewest rows in a scattered chunk.
const MIN_CHUNK_ROWS: usize = 1 << 16;
/// Rows per range slice aimed at within a chunk (a slice is one `update_batch` call).
const SLICE_ROWS: usize = 2048;

/// The slot ranges of an index of `n` slots over `partitions` output partitions (see the
/// module's invariants).
#[derive(Clone, Copy, Debug)]
pub(super) struct SlotRanges {
    n: usize,
    shift: u32,
    ranges: usize,
    partitions: usize,
}

impl SlotRanges {
    pub(super) fn new(n: usize, partitions: usize) -> Self {
        let partitions = partitions.max(1);
        // The largest power of two, at most MAX_RANGE_SLOTS, that still gives every partition
        // RANGES_PER_PARTITION ranges.
        let target = (n / (partitions * RANGES_PER_PARTITION)).clamp(1, MAX_RANGE_SLOTS);
        let shift = usize::BITS - 1 - target.leading_zeros();
        let ranges = n.div_ceil(1 << shift).max(1);
        Self {
            n,
            shift,
            ranges,
            partitions,
        }
    }

    /// Number of ranges.
    pub(super) fn len(&self) -> usize {
        self.ranges
    }

    /// The range of a slot (`ABSENT` has none).
    #[inline]
    fn of(&self, slot: u64) -> usize {
        (slot >> self.shift) as usize
    }

    /// The slots of range `r`.
    fn slots(&self, r: usize) -> std::ops::Range<usize> {
        (r << self.shift).min(self.n)..((r + 1) << self.shift).min(self.n)
    }

    /// The ranges of output partition `p`.
    fn of_partition(&self, p: usize) -> std::ops::Range<usize> {
        p * self.ranges / self.partitions..(p + 1) * self.ranges / self.partitions
    }

    /// Rows per scattered chunk.
    fn chunk_rows(&self) -> usize {
        MIN_CHUNK_ROWS.max(self.ranges.saturating_mul(SLICE_ROWS))
    }
}

/// One chunk of an input partition's rows, reordered by slot range.
struct Chunk {
    /// The rows, range after range (columns the ranges do not read are placeholders).
    batch: RecordBatch,
    /// Their slots, in the same order (u32: the range form takes indexes of fewer than
    /// `u32::MAX` slots).
    slots: Vec<u32>,
    /// Range `r`'s rows are `starts[r]..starts[r + 1]`.
    starts: Vec<usize>,
}

/// What the scatter leaves for the ranges' aggregation.
pub(super) struct Scattered {
    chunks: Vec<Chunk>,
    /// Rows without a slot, with all their columns.
    unslotted: Vec<RecordBatch>,
    _reservations: Vec<MemoryReservation>,
}

/// The aggregation's inputs and expressions (what both steps need).
pub(super) struct RangeJob {
    pub partial: Arc<AggregateExec>,
    pub index: Arc<IndexHandle>,
    pub key_pos: usize,
    pub out_schema: SchemaRef,
    pub ranges: SlotRanges,
}

impl RangeJob {
    /// Step 1: every input partition scattered, each in its own task.
    pub(super) async fn scatter(
        &self,
        context: &Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Scattered> {
        let inputs = self.partial.input().output_partitioning().partition_count();
        if self.index.index().len() >= u64::from(NO_SLOT) {
            return Err(DataFusionError::Internal(format!(
                "MphfAggregateExec: the range form takes fewer than {NO_SLOT} slots, not {}",
                self.index.index().len()
            )));
        }
        let layout = self.chunk_layout();
        let mut tasks = Vec::with_capacity(inputs);
        for i in 0..inputs {
            let stream = self.partial.input().execute(i, Arc::clone(context))?;
            let scatter = Scatter {
                grouping: Grouping::try_new(&self.partial, self.key_pos, &self.out_schema, &self.index)?,
                index: Arc::clone(&self.index),
                ranges: self.ranges,
                read: Arc::clone(&layout.0),
                chunk_schema: Arc::clone(&layout.1),
                dest: Vec::new(),
                looked_up: Vec::new(),
                pending_counts: vec![0; self.ranges.len() + 1],
                pending_absent: 0,
                placeholders: vec![None; layout.1.fields().len()],
                metrics: SlotMetrics::new(metrics, i),
                scatter_time: MetricBuilder::new(metrics).subset_time("scatter_time", i),
                reservation: MemoryConsumer::new(format!("MphfAggregateExec[scatter {i}]"))
                    .register(context.memory_pool()),
            };
            tasks.push(SpawnedTask::spawn(scatter.run(stream)));
        }
        let mut out = Scattered {
            chunks: Vec::new(),
            unslotted: Vec::new(),
            _reservations: Vec::with_capacity(inputs),
        };
        for t in tasks {
            let (chunks, unslotted, reservation) = t
                .join_unwind()
                .await
                .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
            out.chunks.extend(chunks);
            out.unslotted.extend(unslotted);
            out._reservations.push(reservation);
        }
        Ok(out)
    }

    /// Which input columns the range aggregation reads (aggregate arguments, dependent group
    /// expressions), and the schema of the scattered chunks, whose other columns are nullable
    /// placeholders (see the module).
    fn chunk_layout(&self) -> (Arc<[bool]>, SchemaRef) {
        let input = self.partial.input().schema();
        let mut read = vec![false; input.fields().len()];
        let readers = self.partial.aggr_expr().iter().flat_map(|a| a.expressions()).chain(
            self.partial
                .group_expr()
                .expr()
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != self.key_pos)
                .map(|(_, (e, _))| Arc::clone(e)),
        );
        for expr in readers {
            for c in collect_columns(&expr) {
                if let Some(r) = read.get_mut(c.index()) {
                    *r = true;
                }
            }
        }
        let fields: Vec<Field> = input
            .fields()
            .iter()
            .zip(&read)
            .map(|(f, &read)| {
                let f = f.as_ref().clone();
                if read {
                    f
                } else {
                    f.with_nullable(true)
                }
            })
            .collect();
        let schema = Schema::new_with_metadata(fields, input.metadata().clone());
        (read.into(), Arc::new(schema))
    }

    /// Step 2: output partition `partition` aggregates its ranges; one batch per range.
    pub(super) fn aggregate(
        &self,
        scattered: &Scattered,
        partition: usize,
        context: &Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Vec<RecordBatch>> {
        let reservation =
            MemoryConsumer::new(format!("MphfAggregateExec[range {partition}]")).register(context.memory_pool());
        let mut out = Vec::new();
        let slot_metrics = SlotMetrics::new(metrics, partition);
        // Whether an aggregate argument can be NULL in any chunk: the same for every range.
        let mut null_free = None;
        for r in self.ranges.of_partition(partition) {
            let slots = self.ranges.slots(r);
            let window = slots.len();
            let mut groups = SlotGroups::try_new_window(
                &self.partial,
                self.key_pos,
                &self.out_schema,
                Arc::clone(&self.index),
                slots,
                slot_metrics.clone(),
            )?;
            let rows: usize = scattered.chunks.iter().map(|c| c.starts[r + 1] - c.starts[r]).sum();
            if rows >= window {
                // Most of the range's slots have rows: each row's group is its slot's offset.
                let null_free = *null_free
                    .get_or_insert_with(|| groups.arguments_free_of_nulls(scattered.chunks.iter().map(|c| &c.batch)));
                groups.use_window_offsets(null_free);
            }
            for chunk in &scattered.chunks {
                let (a, b) = (chunk.starts[r], chunk.starts[r + 1]);
                if a == b {
                    continue;
                }
                groups.accumulate_window_slots(&chunk.batch.slice(a, b - a), &chunk.slots[a..b])?;
                reservation.try_resize(groups.size())?;
            }
            if r == 0 && !scattered.unslotted.is_empty() {
                // The rows without a slot are grouped by their key (see the module).
                let grouping = Grouping::try_new(&self.partial, self.key_pos, &self.out_schema, &self.index)?;
                for batch in &scattered.unslotted {
                    let k = grouping.key_expr.evaluate(batch)?.into_array(batch.num_rows())?;
                    groups.accumulate_slots(batch, Some(&k), &vec![ABSENT; batch.num_rows()])?;
                    reservation.try_resize(groups.size())?;
                }
            }
            let batch = groups.emit(&self.out_schema, true)?;
            if batch.num_rows() > 0 {
                out.push(batch);
            }
        }
        Ok(out)
    }
}

/// `dest` value of a row without a slot.
const NO_POSITION: u32 = u32::MAX;

/// The (batch, row) of each chunk position, for `interleave`.
fn interleave_order(pending: &[(RecordBatch, ScalarBuffer<u32>)], dest: &[u32], rows: usize) -> Vec<(usize, usize)> {
    let mut order = vec![(0usize, 0usize); rows];
    let mut k = 0;
    for (b, (batch, _)) in pending.iter().enumerate() {
        for i in 0..batch.num_rows() {
            if dest[k] != NO_POSITION {
                order[dest[k] as usize] = (b, i);
            }
            k += 1;
        }
    }
    order
}

/// The values of `arrays` (one column of the pending batches) written to their chunk
/// positions `dest`, when the column has a fixed width and no NULLs; `None` otherwise.
fn scatter_fixed_width(arrays: &[&dyn Array], dest: &[u32], rows: usize) -> Option<ArrayRef> {
    let data_type = arrays.first()?.data_type().clone();
    let width = data_type.primitive_width()?;
    if arrays.iter().any(|a| a.null_count() > 0) {
        return None;
    }
    let data: Vec<ArrayData> = arrays.iter().map(|a| a.to_data()).collect();
    let mut out = MutableBuffer::from_len_zeroed(rows * width);
    let scattered = match width {
        1 => scatter_values::<u8>(&data, dest, out.typed_data_mut()),
        2 => scatter_values::<u16>(&data, dest, out.typed_data_mut()),
        4 => scatter_values::<u32>(&data, dest, out.typed_data_mut()),
        8 => scatter_values::<u64>(&data, dest, out.typed_data_mut()),
        16 => scatter_values::<i128>(&data, dest, out.typed_data_mut()),
        _ => false,
    };
    if !scattered {
        return None;
    }
    let data = ArrayData::builder(data_type)
        .len(rows)
        .add_buffer(out.into())
        .build()
        .ok()?;
    Some(make_array(data))
}

/// `out[dest[k]] = k-th value` over the value buffers of `data`, in order; false (nothing
/// written) when a buffer is not aligned for `T` or has another layout.
fn scatter_values<T: ArrowNativeType>(data: &[ArrayData], dest: &[u32], out: &mut [T]) -> bool {
    let aligned = data.iter().all(|d| {
        d.buffers().len() == 1
            && d.buffers()[0].as_ptr().align_offset(std::mem::align_of::<T>()) == 0
            && d.buffers()[0].len() >= (d.offset() + d.len()) * std::mem::size_of::<T>()
    });
    if !aligned {
        return false;
    }
    let mut k = 0;
    for d in data {
        let values = &d.buffers()[0].typed_data::<T>()[d.offset()..d.offset() + d.len()];
        for (&v, &at) in values.iter().zip(&dest[k..k + d.len()]) {
            if at != NO_POSITION {
                out[at as usize] = v;
            }
        }
        k += d.len();
    }
    true
}

/// The scatter of one input partition.
struct Scatter {
    grouping: Grouping,
    index: Arc<IndexHandle>,
    ranges: SlotRanges,
    /// Input columns that the range aggregation reads (the others become placeholders).
    read: Arc<[bool]>,
    /// Schema of the scattered chunks.
    chunk_schema: SchemaRef,
    /// Scratch: each pending row's position in the chunk (`NO_POSITION`: no slot).
    dest: Vec<u32>,
    /// Scratch: the slots of a batch looked up in the index.
    looked_up: Vec<u64>,
    /// Rows of each range among the pending rows, at `r + 1` (counted as their slots arrive,
    /// while they are in cache), and the pending rows without a slot.
    pending_counts: Vec<usize>,
    pending_absent: usize,
    /// All-NULL arrays of the placeholder columns, sliced for each chunk (never read).
    placeholders: Vec<Option<ArrayRef>>,
    metrics: SlotMetrics,
    scatter_time: Time,
    reservation: MemoryReservation,
}

impl Scatter {
    async fn run(
        mut self,
        mut stream: SendableRecordBatchStream,
    ) -> Result<(Vec<Chunk>, Vec<RecordBatch>, MemoryReservation)> {
        let chunk_rows = self.ranges.chunk_rows();
        let mut chunks = Vec::new();
        let mut unslotted = Vec::new();
        let mut pending: Vec<(RecordBatch, ScalarBuffer<u32>)> = Vec::new();
        let mut pending_rows = 0;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            let rows = batch.num_rows();
            if rows == 0 {
                continue;
            }
            let slots = {
                let lookup_time = self.metrics.lookup_time.clone();
                let _timer = lookup_time.timer();
                self.slots_of(&batch)?
            };
            self.count(&slots);
            // The input's memory is now held here until the ranges are aggregated.
            self.reservation.try_grow(batch.get_array_memory_size())?;
            pending_rows += rows;
            pending.push((batch, slots));
            if pending_rows >= chunk_rows {
                let scatter_time = self.scatter_time.clone();
                let _timer = scatter_time.timer();
                self.flush(&mut pending, &mut chunks, &mut unslotted)?;
                pending_rows = 0;
            }
        }
        let scatter_time = self.scatter_time.clone();
        let _timer = scatter_time.timer();
        self.flush(&mut pending, &mut chunks, &mut unslotted)?;
        drop(_timer);
        Ok((chunks, unslotted, self.reservation))
    }

    /// The slots of `batch`'s rows as u32 (`NO_SLOT`: none): the slot-map scan's column itself
    /// when it hands them over, else looked up in the index (see [`batch_slots`]).
    fn slots_of(&mut self, batch: &RecordBatch) -> Result<ScalarBuffer<u32>> {
        let rows = batch.num_rows();
        if let Some(slots) = self.grouping.scan_slots.and_then(|c| scan_slot_values(batch.column(c))) {
            self.metrics.scan_slot_rows.add(rows);
            return Ok(slots.clone());
        }
        let key = self.grouping.key_expr.evaluate(batch)?.into_array(rows)?;
        batch_slots(
            &self.grouping,
            &self.index,
            batch,
            &key,
            &mut self.looked_up,
            &self.metrics,
        )?;
        // Below NO_SLOT: the index has fewer slots (checked before the scatter starts).
        let narrow = self
            .looked_up
            .iter()
            .map(|&s| if s == ABSENT { NO_SLOT } else { s as u32 });
        Ok(narrow.collect())
    }

    /// Adds the ranges of a pending batch's slots to the counts.
    fn count(&mut self, slots: &[u32]) {
        let counts = &mut self.pending_counts[1..];
        for &s in slots {
            if s == NO_SLOT {
                self.pending_absent += 1;
            } else {
                counts[self.ranges.of(u64::from(s))] += 1;
            }
        }
    }

    /// An all-NULL column `c` of `rows` rows (a slice of one kept array; see `placeholders`).
    fn placeholder(&mut self, c: usize, rows: usize) -> ArrayRef {
        let field = self.chunk_schema.field(c);
        let kept = &mut self.placeholders[c];
        match kept {
            Some(array) if array.len() >= rows => array.slice(0, rows),
            _ => {
                let array = new_null_array(field.data_type(), rows.max(self.ranges.chunk_rows()));
                let out = array.slice(0, rows);
                *kept = Some(array);
                out
            }
        }
    }

    /// Reorders the pending batches by slot range into one chunk (see the module).
    fn flush(
        &mut self,
        pending: &mut Vec<(RecordBatch, ScalarBuffer<u32>)>,
        chunks: &mut Vec<Chunk>,
        unslotted: &mut Vec<RecordBatch>,
    ) -> Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let n_ranges = self.ranges.len();
        let mut starts = std::mem::replace(&mut self.pending_counts, vec![0; n_ranges + 1]);
        let absent = std::mem::take(&mut self.pending_absent);
        for r in 0..n_ranges {
            starts[r + 1] += starts[r];
        }
        let rows = starts[n_ranges];
        if u32::try_from(rows).is_err() {
            return Err(DataFusionError::Internal(format!(
                "MphfAggregateExec: a scattered chunk of {rows} rows"
            )));
        }
        // Each row's position in the chunk, and the chunk's slots.
        let mut next = starts.clone();
        let mut slots_out = vec![0u32; rows];
        let dest = &mut self.dest;
        dest.clear();
        for (_, slots) in pending.iter() {
            dest.extend(slots.iter().map(|&s| {
                if s == NO_SLOT {
                    return NO_POSITION;
                }
                let r = self.ranges.of(u64::from(s));
                let at = next[r];
                next[r] += 1;
                slots_out[at] = s;
                at as u32
            }));
        }
        let schema = Arc::clone(&self.chunk_schema);
        let mut order: Option<Vec<(usize, usize)>> = None;
        let mut columns = Vec::with_capacity(schema.fields().len());
        for c in 0..schema.fields().len() {
            if !self.read[c] {
                columns.push(self.placeholder(c, rows));
                continue;
            }
            let dest = &self.dest;
            let arrays: Vec<&dyn Array> = pending.iter().map(|(b, _)| b.column(c).as_ref()).collect();
            if let Some(array) = scatter_fixed_width(&arrays, dest, rows) {
                columns.push(array);
                continue;
            }
            let order = order.get_or_insert_with(|| interleave_order(pending, dest, rows));
            columns.push(interleave(&arrays, order)?);
        }
        let batch =
            RecordBatch::try_new_with_options(schema, columns, &RecordBatchOptions::new().with_row_count(Some(rows)))?;
        let mut after = batch.get_array_memory_size() + slots_out.capacity() * 4;
        if absent > 0 {
            for (b, slots) in pending.iter() {
                let mask: BooleanArray = slots.iter().map(|&s| Some(s == NO_SLOT)).collect();
                let kept = filter_record_batch(b, &mask)?;
                if kept.num_rows() > 0 {
                    after += kept.get_array_memory_size();
                    unslotted.push(kept);
                }
            }
        }
        // The chunk replaces the batches it was made of.
        let before: usize = pending.iter().map(|(b, _)| b.get_array_memory_size()).sum();
        pending.clear();
        if after > before {
            self.reservation.try_grow(after - before)?;
        } else {
            self.reservation.shrink((before - after).min(self.reservation.size()));
        }
        chunks.push(Chunk {
            batch,
            slots: slots_out,
            starts,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ::datafusion::arrow::array::{Int64Array, StringArray};

    use super::*;

    /// Fixed-width values land at their positions, from sliced arrays too; rows without a
    /// position are dropped; a column with NULLs or of variable width is left to `interleave`.
    #[test]
    fn fixed_width_scatter_writes_each_value_at_its_position() {
        let a: ArrayRef = Arc::new(Int64Array::from_iter_values(0..10).slice(3, 5));
        let b: ArrayRef = Arc::new(Int64Array::from_iter_values(100..104));
        let dest = [4, NO_POSITION, 0, 2, 6, 1, NO_POSITION, 3, 5];
        let out = scatter_fixed_width(&[a.as_ref(), b.as_ref()], &dest, 7).expect("fixed width");
        let expected: ArrayRef = Arc::new(Int64Array::from(vec![5, 100, 6, 102, 3, 103, 7]));
        assert_eq!(&out, &expected);
        let nulls: ArrayRef = Arc::new(Int64Array::from(vec![Some(1), None]));
        assert!(scatter_fixed_width(&[nulls.as_ref()], &[0, 1], 2).is_none());
        let strings: ArrayRef = Arc::new(StringArray::from(vec!["x", "y"]));
        assert!(scatter_fixed_width(&[strings.as_ref()], &[1, 0], 2).is_none());
    }

    /// Every slot falls in exactly one range, that range's slots hold it, and every range is
    /// owned by exactly one output partition, also with fewer ranges than partitions.
    #[test]
    fn ranges_cover_every_slot_once() {
        for (n, partitions) in [
            (0, 1),
            (1, 16),
            (10, 16),
            (6000, 2),
            (100_000, 3),
            (3_000_000, 16),
            (1 << 20, 2),
        ] {
            let ranges = SlotRanges::new(n, partitions);
            let mut owner = vec![usize::MAX; ranges.len()];
            for p in 0..partitions {
                for r in ranges.of_partition(p) {
                    assert_eq!(owner[r], usize::MAX, "range {r} owned twice (n {n}, P {partitions})");
                    owner[r] = p;
                }
            }
            assert!(
                owner.iter().all(|&p| p != usize::MAX),
                "a range without owner (n {n}, P {partitions})"
            );
            let mut next = 0;
            for r in 0..ranges.len() {
                let slots = ranges.slots(r);
                assert_eq!(slots.start, next, "n {n}, P {partitions}");
                assert!(slots.len() <= MAX_RANGE_SLOTS);
                for s in [slots.start, slots.end.saturating_sub(1)] {
                    if slots.contains(&s) {
                        assert_eq!(ranges.of(s as u64), r);
                    }
                }
                next = slots.end;
            }
            assert_eq!(next, n);
            if n >= partitions * RANGES_PER_PARTITION {
                assert!(
                    ranges.len() >= partitions * RANGES_PER_PARTITION,
                    "n {n}, P {partitions}"
                );
            }
        }
    }
}
