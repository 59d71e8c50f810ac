//! Distributed execution: every MPHF node through the codec, TPC-H on in-memory clusters of
//! datafusion-distributed workers (gRPC over in-process streams), and workers that cannot find
//! an index.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::{collect, displayable, ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_distributed::{display_plan_ascii, DistributedExt, DistributedLeafExec};
use datafusion_mphf::datafusion::aggregate::MphfMergedAggregateExec;
use datafusion_mphf::datafusion::distributed::{InMemoryCluster, IndexRef, MphfCodec, WorkerIndexes};
use datafusion_mphf::datafusion::explain::MphfDeclinedExec;
use datafusion_mphf::datafusion::plan::Declined;
use datafusion_mphf::datafusion::slot_scan::SlotScanExec;
use datafusion_mphf::datafusion::tpch;
use datafusion_mphf::datafusion::MphfContext;
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use parquet::arrow::ArrowWriter;

/// Sorted pretty-printed rows.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

/// Writes `batches` as one Parquet file per non-empty entry of `parts` under `dir`.
fn write_parts(dir: &Path, parts: &[Vec<RecordBatch>]) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, part) in parts.iter().enumerate().filter(|(_, p)| !p.is_empty()) {
        let file = std::fs::File::create(dir.join(format!("part-{i}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, part[0].schema(), None).unwrap();
        for b in part {
            w.write(b).unwrap();
        }
        w.close().unwrap();
    }
}

/// The kinds of the MPHF nodes in `plan` (the merged aggregate is named `MphfAggregateExec`).
fn mphf_nodes(plan: &Arc<dyn ExecutionPlan>, out: &mut BTreeSet<String>) {
    let name = plan.name();
    if plan.is::<MphfMergedAggregateExec>() {
        out.insert("MphfMergedAggregateExec".to_string());
    } else if name.starts_with("Mphf") || name == "SlotScanExec" {
        out.insert(name.to_string());
    }
    for c in plan.children() {
        mphf_nodes(c, out);
    }
}

/// Encodes `plan` with the codec, decodes it, and checks the plan text and the rows; returns
/// the MPHF nodes it held.
async fn round_trip(ctx: &MphfContext, plan: Arc<dyn ExecutionPlan>) -> BTreeSet<String> {
    let codec = MphfCodec::new(Arc::new(WorkerIndexes::in_process()), Some(Arc::clone(ctx.registry())));
    let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), &codec).unwrap();
    let task = ctx.ctx().task_ctx();
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &task, &codec).unwrap();
    let text = |p: &Arc<dyn ExecutionPlan>| displayable(p.as_ref()).indent(true).to_string();
    assert_eq!(text(&decoded), text(&plan), "the decoded plan differs");
    let want = rows(&collect(Arc::clone(&plan), Arc::clone(&task)).await.unwrap());
    let got = rows(&collect(decoded, task).await.unwrap());
    assert_eq!(got, want, "the decoded plan gives other rows:\n{}", text(&plan));
    let mut nodes = BTreeSet::new();
    mphf_nodes(&plan, &mut nodes);
    nodes
}

/// `batches` as two files' worth.
fn halves(batches: Vec<RecordBatch>) -> Vec<Vec<RecordBatch>> {
    let half = batches.len() / 2;
    vec![batches[..half].to_vec(), batches[half..].to_vec()]
}

/// Makes DataFusion plan every equi-join of `ctx` `Partitioned` (both sides shuffled by key).
async fn plan_partitioned_joins(ctx: &MphfContext) {
    setup_rows(ctx, "SET datafusion.optimizer.hash_join_single_partition_threshold = 0").await;
    setup_rows(
        ctx,
        "SET datafusion.optimizer.hash_join_single_partition_threshold_rows = 0",
    )
    .await;
}

/// A vanilla DataFusion session with the Parquet folders `tables` registered by name.
async fn vanilla_parquet(tables: &[(&str, std::path::PathBuf)]) -> SessionContext {
    let vanilla = SessionContext::new();
    for (name, folder) in tables {
        let folder = folder.display().to_string();
        vanilla
            .register_parquet(*name, &folder, ParquetReadOptions::default())
            .await
            .unwrap();
    }
    vanilla
}

