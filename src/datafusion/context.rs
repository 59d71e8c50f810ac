//! `MphfContext`: a DataFusion [`SessionContext`] that also runs the extension's statements.
//!
//! [`MphfContext::sql`] classifies each statement ([`statements::classify`]): `CREATE INDEX …
//! USING mphf`, `DROP INDEX` and `SHOW MPHF INDEXES` run here; everything else goes to
//! DataFusion unchanged (after `CREATE EXTERNAL TABLE` saved indexes are loaded, after `DROP
//! TABLE` the table's indexes are dropped).
//!
//! Creating an index (see [`MphfContext::create_index`]):
//! 1. resolve the table and column, check the key type;
//! 2. for a file-backed table, reuse a saved index whose fingerprint matches ([`persist`]);
//! 3. otherwise scan the column once through DataFusion and build ([`ColumnIndex::build`] drops
//!    NULLs and duplicates, keeps keys in slot order) on a blocking thread;
//! 4. derive the lookup structures (dense table, decoded MPHF, row slots);
//! 5. save a built index (only now: an index that does not fit writes nothing);
//! 6. re-register the table as an [`MphfTable`] and record the index in the [`MphfRegistry`].
//!
//! Memory: every step reserves in the session's memory pool before it allocates (the saved
//! file's length, each scanned batch, the build's working set, the lookup structures), and the
//! reservation shrinks to the index's bytes at the end. Over the limit the statement fails with
//! `ResourcesExhausted`, nothing is saved and nothing is registered; at table registration the
//! table is registered without that index.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ::datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use ::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use ::datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use ::datafusion::common::{plan_err, Column, DataFusionError, Result, TableReference};
use ::datafusion::datasource::MemTable;
use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use ::datafusion::execution::session_state::SessionStateBuilder;
use ::datafusion::logical_expr::Expr;
use ::datafusion::prelude::{DataFrame, ParquetReadOptions, SessionConfig, SessionContext};
use futures::StreamExt;

use crate::core::column::{ColumnIndex, IndexOptions, KeyType};
use crate::core::Params;
use crate::device::Device;
use crate::index::SlotMaps;

use super::config::MphfConfig;
use super::error::to_df;
use super::persist::{self, Fingerprint, Provenance, SavedState};
use super::registry::{format_utc, IndexHandle, IndexInfo, IndexSource, MphfRegistry};
use super::statements::{self, MphfStatement, TableName};
use super::table::MphfTable;
use super::udf::MphfIndexFunc;

/// Name of the table function listing the session's indexes.
pub const INDEX_LIST_FUNCTION: &str = "mphf_indexes";

/// Adds the extension to a session builder: the `mphf_index` UDF, the `mphf_indexes()` table
/// function, the `mphf.*` options and a fresh [`MphfRegistry`] (kept if one is already set).
/// Later issues add their optimizer rules here.
pub fn with_mphf(mut builder: SessionStateBuilder) -> SessionStateBuilder {
    let mut config = builder.config().take().unwrap_or_default();
    let registry = match config.get_extension::<MphfRegistry>() {
        Some(r) => r,
        None => {
            let r = Arc::new(MphfRegistry::new());
            config = config.with_extension(Arc::clone(&r));
            r
        }
    };
    if config.options().extensions.get::<MphfConfig>().is_none() {
        config = config.with_option_extension(MphfConfig::default());
    }
    *builder.config() = Some(config);
    builder
        .scalar_functions()
        .get_or_insert_with(Vec::new)
        .push(Arc::new(MphfIndexFunc::udf(Some(Arc::clone(&registry)))));
    builder.table_functions().get_or_insert_with(Default::default).insert(
        INDEX_LIST_FUNCTION.to_string(),
        Arc::new(::datafusion::catalog::TableFunction::new(
            INDEX_LIST_FUNCTION.to_string(),
            Arc::new(IndexListFunc { registry }),
        )),
    );
    builder
        .with_optimizer_rule(Arc::new(super::union_labels::MphfUnionLabels::new()))
        .with_physical_optimizer_rule(Arc::new(super::udf::MphfStoredSlotsRule::new()))
        .with_physical_optimizer_rule(Arc::new(super::aggregate::MphfAggregateRule::new()))
        .with_physical_optimizer_rule(Arc::new(super::join::MphfJoinRule::new()))
}

