//! `MphfJoinRule`: swaps eligible `HashJoinExec`s for [`MphfJoinExec`]s.
//!
//! A join is eligible when one of its equi-key pairs has, on the build (left) side, a column
//! carrying an MPHF index label whose key type equals the column's and the probe key's type,
//! and that column comes from a scan of the indexed table through operators that never repeat
//! a row (so the index's build counts bound the key's multiplicity; see
//! `comes_from_table_scan`);
//! the join type is not a mark join; NULLs never match (`NullEqualsNothing`, not null-aware);
//! and it has no `fetch`. Other key pairs become a residual equality, the filter is kept.
//!
//! # Forms
//! - **Collect** (preferred): a `Partitioned` join's two hash repartitions exist only so that
//!   equal keys meet in one partition; with a slot table the build side is collected once and
//!   every probe partition reads it, so both repartitions are dropped (the build side is
//!   coalesced instead) and the node runs as `CollectLeft` over the probe side's own
//!   partitions. The output is no longer hash partitioned on the key, so the rewritten plan is
//!   kept only when DataFusion's sanity check accepts it.
//!   Under a partial aggregate that does not group by a clustered probe key and is not
//!   estimated to have few groups (`group_count`), the collect form keeps the probe side's hash
//!   repartition, so the aggregate still sees each group in one partition (see
//!   `rewrite_feeding`).
//! - **One for one**: otherwise the node keeps the join's mode, children and properties.
//! - **Group join**: after the forms are chosen, a partial aggregate over an inner
//!   [`MphfJoinExec`] that groups by build-side columns is fused with it into an
//!   [`MphfGroupJoinExec`] (see `group_join`). A join that feeds such an aggregate directly
//!   is priced with it (both forms, and DataFusion's plan with its aggregate): the fused
//!   aggregate hashes no group value per pair. When that pricing declines the join, the join
//!   is still priced alone below; taken alone, it is fused all the same, which only removes
//!   work from the plan that was priced.
//! - **Swapped**: when only the probe (right) side's key is indexed, the join is mirrored
//!   (left ↔ right, join type swapped, a projection restores the column order) and run in the
//!   collect form; like the collect form, it is kept only when the sanity check accepts it.
//!
//! # Decision rule (costing)
//! The measurements behind these rules and their defaults are in benches/RESULTS.md, "Where the
//! planner's thresholds and device crossovers come from".
//!
//! - Decline when the index has fewer than `Tuning::join_min_slots` slots (default 4096): a small
//!   hash table stays in cache and costs no more than an MPHF query.
//! - Decline when the index has no dense-key table (string keys, sparse integers) and the probe
//!   key is not known to be clustered: every probe row then costs an MPHF query and its
//!   verification, more than DataFusion's vectorized hash probe. A probe key that is itself an
//!   indexed column with at least `Tuning::join_min_probe_rows_per_run` (default 2) rows per
//!   run of equal keys, measured when its index was built, is accepted: runs share one query.
//!   So is a probe key whose own index keeps row slots, in a form whose probe side hands the
//!   join that table's arrays (no filter, no hash repartition; see `join::translate`): its
//!   slots are translated, not looked up.
//! - Decline the one-for-one form of a `Partitioned` join beyond
//!   `Tuning::join_partitioned_max_partitions` (default 4) partitions. Each partition's slot
//!   table holds 1/P of the keys among all the index's slots; it is laid out by position among
//!   its occupied slots (`build`), and the P builds run each on its own thread
//!   (`build_threads`), so a plain join on slots pays on 16 partitions too, but the group join
//!   of TPC-H Q12 (a filtered build side, every probe row translated) loses there while the
//!   cost model prices it cheaper (benches/RESULTS.md, session 39). Under a
//!   `SinglePartitioned` aggregate the collect form keeps the probe side's hash repartition
//!   instead (one shared slot table).
//! - Decline when DataFusion would run the join with its dense-integer `ArrayMap` (one integer
//!   key, key range below `perfect_hash_join_small_build_threshold` or density above
//!   `perfect_hash_join_min_key_density`, estimated for the join DataFusion runs, the one
//!   swapped from included, from its build side's rows, duplicates included as DataFusion
//!   counts them, spread over its build partitions): a direct array index is cheaper than an
//!   MPHF query (`Tuning::join_yield_to_array_map`, default true).
//! - After these guard rails, each remaining form is priced by the cost model
//!   (`plan::cost`, `CostModel::slot_join_ns` against `hash_join_ns` of the join DataFusion runs
//!   in its place) and declined when it is not cheaper (`Tuning::compare_costs`, off under
//!   `mphf.costing = always`). What decides on many cores is the collect form's build: it is
//!   read once while every probe partition waits, where DataFusion's per-partition builds run
//!   at once, and an unclustered probe key reads one shared table at scattered places.

use std::rc::Rc;
use std::sync::Arc;

use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use ::datafusion::common::{JoinType, NullEquality, Result};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::Partitioning;
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::execution_plan::ChildrenPropertiesMode;
use ::datafusion::physical_plan::filter::FilterExec;
use ::datafusion::physical_plan::joins::utils::{reorder_output_after_swap, swap_join_projection, JoinFilter};
use ::datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use ::datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::sorts::sort::SortExec;
use ::datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use ::datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, ReplaceChildrenOptions};

