//! `MphfAggregateRule`: swaps eligible `AggregateExec`s for [`MphfAggregateExec`]s.
//!
//! The rule runs after DataFusion's own physical rules (it is appended by
//! [`with_mphf`](crate::datafusion::with_mphf)), so it sees the final distributed plan and replaces
//! nodes one for one: the new node keeps the old node's schema, partitioning and input
//! requirements. It is gated on `mphf.enable_aggregate` (default true).
//!
//! # Decision rule (costing)
//! - Decline when the index has fewer than [`MIN_SLOTS`] slots: a hash table that small stays in
//!   cache, DataFusion's vectorized hashing is as fast as an MPHF query, and the slot arrays buy
//!   nothing (the `l_suppkey` shape with 10k groups at SF1 measured equal in vanilla and DuckDB).
//! - Decline when the input's row-count estimate is exact or inexact and below
//!   `slots / MAX_SLOTS_PER_ROW`: accumulators are sized to the slot count per partition and
//!   emission scans every slot, so a selective filter in front would make the operator pay for
//!   slots no row reaches.
//! These thresholds are provisional (see the branch report for what was measured).

use std::sync::Arc;

use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use ::datafusion::common::Result;
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use ::datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use ::datafusion::physical_plan::ExecutionPlan;

use super::MphfAggregateExec;
use crate::datafusion::config::MphfConfig;
use crate::datafusion::registry::index_of_field;

/// Indexes with fewer slots than this are left to DataFusion's hash aggregation.
pub const MIN_SLOTS: u64 = 4096;
/// Decline when the input has fewer than one row per this many slots.
pub const MAX_SLOTS_PER_ROW: u64 = 8;

/// The physical optimizer rule installing [`MphfAggregateExec`].
#[derive(Debug, Default)]
pub struct MphfAggregateRule {}

impl MphfAggregateRule {
    /// A new rule.
    pub fn new() -> Self {
        Self {}
    }
}

/// `Some(exec)` when `agg` can run on slots; `Ok(None)` (quiet fallback) otherwise.
pub fn try_as_mphf_aggregate(agg: &AggregateExec) -> Result<Option<MphfAggregateExec>> {
    // Partial, Single and SinglePartitioned read raw rows; Final modes merge states of possibly
    // different keys per partition and stay DataFusion's; PartialReduce is left alone.
    if !matches!(
        agg.mode(),
        AggregateMode::Partial | AggregateMode::Single | AggregateMode::SinglePartitioned
    ) {
        return Ok(None);
    }
    let group_by = agg.group_expr();
    // Grouping sets (ROLLUP/CUBE) add a grouping id column and null-filled keys.
    if !group_by.is_single() || group_by.expr().len() != 1 {
        return Ok(None);
    }
    // FILTER clauses and ordered aggregates need per-row masks / sorted input we do not feed.
    if agg.filter_expr().iter().any(Option::is_some) || agg.aggr_expr().iter().any(|a| !a.order_bys().is_empty()) {
        return Ok(None);
    }
    // TopK aggregation (limit_options) and streaming aggregation promise orders/limits we don't keep.
    if agg.limit_options().is_some() || agg.properties().output_ordering().is_some() {
        return Ok(None);
    }
    let Some(col) = group_by.expr()[0].0.downcast_ref::<Column>() else {
        return Ok(None);
    };
    let input_schema = agg.input_schema();
    if col.index() >= input_schema.fields().len() {
        return Ok(None);
    }
    let field = input_schema.field(col.index());
    let Some(handle) = index_of_field(field) else {
        return Ok(None);
    };
    let index = handle.index();
    // The key column must have exactly the index's key type (lookup and emission rely on it).
    if index.keys().data_type() != field.data_type() {
        return Ok(None);
    }
    let slots = index.len();
    if slots < MIN_SLOTS {
        return Ok(None);
    }
    if let Ok(stats) = StatisticsContext::new().compute(agg.input().as_ref(), &StatisticsArgs::new()) {
        if let Some(&rows) = stats.num_rows.get_value() {
            if (rows as u64).saturating_mul(MAX_SLOTS_PER_ROW) < slots {
                return Ok(None);
            }
        }
    }
    Ok(Some(MphfAggregateExec::new(Arc::new(agg.clone()), Arc::clone(&handle))))
}

impl PhysicalOptimizerRule for MphfAggregateRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let enabled = config
            .extensions
            .get::<MphfConfig>()
            .map(|c| c.enable_aggregate)
            .unwrap_or(false);
        if !enabled {
            return Ok(plan);
        }
        plan.transform_up(|node| {
            let Some(agg) = node.downcast_ref::<AggregateExec>() else {
                return Ok(Transformed::no(node));
            };
            match try_as_mphf_aggregate(agg)? {
                Some(exec) => Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>)),
                None => Ok(Transformed::no(node)),
            }
        })
        .data()
    }

    fn name(&self) -> &str {
        "mphf_aggregate"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
