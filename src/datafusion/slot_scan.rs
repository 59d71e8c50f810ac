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
//! # Rewriting a plan
//! [`attach_scan_slots`] walks from an operator's input down through projections, filters,
//! repartitions and cooperative wrappers to the [`MphfRelabelExec`] over the `DataSourceExec` of the
//! indexed table, following the key column, and rebuilds that chain with the slot column
//! appended at the end of every schema (so no column index of the original nodes moves). It
//! returns the position of the slot column in the new input, or `None` when any node is of
//! another kind.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use ::datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, UInt32Array};
use ::datafusion::arrow::compute::take;
use ::datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::TreeNodeRecursion;
use ::datafusion::common::{internal_err, Result};
use ::datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, FileSource, ParquetSource};
use ::datafusion::datasource::source::DataSourceExec;
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::projection::{ProjectionExpr, ProjectionExprs};
use ::datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr, ScalarFunctionExpr};
use ::datafusion::physical_plan::coop::CooperativeExec;
use ::datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use ::datafusion::physical_plan::filter::{FilterExec, FilterExecBuilder};
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, Partitioning, PlanProperties, ReplaceChildrenOptions,
};
use futures::StreamExt;

use super::registry::{index_id_of_field, IndexHandle, SCAN_SLOTS_METADATA_KEY};
use super::table::MphfRelabelExec;
use crate::core::column::{ColumnIndex, ABSENT};
use crate::index::{FileSlots, FileStamp, NO_SLOT};

/// Name of the appended slot column.
pub const SCAN_SLOTS_COLUMN: &str = "__mphf_scan_slots";
/// Name of the row-number column asked of the Parquet scan (dropped again).
const ROW_NUMBER_COLUMN: &str = "__mphf_file_row";
/// One row in this many of every batch is checked against the index.
const SAMPLE_EVERY: usize = 64;

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
/// slot maps.
pub fn attach_scan_slots(
    input: &Arc<dyn ExecutionPlan>,
    key: usize,
    handle: &Arc<IndexHandle>,
) -> Result<Option<(Arc<dyn ExecutionPlan>, usize)>> {
    if let Some(relabel) = input.downcast_ref::<MphfRelabelExec>() {
        let field = relabel.schema().fields().get(key).cloned();
        if field.as_deref().and_then(index_id_of_field) != Some(handle.id()) {
            return Ok(None);
        }
        let Some(scan) = SlotScanExec::try_new(relabel, key, handle)? else {
            return Ok(None);
        };
        let pos = scan.schema().fields().len() - 1;
        return Ok(Some((Arc::new(scan), pos)));
    }
    if let Some(p) = input.downcast_ref::<ProjectionExec>() {
        let Some(col) = p.expr().get(key).and_then(|e| e.expr.downcast_ref::<Column>()) else {
            return Ok(None);
        };
        let Some((child, slot)) = attach_scan_slots(p.input(), col.index(), handle)? else {
            return Ok(None);
        };
        let mut exprs: Vec<ProjectionExpr> = p.expr().to_vec();
        exprs.push(ProjectionExpr::new(
            Arc::new(Column::new(SCAN_SLOTS_COLUMN, slot)),
            SCAN_SLOTS_COLUMN,
        ));
        let pos = exprs.len() - 1;
        return Ok(Some((Arc::new(ProjectionExec::try_new(exprs, child)?), pos)));
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
        let Some((child, slot)) = attach_scan_slots(f.input(), inner_key, handle)? else {
            return Ok(None);
        };
        let (projection, pos) = match projection {
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
        return Ok(Some((Arc::new(rebuilt), pos)));
    }
    if let Some(r) = input.downcast_ref::<RepartitionExec>() {
        if r.preserve_order() {
            return Ok(None);
        }
        let Some((child, slot)) = attach_scan_slots(r.input(), key, handle)? else {
            return Ok(None);
        };
        return Ok(Some((
            Arc::new(RepartitionExec::try_new(child, r.partitioning().clone())?),
            slot,
        )));
    }
    if input.downcast_ref::<CooperativeExec>().is_some() {
        let [child] = input.children()[..] else {
            return Ok(None);
        };
        let Some((child, slot)) = attach_scan_slots(child, key, handle)? else {
            return Ok(None);
        };
        let options = ReplaceChildrenOptions::new(::datafusion::physical_plan::ChildrenPropertiesMode::Recompute);
        return Ok(Some((Arc::clone(input).replace_children(vec![child], options)?, slot)));
    }
    Ok(None)
}

/// Whether column `col` of `plan` is a column of an indexed table's scan whose arrays reach
/// `plan`'s output as the scan produced them: only projections of plain columns and
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
    match plan.downcast_ref::<RepartitionExec>() {
        Some(r) if matches!(r.partitioning(), Partitioning::RoundRobinBatch(_)) => hands_table_arrays(r.input(), col),
        _ => false,
    }
}