use super::build::swept_slots;
use super::group_count;
use super::group_join::group_join_shape;
use super::scan_slots::{
    build_scan_slots_reach, probe_scan_slots_reach, slots_cross_exchange, with_build_scan_slots, with_probe_scan_slots,
};
use super::translate::translates_probe;
use super::{probes_membership, supports_join_type, MphfGroupJoinExec, MphfJoinExec};
use crate::datafusion::aggregate::{shared_estimates, RowEstimator};
use crate::datafusion::config::MphfConfig;
use crate::datafusion::plan::cost::{CostModel, Estimate, JoinShape, KeyKind, Lookup};
use crate::datafusion::plan::sanity::rewrite_is_sane;
use crate::datafusion::plan::scans;
use crate::datafusion::plan::verdicts::{self, Question};
use crate::datafusion::plan::{
    broadcasts_build_sides, build_side_broadcasts, join_type_broadcasts, runs_distributed, thresholds_for, Declined,
    Tuning,
};
use crate::datafusion::registry::{index_of_field, IndexHandle};
use crate::datafusion::slot_scan::{hands_table_arrays, scan_slots_position};
use crate::datafusion::table::MphfRelabelExec;

/// The physical optimizer rule installing [`MphfJoinExec`].
#[derive(Debug, Default)]
pub struct MphfJoinRule {}

impl MphfJoinRule {
    /// A new rule.
    pub fn new() -> Self {
        Self {}
    }
}

/// Costing inputs (the session's `Tuning` under `mphf.costing`, see `plan::thresholds_for`).
#[derive(Clone, Debug)]
pub(crate) struct Costing {
    min_slots: u64,
    min_probe_rows_per_run: f64,
    yield_to_array_map: bool,
    array_map_threshold: usize,
    array_map_density: f64,
    /// Most probe partitions of a `Partitioned` join rewritten in a collect form (0: any).
    collect_max_partitions: usize,
    /// Most partitions of a `Partitioned` join run one for one (a slot table per partition;
    /// 0: any).
    partitioned_max_partitions: usize,
    /// The cost model (`Tuning::costs`): the estimates `EXPLAIN` shows.
    model: CostModel,
    /// `Tuning::compare_costs`: decline a form estimated above DataFusion's hash join.
    compare_costs: bool,
    /// Row estimates, memoized for the plan being optimized (see `aggregate::shared_estimates`).
    rows: Rc<RowEstimator>,
    /// The plan is cut into stages for datafusion-distributed workers: a collect form only where
    /// its build side is broadcast.
    distributed: bool,
    /// The distributed planner broadcasts build sides (`plan::broadcasts_build_sides`).
    broadcast: bool,
}

impl Costing {
    /// The join rule's inputs from the session's thresholds `t` and DataFusion's `config`.
    pub(crate) fn of(t: &Tuning, config: &ConfigOptions) -> Self {
        Self {
            min_slots: t.join_min_slots,
            min_probe_rows_per_run: t.join_min_probe_rows_per_run,
            yield_to_array_map: t.join_yield_to_array_map,
            collect_max_partitions: t.join_collect_max_partitions,
            partitioned_max_partitions: t.join_partitioned_max_partitions,
            array_map_threshold: config.execution.perfect_hash_join_small_build_threshold,
            array_map_density: config.execution.perfect_hash_join_min_key_density,
            model: t.costs.clone(),
            compare_costs: t.compare_costs,
            rows: shared_estimates(),
            distributed: runs_distributed(config),
            broadcast: broadcasts_build_sides(config),
        }
    }

    /// Whether a `Partitioned` join with `probe_partitions` may run in a collect form. In a
    /// distributed plan only with a broadcast build side: the probe side then stays where it is
    /// read, where DataFusion's `Partitioned` join shuffles both sides by key.
    fn collect_allowed(&self, probe_partitions: usize) -> bool {
        (!self.distributed || self.broadcast)
            && (self.collect_max_partitions == 0 || probe_partitions <= self.collect_max_partitions)
    }
}

/// Whether column `col` of `plan` is the indexed column of a scan of its table, reached only
/// through operators that keep or drop rows but never repeat one (filters, projections,
/// repartitions, sorts, limits). Then the build side holds each key at most as often as the
/// table does, which the index's build counts say (unique for a primary key); a join or union
/// below could repeat keys, and the rule declines rather than assume.
fn comes_from_table_scan(plan: &Arc<dyn ExecutionPlan>, col: usize) -> bool {
    if plan.downcast_ref::<MphfRelabelExec>().is_some() {
        return true;
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        let input_col = match f.projection() {
            Some(p) => match p.get(col) {
                Some(&c) => c,
                None => return false,
            },
            None => col,
        };
        return comes_from_table_scan(f.input(), input_col);
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        return p
            .expr()
            .get(col)
            .and_then(|e| e.expr.downcast_ref::<Column>())
            .is_some_and(|c| comes_from_table_scan(p.input(), c.index()));
    }
    match plan.children().as_slice() {
        [child] if passes_rows(plan) => comes_from_table_scan(child, col),
        _ => false,
    }
}

/// Whether `plan` hands its child's rows on unchanged in content and columns (exchanges, sorts,
/// limits): a column of its output is the same column of its child's. Shared with the
/// aggregate rule's lineage.
pub(crate) fn passes_rows(plan: &Arc<dyn ExecutionPlan>) -> bool {
    plan.downcast_ref::<RepartitionExec>().is_some()
        || plan.downcast_ref::<CoalescePartitionsExec>().is_some()
        || plan.downcast_ref::<SortExec>().is_some()
        || plan.downcast_ref::<SortPreservingMergeExec>().is_some()
        || plan.downcast_ref::<GlobalLimitExec>().is_some()
        || plan.downcast_ref::<LocalLimitExec>().is_some()
}

