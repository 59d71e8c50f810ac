//! `mphf bench sparse`: GROUP BY, JOIN and DISTINCT on sparse, unclustered keys (random 64-bit
//! ids and UUID-like session strings), in a vanilla DataFusion session and an MPHF session of one
//! process, over in-memory tables and over Parquet files; rows checked equal, medians compared.
//!
//! Why: TPC-H's keys are dense integers in a narrow range and clustered in table order, which is
//! the MPHF operators' best case (dense-key tables, runs of equal keys). Real event data has
//! random ids and string keys in arrival order; this benchmark measures that case and shows
//! where the costing leaves it to DataFusion's hash tables.
//!
//! Data (generated in memory, a pure function of `--rows`, `--distinct` and `--seed`, with
//! [`mix64`] as the random source, so every run and every batch size gives the same rows):
//! - `events` (`--rows` rows): `id` Int64, one of `--distinct` distinct random 63-bit values
//!   drawn at random per row (unclustered); `session` Utf8, an 8-4-4-4-12 hex string, one of as
//!   many distinct values, drawn independently of `id`; `amount` Int64 in `0..100_000` (an
//!   integer, so sums and averages are exact in any summation order and the rows compare
//!   exactly); `qty` Int32 in `0..50`;
//! - `dims`: one row per distinct id (`id` unique), `category` Utf8 (20 values), `flag` Boolean
//!   (about a quarter true).
//!
//! Invariants: the distinct ids are distinct by construction (duplicates of the random source
//! are skipped), and distinct session numbers give distinct strings (the first 64 bits of a
//! string are a bijection of its number). Each mode's two sessions read the same tables; the MPHF
//! session has indexes on `events.id`, `events.session` and `dims.id`. Parquet mode writes
//! `DIR/events/part-NN.parquet` (at least two files when there are at least two batches, several
//! row groups each), `DIR/dims/part-00.parquet` and `DIR/queries.json` (the queries' labels and
//! SQL, which `benches/duckdb_sparse.py` runs in DuckDB, so the SQL cannot drift); a rerun
//! replaces its own `part-*.parquet` files and saved indexes there, so `CREATE INDEX` always
//! builds. A `--parquet` folder is kept; the default one, under the system's temporary folder,
//! is removed at the end.
//! Any query whose rows differ between the sessions fails the command.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ::datafusion::arrow::array::{ArrayRef, BooleanArray, Int32Array, Int64Array, RecordBatch, StringBuilder};
use ::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use ::datafusion::datasource::MemTable;
use ::datafusion::prelude::SessionConfig;
use anyhow::{bail, Context as _, Result};
use clap::{Args, ValueEnum};
use rayon::prelude::*;
use serde_json::{json, Value};

use super::allocator::purge_freed_memory_at_once;
use super::bench_tables::{parquet_sessions, sessions, split, write_table, Sessions, TempDir};
use super::demo::{apply_tuning, mphf_operators, rows_of, tuned};
use super::timing::time_both;
use crate::core::hash::mix64;
use crate::datafusion::plan::tuning::Tuning;
use crate::datafusion::MphfContext;

