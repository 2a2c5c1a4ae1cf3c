//! Restoring `spec.bootstrap.backup` into a new cluster of any shard count: once the cluster
//! has formed, the manifest is read and checked, every file is read once to check its size
//! and SHA-256 (nothing is written before all match), then each file is streamed again, split
//! into keys, and every key is `RESTORE`d (with its absolute expiry) on the primary that owns
//! its slot. Progress is `status.restore`; the cluster reports Ready once the counts match the
//! manifest. A failed attempt is retried with back-off; a refused backup stays refused.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
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
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use sha2::{Digest, Sha256};
use tracing::{debug, info, warn};
use valkey_api::ValkeyCluster;
use valkey_api::backup::{BackupPhase, ValkeyBackup};
use valkey_api::backup_store::BackupStore;
use valkey_api::bootstrap::{RestorePhase, RestoreStatus};
use valkey_ops::SlotSet;
use valkey_ops::client::NodePool;
use valkey_ops::rdb::{Item, RecordReader};

use super::manifest::{MANIFEST_FILE, Manifest};
use super::progress::{MAX_ATTEMPTS, retry_delay};
use super::reach::{self, Unreached};
use super::{plan, restore_check, store, upload};
use crate::context::Shared;
use crate::metrics::Metrics;
use crate::scope::Scope;
use crate::status::EventSpec;

/// Name of the controller in metrics.
pub const RESTORE_CONTROLLER: &str = "restore";

/// Field manager of `status.restore`.
const FIELD_MANAGER: &str = "valkey-operator/restore";

/// Keys sent to one primary in one pipeline.
const BATCH: usize = 512;

/// Runs the restore controller over `scope` until `shutdown` completes.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    scope: Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    Controller::new(
        scope.api::<ValkeyCluster>(&client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(shutdown)
    .run(
        reconcile,
        |vc, e: &kube::Error, _| {
            warn!(cluster = %vc.name_any(), error = %e, "restore pass failed; retrying");
            Action::requeue(Duration::from_secs(10))
        },
        Arc::new(Shared::new(client, metrics)),
    )
    .for_each(|res| async move {
        if let Err(e) = res {
            debug!(error = %e, "restore pass failed");
        }
    })
    .await;
    info!("restore controller stopped");
}

async fn reconcile(vc: Arc<ValkeyCluster>, ctx: Arc<Shared>) -> Result<Action, kube::Error> {
    if vc.spec.bootstrap.is_none() || vc.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let metrics = ctx.metrics.clone();
    metrics.reconcile(RESTORE_CONTROLLER, pass(&vc, &ctx)).await
}

/// How an attempt ended short of completion.
enum Stop {
    /// Not yet: waiting for something (the cluster, the backup, the store); retried soon.
    Wait(String),
    /// A failure worth retrying (the store, a server); counts as an attempt.
    Retry(String),
    /// Refused: the backup cannot be restored into this cluster as it is.
    Refuse(String),
    /// The API server.
    Api(kube::Error),
}

impl From<kube::Error> for Stop {
    fn from(e: kube::Error) -> Self {
        Stop::Api(e)
    }
}

/// Writes `status.restore` (merge patch; the cluster controller never writes it back) and
/// the event of a phase change.
async fn record(
    ctx: &Shared,
    vc: &ValkeyCluster,
    old: Option<&RestoreStatus>,
    new: &RestoreStatus,
) -> Result<(), kube::Error> {
    if old == Some(new) {
        return Ok(());
    }
    let api: Api<ValkeyCluster> =
        Api::namespaced(ctx.client.clone(), &vc.namespace().unwrap_or_default());
    let patch = serde_json::json!({"status": {"restore": new}});
    api.patch_status(
        &vc.name_any(),
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Merge(&patch),
    )
    .await?;
    if old.map(|o| o.phase) != Some(new.phase) {
        let note = new.message.clone().unwrap_or_default();
        let event = match new.phase {
            RestorePhase::Completed => Some(EventSpec::normal("RestoreCompleted", "Restore", note)),
            RestorePhase::Failed => Some(EventSpec::warning("RestoreFailed", "Restore", note)),
            RestorePhase::Restoring => Some(EventSpec::normal("RestoreStarted", "Restore", note)),
            RestorePhase::Pending | RestorePhase::Verifying => None,
        };
        if let Some(e) = event {
            ctx.publish(&vc.object_ref(&()), &[e]).await;
        }
    }
    Ok(())
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Writes `status.restore` as it changes, remembering what was written last.
struct Writer<'a> {
    ctx: &'a Shared,
    vc: &'a ValkeyCluster,
    written: Option<RestoreStatus>,
}

