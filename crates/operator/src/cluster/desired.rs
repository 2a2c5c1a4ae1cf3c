//! The desired ValkeyNodes of a cluster.
//!
//! Temporary minimal builder used until the render layer's ValkeyNode builder lands: it fills
//! every ValkeyNode field from the cluster spec but renders no spread rules (scheduling passes
//! the user's raw settings through).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use valkey_api::node::{NodeConfig, NodeExporter, NodeScheduling};
use valkey_api::{ValkeyCluster, ValkeyNode, ValkeyNodeSpec};

use crate::render;
use crate::render::acl::AclFile;

/// One ValkeyNode per position `<cluster>-<shard>-<node>`.
pub fn valkey_nodes(
    vc: &ValkeyCluster,
    acl: Option<&AclFile>,
    owner: Option<OwnerReference>,
) -> Vec<ValkeyNode> {
    let name = vc.name_any();
    let ns = vc.namespace().unwrap_or_default();
    let spec = &vc.spec;
    let live = render::config::live_config(spec);
    let mut out = Vec::new();
    for shard in 0..spec.shards.max(0) {
        for index in 0..=spec.replicas.max(0) {
            let node_name = render::names::valkey_node_name(&name, shard, index);
            let s = &spec.scheduling;
            out.push(ValkeyNode {
                metadata: ObjectMeta {
                    name: Some(node_name),
                    namespace: Some(ns.clone()),
                    labels: Some(render::names::node_labels(&name, shard, index)),
                    owner_references: owner.clone().map(|o| vec![o]),
                    ..ObjectMeta::default()
                },
                spec: ValkeyNodeSpec {
                    cluster_name: name.clone(),
                    shard_index: shard,
                    node_index: index,
                    image: spec.image.clone(),
                    image_pull_secrets: spec.image_pull_secrets.clone(),
                    workload_type: spec.workload_type,
                    persistence: spec.persistence.clone(),
                    resources: spec.resources.clone(),
                    scheduling: NodeScheduling {
                        tolerations: s.tolerations.clone(),
                        node_selector: s.node_selector.clone(),
                        affinity: s.affinity.clone(),
                        priority_class_name: s.priority_class_name.clone(),
                        topology_spread_constraints: s.topology_spread_constraints.clone(),
                    },
                    exporter: spec.exporter_enabled().then(|| NodeExporter {
                        image: spec.exporter.image.clone(),
                        args: spec.exporter.args.clone(),
                        resources: spec.exporter.resources.clone(),
                    }),
                    containers: spec.containers.clone(),
                    config: NodeConfig {
                        config_map_name: Some(render::names::config_map_name(&name)),
                        hash: Some(render::config::config_hash(spec)),
                        live: (!live.is_empty()).then(|| live.clone()),
                    },
                    tls_secret_name: spec.tls_secret_name().map(str::to_owned),
                    acl_secret_name: Some(render::names::acl_secret_name(&name)),
                    acl_hash: acl.map(|a| a.revision.clone()),
                    termination_grace_period_seconds: spec.termination_grace_period_seconds(),
                    workload_revision: None,
                },
                status: None,
            });
        }
    }
    out
}
