//! How a plan sent to a worker names an index, and how the worker finds it.
//!
//! A node never carries index bytes: it carries an [`IndexRef`] (name, table, column, the
//! coordinator's label, the index's fingerprint and, for a file-backed table, the path of the
//! saved index and the data files its slot maps cover). The worker resolves it through its
//! [`WorkerIndexes`]:
//! 1. with `share_process` (an in-memory cluster, workers in the coordinator's process), the
//!    coordinator's live index of that label, when its fingerprint matches;
//! 2. an index this worker opened before for the same fingerprint;
//! 3. the saved index: the file of the same name in the worker's `index_dir` when one is set,
//!    else the coordinator's path. Its fingerprint must match; its slot maps are read from
//!    beside it and checked against the data files as the worker sees them.
//!
//! Anything else fails the query with an error that names the index; a worker never runs a
//! plan on an index other than the coordinator's.
//!
//! An index a worker opens is reserved in the worker's memory pool (the file's size, before it
//! is read; `ResourcesExhausted` naming the index when the pool cannot hold it) and kept for later
//! plans, one per index name: opening another fingerprint of the same index (the coordinator
//! rebuilt it) drops the older one.
//!
//! Invariant: the coordinator's labels in the plan's schemas resolve on the worker to the index
//! it opened for them ([`alias_label`]), so label lookups in the operators and the UDF work
//! unchanged.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ::datafusion::common::{DataFusionError, Result};
use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool};

use crate::core::column::ColumnIndex;
use crate::datafusion::install::slot_map_path;
use crate::datafusion::registry::{alias_label, id_of_label, resolve_index, IndexHandle, IndexInfo, IndexSource};
use crate::index::{FileStamp, SlotMaps};

/// What identifies one index in a plan sent to a worker.
#[derive(Clone, PartialEq, prost::Message)]
pub struct IndexRef {
    /// The index's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// The table it indexes, as registered on the coordinator.
    #[prost(string, tag = "2")]
    pub table: String,
    /// The indexed column.
    #[prost(string, tag = "3")]
    pub column: String,
    /// The coordinator's label of the index (the value of its fields' index metadata).
    #[prost(string, tag = "4")]
    pub label: String,
    /// [`fingerprint_of`] the coordinator's index.
    #[prost(fixed64, tag = "5")]
    pub fingerprint: u64,
    /// Where the coordinator's index is saved (file-backed tables only).
    #[prost(string, optional, tag = "6")]
    pub path: Option<String>,
    /// The data files the coordinator's slot maps cover (empty: it has none).
    #[prost(string, repeated, tag = "7")]
    pub data_files: Vec<String>,
}

/// What ties a plan to one index: a hash of its provenance (for a file-backed table, the data
/// files' fingerprint), build time and slot count. Two builds of the same keys with the same
/// parameters and seed give equal MPHFs; a rebuilt index has another build time.
pub fn fingerprint_of(index: &ColumnIndex) -> u64 {
    SlotMaps::identity_of(index)
}

impl IndexRef {
    /// The reference to the coordinator's `handle`.
    pub fn of(handle: &IndexHandle) -> IndexRef {
        let info = handle.info();
        IndexRef {
            name: info.name.clone(),
            table: info.table.clone(),
            column: info.column.clone(),
            label: handle.label(),
            fingerprint: fingerprint_of(handle.index()),
            path: info.path.as_ref().map(|p| p.display().to_string()),
            data_files: handle
                .slot_maps()
                .map(|m| m.paths().map(|p| p.display().to_string()).collect())
                .unwrap_or_default(),
        }
    }

    /// `MPHF index 'name' on table(column)`, the start of every error about it.
    fn describe(&self) -> String {
        format!("MPHF index '{}' on {}({})", self.name, self.table, self.column)
    }
}

/// Where a worker finds the indexes that plans name (see the module docs).
#[derive(Debug, Default)]
pub struct WorkerIndexes {
    /// Use the coordinator's live indexes when the worker runs in its process.
    share_process: bool,
    /// The worker's folder of saved indexes (`None`: the coordinator's paths).
    index_dir: Option<PathBuf>,
    /// Indexes this worker opened, by `name table column`: the fingerprint and the index.
    opened: Mutex<HashMap<String, (u64, Arc<IndexHandle>)>>,
    /// Say on stderr which saved index was opened (a worker process's log).
    notices: bool,
}

impl WorkerIndexes {
    /// A worker in another process: saved indexes only, from `index_dir` when given (a shared
    /// folder mounted elsewhere), else from the coordinator's paths.
    pub fn saved(index_dir: Option<PathBuf>) -> Self {
        Self {
            share_process: false,
            index_dir,
            opened: Mutex::new(HashMap::new()),
            notices: false,
        }
    }

    /// The same, saying on stderr which saved index it opens.
    pub fn with_notices(mut self, notices: bool) -> Self {
        self.notices = notices;
        self
    }

