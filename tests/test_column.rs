//! End-to-end tests of the column index (issue 2 item 6): every key type, NULLs and duplicates,
//! membership verification, the file format and its error paths, probe casts, property tests.

// Test code indexes parallel arrays by row and passes one-chunk slices; both read clearer so.
#![allow(clippy::needless_range_loop, clippy::cloned_ref_to_slice_refs)]

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BinaryArray, Date32Array, Date64Array, DictionaryArray, Float64Array, Int16Array, Int32Array,
    Int64Array, Int8Array, LargeBinaryArray, LargeStringArray, ListArray, StringArray, StringViewArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray, UInt16Array,
    UInt32Array, UInt64Array, UInt8Array,
};
use arrow::datatypes::{DataType, Int32Type};
use arrow::util::display::array_value_to_string;
use datafusion_mphf::core::column::{ColumnIndex, IndexOptions, KeyType, ABSENT, FORMAT_VERSION};
use datafusion_mphf::core::Params;
use datafusion_mphf::MphfError;
use proptest::prelude::*;

fn show(a: &dyn Array, i: usize) -> String {
    // Display can fail for some time zones without chrono-tz; the Debug form still identifies
    // the value.
    array_value_to_string(a, i).unwrap_or_else(|_| format!("{:?}", a.slice(i, 1)))
}

fn opts() -> IndexOptions {
    IndexOptions::default()
}

/// Builds over `chunks` and checks counts, that the member rows' slots are a permutation of
/// `0..distinct` with `keys()[slot]` equal to the row, that NULLs and `non_members` get NULL,
/// and that the raw slots agree. Returns the index.
fn check(chunks: &[ArrayRef], non_members: &dyn Array) -> ColumnIndex {
    let idx = ColumnIndex::build(chunks, &opts()).unwrap();
    let mut distinct: HashMap<String, Option<u64>> = HashMap::new();
    let (mut rows, mut nulls) = (0, 0);
    for c in chunks {
        rows += c.len() as u64;
        nulls += c.null_count() as u64;
        for i in 0..c.len() {
            if c.is_valid(i) {
                distinct.insert(show(c, i), None);
            }
        }
    }
    assert_eq!(idx.len(), distinct.len() as u64);
    assert_eq!(idx.stats().rows, rows);
    assert_eq!(idx.stats().nulls, nulls);
    assert_eq!(idx.stats().distinct, distinct.len() as u64);
    assert_eq!(idx.keys().len(), distinct.len());
    assert_eq!(idx.keys().null_count(), 0);
    assert_eq!(idx.keys().data_type(), &chunks[0].data_type().clone());
    assert_eq!(idx.slot_type(), DataType::UInt32);
    let mut seen = vec![false; distinct.len()];
    for c in chunks {
        let slots = idx.lookup(c.as_ref()).unwrap();
        let slots = slots.as_any().downcast_ref::<UInt32Array>().unwrap();
        let mut raw = Vec::new();
        idx.lookup_slots(c.as_ref(), &mut raw).unwrap();
        assert_eq!(slots.len(), c.len());
        for i in 0..c.len() {
            if c.is_null(i) {
                assert!(slots.is_null(i), "NULL row {i} got a slot");
                assert_eq!(raw[i], ABSENT);
                continue;
            }
            assert!(slots.is_valid(i), "member {} got no slot", show(c, i));
            let s = slots.value(i) as u64;
            assert_eq!(raw[i], s);
            assert!(s < idx.len());
            assert_eq!(show(idx.keys(), s as usize), show(c, i));
            let prev = distinct.get_mut(&show(c, i)).unwrap();
            match prev {
                Some(p) => assert_eq!(*p, s, "equal keys got different slots"),
                None => {
                    assert!(!seen[s as usize], "slot {s} taken by two keys");
                    seen[s as usize] = true;
                    *prev = Some(s);
                }
            }
        }
    }
    assert!(seen.iter().all(|&b| b), "not every slot was used");
    let miss = idx.lookup(non_members).unwrap();
    assert_eq!(miss.len(), non_members.len());
    assert_eq!(miss.null_count(), non_members.len(), "a non-member got a slot");
    idx
}

