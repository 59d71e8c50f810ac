//! `mphf demo`, `mphf bench groupby` and `mphf bench join`: the same queries on the same
//! in-memory TPC-H data in two sessions of one process, vanilla DataFusion and the MPHF
//! extension, with the rows checked equal and the median times compared. With `--parquet` the
//! benches read the same data written as Parquet to a temporary folder; with `--workers N` each
//! session is the coordinator of its own in-memory cluster of N workers over those files (a
//! worker cannot read an in-memory table).
//!
//! The MPHF session has indexes on `orders.o_orderkey`, `lineitem.l_orderkey`,
//! `lineitem.l_suppkey`, `lineitem.l_partkey`, `customer.c_custkey` and the string key
//! `customer.c_name`. The queries are plain SQL: the optimizer rules swap hash aggregation for
//! `MphfAggregateExec` and hash joins for `MphfJoinExec` where the key is indexed and leave the
//! rest to DataFusion (their decline rules keep small tables on hash tables, and dense integer
//! joins on DataFusion's `ArrayMap`). Two `mphf_index` queries show the function itself. For
//! joins the table also says which path the vanilla plan took (hash join mode, or `ArrayMap`,
//! from the `array_map_created_count` metric).

use std::sync::Arc;
use std::time::Instant;

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use ::datafusion::arrow::util::pretty::pretty_format_batches;
use ::datafusion::datasource::MemTable;
use ::datafusion::physical_plan::displayable;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::prelude::{SessionConfig, SessionContext};
use anyhow::{bail, Result};
use clap::Args;

use super::allocator::purge_freed_memory_at_once;
use super::bench_tables::{parquet_sessions, write_table, Sessions, TempDir};
use super::timing::time_both;
use crate::datafusion::plan::tuning::Tuning;
use crate::datafusion::tpch::generate;
use crate::datafusion::MphfContext;

/// Arguments of `mphf demo` and `mphf bench groupby`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// TPC-H scale factor of the in-memory data.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Target partitions of both sessions (default: available cores).
    #[arg(long)]
    pub partitions: Option<usize>,
    /// Runs per query and session (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Print the result table as Markdown (for benches/RESULTS.md).
    #[arg(long)]
    pub markdown: bool,
    /// Also print the MPHF session's `EXPLAIN ANALYZE` of each query (on stderr).
    #[arg(long)]
    pub explain: bool,
    /// Run only the queries whose label contains this text (case-insensitive; repeatable: any
    /// of them).
    #[arg(long)]
    pub only: Vec<String>,
    /// `KEY=VALUE`: a session setting set in the MPHF session before the queries run
    /// (repeatable), e.g. `--set mphf.aggregate_device=gpu`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// `NAME=VALUE`: one of the planner's thresholds (`Tuning`, not a setting) changed in the
    /// MPHF session (repeatable), e.g. `--tune join_collect_max_partitions=4`.
    #[arg(long = "tune", value_name = "NAME=VALUE")]
    pub tune: Vec<String>,
    /// Plan the MPHF session with the cost constants `mphf calibrate` wrote to this file
    /// (applied before `--tune`).
    #[arg(long, value_name = "FILE")]
    pub costs: Option<std::path::PathBuf>,
    /// `mphf bench groupby|join` only: run both sessions on in-memory clusters of N
    /// datafusion-distributed workers in this process, over the tables written as Parquet to a
    /// temporary folder (a worker cannot read an in-memory table; implies `--parquet`).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub workers: usize,
    /// `mphf bench groupby|join` only: read the tables from Parquet files written to a
    /// temporary folder, not from memory (the one-process counterpart of `--workers`).
    #[arg(long)]
    pub parquet: bool,
}

