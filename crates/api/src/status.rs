//! Status types shared by the ValkeyCluster and ValkeyNode resources.

use std::collections::BTreeMap;

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

/// Condition reasons of a ValkeyCluster (see the status contract).
pub mod reason {
    /// Ready=True.
    pub const CLUSTER_HEALTHY: &str = "ClusterHealthy";
    /// Ready=False: the headless Service could not be applied.
    pub const SERVICE_ERROR: &str = "ServiceError";
    /// Ready=False: the ConfigMap could not be applied.
    pub const CONFIG_MAP_ERROR: &str = "ConfigMapError";
    /// Ready=False: the users ACL Secret could not be built or applied.
    pub const USERS_ACL_ERROR: &str = "UsersACLError";
    /// Ready=False: the system users Secret could not be built or applied.
    pub const SYSTEM_USERS_ACL_ERROR: &str = "SystemUsersACLError";
    /// Ready=False: a ValkeyNode could not be applied.
    pub const VALKEY_NODE_ERROR: &str = "ValkeyNodeError";
    /// Ready=False: the pod that dry-runs a new `spec.config` could not be created or deleted.
    pub const CONFIG_CHECK_ERROR: &str = "ConfigCheckError";
    /// Ready=False: the PodDisruptionBudget could not be applied.
    pub const PDB_ERROR: &str = "PodDisruptionBudgetError";
    /// Ready=False: the NetworkPolicy could not be applied or deleted.
    pub const NETWORK_POLICY_ERROR: &str = "NetworkPolicyError";
    /// Ready=False / Progressing=True: generic work in progress.
    pub const RECONCILING: &str = "Reconciling";
    /// Ready=False / Progressing=True: nodes are being rolled.
    pub const UPDATING_NODES: &str = "UpdatingNodes";
    /// Ready=False / ClusterFormed=False: a shard has no live primary owning slots.
    pub const MISSING_SHARDS: &str = "MissingShards";
    /// Ready=False / ClusterFormed=False: a shard lacks synced replicas.
    pub const MISSING_REPLICAS: &str = "MissingReplicas";
    /// Ready=False / Degraded=True: a pod cannot be scheduled.
    pub const POD_UNSCHEDULABLE: &str = "PodUnschedulable";
    /// Ready=False: pods Kubernetes reports Ready do not answer the operator (a timeout, a
    /// refused connection); the message names them with the error.
    pub const PODS_UNREACHABLE: &str = "PodsUnreachable";
    /// Ready=False / Progressing=True: `spec.bootstrap.backup` is being restored (see
    /// `status.restore`).
    pub const RESTORING: &str = "Restoring";
    /// Ready=False / Degraded=True: `spec.bootstrap.backup` was refused or could not be
    /// restored; `status.restore.message` says why.
    pub const RESTORE_FAILED: &str = "RestoreFailed";
    /// Progressing=True before the cluster first formed.
    pub const INITIALIZING: &str = "Initializing";
    /// Progressing=True: nodes are being met / attached.
    pub const ADDING_NODES: &str = "AddingNodes";
    /// Progressing=True: slots are moving.
    pub const REBALANCING_SLOTS: &str = "RebalancingSlots";
    /// Progressing=False.
    pub const RECONCILE_COMPLETE: &str = "ReconcileComplete";
    /// Degraded=True: the TLS Secret is missing, incomplete or holds a certificate the
    /// operator cannot accept (expired, not yet valid, not signed by its `ca.crt`, a key that
    /// does not match); the message names the Secret and the problem.
    pub const INVALID_TLS_SECRET: &str = "InvalidTLSSecret";
    /// Degraded=True: joining a node failed.
    pub const NODE_ADD_FAILED: &str = "NodeAddFailed";
    /// Degraded=True: moving slots failed.
    pub const REBALANCE_FAILED: &str = "RebalanceFailed";
    /// ClusterFormed=True.
    pub const TOPOLOGY_COMPLETE: &str = "TopologyComplete";
    /// SlotsAssigned=True.
    pub const ALL_SLOTS_ASSIGNED: &str = "AllSlotsAssigned";
    /// SlotsAssigned=False.
    pub const SLOTS_UNASSIGNED: &str = "SlotsUnassigned";
    /// ConfigurationWarning=True.
    pub const GRACE_PERIOD_TOO_SHORT: &str = "GracePeriodTooShort";
    /// ConfigurationWarning=True: the Valkey server of `spec.image` refuses `spec.config`; the
    /// pods keep the last accepted image and settings.
    pub const INVALID_CONFIG: &str = "InvalidConfig";
    /// ConfigurationWarning=True: a ValkeyNode's claim cannot grow to `persistence.size` (its
    /// StorageClass does not allow volume expansion, or the resize failed for good).
    pub const RESIZE_INFEASIBLE: &str = "ResizeInfeasible";
    /// Degraded=True (for ten minutes after it came back): every copy of a shard was down at
    /// once, so it serves only what its files held; the message names the shard, the time and
    /// what the persistence settings kept.
    pub const SHARD_RESTARTED: &str = "ShardRestarted";
    /// ConfigurationWarning=True: a user's rules allow `ACL SETUSER`, so it can change the
    /// operator's system users and lock the operator out; the message names the users.
    pub const USER_CAN_CHANGE_ACLS: &str = "UserCanChangeACLs";
}

