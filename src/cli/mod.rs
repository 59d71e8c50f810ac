//! The `mphf` command-line tool (issue 2 item 7): build, inspect and query column indexes.
//!
//! Layout: one file per subcommand, each with a clap `Args` struct and a `run` function; shared
//! argument groups ([`InputArgs`], [`ParamArgs`]) are flattened into the subcommands that need
//! them, and [`Command`] is the one place a new subcommand is added. Errors are [`CliError`]
//! (thiserror); `anyhow` appears only in `src/bin/mphf.rs`.

mod allocator;
pub mod bench_build;
pub mod bench_planning;
pub mod bench_slots;
pub mod bench_sparse;
mod bench_tables;
pub mod bench_tpch;
pub mod build;
pub mod calibrate;
pub mod demo;
pub mod difftest;
pub mod inspect;
pub mod lookup;
pub mod parquet_io;
pub mod sql;
pub mod timing;
pub mod tpch;
#[cfg(feature = "distributed")]
pub mod worker;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use thiserror::Error;

use crate::core::column::IndexOptions;
use crate::core::Params;
use crate::device::Device;
use crate::error::MphfError;

/// RecSplit minimal perfect hash indexes over Parquet / Arrow columns.
#[derive(Debug, Parser)]
#[command(name = "mphf", version, about, propagate_version = true)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `mphf`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a column index from one column of a Parquet file.
    Build(build::BuildArgs),
    /// Print an index's parameters and counts as one JSON object.
    Inspect(inspect::InspectArgs),
    /// Look up every row of a Parquet column; write the column and its `slot`.
    Lookup(lookup::LookupArgs),
    /// Run SQL with the MPHF extension over Parquet tables (`-c`, `-f`, or an interactive shell).
    Sql(sql::SqlArgs),
    /// Generate TPC-H tables as Parquet files.
    Tpch(tpch::TpchArgs),
    /// The main job: TPC-H in memory, MPHF indexes, GROUP BY / JOIN with and without them.
    Demo(demo::DemoArgs),
    /// The differential SQL test: generated queries in vanilla DataFusion and in the MPHF
    /// sessions (default costing, costing off), rows compared; writes what
    /// `benches/duckdb_diff.py` compares with DuckDB.
    Difftest(difftest::DifftestArgs),
    /// Measure the planner's cost constants on this machine (one core) and write them for
    /// `--costs FILE` / `MphfContext::load_costs`.
    Calibrate(calibrate::CalibrateArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Serve one datafusion-distributed worker with the MPHF codec, for `mphf sql --worker-url`.
    #[cfg(feature = "distributed")]
    Worker(worker::WorkerArgs),
}

/// The benchmarks of `mphf bench`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Build and query random u64 keys with RecSplit, PtrHash and FMPHGO; print one table.
    Build(bench_build::BenchBuildArgs),
    /// GROUP BY / JOIN counting on TPC-H key columns: MPHF slots vs hash maps, no DataFusion.
    Slots(bench_slots::BenchSlotsArgs),
    /// TPC-H GROUP BY queries with and without MPHF in one process: median times and ratios.
    Groupby(demo::DemoArgs),
    /// TPC-H joins on key columns with and without MPHF in one process: median times, ratios
    /// and the path vanilla DataFusion took (hash join mode or ArrayMap).
    Join(demo::DemoArgs),
    /// GROUP BY / JOIN / DISTINCT on sparse, unclustered keys (random ids, UUID-like strings),
    /// in memory and over Parquet, with and without MPHF: median times and ratios.
    Sparse(bench_sparse::BenchSparseArgs),
    /// What the MPHF rules add to planning: TPC-H Q1–Q22 planned in a vanilla and an MPHF
    /// session of one process, median times and their difference.
    Planning(bench_planning::BenchPlanningArgs),
    /// TPC-H Q1–Q22 over in-memory tables with and without MPHF in one process: median times,
    /// speed-ups and a check that the rows agree.
    Tpch(bench_tpch::BenchTpchArgs),
}

/// Runs a parsed command line, after setting how long the allocator keeps freed memory
/// ([`allocator`]).
///
/// # Errors
/// The subcommand's [`CliError`].
pub fn run(cli: Cli) -> Result<(), CliError> {
    allocator::keep_freed_memory_where_it_fits();
    match cli.command {
        Command::Build(args) => build::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Lookup(args) => lookup::run(&args),
        Command::Sql(args) => block_on(sql::run(args)),
        #[cfg(feature = "distributed")]
        Command::Worker(args) => block_on(worker::run(args)),
        Command::Tpch(args) => tpch::run(args).map_err(CliError::Other),
        Command::Demo(args) => block_on(demo::run(args, demo::Suite::Demo)),
        Command::Difftest(args) => block_on(difftest::run(args)),
        Command::Calibrate(args) => block_on(calibrate::run(args)),
        Command::Bench(BenchCommand::Slots(args)) => bench_slots::run(&args),
        Command::Bench(BenchCommand::Groupby(args)) => block_on(demo::run(args, demo::Suite::GroupBy)),
        Command::Bench(BenchCommand::Join(args)) => block_on(demo::run(args, demo::Suite::Join)),
        Command::Bench(BenchCommand::Sparse(args)) => block_on(bench_sparse::run(args)),
        Command::Bench(BenchCommand::Planning(args)) => block_on(bench_planning::run(args)),
        Command::Bench(BenchCommand::Tpch(args)) => block_on(bench_tpch::run(args)),
        Command::Bench(BenchCommand::Build(args)) => {
            bench_build::run(&args).map_err(|e| CliError::Bench(e.to_string()))?;
            Ok(())
        }
    }
}

