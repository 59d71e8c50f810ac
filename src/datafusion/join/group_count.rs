//! How many groups a partial aggregate above a join will see: the estimate that decides whether
//! the join's collect form keeps the probe side's hash repartition (see `rule::rewrite_feeding`).
//!
//! Why: that repartition exists so that a partial aggregate grouping by a column with many
//! distinct values (`GROUP BY c_name` over `orders ⋈ customer`) sees each group in one partition
//! only. With few groups (`GROUP BY category`, 20 values) every partition holds every group
//! anyway, and the repartition moves every probe row once more for nothing: it was a third of
//! the time of the sparse suite's join then GROUP BY on 2 cores.
//!
//! A group expression that is a plain column gets its distinct count from, in order:
//! - an MPHF index on that column (its slot count, plus one for NULL);
//! - a sample of the scan it comes from: [`SAMPLE_PIECES`] pieces of at most [`PIECE_ROWS`]
//!   rows, spread over an in-memory table's rows or a local Parquet table's row groups. A
//!   sample whose values repeat ([`REPEATS`] rows or more per distinct value) counts its
//!   distinct values, doubled for what the sample missed; a sample of mostly distinct values
//!   says "many", and the estimate is unknown.
//!
//! Any other group expression, a column traced to no scan, or an unreadable file makes the
//! estimate unknown, and the caller keeps the repartition (the choice before this estimate
//! existed). A wrong estimate costs time, never a result: both plans give the same rows.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use ::datafusion::arrow::array::ArrayRef;
use ::datafusion::common::hash_utils::{create_hashes, HLL_RANDOM_STATE};
use ::datafusion::common::JoinType;
use ::datafusion::datasource::memory::MemorySourceConfig;
use ::datafusion::datasource::physical_plan::FileScanConfig;
use ::datafusion::datasource::source::DataSourceExec;
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_plan::aggregates::AggregateExec;
use ::datafusion::physical_plan::filter::FilterExec;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::ExecutionPlan;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use super::rule::passes_rows;
use super::MphfJoinExec;
use crate::datafusion::aggregate::memory_slices;
use crate::datafusion::registry::index_of_field;
use crate::datafusion::slot_scan::SlotScanExec;
use crate::datafusion::table::MphfRelabelExec;

/// Pieces of a scan sampled per group column.
pub const SAMPLE_PIECES: usize = 4;
/// Rows per sampled piece.
pub const PIECE_ROWS: usize = 2048;
/// Sampled rows per distinct value at or above which a sample's distinct count is trusted.
pub const REPEATS: usize = 4;

/// Estimated distinct groups of `agg` (the product of its group columns' distinct counts), or
/// `None` when one of them is unknown (see the module docs).
pub(super) fn estimated_groups(agg: &AggregateExec) -> Option<f64> {
    let input = agg.input();
    let mut groups = 1.0f64;
    for (expr, _) in agg.group_expr().expr() {
        let col = expr.downcast_ref::<Column>()?;
        groups *= column_distinct(input, col.index())?;
    }
    Some(groups)
}

/// Distinct values of column `col` of `plan`'s output.
fn column_distinct(plan: &Arc<dyn ExecutionPlan>, col: usize) -> Option<f64> {
    let field = plan.schema().fields().get(col).cloned()?;
    if let Some(handle) = index_of_field(&field) {
        return Some(handle.index().len() as f64 + 1.0);
    }
    let (leaf, leaf_col) = scan_column(plan, col)?;
    let (distinct, rows) = match file_sample_key(&leaf, leaf_col) {
        Some(key) => {
            // The lookup's guard must drop before the insert locks again: a guard in an
            // `if let` scrutinee lives through the `else` branch (edition 2021), which would
            // wait on itself.
            let kept = lock_file_samples().get(&key).copied();
            if let Some(counted) = kept {
                counted
            } else {
                let counted = sampled_distinct(&leaf, leaf_col);
                let mut samples = lock_file_samples();
                if samples.len() >= FILE_SAMPLES_KEPT {
                    samples.clear();
                }
                samples.insert(key, counted);
                counted
            }
        }
        None => sampled_distinct(&leaf, leaf_col),
    }?;
    (rows > 0 && distinct * REPEATS <= rows).then(|| (2 * distinct).max(1) as f64)
}

/// Distinct values and rows of the sample of column `col` of the scan `leaf`.
fn sampled_distinct(leaf: &Arc<dyn ExecutionPlan>, col: usize) -> Option<(usize, usize)> {
    let sample = sample_of(leaf, col)?;
    let distinct = distinct_count(&sample)?;
    Some((distinct, sample.iter().map(|a| a.len()).sum()))
}

/// What [`sampled_distinct`] found for columns of file scans, by [`file_sample_key`].
///
/// Why: a file scan's sample is read from its files, and planning a query asks again each
/// time. The key names each file with its size and modification time; a file rewritten with
/// the same three keeps its old estimate, which changes the costing, never a result.
static FILE_SAMPLES: LazyLock<Mutex<FileSamples>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Distinct values and rows of a sample (`None`: none could be read), by [`file_sample_key`].
type FileSamples = HashMap<String, Option<(usize, usize)>>;