/// The slots a slot-map scan appended, as lookup slots (`NO_SLOT`, a NULL key, becomes
/// `ABSENT`) in `out`; false, leaving `out` to a lookup, when any is NULL (rows the scan did
/// not vouch for) or `column` is not the scan's slot column type.
pub fn scan_slots_of(column: &ArrayRef, out: &mut Vec<u64>) -> bool {
    let Some(slots) = column.as_any().downcast_ref::<UInt32Array>() else {
        return false;
    };
    if slots.null_count() > 0 {
        return false;
    }
    out.clear();
    out.extend(
        slots
            .values()
            .iter()
            .map(|&s| if s == NO_SLOT { ABSENT } else { u64::from(s) }),
    );
    true
}

/// The position of the slot column a slot-map scan appended for `handle`'s index in `schema`.
pub fn scan_slots_position(schema: &Schema, handle: &IndexHandle) -> Option<usize> {
    let label = handle.label();
    schema
        .fields()
        .iter()
        .position(|f| f.metadata().get(SCAN_SLOTS_METADATA_KEY) == Some(&label))
}

/// One file of one partition: its own single-file scan with row numbers, and its slots.
#[derive(Debug, Clone)]
struct FileScan {
    /// DataFusion's scan of this file alone, its output plus the row-number column.
    exec: Arc<dyn ExecutionPlan>,
    /// Canonical path (`None`: could not be resolved; its rows get NULL slots).
    path: Option<PathBuf>,
    /// The file's slot map.
    slots: Option<Arc<FileSlots>>,
}

/// A Parquet scan that appends the slot of each row (see the module docs).
#[derive(Debug)]
pub struct SlotScanExec {
    /// The files of each output partition, in the order the original scan reads them.
    partitions: Vec<Vec<FileScan>>,
    /// The relabeled schema of the original scan plus the slot field.
    schema: SchemaRef,
    /// Position of the key column.
    key: usize,
    /// The index.
    handle: Arc<IndexHandle>,
    /// Files in all.
    files: usize,
    /// Files with a slot map.
    mapped: usize,
    properties: Arc<PlanProperties>,
}

