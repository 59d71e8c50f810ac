//! [`SlotGroups`]: the accumulation state of one input partition, with MPHF slots as group
//! indices. Shared by the per-partition stream and the slot-range merge.
//!
//! Group indices are compact: the first row of slot `s` gives it the next free group id, kept in
//! `group_of_slot[s]` (a direct-addressed array, no hashing), so the accumulators grow with the
//! slots this partition touches, not with the index (16 partitions over a clustered key each
//! touch a sixteenth). A key that is NULL or absent from the index gets a group through a
//! row-format hash map (every distinct key value forms exactly one group, so results equal
//! vanilla DataFusion's even for a stale index). With dependent group columns (see
//! [`grouping`](super::grouping)), a row whose dependent values differ from its slot's first row
//! gets a *mismatch* group keyed by (slot, values). Emission orders the groups by slot, mismatch
//! and fallback groups last; the `fallback_rows` metric counts the rows of both.
//!
//! The rows are raw input rows (`update_batch`), or, under a `Final` / `FinalPartitioned`
//! aggregate, partial states whose keys are looked up like raw keys (`merge_batch`).

use std::collections::HashMap;
use std::sync::Arc;

use ::datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt32Array, UInt64Array};
use ::datafusion::arrow::buffer::BooleanBuffer;
use ::datafusion::arrow::compute::{cast, take};
use ::datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::execution::memory_pool::MemoryReservation;
use ::datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use ::datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use ::datafusion::physical_expr::expressions::{Column, Literal};
use ::datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};
use ::datafusion::physical_plan::aggregates::{aggregate_expressions, AggregateExec, AggregateInputMode};
use ::datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};

use super::dep_values::DepValues;
use super::grouping::{ByteRows, Grouping};
use super::slot_states::SlotStates;
use super::{FALLBACK_ROWS_METRIC_NAME, GPU_ROWS_METRIC_NAME, SCAN_SLOT_ROWS_METRIC_NAME, SLOTS_TOUCHED_METRIC_NAME};
use crate::core::bits::prefetch;
use crate::core::column::ABSENT;
use crate::datafusion::compact_views::compact_view_column;
use crate::datafusion::registry::IndexHandle;
use crate::datafusion::slot_scan::scan_slots_of;

/// `group_of_slot` value of a slot that has no group yet.
const NO_GROUP: u32 = u32::MAX;
/// Emission sorts the slot groups instead of scanning `group_of_slot` when there are fewer
/// than 1 per this many slots.
const SORT_GROUPS_BELOW: usize = 16;
/// Rows ahead whose `group_of_slot` entry is prefetched (a few distinct keys on clustered input).
const GROUP_PREFETCH: usize = 16;

/// A `GroupsAccumulator` for `expr`: its own, or the row-accumulator adapter.
pub(crate) fn groups_accumulator(expr: &Arc<AggregateFunctionExpr>) -> Result<Box<dyn GroupsAccumulator>> {
    if expr.groups_accumulator_supported() {
        expr.create_groups_accumulator()
    } else {
        let captured = Arc::clone(expr);
        Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
            captured.create_accumulator()
        })))
    }
}

/// The operator's metrics of one partition (the `gpu_*` ones stay 0 unless a device placement ran).
#[derive(Clone)]
pub(super) struct SlotMetrics {
    pub input_rows: Count,
    pub slots_touched: Count,
    pub fallback_rows: Count,
    /// Rows whose slots came from a slot-map scan (no lookup).
    pub scan_slot_rows: Count,
    pub lookup_time: Time,
    pub aggregation_time: Time,
    pub emitting_time: Time,
    /// Rows aggregated by the GPU placement (0 when it ran on the CPU or fell back).
    pub gpu_rows: Count,
    /// GPU placement: evaluating the input columns on the host.
    pub gpu_prepare_time: Time,
    /// GPU placement: copies, lookup and aggregation kernels, results back.
    pub gpu_device_time: Time,
    /// GPU placement: turning the per-slot results into accumulator states.
    pub gpu_states_time: Time,
}

impl SlotMetrics {
    /// Adds a GPU run's rows and phase times.
    pub(super) fn record_gpu(&self, part: &SlotStates) {
        self.input_rows.add(part.rows);
        self.gpu_rows.add(part.rows);
        self.gpu_prepare_time.add_duration(part.timings[0]);
        self.gpu_device_time.add_duration(part.timings[1]);
        self.gpu_states_time.add_duration(part.timings[2]);
    }

