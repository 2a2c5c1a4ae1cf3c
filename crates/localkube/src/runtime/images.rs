//! Images → host executables.
//!
//! There are no container images here: an image reference is mapped, by the first matching
//! [`ImageEntry`], to a directory of symlinks to host binaries (put first on `PATH` inside the
//! container) plus the image's `ENTRYPOINT`, `CMD`, `WORKDIR` and `ENV`. The container root is the
//! host file system (see [`super::container`]; binary dirs on other mounts are bound in).
//!
//! Patterns are globs where `*` matches any run of characters. A pattern matches the whole
//! reference or any suffix of it that starts after a `/`, so `valkey/valkey:9*` also matches
//! `registry.example.com/valkey/valkey:9.0.0` and `busybox*` matches `docker.io/library/busybox`.
//!
//! Defaults ([`ImageTable::default_entries`]): `valkey/valkey:9*` (and untagged/`latest`) → the
//! Valkey 9.1 server from the binary cache with the Debian `valkey-cli`/`valkey-benchmark`;
//! `valkey/valkey:8*` → the Debian 8.0 binaries; `oliver006/redis_exporter*` → the built
//! exporter; `busybox*` → the host's `/bin` tools (`CMD ["sh"]`). Extra entries can come from a
//! YAML or JSON file ([`ImageTable::from_file`]):
//!
//! ```yaml
//! includeDefaults: true          # append the defaults after these entries
//! images:
//!   - name: my-tool              # directory name of the symlink farm
//!     patterns: ["example/tool:*"]
//!     links: { tool: /usr/local/bin/tool }
//!     entrypoint: ["tool"]
//!     cmd: ["--help"]
//!     workingDir: /work          # optional
//!     env: { TOOL_MODE: demo }   # optional
//!     user: 65532                # optional: the image's numeric USER (for runAsNonRoot)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{Result, RuntimeError};

/// `PATH` after the image's bin dir, as in a typical Debian-based image.
pub const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Environment variable naming the binary cache.
pub const BIN_DIR_ENV: &str = "LOCALKUBE_BIN_DIR";

/// The binary cache: `$LOCALKUBE_BIN_DIR`, else `~/.cache/valkey-operator/bin`.
pub fn default_bin_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/valkey-operator/bin")
}

/// One image mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImageEntry {
    /// Name of the entry (directory name of its symlink farm, `[A-Za-z0-9_.-]`).
    pub name: String,
    /// Image patterns (`*` globs), first matching entry wins.
    pub patterns: Vec<String>,
    /// Executables: name in the bin dir → host path it links to.
    #[serde(default)]
    pub links: BTreeMap<String, PathBuf>,
    /// Small scripts written into the bin dir (name → content), e.g. an entrypoint shim.
    #[serde(default)]
    pub scripts: BTreeMap<String, String>,
    /// The image's `ENTRYPOINT`.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// The image's `CMD`.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// The image's `WORKDIR` (container default is `/`).
    #[serde(default)]
    pub working_dir: Option<PathBuf>,
    /// The image's `ENV` (besides `PATH`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The image's `USER` as a numeric uid (the built-in entries: 0, as their images). `None`:
    /// not known to localkube; such a container runs as root unless `runAsUser` says
    /// otherwise, and `runAsNonRoot` cannot be checked against it (it is let through).
    #[serde(default)]
    pub user: Option<u32>,
}

/// What an image reference resolved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// The reference as asked for.
    pub image: String,
    /// Name of the matching entry.
    pub entry: String,
    /// Directory of the image's executables (first on `PATH`).
    pub bin_dir: PathBuf,
    /// The image's `ENTRYPOINT`.
    pub entrypoint: Vec<String>,
    /// The image's `CMD`.
    pub cmd: Vec<String>,
    /// The image's `WORKDIR`, if any.
    pub working_dir: Option<PathBuf>,
    /// The image's environment, `PATH` first (`bin_dir:` + [`BASE_PATH`]).
    pub env: Vec<(String, String)>,
    /// The image's numeric `USER`, if known ([`ImageEntry::user`]).
    pub user: Option<u32>,
}

impl ResolvedImage {
    /// The `PATH` value for containers of this image.
    pub fn path_env(&self) -> String {
        format!("{}:{BASE_PATH}", self.bin_dir.display())
    }

    /// The process argv as Kubernetes defines it: `command` replaces `ENTRYPOINT` (and drops
    /// `CMD`), `args` replaces `CMD`. `$(VAR)` expansion is the caller's job.
    pub fn argv(&self, command: &[String], args: &[String]) -> Vec<String> {
        let mut argv = if command.is_empty() {
            self.entrypoint.clone()
        } else {
            command.to_vec()
        };
        if !args.is_empty() {
            argv.extend_from_slice(args);
        } else if command.is_empty() {
            argv.extend_from_slice(&self.cmd);
        }
        argv
    }
}

