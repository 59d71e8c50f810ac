//! Leaf-work statistics of a build (diagnostic for the GPU leaf stage, issue 5): how the leaves'
//! search work is spread, in the GPU plan's leaf order. Runs on the CPU (no GPU needed): a
//! [`BucketSolver`] that solves every bucket with the CPU search and keeps the descriptors.
//!
//! ```text
//! cargo run --release --no-default-features --features cuda --example leaf_stats -- ℓ b rot n [cli]
//! ```
//! `rot` is 0 or 1; `cli` takes the keys of `mphf bench build` instead of `gpu_bench`'s. Work is
//! a leaf's descriptor (candidates tried), or its base count D/ℓ for a rotated full leaf.
use std::sync::{Arc, Mutex};

use datafusion_mphf::core::build::{solve_bucket, BucketSolver, DEFAULT_WATCHDOG};
use datafusion_mphf::core::hash::mix64;
use datafusion_mphf::core::{Builder, Params};
use rayon::prelude::*;

/// Solves on the CPU, bucket by bucket, and keeps the offsets and descriptors.
#[derive(Default)]
struct Keep(Mutex<Option<(Vec<u64>, Vec<u64>)>>);

impl BucketSolver for Keep {
    fn name(&self) -> &str {
        "cpu-kept"
    }
    fn solve(&self, p: &Params, keys: &mut [u64], offsets: &[u64]) -> Result<Vec<u64>, String> {
        let mut slices = Vec::with_capacity(offsets.len() - 1);
        let mut rest = keys;
        for w in offsets.windows(2) {
            let (head, tail) = rest.split_at_mut((w[1] - w[0]) as usize);
            slices.push(head);
            rest = tail;
        }
        let desc: Vec<Vec<u64>> = slices
            .into_par_iter()
            .map(|s| {
                let mut scratch = vec![0u64; s.len()];
                let mut out = Vec::new();
                solve_bucket(p, s, &mut scratch, DEFAULT_WATCHDOG, &mut out).map(|_| out)
            })
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{e:?}"))?;
        let desc: Vec<u64> = desc.concat();
        *self.0.lock().unwrap() = Some((offsets.to_vec(), desc.clone()));
        Ok(desc)
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    if a.len() < 5 {
        eprintln!("usage: leaf_stats ℓ b rot(0|1) n [cli]");
        std::process::exit(2);
    }
    let (leaf, bucket): (usize, usize) = (a[1].parse().unwrap(), a[2].parse().unwrap());
    let (rot, n, cli) = (a[3] == "1", a[4].parse::<usize>().unwrap(), a.len() > 5);
    let keys: Vec<u64> = if cli {
        (0..n as u64).map(|i| mix64(i ^ mix64(42))).collect()
    } else {
        // gpu_bench's `random_keys(n, 42)`.
        let mut x = 42u64.wrapping_mul(0xA076_1D64_78BD_642F);
        (0..n)
            .map(|_| {
                x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                mix64(x)
            })
            .collect()
    };
    let params = Params::try_new(leaf, bucket, rot).unwrap();
    let keep = Arc::new(Keep::default());
    let t = std::time::Instant::now();
    Builder::new(params).solver(Some(keep.clone())).build(&keys).unwrap();
    eprintln!("build {:.1} s", t.elapsed().as_secs_f64());
    let (offsets, desc) = keep.0.lock().unwrap().take().unwrap();
    let plan = datafusion_mphf::gpu::build::plan(&params, &offsets);
    let leaves = plan.stages.last().unwrap();
    let work: Vec<f64> = leaves
        .iter()
        .map(|nd| {
            let d = desc[nd.slot as usize] as f64;
            if rot && nd.m as usize == leaf {
                d / leaf as f64
            } else {
                d
            }
        })
        .collect();
    let mean = work.iter().sum::<f64>() / work.len() as f64;
    let mut sorted = work.clone();
    sorted.sort_by(|x, y| y.total_cmp(x));
    let top: Vec<f64> = sorted
        .iter()
        .take(5)
        .map(|w| (w / mean * 10.0).round() / 10.0)
        .collect();
    let full = leaves.iter().filter(|nd| nd.m as usize == leaf).count();
    // Key hashes spent (estimate): a plain search hashes its midstop head (α = 3 for ℓ ≥ 14,
    // else 2; all keys below 9) per candidate; a rotated base hashes the even keys (≈ ℓ/2).
    let (mut plain_hashes, mut rotated_hashes) = (0.0f64, 0.0f64);
    for (nd, w) in leaves.iter().zip(&work) {
        let m = nd.m as f64;
        if rot && nd.m as usize == leaf {
            rotated_hashes += w * m / 2.0;
        } else {
            let alpha = if leaf >= 14 { 3.0 } else { 2.0 };
            let head = if nd.m >= 9 { (alpha * m.sqrt()).ceil().min(m) } else { m };
            plain_hashes += w * head;
        }
    }
    println!(
        "key hashes (estimate): plain leaves {:.1}%, rotated leaves {:.1}%",
        100.0 * plain_hashes / (plain_hashes + rotated_hashes),
        100.0 * rotated_hashes / (plain_hashes + rotated_hashes)
    );
    println!(
        "({leaf},{bucket}) rot={rot} n={n} cli={cli}: {} leaves ({full} full), mean work {mean:.0}, \
         largest five in means {top:?}",
        work.len()
    );
}