/// Event reasons (see the status contract): on the ValkeyCluster unless noted.
pub mod event {
    /// The headless Service was created.
    pub const SERVICE_CREATED: &str = "ServiceCreated";
    /// The headless Service was updated.
    pub const SERVICE_UPDATED: &str = "ServiceUpdated";
    /// Applying the headless Service failed (Warning).
    pub const SERVICE_UPDATE_FAILED: &str = "ServiceUpdateFailed";
    /// The ConfigMap was created.
    pub const CONFIG_MAP_CREATED: &str = "ConfigMapCreated";
    /// The ConfigMap was updated.
    pub const CONFIG_MAP_UPDATED: &str = "ConfigMapUpdated";
    /// Applying the ConfigMap failed (Warning).
    pub const CONFIG_MAP_UPDATE_FAILED: &str = "ConfigMapUpdateFailed";
    /// The system users Secret was created.
    pub const INTERNAL_SECRETS_CREATED: &str = "InternalSecretsCreated";
    /// The system users Secret was updated.
    pub const INTERNAL_SECRETS_UPDATED: &str = "InternalSecretsUpdated";
    /// The PodDisruptionBudget was created.
    pub const PDB_CREATED: &str = "PodDisruptionBudgetCreated";
    /// The PodDisruptionBudget was updated.
    pub const PDB_UPDATED: &str = "PodDisruptionBudgetUpdated";
    /// A PodDisruptionBudget was deleted (mode Disabled, or replaced when the mode changed).
    pub const PDB_DELETED: &str = "PodDisruptionBudgetDeleted";
    /// The NetworkPolicy was created.
    pub const NETWORK_POLICY_CREATED: &str = "NetworkPolicyCreated";
    /// The NetworkPolicy was updated.
    pub const NETWORK_POLICY_UPDATED: &str = "NetworkPolicyUpdated";
    /// The NetworkPolicy was deleted (`networking.networkPolicy.enabled` turned off).
    pub const NETWORK_POLICY_DELETED: &str = "NetworkPolicyDeleted";
    /// ValkeyNodes were created.
    pub const VALKEY_NODE_CREATED: &str = "ValkeyNodeCreated";
    /// ValkeyNodes were updated.
    pub const VALKEY_NODE_UPDATED: &str = "ValkeyNodeUpdated";
    /// A ValkeyNode was deleted.
    pub const VALKEY_NODE_DELETED: &str = "ValkeyNodeDeleted";
    /// Nodes were introduced to the cluster.
    pub const CLUSTER_MEET_BATCH: &str = "ClusterMeetBatch";
    /// Introducing a node failed (Warning).
    pub const CLUSTER_MEET_FAILED: &str = "ClusterMeetFailed";
    /// Slots were assigned to one primary.
    pub const PRIMARY_CREATED: &str = "PrimaryCreated";
    /// Slots were assigned to several primaries.
    pub const PRIMARIES_CREATED: &str = "PrimariesCreated";
    /// Assigning slots failed (Warning).
    pub const SLOT_ASSIGNMENT_FAILED: &str = "SlotAssignmentFailed";
    /// One replica was attached.
    pub const REPLICA_CREATED: &str = "ReplicaCreated";
    /// Several replicas were attached.
    pub const REPLICAS_ATTACHED: &str = "ReplicasAttached";
    /// Attaching a replica failed (Warning).
    pub const REPLICA_CREATION_FAILED: &str = "ReplicaCreationFailed";
    /// Peers known under an old address were met again.
    pub const STALE_ADDRESSES_HEALED: &str = "StaleAddressesHealed";
    /// A departed node was forgotten.
    pub const STALE_NODE_FORGOTTEN: &str = "StaleNodeForgotten";
    /// Forgetting a node failed (Warning).
    pub const NODE_FORGET_FAILED: &str = "NodeForgetFailed";
    /// Slots moved to balance the shards.
    pub const SLOTS_REBALANCING: &str = "SlotsRebalancing";
    /// Moving slots failed (Warning).
    pub const SLOT_REBALANCE_FAILED: &str = "SlotRebalanceFailed";
    /// Slots moved off shards being removed.
    pub const SLOTS_DRAINING: &str = "SlotsDraining";
    /// Draining a shard failed or cannot start (Warning).
    pub const DRAIN_FAILED: &str = "DrainFailed";
    /// A failover was started.
    pub const FAILOVER_INITIATED: &str = "FailoverInitiated";
    /// A shard's primary moved to another pod.
    pub const FAILOVER_COMPLETED: &str = "FailoverCompleted";
    /// A failover command failed (Warning).
    pub const FAILOVER_FAILED: &str = "FailoverFailed";
    /// A shard's primary was handed back to its node-index-0 pod (failback).
    pub const FAILBACK_COMPLETED: &str = "FailbackCompleted";
    /// Handing a shard's primary back to its node-index-0 pod failed (Warning).
    pub const FAILBACK_FAILED: &str = "FailbackFailed";
    /// A promoted replica did not report itself primary in time (Warning).
    pub const FAILOVER_TIMEOUT: &str = "FailoverTimeout";
    /// The cluster became Ready.
    pub const CLUSTER_READY: &str = "ClusterReady";
    /// A pod cannot be scheduled (Warning).
    pub const POD_UNSCHEDULABLE: &str = "PodUnschedulable";
    /// Pods Kubernetes reports Ready do not answer the operator (Warning).
    pub const PODS_UNREACHABLE: &str = "PodsUnreachable";
    /// The workload controller cannot create a pod: the API server refuses it (Warning).
    pub const POD_CREATION_FAILED: &str = "PodCreationFailed";
    /// The explicit grace period is below the recommended minimum (Warning).
    pub const GRACE_PERIOD_TOO_SHORT: &str = "GracePeriodTooShort";
    /// `spec.config` or `spec.image` is refused by the server's dry run (Warning).
    pub const INVALID_CONFIG: &str = "InvalidConfig";
    /// The TLS Secret became unusable (Warning).
    pub const INVALID_TLS_SECRET: &str = "InvalidTLSSecret";
    /// A user's rules allow changing ACLs (Warning).
    pub const USER_CAN_CHANGE_ACLS: &str = "UserCanChangeACLs";
    /// A ValkeyNode's claim cannot grow to the requested size (Warning).
    pub const RESIZE_INFEASIBLE: &str = "ResizeInfeasible";
    /// Every copy of a shard was down at once: acknowledged writes its files did not hold are
    /// lost (Warning).
    pub const SHARD_RESTARTED: &str = "ShardRestarted";
    /// A server's system users were changed (by a user allowed to change ACLs) and the
    /// operator applied them again from the ACL file (Warning).
    pub const SYSTEM_USERS_RESTORED: &str = "SystemUsersRestored";
    /// On a ValkeyNode: a pod template change was written to its workload.
    pub const WORKLOAD_ROLL_APPLIED: &str = "WorkloadRollApplied";
    /// On a ValkeyNode: a pod template change waits for the cluster controller.
    pub const WORKLOAD_ROLL_DEFERRED: &str = "WorkloadRollDeferred";
    /// On a ValkeyNode: applying live settings failed (Warning).
    pub const LIVE_CONFIG_APPLY_FAILED: &str = "LiveConfigApplyFailed";
    /// On a ValkeyNode: loading the ACL failed (Warning).
    pub const LIVE_ACL_APPLY_FAILED: &str = "LiveACLApplyFailed";
    /// A user is held out of the ACL file: its password Secret or key is missing, or Valkey
    /// refuses its rules (Warning).
    pub const USERS_ACL_ERROR: &str = "UsersACLError";
    /// On a ValkeyNode: reloading the TLS certificate failed (Warning).
    pub const TLS_RELOAD_FAILED: &str = "TLSReloadFailed";
}

