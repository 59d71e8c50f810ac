//! [`SlotScanExec`]: a Parquet scan of an indexed table that appends each row's slot, read from
//! the index's slot maps (see [`crate::index::slot_map`]), and [`attach_scan_slots`], which
//! puts it under an operator that wants slots.
//!
//! # How a batch gets its slots
//! The scan runs DataFusion's own Parquet scan one file at a time (the same file source, so
//! the same projection, row-group and page pruning, pushed-down filters and batch size), with
//! DataFusion's `file_row_index()` virtual column added: the row number of each row within its
//! file, counted over all row groups, whatever was pruned or filtered. The row number indexes
//! the file's slot map; the row-number column is dropped and the slot column appended.
//!
//! # When a row's slot is NULL (the operator then looks the key up)
//! - The file has no slot map, or its [`FileStamp`] now differs from the one the map was made
//!   with (checked when the file is opened, so a rewrite under a live session is seen).
//! - A row number falls outside the map.
//! - A sample of each batch (every 64th row and the last) looked up in the index does not give
//!   the stored slots: from then on the file's slots are not used.
//!
//! # When the key column is not read
//! An operator that needs a row's key only when the row has no slot (an aggregate whose output
//! keys come from the index, and whose other expressions do not read the key) asks for
//! [`KeyColumn::WhereNoSlots`]. A file whose slot map is fresh when it is opened is then scanned
//! without the key column, which for string keys is most of a Parquet scan's decoding, and the
//! key column is filled with a placeholder (NULLs, or the type's default when the field is not
//! nullable). Such a file's freshness rests on its [`FileStamp`] alone (the footer with its
//! column statistics, sampled body blocks, size and modification time): there is no key to
//! sample. A row number outside such a file's map fails the query, since its key is not at hand.
//! Files without a fresh map are scanned with the key, as above.
//!
//! # Rewriting a plan
//! [`attach_scan_slots`] walks from an operator's input down through projections, filters,
//! repartitions, coalesces and cooperative wrappers to the [`MphfRelabelExec`] over the `DataSourceExec` of the
//! indexed table, following the key column, and rebuilds that chain with the slot column
//! appended at the end of every schema (so no column index of the original nodes moves). It
//! returns the position of the slot column in the new input, or `None` when any node is of
//! another kind. A node on the way that reads the key column itself (a projection that
//! computes with it, a filter on it, a hash repartition by it) turns
//! [`KeyColumn::WhereNoSlots`] into [`KeyColumn::Read`] below it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ::datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use ::datafusion::arrow::buffer::ScalarBuffer;
use ::datafusion::arrow::compute::take;
use ::datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::TreeNodeRecursion;
use ::datafusion::common::{internal_err, ColumnStatistics, Result, ScalarValue, Statistics};
use ::datafusion::datasource::listing::PartitionedFile;
use ::datafusion::datasource::physical_plan::{
    FileGroup, FileGroupPartitioner, FileScanConfig, FileScanConfigBuilder, FileSource, ParquetSource,
};
use ::datafusion::datasource::source::DataSourceExec;
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::projection::{ProjectionExpr, ProjectionExprs};
use ::datafusion::physical_expr::utils::collect_columns;
use ::datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, ScalarFunctionExpr};
use ::datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use ::datafusion::physical_plan::coop::CooperativeExec;
use ::datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use ::datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use ::datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::statistics::StatisticsArgs;
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;

use super::plan::scans;
use super::registry::{index_id_of_field, IndexHandle, SCAN_SLOTS_METADATA_KEY};
use super::table::MphfRelabelExec;
use crate::core::column::{ColumnIndex, ABSENT};
use crate::index::{FileSlots, FileStamp, SlotMaps, NO_SLOT};

/// Name of the appended slot column.
pub const SCAN_SLOTS_COLUMN: &str = "__mphf_scan_slots";
/// Name of the row-number column asked of the Parquet scan (dropped again).
const ROW_NUMBER_COLUMN: &str = "__mphf_file_row";
/// One row in this many of every batch is checked against the index.
const SAMPLE_EVERY: usize = 64;

/// What the operator over a slot scan needs of the key column (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyColumn {
    /// Every row's key is read.
    Read,
    /// Only rows without a stored slot need their key: files with a fresh slot map are scanned
    /// without it.
    WhereNoSlots,
}

impl KeyColumn {
    /// `self`, or [`KeyColumn::Read`] when `exprs` read column `key` of their input.
    fn unless_read_by<'a>(self, key: usize, exprs: impl IntoIterator<Item = &'a Arc<dyn PhysicalExpr>>) -> Self {
        let reads = exprs
            .into_iter()
            .any(|e| collect_columns(e).iter().any(|c| c.index() == key));
        if reads {
            KeyColumn::Read
        } else {
            self
        }
    }
}

/// The slot field of `handle`'s index.
fn slot_field(handle: &IndexHandle) -> Field {
    let md = [(SCAN_SLOTS_METADATA_KEY.to_string(), handle.label())]
        .into_iter()
        .collect();
    Field::new(SCAN_SLOTS_COLUMN, DataType::UInt32, true).with_metadata(md)
}

