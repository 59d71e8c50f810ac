//! The tables and sessions that the benchmarks compare on: a vanilla DataFusion session and an
//! MPHF session over the same in-memory tables or the same Parquet folders, each alone or as the
//! coordinator of its own in-memory cluster of datafusion-distributed workers.
//!
//! Why a cluster needs Parquet: a worker reads a table through the plan's codec, which carries a
//! Parquet scan (its file paths) but not the batches of a `MemTable`. So a benchmark with
//! `--workers` writes its generated tables as `DIR/<table>/part-NN.parquet` first; the MPHF
//! session's `CREATE INDEX` then saves each index next to its table (`DIR/<table>/_mphf/`),
//! where the workers open it.
//!
//! Invariants: both sessions of a pair have the same configuration and read the same files; a
//! table folder holds exactly the parts of the last write (earlier `part-*.parquet` files are
//! removed first, nothing else is); every file is written whole or not at all.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::datafusion::arrow::array::RecordBatch;
use ::datafusion::arrow::datatypes::SchemaRef;
use ::datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use anyhow::{Context as _, Result};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

use crate::datafusion::MphfContext;

/// Rows per Parquet row group at most (fewer for small files, so each file has several).
const MAX_ROW_GROUP_ROWS: usize = 1 << 20;

/// A benchmark's two sessions over the same tables.
pub(super) struct Sessions {
    pub vanilla: SessionContext,
    pub mphf: MphfContext,
}

/// `batches` split into `parts` runs of consecutive batches (none empty unless all are).
pub(super) fn split<T: Clone>(batches: &[T], parts: usize) -> Vec<Vec<T>> {
    let per = batches.len().div_ceil(parts.max(1)).max(1);
    let mut out: Vec<Vec<T>> = batches.chunks(per).map(<[T]>::to_vec).collect();
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

/// Both sessions with `config`, in this process (`workers` 0) or each the coordinator of its own
/// in-memory cluster of `workers` workers.
///
/// # Errors
/// A cluster that does not start; `workers` > 0 in a build without the `distributed` feature.
pub(super) fn sessions(config: &SessionConfig, workers: usize) -> Result<Sessions> {
    match workers {
        0 => Ok(Sessions {
            vanilla: SessionContext::new_with_config(config.clone()),
            mphf: MphfContext::with_config(config.clone()),
        }),
        _ => cluster_sessions(config, workers),
    }
}

/// Both sessions (see [`sessions`]) over the Parquet folders `dir/<table>/` of `tables`.
///
/// # Errors
/// Those of [`sessions`]; a folder that does not register; a saved index that does not load.
pub(super) async fn parquet_sessions(
    config: &SessionConfig,
    dir: &Path,
    tables: &[&str],
    workers: usize,
) -> Result<Sessions> {
    let s = sessions(config, workers)?;
    for name in tables {
        let path = format!("{}/", dir.join(name).display());
        s.vanilla
            .register_parquet(*name, &path, ParquetReadOptions::default())
            .await?;
        s.mphf.register_parquet(name, &path).await?;
    }
    Ok(s)
}

/// The two sessions on in-memory clusters of `workers` workers each: DataFusion's own plans
/// for the vanilla one (no MPHF rules on its coordinator), the extension's for the other.
#[cfg(feature = "distributed")]
fn cluster_sessions(config: &SessionConfig, workers: usize) -> Result<Sessions> {
    use crate::datafusion::distributed::InMemoryCluster;
    use ::datafusion::execution::SessionStateBuilder;
    let builder = || {
        SessionStateBuilder::new()
            .with_default_features()
            .with_config(config.clone())
    };
    let vanilla = InMemoryCluster::new(workers).start(builder())?.build();
    Ok(Sessions {
        vanilla: SessionContext::new_with_state(vanilla),
        mphf: MphfContext::with_state_builder(InMemoryCluster::new(workers).start(builder())?),
    })
}

#[cfg(not(feature = "distributed"))]
fn cluster_sessions(_config: &SessionConfig, _workers: usize) -> Result<Sessions> {
    anyhow::bail!("--workers needs the `distributed` feature; build with the default features")
}

/// Writes one table as `folder/part-NN.parquet`, `files` files (in parallel), each with about
/// four row groups, after removing the `part-*.parquet` files a previous run left there.
///
/// # Errors
/// I/O and Parquet errors.
pub(super) fn write_table(
    folder: &Path,
    (schema, batches): &(SchemaRef, Vec<RecordBatch>),
    files: usize,
) -> Result<()> {
    std::fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    remove_old_parts(folder)?;
    let parts = split(batches, files);
    std::thread::scope(|s| {
        let jobs: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(f, part)| {
                let path = folder.join(format!("part-{f:02}.parquet"));
                let rows: usize = part.iter().map(RecordBatch::num_rows).sum();
                let group_rows = rows.div_ceil(4).clamp(1, MAX_ROW_GROUP_ROWS);
                s.spawn(move || write_file(&path, schema, part, group_rows))
            })
            .collect();
        jobs.into_iter().try_for_each(|j| {
            j.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a Parquet writer thread panicked")))
        })
    })
}

/// Removes the Parquet files a previous run left in `folder` (`part-*.parquet`, nothing else).
fn remove_old_parts(folder: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("part-") && name.ends_with(".parquet") && entry.file_type()?.is_file() {
            std::fs::remove_file(entry.path()).with_context(|| format!("removing {}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// Writes `batches` as one Parquet file with row groups of at most `group_rows` rows.
fn write_file(path: &Path, schema: &SchemaRef, batches: &[RecordBatch], group_rows: usize) -> Result<()> {
    let file = crate::atomic_file::AtomicFile::create(path).with_context(|| format!("creating {}", path.display()))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_max_row_group_row_count(Some(group_rows.max(1)))
        .build();
    let mut writer = ArrowWriter::try_new(file, Arc::clone(schema), Some(props))?;
    for b in batches {
        writer.write(b)?;
    }
    writer
        .into_inner()?
        .commit()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// A folder of generated files that is removed when dropped (a benchmark's default, temporary
/// one).
pub(super) struct TempDir(pub PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.0) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                eprintln!("could not remove {}: {err}", self.0.display())
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_every_batch_in_order() {
        let v: Vec<u32> = (0..10).collect();
        let parts = split(&v, 3);
        assert_eq!(parts.concat(), v);
        assert_eq!(parts.len(), 3);
        assert_eq!(split::<u32>(&[], 4), vec![Vec::<u32>::new()]);
    }

    #[test]
    fn a_rewrite_replaces_the_old_parts_and_keeps_other_files() {
        use ::datafusion::arrow::array::Int64Array;
        use ::datafusion::arrow::datatypes::{DataType, Field, Schema};
        let dir = tempfile::tempdir().unwrap();
        let schema: SchemaRef = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch = |n: i64| {
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(Int64Array::from_iter_values(0..n))]).unwrap()
        };
        let table = (Arc::clone(&schema), vec![batch(10), batch(20), batch(30)]);
        write_table(dir.path(), &table, 3).unwrap();
        std::fs::create_dir(dir.path().join("_mphf")).unwrap();
        write_table(dir.path(), &(Arc::clone(&schema), vec![batch(5)]), 1).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["_mphf", "part-00.parquet"]);
        let file = std::fs::File::open(dir.path().join("part-00.parquet")).unwrap();
        let rows: usize = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .sum();
        assert_eq!(rows, 5);
    }
}
