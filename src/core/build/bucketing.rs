//! Steps 1–2 of the build: keys hashed and counting-sorted by bucket (two parallel passes, see
//! the parent module), then each bucket checked for the size cap and a repeated `lo`.

use rayon::prelude::*;

use super::{reserved_for_keys, KeySet};
use crate::core::hash::{bucket_of, Hash128};
use crate::core::params::MAX_BUCKET_KEYS;
use crate::error::{Result, SolveError};

/// A raw pointer that rayon tasks may share; every user writes disjoint positions.
#[derive(Clone, Copy)]
struct SharedMut<T>(*mut T);
// SAFETY: used only for writes to disjoint indices, proven at each use site.
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the whole `Send` wrapper, not the field).
    fn get(self) -> *mut T {
        self.0
    }
}

/// Sorts the keys' `lo` hashes by bucket: returns `lo` (bucket-contiguous) and bucket offsets
/// (λ, length B+1). See the parent module's docs for the two-step counting sort.
///
/// # Errors
/// [`MphfError::OutOfMemory`] when the per-key arrays cannot be allocated.
pub fn bucketize<K: KeySet + ?Sized>(keys: &K, seed: u64, num_buckets: u64) -> Result<(Vec<u64>, Vec<u64>)> {
    let n = keys.len();
    let num_ranges = num_buckets.min(4096) as usize;
    let range_of = |b: u64| ((b as u128 * num_ranges as u128) / num_buckets as u128) as usize;
    let first_bucket = |p: usize| ((p as u128 * num_buckets as u128).div_ceil(num_ranges as u128)) as u64;
    let chunk = (n / (4 * rayon::current_num_threads()).max(1)).clamp(1 << 14, 1 << 22);
    let num_chunks = n.div_ceil(chunk).max(1);

    // Step 1a: per-chunk histograms over ranges.
    let hists: Vec<Vec<u64>> = (0..num_chunks)
        .into_par_iter()
        .map(|c| {
            let mut h = vec![0u64; num_ranges];
            for i in c * chunk..((c + 1) * chunk).min(n) {
                let hash = keys.hash128(i, seed);
                h[range_of(bucket_of(hash.hi, num_buckets))] += 1;
            }
            h
        })
        .collect();
    // Prefix sums in (range, chunk) order give each chunk's cursor per range.
    let mut cursors = vec![vec![0u64; num_ranges]; num_chunks];
    let mut range_start = vec![0u64; num_ranges + 1];
    let mut acc = 0u64;
    for p in 0..num_ranges {
        range_start[p] = acc;
        for c in 0..num_chunks {
            cursors[c][p] = acc;
            acc += hists[c][p];
        }
    }
    range_start[num_ranges] = acc;
    drop(hists);

    // Step 1b: scatter (hi, lo) into range order.
    // Neither array is zero-filled first: the scatters below write every position exactly once,
    // and they do it on all threads, so the pages are also first touched in parallel.
    let mut tmp: Vec<Hash128> = reserved_for_keys(n, "the bucket order")?;
    let out = SharedMut(tmp.as_mut_ptr());
    cursors.into_par_iter().enumerate().for_each(|(c, mut cur)| {
        for i in c * chunk..((c + 1) * chunk).min(n) {
            let hash = keys.hash128(i, seed);
            let p = range_of(bucket_of(hash.hi, num_buckets));
            // SAFETY: cursor (c, p) walks the slots [start(c,p), start(c,p)+hist[c][p]), and these
            // intervals are disjoint across (c, p) and cover 0..n exactly (prefix sums above).
            unsafe { out.get().add(cur[p] as usize).write(hash) };
            cur[p] += 1;
        }
    });
    // SAFETY: the cursor intervals cover 0..n exactly (prefix sums above), so every element of
    // the capacity-n allocation was written once; Hash128 is plain data.
    unsafe { tmp.set_len(n) };

    // Step 2: counting sort inside each range; fills λ for the range's buckets.
    let mut lo: Vec<u64> = reserved_for_keys(n, "the in-bucket hashes")?;
    let mut offsets = vec![0u64; num_buckets as usize + 1];
    let lo_ptr = SharedMut(lo.as_mut_ptr());
    let off_ptr = SharedMut(offsets.as_mut_ptr());
    (0..num_ranges).into_par_iter().for_each(|p| {
        let (s, e) = (range_start[p] as usize, range_start[p + 1] as usize);
        let (b0, b1) = (first_bucket(p), first_bucket(p + 1));
        // SAFETY: buckets b0..b1 belong to range p alone, so no other task touches these λ slots.
        let starts = unsafe { std::slice::from_raw_parts_mut(off_ptr.get().add(b0 as usize), (b1 - b0) as usize) };
        sort_by_bucket(tmp[s..e].iter(), b0, num_buckets, s as u64, starts, |at, lo| {
            // SAFETY: the positions of this range stay inside [s, e), which no other range touches.
            unsafe { lo_ptr.get().add(at).write(lo) }
        });
    });
    // SAFETY: range p writes exactly the positions [range_start[p], range_start[p+1]) (its
    // counting-sort cursors start at s and advance once per key of the range), and the ranges
    // tile 0..n; so all n elements of the capacity-n allocation were written.
    unsafe { lo.set_len(n) };
    offsets[num_buckets as usize] = n as u64;
    Ok((lo, offsets))
}