/// `input` (an operator's input) with the slots of `handle`'s index for its column `key`
/// appended as its last column, and the position of that column; `None` when the chain down
/// to the scan has a node this module cannot carry the column through, or the table has no
/// slot maps. `key_column` says whether the operator reads the key of rows that have a slot.
pub fn attach_scan_slots(
    input: &Arc<dyn ExecutionPlan>,
    key: usize,
    handle: &Arc<IndexHandle>,
    key_column: KeyColumn,
) -> Result<Option<(Arc<dyn ExecutionPlan>, usize)>> {
    walk_to_scan(input, key, handle, key_column, Walk::Rebuild)
}

/// Whether [`attach_scan_slots`] would give `input` its slot column: the same walk down to the
/// scan and the same slot scan (made once per plan, see `plan::scans`), without rebuilding the
/// nodes above the scan. The rules price a candidate with this answer and attach the slots
/// only to the candidate they keep: rebuilding the chain (projections and filters recompute
/// their properties) for every candidate they decline cost more than the pricing.
///
/// # Errors
/// The slot scan's.
pub fn scan_slots_reach(
    input: &Arc<dyn ExecutionPlan>,
    key: usize,
    handle: &Arc<IndexHandle>,
    key_column: KeyColumn,
) -> Result<bool> {
    Ok(walk_to_scan(input, key, handle, key_column, Walk::Check)?.is_some())
}

/// What [`walk_to_scan`] does on its way back up from the scan.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Rebuilds each node over its child with the slot column.
    Rebuild,
    /// Rebuilds and makes nothing: only whether there is a slot scan counts (the answer names
    /// the relabel node in its place).
    Check,
}

/// A plan with a slot column, and the column's position.
type Slotted = (Arc<dyn ExecutionPlan>, usize);

/// [`attach_scan_slots`] for [`Walk::Rebuild`], [`scan_slots_reach`] for [`Walk::Check`].
fn walk_to_scan(
    input: &Arc<dyn ExecutionPlan>,
    key: usize,
    handle: &Arc<IndexHandle>,
    key_column: KeyColumn,
    walk: Walk,
) -> Result<Option<Slotted>> {
    // The node above a child that found the scan: rebuilt by `rebuild`, or passed up as found.
    let above = |found: Option<Slotted>, rebuild: &dyn Fn(Arc<dyn ExecutionPlan>, usize) -> Result<Slotted>| match (
        found, walk,
    ) {
        (None, _) => Ok(None),
        (Some(found), Walk::Check) => Ok(Some(found)),
        (Some((child, slot)), Walk::Rebuild) => rebuild(child, slot).map(Some),
    };
    if let Some(relabel) = input.downcast_ref::<MphfRelabelExec>() {
        let field = relabel.schema().fields().get(key).cloned();
        if field.as_deref().and_then(index_id_of_field) != Some(handle.id()) {
            return Ok(None);
        }
        let reads_key = key_column == KeyColumn::Read;
        if walk == Walk::Check {
            // Only whether there is a scan counts: nothing is made (see `scans::scan_exists`),
            // and the relabel node stands in for the scan.
            let exists = scans::scan_exists(input, key, handle.id(), reads_key, || {
                SlotScanExec::exists(relabel, handle)
            })?;
            return Ok(exists.then(|| (Arc::clone(input), relabel.schema().fields().len())));
        }
        let scan = scans::scan_for(input, key, handle.id(), reads_key, || {
            Ok(SlotScanExec::try_new(relabel, key, handle, key_column)?.map(|s| Arc::new(s) as Arc<dyn ExecutionPlan>))
        })?;
        let Some(scan) = scan else {
            return Ok(None);
        };
        let pos = scan.schema().fields().len() - 1;
        return Ok(Some((scan, pos)));
    }
    if let Some(p) = input.downcast_ref::<ProjectionExec>() {
        let Some(col) = p.expr().get(key).and_then(|e| e.expr.downcast_ref::<Column>()) else {
            return Ok(None);
        };
        // Another output of the projection that reads the key reads it for every row.
        let others = p
            .expr()
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != key)
            .map(|(_, e)| &e.expr);
        let key_column = key_column.unless_read_by(col.index(), others);
        let found = walk_to_scan(p.input(), col.index(), handle, key_column, walk)?;
        return above(found, &|child, slot| {
            let mut exprs: Vec<ProjectionExpr> = p.expr().to_vec();
            exprs.push(ProjectionExpr::new(
                Arc::new(Column::new(SCAN_SLOTS_COLUMN, slot)),
                SCAN_SLOTS_COLUMN,
            ));
            let pos = exprs.len() - 1;
            Ok((Arc::new(ProjectionExec::try_new(exprs, child)?), pos))
        });
    }
    if let Some(f) = input.downcast_ref::<FilterExec>() {
        let projection: Option<Vec<usize>> = f.projection().as_ref().map(|p| p.iter().copied().collect());
        let inner_key = match &projection {
            Some(p) => match p.get(key) {
                Some(&k) => k,
                None => return Ok(None),
            },
            None => key,
        };
        let key_column = key_column.unless_read_by(inner_key, [f.predicate()]);
        let found = walk_to_scan(f.input(), inner_key, handle, key_column, walk)?;
        return above(found, &|child, slot| {
            let (projection, pos) = match projection.clone() {
                Some(mut p) => {
                    p.push(slot);
                    let pos = p.len() - 1;
                    (Some(p), pos)
                }
                None => (None, slot),
            };
            let rebuilt = FilterExecBuilder::new(Arc::clone(f.predicate()), child)
                .with_default_selectivity(f.default_selectivity())
                .with_batch_size(f.batch_size())
                .apply_projection(projection)?
                .build()?;
            Ok((Arc::new(rebuilt), pos))
        });
    }
    if let Some(r) = input.downcast_ref::<RepartitionExec>() {
        if r.preserve_order() {
            return Ok(None);
        }
        let key_column = match r.partitioning() {
            Partitioning::Hash(exprs, _) => key_column.unless_read_by(key, exprs),
            _ => key_column,
        };
        let found = walk_to_scan(r.input(), key, handle, key_column, walk)?;
        return above(found, &|child, slot| {
            Ok((
                Arc::new(RepartitionExec::try_new(child, r.partitioning().clone())?),
                slot,
            ))
        });
    }
    if let Some(c) = input.downcast_ref::<CoalescePartitionsExec>() {
        if c.fetch().is_some() {
            return Ok(None);
        }
        let found = walk_to_scan(c.input(), key, handle, key_column, walk)?;
        return above(found, &|child, slot| {
            Ok((Arc::new(CoalescePartitionsExec::new(child)), slot))
        });
    }
    if input.downcast_ref::<CooperativeExec>().is_some() {
        let [child] = input.children()[..] else {
            return Ok(None);
        };
        let found = walk_to_scan(child, key, handle, key_column, walk)?;
        return above(found, &|child, slot| {
            let options = ReplaceChildrenOptions::new(::datafusion::physical_plan::ChildrenPropertiesMode::Recompute);
            Ok((Arc::clone(input).replace_children(vec![child], options)?, slot))
        });
    }
    Ok(None)
}

