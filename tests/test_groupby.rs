//! GROUP BY on MPHF-indexed keys: every query runs with `mphf.enable_aggregate` on and off and
//! the sorted results must be identical; with the rule on, the plan must contain
//! `MphfAggregateExec` (the fast path ran).

#![cfg(feature = "datafusion")]

mod sql_common;

use datafusion::prelude::SessionConfig;
use datafusion_mphf::datafusion::MphfContext;
use sql_common::{find_node, run};

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
           'str' || CAST(value % 7 AS VARCHAR) AS s, \
           CAST((value % 1000) * 0.25 AS DECIMAL(15, 2)) AS m, \
           CAST(value - 10000 AS INT) AS i, \
           CASE WHEN value % 11 = 0 THEN NULL ELSE CAST(value % 50 AS DOUBLE) * 0.5 END AS nd \
         FROM generate_series(1, 20000)",
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    ctx.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    // `k` is not clustered (one row per run): costing would decline; these tests force the
    // operator, also under filters whose sampled estimate leaves (next to) no rows.
    ctx.tune(|t| {
        t.aggregate_min_rows_per_run = 0.0;
        t.aggregate_max_slot_entries_per_row = 1e9;
        t.aggregate_max_slot_entries_per_row_partitioned = 1e9;
        t.compare_costs = false;
    });
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
    // A selective filter: few slots touched, merged compactly and emitted by sorting.
    ("SELECT k, sum(v), count(*) FROM t WHERE v % 500 = 7 GROUP BY k", true),
    ("SELECT k FROM t GROUP BY k", true),
    ("SELECT k + 1, count(*) FROM t GROUP BY k + 1", false),
    // The slots themselves as the key: group indices without a lookup.
    (
        "SELECT mphf_index(k) AS s, count(*), sum(v) FROM t GROUP BY mphf_index(k)",
        true,
    ),
    ("SELECT count(DISTINCT mphf_index(k)), max(mphf_index(k)) FROM t", true),
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

