//! Tests of the `mphf` binary (issue 2 item 7): build → inspect → lookup on Parquet files written
//! here, and the error paths (missing column, unsupported type, corrupt index).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;

fn mphf(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mphf"))
        .args(args)
        .output()
        .expect("run mphf")
}

fn ok(args: &[&str]) -> String {
    let out = mphf(args);
    assert!(
        out.status.success(),
        "mphf {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn fails(args: &[&str]) -> String {
    let out = mphf(args);
    assert!(!out.status.success(), "mphf {args:?} succeeded");
    String::from_utf8(out.stderr).unwrap()
}

fn write_parquet(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|(_, a)| a).collect()).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn read_parquet(path: &Path) -> RecordBatch {
    let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
}

struct Files {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Files {
    fn new() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        Files { _dir: dir, root }
    }
    fn path(&self, name: &str) -> String {
        self.root.join(name).to_str().unwrap().to_string()
    }
}

/// Creates the folder of table `t` and returns the path of its one data file.
fn folder_table(files: &Files) -> String {
    std::fs::create_dir_all(files.path("t")).unwrap();
    files.path("t/part.parquet")
}

/// A table with an Int64 key column (NULLs, duplicates), a string column and a float column.
fn sample(files: &Files) -> String {
    let ids: Vec<Option<i64>> = (0..3000)
        .map(|i| if i % 10 == 0 { None } else { Some((i % 1000) * 3) })
        .collect();
    let names: Vec<Option<String>> = (0..3000)
        .map(|i| {
            if i % 7 == 0 {
                None
            } else {
                Some(format!("n{}", i % 500))
            }
        })
        .collect();
    let floats: Vec<f64> = (0..3000).map(|i| i as f64).collect();
    let path = files.path("data.parquet");
    write_parquet(
        Path::new(&path),
        vec![
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("name", Arc::new(StringArray::from(names)) as ArrayRef),
            ("price", Arc::new(Float64Array::from(floats)) as ArrayRef),
        ],
    );
    path
}

#[test]
fn build_inspect_lookup_int_column() {
    let files = Files::new();
    let data = sample(&files);
    let index = files.path("id.mphf");
    let summary = ok(&["build", "--input", &data, "--column", "id", "--output", &index]);
    let line = summary.trim();
    assert_eq!(summary.lines().count(), 1, "{summary}");
    // Keys v·3 for v in 0..1000 with v % 10 ≠ 0 (v % 10 = 0 rows are NULL).
    assert!(line.starts_with("keys 900, bits/key "), "{line}");
    assert!(line.contains(" (MPHF), index bytes "), "{line}");
    assert!(line.ends_with(" s"), "{line}");

    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", &index])).unwrap();
    assert_eq!(json["keys"], 900);
    assert_eq!(json["rows"], 3000);
    assert_eq!(json["nulls"], 300);
    assert_eq!(json["leaf"], 8);
    assert_eq!(json["bucket"], 100);
    assert_eq!(json["rotation"], false);
    assert_eq!(json["seed"], 0);
    assert_eq!(json["key_type"], "Int64");
    assert_eq!(json["format_version"], 1);
    assert_eq!(json["device"], "cpu");
    assert_eq!(json["bytes"], std::fs::metadata(&index).unwrap().len());
    let bpk = json["mphf_bits_per_key"].as_f64().unwrap();
    assert!(bpk > 1.0 && bpk < 10.0, "{bpk}");
    let index_bytes = line.split("index bytes ").nth(1).unwrap().split(',').next().unwrap();
    assert_eq!(index_bytes, json["bytes"].to_string());

    // Probe with members, non-members and NULLs.
    let probe = files.path("probe.parquet");
    let ids: Vec<Option<i64>> = vec![
        Some(3),
        Some(6),
        Some(4),
        None,
        Some(2997),
        Some(3000),
        Some(3),
        Some(30),
    ];
    write_parquet(
        Path::new(&probe),
        vec![("id", Arc::new(Int64Array::from(ids.clone())) as ArrayRef)],
    );
    let out = files.path("out.parquet");
    assert_eq!(
        ok(&["lookup", "--index", &index, "--input", &probe, "--column", "id", "--output", &out]),
        ""
    );
    let batch = read_parquet(Path::new(&out));
    assert_eq!(batch.schema().field(0).name(), "id");
    assert_eq!(batch.schema().field(1).name(), "slot");
    assert_eq!(batch.schema().field(1).data_type(), &DataType::UInt32);
    let got_ids = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!(got_ids, &Int64Array::from(ids));
    let slots = batch.column(1).as_any().downcast_ref::<UInt32Array>().unwrap();
    let valid: Vec<bool> = (0..slots.len()).map(|i| slots.is_valid(i)).collect();
    assert_eq!(valid, [true, true, false, false, true, false, true, false]);
    assert_eq!(slots.value(0), slots.value(6));
    assert_ne!(slots.value(0), slots.value(1));

    // Looking up the build column itself: every non-NULL row gets a slot < 900, equal keys
    // equal slots, distinct keys distinct slots.
    let out = files.path("self.parquet");
    ok(&[
        "lookup", "--index", &index, "--input", &data, "--column", "id", "--output", &out,
    ]);
    let batch = read_parquet(Path::new(&out));
    assert_eq!(batch.num_rows(), 3000);
    let ids = batch.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
    let slots = batch.column(1).as_any().downcast_ref::<UInt32Array>().unwrap();
    let mut by_key = HashMap::new();
    let mut by_slot = HashMap::new();
    for i in 0..batch.num_rows() {
        assert_eq!(ids.is_null(i), slots.is_null(i));
        if ids.is_valid(i) {
            let (k, s) = (ids.value(i), slots.value(i));
            assert!(s < 900);
            assert_eq!(*by_key.entry(k).or_insert(s), s);
            assert_eq!(*by_slot.entry(s).or_insert(k), k);
        }
    }
    assert_eq!(by_slot.len(), 900);
}

