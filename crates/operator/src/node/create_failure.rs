//! Why the workload controller cannot create a ValkeyNode's pod (pure): Pod Security
//! admission, a ResourceQuota, a LimitRange or a webhook refusing it. The StatefulSet
//! controller says so only in `FailedCreate` events on the StatefulSet; the Deployment
//! controller in the Deployment's `ReplicaFailure` condition.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;

/// Event reason of the StatefulSet controller when it cannot create a pod.
pub const FAILED_CREATE: &str = "FailedCreate";

/// How recent the last `FailedCreate` event must be to count (the controller retries with a
/// back-off of at most a few minutes, and updates the event each time).
pub const RECENT: Duration = Duration::from_secs(300);

/// How long a StatefulSet may be without its pod before its events are read: the controller
/// creates a pod within a second or two, longer on a busy control plane, and listing events
/// for every new node would load the API server when a large cluster is created.
pub const GRACE: Duration = Duration::from_secs(10);

/// Whether a StatefulSet created at `created` and still without a pod at `now` is worth
/// asking why (see [`GRACE`]); one without a creation time is.
pub fn worth_asking(created: Option<Timestamp>, now: Timestamp) -> bool {
    created.is_none_or(|c| now.duration_since(c).unsigned_abs() >= GRACE)
}

/// The field selector of a StatefulSet's `FailedCreate` events.
pub fn event_selector(statefulset: &str) -> String {
    format!(
        "involvedObject.kind=StatefulSet,involvedObject.name={statefulset},reason={FAILED_CREATE}"
    )
}

/// The message of the newest `FailedCreate` event among `events`, if it is no older than
/// [`RECENT`] at `now`.
pub fn from_events(events: &[Event], now: Timestamp) -> Option<String> {
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.first_timestamp.as_ref().map(|t| t.0))
    };
    let newest = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(FAILED_CREATE))
        .filter_map(|e| Some((when(e)?, e)))
        .max_by_key(|(t, _)| *t)?;
    (now.duration_since(newest.0).unsigned_abs() <= RECENT)
        .then(|| newest.1.message.clone().unwrap_or_default())
}

/// The message of a Deployment's `ReplicaFailure` condition, when it is True.
pub fn from_deployment(d: &Deployment) -> Option<String> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| {
            c.type_.as_deref() == Some("ReplicaFailure") && c.status.as_deref() == Some("True")
        })
        .map(|c| c.message.clone().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_only_after_the_grace() {
        let now: Timestamp = "2026-01-01T00:00:30Z".parse().unwrap();
        let at = |s: &str| Some(s.parse::<Timestamp>().unwrap());
        assert!(!worth_asking(at("2026-01-01T00:00:25Z"), now));
        assert!(worth_asking(at("2026-01-01T00:00:20Z"), now));
        assert!(worth_asking(None, now));
    }

    fn event(reason: &str, at: i64, message: &str) -> Event {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("e{at}")},
            "involvedObject": {"kind": "StatefulSet", "name": "valkey-c-0-0"},
            "reason": reason, "message": message,
            "lastTimestamp": Timestamp::from_second(1_800_000_000 + at).unwrap().to_string(),
        }))
        .unwrap()
    }

    #[test]
    fn the_newest_recent_failed_create_is_the_reason() {
        let now = Timestamp::from_second(1_800_000_100).unwrap();
        let events = [
            event(FAILED_CREATE, 10, "old: exceeded quota"),
            event(
                FAILED_CREATE,
                90,
                "violates PodSecurity \"restricted:latest\"",
            ),
            event("SuccessfulCreate", 95, "created"),
        ];
        assert_eq!(
            from_events(&events, now).as_deref(),
            Some("violates PodSecurity \"restricted:latest\"")
        );
        let later = Timestamp::from_second(1_800_000_090 + 301).unwrap();
        assert_eq!(from_events(&events, later), None);
        assert_eq!(from_events(&[], now), None);
    }

    #[test]
    fn a_deployment_reports_its_replica_failure() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "d"},
            "status": {"conditions": [{"type": "ReplicaFailure", "status": "True",
                                       "reason": "FailedCreate", "message": "forbidden: quota"}]}
        }))
        .unwrap();
        assert_eq!(from_deployment(&d).as_deref(), Some("forbidden: quota"));
        assert_eq!(from_deployment(&Deployment::default()), None);
    }

    #[test]
    fn the_selector_names_the_statefulset_and_the_reason() {
        assert_eq!(
            event_selector("valkey-c-0-0"),
            "involvedObject.kind=StatefulSet,involvedObject.name=valkey-c-0-0,reason=FailedCreate"
        );
    }
}
