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
pub mod tuning;

use ::datafusion::common::config::ConfigOptions;

pub use cost::{CostModel, Estimate};
pub use tuning::Tuning;

use crate::datafusion::config::{CostingMode, MphfConfig};

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
/// tasks runs correctly and in parallel: no slot-range merge of all input partitions, no
/// collect-form join (datafusion-distributed broadcasts the build side of its own hash join
/// only, and would run ours in one task).
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
