//! `mphf inspect`: one JSON object describing an index file.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::CliError;
use crate::core::column::ColumnIndex;

/// Arguments of `mphf inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The index file.
    pub index: PathBuf,
}

/// The JSON description of an index (keys, parameters, sizes, counts, provenance).
pub fn describe(index: &ColumnIndex) -> serde_json::Value {
    let mphf = index.mphf();
    let params = mphf.params();
    let stats = index.stats();
    json!({
        "format_version": index.format_version(),
        "key_type": index.key_type().name(),
        "keys": index.len(),
        "rows": stats.rows,
        "nulls": stats.nulls,
        "had_duplicates": stats.had_duplicates(),
        "leaf": params.leaf,
        "bucket": params.bucket,
        "rotation": params.rotation,
        "seed": mphf.seed(),
        "buckets": mphf.num_buckets(),
        "mphf_bits_per_key": mphf.bits_per_key(),
        "mphf_bytes": mphf.size_bits().div_ceil(8),
        "bytes": index.size_bytes(),
        "slot_type": index.slot_type().to_string(),
        "device": index.device(),
        "built_at": index.built_at(),
        "provenance": index.provenance(),
    })
}

/// Runs `mphf inspect`.
///
/// # Errors
/// The file cannot be opened or is not a valid index.
pub fn run(args: &InspectArgs) -> Result<(), CliError> {
    let index = open_index(&args.index)?;
    println!("{}", serde_json::to_string_pretty(&describe(&index))?);
    Ok(())
}

/// Opens an index file; errors name the file.
///
/// # Errors
/// [`CliError::Io`] when the file cannot be read, [`CliError::Index`] when it is not a valid
/// index; both name the file.
pub fn open_index(path: &std::path::Path) -> Result<ColumnIndex, CliError> {
    ColumnIndex::open(path).map_err(|e| match e {
        crate::MphfError::Io(err) => CliError::Io { path: path.into(), err },
        other => CliError::Index {
            path: path.into(),
            err: other,
        },
    })
}
