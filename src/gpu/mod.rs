//! The GPU backend (spec §10.6–10.7): RecSplit bucket solving on an NVIDIA GPU via cudarc.
//!
//! This is the only module that touches CUDA. The kernels (`kernels/*.cu`) are compiled at run
//! time by NVRTC for the device's architecture, once per (ℓ, rotation) and process. The
//! [`GpuSolver`] implements the core's [`BucketSolver`]: it returns exactly the descriptors the
//! CPU search finds, so the shared encoder produces identical bytes.
//!
//! Failure policy: no driver library, no device, a failed context, compile, launch or
//! allocation all become an `Err(`[`GpuError`]`)`; the builder then builds on the CPU with a
//! one-line notice. cudarc (with `dynamic-loading`) panics when a CUDA library is missing, so every
//! entry point checks for the library first and wraps the first load in `catch_unwind`.

pub mod build;
pub mod error;
pub mod groupby;
pub mod kernels;
pub mod query;
mod staging;

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};

pub use build::GpuSolver;
pub use error::GpuError;
pub use groupby::{AggOp, GpuGroupBy, GroupByResult};
pub use query::GpuIndex;

use crate::core::Params;

pub use crate::device::Device;

/// Smallest input for which `Device::Auto` picks the GPU at ℓ ≤ 10: from about this size on the
/// GPU build is clearly faster than the CPU's, and the margin covers the first GPU build's
/// context start and NVRTC compilation (measurements: benches/RESULTS.md, "Where the planner's
/// thresholds and device crossovers come from"; benches/RESULTS-gpu.md).
pub const AUTO_MIN_KEYS: u64 = 1 << 20;
/// Smallest input for which `Device::Auto` picks the GPU at ℓ ≥ 11 (the CPU's cost per key is
/// far higher at these leaf sizes, so the GPU pays off from much smaller inputs; measurements:
/// benches/RESULTS.md, "Where the planner's thresholds and device crossovers come from").
pub const AUTO_MIN_KEYS_LARGE_LEAF: u64 = 1 << 14;
/// Below this ℓ `Device::Auto` stays on the CPU: the GPU build is no faster than the CPU's
/// (host-side hashing, bucketing and encoding dominate, and they are the same on both;
/// measurements: benches/RESULTS.md, "Where the planner's thresholds and device crossovers come
/// from").
pub const AUTO_MIN_LEAF: usize = 7;

/// Whether `Device::Auto` builds `n_keys` keys with `params` on the GPU (when one is usable).
pub fn auto_prefers_gpu(n_keys: u64, params: &Params) -> bool {
    if params.leaf < AUTO_MIN_LEAF {
        false
    } else if params.leaf <= 10 {
        n_keys >= AUTO_MIN_KEYS
    } else {
        n_keys >= AUTO_MIN_KEYS_LARGE_LEAF
    }
}

/// The kernels of one (ℓ, rotation) module.
pub struct Kernels {
    _module: Arc<CudaModule>,
    pub(crate) split_high: CudaFunction,
    pub(crate) split_agg: CudaFunction,
    pub(crate) leaf_pass: CudaFunction,
    pub(crate) leaf_collect: CudaFunction,
}

/// A process-wide CUDA context on device 0 with its stream and module cache.
pub struct GpuContext {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    arch: String,
    name: String,
    modules: Mutex<HashMap<(usize, bool), Arc<Kernels>>>,
    /// Query-side modules (`query.cu` per (ℓ, rotation), `groupby.cu`), by name.
    query_modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// Pinned host buffers for bulk copies (see [`staging`]).
    staging: staging::Staging,
}

impl std::fmt::Debug for GpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuContext")
            .field("name", &self.name)
            .field("arch", &self.arch)
            .finish()
    }
}

static GPU: OnceLock<Result<Arc<GpuContext>, GpuError>> = OnceLock::new();

/// Whether the CUDA driver library can be loaded (checked once per process; cudarc panics on
/// the first driver call when it cannot).
fn driver_present() -> bool {
    static DRIVER: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen libcuda by its usual names; no symbol is called.
    *DRIVER.get_or_init(|| catch_unwind(|| unsafe { cudarc::driver::sys::is_culib_present() }).unwrap_or(false))
}

impl GpuContext {
    /// The shared context, created on first use.
    ///
    /// # Errors
    /// Why no GPU is usable (no libcuda, no device, context creation failed).
    pub fn get() -> Result<Arc<GpuContext>, GpuError> {
        GPU.get_or_init(|| {
            catch_unwind(Self::create).unwrap_or_else(|_| Err(GpuError::panicked("loading the CUDA driver")))
        })
        .clone()
    }