/// Condition types of a ValkeyNode (see the status contract).
pub mod node_condition {
    /// Pod ready and workload rolled out.
    pub const READY: &str = "Ready";
    /// The claim is bound.
    pub const PVC_READY: &str = "PersistentVolumeClaimReady";
    /// The claim has the requested size.
    pub const PVC_SIZE_READY: &str = "PersistentVolumeClaimSizeReady";
    /// A template change waits for the cluster controller's authorization.
    pub const WORKLOAD_ROLL_PENDING: &str = "WorkloadRollPending";
    /// Live settings are in effect on the pod.
    pub const LIVE_CONFIG_APPLIED: &str = "LiveConfigApplied";
    /// The ACL revision is loaded on the pod.
    pub const ACL_APPLIED: &str = "ACLApplied";
    /// The pod serves the TLS Secret's certificate and has loaded its CA bundle.
    pub const TLS_CERTIFICATE_APPLIED: &str = "TLSCertificateApplied";
}

/// Condition reasons of a ValkeyNode (see the status contract).
pub mod node_reason {
    /// Ready=True.
    pub const POD_RUNNING: &str = "PodRunning";
    /// Ready=False: pod missing, not ready or workload not rolled out.
    pub const POD_NOT_READY: &str = "PodNotReady";
    /// Ready=False: the workload controller cannot create the pod (Pod Security admission, a
    /// ResourceQuota, a LimitRange, a webhook); the message quotes the API server.
    pub const POD_CREATION_FAILED: &str = "PodCreationFailed";
    /// Ready=False / PersistentVolumeClaimReady=False: claim not bound.
    pub const PVC_PENDING: &str = "PersistentVolumeClaimPending";
    /// PersistentVolumeClaimReady=True.
    pub const PVC_BOUND: &str = "PersistentVolumeClaimBound";
    /// Size satisfied.
    pub const PVC_SIZE_SATISFIED: &str = "PersistentVolumeClaimSizeSatisfied";
    /// Resize requested, not started.
    pub const PVC_RESIZE_PENDING: &str = "PersistentVolumeClaimResizePending";
    /// Resize running.
    pub const PVC_RESIZE_IN_PROGRESS: &str = "PersistentVolumeClaimResizeInProgress";
    /// Resize impossible.
    pub const PVC_RESIZE_INFEASIBLE: &str = "PersistentVolumeClaimResizeInfeasible";
    /// WorkloadRollPending=True.
    pub const AWAITING_WORKLOAD_REVISION: &str = "AwaitingWorkloadRevision";
    /// LiveConfigApplied / ACLApplied = True: the desired state is in effect.
    pub const APPLIED: &str = "Applied";
    /// LiveConfigApplied / ACLApplied = False: the command was refused or failed.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// ACLApplied=False: the pod's mounted ACL file is not the new revision yet.
    pub const PENDING_PROPAGATION: &str = "PendingPropagation";
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

/// The image and settings a server dry run accepted: the pods are rendered from these while a
/// newer `spec.image` or `spec.config` is being checked or was refused.
/// The TLS certificate the pods serve (`status.tls`).
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TlsStatus {
    /// SHA-256 fingerprint (hex) of the certificate in `tls.crt` of the TLS Secret.
    pub certificate_sha256: String,
    /// Pods that serve this certificate (read from a TLS handshake with each pod) and have
    /// reloaded the Secret's files. Below `pods` while a rotation propagates: the kubelet
    /// updates a pod's mounted Secret within about a minute, and the operator then reloads it
    /// with `CONFIG SET tls-cert-file ...` (no restart).
    pub serving_pods: i32,
    /// Pods of the cluster.
    pub pods: i32,
}

#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedConfig {
    /// Fingerprint of the image and the rendered `spec.config` lines.
    pub fingerprint: String,
    /// The accepted `spec.image`.
    pub image: String,
    /// The accepted `spec.config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<BTreeMap<String, String>>,
}

/// A `spec.image` + `spec.config` that the server's dry run refused.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RejectedConfig {
    /// Fingerprint of the image and the rendered `spec.config` lines.
    pub fingerprint: String,
    /// What the server said (the refused line and why).
    pub message: String,
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
    /// With `failback.mode: Automatic`, while the shard's primary is not its node-index-0 pod:
    /// when the operator hands it back (the end of the quiet period; a new failover or any
    /// other operation restarts it). Absent while the cluster is not quiet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failback_at: Option<Time>,
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
    /// Slot balance (rebalance or drain): slots that change owner in the whole operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_total: Option<i32>,
    /// Slot balance: slots moved so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots_moved: Option<i32>,
    /// Slot balance: keys moved so far (counted by key-by-key migration on Valkey 8, and for
    /// atomic slot migration on Valkey 9 the keys the slots held when their batch started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_moved: Option<i64>,
    /// Slot balance: keys moved per second since the operation started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_per_second: Option<i64>,
    /// Slot balance: estimated seconds until done, from the rate so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
}

/// Standard Kubernetes conditions, a list keyed by `type`.
pub type Conditions = Vec<Condition>;