/// Why an image cannot be "pulled".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// No entry matches.
    #[error("image {image:?} is not known to localkube (no entry of the image table matches it)")]
    Unknown {
        /// The reference.
        image: String,
    },
    /// An entry matches but one of its binaries is not installed.
    #[error("image {image:?} maps to {entry}, but {} is missing (run the dependency installer)", path.display())]
    MissingBinary {
        /// The reference.
        image: String,
        /// Matching entry.
        entry: String,
        /// The missing host path.
        path: PathBuf,
    },
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ImageFile {
    #[serde(default)]
    include_defaults: bool,
    #[serde(default)]
    images: Vec<ImageEntry>,
}

/// The image table of one environment, with its symlink farms materialized on disk.
#[derive(Debug, Clone)]
pub struct ImageTable {
    entries: Vec<ImageEntry>,
    dir: PathBuf,
}

/// Whether every directory above `target` is searchable and the file itself readable and
/// executable by any user (a missing target counts as reachable: the symlink dangles anyway).
fn reachable_by_anyone(target: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(real) = target.canonicalize() else {
        return true;
    };
    let mode = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
    mode(&real) & 0o005 == 0o005 && real.ancestors().skip(1).all(|d| mode(d) & 0o001 != 0)
}

/// The `valkey/valkey` image's `docker-entrypoint.sh`, as the real one behaves: started as
/// root with `valkey-server`, it gives the files in its working directory (`/data`) to the
/// `valkey` user (uid and gid 999) and runs the server as that user. Unlike the real one it
/// gives away files only when that directory is `/data`, and never crosses into another file
/// system: a localkube container shares the host's `/dev`, `/proc` and `/sys`.
const VALKEY_ENTRYPOINT: &str = r#"#!/bin/sh
# localkube stand-in for the valkey image's docker-entrypoint.sh.
set -e
# first arg is `-f` or `--some-option`, or first arg is `something.conf`
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
	set -- valkey-server "$@"
fi
# allow the container to be started with `--user`
if [ "$1" = 'valkey-server' ] && [ "$(id -u)" = '0' ]; then
	if [ "$(pwd)" = /data ]; then
		find . -xdev \! -user 999 -exec chown -h 999 '{}' +
	fi
	exec setpriv --reuid=999 --regid=999 --clear-groups -- "$0" "$@"
fi
exec "$@"
"#;

impl ImageTable {
    /// The built-in entries, with binaries from `bin_cache` (see [`default_bin_cache`]).
    pub fn default_entries(bin_cache: &Path) -> Vec<ImageEntry> {
        let valkey = |name: &str, patterns: &[&str], server: PathBuf| ImageEntry {
            name: name.to_string(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            links: BTreeMap::from([
                ("valkey-server".to_string(), server),
                (
                    "valkey-cli".to_string(),
                    PathBuf::from("/usr/bin/valkey-cli"),
                ),
                (
                    "valkey-benchmark".to_string(),
                    PathBuf::from("/usr/bin/valkey-benchmark"),
                ),
            ]),
            scripts: BTreeMap::from([(
                "docker-entrypoint.sh".to_string(),
                VALKEY_ENTRYPOINT.to_string(),
            )]),
            entrypoint: vec!["docker-entrypoint.sh".to_string()],
            cmd: vec!["valkey-server".to_string()],
            working_dir: Some(PathBuf::from("/data")),
            env: BTreeMap::new(),
            user: Some(0),
        };
        vec![
            valkey(
                "valkey-9",
                &["valkey/valkey:9*", "valkey/valkey:latest", "valkey/valkey"],
                bin_cache.join("valkey-server-9"),
            ),
            valkey(
                "valkey-8",
                &["valkey/valkey:8*"],
                PathBuf::from("/usr/bin/valkey-server"),
            ),
            ImageEntry {
                name: "redis-exporter".to_string(),
                patterns: vec![
                    "oliver006/redis_exporter:*".to_string(),
                    "oliver006/redis_exporter".to_string(),
                ],
                links: BTreeMap::from([(
                    "redis_exporter".to_string(),
                    bin_cache.join("redis_exporter"),
                )]),
                scripts: BTreeMap::new(),
                entrypoint: vec!["redis_exporter".to_string()],
                cmd: vec![],
                working_dir: None,
                env: BTreeMap::new(),
                // The real image runs as 59000, but the binary lives in the (root-only)
                // binary cache: run it as root unless the pod says otherwise.
                user: None,
            },
            ImageEntry {
                name: "busybox".to_string(),
                patterns: vec!["busybox*".to_string()],
                links: BTreeMap::new(),
                scripts: BTreeMap::new(),
                entrypoint: vec![],
                cmd: vec!["sh".to_string()],
                working_dir: None,
                env: BTreeMap::new(),
                user: Some(0),
            },
        ]
    }

    /// The default table; symlink farms are created under `dir` (e.g. `STATE/images`).
    pub fn default_table(bin_cache: &Path, dir: &Path) -> Result<Self> {
        Self::new(Self::default_entries(bin_cache), dir)
    }

    /// A table from a YAML or JSON file (format in the module docs).
    pub fn from_file(path: &Path, bin_cache: &Path, dir: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| RuntimeError::io("read", path, e))?;
        let is_json = path.extension().is_some_and(|e| e == "json");
        let file: ImageFile = if is_json {
            serde_json::from_str(&text).map_err(|e| e.to_string())
        } else {
            serde_saphyr::from_str(&text).map_err(|e| e.to_string())
        }
        .map_err(|reason| RuntimeError::Config {
            path: path.to_path_buf(),
            reason,
        })?;
        let mut entries = file.images;
        if file.include_defaults {
            entries.extend(Self::default_entries(bin_cache));
        }
        Self::new(entries, dir)
    }