#[test]
fn build_string_column_with_parameters() {
    let files = Files::new();
    let data = sample(&files);
    let index = files.path("name.mphf");
    let args = [
        "build",
        "--input",
        &data,
        "--column",
        "name",
        "--leaf",
        "5",
        "--bucket",
        "5",
        "--rotation",
        "--threads",
        "1",
        "--seed",
        "7",
        "--output",
        &index,
    ];
    assert!(ok(&args).starts_with("keys 500, "));
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", &index])).unwrap();
    assert_eq!(json["leaf"], 5);
    assert_eq!(json["bucket"], 5);
    assert_eq!(json["rotation"], true);
    assert_eq!(json["seed"], 7);
    assert_eq!(json["key_type"], "Utf8");
    assert_eq!(json["keys"], 500);
    let out = files.path("out.parquet");
    ok(&[
        "lookup", "--index", &index, "--input", &data, "--column", "name", "--output", &out,
    ]);
    let batch = read_parquet(Path::new(&out));
    let slots = batch.column(1);
    assert_eq!(slots.null_count(), batch.column(0).null_count());
}

#[test]
fn errors_are_clear() {
    let files = Files::new();
    let data = sample(&files);
    let index = files.path("x.mphf");

    let e = fails(&["build", "--input", &data, "--column", "nope", "--output", &index]);
    assert!(
        e.contains(&format!(
            "column \"nope\" not found in {data} (columns: id, name, price)"
        )),
        "{e}"
    );
    let e = fails(&["build", "--input", &data, "--column", "price", "--output", &index]);
    assert!(
        e.contains(&format!(
            "column \"price\" in {data}: unsupported key type Float64: supported are"
        )),
        "{e}"
    );
    assert!(!Path::new(&index).exists());
    let missing = files.path("missing.parquet");
    let e = fails(&["build", "--input", &missing, "--column", "id", "--output", &index]);
    assert!(e.contains(&format!("{missing}: No such file or directory")), "{e}");
    let e = fails(&[
        "build", "--input", &data, "--column", "id", "--leaf", "40", "--output", &index,
    ]);
    assert!(e.contains("invalid parameter: leaf size 40 is outside 2..=24"), "{e}");

    ok(&["build", "--input", &data, "--column", "id", "--output", &index]);
    let out = files.path("out.parquet");
    let e = fails(&[
        "lookup", "--index", &index, "--input", &data, "--column", "name", "--output", &out,
    ]);
    assert!(
        e.contains("key type mismatch: the index holds Int64 keys, the probe column is Utf8"),
        "{e}"
    );
    let e = fails(&[
        "lookup", "--index", &index, "--input", &data, "--column", "price", "--output", &out,
    ]);
    assert!(e.contains("unsupported key type Float64"), "{e}");

    let mut bytes = std::fs::read(&index).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x55;
    let corrupt = files.path("corrupt.mphf");
    std::fs::write(&corrupt, &bytes).unwrap();
    let e = fails(&["inspect", &corrupt]);
    assert!(
        e.contains(&format!("{corrupt}: invalid index file: checksum mismatch")),
        "{e}"
    );
    let e = fails(&[
        "lookup", "--index", &corrupt, "--input", &data, "--column", "id", "--output", &out,
    ]);
    assert!(e.contains("invalid index file: checksum mismatch"), "{e}");
    std::fs::write(&corrupt, &bytes[..n / 2]).unwrap();
    let e = fails(&["inspect", &corrupt]);
    assert!(e.contains("invalid index file: truncated"), "{e}");
    std::fs::write(&corrupt, b"PAR1 this is not an index").unwrap();
    let e = fails(&["inspect", &corrupt]);
    assert!(
        e.contains("invalid index file: bad magic number: not an mphf column index"),
        "{e}"
    );
    let e = fails(&["inspect", &files.path("none.mphf")]);
    assert!(e.contains("none.mphf: No such file or directory"), "{e}");
    for threads in ["0", "100000"] {
        let e = fails(&[
            "build",
            "--input",
            &data,
            "--column",
            "id",
            "--threads",
            threads,
            "--output",
            &index,
        ]);
        assert!(
            e.contains(&format!("--threads must be between 1 and 1024, got {threads}")),
            "{e}"
        );
    }
    let e = fails(&[
        "tpch",
        "--scale",
        "0.001",
        "--threads",
        "5000",
        "--output",
        &files.path("t"),
    ]);
    assert!(e.contains("--threads must be between 1 and 1024, got 5000"), "{e}");
}

