//! The `ValkeyCluster` custom resource: the user-facing API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, LocalObjectReference, PodSecurityContext, ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::bootstrap::{BOOTSTRAP_IMMUTABLE_MESSAGE, BootstrapSpec, RestoreStatus};
use crate::config;
use crate::defaults;
use crate::disruption::{PdbMode, PodDisruptionBudgetSpec};
use crate::exporter::ExporterSpec;
use crate::failback::FailbackSpec;
use crate::networking::NetworkingSpec;
use crate::persistence::PersistenceSpec;
use crate::scheduling::SchedulingSpec;
use crate::status::{AcceptedConfig, ClusterState, OperationStatus, RejectedConfig, ShardStatus};
use crate::users::{self, UserSpec};

/// Maximum length of a ValkeyCluster name (pod, StatefulSet and Service names derive from it).
pub const MAX_NAME_LENGTH: usize = 40;

/// Message: name too long or not a DNS label.
pub const NAME_MESSAGE: &str = "metadata.name of a ValkeyCluster must be a lowercase DNS label \
     starting with a letter and at most 40 characters long (pod and Service names derive from \
     it): choose a shorter name";
/// Message: workloadType changed.
pub const WORKLOAD_TYPE_IMMUTABLE_MESSAGE: &str = "spec.workloadType is immutable: restore the \
     previous value (create a new ValkeyCluster to change it)";
/// Message: persistence with a Deployment.
pub const PERSISTENCE_REQUIRES_STATEFULSET_MESSAGE: &str = "spec.persistence requires \
     spec.workloadType: StatefulSet: remove spec.persistence or use StatefulSet";
/// Message: persistence added or removed.
pub const PERSISTENCE_ADD_REMOVE_MESSAGE: &str = "spec.persistence cannot be added or removed \
     after creation: restore the previous setting (create a new ValkeyCluster to change it)";

/// Message: TLS turned on or off on a live cluster.
pub const TLS_TOGGLE_MESSAGE: &str = "spec.networking.tls cannot be turned on or off after \
     creation: every client, the cluster bus and replication would have to switch at the same \
     moment. Restore the previous setting, and create a new ValkeyCluster with the TLS setting \
     you want, then move your clients and data to it (the certificate itself can be rotated \
     at any time by updating the Secret)";

/// Message: per-shard disruption budgets on shards without replicas.
pub const SHARD_PDB_NEEDS_REPLICAS_MESSAGE: &str = "spec.podDisruptionBudget.mode Shard needs \
     spec.replicas of 1 or more: a shard without a replica would let a node drain evict every \
     shard at once. Add replicas, or use mode Cluster (one pod at a time)";

