//! [`DepValues`]: the dependent group values of a [`SlotGroups`](super::groups::SlotGroups),
//! kept column by column.
//!
//! # Why
//! A GROUP BY on an indexed key with dependent columns (`GROUP BY c_custkey, c_name, c_phone,
//! …`) still checks every row's dependent values against the group of its slot: the index does
//! not know that they depend on the key. Converting every row to arrow's row format for that
//! check, and decoding the groups' rows again to emit them, cost more than the rest of the
//! aggregation (benches/RESULTS.md, "Q4 and Q10 at SF 1"). Here the check is
//! columnar: a group's values stay in small arrays copied from the row that created it; a
//! batch gathers each row's reference values with `interleave` and compares them with
//! `not_distinct` (NULL equals NULL, as grouping requires); emission gathers the groups'
//! values the same way. The row format is left to the rare rows that differ (their mismatch
//! group is keyed by it) and to the partials form's hand-over (once per group).
//!
//! # Invariants
//! - `refs[g]` says where group `g`'s values are: a row of a stored chunk, a row of the batch
//!   being accumulated (until [`DepValues::store_created`] copies it), or nowhere (fallback
//!   groups, whose whole key is kept elsewhere). Groups are registered in group-id order.
//! - A stored chunk holds only the rows that created groups, view columns compacted, so it
//!   never keeps an input batch's buffers alive.

use std::sync::Arc;

use ::datafusion::arrow::array::{new_empty_array, Array, ArrayRef, BooleanArray, UInt32Array};
use ::datafusion::arrow::compute::kernels::boolean::and;
use ::datafusion::arrow::compute::kernels::cmp::not_distinct;
use ::datafusion::arrow::compute::{interleave, take};
use ::datafusion::arrow::datatypes::DataType;
use ::datafusion::arrow::row::{RowConverter, SortField};
use ::datafusion::common::{internal_err, Result};

use crate::datafusion::compact_views::compact_view_column;

/// Where a group's values are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ValuesAt {
    /// Row `row` of stored chunk `chunk`.
    Stored { chunk: u32, row: u32 },
    /// Row `row` of the batch being accumulated.
    Batch(u32),
    /// The group has no dependent values here (a fallback group).
    Nowhere,
}

/// The dependent values of a state's groups (see the module docs).
#[derive(Debug)]
pub(super) struct DepValues {
    /// Type of each dependent column.
    types: Vec<DataType>,
    /// Stored chunks: one array per dependent column each.
    chunks: Vec<Vec<ArrayRef>>,
    /// Where each group's values are, by group id.
    refs: Vec<ValuesAt>,
    /// Groups whose values are still rows of the batch being accumulated.
    created: Vec<u32>,
    /// Bytes of the stored chunks.
    stored_bytes: usize,
}

impl DepValues {
    /// Values of the dependent columns of types `types`, for no groups yet.
    pub(super) fn new(types: Vec<DataType>) -> Self {
        Self {
            types,
            chunks: Vec::new(),
            refs: Vec::new(),
            created: Vec::new(),
            stored_bytes: 0,
        }
    }

    /// Registers group `g`, created by row `row` of the current batch (`None`: a group without
    /// dependent values). Groups are registered in id order.
    pub(super) fn register(&mut self, g: usize, row: Option<usize>) -> Result<()> {
        if g != self.refs.len() {
            return internal_err!(
                "MphfAggregateExec: group {g} registered after {} groups",
                self.refs.len()
            );
        }
        match row {
            Some(row) => {
                self.refs.push(ValuesAt::Batch(row as u32));
                self.created.push(g as u32);
            }
            None => self.refs.push(ValuesAt::Nowhere),
        }
        Ok(())
    }