/// Serializes, reads back (bytes and mmap), compares lookups and rewritten bytes.
fn round_trip(idx: &ColumnIndex, probe: &dyn Array) {
    let bytes = idx.write_bytes();
    assert_eq!(bytes.len() as u64, idx.size_bytes());
    let copy = ColumnIndex::from_bytes(&bytes).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("col.mphf");
    idx.write_to_path(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let mapped = ColumnIndex::open(&path).unwrap();
    let expected = idx.lookup(probe).unwrap();
    for other in [&copy, &mapped] {
        assert_eq!(other.key_type(), idx.key_type());
        assert_eq!(other.stats(), idx.stats());
        assert_eq!(other.len(), idx.len());
        assert_eq!(other.mphf(), idx.mphf());
        assert_eq!(other.keys().as_ref(), idx.keys().as_ref());
        assert_eq!(other.device(), idx.device());
        assert_eq!(other.built_at(), idx.built_at());
        assert_eq!(other.provenance(), idx.provenance());
        assert_eq!(&other.lookup(probe).unwrap(), &expected);
        assert_eq!(other.write_bytes(), bytes, "rewrite changed the bytes");
        assert_eq!(other.size_bytes(), bytes.len() as u64);
    }
}

fn split(a: ArrayRef) -> Vec<ArrayRef> {
    let h = a.len() / 2;
    vec![a.slice(0, h), a.slice(h, a.len() - h)]
}

macro_rules! int_case {
    ($name:ident, $arr:ty, $t:ty) => {
        #[test]
        fn $name() {
            let vals: Vec<Option<$t>> = (0..200i64)
                .map(|i| {
                    if i % 17 == 3 {
                        None
                    } else {
                        Some(((i * 7) % 90 - 40) as $t)
                    }
                })
                .chain([Some(<$t>::MIN), Some(<$t>::MAX), Some(<$t>::MIN), Some(0 as $t)])
                .collect();
            let col: ArrayRef = Arc::new(<$arr>::from(vals));
            let non: $arr = (60..100i64).map(|v| v as $t).collect::<Vec<$t>>().into();
            let idx = check(&split(col.clone()), &non);
            assert!(idx.stats().had_duplicates());
            round_trip(&idx, col.as_ref());
        }
    };
}
int_case!(int8_keys, Int8Array, i8);
int_case!(int16_keys, Int16Array, i16);
int_case!(int32_keys, Int32Array, i32);
int_case!(int64_keys, Int64Array, i64);
int_case!(uint8_keys, UInt8Array, u8);
int_case!(uint16_keys, UInt16Array, u16);
int_case!(uint32_keys, UInt32Array, u32);
int_case!(uint64_keys, UInt64Array, u64);

#[test]
fn date_keys() {
    let col: ArrayRef = Arc::new(Date32Array::from(vec![Some(1), None, Some(19000), Some(-5), Some(1)]));
    let idx = check(&[col.clone()], &Date32Array::from(vec![2, 3, 19001]));
    round_trip(&idx, col.as_ref());
    let col: ArrayRef = Arc::new(Date64Array::from(vec![Some(86_400_000), None, Some(0), Some(0)]));
    let idx = check(&[col.clone()], &Date64Array::from(vec![1, 86_400_001]));
    round_trip(&idx, col.as_ref());
}

#[test]
fn timestamp_keys() {
    let v = vec![Some(1_700_000_000i64), None, Some(-1), Some(1_700_000_000), Some(42)];
    let non = vec![0i64, 43, 1_700_000_001];
    let tz: Option<Arc<str>> = Some("+02:00".into());
    let cases: Vec<(ArrayRef, ArrayRef)> = vec![
        (
            Arc::new(TimestampSecondArray::from(v.clone()).with_timezone_opt(tz.clone())),
            Arc::new(TimestampSecondArray::from(non.clone()).with_timezone_opt(tz.clone())),
        ),
        (
            Arc::new(TimestampMillisecondArray::from(v.clone())),
            Arc::new(TimestampMillisecondArray::from(non.clone())),
        ),
        (
            Arc::new(TimestampMicrosecondArray::from(v.clone())),
            Arc::new(TimestampMicrosecondArray::from(non.clone())),
        ),
        (
            Arc::new(TimestampNanosecondArray::from(v.clone()).with_timezone("UTC")),
            Arc::new(TimestampNanosecondArray::from(non.clone()).with_timezone("UTC")),
        ),
    ];
    for (col, non) in cases {
        let idx = check(&[col.clone()], non.as_ref());
        assert!(matches!(idx.key_type(), KeyType::Timestamp(..)));
        round_trip(&idx, col.as_ref());
        let back = ColumnIndex::from_bytes(&idx.write_bytes()).unwrap();
        assert_eq!(back.keys().data_type(), col.data_type());
    }
}

fn words(n: usize) -> Vec<Option<String>> {
    (0..n)
        .map(|i| match i % 11 {
            0 => None,
            1 => Some(String::new()),
            2 => Some("a fairly long key that does not fit into a view's inline part".into()),
            _ => Some(format!("key-{}", i % 97)),
        })
        .collect()
}

#[test]
fn byte_keys() {
    let w = words(500);
    let non: Vec<String> = (100..140)
        .map(|i| format!("key-{i}"))
        .chain(["KEY-1".into(), "x".into()])
        .collect();
    let cases: Vec<(ArrayRef, ArrayRef)> = vec![
        (
            Arc::new(StringArray::from(w.clone())),
            Arc::new(StringArray::from(non.clone())),
        ),
        (
            Arc::new(LargeStringArray::from(w.clone())),
            Arc::new(LargeStringArray::from(non.clone())),
        ),
        (
            Arc::new(StringViewArray::from(w.clone())),
            Arc::new(StringViewArray::from(non.clone())),
        ),
        (
            Arc::new(BinaryArray::from_iter(
                w.iter().map(|s| s.as_ref().map(|s| s.as_bytes())),
            )),
            Arc::new(BinaryArray::from_iter_values(non.iter().map(|s| s.as_bytes()))),
        ),
        (
            Arc::new(LargeBinaryArray::from_iter(
                w.iter().map(|s| s.as_ref().map(|s| s.as_bytes())),
            )),
            Arc::new(LargeBinaryArray::from_iter_values(non.iter().map(|s| s.as_bytes()))),
        ),
    ];
    for (col, non) in cases {
        let idx = check(&split(col.clone()), non.as_ref());
        assert!(idx.stats().had_duplicates());
        round_trip(&idx, col.as_ref());
    }
}

#[test]
fn binary_keys_are_not_utf8() {
    let col: ArrayRef = Arc::new(BinaryArray::from_iter_values([&[0xffu8, 0xfe][..], &[0], &[], &[0, 0]]));
    let idx = check(
        &[col.clone()],
        &BinaryArray::from_iter_values([&[0xffu8][..], &[0, 0, 0]]),
    );
    round_trip(&idx, col.as_ref());
}

#[test]
fn duplicates_removed_and_counted() {
    let col: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), Some(5), None, Some(7), Some(5), None]));
    let idx = ColumnIndex::build(&[col], &opts()).unwrap();
    assert_eq!(idx.stats().rows, 6);
    assert_eq!(idx.stats().nulls, 2);
    assert_eq!(idx.stats().distinct, 2);
    assert!(idx.stats().had_duplicates());
    let col: ArrayRef = Arc::new(Int64Array::from(vec![Some(5), None, Some(7)]));
    let idx = ColumnIndex::build(&[col], &opts()).unwrap();
    assert!(!idx.stats().had_duplicates());
}

