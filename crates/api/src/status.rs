//! Status types shared by the ValkeyCluster and ValkeyNode resources.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition types of a ValkeyCluster (see the status contract).
pub mod condition {
    /// Serving with the desired topology.
    pub const READY: &str = "Ready";
    /// The operator is changing something.
    pub const PROGRESSING: &str = "Progressing";
    /// Impaired, may still serve.
    pub const DEGRADED: &str = "Degraded";
    /// All nodes joined with the desired layout.
    pub const CLUSTER_FORMED: &str = "ClusterFormed";
    /// All 16384 slots have an owner.
    pub const SLOTS_ASSIGNED: &str = "SlotsAssigned";
    /// A risky value was accepted as is.
    pub const CONFIGURATION_WARNING: &str = "ConfigurationWarning";
}

/// Summary state of a ValkeyCluster.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClusterState {
    /// Not reconciled yet.
    #[default]
    Initializing,
    /// The operator is changing the cluster.
    Reconciling,
    /// Serving with the desired topology.
    Ready,
    /// Impaired; may still serve.
    Degraded,
    /// Not serving and not progressing.
    Failed,
}

/// Observed state of one shard.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ShardStatus {
    /// Shard index (0-based).
    pub index: i32,
    /// Name of the pod currently holding the shard's primary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_pod: Option<String>,
    /// Number of replicas attached to the primary.
    #[serde(default)]
    pub replicas: i32,
    /// Hash-slot ranges owned by the shard, such as `0-5460` (a single slot is written `42`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<String>,
}

/// The risky topology operation in progress (a slot rebalance or an operator-driven failover),
/// for users to see; cleared when it completes. The operator resumes an interrupted operation
/// from the live cluster state, not from this record.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// Kind of operation: `MigrateSlots` or `Failover`.
    pub kind: String,
    /// When the operation started (kept over the several passes of a rebalance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// Shard the operation acts on, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_index: Option<i32>,
    /// What is being done (for example source, targets and slot ranges).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Standard Kubernetes conditions, a list keyed by `type`.
pub type Conditions = Vec<Condition>;
