//! Events derived from status transitions, so each is emitted once per transition rather than on
//! every pass (pure).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use valkey_api::ValkeyClusterStatus;
use valkey_api::status::{ShardStatus, condition, event};

use super::assess::{POD_CREATION_FAILED_PREFIX, reason};
use super::conditions::{find, is_true};
use crate::cluster::plan::failover::FAILOVER_STUCK;
use crate::cluster::plan::rebalance::NOT_ENOUGH_MEMORY;

/// An event to publish on the ValkeyCluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// CamelCase reason from the status contract.
    pub reason: &'static str,
    /// What the operator did or observed (CamelCase).
    pub action: &'static str,
    /// Human-readable note.
    pub note: String,
}

impl EventSpec {
    /// A Normal event.
    pub fn normal(reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        Self {
            warning: false,
            reason,
            action,
            note: note.into(),
        }
    }

    /// A Warning event.
    pub fn warning(reason: &'static str, action: &'static str, note: impl Into<String>) -> Self {
        Self {
            warning: true,
            reason,
            action,
            note: note.into(),
        }
    }
}

/// A Warning event's reason and action.
type Warning = (&'static str, &'static str);

/// The new `type_` condition when it has `status` and `reports` something, unless the old one
/// reported it already (with the same message, when `per_message`).
fn newly<'a>(
    old: &[Condition],
    new: &'a [Condition],
    type_: &str,
    status: &str,
    reports: &dyn Fn(&Condition) -> bool,
    per_message: bool,
) -> Option<&'a Condition> {
    let c = find(new, type_).filter(|c| c.status == status && reports(c))?;
    let was = find(old, type_).is_some_and(|o| {
        o.status == status && reports(o) && (!per_message || o.message == c.message)
    });
    (!was).then_some(c)
}

fn entered(old: &[Condition], new: &[Condition], type_: &str) -> bool {
    is_true(new, type_) && !is_true(old, type_)
}

/// Events for the transitions between the previous and the new status: `ClusterReady` when
/// Ready turns True, `InvalidConfig`, `ResizeInfeasible` or `GracePeriodTooShort` when
/// ConfigurationWarning turns True or its message changes,
/// `PodUnschedulable` when the cluster becomes Degraded for that reason, `InvalidTLSSecret`
/// when the TLS Secret becomes unusable (or unusable in another way), `PodCreationFailed` when
/// the cluster becomes Degraded because a pod cannot be created, `ShardRestarted` when
/// every copy of a shard was down at once (each time anew), `UsersACLError` when a
/// user is held out of the ACL file (or another problem is), `DrainFailed` when a
/// drain is held back for lack of memory, `FailoverFailed` when a shard's failover is stuck (see
/// [`FAILOVER_STUCK`]), and
/// `FailoverCompleted` for every shard whose primary pod changed.
pub fn transition_events(
    old: Option<&ValkeyClusterStatus>,
    new: &ValkeyClusterStatus,
) -> Vec<EventSpec> {
    let empty = ValkeyClusterStatus::default();
    let old = old.unwrap_or(&empty);
    let (oc, nc) = (&old.conditions, &new.conditions);
    let mut out = Vec::new();
    if entered(oc, nc, condition::READY) {
        out.push(EventSpec::normal(
            event::CLUSTER_READY,
            "Reconcile",
            find(nc, condition::READY).map_or_else(String::new, |c| c.message.clone()),
        ));
    }
    // A configuration warning is an event when it appears or says something new.
    if let Some(c) = find(nc, condition::CONFIGURATION_WARNING).filter(|c| c.status == "True")
        && !find(oc, condition::CONFIGURATION_WARNING)
            .is_some_and(|o| o.status == "True" && o.reason == c.reason && o.message == c.message)
    {
        let r = match c.reason.as_str() {
            reason::INVALID_CONFIG => Some(event::INVALID_CONFIG),
            reason::RESIZE_INFEASIBLE => Some(event::RESIZE_INFEASIBLE),
            reason::GRACE_PERIOD_TOO_SHORT => Some(event::GRACE_PERIOD_TOO_SHORT),
            reason::USER_CAN_CHANGE_ACLS => Some(event::USER_CAN_CHANGE_ACLS),
            _ => None,
        };
        out.extend(r.map(|r| EventSpec::warning(r, "Validate", c.message.clone())));
    }
    let mut warn = |type_: &str,
                    status: &str,
                    reports: &dyn Fn(&Condition) -> bool,
                    per_message: bool,
                    (reason, action): Warning| {
        if let Some(c) = newly(oc, nc, type_, status, reports, per_message) {
            out.push(EventSpec::warning(reason, action, c.message.clone()));
        }
    };
    let (degraded, ready, formed) = (
        condition::DEGRADED,
        condition::READY,
        condition::CLUSTER_FORMED,
    );
    let is = |r: &'static str| move |c: &Condition| c.reason == r;
    let starts = |r: &'static str, prefix: &'static str| {
        move |c: &Condition| c.reason == r && c.message.starts_with(prefix)
    };
    warn(
        ready,
        "False",
        &is(reason::PODS_UNREACHABLE),
        false,
        (event::PODS_UNREACHABLE, "Observe"),
    );
    warn(
        degraded,
        "True",
        &starts(reason::REBALANCE_FAILED, NOT_ENOUGH_MEMORY),
        false,
        (event::DRAIN_FAILED, "PreflightDrain"),
    );
    warn(
        degraded,
        "True",
        &is(reason::INVALID_TLS_SECRET),
        true,
        (event::INVALID_TLS_SECRET, "Validate"),
    );
    warn(
        degraded,
        "True",
        &starts(reason::NODE_ADD_FAILED, POD_CREATION_FAILED_PREFIX),
        false,
        (event::POD_CREATION_FAILED, "CreatePod"),
    );
    warn(
        degraded,
        "True",
        &is(reason::SHARD_RESTARTED),
        true,
        (event::SHARD_RESTARTED, "Observe"),
    );
    warn(
        ready,
        "False",
        &is(reason::USERS_ACL_ERROR),
        true,
        (event::USERS_ACL_ERROR, "Validate"),
    );
    warn(
        degraded,
        "True",
        &is(reason::POD_UNSCHEDULABLE),
        false,
        (event::POD_UNSCHEDULABLE, "Schedule"),
    );
    warn(
        formed,
        "False",
        &|c: &Condition| c.message.starts_with(FAILOVER_STUCK),
        false,
        (event::FAILOVER_FAILED, "WaitForFailover"),
    );
    out.extend(failovers(&old.shard_statuses, &new.shard_statuses));
    out
}

