//! GPU query path check and benchmark for the H200 (issue 7), without DataFusion:
//!
//! ```text
//! cargo build --release --no-default-features --features cuda --example gpu_query_bench
//! gpu_query_bench [--check] [--lookup] [--groupby] [--zipf] [--max-rows N] [--reps R]
//!                 [--slotmap ROWS,ROWS] [--slotmap-files FILES,ROWS,ROUNDS]
//! ```
//!
//! - `--check`: GPU vs CPU answers. Lookups: indexes of 0..10^6 keys under three parameter
//!   sets, probes uniform (10 % non-members), clustered, Zipf 1.0 and 1.5, 10 % NULLs, all three
//!   lookup forms; Utf8 and Int32 keys. GROUP BY: 1..1.5·10^6 groups, 1..`--max-rows` rows, the
//!   four distributions, 10 % NULL keys and values, count/sum/min/max/avg over i64 and f64, every
//!   mapping (shared/global × plain/match, and auto).
//! - `--lookup`: lookups per second at n = 10^6, 10^7, 10^8 keys (kernel time, CUDA events,
//!   median), end to end (upload + lookup + download), and the CPU on all cores.
//! - `--groupby`: TPC-H-like `group by l_suppkey` (uniform, 10^4 groups per 6·10^6 rows) and
//!   `group by l_orderkey` (sorted runs of 1..7 rows, 1.5·10^6 groups) at SF 1 and SF 10: lookup
//!   and aggregation kernel times, end to end with copies, and the CPU.
//! - `--zipf`: Zipf (s = 1.0, 1.5) over uniform time for 10^4 and 1.5·10^6 groups.
//! - `--slotmap 1e8,1e9`: slot maps (issue 21): the slot of every row of an Int64 key column
//!   of ROWS rows in random order over ROWS/10 distinct keys. Kernel rate with the keys resident
//!   on the device; end to end from a host Arrow array to a host `Vec<u32>`
//!   (`GpuIndex::slot_map`); the floor of any end-to-end path, the pinned host → device copy of
//!   the keys (and the device → host copy of the slots); every row compared with the CPU.
//!   Not part of the default run.
//! - `--slotmap-files 64,200000,50`: the slot maps of FILES Parquet files of ROWS rows each,
//!   made on the GPU ROUNDS times with the files in parallel (as `CREATE INDEX` makes them),
//!   every file compared with the CPU; prints the median and largest round. A round that never
//!   ends is the staging deadlock this mode was written to catch (run it under `timeout`).
//!   Not part of the default run.
//!
//! No flag runs everything. Tables are printed in markdown. `--ptx` only compiles the query-side
//! kernels with NVRTC (no GPU needed).

#[path = "../tests/gpu_query_data/mod.rs"]
mod gpu_query_data;

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, Int64Array};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, CudaStream};
use datafusion_mphf::core::column::ColumnIndex;
use datafusion_mphf::core::Params;
use datafusion_mphf::gpu::groupby::{aggregate_cpu, GroupByOptions, GroupByPlan, Mode};
use datafusion_mphf::gpu::query::{Combine, ABSENT32};
use datafusion_mphf::gpu::{AggOp, GpuContext, GpuGroupBy, GpuIndex};
use gpu_query_data::*;

struct Opts {
    check: bool,
    lookup: bool,
    groupby: bool,
    zipf: bool,
    max_rows: usize,
    reps: usize,
    lookup_ns: Vec<usize>,
    gb_rows: Vec<usize>,
    lookup_check: bool,
    slotmap_rows: Vec<usize>,
    /// `--slotmap-files`: files, rows per file, rounds.
    slotmap_files: Option<(usize, usize, usize)>,
}

