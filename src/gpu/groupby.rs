//! [`GpuGroupBy`]: GROUP BY on MPHF slots on the GPU (`kernels/groupby.cu`), and
//! [`aggregate_cpu`], the same aggregation on all CPU cores (fallback, oracle, baseline).
//!
//! Why: with an MPHF the group of a row is its slot, a dense index in `0..G`, so the hash table of
//! a GROUP BY becomes plain arrays of the right size (DogQC had to size its global table right to
//! make its GROUP BY fast, see benches/RESULTS.md, "Where the planner's thresholds and device
//! crossovers come from"; here the size is exact by construction and there is no probing).
//!
//! - **Input**: slots on the device (from [`super::GpuIndex::lookup_device`]; `u32`, slots ≥ G
//!   such as [`super::query::ABSENT32`] form one extra group G, SQL's NULL group), and value
//!   columns (Int8–Int64, UInt8–UInt32 and Decimal128 widened to i64; Float32/Float64 as f64)
//!   with NULLs. Decimal columns are accepted when the absolute values of their non-NULL rows
//!   sum to less than 2^63, so every 64-bit sum is exact. Columns are widened on all cores
//!   straight into pinned staging memory (see `staging`), also from several parts (batches).
//! - **Output** ([`GroupByResult`]): per group (G + 1 entries), count(*), and per column the
//!   non-NULL count, wrapping i64 or f64 sum, min and max; avg = sum / count. Groups with no
//!   non-NULL value report sum = min = max = 0 (the caller turns them into NULL by the count).
//! - **Mapping** (chosen per call, see [`GroupByPlan`]): shared-memory privatization when the
//!   G + 1 accumulators fit a block's shared memory and the rows outnumber the flush work;
//!   global atomics otherwise. Warp combining (`__match_any_sync`) when a device sample of
//!   32-row windows shows at most [`MATCH_MAX_DISTINCT`] distinct slots per row (hot keys, Zipf;
//!   sorted columns), so a heavy key costs one atomic per warp, not 32 serialized ones. Under
//!   global atomics, up to [`HOT_MAX`] slots with at least [`HOT_MIN_SHARE`] of the sampled rows
//!   are aggregated in a per-block shared table and flushed once per block, so a hot key does not
//!   serialize the L2 atomics of the whole grid on one address.
//!
//! Exactness: counts, integer sums (modulo 2^64 on both sides), and min/max (f64 in
//! `f64::total_cmp` order) are identical to the CPU. f64 sums are not associative and the GPU adds
//! in an order fixed by atomics (and different between runs), so they agree with the CPU's to
//! rounding: for n non-negative addends the relative difference is at most about n·2^-53 in the
//! worst case and about √n·2^-53 typically (≈ 10^-13 for 10^6 rows per group); values that are
//! multiples of a power of two with exact partial sums (cents scaled by 2^k, small integers)
//! agree exactly.
//!
//! References: DogQC (`../shared/seeds/003_*`, shared-memory pre-aggregation in front of a global
//! table), the 2012 thesis on skew (`002_*`, hot keys serializing a warp); issue 7.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt8Type,
};
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, LaunchConfig, PushKernelArg};
use rayon::prelude::*;

use super::staging::split_by_lens;
use super::{kernels, GpuContext, GpuError};

/// Largest distinct slots per row in the 32-row sample windows for which `Auto` combines lanes
/// with equal slots (measured on the H200, benches/RESULTS-gpu.md).
pub const MATCH_MAX_DISTINCT: f64 = 0.8;
/// Sample windows (32 rows each) of the combining and hot-key decisions.
pub const SAMPLE_WINDOWS: u64 = 2048;
/// Most hot slots per aggregation (`HOT_MAX` in groupby.cu).
pub const HOT_MAX: usize = 16;
/// A slot is hot when it takes at least this share of the sampled rows (global mode only).
pub const HOT_MIN_SHARE: f64 = 1.0 / 512.0;
/// Blocks per SM of a global launch with hot slots (grid-stride, so each block's hot table is
/// flushed once for many rows).
const HOT_BLOCKS_PER_SM: u32 = 8;
/// Threads per block of the shared-memory kernels.
const SHARED_THREADS: u32 = 1024;
/// Threads per block of the global-atomics kernels.
const GLOBAL_THREADS: u32 = 256;
/// Shared privatization needs at least this many rows per accumulator entry flushed (each block
/// flushes all G + 1 entries once, with coalesced atomics that cost less than a row's).
const SHARED_MIN_ROWS_PER_FLUSH: u64 = 2;

const OP_ROWS: u32 = 1;
const OP_NN: u32 = 2;
const OP_SUM: u32 = 4;
const OP_MIN: u32 = 8;
const OP_MAX: u32 = 16;

/// An aggregate over one value column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AggOp {
    /// count(col): non-NULL values (always computed).
    Count,
    /// sum(col).
    Sum,
    /// min(col).
    Min,
    /// max(col).
    Max,
    /// avg(col) = sum / count.
    Avg,
}

/// The accumulator type of a value column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// Integers widened to i64 (sums wrap modulo 2^64).
    I64,
    /// Floats as f64.
    F64,
}

/// Per-group values of one aggregate.
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Integer column results.
    I64(Vec<i64>),
    /// Float column results.
    F64(Vec<f64>),
}

/// Results for one value column (G + 1 entries each; the last is the NULL group).
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnResult {
    /// Non-NULL values per group (count(col)).
    pub non_null: Vec<u64>,
    /// sum(col), when asked for (sum or avg).
    pub sum: Option<Values>,
    /// min(col), when asked for.
    pub min: Option<Values>,
    /// max(col), when asked for.
    pub max: Option<Values>,
}