/// `mphf_indexes()`: the rows of `SHOW MPHF INDEXES` as a table.
#[derive(Debug)]
struct IndexListFunc {
    registry: Arc<MphfRegistry>,
}

impl TableFunctionImpl for IndexListFunc {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return plan_err!("{INDEX_LIST_FUNCTION}() takes no arguments");
        }
        let batch = index_list_batch(&self.registry)?;
        Ok(Arc::new(MemTable::try_new(batch.schema(), vec![vec![batch]])?))
    }
}

/// Schema of `SHOW MPHF INDEXES`.
pub fn index_list_schema() -> SchemaRef {
    let s = |n: &str| Field::new(n, DataType::Utf8, false);
    Arc::new(Schema::new(vec![
        s("name"),
        s("table"),
        s("column"),
        s("key_type"),
        Field::new("keys", DataType::UInt64, false),
        Field::new("bits_per_key", DataType::Float64, false),
        Field::new("leaf", DataType::UInt64, false),
        Field::new("bucket", DataType::UInt64, false),
        Field::new("bytes", DataType::UInt64, false),
        s("built_at"),
        s("device"),
        s("source"),
        Field::new("path", DataType::Utf8, true),
    ]))
}

/// The rows of `SHOW MPHF INDEXES`.
pub fn index_list_batch(registry: &MphfRegistry) -> Result<RecordBatch> {
    let list = registry.list();
    let text = |f: &dyn Fn(&IndexHandle) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(list.iter().map(|h| f(h.as_ref()))))
    };
    let cols: Vec<ArrayRef> = vec![
        text(&|h| h.info().name.clone()),
        text(&|h| h.info().table.clone()),
        text(&|h| h.info().column.clone()),
        text(&|h| h.index().key_type().to_arrow().to_string()),
        Arc::new(UInt64Array::from_iter_values(list.iter().map(|h| h.index().len()))),
        Arc::new(Float64Array::from_iter_values(
            list.iter()
                .map(|h| (h.index().mphf().bits_per_key() * 100.0).round() / 100.0),
        )),
        Arc::new(UInt64Array::from_iter_values(
            list.iter().map(|h| h.index().mphf().params().leaf as u64),
        )),
        Arc::new(UInt64Array::from_iter_values(
            list.iter().map(|h| h.index().mphf().params().bucket as u64),
        )),
        Arc::new(UInt64Array::from_iter_values(
            list.iter().map(|h| h.index().size_bytes()),
        )),
        text(&|h| h.info().built_at.clone()),
        text(&|h| h.info().device.clone()),
        text(&|h| h.info().source.label().to_string()),
        Arc::new(StringArray::from_iter(
            list.iter()
                .map(|h| h.info().path.as_ref().map(|p| p.display().to_string())),
        )),
    ];
    Ok(RecordBatch::try_new(index_list_schema(), cols)?)
}

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

/// A [`SessionContext`] with the MPHF extension and its statements.
#[derive(Clone)]
pub struct MphfContext {
    ctx: SessionContext,
    registry: Arc<MphfRegistry>,
}

impl Default for MphfContext {
    fn default() -> Self {
        Self::new()
    }
}

impl MphfContext {
    /// A context with DataFusion's defaults plus the extension.
    pub fn new() -> Self {
        Self::with_config(SessionConfig::new())
    }
    /// A context with `config` plus the extension.
    pub fn with_config(config: SessionConfig) -> Self {
        Self::with_state_builder(SessionStateBuilder::new().with_default_features().with_config(config))
    }
    /// A context from a builder (the extension is added with [`with_mphf`]).
    pub fn with_state_builder(builder: SessionStateBuilder) -> Self {
        let state = with_mphf(builder).build();
        let registry = state
            .config()
            .get_extension::<MphfRegistry>()
            .expect("with_mphf sets the registry");
        Self {
            ctx: SessionContext::new_with_state(state),
            registry,
        }
    }
    /// The DataFusion context (register tables, run DataFrame code).
    pub fn ctx(&self) -> &SessionContext {
        &self.ctx
    }
    /// The session's index registry.
    pub fn registry(&self) -> &Arc<MphfRegistry> {
        &self.registry
    }
    /// The current `mphf.*` options.
    pub fn config(&self) -> MphfConfig {
        self.ctx
            .state()
            .config()
            .options()
            .extensions
            .get::<MphfConfig>()
            .cloned()
            .unwrap_or_default()
    }

