//! `MphfAggregateExec`: hash-free GROUP BY on an MPHF-indexed key, and the rule that installs it.
//!
//! # What
//! The operator replaces one `AggregateExec` whose single grouping set is a column that carries
//! an MPHF index (field metadata, see [`registry`](super::registry)), possibly with columns that
//! depend on it. The group index of a row is the slot of its key (`ColumnIndex::lookup_slots`), so no hash table is probed or grown;
//! the accumulators are DataFusion's own `GroupsAccumulator`s (or `GroupsAccumulatorAdapter`
//! for aggregates without one), sized once to the slot count, emitted with `EmitTo::All`.
//!
//! # Two forms
//! - **SlotMerge** ([`MphfMergedAggregateExec`]): a `Final`/`FinalPartitioned` aggregate over a
//!   repartition (or coalesce) of an eligible `Partial` one becomes one node: per-input-partition
//!   slot accumulators, then output partition `p` merges the slot range `p` of all of them. No
//!   hashing at all. Used when DataFusion's sanity check accepts the plan (nothing above relies
//!   on hash partitioning of the group key).
//! - **Per partition** ([`MphfAggregateExec`]): replaces the `Partial` (or `Single`) node. Where
//!   no SlotMerge takes its partials (the plan is cut into stages for workers, or a node above
//!   needs the key's hash partitioning), the `Final` / `FinalPartitioned` node above the
//!   exchange is replaced the same way: each partition looks up the keys of its partial rows
//!   and merges their states by slot, where DataFusion would probe a hash table.
//!
//! # Fast-path conditions (checked by [`MphfAggregateRule`], which otherwise leaves the plan alone)
//! - mode `Partial`, `Single` or `SinglePartitioned` for the per-partition form; a `Final` /
//!   `FinalPartitioned` node directly over a repartition or coalesce of such a `Partial` for
//!   the SlotMerge form, or for the per-partition form of that final node (whose key column
//!   still names the partial's index, and whose lookup is a copy, a dense-key table or the
//!   decoded MPHF of byte keys);
//! - exactly one grouping set; one of its group expressions is a `Column` whose input field
//!   names a live index whose key type equals the column type, and every other group
//!   expression depends on it (same row of a unique indexed key, or through inner joins on
//!   unique indexed keys: see [`lineage`]); the dependent values are still compared per row
//!   (see [`grouping`]);
//! - no aggregate `FILTER`, no ordered aggregates (`ORDER BY` inside the call), no TopK limit,
//!   no output ordering promised by the replaced node;
//! - costing (see [`MphfAggregateRule`]'s module): enough slots, a clustered key, and slot
//!   arrays no larger than the input.
//!
//! # Invariants
//! - Per-partition form: output schema, partitioning and distribution requirements are those of
//!   the replaced node (it is kept inside and delegated to), so the rest of the plan is
//!   untouched. SlotMerge: the final node's schema, `UnknownPartitioning` (see `merged`).
//! - Rows whose key is NULL or not a member of the index are never dropped: they get group
//!   indices after the slots (`n_slots + k`) through a small row-format hash map, so every
//!   distinct key value still forms exactly one group per partition. Results therefore equal
//!   vanilla DataFusion's even when the index is stale.
//! - Only touched slots (and fallback groups) are emitted, in slot order, in `batch_size` batches.
//!
//! # Placement
//! Either form runs on the CPU (batch by batch) or on the GPU ([`Placement`], chosen by the
//! rule from `mphf.aggregate_device`): the GPU placement collects its input, looks it up and
//! aggregates it on the device in one pass, and turns the per-slot results into the
//! accumulators' states (module `gpu`); the SlotMerge form then has one partial for all input
//! partitions. NULL keys, stale indexes and GPU failures end on the CPU path with the same
//! results.

mod dep_values;
mod device;
mod estimate;
#[cfg(feature = "cuda")]
mod gpu;
mod grouping;
mod groups;
mod lineage;
mod merged;
mod ranges;
mod rule;
mod slot_states;
mod stream;

use std::fmt;
use std::sync::Arc;

use ::datafusion::common::tree_node::TreeNodeRecursion;
use ::datafusion::common::{internal_err, Result, Statistics};
use ::datafusion::execution::memory_pool::MemoryConsumer;
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use ::datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, InputDistributionRequirements, PlanProperties, ReplaceChildrenOptions,
};