/// Entries [`FILE_SAMPLES`] holds before it starts again empty.
const FILE_SAMPLES_KEPT: usize = 256;

/// [`FILE_SAMPLES`], locked (a panic while it was held left a map that is still whole).
fn lock_file_samples() -> MutexGuard<'static, FileSamples> {
    FILE_SAMPLES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The [`FILE_SAMPLES`] key of column `col` of `leaf` when it is a file scan: its files'
/// locations, sizes and modification times, and the column's name.
fn file_sample_key(leaf: &Arc<dyn ExecutionPlan>, col: usize) -> Option<String> {
    let files = leaf
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<FileScanConfig>()?;
    let mut names: Vec<String> = files
        .file_groups
        .iter()
        .flat_map(|g| g.files())
        .map(|f| {
            let meta = &f.object_meta;
            format!(
                "{}|{}|{}",
                meta.location,
                meta.size,
                meta.last_modified.timestamp_micros()
            )
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    let column = leaf.schema().fields().get(col)?.name().clone();
    Some(format!(
        "{}#{}#{column}",
        files.object_store_url.as_str(),
        names.join("\n")
    ))
}

/// The scan (a `DataSourceExec`) and its column that column `col` of `plan` reads, through
/// projections (plain column references), filters, exchanges, sorts, limits, relabeling,
/// slot-map scans and the sides of inner joins.
fn scan_column(plan: &Arc<dyn ExecutionPlan>, col: usize) -> Option<(Arc<dyn ExecutionPlan>, usize)> {
    if plan.downcast_ref::<DataSourceExec>().is_some() {
        return Some((Arc::clone(plan), col));
    }
    // A slot-map scan's columns are those of the scan it replaced, then the slots.
    if let Some(s) = plan.downcast_ref::<SlotScanExec>() {
        return (col < s.scan().schema().fields().len())
            .then(|| scan_column(s.scan(), col))
            .flatten();
    }
    if let Some(f) = plan.downcast_ref::<FilterExec>() {
        let input_col = match f.projection() {
            Some(p) => *p.get(col)?,
            None => col,
        };
        return scan_column(f.input(), input_col);
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        let c = p.expr().get(col)?.expr.downcast_ref::<Column>()?;
        return scan_column(p.input(), c.index());
    }
    let join = match plan.downcast_ref::<MphfJoinExec>() {
        Some(j) => Some(j.join().as_ref()),
        None => plan.downcast_ref::<HashJoinExec>(),
    };
    if let Some(join) = join {
        if *join.join_type() != JoinType::Inner {
            return None;
        }
        let col = match join.projection.as_deref() {
            Some(p) => *p.get(col)?,
            None => col,
        };
        let left = join.left().schema().fields().len();
        return match col < left {
            true => scan_column(join.left(), col),
            false => scan_column(join.right(), col - left),
        };
    }
    match plan.children().as_slice() {
        [child] if passes_rows(plan) || plan.downcast_ref::<MphfRelabelExec>().is_some() => scan_column(child, col),
        _ => None,
    }
}

/// Pieces of column `col` of the scan `leaf`: an in-memory table's or a local Parquet table's.
fn sample_of(leaf: &Arc<dyn ExecutionPlan>, col: usize) -> Option<Vec<ArrayRef>> {
    let source = leaf.downcast_ref::<DataSourceExec>()?.data_source();
    if let Some(memory) = source.downcast_ref::<MemorySourceConfig>() {
        return memory_sample(memory, col);
    }
    let files = source.downcast_ref::<FileScanConfig>()?;
    let name = leaf.schema().fields().get(col)?.name().clone();
    parquet_sample(files, &name)
}

/// Pieces spread evenly over the rows of an in-memory table.
fn memory_sample(memory: &MemorySourceConfig, col: usize) -> Option<Vec<ArrayRef>> {
    let col = match memory.projection() {
        Some(p) => *p.get(col)?,
        None => col,
    };
    let pieces = memory_slices(memory, SAMPLE_PIECES, PIECE_ROWS);
    pieces.iter().map(|b| b.columns().get(col).cloned()).collect()
}

/// Pieces of column `name` read from row groups spread over a local Parquet table's files.
fn parquet_sample(files: &FileScanConfig, name: &str) -> Option<Vec<ArrayRef>> {
    if files.object_store_url.as_str() != "file:///" {
        return None;
    }
    let paths: Vec<String> = files
        .file_groups
        .iter()
        .flat_map(|g| g.files())
        .map(|f| format!("/{}", f.object_meta.location))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut row_groups = Vec::new();
    for path in &paths {
        let reader = ParquetRecordBatchReaderBuilder::try_new(File::open(path).ok()?).ok()?;
        row_groups.extend((0..reader.metadata().num_row_groups()).map(|rg| (path.as_str(), rg)));
    }
    let mut pieces = Vec::new();
    let n = row_groups.len();
    for piece in 0..SAMPLE_PIECES.min(n) {
        let (path, rg) = row_groups[piece * n / SAMPLE_PIECES.min(n)];
        let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).ok()?).ok()?;
        let leaf = builder.schema().index_of(name).ok()?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), [leaf]);
        let reader = builder
            .with_projection(mask)
            .with_row_groups(vec![rg])
            .with_batch_size(PIECE_ROWS)
            .with_limit(PIECE_ROWS)
            .build()
            .ok()?;
        for batch in reader {
            pieces.push(Arc::clone(batch.ok()?.column(0)));
        }
    }
    Some(pieces)
}

