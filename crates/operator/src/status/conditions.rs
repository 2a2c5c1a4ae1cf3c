//! Kubernetes conditions: building, merging (keeping `lastTransitionTime` when the status did not
//! flip), time-insensitive comparison and the summary state derived from them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use valkey_api::status::{ClusterState, condition};

/// A condition as computed by a pass, before timestamps are attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cond {
    /// Condition type (`Ready`, `Progressing`, ...).
    pub type_: &'static str,
    /// Whether the condition holds.
    pub status: bool,
    /// Stable CamelCase reason from the status contract.
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
}

impl Cond {
    /// A condition that holds.
    pub fn yes(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: true,
            reason,
            message: message.into(),
        }
    }

    /// A condition that does not hold.
    pub fn no(type_: &'static str, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status: false,
            reason,
            message: message.into(),
        }
    }
}

fn status_str(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// Merges freshly computed conditions into the previous list: a condition whose status did not
/// change keeps its `lastTransitionTime`; others get `now`. Conditions not computed this pass
/// are dropped (the computed list is authoritative).
pub fn merge(
    previous: &[Condition],
    computed: &[Cond],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    computed
        .iter()
        .map(|c| {
            let status = status_str(c.status);
            let ltt = previous
                .iter()
                .find(|p| p.type_ == c.type_ && p.status == status)
                .map_or_else(|| now.clone(), |p| p.last_transition_time.clone());
            Condition {
                type_: c.type_.to_owned(),
                status: status.to_owned(),
                reason: c.reason.to_owned(),
                message: crate::text::clamp(&c.message, crate::text::CONDITION_MESSAGE_MAX),
                observed_generation: generation,
                last_transition_time: ltt,
            }
        })
        .collect()
}

/// Whether two condition lists are equal ignoring `lastTransitionTime` and order.
pub fn same_ignoring_time(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().all(|x| {
            b.iter().any(|y| {
                x.type_ == y.type_
                    && x.status == y.status
                    && x.reason == y.reason
                    && x.message == y.message
                    && x.observed_generation == y.observed_generation
            })
        })
}

/// Looks up a condition by type.
pub fn find<'a>(conds: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conds.iter().find(|c| c.type_ == type_)
}

/// Whether the condition `type_` is present with status `True`.
pub fn is_true(conds: &[Condition], type_: &str) -> bool {
    find(conds, type_).is_some_and(|c| c.status == "True")
}

/// The summary state derived in the contract's priority order (Degraded=True → Degraded;
/// Ready=True → Ready; Progressing=True → Reconciling; otherwise Failed), with the reason and
/// message of the deciding condition. With no conditions at all the state is `Initializing`.
pub fn derive_state(conds: &[Cond]) -> (ClusterState, Option<String>, Option<String>) {
    let get = |t: &str| conds.iter().find(|c| c.type_ == t);
    let pick = |c: &Cond| (Some(c.reason.to_owned()), Some(c.message.clone()));
    if let Some(c) = get(condition::DEGRADED).filter(|c| c.status) {
        let (r, m) = pick(c);
        return (ClusterState::Degraded, r, m);
    }
    if let Some(c) = get(condition::READY).filter(|c| c.status) {
        let (r, m) = pick(c);
        return (ClusterState::Ready, r, m);
    }
    if let Some(c) = get(condition::PROGRESSING).filter(|c| c.status) {
        let (r, m) = pick(c);
        return (ClusterState::Reconciling, r, m);
    }
    match get(condition::READY) {
        Some(c) => {
            let (r, m) = pick(c);
            (ClusterState::Failed, r, m)
        }
        None => (ClusterState::Initializing, None, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn merge_keeps_transition_time_when_status_unchanged() {
        let first = merge(
            &[],
            &[Cond::no(condition::READY, "MissingReplicas", "a")],
            Some(1),
            &t(10),
        );
        assert_eq!(first[0].last_transition_time, t(10));
        // Same status, different message: time kept.
        let second = merge(
            &first,
            &[Cond::no(condition::READY, "MissingShards", "b")],
            Some(2),
            &t(20),
        );
        assert_eq!(second[0].last_transition_time, t(10));
        assert_eq!(second[0].reason, "MissingShards");
        assert_eq!(second[0].observed_generation, Some(2));
        // Flip: new time.
        let third = merge(
            &second,
            &[Cond::yes(condition::READY, "ClusterHealthy", "ok")],
            Some(2),
            &t(30),
        );
        assert_eq!(third[0].last_transition_time, t(30));
        assert_eq!(third[0].status, "True");
    }

    #[test]
    fn equality_ignores_time_and_order() {
        let a = merge(
            &[],
            &[
                Cond::yes(condition::READY, "ClusterHealthy", "ok"),
                Cond::no(condition::DEGRADED, "ClusterHealthy", ""),
            ],
            Some(1),
            &t(1),
        );
        let mut b = merge(
            &[],
            &[
                Cond::no(condition::DEGRADED, "ClusterHealthy", ""),
                Cond::yes(condition::READY, "ClusterHealthy", "ok"),
            ],
            Some(1),
            &t(99),
        );
        assert!(same_ignoring_time(&a, &b));
        b[0].message = "changed".into();
        assert!(!same_ignoring_time(&a, &b));
        assert!(!same_ignoring_time(&a, &b[..1]));
    }

    #[test]
    fn state_priority_order() {
        let ready = Cond::yes(condition::READY, "ClusterHealthy", "healthy");
        let not_ready = Cond::no(condition::READY, "MissingReplicas", "1 missing");
        let progressing = Cond::yes(condition::PROGRESSING, "AddingNodes", "meet");
        let idle = Cond::no(condition::PROGRESSING, "ReconcileComplete", "");
        let degraded = Cond::yes(condition::DEGRADED, "PodUnschedulable", "0/3 nodes");
        let healthy = Cond::no(condition::DEGRADED, "ClusterHealthy", "");

        let s = derive_state(&[ready.clone(), idle.clone(), healthy.clone()]);
        assert_eq!(s.0, ClusterState::Ready);
        assert_eq!(s.1.as_deref(), Some("ClusterHealthy"));

        let s = derive_state(&[not_ready.clone(), progressing.clone(), degraded.clone()]);
        assert_eq!(s.0, ClusterState::Degraded);
        assert_eq!(s.1.as_deref(), Some("PodUnschedulable"));
        assert_eq!(s.2.as_deref(), Some("0/3 nodes"));

        let s = derive_state(&[not_ready.clone(), progressing, healthy.clone()]);
        assert_eq!(s.0, ClusterState::Reconciling);
        assert_eq!(s.1.as_deref(), Some("AddingNodes"));

        let s = derive_state(&[not_ready, idle, healthy]);
        assert_eq!(s.0, ClusterState::Failed);
        assert_eq!(s.1.as_deref(), Some("MissingReplicas"));

        assert_eq!(derive_state(&[]).0, ClusterState::Initializing);
    }
}
