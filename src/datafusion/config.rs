//! `MphfConfig`: session options under the `mphf` prefix, settable with `SET mphf.<key> = ...`.
//!
//! Options with a fixed set of values are typed ([`Device`], [`OnStale`]): `SET` parses the
//! value and rejects a bad one with the accepted values, before anything is stored, so a typo
//! never breaks the statements after it.

use std::fmt;
use std::str::FromStr;

use ::datafusion::common::config::ConfigExtension;
use ::datafusion::common::{config_field, extensions_options, DataFusionError};

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

/// `value` parsed, or a configuration error naming the accepted values.
fn parse_option<T: FromStr<Err = String>>(value: &str) -> ::datafusion::common::Result<T> {
    value.trim().parse().map_err(DataFusionError::Configuration)
}

config_field!(Device, value => parse_option(value)?);
config_field!(OnStale, value => parse_option(value)?);

extensions_options! {
    /// Options of the MPHF extension (prefix `mphf`).
    pub struct MphfConfig {
        /// Directory for saved indexes of file-backed tables; empty: a `_mphf/` folder next to the data.
        pub index_dir: String, default = String::new()
        /// Save indexes of file-backed tables and reuse saved ones whose fingerprint matches.
        pub persist: bool, default = true
        /// What to do with a saved index that no longer matches its data: `rebuild` or `refuse`.
        pub on_stale: OnStale, default = OnStale::Rebuild
        /// Print index reuse / rebuild notices on stderr.
        pub verbose: bool, default = true
        /// Replace hash aggregation by `MphfAggregateExec` when the GROUP BY key is indexed.
        pub enable_aggregate: bool, default = true
        /// Costing: indexes with fewer slots stay on hash aggregation (cache-resident tables).
        pub aggregate_min_slots: u64, default = 4096
        /// Costing: the indexed column's rows per run of equal keys (in table order, measured
        /// at build) must reach this; unclustered keys cost one MPHF query per row and lose.
        pub aggregate_min_rows_per_run: f64, default = 2.0
        /// Costing: the most slot-array entries (input partitions × slots) per input row, when
        /// the input's row count is estimated; beyond it, emitting the partials costs more than
        /// the rows save.
        pub aggregate_max_slot_entries_per_row: f64, default = 4.0
        /// The same limit for an aggregate whose input is already hash-partitioned on the key
        /// (`SinglePartitioned`, e.g. after a partitioned join): each partition touches a 1/P
        /// share of its slot array, at random.
        pub aggregate_max_slot_entries_per_row_partitioned: f64, default = 1.0
        /// A GROUP BY of several columns runs on the slots of an indexed one only when the
        /// others are proven to depend on it (same row of a unique key, inner equi-joins on
        /// unique keys). false: whenever one is indexed; rows whose other columns disagree
        /// still get groups of their own (same results, slower).
        pub aggregate_require_dependence: bool, default = true
        /// Where `MphfAggregateExec` aggregates: `auto` (the GPU when one is usable, the input is
        /// estimated at `aggregate_gpu_min_rows` rows or more, and the aggregates are supported),
        /// `cpu`, or `gpu` (whenever supported; without a usable GPU it runs on the CPU with a
        /// notice). `EXPLAIN` shows the choice as `device=`.
        pub aggregate_device: Device, default = Device::Auto
        /// Smallest estimated input (rows) for which `aggregate_device = auto` uses the GPU
        /// (the crossover measured on the H200, benches/RESULTS-gpu.md).
        pub aggregate_gpu_min_rows: u64, default = crate::datafusion::aggregate::GPU_MIN_ROWS
        /// Run the GPU placement of the aggregation with its algorithm on the CPU (lookup of the
        /// whole input, `gpu::groupby::aggregate_cpu`, states merged as from the GPU): for
        /// testing that path on machines without a GPU.
        pub gpu_emulation: bool, default = false
        /// Where `mphf_index` looks keys up: `auto` (the GPU for batches of at least
        /// `lookup_gpu_min_rows` rows when one is usable), `cpu` or `gpu`.
        pub lookup_device: Device, default = Device::Auto
        /// Smallest batch (rows) that `lookup_device = auto` sends to the GPU.
        pub lookup_gpu_min_rows: u64, default = crate::datafusion::udf::GPU_LOOKUP_MIN_ROWS
        /// Lookups of dense integer keys read a direct key → slot table (same slots as the MPHF)
        /// when it costs at most this many bytes per key (4 per value of the key range); 0: off.
        /// Takes effect for indexes created (or loaded) afterwards.
        pub dense_lookup_max_bytes_per_key: f64, default = 16.0
        /// Indexes of in-memory tables keep the slot of every table row (4 bytes per row), so
        /// lookups of the table's own arrays (GROUP BY or `mphf_index` on a scan of it) copy
        /// slots instead of querying the MPHF. Takes effect for indexes created afterwards.
        pub row_slots: bool, default = true
        /// Replace hash joins by `MphfJoinExec` when the build side's join key is indexed.
        pub enable_join: bool, default = true
        /// Costing: joins on indexes with fewer slots stay hash joins (cache-resident tables).
        pub join_min_slots: u64, default = 4096
        /// Costing: without a dense-key table, the probe key must be an indexed column with at
        /// least this many rows per run of equal keys (one MPHF query per run).
        pub join_min_probe_rows_per_run: f64, default = 2.0
        /// The collect form (one shared build, no hash repartitions) replaces a `Partitioned`
        /// join only up to this many probe partitions; beyond, the join keeps its partitions
        /// (one build per partition, built in parallel). 0: no limit.
        pub join_collect_max_partitions: usize, default = 0
        /// Costing: a `Partitioned` join that must keep its form (one slot table per partition,
        /// each sized by the whole index) runs on slots only up to this many partitions (16
        /// partitions at SF 1 ran 0.59–0.65× of DataFusion's per-partition hash tables). 0: any.
        pub join_partitioned_max_partitions: usize, default = 4
        /// Costing: leave a join to DataFusion when it would use its dense-integer `ArrayMap`.
        pub join_yield_to_array_map: bool, default = true
    }
}

impl ConfigExtension for MphfConfig {
    const PREFIX: &'static str = "mphf";
}

impl MphfConfig {
    /// The same options with every costing threshold off: the operators run wherever they
    /// apply (tests and the differential check use it to reach every operator path).
    pub fn without_costing(mut self) -> Self {
        self.aggregate_min_slots = 0;
        self.aggregate_min_rows_per_run = 0.0;
        self.aggregate_max_slot_entries_per_row = f64::INFINITY;
        self.aggregate_max_slot_entries_per_row_partitioned = f64::INFINITY;
        self.join_min_slots = 0;
        self.join_min_probe_rows_per_run = 0.0;
        self.join_yield_to_array_map = false;
        self
    }

    /// True when a stale saved index must be refused instead of rebuilt.
    pub fn refuse_stale(&self) -> bool {
        self.on_stale == OnStale::Refuse
    }
}