/// Runs an async command on a multi-threaded tokio runtime.
fn block_on(job: impl std::future::Future<Output = anyhow::Result<()>>) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| CliError::Io {
            path: PathBuf::from("<tokio runtime>"),
            err,
        })?;
    runtime.block_on(job).map_err(CliError::Other)
}

/// A Parquet input and one of its columns.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// Input Parquet file.
    #[arg(long, short = 'i')]
    pub input: PathBuf,
    /// Name of the key column.
    #[arg(long, short = 'c')]
    pub column: String,
}

/// MPHF parameters and build resources.
#[derive(Debug, Clone, Args)]
pub struct ParamArgs {
    /// Leaf size ℓ (2..=24): larger is smaller and slower to build.
    #[arg(long, default_value_t = Params::DEFAULT.leaf)]
    pub leaf: usize,
    /// Expected bucket size b (1..=2000): larger is smaller and slower to query.
    #[arg(long, default_value_t = Params::DEFAULT.bucket)]
    pub bucket: usize,
    /// Bijection rotation: faster leaf search for ≤ 0.05 bits/key.
    #[arg(long)]
    pub rotation: bool,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// First hash seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Build device: auto (the GPU when present and the build is large enough), cpu or gpu.
    #[arg(long, default_value_t = Device::Auto)]
    pub device: Device,
}

impl ParamArgs {
    /// The index options these arguments describe, with the solver of `--device` for `n_keys`
    /// keys (a notice on stderr when the GPU was asked for and is not usable).
    ///
    /// # Errors
    /// [`MphfError::InvalidParameter`] for ℓ or b out of range, or zero threads.
    pub fn options_for(&self, n_keys: u64) -> Result<IndexOptions, MphfError> {
        let mut opts = self.options()?;
        let (solver, notice) = crate::placement::solver_for(self.device, n_keys, &opts.params);
        if let Some(notice) = notice {
            eprintln!("{notice}");
        }
        opts.solver = solver;
        Ok(opts)
    }

    /// The index options these arguments describe (CPU solver).
    ///
    /// # Errors
    /// [`MphfError::InvalidParameter`] for ℓ or b out of range, or zero threads.
    pub fn options(&self) -> Result<IndexOptions, MphfError> {
        check_threads(self.threads)?;
        Ok(IndexOptions {
            params: Params::try_new(self.leaf, self.bucket, self.rotation)?,
            seed: self.seed,
            threads: self.threads,
            solver: None,
        })
    }
}

/// The most worker threads `--threads` accepts: far above any core count, far below what the
/// system takes seconds to start (100 000 threads took over 300 s).
pub const MAX_THREADS: usize = 1024;

/// `--threads` within `1..=MAX_THREADS`.
///
/// # Errors
/// [`MphfError::InvalidParameter`] naming the range.
pub fn check_threads(threads: Option<usize>) -> Result<(), MphfError> {
    match threads {
        Some(t) if t == 0 || t > MAX_THREADS => Err(MphfError::InvalidParameter(format!(
            "--threads must be between 1 and {MAX_THREADS}, got {t}"
        ))),
        _ => Ok(()),
    }
}

/// Errors of the command-line tool.
#[derive(Debug, Error)]
pub enum CliError {
    /// A benchmark failed.
    #[error("benchmark failed: {0}")]
    Bench(String),
    /// An index build, load or lookup failed.
    #[error(transparent)]
    Mphf(#[from] MphfError),
    /// A file could not be read or written.
    #[error("{path}: {err}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        err: std::io::Error,
    },
    /// A Parquet file could not be read or written.
    #[error("{path}: {err}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        err: parquet::errors::ParquetError,
    },
    /// An Arrow operation failed.
    #[error("arrow error: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    /// The requested column is not in the file.
    #[error("column {column:?} not found in {path} (columns: {available})")]
    MissingColumn {
        /// The requested column.
        column: String,
        /// The file.
        path: PathBuf,
        /// Its top-level columns, comma separated.
        available: String,
    },
    /// An index file is invalid.
    #[error("{path}: {err}")]
    Index {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        err: MphfError,
    },
    /// The column exists but its type cannot be a key.
    #[error("column {column:?} in {path}: {err}")]
    Column {
        /// The column.
        column: String,
        /// The file.
        path: PathBuf,
        /// Why it cannot be used.
        err: MphfError,
    },
    /// A SQL, TPC-H or demo command failed (the message carries its context).
    #[error("{0:#}")]
    Other(anyhow::Error),
    /// JSON output failed.
    #[error("JSON error: {0}")]
    Json(#[from] serde_json::Error),
}