/// Arguments of `mphf bench sparse`.
#[derive(Args, Debug, Clone)]
pub struct BenchSparseArgs {
    /// Rows of the `events` table.
    #[arg(long, default_value_t = 30_000_000)]
    pub rows: u64,
    /// Distinct ids (and distinct sessions) in `events`; rows of `dims` (default: rows / 10).
    #[arg(long)]
    pub distinct: Option<u64>,
    /// Folder for the Parquet files (kept; default: a temporary folder, removed at the end).
    #[arg(long)]
    pub parquet: Option<PathBuf>,
    /// Which storage modes to run.
    #[arg(long, value_enum, default_value_t = Modes::Both)]
    pub mode: Modes,
    /// Runs per query and session (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Target partitions of every session (default: available cores).
    #[arg(long)]
    pub partitions: Option<usize>,
    /// Seed of the generated data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print the result table as Markdown.
    #[arg(long)]
    pub markdown: bool,
    /// Run only the queries whose label contains this text (case-insensitive; repeatable: any
    /// of them).
    #[arg(long)]
    pub only: Vec<String>,
    /// Write the settings, queries (label and SQL), index build times and medians as JSON
    /// (what `benches/duckdb_sparse.py --json` compares with DuckDB).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Run both sessions on in-memory clusters of N datafusion-distributed workers in this
    /// process (vanilla distributed against MPHF distributed), over the Parquet files only:
    /// in-memory tables cannot reach a worker in another process. 0: no cluster.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// `NAME=VALUE`: one of the planner's thresholds (`Tuning`, not a setting) changed in the
    /// MPHF sessions (repeatable), e.g. `--tune join_partitioned_max_partitions=0`.
    #[arg(long = "tune", value_name = "NAME=VALUE")]
    pub tune: Vec<String>,
}

/// The storage modes of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Modes {
    /// In-memory tables (`MemTable`).
    Memory,
    /// Parquet files (`register_parquet`: the reads count in the times).
    Parquet,
    /// Both, in-memory first.
    Both,
}

/// (label, SQL): one query, the same text in both sessions and in DuckDB.
type Query = (&'static str, &'static str);

/// The queries of `mphf bench sparse`.
const QUERIES: &[Query] = &[
    (
        "GROUP BY id",
        "SELECT id, count(*), sum(amount) FROM events GROUP BY id",
    ),
    (
        "GROUP BY session",
        "SELECT session, count(*) FROM events GROUP BY session",
    ),
    (
        "GROUP BY id avg/max",
        "SELECT id, avg(amount), max(qty) FROM events GROUP BY id",
    ),
    (
        "filter, GROUP BY id",
        "SELECT id, count(*), sum(amount) FROM events WHERE qty < 5 GROUP BY id",
    ),
    (
        "join, GROUP BY category",
        "SELECT category, count(*), sum(amount) FROM events JOIN dims ON events.id = dims.id GROUP BY category",
    ),
    (
        "join, filter flag",
        "SELECT count(*), sum(events.amount) FROM events JOIN dims ON events.id = dims.id WHERE dims.flag",
    ),
    (
        "semi join (IN)",
        "SELECT count(*), sum(amount) FROM events WHERE id IN (SELECT id FROM dims WHERE flag)",
    ),
    ("count(DISTINCT id)", "SELECT count(DISTINCT id) FROM events"),
    ("count(DISTINCT session)", "SELECT count(DISTINCT session) FROM events"),
];

/// The indexes of the MPHF session: (name, table, column).
const INDEXES: &[(&str, &str, &str)] = &[
    ("ev_id", "events", "id"),
    ("ev_session", "events", "session"),
    ("dims_id", "dims", "id"),
];

/// Row count from which freed memory goes back to the OS at once (as `mphf demo` at SF ≥ 5).
const LARGE_ROWS: u64 = 50_000_000;

/// Values of `dims.category`.
const CATEGORIES: usize = 20;

/// Multiplier of the row number before mixing (odd: a bijection on `u64`).
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The independent random streams of the generator (xored into the mixed row number).
mod stream {
    pub const ID_VALUES: u64 = 0x1d5b_2c0e_94f1_a3a7;
    pub const EVENT_ID: u64 = 0x6a09_e667_f3bc_c908;
    pub const EVENT_SESSION: u64 = 0xbb67_ae85_84ca_a73b;
    pub const EVENT_MEASURES: u64 = 0x3c6e_f372_fe94_f82b;
    pub const SESSION_HI: u64 = 0xa54f_f53a_5f1d_36f1;
    pub const SESSION_LO: u64 = 0x510e_527f_ade6_82d1;
    pub const DIM_ATTRS: u64 = 0x9b05_688c_2b3e_6c1f;
}

/// The deterministic random source: 64 random bits for item `i` of a stream.
#[derive(Clone, Copy, Debug)]
struct Rng {
    seed: u64,
}

