//! [`AtomicFile`]: a file that appears at its path whole or not at all, written safely in a
//! folder others can write to (index files, slot files, `lookup` and `tpch` outputs).
//!
//! Invariants:
//! - the target must be absent or a regular file: a symlink, FIFO, device or folder there is
//!   refused, never replaced (a rename over a symlink would replace the link, a FIFO would be
//!   turned into a file, a device node would be replaced when run as root);
//! - the data goes to a temporary file in the same folder with an unpredictable name, created
//!   with `create_new` (`O_CREAT | O_EXCL`, which also fails on a planted symlink), so the
//!   write never follows a link someone placed;
//! - [`AtomicFile::commit`] syncs the data, renames it over the target and syncs the folder, so
//!   the rename itself survives a crash. Dropped without a commit (an error on the way), the
//!   temporary file is removed and the target is untouched.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{MphfError, Result};

/// Attempts at a fresh temporary name before giving up (each collides only with a file that
/// someone else created under a random-looking name).
const TEMP_ATTEMPTS: u32 = 16;

/// A file being written to a temporary name, renamed over its target on [`AtomicFile::commit`].
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    /// `None` once committed.
    file: Option<File>,
}

impl AtomicFile {
    /// Checks the target and creates the temporary file next to it.
    ///
    /// # Errors
    /// [`MphfError::Io`] when the target is not a regular file, or the folder is not writable.
    pub fn create(target: &Path) -> Result<AtomicFile> {
        if let Ok(meta) = std::fs::symlink_metadata(target) {
            if !meta.file_type().is_file() {
                return Err(MphfError::Io(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("refusing to overwrite {}: it is not a regular file", target.display()),
                )));
            }
        }
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "output".into());
        let (temp, file) = create_temp(&folder_of(target), &name)?;
        Ok(AtomicFile {
            target: target.to_path_buf(),
            temp,
            file: Some(file),
        })
    }

    /// Syncs the data, renames the temporary file over the target and syncs the folder.
    ///
    /// # Errors
    /// [`MphfError::Io`]; the temporary file is removed and the target left as it was.
    pub fn commit(mut self) -> Result<()> {
        let file = self.file.take().expect("an uncommitted AtomicFile holds its file");
        let result = (|| -> Result<()> {
            file.sync_all()?;
            drop(file);
            std::fs::rename(&self.temp, &self.target)?;
            File::open(folder_of(&self.target))?.sync_all()?;
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&self.temp);
        }
        result
    }

    fn file(&mut self) -> &mut File {
        self.file.as_mut().expect("an uncommitted AtomicFile holds its file")
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// The folder of `path` (`.` for a bare file name).
fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// A new file `.<name>.<random>.tmp` in `dir`, created exclusively.
fn create_temp(dir: &Path, name: &str) -> Result<(PathBuf, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut seed = [0u8; 24];
        seed[..8].copy_from_slice(&nanos.to_le_bytes());
        seed[8..16].copy_from_slice(&n.to_le_bytes());
        seed[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        let tag = xxhash_rust::xxh3::xxh3_64(&seed);
        let temp = dir.join(format!(".{name}.{tag:016x}.tmp"));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&temp) {
            Ok(f) => return Ok((temp, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.map_or_else(|| MphfError::Format("no temporary file name".into()), MphfError::Io))
}