    /// A table of `entries`; writes each entry's bin dir under `dir` (replacing old content).
    pub fn new(entries: Vec<ImageEntry>, dir: &Path) -> Result<Self> {
        for entry in &entries {
            let valid = |s: &str| {
                !s.is_empty()
                    && s != "."
                    && s != ".."
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            };
            if !valid(&entry.name) {
                return Err(RuntimeError::invalid(
                    "image entry name",
                    format!("{:?}", entry.name),
                ));
            }
            if let Some(bad) = entry
                .links
                .keys()
                .chain(entry.scripts.keys())
                .find(|n| !valid(n))
            {
                return Err(RuntimeError::invalid(
                    "image executable name",
                    format!("{bad:?} in {}", entry.name),
                ));
            }
            let bin = dir.join(&entry.name);
            if bin.exists() {
                std::fs::remove_dir_all(&bin).map_err(|e| RuntimeError::io("remove", &bin, e))?;
            }
            std::fs::create_dir_all(&bin)
                .map_err(|e| RuntimeError::io("create directory", &bin, e))?;
            for (name, target) in &entry.links {
                let link = bin.join(name);
                if reachable_by_anyone(target) {
                    std::os::unix::fs::symlink(target, &link)
                        .map_err(|e| RuntimeError::io("create symlink", &link, e))?;
                } else {
                    // A binary under a private directory (`/root/.cache`): a container running
                    // as its image's user could not execute it through a symlink.
                    // `link` does not follow a symlink: link (or copy) the file it names.
                    let file = target
                        .canonicalize()
                        .map_err(|e| RuntimeError::io("resolve", target, e))?;
                    std::fs::hard_link(&file, &link)
                        .or_else(|_| std::fs::copy(&file, &link).map(|_| ()))
                        .map_err(|e| RuntimeError::io("copy", &file, e))?;
                }
            }
            for (name, content) in &entry.scripts {
                use std::os::unix::fs::PermissionsExt;
                let file = bin.join(name);
                std::fs::write(&file, content).map_err(|e| RuntimeError::io("write", &file, e))?;
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| RuntimeError::io("chmod", &file, e))?;
            }
        }
        Ok(Self {
            entries,
            dir: dir.to_path_buf(),
        })
    }

    /// The entries, in matching order.
    pub fn entries(&self) -> &[ImageEntry] {
        &self.entries
    }

    /// Resolves an image reference; checks that the entry's binaries exist.
    pub fn resolve(&self, image: &str) -> Result<ResolvedImage, ImageError> {
        let entry = self
            .entries
            .iter()
            .find(|e| e.patterns.iter().any(|p| image_matches(p, image)))
            .ok_or_else(|| ImageError::Unknown {
                image: image.to_string(),
            })?;
        if let Some(missing) = entry.links.values().find(|t| !t.exists()) {
            return Err(ImageError::MissingBinary {
                image: image.to_string(),
                entry: entry.name.clone(),
                path: missing.clone(),
            });
        }
        let bin_dir = self.dir.join(&entry.name);
        let mut env = vec![(
            "PATH".to_string(),
            format!("{}:{BASE_PATH}", bin_dir.display()),
        )];
        env.extend(
            entry
                .env
                .iter()
                .filter(|(k, _)| k.as_str() != "PATH")
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        Ok(ResolvedImage {
            image: image.to_string(),
            entry: entry.name.clone(),
            bin_dir,
            entrypoint: entry.entrypoint.clone(),
            cmd: entry.cmd.clone(),
            working_dir: entry.working_dir.clone(),
            env,
            user: entry.user,
        })
    }
}

