//! The generated tables of the differential test: three fact tables of the same shape (`f`, `g`
//! for UNION ALL, and `h`, larger and clustered by key, so that the default costing takes the
//! operators) and two dimensions (`dm` keyed by the sparse id, `ds` keyed by the string).
//!
//! What the data must provoke (each a class of bug the extension has had):
//! - sparse 64-bit ids, strings with Unicode and shared prefixes, dates, timestamps, Int32 and
//!   UInt64 keys (above 2^63 too), each with NULLs and duplicates;
//! - fact keys missing from their dimension, and dimension keys no fact row has;
//! - groups whose values are all NULL (`v` and `q` are NULL for every row of some keys);
//! - duplicate dimension keys (a join's build side with row lists).
//!
//! Everything is a function of the seed ([`Rng`]), so a failing query can be replayed.

use std::sync::Arc;

use ::datafusion::arrow::array::{
    ArrayRef, BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array, RecordBatch,
    StringArray, TimestampMicrosecondArray, UInt64Array,
};
use ::datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use ::datafusion::error::Result;

/// SplitMix64: a small, seedable generator (statistical quality is not needed here).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    /// One element of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A generated table: its name, schema and batches (in row order).
#[derive(Clone, Debug)]
pub struct Table {
    /// Table name.
    pub name: &'static str,
    /// Schema.
    pub schema: SchemaRef,
    /// The rows, in batches of varying length.
    pub batches: Vec<RecordBatch>,
}

/// The key pools the tables draw from (shared, so that joins and unions meet).
struct Pools {
    ids: Vec<i64>,
    strings: Vec<String>,
    days: Vec<i32>,
    micros: Vec<i64>,
    ints: Vec<i32>,
    unsigned: Vec<u64>,
}

impl Pools {
    fn new(rng: &mut Rng) -> Self {
        let ids = (0..6_000).map(|_| rng.next_u64() as i64).collect();
        let words = ["pre", "prefix", "préfixe", "ключ", "键", "a b", "", "Zeta", "ß"];
        let strings = (0..5_000)
            .map(|i| {
                let w = rng.pick(&words);
                match i % 4 {
                    0 => format!("{w}{i}"),
                    1 => format!("{w}-{:05}", rng.below(100_000)),
                    2 => format!("shared/prefix/{w}/{i:04}"),
                    _ => format!("{w}🙂{i}"),
                }
            })
            .collect();
        let days = (0..200).map(|_| 18_000 + rng.below(3_000) as i32).collect();
        let micros = (0..150)
            .map(|_| 1_600_000_000_000_000 + rng.below(1 << 40) as i64 * if rng.chance(0.5) { 1 } else { 1_000_000 })
            .collect();
        let ints = (0..250).map(|_| rng.below(1_000) as i32 - 200).collect();
        let unsigned = (0..200)
            .map(|_| {
                let v = rng.next_u64();
                if rng.chance(0.5) {
                    v | (1 << 63)
                } else {
                    v >> 1
                }
            })
            .collect();
        Self {
            ids,
            strings,
            days,
            micros,
            ints,
            unsigned,
        }
    }
}

/// Schema of the fact tables `f` and `g`.
fn fact_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("s", DataType::Utf8, true),
        Field::new("d", DataType::Date32, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Microsecond, None), true),
        Field::new("i", DataType::Int32, true),
        Field::new("u", DataType::UInt64, true),
        Field::new("m", DataType::Decimal128(12, 2), true),
        Field::new("v", DataType::Float64, true),
        Field::new("q", DataType::Int64, true),
        Field::new("b", DataType::Boolean, true),
    ]))
}

/// `None` with probability `p`, else `f()`.
fn maybe<T>(rng: &mut Rng, p: f64, f: impl FnOnce(&mut Rng) -> T) -> Option<T> {
    if rng.chance(p) {
        None
    } else {
        Some(f(rng))
    }
}

