//! Step 3 of the build on the CPU: every bucket's splitting tree solved in preorder (spec §5–6),
//! contiguous ranges of buckets in parallel, each range encoded as soon as it is solved.
//!
//! Every search returns the smallest valid index (spec §5.4), whatever the lane count or the
//! thread that runs it.

use std::sync::atomic::{AtomicU64, Ordering};

use rayon::prelude::*;

use super::bucketing::split_buckets;
use super::encode::{concat_chunks, encode_bucket};
use crate::core::hash::{range_h32, SEED_AGG1, SEED_AGG2, SEED_LEAF, START_SEEDS};
use crate::core::memo::Memo;
use crate::core::params::{Params, MAX_BUCKET_KEYS};
use crate::core::rice::RiceBuilder;
use crate::core::tree::{lower_aggr, split_left, upper_aggr};
use crate::error::SolveError;

/// Chunk size (in keys) for the parallel solve: small enough for load balance, large enough
/// that per-chunk bookkeeping is negligible.
pub(super) fn solve_chunk_keys(n: u64) -> u64 {
    let threads = rayon::current_num_threads() as u64;
    (n / (16 * threads).max(1)).clamp(1 << 10, 1 << 18)
}

/// Solves and encodes all buckets on the CPU; returns R and σ (length B+1).
pub(super) fn solve_and_encode_cpu(
    params: &Params,
    lo: &mut [u64],
    offsets: &[u64],
    watchdog: u64,
    progress: Option<&AtomicU64>,
) -> std::result::Result<(RiceBuilder, Vec<u64>), SolveError> {
    let memo = Memo::get(params.leaf);
    let chunks = split_buckets(lo, offsets, solve_chunk_keys(*offsets.last().unwrap_or(&0)));
    let outs = chunks
        .into_par_iter()
        .map(|(b0, b1, keys)| {
            let mut rice = RiceBuilder::new();
            let mut sigma = Vec::with_capacity(b1 - b0);
            let mut desc = Vec::new();
            let mut scratch = vec![0u64; MAX_BUCKET_KEYS];
            let base = offsets[b0];
            for b in b0..b1 {
                let (s, e) = ((offsets[b] - base) as usize, (offsets[b + 1] - base) as usize);
                desc.clear();
                solve_bucket(params, &mut keys[s..e], &mut scratch, watchdog, &mut desc)?;
                sigma.push(rice.len());
                encode_bucket(memo, e - s, &desc, &mut rice);
                if let Some(p) = progress {
                    p.fetch_add((e - s) as u64, Ordering::Relaxed);
                }
            }
            Ok((b0, b1, rice, sigma))
        })
        .collect::<std::result::Result<Vec<_>, SolveError>>()?;
    Ok(concat_chunks(offsets.len() - 1, outs))
}

/// Solves one bucket (keys may be reordered); appends its descriptors in preorder.
///
/// # Errors
/// [`SolveError::Watchdog`] when a node's search passes `watchdog` candidates.
pub fn solve_bucket(
    params: &Params,
    keys: &mut [u64],
    scratch: &mut [u64],
    watchdog: u64,
    out: &mut Vec<u64>,
) -> std::result::Result<(), SolveError> {
    macro_rules! dispatch {
        ($($l:literal)*) => {
            match params.leaf {
                $($l => Solver::<$l> { rotation: params.rotation, watchdog }.node(keys, scratch, 0, out),)*
                other => unreachable!("leaf size {other} passed validation"),
            }
        };
    }
    dispatch!(2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24)
}

/// Lanes evaluated together; the inner loops are written so LLVM vectorizes them (AVX2).
const LANES: usize = 8;

/// The search for one leaf size `L` (monomorphized per ℓ).
struct Solver<const L: usize> {
    rotation: bool,
    watchdog: u64,
}

impl<const L: usize> Solver<L> {
    /// First-aggregation unit A1 for this ℓ (a compile-time constant per instance).
    const A1: usize = lower_aggr(L);
    /// Second-aggregation unit A2 for this ℓ.
    const A2: usize = upper_aggr(L);

