//! The probe side of [`MphfJoinExec`](super::MphfJoinExec): one probe batch → joined batches.
//!
//! Per probe batch: the indexed key's slots come from the batched MPHF lookup (membership
//! verified against the index's stored keys, so a non-member never reaches a wrong slot), each
//! slot names its build rows ([`BuildSide::matches`]), the other join keys are compared as a
//! residual equality, the join filter (if any) is evaluated on the candidate pairs, and the
//! join type decides what is emitted. Pairs are produced in probe-row order, so the joins
//! DataFusion marks as keeping the probe side's order (inner, right, right semi/anti) keep it.
//!
//! Join types that emit build rows at the end (left, full, left semi/anti) mark matched build
//! rows in the build side's bitmap; the last probe stream to finish emits the build rows that
//! were (semi) or were not (left, full, anti) matched.
//!
//! Joins whose output needs only which probe rows have a partner, and how many (right semi and
//! anti joins, and inner joins that output probe columns alone over a build key without
//! duplicates; [`Prober::membership`]) skip the slot table: a probe row tests its slot in the
//! build's bitmap of occupied slots, a bit a slot where the table holds four bytes, so the test
//! stays in cache where the table's read would miss. A probe key with its own slots (slot maps
//! or row slots) tests those against the bitmap carried back into its own index, with no
//! translation per row.

use std::sync::Arc;

