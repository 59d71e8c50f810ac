//! `mphf bench build`: the comparison harness of the MPHF core (issue 2, item 9).
//!
//! Builds and queries the same random `u64` keys with our RecSplit over a grid of (ℓ, b) with and
//! without rotation, and — in the same process run — with the `ptr_hash` crate (PtrHash, default
//! parameters) and the `ph` crate (FMPHGO, default configuration). Prints one table: method,
//! bits/key, build ns/key, single-query ns, batched-query ns (each time the median of `--runs`).
//!
//! GPU builds are timed after a warm-up build that compiles the kernels (once per process).
//!
//! Single queries are a plain loop over a shuffled sample of the keys; batched queries use each
//! method's streaming API (our `index_batch`, PtrHash's `index_stream`; FMPHGO has none).

use std::hint::black_box;
use std::time::Instant;

use clap::Args;

use crate::core::hash::mix64;
use crate::core::{Builder, Params};

/// Arguments of `mphf bench build`.
#[derive(Debug, Clone, Args)]
pub struct BenchBuildArgs {
    /// Key counts to test (comma separated), e.g. 1000000,10000000.
    #[arg(long, value_delimiter = ',', default_value = "1000000,10000000")]
    pub keys: Vec<usize>,
    /// (ℓ,b) pairs as `l:b` (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "5:5,8:100,12:100,16:2000")]
    pub grid: Vec<String>,
    /// Repetitions per measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Queries per query measurement.
    #[arg(long, default_value_t = 2_000_000)]
    pub queries: usize,
    /// Only these methods: recsplit, ptrhash, fmphgo (comma separated; default all).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Skip configurations whose build would exceed this many seconds per run (estimated from
    /// the first run); 0 disables.
    #[arg(long, default_value_t = 120.0)]
    pub max_build_secs: f64,
    /// Device of the RecSplit builds: auto, cpu or gpu (the peers always run on the CPU).
    #[arg(long, default_value_t = crate::device::Device::Cpu)]
    pub device: crate::device::Device,
}

/// One row of the result table.
#[derive(Debug, Clone)]
pub struct BenchRow {
    /// Method and parameters.
    pub method: String,
    /// Keys.
    pub n: usize,
    /// Bits per key.
    pub bits_per_key: f64,
    /// Median build time per key (ns).
    pub build_ns: f64,
    /// Median single-query time (ns).
    pub query_ns: f64,
    /// Median batched-query time per key (ns); `None` without a batch API.
    pub batch_ns: Option<f64>,
}

/// Deterministic pseudo-random keys (distinct: `mix64` is a bijection of the counter).
pub fn random_keys(n: usize, seed: u64) -> Vec<u64> {
    (0..n as u64).map(|i| mix64(i ^ mix64(seed))).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn time<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_secs_f64())
}

fn wanted(args: &BenchBuildArgs, method: &str) -> bool {
    args.only.is_empty() || args.only.iter().any(|m| m.eq_ignore_ascii_case(method))
}

/// Builds a few thousand keys with `params` on `device` before the timed builds, so that they
/// do not include the one-time, per-process compilation of the GPU kernels for (ℓ, rotation)
/// (NVRTC takes up to seconds for large ℓ, which a single timed build of 5·10^6 keys would
/// charge as 0.1–0.6 µs per key); prints that time.
fn warm_up(device: crate::device::Device, n: usize, params: &Params) -> anyhow::Result<()> {
    let (solver, _) = crate::placement::solver_for(device, n as u64, params);
    if solver.is_none() {
        return Ok(());
    }
    let keys = random_keys(5000, 7);
    let (built, secs) = time(|| Builder::new(*params).solver(solver).build(&keys));
    built?;
    eprintln!(
        "warm-up (ℓ={}, b={}, rotation={}): {secs:.2} s (kernel compilation, not in the timings)",
        params.leaf, params.bucket, params.rotation
    );
    Ok(())
}

/// Parses `l:b`.
fn parse_pair(s: &str) -> anyhow::Result<(usize, usize)> {
    let (l, b) = s
        .split_once(':')
        .ok_or_else(|| anyhow::anyhow!("grid entry {s:?} is not l:b"))?;
    Ok((l.trim().parse()?, b.trim().parse()?))
}

