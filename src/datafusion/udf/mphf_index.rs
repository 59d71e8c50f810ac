//! `mphf_index(col)`: the slot of each key of an MPHF-indexed column.
//!
//! # How the function finds its index
//!
//! The index travels with the *column*, in the field metadata: an
//! [`MphfTable`](crate::datafusion::MphfTable) puts `mphf.index = <id>`
//! ([`INDEX_METADATA_KEY`]) on each indexed field of its schema and of its scan's output schema.
//! DataFusion carries field metadata through column references, aliases, projections, subquery
//! and CTE aliases, views and joins (the `.slt` suite checks each position), and hands the
//! argument fields to [`ScalarUDFImpl::return_field_from_args`] at planning time and to
//! [`ScalarUDFImpl::invoke_with_args`] at run time. The id is resolved through the process-wide
//! live table ([`resolve_index`]).
//!
//! Why not a planner rule that binds the index? A rule must find the table behind every column
//! expression (through views, CTEs, subqueries and joins) — exactly what the planner already
//! does for metadata. The metadata route needs no rule, works for every plan the planner accepts,
//! and fails early: an argument without the metadata (a computed expression, a column of a table
//! without an index) is rejected *at planning time* with the `CREATE INDEX` statement to run.
//! Expressions that drop metadata (`CAST`, arithmetic, `COALESCE`) are not columns of the index
//! and are rejected the same way.
//!
//! # The two-argument form
//!
//! `mphf_index('index_name', expr)` names the index explicitly and probes it with any
//! expression castable to the key type: keys of another table (`mphf_index('li_ok',
//! o_orderkey)`), computed keys, literals. This form resolves the name through the session's
//! [`MphfRegistry`] (the function instance registered by [`with_mphf`](crate::datafusion::with_mphf)
//! holds it) and is how non-members reach the index from SQL.
//!
//! # Semantics
//!
//! Returns `UInt32` (`UInt64` for indexes over more than 2^32 keys): the key's slot in
//! `0..keys`, NULL for NULL keys and for keys not in the index. Membership is verified against
//! the index's keys, so a non-member never gets a slot. Lookups use the batched
//! [`ColumnIndex::lookup`](crate::core::column::ColumnIndex::lookup).

use std::sync::Arc;

use ::datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use ::datafusion::common::{exec_err, internal_err, plan_err, Result, ScalarValue};
use ::datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

use crate::datafusion::config::MphfConfig;
use crate::datafusion::error::to_df;
use crate::datafusion::plan::Tuning;
use crate::datafusion::registry::{
    index_id_of_field, resolve_index, IndexHandle, MphfRegistry, INDEX_METADATA_KEY, SLOT_METADATA_KEY,
};
use crate::device::Device;

/// SQL name of the function.
pub const MPHF_INDEX_NAME: &str = "mphf_index";

/// Default of `Tuning::lookup_gpu_min_rows`: smallest batch that `lookup_device = auto` sends to
/// the GPU. A GPU call has a fixed end-to-end cost per batch and then a cost per row comparable
/// to one CPU core's, and partitions run on all cores at once while GPU calls queue on one
/// stream, so only batches of millions of rows can pay off (measurements: benches/RESULTS.md,
/// "Where the planner's thresholds and device crossovers come from"; benches/RESULTS-gpu.md,
/// "mphf_index on the GPU").
pub const GPU_LOOKUP_MIN_ROWS: u64 = 1 << 22;

/// Slots of `array` in `handle`'s index, on the device the session's `mphf.lookup_device`
/// chooses (the GPU answers exactly as the CPU; a GPU failure falls back to the CPU with a
/// one-line notice).
fn lookup_on_device(
    handle: &IndexHandle,
    array: &dyn ::datafusion::arrow::array::Array,
    config: &::datafusion::common::config::ConfigOptions,
) -> Result<::datafusion::arrow::array::ArrayRef> {
    let device = config
        .extensions
        .get::<MphfConfig>()
        .map_or(Device::Auto, |c| c.lookup_device);
    let min_rows = Tuning::of(config).lookup_gpu_min_rows;
    let on_gpu = crate::placement::wants_gpu(device, || array.len() as u64 >= min_rows);
    #[cfg(feature = "cuda")]
    if on_gpu {
        match handle.gpu_index().and_then(|g| g.lookup(array)) {
            Ok(slots) => return Ok(slots),
            Err(why) => notice_cpu_lookup(&why),
        }
    }
    #[cfg(not(feature = "cuda"))]
    if on_gpu {
        notice_cpu_lookup(&crate::gpu::GpuError::NotBuilt);
    }
    handle.index().lookup(array).map_err(to_df)
}

/// Prints the CPU-fallback notice of `mphf_index` (once per process).
fn notice_cpu_lookup(why: &crate::gpu::GpuError) {
    static PRINTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !PRINTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("mphf: GPU lookup unavailable ({why}); looking up on the CPU");
    }
}

/// The `mphf_index(col)` / `mphf_index('name', expr)` scalar function.
///
/// The one-argument form is stateless (the index comes with the argument field); the
/// two-argument form resolves names in the session registry this instance holds.
#[derive(Debug)]
pub struct MphfIndexFunc {
    signature: Signature,
    registry: Option<Arc<MphfRegistry>>,
}

impl PartialEq for MphfIndexFunc {
    fn eq(&self, other: &Self) -> bool {
        let same = match (&self.registry, &other.registry) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        };
        same && self.signature == other.signature
    }
}

