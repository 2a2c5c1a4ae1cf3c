//! Pod volumes: emptyDir, hostPath, configMap, secret, downwardAPI, projected
//! (with service-account tokens from the TokenRequest API) and
//! persistentVolumeClaim; projected content goes through the atomic writer
//! and is refreshed when its sources change.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, PersistentVolume, PersistentVolumeClaim, Pod,
    ServiceAccount, Volume,
};
use kube::api::PostParams;
use kube::{Api, Client};
use thiserror::Error;

use super::atomic_writer::{self, FileProjection};
use super::fieldpath::{PodRuntimeInfo, field_value, resource_value};
use super::objects::Objects;
use crate::runtime::Mount;

/// Why a volume could not be set up (the kubelet's `FailedMount`).
#[derive(Debug, Error)]
pub enum VolumeError {
    /// A referenced object is missing.
    #[error("{kind} {name:?} not found")]
    NotFound {
        /// Object kind.
        kind: &'static str,
        /// Object name.
        name: String,
    },
    /// A referenced key is missing.
    #[error("{kind} {name:?} references non-existent key {key:?}")]
    MissingKey {
        /// Object kind.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Key.
        key: String,
    },
    /// The claim is not bound yet.
    #[error("persistentvolumeclaim {0:?} is not bound")]
    Unbound(String),
    /// The volume type is not supported by localkube.
    #[error("volume {0:?}: unsupported volume type")]
    Unsupported(String),
    /// A downward API selector failed.
    #[error(transparent)]
    FieldPath(#[from] super::fieldpath::FieldPathError),
    /// Writing the content failed.
    #[error(transparent)]
    Write(#[from] atomic_writer::WriteError),
    /// API error.
    #[error("api: {0}")]
    Api(#[from] kube::Error),
    /// Filesystem error.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A volumeMount names no volume of the pod.
    #[error("volumeMount {0:?} refers to no volume")]
    NoSuchVolume(String),
}

/// What a volume became on the host.
#[derive(Debug, Clone)]
pub struct PreparedVolume {
    /// Host directory (or file) that mounts bind.
    pub path: PathBuf,
    /// Content comes from the atomic writer (refreshed on changes).
    pub projected: bool,
    /// The volume is read-only by its source (configMap, secret, ...).
    pub read_only: bool,
}

impl PreparedVolume {
    /// A directory the containers write to (emptyDir, hostPath, claim).
    fn writable(path: PathBuf) -> Self {
        Self {
            path,
            projected: false,
            read_only: false,
        }
    }
}

/// Everything the kubelet needs to (re-)project a pod's volumes.
pub struct VolumeContext<'a> {
    /// API client (token requests, claims).
    pub client: &'a Client,
    /// ConfigMap/Secret caches.
    pub objects: &'a Objects,
    /// Node allocatable (resourceFieldRef without limits).
    pub allocatable: &'a BTreeMap<String, String>,
    /// Pod IPs etc.
    pub info: &'a PodRuntimeInfo,
    /// First set-up of the pod's volumes (not a refresh): `fsGroup` ownership of claim
    /// directories is applied then, as the kubelet does when it mounts them.
    pub setup: bool,
}

/// Service-account tokens already issued for a pod, refreshed at 80 % of their lifetime.
#[derive(Default)]
pub struct TokenCache {
    tokens: HashMap<(String, i64), (String, Instant)>,
}

const DEFAULT_MODE: i32 = 0o644;

fn mode_of(item: Option<i32>, default: Option<i32>) -> u32 {
    (item.or(default).unwrap_or(DEFAULT_MODE) & 0o7777) as u32
}

/// A ConfigMap or Secret whose keys a volume (or a projected source) projects.
struct KeySource<'a> {
    /// A Secret (else a ConfigMap).
    secret: bool,
    name: &'a str,
    items: Option<&'a Vec<KeyToPath>>,
    optional: Option<bool>,
}

impl<'a> KeySource<'a> {
    fn config_map(
        name: &'a str,
        items: Option<&'a Vec<KeyToPath>>,
        optional: Option<bool>,
    ) -> Self {
        Self {
            secret: false,
            name,
            items,
            optional,
        }
    }

    fn secret(name: &'a str, items: Option<&'a Vec<KeyToPath>>, optional: Option<bool>) -> Self {
        Self {
            secret: true,
            ..Self::config_map(name, items, optional)
        }
    }

