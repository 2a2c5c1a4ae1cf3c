//! Every write to a ValkeyNode's status: server-side apply, one field manager per owner. The
//! node controller owns what the pod and its workload show (`ready`, `podName`, `podIP`,
//! `appliedWorkloadRevision`, `observedGeneration` and its conditions); the cluster controller
//! owns what the server shows (`role`, `liveConfigKeys`, `systemUsersDigest` and the
//! live-change conditions). The conditions list is a map keyed by type, so neither owner
//! overwrites the other's conditions; a field an owner leaves out of its apply is removed, so
//! each apply carries all of that owner's fields.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use valkey_api::labels::{CLUSTER_FIELD_MANAGER, NODE_FIELD_MANAGER};
use valkey_api::status::node_condition::{
    ACL_APPLIED, LIVE_CONFIG_APPLIED, PVC_READY, PVC_SIZE_READY, READY, TLS_CERTIFICATE_APPLIED,
    WORKLOAD_ROLL_PENDING,
};
use valkey_api::{ValkeyNode, ValkeyNodeStatus};

/// Condition types the node controller writes.
pub const NODE_CONDITIONS: [&str; 4] = [READY, PVC_READY, PVC_SIZE_READY, WORKLOAD_ROLL_PENDING];

/// Condition types the cluster controller writes (live settings, ACL, TLS).
pub const LIVE_CONDITIONS: [&str; 3] = [LIVE_CONFIG_APPLIED, ACL_APPLIED, TLS_CERTIFICATE_APPLIED];

/// The status fields the cluster controller owns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterFields {
    /// `role`.
    pub role: Option<String>,
    /// `liveConfigKeys`.
    pub live_config_keys: Vec<String>,
    /// `systemUsersDigest`.
    pub system_users_digest: Option<String>,
    /// The live-change conditions (others are left out).
    pub conditions: Vec<Condition>,
}

impl ClusterFields {
    /// The cluster controller's fields of `node` as they are.
    pub fn of(node: &ValkeyNode) -> Self {
        let s = node.status.clone().unwrap_or_default();
        Self {
            role: s.role,
            live_config_keys: s.live_config_keys,
            system_users_digest: s.system_users_digest,
            conditions: s.conditions,
        }
    }
}

/// The node controller's fields of `status`: the other owner's fields emptied, its own
/// conditions in type order.
fn node_fields(status: &ValkeyNodeStatus) -> ValkeyNodeStatus {
    let mut conditions = owned(&status.conditions, &NODE_CONDITIONS);
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    ValkeyNodeStatus {
        role: None,
        live_config_keys: Vec::new(),
        system_users_digest: None,
        conditions,
        ..status.clone()
    }
}

/// Whether the node controller's fields of `desired` differ from those of `current`
/// (conditions compared by type, not by the order the API server keeps them in). A status
/// equal in content is not written again: a reconcile that runs on a cached object one
/// write behind would otherwise write that older content back, and each write starts
/// another reconcile.
pub fn node_fields_changed(current: Option<&ValkeyNodeStatus>, desired: &ValkeyNodeStatus) -> bool {
    current.map(node_fields) != Some(node_fields(desired))
}

/// Applies the node controller's fields of `status` to the ValkeyNode `name`.
pub async fn apply_node_fields(
    api: &Api<ValkeyNode>,
    name: &str,
    status: &ValkeyNodeStatus,
) -> Result<(), kube::Error> {
    apply(api, name, NODE_FIELD_MANAGER, &node_fields(status)).await
}

/// Applies the cluster controller's `fields` to the ValkeyNode `name`.
pub async fn apply_cluster_fields(
    api: &Api<ValkeyNode>,
    name: &str,
    fields: &ClusterFields,
) -> Result<(), kube::Error> {
    let mut value = serde_json::json!({
        "conditions": owned(&fields.conditions, &LIVE_CONDITIONS),
        "liveConfigKeys": fields.live_config_keys,
    });
    if let Some(role) = &fields.role {
        value["role"] = role.clone().into();
    }
    if let Some(d) = &fields.system_users_digest {
        value["systemUsersDigest"] = d.clone().into();
    }
    apply(api, name, CLUSTER_FIELD_MANAGER, &value).await
}

fn owned(conditions: &[Condition], types: &[&str]) -> Vec<Condition> {
    conditions
        .iter()
        .filter(|c| types.contains(&c.type_.as_str()))
        .cloned()
        .collect()
}

async fn apply(
    api: &Api<ValkeyNode>,
    name: &str,
    manager: &str,
    status: &impl serde::Serialize,
) -> Result<(), kube::Error> {
    let body = serde_json::json!({
        "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
        "metadata": { "name": name },
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn cond(type_: &str, at: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: "R".into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(at.parse().unwrap()),
        }
    }

    #[test]
    fn only_a_change_of_the_node_fields_is_written() {
        let t = "2026-01-01T00:00:00Z";
        let stored = ValkeyNodeStatus {
            ready: true,
            role: Some("primary".into()),
            conditions: vec![cond(READY, t), cond(ACL_APPLIED, t), cond(PVC_READY, t)],
            ..Default::default()
        };
        // The same content in type order, without the cluster controller's fields.
        let same = ValkeyNodeStatus {
            ready: true,
            conditions: vec![cond(PVC_READY, t), cond(READY, t)],
            ..Default::default()
        };
        assert!(!node_fields_changed(Some(&stored), &same));
        let later = ValkeyNodeStatus {
            conditions: vec![cond(PVC_READY, t), cond(READY, "2026-01-01T00:00:04Z")],
            ..same.clone()
        };
        assert!(node_fields_changed(Some(&stored), &later));
        assert!(node_fields_changed(None, &same));
    }
}
