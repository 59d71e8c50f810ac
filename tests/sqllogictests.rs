//! The `.slt` suite (`sql-tests/*.slt`), run by `cargo test --test sqllogictests`.
//!
//! Each file runs in a fresh [`MphfContext`] (the extension's statements are handled before
//! DataFusion, so the engine is our own `AsyncDB`, formatted like DataFusion's sqllogictest
//! engine: NULL as `NULL`, empty strings as `(empty)`, floats rounded to 12 significant digits).
//! Files whose name starts with `tpch` get the eight TPC-H tables at SF 0.01, generated in
//! process. `control substitution on` gives `$__TEST_DIR__`, a fresh temporary folder per file.
//! Files whose name starts with `gpu_emulated` run with `Tuning::gpu_emulation` on.
//!
//! Every `SELECT` / `WITH` query runs twice: as written, then with `mphf.enable_aggregate =
//! false` and `mphf.enable_join = false` (vanilla DataFusion operators); the sorted rows must be equal, so each query of the
//! suite is checked against vanilla DataFusion on the same data, whatever its expected block says.
//!
//! The GROUP BY and JOIN files ([`CLUSTER_FILES`]) run a second time on an in-memory cluster of
//! two datafusion-distributed workers (with the `distributed` feature): the rules then plan for
//! stages (no slot-range merge, no collect-form join; slot-map scans split over tasks), and the rows must
//! still match the expected blocks and vanilla DataFusion.
//!
//! Usage: `cargo test --test sqllogictests [-- [--complete] [FILTER...]]`. `--complete` rewrites
//! the expected output of the selected files from the current results (check the diff against
//! vanilla DataFusion before committing). Prints `N passed, N failed`; exits non-zero on failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionConfig;
use datafusion_mphf::datafusion::{tpch, MphfConfig, MphfContext};
use sqllogictest::{
    default_column_validator, default_normalizer, default_validator, AsyncDB, DBOutput, DefaultColumnType, Runner,
};

/// TPC-H scale factor of the `tpch*.slt` files.
const TPCH_SF: f64 = 0.01;

type Tables = Vec<(String, SchemaRef, Vec<Vec<RecordBatch>>)>;

fn tpch_tables() -> &'static Tables {
    static T: OnceLock<Tables> = OnceLock::new();
    T.get_or_init(|| {
        tpch::TABLES
            .iter()
            .map(|t| {
                let (schema, parts) = tpch::generate(t, TPCH_SF, 2, &|_| {}).expect("TPC-H generation");
                (t.to_string(), schema, parts)
            })
            .collect()
    })
}

struct MphfDb {
    ctx: MphfContext,
}

fn cell(array: &dyn Array, row: usize) -> Result<String, DataFusionError> {
    if array.is_null(row) {
        return Ok("NULL".to_string());
    }
    let s = match array.data_type() {
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            let f = datafusion::arrow::compute::cast(&array.slice(row, 1), &DataType::Float64)?;
            let v = f
                .as_any()
                .downcast_ref::<datafusion::arrow::array::Float64Array>()
                .expect("f64")
                .value(0);
            if v.is_finite() && v != 0.0 {
                let digits = 12 - (v.abs().log10().floor() as i32 + 1);
                let r = format!("{:.*}", digits.clamp(0, 12) as usize, v);
                let r = if r.contains('.') {
                    r.trim_end_matches('0').trim_end_matches('.').to_string()
                } else {
                    r
                };
                if r == "-0" {
                    "0".to_string()
                } else {
                    r
                }
            } else {
                format!("{v}")
            }
        }
        _ => {
            let opts = FormatOptions::default();
            ArrayFormatter::try_new(array, &opts)?.value(row).to_string()
        }
    };
    Ok(if s.is_empty() { "(empty)".to_string() } else { s })
}

fn column_type(dt: &DataType) -> DefaultColumnType {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => DefaultColumnType::Integer,
        DataType::Float16
        | DataType::Float32
        | DataType::Float64
        | DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => DefaultColumnType::FloatingPoint,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => DefaultColumnType::Text,
        _ => DefaultColumnType::Any,
    }
}

#[async_trait]
impl AsyncDB for MphfDb {
    type Error = DataFusionError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DataFusionError> {
        let output = self.query(sql).await?;
        if let DBOutput::Rows { rows, .. } = &output {
            if is_query(sql) {
                self.ctx.sql("SET mphf.enable_aggregate = false").await?;
                self.ctx.sql("SET mphf.enable_join = false").await?;
                let vanilla = self.query(sql).await;
                self.ctx.sql("SET mphf.enable_aggregate = true").await?;
                self.ctx.sql("SET mphf.enable_join = true").await?;
                let DBOutput::Rows { rows: vanilla, .. } = vanilla? else {
                    return Err(DataFusionError::Execution("vanilla run returned no rows".into()));
                };
                if sorted(rows) != sorted(&vanilla) {
                    return Err(DataFusionError::Execution(format!(
                        "rows differ from vanilla DataFusion (mphf.enable_aggregate = false, mphf.enable_join = false):\n\
                         with MPHF: {rows:?}\nvanilla:   {vanilla:?}"
                    )));
                }
            }
        }
        Ok(output)
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "datafusion-mphf"
    }
}

/// True for a row-returning query whose result must not depend on the MPHF operators.
fn is_query(sql: &str) -> bool {
    let head = sql.trim_start().get(..6).unwrap_or_default().to_ascii_uppercase();
    head.starts_with("SELECT") || head.starts_with("WITH")
}

