//! `mphf bench tpch`: TPC-H Q1–Q22 (the queries of `sql-tests/tpch_queries.slt`) run over
//! in-memory tables in a vanilla session and in an MPHF session with the slt's index on every
//! key column, in one process: median times, speed-ups and a check that the rows agree.
//!
//! Why a suite of whole queries: issue 23 asks that no TPC-H query run slower with the
//! extension than without it, including the queries whose candidates the planner declines
//! (their plans differ from vanilla's only by relabel and annotation nodes). The GROUP BY and
//! join benches time single operators; this one times what a user runs.
//!
//! The runs alternate between the sessions, and alternate which goes first, so drift in the
//! machine's speed falls on both. Rows are compared as multisets, floats with the difftest's
//! relative tolerance (sums taken in another order differ in the last bits); a query whose rows
//! differ fails the command after the table is printed.

use std::time::Instant;

use ::datafusion::arrow::record_batch::RecordBatch;
use ::datafusion::arrow::util::pretty::pretty_format_batches;
use ::datafusion::dataframe::DataFrame;
use anyhow::{bail, Result};
use clap::Args;

use super::allocator::purge_freed_memory_at_once;
use super::bench_planning::mphf_nodes;
use super::demo::{apply_settings, apply_tuning, tpch_sessions, tuned, LARGE_SCALE};
use super::difftest::cells::Rows;
use super::difftest::tpch_suite;
use super::timing::time_both;
use crate::datafusion::plan::tuning::Tuning;
use crate::datafusion::tpch::TABLES;

/// Arguments of `mphf bench tpch`.
#[derive(Args, Debug, Clone)]
pub struct BenchTpchArgs {
    /// TPC-H scale factor of the in-memory data.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Target partitions of both sessions (default: available cores).
    #[arg(long)]
    pub partitions: Option<usize>,
    /// Runs per query and session (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Only these queries (repeatable), by number: `--only 3 --only 18`.
    #[arg(long)]
    pub only: Vec<usize>,
    /// Print the result table as Markdown (for benches/RESULTS.md).
    #[arg(long)]
    pub markdown: bool,
    /// Print each query's `EXPLAIN ANALYZE` in the MPHF session to stderr.
    #[arg(long)]
    pub explain: bool,
    /// `KEY=VALUE`: a session setting set in the MPHF session before the queries (repeatable),
    /// e.g. `--set mphf.aggregate_device=cpu`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// `NAME=VALUE`: one of the planner's thresholds (`Tuning`, not a setting) changed in the
    /// MPHF session (repeatable), e.g. `--tune join_partitioned_max_partitions=0`.
    #[arg(long = "tune", value_name = "NAME=VALUE")]
    pub tune: Vec<String>,
}

/// The rows of `df`; an empty result keeps its schema in one empty batch, so that its rows can
/// be compared.
async fn collect(df: DataFrame) -> Result<Vec<RecordBatch>> {
    let schema = df.schema().inner().clone();
    let batches = df.collect().await?;
    Ok(match batches.is_empty() {
        true => vec![RecordBatch::new_empty(schema)],
        false => batches,
    })
}

/// Runs `mphf bench tpch`.
///
/// # Errors
/// Generation, index and query errors; a bad `--set` or `--only`; a query whose rows differ
/// between the sessions.
pub async fn run(args: BenchTpchArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(&q) = args.only.iter().find(|&&q| !(1..=22).contains(&q)) {
        bail!("--only takes query numbers 1 to 22, got {q}");
    }
    tuned(Tuning::default(), &args.tune)?;
    if args.scale >= LARGE_SCALE {
        purge_freed_memory_at_once();
    }
    let (mphf, vanilla, parts) = tpch_sessions(args.scale, args.partitions, &TABLES)?;
    let (create, queries) = tpch_suite();
    for statement in &create {
        let t = Instant::now();
        mphf.sql(statement).await?;
        eprintln!("{statement}: {:.0} ms", t.elapsed().as_secs_f64() * 1e3);
    }
    apply_settings(&mphf, &args.set).await?;
    apply_tuning(&mphf, &args.tune)?;
    let sep = if args.markdown { "|" } else { "" };
    if args.markdown {
        println!("| query | vanilla ms | mphf ms | speed-up | MPHF nodes | declined | same rows |\n|---|---|---|---|---|---|---|");
    } else {
        println!(
            "{:<6} {:>11} {:>9} {:>9} {:>11} {:>9}  same rows",
            "query", "vanilla ms", "mphf ms", "speed-up", "MPHF nodes", "declined"
        );
    }
    let (mut ratios, mut mismatches) = (Vec::new(), Vec::new());
    for (i, query) in queries.iter().enumerate() {
        let number = i + 1;
        if !args.only.is_empty() && !args.only.contains(&number) {
            continue;
        }
        let label = format!("Q{number}");
        if args.explain {
            let plan = mphf
                .sql(&format!("EXPLAIN ANALYZE {}", query.sql))
                .await?
                .collect()
                .await?;
            eprintln!("{label}:\n{}", pretty_format_batches(&plan)?);
        }
        let plan = mphf.sql(&query.sql).await?.create_physical_plan().await?;
        let (nodes, declined) = mphf_nodes(&plan);
        let [(tv, bv), (tm, bm)] = time_both(
            async || collect(vanilla.sql(&query.sql).await?).await,
            async || collect(mphf.sql(&query.sql).await?).await,
            args.runs,
        )
        .await?;
        let (rv, rm) = (
            Rows::from_batches(&bv[0].schema(), &bv)?,
            Rows::from_batches(&bm[0].schema(), &bm)?,
        );
        let same = match rv.diff(&rm, query.ordered) {
            None => "yes",
            Some(why) => {
                eprintln!("MISMATCH in {label}: {why}");
                mismatches.push(label.clone());
                "NO"
            }
        };
        ratios.push(tv / tm);
        println!(
            "{sep}{label:<6}{sep} {tv:>11.1}{sep} {tm:>9.1}{sep} {:>8.2}×{sep} {nodes:>11}{sep} {declined:>9}{sep}  {same}{sep}",
            tv / tm
        );
    }
    if !ratios.is_empty() {
        let geomean = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
        let lowest = ratios.iter().copied().fold(f64::MAX, f64::min);
        let below = ratios.iter().filter(|&&r| r < 0.95).count();
        println!(
            "TPC-H SF {} in memory, {parts} partitions, median of {} runs per query: geometric mean {geomean:.2}×, lowest {lowest:.2}×, {below} of {} below 0.95×",
            args.scale,
            args.runs,
            ratios.len()
        );
    }
    if !mismatches.is_empty() {
        bail!("rows differ with and without MPHF in {}", mismatches.join(", "));
    }
    Ok(())
}