impl Rng {
    fn new(seed: u64) -> Self {
        Self {
            seed: mix64(seed ^ 0x2545_f491_4f6c_dd1d),
        }
    }
    fn bits(self, stream: u64, i: u64) -> u64 {
        mix64(i.wrapping_mul(GOLDEN) ^ stream ^ self.seed)
    }
}

/// The settings of one generated data set.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Rows of `events`.
    pub rows: u64,
    /// Distinct ids and distinct sessions (rows of `dims`).
    pub distinct: u64,
    /// Seed of the generator.
    pub seed: u64,
    /// Rows per generated batch.
    pub batch_rows: usize,
}

impl Shape {
    /// Checks `rows` and `distinct` (default rows / 10, at least 1).
    ///
    /// # Errors
    /// Zero rows, zero distinct values, more distinct values than rows, or a zero batch size.
    pub fn new(rows: u64, distinct: Option<u64>, seed: u64, batch_rows: usize) -> Result<Self> {
        if rows == 0 {
            bail!("--rows must be at least 1");
        }
        let distinct = distinct.unwrap_or((rows / 10).max(1));
        if distinct == 0 {
            bail!("--distinct must be at least 1");
        }
        if distinct > rows {
            bail!("--distinct ({distinct}) must not exceed --rows ({rows})");
        }
        if batch_rows == 0 {
            bail!("the batch size must be at least 1");
        }
        Ok(Self {
            rows,
            distinct,
            seed,
            batch_rows,
        })
    }
}

/// The generated tables, as batches.
pub struct Data {
    events: (SchemaRef, Vec<RecordBatch>),
    dims: (SchemaRef, Vec<RecordBatch>),
}

fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("session", DataType::Utf8, false),
        Field::new("amount", DataType::Int64, false),
        Field::new("qty", DataType::Int32, false),
    ]))
}

fn dims_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("category", DataType::Utf8, false),
        Field::new("flag", DataType::Boolean, false),
    ]))
}

/// `n` distinct random 63-bit ids, in the order the random source gives them.
fn distinct_ids(rng: Rng, n: usize) -> Vec<i64> {
    let mut seen = HashSet::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    let mut k = 0u64;
    while ids.len() < n {
        let id = (rng.bits(stream::ID_VALUES, k) >> 1) as i64;
        k += 1;
        if seen.insert(id) {
            ids.push(id);
        }
    }
    ids
}

/// Writes session number `s` as a UUID-like 8-4-4-4-12 hex string into `out`.
fn session_text(rng: Rng, s: u64, out: &mut [u8; 36]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // The first 64 bits are a bijection of `s`: distinct sessions never share a string.
    let bits = ((rng.bits(stream::SESSION_HI, s) as u128) << 64) | rng.bits(stream::SESSION_LO, s) as u128;
    let mut nibble = 0;
    for (pos, byte) in out.iter_mut().enumerate() {
        if matches!(pos, 8 | 13 | 18 | 23) {
            *byte = b'-';
        } else {
            *byte = HEX[((bits >> (124 - 4 * nibble)) & 0xf) as usize];
            nibble += 1;
        }
    }
}

/// Rows `start..start + len` of `events`.
fn events_batch(rng: Rng, ids: &[i64], start: u64, len: usize) -> Result<RecordBatch> {
    let d = ids.len() as u64;
    let (mut id, mut amount, mut qty) = (
        Vec::with_capacity(len),
        Vec::with_capacity(len),
        Vec::with_capacity(len),
    );
    let mut session = StringBuilder::with_capacity(len, len * 36);
    let mut text = [0u8; 36];
    for i in start..start + len as u64 {
        id.push(ids[(rng.bits(stream::EVENT_ID, i) % d) as usize]);
        session_text(rng, rng.bits(stream::EVENT_SESSION, i) % d, &mut text);
        session.append_value(std::str::from_utf8(&text)?);
        let m = rng.bits(stream::EVENT_MEASURES, i);
        amount.push((m % 100_000) as i64);
        qty.push(((m >> 32) % 50) as i32);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(id)),
        Arc::new(session.finish()),
        Arc::new(Int64Array::from(amount)),
        Arc::new(Int32Array::from(qty)),
    ];
    Ok(RecordBatch::try_new(events_schema(), columns)?)
}

