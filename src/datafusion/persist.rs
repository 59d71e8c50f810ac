//! Saved indexes of file-backed tables: where they live and when they may be reused.
//!
//! An index over a Parquet listing table is saved as `<dir>/<table>.<column>.mphf`, where `<dir>`
//! is `mphf.index_dir` or a `_mphf/` folder next to the data (inside the table's folder, or
//! beside a single file). Its provenance (see [`ColumnIndex::provenance`]) records the index name,
//! the column, the MPHF parameters and a **fingerprint** of the data: for every data file, its
//! canonical path, size, modification time (ns) and Parquet footer row count.
//!
//! Invariant: a saved index is used only when column, parameters and fingerprint equal those of
//! the data now ([`check_saved`]); anything else is `Stale` (rebuild, or refuse with
//! `mphf.on_stale = 'refuse'`) or `Corrupt` (unreadable: reported and rebuilt). The fingerprint
//! is taken before the column scan and again after the build: if the data changed meanwhile,
//! the index is not registered.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use ::datafusion::catalog::TableProvider;
use ::datafusion::datasource::listing::ListingTable;

use crate::core::column::ColumnIndex;
use crate::core::Params;
use crate::index::FileStamp;

use super::table::MphfTable;

/// First line of the provenance text.
const PROVENANCE_MAGIC: &str = "datafusion-mphf index v1";

/// The data files behind a table, with what identifies their content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// Folder the default `_mphf/` directory goes into.
    pub data_dir: PathBuf,
    /// One line per file: `path \t size \t mtime_ns \t rows \t content hash`, sorted by path.
    pub lines: Vec<String>,
}

impl Fingerprint {
    /// The text stored in the provenance.
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }
}

/// Every file under `dir` whose name ends with `ext`. DataFusion reads files whose names start
/// with `_` or `.` too, so none is skipped by name; descending into every folder can only add
/// files (a stricter fingerprint), and the index folder holds no data files.
fn collect_files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            collect_files(&path, ext, out)?;
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
    Ok(())
}

/// The data files of a local Parquet (or other file) listing table, with the folder the default
/// `_mphf/` directory goes into; `None` for any other provider, remote stores and glob paths
/// (such tables are not persisted and have no slot maps).
pub fn data_files(provider: &dyn TableProvider) -> Option<(PathBuf, Vec<PathBuf>)> {
    let provider = match provider.downcast_ref::<MphfTable>() {
        Some(t) => t.inner().as_ref(),
        None => provider,
    };
    let listing = provider.downcast_ref::<ListingTable>()?;
    let ext = listing.options().file_extension.clone();
    let mut files = Vec::new();
    let mut data_dir = None;
    for url in listing.table_paths() {
        if url.scheme() != "file" {
            return None;
        }
        let path = url.get_url().to_file_path().ok()?;
        if path.is_dir() {
            data_dir.get_or_insert_with(|| path.clone());
            let mut found = Vec::new();
            collect_files(&path, &ext, &mut found).ok()?;
            if let Some(glob) = url.get_glob() {
                found.retain(|f| {
                    let name = f.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
                    let relative = f.strip_prefix(&path).map(|r| r.to_string_lossy().replace('\\', "/"));
                    glob.matches(&name) || relative.is_ok_and(|r| glob.matches(&r))
                });
            }
            files.extend(found);
        } else if url.get_glob().is_some() {
            return None;
        } else {
            data_dir.get_or_insert_with(|| path.parent().map(Path::to_path_buf).unwrap_or_default());
            files.push(path);
        }
    }
    Some((data_dir?, files))
}

/// The stamps of `files`, sorted by path; `None` when one cannot be read.
pub fn stamps(files: &[PathBuf]) -> Option<Vec<FileStamp>> {
    let mut stamps = files
        .iter()
        .map(|f| FileStamp::of(f).ok())
        .collect::<Option<Vec<_>>>()?;
    stamps.sort_by(|a, b| a.line.cmp(&b.line));
    Some(stamps)
}

