//! Restoring `spec.bootstrap.backup` into a new cluster of any shard count: once the cluster
//! has formed, the manifest is read and checked, every file is read once to check its size
//! and SHA-256 (nothing is written before all match), then each file is streamed again, split
//! into keys, and every key is `RESTORE`d (with its absolute expiry) on the primary that owns
//! its slot. Progress is `status.restore`; the cluster reports Ready once the counts match the
//! manifest. A failed attempt is retried with back-off; a refused backup stays refused.

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
use tracing::{debug, info, warn};
use valkey_api::ValkeyCluster;
use valkey_api::backup::{BackupPhase, ValkeyBackup};
use valkey_api::backup_store::BackupStore;
use valkey_api::bootstrap::{RestorePhase, RestoreStatus};

use super::progress::{MAX_ATTEMPTS, retry_delay};
use super::reach::{self, Unreached};
use super::restore_io::{Failure, read_manifest, restore_file, verify};
use super::{plan, restore_check, store};
use crate::context::Shared;
use crate::metrics::Metrics;
use crate::scope::Scope;
use crate::status::EventSpec;

/// Name of the controller in metrics.
pub const RESTORE_CONTROLLER: &str = "restore";

/// Field manager of `status.restore`.
const FIELD_MANAGER: &str = "valkey-operator/restore";

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

impl From<Failure> for Stop {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Retry(m) => Stop::Retry(m),
            Failure::Refuse(m) => Stop::Refuse(m),
        }
    }
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