/// Whether column `col` of `plan` is a column of an indexed table's scan whose arrays reach
/// `plan`'s output as the scan produced them: only projections of plain columns, coalesces and
/// round-robin repartitions (which move whole batches) lie between. Filters, hash
/// repartitions, sorts and casts build new arrays, which the row slots would not find.
pub fn hands_table_arrays(plan: &Arc<dyn ExecutionPlan>, col: usize) -> bool {
    if plan.downcast_ref::<MphfRelabelExec>().is_some() {
        return true;
    }
    if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        return p
            .expr()
            .get(col)
            .and_then(|e| e.expr.downcast_ref::<Column>())
            .is_some_and(|c| hands_table_arrays(p.input(), c.index()));
    }
    if let Some(c) = plan.downcast_ref::<CoalescePartitionsExec>() {
        return hands_table_arrays(c.input(), col);
    }
    match plan.downcast_ref::<RepartitionExec>() {
        Some(r) if matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) => hands_table_arrays(r.input(), col),
        _ => false,
    }
}

/// The slots a slot-map scan appended, as lookup slots (`NO_SLOT`, a NULL key, becomes
/// `ABSENT`) in `out`; false, leaving `out` to a lookup, when any is NULL (rows the scan did
/// not vouch for) or `column` is not the scan's slot column type.
pub fn scan_slots_of(column: &ArrayRef, out: &mut Vec<u64>) -> bool {
    let Some(slots) = scan_slot_values(column) else {
        return false;
    };
    out.clear();
    out.extend(slots.iter().map(|&s| if s == NO_SLOT { ABSENT } else { u64::from(s) }));
    true
}

/// The slots a slot-map scan appended, as they are (`NO_SLOT`: a NULL key), without a copy;
/// `None` on the same terms as [`scan_slots_of`].
pub fn scan_slot_values(column: &ArrayRef) -> Option<&ScalarBuffer<u32>> {
    let slots = column.as_any().downcast_ref::<UInt32Array>()?;
    (slots.null_count() == 0).then(|| slots.values())
}

/// The position of the slot column a slot-map scan appended for `handle`'s index in `schema`.
pub fn scan_slots_position(schema: &Schema, handle: &IndexHandle) -> Option<usize> {
    let label = handle.label();
    schema
        .fields()
        .iter()
        .position(|f| f.metadata().get(SCAN_SLOTS_METADATA_KEY) == Some(&label))
}

