//! Key types of a column index: the mapping [`KeyType`] ↔ Arrow [`DataType`], hashing of Arrow
//! arrays, and typed views that the build ([`KeySet`]) and the lookup (batched query + verify)
//! share.
//!
//! Hashing (spec §2, issue item 3): integer-like keys (Int8–Int64, UInt8–UInt64, Date32, Date64,
//! Timestamp) are widened to their `u64` bit pattern — signed types sign-extended, so the value
//! and not the width decides the hash — and go through the bijective [`hash_u64`]; byte keys
//! (Utf8, LargeUtf8, Utf8View, Binary, LargeBinary) go through seeded xxh3-128 ([`hash_bytes`]).
//! This matches the `Key` impls of the core, so `Mphf::index(&5i32)` and a column of Int32
//! agree.
//!
//! Invariant: a [`KeyCol`] is null-free or its nulls are handled by the caller; the typed views
//! never allocate per row.

use std::fmt::Debug;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BinaryArray, GenericByteArray, GenericByteViewArray,
    LargeBinaryArray, LargeStringArray, PrimitiveArray, StringArray, StringViewArray,
};
use arrow::datatypes::{
    ArrowNativeType, ByteArrayType, ByteViewType, DataType, Date32Type, Date64Type, Int16Type, Int32Type, Int64Type,
    Int8Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};

use super::KeyType;
use crate::core::bits::prefetch;
use crate::core::build::KeySet;
use crate::core::hash::{hash_bytes, hash_u64, Hash128, KeyHashKind};
use crate::error::{MphfError, Result};

impl KeyType {
    /// The serialized tag of this type (the timestamp unit and zone are stored apart).
    pub(crate) fn tag(&self) -> u64 {
        match self {
            KeyType::Int8 => 1,
            KeyType::Int16 => 2,
            KeyType::Int32 => 3,
            KeyType::Int64 => 4,
            KeyType::UInt8 => 5,
            KeyType::UInt16 => 6,
            KeyType::UInt32 => 7,
            KeyType::UInt64 => 8,
            KeyType::Date32 => 9,
            KeyType::Date64 => 10,
            KeyType::Timestamp(..) => 11,
            KeyType::Utf8 => 12,
            KeyType::LargeUtf8 => 13,
            KeyType::Utf8View => 14,
            KeyType::Binary => 15,
            KeyType::LargeBinary => 16,
        }
    }

    /// Decodes a tag written by [`KeyType::tag`]; `unit` and `tz` are used for timestamps only.
    pub(crate) fn from_tag(tag: u64, unit: u64, tz: Option<Arc<str>>) -> Option<KeyType> {
        Some(match tag {
            1 => KeyType::Int8,
            2 => KeyType::Int16,
            3 => KeyType::Int32,
            4 => KeyType::Int64,
            5 => KeyType::UInt8,
            6 => KeyType::UInt16,
            7 => KeyType::UInt32,
            8 => KeyType::UInt64,
            9 => KeyType::Date32,
            10 => KeyType::Date64,
            11 => KeyType::Timestamp(unit_from_tag(unit)?, tz),
            12 => KeyType::Utf8,
            13 => KeyType::LargeUtf8,
            14 => KeyType::Utf8View,
            15 => KeyType::Binary,
            16 => KeyType::LargeBinary,
            _ => return None,
        })
    }

    /// How keys of this type are hashed.
    pub fn hash_kind(&self) -> KeyHashKind {
        match self.width() {
            Some(_) => KeyHashKind::Integer,
            None => KeyHashKind::Bytes,
        }
    }

    /// Bytes per key for integer-like types, `None` for byte keys.
    pub fn width(&self) -> Option<usize> {
        match self {
            KeyType::Int8 | KeyType::UInt8 => Some(1),
            KeyType::Int16 | KeyType::UInt16 => Some(2),
            KeyType::Int32 | KeyType::UInt32 | KeyType::Date32 => Some(4),
            KeyType::Int64 | KeyType::UInt64 | KeyType::Date64 | KeyType::Timestamp(..) => Some(8),
            KeyType::Utf8 | KeyType::LargeUtf8 | KeyType::Utf8View | KeyType::Binary | KeyType::LargeBinary => None,
        }
    }