/// Splits `rows` into batches of random lengths (1 to 700 rows).
fn batch_lengths(rng: &mut Rng, rows: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut left = rows;
    while left > 0 {
        let n = (1 + rng.below(700)).min(left);
        out.push(n);
        left -= n;
    }
    out
}

/// The shape of a fact table.
struct FactShape {
    rows: usize,
    /// The table's ids and strings are the first `share` of their pools.
    share: f64,
    /// Rows come in runs of one id (1 to 8 rows), as in a table sorted by its key.
    clustered: bool,
}

/// A fact table (see [`FactShape`]).
fn fact(name: &'static str, rng: &mut Rng, pools: &Pools, shape: FactShape) -> Result<Table> {
    let part = |n: usize| ((n as f64 * shape.share) as usize).max(1);
    let (n_ids, n_str) = (part(pools.ids.len()), part(pools.strings.len()));
    let mut cols: (
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
        Vec<_>,
    ) = Default::default();
    let (mut id_pos, mut run_left) = (0, 0);
    for _ in 0..shape.rows {
        if run_left == 0 {
            id_pos = rng.below(n_ids);
            run_left = if shape.clustered { 1 + rng.below(8) } else { 1 };
        }
        run_left -= 1;
        let id = maybe(rng, 0.04, |_| pools.ids[id_pos]);
        // Every row of some keys has NULL values: all-NULL groups.
        let null_values = id_pos % 11 == 3;
        cols.0.push(id);
        cols.1.push(maybe(rng, 0.04, |r| pools.strings[r.below(n_str)].clone()));
        cols.2.push(maybe(rng, 0.05, |r| *r.pick(&pools.days)));
        cols.3.push(maybe(rng, 0.05, |r| *r.pick(&pools.micros)));
        cols.4.push(maybe(rng, 0.05, |r| *r.pick(&pools.ints)));
        cols.5.push(maybe(rng, 0.05, |r| *r.pick(&pools.unsigned)));
        cols.6.push(maybe(rng, 0.1, |r| 10_000 + r.below(9_000_000) as i128));
        let v = if null_values {
            None
        } else {
            maybe(rng, 0.2, |r| r.below(1_000_000) as f64 / 64.0)
        };
        cols.7.push(v);
        let q = if null_values {
            None
        } else {
            maybe(rng, 0.1, |r| 1 + r.below(50) as i64)
        };
        cols.8.push(q);
        cols.9.push(maybe(rng, 0.15, |r| r.chance(0.3)));
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(cols.0)),
        Arc::new(StringArray::from(cols.1)),
        Arc::new(Date32Array::from(cols.2)),
        Arc::new(TimestampMicrosecondArray::from(cols.3)),
        Arc::new(Int32Array::from(cols.4)),
        Arc::new(UInt64Array::from(cols.5)),
        Arc::new(Decimal128Array::from(cols.6).with_precision_and_scale(12, 2)?),
        Arc::new(Float64Array::from(cols.7)),
        Arc::new(Int64Array::from(cols.8)),
        Arc::new(BooleanArray::from(cols.9)),
    ];
    table(name, rng, fact_schema(), columns)
}

/// Cuts whole columns into a table of randomly sized batches.
fn table(name: &'static str, rng: &mut Rng, schema: SchemaRef, columns: Vec<ArrayRef>) -> Result<Table> {
    let all = RecordBatch::try_new(Arc::clone(&schema), columns)?;
    let mut batches = Vec::new();
    let mut offset = 0;
    for n in batch_lengths(rng, all.num_rows()) {
        batches.push(all.slice(offset, n));
        offset += n;
    }
    Ok(Table { name, schema, batches })
}

