//! `mphf calibrate`: measures the cost model's CPU constants on this machine and writes them in
//! the form `MphfContext::load_costs` and `--costs FILE` read.
//!
//! Everything runs on one thread (a one-partition session, a one-thread rayon pool), so each
//! figure is one core's nanoseconds per row, as the model's constants are. Each figure is the
//! median of `--runs` timings after one warm-up run:
//! - lookups: `ColumnIndex::lookup_slots` over a probe of random member keys, per strategy
//!   (dense table, decoded MPHF, compact MPHF) and key kind, and the row-slot copy;
//! - hash aggregation and hash join: vanilla DataFusion on generated in-memory tables, with
//!   join reordering off so that the dimension table is the build side; a join is timed with
//!   the whole fact table and with 1000 of its rows as the probe side, which separates the
//!   per-build-row cost from the per-probe-row cost;
//! - our operators: the same queries with `mphf.costing = always`, less the lookups measured
//!   above.
//!
//! Not measured (kept at their defaults, and said so in the file): the slot-array entry costs
//! and the cache size, which need a multi-core run to mean anything, and the GPU figures.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{Field, Schema};
use clap::Args;
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use std::sync::Arc;

use super::difftest::tables::Rng;
use crate::core::column::{ColumnIndex, IndexOptions};
use crate::datafusion::plan::CostModel;
use crate::datafusion::MphfContext;

/// Arguments of `mphf calibrate`.
#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Rows of the generated fact table.
    #[arg(long, default_value_t = 2_000_000)]
    pub rows: usize,
    /// Distinct keys (rows of the dimension table, slots of the indexes).
    #[arg(long, default_value_t = 200_000)]
    pub keys: usize,
    /// Timed runs per figure (the median is kept).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Write the constants here (default: print them only).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Probe rows of the join that times the build side alone.
const FEW_PROBE_ROWS: usize = 1000;