/// Counting sort by bucket of hashes whose buckets all lie in `b0 .. b0 + starts.len()`: sets
/// `starts[k]` to the position of bucket `b0 + k`'s first key (positions from `base`), and hands
/// every hash's `lo` to `put` with its position.
pub(in crate::core) fn sort_by_bucket<'a>(
    src: impl Iterator<Item = &'a Hash128> + Clone,
    b0: u64,
    num_buckets: u64,
    base: u64,
    starts: &mut [u64],
    mut put: impl FnMut(usize, u64),
) {
    starts.fill(0);
    for h in src.clone() {
        starts[(bucket_of(h.hi, num_buckets) - b0) as usize] += 1;
    }
    let mut pos = base;
    for start in starts.iter_mut() {
        let count = *start;
        *start = pos;
        pos += count;
    }
    let mut cursor = starts.to_vec();
    for h in src {
        let c = &mut cursor[(bucket_of(h.hi, num_buckets) - b0) as usize];
        put(*c as usize, h.lo);
        *c += 1;
    }
}

/// Checks every bucket for the size cap and repeated `lo` (sorting each bucket); reports the
/// failure of the first offending bucket.
pub fn check_buckets(lo: &mut [u64], offsets: &[u64]) -> std::result::Result<(), SolveError> {
    let slices = split_buckets(lo, offsets, 1 << 16);
    let first_err = slices
        .into_par_iter()
        .map(|(b0, b1, keys)| {
            let base = offsets[b0];
            for b in b0..b1 {
                let (s, e) = ((offsets[b] - base) as usize, (offsets[b + 1] - base) as usize);
                if e - s >= MAX_BUCKET_KEYS {
                    return Err(SolveError::BucketTooLarge {
                        bucket: b as u64,
                        size: e - s,
                    });
                }
                let keys = &mut keys[s..e];
                keys.sort_unstable();
                if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
                    return Err(SolveError::DuplicateLo {
                        bucket: b as u64,
                        lo: w[0],
                    });
                }
            }
            Ok(())
        })
        .collect::<Vec<_>>();
    first_err.into_iter().find(|r| r.is_err()).unwrap_or(Ok(()))
}

/// Splits the bucket-contiguous keys into chunks of whole buckets of about `target` keys;
/// yields (first bucket, end bucket, keys).
pub(super) fn split_buckets<'a>(
    mut lo: &'a mut [u64],
    offsets: &[u64],
    target: u64,
) -> Vec<(usize, usize, &'a mut [u64])> {
    let num_buckets = offsets.len() - 1;
    let mut out = Vec::new();
    let mut b = 0usize;
    while b < num_buckets {
        let start = offsets[b];
        let mut e = b + 1;
        while e < num_buckets && offsets[e] - start < target {
            e += 1;
        }
        let len = (offsets[e] - start) as usize;
        let (head, tail) = std::mem::take(&mut lo).split_at_mut(len);
        out.push((b, e, head));
        lo = tail;
        b = e;
    }
    out
}