#[test]
fn empty_and_all_null_columns() {
    let empty: ArrayRef = Arc::new(Int64Array::from(Vec::<i64>::new()));
    let idx = check(&[empty.clone()], &Int64Array::from(vec![0, 1, -1]));
    assert!(idx.is_empty());
    assert_eq!(idx.stats().rows, 0);
    round_trip(&idx, &Int64Array::from(vec![0]));
    let nulls: ArrayRef = Arc::new(StringArray::from(vec![None::<&str>; 5]));
    let idx = check(&[nulls.clone()], &StringArray::from(vec!["", "a"]));
    assert!(idx.is_empty());
    assert_eq!(idx.stats().rows, 5);
    assert_eq!(idx.stats().nulls, 5);
    round_trip(&idx, nulls.as_ref());
    // No chunks at all: the type is unknown.
    let e = ColumnIndex::build(&[], &opts()).unwrap_err().to_string();
    assert_eq!(e, "invalid parameter: no column chunks: the key type is unknown");
}

#[test]
fn unsupported_types_are_named() {
    let col: ArrayRef = Arc::new(Float64Array::from(vec![1.0, 2.0]));
    let e = ColumnIndex::build(&[col], &opts()).unwrap_err();
    assert!(matches!(e, MphfError::UnsupportedType(_)));
    assert!(
        e.to_string()
            .starts_with("unsupported key type Float64: supported are Int8-Int64"),
        "{e}"
    );
    let list: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![Some(vec![
        Some(1),
    ])]));
    let e = ColumnIndex::build(&[list], &opts()).unwrap_err().to_string();
    assert!(e.starts_with("unsupported key type List("), "{e}");
    let e = KeyType::from_arrow(&DataType::Boolean).unwrap_err().to_string();
    assert!(e.starts_with("unsupported key type Boolean:"), "{e}");
}

#[test]
fn mixed_chunk_types_are_rejected() {
    let a: ArrayRef = Arc::new(Int64Array::from(vec![1]));
    let b: ArrayRef = Arc::new(Int32Array::from(vec![2]));
    let e = ColumnIndex::build(&[a, b], &opts()).unwrap_err().to_string();
    assert_eq!(
        e,
        "invalid parameter: column chunks have different types: Int64 and Int32"
    );
}

