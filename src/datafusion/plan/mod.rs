//! Planning inputs shared by the optimizer rules and `mphf_index`: the planner's fixed
//! thresholds ([`Tuning`]), how `mphf.costing` applies them ([`thresholds_for`]), the cost
//! model that prices every candidate ([`cost`]), and what a declined candidate says about
//! itself ([`Declined`], shown by `explain::MphfDeclinedExec`).
//!
//! Invariants: a rule reads its thresholds and cost constants through [`thresholds_for`] only,
//! so `mphf.costing` means the same for every operator; the estimates a node shows are the ones
//! its rule decided with.

pub mod cost;
pub mod sanity;
pub mod scans;
pub mod tuning;
pub mod verdicts;

use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::JoinType;
use ::datafusion::physical_plan::joins::HashJoinExec;

pub use cost::{CostModel, Estimate};
pub use tuning::Tuning;

use crate::datafusion::config::{CostingMode, MphfConfig};

/// Starts one plan's optimization by the MPHF rules on this thread; the aggregate rule, the
/// first of them, calls it. What the rules of a plan share is started afresh: the slot scans
/// ([`scans::plan_starts`]) and the row estimates (`aggregate::estimate`).
pub(crate) fn optimization_starts() {
    scans::plan_starts();
    crate::datafusion::aggregate::estimates_start();
}

/// Ends the plan's optimization on this thread; the explain rule, the last MPHF rule, calls it.
/// Nothing decided for the plan is kept for the next: the declines handed to the explain rule
/// ([`verdicts`]), the slot scans and the row estimates.
pub(crate) fn optimization_ends() {
    verdicts::clear(&verdicts::ALL);
    scans::plan_ends();
    crate::datafusion::aggregate::estimates_end();
}

/// The thresholds the rules apply under `cfg.costing`: the session's [`Tuning`] (its defaults
/// when none was set) for `auto`, the same with every cost threshold off for `always`, and
/// `None` for `never` (no operator is replaced).
pub fn thresholds_for(cfg: &MphfConfig, config: &ConfigOptions) -> Option<Tuning> {
    let tuning = Tuning::of(config);
    match cfg.costing {
        CostingMode::Auto => Some(tuning),
        CostingMode::Always => Some(tuning.without_thresholds()),
        CostingMode::Never => None,
    }
}

/// True when the session's plans are cut into stages for datafusion-distributed workers (its
/// planner's options are set). The rules then keep to the forms a stage split over several
/// tasks runs correctly and in parallel: no slot-range merge of all input partitions, and a
/// collect-form join only where its build side is broadcast ([`broadcasts_build_sides`]).
pub fn runs_distributed(config: &ConfigOptions) -> bool {
    #[cfg(feature = "distributed")]
    {
        config
            .extensions
            .get::<datafusion_distributed::DistributedConfig>()
            .is_some()
    }
    #[cfg(not(feature = "distributed"))]
    {
        let _ = config;
        false
    }
}

/// True when the session's plans are cut into stages (see [`runs_distributed`]) and the build
/// side of a collect-form join may be broadcast to every task of its stage
/// (datafusion-distributed's `broadcast_joins` option, on by default). The join rule keeps the
/// collect form then, for join types a broadcast build side answers correctly
/// ([`build_side_broadcasts`]).
pub fn broadcasts_build_sides(config: &ConfigOptions) -> bool {
    #[cfg(feature = "distributed")]
    {
        datafusion_distributed::DistributedConfig::from_config_options(config).is_ok_and(|d| d.broadcast_joins)
    }
    #[cfg(not(feature = "distributed"))]
    {
        let _ = config;
        false
    }
}

/// Whether a collect-form `join` gives the same rows with its build side broadcast to several
/// tasks, each probing its share of the probe side: the join emits no row for an unmatched
/// build row (each task would emit its own), and it is not a null-aware anti join (whose check
/// for NULL probe keys would see one task's share). datafusion-distributed broadcasts its own
/// hash joins under the same rule.
pub fn build_side_broadcasts(join: &HashJoinExec) -> bool {
    join_type_broadcasts(join.join_type()) && !join.null_aware
}

/// Whether a collect-form join of type `join_type` emits no row for an unmatched build row
/// (see [`build_side_broadcasts`]).
pub fn join_type_broadcasts(join_type: &JoinType) -> bool {
    matches!(
        join_type,
        JoinType::Inner | JoinType::Right | JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark
    )
}

/// A candidate the rules left to DataFusion: why, and the estimates where it was priced
/// (shown by `EXPLAIN` on the `MphfDeclined` node over it).
#[derive(Clone, Debug, PartialEq)]
pub struct Declined {
    /// Why, in words naming the threshold or the estimate that decided.
    pub reason: String,
    /// Ours against DataFusion's, where the candidate got that far.
    pub estimate: Option<cost::Estimate>,
}

impl Declined {
    /// A decline for `reason`.
    pub fn new(reason: String, estimate: Option<cost::Estimate>) -> Self {
        Self { reason, estimate }
    }
}

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "reason={}", self.reason)?;
        match &self.estimate {
            Some(estimate) => write!(f, ", {estimate}"),
            None => Ok(()),
        }
    }
}