/// Rows `start..start + len` of `dims` (row `k` describes `ids[k]`).
fn dims_batch(rng: Rng, ids: &[i64], start: usize, len: usize) -> Result<RecordBatch> {
    let mut category = StringBuilder::with_capacity(len, len * 6);
    let mut flag = Vec::with_capacity(len);
    for k in start..start + len {
        let a = rng.bits(stream::DIM_ATTRS, k as u64);
        category.append_value(format!("cat_{:02}", a % CATEGORIES as u64));
        flag.push((a >> 32).is_multiple_of(4));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids[start..start + len].to_vec())),
        Arc::new(category.finish()),
        Arc::new(BooleanArray::from(flag)),
    ];
    Ok(RecordBatch::try_new(dims_schema(), columns)?)
}

/// Batch starts and lengths covering `0..rows`.
fn chunks(rows: u64, batch_rows: usize) -> Vec<(u64, usize)> {
    (0..rows.div_ceil(batch_rows as u64))
        .map(|b| {
            let start = b * batch_rows as u64;
            (start, (rows - start).min(batch_rows as u64) as usize)
        })
        .collect()
}

/// Generates both tables (in parallel, batch by batch; the rows do not depend on it).
///
/// # Errors
/// Arrow errors; an id count that does not fit this machine's `usize`.
pub fn generate(shape: Shape) -> Result<Data> {
    let rng = Rng::new(shape.seed);
    let d = usize::try_from(shape.distinct).context("--distinct is too large for this machine")?;
    let ids = distinct_ids(rng, d);
    let events = chunks(shape.rows, shape.batch_rows)
        .into_par_iter()
        .map(|(start, len)| events_batch(rng, &ids, start, len))
        .collect::<Result<Vec<_>>>()?;
    let dims = chunks(shape.distinct, shape.batch_rows)
        .into_par_iter()
        .map(|(start, len)| dims_batch(rng, &ids, start as usize, len))
        .collect::<Result<Vec<_>>>()?;
    Ok(Data {
        events: (events_schema(), events),
        dims: (dims_schema(), dims),
    })
}

/// Both sessions over in-memory tables (one `MemTable` per table, shared by the sessions).
fn memory_sessions(config: &SessionConfig, data: &Data) -> Result<Sessions> {
    let parts = config.target_partitions();
    let s = sessions(config, 0)?;
    for (name, (schema, batches)) in [("events", &data.events), ("dims", &data.dims)] {
        let mem = Arc::new(MemTable::try_new(Arc::clone(schema), split(batches, parts))?);
        s.vanilla.register_table(name, Arc::clone(&mem) as _)?;
        s.mphf.ctx().register_table(name, mem)?;
    }
    Ok(s)
}

