//! [`SlotGroups`]: the accumulation state of one input partition, with MPHF slots as group
//! indices. Shared by the per-partition stream and the slot-range merge.
//!
//! Group indices are compact: the first row of slot `s` gives it the next free group id, kept in
//! `group_of_slot[s]` (a direct-addressed array, no hashing), so the accumulators grow with the
//! slots this partition touches, not with the index (16 partitions over a clustered key each
//! touch a sixteenth). A key that is NULL or absent from the index gets a group through a
//! row-format hash map (every distinct key value forms exactly one group, so results equal
//! vanilla DataFusion's even for a stale index). Emission orders the groups by slot, fallback
//! groups last.

use std::collections::HashMap;
use std::sync::Arc;

use ::datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use ::datafusion::arrow::compute::{cast, concat, take};
use ::datafusion::arrow::datatypes::{DataType, SchemaRef};
use ::datafusion::arrow::row::{RowConverter, SortField};
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::execution::memory_pool::MemoryReservation;
use ::datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use ::datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use ::datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};
use ::datafusion::physical_plan::aggregates::AggregateExec;
use ::datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};

use super::{FALLBACK_ROWS_METRIC_NAME, SLOTS_TOUCHED_METRIC_NAME};
use crate::core::bits::prefetch;
use crate::core::column::ABSENT;
use crate::datafusion::registry::IndexHandle;

/// `group_of_slot` value of a slot that has no group yet.
const NO_GROUP: u32 = u32::MAX;
/// Rows ahead whose `group_of_slot` entry is prefetched (a few distinct keys on clustered input).
const GROUP_PREFETCH: usize = 16;

/// A `GroupsAccumulator` for `expr`: its own, or the row-accumulator adapter.
pub(super) fn groups_accumulator(expr: &Arc<AggregateFunctionExpr>) -> Result<Box<dyn GroupsAccumulator>> {
    if expr.groups_accumulator_supported() {
        expr.create_groups_accumulator()
    } else {
        let captured = Arc::clone(expr);
        Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
            captured.create_accumulator()
        })))
    }
}

/// The operator's metrics of one partition.
#[derive(Clone)]
pub(super) struct SlotMetrics {
    pub input_rows: Count,
    pub slots_touched: Count,
    pub fallback_rows: Count,
    pub lookup_time: Time,
    pub aggregation_time: Time,
    pub emitting_time: Time,
}

impl SlotMetrics {
    pub(super) fn new(metrics: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            input_rows: MetricBuilder::new(metrics).counter("input_rows", partition),
            slots_touched: MetricBuilder::new(metrics).counter(SLOTS_TOUCHED_METRIC_NAME, partition),
            fallback_rows: MetricBuilder::new(metrics).counter(FALLBACK_ROWS_METRIC_NAME, partition),
            lookup_time: MetricBuilder::new(metrics).subset_time("time_calculating_group_ids", partition),
            aggregation_time: MetricBuilder::new(metrics).subset_time("aggregation_time", partition),
            emitting_time: MetricBuilder::new(metrics).subset_time("emitting_time", partition),
        }
    }
}

/// The partial aggregation of one input partition, for the slot-range merge: the touched slots
/// in ascending order with their accumulator states, then the fallback groups.
pub(super) struct PartialSlots {
    /// Touched slots, ascending.
    pub slots: Vec<usize>,
    /// State columns of all aggregates (in aggregate order), one row per touched slot.
    pub states: Vec<ArrayRef>,
    /// Keys of the fallback groups (NULL or not in the index).
    pub fallback_keys: Option<ArrayRef>,
    /// State columns, one row per fallback group.
    pub fallback_states: Vec<ArrayRef>,
    /// The memory-pool reservation of these states (freed with them).
    pub _reservation: Option<MemoryReservation>,
}

