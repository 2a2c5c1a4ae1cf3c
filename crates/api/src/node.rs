//! The `ValkeyNode` custom resource: one Valkey pod's resolved desired state (internal).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, LocalObjectReference, PodSecurityContext, ResourceRequirements,
    SecurityContext, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::cluster::WorkloadType;
use crate::persistence::PersistenceSpec;

/// Internal: the resolved desired state of one Valkey pod, written by the ValkeyCluster
/// controller (one per shard × node position) and turned into a single-replica StatefulSet or
/// Deployment by the ValkeyNode controller. Do not create or edit ValkeyNodes by hand; configure
/// the owning ValkeyCluster instead.
// kube printcolumn attributes repeat `type_ = ...`, which this lint misreads.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "valkey.io",
    version = "v1alpha1",
    kind = "ValkeyNode",
    namespaced,
    status = "ValkeyNodeStatus",
    derive = "PartialEq",
    shortname = "vkn",
    category = "valkey",
    doc = "Internal: one Valkey pod's resolved desired state, written by the ValkeyCluster controller. Do not create or edit by hand.",
    printcolumn(
        name = "Ready",
        type_ = "boolean",
        json_path = ".status.ready",
        description = "Whether the pod is ready"
    ),
    printcolumn(
        name = "Role",
        type_ = "string",
        json_path = ".status.role",
        description = "Current Valkey role: primary or replica"
    ),
    printcolumn(
        name = "Shard",
        type_ = "integer",
        json_path = ".spec.shardIndex",
        description = "Shard index"
    ),
    printcolumn(
        name = "Pod",
        type_ = "string",
        json_path = ".status.podName",
        description = "Pod name"
    ),
    printcolumn(
        name = "IP",
        type_ = "string",
        json_path = ".status.podIP",
        description = "Pod IP"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyNodeSpec {
    /// Name of the owning ValkeyCluster.
    pub cluster_name: String,

    /// Shard index of this node (0-based).
    #[schemars(range(min = 0))]
    pub shard_index: i32,

    /// Position of this node inside its shard; 0 is the primary at creation.
    #[schemars(range(min = 0))]
    pub node_index: i32,

    /// Valkey container image.
    pub image: String,

    /// Secrets used to pull the pod's images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// Workload kind owning the pod.
    #[serde(default)]
    pub workload_type: WorkloadType,

    /// Persistent storage of this node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistenceSpec>,

    /// Compute resources of the server container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Resolved security context of the pod (the restricted default unless the cluster sets
    /// one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,

    /// Resolved security context of the server container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,

    /// Fully rendered scheduling of the pod (spread axes already resolved).
    #[serde(default)]
    pub scheduling: NodeScheduling,

    /// Metrics exporter sidecar; absent when the exporter is disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exporter: Option<NodeExporter>,

    /// Container patches and sidecars, merged by name into the pod's containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<Container>>,

    /// Rendered Valkey configuration.
    #[serde(default)]
    pub config: NodeConfig,

    /// TLS certificate Secret name when TLS is enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret_name: Option<String>,

    /// Secret holding the rendered ACL file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl_secret_name: Option<String>,

    /// Resolved pod termination grace period in seconds.
    #[schemars(range(min = 1))]
    pub termination_grace_period_seconds: i64,

    /// Revision the ValkeyCluster controller bumps to authorize rolling this node's workload
    /// when its pod template changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_revision: Option<String>,
}

/// Rendered scheduling of one pod.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeScheduling {
    /// Pod tolerations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Pod node selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Pod affinity, including rendered shard anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Pod priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Pod topology spread constraints (pass-through plus rendered spread dimensions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
}

/// Resolved metrics exporter sidecar.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeExporter {
    /// Exporter image.
    pub image: String,
    /// Extra exporter flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Exporter resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Resolved security context of the exporter container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

/// Reference to the rendered Valkey configuration.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    /// ConfigMap holding the rendered `valkey.conf`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_name: Option<String>,
    /// Hash of the rendered configuration that requires a restart; a change rolls the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Settings applied live with CONFIG SET without rolling the pod (for example `maxmemory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<BTreeMap<String, String>>,
}

/// Observed state of a ValkeyNode.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyNodeStatus {
    /// Whether the pod is running and ready.
    #[serde(default)]
    pub ready: bool,
    /// Current Valkey role of the node: `primary` or `replica`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Name of the node's pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// IP address of the node's pod.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "podIP")]
    pub pod_ip: Option<String>,
    /// Workload revision currently applied to the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_workload_revision: Option<String>,
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Live settings (`maxmemory`, `maxmemory-policy`, `maxclients`) the operator has set on
    /// the pod's server with `CONFIG SET`. A key removed from the cluster's `spec.config` is
    /// returned to Valkey's default, then dropped from this list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live_config_keys: Vec<String>,
    /// The pod's server version and a digest of its system users (`default`, `_operator`,
    /// `_replication`, `_exporter`) as that server lists them once the operator applied them
    /// from the ACL file. A server listing them otherwise had them changed by a user allowed
    /// to change ACLs, and the operator applies them again (event `SystemUsersRestored`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_users_digest: Option<String>,
    /// Standard conditions: Ready, PersistentVolumeClaimReady, PersistentVolumeClaimSizeReady,
    /// LiveConfigApplied, ACLApplied, TLSCertificateApplied, WorkloadRollPending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
