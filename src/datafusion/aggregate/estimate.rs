//! Row-count estimates for the aggregate rule's costing: how many rows reach an aggregate.
//!
//! # Through joins
//! DataFusion estimates an inner join without column statistics from its inputs' row counts
//! (lineitem ⋈ orders at SF 1: 1.5M rows for 6M), which would make the rule's
//! slot-entries-per-row check decline a GROUP BY that wins. When one side's join key is a unique
//! indexed key of its table (see [`lineage`](super::lineage)), every row of the other side
//! matches at most one row, and a fraction `rows(unique side) / slots` of the keys survives the
//! unique side's filters; the estimate is `rows(other side) × min(1, rows(unique side) / slots)`
//! there, DataFusion's estimate elsewhere (scaled through one-child nodes above such a join).
//!
//! # Through filters on in-memory tables
//! Without min/max statistics (an in-memory table has none) DataFusion keeps every row through a
//! range predicate (`o_orderdate < DATE '1995-03-15'`: 1.5M of 1.5M) and assumes 20 % for an
//! equality. A filter straight over a scan of record batches (under the
//! [`MphfRelabelExec`] that names its indexes, if any) instead gets the fraction of rows its
//! predicate keeps on [`SAMPLE_SLICES`] runs of [`SLICE_ROWS`] rows (or fewer in a small table)
//! starting at evenly spaced rows of the table; at least half a row, so a filter
//! is never estimated to keep nothing. Few long runs rather than many short ones, because each
//! evaluation (one per batch a run spans) has a fixed cost however few rows it reads, and that
//! cost is paid at planning time. Without the samples, TPC-H Q3's aggregate input is estimated
//! at every row of its filtered scans, and the rule's slot-entries limit cannot decline it.
//! A predicate that cannot be evaluated on the sample leaves DataFusion's estimate.
//!
//! # Memoization
//! One [`RowEstimator`] serves one optimizer pass: it caches DataFusion's statistics
//! (`StatisticsContext`) and its own estimates by node address, so an estimate costs one walk
//! of the plan however often the rule asks, and reads an in-memory scan's row count off its
//! batches and passes it through exchanges and projections (DataFusion's statistics of such a
//! scan walk every column of every batch). The addresses stay
//! valid because the estimator holds every node it estimated: none is freed while it lives. A
//! wrong estimate only changes the costing, never a result.
//!
//! The MPHF rules of one plan (aggregate, join, explain) run one after another on one thread
//! and ask about the same nodes: the explain rule prices the candidates the other two declined.
//! So while a plan is optimized they share one estimator ([`shared`]; the aggregate rule, the
//! first, starts it with [`plan_starts`], the explain rule, the last, drops it with
//! [`plan_ends`]). An estimate belongs to an immutable node under the plan's fixed settings, so
//! it holds for every rule; outside a plan's optimization each caller gets its own estimator.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use ::datafusion::arrow::array::AsArray;
use ::datafusion::arrow::record_batch::RecordBatch;
use ::datafusion::common::JoinType;
use ::datafusion::datasource::memory::MemorySourceConfig;
use ::datafusion::datasource::source::{DataSource, DataSourceExec};
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::filter::FilterExec;
use ::datafusion::physical_plan::joins::utils::JoinOnRef;
use ::datafusion::physical_plan::joins::{HashJoinExec, SortMergeJoinExec};
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use ::datafusion::physical_plan::ExecutionPlan;

use super::lineage::lineage;
use crate::datafusion::join::MphfJoinExec;
use crate::datafusion::table::MphfRelabelExec;

/// Slices of an in-memory table a filter's predicate is evaluated on.
pub const SAMPLE_SLICES: usize = 4;
/// Rows per sampled slice.
pub const SLICE_ROWS: usize = 2048;

thread_local! {
    /// The estimator of the plan the MPHF rules are optimizing on this thread, if any.
    static PLAN: RefCell<Option<Rc<RowEstimator>>> = const { RefCell::new(None) };
}