    fn node(
        &self,
        keys: &mut [u64],
        scratch: &mut [u64],
        depth: usize,
        out: &mut Vec<u64>,
    ) -> std::result::Result<(), SolveError> {
        let m = keys.len();
        if m <= 1 {
            return Ok(());
        }
        if m <= L {
            let d = if self.rotation && m == L {
                self.leaf_rotated(keys)?
            } else {
                self.leaf(keys)?
            };
            out.push(d);
            return Ok(());
        }
        let (a1, a2) = (Self::A1, Self::A2);
        let (unit, seed) = if m <= a1 {
            (L, SEED_AGG1)
        } else if m <= a2 {
            (a1, SEED_AGG2)
        } else {
            let left = split_left(m, a2);
            let seed = START_SEEDS[depth];
            let d = self.split_high(keys, left, seed)?;
            out.push(d);
            redistribute(
                keys,
                scratch,
                |y| (range_h32(y.wrapping_add(seed).wrapping_add(d), m as u32) as usize >= left) as usize,
                &[0, left],
            );
            let (l, r) = keys.split_at_mut(left);
            self.node(l, scratch, depth + 1, out)?;
            return self.node(r, scratch, depth + 1, out);
        };
        let d = if unit == L {
            self.split_agg::<false>(keys)?
        } else {
            self.split_agg::<true>(keys)?
        };
        out.push(d);
        let fanout = m.div_ceil(unit);
        let mut starts = [0usize; 9];
        for (j, s) in starts.iter_mut().enumerate().take(fanout) {
            *s = j * unit;
        }
        redistribute(
            keys,
            scratch,
            |y| range_h32(y.wrapping_add(seed).wrapping_add(d), m as u32) as usize / unit,
            &starts[..fanout],
        );
        for child in keys.chunks_mut(unit) {
            self.node(child, scratch, depth, out)?;
        }
        Ok(())
    }

    /// First `d` with `{R_m(y + S19 + d)}` a bijection onto `[m]` (spec §5.1–5.2).
    fn leaf(&self, keys: &[u64]) -> std::result::Result<u64, SolveError> {
        let m = keys.len();
        let full = (1u32 << m) - 1;
        // Midstop (spec §5.2): with α = 2 from m ≥ 9 on, most candidates fail on the first keys.
        let p = if m >= 9 {
            ((2.0 * (m as f64).sqrt()).ceil() as usize).min(m)
        } else {
            m
        };
        let (head, tail) = keys.split_at(p);
        let mut base = 0u64;
        loop {
            let mut masks = [0u32; LANES];
            for &y in head {
                let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                for (j, mask) in masks.iter_mut().enumerate() {
                    *mask |= 1 << range_h32(x.wrapping_add(j as u64), m as u32);
                }
            }
            if masks.iter().any(|k| k.count_ones() as usize == p) {
                for &y in tail {
                    let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                    for (j, mask) in masks.iter_mut().enumerate() {
                        *mask |= 1 << range_h32(x.wrapping_add(j as u64), m as u32);
                    }
                }
                if let Some(j) = masks.iter().position(|&k| k == full) {
                    return Ok(base + j as u64);
                }
            }
            base += LANES as u64;
            if base > self.watchdog {
                return Err(SolveError::Watchdog { keys: m });
            }
        }
    }