fn parse() -> Opts {
    let mut o = Opts {
        check: false,
        lookup: false,
        groupby: false,
        zipf: false,
        max_rows: 100_000_000,
        reps: 10,
        lookup_ns: vec![1_000_000, 10_000_000, 100_000_000],
        gb_rows: vec![1, 1000, 1_000_000, 10_000_000],
        lookup_check: true,
        slotmap_rows: Vec::new(),
        slotmap_files: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--check" => o.check = true,
            "--lookup" => o.lookup = true,
            "--groupby" => o.groupby = true,
            "--zipf" => o.zipf = true,
            "--max-rows" => {
                o.max_rows = args[i + 1].parse::<f64>().unwrap() as usize;
                i += 1;
            }
            "--reps" => {
                o.reps = args[i + 1].parse().unwrap();
                i += 1;
            }
            "--gb-rows" => {
                o.gb_rows = args[i + 1]
                    .split(',')
                    .map(|s| s.parse::<f64>().unwrap() as usize)
                    .collect();
                i += 1;
            }
            "--no-lookup-check" => o.lookup_check = false,
            "--slotmap" => {
                o.slotmap_rows = args[i + 1]
                    .split(',')
                    .map(|s| s.parse::<f64>().unwrap() as usize)
                    .collect();
                i += 1;
            }
            "--slotmap-files" => {
                let v: Vec<usize> = args[i + 1]
                    .split(',')
                    .map(|s| s.parse::<f64>().unwrap() as usize)
                    .collect();
                assert_eq!(v.len(), 3, "--slotmap-files FILES,ROWS,ROUNDS");
                o.slotmap_files = Some((v[0], v[1], v[2]));
                i += 1;
            }
            "--lookup-ns" => {
                o.lookup_ns = args[i + 1]
                    .split(',')
                    .map(|s| s.parse::<f64>().unwrap() as usize)
                    .collect();
                i += 1;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 1;
    }
    if !(o.check || o.lookup || o.groupby || o.zipf || !o.slotmap_rows.is_empty() || o.slotmap_files.is_some()) {
        (o.check, o.lookup, o.groupby, o.zipf) = (true, true, true, true);
    }
    o
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Median milliseconds of `f` between CUDA events on `stream`, after one warm-up call.
fn time_gpu(stream: &Arc<CudaStream>, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    stream.synchronize().unwrap();
    let mut v = Vec::new();
    for _ in 0..reps.max(1) {
        let a = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
        f();
        let b = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
        b.synchronize().unwrap();
        v.push(a.elapsed_ms(&b).unwrap() as f64);
    }
    median(v)
}

/// Median wall milliseconds of `f` (which synchronizes itself), after one warm-up call.
fn time_host(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v = Vec::new();
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64() * 1e3);
    }
    median(v)
}