impl Writer<'_> {
    async fn write(&mut self, new: &RestoreStatus) -> Result<(), kube::Error> {
        record(self.ctx, self.vc, self.written.as_ref(), new).await?;
        self.written = Some(new.clone());
        Ok(())
    }
}

async fn pass(cached: &ValkeyCluster, ctx: &Shared) -> Result<Action, kube::Error> {
    // The cache can be a write behind this controller's own last status write: a restore
    // that just completed would run again. Read the object itself.
    let api: Api<ValkeyCluster> =
        Api::namespaced(ctx.client.clone(), &cached.namespace().unwrap_or_default());
    let Some(vc) = api.get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let vc = &vc;
    let old = vc.status.as_ref().and_then(|s| s.restore.clone());
    if old.as_ref().is_some_and(|r| r.phase.is_final()) {
        return Ok(Action::await_change());
    }
    if let Some(at) = old.as_ref().and_then(|r| r.retry_at.as_ref()) {
        let left = Timestamp::now().duration_until(at.0);
        if left > SignedDuration::ZERO {
            return Ok(Action::requeue(Duration::from_millis(
                left.as_millis().max(1) as u64,
            )));
        }
    }
    let mut status = old.clone().unwrap_or_default();
    status.retry_at = None;
    let mut writer = Writer {
        ctx,
        vc,
        written: old.clone(),
    };
    let outcome = attempt(vc, ctx, &mut status, &mut writer).await;
    let base = status.clone();
    let outcome = outcome.map_err(|stop| match stop {
        Stop::Retry(m) => Stop::Retry(crate::text::clamp(&m, 2048)),
        Stop::Refuse(m) => Stop::Refuse(crate::text::clamp(&m, 2048)),
        Stop::Wait(m) => Stop::Wait(crate::text::clamp(&m, 2048)),
        api => api,
    });
    let (new, after) = match outcome {
        Ok(()) => (base, Action::await_change()),
        Err(Stop::Api(e)) => return Err(e),
        Err(Stop::Wait(message)) => (
            RestoreStatus {
                phase: RestorePhase::Pending,
                message: Some(message),
                ..base
            },
            Action::requeue(Duration::from_secs(5)),
        ),
        Err(Stop::Refuse(message)) => (
            RestoreStatus {
                phase: RestorePhase::Failed,
                message: Some(message),
                completed_at: Some(now()),
                ..base
            },
            Action::await_change(),
        ),
        Err(Stop::Retry(message)) if base.attempts >= MAX_ATTEMPTS => (
            RestoreStatus {
                phase: RestorePhase::Failed,
                message: Some(format!(
                    "attempt {} of {MAX_ATTEMPTS} failed, giving up: {message}",
                    base.attempts
                )),
                completed_at: Some(now()),
                ..base
            },
            Action::await_change(),
        ),
        Err(Stop::Retry(message)) => {
            let delay = retry_delay(base.attempts);
            let at = Timestamp::now()
                .checked_add(SignedDuration::from_secs(delay.as_secs() as i64))
                .unwrap_or_else(|_| Timestamp::now());
            (
                RestoreStatus {
                    phase: RestorePhase::Pending,
                    message: Some(format!(
                        "attempt {} of {MAX_ATTEMPTS} failed, retrying in {} s: {message}",
                        base.attempts,
                        delay.as_secs()
                    )),
                    retry_at: Some(Time(at)),
                    ..base
                },
                Action::requeue(delay),
            )
        }
    };
    writer.write(&new).await?;
    Ok(after)
}

/// The store and directory of the backup to restore.
async fn source(
    vc: &ValkeyCluster,
    client: &Client,
    ns: &str,
) -> Result<(BackupStore, String), Stop> {
    let Some(bootstrap) = vc.spec.bootstrap.as_ref() else {
        return Err(Stop::Wait("spec.bootstrap is not set".into()));
    };
    let b = &bootstrap.backup;
    if let (Some(store), Some(path)) = (&b.store, &b.path) {
        return Ok((store.clone(), path.trim_matches('/').to_owned()));
    }
    let name = b.name.as_deref().unwrap_or_default();
    let Some(backup) = Api::<ValkeyBackup>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?
    else {
        return Err(Stop::Wait(format!(
            "ValkeyBackup {name} does not exist in namespace {ns}"
        )));
    };
    let phase = backup.status.as_ref().and_then(|s| s.phase);
    if phase != Some(BackupPhase::Completed) {
        return Err(Stop::Wait(format!(
            "ValkeyBackup {name} is not completed (phase {phase:?})"
        )));
    }
    let path = backup
        .spec
        .store
        .backup_path(ns, &backup.spec.cluster, &backup.name_any());
    Ok((backup.spec.store, path))
}