#[test]
fn dictionary_columns_are_decoded() {
    let dict: DictionaryArray<Int32Type> = vec![Some("a"), Some("b"), None, Some("a")].into_iter().collect();
    let col: ArrayRef = Arc::new(dict);
    let idx = ColumnIndex::build(&[col.clone()], &opts()).unwrap();
    assert_eq!(idx.key_type(), &KeyType::Utf8);
    assert_eq!(idx.len(), 2);
    let slots = idx.lookup(col.as_ref()).unwrap();
    assert_eq!(slots.null_count(), 1);
    let s = slots.as_any().downcast_ref::<UInt32Array>().unwrap();
    assert_eq!(s.value(0), s.value(3));
}

#[test]
fn probes_are_cast_within_their_family() {
    let col: ArrayRef = Arc::new(Int64Array::from(vec![1, 300, -7, 1 << 40]));
    let idx = ColumnIndex::build(&[col], &opts()).unwrap();
    let direct = idx.lookup(&Int64Array::from(vec![300, -7, 5])).unwrap();
    let narrow = idx.lookup(&Int16Array::from(vec![300, -7, 5])).unwrap();
    assert_eq!(&direct, &narrow);
    assert_eq!(direct.null_count(), 1);
    // u64 values above i64::MAX cannot be members of an Int64 index: NULL, not a wrong slot.
    let wide = idx.lookup(&UInt64Array::from(vec![u64::MAX, 1])).unwrap();
    assert!(wide.is_null(0) && wide.is_valid(1));
    let e = idx.lookup(&StringArray::from(vec!["1"])).unwrap_err();
    assert!(matches!(e, MphfError::TypeMismatch { .. }));
    assert_eq!(
        e.to_string(),
        "key type mismatch: the index holds Int64 keys, the probe column is Utf8"
    );
    let e = idx.lookup(&Float64Array::from(vec![1.0])).unwrap_err().to_string();
    assert_eq!(
        e,
        "key type mismatch: the index holds Int64 keys, the probe column is Float64"
    );
    let e = idx.lookup(&Date32Array::from(vec![1])).unwrap_err().to_string();
    assert_eq!(
        e,
        "key type mismatch: the index holds Int64 keys, the probe column is Date32"
    );
    // The Null type is all NULL.
    let nulls = arrow::array::NullArray::new(3);
    assert_eq!(idx.lookup(&nulls).unwrap().null_count(), 3);

    let col: ArrayRef = Arc::new(StringArray::from(vec!["x", "yy", "zzz"]));
    let idx = ColumnIndex::build(&[col], &opts()).unwrap();
    let probe = vec!["yy", "q", "zzz"];
    let a = idx.lookup(&StringArray::from(probe.clone())).unwrap();
    assert_eq!(a.null_count(), 1);
    assert_eq!(&idx.lookup(&LargeStringArray::from(probe.clone())).unwrap(), &a);
    assert_eq!(&idx.lookup(&StringViewArray::from(probe.clone())).unwrap(), &a);
    let dict: DictionaryArray<Int32Type> = probe.iter().copied().collect();
    assert_eq!(&idx.lookup(&dict).unwrap(), &a);
    let e = idx.lookup(&Int64Array::from(vec![1])).unwrap_err().to_string();
    assert_eq!(
        e,
        "key type mismatch: the index holds Utf8 keys, the probe column is Int64"
    );
}

#[test]
fn probe_nulls_and_sliced_probes() {
    let col: ArrayRef = Arc::new(UInt32Array::from((0..5000).collect::<Vec<u32>>()));
    let idx = ColumnIndex::build(&[col.clone()], &opts()).unwrap();
    let probe = UInt32Array::from(
        (0..6000)
            .map(|i| if i % 3 == 0 { None } else { Some(i) })
            .collect::<Vec<_>>(),
    );
    let probe = probe.slice(7, 5000);
    let slots = idx.lookup(&probe).unwrap();
    let slots = slots.as_any().downcast_ref::<UInt32Array>().unwrap();
    for i in 0..probe.len() {
        let v = (i + 7) as u32;
        let member = !v.is_multiple_of(3) && v < 5000;
        assert_eq!(slots.is_valid(i), member, "row {i} (value {v})");
        if member {
            assert_eq!(show(idx.keys(), slots.value(i) as usize), v.to_string());
        }
    }
}

