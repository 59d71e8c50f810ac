//! Timing two sessions against each other, shared by the benches that compare vanilla
//! DataFusion with the MPHF session in one process.
//!
//! The runs alternate between the sessions and alternate which goes first, so that drift in the
//! machine's speed, and any advantage of going first, falls on both alike. Each side's median is
//! reported.

use std::time::Instant;

use ::datafusion::arrow::record_batch::RecordBatch;
use anyhow::Result;

/// The median of `times` (sorted in place; `times` must not be empty).
pub(super) fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Median times (ms) over `runs` of a vanilla and an MPHF job, and each one's last result.
/// Results are kept, not rendered, between runs; a side's previous result is dropped before it
/// runs again.
pub(super) async fn time_both(
    vanilla: impl AsyncFn() -> Result<Vec<RecordBatch>>,
    mphf: impl AsyncFn() -> Result<Vec<RecordBatch>>,
    runs: usize,
) -> Result<[(f64, Vec<RecordBatch>); 2]> {
    let mut times = [Vec::new(), Vec::new()];
    let mut last = [Vec::new(), Vec::new()];
    for run in 0..runs.max(1) {
        for side in [run % 2, 1 - run % 2] {
            last[side].clear();
            let t = Instant::now();
            let batches = if side == 0 { vanilla().await? } else { mphf().await? };
            times[side].push(t.elapsed().as_secs_f64() * 1e3);
            last[side] = batches;
        }
    }
    let [mut tv, mut tm] = times;
    let [bv, bm] = last;
    Ok([(median(&mut tv), bv), (median(&mut tm), bm)])
}
