//! The README's 10-line example: an MPHF index over an Arrow RecordBatch, used from SQL.
//!
//! Run with `cargo run --example mphf_sql`.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion_mphf::datafusion::MphfContext;

#[tokio::main]
async fn main() -> datafusion::error::Result<()> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("name", DataType::Utf8, false),
    ]));
    let ids = Int64Array::from(vec![Some(40), Some(10), None, Some(30), Some(10)]);
    let names = StringArray::from(vec!["d", "a", "?", "c", "a2"]);
    let batch = RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(names)])?;

    let ctx = MphfContext::new(); // a SessionContext with mphf_index, CREATE INDEX ... USING mphf, SHOW MPHF INDEXES
    ctx.ctx().register_batch("t", batch)?;
    ctx.sql("CREATE INDEX t_id ON t USING mphf (id)").await?;
    ctx.sql("SELECT id, name, mphf_index(id) AS slot FROM t ORDER BY id")
        .await?
        .show()
        .await?;
    ctx.sql("SELECT mphf_index(id) AS slot, count(*) FROM t GROUP BY mphf_index(id) ORDER BY slot")
        .await?
        .show()
        .await?;
    ctx.sql("SHOW MPHF INDEXES").await?.show().await?;
    Ok(())
}
