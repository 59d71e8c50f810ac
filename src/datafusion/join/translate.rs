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

use ::datafusion::arrow::array::{Array, RecordBatch};
use ::datafusion::execution::memory_pool::MemoryPool;
use ::datafusion::physical_expr::expressions::{CastExpr, Column};
use ::datafusion::physical_expr::PhysicalExprRef;
use ::datafusion::physical_plan::joins::HashJoinExec;
use ::datafusion::physical_plan::metrics::Count;
use ::datafusion::physical_plan::projection::ProjectionExec;

use crate::core::column::translate::SlotTranslation;
use crate::core::column::ColumnIndex;
use crate::datafusion::registry::{index_of_field, IndexHandle};
use crate::datafusion::slot_scan::{hands_table_arrays, scan_slots_of, scan_slots_position};

/// The probe column that carries an index with row slots, and that index.
pub(crate) struct ProbeIndex {
    /// The probe-side column read for the lookup (the key, or the column its cast reads).
    pub column: Column,
    /// Its index.
    pub index: Arc<IndexHandle>,
    /// Position on the probe side of the slots a slot-map scan appends for that index.
    pub scan_slots: Option<usize>,
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
        let scan_slots = scan_slots_position(&schema, &index);
        (own_type && (index.index().has_row_slots() || scan_slots.is_some())).then(|| ProbeIndex {
            column: c.clone(),
            index,
            scan_slots,
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

/// Whether `join`'s probe key pair `key` gets its slots by translation: the probe key carries
/// an index with row slots ([`probe_index`]) and the probe side hands it that table's arrays.
pub(crate) fn translates_probe(join: &HashJoinExec, key: usize) -> bool {
    probe_index(join, key).is_some_and(|p| p.scan_slots.is_some() || hands_table_arrays(join.right(), p.column.index()))
}

/// The translation state of one join node: the translation kept with the build index, looked
/// up on the first probe batch whose slots the scan or the row slots gave, then held for
/// re-executions.
pub(crate) struct Translator {
    probe: ProbeIndex,
    table: OnceLock<Option<Arc<SlotTranslation>>>,
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

    /// The probe batch's slots in the probe index, from the column a slot-map scan appended
    /// (into `out`); false when there is none or it does not vouch for every row.
    pub(crate) fn scan_slots(&self, batch: &RecordBatch, out: &mut Vec<u64>) -> bool {
        self.probe
            .scan_slots
            .and_then(|c| batch.columns().get(c))
            .is_some_and(|c| scan_slots_of(c, out))
    }

    /// The probe batch's slots in the probe index (into `out`): from the slot-map scan's
    /// column, else from the row slots when `lookup` (the probe lookup column's array) is one
    /// of that table's arrays; false when neither gives every row's.
    pub(crate) fn own_slots(&self, batch: &RecordBatch, lookup: &dyn Array, out: &mut Vec<u64>) -> bool {
        self.scan_slots(batch, out) || self.probe_index().lookup_row_slots(lookup, out)
    }

    /// The probe column's index.
    pub(crate) fn probe_index(&self) -> &ColumnIndex {
        self.probe.index.index()
    }

    /// The translation of the probe index's slots into `build`'s (kept with `build`'s index
    /// across queries, see [`IndexHandle::translation_from`]), looked up once per plan;
    /// `made` counts the translations this plan made. `None`: the probe takes the verified
    /// lookup.
    pub(crate) fn table(
        &self,
        build: &IndexHandle,
        pool: &Arc<dyn MemoryPool>,
        made: &Count,
    ) -> Option<Arc<SlotTranslation>> {
        self.table
            .get_or_init(|| {
                let (table, fresh) = build.translation_from(&self.probe.index, pool);
                if fresh {
                    made.add(1);
                }
                table
            })
            .clone()
    }
}
