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

/// The bucket solver for `device` and `n_keys` keys (`None`: the CPU), and a one-line notice
/// when the GPU was asked for explicitly but is not usable.
pub fn solver_for(device: Device, n_keys: u64, params: &Params) -> (Option<Arc<dyn BucketSolver>>, Option<String>) {
    #[cfg(feature = "cuda")]
    {
        crate::gpu::solver_for(device, n_keys, params)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (n_keys, params);
        match device {
            Device::Gpu => (
                None,
                Some(format!(
                    "GPU not available ({}); building on the CPU",
                    GpuError::NotBuilt
                )),
            ),
            Device::Auto | Device::Cpu => (None, None),
        }
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
