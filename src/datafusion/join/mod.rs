//! `MphfJoinExec`: an equi-join whose build side is a slot array instead of a hash table.
//!
//! When the build (left) side's join key is a column with an MPHF index, every build row's key
//! has a slot in `0..distinct`, so "which build rows have key k" is `table[slot(k)]`: no hash
//! table is built and none is probed. Probe keys go through the batched MPHF lookup, which
//! verifies membership against the index's stored keys (a key that is not in the index has no
//! slot and matches nothing, or only the build side's strays, see [`build`]).
//!
//! # Strategy
//! - The node replaces a `HashJoinExec` one for one ([`rule`]): same children, same schema,
//!   output partitioning, input requirements and probe-order guarantees, so nothing around it
//!   changes. Execution follows the replaced join's mode:
//!   - `CollectLeft`: the single build partition is collected once into a [`BuildSide`] shared
//!     by every probe partition (one slot table for the whole join). Meanwhile each probe
//!     partition reads its input ahead ([`read_ahead`]).
//!   - `Partitioned`: each output partition builds from its own build partition (a slot table
//!     per partition; co-partitioning guarantees a probe key meets only its own partition).
//! - The slot table is [`SlotRows::Unique`] (one row per slot) while the key is unique on the
//!   build side — known up front from the index's build counts, and checked as rows arrive —
//!   and [`SlotRows::Multi`] (CSR) otherwise, so duplicates never give wrong answers. A build
//!   side that occupies few of the index's slots (a `Partitioned` join's partition, a filtered
//!   build) indexes its table by position among the occupied slots instead of by slot, so that
//!   no table of every slot is swept per partition (`build`'s module docs).
//! - Other equi-keys are a residual equality check on the candidate pairs, then the join
//!   filter; the join type decides what is emitted ([`probe`]).
//!
//! - A partial aggregate that groups by build-side columns over an inner join is fused with it
//!   ([`group_join`]): the pairs feed the aggregate's accumulators directly.
//!
//! # Invariants
//! - Results equal the replaced `HashJoinExec`'s (tested by `sql-tests/join.slt`, where every
//!   query also runs with `mphf.enable_join = false`).
//! - Output batches hold at most `batch_size` rows; build memory is reserved in the pool.

pub mod build;
mod build_threads;
mod group_count;
pub mod group_join;
pub mod probe;
mod ranked;
mod read_ahead;
pub mod rule;
mod scan_slots;
mod translate;

use std::fmt;
use std::sync::Arc;

use ::datafusion::common::tree_node::TreeNodeRecursion;
use ::datafusion::common::{internal_err, DataFusionError, JoinType, Result, Statistics};
use ::datafusion::execution::memory_pool::MemoryConsumer;
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::execution_plan::ChildrenPropertiesMode;
use ::datafusion::physical_plan::joins::utils::build_join_schema;
use ::datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use ::datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use ::datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, InputDistributionRequirements,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::future::{BoxFuture, FutureExt};
use futures::{StreamExt, TryStreamExt};

pub use build::{BuildSide, SharedBuild, SlotRows};
pub use build_threads::BuildThreads;
pub use group_join::MphfGroupJoinExec;
use probe::{ProbeMetrics, Prober};
use read_ahead::{ReadAhead, READ_AHEAD_BYTES};
pub use rule::MphfJoinRule;

use crate::datafusion::once::OncePerExecution;
use crate::datafusion::plan::cost::{write_suffix, Estimate};
use crate::datafusion::registry::IndexHandle;
use crate::datafusion::slot_scan::scan_slots_position;
use translate::{probe_index, Translator};

type BuildResult = std::result::Result<Arc<BuildSide>, Arc<DataFusionError>>;

/// A hash join executed on MPHF slots (see the module docs).
pub struct MphfJoinExec {
    /// The replaced join: children, keys, filter, type, mode, projection, properties.
    join: Arc<HashJoinExec>,
    /// The index of the build-side key.
    index: Arc<IndexHandle>,
    /// Which pair of `join.on()` is the indexed key.
    key: usize,
    /// Probe slots by translation, when the probe key carries an index with row slots.
    translator: Option<Arc<Translator>>,
    /// The rule's estimates (shown by `EXPLAIN`).
    estimate: Option<Estimate>,
    metrics: ExecutionPlanMetricsSet,
    /// `CollectLeft`: the build side all probe partitions of one execution share.
    shared: OncePerExecution<BuildSide>,
}