#[test]
fn parameters_threads_and_provenance() {
    let col: ArrayRef = Arc::new(Int64Array::from((0..20_000).map(|i| i * 3).collect::<Vec<i64>>()));
    let a = ColumnIndex::build(
        &[col.clone()],
        &IndexOptions {
            params: Params::try_new(5, 5, true).unwrap(),
            seed: 9,
            threads: Some(1),
            solver: None,
        },
    )
    .unwrap();
    let mut b = ColumnIndex::build(
        &[col.clone()],
        &IndexOptions {
            params: Params::try_new(5, 5, true).unwrap(),
            seed: 9,
            threads: Some(2),
            solver: None,
        },
    )
    .unwrap();
    assert_eq!(a.mphf(), b.mphf());
    assert_eq!(a.keys().as_ref(), b.keys().as_ref());
    assert_eq!(a.mphf().params(), Params::try_new(5, 5, true).unwrap());
    assert_eq!(a.device(), "cpu");
    b.set_provenance("fingerprint: abc ✓".into());
    assert_eq!(b.provenance(), "fingerprint: abc ✓");
    round_trip(&b, col.as_ref());
    assert_eq!(
        ColumnIndex::from_bytes(&b.write_bytes()).unwrap().provenance(),
        "fingerprint: abc ✓"
    );
    let bad = IndexOptions {
        params: Params {
            leaf: 30,
            bucket: 100,
            rotation: false,
        },
        ..opts()
    };
    let e = ColumnIndex::build(&[col], &bad).unwrap_err().to_string();
    assert_eq!(e, "invalid parameter: leaf size 30 is outside 2..=24");
}

#[test]
fn open_reads_large_files() {
    let col: ArrayRef = Arc::new(StringArray::from(
        (0..10_000).map(|i| format!("k{i}")).collect::<Vec<_>>(),
    ));
    let idx = ColumnIndex::build(&[col.clone()], &opts()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.mphf");
    idx.write_to_path(&path).unwrap();
    let mapped = ColumnIndex::open(&path).unwrap();
    assert_eq!(
        &mapped.lookup(col.as_ref()).unwrap(),
        &idx.lookup(col.as_ref()).unwrap()
    );
    // The arrays keep the file's buffer alive after the index is dropped.
    let keys = mapped.keys().clone();
    drop(mapped);
    assert_eq!(keys.as_ref(), idx.keys().as_ref());
    let e = ColumnIndex::open(&dir.path().join("missing.mphf")).unwrap_err();
    assert!(matches!(e, MphfError::Io(_)));
}

fn sample_bytes() -> Vec<u8> {
    let col: ArrayRef = Arc::new(Int32Array::from((0..1000).collect::<Vec<i32>>()));
    ColumnIndex::build(&[col], &opts()).unwrap().write_bytes()
}

fn load_err(bytes: &[u8]) -> String {
    let e = ColumnIndex::from_bytes(bytes).unwrap_err();
    assert!(matches!(e, MphfError::Format(_)), "{e}");
    e.to_string()
}

#[test]
fn corrupt_files_give_clear_errors() {
    let good = sample_bytes();
    assert_eq!(&good[..8], b"MPHFIDX\0");
    assert_eq!(u64::from_le_bytes(good[8..16].try_into().unwrap()), FORMAT_VERSION);
    let n = good.len();

    let mut bad = good.clone();
    bad[n / 2] ^= 0x10;
    let e = load_err(&bad);
    assert!(e.starts_with("invalid index file: checksum mismatch (stored 0x"), "{e}");
    assert!(e.ends_with("): the file is corrupt"), "{e}");

    let mut bad = good.clone();
    bad[n - 1] ^= 1;
    assert!(load_err(&bad).starts_with("invalid index file: checksum mismatch"));

    assert_eq!(
        load_err(&good[..n - 16]),
        format!(
            "invalid index file: truncated: the file has {} bytes, its header says {n}",
            n - 16
        )
    );
    assert_eq!(
        load_err(&good[..n - 3]),
        format!(
            "invalid index file: truncated: the file has {} bytes, its header says {n}",
            n - 3
        )
    );
    assert_eq!(
        load_err(&good[..5]),
        "invalid index file: truncated: the file has 5 bytes"
    );
    assert_eq!(load_err(&[]), "invalid index file: truncated: the file has 0 bytes");
    assert_eq!(
        load_err(&good[..20]),
        "invalid index file: truncated: the file has 20 bytes"
    );
    let mut longer = good.clone();
    longer.extend_from_slice(&[0; 8]);
    assert_eq!(
        load_err(&longer),
        format!(
            "invalid index file: trailing data: the file has {} bytes, its header says {n}",
            n + 8
        )
    );

    let mut bad = good.clone();
    bad[..8].copy_from_slice(b"PAR1\0\0\0\0");
    assert_eq!(
        load_err(&bad),
        "invalid index file: bad magic number: not an mphf column index"
    );
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&2u64.to_le_bytes());
    assert_eq!(
        load_err(&bad),
        "invalid index file: unsupported format version 2 (this build reads version 1)"
    );
    let mut bad = good.clone();
    bad[8..16].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(
        load_err(&bad),
        "invalid index file: unsupported format version 0 (this build reads version 1)"
    );

    // Same errors through open (small and large files).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.mphf");
    std::fs::write(&path, &good[..n - 16]).unwrap();
    let e = ColumnIndex::open(&path).unwrap_err().to_string();
    assert!(e.starts_with("invalid index file: truncated"), "{e}");
    let col: ArrayRef = Arc::new(Int64Array::from((0..5000).collect::<Vec<i64>>()));
    let mut big = ColumnIndex::build(&[col], &opts()).unwrap().write_bytes();
    let m = big.len();
    big[m / 3] ^= 4;
    std::fs::write(&path, &big).unwrap();
    let e = ColumnIndex::open(&path).unwrap_err().to_string();
    assert!(e.starts_with("invalid index file: checksum mismatch"), "{e}");
    std::fs::write(&path, &big[..m - 8]).unwrap();
    let e = ColumnIndex::open(&path).unwrap_err().to_string();
    assert!(e.starts_with("invalid index file: truncated"), "{e}");
}

