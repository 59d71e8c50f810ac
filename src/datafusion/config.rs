//! `MphfConfig`: the extension's nine session settings, under the `mphf` prefix (`SET
//! mphf.<key> = ...`), listed by `SHOW ALL` and `information_schema.df_settings`.
//!
//! The settings are what a user decides: whether the operators run at all, on which device,
//! where indexes are saved, and `mphf.costing` (whether the planner's cost thresholds apply).
//! The thresholds themselves are not settings: they are constants of the planner
//! ([`crate::datafusion::plan::Tuning`]), changed through the Rust API only. A name that was a
//! setting before is rejected by `SET` with a message that names its replacement.
//!
//! Options with a fixed set of values are typed ([`Device`], [`OnStale`], [`CostingMode`]): `SET`
//! parses the value and rejects a bad one with the accepted values, before anything is stored,
//! so a typo never breaks the statements after it.

use std::any::Any;
use std::fmt;
use std::str::FromStr;

use ::datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions};
use ::datafusion::common::{config_field, DataFusionError, Result};

use crate::device::Device;

/// `mphf.on_stale`: what to do with a saved index that no longer matches its data.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnStale {
    /// Rebuild it (and save the new one).
    #[default]
    Rebuild,
    /// Fail the statement that needs it.
    Refuse,
}

impl FromStr for OnStale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "rebuild" => Ok(OnStale::Rebuild),
            "refuse" => Ok(OnStale::Refuse),
            other => Err(format!(
                "unknown stale-index policy '{other}' (expected rebuild or refuse)"
            )),
        }
    }
}

impl fmt::Display for OnStale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnStale::Rebuild => "rebuild",
            OnStale::Refuse => "refuse",
        })
    }
}

/// `mphf.costing`: whether the planner's cost thresholds decide where the operators run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CostingMode {
    /// The thresholds decide (declined candidates keep DataFusion's operators).
    #[default]
    Auto,
    /// Every supported candidate runs on slots, whatever it costs (tests and the differential
    /// check use it to reach every operator path on small tables).
    Always,
    /// No DataFusion operator is replaced; `mphf_index` and the indexes still work.
    Never,
}

impl FromStr for CostingMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(CostingMode::Auto),
            "always" => Ok(CostingMode::Always),
            "never" => Ok(CostingMode::Never),
            other => Err(format!(
                "unknown costing mode '{other}' (expected auto, always or never)"
            )),
        }
    }
}

impl fmt::Display for CostingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CostingMode::Auto => "auto",
            CostingMode::Always => "always",
            CostingMode::Never => "never",
        })
    }
}

/// `value` parsed, or a configuration error naming the accepted values.
fn parse_option<T: FromStr<Err = String>>(value: &str) -> Result<T> {
    value.trim().parse().map_err(DataFusionError::Configuration)
}

config_field!(Device, value => parse_option(value)?);
config_field!(OnStale, value => parse_option(value)?);
config_field!(CostingMode, value => parse_option(value)?);

/// The extension's settings (prefix `mphf`; see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct MphfConfig {
    /// Directory for saved indexes of file-backed tables; empty: a `_mphf/` folder next to the data.
    pub index_dir: String,
    /// Save indexes of file-backed tables and reuse saved ones whose fingerprint matches.
    pub persist: bool,
    /// What to do with a saved index that no longer matches its data: `rebuild` or `refuse`.
    pub on_stale: OnStale,
    /// Print index reuse / rebuild notices on stderr.
    pub verbose: bool,
    /// Replace hash aggregation by `MphfAggregateExec` when the GROUP BY key is indexed.
    pub enable_aggregate: bool,
    /// Replace hash joins by `MphfJoinExec` when the build side's join key is indexed.
    pub enable_join: bool,
    /// Where `MphfAggregateExec` aggregates: `auto`, `cpu` or `gpu` (see [`Device`]).
    pub aggregate_device: Device,
    /// Where `mphf_index` looks keys up: `auto`, `cpu` or `gpu`.
    pub lookup_device: Device,
    /// Whether the planner's cost thresholds decide: `auto`, `always` or `never`.
    pub costing: CostingMode,
}

impl Default for MphfConfig {
    fn default() -> Self {
        Self {
            index_dir: String::new(),
            persist: true,
            on_stale: OnStale::Rebuild,
            verbose: true,
            enable_aggregate: true,
            enable_join: true,
            aggregate_device: Device::Auto,
            lookup_device: Device::Auto,
            costing: CostingMode::Auto,
        }
    }
}

