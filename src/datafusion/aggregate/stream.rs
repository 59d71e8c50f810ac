//! The per-partition stream of [`MphfAggregateExec`](super::MphfAggregateExec).
//!
//! ```text
//!            batch: lookup slots, update accumulators
//!              +----+
//!              v    |
//!   start -> Reading -+-- input exhausted --> Emitting(batch, offset) -- all sliced --> Done
//! ```
//!
//! Group indices: slot `s` of the index is group `s`; the `k`-th distinct key that is NULL or
//! absent from the index is group `n_slots + k` (row-format hash map, correctness for stale or
//! partial indexes). Memory: the accumulators' `size()` plus the touched bitmap and the fallback
//! map are kept reserved in the memory pool after every batch (`try_resize`: a pool that is too
//! small fails the query with DataFusion's resources-exhausted error).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use ::datafusion::arrow::buffer::BooleanBuffer;
use ::datafusion::arrow::compute::{cast, concat, filter};
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::arrow::row::{RowConverter, SortField};
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::execution::memory_pool::MemoryReservation;
use ::datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use ::datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use ::datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use ::datafusion::physical_expr::{GroupsAccumulatorAdapter, PhysicalExpr};
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::metrics::{BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, Time};
use ::datafusion::physical_plan::ExecutionPlan;
use futures::{Stream, StreamExt};

use super::{FALLBACK_ROWS_METRIC_NAME, SLOTS_TOUCHED_METRIC_NAME};
use crate::core::column::ABSENT;
use crate::datafusion::registry::IndexHandle;

/// Stream state (see the module diagram).
enum State {
    /// Consuming input batches.
    Reading,
    /// Slicing the single result batch into `batch_size` pieces.
    Emitting(RecordBatch, usize),
    /// Finished.
    Done,
}

/// Per-partition MPHF aggregation.
pub(super) struct MphfAggregateStream {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    key_expr: Arc<dyn PhysicalExpr>,
    index: Arc<IndexHandle>,
    /// Argument expressions of each aggregate.
    args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    accs: Vec<Box<dyn GroupsAccumulator>>,
    /// True: emit final values (Single modes); false: emit partial state (Partial).
    final_output: bool,
    n_slots: usize,
    /// `touched[s]`: slot `s` received a row.
    touched: Vec<bool>,
    /// Row-format key -> fallback group number.
    fallback: HashMap<Box<[u8]>, usize>,
    /// Fallback keys in group order (row format).
    fallback_keys: Vec<Box<[u8]>>,
    converter: RowConverter,
    /// True once at least one row was accumulated.
    seen_rows: bool,
    slots: Vec<u64>,
    groups: Vec<usize>,
    batch_size: usize,
    reservation: MemoryReservation,
    state: State,
    baseline: BaselineMetrics,
    input_rows: Count,
    slots_touched: Count,
    fallback_rows: Count,
    lookup_time: Time,
    aggregation_time: Time,
    emitting_time: Time,
}

/// A `GroupsAccumulator` for `expr`: its own, or the row-accumulator adapter.
fn groups_accumulator(expr: &Arc<AggregateFunctionExpr>) -> Result<Box<dyn GroupsAccumulator>> {
    if expr.groups_accumulator_supported() {
        expr.create_groups_accumulator()
    } else {
        let captured = Arc::clone(expr);
        Ok(Box::new(GroupsAccumulatorAdapter::new(move || {
            captured.create_accumulator()
        })))
    }
}

impl MphfAggregateStream {
    pub(super) fn try_new(
        agg: &AggregateExec,
        index: Arc<IndexHandle>,
        input: SendableRecordBatchStream,
        batch_size: usize,
        reservation: MemoryReservation,
        metrics: &ExecutionPlanMetricsSet,
        partition: usize,
    ) -> Result<Self> {
        let key_expr = Arc::clone(&agg.group_expr().expr()[0].0);
        let key_type = key_expr.data_type(&agg.input_schema())?;
        let converter = RowConverter::new(vec![SortField::new(key_type)])?;
        let accs = agg
            .aggr_expr()
            .iter()
            .map(groups_accumulator)
            .collect::<Result<Vec<_>>>()?;
        let args = agg.aggr_expr().iter().map(|a| a.expressions()).collect();
        let final_output = !matches!(agg.mode(), AggregateMode::Partial);
        let n_slots = usize::try_from(index.index().len())
            .map_err(|_| DataFusionError::Execution("MPHF index too large for this platform".into()))?;
        Ok(Self {
            input,
            schema: ExecutionPlan::schema(agg),
            key_expr,
            index,
            args,
            accs,
            final_output,
            n_slots,
            touched: Vec::new(),
            fallback: HashMap::new(),
            fallback_keys: Vec::new(),
            converter,
            seen_rows: false,
            slots: Vec::new(),
            groups: Vec::new(),
            batch_size: batch_size.max(1),
            reservation,
            state: State::Reading,
            baseline: BaselineMetrics::new(metrics, partition),
            input_rows: MetricBuilder::new(metrics).counter("input_rows", partition),
            slots_touched: MetricBuilder::new(metrics).counter(SLOTS_TOUCHED_METRIC_NAME, partition),
            fallback_rows: MetricBuilder::new(metrics).counter(FALLBACK_ROWS_METRIC_NAME, partition),
            lookup_time: MetricBuilder::new(metrics).subset_time("time_calculating_group_ids", partition),
            aggregation_time: MetricBuilder::new(metrics).subset_time("aggregation_time", partition),
            emitting_time: MetricBuilder::new(metrics).subset_time("emitting_time", partition),
        })
    }

