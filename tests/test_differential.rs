//! The differential SQL test in `cargo test`: generated queries over generated tables (sparse
//! ids, Unicode strings, dates, timestamps, Int32 and UInt64 keys, NULLs, absent keys,
//! duplicates), each run in vanilla DataFusion, in the extension with default costing and in
//! the extension with costing off, at varying partitions and batch sizes (see
//! `datafusion_mphf::cli::difftest`). Every result must equal vanilla's; a failure prints the
//! seed, the settings and the SQL. `mphf difftest` runs the same suite at any size, and
//! `benches/duckdb_diff.py` compares it with DuckDB.

use datafusion_mphf::cli::difftest::{run_generated, run_tpch, Report, Source};

fn assert_clean(report: &Report) {
    let problems: Vec<String> = report
        .reference_errors
        .iter()
        .chain(&report.failures)
        .map(|f| f.to_string())
        .collect();
    assert!(
        problems.is_empty(),
        "{} of {} queries failed:\n{}",
        problems.len(),
        report.queries,
        problems.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_queries_in_memory_equal_vanilla() {
    for seed in [101, 202] {
        let report = run_generated(seed, 160, Source::Memory, None)
            .await
            .expect("suite runs");
        assert_eq!(report.queries, 160);
        assert_clean(&report);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_queries_over_parquet_equal_vanilla() {
    let dir = tempfile::tempdir().expect("temp dir");
    let report = run_generated(303, 100, Source::Parquet, Some(dir.path()))
        .await
        .expect("suite runs");
    assert_eq!(report.queries, 100);
    assert_clean(&report);
    let lines = std::fs::read_to_string(dir.path().join("queries.jsonl")).expect("queries.jsonl");
    assert_eq!(lines.lines().count(), 100);
    assert!(dir.path().join("f.parquet").exists());
}

/// The same kind of suite, and TPC-H Q1–Q22, compared with DuckDB on the same Parquet files by
/// `benches/duckdb_diff.py` (skipped, with a message, when python3 or DuckDB's package is
/// missing; `.ci/run` installs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_agrees_on_generated_queries_and_tpch() {
    let has_duckdb = std::process::Command::new("python3")
        .args(["-c", "import duckdb"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_duckdb {
        eprintln!("skipped: python3 with DuckDB's package is not available (pip install duckdb)");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (generated, tpch) = (dir.path().join("seed-404"), dir.path().join("tpch"));
    let report = run_generated(404, 150, Source::Parquet, Some(&generated))
        .await
        .expect("suite runs");
    assert_clean(&report);
    let report = run_tpch(0.05, &tpch).await.expect("TPC-H runs");
    assert_eq!(report.queries, 22);
    assert_clean(&report);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/duckdb_diff.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg("--check-dir")
        .arg(&generated)
        .arg("--check-dir")
        .arg(&tpch)
        .output()
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "DuckDB disagrees:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("duckdb_diff: "), "{text}");
}