/// The costing rule declines an unclustered key (unless its lookups are dense-table reads or
/// row-slot copies) and a small index by default.
#[tokio::test]
async fn costing_declines_unclustered_and_small_keys() {
    let ctx = setup(2).await;
    ctx.tune(|t| t.aggregate_min_rows_per_run = 2.0);
    // t.k is dense (0..5999): its dense-key table makes the lookups cheap, clustered or not.
    assert!(compare(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await);
    ctx.tune(|t| t.dense_lookup_max_bytes_per_key = 0.0);
    ctx.sql("DROP INDEX t_k").await.unwrap();
    ctx.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    // Read straight from the in-memory table, the keys find their slots in the row slots (a
    // copy, no lookup); through a filter (new arrays) each row would cost an MPHF query.
    assert!(compare(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await);
    assert!(!compare(&ctx, "SELECT k, count(*) FROM t WHERE v % 3 = 1 GROUP BY k").await);
    // Clustered: 4 rows per key in table order.
    ctx.sql("CREATE TABLE c AS SELECT value / 4 AS k, value AS v FROM generate_series(0, 39999)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    ctx.sql("CREATE INDEX c_k ON c USING mphf (k)").await.unwrap();
    assert!(compare(&ctx, "SELECT k, sum(v) FROM c GROUP BY k").await);
    // A filter that keeps few rows (v < 400: 1 %, estimated from a sample of the table, where
    // DataFusion alone keeps every row through a range predicate) leaves 2 × 10,000 slots for
    // too few rows at the default limit; one that keeps most rows does not.
    ctx.tune(|t| t.aggregate_max_slot_entries_per_row = 4.0);
    assert!(!compare(&ctx, "SELECT k, sum(v) FROM c WHERE v < 400 GROUP BY k").await);
    assert!(compare(&ctx, "SELECT k, sum(v) FROM c WHERE v >= 400 GROUP BY k").await);
    ctx.tune(|t| t.aggregate_min_slots = 20_000);
    assert!(!compare(&ctx, "SELECT k, sum(v) FROM c GROUP BY k").await);
    // 2 partitions × 10,000 slots > 40,000 rows × 0.25.
    ctx.tune(|t| t.aggregate_min_slots = 0);
    ctx.tune(|t| t.aggregate_max_slot_entries_per_row = 0.25);
    assert!(!compare(&ctx, "SELECT k, sum(v) FROM c GROUP BY k").await);
}

/// An unclustered string key runs on the slots when read straight from its table (its index
/// has the decoded MPHF copy, whose verified lookups cost less than hashing strings), and is
/// declined when the aggregate reads it through a join.
#[tokio::test]
async fn costing_takes_unclustered_string_keys_from_a_scan() {
    let ctx = setup(2).await;
    ctx.tune(|t| t.aggregate_min_rows_per_run = 2.0);
    // 6,000 names in scattered order, 4 rows each; NULL every 89th row.
    ctx.sql(
        "CREATE TABLE sn AS SELECT CASE WHEN value % 89 = 0 THEN NULL            ELSE 'name#' || CAST((value * 7919) % 6000 AS VARCHAR) END AS nm, value AS v          FROM generate_series(0, 23999)",
    )
    .await
    .unwrap()
    .collect()
    .await
    .unwrap();
    ctx.sql("CREATE INDEX sn_nm ON sn USING mphf (nm)").await.unwrap();
    assert!(compare(&ctx, "SELECT nm, count(*), sum(v) FROM sn GROUP BY nm").await);
    assert!(compare(&ctx, "SELECT nm, max(v) FROM sn WHERE v % 3 = 1 GROUP BY nm").await);
    // Through a join (each sn row with the t rows of the same v): declined, same results.
    assert!(!compare(&ctx, "SELECT nm, count(*) FROM sn JOIN t ON sn.v = t.v GROUP BY nm").await);
    // The integer key of the same shape without a dense-key table is declined under a filter.
    ctx.tune(|t| t.dense_lookup_max_bytes_per_key = 0.0);
    ctx.sql("CREATE TABLE si AS SELECT (value * 7919) % 6000 AS ik, value AS v FROM generate_series(0, 23999)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    ctx.sql("CREATE INDEX si_ik ON si USING mphf (ik)").await.unwrap();
    assert!(!compare(&ctx, "SELECT ik, count(*) FROM si WHERE v % 3 = 1 GROUP BY ik").await);
    // Straight from the table it reads its row slots, as the string key does.
    assert!(compare(&ctx, "SELECT ik, count(*) FROM si GROUP BY ik").await);
}

/// `setup`'s session plus tables with functional dependences: orders-like `o` (unique key `ok`,
/// columns that follow from it), customers-like `cu` (unique key `ck2`) and lineitem-like `li`
/// (4 rows per order in table order, some NULL keys), each indexed on its key.
async fn setup_dependent(partitions: usize) -> MphfContext {
    let ctx = setup(partitions).await;
    for sql in [
        "CREATE TABLE o AS SELECT value AS ok, value % 50 AS ck, 'cust' || CAST(value % 50 AS VARCHAR) AS nm, \
           CAST(value AS DOUBLE) * 1.5 AS price FROM generate_series(0, 5999)",
        "CREATE TABLE cu AS SELECT value AS ck2, 'name' || CAST(value AS VARCHAR) AS cname FROM generate_series(0, 49)",
        "CREATE TABLE li AS SELECT CASE WHEN value % 101 = 0 THEN NULL ELSE value / 4 END AS lk, value AS qty \
           FROM generate_series(0, 23999)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    for sql in [
        "CREATE INDEX o_ok ON o USING mphf (ok)",
        "CREATE INDEX cu_ck ON cu USING mphf (ck2)",
        "CREATE INDEX li_lk ON li USING mphf (lk)",
    ] {
        ctx.sql(sql).await.unwrap();
    }
    // The join estimates are far below the real row counts (50 for the Q18 shape).
    ctx.tune(|t| {
        t.aggregate_max_slot_entries_per_row = 1e6;
        t.aggregate_max_slot_entries_per_row_partitioned = 1e6;
    });
    ctx
}

/// Multi-column GROUP BYs: whether the columns other than the indexed key provably depend on
/// it decides whether the operator runs; results equal vanilla's either way.
const DEPENDENT_QUERIES: &[(&str, bool)] = &[
    // Same row of a unique key.
    (
        "SELECT ok, ck, nm, count(*), sum(price) FROM o GROUP BY ok, ck, nm",
        true,
    ),
    ("SELECT nm, ok, max(price) FROM o WHERE ck < 10 GROUP BY nm, ok", true),
    ("SELECT ok, ck + 1 AS c1, count(*) FROM o GROUP BY ok, ck + 1", true),
    // Q3's shape: a non-unique key equal (inner join) to a unique key of the other table.
    (
        "SELECT lk, nm, price, sum(qty) FROM li JOIN o ON lk = ok GROUP BY lk, nm, price",
        true,
    ),
    // Q18's shape: through two joins.
    (
        "SELECT cname, ck2, ok, price, sum(qty) FROM cu JOIN o ON ck2 = ck JOIN li ON ok = lk \
         GROUP BY cname, ck2, ok, price",
        true,
    ),
    // No indexed column / the indexed key is not unique / not an inner join: declined.
    ("SELECT ck, nm, count(*) FROM o GROUP BY ck, nm", false),
    ("SELECT lk, qty % 3, count(*) FROM li GROUP BY lk, qty % 3", false),
    (
        "SELECT ok, cname, count(*) FROM o LEFT JOIN cu ON ck = ck2 GROUP BY ok, cname",
        false,
    ),
];

#[tokio::test]
async fn dependent_group_columns_run_on_slots() {
    for partitions in [1, 2, 16] {
        let ctx = setup_dependent(partitions).await;
        for (sql, expect_mphf) in DEPENDENT_QUERIES {
            let ran = compare(&ctx, sql).await;
            let (_, plan) = run(&ctx, sql).await;
            assert_eq!(
                ran, *expect_mphf,
                "MphfAggregateExec presence for {sql} at {partitions} partitions\n{plan}"
            );
        }
    }
    let ctx = setup_dependent(2).await;
    let (_, plan) = run(&ctx, DEPENDENT_QUERIES[0].0).await;
    let line = plan.lines().find(|l| l.contains("MphfAggregateExec")).unwrap();
    assert!(line.contains("mode=SlotMerge") && line.contains("index=o.ok"), "{line}");
}

/// Forced onto group columns that do not depend on the key (`Tuning::aggregate_require_dependence
/// = false`), rows whose other columns differ from their slot's first row get groups of their
/// own, in every partition and across partitions in the slot-range merge.
#[tokio::test]
async fn disagreeing_rows_get_groups_of_their_own() {
    for partitions in [1, 2, 16] {
        let ctx = setup_dependent(partitions).await;
        ctx.tune(|t| t.aggregate_require_dependence = false);
        for sql in [
            "SELECT k, s, count(*), sum(v) FROM t GROUP BY k, s",
            "SELECT s, k, min(d), max(v) FROM t WHERE v % 5 <> 1 GROUP BY s, k",
            "SELECT lk, qty % 3, count(*) FROM li GROUP BY lk, qty % 3",
            "SELECT k, d, s, count(*) FROM t GROUP BY k, d, s HAVING count(*) > 1",
            // Few slots, several groups per slot (compact merge with mismatch groups).
            "SELECT k, s, count(*), sum(v) FROM t WHERE v % 1000 < 3 GROUP BY k, s",
        ] {
            assert!(
                compare(&ctx, sql).await,
                "operator not used for {sql} at {partitions} partitions"
            );
        }
    }
}

/// TPC-H Q3, Q10 and Q18 (SF 0.01, every key indexed, costing off) group by their key and
/// dependent columns on slots, with vanilla's results.
#[tokio::test]
async fn tpch_multi_column_group_bys_run_on_slots() {
    let ctx = MphfContext::with_config(SessionConfig::new().with_target_partitions(2));
    datafusion_mphf::datafusion::tpch::register_tpch(ctx.ctx(), 0.01, 1).unwrap();
    for sql in [
        "CREATE INDEX l_orderkey ON lineitem USING mphf (l_orderkey)",
        "CREATE INDEX o_orderkey ON orders USING mphf (o_orderkey)",
        "CREATE INDEX c_custkey ON customer USING mphf (c_custkey)",
        "CREATE INDEX n_nationkey ON nation USING mphf (n_nationkey)",
    ] {
        ctx.sql(sql).await.unwrap();
    }
    ctx.tune(|t| {
        t.aggregate_min_slots = 0;
        t.aggregate_min_rows_per_run = 0.0;
        t.aggregate_max_slot_entries_per_row = 1000.0;
        t.aggregate_max_slot_entries_per_row_partitioned = 1000.0;
    });
    let q3 = "SELECT l_orderkey, sum(l_extendedprice * (1 - l_discount)) AS revenue, o_orderdate, o_shippriority \
              FROM customer, orders, lineitem \
              WHERE c_mktsegment = 'BUILDING' AND c_custkey = o_custkey AND l_orderkey = o_orderkey \
                AND o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15' \
              GROUP BY l_orderkey, o_orderdate, o_shippriority \
              ORDER BY revenue DESC, o_orderdate LIMIT 10";
    let q10 = "SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name, \
                 c_address, c_phone, c_comment \
               FROM customer, orders, lineitem, nation \
               WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= DATE '1993-10-01' \
                 AND o_orderdate < DATE '1994-01-01' AND l_returnflag = 'R' AND c_nationkey = n_nationkey \
               GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment \
               ORDER BY revenue DESC LIMIT 20";
    let q18 = "SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) \
               FROM customer, orders, lineitem \
               WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300) \
                 AND c_custkey = o_custkey AND o_orderkey = l_orderkey \
               GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice \
               ORDER BY o_totalprice DESC, o_orderdate LIMIT 100";
    for (name, sql, index) in [
        ("Q3", q3, "lineitem.l_orderkey"),
        ("Q10", q10, "customer.c_custkey"),
        ("Q18", q18, "orders.o_orderkey"),
    ] {
        assert!(compare(&ctx, sql).await, "{name} did not use MphfAggregateExec");
        let (_, plan) = run(&ctx, sql).await;
        let multi = plan
            .lines()
            .filter(|l| l.contains("MphfAggregateExec") && l.matches(" as ").count() > 1)
            .collect::<Vec<_>>();
        assert!(
            multi.iter().any(|l| l.contains(&format!("index={index}"))),
            "{name}: no multi-column MphfAggregateExec on {index}:\n{plan}"
        );
    }
}

/// Aggregates the GPU placement supports (integer, float with NULLs, decimal, Int32 columns).
const GPU_QUERIES: &[&str] = &[
    "SELECT k, count(*) FROM t GROUP BY k",
    "SELECT k, count(*), sum(v), min(v), max(v), avg(v) FROM t GROUP BY k",
    "SELECT k, count(nd), sum(nd), min(nd), max(nd), avg(nd), sum(d) FROM t GROUP BY k",
    "SELECT k, sum(m), min(m), max(m), avg(m) FROM t GROUP BY k",
    "SELECT k, min(i), max(i), sum(i) FROM t WHERE v % 3 = 0 GROUP BY k",
    "SELECT k, sum(v) AS sv FROM t GROUP BY k ORDER BY sv DESC, k LIMIT 7",
];

/// The operator line of `plan`.
fn operator_line(plan: &str) -> &str {
    plan.lines()
        .find(|l| l.contains("MphfAggregateExec"))
        .unwrap_or_else(|| panic!("no MphfAggregateExec in\n{plan}"))
}

/// `SET mphf.aggregate_device = 'gpu'` places supported aggregations on the GPU (`device=gpu`
/// in EXPLAIN) and their results equal vanilla DataFusion's: on a GPU, or (CI) through the CPU
/// fallback, and with `Tuning::gpu_emulation` (the placement's whole-input lookup, aggregation and
/// state merging, with the CPU reference of the kernels). Unsupported aggregates stay
/// `device=cpu`. Float columns hold multiples of 0.5, whose sums are exact in any order, so the
/// comparison is exact on a GPU too.
#[tokio::test]
async fn gpu_placement_equals_vanilla() {
    for (partitions, emulation) in [(1, false), (2, false), (16, false), (1, true), (2, true), (16, true)] {
        let ctx = setup(partitions).await;
        ctx.sql("SET mphf.aggregate_device = 'gpu'").await.unwrap();
        ctx.tune(|t| t.gpu_emulation = emulation);
        for sql in GPU_QUERIES {
            assert!(compare(&ctx, sql).await, "{sql}");
            let (_, plan) = run(&ctx, sql).await;
            assert!(operator_line(&plan).contains("device=gpu"), "{sql}:\n{plan}");
        }
        for sql in [
            "SELECT k, count(DISTINCT s) FROM t GROUP BY k",
            "SELECT k, max(s) FROM t GROUP BY k",
            "SELECT mphf_index(k) AS s, count(*) FROM t GROUP BY mphf_index(k)",
        ] {
            assert!(compare(&ctx, sql).await, "{sql}");
            let (_, plan) = run(&ctx, sql).await;
            assert!(operator_line(&plan).contains("device=cpu"), "{sql}:\n{plan}");
        }
        // The placement really ran (emulated) or fell back (no GPU here): the gpu_rows metric.
        let gpu_rows = metric_sum(&ctx, GPU_QUERIES[1], "gpu_rows").await;
        if emulation {
            // Every non-NULL key (the 20,000 rows minus the 206 multiples of 97).
            assert_eq!(gpu_rows, 20_000 - 20_000 / 97);
        } else if datafusion_mphf::placement::gpu_usable().is_err() {
            assert_eq!(gpu_rows, 0);
        }
        // `auto` keeps small inputs on the CPU.
        ctx.sql("SET mphf.aggregate_device = 'auto'").await.unwrap();
        let (_, plan) = run(&ctx, GPU_QUERIES[1]).await;
        assert!(operator_line(&plan).contains("device=cpu"), "{plan}");
    }
}

/// `mphf_index` with `lookup_device = 'gpu'` answers as on the CPU (GPU or fallback), and a
/// device name that is not one gives a clear planning / execution error.
#[tokio::test]
async fn lookup_device_and_bad_device_names() {
    let ctx = setup(2).await;
    let sql = "SELECT k, mphf_index(k) FROM t";
    let (cpu, _) = run(&ctx, sql).await;
    ctx.sql("SET mphf.lookup_device = 'gpu'").await.unwrap();
    let (gpu, _) = run(&ctx, sql).await;
    assert_eq!(cpu, gpu);
    // A bad device is rejected by SET itself and not stored: later statements still run.
    for key in ["lookup_device", "aggregate_device"] {
        let err = ctx
            .sql(&format!("SET mphf.{key} = 'tpu'"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown device 'tpu' (expected auto, cpu or gpu)"),
            "{err}"
        );
    }
    assert_eq!(ctx.config().lookup_device, datafusion_mphf::device::Device::Gpu);
    assert_eq!(ctx.config().aggregate_device, datafusion_mphf::device::Device::Auto);
    let (after, _) = run(&ctx, sql).await;
    assert_eq!(cpu, after);
}

/// Runs `sql` and sums the metric `name` over every `MphfAggregateExec` of its plan.
async fn metric_sum(ctx: &MphfContext, sql: &str, name: &str) -> usize {
    let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    datafusion::physical_plan::collect(plan.clone(), ctx.ctx().task_ctx())
        .await
        .unwrap();
    let mut stack = vec![plan];
    let mut sum = 0;
    while let Some(node) = stack.pop() {
        if node.name() == "MphfAggregateExec" {
            sum += node
                .metrics()
                .and_then(|m| m.sum_by_name(name))
                .map_or(0, |v| v.as_usize());
        }
        stack.extend(node.children().into_iter().cloned());
    }
    sum
}

/// An aggregate whose input is already hash-partitioned on its key (`SinglePartitioned`, after
/// a partitioned join) is costed with `Tuning::aggregate_max_slot_entries_per_row_partitioned`, not
/// the scan's limit; results equal vanilla's either way.
#[tokio::test]
async fn partitioned_input_has_its_own_slot_entries_limit() {
    let ctx = setup_dependent(16).await;
    // A partitioned join (as on large tables), so the GROUP BY's input is partitioned on lk.
    for sql in [
        "SET datafusion.optimizer.hash_join_single_partition_threshold = 0",
        "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
    ] {
        ctx.sql(sql).await.unwrap();
    }
    let sql = DEPENDENT_QUERIES[3].0;
    let (_, plan) = run(&ctx, sql).await;
    let line = operator_line(&plan);
    assert!(line.contains("mode=SinglePartitioned"), "{plan}");
    // 16 partitions × 6,000 slots per estimated row, far above 0.001 (the scan's limit stays).
    ctx.tune(|t| t.aggregate_max_slot_entries_per_row_partitioned = 0.001);
    assert!(!compare(&ctx, sql).await, "{sql}");
    assert!(compare(&ctx, DEPENDENT_QUERIES[0].0).await);
}

/// Field metadata that looks like an index label but was not made by this process (a Parquet
/// column's own `mphf.index` metadata, read with `skip_metadata = false`) names no index: the
/// bare id of a live index, or one with a forged process nonce, is rejected at planning.
#[tokio::test]
async fn foreign_index_labels_name_no_index() {
    use std::sync::Arc;

    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion_mphf::datafusion::INDEX_METADATA_KEY;

    let ctx = MphfContext::new();
    ctx.sql("CREATE TABLE t AS SELECT value AS k FROM generate_series(1, 100)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    ctx.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    let schema = ctx.ctx().table_provider("t").await.unwrap().schema();
    let label = schema.field_with_name("k").unwrap().metadata()[INDEX_METADATA_KEY].clone();
    let (_, id) = label.split_once(':').expect("nonce:id");
    ctx.sql("SET datafusion.execution.parquet.skip_metadata = false")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (i, forged) in [id.to_string(), format!("0000000000000000:{id}")]
        .into_iter()
        .enumerate()
    {
        let md = std::collections::HashMap::from([(INDEX_METADATA_KEY.to_string(), forged.clone())]);
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true).with_metadata(md)
        ]));
        let column: ArrayRef = Arc::new(Int64Array::from_iter_values(1..=100));
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![column]).unwrap();
        let path = dir.path().join(format!("p{i}.parquet"));
        let mut w = parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), schema, None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let name = format!("p{i}");
        ctx.register_parquet(&name, path.to_str().unwrap()).await.unwrap();
        let seen = ctx.ctx().table_provider(name.as_str()).await.unwrap().schema();
        assert_eq!(
            seen.field(0).metadata().get(INDEX_METADATA_KEY),
            Some(&forged),
            "metadata read"
        );
        let err = ctx
            .sql(&format!("SELECT mphf_index(x) FROM {name}"))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("column 'x' has no MPHF index"), "{forged}: {err}");
    }
}