/// Changes the planner's thresholds of `mphf` by `tune`'s `NAME=VALUE` pairs, in order, saying
/// each on stderr (`--tune` of `mphf bench` and `mphf sql`).
///
/// # Errors
/// Those of [`tuned`].
pub(crate) fn apply_tuning(mphf: &MphfContext, tune: &[String]) -> Result<()> {
    let tuning = tuned(mphf.tuning(), tune)?;
    mphf.tune(|t| *t = tuning);
    for threshold in tune {
        eprintln!("tune {}", threshold.trim());
    }
    Ok(())
}

/// `tuning` changed by `tune`'s `NAME=VALUE` pairs, in order (also how a benchmark checks its
/// `--tune` before it generates data).
///
/// # Errors
/// A pair without `=`, an unknown name or a value that does not parse (see `Tuning::assign`).
pub(crate) fn tuned(mut tuning: Tuning, tune: &[String]) -> Result<Tuning> {
    for threshold in tune {
        let Some((name, value)) = threshold.split_once('=') else {
            bail!("--tune takes NAME=VALUE, got {threshold:?}");
        };
        tuning.assign(name.trim(), value)?;
    }
    Ok(tuning)
}

/// Which queries a run shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// `mphf demo`: GROUP BY, JOIN and `mphf_index` queries.
    Demo,
    /// `mphf bench groupby`.
    GroupBy,
    /// `mphf bench join`.
    Join,
}