    /// The Arrow type's display name (as in error messages and `mphf inspect`).
    pub fn name(&self) -> String {
        self.to_arrow().to_string()
    }
}

/// Serialized tag of a timestamp unit.
pub(crate) fn unit_tag(unit: TimeUnit) -> u64 {
    match unit {
        TimeUnit::Second => 0,
        TimeUnit::Millisecond => 1,
        TimeUnit::Microsecond => 2,
        TimeUnit::Nanosecond => 3,
    }
}

fn unit_from_tag(tag: u64) -> Option<TimeUnit> {
    Some(match tag {
        0 => TimeUnit::Second,
        1 => TimeUnit::Millisecond,
        2 => TimeUnit::Microsecond,
        3 => TimeUnit::Nanosecond,
        _ => return None,
    })
}

/// Conversion mapping of [`KeyType::from_arrow`].
pub(crate) fn key_type_of(dt: &DataType) -> Result<KeyType> {
    Ok(match dt {
        DataType::Int8 => KeyType::Int8,
        DataType::Int16 => KeyType::Int16,
        DataType::Int32 => KeyType::Int32,
        DataType::Int64 => KeyType::Int64,
        DataType::UInt8 => KeyType::UInt8,
        DataType::UInt16 => KeyType::UInt16,
        DataType::UInt32 => KeyType::UInt32,
        DataType::UInt64 => KeyType::UInt64,
        DataType::Date32 => KeyType::Date32,
        DataType::Date64 => KeyType::Date64,
        DataType::Timestamp(unit, tz) => KeyType::Timestamp(*unit, tz.clone()),
        DataType::Utf8 => KeyType::Utf8,
        DataType::LargeUtf8 => KeyType::LargeUtf8,
        DataType::Utf8View => KeyType::Utf8View,
        DataType::Binary => KeyType::Binary,
        DataType::LargeBinary => KeyType::LargeBinary,
        other => return Err(MphfError::UnsupportedType(other.to_string())),
    })
}

/// Inverse of [`key_type_of`].
pub(crate) fn arrow_type_of(kt: &KeyType) -> DataType {
    match kt {
        KeyType::Int8 => DataType::Int8,
        KeyType::Int16 => DataType::Int16,
        KeyType::Int32 => DataType::Int32,
        KeyType::Int64 => DataType::Int64,
        KeyType::UInt8 => DataType::UInt8,
        KeyType::UInt16 => DataType::UInt16,
        KeyType::UInt32 => DataType::UInt32,
        KeyType::UInt64 => DataType::UInt64,
        KeyType::Date32 => DataType::Date32,
        KeyType::Date64 => DataType::Date64,
        KeyType::Timestamp(unit, tz) => DataType::Timestamp(*unit, tz.clone()),
        KeyType::Utf8 => DataType::Utf8,
        KeyType::LargeUtf8 => DataType::LargeUtf8,
        KeyType::Utf8View => DataType::Utf8View,
        KeyType::Binary => DataType::Binary,
        KeyType::LargeBinary => DataType::LargeBinary,
    }
}

/// Families inside which a probe may be cast to the key type; across families a probe is a
/// type mismatch (casting "abc" to Int64 would silently turn every row into NULL).
#[derive(PartialEq, Eq)]
enum Family {
    Integer,
    Temporal,
    Bytes,
}

fn family(dt: &DataType) -> Option<Family> {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => Some(Family::Integer),
        DataType::Date32 | DataType::Date64 | DataType::Timestamp(..) => Some(Family::Temporal),
        DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Utf8View
        | DataType::Binary
        | DataType::LargeBinary
        | DataType::BinaryView => Some(Family::Bytes),
        _ => None,
    }
}

