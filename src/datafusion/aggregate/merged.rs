//! `MphfAggregateExec` in `SlotMerge` mode: the whole two-stage aggregation (`Partial →
//! Repartition/Coalesce → Final[Partitioned]`) as one node, with no hash table anywhere.
//!
//! # Strategy
//! Output partition `p` of `P` owns a share of the slots and emits exactly their groups. Two
//! forms ([`MergeForm`], chosen by the rule) get the rows' states there:
//! - **Partials** (clustered keys, or many rows per slot):
//!   1. once per execution, shared by all output partitions, one task per input partition
//!      accumulates its rows into slot-indexed accumulators ([`SlotGroups`]) and keeps the
//!      states of the slots it touched, in slot order ([`PartialSlots`]);
//!   2. output partition `p` owns the slots `[p·n/P, (p+1)·n/P)`. It binary-searches that range
//!      in every partial, merges the states with `merge_batch` (group ids handed out on a
//!      slot's first touch, as DataFusion's own hash aggregation does: its accumulators' null
//!      tracking relies on it) and emits the touched slots of its range in slot order, keys
//!      read from the index. Partition 0 also merges the fallback groups (NULL keys and keys
//!      not in the index) by their row-format key.
//! - **Ranges** (unclustered keys with few rows per slot): the rows themselves are scattered
//!   by slot range once per execution, and each output partition aggregates its ranges in
//!   cache straight to final values (see [`ranges`](super::ranges)).
//!
//! On the GPU placement (always the partials form), step 1 is one partial for all input
//! partitions: their batches are collected and aggregated on the device in one pass (`gpu`), plus a CPU partial of the rows
//! whose key is NULL; step 2 is unchanged.
//!
//! This replaces DataFusion's repartition by hash and its final hash aggregation: the slot
//! already says which output partition a group belongs to, and where in it.
//!
//! # Invariants
//! - Each group is emitted by exactly one output partition; results equal the replaced plan's.
//! - The output is `UnknownPartitioning(P)`, not hash partitioned: the rule installs this node
//!   only when DataFusion's sanity check accepts the plan (no parent relies on hash
//!   partitioning of the key), otherwise it falls back to the per-partition form.
//! - Memory: every partial's accumulators and states, or the scattered rows and the ranges'
//!   accumulators, are reserved in the memory pool.

use std::fmt;
use std::sync::Arc;

use ::datafusion::arrow::array::{ArrayRef, RecordBatch, UInt32Array, UInt64Array};
use ::datafusion::arrow::compute::take;
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::common::runtime::SpawnedTask;
use ::datafusion::common::tree_node::TreeNodeRecursion;
use ::datafusion::common::{internal_err, DataFusionError, Result, Statistics};
use ::datafusion::execution::memory_pool::MemoryConsumer;
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::logical_expr::EmitTo;
use ::datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use ::datafusion::physical_plan::aggregates::AggregateExec;
use ::datafusion::physical_plan::execution_plan::{Boundedness, ChildrenPropertiesMode, EmissionType};
use ::datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use ::datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties, ReplaceChildrenOptions,
};
use futures::future::{BoxFuture, FutureExt};
use futures::{StreamExt, TryStreamExt};

use super::device::{notice_cpu_fallback, DeviceAggregation};
use super::grouping::{ByteRows, Grouping};
use super::groups::{groups_accumulator, member_keys, PartialSlots, SlotGroups, SlotMetrics};
use super::ranges::{RangeJob, Scattered, SlotRanges};
use super::Placement;
use crate::datafusion::once::{OncePerExecution, SharedWork};
use crate::datafusion::plan::cost::{write_suffix, Estimate};
use crate::datafusion::registry::IndexHandle;

/// How the node turns its input into per-range work (chosen by the rule, shown by `EXPLAIN` as
/// `form=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MergeForm {
    /// Per-input-partition partial states, merged by slot range (clustered keys, or many rows
    /// per slot: the partials are much smaller than their input).
    #[default]
    Partials,
    /// Rows scattered by slot range, each range aggregated in cache (see [`ranges`](super::ranges)):
    /// unclustered keys with few rows per slot, where every partial would touch most slots.
    Ranges,
}

