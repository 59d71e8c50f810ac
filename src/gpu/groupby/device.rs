//! The GPU side of [`GpuGroupBy`]: kernels loaded once per context, value columns uploaded, the
//! mapping chosen from a device sample of the slots ([`GroupByPlan`]), the launches, and the
//! accumulators downloaded.

use std::sync::Arc;

use arrow::array::Array;
use arrow::datatypes::DataType;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::values::{check_exact, decode, max_ident, min_ident, ops_of, pieces_of, value_kind, widen_pieces};
use super::{
    guarded, AggOp, ColumnResult, DeviceAggregates, DeviceColAgg, DeviceColumn, GpuGroupBy, GroupByKernels,
    GroupByOptions, GroupByPlan, GroupByResult, Mode, ValueKind, GLOBAL_THREADS, HOT_BLOCKS_PER_SM, HOT_MAX,
    HOT_MIN_SHARE, MATCH_MAX_DISTINCT, OP_MAX, OP_MIN, OP_NN, OP_ROWS, OP_SUM, SAMPLE_WINDOWS,
    SHARED_MIN_ROWS_PER_FLUSH, SHARED_THREADS,
};
use crate::gpu::{kernels, GpuContext, GpuError};

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
