//! The GPU placement of the slot aggregation (issue 7): a whole input is looked up and
//! aggregated on the GPU ([`GpuIndex`], [`GpuGroupBy`]), and the per-slot results become the
//! *state* arrays of DataFusion's own accumulators, merged with `merge_batch`.
//!
//! # Why states
//! Results must equal the CPU operator's and vanilla DataFusion's. Producing the accumulators'
//! states (instead of final values) lets everything after the aggregation stay as it is: the
//! per-partition form merges them into its [`SlotGroups`](super::groups::SlotGroups) and emits
//! as usual, the SlotMerge form hands them to its slot-range merge as one more partial, and
//! `Partial` / `Single` modes, `avg`'s division and the output types remain DataFusion's.
//!
//! # What runs here ([`GpuAggregation::try_new`] decides at plan time)
//! One indexed key column (no dependent group columns, not `mphf_index` slots), and only
//! `count(*)`, `count(x)`, `sum(x)`, `min(x)`, `max(x)`, `avg(x)` without `DISTINCT`, over
//! Int8–Int64, UInt8–UInt32, Float32/Float64 and Decimal128 arguments (decimals when their
//! unscaled values sum to less than 2^63 in absolute value, checked at run time), whose state
//! fields have the types the GPU results map to exactly. Anything else stays on the CPU.
//!
//! # Invariants
//! - Counts, integer and decimal results are exact; f64 sums equal the CPU's to rounding (the
//!   GPU adds in an order fixed by its atomics; see [`crate::gpu::groupby`]).
//! - Rows whose key is NULL are not taken from the GPU: the caller aggregates them on the CPU
//!   (the NULL group). If any non-NULL key is absent from the index (a stale index), the GPU
//!   result is dropped and the caller aggregates the whole input on the CPU, so every distinct
//!   key still forms exactly one group.
//! - A GPU failure is an `Err` (a [`GpuError`] as `DataFusionError::External`, or an error
//!   evaluating the input): the caller prints one notice and aggregates on the CPU.
//! - One GPU aggregation at a time per process (they share the context's stream).

use std::sync::{Arc, Mutex};
use std::time::Instant;

use ::datafusion::arrow::array::{
    Array, ArrayRef, Decimal128Array, Float64Array, Int64Array, RecordBatch, UInt64Array,
};
use ::datafusion::arrow::buffer::NullBuffer;
use ::datafusion::arrow::compute::{cast, concat, filter_record_batch, is_null};
use ::datafusion::arrow::datatypes::DataType;
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::physical_expr::aggregate::AggregateFunctionExpr;
use ::datafusion::physical_expr::expressions::Literal;
use ::datafusion::physical_expr::PhysicalExpr;
use ::datafusion::physical_plan::aggregates::AggregateExec;

use super::device::DeviceAggregation;
use super::slot_states::SlotStates;
use crate::datafusion::error::gpu_to_df;
use crate::datafusion::registry::IndexHandle;
use crate::gpu::groupby::{aggregate_cpu, value_kind, ColumnResult, GroupByOptions, GroupByResult, ValueKind, Values};
use crate::gpu::query::Combine;
use crate::gpu::{AggOp, GpuError, GpuGroupBy};
use rayon::prelude::*;

/// Serializes GPU aggregations (one stream per process).
static GPU_AGGREGATION: Mutex<()> = Mutex::new(());

/// What one state field of an aggregate holds, per group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Quantity {
    /// count(*).
    Rows,
    /// Non-NULL values of the aggregate's column.
    NonNull,
    /// `avg`'s count: the non-NULL values, but NULL for a group without one (DataFusion's avg
    /// state masks both of its fields, so a merge never counts such a group as seen).
    AvgCount,
    /// Sum of the column.
    Sum,
    /// Minimum of the column.
    Min,
    /// Maximum of the column.
    Max,
}

