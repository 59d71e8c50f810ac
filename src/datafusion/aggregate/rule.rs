//! `MphfAggregateRule`: swaps eligible `AggregateExec`s for [`MphfAggregateExec`]s.
//!
//! The rule runs after DataFusion's own physical rules (it is appended by
//! [`with_mphf`](crate::datafusion::with_mphf)), so it sees the final distributed plan and replaces
//! nodes one for one: the new node keeps the old node's schema, partitioning and input
//! requirements. It is gated on `mphf.enable_aggregate` (default true).
//!
//! # Decision rule (costing)
//! The measurements behind these rules and their defaults are in benches/RESULTS.md, "Where the
//! planner's thresholds and device crossovers come from".
//!
//! - Decline when the index has fewer than [`MIN_SLOTS`] slots: a hash table that small stays in
//!   cache, DataFusion's vectorized hashing is as fast as an MPHF query, and the slot arrays buy
//!   nothing.
//! - Decline when the input's row-count estimate ([`estimate`](super::estimate): DataFusion's,
//!   corrected through joins on unique indexed keys and through filters over in-memory tables
//!   by evaluating them on a sample) is known and
//!   `input partitions × slots > rows × Tuning::aggregate_max_slot_entries_per_row` (default 4):
//!   every input partition keeps a slot → group array of the full slot count (4 bytes a slot)
//!   and scans it to emit its partial, so the slot arrays must not outgrow the rows by much.
//!   A `SinglePartitioned` aggregate (its input already hash-partitioned on the key, e.g. after
//!   a partitioned join) uses `Tuning::aggregate_max_slot_entries_per_row_partitioned`
//!   (default 1): each partition touches a 1/P share of its slot array at random, so the arrays
//!   cost more per row than over a scan.
//!   This is also the rule for a filter that leaves few keys: the rows it keeps are what the
//!   slot arrays are weighed against (with few rows left, the slot arrays' merge and emission
//!   cost what hashing those rows does), so the sampled estimate of a selective filter declines
//!   the operator.
//! - Decline when the indexed column is not clustered: fewer than
//!   `Tuning::aggregate_min_rows_per_run` (default 2) rows per run of equal keys in table order,
//!   measured when the index is built. The operator queries the MPHF once per run (the lookup
//!   reuses the slot of a repeated key), and an MPHF query costs more than DataFusion's
//!   vectorized hashing of one row: one query per row loses, a few rows per run win. Indexes
//!   with a dense-key table (integer keys in a narrow range,
//!   `Tuning::dense_lookup_max_bytes_per_key`) skip this check: their lookups are one array
//!   read. So do byte keys (strings, binary) when the index has its decoded MPHF copy
//!   ([`FlatMphf`](crate::core::flat::FlatMphf)): a verified lookup then costs less per row than
//!   DataFusion's partial aggregation of a string key. The exemption holds only for keys read
//!   straight from a scan, not through a join (there it loses on many partitions). When that
//!   scan is of an in-memory table, the index's row slots (`core::column::row_slots`) replace
//!   the lookup by a copy.
//!
//! - The SlotMerge form over an unclustered key with fewer than [`RANGES_BELOW_ROWS_PER_SLOT`]
//!   estimated rows per slot and input partition runs in the range form (see
//!   [`ranges`](super::ranges)), which keeps no per-partition slot arrays: its slot-entries
//!   limit counts the slots once, not once per input partition. A partial admitted on that
//!   count alone is put back when no final aggregate merges it.
//!
//! - Several group expressions: one of them must be an indexed column on which all the others
//!   depend (see [`lineage`](super::lineage)); the first such column is the key.
//!
//! # Device (`mphf.aggregate_device`, shown as `device=` in EXPLAIN)
//! `gpu` places every supported aggregation on the GPU (see `aggregate::gpu`: one key column,
//! count/sum/min/max/avg over integer, float and decimal columns); `auto` does so when a GPU is
//! usable, the input is estimated at [`GPU_MIN_ROWS`] rows or more and at
//! [`GPU_MIN_ROWS_PER_SLOT`] rows per slot, and the scan does not hand the slots over (slot maps
//! or row slots: the CPU then has no lookup to do, while the GPU path still uploads and looks up
//! every key); `cpu` never. A GPU-placed node skips the CPU
//! costing above (a lookup costs the GPU the same clustered or not, and small slot counts are no
//! loss); in the per-partition form it keeps a slot-entries limit, the partitioned one
//! (`Tuning::aggregate_max_slot_entries_per_row_partitioned`, default 1) whatever the mode: every
//! partition's GPU call downloads and converts states for the whole slot range, so many
//! partitions over many slots lose to the CPU (measurements: benches/RESULTS.md, same section).
//!
//! Both thresholds are session options, so tests can force the operator on small data.

