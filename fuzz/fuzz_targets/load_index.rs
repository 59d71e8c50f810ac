//! Fuzzes the column index loader: arbitrary bytes must give an index or a clean error, never a
//! panic; a loaded index must answer each of its own keys with that key's slot, through every
//! lookup strategy, and other probes without a panic.
//!
//! Random bytes almost never carry a valid checksum, so the input is loaded twice: as given,
//! and with its length word and checksum recomputed ("resealed"), which sends every mutation
//! past the checksum into the structural checks. Seed the corpus with real index files
//! (`fuzz/seed-corpus.sh`). The README gives the command and the count of the recorded run.
#![no_main]

use arrow::array::{Array, BinaryArray, Int64Array, StringArray, UInt64Array};
use datafusion_mphf::core::column::{ColumnIndex, ABSENT};
use libfuzzer_sys::fuzz_target;

/// Bytes before the checksum of the smallest file (see `core/column/file.rs`).
const MIN_BODY: usize = 8 * 16;

fn reseal(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < MIN_BODY + 8 {
        return None;
    }
    let mut bytes = data[..data.len() / 8 * 8].to_vec();
    let n = bytes.len();
    bytes[16..24].copy_from_slice(&(n as u64).to_le_bytes());
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..n - 8]);
    bytes[n - 8..].copy_from_slice(&sum.to_le_bytes());
    Some(bytes)
}

fn slots(index: &ColumnIndex, probe: &dyn Array) -> Option<Vec<u64>> {
    let mut out = Vec::new();
    index.lookup_slots(probe, &mut out).ok()?;
    assert_eq!(out.len(), probe.len());
    Some(out)
}

fn check(data: &[u8]) {
    let Ok(index) = ColumnIndex::from_bytes(data) else {
        return;
    };
    let n = index.len();
    let own: Vec<u64> = (0..n).collect();
    let strategies = [
        index.clone(),
        index.clone().with_flat_lookup(),
        index.clone().with_dense_lookup(64.0),
    ];
    let probes: Vec<Box<dyn Array>> = vec![
        Box::new(Int64Array::from(vec![0, 1, -1, i64::MAX, n as i64])),
        Box::new(UInt64Array::from(vec![0, 1, u64::MAX])),
        Box::new(StringArray::from(vec![Some(""), None, Some("key")])),
        Box::new(BinaryArray::from_iter_values([&data[..data.len().min(16)]])),
    ];
    for s in &strategies {
        assert_eq!(slots(s, index.keys().as_ref()).as_deref(), Some(&own[..]), "own keys");
        for probe in &probes {
            // A type mismatch is an error, not a panic; a slot is in range or absent.
            if let Some(out) = slots(s, probe.as_ref()) {
                assert!(out.iter().all(|&x| x < n || x == ABSENT));
            }
        }
    }
    assert_eq!(
        ColumnIndex::from_bytes(&index.write_bytes()).map(|i| i.len()).ok(),
        Some(n)
    );
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(resealed) = reseal(data) {
        check(&resealed);
    }
});
