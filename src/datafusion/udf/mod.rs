//! Functions of the extension: `mphf_index`, its answer from stored slots, and the routing and
//! part-building functions of index builds on a cluster.

pub mod mphf_index;
pub mod partitioned_build;
pub mod stored_slots;

pub use mphf_index::{MphfIndexFunc, GPU_LOOKUP_MIN_ROWS};
pub use stored_slots::{MphfStoredSlotsFunc, MphfStoredSlotsRule, STORED_SLOTS_NAME};
