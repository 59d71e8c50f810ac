//! GPU query path (issue 7): batch lookups and GROUP BY on slots give the CPU's answers.
//!
//! Without a GPU the device tests print a skip message; the CPU aggregation and the error paths
//! (no panic, an `Err` to fall back on) are tested everywhere.
#![cfg(feature = "cuda")]

mod gpu_query_data;

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Int32Array, Int64Array};
use datafusion_mphf::core::column::{ColumnIndex, IndexOptions};
use datafusion_mphf::core::Params;
use datafusion_mphf::gpu::groupby::{aggregate_cpu, GroupByOptions, Mode};
use datafusion_mphf::gpu::query::{Combine, ABSENT32};
use datafusion_mphf::gpu::{AggOp, GpuContext, GpuGroupBy, GpuIndex};
use gpu_query_data::*;

fn gpu() -> Option<Arc<GpuContext>> {
    match GpuContext::get() {
        Ok(c) => Some(c),
        Err(e) => {
            println!("SKIPPED: no usable GPU ({e})");
            None
        }
    }
}

#[test]
fn without_a_gpu_everything_is_an_error_not_a_panic() {
    let col: ArrayRef = Arc::new(Int64Array::from(vec![1, 2, 3]));
    let idx = ColumnIndex::build(&[col], &IndexOptions::default()).unwrap();
    match GpuIndex::new(&idx) {
        Ok(g) => assert_eq!(g.len(), 3),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    match GpuGroupBy::new(10) {
        Ok(g) => assert_eq!(g.groups(), 10),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

#[test]
fn cpu_aggregation_matches_a_naive_loop() {
    let rows = 50_000;
    let s = slots(rows, 100, Dist::Zipf(1.5), 0.1, 3);
    let v = i64_values(rows, 0.1, 4);
    let all = [AggOp::Sum, AggOp::Min, AggOp::Max];
    let r = aggregate_cpu(&s, 100, true, &[(v.as_ref(), &all[..])]).unwrap();
    let vi = v.as_any().downcast_ref::<Int64Array>().unwrap();
    let mut cnt = vec![0u64; 101];
    let mut sum = vec![0i64; 101];
    for (i, &sl) in s.iter().enumerate() {
        let g = (sl as usize).min(100);
        cnt[g] += 1;
        if vi.is_valid(i) {
            sum[g] = sum[g].wrapping_add(vi.value(i));
        }
    }
    assert_eq!(r.rows.unwrap(), cnt);
    assert_eq!(r.columns[0].sum, Some(datafusion_mphf::gpu::groupby::Values::I64(sum)));
}

#[test]
fn gpu_lookup_equals_cpu() {
    let Some(_) = gpu() else { return };
    for params in [Params::DEFAULT, Params::FAST, Params::COMPACT] {
        for n in [0usize, 1, 2, 10, 1000, 100_000] {
            let keys: ArrayRef = if n == 0 {
                Arc::new(Int64Array::from(vec![None::<i64>; 3]))
            } else {
                Arc::new(Int64Array::from(member_keys(n)))
            };
            let idx = build_index(keys, params);
            let g = GpuIndex::new(&idx).unwrap();
            for dist in [Dist::Uniform, Dist::Clustered, Dist::Zipf(1.0), Dist::Zipf(1.5)] {
                let rows = (4 * n).clamp(100, 300_000);
                let probe = int_probe(&draw(rows, n, dist, 7, true), 0.1, 8);
                let cpu = cpu_lookup(&idx, probe.as_ref());
                let mut got = Vec::new();
                g.lookup_slots(probe.as_ref(), &mut got).unwrap();
                assert_eq!(first_diff(&got, &cpu), None, "{params:?} n={n} {}", dist.name());
                let p = g.upload(probe.as_ref()).unwrap();
                for combine in [Combine::Off, Combine::Runs] {
                    let d = g.lookup_device(&p, combine).unwrap();
                    let host = g.context().stream().clone_dtoh(&d).unwrap();
                    let wide: Vec<u64> = host[..rows]
                        .iter()
                        .map(|&s| if s == ABSENT32 { u64::MAX } else { s as u64 })
                        .collect();
                    assert_eq!(
                        first_diff(&wide, &cpu),
                        None,
                        "{params:?} n={n} {} {combine:?}",
                        dist.name()
                    );
                }
            }
        }
    }
}

#[test]
fn gpu_lookup_other_key_types() {
    let Some(_) = gpu() else { return };
    let n = 20_000;
    let members: Vec<u64> = (0..n as u64).collect();
    let skeys = str_probe(&members, 0.0, 1);
    let idx = build_index(skeys, Params::DEFAULT);
    let g = GpuIndex::new(&idx).unwrap();
    let probe = str_probe(&draw(50_000, n, Dist::Uniform, 3, true), 0.1, 4);
    let mut got = Vec::new();
    g.lookup_slots(probe.as_ref(), &mut got).unwrap();
    assert_eq!(first_diff(&got, &cpu_lookup(&idx, probe.as_ref())), None, "utf8");

    let ikeys: ArrayRef = Arc::new(Int32Array::from(
        (0..n as i32).map(|i| i * 7 - 50_000).collect::<Vec<_>>(),
    ));
    let idx = build_index(ikeys, Params::DEFAULT);
    let g = GpuIndex::new(&idx).unwrap();
    // An Int64 probe is cast to Int32 like on the CPU; values outside are non-members.
    let probe: ArrayRef = Arc::new(Int64Array::from(
        (0..60_000i64)
            .map(|i| (i % 11 != 0).then_some(i * 3 - 60_000))
            .collect::<Vec<_>>(),
    ));
    let mut got = Vec::new();
    g.lookup_slots(probe.as_ref(), &mut got).unwrap();
    let mut cpu = Vec::new();
    idx.lookup_slots(probe.as_ref(), &mut cpu).unwrap();
    assert_eq!(first_diff(&got, &cpu), None, "int32");
}

#[test]
fn gpu_group_by_equals_cpu() {
    let Some(ctx) = gpu() else { return };
    let all = [AggOp::Sum, AggOp::Min, AggOp::Max, AggOp::Avg];
    for groups in [1usize, 10, 10_000, 1_500_000] {
        let gb = GpuGroupBy::new(groups as u64).unwrap();
        for rows in [1usize, 1000, 1_000_000] {
            for dist in [Dist::Uniform, Dist::Clustered, Dist::Zipf(1.0), Dist::Zipf(1.5)] {
                let s = slots(rows, groups, dist, 0.1, rows as u64);
                let iv = i64_values(rows, 0.1, 5);
                let fv = f64_values(rows, 0.1, 6);
                let cols = [(iv.as_ref(), &all[..]), (fv.as_ref(), &all[..])];
                let cpu = aggregate_cpu(&s, groups as u64, true, &cols).unwrap();
                let d = ctx.stream().clone_htod(&s).unwrap();
                for shared in [Mode::Auto, Mode::On, Mode::Off] {
                    for matched in [Mode::Auto, Mode::On, Mode::Off] {
                        let r = gb
                            .aggregate(
                                &d,
                                rows,
                                true,
                                &cols,
                                GroupByOptions {
                                    shared,
                                    matched,
                                    hot: Mode::Auto,
                                },
                            )
                            .unwrap();
                        compare(&r, &cpu, 1e-12).unwrap_or_else(|e| {
                            panic!("G={groups} rows={rows} {} {shared:?}/{matched:?}: {e}", dist.name())
                        });
                    }
                }
            }
        }
    }
}

/// Decimal columns aggregate exactly as unscaled i64 (sum, min, max; NULLs skipped), and a
/// column whose values could overflow a 64-bit sum is refused with a clear error (the SQL
/// operator then stays on the CPU). On a GPU, the device agrees with the CPU reference.
#[test]
fn decimal_columns_are_exact_or_refused() {
    use arrow::array::Decimal128Array;
    use datafusion_mphf::gpu::groupby::Values;
    let values: Vec<Option<i128>> = (0..1000i128)
        .map(|i| (i % 7 != 0).then_some((i * 1_000_003) % 99_991 - 50_000))
        .collect();
    let slots: Vec<u32> = (0..1000u32).map(|i| i % 10).collect();
    let col: ArrayRef = Arc::new(
        Decimal128Array::from(values.clone())
            .with_precision_and_scale(15, 2)
            .unwrap(),
    );
    let ops = [AggOp::Sum, AggOp::Min, AggOp::Max];
    let r = aggregate_cpu(&slots, 10, false, &[(col.as_ref(), &ops)]).unwrap();
    let c = &r.columns[0];
    for g in 0..10usize {
        let group: Vec<i128> = (0..1000).filter(|&i| i % 10 == g).filter_map(|i| values[i]).collect();
        assert_eq!(c.non_null[g], group.len() as u64);
        let expect = |v: i128| v as i64;
        match (&c.sum, &c.min, &c.max) {
            (Some(Values::I64(s)), Some(Values::I64(lo)), Some(Values::I64(hi))) => {
                assert_eq!(s[g], expect(group.iter().sum()));
                assert_eq!(lo[g], expect(*group.iter().min().unwrap()));
                assert_eq!(hi[g], expect(*group.iter().max().unwrap()));
            }
            other => panic!("integer results expected, got {other:?}"),
        }
    }
    if let Some(ctx) = gpu() {
        let gb = GpuGroupBy::with_context(ctx.clone(), 10).unwrap();
        let d = ctx.stream().clone_htod(&slots).unwrap();
        let on_gpu = gb
            .aggregate(
                &d,
                slots.len(),
                false,
                &[(col.as_ref(), &ops)],
                GroupByOptions::default(),
            )
            .unwrap();
        assert_eq!(on_gpu.columns, r.columns);
    }
    // |values| summing to 2^63 or more: refused, not wrapped.
    let big: ArrayRef = Arc::new(
        Decimal128Array::from(vec![Some(i64::MAX as i128), Some(1), None])
            .with_precision_and_scale(38, 0)
            .unwrap(),
    );
    let err = aggregate_cpu(&[0, 0, 0], 1, false, &[(big.as_ref(), &[AggOp::Sum][..])]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "decimal values too large for exact 64-bit sums on the GPU"
    );
}

/// The slot maps of many files made at once on the GPU finish and equal the CPU's. Each file
/// is a rayon job whose uploads and downloads fill the staging buffers on all cores; a worker
/// waiting for such a fill runs other files' jobs meanwhile, which once deadlocked on the
/// staging mutex its own thread held (the files are large enough that every fill splits).
#[test]
fn slot_maps_of_many_files_at_once_finish_and_equal_the_cpus() {
    if gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let keys = 100_000;
    let idx = build_index(Arc::new(Int64Array::from(member_keys(keys))), Params::DEFAULT);
    let stamps = key_files(dir.path(), 32, 150_000, keys);
    let rounds = parallel_slot_maps(&idx, &stamps, 4).unwrap();
    assert_eq!(rounds.len(), 4);
}