/// (label, MPHF-session query, vanilla-session query). The same text unless the query shows
/// `mphf_index` itself.
type Query = (&'static str, &'static str, &'static str);

/// TPC-H Q3 (joins customer, orders, lineitem; groups by l_orderkey and two order columns).
const Q3: &str = "SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority \
     FROM customer, orders, lineitem WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey \
     AND l_orderkey = o_orderkey AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15' \
     GROUP BY l_orderkey, o_orderdate, o_shippriority ORDER BY revenue DESC, o_orderdate LIMIT 10";

/// TPC-H Q18 (a GROUP BY l_orderkey subquery, joins, and a five-column GROUP BY).
const Q18: &str = "SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) \
     FROM customer, orders, lineitem \
     WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300) \
     AND c_custkey = o_custkey AND o_orderkey = l_orderkey \
     GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice ORDER BY o_totalprice DESC, o_orderdate LIMIT 100";

/// Join queries (`mphf bench join`, and the first two in `mphf demo`).
const JOIN_QUERIES: &[Query] = &[
    (
        "lineitem ⋈ orders (orderkey)",
        "SELECT count(*), sum(l_quantity), sum(o_totalprice) FROM lineitem JOIN orders ON l_orderkey = o_orderkey",
        "",
    ),
    (
        "orders ⋈ customer (custkey)",
        "SELECT count(*), sum(o_totalprice), max(c_acctbal) FROM orders JOIN customer ON o_custkey = c_custkey",
        "",
    ),
    (
        "orders ⋈ customer (string key)",
        "SELECT count(*), sum(o_totalprice), max(c_acctbal) FROM orders_by_name JOIN customer ON o_cname = c_name",
        "",
    ),
    (
        "lineitem ⋉ orders (semi, filter)",
        "SELECT count(*) FROM lineitem WHERE l_orderkey IN (SELECT o_orderkey FROM orders WHERE o_orderpriority = '1-URGENT')",
        "",
    ),
    (
        "TPC-H Q3",
        Q3,
        "",
    ),
    (
        "TPC-H Q18",
        Q18,
        "",
    ),
];

/// GROUP BY and `mphf_index` queries (`mphf bench groupby`, `mphf demo`).
const QUERIES: &[Query] = &[
    (
        "GROUP BY l_orderkey",
        "SELECT l_orderkey, count(*), sum(l_quantity) FROM lineitem GROUP BY l_orderkey",
        "",
    ),
    (
        "GROUP BY l_orderkey count(*)",
        "SELECT l_orderkey, count(*) FROM lineitem GROUP BY l_orderkey",
        "",
    ),
    (
        "GROUP BY l_partkey",
        "SELECT l_partkey, avg(l_extendedprice) FROM lineitem GROUP BY l_partkey",
        "",
    ),
    (
        "GROUP BY l_suppkey",
        "SELECT l_suppkey, count(*) FROM lineitem GROUP BY l_suppkey",
        "",
    ),
    (
        "GROUP BY o_orderkey",
        "SELECT o_orderkey, sum(o_totalprice), count(*) FROM orders GROUP BY o_orderkey",
        "",
    ),
    (
        "GROUP BY c_name (string)",
        "SELECT c_name, count(*), sum(o_totalprice) FROM orders JOIN customer ON o_custkey = c_custkey GROUP BY c_name",
        "",
    ),
    (
        "GROUP BY o_cname (string, one table)",
        "SELECT o_cname, count(*), sum(o_totalprice) FROM orders_by_name GROUP BY o_cname",
        "",
    ),
    (
        "GROUP BY l_orderkey + 3 order columns",
        "SELECT l_orderkey, o_custkey, o_orderdate, o_orderpriority, sum(l_extendedprice), count(*) \
         FROM lineitem JOIN orders ON l_orderkey = o_orderkey GROUP BY l_orderkey, o_custkey, o_orderdate, o_orderpriority",
        "",
    ),
    ("TPC-H Q18", Q18, ""),
    ("TPC-H Q3", Q3, ""),
    (
        "count(DISTINCT mphf_index)",
        "SELECT count(DISTINCT mphf_index(l_orderkey)), max(mphf_index(l_orderkey)) FROM lineitem",
        "SELECT count(DISTINCT l_orderkey), count(DISTINCT l_orderkey) - 1 FROM lineitem",
    ),
    (
        "membership (mphf_index)",
        "SELECT count(*) FROM orders WHERE mphf_index('li_ok', o_orderkey + 1) IS NOT NULL",
        "SELECT count(*) FROM orders WHERE o_orderkey + 1 IN (SELECT l_orderkey FROM lineitem)",
    ),
];

/// The rows of `batches` as sorted strings (order-insensitive comparison).
pub(super) fn rows_of(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let opts = FormatOptions::default().with_null("NULL");
    let mut rows = Vec::new();
    for b in batches {
        let fmts = b
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        for r in 0..b.num_rows() {
            rows.push(
                fmts.iter()
                    .map(|f| f.value(r).to_string())
                    .collect::<Vec<_>>()
                    .join(" | "),
            );
        }
    }
    rows.sort();
    Ok(rows)
}

/// The MPHF operators in the MPHF session's physical plan of `sql` ("agg", "join"), or "hash".
pub(super) async fn mphf_operators(ctx: &MphfContext, sql: &str) -> Result<String> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let text = displayable(plan.as_ref()).indent(true).to_string();
    // A distributed plan's operators are inside its stages.
    #[cfg(feature = "distributed")]
    let text = match plan.is::<datafusion_distributed::DistributedExec>() {
        true => datafusion_distributed::display_plan_ascii(plan.as_ref(), false),
        false => text,
    };
    let ops: Vec<&str> = [("MphfAggregateExec", "agg"), ("MphfJoinExec", "join")]
        .into_iter()
        .filter(|(name, _)| text.contains(name))
        .map(|(_, short)| short)
        .collect();
    let ops = if ops.is_empty() { "hash".into() } else { ops.join("+") };
    Ok(if text.contains("device=gpu") {
        format!("{ops}(gpu)")
    } else {
        ops
    })
}

/// How the vanilla session ran the joins of `sql`: each `HashJoinExec`'s mode, with `ArrayMap`
/// when its `array_map_created_count` metric says DataFusion built its dense-integer map.
async fn vanilla_join_paths(ctx: &SessionContext, sql: &str) -> Result<String> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    ::datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let mut paths = Vec::new();
    let mut stack = vec![plan];
    while let Some(node) = stack.pop() {
        if let Some(join) = node.downcast_ref::<HashJoinExec>() {
            let array_map = node
                .metrics()
                .and_then(|m| m.sum_by_name("array_map_created_count"))
                .is_some_and(|v| v.as_usize() > 0);
            let mode = format!("{:?}", join.partition_mode());
            paths.push(if array_map { format!("{mode}/ArrayMap") } else { mode });
        }
        stack.extend(node.children().into_iter().cloned());
    }
    Ok(if paths.is_empty() { "-".into() } else { paths.join(",") })
}