/// An unclustered key with few rows per slot and input partition runs in the range form (rows
/// scattered by slot range, each range aggregated straight to final values), with vanilla's
/// results: NULL keys, all-NULL value groups, dependent columns that disagree with their slot,
/// a key read by an aggregate too, slot keys, string keys, more partitions than ranges, and
/// ranges with more rows than slots where a third of the slots get none (their groups are the
/// slots' offsets, and the untouched slots are not emitted), and offsets over arguments that are
/// not plain columns, NULL for every row of some slots; a clustered key keeps the partials form
/// while their slot arrays fit the cache, and takes the range form beyond it.
#[tokio::test]
async fn unclustered_keys_merge_by_slot_range() {
    for partitions in [2, 3, 16] {
        let ctx = setup_dependent(partitions).await;
        ctx.tune(|t| t.aggregate_require_dependence = false);
        for sql in [
            "CREATE TABLE st AS SELECT 'user-' || CAST(value * 7919 % 6007 AS VARCHAR) AS u, value AS w \
               FROM generate_series(1, 15000)",
            "CREATE INDEX st_u ON st USING mphf (u)",
            "CREATE TABLE few AS SELECT value * 7 % 13 AS fk, value AS fv FROM generate_series(1, 40)",
            "CREATE INDEX few_fk ON few USING mphf (fk)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        ctx.tune(|t| t.aggregate_min_slots = 0);
        for sql in [
            "SELECT k, count(*), sum(v), avg(d), min(v), max(s) FROM t GROUP BY k",
            "SELECT k, sum(nd), avg(nd), min(nd), count(nd) FROM t WHERE v % 11 = 0 OR k % 5 <> 0 GROUP BY k",
            "SELECT k, s, count(*), sum(v) FROM t GROUP BY k, s",
            "SELECT k, sum(k), max(v) FROM t GROUP BY k",
            "SELECT k, sum(v) AS sv FROM t GROUP BY k ORDER BY sv DESC, k LIMIT 7",
            "SELECT k, sum(m), count(*) FROM t WHERE v % 500 = 7 GROUP BY k",
            "SELECT k, count(*), sum(v) FROM t WHERE k % 3 <> 0 GROUP BY k",
            "SELECT k, sum(CASE WHEN k % 4 = 0 THEN NULL ELSE v END), min(v + 1), count(*) FROM t GROUP BY k",
            "SELECT mphf_index(k) AS s, count(*), sum(v) FROM t GROUP BY mphf_index(k)",
            "SELECT u, count(*), max(w) FROM st GROUP BY u",
            "SELECT count(DISTINCT u) FROM st",
            "SELECT fk, count(*), sum(fv) FROM few GROUP BY fk",
        ] {
            assert!(
                compare(&ctx, sql).await,
                "operator not used for {sql} at {partitions} partitions"
            );
            let (_, plan) = run(&ctx, sql).await;
            assert!(
                operator_line(&plan).contains("form=ranges"),
                "{sql} at {partitions} partitions:\n{plan}"
            );
        }
        let sql = "SELECT lk, count(*), sum(qty) FROM li GROUP BY lk";
        assert!(compare(&ctx, sql).await);
        let (_, plan) = run(&ctx, sql).await;
        assert!(operator_line(&plan).contains("form=partials"), "{plan}");
        // Once the partials' slot arrays outgrow the cache (here a 64 KiB one), the model moves
        // the clustered key's rows to the range form, with the same rows.
        ctx.tune(|t| t.assign("cache_bytes", "65536").unwrap());
        assert!(compare(&ctx, sql).await);
        let (_, plan) = run(&ctx, sql).await;
        assert!(operator_line(&plan).contains("form=ranges"), "{plan}");
    }
}

/// The slot-entries limit weighs the partitions' slot arrays against the rows; the range form
/// keeps no per-partition arrays, so its slots count once: a filter leaving 2,000 rows of an
/// unclustered key with 6,000 slots (declined in the partials form at 2 and 16 partitions:
/// P × 6,000 > 2,000 × 4) runs in the range form, while 200 rows (6,000 > 200 × 4) stay
/// declined.
#[tokio::test]
async fn range_form_counts_its_slots_once() {
    for partitions in [2, 16] {
        let ctx = setup(partitions).await;
        ctx.tune(|t| t.aggregate_max_slot_entries_per_row = 4.0);
        let sql = "SELECT k, count(*), sum(v) FROM t WHERE v % 10 = 3 GROUP BY k";
        assert!(compare(&ctx, sql).await, "{sql} at {partitions} partitions");
        let (_, plan) = run(&ctx, sql).await;
        assert!(operator_line(&plan).contains("form=ranges"), "{plan}");
        let sql = "SELECT k, count(*), sum(v) FROM t WHERE v % 100 = 3 GROUP BY k";
        assert!(!compare(&ctx, sql).await, "{sql} at {partitions} partitions");
    }
}

/// A final aggregate whose hash partitioning a partitioned join above needs (the `IN`
/// subquery's GROUP BY, as in TPC-H Q18) stays per partition, while the plan's other GROUP BY
/// still runs as the slot-range merge: one merge that would break a node above costs no other
/// merge of the plan.
#[tokio::test]
async fn a_merge_that_breaks_a_join_above_leaves_the_other_merges() {
    let ctx = setup(4).await;
    for sql in [
        "SET datafusion.optimizer.hash_join_single_partition_threshold = 0",
        "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
        "CREATE INDEX t_i ON t USING mphf (i)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    let sql =
        "SELECT i, count(*), sum(v) FROM t WHERE k IN (SELECT k FROM t GROUP BY k HAVING count(*) > 3) GROUP BY i";
    assert!(compare(&ctx, sql).await, "{sql}");
    let (_, plan) = run(&ctx, sql).await;
    assert!(plan.contains("HashJoinExec: mode=Partitioned"), "{plan}");
    let lines = |index: &str| -> Vec<&str> {
        plan.lines()
            .filter(|l| l.contains("MphfAggregateExec") && l.contains(index))
            .collect()
    };
    assert!(
        lines("index=t.i").iter().any(|l| l.contains("mode=SlotMerge")),
        "{plan}"
    );
    assert!(
        !lines("index=t.k").iter().any(|l| l.contains("mode=SlotMerge")),
        "{plan}"
    );
}

/// A partial left per partition (a partitioned join above needs the aggregate's hash
/// partitioning, which the slot-range merge breaks) over an unclustered key whose rows are
/// mostly distinct in DataFusion's skip probe is declined: DataFusion's own partial hands its
/// rows on, and ours would add its groups to the final aggregation's work (TPC-H Q17 at SF 10).
/// With the probe off, DataFusion's partial aggregates too, and the same node is taken.
#[tokio::test]
async fn unmerged_partials_give_way_where_datafusion_skips_its_partial() {
    let ctx = MphfContext::with_config(SessionConfig::new().with_target_partitions(2).with_batch_size(1024));
    for sql in [
        "SET datafusion.optimizer.hash_join_single_partition_threshold = 0",
        "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
        "SET datafusion.execution.skip_partial_aggregation_probe_rows_threshold = 1000",
        "CREATE TABLE u AS SELECT value * 7919 % 20000 AS k, value AS v FROM generate_series(0, 19999)",
        "CREATE TABLE w AS SELECT value * 3 AS k, value AS x FROM generate_series(0, 9999)",
        "CREATE INDEX u_k ON u USING mphf (k)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    ctx.tune(|t| t.aggregate_min_slots = 0);
    let sql = "SELECT a.k, a.c, a.s, w.x FROM (SELECT k, count(*) AS c, sum(v) AS s FROM u GROUP BY k) a \
               JOIN w ON a.k = w.k";
    assert!(!compare(&ctx, sql).await, "declined while DataFusion skips its partial");
    let (_, plan) = run(&ctx, sql).await;
    assert!(plan.contains("HashJoinExec: mode=Partitioned"), "{plan}");
    let declined = plan
        .lines()
        .find(|l| l.contains("MphfDeclined"))
        .unwrap_or_else(|| panic!("no decline in\n{plan}"));
    assert!(
        declined.contains(
            "reason=the slot-range merge breaks a distribution or ordering a node above requires; \
             per partition: DataFusion's hash aggregation is estimated cheaper, cost="
        ),
        "{declined}"
    );
    ctx.sql("SET datafusion.execution.skip_partial_aggregation_probe_ratio_threshold = 1.0")
        .await
        .unwrap();
    assert!(compare(&ctx, sql).await, "taken while DataFusion's partial aggregates");
    let (_, plan) = run(&ctx, sql).await;
    // Per partition, and so is the final aggregate above the exchange: it merges the partials
    // by slot and keeps the key's hash partitioning, which the join needs.
    assert!(plan.contains("MphfAggregateExec: mode=Partial"), "{plan}");
    assert!(plan.contains("MphfAggregateExec: mode=FinalPartitioned"), "{plan}");
    assert!(plan.contains("HashJoinExec: mode=Partitioned"), "{plan}");
}

/// The extension has nine settings, all listed under their `mphf.` names by `SHOW ALL` and
/// `information_schema.df_settings`; a name that used to be a setting is refused with its
/// replacement; `mphf.costing` decides whether the thresholds apply.
#[tokio::test]
async fn settings_are_nine_listed_and_old_names_name_their_replacement() {
    let ctx = setup(2).await;
    ctx.sql("SET datafusion.catalog.information_schema = true")
        .await
        .unwrap();
    let listed = |sql: &'static str| {
        let ctx = &ctx;
        async move {
            let batches = ctx.sql(sql).await.unwrap().collect().await.unwrap();
            let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
                .unwrap()
                .to_string();
            let mut names: Vec<String> = text
                .lines()
                .filter_map(|l| l.split('|').nth(1).map(str::trim))
                .filter(|n| n.starts_with("mphf"))
                .map(String::from)
                .collect();
            names.sort();
            names
        }
    };
    let expected = [
        "mphf.aggregate_device",
        "mphf.costing",
        "mphf.enable_aggregate",
        "mphf.enable_join",
        "mphf.index_dir",
        "mphf.lookup_device",
        "mphf.on_stale",
        "mphf.persist",
        "mphf.verbose",
    ];
    assert_eq!(listed("SHOW ALL").await, expected);
    assert_eq!(
        listed("SELECT name FROM information_schema.df_settings").await,
        expected
    );
    ctx.sql("SET mphf.costing = 'never'").await.unwrap();
    let shown = ctx.sql("SHOW mphf.costing").await.unwrap().collect().await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&shown)
        .unwrap()
        .to_string();
    assert!(text.contains("| mphf.costing | never |"), "{text}");

    let err = |sql: &'static str| {
        let ctx = &ctx;
        async move { ctx.sql(sql).await.unwrap_err().to_string() }
    };
    assert_eq!(
        err("SET mphf.join_min_slots = 0").await,
        "Invalid or Unsupported Configuration: mphf.join_min_slots is no longer a setting: use mphf.costing = \
         'auto' | 'always' | 'never' (the planner's thresholds apply, are bypassed, or no operator is \
         replaced); the threshold itself is Tuning::join_min_slots, set through the Rust API (MphfContext::tune)"
    );
    assert_eq!(
        err("SET mphf.gpu_emulation = true").await,
        "Invalid or Unsupported Configuration: mphf.gpu_emulation is no longer a setting: it is \
         Tuning::gpu_emulation, set through the Rust API (MphfContext::tune)"
    );
    assert!(err("SET mphf.bogus = 1").await.contains(
        "unknown setting mphf.bogus (the settings are mphf.index_dir, mphf.persist, mphf.on_stale, mphf.verbose, \
         mphf.enable_aggregate, mphf.enable_join, mphf.aggregate_device, mphf.lookup_device, mphf.costing)"
    ));
    assert!(err("SET mphf.costing = 'sometimes'")
        .await
        .contains("unknown costing mode 'sometimes' (expected auto, always or never)"));
    assert!(err("SET mphf_tuning.join_min_slots = 0")
        .await
        .contains("mphf_tuning.join_min_slots is not a setting"));

    // 1000 keys, fewer slots than `Tuning::aggregate_min_slots`: `auto` declines them (a hash
    // table that small stays in cache), `always` runs them on slots, `never` replaces nothing.
    let sql = "SELECT k, count(*) FROM t GROUP BY k";
    let fresh = MphfContext::with_config(SessionConfig::new().with_target_partitions(2));
    fresh
        .sql("CREATE TABLE t AS SELECT value % 1000 AS k FROM generate_series(1, 20000)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    fresh.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    for (mode, on_slots) in [("auto", false), ("always", true), ("never", false)] {
        fresh.sql(&format!("SET mphf.costing = '{mode}'")).await.unwrap();
        let (_, plan) = run(&fresh, sql).await;
        assert_eq!(
            plan.contains("MphfAggregateExec"),
            on_slots,
            "costing = {mode}:\n{plan}"
        );
    }
    // `never` wins over a tuning that would take everything.
    fresh.tune(|t| *t = t.clone().without_thresholds());
    let (_, plan) = run(&fresh, sql).await;
    assert!(!plan.contains("MphfAggregateExec"), "{plan}");
}

