//! A backup's status as it moves from phase to phase, and the one event per transition
//! (pure).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use valkey_api::backup::{BackupPhase, CONDITION_COMPLETED, ValkeyBackupStatus, reasons};

use crate::status::EventSpec;
use crate::status::conditions::{Cond, merge};

/// Attempts before a backup is given up.
pub const MAX_ATTEMPTS: i32 = 6;

/// The wait before attempt `attempts + 1`, after `attempts` failed ones: 10 s, doubling, at
/// most 5 minutes.
pub fn retry_delay(attempts: i32) -> Duration {
    let exp = attempts.clamp(1, 16) as u32 - 1;
    Duration::from_secs((10u64 << exp).min(300))
}

/// How long to wait before the next attempt may start (`None`: now).
pub fn wait_before_attempt(status: &ValkeyBackupStatus, now: Timestamp) -> Option<Duration> {
    let at = status.retry_at.as_ref()?.0;
    let left = now.duration_until(at);
    (left > SignedDuration::ZERO).then(|| Duration::from_millis(left.as_millis().max(1) as u64))
}

/// The next status: `phase` with the `Completed` condition (`reason`, `message`), the rest of
/// `base` kept.
pub fn with_phase(
    base: &ValkeyBackupStatus,
    phase: BackupPhase,
    reason: &'static str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> ValkeyBackupStatus {
    let cond = if phase == BackupPhase::Completed {
        Cond::yes(CONDITION_COMPLETED, reason, message)
    } else {
        Cond::no(CONDITION_COMPLETED, reason, message)
    };
    ValkeyBackupStatus {
        phase: Some(phase),
        observed_generation: generation,
        conditions: merge(&base.conditions, &[cond], generation, now),
        ..base.clone()
    }
}

/// `done/total`.
pub fn progress_text(done: usize, total: usize) -> String {
    format!("{done}/{total}")
}

fn reason_of(s: &ValkeyBackupStatus) -> Option<&str> {
    s.conditions
        .iter()
        .find(|c| c.type_ == CONDITION_COMPLETED)
        .map(|c| c.reason.as_str())
}

fn message_of(s: &ValkeyBackupStatus) -> String {
    s.conditions
        .iter()
        .find(|c| c.type_ == CONDITION_COMPLETED)
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// The event of the move from `old` to `new`: one per change of phase or reason (a retry
/// after the same failure is not repeated).
pub fn event(old: &ValkeyBackupStatus, new: &ValkeyBackupStatus) -> Option<EventSpec> {
    if old.phase == new.phase && reason_of(old) == reason_of(new) {
        return None;
    }
    let note = message_of(new);
    Some(match (new.phase?, reason_of(new)?) {
        (BackupPhase::Completed, _) => EventSpec::normal("BackupCompleted", "Backup", note),
        (BackupPhase::Failed, _) => EventSpec::warning("BackupFailed", "Backup", note),
        (BackupPhase::Running, _) => EventSpec::normal("BackupStarted", "Backup", note),
        (BackupPhase::Pending, reasons::WAITING_FOR_CLUSTER) => {
            EventSpec::normal("WaitingForCluster", "Backup", note)
        }
        (BackupPhase::Pending, reasons::CREDENTIALS_MISSING) => {
            EventSpec::warning("CredentialsMissing", "Backup", note)
        }
        (BackupPhase::Pending, reasons::SNAPSHOT_ERROR) => {
            EventSpec::warning("SnapshotError", "Backup", note)
        }
        (BackupPhase::Pending, _) => EventSpec::warning("StoreError", "Backup", note),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn retries_back_off_to_five_minutes() {
        let d: Vec<u64> = (1..=7).map(|a| retry_delay(a).as_secs()).collect();
        assert_eq!(d, vec![10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn an_attempt_waits_for_its_retry_time() {
        let now: Timestamp = "2026-12-07T10:00:00Z".parse().unwrap();
        let mut s = ValkeyBackupStatus::default();
        assert_eq!(wait_before_attempt(&s, now), None);
        s.retry_at = Some(at("2026-12-07T10:00:20Z"));
        assert_eq!(wait_before_attempt(&s, now), Some(Duration::from_secs(20)));
        s.retry_at = Some(at("2026-12-07T09:59:00Z"));
        assert_eq!(wait_before_attempt(&s, now), None);
    }

    #[test]
    fn one_event_per_transition() {
        let now = at("2026-12-07T10:00:00Z");
        let empty = ValkeyBackupStatus::default();
        let running = with_phase(
            &empty,
            BackupPhase::Running,
            reasons::RUNNING,
            "shard 1 of 3".into(),
            Some(1),
            &now,
        );
        let e = event(&empty, &running).unwrap();
        assert_eq!((e.reason, e.warning), ("BackupStarted", false));
        let further = with_phase(
            &running,
            BackupPhase::Running,
            reasons::RUNNING,
            "shard 2 of 3".into(),
            Some(1),
            &now,
        );
        assert_eq!(event(&running, &further), None);
        let store = with_phase(
            &further,
            BackupPhase::Pending,
            reasons::STORE_ERROR,
            "SignatureDoesNotMatch".into(),
            Some(1),
            &now,
        );
        let e = event(&further, &store).unwrap();
        assert_eq!((e.reason, e.warning), ("StoreError", true));
        assert_eq!(e.note, "SignatureDoesNotMatch");
        let again = with_phase(
            &store,
            BackupPhase::Pending,
            reasons::STORE_ERROR,
            "SignatureDoesNotMatch".into(),
            Some(1),
            &now,
        );
        assert_eq!(event(&store, &again), None);
        let done = with_phase(
            &again,
            BackupPhase::Completed,
            reasons::COMPLETED,
            "3 shards".into(),
            Some(1),
            &now,
        );
        assert_eq!(event(&again, &done).unwrap().reason, "BackupCompleted");
        assert_eq!(done.conditions[0].status, "True");
    }
}