/// The dimension keyed by id: 70% of the id pool (over 4096 keys, so that the default costing
/// takes joins on it), ids no fact has, a NULL id and a few duplicated ids.
fn dim_ids(rng: &mut Rng, pools: &Pools) -> Result<Table> {
    let cats = ["red", "green", "blue", "cyan", "ochre"];
    let mut ids: Vec<Option<i64>> = pools.ids.iter().filter(|_| rng.chance(0.7)).map(|&i| Some(i)).collect();
    ids.extend((0..40).map(|_| Some(rng.next_u64() as i64)));
    let dups: Vec<Option<i64>> = (0..12).map(|_| *rng.pick(&ids)).collect();
    ids.extend(dups);
    ids.push(None);
    let n = ids.len();
    let cat: Vec<Option<&str>> = (0..n).map(|_| maybe(rng, 0.05, |r| *r.pick(&cats))).collect();
    let flag: Vec<Option<bool>> = (0..n).map(|_| maybe(rng, 0.05, |r| r.chance(0.5))).collect();
    let w: Vec<Option<f64>> = (0..n)
        .map(|_| maybe(rng, 0.1, |r| r.below(10_000) as f64 / 8.0))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("cat", DataType::Utf8, true),
        Field::new("flag", DataType::Boolean, true),
        Field::new("w", DataType::Float64, true),
    ]));
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from(cat)),
        Arc::new(BooleanArray::from(flag)),
        Arc::new(Float64Array::from(w)),
    ];
    table("dm", rng, schema, columns)
}

/// The dimension keyed by the string: 60% of the string pool (some 3000), unique, plus strings
/// no fact has.
fn dim_strings(rng: &mut Rng, pools: &Pools) -> Result<Table> {
    let mut keys: Vec<String> = pools.strings.iter().filter(|_| rng.chance(0.6)).cloned().collect();
    keys.sort();
    keys.dedup();
    keys.extend((0..20).map(|i| format!("only-in-ds-{i}")));
    let grp: Vec<Option<i32>> = (0..keys.len())
        .map(|_| maybe(rng, 0.1, |r| r.below(6) as i32))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8, true),
        Field::new("grp", DataType::Int32, true),
    ]));
    let columns: Vec<ArrayRef> = vec![Arc::new(StringArray::from(keys)), Arc::new(Int32Array::from(grp))];
    table("ds", rng, schema, columns)
}

/// The four tables of `seed`.
pub fn generate(seed: u64) -> Result<Vec<Table>> {
    let mut rng = Rng::new(seed);
    let pools = Pools::new(&mut rng);
    let f = FactShape {
        rows: 2_000 + rng.below(3_000),
        share: 0.1,
        clustered: false,
    };
    let g = FactShape {
        rows: 500 + rng.below(1_500),
        share: 0.06,
        clustered: false,
    };
    let h = FactShape {
        rows: 30_000 + rng.below(20_000),
        share: 1.0,
        clustered: true,
    };
    Ok(vec![
        fact("f", &mut rng, &pools, f)?,
        fact("g", &mut rng, &pools, g)?,
        fact("h", &mut rng, &pools, h)?,
        dim_ids(&mut rng, &pools)?,
        dim_strings(&mut rng, &pools)?,
    ])
}

/// The indexes every MPHF session creates: `(index name, table, column)`.
pub const INDEXES: [(&str, &str, &str); 20] = [
    ("f_id", "f", "id"),
    ("f_s", "f", "s"),
    ("f_d", "f", "d"),
    ("f_ts", "f", "ts"),
    ("f_i", "f", "i"),
    ("f_u", "f", "u"),
    ("g_id", "g", "id"),
    ("g_s", "g", "s"),
    ("g_d", "g", "d"),
    ("g_ts", "g", "ts"),
    ("g_i", "g", "i"),
    ("g_u", "g", "u"),
    ("h_id", "h", "id"),
    ("h_s", "h", "s"),
    ("h_d", "h", "d"),
    ("h_ts", "h", "ts"),
    ("h_i", "h", "i"),
    ("h_u", "h", "u"),
    ("dm_id", "dm", "id"),
    ("ds_s", "ds", "s"),
];
