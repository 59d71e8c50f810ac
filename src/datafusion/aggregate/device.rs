//! The seam between the slot aggregation and a device that aggregates a whole input at once.
//!
//! The operators (the per-partition stream, the slot-range merge) see only
//! [`DeviceAggregation`]: a placement that takes an input's batches and returns per-slot
//! accumulator states ([`SlotStates`]), which they merge like any partial. The GPU is its one
//! implementation (`aggregate::gpu`, built with the `cuda` feature); without that feature no
//! placement ever holds one, and this module and the operators compile the same.
//!
//! Invariants: a device leaves the rows with a NULL key to the CPU ([`DeviceAggregation::null_key_rows`]);
//! `Ok(None)` from [`DeviceAggregation::run`] (a key missing from the index) and any `Err`
//! send the whole input to the CPU path, the latter with one notice per process, so the
//! results never depend on the device.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::common::{DataFusionError, Result};

use super::groups::SlotGroups;
use super::slot_states::SlotStates;
use crate::datafusion::registry::IndexHandle;

/// An aggregation placed on a device (see the module docs).
pub(crate) trait DeviceAggregation: Send + Sync + fmt::Debug {
    /// The device's name, as `EXPLAIN` shows it (`device=`).
    fn device_name(&self) -> &'static str;

    /// The per-slot states of the rows of `batches` whose key is not NULL. `Ok(None)`: some
    /// such key is not in `index` (the caller aggregates on the CPU instead).
    fn run(&self, index: &IndexHandle, batches: &[RecordBatch]) -> Result<Option<SlotStates>>;

    /// The rows of `batches` whose key is NULL (the caller aggregates them on the CPU).
    fn null_key_rows(&self, batches: &[RecordBatch]) -> Result<Vec<RecordBatch>>;
}

/// The device-fallback notice is printed once per process.
static NOTICE_PRINTED: AtomicBool = AtomicBool::new(false);

/// Aggregates `batches` into `groups`: on `device`, then the NULL-key rows on the CPU; the
/// whole input on the CPU when some key is not in the index or the device fails (with a notice).
pub(super) fn aggregate_into(
    groups: &mut SlotGroups,
    device: &dyn DeviceAggregation,
    index: &IndexHandle,
    batches: &[RecordBatch],
) -> Result<()> {
    match device.run(index, batches) {
        Ok(Some(states)) => {
            groups.merge_slot_states(&states)?;
            for b in device.null_key_rows(batches)? {
                groups.accumulate(&b)?;
            }
            return Ok(());
        }
        Ok(None) => {}
        Err(why) => notice_cpu_fallback(device, &why),
    }
    for b in batches {
        groups.accumulate(b)?;
    }
    Ok(())
}

/// Prints the CPU-fallback notice (once per process). An `External` error (a GPU, Arrow or
/// index error) is printed as itself, without DataFusion's "External error: " prefix.
pub(super) fn notice_cpu_fallback(device: &dyn DeviceAggregation, why: &DataFusionError) {
    if !NOTICE_PRINTED.swap(true, Ordering::Relaxed) {
        let why: &dyn fmt::Display = match why {
            DataFusionError::External(e) => e,
            other => other,
        };
        eprintln!(
            "mphf: {} aggregation unavailable ({why}); aggregating on the CPU",
            device.device_name().to_uppercase()
        );
    }
}