/// One aggregate: its value column (index into `columns`, none for count(*)) and its state fields.
#[derive(Debug)]
struct GpuAggregate {
    column: Option<usize>,
    states: Vec<(Quantity, DataType)>,
}

/// The aggregates of one `AggregateExec`, as they run on the GPU.
#[derive(Debug)]
pub struct GpuAggregation {
    /// The indexed key expression.
    key: Arc<dyn PhysicalExpr>,
    /// Distinct argument expressions and the GPU operations each needs.
    columns: Vec<(Arc<dyn PhysicalExpr>, Vec<AggOp>)>,
    aggs: Vec<GpuAggregate>,
    /// Run the placement's algorithm on the CPU instead (`Tuning::gpu_emulation`).
    emulate: bool,
}

/// Whether a column of `dt` is aggregated as integers (true) or floats (false) on the GPU.
fn integer_kind(dt: &DataType) -> Option<bool> {
    value_kind(dt).ok().map(|k| k == ValueKind::I64)
}

/// Whether a state field of type `dt` can hold `q` computed over a column of integer kind
/// `integer` exactly: counts in 64-bit integers; integer results in any integer or decimal type
/// (cast from i64; an unsigned 64-bit sum takes the wrapped bits) or as Float64 (avg's sum);
/// float results as floats.
fn state_type_fits(q: Quantity, dt: &DataType, integer: bool) -> bool {
    match q {
        Quantity::Rows | Quantity::NonNull | Quantity::AvgCount => matches!(dt, DataType::Int64 | DataType::UInt64),
        _ if integer => integer_kind(dt) == Some(true) || matches!(dt, DataType::UInt64 | DataType::Float64),
        _ => integer_kind(dt) == Some(false),
    }
}

impl GpuAggregation {
    /// The GPU form of `agg` grouped by its group expression `key_pos`, or why it has none
    /// ([`GpuError::Unsupported`]; an error of DataFusion's while looking at the aggregates is
    /// such a reason too: the aggregate then stays on the CPU, which reports it).
    pub fn try_new(agg: &AggregateExec, key_pos: usize, emulate: bool) -> std::result::Result<Self, GpuError> {
        let groups = agg.group_expr().expr();
        if groups.len() != 1 {
            return Err(unsupported("several group columns"));
        }
        let key = Arc::clone(&groups[key_pos].0);
        let schema = agg.input_schema();
        let mut columns: Vec<(Arc<dyn PhysicalExpr>, Vec<AggOp>)> = Vec::new();
        let mut aggs = Vec::new();
        for a in agg.aggr_expr() {
            aggs.push(Self::aggregate(a, &schema, &mut columns)?);
        }
        Ok(Self {
            key,
            columns,
            aggs,
            emulate,
        })
    }