/// Each setting's name and the description `SHOW ALL` gives.
const SETTINGS: [(&str, &str); 9] = [
    ("index_dir", "Directory for saved indexes of file-backed tables; empty: a _mphf/ folder next to the data."),
    ("persist", "Save indexes of file-backed tables and reuse saved ones whose fingerprint matches."),
    ("on_stale", "A saved index that no longer matches its data: rebuild or refuse."),
    ("verbose", "Print index reuse and rebuild notices on stderr."),
    ("enable_aggregate", "Run GROUP BY on an indexed key on MPHF slots (MphfAggregateExec)."),
    ("enable_join", "Run joins on an indexed build-side key on MPHF slots (MphfJoinExec)."),
    ("aggregate_device", "Where MphfAggregateExec aggregates: auto, cpu or gpu."),
    ("lookup_device", "Where mphf_index looks keys up: auto, cpu or gpu."),
    ("costing", "auto: the planner's cost thresholds decide; always: every supported candidate runs on slots; never: none does."),
];

/// The message for a name that is not a setting: for one that was, what replaced it.
fn not_a_setting(key: &str) -> String {
    const THRESHOLDS: [&str; 14] = [
        "aggregate_min_slots",
        "aggregate_min_rows_per_run",
        "aggregate_max_slot_entries_per_row",
        "aggregate_max_slot_entries_per_row_partitioned",
        "aggregate_require_dependence",
        "aggregate_gpu_min_rows",
        "lookup_gpu_min_rows",
        "dense_lookup_max_bytes_per_key",
        "row_slots",
        "join_min_slots",
        "join_min_probe_rows_per_run",
        "join_collect_max_partitions",
        "join_partitioned_max_partitions",
        "join_yield_to_array_map",
    ];
    if THRESHOLDS.contains(&key) {
        format!(
            "mphf.{key} is no longer a setting: use mphf.costing = 'auto' | 'always' | 'never' (the planner's \
             thresholds apply, are bypassed, or no operator is replaced); the threshold itself is \
             Tuning::{key}, set through the Rust API (MphfContext::tune)"
        )
    } else if key == "gpu_emulation" {
        "mphf.gpu_emulation is no longer a setting: it is Tuning::gpu_emulation, set through the \
         Rust API (MphfContext::tune)"
            .to_string()
    } else {
        let names: Vec<&str> = SETTINGS.iter().map(|(n, _)| *n).collect();
        format!(
            "unknown setting mphf.{key} (the settings are mphf.{})",
            names.join(", mphf.")
        )
    }
}

impl ExtensionOptions for MphfConfig {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        match key {
            "index_dir" => self.index_dir.set("", value),
            "persist" => self.persist.set("", value),
            "on_stale" => self.on_stale.set("", value),
            "verbose" => self.verbose.set("", value),
            "enable_aggregate" => self.enable_aggregate.set("", value),
            "enable_join" => self.enable_join.set("", value),
            "aggregate_device" => self.aggregate_device.set("", value),
            "lookup_device" => self.lookup_device.set("", value),
            "costing" => self.costing.set("", value),
            other => Err(DataFusionError::Configuration(not_a_setting(other))),
        }
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        let values: [String; 9] = [
            self.index_dir.clone(),
            self.persist.to_string(),
            self.on_stale.to_string(),
            self.verbose.to_string(),
            self.enable_aggregate.to_string(),
            self.enable_join.to_string(),
            self.aggregate_device.to_string(),
            self.lookup_device.to_string(),
            self.costing.to_string(),
        ];
        SETTINGS
            .iter()
            .zip(values)
            .map(|((name, description), value)| ConfigEntry {
                key: format!("{}.{name}", Self::PREFIX),
                value: Some(value),
                description,
            })
            .collect()
    }
}

impl ConfigExtension for MphfConfig {
    const PREFIX: &'static str = "mphf";
}

impl MphfConfig {
    /// The same settings with `costing = always`: the operators run wherever they apply.
    pub fn without_costing(self) -> Self {
        Self {
            costing: CostingMode::Always,
            ..self
        }
    }

    /// True when a stale saved index must be refused instead of rebuilt.
    pub fn refuse_stale(&self) -> bool {
        self.on_stale == OnStale::Refuse
    }
}
