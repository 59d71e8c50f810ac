//! Whether a rule's rewrite still meets every node's input requirements: DataFusion's sanity
//! check (orderings, distributions, invariants), run only on the nodes the rewrite made.
//!
//! Why: the rules replace a join or an aggregate by a form that may change its output
//! partitioning, and keep the rewrite only where every node above still gets what it requires.
//! DataFusion's `SanityCheckPlan` walks the whole plan; a node that the rewrite kept (the same
//! `Arc`) heads the same subtree as in the rule's input, so only the rewrite's own nodes can
//! break a requirement. The rule's input passed DataFusion's check before the MPHF rules ran,
//! and the aggregate and join rules each keep only a rewrite that passes here.
//!
//! Invariant: `original` is alive during the check, so no node of the rewrite can have the
//! address of one of its nodes without being that node.

use std::collections::HashSet;
use std::sync::Arc;

use ::datafusion::common::config::{ConfigOptions, OptimizerOptions};
use ::datafusion::physical_optimizer::sanity_checker::check_plan_sanity;
use ::datafusion::physical_plan::ExecutionPlan;

/// Whether every node of `rewritten` that is not a node of `original` passes DataFusion's
/// sanity check against its children.
pub fn rewrite_is_sane(
    original: &Arc<dyn ExecutionPlan>,
    rewritten: &Arc<dyn ExecutionPlan>,
    config: &ConfigOptions,
) -> bool {
    let mut kept = HashSet::new();
    add_addresses(original, &mut kept);
    new_nodes_sane(rewritten, &kept, &config.optimizer)
}

fn address(plan: &Arc<dyn ExecutionPlan>) -> usize {
    Arc::as_ptr(plan) as *const () as usize
}

/// Adds the addresses of `plan`'s nodes to `kept`.
fn add_addresses(plan: &Arc<dyn ExecutionPlan>, kept: &mut HashSet<usize>) {
    if kept.insert(address(plan)) {
        for child in plan.children() {
            add_addresses(child, kept);
        }
    }
}

/// Children first, as DataFusion checks: a failing check formats the plan below the failing
/// node into its message, and the deepest failing node has the smallest.
fn new_nodes_sane(plan: &Arc<dyn ExecutionPlan>, kept: &HashSet<usize>, options: &OptimizerOptions) -> bool {
    kept.contains(&address(plan))
        || (plan.children().into_iter().all(|c| new_nodes_sane(c, kept, options))
            && check_plan_sanity(plan, options).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datafusion::arrow::array::{Int64Array, RecordBatch};
    use ::datafusion::arrow::datatypes::{DataType, Field, Schema};
    use ::datafusion::datasource::memory::MemorySourceConfig;
    use ::datafusion::physical_expr::expressions::col;
    use ::datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
    use ::datafusion::physical_plan::sorts::sort::SortExec;
    use ::datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;

    /// A two-partition scan of `x`, and the ordering by `x`.
    fn scan() -> (Arc<dyn ExecutionPlan>, LexOrdering) {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = |v: Vec<i64>| RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(v))]);
        let partitions = vec![
            vec![batch(vec![3, 1]).expect("batch")],
            vec![batch(vec![2, 4]).expect("batch")],
        ];
        let exec = MemorySourceConfig::try_new_exec(&partitions, Arc::clone(&schema), None).expect("scan");
        let x = col("x", &schema).expect("column");
        let ordering = LexOrdering::new([PhysicalSortExpr::new_default(x)]).expect("ordering");
        (exec, ordering)
    }

    #[test]
    fn a_new_node_whose_child_lacks_its_ordering_fails() {
        let (leaf, ordering) = scan();
        let sorted: Arc<dyn ExecutionPlan> =
            Arc::new(SortExec::new(ordering.clone(), Arc::clone(&leaf)).with_preserve_partitioning(true));
        let original: Arc<dyn ExecutionPlan> = Arc::new(SortPreservingMergeExec::new(ordering.clone(), sorted));
        // The merge over the unsorted scan: its requirement is broken.
        let broken: Arc<dyn ExecutionPlan> = Arc::new(SortPreservingMergeExec::new(ordering, leaf));
        let config = ConfigOptions::default();
        assert!(rewrite_is_sane(&original, &original, &config));
        assert!(!rewrite_is_sane(&original, &broken, &config));
    }

    #[test]
    fn new_nodes_over_kept_subtrees_are_checked_against_them() {
        let (leaf, ordering) = scan();
        let sorted: Arc<dyn ExecutionPlan> =
            Arc::new(SortExec::new(ordering.clone(), leaf).with_preserve_partitioning(true));
        let original: Arc<dyn ExecutionPlan> =
            Arc::new(SortPreservingMergeExec::new(ordering.clone(), Arc::clone(&sorted)));
        // A new merge over the kept sort: sane.
        let merged_again: Arc<dyn ExecutionPlan> = Arc::new(SortPreservingMergeExec::new(ordering, sorted));
        assert!(rewrite_is_sane(&original, &merged_again, &ConfigOptions::default()));
    }
}
