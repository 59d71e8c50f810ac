//! `MphfGroupJoinExec`: a partial aggregate fused with the [`MphfJoinExec`] it reads, when it
//! groups by build-side columns only (a *group join*).
//!
//! Why: `SELECT category, sum(amount) FROM events JOIN dims ON events.id = dims.id GROUP BY
//! category` joins every event row, copies its dimension row's `category` string into the join
//! output, and then hashes that string again in the partial aggregate: per probe row one string
//! copy and one hash probe, for a value that is the same every time the same build row matches.
//! Here the group of every build row is found once, when the build side is complete (one pass
//! of DataFusion's `GroupValues` over the build rows, shared by every probe partition), and each
//! matching pair `(build row b, probe row p)` adds the probe row's arguments to group
//! `group_of[b]`. No build column is copied per probe row and nothing is hashed per probe row.
//!
//! # Eligibility (see [`MphfGroupJoinExec::try_fuse`])
//! - a `Partial` or `Single` aggregate straight over an inner [`MphfJoinExec`], one grouping set, no
//!   `LIMIT`, no output ordering, no aggregate with an `ORDER BY` or `DISTINCT`;
//! - every group expression a column of the join's build side;
//! - the build rows grouped on one thread while the probe partitions wait no more than each
//!   probe partition's rows ([`fused_serial_rows`]). The build rows are grouped in chunks at once,
//!   each chunk with its own `GroupValues`; the chunks' groups are then merged on one thread.
//!   With few groups (`GROUP BY category`, 20 values) that merge is a few hundred rows; with a
//!   group per build row (`GROUP BY c_name`) it is every build row again, and at SF 1 on 16
//!   cores (150 K build rows for 94 K probe rows per partition) the fused join ran at half
//!   vanilla's speed. The group count is estimated as the join rule's is (`group_count`);
//!   unknown counts as one group per build row.
//!
//! The join rule prices a join under such an aggregate with it (`JoinShape::group_join`):
//! DataFusion copies the group columns into every pair and hashes them again, ours does not.
//!
//! The aggregate arguments and `FILTER` clauses may read either side: the columns they read are
//! gathered for the matching pairs only.
//!
//! # Groups by probe slot
//! When the probe key has its own index whose slots the probe rows carry (a slot-map scan, or
//! an in-memory table's row slots) and is translated into the build index, each pair costs
//! three dependent reads at random places: the translation, the slot table and the build row's
//! group. Where nothing else needs the build row (one join key, no join filter, every argument
//! and `FILTER` a probe column) and the probe side is estimated to have at least as many rows
//! as the probe index has slots, the three are composed once per build side into one table,
//! the group of every probe slot ([`SlotGroups`]), and a probe row's group is one read. A build
//! side whose slots hold several rows, or with strays, keeps the pairs.
//!
//! # Invariants
//! - The output is the replaced aggregate's: same schema (group columns, then each aggregate's
//!   state columns, or its final value for a `Single` aggregate over one partition), one row per
//!   group that at least one pair of this partition reached; a final aggregate above merges
//!   partitions as before. Join semantics (residual keys, the join filter, strays, NULL keys)
//!   are the join's own: pairs come from [`Prober::pairs`](super::probe::Prober::pairs), or, by
//!   probe slot, from the same translation and slot table composed.
//! - Group ids are per build side: a re-execution, or a `Partitioned` join's per-partition build
//!   sides, compute their own.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use ::datafusion::arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array};
use ::datafusion::arrow::compute::take;
use ::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use ::datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use ::datafusion::common::{internal_err, DataFusionError, JoinSide, JoinType, Result, Statistics};
use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_plan::aggregates::group_values::new_group_values;
use ::datafusion::physical_plan::aggregates::order::GroupOrdering;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::display::DisplayableExecutionPlan;
use ::datafusion::physical_plan::execution_plan::ChildrenPropertiesMode;
use ::datafusion::physical_plan::joins::utils::{build_join_schema, ColumnIndex as JoinColumn};
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use ::datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, InputDistributionRequirements,
    PlanProperties, ReplaceChildrenOptions,
};
use futures::{StreamExt, TryStreamExt};
use rayon::prelude::*;

use super::build::{BuildSide, NO_ROW};
use super::build_threads::BuildThreads;
use super::group_count::estimated_groups;
use super::probe::Prober;
use super::translate::probe_index;
use super::MphfJoinExec;
use crate::core::column::translate::SlotTranslation;
use crate::core::column::ABSENT;
use crate::datafusion::aggregate::{groups_accumulator, RowEstimator};
use crate::datafusion::plan::cost::{GroupJoinShape, KeyKind};

/// The group of every build row of one build side, and the groups' values.
pub struct BuildGroups {
    /// Group id of each build row.
    group_of: Vec<u32>,
    /// The group columns' values, one row per group id.
    values: Vec<ArrayRef>,
    /// The pool's share of the two (the groups of one build side serve every partition).
    _reservation: MemoryReservation,
}