    /// Rotation search for a full leaf (spec §5.3): bases step by ℓ; the smallest base, then
    /// the smallest rotation r, gives `D = base + r`.
    fn leaf_rotated(&self, keys: &[u64]) -> std::result::Result<u64, SolveError> {
        let mut even = [0u64; L];
        let mut odd = [0u64; L];
        let (mut ne, mut no) = (0usize, 0usize);
        for &y in keys {
            if y & 1 == 0 {
                even[ne] = y;
                ne += 1;
            } else {
                odd[no] = y;
                no += 1;
            }
        }
        let full = (1u32 << L) - 1;
        let mut base = 0u64;
        loop {
            let mut ma = [0u32; LANES];
            for &y in &even[..ne] {
                let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                for (j, mask) in ma.iter_mut().enumerate() {
                    *mask |= 1 << range_h32(x.wrapping_add((j * L) as u64), L as u32);
                }
            }
            if ma.iter().any(|k| k.count_ones() as usize == ne) {
                let mut mb = [0u32; LANES];
                for &y in &odd[..no] {
                    let x = y.wrapping_add(SEED_LEAF).wrapping_add(base);
                    for (j, mask) in mb.iter_mut().enumerate() {
                        *mask |= 1 << range_h32(x.wrapping_add((j * L) as u64), L as u32);
                    }
                }
                for j in 0..LANES {
                    if ma[j].count_ones() as usize == ne && mb[j].count_ones() as usize == no {
                        for r in 0..L as u32 {
                            if ma[j] | rotl(mb[j], r, L as u32) == full {
                                return Ok(base + (j * L) as u64 + r as u64);
                            }
                        }
                    }
                }
            }
            base += (LANES * L) as u64;
            if base > self.watchdog {
                return Err(SolveError::Watchdog { keys: L });
            }
        }
    }

    /// First `d` splitting the keys into chunks of `unit` (spec §6.1), with 8-bit packed
    /// counters (spec §6.3): byte j counts child j; fanout ≤ 9, so child 8 adds nothing and the
    /// whole word is compared with the target.
    ///
    /// `LEVEL2` selects Agg2 (unit A1, seed S17) over Agg1 (unit ℓ, seed S18); both units are
    /// compile-time constants, so `/ unit` becomes a multiply and shift (spec §6.1).
    fn split_agg<const LEVEL2: bool>(&self, keys: &[u64]) -> std::result::Result<u64, SolveError> {
        let (unit, seed) = if LEVEL2 { (Self::A1, SEED_AGG2) } else { (L, SEED_AGG1) };
        let m = keys.len();
        let fanout = m.div_ceil(unit);
        let mut target = 0u64;
        for j in 0..fanout.min(8) {
            let count = if j + 1 < fanout { unit } else { m - (fanout - 1) * unit };
            target |= (count as u64) << (8 * j);
        }
        // One candidate at a time, vectorized across keys: the packed counters are a plain
        // wrapping-sum reduction, which LLVM turns into AVX2 lanes (8 keys per step).
        let mut d = 0u64;
        loop {
            let x0 = seed.wrapping_add(d);
            let counters = keys.iter().fold(0u64, |acc, &y| {
                let child = range_h32(y.wrapping_add(x0), m as u32) / unit as u32;
                // Branch-free: child 8 (fanout 9) adds nothing.
                acc.wrapping_add((1u64 << (child.wrapping_mul(8) & 63)) & 0u64.wrapping_sub((child < 8) as u64))
            });
            if counters == target {
                return Ok(d);
            }
            d += 1;
            if d > self.watchdog {
                return Err(SolveError::Watchdog { keys: m });
            }
        }
    }

    /// First `d` sending exactly `left` keys below `left` (spec §6.1, high levels).
    fn split_high(&self, keys: &[u64], left: usize, seed: u64) -> std::result::Result<u64, SolveError> {
        let m = keys.len();
        let mut d = 0u64;
        loop {
            let x0 = seed.wrapping_add(d);
            let below = keys
                .iter()
                .map(|&y| ((range_h32(y.wrapping_add(x0), m as u32) as usize) < left) as u32)
                .sum::<u32>();
            if below as usize == left {
                return Ok(d);
            }
            d += 1;
            if d > self.watchdog {
                return Err(SolveError::Watchdog { keys: m });
            }
        }
    }
}

/// `rotl_m(v, r)` on the low `m` bits (spec §0).
#[inline(always)]
pub fn rotl(v: u32, r: u32, m: u32) -> u32 {
    if r == 0 {
        v
    } else {
        ((v << r) | (v >> (m - r))) & ((1u32 << m) - 1)
    }
}

