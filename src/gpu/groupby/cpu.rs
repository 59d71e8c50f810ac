//! [`aggregate_cpu`]: the GPU GROUP BY's aggregation on all CPU cores with rayon. It is the
//! fallback without a device, the oracle the GPU results are tested against, and the baseline
//! of the GPU benchmarks.

use arrow::array::Array;
use rayon::prelude::*;

use super::values::{decode, max_ident, min_ident, ops_of, widen};
use super::{AggOp, ColumnResult, GroupByResult, ValueKind, OP_MAX, OP_MIN, OP_SUM};
use crate::gpu::GpuError;

/// One column's per-thread accumulators: non-NULL counts, sums, min and max keys (empty when
/// not asked for).
type ColumnPartial = (Vec<u64>, Vec<u64>, Vec<u64>, Vec<u64>);

/// Per-thread partial of [`aggregate_cpu`].
struct Partial {
    rows: Vec<u64>,
    cols: Vec<ColumnPartial>,
}

/// The same GROUP BY on all CPU cores (rayon): each thread aggregates a contiguous range of rows
/// into its own G + 1 arrays, then the partials are merged per group range in parallel. Float
/// sums add in row order within a thread, then thread order; min/max use `f64::total_cmp`.
/// Slots ≥ `groups` go to the NULL group `groups`.
///
/// # Errors
/// Unsupported value types; columns whose length differs from `slots`.
pub fn aggregate_cpu(
    slots: &[u32],
    groups: u64,
    count_star: bool,
    columns: &[(&dyn Array, &[AggOp])],
) -> Result<GroupByResult, GpuError> {
    let g1 = groups as usize + 1;
    let n = slots.len();
    let mut host = Vec::with_capacity(columns.len());
    for (a, aggs) in columns {
        if a.len() != n {
            return Err(GpuError::LengthMismatch(format!(
                "a value column has {} rows, the slots {n}",
                a.len()
            )));
        }
        let (vals, kind) = widen(*a)?;
        host.push((vals, kind, a.logical_nulls(), ops_of(aggs)));
    }
    let threads = rayon::current_num_threads().max(1);
    let chunk = n.div_ceil(threads).max(1);
    let partials: Vec<Partial> = slots
        .par_chunks(chunk)
        .enumerate()
        .map(|(c, part)| {
            let base = c * chunk;
            let mut rows = if count_star { vec![0u64; g1] } else { Vec::new() };
            if count_star {
                for &s in part {
                    rows[(s as usize).min(g1 - 1)] += 1;
                }
            }
            let cols = host
                .iter()
                .map(|(vals, kind, nulls, ops)| {
                    let (kind, ops) = (*kind, *ops);
                    let mut nn = vec![0u64; g1];
                    let mut sum = vec![0u64; if ops & OP_SUM != 0 { g1 } else { 0 }];
                    let mut mn = vec![min_ident(kind); if ops & OP_MIN != 0 { g1 } else { 0 }];
                    let mut mx = vec![max_ident(kind); if ops & OP_MAX != 0 { g1 } else { 0 }];
                    for (j, &s) in part.iter().enumerate() {
                        let i = base + j;
                        if nulls.as_ref().is_some_and(|m| m.is_null(i)) {
                            continue;
                        }
                        let g = (s as usize).min(g1 - 1);
                        let v = vals[i];
                        nn[g] += 1;
                        accumulate_cpu(kind, ops, g, v, &mut sum, &mut mn, &mut mx);
                    }
                    (nn, sum, mn, mx)
                })
                .collect();
            Partial { rows, cols }
        })
        .collect();
    // Merge per range of groups in parallel, partials in thread order.
    const MERGE: usize = 1 << 14;
    let merge_u64 = |pick: &(dyn Fn(&Partial) -> &Vec<u64> + Sync), f: &(dyn Fn(u64, u64) -> u64 + Sync), init: u64| {
        let mut out = vec![init; g1];
        out.par_chunks_mut(MERGE).enumerate().for_each(|(c, o)| {
            for p in &partials {
                let src = pick(p);
                if src.is_empty() {
                    continue;
                }
                for (k, x) in o.iter_mut().enumerate() {
                    *x = f(*x, src[c * MERGE + k]);
                }
            }
        });
        out
    };
    let add = |a: u64, b: u64| a.wrapping_add(b);
    let rows = count_star.then(|| merge_u64(&|p: &Partial| &p.rows, &add, 0));
    let mut out_cols = Vec::with_capacity(host.len());
    for (ci, (_, kind, _, ops)) in host.iter().enumerate() {
        let kind = *kind;
        let nn = merge_u64(&|p: &Partial| &p.cols[ci].0, &add, 0);
        let fsum = |a: u64, b: u64| (f64::from_bits(a) + f64::from_bits(b)).to_bits();
        let sum = (ops & OP_SUM != 0).then(|| match kind {
            ValueKind::I64 => merge_u64(&|p: &Partial| &p.cols[ci].1, &add, 0),
            ValueKind::F64 => merge_u64(&|p: &Partial| &p.cols[ci].1, &fsum, 0),
        });
        let min = (ops & OP_MIN != 0).then(|| {
            merge_u64(
                &|p: &Partial| &p.cols[ci].2,
                &|a, b| ord_min(kind, a, b),
                min_ident(kind),
            )
        });
        let max = (ops & OP_MAX != 0).then(|| {
            merge_u64(
                &|p: &Partial| &p.cols[ci].3,
                &|a, b| ord_max(kind, a, b),
                max_ident(kind),
            )
        });
        out_cols.push(ColumnResult {
            sum: sum.map(|v| decode(kind, v, &nn, false)),
            min: min.map(|v| decode(kind, v, &nn, true)),
            max: max.map(|v| decode(kind, v, &nn, true)),
            non_null: nn,
        });
    }
    Ok(GroupByResult {
        groups,
        rows,
        columns: out_cols,
    })
}

