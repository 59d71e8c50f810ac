//! Probe keys that carry their own index: slots by translation instead of by lookup.
//!
//! When the probe key of an [`MphfJoinExec`](super::MphfJoinExec) is an indexed column of an
//! in-memory table (its index keeps row slots, see `core::column::row_slots`) and the probe
//! side hands the join that table's own arrays (a scan, projections, round-robin
//! repartitions: no hash repartition, no copy), each probe row's slot in the *probe* index is
//! a copy, and its slot in the *build* index is a function of that slot, computed once per
//! distinct key ([`SlotTranslation`]) and shared by all partitions. A batch whose arrays are not
//! found (a filter's output, say) takes the ordinary verified lookup; answers are the same.
//!
//! DataFusion often puts a cast under a join key of mixed string types (`o_cname` Utf8 against
//! `c_name` Utf8View) into the probe side's projection. The cast column is a new array per
//! batch, so the probe lookup reads the column the cast reads when the projection passes it
//! through too; the lookup casts it itself on the verified path.

use std::sync::{Arc, OnceLock};

use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use ::datafusion::physical_expr::expressions::{CastExpr, Column};
use ::datafusion::physical_expr::Partitioning;
use ::datafusion::physical_expr::PhysicalExprRef;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::projection::ProjectionExec;
use ::datafusion::physical_plan::repartition::RepartitionExec;
use ::datafusion::physical_plan::ExecutionPlan;

use crate::core::column::translate::SlotTranslation;
use crate::core::column::ColumnIndex;
use crate::datafusion::registry::{index_of_field, IndexHandle};
use crate::datafusion::table::MphfRelabelExec;

/// The probe column that carries an index with row slots, and that index.
pub(crate) struct ProbeIndex {
    /// The probe-side column read for the lookup (the key, or the column its cast reads).
    pub column: Column,
    /// Its index.
    pub index: Arc<IndexHandle>,
}

/// The probe side's indexed column for key pair `key` of `join`, when its index keeps row
/// slots: the key column itself, or the column a cast in the probe side's top projection
/// reads (see the module docs).
pub(crate) fn probe_index(join: &HashJoinExec, key: usize) -> Option<ProbeIndex> {
    let right = join.right();
    let schema = right.schema();
    // A cast keeps its input's field metadata (the index label) but not its arrays: the
    // column must hold the index's own key type.
    let with_slots = |c: &Column| {
        let field = schema.fields().get(c.index())?;
        let index = index_of_field(field)?;
        let own_type = index.index().keys().data_type() == field.data_type();
        (own_type && index.index().has_row_slots()).then(|| ProbeIndex {
            column: c.clone(),
            index,
        })
    };
    let col = join.on().get(key)?.1.downcast_ref::<Column>()?;
    if let Some(found) = with_slots(col) {
        return Some(found);
    }
    let proj = right.downcast_ref::<ProjectionExec>()?;
    let cast = proj.expr().get(col.index())?.expr.downcast_ref::<CastExpr>()?;
    let read = cast.expr().downcast_ref::<Column>()?;
    let out = proj.expr().iter().position(|p| {
        p.expr
            .downcast_ref::<Column>()
            .is_some_and(|c| c.index() == read.index())
    })?;
    with_slots(&Column::new(schema.field(out).name(), out))
}

/// Whether column `col` of `plan` is a column of an indexed table's scan whose arrays reach
/// `plan`'s output as the scan produced them: only projections of plain columns and
/// round-robin repartitions (which move whole batches) lie between. Filters, hash
/// repartitions, sorts and casts build new arrays, which the row slots would not find.
pub(crate) fn hands_table_arrays(plan: &Arc<dyn ExecutionPlan>, col: usize) -> bool {
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

/// Whether `join`'s probe key pair `key` gets its slots by translation: the probe key carries
/// an index with row slots ([`probe_index`]) and the probe side hands it that table's arrays.
pub(crate) fn translates_probe(join: &HashJoinExec, key: usize) -> bool {
    probe_index(join, key).is_some_and(|p| hands_table_arrays(join.right(), p.column.index()))
}

/// The translation state of one join node: built on the first probe batch found in the
/// probe index's row slots, kept for re-executions.
pub(crate) struct Translator {
    probe: ProbeIndex,
    table: OnceLock<Option<(Arc<SlotTranslation>, MemoryReservation)>>,
}

impl Translator {
    pub(crate) fn new(probe: ProbeIndex) -> Self {
        Self {
            probe,
            table: OnceLock::new(),
        }
    }

    /// The probe index's name, for `EXPLAIN`.
    pub(crate) fn describe(&self) -> String {
        let info = self.probe.index.info();
        format!("{}.{}", info.table, info.column)
    }

    /// The expression the probe lookup reads.
    pub(crate) fn lookup_key(&self) -> PhysicalExprRef {
        Arc::new(self.probe.column.clone())
    }

    /// The probe column's index.
    pub(crate) fn probe_index(&self) -> &ColumnIndex {
        self.probe.index.index()
    }

    /// The translation of the probe index's slots into `build`'s, built on first use; `None`
    /// when the memory pool cannot hold it (4 bytes per probe slot) or it cannot be built (the
    /// probe then takes the verified lookup).
    pub(crate) fn table(&self, build: &IndexHandle, pool: &Arc<dyn MemoryPool>) -> Option<Arc<SlotTranslation>> {
        let entry = self.table.get_or_init(|| {
            let reservation =
                MemoryConsumer::new(format!("MphfJoinExec[translation {}]", self.describe())).register(pool);
            reservation.try_grow(4 * self.probe_index().len() as usize).ok()?;
            let table = SlotTranslation::build(self.probe_index(), build.index()).ok()??;
            Some((Arc::new(table), reservation))
        });
        entry.as_ref().map(|(t, _)| Arc::clone(t))
    }
}