impl BuildGroups {
    /// The groups of the rows of `batch` (a build side's) by its columns `columns`, their memory
    /// reserved in `pool`, on the build's `threads`. Chunks of the rows are grouped at once
    /// (see [`group_chunks`]; one chunk on the caller); their groups are then merged in chunk
    /// order.
    fn compute(
        batch: &RecordBatch,
        columns: &[usize],
        pool: &Arc<dyn MemoryPool>,
        threads: BuildThreads,
    ) -> Result<Self> {
        let reservation = MemoryConsumer::new("MphfGroupJoinExec[build groups]").register(pool);
        let rows = batch.num_rows();
        reservation.try_grow(rows * 4)?;
        let arrays: Vec<ArrayRef> = columns.iter().map(|&c| Arc::clone(batch.column(c))).collect();
        let schema = batch.schema();
        let fields: Vec<Field> = columns.iter().map(|&c| schema.field(c).clone()).collect();
        let schema = Arc::new(Schema::new(fields));
        let chunks = group_chunks(rows, threads.spread());
        // Each chunk's rows interned on its own, at once: local ids and the chunk's values.
        let intern = |&(offset, len): &(usize, usize)| -> Result<(Vec<usize>, Vec<ArrayRef>)> {
            let slice: Vec<ArrayRef> = arrays.iter().map(|a| a.slice(offset, len)).collect();
            let mut interner = new_group_values(Arc::clone(&schema), &GroupOrdering::None)?;
            let mut ids = Vec::with_capacity(len);
            interner.intern(&slice, &mut ids)?;
            Ok((ids, interner.emit(EmitTo::All)?))
        };
        let local: Vec<(Vec<usize>, Vec<ArrayRef>)> = threads
            .map_ranges(chunks.len(), 1, |cs| chunks[cs].iter().map(intern).collect::<Vec<_>>())
            .into_iter()
            .flatten()
            .collect::<Result<_>>()?;
        // The chunks' values interned once more, in chunk order: each local id's global id.
        let mut interner = new_group_values(Arc::clone(&schema), &GroupOrdering::None)?;
        let mut global_of = Vec::with_capacity(local.len());
        for (_, values) in &local {
            let mut ids = Vec::new();
            interner.intern(values, &mut ids)?;
            global_of.push(ids);
        }
        if interner.len() >= NO_BUILD_ROW as usize {
            return internal_err!("MphfGroupJoinExec: more than 2^32 - 2 groups");
        }
        let mut group_of = vec![0u32; rows];
        let mut parts: Vec<&mut [u32]> = Vec::with_capacity(chunks.len());
        let mut rest = group_of.as_mut_slice();
        for &(_, len) in &chunks {
            let (part, tail) = rest.split_at_mut(len);
            parts.push(part);
            rest = tail;
        }
        let relabel = |part: &mut [u32], ids: &[usize], global: &[usize]| {
            for (g, &l) in part.iter_mut().zip(ids) {
                *g = global[l] as u32;
            }
        };
        match threads {
            BuildThreads::AllCores => parts
                .into_par_iter()
                .zip(local.par_iter().zip(global_of.par_iter()))
                .for_each(|(part, ((ids, _), global))| relabel(part, ids, global)),
            BuildThreads::Caller => parts
                .into_iter()
                .zip(local.iter().zip(&global_of))
                .for_each(|(part, ((ids, _), global))| relabel(part, ids, global)),
        }
        let values = interner.emit(EmitTo::All)?;
        reservation.try_grow(values.iter().map(|v| v.get_array_memory_size()).sum())?;
        Ok(Self {
            group_of,
            values,
            _reservation: reservation,
        })
    }

    fn groups(&self) -> usize {
        self.values.first().map_or(0, |v| v.len())
    }
}

/// Fewest build rows a chunk of [`BuildGroups::compute`] interns on its own: below it, the
/// second pass over the chunks' values would cost more than the chunk's share of the work.
const MIN_GROUP_CHUNK_ROWS: usize = 1 << 16;

/// `(offset, len)` of the chunks of `rows` build rows whose groups are found at once: up to
/// `threads` chunks of at least [`MIN_GROUP_CHUNK_ROWS`] rows (one chunk when fewer), covering
/// every row once, in order.
fn group_chunks(rows: usize, threads: usize) -> Vec<(usize, usize)> {
    let count = (rows / MIN_GROUP_CHUNK_ROWS).clamp(1, threads.max(1));
    let size = rows.div_ceil(count).max(1);
    (0..rows).step_by(size).map(|o| (o, size.min(rows - o))).collect()
}