/// Re-checksums `bytes` after an edit, to reach the structural checks behind the checksum.
fn reseal(bytes: &mut [u8]) {
    let n = bytes.len();
    let sum = xxhash_rust::xxh3::xxh3_64(&bytes[..n - 8]);
    bytes[n - 8..].copy_from_slice(&sum.to_le_bytes());
}

#[test]
fn structural_errors_behind_a_valid_checksum() {
    let good = sample_bytes();
    let word = |i: usize| i * 8..i * 8 + 8;
    // Key type tag 99.
    let mut bad = good.clone();
    bad[word(4)].copy_from_slice(&99u64.to_le_bytes());
    reseal(&mut bad);
    assert_eq!(
        load_err(&bad),
        "invalid index file: unknown key type tag 99 (timestamp unit 0)"
    );
    // A byte-key tag on an integer index.
    let mut bad = good.clone();
    bad[word(4)].copy_from_slice(&12u64.to_le_bytes());
    reseal(&mut bad);
    assert_eq!(
        load_err(&bad),
        "invalid index file: the MPHF hashes keys as Integer, not as Utf8 keys"
    );
    // Int32 → Int64: the keys section has the wrong width.
    let mut bad = good.clone();
    bad[word(4)].copy_from_slice(&4u64.to_le_bytes());
    reseal(&mut bad);
    assert_eq!(
        load_err(&bad),
        "invalid index file: key width 4 does not match Int64 keys"
    );
    // Distinct count disagreeing with the MPHF.
    let mut bad = good.clone();
    bad[word(8)].copy_from_slice(&999u64.to_le_bytes());
    reseal(&mut bad);
    assert_eq!(
        load_err(&bad),
        "invalid index file: the MPHF has 1000 keys, the header says 999"
    );
    // Every single-byte change of the header or the keys behind a valid checksum is an error or
    // a valid index, never a panic. (The MPHF section's own checks are the core's.)
    let header_end = u64::from_le_bytes(good[word(3)].try_into().unwrap()) as usize;
    let mphf_words = u64::from_le_bytes(good[word(header_end)].try_into().unwrap()) as usize;
    let keys_start = 8 * (header_end + 1 + mphf_words);
    let positions = (24..8 * header_end + 8).chain(keys_start..good.len() - 8);
    for i in positions.step_by(3) {
        let mut b = good.clone();
        b[i] = b[i].wrapping_add(0x41);
        reseal(&mut b);
        if let Ok(idx) = ColumnIndex::from_bytes(&b) {
            let _ = idx.lookup(&Int32Array::from(vec![0, 5, 999, 1000]));
        }
    }
}