/// Whether `pattern` matches `image` or one of its `/`-separated suffixes.
pub fn image_matches(pattern: &str, image: &str) -> bool {
    if glob(pattern.as_bytes(), image.as_bytes()) {
        return true;
    }
    image
        .char_indices()
        .filter(|(_, c)| *c == '/')
        .any(|(i, _)| glob(pattern.as_bytes(), &image.as_bytes()[i + 1..]))
}

/// `*`-only glob matching (iterative, linear backtracking).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_with_registry_prefixes() {
        assert!(image_matches("valkey/valkey:9*", "valkey/valkey:9.0.0"));
        assert!(image_matches(
            "valkey/valkey:9*",
            "registry.example.com/valkey/valkey:9.0.0"
        ));
        assert!(image_matches(
            "valkey/valkey:9*",
            "registry.example.com:5000/mirror/valkey/valkey:9.1@sha256:abc"
        ));
        assert!(!image_matches("valkey/valkey:9*", "valkey/valkey:8.0.1"));
        assert!(!image_matches("valkey/valkey:9*", "notvalkey/valkey:9"));
        assert!(image_matches("busybox*", "docker.io/library/busybox:1.36"));
        assert!(image_matches(
            "oliver006/redis_exporter:*",
            "oliver006/redis_exporter:v1.80.0"
        ));
        assert!(image_matches("a*b*c", "axxbyyc"));
        assert!(!image_matches("a*b*c", "axxbyy"));
    }

    #[test]
    fn argv_follows_kubernetes_rules() {
        let img = ResolvedImage {
            image: "x".into(),
            entry: "x".into(),
            bin_dir: "/b".into(),
            entrypoint: vec!["ep".into()],
            cmd: vec!["c1".into()],
            working_dir: None,
            env: vec![],
            user: None,
        };
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(img.argv(&[], &[]), s(&["ep", "c1"]));
        assert_eq!(img.argv(&[], &s(&["a"])), s(&["ep", "a"]));
        assert_eq!(img.argv(&s(&["cmd"]), &[]), s(&["cmd"]));
        assert_eq!(img.argv(&s(&["cmd"]), &s(&["a"])), s(&["cmd", "a"]));
        assert_eq!(img.path_env(), format!("/b:{BASE_PATH}"));
    }

    #[test]
    fn table_materializes_and_resolves() {
        let tmp = tempfile::tempdir().unwrap();
        let fake_cache = tmp.path().join("cache");
        std::fs::create_dir_all(&fake_cache).unwrap();
        let table = ImageTable::default_table(&fake_cache, &tmp.path().join("images")).unwrap();
        // The Valkey 9 server is missing in the fake cache.
        assert!(matches!(
            table.resolve("valkey/valkey:9.0.0"),
            Err(ImageError::MissingBinary { .. })
        ));
        assert!(matches!(
            table.resolve("nginx:1.27"),
            Err(ImageError::Unknown { .. })
        ));
        let bb = table.resolve("busybox:1.36").unwrap();
        assert_eq!(bb.argv(&[], &[]), vec!["sh".to_string()]);
        assert_eq!(bb.env[0].0, "PATH");
        let shim = tmp.path().join("images/valkey-9/docker-entrypoint.sh");
        let out = std::process::Command::new(&shim)
            .args(["echo", "hi"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
        let link = std::fs::read_link(tmp.path().join("images/valkey-9/valkey-server")).unwrap();
        assert_eq!(link, fake_cache.join("valkey-server-9"));
    }

    #[test]
    fn table_from_yaml_and_json() {
        let tmp = tempfile::tempdir().unwrap();
        let yaml = tmp.path().join("images.yaml");
        std::fs::write(
            &yaml,
            "includeDefaults: true\nimages:\n  - name: tool\n    patterns: [\"example/tool:*\"]\n    links: { sh: /bin/sh }\n    entrypoint: [sh]\n    workingDir: /work\n    env: { MODE: demo }\n",
        )
        .unwrap();
        let t = ImageTable::from_file(&yaml, tmp.path(), &tmp.path().join("i1")).unwrap();
        let r = t.resolve("example/tool:1").unwrap();
        assert_eq!(r.working_dir, Some(PathBuf::from("/work")));
        assert!(r.env.contains(&("MODE".to_string(), "demo".to_string())));
        assert!(t.resolve("busybox").is_ok());
        let json = tmp.path().join("images.json");
        std::fs::write(
            &json,
            r#"{"images":[{"name":"tool","patterns":["example/tool:*"],"cmd":["x"]}]}"#,
        )
        .unwrap();
        let t = ImageTable::from_file(&json, tmp.path(), &tmp.path().join("i2")).unwrap();
        assert!(t.resolve("example/tool:2").is_ok());
        assert!(t.resolve("busybox").is_err());
    }
}