/// One attempt: everything up to `Completed`, writing progress into `status` as it goes.
async fn attempt(
    vc: &ValkeyCluster,
    ctx: &Shared,
    status: &mut RestoreStatus,
    writer: &mut Writer<'_>,
) -> Result<(), Stop> {
    let ns = vc.namespace().unwrap_or_default();
    let client = &ctx.client;
    let (store_spec, dir) = source(vc, client, &ns).await?;
    status.location = Some(store_spec.location(&dir));
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let store_secret = match store::credentials_secret(&store_spec) {
        Some(n) => secrets.get_opt(n).await?,
        None => None,
    };
    let store =
        store::build(&store_spec, store_secret.as_ref()).map_err(|e| Stop::Wait(e.to_string()))?;

    // The cluster: formed, every slot with a reachable primary.
    let reached = match reach::reach(client, vc, Duration::from_secs(30)).await {
        Ok(r) => r,
        Err(Unreached::Api(e)) => return Err(Stop::Api(e)),
        Err(Unreached::NotYet(m)) => return Err(Stop::Wait(m)),
    };
    let (topology, pool) = (reached.topology, reached.pool);
    plan::sources(&topology)
        .map_err(|e| Stop::Wait(format!("waiting for the cluster to form: {e}")))?;
    if let Some(m) = topology
        .reachable()
        .find(|m| !m.view.as_ref().is_some_and(|v| v.cluster_ok))
    {
        return Err(Stop::Wait(format!(
            "waiting for the cluster to form: {} does not report cluster_state:ok yet",
            m.pod
        )));
    }
    let version = topology
        .members()
        .iter()
        .find_map(|m| m.view.as_ref()?.version)
        .ok_or_else(|| Stop::Wait("waiting for a server's version".into()))?;

    // The manifest, checked against this cluster.
    let manifest =
        read_manifest(&store, &dir, status.location.as_deref().unwrap_or_default()).await?;
    if let Some(why) = restore_check::refuse(&manifest, version) {
        return Err(Stop::Refuse(format!("{why}; nothing was restored")));
    }
    status.files = manifest.shards.len() as i32;
    let attempt_started = Instant::now();
    if status.started_at.is_none() {
        status.started_at = Some(now());
    }
    status.attempts += 1;

    // Every file checked before anything is written.
    if status.files_done == 0 {
        status.phase = RestorePhase::Verifying;
        status.message = Some(format!(
            "checking {} files against the manifest (attempt {})",
            status.files, status.attempts
        ));
        writer.write(status).await?;
        for s in &manifest.shards {
            verify(&store, &dir, s).await?;
        }
    }
    status.phase = RestorePhase::Restoring;
    let started = Instant::now();
    let owners = restore_check::owners(&topology);
    let primaries: Vec<SocketAddr> = {
        let mut v: Vec<SocketAddr> = owners.iter().flatten().copied().collect();
        v.sort();
        v.dedup();
        v
    };
    let from = usize::try_from(status.files_done).unwrap_or(0);
    for (i, s) in manifest.shards.iter().enumerate().skip(from) {
        status.message = Some(format!(
            "restoring file {} of {} ({}, {} keys)",
            i + 1,
            status.files,
            s.file,
            s.keys.map_or("?".into(), |k| k.to_string())
        ));
        writer.write(status).await?;
        let got = restore_file(&store, &dir, &s.file, &owners, &primaries, &pool).await?;
        if let Some(want) = s.keys
            && got.keys + got.expired + got.partial != want
        {
            return Err(Stop::Refuse(format!(
                "{}: {} keys restored, {} already expired and {} of slots being imported, but \
                 the manifest lists {want}",
                s.file, got.keys, got.expired, got.partial
            )));
        }
        status.files_done = i as i32 + 1;
        status.keys += got.keys as i64;
        status.expired += got.expired as i64;
        status.bytes += got.bytes as i64;
    }
    // The cluster holds what was restored (unless clients wrote meanwhile, or keys expired).
    let mut total: i64 = 0;
    for p in &primaries {
        let n: i64 = pool
            .query(&p.to_string(), &redis::cmd("DBSIZE"))
            .await
            .map_err(|e| Stop::Retry(format!("DBSIZE on {p}: {e}")))?;
        total += n;
    }
    info!(cluster = %vc.name_any(), keys = status.keys, expired = status.expired, dbsize = total,
          secs = started.elapsed().as_secs_f64(), "restore completed");
    status.phase = RestorePhase::Completed;
    status.completed_at = Some(now());
    status.duration_seconds =
        Some((attempt_started.elapsed().as_millis() as f64 / 1000.0).max(0.001));
    status.message = Some(format!(
        "restored {} keys from {} files ({} bytes; {} already expired) in {:.1} s; the \
         primaries hold {total} keys",
        status.keys,
        status.files,
        status.bytes,
        status.expired,
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

async fn read_manifest(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    location: &str,
) -> Result<Manifest, Stop> {
    let path = Path::from(dir).join(MANIFEST_FILE);
    let body = match store.get(&path).await {
        Ok(r) => r.bytes().await.map_err(|e| {
            Stop::Retry(format!(
                "reading {MANIFEST_FILE}: {}",
                upload::with_causes(&e)
            ))
        })?,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Stop::Refuse(format!(
                "no {MANIFEST_FILE} at {location}: the backup is incomplete (its manifest is \
                 written last) or the path is wrong; nothing was restored"
            )));
        }
        Err(e) => {
            return Err(Stop::Retry(format!(
                "reading {MANIFEST_FILE}: {}",
                upload::with_causes(&e)
            )));
        }
    };
    serde_json::from_slice(&body).map_err(|e| {
        Stop::Refuse(format!(
            "{MANIFEST_FILE} at {location} is not a manifest: {e}"
        ))
    })
}

/// Reads a file once: its size and SHA-256 must be the manifest's.
async fn verify(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    s: &super::manifest::ShardEntry,
) -> Result<(), Stop> {
    let path = Path::from(dir).join(s.file.as_str());
    let mut stream = match store.get(&path).await {
        Ok(r) => r.into_stream(),
        Err(object_store::Error::NotFound { .. }) => {
            return Err(Stop::Refuse(format!(
                "{} is missing from the backup; nothing was restored",
                s.file
            )));
        }
        Err(e) => {
            return Err(Stop::Retry(format!(
                "{}: {}",
                s.file,
                upload::with_causes(&e)
            )));
        }
    };
    let mut sha = Sha256::new();
    let mut len = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| Stop::Retry(format!("{}: {}", s.file, upload::with_causes(&e))))?;
        len += chunk.len() as u64;
        sha.update(&chunk);
    }
    let got = hex::encode(sha.finalize());
    if len != s.bytes || got != s.sha256 {
        return Err(Stop::Refuse(format!(
            "{}: {len} bytes with SHA-256 {got}, but the manifest lists {} bytes with SHA-256 \
             {}: the file was changed or is incomplete; nothing was restored",
            s.file, s.bytes, s.sha256
        )));
    }
    Ok(())
}