/// One file of one partition: the file, and its slots. Its single-file scan is built when the
/// partition reaches it ([`FileReader::exec`]), not when the plan is made: planning builds and
/// drops many candidate plans, and a scan built per file for each of them was most of what the
/// MPHF rules added to planning.
#[derive(Debug, Clone)]
struct FileScan {
    /// The file (or byte range of one), as the replaced scan lists it.
    file: PartitionedFile,
    /// Canonical path (`None`: could not be resolved; its rows get NULL slots).
    path: Option<PathBuf>,
    /// The file's slot map.
    slots: Option<Arc<FileSlots>>,
}

/// How one file is read: DataFusion's Parquet scan of that file alone, its output plus the
/// row-number column, built from the replaced scan's configuration.
struct FileReader {
    /// The replaced scan's configuration without its file groups (each scan adds its one file).
    /// Cloning the whole configuration per file copied every file's statistics for every file.
    fileless: FileScanConfig,
    /// The file source: the scan's columns and the row numbers.
    source: Arc<dyn FileSource>,
    /// The same without the key column (under [`KeyColumn::WhereNoSlots`]), run when the
    /// file's slot map is fresh.
    keyless: Option<Arc<dyn FileSource>>,
}

impl fmt::Debug for FileReader {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.debug_struct("FileReader")
            .field("keyless", &self.keyless.is_some())
            .finish_non_exhaustive()
    }
}

impl FileReader {
    /// The single-file scan of `file`, without the key column when `without_key` (and this
    /// reader has a keyless source).
    fn exec(&self, file: &PartitionedFile, without_key: bool) -> Arc<dyn ExecutionPlan> {
        let source = match (&self.keyless, without_key) {
            (Some(keyless), true) => keyless,
            _ => &self.source,
        };
        Self::scan(&self.fileless, source, vec![FileGroup::new(vec![file.clone()])])
    }

    /// A scan of `groups` with `config`'s options through `source`.
    fn scan(config: &FileScanConfig, source: &Arc<dyn FileSource>, groups: Vec<FileGroup>) -> Arc<dyn ExecutionPlan> {
        DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(config.clone())
                .with_source(Arc::clone(source))
                .with_file_groups(groups)
                .build(),
        )
    }

    /// Whether a scan through `source` gives `columns` columns and then the row numbers (checked
    /// once, on `config` without files: the output schema does not depend on the file). The
    /// schema is the one the scan's `DataSourceExec` would have, asked of its configuration
    /// without building the node (whose properties cost more than the rest of the check).
    fn gives(config: &FileScanConfig, source: &Arc<dyn FileSource>, columns: usize) -> bool {
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::clone(source))
            .build();
        let Ok(got) = config.projected_schema() else {
            return false;
        };
        got.fields().len() == columns + 1 && got.fields().last().map(|f| f.data_type()) == Some(&DataType::Int64)
    }
}

/// The metrics of one partition of the scan.
#[derive(Clone)]
struct ScanMetrics {
    /// Output rows, and the time spent attaching slots.
    baseline: BaselineMetrics,
    /// Rows handed over with their stored slots.
    stored_slot_rows: Count,
    /// Rows of files scanned without the key column.
    key_unread_rows: Count,
}

impl ScanMetrics {
    fn new(set: &ExecutionPlanMetricsSet, partition: usize) -> Self {
        Self {
            baseline: BaselineMetrics::new(set, partition),
            stored_slot_rows: MetricBuilder::new(set).counter("stored_slot_rows", partition),
            key_unread_rows: MetricBuilder::new(set).counter("key_unread_rows", partition),
        }
    }
}