/// The estimator for a rule's pass: the one the rules of the plan being optimized on this
/// thread share (see the module docs), else a new one for the caller alone.
pub(crate) fn shared() -> Rc<RowEstimator> {
    PLAN.with_borrow(|plan| plan.clone())
        .unwrap_or_else(|| Rc::new(RowEstimator::new()))
}

/// Starts a plan's optimization on this thread: a new shared estimator, an earlier plan's (one
/// whose optimization stopped before [`plan_ends`]) dropped.
pub(crate) fn plan_starts() {
    let earlier = PLAN.with_borrow_mut(|plan| plan.replace(Rc::new(RowEstimator::new())));
    drop(earlier);
}

/// Ends the plan's optimization on this thread: its estimator is dropped once no rule holds it.
pub(crate) fn plan_ends() {
    let ended = PLAN.with_borrow_mut(Option::take);
    drop(ended);
}

/// Row estimates of the nodes of one plan during its optimization (see the module docs).
pub(crate) struct RowEstimator {
    /// DataFusion's statistics, memoized per node.
    stats: StatisticsContext,
    /// [`RowEstimator::rows`] per node address.
    memo: RefCell<HashMap<usize, Option<f64>>>,
    /// Every plan estimated or whose DataFusion statistics were asked: both caches key by node
    /// address, and a held node is never freed, so no address is reused while the estimator
    /// lives, whatever the pass builds and drops meanwhile (the join rule's candidate forms).
    held: RefCell<Vec<Arc<dyn ExecutionPlan>>>,
}

impl std::fmt::Debug for RowEstimator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RowEstimator({} estimates, {} plans held)",
            self.memo.borrow().len(),
            self.held.borrow().len()
        )
    }
}

impl RowEstimator {
    /// An estimator with empty caches.
    pub(crate) fn new() -> Self {
        Self {
            stats: StatisticsContext::new(),
            memo: RefCell::new(HashMap::new()),
            held: RefCell::new(Vec::new()),
        }
    }

