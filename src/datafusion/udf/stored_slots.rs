//! `mphf_index(col)` over a scan with slot maps: the stored slots, not a lookup.
//!
//! [`MphfStoredSlotsRule`] finds projections that compute `mphf_index(col)` of a column read
//! straight from an indexed table with slot maps (through the nodes
//! [`attach_scan_slots`] can carry a column through). It appends the scan's slot column under
//! the projection and replaces the call by [`MphfStoredSlotsFunc`], which returns that column.
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
use std::sync::Arc;

use ::datafusion::arrow::array::{Array, UInt32Array};
use ::datafusion::arrow::buffer::{BooleanBuffer, NullBuffer};
use ::datafusion::arrow::datatypes::{DataType, FieldRef};
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use ::datafusion::common::{internal_err, Result};
use ::datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::projection::ProjectionExpr;
use ::datafusion::physical_expr::utils::collect_columns;
use ::datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::ExecutionPlan;

use super::mphf_index::{MphfIndexFunc, MPHF_INDEX_NAME};
use crate::datafusion::config::MphfConfig;
use crate::datafusion::registry::index_of_field;
use crate::datafusion::slot_scan::{attach_scan_slots, KeyColumn, SCAN_SLOTS_COLUMN};
use crate::index::NO_SLOT;

/// Name of the function that answers `mphf_index(col)` from a scan's slot column.
pub const STORED_SLOTS_NAME: &str = "mphf_stored_slots";

/// `mphf_stored_slots(slots, col)`: `mphf_index(col)` answered from `slots`, the slot column a
/// slot-map scan appended (`UInt32`, `NO_SLOT` for a NULL key, NULL where the scan did not
/// vouch), or from the lookup of `col` for a batch with a row the scan did not vouch for.
///
/// The rule places it. It is a scalar function rather than a custom physical expression so
/// that datafusion-proto carries it to distributed workers by name: the composed codec that
/// datafusion-distributed 4.0.0 builds passes no custom expression on to ours. Sessions
/// register it (as they register `mphf_index`), and the workers' plans find it there. A first
/// argument that is not a scan's slot column (a call from SQL) is ignored: the key is looked up.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct MphfStoredSlotsFunc {
    signature: Signature,
}

impl Default for MphfStoredSlotsFunc {
    fn default() -> Self {
        Self::new()
    }
}

impl MphfStoredSlotsFunc {
    /// The function.
    pub fn new() -> Self {
        Self {
            signature: Signature::any(2, Volatility::Immutable),
        }
    }

    /// The function as a [`ScalarUDF`].
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(Self::new())
    }
}

/// The key argument's part of `args`, as the one-argument `mphf_index` takes it.
fn key_args(args: ScalarFunctionArgs) -> Result<ScalarFunctionArgs> {
    let ScalarFunctionArgs {
        args: mut values,
        arg_fields,
        number_rows,
        return_field,
        config_options,
    } = args;
    match (values.len(), arg_fields.get(1)) {
        (2, Some(field)) => Ok(ScalarFunctionArgs {
            args: vec![values.remove(1)],
            arg_fields: vec![Arc::clone(field)],
            number_rows,
            return_field,
            config_options,
        }),
        (n, _) => internal_err!("{STORED_SLOTS_NAME} takes (slots, column), got {n} arguments"),
    }
}

impl ScalarUDFImpl for MphfStoredSlotsFunc {
    fn name(&self) -> &str {
        STORED_SLOTS_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        internal_err!("{STORED_SLOTS_NAME}: return_field_from_args must be used")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        match (args.arg_fields, args.scalar_arguments) {
            ([_, key], [_, key_scalar]) => MphfIndexFunc::new().return_field_from_args(ReturnFieldArgs {
                arg_fields: std::slice::from_ref(key),
                scalar_arguments: std::slice::from_ref(key_scalar),
            }),
            (fields, _) => internal_err!(
                "{STORED_SLOTS_NAME} takes (slots, column), got {} arguments",
                fields.len()
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // Only a scan's slot column is trusted; anything else is looked up.
        let from_scan = args.arg_fields.first().is_some_and(|f| f.name() == SCAN_SLOTS_COLUMN);
        if let (true, Some(ColumnarValue::Array(slots))) = (from_scan, args.args.first()) {
            if let Some(stored) = slots.as_any().downcast_ref::<UInt32Array>() {
                if stored.null_count() == 0 {
                    let valid: BooleanBuffer = stored.values().iter().map(|&s| s != NO_SLOT).collect();
                    let out = UInt32Array::new(stored.values().clone(), Some(NullBuffer::new(valid)));
                    return Ok(ColumnarValue::Array(Arc::new(out)));
                }
            }
        }
        MphfIndexFunc::new().invoke_with_args(key_args(args)?)
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
        let (Some(key), Some(call)) = (indexed_column(&e.expr), e.expr.downcast_ref::<ScalarFunctionExpr>()) else {
            continue;
        };
        let slots: Arc<dyn PhysicalExpr> = Arc::new(Column::new(SCAN_SLOTS_COLUMN, pos));
        let key: Arc<dyn PhysicalExpr> = Arc::new(key.clone());
        let stored = ScalarFunctionExpr::try_new(
            Arc::new(MphfStoredSlotsFunc::udf()),
            vec![slots, key],
            &input.schema(),
            Arc::new(call.config_options().clone()),
        )?;
        e.expr = Arc::new(stored);
    }
    if attached.is_empty() {
        return Ok(None);
    }
    Ok(Some(ProjectionExec::try_new(exprs, input)?))
}

impl PhysicalOptimizerRule for MphfStoredSlotsRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        if config.extensions.get::<MphfConfig>().is_none() {
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