impl ColumnResult {
    /// avg(col) per group (`None` where the group has no non-NULL value), when the sum was
    /// computed.
    pub fn avg(&self) -> Option<Vec<Option<f64>>> {
        let sum = self.sum.as_ref()?;
        Some(
            (0..self.non_null.len())
                .map(|g| {
                    let c = self.non_null[g];
                    (c > 0).then(|| match sum {
                        Values::I64(v) => v[g] as f64 / c as f64,
                        Values::F64(v) => v[g] / c as f64,
                    })
                })
                .collect(),
        )
    }
}

/// The answer of a GROUP BY on slots: G + 1 groups, the last one for slots ≥ G (NULL keys).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupByResult {
    /// G, the number of slots.
    pub groups: u64,
    /// count(*) per group, when asked for.
    pub rows: Option<Vec<u64>>,
    /// Per value column, in call order.
    pub columns: Vec<ColumnResult>,
}

/// How the GPU aggregation is mapped (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Decide from the sizes and the sample.
    #[default]
    Auto,
    /// Force it on.
    On,
    /// Force it off.
    Off,
}

/// Options of [`GpuGroupBy::plan`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupByOptions {
    /// Shared-memory privatization.
    pub shared: Mode,
    /// Warp combining of equal slots.
    pub matched: Mode,
    /// Per-block tables for hot slots (global mode; `On` behaves as `Auto`).
    pub hot: Mode,
}

/// The chosen mapping of one aggregation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupByPlan {
    /// Shared-memory privatization.
    pub shared: bool,
    /// Warp combining.
    pub matched: bool,
    /// Sampled distinct slots per row (1.0 when not sampled).
    pub distinct_per_row: f64,
    /// Hot slots (the first `n_hot` entries).
    pub hot: [u32; HOT_MAX],
    /// Number of hot slots (0 in shared mode).
    pub n_hot: usize,
}

/// A value column on the device.
pub struct DeviceColumn {
    /// Values as i64 or f64 bit patterns.
    values: CudaSlice<u64>,
    /// Validity bitmap bytes and the bit offset of row 0.
    valid: Option<(CudaSlice<u8>, u64)>,
    /// Accumulator type.
    kind: ValueKind,
    /// Rows.
    rows: usize,
}

impl DeviceColumn {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows
    }
    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
    /// The accumulator type.
    pub fn kind(&self) -> ValueKind {
        self.kind
    }
}

/// Per-column device accumulators.
struct DeviceColAgg {
    kind: ValueKind,
    nn: CudaSlice<u64>,
    sum: Option<CudaSlice<u64>>,
    min: Option<CudaSlice<u64>>,
    max: Option<CudaSlice<u64>>,
}

/// Aggregates still on the device; [`DeviceAggregates::download`] copies them back.
pub struct DeviceAggregates {
    groups: u64,
    rows: Option<CudaSlice<u64>>,
    cols: Vec<DeviceColAgg>,
}

/// The GROUP BY kernels.
struct GroupByKernels {
    _module: Arc<CudaModule>,
    /// Indexed by [value kind (none, i64, f64)][shared][matched].
    agg: [[[CudaFunction; 2]; 2]; 3],
    sample: CudaFunction,
    fill: CudaFunction,
}

/// GROUP BY on slots into G groups on the GPU (see the module docs).
pub struct GpuGroupBy {
    ctx: Arc<GpuContext>,
    k: GroupByKernels,
    groups: u32,
    sms: u32,
    max_shared: u32,
}

/// Runs `f`, turning a panic (cudarc panics when a CUDA library misses a symbol) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| Err(GpuError::panicked(what)))
}

/// The accumulator type of a column of type `dt`.
///
/// # Errors
/// [`GpuError::UnsupportedValueType`] for types the GPU GROUP BY does not aggregate.
pub fn value_kind(dt: &DataType) -> Result<ValueKind, GpuError> {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::Decimal128(_, _) => Ok(ValueKind::I64),
        DataType::Float32 | DataType::Float64 => Ok(ValueKind::F64),
        other => Err(GpuError::UnsupportedValueType(other.clone())),
    }
}

/// Sum of the absolute unscaled values of the non-NULL rows of a decimal column (0 for other
/// types), on one core. Below 2^63 for all of a column's parts, its values fit in i64 and no
/// partial sum of any group can wrap (the kernels add in i64), so decimal results are exact.
fn decimal_abs_sum(values: &dyn Array) -> u128 {
    let Some(d) = values.as_primitive_opt::<Decimal128Type>() else {
        return 0;
    };
    let nulls = d.logical_nulls();
    d.values()
        .iter()
        .enumerate()
        .filter(|&(i, _)| nulls.as_ref().is_none_or(|n| n.is_valid(i)))
        .map(|(_, v)| v.unsigned_abs())
        .fold(0, u128::saturating_add)
}

/// Rows per piece of the parallel widening (one piece per core task).
const WIDEN_PIECE_ROWS: usize = 1 << 16;

/// `parts` cut into pieces of at most [`WIDEN_PIECE_ROWS`] rows, in order (zero-copy slices).
fn pieces_of(parts: &[&dyn Array]) -> Vec<ArrayRef> {
    let mut out = Vec::new();
    for p in parts {
        let data = p.to_data();
        let mut at = 0;
        while at < p.len() {
            let len = WIDEN_PIECE_ROWS.min(p.len() - at);
            out.push(arrow::array::make_array(data.slice(at, len)));
            at += len;
        }
    }
    out
}