    /// Projects the keys of the object (of namespace `ns`, from the caches) into `out`.
    fn project(
        self,
        ctx: &VolumeContext<'_>,
        ns: &str,
        default_mode: Option<i32>,
        out: &mut BTreeMap<String, FileProjection>,
    ) -> Result<(), VolumeError> {
        let (kind, data) = if self.secret {
            ("secret", ctx.objects.secret_bytes(ns, self.name))
        } else {
            ("configmap", ctx.objects.config_map_bytes(ns, self.name))
        };
        let optional = self.optional == Some(true);
        project_keys(
            kind,
            self.name,
            data,
            self.items,
            optional,
            default_mode,
            out,
        )
    }
}

fn project_keys(
    kind: &'static str,
    name: &str,
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&Vec<KeyToPath>>,
    optional: bool,
    default_mode: Option<i32>,
    out: &mut BTreeMap<String, FileProjection>,
) -> Result<(), VolumeError> {
    let Some(data) = data else {
        if optional {
            return Ok(());
        }
        return Err(VolumeError::NotFound {
            kind,
            name: name.to_string(),
        });
    };
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.insert(
                    k,
                    FileProjection {
                        data: v,
                        mode: mode_of(None, default_mode),
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                match data.get(&item.key) {
                    Some(v) => {
                        out.insert(
                            item.path.clone(),
                            FileProjection {
                                data: v.clone(),
                                mode: mode_of(item.mode, default_mode),
                            },
                        );
                    }
                    None if optional => {}
                    None => {
                        return Err(VolumeError::MissingKey {
                            kind,
                            name: name.to_string(),
                            key: item.key.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

fn project_downward(
    pod: &Pod,
    ctx: &VolumeContext<'_>,
    items: Option<&[DownwardAPIVolumeFile]>,
    default_mode: Option<i32>,
    out: &mut BTreeMap<String, FileProjection>,
) -> Result<(), VolumeError> {
    for item in items.unwrap_or_default() {
        let value = if let Some(f) = &item.field_ref {
            field_value(pod, ctx.info, &f.field_path, true)?
        } else if let Some(r) = &item.resource_field_ref {
            let spec = pod.spec.as_ref();
            let container: Option<&Container> = spec.and_then(|s| {
                s.containers
                    .iter()
                    .chain(s.init_containers.iter().flatten())
                    .find(|c| Some(c.name.as_str()) == r.container_name.as_deref())
            });
            let container = container.ok_or_else(|| {
                super::fieldpath::FieldPathError::NoContainer(
                    r.container_name.clone().unwrap_or_default(),
                )
            })?;
            resource_value(
                container,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
                ctx.allocatable,
            )?
        } else {
            continue;
        };
        out.insert(
            item.path.clone(),
            FileProjection {
                data: value.into_bytes(),
                mode: mode_of(item.mode, default_mode),
            },
        );
    }
    Ok(())
}

async fn service_account_token(
    pod: &Pod,
    ctx: &VolumeContext<'_>,
    tokens: &mut TokenCache,
    audience: Option<String>,
    expiration: Option<i64>,
) -> Result<String, VolumeError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let expiration = expiration.unwrap_or(3600);
    let key = (audience.clone().unwrap_or_default(), expiration);
    if let Some((token, refresh_at)) = tokens.tokens.get(&key)
        && Instant::now() < *refresh_at
    {
        return Ok(token.clone());
    }
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.filter(|a| !a.is_empty()).map(|a| vec![a]),
            attestations: None,
            expiration_seconds: Some(expiration),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        }),
        ..Default::default()
    };
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ns);
    let resp = api
        .create_token_request(&sa, &PostParams::default(), &req)
        .await?;
    let token = resp.status.and_then(|s| s.token).unwrap_or_default();
    let lifetime = Duration::from_secs(expiration.max(600) as u64);
    tokens
        .tokens
        .insert(key, (token.clone(), Instant::now() + lifetime.mul_f64(0.8)));
    Ok(token)
}

/// Builds the payload of an atomic-writer volume; `None` for other volume types.
async fn payload(
    pod: &Pod,
    volume: &Volume,
    ctx: &VolumeContext<'_>,
    tokens: &mut TokenCache,
) -> Result<Option<BTreeMap<String, FileProjection>>, VolumeError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    if let Some(cm) = &volume.config_map {
        let source = KeySource::config_map(&cm.name, cm.items.as_ref(), cm.optional);
        source.project(ctx, &ns, cm.default_mode, &mut out)?;
    } else if let Some(s) = &volume.secret {
        let name = s.secret_name.as_deref().unwrap_or_default();
        let source = KeySource::secret(name, s.items.as_ref(), s.optional);
        source.project(ctx, &ns, s.default_mode, &mut out)?;
    } else if let Some(d) = &volume.downward_api {
        project_downward(pod, ctx, d.items.as_deref(), d.default_mode, &mut out)?;
    } else if let Some(p) = &volume.projected {
        for source in p.sources.iter().flatten() {
            if let Some(cm) = &source.config_map {
                let source = KeySource::config_map(&cm.name, cm.items.as_ref(), cm.optional);
                source.project(ctx, &ns, p.default_mode, &mut out)?;
            }
            if let Some(s) = &source.secret {
                let source = KeySource::secret(&s.name, s.items.as_ref(), s.optional);
                source.project(ctx, &ns, p.default_mode, &mut out)?;
            }
            if let Some(d) = &source.downward_api {
                project_downward(pod, ctx, d.items.as_deref(), p.default_mode, &mut out)?;
            }
            if let Some(t) = &source.service_account_token {
                let token = service_account_token(
                    pod,
                    ctx,
                    tokens,
                    t.audience.clone(),
                    t.expiration_seconds,
                )
                .await?;
                out.insert(
                    t.path.clone(),
                    FileProjection {
                        data: token.into_bytes(),
                        mode: mode_of(None, p.default_mode),
                    },
                );
            }
        }
    } else {
        return Ok(None);
    }
    Ok(Some(out))
}

/// Directory of a volume of a pod.
pub fn volume_dir(pod_dir: &Path, name: &str) -> PathBuf {
    pod_dir.join("volumes").join(name)
}

/// Sets up (or refreshes) every volume of the pod under `pod_dir`.
pub async fn prepare(
    pod: &Pod,
    pod_dir: &Path,
    ctx: &VolumeContext<'_>,
    tokens: &mut TokenCache,
) -> Result<BTreeMap<String, PreparedVolume>, VolumeError> {
    let mut out = BTreeMap::new();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let fs_group = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok());
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default()
    {
        let dir = volume_dir(pod_dir, &volume.name);
        let io = |what: &str, e| VolumeError::Io(format!("{what} {}", dir.display()), e);
        if let Some(content) = payload(pod, &volume, ctx, tokens).await? {
            atomic_writer::write(&dir, &content)?;
            if let Some(gid) = fs_group {
                set_ownership(&dir, gid, true).map_err(|e| io("set fsGroup ownership of", e))?;
            }
            out.insert(
                volume.name.clone(),
                PreparedVolume {
                    path: dir,
                    projected: true,
                    read_only: true,
                },
            );
        } else if let Some(empty_dir) = volume.empty_dir.as_ref().filter(|_| ctx.setup) {
            let mut fresh = !dir.exists();
            std::fs::create_dir_all(&dir).map_err(|e| io("create", e))?;
            if empty_dir.medium.as_deref() == Some("Memory") && !is_mount_point(&dir) {
                let size = memory_volume_size(pod, empty_dir.size_limit.as_ref(), ctx.allocatable);
                mount_tmpfs(&dir, size).map_err(|e| io("mount tmpfs on", e))?;
                fresh = true;
            }
            if fresh {
                // World-writable, as the kubelet makes every emptyDir (containers may run as
                // any user).
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))
                    .map_err(|e| io("chmod", e))?;
                if let Some(gid) = fs_group {
                    set_ownership(&dir, gid, false)
                        .map_err(|e| io("set fsGroup ownership of", e))?;
                }
            }
            out.insert(volume.name.clone(), PreparedVolume::writable(dir));
        } else if volume.empty_dir.is_some() {
            // A refresh: the emptyDir was set up with the pod (and must not come back while
            // the pod is torn down).
            out.insert(volume.name.clone(), PreparedVolume::writable(dir));
        } else if let Some(hp) = &volume.host_path {
            let path = PathBuf::from(&hp.path);
            if matches!(hp.type_.as_deref(), Some("DirectoryOrCreate")) {
                std::fs::create_dir_all(&path).map_err(|e| io("create", e))?;
            }
            out.insert(volume.name.clone(), PreparedVolume::writable(path));
        } else if let Some(claim) = &volume.persistent_volume_claim {
            let path = claim_path(ctx.client, &ns, &claim.claim_name).await?;
            if let Some(gid) = fs_group.filter(|_| ctx.setup && claim.read_only != Some(true)) {
                set_ownership(&path, gid, false).map_err(|e| {
                    VolumeError::Io(format!("set fsGroup ownership of {}", path.display()), e)
                })?;
            }
            let read_only = claim.read_only == Some(true);
            out.insert(
                volume.name.clone(),
                PreparedVolume {
                    read_only,
                    ..PreparedVolume::writable(path)
                },
            );
        } else {
            return Err(VolumeError::Unsupported(volume.name.clone()));
        }
    }
    Ok(out)
}

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    match (std::fs::metadata(dir), std::fs::metadata(parent)) {
        (Ok(d), Ok(p)) => d.dev() != p.dev(),
        _ => false,
    }
}

