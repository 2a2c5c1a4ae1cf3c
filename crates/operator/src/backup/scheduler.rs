//! The ValkeyScheduledBackup controller: creates a ValkeyBackup at each scheduled time (not
//! while the previous one runs) and deletes the backups retention no longer keeps (their
//! `deletionPolicy: Delete` takes their files with them).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tracing::{debug, info, warn};
use valkey_api::backup::{BackupDeletionPolicy, SCHEDULE_LABEL, ValkeyBackup, ValkeyBackupSpec};
use valkey_api::scheduled_backup::{
    CONDITION_SCHEDULED, ValkeyScheduledBackup, ValkeyScheduledBackupStatus,
};

use super::schedule::{self, Kept, Schedule};
use crate::context::Shared;
use crate::metrics::Metrics;
use crate::scope::Scope;
use crate::status::EventSpec;
use crate::status::conditions::{Cond, merge};

/// Name of the controller in metrics.
pub const SCHEDULE_CONTROLLER: &str = "valkeyscheduledbackup";

/// Field manager of the schedules' status.
const FIELD_MANAGER: &str = "valkey-operator/scheduled-backup";

/// The longest wait between looks (a clock step or a missed watch event costs no more).
const MAX_WAIT: Duration = Duration::from_secs(300);

/// Runs the ValkeyScheduledBackup controller over `scope` until `shutdown` completes.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    scope: Scope,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let owned = watcher::Config::default().labels(SCHEDULE_LABEL);
    Controller::new(
        scope.api::<ValkeyScheduledBackup>(&client),
        watcher::Config::default(),
    )
    .owns(scope.api::<ValkeyBackup>(&client), owned)
    .graceful_shutdown_on(shutdown)
    .run(
        reconcile,
        |s, e: &kube::Error, _| {
            warn!(schedule = %s.name_any(), error = %e, "ValkeyScheduledBackup reconcile failed; retrying");
            Action::requeue(Duration::from_secs(10))
        },
        Arc::new(Shared::new(client, metrics)),
    )
    .for_each(|res| async move {
        if let Err(e) = res {
            debug!(error = %e, "ValkeyScheduledBackup reconcile failed");
        }
    })
    .await;
    info!("ValkeyScheduledBackup controller stopped");
}

async fn reconcile(s: Arc<ValkeyScheduledBackup>, ctx: Arc<Shared>) -> Result<Action, kube::Error> {
    let metrics = ctx.metrics.clone();
    metrics.reconcile(SCHEDULE_CONTROLLER, pass(&s, &ctx)).await
}

fn kept(b: &ValkeyBackup) -> Kept {
    Kept {
        name: b.name_any(),
        created: b
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
        phase: b.status.as_ref().and_then(|s| s.phase),
    }
}

/// The backup of `s` scheduled at `at`, owned by `s`.
fn backup_for(s: &ValkeyScheduledBackup, at: Timestamp) -> ValkeyBackup {
    let mut b = ValkeyBackup::new(
        &schedule::backup_name(&s.name_any(), at),
        ValkeyBackupSpec {
            cluster: s.spec.cluster.clone(),
            store: s.spec.store.clone(),
            deletion_policy: BackupDeletionPolicy::Delete,
        },
    );
    b.metadata.namespace = s.namespace();
    b.metadata.labels = Some([(SCHEDULE_LABEL.to_owned(), s.name_any())].into());
    b.metadata.owner_references = s.controller_owner_ref(&()).map(|o| vec![o]);
    b
}

