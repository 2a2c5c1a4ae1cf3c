//! `spec.podDisruptionBudget`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// PodDisruptionBudget management.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodDisruptionBudgetSpec {
    /// `Cluster` (default): the operator owns one PodDisruptionBudget with `maxUnavailable: 1`
    /// selecting all pods of the cluster. `Disabled`: the operator deletes its
    /// PodDisruptionBudget and does not recreate it (use when it is managed externally).
    #[serde(default)]
    pub mode: PdbMode,
}

/// How the operator manages the PodDisruptionBudget.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PdbMode {
    /// One cluster-wide PodDisruptionBudget owned by the operator.
    #[default]
    Cluster,
    /// No PodDisruptionBudget from the operator.
    Disabled,
}