/// The indexed key pair of `join` and its index, when the join is eligible.
pub(crate) fn indexed_key(join: &HashJoinExec) -> Option<(usize, Arc<IndexHandle>)> {
    if !supports_join_type(*join.join_type())
        || join.null_equality() != NullEquality::NullEqualsNothing
        || join.null_aware
        || join.fetch().is_some()
    {
        return None;
    }
    let left = join.left().schema();
    let right = join.right().schema();
    for (l, r) in join.on() {
        if l.data_type(&left).ok()? != r.data_type(&right).ok()? {
            return None;
        }
    }
    join.on().iter().enumerate().find_map(|(k, (l, r))| {
        let col = l.downcast_ref::<Column>()?;
        let field = left.fields().get(col.index())?;
        let handle = index_of_field(field)?;
        if !comes_from_table_scan(join.left(), col.index()) {
            return None;
        }
        let key_type = handle.index().keys().data_type().clone();
        (key_type == *field.data_type() && r.data_type(&right).ok()? == key_type).then_some((k, handle))
    })
}

/// Rows per run of equal keys of the probe key when it is an indexed column (measured when its
/// index was built), else 1: each run costs one MPHF query.
fn probe_rows_per_run(join: &HashJoinExec, key: usize) -> f64 {
    let right = join.right().schema();
    join.on()[key]
        .1
        .downcast_ref::<Column>()
        .and_then(|c| right.fields().get(c.index()))
        .and_then(|f| index_of_field(f))
        .and_then(|h| h.info().rows_per_run)
        .unwrap_or(1.0)
}

/// Whether DataFusion would build an `ArrayMap` for `vanilla`, the join it runs in place of the
/// candidate (key pair `key`; `index` is the candidate's). DataFusion decides per build
/// partition from that partition's rows (duplicates included) over its key range. The estimate
/// takes `vanilla`'s estimated build rows spread over its build partitions, and the key range
/// of the index its build key carries (the candidate's `index` when it carries none: the keys
/// that match lie in that range), which every hash partition spans.
fn vanilla_uses_array_map(vanilla: &HashJoinExec, key: usize, index: &IndexHandle, c: &Costing) -> bool {
    if vanilla.on().len() != 1 {
        return false;
    }
    let left = vanilla.left().schema();
    let own = vanilla.on()[key]
        .0
        .downcast_ref::<Column>()
        .and_then(|col| left.fields().get(col.index()))
        .and_then(|f| index_of_field(f));
    let index = own.as_deref().unwrap_or(index).index();
    if !index.keys().data_type().is_integer() {
        return false;
    }
    let Some((lo, hi)) = index.integer_key_range() else {
        return false;
    };
    let range = (hi as i128 - lo as i128) as f64;
    let partitions = match builds_once(vanilla) {
        true => 1,
        false => vanilla.left().output_partitioning().partition_count(),
    };
    let build_rows = c
        .rows
        .datafusion_rows(vanilla.left())
        .unwrap_or(index.stats().rows as f64);
    let rows = build_rows / partitions.max(1) as f64;
    range < c.array_map_threshold as f64 || rows / (range + 1.0) > c.array_map_density
}

/// `probe` spread round-robin over `partitions` when it has fewer (the collect form reads the
/// probe side in its own partitions; one partition would leave cores idle).
fn spread(probe: Arc<dyn ExecutionPlan>, partitions: usize) -> Result<Arc<dyn ExecutionPlan>> {
    if probe.output_partitioning().partition_count() >= partitions {
        return Ok(probe);
    }
    Ok(Arc::new(RepartitionExec::try_new(
        probe,
        Partitioning::RoundRobinBatch(partitions),
    )?))
}

/// `plan` without a top hash repartition (and, when `coalesce_too`, without a top
/// `CoalescePartitionsExec`): the exchanges a slot table makes unnecessary.
fn without_exchange(plan: &Arc<dyn ExecutionPlan>, coalesce_too: bool) -> Arc<dyn ExecutionPlan> {
    if let (true, Some(c)) = (coalesce_too, plan.downcast_ref::<CoalescePartitionsExec>()) {
        return Arc::clone(c.input());
    }
    match plan.downcast_ref::<RepartitionExec>() {
        Some(r) if matches!(r.partitioning(), Partitioning::Hash(..)) && !r.preserve_order() => Arc::clone(r.input()),
        _ => Arc::clone(plan),
    }
}

/// `build` as the single partition a `CollectLeft` build side must be.
fn collected(build: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
    if build.output_partitioning().partition_count() > 1 {
        Arc::new(CoalescePartitionsExec::new(build))
    } else {
        build
    }
}

/// What the rule can make of one join.
pub(crate) enum Forms {
    /// Not a candidate: no indexed build key, or a join the operator does not run.
    NotCandidate,
    /// A candidate left to DataFusion, and why.
    Declined(Declined),
    /// The one-for-one and collect forms, each `None` where the rule declines it (not both).
    Some(Option<MphfJoinExec>, Option<MphfJoinExec>),
}

