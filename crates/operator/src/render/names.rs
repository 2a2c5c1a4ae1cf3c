//! Names and labels of every object the operator creates.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use valkey_api::labels;

/// Value of `app.kubernetes.io/part-of`.
pub const PART_OF_VALUE: &str = "valkey-cluster";

/// Headless Service of a cluster: `valkey-<cluster>`.
pub fn service_name(cluster: &str) -> String {
    format!("valkey-{cluster}")
}

/// The names the operator verifies a pod's TLS certificate against (it dials the pod IP,
/// and tries the pod IP last): a name under the headless Service, so that a certificate for
/// `*.valkey-<cluster>.<namespace>.svc` or `*.valkey-<cluster>.<namespace>.svc.cluster.local`
/// (what cert-manager issues for the Service's pods) is accepted.
pub fn tls_server_names(cluster: &str, namespace: &str) -> Vec<String> {
    let svc = service_name(cluster);
    vec![
        format!("node.{svc}.{namespace}.svc"),
        format!("node.{svc}.{namespace}.svc.cluster.local"),
    ]
}

/// ConfigMap with `valkey.conf` and the probe scripts: `valkey-<cluster>-config`.
pub fn config_map_name(cluster: &str) -> String {
    format!("valkey-{cluster}-config")
}

/// Secret with the system users' passwords: `valkey-<cluster>-system`.
pub fn system_secret_name(cluster: &str) -> String {
    format!("valkey-{cluster}-system")
}

/// Copy of the system users' passwords, from which a deleted system Secret is restored:
/// `valkey-<cluster>-system-backup`.
pub fn system_backup_secret_name(cluster: &str) -> String {
    format!("valkey-{cluster}-system-backup")
}

/// Secret with the rendered ACL file: `valkey-<cluster>-acl`.
pub fn acl_secret_name(cluster: &str) -> String {
    format!("valkey-{cluster}-acl")
}

/// PodDisruptionBudget of a cluster (mode Cluster): `valkey-<cluster>`.
pub fn pdb_name(cluster: &str) -> String {
    format!("valkey-{cluster}")
}

/// PodDisruptionBudget of one shard (mode Shard): `valkey-<cluster>-shard-<shard>`.
pub fn shard_pdb_name(cluster: &str, shard_index: i32) -> String {
    format!("valkey-{cluster}-shard-{shard_index}")
}

/// Metadata of a child object `name` of `cluster` in `namespace`: the cluster's labels and
/// its owner reference.
pub fn child_meta(
    name: String,
    cluster: &str,
    namespace: &str,
    owner: Option<OwnerReference>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(namespace.to_owned()),
        labels: Some(cluster_labels(cluster)),
        owner_references: owner.map(|o| vec![o]),
        ..Default::default()
    }
}

/// The cluster's NetworkPolicy: `valkey-<cluster>`.
pub fn network_policy_name(cluster: &str) -> String {
    format!("valkey-{cluster}")
}

/// ValkeyNode of a position: `<cluster>-<shard>-<node>`.
pub fn valkey_node_name(cluster: &str, shard_index: i32, node_index: i32) -> String {
    format!("{cluster}-{shard_index}-{node_index}")
}

/// StatefulSet or Deployment of a ValkeyNode: `valkey-<valkeynode>`.
pub fn workload_name(valkey_node: &str) -> String {
    format!("valkey-{valkey_node}")
}

/// PersistentVolumeClaim of a ValkeyNode: `valkey-<valkeynode>-data`.
pub fn pvc_name(valkey_node: &str) -> String {
    format!("valkey-{valkey_node}-data")
}

/// Selector labels of every pod of a cluster: `valkey.io/cluster: <cluster>`.
pub fn cluster_selector(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(labels::CLUSTER.to_owned(), cluster.to_owned())])
}

/// Selector labels of the pods of one shard.
pub fn shard_selector(cluster: &str, shard_index: i32) -> BTreeMap<String, String> {
    let mut l = cluster_selector(cluster);
    l.insert(labels::SHARD_INDEX.to_owned(), shard_index.to_string());
    l
}

/// Selector labels of one node's pod (cluster, shard and node index).
pub fn node_selector_labels(
    cluster: &str,
    shard_index: i32,
    node_index: i32,
) -> BTreeMap<String, String> {
    let mut l = shard_selector(cluster, shard_index);
    l.insert(labels::NODE_INDEX.to_owned(), node_index.to_string());
    l
}

/// Labels of cluster-level objects: `valkey.io/cluster` and the `app.kubernetes.io/*` set.
pub fn cluster_labels(cluster: &str) -> BTreeMap<String, String> {
    let mut l = cluster_selector(cluster);
    l.insert(
        labels::APP_NAME.to_owned(),
        labels::APP_NAME_VALUE.to_owned(),
    );
    l.insert(labels::APP_INSTANCE.to_owned(), cluster.to_owned());
    l.insert(
        labels::APP_MANAGED_BY.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    );
    l.insert(labels::APP_PART_OF.to_owned(), PART_OF_VALUE.to_owned());
    l
}

/// Labels of a ValkeyNode, its workload, pod and claim: the cluster labels, the shard and node
/// index and `app.kubernetes.io/component: valkey-node`.
pub fn node_labels(cluster: &str, shard_index: i32, node_index: i32) -> BTreeMap<String, String> {
    let mut l = cluster_labels(cluster);
    l.extend(node_selector_labels(cluster, shard_index, node_index));
    l.insert(
        labels::APP_COMPONENT.to_owned(),
        labels::COMPONENT_NODE.to_owned(),
    );
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_contract() {
        assert_eq!(service_name("c"), "valkey-c");
        assert_eq!(config_map_name("c"), "valkey-c-config");
        assert_eq!(system_secret_name("c"), "valkey-c-system");
        assert_eq!(acl_secret_name("c"), "valkey-c-acl");
        assert_eq!(pdb_name("c"), "valkey-c");
        assert_eq!(shard_pdb_name("c", 3), "valkey-c-shard-3");
        assert_eq!(valkey_node_name("c", 2, 1), "c-2-1");
        assert_eq!(workload_name("c-2-1"), "valkey-c-2-1");
        assert_eq!(pvc_name("c-2-1"), "valkey-c-2-1-data");
    }

    #[test]
    fn node_labels_contain_selectors() {
        let l = node_labels("c", 2, 1);
        assert_eq!(l["valkey.io/cluster"], "c");
        assert_eq!(l["valkey.io/shard-index"], "2");
        assert_eq!(l["valkey.io/node-index"], "1");
        assert_eq!(l["app.kubernetes.io/name"], "valkey");
        assert_eq!(l["app.kubernetes.io/instance"], "c");
        assert_eq!(l["app.kubernetes.io/managed-by"], "valkey-operator");
        assert_eq!(l["app.kubernetes.io/component"], "valkey-node");
        assert_eq!(l["app.kubernetes.io/part-of"], "valkey-cluster");
    }
}
