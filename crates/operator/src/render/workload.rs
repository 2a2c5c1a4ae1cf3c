//! The single-replica workload (StatefulSet or Deployment) and PersistentVolumeClaim of a
//! ValkeyNode.
//!
//! StatefulSets use `updateStrategy: RollingUpdate` and Deployments `strategy: Recreate`: the
//! ValkeyNode controller only writes a changed pod template once the ValkeyCluster controller
//! has authorized the roll (`spec.workloadRevision`), so the workload controller executing it
//! at once is what we want, and both kinds behave the same. `podManagementPolicy: Parallel`
//! avoids the ordered-ready wait that can stall a single-replica StatefulSet on a broken pod.
//! The claim is not a `volumeClaimTemplate` but a separate object, so the operator controls
//! its lifetime (Retain / Delete) and its size.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, StatefulSet, StatefulSetSpec,
    StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodTemplateSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::ResourceExt;
use sha2::{Digest, Sha256};
use valkey_api::labels::WORKLOAD_REVISION_ANNOTATION;
use valkey_api::{ValkeyNode, WorkloadType};

use super::containers::MergeError;
use super::{names, pod};

/// Annotation on the workload with the hash of its pod template (to detect template changes
/// without comparing defaulted objects).
pub const TEMPLATE_HASH_ANNOTATION: &str = "valkey.io/template-hash";

/// A rendered workload.
#[derive(Debug, Clone, PartialEq)]
pub enum Workload {
    /// `workloadType: StatefulSet`.
    StatefulSet(Box<StatefulSet>),
    /// `workloadType: Deployment`.
    Deployment(Box<Deployment>),
}

impl Workload {
    /// The pod template hash carried by the workload.
    pub fn template_hash(&self) -> Option<&str> {
        let meta = match self {
            Workload::StatefulSet(s) => &s.metadata,
            Workload::Deployment(d) => &d.metadata,
        };
        meta.annotations
            .as_ref()?
            .get(TEMPLATE_HASH_ANNOTATION)
            .map(String::as_str)
    }
}

/// Hex SHA-256 (16 digits) of a pod template's JSON form.
pub fn template_hash(template: &PodTemplateSpec) -> String {
    let json = serde_json::to_vec(template).unwrap_or_default();
    hex::encode(Sha256::digest(json))[..16].to_owned()
}

fn metadata(node: &ValkeyNode, hash: &str, owner: Option<OwnerReference>) -> ObjectMeta {
    let s = &node.spec;
    let mut annotations = BTreeMap::from([(TEMPLATE_HASH_ANNOTATION.to_owned(), hash.to_owned())]);
    if let Some(rev) = &s.workload_revision {
        annotations.insert(WORKLOAD_REVISION_ANNOTATION.to_owned(), rev.clone());
    }
    ObjectMeta {
        name: Some(names::workload_name(&node.name_any())),
        namespace: node.namespace(),
        labels: Some(names::node_labels(
            &s.cluster_name,
            s.shard_index,
            s.node_index,
        )),
        annotations: Some(annotations),
        owner_references: owner.map(|o| vec![o]),
        ..Default::default()
    }
}

/// The StatefulSet or Deployment `valkey-<node>` with one replica.
pub fn workload(node: &ValkeyNode, owner: Option<OwnerReference>) -> Result<Workload, MergeError> {
    let s = &node.spec;
    let template = pod::pod_template(&node.name_any(), s)?;
    let hash = template_hash(&template);
    let selector = LabelSelector {
        match_labels: Some(names::node_selector_labels(
            &s.cluster_name,
            s.shard_index,
            s.node_index,
        )),
        ..Default::default()
    };
    let metadata = metadata(node, &hash, owner);
    Ok(match s.workload_type {
        WorkloadType::StatefulSet => Workload::StatefulSet(Box::new(StatefulSet {
            metadata,
            spec: StatefulSetSpec {
                replicas: Some(1),
                service_name: Some(names::service_name(&s.cluster_name)),
                pod_management_policy: Some("Parallel".into()),
                update_strategy: Some(StatefulSetUpdateStrategy {
                    type_: Some("RollingUpdate".into()),
                    ..Default::default()
                }),
                selector,
                template,
                ..Default::default()
            },
            status: None,
        })),
        WorkloadType::Deployment => Workload::Deployment(Box::new(Deployment {
            metadata,
            spec: DeploymentSpec {
                replicas: Some(1),
                strategy: Some(DeploymentStrategy {
                    type_: Some("Recreate".into()),
                    ..Default::default()
                }),
                selector,
                template,
                ..Default::default()
            },
            status: None,
        })),
    })
}

