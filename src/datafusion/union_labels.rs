//! `MphfUnionLabels`: the inputs of a UNION agree on their index labels.
//!
//! # Why
//! An indexed column carries its index id in field metadata ([`INDEX_METADATA_KEY`], and
//! [`SLOT_METADATA_KEY`] on `mphf_index`'s output). DataFusion merges the field metadata of a
//! union's inputs in two different ways: the logical plan keeps the keys on which all inputs
//! (with metadata) agree, the physical `UnionExec` takes the keys of every input. A UNION ALL of
//! two separately indexed tables (`f.id` labeled with index 3, `g.id` with index 7) therefore
//! has no label logically and one physically, and the physical planner rejects the node above
//! it ("Physical input schema should be the same as the one converted from logical input
//! schema").
//!
//! # What
//! This logical optimizer rule (run after DataFusion's own) finds every `Union` whose inputs
//! disagree on a column's labels and projects that column of each input through
//! [`MPHF_UNLABEL_NAME`], an identity function whose output field is the input's without the
//! labels. Both plans then see an unlabeled column: the union's output is not one index's
//! column, so neither `mphf_index` nor the operators treat it as one. Inputs that agree (the same
//! index on both sides, or no index at all) are left alone.
//!
//! # Invariants
//! - The rewrite changes no value, name, type or nullability, only field metadata.
//! - It is idempotent: after it, the inputs agree, so a second pass finds nothing to do.

use std::sync::Arc;

use ::datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use ::datafusion::common::tree_node::Transformed;
use ::datafusion::common::{Column, DFSchema, Result};
use ::datafusion::logical_expr::expr::ScalarFunction;
use ::datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, Projection, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Union, Volatility,
};
use ::datafusion::optimizer::optimizer::ApplyOrder;
use ::datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use super::registry::{INDEX_METADATA_KEY, SLOT_METADATA_KEY};

/// Name of the identity function that drops index labels (shown in `EXPLAIN`).
pub const MPHF_UNLABEL_NAME: &str = "mphf_unlabel";

/// The metadata keys that name an index.
const LABEL_KEYS: [&str; 2] = [INDEX_METADATA_KEY, SLOT_METADATA_KEY];

/// The index labels of `field`, in [`LABEL_KEYS`] order.
fn labels(field: &Field) -> [Option<&String>; 2] {
    LABEL_KEYS.map(|k| field.metadata().get(k))
}

/// `x` unchanged, with an output field that has no index labels.
#[derive(Debug, PartialEq, Eq, Hash)]
struct UnlabelFunc {
    signature: Signature,
}

impl ScalarUDFImpl for UnlabelFunc {
    fn name(&self) -> &str {
        MPHF_UNLABEL_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[0].clone())
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let input = &args.arg_fields[0];
        let mut metadata = input.metadata().clone();
        for k in LABEL_KEYS {
            metadata.remove(k);
        }
        Ok(Arc::new(
            Field::new(input.name(), input.data_type().clone(), input.is_nullable()).with_metadata(metadata),
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(args.args.into_iter().next().expect("mphf_unlabel takes one argument"))
    }
}

/// The identity function as a `ScalarUDF`.
fn unlabel_udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(UnlabelFunc {
        signature: Signature::any(1, Volatility::Immutable),
    }))
}

/// The logical rule (see the module docs).
#[derive(Debug)]
pub struct MphfUnionLabels {
    unlabel: Arc<ScalarUDF>,
}

impl Default for MphfUnionLabels {
    fn default() -> Self {
        Self::new()
    }
}

impl MphfUnionLabels {
    /// The rule.
    pub fn new() -> Self {
        Self { unlabel: unlabel_udf() }
    }

    /// `input` with the columns `positions` projected through the identity function.
    fn unlabeled(&self, input: &Arc<LogicalPlan>, positions: &[usize]) -> Result<Arc<LogicalPlan>> {
        let schema = input.schema();
        let exprs = (0..schema.fields().len())
            .map(|i| {
                let (qualifier, field) = schema.qualified_field(i);
                let column = Expr::Column(Column::from((qualifier, field)));
                if positions.contains(&i) && labels(field).iter().any(Option::is_some) {
                    let call = Expr::ScalarFunction(ScalarFunction::new_udf(Arc::clone(&self.unlabel), vec![column]));
                    call.alias_qualified(qualifier.cloned(), field.name())
                } else {
                    column
                }
            })
            .collect();
        Ok(Arc::new(LogicalPlan::Projection(Projection::try_new(
            exprs,
            Arc::clone(input),
        )?)))
    }
}

impl OptimizerRule for MphfUnionLabels {
    fn name(&self) -> &str {
        "mphf_union_labels"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }

    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        let LogicalPlan::Union(union) = &plan else {
            return Ok(Transformed::no(plan));
        };
        let width = union.schema.fields().len();
        let disagree: Vec<usize> = (0..width)
            .filter(|&i| {
                let mut inputs = union.inputs.iter().map(|p| labels(p.schema().field(i)));
                let first = inputs.next();
                inputs.any(|l| Some(l) != first)
            })
            .collect();
        if disagree.is_empty() {
            return Ok(Transformed::no(plan));
        }
        let inputs = union
            .inputs
            .iter()
            .map(|p| self.unlabeled(p, &disagree))
            .collect::<Result<Vec<_>>>()?;
        // The union's own schema, with the labels of those columns dropped (as the inputs').
        let fields = union
            .schema
            .iter()
            .enumerate()
            .map(|(i, (qualifier, field))| {
                let field = if disagree.contains(&i) {
                    let mut metadata = field.metadata().clone();
                    for k in LABEL_KEYS {
                        metadata.remove(k);
                    }
                    Arc::new(field.as_ref().clone().with_metadata(metadata))
                } else {
                    Arc::clone(field)
                };
                (qualifier.cloned(), field)
            })
            .collect();
        let schema = DFSchema::new_with_metadata(fields, union.schema.metadata().clone())?
            .with_functional_dependencies(union.schema.functional_dependencies().clone())?;
        Ok(Transformed::yes(LogicalPlan::Union(Union {
            inputs,
            schema: Arc::new(schema),
        })))
    }
}
