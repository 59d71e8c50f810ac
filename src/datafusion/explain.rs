//! Why a candidate stayed DataFusion's: [`MphfExplainRule`] puts an [`MphfDeclinedExec`] over
//! every aggregate and join that has an indexed key but was left to DataFusion, so that
//! `EXPLAIN` shows the reason and the estimates next to it:
//!
//! ```text
//! MphfDeclined: reason=unclustered key (1.0 rows per run, fewer than 2) with compact lookups: one MPHF query per row, cost=210ms vs hash 96.0ms
//!   AggregateExec: mode=Partial, gby=[id@0 as id], aggr=[count(Int64(1))]
//! ```
//!
//! The rule runs after the aggregate and join rules and shows the reason they declined with:
//! recorded by the rule itself for a node no later rule rebuilt
//! ([`verdicts`](crate::datafusion::plan::verdicts)), else asked again with the same question
//! they decided on ([`aggregate::decide`](crate::datafusion::aggregate::decide),
//! [`join::rule::candidates`]), so a reason is the rules' own. The node does nothing at run
//! time: `execute` is its input's, and it keeps its input's properties, so no rule or
//! requirement sees a difference.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode, TreeNodeRecursion};
use ::datafusion::common::{internal_err, Result, Statistics};
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_optimizer::PhysicalOptimizerRule;
use ::datafusion::physical_plan::aggregates::AggregateExec;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};

use super::aggregate::{self, Decision, RowEstimator};
use super::config::MphfConfig;
use super::join::rule::{self as join_rule, Forms};
use super::plan::scans;
use super::plan::verdicts::{self, Question};
use super::plan::{thresholds_for, Declined};

/// A candidate left to DataFusion, shown with the reason (see the module docs). Runs its input.
#[derive(Debug)]
pub struct MphfDeclinedExec {
    input: Arc<dyn ExecutionPlan>,
    declined: Declined,
}

impl MphfDeclinedExec {
    /// `input` (the declined node), annotated with `declined`.
    pub fn new(input: Arc<dyn ExecutionPlan>, declined: Declined) -> Self {
        Self { input, declined }
    }

    /// Why the node below was declined.
    pub fn declined(&self) -> &Declined {
        &self.declined
    }
}

impl DisplayAs for MphfDeclinedExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "{}", self.declined),
            _ => write!(f, "MphfDeclined: {}", self.declined),
        }
    }
}

