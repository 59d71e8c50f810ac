//! `ReadAhead`: a probe partition reads its first batches while the shared build side is
//! still being collected, instead of waiting idle for it.
//!
//! Why: in the collect form one build side serves every probe partition, and it is read in a
//! task of its own by as many tasks as the build input has partitions. A build input of few
//! partitions (a Parquet file of four row groups) keeps four cores busy while the other
//! probe partitions wait for it with nothing to do; only then do they start reading their own
//! input. DataFusion's partitioned hash join does not wait so: its repartitions read both sides
//! at once. Here each probe partition reads batches from its input while the build is not
//! ready, and hands them to the join afterwards, in their order, before the rest.
//!
//! Only the reading moves: no batch is probed before the build side exists, so results and
//! their order are those of a partition that waited.
//!
//! # Invariants
//! - At most [`READ_AHEAD_BYTES`] of batches per partition (by `get_array_memory_size`) are
//!   held, reserved in the memory pool; reading ahead stops, without an error, as soon as the
//!   pool refuses more, and each held batch's share is released when the join takes it.
//! - The build future is polled first, so a ready build is never delayed by a read.
//! - A probe input that ends or fails while read ahead is not polled again: the held batches
//!   and that error, if any, are handed on, then the stream ends.
//! - Only the collect form reads ahead ([`MphfJoinExec::read_ahead_for`](super::MphfJoinExec)):
//!   a `Partitioned` join builds inside the partition's own task, where reading the probe
//!   input meanwhile would only interleave the two reads on one core.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::common::Result;
use ::datafusion::execution::memory_pool::MemoryReservation;
use ::datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use ::datafusion::physical_plan::metrics::Count;
use futures::future::{self, BoxFuture, Either};
use futures::{Stream, StreamExt};

/// The most bytes of probe batches one partition holds while it waits for the build side (with
/// 16 partitions at most 512 MiB, all of it reserved in the memory pool).
pub const READ_AHEAD_BYTES: usize = 32 << 20;

/// One probe partition's reading ahead: how much it may hold, its reservation, and the rows
/// it read ahead (`probe_rows_read_ahead`).
pub struct ReadAhead {
    /// Bytes of batches it may hold; 0: it waits for the build without reading.
    limit: usize,
    /// The held batches' memory.
    reservation: MemoryReservation,
    /// Rows read ahead.
    rows: Count,
}

impl ReadAhead {
    /// Reading ahead up to `limit` bytes, held in `reservation`, counted in `rows`.
    pub fn new(limit: usize, reservation: MemoryReservation, rows: Count) -> Self {
        Self {
            limit,
            reservation,
            rows,
        }
    }

    /// Awaits `build` while reading `probe` ahead (see the module docs); returns the build's
    /// output and the probe input, the batches read ahead first.
    pub async fn await_build<T>(
        self,
        mut build: BoxFuture<'static, T>,
        mut probe: SendableRecordBatchStream,
    ) -> (T, SendableRecordBatchStream) {
        let mut held = VecDeque::new();
        let mut reading = self.limit > 0;
        let mut ended = false;
        let built = loop {
            if !reading {
                break build.await;
            }
            match future::select(&mut build, probe.next()).await {
                Either::Left((built, _)) => break built,
                Either::Right((None, _)) => (reading, ended) = (false, true),
                Either::Right((Some(Err(e)), _)) => {
                    held.push_back((Err(e), 0));
                    (reading, ended) = (false, true);
                }
                Either::Right((Some(Ok(batch)), _)) => {
                    self.rows.add(batch.num_rows());
                    let bytes = batch.get_array_memory_size();
                    match self.reservation.try_grow(bytes) {
                        Ok(()) => {
                            held.push_back((Ok(batch), bytes));
                            reading = self.reservation.size() < self.limit;
                        }
                        Err(_) => {
                            held.push_back((Ok(batch), 0));
                            reading = false;
                        }
                    }
                }
            }
        };
        let schema = probe.schema();
        let rest = HeldThenRest {
            schema,
            held,
            rest: (!ended).then_some(probe),
            reservation: self.reservation,
        };
        (built, Box::pin(rest))
    }
}

/// The batches read ahead, then the rest of the probe input (none if it ended while read).
struct HeldThenRest {
    schema: SchemaRef,
    /// Each held batch (or the error that ended the input) with the bytes reserved for it.
    held: VecDeque<(Result<RecordBatch>, usize)>,
    rest: Option<SendableRecordBatchStream>,
    reservation: MemoryReservation,
}