/// The order-preserving key of an f64 (the kernel's f64_key): total_cmp order as u64 order.
fn f64_key(bits: u64) -> u64 {
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

fn ord_min(kind: ValueKind, a: u64, b: u64) -> u64 {
    match kind {
        ValueKind::I64 => (a as i64).min(b as i64) as u64,
        ValueKind::F64 => a.min(b),
    }
}
fn ord_max(kind: ValueKind, a: u64, b: u64) -> u64 {
    match kind {
        ValueKind::I64 => (a as i64).max(b as i64) as u64,
        ValueKind::F64 => a.max(b),
    }
}

#[inline]
fn accumulate_cpu(kind: ValueKind, ops: u32, g: usize, v: u64, sum: &mut [u64], mn: &mut [u64], mx: &mut [u64]) {
    if ops & OP_SUM != 0 {
        sum[g] = match kind {
            ValueKind::I64 => sum[g].wrapping_add(v),
            ValueKind::F64 => (f64::from_bits(sum[g]) + f64::from_bits(v)).to_bits(),
        };
    }
    let ord = match kind {
        ValueKind::I64 => v,
        ValueKind::F64 => f64_key(v),
    };
    if ops & OP_MIN != 0 {
        mn[g] = ord_min(kind, mn[g], ord);
    }
    if ops & OP_MAX != 0 {
        mx[g] = ord_max(kind, mx[g], ord);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::groupby::values::f64_from_key;
    use crate::gpu::groupby::Values;
    use arrow::array::{Float64Array, Int64Array};

    #[test]
    fn f64_key_orders_like_total_cmp() {
        let xs = [
            f64::NEG_INFINITY,
            -1e300,
            -1.0,
            -0.0,
            0.0,
            1e-300,
            1.0,
            f64::INFINITY,
            f64::NAN,
        ];
        for a in xs {
            assert_eq!(f64_from_key(f64_key(a.to_bits())).to_bits(), a.to_bits());
            for b in xs {
                assert_eq!(
                    f64_key(a.to_bits()).cmp(&f64_key(b.to_bits())),
                    a.total_cmp(&b),
                    "{a} {b}"
                );
            }
        }
    }

    #[test]
    fn cpu_aggregation_small() {
        let slots = [0u32, 1, 0, 5, u32::MAX, 1, 1];
        let ints = Int64Array::from(vec![Some(3), None, Some(-4), Some(7), Some(9), Some(2), Some(i64::MAX)]);
        let floats = Float64Array::from(vec![
            Some(1.5),
            Some(2.0),
            None,
            Some(-0.5),
            None,
            Some(4.0),
            Some(-3.0),
        ]);
        let all = [AggOp::Sum, AggOp::Min, AggOp::Max, AggOp::Avg];
        let r = aggregate_cpu(&slots, 3, true, &[(&ints, &all[..]), (&floats, &all[..])]).unwrap();
        assert_eq!(r.rows, Some(vec![2, 3, 0, 2]));
        let c = &r.columns[0];
        assert_eq!(c.non_null, vec![2, 2, 0, 2]);
        assert_eq!(c.sum, Some(Values::I64(vec![-1, 2i64.wrapping_add(i64::MAX), 0, 16])));
        assert_eq!(c.min, Some(Values::I64(vec![-4, 2, 0, 7])));
        assert_eq!(c.max, Some(Values::I64(vec![3, i64::MAX, 0, 9])));
        let f = &r.columns[1];
        assert_eq!(f.non_null, vec![1, 3, 0, 1]);
        assert_eq!(f.sum, Some(Values::F64(vec![1.5, 3.0, 0.0, -0.5])));
        assert_eq!(f.min, Some(Values::F64(vec![1.5, -3.0, 0.0, -0.5])));
        assert_eq!(f.avg().unwrap(), vec![Some(1.5), Some(1.0), None, Some(-0.5)]);
    }
}
