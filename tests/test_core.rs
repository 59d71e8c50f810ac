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
    for &(leaf, bucket, rot) in &[
        (8, 100, false),
        (5, 5, true),
        (2, 1, false),
        (12, 2000, true),
        (3, 50, false),
    ] {
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
    assert_eq!(
        e.to_string(),
        "duplicate key 42 in the input (pass the deduplicate option to drop repeated keys)"
    );
    assert!(matches!(e, MphfError::DuplicateKey { .. }));
    let (m, r) = Builder::new(Params::DEFAULT)
        .deduplicate(true)
        .build_with_report(&keys)
        .unwrap();
    assert_eq!(m.len(), 5);
    assert_eq!(r.duplicates_removed, 1);
}

/// A key set whose first two keys collide on their full hash under seed 0 only (spec §12.7:
/// an injected `lo` collision must re-seed, and the final seed is stored).
struct Colliding(Vec<u64>);

impl datafusion_mphf::core::KeySet for Colliding {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn hash_kind(&self) -> datafusion_mphf::core::KeyHashKind {
        datafusion_mphf::core::KeyHashKind::Integer
    }
    fn hash128(&self, i: usize, seed: u64) -> datafusion_mphf::core::Hash128 {
        let k = if seed == 0 && i == 1 { self.0[0] } else { self.0[i] };
        datafusion_mphf::core::hash::hash_u64(k, seed)
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        self.0[i] == self.0[j]
    }
    fn describe(&self, i: usize) -> String {
        self.0[i].to_string()
    }
}

#[test]
fn injected_collision_reseeds() {
    let keys = Colliding(random_keys(10_000, 11));
    let (m, report) = Builder::new(Params::DEFAULT).build_with_report(&keys).unwrap();
    assert_eq!(report.attempts, 2);
    assert_eq!(m.seed(), 1);
    let mut seen = vec![false; keys.0.len()];
    for k in &keys.0 {
        let v = m.index(k) as usize;
        assert!(!seen[v]);
        seen[v] = true;
    }
    // The seed survives serialization.
    let back = Mphf::read_bytes(&m.write_bytes()).unwrap();
    assert_eq!(back.seed(), 1);
    assert_eq!(back, m);
}

/// All keys in one bucket whatever the seed: the size cap must stop the build (spec §12.8).
struct OneBucket(usize);

impl datafusion_mphf::core::KeySet for OneBucket {
    fn len(&self) -> usize {
        self.0
    }
    fn hash_kind(&self) -> datafusion_mphf::core::KeyHashKind {
        datafusion_mphf::core::KeyHashKind::Integer
    }
    fn hash128(&self, i: usize, seed: u64) -> datafusion_mphf::core::Hash128 {
        datafusion_mphf::core::Hash128 {
            hi: 0,
            lo: datafusion_mphf::core::hash::mix64(i as u64 ^ seed),
        }
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        i == j
    }
    fn describe(&self, i: usize) -> String {
        i.to_string()
    }
}

#[test]
fn oversized_bucket_is_an_error() {
    let e = Builder::new(Params::try_new(8, 2000, false).unwrap())
        .max_seeds(3)
        .build(&OneBucket(4000))
        .unwrap_err();
    assert_eq!(e.to_string(), "a bucket holds 4000 keys (limit 3000) after 3 seeds");
    // 2999 keys in one bucket is legal (b = 2000 means B = 2).
    let m = Builder::new(Params::try_new(8, 2000, false).unwrap())
        .build(&OneBucket(2999))
        .unwrap();
    assert_eq!(m.len(), 2999);
}

#[test]
fn watchdog_reports_instead_of_hanging() {
    let keys = random_keys(5000, 5);
    let e = Builder::new(Params::try_new(16, 2000, false).unwrap())
        .watchdog(64)
        .build(&keys)
        .unwrap_err();
    assert!(matches!(e, MphfError::Watchdog { limit: 64, .. }), "{e}");
}

#[test]
fn string_keys() {
    let keys: Vec<String> = (0..50_000).map(|i| format!("customer#{i:09}")).collect();
    let m = Builder::new(Params::try_new(8, 100, true).unwrap())
        .build(&keys)
        .unwrap();
    let mut seen = vec![false; keys.len()];
    for k in &keys {
        let v = m.index(k) as usize;
        assert!(!seen[v]);
        seen[v] = true;
    }
    let strs: Vec<&str> = keys.iter().map(|s| s.as_str()).collect();
    let m2 = Builder::new(Params::try_new(8, 100, true).unwrap())
        .build(&strs)
        .unwrap();
    assert_eq!(m.write_bytes(), m2.write_bytes());
    let e = Builder::new(Params::DEFAULT).build(&vec!["a", "b", "a"]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "duplicate key \"a\" in the input (pass the deduplicate option to drop repeated keys)"
    );
}

#[test]
fn adversarial_integer_patterns() {
    let p = Params::DEFAULT;
    let consecutive: Vec<u64> = (0..100_000).collect();
    let strided: Vec<u64> = (0..100_000u64).map(|i| i << 32).collect();
    let high_bits: Vec<u64> = (0..60_000u64).map(|i| i.reverse_bits()).collect();
    let signed: Vec<i64> = (-50_000..50_000).collect();
    for keys in [consecutive, strided, high_bits] {
        let m = Builder::new(p).build(&keys).unwrap();
        assert_bijection(&m, &keys);
    }
    let m = Builder::new(p).build(&signed).unwrap();
    let mut seen = vec![false; signed.len()];
    for k in &signed {
        let v = m.index(k) as usize;
        assert!(!seen[v]);
        seen[v] = true;
    }
}

#[test]
fn serialization_round_trip() {
    for (n, l, b, r) in [
        (0usize, 8, 100, false),
        (1, 8, 100, false),
        (5000, 5, 5, true),
        (20_000, 16, 2000, true),
    ] {
        let keys = random_keys(n, n as u64 + 1);
        let m = Builder::new(Params::try_new(l, b, r).unwrap()).build(&keys).unwrap();
        let bytes = m.write_bytes();
        let back = Mphf::read_bytes(&bytes).unwrap();
        assert_eq!(back.write_bytes(), bytes);
        for k in &keys {
            assert_eq!(back.index(k), m.index(k));
        }
        if n == 0 {
            assert_eq!(m.index(&123u64), 0);
        }
        // Every truncation is an error, never a panic.
        for cut in (0..bytes.len()).step_by(8) {
            assert!(Mphf::read_bytes(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
