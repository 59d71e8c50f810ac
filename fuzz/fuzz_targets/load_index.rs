//! Fuzzes the column index loader: arbitrary bytes must give an index or a clean error, never a
//! panic; a loaded index must answer lookups without panicking.
//!
//! Run: `cargo fuzz run load_index` (from the repository root, with cargo-fuzz installed).
//! Most random inputs stop at the magic number or the checksum; seed the corpus with real index
//! files (`mphf build ... --output fuzz/corpus/load_index/x.mphf`) to reach the structural checks.
#![no_main]

use arrow::array::{Array, BinaryArray, Int64Array, StringArray, UInt64Array};
use datafusion_mphf::core::column::ColumnIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = ColumnIndex::from_bytes(data) {
        let n = index.len();
        let probes: Vec<Box<dyn Array>> = vec![
            Box::new(Int64Array::from(vec![0, 1, -1, i64::MAX, n as i64])),
            Box::new(UInt64Array::from(vec![0, 1, u64::MAX])),
            Box::new(StringArray::from(vec![Some(""), None, Some("key")])),
            Box::new(BinaryArray::from_iter_values([&data[..data.len().min(16)]])),
        ];
        for probe in &probes {
            // A type mismatch is an error, not a panic.
            if let Ok(slots) = index.lookup(probe.as_ref()) {
                assert_eq!(slots.len(), probe.len());
            }
        }
        // The stored keys probe without error; every slot is in range or absent.
        let mut out = Vec::new();
        index.lookup_slots(index.keys().as_ref(), &mut out).expect("keys have the key type");
        assert!(out.iter().all(|&s| s < n || s == datafusion_mphf::core::column::ABSENT));
        let _ = index.write_bytes();
    }
});
