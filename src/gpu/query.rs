//! [`GpuIndex`]: a [`ColumnIndex`] resident on the GPU, and the batch lookup of spec §9 there
//! (`kernels/query.cu`), with the same answers as [`ColumnIndex::lookup_slots`].
//!
//! Why: a GROUP BY or join on the GPU needs the slots of its key column on the device; shipping
//! the keys once and looking them up there avoids a round trip, and thousands of independent
//! lookups in flight hide the three or four dependent memory reads of each (Elias–Fano, Rice,
//! stored key) that bound the CPU query.
//!
//! - **Upload once** ([`GpuIndex::new`]): the Rice words, the four Elias–Fano arrays, the memo
//!   tables of ℓ (packed as `τ | nodes << 5 | skip << 17`, which fits: τ ≤ 31, nodes ≤ 2998,
//!   skip ≤ 4278, spec §7.3) and the keys in slot order (integers widened to their `u64` hashing
//!   pattern; byte keys as u64 offsets plus bytes) stay in device memory while the `GpuIndex`
//!   lives. The query module is compiled once per (ℓ, rotation) and cached in the context.
//! - **Hashing**: integer keys are hashed on the device (the bijective mixer of spec §2.5, its
//!   seeds computed here with [`int_hash_seeds`]); byte keys are hashed on the host with the core's
//!   seeded xxh3-128 ([`hash_bytes`], all cores) and sent as `(hi, lo)` pairs with the bytes,
//!   which the kernel compares against the stored key.
//! - **Combining** ([`Combine`]): for clustered probes (a sorted fact-table column such as TPC-H
//!   `l_orderkey`, 1–7 rows per key) the runs kernel looks each run of equal keys up once per
//!   tile and scatters the slot (Eirene's rule restricted to adjacent duplicates, which needs no
//!   sort). `Combine::Auto` samples [`RUN_SAMPLES`] adjacent pairs on the host and combines when
//!   at least [`RUNS_MIN_RATE`] of them are equal.
//!
//! Invariant (tested in tests/test_gpu_query.rs against the CPU): for every row, the slot is `s`
//! iff the row is non-NULL and `keys()[s]` equals it; otherwise [`ABSENT`] (or [`ABSENT32`] in the
//! 32-bit device form).
//!
//! Failure policy: every error (no GPU, NVRTC, allocation, launch, unsupported probe type) is an
//! `Err(`[`GpuError`]`)`; callers fall back to [`ColumnIndex::lookup_slots`]. Panics inside
//! cudarc are caught.
//!
//! References: spec §2.5, §8.4, §9; Eirene (`../shared/seeds/001_*`) for request combining.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::buffer::Buffer;
use arrow::datatypes::DataType;
use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use rayon::prelude::*;

use super::staging::split_by_lens;
use super::{kernels, GpuContext, GpuError};
use crate::core::column::keys::{cast_probe_exact, probe_castable};
use crate::core::column::{ColumnIndex, KeyType, ABSENT};
use crate::core::hash::{hash_bytes, int_hash_seeds};
use crate::core::memo::Memo;

/// The "absent" slot of the 32-bit device form (NULL or non-member).
pub const ABSENT32: u32 = u32::MAX;
/// Adjacent pairs sampled by `Combine::Auto`.
pub const RUN_SAMPLES: usize = 4096;
/// Smallest fraction of equal adjacent keys for which `Combine::Auto` combines runs (measured on
/// the H200, benches/RESULTS-gpu.md: below it the compaction costs more than the saved lookups).
pub const RUNS_MIN_RATE: f64 = 0.3;
/// Threads per block of the one-row-per-thread kernels.
const THREADS: u32 = 256;
/// Rows per block of the runs kernel (`RUN_TILE` in query.cu).
const RUN_TILE: u64 = 1024;

/// A device slot width: u32 (the `_u32` kernels, [`ABSENT32`]) or u64 (the `_u64` kernels,
/// [`ABSENT`]).
pub trait SlotWidth: DeviceRepr {
    /// True for u64.
    const WIDE: bool;
}
impl SlotWidth for u32 {
    const WIDE: bool = false;
}
impl SlotWidth for u64 {
    const WIDE: bool = true;
}

/// Scalar fields of the index; layout matches `struct QueryParams` in kernels/query.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct QueryParams {
    num_buckets: u64,
    delta_lambda: u64,
    delta_psi: u64,
    beta: u64,
    len: u64,
    s_lo: u64,
    s_hi: u64,
    lower_words: u64,
    upper_lambda_words: u64,
    upper_psi_words: u64,
    rice_words: u64,
    l_lambda: u32,
    l_psi: u32,
    log2_jump: u32,
    key_kind: u32,
}

