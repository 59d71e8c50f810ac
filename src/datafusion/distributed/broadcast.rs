//! Broadcast build sides for the MPHF joins of a distributed plan.
//!
//! # Why
//! A collect-form join ([`MphfJoinExec`], or an [`MphfGroupJoinExec`] over one) reads its whole
//! build side in every probe partition. Split over several tasks, each task needs all of it.
//! datafusion-distributed broadcasts the build side of its own `CollectLeft` hash joins: its
//! planner puts a `BroadcastExec` under the build side's coalesce, and every `BroadcastExec`
//! becomes a stage whose output each consumer task receives whole. It does not know our joins,
//! so without this their stages would run in one task, and the join rule used to leave such
//! joins to DataFusion.
//!
//! [`BroadcastBuildSides`] is the query planner between DataFusion's (whose optimizer runs the
//! MPHF rules) and the distributed planner: it puts the same `BroadcastExec` under our joins'
//! build sides. Each task then builds the join's slot table from the whole build side and
//! probes its own share of the probe side.
//!
//! # Invariants
//! - Only joins that give the same rows from any split of their probe side get a broadcast
//!   build side ([`build_side_broadcasts`]); the join rule keeps the collect form in a
//!   distributed plan only for those.
//! - A group join's build side is broadcast only when its aggregate is partial: a final
//!   aggregate after the shuffle merges the tasks' groups.
//! - A collect-form join whose build side is not broadcast keeps its stage to one task
//!   (`cluster`'s desired-task-count handler, [`build_is_broadcast`]).

use std::sync::Arc;

use ::datafusion::catalog::Session;
use ::datafusion::common::tree_node::{Transformed, TreeNode};
use ::datafusion::common::Result;
use ::datafusion::execution::context::QueryPlanner;
use ::datafusion::logical_expr::LogicalPlan;
use ::datafusion::physical_plan::aggregates::AggregateMode;
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::joins::PartitionMode;
use ::datafusion::physical_plan::{ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions};
use ::datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
use async_trait::async_trait;
use datafusion_distributed::{BroadcastExec, NetworkBroadcastExec};

use crate::datafusion::join::MphfGroupJoinExec;
use crate::datafusion::plan::{broadcasts_build_sides, build_side_broadcasts};
use crate::datafusion::MphfJoinExec;

/// The physical planner `inner` (DataFusion's default when `None`), then
/// [`broadcast_build_sides`] where the session broadcasts build sides.
#[derive(Debug)]
pub(crate) struct BroadcastBuildSides {
    pub(crate) inner: Option<Arc<dyn QueryPlanner + Send + Sync>>,
}

#[async_trait]
impl QueryPlanner for BroadcastBuildSides {
    async fn create_physical_plan(
        &self,
        logical_plan: &LogicalPlan,
        session: &dyn Session,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = match &self.inner {
            Some(inner) => inner.create_physical_plan(logical_plan, session).await?,
            None => {
                DefaultPhysicalPlanner::default()
                    .create_physical_plan(logical_plan, session)
                    .await?
            }
        };
        match broadcasts_build_sides(session.config_options()) {
            true => broadcast_build_sides(plan),
            false => Ok(plan),
        }
    }
}

/// The collect-form hash join of `node`, an [`MphfJoinExec`] or a partial [`MphfGroupJoinExec`],
/// when its build side may be broadcast.
fn broadcastable(node: &Arc<dyn ExecutionPlan>) -> bool {
    let join = match (
        node.downcast_ref::<MphfJoinExec>(),
        node.downcast_ref::<MphfGroupJoinExec>(),
    ) {
        (Some(j), _) => j.join(),
        (None, Some(g)) if *g.aggregate().mode() == AggregateMode::Partial => g.join().join(),
        _ => return false,
    };
    *join.partition_mode() == PartitionMode::CollectLeft && build_side_broadcasts(join)
}

/// Whether `join`'s build side (its first child) is broadcast: a coalesce over a
/// `BroadcastExec`, or over the network broadcast that replaced it.
pub(crate) fn build_is_broadcast(join: &MphfJoinExec) -> bool {
    join.join()
        .left()
        .downcast_ref::<CoalescePartitionsExec>()
        .is_some_and(|c| c.input().is::<BroadcastExec>() || c.input().is::<NetworkBroadcastExec>())
}

/// `plan` with a `BroadcastExec` under the build side's coalesce of every MPHF join that may
/// broadcast it (see the module docs), as datafusion-distributed places it for its own joins.
pub fn broadcast_build_sides(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        if !broadcastable(&node) {
            return Ok(Transformed::no(node));
        }
        let mut children: Vec<Arc<dyn ExecutionPlan>> = node.children().into_iter().cloned().collect();
        let Some(build) = children.first() else {
            return Ok(Transformed::no(node));
        };
        let (input, fetch) = match build.downcast_ref::<CoalescePartitionsExec>() {
            Some(c) if c.input().is::<BroadcastExec>() => return Ok(Transformed::no(node)),
            Some(c) => (Arc::clone(c.input()), c.fetch()),
            None => (Arc::clone(build), None),
        };
        let broadcast: Arc<dyn ExecutionPlan> = Arc::new(BroadcastExec::new(input, 1));
        children[0] = Arc::new(CoalescePartitionsExec::new(broadcast).with_fetch(fetch));
        let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        Ok(Transformed::yes(node.replace_children(children, options)?))
    })
    .map(|t| t.data)
}