impl MergeForm {
    /// The form's name in `EXPLAIN` (and in encoded plans).
    pub(crate) fn name(self) -> &'static str {
        match self {
            MergeForm::Partials => "partials",
            MergeForm::Ranges => "ranges",
        }
    }

    /// The form named `name` (see [`MergeForm::name`]).
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn parse(name: &str) -> Option<MergeForm> {
        [MergeForm::Partials, MergeForm::Ranges]
            .into_iter()
            .find(|f| f.name() == name)
    }
}

/// What all output partitions share, computed once per execution.
enum Prepared {
    /// One partial per input partition (or one GPU partial), for the slot-range merge.
    Partials(Vec<PartialSlots>),
    /// The input's rows reordered by slot range.
    Scattered(Scattered),
}

/// The two-stage aggregation on slots (see the module docs).
pub struct MphfMergedAggregateExec {
    /// The replaced `Partial` aggregate: input, group and aggregate expressions.
    partial: Arc<AggregateExec>,
    /// The replaced final aggregate: output schema and aggregate expressions.
    final_agg: Arc<AggregateExec>,
    index: Arc<IndexHandle>,
    /// Position of the indexed key among the group expressions.
    key_pos: usize,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    /// CPU or GPU (the partials' placement).
    placement: Placement,
    /// Partials or scattered rows (CPU placement only; the GPU's partial is always one).
    form: MergeForm,
    /// The rule's estimates for the partial (shown by `EXPLAIN`).
    estimate: Option<Estimate>,
    /// The work all output partitions of one execution share.
    prepared: OncePerExecution<Prepared>,
}

impl fmt::Debug for MphfMergedAggregateExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MphfMergedAggregateExec")
            .field("index", &self.index.info().name)
            .finish_non_exhaustive()
    }
}

impl MphfMergedAggregateExec {
    /// Replaces `final_agg` (whose input chain ends in `partial`, grouped by the slots of its
    /// group expression `key_pos`) with `output_partitions` slot ranges.
    pub fn new(
        partial: Arc<AggregateExec>,
        final_agg: Arc<AggregateExec>,
        index: Arc<IndexHandle>,
        key_pos: usize,
        output_partitions: usize,
    ) -> Self {
        let schema = ExecutionPlan::schema(final_agg.as_ref());
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(output_partitions.max(1)),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        Self {
            partial,
            final_agg,
            index,
            key_pos,
            properties: Arc::new(properties),
            metrics: ExecutionPlanMetricsSet::new(),
            placement: Placement::Cpu,
            form: MergeForm::Partials,
            estimate: None,
            prepared: OncePerExecution::default(),
        }
    }

    /// The same node with the rule's estimates.
    pub fn with_estimate(mut self, estimate: Option<Estimate>) -> Self {
        self.estimate = estimate;
        self
    }

    /// The same node computing its partials on `placement`.
    pub(crate) fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// The same node in `form` (on the CPU placement; the GPU placement keeps its partial).
    pub fn with_form(mut self, form: MergeForm) -> Self {
        self.form = form;
        self
    }

    /// The replaced partial aggregate.
    pub fn partial(&self) -> &Arc<AggregateExec> {
        &self.partial
    }

    /// The replaced final aggregate.
    pub fn final_aggregate(&self) -> &Arc<AggregateExec> {
        &self.final_agg
    }

    /// The index used.
    pub fn index(&self) -> &Arc<IndexHandle> {
        &self.index
    }

    /// Position of the indexed key among the group expressions.
    pub fn key_pos(&self) -> usize {
        self.key_pos
    }

    /// Where the partials run.
    #[cfg_attr(not(feature = "distributed"), allow(dead_code))]
    pub(crate) fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The form the rule chose (what runs on the CPU placement, see [`Self::form`]).
    pub fn chosen_form(&self) -> MergeForm {
        self.form
    }

    /// The rule's estimates.
    pub fn estimate(&self) -> Option<Estimate> {
        self.estimate
    }

    /// The form that runs: `Ranges` only on the CPU.
    pub fn form(&self) -> MergeForm {
        match self.placement {
            Placement::Cpu => self.form,
            Placement::Device(_) => MergeForm::Partials,
        }
    }