    /// One aggregate's GPU form; adds its column (deduplicated by expression) to `columns`.
    fn aggregate(
        a: &AggregateFunctionExpr,
        schema: &::datafusion::arrow::datatypes::Schema,
        columns: &mut Vec<(Arc<dyn PhysicalExpr>, Vec<AggOp>)>,
    ) -> std::result::Result<GpuAggregate, GpuError> {
        let name = a.fun().name().to_ascii_lowercase();
        if a.is_distinct() {
            return Err(unsupported(format!("{name}(DISTINCT ...)")));
        }
        let [arg] = a
            .expressions()
            .try_into()
            .map_err(|_| unsupported(format!("{name} with several arguments")))?;
        let state_fields = a.state_fields().map_err(unsupported)?;
        let literal = arg.downcast_ref::<Literal>().map(|l| !l.value().is_null());
        let (quantities, op): (Vec<Quantity>, Option<AggOp>) = match (name.as_str(), literal) {
            ("count", Some(true)) => (vec![Quantity::Rows], None),
            ("count", None) => (vec![Quantity::NonNull], Some(AggOp::Count)),
            ("sum", None) => (vec![Quantity::Sum], Some(AggOp::Sum)),
            ("min", None) => (vec![Quantity::Min], Some(AggOp::Min)),
            ("max", None) => (vec![Quantity::Max], Some(AggOp::Max)),
            ("avg", None) => (vec![Quantity::AvgCount, Quantity::Sum], Some(AggOp::Avg)),
            _ => return Err(unsupported(format!("aggregate {}", a.name()))),
        };
        if quantities.len() != state_fields.len() {
            return Err(unsupported(format!(
                "{} has {} state fields",
                a.name(),
                state_fields.len()
            )));
        }
        let integer = match op {
            None => true,
            Some(_) => {
                let dt = arg.data_type(schema).map_err(unsupported)?;
                integer_kind(&dt).ok_or_else(|| unsupported(format!("{} over {dt}", a.name())))?
            }
        };
        let mut states = Vec::with_capacity(quantities.len());
        for (q, f) in quantities.into_iter().zip(&state_fields) {
            if !state_type_fits(q, f.data_type(), integer) {
                return Err(unsupported(format!("{} with a {} state", a.name(), f.data_type())));
            }
            states.push((q, f.data_type().clone()));
        }
        let column = op.map(|op| {
            let text = arg.to_string();
            let pos = match columns.iter().position(|(e, _)| e.to_string() == text) {
                Some(p) => p,
                None => {
                    columns.push((Arc::clone(&arg), Vec::new()));
                    columns.len() - 1
                }
            };
            if !columns[pos].1.contains(&op) {
                columns[pos].1.push(op);
            }
            pos
        });
        Ok(GpuAggregate { column, states })
    }

    /// The key column of `batch`.
    pub(super) fn key_column(&self, batch: &RecordBatch) -> Result<ArrayRef> {
        self.key.evaluate(batch)?.into_array(batch.num_rows())
    }

    /// The rows of `batches` whose key is NULL (the CPU aggregates them).
    fn rows_with_null_keys(&self, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for b in batches {
            let key = self.key_column(b)?;
            if key.logical_null_count() > 0 {
                out.push(filter_record_batch(b, &is_null(key.as_ref())?)?);
            }
        }
        Ok(out)
    }

    /// Looks up and aggregates `batches` on the GPU. `Ok(None)`: some non-NULL key is not in
    /// the index (aggregate on the CPU instead). `Err`: the GPU path failed (see the module
    /// docs); the caller aggregates on the CPU with `device::notice_cpu_fallback`.
    fn aggregate_on_gpu(&self, index: &IndexHandle, batches: &[RecordBatch]) -> Result<Option<SlotStates>> {
        let evaluate = |expr: &Arc<dyn PhysicalExpr>| -> Result<Vec<ArrayRef>> {
            batches
                .iter()
                .map(|b| expr.evaluate(b).and_then(|v| v.into_array(b.num_rows())))
                .collect()
        };
        let started = Instant::now();
        let keys = evaluate(&self.key)?;
        let rows: usize = keys.iter().map(|k| k.len()).sum();
        let null_keys: usize = keys.iter().map(|k| k.logical_null_count()).sum();
        if rows == null_keys {
            return Ok(Some(SlotStates {
                slots: Vec::new(),
                states: self.empty_states(),
                widths: self.widths(),
                rows: 0,
                timings: Default::default(),
            }));
        }
        let values = self
            .columns
            .iter()
            .map(|(e, _)| evaluate(e))
            .collect::<Result<Vec<_>>>()?;
        let n_slots = index.index().len();
        let prepared = Instant::now();
        let result = if self.emulate {
            emulate(index, &keys, &values, &self.columns)?
        } else {
            on_device(index, &keys, &values, &self.columns).map_err(gpu_to_df)?
        };
        let computed = Instant::now();
        let counts = result
            .rows
            .as_ref()
            .ok_or_else(|| gpu_to_df(GpuError::MissingResult("the GPU returned no row counts")))?;
        // Group G holds NULL keys and absent keys alike: more rows than NULL keys = absent keys.
        if counts[n_slots as usize] as usize > null_keys {
            return Ok(None);
        }
        let touched: Vec<usize> = (0..n_slots as usize)
            .into_par_iter()
            .filter(|&s| counts[s] > 0)
            .collect();
        let mut states = Vec::new();
        for a in &self.aggs {
            let column = a.column.map(|c| &result.columns[c]);
            for (q, dt) in &a.states {
                states.push(state_array(*q, dt, counts, column, &touched)?);
            }
        }
        Ok(Some(SlotStates {
            slots: touched,
            states,
            widths: self.widths(),
            rows: rows - null_keys,
            timings: [prepared - started, computed - prepared, computed.elapsed()],
        }))
    }

