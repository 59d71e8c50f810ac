//! Seeded synthetic data for the GPU query tests and `examples/gpu_query_bench.rs`: distinct
//! integer keys, probes (uniform with non-members, clustered runs, Zipf), slots and value
//! columns with NULLs, Parquet key files, and the GPU-vs-CPU comparisons.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, Float64Array, Int64Array, StringArray};
use arrow::buffer::NullBuffer;
use datafusion_mphf::core::column::{ColumnIndex, IndexOptions};
use datafusion_mphf::core::hash::mix64;
use datafusion_mphf::core::Params;
use datafusion_mphf::gpu::groupby::{GroupByResult, Values};
use datafusion_mphf::gpu::GpuIndex;
use datafusion_mphf::index::{FileStamp, SlotMaps};
use rayon::prelude::*;

/// Rows generated per parallel task (each task seeds its own generator from its index).
const GEN_CHUNK: usize = 1 << 16;

/// A splitmix64 generator.
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }
    /// Uniform in `0..n` (n > 0), by a 128-bit multiply.
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Fills `out` in parallel chunks; `f(rng, i)` gives row i.
pub fn par_fill<T: Send>(out: &mut [T], seed: u64, f: impl Fn(&mut Rng, usize) -> T + Sync) {
    out.par_chunks_mut(GEN_CHUNK).enumerate().for_each(|(c, o)| {
        let mut rng = Rng(mix64(seed ^ mix64(c as u64 + 1)));
        for (j, x) in o.iter_mut().enumerate() {
            *x = f(&mut rng, c * GEN_CHUNK + j);
        }
    });
}

/// The i-th distinct key (a bijection of i, so keys of distinct i differ); i ≥ n gives keys
/// outside a set of the first n.
pub fn key_of(i: u64) -> i64 {
    mix64(i ^ 0x5555_0000_AAAA_0000) as i64
}

/// Distinct keys 0..n.
pub fn member_keys(n: usize) -> Vec<i64> {
    let mut v = vec![0i64; n];
    v.par_iter_mut().enumerate().for_each(|(i, x)| *x = key_of(i as u64));
    v
}

/// A NULL mask with about `rate` NULLs (`None` when rate is 0).
pub fn nulls(rows: usize, rate: f64, seed: u64) -> Option<NullBuffer> {
    if rate <= 0.0 {
        return None;
    }
    let mut valid = vec![true; rows];
    par_fill(&mut valid, seed, |r, _| r.unit() >= rate);
    Some(NullBuffer::from(valid))
}

/// Zipf(s) over ranks 0..n: the cumulative weights, normalized to end at 1.
pub fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut c = Vec::with_capacity(n);
    let mut acc = 0.0;
    for k in 1..=n {
        acc += (k as f64).powf(-s);
        c.push(acc);
    }
    for x in &mut c {
        *x /= acc;
    }
    c
}

/// A rank drawn from a Zipf CDF.
pub fn zipf_rank(cdf: &[f64], r: &mut Rng) -> usize {
    let u = r.unit();
    cdf.partition_point(|&c| c <= u).min(cdf.len() - 1)
}

/// Probe and slot distributions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Dist {
    /// Uniform over the members (and 10 % non-members for probes).
    Uniform,
    /// Members in order, each repeated 1..=7 times (TPC-H `l_orderkey` clustering).
    Clustered,
    /// Zipf with exponent s over the members (rank k → member k).
    Zipf(f64),
}

impl Dist {
    /// Name for tables.
    pub fn name(&self) -> String {
        match self {
            Dist::Uniform => "uniform".into(),
            Dist::Clustered => "clustered".into(),
            Dist::Zipf(s) => format!("zipf {s}"),
        }
    }
}

