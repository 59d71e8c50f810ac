//! Seeded mutants of real index files, each re-checksummed so that it reaches the structural
//! checks behind the checksum (issue 18 item 3): loading any of them gives a valid index or a
//! `Format` error, never a panic, and an index that loads answers every one of its own keys with
//! that key's slot, through each lookup strategy.
//!
//! `MPHF_MUTANTS=N` sets the number of mutants per index (default 1000, four indexes). The
//! coverage-guided fuzzer (`fuzz/`, see the README) explores the same surface further.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int64Array, StringArray, UInt64Array};
use datafusion_mphf::core::column::{ColumnIndex, IndexOptions, ABSENT};
use datafusion_mphf::core::Params;
use datafusion_mphf::MphfError;

/// splitmix64: a small seeded generator, so a failing mutant is reproducible from its seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Words of the header before the MPHF: magic, version, length (left alone: they fail before
/// the structure is read, which the corrupt-file tests cover).
const FIXED_WORDS: usize = 3;

fn word(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap())
}

fn set_word(b: &mut [u8], i: usize, v: u64) {
    b[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes());
}

/// Re-computes the checksum (the last word) after an edit.
fn reseal(b: &mut [u8]) {
    let n = b.len();
    let sum = xxhash_rust::xxh3::xxh3_64(&b[..n - 8]);
    b[n - 8..].copy_from_slice(&sum.to_le_bytes());
}

/// One to three edits of the words between the fixed header and the checksum: bit flips, small
/// and extreme values, off-by-one changes, words copied from elsewhere, and the MPHF's own
/// parameter fields (leaf and bucket size, the edits that panicked before the validation).
fn mutate(good: &[u8], mphf_at: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b = good.to_vec();
    let words = b.len() / 8;
    let body = FIXED_WORDS..words - 1;
    for _ in 0..1 + rng.below(3) {
        let i = body.start + rng.below(body.len());
        let w = word(&b, i);
        let v = match rng.below(8) {
            0 => w ^ (1 << rng.below(64)),
            1 => w.wrapping_add(1),
            2 => w.wrapping_sub(1),
            3 => [0, 1, 2, 3, 7, 8, 64, u64::MAX, u64::MAX / 2][rng.below(9)],
            4 => word(&b, body.start + rng.below(body.len())),
            5 => rng.next(),
            // MPHF header: n, buckets, leaf, bucket size, flags, seed, hash kind, rice length.
            6 => {
                let field = mphf_at + 1 + rng.below(8);
                let v = match field - mphf_at - 1 {
                    2 => 2 + rng.below(23) as u64,
                    3 => 1 + rng.below(2000) as u64,
                    _ => word(&b, field) ^ (1 << rng.below(12)),
                };
                set_word(&mut b, field, v);
                continue;
            }
            _ => w ^ (rng.next() & 0xFF) << (8 * rng.below(8)),
        };
        set_word(&mut b, i, v);
    }
    reseal(&mut b);
    b
}

/// The slots of `probe`, through the public lookup.
fn slots(idx: &ColumnIndex, probe: &dyn Array) -> Vec<u64> {
    let mut out = Vec::new();
    idx.lookup_slots(probe, &mut out).expect("probes of the key type");
    out
}

/// Loads a mutant and, when it loads, checks it: its keys map to their own slots through the
/// MPHF, the decoded copy and the dense table; other probes give a slot in range or none.
/// Returns whether it loaded.
fn load_and_query(bytes: &[u8], probes: &dyn Array) -> bool {
    let idx = match ColumnIndex::from_bytes(bytes) {
        Ok(idx) => idx,
        Err(MphfError::Format(_)) => return false,
        Err(e) => panic!("a mutant gave a non-format error: {e}"),
    };
    let n = idx.len();
    let own: Vec<u64> = (0..n).collect();
    assert_eq!(slots(&idx, idx.keys().as_ref()), own, "compact MPHF");
    let flat = idx.clone().with_flat_lookup();
    assert_eq!(slots(&flat, idx.keys().as_ref()), own, "decoded MPHF");
    let dense = idx.clone().with_dense_lookup(64.0);
    assert_eq!(slots(&dense, idx.keys().as_ref()), own, "dense table");
    for strategy in [&idx, &flat, &dense] {
        if let Ok(cast) = arrow::compute::cast(probes, &idx.keys().data_type().clone()) {
            assert!(slots(strategy, cast.as_ref()).iter().all(|&s| s < n || s == ABSENT));
        }
    }
    let _ = idx.write_bytes();
    true
}