/// `probe` cast to the key type `dt` (checked with [`probe_castable`]) as SQL's `=` compares:
/// a date or timestamp that the cast truncates (a timestamp probe of a date key, nanoseconds of
/// a microsecond key) equals no key, so it becomes NULL (no slot) instead of the truncated
/// value. Integers out of the key type's range already cast to NULL; strings cast exactly.
pub(crate) fn cast_probe_exact(probe: &dyn Array, dt: &DataType) -> Result<ArrayRef, arrow::error::ArrowError> {
    let cast = arrow::compute::cast(probe, dt)?;
    if family(dt) != Some(Family::Temporal) {
        return Ok(cast);
    }
    let base = match probe.data_type() {
        DataType::Dictionary(_, values) => arrow::compute::cast(probe, values)?,
        _ => arrow::array::make_array(probe.to_data()),
    };
    let back = arrow::compute::cast(&cast, base.data_type())?;
    let same = arrow::compute::kernels::cmp::eq(&back, &base)?;
    arrow::compute::nullif(&cast, &arrow::compute::not(&same)?)
}

/// True when a probe of type `from` may be cast to the key type `to`: same family (integers,
/// dates/timestamps, strings/binaries), a dictionary of such values, or the Null type.
pub(crate) fn probe_castable(from: &DataType, to: &DataType) -> bool {
    match from {
        DataType::Null => true,
        DataType::Dictionary(_, values) => probe_castable(values, to),
        _ => family(from).is_some_and(|f| Some(f) == family(to)) && arrow::compute::can_cast_types(from, to),
    }
}

/// An integer native type that widens to its `u64` hashing pattern.
pub(crate) trait IntKey: ArrowNativeType + PartialEq + Debug + Sync + Send {
    /// Sign-extended (signed) or zero-extended (unsigned) bit pattern.
    fn widen(self) -> u64;
}

macro_rules! int_key {
    ($($t:ty => $w:ty),*) => {$(
        impl IntKey for $t {
            #[inline(always)]
            fn widen(self) -> u64 {
                self as $w as u64
            }
        }
    )*};
}
int_key!(i8 => i64, i16 => i64, i32 => i64, i64 => i64, u8 => u64, u16 => u64, u32 => u64, u64 => u64);

/// A typed, indexable key column (one Arrow array, viewed without copying).
pub(crate) trait KeyCol: Sync {
    /// Number of rows.
    fn rows(&self) -> usize;
    /// Hash of row `i` under `seed`.
    fn hash_at(&self, i: usize, seed: u64) -> Hash128;
    /// True when row `i` of `self` equals row `j` of `other`.
    fn eq_at(&self, i: usize, other: &Self, j: usize) -> bool;
    /// Hints that row `i` will be compared soon.
    fn prefetch_at(&self, i: usize);
    /// Hints that the bytes of row `i` will be compared soon (after [`KeyCol::prefetch_at`] of
    /// the same row, some rows earlier: byte keys read their offset or view here).
    #[inline(always)]
    fn prefetch_value_at(&self, _i: usize) {}
    /// Row `i` for messages.
    fn describe_at(&self, i: usize) -> String;
    /// Bytes of row `i` (the native width for primitive keys).
    fn byte_len_at(&self, i: usize) -> usize;
    /// The hashing scheme.
    const KIND: KeyHashKind;
}

/// Integer-like keys: the values slice of a primitive array.
pub(crate) struct PrimCol<'a, N>(pub &'a [N]);

impl<N: IntKey> KeyCol for PrimCol<'_, N> {
    const KIND: KeyHashKind = KeyHashKind::Integer;
    #[inline(always)]
    fn rows(&self) -> usize {
        self.0.len()
    }
    #[inline(always)]
    fn hash_at(&self, i: usize, seed: u64) -> Hash128 {
        hash_u64(self.0[i].widen(), seed)
    }
    #[inline(always)]
    fn eq_at(&self, i: usize, other: &Self, j: usize) -> bool {
        self.0[i] == other.0[j]
    }
    #[inline(always)]
    fn prefetch_at(&self, i: usize) {
        prefetch(self.0.as_ptr().wrapping_add(i));
    }
    fn describe_at(&self, i: usize) -> String {
        format!("{:?}", self.0[i])
    }
    fn byte_len_at(&self, _i: usize) -> usize {
        std::mem::size_of::<N>()
    }
}

/// Access to the bytes of row `i` of a byte array (offset or view layout).
pub(crate) trait BytesAt: Sync {
    /// Number of rows.
    fn rows(&self) -> usize;
    /// The bytes of row `i`.
    fn bytes_at(&self, i: usize) -> &[u8];
    /// Hints that row `i` will be read soon.
    fn prefetch_at(&self, i: usize);
    /// Hints that the bytes of row `i` will be read soon.
    fn prefetch_value_at(&self, i: usize);
}