/// Scale factor from which the binary's allocator returns freed memory at once (see
/// [`allocator`](super::allocator)): SF 10 in memory ran out of the 24 GiB machine's memory
/// with freed memory kept 10 ms, and not without it.
pub(super) const LARGE_SCALE: f64 = 5.0;

/// `partitions`, or the available cores without it (`--partitions`' default).
pub(super) fn partitions_or_cores(partitions: Option<usize>) -> usize {
    partitions.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// An MPHF session and a vanilla session with `partitions` target partitions (default: the
/// available cores; returned third), both reading the same in-memory TPC-H `tables` at scale
/// `scale`.
///
/// # Errors
/// Generation and registration errors.
pub(super) fn tpch_sessions(
    scale: f64,
    partitions: Option<usize>,
    tables: &[&str],
) -> Result<(MphfContext, SessionContext, usize)> {
    let parts = partitions_or_cores(partitions);
    let config = SessionConfig::new().with_target_partitions(parts);
    let mphf = MphfContext::with_config(config.clone());
    let vanilla = SessionContext::new_with_config(config);
    eprintln!("generating TPC-H SF {scale} in memory ({parts} partitions)...");
    for &table in tables {
        let (schema, batches) = generate(table, scale, parts, &|_| {})?;
        let mem = Arc::new(MemTable::try_new(schema, batches)?);
        mphf.ctx().register_table(table, Arc::clone(&mem) as _)?;
        vanilla.register_table(table, mem)?;
    }
    Ok((mphf, vanilla, parts))
}

/// The in-memory TPC-H `tables` (and `orders_by_name` when `with_orders_by_name`) written as
/// Parquet under a new temporary folder, `parts` files a table, and the two sessions over them,
/// in this process (`workers` 0) or each on its own in-memory cluster of `workers` workers (see
/// [`bench_tables`](super::bench_tables)). The folder goes when the returned [`TempDir`] is
/// dropped.
///
/// # Errors
/// Generation, Parquet and cluster errors.
pub(super) async fn tpch_parquet_sessions(
    scale: f64,
    parts: usize,
    tables: &[&str],
    with_orders_by_name: bool,
    workers: usize,
) -> Result<(Sessions, TempDir)> {
    let dir = std::env::temp_dir().join(format!("mphf-bench-tpch-{}", std::process::id()));
    let temp = TempDir(dir.clone());
    let config = SessionConfig::new().with_target_partitions(parts);
    // The tables, and `orders_by_name` derived from them, in a scratch session first.
    let scratch = SessionContext::new_with_config(config.clone());
    eprintln!(
        "generating TPC-H SF {scale} ({parts} partitions) and writing it to {}...",
        dir.display()
    );
    for &table in tables {
        let (schema, batches) = generate(table, scale, parts, &|_| {})?;
        scratch.register_table(table, Arc::new(MemTable::try_new(schema, batches)?))?;
    }
    let mut names = tables.to_vec();
    if with_orders_by_name {
        scratch.sql(ORDERS_BY_NAME).await?.collect().await?;
        names.push("orders_by_name");
    }
    for &table in &names {
        let frame = scratch.table(table).await?;
        let schema = Arc::clone(frame.schema().inner());
        let batches = frame.collect().await?;
        write_table(&dir.join(table), &(schema, batches), parts)?;
        scratch.deregister_table(table)?;
    }
    let s = parquet_sessions(&config, &dir, &names, workers).await?;
    Ok((s, temp))
}

/// A string join key: each order with its customer's name (`orders_by_name`, the same data in
/// both sessions).
const ORDERS_BY_NAME: &str = "CREATE TABLE orders_by_name AS SELECT o_orderkey, o_totalprice, \
                              'Customer#' || lpad(CAST(o_custkey AS VARCHAR), 9, '0') AS o_cname FROM orders";

/// Runs `SET KEY = VALUE` in `mphf` for each `KEY=VALUE` of `settings` (`--set`).
///
/// # Errors
/// A setting without `=`; an unknown setting or a bad value.
pub(super) async fn apply_settings(mphf: &MphfContext, settings: &[String]) -> Result<()> {
    for setting in settings {
        let Some((key, value)) = setting.split_once('=') else {
            bail!("--set takes KEY=VALUE, got {setting:?}");
        };
        mphf.sql(&format!("SET {} = {}", key.trim(), value.trim())).await?;
        eprintln!("SET {} = {}", key.trim(), value.trim());
    }
    Ok(())
}

/// The queries of `suite` whose labels contain one of `only` (case-insensitive; all without).
fn selected_queries(suite: Suite, only: &[String]) -> Vec<&'static Query> {
    let queries: Vec<&Query> = match suite {
        Suite::GroupBy => QUERIES.iter().collect(),
        Suite::Join => JOIN_QUERIES.iter().collect(),
        Suite::Demo => QUERIES[..5]
            .iter()
            .chain(&JOIN_QUERIES[..3])
            .chain(&QUERIES[5..])
            .collect(),
    };
    let only: Vec<String> = only.iter().map(|o| o.to_lowercase()).collect();
    queries
        .into_iter()
        .filter(|(label, _, _)| only.is_empty() || only.iter().any(|o| label.to_lowercase().contains(o)))
        .collect()
}

