//! Join sides that read their slots from the slot maps instead of looking their keys up.
//!
//! When a join key of an [`MphfJoinExec`](super::MphfJoinExec) is the indexed column of a
//! Parquet table with slot maps, the rule puts a slot-map scan under that side (see
//! [`attach_scan_slots`]), and each row arrives with its slot:
//! - on the build side, the build copies it (see [`super::build`]). Without it, every build
//!   row costs one MPHF query, on as many tasks as the build side has partitions (a file's row
//!   groups, not the machine's cores, bound that);
//! - on the probe side, the probe translates it into the build index's slot (see
//!   [`super::translate`]).
//!
//! # Invariants
//! - The join's output is unchanged: the appended slot column is its side's last column, and
//!   the join's projection skips it (the output columns after it move up by one).
//! - The join's keys and filter refer to a side's columns by position, which the appended
//!   column at the end does not move.
//!
//! # Distributed plans
//! A hash repartition or a coalesce between a side's scan and the join becomes a network
//! exchange in a datafusion-distributed plan, and the slot column travels through it with every
//! row (4 or 8 bytes each, encoded, sent and decoded). Where the key's lookup costs about one
//! array read (a dense key table), that transfer costs more than the lookup it saves, so the
//! rule leaves such a side without scan slots ([`slots_cross_exchange`]).

use std::sync::Arc;

use ::datafusion::arrow::datatypes::Schema;
use ::datafusion::common::{JoinType, Result};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::joins::utils::build_join_schema;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::{ExecutionPlan, Partitioning};

use crate::datafusion::registry::{index_of_field, IndexHandle};
use crate::datafusion::slot_scan::{
    attach_scan_slots, scan_slots_position, scan_slots_reach, KeyColumn, SlotScanExec, SCAN_SLOTS_COLUMN,
};
use crate::datafusion::table::MphfRelabelExec;

/// `join` with a slot-map scan under its build side for key pair `key` (indexed by `handle`),
/// its output unchanged; `None` when the table has no slot maps, the build side already
/// carries them, or a node between the join and the scan cannot carry the slot column.
pub(crate) fn with_build_scan_slots(
    join: &HashJoinExec,
    key: usize,
    handle: &Arc<IndexHandle>,
) -> Result<Option<HashJoinExec>> {
    let Some(col) = build_key_for_slots(join, key, handle) else {
        return Ok(None);
    };
    let left = join.left();
    // The build reads the key of every row (strays, residual keys, the verified fallback).
    let Some((slotted, _)) = attach_scan_slots(left, col, handle, KeyColumn::Read)? else {
        return Ok(None);
    };
    let old_left = left.schema().fields().len();
    // Where the join's full output holds build columns, the slot column follows them.
    let holds_build_columns = !matches!(
        join.join_type(),
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
    );
    let rebuilt = with_slot_column_skipped(join, slotted, Arc::clone(join.right()), |_| {
        holds_build_columns.then_some(old_left)
    })?;
    if rebuilt.schema().fields() != join.schema().fields() {
        return Ok(None);
    }
    Ok(Some(rebuilt))
}

/// `join` with the probe key's slots appended to its probe side by a slot-map scan, when the
/// probe key is an indexed column of a table with slot maps, its output unchanged; `None`
/// otherwise.
pub(crate) fn with_probe_scan_slots(join: &HashJoinExec, key: usize) -> Result<Option<HashJoinExec>> {
    let Some((col, index)) = probe_key_for_slots(join, key) else {
        return Ok(None);
    };
    let Some((right, _)) = attach_scan_slots(join.right(), col, &index, KeyColumn::Read)? else {
        return Ok(None);
    };
    let rebuilt = with_slot_column_skipped(join, Arc::clone(join.left()), right, |full| {
        full.fields().iter().position(|f| f.name() == SCAN_SLOTS_COLUMN)
    })?;
    if rebuilt.schema().fields().len() != join.schema().fields().len() {
        return Ok(None);
    }
    Ok(Some(rebuilt))
}

