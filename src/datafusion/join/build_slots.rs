//! Build sides that read their slots from the slot maps instead of looking their keys up.
//!
//! When the build key of an [`MphfJoinExec`](super::MphfJoinExec) is the indexed column of a
//! Parquet table with slot maps, the rule puts a slot-map scan under the build side (see
//! [`attach_scan_slots`]): each build row then arrives with its slot, and the build copies it
//! (see [`super::build`]). Without it, every build row costs one MPHF query, on as many tasks
//! as the build side has partitions (a file's row groups, not the machine's cores, bound that).
//!
//! # Invariants
//! - The join's output is unchanged: the appended slot column is the build side's last column,
//!   and the join's projection skips it (the columns after it move up by one).
//! - The join's keys and filter refer to build columns by position, which the appended column
//!   at the end does not move.

use std::sync::Arc;

use ::datafusion::common::{JoinType, Result};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_plan::joins::utils::build_join_schema;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::ExecutionPlan;

use crate::datafusion::registry::IndexHandle;
use crate::datafusion::slot_scan::{attach_scan_slots, scan_slots_position, KeyColumn};

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
    let right = Arc::clone(join.right());
    let old_left = left_schema.fields().len();
    let wanted: Vec<usize> = match join.projection.as_deref() {
        Some(p) => p.to_vec(),
        None => (0..build_join_schema(&left_schema, &right.schema(), join.join_type())
            .0
            .fields()
            .len())
            .collect(),
    };
    // Where the join's full output holds build columns, the slot column follows them.
    let holds_build_columns = !matches!(
        join.join_type(),
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
    );
    let projection = wanted
        .into_iter()
        .map(|i| if holds_build_columns && i >= old_left { i + 1 } else { i })
        .collect();
    let rebuilt = join
        .builder()
        .with_new_children(vec![slotted, right])?
        .with_projection(Some(projection))
        .recompute_properties()
        .build()?;
    if rebuilt.schema().fields() != join.schema().fields() {
        return Ok(None);
    }
    Ok(Some(rebuilt))
}