/// Runs `sql` in `ctx` (a statement or a query), its rows.
async fn setup_rows(ctx: &MphfContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

async fn plan_of(ctx: &MphfContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap()
}

const FACTS: &str = "CREATE TABLE facts AS SELECT (v * 7919) % 5000 AS k, v % 97 AS x, CAST(v AS DOUBLE) AS amount \
                     FROM generate_series(1, 40000) AS t(v)";
const DIMS: &str =
    "CREATE TABLE dims AS SELECT v AS k, 'name' || (v % 13) AS label FROM generate_series(0, 4999) AS t(v)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mphf_node_round_trips_through_the_codec() {
    let ctx = MphfContext::new();
    for s in [
        FACTS,
        DIMS,
        "CREATE INDEX facts_k ON facts USING mphf (k)",
        "CREATE INDEX dims_k ON dims USING mphf (k)",
        "SET mphf.costing = 'always'",
        "SET datafusion.execution.target_partitions = 2",
    ] {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    let mut seen = BTreeSet::new();
    for sql in [
        "SELECT k, count(*), sum(amount) FROM facts GROUP BY k",
        "SELECT d.label, count(*), sum(f.amount) FROM facts f JOIN dims d ON f.k = d.k GROUP BY d.label",
        "SELECT f.x, d.label FROM facts f JOIN dims d ON f.k = d.k WHERE f.x < 3",
        "SELECT k, mphf_index(k) FROM dims",
    ] {
        seen.extend(round_trip(&ctx, plan_of(&ctx, sql).await).await);
    }
    // Other partition counts: the merge's other form, and one partition (a `Single` aggregate,
    // the per-partition node).
    for partitions in [4, 1] {
        let set = format!("SET datafusion.execution.target_partitions = {partitions}");
        ctx.sql(&set).await.unwrap().collect().await.unwrap();
        seen.extend(round_trip(&ctx, plan_of(&ctx, "SELECT k, max(x) FROM facts GROUP BY k").await).await);
    }

    // A Parquet table with slot maps: the slot scan.
    let dir = tempfile::tempdir().unwrap();
    let batches = ctx.sql("SELECT * FROM facts").await.unwrap().collect().await.unwrap();
    write_parts(&dir.path().join("pfacts"), &[batches]);
    let path = dir.path().join("pfacts").display().to_string();
    ctx.register_parquet("pfacts", &path).await.unwrap();
    ctx.sql("CREATE INDEX pfacts_k ON pfacts USING mphf (k)").await.unwrap();
    seen.extend(round_trip(&ctx, plan_of(&ctx, "SELECT k, count(*) FROM pfacts GROUP BY k").await).await);

    // The node EXPLAIN shows for a declined candidate.
    let inner = plan_of(&ctx, "SELECT k, x FROM facts WHERE x = 1").await;
    let declined: Arc<dyn ExecutionPlan> = Arc::new(MphfDeclinedExec::new(
        inner,
        Declined::new("a reason with words".into(), None),
    ));
    seen.extend(round_trip(&ctx, declined).await);

    for node in [
        "MphfRelabelExec",
        "MphfAggregateExec",
        "MphfMergedAggregateExec",
        "MphfJoinExec",
        "MphfGroupJoinExec",
        "MphfDeclinedExec",
        "SlotScanExec",
    ] {
        assert!(seen.contains(node), "no plan held {node}: {seen:?}");
    }
}

/// TPC-H at SF 0.1 written as Parquet (two files per table) under `dir`; the index statements
/// and the 22 queries of `sql-tests/tpch_queries.slt`.
fn tpch_parquet(dir: &Path) -> (Vec<String>, Vec<String>) {
    for t in tpch::TABLES {
        let (_, parts) = tpch::generate(t, 0.1, 2, &|_| {}).unwrap();
        write_parts(&dir.join(t), &parts);
    }
    let slt = std::fs::read_to_string("sql-tests/tpch_queries.slt").unwrap();
    let lines: Vec<&str> = slt.lines().collect();
    let indexes = lines
        .iter()
        .filter(|l| l.starts_with("CREATE INDEX"))
        .map(|l| l.to_string())
        .collect();
    let queries = lines
        .windows(3)
        .filter(|w| w[0].starts_with("# Q") && w[1].starts_with("query"))
        .map(|w| w[2].to_string())
        .collect::<Vec<_>>();
    (indexes, queries)
}

async fn vanilla_rows(dir: &Path, queries: &[String]) -> Vec<Vec<String>> {
    let ctx = SessionContext::new();
    for t in tpch::TABLES {
        let path = dir.join(t).display().to_string();
        ctx.register_parquet(t, &path, ParquetReadOptions::default())
            .await
            .unwrap();
    }
    let mut out = Vec::new();
    for q in queries {
        out.push(rows(&ctx.sql(q).await.unwrap().collect().await.unwrap()));
    }
    out
}

/// The `plan` column of `EXPLAIN`'s row of type `plan_type`.
fn explained_plan(batches: &[RecordBatch], plan_type: &str) -> String {
    for b in batches {
        let types = b.column(0).as_string::<i32>();
        let plans = b.column(1).as_string::<i32>();
        if let Some(i) = (0..b.num_rows()).find(|&i| types.value(i) == plan_type) {
            return plans.value(i).to_string();
        }
    }
    panic!("EXPLAIN has no {plan_type} row")
}

/// A coordinator over `workers` in-memory workers, scans split into many tasks.
fn cluster(workers: usize, indexes: WorkerIndexes) -> MphfContext {
    let builder = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2));
    let builder = InMemoryCluster::new(workers)
        .with_worker_indexes(indexes)
        .start(builder)
        .unwrap()
        .with_distributed_file_scan_config_bytes_per_partition(64 * 1024)
        .unwrap();
    MphfContext::with_state_builder(builder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_on_in_memory_clusters_gives_vanillas_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (indexes, queries) = tpch_parquet(dir.path());
    assert_eq!(queries.len(), 22);
    let want = vanilla_rows(dir.path(), &queries).await;
    for (workers, costing) in [(2, "always"), (4, "auto")] {
        let ctx = cluster(workers, WorkerIndexes::in_process());
        for t in tpch::TABLES {
            ctx.register_parquet(t, &dir.path().join(t).display().to_string())
                .await
                .unwrap();
        }
        for s in &indexes {
            // The first cluster saved them beside the data; the second loads them.
            ctx.sql(&s.replacen("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
                .await
                .unwrap();
        }
        ctx.sql(&format!("SET mphf.costing = '{costing}'"))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let mut distributed_mphf = 0;
        for (i, q) in queries.iter().enumerate() {
            let df = ctx.sql(q).await.unwrap();
            let plan = df.clone().create_physical_plan().await.unwrap();
            let text = display_plan_ascii(plan.as_ref(), false);
            if plan.name() == "DistributedExec"
                && text.contains("Stage")
                && ["MphfAggregateExec", "MphfJoinExec", "MphfGroupJoinExec"]
                    .iter()
                    .any(|n| text.contains(n))
            {
                distributed_mphf += 1;
            }
            if i == 2 {
                // Plain EXPLAIN shows the plan that runs: its stages, not the one-process plan.
                let explained = ctx.sql(&format!("EXPLAIN {q}")).await.unwrap().collect().await.unwrap();
                let physical = explained_plan(&explained, "physical_plan");
                assert!(
                    physical.contains("DistributedExec") && physical.contains("Stage 1"),
                    "{physical}"
                );
                assert_eq!(physical.trim_end(), text.trim_end());
                assert!(explained_plan(&explained, "logical_plan").contains("Inner Join"));
            }
            let got = rows(
                &df.collect()
                    .await
                    .unwrap_or_else(|e| panic!("Q{} on {workers} workers: {e}", i + 1)),
            );
            assert_eq!(got, want[i], "Q{} on {workers} workers ({costing}):\n{text}", i + 1);
        }
        println!(
            "{workers} workers ({costing}): {distributed_mphf} of 22 queries ran MPHF operators in distributed stages"
        );
        assert!(
            distributed_mphf >= 5,
            "{workers} workers: only {distributed_mphf} queries ran MPHF operators in distributed stages"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_coordinators_index_fails_naming_it() {
    let data = tempfile::tempdir().unwrap();
    let (shared, other, elsewhere) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let facts = data.path().join("facts");
    let setup = MphfContext::new();
    // Enough bytes for several scan tasks.
    setup
        .sql(&FACTS.replace("40000", "400000"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    write_parts(&facts, &halves(setup_rows(&setup, "SELECT * FROM facts").await));
    let facts = facts.display().to_string();
    let query = "SELECT k, count(*), sum(amount) FROM facts GROUP BY k";

    // A worker's folder with the index of other data under the same name: stale.
    let stale = MphfContext::new();
    stale
        .sql(&format!("SET mphf.index_dir = '{}'", other.path().display()))
        .await
        .unwrap();
    let other_facts = data.path().join("other_facts");
    write_parts(
        &other_facts,
        &halves(setup_rows(&setup, "SELECT k + 1 AS k, x, amount FROM facts").await),
    );
    stale
        .register_parquet("facts", &other_facts.display().to_string())
        .await
        .unwrap();
    stale.sql("CREATE INDEX facts_k ON facts USING mphf (k)").await.unwrap();

    let run = |indexes: WorkerIndexes| {
        let facts = facts.clone();
        let shared = shared.path().display().to_string();
        async move {
            let ctx = cluster(2, indexes);
            ctx.sql(&format!("SET mphf.index_dir = '{shared}'")).await.unwrap();
            setup_rows(&ctx, "SET mphf.costing = 'always'").await;
            ctx.register_parquet("facts", &facts).await.unwrap();
            ctx.sql("CREATE INDEX IF NOT EXISTS facts_k ON facts USING mphf (k)")
                .await
                .unwrap();
            let df = ctx.sql(query).await.unwrap();
            let plan = df.clone().create_physical_plan().await.unwrap();
            assert_eq!(
                plan.name(),
                "DistributedExec",
                "{}",
                display_plan_ascii(plan.as_ref(), false)
            );
            df.collect().await
        }
    };
    let missing = run(WorkerIndexes::saved(Some(elsewhere.path().to_path_buf())))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        missing
            .contains("MPHF index 'facts_k' on facts(k) is not available on this worker: cannot open the saved index"),
        "{missing}"
    );
    let stale_err = run(WorkerIndexes::saved(Some(other.path().to_path_buf())))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        stale_err.contains("MPHF index 'facts_k' on facts(k) is not available on this worker: the saved index")
            && stale_err.contains("the coordinator's has"),
        "{stale_err}"
    );
    // Workers that read the coordinator's folder run it, with vanilla's rows.
    let got = rows(
        &run(WorkerIndexes::saved(Some(shared.path().to_path_buf())))
            .await
            .unwrap(),
    );
    let vanilla = SessionContext::new();
    vanilla
        .register_parquet("facts", &facts, ParquetReadOptions::default())
        .await
        .unwrap();
    assert_eq!(got, rows(&vanilla.sql(query).await.unwrap().collect().await.unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_memory_index_cannot_reach_another_process() {
    let ctx = MphfContext::new();
    ctx.sql(DIMS).await.unwrap().collect().await.unwrap();
    ctx.sql("CREATE INDEX dims_k ON dims USING mphf (k)").await.unwrap();
    let handle = ctx.registry().get("dims_k").unwrap();
    let r = IndexRef::of(&handle);
    let pool = &ctx.ctx().runtime_env().memory_pool;
    let err = WorkerIndexes::saved(None).resolve(&r, pool).unwrap_err().to_string();
    assert!(
        err.contains(
            "MPHF index 'dims_k' on dims(k) is not available on this worker: the coordinator holds it in memory only \
             (table 'dims' is not file-backed)"
        ),
        "{err}"
    );
    // In the coordinator's process the live index is used.
    assert_eq!(WorkerIndexes::in_process().resolve(&r, pool).unwrap().id(), handle.id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reserves_an_opened_index_in_its_memory_pool() {
    let data = tempfile::tempdir().unwrap();
    let ctx = MphfContext::new();
    ctx.sql(FACTS).await.unwrap().collect().await.unwrap();
    let facts = data.path().join("pfacts");
    write_parts(&facts, &[setup_rows(&ctx, "SELECT * FROM facts").await]);
    ctx.register_parquet("pfacts", &facts.display().to_string())
        .await
        .unwrap();
    ctx.sql("CREATE INDEX pfacts_k ON pfacts USING mphf (k)").await.unwrap();
    let r = IndexRef::of(&ctx.registry().get("pfacts_k").unwrap());
    let small: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1024));
    let err = WorkerIndexes::saved(None).resolve(&r, &small).unwrap_err().to_string();
    assert!(
        err.contains("MPHF index 'pfacts_k' on pfacts(k): its saved file")
            && err.contains("more than this worker's memory pool has left"),
        "{err}"
    );
    // With room, the index is opened, reserved, and kept for the next plan.
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 30));
    let worker = WorkerIndexes::saved(None);
    let opened = worker.resolve(&r, &pool).unwrap();
    assert!(pool.reserved() > 0);
    assert_eq!(worker.resolve(&r, &pool).unwrap().id(), opened.id());
}

/// Three Parquet files of `n` rows in all: `id` (Int64, repeated keys and NULLs), `s` (Utf8,
/// repeated), `x` (Float64, no index can hold it).
fn build_table(dir: &Path, n: usize) -> Vec<Vec<RecordBatch>> {
    use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("x", DataType::Float64, false),
    ]));
    let mix = |i: u64| i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29) ^ 0x5bd1_e995;
    let batch = |rows: std::ops::Range<usize>| {
        let ids: Int64Array = rows
            .clone()
            .map(|i| (i % 97 != 5).then(|| (mix((i % (n - n / 5)) as u64) >> 3) as i64))
            .collect();
        let s: StringArray = rows
            .clone()
            .map(|i| Some(format!("session-{:x}", mix((i / 3) as u64))))
            .collect();
        let x: Float64Array = rows.map(|i| i as f64).collect();
        RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids), Arc::new(s), Arc::new(x)]).unwrap()
    };
    let third = n / 3;
    let parts = vec![
        vec![batch(0..third / 2), batch(third / 2..third)],
        vec![batch(third..2 * third)],
        vec![batch(2 * third..n)],
    ];
    write_parts(dir, &parts);
    parts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_built_by_the_workers_has_the_single_builds_bytes() {
    use datafusion_mphf::core::column::{ColumnIndex, IndexOptions};
    use datafusion_mphf::core::{Builder, Params};
    use datafusion_mphf::datafusion::distributed::{build_on_cluster, build_round_plan};
    let dir = tempfile::tempdir().unwrap();
    let parts = build_table(dir.path(), 60_000);
    let path = dir.path().display().to_string();
    let columns = [
        ("id", 0usize, Params::try_new(8, 100, true).unwrap()),
        ("s", 1, Params::DEFAULT),
    ];
    // The single-process build of each column, as CREATE INDEX makes it.
    let single: Vec<Vec<u8>> = columns
        .iter()
        .map(|&(_, c, params)| {
            let chunks: Vec<_> = parts.iter().flatten().map(|b| Arc::clone(b.column(c))).collect();
            let opts = IndexOptions {
                params,
                seed: 5,
                ..IndexOptions::default()
            };
            ColumnIndex::build(&chunks, &opts).unwrap().mphf().write_bytes()
        })
        .collect();
    for (workers, owners) in [(2, 3), (4, 8)] {
        let ctx = cluster(workers, WorkerIndexes::in_process());
        ctx.register_parquet("t", &path).await.unwrap();
        for (&(column, _, params), want) in columns.iter().zip(&single) {
            let builder = Builder::new(params).seed(5);
            let plan = build_round_plan(ctx.ctx(), "t", column, &builder, owners)
                .await
                .unwrap();
            let text = display_plan_ascii(plan.as_ref(), false);
            assert!(
                plan.name() == "DistributedExec"
                    && text.contains("NetworkShuffleExec")
                    && text.contains("mphf_build_part"),
                "the build's round is not cut into stages:\n{text}"
            );
            let (mphf, report) = build_on_cluster(ctx.ctx(), "t", column, &builder, owners)
                .await
                .unwrap();
            assert!(
                mphf.write_bytes() == *want,
                "{column}, {workers} workers, {owners} owners: bytes differ from the single build"
            );
            assert_eq!((report.attempts, report.solver.as_str()), (1, "cpu"));
        }
        let e = build_on_cluster(ctx.ctx(), "t", "x", &Builder::new(Params::DEFAULT), owners)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("unsupported key type Float64"), "{e}");
        let e = build_on_cluster(ctx.ctx(), "t", "nope", &Builder::new(Params::DEFAULT), owners)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope"), "{e}");
        let e = build_on_cluster(ctx.ctx(), "t", "id", &Builder::new(Params::DEFAULT), 0)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "Error during planning: invalid parameter: a partitioned build needs at least one owner"
        );
        let e = build_on_cluster(ctx.ctx(), "t", "id", &Builder::new(Params::DEFAULT), 1 << 40)
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "Error during planning: invalid parameter: a partitioned build of 1099511627776 owners; at most 65536"
        );
    }
}

