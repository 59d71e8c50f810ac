//! GPU build check and benchmark for the H200 (issue 5), without DataFusion:
//!
//! ```text
//! cargo build --release --no-default-features --features cuda --example gpu_bench
//! gpu_bench [--grid BUDGET MAX_N] [--bench] [--crossover] [--ns 5000000,50000000] [--reps 3] [--cap SECS] [--gpu-cap SECS]
//!           [--one ℓ,b,rot,n]... [--verify]
//! ```
//!
//! `--grid` runs the GPU-vs-CPU byte-equality grid (ℓ 2..=24, b in {5,50,100,500,2000}, rotation
//! off/on, n capped by estimated leaf work BUDGET and MAX_N). `--bench` times full builds
//! (hash, bucket, solve, encode) on the GPU and on the CPU (all cores) for the issue's
//! configurations and prints a markdown table; a GPU run predicted to exceed `--gpu-cap` seconds
//! is skipped, a CPU run predicted to exceed `--cap` seconds is made at a smaller n (the table
//! says so). `--one ℓ,b,rot,n` times GPU builds (the median of `--reps`, fewer when one build
//! passes `--gpu-cap` / 2 seconds; set MPHF_GPU_PROFILE=1 for stage times; `--verify` then
//! checks on the host that every key gets its own slot below n, and prints the process's peak
//! resident memory;
//! MPHF_BENCH_CLI_KEYS=1 uses the keys of `mphf bench build` instead of this harness's: at
//! (18, 50) with rotation the leaf stage is 2.8× slower on them, see benches/RESULTS-gpu.md).
//! `--crossover` times small inputs to place the `auto` threshold.

#[path = "../tests/gpu_grid/mod.rs"]
mod gpu_grid;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion_mphf::core::{BucketSolver, Builder, Mphf, Params};
use datafusion_mphf::gpu::{GpuContext, GpuSolver};
use gpu_grid::random_keys;

/// Wraps the GPU solver to record the time spent in `solve` (device work plus transfers).
struct Timed {
    inner: GpuSolver,
    last: Mutex<f64>,
}