    pub(super) fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            input_rows: MetricBuilder::new(metrics).counter("input_rows", partition),
            slots_touched: MetricBuilder::new(metrics).counter(SLOTS_TOUCHED_METRIC_NAME, partition),
            fallback_rows: MetricBuilder::new(metrics).counter(FALLBACK_ROWS_METRIC_NAME, partition),
            scan_slot_rows: MetricBuilder::new(metrics).counter(SCAN_SLOT_ROWS_METRIC_NAME, partition),
            lookup_time: MetricBuilder::new(metrics).subset_time("time_calculating_group_ids", partition),
            aggregation_time: MetricBuilder::new(metrics).subset_time("aggregation_time", partition),
            emitting_time: MetricBuilder::new(metrics).subset_time("emitting_time", partition),
            gpu_rows: MetricBuilder::new(metrics).counter(GPU_ROWS_METRIC_NAME, partition),
            gpu_prepare_time: MetricBuilder::new(metrics).subset_time("gpu_prepare_time", partition),
            gpu_device_time: MetricBuilder::new(metrics).subset_time("gpu_device_time", partition),
            gpu_states_time: MetricBuilder::new(metrics).subset_time("gpu_states_time", partition),
        }
    }
}

/// The partial aggregation of one input partition, for the slot-range merge.
///
/// *Member* groups (key in the index) come first: the touched slots in ascending order
/// (`slots[..n_touched]`), then the *mismatch* groups (a slot whose dependent values differed
/// from the ones it saw first, see [`grouping`](super::grouping)); then the fallback groups.
pub(super) struct PartialSlots {
    /// Slot of each member group: ascending for the first `n_touched`, then the mismatches.
    pub slots: Vec<usize>,
    /// How many of `slots` are the canonical (first-seen) group of their slot.
    pub n_touched: usize,
    /// Dependent values (row format) of each member group; empty without dependents.
    pub deps: ByteRows,
    /// State columns of all aggregates (in aggregate order), one row per member group.
    pub states: Vec<ArrayRef>,
    /// Whole group keys (row format) of the fallback groups (NULL or not in the index).
    pub fallback_keys: Vec<Box<[u8]>>,
    /// State columns, one row per fallback group.
    pub fallback_states: Vec<ArrayRef>,
    /// The memory-pool reservation of these states (freed with them).
    pub _reservation: Option<MemoryReservation>,
}

impl PartialSlots {
    fn empty() -> Self {
        Self {
            slots: Vec::new(),
            n_touched: 0,
            deps: ByteRows::default(),
            states: Vec::new(),
            fallback_keys: Vec::new(),
            fallback_states: Vec::new(),
            _reservation: None,
        }
    }

    /// A partial of member groups only, from per-slot states computed on the GPU.
    pub(super) fn from_slot_states(part: SlotStates) -> Self {
        let fallback_states = part.states.iter().map(|a| a.slice(0, 0)).collect();
        Self {
            n_touched: part.slots.len(),
            slots: part.slots,
            deps: ByteRows::default(),
            states: part.states,
            fallback_keys: Vec::new(),
            fallback_states,
            _reservation: None,
        }
    }

    /// Bytes held by the states and group descriptions.
    pub(super) fn size(&self) -> usize {
        self.states
            .iter()
            .chain(&self.fallback_states)
            .map(|a| a.get_array_memory_size())
            .sum::<usize>()
            + self.slots.capacity() * 8
            + self.deps.size()
            + self.fallback_keys.iter().map(|k| k.len() + 16).sum::<usize>()
    }
}

/// What a group is.
#[derive(Clone, Copy)]
enum Origin {
    /// The canonical group of a slot.
    Slot(usize),
    /// A further group of a slot (dependent values differing from the canonical group's).
    Mismatch(usize),
    /// A fallback group (NULL key or key not in the index); the `k`-th one in group order has
    /// the whole key `fallback_keys[k]`.
    Fallback,
}

