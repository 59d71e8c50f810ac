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
//!   limit counts the slots once, not once per input partition. Over a clustered key the cost
//!   model chooses between the range form and the partials (`CostModel::range_aggregate_ns`
//!   against `CostModel::slot_aggregate_ns`). A partial admitted on that count alone is put
//!   back when no final aggregate merges it.
//!
//! - The slot-range merge replaces `Final ← exchange ← Partial` where no node above needs the
//!   final aggregate's hash partitioning, which the merged output does not have; such a final
//!   aggregate and its partials are decided per partition, and the rest of the plan keeps its
//!   merges.
//!
//! - A `Final` / `FinalPartitioned` aggregate over MPHF partials that no slot-range merge takes
//!   (stages on workers, or a requirement above) is replaced per partition when the model
//!   prices its merge by slot below DataFusion's final hash aggregation, and its lookups are
//!   cheap (the partial rows of a partition are distinct keys, so the clustering exemption
//!   above is the only one; `mphf.costing = always` lifts it).
//!
//! - Several group expressions: one of them must be an indexed column on which all the others
//!   depend (see [`lineage`](super::lineage)); the first such column is the key.
//!
//! # Device (`mphf.aggregate_device`, shown as `device=` in EXPLAIN)
//! `gpu` places every supported aggregation on the GPU (see `aggregate::gpu`: one key column,
//! count/sum/min/max/avg over integer, float and decimal columns); `auto` does so when a GPU is
//! usable, the input is estimated at `Tuning::aggregate_gpu_min_rows` rows or more, the cost
//! model prices the GPU below the CPU with its margin (`plan::cost`: the device's upload and the
//! host's per-slot work against the CPU's per-row and slot-array work, so that many slots per row
//! keep GROUP BY o_orderkey on the CPU), and the scan does not hand the slots over (slot maps
//! or row slots: the CPU then has no lookup to do, while the GPU path still uploads and looks up
//! every key); `cpu` never. A GPU-placed node skips the CPU
//! costing above (a lookup costs the GPU the same clustered or not, and small slot counts are no
//! loss); in the per-partition form it keeps a slot-entries limit, the partitioned one
//! (`Tuning::aggregate_max_slot_entries_per_row_partitioned`, default 1) whatever the mode: every
//! partition's GPU call downloads and converts states for the whole slot range, so many
//! partitions over many slots lose to the CPU (measurements: benches/RESULTS.md, same section).
//!
//! # Estimates and reasons
//! Every candidate is priced by the cost model (`plan::cost`): the node it becomes shows
//! `cost=… vs hash …` in `EXPLAIN` (and the other device's estimate where both were priced), and a
//! declined candidate's reason and estimates are shown by the `MphfDeclined` node that
//! `explain::MphfExplainRule` puts over it. The thresholds above are the model's guard rails:
//! they decline shapes whose cost the per-row figures do not capture (cache-resident tables,
//! slot arrays that outgrow the rows), and `mphf.costing = always` lifts them.

use std::sync::Arc;

use ::datafusion::arrow::datatypes::DataType;
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use ::datafusion::common::Result;
use ::datafusion::physical_expr::expressions::{Column, Literal};
use ::datafusion::physical_expr::utils::collect_columns;
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::{
    ChildrenPropertiesMode, Distribution, ExecutionPlan, ExecutionPlanProperties, Partitioning, ReplaceChildrenOptions,
};

use super::estimate::{shared, RowEstimator};
use super::grouping::group_input_schema;
use super::lineage::depends_on_key;
use super::{with_new_input, MergeForm, MphfAggregateExec, MphfMergedAggregateExec, Placement};
use crate::datafusion::config::MphfConfig;
use crate::datafusion::plan::cost::{AggregateShape, CostModel, Estimate, KeyKind, Lookup, PartialSkip};
use crate::datafusion::plan::sanity::rewrite_is_sane;
use crate::datafusion::plan::scans;
use crate::datafusion::plan::verdicts::{self, Question};
use crate::datafusion::plan::{optimization_starts, runs_distributed};
use crate::datafusion::plan::{thresholds_for, Declined, Tuning};
use crate::datafusion::registry::{index_of_field, slot_index_of_field, IndexHandle};
use crate::datafusion::slot_scan::{attach_scan_slots, hands_table_arrays, scan_slots_reach, KeyColumn};
use crate::device::Device;

/// Default of `Tuning::aggregate_min_slots`: indexes with fewer slots are left to DataFusion's
/// hash aggregation.
pub const MIN_SLOTS: u64 = 4096;

