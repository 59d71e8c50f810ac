//! Scalar functions of the extension.

pub mod mphf_index;

pub use mphf_index::{MphfIndexFunc, GPU_LOOKUP_MIN_ROWS};