/// The PersistentVolumeClaim `valkey-<node>-data` when the node has persistence, requesting
/// `size` (the caller passes the larger of the desired and the current size, since a claim
/// never shrinks). It carries no owner reference: Retain keeps it after the node is deleted,
/// Delete is carried out by the ValkeyNode controller's finalizer.
pub fn pvc(node: &ValkeyNode, size: Option<&str>) -> Option<PersistentVolumeClaim> {
    let s = &node.spec;
    let p = s.persistence.as_ref()?;
    let size = size.unwrap_or(&p.size);
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names::pvc_name(&node.name_any())),
            namespace: node.namespace(),
            labels: Some(names::node_labels(
                &s.cluster_name,
                s.shard_index,
                s.node_index,
            )),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: p.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity(size.to_owned()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// Parses a Kubernetes quantity (`10Gi`, `500M`, `1e3`, `1.5Gi`) into bytes; `None` if invalid.
pub fn quantity_bytes(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        s if s.starts_with(['e', 'E']) => 10f64.powi(s[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * mult)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::valkeynode::tests::cluster;
    use crate::render::valkeynode::{NodeInputs, valkey_node};

    #[test]
    fn statefulset_snapshot() {
        let c = cluster(
            serde_json::json!({"shards": 1, "persistence": {"size": "1Gi", "storageClassName": "fast"}}),
        );
        let n = valkey_node(&c, 0, 0, &NodeInputs::default(), None);
        let Workload::StatefulSet(sts) = workload(&n, None).unwrap() else {
            panic!("expected a StatefulSet");
        };
        let spec = &sts.spec;
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.service_name.as_deref(), Some("valkey-c"));
        insta::assert_yaml_snapshot!(sts.metadata);
        insta::assert_yaml_snapshot!(pvc(&n, None));
    }

    #[test]
    fn deployment_is_recreate_and_has_no_pvc() {
        let c = cluster(serde_json::json!({"shards": 1, "workloadType": "Deployment"}));
        let n = valkey_node(&c, 0, 0, &NodeInputs::default(), None);
        let Workload::Deployment(d) = workload(&n, None).unwrap() else {
            panic!("expected a Deployment");
        };
        let spec = d.spec;
        assert_eq!(spec.strategy.unwrap().type_.as_deref(), Some("Recreate"));
        assert_eq!(spec.replicas, Some(1));
        assert!(pvc(&n, None).is_none());
    }

    #[test]
    fn template_hash_follows_template() {
        let c = cluster(serde_json::json!({"shards": 1}));
        let n = valkey_node(&c, 0, 0, &NodeInputs::default(), None);
        let a = workload(&n, None).unwrap();
        let c2 = cluster(serde_json::json!({"shards": 1, "config": {"io-threads": "4"}}));
        let n2 = valkey_node(&c2, 0, 0, &NodeInputs::default(), None);
        let b = workload(&n2, None).unwrap();
        assert!(a.template_hash().is_some());
        assert_ne!(a.template_hash(), b.template_hash());
        // Live-settable keys do not change the template.
        let c3 = cluster(serde_json::json!({"shards": 1, "config": {"maxmemory": "1gb"}}));
        let n3 = valkey_node(&c3, 0, 0, &NodeInputs::default(), None);
        assert_eq!(
            a.template_hash(),
            workload(&n3, None).unwrap().template_hash()
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity_bytes("1Gi"), Some(1073741824.0));
        assert_eq!(quantity_bytes("500M"), Some(5e8));
        assert_eq!(quantity_bytes("1e3"), Some(1000.0));
        assert_eq!(quantity_bytes("1.5Ki"), Some(1536.0));
        assert_eq!(quantity_bytes("x"), None);
        assert_eq!(quantity_bytes("1Zi"), None);
    }
}
