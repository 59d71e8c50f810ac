//! Phases 2 and 5 of an installation: reuse a saved index whose fingerprint matches the table's
//! data files, and save a built one next to them (see `persist` for the file format and the
//! fingerprint).
//!
//! A stale saved index is rebuilt, or refused under `mphf.on_stale = 'refuse'`; a corrupt one is
//! rebuilt. A save that fails (a read-only folder, a FIFO or symlink planted at the file's place)
//! costs the next session a rebuild, never this one its index.

use std::path::PathBuf;
use std::sync::Arc;

use ::datafusion::catalog::TableProvider;
use ::datafusion::common::{plan_err, Result};

use crate::core::column::ColumnIndex;
use crate::datafusion::persist::{self, Fingerprint, Provenance, SavedState};
use crate::datafusion::registry::IndexSource;

use super::{Budget, IndexSpec, Installer};

/// Where an index of a file-backed table is saved, with what it must match.
pub(super) struct SavedIndex<'a> {
    /// The index file.
    pub path: PathBuf,
    /// The table's data files when the installation started.
    fingerprint: Fingerprint,
    spec: &'a IndexSpec,
}

/// What phase 2 found: a reusable index (with the clustering measured when it was built), or
/// none, and where the index the installation ends with comes from.
pub(super) struct Reuse {
    pub index: Option<ColumnIndex>,
    pub rows_per_run: Option<f64>,
    pub source: IndexSource,
}

impl Default for Reuse {
    fn default() -> Self {
        Self {
            index: None,
            rows_per_run: None,
            source: IndexSource::Built,
        }
    }
}

impl<'a> SavedIndex<'a> {
    /// Where `spec`'s index of `inner` is saved; `None` without `mphf.persist` or for a table
    /// that is not file-backed.
    pub fn locate(installer: &Installer<'_>, inner: &Arc<dyn TableProvider>, spec: &'a IndexSpec) -> Option<Self> {
        if !installer.cfg.persist {
            return None;
        }
        let fingerprint = persist::fingerprint(inner.as_ref())?;
        let dir = persist::index_dir(&installer.cfg.index_dir, &fingerprint);
        Some(Self {
            path: persist::saved_path(&dir, &spec.table.text, &spec.column),
            fingerprint,
            spec,
        })
    }

    /// Phase 2. `at_registration`: any parameters are accepted (the table is being registered
    /// and its saved indexes loaded as they are); otherwise they must be `spec`'s.
    pub fn reuse(&self, installer: &Installer<'_>, budget: &Budget<'_>, at_registration: bool) -> Result<Reuse> {
        let (name, column, table) = (&self.spec.name, &self.spec.column, &self.spec.table.text);
        let params = persist::params_text(&self.spec.params, self.spec.seed);
        let want = (!at_registration).then_some(params.as_str());
        let file_len = std::fs::symlink_metadata(&self.path).map_or(0, |m| m.len());
        budget.grow(file_len, "reading its saved file", file_len)?;
        let state = persist::check_saved(&self.path, column, want, &self.fingerprint);
        if !matches!(state, SavedState::Fresh(_)) {
            budget.reservation.free();
        }
        let mut reuse = Reuse::default();
        match state {
            SavedState::Missing => {}
            SavedState::Fresh(index) => {
                installer.notice(&format!(
                    "reusing saved MPHF index {name} on {table}({column}) from {} (fingerprint matches)",
                    self.path.display()
                ));
                reuse.rows_per_run = Provenance::parse(index.provenance()).and_then(|p| p.rows_per_run);
                reuse.index = Some(*index);
                reuse.source = IndexSource::Loaded;
            }
            SavedState::Stale(why) => {
                if installer.cfg.refuse_stale() {
                    return plan_err!(
                        "saved MPHF index {} for {table}({column}) is stale: {why}; refusing it because \
                         mphf.on_stale = 'refuse' (delete the file or SET mphf.on_stale = 'rebuild')",
                        self.path.display()
                    );
                }
                installer.notice(&format!(
                    "saved MPHF index {} is stale ({why}); rebuilding",
                    self.path.display()
                ));
                reuse.source = IndexSource::RebuiltStale;
            }
            SavedState::Corrupt(why) => {
                installer.notice(&format!(
                    "saved MPHF index {} is corrupt ({why}); rebuilding",
                    self.path.display()
                ));
                reuse.source = IndexSource::RebuiltCorrupt;
            }
        }
        Ok(reuse)
    }

    /// Phase 5: records the provenance in `index` and saves it, unless the data files changed
    /// while it was built (then the statement fails: the index may not match them).
    pub fn save(
        &self,
        installer: &Installer<'_>,
        index: &mut ColumnIndex,
        inner: &Arc<dyn TableProvider>,
        rows_per_run: Option<f64>,
    ) -> Result<()> {
        let spec = self.spec;
        let provenance = Provenance {
            name: spec.name.clone(),
            column: spec.column.clone(),
            params: persist::params_text(&spec.params, spec.seed),
            fingerprint: self.fingerprint.text(),
            rows_per_run,
        };
        index.set_provenance(provenance.render());
        if persist::fingerprint(inner.as_ref()).as_ref() != Some(&self.fingerprint) {
            return plan_err!(
                "CREATE INDEX {}: the data files of '{}' changed while the index was built; retry",
                spec.name,
                spec.table.text
            );
        }
        let saved = match self.path.parent() {
            Some(dir) => std::fs::create_dir_all(dir).map_err(crate::MphfError::from),
            None => Ok(()),
        }
        .and_then(|()| index.write_to_path(&self.path));
        if let Err(e) = saved {
            installer.notice(&format!(
                "could not save MPHF index {} to {}: {e}; it is used without being saved",
                spec.name,
                self.path.display()
            ));
        }
        Ok(())
    }
}
