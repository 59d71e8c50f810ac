//! Slot maps over Parquet tables: a GROUP BY on an indexed column of a Parquet table reads each
//! row's slot from the index's slot maps through `SlotScanExec`, and its rows equal vanilla
//! DataFusion's under pruning, filters (pushed down or not), several files and batch sizes from
//! 1 to 8192. Every row must get its slot from the scan (`scan_slot_rows` = `input_rows`):
//! with the per-row group sum of a unique column, a row paired with its neighbour's slot would
//! change a sum. A file rewritten under the index with the same name, size and modification
//! time gets vanilla's answer, and saved slot maps are reused, or remade when corrupt.
//! `mphf_index(col)` over such a scan returns the stored slots, equal to the lookup's. An
//! aggregate that reads its key only for rows without a slot gets files with fresh slot maps
//! scanned without the key column; one that reads the key (an argument, a filter) gets it.

#![cfg(feature = "datafusion")]

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::physical_plan::{collect, displayable, ExecutionPlan};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_mphf::datafusion::MphfContext;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, Encoding};
use parquet::file::properties::WriterProperties;

/// Rows per file, files, distinct ids.
const ROWS: i64 = 10_000;
const FILES: i64 = 2;
const IDS: i64 = 5_000;

/// A pseudo-random permutation step (odd, so `i * STEP mod 2^64` is a bijection).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// File `f` of the table with id values `id_base + 7·k`: sparse ids in random row order (every
/// 101st NULL), a session string, the global row number `seq` (clustered, so a filter on it
/// prunes row groups) and a unique `v`. Plain encoding, no compression: a file of other ids
/// has the same size.
fn write_file(path: &Path, f: i64, id_base: i64) {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("s", DataType::Utf8, false),
        Field::new("seq", DataType::Int64, false),
        Field::new("v", DataType::Int64, false),
    ]));
    let seq: Vec<i64> = (f * ROWS..(f + 1) * ROWS).collect();
    let id: Vec<Option<i64>> = seq
        .iter()
        .map(|&r| (r % 101 != 0).then(|| id_base + 7 * (mix(r as u64) % IDS as u64) as i64))
        .collect();
    let s: Vec<String> = seq
        .iter()
        .map(|&r| format!("sess-{:08x}", mix(r as u64 ^ 0xabc) % 3000))
        .collect();
    let v: Vec<i64> = seq.iter().map(|&r| r * 7 + 3).collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(id)),
        Arc::new(StringArray::from(s)),
        Arc::new(Int64Array::from(seq)),
        Arc::new(Int64Array::from(v)),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).unwrap();
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(1000))
        .set_compression(Compression::UNCOMPRESSED)
        .set_dictionary_enabled(false)
        .set_encoding(Encoding::PLAIN)
        .build();
    let tmp = path.with_extension("tmp");
    let mut w = ArrowWriter::try_new(std::fs::File::create(&tmp).unwrap(), schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A folder with the table's files.
fn table_dir(id_base: i64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in 0..FILES {
        write_file(&dir.path().join(format!("part-{f}.parquet")), f, id_base);
    }
    dir
}

fn config(batch_size: usize, pushdown: bool) -> SessionConfig {
    let mut c = SessionConfig::new()
        .with_target_partitions(2)
        .with_batch_size(batch_size);
    c.options_mut().execution.parquet.pushdown_filters = pushdown;
    c
}

/// An MPHF session over the table in `dir` with indexes on `id` and `s`, the costing forced on.
async fn mphf_session(dir: &Path, batch_size: usize, pushdown: bool) -> MphfContext {
    let ctx = MphfContext::with_config(config(batch_size, pushdown));
    ctx.register_parquet("ev", dir.to_str().unwrap()).await.unwrap();
    for sql in [
        "CREATE INDEX IF NOT EXISTS ev_id ON ev USING mphf (id)",
        "CREATE INDEX IF NOT EXISTS ev_s ON ev USING mphf (s)",
        "SET mphf.aggregate_device = 'cpu'",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    ctx.tune(|t| {
        t.aggregate_min_slots = 0;
        t.aggregate_max_slot_entries_per_row = 1e9;
        t.aggregate_max_slot_entries_per_row_partitioned = 1e9;
        t.compare_costs = false;
    });
    ctx
}

/// Sorted pretty-printed rows.
fn sorted_rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

async fn vanilla_rows(dir: &Path, sql: &str, batch_size: usize, pushdown: bool) -> Vec<String> {
    let ctx = SessionContext::new_with_config(config(batch_size, pushdown));
    ctx.register_parquet("ev", dir.to_str().unwrap(), Default::default())
        .await
        .unwrap();
    sorted_rows(&ctx.sql(sql).await.unwrap().collect().await.unwrap())
}

/// Sum of metric `name` over the nodes of `plan` whose name passes `is_node`.
fn nodes_metric_sum(plan: &Arc<dyn ExecutionPlan>, name: &str, is_node: fn(&str) -> bool) -> usize {
    let own = match is_node(plan.name()) {
        true => plan
            .metrics()
            .and_then(|m| m.sum_by_name(name))
            .map_or(0, |v| v.as_usize()),
        false => 0,
    };
    own + plan
        .children()
        .into_iter()
        .map(|c| nodes_metric_sum(c, name, is_node))
        .sum::<usize>()
}

/// Sum of metric `name` over the MPHF aggregate nodes of `plan`.
fn metric_sum(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    nodes_metric_sum(plan, name, |n| {
        n.starts_with("MphfAggregateExec") || n.starts_with("MphfMerged")
    })
}

/// Sum of metric `name` over the slot scans of `plan`.
fn scan_metric_sum(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    nodes_metric_sum(plan, name, |n| n == "SlotScanExec")
}

/// Sum of metric `name` over the MPHF join nodes of `plan`.
fn join_metric_sum(plan: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    nodes_metric_sum(plan, name, |n| n.starts_with("Mphf") && n.contains("Join"))
}

/// Runs `sql` in the MPHF session: its sorted rows, its plan, and the rows the aggregate read
/// and how many of them had their slot from the scan.
async fn mphf_plan_run(ctx: &MphfContext, sql: &str) -> (Vec<String>, Arc<dyn ExecutionPlan>, usize, usize) {
    let df = ctx.sql(sql).await.unwrap();
    let plan = df.create_physical_plan().await.unwrap();
    let batches = collect(Arc::clone(&plan), ctx.ctx().task_ctx()).await.unwrap();
    let (input_rows, scan_rows) = (metric_sum(&plan, "input_rows"), metric_sum(&plan, "scan_slot_rows"));
    (sorted_rows(&batches), plan, input_rows, scan_rows)
}

/// [`mphf_plan_run`] with the plan as text.
async fn mphf_run(ctx: &MphfContext, sql: &str) -> (Vec<String>, String, usize, usize) {
    let (rows, plan, input_rows, scan_rows) = mphf_plan_run(ctx, sql).await;
    let text = displayable(plan.as_ref()).indent(true).to_string();
    (rows, text, input_rows, scan_rows)
}

const QUERIES: [&str; 5] = [
    "SELECT id, count(*) AS n, sum(v) AS sv FROM ev GROUP BY id",
    "SELECT id, sum(v) AS sv, max(seq) AS ms FROM ev WHERE v % 3 = 0 GROUP BY id",
    "SELECT id, sum(v) AS sv FROM ev WHERE seq >= 12500 GROUP BY id",
    "SELECT id, sum(v) AS sv, count(s) AS ns FROM ev WHERE seq BETWEEN 3500 AND 4700 OR seq > 19990 GROUP BY id",
    "SELECT s, count(*) AS n, sum(v) AS sv FROM ev GROUP BY s",
];

/// Queries whose aggregate or filter reads the indexed key itself.
const KEY_READING_QUERIES: [&str; 3] = [
    "SELECT id, count(*) AS n, sum(id) AS si FROM ev GROUP BY id",
    "SELECT id, sum(v) AS sv FROM ev WHERE id % 3 = 0 GROUP BY id",
    "SELECT s, max(s) AS ms, count(*) AS n FROM ev GROUP BY s",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_slots_are_aligned_under_pruning_filters_and_batch_sizes() {
    let dir = table_dir(1_000_000_007);
    for (batch_size, pushdown) in [(8192, false), (1000, true), (7, false), (7, true), (1, true)] {
        let ctx = mphf_session(dir.path(), batch_size, pushdown).await;
        // The output keys come from the index: no file is decoded with its key column, unless
        // an aggregate argument or a filter above the scan reads the key. With filter pushdown
        // the filter on the key runs inside the Parquet reader, which reads the key for it,
        // and the scan's batches need no key.
        let key_mode = |q: &str| match (q.contains("WHERE id"), pushdown) {
            (true, true) => "key=unread in mapped files",
            _ => "key=read",
        };
        let cases = QUERIES
            .iter()
            .map(|q| (*q, "key=unread in mapped files"))
            .chain(KEY_READING_QUERIES.iter().map(|q| (*q, key_mode(q))));
        for (sql, key_mode) in cases {
            let want = vanilla_rows(dir.path(), sql, batch_size, pushdown).await;
            let (got, plan, input_rows, scan_rows) = mphf_run(&ctx, sql).await;
            let case = format!("batch {batch_size}, pushdown {pushdown}: {sql}\n{plan}");
            assert_eq!(got, want, "{case}");
            assert!(plan.contains("SlotScanExec"), "{case}");
            assert!(input_rows > 0, "{case}");
            assert_eq!(scan_rows, input_rows, "every row has its slot from the scan: {case}");
            assert!(plan.contains(key_mode), "{case}");
        }
        // LIMIT over the slot-scanned aggregate, and mphf_index beside it, still agree.
        let sql = "SELECT id, sum(v) FROM ev GROUP BY id ORDER BY id LIMIT 7";
        assert_eq!(
            mphf_run(&ctx, sql).await.0,
            vanilla_rows(dir.path(), sql, batch_size, pushdown).await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_maps_are_saved_reused_and_remade_when_corrupt() {
    let dir = table_dir(77);
    let sql = QUERIES[0];
    let want = vanilla_rows(dir.path(), sql, 8192, false).await;
    let first = mphf_session(dir.path(), 8192, false).await;
    assert_eq!(mphf_run(&first, sql).await.0, want);
    let slots = dir.path().join("_mphf").join("ev.id.mphf.slots");
    assert!(slots.is_file(), "slot maps saved at {}", slots.display());
    drop(first);

    // A new session reuses the saved index and its slot maps.
    let again = MphfContext::with_config(config(8192, false));
    again
        .register_parquet("ev", dir.path().to_str().unwrap())
        .await
        .unwrap();
    let before = std::fs::metadata(&slots).unwrap().modified().unwrap();
    let (got, plan, input_rows, scan_rows) = {
        again.tune(|t| {
            t.aggregate_min_slots = 0;
            t.aggregate_max_slot_entries_per_row = 1e9;
        });
        mphf_run(&again, sql).await
    };
    assert_eq!(got, want, "{plan}");
    assert_eq!((scan_rows, input_rows > 0), (input_rows, true), "{plan}");
    assert_eq!(
        std::fs::metadata(&slots).unwrap().modified().unwrap(),
        before,
        "reused, not rewritten"
    );
    drop(again);

    // A corrupt slot-map file is refused and made again; results stay right.
    let mut bytes = std::fs::read(&slots).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&slots, &bytes).unwrap();
    let third = mphf_session(dir.path(), 8192, false).await;
    let (got, plan, input_rows, scan_rows) = mphf_run(&third, sql).await;
    assert_eq!(got, want, "{plan}");
    assert_eq!(scan_rows, input_rows, "{plan}");
    assert_ne!(std::fs::read(&slots).unwrap(), bytes, "remade");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_with_the_same_name_size_and_mtime_gets_vanillas_answer() {
    let dir = table_dir(500);
    let sql = QUERIES[0];
    let ctx = mphf_session(dir.path(), 4096, false).await;
    let (got, plan, input_rows, scan_rows) = mphf_plan_run(&ctx, sql).await;
    assert_eq!(got, vanilla_rows(dir.path(), sql, 4096, false).await);
    assert_eq!(scan_rows, input_rows);
    assert_eq!(scan_metric_sum(&plan, "key_unread_rows"), (FILES * ROWS) as usize);

    // Rewrite file 0 with other ids, keeping its name, size and modification time.
    let target = dir.path().join("part-0.parquet");
    let old = std::fs::metadata(&target).unwrap();
    let other = tempfile::tempdir().unwrap();
    let replacement = other.path().join("part-0.parquet");
    write_file(&replacement, 0, 900);
    assert_eq!(std::fs::metadata(&replacement).unwrap().len(), old.len(), "same size");
    std::fs::copy(&replacement, &target).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&target)
        .unwrap()
        .set_modified(old.modified().unwrap())
        .unwrap();
    let now = std::fs::metadata(&target).unwrap();
    assert_eq!(
        (now.len(), now.modified().unwrap()),
        (old.len(), old.modified().unwrap())
    );

    // The live session sees the rewrite at scan time; a new one at registration.
    let want = vanilla_rows(dir.path(), sql, 4096, false).await;
    let (got, plan, input_rows, scan_rows) = mphf_plan_run(&ctx, sql).await;
    let text = displayable(plan.as_ref()).indent(true).to_string();
    assert_eq!(got, want, "{text}");
    assert!(
        scan_rows < input_rows,
        "the rewritten file's rows were looked up: {text}"
    );
    // The rewritten file was decoded with its key; only the other one without.
    assert_eq!(scan_metric_sum(&plan, "key_unread_rows"), ROWS as usize, "{text}");
    assert_eq!(scan_metric_sum(&plan, "stored_slot_rows"), ROWS as usize, "{text}");
    // mphf_index over the rewritten file answers as the lookup (its stored slots are unused).
    let stored = "SELECT seq, mphf_index(id) AS slot FROM ev";
    let looked_up = "SELECT seq, mphf_index('ev_id', id) AS slot FROM ev";
    assert_eq!(mphf_run(&ctx, stored).await.0, mphf_run(&ctx, looked_up).await.0);
    let fresh = mphf_session(dir.path(), 4096, false).await;
    let (got, plan, input_rows, scan_rows) = mphf_run(&fresh, sql).await;
    assert_eq!(got, want, "{plan}");
    assert_eq!(scan_rows, input_rows, "remade for the new content: {plan}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mphf_index_over_the_scan_returns_the_stored_slots() {
    let dir = table_dir(3_000_000_019);
    for (batch_size, pushdown) in [(8192, false), (7, true), (1, false)] {
        let ctx = mphf_session(dir.path(), batch_size, pushdown).await;
        for filter in ["", "WHERE seq >= 12500", "WHERE v % 3 = 0 OR seq < 40"] {
            for (key, index) in [("id", "ev_id"), ("s", "ev_s")] {
                // `seq` is unique: a slot handed to a neighbouring row changes a (seq, slot) pair.
                let stored = format!("SELECT seq, mphf_index({key}) AS slot FROM ev {filter}");
                let looked_up = format!("SELECT seq, mphf_index('{index}', {key}) AS slot FROM ev {filter}");
                let (got, plan, _, _) = mphf_run(&ctx, &stored).await;
                let case = format!("batch {batch_size}, pushdown {pushdown}: {stored}\n{plan}");
                assert!(
                    plan.contains("mphf_stored_slots(") && plan.contains("SlotScanExec"),
                    "{case}"
                );
                // No other expression or filter reads the key: mapped files are scanned
                // without it.
                assert!(plan.contains("key=unread in mapped files"), "{case}");
                let (want, lookup_plan, _, _) = mphf_run(&ctx, &looked_up).await;
                assert!(!lookup_plan.contains("mphf_stored_slots("), "{lookup_plan}");
                assert_eq!(got, want, "{case}");
                // The key beside its slots is read from every file.
                let with_key = format!("SELECT seq, {key}, mphf_index({key}) AS slot FROM ev {filter}");
                let with_key_looked_up =
                    format!("SELECT seq, {key}, mphf_index('{index}', {key}) AS slot FROM ev {filter}");
                let (got, plan, _, _) = mphf_run(&ctx, &with_key).await;
                assert!(
                    plan.contains("mphf_stored_slots(") && plan.contains("key=read"),
                    "{plan}"
                );
                assert_eq!(got, mphf_run(&ctx, &with_key_looked_up).await.0, "{plan}");
            }
            // The scan carries one index's slots: the second key of a projection is looked up.
            let both = format!("SELECT seq, mphf_index(id) AS a, mphf_index(s) AS b FROM ev {filter}");
            let both_looked_up =
                format!("SELECT seq, mphf_index('ev_id', id) AS a, mphf_index('ev_s', s) AS b FROM ev {filter}");
            let (got, plan, _, _) = mphf_run(&ctx, &both).await;
            assert_eq!(plan.matches("mphf_stored_slots(").count(), 1, "{plan}");
            assert_eq!(got, mphf_run(&ctx, &both_looked_up).await.0, "{plan}");
        }
        // NULL keys (every 101st row) get NULL slots; LIMIT over the stored slots.
        let nulls = "SELECT count(*) AS n FROM (SELECT mphf_index(id) AS slot FROM ev) WHERE slot IS NULL";
        let null_ids = "SELECT count(*) AS n FROM ev WHERE id IS NULL";
        assert_eq!(
            mphf_run(&ctx, nulls).await.0,
            vanilla_rows(dir.path(), null_ids, batch_size, pushdown).await
        );
        let limited = "SELECT seq, mphf_index(id) AS slot FROM ev ORDER BY seq LIMIT 5";
        let limited_lookup = "SELECT seq, mphf_index('ev_id', id) AS slot FROM ev ORDER BY seq LIMIT 5";
        assert_eq!(mphf_run(&ctx, limited).await.0, mphf_run(&ctx, limited_lookup).await.0);
        // Called from SQL, the stored-slots function trusts no column but a scan's slot column:
        // `seq` as UInt32 is not taken for slots, the key is looked up.
        let forged = "SELECT seq, mphf_stored_slots(arrow_cast(seq, 'UInt32'), id) AS slot FROM ev";
        let looked_up = "SELECT seq, mphf_index('ev_id', id) AS slot FROM ev";
        assert_eq!(mphf_run(&ctx, forged).await.0, mphf_run(&ctx, looked_up).await.0);
    }
}

/// The scan lines of a plan's text (`DataSourceExec` and `SlotScanExec`).
fn scan_lines(plan: &str) -> Vec<&str> {
    plan.lines()
        .filter(|l| l.contains("DataSourceExec") || l.contains("SlotScanExec"))
        .collect()
}

/// The index's `MphfRelabelExec` over an indexed table's scan passes DataFusion's filter, sort
/// and projection pushdown through: a TopK's and a hash join's dynamic filters reach the
/// Parquet scan of the indexed table as they do without indexes (row groups that cannot
/// qualify are skipped while the query runs), a scan reverses its row groups for a descending
/// sort when vanilla's does, and the rows stay vanilla's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_filters_reach_the_scan_of_an_indexed_table() {
    let dir = table_dir(1_000_000_007);
    let ctx = mphf_session(dir.path(), 8192, true).await;
    ctx.sql("SET mphf.enable_join = false")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let queries = [
        // TopK: its dynamic filter on `v` goes to the scan.
        "SELECT id, s, v FROM ev ORDER BY v DESC LIMIT 5",
        // Over the clustered `seq`, the scan also reverses its row groups for the sort, as
        // DataFusion's does without indexes.
        "SELECT id, seq FROM ev ORDER BY seq DESC LIMIT 5",
        // The join's build side (a few ids) filters the probe side's scan of `ev` on `id`.
        "SELECT count(*) AS n, sum(e.v) AS sv FROM ev e JOIN (SELECT id FROM ev WHERE seq < 40) d ON e.id = d.id",
    ];
    for sql in queries {
        let vanilla_ctx = SessionContext::new_with_config(config(8192, true));
        vanilla_ctx
            .register_parquet("ev", dir.path().to_str().unwrap(), Default::default())
            .await
            .unwrap();
        let vanilla_plan = vanilla_ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        let vanilla_text = displayable(vanilla_plan.as_ref()).indent(true).to_string();
        let (rows, text, _, _) = mphf_run(&ctx, sql).await;
        let scans_with = |text: &str, what: &str| scan_lines(text).iter().filter(|l| l.contains(what)).count();
        assert!(
            scans_with(&vanilla_text, "DynamicFilter") > 0,
            "{sql}: vanilla pushes no dynamic filter:\n{vanilla_text}"
        );
        assert!(
            !sql.contains("seq DESC") || scans_with(&vanilla_text, "reverse_row_groups=true") > 0,
            "{sql}: vanilla does not reverse the row groups:\n{vanilla_text}"
        );
        for what in ["DynamicFilter", "reverse_row_groups=true"] {
            assert_eq!(
                scans_with(&text, what),
                scans_with(&vanilla_text, what),
                "{sql}: the indexed table's scan differs from vanilla's in {what}:\n{text}\nvanilla:\n{vanilla_text}"
            );
        }
        assert!(
            text.contains("MphfRelabelExec"),
            "{sql}: the index is not in the plan:\n{text}"
        );
        assert_eq!(rows, vanilla_rows(dir.path(), sql, 8192, true).await, "{sql}");
    }
}

/// The first slot scan in `plan`.
fn find_slot_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.name() == "SlotScanExec" {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(find_slot_scan)
}

/// A slot scan reports the statistics of the scan it replaces (the files' row counts), one
/// column statistic per output column: the planner's estimates above it (a join's probe side)
/// read them. Without them the row count was unknown, and the join model priced a 10 M-row
/// probe side at its build side's 200 K rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_scan_reports_its_files_rows() {
    use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
    let dir = table_dir(1_000_000_007);
    let ctx = mphf_session(dir.path(), 8192, false).await;
    let (_, plan, _, _) = mphf_plan_run(&ctx, "SELECT id, count(*) AS n FROM ev GROUP BY id").await;
    let scan = find_slot_scan(&plan).expect("a slot scan in the plan");
    let stats = StatisticsContext::new()
        .compute(scan.as_ref(), &StatisticsArgs::new())
        .unwrap();
    assert_eq!(stats.num_rows.get_value(), Some(&((ROWS * FILES) as usize)));
    assert_eq!(stats.column_statistics.len(), scan.schema().fields().len());
}

/// Joins whose build key is the indexed `id` of the Parquet table read each build row's slot
/// from the slot maps (a slot scan under the build side) instead of querying the MPHF, in every
/// join type and under filters, projections and batch sizes, with vanilla's rows. `id` repeats
/// (a CSR build table) and is NULL in every 101st row. After a file is rewritten under the
/// index, its rows are looked up instead, and the rows stay vanilla's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_build_from_stored_slots() {
    let dir = table_dir(1_000_000_007);
    let queries = [
        "SELECT count(*) AS n, sum(a.v) AS sa, sum(b.v) AS sb FROM (SELECT id, v FROM ev WHERE seq % 5 = 0) a JOIN ev b ON a.id = b.id",
        "SELECT b.s, count(*) AS n, sum(a.v) AS sa FROM (SELECT id, v FROM ev WHERE seq < 900) a JOIN ev b ON a.id = b.id GROUP BY b.s",
        "SELECT a.seq, b.seq AS bseq FROM (SELECT id, seq FROM ev WHERE seq < 300) a LEFT JOIN (SELECT id, seq FROM ev WHERE v % 3 = 0) b ON a.id = b.id",
        "SELECT count(*) AS n, sum(v) AS sv FROM ev WHERE id IN (SELECT id FROM ev WHERE seq < 4000)",
        "SELECT count(*) AS n, sum(v) AS sv FROM ev a WHERE NOT EXISTS (SELECT 1 FROM ev b WHERE b.id = a.id AND b.seq < 4000)",
    ];
    let session = |batch_size: usize| {
        let dir = dir.path().to_path_buf();
        async move {
            let ctx = mphf_session(&dir, batch_size, false).await;
            ctx.tune(|t| {
                t.join_min_slots = 0;
                t.join_min_probe_rows_per_run = 0.0;
                t.join_yield_to_array_map = false;
            });
            ctx
        }
    };
    for batch_size in [8192, 333] {
        let ctx = session(batch_size).await;
        for sql in queries {
            let (got, plan, _, _) = mphf_plan_run(&ctx, sql).await;
            let text = displayable(plan.as_ref()).indent(true).to_string();
            let case = format!("batch {batch_size}: {sql}\n{text}");
            assert_eq!(got, vanilla_rows(dir.path(), sql, batch_size, false).await, "{case}");
            let build_rows = join_metric_sum(&plan, "build_rows");
            assert!(build_rows > 0, "an MPHF join ran: {case}");
            assert_eq!(
                join_metric_sum(&plan, "build_stored_slot_rows"),
                build_rows,
                "every build row has its slot from the scan: {case}"
            );
        }
    }

    // Rewrite file 0 with other ids under a live session's index (same name, size and
    // modification time): its rows are looked up (not in the index: strays), the other
    // file's slots are copied.
    let ctx = session(8192).await;
    let target = dir.path().join("part-0.parquet");
    let old = std::fs::metadata(&target).unwrap();
    let other = tempfile::tempdir().unwrap();
    write_file(&other.path().join("part-0.parquet"), 0, 900);
    std::fs::copy(other.path().join("part-0.parquet"), &target).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&target)
        .unwrap()
        .set_modified(old.modified().unwrap())
        .unwrap();
    let semi = "SELECT count(*) AS n, sum(v) AS sv FROM ev WHERE id IN (SELECT id FROM ev WHERE seq % 4 = 0)";
    for sql in [queries[0], semi] {
        let (got, plan, _, _) = mphf_plan_run(&ctx, sql).await;
        let text = displayable(plan.as_ref()).indent(true).to_string();
        assert_eq!(got, vanilla_rows(dir.path(), sql, 8192, false).await, "{sql}\n{text}");
        let (build_rows, stored) = (
            join_metric_sum(&plan, "build_rows"),
            join_metric_sum(&plan, "build_stored_slot_rows"),
        );
        assert!(
            0 < stored && stored < build_rows,
            "{stored} of {build_rows}: {sql}\n{text}"
        );
    }
}

/// Every node of a plan, depth first.
fn all_nodes(plan: &Arc<dyn ExecutionPlan>, out: &mut Vec<Arc<dyn ExecutionPlan>>) {
    out.push(Arc::clone(plan));
    for child in plan.children() {
        all_nodes(child, out);
    }
}

/// The rules price a candidate on whether a slot-map scan would go under its input
/// (`scan_slots_reach`) and attach the scan (`attach_scan_slots`) only to the one they keep:
/// both must answer alike for every node and indexed column of a plan, through projections,
/// filters, repartitions and coalesces, whether the key is read or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pricing_finds_the_slot_scans_that_attaching_builds() {
    use datafusion_mphf::datafusion::index_of_field;
    use datafusion_mphf::datafusion::slot_scan::{attach_scan_slots, scan_slots_reach, KeyColumn};
    let dir = table_dir(1_000_000_007);
    let ctx = mphf_session(dir.path(), 8192, false).await;
    for sql in ["SET mphf.enable_aggregate = false", "SET mphf.enable_join = false"] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    let (mut reached, mut missed) = (0, 0);
    for sql in [
        "SELECT id, count(*), sum(v) FROM ev WHERE seq % 5 = 0 GROUP BY id",
        "SELECT s, max(v) FROM (SELECT s, v + 1 AS v FROM ev) GROUP BY s",
        "SELECT count(*) FROM (SELECT id, v FROM ev WHERE seq < 900) a JOIN ev b ON a.id = b.id",
        "SELECT b.s, count(*) FROM (SELECT id FROM ev WHERE v % 3 = 0) a JOIN ev b ON a.id = b.id GROUP BY b.s",
        "SELECT id + 1 AS k, count(*) FROM ev GROUP BY id + 1",
    ] {
        let plan = ctx.sql(sql).await.unwrap().create_physical_plan().await.unwrap();
        let mut nodes = Vec::new();
        all_nodes(&plan, &mut nodes);
        for node in &nodes {
            let schema = node.schema();
            for (col, field) in schema.fields().iter().enumerate() {
                let Some(handle) = index_of_field(field) else {
                    continue;
                };
                for key_column in [KeyColumn::Read, KeyColumn::WhereNoSlots] {
                    let priced = scan_slots_reach(node, col, &handle, key_column).unwrap();
                    let attached = attach_scan_slots(node, col, &handle, key_column).unwrap();
                    assert_eq!(priced, attached.is_some(), "{sql}: {} column {col}", node.name());
                    match priced {
                        true => reached += 1,
                        false => missed += 1,
                    }
                }
            }
        }
    }
    assert!(
        reached > 10 && missed > 0,
        "{reached} nodes reach a slot scan, {missed} do not"
    );
}