    /// Accumulates one input batch.
    fn accumulate(&mut self, batch: &RecordBatch) -> Result<()> {
        let rows = batch.num_rows();
        if rows == 0 {
            return Ok(());
        }
        self.input_rows.add(rows);
        if self.touched.is_empty() {
            self.touched = vec![false; self.n_slots];
        }
        {
            let _timer = self.lookup_time.timer();
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
                if slot != ABSENT {
                    let s = slot as usize;
                    self.touched[s] = true;
                    self.groups.push(s);
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
                            let g = self.fallback_keys.len();
                            let owned: Box<[u8]> = bytes.into();
                            self.fallback.insert(owned.clone(), g);
                            self.fallback_keys.push(owned);
                            g
                        }
                    };
                    self.fallback_rows.add(1);
                    self.groups.push(self.n_slots + group);
                }
            }
        }
        let total = self.n_slots + self.fallback_keys.len();
        {
            let _timer = self.aggregation_time.timer();
            for (acc, exprs) in self.accs.iter_mut().zip(&self.args) {
                let values = exprs
                    .iter()
                    .map(|e| e.evaluate(batch)?.into_array(rows))
                    .collect::<Result<Vec<ArrayRef>>>()?;
                acc.update_batch(&values, &self.groups, None, total)?;
            }
        }
        self.seen_rows = true;
        let bytes = self.accs.iter().map(|a| a.size()).sum::<usize>()
            + self.touched.capacity()
            + self.fallback_keys.iter().map(|k| 2 * k.len() + 48).sum::<usize>()
            + self.slots.capacity() * 8
            + self.groups.capacity() * 8;
        self.reservation.try_resize(bytes)?;
        Ok(())
    }

    /// Builds the single result batch (touched slots in slot order, then fallback groups).
    fn emit(&mut self) -> Result<RecordBatch> {
        let _timer = self.emitting_time.timer();
        if !self.seen_rows {
            return Ok(RecordBatch::new_empty(Arc::clone(&self.schema)));
        }
        let n_fallback = self.fallback_keys.len();
        let mut mask: Vec<bool> = std::mem::take(&mut self.touched);
        self.slots_touched.add(mask.iter().filter(|&&t| t).count());
        let slot_mask = BooleanArray::new(BooleanBuffer::from(mask.as_slice()), None);
        mask.extend(std::iter::repeat_n(true, n_fallback));
        let mask = BooleanArray::new(BooleanBuffer::from(mask), None);

        let key_field = self.schema.field(0);
        let mut key = filter(self.index.index().keys().as_ref(), &slot_mask)?;
        if key.data_type() != key_field.data_type() {
            key = cast(&key, key_field.data_type())?;
        }
        if n_fallback > 0 {
            let parser = self.converter.parser();
            let rows = self.fallback_keys.iter().map(|k| parser.parse(k));
            let fb = self.converter.convert_rows(rows)?.remove(0);
            let fb = if fb.data_type() != key_field.data_type() {
                cast(&fb, key_field.data_type())?
            } else {
                fb
            };
            key = concat(&[key.as_ref(), fb.as_ref()])?;
        }
        let mut columns = vec![key];
        for acc in &mut self.accs {
            if self.final_output {
                columns.push(filter(acc.evaluate(EmitTo::All)?.as_ref(), &mask)?);
            } else {
                for state in acc.state(EmitTo::All)? {
                    columns.push(filter(state.as_ref(), &mask)?);
                }
            }
        }
        // Columns may differ from the schema only in nullability flags / metadata of state fields.
        let batch = RecordBatch::try_new(Arc::clone(&self.schema), columns)?;
        self.fallback.clear();
        self.fallback_keys.clear();
        self.reservation.resize(batch.get_array_memory_size());
        Ok(batch)
    }
}

impl Stream for MphfAggregateStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let batch_size = self.batch_size;
        loop {
            match &mut self.state {
                State::Reading => match self.input.poll_next_unpin(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(Ok(batch))) => {
                        let elapsed = self.baseline.elapsed_compute().clone();
                        let _timer = elapsed.timer();
                        if let Err(e) = self.accumulate(&batch) {
                            self.state = State::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                    Poll::Ready(Some(Err(e))) => {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    Poll::Ready(None) => {
                        let elapsed = self.baseline.elapsed_compute().clone();
                        let _timer = elapsed.timer();
                        match self.emit() {
                            Ok(batch) => self.state = State::Emitting(batch, 0),
                            Err(e) => {
                                self.state = State::Done;
                                return Poll::Ready(Some(Err(e)));
                            }
                        }
                    }
                },
                State::Emitting(batch, offset) => {
                    if *offset >= batch.num_rows() {
                        self.state = State::Done;
                        self.reservation.free();
                        continue;
                    }
                    let len = batch_size.min(batch.num_rows() - *offset);
                    let out = batch.slice(*offset, len);
                    *offset += len;
                    self.baseline.record_output(len);
                    return Poll::Ready(Some(Ok(out)));
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

impl RecordBatchStream for MphfAggregateStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