/// Runs `mphf demo` / `mphf bench groupby` / `mphf bench join`.
///
/// # Errors
/// Generation, index and query errors; a result mismatch between MPHF and vanilla.
pub async fn run(args: DemoArgs, suite: Suite) -> Result<()> {
    if args.scale >= LARGE_SCALE {
        purge_freed_memory_at_once();
    }
    let queries = selected_queries(suite, &args.only);
    // What the selected queries read (with `--only`, a large scale then fits in memory).
    let reads = |name: &str| {
        queries
            .iter()
            .any(|(_, q_mphf, q_vanilla)| q_mphf.contains(name) || q_vanilla.contains(name))
    };
    tuned(Tuning::default(), &args.tune)?;
    if (args.workers > 0 || args.parquet) && suite == Suite::Demo {
        bail!("--workers and --parquet are for `mphf bench groupby` and `mphf bench join`; `mphf demo` runs in memory in one process");
    }
    let t = Instant::now();
    let tables = ["customer", "orders", "lineitem"];
    let (mphf, vanilla, parts, _temp) = if args.workers == 0 && !args.parquet {
        let (mphf, vanilla, parts) = tpch_sessions(args.scale, args.partitions, &tables)?;
        if reads("orders_by_name") {
            mphf.ctx().sql(ORDERS_BY_NAME).await?.collect().await?;
            vanilla.sql(ORDERS_BY_NAME).await?.collect().await?;
        }
        (mphf, vanilla, parts, None)
    } else {
        let parts = partitions_or_cores(args.partitions);
        let (s, temp) =
            tpch_parquet_sessions(args.scale, parts, &tables, reads("orders_by_name"), args.workers).await?;
        if args.workers > 0 {
            eprintln!(
                "{} workers per session, each an in-memory datafusion-distributed worker",
                args.workers
            );
        }
        (s.mphf, s.vanilla, parts, Some(temp))
    };
    eprintln!("generated in {:.1} s", t.elapsed().as_secs_f64());

    let indexes = [
        ("o_ok", "orders", "o_orderkey"),
        ("li_ok", "lineitem", "l_orderkey"),
        ("li_sk", "lineitem", "l_suppkey"),
        ("li_pk", "lineitem", "l_partkey"),
        ("c_name", "customer", "c_name"),
        ("ob_cname", "orders_by_name", "o_cname"),
        ("c_ck", "customer", "c_custkey"),
    ];
    for (name, table, col) in indexes {
        if !reads(name) && !reads(col) {
            continue;
        }
        let t = Instant::now();
        mphf.sql(&format!("CREATE INDEX {name} ON {table} USING mphf ({col})"))
            .await?;
        eprintln!(
            "CREATE INDEX {name} ON {table} ({col}): {:.0} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    apply_settings(&mphf, &args.set).await?;
    if let Some(path) = &args.costs {
        mphf.load_costs(path)?;
        eprintln!("cost constants from {}", path.display());
    }
    apply_tuning(&mphf, &args.tune)?;
    let stats = mphf
        .sql(
            "SELECT name, \"table\", \"column\", key_type, keys, bits_per_key, bytes FROM mphf_indexes() ORDER BY name",
        )
        .await?
        .collect()
        .await?;
    println!("MPHF indexes (SF {}):\n{}", args.scale, pretty_format_batches(&stats)?);

    let (sep, head) = if args.markdown {
        (
            "|",
            "| query | vanilla ms | mphf ms | speed-up | MPHF operators | vanilla joins | planning ms (vanilla / mphf) | same rows |\n|---|---|---|---|---|---|---|---|",
        )
    } else {
        ("", "")
    };
    if args.markdown {
        println!("{head}");
    } else {
        println!(
            "{:<34} {:>11} {:>11} {:>9}  {:<9} {:<26} {:<13} same rows",
            "query (median ms)", "vanilla", "mphf", "speed-up", "operator", "vanilla joins", "planning"
        );
    }
    let mut mismatches = 0;
    for &(label, q_mphf, q_vanilla) in &queries {
        let q_vanilla = if q_vanilla.is_empty() { q_mphf } else { q_vanilla };
        let [(tv, bv), (tm, bm)] = time_both(
            async || Ok(vanilla.sql(q_vanilla).await?.collect().await?),
            async || Ok(mphf.sql(q_mphf).await?.collect().await?),
            args.runs,
        )
        .await?;
        let (rv, rm) = (rows_of(&bv)?, rows_of(&bm)?);
        // Planning alone (SQL to physical plan, the MPHF rules included), timed the same way.
        let [(pv, _), (pm, _)] = time_both(
            async || {
                vanilla.sql(q_vanilla).await?.create_physical_plan().await?;
                Ok(Vec::new())
            },
            async || {
                mphf.sql(q_mphf).await?.create_physical_plan().await?;
                Ok(Vec::new())
            },
            args.runs,
        )
        .await?;
        let planning = format!("{pv:.1} / {pm:.1}");
        let operator = mphf_operators(&mphf, q_mphf).await?;
        let joins = vanilla_join_paths(&vanilla, q_vanilla).await?;
        if args.explain {
            let plan = mphf.sql(&format!("EXPLAIN ANALYZE {q_mphf}")).await?.collect().await?;
            eprintln!("{label}:\n{}", pretty_format_batches(&plan)?);
        }
        let same = rv == rm;
        if !same {
            mismatches += 1;
            eprintln!("MISMATCH in {label}: vanilla {} rows, mphf {} rows", rv.len(), rm.len());
        }
        let same = if same { "yes" } else { "NO" };
        if args.markdown {
            println!(
                "{sep} {label} {sep} {tv:.1} {sep} {tm:.1} {sep} {:.2}× {sep} {operator} {sep} {joins} {sep} {planning} {sep} {same} {sep}",
                tv / tm
            );
        } else {
            println!(
                "{label:<34} {tv:>11.1} {tm:>11.1} {:>8.2}x  {operator:<9} {joins:<26} {planning:<13} {same}",
                tv / tm
            );
        }
    }
    if mismatches > 0 {
        bail!("{mismatches} queries gave different rows with and without MPHF");
    }
    if suite == Suite::Demo && args.only.is_empty() {
        super::bench_sparse::demo_line(parts, args.runs).await?;
    }
    Ok(())
}