    /// Estimated output rows of `plan`, `None` when nothing is known.
    pub(crate) fn rows(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<f64> {
        let key = Arc::as_ptr(plan) as *const () as usize;
        if let Some(&rows) = self.memo.borrow().get(&key) {
            return rows;
        }
        let rows = self.compute(plan);
        self.held.borrow_mut().push(Arc::clone(plan));
        self.memo.borrow_mut().insert(key, rows);
        rows
    }

    fn compute(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<f64> {
        let joined = if let Some(j) = plan.downcast_ref::<MphfJoinExec>() {
            let j = j.join();
            (*j.join_type() == JoinType::Inner).then(|| self.key_join_rows(j.left(), j.right(), j.on()))
        } else if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
            (*j.join_type() == JoinType::Inner).then(|| self.key_join_rows(j.left(), j.right(), j.on()))
        } else if let Some(j) = plan.downcast_ref::<SortMergeJoinExec>() {
            (j.join_type() == JoinType::Inner).then(|| self.key_join_rows(j.left(), j.right(), j.on()))
        } else {
            None
        };
        if let Some(rows) = joined.flatten() {
            return Some(rows);
        }
        // Nodes that hand on every row: their child's estimate (DataFusion's statistics of an
        // in-memory scan walk all its batches' columns, ~0.3 ms for lineitem at SF 1).
        if passes_every_row(plan) {
            return self.rows(plan.children().first()?);
        }
        if let Some(rows) = memory_scan(plan).and_then(in_memory_rows) {
            return Some(rows as f64);
        }
        if let Some(filter) = plan.downcast_ref::<FilterExec>() {
            if let Some(kept) = sampled_selectivity(filter) {
                return Some(self.rows(filter.input())? * kept);
            }
        }
        let own = self.datafusion_rows(plan);
        // One-child nodes (filters, projections, exchanges): the child's estimate scaled by
        // DataFusion's own ratio between this node and its child.
        if let [child] = plan.children().as_slice() {
            if let (Some(mine), Some(theirs), Some(better)) = (own, self.datafusion_rows(child), self.rows(child)) {
                if theirs > 0.0 {
                    return Some(better * (mine / theirs).min(1.0));
                }
            }
        }
        own
    }

    /// DataFusion's row-count estimate of `plan` (exact or inexact), memoized.
    pub(crate) fn datafusion_rows(&self, plan: &Arc<dyn ExecutionPlan>) -> Option<f64> {
        self.held.borrow_mut().push(Arc::clone(plan));
        let stats = self.stats.compute(plan.as_ref(), &StatisticsArgs::new()).ok()?;
        stats.num_rows.get_value().map(|&r| r as f64)
    }

    /// The estimate of an inner equi-join on a unique indexed key of one side, or `None` when
    /// neither side's key is one.
    fn key_join_rows(
        &self,
        left: &Arc<dyn ExecutionPlan>,
        right: &Arc<dyn ExecutionPlan>,
        on: JoinOnRef,
    ) -> Option<f64> {
        let (l, r) = (lineage(left), lineage(right));
        on.iter().find_map(|(a, b)| {
            let (unique, other, slots) = if let Some(&slots) = l.origin_of(a).and_then(|o| l.unique.get(&o)) {
                (left, right, slots)
            } else {
                let slots = *r.origin_of(b).and_then(|o| r.unique.get(&o))?;
                (right, left, slots)
            };
            let kept = (self.rows(unique)? / (slots.max(1) as f64)).min(1.0);
            Some(self.rows(other)? * kept)
        })
    }
}

/// True for one-child nodes whose output rows are their input rows: exchanges, projections,
/// and the relabeling of indexed columns.
fn passes_every_row(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<RepartitionExec>().is_some()
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<ProjectionExec>().is_some()
        || plan.downcast_ref::<MphfRelabelExec>().is_some()
}

/// The record batches a scan of an in-memory table reads, when `plan` is one.
fn memory_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<&MemorySourceConfig> {
    plan.downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<MemorySourceConfig>()
}

/// Rows of an in-memory scan without a row limit.
fn in_memory_rows(memory: &MemorySourceConfig) -> Option<usize> {
    memory
        .fetch()
        .is_none()
        .then(|| memory.partitions().iter().flatten().map(|b| b.num_rows()).sum())
}

/// The fraction of rows `filter` keeps on a sample of the in-memory table it reads directly,
/// `None` when its input is no such table or the predicate fails on the sample.
fn sampled_selectivity(filter: &FilterExec) -> Option<f64> {
    let mut input = filter.input();
    if input.downcast_ref::<MphfRelabelExec>().is_some() {
        input = input.children().into_iter().next()?;
    }
    let memory = memory_scan(input)?;
    let (mut sampled, mut kept) = (0usize, 0usize);
    for piece in memory_slices(memory, SAMPLE_SLICES, SLICE_ROWS) {
        kept += rows_kept(filter, memory, &piece)?;
        sampled += piece.num_rows();
    }
    (sampled > 0).then(|| (kept as f64).max(0.5) / sampled as f64)
}

/// Up to `slices` runs of at most `rows` rows of an in-memory table (its batches as stored,
/// before the scan's projection), starting at evenly spaced rows; a run that spans batches is
/// returned as one piece per batch.
pub(crate) fn memory_slices(memory: &MemorySourceConfig, slices: usize, rows: usize) -> Vec<RecordBatch> {
    let batches: Vec<&RecordBatch> = memory
        .partitions()
        .iter()
        .flatten()
        .filter(|b| b.num_rows() > 0)
        .collect();
    let total: usize = batches.iter().map(|b| b.num_rows()).sum();
    let slices = slices.min(total);
    let mut pieces = Vec::new();
    let (mut batch, mut batch_start) = (0usize, 0usize);
    for slice in 0..slices {
        // Rows [start, end) of the table, read from as many batches as they span.
        let start = slice * total / slices;
        let end = ((slice + 1) * total / slices).min(start + rows);
        let mut at = start;
        while at < end {
            while batch_start + batches[batch].num_rows() <= at {
                batch_start += batches[batch].num_rows();
                batch += 1;
            }
            let offset = at - batch_start;
            let len = (end - at).min(batches[batch].num_rows() - offset);
            pieces.push(batches[batch].slice(offset, len));
            at += len;
        }
    }
    pieces
}

/// The rows of `piece` (a slice of one of `memory`'s batches) that `filter` keeps.
fn rows_kept(filter: &FilterExec, memory: &MemorySourceConfig, piece: &RecordBatch) -> Option<usize> {
    let piece = match memory.projection() {
        Some(projection) => piece.project(projection).ok()?,
        None => piece.clone(),
    };
    let mask = filter
        .predicate()
        .evaluate(&piece)
        .ok()?
        .into_array(piece.num_rows())
        .ok()?;
    // Valid true values: NULL is not true, the filter drops it.
    Some(mask.as_boolean_opt()?.true_count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datafusion::arrow::array::Int64Array;
    use ::datafusion::arrow::datatypes::{DataType, Field, Schema};
    use ::datafusion::common::ScalarValue;
    use ::datafusion::logical_expr::Operator;
    use ::datafusion::physical_expr::expressions::{binary, col, lit};

    /// A filter `x < bound` over one in-memory partition of `x = 0..rows` in batches of 16 000.
    fn filter_below(rows: i64, bound: i64) -> FilterExec {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)]));
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(16_000)
            .map(|s| {
                let values = Int64Array::from_iter_values(s..(s + 16_000).min(rows));
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(values)]).expect("batch")
            })
            .collect();
        let scan = MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).expect("scan");
        let predicate = binary(
            col("x", &schema).expect("column"),
            Operator::Lt,
            lit(ScalarValue::Int64(Some(bound))),
            &schema,
        )
        .expect("predicate");
        FilterExec::try_new(predicate, scan).expect("filter")
    }

    #[test]
    fn a_range_filter_is_estimated_from_the_sample() {
        // The slices start at 0, 1/4, 2/4 and 3/4 of the table: a bound at 1/4 keeps the first.
        let kept = sampled_selectivity(&filter_below(64_000, 16_000)).expect("sampled");
        assert!((kept - 0.25).abs() < 0.01, "kept {kept}");
        let plan: Arc<dyn ExecutionPlan> = Arc::new(filter_below(64_000, 16_000));
        let rows = RowEstimator::new().rows(&plan).expect("estimate");
        assert!((rows - 16_000.0).abs() < 700.0, "rows {rows}");
    }

    #[test]
    fn a_filter_that_keeps_nothing_in_the_sample_keeps_half_a_row() {
        let kept = sampled_selectivity(&filter_below(64_000, -1)).expect("sampled");
        assert_eq!(kept, 0.5 / (SAMPLE_SLICES * SLICE_ROWS) as f64);
    }

    #[test]
    fn a_filter_over_no_in_memory_table_is_not_sampled() {
        let inner: Arc<dyn ExecutionPlan> = Arc::new(filter_below(1000, 10));
        let outer = FilterExec::try_new(
            Arc::clone(inner.downcast_ref::<FilterExec>().expect("filter").predicate()),
            inner,
        )
        .expect("filter");
        assert_eq!(sampled_selectivity(&outer), None);
    }

    #[test]
    fn a_plans_rules_share_one_estimator_and_the_next_plan_gets_a_new_one() {
        let plan: Arc<dyn ExecutionPlan> = Arc::new(filter_below(64_000, 16_000));
        // Outside a plan's optimization every caller has its own.
        assert!(!Rc::ptr_eq(&shared(), &shared()));
        plan_starts();
        let first = shared();
        let rows = first.rows(&plan);
        let address = Arc::as_ptr(&plan) as *const () as usize;
        assert!(Rc::ptr_eq(&first, &shared()));
        assert!(shared().memo.borrow().contains_key(&address));
        // A plan that never ended is dropped by the next start.
        plan_starts();
        assert!(!Rc::ptr_eq(&first, &shared()));
        assert!(shared().memo.borrow().is_empty());
        assert_eq!(shared().rows(&plan), rows);
        plan_ends();
        assert!(!Rc::ptr_eq(&shared(), &shared()));
        assert_eq!(Rc::strong_count(&first), 1);
    }
}
