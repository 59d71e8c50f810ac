//! `MphfContext`: a DataFusion [`SessionContext`] that also runs the extension's statements.
//!
//! [`MphfContext::sql`] classifies each statement ([`statements::classify`]): `CREATE INDEX …
//! USING mphf`, `DROP INDEX` and `SHOW MPHF INDEXES` run here; everything else goes to
//! DataFusion unchanged (after `CREATE EXTERNAL TABLE` saved indexes are loaded, after `DROP
//! TABLE` the table's indexes are dropped).
//!
//! Creating an index runs the pipeline of [`super::install`] (resolve, reuse a saved index or
//! scan and build, derive the lookup structures, save, slot maps, register). An index that does
//! not fit the memory pool fails `CREATE INDEX` with `ResourcesExhausted`; at table registration
//! the table is registered without that index.

use std::collections::BTreeMap;
use std::sync::Arc;

use ::datafusion::arrow::array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use ::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use ::datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use ::datafusion::common::{plan_err, DataFusionError, Result, TableReference};
use ::datafusion::datasource::MemTable;
use ::datafusion::execution::session_state::SessionStateBuilder;
use ::datafusion::logical_expr::{AggregateUDF, ScalarUDF};
use ::datafusion::prelude::{DataFrame, ParquetReadOptions, SessionConfig, SessionContext};

use crate::core::column::ColumnIndex;
use crate::core::Params;
use crate::datafusion::plan::Tuning;
use crate::device::Device;

use super::config::MphfConfig;
use super::install::Installer;
pub use super::install::{slot_map_path, IndexSpec};
use super::persist::{self, Provenance};
use super::registry::{IndexHandle, IndexSource, MphfRegistry};
use super::statements::{self, MphfStatement, TableName};
use super::table::MphfTable;
use super::udf::partitioned_build::{MphfBuildPartFunc, MphfRouteFunc};
use super::udf::{MphfIndexFunc, MphfStoredSlotsFunc};

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
    // The functions of index builds on a cluster (`distributed::build`) and the answer of
    // `mphf_index` from stored slots (`udf::stored_slots`): the workers find them by name.
    builder
        .scalar_functions()
        .get_or_insert_with(Vec::new)
        .push(Arc::new(ScalarUDF::from(MphfRouteFunc::default())));
    builder
        .scalar_functions()
        .get_or_insert_with(Vec::new)
        .push(Arc::new(MphfStoredSlotsFunc::udf()));
    builder
        .aggregate_functions()
        .get_or_insert_with(Vec::new)
        .push(Arc::new(AggregateUDF::from(MphfBuildPartFunc::default())));
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
        .with_physical_optimizer_rule(Arc::new(super::explain::MphfExplainRule::new()))
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

    /// The planner's thresholds for this session ([`Tuning`]; not settings, see `config.rs`).
    pub fn tuning(&self) -> Tuning {
        Tuning::of(self.ctx.state().config().options())
    }

    /// Changes the planner's thresholds for this session's later statements, e.g.
    /// `ctx.tune(|t| t.join_min_slots = 0)` (tests and benchmarks move one threshold this way).
    pub fn tune(&self, change: impl FnOnce(&mut Tuning)) {
        let mut tuning = self.tuning();
        change(&mut tuning);
        self.ctx
            .state_ref()
            .write()
            .config_mut()
            .options_mut()
            .extensions
            .insert(tuning);
    }

    /// Plans this session's later statements with the cost constants in the file at `path`
    /// (what `mphf calibrate` writes: `name = value` lines; constants it does not name keep
    /// their defaults).
    ///
    /// # Errors
    /// The file cannot be read, or a line is not a known constant with a positive value (the
    /// message names the file and the line). The session's costs are unchanged then.
    pub fn load_costs(&self, path: &std::path::Path) -> Result<()> {
        use crate::datafusion::plan::cost;
        let text = std::fs::read_to_string(path)
            .map_err(|e| DataFusionError::Configuration(format!("{}: {e}", path.display())))?;
        let model = cost::CostModel::parse(&text)
            .map_err(|e| DataFusionError::Configuration(format!("{}: {}", path.display(), cost::message_of(e))))?;
        self.tune(|t| t.costs = model);
        Ok(())
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
            match self.installer().install(spec, true).await {
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
                return self.installer().install(spec, false).await;
            }
            return plan_err!(
                "MPHF index '{}' already exists (on {}.{}); DROP INDEX {} first or use CREATE INDEX IF NOT EXISTS",
                spec.name,
                h.info().table,
                h.info().column,
                spec.name
            );
        }
        self.installer().install(spec, false).await
    }

    /// The installation pipeline over this session (see [`super::install`]).
    fn installer(&self) -> Installer<'_> {
        Installer {
            ctx: &self.ctx,
            registry: &self.registry,
            cfg: self.config(),
            tuning: self.tuning(),
        }
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