/// The lookup strategy of `index`'s keys (integer keys with a dense table read it; others
/// query the MPHF, through the decoded copy when there is one).
fn build_lookup(index: &IndexHandle) -> Lookup {
    let index = index.index();
    if index.dense_lookup_bytes() > 0 {
        Lookup::Dense
    } else if index.flat_lookup_bytes() > 0 {
        Lookup::Flat
    } else {
        Lookup::Compact
    }
}

/// Whether `join` is a semi or anti join (its output holds one side's columns only).
fn is_semi_or_anti(join: &HashJoinExec) -> bool {
    matches!(
        join.join_type(),
        JoinType::LeftSemi | JoinType::RightSemi | JoinType::LeftAnti | JoinType::RightAnti
    )
}

/// Whether `join` reads its build side once for all probe partitions.
fn builds_once(join: &HashJoinExec) -> bool {
    *join.partition_mode() == PartitionMode::CollectLeft || join.left().output_partitioning().partition_count() <= 1
}

/// Which sides of a candidate form would read their slots from a slot-map scan (see
/// `scan_slots`). Found before the form is priced (`scan_slots_reach`); the scans are attached
/// only to a form the rule keeps, since rebuilding a side over its scan costs more than pricing
/// it, and most candidates are declined.
#[derive(Clone, Copy, Default)]
struct ScanSlots {
    build: bool,
    probe: bool,
}

impl ScanSlots {
    /// Whether `join`'s probe side, with these scans, hands its slots over for translation
    /// (see [`translates_probe`]).
    fn translates(self, join: &HashJoinExec, key: usize) -> bool {
        self.probe || translates_probe(join, key)
    }
}

/// The estimates of `join` (key pair `key`, indexed by `handle`) on slots and of `vanilla`, the
/// hash join DataFusion would run in its place (`join` itself, or the join it was rewritten or
/// swapped from). `rows_from` is `join` before its sides were given slots or lost their
/// exchanges, which change no row count: its rows are the ones asked (and already estimated
/// for the candidate), where `join`'s new nodes would be estimated again from their inputs.
/// `slots`: the scans `join` gets when it is kept, which price it as if attached (a side over
/// a slot-map scan keeps the side's partitioning, and the slot column goes last, out of the
/// way of every column the estimate reads).
#[allow(clippy::too_many_arguments)]
fn estimate_of(
    join: &HashJoinExec,
    rows_from: &HashJoinExec,
    vanilla: &HashJoinExec,
    handle: &IndexHandle,
    key: usize,
    costing: &Costing,
    above: Option<&AggregateExec>,
    slots: ScanSlots,
) -> Estimate {
    let model = &costing.model;
    let table_rows = handle.index().stats().rows as f64;
    let build_rows = costing.rows.rows(rows_from.left()).unwrap_or(table_rows);
    let lookup = build_lookup(handle);
    let left_key = join.on()[key].0.downcast_ref::<Column>().map(Column::index);
    let build_copies = slots.build
        || scan_slots_position(&join.left().schema(), handle).is_some()
        || (handle.index().has_row_slots() && left_key.is_some_and(|c| hands_table_arrays(join.left(), c)));
    let probe_rows = costing.rows.rows(rows_from.right()).unwrap_or(build_rows);
    let threads = join.right().output_partitioning().partition_count().max(1);
    // A partitioned build lays out one table per partition, of its share of the rows.
    let rows_per_table = match builds_once(join) {
        true => build_rows,
        false => build_rows / threads as f64,
    };
    let shape = JoinShape {
        build_rows,
        table_slots: swept_slots(rows_per_table, handle.index().len() as f64),
        probe_rows,
        hash_build_rows: costing.rows.rows(vanilla.left()).unwrap_or(build_rows),
        hash_probe_rows: costing.rows.rows(vanilla.right()).unwrap_or(probe_rows),
        threads,
        key: KeyKind::of(handle.index().key_type()),
        build_lookup: match build_copies {
            true => Lookup::Copied,
            false => lookup,
        },
        probe_lookup: match slots.translates(join, key) {
            true => Lookup::Copied,
            false => lookup,
        },
        probe_rows_per_run: probe_rows_per_run(join, key),
        build_collected: builds_once(join),
        hash_build_collected: builds_once(vanilla),
        build_keys_repeat: handle.index().stats().had_duplicates(),
        semi: is_semi_or_anti(join),
        membership_bytes: probes_membership(join, !handle.index().stats().had_duplicates())
            .then(|| handle.index().len() as f64 / 8.0),
        group_join: above.and_then(|agg| group_join_shape(agg, rows_from, &costing.rows)),
    };
    Estimate {
        mphf_ns: model.slot_join_ns(&shape),
        hash_ns: model.hash_join_ns(&shape),
        other_device_ns: None,
        on_gpu: false,
    }
}

/// Which forms [`candidates`] is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// Both forms, the collect form over a spread probe side.
    Both,
    /// Only the collect form, keeping the probe side's hash repartition (its output stays hash
    /// partitioned on the key, see [`rewrite_feeding`]). The one-for-one form is neither
    /// priced nor built, and a decline gives no reason (the caller keeps the join as it is).
    CollectKeepingProbeExchange,
}

