//! Scalar functions of the extension.

pub mod mphf_index;
pub mod stored_slots;

pub use mphf_index::{MphfIndexFunc, GPU_LOOKUP_MIN_ROWS};
pub use stored_slots::{MphfStoredSlotsRule, StoredSlotsExpr};