/// Accumulators indexed by slot, plus the fallback groups (see the module docs).
pub(super) struct SlotGroups {
    grouping: Grouping,
    index: Arc<IndexHandle>,
    /// Argument expressions of each aggregate: raw arguments, or the columns of its partial
    /// states when `merging`.
    args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    /// The input rows are partial states (a `Final` / `FinalPartitioned` aggregate over
    /// partials): merged into the accumulators, not updated.
    merging: bool,
    accs: Vec<Box<dyn GroupsAccumulator>>,
    /// The window of slots this state accumulates: `slot_lo..slot_lo + window`
    /// (the whole index, or one slot range of the range form, see [`ranges`](super::ranges)).
    slot_lo: usize,
    /// Length of the window.
    window: usize,
    /// Group of slot `slot_lo + i` at `i`, or `NO_GROUP` (allocated on the first row). With
    /// `window_offsets`, `i` itself once the slot has a row (the touched marks that emission reads).
    group_of_slot: Vec<u32>,
    /// Group `i` is slot `slot_lo + i` for the whole window (see [`SlotGroups::use_window_offsets`]).
    window_offsets: bool,
    /// With window offsets, whether the accumulators get an all-true filter (see `offsets_filter`).
    offsets_filtered: bool,
    /// What each group is.
    origin: Vec<Origin>,
    /// Dependent values of each group (`None` without dependents).
    deps: Option<DepValues>,
    /// `slot (8 bytes LE) ++ dependent row` -> mismatch group.
    mismatch: HashMap<Box<[u8]>, usize>,
    /// Whole row-format group key -> fallback group number.
    fallback: HashMap<Box<[u8]>, usize>,
    /// Whole row-format group keys of the fallback groups, in group order.
    fallback_keys: Vec<Box<[u8]>>,
    /// True once at least one row was accumulated.
    seen_rows: bool,
    slots: Vec<u64>,
    groups: Vec<usize>,
    metrics: SlotMetrics,
}

impl SlotGroups {
    /// Accumulators for the aggregates of `agg`, grouped by the slots of `index` (the group
    /// expression at `key_pos`); `out_schema` gives the output types of the group columns.
    pub(super) fn try_new(
        agg: &AggregateExec,
        key_pos: usize,
        out_schema: &Schema,
        index: Arc<IndexHandle>,
        metrics: SlotMetrics,
    ) -> Result<Self> {
        let n_slots = usize::try_from(index.index().len())
            .map_err(|_| DataFusionError::Execution("MPHF index too large for this platform".into()))?;
        Self::try_new_window(agg, key_pos, out_schema, index, 0..n_slots, metrics)
    }

    /// Like [`SlotGroups::try_new`], for the rows whose slots lie in `window` alone (the caller
    /// hands [`SlotGroups::accumulate_slots`] only such rows, or rows without a slot).
    pub(super) fn try_new_window(
        agg: &AggregateExec,
        key_pos: usize,
        out_schema: &Schema,
        index: Arc<IndexHandle>,
        window: std::ops::Range<usize>,
        metrics: SlotMetrics,
    ) -> Result<Self> {
        let accs = agg
            .aggr_expr()
            .iter()
            .map(groups_accumulator)
            .collect::<Result<Vec<_>>>()?;
        let n_slots = usize::try_from(index.index().len())
            .map_err(|_| DataFusionError::Execution("MPHF index too large for this platform".into()))?;
        if window.end > n_slots {
            return Err(DataFusionError::Internal(format!(
                "MphfAggregateExec: slot window {window:?} beyond {n_slots} slots"
            )));
        }
        let grouping = Grouping::try_new(agg, key_pos, out_schema, &index)?;
        let deps = grouping
            .dep_converter
            .is_some()
            .then(|| DepValues::new(grouping.dep_types()));
        Ok(Self {
            grouping,
            index,
            args: aggregate_expressions(agg.aggr_expr(), agg.mode(), agg.group_expr().expr().len())?,
            merging: agg.mode().input_mode() == AggregateInputMode::Partial,
            accs,
            slot_lo: window.start,
            window: window.len(),
            group_of_slot: Vec::new(),
            window_offsets: false,
            offsets_filtered: false,
            origin: Vec::new(),
            deps,
            mismatch: HashMap::new(),
            fallback: HashMap::new(),
            fallback_keys: Vec::new(),
            seen_rows: false,
            slots: Vec::new(),
            groups: Vec::new(),
            metrics,
        })
    }

    /// Bytes held (for the memory pool).
    pub(super) fn size(&self) -> usize {
        self.accs.iter().map(|a| a.size()).sum::<usize>()
            + self.group_of_slot.capacity() * 4
            + self.origin.capacity() * 16
            + self.deps.as_ref().map_or(0, DepValues::size)
            + self.mismatch.keys().map(|k| k.len() + 48).sum::<usize>()
            + self.fallback_keys.iter().map(|k| 2 * k.len() + 48).sum::<usize>()
            + self.slots.capacity() * 8
            + self.groups.capacity() * 8
    }