use std::sync::Arc;

use ::datafusion::arrow::datatypes::DataType;
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use ::datafusion::common::Result;
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, ReplaceChildrenOptions,
};

use super::estimate::RowEstimator;
use super::lineage::depends_on_key;
use super::{with_new_input, MergeForm, MphfAggregateExec, MphfMergedAggregateExec, Placement};
use crate::datafusion::config::MphfConfig;
use crate::datafusion::plan::thresholds_for;
use crate::datafusion::registry::{index_of_field, slot_index_of_field, IndexHandle};
use crate::datafusion::slot_scan::{attach_scan_slots, hands_table_arrays};
use crate::device::Device;

/// Default of `Tuning::aggregate_min_slots`: indexes with fewer slots are left to DataFusion's
/// hash aggregation.
pub const MIN_SLOTS: u64 = 4096;

/// The costing thresholds (the session's `Tuning` under `mphf.costing`, see `plan::thresholds_for`).
#[derive(Clone, Copy, Debug)]
pub struct Costing {
    /// Fewest slots worth the operator.
    pub min_slots: u64,
    /// Fewest rows per run of equal keys (clustering) of the indexed column.
    pub min_rows_per_run: f64,
    /// Most slot-array entries (input partitions × slots) per input row.
    pub max_slot_entries_per_row: f64,
    /// The same for a `SinglePartitioned` aggregate (input hash-partitioned on the key).
    pub max_slot_entries_per_row_partitioned: f64,
    /// Several group expressions need a proof that the others depend on the indexed one.
    pub require_dependence: bool,
    /// `mphf.aggregate_device`.
    pub device: Device,
    /// `Tuning::aggregate_gpu_min_rows`: smallest estimated input for `Device::Auto` to pick the GPU.
    pub gpu_min_rows: u64,
    /// `Tuning::gpu_emulation`: the GPU placement's algorithm runs on the CPU.
    pub gpu_emulation: bool,
}

/// Default of `Tuning::aggregate_gpu_min_rows`: where, on the H200 host, the GPU placement
/// stops losing to our CPU operator on all cores for clustered keys. Smaller inputs ran slower
/// on the GPU, inputs of a few million rows were on par, and the GPU's lead grows with the input
/// (measurements: benches/RESULTS.md, "Where the planner's thresholds and device crossovers come
/// from"; benches/RESULTS-gpu.md, "The GROUP BY operator and `mphf_index` on the GPU").
pub const GPU_MIN_ROWS: u64 = 1 << 22;

/// `Device::Auto` also needs this many input rows per slot: with about one row per group
/// (GROUP BY o_orderkey) the per-slot results and their merge cost as much as the rows, and the
/// GPU loses to the hash aggregation (measurements: benches/RESULTS.md, "Where the planner's
/// thresholds and device crossovers come from").
pub const GPU_MIN_ROWS_PER_SLOT: f64 = 2.0;

/// The GPU placement of `agg` (grouped by `key_pos`, an index of `slots` slots) when the
/// session's device choice and the input's size call for it and its aggregates run there.
fn gpu_placement(
    agg: &AggregateExec,
    key_pos: usize,
    key_is_slot: bool,
    slots_at_hand: bool,
    slots: u64,
    costing: &Costing,
    estimates: &RowEstimator,
) -> Option<Placement> {
    // Slots handed over by the scan (slot maps, row slots) leave the CPU no lookup to do; the
    // GPU would still upload the keys and look them up.
    let pays = || {
        !slots_at_hand
            && estimates
                .rows(agg.input())
                .is_some_and(|rows| rows >= costing.gpu_min_rows as f64 && rows >= GPU_MIN_ROWS_PER_SLOT * slots as f64)
    };
    let wanted = crate::placement::wants_gpu(costing.device, pays);
    if !wanted || key_is_slot {
        return None;
    }
    Placement::gpu_for(agg, key_pos, costing.gpu_emulation).ok()
}

/// The physical optimizer rule installing [`MphfAggregateExec`].
#[derive(Debug, Default)]
pub struct MphfAggregateRule {}

