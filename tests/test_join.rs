//! Joins on MPHF-indexed keys: every query runs with `mphf.enable_join` off and on, the sorted
//! results must be identical, and with the rule on the plan must (or must not) contain
//! `MphfJoinExec`, in the expected form.

#![cfg(feature = "datafusion")]

mod sql_common;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::SessionConfig;
use datafusion_mphf::datafusion::MphfContext;
use sql_common::{find_node, run};

/// `dim` (8,000 unique ids, one NULL, a string key), `fact` (30,000 rows: repeated ids, NULLs,
/// ids missing from `dim`), `big` (60,000 rows), indexes on `dim.id`, `dim.name`, `fact.id`.
async fn setup(partitions: usize, partitioned_joins: bool) -> MphfContext {
    let mut config = SessionConfig::new()
        .with_target_partitions(partitions)
        .with_batch_size(1000);
    if partitioned_joins {
        let opts = config.options_mut();
        opts.optimizer.hash_join_single_partition_threshold = 0;
        opts.optimizer.hash_join_single_partition_threshold_rows = 0;
    }
    let ctx = MphfContext::with_config(config);
    for sql in [
        "CREATE TABLE dim AS SELECT value AS id, 'name' || value AS name, value % 7 AS grp \
         FROM generate_series(0, 7999) UNION ALL SELECT NULL, 'nul', 0",
        "CREATE TABLE fact AS SELECT value AS fid, \
           CASE WHEN value % 97 = 0 THEN NULL ELSE value % 9000 END AS id, value * 3 AS v, \
           'name' || (value % 9500) AS name FROM generate_series(1, 30000)",
        "CREATE TABLE big AS SELECT value AS bid, value % 9100 AS k FROM generate_series(1, 60000)",
        "CREATE INDEX dim_id ON dim USING mphf (id)",
        "CREATE INDEX dim_name ON dim USING mphf (name)",
        "CREATE INDEX fact_id ON fact USING mphf (id)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    ctx.tune(|t| {
        t.join_yield_to_array_map = false;
        t.join_min_probe_rows_per_run = 0.0;
        t.compare_costs = false;
    });
    ctx
}

/// Runs one statement that returns no rows worth checking (DDL, SET).
async fn run_statement(ctx: &MphfContext, sql: &str) {
    ctx.sql(sql).await.unwrap().collect().await.unwrap();
}

/// The text of `EXPLAIN ANALYZE sql` (the plan with its metrics).
async fn explain_analyze(ctx: &MphfContext, sql: &str) -> String {
    let df = ctx.sql(&format!("EXPLAIN ANALYZE {sql}")).await.unwrap();
    pretty_format_batches(&df.collect().await.unwrap()).unwrap().to_string()
}

/// Runs `sql` with the rule off and on, asserts equal results and returns the MPHF plan.
async fn compare(ctx: &MphfContext, sql: &str) -> String {
    ctx.sql("SET mphf.enable_join = false").await.unwrap();
    let (off, off_plan) = run(ctx, sql).await;
    assert!(!off_plan.contains("MphfJoinExec"), "{off_plan}");
    ctx.sql("SET mphf.enable_join = true").await.unwrap();
    let (on, on_plan) = run(ctx, sql).await;
    assert_eq!(off, on, "results differ for {sql}\nplan:\n{on_plan}");
    on_plan
}