impl fmt::Debug for MphfJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MphfJoinExec")
            .field("index", &self.index.info().name)
            .field("join_type", self.join.join_type())
            .finish_non_exhaustive()
    }
}

impl MphfJoinExec {
    /// Wraps `join` (checked by the rule) whose `on[key].0` is indexed by `index`.
    pub fn new(join: Arc<HashJoinExec>, index: Arc<IndexHandle>, key: usize) -> Self {
        let translator = probe_index(&join, key).map(|p| Arc::new(Translator::new(p)));
        Self {
            join,
            index,
            key,
            translator,
            estimate: None,
            metrics: ExecutionPlanMetricsSet::new(),
            shared: OncePerExecution::default(),
        }
    }

    /// The same node with the rule's estimates.
    pub fn with_estimate(mut self, estimate: Option<Estimate>) -> Self {
        self.estimate = estimate;
        self
    }

    /// The rule's estimates.
    pub fn estimate(&self) -> Option<Estimate> {
        self.estimate
    }

    /// Whether the probe key's slots are translated from its own index's row slots.
    pub fn translates(&self) -> bool {
        self.translator.is_some()
    }

    /// The replaced join.
    pub fn join(&self) -> &Arc<HashJoinExec> {
        &self.join
    }

    /// Which pair of the join's `on` is the indexed key.
    pub fn key_pair(&self) -> usize {
        self.key
    }

    /// The index used.
    pub fn index(&self) -> &Arc<IndexHandle> {
        &self.index
    }

