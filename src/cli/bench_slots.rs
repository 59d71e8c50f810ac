//! `mphf bench slots`: the operations the project exists for, without DataFusion.
//!
//! Generates the TPC-H key columns in memory (orders: 1.5M sparse order keys per scale factor,
//! 8 used of every 32 as in dbgen; lineitem: 1–7 lines per order; l_suppkey), builds column
//! indexes on them (GPU when present and worth it, else all CPU cores), prints the index stats,
//! and times, with and without the MPHF slots:
//!
//! - `SELECT l_orderkey, count(*) FROM lineitem GROUP BY l_orderkey`: slot array vs hash map;
//! - `SELECT count(*) FROM lineitem JOIN orders ON l_orderkey = o_orderkey`: slot probe vs hash
//!   map probe.
//!
//! Results are checked equal before times are printed. It is the lower bound of what the SQL
//! operators can gain: no planning, no batches, no accumulators.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, ArrayRef, Int64Array};
use clap::Args;

use super::CliError;
use crate::core::column::{ColumnIndex, IndexOptions, ABSENT};
use crate::core::hash::mix64;
use crate::core::Params;

/// Arguments of `mphf demo`.
#[derive(Debug, Clone, Args)]
pub struct BenchSlotsArgs {
    /// TPC-H scale factor of the generated key columns.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// Repetitions of each timed operation (the median is printed).
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
}

/// The generated columns.
struct Data {
    o_orderkey: ArrayRef,
    l_orderkey: ArrayRef,
    l_suppkey: ArrayRef,
}

/// TPC-H key columns: order keys use 8 of every 32 values; each order has 1–7 lines.
fn generate(scale: f64) -> Data {
    let orders = ((1_500_000.0 * scale) as i64).max(1);
    let suppliers = ((10_000.0 * scale) as i64).max(1);
    let okey = |i: i64| (i / 8) * 32 + (i % 8) + 1;
    let o: Vec<i64> = (0..orders).map(okey).collect();
    let mut l = Vec::with_capacity(orders as usize * 4);
    let mut s = Vec::with_capacity(orders as usize * 4);
    for i in 0..orders {
        let lines = 1 + (mix64(i as u64) % 7) as i64;
        for j in 0..lines {
            l.push(okey(i));
            s.push(1 + (mix64((i * 8 + j) as u64 ^ 0x5eed) % suppliers as u64) as i64);
        }
    }
    Data {
        o_orderkey: Arc::new(Int64Array::from(o)),
        l_orderkey: Arc::new(Int64Array::from(l)),
        l_suppkey: Arc::new(Int64Array::from(s)),
    }
}

fn median_secs(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    t[t.len() / 2]
}

fn build(name: &str, col: &ArrayRef) -> Result<ColumnIndex, CliError> {
    let params = Params::DEFAULT;
    #[cfg(feature = "cuda")]
    let (solver, notice) = crate::placement::solver_for(crate::device::Device::Auto, col.len() as u64, &params);
    #[cfg(not(feature = "cuda"))]
    let (solver, notice): (Option<Arc<dyn crate::core::BucketSolver>>, Option<String>) = (None, None);
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let t = Instant::now();
    let idx = ColumnIndex::build(
        std::slice::from_ref(col),
        &IndexOptions {
            params,
            solver,
            ..Default::default()
        },
    )?;
    println!(
        "index {name:<11} rows {:>9}  keys {:>9}  {:.3} bits/key (MPHF)  {:>10} bytes  built in {:>7.1} ms on {}",
        idx.stats().rows,
        idx.len(),
        idx.mphf().bits_per_key(),
        idx.size_bytes(),
        t.elapsed().as_secs_f64() * 1e3,
        idx.device()
    );
    Ok(idx)
}