/// Runs the harness and returns its rows (also printed as they complete).
pub fn run(args: &BenchBuildArgs) -> anyhow::Result<Vec<BenchRow>> {
    let mut rows = Vec::new();
    let threads = rayon::current_num_threads();
    eprintln!("bench build: {threads} threads, median of {} runs", args.runs);
    for &n in &args.keys {
        let keys = random_keys(n, 42);
        let mut sample: Vec<u64> = (0..args.queries.min(n.max(1)) as u64)
            .map(|i| keys[(mix64(i + 7) % n.max(1) as u64) as usize])
            .collect();
        if n == 0 {
            sample.clear();
        }
        let nq = sample.len().max(1) as f64;
        if wanted(args, "recsplit") {
            for pair in &args.grid {
                let (leaf, bucket) = parse_pair(pair)?;
                for rotation in [false, true] {
                    let params = Params::try_new(leaf, bucket, rotation)?;
                    warm_up(args.device, n, &params)?;
                    let mut builds = Vec::new();
                    let mut mphf = None;
                    for _ in 0..args.runs {
                        let (solver, notice) = crate::placement::solver_for(args.device, n as u64, &params);
                        if let Some(notice) = notice {
                            eprintln!("{notice}");
                        }
                        let builder = Builder::new(params).solver(solver);
                        let (m, secs) = time(|| builder.build(&keys));
                        builds.push(secs);
                        mphf = Some(m?);
                        if args.max_build_secs > 0.0 && secs > args.max_build_secs {
                            break;
                        }
                    }
                    let mphf = mphf.expect("runs ≥ 1");
                    let q = median(
                        (0..args.runs)
                            .map(|_| {
                                time(|| {
                                    let mut acc = 0u64;
                                    for k in &sample {
                                        acc = acc.wrapping_add(mphf.index(k));
                                    }
                                    black_box(acc)
                                })
                                .1
                            })
                            .collect(),
                    );
                    let mut out = vec![0u64; sample.len()];
                    let qb = median(
                        (0..args.runs)
                            .map(|_| {
                                time(|| {
                                    for (c, o) in sample.chunks(8192).zip(out.chunks_mut(8192)) {
                                        mphf.index_batch(c, o);
                                    }
                                    black_box(out[0])
                                })
                                .1
                            })
                            .collect(),
                    );
                    let row = BenchRow {
                        method: format!("RecSplit ℓ={leaf} b={bucket}{}", if rotation { " rot" } else { "" }),
                        n,
                        bits_per_key: mphf.bits_per_key(),
                        build_ns: median(builds) * 1e9 / n.max(1) as f64,
                        query_ns: q * 1e9 / nq,
                        batch_ns: Some(qb * 1e9 / nq),
                    };
                    eprintln!("{}", format_row(&row));
                    rows.push(row);
                }
            }
        }
        if wanted(args, "ptrhash") && n > 0 {
            type Ph = ptr_hash::DefaultPtrHash<ptr_hash::hash::FastIntHash, u64>;
            let mut builds = Vec::new();
            let mut f = None;
            for _ in 0..args.runs {
                let (m, secs) = time(|| Ph::new(&keys, ptr_hash::PtrHashParams::default()));
                builds.push(secs);
                f = Some(m);
            }
            let f = f.expect("runs ≥ 1");
            let q = median(
                (0..args.runs)
                    .map(|_| {
                        time(|| {
                            let mut acc = 0usize;
                            for k in &sample {
                                acc = acc.wrapping_add(f.index(k));
                            }
                            black_box(acc)
                        })
                        .1
                    })
                    .collect(),
            );
            let qb = median(
                (0..args.runs)
                    .map(|_| {
                        time(|| black_box(f.index_stream::<32, _>(&sample).fold(0usize, |a, x| a.wrapping_add(x)))).1
                    })
                    .collect(),
            );
            let (pilots, remap) = f.bits_per_element();
            let row = BenchRow {
                method: "PtrHash (default)".into(),
                n,
                bits_per_key: pilots + remap,
                build_ns: median(builds) * 1e9 / n as f64,
                query_ns: q * 1e9 / nq,
                batch_ns: Some(qb * 1e9 / nq),
            };
            eprintln!("{}", format_row(&row));
            rows.push(row);
        }
        if wanted(args, "fmphgo") && n > 0 {
            use ph::GetSize;
            let mut builds = Vec::new();
            let mut f = None;
            for _ in 0..args.runs {
                let (m, secs) = time(|| ph::fmph::GOFunction::from_slice(&keys));
                builds.push(secs);
                f = Some(m);
            }
            let f = f.expect("runs ≥ 1");
            let q = median(
                (0..args.runs)
                    .map(|_| {
                        time(|| {
                            let mut acc = 0u64;
                            for k in &sample {
                                acc = acc.wrapping_add(f.get(k).unwrap_or(0));
                            }
                            black_box(acc)
                        })
                        .1
                    })
                    .collect(),
            );
            let row = BenchRow {
                method: "FMPHGO (ph)".into(),
                n,
                bits_per_key: f.size_bytes() as f64 * 8.0 / n as f64,
                build_ns: median(builds) * 1e9 / n as f64,
                query_ns: q * 1e9 / nq,
                batch_ns: None,
            };
            eprintln!("{}", format_row(&row));
            rows.push(row);
        }
    }
    println!("{}", format_table(&rows));
    Ok(rows)
}

fn format_row(r: &BenchRow) -> String {
    format!(
        "| {} | {} | {:.3} | {:.1} | {:.1} | {} |",
        r.method,
        r.n,
        r.bits_per_key,
        r.build_ns,
        r.query_ns,
        r.batch_ns.map_or("n/a".to_string(), |b| format!("{b:.1}"))
    )
}

/// The result table as markdown.
pub fn format_table(rows: &[BenchRow]) -> String {
    let mut s = String::from(
        "| method | keys | bits/key | build ns/key | single query ns | batched query ns |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s.push_str(&format_row(r));
        s.push('\n');
    }
    s
}
