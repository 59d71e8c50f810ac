//! Phase 6 of an installation: the slot maps of a Parquet table's index (`index::SlotMaps`: the
//! slot of every row of every file), read from the file next to the saved index when they are
//! valid for this index and these files, else made and saved there.
//!
//! Slot maps are an accelerator: a table whose slot maps cannot be made, or do not fit the
//! memory pool, keeps its index without them (with a notice).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::datafusion::catalog::TableProvider;
use ::datafusion::common::{DataFusionError, Result};

use crate::core::column::ColumnIndex;
use crate::datafusion::persist;
use crate::device::Device;
use crate::index::SlotMaps;
use crate::placement;

use super::{Budget, Installer};

/// Where the slot maps of the index saved at `index_path` are saved: beside it, `.slots` added.
pub fn slot_map_path(index_path: &Path) -> PathBuf {
    let mut name = index_path.as_os_str().to_owned();
    name.push(".slots");
    PathBuf::from(name)
}

/// The slot maps of `index` over the Parquet files of `inner` (`None` for other tables), their
/// bytes reserved in `budget` first. `saved`: the saved index's path, beside which they are kept.
pub(super) async fn for_table(
    installer: &Installer<'_>,
    inner: &Arc<dyn TableProvider>,
    column: &str,
    index: &Arc<ColumnIndex>,
    saved: Option<&Path>,
    device: Device,
    budget: &Budget<'_>,
) -> Result<Option<Arc<SlotMaps>>> {
    let Some((_, files)) = persist::data_files(inner.as_ref()) else {
        return Ok(None);
    };
    let Some(stamps) = persist::stamps(&files) else {
        return Ok(None);
    };
    if stamps.is_empty() || stamps.iter().any(|s| s.rows < 0) || index.len() >= u64::from(crate::index::NO_SLOT) {
        return Ok(None);
    }
    let rows: u64 = stamps.iter().map(|s| s.rows as u64).sum();
    if let Err(e) = budget.grow(rows * 4, "its slot maps", rows * 4) {
        installer.notice(&e.to_string());
        return Ok(None);
    }
    let path = saved.map(slot_map_path);
    if let Some(p) = path.as_ref().filter(|p| p.exists()) {
        match SlotMaps::read(p, index, &stamps) {
            Ok(maps) => return Ok(Some(Arc::new(maps))),
            Err(e) => installer.notice(&format!("slot maps {} not used ({e}); making them again", p.display())),
        }
    }
    let (index, col) = (Arc::clone(index), column.to_string());
    let built = tokio::task::spawn_blocking(move || {
        let (gpu, notice) = placement::slot_source_for(device, rows, &index);
        let built = match &gpu {
            Some(source) => SlotMaps::build_with(&stamps, &col, &index, source.as_ref()),
            None => SlotMaps::build(&stamps, &col, &index),
        };
        (built, notice)
    })
    .await
    .map_err(|e| DataFusionError::External(Box::new(e)))?;
    let (built, notice) = built;
    if let Some(notice) = notice {
        installer.notice(&notice);
    }
    let maps = match built {
        Ok(maps) => maps,
        Err(e) => {
            budget.reservation.shrink(rows as usize * 4);
            installer.notice(&format!("column '{column}' has no slot maps: {e}"));
            return Ok(None);
        }
    };
    if let Some(p) = &path {
        if let Err(e) = maps.write(p) {
            installer.notice(&format!(
                "could not save slot maps to {}: {e}; they are used unsaved",
                p.display()
            ));
        }
    }
    Ok(Some(Arc::new(maps)))
}
