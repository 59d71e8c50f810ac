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
//!
//! Layout: this module holds the types and the constants the kernels share; `values` turns
//! Arrow columns into the 64-bit words the kernels add (and the device's words back into
//! values), `device` plans, launches and downloads the GPU aggregation, `cpu` is
//! [`aggregate_cpu`].

mod cpu;
mod device;
mod values;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice};

use super::{GpuContext, GpuError};

pub use cpu::aggregate_cpu;
pub use values::value_kind;

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