/// `mphf tpch` then `mphf sql` twice: dense slots, and the second run reuses the saved index.
#[test]
fn tpch_then_sql_reuses_the_saved_index() {
    let files = Files::new();
    let dir = files.path("tpch");
    ok(&["tpch", "--scale", "0.01", "--output", &dir, "--tables", "lineitem"]);
    let lineitem = format!("lineitem={dir}/lineitem.parquet");
    let args = [
        "sql",
        "--format",
        "csv",
        "--table",
        &lineitem,
        "-c",
        "CREATE INDEX li_ok ON lineitem USING mphf (l_orderkey)",
        "-c",
        "SELECT count(DISTINCT mphf_index(l_orderkey)) AS n, max(mphf_index(l_orderkey)) AS m FROM lineitem",
    ];
    let first = mphf(&args);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(String::from_utf8_lossy(&first.stdout).contains("n,m\n15000,14999\n"));
    assert!(!String::from_utf8_lossy(&first.stderr).contains("reusing saved MPHF index"));
    assert!(Path::new(&format!("{dir}/_mphf/lineitem.l_orderkey.mphf")).exists());
    let second = mphf(&args);
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    assert!(String::from_utf8_lossy(&second.stdout).contains("n,m\n15000,14999\n"));
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("reusing saved MPHF index li_ok on lineitem(l_orderkey)"),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let e = fails(&[
        "sql",
        "--table",
        &lineitem,
        "-c",
        "SELECT mphf_index(l_partkey) FROM lineitem",
    ]);
    assert!(e.contains("column 'l_partkey' has no MPHF index"), "{e}");
}