    /// Whether a GPU may be usable, without creating the context: the context's outcome once it
    /// was created, else whether the driver library can be loaded (checked once per process).
    /// Creating the context (cuInit, the context, a stream) takes a large share of a second, so
    /// figures that are only shown, not acted on, ask this instead of [`get`](Self::get).
    pub fn may_be_usable() -> bool {
        match GPU.get() {
            Some(outcome) => outcome.is_ok(),
            None => driver_present(),
        }
    }

    /// Whether this process has tried to create the context (successfully or not).
    pub fn started() -> bool {
        GPU.get().is_some()
    }

    fn create() -> Result<Arc<GpuContext>, GpuError> {
        if !driver_present() {
            return Err(GpuError::NoDriver);
        }
        let count = CudaContext::device_count().map_err(GpuError::driver("cuInit/cuDeviceGetCount failed"))?;
        if count < 1 {
            return Err(GpuError::NoDevice);
        }
        let ctx = CudaContext::new(0).map_err(GpuError::driver("cannot create a CUDA context"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(GpuError::driver("cannot read the compute capability"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let stream = ctx
            .new_stream()
            .map_err(GpuError::driver("cannot create a CUDA stream"))?;
        Ok(Arc::new(GpuContext {
            ctx,
            stream,
            arch: format!("compute_{major}{minor}"),
            name,
            modules: Mutex::new(HashMap::new()),
            query_modules: Mutex::new(HashMap::new()),
            staging: staging::Staging::default(),
        }))
    }

    /// The device's name (e.g. "NVIDIA H200").
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The virtual architecture the kernels are compiled for (e.g. "compute_90").
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> Result<(usize, usize), GpuError> {
        self.ctx.mem_get_info().map_err(GpuError::driver("cuMemGetInfo failed"))
    }

    /// A query-side module named `key`, compiled by `compile` and loaded on first use, then
    /// cached for the context's lifetime.
    ///
    /// # Errors
    /// NVRTC or module-load failures.
    pub(crate) fn module_cached(
        &self,
        key: &str,
        compile: impl FnOnce(&str) -> Result<cudarc::nvrtc::Ptx, GpuError>,
    ) -> Result<Arc<CudaModule>, GpuError> {
        let mut map = self
            .query_modules
            .lock()
            .map_err(|_| GpuError::Poisoned { what: "kernel cache" })?;
        if let Some(m) = map.get(key) {
            return Ok(m.clone());
        }
        let ptx = compile(&self.arch)?;
        let module = catch_unwind(AssertUnwindSafe(|| self.ctx.load_module(ptx)))
            .map_err(|_| GpuError::panicked(format!("loading the {key} module")))?
            .map_err(GpuError::driver(format!("cannot load the {key} module")))?;
        map.insert(key.to_string(), module.clone());
        Ok(module)
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<u32, GpuError> {
        self.ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map(|v| v as u32)
            .map_err(GpuError::driver("cannot read the SM count"))
    }

    /// Warps the device holds resident at once (SMs × threads per SM / 32).
    pub fn resident_warps(&self) -> Result<u32, GpuError> {
        let per_sm = self
            .ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
            .map_err(GpuError::driver("cannot read the threads per SM"))?;
        Ok(self.sm_count()? * (per_sm.max(32) as u32 / 32))
    }

    /// Largest dynamic shared memory a block may opt in to, in bytes.
    pub fn max_shared_optin(&self) -> Result<u32, GpuError> {
        self.ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map(|v| v as u32)
            .map_err(GpuError::driver("cannot read the shared memory size"))
    }

    /// The context's stream (all query-side work runs on it, in order).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The kernels for (ℓ, rotation), compiled and loaded on first use.
    ///
    /// # Errors
    /// NVRTC or module-load failures.
    pub fn kernels(&self, leaf: usize, rotation: bool) -> Result<Arc<Kernels>, GpuError> {
        let mut map = self
            .modules
            .lock()
            .map_err(|_| GpuError::Poisoned { what: "kernel cache" })?;
        if let Some(k) = map.get(&(leaf, rotation)) {
            return Ok(k.clone());
        }
        let ptx = kernels::compile(leaf, rotation, &self.arch)?;
        let module = catch_unwind(AssertUnwindSafe(|| self.ctx.load_module(ptx)))
            .map_err(|_| GpuError::panicked("loading the kernel module"))?
            .map_err(GpuError::driver("cannot load the kernel module"))?;
        let f = |name: &str| module.load_function(name).map_err(GpuError::missing_kernel(name));
        let k = Arc::new(Kernels {
            split_high: f("split_high")?,
            split_agg: f("split_agg")?,
            leaf_pass: f("leaf_pass")?,
            leaf_collect: f("leaf_collect")?,
            _module: module.clone(),
        });
        map.insert((leaf, rotation), k.clone());
        Ok(k)
    }
}
