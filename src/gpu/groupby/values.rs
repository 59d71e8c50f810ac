//! Value columns widened to the 64-bit words the kernels accumulate (i64, or f64 bit patterns),
//! on all cores and piece by piece, with the exactness check of Decimal128 sums; and the
//! device's accumulator words decoded back into values.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType, Decimal128Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type,
    UInt32Type, UInt8Type,
};
use rayon::prelude::*;

use super::{AggOp, ValueKind, Values, OP_MAX, OP_MIN, OP_NN, OP_SUM};
use crate::gpu::staging::split_by_lens;
use crate::gpu::GpuError;

/// The accumulator type of a column of type `dt`.
///
/// # Errors
/// [`GpuError::UnsupportedValueType`] for types the GPU GROUP BY does not aggregate.
pub fn value_kind(dt: &DataType) -> Result<ValueKind, GpuError> {
    match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::Decimal128(_, _) => Ok(ValueKind::I64),
        DataType::Float32 | DataType::Float64 => Ok(ValueKind::F64),
        other => Err(GpuError::UnsupportedValueType(other.clone())),
    }
}

/// Sum of the absolute unscaled values of the non-NULL rows of a decimal column (0 for other
/// types), on one core. Below 2^63 for all of a column's parts, its values fit in i64 and no
/// partial sum of any group can wrap (the kernels add in i64), so decimal results are exact.
fn decimal_abs_sum(values: &dyn Array) -> u128 {
    let Some(d) = values.as_primitive_opt::<Decimal128Type>() else {
        return 0;
    };
    let nulls = d.logical_nulls();
    d.values()
        .iter()
        .enumerate()
        .filter(|&(i, _)| nulls.as_ref().is_none_or(|n| n.is_valid(i)))
        .map(|(_, v)| v.unsigned_abs())
        .fold(0, u128::saturating_add)
}

/// Rows per piece of the parallel widening (one piece per core task).
const WIDEN_PIECE_ROWS: usize = 1 << 16;

/// `parts` cut into pieces of at most [`WIDEN_PIECE_ROWS`] rows, in order (zero-copy slices).
pub(super) fn pieces_of(parts: &[&dyn Array]) -> Vec<ArrayRef> {
    let mut out = Vec::new();
    for p in parts {
        let data = p.to_data();
        let mut at = 0;
        while at < p.len() {
            let len = WIDEN_PIECE_ROWS.min(p.len() - at);
            out.push(arrow::array::make_array(data.slice(at, len)));
            at += len;
        }
    }
    out
}

/// Fails when the decimal parts' values could make a 64-bit sum inexact (see [`decimal_abs_sum`]).
pub(super) fn check_exact(pieces: &[ArrayRef]) -> Result<(), GpuError> {
    let total = pieces
        .par_iter()
        .map(|p| decimal_abs_sum(p.as_ref()))
        .reduce(|| 0, u128::saturating_add);
    if total >= 1 << 63 {
        return Err(GpuError::DecimalOverflow);
    }
    Ok(())
}

/// Writes the column's values into `out` (one u64 per row) as the kernels read them: integers
/// and decimals (already checked by [`check_exact`]) as i64, floats as f64 bits. NULL slots are
/// widened too; the validity masks them. One core: callers parallelize over pieces.
fn widen_into(values: &dyn Array, out: &mut [u64]) -> Result<(), GpuError> {
    macro_rules! map {
        ($t:ty, $f:expr) => {
            for (o, v) in out.iter_mut().zip(values.as_primitive::<$t>().values().iter()) {
                *o = $f(*v);
            }
        };
    }
    if out.len() != values.len() {
        return Err(GpuError::LengthMismatch(format!(
            "{} rows for {} slots",
            values.len(),
            out.len()
        )));
    }
    match values.data_type() {
        DataType::Int8 => map!(Int8Type, |v: i8| v as i64 as u64),
        DataType::Int16 => map!(Int16Type, |v: i16| v as i64 as u64),
        DataType::Int32 => map!(Int32Type, |v: i32| v as i64 as u64),
        DataType::Int64 => map!(Int64Type, |v: i64| v as u64),
        DataType::UInt8 => map!(UInt8Type, |v: u8| v as u64),
        DataType::UInt16 => map!(UInt16Type, |v: u16| v as u64),
        DataType::UInt32 => map!(UInt32Type, |v: u32| v as u64),
        DataType::Decimal128(_, _) => map!(Decimal128Type, |v: i128| v as i64 as u64),
        DataType::Float32 => map!(Float32Type, |v: f32| (v as f64).to_bits()),
        DataType::Float64 => map!(Float64Type, |v: f64| v.to_bits()),
        other => return Err(GpuError::UnsupportedValueType(other.clone())),
    }
    Ok(())
}

/// Widens `pieces` into `out` (their rows in order) on all cores.
pub(super) fn widen_pieces(pieces: &[ArrayRef], out: &mut [u64]) -> Result<(), GpuError> {
    let (outs, _) = split_by_lens(out, pieces.iter().map(|p| p.len()));
    pieces
        .par_iter()
        .zip(outs)
        .try_for_each(|(p, piece)| widen_into(p.as_ref(), piece))
}

/// The column's values as the kernels read them, and its accumulator type.
pub(super) fn widen(values: &dyn Array) -> Result<(Vec<u64>, ValueKind), GpuError> {
    let kind = value_kind(values.data_type())?;
    let pieces = pieces_of(&[values]);
    check_exact(&pieces)?;
    let mut out = vec![0u64; values.len()];
    widen_pieces(&pieces, &mut out)?;
    Ok((out, kind))
}

/// The ops bitmask of a column's aggregates (the non-NULL count is always on).
pub(super) fn ops_of(aggs: &[AggOp]) -> u32 {
    aggs.iter().fold(OP_NN, |m, a| {
        m | match a {
            AggOp::Count => 0,
            AggOp::Sum | AggOp::Avg => OP_SUM,
            AggOp::Min => OP_MIN,
            AggOp::Max => OP_MAX,
        }
    })
}

/// Identity accumulators (kernels/groupby.cu min_ident / max_ident).
pub(super) fn min_ident(kind: ValueKind) -> u64 {
    match kind {
        ValueKind::I64 => i64::MAX as u64,
        ValueKind::F64 => u64::MAX,
    }
}
pub(super) fn max_ident(kind: ValueKind) -> u64 {
    match kind {
        ValueKind::I64 => i64::MIN as u64,
        ValueKind::F64 => 0,
    }
}

/// Inverse of the kernel's order-preserving f64 key.
pub(super) fn f64_from_key(k: u64) -> f64 {
    f64::from_bits(if k >> 63 == 1 { k & !(1 << 63) } else { !k })
}

/// Decodes a device sum/min/max array; groups without values get 0.
pub(super) fn decode(kind: ValueKind, raw: Vec<u64>, nn: &[u64], ordered: bool) -> Values {
    match kind {
        ValueKind::I64 => Values::I64(
            raw.iter()
                .zip(nn)
                .map(|(&v, &c)| if c > 0 { v as i64 } else { 0 })
                .collect(),
        ),
        ValueKind::F64 => Values::F64(
            raw.iter()
                .zip(nn)
                .map(|(&v, &c)| match (c > 0, ordered) {
                    (false, _) => 0.0,
                    (true, true) => f64_from_key(v),
                    (true, false) => f64::from_bits(v),
                })
                .collect(),
        ),
    }
}
