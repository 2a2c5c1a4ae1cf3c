//! Pure builders of the Kubernetes objects the operator applies (no I/O).
//!
//! Cluster-level objects (Service, ConfigMap, Secrets, PodDisruptionBudget, ValkeyNodes) are
//! rendered from a [`valkey_api::ValkeyCluster`]; the per-node workload (StatefulSet or
//! Deployment, pod template, PersistentVolumeClaim) from a [`valkey_api::ValkeyNode`].

pub mod acl;
pub mod config_check;
pub mod containers;
pub mod handover;
pub mod names;
pub mod network_policy;
pub mod paths;
pub mod pdb;
pub mod pod;
pub mod probes;
pub mod secrets;
pub mod security;
pub mod service;
pub mod spread;
pub mod start;
pub mod valkey_conf;
pub mod valkeynode;
pub mod workload;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;

/// Controller owner reference to `obj` (for `metadata.ownerReferences` of its children), with
/// `blockOwnerDeletion`: a `propagationPolicy: Foreground` delete of the owner then keeps it
/// until its children (and theirs: ValkeyCluster → ValkeyNode → workload → pod) are gone.
/// `None` when the object has no name or uid yet (not read back from the API server).
pub fn owner_reference<K>(obj: &K) -> Option<OwnerReference>
where
    K: Resource<DynamicType = ()>,
{
    obj.controller_owner_ref(&()).map(|r| OwnerReference {
        block_owner_deletion: Some(true),
        ..r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_reference_is_controller_and_blocks_owner_deletion() {
        let mut vc: valkey_api::ValkeyCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyCluster",
            "metadata": {"name": "c", "namespace": "ns"},
            "spec": {"shards": 1}
        }))
        .unwrap();
        assert!(owner_reference(&vc).is_none(), "no uid yet");
        vc.metadata.uid = Some("u-1".into());
        let r = owner_reference(&vc).unwrap();
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.uid.as_str()),
            ("ValkeyCluster", "c", "u-1")
        );
        assert_eq!(r.api_version, "valkey.io/v1alpha1");
        assert_eq!(r.controller, Some(true));
        assert_eq!(r.block_owner_deletion, Some(true));
    }
}
