//! Property tests (proptest) of the MPHF core on random key sets.

use std::collections::HashSet;

use datafusion_mphf::core::{Builder, Mphf, Params};
use proptest::prelude::*;

fn check_bijection<K: datafusion_mphf::core::Key>(m: &Mphf, keys: &[K]) -> Result<(), TestCaseError> {
    prop_assert_eq!(m.len(), keys.len() as u64);
    let mut seen = vec![false; keys.len()];
    for k in keys {
        let v = m.index(k) as usize;
        prop_assert!(v < keys.len());
        prop_assert!(!seen[v], "value {} twice", v);
        seen[v] = true;
    }
    Ok(())
}

fn params() -> impl Strategy<Value = Params> {
    (
        2usize..=12,
        prop_oneof![Just(1usize), Just(5), Just(50), Just(100), Just(2000)],
        any::<bool>(),
    )
        .prop_map(|(l, b, r)| Params::try_new(l, b, r).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_u64_sets(keys in prop::collection::hash_set(any::<u64>(), 0..3000), p in params()) {
        let keys: Vec<u64> = keys.into_iter().collect();
        let m = Builder::new(p).build(&keys).unwrap();
        check_bijection(&m, &keys)?;
        // Serialization preserves every answer.
        let back = Mphf::read_bytes(&m.write_bytes()).unwrap();
        for k in &keys {
            prop_assert_eq!(back.index(k), m.index(k));
        }
    }

    #[test]
    fn adversarial_integers(start in any::<i64>(), shift in 0u32..63, n in 0usize..3000, p in params()) {
        // Consecutive runs and strides of powers of two (keys that differ only in high bits).
        let consecutive: Vec<i64> = (0..n as i64).map(|i| start.wrapping_add(i)).collect();
        let strided: HashSet<u64> = (0..n as u64).map(|i| i.wrapping_shl(shift)).collect();
        let strided: Vec<u64> = strided.into_iter().collect();
        check_bijection(&Builder::new(p).build(&consecutive).unwrap(), &consecutive)?;
        check_bijection(&Builder::new(p).build(&strided).unwrap(), &strided)?;
    }

    #[test]
    fn random_strings(keys in prop::collection::hash_set(".{0,24}", 0..1500), p in params()) {
        let keys: Vec<String> = keys.into_iter().collect();
        let m = Builder::new(p).build(&keys).unwrap();
        check_bijection(&m, &keys)?;
    }

    #[test]
    fn duplicates_rejected_or_removed(mut keys in prop::collection::vec(0u64..500, 1..800), p in params()) {
        let distinct: HashSet<u64> = keys.iter().copied().collect();
        let r = Builder::new(p).build(&keys);
        if distinct.len() < keys.len() {
            prop_assert!(r.is_err());
        }
        let m = Builder::new(p).deduplicate(true).build(&keys).unwrap();
        prop_assert_eq!(m.len(), distinct.len() as u64);
        keys.sort_unstable();
        keys.dedup();
        check_bijection(&m, &keys)?;
    }

    #[test]
    fn thread_count_does_not_change_bytes(keys in prop::collection::hash_set(any::<u64>(), 0..20000), t in 1usize..5) {
        let keys: Vec<u64> = keys.into_iter().collect();
        let p = Params::try_new(8, 100, true).unwrap();
        let a = Builder::new(p).threads(Some(1)).build(&keys).unwrap().write_bytes();
        let b = Builder::new(p).threads(Some(t)).build(&keys).unwrap().write_bytes();
        prop_assert_eq!(a, b);
    }
}