/// Index files of four shapes: sparse integers, strings with rotation, tiny buckets at ℓ = 2,
/// and one key.
fn samples() -> Vec<(&'static str, Vec<u8>, ArrayRef)> {
    let build = |keys: ArrayRef, leaf: usize, bucket: usize, rotation: bool| {
        let opts = IndexOptions {
            params: Params { leaf, bucket, rotation },
            ..IndexOptions::default()
        };
        ColumnIndex::build(&[keys], &opts).unwrap().write_bytes()
    };
    let mut rng = Rng(7);
    let sparse: ArrayRef = Arc::new(Int64Array::from(
        (0..2000).map(|_| rng.next() as i64).collect::<Vec<_>>(),
    ));
    let strings: ArrayRef = Arc::new(StringArray::from(
        (0..1500).map(|i| format!("s-{i:x}")).collect::<Vec<_>>(),
    ));
    let small: ArrayRef = Arc::new(UInt64Array::from((0..300u64).map(|i| i * 977).collect::<Vec<_>>()));
    let one: ArrayRef = Arc::new(Int64Array::from(vec![42]));
    let probes: ArrayRef = Arc::new(Int64Array::from((0..64).map(|i| i * 31 - 5).collect::<Vec<i64>>()));
    vec![
        ("sparse i64, ℓ 8, b 100", build(sparse, 8, 100, false), probes.clone()),
        (
            "strings, ℓ 5, b 20, rotation",
            build(strings.clone(), 5, 20, true),
            strings,
        ),
        ("u64, ℓ 2, b 5", build(small, 2, 5, false), probes.clone()),
        ("one key", build(one, 8, 100, false), probes),
    ]
}

#[test]
fn checksum_valid_mutants_never_panic() {
    let per_index: usize = std::env::var("MPHF_MUTANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    for (name, good, probes) in samples() {
        assert!(
            load_and_query(&good, probes.as_ref()),
            "{name}: the unmutated file loads"
        );
        let header_words = word(&good, 3) as usize;
        let mut loaded = 0;
        for seed in 0..per_index as u64 {
            let mut rng = Rng(seed);
            let bytes = mutate(&good, header_words, &mut rng);
            let outcome = catch_unwind(AssertUnwindSafe(|| load_and_query(&bytes, probes.as_ref())));
            match outcome {
                Ok(true) => loaded += 1,
                Ok(false) => {}
                Err(_) => panic!("{name}: mutant of seed {seed} panicked"),
            }
        }
        // Most edits are caught; some (a build time, a string's byte, an unused padding bit)
        // leave a valid index, which then answered every key above.
        assert!(loaded < per_index, "{name}: {loaded} of {per_index} mutants loaded");
        eprintln!("{name}: {loaded} of {per_index} checksum-valid mutants loaded, the rest were refused");
    }
}

#[test]
fn leaf_edit_is_refused_with_the_bucket_named() {
    // The probe's repro: leaf 8 → 2 with a fresh checksum used to pass `inspect` and panic in
    // `lookup`.
    let (_, good, _) = samples().swap_remove(0);
    let leaf_at = word(&good, 3) as usize + 1 + 2;
    assert_eq!(word(&good, leaf_at), 8);
    let mut bad = good.clone();
    set_word(&mut bad, leaf_at, 2);
    reseal(&mut bad);
    let e = ColumnIndex::from_bytes(&bad).unwrap_err().to_string();
    assert!(e.starts_with("invalid index file: bucket "), "{e}");
    assert!(e.contains(": codes start at bit "), "{e}");
    // A changed seed keeps every structure intact; the keys no longer map to their slots.
    let mut bad = good.clone();
    set_word(&mut bad, leaf_at + 3, word(&good, leaf_at + 3) ^ 1);
    reseal(&mut bad);
    let e = ColumnIndex::from_bytes(&bad).unwrap_err().to_string();
    assert!(
        e.contains("does not map to its slot: the MPHF and the keys disagree"),
        "{e}"
    );
}