    /// Number of state arrays of each aggregate.
    fn widths(&self) -> Vec<usize> {
        self.aggs.iter().map(|a| a.states.len()).collect()
    }

    /// Zero-row state arrays of every aggregate.
    fn empty_states(&self) -> Vec<ArrayRef> {
        self.aggs
            .iter()
            .flat_map(|a| {
                a.states
                    .iter()
                    .map(|(_, dt)| ::datafusion::arrow::array::new_empty_array(dt))
            })
            .collect()
    }
}

/// Borrowed views of array parts.
fn views(parts: &[ArrayRef]) -> Vec<&dyn Array> {
    parts.iter().map(|a| a.as_ref()).collect()
}

/// Looks `keys` up and aggregates `values` (each given as the parts of the input's batches) on
/// the GPU, one aggregation at a time.
fn on_device(
    index: &IndexHandle,
    keys: &[ArrayRef],
    values: &[Vec<ArrayRef>],
    columns: &[(Arc<dyn PhysicalExpr>, Vec<AggOp>)],
) -> std::result::Result<GroupByResult, GpuError> {
    let _one_at_a_time = GPU_AGGREGATION.lock().unwrap_or_else(|e| e.into_inner());
    let gpu_index = index.gpu_index()?;
    let ctx = Arc::clone(gpu_index.context());
    let probe = gpu_index.upload_parts(&views(keys))?;
    let slots = gpu_index.lookup_device(&probe, Combine::Auto)?;
    let group_by = GpuGroupBy::with_context(Arc::clone(&ctx), index.index().len())?;
    let device_columns = values
        .iter()
        .map(|v| group_by.upload_column_parts(&views(v)))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let spec: Vec<_> = device_columns
        .iter()
        .zip(columns)
        .map(|(d, (_, ops))| (d, ops.as_slice()))
        .collect();
    let rows = probe.len();
    let plan = group_by.plan(&slots, rows, true, &spec, GroupByOptions::default())?;
    group_by.run(&slots, rows, true, &spec, &plan)?.download(&ctx)
}

/// The same computation on the CPU (`Tuning::gpu_emulation`): slots from the CPU lookup, then
/// [`aggregate_cpu`], the GPU kernels' reference. Everything after it is the GPU placement's.
/// Arrow and index errors are passed as `External`, so the notice prints them as they are.
fn emulate(
    index: &IndexHandle,
    keys: &[ArrayRef],
    values: &[Vec<ArrayRef>],
    columns: &[(Arc<dyn PhysicalExpr>, Vec<AggOp>)],
) -> Result<GroupByResult> {
    let external = |e: ::datafusion::arrow::error::ArrowError| DataFusionError::External(Box::new(e));
    let keys = concat(&views(keys)).map_err(external)?;
    let values = values
        .iter()
        .map(|v| concat(&views(v)))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(external)?;
    let mut slots = Vec::new();
    index
        .index()
        .lookup_slots(keys.as_ref(), &mut slots)
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let slots: Vec<u32> = slots.iter().map(|&s| u32::try_from(s).unwrap_or(u32::MAX)).collect();
    let spec: Vec<(&dyn Array, &[AggOp])> = values
        .iter()
        .zip(columns)
        .map(|(v, (_, ops))| (v.as_ref(), ops.as_slice()))
        .collect();
    aggregate_cpu(&slots, index.index().len(), true, &spec).map_err(gpu_to_df)
}