    /// The scatter and range aggregation of this node.
    fn range_job(&self) -> RangeJob {
        let outputs = self.properties.output_partitioning().partition_count();
        RangeJob {
            partial: Arc::clone(&self.partial),
            index: Arc::clone(&self.index),
            key_pos: self.key_pos,
            out_schema: ExecutionPlan::schema(self.final_agg.as_ref()),
            ranges: SlotRanges::new(self.index.index().len() as usize, outputs),
        }
    }

    /// The shared future of the partials or scattered rows (started on first use).
    fn prepared(&self, context: &Arc<TaskContext>) -> Result<SharedWork<Prepared>> {
        let ranges = self.properties.output_partitioning().partition_count();
        self.prepared
            .get_or_start(context, ranges, || Ok(self.prepare(context)))
    }

    /// The future of the partials or scattered rows of one execution.
    fn prepare(&self, context: &Arc<TaskContext>) -> BoxFuture<'static, Result<Arc<Prepared>>> {
        let partial = Arc::clone(&self.partial);
        let index = Arc::clone(&self.index);
        let context = Arc::clone(context);
        let metrics = self.metrics.clone();
        let out_schema = ExecutionPlan::schema(self.final_agg.as_ref());
        let key_pos = self.key_pos;
        let placement = self.placement.clone();
        let range_job = (self.form() == MergeForm::Ranges).then(|| self.range_job());
        async move {
            if let Some(job) = range_job {
                return Ok(Arc::new(Prepared::Scattered(job.scatter(&context, &metrics).await?)));
            }
            let job = PartialJob {
                partial,
                index,
                context,
                metrics,
                out_schema,
                key_pos,
            };
            let out = match placement {
                Placement::Cpu => {
                    let inputs = job.partial.input().output_partitioning().partition_count();
                    let sources = (0..inputs)
                        .map(|i| {
                            job.partial
                                .input()
                                .execute(i, Arc::clone(&job.context))
                                .map(Rows::Stream)
                        })
                        .collect::<Result<Vec<_>>>()?;
                    job.cpu_partials(sources).await?
                }
                Placement::Device(device) => job.device_partials(device).await?,
            };
            Ok(Arc::new(Prepared::Partials(out)))
        }
        .boxed()
    }
}

/// Where the rows of one input partition come from.
enum Rows {
    /// The input partition's stream.
    Stream(SendableRecordBatchStream),
    /// Batches already collected (the device placement's CPU fallback).
    Buffered(Vec<RecordBatch>),
}

/// What computing the partials needs (moved into their future).
struct PartialJob {
    partial: Arc<AggregateExec>,
    index: Arc<IndexHandle>,
    context: Arc<TaskContext>,
    metrics: ExecutionPlanMetricsSet,
    out_schema: SchemaRef,
    key_pos: usize,
}

impl PartialJob {
    /// Slot accumulators for input partition `i`.
    fn slot_groups(&self, i: usize) -> Result<SlotGroups> {
        SlotGroups::try_new(
            &self.partial,
            self.key_pos,
            &self.out_schema,
            Arc::clone(&self.index),
            SlotMetrics::new(&self.metrics, i),
        )
    }