impl MphfAggregateRule {
    /// A new rule.
    pub fn new() -> Self {
        Self {}
    }
}

/// `Some(exec)` when `agg` can run on slots; `Ok(None)` (quiet fallback) otherwise. `merge`:
/// the node is meant for the SlotMerge form (on the GPU: one partial for all input partitions,
/// so no per-partition slot arrays to cost).
/// `estimates` holds the row estimates of the pass (see [`RowEstimator`]).
fn try_as_mphf_aggregate(
    agg: &AggregateExec,
    costing: &Costing,
    merge: bool,
    estimates: &RowEstimator,
) -> Result<Option<MphfAggregateExec>> {
    // Partial, Single and SinglePartitioned read raw rows; Final modes merge states of possibly
    // different keys per partition and stay DataFusion's; PartialReduce is left alone.
    if !matches!(
        agg.mode(),
        AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
    ) {
        return Ok(None);
    }
    let group_by = agg.group_expr();
    // Grouping sets (ROLLUP/CUBE) add a grouping id column and null-filled keys.
    if !group_by.is_single() || group_by.expr().is_empty() {
        return Ok(None);
    }
    // FILTER clauses and ordered aggregates need per-row masks / sorted input we do not feed.
    if agg.filter_expr().iter().any(Option::is_some) || agg.aggr_expr().iter().any(|a| !a.order_bys().is_empty()) {
        return Ok(None);
    }
    // TopK aggregation (limit_options) and streaming aggregation promise orders/limits we don't keep.
    if agg.limit_options().is_some() || agg.properties().output_ordering().is_some() {
        return Ok(None);
    }
    let Some((key_pos, handle, key_is_slot)) = indexed_key(agg, costing.require_dependence) else {
        return Ok(None);
    };
    // Over a Parquet table with slot maps the scan hands over every row's slot: no lookup.
    let scan_slots = if key_is_slot {
        None
    } else {
        match agg.group_expr().expr()[key_pos].0.downcast_ref::<Column>() {
            Some(col) => attach_scan_slots(agg.input(), col.index(), &handle)?,
            None => None,
        }
    };
    let with_slots = |agg: &AggregateExec| -> Result<Arc<AggregateExec>> {
        let agg = Arc::new(agg.clone());
        match &scan_slots {
            Some((input, _)) => with_new_input(
                &agg,
                vec![Arc::clone(input)],
                ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
            ),
            None => Ok(agg),
        }
    };
    let index = handle.index();
    let slots = index.len();
    // Keys read as an in-memory table's own arrays find their slots in the row slots (a copy).
    let reads_row_slots = index.has_row_slots()
        && agg.group_expr().expr()[key_pos]
            .0
            .downcast_ref::<Column>()
            .is_some_and(|c| hands_table_arrays(agg.input(), c.index()));
    // Every input partition keeps slot arrays of the index's size, unless the partials are
    // to be merged in the range form, which keeps none (the rows are moved instead).
    let slot_entries_fit = |limit: f64, per_partition: bool| {
        estimates.rows(agg.input()).is_none_or(|rows| {
            let partitions = match per_partition {
                true => agg.input().output_partitioning().partition_count().max(1) as f64,
                false => 1.0,
            };
            partitions * slots as f64 <= rows * limit
        })
    };
    // On the GPU a lookup costs the same clustered or not, and a small slot count is no loss.
    if let Some(placement) = gpu_placement(
        agg,
        key_pos,
        key_is_slot,
        scan_slots.is_some() || reads_row_slots,
        slots,
        costing,
        estimates,
    ) {
        if merge || slot_entries_fit(costing.max_slot_entries_per_row_partitioned, true) {
            let exec = MphfAggregateExec::new(Arc::new(agg.clone()), handle, key_pos).with_placement(placement);
            return Ok(Some(exec));
        }
    }
    if slots < costing.min_slots {
        return Ok(None);
    }
    // With a dense-key table a lookup is one array read, clustered or not; slots need none.
    // Byte keys with the decoded MPHF copy cost less per row than hashing them into a table.
    // (Read straight from a scan only: after a join it loses on many partitions; benches/RESULTS.md.)
    let cheap_lookup = scan_slots.is_some()
        || reads_row_slots
        || index.dense_lookup_bytes() > 0
        || (index.flat_lookup_bytes() > 0 && index.key_type().width().is_none() && !reads_a_join(agg.input()));
    if !key_is_slot && !cheap_lookup && handle.info().rows_per_run.unwrap_or(0.0) < costing.min_rows_per_run {
        return Ok(None);
    }
    // Input hash-partitioned on the key: each partition touches a 1/P share of its slot array,
    // at random, so the arrays cost more per row than over a scan.
    let limit = if *agg.mode() == AggregateMode::SinglePartitioned {
        costing.max_slot_entries_per_row_partitioned
    } else {
        costing.max_slot_entries_per_row
    };
    let range_form =
        merge && *agg.mode() == AggregateMode::Partial && takes_range_form(&handle, agg.input(), estimates);
    if !slot_entries_fit(limit, !range_form) {
        return Ok(None);
    }
    // Admitted only as the range form: reverted by [`unmerged_reverted`] when no final
    // aggregate takes it into a merged node.
    let needs_merge = range_form && !slot_entries_fit(limit, true);
    let form = if range_form {
        MergeForm::Ranges
    } else {
        MergeForm::Partials
    };
    Ok(Some(
        MphfAggregateExec::new(with_slots(agg)?, handle, key_pos)
            .with_merge_form(form)
            .needing_merge(needs_merge),
    ))
}

