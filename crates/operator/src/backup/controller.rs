//! The ValkeyBackup controller: finds each shard's source in the live topology, streams its
//! snapshot to the store (never held whole in memory), then writes the manifest. A failed
//! attempt is retried with back-off; the status says how far it got and why it stopped.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use object_store::ObjectStore;
use object_store::path::Path;
use tracing::{debug, info, warn};
use valkey_api::ValkeyCluster;
use valkey_api::backup::{
    BackupDeletionPolicy, BackupPhase, FILES_FINALIZER, ValkeyBackup, ValkeyBackupStatus, reasons,
};
use valkey_api::labels::BACKUP_FIELD_MANAGER;
use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands::wait_replica_offset;

use super::manifest::{self, Manifest, ShardEntry};
use super::plan::{self, ShardSource};
use super::progress::{self, MAX_ATTEMPTS};
use super::reach::{self, Unreached};
use super::store::{self, SetupError};
use super::upload::{self, UploadError};
use crate::context::Shared;
use crate::metrics::{FailureReason, Metrics};
use crate::scope::Scope;

/// Name of the controller in metrics.
pub const BACKUP_CONTROLLER: &str = "valkeybackup";

/// Wait between looks at a cluster that cannot be backed up yet.
const WAIT_REQUEUE: Duration = Duration::from_secs(10);
/// Longest wait for a replica source to apply what its primary has.
const CATCH_UP_WAIT: Duration = Duration::from_secs(10);

/// Errors of a pass (API errors only; store and server failures are the backup's status).
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The object has no namespace.
    #[error("ValkeyBackup without a namespace")]
    NoNamespace,
}

impl FailureReason for BackupError {
    const REASONS: &'static [&'static str] = &["api", "no_namespace"];

    fn reason(&self) -> &'static str {
        match self {
            BackupError::Kube(_) => "api",
            BackupError::NoNamespace => "no_namespace",
        }
    }
}

/// Runs the ValkeyBackup controller over `scope` until `shutdown` completes.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    scope: Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    metrics.declare_failures_of::<BackupError>(BACKUP_CONTROLLER);
    Controller::new(
        scope.api::<ValkeyBackup>(&client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown)
    .run(
        reconcile,
        error_policy,
        Arc::new(Shared::new(client, metrics)),
    )
    .for_each(|res| async move {
        if let Err(e) = res {
            debug!(error = %e, "ValkeyBackup reconcile failed");
        }
    })
    .await;
    info!("ValkeyBackup controller stopped");
}

fn error_policy(b: Arc<ValkeyBackup>, err: &BackupError, ctx: Arc<Shared>) -> Action {
    ctx.metrics.failed_with(BACKUP_CONTROLLER, err);
    warn!(backup = %b.name_any(), error = %err, "ValkeyBackup reconcile failed; retrying");
    Action::requeue(Duration::from_secs(10))
}

async fn reconcile(b: Arc<ValkeyBackup>, ctx: Arc<Shared>) -> Result<Action, BackupError> {
    let metrics = ctx.metrics.clone();
    metrics.reconcile(BACKUP_CONTROLLER, pass(&b, &ctx)).await
}

/// Writes `new` (server-side apply, own field manager) and publishes the transition's event.
async fn record(
    ctx: &Shared,
    api: &Api<ValkeyBackup>,
    b: &ValkeyBackup,
    old: &ValkeyBackupStatus,
    new: &ValkeyBackupStatus,
) -> Result<(), BackupError> {
    if old == new {
        return Ok(());
    }
    let body = serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1",
        "kind": "ValkeyBackup",
        "status": new,
    });
    let pp = PatchParams::apply(BACKUP_FIELD_MANAGER).force();
    api.patch_status(&b.name_any(), &pp, &Patch::Apply(&body))
        .await?;
    if let Some(e) = progress::event(old, new) {
        ctx.publish(&b.object_ref(&()), &[e]).await;
    }
    Ok(())
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Why an attempt cannot start.
enum NotStarted {
    /// Waiting for the cluster (`WaitingForCluster`).
    Wait(String),
    /// The store's settings or credentials.
    Setup(SetupError),
}

/// What an attempt needs: the store, the sources and how to reach them.
struct Prepared {
    store: Arc<dyn ObjectStore>,
    sources: Vec<ShardSource>,
    snapshot_config: ClientConfig,
    /// The operator's connections (a replica's catch-up is read with them).
    pool: NodePool,
}

