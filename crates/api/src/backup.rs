//! The `ValkeyBackup` custom resource: one backup of a ValkeyCluster to an object store.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backup_store::BackupStore;

/// Message: the spec of a backup changed.
pub const BACKUP_SPEC_IMMUTABLE_MESSAGE: &str = "spec of a ValkeyBackup is immutable: create a \
     new ValkeyBackup instead";
/// Message: name too long or not a DNS label.
pub const BACKUP_NAME_MESSAGE: &str = "metadata.name of a ValkeyBackup must be a lowercase DNS \
     label of at most 63 characters (it names the backup's directory in the store)";

/// Condition type: the backup's outcome (`True` once every shard and the manifest are
/// written; `False` with the reason while it runs or after it failed).
pub const CONDITION_COMPLETED: &str = "Completed";

/// Reasons of the `Completed` condition.
pub mod reasons {
    /// Waiting for the cluster (absent, not Ready, or a shard without a reachable copy).
    pub const WAITING_FOR_CLUSTER: &str = "WaitingForCluster";
    /// Shards are being streamed.
    pub const RUNNING: &str = "Running";
    /// Every shard and the manifest are in the store.
    pub const COMPLETED: &str = "Completed";
    /// The store refused or could not be reached; retried with back-off.
    pub const STORE_ERROR: &str = "StoreError";
    /// The credentials Secret is missing or lacks a key.
    pub const CREDENTIALS_MISSING: &str = "CredentialsMissing";
    /// A node failed while it streamed its snapshot; retried.
    pub const SNAPSHOT_ERROR: &str = "SnapshotError";
    /// The retries are exhausted.
    pub const FAILED: &str = "Failed";
}

/// A one-off backup of a ValkeyCluster: a snapshot (RDB) of every shard, streamed to an
/// object store, and a manifest. Each shard's snapshot is taken from a synced replica when
/// the shard has one (no fork on the primary), otherwise from the primary. The shards are
/// snapshotted one after another: the backup is a set of per-shard snapshots, not one
/// cluster-wide point in time.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "valkey.io",
    version = "v1alpha1",
    kind = "ValkeyBackup",
    namespaced,
    status = "ValkeyBackupStatus",
    derive = "PartialEq",
    shortname = "vkb",
    category = "valkey",
    doc = "A backup of a ValkeyCluster to an object store.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster", description = "The ValkeyCluster backed up"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase", description = "Pending, Running, Completed or Failed"),
    printcolumn(name = "Shards", type_ = "string", json_path = ".status.progress", description = "Shards written of all"),
    printcolumn(name = "Bytes", type_ = "integer", json_path = ".status.bytes", description = "Bytes written"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = kube::core::Rule::new("self.metadata.name.size() <= 63").message(BACKUP_NAME_MESSAGE)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("self == oldSelf").message(BACKUP_SPEC_IMMUTABLE_MESSAGE))]
pub struct ValkeyBackupSpec {
    /// Name of the ValkeyCluster to back up, in the backup's namespace. The backup waits
    /// until that cluster exists and every shard has a reachable primary.
    #[schemars(length(min = 1, max = 40))]
    pub cluster: String,

    /// Where the backup is written.
    pub store: BackupStore,

    /// What happens to the files in the store when this ValkeyBackup is deleted: `Retain`
    /// (the default for a backup you create) keeps them; `Delete` (what a schedule sets, so
    /// its retention frees the space) deletes every object of the backup first; the object
    /// then waits in deletion until the store confirms.
    #[serde(default)]
    pub deletion_policy: BackupDeletionPolicy,
}

/// Whether a backup's files outlive its ValkeyBackup.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackupDeletionPolicy {
    /// The files stay in the store.
    #[default]
    Retain,
    /// The files are deleted with the ValkeyBackup.
    Delete,
}

/// Finalizer of a ValkeyBackup with `deletionPolicy: Delete`: removed once its files are
/// deleted from the store.
pub const FILES_FINALIZER: &str = "valkey.io/backup-files";

/// Label on a ValkeyBackup created by a ValkeyScheduledBackup: the schedule's name.
pub const SCHEDULE_LABEL: &str = "valkey.io/scheduled-backup";

/// Progress and outcome of a backup.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyBackupStatus {
    /// Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<BackupPhase>,

    /// Where the backup is: `s3://bucket/prefix/namespace/cluster/backup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,

    /// When the first shard's snapshot started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When the manifest was written (or the backup failed for good).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,

    /// Shards written of all, as `written/total`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,

    /// Shards in the backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<i32>,

    /// Shards written so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards_done: Option<i32>,

    /// Bytes written so far (RDB files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,

    /// Keys in the backup's files (every database), counted by splitting the files into keys
    /// as they were written, the way a restore splits them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<i64>,

    /// Seconds from the first snapshot's start to the manifest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,

    /// The Valkey version of the servers the snapshots came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valkey_version: Option<String>,

    /// Attempts made (a failed attempt is retried with back-off, up to 6 attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,

    /// When the next attempt starts, after a failed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Completed`: True once the backup is whole; False with the reason (Running,
    /// WaitingForCluster, StoreError, CredentialsMissing, SnapshotError, Failed) and the
    /// store's or server's own words otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Phase of a backup.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackupPhase {
    /// Waiting for the cluster or for a retry.
    Pending,
    /// Streaming the shards.
    Running,
    /// Every shard and the manifest are in the store.
    Completed,
    /// Given up after the last attempt; the condition says why.
    Failed,
}

impl BackupPhase {
    /// Whether the backup is over (no more work).
    pub fn is_final(self) -> bool {
        matches!(self, BackupPhase::Completed | BackupPhase::Failed)
    }
}