/// `plan` with every per-partition node that was admitted only for the range form, but was
/// not merged, put back to the aggregate it replaced.
fn unmerged_reverted(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| match node.downcast_ref::<MphfAggregateExec>() {
        Some(exec) if exec.needs_merge() => {
            Ok(Transformed::yes(Arc::clone(exec.aggregate()) as Arc<dyn ExecutionPlan>))
        }
        _ => Ok(Transformed::no(node)),
    })
    .data()
}

/// The group expression to group by (its position and index, and whether it holds slots): a
/// column with a live index of its exact type on which every other group expression depends
/// (see [`lineage`](super::lineage)), or, without `require_dependence`, the first indexed
/// column; or a lone `mphf_index(...)` expression, whose values are the slots.
fn indexed_key(agg: &AggregateExec, require_dependence: bool) -> Option<(usize, Arc<IndexHandle>, bool)> {
    let exprs = agg.group_expr().expr();
    let input_schema = agg.input_schema();
    if let [(expr, _)] = exprs {
        let field = expr.return_field(&input_schema).ok()?;
        if let Some(handle) = slot_index_of_field(&field) {
            return matches!(field.data_type(), DataType::UInt32 | DataType::UInt64).then_some((0, handle, true));
        }
    }
    exprs.iter().enumerate().find_map(|(pos, (expr, _))| {
        let col = expr.downcast_ref::<Column>()?;
        let field = input_schema.fields().get(col.index())?;
        let handle = index_of_field(field)?;
        // The key column must have exactly the index's key type (lookup and emission rely on it).
        if handle.index().keys().data_type() != field.data_type() {
            return None;
        }
        let others: Vec<&Arc<dyn PhysicalExpr>> = exprs
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != pos)
            .map(|(_, (e, _))| e)
            .collect();
        (others.is_empty() || !require_dependence || depends_on_key(agg.input(), col.index(), &others))
            .then_some((pos, handle, false))
    })
}

/// Replaces eligible aggregates bottom-up; with `merge`, also fuses `Final ← exchange ←
/// Partial` into the slot-range merge. Also says whether it made such a merged node.
fn rewrite(plan: Arc<dyn ExecutionPlan>, merge: bool, costing: &Costing) -> Result<(Arc<dyn ExecutionPlan>, bool)> {
    // The caller holds the plan for the whole pass: the estimator's node addresses stay valid.
    let estimates = RowEstimator::new();
    let mut merged_any = false;
    let plan = plan
        .transform_up(|node| {
            let Some(agg) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            if merge {
                if let Some(exec) = try_as_merged(agg) {
                    merged_any = true;
                    return Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>));
                }
            }
            match try_as_mphf_aggregate(agg, costing, merge, &estimates)? {
                Some(exec) => Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>)),
                None => Ok(Transformed::no(node)),
            }
        })
        .data()?;
    Ok((plan, merged_any))
}

