//! When a schedule's next backup is due and which of its backups retention deletes (pure).

use std::str::FromStr;

use chrono::{DateTime, Utc};
use croner::Cron;
use k8s_openapi::jiff::Timestamp;
use valkey_api::backup::BackupPhase;
use valkey_api::scheduled_backup::RetentionSpec;

/// A parsed schedule.
pub struct Schedule(Cron);

fn to_chrono(t: Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32).unwrap_or_default()
}

fn to_jiff(t: DateTime<Utc>) -> Timestamp {
    Timestamp::from_second(t.timestamp()).unwrap_or(Timestamp::UNIX_EPOCH)
}

impl Schedule {
    /// Parses a cron expression of 5 fields, or 6 with seconds first (UTC).
    pub fn parse(text: &str) -> Result<Self, String> {
        let fields = text.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "{text:?} has {fields} fields; a schedule has 5 (or 6 with seconds first)"
            ));
        }
        Cron::from_str(text)
            .map(Schedule)
            .map_err(|e| format!("{text:?}: {e}"))
    }

    /// The first time after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        self.0
            .find_next_occurrence(&to_chrono(t), false)
            .ok()
            .map(to_jiff)
    }

    /// The latest time at or before `t`.
    pub fn latest_at_or_before(&self, t: Timestamp) -> Option<Timestamp> {
        self.0
            .find_previous_occurrence(&to_chrono(t), true)
            .ok()
            .map(to_jiff)
    }
}

/// What the schedule should do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The scheduled time of a backup to create now (only the latest of missed times).
    pub run: Option<Timestamp>,
    /// The next time after now.
    pub next: Option<Timestamp>,
}

/// The backup due at `now` for a schedule created at `created` whose latest backup was
/// scheduled at `last`; with `immediate`, the first backup is due at creation.
pub fn due(
    schedule: &Schedule,
    created: Timestamp,
    last: Option<Timestamp>,
    immediate: bool,
    now: Timestamp,
) -> Due {
    let next = schedule.next_after(now);
    let run = match last {
        None if immediate => Some(now),
        _ => {
            let since = last.unwrap_or(created);
            schedule.latest_at_or_before(now).filter(|t| *t > since)
        }
    };
    Due { run, next }
}

/// The name of the backup scheduled at `at`: `<schedule>-<yyyymmddhhmmss>`.
pub fn backup_name(schedule: &str, at: Timestamp) -> String {
    format!("{schedule}-{}", at.strftime("%Y%m%d%H%M%S"))
}

/// One of a schedule's backups, as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// Its name.
    pub name: String,
    /// When it was created.
    pub created: Timestamp,
    /// Its phase (`None`: not started).
    pub phase: Option<BackupPhase>,
}

/// The backups retention deletes: completed ones beyond the newest `keep` or older than
/// `maxAge` (never the newest completed one), and failed ones older than the newest
/// completed one (superseded).
pub fn expired(backups: &[Kept], retention: &RetentionSpec, now: Timestamp) -> Vec<String> {
    let mut completed: Vec<&Kept> = backups
        .iter()
        .filter(|b| b.phase == Some(BackupPhase::Completed))
        .collect();
    completed.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(&a.name)));
    let keep = usize::try_from(retention.keep.max(1)).unwrap_or(1);
    let max_age = retention.max_age_seconds();
    let mut out: Vec<String> = completed
        .iter()
        .enumerate()
        .filter(|(i, b)| {
            *i > 0
                && (*i >= keep
                    || max_age.is_some_and(|age| now.as_second() - b.created.as_second() > age))
        })
        .map(|(_, b)| b.name.clone())
        .collect();
    if let Some(newest) = completed.first() {
        out.extend(
            backups
                .iter()
                .filter(|b| b.phase == Some(BackupPhase::Failed) && b.created < newest.created)
                .map(|b| b.name.clone()),
        );
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn five_and_six_fields_parse_others_are_refused() {
        assert!(Schedule::parse("0 3 * * *").is_ok());
        assert!(Schedule::parse("*/10 * * * * *").is_ok());
        assert!(Schedule::parse("0 3 * *").is_err());
        assert!(Schedule::parse("0 3 * * * * 2030 x").is_err());
        let e = Schedule::parse("0 25 * * *").err().unwrap();
        assert!(e.contains("0 25"), "{e}");
    }

    #[test]
    fn only_the_latest_missed_time_runs() {
        let s = Schedule::parse("0 * * * *").unwrap();
        let created = ts("2026-12-07T09:30:00Z");
        // Before the first time: nothing yet.
        let d = due(&s, created, None, false, ts("2026-12-07T09:59:59Z"));
        assert_eq!(d.run, None);
        assert_eq!(d.next, Some(ts("2026-12-07T10:00:00Z")));
        // Three hours missed: one backup, for 12:00.
        let d = due(&s, created, None, false, ts("2026-12-07T12:20:00Z"));
        assert_eq!(d.run, Some(ts("2026-12-07T12:00:00Z")));
        // Already taken for 12:00.
        let last = Some(ts("2026-12-07T12:00:00Z"));
        assert_eq!(
            due(&s, created, last, false, ts("2026-12-07T12:59:00Z")).run,
            None
        );
        // Immediate: at creation.
        let now = ts("2026-12-07T09:30:05Z");
        assert_eq!(due(&s, created, None, true, now).run, Some(now));
        assert_eq!(
            backup_name("nightly", ts("2026-12-07T03:00:00Z")),
            "nightly-20261207030000"
        );
    }

    #[test]
    fn seconds_schedules_run_every_period() {
        let s = Schedule::parse("*/10 * * * * *").unwrap();
        let d = due(
            &s,
            ts("2026-12-07T09:30:01Z"),
            None,
            false,
            ts("2026-12-07T09:30:12Z"),
        );
        assert_eq!(d.run, Some(ts("2026-12-07T09:30:10Z")));
        assert_eq!(d.next, Some(ts("2026-12-07T09:30:20Z")));
    }

    fn kept(name: &str, created: &str, phase: BackupPhase) -> Kept {
        Kept {
            name: name.into(),
            created: ts(created),
            phase: Some(phase),
        }
    }

    #[test]
    fn retention_keeps_the_newest_and_drops_superseded_failures() {
        use BackupPhase::*;
        let backups = vec![
            kept("a", "2026-12-01T00:00:00Z", Completed),
            kept("b", "2026-12-02T00:00:00Z", Failed),
            kept("c", "2026-12-03T00:00:00Z", Completed),
            kept("d", "2026-12-04T00:00:00Z", Completed),
            kept("e", "2026-12-05T00:00:00Z", Failed),
            kept("f", "2026-12-05T01:00:00Z", Running),
        ];
        let now = ts("2026-12-06T00:00:00Z");
        let r = |keep, max_age: Option<&str>| RetentionSpec {
            keep,
            max_age: max_age.map(str::to_owned),
        };
        assert_eq!(expired(&backups, &r(2, None), now), vec!["a", "b"]);
        assert_eq!(expired(&backups, &r(7, None), now), vec!["b"]);
        // Age: c (3 days old) and a go; d is the newest completed, kept even when too old.
        assert_eq!(
            expired(&backups, &r(7, Some("48h")), now),
            vec!["a", "b", "c"]
        );
        assert_eq!(
            expired(&backups, &r(7, Some("1h")), now),
            vec!["a", "b", "c"]
        );
        // Nothing completed yet: nothing is deleted, failures stay for inspection.
        assert!(expired(&backups[4..], &r(1, Some("1h")), now).is_empty());
    }
}
