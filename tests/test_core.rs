//! End-to-end tests of the MPHF core: bijection over every key, determinism, error paths.

use datafusion_mphf::core::{Builder, Mphf, Params};
use datafusion_mphf::MphfError;

/// Asserts that `mphf` maps `keys` one-to-one onto `0..keys.len()` (bitmap check).
fn assert_bijection(mphf: &Mphf, keys: &[u64]) {
    assert_eq!(mphf.len(), keys.len() as u64);
    let mut seen = vec![false; keys.len()];
    for k in keys {
        let v = mphf.index(k) as usize;
        assert!(v < keys.len(), "value {v} out of range for {} keys", keys.len());
        assert!(!seen[v], "value {v} hit twice");
        seen[v] = true;
    }
    let mut batch = vec![0u64; keys.len()];
    mphf.index_batch(keys, &mut batch);
    for (k, b) in keys.iter().zip(&batch) {
        assert_eq!(*b, mphf.index(k));
    }
}

fn random_keys(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9E3779B97F4A7C15);
            datafusion_mphf::core::hash::mix64(x)
        })
        .collect()
}

#[test]
fn small_n_every_size() {
    for &(leaf, bucket, rot) in &[(8, 100, false), (5, 5, true), (2, 1, false), (12, 2000, true), (3, 50, false)] {
        let p = Params::try_new(leaf, bucket, rot).unwrap();
        for n in 0..=2000usize {
            if n > 300 && n % 7 != 0 && leaf >= 12 {
                continue;
            }
            let keys = random_keys(n, n as u64 * 31 + leaf as u64);
            let m = Builder::new(p).build(&keys).unwrap();
            assert_bijection(&m, &keys);
        }
    }
}

#[test]
fn every_leaf_size() {
    for leaf in 2..=24 {
        for rot in [false, true] {
            // Small buckets keep large-ℓ leaves cheap: a bucket of ≤ 13 keys is one small leaf.
            let b = if leaf >= 18 { 5 } else { 50 };
            let p = Params::try_new(leaf, b, rot).unwrap();
            let keys = random_keys(5000, leaf as u64);
            let m = Builder::new(p).build(&keys).unwrap();
            assert_bijection(&m, &keys);
        }
    }
}

#[test]
fn large_n() {
    let keys = random_keys(1_000_000, 7);
    let m = Builder::new(Params::DEFAULT).build(&keys).unwrap();
    assert_bijection(&m, &keys);
    let bpk = m.bits_per_key();
    eprintln!("bits/key at (8,100), 1e6: {bpk}");
}

#[test]
fn deterministic_across_threads() {
    let keys = random_keys(200_000, 3);
    let p = Params::try_new(8, 100, true).unwrap();
    let a = Builder::new(p).threads(Some(1)).build(&keys).unwrap().write_bytes();
    let b = Builder::new(p).threads(Some(2)).build(&keys).unwrap().write_bytes();
    let c = Builder::new(p).threads(Some(7)).build(&keys).unwrap().write_bytes();
    let mut rev = keys.clone();
    rev.reverse();
    let d = Builder::new(p).build(&rev).unwrap().write_bytes();
    assert!(a == b && b == c && c == d);
}

#[test]
fn duplicate_is_named() {
    let keys = vec![1u64, 2, 3, 42, 5, 42];
    let e = Builder::new(Params::DEFAULT).build(&keys).unwrap_err();
    assert_eq!(e.to_string(), "duplicate key 42 in the input (pass the deduplicate option to drop repeated keys)");
    assert!(matches!(e, MphfError::DuplicateKey { .. }));
    let (m, r) = Builder::new(Params::DEFAULT).deduplicate(true).build_with_report(&keys).unwrap();
    assert_eq!(m.len(), 5);
    assert_eq!(r.duplicates_removed, 1);
}