/// Member indices (or indices ≥ n for non-members) of `rows` probe rows.
pub fn draw(rows: usize, n: usize, dist: Dist, seed: u64, non_members: bool) -> Vec<u64> {
    let mut out = vec![0u64; rows];
    if n == 0 {
        par_fill(&mut out, seed, |r, _| r.below(1000));
        return out;
    }
    match dist {
        Dist::Uniform => {
            let span = if non_members {
                n as u64 + (n as u64).div_ceil(10)
            } else {
                n as u64
            };
            par_fill(&mut out, seed, |r, _| r.below(span));
        }
        Dist::Clustered => {
            let mut r = Rng(seed);
            let (mut i, mut k) = (0usize, 0u64);
            while i < rows {
                let run = 1 + r.below(7) as usize;
                for x in out[i..(i + run).min(rows)].iter_mut() {
                    *x = k % n as u64;
                }
                i += run;
                k += 1;
            }
        }
        Dist::Zipf(s) => {
            let cdf = zipf_cdf(n, s);
            par_fill(&mut out, seed, |r, _| zipf_rank(&cdf, r) as u64);
        }
    }
    out
}

/// An Int64 probe column from member indices, with about `null_rate` NULLs.
pub fn int_probe(idx: &[u64], null_rate: f64, seed: u64) -> ArrayRef {
    let mut v = vec![0i64; idx.len()];
    v.par_iter_mut().zip(idx).for_each(|(x, &i)| *x = key_of(i));
    Arc::new(Int64Array::new(v.into(), nulls(idx.len(), null_rate, seed)))
}

/// The string form of key i.
pub fn str_key(i: u64) -> String {
    format!("k{:x}-{}", mix64(i), i % 97)
}

/// A Utf8 column from member indices.
pub fn str_probe(idx: &[u64], null_rate: f64, seed: u64) -> ArrayRef {
    let nb = nulls(idx.len(), null_rate, seed);
    let v: Vec<Option<String>> = idx
        .iter()
        .enumerate()
        .map(|(r, &i)| nb.as_ref().is_none_or(|m| m.is_valid(r)).then(|| str_key(i)))
        .collect();
    Arc::new(StringArray::from(v))
}

/// A column index over `keys` with `params`, solved on the GPU when one is usable.
pub fn build_index(keys: ArrayRef, params: Params) -> ColumnIndex {
    let (solver, _) =
        datafusion_mphf::placement::solver_for(datafusion_mphf::gpu::Device::Gpu, keys.len() as u64, &params);
    let opts = IndexOptions {
        params,
        seed: 0,
        threads: None,
        solver,
    };
    ColumnIndex::build(&[keys], &opts).expect("index build")
}

/// Slots of a GROUP BY test: `rows` slots of `groups` groups from `dist`, about `null_rate` of
/// them ABSENT (u32::MAX: NULL keys).
pub fn slots(rows: usize, groups: usize, dist: Dist, null_rate: f64, seed: u64) -> Vec<u32> {
    let idx = draw(rows, groups, dist, seed, false);
    let nb = nulls(rows, null_rate, seed ^ 77);
    idx.iter()
        .enumerate()
        .map(|(r, &i)| {
            if nb.as_ref().is_some_and(|m| m.is_null(r)) {
                u32::MAX
            } else {
                i as u32
            }
        })
        .collect()
}

/// An Int64 value column in [-10^6, 10^6] with about `null_rate` NULLs.
pub fn i64_values(rows: usize, null_rate: f64, seed: u64) -> ArrayRef {
    let mut v = vec![0i64; rows];
    par_fill(&mut v, seed, |r, _| r.below(2_000_001) as i64 - 1_000_000);
    Arc::new(Int64Array::new(v.into(), nulls(rows, null_rate, seed ^ 1)))
}

/// A Float64 value column in [0, 1000) with about `null_rate` NULLs.
pub fn f64_values(rows: usize, null_rate: f64, seed: u64) -> ArrayRef {
    let mut v = vec![0f64; rows];
    par_fill(&mut v, seed, |r, _| r.unit() * 1000.0);
    Arc::new(Float64Array::new(v.into(), nulls(rows, null_rate, seed ^ 2)))
}