impl Stream for HeldThenRest {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some((batch, bytes)) = this.held.pop_front() {
            this.reservation.shrink(bytes);
            return Poll::Ready(Some(batch));
        }
        match this.rest.as_mut() {
            Some(rest) => rest.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

impl RecordBatchStream for HeldThenRest {
    fn schema(&self) -> SchemaRef {
        std::sync::Arc::clone(&self.schema)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use ::datafusion::arrow::array::{Array, Int64Array};
    use ::datafusion::arrow::datatypes::{DataType, Field, Schema};
    use ::datafusion::common::DataFusionError;
    use ::datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
    use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::FutureExt;

    use super::*;

    /// The one-column schema of every test batch.
    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]))
    }

    fn batch(schema: &SchemaRef, first: i64) -> RecordBatch {
        let values = Int64Array::from_iter_values(first..first + 100);
        RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(values)]).unwrap()
    }

    /// A probe input of `items` that counts the items it has handed out in `handed`, and that
    /// yields an error if polled again after it ended.
    fn probe(
        schema: &SchemaRef,
        items: Vec<Result<RecordBatch>>,
        handed: Arc<AtomicUsize>,
    ) -> SendableRecordBatchStream {
        let mut items = items.into_iter();
        let mut ended = false;
        let stream = futures::stream::poll_fn(move |_| {
            if ended {
                return Poll::Ready(Some(Err(DataFusionError::Internal("polled after its end".into()))));
            }
            let item = items.next();
            match item {
                Some(_) => handed.fetch_add(1, Ordering::SeqCst),
                None => {
                    ended = true;
                    0
                }
            };
            Poll::Ready(item)
        });
        Box::pin(RecordBatchStreamAdapter::new(Arc::clone(schema), stream))
    }

    /// A build that is ready once `handed` reaches `after`, or after `polls` polls; it wakes
    /// itself while not ready, so that awaiting it alone never hangs.
    fn build(handed: Arc<AtomicUsize>, after: usize, polls: usize) -> BoxFuture<'static, &'static str> {
        let mut polled = 0;
        future::poll_fn(move |cx| {
            polled += 1;
            if handed.load(Ordering::SeqCst) >= after || polled > polls {
                Poll::Ready("built")
            } else {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .boxed()
    }

    struct Run {
        out: Vec<Result<RecordBatch>>,
        read_ahead_rows: usize,
        handed_before_build: usize,
        pool: Arc<dyn MemoryPool>,
    }

    async fn run(items: Vec<Result<RecordBatch>>, limit: usize, pool_bytes: usize, after: usize, polls: usize) -> Run {
        let schema = schema();
        let handed = Arc::new(AtomicUsize::new(0));
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(pool_bytes));
        let rows = Count::new();
        let ahead = ReadAhead::new(limit, MemoryConsumer::new("test").register(&pool), rows.clone());
        let probe = probe(&schema, items, Arc::clone(&handed));
        let (built, rest) = ahead.await_build(build(Arc::clone(&handed), after, polls), probe).await;
        assert_eq!(built, "built");
        let handed_before_build = handed.load(Ordering::SeqCst);
        let out = rest.collect().await;
        Run {
            out,
            read_ahead_rows: rows.value(),
            handed_before_build,
            pool,
        }
    }

    fn firsts(out: &[Result<RecordBatch>]) -> Vec<i64> {
        out.iter()
            .map(|b| {
                let b = b.as_ref().unwrap();
                b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().value(0)
            })
            .collect()
    }

    fn batches(count: i64) -> Vec<Result<RecordBatch>> {
        let schema = schema();
        (0..count).map(|i| Ok(batch(&schema, i * 100))).collect()
    }

    #[tokio::test]
    async fn reads_until_the_build_is_ready_and_hands_everything_on_in_order() {
        let run = run(batches(10), READ_AHEAD_BYTES, usize::MAX, 3, usize::MAX).await;
        assert_eq!(run.handed_before_build, 3);
        assert_eq!(run.read_ahead_rows, 300);
        assert_eq!(firsts(&run.out), (0..10).map(|i| i * 100).collect::<Vec<_>>());
        assert_eq!(run.pool.reserved(), 0, "every held batch's bytes are released");
    }

    #[tokio::test]
    async fn stops_reading_at_its_limit() {
        let run = run(batches(10), 1, usize::MAX, usize::MAX, 20).await;
        assert_eq!(run.handed_before_build, 1);
        assert_eq!(run.read_ahead_rows, 100);
        assert_eq!(firsts(&run.out).len(), 10);
    }

    #[tokio::test]
    async fn a_limit_of_zero_waits_without_reading() {
        let run = run(batches(10), 0, usize::MAX, usize::MAX, 20).await;
        assert_eq!(run.handed_before_build, 0);
        assert_eq!(run.read_ahead_rows, 0);
        assert_eq!(firsts(&run.out).len(), 10);
    }

    #[tokio::test]
    async fn stops_reading_when_the_pool_refuses_more() {
        let one = batch(&schema(), 0);
        let pool_bytes = one.get_array_memory_size() * 2 + 1;
        let run = run(batches(10), READ_AHEAD_BYTES, pool_bytes, usize::MAX, 20).await;
        assert_eq!(
            run.handed_before_build, 3,
            "two batches fit, the third is kept unreserved"
        );
        assert_eq!(firsts(&run.out).len(), 10);
        assert_eq!(run.pool.reserved(), 0);
    }

    #[tokio::test]
    async fn an_input_that_ends_while_read_ahead_is_not_polled_again() {
        let run = run(batches(2), READ_AHEAD_BYTES, usize::MAX, usize::MAX, 20).await;
        assert_eq!(run.handed_before_build, 2);
        assert!(
            run.out.iter().all(|b| b.is_ok()),
            "{:?}",
            run.out.iter().find(|b| b.is_err())
        );
        assert_eq!(firsts(&run.out), vec![0, 100]);
    }

    #[tokio::test]
    async fn an_error_read_ahead_is_handed_on_and_ends_the_input() {
        let mut items = batches(1);
        items.push(Err(DataFusionError::Execution("disk gone".into())));
        items.extend(batches(3));
        let run = run(items, READ_AHEAD_BYTES, usize::MAX, usize::MAX, 20).await;
        assert_eq!(run.out.len(), 2);
        assert!(run.out[0].is_ok());
        let error = run.out[1].as_ref().unwrap_err().to_string();
        assert!(error.contains("disk gone"), "{error}");
    }
}
