//! `spec.persistence`: a PersistentVolumeClaim per ValkeyNode.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Message: storageClassName changed.
pub const STORAGE_CLASS_IMMUTABLE_MESSAGE: &str = "spec.persistence.storageClassName is immutable: \
     restore the previous value (create a new ValkeyCluster to use another storage class)";
/// Message: size is not a positive quantity.
pub const SIZE_FORMAT_MESSAGE: &str =
    "spec.persistence.size must be a positive quantity such as 10Gi";
/// Message: size shrunk.
pub const SIZE_SHRINK_MESSAGE: &str =
    "spec.persistence.size can only grow: set a value at least as large as the current size";

/// Persistent storage for every Valkey node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "has(self.storageClassName) == has(oldSelf.storageClassName) && \
     (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)"
).message(STORAGE_CLASS_IMMUTABLE_MESSAGE))]
pub struct PersistenceSpec {
    /// Requested volume size of each node's PersistentVolumeClaim, for example `10Gi`.
    /// Can only grow.
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = kube::core::Rule::new("isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))").message(SIZE_FORMAT_MESSAGE))]
    #[x_kube(validation = kube::core::Rule::new("!isQuantity(self) || !isQuantity(oldSelf) || quantity(self).compareTo(quantity(oldSelf)) >= 0").message(SIZE_SHRINK_MESSAGE))]
    pub size: String,

    /// StorageClass of the PersistentVolumeClaims. Omit to use the cluster's default
    /// StorageClass. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub storage_class_name: Option<String>,

    /// What happens to a node's PersistentVolumeClaim when its ValkeyNode is deleted: `Retain`
    /// (default) keeps it, `Delete` removes it.
    #[serde(default)]
    pub reclaim_policy: ReclaimPolicy,
}

/// Fate of a node's PersistentVolumeClaim when the node is removed.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReclaimPolicy {
    /// Keep the PersistentVolumeClaim.
    #[default]
    Retain,
    /// Delete the PersistentVolumeClaim.
    Delete,
}