    /// A new group of origin `origin`, its dependent values at row `row` of the batch being
    /// accumulated (`None`: no values, a fallback group or a GPU partial's).
    fn new_group(&mut self, origin: Origin, row: Option<usize>) -> Result<usize> {
        let g = self.origin.len();
        self.origin.push(origin);
        if let Some(deps) = &mut self.deps {
            deps.register(g, row)?;
        }
        Ok(g)
    }

    /// Makes group `i` the canonical group of slot `slot_lo + i` for the whole window, before any
    /// row: a row's group is then its slot's offset, with no table lookup and no branch on a
    /// slot's first row. It pays when most slots of the window get rows, since the accumulators
    /// and the emission scan then cover every slot of the window. Only without dependent group
    /// columns (their values are taken from a slot's first row) and before the first row;
    /// returns whether it took effect. Unless `null_free` (no aggregate argument takes a NULL,
    /// see [`SlotGroups::arguments_free_of_nulls`]), the accumulators then get an all-true
    /// filter with every update (see `offsets_filter`). Per-slot states cannot be merged in.
    pub(super) fn use_window_offsets(&mut self, null_free: bool) -> bool {
        if self.merging || self.deps.is_some() || !self.origin.is_empty() || self.window >= NO_GROUP as usize {
            return false;
        }
        self.origin = (self.slot_lo..self.slot_lo + self.window).map(Origin::Slot).collect();
        self.group_of_slot = vec![NO_GROUP; self.window];
        self.window_offsets = true;
        self.offsets_filtered = !null_free;
        true
    }