    /// One partial per source, each accumulated on the CPU in its own task.
    async fn cpu_partials(&self, sources: Vec<Rows>) -> Result<Vec<PartialSlots>> {
        let mut tasks = Vec::with_capacity(sources.len());
        for (i, source) in sources.into_iter().enumerate() {
            let mut groups = self.slot_groups(i)?;
            let reservation =
                MemoryConsumer::new(format!("MphfAggregateExec[partial {i}]")).register(self.context.memory_pool());
            tasks.push(SpawnedTask::spawn(async move {
                match source {
                    Rows::Stream(mut stream) => {
                        while let Some(batch) = stream.next().await {
                            groups.accumulate(&batch?)?;
                            reservation.try_resize(groups.size())?;
                        }
                    }
                    Rows::Buffered(batches) => {
                        for batch in &batches {
                            groups.accumulate(batch)?;
                            reservation.try_resize(groups.size())?;
                        }
                    }
                }
                let out = groups.into_partial()?;
                reservation.try_resize(out.size())?;
                Ok::<_, DataFusionError>(PartialSlots {
                    _reservation: Some(reservation),
                    ..out
                })
            }));
        }
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            let part = t
                .join_unwind()
                .await
                .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??;
            out.push(part);
        }
        Ok(out)
    }

    /// The device placement: every input partition collected, then one lookup and aggregation
    /// over all rows on the device (one partial, no per-partition slot arrays), plus a CPU
    /// partial of the NULL-key rows. Falls back to [`PartialJob::cpu_partials`] over the
    /// collected batches.
    async fn device_partials(&self, device: Arc<dyn DeviceAggregation>) -> Result<Vec<PartialSlots>> {
        let inputs = self.partial.input().output_partitioning().partition_count();
        let mut tasks = Vec::with_capacity(inputs);
        for i in 0..inputs {
            let stream = self.partial.input().execute(i, Arc::clone(&self.context))?;
            tasks.push(SpawnedTask::spawn(stream.try_collect::<Vec<RecordBatch>>()));
        }
        let mut per_input = Vec::with_capacity(inputs);
        for t in tasks {
            per_input.push(
                t.join_unwind()
                    .await
                    .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))??,
            );
        }
        let reservation = MemoryConsumer::new("MphfAggregateExec[device input]").register(self.context.memory_pool());
        reservation.try_grow(per_input.iter().flatten().map(|b| b.get_array_memory_size()).sum())?;
        let all: Vec<RecordBatch> = per_input.iter().flatten().cloned().collect();
        let (run_device, run_index, run_all) = (Arc::clone(&device), Arc::clone(&self.index), all.clone());
        let outcome = SpawnedTask::spawn_blocking(move || run_device.run(&run_index, &run_all))
            .join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?;
        match outcome {
            Ok(Some(states)) => {
                SlotMetrics::new(&self.metrics, 0).record_gpu(&states);
                let mut out = vec![PartialSlots::from_slot_states(states)];
                let nulls = device.null_key_rows(&all)?;
                if !nulls.is_empty() {
                    out.extend(self.cpu_partials(vec![Rows::Buffered(nulls)]).await?);
                }
                return Ok(out);
            }
            Ok(None) => {}
            Err(why) => notice_cpu_fallback(device.as_ref(), &why),
        }
        drop(all);
        self.cpu_partials(per_input.into_iter().map(Rows::Buffered).collect())
            .await
    }
}

/// What the merge of one range needs from the node.
struct Stages {
    partial: Arc<AggregateExec>,
    final_agg: Arc<AggregateExec>,
    index: Arc<IndexHandle>,
    key_pos: usize,
}

/// `canon_of` value of a slot whose canonical dependent values are not set yet.
const NO_CANON: u32 = u32::MAX;
/// `group_of` value of a canonical group that has no accumulator group id yet.
const NO_GROUP: u32 = u32::MAX;

/// A group of a range after its slots' canonical groups.
enum OtherGroup {
    /// A slot's group with dependent values differing from the canonical ones (row `k` of the
    /// range's `other_deps`).
    Member { slot: usize, dep: usize },
    /// A fallback group (`k`-th whole key of the range's `fallback_keys`).
    Fallback,
}

/// The canonical groups of a slot range: one per slot of the range (dense), or, when the
/// partials touch few of its slots, one per touched slot in ascending order (compact).
///
/// Why: the accumulators are sized by the group count and emit every group, so a dense range
/// costs its whole length even when a selective input touched a sliver of it (TPC-H Q3 at
/// SF 1: 11.6 K groups in 1.5 M slots, 5.3 ms of merging, more than the hash aggregation it
/// replaced). Compact groups cost a sort of the touched slots instead.
struct RangeGroups {
    /// Touched slots (relative to the range start), ascending and distinct; `None`: dense.
    compact: Option<Vec<usize>>,
    /// Number of groups.
    len: usize,
}

/// A range is merged compactly when its partials touch fewer than 1 in this many slots.
const COMPACT_BELOW: usize = 8;