// SAFETY: plain old data: eleven u64 then four u32, repr(C), no padding (size checked below),
// valid for any bits.
unsafe impl DeviceRepr for QueryParams {}
const _: () = assert!(std::mem::size_of::<QueryParams>() == 11 * 8 + 4 * 4);

/// Whether a batch lookup combines runs of equal adjacent keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Combine {
    /// Combine when the sampled run rate is at least [`RUNS_MIN_RATE`] (integer keys only).
    #[default]
    Auto,
    /// One lookup per row.
    Off,
    /// Always combine runs (integer keys only; byte keys ignore it).
    Runs,
}

/// The functions of one query module.
struct QueryKernels {
    _module: Arc<CudaModule>,
    int_u32: CudaFunction,
    int_u64: CudaFunction,
    runs_u32: CudaFunction,
    runs_u64: CudaFunction,
    bytes_u32: CudaFunction,
    bytes_u64: CudaFunction,
}

/// Stored keys in slot order on the device.
enum DeviceKeys {
    /// Integer keys widened to their hashing pattern.
    Int(CudaSlice<u64>),
    /// Byte keys: `len + 1` offsets and the bytes.
    Bytes {
        offsets: CudaSlice<u64>,
        data: CudaSlice<u8>,
    },
}

/// The probe's values on the device.
enum ProbeData {
    /// Raw native values (packed, padded to whole words) and their kind (bytes per key, | 16
    /// when signed).
    Int { data: CudaSlice<u64>, kind: u32 },
    /// Host-computed hashes (hi, lo per row), `rows + 1` offsets and the bytes.
    Bytes {
        hashes: CudaSlice<u64>,
        offsets: CudaSlice<u64>,
        data: CudaSlice<u8>,
    },
}

/// A probe column uploaded to the device by [`GpuIndex::upload`].
pub struct DeviceProbe {
    rows: usize,
    data: ProbeData,
    /// Validity bitmap bytes and the bit offset of row 0 (none when the probe has no NULLs).
    valid: Option<(CudaSlice<u8>, u64)>,
    /// Fraction of sampled adjacent pairs with equal keys (0 for byte keys).
    pub run_rate: f64,
}

impl DeviceProbe {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows
    }
    /// True when the probe has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }
}

/// Rows of a file gathered before each GPU round trip when slot maps are made on the GPU.
const SLOT_SOURCE_ROWS: usize = 1 << 24;

/// Slot maps made on the GPU ([`SlotMaps::build_with`](crate::index::SlotMaps::build_with)):
/// each call sends millions of rows through [`GpuIndex::slot_map`].
impl crate::index::SlotSource for GpuIndex {
    fn append_slots(&self, keys: &[ArrayRef], out: &mut Vec<u32>) -> crate::error::Result<()> {
        let parts: Vec<&dyn Array> = keys.iter().map(|k| k.as_ref()).collect();
        let slots = self
            .slot_map(&parts)
            .map_err(|e| crate::error::MphfError::SlotMap(format!("the GPU lookups failed: {e}")))?;
        out.extend_from_slice(&slots);
        Ok(())
    }

    fn rows_per_call(&self) -> usize {
        SLOT_SOURCE_ROWS
    }
}

/// Rows per device round trip of [`GpuIndex::slot_map`] (2^26: 512 MiB of 8-byte keys and
/// 256 MiB of slots on the device).
pub const SLOT_MAP_CHUNK_ROWS: usize = 1 << 26;

/// `parts` cut into consecutive chunks of at most `chunk_rows` rows (zero-copy slices).
fn row_chunks(parts: &[&dyn Array], chunk_rows: usize) -> Vec<Vec<ArrayRef>> {
    let mut chunks = Vec::new();
    let mut current: Vec<ArrayRef> = Vec::new();
    let mut filled = 0usize;
    for part in parts {
        let mut off = 0usize;
        while off < part.len() {
            let take = (chunk_rows - filled).min(part.len() - off);
            current.push(part.slice(off, take));
            off += take;
            filled += take;
            if filled == chunk_rows {
                chunks.push(std::mem::take(&mut current));
                filled = 0;
            }
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// A column index resident on the GPU (see the module docs).
pub struct GpuIndex {
    /// The shared context (stream, module cache).
    ctx: Arc<GpuContext>,
    /// The query kernels of the index's (ℓ, rotation).
    k: QueryKernels,
    /// Scalars passed to every launch (`key_kind` is set per probe).
    params: QueryParams,
    /// Rice bit vector.
    rice: CudaSlice<u64>,
    /// Elias–Fano lower bits.
    lower: CudaSlice<u64>,
    /// Elias–Fano upper bits of φ.
    upper_lambda: CudaSlice<u64>,
    /// Elias–Fano upper bits of χ.
    upper_psi: CudaSlice<u64>,
    /// Elias–Fano jump table.
    jump: CudaSlice<u64>,
    /// Packed memo tables of ℓ.
    memo: CudaSlice<u32>,
    /// Keys in slot order.
    keys: DeviceKeys,
    /// Key type of the index.
    key_type: KeyType,
    /// Hash seed of the MPHF.
    seed: u64,
    /// Device bytes held.
    bytes: u64,
}

impl std::fmt::Debug for GpuIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuIndex")
            .field("key_type", &self.key_type)
            .field("len", &self.params.len)
            .field("device_bytes", &self.bytes)
            .finish()
    }
}

/// Runs `f`, turning a panic (cudarc panics when a CUDA library misses a symbol) into an error.
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| Err(GpuError::panicked(what)))
}