/// Runs the demo.
///
/// # Errors
/// Index build failures, or a result mismatch between the two paths.
pub fn run(args: &BenchSlotsArgs) -> Result<(), CliError> {
    println!("generating TPC-H key columns at SF {} ...", args.scale);
    let data = generate(args.scale);
    let o_idx = build("o_orderkey", &data.o_orderkey)?;
    let l_idx = build("l_orderkey", &data.l_orderkey)?;
    let _s_idx = build("l_suppkey", &data.l_suppkey)?;

    let lkeys = data
        .l_orderkey
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("Int64")
        .values()
        .clone();
    let okeys = data
        .o_orderkey
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("Int64")
        .values()
        .clone();

    // GROUP BY l_orderkey, count(*).
    let mut slot_counts = Vec::new();
    let mut slots = Vec::new();
    let t_mphf = median_secs(args.runs, || {
        l_idx
            .lookup_slots(data.l_orderkey.as_ref(), &mut slots)
            .expect("lookup");
        slot_counts = vec![0u64; l_idx.len() as usize];
        for &s in &slots {
            slot_counts[s as usize] += 1;
        }
    });
    let mut map_counts: HashMap<i64, u64> = HashMap::new();
    let t_hash = median_secs(args.runs, || {
        map_counts = HashMap::new();
        for &k in lkeys.iter() {
            *map_counts.entry(k).or_insert(0) += 1;
        }
    });
    let keys_in_slot = l_idx
        .keys()
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("Int64 keys")
        .values()
        .clone();
    let equal = map_counts.len() == slot_counts.len()
        && keys_in_slot
            .iter()
            .zip(&slot_counts)
            .all(|(k, c)| map_counts.get(k) == Some(c));
    if !equal {
        return Err(CliError::Bench(
            "GROUP BY results differ between the MPHF and the hash map".into(),
        ));
    }

    // lineitem ⋈ orders on the order key: count of matches.
    let mut probe = Vec::new();
    let mut matches_mphf = 0u64;
    let t_join_mphf = median_secs(args.runs, || {
        o_idx
            .lookup_slots(data.l_orderkey.as_ref(), &mut probe)
            .expect("lookup");
        matches_mphf = probe.iter().filter(|&&s| s != ABSENT).count() as u64;
    });
    let mut matches_hash = 0u64;
    let t_join_hash = median_secs(args.runs, || {
        let build: HashMap<i64, usize> = okeys.iter().enumerate().map(|(i, &k)| (k, i)).collect();
        matches_hash = lkeys.iter().filter(|k| build.contains_key(k)).count() as u64;
    });
    if matches_mphf != matches_hash {
        return Err(CliError::Bench(format!(
            "join counts differ: {matches_mphf} vs {matches_hash}"
        )));
    }

    println!();
    println!(
        "| operation (median of {}) | groups / matches | hash map | MPHF slots | speed-up |",
        args.runs
    );
    println!("|---|---|---|---|---|");
    println!(
        "| GROUP BY l_orderkey, count(*) | {} | {:.1} ms | {:.1} ms | {:.2}x |",
        slot_counts.len(),
        t_hash * 1e3,
        t_mphf * 1e3,
        t_hash / t_mphf
    );
    println!(
        "| lineitem JOIN orders ON orderkey, count(*) | {} | {:.1} ms | {:.1} ms | {:.2}x |",
        matches_mphf,
        t_join_hash * 1e3,
        t_join_mphf * 1e3,
        t_join_hash / t_join_mphf
    );
    println!("\nresults identical on both paths; the hash-map join time includes building its table, the MPHF index was built once above.");
    #[cfg(feature = "cuda")]
    lookup_batches(args, &data.l_orderkey, &l_idx.with_dense_lookup(16.0))?;
    Ok(())
}

/// The per-batch crossover of `mphf_index` (`Tuning::lookup_gpu_min_rows`): one batch of `n` rows
/// looked up on one CPU core (as one DataFusion partition does) against the GPU, end to end
/// (upload, kernel, slots back as an Arrow array), for the table-order (clustered) probe and a
/// scattered one. The index has the dense-key table the SQL session gives it.
#[cfg(feature = "cuda")]
fn lookup_batches(args: &BenchSlotsArgs, keys: &ArrayRef, index: &ColumnIndex) -> Result<(), CliError> {
    let gpu = match crate::gpu::GpuIndex::new(index) {
        Ok(g) => g,
        Err(e) => {
            println!("\n(no GPU lookup table: {e})");
            return Ok(());
        }
    };
    let n = keys.len();
    let scattered: ArrayRef = {
        let picks = arrow::array::UInt64Array::from_iter_values((0..n as u64).map(|i| mix64(i) % n as u64));
        arrow::compute::take(keys.as_ref(), &picks, None).map_err(|e| CliError::Bench(e.to_string()))?
    };
    let one_core = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .map_err(|e| CliError::Bench(e.to_string()))?;
    println!("\n| batch rows | probe | CPU 1 core µs | GPU µs | GPU / CPU time | same slots |");
    println!("|---|---|---|---|---|---|");
    for rows in [
        1usize << 10,
        1 << 13,
        1 << 15,
        1 << 16,
        1 << 17,
        1 << 18,
        1 << 20,
        1 << 22,
    ] {
        if rows > n {
            break;
        }
        for (name, probe) in [("table order", keys), ("scattered", &scattered)] {
            let batch = probe.slice(0, rows);
            let mut cpu = None;
            let t_cpu = median_secs(args.runs.max(5), || {
                cpu = Some(one_core.install(|| index.lookup(batch.as_ref())));
            });
            let mut on_gpu = None;
            let _warm = gpu.lookup(batch.as_ref());
            let t_gpu = median_secs(args.runs.max(5), || on_gpu = Some(gpu.lookup(batch.as_ref())));
            let same = match (cpu, on_gpu) {
                (Some(Ok(a)), Some(Ok(b))) => a.as_ref() == b.as_ref(),
                _ => false,
            };
            println!(
                "| {rows} | {name} | {:.1} | {:.1} | {:.2} | {} |",
                t_cpu * 1e6,
                t_gpu * 1e6,
                t_gpu / t_cpu,
                if same { "yes" } else { "NO" }
            );
        }
    }
    Ok(())
}