impl RangeGroups {
    fn new(partials: &[PartialSlots], lo: usize, hi: usize) -> Self {
        fn canonical(part: &PartialSlots, lo: usize, hi: usize) -> std::ops::Range<usize> {
            let slots = &part.slots[..part.n_touched];
            slots.partition_point(|&s| s < lo)..slots.partition_point(|&s| s < hi)
        }
        fn in_range(part: &PartialSlots, lo: usize, hi: usize) -> impl Iterator<Item = usize> + '_ {
            let mismatches = (part.n_touched..part.slots.len()).filter(move |&j| (lo..hi).contains(&part.slots[j]));
            canonical(part, lo, hi).chain(mismatches)
        }
        // Mismatch groups are few: counted whether in the range or not.
        let entries: usize = partials
            .iter()
            .map(|p| canonical(p, lo, hi).len() + p.slots.len() - p.n_touched)
            .sum();
        if entries * COMPACT_BELOW >= hi - lo {
            return Self {
                compact: None,
                len: hi - lo,
            };
        }
        let mut slots: Vec<usize> = partials
            .iter()
            .flat_map(|p| in_range(p, lo, hi).map(|j| p.slots[j] - lo))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        Self {
            len: slots.len(),
            compact: Some(slots),
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// The group of a touched slot (relative to the range start).
    fn group(&self, slot: usize) -> usize {
        match &self.compact {
            Some(slots) => slots
                .binary_search(&slot)
                .unwrap_or_else(|_| unreachable!("every touched slot was collected")),
            None => slot,
        }
    }

    /// The slot (relative to the range start) of canonical group `g`.
    fn slot(&self, g: usize) -> usize {
        match &self.compact {
            Some(slots) => slots[g],
            None => g,
        }
    }
}

/// Merges the partials' states for the slots `[lo, hi)` (and, when `with_fallback`, the
/// fallback groups) and returns the result batch of that range.
fn merge_range(
    exec: &Stages,
    partials: &[PartialSlots],
    lo: usize,
    hi: usize,
    with_fallback: bool,
    slots_touched: &::datafusion::physical_plan::metrics::Count,
) -> Result<RecordBatch> {
    let schema = ExecutionPlan::schema(exec.final_agg.as_ref());
    let grouping = Grouping::try_new(&exec.partial, exec.key_pos, &schema, &exec.index)?;
    let has_deps = grouping.dep_converter.is_some();
    let mut accs = exec
        .final_agg
        .aggr_expr()
        .iter()
        .map(groups_accumulator)
        .collect::<Result<Vec<_>>>()?;
    let widths: Vec<usize> = exec
        .partial
        .aggr_expr()
        .iter()
        .map(|a| a.state_fields().map(|f| f.len()))
        .collect::<Result<_>>()?;
    let range = RangeGroups::new(partials, lo, hi);
    // Canonical groups are the range's slots (or its touched slots, compact); each gets its
    // accumulator group id on first touch, as do mismatch and fallback groups. DataFusion's
    // accumulators rely on that order: after a batch without NULLs their null tracking marks
    // every group below `total_num_groups` as seen, so a group id handed out before its first
    // row would report an all-NULL group as `sum` 0 instead of NULL.
    let n_canon = range.len();
    let mut group_of = vec![NO_GROUP; n_canon];
    let mut n_groups = 0usize;
    // Canonical dependent values of the range's slots: the first partial's that touched it.
    let mut canon_of = if has_deps { vec![NO_CANON; n_canon] } else { Vec::new() };
    let mut canon = ByteRows::default();
    // Mismatch and fallback groups, by a tagged byte key, with their group ids.
    let mut others: Vec<(OtherGroup, usize)> = Vec::new();
    let mut other_of = std::collections::HashMap::<Box<[u8]>, usize>::new();
    let mut other_deps = ByteRows::default();
    let mut fallback_keys: Vec<&[u8]> = Vec::new();
    let mut groups = Vec::new();
    let mut picked: Vec<u32> = Vec::new();
    for part in partials {
        let a = part.slots[..part.n_touched].partition_point(|&s| s < lo);
        let b = part.slots[..part.n_touched].partition_point(|&s| s < hi);
        groups.clear();
        picked.clear();
        let mismatches = part.n_touched..part.slots.len();
        let in_range = (a..b).chain(mismatches.clone().filter(|&j| (lo..hi).contains(&part.slots[j])));
        for j in in_range {
            let slot = part.slots[j] - lo;
            let s = range.group(slot);
            picked.push(j as u32);
            let g = match group_of[s] {
                NO_GROUP => {
                    group_of[s] = n_groups as u32;
                    n_groups += 1;
                    n_groups - 1
                }
                g => g as usize,
            };
            if !has_deps {
                groups.push(g);
                continue;
            }
            let dep = part.deps.get(j);
            if canon_of[s] == NO_CANON {
                canon_of[s] = canon.len() as u32;
                canon.push(dep);
                groups.push(g);
            } else if canon.get(canon_of[s] as usize) == dep {
                groups.push(g);
            } else {
                let mut tag = Vec::with_capacity(9 + dep.len());
                tag.push(0u8);
                tag.extend_from_slice(&(slot as u64).to_le_bytes());
                tag.extend_from_slice(dep);
                let k = *other_of.entry(tag.into_boxed_slice()).or_insert_with(|| {
                    others.push((
                        OtherGroup::Member {
                            slot,
                            dep: other_deps.len(),
                        },
                        n_groups,
                    ));
                    n_groups += 1;
                    other_deps.push(dep);
                    others.len() - 1
                });
                groups.push(others[k].1);
            }
        }
        if !groups.is_empty() {
            // Without mismatches in the partial, its rows of the range are contiguous.
            let contiguous = mismatches.is_empty();
            let indices = UInt32Array::from(picked.clone());
            let mut col = 0;
            for (acc, &w) in accs.iter_mut().zip(&widths) {
                let states = part.states[col..col + w]
                    .iter()
                    .map(|s| {
                        if contiguous {
                            Ok(s.slice(a, b - a))
                        } else {
                            Ok(take(s.as_ref(), &indices, None)?)
                        }
                    })
                    .collect::<Result<Vec<ArrayRef>>>()?;
                acc.merge_batch(&states, &groups, n_groups)?;
                col += w;
            }
        }
        if with_fallback && !part.fallback_keys.is_empty() {
            groups.clear();
            for key in &part.fallback_keys {
                let mut tag = Vec::with_capacity(1 + key.len());
                tag.push(1u8);
                tag.extend_from_slice(key);
                let k = *other_of.entry(tag.into_boxed_slice()).or_insert_with(|| {
                    others.push((OtherGroup::Fallback, n_groups));
                    n_groups += 1;
                    fallback_keys.push(key);
                    others.len() - 1
                });
                groups.push(others[k].1);
            }
            let mut col = 0;
            for (acc, &w) in accs.iter_mut().zip(&widths) {
                acc.merge_batch(&part.fallback_states[col..col + w], &groups, n_groups)?;
                col += w;
            }
        }
    }
    let n_touched = group_of.iter().filter(|&&g| g != NO_GROUP).count();
    slots_touched.add(n_touched);
    if n_groups == 0 {
        return Ok(RecordBatch::new_empty(schema));
    }
    // Emission: canonical slot groups in slot order, mismatch groups, fallback groups.
    let canonical: Vec<usize> = (0..n_canon).filter(|&s| group_of[s] != NO_GROUP).collect();
    let mut order: Vec<u32> = canonical.iter().map(|&s| group_of[s]).collect();
    let mut member_slots: Vec<u64> = canonical.iter().map(|&s| (lo + range.slot(s)) as u64).collect();
    let mut member_deps: Vec<&[u8]> = Vec::new();
    if has_deps {
        member_deps.extend(canonical.iter().map(|&s| canon.get(canon_of[s] as usize)));
    }
    for (other, g) in &others {
        if let OtherGroup::Member { slot, dep } = other {
            order.push(*g as u32);
            member_slots.push((lo + slot) as u64);
            member_deps.push(other_deps.get(*dep));
        }
    }
    order.extend(
        others
            .iter()
            .filter(|(o, _)| matches!(o, OtherGroup::Fallback))
            .map(|(_, g)| *g as u32),
    );
    let key = member_keys(&grouping, &exec.index, UInt64Array::from(member_slots))?;
    let mut parts = vec![grouping.assemble(key, grouping.decode_deps(member_deps.into_iter())?)?];
    if !fallback_keys.is_empty() {
        let (key, deps) = grouping.decode_full(fallback_keys.into_iter())?;
        parts.push(grouping.assemble(key, deps)?);
    }
    let mut columns = Grouping::concat(parts)?;
    let order = UInt32Array::from(order);
    for acc in &mut accs {
        columns.push(take(acc.evaluate(EmitTo::All)?.as_ref(), &order, None)?);
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

impl DisplayAs for MphfMergedAggregateExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let info = self.index.info();
        let gby: Vec<String> = self
            .partial
            .group_expr()
            .expr()
            .iter()
            .map(|(e, alias)| format!("{e} as {alias}"))
            .collect();
        let aggr: Vec<&str> = self.final_agg.aggr_expr().iter().map(|a| a.name()).collect();
        let partitions = self.properties.output_partitioning().partition_count();
        match t {
            DisplayFormatType::TreeRender => {
                writeln!(f, "mode=SlotMerge")?;
                writeln!(f, "form={}", self.form().name())?;
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
                    "MphfAggregateExec: mode=SlotMerge, form={}, device={}, partitions={partitions}, index={}.{}, gby=[{}], aggr=[{}]",
                    self.form().name(),
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

impl ExecutionPlan for MphfMergedAggregateExec {
    fn name(&self) -> &str {
        "MphfAggregateExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![self.partial.input()]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.partial.apply_expressions(f)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut node = Self::new(
            super::with_new_input(&self.partial, children, options)?,
            Arc::clone(&self.final_agg),
            Arc::clone(&self.index),
            self.key_pos,
            self.properties.output_partitioning().partition_count(),
        )
        .with_placement(self.placement.clone())
        .with_form(self.form)
        .with_estimate(self.estimate);
        // The properties depend only on the final aggregate's schema and the partition count,
        // which new children with the same properties leave as they are: keeping the same
        // properties lets the nodes above keep theirs too, instead of recomputing them.
        if options.children_properties == ChildrenPropertiesMode::Keep {
            node.properties = Arc::clone(&self.properties);
        }
        Ok(Arc::new(node))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let ranges = self.properties.output_partitioning().partition_count();
        if partition >= ranges {
            return internal_err!("MphfAggregateExec: partition {partition} of {ranges}");
        }
        let n = self.index.index().len() as usize;
        let (lo, hi) = (partition * n / ranges, (partition + 1) * n / ranges);
        let prepared = self.prepared(&context)?;
        let schema = ExecutionPlan::schema(self.final_agg.as_ref());
        let batch_size = context.session_config().batch_size().max(1);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let merge_time = MetricBuilder::new(&self.metrics).subset_time("merge_time", partition);
        let slots_touched = MetricBuilder::new(&self.metrics).counter("merged_slots", partition);
        let this = Stages {
            partial: Arc::clone(&self.partial),
            final_agg: Arc::clone(&self.final_agg),
            index: Arc::clone(&self.index),
            key_pos: self.key_pos,
        };
        let range_job = (self.form() == MergeForm::Ranges).then(|| self.range_job());
        let metrics = self.metrics.clone();
        let out = futures::stream::once(async move {
            let prepared = prepared.await.map_err(DataFusionError::Shared)?;
            let batches = {
                let _timer = merge_time.timer();
                match prepared.as_ref() {
                    Prepared::Partials(partials) => {
                        vec![merge_range(&this, partials, lo, hi, partition == 0, &slots_touched)?]
                    }
                    Prepared::Scattered(scattered) => match &range_job {
                        Some(job) => job.aggregate(scattered, partition, &context, &metrics)?,
                        None => return internal_err!("MphfAggregateExec: scattered rows without the range form"),
                    },
                }
            };
            let slices: Vec<Result<RecordBatch>> = batches
                .iter()
                .flat_map(|batch| {
                    (0..batch.num_rows()).step_by(batch_size).map(|o| {
                        let len = batch_size.min(batch.num_rows() - o);
                        baseline.record_output(len);
                        Ok(batch.slice(o, len))
                    })
                })
                .collect();
            Ok::<_, DataFusionError>(futures::stream::iter(slices))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// The replaced aggregates' statistics over the whole input (the partial's of the input,
    /// the final's of those). An output partition is a slot range, which no input statistic
    /// describes: its statistics are unknown.
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        if args.partition().is_some() {
            return Ok(Arc::new(Statistics::new_unknown(&self.schema())));
        }
        let partial = self.partial.statistics_from_inputs(input_stats, args)?;
        self.final_agg.statistics_from_inputs(&[partial], args)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        match partition {
            Some(_) => vec![ChildStats::Skip],
            None => vec![ChildStats::At(None)],
        }
    }
}
