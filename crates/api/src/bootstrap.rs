//! `spec.bootstrap`: the data a new cluster starts with (a backup restored into it), and
//! `status.restore`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backup_store::BackupStore;

/// Message: bootstrap added, removed or changed.
pub const BOOTSTRAP_IMMUTABLE_MESSAGE: &str = "spec.bootstrap is set when a cluster is \
     created and cannot be added, removed or changed later: restore the previous value (create \
     a new ValkeyCluster to restore another backup)";
/// Message: not exactly one way of naming the backup.
pub const BACKUP_SOURCE_MESSAGE: &str = "bootstrap.backup needs either name (a ValkeyBackup in \
     this namespace) or both store and path (a backup made elsewhere), not both";

/// The data a new cluster starts with.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Restore this backup once the cluster has formed, into any number of shards: every key
    /// goes to the shard that owns its slot, with its TTL. The cluster reports Ready only
    /// after every file's SHA-256 matched the manifest and every key was restored; a tampered
    /// or incomplete backup, or one written by a newer Valkey than `image` reads, is refused
    /// before any key is written (`status.restore` says why).
    pub backup: BackupSource,
}

/// Which backup to restore: a ValkeyBackup by name, or a store and a path.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.name) != has(self.store) && has(self.store) == has(self.path)").message(BACKUP_SOURCE_MESSAGE))]
pub struct BackupSource {
    /// A completed ValkeyBackup in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,

    /// The store holding the backup (a backup made in another namespace or Kubernetes
    /// cluster); credentials are read from a Secret in this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<BackupStore>,

    /// The backup's directory in that store: `<prefix>/<namespace>/<cluster>/<backup>`, as
    /// the backup's `status.location` shows after the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path: Option<String>,
}

/// Progress and outcome of restoring `spec.bootstrap.backup`.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// Pending, Verifying, Restoring, Completed or Failed.
    pub phase: RestorePhase,

    /// Where the backup is read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,

    /// What is happening, or why it stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Files (one per shard of the backed-up cluster) in the backup.
    #[serde(default)]
    pub files: i32,

    /// Files whose keys are all restored.
    #[serde(default)]
    pub files_done: i32,

    /// Keys restored.
    #[serde(default)]
    pub keys: i64,

    /// Keys not restored because their TTL had passed.
    #[serde(default)]
    pub expired: i64,

    /// Bytes read from the store.
    #[serde(default)]
    pub bytes: i64,

    /// Attempts made (a failed attempt is retried with back-off).
    #[serde(default)]
    pub attempts: i32,

    /// When the restore started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,

    /// When it completed or failed for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,

    /// Seconds the completing attempt took, from checking the files to the last key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<f64>,

    /// When the next attempt starts, after a failed one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_at: Option<Time>,
}

/// Phase of a restore.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RestorePhase {
    /// Waiting for the cluster to form, for the store, or for a retry.
    #[default]
    Pending,
    /// Reading every file once to check it against the manifest.
    Verifying,
    /// Writing the keys.
    Restoring,
    /// Every key is restored and the counts match the manifest.
    Completed,
    /// Refused or given up; `message` says why.
    Failed,
}

impl RestorePhase {
    /// Whether the restore is over.
    pub fn is_final(self) -> bool {
        matches!(self, RestorePhase::Completed | RestorePhase::Failed)
    }
}
