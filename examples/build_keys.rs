//! Builds an MPHF over random u64 keys and reports size and speed.
//!
//! `cargo run --release --no-default-features --example build_keys -- [n] [leaf] [bucket] [rot]`

use std::time::Instant;

use datafusion_mphf::core::hash::mix64;
use datafusion_mphf::core::{Builder, Params};

fn main() -> Result<(), datafusion_mphf::MphfError> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let n = arg(1, 1_000_000);
    let params = Params::try_new(arg(2, 8), arg(3, 100), arg(4, 0) == 1)?;
    let keys: Vec<u64> = (0..n as u64).map(|i| mix64(i ^ 42)).collect();
    let t = Instant::now();
    let mphf = Builder::new(params).build(&keys)?;
    let build = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut acc = 0u64;
    for k in &keys {
        acc = acc.wrapping_add(mphf.index(k));
    }
    let query = t.elapsed().as_secs_f64();
    let mut out = vec![0u64; n];
    let t = Instant::now();
    mphf.index_batch(&keys, &mut out);
    let batch = t.elapsed().as_secs_f64();
    println!(
        "n={n} {params:?}: {:.4} bits/key, build {:.1} ns/key, query {:.1} ns, batch {:.1} ns (checksum {acc})",
        mphf.bits_per_key(),
        build * 1e9 / n as f64,
        query * 1e9 / n as f64,
        batch * 1e9 / n as f64
    );
    Ok(())
}
