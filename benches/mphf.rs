//! Criterion benches of the MPHF core: build and query at fixed, pre-generated inputs.
//! The cross-library comparison (PtrHash, FMPHGO) is `mphf bench build`; see RESULTS.md.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use datafusion_mphf::core::flat::FlatMphf;
use datafusion_mphf::core::hash::{mix64, Key};
use datafusion_mphf::core::{Builder, Params};

/// (ℓ, b, rotation) configurations benchmarked.
const CONFIGS: [(usize, usize, bool); 4] = [(5, 5, false), (8, 100, false), (8, 100, true), (12, 100, true)];
/// Keys per build.
const N: usize = 200_000;

fn keys(n: usize) -> Vec<u64> {
    (0..n as u64).map(|i| mix64(i ^ 0x5eed)).collect()
}

fn build(c: &mut Criterion) {
    let keys = keys(N);
    let mut g = c.benchmark_group("build");
    g.sample_size(10);
    g.throughput(Throughput::Elements(N as u64));
    for (l, b, r) in CONFIGS {
        let p = Params::try_new(l, b, r).unwrap();
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("l{l}_b{b}_rot{r}")),
            &p,
            |bench, p| bench.iter(|| Builder::new(*p).build(&keys).unwrap()),
        );
    }
    g.finish();
}

fn query(c: &mut Criterion) {
    let keys = keys(N);
    let queries: Vec<u64> = (0..8192u64).map(|i| keys[(mix64(i) % N as u64) as usize]).collect();
    let mut g = c.benchmark_group("query");
    g.throughput(Throughput::Elements(queries.len() as u64));
    for (l, b, r) in CONFIGS {
        let f = Builder::new(Params::try_new(l, b, r).unwrap()).build(&keys).unwrap();
        g.bench_function(format!("single/l{l}_b{b}_rot{r}"), |bench| {
            bench.iter(|| queries.iter().fold(0u64, |a, k| a.wrapping_add(f.index(k))))
        });
        let mut out = vec![0u64; queries.len()];
        g.bench_function(format!("batch/l{l}_b{b}_rot{r}"), |bench| {
            bench.iter(|| {
                f.index_batch(&queries, &mut out);
                black_box(out[0])
            })
        });
        // The decoded copy the column indexes query (same values).
        let flat = FlatMphf::new(&f).expect("descriptors fit u32");
        let seed = f.seed();
        g.bench_function(format!("flat_batch/l{l}_b{b}_rot{r}"), |bench| {
            bench.iter(|| {
                flat.index_batch_with(queries.len(), |i| queries[i].hash128(seed), &mut out);
                black_box(out[0])
            })
        });
    }
    g.finish();
}

criterion_group!(benches, build, query);
criterion_main!(benches);
