//! GPU-vs-CPU equality grid shared by `tests/test_gpu.rs` and `examples/gpu_bench.rs`.
//!
//! For every (ℓ, b, rotation) and a list of key counts, builds the MPHF on the CPU and on the
//! GPU, requires identical bytes (`Mphf::write_bytes`) and a bijection onto `0..n`. Key counts
//! are capped by an estimate of the leaf search work so that big ℓ stay cheap: a leaf of ℓ keys
//! needs about ℓ^ℓ/ℓ! candidates (ℓ times fewer bases with rotation).

#![allow(dead_code)]

use std::sync::Arc;

use datafusion_mphf::core::{BucketSolver, Builder, Mphf, Params};
use datafusion_mphf::gpu::{GpuContext, GpuSolver};

/// Deterministic pseudo-random distinct u64 keys (a bijective mixer over a counter).
pub fn random_keys(n: usize, seed: u64) -> Vec<u64> {
    use rayon::prelude::*;
    let x = seed.wrapping_mul(0xA076_1D64_78BD_642F);
    (0..n as u64)
        .into_par_iter()
        .map(|i| datafusion_mphf::core::hash::mix64(x.wrapping_add((i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))))
        .collect()
}

/// Candidates (rotation: bases) a full leaf of `leaf` keys needs on average.
pub fn leaf_work(leaf: usize, rotation: bool) -> f64 {
    let mut w = 1.0f64;
    for i in 1..=leaf {
        w *= leaf as f64 / i as f64;
    }
    if rotation {
        w / leaf as f64
    } else {
        w
    }
}

/// Largest n whose estimated leaf work fits `budget` candidates.
pub fn n_cap(leaf: usize, rotation: bool, budget: f64) -> usize {
    let per_key = leaf_work(leaf, rotation) / leaf as f64;
    (budget / per_key).clamp(8.0, 1e8) as usize
}

/// Asserts `mphf` is a bijection from `keys` onto `0..n`.
pub fn check_bijection(mphf: &Mphf, keys: &[u64]) -> Result<(), String> {
    let mut seen = vec![false; keys.len()];
    for k in keys {
        let v = mphf.index(k) as usize;
        if v >= keys.len() || seen[v] {
            return Err(format!("not a bijection: value {v} (n = {})", keys.len()));
        }
        seen[v] = true;
    }
    Ok(())
}

/// One grid point: CPU and GPU bytes equal, GPU actually used, bijection.
pub fn check_one(solver: &Arc<dyn BucketSolver>, params: Params, keys: &[u64]) -> Result<(), String> {
    let cpu = Builder::new(params)
        .build(keys)
        .map_err(|e| format!("CPU build failed: {e}"))?;
    let (gpu, report) = Builder::new(params)
        .solver(Some(solver.clone()))
        .build_with_report(keys)
        .map_err(|e| format!("GPU build failed: {e}"))?;
    if let Some(notice) = report.fallback_notice {
        return Err(format!("GPU fell back to the CPU: {notice}"));
    }
    if cpu.write_bytes() != gpu.write_bytes() {
        return Err("GPU bytes differ from CPU bytes".into());
    }
    check_bijection(&gpu, keys)
}

/// Chunked solving (many device round trips) gives the same bytes: a few configurations with
/// chunks of `chunk` keys. Returns (points checked, failures).
pub fn run_chunked(chunk: u64) -> Result<(usize, Vec<String>), String> {
    let ctx = GpuContext::get().map_err(|e| e.to_string())?;
    let solver: Arc<dyn BucketSolver> = Arc::new(GpuSolver::new(ctx).with_chunk_keys(chunk));
    let mut checked = 0;
    let mut failures = Vec::new();
    for &(leaf, bucket, rotation, n) in &[
        (8usize, 100usize, false, 200_000usize),
        (5, 5, true, 100_000),
        (12, 2000, true, 50_000),
        (2, 500, false, 30_000),
    ] {
        let params = Params::try_new(leaf, bucket, rotation).map_err(|e| e.to_string())?;
        let keys = random_keys(n, 99 + leaf as u64);
        checked += 1;
        if let Err(e) = check_one(&solver, params, &keys) {
            failures.push(format!(
                "chunked {chunk}: ℓ={leaf} b={bucket} rot={rotation} n={n}: {e}"
            ));
        }
    }
    Ok((checked, failures))
}

/// Runs the grid with leaf-work `budget` per configuration; returns (points checked, failures).
pub fn run_grid(budget: f64, max_n: usize, verbose: bool) -> Result<(usize, Vec<String>), String> {
    let ctx = GpuContext::get().map_err(|e| e.to_string())?;
    let solver: Arc<dyn BucketSolver> = Arc::new(GpuSolver::new(ctx));
    let ns = [
        1usize, 2, 3, 5, 8, 13, 24, 50, 101, 1000, 2999, 10_000, 100_000, 1_000_000, 10_000_000,
    ];
    let mut checked = 0;
    let mut failures = Vec::new();
    for leaf in 2..=24usize {
        for rotation in [false, true] {
            let cap = n_cap(leaf, rotation, budget).min(max_n);
            for bucket in [5usize, 50, 100, 500, 2000] {
                let params = Params::try_new(leaf, bucket, rotation).map_err(|e| e.to_string())?;
                let t = std::time::Instant::now();
                let mut done = Vec::new();
                for (i, &n) in ns.iter().enumerate() {
                    if n > cap {
                        continue;
                    }
                    let keys = random_keys(n, (leaf * 1000 + bucket * 2 + rotation as usize + i) as u64);
                    checked += 1;
                    if let Err(e) = check_one(&solver, params, &keys) {
                        failures.push(format!("ℓ={leaf} b={bucket} rot={rotation} n={n}: {e}"));
                    }
                    done.push(n);
                }
                if verbose {
                    println!(
                        "grid ℓ={leaf:>2} b={bucket:>4} rot={:<5} n up to {:>8} ({} sizes) {:>7.2} s",
                        rotation,
                        done.last().copied().unwrap_or(0),
                        done.len(),
                        t.elapsed().as_secs_f64()
                    );
                }
            }
        }
    }
    Ok((checked, failures))
}