async fn prepare(b: &ValkeyBackup, client: &Client, ns: &str) -> Result<Prepared, NotYetOr> {
    let cluster = &b.spec.cluster;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let store_secret = match store::credentials_secret(&b.spec.store) {
        Some(n) => secrets.get_opt(n).await?,
        None => None,
    };
    let store = store::build(&b.spec.store, store_secret.as_ref())
        .map_err(|e| NotYetOr::Not(NotStarted::Setup(e)))?;
    let Some(vc) = Api::<ValkeyCluster>::namespaced(client.clone(), ns)
        .get_opt(cluster)
        .await?
    else {
        return Err(NotYetOr::Not(NotStarted::Wait(format!(
            "ValkeyCluster {cluster} does not exist in namespace {ns}"
        ))));
    };
    if let Some(op) = vc.status.as_ref().and_then(|s| s.operation.as_ref()) {
        return Err(NotYetOr::Not(NotStarted::Wait(format!(
            "ValkeyCluster {cluster} is busy ({}): the backup starts once it is done, so that \
             no slot's keys are split between two shards",
            op.kind
        ))));
    }
    let reached = match reach::reach(client, &vc, Duration::from_secs(5)).await {
        Ok(r) => r,
        Err(Unreached::Api(e)) => return Err(e.into()),
        Err(Unreached::NotYet(m)) => return Err(NotYetOr::Not(NotStarted::Wait(m))),
    };
    let sources = plan::sources(&reached.topology)
        .map_err(|e| NotYetOr::Not(NotStarted::Wait(format!("ValkeyCluster {cluster}: {e}"))))?;
    Ok(Prepared {
        store,
        sources,
        snapshot_config: reached.replication,
        pool: reached.pool,
    })
}

/// An API error, or a reason not to start.
enum NotYetOr {
    Api(kube::Error),
    Not(NotStarted),
}

impl From<kube::Error> for NotYetOr {
    fn from(e: kube::Error) -> Self {
        NotYetOr::Api(e)
    }
}

/// Sets (`add`) or removes the files finalizer, keeping any other.
async fn set_finalizer(
    api: &Api<ValkeyBackup>,
    b: &ValkeyBackup,
    add: bool,
) -> Result<Action, BackupError> {
    let mut list: Vec<String> = b.finalizers().to_vec();
    list.retain(|f| f != FILES_FINALIZER);
    if add {
        list.push(FILES_FINALIZER.to_owned());
    }
    // The resourceVersion makes this a compare-and-swap with other finalizer writers.
    let patch = serde_json::json!({"metadata": {
        "finalizers": list, "resourceVersion": b.resource_version()}});
    match api
        .patch(
            &b.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Action::requeue(Duration::from_secs(1))),
        Err(e) => Err(e.into()),
    }
}