impl<T: ByteArrayType> BytesAt for GenericByteArray<T>
where
    T::Native: AsRef<[u8]>,
{
    #[inline(always)]
    fn rows(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn bytes_at(&self, i: usize) -> &[u8] {
        self.value(i).as_ref()
    }
    #[inline(always)]
    fn prefetch_at(&self, i: usize) {
        prefetch(self.value_offsets().as_ptr().wrapping_add(i));
    }
    #[inline(always)]
    fn prefetch_value_at(&self, i: usize) {
        if let Some(off) = self.value_offsets().get(i) {
            prefetch(self.value_data().as_ptr().wrapping_add(off.as_usize()));
        }
    }
}

impl<T: ByteViewType + ?Sized> BytesAt for GenericByteViewArray<T>
where
    T::Native: AsRef<[u8]>,
{
    #[inline(always)]
    fn rows(&self) -> usize {
        self.len()
    }
    #[inline(always)]
    fn bytes_at(&self, i: usize) -> &[u8] {
        self.value(i).as_ref()
    }
    #[inline(always)]
    fn prefetch_at(&self, i: usize) {
        prefetch(self.views().as_ptr().wrapping_add(i));
    }
    #[inline(always)]
    fn prefetch_value_at(&self, i: usize) {
        // Views of more than 12 bytes point into a data buffer (index, offset in the upper half).
        let Some(&view) = self.views().get(i) else { return };
        if (view as u32) > 12 {
            let (buffer, offset) = ((view >> 64) as u32, (view >> 96) as u32);
            if let Some(data) = self.data_buffers().get(buffer as usize) {
                prefetch(data.as_ptr().wrapping_add(offset as usize));
            }
        }
    }
}

/// Byte keys: any [`BytesAt`] array.
pub(crate) struct ByteCol<'a, A: ?Sized>(pub &'a A);

impl<A: BytesAt + ?Sized> KeyCol for ByteCol<'_, A> {
    const KIND: KeyHashKind = KeyHashKind::Bytes;
    #[inline(always)]
    fn rows(&self) -> usize {
        self.0.rows()
    }
    #[inline(always)]
    fn hash_at(&self, i: usize, seed: u64) -> Hash128 {
        hash_bytes(self.0.bytes_at(i), seed)
    }
    #[inline(always)]
    fn eq_at(&self, i: usize, other: &Self, j: usize) -> bool {
        self.0.bytes_at(i) == other.0.bytes_at(j)
    }
    #[inline(always)]
    fn prefetch_at(&self, i: usize) {
        self.0.prefetch_at(i);
    }
    #[inline(always)]
    fn prefetch_value_at(&self, i: usize) {
        self.0.prefetch_value_at(i);
    }
    fn describe_at(&self, i: usize) -> String {
        let b = self.0.bytes_at(i);
        match std::str::from_utf8(b) {
            Ok(s) => format!("{s:?}"),
            Err(_) => format!("{b:02x?}"),
        }
    }
    fn byte_len_at(&self, i: usize) -> usize {
        self.0.bytes_at(i).len()
    }
}

/// A null-free key column as a [`KeySet`] for the builder.
pub(crate) struct ColKeySet<'a, C>(pub &'a C);

impl<C: KeyCol> KeySet for ColKeySet<'_, C> {
    fn len(&self) -> usize {
        self.0.rows()
    }
    fn hash_kind(&self) -> KeyHashKind {
        C::KIND
    }
    #[inline]
    fn hash128(&self, i: usize, seed: u64) -> Hash128 {
        self.0.hash_at(i, seed)
    }
    fn keys_equal(&self, i: usize, j: usize) -> bool {
        self.0.eq_at(i, self.0, j)
    }
    fn describe(&self, i: usize) -> String {
        self.0.describe_at(i)
    }
}

/// Something generic over the concrete key column, run by [`with_col`].
pub(crate) trait ColFn {
    /// The result.
    type Out;
    /// Runs on the typed view of an array.
    fn call<C: KeyCol>(self, col: &C, arr: &dyn Array) -> Self::Out;
}

