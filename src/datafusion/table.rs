//! `MphfTable`: any [`TableProvider`] plus MPHF indexes on some of its columns.
//!
//! The table's schema is the inner schema with [`INDEX_METADATA_KEY`] metadata on each indexed
//! field (the value is the index's label, see [`registry`](super::registry)). Scans delegate to the
//! inner provider; the plan is wrapped in an [`MphfRelabelExec`] whose output schema carries the
//! same metadata, so that physical planning of `mphf_index(col)` sees it too (DataFusion builds
//! the physical function from the physical input schema). Relabeling is free: batches keep their
//! columns and only swap their schema pointer.
//!
//! The relabel node is transparent to DataFusion's scan optimizations: a sort, a filter (a
//! TopK's or a hash join's dynamic filter, a `FilterExec` under `pushdown_filters`) and a
//! projection of bare columns pass through it into the scan, as they would with no index. A
//! node that blocked them would cost an indexed table those optimizations even when no MPHF
//! operator is planned. Filters that call `mphf_index` stay above it, since below it their
//! column carries no label.
//!
//! Invariant: a field carries an id only while this table holds the index's handle, so a plan
//! over this table always resolves the id.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use ::datafusion::arrow::array::{RecordBatch, RecordBatchOptions};
use ::datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use ::datafusion::catalog::{Session, TableProvider};
use ::datafusion::common::config::ConfigOptions;
use ::datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use ::datafusion::common::{internal_err, Constraints, Result, Statistics};
use ::datafusion::datasource::TableType;
use ::datafusion::execution::{SendableRecordBatchStream, TaskContext};
use ::datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use ::datafusion::physical_expr::expressions::Column;
use ::datafusion::physical_expr::{PhysicalExpr, PhysicalSortExpr, ScalarFunctionExpr};
use ::datafusion::physical_plan::execution_plan::CardinalityEffect;
use ::datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::sort_pushdown::SortOrderPushdownResult;
use ::datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use ::datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use ::datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use async_trait::async_trait;
use futures::StreamExt;

use super::registry::{index_of_field, IndexHandle, INDEX_METADATA_KEY};
use super::udf::mphf_index::MPHF_INDEX_NAME;

/// A table provider that owns MPHF indexes on some columns of an inner provider.
#[derive(Debug)]
pub struct MphfTable {
    /// The wrapped provider (scans go there).
    inner: Arc<dyn TableProvider>,
    /// Indexes by column name.
    indexes: BTreeMap<String, Arc<IndexHandle>>,
    /// Inner schema plus index metadata on indexed fields.
    schema: SchemaRef,
}

/// `schema` with the index metadata of `indexes` set on the matching fields (by name) and
/// removed from every other field: a table created from a query over an indexed table (`CREATE
/// TABLE … AS SELECT`) inherits the field metadata of its source, which names an index of a
/// different table.
fn label_schema(schema: &Schema, indexes: &BTreeMap<String, Arc<IndexHandle>>) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| {
            let mut md = f.metadata().clone();
            match indexes.get(f.name()) {
                Some(h) => md.insert(INDEX_METADATA_KEY.to_string(), h.label()),
                None => md.remove(INDEX_METADATA_KEY),
            };
            f.as_ref().clone().with_metadata(md)
        })
        .collect();
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

impl MphfTable {
    /// Wraps `inner` with `indexes` (column name → index). An `inner` that is itself an
    /// `MphfTable` is unwrapped first, keeping its indexes unless `indexes` replaces them.
    pub fn new(inner: Arc<dyn TableProvider>, indexes: BTreeMap<String, Arc<IndexHandle>>) -> Self {
        let unwrapped = inner
            .downcast_ref::<MphfTable>()
            .map(|t| (Arc::clone(&t.inner), t.indexes.clone()));
        let (inner, mut all) = unwrapped.unwrap_or((inner, BTreeMap::new()));
        all.extend(indexes);
        let schema = label_schema(&inner.schema(), &all);
        Self {
            inner,
            indexes: all,
            schema,
        }
    }
    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn TableProvider> {
        &self.inner
    }
    /// Indexes by column.
    pub fn indexes(&self) -> &BTreeMap<String, Arc<IndexHandle>> {
        &self.indexes
    }
    /// The same table without the index on `column`; `None` when no index remains (use
    /// [`MphfTable::inner`] then).
    pub fn without(&self, column: &str) -> Option<MphfTable> {
        let mut rest = self.indexes.clone();
        rest.remove(column);
        (!rest.is_empty()).then(|| MphfTable::new(Arc::clone(&self.inner), rest))
    }
}