/// A partial aggregate fused with the MPHF join below it (see the module docs).
pub struct MphfGroupJoinExec {
    /// The replaced partial aggregate (its input is `join`).
    agg: Arc<AggregateExec>,
    /// The join.
    join: Arc<MphfJoinExec>,
    /// What every partition reads.
    fused: Arc<Fused>,
    metrics: ExecutionPlanMetricsSet,
}

/// What was made for the build side that the weak reference names (the last one asked about).
type PerBuildSide<T> = Mutex<Option<(Weak<BuildSide>, T)>>;

/// The expressions of a group join over the pairs, and its group ids, shared by partitions.
struct Fused {
    /// Build-batch columns of the group expressions, in order.
    group_columns: Vec<usize>,
    /// Where the columns that the arguments and filters read come from (a compact batch of
    /// these, in this order, is what they are evaluated on).
    read: Vec<JoinColumn>,
    /// Each aggregate's arguments over the compact batch.
    args: Vec<Vec<Arc<dyn PhysicalExpr>>>,
    /// Each aggregate's `FILTER` over the compact batch.
    filters: Vec<Option<Arc<dyn PhysicalExpr>>>,
    /// The compact batch's schema (every field nullable).
    read_schema: SchemaRef,
    /// The build side whose groups were computed last, with them.
    groups: PerBuildSide<Arc<BuildGroups>>,
    /// Whether the probe may read each row's group straight from its slot in the probe key's
    /// own index ([`SlotGroups`]): no other join key, no join filter, every aggregate argument
    /// and filter a probe column, and the probe side estimated to have at least as many rows
    /// as that index has slots (the table is made over all of them).
    direct: bool,
    /// The build side whose [`SlotGroups`] were made last, with them (`None`: not possible for
    /// that build side).
    slot_groups: PerBuildSide<Option<Arc<SlotGroups>>>,
}

impl fmt::Debug for MphfGroupJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MphfGroupJoinExec")
            .field("group_columns", &self.fused.group_columns)
            .finish_non_exhaustive()
    }
}

/// `expr` with each column reference `Column(j)` replaced by `Column(position of j in read)`,
/// adding `j` to `read` when new; `map[j]` is where join output column `j` comes from.
fn remap(
    expr: &Arc<dyn PhysicalExpr>,
    map: &[JoinColumn],
    read: &mut Vec<(usize, JoinColumn)>,
) -> Result<Arc<dyn PhysicalExpr>> {
    Arc::clone(expr)
        .transform(|e| {
            let Some(c) = e.downcast_ref::<Column>() else {
                return Ok(Transformed::no(e));
            };
            let j = c.index();
            let Some(from) = map.get(j) else {
                return internal_err!("MphfGroupJoinExec: column {j} outside the join output");
            };
            let at = match read.iter().position(|(k, _)| *k == j) {
                Some(at) => at,
                None => {
                    read.push((j, from.clone()));
                    read.len() - 1
                }
            };
            Ok(Transformed::yes(
                Arc::new(Column::new(c.name(), at)) as Arc<dyn PhysicalExpr>
            ))
        })
        .map(|t| t.data)
}

impl MphfGroupJoinExec {
    /// The replaced partial aggregate.
    pub fn aggregate(&self) -> &Arc<AggregateExec> {
        &self.agg
    }

    /// The join whose pairs it aggregates.
    pub fn join(&self) -> &MphfJoinExec {
        &self.join
    }

    /// The fused node for the partial aggregate `agg` when it reads an eligible
    /// [`MphfJoinExec`] and fusing pays (see [`fused_serial_rows`]), `None` otherwise. `estimates`
    /// are the row estimates of the optimizer pass asking.
    ///
    /// # Errors
    /// Expression rewriting errors.
    pub(crate) fn try_fuse(agg: &Arc<AggregateExec>, estimates: &RowEstimator) -> Result<Option<Self>> {
        let Some(join) = agg.input().downcast_ref::<MphfJoinExec>() else {
            return Ok(None);
        };
        if fused_serial_rows(agg, join.join(), estimates).is_none() {
            return Ok(None);
        }
        // The table of every probe slot's group pays when the probe rows outnumber its slots.
        let probe_slots = probe_index(join.join(), join.key_pair()).map(|p| p.index.index().len() as f64);
        let direct_pays = match (estimates.datafusion_rows(join.join().right()), probe_slots) {
            (Some(rows), Some(slots)) => rows >= slots,
            _ => false,
        };
        Self::fuse_with(agg, direct_pays)
    }

    /// The fused node for the partial aggregate `agg` over an eligible [`MphfJoinExec`],
    /// whatever the row counts (a plan decoded on a worker, fused on the coordinator); `None`
    /// when the shapes do not allow it. Without row estimates, the probe never reads groups by
    /// slot here (see [`Fused::direct`]).
    ///
    /// # Errors
    /// Expression rewriting errors.
    #[cfg(feature = "distributed")]
    pub(crate) fn fuse(agg: &Arc<AggregateExec>) -> Result<Option<Self>> {
        Self::fuse_with(agg, false)
    }