/// The size of a memory-backed emptyDir, as the kubelet computes it: the node's allocatable
/// memory, lowered to the pod's memory limit (when every container has one) and to the
/// volume's `sizeLimit`. `None`: no limit known (the tmpfs default, half the RAM).
fn memory_volume_size(
    pod: &Pod,
    size_limit: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    allocatable: &BTreeMap<String, String>,
) -> Option<u64> {
    let bytes = |q: &str| {
        super::quantity::parse_nanos(q)
            .ok()
            .map(|n| super::quantity::div_ceil(n, 1_000_000_000))
            .filter(|b| *b > 0)
    };
    let limit_of = |c: &Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("memory"))
            .and_then(|q| bytes(&q.0))
    };
    let mut size = allocatable.get("memory").and_then(|q| bytes(q));
    let spec = pod.spec.as_ref();
    let containers: Vec<Option<i128>> = spec
        .map(|s| s.containers.iter().map(limit_of).collect())
        .unwrap_or_default();
    if !containers.is_empty() && containers.iter().all(Option::is_some) {
        let sum: i128 = containers.iter().flatten().sum();
        let init = spec
            .and_then(|s| s.init_containers.as_ref())
            .map(|i| i.iter().filter_map(limit_of).max().unwrap_or(0))
            .unwrap_or(0);
        let pod_limit = sum.max(init);
        if size.is_none_or(|s| pod_limit <= s) {
            size = Some(pod_limit);
        }
    }
    if let Some(limit) = size_limit.and_then(|q| bytes(&q.0))
        && size.is_none_or(|s| limit <= s)
    {
        size = Some(limit);
    }
    size.and_then(|s| u64::try_from(s).ok())
}