    /// Runs one SQL statement: the extension's own, or DataFusion's.
    ///
    /// # Errors
    /// Planning errors (unknown table/column, unsupported type, duplicate index name), build
    /// errors, `ResourcesExhausted` when the index does not fit the memory pool, and every
    /// DataFusion error.
    pub async fn sql(&self, sql: &str) -> Result<DataFrame> {
        match statements::classify(sql)? {
            None => self.ctx.sql(sql).await,
            Some(MphfStatement::CreateIndex {
                name,
                table,
                column,
                if_not_exists,
                params,
                seed,
                device,
            }) => {
                let spec = IndexSpec {
                    name,
                    table,
                    column,
                    params,
                    seed,
                    device,
                };
                self.create_index(spec, if_not_exists).await?;
                self.ctx.read_empty()
            }
            Some(MphfStatement::DropIndex { names, if_exists }) => {
                for n in names {
                    self.drop_index(&n, if_exists).await?;
                }
                self.ctx.read_empty()
            }
            Some(MphfStatement::ShowIndexes) => self.ctx.read_batch(index_list_batch(&self.registry)?),
            Some(MphfStatement::CreateExternalTable(t)) => {
                let df = self.ctx.sql(sql).await?;
                self.load_saved_indexes(&t).await?;
                Ok(df)
            }
            Some(MphfStatement::CreateTableAs(t)) => {
                let df = self.ctx.sql(sql).await?;
                self.strip_inherited_labels(&t).await?;
                Ok(df)
            }
            Some(MphfStatement::DropTable(tables)) => {
                let df = self.ctx.sql(sql).await?;
                for t in tables {
                    if !self.ctx.table_exist(t.reference.clone())? {
                        self.registry.remove_table(&t.text);
                    }
                }
                Ok(df)
            }
        }
    }

    /// A table created from a query over an indexed table inherits its source's field metadata,
    /// which names the source's index: wrap it in an index-less [`MphfTable`], whose schema
    /// drops such labels, so that `mphf_index` and the operators never use another table's index.
    async fn strip_inherited_labels(&self, table: &TableName) -> Result<()> {
        let provider = self.ctx.table_provider(table.reference.clone()).await?;
        if provider.downcast_ref::<MphfTable>().is_some()
            || !provider
                .schema()
                .fields()
                .iter()
                .any(|f| super::table::has_index_label(f))
        {
            return Ok(());
        }
        let wrapped = MphfTable::new(provider, BTreeMap::new());
        self.ctx.deregister_table(table.reference.clone())?;
        self.ctx.register_table(table.reference.clone(), Arc::new(wrapped))?;
        Ok(())
    }

    /// Registers a Parquet file or folder as `name`, then loads its saved indexes.
    pub async fn register_parquet(&self, name: &str, path: &str) -> Result<()> {
        self.ctx
            .register_parquet(name, path, ParquetReadOptions::default())
            .await?;
        let table = TableName {
            text: name.to_string(),
            reference: TableReference::bare(name),
        };
        self.load_saved_indexes(&table).await.map(|_| ())
    }

    fn notice(&self, msg: &str) {
        if self.config().verbose {
            eprintln!("{msg}");
        }
    }

