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
//! The checks are DataFusion's (`check_plan_sanity`), asked as questions: its function formats
//! the whole plan below a failing node into its error, and a rewrite that fails (the fallback
//! the rules then take) is an answer here, not an error, so that cost bought nothing.
//!
//! Invariant: `original` is alive during the check, so no node of the rewrite can have the
//! address of one of its nodes without being that node.

use std::collections::HashSet;
use std::sync::Arc;

use ::datafusion::common::config::{ConfigOptions, OptimizerOptions};
use ::datafusion::physical_optimizer::sanity_checker::check_finiteness_requirements;
use ::datafusion::physical_plan::execution_plan::InvariantLevel;
use ::datafusion::physical_plan::{ChildSatisfactionOptions, ExecutionPlan, ExecutionPlanProperties};

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
        || (plan.children().into_iter().all(|c| new_nodes_sane(c, kept, options)) && node_sane(plan, options))
}

/// Whether `plan` passes DataFusion's sanity check against its children (`check_plan_sanity`:
/// the finiteness of its inputs, each child's ordering and distribution against what `plan`
/// requires of it, and `plan`'s executable invariants), without formatting the plan when it
/// does not. An error while checking counts as a failure.
fn node_sane(plan: &Arc<dyn ExecutionPlan>, options: &OptimizerOptions) -> bool {
    if check_finiteness_requirements(plan.as_ref(), options).is_err() {
        return false;
    }
    let distributions = plan.input_distribution_requirements();
    // Zipped as DataFusion zips them: the shortest of the three lists bounds the check.
    let children = plan
        .children()
        .into_iter()
        .zip(plan.required_input_ordering())
        .zip(distributions.per_child_distributions())
        .enumerate();
    for (idx, ((child, ordering), _)) in children {
        if let Some(ordering) = ordering {
            let satisfied = child
                .equivalence_properties()
                .ordering_satisfy_requirement(ordering.into_single());
            if !matches!(satisfied, Ok(true)) {
                return false;
            }
        }
        let options = ChildSatisfactionOptions::new().with_allow_subset(true);
        match distributions.child_satisfaction(idx, child.as_ref(), options) {
            Ok(satisfaction) if satisfaction.is_satisfied() => {}
            _ => return false,
        }
    }
    plan.check_invariants(InvariantLevel::Executable).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::datafusion::arrow::array::{Int64Array, RecordBatch};
    use ::datafusion::arrow::datatypes::{DataType, Field, Schema};
    use ::datafusion::datasource::memory::MemorySourceConfig;
    use ::datafusion::physical_expr::expressions::col;
    use ::datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
    use ::datafusion::physical_optimizer::sanity_checker::check_plan_sanity;
    use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use ::datafusion::physical_plan::limit::GlobalLimitExec;
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

    #[test]
    fn the_check_answers_as_datafusions_does() {
        let (leaf, ordering) = scan();
        let sorted: Arc<dyn ExecutionPlan> =
            Arc::new(SortExec::new(ordering.clone(), Arc::clone(&leaf)).with_preserve_partitioning(true));
        let coalesced: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(Arc::clone(&leaf)));
        // (plan, whether it is sane): a limit needs one partition, a merge sorted partitions.
        let plans: [(Arc<dyn ExecutionPlan>, bool); 4] = [
            (Arc::new(GlobalLimitExec::new(Arc::clone(&leaf), 0, Some(1))), false),
            (Arc::new(GlobalLimitExec::new(coalesced, 0, Some(1))), true),
            (Arc::new(SortPreservingMergeExec::new(ordering.clone(), leaf)), false),
            (Arc::new(SortPreservingMergeExec::new(ordering, sorted)), true),
        ];
        let options = ConfigOptions::default().optimizer;
        for (plan, sane) in plans {
            assert_eq!(node_sane(&plan, &options), sane, "{}", plan.name());
            assert_eq!(check_plan_sanity(&plan, &options).is_ok(), sane, "{}", plan.name());
        }
    }
}