pub(crate) use estimate::{memory_slices, RowEstimator};
pub(crate) use estimate::{plan_ends as estimates_end, plan_starts as estimates_start, shared as shared_estimates};
pub(crate) use groups::groups_accumulator;
pub use merged::{MergeForm, MphfMergedAggregateExec};
pub(crate) use rule::{decide, Decision};
pub use rule::{Costing, MphfAggregateRule, GPU_MIN_ROWS, MIN_SLOTS};
use stream::MphfAggregateStream;

use super::registry::IndexHandle;
use crate::datafusion::plan::cost::{write_suffix, Estimate};
use crate::gpu::GpuError;
use device::DeviceAggregation;

/// Counter of distinct slots that received at least one row (summed over partitions).
pub const SLOTS_TOUCHED_METRIC_NAME: &str = "slots_touched";
/// Counter of rows grouped through a hash map: key NULL or not in the index, or dependent group
/// columns differing from their slot's first row.
pub const FALLBACK_ROWS_METRIC_NAME: &str = "fallback_rows";

/// Counter of rows whose slots a slot-map scan handed over (no lookup, see `slot_scan`).
pub const SCAN_SLOT_ROWS_METRIC_NAME: &str = "scan_slot_rows";

/// Counter of rows aggregated by the GPU placement (0 when it ran on the CPU or fell back to it).
pub const GPU_ROWS_METRIC_NAME: &str = "gpu_rows";

/// `agg` over the single new child in `children` (both forms keep the replaced aggregate
/// inside and rebuild it when the plan's children change).
pub(super) fn with_new_input(
    agg: &Arc<AggregateExec>,
    children: Vec<Arc<dyn ExecutionPlan>>,
    options: ReplaceChildrenOptions,
) -> Result<Arc<AggregateExec>> {
    if children.len() != 1 {
        return internal_err!("MphfAggregateExec takes one child, got {}", children.len());
    }
    let inner = Arc::clone(agg).replace_children(children, options)?;
    let Some(agg) = inner.downcast_ref::<AggregateExec>() else {
        return internal_err!("MphfAggregateExec: the replaced aggregate changed type");
    };
    Ok(Arc::new(agg.clone()))
}

/// Where the slot aggregation runs (chosen by the rule; shown by `EXPLAIN` as `device=`).
#[derive(Clone, Debug, Default)]
pub(crate) enum Placement {
    /// Batch by batch on the CPU.
    #[default]
    Cpu,
    /// The whole input looked up and aggregated on a device (the GPU, see `device`); falls
    /// back to the CPU with a notice when the device fails. Only [`Placement::gpu_for`] makes
    /// one, and only with the `cuda` feature.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Device(Arc<dyn DeviceAggregation>),
}

impl Placement {
    /// `cpu`, or the device's name.
    pub fn device_name(&self) -> &'static str {
        match self {
            Placement::Cpu => "cpu",
            Placement::Device(device) => device.device_name(),
        }
    }

    /// The GPU placement of `agg` grouped by `key_pos`, or why it has none
    /// ([`GpuError::Unsupported`] aggregates or types, [`GpuError::NotBuilt`] without the `cuda`
    /// feature). `emulate`: its algorithm runs on the CPU (`Tuning::gpu_emulation`, for testing
    /// without a GPU).
    pub fn gpu_for(agg: &AggregateExec, key_pos: usize, emulate: bool) -> std::result::Result<Placement, GpuError> {
        #[cfg(feature = "cuda")]
        {
            gpu::GpuAggregation::try_new(agg, key_pos, emulate).map(|g| Placement::Device(Arc::new(g)))
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (agg, key_pos, emulate);
            Err(GpuError::NotBuilt)
        }
    }
}

/// An aggregation whose group indices are MPHF slots (see the module docs).
#[derive(Debug)]
pub struct MphfAggregateExec {
    /// The replaced aggregate: source of schema, properties, expressions and requirements.
    agg: Arc<AggregateExec>,
    /// The index of the group column.
    index: Arc<IndexHandle>,
    /// Position of the indexed key among the group expressions (the others depend on it).
    key_pos: usize,
    /// CPU or GPU.
    placement: Placement,
    /// The form of the merged node a final aggregate above may make of it (chosen by the rule).
    merge_form: MergeForm,
    /// Admitted by the rule only as the partial of a merged node (see `rule`).
    needs_merge: bool,
    /// The rule's estimates (shown by `EXPLAIN`; `None` for a node made outside the rule).
    estimate: Option<Estimate>,
    /// Execution metrics.
    metrics: ExecutionPlanMetricsSet,
}