    fn mode_name(&self) -> &'static str {
        match self.join.partition_mode() {
            PartitionMode::CollectLeft => "CollectLeft",
            PartitionMode::Partitioned => "Partitioned",
            PartitionMode::Auto => "Auto",
        }
    }

    /// A future building the build side from build partition `partition` for `probes` streams.
    fn build_future(
        &self,
        partition: usize,
        probes: usize,
        context: &Arc<TaskContext>,
    ) -> Result<BoxFuture<'static, Result<Arc<BuildSide>>>> {
        let left = self.join.left();
        // A coalesced build side is read from its own partitions, concurrently.
        let inputs = match left.downcast_ref::<CoalescePartitionsExec>() {
            Some(c) if *self.join.partition_mode() == PartitionMode::CollectLeft && c.fetch().is_none() => {
                (0..c.input().output_partitioning().partition_count())
                    .map(|i| c.input().execute(i, Arc::clone(context)))
                    .collect::<Result<Vec<_>>>()?
            }
            _ => vec![left.execute(partition, Arc::clone(context))?],
        };
        // A `Partitioned` join builds each of its partitions at once.
        let builds_at_once = match self.join.partition_mode() {
            PartitionMode::Partitioned => left.output_partitioning().partition_count(),
            _ => 1,
        };
        let threads = BuildThreads::for_builds_at_once(builds_at_once);
        let schema = left.schema();
        let index = Arc::clone(&self.index);
        let key = Arc::clone(&self.join.on()[self.key].0);
        let stored_slots = scan_slots_position(&schema, &self.index);
        let residual: Vec<_> = self.residual_pairs().map(|(l, _)| Arc::clone(l)).collect();
        let track = Prober::tracks_visits(*self.join.join_type());
        let member_bits = self.probes_membership();
        let reservation =
            MemoryConsumer::new(format!("MphfJoinExec[build {partition}]")).register(context.memory_pool());
        let build_time = MetricBuilder::new(&self.metrics).subset_time("build_time", partition);
        let build_rows = MetricBuilder::new(&self.metrics).counter("build_rows", partition);
        let csr = MetricBuilder::new(&self.metrics).counter("build_csr_layout", partition);
        let ranked = MetricBuilder::new(&self.metrics).counter("build_ranked_layout", partition);
        let strays = MetricBuilder::new(&self.metrics).counter("build_stray_rows", partition);
        let stored = MetricBuilder::new(&self.metrics).counter("build_stored_slot_rows", partition);
        let input_time = MetricBuilder::new(&self.metrics).subset_time("build_input_time", partition);
        let slots_time = MetricBuilder::new(&self.metrics).subset_time("build_slots_time", partition);
        let layout_time = MetricBuilder::new(&self.metrics).subset_time("build_layout_time", partition);
        Ok(async move {
            let start = std::time::Instant::now();
            let side = BuildSide::collect(
                inputs,
                schema,
                index.index(),
                &key,
                stored_slots,
                &residual,
                track,
                member_bits,
                probes,
                reservation,
                threads,
            )
            .await?;
            build_time.add_duration(start.elapsed());
            input_time.add_duration(side.timings.input);
            slots_time.add_duration(side.timings.slots);
            layout_time.add_duration(side.timings.layout);
            build_rows.add(side.rows());
            csr.add(matches!(side.table, SlotRows::Multi { .. }) as usize);
            ranked.add(side.is_ranked() as usize);
            strays.add(side.strays.values().map(Vec::len).sum());
            stored.add(side.stored_slot_rows);
            Ok(Arc::new(side))
        }
        .boxed())
    }

    /// Whether the probe asks for membership alone ([`probes_membership`] of this join).
    pub fn probes_membership(&self) -> bool {
        probes_membership(&self.join, !self.index.index().stats().had_duplicates())
    }

    /// The `on` pairs other than the indexed one.
    fn residual_pairs(&self) -> impl Iterator<Item = &(Arc<dyn PhysicalExpr>, Arc<dyn PhysicalExpr>)> + '_ {
        self.join
            .on()
            .iter()
            .enumerate()
            .filter(move |(i, _)| *i != self.key)
            .map(|(_, p)| p)
    }

    /// What probe stream `partition` needs besides the build side, which arrives when the
    /// build future resolves: a function from the build side to the stream's [`Prober`].
    pub(super) fn prober_for(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
    ) -> impl FnOnce(SharedBuild) -> Prober {
        let join_type = *self.join.join_type();
        let (_, columns) = build_join_schema(&self.join.left().schema(), &self.join.right().schema(), &join_type);
        let metric = || MetricBuilder::new(&self.metrics);
        let metrics = ProbeMetrics {
            lookup_time: metric().subset_time("lookup_time", partition),
            join_time: metric().subset_time("join_time", partition),
            probe_rows: metric().counter("probe_rows", partition),
            probe_absent: metric().counter("probe_absent_rows", partition),
            probe_translated: metric().counter("probe_translated_rows", partition),
            probe_member_rows: metric().counter("probe_member_rows", partition),
            translations_made: metric().counter("translations_made", partition),
        };
        let index = Arc::clone(&self.index);
        let probe_key = Arc::clone(&self.join.on()[self.key].1);
        let lookup_key = match &self.translator {
            Some(t) => t.lookup_key(),
            None => Arc::clone(&probe_key),
        };
        let translation = self
            .translator
            .as_ref()
            .map(|t| (Arc::clone(t), Arc::clone(context.memory_pool())));
        let residual = self.residual_pairs().map(|(_, r)| Arc::clone(r)).collect();
        let filter = self.join.filter().cloned();
        let projection = self.join.projection.clone();
        let probe_schema = self.join.right().schema();
        let schema = self.schema();
        let batch_size = context.session_config().batch_size();
        let wants_membership = self.probes_membership();
        move |build| Prober {
            build,
            index,
            probe_key,
            lookup_key,
            translation,
            residual,
            filter,
            join_type,
            wants_membership,
            columns,
            projection,
            probe_schema,
            schema,
            batch_size,
            metrics,
        }
    }

    /// The build side for output partition `partition`.
    pub(super) fn build_for(
        &self,
        partition: usize,
        context: &Arc<TaskContext>,
    ) -> Result<BoxFuture<'static, BuildResult>> {
        if *self.join.partition_mode() != PartitionMode::CollectLeft {
            return Ok(self
                .build_future(partition, 1, context)?
                .map(|r| r.map_err(Arc::new))
                .boxed());
        }
        let probes = self.join.right().output_partitioning().partition_count();
        let build = self
            .shared
            .get_or_start(context, probes, || self.build_future(0, probes, context))?;
        Ok(build.boxed())
    }

    /// How `partition` reads its probe input while the build side is collected: ahead, up to
    /// [`READ_AHEAD_BYTES`], in the collect form, where the build runs in a task of its own;
    /// not at all otherwise (see [`read_ahead`]).
    pub(super) fn read_ahead_for(&self, partition: usize, context: &Arc<TaskContext>) -> ReadAhead {
        let limit = match self.join.partition_mode() {
            PartitionMode::CollectLeft => READ_AHEAD_BYTES,
            _ => 0,
        };
        let reservation =
            MemoryConsumer::new(format!("MphfJoinExec[read-ahead {partition}]")).register(context.memory_pool());
        let rows = MetricBuilder::new(&self.metrics).counter("probe_rows_read_ahead", partition);
        ReadAhead::new(limit, reservation, rows)
    }
}