/// `mphf sql --on-stale refuse` holds from the first registration; `--memory-limit` bounds the
/// session's pool and rejects a bad size; a script's `CREATE INDEX` re-runs after a rebuild.
#[test]
fn sql_on_stale_and_memory_limit_flags() {
    let files = Files::new();
    let data = folder_table(&files);
    let ids = |n: i64| Arc::new(Int64Array::from_iter_values(0..n)) as ArrayRef;
    write_parquet(Path::new(&data), vec![("id", ids(1000))]);
    let table = format!("t={}", files.path("t"));
    let create = "CREATE INDEX t_id ON t USING mphf (id)";
    ok(&["sql", "-q", "--table", &table, "-c", create]);
    write_parquet(Path::new(&data), vec![("id", ids(2000))]);
    let e = fails(&["sql", "-q", "--on-stale", "refuse", "--table", &table, "-c", "SELECT 1"]);
    assert!(e.contains("is stale") && e.contains("mphf.on_stale = 'refuse'"), "{e}");
    let out = ok(&[
        "sql",
        "-q",
        "--format",
        "csv",
        "--table",
        &table,
        "-c",
        create,
        "-c",
        "SELECT count(DISTINCT mphf_index(id)) AS n FROM t",
    ]);
    assert!(out.contains("2000"), "{out}");
    let e = fails(&["sql", "-q", "--on-stale", "bogus", "-c", "SELECT 1"]);
    assert!(e.contains("unknown stale-index policy 'bogus'"), "{e}");
    let e = fails(&["sql", "-q", "--memory-limit", "12Q", "-c", "SELECT 1"]);
    assert!(e.contains("'12Q' is not a size"), "{e}");
    let big = "SELECT count(*) FROM (SELECT value % 100000 AS k, count(*) FROM generate_series(1, 1000000) GROUP BY k)";
    // One partition: with several, vanilla DataFusion 55 under a 64 KiB pool was seen to hang
    // once (every thread parked, in a clean-clone CI run under load).
    let one = "SET datafusion.execution.target_partitions = 1";
    let e = fails(&["sql", "-q", "--no-mphf", "--memory-limit", "64K", "-c", one, "-c", big]);
    assert!(e.contains("Resources exhausted"), "{e}");
    let out = ok(&["sql", "-q", "--format", "csv", "--memory-limit", "1G", "-c", big]);
    assert!(out.contains("100000"), "{out}");
}

/// `mphf sql --tune` changes a planner threshold before the statements run (the threshold a
/// join is declined by shows the tuned value); bad pairs, and `--tune` without the extension,
/// are refused with clear errors.
#[test]
fn sql_tune_sets_a_planner_threshold() {
    let files = Files::new();
    let data = folder_table(&files);
    write_parquet(
        Path::new(&data),
        vec![("id", Arc::new(Int64Array::from_iter_values(0..1000)) as ArrayRef)],
    );
    let table = format!("t={}", files.path("t"));
    let create = "CREATE INDEX t_id ON t USING mphf (id)";
    let explain = "EXPLAIN SELECT count(*) FROM t a JOIN t b ON a.id = b.id";
    for (tune, reason) in [
        (None, "1000 slots, fewer than join_min_slots (4096)"),
        (
            Some("join_min_slots=5000"),
            "1000 slots, fewer than join_min_slots (5000)",
        ),
    ] {
        let mut args = vec!["sql", "-q", "--table", &table];
        if let Some(t) = tune {
            args.extend(["--tune", t]);
        }
        args.extend(["-c", create, "-c", explain]);
        let plan = ok(&args);
        assert!(plan.contains(reason), "{tune:?}: {plan}");
    }
    for (args, message) in [
        (
            vec!["--tune", "join_min_slots"],
            "--tune takes NAME=VALUE, got \"join_min_slots\"",
        ),
        (
            vec!["--tune", "no_such=1"],
            "no planner threshold or cost constant named \"no_such\"",
        ),
        (
            vec!["--tune", "join_min_slots=many"],
            "Tuning::join_min_slots: cannot parse \"many\"",
        ),
        (
            vec!["--no-mphf", "--tune", "join_min_slots=1"],
            "--tune changes the MPHF planner's thresholds; drop --no-mphf",
        ),
    ] {
        let err = fails(&[&["sql", "-q"], &args[..], &["-c", "SELECT 1"]].concat());
        assert!(err.contains(message), "{args:?}: {err}");
    }
}

