//! Query results as typed cells: what the differential test compares between sessions, and
//! what it writes for the DuckDB comparison (`benches/duckdb_diff.py`).
//!
//! Floats compare with a relative tolerance (sums in another order differ in the last bits);
//! everything else compares exactly. Rows of an unordered query are compared as multisets.

use std::cmp::Ordering;

use ::datafusion::arrow::array::{Array, AsArray, RecordBatch};
use ::datafusion::arrow::compute::cast;
use ::datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit};
use ::datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use ::datafusion::error::Result;
use serde_json::Value;

use crate::datafusion::registry::format_utc;

/// The comparison class of a column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Any integer type.
    Int,
    /// Float16/32/64.
    Float,
    /// Decimal128/256.
    Decimal,
    /// Any string type.
    Text,
    /// Boolean.
    Bool,
    /// Date32/Date64.
    Date,
    /// Timestamps (any unit; compared at microseconds, without a time zone).
    Timestamp,
    /// Anything else, compared as displayed.
    Other,
}

impl Kind {
    fn of(dt: &DataType) -> Self {
        match dt {
            _ if dt.is_integer() => Kind::Int,
            _ if dt.is_floating() => Kind::Float,
            DataType::Decimal32(..) | DataType::Decimal64(..) | DataType::Decimal128(..) | DataType::Decimal256(..) => {
                Kind::Decimal
            }
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => Kind::Text,
            DataType::Boolean => Kind::Bool,
            DataType::Date32 | DataType::Date64 => Kind::Date,
            DataType::Timestamp(..) => Kind::Timestamp,
            _ => Kind::Other,
        }
    }

    /// The name `duckdb_diff.py` reads.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Int => "int",
            Kind::Float => "float",
            Kind::Decimal => "decimal",
            Kind::Text => "text",
            Kind::Bool => "bool",
            Kind::Date => "date",
            Kind::Timestamp => "timestamp",
            Kind::Other => "other",
        }
    }
}

/// One value.
#[derive(Clone, Debug)]
pub enum Cell {
    /// SQL NULL.
    Null,
    /// An integer.
    Int(i128),
    /// A float (or a decimal, with its text).
    Float(f64, Option<String>),
    /// Text, dates, timestamps and anything else, as text.
    Text(String),
    /// A boolean.
    Bool(bool),
}

impl Cell {
    /// Equality with tolerance for floats (relative 1e-9) and decimals (also absolute 1e-6:
    /// `avg` of a decimal rounds to the scale of its result type).
    fn same(&self, other: &Cell) -> bool {
        match (self, other) {
            (Cell::Null, Cell::Null) => true,
            (Cell::Int(a), Cell::Int(b)) => a == b,
            (Cell::Float(a, _), Cell::Float(b, _)) => {
                (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-3)
            }
            (Cell::Text(a), Cell::Text(b)) => a == b,
            (Cell::Bool(a), Cell::Bool(b)) => a == b,
            _ => false,
        }
    }

    /// A total order for sorting unordered results (floats rounded so that noise does not
    /// reorder rows).
    fn sort_cmp(&self, other: &Cell) -> Ordering {
        fn rank(c: &Cell) -> u8 {
            match c {
                Cell::Null => 0,
                Cell::Int(_) => 1,
                Cell::Float(..) => 2,
                Cell::Text(_) => 3,
                Cell::Bool(_) => 4,
            }
        }
        match (self, other) {
            (Cell::Int(a), Cell::Int(b)) => a.cmp(b),
            (Cell::Float(a, _), Cell::Float(b, _)) => rounded(*a).total_cmp(&rounded(*b)),
            (Cell::Text(a), Cell::Text(b)) => a.cmp(b),
            (Cell::Bool(a), Cell::Bool(b)) => a.cmp(b),
            _ => rank(self).cmp(&rank(other)),
        }
    }

    /// The JSON form `duckdb_diff.py` reads.
    pub fn to_json(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Int(v) => Value::String(v.to_string()),
            Cell::Float(_, Some(text)) => Value::String(text.clone()),
            Cell::Float(v, None) if v.is_nan() => Value::String("NaN".into()),
            Cell::Float(v, None) if v.is_infinite() => Value::String(if *v > 0.0 { "inf" } else { "-inf" }.into()),
            Cell::Float(v, None) => serde_json::Number::from_f64(*v).map_or(Value::Null, Value::Number),
            Cell::Text(s) => Value::String(s.clone()),
            Cell::Bool(b) => Value::Bool(*b),
        }
    }
}

/// `v` rounded to 9 significant digits.
fn rounded(v: f64) -> f64 {
    if v == 0.0 || !v.is_finite() {
        return v;
    }
    let scale = 10f64.powi(8 - v.abs().log10().floor() as i32);
    (v * scale).round() / scale
}

/// A query result: column kinds and rows.
#[derive(Clone, Debug, Default)]
pub struct Rows {
    /// Kind of each column.
    pub kinds: Vec<Kind>,
    /// The rows.
    pub rows: Vec<Vec<Cell>>,
}

