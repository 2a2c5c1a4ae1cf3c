//! Pure status computation of a ValkeyNode from its observed pod, workload and claim.
//!
//! `role` is not computed here: the node controller does not talk to Valkey. The ValkeyCluster
//! controller, which scrapes every node anyway, writes `status.role` (a merge patch of that one
//! field); this controller never sends `role`, so the two writers do not overwrite each other.
//! Conditions of other types (`LiveConfigApplied`, `ACLApplied`) are preserved as observed.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use valkey_api::{ValkeyNode, ValkeyNodeStatus};

use super::status_writes::NODE_CONDITIONS;
use crate::render::names;
use crate::render::workload::quantity_bytes;

use valkey_api::status::node_condition as condition;
use valkey_api::status::node_reason as reason;

/// The observed world of one ValkeyNode.
#[derive(Debug, Clone, Default)]
pub struct ObservedNode<'a> {
    /// Its StatefulSet (when `workloadType: StatefulSet`).
    pub statefulset: Option<&'a StatefulSet>,
    /// Its Deployment (when `workloadType: Deployment`).
    pub deployment: Option<&'a Deployment>,
    /// Its current pod (not terminating), if any.
    pub pod: Option<&'a Pod>,
    /// Its claim, if any.
    pub pvc: Option<&'a PersistentVolumeClaim>,
    /// Why the API server refused to grow the claim, when it did.
    pub resize_refused: Option<String>,
    /// A template change is deferred until the workload revision is bumped.
    pub roll_pending: bool,
    /// Workload revision the workload carries (its `valkey.io/workload-revision` annotation).
    pub applied_workload_revision: Option<String>,
    /// Why the workload controller cannot create the pod, when there is no pod
    /// (`node/create_failure.rs`).
    pub create_failure: Option<String>,
}

/// Whether a single-replica StatefulSet has rolled out its current spec.
pub fn statefulset_rolled_out(sts: &StatefulSet) -> bool {
    let Some(st) = &sts.status else {
        return false;
    };
    let generation = sts.metadata.generation.unwrap_or(0);
    st.observed_generation.unwrap_or(0) >= generation
        && st.updated_replicas.unwrap_or(0) >= 1
        && st.ready_replicas.unwrap_or(0) >= 1
        && st.current_revision.is_some()
        && st.current_revision == st.update_revision
}

/// Whether a single-replica Deployment has rolled out its current spec.
pub fn deployment_rolled_out(d: &Deployment) -> bool {
    let Some(st) = &d.status else {
        return false;
    };
    let generation = d.metadata.generation.unwrap_or(0);
    st.observed_generation.unwrap_or(0) >= generation
        && st.updated_replicas.unwrap_or(0) >= 1
        && st.ready_replicas.unwrap_or(0) >= 1
        && st.replicas.unwrap_or(0) == st.updated_replicas.unwrap_or(0)
}

/// Whether the pod's `Ready` condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn pod_message(pod: Option<&Pod>) -> String {
    let Some(pod) = pod else {
        return "pod does not exist yet".to_owned();
    };
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    // The scheduler's or kubelet's explanation, when there is one.
    let detail = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| {
            cs.iter().find(|c| {
                c.status == "False" && c.message.as_deref().is_some_and(|m| !m.is_empty())
            })
        })
        .map(|c| {
            format!(
                ": {} {}",
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
        .unwrap_or_default();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Unknown");
    format!("pod {name} is {phase} and not ready{detail}")
}

struct Conditions<'a> {
    previous: &'a [Condition],
    out: Vec<Condition>,
    generation: Option<i64>,
    now: &'a Time,
}

impl Conditions<'_> {
    fn set(&mut self, type_: &str, status: bool, reason: &str, message: String) {
        let status = if status { "True" } else { "False" }.to_owned();
        let last_transition_time = self
            .previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| self.now.clone(), |c| c.last_transition_time.clone());
        self.out.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message,
            observed_generation: self.generation,
            last_transition_time,
        });
    }
}

/// Whether the claim's allocated size covers `desired`.
fn size_satisfied(pvc: &PersistentVolumeClaim, desired: &str) -> Option<bool> {
    let cap = pvc.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    Some(quantity_bytes(&cap.0)? >= quantity_bytes(desired)?)
}