/// 10^7 random Int64 keys in 4 Parquet files, built on an in-memory cluster of 4 workers with 16
/// owners and in one process: the same bytes, and both times printed. About 1 min on 2 cores:
/// `cargo test --release --test test_distributed ten_million -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn ten_million_keys_built_by_the_workers_have_the_single_builds_bytes() {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion_mphf::core::column::{ColumnIndex, IndexOptions};
    use datafusion_mphf::core::{Builder, Params};
    use datafusion_mphf::datafusion::distributed::build_on_cluster;
    use std::time::Instant;
    let n = 10_000_000u64;
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let parts: Vec<Vec<RecordBatch>> = (0..4u64)
        .map(|f| {
            (0..n / 4 / 65_536 + 1)
                .map(|b| {
                    let lo = f * n / 4 + b * 65_536;
                    let hi = (lo + 65_536).min((f + 1) * n / 4);
                    let ids: Int64Array = (lo..hi)
                        .map(|i| (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (i >> 7)) as i64)
                        .collect();
                    RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids)]).unwrap()
                })
                .filter(|b| b.num_rows() > 0)
                .collect()
        })
        .collect();
    write_parts(dir.path(), &parts);
    let params = Params::DEFAULT;
    let t = Instant::now();
    let chunks: Vec<_> = parts.iter().flatten().map(|b| Arc::clone(b.column(0))).collect();
    let opts = IndexOptions {
        params,
        ..IndexOptions::default()
    };
    let single = ColumnIndex::build(&chunks, &opts).unwrap();
    let single_s = t.elapsed().as_secs_f64();
    drop(chunks);
    let ctx = cluster(4, WorkerIndexes::in_process());
    ctx.register_parquet("t", &dir.path().display().to_string())
        .await
        .unwrap();
    let t = Instant::now();
    let (mphf, report) = build_on_cluster(ctx.ctx(), "t", "id", &Builder::new(params), 16)
        .await
        .unwrap();
    let cluster_s = t.elapsed().as_secs_f64();
    assert_eq!(mphf.len(), n);
    assert!(
        mphf.write_bytes() == single.mphf().write_bytes(),
        "bytes differ from the single build"
    );
    eprintln!(
        "10^7 keys, (8, 100): single process (ColumnIndex::build, MPHF and keys in slot order) {single_s:.2} s; \
         in-memory cluster of 4 workers, 16 owners (Parquet read, DISTINCT, route, shuffle, solve, assemble) \
         {cluster_s:.2} s; {} seed(s); {:.3} bits/key",
        report.attempts,
        mphf.bits_per_key()
    );
}

