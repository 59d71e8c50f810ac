//! `Tuning`: the planner's fixed thresholds, and the GPU emulation switch for tests.
//!
//! These are not session settings (see `config.rs` for why): SQL can neither show nor set
//! them. The Rust API changes them for one session (`MphfContext::tune`), so that tests and
//! benchmarks can move a single threshold; `mphf.costing` bypasses all of them at once.
//!
//! The session carries them as a DataFusion config extension (prefix `mphf_tuning`) because
//! optimizer rules see only `ConfigOptions`; that extension lists no entries and refuses `SET`.

use std::any::Any;

use ::datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigOptions, ExtensionOptions};
use ::datafusion::common::{DataFusionError, Result};

use super::cost::CostModel;
use crate::datafusion::aggregate::{GPU_MIN_ROWS, MIN_SLOTS};
use crate::datafusion::udf::GPU_LOOKUP_MIN_ROWS;

/// The thresholds (each field's doc says what it decides; defaults in [`Tuning::default`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// GROUP BY: indexes with fewer slots stay on hash aggregation (cache-resident tables).
    pub aggregate_min_slots: u64,
    /// GROUP BY: the indexed column's rows per run of equal keys (in table order, measured at
    /// build) must reach this; unclustered keys cost one MPHF query per row and lose.
    pub aggregate_min_rows_per_run: f64,
    /// GROUP BY: the most slot-array entries (input partitions × slots) per input row, when
    /// the input's row count is estimated; beyond it, emitting the partials costs more than the
    /// rows save.
    pub aggregate_max_slot_entries_per_row: f64,
    /// The same limit for an aggregate whose input is already hash-partitioned on the key
    /// (`SinglePartitioned`): each partition touches a 1/P share of its slot array, at random.
    pub aggregate_max_slot_entries_per_row_partitioned: f64,
    /// A GROUP BY of several columns runs on the slots of an indexed one only when the others
    /// are proven to depend on it. false: whenever one is indexed (same results, slower when
    /// the others disagree).
    pub aggregate_require_dependence: bool,
    /// GROUP BY and JOIN: a candidate that passes the thresholds is still declined when the
    /// cost model prices it above DataFusion's hash aggregation or hash join. false: the
    /// thresholds alone decide.
    pub compare_costs: bool,
    /// Smallest estimated input (rows) for which `aggregate_device = auto` uses the GPU.
    pub aggregate_gpu_min_rows: u64,
    /// The GPU placement of the aggregation runs its algorithm on the CPU (whole-input lookup,
    /// per-slot states merged as from the GPU), to test that path on machines without a GPU.
    pub gpu_emulation: bool,
    /// Smallest batch (rows) that `lookup_device = auto` sends to the GPU.
    pub lookup_gpu_min_rows: u64,
    /// Indexes of dense integer keys keep a direct key → slot table when it costs at most this
    /// many bytes per key (4 per value of the key range); 0: never. For indexes built afterwards.
    pub dense_lookup_max_bytes_per_key: f64,
    /// Indexes of in-memory tables keep the slot of every table row (4 bytes per row), so scans
    /// of the table copy slots instead of querying the MPHF. For indexes built afterwards.
    pub row_slots: bool,
    /// JOIN: joins on indexes with fewer slots stay hash joins.
    pub join_min_slots: u64,
    /// JOIN: without a dense-key table, the probe key must be an indexed column with at least
    /// this many rows per run of equal keys (one MPHF query per run).
    pub join_min_probe_rows_per_run: f64,
    /// JOIN: the collect form replaces a `Partitioned` join only up to this many probe
    /// partitions; beyond, the join keeps its partitions. 0: no limit.
    pub join_collect_max_partitions: usize,
    /// JOIN: a `Partitioned` join that must keep its form runs on slots only up to this many
    /// partitions (each partition builds a slot table of its share of the keys). 0: any.
    pub join_partitioned_max_partitions: usize,
    /// JOIN: leave a join to DataFusion when it would use its dense-integer `ArrayMap`.
    pub join_yield_to_array_map: bool,
    /// The cost model's constants (the estimates `EXPLAIN` shows, the device choice).
    pub costs: CostModel,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            aggregate_min_slots: MIN_SLOTS,
            aggregate_min_rows_per_run: 2.0,
            aggregate_max_slot_entries_per_row: 4.0,
            aggregate_max_slot_entries_per_row_partitioned: 1.0,
            aggregate_require_dependence: true,
            compare_costs: true,
            aggregate_gpu_min_rows: GPU_MIN_ROWS,
            gpu_emulation: false,
            lookup_gpu_min_rows: GPU_LOOKUP_MIN_ROWS,
            dense_lookup_max_bytes_per_key: 16.0,
            row_slots: true,
            join_min_slots: MIN_SLOTS,
            join_min_probe_rows_per_run: 2.0,
            join_collect_max_partitions: 0,
            join_partitioned_max_partitions: 4,
            join_yield_to_array_map: true,
            costs: CostModel::default(),
        }
    }
}