/// (query, whether `MphfJoinExec` must run)
const QUERIES: &[(&str, bool)] = &[
    ("SELECT count(*), sum(f.v), sum(d.grp) FROM fact f JOIN dim d ON f.id = d.id", true),
    ("SELECT f.fid, d.name FROM fact f JOIN dim d ON f.id = d.id WHERE f.fid % 1000 = 7", true),
    ("SELECT d.id, count(f.fid) FROM dim d LEFT JOIN fact f ON d.id = f.id GROUP BY d.id ORDER BY 2 DESC, 1 LIMIT 20", true),
    ("SELECT count(*), count(d.id), sum(f.v) FROM fact f LEFT JOIN dim d ON f.id = d.id", true),
    ("SELECT count(*), count(d.id), count(f.fid) FROM dim d FULL JOIN fact f ON d.id = f.id", true),
    ("SELECT count(*) FROM fact f WHERE EXISTS (SELECT 1 FROM dim d WHERE d.id = f.id AND d.grp = 2)", true),
    ("SELECT count(*) FROM fact f WHERE NOT EXISTS (SELECT 1 FROM dim d WHERE d.id = f.id)", true),
    ("SELECT count(*), sum(d.id) FROM dim d WHERE NOT EXISTS (SELECT 1 FROM fact f WHERE f.id = d.id)", true),
    ("SELECT count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id AND f.v % 7 > d.grp", true),
    ("SELECT count(*), sum(f.fid) FROM fact f JOIN dim d ON f.id = d.id AND f.name = d.name", true),
    ("SELECT count(*), sum(f.fid) FROM fact f JOIN dim d ON f.name = d.name", true),
    ("SELECT count(*), sum(b.bid) FROM big b JOIN fact f ON b.k = f.id", true),
    ("SELECT count(*), count(f.fid) FROM big b LEFT JOIN fact f ON b.k = f.id", true),
    // null-aware anti join (NOT IN) stays DataFusion's
    ("SELECT count(*) FROM fact f WHERE f.id NOT IN (SELECT id FROM dim WHERE id IS NOT NULL)", false),
    // the join key is an expression of the indexed column, not the column
    ("SELECT count(*) FROM big b JOIN dim d ON b.k = d.id + 1", false),
];

