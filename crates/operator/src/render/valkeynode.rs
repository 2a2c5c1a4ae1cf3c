//! ValkeyCluster + position → the ValkeyNode the ValkeyCluster controller applies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use valkey_api::node::{NodeConfig, NodeExporter};
use valkey_api::{ValkeyCluster, ValkeyNode, ValkeyNodeSpec};

use super::{names, security, spread, valkey_conf};

/// The workload revision of a new ValkeyNode.
pub const FIRST_REVISION: &str = "1";

/// Inputs of a ValkeyNode that the cluster controller computes from observed state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeInputs {
    /// Workload revision authorizing a roll of this node's pod (see the ValkeyNode controller:
    /// with `None` template changes are applied at once).
    pub workload_revision: Option<String>,
}

/// The ValkeyNode `<cluster>-<shard>-<node>` of `cluster` with resolved image, exporter,
/// scheduling (spread rendered), config map name and restart hash, live config, TLS and ACL
/// Secrets and the resolved termination grace period.
pub fn valkey_node(
    cluster: &ValkeyCluster,
    shard_index: i32,
    node_index: i32,
    inputs: &NodeInputs,
    owner: Option<OwnerReference>,
) -> ValkeyNode {
    let name = cluster.name_any();
    let spec = &cluster.spec;
    let live = valkey_conf::live_config(spec);
    let node_spec = ValkeyNodeSpec {
        cluster_name: name.clone(),
        shard_index,
        node_index,
        image: spec.image.clone(),
        image_pull_secrets: spec.image_pull_secrets.clone(),
        workload_type: spec.workload_type,
        persistence: spec.persistence.clone(),
        resources: spec.resources.clone(),
        pod_security_context: Some(security::pod_security_context(
            spec.pod_security_context.as_ref(),
        )),
        security_context: Some(security::container_security_context(
            spec.security_context.as_ref(),
        )),
        scheduling: spread::node_scheduling(&spec.scheduling, &name, shard_index, node_index),
        exporter: spec.exporter_enabled().then(|| NodeExporter {
            image: spec.exporter.image.clone(),
            args: spec.exporter.args.clone(),
            resources: spec.exporter.resources.clone(),
            security_context: Some(security::container_security_context(
                spec.exporter.security_context.as_ref(),
            )),
        }),
        containers: spec.containers.clone(),
        config: NodeConfig {
            config_map_name: Some(names::config_map_name(&name)),
            hash: Some(valkey_conf::config_hash(spec)),
            live: (!live.is_empty()).then_some(live),
        },
        tls_secret_name: spec.tls_secret_name().map(str::to_owned),
        acl_secret_name: Some(names::acl_secret_name(&name)),
        termination_grace_period_seconds: spec.termination_grace_period_seconds(),
        workload_revision: inputs.workload_revision.clone(),
    };
    ValkeyNode {
        metadata: ObjectMeta {
            name: Some(names::valkey_node_name(&name, shard_index, node_index)),
            namespace: cluster.namespace(),
            labels: Some(names::node_labels(&name, shard_index, node_index)),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: node_spec,
        status: None,
    }
}

/// All ValkeyNodes of `cluster`, shard-major (`0-0`, `0-1`, …, `1-0`, …), each with the
/// workload revision `revision_of` gives for its name (`"1"` when `None`: a new node).
pub fn valkey_nodes(
    cluster: &ValkeyCluster,
    owner: Option<OwnerReference>,
    revision_of: impl Fn(&str) -> Option<String>,
) -> Vec<ValkeyNode> {
    let spec = &cluster.spec;
    let per_shard = i32::try_from(spec.nodes_per_shard()).unwrap_or(i32::MAX);
    (0..spec.shards.max(0))
        .flat_map(|s| (0..per_shard).map(move |n| (s, n)))
        .map(|(s, n)| {
            let name = names::valkey_node_name(&cluster.name_any(), s, n);
            let inputs = NodeInputs {
                workload_revision: Some(
                    revision_of(&name).unwrap_or_else(|| FIRST_REVISION.into()),
                ),
            };
            valkey_node(cluster, s, n, &inputs, owner.clone())
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn cluster(json: serde_json::Value) -> ValkeyCluster {
        let mut c = ValkeyCluster::new("c", serde_json::from_value(json).unwrap());
        c.metadata.namespace = Some("ns".into());
        c
    }

    #[test]
    fn nodes_for_all_positions() {
        let c = cluster(serde_json::json!({"shards": 2, "replicas": 1}));
        let nodes = valkey_nodes(&c, None, |_| None);
        let names: Vec<_> = nodes.iter().map(|n| n.name_any()).collect();
        assert_eq!(names, ["c-0-0", "c-0-1", "c-1-0", "c-1-1"]);
        assert_eq!(nodes[3].spec.shard_index, 1);
        assert_eq!(nodes[3].spec.node_index, 1);
    }

    #[test]
    fn valkey_node_snapshot() {
        let c = cluster(serde_json::json!({
            "shards": 3, "replicas": 1,
            "config": {"maxmemory": "1gb", "cluster-manual-failover-timeout": "60000"},
            "exporter": {"args": ["-ping-on-connect"]},
            "persistence": {"size": "1Gi", "reclaimPolicy": "Delete"},
            "networking": {"tls": {"certificate": {"secretName": "tls"}}},
            "scheduling": {"node": {"spread": {"shard": {"mode": "Required"}}}}
        }));
        let inputs = NodeInputs {
            workload_revision: Some("1".into()),
        };
        let n = valkey_node(&c, 1, 0, &inputs, None);
        assert_eq!(n.spec.termination_grace_period_seconds, 70);
        insta::assert_yaml_snapshot!(n);
    }

    #[test]
    fn exporter_disabled_means_none() {
        let c = cluster(serde_json::json!({"shards": 1, "exporter": {"enabled": false}}));
        assert!(
            valkey_node(&c, 0, 0, &NodeInputs::default(), None)
                .spec
                .exporter
                .is_none()
        );
    }
}