/// The candidate forms of `join` (one for one, collect) that `wanted` asks for, or why the rule
/// declines them. `vanilla` is the join DataFusion runs in its place (`join` itself, or the
/// join `join` was swapped from), which the estimates price. Under `Tuning::compare_costs`, a
/// form estimated above `vanilla` is declined.
pub(crate) fn candidates(
    join: &HashJoinExec,
    vanilla: &HashJoinExec,
    costing: &Costing,
    wanted: Wanted,
    above: Option<&AggregateExec>,
) -> Result<Forms> {
    let Some((key, handle)) = indexed_key(join) else {
        return Ok(Forms::NotCandidate);
    };
    let slots = handle.index().len();
    let unpriced = |reason: String| Ok(Forms::Declined(Declined::new(reason, None)));
    if slots < costing.min_slots {
        return unpriced(format!(
            "{slots} slots, fewer than join_min_slots ({}): the hash table stays in cache",
            costing.min_slots
        ));
    }
    // Without a dense-key table each probe run costs an MPHF query: worth it for clustered
    // probe keys, or when the probe key's own index translates its slots (per form).
    let rows_per_run = probe_rows_per_run(join, key);
    let per_row_lookup_pays = handle.index().dense_lookup_bytes() > 0 || rows_per_run >= costing.min_probe_rows_per_run;
    let collect_left = builds_once(join);
    // In a distributed plan the build side is broadcast to every task of the stage
    // (`distributed::broadcast`); without that the stage would run in one task.
    if collect_left && costing.distributed && !(costing.broadcast && build_side_broadcasts(join)) {
        return unpriced(format!(
            "collect form in a distributed plan whose build side is not broadcast (a {} join{}{}): \
             its stage would run in a single task",
            join.join_type(),
            if join.null_aware { ", null-aware" } else { "" },
            if costing.broadcast { "" } else { ", broadcast_joins off" },
        ));
    }
    let partitions = if collect_left {
        1
    } else {
        join.left().output_partitioning().partition_count()
    };
    if costing.yield_to_array_map && vanilla_uses_array_map(vanilla, key, &handle, costing) {
        return unpriced("DataFusion runs this join with its dense-integer ArrayMap, one array read per row".into());
    }
    // One for one, a `Partitioned` join builds a slot table per partition, each spanning the
    // whole index while holding 1/P of its keys (see the module docs).
    let tables_pay =
        collect_left || costing.partitioned_max_partitions == 0 || partitions <= costing.partitioned_max_partitions;
    // A probe key with slot maps hands over its slots from the scan (translated, no lookup).
    // So does a build key with slot maps (copied, no lookup). In a distributed plan a side
    // whose slots would cross a network exchange looks its keys up instead where the dense key
    // table makes the lookup one array read (see `scan_slots`).
    let dense = handle.index().dense_lookup_bytes() > 0;
    let ships = |side: &Arc<dyn ExecutionPlan>| costing.distributed && dense && slots_cross_exchange(side);
    // The scans `form` would get (the build side's only when `build` asks).
    let slots_of = |form: &HashJoinExec, build: bool| -> Result<ScanSlots> {
        Ok(ScanSlots {
            probe: !ships(form.right()) && probe_scan_slots_reach(form, key)?,
            build: build && !ships(form.left()) && build_scan_slots_reach(form, key, &handle)?,
        })
    };
    // The one-for-one form is `join` itself; its scans are found only where the partition
    // count leaves it a candidate, else only whether its probe side would translate its own
    // slots (for the reasons below). Nothing of it is looked at where it is not wanted.
    let wants_one = wanted == Wanted::Both;
    let one_slots = match wants_one {
        true => slots_of(join, tables_pay)?,
        false => ScanSlots::default(),
    };
    let one_translates = wants_one && one_slots.translates(join, key);
    let mut reasons = Vec::new();
    if !tables_pay {
        reasons.push(format!(
            "one for one: {partitions} partitions, more than join_partitioned_max_partitions ({}), each with a slot table of {slots} slots",
            costing.partitioned_max_partitions
        ));
    }
    let unclustered = || {
        format!(
            "no dense key table and an unclustered probe key ({rows_per_run:.1} rows per run, fewer than {}): one MPHF query per probe row",
            costing.min_probe_rows_per_run
        )
    };
    if !per_row_lookup_pays && !one_translates {
        reasons.push(unclustered());
    }
    // Each form is priced with the row counts of the candidate's own sides (see `estimate_of`).
    // A form is `None` for `join` itself, copied only when it is kept.
    let priced = |form: Option<HashJoinExec>, slots: ScanSlots| -> (Option<HashJoinExec>, ScanSlots, Estimate) {
        let estimate = estimate_of(
            form.as_ref().unwrap_or(join),
            join,
            vanilla,
            &handle,
            key,
            costing,
            above,
            slots,
        );
        (form, slots, estimate)
    };
    let one_for_one =
        (wants_one && tables_pay && (per_row_lookup_pays || one_translates)).then(|| priced(None, one_slots));
    // CollectLeft (and Auto) joins are already in their only form.
    let probe_partitions = join.right().output_partitioning().partition_count();
    let collect = if *join.partition_mode() != PartitionMode::Partitioned
        || !costing.collect_allowed(probe_partitions)
        || (costing.distributed && !broadcast_pays(join, costing))
    {
        None
    } else {
        let left = collected(without_exchange(join.left(), false));
        let right = if wanted == Wanted::CollectKeepingProbeExchange {
            Arc::clone(join.right())
        } else {
            spread(without_exchange(join.right(), false), probe_partitions)?
        };
        let collected = join
            .builder()
            .with_partition_mode(PartitionMode::CollectLeft)
            .with_new_children(vec![left, right])?
            .recompute_properties()
            .build()?;
        let slots = slots_of(&collected, true)?;
        let translates = slots.translates(&collected, key);
        if !per_row_lookup_pays && !translates && one_translates {
            reasons.push(format!("collect form: {}", unclustered()));
        }
        (per_row_lookup_pays || translates).then(|| priced(Some(collected), slots))
    };
    // The model's verdict on each remaining form; the cheaper form's estimate is the one a
    // decline shows. A kept form gets its scans.
    let mut cheapest: Option<Estimate> = None;
    let mut affordable =
        |form: Option<(Option<HashJoinExec>, ScanSlots, Estimate)>, name: &str| -> Result<Option<MphfJoinExec>> {
            let Some((form, slots, estimate)) = form else {
                return Ok(None);
            };
            if cheapest.is_none_or(|c| estimate.mphf_ns < c.mphf_ns) {
                cheapest = Some(estimate);
            }
            if costing.compare_costs && estimate.mphf_ns >= estimate.hash_ns {
                reasons.push(format!("{name}: DataFusion's hash join is estimated cheaper"));
                return Ok(None);
            }
            let form = match form {
                Some(form) => form,
                None => join.builder().build()?,
            };
            let form = match slots.probe {
                true => with_probe_scan_slots(&form, key)?.unwrap_or(form),
                false => form,
            };
            let form = match slots.build {
                true => with_build_scan_slots(&form, key, &handle)?.unwrap_or(form),
                false => form,
            };
            Ok(Some(
                MphfJoinExec::new(Arc::new(form), Arc::clone(&handle), key).with_estimate(Some(estimate)),
            ))
        };
    let one_for_one = affordable(one_for_one, "one for one")?;
    let collect = affordable(collect, "collect form")?;
    Ok(match (one_for_one, collect) {
        (None, None) => {
            let estimate = match wanted {
                Wanted::Both => Some(cheapest.unwrap_or_else(|| {
                    estimate_of(join, join, vanilla, &handle, key, costing, above, ScanSlots::default())
                })),
                Wanted::CollectKeepingProbeExchange => cheapest,
            };
            reasons.dedup();
            Forms::Declined(Declined::new(reasons.join("; "), estimate))
        }
        (one, collect) => Forms::Some(one, collect),
    })
}