/// Index memory is reserved in the pool before it is allocated: under a limit smaller than the
/// build, `CREATE INDEX` fails with a clear error and saves nothing; a saved index too large
/// for a later session's limit leaves its table usable without it.
#[test]
fn index_memory_is_reserved_before_it_is_used() {
    let files = Files::new();
    let data = folder_table(&files);
    let keys = Arc::new(StringArray::from_iter_values(
        (0..200_000).map(|i| format!("session-{i:08x}")),
    )) as ArrayRef;
    write_parquet(Path::new(&data), vec![("s", keys)]);
    let table = format!("t={}", files.path("t"));
    let create = "CREATE INDEX t_s ON t USING mphf (s)";
    let saved = || {
        // Index files only (each index also saves its slot maps beside it, `.mphf.slots`).
        std::fs::read_dir(files.path("t/_mphf"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "mphf"))
                    .count()
            })
            .unwrap_or(0)
    };
    let e = fails(&["sql", "-q", "--memory-limit", "4M", "--table", &table, "-c", create]);
    assert!(e.contains("Resources exhausted: MPHF index 't_s' on t(s): "), "{e}");
    assert!(e.contains("more than the memory pool has left"), "{e}");
    assert_eq!(saved(), 0, "a refused index writes nothing");
    ok(&["sql", "-q", "--table", &table, "-c", create]);
    assert_eq!(saved(), 1);
    let out = mphf(&[
        "sql",
        "--format",
        "csv",
        "--memory-limit",
        "2M",
        "--table",
        &table,
        "-c",
        "SELECT count(*) AS n FROM t WHERE s >= 'session-'",
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("200000"), "{stdout}");
    assert!(stderr.contains("reading its saved file needs"), "{stderr}");
    assert!(
        stderr.contains("table 't' is registered without this index"),
        "{stderr}"
    );
}

/// A checksum-valid but inconsistent file (the MPHF's leaf size edited, the checksum
/// recomputed): `inspect` and `lookup` refuse it with the bucket named; as a saved SQL index
/// it is rebuilt at registration, and the table answers as before.
#[test]
fn resealed_inconsistent_index_is_refused_and_rebuilt() {
    let files = Files::new();
    let data = folder_table(&files);
    let ids = Arc::new(Int64Array::from_iter_values((0..5000).map(|i| i * 7919))) as ArrayRef;
    write_parquet(Path::new(&data), vec![("id", ids)]);
    let edit_leaf = |path: &Path| {
        let mut b = std::fs::read(path).unwrap();
        let word = |b: &[u8], i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap());
        let leaf_at = 8 * (word(&b, 3) as usize + 1 + 2);
        assert_eq!(word(&b, leaf_at / 8), 8, "the default leaf size");
        b[leaf_at..leaf_at + 8].copy_from_slice(&2u64.to_le_bytes());
        let n = b.len();
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..n - 8]);
        b[n - 8..].copy_from_slice(&sum.to_le_bytes());
        std::fs::write(path, b).unwrap();
    };
    let index = files.path("id.mphf");
    ok(&["build", "--input", &data, "--column", "id", "--output", &index]);
    edit_leaf(Path::new(&index));
    let e = fails(&["inspect", &index]);
    assert!(e.contains("invalid index file: bucket "), "{e}");
    let out = files.path("slots.parquet");
    let e = fails(&[
        "lookup", "--index", &index, "--input", &data, "--column", "id", "--output", &out,
    ]);
    assert!(e.contains("invalid index file: bucket "), "{e}");
    assert!(!Path::new(&out).exists());

    let table = format!("t={}", files.path("t"));
    let query = "SELECT count(DISTINCT mphf_index(id)) AS n, count(mphf_index(id)) AS m FROM t";
    let create = "CREATE INDEX t_id ON t USING mphf (id)";
    ok(&["sql", "-q", "--table", &table, "-c", create]);
    let saved: Vec<PathBuf> = std::fs::read_dir(files.path("t/_mphf"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "mphf"))
        .collect();
    assert_eq!(saved.len(), 1);
    edit_leaf(&saved[0]);
    for _ in 0..2 {
        let out = mphf(&["sql", "--format", "csv", "--table", &table, "-c", query]);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{stderr}");
        assert!(stdout.contains("5000,5000"), "{stdout}");
        // The first run rebuilds the file, the second reuses the rebuilt one.
        assert!(
            stderr.contains("is corrupt (invalid index file: bucket ") || stderr.contains("reusing saved"),
            "{stderr}"
        );
    }
}