/// The costing thresholds (the session's `Tuning` under `mphf.costing`, see `plan::thresholds_for`).
#[derive(Clone, Debug)]
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
    /// The cost model (`Tuning::costs`).
    pub model: CostModel,
    /// `Tuning::compare_costs`: decline a candidate whose estimate is above the hash
    /// aggregation's (off under `mphf.costing = always`).
    pub compare_costs: bool,
    /// When DataFusion's own partial aggregation would hand its rows on unaggregated.
    pub partial_skip: PartialSkip,
    /// The plan is cut into stages for datafusion-distributed workers (`plan::runs_distributed`):
    /// no slot-range merge, which would merge only a task's share of the partials.
    pub distributed: bool,
}

/// Default of `Tuning::aggregate_gpu_min_rows`: where, on the H200 host, the GPU placement
/// stops losing to our CPU operator on all cores for clustered keys. Smaller inputs ran slower
/// on the GPU, inputs of a few million rows were on par, and the GPU's lead grows with the input
/// (measurements: benches/RESULTS.md, "Where the planner's thresholds and device crossovers come
/// from"; benches/RESULTS-gpu.md, "The GROUP BY operator and `mphf_index` on the GPU").
pub const GPU_MIN_ROWS: u64 = 1 << 22;

impl Costing {
    /// The aggregate rule's inputs from the session's thresholds `t`, settings `cfg` and
    /// DataFusion options `options`.
    pub fn of(t: &Tuning, cfg: &MphfConfig, options: &ConfigOptions) -> Self {
        Self {
            min_slots: t.aggregate_min_slots,
            min_rows_per_run: t.aggregate_min_rows_per_run,
            max_slot_entries_per_row: t.aggregate_max_slot_entries_per_row,
            max_slot_entries_per_row_partitioned: t.aggregate_max_slot_entries_per_row_partitioned,
            require_dependence: t.aggregate_require_dependence,
            device: cfg.aggregate_device,
            gpu_min_rows: t.aggregate_gpu_min_rows,
            gpu_emulation: t.gpu_emulation,
            model: t.costs.clone(),
            compare_costs: t.compare_costs,
            partial_skip: PartialSkip {
                probe_rows: options.execution.skip_partial_aggregation_probe_rows_threshold as f64,
                ratio: options.execution.skip_partial_aggregation_probe_ratio_threshold,
            },
            distributed: runs_distributed(options),
        }
    }
}

/// The GPU placement of `agg` (grouped by `key_pos`) when the session's device choice and the
/// cost model call for it and its aggregates run there. `auto` needs an estimated input of at
/// least `Tuning::aggregate_gpu_min_rows` rows whose GPU estimate (with the model's margin) is
/// below the CPU's, and a scan that does not hand the slots over (slot maps or row slots leave
/// the CPU no lookup to do, while the GPU path still uploads and looks up every key).
fn gpu_placement(
    agg: &AggregateExec,
    key_pos: usize,
    key_is_slot: bool,
    shape: &AggregateShape,
    rows_known: bool,
    costing: &Costing,
) -> Option<Placement> {
    let pays = || {
        shape.lookup != Lookup::Copied
            && rows_known
            && shape.rows >= costing.gpu_min_rows as f64
            && costing.model.gpu_pays(shape)
    };
    let wanted = crate::placement::wants_gpu(costing.device, pays);
    if !wanted || key_is_slot {
        return None;
    }
    Placement::gpu_for(agg, key_pos, costing.gpu_emulation).ok()
}

/// What the rule makes of one aggregate.
pub(crate) enum Decision {
    /// Not a candidate: no indexed key, or a shape the operator does not run (nothing to say).
    NotCandidate,
    /// A candidate left to DataFusion, and why.
    Declined(Declined),
    /// The replacement.
    Replaced(MphfAggregateExec),
}

/// The lookup strategy a row of `agg`'s key finds its slot with.
fn lookup_of(handle: &IndexHandle, key_is_slot: bool, slots_at_hand: bool) -> Lookup {
    let index = handle.index();
    if key_is_slot || slots_at_hand {
        Lookup::Copied
    } else if index.dense_lookup_bytes() > 0 {
        Lookup::Dense
    } else if index.flat_lookup_bytes() > 0 {
        Lookup::Flat
    } else {
        Lookup::Compact
    }
}

