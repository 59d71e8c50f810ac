//! Index registries: the process-wide table of live indexes (resolved by id from field metadata)
//! and the session-level catalog of named indexes (`CREATE INDEX` / `DROP INDEX` / `SHOW`).
//!
//! # Why two levels
//!
//! A scalar UDF only sees its argument *fields* (name, type, metadata) and the
//! [`ConfigOptions`](::datafusion::config::ConfigOptions), not the session. An
//! [`MphfTable`](super::MphfTable) therefore labels each indexed column with the metadata key
//! [`INDEX_METADATA_KEY`] whose value is the index's label (a process nonce and a process-unique
//! index id, [`IndexHandle::label`]); [`resolve_index`] turns the id
//! back into the index. The live table holds [`Weak`] references: an index lives exactly as long
//! as some table, session registry or running plan holds its [`IndexHandle`], and a dropped index
//! can never be resolved again (ids are never reused).
//!
//! The session level, [`MphfRegistry`], maps index names to handles; it is stored as a
//! [`SessionConfig`](::datafusion::prelude::SessionConfig) extension so that optimizer rules and
//! other extensions find it through [`registry_of`] (the hook for the GROUP BY and JOIN rules).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock, Weak};

use ::datafusion::arrow::datatypes::Field;
use ::datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use ::datafusion::prelude::SessionConfig;

use crate::core::column::translate::SlotTranslation;
use crate::core::column::ColumnIndex;
use crate::index::SlotMaps;

/// Field metadata key that marks a column as MPHF-indexed; the value is the index's label.
pub const INDEX_METADATA_KEY: &str = "mphf.index";

/// Field-metadata key of `mphf_index(...)`'s output: the id of the index whose slots the column
/// holds (so a GROUP BY on it can use the slots as group indices without a lookup).
pub const SLOT_METADATA_KEY: &str = "mphf.slot_of";

/// Field-metadata key of the column a slot-map scan appends (see
/// [`slot_scan`](super::slot_scan)): the label of the index whose slots it holds. A row's value
/// is its key's slot, [`NO_SLOT`](crate::index::NO_SLOT) for a NULL key, or NULL when the scan
/// could not vouch for it (the row must be looked up).
pub const SCAN_SLOTS_METADATA_KEY: &str = "mphf.scan_slots_of";

/// Where the index of a handle came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexSource {
    /// Built in this process from the table's data.
    Built,
    /// Loaded from a saved file whose fingerprint matched the data.
    Loaded,
    /// Rebuilt because the saved file no longer matched the data.
    RebuiltStale,
    /// Rebuilt because the saved file could not be read.
    RebuiltCorrupt,
}

impl IndexSource {
    /// Short lowercase label used by `SHOW MPHF INDEXES`.
    pub fn label(&self) -> &'static str {
        match self {
            IndexSource::Built => "built",
            IndexSource::Loaded => "loaded",
            IndexSource::RebuiltStale => "rebuilt (stale file)",
            IndexSource::RebuiltCorrupt => "rebuilt (corrupt file)",
        }
    }
}

/// Descriptive facts about one registered index.
#[derive(Clone, Debug)]
pub struct IndexInfo {
    /// Index name (normalized).
    pub name: String,
    /// Table name as registered in the session.
    pub table: String,
    /// Indexed column.
    pub column: String,
    /// When the index was built (UTC, `YYYY-MM-DD HH:MM:SS`).
    pub built_at: String,
    /// Build device (`cpu`, later `gpu`).
    pub device: String,
    /// Build (or load) time in milliseconds.
    pub build_ms: f64,
    /// Where the index came from.
    pub source: IndexSource,
    /// File the index is saved in, for file-backed tables.
    pub path: Option<PathBuf>,
    /// Rows per run of equal keys of the column in table order (`None`: unknown, e.g. an index
    /// saved by an older version).
    pub rows_per_run: Option<f64>,
}

