//! Placement: what a [`Device`] choice resolves to on this machine, whether or not the crate was
//! built with the `cuda` feature: whether a GPU is usable ([`gpu_usable`]) and which bucket
//! solver a build gets ([`solver_for`]).
//!
//! Without the `cuda` feature, `auto` runs on the CPU silently and `gpu` runs on the CPU with a
//! notice: the results are the same bytes, only the time differs. This module and `gpu/` are
//! the only ones that name the feature for these decisions, so `device` stays below `gpu`.

use std::sync::Arc;

use crate::core::{BucketSolver, Params};
use crate::device::Device;
use crate::gpu::GpuError;

/// Whether work placed by `device` goes to the GPU: `gpu` always (the caller falls back to the
/// CPU with a notice when no GPU turns out usable), `cpu` never, `auto` when the caller's cost
/// test `pays` holds and a GPU is usable. The one place the `auto` rule is written: builds,
/// GROUP BYs and `mphf_index` differ only in their cost test.
pub fn wants_gpu(device: Device, pays: impl FnOnce() -> bool) -> bool {
    match device {
        Device::Cpu => false,
        Device::Gpu => true,
        Device::Auto => pays() && gpu_usable().is_ok(),
    }
}

/// The bucket solver for `device` and `n_keys` keys (`None`: the CPU), and a one-line notice
/// when the GPU was asked for explicitly but is not usable. `auto` pays from the key count and
/// leaf size up (`gpu::auto_prefers_gpu`).
pub fn solver_for(device: Device, n_keys: u64, params: &Params) -> (Option<Arc<dyn BucketSolver>>, Option<String>) {
    #[cfg(feature = "cuda")]
    let pays = || crate::gpu::auto_prefers_gpu(n_keys, params);
    #[cfg(not(feature = "cuda"))]
    let pays = || {
        let _ = (n_keys, params);
        false
    };
    if !wants_gpu(device, pays) {
        return (None, None);
    }
    #[cfg(feature = "cuda")]
    let context = crate::gpu::GpuContext::get();
    #[cfg(not(feature = "cuda"))]
    let context: Result<(), GpuError> = Err(GpuError::NotBuilt);
    match context {
        #[cfg(feature = "cuda")]
        Ok(ctx) => (Some(Arc::new(crate::gpu::GpuSolver::new(ctx))), None),
        #[cfg(not(feature = "cuda"))]
        Ok(()) => (None, None),
        Err(e) => (None, Some(format!("GPU not available ({e}); building on the CPU"))),
    }
}

/// Rows from which `auto` makes slot maps on the GPU: below it the device round trips and the
/// index upload cost more than the CPU's lookups.
pub const GPU_SLOT_MAP_MIN_ROWS: u64 = 1 << 22;

/// Who makes the slot maps of `rows` rows of `index` under `device`: the GPU
/// (`gpu::GpuIndex`, the index uploaded once) or, as `None`, the CPU; and a one-line notice
/// when the GPU was asked for explicitly, or chosen by `auto`, but cannot take the index.
pub fn slot_source_for(
    device: Device,
    rows: u64,
    index: &crate::core::column::ColumnIndex,
) -> (Option<Box<dyn crate::index::SlotSource>>, Option<String>) {
    if !wants_gpu(device, || rows >= GPU_SLOT_MAP_MIN_ROWS) {
        return (None, None);
    }
    #[cfg(feature = "cuda")]
    let gpu = crate::gpu::GpuIndex::new(index).map(|g| Box::new(g) as Box<dyn crate::index::SlotSource>);
    #[cfg(not(feature = "cuda"))]
    let gpu: Result<Box<dyn crate::index::SlotSource>, GpuError> = {
        let _ = index;
        Err(GpuError::NotBuilt)
    };
    match gpu {
        Ok(source) => (Some(source), None),
        Err(e) => (
            None,
            Some(format!("slot maps on the CPU: the GPU cannot take the index ({e})")),
        ),
    }
}

/// Whether a GPU may be usable, without starting it (the context's outcome once created, else
/// whether a CUDA driver library is present). For figures that are shown but not acted on, such
/// as `EXPLAIN`'s GPU estimate of a node placed on the CPU: planning must not pay the GPU's
/// start-up for a node that does not run there.
pub fn gpu_may_be_usable() -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::gpu::GpuContext::may_be_usable()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Whether this process has tried to start the GPU (created, or failed to create, the shared
/// CUDA context). Planning a node that stays on the CPU must leave it false.
pub fn gpu_started() -> bool {
    #[cfg(feature = "cuda")]
    {
        crate::gpu::GpuContext::started()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

/// Whether a GPU is usable by this process (creates the shared CUDA context on first call).
///
/// # Errors
/// Why not: [`GpuError::NotBuilt`] without the `cuda` feature, else no driver library, no
/// device, or a failed context (the error `gpu::GpuContext::get` caches).
pub fn gpu_usable() -> Result<(), GpuError> {
    #[cfg(feature = "cuda")]
    {
        crate::gpu::GpuContext::get().map(|_| ())
    }
    #[cfg(not(feature = "cuda"))]
    {
        Err(GpuError::NotBuilt)
    }
}