/// The cost model's view of `agg` over an index of `handle`, with `rows` input rows.
fn shape_of(
    agg: &AggregateExec,
    handle: &IndexHandle,
    lookup: Lookup,
    rows: f64,
    slot_arrays: usize,
    device_calls: usize,
) -> AggregateShape {
    let index = handle.index();
    let schema = agg.input_schema();
    // Arguments read per row (a literal, as in count(*), is not a column).
    let args: Vec<Arc<dyn PhysicalExpr>> = agg
        .aggr_expr()
        .iter()
        .flat_map(|a| a.expressions())
        .filter(|e| e.downcast_ref::<Literal>().is_none())
        .collect();
    let value_bytes: f64 = args
        .iter()
        .map(|e| e.data_type(&schema).ok().and_then(|t| t.primitive_width()).unwrap_or(8) as f64)
        .sum();
    AggregateShape {
        rows,
        slots: index.len() as f64,
        partitions: agg.input().output_partitioning().partition_count().max(1),
        slot_arrays,
        key: KeyKind::of(index.key_type()),
        lookup,
        rows_per_run: handle.info().rows_per_run.unwrap_or(1.0),
        values: args.len(),
        upload_bytes_per_row: index.key_type().width().unwrap_or(8) as f64 + value_bytes,
        device_calls,
    }
}

/// What `agg` needs of its key column `key` (group expression `key_pos`) over a slot scan: its
/// output keys come from the index, so only rows without a slot need the key, unless another
/// group expression or an aggregate argument reads it.
fn key_column_use(agg: &AggregateExec, key_pos: usize, key: &Column) -> KeyColumn {
    let others = agg
        .group_expr()
        .expr()
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != key_pos)
        .map(|(_, (e, _))| Arc::clone(e));
    let arguments = agg.aggr_expr().iter().flat_map(|a| a.expressions());
    let reads = others
        .chain(arguments)
        .any(|e| collect_columns(&e).iter().any(|c| c.index() == key.index()));
    match reads {
        true => KeyColumn::Read,
        false => KeyColumn::WhereNoSlots,
    }
}