/// A data file rewritten with other keys but the same path, size, mtime and row count (what
/// `cp -p` and `rsync -t` leave) makes the saved index stale, and so does an added `_extra.parquet`
/// (DataFusion reads it): `mphf_index` answers for the new keys, never NULL for present ones.
#[test]
fn saved_index_sees_same_size_rewrites_and_underscore_files() {
    let files = Files::new();
    let data = folder_table(&files);
    let write = |lo: i64| {
        let keys = Arc::new(Int64Array::from_iter_values(lo..lo + 1000)) as ArrayRef;
        write_parquet(Path::new(&data), vec![("id", keys)]);
    };
    write(0);
    let before = std::fs::metadata(&data).unwrap();
    let table = format!("t={}", files.path("t"));
    ok(&[
        "sql",
        "-q",
        "--table",
        &table,
        "-c",
        "CREATE INDEX t_id ON t USING mphf (id)",
    ]);
    write(1_000_000);
    let after = std::fs::metadata(&data).unwrap();
    assert_eq!(before.len(), after.len(), "the rewrite must keep the size");
    File::options()
        .write(true)
        .open(&data)
        .unwrap()
        .set_modified(before.modified().unwrap())
        .unwrap();
    assert_eq!(
        std::fs::metadata(&data).unwrap().modified().unwrap(),
        before.modified().unwrap()
    );
    let count = "SELECT count(mphf_index(id)) AS n, count(*) AS m FROM t";
    let out = ok(&["sql", "-q", "--format", "csv", "--table", &table, "-c", count]);
    assert!(out.contains("1000,1000"), "{out}");
    let extra = files.path("t/_extra.parquet");
    let keys = Arc::new(Int64Array::from_iter_values(5_000_000..5_000_010)) as ArrayRef;
    write_parquet(Path::new(&extra), vec![("id", keys)]);
    let out = ok(&["sql", "-q", "--format", "csv", "--table", &table, "-c", count]);
    assert!(out.contains("1010,1010"), "{out}");
}

/// `mphf calibrate` writes every constant, the measured ones changed and positive, in the
/// form `--costs` reads back; bad sizes and bad cost files are refused with clear errors.
#[test]
fn calibrate_writes_costs_that_sql_reads() {
    let dir = tempfile::tempdir().unwrap();
    let costs = dir.path().join("costs.txt");
    let costs_arg = costs.to_str().unwrap();
    ok(&[
        "calibrate",
        "--rows",
        "4000",
        "--keys",
        "1000",
        "--runs",
        "1",
        "--out",
        costs_arg,
    ]);
    let text = std::fs::read_to_string(&costs).unwrap();
    let model = datafusion_mphf::datafusion::plan::CostModel::parse(&text).unwrap();
    let defaults = datafusion_mphf::datafusion::plan::CostModel::default();
    assert_eq!(
        model.to_text().lines().count(),
        datafusion_mphf::datafusion::plan::CostModel::names().len()
    );
    assert!(
        model.hash_aggregate_fixed_ns != defaults.hash_aggregate_fixed_ns,
        "{text}"
    );
    assert!(
        model.lookup_compact_bytes_ns != defaults.lookup_compact_bytes_ns,
        "{text}"
    );
    assert_eq!(model.gpu_margin, defaults.gpu_margin);
    let out = ok(&["sql", "-q", "--costs", costs_arg, "-c", "SELECT 1 AS one"]);
    assert!(out.contains("one"), "{out}");

    let err = fails(&["calibrate", "--rows", "100", "--keys", "1000"]);
    assert!(
        err.contains("--keys must be at least 1000 and --rows between 2 × keys and 2^31 (got 1000 keys, 100 rows)"),
        "{err}"
    );
    std::fs::write(&costs, "slot_row_ns = 3\nlookup_dense_ns = -1\n").unwrap();
    let err = fails(&["sql", "-q", "--costs", costs_arg, "-c", "SELECT 1"]);
    assert!(
        err.contains("costs.txt: cost file line 2: cost constant lookup_dense_ns: -1 is not a positive number"),
        "{err}"
    );
}

/// `mphf bench ARGS…` on TPC-H SF 0.01, 2 partitions, one run per query, only the queries
/// `only` names; its stdout.
fn small_bench(args: &[&str], only: &[&str]) -> String {
    let mut all = vec!["bench"];
    all.extend(args);
    all.extend(["--scale", "0.01", "--partitions", "2", "--runs", "1"]);
    for o in only {
        all.extend(["--only", o]);
    }
    ok(&all)
}