impl SlotScanExec {
    /// The slot scan replacing `relabel` (over a Parquet `DataSourceExec`), for the key column
    /// at `key`; `None` when the scan is of another kind, has a limit, or the index has no slot
    /// maps.
    fn try_new(relabel: &MphfRelabelExec, key: usize, handle: &Arc<IndexHandle>) -> Result<Option<Self>> {
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
        let out = ds.schema();
        let mut exprs: Vec<ProjectionExpr> = out
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| ProjectionExpr::new(Arc::new(Column::new(f.name(), i)), f.name()))
            .collect();
        let row_number = ScalarFunctionExpr::new(
            "file_row_index",
            ::datafusion::functions::core::file_row_index(),
            vec![],
            Arc::new(Field::new(ROW_NUMBER_COLUMN, DataType::Int64, true)),
            Arc::new(ConfigOptions::default()),
        );
        exprs.push(ProjectionExpr::new(Arc::new(row_number), ROW_NUMBER_COLUMN));
        let Some(source) = parquet.try_pushdown_projection(&ProjectionExprs::new(exprs))? else {
            return Ok(None);
        };
        let (mut files, mut mapped) = (0, 0);
        let mut partitions = Vec::with_capacity(config.file_groups.len());
        for group in &config.file_groups {
            let mut scans = Vec::with_capacity(group.len());
            for file in group.files() {
                let single = FileScanConfigBuilder::from(config.clone())
                    .with_source(Arc::clone(&source))
                    .with_file_groups(vec![FileGroup::new(vec![file.clone()])])
                    .build();
                let exec: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(single);
                let got = exec.schema();
                if got.fields().len() != out.fields().len() + 1
                    || got.fields().last().map(|f| f.data_type()) != Some(&DataType::Int64)
                {
                    return Ok(None);
                }
                let path = std::path::Path::new("/")
                    .join(file.object_meta.location.as_ref())
                    .canonicalize()
                    .ok();
                let slots = path.as_ref().and_then(|p| maps.file(p)).cloned();
                files += 1;
                mapped += usize::from(slots.is_some());
                scans.push(FileScan { exec, path, slots });
            }
            partitions.push(scans);
        }
        if mapped == 0 {
            return Ok(None);
        }
        let mut fields: Vec<Field> = relabel.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(slot_field(handle));
        let schema = Arc::new(Schema::new_with_metadata(fields, relabel.schema().metadata().clone()));
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(relabel.properties().partitioning.partition_count().max(1)),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        // A partition count that differs from the groups' would leave partitions unread.
        if partitions.len() != properties.partitioning.partition_count() {
            return Ok(None);
        }
        Ok(Some(Self {
            partitions,
            schema,
            key,
            handle: Arc::clone(handle),
            files,
            mapped,
            properties,
        }))
    }
}

impl DisplayAs for SlotScanExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let info = self.handle.info();
        match t {
            DisplayFormatType::TreeRender => write!(f, "slots={}.{}", info.table, info.column),
            _ => write!(
                f,
                "SlotScanExec: slots={}.{}, files={}, mapped={}",
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
        let out_schema = Arc::clone(&schema);
        let stream = futures::stream::iter(scans)
            .map(move |scan| {
                let input = match scan.exec.execute(0, Arc::clone(&context)) {
                    Ok(input) => input,
                    Err(e) => return futures::stream::once(async move { Err(e) }).boxed(),
                };
                let mut slots = FileSlotter::new(scan, Arc::clone(&schema), key, Arc::clone(&index));
                input.map(move |batch| slots.attach(batch?)).boxed()
            })
            .flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }
}

/// Appends the slots of one file's batches (see the module docs for when they are NULL).
struct FileSlotter {
    scan: FileScan,
    /// The file's stamp has been compared with its slot map's.
    checked: bool,
    schema: SchemaRef,
    key: usize,
    index: Arc<ColumnIndex>,
    /// Scratch for the sample lookups.
    found: Vec<u64>,
}

impl FileSlotter {
    fn new(scan: FileScan, schema: SchemaRef, key: usize, index: Arc<ColumnIndex>) -> Self {
        Self {
            scan,
            checked: false,
            schema,
            key,
            index,
            found: Vec::new(),
        }
    }

    /// `batch` (the file scan's output plus row numbers) with its slots instead of row numbers.
    fn attach(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        if !self.checked {
            self.checked = true;
            let fresh = match (&self.scan.path, &self.scan.slots) {
                (Some(path), Some(map)) => FileStamp::of(path).is_ok_and(|now| now.line == map.stamp.line),
                _ => false,
            };
            if !fresh {
                self.scan.slots = None;
            }
        }
        let rows = batch.num_rows();
        let n = batch.num_columns();
        if n == 0 {
            return internal_err!("SlotScanExec: a batch without its row-number column");
        }
        let slots = match self.slots_of(&batch)? {
            Some(values) => UInt32Array::from(values),
            None => UInt32Array::new_null(rows),
        };
        let mut columns: Vec<ArrayRef> = batch.columns()[..n - 1].to_vec();
        columns.push(Arc::new(slots));
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
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
                None => {
                    self.scan.slots = None;
                    return Ok(None);
                }
            }
        }
        if !self.sample_agrees(batch, &values)? {
            self.scan.slots = None;
            return Ok(None);
        }
        Ok(Some(values))
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
