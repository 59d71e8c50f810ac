//! `mphf demo`: the README's main job on embedded data. Generates TPC-H in memory, creates MPHF
//! indexes on `orders.o_orderkey`, `lineitem.l_orderkey`, `lineitem.l_suppkey`,
//! `lineitem.l_partkey` and the string key `customer.c_name`, shows their stats, then runs
//! GROUP BY / JOIN / membership queries written with `mphf_index` next to their vanilla
//! DataFusion twins, checks that both give the same rows, and prints times.
//!
//! Until the MPHF GROUP BY and JOIN operators land, the `mphf_index` queries run on DataFusion's
//! own operators (over dense UInt32 slots instead of the keys): the table shows what that costs
//! today and grows with the operator issues.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use ::datafusion::arrow::util::pretty::pretty_format_batches;
use ::datafusion::datasource::MemTable;
use ::datafusion::prelude::{SessionConfig, SessionContext};

use crate::datafusion::tpch::generate;
use crate::datafusion::MphfContext;

/// Arguments of `mphf demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// TPC-H scale factor of the in-memory data.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Target partitions of both sessions (default: available cores).
    #[arg(long)]
    pub partitions: Option<usize>,
    /// Runs per query (the minimum time is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
}

/// (label, MPHF query, vanilla twin).
const QUERIES: &[(&str, &str, &str)] = &[
    (
        "distinct orderkeys",
        "SELECT count(DISTINCT mphf_index(l_orderkey)), max(mphf_index(l_orderkey)) FROM lineitem",
        "SELECT count(DISTINCT l_orderkey), count(DISTINCT l_orderkey) - 1 FROM lineitem",
    ),
    (
        "GROUP BY l_orderkey",
        "SELECT count(*), sum(c), sum(q) FROM (SELECT count(*) c, sum(l_quantity) q FROM lineitem GROUP BY mphf_index(l_orderkey))",
        "SELECT count(*), sum(c), sum(q) FROM (SELECT count(*) c, sum(l_quantity) q FROM lineitem GROUP BY l_orderkey)",
    ),
    (
        "GROUP BY l_partkey",
        "SELECT count(*), sum(q) FROM (SELECT sum(l_quantity) q FROM lineitem GROUP BY mphf_index(l_partkey))",
        "SELECT count(*), sum(q) FROM (SELECT sum(l_quantity) q FROM lineitem GROUP BY l_partkey)",
    ),
    (
        "GROUP BY l_suppkey top 5",
        "SELECT min(l_suppkey) k, sum(l_extendedprice) r FROM lineitem GROUP BY mphf_index(l_suppkey) ORDER BY r DESC, k LIMIT 5",
        "SELECT l_suppkey k, sum(l_extendedprice) r FROM lineitem GROUP BY l_suppkey ORDER BY r DESC, k LIMIT 5",
    ),
    (
        "lineitem ⋈ orders",
        "SELECT count(*), sum(l_quantity) FROM lineitem JOIN orders ON mphf_index(l_orderkey) = mphf_index('li_ok', o_orderkey)",
        "SELECT count(*), sum(l_quantity) FROM lineitem JOIN orders ON l_orderkey = o_orderkey",
    ),
    (
        "orders with lineitems",
        "SELECT count(*) FROM orders WHERE mphf_index('li_ok', o_orderkey + 1) IS NOT NULL",
        "SELECT count(*) FROM orders WHERE o_orderkey + 1 IN (SELECT l_orderkey FROM lineitem)",
    ),
    (
        "GROUP BY c_name",
        "SELECT count(*), max(n) FROM (SELECT count(*) n FROM customer GROUP BY mphf_index(c_name))",
        "SELECT count(*), max(n) FROM (SELECT count(*) n FROM customer GROUP BY c_name)",
    ),
];

/// The rows of `batches` as sorted strings (order-insensitive comparison).
fn rows_of(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let fmts =
            b.columns().iter().map(|c| ArrayFormatter::try_new(c.as_ref(), &opts)).collect::<Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            rows.push(fmts.iter().map(|f| f.value(r).to_string()).collect::<Vec<_>>().join(" | "));
        }
    }
    rows.sort();
    Ok(rows)
}

/// Min time (ms) over `runs` and the rows of the last run.
async fn time_query(run: impl AsyncFn() -> Result<Vec<RecordBatch>>, runs: usize) -> Result<(f64, Vec<String>)> {
    let mut best = f64::INFINITY;
    let mut rows = Vec::new();
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let batches = run().await?;
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
        rows = rows_of(&batches)?;
    }
    Ok((best, rows))
}

/// Runs `mphf demo`.
///
/// # Errors
/// Generation, index and query errors; a result mismatch between MPHF and vanilla.
pub async fn run(args: DemoArgs) -> Result<()> {
    let parts = args.partitions.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let config = SessionConfig::new().with_target_partitions(parts);
    let mphf = MphfContext::with_config(config.clone());
    let vanilla = SessionContext::new_with_config(config);

    eprintln!("generating TPC-H SF {} in memory ({parts} partitions)...", args.scale);
    let t = Instant::now();
    for table in ["customer", "orders", "lineitem"] {
        let (schema, batches) = generate(table, args.scale, parts, &|_| {})?;
        let mem = Arc::new(MemTable::try_new(schema, batches)?);
        mphf.ctx().register_table(table, Arc::clone(&mem) as _)?;
        vanilla.register_table(table, mem)?;
    }
    eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());

    let indexes = [
        ("o_ok", "orders", "o_orderkey"),
        ("li_ok", "lineitem", "l_orderkey"),
        ("li_sk", "lineitem", "l_suppkey"),
        ("li_pk", "lineitem", "l_partkey"),
        ("c_name", "customer", "c_name"),
    ];
    for (name, table, col) in indexes {
        let t = Instant::now();
        mphf.sql(&format!("CREATE INDEX {name} ON {table} USING mphf ({col})")).await?;
        eprintln!("CREATE INDEX {name} ON {table} ({col}): {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    let stats = mphf.sql("SELECT name, \"table\", \"column\", key_type, keys, bits_per_key, bytes FROM mphf_indexes() ORDER BY name").await?.collect().await?;
    println!("MPHF indexes (SF {}):\n{}", args.scale, pretty_format_batches(&stats)?);

    println!("{:<26} {:>12} {:>12} {:>9}  same rows", "query", "vanilla ms", "mphf ms", "speed-up");
    let mut mismatches = 0;
    for (label, q_mphf, q_vanilla) in QUERIES {
        let (tv, rv) = time_query(async || Ok(vanilla.sql(q_vanilla).await?.collect().await?), args.runs).await?;
        let (tm, rm) = time_query(async || Ok(mphf.sql(q_mphf).await?.collect().await?), args.runs).await?;
        let same = rv == rm;
        if !same {
            mismatches += 1;
            eprintln!("MISMATCH in {label}:\n  vanilla: {rv:?}\n  mphf:    {rm:?}");
        }
        println!("{label:<26} {tv:>12.1} {tm:>12.1} {:>8.2}x  {}", tv / tm, if same { "yes" } else { "NO" });
    }
    if mismatches > 0 {
        bail!("{mismatches} queries gave different rows with and without MPHF");
    }
    Ok(())
}