/// Fails when the decimal parts' values could make a 64-bit sum inexact (see [`decimal_abs_sum`]).
fn check_exact(pieces: &[ArrayRef]) -> Result<(), GpuError> {
    let total = pieces
        .par_iter()
        .map(|p| decimal_abs_sum(p.as_ref()))
        .reduce(|| 0, u128::saturating_add);
    if total >= 1 << 63 {
        return Err(GpuError::DecimalOverflow);
    }
    Ok(())
}

/// Writes the column's values into `out` (one u64 per row) as the kernels read them: integers
/// and decimals (already checked by [`check_exact`]) as i64, floats as f64 bits. NULL slots are
/// widened too; the validity masks them. One core: callers parallelize over pieces.
fn widen_into(values: &dyn Array, out: &mut [u64]) -> Result<(), GpuError> {
    macro_rules! map {
        ($t:ty, $f:expr) => {
            for (o, v) in out.iter_mut().zip(values.as_primitive::<$t>().values().iter()) {
                *o = $f(*v);
            }
        };
    }
    if out.len() != values.len() {
        return Err(GpuError::LengthMismatch(format!(
            "{} rows for {} slots",
            values.len(),
            out.len()
        )));
    }
    match values.data_type() {
        DataType::Int8 => map!(Int8Type, |v: i8| v as i64 as u64),
        DataType::Int16 => map!(Int16Type, |v: i16| v as i64 as u64),
        DataType::Int32 => map!(Int32Type, |v: i32| v as i64 as u64),
        DataType::Int64 => map!(Int64Type, |v: i64| v as u64),
        DataType::UInt8 => map!(UInt8Type, |v: u8| v as u64),
        DataType::UInt16 => map!(UInt16Type, |v: u16| v as u64),
        DataType::UInt32 => map!(UInt32Type, |v: u32| v as u64),
        DataType::Decimal128(_, _) => map!(Decimal128Type, |v: i128| v as i64 as u64),
        DataType::Float32 => map!(Float32Type, |v: f32| (v as f64).to_bits()),
        DataType::Float64 => map!(Float64Type, |v: f64| v.to_bits()),
        other => return Err(GpuError::UnsupportedValueType(other.clone())),
    }
    Ok(())
}

/// Widens `pieces` into `out` (their rows in order) on all cores.
fn widen_pieces(pieces: &[ArrayRef], out: &mut [u64]) -> Result<(), GpuError> {
    let (outs, _) = split_by_lens(out, pieces.iter().map(|p| p.len()));
    pieces
        .par_iter()
        .zip(outs)
        .try_for_each(|(p, piece)| widen_into(p.as_ref(), piece))
}

/// The column's values as the kernels read them, and its accumulator type.
fn widen(values: &dyn Array) -> Result<(Vec<u64>, ValueKind), GpuError> {
    let kind = value_kind(values.data_type())?;
    let pieces = pieces_of(&[values]);
    check_exact(&pieces)?;
    let mut out = vec![0u64; values.len()];
    widen_pieces(&pieces, &mut out)?;
    Ok((out, kind))
}

/// The ops bitmask of a column's aggregates (the non-NULL count is always on).
fn ops_of(aggs: &[AggOp]) -> u32 {
    aggs.iter().fold(OP_NN, |m, a| {
        m | match a {
            AggOp::Count => 0,
            AggOp::Sum | AggOp::Avg => OP_SUM,
            AggOp::Min => OP_MIN,
            AggOp::Max => OP_MAX,
        }
    })
}

/// Identity accumulators (kernels/groupby.cu min_ident / max_ident).
fn min_ident(kind: ValueKind) -> u64 {
    match kind {
        ValueKind::I64 => i64::MAX as u64,
        ValueKind::F64 => u64::MAX,
    }
}
fn max_ident(kind: ValueKind) -> u64 {
    match kind {
        ValueKind::I64 => i64::MIN as u64,
        ValueKind::F64 => 0,
    }
}