#[tokio::test]
async fn the_build_functions_refuse_bad_arguments_with_clear_errors() {
    let ctx = MphfContext::new();
    let err = |sql: &'static str| {
        let ctx = ctx.ctx().clone();
        async move {
            match ctx.sql(sql).await {
                Ok(df) => df.collect().await.map(|_| ()).unwrap_err().to_string(),
                Err(e) => e.to_string(),
            }
        }
    };
    let u = |v: u64| format!("arrow_cast({v}, 'UInt64')");
    // The routing function of a valid round gives owners below the owner count.
    let sql = format!(
        "SELECT max(mphf_route(column1, {}, {}, {})) AS m FROM (VALUES (1), (2), (3), (40)) AS t",
        u(7),
        u(10),
        u(3)
    );
    let rows = ctx.ctx().sql(&sql).await.unwrap().collect().await.unwrap();
    let max = rows[0]
        .column(0)
        .as_primitive::<datafusion::arrow::datatypes::UInt32Type>()
        .value(0);
    assert!(max < 3, "owner {max} of 3");
    assert_eq!(
        err("SELECT mphf_route(column1, 1, 10, 3) FROM (VALUES (1))").await,
        "Execution error: mphf_route: argument 2 must be a non-NULL UInt64 constant"
    );
    assert_eq!(
        err("SELECT mphf_route(column1, arrow_cast(1, 'UInt64'), arrow_cast(10, 'UInt64'), arrow_cast(0, 'UInt64')) FROM (VALUES (1))").await,
        "Error during planning: mphf_route: a round of 10 buckets among 0 owners"
    );
    assert_eq!(
        err("SELECT mphf_route(column1, arrow_cast(1, 'UInt64'), arrow_cast(10, 'UInt64'), arrow_cast(2, 'UInt64')) FROM (VALUES (1), (NULL))").await,
        "Execution error: mphf_route: a NULL key has no bucket (the build reads the non-NULL keys only)"
    );
    let e = err("SELECT mphf_route(column1, arrow_cast(1, 'UInt64'), arrow_cast(10, 'UInt64'), arrow_cast(2, 'UInt64')) FROM (VALUES (1.5))").await;
    assert!(e.contains("unsupported key type Float64"), "{e}");
    assert_eq!(
        err("SELECT mphf_build_part(column1, 8, 100, true, 0, 10, 2) FROM (VALUES (1))").await,
        "Error during planning: mphf_build_part: argument 2 is 8, not a UInt64"
    );
    let e = err(
        "SELECT mphf_build_part(column1, arrow_cast(40, 'UInt64'), arrow_cast(100, 'UInt64'), true, \
         arrow_cast(0, 'UInt64'), arrow_cast(10, 'UInt64'), arrow_cast(2, 'UInt64')) FROM (VALUES (1))",
    )
    .await;
    assert!(e.contains("invalid parameter") && e.contains("40"), "{e}");
    assert_eq!(
        err(
            "SELECT mphf_build_part(column1, arrow_cast(8, 'UInt64'), arrow_cast(100, 'UInt64'), column1 > 0, \
             arrow_cast(0, 'UInt64'), arrow_cast(10, 'UInt64'), arrow_cast(2, 'UInt64')) FROM (VALUES (1))"
        )
        .await,
        "Error during planning: mphf_build_part: argument 4 must be a constant"
    );
}