async fn pass(s: &ValkeyScheduledBackup, ctx: &Shared) -> Result<Action, kube::Error> {
    let ns = s.namespace().unwrap_or_default();
    let name = s.name_any();
    let api: Api<ValkeyScheduledBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let backups: Api<ValkeyBackup> = Api::namespaced(ctx.client.clone(), &ns);
    let old = s.status.clone().unwrap_or_default();
    let now = Timestamp::now();
    let mut status = ValkeyScheduledBackupStatus {
        observed_generation: s.metadata.generation,
        ..old.clone()
    };
    let mut events = Vec::new();
    let mut wait = MAX_WAIT;

    let owned: Vec<ValkeyBackup> = backups
        .list(&ListParams::default().labels(&format!("{SCHEDULE_LABEL}={name}")))
        .await?
        .items;
    let facts: Vec<Kept> = owned.iter().map(kept).collect();
    for gone in schedule::expired(&facts, &s.spec.retention, now) {
        match backups.delete(&gone, &DeleteParams::default()).await {
            Ok(_) => info!(schedule = %name, backup = %gone, "retention deleted a backup"),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    status.last_completed_backup = facts
        .iter()
        .filter(|k| k.phase == Some(valkey_api::backup::BackupPhase::Completed))
        .max_by_key(|k| k.created)
        .map(|k| k.name.clone());

    let cond = match Schedule::parse(&s.spec.schedule) {
        Err(e) => {
            status.next_schedule_time = None;
            Cond::no(CONDITION_SCHEDULED, "InvalidSchedule", e)
        }
        Ok(_) if s.spec.suspend => {
            status.next_schedule_time = None;
            Cond::no(
                CONDITION_SCHEDULED,
                "Suspended",
                "spec.suspend is true: no new backups",
            )
        }
        Ok(cron) => {
            let created = s.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
            let last = old.last_schedule_time.as_ref().map(|t| t.0);
            let due = schedule::due(&cron, created, last, s.spec.immediate, now);
            status.next_schedule_time = due.next.map(Time);
            if let Some(next) = due.next {
                let left = now.duration_until(next).as_millis().max(100) as u64;
                wait = wait.min(Duration::from_millis(left));
            }
            let running = facts
                .iter()
                .find(|k| !k.phase.is_some_and(|p| p.is_final()));
            match (due.run, running) {
                (Some(at), Some(busy)) => {
                    // Skipped, as a CronJob with `concurrencyPolicy: Forbid` does.
                    status.last_schedule_time = Some(Time(at));
                    events.push(EventSpec::warning(
                        "BackupSkipped",
                        "Schedule",
                        format!(
                            "the backup due at {at} was skipped: {} is still running",
                            busy.name
                        ),
                    ));
                    Cond::yes(
                        CONDITION_SCHEDULED,
                        "Skipped",
                        format!(
                            "the backup due at {at} was skipped: {} was still running",
                            busy.name
                        ),
                    )
                }
                (Some(at), None) => {
                    let b = backup_for(s, at);
                    match backups.create(&PostParams::default(), &b).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(e)) if e.code == 409 => {}
                        Err(e) => return Err(e),
                    }
                    status.last_schedule_time = Some(Time(at));
                    status.last_backup = Some(b.name_any());
                    events.push(EventSpec::normal(
                        "BackupCreated",
                        "Schedule",
                        format!("created {} for {at}", b.name_any()),
                    ));
                    Cond::yes(
                        CONDITION_SCHEDULED,
                        "Scheduled",
                        format!("created {}", b.name_any()),
                    )
                }
                (None, _) => {
                    let prev = old
                        .conditions
                        .iter()
                        .find(|c| c.type_ == CONDITION_SCHEDULED && c.status == "True");
                    match prev {
                        Some(c) => Cond::yes(
                            CONDITION_SCHEDULED,
                            if c.reason == "Skipped" {
                                "Skipped"
                            } else {
                                "Scheduled"
                            },
                            c.message.clone(),
                        ),
                        None => Cond::yes(
                            CONDITION_SCHEDULED,
                            "Scheduled",
                            "waiting for the first scheduled time",
                        ),
                    }
                }
            }
        }
    };
    let was = old
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_SCHEDULED)
        .map(|c| c.reason.clone());
    if !cond.status && was.as_deref() != Some(cond.reason) {
        events.push(EventSpec::warning(
            cond.reason,
            "Schedule",
            cond.message.clone(),
        ));
    }
    status.conditions = merge(&old.conditions, &[cond], s.metadata.generation, &Time(now));
    if status != old {
        let body = serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1",
            "kind": "ValkeyScheduledBackup",
            "status": status,
        });
        api.patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    }
    ctx.publish(&s.object_ref(&()), &events).await;
    Ok(Action::requeue(wait))
}