/// One live index: the column index, its facts, and its memory reservation.
///
/// Dropping the last handle frees the reservation and unregisters the id.
#[derive(Debug)]
pub struct IndexHandle {
    /// Process-unique id (the value of [`INDEX_METADATA_KEY`]).
    id: u64,
    /// The index.
    index: Arc<ColumnIndex>,
    /// Facts shown by `SHOW MPHF INDEXES`.
    info: IndexInfo,
    /// The slot of every row of the indexed column per data file, for file-backed tables.
    slot_maps: Option<Arc<SlotMaps>>,
    /// Bytes reserved in the session's memory pool (released on drop).
    _reservation: Option<MemoryReservation>,
    /// Translations of other indexes' slots into this index's, by the other index's id, made
    /// on a join's first use and kept while both indexes live. Each pair has its own cell, so
    /// the build of one pair's translation never holds up a join of another pair; the map's
    /// lock is held only to find or add a cell.
    translations: Mutex<HashMap<u64, Arc<TranslationCell>>>,
    /// The index uploaded to the GPU on first use, kept while the index lives (or why not).
    #[cfg(feature = "cuda")]
    gpu: std::sync::OnceLock<Result<Arc<crate::gpu::GpuIndex>, crate::gpu::GpuError>>,
}

/// A translation kept with an index, with the memory it holds (`None`: cannot be made).
type KeptTranslation = Option<(Arc<SlotTranslation>, MemoryReservation)>;

/// One pair's translation: empty until made (or while the pool cannot hold it), then kept.
/// Joins of the same pair running at once wait on its lock for one build.
type TranslationCell = Mutex<Option<KeptTranslation>>;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// A random value of this process that every label carries: metadata that did not come from a
/// label of this process (a Parquet file's own field metadata, read with `skip_metadata =
/// false`, or a label saved by another process) never names one of its indexes.
static PROCESS_NONCE: LazyLock<u64> = LazyLock::new(|| {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let local = 0u8;
    let mut seed = [0u8; 24];
    seed[..8].copy_from_slice(&nanos.to_le_bytes());
    seed[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    seed[16..].copy_from_slice(&(std::ptr::addr_of!(local) as usize as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&seed)
});

/// The index id of a label made by [`IndexHandle::label`] in this process, or of a label of
/// another process that [`alias_label`] tied to an index of this one; `None` otherwise.
pub fn id_of_label(value: &str) -> Option<u64> {
    let (_, id) = value.split_once(':')?;
    if is_own_label(value) {
        return id.parse().ok();
    }
    ALIASES
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .get(value)
        .copied()
}

/// True when `label` was made by [`IndexHandle::label`] in this process (its nonce is ours).
fn is_own_label(label: &str) -> bool {
    label
        .split_once(':')
        .and_then(|(nonce, _)| u64::from_str_radix(nonce, 16).ok())
        .is_some_and(|nonce| nonce == *PROCESS_NONCE)
}

/// Labels of other processes (a distributed query's coordinator) and the ids of the indexes
/// of this process that a worker opened for them after checking their fingerprints (see
/// `distributed`). Plans sent by a coordinator carry its labels in their schemas; this table
/// lets them resolve here without rewriting any schema.
static ALIASES: LazyLock<RwLock<HashMap<String, u64>>> = LazyLock::new(|| RwLock::new(HashMap::new()));

/// Makes `label` (made by another process) resolve to `handle`. Entries of dropped indexes are
/// removed on the way. A label of this process is never aliased: it names its own index.
#[cfg_attr(not(feature = "distributed"), allow(dead_code))]
pub(crate) fn alias_label(label: &str, handle: &IndexHandle) {
    if is_own_label(label) {
        return;
    }
    let mut aliases = ALIASES.write().unwrap_or_else(PoisonError::into_inner);
    aliases.retain(|_, id| resolve_index(*id).is_some());
    aliases.insert(label.to_string(), handle.id());
}
static LIVE: LazyLock<RwLock<HashMap<u64, Weak<IndexHandle>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));

