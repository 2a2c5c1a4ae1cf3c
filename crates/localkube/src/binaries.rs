//! Where the Kubernetes, etcd, exporter and Valkey binaries are found.
//!
//! They are built and cached by `hack/install-deps.sh`; `LOCALKUBE_BIN_DIR`
//! overrides the default cache location.

use std::path::{Path, PathBuf};

/// Error when a required binary is missing.
#[derive(Debug, thiserror::Error)]
#[error("{name} not found in {dir}: run hack/install-deps.sh (or set LOCALKUBE_BIN_DIR)")]
pub struct MissingBinary {
    pub name: String,
    pub dir: PathBuf,
}

/// The directory holding the cached binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCALKUBE_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("VALKEY_OPERATOR_CACHE")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("valkey-operator"))
        })
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/valkey-operator"))
        })
        .unwrap_or_else(|| PathBuf::from("/root/.cache/valkey-operator"));
    cache.join("bin")
}

/// Paths of the control-plane binaries.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub dir: PathBuf,
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kubectl: PathBuf,
}

fn find(dir: &Path, name: &str) -> Result<PathBuf, MissingBinary> {
    let path = dir.join(name);
    if path.exists() {
        Ok(path)
    } else {
        Err(MissingBinary {
            name: name.to_string(),
            dir: dir.to_path_buf(),
        })
    }
}

impl Binaries {
    /// Locates every control-plane binary in [`bin_dir`].
    pub fn locate() -> Result<Binaries, MissingBinary> {
        Self::locate_in(&bin_dir())
    }

    /// Locates every control-plane binary in `dir`.
    pub fn locate_in(dir: &Path) -> Result<Binaries, MissingBinary> {
        Ok(Binaries {
            dir: dir.to_path_buf(),
            etcd: find(dir, "etcd")?,
            kube_apiserver: find(dir, "kube-apiserver")?,
            kube_controller_manager: find(dir, "kube-controller-manager")?,
            kube_scheduler: find(dir, "kube-scheduler")?,
            kubectl: find(dir, "kubectl")?,
        })
    }
}