fn prim<T: ArrowPrimitiveType>(arr: &dyn Array) -> &[T::Native] {
    arr.as_primitive::<T>().values()
}

/// The i64 values of a timestamp array of `unit` (every unit stores i64; the unit and zone only
/// change the Arrow type).
fn timestamps(arr: &dyn Array, unit: TimeUnit) -> &[i64] {
    match unit {
        TimeUnit::Second => prim::<TimestampSecondType>(arr),
        TimeUnit::Millisecond => prim::<TimestampMillisecondType>(arr),
        TimeUnit::Microsecond => prim::<TimestampMicrosecondType>(arr),
        TimeUnit::Nanosecond => prim::<TimestampNanosecondType>(arr),
    }
}

/// Runs `f` on the typed view of `arr`, whose Arrow type must be `kt.to_arrow()` (checked by
/// the callers; a mismatch is a bug and panics in the downcast, naming the type).
pub(crate) fn with_col<F: ColFn>(kt: &KeyType, arr: &dyn Array, f: F) -> F::Out {
    macro_rules! p {
        ($t:ty) => {
            f.call(&PrimCol(prim::<$t>(arr)), arr)
        };
    }
    macro_rules! b {
        ($t:ty) => {{
            let a = arr.as_any().downcast_ref::<$t>().unwrap_or_else(|| {
                panic!(
                    "column index: expected {} keys, got {}",
                    stringify!($t),
                    arr.data_type()
                )
            });
            f.call(&ByteCol(a), arr)
        }};
    }
    match kt {
        KeyType::Int8 => p!(Int8Type),
        KeyType::Int16 => p!(Int16Type),
        KeyType::Int32 => p!(Int32Type),
        KeyType::Int64 => p!(Int64Type),
        KeyType::UInt8 => p!(UInt8Type),
        KeyType::UInt16 => p!(UInt16Type),
        KeyType::UInt32 => p!(UInt32Type),
        KeyType::UInt64 => p!(UInt64Type),
        KeyType::Date32 => p!(Date32Type),
        KeyType::Date64 => p!(Date64Type),
        KeyType::Timestamp(unit, _) => f.call(&PrimCol(timestamps(arr, *unit)), arr),
        KeyType::Utf8 => b!(StringArray),
        KeyType::LargeUtf8 => b!(LargeStringArray),
        KeyType::Utf8View => b!(StringViewArray),
        KeyType::Binary => b!(BinaryArray),
        KeyType::LargeBinary => b!(LargeBinaryArray),
    }
}

/// Runs `f` on two arrays of the same key type (keys in slot order, and a probe).
pub(crate) trait PairFn {
    /// The result.
    type Out;
    /// Runs on typed views of the keys and the probe.
    fn call<C: KeyCol>(self, keys: &C, probe: &C) -> Self::Out;
}

/// As [`with_col`] for a pair of arrays of type `kt`.
pub(crate) fn with_pair<F: PairFn>(kt: &KeyType, keys: &dyn Array, probe: &dyn Array, f: F) -> F::Out {
    macro_rules! p {
        ($t:ty) => {
            f.call(&PrimCol(prim::<$t>(keys)), &PrimCol(prim::<$t>(probe)))
        };
    }
    macro_rules! b {
        ($t:ty) => {{
            let k = keys
                .as_any()
                .downcast_ref::<$t>()
                .expect("keys have the index's key type");
            let q = probe
                .as_any()
                .downcast_ref::<$t>()
                .expect("probe was cast to the key type");
            f.call(&ByteCol(k), &ByteCol(q))
        }};
    }
    match kt {
        KeyType::Int8 => p!(Int8Type),
        KeyType::Int16 => p!(Int16Type),
        KeyType::Int32 => p!(Int32Type),
        KeyType::Int64 => p!(Int64Type),
        KeyType::UInt8 => p!(UInt8Type),
        KeyType::UInt16 => p!(UInt16Type),
        KeyType::UInt32 => p!(UInt32Type),
        KeyType::UInt64 => p!(UInt64Type),
        KeyType::Date32 => p!(Date32Type),
        KeyType::Date64 => p!(Date64Type),
        KeyType::Timestamp(unit, _) => f.call(&PrimCol(timestamps(keys, *unit)), &PrimCol(timestamps(probe, *unit))),
        KeyType::Utf8 => b!(StringArray),
        KeyType::LargeUtf8 => b!(LargeStringArray),
        KeyType::Utf8View => b!(StringViewArray),
        KeyType::Binary => b!(BinaryArray),
        KeyType::LargeBinary => b!(LargeBinaryArray),
    }
}

