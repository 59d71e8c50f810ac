//! The per-partition stream of [`MphfAggregateExec`](super::MphfAggregateExec).
//!
//! ```text
//!            batch: lookup slots, update accumulators
//!              +----+
//!              v    |
//!   start -> Reading -+-- input exhausted --> Emitting(batch, offset) -- all sliced --> Done
//! ```
//!
//! Accumulation is [`SlotGroups`]. On the GPU placement, `Reading` only buffers the batches
//! and the whole partition is aggregated on the device when the input is exhausted. Memory: its size is kept reserved in the memory pool after
//! every batch (`try_resize`: a pool that is too small fails the query with DataFusion's
//! resources-exhausted error).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::common::Result;
use ::datafusion::execution::memory_pool::MemoryReservation;
use ::datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use ::datafusion::physical_plan::aggregates::AggregateMode;
use ::datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use ::datafusion::physical_plan::ExecutionPlan;
use futures::{Stream, StreamExt};

use super::device::DeviceAggregation;
use super::groups::{SlotGroups, SlotMetrics};
use super::MphfAggregateExec;

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
    groups: SlotGroups,
    /// True: emit final values (Single modes); false: emit partial state (Partial).
    final_output: bool,
    batch_size: usize,
    reservation: MemoryReservation,
    state: State,
    baseline: BaselineMetrics,
    /// GPU placement: the aggregation and the input batches buffered for it (it runs once the
    /// input is exhausted).
    device: Option<(Arc<dyn DeviceAggregation>, Vec<RecordBatch>, usize)>,
    index: Arc<crate::datafusion::registry::IndexHandle>,
}

impl MphfAggregateStream {
    /// The stream of `exec`'s partition `partition` over `input`.
    pub(super) fn try_new(
        exec: &MphfAggregateExec,
        input: SendableRecordBatchStream,
        batch_size: usize,
        reservation: MemoryReservation,
        metrics: &ExecutionPlanMetricsSet,
        partition: usize,
    ) -> Result<Self> {
        let agg = exec.aggregate();
        let schema = ExecutionPlan::schema(agg.as_ref());
        let groups = SlotGroups::try_new(
            agg,
            exec.key_pos(),
            &schema,
            Arc::clone(exec.index()),
            SlotMetrics::new(metrics, partition),
        )?;
        Ok(Self {
            input,
            groups,
            schema,
            final_output: !matches!(agg.mode(), AggregateMode::Partial),
            batch_size: batch_size.max(1),
            reservation,
            state: State::Reading,
            baseline: BaselineMetrics::new(metrics, partition),
            device: match exec.placement() {
                super::Placement::Device(d) => Some((Arc::clone(d), Vec::new(), 0)),
                super::Placement::Cpu => None,
            },
            index: Arc::clone(exec.index()),
        })
    }

    /// Accumulates one input batch.
    fn accumulate(&mut self, batch: &RecordBatch) -> Result<()> {
        if let Some((_, buffered, bytes)) = &mut self.device {
            *bytes += batch.get_array_memory_size();
            self.reservation.try_resize(*bytes)?;
            buffered.push(batch.clone());
            return Ok(());
        }
        self.groups.accumulate(batch)?;
        self.reservation.try_resize(self.groups.size())?;
        Ok(())
    }

    /// Builds the single result batch (touched slots in slot order, then fallback groups).
    fn emit(&mut self) -> Result<RecordBatch> {
        if let Some((device, batches, _)) = self.device.take() {
            super::device::aggregate_into(&mut self.groups, device.as_ref(), &self.index, &batches)?;
        }
        let batch = self.groups.emit(&self.schema, self.final_output)?;
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