/// A Parquet scan that appends the slot of each row (see the module docs).
#[derive(Debug)]
pub struct SlotScanExec {
    /// The files of each output partition, in the order the original scan reads them.
    partitions: Vec<Vec<FileScan>>,
    /// How each file is read.
    reader: Arc<FileReader>,
    /// The relabeled schema of the original scan plus the slot field.
    schema: SchemaRef,
    /// Position of the key column.
    key: usize,
    /// Whether rows with a slot need their key.
    key_column: KeyColumn,
    /// The index.
    handle: Arc<IndexHandle>,
    /// Files in all.
    files: usize,
    /// Files with a slot map.
    mapped: usize,
    /// The replaced scan (the `DataSourceExec` under the relabel node): its statistics are this
    /// node's, but for the slot column.
    scan: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl SlotScanExec {
    /// The Parquet scan it replaced.
    pub fn scan(&self) -> &Arc<dyn ExecutionPlan> {
        &self.scan
    }

    /// The schema of the relabel node it replaced: its own without the slot column.
    pub fn relabel_schema(&self) -> Schema {
        let fields = &self.schema.fields()[..self.schema.fields().len() - 1];
        Schema::new_with_metadata(fields.to_vec(), self.schema.metadata().clone())
    }

    /// The labeled columns of the relabel node it replaced.
    pub fn relabel_columns(&self) -> Vec<String> {
        let schema = self.relabel_schema();
        schema
            .fields()
            .iter()
            .filter(|f| super::table::has_index_label(f))
            .map(|f| f.name().clone())
            .collect()
    }

    /// The index whose slots it appends.
    pub fn index(&self) -> &Arc<IndexHandle> {
        &self.handle
    }

    /// Position of the key column.
    pub fn key(&self) -> usize {
        self.key
    }

    /// Whether rows with a slot are read with their key.
    pub fn key_column(&self) -> KeyColumn {
        self.key_column
    }

    /// Bytes of the files (or file ranges) it scans.
    pub fn file_bytes(&self) -> u64 {
        self.scan
            .downcast_ref::<DataSourceExec>()
            .and_then(|ds| ds.downcast_to_file_source::<ParquetSource>())
            .map_or(0, |(config, _)| {
                config
                    .file_groups
                    .iter()
                    .flat_map(|g| g.files())
                    .map(|f| f.effective_size())
                    .sum()
            })
    }

    /// Files with a slot map.
    pub fn mapped_files(&self) -> usize {
        self.mapped
    }

    /// The slot scan replacing `relabel` (over a Parquet `DataSourceExec`), for the key column
    /// at `key`; `None` when the scan is of another kind, has a limit, or none of its files has
    /// a slot map.
    pub(crate) fn try_new(
        relabel: &MphfRelabelExec,
        key: usize,
        handle: &Arc<IndexHandle>,
        key_column: KeyColumn,
    ) -> Result<Option<Self>> {
        Ok(Self::over_files(relabel, key, handle, key_column)?.filter(|scan| scan.mapped > 0))
    }

    /// This scan split over `tasks` distributed tasks: one slot scan per task, each over its
    /// share of the files (large files cut into byte ranges, as DataFusion's own repartitioning
    /// cuts them), each with this scan's partition count (a task with fewer file ranges than
    /// partitions leaves the rest empty). Together they read every row once, with the same
    /// slots. A task's share may hold no file with a slot map, or no file at all.
    ///
    /// # Errors
    /// The scan under the relabel node is no longer a Parquet scan (it was one when this node was
    /// made), or a task's scan cannot be built.
    pub fn split_over_tasks(&self, tasks: usize) -> Result<Vec<Arc<dyn ExecutionPlan>>> {
        let partitions = self.properties.partitioning.partition_count();
        let Some((config, _)) = self
            .scan
            .downcast_ref::<DataSourceExec>()
            .and_then(|ds| ds.downcast_to_file_source::<ParquetSource>())
        else {
            return internal_err!("SlotScanExec: its scan is not a Parquet scan");
        };
        let tasks = tasks.max(1);
        let ranges: Vec<FileGroup> = FileGroupPartitioner::new()
            .with_target_partitions(partitions * tasks)
            .with_repartition_file_min_size(0)
            .repartition_file_groups(&config.file_groups)
            .unwrap_or_else(|| config.file_groups.clone());
        let mut shares: Vec<Vec<FileGroup>> = vec![Vec::with_capacity(partitions); tasks];
        for (i, group) in ranges.into_iter().enumerate() {
            shares[i % tasks].push(group);
        }
        let relabel_schema = Arc::new(self.relabel_schema());
        let columns = self.relabel_columns();
        let mut variants = Vec::with_capacity(shares.len());
        for mut share in shares {
            // Extra ranges join the task's partitions in turn; missing ones are empty.
            while share.len() > partitions {
                let extra = share.pop().map(|g| g.files().to_vec()).unwrap_or_default();
                let into = share.len() % partitions;
                let mut files = share[into].files().to_vec();
                files.extend(extra);
                share[into] = FileGroup::new(files);
            }
            share.resize_with(partitions, || FileGroup::new(vec![]));
            let task_scan: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(
                FileScanConfigBuilder::from(config.clone())
                    .with_file_groups(share)
                    .build(),
            );
            let relabel = MphfRelabelExec::with_schema(task_scan, Arc::clone(&relabel_schema), columns.clone())?;
            match Self::over_files(&relabel, self.key, &self.handle, self.key_column)? {
                Some(scan) => variants.push(Arc::new(scan) as Arc<dyn ExecutionPlan>),
                None => return internal_err!("SlotScanExec: a task's share of the files gives no slot scan"),
            }
        }
        Ok(variants)
    }

    /// Whether [`Self::try_new`] gives a slot scan for these inputs, without making it: the
    /// Parquet scan can be replaced and at least one of its files has a slot map. (Where the
    /// file source without the key column cannot be made, `try_new` fails; that is reported
    /// when the scan is made, not here.)
    ///
    /// # Errors
    /// The file source with the row numbers cannot be made.
    pub(crate) fn exists(relabel: &MphfRelabelExec, handle: &Arc<IndexHandle>) -> Result<bool> {
        let Some(parts) = Replaceable::of(relabel, handle)? else {
            return Ok(false);
        };
        let files = parts.config.file_groups.iter().flat_map(|g| g.files());
        Ok(files.into_iter().any(|file| file_slots(parts.maps, file).1.is_some()))
    }

    /// [`Self::try_new`], also when no file has a slot map (its rows are then looked up).
    pub(crate) fn over_files(
        relabel: &MphfRelabelExec,
        key: usize,
        handle: &Arc<IndexHandle>,
        key_column: KeyColumn,
    ) -> Result<Option<Self>> {
        let Some(parts) = Replaceable::of(relabel, handle)? else {
            return Ok(None);
        };
        let out_columns = parts.out.fields().len();
        let keyless = match key_column {
            KeyColumn::WhereNoSlots => parts.source_without(Some(key))?,
            KeyColumn::Read => None,
        };
        let keyless = keyless.filter(|k| FileReader::gives(&parts.fileless, k, out_columns - 1));
        let (mut files, mut mapped) = (0, 0);
        let mut partitions = Vec::with_capacity(parts.config.file_groups.len());
        for group in &parts.config.file_groups {
            let mut scans = Vec::with_capacity(group.len());
            for file in group.files() {
                let (path, slots) = file_slots(parts.maps, file);
                files += 1;
                mapped += usize::from(slots.is_some());
                scans.push(FileScan {
                    file: file.clone(),
                    path,
                    slots,
                });
            }
            partitions.push(scans);
        }
        let mut fields: Vec<Field> = relabel.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(slot_field(handle));
        let schema = Arc::new(Schema::new_with_metadata(fields, relabel.schema().metadata().clone()));
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(parts.partition_count),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        // Without a keyless source or a mapped file, every file is read with its key.
        let key_column = match keyless.is_some() && mapped > 0 {
            true => key_column,
            false => KeyColumn::Read,
        };
        Ok(Some(Self {
            partitions,
            reader: Arc::new(FileReader {
                fileless: parts.fileless,
                source: parts.source,
                keyless,
            }),
            schema,
            key,
            key_column,
            handle: Arc::clone(handle),
            files,
            mapped,
            scan: Arc::clone(parts.inner),
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }))
    }
}

/// The Parquet scan under a relabel node, as far as a slot scan can replace it: what
/// [`SlotScanExec::over_files`] and [`SlotScanExec::exists`] both check and use.
struct Replaceable<'a> {
    maps: &'a SlotMaps,
    inner: &'a Arc<dyn ExecutionPlan>,
    config: &'a FileScanConfig,
    parquet: &'a ParquetSource,
    /// The scan's output schema.
    out: SchemaRef,
    /// The scan's file source with the row numbers appended.
    source: Arc<dyn FileSource>,
    /// The scan's configuration without its files (a file scan is made from it per file).
    fileless: FileScanConfig,
    /// The relabel node's partition count, which is also the scan's number of file groups.
    partition_count: usize,
}

