//! Reading one column of a Parquet file (only that column is decoded) and writing results.

use std::fs::File;
use std::path::Path;

use arrow::array::ArrayRef;
use arrow::datatypes::{DataType, FieldRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;

use super::CliError;
use crate::core::column::KeyType;

/// Rows per decoded batch.
const BATCH_ROWS: usize = 64 * 1024;

/// One column of a Parquet file, decoded into chunks.
pub struct ColumnData {
    /// The column's Arrow field (name, type, nullability).
    pub field: FieldRef,
    /// The decoded batches of the column.
    pub chunks: Vec<ArrayRef>,
}

fn open(path: &Path) -> Result<ParquetRecordBatchReaderBuilder<File>, CliError> {
    let file = File::open(path).map_err(|err| CliError::Io { path: path.into(), err })?;
    ParquetRecordBatchReaderBuilder::try_new(file).map_err(|err| CliError::Parquet { path: path.into(), err })
}

/// The value type of a dictionary, or the type itself.
fn value_type(dt: &DataType) -> &DataType {
    match dt {
        DataType::Dictionary(_, v) => v,
        other => other,
    }
}

/// Reads column `column` of the Parquet file at `path`, after checking that its type is a
/// supported key type.
///
/// # Errors
/// [`CliError::MissingColumn`] listing the available columns; [`CliError::Column`] naming an
/// unsupported type; I/O and Parquet errors.
pub fn read_column(path: &Path, column: &str) -> Result<ColumnData, CliError> {
    let builder = open(path)?;
    let schema = builder.schema().clone();
    let Some((pos, field)) = schema.fields().iter().enumerate().find(|(_, f)| f.name() == column) else {
        let available = schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(CliError::MissingColumn {
            column: column.into(),
            path: path.into(),
            available,
        });
    };
    KeyType::from_arrow(value_type(field.data_type())).map_err(|err| CliError::Column {
        column: column.into(),
        path: path.into(),
        err,
    })?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [pos]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|err| CliError::Parquet { path: path.into(), err })?;
    let mut chunks = Vec::new();
    for batch in reader {
        let batch = batch?;
        chunks.push(batch.column(0).clone());
    }
    Ok(ColumnData {
        field: field.clone(),
        chunks,
    })
}