/// `EXPLAIN` prices every MPHF aggregate (`cost=… vs hash …`) and shows, over every candidate
/// left to DataFusion, the reason in the words of the threshold that declined it; with
/// `mphf.costing = never` nothing is a candidate.
#[tokio::test]
async fn explain_prices_nodes_and_names_each_decline() {
    let ctx = setup(2).await;
    let line_of = |plan: &str, what: &str| -> String {
        plan.lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no {what} in\n{plan}"))
            .trim()
            .to_string()
    };
    let (_, plan) = run(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await;
    let line = line_of(&plan, "MphfAggregateExec");
    assert!(
        line.contains(", cost=") && line.contains("ms vs hash ") && line.ends_with("ms"),
        "{line}"
    );
    assert!(!plan.contains("MphfDeclined"), "{plan}");

    ctx.tune(|t| t.aggregate_min_slots = 20_000);
    let (_, plan) = run(&ctx, "SELECT k, count(*) FROM t GROUP BY k").await;
    let line = line_of(&plan, "MphfDeclined");
    assert!(
        line.starts_with(
            "MphfDeclined: reason=6000 slots, fewer than aggregate_min_slots (20000): the hash table stays in cache, cost="
        ),
        "{line}"
    );
    // The node under the annotation is the declined aggregate (a Partial, under the final one).
    let below = plan.lines().skip_while(|l| !l.contains("MphfDeclined")).nth(1).unwrap();
    assert!(below.trim().starts_with("AggregateExec: mode=Partial"), "{plan}");
    ctx.tune(|t| t.aggregate_min_slots = 0);

    // Without its dense-key table, an unclustered key read through a filter costs an MPHF
    // query per row.
    ctx.tune(|t| {
        t.dense_lookup_max_bytes_per_key = 0.0;
        t.aggregate_min_rows_per_run = 2.0;
    });
    ctx.sql("DROP INDEX t_k").await.unwrap();
    ctx.sql("CREATE INDEX t_k ON t USING mphf (k)").await.unwrap();
    let (_, plan) = run(&ctx, "SELECT k, count(*) FROM t WHERE v % 3 = 1 GROUP BY k").await;
    let line = line_of(&plan, "MphfDeclined");
    assert!(
        line.starts_with("MphfDeclined: reason=unclustered key (1.0 rows per run, fewer than 2) with "),
        "{line}"
    );
    assert!(line.contains(" lookups: one MPHF query per row, cost="), "{line}");

    // A second group column that does not depend on the key.
    let (_, plan) = run(&ctx, "SELECT k, s, count(*) FROM t GROUP BY k, s").await;
    assert_eq!(
        line_of(&plan, "MphfDeclined"),
        "MphfDeclined: reason=the other group columns are not proven to depend on the indexed one"
    );

    // No candidates at all under `never`, nor for a key without an index.
    ctx.sql("SET mphf.costing = 'never'").await.unwrap();
    let (_, plan) = run(&ctx, "SELECT k, count(*) FROM t WHERE v % 3 = 1 GROUP BY k").await;
    assert!(
        !plan.contains("MphfDeclined") && !plan.contains("MphfAggregateExec"),
        "{plan}"
    );
    ctx.sql("SET mphf.costing = 'auto'").await.unwrap();
    let (_, plan) = run(&ctx, "SELECT s, count(*) FROM t GROUP BY s").await;
    assert!(!plan.contains("MphfDeclined"), "{plan}");
}

/// The range form (one node in place of the partial and final aggregates) reports the final
/// aggregate's statistics over the whole input, as DataFusion's final aggregate does; its
/// slot-range partitions report unknown statistics.
#[tokio::test]
async fn the_range_form_reports_the_final_aggregates_statistics() {
    use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
    let ctx = setup_dependent(2).await;
    ctx.tune(|t| {
        t.aggregate_require_dependence = false;
        t.aggregate_min_slots = 0;
    });
    let sql = "SELECT k, count(*), sum(v) FROM t GROUP BY k";
    let stats_at = |plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>, partition| {
        StatisticsContext::new()
            .compute(plan.as_ref(), &StatisticsArgs::new().with_partition(partition))
            .unwrap()
    };
    ctx.sql("SET mphf.enable_aggregate = false").await.unwrap();
    let vanilla = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let final_agg = find_node(&vanilla, "AggregateExec").expect("vanilla's final aggregate");
    ctx.sql("SET mphf.enable_aggregate = true").await.unwrap();
    let (_, text) = run(&ctx, sql).await;
    assert!(operator_line(&text).contains("form=ranges"), "{text}");
    let ours = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let merged = find_node(&ours, "MphfAggregateExec").expect("the range form");
    let (want, got) = (stats_at(&final_agg, None), stats_at(&merged, None));
    assert!(got.num_rows.get_value().is_some(), "{got:?}");
    assert_eq!(got.num_rows, want.num_rows);
    assert_eq!(got.column_statistics.len(), merged.schema().fields().len());
    assert_eq!(stats_at(&merged, Some(0)).num_rows.get_value(), None);
}