impl<'a> Replaceable<'a> {
    /// `None` when the index has no slot maps, the scan is not a Parquet scan, has a limit,
    /// cannot read the row numbers with its columns, or has a file group count other than the
    /// relabel node's partition count (partitions would be left unread).
    fn of(relabel: &'a MphfRelabelExec, handle: &'a Arc<IndexHandle>) -> Result<Option<Self>> {
        let Some(maps) = handle.slot_maps() else {
            return Ok(None);
        };
        let [inner] = relabel.children()[..] else {
            return Ok(None);
        };
        let Some(ds) = inner.downcast_ref::<DataSourceExec>() else {
            return Ok(None);
        };
        let Some((config, parquet)) = ds.downcast_to_file_source::<ParquetSource>() else {
            return Ok(None);
        };
        if config.limit.is_some() {
            return Ok(None);
        }
        let partition_count = relabel.properties().partitioning.partition_count().max(1);
        if config.file_groups.len() != partition_count {
            return Ok(None);
        }
        let out = ds.schema();
        let Some(source) = source_without(parquet, &out, None)? else {
            return Ok(None);
        };
        let fileless = without_files(config);
        if !FileReader::gives(&fileless, &source, out.fields().len()) {
            return Ok(None);
        }
        Ok(Some(Self {
            maps,
            inner,
            config,
            parquet,
            out,
            source,
            fileless,
            partition_count,
        }))
    }

    /// The scan's columns (but `skip`) and the row numbers, as a file source.
    fn source_without(&self, skip: Option<usize>) -> Result<Option<Arc<dyn FileSource>>> {
        source_without(self.parquet, &self.out, skip)
    }
}

/// The columns of `out` (but `skip`) and the row numbers, read through `parquet`.
fn source_without(
    parquet: &ParquetSource,
    out: &SchemaRef,
    skip: Option<usize>,
) -> Result<Option<Arc<dyn FileSource>>> {
    let row_number: Arc<dyn PhysicalExpr> = Arc::new(ScalarFunctionExpr::new(
        "file_row_index",
        ::datafusion::functions::core::file_row_index(),
        vec![],
        Arc::new(Field::new(ROW_NUMBER_COLUMN, DataType::Int64, true)),
        Arc::new(ConfigOptions::default()),
    ));
    let mut exprs: Vec<ProjectionExpr> = out
        .fields()
        .iter()
        .enumerate()
        .filter(|&(i, _)| Some(i) != skip)
        .map(|(i, f)| ProjectionExpr::new(Arc::new(Column::new(f.name(), i)), f.name()))
        .collect();
    exprs.push(ProjectionExpr::new(row_number, ROW_NUMBER_COLUMN));
    parquet.try_pushdown_projection(&ProjectionExprs::new(exprs))
}