use ::datafusion::arrow::array::{
    new_null_array, Array, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use ::datafusion::arrow::compute::kernels::boolean::and;
use ::datafusion::arrow::compute::kernels::cmp::eq;
use ::datafusion::arrow::compute::take;
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::common::{internal_err, JoinSide, JoinType, Result, ScalarValue};
use ::datafusion::execution::memory_pool::MemoryPool;
use ::datafusion::physical_expr::PhysicalExprRef;
use ::datafusion::physical_plan::joins::utils::{ColumnIndex as JoinColumn, JoinFilter};
use ::datafusion::physical_plan::metrics::{Count, Time};

use super::build::SharedBuild;
use super::translate::Translator;
use crate::core::bits::bit_is_set;
use crate::core::column::translate::SlotTranslation;
use crate::core::column::ABSENT;
use crate::datafusion::compact_views::compact_views;
use crate::datafusion::error::to_df;
use crate::datafusion::registry::IndexHandle;

/// Metrics of one probe stream.
#[derive(Clone, Debug)]
pub struct ProbeMetrics {
    /// Time in MPHF slot lookups of probe keys.
    pub lookup_time: Time,
    /// Time matching, filtering and assembling output.
    pub join_time: Time,
    /// Probe rows read.
    pub probe_rows: Count,
    /// Probe rows whose key was not in the index (or NULL).
    pub probe_absent: Count,
    /// Probe rows whose slots came from the probe index's row slots, translated.
    pub probe_translated: Count,
    /// Probe rows whose slot was tested in the build's bitmap of occupied slots (see
    /// [`Prober::membership`]).
    pub probe_member_rows: Count,
    /// Slot translations this plan made (0 when it reused the one kept with the index).
    pub translations_made: Count,
}

/// What a probe stream needs; shared (read-only) by its batches.
pub struct Prober {
    /// The build side.
    pub build: SharedBuild,
    /// The index the build key is in.
    pub index: Arc<IndexHandle>,
    /// Probe-side expression of the indexed key.
    pub probe_key: PhysicalExprRef,
    /// What the lookup reads: `probe_key`, or the column a cast in it reads (same slots).
    pub lookup_key: PhysicalExprRef,
    /// The probe key's own index with the translation of its slots into the build index's,
    /// and the pool its table is reserved in.
    pub(crate) translation: Option<(Arc<Translator>, Arc<dyn MemoryPool>)>,
    /// Probe-side expressions of the other join keys (same order as the build side's).
    pub residual: Vec<PhysicalExprRef>,
    /// The join's non-equality filter.
    pub filter: Option<JoinFilter>,
    /// The join type (never `LeftMark` / `RightMark`).
    pub join_type: JoinType,
    /// The output needs only which probe rows have a partner, and how many: a right semi or
    /// anti join, or an inner join that outputs probe columns alone, with no residual key and
    /// no filter. The build then keeps its bitmap of occupied slots (see
    /// [`Prober::membership`]).
    pub wants_membership: bool,
    /// Where each column of the unprojected join output comes from.
    pub columns: Vec<JoinColumn>,
    /// The join's embedded projection.
    pub projection: Option<Arc<[usize]>>,
    /// Probe-side input schema (for NULL columns in the build side's final rows).
    pub probe_schema: SchemaRef,
    /// Output schema.
    pub schema: SchemaRef,
    /// Most rows per output batch.
    pub batch_size: usize,
    /// Metrics.
    pub metrics: ProbeMetrics,
}

/// Keeps the pairs whose mask entry is true (NULL counts as false).
fn retain(mask: &BooleanArray, build: &mut Vec<u32>, probe: &mut Vec<u32>) {
    let mut k = 0;
    for i in 0..build.len() {
        if mask.is_valid(i) && mask.value(i) {
            build[k] = build[i];
            probe[k] = probe[i];
            k += 1;
        }
    }
    build.truncate(k);
    probe.truncate(k);
}

impl Prober {
    /// Whether this join type marks matched build rows.
    pub fn tracks_visits(join_type: JoinType) -> bool {
        matches!(
            join_type,
            JoinType::Left | JoinType::Full | JoinType::LeftSemi | JoinType::LeftAnti
        )
    }

    /// Joins one probe batch.
    ///
    /// # Errors
    /// Expression evaluation and Arrow kernel errors.
    pub fn probe(&self, batch: &RecordBatch) -> Result<Vec<RecordBatch>> {
        if let Some(members) = self.membership() {
            let p = self.member_rows(batch, members)?;
            return self.emit_pairs(batch, Vec::new(), p);
        }
        let (b, p) = self.pairs(batch)?;
        self.emit_pairs(batch, b, p)
    }

    /// Whether the probe asks for membership alone ([`Prober::wants_membership`]), the build
    /// kept its bitmap, and, for an inner join, no slot has two build rows (each member probe
    /// row then makes exactly one output row); the bitmap if so.
    ///
    /// Semi and anti joins read the bitmap whatever the table: a probe row's output does not
    /// depend on how many partners it has.
    pub fn membership(&self) -> Option<&[u64]> {
        let unique_enough = self.join_type != JoinType::Inner || self.build.is_unique();
        self.build.members().filter(|_| self.wants_membership && unique_enough)
    }

    /// The probe rows of `batch` with a partner, in probe-row order, a row once per partner:
    /// once where its slot is occupied (each occupied slot has one build row for an inner
    /// join, see [`Prober::membership`]), and once per stray build row of its key when its key
    /// is not in the index. The pairs' build rows are not needed, so neither is the slot table.
    fn member_rows(&self, batch: &RecordBatch, members: &[u64]) -> Result<Vec<u32>> {
        let n = batch.num_rows();
        self.metrics.probe_rows.add(n);
        let keys = self.probe_key.evaluate(batch)?.into_array(n)?;
        let (slots, members) = match self.own_slots_and_members(batch, n, members)? {
            Some(own) => own,
            None => (self.slots_of(batch, n)?, members),
        };
        let _t = self.metrics.join_time.timer();
        let mut p = Vec::with_capacity(n);
        let strays = !self.build.strays.is_empty();
        let nulls = keys.logical_nulls();
        let mut absent = 0;
        for (i, &s) in slots.iter().enumerate() {
            if s != ABSENT {
                if bit_is_set(members, s) {
                    p.push(i as u32);
                }
                continue;
            }
            absent += 1;
            if strays && nulls.as_ref().is_none_or(|m| m.is_valid(i)) {
                if let Some(rows) = self.build.strays.get(&ScalarValue::try_from_array(keys.as_ref(), i)?) {
                    p.extend(std::iter::repeat_n(i as u32, rows.len()));
                }
            }
        }
        self.metrics.probe_absent.add(absent);
        self.metrics.probe_member_rows.add(n);
        Ok(p)
    }

    /// The probe batch's slots in the probe key's own index (into `out`), when a slot-map scan
    /// or the index's row slots give every row's; false otherwise (and without a translation).
    ///
    /// # Errors
    /// Evaluating the lookup column.
    pub fn probe_slots(&self, batch: &RecordBatch, out: &mut Vec<u64>) -> Result<bool> {
        let Some((t, _)) = &self.translation else {
            return Ok(false);
        };
        let _t = self.metrics.lookup_time.timer();
        let lookup = self.lookup_key.evaluate(batch)?.into_array(batch.num_rows())?;
        Ok(t.own_slots(batch, lookup.as_ref(), out))
    }

    /// The translation of the probe key's own index into the build index, when the probe key
    /// has one (see [`Prober::probe_slots`]).
    pub fn translation_table(&self) -> Option<Arc<SlotTranslation>> {
        let (t, pool) = self.translation.as_ref()?;
        t.table(&self.index, pool, &self.metrics.translations_made)
    }

    /// The matching pairs of one probe batch: build rows `b[i]` with probe rows `p[i]`, after
    /// the residual equalities and the join filter, in probe-row order.
    ///
    /// # Errors
    /// Expression evaluation and Arrow kernel errors.
    pub fn pairs(&self, batch: &RecordBatch) -> Result<(Vec<u32>, Vec<u32>)> {
        let n = batch.num_rows();
        self.metrics.probe_rows.add(n);
        let keys = self.probe_key.evaluate(batch)?.into_array(n)?;
        let slots = self.slots_of(batch, n)?;
        let _t = self.metrics.join_time.timer();
        let (mut b, mut p) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let strays = !self.build.strays.is_empty();
        let nulls = keys.logical_nulls();
        let mut absent = 0;
        for (i, &s) in slots.iter().enumerate() {
            if s != ABSENT {
                self.build.matches(s, i as u32, &mut b, &mut p);
                continue;
            }
            absent += 1;
            if strays && nulls.as_ref().is_none_or(|m| m.is_valid(i)) {
                if let Some(rows) = self.build.strays.get(&ScalarValue::try_from_array(keys.as_ref(), i)?) {
                    b.extend_from_slice(rows);
                    p.extend(std::iter::repeat_n(i as u32, rows.len()));
                }
            }
        }
        self.metrics.probe_absent.add(absent);
        if !b.is_empty() && !self.residual.is_empty() {
            let (bi, pi) = (UInt32Array::from(b.clone()), UInt32Array::from(p.clone()));
            let mut mask: Option<BooleanArray> = None;
            for (built, expr) in self.build.residual_keys.iter().zip(&self.residual) {
                let probed = expr.evaluate(batch)?.into_array(n)?;
                let same = eq(&take(built.as_ref(), &bi, None)?, &take(probed.as_ref(), &pi, None)?)?;
                mask = Some(match mask {
                    Some(m) => and(&m, &same)?,
                    None => same,
                });
            }
            if let Some(mask) = mask {
                retain(&mask, &mut b, &mut p);
            }
        }
        if let (Some(filter), false) = (&self.filter, b.is_empty()) {
            let (bi, pi) = (UInt32Array::from(b.clone()), UInt32Array::from(p.clone()));
            let columns = filter
                .column_indices()
                .iter()
                .map(|c| match c.side {
                    JoinSide::Left => Ok(take(self.build.batch.column(c.index).as_ref(), &bi, None)?),
                    JoinSide::Right => Ok(take(batch.column(c.index).as_ref(), &pi, None)?),
                    JoinSide::None => internal_err!("MphfJoinExec: join filter column without a side"),
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(b.len()));
            let inter = RecordBatch::try_new_with_options(Arc::clone(filter.schema()), columns, &options)?;
            let mask = filter.expression().evaluate(&inter)?.into_array(b.len())?;
            let Some(mask) = mask.as_any().downcast_ref::<BooleanArray>() else {
                return internal_err!("MphfJoinExec: join filter did not return booleans");
            };
            retain(mask, &mut b, &mut p);
        }
        Ok((b, p))
    }

    /// The slots of the `n` rows of `batch` in the probe key's own index, with the build's
    /// occupied slots carried into that index ([`BuildSide::probe_members`]), when the probe
    /// has its own slots and their translation, and the build has no strays: a probe row then
    /// tests its own slot, with no translation per row. `None` otherwise (a stray build row is
    /// found by its key, which only a probe row without a translated slot looks for).
    ///
    /// # Errors
    /// Evaluating the lookup column; the memory pool refusing the carried bitmap.
    fn own_slots_and_members(
        &self,
        batch: &RecordBatch,
        n: usize,
        members: &[u64],
    ) -> Result<Option<(Vec<u64>, &[u64])>> {
        let Some((t, pool)) = self.translation.as_ref().filter(|_| self.build.strays.is_empty()) else {
            return Ok(None);
        };
        let _t = self.metrics.lookup_time.timer();
        let lookup = self.lookup_key.evaluate(batch)?.into_array(n)?;
        let mut own = Vec::new();
        if !t.own_slots(batch, lookup.as_ref(), &mut own) {
            return Ok(None);
        }
        let Some(table) = t.table(&self.index, pool, &self.metrics.translations_made) else {
            return Ok(None);
        };
        self.metrics.probe_translated.add(n);
        let own_members = self.build.probe_members(table.len(), || table.preimage_bits(members))?;
        Ok(Some((own, own_members)))
    }

    /// The slots in the build index of the `n` rows of `batch`: their own index's slots
    /// translated, when the probe key has slot maps or row slots, else looked up (`ABSENT`
    /// for NULL and non-member keys).
    ///
    /// # Errors
    /// Evaluating the lookup column, a translation or lookup error.
    fn slots_of(&self, batch: &RecordBatch, n: usize) -> Result<Vec<u64>> {
        let mut slots = Vec::new();
        let _t = self.metrics.lookup_time.timer();
        let lookup = self.lookup_key.evaluate(batch)?.into_array(n)?;
        let translated = match &self.translation {
            Some((t, pool)) if t.own_slots(batch, lookup.as_ref(), &mut slots) => {
                match t.table(&self.index, pool, &self.metrics.translations_made) {
                    Some(table) => table.translate(&mut slots).map_err(to_df).map(|()| true)?,
                    None => false,
                }
            }
            _ => false,
        };
        if translated {
            self.metrics.probe_translated.add(n);
        } else {
            self.index
                .index()
                .lookup_slots(lookup.as_ref(), &mut slots)
                .map_err(to_df)?;
        }
        Ok(slots)
    }

    /// Turns the matching pairs of one probe batch into output rows per join type.
    fn emit_pairs(&self, batch: &RecordBatch, b: Vec<u32>, p: Vec<u32>) -> Result<Vec<RecordBatch>> {
        let n = batch.num_rows();
        let unmatched_probes = || {
            let mut matched = vec![false; n];
            for &i in &p {
                matched[i as usize] = true;
            }
            (0..n as u32).filter(move |&i| !matched[i as usize])
        };
        match self.join_type {
            JoinType::Inner => self.assemble(Some(batch), UInt32Array::from(b), UInt32Array::from(p)),
            JoinType::Left => {
                self.build.visit(&b);
                self.assemble(Some(batch), UInt32Array::from(b), UInt32Array::from(p))
            }
            JoinType::LeftSemi | JoinType::LeftAnti => {
                self.build.visit(&b);
                Ok(Vec::new())
            }
            JoinType::Full => {
                self.build.visit(&b);
                let mut bo: Vec<Option<u32>> = b.into_iter().map(Some).collect();
                let mut po = p.clone();
                for i in unmatched_probes() {
                    bo.push(None);
                    po.push(i);
                }
                self.assemble(Some(batch), UInt32Array::from(bo), UInt32Array::from(po))
            }
            JoinType::Right => {
                // Probe order: each probe row's matches, or one row with a NULL build side.
                let mut bo = Vec::with_capacity(n.max(b.len()));
                let mut po = Vec::with_capacity(n.max(b.len()));
                let mut j = 0;
                for i in 0..n as u32 {
                    if j < p.len() && p[j] == i {
                        while j < p.len() && p[j] == i {
                            bo.push(Some(b[j]));
                            po.push(i);
                            j += 1;
                        }
                    } else {
                        bo.push(None);
                        po.push(i);
                    }
                }
                self.assemble(Some(batch), UInt32Array::from(bo), UInt32Array::from(po))
            }
            JoinType::RightSemi => {
                let mut rows = p;
                rows.dedup();
                self.assemble(
                    Some(batch),
                    UInt32Array::from(Vec::<u32>::new()),
                    UInt32Array::from(rows),
                )
            }
            JoinType::RightAnti => {
                let rows: Vec<u32> = unmatched_probes().collect();
                self.assemble(
                    Some(batch),
                    UInt32Array::from(Vec::<u32>::new()),
                    UInt32Array::from(rows),
                )
            }
            JoinType::LeftMark | JoinType::RightMark => {
                internal_err!("MphfJoinExec: mark joins are not supported")
            }
        }
    }

    /// Called when the probe input ended: the build side's final rows, from the last stream.
    ///
    /// # Errors
    /// Arrow kernel errors.
    pub fn finish(&self) -> Result<Vec<RecordBatch>> {
        let last = self.build.finish_probe();
        if !last || !Self::tracks_visits(self.join_type) {
            return Ok(Vec::new());
        }
        let want_visited = self.join_type == JoinType::LeftSemi;
        let rows: Vec<u32> = (0..self.build.rows())
            .filter(|&r| self.build.was_visited(r) == want_visited)
            .map(|r| r as u32)
            .collect();
        let len = rows.len();
        self.assemble(None, UInt32Array::from(rows), UInt32Array::new_null(len))
    }

    /// Output batches (at most `batch_size` rows each) of the rows `build[i]` ⋈ `probe[i]`
    /// (NULL index: a NULL-padded side; `probe_batch` None: the probe side is all NULL).
    fn assemble(
        &self,
        probe_batch: Option<&RecordBatch>,
        build: UInt32Array,
        probe: UInt32Array,
    ) -> Result<Vec<RecordBatch>> {
        let len = match (build.is_empty(), probe.is_empty()) {
            (true, true) => return Ok(Vec::new()),
            (false, _) => build.len(),
            (true, false) => probe.len(),
        };
        let full: Vec<usize> = (0..self.columns.len()).collect();
        let wanted: &[usize] = self.projection.as_deref().unwrap_or(&full);
        let mut columns = Vec::with_capacity(wanted.len());
        for &k in wanted {
            let c = &self.columns[k];
            columns.push(match (c.side, probe_batch) {
                (JoinSide::Left, _) => take(self.build.batch.column(c.index).as_ref(), &build, None)?,
                (JoinSide::Right, Some(batch)) => take(batch.column(c.index).as_ref(), &probe, None)?,
                (JoinSide::Right, None) => new_null_array(self.probe_schema.field(c.index).data_type(), len),
                (JoinSide::None, _) => return internal_err!("MphfJoinExec: output column without a side"),
            });
        }
        let options = RecordBatchOptions::new().with_row_count(Some(len));
        let out = RecordBatch::try_new_with_options(Arc::clone(&self.schema), columns, &options)?;
        let step = self.batch_size.max(1);
        (0..len)
            .step_by(step)
            .map(|o| compact_views(out.slice(o, step.min(len - o))))
            .collect()
    }
}