impl IndexHandle {
    /// Registers `index` under a fresh id.
    pub fn new(
        index: Arc<ColumnIndex>,
        info: IndexInfo,
        slot_maps: Option<Arc<SlotMaps>>,
        reservation: Option<MemoryReservation>,
    ) -> Arc<IndexHandle> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(IndexHandle {
            id,
            index,
            info,
            slot_maps,
            _reservation: reservation,
            translations: Mutex::new(HashMap::new()),
            #[cfg(feature = "cuda")]
            gpu: std::sync::OnceLock::new(),
        });
        LIVE.write()
            .expect("index table poisoned")
            .insert(id, Arc::downgrade(&handle));
        handle
    }
    /// The id.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The translation of `probe`'s slots into this index's, made on first use (in parallel,
    /// 4 bytes per probe slot reserved in `pool`) and kept with this index for later queries;
    /// the second value says whether this call made it. `None` when the pool cannot hold it
    /// (tried again next time) or it cannot be made (a slot past `u32`, a key type this index
    /// cannot take). Joins of this pair running at once wait for one build; joins of other pairs
    /// do not wait for it.
    pub fn translation_from(
        &self,
        probe: &IndexHandle,
        pool: &Arc<dyn MemoryPool>,
    ) -> (Option<Arc<SlotTranslation>>, bool) {
        let cell = {
            let mut cells = self.translations.lock().unwrap_or_else(PoisonError::into_inner);
            if !cells.contains_key(&probe.id) {
                // Cells of dropped indexes are never asked for again (ids are not reused).
                cells.retain(|id, _| resolve_index(*id).is_some());
            }
            Arc::clone(cells.entry(probe.id).or_default())
        };
        let mut kept = cell.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = kept.as_ref() {
            return (entry.as_ref().map(|(t, _)| Arc::clone(t)), false);
        }
        let name = format!(
            "MphfIndex[translation {}.{} -> {}.{}]",
            probe.info.table, probe.info.column, self.info.table, self.info.column
        );
        let reservation = MemoryConsumer::new(name).register(pool);
        if reservation.try_grow(4 * probe.index.len() as usize).is_err() {
            return (None, false);
        }
        let made = SlotTranslation::build(&probe.index, &self.index).ok().flatten();
        let entry = made.map(|t| (Arc::new(t), reservation));
        let out = entry.as_ref().map(|(t, _)| Arc::clone(t));
        *kept = Some(entry);
        (out, true)
    }
    /// The field-metadata value that names this index: `<process nonce>:<id>` (see
    /// [`id_of_label`]).
    pub fn label(&self) -> String {
        format!("{:016x}:{}", *PROCESS_NONCE, self.id)
    }
    /// The index.
    pub fn index(&self) -> &Arc<ColumnIndex> {
        &self.index
    }
    /// The facts.
    pub fn info(&self) -> &IndexInfo {
        &self.info
    }
    /// The slot maps of the table's data files, if it has them.
    pub fn slot_maps(&self) -> Option<&Arc<SlotMaps>> {
        self.slot_maps.as_ref()
    }

    /// The index on the GPU, uploaded on the first call and cached while the handle lives.
    ///
    /// # Errors
    /// Why the GPU cannot hold it (no usable GPU, upload failure); the error is cached too.
    #[cfg(feature = "cuda")]
    pub fn gpu_index(&self) -> Result<Arc<crate::gpu::GpuIndex>, crate::gpu::GpuError> {
        self.gpu
            .get_or_init(|| crate::gpu::GpuIndex::new(&self.index).map(Arc::new))
            .clone()
    }
}

impl Drop for IndexHandle {
    fn drop(&mut self) {
        if let Ok(mut live) = LIVE.write() {
            live.remove(&self.id);
        }
    }
}

/// The live index with this id, if any.
pub fn resolve_index(id: u64) -> Option<Arc<IndexHandle>> {
    LIVE.read()
        .expect("index table poisoned")
        .get(&id)
        .and_then(Weak::upgrade)
}

/// The index id a field advertises in its metadata, if any (it may no longer be live).
pub fn index_id_of_field(field: &Field) -> Option<u64> {
    field.metadata().get(INDEX_METADATA_KEY).and_then(|v| id_of_label(v))
}

/// The live index a field advertises, if any: the entry point for optimizer rules.
pub fn index_of_field(field: &Field) -> Option<Arc<IndexHandle>> {
    index_id_of_field(field).and_then(resolve_index)
}

/// The live index whose slots a field holds (the output of `mphf_index`), if any.
pub fn slot_index_of_field(field: &Field) -> Option<Arc<IndexHandle>> {
    field
        .metadata()
        .get(SLOT_METADATA_KEY)
        .and_then(|v| id_of_label(v))
        .and_then(resolve_index)
}

/// The session's named indexes.
#[derive(Debug, Default)]
pub struct MphfRegistry {
    indexes: RwLock<BTreeMap<String, Arc<IndexHandle>>>,
}