/// The bytes of the keys in slot order, for the file writer: primitive keys as their native
/// little-endian values; byte keys as `(offsets, data)` with `offsets.len() = n + 1`.
pub(crate) enum KeyBytes<'a> {
    /// Native values (`n · width` bytes).
    Fixed(&'a [u8]),
    /// Offsets and concatenated bytes.
    Var(Vec<u64>, Vec<u8>),
}

/// Extracts [`KeyBytes`] from a null-free keys array of type `kt`.
pub(crate) fn key_bytes<'a>(kt: &KeyType, keys: &'a ArrayRef) -> KeyBytes<'a> {
    fn fixed<T: ArrowPrimitiveType>(a: &dyn Array) -> &[u8] {
        a.as_primitive::<T>().values().inner().as_slice()
    }
    fn var<A: BytesAt + ?Sized>(a: &A) -> KeyBytes<'static> {
        let n = a.rows();
        let mut offsets = Vec::with_capacity(n + 1);
        let mut data = Vec::new();
        offsets.push(0);
        for i in 0..n {
            data.extend_from_slice(a.bytes_at(i));
            offsets.push(data.len() as u64);
        }
        KeyBytes::Var(offsets, data)
    }
    let a = keys.as_ref();
    match kt {
        KeyType::Int8 => KeyBytes::Fixed(fixed::<Int8Type>(a)),
        KeyType::Int16 => KeyBytes::Fixed(fixed::<Int16Type>(a)),
        KeyType::Int32 => KeyBytes::Fixed(fixed::<Int32Type>(a)),
        KeyType::Int64 => KeyBytes::Fixed(fixed::<Int64Type>(a)),
        KeyType::UInt8 => KeyBytes::Fixed(fixed::<UInt8Type>(a)),
        KeyType::UInt16 => KeyBytes::Fixed(fixed::<UInt16Type>(a)),
        KeyType::UInt32 => KeyBytes::Fixed(fixed::<UInt32Type>(a)),
        KeyType::UInt64 => KeyBytes::Fixed(fixed::<UInt64Type>(a)),
        KeyType::Date32 => KeyBytes::Fixed(fixed::<Date32Type>(a)),
        KeyType::Date64 => KeyBytes::Fixed(fixed::<Date64Type>(a)),
        KeyType::Timestamp(unit, _) => KeyBytes::Fixed(match unit {
            TimeUnit::Second => fixed::<TimestampSecondType>(a),
            TimeUnit::Millisecond => fixed::<TimestampMillisecondType>(a),
            TimeUnit::Microsecond => fixed::<TimestampMicrosecondType>(a),
            TimeUnit::Nanosecond => fixed::<TimestampNanosecondType>(a),
        }),
        KeyType::Utf8 => var(a.as_string::<i32>()),
        KeyType::LargeUtf8 => var(a.as_string::<i64>()),
        KeyType::Utf8View => var(a.as_string_view()),
        KeyType::Binary => var(a.as_binary::<i32>()),
        KeyType::LargeBinary => var(a.as_binary::<i64>()),
    }
}

/// A primitive array of native type `T` over `buffer`, retyped to `dt` (timestamps keep their
/// unit and zone).
pub(crate) fn primitive_array<T: ArrowPrimitiveType>(
    buffer: arrow::buffer::Buffer,
    len: usize,
    dt: &DataType,
) -> Result<ArrayRef> {
    let values = arrow::buffer::ScalarBuffer::<T::Native>::new(buffer, 0, len);
    let arr = PrimitiveArray::<T>::try_new(values, None)?;
    Ok(Arc::new(arr.with_data_type(dt.clone())))
}