/// The column of `join`'s build key `key` when a slot-map scan of `handle`'s index could go
/// under the build side: the table has slot maps, the column holds the index's key type, and
/// the side carries no slot column of that index yet.
fn build_key_for_slots(join: &HashJoinExec, key: usize, handle: &IndexHandle) -> Option<usize> {
    let col = join.on().get(key)?.0.downcast_ref::<Column>()?;
    let left_schema = join.left().schema();
    let field = left_schema.fields().get(col.index())?;
    (handle.slot_maps().is_some()
        && handle.index().keys().data_type() == field.data_type()
        && scan_slots_position(&left_schema, handle).is_none())
    .then_some(col.index())
}

/// The column of `join`'s probe key `key` and its index when a slot-map scan could go under
/// the probe side: the column is indexed, of the index's key type, and has slot maps.
fn probe_key_for_slots(join: &HashJoinExec, key: usize) -> Option<(usize, Arc<IndexHandle>)> {
    let col = join.on().get(key)?.1.downcast_ref::<Column>()?;
    let right_schema = join.right().schema();
    let field = right_schema.fields().get(col.index())?;
    let index = index_of_field(field)?;
    (index.slot_maps().is_some() && index.index().keys().data_type() == field.data_type())
        .then_some((col.index(), index))
}

/// Whether [`with_build_scan_slots`] would find the slot-map scan for `join`'s build side
/// (see [`scan_slots_reach`]: priced before it is built).
pub(crate) fn build_scan_slots_reach(join: &HashJoinExec, key: usize, handle: &Arc<IndexHandle>) -> Result<bool> {
    match build_key_for_slots(join, key, handle) {
        Some(col) => scan_slots_reach(join.left(), col, handle, KeyColumn::Read),
        None => Ok(false),
    }
}

/// Whether [`with_probe_scan_slots`] would find the slot-map scan for `join`'s probe side.
pub(crate) fn probe_scan_slots_reach(join: &HashJoinExec, key: usize) -> Result<bool> {
    match probe_key_for_slots(join, key) {
        Some((col, index)) => scan_slots_reach(join.right(), col, &index, KeyColumn::Read),
        None => Ok(false),
    }
}

/// Whether the slot-map scan under `side` (a join side that [`attach_scan_slots`] gave a slot
/// column, or would give one: the scan then replaces the side's relabel node) reaches the join
/// through a hash repartition or a coalesce of partitions, the nodes a distributed planner
/// turns into network exchanges. False where neither is found down the chain of single-child
/// nodes.
pub(crate) fn slots_cross_exchange(side: &Arc<dyn ExecutionPlan>) -> bool {
    let mut node = side;
    let mut crossed = false;
    loop {
        if node.downcast_ref::<SlotScanExec>().is_some() || node.downcast_ref::<MphfRelabelExec>().is_some() {
            return crossed;
        }
        crossed |= node.downcast_ref::<CoalescePartitionsExec>().is_some()
            || node
                .downcast_ref::<RepartitionExec>()
                .is_some_and(|r| matches!(r.partitioning(), Partitioning::Hash(..)));
        match node.children()[..] {
            [child] => node = child,
            _ => return false,
        }
    }
}

/// `join` over `left` and `right` (its sides, one of them with a slot column appended), with a
/// projection that gives `join`'s output: `slot_at` finds the slot column in the new sides'
/// full join output (`None`: the output does not hold that side), and the projection skips it.
fn with_slot_column_skipped(
    join: &HashJoinExec,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    slot_at: impl FnOnce(&Schema) -> Option<usize>,
) -> Result<HashJoinExec> {
    let wanted: Vec<usize> = match join.projection.as_deref() {
        Some(p) => p.to_vec(),
        None => (0..build_join_schema(&join.left().schema(), &join.right().schema(), join.join_type())
            .0
            .fields()
            .len())
            .collect(),
    };
    let (full, _) = build_join_schema(&left.schema(), &right.schema(), join.join_type());
    let projection = match slot_at(&full) {
        Some(at) => wanted.into_iter().map(|i| if i >= at { i + 1 } else { i }).collect(),
        None => wanted,
    };
    join.builder()
        .with_new_children(vec![left, right])?
        .with_projection(Some(projection))
        .recompute_properties()
        .build()
}
