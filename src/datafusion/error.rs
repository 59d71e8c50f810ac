//! The single mapping from the crate's errors into [`DataFusionError`].

use ::datafusion::error::DataFusionError;

use crate::error::MphfError;
use crate::gpu::GpuError;

/// Converts an [`MphfError`]: memory errors become `ResourcesExhausted`, type errors `Plan`,
/// everything else `External`.
pub fn to_df(e: MphfError) -> DataFusionError {
    match e {
        MphfError::OutOfMemory(m) => DataFusionError::ResourcesExhausted(m),
        e @ (MphfError::UnsupportedType(_) | MphfError::TypeMismatch { .. } | MphfError::InvalidParameter(_)) => {
            DataFusionError::Plan(e.to_string())
        }
        e => DataFusionError::External(Box::new(e)),
    }
}

/// Converts a [`GpuError`] into `External`, so that its variant stays reachable by downcasting
/// (the GPU paths turn it into a CPU fallback with a notice rather than a query error).
pub fn gpu_to_df(e: GpuError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}