    /// True when no aggregate argument takes a NULL over `batches` (of the input's schema):
    /// each is a column without NULLs in them, or a literal that is not NULL. Every group that
    /// gets a row then gets a value, as DataFusion's accumulators assume when no filter is
    /// passed (see `offsets_filter`).
    pub(super) fn arguments_free_of_nulls<'a>(&self, mut batches: impl Iterator<Item = &'a RecordBatch>) -> bool {
        let mut columns = Vec::new();
        for arg in self.args.iter().flatten() {
            if let Some(column) = arg.downcast_ref::<Column>() {
                columns.push(column.index());
            } else if arg.downcast_ref::<Literal>().is_none_or(|l| l.value().is_null()) {
                return false;
            }
        }
        batches.all(|b| {
            columns
                .iter()
                .all(|&c| b.columns().get(c).is_some_and(|a| a.null_count() == 0))
        })
    }

    /// The canonical group of slot `s`, made on the slot's first row (`row`: its position in
    /// the batch, for the dependent values); `None` when `s` lies outside the window.
    #[inline]
    fn slot_group(&mut self, s: usize, row: Option<usize>) -> Result<Option<usize>> {
        let i = s.wrapping_sub(self.slot_lo);
        let Some(entry) = self.group_of_slot.get_mut(i) else {
            return Ok(None);
        };
        if self.window_offsets {
            // Below NO_GROUP: `use_window_offsets` takes windows of fewer slots only.
            *entry = i as u32;
            return Ok(Some(i));
        }
        if *entry != NO_GROUP {
            return Ok(Some(*entry as usize));
        }
        let g = self.new_group(Origin::Slot(s), row)?;
        self.group_of_slot[i] = g as u32;
        Ok(Some(g))
    }

    /// Accumulates one input batch: slot lookup (batched, verified), then `update_batch`.
    pub(super) fn accumulate(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        let key = {
            let lookup_time = self.metrics.lookup_time.clone();
            let _timer = lookup_time.timer();
            let key = self.grouping.key_expr.evaluate(batch)?.into_array(rows)?;
            let mut slots = std::mem::take(&mut self.slots);
            batch_slots(&self.grouping, &self.index, batch, &key, &mut slots, &self.metrics)?;
            self.slots = slots;
            key
        };
        let slots = std::mem::take(&mut self.slots);
        let out = self.accumulate_slots(batch, Some(&key), &slots);
        self.slots = slots;
        out
    }

    /// Accumulates `batch` whose rows have the slots `slots` (`ABSENT`: fallback group), all
    /// inside this state's window; `key` is the batch's key column, read for fallback rows only
    /// (`None`: the batch has none).
    pub(super) fn accumulate_slots(
        &mut self,
        batch: &RecordBatch,
        key: Option<&ArrayRef>,
        slots: &[u64],
    ) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        if slots.len() != rows {
            return Err(DataFusionError::Internal(format!(
                "MPHF lookup returned {} slots for {rows} rows",
                slots.len()
            )));
        }
        self.metrics.input_rows.add(rows);
        if self.group_of_slot.is_empty() {
            self.group_of_slot = vec![NO_GROUP; self.window];
        }
        {
            let lookup_time = self.metrics.lookup_time.clone();
            let _timer = lookup_time.timer();
            let dep_columns = match &self.deps {
                Some(_) => Some(self.grouping.dep_columns(batch)?),
                None => None,
            };
            let mut full_rows = None;
            let mut groups = std::mem::take(&mut self.groups);
            groups.clear();
            groups.reserve(rows);
            let lo = self.slot_lo;
            // With window offsets no group table entry is read, so none is fetched ahead.
            let fetch_ahead = !self.window_offsets;
            for (i, &slot) in slots.iter().enumerate() {
                // Slots are random: start the cache miss of a row some distinct keys ahead.
                if let Some(&ahead) = slots.get(i + GROUP_PREFETCH).filter(|_| fetch_ahead) {
                    if ahead != ABSENT {
                        prefetch(
                            self.group_of_slot
                                .as_ptr()
                                .wrapping_add((ahead as usize).wrapping_sub(lo)),
                        );
                    }
                }
                if slot != ABSENT {
                    let s = slot as usize;
                    let Some(g) = self.slot_group(s, Some(i))? else {
                        return Err(self.outside_window(s));
                    };
                    groups.push(g);
                } else {
                    let converted = match &full_rows {
                        Some(r) => r,
                        None => {
                            let Some(key) = key else {
                                return Err(DataFusionError::Internal(
                                    "MphfAggregateExec: a row without a slot in a slotted batch".into(),
                                ));
                            };
                            full_rows.insert(self.grouping.full_rows(key, batch)?)
                        }
                    };
                    let bytes = converted.row(i).data();
                    let group = match self.fallback.get(bytes) {
                        Some(&g) => g,
                        None => {
                            let owned: Box<[u8]> = bytes.into();
                            let g = self.new_group(Origin::Fallback, None)?;
                            self.fallback.insert(owned.clone(), g);
                            self.fallback_keys.push(owned);
                            g
                        }
                    };
                    self.metrics.fallback_rows.add(1);
                    groups.push(group);
                }
            }
            if let Some(columns) = &dep_columns {
                self.split_mismatches(columns, slots, &mut groups)?;
            }
            self.groups = groups;
        }
        self.update(batch)
    }

    /// Accumulates `batch` whose rows all have slots, `slots`, inside this state's window (a
    /// chunk of the range form, whose slots are u32). With window offsets a row's group is its
    /// slot's offset, marked as touched; otherwise it goes through [`SlotGroups::accumulate_slots`].
    pub(super) fn accumulate_window_slots(&mut self, batch: &RecordBatch, slots: &[u32]) -> Result<()> {
        let rows = batch.num_rows();
        if !self.window_offsets {
            let mut wide = std::mem::take(&mut self.slots);
            wide.clear();
            wide.extend(slots.iter().map(|&s| u64::from(s)));
            let out = self.accumulate_slots(batch, None, &wide);
            self.slots = wide;
            return out;
        }
        if slots.len() != rows {
            return Err(DataFusionError::Internal(format!(
                "MphfAggregateExec: {} slots for {rows} rows",
                slots.len()
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        self.metrics.input_rows.add(rows);
        {
            let lookup_time = self.metrics.lookup_time.clone();
            let _timer = lookup_time.timer();
            let lo = self.slot_lo;
            let mut groups = std::mem::take(&mut self.groups);
            groups.clear();
            groups.reserve(rows);
            for &s in slots {
                let i = (s as usize).wrapping_sub(lo);
                let Some(mark) = self.group_of_slot.get_mut(i) else {
                    return Err(self.outside_window(s as usize));
                };
                // Below NO_GROUP: `use_window_offsets` takes windows of fewer slots only.
                *mark = i as u32;
                groups.push(i);
            }
            self.groups = groups;
        }
        self.update(batch)
    }

    /// With window offsets over arguments that may be NULL, an all-true filter of `rows` rows
    /// for the accumulators; `None` otherwise. Called without a filter, DataFusion's
    /// accumulators take every group below `total_num_groups` as one that has had a value
    /// (their null tracking is skipped while the values have no NULLs), which holds when groups
    /// are numbered in order of appearance. With offsets, groups of the window that have had no
    /// row yet would then count as seen, and a slot whose rows are all NULL would get a value
    /// instead of NULL. Under a filter the accumulators track every group. Without NULL
    /// arguments every group with a row has a value, and the groups without rows are never
    /// emitted, so no filter is needed.
    fn offsets_filter(&self, rows: usize) -> Option<BooleanArray> {
        (self.window_offsets && self.offsets_filtered).then(|| BooleanArray::new(BooleanBuffer::new_set(rows), None))
    }

    /// The error of a row whose slot `s` lies outside this state's window.
    fn outside_window(&self, s: usize) -> DataFusionError {
        DataFusionError::Internal(format!(
            "MphfAggregateExec: slot {s} outside the window {}..{}",
            self.slot_lo,
            self.slot_lo + self.window
        ))
    }

    /// `update_batch` (or `merge_batch` of partial states, when merging) of every aggregate over
    /// `batch`, whose rows' groups are `self.groups`.
    fn update(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if self.origin.len() > u32::MAX as usize - 1 {
            return Err(DataFusionError::ResourcesExhausted(
                "MphfAggregateExec: more than 2^32 - 1 groups in one partition".into(),
            ));
        }
        let total = self.origin.len();
        let _timer = self.metrics.aggregation_time.timer();
        let every_row = self.offsets_filter(rows);
        for (acc, exprs) in self.accs.iter_mut().zip(&self.args) {
            let values = exprs
                .iter()
                .map(|e| e.evaluate(batch)?.into_array(rows))
                .collect::<Result<Vec<ArrayRef>>>()?;
            match self.merging {
                true => acc.merge_batch(&values, &self.groups, total)?,
                false => acc.update_batch(&values, &self.groups, every_row.as_ref(), total)?,
            }
        }
        self.seen_rows = true;
        Ok(())
    }

    /// Merges per-slot states computed elsewhere (the GPU, see [`gpu`](super::gpu)) into the
    /// canonical groups of their slots (`slots` ascending and distinct; no dependent columns).
    pub(super) fn merge_slot_states(&mut self, part: &SlotStates) -> Result<()> {
        if part.slots.is_empty() {
            return Ok(());
        }
        if self.window_offsets {
            // `merge_batch` takes no filter (see `offsets_filter`).
            return Err(DataFusionError::Internal(
                "MphfAggregateExec: per-slot states merged into window offsets".into(),
            ));
        }
        self.metrics.record_gpu(part);
        if self.group_of_slot.is_empty() {
            self.group_of_slot = vec![NO_GROUP; self.window];
        }
        let mut groups = std::mem::take(&mut self.groups);
        groups.clear();
        for &s in &part.slots {
            let Some(g) = self.slot_group(s, None)? else {
                return Err(DataFusionError::Internal(format!("GPU slot {s} out of range")));
            };
            groups.push(g);
        }
        let total = self.origin.len();
        let _timer = self.metrics.aggregation_time.timer();
        let mut col = 0;
        for (acc, &w) in self.accs.iter_mut().zip(&part.widths) {
            acc.merge_batch(&part.states[col..col + w], &groups, total)?;
            col += w;
        }
        self.groups = groups;
        self.seen_rows = true;
        Ok(())
    }

    /// Moves the rows of the current batch (dependent columns `columns`, slots `slots`) whose
    /// dependent values differ from their slot's canonical group to mismatch groups, then
    /// stores the values of the groups the batch created.
    fn split_mismatches(&mut self, columns: &[ArrayRef], slots: &[u64], groups: &mut [usize]) -> Result<()> {
        let Some(deps) = &self.deps else {
            return Ok(());
        };
        let mismatched = deps.mismatched_rows(columns, groups, |i| slots[i] == ABSENT)?;
        if !mismatched.is_empty() {
            let rows = UInt32Array::from_iter_values(mismatched.iter().map(|&i| i as u32));
            let taken = columns
                .iter()
                .map(|c| Ok(take(c.as_ref(), &rows, None)?))
                .collect::<Result<Vec<ArrayRef>>>()?;
            let Some(converted) = self.grouping.dep_rows_of(&taken)? else {
                return Err(DataFusionError::Internal(
                    "MphfAggregateExec: dependent values without dependents".into(),
                ));
            };
            for (k, &i) in mismatched.iter().enumerate() {
                groups[i] = self.mismatch_group(slots[i] as usize, converted.row(k).data(), i)?;
                self.metrics.fallback_rows.add(1);
            }
        }
        match &mut self.deps {
            Some(deps) => deps.store_created(columns),
            None => Ok(()),
        }
    }

    /// The group of row `row` of slot `slot` whose dependent values `dep` (row format) differ
    /// from the slot's canonical group's.
    fn mismatch_group(&mut self, slot: usize, dep: &[u8], row: usize) -> Result<usize> {
        let mut key = Vec::with_capacity(8 + dep.len());
        key.extend_from_slice(&(slot as u64).to_le_bytes());
        key.extend_from_slice(dep);
        if let Some(&g) = self.mismatch.get(key.as_slice()) {
            return Ok(g);
        }
        let g = self.new_group(Origin::Mismatch(slot), Some(row))?;
        self.mismatch.insert(key.into_boxed_slice(), g);
        Ok(g)
    }

    /// Group ids in emission order: canonical slot groups by slot, mismatch groups, fallback
    /// groups (both in order of appearance); and how many are canonical slot groups and member
    /// groups (canonical + mismatch). A scan of `group_of_slot` lists the slot groups sorted;
    /// when they are few against the slots (a selective input), sorting them costs less.
    fn emission_order(&self) -> (UInt32Array, usize, usize) {
        let mut order: Vec<u32> = Vec::with_capacity(self.origin.len());
        if self.origin.len().saturating_mul(SORT_GROUPS_BELOW) < self.window {
            let mut by_slot: Vec<(usize, u32)> = (0..self.origin.len() as u32)
                .filter_map(|g| match self.origin[g as usize] {
                    Origin::Slot(s) => Some((s, g)),
                    _ => None,
                })
                .collect();
            by_slot.sort_unstable();
            order.extend(by_slot.into_iter().map(|(_, g)| g));
        } else {
            order.extend(self.group_of_slot.iter().copied().filter(|&g| g != NO_GROUP));
        }
        let n_touched = order.len();
        order.extend((0..self.origin.len() as u32).filter(|&g| matches!(self.origin[g as usize], Origin::Mismatch(_))));
        let n_members = order.len();
        order.extend((0..self.origin.len() as u32).filter(|&g| matches!(self.origin[g as usize], Origin::Fallback)));
        (UInt32Array::from(order), n_touched, n_members)
    }

    /// Slot of member group `g`.
    fn slot_of(&self, g: u32) -> usize {
        match self.origin[g as usize] {
            Origin::Slot(s) | Origin::Mismatch(s) => s,
            Origin::Fallback => usize::MAX,
        }
    }

    /// The group columns of the member groups `order` (keys from the index, dependents from
    /// their stored rows), in group-expression order.
    fn member_columns(&self, order: &[u32]) -> Result<Vec<ArrayRef>> {
        let slots = UInt64Array::from_iter_values(order.iter().map(|&g| self.slot_of(g) as u64));
        let key = member_keys(&self.grouping, &self.index, slots)?;
        let deps = match &self.deps {
            Some(deps) => deps.gather(order)?,
            None => Vec::new(),
        };
        self.grouping.assemble(key, deps)
    }

    /// The group columns of the fallback groups, in group-expression order.
    fn fallback_columns(&self) -> Result<Option<Vec<ArrayRef>>> {
        if self.fallback_keys.is_empty() {
            return Ok(None);
        }
        let (key, deps) = self.grouping.decode_full(self.fallback_keys.iter().map(|k| &k[..]))?;
        Ok(Some(self.grouping.assemble(key, deps)?))
    }

    /// The single result batch: touched slots in slot order, then mismatch and fallback groups;
    /// final values when `final_output`, else partial states.
    pub(super) fn emit(&mut self, schema: &SchemaRef, final_output: bool) -> Result<RecordBatch> {
        let _timer = self.metrics.emitting_time.timer();
        if !self.seen_rows {
            return Ok(RecordBatch::new_empty(Arc::clone(schema)));
        }
        let (order, n_touched, n_members) = self.emission_order();
        self.metrics.slots_touched.add(n_touched);
        let mut parts = vec![self.member_columns(&order.values()[..n_members])?];
        parts.extend(self.fallback_columns()?);
        let mut columns = Grouping::concat(parts)?;
        for acc in &mut self.accs {
            if final_output {
                columns.push(take(acc.evaluate(EmitTo::All)?.as_ref(), &order, None)?);
            } else {
                for state in acc.state(EmitTo::All)? {
                    columns.push(take(state.as_ref(), &order, None)?);
                }
            }
        }
        self.fallback.clear();
        self.fallback_keys.clear();
        self.mismatch.clear();
        if let Some(deps) = &mut self.deps {
            deps.clear();
        }
        self.origin.clear();
        self.group_of_slot = Vec::new();
        self.window_offsets = false;
        self.offsets_filtered = false;
        // Columns may differ from the schema only in nullability flags / metadata of state fields.
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }

    /// The partial states for the slot-range merge (see [`PartialSlots`]).
    pub(super) fn into_partial(mut self) -> Result<PartialSlots> {
        let _timer = self.metrics.emitting_time.timer();
        if !self.seen_rows {
            return Ok(PartialSlots::empty());
        }
        let (order, n_touched, n_members) = self.emission_order();
        let member_order = order.slice(0, n_members);
        let fallback_order = order.slice(n_members, order.len() - n_members);
        let slots: Vec<usize> = member_order.values().iter().map(|&g| self.slot_of(g)).collect();
        let mut deps = ByteRows::default();
        if let Some(values) = &self.deps {
            let columns = values.gather(member_order.values())?;
            if let Some(rows) = self.grouping.dep_rows_of(&columns)? {
                for row in rows.iter() {
                    deps.push(row.data());
                }
            }
        }
        let mut states = Vec::new();
        let mut fallback_states = Vec::new();
        for acc in &mut self.accs {
            for state in acc.state(EmitTo::All)? {
                states.push(take(state.as_ref(), &member_order, None)?);
                fallback_states.push(take(state.as_ref(), &fallback_order, None)?);
            }
        }
        Ok(PartialSlots {
            slots,
            n_touched,
            deps,
            states,
            fallback_keys: std::mem::take(&mut self.fallback_keys),
            fallback_states,
            _reservation: None,
        })
    }
}

/// The slots of `batch`'s rows (`key` is its evaluated key column) into `out`: handed over by
/// a slot-map scan, read from a key that holds slots, or looked up in the index (verified;
/// `ABSENT` for NULL keys and keys not in the index).
pub(super) fn batch_slots(
    grouping: &Grouping,
    index: &IndexHandle,
    batch: &RecordBatch,
    key: &ArrayRef,
    out: &mut Vec<u64>,
    metrics: &SlotMetrics,
) -> Result<()> {
    let rows = batch.num_rows();
    let from_scan = grouping.scan_slots.is_some_and(|c| scan_slots_of(batch.column(c), out));
    if from_scan {
        metrics.scan_slot_rows.add(rows);
    } else if grouping.key_is_slot {
        let n_slots = usize::try_from(index.index().len()).unwrap_or(usize::MAX);
        slots_of_slot_column(key, n_slots, out)?;
    } else {
        index
            .index()
            .lookup_slots(key.as_ref(), out)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
    }
    if out.len() != rows {
        return Err(DataFusionError::Internal(format!(
            "MPHF lookup returned {} slots for {rows} rows",
            out.len()
        )));
    }
    Ok(())
}

/// The key column of member groups with slots `slots`: the index's keys, or the slots
/// themselves when the key column holds slots.
pub(super) fn member_keys(grouping: &Grouping, index: &IndexHandle, slots: UInt64Array) -> Result<ArrayRef> {
    if grouping.key_is_slot {
        Ok(Arc::new(slots))
    } else {
        // Compacted: the index's keys are one array, and a view column taken from it would hold
        // all of their bytes in every batch emitted.
        Ok(compact_view_column(take(index.index().keys().as_ref(), &slots, None)?))
    }
}

/// The slots of a column that already holds them (`mphf_index`'s output): NULLs, and values
/// outside `0..n_slots` (never produced by the index), become `ABSENT` (fallback groups).
fn slots_of_slot_column(key: &ArrayRef, n_slots: usize, out: &mut Vec<u64>) -> Result<()> {
    let key = cast(key.as_ref(), &DataType::UInt64)?;
    let Some(values) = key.as_any().downcast_ref::<UInt64Array>() else {
        return Err(DataFusionError::Internal("mphf_index slots are not integers".into()));
    };
    out.clear();
    out.extend(values.iter().map(|v| match v {
        Some(s) if (s as usize) < n_slots => s,
        _ => ABSENT,
    }));
    Ok(())
}