/// The first node of `plan` (depth first) that is a `T`.
fn find<T: ExecutionPlan + 'static>(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.is::<T>() {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find::<T>)
}

/// Sparse unclustered keys as four Parquet files of ten row groups each under `dir/name/`
/// (written once), registered in `ctx` with an index (and its slot maps) on `k`.
async fn sparse_parquet(ctx: &MphfContext, dir: &Path, name: &str) {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    let props = parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(1_000))
        .build();
    let source = MphfContext::new();
    for part in (0..4).filter(|part| !folder.join(format!("part-{part}.parquet")).exists()) {
        let sql = format!(
            "SELECT (v * 2654435761) % 1000000007 * 1000 AS k, v % 97 AS x, CAST(v AS DOUBLE) AS amount \
             FROM generate_series({}, {}) AS t(v)",
            part * 10_000 + 1,
            part * 10_000 + 10_000
        );
        let batches = source.sql(&sql).await.unwrap().collect().await.unwrap();
        let file = std::fs::File::create(folder.join(format!("part-{part}.parquet"))).unwrap();
        let mut w = ArrowWriter::try_new(file, batches[0].schema(), Some(props.clone())).unwrap();
        for b in &batches {
            w.write(b).unwrap();
        }
        w.close().unwrap();
    }
    ctx.register_parquet(name, &folder.display().to_string()).await.unwrap();
    ctx.sql(&format!("CREATE INDEX IF NOT EXISTS {name}_k ON {name} USING mphf (k)"))
        .await
        .unwrap();
    setup_rows(ctx, "SET mphf.costing = 'always'").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_scan_split_over_tasks_reads_every_row_once_with_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = MphfContext::with_config(SessionConfig::new().with_target_partitions(2));
    sparse_parquet(&ctx, dir.path(), "sparse").await;
    // The projection reads the key: the scan hands every row's key with its slot.
    let plan = plan_of(&ctx, "SELECT k, mphf_index(k) FROM sparse").await;
    let scan = find::<SlotScanExec>(&plan).expect("a slot scan");
    let task = ctx.ctx().task_ctx();
    let want = rows(&collect(Arc::clone(&scan), Arc::clone(&task)).await.unwrap());
    assert_eq!(want.len(), 40_000 + 4, "40 000 rows and the table's frame");
    let slot_scan = scan.downcast_ref::<SlotScanExec>().unwrap();
    for tasks in [1, 3, 8] {
        let variants = slot_scan.split_over_tasks(tasks).unwrap();
        assert_eq!(variants.len(), tasks);
        let mut got = Vec::new();
        for v in &variants {
            assert_eq!(v.output_partitioning().partition_count(), 2, "{tasks} tasks");
            assert_eq!(v.schema(), scan.schema());
            got.extend(collect(Arc::clone(v), Arc::clone(&task)).await.unwrap());
        }
        // Keys (all distinct) with their slots, each row once: a row handed another row's
        // slot, or read twice, or left out, changes the sorted rows.
        assert_eq!(rows(&got), want, "{tasks} tasks");
        let mapped: usize = variants
            .iter()
            .map(|v| v.downcast_ref::<SlotScanExec>().unwrap().mapped_files())
            .sum();
        assert!(mapped >= 4, "{tasks} tasks: {mapped} mapped files");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_scans_run_in_several_tasks_on_a_cluster_and_give_vanillas_rows() {
    let dir = tempfile::tempdir().unwrap();
    let vanilla = SessionContext::new();
    let setup = MphfContext::new();
    sparse_parquet(&setup, dir.path(), "sparse").await;
    let folder = dir.path().join("sparse").display().to_string();
    vanilla
        .register_parquet("sparse", &folder, ParquetReadOptions::default())
        .await
        .unwrap();
    // (query, whether its plan has a slot scan); `mphf_index` is answered from the slot maps
    // on the workers.
    let queries = [
        ("SELECT k, count(*), sum(amount) FROM sparse GROUP BY k", true),
        ("SELECT k, max(x) FROM sparse WHERE x < 50 GROUP BY k", true),
        ("SELECT count(DISTINCT k) FROM sparse", true),
        (
            "SELECT a.x, count(*) FROM sparse a JOIN sparse b ON a.k = b.k WHERE b.x < 10 GROUP BY a.x",
            false,
        ),
        ("SELECT k, mphf_index(k) FROM sparse WHERE x = 3", true),
        ("SELECT x, mphf_index(k) FROM sparse WHERE x < 3", true),
        // The named form is looked up, in the index the worker's registry names.
        ("SELECT k, mphf_index('sparse_k', k) FROM sparse WHERE x = 3", false),
    ];
    for workers in [2, 4] {
        let ctx = cluster(workers, WorkerIndexes::in_process());
        sparse_parquet(&ctx, dir.path(), "sparse").await;
        for (sql, slot_scan) in queries {
            let df = ctx.sql(sql).await.unwrap();
            let plan = df.clone().create_physical_plan().await.unwrap();
            let text = display_plan_ascii(plan.as_ref(), false);
            println!("{sql} on {workers} workers:\n{text}");
            if slot_scan {
                let leaf = find::<DistributedLeafExec>(&plan).expect("a split leaf");
                let leaf = leaf.downcast_ref::<DistributedLeafExec>().unwrap();
                assert!(leaf.original().is::<SlotScanExec>(), "{sql}:\n{text}");
                assert!(leaf.variants().len() >= 2, "{sql} on {workers} workers:\n{text}");
            }
            let got = rows(
                &df.collect()
                    .await
                    .unwrap_or_else(|e| panic!("{sql} on {workers} workers: {e}")),
            );
            // `mphf_index` reads the slot maps on the workers, checked against the
            // single-process session's answer.
            if sql.contains("mphf_index") {
                let stored = text.contains("mphf_stored_slots(");
                assert_eq!(stored, slot_scan, "{sql} on {workers} workers:\n{text}");
            }
            let want = match sql.contains("mphf_index") {
                true => rows(&setup.sql(sql).await.unwrap().collect().await.unwrap()),
                false => rows(&vanilla.sql(sql).await.unwrap().collect().await.unwrap()),
            };
            assert_eq!(got, want, "{sql} on {workers} workers:\n{text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_form_joins_broadcast_their_build_side_to_every_task() {
    let dir = tempfile::tempdir().unwrap();
    let setup = MphfContext::new();
    sparse_parquet(&setup, dir.path(), "sparse").await;
    // A small dimension table keyed by one key in 14: DataFusion plans a collect-form join, and
    // broadcasting it pays (`join::rule`'s least probe rows per build row).
    let dims = dir.path().join("dims");
    std::fs::create_dir_all(&dims).unwrap();
    let sql = "SELECT k, 'label' || (x % 7) AS label FROM sparse WHERE x % 16 = 0";
    let batches = setup.sql(sql).await.unwrap().collect().await.unwrap();
    write_parts(&dims, &[batches]);
    let vanilla = vanilla_parquet(&[("sparse", dir.path().join("sparse")), ("dims", dims.clone())]).await;
    let ctx = cluster(4, WorkerIndexes::in_process());
    sparse_parquet(&ctx, dir.path(), "sparse").await;
    ctx.register_parquet("dims", &dims.display().to_string()).await.unwrap();
    ctx.sql("CREATE INDEX dims_k ON dims USING mphf (k)").await.unwrap();
    // (query, whether the MPHF join must run in a multi-task stage over a broadcast build side)
    let queries = [
        (
            "SELECT d.label, count(*), sum(s.amount) FROM dims d JOIN sparse s ON s.k = d.k GROUP BY d.label",
            true,
        ),
        (
            "SELECT s.x, d.label FROM dims d JOIN sparse s ON s.k = d.k WHERE s.x < 5",
            true,
        ),
        ("SELECT count(*) FROM sparse s WHERE s.k IN (SELECT k FROM dims)", true),
        // A left join emits unmatched build rows: each task would emit its own.
        (
            "SELECT d.label, s.x FROM dims d LEFT JOIN sparse s ON s.k = d.k AND s.x = 1",
            false,
        ),
    ];
    for (sql, broadcast) in queries {
        let df = ctx.sql(sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let text = display_plan_ascii(plan.as_ref(), false);
        println!("{sql}:\n{text}");
        let mphf_join = text.contains("MphfJoinExec") || text.contains("MphfGroupJoinExec");
        if broadcast {
            assert!(mphf_join && text.contains("NetworkBroadcastExec"), "{sql}:\n{text}");
            let stage = text
                .split("Stage ")
                .find(|s| s.contains("MphfJoinExec") || s.contains("MphfGroupJoinExec"))
                .unwrap();
            assert!(
                !stage.contains("tasks=1,"),
                "{sql}: the join's stage runs in one task:\n{text}"
            );
        }
        // Unmatched build rows emitted by every task would show here.
        let got = rows(&df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}")));
        let want = rows(&vanilla.sql(sql).await.unwrap().collect().await.unwrap());
        assert_eq!(got, want, "{sql}:\n{text}");
    }

    // DataFusion shuffles both sides of a `Partitioned` join by key; the collect form with a
    // broadcast build side reads the probe side where it lies.
    plan_partitioned_joins(&ctx).await;
    let sql = "SELECT s.x, count(*) FROM dims d JOIN sparse s ON s.k = d.k GROUP BY s.x";
    setup_rows(&ctx, "SET mphf.enable_join = false").await;
    let vanilla_text = display_plan_ascii(plan_of(&ctx, sql).await.as_ref(), false);
    assert!(vanilla_text.contains("mode=Partitioned"), "{vanilla_text}");
    setup_rows(&ctx, "SET mphf.enable_join = true").await;
    let df = ctx.sql(sql).await.unwrap();
    let text = display_plan_ascii(df.clone().create_physical_plan().await.unwrap().as_ref(), false);
    assert!(
        text.contains("mode=CollectLeft") && text.contains("NetworkBroadcastExec"),
        "{text}"
    );
    // One shuffle left: the partial aggregate's, by s.x.
    assert_eq!(text.matches("NetworkShuffleExec").count(), 1, "{text}");
    let got = rows(&df.collect().await.unwrap());
    let want = rows(&vanilla.sql(sql).await.unwrap().collect().await.unwrap());
    assert_eq!(got, want, "{sql}:\n{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_joins_ship_scan_slots_only_for_keys_without_a_dense_table() {
    let dir = tempfile::tempdir().unwrap();
    let setup = MphfContext::new();
    sparse_parquet(&setup, dir.path(), "sparse").await;
    // Dense keys 1..=40 000: their index gets a dense key table, one array read a lookup.
    let dense = dir.path().join("dense");
    let sql = "SELECT v AS k, v % 97 AS x, CAST(v AS DOUBLE) AS amount FROM generate_series(1, 40000) AS t(v)";
    write_parts(&dense, &halves(setup_rows(&setup, sql).await));
    let vanilla = vanilla_parquet(&[("sparse", dir.path().join("sparse")), ("dense", dense.clone())]).await;
    let ctx = cluster(2, WorkerIndexes::in_process());
    sparse_parquet(&ctx, dir.path(), "sparse").await;
    ctx.register_parquet("dense", &dense.display().to_string())
        .await
        .unwrap();
    ctx.sql("CREATE INDEX dense_k ON dense USING mphf (k)").await.unwrap();
    // Both sides shuffled by key: a `Partitioned` join.
    plan_partitioned_joins(&ctx).await;
    for (table, ships_slots) in [("sparse", true), ("dense", false)] {
        let sql = format!("SELECT a.x, count(*), sum(b.amount) FROM {table} a JOIN {table} b ON a.k = b.k WHERE b.x < 60 GROUP BY a.x");
        let df = ctx.sql(&sql).await.unwrap();
        let plan = df.clone().create_physical_plan().await.unwrap();
        let text = display_plan_ascii(plan.as_ref(), false);
        println!("{sql}:\n{text}");
        assert!(text.contains("MphfJoinExec: mode=Partitioned"), "{sql}:\n{text}");
        // A slot column below a shuffle crosses the network with every row.
        assert_eq!(text.contains("SlotScanExec"), ships_slots, "{sql}:\n{text}");
        let got = rows(&df.collect().await.unwrap_or_else(|e| panic!("{sql}: {e}")));
        let want = rows(&vanilla.sql(&sql).await.unwrap().collect().await.unwrap());
        assert_eq!(got, want, "{sql}:\n{text}");
    }
}

/// Keys with NULLs (every 101st row), as integers and as strings, over two Parquet files.
const KEYED_ROWS: &str = "SELECT CASE WHEN v % 101 = 0 THEN NULL ELSE (v * 7919) % 5000 END AS k, \
                          CASE WHEN v % 101 = 0 THEN NULL ELSE 'id-' || ((v * 7919) % 5000) END AS s, \
                          v % 97 AS x, CAST(v AS DOUBLE) AS amount FROM generate_series(1, 40000) AS t(v)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_aggregates_on_workers_merge_the_partials_by_slot() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("keyed");
    let setup = MphfContext::new();
    write_parts(&folder, &halves(setup_rows(&setup, KEYED_ROWS).await));
    let vanilla = vanilla_parquet(&[("keyed", folder.clone())]).await;
    let queries = [
        "SELECT k, count(*), sum(amount), avg(x), min(x), max(amount) FROM keyed GROUP BY k",
        "SELECT s, count(*), sum(x), count(amount) FROM keyed GROUP BY s",
        "SELECT k, count(*) FROM keyed WHERE x < 40 GROUP BY k",
        // The key is not the raw input's first column.
        "SELECT s, sum(k), min(x) FROM keyed GROUP BY s",
        // The key holds slots (checked against one process with the index).
        "SELECT min(k), count(*), sum(amount) FROM keyed GROUP BY mphf_index(k)",
        // Over the slot maps the partial groups by `mphf_stored_slots`, whose slots it must not
        // look up as keys.
        "SELECT count(DISTINCT mphf_index(s)), max(mphf_index(s)) FROM keyed",
    ];
    let single = MphfContext::new();
    single
        .register_parquet("keyed", &folder.display().to_string())
        .await
        .unwrap();
    setup_rows(&single, "CREATE INDEX keyed_k ON keyed USING mphf (k)").await;
    setup_rows(&single, "CREATE INDEX keyed_s ON keyed USING mphf (s)").await;
    for workers in [2, 4] {
        let ctx = cluster(workers, WorkerIndexes::in_process());
        ctx.register_parquet("keyed", &folder.display().to_string())
            .await
            .unwrap();
        setup_rows(&ctx, "CREATE INDEX keyed_k ON keyed USING mphf (k)").await;
        setup_rows(&ctx, "CREATE INDEX keyed_s ON keyed USING mphf (s)").await;
        setup_rows(&ctx, "SET mphf.costing = 'always'").await;
        for sql in queries {
            let df = ctx.sql(sql).await.unwrap();
            let plan = df.clone().create_physical_plan().await.unwrap();
            let text = display_plan_ascii(plan.as_ref(), false);
            // The partials are ours on the workers, and so is the merge after the shuffle.
            for mode in ["Partial", "FinalPartitioned"] {
                assert!(
                    text.contains(&format!("MphfAggregateExec: mode={mode}")),
                    "{sql} on {workers} workers, no {mode} node:\n{text}"
                );
            }
            let hash_final = text
                .lines()
                .map(|l| l.trim_start_matches(['│', ' ']))
                .any(|l| l.starts_with("AggregateExec: mode=Final") && !l.contains("gby=[]"));
            assert!(!hash_final, "{sql}: DataFusion's final aggregation is left:\n{text}");
            let got = rows(
                &df.collect()
                    .await
                    .unwrap_or_else(|e| panic!("{sql} on {workers} workers: {e}")),
            );
            let want = match sql.contains("mphf_index") {
                true => rows(&single.sql(sql).await.unwrap().collect().await.unwrap()),
                false => rows(&vanilla.sql(sql).await.unwrap().collect().await.unwrap()),
            };
            assert_eq!(got, want, "{sql} on {workers} workers:\n{text}");
            if sql.contains("DISTINCT") {
                // Only the NULL keys (one row in 101) are grouped by value.
                let analyzed = setup_rows(&ctx, &format!("EXPLAIN ANALYZE {sql}")).await;
                let text = explained_plan(&analyzed, "Plan with Metrics");
                let partial = text
                    .lines()
                    .find(|l| l.contains("MphfAggregateExec: mode=Partial"))
                    .unwrap_or_else(|| panic!("{sql}: no partial\n{text}"));
                let fallback: usize = partial
                    .split("fallback_rows=")
                    .nth(1)
                    .and_then(|m| m.split(',').next())
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or_else(|| panic!("{sql}: no fallback_rows in {partial}"));
                assert_eq!(fallback, 40_000 / 101, "{partial}");
            } else {
                // NULL keys form one group of their own through both stages.
                assert!(want.iter().any(|line| line.starts_with("|   ")), "{sql}: a NULL group");
            }
        }
    }
}