/// Removes the saved indexes a previous run left for `table` (`_mphf/<table>.<column>.mphf` of
/// [`INDEXES`], nothing else): they are stale once the files are rewritten, and the MPHF session
/// would rebuild them at registration, before the timed `CREATE INDEX`.
fn remove_old_indexes(folder: &Path, table: &str) -> Result<()> {
    let saved = folder.join("_mphf");
    for (_, _, col) in INDEXES.iter().filter(|(_, t, _)| *t == table) {
        let path = saved.join(format!("{table}.{col}.mphf"));
        match std::fs::remove_file(&path) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(err).with_context(|| format!("removing {}", path.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The query list as JSON (what `benches/duckdb_sparse.py` runs).
fn queries_json(queries: &[&Query]) -> Value {
    Value::Array(
        queries
            .iter()
            .map(|(label, sql)| json!({ "label": label, "sql": sql }))
            .collect(),
    )
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Writes both tables and `queries.json` under `dir`.
fn write_parquet(dir: &Path, data: &Data, parts: usize, queries: &[&Query]) -> Result<()> {
    let t = Instant::now();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, table, files) in [("events", &data.events, parts.max(2)), ("dims", &data.dims, 1)] {
        let folder = dir.join(name);
        remove_old_indexes(&folder, name)?;
        write_table(&folder, table, files)?;
    }
    write_json(
        &dir.join("queries.json"),
        &json!({ "tables": { "events": "events", "dims": "dims" }, "queries": queries_json(queries) }),
    )?;
    eprintln!(
        "Parquet written to {} in {:.1} s",
        dir.display(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Creates the MPHF session's indexes on `tables` (a subset of [`INDEXES`]'s); returns each
/// index's name and build time (ms), also printed.
async fn create_indexes(mphf: &MphfContext, mode: &str, tables: &[&str]) -> Result<Vec<(String, f64)>> {
    let mut times = Vec::new();
    for (name, table, col) in INDEXES.iter().filter(|(_, t, _)| tables.contains(t)) {
        let t = Instant::now();
        mphf.sql(&format!("CREATE INDEX {name} ON {table} USING mphf ({col})"))
            .await?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        println!("{mode}: CREATE INDEX {name} ON {table} ({col}): {ms:.0} ms");
        times.push(((*name).to_string(), ms));
    }
    Ok(times)
}

/// One query's result in one mode.
#[derive(Debug, Clone)]
struct Outcome {
    mode: &'static str,
    label: &'static str,
    vanilla_ms: f64,
    mphf_ms: f64,
    operators: String,
    rows_equal: bool,
    result_rows: usize,
}

impl Outcome {
    fn speedup(&self) -> f64 {
        self.vanilla_ms / self.mphf_ms
    }
    fn json(&self) -> Value {
        json!({
            "mode": self.mode, "label": self.label, "vanilla_ms": self.vanilla_ms,
            "mphf_ms": self.mphf_ms, "speedup": self.speedup(), "operators": self.operators,
            "rows_equal": self.rows_equal, "result_rows": self.result_rows,
        })
    }
}

/// Runs `query` in both sessions `runs` times; compares the last results' rows.
async fn run_query(s: &Sessions, mode: &'static str, &(label, sql): &Query, runs: usize) -> Result<Outcome> {
    let [(vanilla_ms, bv), (mphf_ms, bm)] = time_both(
        async || Ok(s.vanilla.sql(sql).await?.collect().await?),
        async || Ok(s.mphf.sql(sql).await?.collect().await?),
        runs,
    )
    .await
    .with_context(|| format!("{mode}: {label}: {sql}"))?;
    let (rv, rm) = (rows_of(&bv)?, rows_of(&bm)?);
    if rv != rm {
        eprintln!(
            "MISMATCH in {mode} {label}: vanilla {} rows, mphf {} rows",
            rv.len(),
            rm.len()
        );
    }
    Ok(Outcome {
        mode,
        label,
        vanilla_ms,
        mphf_ms,
        operators: mphf_operators(&s.mphf, sql).await?,
        rows_equal: rv == rm,
        result_rows: rv.len(),
    })
}

/// Prints the table header (text or Markdown).
fn print_header(markdown: bool) {
    if markdown {
        println!("| mode | query | vanilla ms | mphf ms | speed-up | operators | rows equal |");
        println!("|---|---|---|---|---|---|---|");
    } else {
        println!(
            "{:<8} {:<24} {:>11} {:>11} {:>9}  {:<9} rows equal",
            "mode", "query (median ms)", "vanilla", "mphf", "speed-up", "operators"
        );
    }
}

/// Prints one row of the table.
fn print_row(o: &Outcome, markdown: bool) {
    let same = if o.rows_equal { "yes" } else { "NO" };
    if markdown {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.2}× | {} | {same} |",
            o.mode,
            o.label,
            o.vanilla_ms,
            o.mphf_ms,
            o.speedup(),
            o.operators
        );
    } else {
        println!(
            "{:<8} {:<24} {:>11.1} {:>11.1} {:>8.2}x  {:<9} {same}",
            o.mode,
            o.label,
            o.vanilla_ms,
            o.mphf_ms,
            o.speedup(),
            o.operators
        );
    }
}

/// The queries selected by `--only` (all without it).
fn selected(only: &[String]) -> Vec<&'static Query> {
    let only: Vec<String> = only.iter().map(|o| o.to_lowercase()).collect();
    QUERIES
        .iter()
        .filter(|(label, _)| only.is_empty() || only.iter().any(|o| label.to_lowercase().contains(o)))
        .collect()
}

/// Target partitions: `--partitions` (1..=1024) or the available cores.
fn partitions(requested: Option<usize>) -> Result<usize> {
    super::check_threads(requested).map_err(|_| {
        anyhow::anyhow!(
            "--partitions must be between 1 and {}, got {}",
            super::MAX_THREADS,
            requested.unwrap_or_default()
        )
    })?;
    Ok(requested.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())))
}

/// Runs one mode: indexes, then every query (rows printed as they finish).
async fn run_mode(
    s: &Sessions,
    mode: &'static str,
    queries: &[&'static Query],
    args: &BenchSparseArgs,
    builds: &mut Vec<Value>,
) -> Result<Vec<Outcome>> {
    for (name, ms) in create_indexes(&s.mphf, mode, &["events", "dims"]).await? {
        builds.push(json!({ "mode": mode, "index": name, "ms": ms }));
    }
    apply_tuning(&s.mphf, &args.tune)?;
    print_header(args.markdown);
    let mut outcomes = Vec::new();
    for q in queries {
        let o = run_query(s, mode, q, args.runs).await?;
        print_row(&o, args.markdown);
        outcomes.push(o);
    }
    Ok(outcomes)
}

/// Runs `mphf bench sparse`.
///
/// # Errors
/// Invalid arguments, generation, Parquet, index and query errors; rows that differ between
/// the sessions.
pub async fn run(args: BenchSparseArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let parts = partitions(args.partitions)?;
    tuned(Tuning::default(), &args.tune)?;
    let config = SessionConfig::new().with_target_partitions(parts);
    let shape = Shape::new(args.rows, args.distinct, args.seed, config.batch_size())?;
    let queries = selected(&args.only);
    if queries.is_empty() {
        bail!(
            "--only matches no query (labels: {})",
            QUERIES.iter().map(|q| q.0).collect::<Vec<_>>().join(", ")
        );
    }
    if shape.rows >= LARGE_ROWS {
        purge_freed_memory_at_once();
    }
    let t = Instant::now();
    let data = generate(shape)?;
    eprintln!(
        "generated events ({} rows, {} distinct ids and sessions) and dims in {:.1} s ({parts} partitions)",
        shape.rows,
        shape.distinct,
        t.elapsed().as_secs_f64()
    );
    if args.workers > 0 && args.mode == Modes::Memory {
        bail!(
            "--workers runs over the Parquet files only (in-memory tables cannot reach a worker); drop --mode memory"
        );
    }
    if args.workers > 0 && args.mode == Modes::Both {
        eprintln!(
            "--workers {}: the Parquet mode only (in-memory tables cannot reach a worker)",
            args.workers
        );
    }
    let wants_parquet = args.mode != Modes::Memory;
    let (dir, _temp) = match &args.parquet {
        Some(dir) => (dir.clone(), None),
        None => {
            let dir = std::env::temp_dir().join(format!("mphf-bench-sparse-{}", std::process::id()));
            (dir.clone(), wants_parquet.then(|| TempDir(dir)))
        }
    };
    if wants_parquet {
        write_parquet(&dir, &data, parts, &queries)?;
    }
    let mut outcomes = Vec::new();
    let mut builds = Vec::new();
    if args.mode != Modes::Parquet && args.workers == 0 {
        let s = memory_sessions(&config, &data)?;
        outcomes.extend(run_mode(&s, "memory", &queries, &args, &mut builds).await?);
    }
    drop(data);
    if wants_parquet {
        let s = parquet_sessions(&config, &dir, &["events", "dims"], args.workers).await?;
        outcomes.extend(run_mode(&s, "parquet", &queries, &args, &mut builds).await?);
    }
    if let Some(path) = &args.json {
        let report = json!({
            "rows": shape.rows, "distinct": shape.distinct, "seed": shape.seed,
            "partitions": parts, "runs": args.runs, "workers": args.workers,
            "parquet_dir": if args.parquet.is_some() { json!(dir) } else { Value::Null },
            "queries": queries_json(&queries), "index_builds": builds,
            "results": outcomes.iter().map(Outcome::json).collect::<Vec<_>>(),
        });
        write_json(path, &report)?;
    }
    let mismatches: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.rows_equal)
        .map(|o| format!("{} {}", o.mode, o.label))
        .collect();
    if !mismatches.is_empty() {
        bail!("rows differ with and without MPHF in: {}", mismatches.join(", "));
    }
    Ok(())
}

/// Rows of `mphf demo`'s sparse case.
const DEMO_ROWS: u64 = 2_000_000;

/// `mphf demo`'s last line: GROUP BY id and GROUP BY session on 2M unclustered in-memory rows.
///
/// # Errors
/// Generation, index and query errors; rows that differ between the sessions.
pub async fn demo_line(parts: usize, runs: usize) -> Result<()> {
    let config = SessionConfig::new().with_target_partitions(parts);
    let shape = Shape::new(DEMO_ROWS, None, 0, config.batch_size())?;
    let data = generate(shape)?;
    let s = memory_sessions(&config, &data)?;
    for (name, table, col) in INDEXES.iter().filter(|(_, t, _)| *t == "events") {
        s.mphf
            .sql(&format!("CREATE INDEX {name} ON {table} USING mphf ({col})"))
            .await?;
    }
    let mut parts_text = Vec::new();
    for q in QUERIES.iter().take(2) {
        let o = run_query(&s, "memory", q, runs).await?;
        if !o.rows_equal {
            bail!("rows differ with and without MPHF in the sparse {}", o.label);
        }
        parts_text.push(format!(
            "{} {:.2}× ({:.0} / {:.0} ms, {})",
            o.label,
            o.speedup(),
            o.vanilla_ms,
            o.mphf_ms,
            o.operators
        ));
    }
    println!(
        "sparse keys ({} rows, {} random ids / sessions, unclustered; `mphf bench sparse`): {}; rows equal",
        shape.rows,
        shape.distinct,
        parts_text.join(", ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_rejects_bad_counts() {
        assert!(Shape::new(0, None, 0, 8192).is_err());
        assert!(Shape::new(10, Some(0), 0, 8192).is_err());
        assert!(Shape::new(10, Some(11), 0, 8192).is_err());
        assert_eq!(Shape::new(5, None, 0, 8192).unwrap().distinct, 1);
    }

    #[test]
    fn data_does_not_depend_on_batch_size() {
        let a = generate(Shape::new(1000, Some(70), 3, 64).unwrap()).unwrap();
        let b = generate(Shape::new(1000, Some(70), 3, 1000).unwrap()).unwrap();
        let rows = |d: &Data| (rows_of(&d.events.1).unwrap(), rows_of(&d.dims.1).unwrap());
        assert_eq!(rows(&a), rows(&b));
    }

    #[test]
    fn ids_and_sessions_are_distinct() {
        let rng = Rng::new(7);
        let ids = distinct_ids(rng, 5000);
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 5000);
        assert!(ids.iter().all(|&id| id >= 0));
        let mut texts = HashSet::new();
        let mut buf = [0u8; 36];
        for s in 0..5000 {
            session_text(rng, s, &mut buf);
            texts.insert(buf);
        }
        assert_eq!(texts.len(), 5000);
        assert_eq!(buf.iter().filter(|&&b| b == b'-').count(), 4);
    }
}