impl MphfAggregateExec {
    /// Wraps `agg` (already checked by the rule), grouped by the slots in `index` of its group
    /// expression `key_pos`.
    pub fn new(agg: Arc<AggregateExec>, index: Arc<IndexHandle>, key_pos: usize) -> Self {
        Self {
            agg,
            index,
            key_pos,
            placement: Placement::Cpu,
            merge_form: MergeForm::Partials,
            needs_merge: false,
            estimate: None,
            metrics: ExecutionPlanMetricsSet::new(),
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

    /// The same node, marked as admitted only as the partial of a merged node.
    pub(crate) fn needing_merge(mut self, needs_merge: bool) -> Self {
        self.needs_merge = needs_merge;
        self
    }

    /// Admitted only as the partial of a merged node.
    pub(crate) fn needs_merge(&self) -> bool {
        self.needs_merge
    }

    /// The same node, to be merged in `form`.
    pub(crate) fn with_merge_form(mut self, form: MergeForm) -> Self {
        self.merge_form = form;
        self
    }

    /// The form of a merge of this node.
    pub(crate) fn merge_form(&self) -> MergeForm {
        self.merge_form
    }

    /// The same node running on `placement`.
    pub(crate) fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Where it runs.
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The replaced aggregate.
    pub fn aggregate(&self) -> &Arc<AggregateExec> {
        &self.agg
    }

    /// The index used.
    pub fn index(&self) -> &Arc<IndexHandle> {
        &self.index
    }

    /// Position of the indexed key among the group expressions.
    pub fn key_pos(&self) -> usize {
        self.key_pos
    }

    /// The replaced aggregate's mode (`Partial`, `Single`, `SinglePartitioned`, or a final
    /// mode over MPHF partials).
    pub fn mode(&self) -> AggregateMode {
        *self.agg.mode()
    }

    fn mode_name(&self) -> &'static str {
        match self.agg.mode() {
            AggregateMode::Partial => "Partial",
            AggregateMode::Single => "Single",
            AggregateMode::SinglePartitioned => "SinglePartitioned",
            AggregateMode::Final => "Final",
            AggregateMode::FinalPartitioned => "FinalPartitioned",
            AggregateMode::PartialReduce => "PartialReduce",
        }
    }
}

impl DisplayAs for MphfAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let info = self.index.info();
        let gby: Vec<String> = self
            .agg
            .group_expr()
            .expr()
            .iter()
            .map(|(e, alias)| format!("{e} as {alias}"))
            .collect();
        let aggr: Vec<&str> = self.agg.aggr_expr().iter().map(|a| a.name()).collect();
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "mode={}", self.mode_name())?;
                writeln!(f, "device={}", self.placement.device_name())?;
                writeln!(f, "index={}.{}", info.table, info.column)?;
                if let Some(estimate) = &self.estimate {
                    writeln!(f, "{estimate}")?;
                }
                write!(f, "gby=[{}]", gby.join(", "))
            }
            _ => {
                write!(
                    f,
                    "MphfAggregateExec: mode={}, device={}, index={}.{}, gby=[{}], aggr=[{}]",
                    self.mode_name(),
                    self.placement.device_name(),
                    info.table,
                    info.column,
                    gby.join(", "),
                    aggr.join(", ")
                )?;
                write_suffix(f, self.estimate)
            }
        }
    }
}

impl ExecutionPlan for MphfAggregateExec {
    fn name(&self) -> &str {
        "MphfAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.agg.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.agg.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        self.agg.benefits_from_input_partitioning()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.agg.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.agg.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let agg = with_new_input(&self.agg, children, options)?;
        Ok(Arc::new(
            Self::new(agg, Arc::clone(&self.index), self.key_pos)
                .with_placement(self.placement.clone())
                .with_merge_form(self.merge_form)
                .needing_merge(self.needs_merge)
                .with_estimate(self.estimate),
        ))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(::datafusion::physical_plan::execution_plan::ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let input = self.agg.input().execute(partition, Arc::clone(&context))?;
        let reservation =
            MemoryConsumer::new(format!("MphfAggregateExec[{partition}]")).register(context.memory_pool());
        let stream = MphfAggregateStream::try_new(
            self,
            input,
            context.session_config().batch_size(),
            reservation,
            &self.metrics,
            partition,
        )?;
        Ok(Box::pin(stream))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.agg.statistics_from_inputs(input_stats, args)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.agg.child_stats_requests(partition)
    }
}