fn pvc_resize_state(pvc: &PersistentVolumeClaim, desired: &str) -> (bool, &'static str, String) {
    let name = pvc.metadata.name.as_deref().unwrap_or_default();
    let status = pvc.status.as_ref();
    let infeasible = status
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .and_then(|m| m.get("storage"))
        .is_some_and(|s| s.contains("Infeasible"));
    if infeasible {
        return (
            false,
            reason::PVC_RESIZE_INFEASIBLE,
            format!("resizing {name} to {desired} is infeasible"),
        );
    }
    if size_satisfied(pvc, desired) == Some(true) {
        return (
            true,
            reason::PVC_SIZE_SATISFIED,
            format!("{name} has at least {desired}"),
        );
    }
    let resizing = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.status == "True"
                    && (c.type_ == "Resizing"
                        || c.type_ == "FileSystemResizePending"
                        || c.type_ == "ControllerResizeError"
                        || c.type_ == "NodeResizeError")
            })
        })
        || status
            .and_then(|s| s.allocated_resource_statuses.as_ref())
            .is_some_and(|m| m.contains_key("storage"));
    if resizing {
        (
            false,
            reason::PVC_RESIZE_IN_PROGRESS,
            format!("{name} is being resized to {desired}"),
        )
    } else {
        (
            false,
            reason::PVC_RESIZE_PENDING,
            format!("{name} does not have {desired} yet"),
        )
    }
}