/// Distinct values (NULL counted as one) in `pieces`, by their 64-bit hashes: a collision
/// among a few thousand sampled values is rare enough not to move the estimate.
fn distinct_count(pieces: &[ArrayRef]) -> Option<usize> {
    let mut seen = HashSet::new();
    let mut hashes = Vec::new();
    for piece in pieces {
        hashes.clear();
        hashes.resize(piece.len(), 0);
        create_hashes([piece], &HLL_RANDOM_STATE, &mut hashes).ok()?;
        seen.extend(hashes.iter().copied());
    }
    Some(seen.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datafusion::aggregate::RowEstimator;
    use ::datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
    use ::datafusion::arrow::datatypes::{DataType, Field, Schema};
    use ::datafusion::physical_plan::projection::ProjectionExpr;

    /// An in-memory scan of `x` (Int64, `x = row % modulus`) and `s` (a string of `x`).
    fn scan(rows: i64, modulus: i64) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(5000)
            .map(|start| {
                let xs: Vec<i64> = (start..(start + 5000).min(rows)).map(|r| r % modulus).collect();
                let ss = StringArray::from_iter_values(xs.iter().map(|x| format!("v{x}")));
                RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from(xs)), Arc::new(ss)])
                    .expect("batch")
            })
            .collect();
        MemorySourceConfig::try_new_exec(&[batches], schema, None).expect("scan")
    }

    #[test]
    fn repeated_values_are_counted_from_the_sample() {
        let leaf = scan(100_000, 20);
        assert_eq!(column_distinct(&leaf, 0), Some(40.0));
        assert_eq!(column_distinct(&leaf, 1), Some(40.0));
    }

    #[test]
    fn mostly_distinct_values_leave_the_estimate_unknown() {
        let leaf = scan(100_000, 100_000);
        assert_eq!(column_distinct(&leaf, 0), None);
        // Just above the trusted limit: 2048 distinct per 8192 sampled rows is 4 repeats.
        assert!(column_distinct(&scan(100_000, 2048), 0).is_some());
        assert_eq!(column_distinct(&scan(100_000, 2049), 0), None);
    }

    #[test]
    fn the_estimator_holds_every_plan_it_asked_datafusion_about() {
        let estimates = RowEstimator::new();
        let leaf = scan(12_345, 7);
        assert_eq!(estimates.datafusion_rows(&leaf), Some(12_345.0));
        // Held: the address its statistics are cached by cannot be freed and reused.
        assert_eq!(Arc::strong_count(&leaf), 2);
        assert_eq!(estimates.datafusion_rows(&leaf), Some(12_345.0));
        let other = scan(500, 7);
        assert_eq!(estimates.datafusion_rows(&other), Some(500.0));
    }

    /// A Parquet scan's count is kept by file: asked twice, the first answer is computed and
    /// kept, the second read back (the first once waited forever on its own lock).
    #[test]
    fn a_file_scans_count_is_kept_and_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("repeated.parquet");
        let batch = scan(20_000, 10)
            .execute(0, Arc::new(Default::default()))
            .expect("stream");
        let batches: Vec<RecordBatch> =
            futures::executor::block_on(futures::TryStreamExt::try_collect(batch)).expect("batches");
        let file = std::fs::File::create(&path).expect("file");
        let mut writer =
            ::datafusion::parquet::arrow::ArrowWriter::try_new(file, batches[0].schema(), None).expect("writer");
        for b in &batches {
            writer.write(b).expect("write");
        }
        writer.close().expect("close");
        let (done, answer) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("runtime");
            let leaf = runtime.block_on(async {
                let ctx = ::datafusion::prelude::SessionContext::new();
                let options = ::datafusion::prelude::ParquetReadOptions::default();
                let frame = ctx.read_parquet(path.to_str().expect("path"), options).await?;
                frame.create_physical_plan().await
            });
            let leaf = leaf.expect("plan");
            let counts = (column_distinct(&leaf, 0), column_distinct(&leaf, 0));
            let _ = done.send(counts);
        });
        let counts = answer
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the count of a file scan answers");
        assert_eq!(counts, (Some(20.0), Some(20.0)));
    }

    #[test]
    fn a_projection_is_traced_to_its_scan_column() {
        let leaf = scan(50_000, 10);
        let s = ::datafusion::physical_expr::expressions::col("s", &leaf.schema()).expect("column");
        let projection: Arc<dyn ExecutionPlan> =
            Arc::new(ProjectionExec::try_new(vec![ProjectionExpr::new(s, "renamed")], leaf).expect("projection"));
        assert_eq!(column_distinct(&projection, 0), Some(20.0));
    }
}
