//! `mphf difftest`: the differential SQL test. Generated tables and seeded queries (see
//! [`tables`] and [`queries`]), each query run in sessions that must agree:
//!
//! 1. **reference**: vanilla DataFusion (a plain `SessionContext`), or, for queries that call
//!    `mphf_index`, the extension with both operators off;
//! 2. **default**: the extension with its default settings;
//! 3. **costing off**: the extension with every costing threshold off, so that the operators
//!    run wherever they apply;
//! 4. **GPU emulation**: costing off, GROUP BYs on the GPU placement with its algorithm run on
//!    the CPU (`Tuning::gpu_emulation`), so that its conversion of per-slot results into
//!    accumulator states is checked on machines without a GPU.
//!
//! Each query runs at a seed-chosen `target_partitions` (1–8) and `batch_size` (100–8192),
//! the same in every session. A panic is caught and reported like an error. The tables
//! are in memory, or Parquet files (with their indexes saved next to them), or both.
//!
//! The run writes what `benches/duckdb_diff.py` compares with DuckDB: the tables as Parquet
//! files and `queries.jsonl` (each query with the reference's rows). With `--tpch-sf`, the same
//! is done for TPC-H Q1–Q22 (the queries of `sql-tests/tpch_queries.slt`) with an index on every
//! key column.

pub mod cells;
pub mod queries;
pub mod tables;

use std::fmt;
use std::io::Write as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::datafusion::datasource::MemTable;
use ::datafusion::error::{DataFusionError, Result};
use ::datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use clap::{Args, ValueEnum};
use futures::FutureExt;
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

use self::cells::Rows;
use self::queries::{Generator, Query};
use self::tables::{Rng, Table, INDEXES};
use crate::datafusion::{tpch, MphfConfig, MphfContext};

/// Where the tables of a run live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Source {
    /// `MemTable`s.
    Memory,
    /// Parquet files (several row groups), indexes saved next to them.
    Parquet,
    /// Every query over both.
    Both,
}

/// Arguments of `mphf difftest`.
#[derive(Args, Debug, Clone)]
pub struct DifftestArgs {
    /// Seed of the tables and queries.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of generated queries.
    #[arg(long, default_value_t = 1500)]
    pub queries: usize,
    /// Where the tables live.
    #[arg(long, value_enum, default_value_t = Source::Both)]
    pub source: Source,
    /// Output folder: the tables as Parquet and `queries.jsonl` (created).
    #[arg(long)]
    pub dir: PathBuf,
    /// Instead of generated queries: TPC-H Q1–Q22 at this scale factor.
    #[arg(long)]
    pub tpch_sf: Option<f64>,
}

/// One disagreement.
#[derive(Clone, Debug)]
pub struct Failure {
    /// The query's seed (or `tpch`).
    pub seed: String,
    /// Its number in the run.
    pub id: usize,
    /// Its SQL.
    pub sql: String,
    /// Session settings it ran with.
    pub settings: String,
    /// Which session and what went wrong.
    pub what: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed={} id={} ({}): {}\n  {}",
            self.seed, self.id, self.settings, self.sql, self.what
        )
    }
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Queries run (each over every source).
    pub queries: usize,
    /// Queries the reference session itself rejected (a generator bug, not an extension bug).
    pub reference_errors: Vec<Failure>,
    /// Disagreements, errors or panics of the extension's sessions.
    pub failures: Vec<Failure>,
}

/// Session settings of one query.
#[derive(Clone, Copy, Debug)]
struct Settings {
    partitions: usize,
    batch_size: usize,
}

impl Settings {
    fn pick(rng: &mut Rng) -> Self {
        Self {
            partitions: *rng.pick(&[1, 2, 3, 4, 8]),
            batch_size: *rng.pick(&[100, 333, 1024, 8192]),
        }
    }

    fn statements(&self) -> [String; 2] {
        [
            format!("SET datafusion.execution.target_partitions = {}", self.partitions),
            format!("SET datafusion.execution.batch_size = {}", self.batch_size),
        ]
    }
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "target_partitions={}, batch_size={}",
            self.partitions, self.batch_size
        )
    }
}

