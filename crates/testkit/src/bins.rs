//! Where the server binaries are: Valkey's, and the tests' object stores (SeaweedFS' `weed`,
//! `fake-gcs-server`, Azurite's `azurite-blob`).

use std::path::{Path, PathBuf};

/// Which server binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// Valkey 9.1 (atomic slot migration, no TLS).
    V9,
    /// Valkey 8.0 (TLS).
    V8,
}

/// The dependency cache's bin directory: `$LOCALKUBE_BIN_DIR`, else
/// `$VALKEY_OPERATOR_CACHE/bin`, else `~/.cache/valkey-operator/bin`.
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LOCALKUBE_BIN_DIR") {
        return d.into();
    }
    if let Some(c) = std::env::var_os("VALKEY_OPERATOR_CACHE") {
        return PathBuf::from(c).join("bin");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
        .join(".cache/valkey-operator/bin")
}

impl Flavor {
    /// Major version.
    pub fn major(self) -> u32 {
        match self {
            Flavor::V9 => 9,
            Flavor::V8 => 8,
        }
    }

    /// The binary: `VALKEY9_SERVER` / `VALKEY8_SERVER` when set, else the installed one.
    pub fn binary(self) -> PathBuf {
        let (var, default) = match self {
            Flavor::V9 => ("VALKEY9_SERVER", bin_dir().join("valkey-server-9")),
            Flavor::V8 => ("VALKEY8_SERVER", PathBuf::from("/usr/bin/valkey-server")),
        };
        let p = std::env::var_os(var).map_or(default, PathBuf::from);
        if p.exists() || self == Flavor::V8 {
            return p;
        }
        // The installer creates the symlink last; fall back to the versioned cache directory.
        let cache = p
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        std::fs::read_dir(&cache)
            .ok()
            .and_then(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path().join("valkey-server"))
                    .find(|p| p.exists() && p.to_string_lossy().contains("valkey-9"))
            })
            .unwrap_or(p)
    }

    /// The binary when it is installed.
    pub fn installed(self) -> Option<PathBuf> {
        Some(self.binary()).filter(|p| p.exists())
    }
}

/// A tool of the tests installed by `hack/install-deps.sh STEP`: `$env` when set, else
/// `name` in [`bin_dir`], else in a versioned cache directory (`<cache_dir>-*`) next to it (the
/// installer links it last), else on `PATH`. `None` when none exists.
fn installed_tool(env: &str, name: &str, cache_dir: &str, in_dir: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let bin = bin_dir();
    let linked = bin.join(name);
    if linked.is_file() {
        return Some(linked);
    }
    let cached = bin.parent().and_then(|cache| {
        std::fs::read_dir(cache)
            .ok()?
            .filter_map(Result::ok)
            .find_map(|e| {
                let p = e.path().join(in_dir).join(name);
                (e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{cache_dir}-"))
                    && p.is_file())
                .then_some(p)
            })
    });
    cached.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// SeaweedFS' `weed` (`hack/install-deps.sh seaweedfs`; `WEED_BIN` overrides).
pub fn weed() -> Option<PathBuf> {
    installed_tool("WEED_BIN", "weed", "seaweedfs", "")
}

/// `fake-gcs-server`, the Google Cloud Storage emulator (`hack/install-deps.sh fakegcs`;
/// `FAKE_GCS_SERVER_BIN` overrides).
pub fn fake_gcs_server() -> Option<PathBuf> {
    installed_tool(
        "FAKE_GCS_SERVER_BIN",
        "fake-gcs-server",
        "fake-gcs-server",
        "",
    )
}

/// Azurite's `azurite-blob`, the Azure Blob Storage emulator, a Node.js script
/// (`hack/install-deps.sh azurite`; `AZURITE_BLOB_BIN` overrides).
pub fn azurite_blob() -> Option<PathBuf> {
    installed_tool(
        "AZURITE_BLOB_BIN",
        "azurite-blob",
        "azurite",
        "node_modules/.bin",
    )
}
