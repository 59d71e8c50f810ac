//! Where a build side's CPU work runs: on all cores (rayon), or on the thread that reads it.
//!
//! Why: a collect-form join has one build, which every probe partition waits for, so its
//! lookups, concatenation and layout run on all cores. A `Partitioned` join runs one build per
//! partition, all at once, on the engine's threads; each of them handing its work to the one
//! rayon pool queues them all behind each other there, while the engine's threads (busy reading
//! and repartitioning the probe side) compete with the pool for the same cores: on 16 cores the
//! builds' layouts took many times longer than on the builds' own threads (benches/RESULTS.md,
//! session 39). With at least as many builds at once as rayon has threads,
//! each build runs on its own thread, as DataFusion's own hash join builds do.
//!
//! # Invariants
//! - Both forms give the same results in the same order: [`BuildThreads::map_ranges`] returns
//!   one result per range, ranges in ascending order, covering `0..len` once.

use std::ops::Range;

use rayon::prelude::*;

/// Where a build's CPU work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildThreads {
    /// Split into chunks that rayon runs on all cores (one build at a time).
    AllCores,
    /// On the calling thread, in one piece (as many builds at once as there are cores).
    Caller,
}

impl BuildThreads {
    /// For a join that runs `builds` builds at once: on the caller when they are at least as
    /// many as rayon's threads, on all cores otherwise.
    pub fn for_builds_at_once(builds: usize) -> Self {
        match builds >= rayon::current_num_threads() {
            true => Self::Caller,
            false => Self::AllCores,
        }
    }

    /// Threads the work is spread over: rayon's on all cores, 1 on the caller.
    pub fn spread(self) -> usize {
        match self {
            Self::AllCores => rayon::current_num_threads(),
            Self::Caller => 1,
        }
    }

    /// `f` over `0..len`: in ranges of `chunk` on all cores, or as one range on the caller.
    /// The results come back in range order (none for `len == 0` on all cores, one on the
    /// caller).
    pub fn map_ranges<R: Send>(self, len: usize, chunk: usize, f: impl Fn(Range<usize>) -> R + Sync + Send) -> Vec<R> {
        match self {
            Self::Caller => vec![f(0..len)],
            Self::AllCores => par_ranges(len, chunk).map(f).collect(),
        }
    }

    /// The vectors `f` makes of the ranges of `0..len` (see [`BuildThreads::map_ranges`]),
    /// concatenated in range order; on the caller, `f`'s one vector as it is.
    pub fn concat_ranges<T: Send>(
        self,
        len: usize,
        chunk: usize,
        f: impl Fn(Range<usize>) -> Vec<T> + Sync + Send,
    ) -> Vec<T> {
        match self {
            Self::Caller => f(0..len),
            Self::AllCores => par_ranges(len, chunk).flat_map_iter(f).collect(),
        }
    }

    /// As [`BuildThreads::concat_ranges`] for an `f` that may fail: the first error in range
    /// order, or the vectors concatenated (one range's vector as it is, without a copy).
    ///
    /// # Errors
    /// The error of the first range that fails.
    pub fn try_concat_ranges<T: Send, E: Send>(
        self,
        len: usize,
        chunk: usize,
        f: impl Fn(Range<usize>) -> Result<Vec<T>, E> + Sync + Send,
    ) -> Result<Vec<T>, E> {
        let mut parts = self
            .map_ranges(len, chunk, f)
            .into_iter()
            .collect::<Result<Vec<_>, E>>()?;
        Ok(match parts.len() {
            1 => parts.pop().unwrap_or_default(),
            _ => parts.into_iter().flatten().collect(),
        })
    }
}

/// The ranges of `chunk` items (at least 1) that cover `0..len` in order, for rayon.
fn par_ranges(len: usize, chunk: usize) -> impl IndexedParallelIterator<Item = Range<usize>> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk))
        .into_par_iter()
        .map(move |c| c * chunk..len.min((c + 1) * chunk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_cover_every_item_once_in_order() {
        for len in [0, 1, 7, 64, 1000] {
            let expected: Vec<usize> = (0..len).collect();
            for threads in [BuildThreads::AllCores, BuildThreads::Caller] {
                let got: Vec<usize> = threads.map_ranges(len, 7, |r| r.collect::<Vec<_>>()).concat();
                assert_eq!(got, expected, "{threads:?}, {len} items");
                assert_eq!(threads.concat_ranges(len, 7, |r| r.collect()), expected);
                assert_eq!(
                    threads.try_concat_ranges(len, 7, |r| Ok::<_, ()>(r.collect())),
                    Ok(expected.clone())
                );
                let failing = threads.try_concat_ranges(len, 7, |r| match r.contains(&5) {
                    true => Err(r.start),
                    false => Ok(r.collect()),
                });
                // Item 5 lies in the range that starts at 0 in both forms (ranges of 7, or one).
                assert_eq!(failing, if len > 5 { Err(0) } else { Ok(expected.clone()) });
            }
        }
        assert_eq!(BuildThreads::Caller.map_ranges(10, 3, |r| r.len()), vec![10]);
        assert_eq!(BuildThreads::AllCores.map_ranges(10, 3, |r| r.len()), vec![3, 3, 3, 1]);
    }

    #[test]
    fn as_many_builds_as_threads_run_on_the_caller() {
        let threads = rayon::current_num_threads();
        assert_eq!(BuildThreads::for_builds_at_once(threads), BuildThreads::Caller);
        assert_eq!(BuildThreads::for_builds_at_once(threads + 1), BuildThreads::Caller);
        assert_eq!(
            BuildThreads::for_builds_at_once(1),
            match threads {
                1 => BuildThreads::Caller,
                _ => BuildThreads::AllCores,
            }
        );
    }
}
