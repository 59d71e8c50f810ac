//! Installing an index: the pipeline behind `CREATE INDEX … USING mphf` and the loading of saved
//! indexes at table registration. Each phase has its own module:
//!
//! 1. resolve the table and column and check the key type ([`Installer::resolve`]);
//! 2. for a file-backed table, reuse a saved index whose fingerprint matches ([`saved`]);
//! 3. otherwise scan the column once through DataFusion and build on a blocking thread
//!    ([`scan`]; `ColumnIndex::build` drops NULLs and duplicates, keeps keys in slot order);
//! 4. derive the lookup structures: dense-key table, decoded MPHF, row slots ([`Installer::derive`]);
//! 5. save a built index (only now: an index that does not fit writes nothing) ([`saved`]);
//! 6. make or read the slot maps of a Parquet table ([`slot_maps`]);
//! 7. re-register the table as an `MphfTable` and record the index in the `MphfRegistry`.
//!
//! Memory: every phase reserves in the session's memory pool before it allocates (the saved
//! file's length, each scanned batch, the build's working set, the lookup structures, the slot
//! maps), through one [`Budget`], and the reservation shrinks to the index's bytes at the end.
//! Over the limit the statement fails with `ResourcesExhausted`, nothing is saved and nothing is
//! registered. Slot maps are an accelerator: a pool too small for them leaves the index without.
//!
//! The installer holds the session's pieces it needs (its `SessionContext`, registry, settings
//! and tuning), so this module does not depend on `MphfContext`.

mod saved;
mod scan;
mod slot_maps;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ::datafusion::arrow::array::ArrayRef;
use ::datafusion::catalog::TableProvider;
use ::datafusion::common::{plan_err, DataFusionError, Result};
use ::datafusion::datasource::MemTable;
use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use ::datafusion::prelude::SessionContext;

use crate::core::column::{ColumnIndex, KeyType};
use crate::core::Params;
use crate::device::Device;

use super::config::MphfConfig;
use super::plan::Tuning;
use super::registry::{format_utc, IndexHandle, IndexInfo, IndexSource, MphfRegistry};
use super::statements::TableName;
use super::table::MphfTable;

pub use slot_maps::slot_map_path;

/// What to create: the parsed `CREATE INDEX`.
#[derive(Clone, Debug)]
pub struct IndexSpec {
    /// Index name.
    pub name: String,
    /// Table.
    pub table: TableName,
    /// Column.
    pub column: String,
    /// MPHF parameters.
    pub params: Params,
    /// Hash seed.
    pub seed: u64,
    /// Build device.
    pub device: Device,
}

/// The session's pieces an installation needs.
pub struct Installer<'a> {
    /// The DataFusion session (table lookup, scans, registration).
    pub ctx: &'a SessionContext,
    /// The session's index registry.
    pub registry: &'a MphfRegistry,
    /// The session's `mphf.*` settings.
    pub cfg: MphfConfig,
    /// The planner's thresholds (the lookup structures to derive).
    pub tuning: Tuning,
}

/// The table being indexed, as found by [`Installer::resolve`].
struct Target {
    /// The table without its `MphfTable` wrapper.
    inner: Arc<dyn TableProvider>,
    /// Indexes it already has, by column.
    existing: BTreeMap<String, Arc<IndexHandle>>,
}

/// The index's memory reservation, and the wording of its over-the-limit errors.
pub(crate) struct Budget<'a> {
    reservation: MemoryReservation,
    spec: &'a IndexSpec,
}

impl Budget<'_> {
    /// The `ResourcesExhausted` error of `what`, which needs `bytes` in all.
    fn over(&self, what: &str, bytes: u64, e: DataFusionError) -> DataFusionError {
        DataFusionError::ResourcesExhausted(format!(
            "MPHF index '{}' on {}({}): {what} needs {bytes} bytes, more than the memory pool has left: {e}",
            self.spec.name, self.spec.table.text, self.spec.column
        ))
    }

    /// Reserves `by` more bytes for `what`, which needs `needs` bytes in all.
    fn grow(&self, by: u64, what: &str, needs: u64) -> Result<()> {
        self.reservation
            .try_grow(by as usize)
            .map_err(|e| self.over(what, needs, e))
    }
}