/// The sessions over one set of tables (the reference of `mphf_index` queries is the extension
/// with its operators off).
struct Sessions {
    vanilla: SessionContext,
    operators_off: MphfContext,
    default: MphfContext,
    costing_off: MphfContext,
    gpu_emulation: MphfContext,
}

/// A plain or an MPHF session.
enum Session<'a> {
    Plain(&'a SessionContext),
    Mphf(&'a MphfContext),
}

impl Session<'_> {
    async fn run(&self, sql: &str) -> Result<Rows> {
        let df = match self {
            Session::Plain(c) => c.sql(sql).await?,
            Session::Mphf(c) => c.sql(sql).await?,
        };
        let schema = df.schema().as_arrow().clone();
        let batches = df.collect().await?;
        Rows::from_batches(&schema, &batches)
    }

    /// Runs `sql` under `settings`; a panic becomes an error.
    async fn run_caught(&self, sql: &str, settings: Settings) -> Result<Rows> {
        for s in settings.statements() {
            self.run(&s).await?;
        }
        match AssertUnwindSafe(self.run(sql)).catch_unwind().await {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(DataFusionError::Execution(format!("PANIC: {msg}")))
            }
        }
    }
}

impl Sessions {
    fn new() -> Self {
        let off = MphfConfig {
            enable_aggregate: false,
            enable_join: false,
            ..MphfConfig::default()
        };
        let mphf = |cfg: MphfConfig| MphfContext::with_config(SessionConfig::new().with_option_extension(cfg));
        let gpu = MphfConfig {
            aggregate_device: crate::device::Device::Gpu,
            ..MphfConfig::default().without_costing()
        };
        Self {
            vanilla: SessionContext::new(),
            operators_off: mphf(off),
            default: mphf(MphfConfig::default()),
            costing_off: mphf(MphfConfig::default().without_costing()),
            gpu_emulation: {
                let emulated = mphf(gpu);
                emulated.tune(|t| t.gpu_emulation = true);
                emulated
            },
        }
    }

    fn mphf(&self) -> [&MphfContext; 4] {
        [
            &self.operators_off,
            &self.default,
            &self.costing_off,
            &self.gpu_emulation,
        ]
    }

    /// Registers `tables` in memory (`partitions` partitions each) in every session.
    fn register_memory(&self, tables: &[Table], partitions: usize) -> Result<()> {
        for t in tables {
            let n = partitions.max(1);
            let mut parts = vec![Vec::new(); n];
            for (i, b) in t.batches.iter().enumerate() {
                parts[i % n].push(b.clone());
            }
            let provider = || MemTable::try_new(Arc::clone(&t.schema), parts.clone()).map(Arc::new);
            self.vanilla.register_table(t.name, provider()?)?;
            for s in self.mphf() {
                s.ctx().register_table(t.name, provider()?)?;
            }
        }
        Ok(())
    }

    /// Registers the Parquet files `dir/<name>.parquet` as `names` in every session.
    async fn register_parquet(&self, dir: &Path, names: &[&str]) -> Result<()> {
        for name in names {
            let path = dir.join(format!("{name}.parquet")).display().to_string();
            self.vanilla
                .register_parquet(*name, &path, ParquetReadOptions::default())
                .await?;
            for s in self.mphf() {
                s.register_parquet(name, &path).await?;
            }
        }
        Ok(())
    }

    /// Runs `statements` (index creation) in the extension's sessions.
    async fn in_mphf_sessions(&self, statements: &[String]) -> Result<()> {
        for s in self.mphf() {
            for sql in statements {
                s.sql(sql).await?.collect().await?;
            }
        }
        Ok(())
    }