/// Inverse of the kernel's order-preserving f64 key.
fn f64_from_key(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// Decodes a device sum/min/max array; groups without values get 0.
fn decode(kind: ValueKind, raw: Vec<u64>, nn: &[u64], ordered: bool) -> Values {
    match kind {
        ValueKind::I64 => Values::I64(
            raw.iter()
                .zip(nn)
                .map(|(&v, &c)| if c > 0 { v as i64 } else { 0 })
                .collect(),
        ),
        ValueKind::F64 => Values::F64(
            raw.iter()
                .zip(nn)
                .map(|(&v, &c)| match (c > 0, ordered) {
                    (false, _) => 0.0,
                    (true, true) => f64_from_key(v),
                    (true, false) => f64::from_bits(v),
                })
                .collect(),
        ),
    }
}

impl GpuGroupBy {
    /// A GROUP BY into `groups` slots (plus the NULL group) on the shared GPU context.
    ///
    /// # Errors
    /// No usable GPU; `groups ≥ u32::MAX − 1`; NVRTC or module load failure.
    pub fn new(groups: u64) -> Result<GpuGroupBy, GpuError> {
        Self::with_context(GpuContext::get()?, groups)
    }

    /// As [`GpuGroupBy::new`] on `ctx`.
    ///
    /// # Errors
    /// As [`GpuGroupBy::new`].
    pub fn with_context(ctx: Arc<GpuContext>, groups: u64) -> Result<GpuGroupBy, GpuError> {
        guarded("setting up the GPU GROUP BY", || {
            let groups = u32::try_from(groups)
                .ok()
                .filter(|&g| g < u32::MAX - 1)
                .ok_or_else(|| GpuError::Unsupported(format!("{groups} groups do not fit 32-bit slots")))?;
            let module = ctx.module_cached("groupby", kernels::compile_groupby)?;
            let f = |name: &str| module.load_function(name).map_err(GpuError::missing_kernel(name));
            let mut agg: Vec<[[CudaFunction; 2]; 2]> = Vec::new();
            for vt in ["none", "i64", "f64"] {
                let g = |s: &str, m: &str| f(&format!("groupby_{vt}_{s}_{m}"));
                agg.push([
                    [g("global", "plain")?, g("global", "match")?],
                    [g("shared", "plain")?, g("shared", "match")?],
                ]);
            }
            let k = GroupByKernels {
                agg: agg
                    .try_into()
                    .map_err(|_| GpuError::Internal("three value kinds".into()))?,
                sample: f("groupby_sample")?,
                fill: f("fill_u64")?,
                _module: module.clone(),
            };
            let sms = ctx.sm_count()?;
            let max_shared = ctx.max_shared_optin()?;
            Ok(GpuGroupBy {
                ctx,
                k,
                groups,
                sms,
                max_shared,
            })
        })
    }

    /// Number of slots G.
    pub fn groups(&self) -> u64 {
        self.groups as u64
    }

    /// Uploads a value column (see the module docs for the supported types).
    ///
    /// # Errors
    /// Unsupported types; device allocation or copy failure.
    pub fn upload_column(&self, values: &dyn Array) -> Result<DeviceColumn, GpuError> {
        self.upload_column_parts(&[values])
    }

    /// Uploads the concatenation of `parts` (e.g. the batches of a partition) as one column,
    /// widened on all cores straight into pinned staging memory and sent in one copy.
    ///
    /// # Errors
    /// Unsupported or differing types; device allocation or copy failure.
    pub fn upload_column_parts(&self, parts: &[&dyn Array]) -> Result<DeviceColumn, GpuError> {
        guarded("uploading a value column", || {
            let dt = parts.first().map_or(&DataType::Int64, |p| p.data_type());
            if parts.iter().any(|p| p.data_type() != dt) {
                return Err(GpuError::Unsupported("value column parts of different types".into()));
            }
            let kind = value_kind(dt)?;
            let pieces = pieces_of(parts);
            check_exact(&pieces)?;
            let rows: usize = parts.iter().map(|p| p.len()).sum();
            let values = self.ctx.upload_staged(rows, |out| widen_pieces(&pieces, out))?;
            let valid = self.ctx.upload_validity(parts)?;
            Ok(DeviceColumn {
                values,
                valid,
                kind,
                rows,
            })
        })
    }

    /// Shared-memory bytes of one block for the ops `ops` of a value column (or count(*) only).
    fn shared_bytes(&self, ops: u32, has_values: bool) -> u64 {
        let g1 = self.groups as u64 + 1;
        let wide = if has_values {
            [OP_SUM, OP_MIN, OP_MAX].iter().filter(|&&o| ops & o != 0).count() as u64
        } else {
            0
        };
        let narrow = (ops & OP_ROWS != 0) as u64 + (has_values && ops & OP_NN != 0) as u64;
        g1 * (8 * wide + 4 * narrow)
    }

    /// Blocks of a shared-memory launch: one per SM (1024 threads each), so that the flush
    /// (G + 1 entries per block) stays small next to the rows.
    fn shared_blocks(&self, _bytes: u64) -> u32 {
        self.sms
    }

    /// Chooses the mapping for `rows` slots and the largest per-column table (`ops` of the
    /// widest column). Runs the device sample (one small kernel and a 16-byte copy back) when
    /// `opts.matched` is `Auto`.
    ///
    /// # Errors
    /// Launch or copy failures of the sample.
    pub fn plan(
        &self,
        slots: &CudaSlice<u32>,
        rows: usize,
        count_star: bool,
        columns: &[(&DeviceColumn, &[AggOp])],
        opts: GroupByOptions,
    ) -> Result<GroupByPlan, GpuError> {
        guarded("planning the GPU GROUP BY", || {
            let rows = rows as u64;
            let widest = columns
                .iter()
                .enumerate()
                .map(|(i, (_, a))| {
                    let ops = ops_of(a) | if i == 0 && count_star { OP_ROWS } else { 0 };
                    self.shared_bytes(ops, true)
                })
                .chain(std::iter::once(self.shared_bytes(OP_ROWS, false)))
                .max()
                .unwrap_or(0);
            let fits = widest <= self.max_shared as u64;
            let flush = self.shared_blocks(widest) as u64 * (self.groups as u64 + 1);
            let shared = match opts.shared {
                Mode::On => fits,
                Mode::Off => false,
                Mode::Auto => fits && rows >= SHARED_MIN_ROWS_PER_FLUSH * flush,
            };
            let want_hot = !shared && opts.hot != Mode::Off;
            let sampled = if opts.matched == Mode::Auto || want_hot {
                Some(self.sample(slots, rows)?)
            } else {
                None
            };
            let distinct_per_row = sampled.as_ref().map_or(1.0, |s| s.0);
            let matched = match opts.matched {
                Mode::On => true,
                Mode::Off => false,
                Mode::Auto => distinct_per_row <= MATCH_MAX_DISTINCT,
            };
            let mut hot = [0u32; HOT_MAX];
            let mut n_hot = 0;
            if let (true, Some((_, samples))) = (want_hot, &sampled) {
                for (i, s) in hot_slots(samples, self.groups).into_iter().enumerate() {
                    hot[i] = s;
                    n_hot = i + 1;
                }
            }
            Ok(GroupByPlan {
                shared,
                matched,
                distinct_per_row,
                hot,
                n_hot,
            })
        })
    }

    /// Distinct slots per row over up to [`SAMPLE_WINDOWS`] windows of 32 consecutive rows, and
    /// the sampled slots (u32::MAX past the end).
    fn sample(&self, slots: &CudaSlice<u32>, rows: u64) -> Result<(f64, Vec<u32>), GpuError> {
        if rows == 0 {
            return Ok((1.0, Vec::new()));
        }
        let windows = rows.div_ceil(32).min(SAMPLE_WINDOWS);
        let step = (rows / windows).max(32);
        let stream = self.ctx.stream();
        let mut out = stream
            .alloc_zeros::<u64>(2)
            .map_err(GpuError::alloc::<u64>("allocating the sample", 2))?;
        let mut sampled = stream
            .alloc_zeros::<u32>(windows as usize * 32)
            .map_err(GpuError::alloc::<u32>("allocating the sample", windows as usize * 32))?;
        let w32 = windows as u32;
        let cfg = LaunchConfig {
            grid_dim: ((windows * 32).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.k.sample);
        l.arg(slots)
            .arg(&rows)
            .arg(&step)
            .arg(&w32)
            .arg(&mut out)
            .arg(&mut sampled);
        // SAFETY: groupby_sample(slots, rows, step, windows, out, sampled): reads
        // slots[w·step + lane] only below `rows` (≤ slots.len(), checked by the caller), writes
        // out[0..2] and sampled[0..32·windows] (its length).
        unsafe { l.launch(cfg) }.map_err(GpuError::driver("launching the sample"))?;
        let got = stream
            .clone_dtoh(&out)
            .map_err(GpuError::driver("reading the sample"))?;
        let samples = stream
            .clone_dtoh(&sampled)
            .map_err(GpuError::driver("reading the sample"))?;
        let d = if got[1] == 0 {
            1.0
        } else {
            got[0] as f64 / got[1] as f64
        };
        Ok((d, samples))
    }

    /// A device array of G + 1 words filled with `v`.
    fn filled(&self, v: u64) -> Result<CudaSlice<u64>, GpuError> {
        let n = self.groups as u64 + 1;
        let stream = self.ctx.stream();
        // SAFETY: fully written by fill_u64 below before any other use (same stream).
        let mut d = unsafe { stream.alloc::<u64>(n as usize) }
            .map_err(GpuError::alloc::<u64>("allocating accumulators", n as usize))?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(256).min(4096) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = stream.launch_builder(&self.k.fill);
        l.arg(&mut d).arg(&n).arg(&v);
        // SAFETY: fill_u64(p, n, v) writes p[0..n]; d has n elements.
        unsafe { l.launch(cfg) }.map_err(GpuError::driver("launching fill"))?;
        Ok(d)
    }

    /// Runs the aggregation (asynchronous on the context's stream): count(*) when `count_star`,
    /// and each column's aggregates. `slots` holds at least `rows` slots; every column has
    /// `rows` rows.
    ///
    /// # Errors
    /// Mismatched lengths; allocation or launch failures.
    pub fn run(
        &self,
        slots: &CudaSlice<u32>,
        rows: usize,
        count_star: bool,
        columns: &[(&DeviceColumn, &[AggOp])],
        plan: &GroupByPlan,
    ) -> Result<DeviceAggregates, GpuError> {
        guarded("the GPU GROUP BY", || {
            self.run_inner(slots, rows, count_star, columns, plan)
        })
    }

    fn run_inner(
        &self,
        slots: &CudaSlice<u32>,
        rows: usize,
        count_star: bool,
        columns: &[(&DeviceColumn, &[AggOp])],
        plan: &GroupByPlan,
    ) -> Result<DeviceAggregates, GpuError> {
        if slots.len() < rows {
            return Err(GpuError::LengthMismatch(format!(
                "{} slots for {rows} rows",
                slots.len()
            )));
        }
        if let Some((c, _)) = columns.iter().find(|(c, _)| c.rows != rows) {
            return Err(GpuError::LengthMismatch(format!(
                "a value column has {} rows, the slots {rows}",
                c.rows
            )));
        }
        let mut rows_arr = if count_star { Some(self.filled(0)?) } else { None };
        let mut cols = Vec::with_capacity(columns.len());
        for (c, aggs) in columns {
            let ops = ops_of(aggs);
            cols.push(DeviceColAgg {
                kind: c.kind,
                nn: self.filled(0)?,
                sum: if ops & OP_SUM != 0 { Some(self.filled(0)?) } else { None },
                min: if ops & OP_MIN != 0 {
                    Some(self.filled(min_ident(c.kind))?)
                } else {
                    None
                },
                max: if ops & OP_MAX != 0 {
                    Some(self.filled(max_ident(c.kind))?)
                } else {
                    None
                },
            });
        }
        if rows == 0 {
            return Ok(DeviceAggregates {
                groups: self.groups as u64,
                rows: rows_arr,
                cols,
            });
        }
        let hot = self
            .ctx
            .stream()
            .clone_htod(&plan.hot)
            .map_err(GpuError::alloc::<u32>("uploading the hot slots", HOT_MAX))?;
        if columns.is_empty() {
            if let Some(r) = rows_arr.as_mut() {
                self.launch(slots, rows as u64, None, OP_ROWS, Some(r), None, plan, &hot)?;
            }
        }
        for (i, ((c, aggs), acc)) in columns.iter().zip(cols.iter_mut()).enumerate() {
            let mut ops = ops_of(aggs);
            let r = if i == 0 { rows_arr.as_mut() } else { None };
            if r.is_some() {
                ops |= OP_ROWS;
            }
            self.launch(slots, rows as u64, Some(c), ops, r, Some(acc), plan, &hot)?;
        }
        Ok(DeviceAggregates {
            groups: self.groups as u64,
            rows: rows_arr,
            cols,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        slots: &CudaSlice<u32>,
        rows: u64,
        col: Option<&DeviceColumn>,
        ops: u32,
        rows_arr: Option<&mut CudaSlice<u64>>,
        acc: Option<&mut DeviceColAgg>,
        plan: &GroupByPlan,
        hot: &CudaSlice<u32>,
    ) -> Result<(), GpuError> {
        let stream = self.ctx.stream();
        let vt = match col.map(|c| c.kind) {
            None => 0,
            Some(ValueKind::I64) => 1,
            Some(ValueKind::F64) => 2,
        };
        let bytes = self.shared_bytes(ops, col.is_some());
        let shared = plan.shared && bytes <= self.max_shared as u64;
        let func = &self.k.agg[vt][shared as usize][plan.matched as usize];
        let cfg = if shared {
            if bytes > 48 * 1024 {
                func.set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                )
                .map_err(GpuError::driver("raising the shared memory limit"))?;
            }
            LaunchConfig {
                grid_dim: (self.shared_blocks(bytes), 1, 1),
                block_dim: (SHARED_THREADS, 1, 1),
                shared_mem_bytes: bytes as u32,
            }
        } else {
            let max_blocks = if plan.n_hot > 0 {
                self.sms as u64 * HOT_BLOCKS_PER_SM as u64
            } else {
                self.sms as u64 * 64
            };
            LaunchConfig {
                grid_dim: (rows.div_ceil(GLOBAL_THREADS as u64).min(max_blocks) as u32, 1, 1),
                block_dim: (GLOBAL_THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        };
        let null = 0u64;
        let zero_off = 0u64;
        let groups = self.groups;
        let mut l = stream.launch_builder(func);
        l.arg(slots).arg(&rows).arg(&groups);
        match col {
            Some(c) => {
                l.arg(&c.values);
                match &c.valid {
                    Some((v, off)) => l.arg(v).arg(off),
                    None => l.arg(&null).arg(&zero_off),
                };
            }
            None => {
                l.arg(&null).arg(&null).arg(&zero_off);
            }
        }
        l.arg(&ops);
        match rows_arr {
            Some(r) => l.arg(r),
            None => l.arg(&null),
        };
        match acc {
            Some(a) => {
                l.arg(&mut a.nn);
                for arr in [&mut a.sum, &mut a.min, &mut a.max] {
                    match arr {
                        Some(d) => l.arg(d),
                        None => l.arg(&null),
                    };
                }
            }
            None => {
                l.arg(&null).arg(&null).arg(&null).arg(&null);
            }
        }
        let n_hot = if shared { 0u32 } else { plan.n_hot as u32 };
        l.arg(hot).arg(&n_hot);
        // SAFETY: the argument list matches GB_ARGS in kernels/groupby.cu: slots, rows, groups,
        // values, validity (or null) and its bit offset, ops, then the rows, non-NULL, sum, min
        // and max arrays (null where `ops` does not ask for them: the kernel touches an array only
        // under its op bit, and the rows array only with OP_ROWS, which is set exactly when
        // `rows_arr` is given), then the HOT_MAX hot slots and their count (≤ HOT_MAX, each
        // ≤ G, so every flush lands inside the G + 1 entries). `slots` and the values hold at least `rows` elements (checked in
        // run_inner), the validity bitmap covers the rows, every accumulator array has G + 1
        // elements (filled()), and the dynamic shared memory holds the block's G + 1 entries per
        // array as laid out in the kernel. The kernel writes only the accumulator arrays.
        unsafe { l.launch(cfg) }.map_err(GpuError::driver("launching the GROUP BY kernel"))?;
        Ok(())
    }

    /// Uploads the columns, plans, runs and downloads: the one-call form.
    ///
    /// # Errors
    /// As [`GpuGroupBy::upload_column`], [`GpuGroupBy::plan`], [`GpuGroupBy::run`] and
    /// [`DeviceAggregates::download`].
    pub fn aggregate(
        &self,
        slots: &CudaSlice<u32>,
        rows: usize,
        count_star: bool,
        columns: &[(&dyn Array, &[AggOp])],
        opts: GroupByOptions,
    ) -> Result<GroupByResult, GpuError> {
        let dev: Vec<DeviceColumn> = columns
            .iter()
            .map(|(a, _)| self.upload_column(*a))
            .collect::<Result<_, _>>()?;
        let cols: Vec<(&DeviceColumn, &[AggOp])> = dev.iter().zip(columns).map(|(d, (_, a))| (d, *a)).collect();
        let plan = self.plan(slots, rows, count_star, &cols, opts)?;
        self.run(slots, rows, count_star, &cols, &plan)?.download(&self.ctx)
    }
}

impl DeviceAggregates {
    /// Copies the aggregates back (synchronizes the stream).
    ///
    /// # Errors
    /// Copy failures.
    pub fn download(&self, ctx: &GpuContext) -> Result<GroupByResult, GpuError> {
        guarded("downloading GROUP BY results", || {
            let get = |d: &CudaSlice<u64>| ctx.download_staged(d, d.len());
            let rows = self.rows.as_ref().map(get).transpose()?;
            let mut columns = Vec::with_capacity(self.cols.len());
            for c in &self.cols {
                let nn = get(&c.nn)?;
                // `extreme`: min/max slots hold order-preserving encodings, sums plain values.
                let fetch = |d: &Option<CudaSlice<u64>>, extreme: bool| {
                    d.as_ref()
                        .map(get)
                        .transpose()
                        .map(|v| v.map(|v| decode(c.kind, v, &nn, extreme)))
                };
                let sum = fetch(&c.sum, false)?;
                let min = fetch(&c.min, true)?;
                let max = fetch(&c.max, true)?;
                columns.push(ColumnResult {
                    non_null: nn,
                    sum,
                    min,
                    max,
                });
            }
            Ok(GroupByResult {
                groups: self.groups,
                rows,
                columns,
            })
        })
    }
}

/// Slots (≤ `groups`, the NULL group included; u32::MAX marks sample entries past the end) with at least [`HOT_MIN_SHARE`] of the sampled
/// rows, most frequent first, at most [`HOT_MAX`].
fn hot_slots(samples: &[u32], groups: u32) -> Vec<u32> {
    let mut s: Vec<u32> = samples
        .iter()
        .filter(|&&x| x != u32::MAX)
        .map(|&x| x.min(groups))
        .collect();
    if s.is_empty() {
        return Vec::new();
    }
    let min_count = ((s.len() as f64 * HOT_MIN_SHARE).ceil() as usize).max(8);
    s.sort_unstable();
    let mut runs: Vec<(usize, u32)> = s
        .chunk_by(|a, b| a == b)
        .filter(|c| c.len() >= min_count)
        .map(|c| (c.len(), c[0]))
        .collect();
    runs.sort_unstable_by(|a, b| b.cmp(a));
    runs.into_iter().take(HOT_MAX).map(|(_, slot)| slot).collect()
}

/// One column's per-thread accumulators: non-NULL counts, sums, min and max keys (empty when
/// not asked for).
type ColumnPartial = (Vec<u64>, Vec<u64>, Vec<u64>, Vec<u64>);

/// Per-thread partial of [`aggregate_cpu`].
struct Partial {
    rows: Vec<u64>,
    cols: Vec<ColumnPartial>,
}

/// The same GROUP BY on all CPU cores (rayon): each thread aggregates a contiguous range of rows
/// into its own G + 1 arrays, then the partials are merged per group range in parallel. Float
/// sums add in row order within a thread, then thread order; min/max use `f64::total_cmp`.
/// Slots ≥ `groups` go to the NULL group `groups`.
///
/// # Errors
/// Unsupported value types; columns whose length differs from `slots`.
pub fn aggregate_cpu(
    slots: &[u32],
    groups: u64,
    count_star: bool,
    columns: &[(&dyn Array, &[AggOp])],
) -> Result<GroupByResult, GpuError> {
    let g1 = groups as usize + 1;
    let n = slots.len();
    let mut host = Vec::with_capacity(columns.len());
    for (a, aggs) in columns {
        if a.len() != n {
            return Err(GpuError::LengthMismatch(format!(
                "a value column has {} rows, the slots {n}",
                a.len()
            )));
        }
        let (vals, kind) = widen(*a)?;
        host.push((vals, kind, a.logical_nulls(), ops_of(aggs)));
    }
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads).max(1);
    let partials: Vec<Partial> = slots
        .par_chunks(chunk)
        .enumerate()
        .map(|(c, part)| {
            let base = c * chunk;
            let mut rows = if count_star { vec![0u64; g1] } else { Vec::new() };
            if count_star {
                for &s in part {
                    rows[(s as usize).min(g1 - 1)] += 1;
                }
            }
            let cols = host
                .iter()
                .map(|(vals, kind, nulls, ops)| {
                    let (kind, ops) = (*kind, *ops);
                    let mut nn = vec![0u64; g1];
                    let mut sum = vec![0u64; if ops & OP_SUM != 0 { g1 } else { 0 }];
                    let mut mn = vec![min_ident(kind); if ops & OP_MIN != 0 { g1 } else { 0 }];
                    let mut mx = vec![max_ident(kind); if ops & OP_MAX != 0 { g1 } else { 0 }];
                    for (j, &s) in part.iter().enumerate() {
                        let i = base + j;
                        if nulls.as_ref().is_some_and(|m| m.is_null(i)) {
                            continue;
                        }
                        let g = (s as usize).min(g1 - 1);
                        let v = vals[i];
                        nn[g] += 1;
                        accumulate_cpu(kind, ops, g, v, &mut sum, &mut mn, &mut mx);
                    }
                    (nn, sum, mn, mx)
                })
                .collect();
            Partial { rows, cols }
        })
        .collect();
    // Merge per range of groups in parallel, partials in thread order.
    const MERGE: usize = 1 << 14;
    let merge_u64 = |pick: &(dyn Fn(&Partial) -> &Vec<u64> + Sync), f: &(dyn Fn(u64, u64) -> u64 + Sync), init: u64| {
        let mut out = vec![init; g1];
        out.par_chunks_mut(MERGE).enumerate().for_each(|(c, o)| {
            for p in &partials {
                let src = pick(p);
                if src.is_empty() {
                    continue;
                }
                for (k, x) in o.iter_mut().enumerate() {
                    *x = f(*x, src[c * MERGE + k]);
                }
            }
        });
        out
    };
    let add = |a: u64, b: u64| a.wrapping_add(b);
    let rows = count_star.then(|| merge_u64(&|p: &Partial| &p.rows, &add, 0));
    let mut out_cols = Vec::with_capacity(host.len());
    for (ci, (_, kind, _, ops)) in host.iter().enumerate() {
        let kind = *kind;
        let nn = merge_u64(&|p: &Partial| &p.cols[ci].0, &add, 0);
        let fsum = |a: u64, b: u64| (f64::from_bits(a) + f64::from_bits(b)).to_bits();
        let sum = (ops & OP_SUM != 0).then(|| match kind {
            ValueKind::I64 => merge_u64(&|p: &Partial| &p.cols[ci].1, &add, 0),
            ValueKind::F64 => merge_u64(&|p: &Partial| &p.cols[ci].1, &fsum, 0),
        });
        let min = (ops & OP_MIN != 0).then(|| {
            merge_u64(
                &|p: &Partial| &p.cols[ci].2,
                &|a, b| ord_min(kind, a, b),
                min_ident(kind),
            )
        });
        let max = (ops & OP_MAX != 0).then(|| {
            merge_u64(
                &|p: &Partial| &p.cols[ci].3,
                &|a, b| ord_max(kind, a, b),
                max_ident(kind),
            )
        });
        out_cols.push(ColumnResult {
            sum: sum.map(|v| decode(kind, v, &nn, false)),
            min: min.map(|v| decode(kind, v, &nn, true)),
            max: max.map(|v| decode(kind, v, &nn, true)),
            non_null: nn,
        });
    }
    Ok(GroupByResult {
        groups,
        rows,
        columns: out_cols,
    })
}

/// The order-preserving key of an f64 (the kernel's f64_key): total_cmp order as u64 order.
fn f64_key(bits: u64) -> u64 {
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn ord_min(kind: ValueKind, a: u64, b: u64) -> u64 {
    match kind {
        ValueKind::I64 => (a as i64).min(b as i64) as u64,
        ValueKind::F64 => a.min(b),
    }
}
fn ord_max(kind: ValueKind, a: u64, b: u64) -> u64 {
    match kind {
        ValueKind::I64 => (a as i64).max(b as i64) as u64,
        ValueKind::F64 => a.max(b),
    }
}

#[inline]
fn accumulate_cpu(kind: ValueKind, ops: u32, g: usize, v: u64, sum: &mut [u64], mn: &mut [u64], mx: &mut [u64]) {
    if ops & OP_SUM != 0 {
        sum[g] = match kind {
            ValueKind::I64 => sum[g].wrapping_add(v),
            ValueKind::F64 => (f64::from_bits(sum[g]) + f64::from_bits(v)).to_bits(),
        };
    }
    let ord = match kind {
        ValueKind::I64 => v,
        ValueKind::F64 => f64_key(v),
    };
    if ops & OP_MIN != 0 {
        mn[g] = ord_min(kind, mn[g], ord);
    }
    if ops & OP_MAX != 0 {
        mx[g] = ord_max(kind, mx[g], ord);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int64Array};

    #[test]
    fn f64_key_orders_like_total_cmp() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -1.0,
            -0.0,
            0.0,
            1e-300,
            1.0,
            f64::INFINITY,
            f64::NAN,
        ];
        for a in xs {
            assert_eq!(f64_from_key(f64_key(a.to_bits())).to_bits(), a.to_bits());
            for b in xs {
                assert_eq!(
                    f64_key(a.to_bits()).cmp(&f64_key(b.to_bits())),
                    a.total_cmp(&b),
                    "{a} {b}"
                );
            }
        }
    }

    #[test]
    fn cpu_aggregation_small() {
        let slots = [0u32, 1, 0, 5, u32::MAX, 1, 1];
        let ints = Int64Array::from(vec![Some(3), None, Some(-4), Some(7), Some(9), Some(2), Some(i64::MAX)]);
        let floats = Float64Array::from(vec![
            Some(1.5),
            Some(2.0),
            None,
            Some(-0.5),
            None,
            Some(4.0),
            Some(-3.0),
        ]);
        let all = [AggOp::Sum, AggOp::Min, AggOp::Max, AggOp::Avg];
        let r = aggregate_cpu(&slots, 3, true, &[(&ints, &all[..]), (&floats, &all[..])]).unwrap();
        assert_eq!(r.rows, Some(vec![2, 3, 0, 2]));
        let c = &r.columns[0];
        assert_eq!(c.non_null, vec![2, 2, 0, 2]);
        assert_eq!(c.sum, Some(Values::I64(vec![-1, 2i64.wrapping_add(i64::MAX), 0, 16])));
        assert_eq!(c.min, Some(Values::I64(vec![-4, 2, 0, 7])));
        assert_eq!(c.max, Some(Values::I64(vec![3, i64::MAX, 0, 9])));
        let f = &r.columns[1];
        assert_eq!(f.non_null, vec![1, 3, 0, 1]);
        assert_eq!(f.sum, Some(Values::F64(vec![1.5, 3.0, 0.0, -0.5])));
        assert_eq!(f.min, Some(Values::F64(vec![1.5, -3.0, 0.0, -0.5])));
        assert_eq!(f.avg().unwrap(), vec![Some(1.5), Some(1.0), None, Some(-0.5)]);
    }
}