/// Median seconds of `runs` calls of `f`, after one warm-up call.
fn median_secs(runs: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        f()?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The generated data: `keys` distinct keys (dense integers, sparse integers, strings) and a
/// fact column of `rows` random members of each.
struct Data {
    dense_keys: ArrayRef,
    sparse_keys: ArrayRef,
    string_keys: ArrayRef,
    dense_rows: ArrayRef,
    sparse_rows: ArrayRef,
    string_rows: ArrayRef,
    values: ArrayRef,
}

impl Data {
    fn new(rows: usize, keys: usize) -> Self {
        let mut mix = Rng::new(0x5EED);
        let sparse: Vec<i64> = (0..keys).map(|_| (mix.next_u64() >> 1) as i64).collect();
        let strings: Vec<String> = sparse.iter().map(|k| format!("session-{k:016x}")).collect();
        let picks: Vec<usize> = (0..rows).map(|_| (mix.next_u64() % keys as u64) as usize).collect();
        Self {
            dense_keys: Arc::new(Int64Array::from_iter_values(0..keys as i64)),
            sparse_keys: Arc::new(Int64Array::from(sparse.clone())),
            string_keys: Arc::new(StringArray::from_iter_values(&strings)),
            dense_rows: Arc::new(Int64Array::from_iter_values(picks.iter().map(|&p| p as i64))),
            sparse_rows: Arc::new(Int64Array::from_iter_values(picks.iter().map(|&p| sparse[p]))),
            string_rows: Arc::new(StringArray::from_iter_values(picks.iter().map(|&p| &strings[p]))),
            values: Arc::new(Int64Array::from_iter_values((0..rows as i64).map(|v| v % 1000))),
        }
    }
}

/// Nanoseconds per probe row of `index.lookup_slots(probe)` on one thread.
fn lookup_ns(index: &ColumnIndex, probe: &ArrayRef, runs: usize) -> anyhow::Result<f64> {
    let mut out = Vec::new();
    let secs = median_secs(runs, || {
        index.lookup_slots(probe.as_ref(), &mut out)?;
        Ok(())
    })?;
    Ok(secs * 1e9 / probe.len() as f64)
}

/// An in-memory table of `columns`, in 8192-row batches.
fn table(columns: &[(&str, &ArrayRef)]) -> anyhow::Result<Arc<MemTable>> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), false))
            .collect::<Vec<_>>(),
    ));
    let rows = columns[0].1.len();
    let batches = (0..rows)
        .step_by(8192)
        .map(|start| {
            let len = 8192.min(rows - start);
            RecordBatch::try_new(
                Arc::clone(&schema),
                columns.iter().map(|(_, a)| a.slice(start, len)).collect(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(MemTable::try_new(schema, vec![batches])?))
}

/// The same tables in a vanilla and an MPHF session, both on one partition.
struct Sessions {
    vanilla: SessionContext,
    mphf: MphfContext,
}

impl Sessions {
    async fn new(data: &Data) -> anyhow::Result<Self> {
        let config = SessionConfig::new().with_target_partitions(1);
        let vanilla = SessionContext::new_with_config(config.clone());
        let mphf = MphfContext::with_config(config);
        let rows = data.values.len();
        let few = |a: &ArrayRef| a.slice(0, FEW_PROBE_ROWS.min(rows));
        let tables = [
            (
                "fact",
                table(&[
                    ("dk", &data.dense_rows),
                    ("sk", &data.sparse_rows),
                    ("s", &data.string_rows),
                    ("v", &data.values),
                ])?,
            ),
            (
                "few",
                table(&[("sk", &few(&data.sparse_rows)), ("s", &few(&data.string_rows))])?,
            ),
            (
                "dim",
                table(&[
                    ("dk", &data.dense_keys),
                    ("sk", &data.sparse_keys),
                    ("s", &data.string_keys),
                ])?,
            ),
        ];
        for (name, t) in tables {
            vanilla.register_table(name, Arc::clone(&t) as _)?;
            mphf.ctx().register_table(name, t as _)?;
        }
        // The dimension table, written first, stays the build side.
        vanilla.sql("SET datafusion.optimizer.join_reordering = false").await?;
        mphf.sql("SET datafusion.optimizer.join_reordering = false").await?;
        mphf.sql("SET mphf.costing = 'always'").await?;
        mphf.sql("SET mphf.verbose = false").await?;
        for sql in [
            "CREATE INDEX fact_dk ON fact USING mphf (dk)",
            "CREATE INDEX fact_s ON fact USING mphf (s)",
            "CREATE INDEX dim_dk ON dim USING mphf (dk)",
            "CREATE INDEX dim_s ON dim USING mphf (s)",
        ] {
            mphf.sql(sql).await?;
        }
        Ok(Self { vanilla, mphf })
    }

    /// Median seconds of `sql` in vanilla DataFusion.
    async fn vanilla_secs(&self, sql: &str, runs: usize) -> anyhow::Result<f64> {
        let df = self.vanilla.sql(sql).await?;
        timed(runs, || df.clone().collect()).await
    }

    /// Median seconds of `sql` in the MPHF session; fails when no MPHF operator runs it.
    async fn mphf_secs(&self, sql: &str, runs: usize) -> anyhow::Result<f64> {
        let df = self.mphf.sql(sql).await?;
        let plan = df.clone().create_physical_plan().await?;
        let text = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(false)
            .to_string();
        if !text.contains("MphfAggregateExec") && !text.contains("MphfJoinExec") {
            bail!("no MPHF operator ran {sql}:\n{text}");
        }
        timed(runs, || df.clone().collect()).await
    }
}

/// Median seconds of `runs` awaits of `run()`, after one warm-up.
async fn timed<F, Fut, T>(runs: usize, mut run: F) -> anyhow::Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = datafusion::error::Result<T>>,
{
    run().await?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        run().await?;
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Runs `mphf calibrate`.
///
/// # Errors
/// Bad arguments, a failed query, or the output file cannot be written.
pub async fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    if args.keys < 1000 || args.rows < 2 * args.keys || args.rows > 1 << 31 {
        bail!(
            "--keys must be at least 1000 and --rows between 2 × keys and 2^31 (got {} keys, {} rows)",
            args.keys,
            args.rows
        );
    }
    let (rows, keys, runs) = (args.rows as f64, args.keys as f64, args.runs);
    eprintln!("generating {} rows over {} keys...", args.rows, args.keys);
    let data = Data::new(args.rows, args.keys);
    let mut model = CostModel::default();

    // Lookups, on one thread.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let opts = IndexOptions::default();
    pool.install(|| -> anyhow::Result<()> {
        let dense = ColumnIndex::build(&[Arc::clone(&data.dense_keys)], &opts)?.with_dense_lookup(16.0);
        model.lookup_dense_ns = lookup_ns(&dense, &data.dense_rows, runs)?;
        for (keys_col, probe, bytes) in [
            (&data.sparse_keys, &data.sparse_rows, false),
            (&data.string_keys, &data.string_rows, true),
        ] {
            let compact = ColumnIndex::build(&[Arc::clone(keys_col)], &opts)?;
            let compact_ns = lookup_ns(&compact, probe, runs)?;
            let flat = compact.with_flat_lookup();
            let flat_ns = lookup_ns(&flat, probe, runs)?;
            let copied = flat.with_row_slots(&[Arc::clone(probe)]);
            let copied_ns = lookup_ns(&copied, probe, runs)?;
            if bytes {
                (model.lookup_compact_bytes_ns, model.lookup_flat_bytes_ns) = (compact_ns, flat_ns);
            } else {
                (model.lookup_compact_fixed_ns, model.lookup_flat_fixed_ns) = (compact_ns, flat_ns);
                model.lookup_copied_ns = copied_ns;
            }
        }
        Ok(())
    })
    .context("timing lookups")?;

    // DataFusion's hash operators and ours, one partition.
    let sessions = Sessions::new(&data).await?;
    let per_row = |secs: f64, n: f64| secs * 1e9 / n;
    let agg_int = "SELECT dk, count(*) FROM fact GROUP BY dk";
    let agg_sum = "SELECT dk, count(*), sum(v) FROM fact GROUP BY dk";
    let agg_str = "SELECT s, count(*) FROM fact GROUP BY s";
    model.hash_aggregate_fixed_ns = per_row(sessions.vanilla_secs(agg_int, runs).await?, rows);
    model.hash_aggregate_bytes_ns = per_row(sessions.vanilla_secs(agg_str, runs).await?, rows);
    // `fact.dk` has a dense-key table: its lookups are the dense ones timed above.
    let slot_count = per_row(sessions.mphf_secs(agg_int, runs).await?, rows);
    let slot_sum = per_row(sessions.mphf_secs(agg_sum, runs).await?, rows);
    model.slot_row_ns = (slot_count - model.lookup_dense_ns).max(0.1);
    model.slot_value_ns = (slot_sum - slot_count).max(0.1);
    let few = FEW_PROBE_ROWS.min(args.rows) as f64;
    // Sparse integers: dense ones would take DataFusion's ArrayMap, not its hash table.
    for (key, bytes) in [("sk", false), ("s", true)] {
        let join = |t: &str| format!("SELECT count(*) FROM dim JOIN {t} ON dim.{key} = {t}.{key}");
        let full = sessions.vanilla_secs(&join("fact"), runs).await? * 1e9;
        let build_only = sessions.vanilla_secs(&join("few"), runs).await? * 1e9;
        let build = (build_only / keys).max(0.1);
        let probe = ((full - build_only) / (rows - few)).max(0.1);
        if bytes {
            (model.hash_probe_bytes_ns, model.hash_build_bytes_ns) = (probe, build);
            continue;
        }
        // The probe's table holds `keys` rows, partly in the core's cache: the per-row cost of
        // a table beyond it follows from the cached one (not measured).
        let missed = model.hash_table_missed_share(keys);
        let beyond = match missed > 0.0 {
            true => model.hash_probe_cached_ns + (probe - model.hash_probe_cached_ns).max(0.0) / missed,
            false => probe,
        };
        (model.hash_probe_fixed_ns, model.hash_build_fixed_ns) = (beyond, build);
        // The same join as a semi join: its probe gathers no pairs.
        let semi = |t: &str| format!("SELECT count(*) FROM {t} WHERE {t}.{key} IN (SELECT {key} FROM dim)");
        let semi_full = sessions.vanilla_secs(&semi("fact"), runs).await? * 1e9;
        let semi_build_only = sessions.vanilla_secs(&semi("few"), runs).await? * 1e9;
        let semi_probe = ((semi_full - semi_build_only) / (rows - few)).max(0.0);
        model.hash_probe_semi_share = (semi_probe / probe).clamp(0.05, 1.0);
    }
    // Ours on the dense key (dense-table lookups on both sides, timed above).
    let ours = sessions
        .mphf_secs("SELECT count(*) FROM dim JOIN fact ON dim.dk = fact.dk", runs)
        .await?
        * 1e9;
    model.slot_join_row_ns = (ours / (rows + keys) - model.lookup_dense_ns).max(0.1);

    let defaults = CostModel::default();
    println!("{:<26} {:>10} {:>10}", "constant (ns)", "default", "measured");
    for name in CostModel::names() {
        let (d, m) = (value_of(&defaults, name), value_of(&model, name));
        if d != m {
            println!("{name:<26} {d:>10.1} {m:>10.1}");
        }
    }
    let text = format!(
        "# mphf calibrate --rows {} --keys {} --runs {}: one core's ns per row on {} ({} cores)\n\
         # not measured (defaults): hash_probe_cached_ns, core_cache_bytes, slot_join_call_ns, slot_build_row_ns, slot_build_repeat_row_ns, slot_table_slot_ns, slot_probe_scattered_ns, slot_entry_ns, slot_entry_uncached_ns, slot_row_uncached_ns, slot_scatter_row_ns, cache_bytes, gpu_*\n{}",
        args.rows,
        args.keys,
        args.runs,
        std::env::consts::ARCH,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        model.to_text()
    );
    match &args.out {
        Some(path) => {
            let mut file = crate::atomic_file::AtomicFile::create(path)?;
            std::io::Write::write_all(&mut file, text.as_bytes())?;
            file.commit()?;
            eprintln!("wrote {}", path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// The value of constant `name` in `model` (through its text form, the one place names live).
fn value_of(model: &CostModel, name: &str) -> f64 {
    model
        .to_text()
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(" = ")?;
            (n == name).then(|| v.parse().ok()).flatten()
        })
        .unwrap_or(f64::NAN)
}