/// True when the partials of a key of `handle` over `input` are to be merged in the range form:
/// the key is not clustered and the estimated input has fewer than
/// [`RANGES_BELOW_ROWS_PER_SLOT`] rows per slot and input partition (every partial would then
/// touch most slots at random, and merge work would grow with the partitions).
fn takes_range_form(handle: &IndexHandle, input: &Arc<dyn ExecutionPlan>, estimates: &RowEstimator) -> bool {
    let clustered = handle.info().rows_per_run.unwrap_or(0.0) >= CLUSTERED_ROWS_PER_RUN;
    let inputs = input.output_partitioning().partition_count().max(1) as f64;
    let slots = handle.index().len() as f64;
    !clustered
        && estimates
            .rows(input)
            .is_some_and(|rows| rows < RANGES_BELOW_ROWS_PER_SLOT * inputs * slots)
}

/// Rows per slot and input partition under which an unclustered key is merged in the range
/// form (see [`merge_form`]).
pub const RANGES_BELOW_ROWS_PER_SLOT: f64 = 8.0;

/// Rows per run of equal keys (in table order) from which a key counts as clustered for the
/// choice of [`merge_form`]: the partials of a clustered key touch disjoint slots and stay small.
/// A constant, not `Tuning::aggregate_min_rows_per_run`, so that sessions with costing off still
/// take the range form where it applies.
const CLUSTERED_ROWS_PER_RUN: f64 = 2.0;

/// `Some` when `agg` is a final aggregate over a repartition / coalesce of a partial one that
/// was already replaced by the per-partition [`MphfAggregateExec`].
fn try_as_merged(agg: &AggregateExec) -> Option<MphfMergedAggregateExec> {
    if !matches!(agg.mode(), AggregateMode::Final | AggregateMode::FinalPartitioned) {
        return None;
    }
    if agg.filter_expr().iter().any(Option::is_some)
        || agg.limit_options().is_some()
        || agg.properties().output_ordering().is_some()
        || !agg.group_expr().is_single()
    {
        return None;
    }
    let exchange = agg.input();
    let is_exchange = exchange
        .downcast_ref::<RepartitionExec>()
        .is_some_and(|r| r.properties().output_ordering().is_none() && !r.preserve_order())
        || exchange.downcast_ref::<CoalescePartitionsExec>().is_some();
    if !is_exchange {
        return None;
    }
    let partial = exchange.children().first()?.downcast_ref::<MphfAggregateExec>()?;
    if partial.mode() != AggregateMode::Partial
        || partial.aggregate().aggr_expr().len() != agg.aggr_expr().len()
        || partial.aggregate().group_expr().expr().len() != agg.group_expr().expr().len()
    {
        return None;
    }
    let outputs = agg.properties().output_partitioning().partition_count();
    Some(
        MphfMergedAggregateExec::new(
            Arc::clone(partial.aggregate()),
            Arc::new(agg.clone()),
            Arc::clone(partial.index()),
            partial.key_pos(),
            outputs,
        )
        .with_placement(partial.placement().clone())
        .with_form(partial.merge_form()),
    )
}

impl PhysicalOptimizerRule for MphfAggregateRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(cfg) = config.extensions.get::<MphfConfig>() else {
            return Ok(plan);
        };
        let Some(t) = thresholds_for(cfg, config).filter(|_| cfg.enable_aggregate) else {
            return Ok(plan);
        };
        let costing = Costing {
            min_slots: t.aggregate_min_slots,
            min_rows_per_run: t.aggregate_min_rows_per_run,
            max_slot_entries_per_row: t.aggregate_max_slot_entries_per_row,
            max_slot_entries_per_row_partitioned: t.aggregate_max_slot_entries_per_row_partitioned,
            require_dependence: t.aggregate_require_dependence,
            device: cfg.aggregate_device,
            gpu_min_rows: t.aggregate_gpu_min_rows,
            gpu_emulation: t.gpu_emulation,
        };
        let (merged, merged_any) = rewrite(Arc::clone(&plan), true, &costing)?;
        let merged = unmerged_reverted(merged)?;
        // The merged form is not hash partitioned on the key; keep it only when no node above
        // relies on that (DataFusion's own sanity check of distributions and orderings). The
        // per-partition form keeps every property of the node it replaces: no check needed.
        if !merged_any || SanityCheckPlan::new().optimize(Arc::clone(&merged), config).is_ok() {
            return Ok(merged);
        }
        Ok(rewrite(Arc::clone(&plan), false, &costing)?.0)
    }

    fn name(&self) -> &str {
        "mphf_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// True when `plan` has a node with more than one input (a join) anywhere below it.
fn reads_a_join(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let children = plan.children();
    children.len() > 1 || children.into_iter().any(reads_a_join)
}