#[async_trait]
impl TableProvider for MphfTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.inner.constraints()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.scan(state, projection, filters, limit).await?;
        MphfRelabelExec::try_new(plan, &self.indexes)
    }

    fn supports_filters_pushdown(&self, filters: &[&Expr]) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.inner.statistics()
    }
}

/// True when `expr` calls `mphf_index`, which finds its index by the label of its argument's
/// field: evaluated below an [`MphfRelabelExec`], it would find none.
fn reads_index_labels(expr: &Arc<dyn PhysicalExpr>) -> bool {
    expr.exists(|e| {
        Ok(e.downcast_ref::<ScalarFunctionExpr>()
            .is_some_and(|call| call.name() == MPHF_INDEX_NAME))
    })
    .unwrap_or(true)
}

/// True when `a` and `b` have as many fields and each pair of fields at the same position is
/// `same`.
fn fields_pair_up(a: &Schema, b: &Schema, same: impl Fn(&Field, &Field) -> bool) -> bool {
    a.fields().len() == b.fields().len() && a.fields().iter().zip(b.fields()).all(|(x, y)| same(x, y))
}

/// True when `field` carries an index label (its own or one inherited from a source table).
pub fn has_index_label(field: &Field) -> bool {
    field.metadata().contains_key(INDEX_METADATA_KEY)
}

/// Passes its input through unchanged, with index metadata set on the output schema (and stale
/// labels removed, see `label_schema`).
#[derive(Debug)]
pub struct MphfRelabelExec {
    /// The scan.
    input: Arc<dyn ExecutionPlan>,
    /// The input schema plus index metadata.
    schema: SchemaRef,
    /// Input properties with the relabeled schema.
    properties: Arc<PlanProperties>,
    /// Indexed columns (for display).
    columns: Vec<String>,
    /// The input's statistics by partition (`None`: all), once asked (see [`InputStatistics`]).
    input_stats: InputStatistics,
}

/// The statistics of a node's input, kept after the first walk that computes them.
///
/// Why: each optimizer rule that estimates rows walks the plan with a fresh
/// `StatisticsContext`, and an in-memory table computes its statistics from every batch on each
/// walk. The relabel node sits on every scan of an indexed table, so it keeps its input's
/// answer and tells later walks to skip the scan. Sound because a node's input never changes:
/// a new input makes a new relabel node with an empty memo.
#[derive(Debug, Default)]
struct InputStatistics(Mutex<Vec<(Option<usize>, Arc<Statistics>)>>);

impl InputStatistics {
    /// The kept statistics of `partition`, if a walk computed them.
    fn get(&self, partition: Option<usize>) -> Option<Arc<Statistics>> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.iter().find(|(p, _)| *p == partition).map(|(_, s)| Arc::clone(s))
    }

    /// Keeps `stats` as the statistics of `partition`.
    fn keep(&self, partition: Option<usize>, stats: &Arc<Statistics>) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if !kept.iter().any(|(p, _)| *p == partition) {
            kept.push((partition, Arc::clone(stats)));
        }
    }
}

impl MphfRelabelExec {
    /// Wraps `input`; returns it unchanged when none of its fields is indexed.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        indexes: &BTreeMap<String, Arc<IndexHandle>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let in_schema = input.schema();
        let columns: Vec<String> = in_schema
            .fields()
            .iter()
            .filter(|f| indexes.contains_key(f.name()) || has_index_label(f))
            .map(|f| f.name().clone())
            .collect();
        if columns.is_empty() {
            return Ok(input);
        }
        let schema = label_schema(&in_schema, indexes);
        Ok(Arc::new(Self::with_schema(input, schema, columns)?))
    }

    /// This node's labels over `child`, a new input with the same columns (the scan after a
    /// sort, fetch or order-preservation change was pushed into it).
    fn over(&self, child: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
        if !fields_pair_up(&child.schema(), &self.schema, |a, b| a.name() == b.name()) {
            return internal_err!("MphfRelabelExec: the new child's columns differ from the old one's");
        }
        Ok(Arc::new(Self::with_schema(
            child,
            Arc::clone(&self.schema),
            self.columns.clone(),
        )?))
    }

    /// The indexed columns' names.
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// The live indexes the output schema's labels name, once each.
    pub fn indexes(&self) -> Vec<Arc<IndexHandle>> {
        let mut out: Vec<Arc<IndexHandle>> = Vec::new();
        for handle in self.schema.fields().iter().filter_map(|f| index_of_field(f)) {
            if !out.iter().any(|h| h.id() == handle.id()) {
                out.push(handle);
            }
        }
        out
    }

    /// `input` with `schema` (its schema with labels set) as output schema, for the `columns`
    /// named (a plan decoded on a worker gets the coordinator's node back this way).
    pub(crate) fn with_schema(input: Arc<dyn ExecutionPlan>, schema: SchemaRef, columns: Vec<String>) -> Result<Self> {
        let mut props = input.properties().as_ref().clone();
        let eq = props.eq_properties.clone().with_new_schema(Arc::clone(&schema))?;
        props.set_eq_properties(eq);
        Ok(Self {
            input,
            schema,
            properties: Arc::new(props),
            columns,
            input_stats: InputStatistics::default(),
        })
    }
}

