//! Whether every copy of a shard was down at once (pure). Then no server kept the shard's
//! keys in memory: it serves what its files held (Valkey cannot do better), and the status
//! must say so rather than report a healthy cluster over a silent loss.
//!
//! Evidence comes from the pods: a `server` container that terminated is down from its
//! `lastState.terminated.finishedAt` until its pod is Ready again (a restarted server is not
//! Ready while it holds for its replica or loads or syncs its data). A shard whose pods were
//! all down at one instant lost its memory. A pod that was replaced (new pod, no last state)
//! is not evidence: its data came from a replica or was handed over.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use valkey_api::defaults::SERVER_CONTAINER;
use valkey_api::status::{condition, reason};
use valkey_api::{ValkeyClusterSpec, ValkeyClusterStatus};

/// How long after the last copy came back the loss is reported.
pub const REPORT_FOR: Duration = Duration::from_secs(600);

/// The interval during which a pod's server was down, if it terminated at all: from the end
/// of its last run until the pod became Ready again (`None`: not Ready yet).
fn down_interval(pod: &Pod) -> Option<(Timestamp, Option<Timestamp>)> {
    let status = pod.status.as_ref()?;
    let server = status
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)?;
    let from = server
        .last_state
        .as_ref()?
        .terminated
        .as_ref()?
        .finished_at
        .as_ref()?
        .0;
    let started = server
        .state
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.as_ref())
        .map(|t| t.0);
    let ready = status
        .conditions
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    let back = match (started, ready) {
        // Ready again only counts after the restart.
        (Some(s), Some(r)) if pod.metadata.deletion_timestamp.is_none() => Some(s.max(r)),
        _ => None,
    };
    Some((from, back))
}

/// What the server's files give back after a restart, from its configuration.
fn files_keep(spec: &ValkeyClusterSpec) -> String {
    if spec.config_value("appendonly") == Some("yes") {
        let fsync = spec.config_value("appendfsync").unwrap_or("everysec");
        return format!(
            "it serves what its append-only file held (appendfsync {fsync}{})",
            if fsync == "always" {
                ""
            } else {
                ": the writes of up to the last second may be lost"
            }
        );
    }
    match spec.config_value("save") {
        Some(s) if s.trim().is_empty() || s.trim() == "\"\"" => {
            "it has no append-only file and no RDB snapshot (save \"\"): it restarted empty and every key it owned is lost".to_owned()
        }
        s => format!(
            "it serves its last RDB snapshot (save {}): every write after that snapshot is lost",
            s.unwrap_or("3600 1 300 100 60 10000, Valkey's default")
        ),
    }
}

/// The shards that had data to lose: those the last status showed with a primary or slots, and
/// every shard while a loss is being reported (a shard whose copies are all down shows
/// neither).
pub fn served_shards(status: Option<&ValkeyClusterStatus>) -> BTreeSet<i32> {
    let Some(status) = status else {
        return BTreeSet::new();
    };
    let reporting = status.conditions.iter().any(|c| {
        c.type_ == condition::DEGRADED && c.status == "True" && c.reason == reason::SHARD_RESTARTED
    });
    status
        .shard_statuses
        .iter()
        .filter(|s| reporting || s.primary_pod.is_some() || !s.slots.is_empty())
        .map(|s| s.index)
        .collect()
}