/// `config` without its file groups (a file scan is made from it per file).
fn without_files(config: &FileScanConfig) -> FileScanConfig {
    let mut fileless = config.clone();
    fileless.file_groups = Vec::new();
    fileless
}

/// A listed file's canonical path and slot map (`None`s: not resolved, or no map). Slot maps
/// are keyed by canonical paths. A location found as it is is the path a map was made for: no
/// system calls then (the file's stamp is compared with the map's when the scan opens it, as
/// for every file).
fn file_slots(maps: &SlotMaps, file: &PartitionedFile) -> (Option<PathBuf>, Option<Arc<FileSlots>>) {
    let named = std::path::Path::new("/").join(file.object_meta.location.as_ref());
    match maps.file(&named) {
        Some(slots) => (Some(named), Some(Arc::clone(slots))),
        None => {
            let path = named.canonicalize().ok();
            let slots = path.as_ref().and_then(|p| maps.file(p)).cloned();
            (path, slots)
        }
    }
}

impl DisplayAs for SlotScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let info = self.handle.info();
        let key = match self.key_column {
            KeyColumn::Read => "read",
            KeyColumn::WhereNoSlots => "unread in mapped files",
        };
        match t {
            DisplayFormatType::TreeRender => write!(f, "slots={}.{}", info.table, info.column),
            _ => write!(
                f,
                "SlotScanExec: slots={}.{}, files={}, mapped={}, key={key}",
                info.table, info.column, self.files, self.mapped
            ),
        }
    }
}