/// Least estimated probe rows per build row for a distributed `Partitioned` join to run in the
/// collect form. Every task of the join's stage receives and builds the whole broadcast build
/// side, where the `Partitioned` join shuffles each side once; clusters run 2–8 tasks a stage,
/// so the broadcast costs less than the probe side's shuffle only when the build side is
/// several times smaller (benches/RESULTS.md, session 36: the sparse suite's join with a
/// filtered dimension, 40 probe rows a build row, gained; TPC-H Q8, whose filtered orders were
/// broadcast to a smaller probe side, lost).
const BROADCAST_MIN_PROBE_ROWS_PER_BUILD_ROW: f64 = 8.0;

/// Whether the `Partitioned` `join` of a distributed plan may be rewritten in the collect form
/// with a broadcast build side: its join type allows the broadcast, and its estimated probe
/// rows are at least [`BROADCAST_MIN_PROBE_ROWS_PER_BUILD_ROW`] times its build rows (unknown
/// estimates: no).
fn broadcast_pays(join: &HashJoinExec, costing: &Costing) -> bool {
    build_side_broadcasts(join) && probe_outnumbers_build(join.left(), join.right(), costing)
}

/// Whether the estimated rows of `probe` are at least [`BROADCAST_MIN_PROBE_ROWS_PER_BUILD_ROW`]
/// times those of `build` (unknown estimates: no).
fn probe_outnumbers_build(build: &Arc<dyn ExecutionPlan>, probe: &Arc<dyn ExecutionPlan>, costing: &Costing) -> bool {
    match (costing.rows.datafusion_rows(build), costing.rows.datafusion_rows(probe)) {
        (Some(build), Some(probe)) => probe >= BROADCAST_MIN_PROBE_ROWS_PER_BUILD_ROW * build,
        _ => false,
    }
}

/// `join` with its inputs swapped (the indexed side becomes the build side), in the collect
/// form: the new build side coalesced, the new probe side read in its own partitions. The
/// output may differ in partitioning from `join`'s, so only the collect rewrite uses it.
pub(crate) fn swapped(join: &HashJoinExec) -> Result<HashJoinExec> {
    let left = collected(without_exchange(join.right(), true));
    let right = spread(
        without_exchange(join.left(), true),
        join.properties().output_partitioning().partition_count(),
    )?;
    let on = join.on().iter().map(|(l, r)| (Arc::clone(r), Arc::clone(l))).collect();
    let projection = swap_join_projection(
        join.left().schema().fields().len(),
        join.right().schema().fields().len(),
        join.projection.as_deref(),
        join.join_type(),
    );
    join.builder()
        .reset_state()
        .with_type(join.join_type().swap())
        .with_new_children(vec![left, right])?
        .with_on(on)
        .with_filter(join.filter().map(JoinFilter::swap))
        .with_projection(projection)
        .with_partition_mode(PartitionMode::CollectLeft)
        .recompute_properties()
        .build()
}

