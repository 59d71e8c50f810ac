//! `mphf bench planning`: what the MPHF rules add to planning. TPC-H Q1–Q22 (the queries of
//! `sql-tests/tpch_queries.slt`) over in-memory tables, or with `--parquet` over Parquet files
//! (one file per partition, indexes with slot maps), planned from SQL to a physical plan in a
//! vanilla session and in an MPHF session with an index on every key column, in one process.
//!
//! Planning takes a few milliseconds and the difference sought is a fraction of one, so each
//! query is planned many times, the two sessions alternating (and alternating which goes first)
//! so that drift in the machine's speed falls on both; the table gives each side's median and
//! their difference. The summary line gives the median and the largest difference over the 22
//! queries.

use std::sync::Arc;

use ::datafusion::physical_plan::{displayable, ExecutionPlan};
use anyhow::{bail, Result};
use clap::Args;

use super::demo::{apply_settings, partitions_or_cores, tpch_parquet_sessions, tpch_sessions};
use super::difftest::tpch_suite;
use super::timing::{median, time_both};
use crate::datafusion::tpch::TABLES;

/// Arguments of `mphf bench planning`.
#[derive(Args, Debug, Clone)]
pub struct BenchPlanningArgs {
    /// TPC-H scale factor of the in-memory data.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Target partitions of both sessions (default: available cores).
    #[arg(long)]
    pub partitions: Option<usize>,
    /// Plans per query and session (the median is reported).
    #[arg(long, default_value_t = 41)]
    pub runs: usize,
    /// Print the result table as Markdown (for benches/RESULTS.md).
    #[arg(long)]
    pub markdown: bool,
    /// Plan over Parquet files (written to a temporary folder, one file per partition and
    /// table) instead of in-memory tables: the indexes then have slot maps, and the rules
    /// consider slot scans.
    #[arg(long)]
    pub parquet: bool,
    /// `KEY=VALUE`: a session setting set in the MPHF session before planning (repeatable),
    /// e.g. `--set mphf.enable_join=false`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Plan only these TPC-H query numbers, e.g. `--queries 18,21` (default: Q1–Q22), to
    /// time or profile a few queries with many runs.
    #[arg(long, value_delimiter = ',', value_name = "N,…")]
    pub queries: Vec<usize>,
}

/// How many MPHF nodes and declined candidates the plan `plan` holds.
pub(super) fn mphf_nodes(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize) {
    let text = displayable(plan.as_ref()).indent(false).to_string();
    let declined = text.matches("MphfDeclined:").count();
    let all = text.lines().filter(|l| l.trim_start().starts_with("Mphf")).count();
    let relabels = text.matches("MphfRelabel").count();
    (all - declined - relabels, declined)
}

/// Runs `mphf bench planning`.
///
/// # Errors
/// Generation, index and planning errors; a bad `--set`.
pub async fn run(args: BenchPlanningArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(n) = args.queries.iter().find(|n| !(1..=22).contains(*n)) {
        bail!("--queries: TPC-H has queries 1 to 22, not {n}");
    }
    let (mphf, vanilla, parts, _temp) = if args.parquet {
        let parts = partitions_or_cores(args.partitions);
        let (s, temp) = tpch_parquet_sessions(args.scale, parts, &TABLES, false, 0).await?;
        (s.mphf, s.vanilla, parts, Some(temp))
    } else {
        let (mphf, vanilla, parts) = tpch_sessions(args.scale, args.partitions, &TABLES)?;
        (mphf, vanilla, parts, None)
    };
    let (create, queries) = tpch_suite();
    for statement in &create {
        mphf.sql(statement).await?;
    }
    apply_settings(&mphf, &args.set).await?;
    let sep = if args.markdown { "|" } else { "" };
    if args.markdown {
        println!("| query | vanilla ms | mphf ms | added ms | MPHF nodes | declined |\n|---|---|---|---|---|---|");
    } else {
        println!(
            "{:<6} {:>11} {:>9} {:>9} {:>11} {:>9}",
            "query", "vanilla ms", "mphf ms", "added ms", "MPHF nodes", "declined"
        );
    }
    let mut added = Vec::new();
    let asked = |number: usize| args.queries.is_empty() || args.queries.contains(&number);
    for (i, query) in queries.iter().enumerate().filter(|(i, _)| asked(i + 1)) {
        let label = format!("Q{}", i + 1);
        // One plan each first: caches (statistics, catalog lookups) warm on both sides.
        vanilla.sql(&query.sql).await?.create_physical_plan().await?;
        let plan = mphf.sql(&query.sql).await?.create_physical_plan().await?;
        let (nodes, declined) = mphf_nodes(&plan);
        // Each plan is dropped inside its timed run, as a query's would be.
        let [(tv, _), (tm, _)] = time_both(
            async || {
                vanilla.sql(&query.sql).await?.create_physical_plan().await?;
                Ok(Vec::new())
            },
            async || {
                mphf.sql(&query.sql).await?.create_physical_plan().await?;
                Ok(Vec::new())
            },
            args.runs,
        )
        .await?;
        added.push(tm - tv);
        println!(
            "{sep}{label:<6}{sep} {tv:>11.3}{sep} {tm:>9.3}{sep} {:>9.3}{sep} {nodes:>11}{sep} {declined:>9}{sep}",
            tm - tv
        );
    }
    let max = added.iter().copied().fold(f64::MIN, f64::max);
    println!(
        "planning added by the MPHF session over {} queries (SF {}, {}, {parts} partitions, median of {} plans each): median {:.3} ms, largest {max:.3} ms",
        added.len(),
        args.scale,
        if args.parquet { "Parquet" } else { "in memory" },
        args.runs,
        median(&mut added)
    );
    Ok(())
}