/// Mounts a tmpfs (mode 0777, `size` bytes if given) on `dir`, in the kubelet's (host) mount
/// namespace; containers started later bind it.
fn mount_tmpfs(dir: &Path, size: Option<u64>) -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    let mut options = "mode=0777".to_string();
    if let Some(size) = size {
        options.push_str(&format!(",size={size}"));
    }
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(std::io::Error::from)
}

/// Unmounts every mount point under `dir` (the memory-backed emptyDirs of a pod's volumes
/// dir), deepest first, lazily if busy.
pub fn unmount_all(dir: &Path) {
    use nix::mount::{MntFlags, umount2};
    let Ok(dir) = dir.canonicalize() else {
        return;
    };
    let mut points: Vec<PathBuf> = crate::runtime::cleanup::mount_points()
        .into_iter()
        .filter(|p| p.starts_with(&dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        if umount2(&p, MntFlags::empty()).is_err()
            && let Err(e) = umount2(&p, MntFlags::MNT_DETACH)
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot unmount volume");
        }
    }
}

/// Gives a volume to `fsGroup` as the kubelet's `SetVolumeOwnership` does: every file and
/// directory group-owned by `gid`, group-readable (and writable unless `read_only`),
/// directories also setgid and `u+x,g+x`. Symlinks are re-owned, not chmod-ed.
fn set_ownership(dir: &Path, gid: u32, read_only: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{PermissionsExt, lchown};
    let mask = if read_only { 0o440 } else { 0o660 };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)?;
        lchown(&path, None, Some(gid))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mut mode = (meta.permissions().mode() & 0o7777) | mask;
        if meta.is_dir() {
            mode |= 0o2000 | 0o110;
            for e in std::fs::read_dir(&path)? {
                stack.push(e?.path());
            }
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

/// The host directory behind a bound claim.
async fn claim_path(client: &Client, ns: &str, claim: &str) -> Result<PathBuf, VolumeError> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = pvcs
        .get_opt(claim)
        .await?
        .ok_or_else(|| VolumeError::NotFound {
            kind: "persistentvolumeclaim",
            name: claim.to_string(),
        })?;
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let pv_name = pvc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .filter(|_| bound)
        .ok_or_else(|| VolumeError::Unbound(claim.to_string()))?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs
        .get_opt(&pv_name)
        .await?
        .ok_or_else(|| VolumeError::NotFound {
            kind: "persistentvolume",
            name: pv_name.clone(),
        })?;
    let spec = pv.spec.unwrap_or_default();
    let path = spec
        .host_path
        .map(|h| h.path)
        .or(spec.local.map(|l| l.path))
        .ok_or_else(|| VolumeError::Unsupported(pv_name.clone()))?;
    let path = PathBuf::from(path);
    std::fs::create_dir_all(&path)
        .map_err(|e| VolumeError::Io(format!("create {}", path.display()), e))?;
    Ok(path)
}

