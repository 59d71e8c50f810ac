//! `mphf_index(col)` over a scan with slot maps: the stored slots, not a lookup.
//!
//! [`MphfStoredSlotsRule`] finds projections that compute `mphf_index(col)` of a column read
//! straight from an indexed table with slot maps (through the nodes
//! [`attach_scan_slots`] can carry a column through). It appends the scan's slot column under
//! the projection and replaces the call by [`StoredSlotsExpr`], which returns that column.
//!
//! # Invariants
//! - The answer is the lookup's, row for row: the scan vouches for every slot it hands over
//!   (file stamps, sampled checks; see [`crate::datafusion::slot_scan`]); a batch with a row it
//!   did not vouch for (a NULL in the slot column) is answered by the original call.
//! - When no other expression of the projection reads the key, files whose slot map is fresh
//!   are scanned without the key column ([`KeyColumn::WhereNoSlots`]): their rows all have
//!   slots, so the original call, the only reader of the key, never runs on them.
//! - A NULL key has the slot map's `NO_SLOT` and gets NULL, as from the lookup; every other
//!   key of an indexed file is a member of the index, so membership needs no check.
//! - A scan carries the slots of one index: the first such call of a projection reads them,
//!   calls on other keys of the same projection keep their lookup.
//! - Only one-argument calls on a plain column are rewritten, and only for indexes with
//!   `UInt32` slots (the slot column's type). The two-argument form probes the index with keys
//!   that did not come from its own scan and always looks them up.
//! - The projection's output schema is unchanged (the expression reports the call's field).

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use ::datafusion::arrow::array::{Array, RecordBatch, UInt32Array};
use ::datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use ::datafusion::arrow::datatypes::{DataType, FieldRef, Schema};
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use ::datafusion::common::{internal_err, Result};
use ::datafusion::logical_expr::ColumnarValue;
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::projection::ProjectionExpr;
use ::datafusion::physical_expr::utils::collect_columns;
use ::datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::ExecutionPlan;

use super::mphf_index::MPHF_INDEX_NAME;
use crate::datafusion::config::MphfConfig;
use crate::datafusion::plan::runs_distributed;
use crate::datafusion::registry::index_of_field;
use crate::datafusion::slot_scan::{attach_scan_slots, KeyColumn, SCAN_SLOTS_COLUMN};
use crate::index::NO_SLOT;

/// `mphf_index(col)` answered from the slot column a slot-map scan appended.
#[derive(Debug, Eq)]
pub struct StoredSlotsExpr {
    /// The appended slot column (`UInt32`, `NO_SLOT` for a NULL key, NULL where not vouched).
    slots: Arc<dyn PhysicalExpr>,
    /// The original call, for batches with rows the scan did not vouch for.
    lookup: Arc<dyn PhysicalExpr>,
}

impl PartialEq for StoredSlotsExpr {
    fn eq(&self, other: &Self) -> bool {
        *self.slots == *other.slots && *self.lookup == *other.lookup
    }
}

impl Hash for StoredSlotsExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.slots.hash(state);
        self.lookup.hash(state);
    }
}

impl StoredSlotsExpr {
    /// Reads `slots`, falling back to `lookup`.
    pub fn new(slots: Arc<dyn PhysicalExpr>, lookup: Arc<dyn PhysicalExpr>) -> Self {
        Self { slots, lookup }
    }
}

impl fmt::Display for StoredSlotsExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [stored slots]", self.lookup)
    }
}

impl PhysicalExpr for StoredSlotsExpr {
    fn return_field(&self, input_schema: &Schema) -> Result<FieldRef> {
        self.lookup.return_field(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let slots = self.slots.evaluate(batch)?.into_array(batch.num_rows())?;
        match slots.as_any().downcast_ref::<UInt32Array>() {
            Some(stored) if stored.null_count() == 0 => {
                let valid: BooleanBuffer = stored.values().iter().map(|&s| s != NO_SLOT).collect();
                let out = UInt32Array::new(stored.values().clone(), Some(NullBuffer::new(valid)));
                Ok(ColumnarValue::Array(Arc::new(out)))
            }
            _ => self.lookup.evaluate(batch),
        }
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.slots, &self.lookup]
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn PhysicalExpr>>) -> Result<Arc<dyn PhysicalExpr>> {
        match <[_; 2]>::try_from(children) {
            Ok([slots, lookup]) => Ok(Arc::new(Self::new(slots, lookup))),
            Err(c) => internal_err!("StoredSlotsExpr takes 2 children, got {}", c.len()),
        }
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.lookup.fmt_sql(f)
    }
}

