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
    attach_scan_slots, scan_slots_position, KeyColumn, SlotScanExec, SCAN_SLOTS_COLUMN,
};

/// `join` with a slot-map scan under its build side for key pair `key` (indexed by `handle`),
/// its output unchanged; `None` when the table has no slot maps, the build side already
/// carries them, or a node between the join and the scan cannot carry the slot column.
pub(crate) fn with_build_scan_slots(
    join: &HashJoinExec,
    key: usize,
    handle: &Arc<IndexHandle>,
) -> Result<Option<HashJoinExec>> {
    let Some(col) = join.on().get(key).and_then(|(l, _)| l.downcast_ref::<Column>()) else {
        return Ok(None);
    };
    let left = join.left();
    let left_schema = left.schema();
    let Some(field) = left_schema.fields().get(col.index()) else {
        return Ok(None);
    };
    if handle.slot_maps().is_none()
        || handle.index().keys().data_type() != field.data_type()
        || scan_slots_position(&left_schema, handle).is_some()
    {
        return Ok(None);
    }
    // The build reads the key of every row (strays, residual keys, the verified fallback).
    let Some((slotted, _)) = attach_scan_slots(left, col.index(), handle, KeyColumn::Read)? else {
        return Ok(None);
    };
    let old_left = left_schema.fields().len();
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
    let Some(col) = join.on().get(key).and_then(|(_, r)| r.downcast_ref::<Column>()) else {
        return Ok(None);
    };
    let Some(index) = join
        .right()
        .schema()
        .fields()
        .get(col.index())
        .and_then(|f| index_of_field(f))
    else {
        return Ok(None);
    };
    if index.slot_maps().is_none()
        || index.index().keys().data_type() != join.right().schema().field(col.index()).data_type()
    {
        return Ok(None);
    }
    let Some((right, _)) = attach_scan_slots(join.right(), col.index(), &index, KeyColumn::Read)? else {
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

/// Whether the slot-map scan under `side` (a join side that [`attach_scan_slots`] gave a slot
/// column) reaches the join through a hash repartition or a coalesce of partitions, the nodes a
/// distributed planner turns into network exchanges. False where no slot-map scan is found
/// down the chain of single-child nodes.
pub(crate) fn slots_cross_exchange(side: &Arc<dyn ExecutionPlan>) -> bool {
    let mut node = side;
    let mut crossed = false;
    loop {
        if node.downcast_ref::<SlotScanExec>().is_some() {
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