async fn check_all(partitions: usize, partitioned_joins: bool) {
    let ctx = setup(partitions, partitioned_joins).await;
    // Every form at any partition count (by default one-for-one tables stop at 4 partitions).
    ctx.tune(|t| t.join_partitioned_max_partitions = 0);
    for &(sql, expect) in QUERIES {
        let plan = compare(&ctx, sql).await;
        assert_eq!(
            plan.contains("MphfJoinExec"),
            expect,
            "partitions {partitions}, partitioned {partitioned_joins}: {sql}\n{plan}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_match_vanilla_on_one_partition() {
    check_all(1, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_match_vanilla_on_two_partitions() {
    check_all(2, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_joins_match_vanilla_on_sixteen_partitions() {
    check_all(16, true).await;
    // By default 16 per-partition slot tables are declined; with no limit they are taken.
    let ctx = setup(16, true).await;
    let sql = "SELECT d.id, count(f.fid) FROM dim d LEFT JOIN fact f ON d.id = f.id GROUP BY d.id ORDER BY 2 DESC, 1 LIMIT 20";
    let plan = compare(&ctx, sql).await;
    assert!(!plan.contains("MphfJoinExec"), "{plan}");
    assert!(plan.contains("and the one-for-one form was declined"), "{plan}");
    ctx.tune(|t| t.join_partitioned_max_partitions = 0);
    let plan = compare(&ctx, sql).await;
    assert!(plan.contains("MphfJoinExec: mode=Partitioned"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_join_runs_collected_without_repartitions() {
    let ctx = setup(4, true).await;
    let plan = compare(&ctx, "SELECT count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id").await;
    assert!(plan.contains("MphfJoinExec: mode=CollectLeft"), "{plan}");
    assert!(!plan.contains("RepartitionExec: partitioning=Hash"), "{plan}");
    // Under a GROUP BY on a build-side column with many values (d.name: 8,001, known from its
    // index) the probe side stays hash partitioned on the key, so each group is in one
    // partition of the partial aggregate; the build side is collected.
    let plan = compare(
        &ctx,
        "SELECT d.name, count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id GROUP BY d.name",
    )
    .await;
    let join_at = plan.find("MphfJoinExec: mode=CollectLeft").expect("collect form");
    let below = &plan[join_at..];
    assert!(below.contains("RepartitionExec: partitioning=Hash([id@"), "{plan}");
    assert!(below.contains("CoalescePartitionsExec"), "{plan}");
    // With few groups (d.grp: 7 values, seen in a sample of dim) every partition holds every
    // group anyway: the probe side is read in its own partitions, not repartitioned.
    let plan = compare(
        &ctx,
        "SELECT d.grp, count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id GROUP BY d.grp",
    )
    .await;
    assert!(plan.contains("MphfJoinExec: mode=CollectLeft"), "{plan}");
    assert!(!plan.contains("RepartitionExec: partitioning=Hash([id@"), "{plan}");
    // A parent that needs the join's hash partitioning keeps the one-for-one form.
    let plan = compare(
        &ctx,
        "SELECT f.id, count(*) FROM fact f JOIN dim d ON f.id = d.id GROUP BY f.id ORDER BY 2 DESC, 1 LIMIT 5",
    )
    .await;
    assert!(plan.contains("MphfJoinExec"), "{plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costing_yields_to_array_map_and_small_indexes() {
    let ctx = setup(1, false).await;
    ctx.tune(|t| t.join_yield_to_array_map = true);
    // dim.id is 0..7999 and dense: DataFusion's ArrayMap wins, the rule declines.
    let plan = compare(&ctx, "SELECT count(*) FROM fact f JOIN dim d ON f.id = d.id").await;
    assert!(!plan.contains("MphfJoinExec"), "{plan}");
    // EXPLAIN says why, over the declined join.
    assert!(
        plan.contains(
            "MphfDeclined: reason=DataFusion runs this join with its dense-integer ArrayMap, one array read per row\n"
        ),
        "{plan}"
    );
    // a string key has no ArrayMap, but its unclustered probe costs an MPHF query per row
    let plan = compare(&ctx, "SELECT count(*) FROM fact f JOIN dim d ON f.name = d.name").await;
    let line = plan.lines().find(|l| l.contains("MphfJoinExec")).expect("operator");
    assert!(line.contains(", cost=") && line.contains("ms vs hash "), "{line}");
    assert!(!plan.contains("MphfDeclined"), "{plan}");
    ctx.tune(|t| t.join_min_probe_rows_per_run = 2.0);
    let plan = compare(&ctx, "SELECT count(*) FROM fact f JOIN dim d ON f.name = d.name").await;
    assert!(!plan.contains("MphfJoinExec"), "{plan}");
    assert!(
        plan.contains("MphfDeclined: reason=no dense key table and an unclustered probe key (1.0 rows per run, fewer than 2): one MPHF query per probe row, cost="),
        "{plan}"
    );
    ctx.tune(|t| t.join_min_probe_rows_per_run = 0.0);
    ctx.tune(|t| t.join_min_slots = 100_000);
    let plan = compare(&ctx, "SELECT count(*) FROM fact f JOIN dim d ON f.name = d.name").await;
    assert!(!plan.contains("MphfJoinExec"), "{plan}");
    assert!(
        plan.contains(" slots, fewer than join_min_slots (100000): the hash table stays in cache\n"),
        "{plan}"
    );
    // Only the probe key indexed (DataFusion keeps the written order): the rule tried the join
    // swapped, and the reason says so.
    run_statement(&ctx, "SET datafusion.optimizer.join_reordering = false").await;
    let plan = compare(
        &ctx,
        "SELECT count(*) FROM (SELECT k FROM big WHERE bid <= 100) s JOIN fact f ON s.k = f.id",
    )
    .await;
    assert!(!plan.contains("MphfJoinExec"), "{plan}");
    assert!(
        plan.contains(
            "MphfDeclined: reason=swapped: 9000 slots, fewer than join_min_slots (100000): the hash table stays in cache\n"
        ),
        "{plan}"
    );
    run_statement(&ctx, "SET datafusion.optimizer.join_reordering = true").await;
}

/// Under `Tuning::compare_costs` the cost model decides between the forms that pass the
/// thresholds and DataFusion's hash join: a small build read once for 16 probe partitions
/// pays the collected build's fixed cost (`slot_join_call_ns`), which per-partition hash tables
/// do not, and is declined; priced without it, the collect form runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cost_model_decides_between_slots_and_the_hash_join() {
    let ctx = setup(16, true).await;
    ctx.tune(|t| t.compare_costs = true);
    let sql = "SELECT count(*), sum(f.v), sum(d.grp) FROM fact f JOIN dim d ON f.id = d.id";
    let plan = compare(&ctx, sql).await;
    assert!(!plan.contains("MphfJoinExec"), "{plan}");
    let declined = plan.lines().find(|l| l.contains("MphfDeclined")).expect("annotated");
    assert!(
        declined.contains("; collect form: DataFusion's hash join is estimated cheaper, cost="),
        "{declined}"
    );
    // dim's hash tables (500 rows per partition) stay in the cores' caches; priced as if they
    // did not, and without the collected build's fixed cost, the collect form runs.
    ctx.tune(|t| {
        t.costs.slot_join_call_ns = 1.0;
        t.costs.slot_build_row_ns = 1.0;
        t.costs.hash_probe_cached_ns = t.costs.hash_probe_fixed_ns;
    });
    let plan = compare(&ctx, sql).await;
    let line = plan.lines().find(|l| l.contains("MphfJoinExec")).expect("operator");
    assert!(line.contains("mode=CollectLeft"), "{line}");
    assert!(!plan.contains("MphfDeclined"), "{plan}");
}

/// A probe key that has its own index on an in-memory table gets its slots from that index's
/// row slots, translated into the build index's (once per distinct key): the rule takes it
/// although it is unclustered, also across a cast to the build key's type, and every probe
/// row is translated. A filter on the probe side hands the join new arrays: declined.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_probe_keys_translate_their_slots() {
    for partitions in [1, 2, 16] {
        let ctx = setup(partitions, partitions == 16).await;
        ctx.tune(|t| t.join_min_probe_rows_per_run = 2.0);
        for sql in [
            "CREATE INDEX fact_name ON fact USING mphf (name)",
            "CREATE TABLE dimv AS SELECT arrow_cast(name, 'Utf8View') AS vname, grp FROM dim",
            "CREATE INDEX dimv_vname ON dimv USING mphf (vname)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        for (sql, build) in [
            (
                "SELECT count(*), sum(f.v), max(d.grp) FROM fact f JOIN dim d ON f.name = d.name",
                "dim.name",
            ),
            (
                "SELECT count(*), sum(f.v), min(d.grp) FROM fact f JOIN dimv d ON f.name = d.vname",
                "dimv.vname",
            ),
            (
                "SELECT count(*), count(d.grp), sum(f.v) FROM fact f LEFT JOIN dim d ON f.name = d.name",
                "dim.name",
            ),
        ] {
            let plan = compare(&ctx, sql).await;
            let line = plan.lines().find(|l| l.contains("MphfJoinExec")).unwrap_or_default();
            assert!(
                line.contains(&format!("index={build}")) && line.contains("probe_index=fact.name"),
                "{partitions} partitions, {sql}:\n{plan}"
            );
        }
        let text = explain_analyze(&ctx, "SELECT count(*) FROM fact f JOIN dimv d ON f.name = d.vname").await;
        assert!(text.contains("probe_translated_rows=30.00 K"), "{text}");
        let kept = ["translations_made=0,", "translations_made=0]"];
        assert!(
            kept.iter().any(|m| text.contains(m)),
            "kept from the join above: {text}"
        );
        // A new build index makes its own translation, once for all partitions.
        for sql in [
            "DROP INDEX dimv_vname",
            "CREATE INDEX dimv_vname ON dimv USING mphf (vname)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        let text = explain_analyze(&ctx, "SELECT count(*) FROM fact f JOIN dimv d ON f.name = d.vname").await;
        let made_once = ["translations_made=1,", "translations_made=1]"];
        assert!(made_once.iter().any(|m| text.contains(m)), "{text}");
        assert!(text.contains("probe_translated_rows=30.00 K"), "{text}");
        let plan = compare(
            &ctx,
            "SELECT count(*) FROM (SELECT name FROM fact WHERE v % 2 = 0) f JOIN dim d ON f.name = d.name",
        )
        .await;
        assert!(!plan.contains("MphfJoinExec"), "{plan}");
    }
}

/// Joins whose output needs only which probe rows have a partner (right semi and anti joins,
/// inner joins that output probe columns alone over a build key without duplicates) test the
/// build's bitmap of occupied slots, in the probe key's own slots where it has an index, and
/// give vanilla's rows; a join that outputs a build column, or whose build key repeats, keeps
/// the slot table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_probes_test_the_occupied_slots() {
    let translated = "SELECT count(*), sum(f.v) FROM fact f JOIN dim d ON f.name = d.name WHERE d.grp = 1";
    for partitions in [1, 2, 16] {
        let ctx = setup(partitions, partitions == 16).await;
        ctx.tune(|t| t.join_partitioned_max_partitions = 0);
        run_statement(&ctx, "CREATE INDEX fact_name ON fact USING mphf (name)").await;
        for (sql, membership) in [
            ("SELECT count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id", Some(true)),
            (
                "SELECT f.fid, f.v FROM fact f JOIN dim d ON f.id = d.id WHERE d.grp = 3 ORDER BY f.fid LIMIT 70",
                Some(true),
            ),
            (translated, Some(true)),
            ("SELECT count(*), sum(f.v), sum(d.grp) FROM fact f JOIN dim d ON f.id = d.id", Some(false)),
            ("SELECT count(*), sum(b.bid) FROM big b JOIN fact f ON b.k = f.id", Some(false)),
            // Semi and anti joins: the side DataFusion builds decides the join type.
            (
                "SELECT count(*), sum(f.v) FROM fact f WHERE EXISTS (SELECT 1 FROM dim d WHERE d.id = f.id AND d.grp = 2)",
                None,
            ),
            (
                "SELECT count(*), sum(f.v) FROM fact f WHERE NOT EXISTS (SELECT 1 FROM dim d WHERE d.id = f.id AND d.grp < 5)",
                None,
            ),
            (
                "SELECT count(*) FROM fact f WHERE f.name IN (SELECT name FROM dim WHERE grp > 4)",
                None,
            ),
        ] {
            let plan = compare(&ctx, sql).await;
            let line = plan.lines().find(|l| l.contains("MphfJoinExec")).unwrap_or_default();
            let expected = membership.unwrap_or(line.contains("RightSemi") || line.contains("RightAnti"));
            assert!(line.contains("MphfJoinExec"), "{partitions} partitions, {sql}:\n{plan}");
            assert_eq!(
                line.contains("probe=membership"),
                expected,
                "{partitions} partitions, {sql}:\n{plan}"
            );
        }
        let text = explain_analyze(&ctx, translated).await;
        for needle in [
            "probe=membership",
            "probe_member_rows=30.00 K",
            "probe_translated_rows=30.00 K",
        ] {
            assert!(
                text.contains(needle),
                "{partitions} partitions, missing {needle}:\n{text}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_build_and_lookup_metrics() {
    let ctx = setup(2, false).await;
    let text = explain_analyze(&ctx, "SELECT count(*) FROM big b JOIN fact f ON b.k = f.id").await;
    for needle in [
        "MphfJoinExec",
        "index=fact.id",
        "build_rows=30.00 K",
        "build_csr_layout=1",
        "lookup_time",
        "probe_rows=60.00 K",
        "probe_rows_read_ahead",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_build_sides_lay_out_their_table_by_position() {
    let ctx = setup(2, false).await;
    // fact.id has 9,000 slots. Every 50th fact row is 600 build rows whose ids repeat (fid and
    // fid + 9,000 share one), the first 180 of them have distinct ids: both occupy fewer than a
    // quarter of the slots. The index says fact.id repeats; the ranked form counts exactly.
    for (filter, csr) in [("fid % 50 = 0", 1), ("fid % 50 = 0 AND fid <= 9000", 0)] {
        let sql = format!(
            "SELECT count(*), sum(b.bid), sum(f.v) FROM big b JOIN (SELECT * FROM fact WHERE {filter}) f ON b.k = f.id"
        );
        compare(&ctx, &sql).await;
        let text = explain_analyze(&ctx, &sql).await;
        for needle in [
            "MphfJoinExec",
            "build_ranked_layout=1",
            &format!("build_csr_layout={csr}"),
        ] {
            assert!(text.contains(needle), "missing {needle}:\n{text}");
        }
    }
    // The whole of fact fills the table by slot.
    let text = explain_analyze(&ctx, "SELECT count(*) FROM big b JOIN fact f ON b.k = f.id").await;
    assert!(text.contains("build_ranked_layout=0"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_side_from_a_join_is_declined() {
    let ctx = setup(2, false).await;
    // x.id carries dim.id's index label but went through a join (keys may repeat): only the
    // inner join runs on slots.
    let plan = compare(
        &ctx,
        "SELECT count(*), sum(b.bid) FROM (SELECT d.id FROM dim d JOIN fact f ON d.id = f.id) x \
         JOIN big b ON x.id = b.k",
    )
    .await;
    assert_eq!(plan.matches("MphfJoinExec").count(), 1, "{plan}");
}

/// A partial aggregate that groups by build-side columns over an inner MPHF join runs fused
/// with it (`MphfGroupJoinExec`): each build row's group is found once, and each matching pair
/// adds to it. Rows equal vanilla's for every shape below, at 1, 2 and 4 partitions and with
/// partitioned joins on 16; group columns from the probe side, a join that is not inner, or a
/// build side with more rows than a probe partition and many groups keep the plain aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_joins_match_vanilla() {
    for (partitions, partitioned) in [(1, false), (2, false), (4, false), (16, true)] {
        let ctx = setup(partitions, partitioned).await;
        ctx.tune(|t| t.join_partitioned_max_partitions = 0);
        for sql in [
            "CREATE TABLE cats AS SELECT value AS id, \
               CASE WHEN value % 5 = 0 THEN NULL ELSE 'c' || (value % 13) END AS cat, value % 3 AS tier \
             FROM generate_series(0, 7999)",
            "CREATE INDEX cats_id ON cats USING mphf (id)",
            "CREATE TABLE ev AS SELECT value AS eid, \
               CASE WHEN value % 97 = 0 THEN NULL ELSE value % 9000 END AS id, value * 3 AS v, \
               'name' || (value % 9500) AS name FROM generate_series(1, 200000)",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        // (query, whether it runs fused)
        let queries = [
            (
                "SELECT d.grp, count(*), sum(e.v), avg(e.v), min(e.name), max(d.name) \
                 FROM ev e JOIN dim d ON e.id = d.id GROUP BY d.grp",
                true,
            ),
            // NULL group values, two group columns, a FILTER clause, an argument from both sides
            (
                "SELECT c.cat, c.tier, count(*) FILTER (WHERE e.v % 2 = 0), sum(e.v + c.id), count(c.cat) \
                 FROM ev e JOIN cats c ON e.id = c.id GROUP BY c.cat, c.tier",
                true,
            ),
            // many groups (one per build row), the join filter and a residual key
            (
                "SELECT d.name, count(*), sum(e.v) FROM ev e JOIN dim d ON e.id = d.id AND e.v % 7 > d.grp \
                 GROUP BY d.name",
                true,
            ),
            (
                "SELECT d.grp, count(*), max(e.eid) FROM ev e JOIN dim d ON e.id = d.id AND e.name = d.name \
                 GROUP BY d.grp",
                true,
            ),
            // a build side with repeated keys (fact.id, 30,000 rows): several build rows per probe
            // row; above 4 partitions its rows outnumber a probe partition's
            (
                "SELECT f.name, count(*), sum(e.v) FROM ev e JOIN fact f ON e.id = f.id GROUP BY f.name",
                partitions <= 4,
            ),
            // 8,001 build rows for 30,000 probe rows, one group per build row: fused only while a
            // probe partition has more rows than the build side (its rows are grouped on one
            // thread, in effect, while the probes wait)
            (
                "SELECT d.name, count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id GROUP BY d.name",
                partitions <= 2,
            ),
            // the same join with 7 groups: the build rows are grouped in chunks at once, and only
            // the chunks' few groups are merged on one thread, so it is fused on every count
            (
                "SELECT d.grp, count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id GROUP BY d.grp",
                true,
            ),
            // no build-side column to group by, or not an inner join
            (
                "SELECT e.v % 10, count(*) FROM ev e JOIN dim d ON e.id = d.id GROUP BY e.v % 10",
                false,
            ),
            (
                "SELECT d.grp, count(e.eid) FROM dim d LEFT JOIN ev e ON d.id = e.id GROUP BY d.grp",
                false,
            ),
        ];
        for (sql, fused) in queries {
            let plan = compare(&ctx, sql).await;
            assert_eq!(
                plan.contains("MphfGroupJoinExec"),
                fused,
                "{partitions} partitions, partitioned {partitioned}: {sql}\n{plan}"
            );
        }
    }
}

/// A group join whose probe key has its own index reads each probe row's group straight from
/// the row's slot in that index (a table composed once per build side: translation, build row,
/// group), instead of three dependent reads per pair. Rows equal vanilla's with probe keys that
/// are NULL, missing from the build index, or whose build row a filter removed; an aggregate
/// that reads a build column keeps the pairs of build and probe rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_join_reads_groups_by_the_probe_slot() {
    for partitions in [1, 2, 4] {
        let ctx = setup(partitions, false).await;
        // String keys: an in-memory index keeps row slots for them.
        run_statement(&ctx, "CREATE INDEX fact_name ON fact USING mphf (name)").await;
        let by_slot = |text: &str| {
            text.split("probe_rows_grouped_by_slot=")
                .nth(1)
                .and_then(|t| t.split([',', ']']).next())
                .map(str::to_string)
        };
        // fact.name holds 9,500 names, 1,500 of them not in dim.
        for (sql, expected) in [
            (
                "SELECT d.grp, count(*), sum(f.v) FROM fact f JOIN dim d ON f.name = d.name GROUP BY d.grp",
                "30.00 K",
            ),
            (
                "SELECT d.grp, count(*), max(f.fid) FROM fact f \
                 JOIN (SELECT name, grp FROM dim WHERE grp < 4) d ON f.name = d.name GROUP BY d.grp",
                "30.00 K",
            ),
            (
                "SELECT d.grp, count(*), sum(d.id) FROM fact f JOIN dim d ON f.name = d.name GROUP BY d.grp",
                "0",
            ),
        ] {
            let plan = compare(&ctx, sql).await;
            assert!(
                plan.contains("MphfGroupJoinExec"),
                "{partitions} partitions: {sql}\n{plan}"
            );
            let text = explain_analyze(&ctx, sql).await;
            assert_eq!(
                by_slot(&text).as_deref(),
                Some(expected),
                "{partitions} partitions: {sql}\n{text}"
            );
        }
    }
}

/// Planning an indexed GROUP BY under `aggregate_device = 'auto'` prices the GPU without
/// starting it: creating the CUDA context takes a large share of a second, which the first
/// query of every process paid in its planning even when the node stayed on the CPU. (No test
/// in this file places work on the GPU, so the process-wide state is this file's own.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planning_on_the_cpu_does_not_start_the_gpu() {
    let ctx = setup(2, false).await;
    ctx.sql("SET mphf.aggregate_device = 'auto'").await.unwrap();
    let df = ctx
        .sql("EXPLAIN SELECT id, count(*) FROM dim GROUP BY id")
        .await
        .unwrap();
    let text = pretty_format_batches(&df.collect().await.unwrap()).unwrap().to_string();
    assert!(text.contains("cost="), "the rule priced the node:\n{text}");
    assert!(!datafusion_mphf::placement::gpu_started(), "{text}");
}

/// A fused group join reports the statistics of the partial aggregate it replaces (over the
/// join's), as DataFusion's partial aggregate over its hash join does: the planner's estimates
/// above it (a repartition, the final aggregate, a join that reads its output) see rows, not an
/// unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_join_reports_its_aggregates_statistics() {
    use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
    let ctx = setup(2, false).await;
    let sql = "SELECT d.grp, count(*), sum(f.v) FROM fact f JOIN dim d ON f.id = d.id GROUP BY d.grp";
    let stats_of = |plan: &std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>| {
        StatisticsContext::new()
            .compute(plan.as_ref(), &StatisticsArgs::new())
            .unwrap()
    };
    ctx.sql("SET mphf.enable_join = false").await.unwrap();
    let vanilla = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let partial = find_node(&vanilla, "AggregateExec")
        .and_then(|top| {
            let mut node = top;
            // The partial aggregate: the aggregate right above the join.
            while let Some(child) = node.children().first().map(|c| std::sync::Arc::clone(c)) {
                if child.name() == "HashJoinExec" {
                    return Some(node);
                }
                node = child;
            }
            None
        })
        .expect("vanilla's partial aggregate over its join");
    ctx.sql("SET mphf.enable_join = true").await.unwrap();
    let ours = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
    let fused = find_node(&ours, "MphfGroupJoinExec").expect("a group join");
    let (want, got) = (stats_of(&partial), stats_of(&fused));
    assert!(got.num_rows.get_value().is_some(), "{got:?}");
    assert_eq!(got.num_rows, want.num_rows);
    assert_eq!(got.column_statistics.len(), fused.schema().fields().len());
}