fn check_u64_set(keys: &[u64], absent: &[u64], params: Params) {
    let col: ArrayRef = Arc::new(UInt64Array::from(keys.to_vec()));
    let idx = ColumnIndex::build(&[col.clone()], &IndexOptions { params, ..opts() }).unwrap();
    let mut distinct = keys.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(idx.len(), distinct.len() as u64);
    let mut slots = Vec::new();
    idx.lookup_slots(col.as_ref(), &mut slots).unwrap();
    let mut seen = vec![false; distinct.len()];
    let kv = idx.keys().as_any().downcast_ref::<UInt64Array>().unwrap();
    for (k, &s) in keys.iter().zip(&slots) {
        assert_ne!(s, ABSENT);
        assert_eq!(kv.value(s as usize), *k);
        seen[s as usize] = true;
    }
    assert!(seen.iter().all(|&b| b));
    let absent: Vec<u64> = absent
        .iter()
        .copied()
        .filter(|a| distinct.binary_search(a).is_err())
        .collect();
    idx.lookup_slots(&UInt64Array::from(absent), &mut slots).unwrap();
    assert!(slots.iter().all(|&s| s == ABSENT));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_int_sets(keys in proptest::collection::vec(any::<u64>(), 0..3000), absent in proptest::collection::vec(any::<u64>(), 0..200)) {
        check_u64_set(&keys, &absent, Params::DEFAULT);
    }

    #[test]
    fn consecutive_and_strided_ints(start in any::<u64>(), n in 0usize..4000, k in 0u32..64, leaf in 2usize..12, bucket in 1usize..300) {
        let stride = 1u64 << k;
        let keys: Vec<u64> = (0..n as u64).map(|i| start.wrapping_add(i.wrapping_mul(stride))).collect();
        let absent: Vec<u64> = (0..50u64).map(|i| start.wrapping_add(i.wrapping_mul(stride)).wrapping_add(stride / 2 + 1)).collect();
        check_u64_set(&keys, &absent, Params::try_new(leaf, bucket, leaf % 2 == 0).unwrap());
    }

    #[test]
    fn random_string_sets(keys in proptest::collection::vec(proptest::option::of("[a-c]{0,6}|.{0,40}"), 0..800), absent in proptest::collection::vec("[d-z]{1,8}", 0..50)) {
        // `.{0,40}` can generate a would-be non-member; keep only true non-members.
        let absent: Vec<String> = absent.into_iter().filter(|a| !keys.contains(&Some(a.clone()))).collect();
        for col in [
            Arc::new(StringArray::from(keys.clone())) as ArrayRef,
            Arc::new(StringViewArray::from(keys.clone())) as ArrayRef,
        ] {
            let idx = check(&[col.clone()], &StringArray::from(absent.clone()));
            let back = ColumnIndex::from_bytes(&idx.write_bytes()).unwrap();
            prop_assert_eq!(&back.lookup(col.as_ref()).unwrap(), &idx.lookup(col.as_ref()).unwrap());
        }
    }
}

/// Runs of equal keys (clustered columns) share one query: members, non-members and NULL runs,
/// across the 1024-row lookup blocks, in a sliced probe.
#[test]
fn runs_of_equal_keys() {
    let col: ArrayRef = Arc::new(Int64Array::from((0..3000).map(|i| i * 2).collect::<Vec<i64>>()));
    let idx = ColumnIndex::build(&[col], &opts()).unwrap();
    // Value v repeated (v % 5) + 1 times; every 7th run NULL; odd values are not members.
    let mut rows: Vec<Option<i64>> = Vec::new();
    for v in 0..1500i64 {
        for _ in 0..(v % 5) + 1 {
            rows.push(if v % 7 == 3 { None } else { Some(v * 3) });
        }
    }
    let probe = Int64Array::from(rows.clone());
    let probe = probe.slice(3, rows.len() - 3);
    let mut slots = Vec::new();
    idx.lookup_slots(&probe, &mut slots).unwrap();
    assert_eq!(slots.len(), probe.len());
    for (i, &slot) in slots.iter().enumerate() {
        match rows[i + 3] {
            Some(v) if v % 2 == 0 && v < 6000 => {
                assert_eq!(show(idx.keys(), slot as usize), v.to_string(), "row {i}")
            }
            _ => assert_eq!(slot, ABSENT, "row {i}"),
        }
    }
}

/// Slots of `probe` through the MPHF and through the dense-key table must be identical.
fn dense_agrees(chunks: &[ArrayRef], probe: &dyn Array) {
    let plain = ColumnIndex::build(chunks, &opts()).unwrap();
    let dense = plain.clone().with_dense_lookup(16.0);
    assert!(dense.dense_lookup_bytes() > 0, "dense keys must get a table");
    let (mut a, mut b) = (Vec::new(), Vec::new());
    plain.lookup_slots(probe, &mut a).unwrap();
    dense.lookup_slots(probe, &mut b).unwrap();
    assert_eq!(a, b);
    assert!(a.iter().any(|&s| s != ABSENT) && a.contains(&ABSENT));
}

