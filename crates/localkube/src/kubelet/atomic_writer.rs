//! The kubelet's atomic writer for projected volume content: the payload
//! lives in a timestamped directory `..<timestamp>`, `..data` is a symlink
//! to it that is swapped atomically (rename of `..data_tmp`), and every
//! top-level entry of the payload is a symlink `name -> ..data/name`.
//! Readers therefore always see one complete version.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path};
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

const DATA_DIR: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    /// File content.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
}

/// Errors of the atomic writer.
#[derive(Debug, Error)]
pub enum WriteError {
    /// A payload path is absolute, contains `..` or starts with `..`.
    #[error("invalid payload path {0:?}")]
    InvalidPath(String),
    /// Filesystem error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: io::Error,
    },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> WriteError {
    let context = context.into();
    move |source| WriteError::Io { context, source }
}

fn validate(path: &str) -> Result<(), WriteError> {
    let p = Path::new(path);
    let bad = path.is_empty()
        || p.is_absolute()
        || path.starts_with("..")
        || p.components().any(|c| !matches!(c, Component::Normal(_)));
    if bad {
        return Err(WriteError::InvalidPath(path.to_string()));
    }
    Ok(())
}

/// Reads the payload currently visible in `dir` (through `..data`).
fn current_payload(dir: &Path) -> Option<BTreeMap<String, FileProjection>> {
    let data = dir.join(DATA_DIR);
    let target = fs::read_link(&data).ok()?;
    let root = dir.join(target);
    let mut out = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).ok()? {
            let entry = entry.ok()?;
            let path = entry.path();
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                stack.push(path);
            } else {
                let rel = path
                    .strip_prefix(&root)
                    .ok()?
                    .to_string_lossy()
                    .into_owned();
                let data = fs::read(&path).ok()?;
                out.insert(
                    rel,
                    FileProjection {
                        data,
                        mode: meta.permissions().mode() & 0o7777,
                    },
                );
            }
        }
    }
    Some(out)
}

fn timestamp_dir_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = k8s_openapi::jiff::Timestamp::now();
    format!(
        "..{}.{}{}",
        now.strftime("%Y_%m_%d_%H_%M_%S"),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Writes `payload` into `dir` atomically. Returns `true` if the content
/// changed (and was swapped), `false` if it was already current.
pub fn write(dir: &Path, payload: &BTreeMap<String, FileProjection>) -> Result<bool, WriteError> {
    for path in payload.keys() {
        validate(path)?;
    }
    fs::create_dir_all(dir).map_err(io_err(format!("create {}", dir.display())))?;
    let old = current_payload(dir);
    if old.as_ref() == Some(payload) {
        return Ok(false);
    }
    let old_target = fs::read_link(dir.join(DATA_DIR)).ok();

    // 1. The new version in a fresh timestamped directory.
    let ts_name = timestamp_dir_name();
    let ts_dir = dir.join(&ts_name);
    fs::create_dir(&ts_dir).map_err(io_err(format!("create {}", ts_dir.display())))?;
    fs::set_permissions(&ts_dir, fs::Permissions::from_mode(0o755))
        .map_err(io_err("chmod timestamp dir"))?;
    for (rel, file) in payload {
        let path = ts_dir.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io_err(format!("create {}", parent.display())))?;
        }
        fs::write(&path, &file.data).map_err(io_err(format!("write {}", path.display())))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(file.mode))
            .map_err(io_err(format!("chmod {}", path.display())))?;
    }

    // 2. Swap `..data` atomically.
    let tmp = dir.join(DATA_TMP);
    let _ = fs::remove_file(&tmp);
    symlink(&ts_name, &tmp).map_err(io_err("symlink ..data_tmp"))?;
    fs::rename(&tmp, dir.join(DATA_DIR)).map_err(io_err("rename ..data_tmp"))?;

    // 3. User-visible symlinks for the top-level entries.
    let new_top: BTreeSet<String> = payload.keys().filter_map(|p| top_level(p)).collect();
    for name in &new_top {
        let link = dir.join(name);
        if fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA_DIR).join(name), &link)
                .map_err(io_err(format!("symlink {}", link.display())))?;
        }
    }
    if let Some(old) = &old {
        for name in old.keys().filter_map(|p| top_level(p)) {
            if !new_top.contains(&name) {
                let _ = fs::remove_file(dir.join(&name));
            }
        }
    }

    // 4. Drop the previous version.
    if let Some(old_target) = old_target {
        let old_dir = dir.join(old_target);
        if old_dir != ts_dir {
            let _ = fs::remove_dir_all(old_dir);
        }
    }
    Ok(true)
}

fn top_level(path: &str) -> Option<String> {
    path.split('/')
        .next()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str, u32)]) -> BTreeMap<String, FileProjection> {
        items
            .iter()
            .map(|(p, d, m)| {
                (
                    p.to_string(),
                    FileProjection {
                        data: d.as_bytes().to_vec(),
                        mode: *m,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn writes_swaps_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(write(d, &payload(&[("a", "1", 0o644), ("sub/b", "2", 0o600)])).unwrap());
        assert_eq!(fs::read_to_string(d.join("a")).unwrap(), "1");
        assert_eq!(fs::read_to_string(d.join("sub/b")).unwrap(), "2");
        assert_eq!(fs::read_link(d.join("a")).unwrap(), Path::new("..data/a"));
        let mode = fs::metadata(d.join("sub/b")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = fs::read_link(d.join(DATA_DIR)).unwrap();

        // Same content: nothing happens.
        assert!(!write(d, &payload(&[("a", "1", 0o644), ("sub/b", "2", 0o600)])).unwrap());
        assert_eq!(fs::read_link(d.join(DATA_DIR)).unwrap(), first);

        // New content: swapped, stale entries removed, old version gone.
        assert!(write(d, &payload(&[("a", "3", 0o644), ("c", "4", 0o644)])).unwrap());
        assert_eq!(fs::read_to_string(d.join("a")).unwrap(), "3");
        assert_eq!(fs::read_to_string(d.join("c")).unwrap(), "4");
        assert!(fs::symlink_metadata(d.join("sub")).is_err());
        assert!(!d.join(&first).exists());
        let entries: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(entries.len(), 4, "{entries:?}"); // ..data, ..<ts>, a, c
    }

    #[test]
    fn rejects_bad_paths() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["/abs", "../x", "..x", "a/../b", ""] {
            assert!(
                write(dir.path(), &payload(&[(bad, "x", 0o644)])).is_err(),
                "{bad}"
            );
        }
    }
}