/// A Valkey cluster (cluster mode): `shards` primaries, each with `replicas` replicas, with
/// slot allocation, failovers, rolling updates and ACLs managed by the operator.
// kube printcolumn attributes repeat `type_ = ...`, which this lint misreads.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "valkey.io",
    version = "v1alpha1",
    kind = "ValkeyCluster",
    namespaced,
    status = "ValkeyClusterStatus",
    derive = "PartialEq",
    shortname = "vkc",
    category = "valkey",
    doc = "A Valkey cluster (cluster mode) managed by the valkey-operator.",
    printcolumn(name = "State", type_ = "string", json_path = ".status.state", description = "Summary state of the cluster"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason", description = "Reason of the condition that decided the state"),
    printcolumn(name = "Shards", type_ = "integer", json_path = ".status.shards", description = "Shards present in the Valkey cluster"),
    printcolumn(name = "ReadyShards", type_ = "integer", json_path = ".status.readyShards", description = "Shards with a primary and all desired replicas in sync"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = kube::core::Rule::new("self.metadata.name.size() <= 40 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message(NAME_MESSAGE)
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.persistence) || self.workloadType == 'StatefulSet'").message(PERSISTENCE_REQUIRES_STATEFULSET_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new("has(self.persistence) == has(oldSelf.persistence)").message(PERSISTENCE_ADD_REMOVE_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new("!has(self.podDisruptionBudget) || !has(self.podDisruptionBudget.mode) || self.podDisruptionBudget.mode != 'Shard' || (has(self.replicas) && self.replicas >= 1)").message(SHARD_PDB_NEEDS_REPLICAS_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new("(has(self.networking) && has(self.networking.tls)) == (has(oldSelf.networking) && has(oldSelf.networking.tls))").message(TLS_TOGGLE_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new("has(self.bootstrap) == has(oldSelf.bootstrap) && (!has(self.bootstrap) || self.bootstrap == oldSelf.bootstrap)").message(BOOTSTRAP_IMMUTABLE_MESSAGE))]
pub struct ValkeyClusterSpec {
    /// Valkey container image. Defaults to `valkey/valkey:9.0.0`. Graceful primary handoff on
    /// SIGTERM needs Valkey 9.0 or later. A new image is first checked by a short-lived pod
    /// running its server on `config` (a refused one is reported with reason InvalidConfig and
    /// not rolled out); then the pods roll one at a time, each primary handing over to a
    /// synced replica first.
    #[serde(default = "image_default")]
    #[schemars(length(min = 1, max = 512))]
    pub image: String,

    /// Secrets (in the cluster's namespace) used to pull every image of the pod: server,
    /// metrics exporter and additional containers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// Number of shards (primaries), 1 to 16384. Each shard owns a part of the 16384 hash
    /// slots. Changing it scales the cluster live: new shards receive an even share of the
    /// slots, removed shards (the highest indexes) are drained before their pods are deleted;
    /// progress is shown in `status.operation`.
    #[schemars(range(min = 1, max = 16384))]
    pub shards: i32,

    /// Replicas per shard, 0 to 100. Defaults to 0 (primaries only). Changing it adds or
    /// removes replicas (never a shard's primary); with 0 a lost pod loses its shard's data.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub replicas: i32,

    /// Compute resources (requests/limits) of the Valkey server container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Security context of every pod (server, exporter, config check). Omitted: the restricted
    /// Pod Security Standard with the image's `valkey` user, `runAsNonRoot: true`, `runAsUser`,
    /// `runAsGroup` and `fsGroup` 999 (so a volume is writable by the server), `fsGroupChangePolicy:
    /// OnRootMismatch` and the `RuntimeDefault` seccomp profile. When set, it replaces that
    /// default as a whole; changing it rolls the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_security_context: Option<PodSecurityContext>,

    /// Security context of the Valkey server container. Omitted: `allowPrivilegeEscalation:
    /// false`, every capability dropped and a read-only root filesystem (the server writes only
    /// `/data` and `/tmp`, both volumes). When set, it replaces that default as a whole;
    /// changing it rolls the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,

    /// Valkey configuration passed to every node: `valkey.conf` directives as keys, their
    /// arguments as string values, for example `{maxmemory: 1gb, maxmemory-policy:
    /// allkeys-lru, appendonly: "yes"}`. `maxclients`, `maxmemory` and `maxmemory-policy` are
    /// applied live; other changes roll the pods. Every change is first checked by the image's
    /// own server: a refused directive is reported (reason InvalidConfig, quoting the server)
    /// and the pods keep the last accepted settings. Settings owned by the operator (ports,
    /// cluster, TLS, ACL, persistence paths, shutdown behaviour) are rejected. Keys and values
    /// must not contain line breaks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::config::schema")]
    #[x_kube(validation = config::owned_keys_rule())]
    #[x_kube(validation = config::key_format_rule())]
    #[x_kube(validation = config::value_newline_rule())]
    pub config: Option<BTreeMap<String, String>>,

    /// Containers patched into each pod by name, like a strategic merge patch: entries named
    /// `server` or `metrics-exporter` are merged into those containers, any other name is
    /// appended as a sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub containers: Option<Vec<Container>>,

    /// Prometheus metrics exporter sidecar (enabled by default).
    #[serde(default)]
    pub exporter: ExporterSpec,

    /// Persistent storage: a PersistentVolumeClaim per node. Requires workloadType StatefulSet;
    /// cannot be added or removed after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence: Option<PersistenceSpec>,

    /// PodDisruptionBudget management: one for the cluster (the default), one per shard, or
    /// none. Omitted means `mode: Cluster`.
    #[serde(default)]
    pub pod_disruption_budget: PodDisruptionBudgetSpec,

    /// Primary failback: hand each shard's primary back to its node-index-0 pod after a
    /// failover, once the cluster has been quiet for a while. Omitted means `mode: Disabled`.
    #[serde(default)]
    pub failback: FailbackSpec,

    /// Pod termination grace period in seconds; must be positive. A primary fails over to a
    /// replica on SIGTERM, which must finish within this period. When omitted the operator uses
    /// max(30, cluster-manual-failover-timeout + 10s). A value below that is honoured but
    /// reported with the ConfigurationWarning condition (reason GracePeriodTooShort).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub termination_grace_period_seconds: Option<i64>,

    /// Pod scheduling: tolerations, node selector, affinity, priority class, raw topology spread
    /// constraints and the node/zone spread axes.
    #[serde(default)]
    pub scheduling: SchedulingSpec,

    /// Network settings (TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub networking: Option<NetworkingSpec>,

    /// ACL users distributed to every node. Names must be unique and must not start with `_`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = users::unique_names_rule())]
    pub users: Option<Vec<UserSpec>>,

    /// Data the new cluster starts with: a backup restored into it (see `bootstrap.backup`).
    /// Set at creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,

    /// Workload kind owning each node's pod: `StatefulSet` (default) or `Deployment` (cache-only
    /// clusters without persistence). Immutable.
    #[serde(default)]
    #[x_kube(validation = kube::core::Rule::new("self == oldSelf").message(WORKLOAD_TYPE_IMMUTABLE_MESSAGE))]
    pub workload_type: WorkloadType,
}

fn image_default() -> String {
    defaults::VALKEY_IMAGE.to_owned()
}

/// Workload kind owning a node's pod.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WorkloadType {
    /// One single-replica StatefulSet per node (stable identity, persistence supported).
    #[default]
    StatefulSet,
    /// One single-replica Deployment per node (cache-only).
    Deployment,
}

/// Observed state of a ValkeyCluster.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ValkeyClusterStatus {
    /// Summary state: Initializing, Reconciling, Ready, Degraded or Failed.
    #[serde(default)]
    pub state: ClusterState,

    /// Reason of the condition that decided `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,

    /// Message of the condition that decided `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// Shards currently present in the Valkey cluster.
    #[serde(default)]
    pub shards: i32,

    /// Shards with a primary and the desired number of synced replicas.
    #[serde(default)]
    pub ready_shards: i32,

    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Standard conditions: Ready, Progressing, Degraded, ClusterFormed, SlotsAssigned,
    /// ConfigurationWarning.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Per-shard state: primary pod, replica count and slot ranges.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shard_statuses: Vec<ShardStatus>,

    /// The risky topology operation in progress (a slot rebalance or an operator-driven
    /// failover), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationStatus>,

    /// The image and `config` last accepted by a dry run of that image's server; the pods
    /// run these while a newer `spec.image` or `spec.config` is checked or refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_config: Option<AcceptedConfig>,

    /// With TLS: the certificate of the TLS Secret and how many pods serve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::status::TlsStatus>,

    /// The `spec.image` and `spec.config` the dry run refused, and why (see the
    /// ConfigurationWarning condition, reason InvalidConfig).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_config: Option<RejectedConfig>,

    /// With `spec.bootstrap.backup`: how far the restore got (Ready waits for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreStatus>,
}