impl ExecutionPlan for MphfDeclinedExec {
    fn name(&self) -> &str {
        "MphfDeclinedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("MphfDeclinedExec takes one child, got {}", children.len());
        }
        Ok(Arc::new(Self::new(children.remove(0), self.declined.clone())))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(::datafusion::physical_plan::ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        match input_stats.first() {
            Some(stats) => Ok(Arc::clone(stats)),
            None => internal_err!("MphfDeclinedExec: no input statistics"),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn supports_limit_pushdown(&self) -> bool {
        true
    }
}

/// The physical optimizer rule that annotates declined candidates (see the module docs).
#[derive(Debug, Default)]
pub struct MphfExplainRule {}

impl MphfExplainRule {
    /// A new rule.
    pub fn new() -> Self {
        Self {}
    }
}

/// Why the aggregate `agg` (the plan node `node`), still DataFusion's, was declined (`None`:
/// not a candidate).
fn aggregate_reason(
    node: &Arc<dyn ExecutionPlan>,
    agg: &AggregateExec,
    costing: &aggregate::Costing,
    estimates: &RowEstimator,
) -> Result<Option<Declined>> {
    if let Some(declined) = verdicts::recorded(Question::Aggregate, node, None) {
        return Ok(Some(declined));
    }
    // Stages on workers: the rule decided every node per partition (no slot-range merge).
    let merge = !costing.distributed;
    Ok(match aggregate::decide(agg, costing, merge, estimates)? {
        Decision::NotCandidate => None,
        Decision::Declined(declined) => Some(declined),
        // Per partition the rule would have taken it: nothing was declined.
        Decision::Replaced(_) if !merge => None,
        // Admitted only as the partial of a merged node that no final aggregate made, or kept
        // because the slot-range merge broke a requirement above: the per-partition form was
        // declined, and why.
        Decision::Replaced(exec) => {
            let why = match exec.needs_merge() {
                true => "admitted only as the partial of a merged node, and no final aggregate above merges it",
                false => "the slot-range merge breaks a distribution or ordering a node above requires",
            };
            Some(match aggregate::decide(agg, costing, false, estimates)? {
                Decision::Declined(unmerged) => {
                    Declined::new(format!("{why}; per partition: {}", unmerged.reason), unmerged.estimate)
                }
                _ => Declined::new(why.into(), exec.estimate()),
            })
        }
    })
}

/// Why the join `join` (the plan node `node`), still DataFusion's, was declined (`None`: not a
/// candidate); `above` is the aggregate it feeds directly, if any (the rule prices a join with
/// the aggregate it would run fused with).
fn join_reason(
    node: &Arc<dyn ExecutionPlan>,
    join: &HashJoinExec,
    costing: &join_rule::Costing,
    above: Option<&Arc<dyn ExecutionPlan>>,
) -> Result<Option<Declined>> {
    let swapped_reason = |d: Declined| Declined::new(format!("swapped: {}", d.reason), d.estimate);
    if join_rule::indexed_key(join).is_none() {
        // Only the probe side indexed: the rule tried the swapped collect form.
        if !join_rule::swappable(join, costing) || !join_rule::probe_key_indexed(join) {
            return Ok(None);
        }
        if let Some(declined) = verdicts::recorded(Question::SwappedJoin, node, None) {
            return Ok(Some(swapped_reason(declined)));
        }
        return Ok(
            match join_rule::candidates(&join_rule::swapped(join)?, join, costing, join_rule::Wanted::Both, None)? {
                Forms::Declined(d) => Some(swapped_reason(d)),
                Forms::Some(..) => Some(Declined::new(
                    "swapped: the collect form breaks a distribution or ordering a node above requires".into(),
                    None,
                )),
                Forms::NotCandidate => None,
            },
        );
    }
    if let Some(declined) = verdicts::recorded(Question::Join, node, above) {
        return Ok(Some(declined));
    }
    let above_agg = above.and_then(|a| a.downcast_ref::<AggregateExec>());
    Ok(
        match join_rule::candidates(join, join, costing, join_rule::Wanted::Both, above_agg)? {
            Forms::NotCandidate => None,
            Forms::Declined(declined) => Some(declined),
            Forms::Some(one, collect) => {
                let estimate = one.as_ref().or(collect.as_ref()).and_then(|e| e.estimate());
                Some(Declined::new(
                "the collect form breaks a distribution or ordering a node above requires, and the one-for-one form was declined".into(),
                estimate,
            ))
            }
        },
    )
}

impl PhysicalOptimizerRule for MphfExplainRule {
    fn optimize(&self, plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
        let _scans = scans::pass();
        let annotated = annotate(plan, config);
        // The plan's optimization ends here: no record, slot scan or estimate is kept for the next.
        super::plan::optimization_ends();
        annotated
    }

    fn name(&self) -> &str {
        "mphf_explain"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// `plan` with every declined candidate under an [`MphfDeclinedExec`] (see the module docs).
fn annotate(plan: Arc<dyn ExecutionPlan>, config: &ConfigOptions) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(cfg) = config.extensions.get::<MphfConfig>() else {
        return Ok(plan);
    };
    let Some(t) = thresholds_for(cfg, config) else {
        return Ok(plan);
    };
    let aggregates = cfg.enable_aggregate.then(|| aggregate::Costing::of(&t, cfg, config));
    let joins = cfg.enable_join.then(|| join_rule::Costing::of(&t, config));
    // Top-down, so that each candidate is asked about with its original subtree (the rules'
    // walks do not know the annotation); `original` keeps every node of that plan alive for
    // the pass, so no node address is reused, and `annotated` keeps a node from being
    // annotated again when the walk reaches it below its annotation.
    let original = Arc::clone(&plan);
    let estimates = aggregate::shared_estimates();
    let mut annotated = HashSet::new();
    // The aggregate that each join feeds directly, by the join's address.
    let mut feeds: HashMap<usize, Arc<dyn ExecutionPlan>> = HashMap::new();
    let annotated_plan = plan
        .transform_down(|node| {
            let address = Arc::as_ptr(&node) as *const () as usize;
            if annotated.contains(&address) {
                return Ok(Transformed::no(node));
            }
            if let Some(agg) = node.downcast_ref::<AggregateExec>() {
                if agg.input().downcast_ref::<HashJoinExec>().is_some() {
                    let input = Arc::as_ptr(agg.input()) as *const () as usize;
                    feeds.insert(input, Arc::clone(&node));
                }
            }
            let declined = if let (Some(agg), Some(costing)) = (node.downcast_ref::<AggregateExec>(), &aggregates) {
                aggregate_reason(&node, agg, costing, &estimates)?
            } else if let (Some(join), Some(costing)) = (node.downcast_ref::<HashJoinExec>(), &joins) {
                join_reason(&node, join, costing, feeds.get(&address))?
            } else {
                None
            };
            Ok(match declined {
                Some(declined) => {
                    annotated.insert(address);
                    Transformed::yes(Arc::new(MphfDeclinedExec::new(node, declined)) as Arc<dyn ExecutionPlan>)
                }
                None => Transformed::no(node),
            })
        })
        .data();
    drop(original);
    annotated_plan
}