/// The rule's decision for `agg`. `merge`: the node is meant for the SlotMerge form (on the
/// GPU: one partial for all input partitions, so no per-partition slot arrays to cost).
/// `estimates` holds the row estimates of the pass (see [`RowEstimator`]).
pub(crate) fn decide(
    agg: &AggregateExec,
    costing: &Costing,
    merge: bool,
    estimates: &RowEstimator,
) -> Result<Decision> {
    // Partial, Single and SinglePartitioned read raw rows; Final modes merge the states of an
    // MPHF partial below (when no slot-range merge took them); PartialReduce is left alone.
    match agg.mode() {
        AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned => {}
        AggregateMode::Final | AggregateMode::FinalPartitioned => return decide_final(agg, costing, estimates),
        AggregateMode::PartialReduce => return Ok(Decision::NotCandidate),
    }
    let group_by = agg.group_expr();
    // Grouping sets (ROLLUP/CUBE) add a grouping id column and null-filled keys.
    if !group_by.is_single() || group_by.expr().is_empty() {
        return Ok(Decision::NotCandidate);
    }
    // FILTER clauses and ordered aggregates need per-row masks / sorted input we do not feed.
    if agg.filter_expr().iter().any(Option::is_some) || agg.aggr_expr().iter().any(|a| !a.order_bys().is_empty()) {
        return Ok(Decision::NotCandidate);
    }
    // TopK aggregation (limit_options) and streaming aggregation promise orders/limits we don't keep.
    if agg.limit_options().is_some() || agg.properties().output_ordering().is_some() {
        return Ok(Decision::NotCandidate);
    }
    let Some((key_pos, handle, key_is_slot)) = indexed_key(agg, costing.require_dependence) else {
        return Ok(match indexed_key(agg, false) {
            Some(_) => Decision::Declined(Declined::new(
                "the other group columns are not proven to depend on the indexed one".into(),
                None,
            )),
            None => Decision::NotCandidate,
        });
    };
    // Over a Parquet table with slot maps the scan hands over every row's slot: no lookup.
    // Priced on whether the slot scan exists; attached only to a node that replaces `agg`.
    let slotted_key = match key_is_slot {
        true => None,
        false => agg.group_expr().expr()[key_pos]
            .0
            .downcast_ref::<Column>()
            .map(|col| (col.index(), key_column_use(agg, key_pos, col))),
    };
    let scan_slots = match slotted_key {
        Some((col, key_column)) => scan_slots_reach(agg.input(), col, &handle, key_column)?,
        None => false,
    };
    let with_slots = |agg: &AggregateExec| -> Result<Arc<AggregateExec>> {
        let agg = Arc::new(agg.clone());
        let Some((col, key_column)) = slotted_key.filter(|_| scan_slots) else {
            return Ok(agg);
        };
        match attach_scan_slots(agg.input(), col, &handle, key_column)? {
            Some((input, _)) => with_new_input(
                &agg,
                vec![input],
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
    let rows_estimate = estimates.rows(agg.input());
    let rows = rows_estimate.unwrap_or(index.stats().rows as f64);
    let partitions = agg.input().output_partitioning().partition_count().max(1);
    // Every input partition keeps slot arrays of the index's size, unless the partials are
    // to be merged in the range form, which keeps none (the rows are moved instead).
    let slot_entries_fit = |limit: f64, per_partition: bool| {
        rows_estimate.is_none_or(|rows| {
            let arrays = if per_partition { partitions as f64 } else { 1.0 };
            arrays * slots as f64 <= rows * limit
        })
    };
    let lookup = lookup_of(&handle, key_is_slot, scan_slots || reads_row_slots);
    let model = &costing.model;
    // The GPU makes one call when the partials are merged, else one per input partition.
    let partials = shape_of(
        agg,
        &handle,
        lookup,
        rows,
        partitions,
        if merge { 1 } else { partitions },
    );
    let range_form = merge
        && *agg.mode() == AggregateMode::Partial
        && takes_range_form(&handle, agg.input(), estimates, model, &partials);
    let shape = match range_form {
        true => AggregateShape {
            slot_arrays: 1,
            ..partials
        },
        false => partials,
    };
    let hash_ns = model.hash_aggregate_ns(&shape);
    // Left per partition, a partial's groups are merged by DataFusion's final aggregation. Where
    // DataFusion's own partial would skip (its rows mostly distinct), vanilla's final takes
    // every row, which `hash_ns` prices, and ours adds the merge of our groups on top; where it
    // aggregates, both finals merge about as many rows.
    // That final merge is by slot where `decide_final` would take it (a cheap lookup).
    let unmerged_extra_ns = match *agg.mode() == AggregateMode::Partial && costing.partial_skip.skips(&shape) {
        true => {
            let rows = model.partial_output_rows(&shape);
            let hash_final_ns = model.final_aggregate_ns(&shape, rows);
            let final_lookup = lookup_of(&handle, key_is_slot, false);
            match lookup_is_cheap(&handle, final_lookup, reads_a_join(agg.input())) {
                true => {
                    let states = state_columns(agg)?;
                    let slot_final = final_shape(&handle, final_lookup, rows, partitions, states);
                    hash_final_ns.min(model.slot_aggregate_ns(&slot_final))
                }
                false => hash_final_ns,
            }
        }
        false => 0.0,
    };
    let cpu_ns = match range_form {
        true => model.range_aggregate_ns(&shape),
        false => model.slot_aggregate_ns(&shape) + if merge { 0.0 } else { unmerged_extra_ns },
    };
    // Priced as merged, a per-partition node whose partials would not pay unmerged is decided
    // again if no final aggregate takes it into a merged node (see `unmerged_redecided`).
    let unmerged_loses = merge && !range_form && costing.compare_costs && cpu_ns + unmerged_extra_ns > hash_ns;
    // Shown only: asking whether the GPU is usable would start it (a large share of a second)
    // while planning a node that may not run there.
    let gpu_ns = (costing.device != Device::Cpu && crate::placement::gpu_may_be_usable())
        .then(|| model.gpu_aggregate_ns(&shape));
    let cpu_estimate = Estimate {
        mphf_ns: cpu_ns,
        hash_ns,
        other_device_ns: gpu_ns,
        on_gpu: false,
    };
    let declined = |reason: String| Ok(Decision::Declined(Declined::new(reason, Some(cpu_estimate))));
    // On the GPU a lookup costs the same clustered or not, and a small slot count is no loss.
    if let Some(placement) = gpu_placement(agg, key_pos, key_is_slot, &shape, rows_estimate.is_some(), costing) {
        if merge || slot_entries_fit(costing.max_slot_entries_per_row_partitioned, true) {
            let estimate = Estimate {
                mphf_ns: gpu_ns.unwrap_or(cpu_ns),
                hash_ns,
                other_device_ns: Some(cpu_ns),
                on_gpu: true,
            };
            // Priced as merged: if no final aggregate takes it into a merged node, it is
            // decided again per partition (see `unmerged_redecided`), unless it pays so too.
            let per_partition = AggregateShape {
                device_calls: partitions,
                ..shape.clone()
            };
            let exec = MphfAggregateExec::new(Arc::new(agg.clone()), handle, key_pos)
                .with_placement(placement)
                .needing_merge(merge && !model.gpu_pays(&per_partition))
                .with_estimate(Some(estimate));
            return Ok(Decision::Replaced(exec));
        }
    }
    if slots < costing.min_slots {
        return declined(format!(
            "{slots} slots, fewer than aggregate_min_slots ({}): the hash table stays in cache",
            costing.min_slots
        ));
    }
    // With a dense-key table a lookup is one array read, clustered or not; slots need none.
    // Byte keys with the decoded MPHF copy cost less per row than hashing them into a table.
    // (Read straight from a scan only: after a join it loses on many partitions; benches/RESULTS.md.)
    let cheap_lookup = lookup_is_cheap(&handle, lookup, reads_a_join(agg.input()));
    let rows_per_run = handle.info().rows_per_run.unwrap_or(0.0);
    if !cheap_lookup && rows_per_run < costing.min_rows_per_run {
        return declined(format!(
            "unclustered key ({rows_per_run:.1} rows per run, fewer than {}) with {} lookups: one MPHF query per row",
            costing.min_rows_per_run,
            lookup.name()
        ));
    }
    // Input hash-partitioned on the key: each partition touches a 1/P share of its slot array,
    // at random, so the arrays cost more per row than over a scan.
    let limit = if *agg.mode() == AggregateMode::SinglePartitioned {
        costing.max_slot_entries_per_row_partitioned
    } else {
        costing.max_slot_entries_per_row
    };
    if !slot_entries_fit(limit, !range_form) {
        let arrays = if range_form { 1 } else { partitions };
        return declined(format!(
            "{arrays} slot arrays of {slots} slots for {rows:.0} estimated rows: more than {limit} entries per row"
        ));
    }
    // The thresholds passed: the estimates decide (under `mphf.costing = auto`).
    if costing.compare_costs && cpu_ns > hash_ns {
        return declined("DataFusion's hash aggregation is estimated cheaper".into());
    }
    // Admitted only as the range form, or only where merged: reverted by
    // [`unmerged_redecided`] when no final aggregate takes it into a merged node.
    let needs_merge = (range_form && !slot_entries_fit(limit, true)) || unmerged_loses;
    let form = if range_form {
        MergeForm::Ranges
    } else {
        MergeForm::Partials
    };
    Ok(Decision::Replaced(
        MphfAggregateExec::new(with_slots(agg)?, handle, key_pos)
            .with_merge_form(form)
            .needing_merge(needs_merge)
            .with_estimate(Some(cpu_estimate)),
    ))
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

/// `plan` with every per-partition node that was admitted only as part of a merged node, but
/// was not merged, decided again: a device placement as one per-partition node (its calls then
/// run one per partition); a CPU node (the range form, or partials that lose unmerged) put back
/// to the aggregate it replaced.
fn unmerged_redecided(plan: Arc<dyn ExecutionPlan>, costing: &Costing) -> Result<Arc<dyn ExecutionPlan>> {
    let estimates = shared();
    plan.transform_up(|node| {
        let Some(exec) = node.downcast_ref::<MphfAggregateExec>().filter(|e| e.needs_merge()) else {
            return Ok(Transformed::no(node));
        };
        let replaced = Arc::clone(exec.aggregate());
        if matches!(exec.placement(), Placement::Device(_)) {
            if let Decision::Replaced(again) = decide(&replaced, costing, false, &estimates)? {
                return Ok(Transformed::yes(Arc::new(again) as Arc<dyn ExecutionPlan>));
            }
        }
        Ok(Transformed::yes(replaced as Arc<dyn ExecutionPlan>))
    })
    .data()
}

/// The group expression to group by (its position and index, and whether it holds slots): a
/// column with a live index of its exact type on which every other group expression depends
/// (see [`lineage`](super::lineage)), or, without `require_dependence`, the first indexed
/// column; or a lone `mphf_index(...)` expression, whose values are the slots.
fn indexed_key(agg: &AggregateExec, require_dependence: bool) -> Option<(usize, Arc<IndexHandle>, bool)> {
    let exprs = agg.group_expr().expr();
    let input_schema = group_input_schema(agg);
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
/// Partial` into the slot-range merge, except where a node above needs the final aggregate's
/// hash partitioning (see [`KeptPartitionings`]). Also says whether it made a merged node.
fn rewrite(plan: Arc<dyn ExecutionPlan>, merge: bool, costing: &Costing) -> Result<(Arc<dyn ExecutionPlan>, bool)> {
    let estimates = shared();
    let mut merged_any = false;
    let mut kept = match merge {
        true => KeptPartitionings::of(&plan),
        false => KeptPartitionings::default(),
    };
    let plan = plan
        .transform_up(|node| {
            let Some(agg) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            if merge && !kept.takes_final(agg) {
                if let Some(exec) = try_as_merged(agg) {
                    merged_any = true;
                    return Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>));
                }
            }
            // A partial whose final aggregate stays is decided as no merge would take it.
            let merged = merge && !kept.takes_partial(agg);
            match decide(agg, costing, merged, &estimates)? {
                Decision::Replaced(exec) => {
                    let exec: Arc<dyn ExecutionPlan> = Arc::new(exec);
                    if merge && !merged {
                        kept.partials.push(Arc::clone(&exec));
                    }
                    Ok(Transformed::yes(exec))
                }
                Decision::Declined(declined) => {
                    // The question the explain rule asks (merged unless distributed).
                    if merged != costing.distributed {
                        verdicts::record(Question::Aggregate, &node, None, &declined);
                    }
                    Ok(Transformed::no(node))
                }
                Decision::NotCandidate => Ok(Transformed::no(node)),
            }
        })
        .data()?;
    Ok((plan, merged_any))
}

/// The final aggregates of a plan that must keep their hash partitioning, so that no slot-range
/// merge replaces them: their partials are found by their inputs before the rewrite, and by
/// the nodes that replaced them during it. The nodes are held, so that no other node takes
/// their addresses while the rewrite runs.
///
/// Why: the merged form is not hash partitioned on the key, so a node above that needs the
/// final aggregate's partitioning (TPC-H Q18's partitioned semi join over its `GROUP BY
/// l_orderkey` subquery) fails DataFusion's sanity check. Asked of the plan before the rewrite,
/// this leaves that final aggregate and its partials per partition, decided as a rewrite
/// without merges decides them, and keeps every other merge. Without it, one failing merge sent
/// the whole plan through the rule a second time without any merge, deciding every aggregate
/// again. The sanity check of the rewritten plan stays, and so does that fallback, for what
/// this does not foresee (an ordering, say).
#[derive(Default)]
struct KeptPartitionings {
    /// Inputs of the partial aggregates below such final aggregates, as in the plan.
    inputs: Vec<Arc<dyn ExecutionPlan>>,
    /// The MPHF nodes that replaced those partials.
    partials: Vec<Arc<dyn ExecutionPlan>>,
}

impl KeptPartitionings {
    fn of(plan: &Arc<dyn ExecutionPlan>) -> Self {
        let mut kept = Self::default();
        kept.visit(plan, false);
        kept
    }

    /// Walks `node`, whose output partitioning a node above needs when `needed`: as required
    /// (any distribution), or passed on by a node whose own hash partitioning is needed and
    /// comes from its input (a projection, a filter; not a repartition, which makes its own).
    fn visit(&mut self, node: &Arc<dyn ExecutionPlan>, needed: bool) {
        if let Some(partial) = node
            .downcast_ref::<AggregateExec>()
            .filter(|_| needed)
            .and_then(exchanged_partial)
            .and_then(|p| p.downcast_ref::<AggregateExec>())
        {
            self.inputs.push(Arc::clone(partial.input()));
        }
        let passes_on = needed
            && node.downcast_ref::<RepartitionExec>().is_none()
            && matches!(node.output_partitioning(), Partitioning::Hash(..));
        let required = node.input_distribution_requirements();
        for (i, child) in node.children().into_iter().enumerate() {
            let needs = match required.child_distribution(i) {
                Some(Distribution::UnspecifiedDistribution) | None => passes_on,
                Some(_) => true,
            };
            self.visit(child, needs);
        }
    }

    /// Whether `agg` is a partial aggregate below a final aggregate that keeps its partitioning.
    fn takes_partial(&self, agg: &AggregateExec) -> bool {
        *agg.mode() == AggregateMode::Partial && self.inputs.iter().any(|i| Arc::ptr_eq(i, agg.input()))
    }

    /// Whether `agg` is a final aggregate over such a partial's MPHF node.
    fn takes_final(&self, agg: &AggregateExec) -> bool {
        exchanged_partial(agg).is_some_and(|p| self.partials.iter().any(|k| Arc::ptr_eq(k, p)))
    }
}

/// True when the partials of a key of `handle` over `input` (priced as `partials`, one slot
/// array per input partition) are to be merged in the range form. The range form keeps its
/// slots as u32, so the index has fewer than `u32::MAX` slots. Then:
/// - a key that is not clustered takes it when the estimated input has fewer than
///   [`RANGES_BELOW_ROWS_PER_SLOT`] rows per slot and input partition (every partial would
///   touch most slots at random, and merge work would grow with the partitions);
/// - a clustered key takes it when the model prices it below the partials. Its partials touch
///   disjoint slots, but each partition's slot arrays span the whole index: once they outgrow
///   the cache, every run of equal keys costs a miss and every slot an uncached entry, while
///   the range form pays a move per row and keeps one range in cache (TPC-H's l_orderkey, four
///   rows a run; benches/RESULTS.md, session 33).
fn takes_range_form(
    handle: &IndexHandle,
    input: &Arc<dyn ExecutionPlan>,
    estimates: &RowEstimator,
    model: &CostModel,
    partials: &AggregateShape,
) -> bool {
    if handle.index().len() >= u64::from(u32::MAX) {
        return false;
    }
    if handle.info().rows_per_run.unwrap_or(0.0) >= CLUSTERED_ROWS_PER_RUN {
        return model.range_aggregate_ns(partials) < model.slot_aggregate_ns(partials);
    }
    let inputs = input.output_partitioning().partition_count().max(1) as f64;
    let slots = handle.index().len() as f64;
    estimates
        .rows(input)
        .is_some_and(|rows| rows < RANGES_BELOW_ROWS_PER_SLOT * inputs * slots)
}

/// Rows per slot and input partition under which an unclustered key is merged in the range
/// form (see [`merge_form`]).
pub const RANGES_BELOW_ROWS_PER_SLOT: f64 = 8.0;

/// Rows per run of equal keys (in table order) from which a key counts as clustered for the
/// choice of the merge form: the partials of a clustered key touch disjoint slots, and the cost
/// model decides whether their slot arrays cost more than the range form's moves. A constant,
/// not `Tuning::aggregate_min_rows_per_run`, so that sessions with costing off still take the
/// range form where it applies.
const CLUSTERED_ROWS_PER_RUN: f64 = 2.0;

/// The partial [`MphfAggregateExec`] that the final aggregate `agg` merges directly, through a
/// repartition or coalesce, with the same group and aggregate expressions; `None` for any
/// other shape (a filter, a limit or an output ordering on `agg`, grouping sets).
fn partial_below(agg: &AggregateExec) -> Option<&MphfAggregateExec> {
    let partial = exchanged_partial(agg)?.downcast_ref::<MphfAggregateExec>()?;
    (partial.mode() == AggregateMode::Partial
        && partial.aggregate().aggr_expr().len() == agg.aggr_expr().len()
        && partial.aggregate().group_expr().expr().len() == agg.group_expr().expr().len())
    .then_some(partial)
}

/// The node under the exchange below the final aggregate `agg`, where `agg` has a shape the
/// slot-range merge takes (see [`partial_below`]).
fn exchanged_partial(agg: &AggregateExec) -> Option<&Arc<dyn ExecutionPlan>> {
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
    exchange.children().into_iter().next()
}

/// `Some` when `agg` is a final aggregate over a repartition / coalesce of a partial one that
/// was already replaced by the per-partition [`MphfAggregateExec`].
fn try_as_merged(agg: &AggregateExec) -> Option<MphfMergedAggregateExec> {
    let partial = partial_below(agg)?;
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
        .with_form(partial.merge_form())
        .with_estimate(partial.estimate()),
    )
}

/// The estimates of a final aggregation, per partition, of `rows` partial rows of a key of
/// `handle` (found by `lookup`) with `states` state columns over `partitions` input
/// partitions: ours by slot, and DataFusion's by hash. The partial rows of one partition are
/// distinct keys (one row per run).
fn final_shape(handle: &IndexHandle, lookup: Lookup, rows: f64, partitions: usize, states: usize) -> AggregateShape {
    let index = handle.index();
    AggregateShape {
        rows,
        slots: index.len() as f64,
        partitions,
        slot_arrays: partitions,
        key: KeyKind::of(index.key_type()),
        lookup,
        rows_per_run: 1.0,
        values: states,
        upload_bytes_per_row: 0.0,
        device_calls: 1,
    }
}

/// The state columns of `agg`'s aggregates (what its partials hand to the final aggregation).
fn state_columns(agg: &AggregateExec) -> Result<usize> {
    agg.aggr_expr().iter().map(|a| a.state_fields().map(|f| f.len())).sum()
}

/// True when a slot's lookup by `lookup` over keys of `handle` costs no more than hashing the
/// row, clustered or not: a copy, a dense-key table read, or byte keys through the decoded
/// MPHF copy unless the rows come through a join (`after_join`: there it loses on many
/// partitions, benches/RESULTS.md).
fn lookup_is_cheap(handle: &IndexHandle, lookup: Lookup, after_join: bool) -> bool {
    matches!(lookup, Lookup::Copied | Lookup::Dense)
        || (lookup == Lookup::Flat && handle.index().key_type().width().is_none() && !after_join)
}

/// The decision for a `Final` / `FinalPartitioned` aggregate `agg` over the partials of an
/// [`MphfAggregateExec`] that no slot-range merge takes (the plan is cut into stages, or the
/// merge broke a requirement above): each of its partitions merges the partial states of its
/// keys by slot, looking the keys up as the partial did, with no hash table. It keeps `agg`'s
/// partitioning, so nothing above notices.
fn decide_final(agg: &AggregateExec, costing: &Costing, estimates: &RowEstimator) -> Result<Decision> {
    let Some(partial) = partial_below(agg) else {
        return Ok(Decision::NotCandidate);
    };
    // The partial states' key column must still name the partial's index (field metadata).
    let Some((key_pos, handle, key_is_slot)) = indexed_key(agg, false) else {
        return Ok(Decision::NotCandidate);
    };
    if key_pos != partial.key_pos() || handle.id() != partial.index().id() {
        return Ok(Decision::NotCandidate);
    }
    let lookup = lookup_of(&handle, key_is_slot, false);
    let model = &costing.model;
    let partial_agg = partial.aggregate();
    let partial_rows = estimates
        .rows(partial_agg.input())
        .unwrap_or(handle.index().stats().rows as f64);
    let partials = shape_of(
        partial_agg,
        &handle,
        lookup,
        partial_rows,
        partial_agg.input().output_partitioning().partition_count().max(1),
        1,
    );
    let rows = model.partial_output_rows(&partials);
    let states = state_columns(agg)?;
    let partitions = agg.input().output_partitioning().partition_count().max(1);
    let shape = final_shape(&handle, lookup, rows, partitions, states);
    let estimate = Estimate {
        mphf_ns: model.slot_aggregate_ns(&shape),
        hash_ns: model.final_aggregate_ns(&shape, rows),
        other_device_ns: None,
        on_gpu: false,
    };
    let declined = |reason: String| Ok(Decision::Declined(Declined::new(reason, Some(estimate))));
    // A partition's partial rows are distinct keys: one run per row, one query per row.
    if !lookup_is_cheap(&handle, lookup, reads_a_join(partial_agg.input())) && costing.min_rows_per_run > 1.0 {
        return declined(format!(
            "the final merge would make one MPHF query per partial row ({} lookups; 1 row per run, fewer than {})",
            lookup.name(),
            costing.min_rows_per_run
        ));
    }
    if costing.compare_costs && estimate.mphf_ns > estimate.hash_ns {
        return declined("DataFusion's final hash aggregation is estimated cheaper".into());
    }
    Ok(Decision::Replaced(
        MphfAggregateExec::new(Arc::new(agg.clone()), handle, key_pos).with_estimate(Some(estimate)),
    ))
}

impl PhysicalOptimizerRule for MphfAggregateRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        verdicts::clear(&[Question::Aggregate]);
        // The first MPHF rule of a plan: the join and explain rules use the scans and row
        // estimates it makes.
        optimization_starts();
        let _scans = scans::pass();
        let Some(cfg) = config.extensions.get::<MphfConfig>() else {
            return Ok(plan);
        };
        let Some(t) = thresholds_for(cfg, config).filter(|_| cfg.enable_aggregate) else {
            return Ok(plan);
        };
        let costing = Costing::of(&t, cfg, config);
        // Stages split over tasks: each task would merge its own share of the partials.
        if costing.distributed {
            return Ok(rewrite(plan, false, &costing)?.0);
        }
        let (merged, merged_any) = rewrite(Arc::clone(&plan), true, &costing)?;
        let merged = unmerged_redecided(merged, &costing)?;
        // The rewrite merged no final aggregate whose partitioning a node above needs (see
        // `KeptPartitionings`); DataFusion's own sanity check of distributions and orderings
        // stays as the guard of last resort, which falls back to no merge at all. The
        // per-partition form keeps every property of the node it replaces: no check needed.
        if !merged_any || rewrite_is_sane(&plan, &merged, config) {
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