/// What one file gave.
struct Restored {
    /// Keys restored.
    keys: u64,
    /// Keys whose expiry had passed (not restored).
    expired: u64,
    /// Keys of slots the file's node was still importing (its owner's file has them).
    partial: u64,
    /// Bytes read.
    bytes: u64,
}

/// Streams one file into the cluster.
async fn restore_file(
    store: &Arc<dyn ObjectStore>,
    dir: &str,
    file: &str,
    owners: &[Option<SocketAddr>],
    primaries: &[SocketAddr],
    pool: &NodePool,
) -> Result<Restored, Stop> {
    let path = Path::from(dir).join(file);
    let mut stream = store
        .get(&path)
        .await
        .map_err(|e| Stop::Retry(format!("{file}: {}", upload::with_causes(&e))))?
        .into_stream();
    let mut reader = RecordReader::new();
    // Per primary and database: the pipeline being filled and its size.
    let mut batches: BTreeMap<(SocketAddr, u64), (redis::Pipeline, usize)> = BTreeMap::new();
    let (mut keys, mut expired, mut bytes) = (0u64, 0u64, 0u64);
    // Slots the file's node was importing when it saved: it held part of their keys only, and
    // the slots' owner's file holds them all.
    let mut importing = SlotSet::new();
    let mut partial = 0u64;
    let now_ms = Timestamp::now().as_millisecond();
    let mut done = false;
    while !done {
        match stream.next().await {
            Some(chunk) => {
                let chunk = chunk
                    .map_err(|e| Stop::Retry(format!("{file}: {}", upload::with_causes(&e))))?;
                bytes += chunk.len() as u64;
                reader
                    .feed(&chunk)
                    .map_err(|e| Stop::Refuse(format!("{file}: {e}; restore stopped")))?;
            }
            None => done = true,
        }
        while let Some(item) = reader.next_item() {
            match item {
                Item::Key(r) => {
                    let ttl = match r.expire_at_ms {
                        Some(at) if at <= now_ms => {
                            expired += 1;
                            continue;
                        }
                        Some(at) => at,
                        None => 0,
                    };
                    if importing.contains(r.slot()) {
                        partial += 1;
                        continue;
                    }
                    let Some(owner) = owners[usize::from(r.slot())] else {
                        return Err(Stop::Retry(format!("slot of a key in {file} has no owner")));
                    };
                    let (pipe, n) = batches
                        .entry((owner, r.db))
                        .or_insert_with(|| (redis::pipe(), 0));
                    pipe.cmd("RESTORE")
                        .arg(&r.key)
                        .arg(ttl)
                        .arg(&r.payload)
                        .arg("ABSTTL")
                        .arg("REPLACE")
                        .ignore();
                    *n += 1;
                    keys += 1;
                    if *n >= BATCH
                        && let Some((pipe, _)) = batches.remove(&(owner, r.db))
                    {
                        send(pool, owner, r.db, pipe, file).await?;
                    }
                }
                Item::SlotImport(import) => {
                    import
                        .ranges
                        .iter()
                        .for_each(|r| importing.insert_range(*r));
                }
                Item::Function(code) => {
                    for p in primaries {
                        pool.query::<redis::Value>(
                            &p.to_string(),
                            redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(&code),
                        )
                        .await
                        .map_err(|e| Stop::Retry(format!("{file}: FUNCTION LOAD on {p}: {e}")))?;
                    }
                }
            }
        }
    }
    reader
        .finish()
        .map_err(|e| Stop::Refuse(format!("{file}: {e}; restore stopped")))?;
    for ((owner, db), (pipe, _)) in std::mem::take(&mut batches) {
        send(pool, owner, db, pipe, file).await?;
    }
    Ok(Restored {
        keys,
        expired,
        partial,
        bytes,
    })
}