impl ExecutionPlan for SlotScanExec {
    fn name(&self) -> &str {
        "SlotScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return internal_err!("SlotScanExec has no children, got {}", children.len());
        }
        Ok(self)
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(::datafusion::physical_plan::ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let Some(scans) = self.partitions.get(partition).cloned() else {
            return internal_err!("SlotScanExec: no partition {partition}");
        };
        let schema = Arc::clone(&self.schema);
        let (key, index) = (self.key, Arc::clone(self.handle.index()));
        let metrics = ScanMetrics::new(&self.metrics, partition);
        let out_schema = Arc::clone(&schema);
        let reader = Arc::clone(&self.reader);
        let stream = futures::stream::iter(scans)
            .map(move |scan| {
                let mut slots = FileSlotter::open(
                    scan,
                    &reader,
                    Arc::clone(&schema),
                    key,
                    Arc::clone(&index),
                    metrics.clone(),
                );
                let input = match slots.exec.execute(0, Arc::clone(&context)) {
                    Ok(input) => input,
                    Err(e) => return futures::stream::once(async move { Err(e) }).boxed(),
                };
                input.map(move |batch| slots.attach(batch?)).boxed()
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// The replaced scan's statistics (same files, same partitions, same rows), with the slot
    /// column's unknown. Without them every estimate above a slot scan fell back to a guess:
    /// a join's probe side was priced at its build side's rows.
    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // A leaf: the replaced scan takes no input statistics either.
        let scan = self.scan.statistics_from_inputs(&[], args)?;
        let mut stats = Arc::unwrap_or_clone(scan);
        if self.key_column == KeyColumn::WhereNoSlots {
            // Mapped files hand placeholders in the key column to consumers that do not read it.
            if let Some(key) = stats.column_statistics.get_mut(self.key) {
                *key = ColumnStatistics::new_unknown();
            }
        }
        stats.column_statistics.push(ColumnStatistics::new_unknown());
        Ok(Arc::new(stats))
    }
}

/// Appends the slots of one file's batches (see the module docs for when they are NULL).
struct FileSlotter {
    scan: FileScan,
    /// The file's scan.
    exec: Arc<dyn ExecutionPlan>,
    /// The file is scanned without its key column (its slot map was fresh when opened).
    key_unread: bool,
    schema: SchemaRef,
    key: usize,
    index: Arc<ColumnIndex>,
    /// Scratch for the sample lookups.
    found: Vec<u64>,
    /// Key values standing in for the unread key column, sliced per batch.
    placeholder: Option<ArrayRef>,
    metrics: ScanMetrics,
}

impl FileSlotter {
    /// The slotter of `scan`, its file's stamp compared with its slot map's now, and the file's
    /// scan from `reader`: without the key column when the file's slots are fresh and the
    /// operator allows it.
    fn open(
        mut scan: FileScan,
        reader: &FileReader,
        schema: SchemaRef,
        key: usize,
        index: Arc<ColumnIndex>,
        metrics: ScanMetrics,
    ) -> Self {
        let fresh = match (&scan.path, &scan.slots) {
            (Some(path), Some(map)) => FileStamp::of(path).is_ok_and(|now| now.line == map.stamp.line),
            _ => false,
        };
        if !fresh {
            scan.slots = None;
        }
        let key_unread = fresh && reader.keyless.is_some();
        Self {
            exec: reader.exec(&scan.file, key_unread),
            scan,
            key_unread,
            schema,
            key,
            index,
            found: Vec::new(),
            placeholder: None,
            metrics,
        }
    }

    /// `batch` (the file scan's output plus row numbers) with its slots instead of row numbers.
    fn attach(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let elapsed = self.metrics.baseline.elapsed_compute().clone();
        let _timer = elapsed.timer();
        let rows = batch.num_rows();
        let n = batch.num_columns();
        if n == 0 {
            return internal_err!("SlotScanExec: a batch without its row-number column");
        }
        let slots = match self.slots_of(&batch)? {
            Some(values) => {
                self.metrics.stored_slot_rows.add(rows);
                UInt32Array::from(values)
            }
            None => UInt32Array::new_null(rows),
        };
        let mut columns: Vec<ArrayRef> = batch.columns()[..n - 1].to_vec();
        if self.key_unread {
            if self.key > columns.len() {
                return internal_err!("SlotScanExec: key column {} past the scan's columns", self.key);
            }
            columns.insert(self.key, self.placeholder(rows)?);
            self.metrics.key_unread_rows.add(rows);
        }
        columns.push(Arc::new(slots));
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        let out = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        self.metrics.baseline.record_output(rows);
        Ok(out)
    }

    /// `rows` values of the unread key column: NULLs, or the type's default when the field is
    /// not nullable (every row of such a batch has a slot, so no operator reads them).
    fn placeholder(&mut self, rows: usize) -> Result<ArrayRef> {
        if let Some(p) = self.placeholder.as_ref().filter(|p| p.len() >= rows) {
            return Ok(p.slice(0, rows));
        }
        let field = self.schema.field(self.key);
        let array = match field.is_nullable() {
            true => new_null_array(field.data_type(), rows),
            false => ScalarValue::new_default(field.data_type())?.to_array_of_size(rows)?,
        };
        self.placeholder = Some(Arc::clone(&array));
        Ok(array)
    }

    /// The stored slots of the batch's rows, or `None` (and the file's map dropped) when they
    /// cannot be vouched for.
    fn slots_of(&mut self, batch: &RecordBatch) -> Result<Option<Vec<u32>>> {
        let Some(map) = &self.scan.slots else {
            return Ok(None);
        };
        let row_numbers = batch.column(batch.num_columns() - 1);
        let Some(row_numbers) = row_numbers.as_primitive_opt::<Int64Type>() else {
            return internal_err!("SlotScanExec: the row-number column is not Int64");
        };
        let mut values = Vec::with_capacity(batch.num_rows());
        for &r in row_numbers.values() {
            match usize::try_from(r).ok().and_then(|r| map.slots.get(r)) {
                Some(&s) => values.push(s),
                None if self.key_unread => return Err(self.changed(&format!("row {r} is outside its slot map"))),
                None => {
                    self.scan.slots = None;
                    return Ok(None);
                }
            }
        }
        if self.key_unread {
            // Only a NULL key has no slot, and a non-nullable key column has none.
            if !self.schema.field(self.key).is_nullable() && values.contains(&NO_SLOT) {
                return Err(self.changed("a row of a non-nullable key has no slot"));
            }
            return Ok(Some(values));
        }
        if !self.sample_agrees(batch, &values)? {
            self.scan.slots = None;
            return Ok(None);
        }
        Ok(Some(values))
    }

    /// The error of a file scanned without its key whose slot map turns out not to fit it.
    fn changed(&self, what: &str) -> ::datafusion::common::DataFusionError {
        let path = self
            .scan
            .path
            .as_deref()
            .map_or_else(String::new, |p| p.display().to_string());
        ::datafusion::common::DataFusionError::Execution(format!(
            "slot map of {path}: {what}, and the file was read without its key column; the file changed during the query, run it again"
        ))
    }

    /// True when every sampled row's key looks up to its stored slot.
    fn sample_agrees(&mut self, batch: &RecordBatch, slots: &[u32]) -> Result<bool> {
        let rows = slots.len();
        if rows == 0 {
            return Ok(true);
        }
        let mut picks: Vec<u32> = (0..rows).step_by(SAMPLE_EVERY).map(|r| r as u32).collect();
        if picks.last() != Some(&(rows as u32 - 1)) {
            picks.push(rows as u32 - 1);
        }
        let picks = UInt32Array::from(picks);
        let keys = take(batch.column(self.key).as_ref(), &picks, None)?;
        self.index
            .lookup_slots(keys.as_ref(), &mut self.found)
            .map_err(|e| ::datafusion::common::DataFusionError::External(Box::new(e)))?;
        Ok(picks.values().iter().zip(&self.found).all(|(&row, &got)| {
            let stored = slots[row as usize];
            if got == ABSENT {
                stored == NO_SLOT
            } else {
                u64::from(stored) == got
            }
        }))
    }
}