fn failovers(old: &[ShardStatus], new: &[ShardStatus]) -> Vec<EventSpec> {
    new.iter()
        .filter_map(|n| {
            let o = old.iter().find(|o| o.index == n.index)?;
            let after = n.primary_pod.as_deref()?;
            let note = match o.primary_pod.as_deref() {
                Some(before) if before != after => {
                    format!(
                        "shard {}: primary moved from pod {before} to pod {after}",
                        n.index
                    )
                }
                // The shard had slots but no live primary (its primary failed): a replica
                // has taken the slots over.
                None if !o.slots.is_empty() => {
                    format!("shard {}: pod {after} took over as primary", n.index)
                }
                _ => return None,
            };
            Some(EventSpec::normal(
                event::FAILOVER_COMPLETED,
                "ObserveFailover",
                note,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::conditions::{Cond, merge};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn status(conds: &[Cond], shards: &[(i32, &str)]) -> ValkeyClusterStatus {
        ValkeyClusterStatus {
            conditions: merge(&[], conds, Some(1), &Time(Timestamp::UNIX_EPOCH)),
            shard_statuses: shards
                .iter()
                .map(|(i, p)| ShardStatus {
                    index: *i,
                    primary_pod: Some((*p).to_owned()),
                    ..ShardStatus::default()
                })
                .collect(),
            ..ValkeyClusterStatus::default()
        }
    }

    fn reasons(e: &[EventSpec]) -> Vec<&str> {
        e.iter().map(|e| e.reason).collect()
    }

    #[test]
    fn ready_event_once() {
        let not_ready = status(&[Cond::no("Ready", "MissingReplicas", "")], &[]);
        let ready = status(&[Cond::yes("Ready", "ClusterHealthy", "ok")], &[]);
        assert_eq!(
            reasons(&transition_events(Some(&not_ready), &ready)),
            ["ClusterReady"]
        );
        assert!(transition_events(Some(&ready), &ready).is_empty());
        assert_eq!(reasons(&transition_events(None, &ready)), ["ClusterReady"]);
    }

    #[test]
    fn grace_period_warning_once_when_entering() {
        let warn = Cond::yes("ConfigurationWarning", "GracePeriodTooShort", "5 < 30");
        let before = status(&[], &[]);
        let after = status(std::slice::from_ref(&warn), &[]);
        let e = transition_events(Some(&before), &after);
        assert_eq!(reasons(&e), ["GracePeriodTooShort"]);
        assert!(e[0].warning);
        assert!(transition_events(Some(&after), &after).is_empty());
    }

    #[test]
    fn drain_failed_once_when_a_drain_is_held_back() {
        let ok = status(&[Cond::no("Degraded", "Reconciling", "")], &[]);
        let msg = |m: &str| format!("{NOT_ENOUGH_MEMORY} shard(s) 3: {m} missing");
        let no_room = status(
            &[Cond::yes("Degraded", "RebalanceFailed", msg("15 MiB"))],
            &[],
        );
        let still = status(
            &[Cond::yes("Degraded", "RebalanceFailed", msg("14 MiB"))],
            &[],
        );
        let e = transition_events(Some(&ok), &no_room);
        assert_eq!(reasons(&e), ["DrainFailed"]);
        assert!(e[0].warning && e[0].note.contains("15 MiB"));
        assert!(transition_events(Some(&no_room), &still).is_empty());
        // A failed migration step is Degraded too, but its event comes from the step.
        let step = status(
            &[Cond::yes("Degraded", "RebalanceFailed", "MIGRATE: timeout")],
            &[],
        );
        assert!(transition_events(Some(&ok), &step).is_empty());
    }

    #[test]
    fn invalid_tls_secret_once_per_problem() {
        let ok = status(&[Cond::no("Degraded", "ClusterHealthy", "")], &[]);
        let expired = status(
            &[Cond::yes(
                "Degraded",
                "InvalidTLSSecret",
                "tls.crt has expired",
            )],
            &[],
        );
        let mismatch = status(
            &[Cond::yes("Degraded", "InvalidTLSSecret", "a CA mismatch")],
            &[],
        );
        let e = transition_events(Some(&ok), &expired);
        assert_eq!(reasons(&e), ["InvalidTLSSecret"]);
        assert!(transition_events(Some(&expired), &expired).is_empty());
        assert_eq!(
            reasons(&transition_events(Some(&expired), &mismatch)),
            ["InvalidTLSSecret"]
        );
    }

    #[test]
    fn pod_creation_failed_once_per_entry() {
        let ok = status(&[Cond::no("Degraded", "ClusterHealthy", "")], &[]);
        let bad = |m: &str| {
            status(
                &[Cond::yes(
                    "Degraded",
                    "NodeAddFailed",
                    format!("{POD_CREATION_FAILED_PREFIX}{m}"),
                )],
                &[],
            )
        };
        assert_eq!(
            reasons(&transition_events(Some(&ok), &bad("a"))),
            ["PodCreationFailed"]
        );
        assert!(transition_events(Some(&bad("a")), &bad("b")).is_empty());
        let meet = status(
            &[Cond::yes("Degraded", "NodeAddFailed", "MEET failed")],
            &[],
        );
        assert!(transition_events(Some(&ok), &meet).is_empty());
    }

    #[test]
    fn shard_restarted_once_per_occurrence() {
        let ok = status(&[Cond::no("Degraded", "ClusterHealthy", "")], &[]);
        let lost = |at: &str| {
            status(
                &[Cond::yes(
                    "Degraded",
                    "ShardRestarted",
                    format!("shard 0 at {at}"),
                )],
                &[],
            )
        };
        assert_eq!(
            reasons(&transition_events(Some(&ok), &lost("08:00"))),
            ["ShardRestarted"]
        );
        assert!(transition_events(Some(&lost("08:00")), &lost("08:00")).is_empty());
        assert_eq!(
            reasons(&transition_events(Some(&lost("08:00")), &lost("09:00"))),
            ["ShardRestarted"]
        );
        assert!(transition_events(Some(&lost("08:00")), &ok).is_empty());
    }

    #[test]
    fn unschedulable_once_per_entry() {
        let ok = status(&[Cond::no("Degraded", "ClusterHealthy", "")], &[]);
        let bad = status(
            &[Cond::yes("Degraded", "PodUnschedulable", "0/3 nodes")],
            &[],
        );
        let bad2 = status(
            &[Cond::yes("Degraded", "PodUnschedulable", "0/6 nodes")],
            &[],
        );
        assert_eq!(
            reasons(&transition_events(Some(&ok), &bad)),
            ["PodUnschedulable"]
        );
        assert!(transition_events(Some(&bad), &bad2).is_empty());
    }

    #[test]
    fn failover_observed_from_shard_primary_change() {
        let a = status(&[], &[(0, "p-0-0"), (1, "p-1-0")]);
        let b = status(&[], &[(0, "p-0-1"), (1, "p-1-0")]);
        let e = transition_events(Some(&a), &b);
        assert_eq!(reasons(&e), ["FailoverCompleted"]);
        assert!(e[0].note.contains("shard 0"));
        assert!(transition_events(Some(&b), &b).is_empty());
    }

    #[test]
    fn failover_observed_after_a_shard_was_without_primary() {
        let mut orphaned = status(&[], &[(0, "p-0-0")]);
        orphaned.shard_statuses[0].primary_pod = None;
        orphaned.shard_statuses[0].slots = vec!["0-8191".into()];
        let after = status(&[], &[(0, "p-0-1")]);
        assert_eq!(
            reasons(&transition_events(Some(&orphaned), &after)),
            ["FailoverCompleted"]
        );
        // A new shard getting its first primary is no failover.
        orphaned.shard_statuses[0].slots.clear();
        assert!(transition_events(Some(&orphaned), &after).is_empty());
    }
}