/// The kind code of an integer key type (bytes per key, | 16 when signed), `None` for byte keys.
fn int_kind(kt: &KeyType) -> Option<u32> {
    Some(match kt {
        KeyType::UInt8 => 1,
        KeyType::UInt16 => 2,
        KeyType::UInt32 => 4,
        KeyType::UInt64 => 8,
        KeyType::Int8 => 1 | 16,
        KeyType::Int16 => 2 | 16,
        KeyType::Int32 | KeyType::Date32 => 4 | 16,
        KeyType::Int64 | KeyType::Date64 | KeyType::Timestamp(..) => 8 | 16,
        _ => return None,
    })
}

/// The raw little-endian values of a primitive array (its offset applied), sharing its buffer.
fn raw_values(arr: &dyn Array, width: usize) -> Result<Buffer, GpuError> {
    let data = arr.to_data();
    let buf = data
        .buffers()
        .first()
        .ok_or(GpuError::MalformedArray("primitive array without a values buffer"))?;
    let start = data.offset() * width;
    let len = arr.len() * width;
    if start + len > buf.len() {
        return Err(GpuError::MalformedArray("values buffer shorter than the array"));
    }
    Ok(buf.slice_with_length(start, len))
}

/// Row `i` of raw values of kind `kind`, widened to its u64 hashing pattern.
fn key_at(raw: &[u8], kind: u32, i: usize) -> u64 {
    let w = (kind & 15) as usize;
    let b = &raw[i * w..(i + 1) * w];
    match kind {
        1 => b[0] as u64,
        2 => u16::from_le_bytes([b[0], b[1]]) as u64,
        4 => u32::from_le_bytes(b.try_into().expect("4 bytes")) as u64,
        17 => b[0] as i8 as i64 as u64,
        18 => i16::from_le_bytes([b[0], b[1]]) as i64 as u64,
        20 => i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64 as u64,
        _ => u64::from_le_bytes(b.try_into().expect("8 bytes")),
    }
}

/// Fraction of equal adjacent keys among up to [`RUN_SAMPLES`] evenly spaced pairs (NULLs not
/// excluded: a sample only).
fn sample_run_rate(raw: &[u8], kind: u32, rows: usize) -> f64 {
    if rows < 2 {
        return 0.0;
    }
    let pairs = (rows - 1).min(RUN_SAMPLES);
    let step = (rows - 1) / pairs;
    let equal = (0..pairs)
        .filter(|&j| {
            let i = 1 + j * step;
            key_at(raw, kind, i) == key_at(raw, kind, i - 1)
        })
        .count();
    equal as f64 / pairs as f64
}

/// Byte rows of a string/binary array, as `(offsets (rows + 1), bytes)`.
fn pack_bytes(arr: &dyn Array) -> Result<(Vec<u64>, Vec<u8>), GpuError> {
    fn pack<'a>(rows: usize, at: impl Fn(usize) -> &'a [u8]) -> (Vec<u64>, Vec<u8>) {
        let mut offsets = Vec::with_capacity(rows + 1);
        let mut data = Vec::new();
        offsets.push(0);
        for i in 0..rows {
            data.extend_from_slice(at(i));
            offsets.push(data.len() as u64);
        }
        (offsets, data)
    }
    let n = arr.len();
    // NULL rows contribute their (possibly garbage) value bytes; the kernel never looks at them.
    Ok(match arr.data_type() {
        DataType::Utf8 => {
            let a = arr.as_string::<i32>();
            pack(n, |i| a.value(i).as_bytes())
        }
        DataType::LargeUtf8 => {
            let a = arr.as_string::<i64>();
            pack(n, |i| a.value(i).as_bytes())
        }
        DataType::Utf8View => {
            let a = arr.as_string_view();
            pack(n, |i| a.value(i).as_bytes())
        }
        DataType::Binary => {
            let a = arr.as_binary::<i32>();
            pack(n, |i| a.value(i))
        }
        DataType::LargeBinary => {
            let a = arr.as_binary::<i64>();
            pack(n, |i| a.value(i))
        }
        DataType::BinaryView => {
            let a = arr.as_binary_view();
            pack(n, |i| a.value(i))
        }
        other => return Err(GpuError::Internal(format!("not a byte key type: {other}"))),
    })
}