    /// Runs `query` in every session; the reference's rows, or why it failed.
    async fn check(&self, query: &Query, settings: Settings) -> std::result::Result<Rows, Check> {
        let reference = if query.duckdb {
            Session::Plain(&self.vanilla)
        } else {
            Session::Mphf(&self.operators_off)
        };
        let expected = reference
            .run_caught(&query.sql, settings)
            .await
            .map_err(|e| Check::Reference(e.to_string()))?;
        let sessions = [
            ("default", &self.default),
            ("costing off", &self.costing_off),
            ("GPU emulation", &self.gpu_emulation),
        ];
        for (name, session) in sessions {
            match Session::Mphf(session).run_caught(&query.sql, settings).await {
                Err(e) => return Err(Check::Failed(format!("{name}: error: {e}"))),
                Ok(rows) => {
                    if let Some(d) = expected.diff(&rows, query.ordered) {
                        return Err(Check::Failed(format!("{name}: rows differ from the reference: {d}")));
                    }
                }
            }
        }
        Ok(expected)
    }
}

/// Why a query did not pass.
enum Check {
    /// The reference session rejected it.
    Reference(String),
    /// An extension session disagreed, failed or panicked.
    Failed(String),
}

/// Writes `table` as `dir/<name>.parquet` in row groups of at most 512 rows.
fn write_parquet(dir: &Path, table: &Table) -> Result<()> {
    let path = dir.join(format!("{}.parquet", table.name));
    let file = std::fs::File::create(&path)?;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(512))
        .build();
    let mut w = ArrowWriter::try_new(file, Arc::clone(&table.schema), Some(props))?;
    for b in &table.batches {
        w.write(b)?;
    }
    w.close()?;
    Ok(())
}