/// The swapped collect form of `join` (the plan node `node`) when its probe (right) side holds
/// the indexed key, with the projection that restores `join`'s column order.
fn try_swapped(
    node: &Arc<dyn ExecutionPlan>,
    join: &HashJoinExec,
    costing: &Costing,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    if indexed_key(join).is_some() || !swappable(join, costing) || !probe_key_indexed(join) {
        return Ok(None);
    }
    // The swapped join is CollectLeft: its one-for-one form is the collect form.
    let collect = match candidates(&swapped(join)?, join, costing, Wanted::Both, None)? {
        Forms::Some(Some(collect), _) => collect,
        Forms::Declined(declined) => {
            verdicts::record(Question::SwappedJoin, node, None, &declined);
            return Ok(None);
        }
        _ => return Ok(None),
    };
    let exec: Arc<dyn ExecutionPlan> = Arc::new(collect);
    let keeps_order = is_semi_or_anti(join) || join.projection.is_some();
    if keeps_order {
        return Ok(Some(exec));
    }
    Ok(Some(reorder_output_after_swap(
        exec,
        &join.left().schema(),
        &join.right().schema(),
    )?))
}

/// Whether `join` could run swapped (its probe side as the build side) in the collect form; in
/// a distributed plan, with that build side broadcast where it pays (see [`broadcast_pays`]).
pub(crate) fn swappable(join: &HashJoinExec, costing: &Costing) -> bool {
    supports_join_type(join.join_type().swap())
        && !join.null_aware
        && (!costing.distributed
            || (join_type_broadcasts(&join.join_type().swap())
                && probe_outnumbers_build(join.right(), join.left(), costing)))
        && join.null_equality() == NullEquality::NullEqualsNothing
        && join.fetch().is_none()
        && (*join.partition_mode() != PartitionMode::Partitioned
            || costing.collect_allowed(join.properties().output_partitioning().partition_count()))
}

/// Whether one of `join`'s probe keys is a column with an index label (a cheap test before
/// [`swapped`] builds the mirrored join).
pub(crate) fn probe_key_indexed(join: &HashJoinExec) -> bool {
    let right = join.right().schema();
    join.on().iter().any(|(_, r)| {
        r.downcast_ref::<Column>()
            .and_then(|c| right.fields().get(c.index()))
            .is_some_and(|f| index_of_field(f).is_some())
    })
}

/// Replaces eligible joins top-down, preferring the collect form when `collect`.
fn rewrite(plan: Arc<dyn ExecutionPlan>, collect: bool, costing: &Costing) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_down(|node| {
        if let Some(agg) = node.downcast_ref::<AggregateExec>() {
            if collect {
                if let Some(input) = rewrite_feeding(agg, agg.input(), costing)? {
                    return Ok(Transformed::yes(with_child(&node, input)?));
                }
            }
            // A join under an aggregate it would run fused with is priced with that aggregate.
            if let Some(join) = agg.input().downcast_ref::<HashJoinExec>() {
                let forms = candidates(join, join, costing, Wanted::Both, Some(agg))?;
                if let Forms::Declined(declined) = &forms {
                    verdicts::record(Question::Join, agg.input(), Some(&node), declined);
                }
                if let Some(input) = chosen_form(forms, collect) {
                    return Ok(Transformed::yes(with_child(&node, input)?));
                }
            }
            return Ok(Transformed::no(node));
        }
        let Some(join) = node.downcast_ref::<HashJoinExec>() else {
            return Ok(Transformed::no(node));
        };
        if collect {
            if let Some(exec) = try_swapped(&node, join, costing)? {
                return Ok(Transformed::yes(exec));
            }
        }
        let forms = candidates(join, join, costing, Wanted::Both, None)?;
        if let Forms::Declined(declined) = &forms {
            verdicts::record(Question::Join, &node, None, declined);
        }
        Ok(match chosen_form(forms, collect) {
            Some(exec) => Transformed::yes(exec),
            None => Transformed::no(node),
        })
    })
    .data()
}

/// The form the rewrite takes of a join's `forms`: the collect form when `collect` allows it,
/// else the one-for-one form; `None` when both were declined.
fn chosen_form(forms: Forms, collect: bool) -> Option<Arc<dyn ExecutionPlan>> {
    match forms {
        Forms::Some(_, Some(c)) if collect => Some(Arc::new(c)),
        Forms::Some(Some(one), _) => Some(Arc::new(one)),
        _ => None,
    }
}