/// The report of the shards whose every copy was down at once, no longer ago than
/// [`REPORT_FOR`] (or still down), or `None`. `pods` are the cluster's pods by shard index;
/// only the shards in `served` (those the last status showed with a primary) had data to
/// lose, so a pod that fails while its cluster forms is not reported.
pub fn shard_restart<'a>(
    pods: impl IntoIterator<Item = (i32, &'a Pod)>,
    served: &BTreeSet<i32>,
    spec: &ValkeyClusterSpec,
    now: Timestamp,
) -> Option<String> {
    let mut by_shard: BTreeMap<i32, Vec<&Pod>> = BTreeMap::new();
    for (shard, p) in pods.into_iter().filter(|(s, _)| served.contains(s)) {
        by_shard.entry(shard).or_default().push(p);
    }
    let mut lost: Vec<(i32, Timestamp)> = Vec::new();
    for (shard, pods) in by_shard {
        let Some(intervals) = pods
            .iter()
            .map(|p| down_interval(p))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        // Intervals on a line share an instant when the latest start precedes the earliest end.
        let Some(all_down) = intervals.iter().map(|(from, _)| *from).max() else {
            continue;
        };
        let first_back = intervals.iter().map(|(_, back)| back.unwrap_or(now)).min();
        let last_back = intervals.iter().map(|(_, back)| back.unwrap_or(now)).max();
        if let (Some(first), Some(last)) = (first_back, last_back)
            && all_down < first
            && now.duration_since(last).unsigned_abs() <= REPORT_FOR
        {
            lost.push((shard, all_down));
        }
    }
    if lost.is_empty() {
        return None;
    }
    let shards: Vec<String> = lost
        .iter()
        .map(|(s, at)| format!("shard {s} at {}", at.strftime("%Y-%m-%dT%H:%M:%SZ")))
        .collect();
    Some(format!(
        "every copy of {} was down at once, so no server kept its keys in memory; {}",
        crate::text::list("shards", &shards),
        files_keep(spec)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn ts(s: i64) -> String {
        t(s).to_string()
    }

    /// A pod of `shard` whose server terminated at `died` and runs again since `started`, Ready
    /// since `ready` (or not Ready).
    fn pod(
        shard: i32,
        index: i32,
        died: Option<i64>,
        started: i64,
        ready: Option<i64>,
    ) -> (i32, Pod) {
        let pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("p-{shard}-{index}")},
            "status": {
                "conditions": [{"type": "Ready", "status": if ready.is_some() {"True"} else {"False"},
                                "lastTransitionTime": ts(ready.unwrap_or(started))}],
                "containerStatuses": [{
                    "name": "server", "image": "i", "imageID": "", "ready": ready.is_some(),
                    "restartCount": i32::from(died.is_some()),
                    "state": {"running": {"startedAt": ts(started)}},
                    "lastState": died.map_or(serde_json::json!({}), |d| serde_json::json!(
                        {"terminated": {"exitCode": 137, "finishedAt": ts(d), "startedAt": ts(0)}})),
                }],
            },
        }))
        .unwrap();
        (shard, pod)
    }

    fn check(pods: &[(i32, Pod)], config: serde_json::Value, now: i64) -> Option<String> {
        let served = BTreeSet::from([0, 1]);
        shard_restart(
            pods.iter().map(|(s, p)| (*s, p)),
            &served,
            &spec(config),
            t(now),
        )
    }

    #[test]
    fn served_shards_are_those_with_a_primary_or_slots_and_all_while_reporting() {
        let mut status: ValkeyClusterStatus = serde_json::from_value(serde_json::json!({
            "shardStatuses": [{"index": 0, "primaryPod": "p"}, {"index": 1, "slots": ["0-5"]},
                              {"index": 2}]
        }))
        .unwrap();
        assert_eq!(served_shards(None), BTreeSet::new());
        assert_eq!(served_shards(Some(&status)), BTreeSet::from([0, 1]));
        status.conditions = serde_json::from_value(serde_json::json!([{"type": "Degraded",
            "status": "True", "reason": "ShardRestarted", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}]))
        .unwrap();
        assert_eq!(served_shards(Some(&status)), BTreeSet::from([0, 1, 2]));
    }

    #[test]
    fn a_shard_that_never_served_is_not_reported() {
        let pods = [
            pod(0, 0, Some(100), 101, None),
            pod(0, 1, Some(100), 101, None),
        ];
        let none = BTreeSet::new();
        let s = spec(serde_json::json!({}));
        assert_eq!(
            shard_restart(pods.iter().map(|(s, p)| (*s, p)), &none, &s, t(110)),
            None
        );
    }

    fn spec(config: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(serde_json::json!({"shards": 2, "config": config})).unwrap()
    }

    #[test]
    fn a_shard_whose_copies_were_all_down_at_once_is_reported_with_what_its_files_keep() {
        let pods = [
            pod(0, 0, Some(100), 101, Some(130)),
            pod(0, 1, Some(100), 101, Some(110)),
            pod(1, 0, None, 0, Some(5)),
            pod(1, 1, None, 0, Some(5)),
        ];
        let msg = check(&pods, serde_json::json!({}), 200).unwrap();
        assert!(msg.contains("shard 0 at "), "{msg}");
        assert!(!msg.contains("shard 1"), "{msg}");
        assert!(
            msg.contains("RDB snapshot (save 3600 1 300 100 60 10000"),
            "{msg}"
        );
        let aof = check(&pods, serde_json::json!({"appendonly": "yes"}), 200);
        assert!(
            aof.unwrap()
                .contains("append-only file held (appendfsync everysec: ")
        );
        let none = check(&pods, serde_json::json!({"save": ""}), 200);
        assert!(none.unwrap().contains("restarted empty"));
    }

    #[test]
    fn a_failover_in_between_is_no_loss() {
        // The primary died at 100 and was Ready (synced as a replica) at 120; its former replica,
        // now the primary, died at 300.
        let pods = [
            pod(0, 0, Some(100), 101, Some(120)),
            pod(0, 1, Some(300), 301, Some(320)),
        ];
        assert_eq!(check(&pods, serde_json::json!({}), 330), None);
    }

    #[test]
    fn a_restarted_primary_holding_when_its_replica_dies_is_a_loss() {
        // The primary died at 100 and holds (not Ready); its replica dies at 103.
        let pods = [
            pod(0, 0, Some(100), 101, None),
            pod(0, 1, Some(103), 104, Some(110)),
        ];
        assert!(check(&pods, serde_json::json!({}), 120).is_some());
    }

    #[test]
    fn a_single_copy_shard_that_restarted_is_reported_and_old_losses_expire() {
        let pods = [pod(0, 0, Some(100), 101, Some(105))];
        assert!(check(&pods, serde_json::json!({}), 200).is_some());
        assert_eq!(check(&pods, serde_json::json!({}), 105 + 601), None);
    }

    #[test]
    fn a_shard_with_a_copy_that_never_stopped_or_was_replaced_is_no_loss() {
        let pods = [
            pod(0, 0, Some(100), 101, Some(120)),
            pod(0, 1, None, 0, Some(5)),
        ];
        assert_eq!(check(&pods, serde_json::json!({}), 130), None);
    }
}