/// Compares a GPU GROUP BY result with the CPU's: exact except f64 sums, whose largest relative
/// difference is returned (`Err` with the first difference otherwise or past `tol`).
pub fn compare(gpu: &GroupByResult, cpu: &GroupByResult, tol: f64) -> Result<f64, String> {
    if gpu.rows != cpu.rows {
        let (g, c) = (gpu.rows.as_ref(), cpu.rows.as_ref());
        let first = match (g, c) {
            (Some(g), Some(c)) => (0..g.len().min(c.len())).find(|&i| g[i] != c[i]),
            _ => None,
        };
        return Err(format!(
            "count(*) differs (first at group {first:?}: {:?} vs {:?})",
            first.and_then(|i| g.map(|g| g[i])),
            first.and_then(|i| c.map(|c| c[i]))
        ));
    }
    let mut worst = 0.0f64;
    for (ci, (g, c)) in gpu.columns.iter().zip(&cpu.columns).enumerate() {
        if g.non_null != c.non_null {
            return Err(format!("column {ci}: non-NULL counts differ"));
        }
        if g.min != c.min || g.max != c.max {
            return Err(format!("column {ci}: min/max differ"));
        }
        match (&g.sum, &c.sum) {
            (Some(Values::F64(a)), Some(Values::F64(b))) => {
                for (k, (x, y)) in a.iter().zip(b).enumerate() {
                    let rel = if x == y {
                        0.0
                    } else {
                        (x - y).abs() / y.abs().max(f64::MIN_POSITIVE)
                    };
                    worst = worst.max(rel);
                    if rel > tol {
                        return Err(format!("column {ci}: f64 sum of group {k}: {x} vs {y} (rel {rel:e})"));
                    }
                }
            }
            (a, b) => {
                if a != b {
                    return Err(format!("column {ci}: sums differ"));
                }
            }
        }
    }
    Ok(worst)
}

/// Index of the first differing element, if any.
pub fn first_diff<T: PartialEq + Sync>(a: &[T], b: &[T]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    (0..a.len()).into_par_iter().find_first(|&i| a[i] != b[i])
}

/// CPU slots of a probe on all cores (chunks of the probe through `lookup_slots`).
pub fn cpu_lookup(idx: &ColumnIndex, probe: &dyn Array) -> Vec<u64> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0u64; probe.len()];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(c, o)| {
        let s = probe.slice(c * CHUNK, o.len());
        let mut v = Vec::new();
        idx.lookup_slots(&s, &mut v).expect("cpu lookup");
        o.copy_from_slice(&v);
    });
    out
}

/// Writes `files` Parquet files of `rows` rows each into `dir`: one Int64 column `k` drawn
/// uniformly from the first `keys` member keys, about 1 % NULLs. Returns their stamps.
pub fn key_files(dir: &Path, files: usize, rows: usize, keys: usize) -> Vec<FileStamp> {
    (0..files)
        .map(|f| {
            let column = int_probe(&draw(rows, keys, Dist::Uniform, 100 + f as u64, false), 0.01, f as u64);
            let batch = arrow::record_batch::RecordBatch::try_from_iter([("k", column)]).expect("batch");
            let path = dir.join(format!("part-{f:03}.parquet"));
            let file = std::fs::File::create(&path).expect("create a key file");
            let mut writer = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
            writer.write(&batch).expect("write");
            writer.close().expect("close");
            FileStamp::of(&path).expect("stamp")
        })
        .collect()
}

/// Makes the slot maps of column `k` of `stamps` on the GPU `rounds` times, the files in
/// parallel as `CREATE INDEX` does (`SlotMaps::build_with`: one rayon job per file, each
/// upload and download filled on all cores), and compares every file's slots with the CPU's.
/// Returns the milliseconds of each round, or the first difference or failure.
pub fn parallel_slot_maps(idx: &ColumnIndex, stamps: &[FileStamp], rounds: usize) -> Result<Vec<f64>, String> {
    let cpu = SlotMaps::build(stamps, "k", idx).map_err(|e| format!("CPU slot maps: {e}"))?;
    let gpu = GpuIndex::new(idx).map_err(|e| format!("GPU index: {e}"))?;
    (0..rounds)
        .map(|round| {
            let t = Instant::now();
            let maps = SlotMaps::build_with(stamps, "k", idx, &gpu).map_err(|e| format!("round {round}: {e}"))?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            for stamp in stamps {
                let (g, c) = (maps.file(&stamp.path), cpu.file(&stamp.path));
                match (g, c) {
                    (Some(g), Some(c)) if g.slots == c.slots => {}
                    _ => return Err(format!("round {round}: {} differs from the CPU", stamp.path.display())),
                }
            }
            Ok(ms)
        })
        .collect()
}