/// Whether the output of `join` on slots needs only which probe rows have a partner, and how
/// many (see [`Prober::membership`]): a right semi or anti join, or an inner join whose output
/// holds probe columns alone over an index built without duplicates (`unique_keys`: one build
/// row a slot), each with no residual key and no filter.
pub(crate) fn probes_membership(join: &HashJoinExec, unique_keys: bool) -> bool {
    if join.on().len() != 1 || join.filter().is_some() {
        return false;
    }
    match join.join_type() {
        JoinType::RightSemi | JoinType::RightAnti => true,
        JoinType::Inner => {
            let left_columns = join.left().schema().fields().len();
            unique_keys
                && join
                    .projection
                    .as_deref()
                    .is_some_and(|p| p.iter().all(|&c| c >= left_columns))
        }
        _ => false,
    }
}

impl DisplayAs for MphfJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let info = self.index.info();
        let on: Vec<String> = self.join.on().iter().map(|(l, r)| format!("({l}, {r})")).collect();
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "mode={}", self.mode_name())?;
                writeln!(f, "join_type={:?}", self.join.join_type())?;
                if let Some(estimate) = &self.estimate {
                    writeln!(f, "{estimate}")?;
                }
                write!(f, "index={}.{}", info.table, info.column)
            }
            _ => {
                write!(
                    f,
                    "MphfJoinExec: mode={}, join_type={:?}, index={}.{}, on=[{}]",
                    self.mode_name(),
                    self.join.join_type(),
                    info.table,
                    info.column,
                    on.join(", ")
                )?;
                if let Some(t) = &self.translator {
                    write!(f, ", probe_index={}", t.describe())?;
                }
                if self.probes_membership() {
                    write!(f, ", probe=membership")?;
                }
                if let Some(filter) = self.join.filter() {
                    write!(f, ", filter={}", filter.expression())?;
                }
                if let Some(p) = &self.join.projection {
                    write!(f, ", projection={:?}", p.as_ref())?;
                }
                write_suffix(f, self.estimate)
            }
        }
    }
}

impl ExecutionPlan for MphfJoinExec {
    fn name(&self) -> &str {
        "MphfJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.join.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.join.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        ExecutionPlan::maintains_input_order(self.join.as_ref())
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        self.join.benefits_from_input_partitioning()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.join.left(), self.join.right()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.join.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let inner = Arc::clone(&self.join).replace_children(children, options)?;
        let Some(join) = inner.downcast_ref::<HashJoinExec>() else {
            return internal_err!("MphfJoinExec: the replaced join changed type");
        };
        let join = Arc::new(join.builder().build()?);
        Ok(Arc::new(
            Self::new(join, Arc::clone(&self.index), self.key).with_estimate(self.estimate),
        ))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let outputs = self.properties().output_partitioning().partition_count();
        if partition >= outputs {
            return internal_err!("MphfJoinExec: partition {partition} of {outputs}");
        }
        let build = self.build_for(partition, &context)?;
        let probe_input = self.join.right().execute(partition, Arc::clone(&context))?;
        let prober = self.prober_for(partition, &context);
        let read_ahead = self.read_ahead_for(partition, &context);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let out = futures::stream::once(async move {
            let (build, probe_input) = read_ahead.await_build(build, probe_input).await;
            let build = build.map_err(DataFusionError::Shared)?;
            let prober = Arc::new(prober(build));
            let last = Arc::clone(&prober);
            let joined = probe_input
                .map(move |batch| prober.probe(&batch?))
                .chain(futures::stream::once(async move { last.finish() }))
                .map_ok(|batches| futures::stream::iter(batches.into_iter().map(Ok)))
                .try_flatten();
            Ok::<_, DataFusionError>(joined)
        })
        .try_flatten()
        .inspect_ok(move |b| baseline.record_output(b.num_rows()));
        Ok(Box::pin(RecordBatchStreamAdapter::new(self.schema(), out)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.join.statistics_from_inputs(input_stats, args)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.join.child_stats_requests(partition)
    }
}

/// Join types the operator runs (mark joins are left to DataFusion).
pub fn supports_join_type(join_type: JoinType) -> bool {
    !matches!(join_type, JoinType::LeftMark | JoinType::RightMark)
}