    /// The rows of the current batch (dependent columns `columns`, group of each row `groups`)
    /// whose values differ from their group's, in ascending order; rows for which `skip` holds
    /// are not compared.
    pub(super) fn mismatched_rows(
        &self,
        columns: &[ArrayRef],
        groups: &[usize],
        skip: impl Fn(usize) -> bool,
    ) -> Result<Vec<usize>> {
        if columns.len() != self.types.len() {
            return internal_err!(
                "MphfAggregateExec: {} dependent columns, expected {}",
                columns.len(),
                self.types.len()
            );
        }
        let batch = self.chunks.len();
        let mut at = Vec::with_capacity(groups.len());
        for (i, &g) in groups.iter().enumerate() {
            at.push(match self.refs.get(g) {
                _ if skip(i) => (batch, i),
                Some(ValuesAt::Stored { chunk, row }) => (*chunk as usize, *row as usize),
                Some(ValuesAt::Batch(row)) => (batch, *row as usize),
                Some(ValuesAt::Nowhere) | None => {
                    return internal_err!("MphfAggregateExec: row {i} of group {g}, which has no dependent values")
                }
            });
        }
        let mut equal: Option<BooleanArray> = None;
        for (c, column) in columns.iter().enumerate() {
            let mut sources: Vec<&dyn Array> = self.chunks.iter().map(|chunk| chunk[c].as_ref()).collect();
            sources.push(column.as_ref());
            let reference = interleave(&sources, &at)?;
            let same = values_equal(column, &reference)?;
            equal = Some(match equal {
                Some(e) => and(&e, &same)?,
                None => same,
            });
        }
        let Some(equal) = equal else {
            return Ok(Vec::new());
        };
        Ok((0..groups.len()).filter(|&i| !equal.value(i) && !skip(i)).collect())
    }

    /// Copies the values of the groups the current batch (dependent columns `columns`) created
    /// into a stored chunk: after this, the batch may go.
    pub(super) fn store_created(&mut self, columns: &[ArrayRef]) -> Result<()> {
        if self.created.is_empty() {
            return Ok(());
        }
        let rows = UInt32Array::from_iter_values(self.created.iter().map(|&g| match self.refs[g as usize] {
            ValuesAt::Batch(row) => row,
            _ => 0,
        }));
        let chunk = columns
            .iter()
            .map(|c| Ok(compact_view_column(take(c.as_ref(), &rows, None)?)))
            .collect::<Result<Vec<ArrayRef>>>()?;
        let id = self.chunks.len() as u32;
        for (k, &g) in self.created.iter().enumerate() {
            self.refs[g as usize] = ValuesAt::Stored {
                chunk: id,
                row: k as u32,
            };
        }
        self.stored_bytes += chunk.iter().map(|a| a.get_array_memory_size()).sum::<usize>();
        self.chunks.push(chunk);
        self.created.clear();
        Ok(())
    }

    /// The dependent columns of groups `groups`, in that order (all stored, all with values).
    pub(super) fn gather(&self, groups: &[u32]) -> Result<Vec<ArrayRef>> {
        let at = groups
            .iter()
            .map(|&g| match self.refs.get(g as usize) {
                Some(ValuesAt::Stored { chunk, row }) => Ok((*chunk as usize, *row as usize)),
                _ => internal_err!("MphfAggregateExec: group {g} has no stored dependent values"),
            })
            .collect::<Result<Vec<_>>>()?;
        (0..self.types.len())
            .map(|c| {
                if at.is_empty() {
                    return Ok(new_empty_array(&self.types[c]));
                }
                let sources: Vec<&dyn Array> = self.chunks.iter().map(|chunk| chunk[c].as_ref()).collect();
                Ok(interleave(&sources, &at)?)
            })
            .collect()
    }

    /// Forgets every group.
    pub(super) fn clear(&mut self) {
        self.chunks.clear();
        self.refs.clear();
        self.created.clear();
        self.stored_bytes = 0;
    }

    /// Bytes held.
    pub(super) fn size(&self) -> usize {
        self.stored_bytes + self.refs.capacity() * std::mem::size_of::<ValuesAt>() + self.created.capacity() * 4
    }
}

