//! `mphf lookup`: looks up every row of a Parquet column in an index and writes the column and
//! its `slot` (UInt32, or UInt64 past 2^32 keys; NULL for NULL and non-member keys) to Parquet.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::datatypes::{Field, Schema};
use arrow::record_batch::RecordBatch;
use clap::Args;
use parquet::arrow::ArrowWriter;

use super::inspect::open_index;
use super::parquet_io::read_column;
use super::{CliError, InputArgs};
use crate::atomic_file::AtomicFile;
use crate::MphfError;

/// Arguments of `mphf lookup`.
#[derive(Debug, Clone, Args)]
pub struct LookupArgs {
    /// The index file.
    #[arg(long)]
    pub index: PathBuf,
    /// The Parquet input and key column to look up.
    #[command(flatten)]
    pub input: InputArgs,
    /// Output Parquet file: the input column and `slot`.
    #[arg(long, short = 'o')]
    pub output: PathBuf,
}

/// Runs `mphf lookup`.
///
/// # Errors
/// Reading, lookup (type mismatch) or writing failed.
pub fn run(args: &LookupArgs) -> Result<(), CliError> {
    let index = open_index(&args.index)?;
    let data = read_column(&args.input.input, &args.input.column)?;
    let schema = Arc::new(Schema::new(vec![
        Field::new(data.field.name(), data.field.data_type().clone(), true),
        Field::new("slot", index.slot_type(), true),
    ]));
    let out = &args.output;
    // Written whole or not at all, never through a planted symlink (see `AtomicFile`).
    let file = AtomicFile::create(out).map_err(|err| output_error(out, err))?;
    let mut writer =
        ArrowWriter::try_new(file, schema.clone(), None).map_err(|err| CliError::Parquet { path: out.clone(), err })?;
    for chunk in &data.chunks {
        let slots = index.lookup(chunk.as_ref()).map_err(|err| CliError::Column {
            column: args.input.column.clone(),
            path: args.input.input.clone(),
            err,
        })?;
        let batch = RecordBatch::try_new(schema.clone(), vec![chunk.clone(), slots])?;
        writer
            .write(&batch)
            .map_err(|err| CliError::Parquet { path: out.clone(), err })?;
    }
    let file = writer
        .into_inner()
        .map_err(|err| CliError::Parquet { path: out.clone(), err })?;
    file.commit().map_err(|err| output_error(out, err))?;
    Ok(())
}

/// An error writing the output file, with its path.
fn output_error(path: &std::path::Path, err: MphfError) -> CliError {
    match err {
        MphfError::Io(err) => CliError::Io {
            path: path.to_path_buf(),
            err,
        },
        other => CliError::Mphf(other),
    }
}
