//! `SlotStates`: a device placement's answer for one input, per-slot accumulator states.
//!
//! Its own module because two others meet here: a device (`gpu`, through the `device` seam)
//! produces it and `groups` merges it into slot accumulators. Both import it; it imports
//! neither, so the two do not import each other.

use std::time::Duration;

use ::datafusion::arrow::array::ArrayRef;

/// The touched slots (ascending) and, per aggregate in order, its state arrays (one row per
/// touched slot).
pub(crate) struct SlotStates {
    pub slots: Vec<usize>,
    pub states: Vec<ArrayRef>,
    /// Number of state arrays of each aggregate.
    pub widths: Vec<usize>,
    /// Input rows whose key was not NULL (the ones these states cover).
    pub rows: usize,
    /// Host preparation (evaluating the columns per batch), device work (staged copies,
    /// lookup, aggregation, results back), and building the states.
    pub timings: [Duration; 3],
}