#[test]
fn tpch_benches_time_the_suite_and_check_its_rows() {
    let out = small_bench(&["tpch"], &["3", "18"]);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with('Q')).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("Q3 ") && lines[1].starts_with("Q18 "), "{out}");
    assert!(lines.iter().all(|l| l.trim_end().ends_with("yes")), "{out}");
    assert!(
        out.contains("TPC-H SF 0.01 in memory, 2 partitions, median of 1 runs per query"),
        "{out}"
    );

    // In memory, and over Parquet, where the indexes have slot maps and the rules consider
    // slot scans.
    for (form, flags) in [("in memory", &[][..]), ("Parquet", &["--parquet"][..])] {
        let mut args = vec![
            "bench",
            "planning",
            "--scale",
            "0.01",
            "--partitions",
            "2",
            "--runs",
            "1",
        ];
        args.extend(flags);
        let out = ok(&args);
        assert_eq!(out.lines().filter(|l| l.starts_with('Q')).count(), 22, "{out}");
        assert!(
            out.contains(&format!(
                "over 22 queries (SF 0.01, {form}, 2 partitions, median of 1 plans each)"
            )),
            "{out}"
        );
    }

    let err = fails(&["bench", "tpch", "--scale", "0.01", "--only", "23"]);
    assert!(err.contains("--only takes query numbers 1 to 22, got 23"), "{err}");
    let err = fails(&["bench", "tpch", "--runs", "0"]);
    assert!(err.contains("--runs must be at least 1"), "{err}");
    // A bad threshold fails before any data is generated, in every benchmark that takes one.
    for bench in ["tpch", "sparse", "join"] {
        let err = fails(&["bench", bench, "--tune", "no_such=1"]);
        assert!(
            err.contains("no planner threshold or cost constant named \"no_such\""),
            "{bench}: {err}"
        );
        assert!(!err.contains("generat"), "{bench}: {err}");
    }
}

/// `mphf bench groupby|join --workers 2`: the suites' tables written as Parquet and read by two
/// in-memory clusters, each query's rows compared, and `mphf demo` refusing `--workers`.
#[cfg(feature = "distributed")]
#[test]
fn groupby_and_join_benches_run_on_workers() {
    // Each selected query's row (by label prefix) says its rows were the same in both sessions.
    let rows_equal = |out: &str, labels: [&str; 2]| {
        let rows: Vec<&str> = out
            .lines()
            .filter(|l| labels.iter().any(|p| l.starts_with(p)))
            .collect();
        assert_eq!(rows.len(), 2, "{out}");
        assert!(rows.iter().all(|l| l.trim_end().ends_with("yes")), "{out}");
    };
    let out = small_bench(&["join", "--workers", "2"], &["string key", "semi"]);
    rows_equal(&out, ["orders ⋈ customer (string key)", "lineitem ⋉ orders"]);
    // The string-key table exists only as Parquet written by the run; its index was built.
    assert!(out.contains("| ob_cname "), "{out}");
    let out = small_bench(&["groupby", "--workers", "2"], &["one table", "membership"]);
    rows_equal(&out, ["GROUP BY o_cname", "membership"]);

    let err = fails(&["demo", "--workers", "2"]);
    assert!(
        err.contains(
            "--workers and --parquet are for `mphf bench groupby` and `mphf bench join`; `mphf demo` runs in memory in one process"
        ),
        "{err}"
    );
}

/// TPC-H SF 0.01 `lineitem` written under `files`, with the index `li_ok` on `l_orderkey`
/// saved next to it; its `--table` argument.
#[cfg(feature = "distributed")]
fn indexed_lineitem(files: &Files) -> String {
    let dir = files.path("tpch");
    ok(&["tpch", "--scale", "0.01", "--output", &dir, "--tables", "lineitem"]);
    let lineitem = format!("lineitem={dir}/lineitem.parquet");
    ok(&[
        "sql",
        "--table",
        &lineitem,
        "-c",
        "CREATE INDEX li_ok ON lineitem USING mphf (l_orderkey)",
    ]);
    lineitem
}