impl MphfRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }
    /// The index called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<IndexHandle>> {
        self.indexes.read().expect("registry poisoned").get(name).cloned()
    }
    /// Adds (or replaces) an index.
    pub fn insert(&self, handle: Arc<IndexHandle>) {
        self.indexes
            .write()
            .expect("registry poisoned")
            .insert(handle.info().name.clone(), handle);
    }
    /// Removes the index called `name`.
    pub fn remove(&self, name: &str) -> Option<Arc<IndexHandle>> {
        self.indexes.write().expect("registry poisoned").remove(name)
    }
    /// Removes every index of `table`; returns them.
    pub fn remove_table(&self, table: &str) -> Vec<Arc<IndexHandle>> {
        let mut map = self.indexes.write().expect("registry poisoned");
        let names: Vec<String> = map
            .values()
            .filter(|h| h.info().table == table)
            .map(|h| h.info().name.clone())
            .collect();
        names.iter().filter_map(|n| map.remove(n)).collect()
    }
    /// All indexes, ordered by name.
    pub fn list(&self) -> Vec<Arc<IndexHandle>> {
        self.indexes
            .read()
            .expect("registry poisoned")
            .values()
            .cloned()
            .collect()
    }
    /// The index on `table.column`, if any.
    pub fn find(&self, table: &str, column: &str) -> Option<Arc<IndexHandle>> {
        self.indexes
            .read()
            .expect("registry poisoned")
            .values()
            .find(|h| h.info().table == table && h.info().column == column)
            .cloned()
    }
}

/// The session registry stored in a session config (the hook for optimizer rules).
pub fn registry_of(config: &SessionConfig) -> Option<Arc<MphfRegistry>> {
    config.get_extension::<MphfRegistry>()
}

/// Formats a UNIX time (seconds, before 1970 too) as `YYYY-MM-DD HH:MM:SS` UTC
/// (civil-from-days, H. Hinnant).
pub fn format_utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use ::datafusion::arrow::array::{ArrayRef, Int64Array};
    use ::datafusion::execution::memory_pool::{GreedyMemoryPool, UnboundedMemoryPool};

    use crate::core::column::IndexOptions;

    fn handle(table: &str, keys: impl IntoIterator<Item = i64>) -> Arc<IndexHandle> {
        let keys: ArrayRef = Arc::new(Int64Array::from_iter_values(keys));
        let index = ColumnIndex::build(&[keys], &IndexOptions::default()).unwrap();
        let info = IndexInfo {
            name: format!("{table}_k"),
            table: table.to_string(),
            column: "k".to_string(),
            built_at: format_utc(0),
            device: "cpu".to_string(),
            build_ms: 0.0,
            source: IndexSource::Built,
            path: None,
            rows_per_run: None,
        };
        IndexHandle::new(Arc::new(index), info, None, None)
    }

    #[test]
    fn each_pair_keeps_its_own_translation_and_a_refused_one_is_tried_again() {
        let build = handle("b", (0..1000).map(|k| k * 7919));
        let probe_a = handle("a", (0..500).map(|k| k * 7919 * 2));
        let probe_c = handle("c", (0..300).map(|k| k * 7919 * 3));
        let roomy: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let tight: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(16));

        // The pool cannot hold a's translation: nothing is kept, the next call builds it.
        assert!(matches!(build.translation_from(&probe_a, &tight), (None, false)));
        let (a, made) = build.translation_from(&probe_a, &roomy);
        assert!(made);
        let a = a.expect("a's keys are all in the build index");
        let (c, made) = build.translation_from(&probe_c, &roomy);
        assert!(made, "another pair builds its own translation");
        let c = c.expect("c's keys are all in the build index");
        assert!(!Arc::ptr_eq(&a, &c));
        let (again, made) = build.translation_from(&probe_a, &tight);
        assert!(!made, "a kept translation is reused without asking the pool");
        assert!(Arc::ptr_eq(&again.unwrap(), &a));

        // Every probe slot maps to the build slot of the same key.
        for (probe, table) in [(&probe_a, &a), (&probe_c, &c)] {
            let mut want = Vec::new();
            build
                .index()
                .lookup_slots(probe.index().keys().as_ref(), &mut want)
                .unwrap();
            let mut got: Vec<u64> = (0..probe.index().len()).collect();
            table.translate(&mut got).unwrap();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn joins_of_one_pair_at_once_build_its_translation_once() {
        let build = handle("b", 0..20_000);
        let probe = handle("p", (0..20_000).rev());
        let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
        let made: Vec<bool> = std::thread::scope(|s| {
            let joins: Vec<_> = (0..8)
                .map(|_| s.spawn(|| build.translation_from(&probe, &pool).1))
                .collect();
            joins.into_iter().map(|j| j.join().unwrap()).collect()
        });
        assert_eq!(made.iter().filter(|&&m| m).count(), 1, "{made:?}");
        assert_eq!(pool.reserved(), 4 * 20_000);
    }

    #[test]
    fn utc_format() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(format_utc(-1), "1969-12-31 23:59:59");
    }
}