/// The fingerprint of a local Parquet (or other file) listing table (see [`data_files`]).
pub fn fingerprint(provider: &dyn TableProvider) -> Option<Fingerprint> {
    let (data_dir, files) = data_files(provider)?;
    Some(Fingerprint {
        data_dir,
        lines: stamps(&files)?.into_iter().map(|s| s.line).collect(),
    })
}

/// Replaces characters that are unsafe in a file name.
/// `s` as a file-name part that can be read back: letters, digits, `_` and `-` stay, every
/// other character becomes `~` and two hex digits per UTF-8 byte (`order id` → `order~20id`).
/// The escape is injective (`~` itself is escaped), so `a/b` and `a_b` get different files.
fn file_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_alphanumeric() || c == '_' || c == '-' {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "~{b:02x}");
            }
        }
    }
    out
}

/// The text [`file_part`] escaped, or `None` when `part` is not such an escape.
fn from_file_part(part: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(part.len());
    let mut rest = part.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'~' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else if b == b'.' {
            return None;
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

/// The folder saved indexes of this table go to.
pub fn index_dir(configured: &str, fp: &Fingerprint) -> PathBuf {
    if configured.is_empty() {
        fp.data_dir.join("_mphf")
    } else {
        PathBuf::from(configured)
    }
}

/// `<dir>/<table>.<column>.mphf`, both parts escaped by [`file_part`] (reversible: the loader
/// reads the column back from the name).
pub fn saved_path(dir: &Path, table: &str, column: &str) -> PathBuf {
    dir.join(format!("{}.{}.mphf", file_part(table), file_part(column)))
}

/// The column of a saved file name of `table` (see [`saved_path`]), if the name is one.
pub fn column_of_saved(file_name: &str, table: &str) -> Option<String> {
    let part = file_name
        .strip_prefix(&format!("{}.", file_part(table)))?
        .strip_suffix(".mphf")?;
    from_file_part(part)
}

/// Parameters as stored in the provenance.
pub fn params_text(p: &Params, seed: u64) -> String {
    format!(
        "leaf={},bucket={},rotation={},seed={}",
        p.leaf, p.bucket, p.rotation, seed
    )
}

/// Parses [`params_text`].
pub fn parse_params_text(s: &str) -> Option<(Params, u64)> {
    let mut p = Params::DEFAULT;
    let mut seed = 0;
    for kv in s.split(',') {
        let (k, v) = kv.split_once('=')?;
        match k {
            "leaf" => p.leaf = v.parse().ok()?,
            "bucket" => p.bucket = v.parse().ok()?,
            "rotation" => p.rotation = v.parse().ok()?,
            "seed" => seed = v.parse().ok()?,
            _ => return None,
        }
    }
    Some((p, seed))
}

/// The fields of a provenance text.
#[derive(Clone, Debug, PartialEq)]
pub struct Provenance {
    /// Index name.
    pub name: String,
    /// Column.
    pub column: String,
    /// [`params_text`].
    pub params: String,
    /// [`Fingerprint::text`].
    pub fingerprint: String,
    /// Rows per run of equal keys of the column in table order (for costing).
    pub rows_per_run: Option<f64>,
}

impl Provenance {
    /// Renders the text stored in the index.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "{PROVENANCE_MAGIC}");
        let _ = writeln!(s, "name={}", self.name);
        let _ = writeln!(s, "column={}", self.column);
        let _ = writeln!(s, "params={}", self.params);
        if let Some(r) = self.rows_per_run {
            let _ = writeln!(s, "rows_per_run={r}");
        }
        let _ = write!(s, "files:\n{}", self.fingerprint);
        s
    }
    /// Parses [`Provenance::render`]'s output.
    pub fn parse(s: &str) -> Option<Provenance> {
        let rest = s.strip_prefix(PROVENANCE_MAGIC)?.strip_prefix('\n')?;
        let (head, fingerprint) = rest
            .split_once("files:\n")
            .or_else(|| rest.split_once("files:").map(|(h, _)| (h, "")))?;
        let mut name = None;
        let mut column = None;
        let mut params = None;
        let mut rows_per_run = None;
        for line in head.lines() {
            if let Some(v) = line.strip_prefix("name=") {
                name = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("column=") {
                column = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("params=") {
                params = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("rows_per_run=") {
                rows_per_run = v.parse().ok();
            }
        }
        Some(Provenance {
            name: name?,
            column: column?,
            params: params?,
            fingerprint: fingerprint.to_string(),
            rows_per_run,
        })
    }
}

/// What a saved file holds, compared with the data now.
#[derive(Debug)]
pub enum SavedState {
    /// No file.
    Missing,
    /// Readable and matching: use it.
    Fresh(Box<ColumnIndex>),
    /// Readable but built from other data or with other parameters.
    Stale(String),
    /// Unreadable.
    Corrupt(String),
}

/// Checks the saved file at `path` against `column`, `params` (when given) and the fingerprint.
pub fn check_saved(path: &Path, column: &str, params: Option<&str>, fp: &Fingerprint) -> SavedState {
    if !path.exists() {
        return SavedState::Missing;
    }
    let index = match ColumnIndex::open(path) {
        Ok(i) => i,
        Err(e) => return SavedState::Corrupt(e.to_string()),
    };
    let Some(prov) = Provenance::parse(index.provenance()) else {
        return SavedState::Corrupt("the file has no datafusion-mphf provenance".to_string());
    };
    if prov.column != column {
        return SavedState::Stale(format!("it indexes column '{}', not '{column}'", prov.column));
    }
    if let Some(p) = params {
        if prov.params != p {
            return SavedState::Stale(format!("it was built with {}, not {p}", prov.params));
        }
    }
    if prov.fingerprint != fp.text() {
        return SavedState::Stale("the data files changed since it was built (fingerprint differs)".to_string());
    }
    SavedState::Fresh(Box::new(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provenance_round_trip() {
        let p = Provenance {
            name: "li_ok".into(),
            column: "l_orderkey".into(),
            params: params_text(&Params::DEFAULT, 7),
            fingerprint: "/a\t1\t2\t3\n/b\t4\t5\t6".into(),
            rows_per_run: Some(4.25),
        };
        assert_eq!(Provenance::parse(&p.render()), Some(p.clone()));
        assert_eq!(parse_params_text(&p.params), Some((Params::DEFAULT, 7)));
        let empty = Provenance {
            fingerprint: String::new(),
            ..p
        };
        assert_eq!(Provenance::parse(&empty.render()), Some(empty));
        assert_eq!(Provenance::parse("garbage"), None);
    }

    #[test]
    fn saved_names() {
        let p = saved_path(Path::new("/d"), "lineitem", "l_orderkey");
        assert_eq!(p, PathBuf::from("/d/lineitem.l_orderkey.mphf"));
        assert_eq!(
            column_of_saved("lineitem.l_orderkey.mphf", "lineitem").as_deref(),
            Some("l_orderkey")
        );
        assert_eq!(column_of_saved("orders.o_orderkey.mphf", "lineitem"), None);
    }

    #[test]
    fn saved_names_read_back_any_column() {
        let columns = [
            "order id",
            "a/b",
            "a_b",
            "a.b",
            "f(x)",
            "~7e",
            "ключ é",
            "",
            "..",
            "a~2fb",
        ];
        let mut names = std::collections::HashSet::new();
        for c in columns {
            let p = saved_path(Path::new("/d"), "my table", c);
            let name = p.file_name().and_then(|n| n.to_str()).unwrap().to_string();
            assert!(!name.contains('/') && !name.contains(' '), "{name}");
            assert_eq!(column_of_saved(&name, "my table").as_deref(), Some(c), "{name}");
            assert!(names.insert(name), "two columns share a file name");
        }
        assert_eq!(
            saved_path(Path::new("/d"), "t", "order id"),
            PathBuf::from("/d/t.order~20id.mphf")
        );
        assert_eq!(column_of_saved("t.a.b.mphf", "t"), None);
        assert_eq!(column_of_saved("t.a~2.mphf", "t"), None);
    }
}