impl Eq for MphfIndexFunc {}

impl std::hash::Hash for MphfIndexFunc {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.signature.hash(state);
        self.registry.as_ref().map(|r| Arc::as_ptr(r) as usize).hash(state);
    }
}

impl Default for MphfIndexFunc {
    fn default() -> Self {
        Self::new()
    }
}

impl MphfIndexFunc {
    /// The function.
    pub fn new() -> Self {
        let signature = Signature::one_of(
            vec![TypeSignature::Any(1), TypeSignature::Any(2)],
            Volatility::Immutable,
        );
        Self {
            signature,
            registry: None,
        }
    }
    /// The function with a session registry (enables the two-argument form).
    pub fn with_registry(registry: Arc<MphfRegistry>) -> Self {
        Self {
            registry: Some(registry),
            ..Self::new()
        }
    }
    /// The function as a [`ScalarUDF`], ready to register.
    pub fn udf(registry: Option<Arc<MphfRegistry>>) -> ScalarUDF {
        match registry {
            Some(r) => ScalarUDF::new_from_impl(Self::with_registry(r)),
            None => ScalarUDF::new_from_impl(Self::new()),
        }
    }

    /// The index named by the first argument of the two-argument form.
    fn named_index(&self, name: Option<&ScalarValue>) -> Result<Arc<IndexHandle>> {
        let name = match name {
            Some(ScalarValue::Utf8(Some(n)) | ScalarValue::LargeUtf8(Some(n)) | ScalarValue::Utf8View(Some(n))) => n,
            _ => {
                return plan_err!("mphf_index(name, expr): the first argument must be a string literal naming an index")
            }
        };
        let Some(registry) = &self.registry else {
            return plan_err!(
                "mphf_index('{name}', expr): this session has no MPHF registry (build it with with_mphf)"
            );
        };
        match registry.get(&name.to_lowercase()).or_else(|| registry.get(name)) {
            Some(h) => Ok(h),
            None => plan_err!("mphf_index('{name}', expr): no MPHF index named '{name}' (see SHOW MPHF INDEXES)"),
        }
    }
}

/// The live index behind an argument field, or the planning error that explains how to get one.
fn index_of_arg(field: &Field) -> Result<Arc<IndexHandle>> {
    let col = field.name();
    match index_id_of_field(field) {
        None => plan_err!(
            "mphf_index({col}): column '{col}' has no MPHF index (its field carries no '{INDEX_METADATA_KEY}' \
             metadata); create one with: CREATE INDEX {col}_mphf ON <table> USING mphf ({col})"
        ),
        Some(id) => match resolve_index(id) {
            Some(h) => Ok(h),
            None => plan_err!(
                "mphf_index({col}): the MPHF index (id {id}) of column '{col}' was dropped; plan the query again \
                 or run: CREATE INDEX {col}_mphf ON <table> USING mphf ({col})"
            ),
        },
    }
}

impl ScalarUDFImpl for MphfIndexFunc {
    fn name(&self) -> &str {
        MPHF_INDEX_NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        internal_err!("mphf_index: return_field_from_args must be used")
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let handle = match args.arg_fields {
            [field] => index_of_arg(field)?,
            [_, probe] => {
                let h = self.named_index(args.scalar_arguments[0])?;
                let key = h.index().key_type().to_arrow();
                if !::datafusion::arrow::compute::can_cast_types(probe.data_type(), &key) {
                    return plan_err!(
                        "mphf_index('{}', {}): cannot cast {} to the index's key type {key}",
                        h.info().name,
                        probe.name(),
                        probe.data_type()
                    );
                }
                h
            }
            _ => return plan_err!("mphf_index takes (column) or ('index_name', expr)"),
        };
        let slot_of = std::collections::HashMap::from([(SLOT_METADATA_KEY.to_string(), handle.label())]);
        Ok(Arc::new(
            Field::new(MPHF_INDEX_NAME, handle.index().slot_type(), true).with_metadata(slot_of),
        ))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (handle, field, arg) = match (args.arg_fields.as_slice(), args.args) {
            ([field], mut a) if a.len() == 1 => (index_of_arg(field)?, field, a.remove(0)),
            ([_, field], mut a) if a.len() == 2 => {
                let probe = a.remove(1);
                let name = match &a[0] {
                    ColumnarValue::Scalar(s) => Some(s.clone()),
                    ColumnarValue::Array(_) => None,
                };
                (self.named_index(name.as_ref())?, field, probe)
            }
            _ => return exec_err!("mphf_index takes (column) or ('index_name', expr)"),
        };
        let index = handle.index();
        let out = match arg {
            ColumnarValue::Array(array) => {
                ColumnarValue::Array(lookup_on_device(&handle, array.as_ref(), &args.config_options)?)
            }
            ColumnarValue::Scalar(scalar) => {
                let array = scalar.to_array_of_size(1)?;
                let slots = index.lookup(array.as_ref()).map_err(to_df)?;
                ColumnarValue::Scalar(ScalarValue::try_from_array(slots.as_ref(), 0)?)
            }
        };
        if out.data_type() != *args.return_field.data_type() {
            return exec_err!(
                "mphf_index({}): slot type {} does not match the planned {}",
                field.name(),
                out.data_type(),
                args.return_field.data_type()
            );
        }
        Ok(out)
    }
}