impl Tuning {
    /// The session's tuning (`config`'s extension), or the defaults.
    pub fn of(config: &ConfigOptions) -> Self {
        config.extensions.get::<Tuning>().cloned().unwrap_or_default()
    }

    /// The same with every cost threshold off (`mphf.costing = always`): the operators run
    /// wherever they apply. The index-building choices, the device crossovers and the
    /// dependence requirement (which decides grouping, not cost) stay.
    pub fn without_thresholds(self) -> Self {
        Self {
            aggregate_min_slots: 0,
            aggregate_min_rows_per_run: 0.0,
            aggregate_max_slot_entries_per_row: f64::INFINITY,
            aggregate_max_slot_entries_per_row_partitioned: f64::INFINITY,
            compare_costs: false,
            join_min_slots: 0,
            join_min_probe_rows_per_run: 0.0,
            join_yield_to_array_map: false,
            ..self
        }
    }
}

/// `value` parsed as `T`, or an error naming the threshold.
fn parsed<T: std::str::FromStr>(name: &str, value: &str) -> Result<T> {
    value
        .trim()
        .parse()
        .map_err(|_| DataFusionError::Configuration(format!("Tuning::{name}: cannot parse {value:?}")))
}

impl Tuning {
    /// Sets the threshold `name` from text (the command line's `--tune NAME=VALUE`).
    pub fn assign(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "aggregate_min_slots" => self.aggregate_min_slots = parsed(name, value)?,
            "aggregate_min_rows_per_run" => self.aggregate_min_rows_per_run = parsed(name, value)?,
            "aggregate_max_slot_entries_per_row" => self.aggregate_max_slot_entries_per_row = parsed(name, value)?,
            "aggregate_max_slot_entries_per_row_partitioned" => {
                self.aggregate_max_slot_entries_per_row_partitioned = parsed(name, value)?
            }
            "aggregate_require_dependence" => self.aggregate_require_dependence = parsed(name, value)?,
            "compare_costs" => self.compare_costs = parsed(name, value)?,
            "aggregate_gpu_min_rows" => self.aggregate_gpu_min_rows = parsed(name, value)?,
            "gpu_emulation" => self.gpu_emulation = parsed(name, value)?,
            "lookup_gpu_min_rows" => self.lookup_gpu_min_rows = parsed(name, value)?,
            "dense_lookup_max_bytes_per_key" => self.dense_lookup_max_bytes_per_key = parsed(name, value)?,
            "row_slots" => self.row_slots = parsed(name, value)?,
            "join_min_slots" => self.join_min_slots = parsed(name, value)?,
            "join_min_probe_rows_per_run" => self.join_min_probe_rows_per_run = parsed(name, value)?,
            "join_collect_max_partitions" => self.join_collect_max_partitions = parsed(name, value)?,
            "join_partitioned_max_partitions" => self.join_partitioned_max_partitions = parsed(name, value)?,
            "join_yield_to_array_map" => self.join_yield_to_array_map = parsed(name, value)?,
            other if CostModel::names().contains(&other) => return self.costs.assign(other, value),
            other => {
                return Err(DataFusionError::Configuration(format!(
                    "no planner threshold or cost constant named {other:?}"
                )))
            }
        }
        Ok(())
    }
}

impl ExtensionOptions for Tuning {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, _value: &str) -> Result<()> {
        Err(DataFusionError::Configuration(format!(
            "{}.{key} is not a setting: the planner's thresholds are set through the Rust API \
             (MphfContext::tune); mphf.costing = 'always' | 'never' bypasses them",
            Self::PREFIX
        )))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        Vec::new()
    }
}

impl ConfigExtension for Tuning {
    const PREFIX: &'static str = "mphf_tuning";
}