/// Row by row, whether `a` and `b` hold the same value (NULL equal to NULL). Types that
/// arrow's comparison kernels do not cover (nested ones) are compared in row format.
fn values_equal(a: &ArrayRef, b: &ArrayRef) -> Result<BooleanArray> {
    if let Ok(equal) = not_distinct(a, b) {
        return Ok(equal);
    }
    let converter = RowConverter::new(vec![SortField::new(a.data_type().clone())])?;
    let left = converter.convert_columns(std::slice::from_ref(a))?;
    let right = converter.convert_columns(&[Arc::clone(b)])?;
    Ok((0..a.len()).map(|i| Some(left.row(i) == right.row(i))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datafusion::arrow::array::{AsArray, Int64Array, ListArray, StringViewArray};
    use ::datafusion::arrow::datatypes::Int64Type;

    fn strings(values: &[Option<&str>]) -> ArrayRef {
        Arc::new(StringViewArray::from(values.to_vec()))
    }

    #[test]
    fn rows_that_differ_from_their_groups_values_are_found_across_batches() {
        let mut deps = DepValues::new(vec![DataType::Utf8View, DataType::Int64]);
        // Batch 1: rows 0 and 2 create groups 0 and 1; row 1 repeats group 0 with another
        // name, row 3 repeats group 1 exactly.
        let names = strings(&[Some("alice"), Some("alicia"), None, None]);
        let ages: ArrayRef = Arc::new(Int64Array::from(vec![Some(30), Some(30), None, None]));
        deps.register(0, Some(0)).unwrap();
        deps.register(1, Some(2)).unwrap();
        let batch1 = [names, ages];
        assert_eq!(
            deps.mismatched_rows(&batch1, &[0, 0, 1, 1], |_| false).unwrap(),
            vec![1]
        );
        deps.store_created(&batch1).unwrap();
        // Batch 2 compares with the stored values; a skipped row is never reported.
        let names = strings(&[None, Some("alice"), Some("alice"), Some("x")]);
        let ages: ArrayRef = Arc::new(Int64Array::from(vec![None, Some(31), Some(30), Some(1)]));
        let batch2 = [names, ages];
        assert_eq!(
            deps.mismatched_rows(&batch2, &[1, 0, 0, 0], |i| i == 3).unwrap(),
            vec![1]
        );
        let gathered = deps.gather(&[1, 0]).unwrap();
        let names = gathered[0].as_string_view();
        assert!(names.is_null(0));
        assert_eq!(names.value(1), "alice");
        assert!(gathered[1].is_null(0));
        assert_eq!(gathered[1].as_primitive::<Int64Type>().value(1), 30);
    }

    /// With several stored chunks, a row is compared with the chunk its group is stored in, and
    /// a row that created its group in the batch matches its own values.
    #[test]
    fn rows_compare_with_the_chunk_their_group_is_stored_in() {
        let mut deps = DepValues::new(vec![DataType::Utf8View]);
        deps.register(0, Some(0)).unwrap();
        let first = [strings(&[Some("ann")])];
        assert!(deps.mismatched_rows(&first, &[0], |_| false).unwrap().is_empty());
        deps.store_created(&first).unwrap();
        deps.register(1, Some(0)).unwrap();
        let second = [strings(&[Some("bob")])];
        assert!(deps.mismatched_rows(&second, &[1], |_| false).unwrap().is_empty());
        deps.store_created(&second).unwrap();
        // Group 1 (stored second) and group 2, created by row 1 and repeated by row 3.
        deps.register(2, Some(1)).unwrap();
        let third = [strings(&[
            Some("bob"),
            Some("cy"),
            Some("ann"),
            Some("cy"),
            Some("cyd"),
        ])];
        assert_eq!(
            deps.mismatched_rows(&third, &[1, 2, 1, 2, 2], |_| false).unwrap(),
            vec![2, 4]
        );
    }

    #[test]
    fn nested_values_are_compared_in_row_format() {
        let list = |v: Vec<Option<Vec<Option<i64>>>>| -> ArrayRef {
            Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(v))
        };
        let mut deps = DepValues::new(vec![list(vec![]).data_type().clone()]);
        deps.register(0, Some(0)).unwrap();
        let batch = [list(vec![
            Some(vec![Some(1), None]),
            Some(vec![Some(1), None]),
            Some(vec![Some(2)]),
        ])];
        assert_eq!(deps.mismatched_rows(&batch, &[0, 0, 0], |_| false).unwrap(), vec![2]);
    }

    #[test]
    fn a_group_without_values_is_an_error_when_a_row_refers_to_it() {
        let mut deps = DepValues::new(vec![DataType::Int64]);
        deps.register(0, None).unwrap();
        let column: ArrayRef = Arc::new(Int64Array::from(vec![1]));
        let err = deps.mismatched_rows(&[column], &[0], |_| false).unwrap_err();
        assert!(
            err.to_string()
                .contains("row 0 of group 0, which has no dependent values"),
            "{err}"
        );
        assert!(deps
            .register(5, None)
            .unwrap_err()
            .to_string()
            .contains("group 5 registered after 1 groups"));
        assert_eq!(deps.gather(&[]).unwrap()[0].len(), 0);
    }
}
