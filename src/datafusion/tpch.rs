//! In-process TPC-H data ([`tpchgen`] / [`tpchgen_arrow`]): tables as Arrow batches, generated
//! in parallel (one generator part per thread), for the `.slt` suite, `mphf tpch` and `mphf demo`.
//!
//! Types follow tpchgen-arrow: keys are Int64, money Decimal128(15,2), dates Date32, text Utf8View.

use std::sync::Arc;

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::arrow::error::ArrowError;
use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::datasource::MemTable;
use ::datafusion::prelude::SessionContext;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator, PartSuppGenerator,
    RegionGenerator, SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow, RegionArrow, SupplierArrow,
};

/// The eight TPC-H tables, smallest first.
pub const TABLES: [&str; 8] = [
    "region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem",
];

/// Rows per generated batch.
pub const BATCH_SIZE: usize = 8192;

type BatchIter = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send>;

/// The schema and the batch iterator of part `part` (1-based) of `parts` of `table`.
pub fn table_part(table: &str, sf: f64, part: i32, parts: i32) -> Result<(SchemaRef, BatchIter)> {
    fn boxed<I>(schema: SchemaRef, it: I) -> (SchemaRef, BatchIter)
    where
        I: Iterator<Item = std::result::Result<RecordBatch, ArrowError>> + Send + 'static,
    {
        (schema, Box::new(it))
    }
    let b = BATCH_SIZE;
    // Nation and region are fixed-size tables: only part 1 produces them.
    let small = |p: i32| if p == 1 { 0 } else { usize::MAX };
    Ok(match table {
        "region" => boxed(
            RegionArrow::schema_ref(),
            RegionArrow::new(RegionGenerator::new(sf, part, parts))
                .with_batch_size(b)
                .skip(small(part)),
        ),
        "nation" => boxed(
            NationArrow::schema_ref(),
            NationArrow::new(NationGenerator::new(sf, part, parts))
                .with_batch_size(b)
                .skip(small(part)),
        ),
        "supplier" => boxed(
            SupplierArrow::schema_ref(),
            SupplierArrow::new(SupplierGenerator::new(sf, part, parts)).with_batch_size(b),
        ),
        "customer" => boxed(
            CustomerArrow::schema_ref(),
            CustomerArrow::new(CustomerGenerator::new(sf, part, parts)).with_batch_size(b),
        ),
        "part" => boxed(
            PartArrow::schema_ref(),
            PartArrow::new(PartGenerator::new(sf, part, parts)).with_batch_size(b),
        ),
        "partsupp" => boxed(
            PartSuppArrow::schema_ref(),
            PartSuppArrow::new(PartSuppGenerator::new(sf, part, parts)).with_batch_size(b),
        ),
        "orders" => boxed(
            OrderArrow::schema_ref(),
            OrderArrow::new(OrderGenerator::new(sf, part, parts)).with_batch_size(b),
        ),
        "lineitem" => boxed(
            LineItemArrow::schema_ref(),
            LineItemArrow::new(LineItemGenerator::new(sf, part, parts)).with_batch_size(b),
        ),
        other => {
            return Err(DataFusionError::Plan(format!(
                "unknown TPC-H table '{other}' (known: {})",
                TABLES.join(", ")
            )))
        }
    })
}

/// Generates `table` as `parts` partitions, one thread each; `on_batch(rows)` is called after
/// every batch (progress reporting).
pub fn generate(
    table: &str,
    sf: f64,
    parts: usize,
    on_batch: &(dyn Fn(usize) + Sync),
) -> Result<(SchemaRef, Vec<Vec<RecordBatch>>)> {
    let parts = parts.max(1) as i32;
    let schema = table_part(table, sf, 1, parts)?.0;
    let partitions = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=parts)
            .map(|p| {
                s.spawn(move || -> Result<Vec<RecordBatch>> {
                    let (_, it) = table_part(table, sf, p, parts)?;
                    let mut out = Vec::new();
                    for batch in it {
                        let batch = batch?;
                        on_batch(batch.num_rows());
                        out.push(batch);
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("TPC-H generator thread panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    Ok((schema, partitions))
}

/// Registers the eight tables in memory at scale factor `sf`, each split into `parts`
/// partitions.
pub fn register_tpch(ctx: &SessionContext, sf: f64, parts: usize) -> Result<()> {
    for t in TABLES {
        let (schema, partitions) = generate(t, sf, parts, &|_| {})?;
        ctx.register_table(t, Arc::new(MemTable::try_new(schema, partitions)?))?;
    }
    Ok(())
}