/// A backup being deleted with `deletionPolicy: Delete`: its files go first, then the
/// finalizer. A store that refuses keeps the object, with the store's words in the status.
async fn delete_files(
    ctx: &Shared,
    api: &Api<ValkeyBackup>,
    b: &ValkeyBackup,
    ns: &str,
) -> Result<Action, BackupError> {
    let path = b.spec.store.backup_path(ns, &b.spec.cluster, &b.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = match store::credentials_secret(&b.spec.store) {
        Some(n) => secrets.get_opt(n).await?,
        None => None,
    };
    let deleted = match store::build(&b.spec.store, secret.as_ref()) {
        Ok(s) => store::delete_all(&s, &path).await,
        Err(e) => Err(e.to_string()),
    };
    match deleted {
        Ok(n) => {
            info!(backup = %b.name_any(), objects = n, %path, "backup files deleted");
            set_finalizer(api, b, false).await
        }
        Err(e) => {
            let old = b.status.clone().unwrap_or_default();
            let new = progress::with_phase(
                &old,
                old.phase.unwrap_or(BackupPhase::Pending),
                reasons::STORE_ERROR,
                format!(
                    "deleting the backup's files from {} (deletionPolicy Delete) failed, \
                     retrying in 30 s: {e}",
                    b.spec.store.location(&path)
                ),
                b.metadata.generation,
                &now(),
            );
            record(ctx, api, b, &old, &new).await?;
            Ok(Action::requeue(Duration::from_secs(30)))
        }
    }
}

async fn pass(cached: &ValkeyBackup, ctx: &Shared) -> Result<Action, BackupError> {
    let ns = cached.namespace().ok_or(BackupError::NoNamespace)?;
    let api: Api<ValkeyBackup> = Api::namespaced(ctx.client.clone(), &ns);
    if cached
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_some_and(BackupPhase::is_final)
        && cached.meta().deletion_timestamp.is_none()
    {
        return Ok(Action::await_change());
    }
    // The cache can be a write behind this controller's own last status write: a backup that
    // just completed would be taken again. Read the object itself.
    let Some(b) = api.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let b = &b;
    let has_finalizer = b.finalizers().iter().any(|f| f == FILES_FINALIZER);
    if b.meta().deletion_timestamp.is_some() {
        return if has_finalizer {
            delete_files(ctx, &api, b, &ns).await
        } else {
            Ok(Action::await_change())
        };
    }
    let wants_finalizer = b.spec.deletion_policy == BackupDeletionPolicy::Delete;
    if wants_finalizer != has_finalizer {
        return set_finalizer(&api, b, wants_finalizer).await;
    }
    let old = b.status.clone().unwrap_or_default();
    if old.phase.is_some_and(BackupPhase::is_final) {
        return Ok(Action::await_change());
    }
    if let Some(wait) = progress::wait_before_attempt(&old, Timestamp::now()) {
        return Ok(Action::requeue(wait));
    }
    let generation = b.metadata.generation;
    let path = b
        .spec
        .store
        .backup_path(&ns, &b.spec.cluster, &b.name_any());
    let location = b.spec.store.location(&path);
    let pending = |reason, message: String| ValkeyBackupStatus {
        location: Some(location.clone()),
        retry_at: None,
        ..progress::with_phase(
            &old,
            BackupPhase::Pending,
            reason,
            message,
            generation,
            &now(),
        )
    };
    let prepared = match prepare(b, &ctx.client, &ns).await {
        Ok(p) => p,
        Err(NotYetOr::Api(e)) => return Err(e.into()),
        Err(NotYetOr::Not(NotStarted::Wait(message))) => {
            let new = pending(reasons::WAITING_FOR_CLUSTER, message);
            record(ctx, &api, b, &old, &new).await?;
            return Ok(Action::requeue(WAIT_REQUEUE));
        }
        Err(NotYetOr::Not(NotStarted::Setup(e))) => {
            let reason = match e {
                SetupError::CredentialsMissing(_) => reasons::CREDENTIALS_MISSING,
                SetupError::Invalid(_) => reasons::STORE_ERROR,
            };
            let new = pending(reason, e.to_string());
            record(ctx, &api, b, &old, &new).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    attempt(ctx, &api, b, &old, prepared, &path, &location).await
}

/// Before a replica's snapshot: waits (at most [`CATCH_UP_WAIT`]) until the replica has
/// applied its primary's stream up to the primary's offset now, so the file holds every write
/// the primary had applied when the shard's turn began; returns that offset. A replica still
/// behind is logged (the manifest shows it: its `offset` is lower); the snapshot goes ahead.
async fn catch_up(pool: &NodePool, source: &ShardSource) -> Option<u64> {
    if !source.from_replica {
        return None;
    }
    let (primary, replica) = (source.primary_addr.to_string(), source.addr.to_string());
    match wait_replica_offset(pool, &primary, &replica, CATCH_UP_WAIT).await {
        Ok(c) => {
            if c.caught_up() {
                debug!(pod = %source.pod, waited_ms = c.waited.as_millis() as u64, "replica caught up");
            } else {
                warn!(pod = %source.pod, lag = ?c.lag(), "replica still behind its primary; taking its snapshot");
            }
            u64::try_from(c.target).ok()
        }
        Err(e) => {
            warn!(pod = %source.pod, error = %e, "primary offset not read; taking the replica's snapshot");
            None
        }
    }
}

/// One attempt: every shard, then the manifest.
async fn attempt(
    ctx: &Shared,
    api: &Api<ValkeyBackup>,
    b: &ValkeyBackup,
    old: &ValkeyBackupStatus,
    prepared: Prepared,
    path: &str,
    location: &str,
) -> Result<Action, BackupError> {
    let generation = b.metadata.generation;
    let total = prepared.sources.len();
    let attempts = old.attempts.unwrap_or(0) + 1;
    let started = now();
    let clock = Instant::now();
    let mut status = ValkeyBackupStatus {
        location: Some(location.to_owned()),
        started_at: Some(started.clone()),
        completed_at: None,
        shards: Some(total as i32),
        shards_done: Some(0),
        progress: Some(progress::progress_text(0, total)),
        bytes: Some(0),
        keys: None,
        duration_seconds: None,
        attempts: Some(attempts),
        retry_at: None,
        ..progress::with_phase(
            old,
            BackupPhase::Running,
            reasons::RUNNING,
            format!("attempt {attempts}: streaming {total} shards to {location}"),
            generation,
            &started,
        )
    };
    record(ctx, api, b, old, &status).await?;
    let dir = Path::from(path);
    let mut entries = Vec::with_capacity(total);
    let mut failure = None;
    for (i, source) in prepared.sources.iter().enumerate() {
        let file = manifest::shard_file(i);
        let shard_started = now();
        let primary_offset = catch_up(&prepared.pool, source).await;
        match upload::shard(
            prepared.store.clone(),
            &dir.clone().join(file.as_str()),
            source,
            &prepared.snapshot_config,
        )
        .await
        {
            Ok(upload::Stored { info, summary }) => {
                info!(
                    backup = %b.name_any(), shard = i, pod = %source.pod, bytes = info.bytes,
                    keys = summary.keys, "shard snapshot stored"
                );
                entries.push(ShardEntry {
                    file,
                    slots: source.slots.iter().map(manifest::range_text).collect(),
                    bytes: info.bytes,
                    sha256: info.sha256,
                    rdb_checksum: info.rdb_checksum,
                    rdb_version: info.rdb_version,
                    keys: Some(summary.keys),
                    valkey_version: info.server_version,
                    source_pod: source.pod.clone(),
                    source_node_id: source.node_id.clone(),
                    from_replica: source.from_replica,
                    replid: info.replid,
                    offset: info.offset,
                    primary_offset,
                    started_at: shard_started.0.to_string(),
                    completed_at: Timestamp::now().to_string(),
                });
                let next = ValkeyBackupStatus {
                    shards_done: Some(entries.len() as i32),
                    progress: Some(progress::progress_text(entries.len(), total)),
                    bytes: Some(entries.iter().map(|e| e.bytes as i64).sum()),
                    ..status.clone()
                };
                record(ctx, api, b, &status, &next).await?;
                status = next;
            }
            Err(e) => {
                failure = Some((i, source, e));
                break;
            }
        }
    }
    let outcome = match failure {
        Some((i, source, e)) => Err((
            match &e {
                UploadError::Snapshot(_) | UploadError::Unsplittable(_) => reasons::SNAPSHOT_ERROR,
                UploadError::Store(_) => reasons::STORE_ERROR,
            },
            format!(
                "shard {i} (slots {}, from pod {}): {e}",
                source
                    .slots
                    .iter()
                    .map(manifest::range_text)
                    .collect::<Vec<_>>()
                    .join(","),
                source.pod
            ),
        )),
        None => {
            let m = Manifest {
                format: manifest::FORMAT,
                cluster: format!("{}/{}", b.namespace().unwrap_or_default(), b.spec.cluster),
                backup: b.name_any(),
                backup_uid: b.uid().unwrap_or_default(),
                valkey_version: entries
                    .first()
                    .map(|e| e.valkey_version.clone())
                    .unwrap_or_default(),
                rdb_version: entries.iter().map(|e| e.rdb_version).max().unwrap_or(0),
                started_at: started.0.to_string(),
                completed_at: Timestamp::now().to_string(),
                shards: entries,
            };
            upload::manifest(&prepared.store, &dir, &m)
                .await
                .map(|()| m)
                .map_err(|e| {
                    (
                        reasons::STORE_ERROR,
                        format!("manifest: {}", upload::with_causes(&e)),
                    )
                })
        }
    };
    let ended = now();
    let new = match outcome {
        Ok(m) => ValkeyBackupStatus {
            completed_at: Some(ended.clone()),
            keys: m.keys().map(|k| k as i64),
            duration_seconds: Some((clock.elapsed().as_millis() as f64 / 1000.0).max(0.001)),
            valkey_version: Some(m.valkey_version.clone()),
            ..progress::with_phase(
                &status,
                BackupPhase::Completed,
                reasons::COMPLETED,
                format!(
                    "{} shards, {} bytes, {} keys in {:.1} s to {location}",
                    m.shards.len(),
                    m.bytes(),
                    m.keys()
                        .map_or("an unknown number of".into(), |k| k.to_string()),
                    clock.elapsed().as_secs_f64()
                ),
                generation,
                &ended,
            )
        },
        Err((reason, message)) if attempts >= MAX_ATTEMPTS => ValkeyBackupStatus {
            completed_at: Some(ended.clone()),
            ..progress::with_phase(
                &status,
                BackupPhase::Failed,
                reasons::FAILED,
                format!(
                    "attempt {attempts} of {MAX_ATTEMPTS} failed, giving up ({reason}): {message}"
                ),
                generation,
                &ended,
            )
        },
        Err((reason, message)) => {
            let delay = progress::retry_delay(attempts);
            let retry_at = ended
                .0
                .checked_add(SignedDuration::from_secs(delay.as_secs() as i64))
                .unwrap_or(ended.0);
            ValkeyBackupStatus {
                retry_at: Some(Time(retry_at)),
                ..progress::with_phase(
                    &status,
                    BackupPhase::Pending,
                    reason,
                    format!(
                        "attempt {attempts} of {MAX_ATTEMPTS} failed, retrying in {} s: {message}",
                        delay.as_secs()
                    ),
                    generation,
                    &ended,
                )
            }
        }
    };
    record(ctx, api, b, &status, &new).await?;
    Ok(match new.phase {
        Some(BackupPhase::Pending) => Action::requeue(progress::retry_delay(attempts)),
        _ => Action::await_change(),
    })
}
