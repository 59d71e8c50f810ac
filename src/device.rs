//! Where an index is built: [`Device`] and [`solver_for`], available with or without the `cuda`
//! feature, so that the CLI and the SQL layer take the same `auto | cpu | gpu` option either way.
//!
//! Without the `cuda` feature, `auto` builds on the CPU silently and `gpu` builds on the CPU with
//! a notice: the result is the same bytes, only the build time differs.

use std::str::FromStr;
use std::sync::Arc;

use crate::core::{BucketSolver, Params};
use crate::gpu::GpuError;

/// Where a build runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The GPU when one is usable and the build is large enough to pay off.
    #[default]
    Auto,
    /// Always the CPU.
    Cpu,
    /// The GPU (falls back to the CPU with a notice when no GPU is usable).
    Gpu,
}

/// Parsing keeps `String` as its error, the standard library's pattern for `FromStr` (clap and
/// the SQL options print it as is); it is not a GPU failure.
impl FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            other => Err(format!("unknown device '{other}' (expected auto, cpu or gpu)")),
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Device::Auto => "auto",
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

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
