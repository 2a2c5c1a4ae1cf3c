//! The `ValkeyScheduledBackup` custom resource: backups of a ValkeyCluster on a cron schedule,
//! with retention.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backup_store::BackupStore;

/// Message: a schedule that is not 5 or 6 cron fields.
pub const SCHEDULE_MESSAGE: &str = "schedule must be a cron expression of 5 fields (minute hour \
     day-of-month month day-of-week, for example '0 3 * * *') or 6 fields with seconds first \
     ('*/30 * * * * *'), in UTC";
/// Message: a maximum age that is not a number of hours or days.
pub const MAX_AGE_MESSAGE: &str = "maxAge must be a whole number of hours or days, for example \
     '36h' or '30d'";
/// Message: name too long.
pub const SCHEDULE_NAME_MESSAGE: &str = "metadata.name of a ValkeyScheduledBackup must be at \
     most 48 characters (its backups are named <name>-<UTC time>)";

/// Condition type: whether the schedule can run (`True`), or why not (`InvalidSchedule`,
/// `Suspended`).
pub const CONDITION_SCHEDULED: &str = "Scheduled";

/// Backups of a ValkeyCluster on a cron schedule. At each time the schedule names, a
/// ValkeyBackup `<name>-<yyyymmddhhmmss>` is created (owned by this object, with
/// `deletionPolicy: Delete`), unless the previous one is still running; missed times are not
/// caught up, only the latest runs. Retention then deletes the oldest completed backups (and
/// their files) beyond `retention`, never the newest completed one.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "valkey.io",
    version = "v1alpha1",
    kind = "ValkeyScheduledBackup",
    namespaced,
    status = "ValkeyScheduledBackupStatus",
    derive = "PartialEq",
    shortname = "vksb",
    category = "valkey",
    doc = "Backups of a ValkeyCluster on a schedule, with retention.",
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster", description = "The ValkeyCluster backed up"),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule", description = "Cron schedule (UTC)"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend", description = "Whether new backups are held"),
    printcolumn(name = "Last", type_ = "string", json_path = ".status.lastBackup", description = "The latest backup created"),
    printcolumn(name = "Next", type_ = "date", json_path = ".status.nextScheduleTime", description = "When the next backup starts"),
    validation = kube::core::Rule::new("self.metadata.name.size() <= 48").message(SCHEDULE_NAME_MESSAGE)
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyScheduledBackupSpec {
    /// Name of the ValkeyCluster to back up, in this namespace.
    #[schemars(length(min = 1, max = 40))]
    pub cluster: String,

    /// Cron schedule in UTC: 5 fields (`0 3 * * *`: every day at 03:00) or 6 with seconds
    /// first. Names (`MON`, `JAN`), ranges, lists and steps are accepted.
    #[schemars(length(min = 9, max = 128))]
    #[x_kube(validation = kube::core::Rule::new("self.trim().split(' ').filter(f, f != '').size() in [5, 6]").message(SCHEDULE_MESSAGE))]
    pub schedule: String,

    /// Hold new backups (running ones finish; retention still applies).
    #[serde(default)]
    pub suspend: bool,

    /// Take a backup at once when the schedule is created, not only at its first time.
    #[serde(default)]
    pub immediate: bool,

    /// How many completed backups to keep, and for how long.
    #[serde(default)]
    pub retention: RetentionSpec,

    /// Where the backups are written (see ValkeyBackup).
    pub store: BackupStore,
}

/// Which of a schedule's backups are kept. The newest completed backup is always kept.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Completed backups kept, newest first; older ones are deleted with their files.
    /// Defaults to 7.
    #[serde(default = "keep_default")]
    #[schemars(range(min = 1, max = 1000))]
    pub keep: i32,

    /// Completed backups older than this are deleted, for example `30d` or `36h`. Omitted:
    /// no age limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self.matches('^[1-9][0-9]{0,5}[hd]$')").message(MAX_AGE_MESSAGE))]
    pub max_age: Option<String>,
}

impl Default for RetentionSpec {
    fn default() -> Self {
        Self {
            keep: keep_default(),
            max_age: None,
        }
    }
}

fn keep_default() -> i32 {
    7
}

impl RetentionSpec {
    /// `maxAge` in seconds, when set and well-formed.
    pub fn max_age_seconds(&self) -> Option<i64> {
        let a = self.max_age.as_deref()?;
        let (n, unit) = a.split_at(a.len().checked_sub(1)?);
        let n: i64 = n.parse().ok()?;
        match unit {
            "h" => Some(n * 3600),
            "d" => Some(n * 86_400),
            _ => None,
        }
    }
}

/// What the schedule did last and will do next.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyScheduledBackupStatus {
    /// The scheduled time of the latest backup created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,

    /// When the next backup is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,

    /// Name of the latest ValkeyBackup created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<String>,

    /// Name of the newest completed ValkeyBackup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_completed_backup: Option<String>,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Scheduled`: True while backups are taken on time; False with `InvalidSchedule` or
    /// `Suspended`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_age_in_seconds() {
        let r = |a: &str| RetentionSpec {
            keep: 1,
            max_age: Some(a.into()),
        };
        assert_eq!(r("36h").max_age_seconds(), Some(129_600));
        assert_eq!(r("30d").max_age_seconds(), Some(2_592_000));
        assert_eq!(r("30m").max_age_seconds(), None);
        assert_eq!(RetentionSpec::default().max_age_seconds(), None);
    }
}