    /// A worker in the coordinator's process: its live indexes, then saved ones.
    pub fn in_process() -> Self {
        Self {
            share_process: true,
            ..Self::saved(None)
        }
    }

    /// Whether the coordinator's live indexes are used.
    pub fn shares_process(&self) -> bool {
        self.share_process
    }

    /// The index `r` names, as this worker can use it; one it opens is reserved in `pool`.
    ///
    /// # Errors
    /// `DataFusionError::Execution` naming the index when it cannot be found here, its saved
    /// file cannot be read, or the file holds an index with another fingerprint;
    /// `ResourcesExhausted` naming it when `pool` cannot hold it.
    pub fn resolve(&self, r: &IndexRef, pool: &Arc<dyn MemoryPool>) -> Result<Arc<IndexHandle>> {
        if self.share_process {
            if let Some(handle) = id_of_label(&r.label).and_then(resolve_index) {
                if fingerprint_of(handle.index()) == r.fingerprint {
                    return Ok(handle);
                }
            }
        }
        let key = format!("{}\t{}\t{}", r.name, r.table, r.column);
        let mut opened = self.opened.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, handle)) = opened
            .get(&key)
            .filter(|(fingerprint, _)| *fingerprint == r.fingerprint)
        {
            alias_label(&r.label, handle);
            return Ok(Arc::clone(handle));
        }
        // Another fingerprint of this index is stale now: its memory goes back first.
        opened.remove(&key);
        let handle = self.open_saved(r, pool)?;
        alias_label(&r.label, &handle);
        opened.insert(key, (r.fingerprint, Arc::clone(&handle)));
        Ok(handle)
    }

    /// Where this worker looks for the saved index of `r`.
    fn saved_path(&self, r: &IndexRef) -> Option<PathBuf> {
        let theirs = PathBuf::from(r.path.as_ref()?);
        Some(match (&self.index_dir, theirs.file_name()) {
            (Some(dir), Some(name)) => dir.join(name),
            _ => theirs,
        })
    }

    fn open_saved(&self, r: &IndexRef, pool: &Arc<dyn MemoryPool>) -> Result<Arc<IndexHandle>> {
        let unavailable = |why: String| {
            DataFusionError::Execution(format!("{} is not available on this worker: {why}", r.describe()))
        };
        let Some(path) = self.saved_path(r) else {
            return Err(unavailable(format!(
                "the coordinator holds it in memory only (table '{}' is not file-backed), and a worker in \
                 another process can only open saved indexes",
                r.table
            )));
        };
        let cannot_open = |e: String| unavailable(format!("cannot open the saved index {}: {e}", path.display()));
        let bytes = std::fs::metadata(&path).map_err(|e| cannot_open(e.to_string()))?.len();
        let reservation = MemoryConsumer::new(format!("MPHF index {} (worker)", r.name)).register(pool);
        reservation.try_grow(bytes as usize).map_err(|e| {
            DataFusionError::ResourcesExhausted(format!(
                "{}: its saved file {} needs {bytes} bytes, more than this worker's memory pool has left: {e}",
                r.describe(),
                path.display()
            ))
        })?;
        let index = ColumnIndex::open(&path).map_err(|e| cannot_open(e.to_string()))?;
        let found = fingerprint_of(&index);
        if found != r.fingerprint {
            return Err(unavailable(format!(
                "the saved index {} has fingerprint {found:016x}, the coordinator's has {:016x} (stale or \
                 rebuilt: save the coordinator's index where the workers read it)",
                path.display(),
                r.fingerprint
            )));
        }
        if self.notices {
            eprintln!(
                "opened saved MPHF index '{}' on {}({}) from {} (fingerprint {found:016x})",
                r.name,
                r.table,
                r.column,
                path.display()
            );
        }
        let slot_maps = read_slot_maps(&path, &index, &r.data_files);
        // The slot maps live beside the index in memory: reserved too, or left out.
        let slot_maps = slot_maps.filter(|m| reservation.try_grow(m.size_bytes() as usize).is_ok());
        let info = IndexInfo {
            name: r.name.clone(),
            table: r.table.clone(),
            column: r.column.clone(),
            built_at: String::new(),
            device: index.device().to_string(),
            build_ms: 0.0,
            source: IndexSource::Loaded,
            path: Some(path),
            rows_per_run: None,
        };
        Ok(IndexHandle::new(Arc::new(index), info, slot_maps, Some(reservation)))
    }
}

/// The slot maps saved beside the index at `path`, when they hold for the data files as this
/// worker sees them (`None` otherwise: the slot scans that need them fail with a clear error).
fn read_slot_maps(path: &Path, index: &ColumnIndex, data_files: &[String]) -> Option<Arc<SlotMaps>> {
    if data_files.is_empty() {
        return None;
    }
    let stamps: Vec<FileStamp> = data_files
        .iter()
        .map(|f| FileStamp::of(Path::new(f)))
        .collect::<std::result::Result<_, _>>()
        .ok()?;
    SlotMaps::read(&slot_map_path(path), index, &stamps).ok().map(Arc::new)
}
