//! `spec.podDisruptionBudget`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// PodDisruptionBudget management.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetSpec {
    /// `Cluster` (default): the operator owns one PodDisruptionBudget selecting all pods of
    /// the cluster that lets one of them be down (`minAvailable` is the cluster's pod count
    /// minus one): a node drain evicts one Valkey pod at a time.
    /// `Shard`: one PodDisruptionBudget per shard (`valkey-<cluster>-shard-<n>`), each letting
    /// one of that shard's pods be down (`minAvailable: <replicas>`): a drain may evict pods of
    /// different shards in parallel, never two of one shard (needs `replicas` of 1 or more: a
    /// shard without a replica would be evicted whole). `Disabled`: the operator deletes its
    /// PodDisruptionBudgets and does not recreate them (use when they are managed externally).
    /// Switching between `Cluster` and `Shard` creates the new budgets before it deletes the
    /// old ones.
    #[serde(default)]
    pub mode: PdbMode,
}

/// How the operator manages the PodDisruptionBudget.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PdbMode {
    /// One cluster-wide PodDisruptionBudget owned by the operator.
    #[default]
    Cluster,
    /// One PodDisruptionBudget per shard owned by the operator.
    Shard,
    /// No PodDisruptionBudget from the operator.
    Disabled,
}