impl Rows {
    /// The cells of `batches`.
    ///
    /// # Errors
    /// A cast or display error of Arrow.
    pub fn from_batches(schema: &::datafusion::arrow::datatypes::Schema, batches: &[RecordBatch]) -> Result<Self> {
        let kinds: Vec<Kind> = schema.fields().iter().map(|f| Kind::of(f.data_type())).collect();
        let mut rows = Vec::new();
        for b in batches {
            let columns = b
                .columns()
                .iter()
                .zip(&kinds)
                .map(|(c, &k)| column_cells(c.as_ref(), k))
                .collect::<Result<Vec<_>>>()?;
            for r in 0..b.num_rows() {
                rows.push(columns.iter().map(|c| c[r].clone()).collect());
            }
        }
        Ok(Self { kinds, rows })
    }

    /// Why `self` and `other` differ (`None`: equal); unordered results are sorted first.
    pub fn diff(&self, other: &Rows, ordered: bool) -> Option<String> {
        if self.rows.len() != other.rows.len() {
            return Some(format!("{} rows vs {} rows", self.rows.len(), other.rows.len()));
        }
        let (a, b) = if ordered {
            (self.rows.clone(), other.rows.clone())
        } else {
            (sorted(&self.rows), sorted(&other.rows))
        };
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if x.len() != y.len() || x.iter().zip(y).any(|(p, q)| !p.same(q)) {
                return Some(format!("row {i}: {x:?} vs {y:?}"));
            }
        }
        None
    }
}

fn sorted(rows: &[Vec<Cell>]) -> Vec<Vec<Cell>> {
    let mut rows = rows.to_vec();
    rows.sort_by(|a, b| {
        a.iter()
            .zip(b)
            .map(|(x, y)| x.sort_cmp(y))
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    });
    rows
}

/// The cells of one column.
fn column_cells(array: &dyn Array, kind: Kind) -> Result<Vec<Cell>> {
    let n = array.len();
    let text = || -> Result<Vec<String>> {
        let f = ArrayFormatter::try_new(array, &FormatOptions::default())?;
        Ok((0..n).map(|i| f.value(i).to_string()).collect())
    };
    let cells = match kind {
        Kind::Int => {
            let wide = cast(array, &DataType::Decimal128(38, 0))?;
            let v = wide.as_primitive::<::datafusion::arrow::datatypes::Decimal128Type>();
            (0..n).map(|i| Cell::Int(v.value(i))).collect::<Vec<_>>()
        }
        Kind::Float => {
            let wide = cast(array, &DataType::Float64)?;
            let v = wide.as_primitive::<::datafusion::arrow::datatypes::Float64Type>();
            (0..n).map(|i| Cell::Float(v.value(i), None)).collect()
        }
        Kind::Decimal => {
            let wide = cast(array, &DataType::Float64)?;
            let v = wide.as_primitive::<::datafusion::arrow::datatypes::Float64Type>();
            let t = text()?;
            (0..n).map(|i| Cell::Float(v.value(i), Some(t[i].clone()))).collect()
        }
        Kind::Bool => {
            let v = array.as_boolean();
            (0..n).map(|i| Cell::Bool(v.value(i))).collect()
        }
        Kind::Timestamp => {
            let micros = cast(array, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
            let micros = cast(&micros, &DataType::Int64)?;
            let v = micros.as_primitive::<Int64Type>();
            (0..n).map(|i| Cell::Text(timestamp_text(v.value(i)))).collect()
        }
        Kind::Text | Kind::Date | Kind::Other => text()?.into_iter().map(Cell::Text).collect(),
    };
    Ok(cells
        .into_iter()
        .enumerate()
        .map(|(i, c)| if array.is_null(i) { Cell::Null } else { c })
        .collect())
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff]` of microseconds since the epoch (UTC), as DuckDB prints.
fn timestamp_text(micros: i64) -> String {
    let mut s = format_utc(micros.div_euclid(1_000_000));
    let frac = micros.rem_euclid(1_000_000);
    if frac != 0 {
        s.push_str(&format!(".{frac:06}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_print_as_duckdb_does() {
        assert_eq!(timestamp_text(0), "1970-01-01 00:00:00");
        assert_eq!(timestamp_text(951_782_400_000_001), "2000-02-29 00:00:00.000001");
        assert_eq!(timestamp_text(-1), "1969-12-31 23:59:59.999999");
    }

    #[test]
    fn floats_compare_with_tolerance_and_rows_as_multisets() {
        let a = Rows {
            kinds: vec![Kind::Float],
            rows: vec![vec![Cell::Float(1.0, None)], vec![Cell::Float(0.1 + 0.2, None)]],
        };
        let b = Rows {
            kinds: vec![Kind::Float],
            rows: vec![vec![Cell::Float(0.3, None)], vec![Cell::Float(1.0, None)]],
        };
        assert_eq!(a.diff(&b, false), None);
        assert!(a.diff(&b, true).is_some());
        let c = Rows {
            kinds: vec![Kind::Float],
            rows: vec![vec![Cell::Float(0.3001, None)], vec![Cell::Null]],
        };
        assert!(a.diff(&c, false).is_some());
    }
}