/// One line of `queries.jsonl`.
fn json_line(seed: &str, id: usize, query: &Query, rows: &Rows) -> String {
    let line = serde_json::json!({
        "id": id,
        "seed": seed,
        "sql": query.sql,
        "duckdb": query.duckdb,
        "ordered": query.ordered,
        "types": rows.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "rows": rows.rows.iter().map(|r| r.iter().map(|c| c.to_json()).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    line.to_string()
}

/// Runs `queries` over `sessions` and adds to `report`; returns the JSON lines of the passed
/// queries.
async fn run_queries(
    sessions: &Sessions,
    seed: &str,
    queries: &[Query],
    rng: &mut Rng,
    report: &mut Report,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (id, query) in queries.iter().enumerate() {
        let settings = Settings::pick(rng);
        let failure = |what: String| Failure {
            seed: seed.to_string(),
            id,
            sql: query.sql.clone(),
            settings: settings.to_string(),
            what,
        };
        match sessions.check(query, settings).await {
            Ok(rows) => lines.push(json_line(seed, id, query, &rows)),
            Err(Check::Reference(e)) => report.reference_errors.push(failure(format!("reference: {e}"))),
            Err(Check::Failed(e)) => report.failures.push(failure(e)),
        }
    }
    report.queries += queries.len();
    lines
}

/// The generated suite of `seed`: `n` queries over the tables in memory and/or in Parquet
/// files under `dir` (needed for Parquet); writes `dir/queries.jsonl` when `dir` is given.
///
/// # Errors
/// Writing the files, registering tables or creating indexes.
pub async fn run_generated(seed: u64, n: usize, source: Source, dir: Option<&Path>) -> Result<Report> {
    let tables = tables::generate(seed)?;
    let mut generator = Generator::new(seed);
    let queries: Vec<Query> = (0..n).map(|_| generator.next_query()).collect();
    let create: Vec<String> = INDEXES
        .iter()
        .map(|(name, table, column)| format!("CREATE INDEX IF NOT EXISTS {name} ON {table} USING mphf ({column})"))
        .collect();
    let mut rng = Rng::new(seed ^ 0x5E77_1265);
    let mut report = Report::default();
    let mut lines = Vec::new();
    let seed_text = seed.to_string();
    if matches!(source, Source::Memory | Source::Both) {
        let sessions = Sessions::new();
        sessions.register_memory(&tables, 1 + rng.below(4))?;
        sessions.in_mphf_sessions(&create).await?;
        lines = run_queries(&sessions, &seed_text, &queries, &mut rng, &mut report).await;
    }
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir)?;
        for t in &tables {
            write_parquet(dir, t)?;
        }
    }
    if matches!(source, Source::Parquet | Source::Both) {
        let Some(dir) = dir else {
            return Err(DataFusionError::Plan("Parquet tables need an output folder".into()));
        };
        let sessions = Sessions::new();
        let names: Vec<&str> = tables.iter().map(|t| t.name).collect();
        sessions.register_parquet(dir, &names).await?;
        sessions.in_mphf_sessions(&create).await?;
        let parquet_lines = run_queries(&sessions, &seed_text, &queries, &mut rng, &mut report).await;
        if lines.is_empty() {
            lines = parquet_lines;
        }
    }
    if let Some(dir) = dir {
        write_lines(&dir.join("queries.jsonl"), &lines)?;
    }
    Ok(report)
}

/// TPC-H Q1–Q22 at `sf` over Parquet files in `dir` (generated), with an index on every key
/// column; writes `dir/queries.jsonl`.
///
/// # Errors
/// Generating or writing the tables, registering them, creating indexes.
pub async fn run_tpch(sf: f64, dir: &Path) -> Result<Report> {
    std::fs::create_dir_all(dir)?;
    for t in tpch::TABLES {
        let (schema, parts) = tpch::generate(t, sf, 2, &|_| {})?;
        let table = Table {
            name: t,
            schema,
            batches: parts.into_iter().flatten().collect(),
        };
        write_parquet(dir, &table)?;
    }
    let sessions = Sessions::new();
    sessions.register_parquet(dir, &tpch::TABLES).await?;
    let (create, queries) = tpch_suite();
    let create: Vec<String> = create
        .into_iter()
        .map(|c| c.replacen("CREATE INDEX ", "CREATE INDEX IF NOT EXISTS ", 1))
        .collect();
    sessions.in_mphf_sessions(&create).await?;
    let mut report = Report::default();
    let mut rng = Rng::new(22);
    let lines = run_queries(&sessions, "tpch", &queries, &mut rng, &mut report).await;
    write_lines(&dir.join("queries.jsonl"), &lines)?;
    Ok(report)
}

/// The index statements and the 22 queries of `sql-tests/tpch_queries.slt`.
pub fn tpch_suite() -> (Vec<String>, Vec<Query>) {
    const SLT: &str = include_str!("../../../sql-tests/tpch_queries.slt");
    let mut create = Vec::new();
    let mut queries = Vec::new();
    let mut lines = SLT.lines().peekable();
    while let Some(line) = lines.next() {
        if line.starts_with("CREATE INDEX") {
            create.push(line.to_string());
        } else if line.starts_with("query ") {
            let mut sql = Vec::new();
            while let Some(l) = lines.next_if(|l| *l != "----") {
                sql.push(l);
            }
            queries.push(Query {
                sql: sql.join("\n"),
                ordered: false,
                duckdb: true,
            });
        }
    }
    (create, queries)
}

fn write_lines(path: &Path, lines: &[String]) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for l in lines {
        writeln!(f, "{l}")?;
    }
    f.flush()?;
    Ok(())
}

/// Runs `mphf difftest`: prints every failure and a summary; fails when any query failed.
///
/// # Errors
/// A failed query, or the run itself failing.
pub async fn run(args: DifftestArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let report = match args.tpch_sf {
        Some(sf) => run_tpch(sf, &args.dir).await?,
        None => run_generated(args.seed, args.queries, args.source, Some(&args.dir)).await?,
    };
    for f in report.reference_errors.iter().chain(&report.failures) {
        println!("FAILED {f}");
    }
    let failed = report.failures.len() + report.reference_errors.len();
    println!(
        "difftest: {} passed, {failed} failed ({} query runs, {:.1} s; results in {})",
        report.queries - failed.min(report.queries),
        report.queries,
        started.elapsed().as_secs_f64(),
        args.dir.join("queries.jsonl").display()
    );
    if failed > 0 {
        anyhow::bail!("{failed} of {} queries failed", report.queries);
    }
    Ok(())
}