impl BucketSolver for Timed {
    fn name(&self) -> &str {
        "gpu"
    }
    fn solve(&self, params: &Params, keys: &mut [u64], offsets: &[u64]) -> Result<Vec<u64>, String> {
        let t = Instant::now();
        let r = self.inner.solve(params, keys, offsets);
        *self.last.lock().unwrap() = t.elapsed().as_secs_f64();
        r
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct Opts {
    grid: Option<(f64, usize)>,
    bench: bool,
    crossover: bool,
    one: Vec<(usize, usize, bool, usize)>,
    ns: Vec<usize>,
    reps: usize,
    cap: f64,
    gpu_cap: f64,
    verify: bool,
}

fn parse() -> Opts {
    let mut o = Opts {
        grid: None,
        bench: false,
        crossover: false,
        one: Vec::new(),
        ns: vec![5_000_000, 50_000_000],
        reps: 3,
        cap: 10.0,
        gpu_cap: 60.0,
        verify: false,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--grid" => {
                o.grid = Some((args[i + 1].parse().unwrap(), args[i + 2].parse().unwrap()));
                i += 2;
            }
            "--bench" => o.bench = true,
            "--crossover" => o.crossover = true,
            "--verify" => o.verify = true,
            "--one" => {
                let v: Vec<usize> = args[i + 1].split(',').map(|s| s.parse().unwrap()).collect();
                o.one.push((v[0], v[1], v[2] != 0, v[3]));
                i += 1;
            }
            "--ns" => {
                o.ns = args[i + 1].split(',').map(|s| s.parse().unwrap()).collect();
                i += 1;
            }
            "--reps" => {
                o.reps = args[i + 1].parse().unwrap();
                i += 1;
            }
            "--gpu-cap" => {
                o.gpu_cap = args[i + 1].parse().unwrap();
                i += 1;
            }
            "--cap" => {
                o.cap = args[i + 1].parse().unwrap();
                i += 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 1;
    }
    o
}

/// Builds `reps` times (fewer when one build is slow); returns (median seconds, GPU solve
/// seconds of the last run, the MPHF).
fn timed_build(params: Params, keys: &[u64], solver: Option<&Arc<Timed>>, reps: usize, cap: f64) -> (f64, f64, Mphf) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..reps.max(1) {
        let b = Builder::new(params).solver(solver.map(|s| s.clone() as Arc<dyn BucketSolver>));
        let t = Instant::now();
        let (m, report) = b.build_with_report(keys).expect("build failed");
        times.push(t.elapsed().as_secs_f64());
        if solver.is_some() {
            assert!(
                report.fallback_notice.is_none(),
                "GPU fell back: {:?}",
                report.fallback_notice
            );
        }
        last = Some(m);
        if times.iter().sum::<f64>() * 2.0 > cap {
            break;
        }
    }
    let solve = solver.map(|s| *s.last.lock().unwrap()).unwrap_or(0.0);
    (median(times), solve, last.unwrap())
}

/// The first reason `m` is not a bijection from `keys` onto `0..n`, checked on all cores with
/// one bit per slot.
fn first_collision(m: &Mphf, keys: &[u64]) -> Option<String> {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    let n = keys.len() as u64;
    if m.len() != n {
        return Some(format!("{} slots for {n} keys", m.len()));
    }
    let seen: Vec<AtomicU64> = (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
    keys.par_iter().find_map_any(|k| {
        let s = m.index(k);
        if s >= n {
            return Some(format!("key {k} has slot {s} ≥ {n}"));
        }
        let bit = 1u64 << (s % 64);
        let before = seen[(s / 64) as usize].fetch_or(bit, Ordering::Relaxed);
        (before & bit != 0).then(|| format!("slot {s} taken twice (key {k})"))
    })
}

/// The process's peak resident memory (`VmHWM` of /proc/self/status).
fn peak_rss() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(format!("{:.2} GiB", kib / 2f64.powi(20)))
}

fn main() {
    let o = parse();
    let ctx = GpuContext::get().unwrap_or_else(|e| {
        eprintln!("no GPU: {e}");
        std::process::exit(2)
    });
    let (free, total) = ctx.memory().unwrap();
    println!(
        "device: {} ({}), {:.1}/{:.1} GiB free, {} CPU threads",
        ctx.name(),
        ctx.arch(),
        free as f64 / 2f64.powi(30),
        total as f64 / 2f64.powi(30),
        rayon::current_num_threads()
    );
    let solver = Arc::new(Timed {
        inner: GpuSolver::new(ctx.clone()),
        last: Mutex::new(0.0),
    });

    if let Some((budget, max_n)) = o.grid {
        let t = Instant::now();
        let (checked, failures) = gpu_grid::run_grid(budget, max_n, true).unwrap();
        println!(
            "GRID: {checked} points, {} failures, {:.1} s",
            failures.len(),
            t.elapsed().as_secs_f64()
        );
        for f in &failures {
            println!("FAIL {f}");
        }
        for chunk in [1, 5000, 65_536] {
            let (checked, failures) = gpu_grid::run_chunked(chunk).unwrap();
            println!("CHUNKED {chunk}: {checked} points, {} failures", failures.len());
            for f in &failures {
                println!("FAIL {f}");
            }
        }
    }

    for &(leaf, bucket, rotation, n) in &o.one {
        let p = Params::try_new(leaf, bucket, rotation).unwrap();
        let _ = timed_build(p, &random_keys(5000, 3), Some(&solver), 1, 1.0);
        // `MPHF_BENCH_CLI_KEYS=1`: the keys of `mphf bench build` (to compare the two harnesses).
        let keys = if std::env::var_os("MPHF_BENCH_CLI_KEYS").is_some() {
            (0..n as u64)
                .map(|i| datafusion_mphf::core::hash::mix64(i ^ datafusion_mphf::core::hash::mix64(42)))
                .collect()
        } else {
            random_keys(n, 42)
        };
        let (t, s, m) = timed_build(p, &keys, Some(&solver), o.reps, o.gpu_cap);
        println!(
            "ONE ({leaf},{bucket}) rot={rotation} n={n}: total {:.4} µs/key, solve {:.4} µs/key, {:.4} bits/key",
            t * 1e6 / n as f64,
            s * 1e6 / n as f64,
            m.bits_per_key()
        );
        if o.verify {
            let t = Instant::now();
            let verdict = match first_collision(&m, &keys) {
                None => "ok".to_string(),
                Some(why) => format!("FAILED ({why})"),
            };
            println!(
                "VERIFY ({leaf},{bucket}) n={n}: bijection {verdict} in {:.1} s; peak host memory {}",
                t.elapsed().as_secs_f64(),
                peak_rss().unwrap_or_else(|| "unknown".into())
            );
        }
    }

    if o.crossover {
        println!("\n| n | CPU µs/key | GPU µs/key |\n|---|---|---|");
        for &(leaf, bucket) in &[(8usize, 100usize), (12, 2000)] {
            let p = Params::try_new(leaf, bucket, false).unwrap();
            let _ = timed_build(p, &random_keys(1000, 1), Some(&solver), 1, 1.0);
            for n in [10_000usize, 100_000, 300_000, 1_000_000, 3_000_000] {
                let keys = random_keys(n, 7);
                let (c, _, cm) = timed_build(p, &keys, None, 3, 20.0);
                let (g, _, gm) = timed_build(p, &keys, Some(&solver), 3, 20.0);
                assert_eq!(cm.write_bytes(), gm.write_bytes());
                println!(
                    "| ({leaf},{bucket}) n={n} | {:.3} | {:.3} |",
                    c * 1e6 / n as f64,
                    g * 1e6 / n as f64
                );
            }
        }
    }

    if o.bench {
        let mut rows = Vec::new();
        let configs = [(5usize, 5usize), (8, 100), (12, 2000), (16, 2000), (18, 50)];
        for &(leaf, bucket) in &configs {
            for rotation in [false, true] {
                let p = Params::try_new(leaf, bucket, rotation).unwrap();
                // Warm-up: compile and load the module outside the timings.
                let _ = timed_build(p, &random_keys(5000, 3), Some(&solver), 1, 1.0);
                let mut gpu_rate: Option<f64> = None; // seconds per key measured at the previous n
                let mut cpu_rate: Option<f64> = None;
                for &n in &o.ns {
                    let keys = random_keys(n, 42);
                    let row_head = format!("| ({leaf},{bucket}) | {} | {n} |", if rotation { "on" } else { "off" });
                    // GPU
                    let predicted = gpu_rate.map(|r| r * n as f64).unwrap_or(0.0);
                    let gpu = if predicted > o.gpu_cap {
                        None
                    } else {
                        Some(timed_build(p, &keys, Some(&solver), o.reps, o.gpu_cap))
                    };
                    if let Some((t, _, _)) = &gpu {
                        gpu_rate = Some(t / n as f64);
                    }
                    // CPU: pilot on a small sample when there is no rate yet.
                    if cpu_rate.is_none() {
                        let pilot = (n / 200).max(20_000).min(n);
                        let (t, _, _) = timed_build(p, &keys[..pilot], None, 1, o.cap);
                        cpu_rate = Some(t / pilot as f64);
                    }
                    let cpu_n = ((o.cap / cpu_rate.unwrap()) as usize).clamp(10_000, n);
                    let cpu_keys = &keys[..cpu_n];
                    let (ct, _, cm) = timed_build(p, cpu_keys, None, o.reps, o.cap);
                    cpu_rate = Some(ct / cpu_n as f64);
                    // Equality at the CPU's n.
                    let equal = match &gpu {
                        Some((_, _, gm)) if cpu_n == n => gm.write_bytes() == cm.write_bytes(),
                        _ => {
                            let (_, _, gm) = timed_build(p, cpu_keys, Some(&solver), 1, o.cap);
                            gm.write_bytes() == cm.write_bytes()
                        }
                    };
                    let (gcol, scol, bits) = match &gpu {
                        Some((t, s, gm)) => (
                            format!("{:.4}", t * 1e6 / n as f64),
                            format!("{:.4}", s * 1e6 / n as f64),
                            format!("{:.4}", gm.bits_per_key()),
                        ),
                        None => (
                            format!("skipped (~{predicted:.0} s)"),
                            "-".into(),
                            format!("{:.4}*", cm.bits_per_key()),
                        ),
                    };
                    let cnote = if cpu_n == n {
                        String::new()
                    } else {
                        format!(" (n={cpu_n})")
                    };
                    let speedup = gpu
                        .as_ref()
                        .map(|(t, _, _)| format!("{:.1}×", (ct / cpu_n as f64) / (t / n as f64)));
                    let row = format!(
                        "{row_head} {bits} | {gcol} | {scol} | {:.4}{cnote} | {} | {} |",
                        ct * 1e6 / cpu_n as f64,
                        speedup.unwrap_or_else(|| "-".into()),
                        if equal { "yes" } else { "NO" }
                    );
                    println!("{row}");
                    rows.push(row);
                }
            }
        }
        println!(
            "\n| (ℓ,b) | rot | n | bits/key | GPU µs/key | GPU solve µs/key | CPU µs/key | speedup | bytes equal |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for r in rows {
            println!("{r}");
        }
    }
}