/// Packs the memo tables of ℓ as `τ | nodes << 5 | skip << 17` (see the module docs).
fn packed_memo(leaf: usize) -> Result<Vec<u32>, GpuError> {
    let m = Memo::get(leaf);
    (0..m.tau.len())
        .map(|i| {
            let (t, n, s) = (m.tau[i] as u32, m.nodes[i] as u32, m.skip[i] as u32);
            if t < 32 && n < 4096 && s < 8192 {
                Ok(t | n << 5 | s << 17)
            } else {
                Err(GpuError::Internal(format!(
                    "memo entry {i} of ℓ={leaf} does not pack: τ {t}, nodes {n}, skip {s}"
                )))
            }
        })
        .collect()
}

impl GpuIndex {
    /// Uploads `index` to the shared GPU context.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use arrow::array::{ArrayRef, Int64Array};
    /// use datafusion_mphf::core::column::{ColumnIndex, IndexOptions};
    /// use datafusion_mphf::gpu::GpuIndex;
    /// let col: ArrayRef = Arc::new(Int64Array::from(vec![10, 20, 30]));
    /// let idx = ColumnIndex::build(&[col], &IndexOptions::default()).unwrap();
    /// let probe = Int64Array::from(vec![Some(30), None, Some(7)]);
    /// let mut cpu = Vec::new();
    /// idx.lookup_slots(&probe, &mut cpu).unwrap();
    /// match GpuIndex::new(&idx) {
    ///     Ok(g) => {
    ///         let mut gpu = Vec::new();
    ///         g.lookup_slots(&probe, &mut gpu).unwrap();
    ///         assert_eq!(gpu, cpu);
    ///     }
    ///     Err(e) => println!("no GPU: {e}"), // the caller stays on the CPU
    /// }
    /// ```
    ///
    /// # Errors
    /// No usable GPU, NVRTC or module load failure, device allocation or copy failure.
    pub fn new(index: &ColumnIndex) -> Result<GpuIndex, GpuError> {
        Self::with_context(GpuContext::get()?, index)
    }

    /// Uploads `index` to `ctx`.
    ///
    /// # Errors
    /// As [`GpuIndex::new`].
    pub fn with_context(ctx: Arc<GpuContext>, index: &ColumnIndex) -> Result<GpuIndex, GpuError> {
        guarded("uploading the index", || Self::new_inner(ctx, index))
    }