/// Rewrites `mphf_index(col)` in projections over slot-map scans (see the module docs).
#[derive(Debug, Default)]
pub struct MphfStoredSlotsRule {}

impl MphfStoredSlotsRule {
    /// A new rule.
    pub fn new() -> Self {
        Self {}
    }
}

/// The column of a one-argument `mphf_index` call, if `expr` is one.
fn indexed_column(expr: &Arc<dyn PhysicalExpr>) -> Option<&Column> {
    let call = expr.downcast_ref::<ScalarFunctionExpr>()?;
    match call.args() {
        [arg] if call.name() == MPHF_INDEX_NAME => arg.downcast_ref::<Column>(),
        _ => None,
    }
}

/// What `p` needs of its input column `key` over a slot scan: only rows without a stored slot
/// need it, unless an expression other than a one-argument `mphf_index` of it reads it.
fn key_use(p: &ProjectionExec, key: usize) -> KeyColumn {
    let read = p.expr().iter().any(|e| {
        indexed_column(&e.expr).map(Column::index) != Some(key)
            && collect_columns(&e.expr).iter().any(|c| c.index() == key)
    });
    match read {
        true => KeyColumn::Read,
        false => KeyColumn::WhereNoSlots,
    }
}

/// `p` with its `mphf_index(col)` calls answered from scan slots; `None` when none can be.
fn with_stored_slots(p: &ProjectionExec) -> Result<Option<ProjectionExec>> {
    let mut input = Arc::clone(p.input());
    let mut exprs: Vec<ProjectionExpr> = p.expr().to_vec();
    // Input column of a key → position of its slot column (one slot column per key).
    let mut attached: HashMap<usize, usize> = HashMap::new();
    for e in &mut exprs {
        let Some(key) = indexed_column(&e.expr).map(Column::index) else {
            continue;
        };
        let pos = match attached.get(&key) {
            Some(&pos) => pos,
            None => {
                let schema = input.schema();
                let Some(handle) = schema.fields().get(key).and_then(|f| index_of_field(f)) else {
                    continue;
                };
                if handle.index().slot_type() != DataType::UInt32 {
                    continue;
                }
                let Some((with_slots, pos)) = attach_scan_slots(&input, key, &handle, key_use(p, key))? else {
                    continue;
                };
                input = with_slots;
                attached.insert(key, pos);
                pos
            }
        };
        let slots = Arc::new(Column::new(SCAN_SLOTS_COLUMN, pos));
        e.expr = Arc::new(StoredSlotsExpr::new(slots, Arc::clone(&e.expr)));
    }
    if attached.is_empty() {
        return Ok(None);
    }
    Ok(Some(ProjectionExec::try_new(exprs, input)?))
}

impl PhysicalOptimizerRule for MphfStoredSlotsRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        // A distributed stage would carry `StoredSlotsExpr` through datafusion-distributed's
        // composed codec, which (datafusion-proto 55) passes no custom physical expression on
        // to ours: workers look the keys up instead (`plan::runs_distributed`).
        if config.extensions.get::<MphfConfig>().is_none() || runs_distributed(config) {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(p) = node.downcast_ref::<ProjectionExec>() else {
                return Ok(Transformed::no(node));
            };
            Ok(match with_stored_slots(p)? {
                Some(rewritten) => Transformed::yes(Arc::new(rewritten) as Arc<dyn ExecutionPlan>),
                None => Transformed::no(node),
            })
        })
        .data()
    }

    fn name(&self) -> &str {
        "mphf_stored_slots"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
