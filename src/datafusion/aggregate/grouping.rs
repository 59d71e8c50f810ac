//! [`Grouping`]: the group expressions of an aggregate seen as one indexed key plus the
//! expressions that depend on it (issue 4, item 4), and [`ByteRows`], the arena that keeps one
//! row-format value per group.
//!
//! `GROUP BY o_orderkey, o_custkey, o_orderdate` groups by the slot of `o_orderkey` alone when
//! the other two are functions of it (the rule proves that, see [`lineage`](super::lineage)).
//! The *dependent* expressions are still evaluated for every row and compared with the values
//! the group saw first (column by column, see [`dep_values`](super::dep_values)): a row that
//! differs gets a group of its own, keyed by its row format. The proof decides whether the operator is worth running; the comparison makes its
//! result equal DataFusion's whatever the data (a stale index, a key that stopped being unique).
//!
//! # Invariants
//! - The row format of a whole group key `[key, deps…]` ([`Grouping::full_converter`]) is the
//!   concatenation of the key's and the dependents' row formats (arrow's row format encodes
//!   column after column), so dependent bytes can be compared on their own.
//! - Output group columns are in the aggregate's group-expression order: the key at
//!   [`Grouping::key_pos`], the dependents around it.

use std::sync::Arc;

use ::datafusion::arrow::array::{Array, ArrayRef, RecordBatch};
use ::datafusion::arrow::compute::cast;
use ::datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use ::datafusion::arrow::row::{RowConverter, Rows, SortField};
use ::datafusion::common::{internal_err, Result};
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateInputMode};

use crate::datafusion::registry::{IndexHandle, SLOT_METADATA_KEY};
use crate::datafusion::slot_scan::scan_slots_position;

/// Variable-length byte strings stored end to end (one per group).
#[derive(Default)]
pub(super) struct ByteRows {
    bytes: Vec<u8>,
    /// End offset of each row in `bytes`.
    ends: Vec<usize>,
}

impl ByteRows {
    /// Appends one row.
    pub(super) fn push(&mut self, row: &[u8]) {
        self.bytes.extend_from_slice(row);
        self.ends.push(self.bytes.len());
    }

    /// Row `i`.
    pub(super) fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// Number of rows.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Bytes held.
    pub(super) fn size(&self) -> usize {
        self.bytes.capacity() + self.ends.capacity() * 8
    }
}

/// The schema `agg`'s group expressions refer to: its raw input's as planned (`input_schema`,
/// whose fields keep the metadata that marks slots and indexes even where the physical input's
/// schema lost it, e.g. a decoded `mphf_stored_slots` projection on a worker); under a final
/// mode, the partial states', its input's schema (`input_schema` is then the partial's raw input).
pub(super) fn group_input_schema(agg: &AggregateExec) -> SchemaRef {
    match agg.mode().input_mode() {
        AggregateInputMode::Raw => agg.input_schema(),
        AggregateInputMode::Partial => agg.input().schema(),
    }
}

/// The group expressions of one aggregate: the indexed key and its dependents.
pub(super) struct Grouping {
    /// Position of the indexed key among the group expressions.
    pub key_pos: usize,
    /// The indexed key.
    pub key_expr: Arc<dyn PhysicalExpr>,
    /// The key already holds slots (`mphf_index(col)`, see [`SLOT_METADATA_KEY`]): no lookup.
    pub key_is_slot: bool,
    /// Position in the input of the slots a slot-map scan appended for the key
    /// ([`crate::datafusion::registry::SCAN_SLOTS_METADATA_KEY`], this index's label): read
    /// instead of looking the key up.
    pub scan_slots: Option<usize>,
    /// The other group expressions, in order.
    pub deps: Vec<Arc<dyn PhysicalExpr>>,
    /// Row format of the dependents (`None` for a one-column GROUP BY).
    pub dep_converter: Option<RowConverter>,
    /// Row format of whole group keys `[key, deps…]` (fallback groups).
    pub full_converter: RowConverter,
    /// Output types of the group columns, in group-expression order.
    out_types: Vec<DataType>,
    /// Types of the dependent columns as evaluated over the input.
    dep_types: Vec<DataType>,
}