impl Installer<'_> {
    /// Prints `msg` on stderr under `mphf.verbose`.
    fn notice(&self, msg: &str) {
        if self.cfg.verbose {
            eprintln!("{msg}");
        }
    }

    /// Installs the index `spec` asks for (see the module docs). `at_registration`: loading the
    /// saved indexes of a table being registered, whatever parameters they were built with.
    pub async fn install(&self, spec: IndexSpec, at_registration: bool) -> Result<Arc<IndexHandle>> {
        let Target { inner, existing } = self.resolve(&spec).await?;
        let started = Instant::now();
        let budget = Budget {
            reservation: MemoryConsumer::new(format!("MPHF index {}", spec.name))
                .register(&self.ctx.runtime_env().memory_pool),
            spec: &spec,
        };
        let saved = saved::SavedIndex::locate(self, &inner, &spec);
        let reused = match &saved {
            Some(s) => s.reuse(self, &budget, at_registration)?,
            None => saved::Reuse::default(),
        };
        let (index, rows_per_run, arrays) = match reused.index {
            Some(index) => (index, reused.rows_per_run, Vec::new()),
            None => {
                let (index, runs, arrays) = scan::build_column(self, &inner, &spec, &budget).await?;
                (index, Some(runs), arrays)
            }
        };
        let mut index = self.derive(index, arrays, &inner, &budget).await?;
        if reused.source != IndexSource::Loaded {
            if let Some(s) = &saved {
                s.save(self, &mut index, &inner, rows_per_run)?;
            }
        }
        let info = IndexInfo {
            name: spec.name.clone(),
            table: spec.table.text.clone(),
            column: spec.column.clone(),
            built_at: format_utc(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
            ),
            device: index.device().to_string(),
            build_ms: started.elapsed().as_secs_f64() * 1e3,
            rows_per_run,
            source: reused.source,
            path: saved.map(|s| s.path),
        };
        let index = Arc::new(index);
        let slot_maps = match self.tuning.row_slots {
            true => {
                slot_maps::for_table(
                    self,
                    &inner,
                    &spec.column,
                    &index,
                    info.path.as_deref(),
                    spec.device,
                    &budget,
                )
                .await?
            }
            false => None,
        };
        let handle = IndexHandle::new(index, info, slot_maps, Some(budget.reservation));
        let mut indexes = existing;
        indexes.insert(spec.column, Arc::clone(&handle));
        let new_table: Arc<dyn TableProvider> = Arc::new(MphfTable::new(inner, indexes));
        self.ctx.deregister_table(spec.table.reference.clone())?;
        self.ctx.register_table(spec.table.reference.clone(), new_table)?;
        self.registry.insert(Arc::clone(&handle));
        Ok(handle)
    }

    /// Phase 1: the table and its existing indexes; the column must exist, have a supported key
    /// type and no index yet.
    async fn resolve(&self, spec: &IndexSpec) -> Result<Target> {
        let IndexSpec {
            name, table, column, ..
        } = spec;
        let provider = self.ctx.table_provider(table.reference.clone()).await.map_err(|e| {
            DataFusionError::Plan(format!("CREATE INDEX {name}: table '{}' not found ({e})", table.text))
        })?;
        let (inner, existing) = match provider.downcast_ref::<MphfTable>() {
            Some(t) => (Arc::clone(t.inner()), t.indexes().clone()),
            None => (Arc::clone(&provider), BTreeMap::new()),
        };
        let schema = inner.schema();
        let Ok(field) = schema.field_with_name(column) else {
            let cols: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return plan_err!(
                "CREATE INDEX {name}: column '{column}' not found in table '{}' (columns: {})",
                table.text,
                cols.join(", ")
            );
        };
        if let Err(e) = KeyType::from_arrow(field.data_type()) {
            return plan_err!("CREATE INDEX {name}: column '{column}' of table '{}': {e}", table.text);
        }
        if let Some(h) = existing.get(column) {
            return plan_err!(
                "CREATE INDEX {name}: column '{column}' of table '{}' already has the MPHF index '{}'",
                table.text,
                h.info().name
            );
        }
        Ok(Target { inner, existing })
    }

    /// Phase 4: the lookup structures of `index`, reserved first (at most the dense table's
    /// bytes per key and the decoded MPHF's, under 2 bytes per key, plus 8 bytes per scanned row
    /// for the row slots); then the reservation shrinks or grows to what the index keeps.
    async fn derive(
        &self,
        index: ColumnIndex,
        mut arrays: Vec<ArrayRef>,
        inner: &Arc<dyn TableProvider>,
        budget: &Budget<'_>,
    ) -> Result<ColumnIndex> {
        let max_dense = self.tuning.dense_lookup_max_bytes_per_key;
        let derived = index.len().saturating_mul(max_dense.max(0.0) as u64 + 2)
            + arrays.iter().map(|a| a.len() as u64 * 8).sum::<u64>();
        budget.grow(derived, "its lookup tables", derived)?;
        let mut index = index.with_dense_lookup(max_dense).with_flat_lookup();
        // An in-memory table hands its queries the arrays it stores (the ones just scanned):
        // their rows' slots are worth keeping. Other tables decode fresh arrays per scan.
        if self.tuning.row_slots && inner.downcast_ref::<MemTable>().is_some() && !arrays.is_empty() {
            let arrays = std::mem::take(&mut arrays);
            index = tokio::task::spawn_blocking(move || index.with_row_slots(&arrays))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        let size =
            (index.size_bytes() + index.dense_lookup_bytes() + index.flat_lookup_bytes() + index.row_slot_bytes())
                as usize;
        budget
            .reservation
            .try_resize(size)
            .map_err(|e| budget.over("the index", size as u64, e))?;
        Ok(index)
    }
}