fn widen32(d: &[u32]) -> Vec<u64> {
    d.iter()
        .map(|&s| if s == ABSENT32 { u64::MAX } else { s as u64 })
        .collect()
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// Correctness
// ---------------------------------------------------------------------------------------------

fn check(o: &Opts, ctx: &Arc<GpuContext>) -> usize {
    let t0 = Instant::now();
    let mut failures = 0usize;
    let mut points = 0usize;
    if o.lookup_check {
        lookup_check(ctx, &mut points, &mut failures);
    }
    group_by_check(o, ctx, &mut points, &mut failures);
    println!("\ncheck: {points} comparisons, {failures} failures, {:.0} s", secs(t0));
    failures
}

fn lookup_check(ctx: &Arc<GpuContext>, points: &mut usize, failures: &mut usize) {
    let dists = [Dist::Uniform, Dist::Clustered, Dist::Zipf(1.0), Dist::Zipf(1.5)];
    println!("\n## Lookup equality (GPU slots == ColumnIndex::lookup_slots, every row)\n");
    println!("| params | n keys | probe rows | distributions | forms | result |");
    println!("|---|---|---|---|---|---|");
    for params in [Params::DEFAULT, Params::FAST, Params::COMPACT] {
        for n in [0usize, 1, 2, 10, 1000, 100_000, 1_000_000] {
            let keys: ArrayRef = if n == 0 {
                Arc::new(Int64Array::from(vec![None::<i64>; 3]))
            } else {
                Arc::new(Int64Array::from(member_keys(n)))
            };
            let idx = build_index(keys, params);
            let g = match GpuIndex::new(&idx) {
                Ok(g) => g,
                Err(e) => {
                    println!("| {params:?} | {n} | - | - | - | GpuIndex::new failed: {e} |");
                    *failures += 1;
                    continue;
                }
            };
            let rows = (4 * n).clamp(1000, 2_000_000);
            let mut bad = Vec::new();
            for dist in dists {
                let probe = int_probe(&draw(rows, n, dist, 7 + n as u64, true), 0.1, 8);
                let cpu = cpu_lookup(&idx, probe.as_ref());
                let mut got = Vec::new();
                *points += 3;
                match g.lookup_slots(probe.as_ref(), &mut got) {
                    Ok(()) => {
                        if let Some(i) = first_diff(&got, &cpu) {
                            bad.push(format!("{} auto row {i}: {} vs {}", dist.name(), got[i], cpu[i]));
                        }
                    }
                    Err(e) => bad.push(format!("{}: {e}", dist.name())),
                }
                let p = g.upload(probe.as_ref()).unwrap();
                for combine in [Combine::Off, Combine::Runs] {
                    let d = g.lookup_device(&p, combine).unwrap();
                    let host = widen32(&ctx.stream().clone_dtoh(&d).unwrap()[..rows]);
                    if let Some(i) = first_diff(&host, &cpu) {
                        bad.push(format!(
                            "{} {combine:?} row {i}: {} vs {}",
                            dist.name(),
                            host[i],
                            cpu[i]
                        ));
                    }
                }
            }
            *failures += bad.len();
            let p = format!("({},{},{})", params.leaf, params.bucket, params.rotation as u8);
            println!(
                "| {p} | {n} | {rows} | 4 | auto, off, runs | {} |",
                if bad.is_empty() {
                    "identical".to_string()
                } else {
                    format!("**{} differ**: {}", bad.len(), bad.join("; "))
                }
            );
        }
    }
    // Utf8 and Int32 keys.
    {
        let n = 100_000;
        let members: Vec<u64> = (0..n as u64).collect();
        let idx = build_index(str_probe(&members, 0.0, 1), Params::DEFAULT);
        let g = GpuIndex::new(&idx).unwrap();
        let probe = str_probe(&draw(400_000, n, Dist::Uniform, 3, true), 0.1, 4);
        let mut got = Vec::new();
        g.lookup_slots(probe.as_ref(), &mut got).unwrap();
        let d = first_diff(&got, &cpu_lookup(&idx, probe.as_ref()));
        *points += 1;
        *failures += d.is_some() as usize;
        println!(
            "| (8,100,0) Utf8 (host xxh3, device verify) | {n} | 400000 | uniform | auto | {} |",
            if d.is_none() {
                "identical".into()
            } else {
                format!("**differ at {d:?}**")
            }
        );
        let ik: ArrayRef = Arc::new(arrow::array::Int32Array::from(
            (0..n as i32).map(|i| i * 7 - 50_000).collect::<Vec<_>>(),
        ));
        let idx = build_index(ik, Params::DEFAULT);
        let g = GpuIndex::new(&idx).unwrap();
        let probe: ArrayRef = Arc::new(Int64Array::from(
            (0..400_000i64)
                .map(|i| (i % 11 != 0).then_some(i * 3 - 600_000))
                .collect::<Vec<_>>(),
        ));
        let mut got = Vec::new();
        g.lookup_slots(probe.as_ref(), &mut got).unwrap();
        let mut cpu = Vec::new();
        idx.lookup_slots(probe.as_ref(), &mut cpu).unwrap();
        let d = first_diff(&got, &cpu);
        *points += 1;
        *failures += d.is_some() as usize;
        println!(
            "| (8,100,0) Int32 keys, Int64 probe (cast) | {n} | 400000 | arithmetic | auto | {} |",
            if d.is_none() {
                "identical".into()
            } else {
                format!("**differ at {d:?}**")
            }
        );
    }

    // 10^8 probe rows with NULLs against 10^7 keys.
    {
        let n = 10_000_000;
        let idx = build_index(Arc::new(Int64Array::from(member_keys(n))), Params::DEFAULT);
        let g = GpuIndex::new(&idx).unwrap();
        for dist in [Dist::Uniform, Dist::Clustered] {
            let rows = 100_000_000;
            let probe = int_probe(&draw(rows, n, dist, 5, true), 0.1, 6);
            let cpu = cpu_lookup(&idx, probe.as_ref());
            let mut got = Vec::new();
            g.lookup_slots(probe.as_ref(), &mut got).unwrap();
            let d = first_diff(&got, &cpu);
            *points += 1;
            *failures += d.is_some() as usize;
            println!(
                "| (8,100,0) | {n} | {rows} | {} | auto | {} |",
                dist.name(),
                if d.is_none() {
                    "identical".into()
                } else {
                    format!("**differ at {d:?}**")
                }
            );
        }
    }
}

fn group_by_check(o: &Opts, ctx: &Arc<GpuContext>, points: &mut usize, failures: &mut usize) {
    let dists = [Dist::Uniform, Dist::Clustered, Dist::Zipf(1.0), Dist::Zipf(1.5)];
    println!("\n## GROUP BY equality (GPU == aggregate_cpu; f64 sums within 1e-12 relative)\n");
    println!("count(*), and count/sum/min/max/avg of an i64 and an f64 column; 10 % NULL keys (the NULL group) and 10 % NULL values. Modes: (shared, match) in {{auto, on, off}}².\n");
    println!("| groups | rows | distribution | modes | result | max rel. diff of f64 sums |");
    println!("|---|---|---|---|---|---|");
    let all = [AggOp::Sum, AggOp::Min, AggOp::Max, AggOp::Avg];
    let row_sizes = &o.gb_rows;
    for groups in [1usize, 10, 10_000, 1_500_000] {
        let gb = GpuGroupBy::new(groups as u64).unwrap();
        for &rows in row_sizes {
            for dist in dists {
                // The largest sizes only for the two groupings of the issue's queries.
                if rows >= 100_000_000 && (groups < 10_000 || matches!(dist, Dist::Zipf(s) if s < 1.2)) {
                    continue;
                }
                let s = slots(rows, groups, dist, 0.1, rows as u64 ^ groups as u64);
                let iv = i64_values(rows, 0.1, 5);
                let fv = f64_values(rows, 0.1, 6);
                let cols = [(iv.as_ref(), &all[..]), (fv.as_ref(), &all[..])];
                let cpu = aggregate_cpu(&s, groups as u64, true, &cols).unwrap();
                let d = ctx.stream().clone_htod(&s).unwrap();
                let mut worst = 0.0f64;
                let mut bad = Vec::new();
                let modes: Vec<(Mode, Mode)> = if rows >= 10_000_000 {
                    vec![(Mode::Auto, Mode::Auto), (Mode::Off, Mode::On), (Mode::On, Mode::Off)]
                } else {
                    [Mode::Auto, Mode::On, Mode::Off]
                        .iter()
                        .flat_map(|&a| [Mode::Auto, Mode::On, Mode::Off].map(move |b| (a, b)))
                        .collect()
                };
                for &(shared, matched) in &modes {
                    *points += 1;
                    let hot = if shared == Mode::Off && matched == Mode::Off && rows < 10_000_000 {
                        Mode::Off
                    } else {
                        Mode::Auto
                    };
                    match gb.aggregate(&d, rows, true, &cols, GroupByOptions { shared, matched, hot }) {
                        Ok(r) => match compare(&r, &cpu, 1e-12) {
                            Ok(w) => worst = worst.max(w),
                            Err(e) => bad.push(format!("{shared:?}/{matched:?}: {e}")),
                        },
                        Err(e) => bad.push(format!("{shared:?}/{matched:?}: {e}")),
                    }
                }
                *failures += bad.len();
                println!(
                    "| {groups} | {rows} | {} | {} | {} | {worst:.2e} |",
                    dist.name(),
                    modes.len(),
                    if bad.is_empty() {
                        "identical".to_string()
                    } else {
                        format!("**{} differ**: {}", bad.len(), bad.join("; "))
                    }
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lookup throughput
// ---------------------------------------------------------------------------------------------

fn lookup_bench(o: &Opts, ctx: &Arc<GpuContext>) {
    let stream = ctx.stream().clone();
    println!("\n## Batch lookup throughput (Int64 keys, (8,100), probes of member keys)\n");
    println!("Kernel: CUDA events around the lookup kernel alone (probe already on the device), median of {} runs. End to end: `GpuIndex::lookup_slots` from an Arrow array to a host `Vec<u64>` (upload, kernel, download). CPU: `ColumnIndex::lookup_slots` over 64 Ki-row chunks on all cores.\n", o.reps);
    println!("| n keys | probe rows | probe | kernel | kernel ms | lookups/s (kernel) | end-to-end ms | lookups/s (e2e) | CPU ms | lookups/s (CPU) | equal to CPU |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for &n in &o.lookup_ns {
        let t = Instant::now();
        let idx = build_index(Arc::new(Int64Array::from(member_keys(n))), Params::DEFAULT);
        let g = GpuIndex::new(&idx).unwrap();
        eprintln!(
            "built and uploaded n={n} in {:.1} s ({} device bytes)",
            secs(t),
            g.device_bytes()
        );
        let rows = o.max_rows.min(100_000_000);
        for dist in [Dist::Uniform, Dist::Clustered] {
            let probe = int_probe(&draw(rows, n, dist, 11, false), 0.0, 0);
            let p = g.upload(probe.as_ref()).unwrap();
            let mut out: CudaSlice<u32> = stream.alloc_zeros(rows).unwrap();
            // CPU reference on all rows (for the equality column) and its time.
            let t = Instant::now();
            let cpu = cpu_lookup(&idx, probe.as_ref());
            let cpu_ms = secs(t) * 1e3;
            for combine in [Combine::Off, Combine::Runs] {
                let ms = time_gpu(&stream, o.reps, || g.lookup_device_into(&p, combine, &mut out).unwrap());
                let host = widen32(&stream.clone_dtoh(&out).unwrap());
                let eq = first_diff(&host, &cpu).is_none();
                let mut v = Vec::new();
                let e2e = time_host(2, || g.lookup_slots(probe.as_ref(), &mut v).unwrap());
                println!(
                    "| {n} | {rows} | {} | {} | {ms:.3} | {:.2e} | {e2e:.1} | {:.2e} | {cpu_ms:.1} | {:.2e} | {} |",
                    dist.name(),
                    if combine == Combine::Off { "plain" } else { "runs" },
                    rows as f64 / (ms / 1e3),
                    rows as f64 / (e2e / 1e3),
                    rows as f64 / (cpu_ms / 1e3),
                    if eq { "yes" } else { "**NO**" }
                );
            }
            eprintln!(
                "  auto picks runs: {} (sampled run rate {:.3})",
                g.uses_runs(&p, Combine::Auto),
                p.run_rate
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Slot maps
// ---------------------------------------------------------------------------------------------

/// Slot maps of `--slotmap` row counts; returns the number of rows that differ from the CPU.
fn slotmap_bench(o: &Opts, ctx: &Arc<GpuContext>) -> usize {
    let stream = ctx.stream().clone();
    println!("\n## Slot maps on the GPU (Int64 keys in random order, ROWS/10 distinct keys, (8,100))\n");
    println!("Resident: CUDA events around the lookup kernel with the keys already on the device (median of {} runs). End to end: `GpuIndex::slot_map` from a host Arrow array to a host `Vec<u32>` (median of 3). Floor: pinned host → device copy of the 8-byte keys (and device → host of the 4-byte slots), CUDA events, median of 3. CPU: `ColumnIndex::lookup_slots` over 64 Ki-row chunks on all cores.\n", o.reps);
    println!("| rows | keys | resident ms | rows/s resident | end-to-end ms | rows/s e2e | H→D floor ms | D→H floor ms | e2e / (H→D + D→H) | CPU ms | equal to CPU |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failures = 0;
    for &rows in &o.slotmap_rows {
        let n = (rows / 10).max(1);
        let t = Instant::now();
        let idx = build_index(Arc::new(Int64Array::from(member_keys(n))), Params::DEFAULT);
        let g = GpuIndex::new(&idx).unwrap();
        let probe = int_probe(&draw(rows, n, Dist::Uniform, 21, false), 0.0, 0);
        eprintln!("slot map: index of {n} keys and {rows} probe rows in {:.1} s", secs(t));
        // Resident keys.
        let resident_ms = {
            let p = g.upload(probe.as_ref()).unwrap();
            let mut out: CudaSlice<u32> = stream.alloc_zeros(rows).unwrap();
            time_gpu(&stream, o.reps, || {
                g.lookup_device_into(&p, Combine::Off, &mut out).unwrap()
            })
        };
        // End to end.
        let mut slots = Vec::new();
        let e2e_ms = time_host(3, || slots = g.slot_map(&[probe.as_ref()]).unwrap());
        // Copy floors through pinned memory.
        let (h2d_ms, d2h_ms) = {
            // SAFETY: uninitialized pinned host memory that is only copied, never read as values.
            let keys_host = unsafe { stream.context().alloc_pinned::<u64>(rows) }.unwrap();
            let mut slots_host = unsafe { stream.context().alloc_pinned::<u32>(rows) }.unwrap();
            let mut keys_dev = unsafe { stream.alloc::<u64>(rows) }.unwrap();
            let slots_dev: CudaSlice<u32> = stream.alloc_zeros(rows).unwrap();
            let h2d = time_gpu(&stream, 3, || stream.memcpy_htod(&keys_host, &mut keys_dev).unwrap());
            let d2h = time_gpu(&stream, 3, || stream.memcpy_dtoh(&slots_dev, &mut slots_host).unwrap());
            (h2d, d2h)
        };
        let t = Instant::now();
        let cpu = cpu_lookup(&idx, probe.as_ref());
        let cpu_ms = secs(t) * 1e3;
        let diff = first_diff(&widen32(&slots), &cpu);
        if let Some(at) = diff {
            eprintln!("slot map differs from the CPU at row {at}");
            failures += 1;
        }
        println!(
            "| {rows} | {n} | {resident_ms:.1} | {:.2e} | {e2e_ms:.1} | {:.2e} | {h2d_ms:.1} | {d2h_ms:.1} | {:.2}× | {cpu_ms:.0} | {} |",
            rows as f64 / (resident_ms / 1e3),
            rows as f64 / (e2e_ms / 1e3),
            e2e_ms / (h2d_ms + d2h_ms),
            if diff.is_none() { "yes" } else { "**NO**" }
        );
    }
    failures
}

/// `--slotmap-files`: slot maps of many files made at once on the GPU (see the module docs);
/// returns 1 when a round failed or differed from the CPU.
fn slotmap_files_check(files: usize, rows: usize, rounds: usize) -> usize {
    let dir = std::env::temp_dir().join(format!("gpu-slotmap-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = (rows / 2).max(1);
    let idx = build_index(Arc::new(Int64Array::from(member_keys(keys))), Params::DEFAULT);
    let stamps = key_files(&dir, files, rows, keys);
    eprintln!("slot map files: {files} files of {rows} rows written, {rounds} rounds");
    let outcome = parallel_slot_maps(&idx, &stamps, rounds);
    std::fs::remove_dir_all(&dir).ok();
    match outcome {
        Ok(ms) => {
            let largest = ms.iter().copied().fold(0.0, f64::max);
            println!(
                "\n## Slot maps of {files} files of {rows} rows at once\n\n{rounds} rounds, every file equal to the CPU: median {:.1} ms, largest {largest:.1} ms",
                median(ms)
            );
            0
        }
        Err(e) => {
            eprintln!("slot map files: {e}");
            1
        }
    }
}

// ---------------------------------------------------------------------------------------------
// TPC-H-like GROUP BY
// ---------------------------------------------------------------------------------------------

/// A key column of `rows` rows over `groups` distinct keys and its index.
struct Workload {
    name: String,
    rows: usize,
    groups: usize,
    keys: ArrayRef,
    idx: ColumnIndex,
}

fn workload(name: &str, rows: usize, groups: usize, dist: Dist, seed: u64) -> Workload {
    let draws = draw(rows, groups, dist, seed, false);
    // Clustered draws wrap around the groups; count the distinct keys really used.
    let used = match dist {
        Dist::Clustered => (draws.iter().max().map_or(0, |&m| m as usize + 1)).min(groups),
        _ => groups,
    };
    let keys = int_probe(&draws, 0.0, 0);
    let idx = build_index(Arc::new(Int64Array::from(member_keys(used))), Params::DEFAULT);
    Workload {
        name: name.to_string(),
        rows,
        groups: used,
        keys,
        idx,
    }
}

struct GbTimes {
    lookup_ms: f64,
    plan_ms: f64,
    agg_ms: f64,
    q_ms: f64,
    e2e_ms: f64,
    cpu_ms: f64,
    cpu_agg_ms: f64,
    plan: GroupByPlan,
    equal: bool,
}

fn time_groupby(o: &Opts, ctx: &Arc<GpuContext>, w: &Workload, opts: GroupByOptions, with_values: bool) -> GbTimes {
    let stream = ctx.stream().clone();
    let g = GpuIndex::new(&w.idx).unwrap();
    let gb = GpuGroupBy::new(w.idx.len()).unwrap();
    let p = g.upload(w.keys.as_ref()).unwrap();
    let mut slots: CudaSlice<u32> = stream.alloc_zeros(w.rows).unwrap();
    let lookup_ms = time_gpu(&stream, o.reps, || {
        g.lookup_device_into(&p, Combine::Auto, &mut slots).unwrap()
    });
    let plan_t = Instant::now();
    let plan = gb.plan(&slots, w.rows, true, &[], opts).unwrap();
    let plan_ms = secs(plan_t) * 1e3;
    let agg_ms = time_gpu(&stream, o.reps, || {
        let _ = gb.run(&slots, w.rows, true, &[], &plan).unwrap();
    });
    // count(*), sum(quantity i64), avg(price f64): a Q1-like aggregate list.
    let q_ms = if with_values {
        let qty = i64_values(w.rows, 0.0, 21);
        let price = f64_values(w.rows, 0.0, 22);
        let dq = gb.upload_column(qty.as_ref()).unwrap();
        let dp = gb.upload_column(price.as_ref()).unwrap();
        let cols = [(&dq, &[AggOp::Sum][..]), (&dp, &[AggOp::Avg][..])];
        let plan2 = gb.plan(&slots, w.rows, true, &cols, opts).unwrap();
        time_gpu(&stream, o.reps, || {
            let _ = gb.run(&slots, w.rows, true, &cols, &plan2).unwrap();
        })
    } else {
        f64::NAN
    };
    let gpu_counts = gb
        .run(&slots, w.rows, true, &[], &plan)
        .unwrap()
        .download(ctx)
        .unwrap()
        .rows
        .unwrap();
    // End to end: Arrow keys on the host → counts on the host.
    let e2e_ms = time_host(3.min(o.reps), || {
        let p = g.upload(w.keys.as_ref()).unwrap();
        let s = g.lookup_device(&p, Combine::Auto).unwrap();
        let plan = gb.plan(&s, w.rows, true, &[], opts).unwrap();
        let r = gb.run(&s, w.rows, true, &[], &plan).unwrap().download(ctx).unwrap();
        assert!(r.rows.is_some());
    });
    // CPU: lookup on all cores, then the slot-array aggregation on all cores.
    let mut cpu_slots32 = Vec::new();
    let mut cpu_counts = Vec::new();
    let cpu_ms = time_host(2, || {
        let s = cpu_lookup(&w.idx, w.keys.as_ref());
        cpu_slots32 = s.iter().map(|&x| x.min(u32::MAX as u64) as u32).collect();
        cpu_counts = aggregate_cpu(&cpu_slots32, w.idx.len(), true, &[])
            .unwrap()
            .rows
            .unwrap();
    });
    let cpu_agg_ms = time_host(3, || {
        let _ = aggregate_cpu(&cpu_slots32, w.idx.len(), true, &[]).unwrap();
    });
    GbTimes {
        lookup_ms,
        plan_ms,
        agg_ms,
        q_ms,
        e2e_ms,
        cpu_ms,
        cpu_agg_ms,
        plan,
        equal: gpu_counts == cpu_counts,
    }
}

fn groupby_bench(o: &Opts, ctx: &Arc<GpuContext>) {
    println!("\n## TPC-H-like GROUP BY count(*) (synthetic lineitem key columns)\n");
    println!("`l_suppkey`: uniform over 10^4 (SF 1) / 10^5 (SF 10) suppliers. `l_orderkey`: sorted, runs of 1..7 rows per order (1.5·10^6 / 1.5·10^7 orders). Index (8,100) over the distinct keys. Kernel times: CUDA events, median of {} runs; lookup = keys (already on the device) → slots; aggregate = `GpuGroupBy::run` count(*) (accumulator init + kernel); Q = count(*), sum(i64), avg(f64). End to end: Arrow keys on the host → counts on the host (upload, lookup, sample, aggregate, download), median of 3. CPU: lookup + `aggregate_cpu` on all cores (aggregation alone in its own column).\n", o.reps);
    println!("| query | rows | groups | plan (shared, match, distinct/row, hot slots) | lookup ms | aggregate ms | lookup+aggregate ms | Q ms | sample ms | end-to-end ms | CPU ms | CPU aggregate ms | equal |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut cases = vec![
        ("l_suppkey SF1", 6_000_000usize, 10_000usize, Dist::Uniform),
        ("l_orderkey SF1", 6_000_000, 1_500_000, Dist::Clustered),
    ];
    if o.max_rows >= 60_000_000 {
        cases.push(("l_suppkey SF10", 60_000_000, 100_000, Dist::Uniform));
        cases.push(("l_orderkey SF10", 60_000_000, 15_000_000, Dist::Clustered));
    }
    for (name, rows, groups, dist) in cases {
        let t = Instant::now();
        let w = workload(name, rows, groups, dist, 31);
        eprintln!("workload {name}: {:.1} s", secs(t));
        let r = time_groupby(o, ctx, &w, GroupByOptions::default(), true);
        print_gb_row(&w, &r);
        // The forced mappings, aggregation only.
        for (shared, matched, hot) in [
            (Mode::On, Mode::Off, Mode::Auto),
            (Mode::On, Mode::On, Mode::Auto),
            (Mode::Off, Mode::Off, Mode::Auto),
            (Mode::Off, Mode::On, Mode::Auto),
            (Mode::Off, Mode::Off, Mode::Off),
        ] {
            let gb = GpuGroupBy::new(w.idx.len()).unwrap();
            let g = GpuIndex::new(&w.idx).unwrap();
            let p = g.upload(w.keys.as_ref()).unwrap();
            let s = g.lookup_device(&p, Combine::Auto).unwrap();
            let plan = gb
                .plan(&s, w.rows, true, &[], GroupByOptions { shared, matched, hot })
                .unwrap();
            let stream = ctx.stream().clone();
            let ms = time_gpu(&stream, o.reps, || {
                let _ = gb.run(&s, w.rows, true, &[], &plan).unwrap();
            });
            println!(
                "| {} (forced) | {} | {} | ({}, {}, hot {}) | | {ms:.3} | | | | | | | |",
                w.name, w.rows, w.groups, plan.shared, plan.matched, plan.n_hot
            );
        }
    }
}

fn print_gb_row(w: &Workload, r: &GbTimes) {
    println!(
        "| {} | {} | {} | ({}, {}, {:.2}, {}) | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} | {:.1} | {} |",
        w.name,
        w.rows,
        w.groups,
        r.plan.shared,
        r.plan.matched,
        r.plan.distinct_per_row,
        r.plan.n_hot,
        r.lookup_ms,
        r.agg_ms,
        r.lookup_ms + r.agg_ms,
        r.q_ms,
        r.plan_ms,
        r.e2e_ms,
        r.cpu_ms,
        r.cpu_agg_ms,
        if r.equal { "yes" } else { "**NO**" }
    );
}

fn zipf_bench(o: &Opts, ctx: &Arc<GpuContext>) {
    println!("\n## Skew: Zipf vs uniform keys (6·10^6 rows, random order)\n");
    println!("| groups | keys | plan (shared, match, distinct/row, hot slots) | lookup ms | aggregate ms | lookup+aggregate ms | ratio to uniform (aggregate) | ratio to uniform (lookup+aggregate) | equal |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for groups in [10_000usize, 1_500_000] {
        let mut base = (0.0, 0.0);
        for dist in [Dist::Uniform, Dist::Zipf(1.0), Dist::Zipf(1.5)] {
            let w = workload(&dist.name(), 6_000_000, groups, dist, 41);
            let r = time_groupby(o, ctx, &w, GroupByOptions::default(), false);
            if dist == Dist::Uniform {
                base = (r.agg_ms, r.lookup_ms + r.agg_ms);
            }
            println!(
                "| {groups} | {} | ({}, {}, {:.2}, {}) | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {} |",
                w.name,
                r.plan.shared,
                r.plan.matched,
                r.plan.distinct_per_row,
                r.plan.n_hot,
                r.lookup_ms,
                r.agg_ms,
                r.lookup_ms + r.agg_ms,
                r.agg_ms / base.0,
                (r.lookup_ms + r.agg_ms) / base.1,
                if r.equal { "yes" } else { "**NO**" }
            );
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--ptx") {
        // NVRTC only, no GPU needed: every query-side module compiles.
        let m = datafusion_mphf::gpu::kernels::compile_all_query_kernels_to_ptx(
            datafusion_mphf::gpu::kernels::DEFAULT_ARCH,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        println!("{} query-side modules compile", m.len());
        return;
    }
    let o = parse();
    let ctx = match GpuContext::get() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("no usable GPU: {e}");
            std::process::exit(2);
        }
    };
    let (free, total) = ctx.memory().unwrap_or((0, 0));
    println!(
        "# gpu_query_bench\n\nGPU: {} ({}), {:.1} GiB free of {:.1}; {} CPU threads (rayon).",
        ctx.name(),
        ctx.arch(),
        free as f64 / (1u64 << 30) as f64,
        total as f64 / (1u64 << 30) as f64,
        rayon::current_num_threads()
    );
    let t = Instant::now();
    let mut failures = 0;
    if o.check {
        failures += check(&o, &ctx);
    }
    if o.lookup {
        lookup_bench(&o, &ctx);
    }
    if o.groupby {
        groupby_bench(&o, &ctx);
    }
    if o.zipf {
        zipf_bench(&o, &ctx);
    }
    if !o.slotmap_rows.is_empty() {
        failures += slotmap_bench(&o, &ctx);
    }
    if let Some((files, rows, rounds)) = o.slotmap_files {
        failures += slotmap_files_check(files, rows, rounds);
    }
    println!("\ntotal {:.0} s, {failures} check failures", secs(t));
    if failures > 0 {
        std::process::exit(1);
    }
}