impl ValkeyClusterSpec {
    /// Nodes per shard: the primary plus its replicas.
    pub fn nodes_per_shard(&self) -> i64 {
        1 + i64::from(self.replicas.max(0))
    }

    /// Total number of Valkey nodes: shards × (1 + replicas).
    pub fn desired_nodes(&self) -> i64 {
        i64::from(self.shards.max(0)) * self.nodes_per_shard()
    }

    /// Whether the metrics exporter sidecar runs.
    pub fn exporter_enabled(&self) -> bool {
        self.exporter.enabled
    }

    /// Whether the operator manages PodDisruptionBudgets (one for the cluster or one per shard).
    pub fn pdb_enabled(&self) -> bool {
        self.pod_disruption_budget.mode != PdbMode::Disabled
    }

    /// Name of the TLS certificate Secret when TLS is enabled.
    pub fn tls_secret_name(&self) -> Option<&str> {
        self.networking
            .as_ref()?
            .tls
            .as_ref()
            .map(|t| t.certificate.secret_name.as_str())
    }

    /// The NetworkPolicy settings when `networking.networkPolicy.enabled`.
    pub fn network_policy(&self) -> Option<&crate::networking::NetworkPolicySpec> {
        self.networking
            .as_ref()?
            .network_policy
            .as_ref()
            .filter(|p| p.enabled)
    }

    /// Value of a `config` key, looked up case-insensitively.
    pub fn config_value(&self, key: &str) -> Option<&str> {
        self.config
            .as_ref()?
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }

    /// Effective `cluster-manual-failover-timeout` in milliseconds (config or Valkey's default;
    /// an unparsable value falls back to the default).
    pub fn cluster_manual_failover_timeout_ms(&self) -> i64 {
        self.config_value("cluster-manual-failover-timeout")
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|v| *v > 0)
            .unwrap_or(defaults::CLUSTER_MANUAL_FAILOVER_TIMEOUT_MS)
    }

    /// Recommended minimum grace period: max(30s, failover timeout + 10s buffer).
    pub fn recommended_termination_grace_period_seconds(&self) -> i64 {
        let failover_secs = self
            .cluster_manual_failover_timeout_ms()
            .saturating_add(999)
            / 1000;
        defaults::KUBERNETES_GRACE_PERIOD_SECONDS
            .max(failover_secs.saturating_add(defaults::GRACE_PERIOD_BUFFER_SECONDS))
    }

    /// Grace period the pods get: the explicit value as-is, otherwise the recommended one.
    pub fn termination_grace_period_seconds(&self) -> i64 {
        self.termination_grace_period_seconds
            .unwrap_or_else(|| self.recommended_termination_grace_period_seconds())
    }

    /// Whether an explicit grace period is below the recommended minimum (ConfigurationWarning).
    pub fn grace_period_too_short(&self) -> bool {
        self.termination_grace_period_seconds
            .is_some_and(|v| v < self.recommended_termination_grace_period_seconds())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persistence::ReclaimPolicy;
    use crate::scheduling::SpreadMode;

    fn spec(json: serde_json::Value) -> ValkeyClusterSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn minimal_spec_has_documented_defaults() {
        let s = spec(serde_json::json!({"shards": 3}));
        assert_eq!(s.image, "valkey/valkey:9.0.0");
        assert_eq!(s.replicas, 0);
        assert_eq!(s.workload_type, WorkloadType::StatefulSet);
        assert!(s.exporter_enabled());
        assert_eq!(s.exporter.image, "oliver006/redis_exporter:v1.80.0");
        assert!(s.pdb_enabled());
        assert_eq!(s.scheduling.node.spread.shard.mode, SpreadMode::Disabled);
        assert_eq!(
            s.scheduling.node.spread.primaries.mode,
            SpreadMode::Disabled
        );
        assert_eq!(s.scheduling.node.spread.pods.mode, SpreadMode::Disabled);
        assert_eq!(s.scheduling.zone.spread.shard.mode, SpreadMode::Disabled);
        assert_eq!(
            s.scheduling.zone.spread.primaries.mode,
            SpreadMode::Disabled
        );
        assert_eq!(s.scheduling.zone.spread.pods.mode, SpreadMode::Disabled);
        assert!(s.persistence.is_none());
        assert!(s.tls_secret_name().is_none());
        assert_eq!(s.desired_nodes(), 3);
        assert_eq!(s.termination_grace_period_seconds(), 30);
        assert!(!s.grace_period_too_short());
    }

    #[test]
    fn exporter_enabled_when_only_image_or_args_given() {
        let s = spec(serde_json::json!({"shards": 1, "exporter": {"image": "x/y:1"}}));
        assert!(s.exporter_enabled());
        assert_eq!(s.exporter.image, "x/y:1");
        let s = spec(serde_json::json!({"shards": 1, "exporter": {"args": ["-ping-on-connect"]}}));
        assert!(s.exporter_enabled());
        assert_eq!(s.exporter.image, defaults::EXPORTER_IMAGE);
        let s = spec(serde_json::json!({"shards": 1, "exporter": {"enabled": false}}));
        assert!(!s.exporter_enabled());
    }

    #[test]
    fn desired_nodes_counts_replicas() {
        let s = spec(serde_json::json!({"shards": 3, "replicas": 2}));
        assert_eq!(s.nodes_per_shard(), 3);
        assert_eq!(s.desired_nodes(), 9);
    }

    #[test]
    fn persistence_and_pdb_defaults() {
        let s = spec(serde_json::json!({
            "shards": 1, "persistence": {"size": "1Gi"}, "podDisruptionBudget": {}
        }));
        let p = s.persistence.as_ref().unwrap();
        assert_eq!(p.reclaim_policy, ReclaimPolicy::Retain);
        assert!(p.storage_class_name.is_none());
        assert!(s.pdb_enabled());
        let s = spec(serde_json::json!({"shards": 1, "podDisruptionBudget": {"mode": "Disabled"}}));
        assert!(!s.pdb_enabled());
    }

    #[test]
    fn grace_period_follows_failover_timeout() {
        let s = spec(serde_json::json!({
            "shards": 1, "config": {"Cluster-Manual-Failover-Timeout": "45000"}
        }));
        assert_eq!(s.cluster_manual_failover_timeout_ms(), 45_000);
        assert_eq!(s.termination_grace_period_seconds(), 55);
        let s = spec(serde_json::json!({
            "shards": 1, "terminationGracePeriodSeconds": 20,
            "config": {"cluster-manual-failover-timeout": "30001"}
        }));
        assert_eq!(s.recommended_termination_grace_period_seconds(), 41);
        assert_eq!(s.termination_grace_period_seconds(), 20);
        assert!(s.grace_period_too_short());
        let s = spec(serde_json::json!({
            "shards": 1, "config": {"cluster-manual-failover-timeout": "bogus"}
        }));
        assert_eq!(s.cluster_manual_failover_timeout_ms(), 5_000);
    }

    #[test]
    fn tls_secret_name_accessor() {
        let s = spec(serde_json::json!({
            "shards": 1, "networking": {"tls": {"certificate": {"secretName": "valkey-tls"}}}
        }));
        assert_eq!(s.tls_secret_name(), Some("valkey-tls"));
    }

    #[test]
    fn status_defaults_to_initializing() {
        let st: ValkeyClusterStatus = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(st.state, ClusterState::Initializing);
    }
}