/// The status of `node` for the observed world. Conditions keep their `lastTransitionTime`
/// while their status is unchanged, so an unchanged world computes an equal status.
pub fn compute_status(
    node: &ValkeyNode,
    observed: &ObservedNode<'_>,
    now: &Time,
) -> ValkeyNodeStatus {
    let previous = node.status.clone().unwrap_or_default();
    let generation = node.metadata.generation;
    let mut conds = Conditions {
        previous: &previous.conditions,
        out: Vec::new(),
        generation,
        now,
    };
    let node_name = node.metadata.name.as_deref().unwrap_or_default();
    let pvc_name = names::pvc_name(node_name);

    let mut pvc_bound = true;
    if let Some(persistence) = &node.spec.persistence {
        let phase = observed
            .pvc
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref());
        pvc_bound = phase == Some("Bound");
        if pvc_bound {
            conds.set(
                condition::PVC_READY,
                true,
                reason::PVC_BOUND,
                format!("{pvc_name} is bound"),
            );
        } else {
            conds.set(
                condition::PVC_READY,
                false,
                reason::PVC_PENDING,
                format!("{pvc_name} is {}", phase.unwrap_or("not created yet")),
            );
        }
        let (ok, why, msg) = match observed.pvc {
            Some(_) if pvc_bound && observed.resize_refused.is_some() => (
                false,
                reason::PVC_RESIZE_INFEASIBLE,
                format!(
                    "{pvc_name} cannot grow to {}: {}",
                    persistence.size,
                    observed.resize_refused.as_deref().unwrap_or_default()
                ),
            ),
            Some(pvc) if pvc_bound => pvc_resize_state(pvc, &persistence.size),
            _ => (
                false,
                reason::PVC_RESIZE_PENDING,
                format!("{pvc_name} is not bound yet"),
            ),
        };
        conds.set(condition::PVC_SIZE_READY, ok, why, msg);
    }

    let rolled_out = observed.statefulset.is_some_and(statefulset_rolled_out)
        || observed.deployment.is_some_and(deployment_rolled_out);
    let ready_pod = observed.pod.is_some_and(pod_ready);
    let ready = pvc_bound && ready_pod && rolled_out;
    if !pvc_bound {
        conds.set(
            condition::READY,
            false,
            reason::PVC_PENDING,
            format!("waiting for {pvc_name} to be bound"),
        );
    } else if let (None, Some(why)) = (observed.pod, &observed.create_failure) {
        conds.set(
            condition::READY,
            false,
            reason::POD_CREATION_FAILED,
            format!("the pod cannot be created: {why}"),
        );
    } else if ready {
        let pod = observed.pod.and_then(|p| p.metadata.name.as_deref());
        conds.set(
            condition::READY,
            true,
            reason::POD_RUNNING,
            format!("pod {} is ready", pod.unwrap_or_default()),
        );
    } else {
        let msg = if ready_pod {
            "workload is rolling out".to_owned()
        } else {
            pod_message(observed.pod)
        };
        conds.set(condition::READY, false, reason::POD_NOT_READY, msg);
    }
    if observed.roll_pending {
        conds.set(
            condition::WORKLOAD_ROLL_PENDING,
            true,
            reason::AWAITING_WORKLOAD_REVISION,
            "the pod template changed; waiting for the ValkeyCluster controller to bump \
             spec.workloadRevision"
                .to_owned(),
        );
    }
    let mut conditions: Vec<Condition> = previous
        .conditions
        .iter()
        .filter(|c| !NODE_CONDITIONS.contains(&c.type_.as_str()))
        .cloned()
        .collect();
    conditions.extend(conds.out);
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));

    let pod = observed.pod;
    ValkeyNodeStatus {
        ready,
        role: previous.role.clone(),
        pod_name: pod.and_then(|p| p.metadata.name.clone()),
        pod_ip: pod
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.pod_ip.clone())
            .filter(|ip| !ip.is_empty()),
        applied_workload_revision: observed.applied_workload_revision.clone(),
        observed_generation: generation,
        // Written by the cluster controller's live-settings pass.
        live_config_keys: previous.live_config_keys.clone(),
        system_users_digest: previous.system_users_digest.clone(),
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::valkeynode::tests::cluster;
    use crate::render::valkeynode::{NodeInputs, valkey_node};

    fn now() -> Time {
        Time("2026-01-01T00:00:00Z".parse().unwrap())
    }

    fn later() -> Time {
        Time("2026-01-01T00:05:00Z".parse().unwrap())
    }

    fn node(json: serde_json::Value) -> ValkeyNode {
        let mut n = valkey_node(&cluster(json), 0, 0, &NodeInputs::default(), None);
        n.metadata.generation = Some(3);
        n
    }

    fn ready_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "valkey-c-0-0-0"},
            "status": {"phase": "Running", "podIP": "10.0.0.5",
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap()
    }

    fn rolled_sts() -> StatefulSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "valkey-c-0-0", "generation": 2},
            "spec": {"selector": {}, "template": {}, "serviceName": "valkey-c"},
            "status": {"replicas": 1, "observedGeneration": 2, "updatedReplicas": 1, "readyReplicas": 1,
                       "currentRevision": "r1", "updateRevision": "r1"}
        }))
        .unwrap()
    }

    fn cond<'a>(s: &'a ValkeyNodeStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn ready_when_pod_ready_and_rolled_out() {
        let n = node(serde_json::json!({"shards": 1}));
        let (pod, sts) = (ready_pod(), rolled_sts());
        let obs = ObservedNode {
            statefulset: Some(&sts),
            pod: Some(&pod),
            ..Default::default()
        };
        let s = compute_status(&n, &obs, &now());
        assert!(s.ready);
        assert_eq!(s.pod_name.as_deref(), Some("valkey-c-0-0-0"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.0.0.5"));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(cond(&s, "Ready").reason, "PodRunning");
        assert!(
            s.conditions
                .iter()
                .all(|c| c.type_ != "PersistentVolumeClaimReady")
        );
    }

    #[test]
    fn not_rolled_out_or_pod_pending_is_not_ready() {
        let n = node(serde_json::json!({"shards": 1}));
        let pod = ready_pod();
        let mut sts = rolled_sts();
        sts.status.as_mut().unwrap().update_revision = Some("r2".into());
        let s = compute_status(
            &n,
            &ObservedNode {
                statefulset: Some(&sts),
                pod: Some(&pod),
                ..Default::default()
            },
            &now(),
        );
        assert!(!s.ready);
        assert_eq!(cond(&s, "Ready").reason, "PodNotReady");
        let pending: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                "reason": "Unschedulable", "message": "0/3 nodes are available"}]}
        }))
        .unwrap();
        let s = compute_status(
            &n,
            &ObservedNode {
                statefulset: Some(&rolled_sts()),
                pod: Some(&pending),
                ..Default::default()
            },
            &now(),
        );
        assert!(
            cond(&s, "Ready")
                .message
                .contains("Unschedulable 0/3 nodes are available")
        );
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let mut n = node(serde_json::json!({"shards": 1}));
        let (pod, sts) = (ready_pod(), rolled_sts());
        let obs = ObservedNode {
            statefulset: Some(&sts),
            pod: Some(&pod),
            ..Default::default()
        };
        let first = compute_status(&n, &obs, &now());
        n.status = Some(first.clone());
        let second = compute_status(&n, &obs, &later());
        assert_eq!(
            first, second,
            "an unchanged world must not produce a status write"
        );
        let none = ObservedNode::default();
        let third = compute_status(&n, &none, &later());
        assert_eq!(cond(&third, "Ready").last_transition_time, later());
    }

    #[test]
    fn pvc_conditions() {
        let n = node(serde_json::json!({"shards": 1, "persistence": {"size": "2Gi"}}));
        let (pod, sts) = (ready_pod(), rolled_sts());
        let pvc = |json: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(json).unwrap()
        };
        let pending =
            pvc(serde_json::json!({"metadata": {"name": "x"}, "status": {"phase": "Pending"}}));
        let s = compute_status(
            &n,
            &ObservedNode {
                statefulset: Some(&sts),
                pod: Some(&pod),
                pvc: Some(&pending),
                ..Default::default()
            },
            &now(),
        );
        assert!(!s.ready);
        assert_eq!(cond(&s, "Ready").reason, "PersistentVolumeClaimPending");
        assert_eq!(
            cond(&s, "PersistentVolumeClaimReady").reason,
            "PersistentVolumeClaimPending"
        );
        let small = pvc(serde_json::json!({"metadata": {"name": "x"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}}));
        let s = compute_status(
            &n,
            &ObservedNode {
                statefulset: Some(&sts),
                pod: Some(&pod),
                pvc: Some(&small),
                ..Default::default()
            },
            &now(),
        );
        assert!(s.ready);
        assert_eq!(
            cond(&s, "PersistentVolumeClaimSizeReady").reason,
            "PersistentVolumeClaimResizePending"
        );
        let resizing = pvc(serde_json::json!({"metadata": {"name": "x"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "conditions": [{"type": "Resizing", "status": "True"}]}}));
        let s = compute_status(
            &n,
            &ObservedNode {
                pvc: Some(&resizing),
                ..Default::default()
            },
            &now(),
        );
        assert_eq!(
            cond(&s, "PersistentVolumeClaimSizeReady").reason,
            "PersistentVolumeClaimResizeInProgress"
        );
        let infeasible = pvc(serde_json::json!({"metadata": {"name": "x"},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "allocatedResourceStatuses": {"storage": "ControllerResizeInfeasible"}}}));
        let s = compute_status(
            &n,
            &ObservedNode {
                pvc: Some(&infeasible),
                ..Default::default()
            },
            &now(),
        );
        assert_eq!(
            cond(&s, "PersistentVolumeClaimSizeReady").reason,
            "PersistentVolumeClaimResizeInfeasible"
        );
        let big = pvc(serde_json::json!({"metadata": {"name": "x"},
            "status": {"phase": "Bound", "capacity": {"storage": "2048Mi"}}}));
        let s = compute_status(
            &n,
            &ObservedNode {
                pvc: Some(&big),
                ..Default::default()
            },
            &now(),
        );
        assert_eq!(
            cond(&s, "PersistentVolumeClaimSizeReady").reason,
            "PersistentVolumeClaimSizeSatisfied"
        );
        assert_eq!(
            cond(&s, "PersistentVolumeClaimReady").reason,
            "PersistentVolumeClaimBound"
        );
    }

    #[test]
    fn foreign_conditions_and_role_are_preserved() {
        let mut n = node(serde_json::json!({"shards": 1}));
        n.status = Some(ValkeyNodeStatus {
            role: Some("primary".into()),
            conditions: vec![Condition {
                type_: "ACLApplied".into(),
                status: "True".into(),
                reason: "Applied".into(),
                message: String::new(),
                observed_generation: Some(3),
                last_transition_time: now(),
            }],
            ..Default::default()
        });
        let s = compute_status(
            &n,
            &ObservedNode {
                roll_pending: true,
                ..Default::default()
            },
            &later(),
        );
        assert_eq!(s.role.as_deref(), Some("primary"));
        assert_eq!(cond(&s, "ACLApplied").reason, "Applied");
        assert_eq!(
            cond(&s, "WorkloadRollPending").reason,
            "AwaitingWorkloadRevision"
        );
    }
}