/// `f` of every touched slot, on all cores.
fn gather<T: Send>(touched: &[usize], f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    touched.par_iter().map(|&s| f(s)).collect()
}

/// The state array of quantity `q` (type `dt`) for the groups `touched`.
fn state_array(
    q: Quantity,
    dt: &DataType,
    counts: &[u64],
    column: Option<&ColumnResult>,
    touched: &[usize],
) -> Result<ArrayRef> {
    let missing = |what| gpu_to_df(GpuError::MissingResult(what));
    let external = |e: ::datafusion::arrow::error::ArrowError| DataFusionError::External(Box::new(e));
    let counted = |v: &[u64], nulls: Option<NullBuffer>| -> ArrayRef {
        if dt == &DataType::UInt64 {
            Arc::new(UInt64Array::new(gather(touched, |s| v[s]).into(), nulls))
        } else {
            Arc::new(Int64Array::new(gather(touched, |s| v[s] as i64).into(), nulls))
        }
    };
    let column = match (q, column) {
        (Quantity::Rows, _) => return Ok(counted(counts, None)),
        (_, None) => return Err(missing("a GPU aggregate lost its column")),
        (_, Some(c)) => c,
    };
    // Groups without a non-NULL value have a NULL state (but `count(x)`'s 0).
    let nulls = touched
        .iter()
        .any(|&s| column.non_null[s] == 0)
        .then(|| NullBuffer::from(gather(touched, |s| column.non_null[s] > 0)));
    match q {
        Quantity::NonNull => return Ok(counted(&column.non_null, None)),
        Quantity::AvgCount => return Ok(counted(&column.non_null, nulls)),
        _ => {}
    }
    let values = match q {
        Quantity::Sum => column.sum.as_ref(),
        Quantity::Min => column.min.as_ref(),
        _ => column.max.as_ref(),
    }
    .ok_or_else(|| missing("the GPU skipped an aggregate"))?;
    let array: ArrayRef = match (values, dt) {
        (Values::I64(v), DataType::Decimal128(_, _)) => {
            Arc::new(Decimal128Array::new(gather(touched, |s| v[s] as i128).into(), nulls).with_data_type(dt.clone()))
        }
        // Wrapped sums of unsigned columns: the same bits modulo 2^64.
        (Values::I64(v), DataType::UInt64) => {
            Arc::new(UInt64Array::new(gather(touched, |s| v[s] as u64).into(), nulls))
        }
        (Values::I64(v), DataType::Float64) => {
            Arc::new(Float64Array::new(gather(touched, |s| v[s] as f64).into(), nulls))
        }
        (Values::I64(v), _) => {
            let wide = Int64Array::new(gather(touched, |s| v[s]).into(), nulls);
            cast(&wide, dt).map_err(external)?
        }
        (Values::F64(v), _) => {
            let wide = Float64Array::new(gather(touched, |s| v[s]).into(), nulls);
            cast(&wide, dt).map_err(external)?
        }
    };
    Ok(array)
}

impl DeviceAggregation for GpuAggregation {
    fn device_name(&self) -> &'static str {
        "gpu"
    }

    fn run(&self, index: &IndexHandle, batches: &[RecordBatch]) -> Result<Option<SlotStates>> {
        self.aggregate_on_gpu(index, batches)
    }

    fn null_key_rows(&self, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
        self.rows_with_null_keys(batches)
    }
}

/// A reason the GPU placement does not apply (see [`GpuAggregation::try_new`]).
fn unsupported(why: impl ToString) -> GpuError {
    GpuError::Unsupported(why.to_string())
}
