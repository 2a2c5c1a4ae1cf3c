//! Label, annotation and field-manager names shared by the operator's components.

/// Label carrying the owning ValkeyCluster's name.
pub const CLUSTER: &str = "valkey.io/cluster";
/// Label carrying the shard index of a ValkeyNode / pod.
pub const SHARD_INDEX: &str = "valkey.io/shard-index";
/// Label carrying the node index inside its shard (0 is the primary at creation).
pub const NODE_INDEX: &str = "valkey.io/node-index";

/// `app.kubernetes.io/name` label key.
pub const APP_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/instance` label key (value: the cluster name).
pub const APP_INSTANCE: &str = "app.kubernetes.io/instance";
/// `app.kubernetes.io/component` label key.
pub const APP_COMPONENT: &str = "app.kubernetes.io/component";
/// `app.kubernetes.io/managed-by` label key.
pub const APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// `app.kubernetes.io/part-of` label key.
pub const APP_PART_OF: &str = "app.kubernetes.io/part-of";

/// Value of `app.kubernetes.io/name` on every object the operator creates.
pub const APP_NAME_VALUE: &str = "valkey";
/// Value of `app.kubernetes.io/managed-by`.
pub const MANAGED_BY_VALUE: &str = "valkey-operator";
/// Value of `app.kubernetes.io/component` on Valkey node workloads and pods.
pub const COMPONENT_NODE: &str = "valkey-node";

/// Annotation on pod templates carrying the rendered config hash.
pub const CONFIG_HASH_ANNOTATION: &str = "valkey.io/config-hash";
/// Annotation on workloads carrying the applied ValkeyNode workload revision.
pub const WORKLOAD_REVISION_ANNOTATION: &str = "valkey.io/workload-revision";

/// Server-side-apply field manager of the ValkeyCluster controller.
pub const CLUSTER_FIELD_MANAGER: &str = "valkey-operator/cluster";
/// Server-side-apply field manager of the ValkeyNode controller.
pub const NODE_FIELD_MANAGER: &str = "valkey-operator/node";
/// Server-side-apply field manager of the ValkeyBackup controller.
pub const BACKUP_FIELD_MANAGER: &str = "valkey-operator/backup";
/// Field manager used when installing CRDs.
pub const CRD_FIELD_MANAGER: &str = "valkey-operator/crd";
/// Value of `app.kubernetes.io/component` on the pods that dry-run a cluster's configuration.
pub const COMPONENT_CONFIG_CHECK: &str = "config-check";
/// Label of a config-check pod: the fingerprint of the image and settings it checks.
pub const CONFIG_FINGERPRINT: &str = "valkey.io/config-fingerprint";