/// The bind mounts of a container, from its `volumeMounts`.
/// `env` expands `subPathExpr`.
pub fn container_mounts(
    container: &Container,
    volumes: &BTreeMap<String, PreparedVolume>,
    env: &[(String, String)],
) -> Result<Vec<Mount>, VolumeError> {
    let env: BTreeMap<String, String> = env.iter().cloned().collect();
    let mut mounts = Vec::new();
    for vm in container.volume_mounts.iter().flatten() {
        let vol = volumes
            .get(&vm.name)
            .ok_or_else(|| VolumeError::NoSuchVolume(vm.name.clone()))?;
        let sub = match (&vm.sub_path, &vm.sub_path_expr) {
            (Some(p), _) if !p.is_empty() => Some(p.clone()),
            (_, Some(e)) if !e.is_empty() => {
                Some(super::expand::expand(e, |n| env.get(n).cloned()))
            }
            _ => None,
        };
        let source = match sub {
            None => vol.path.clone(),
            Some(sub) => {
                if sub.split('/').any(|c| c == "..") || sub.starts_with('/') {
                    return Err(VolumeError::Unsupported(format!(
                        "{}: subPath {sub:?}",
                        vm.name
                    )));
                }
                let p = vol.path.join(&sub);
                if !vol.projected && std::fs::symlink_metadata(&p).is_err() {
                    // The kubelet creates a missing subPath as a directory.
                    std::fs::create_dir_all(&p)
                        .map_err(|e| VolumeError::Io(format!("create {}", p.display()), e))?;
                }
                // Bind the resolved target (projected files are symlinks into `..data`).
                std::fs::canonicalize(&p)
                    .map_err(|e| VolumeError::Io(format!("resolve {}", p.display()), e))?
            }
        };
        mounts.push(Mount {
            source,
            target: PathBuf::from(&vm.mount_path),
            read_only: vm.read_only == Some(true) || vol.read_only,
        });
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_items_modes_and_optional() {
        let data: BTreeMap<String, Vec<u8>> = [
            ("a".to_string(), b"1".to_vec()),
            ("b".to_string(), b"2".to_vec()),
        ]
        .into();
        let mut out = BTreeMap::new();
        project_keys(
            "configmap",
            "cm",
            Some(data.clone()),
            None,
            false,
            Some(0o400),
            &mut out,
        )
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out["a"].mode, 0o400);
        let items = vec![KeyToPath {
            key: "b".into(),
            path: "dir/b.txt".into(),
            mode: Some(0o600),
            user: None,
        }];
        let mut out = BTreeMap::new();
        project_keys(
            "configmap",
            "cm",
            Some(data.clone()),
            Some(&items),
            false,
            None,
            &mut out,
        )
        .unwrap();
        assert_eq!(out.keys().collect::<Vec<_>>(), vec!["dir/b.txt"]);
        assert_eq!(out["dir/b.txt"].mode, 0o600);
        let missing = vec![KeyToPath {
            key: "zz".into(),
            path: "zz".into(),
            mode: None,
            user: None,
        }];
        assert!(
            project_keys(
                "configmap",
                "cm",
                Some(data),
                Some(&missing),
                false,
                None,
                &mut BTreeMap::new()
            )
            .is_err()
        );
        assert!(
            project_keys("secret", "s", None, None, false, None, &mut BTreeMap::new()).is_err()
        );
        let mut out = BTreeMap::new();
        project_keys("secret", "s", None, None, true, None, &mut out).unwrap();
        assert!(out.is_empty());
    }
}