impl DisplayAs for MphfRelabelExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        match t {
            DisplayFormatType::TreeRender => write!(f, "indexed={}", self.columns.join(", ")),
            _ => write!(f, "MphfRelabelExec: indexed=[{}]", self.columns.join(", ")),
        }
    }
}

impl ExecutionPlan for MphfRelabelExec {
    fn name(&self) -> &str {
        "MphfRelabelExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("MphfRelabelExec takes one child, got {}", children.len());
        }
        self.over(children.remove(0))
    }

    fn with_new_children(self: Arc<Self>, children: Vec<Arc<dyn ExecutionPlan>>) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(::datafusion::physical_plan::ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(&self, partition: usize, context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
        let stream = self.input.execute(partition, context)?;
        let schema = Arc::clone(&self.schema);
        let out_schema = Arc::clone(&schema);
        let relabeled = stream.map(move |batch: Result<RecordBatch>| -> Result<RecordBatch> {
            // Not `with_schema`: it refuses to change metadata that the input already carries.
            let batch = batch?;
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            Ok(RecordBatch::try_new_with_options(
                Arc::clone(&schema),
                batch.columns().to_vec(),
                &options,
            )?)
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, relabeled)))
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // Relabeling changes field metadata only: the input's statistics hold as they are.
        // Kept ones first: `child_stats_requests` skipped the input when there are.
        if let Some(kept) = self.input_stats.get(args.partition()) {
            return Ok(kept);
        }
        match input_stats.first() {
            Some(stats) => {
                self.input_stats.keep(args.partition(), stats);
                Ok(Arc::clone(stats))
            }
            None => internal_err!("MphfRelabelExec: no input statistics"),
        }
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        match self.input_stats.get(partition) {
            Some(_) => vec![ChildStats::Skip],
            None => vec![ChildStats::At(partition)],
        }
    }

    fn supports_limit_pushdown(&self) -> bool {
        true
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::Equal
    }

    /// The order a sort above wants is the scan's to give (a Parquet scan may reverse its row
    /// groups for it); this node keeps its labels over the reordered scan.
    fn try_pushdown_sort(&self, order: &[PhysicalSortExpr]) -> Result<SortOrderPushdownResult<Arc<dyn ExecutionPlan>>> {
        self.input.try_pushdown_sort(order)?.try_map(|scan| self.over(scan))
    }

    fn with_preserve_order(&self, preserve_order: bool) -> Option<Arc<dyn ExecutionPlan>> {
        let scan = self.input.with_preserve_order(preserve_order)?;
        self.over(scan).ok()
    }

    /// Relabeling keeps every column as it is, so a filter above holds below unchanged: the
    /// scan gets the filters that DataFusion pushes down (a join's or a TopK's dynamic
    /// filter, a `FilterExec` under `pushdown_filters`) exactly as in a session without
    /// indexes.
    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        // A filter that calls `mphf_index` stays above: below, its column has no label. It is
        // passed on as a column that does not exist, which marks it as not pushed down in
        // its place (the optimizer matches the answers to the filters by position).
        let filters: Vec<Arc<dyn PhysicalExpr>> = parent_filters
            .into_iter()
            .map(|f| match reads_index_labels(&f) {
                true => Arc::new(Column::new("mphf_index", usize::MAX)) as Arc<dyn PhysicalExpr>,
                false => f,
            })
            .collect();
        FilterDescription::from_children(filters, &self.children())
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(FilterPushdownPropagation::if_all(child_pushdown_result))
    }

    /// A projection of bare columns moves into the scan below, as it would without indexes;
    /// this node then relabels the projected columns with the projection's own output schema,
    /// which names the same indexes (a column keeps its label under an alias). A projection
    /// that computes anything stays above: an expression such as `mphf_index(col)` reads the
    /// labels of its input.
    fn try_swapping_with_projection(&self, projection: &ProjectionExec) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if !projection
            .expr()
            .iter()
            .all(|p| p.expr.downcast_ref::<Column>().is_some())
        {
            return Ok(None);
        }
        let Some(projected) = self.input.try_swapping_with_projection(projection)? else {
            return Ok(None);
        };
        let schema = projection.schema();
        let inner = projected.schema();
        if !fields_pair_up(&inner, &schema, |a, b| {
            a.name() == b.name() && a.data_type() == b.data_type()
        }) {
            return Ok(None);
        }
        let columns: Vec<String> = schema
            .fields()
            .iter()
            .filter(|f| has_index_label(f))
            .map(|f| f.name().clone())
            .collect();
        if columns.is_empty() && inner == schema {
            return Ok(Some(projected));
        }
        Ok(Some(Arc::new(Self::with_schema(projected, schema, columns)?)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ::datafusion::arrow::datatypes::DataType;
    use ::datafusion::common::internal_datafusion_err;
    use ::datafusion::physical_expr::{EquivalenceProperties, Partitioning};
    use ::datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
    use ::datafusion::physical_plan::statistics::StatisticsContext;

    use super::*;

    /// A leaf of known row count that counts how often its statistics are computed.
    #[derive(Debug)]
    struct CountingLeaf {
        properties: Arc<PlanProperties>,
        asked: AtomicUsize,
    }

    impl CountingLeaf {
        fn new(schema: SchemaRef) -> Self {
            let properties = PlanProperties::new(
                EquivalenceProperties::new(schema),
                Partitioning::UnknownPartitioning(2),
                EmissionType::Incremental,
                Boundedness::Bounded,
            );
            Self {
                properties: Arc::new(properties),
                asked: AtomicUsize::new(0),
            }
        }
    }

    impl DisplayAs for CountingLeaf {
        fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "CountingLeaf")
        }
    }

    impl ExecutionPlan for CountingLeaf {
        fn name(&self) -> &str {
            "CountingLeaf"
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
        fn with_new_children(
            self: Arc<Self>,
            _children: Vec<Arc<dyn ExecutionPlan>>,
        ) -> Result<Arc<dyn ExecutionPlan>> {
            Ok(self)
        }
        fn execute(&self, _partition: usize, _context: Arc<TaskContext>) -> Result<SendableRecordBatchStream> {
            Err(internal_datafusion_err!("CountingLeaf does not run"))
        }
        fn statistics_from_inputs(
            &self,
            _inputs: &[Arc<Statistics>],
            args: &StatisticsArgs,
        ) -> Result<Arc<Statistics>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let mut stats = Statistics::new_unknown(&self.schema());
            let rows = match args.partition() {
                None => 100,
                Some(p) => 40 + 20 * p,
            };
            stats.num_rows = ::datafusion::common::stats::Precision::Exact(rows);
            Ok(Arc::new(stats))
        }
    }

    fn rows(plan: &dyn ExecutionPlan, partition: Option<usize>) -> Option<usize> {
        let args = StatisticsArgs::new().with_partition(partition);
        let stats = StatisticsContext::new().compute(plan, &args).expect("statistics");
        stats.num_rows.get_value().copied()
    }

    #[test]
    fn relabel_computes_its_inputs_statistics_once_per_partition() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let leaf = Arc::new(CountingLeaf::new(Arc::clone(&schema)));
        let relabel = MphfRelabelExec::with_schema(Arc::clone(&leaf) as _, schema, vec!["k".into()]).expect("relabel");
        // Each walk has a fresh context, as each optimizer rule's has.
        for _ in 0..3 {
            assert_eq!(rows(&relabel, None), Some(100));
            assert_eq!(rows(&relabel, Some(1)), Some(60));
        }
        assert_eq!(leaf.asked.load(Ordering::SeqCst), 2);
        assert_eq!(rows(&relabel, Some(0)), Some(40));
        assert_eq!(leaf.asked.load(Ordering::SeqCst), 3);
        // A new input makes a new node, which asks its input again.
        let over = Arc::new(relabel).over(Arc::clone(&leaf) as _).expect("over");
        assert_eq!(rows(over.as_ref(), None), Some(100));
        assert_eq!(leaf.asked.load(Ordering::SeqCst), 4);
    }
}