/// Moves keys so that child j occupies `[starts[j], starts[j+1])` (spec §6.2).
#[inline]
fn redistribute(keys: &mut [u64], scratch: &mut [u64], child_of: impl Fn(u64) -> usize, starts: &[usize]) {
    let mut cur = [0usize; 9];
    cur[..starts.len()].copy_from_slice(starts);
    for &y in keys.iter() {
        let c = child_of(y);
        scratch[cur[c]] = y;
        cur[c] += 1;
    }
    keys.copy_from_slice(&scratch[..keys.len()]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::build::DEFAULT_WATCHDOG;

    #[test]
    fn leaf_vectors() {
        // Spec §5.3 tiny example: plain search gives d = 2, rotation with ℓ = 4 gives D = 2.
        let keys = [
            0x1111111111111111u64,
            0x2222222222222222,
            0x3333333333333334,
            0x4444444444444447,
        ];
        let plain = Solver::<8> {
            rotation: false,
            watchdog: DEFAULT_WATCHDOG,
        }
        .leaf(&keys)
        .unwrap();
        assert_eq!(plain, 2);
        let vals: Vec<u32> = keys
            .iter()
            .map(|&y| range_h32(y.wrapping_add(SEED_LEAF).wrapping_add(2), 4))
            .collect();
        assert_eq!(vals, [0, 1, 2, 3]);
        let rot = Solver::<4> {
            rotation: true,
            watchdog: DEFAULT_WATCHDOG,
        }
        .leaf_rotated(&keys)
        .unwrap();
        assert_eq!(rot, 2);
    }

    #[test]
    fn watchdog_fires() {
        // Two equal keys can never be separated.
        let keys = [5u64, 5];
        let s = Solver::<8> {
            rotation: false,
            watchdog: 1000,
        };
        assert_eq!(s.leaf(&keys), Err(SolveError::Watchdog { keys: 2 }));
    }

    #[test]
    fn rotl_examples() {
        assert_eq!(rotl(0b1001, 2, 4), 0b0110);
        assert_eq!(rotl(0b1001, 0, 4), 0b1001);
        assert_eq!(rotl(0b1000, 1, 4), 0b0001);
    }
}

#[cfg(test)]
mod speed_probe {
    use super::*;
    use crate::core::build::DEFAULT_WATCHDOG;

    #[test]
    #[ignore = "timing probe, run by hand"]
    fn leaf_speed() {
        for m in [8usize, 12, 14] {
            let mut total = 0u64;
            let t = std::time::Instant::now();
            let s = Solver::<16> {
                rotation: false,
                watchdog: DEFAULT_WATCHDOG,
            };
            for leaf in 0..20u64 {
                let keys: Vec<u64> = (0..m as u64)
                    .map(|i| crate::core::hash::mix64(leaf * 100 + i + 1))
                    .collect();
                total += s.leaf(&keys).unwrap();
            }
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "m={m}: {} candidates, {:.2} ns/candidate, {:.3} ns/eval",
                total,
                secs * 1e9 / total as f64,
                secs * 1e9 / (total * m as u64) as f64
            );
        }
        for (level2, m) in [(false, 112usize), (true, 560)] {
            let s = Solver::<16> {
                rotation: false,
                watchdog: DEFAULT_WATCHDOG,
            };
            let t = std::time::Instant::now();
            let mut total = 0u64;
            for node in 0..2u64 {
                let keys: Vec<u64> = (0..m as u64)
                    .map(|i| crate::core::hash::mix64(node * 10000 + i + 1))
                    .collect();
                total += if level2 {
                    s.split_agg::<true>(&keys).unwrap()
                } else {
                    s.split_agg::<false>(&keys).unwrap()
                };
            }
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "split m={m}: {} candidates, {:.3} ns/eval",
                total,
                secs * 1e9 / (total * m as u64) as f64
            );
        }
    }
}