/// `plan`, the input of the partial aggregate `agg`, with the `Partitioned` join it reads
/// (through projections and filters) in the collect form that keeps the probe side's hash
/// repartition; `None` to leave it to the plain rewrite.
///
/// Why: a `Partitioned` join's output is hash partitioned on the key, so a partial aggregate
/// above it sees each group in one partition only and reduces its rows well; the plain collect
/// form reads the probe side in its own partitions, and a partial aggregate grouping by a
/// build-side column (`GROUP BY c_name` over `orders ⋈ customer`) then sees nearly every group
/// in every partition, which on many cores makes the query slower than vanilla (measurements:
/// benches/RESULTS.md, "Where the planner's thresholds and device crossovers come from"). Kept
/// plain when the aggregate groups by the probe key and that key is clustered in its table
/// (GROUP BY l_orderkey over lineitem ⋈ orders), whose partitions already hold disjoint key
/// ranges, and when the aggregate has few groups (see [`few_groups`]).
fn rewrite_feeding(
    agg: &AggregateExec,
    plan: &Arc<dyn ExecutionPlan>,
    costing: &Costing,
) -> Result<Option<Arc<dyn ExecutionPlan>>> {
    // Without group columns (a global aggregate) the distribution does not matter. A
    // `SinglePartitioned` aggregate needs the join's hash partitioning: the probe exchange stays.
    let single = *agg.mode() == AggregateMode::SinglePartitioned;
    if !(single || *agg.mode() == AggregateMode::Partial) || agg.group_expr().expr().is_empty() {
        return Ok(None);
    }
    // In a distributed plan the probe side's hash repartition is a network shuffle of every
    // probe row, which the broadcast build side of the plain collect form makes unnecessary.
    if costing.distributed && !single {
        return Ok(None);
    }
    let passes = plan.downcast_ref::<ProjectionExec>().is_some() || plan.downcast_ref::<FilterExec>().is_some();
    if let (true, [child]) = (passes, plan.children().as_slice()) {
        return match rewrite_feeding(agg, child, costing)? {
            Some(c) => Ok(Some(with_child(plan, c)?)),
            None => Ok(None),
        };
    }
    let Some(join) = plan.downcast_ref::<HashJoinExec>() else {
        return Ok(None);
    };
    if *join.partition_mode() != PartitionMode::Partitioned
        || (!single && (groups_by_clustered_probe_key(agg, join, costing) || few_groups(agg, join, &costing.rows)))
    {
        return Ok(None);
    }
    Ok(
        match candidates(join, join, costing, Wanted::CollectKeepingProbeExchange, None)? {
            Forms::Some(_, Some(c)) => Some(Arc::new(c) as Arc<dyn ExecutionPlan>),
            _ => None,
        },
    )
}

/// Whether `agg` is estimated to have so few groups (see [`group_count`]) that all its input
/// partitions together emit at most 1/[`FEW_GROUPS_PER_PROBE_ROW`] as many partial rows as the
/// join's probe side has rows: then the probe side's hash repartition moves every probe row to
/// save the final aggregate next to nothing.
fn few_groups(agg: &AggregateExec, join: &HashJoinExec, estimates: &RowEstimator) -> bool {
    let Some(groups) = group_count::estimated_groups(agg) else {
        return false;
    };
    let probe = join.right();
    let partitions = probe.output_partitioning().partition_count().max(1) as f64;
    let Some(rows) = estimates.datafusion_rows(probe) else {
        return false;
    };
    partitions * groups * FEW_GROUPS_PER_PROBE_ROW <= rows
}

/// See [`few_groups`].
const FEW_GROUPS_PER_PROBE_ROW: f64 = 8.0;

/// `plan` with each partial aggregate that reads an [`MphfJoinExec`] and groups by build-side
/// columns fused with it (see [`MphfGroupJoinExec`]). The fused node keeps the aggregate's
/// schema, partitioning and the join's input requirements, so the plan stays valid.
fn fuse_group_joins(plan: Arc<dyn ExecutionPlan>, estimates: &RowEstimator) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some(agg) = node.downcast_ref::<AggregateExec>() else {
            return Ok(Transformed::no(node));
        };
        Ok(match MphfGroupJoinExec::try_fuse(&Arc::new(agg.clone()), estimates)? {
            Some(fused) => Transformed::yes(Arc::new(fused) as Arc<dyn ExecutionPlan>),
            None => Transformed::no(node),
        })
    })
    .data()
}

/// `plan` over the single new child `child`, its properties recomputed.
fn with_child(plan: &Arc<dyn ExecutionPlan>, child: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    Arc::clone(plan).replace_children(
        vec![child],
        ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
    )
}

/// Whether `agg` groups by (a column named like) one of `join`'s probe keys that is an indexed
/// column clustered in its table.
fn groups_by_clustered_probe_key(agg: &AggregateExec, join: &HashJoinExec, costing: &Costing) -> bool {
    let input = agg.input_schema();
    let group_names: Vec<&str> = agg
        .group_expr()
        .expr()
        .iter()
        .filter_map(|(e, _)| e.downcast_ref::<Column>())
        .filter_map(|c| input.fields().get(c.index()).map(|f| f.name().as_str()))
        .collect();
    (0..join.on().len()).any(|k| {
        let right = join.right().schema();
        let Some(field) = join.on()[k]
            .1
            .downcast_ref::<Column>()
            .and_then(|c| right.fields().get(c.index()).cloned())
        else {
            return false;
        };
        group_names.contains(&field.name().as_str())
            && probe_rows_per_run(join, k) >= costing.min_probe_rows_per_run.max(2.0)
    })
}

impl PhysicalOptimizerRule for MphfJoinRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        verdicts::clear(&[Question::Join, Question::SwappedJoin]);
        let _scans = scans::pass();
        let Some(cfg) = config.extensions.get::<MphfConfig>() else {
            return Ok(plan);
        };
        let Some(t) = thresholds_for(cfg, config).filter(|_| cfg.enable_join) else {
            return Ok(plan);
        };
        let costing = Costing::of(&t, config);
        let collected = rewrite(Arc::clone(&plan), true, &costing)?;
        let joined = match rewrite_is_sane(&plan, &collected, config) {
            true => collected,
            false => rewrite(plan, false, &costing)?,
        };
        fuse_group_joins(joined, &costing.rows)
    }

    fn name(&self) -> &str {
        "mphf_join"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
