//! GROUP BY on MPHF-indexed keys: every query runs with `mphf.enable_aggregate` on and off and
//! the sorted results must be identical; with the rule on, the plan must contain
//! `MphfAggregateExec` (the fast path ran).

#![cfg(feature = "datafusion")]

mod sql_common;

use datafusion::prelude::SessionConfig;
use datafusion_mphf::datafusion::MphfContext;
use sql_common::run;

/// A session with `partitions` target partitions and a 20,000-row table `t` whose key `k` has
/// 6,000 distinct values plus NULLs, indexed with MPHF.
async fn setup(partitions: usize) -> MphfContext {
    let ctx = MphfContext::with_config(
        SessionConfig::new()
            .with_target_partitions(partitions)
            .with_batch_size(1024),
    );
    ctx.sql(
        "CREATE TABLE t AS SELECT \
           CASE WHEN value % 97 = 0 THEN NULL ELSE value % 6000 END AS k, \
           value AS v, \
           CAST(value % 13 AS DOUBLE) AS d, \
           'str' || CAST(value % 7 AS VARCHAR) AS s \
         FROM generate_series(1, 20000)",
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    ctx.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    // `k` is not clustered (one row per run): costing would decline; these tests force the operator.
    ctx.sql("SET mphf.aggregate_min_rows_per_run = 0").await.unwrap();
    ctx.sql("SET mphf.aggregate_max_slot_entries_per_row = 1000")
        .await
        .unwrap();
    ctx
}

/// Runs `sql` with the rule off and on; asserts equal results; returns whether MPHF ran.
async fn compare(ctx: &MphfContext, sql: &str) -> bool {
    ctx.sql("SET mphf.enable_aggregate = false").await.unwrap();
    let (off, off_plan) = run(ctx, sql).await;
    assert!(!off_plan.contains("MphfAggregateExec"), "{off_plan}");
    ctx.sql("SET mphf.enable_aggregate = true").await.unwrap();
    let (on, on_plan) = run(ctx, sql).await;
    assert_eq!(off, on, "results differ for {sql}\nplan:\n{on_plan}");
    on_plan.contains("MphfAggregateExec")
}

const QUERIES: &[(&str, bool)] = &[
    (
        "SELECT k, count(*), sum(v), avg(d), min(v), max(s) FROM t GROUP BY k",
        true,
    ),
    ("SELECT k, count(DISTINCT s) FROM t GROUP BY k", true),
    ("SELECT k, sum(v) FROM t WHERE v % 3 = 0 GROUP BY k", true),
    ("SELECT k, count(*) AS c FROM t GROUP BY k HAVING count(*) > 3", true),
    (
        "SELECT k, sum(v) AS sv FROM t GROUP BY k ORDER BY sv DESC, k LIMIT 7",
        true,
    ),
    ("SELECT k, count(*) FROM t WHERE v < 0 GROUP BY k", true),
    ("SELECT k FROM t GROUP BY k", true),
    ("SELECT k + 1, count(*) FROM t GROUP BY k + 1", false),
    ("SELECT k, s, count(*) FROM t GROUP BY k, s", false),
];

#[tokio::test]
async fn results_equal_with_and_without_mphf() {
    for partitions in [1, 2, 16] {
        let ctx = setup(partitions).await;
        for (sql, expect_mphf) in QUERIES {
            let ran = compare(&ctx, sql).await;
            assert_eq!(
                ran, *expect_mphf,
                "MphfAggregateExec presence for {sql} at {partitions} partitions"
            );
        }
    }
}

#[tokio::test]
async fn explain_names_operator_and_index() {
    let ctx = setup(2).await;
    let (_, plan) = run(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await;
    let line = plan
        .lines()
        .find(|l| l.contains("MphfAggregateExec"))
        .expect("operator in plan");
    assert!(line.contains("mode=SlotMerge"), "{line}");
    assert!(line.contains("index=t.k"), "{line}");
    assert!(
        line.contains("aggr=[count(Int64(1))]") || line.contains("aggr=[count(*)]"),
        "{line}"
    );
}

#[tokio::test]
async fn metrics_count_slots_and_fallback_rows() {
    let ctx = setup(1).await;
    let df = ctx.sql("SELECT k, count(*) FROM t GROUP BY k").await.unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let task = ctx.ctx().task_ctx();
    let batches = datafusion::physical_plan::collect(plan.clone(), task).await.unwrap();
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 6001); // 6,000 keys + the NULL group
    let mut found = false;
    datafusion::physical_plan::accept(plan.as_ref(), &mut MetricsVisitor(&mut found)).unwrap();
    assert!(found, "MphfAggregateExec metrics not found");
}

struct MetricsVisitor<'a>(&'a mut bool);

impl datafusion::physical_plan::ExecutionPlanVisitor for MetricsVisitor<'_> {
    type Error = datafusion::error::DataFusionError;
    fn pre_visit(&mut self, plan: &dyn datafusion::physical_plan::ExecutionPlan) -> Result<bool, Self::Error> {
        if plan.name() == "MphfAggregateExec" {
            let m = plan.metrics().unwrap();
            assert_eq!(m.sum_by_name("input_rows").map(|v| v.as_usize()), Some(20000));
            assert_eq!(m.sum_by_name("slots_touched").map(|v| v.as_usize()), Some(6000));
            // 20000 / 97 = 206 rows have a NULL key.
            assert_eq!(m.sum_by_name("fallback_rows").map(|v| v.as_usize()), Some(206));
            *self.0 = true;
        }
        Ok(true)
    }
}

/// The costing rule declines an unclustered key (unless its lookups are dense-table reads) and
/// a small index by default.
#[tokio::test]
async fn costing_declines_unclustered_and_small_keys() {
    let ctx = setup(2).await;
    ctx.sql("SET mphf.aggregate_min_rows_per_run = 2").await.unwrap();
    // t.k is dense (0..5999): its dense-key table makes the lookups cheap, clustered or not.
    assert!(compare(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await);
    ctx.sql("SET mphf.dense_lookup_max_bytes_per_key = 0").await.unwrap();
    ctx.sql("DROP INDEX t_k").await.unwrap();
    ctx.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    assert!(!compare(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await);
    // Clustered: 4 rows per key in table order.
    ctx.sql("CREATE TABLE c AS SELECT value / 4 AS k, value AS v FROM generate_series(0, 39999)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    ctx.sql("CREATE INDEX c_k ON c USING mphf (k)").await.unwrap();
    assert!(compare(&ctx, "SELECT k, sum(v) FROM c GROUP BY k").await);
    ctx.sql("SET mphf.aggregate_min_slots = 20000").await.unwrap();
    assert!(!compare(&ctx, "SELECT k, sum(v) FROM c GROUP BY k").await);
    // 2 partitions × 10,000 slots > 40,000 rows × 0.25.
    ctx.sql("SET mphf.aggregate_min_slots = 0").await.unwrap();
    ctx.sql("SET mphf.aggregate_max_slot_entries_per_row = 0.25")
        .await
        .unwrap();
    assert!(!compare(&ctx, "SELECT k, sum(v) FROM c GROUP BY k").await);
}