/// Accumulators indexed by slot, plus the fallback groups (see the module docs).
pub(super) struct SlotGroups {
    key_expr: Arc<dyn PhysicalExpr>,
    index: Arc<IndexHandle>,
    /// Argument expressions of each aggregate.
    args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    accs: Vec<Box<dyn GroupsAccumulator>>,
    n_slots: usize,
    /// Group of slot `s`, or `NO_GROUP` (allocated on the first row).
    group_of_slot: Vec<u32>,
    /// What each group is: a slot (`< n_slots`), or `n_slots + k` for the `k`-th fallback key.
    origin: Vec<usize>,
    /// Row-format key -> fallback group number.
    fallback: HashMap<Box<[u8]>, usize>,
    /// Fallback keys in group order (row format).
    fallback_keys: Vec<Box<[u8]>>,
    converter: RowConverter,
    /// True once at least one row was accumulated.
    seen_rows: bool,
    slots: Vec<u64>,
    groups: Vec<usize>,
    metrics: SlotMetrics,
}

impl SlotGroups {
    /// Accumulators for the aggregates of `agg`, grouped by the slots of `index`.
    pub(super) fn try_new(agg: &AggregateExec, index: Arc<IndexHandle>, metrics: SlotMetrics) -> Result<Self> {
        let key_expr = Arc::clone(&agg.group_expr().expr()[0].0);
        let key_type = key_expr.data_type(&agg.input_schema())?;
        let accs = agg
            .aggr_expr()
            .iter()
            .map(groups_accumulator)
            .collect::<Result<Vec<_>>>()?;
        let n_slots = usize::try_from(index.index().len())
            .map_err(|_| DataFusionError::Execution("MPHF index too large for this platform".into()))?;
        Ok(Self {
            key_expr,
            index,
            args: agg.aggr_expr().iter().map(|a| a.expressions()).collect(),
            accs,
            n_slots,
            group_of_slot: Vec::new(),
            origin: Vec::new(),
            fallback: HashMap::new(),
            fallback_keys: Vec::new(),
            converter: RowConverter::new(vec![SortField::new(key_type)])?,
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
            + self.origin.capacity() * 8
            + self.fallback_keys.iter().map(|k| 2 * k.len() + 48).sum::<usize>()
            + self.slots.capacity() * 8
            + self.groups.capacity() * 8
    }

    /// Accumulates one input batch: slot lookup (batched, verified), then `update_batch`.
    pub(super) fn accumulate(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        self.metrics.input_rows.add(rows);
        if self.group_of_slot.is_empty() {
            self.group_of_slot = vec![NO_GROUP; self.n_slots];
        }
        {
            let _timer = self.metrics.lookup_time.timer();
            let key = self.key_expr.evaluate(batch)?.into_array(rows)?;
            self.index
                .index()
                .lookup_slots(key.as_ref(), &mut self.slots)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            if self.slots.len() != rows {
                return Err(DataFusionError::Internal(format!(
                    "MPHF lookup returned {} slots for {rows} rows",
                    self.slots.len()
                )));
            }
            self.groups.clear();
            self.groups.reserve(rows);
            let mut key_rows = None;
            for (i, &slot) in self.slots.iter().enumerate() {
                // Slots are random: start the cache miss of a row some distinct keys ahead.
                if let Some(&ahead) = self.slots.get(i + GROUP_PREFETCH) {
                    if ahead != ABSENT {
                        prefetch(self.group_of_slot.as_ptr().wrapping_add(ahead as usize));
                    }
                }
                if slot != ABSENT {
                    let s = slot as usize;
                    let mut g = self.group_of_slot[s];
                    if g == NO_GROUP {
                        g = self.origin.len() as u32;
                        self.group_of_slot[s] = g;
                        self.origin.push(s);
                    }
                    self.groups.push(g as usize);
                } else {
                    let converted = match &key_rows {
                        Some(r) => r,
                        None => key_rows.insert(self.converter.convert_columns(&[Arc::clone(&key)])?),
                    };
                    let bytes = converted.row(i);
                    let bytes: &[u8] = bytes.as_ref();
                    let group = match self.fallback.get(bytes) {
                        Some(&g) => g,
                        None => {
                            let g = self.origin.len();
                            let owned: Box<[u8]> = bytes.into();
                            self.fallback.insert(owned.clone(), g);
                            self.origin.push(self.n_slots + self.fallback_keys.len());
                            self.fallback_keys.push(owned);
                            g
                        }
                    };
                    self.metrics.fallback_rows.add(1);
                    self.groups.push(group);
                }
            }
        }
        if self.origin.len() > u32::MAX as usize - 1 {
            return Err(DataFusionError::ResourcesExhausted(
                "MphfAggregateExec: more than 2^32 - 1 groups in one partition".into(),
            ));
        }
        let total = self.origin.len();
        let _timer = self.metrics.aggregation_time.timer();
        for (acc, exprs) in self.accs.iter_mut().zip(&self.args) {
            let values = exprs
                .iter()
                .map(|e| e.evaluate(batch)?.into_array(rows))
                .collect::<Result<Vec<ArrayRef>>>()?;
            acc.update_batch(&values, &self.groups, None, total)?;
        }
        self.seen_rows = true;
        Ok(())
    }

    /// The fallback keys as one array of `key_type`.
    fn fallback_key_array(&self, key_type: &DataType) -> Result<Option<ArrayRef>> {
        if self.fallback_keys.is_empty() {
            return Ok(None);
        }
        let parser = self.converter.parser();
        let rows = self.fallback_keys.iter().map(|k| parser.parse(k));
        let keys = self.converter.convert_rows(rows)?.remove(0);
        Ok(Some(cast_to(keys, key_type)?))
    }

    /// Group ids ordered by slot, fallback groups last (in their order of appearance), and how
    /// many of them are slots. A scan of `group_of_slot` lists the slot groups already sorted.
    fn emission_order(&self) -> (UInt32Array, usize) {
        let mut order: Vec<u32> = Vec::with_capacity(self.origin.len());
        order.extend(self.group_of_slot.iter().copied().filter(|&g| g != NO_GROUP));
        let n_touched = order.len();
        order.extend((0..self.origin.len() as u32).filter(|&g| self.origin[g as usize] >= self.n_slots));
        (UInt32Array::from(order), n_touched)
    }

    /// The single result batch: touched slots in slot order, then fallback groups; final values
    /// when `final_output`, else partial states.
    pub(super) fn emit(&mut self, schema: &SchemaRef, final_output: bool) -> Result<RecordBatch> {
        let _timer = self.metrics.emitting_time.timer();
        if !self.seen_rows {
            return Ok(RecordBatch::new_empty(Arc::clone(schema)));
        }
        let (order, n_touched) = self.emission_order();
        self.metrics.slots_touched.add(n_touched);
        let slots = UInt64Array::from_iter_values(
            order.values()[..n_touched]
                .iter()
                .map(|&g| self.origin[g as usize] as u64),
        );
        let key_type = schema.field(0).data_type();
        let mut key = cast_to(take(self.index.index().keys().as_ref(), &slots, None)?, key_type)?;
        if let Some(fb) = self.fallback_key_array(key_type)? {
            key = concat(&[key.as_ref(), fb.as_ref()])?;
        }
        let mut columns = vec![key];
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
        self.origin.clear();
        self.group_of_slot = Vec::new();
        // Columns may differ from the schema only in nullability flags / metadata of state fields.
        Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
    }

    /// The partial states for the slot-range merge (see [`PartialSlots`]).
    pub(super) fn into_partial(mut self, key_type: &DataType) -> Result<PartialSlots> {
        let _timer = self.metrics.emitting_time.timer();
        if !self.seen_rows {
            return Ok(PartialSlots {
                slots: Vec::new(),
                states: Vec::new(),
                fallback_keys: None,
                fallback_states: Vec::new(),
                _reservation: None,
            });
        }
        let (order, n_touched) = self.emission_order();
        let slots: Vec<usize> = order.values()[..n_touched]
            .iter()
            .map(|&g| self.origin[g as usize])
            .collect();
        let slot_order = order.slice(0, n_touched);
        let fallback_order = order.slice(n_touched, order.len() - n_touched);
        let fallback_keys = self.fallback_key_array(key_type)?;
        let mut states = Vec::new();
        let mut fallback_states = Vec::new();
        for acc in &mut self.accs {
            for state in acc.state(EmitTo::All)? {
                states.push(take(state.as_ref(), &slot_order, None)?);
                fallback_states.push(take(state.as_ref(), &fallback_order, None)?);
            }
        }
        Ok(PartialSlots {
            slots,
            states,
            fallback_keys,
            fallback_states,
            _reservation: None,
        })
    }
}

/// `array` cast to `to` when its type differs (the key column may be a view or dictionary type).
pub(super) fn cast_to(array: ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        Ok(array)
    } else {
        Ok(cast(&array, to)?)
    }
}