impl Grouping {
    /// The grouping of `agg` with the indexed key at `key_pos`; output types from `out_schema`
    /// (the schema of the node whose rows are emitted: group columns first).
    pub(super) fn try_new(
        agg: &AggregateExec,
        key_pos: usize,
        out_schema: &Schema,
        index: &IndexHandle,
    ) -> Result<Self> {
        let exprs = agg.group_expr().expr();
        if key_pos >= exprs.len() || out_schema.fields().len() < exprs.len() {
            return internal_err!(
                "MphfAggregateExec: key position {key_pos} of {} group columns",
                exprs.len()
            );
        }
        let input = group_input_schema(agg);
        let key_expr = Arc::clone(&exprs[key_pos].0);
        let key_is_slot = key_expr
            .return_field(&input)?
            .metadata()
            .contains_key(SLOT_METADATA_KEY);
        let scan_slots = scan_slots_position(&agg.input().schema(), index);
        let deps: Vec<Arc<dyn PhysicalExpr>> = exprs
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != key_pos)
            .map(|(_, (e, _))| Arc::clone(e))
            .collect();
        let dep_types = deps.iter().map(|e| e.data_type(&input)).collect::<Result<Vec<_>>>()?;
        let dep_fields: Vec<SortField> = dep_types.iter().map(|t| SortField::new(t.clone())).collect();
        let mut full_fields = vec![SortField::new(key_expr.data_type(&input)?)];
        full_fields.extend(dep_fields.iter().cloned());
        Ok(Self {
            key_pos,
            key_expr,
            key_is_slot,
            scan_slots,
            dep_converter: if deps.is_empty() {
                None
            } else {
                Some(RowConverter::new(dep_fields)?)
            },
            deps,
            full_converter: RowConverter::new(full_fields)?,
            dep_types,
            out_types: out_schema.fields()[..exprs.len()]
                .iter()
                .map(|f| f.data_type().clone())
                .collect(),
        })
    }

    /// The dependent columns of `batch`, evaluated.
    pub(super) fn dep_columns(&self, batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
        self.deps
            .iter()
            .map(|e| e.evaluate(batch)?.into_array(batch.num_rows()))
            .collect()
    }

    /// Evaluated dependent columns in row format (`None` without dependents).
    pub(super) fn dep_rows_of(&self, columns: &[ArrayRef]) -> Result<Option<Rows>> {
        let Some(converter) = &self.dep_converter else {
            return Ok(None);
        };
        Ok(Some(converter.convert_columns(columns)?))
    }

    /// Types of the dependent columns, evaluated.
    pub(super) fn dep_types(&self) -> Vec<DataType> {
        self.dep_types.clone()
    }

    /// Whole group keys of `batch` in row format.
    pub(super) fn full_rows(&self, key: &ArrayRef, batch: &RecordBatch) -> Result<Rows> {
        let mut columns = vec![Arc::clone(key)];
        for e in &self.deps {
            columns.push(e.evaluate(batch)?.into_array(batch.num_rows())?);
        }
        Ok(self.full_converter.convert_columns(&columns)?)
    }

    /// Dependent columns decoded from row-format values.
    pub(super) fn decode_deps<'a>(&self, rows: impl Iterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>> {
        let Some(converter) = &self.dep_converter else {
            return Ok(Vec::new());
        };
        let parser = converter.parser();
        Ok(converter.convert_rows(rows.map(|r| parser.parse(r)))?)
    }

    /// Key and dependent columns decoded from whole row-format group keys.
    pub(super) fn decode_full<'a>(&self, rows: impl Iterator<Item = &'a [u8]>) -> Result<(ArrayRef, Vec<ArrayRef>)> {
        let parser = self.full_converter.parser();
        let mut columns = self.full_converter.convert_rows(rows.map(|r| parser.parse(r)))?;
        let key = columns.remove(0);
        Ok((key, columns))
    }

    /// The group columns in group-expression order, cast to the output types.
    pub(super) fn assemble(&self, key: ArrayRef, deps: Vec<ArrayRef>) -> Result<Vec<ArrayRef>> {
        if deps.len() != self.deps.len() {
            return internal_err!(
                "MphfAggregateExec: {} dependent columns, expected {}",
                deps.len(),
                self.deps.len()
            );
        }
        let mut columns = Vec::with_capacity(self.out_types.len());
        let mut deps = deps.into_iter();
        for (i, to) in self.out_types.iter().enumerate() {
            let column = if i == self.key_pos {
                Arc::clone(&key)
            } else {
                deps.next().unwrap_or_else(|| Arc::clone(&key))
            };
            columns.push(cast_to(column, to)?);
        }
        Ok(columns)
    }

    /// Concatenates group columns of the same layout (member groups, then fallback groups).
    pub(super) fn concat(parts: Vec<Vec<ArrayRef>>) -> Result<Vec<ArrayRef>> {
        // The first part is kept even when empty: it gives the columns their types.
        let mut parts = parts
            .into_iter()
            .enumerate()
            .filter(|(i, p)| *i == 0 || p.first().is_some_and(|a| !a.is_empty()));
        let Some((_, first)) = parts.next() else {
            return Ok(Vec::new());
        };
        let rest: Vec<Vec<ArrayRef>> = parts.map(|(_, p)| p).collect();
        if rest.is_empty() {
            return Ok(first);
        }
        (0..first.len())
            .map(|c| {
                let mut arrays: Vec<&dyn Array> = vec![first[c].as_ref()];
                arrays.extend(rest.iter().map(|p| p[c].as_ref()));
                Ok(::datafusion::arrow::compute::concat(&arrays)?)
            })
            .collect()
    }
}

/// `array` cast to `to` when its type differs (the key column may be a view or dictionary type).
pub(super) fn cast_to(array: ArrayRef, to: &DataType) -> Result<ArrayRef> {
    if array.data_type() == to {
        Ok(array)
    } else {
        Ok(cast(&array, to)?)
    }
}
