//! The single mapping from the crate's errors into [`DataFusionError`].

use ::datafusion::error::DataFusionError;

use crate::error::MphfError;

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
