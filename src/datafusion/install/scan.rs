//! Phase 3 of an installation: scan the key column once through DataFusion and build its index
//! on a blocking thread.
//!
//! Also measured in the same pass: the column's rows per run of equal consecutive keys (NULLs
//! included), the clustering the planner's costing reads from the index's info.

use std::sync::Arc;

use ::datafusion::arrow::array::ArrayRef;
use ::datafusion::catalog::TableProvider;
use ::datafusion::common::{Column, DataFusionError, Result};
use ::datafusion::logical_expr::Expr;
use futures::StreamExt;

use crate::core::column::{ColumnIndex, IndexOptions};
use crate::datafusion::error::to_df;

use super::{Budget, IndexSpec, Installer};

/// Scans `spec.column` of `inner` and builds its index: returns it, the rows per run and the
/// scanned arrays. `budget` grows by each scanned batch and then by the build's working set
/// (`ColumnIndex::build_bytes_estimate`) before the build starts.
pub(super) async fn build_column(
    installer: &Installer<'_>,
    inner: &Arc<dyn TableProvider>,
    spec: &IndexSpec,
    budget: &Budget<'_>,
) -> Result<(ColumnIndex, f64, Vec<ArrayRef>)> {
    let df = installer
        .ctx
        .read_table(Arc::clone(inner))?
        .select(vec![Expr::Column(Column::new_unqualified(&spec.column))])?;
    let key_type = df.schema().field(0).data_type().clone();
    let mut stream = df.execute_stream().await?;
    let mut chunks: Vec<ArrayRef> = Vec::new();
    let mut scanned = 0u64;
    while let Some(batch) = stream.next().await {
        let chunk = Arc::clone(batch?.column(0));
        let bytes = chunk.get_array_memory_size() as u64;
        scanned += bytes;
        budget.grow(bytes, "scanning its column", scanned)?;
        chunks.push(chunk);
    }
    drop(stream);
    if chunks.is_empty() {
        // An empty table (a 0-row Parquet file) has no batches: its index is empty, of the
        // column's type.
        chunks.push(::datafusion::arrow::array::new_empty_array(&key_type));
    }
    let rows: usize = chunks.iter().map(|c| c.len()).sum();
    let working = ColumnIndex::build_bytes_estimate(rows as u64, scanned);
    budget.grow(working, "building", scanned + working)?;
    let (solver, notice) = crate::placement::solver_for(spec.device, rows as u64, &spec.params);
    if let Some(notice) = notice {
        installer.notice(&notice);
    }
    let opts = IndexOptions {
        params: spec.params,
        seed: spec.seed,
        solver,
        ..IndexOptions::default()
    };
    tokio::task::spawn_blocking(move || -> Result<(ColumnIndex, f64, Vec<ArrayRef>)> {
        let (mut rows, mut runs) = (0usize, 0usize);
        for c in &chunks {
            rows += c.len();
            runs += ::datafusion::arrow::compute::partition(std::slice::from_ref(c))?.len();
        }
        let index = ColumnIndex::build(&chunks, &opts).map_err(to_df)?;
        Ok((index, rows as f64 / runs.max(1) as f64, chunks))
    })
    .await
    .map_err(|e| DataFusionError::External(Box::new(e)))?
}