    fn new_inner(ctx: Arc<GpuContext>, index: &ColumnIndex) -> Result<GpuIndex, GpuError> {
        let mphf = index.mphf();
        let params = mphf.params();
        let (leaf, rotation) = (params.leaf, params.rotation);
        let module = ctx.module_cached(&format!("query-{leaf}-{}", rotation as u8), |arch| {
            kernels::compile_query(leaf, rotation, arch)
        })?;
        let f = |name: &str| module.load_function(name).map_err(GpuError::missing_kernel(name));
        let k = QueryKernels {
            int_u32: f("lookup_int_u32")?,
            int_u64: f("lookup_int_u64")?,
            runs_u32: f("lookup_int_runs_u32")?,
            runs_u64: f("lookup_int_runs_u64")?,
            bytes_u32: f("lookup_bytes_u32")?,
            bytes_u64: f("lookup_bytes_u64")?,
            _module: module.clone(),
        };
        let stream = ctx.stream().clone();
        // Empty arrays are uploaded as one zero word: no zero-length device allocations.
        let up = |w: &[u64], what: &'static str| -> Result<CudaSlice<u64>, GpuError> {
            stream
                .clone_htod(if w.is_empty() { &[0u64][..] } else { w })
                .map_err(GpuError::alloc::<u64>(what, w.len().max(1)))
        };
        let ef = mphf.ef.parts();
        let rice = up(&mphf.rice.words, "uploading the Rice bits")?;
        let lower = up(ef.lower, "uploading the Elias-Fano lower bits")?;
        let upper_lambda = up(ef.upper_lambda, "uploading the Elias-Fano upper bits")?;
        let upper_psi = up(ef.upper_psi, "uploading the Elias-Fano upper bits")?;
        let jump = up(ef.jump, "uploading the Elias-Fano jump table")?;
        let memo_host = packed_memo(leaf)?;
        let memo = stream
            .clone_htod(&memo_host)
            .map_err(GpuError::alloc::<u32>("uploading the memo tables", memo_host.len()))?;
        let key_type = index.key_type().clone();
        let len = index.len();
        let (keys, key_bytes) = match int_kind(&key_type) {
            Some(kind) => {
                let raw = raw_values(index.keys().as_ref(), (kind & 15) as usize)?;
                let wide: Vec<u64> = (0..len as usize).map(|i| key_at(&raw, kind, i)).collect();
                (DeviceKeys::Int(up(&wide, "uploading the keys")?), wide.len() as u64 * 8)
            }
            None => {
                let (offsets, mut data) = pack_bytes(index.keys().as_ref())?;
                let bytes = offsets.len() as u64 * 8 + data.len() as u64;
                if data.is_empty() {
                    data.push(0);
                }
                let offsets = up(&offsets, "uploading the key offsets")?;
                let data = stream
                    .clone_htod(&data)
                    .map_err(GpuError::alloc::<u8>("uploading the key bytes", data.len()))?;
                (DeviceKeys::Bytes { offsets, data }, bytes)
            }
        };
        let (s_lo, s_hi) = int_hash_seeds(mphf.seed());
        let qp = QueryParams {
            num_buckets: ef.num_buckets,
            delta_lambda: ef.delta_lambda,
            delta_psi: ef.delta_psi,
            beta: ef.beta,
            len,
            s_lo,
            s_hi,
            lower_words: ef.lower.len() as u64,
            upper_lambda_words: ef.upper_lambda.len() as u64,
            upper_psi_words: ef.upper_psi.len() as u64,
            rice_words: mphf.rice.words.len() as u64,
            l_lambda: ef.l_lambda,
            l_psi: ef.l_psi,
            log2_jump: ef.log2_jump,
            key_kind: 0,
        };
        let words =
            (mphf.rice.words.len() + ef.lower.len() + ef.upper_lambda.len() + ef.upper_psi.len() + ef.jump.len())
                as u64;
        Ok(GpuIndex {
            bytes: words * 8 + memo_host.len() as u64 * 4 + key_bytes,
            ctx,
            k,
            params: qp,
            rice,
            lower,
            upper_lambda,
            upper_psi,
            jump,
            memo,
            keys,
            key_type,
            seed: mphf.seed(),
        })
    }

    /// Number of slots (distinct keys).
    pub fn len(&self) -> u64 {
        self.params.len
    }
    /// True when the index has no keys.
    pub fn is_empty(&self) -> bool {
        self.params.len == 0
    }
    /// Device memory held by the index, in bytes.
    pub fn device_bytes(&self) -> u64 {
        self.bytes
    }
    /// The context the index lives in.
    pub fn context(&self) -> &Arc<GpuContext> {
        &self.ctx
    }

    /// The probe cast to the key type (as [`ColumnIndex::lookup_slots`] does).
    fn cast(&self, probe: &dyn Array) -> Result<Option<ArrayRef>, GpuError> {
        let dt = self.key_type.to_arrow();
        if probe.data_type() == &dt {
            return Ok(None);
        }
        if !probe_castable(probe.data_type(), &dt) {
            return Err(GpuError::ProbeType {
                probe: probe.data_type().clone(),
                index: dt,
            });
        }
        cast_probe_exact(probe, &dt)
            .map(Some)
            .map_err(GpuError::arrow("casting the probe"))
    }

    /// Uploads a probe column (cast to the key type; byte keys hashed here on all cores).
    ///
    /// # Errors
    /// A probe type that cannot hold keys of the index's type; device allocation or copy
    /// failures.
    pub fn upload(&self, probe: &dyn Array) -> Result<DeviceProbe, GpuError> {
        self.upload_parts(&[probe])
    }

    /// Uploads the concatenation of `parts` (e.g. the batches of a partition) as one probe:
    /// integer keys are copied on all cores straight into pinned staging memory and sent to
    /// the device in one copy, with no concatenated host array in between.
    ///
    /// # Errors
    /// As [`GpuIndex::upload`].
    pub fn upload_parts(&self, parts: &[&dyn Array]) -> Result<DeviceProbe, GpuError> {
        guarded("uploading the probe", || self.upload_inner(parts))
    }

    fn upload_inner(&self, parts: &[&dyn Array]) -> Result<DeviceProbe, GpuError> {
        let casts = parts.iter().map(|p| self.cast(*p)).collect::<Result<Vec<_>, _>>()?;
        let parts: Vec<&dyn Array> = parts
            .iter()
            .zip(&casts)
            .map(|(p, c)| c.as_deref().unwrap_or(*p))
            .collect();
        let Some(kind) = int_kind(&self.key_type) else {
            let refs: Vec<&dyn Array> = parts.to_vec();
            let one = match refs.as_slice() {
                [_] => None,
                _ => Some(arrow::compute::concat(&refs).map_err(GpuError::arrow("concatenating the probe"))?),
            };
            return self.upload_bytes(one.as_deref().unwrap_or(parts[0]));
        };
        let rows: usize = parts.iter().map(|p| p.len()).sum();
        let valid = self.ctx.upload_validity(&parts)?;
        let width = (kind & 15) as usize;
        let raws = parts
            .iter()
            .map(|p| raw_values(*p, width))
            .collect::<Result<Vec<_>, _>>()?;
        let run_rate = raws
            .iter()
            .zip(&parts)
            .max_by_key(|(_, p)| p.len())
            .map_or(0.0, |(raw, p)| sample_run_rate(raw, kind, p.len()));
        let words = (rows * width).div_ceil(8);
        let data = self.ctx.upload_staged(words, |out| {
            // SAFETY: a byte view of the exclusively borrowed word slice (u8 has alignment 1 and
            // every bit pattern is valid); it lives no longer than `out`.
            let bytes = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), out.len() * 8) };
            let (pieces, rest) = split_by_lens(bytes, raws.iter().map(|r| r.len()));
            rest.fill(0);
            // Split inside each piece too: a probe is often one large array, and one thread
            // writes write-combined memory at a fraction of what all cores do.
            pieces.into_par_iter().zip(&raws).for_each(|(piece, raw)| {
                piece
                    .par_chunks_mut(1 << 20)
                    .zip(raw.as_slice().par_chunks(1 << 20))
                    .for_each(|(to, from)| to.copy_from_slice(from));
            });
            Ok(())
        })?;
        Ok(DeviceProbe {
            rows,
            data: ProbeData::Int { data, kind },
            valid,
            run_rate,
        })
    }

    /// Uploads a byte-key probe: hashed on all cores here, verified on the device.
    fn upload_bytes(&self, probe: &dyn Array) -> Result<DeviceProbe, GpuError> {
        let stream = self.ctx.stream();
        let rows = probe.len();
        let valid = self.ctx.upload_validity(&[probe])?;
        let (offsets, mut bytes) = pack_bytes(probe)?;
        let seed = self.seed;
        let mut hashes = vec![0u64; 2 * rows.max(1)];
        hashes.par_chunks_mut(2 * 4096).enumerate().for_each(|(c, out)| {
            for (j, pair) in out.chunks_mut(2).enumerate() {
                let i = c * 4096 + j;
                if i < rows {
                    let h = hash_bytes(&bytes[offsets[i] as usize..offsets[i + 1] as usize], seed);
                    pair[0] = h.hi;
                    pair[1] = h.lo;
                }
            }
        });
        if bytes.is_empty() {
            bytes.push(0);
        }
        let hashes = stream
            .clone_htod(&hashes)
            .map_err(GpuError::alloc::<u64>("uploading the hashes", hashes.len()))?;
        let offsets = stream
            .clone_htod(&offsets)
            .map_err(GpuError::alloc::<u64>("uploading the offsets", offsets.len()))?;
        let data = stream
            .clone_htod(&bytes)
            .map_err(GpuError::alloc::<u8>("uploading the probe bytes", bytes.len()))?;
        Ok(DeviceProbe {
            rows,
            data: ProbeData::Bytes { hashes, offsets, data },
            valid,
            run_rate: 0.0,
        })
    }

    /// Whether `combine` resolves to the runs kernel for `probe`.
    pub fn uses_runs(&self, probe: &DeviceProbe, combine: Combine) -> bool {
        matches!(probe.data, ProbeData::Int { .. })
            && match combine {
                Combine::Auto => probe.run_rate >= RUNS_MIN_RATE,
                Combine::Off => false,
                Combine::Runs => true,
            }
    }

    /// Looks up an uploaded probe into `out` (u32 slots, [`ABSENT32`] for NULL or absent rows);
    /// the slots stay on the device (for [`super::GpuGroupBy`]). Asynchronous on the context's
    /// stream.
    ///
    /// # Errors
    /// `out` shorter than the probe, an index with `u32::MAX` or more slots, launch failures.
    pub fn lookup_device_into(
        &self,
        probe: &DeviceProbe,
        combine: Combine,
        out: &mut CudaSlice<u32>,
    ) -> Result<(), GpuError> {
        if self.params.len >= u32::MAX as u64 {
            return Err(GpuError::Unsupported(format!(
                "{} slots do not fit the 32-bit device slots",
                self.params.len
            )));
        }
        guarded("the GPU lookup", || self.launch(probe, combine, out))
    }

    /// As [`GpuIndex::lookup_device_into`], allocating the output.
    ///
    /// # Errors
    /// As [`GpuIndex::lookup_device_into`].
    pub fn lookup_device(&self, probe: &DeviceProbe, combine: Combine) -> Result<CudaSlice<u32>, GpuError> {
        // SAFETY: every element is written by the lookup kernel before anyone reads it (one
        // thread per row, or every row of every tile in the runs kernel).
        let mut out = unsafe { self.ctx.stream().alloc::<u32>(probe.rows.max(1)) }
            .map_err(GpuError::alloc::<u32>("allocating slots", probe.rows.max(1)))?;
        self.lookup_device_into(probe, combine, &mut out)?;
        Ok(out)
    }

    /// Raw slots, as [`ColumnIndex::lookup_slots`]: `out[i]` is the slot of row i or
    /// [`ABSENT`]. Identical to the CPU's answer for every row.
    ///
    /// # Errors
    /// As [`GpuIndex::upload`] and [`GpuIndex::lookup_device_into`].
    pub fn lookup_slots(&self, probe: &dyn Array, out: &mut Vec<u64>) -> Result<(), GpuError> {
        guarded("the GPU lookup", || {
            let p = self.upload_inner(&[probe])?;
            out.clear();
            out.resize(p.rows, ABSENT);
            if p.rows == 0 {
                return Ok(());
            }
            let stream = self.ctx.stream();
            // SAFETY: every element is written by the kernel before it is copied back.
            let mut d =
                unsafe { stream.alloc::<u64>(p.rows) }.map_err(GpuError::alloc::<u64>("allocating slots", p.rows))?;
            self.launch(&p, Combine::Auto, &mut d)?;
            stream
                .memcpy_dtoh(&d, out.as_mut_slice())
                .map_err(GpuError::driver("copying slots back"))?;
            stream.synchronize().map_err(GpuError::driver("synchronizing"))
        })
    }

    /// Slots as an Arrow array, as [`ColumnIndex::lookup`]: `UInt32` (or `UInt64` above 2^32
    /// slots), NULL for NULL and absent rows.
    ///
    /// # Errors
    /// As [`GpuIndex::lookup_slots`].
    pub fn lookup(&self, probe: &dyn Array) -> Result<ArrayRef, GpuError> {
        let mut slots = Vec::new();
        self.lookup_slots(probe, &mut slots)?;
        Ok(crate::core::column::slot_array(slots, self.params.len))
    }

    /// The slot of every row of a key column given as `parts` (e.g. the batches of a file), as
    /// a slot map stores them: `out[r]` is the slot of row r, or [`ABSENT32`] for a NULL or
    /// absent key. Identical to [`ColumnIndex::lookup_slots`] on every row.
    ///
    /// The column goes through the device in chunks of at most [`SLOT_MAP_CHUNK_ROWS`] rows, so
    /// device memory stays bounded whatever the row count: each chunk is copied into pinned
    /// memory on all cores, sent by DMA, looked up, and its u32 slots come back by DMA.
    ///
    /// # Errors
    /// An index with `u32::MAX` or more slots; as [`GpuIndex::upload`] and
    /// [`GpuIndex::lookup_device_into`].
    pub fn slot_map(&self, parts: &[&dyn Array]) -> Result<Vec<u32>, GpuError> {
        guarded("the GPU slot map", || {
            let rows: usize = parts.iter().map(|p| p.len()).sum();
            let mut out = crate::error::try_with_capacity(rows, || format!("the slots of {rows} rows"))
                .map_err(|e| GpuError::HostMemory(e.to_string()))?;
            // Filled on all cores: a serial fill of the 4 B/row map (and its first-touch page
            // faults) would take longer than the copies and lookups of all chunks together.
            out.par_extend(rayon::iter::repeat_n(ABSENT32, rows));
            let chunk_rows = SLOT_MAP_CHUNK_ROWS.min(rows.max(2).next_multiple_of(2));
            // SAFETY: every element a download reads is written by the lookup of the same chunk
            // first (one value per row; the download rounds up to an even count, and the
            // buffer's extra element is never read as a slot).
            let mut device = unsafe { self.ctx.stream().alloc::<u32>(chunk_rows) }
                .map_err(GpuError::alloc::<u32>("allocating slots", chunk_rows))?;
            let mut at = 0usize;
            for chunk in row_chunks(parts, chunk_rows) {
                let refs: Vec<&dyn Array> = chunk.iter().map(|a| a.as_ref()).collect();
                let probe = self.upload_inner(&refs)?;
                self.lookup_device_into(&probe, Combine::Auto, &mut device)?;
                let n = probe.rows;
                self.ctx.download_staged_u32(&device, &mut out[at..at + n])?;
                at += n;
            }
            Ok(out)
        })
    }

    /// Launches the lookup of `probe` into `out` (the kernel of `S`'s width).
    fn launch<S: SlotWidth>(
        &self,
        probe: &DeviceProbe,
        combine: Combine,
        out: &mut CudaSlice<S>,
    ) -> Result<(), GpuError> {
        let wide = S::WIDE;
        let rows = probe.rows as u64;
        if out.len() < probe.rows {
            return Err(GpuError::LengthMismatch(format!(
                "slot buffer of {} for {rows} rows",
                out.len()
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let stream = self.ctx.stream();
        let mut p = self.params;
        let null_ptr = 0u64;
        let (valid_off, has_valid) = match &probe.valid {
            Some((_, off)) => (*off, true),
            None => (0, false),
        };
        let runs = self.uses_runs(probe, combine);
        let (func, cfg) = match (&probe.data, runs, wide) {
            (ProbeData::Int { .. }, true, w) => (
                if w { &self.k.runs_u64 } else { &self.k.runs_u32 },
                LaunchConfig {
                    grid_dim: (rows.div_ceil(RUN_TILE).min(i32::MAX as u64) as u32, 1, 1),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
            (ProbeData::Int { .. }, false, w) | (ProbeData::Bytes { .. }, _, w) => (
                match (&probe.data, w) {
                    (ProbeData::Int { .. }, true) => &self.k.int_u64,
                    (ProbeData::Int { .. }, false) => &self.k.int_u32,
                    (ProbeData::Bytes { .. }, true) => &self.k.bytes_u64,
                    (ProbeData::Bytes { .. }, false) => &self.k.bytes_u32,
                },
                LaunchConfig {
                    grid_dim: (
                        u32::try_from(rows.div_ceil(THREADS as u64))
                            .map_err(|_| GpuError::Unsupported(format!("{rows} rows exceed one launch")))?,
                        1,
                        1,
                    ),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                },
            ),
        };
        let mut l = stream.launch_builder(func);
        if let ProbeData::Int { kind, .. } = &probe.data {
            p.key_kind = *kind;
        }
        l.arg(&p)
            .arg(&self.rice)
            .arg(&self.lower)
            .arg(&self.upper_lambda)
            .arg(&self.upper_psi)
            .arg(&self.jump)
            .arg(&self.memo);
        match (&probe.data, &self.keys) {
            (ProbeData::Int { data, .. }, DeviceKeys::Int(stored)) => {
                l.arg(stored).arg(data);
            }
            (ProbeData::Bytes { hashes, offsets, data }, DeviceKeys::Bytes { offsets: ko, data: kd }) => {
                l.arg(ko).arg(kd).arg(hashes).arg(offsets).arg(data);
            }
            _ => return Err(GpuError::Internal("probe and index key kinds differ".into())),
        }
        match &probe.valid {
            Some((v, _)) if has_valid => l.arg(v),
            _ => l.arg(&null_ptr),
        };
        l.arg(&valid_off).arg(&rows).arg(out);
        // SAFETY: the argument list matches the kernel signature in kernels/query.cu
        // (QueryParams by value; rice, lower, upper_lambda, upper_psi, jump, memo; stored keys
        // (u64) and raw probe values, or key offsets, key bytes, hashes, probe offsets, probe
        // bytes; validity bitmap or null; bit offset; rows; out). Every array is at least as long
        // as the kernel reads: the index arrays have the lengths in QueryParams (scans are
        // bounded by them), stored keys have `len` entries (offsets `len + 1`), the probe holds
        // `rows` values (`rows + 1` offsets, 2·rows hashes), the validity bitmap covers bits
        // `valid_off .. valid_off + rows`, and `out` has at least `rows` elements of the
        // kernel's slot width (the kernel is chosen by `S::WIDE`). The kernel writes only `out`.
        unsafe { l.launch(cfg) }.map_err(GpuError::driver("launching the lookup kernel"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    /// Chunks cover every row once, in order, with no chunk above the limit, across part
    /// boundaries (parts of 5, 0 and 7 rows in chunks of 4: 4, 4, 4).
    #[test]
    fn row_chunks_cover_every_row_in_order() {
        let a = Int64Array::from((0..5).collect::<Vec<i64>>());
        let b = Int64Array::from(Vec::<i64>::new());
        let c = Int64Array::from((5..12).collect::<Vec<i64>>());
        let parts: [&dyn Array; 3] = [&a, &b, &c];
        let chunks = row_chunks(&parts, 4);
        let sizes: Vec<usize> = chunks.iter().map(|c| c.iter().map(|a| a.len()).sum()).collect();
        assert_eq!(sizes, vec![4, 4, 4]);
        let rows: Vec<i64> = chunks
            .iter()
            .flatten()
            .flat_map(|a| a.as_primitive::<arrow::datatypes::Int64Type>().values().to_vec())
            .collect();
        assert_eq!(rows, (0..12).collect::<Vec<i64>>());
        assert!(row_chunks(&[&b as &dyn Array], 4).is_empty());
    }
}
