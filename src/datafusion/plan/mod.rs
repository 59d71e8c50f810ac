//! Planning inputs shared by the optimizer rules and `mphf_index`: the planner's fixed
//! thresholds ([`Tuning`]) and how `mphf.costing` applies them ([`thresholds_for`]).
//!
//! Invariant: a rule reads its thresholds through [`thresholds_for`] only, so `mphf.costing`
//! means the same for every operator.

pub mod tuning;

use ::datafusion::common::config::ConfigOptions;

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