#[test]
fn dense_lookup_gives_the_mphf_slots() {
    // Int64 keys 0, 3, 6, … with NULLs; probes: members, gaps, out of range both sides, NULLs.
    let keys: ArrayRef = Arc::new(Int64Array::from_iter(
        (0..5000i64).map(|i| (i % 13 != 0).then_some(i * 3)),
    ));
    let probe = Int64Array::from_iter((-50..21_000i64).map(|i| (i % 17 != 0).then_some(i)));
    dense_agrees(&[keys], &probe);
    // Narrow and unsigned types, a probe of another integer type (cast to the key type).
    let keys: ArrayRef = Arc::new(Int16Array::from_iter_values((-300..300i16).map(|i| i * 3)));
    dense_agrees(&[keys], &Int16Array::from_iter_values(-1000..1000));
    let keys: ArrayRef = Arc::new(UInt32Array::from_iter_values((0..4000u32).map(|i| i * 2 + 7)));
    dense_agrees(&[keys], &Int64Array::from_iter_values(0..9000));
    let keys: ArrayRef = Arc::new(Date32Array::from_iter_values(19_000..21_000));
    dense_agrees(&[keys], &Date32Array::from_iter_values(18_990..21_010));
}

#[test]
fn dense_lookup_declines_sparse_and_non_integer_keys() {
    let sparse: ArrayRef = Arc::new(Int64Array::from_iter_values((0..1000i64).map(|i| i * 1000)));
    let idx = ColumnIndex::build(&[sparse], &opts()).unwrap().with_dense_lookup(16.0);
    assert_eq!(idx.dense_lookup_bytes(), 0);
    let huge: ArrayRef = Arc::new(UInt64Array::from(vec![u64::MAX, u64::MAX - 1, 3]));
    let idx = ColumnIndex::build(&[huge], &opts()).unwrap().with_dense_lookup(16.0);
    assert_eq!(idx.dense_lookup_bytes(), 0);
    let strings: ArrayRef = Arc::new(StringArray::from(vec!["a", "b"]));
    let idx = ColumnIndex::build(&[strings], &opts()).unwrap().with_dense_lookup(16.0);
    assert_eq!(idx.dense_lookup_bytes(), 0);
    let dense: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
    let idx = ColumnIndex::build(&[dense], &opts()).unwrap().with_dense_lookup(0.0);
    assert_eq!(idx.dense_lookup_bytes(), 0);
}

/// Saving refuses a target that is not a regular file (a symlink, a FIFO, a folder) and leaves
/// it as it was; a regular file is replaced atomically, with no temporary file left behind.
#[test]
fn save_refuses_special_targets_and_leaves_no_temp_files() {
    let col: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
    let idx = ColumnIndex::build(&[col], &opts()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, b"keep me").unwrap();
    let link = dir.path().join("link.mphf");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let e = idx.write_to_path(&link).unwrap_err().to_string();
    assert!(e.contains("it is not a regular file"), "{e}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
    let fifo = dir.path().join("fifo.mphf");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let e = idx.write_to_path(&fifo).unwrap_err().to_string();
    assert!(e.contains("it is not a regular file"), "{e}");
    // opening one fails at once instead of blocking (FIFO) or reading without end (device)
    let e = ColumnIndex::open(&fifo).unwrap_err().to_string();
    assert!(e.contains("is not a regular file"), "{e}");
    let e = ColumnIndex::open(std::path::Path::new("/dev/zero"))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "invalid index file: /dev/zero is not a regular file");
    let sub = dir.path().join("sub.mphf");
    std::fs::create_dir(&sub).unwrap();
    assert!(idx.write_to_path(&sub).is_err());
    let file = dir.path().join("ok.mphf");
    std::fs::write(&file, b"old").unwrap();
    idx.write_to_path(&file).unwrap();
    assert_eq!(ColumnIndex::open(&file).unwrap().len(), 1000);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
}

/// Slots past 2^32 (issue 21): an index with more than 2^32 slots hands out `UInt64` slots and
/// keeps every value; one with exactly 2^32 keeps `UInt32` (its last slot, 2^32 − 1, still fits),
/// and absent rows are NULL in both.
#[test]
fn slot_arrays_widen_past_two_to_the_32() {
    use arrow::array::{AsArray, UInt32Array, UInt64Array};
    use arrow::datatypes::{DataType, UInt32Type, UInt64Type};
    use datafusion_mphf::core::column::{slot_array, slot_type_for, ABSENT};
    let two32 = 1u64 << 32;
    assert_eq!(slot_type_for(two32), DataType::UInt32);
    assert_eq!(slot_type_for(two32 + 1), DataType::UInt64);

    let wide = slot_array(vec![0, two32 - 1, two32, ABSENT, two32 + 704], two32 + 705);
    let wide = wide.as_primitive::<UInt64Type>();
    let expected = UInt64Array::from(vec![Some(0), Some(two32 - 1), Some(two32), None, Some(two32 + 704)]);
    assert_eq!(wide, &expected);

    let narrow = slot_array(vec![two32 - 1, ABSENT, 7], two32);
    let narrow = narrow.as_primitive::<UInt32Type>();
    assert_eq!(narrow, &UInt32Array::from(vec![Some(u32::MAX), None, Some(7)]));
}