/// Sends one batch of `RESTORE`s; keys of a database other than 0 go there by `SELECT` (and
/// back: the restore's pool serves only this task, one pipeline at a time).
async fn send(
    pool: &NodePool,
    owner: SocketAddr,
    db: u64,
    restores: redis::Pipeline,
    file: &str,
) -> Result<(), Stop> {
    let pipe = if db == 0 {
        restores
    } else {
        let mut p = redis::pipe();
        p.cmd("SELECT").arg(db).ignore();
        for cmd in restores.cmd_iter() {
            p.add_command(cmd.clone()).ignore();
        }
        p.cmd("SELECT").arg(0).ignore();
        p
    };
    pool.pipeline::<()>(&owner.to_string(), &pipe)
        .await
        .map_err(|e| {
            Stop::Retry(format!(
                "{file}: RESTORE on {owner}: {}",
                first_failure(&e.to_string())
            ))
        })
}

/// A pipeline's error reduced to its first failure and how many there were (the client lists
/// every failed command).
fn first_failure(message: &str) -> String {
    const LIST: &str = "Pipeline failures: [";
    let Some(start) = message.find(LIST) else {
        return crate::text::clamp(message, 1024);
    };
    let list = &message[start + LIST.len()..];
    let count = list.matches("(Index ").count();
    let first = list
        .split("), (")
        .next()
        .unwrap_or_default()
        .trim_start_matches('(')
        .trim_end_matches(")]");
    crate::text::clamp(
        &format!("{}{first} ({count} commands failed)", &message[..start]),
        1024,
    )
}

#[cfg(test)]
mod tests {
    use super::first_failure;

    #[test]
    fn a_pipeline_error_is_reduced_to_its_first_failure() {
        let e = "10.0.0.1:6379 replied with error: Pipeline failures: [(Index 0, error: NoPerm: \
                 no permissions to run the 'restore' command), (Index 1, error: NoPerm: no \
                 permissions to run the 'restore' command)]";
        assert_eq!(
            first_failure(e),
            "10.0.0.1:6379 replied with error: Index 0, error: NoPerm: no permissions to run \
             the 'restore' command (2 commands failed)"
        );
        assert_eq!(first_failure("timed out"), "timed out");
    }
}