fn sorted(rows: &[Vec<String>]) -> Vec<Vec<String>> {
    let mut rows = rows.to_vec();
    rows.sort();
    rows
}

impl MphfDb {
    /// Runs one statement and formats its rows.
    async fn query(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DataFusionError> {
        let df = self.ctx.sql(sql).await?;
        let schema = Arc::new(df.schema().as_arrow().clone());
        let batches = df.collect().await?;
        if schema.fields().is_empty() {
            return Ok(DBOutput::StatementComplete(0));
        }
        let types = schema.fields().iter().map(|f| column_type(f.data_type())).collect();
        let mut rows = Vec::new();
        for b in &batches {
            for r in 0..b.num_rows() {
                rows.push(
                    b.columns()
                        .iter()
                        .map(|c| cell(c.as_ref(), r))
                        .collect::<Result<Vec<_>, _>>()?,
                );
            }
        }
        Ok(DBOutput::Rows { types, rows })
    }
}

/// The files that also run on a cluster of two workers (see the module docs).
const CLUSTER_FILES: [&str; 5] = [
    "correctness.slt",
    "join.slt",
    "positions.slt",
    "tpch.slt",
    "tpch_queries.slt",
];

/// Cluster files whose statements union `generate_series` scans. datafusion-distributed 4.0.0
/// fails to plan such a union when it isolates each child in tasks of its own, even without
/// the extension ("number of columns(1) must match number of fields(0) in schema"), so their
/// cluster sessions turn its `children_isolator_unions` option off.
const UNISOLATED_UNION_FILES: [&str; 1] = ["correctness.slt"];

/// A session with `config`: in one process (`workers` = 0), or the coordinator of an in-memory
/// cluster of that many workers.
fn session(config: SessionConfig, workers: usize) -> Result<MphfContext, DataFusionError> {
    if workers == 0 {
        return Ok(MphfContext::with_config(config));
    }
    #[cfg(feature = "distributed")]
    {
        use datafusion::execution::SessionStateBuilder;
        let builder = SessionStateBuilder::new().with_default_features().with_config(config);
        let builder = datafusion_mphf::datafusion::distributed::InMemoryCluster::new(workers).start(builder)?;
        Ok(MphfContext::with_state_builder(builder))
    }
    #[cfg(not(feature = "distributed"))]
    Err(DataFusionError::Configuration(
        "clusters need the `distributed` feature".into(),
    ))
}

fn new_db(path: &Path, workers: usize) -> Result<MphfDb, DataFusionError> {
    // Costing off: every GROUP BY on an indexed key runs on MphfAggregateExec, so the vanilla
    // cross-check (see the module docs) covers the operator even on small tables.
    let mphf_options = MphfConfig::default().without_costing();
    let ctx = session(SessionConfig::new().with_option_extension(mphf_options), workers)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if workers > 0 && UNISOLATED_UNION_FILES.contains(&name) {
        let state = ctx.ctx().state_ref();
        let mut state = state.write();
        state
            .config_mut()
            .options_mut()
            .set("distributed.children_isolator_unions", "false")?;
    }
    if name.starts_with("gpu_emulated") {
        ctx.tune(|t| t.gpu_emulation = true);
    }
    if name.starts_with("tpch") {
        for (t, schema, parts) in tpch_tables() {
            ctx.ctx().register_table(
                t.as_str(),
                Arc::new(MemTable::try_new(Arc::clone(schema), parts.clone())?),
            )?;
        }
    }
    Ok(MphfDb { ctx })
}

async fn run_file(path: &Path, complete: bool, workers: usize) -> Result<(), String> {
    let p = path.to_path_buf();
    let mut runner = Runner::new(move || {
        let p = p.clone();
        async move { new_db(&p, workers) }
    });
    if complete {
        runner
            .update_test_file(
                path,
                " ",
                default_validator,
                default_normalizer,
                default_column_validator,
            )
            .await
            .map_err(|e| e.to_string())
    } else {
        runner
            .run_file_async(path)
            .await
            .map_err(|e| e.display(false).to_string())
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let complete = args.iter().any(|a| a == "--complete");
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sql-tests");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sql-tests/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "slt"))
        .filter(|p| filters.is_empty() || filters.iter().any(|f| p.to_string_lossy().contains(f.as_str())))
        .collect();
    files.sort();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (mut passed, mut failed) = (0, 0);
    let file_name = |f: &PathBuf| f.file_name().unwrap_or_default().to_string_lossy().into_owned();
    let mut runs: Vec<(&PathBuf, usize)> = files.iter().map(|f| (f, 0)).collect();
    if cfg!(feature = "distributed") && !complete {
        runs.extend(
            files
                .iter()
                .filter(|f| CLUSTER_FILES.contains(&file_name(f).as_str()))
                .map(|f| (f, 2)),
        );
    }
    for (f, workers) in runs {
        let started = std::time::Instant::now();
        let name = match workers {
            0 => file_name(f),
            n => format!("{} on {n} workers", file_name(f)),
        };
        match rt.block_on(run_file(f, complete, workers)) {
            Ok(()) => {
                passed += 1;
                println!("ok     {name} ({:.2?})", started.elapsed());
            }
            Err(e) => {
                failed += 1;
                println!("FAILED {name}:\n{e}");
            }
        }
    }
    println!(
        "sqllogictests: {passed} passed, {failed} failed{}",
        if complete { " (completed)" } else { "" }
    );
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