    /// [`fuse`](Self::fuse), the probe reading groups by slot where the shape allows it when
    /// `direct_pays` (see [`Fused::direct`]).
    fn fuse_with(agg: &Arc<AggregateExec>, direct_pays: bool) -> Result<Option<Self>> {
        let Some(join) = agg.input().downcast_ref::<MphfJoinExec>() else {
            return Ok(None);
        };
        let Some((map, group_columns)) = fusable_shape(agg, join.join()) else {
            return Ok(None);
        };
        let mut read = Vec::new();
        let mut args = Vec::new();
        for a in agg.aggr_expr() {
            args.push(
                a.expressions()
                    .iter()
                    .map(|e| remap(e, &map, &mut read))
                    .collect::<Result<Vec<_>>>()?,
            );
        }
        let filters = agg
            .filter_expr()
            .iter()
            .map(|f| f.as_ref().map(|f| remap(f, &map, &mut read)).transpose())
            .collect::<Result<Vec<_>>>()?;
        let input = agg.input_schema();
        let fields: Vec<Field> = read
            .iter()
            .map(|(j, _)| input.field(*j).clone().with_nullable(true))
            .collect();
        let join = Arc::new(MphfJoinExec::new(
            Arc::clone(join.join()),
            Arc::clone(join.index()),
            join.key_pair(),
        ));
        let hash_join = join.join();
        let direct = direct_pays
            && hash_join.on().len() == 1
            && hash_join.filter().is_none()
            && read.iter().all(|(_, c)| c.side == JoinSide::Right);
        let fused = Fused {
            group_columns,
            read: read.into_iter().map(|(_, c)| c).collect(),
            args,
            filters,
            read_schema: Arc::new(Schema::new(fields)),
            groups: Mutex::new(None),
            direct,
            slot_groups: Mutex::new(None),
        };
        Ok(Some(Self {
            agg: Arc::clone(agg),
            join,
            fused: Arc::new(fused),
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }
}

/// Where each output column of `hash_join` comes from, and the build-side columns that `agg`
/// groups by, when `agg` is an aggregate a group join can replace over `hash_join` (see the
/// module docs' eligibility, row counts aside); `None` otherwise.
fn fusable_shape(agg: &AggregateExec, hash_join: &HashJoinExec) -> Option<(Vec<JoinColumn>, Vec<usize>)> {
    if !matches!(agg.mode(), AggregateMode::Partial | AggregateMode::Single)
        || *hash_join.join_type() != JoinType::Inner
        || !agg.group_expr().is_single()
        || agg.group_expr().expr().is_empty()
        || agg.limit_options().is_some()
        || agg.properties().output_ordering().is_some()
        || agg
            .aggr_expr()
            .iter()
            .any(|a| a.is_distinct() || !a.order_bys().is_empty())
    {
        return None;
    }
    let (_, columns) = build_join_schema(
        &hash_join.left().schema(),
        &hash_join.right().schema(),
        hash_join.join_type(),
    );
    let map: Vec<JoinColumn> = match hash_join.projection.as_deref() {
        Some(p) => p.iter().map(|&k| columns.get(k).cloned()).collect::<Option<_>>()?,
        None => columns,
    };
    let mut group_columns = Vec::new();
    for (expr, _) in agg.group_expr().expr() {
        match map.get(expr.downcast_ref::<Column>()?.index()) {
            Some(JoinColumn {
                side: JoinSide::Left,
                index,
            }) => group_columns.push(*index),
            _ => return None,
        }
    }
    Some((map, group_columns))
}

/// Build rows whose groups are found on one thread while the probe partitions wait, of a build
/// side of `build_rows` rows with an estimated `groups` distinct groups (`None`: unknown), read
/// by `threads` threads: the second pass over the chunks' values of [`BuildGroups::compute`]
/// (each chunk holds at most every group), or every row when the groups are unknown.
fn serial_group_rows(build_rows: f64, groups: Option<f64>, threads: usize) -> f64 {
    match groups {
        Some(g) => build_rows.min(g * threads.max(1) as f64),
        None => build_rows,
    }
}

/// The build rows grouped on one thread (see [`serial_group_rows`]) when the partial aggregate
/// `agg` over `hash_join` (the join an [`MphfJoinExec`] runs, or would run) may be fused with
/// it; `None` when it may not. It may when the shape allows it and those rows are no more than
/// one probe partition's share of the probe rows (`GROUP BY c_name` over `orders ⋈ customer` at
/// SF 1 on 16 cores, 150 K build rows for 94 K probe rows per partition, ran at half vanilla's
/// speed fused, when every build row was grouped on one thread). Unknown row counts do not
/// forbid it (an unknown build side counts as no rows).
fn fused_serial_rows(agg: &AggregateExec, hash_join: &HashJoinExec, estimates: &RowEstimator) -> Option<f64> {
    fusable_shape(agg, hash_join)?;
    let partitions = hash_join.right().output_partitioning().partition_count().max(1);
    let build = estimates.datafusion_rows(hash_join.left());
    let probe = estimates.datafusion_rows(hash_join.right());
    let serial = serial_group_rows(build.unwrap_or(0.0), estimated_groups(agg), partitions);
    match (build, probe) {
        (Some(_), Some(probe)) if serial * partitions as f64 > probe => None,
        _ => Some(serial),
    }
}

/// The group join `agg` over `hash_join` makes, for the cost model, when they would be fused
/// (see [`fused_serial_rows`]); `None` otherwise.
pub(crate) fn group_join_shape(
    agg: &AggregateExec,
    hash_join: &HashJoinExec,
    estimates: &RowEstimator,
) -> Option<GroupJoinShape> {
    let serial_rows = fused_serial_rows(agg, hash_join, estimates)?;
    let input = agg.input_schema();
    let fixed = agg.group_expr().expr().iter().all(|(e, _)| {
        e.data_type(&input)
            .is_ok_and(|t| t.is_primitive() || t == DataType::Boolean)
    });
    Some(GroupJoinShape {
        key: if fixed { KeyKind::Fixed } else { KeyKind::Bytes },
        values: agg.aggr_expr().iter().map(|a| a.expressions().len()).sum(),
        serial_rows,
    })
}

impl Fused {
    /// The groups of `build`'s rows, computed once per build side (the partitions that ask
    /// while it is computed wait for it).
    fn groups_of(&self, build: &Arc<BuildSide>, pool: &Arc<dyn MemoryPool>) -> Result<Arc<BuildGroups>> {
        let mut guard = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((side, groups)) = guard.as_ref() {
            if side.upgrade().is_some_and(|s| Arc::ptr_eq(&s, build)) {
                return Ok(Arc::clone(groups));
            }
        }
        let groups = Arc::new(BuildGroups::compute(
            &build.batch,
            &self.group_columns,
            pool,
            build.threads,
        )?);
        *guard = Some((Arc::downgrade(build), Arc::clone(&groups)));
        Ok(groups)
    }

    /// The group of every slot of the probe key's own index for `prober`'s build side with its
    /// `groups`, made once per build side; `None` when the join's shape or this build side does
    /// not allow it (see [`Fused::direct`], [`SlotGroups`]).
    fn slot_groups_of(
        &self,
        prober: &Prober,
        groups: &BuildGroups,
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<Option<Arc<SlotGroups>>> {
        let build = &prober.build;
        if !self.direct || !build.strays.is_empty() {
            return Ok(None);
        }
        if !build.is_unique() {
            return Ok(None);
        }
        let mut guard = self.slot_groups.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((side, made)) = guard.as_ref() {
            if side.upgrade().is_some_and(|s| Arc::ptr_eq(&s, build)) {
                return Ok(made.clone());
            }
        }
        let made = match prober.translation_table() {
            Some(translation) => Some(Arc::new(SlotGroups::make(&translation, build, &groups.group_of, pool)?)),
            None => None,
        };
        *guard = Some((Arc::downgrade(build), made.clone()));
        Ok(made)
    }
}

/// [`SlotGroups::group_of_slot`] of a probe slot whose key is not in the build index.
const NOT_IN_BUILD_INDEX: u32 = u32::MAX;
/// [`SlotGroups::group_of_slot`] of a probe slot whose key is in the build index but has no
/// build row (a filtered build side).
const NO_BUILD_ROW: u32 = u32::MAX - 1;

/// The build group of every slot of the probe key's own index: the translation into the build
/// index, the build row of that slot and that row's group, composed once per build side.
///
/// Why: otherwise each pair costs three dependent reads at random places (the translation,
/// the slot table, the build row's group), each in a table over millions of entries once the
/// build side is large; this leaves one. Valid only while every build slot has at most one
/// row and no build row is a stray (its key missing from the index), which
/// [`Fused::slot_groups_of`] checks.
struct SlotGroups {
    /// Group of each probe slot, or [`NOT_IN_BUILD_INDEX`] / [`NO_BUILD_ROW`].
    group_of_slot: Vec<u32>,
    _reservation: MemoryReservation,
}

impl SlotGroups {
    /// Composes `translation`, the unique `build` side's row of each slot and `group_of` by row.
    fn make(
        translation: &SlotTranslation,
        build: &BuildSide,
        group_of: &[u32],
        pool: &Arc<dyn MemoryPool>,
    ) -> Result<Self> {
        let reservation = MemoryConsumer::new("MphfGroupJoinExec[slot groups]").register(pool);
        reservation.try_grow(translation.len() * 4)?;
        let group_of_slot = translation.then_map(|slot| match build.only_row(u64::from(slot)) {
            NO_ROW => NO_BUILD_ROW,
            row => group_of.get(row as usize).copied().unwrap_or(NO_BUILD_ROW),
        });
        Ok(Self {
            group_of_slot,
            _reservation: reservation,
        })
    }
}

/// One partition's accumulation.
struct GroupState {
    groups: Arc<BuildGroups>,
    accumulators: Vec<Box<dyn GroupsAccumulator>>,
    /// This partition's id of each build group ([`NOT_REACHED`] until a pair reaches it): the
    /// accumulators hold only the groups this partition reached, so a partition of a hash
    /// partitioned probe side keeps and emits its share of the groups, not all of them.
    local_of: Vec<u32>,
    /// The build group of each of this partition's ids, in the order they were reached.
    reached: Vec<u32>,
    /// This partition's group id per pair of the current batch.
    group_ids: Vec<usize>,
    /// The group of each probe slot, when the probe reads groups by slot.
    direct: Option<Arc<SlotGroups>>,
    /// The current batch's probe slots (the direct path).
    slots: Vec<u64>,
}

/// This partition's id of build group `g`, given one when `g` is reached first.
fn reach(local_of: &mut [u32], reached: &mut Vec<u32>, g: u32) -> usize {
    let mut local = local_of[g as usize];
    if local == NOT_REACHED {
        local = reached.len() as u32;
        local_of[g as usize] = local;
        reached.push(g);
    }
    local as usize
}

/// [`GroupState::local_of`] of a build group that no pair of the partition reached yet.
const NOT_REACHED: u32 = u32::MAX;

impl GroupState {
    /// Adds the pairs of one probe batch; true when their groups were read by slot.
    fn update(&mut self, node: &Fused, prober: &Prober, batch: &RecordBatch) -> Result<bool> {
        let (b, p) = match self.direct.clone() {
            Some(direct) if prober.probe_slots(batch, &mut self.slots)? => (None, self.direct_pairs(&direct, prober)?),
            _ => {
                let (b, p) = prober.pairs(batch)?;
                self.group_ids.clear();
                for &row in &b {
                    let g = self.groups.group_of[row as usize];
                    self.group_ids.push(reach(&mut self.local_of, &mut self.reached, g));
                }
                (Some(UInt32Array::from(b)), p)
            }
        };
        let by_slot = b.is_none();
        if p.is_empty() {
            return Ok(by_slot);
        }
        let identity = p.len() == batch.num_rows() && p.iter().enumerate().all(|(i, &r)| r as usize == i);
        let p = UInt32Array::from(p);
        let columns = node
            .read
            .iter()
            .map(|c| match c.side {
                JoinSide::Left => match &b {
                    Some(b) => Ok(take(prober.build.batch.column(c.index).as_ref(), b, None)?),
                    None => internal_err!("MphfGroupJoinExec: a build column read on the direct path"),
                },
                JoinSide::Right if identity => Ok(Arc::clone(batch.column(c.index))),
                JoinSide::Right => Ok(take(batch.column(c.index).as_ref(), &p, None)?),
                JoinSide::None => internal_err!("MphfGroupJoinExec: a column without a side"),
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(p.len()));
        let pairs = RecordBatch::try_new_with_options(Arc::clone(&node.read_schema), columns, &options)?;
        let total = self.reached.len();
        for ((acc, args), filter) in self.accumulators.iter_mut().zip(&node.args).zip(&node.filters) {
            let values = args
                .iter()
                .map(|e| e.evaluate(&pairs)?.into_array(pairs.num_rows()))
                .collect::<Result<Vec<_>>>()?;
            let filter = match filter {
                Some(f) => {
                    let mask = f.evaluate(&pairs)?.into_array(pairs.num_rows())?;
                    match mask.as_any().downcast_ref::<BooleanArray>() {
                        Some(m) => Some(m.clone()),
                        None => return internal_err!("MphfGroupJoinExec: a FILTER that is not boolean"),
                    }
                }
                None => None,
            };
            acc.update_batch(&values, &self.group_ids, filter.as_ref(), total)?;
        }
        Ok(by_slot)
    }

    /// The probe rows of the current batch's slots (`self.slots`) that have a build row, in
    /// order, with their groups' ids in `self.group_ids` (the direct path: no build row
    /// numbers).
    fn direct_pairs(&mut self, direct: &SlotGroups, prober: &Prober) -> Result<Vec<u32>> {
        let _t = prober.metrics.join_time.timer();
        let n = self.slots.len();
        prober.metrics.probe_rows.add(n);
        prober.metrics.probe_translated.add(n);
        self.group_ids.clear();
        let mut p = Vec::with_capacity(n);
        let mut absent = 0;
        for (i, &s) in self.slots.iter().enumerate() {
            let g = match s {
                ABSENT => NOT_IN_BUILD_INDEX,
                s => match direct.group_of_slot.get(s as usize) {
                    Some(&g) => g,
                    None => return internal_err!("MphfGroupJoinExec: probe slot {s} outside its index"),
                },
            };
            if g >= NO_BUILD_ROW {
                absent += usize::from(g == NOT_IN_BUILD_INDEX);
                continue;
            }
            self.group_ids.push(reach(&mut self.local_of, &mut self.reached, g));
            p.push(i as u32);
        }
        prober.metrics.probe_absent.add(absent);
        Ok(p)
    }

    /// The rows of the reached groups in the order they were reached (partial states, or final
    /// values when `final_output`), in batches of at most `batch_size` rows.
    fn emit(mut self, schema: &SchemaRef, final_output: bool, batch_size: usize) -> Result<Vec<RecordBatch>> {
        if self.reached.is_empty() {
            return Ok(Vec::new());
        }
        let order = UInt32Array::from(std::mem::take(&mut self.reached));
        let mut columns = Vec::with_capacity(schema.fields().len());
        for values in &self.groups.values {
            columns.push(take(values.as_ref(), &order, None)?);
        }
        for acc in &mut self.accumulators {
            if final_output {
                columns.push(acc.evaluate(EmitTo::All)?);
                continue;
            }
            columns.extend(acc.state(EmitTo::All)?);
        }
        if columns.len() != schema.fields().len() {
            return internal_err!(
                "MphfGroupJoinExec: {} output columns for a schema of {}",
                columns.len(),
                schema.fields().len()
            );
        }
        let out = RecordBatch::try_new(Arc::clone(schema), columns)?;
        let (len, step) = (out.num_rows(), batch_size.max(1));
        Ok((0..len)
            .step_by(step)
            .map(|o| out.slice(o, step.min(len - o)))
            .collect())
    }
}

impl DisplayAs for MphfGroupJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let gby: Vec<String> = self
            .agg
            .group_expr()
            .expr()
            .iter()
            .map(|(e, name)| format!("{e} as {name}"))
            .collect();
        let aggr: Vec<&str> = self.agg.aggr_expr().iter().map(|a| a.name()).collect();
        match t {
            DisplayFormatType::TreeRender => write!(f, "gby={}", gby.join(", ")),
            _ => {
                let join = DisplayableExecutionPlan::new(self.join.as_ref()).one_line().to_string();
                write!(
                    f,
                    "MphfGroupJoinExec: mode={:?}, gby=[{}], aggr=[{}], join=[{}]",
                    self.agg.mode(),
                    gby.join(", "),
                    aggr.join(", "),
                    join.trim_end()
                )
            }
        }
    }
}

impl ExecutionPlan for MphfGroupJoinExec {
    fn name(&self) -> &str {
        "MphfGroupJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.agg.properties()
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        self.join.input_distribution_requirements()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        self.join.benefits_from_input_partitioning()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.join.children()
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
        let join = Arc::clone(&self.join).replace_children(children, options)?;
        let plan = Arc::clone(&self.agg).replace_children(vec![join], options)?;
        let Some(agg) = plan.downcast_ref::<AggregateExec>() else {
            return internal_err!("MphfGroupJoinExec: the aggregate changed type");
        };
        // New children the group join does not take (other estimates) keep the plain aggregate
        // over the join: the same rows.
        Ok(match Self::try_fuse(&Arc::new(agg.clone()), &RowEstimator::new())? {
            Some(fused) => Arc::new(fused),
            None => plan,
        })
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(children, ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute))
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let build = self.join.build_for(partition, &context)?;
        let probe_input = self.join.join().right().execute(partition, Arc::clone(&context))?;
        let make_prober = self.join.prober_for(partition, &context);
        let read_ahead = self.join.read_ahead_for(partition, &context);
        let accumulators = self
            .agg
            .aggr_expr()
            .iter()
            .map(groups_accumulator)
            .collect::<Result<Vec<_>>>()?;
        let node = Arc::clone(&self.fused);
        let schema = self.schema();
        let batch_size = context.session_config().batch_size();
        let final_output = *self.agg.mode() == AggregateMode::Single;
        let pool = Arc::clone(context.memory_pool());
        let reservation =
            MemoryConsumer::new(format!("MphfGroupJoinExec[{partition}]")).register(context.memory_pool());
        let groups_time = MetricBuilder::new(&self.metrics).subset_time("build_groups_time", partition);
        let aggregation_time = MetricBuilder::new(&self.metrics).subset_time("aggregation_time", partition);
        let emitting_time = MetricBuilder::new(&self.metrics).subset_time("emitting_time", partition);
        let by_slot_rows = MetricBuilder::new(&self.metrics).counter("probe_rows_grouped_by_slot", partition);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let out_schema = Arc::clone(&schema);
        let out = futures::stream::once(async move {
            let (build, probe_input) = read_ahead.await_build(build, probe_input).await;
            let build = build.map_err(DataFusionError::Shared)?;
            let groups = {
                let _t = groups_time.timer();
                node.groups_of(&build, &pool)?
            };
            let prober = make_prober(build);
            let direct = {
                let _t = groups_time.timer();
                node.slot_groups_of(&prober, &groups, &pool)?
            };
            let mut state = GroupState {
                local_of: vec![NOT_REACHED; groups.groups()],
                reached: Vec::new(),
                groups,
                accumulators,
                group_ids: Vec::new(),
                direct,
                slots: Vec::new(),
            };
            let mut probe_input = probe_input;
            while let Some(batch) = probe_input.next().await {
                let batch = batch?;
                let _t = aggregation_time.timer();
                if state.update(&node, &prober, &batch)? {
                    by_slot_rows.add(batch.num_rows());
                }
                let held = state.local_of.len() * 4 + state.accumulators.iter().map(|a| a.size()).sum::<usize>();
                reservation.try_resize(held)?;
            }
            prober.finish()?;
            let _t = emitting_time.timer();
            let batches = state.emit(&out_schema, final_output, batch_size)?;
            Ok::<_, DataFusionError>(futures::stream::iter(batches.into_iter().map(Ok)))
        })
        .try_flatten()
        .inspect(move |b| {
            if let Ok(b) = b {
                baseline.record_output(b.num_rows());
            }
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, out)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        let mut all = self.metrics.clone_inner();
        if let Some(join) = self.join.metrics() {
            for m in join.iter() {
                all.push(Arc::clone(m));
            }
        }
        Some(all)
    }

    /// The replaced partial aggregate's statistics over the join's (partition by partition:
    /// the aggregate keeps the join's partitions).
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let pairs = self.join.statistics_from_inputs(input_stats, args)?;
        self.agg.statistics_from_inputs(&[pairs], args)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.join.child_stats_requests(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datafusion::arrow::array::{Int64Array, StringArray};
    use ::datafusion::execution::memory_pool::UnboundedMemoryPool;

    #[test]
    fn chunks_cover_every_row_once_in_order() {
        for (rows, threads) in [
            (0, 4),
            (1, 4),
            (65_535, 16),
            (65_536 * 3 + 7, 2),
            (1_000_003, 16),
            (500_000, 1),
        ] {
            let chunks = group_chunks(rows, threads);
            let mut next = 0;
            for &(offset, len) in &chunks {
                assert_eq!(offset, next, "{rows} rows, {threads} threads: {chunks:?}");
                assert!(len > 0);
                next += len;
            }
            assert_eq!(next, rows, "{rows} rows, {threads} threads: {chunks:?}");
            assert!(chunks.len() <= threads.max(1));
            if chunks.len() > 1 {
                assert!(
                    chunks.iter().all(|&(_, len)| len >= MIN_GROUP_CHUNK_ROWS / 2),
                    "{chunks:?}"
                );
            }
        }
    }

    /// Groups found in chunks at once and merged give each row the group of its values: equal
    /// values share a group, different values (NULL included) do not, across chunk borders.
    #[test]
    fn chunked_groups_give_every_row_its_values_group() {
        let rows = 300_000;
        let name = StringArray::from_iter((0..rows).map(|r| (r % 11 != 0).then(|| format!("c{}", (r * 7) % 1_000))));
        let tier = Int64Array::from_iter_values((0..rows).map(|r| (r % 3) as i64));
        let schema = Arc::new(Schema::new(vec![
            Field::new("name", DataType::Utf8, true),
            Field::new("tier", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(name.clone()), Arc::new(tier.clone())]).unwrap();
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let pool4 = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
        // Four chunks on all cores, one on the caller: the same groups either way.
        for threads in [BuildThreads::AllCores, BuildThreads::Caller] {
            let groups = pool4
                .install(|| BuildGroups::compute(&batch, &[0, 1], &pool, threads))
                .unwrap();
            let names = groups.values[0].as_any().downcast_ref::<StringArray>().unwrap();
            let tiers = groups.values[1].as_any().downcast_ref::<Int64Array>().unwrap();
            let mut seen = std::collections::HashMap::new();
            for r in 0..rows {
                let g = groups.group_of[r] as usize;
                let value = (name.is_valid(r).then(|| name.value(r)), tier.value(r));
                assert_eq!(
                    (names.is_valid(g).then(|| names.value(g)), tiers.value(g)),
                    value,
                    "row {r}, {threads:?}"
                );
                assert_eq!(*seen.entry(value).or_insert(g), g, "row {r}: {value:?} in two groups");
            }
            assert_eq!(groups.groups(), seen.len());
        }
    }
}