/// `mphf sql --no-mphf --workers 2` runs DataFusion's own distributed plan (stages, no MPHF
/// node) on an in-memory cluster, next to the extension's plan on the same saved index, and
/// both give the rows of one process.
#[cfg(feature = "distributed")]
#[test]
fn vanilla_sql_runs_on_workers_too() {
    let files = Files::new();
    let lineitem = indexed_lineitem(&files);
    let query = "SELECT l_orderkey, count(*) AS n FROM lineitem GROUP BY l_orderkey ORDER BY l_orderkey";
    let single = ok(&["sql", "--no-mphf", "--format", "csv", "--table", &lineitem, "-c", query]);
    let on_workers = |mode: &str, statement: &str| {
        let mut args = vec!["sql", "--format", "csv", "--workers", "2", "--table", &lineitem];
        args.extend(["-c", "SET distributed.file_scan_config_bytes_per_partition = 65536"]);
        match mode {
            "vanilla" => args.push("--no-mphf"),
            _ => args.extend(["-c", "SET mphf.costing = 'always'"]),
        }
        args.extend(["-c", statement]);
        let out = mphf_within(&args, 120);
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    for mode in ["vanilla", "mphf"] {
        assert_eq!(on_workers(mode, query), single, "{mode}");
        let plan = on_workers(mode, &format!("EXPLAIN {query}"));
        assert!(
            plan.contains("DistributedExec") && plan.contains("Stage 1"),
            "{mode}: {plan}"
        );
        assert_eq!(plan.contains("MphfAggregateExec"), mode == "mphf", "{mode}: {plan}");
    }
}

/// Runs `mphf args`, killed after `secs` seconds (a hung cluster fails the test, never CI).
#[cfg(feature = "distributed")]
fn mphf_within(args: &[&str], secs: u64) -> Output {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_mphf"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run mphf");
    // Drained while it runs: a full pipe would stop it.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut pipe, &mut bytes).unwrap();
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("mphf {args:?} ran past {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// Worker processes, killed when dropped (also when the test fails).
#[cfg(feature = "distributed")]
struct Workers(Vec<std::process::Child>);

#[cfg(feature = "distributed")]
impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// `mphf worker` processes on localhost serve `mphf sql --worker-url`. Each opens the saved
/// index itself (another process: the coordinator's labels resolve only through the fingerprint
/// check), and the rows equal one process's.
#[cfg(feature = "distributed")]
#[test]
fn workers_in_other_processes_open_the_saved_index() {
    use std::process::Stdio;
    let files = Files::new();
    let lineitem = indexed_lineitem(&files);
    let query =
        "SELECT l_orderkey, count(*) AS n, sum(l_quantity) AS q FROM lineitem GROUP BY l_orderkey ORDER BY l_orderkey";
    let single = ok(&["sql", "--format", "csv", "--table", &lineitem, "-c", query]);

    // Two workers on free ports (both held while the other is picked).
    let held: Vec<std::net::TcpListener> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<String> = held.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    drop(held);
    let mut workers = Workers(
        addrs
            .iter()
            .map(|a| {
                Command::new(env!("CARGO_BIN_EXE_mphf"))
                    .args(["worker", "--listen", a])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start mphf worker")
            })
            .collect(),
    );
    for a in &addrs {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(a).is_err() {
            assert!(std::time::Instant::now() < deadline, "worker at {a} did not start");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let urls: Vec<String> = addrs.iter().map(|a| format!("http://{a}")).collect();
    let out = mphf_within(
        &[
            "sql",
            "--format",
            "csv",
            "--worker-url",
            &urls[0],
            "--worker-url",
            &urls[1],
            "--table",
            &lineitem,
            "-c",
            "SET distributed.file_scan_config_bytes_per_partition = 65536",
            "-c",
            "SET mphf.costing = 'always'",
            "-c",
            query,
        ],
        120,
    );
    let logs: Vec<String> = workers
        .0
        .iter_mut()
        .map(|w| {
            w.kill().unwrap();
            let mut text = String::new();
            std::io::Read::read_to_string(w.stderr.as_mut().unwrap(), &mut text).unwrap();
            w.wait().unwrap();
            text
        })
        .collect();
    assert!(
        out.status.success(),
        "{}\nworkers: {logs:?}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8(out.stdout).unwrap(), single);
    assert!(
        logs.iter()
            .any(|l| l.contains("opened saved MPHF index 'li_ok' on lineitem(l_orderkey) from")),
        "no worker opened the index: {logs:?}"
    );
}