    /// Loads (or, when stale or corrupt, rebuilds) every saved index of a file-backed table.
    pub async fn load_saved_indexes(&self, table: &TableName) -> Result<Vec<Arc<IndexHandle>>> {
        let cfg = self.config();
        if !cfg.persist {
            return Ok(vec![]);
        }
        let provider = self.ctx.table_provider(table.reference.clone()).await?;
        let Some(fp) = persist::fingerprint(provider.as_ref()) else {
            return Ok(vec![]);
        };
        let dir = persist::index_dir(&cfg.index_dir, &fp);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Ok(vec![]);
        };
        let mut files: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        files.sort();
        let mut out = vec![];
        for path in files {
            let Some(fname) = path.file_name().and_then(|f| f.to_str()) else {
                continue;
            };
            let Some(column) = persist::column_of_saved(fname, &table.text) else {
                continue;
            };
            // Only the header (checksummed, not validated): `install` opens the file fully.
            let prov = ColumnIndex::read_provenance(&path)
                .ok()
                .and_then(|p| Provenance::parse(&p));
            // The file name says which column the file is for (it is read back exactly, see
            // `persist::saved_path`); a file that names another column (an older, lossy name)
            // or a column the table lacks is left alone, never moved onto another column.
            if let Some(p) = prov.as_ref().filter(|p| p.column != column) {
                self.notice(&format!(
                    "saved MPHF index {} holds column '{}', not '{column}' as its name says; ignored",
                    path.display(),
                    p.column
                ));
                continue;
            }
            if provider.schema().field_with_name(&column).is_err() {
                self.notice(&format!(
                    "saved MPHF index {} is for column '{column}', which table '{}' does not have; ignored",
                    path.display(),
                    table.text
                ));
                continue;
            }
            let (name, params, seed) = match &prov {
                Some(p) => {
                    let (params, seed) = persist::parse_params_text(&p.params).unwrap_or((Params::DEFAULT, 0));
                    (p.name.clone(), params, seed)
                }
                None => (
                    format!("{}_{}", table.text.replace('.', "_"), column),
                    Params::DEFAULT,
                    0,
                ),
            };
            if self.registry.get(&name).is_some() || self.registry.find(&table.text, &column).is_some() {
                continue;
            }
            let spec = IndexSpec {
                name,
                table: table.clone(),
                column,
                params,
                seed,
                device: Device::Auto,
            };
            // Over the memory limit the table stays usable, without this index.
            match self.install(spec, true).await {
                Ok(handle) => out.push(handle),
                Err(DataFusionError::ResourcesExhausted(why)) => self.notice(&format!(
                    "{why}; table '{}' is registered without this index",
                    table.text
                )),
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// `CREATE INDEX`: see the module doc. With `if_not_exists`, an existing index of that name
    /// is kept. An index that registration loaded from a saved file (or rebuilt from a stale or
    /// corrupt one) counts as existing when it covers the same table and column with the same
    /// parameters (so a script's `CREATE INDEX` reuses it); with other parameters it is rebuilt.
    pub async fn create_index(&self, spec: IndexSpec, if_not_exists: bool) -> Result<Arc<IndexHandle>> {
        if let Some(h) = self.registry.get(&spec.name) {
            let same = h.info().table == spec.table.text && h.info().column == spec.column;
            // A saved index that registration loaded, or rebuilt because it was stale or
            // corrupt, is the one a script's CREATE INDEX asks for (re-running the script must
            // not fail once after every data change); with other parameters it is rebuilt.
            let from_saved = matches!(
                h.info().source,
                IndexSource::Loaded | IndexSource::RebuiltStale | IndexSource::RebuiltCorrupt
            );
            if if_not_exists || (same && from_saved && h.index().mphf().params() == spec.params) {
                return Ok(h);
            }
            if same && from_saved {
                self.drop_index(&spec.name, false).await?;
                return self.install(spec, false).await;
            }
            return plan_err!(
                "MPHF index '{}' already exists (on {}.{}); DROP INDEX {} first or use CREATE INDEX IF NOT EXISTS",
                spec.name,
                h.info().table,
                h.info().column,
                spec.name
            );
        }
        self.install(spec, false).await
    }

    async fn install(&self, spec: IndexSpec, at_registration: bool) -> Result<Arc<IndexHandle>> {
        let cfg = self.config();
        let IndexSpec {
            name,
            table,
            column,
            params,
            seed,
            device,
        } = spec;
        let provider = self.ctx.table_provider(table.reference.clone()).await.map_err(|e| {
            DataFusionError::Plan(format!("CREATE INDEX {name}: table '{}' not found ({e})", table.text))
        })?;
        let (inner, existing) = match provider.downcast_ref::<MphfTable>() {
            Some(t) => (Arc::clone(t.inner()), t.indexes().clone()),
            None => (Arc::clone(&provider), BTreeMap::new()),
        };
        let schema = inner.schema();
        let Ok(field) = schema.field_with_name(&column) else {
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
        if let Some(h) = existing.get(&column) {
            return plan_err!(
                "CREATE INDEX {name}: column '{column}' of table '{}' already has the MPHF index '{}'",
                table.text,
                h.info().name
            );
        }

        let started = Instant::now();
        // Every allocation of the index is reserved in the pool before it is made: the saved
        // file before it is read, the scanned column batch by batch, the build's working set
        // before the build, the lookup structures before they are derived. The reservation
        // then shrinks to what the index keeps. Nothing is saved before it fits.
        let reservation =
            MemoryConsumer::new(format!("MPHF index {name}")).register(&self.ctx.runtime_env().memory_pool);
        let over_pool = |what: &str, bytes: u64, e: DataFusionError| {
            DataFusionError::ResourcesExhausted(format!(
                "MPHF index '{name}' on {}({column}): {what} needs {bytes} bytes, more than the memory pool has \
                 left: {e}",
                table.text
            ))
        };
        let fp = if cfg.persist {
            persist::fingerprint(inner.as_ref())
        } else {
            None
        };
        let params_text = persist::params_text(&params, seed);
        let saved = fp
            .as_ref()
            .map(|fp| persist::saved_path(&persist::index_dir(&cfg.index_dir, fp), &table.text, &column));
        let mut source = IndexSource::Built;
        let mut index = None;
        let mut rows_per_run = None;
        let mut build_arrays = Vec::new();
        if let (Some(fp), Some(path)) = (&fp, &saved) {
            let want = (!at_registration).then_some(params_text.as_str());
            let file_len = std::fs::symlink_metadata(path).map_or(0, |m| m.len());
            reservation
                .try_grow(file_len as usize)
                .map_err(|e| over_pool("reading its saved file", file_len, e))?;
            let state = persist::check_saved(path, &column, want, fp);
            if !matches!(state, SavedState::Fresh(_)) {
                reservation.free();
            }
            match state {
                SavedState::Missing => {}
                SavedState::Fresh(i) => {
                    self.notice(&format!(
                        "reusing saved MPHF index {name} on {}({column}) from {} (fingerprint matches)",
                        table.text,
                        path.display()
                    ));
                    rows_per_run = Provenance::parse(i.provenance()).and_then(|p| p.rows_per_run);
                    index = Some(*i);
                    source = IndexSource::Loaded;
                }
                SavedState::Stale(why) => {
                    if cfg.refuse_stale() {
                        return plan_err!(
                            "saved MPHF index {} for {}({column}) is stale: {why}; refusing it because \
                             mphf.on_stale = 'refuse' (delete the file or SET mphf.on_stale = 'rebuild')",
                            path.display(),
                            table.text
                        );
                    }
                    self.notice(&format!(
                        "saved MPHF index {} is stale ({why}); rebuilding",
                        path.display()
                    ));
                    source = IndexSource::RebuiltStale;
                }
                SavedState::Corrupt(why) => {
                    self.notice(&format!(
                        "saved MPHF index {} is corrupt ({why}); rebuilding",
                        path.display()
                    ));
                    source = IndexSource::RebuiltCorrupt;
                }
            }
        }
        let index = match index {
            Some(i) => i,
            None => {
                let (i, runs, arrays) = self
                    .build_column(&inner, &column, params, seed, device, &reservation, &over_pool)
                    .await?;
                rows_per_run = Some(runs);
                build_arrays = arrays;
                i
            }
        };

        // The lookup structures: at most the dense table's bytes per key and the decoded MPHF's
        // (under 2 bytes per key), plus 8 bytes per row for the row slots.
        let distinct = index.len();
        let derived = distinct.saturating_mul(cfg.dense_lookup_max_bytes_per_key.max(0.0) as u64 + 2)
            + build_arrays.iter().map(|a| a.len() as u64 * 8).sum::<u64>();
        reservation
            .try_grow(derived as usize)
            .map_err(|e| over_pool("its lookup tables", derived, e))?;
        let mut index = index
            .with_dense_lookup(cfg.dense_lookup_max_bytes_per_key)
            .with_flat_lookup();
        // An in-memory table hands its queries the arrays it stores (the ones just scanned):
        // their rows' slots are worth keeping. Other tables decode fresh arrays per scan.
        if cfg.row_slots && inner.downcast_ref::<MemTable>().is_some() && !build_arrays.is_empty() {
            let arrays = std::mem::take(&mut build_arrays);
            index = tokio::task::spawn_blocking(move || index.with_row_slots(&arrays))
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
        }
        let size =
            (index.size_bytes() + index.dense_lookup_bytes() + index.flat_lookup_bytes() + index.row_slot_bytes())
                as usize;
        reservation
            .try_resize(size)
            .map_err(|e| over_pool("the index", size as u64, e))?;
        drop(build_arrays);
        if source != IndexSource::Loaded {
            if let (Some(fp), Some(path)) = (&fp, &saved) {
                let prov = Provenance {
                    name: name.clone(),
                    column: column.clone(),
                    params: params_text,
                    fingerprint: fp.text(),
                    rows_per_run,
                };
                index.set_provenance(prov.render());
                let now: Option<Fingerprint> = persist::fingerprint(inner.as_ref());
                if now.as_ref() != Some(fp) {
                    return plan_err!(
                        "CREATE INDEX {name}: the data files of '{}' changed while the index was built; retry",
                        table.text
                    );
                }
                // A save that fails (a read-only folder, a FIFO or symlink planted at the
                // file's place) costs the next session a rebuild, never this one its index.
                let saved = match path.parent() {
                    Some(dir) => std::fs::create_dir_all(dir).map_err(crate::MphfError::from),
                    None => Ok(()),
                }
                .and_then(|()| index.write_to_path(path));
                if let Err(e) = saved {
                    self.notice(&format!(
                        "could not save MPHF index {name} to {}: {e}; it is used without being saved",
                        path.display()
                    ));
                }
            }
        }
        let info = IndexInfo {
            name: name.clone(),
            table: table.text.clone(),
            column: column.clone(),
            built_at: format_utc(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64),
            ),
            device: index.device().to_string(),
            build_ms: started.elapsed().as_secs_f64() * 1e3,
            rows_per_run,
            source,
            path: saved,
        };
        let index = Arc::new(index);
        let slot_maps = if cfg.row_slots {
            self.slot_maps_for(&inner, &column, &index, info.path.as_deref(), &reservation, &over_pool)
                .await?
        } else {
            None
        };
        let handle = IndexHandle::new(index, info, slot_maps, Some(reservation));
        let mut indexes = existing;
        indexes.insert(column, Arc::clone(&handle));
        let new_table: Arc<dyn TableProvider> = Arc::new(MphfTable::new(inner, indexes));
        self.ctx.deregister_table(table.reference.clone())?;
        self.ctx.register_table(table.reference.clone(), new_table)?;
        self.registry.insert(Arc::clone(&handle));
        Ok(handle)
    }

    /// The slot maps of `index` over the Parquet files of `inner` (`None` for other tables): read
    /// from the file next to the saved index when they are valid for this index and these files,
    /// else made and saved there. Their bytes are reserved in `reservation` first. A table whose
    /// slot maps cannot be made keeps its index without them (with a notice).
    async fn slot_maps_for(
        &self,
        inner: &Arc<dyn TableProvider>,
        column: &str,
        index: &Arc<ColumnIndex>,
        saved: Option<&std::path::Path>,
        reservation: &MemoryReservation,
        over_pool: &(dyn Fn(&str, u64, DataFusionError) -> DataFusionError + Sync),
    ) -> Result<Option<Arc<SlotMaps>>> {
        let Some((_, files)) = persist::data_files(inner.as_ref()) else {
            return Ok(None);
        };
        let Some(stamps) = persist::stamps(&files) else {
            return Ok(None);
        };
        if stamps.is_empty() || stamps.iter().any(|s| s.rows < 0) || index.len() >= u64::from(crate::index::NO_SLOT) {
            return Ok(None);
        }
        let rows: u64 = stamps.iter().map(|s| s.rows as u64).sum();
        // Slot maps are an accelerator: a pool too small for them leaves the index without.
        if let Err(e) = reservation.try_grow(rows as usize * 4) {
            self.notice(&over_pool("its slot maps", rows * 4, e).to_string());
            return Ok(None);
        }
        let path = saved.map(slot_map_path);
        if let Some(p) = path.as_ref().filter(|p| p.exists()) {
            match SlotMaps::read(p, index, &stamps) {
                Ok(maps) => return Ok(Some(Arc::new(maps))),
                Err(e) => self.notice(&format!("slot maps {} not used ({e}); making them again", p.display())),
            }
        }
        let (index, col) = (Arc::clone(index), column.to_string());
        let built = tokio::task::spawn_blocking(move || SlotMaps::build(&stamps, &col, &index))
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let maps = match built {
            Ok(maps) => maps,
            Err(e) => {
                reservation.shrink(rows as usize * 4);
                self.notice(&format!("column '{column}' has no slot maps: {e}"));
                return Ok(None);
            }
        };
        if let Some(p) = &path {
            if let Err(e) = maps.write(p) {
                self.notice(&format!(
                    "could not save slot maps to {}: {e}; they are used unsaved",
                    p.display()
                ));
            }
        }
        Ok(Some(Arc::new(maps)))
    }

    /// Scans `column` of `inner` once and builds its index on a blocking thread; also returns the
    /// column's rows per run of equal consecutive keys (NULLs included), the clustering the
    /// aggregate rule's costing uses, and the scanned arrays.
    ///
    /// `reservation` grows by each scanned batch and then by the build's working set
    /// ([`ColumnIndex::build_bytes_estimate`]) before the build starts; `over_pool` words the
    /// error when it cannot.
    #[allow(clippy::too_many_arguments)]
    async fn build_column(
        &self,
        inner: &Arc<dyn TableProvider>,
        column: &str,
        params: Params,
        seed: u64,
        device: Device,
        reservation: &MemoryReservation,
        over_pool: &(dyn Fn(&str, u64, DataFusionError) -> DataFusionError + Sync),
    ) -> Result<(ColumnIndex, f64, Vec<ArrayRef>)> {
        let df = self
            .ctx
            .read_table(Arc::clone(inner))?
            .select(vec![Expr::Column(Column::new_unqualified(column))])?;
        let key_type = df.schema().field(0).data_type().clone();
        let mut stream = df.execute_stream().await?;
        let mut chunks: Vec<ArrayRef> = Vec::new();
        let mut scanned = 0u64;
        while let Some(batch) = stream.next().await {
            let chunk = Arc::clone(batch?.column(0));
            let bytes = chunk.get_array_memory_size() as u64;
            scanned += bytes;
            reservation
                .try_grow(bytes as usize)
                .map_err(|e| over_pool("scanning its column", scanned, e))?;
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
        reservation
            .try_grow(working as usize)
            .map_err(|e| over_pool("building", scanned + working, e))?;
        let (solver, notice) = crate::device::solver_for(device, rows as u64, &params);
        if let Some(notice) = notice {
            self.notice(&notice);
        }
        let opts = IndexOptions {
            params,
            seed,
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

    /// `DROP INDEX`: unregisters the index, re-registers its table without it and deletes its
    /// saved file. Returns false when it did not exist and `if_exists` was given.
    pub async fn drop_index(&self, name: &str, if_exists: bool) -> Result<bool> {
        let Some(handle) = self.registry.get(name) else {
            if if_exists {
                return Ok(false);
            }
            return plan_err!("MPHF index '{name}' does not exist");
        };
        let info = handle.info().clone();
        let reference = TableReference::from(info.table.as_str());
        if let Ok(provider) = self.ctx.table_provider(reference.clone()).await {
            if let Some(t) = provider.downcast_ref::<MphfTable>() {
                let rest: Arc<dyn TableProvider> = match t.without(&info.column) {
                    Some(rest) => Arc::new(rest),
                    None => Arc::clone(t.inner()),
                };
                self.ctx.deregister_table(reference.clone())?;
                self.ctx.register_table(reference, rest)?;
            }
        }
        self.registry.remove(name);
        if let Some(p) = &info.path {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::remove_file(slot_map_path(p));
        }
        Ok(true)
    }
}

/// Where the slot maps of the index saved at `index_path` are saved: beside it, `.slots` added.
pub fn slot_map_path(index_path: &std::path::Path) -> std::path::PathBuf {
    let mut name = index_path.as_os_str().to_owned();
    name.push(".slots");
    std::path::PathBuf::from(name)
}
