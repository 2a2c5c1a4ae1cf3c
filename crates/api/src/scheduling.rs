//! `spec.scheduling`: pass-through pod scheduling fields and the node/zone spread axes.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration, TopologySpreadConstraint};
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Node label keying the node axis.
pub const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";
/// Node label keying the zone axis.
pub const ZONE_TOPOLOGY_KEY: &str = "topology.kubernetes.io/zone";
/// Maximum number of pass-through topology spread constraints.
pub const MAX_TOPOLOGY_SPREAD_CONSTRAINTS: u64 = 16;

/// Message: node.spread primaries and pods with the same enabled mode.
pub const NODE_SPREAD_MESSAGE: &str = "spec.scheduling.node.spread: primaries and pods must not \
     both be Required or both be Preferred (two equal constraints on kubernetes.io/hostname): \
     change one of them or set it to Disabled";
/// Message: zone.spread with two dimensions of the same enabled mode.
pub const ZONE_SPREAD_MESSAGE: &str = "spec.scheduling.zone.spread: at most one of shard, \
     primaries and pods may be Required and at most one may be Preferred: set the others to \
     Disabled";
/// Message: hostname pass-through constraint collides with node.spread.
pub const HOSTNAME_COLLISION_MESSAGE: &str = "spec.scheduling.topologySpreadConstraints: a \
     constraint on kubernetes.io/hostname collides with node.spread.primaries/pods of the same \
     strength (Required renders DoNotSchedule, Preferred renders ScheduleAnyway): remove the \
     constraint and use scheduling.node.spread, or change its whenUnsatisfiable";
/// Message: zone pass-through constraint collides with zone.spread.
pub const ZONE_COLLISION_MESSAGE: &str = "spec.scheduling.topologySpreadConstraints: a \
     constraint on topology.kubernetes.io/zone collides with zone.spread.shard/primaries/pods of \
     the same strength (Required renders DoNotSchedule, Preferred renders ScheduleAnyway): \
     remove the constraint and use scheduling.zone.spread, or change its whenUnsatisfiable";

/// Scheduling of the Valkey pods.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.topologySpreadConstraints) || !self.topologySpreadConstraints.exists(c, \
     c.topologyKey == 'kubernetes.io/hostname' && \
     ((c.whenUnsatisfiable == 'DoNotSchedule' && (self.node.spread.primaries.mode == 'Required' || self.node.spread.pods.mode == 'Required')) || \
      (c.whenUnsatisfiable == 'ScheduleAnyway' && (self.node.spread.primaries.mode == 'Preferred' || self.node.spread.pods.mode == 'Preferred'))))"
).message(HOSTNAME_COLLISION_MESSAGE))]
#[x_kube(validation = kube::core::Rule::new(
    "!has(self.topologySpreadConstraints) || !self.topologySpreadConstraints.exists(c, \
     c.topologyKey == 'topology.kubernetes.io/zone' && \
     ((c.whenUnsatisfiable == 'DoNotSchedule' && [self.zone.spread.shard.mode, self.zone.spread.primaries.mode, self.zone.spread.pods.mode].exists(m, m == 'Required')) || \
      (c.whenUnsatisfiable == 'ScheduleAnyway' && [self.zone.spread.shard.mode, self.zone.spread.primaries.mode, self.zone.spread.pods.mode].exists(m, m == 'Preferred'))))"
).message(ZONE_COLLISION_MESSAGE))]
pub struct SchedulingSpec {
    /// Tolerations added to every Valkey pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Node labels every Valkey pod's node must carry, for example
    /// `{kubernetes.io/arch: amd64, node-pool: valkey}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Affinity rules added to every Valkey pod (merged with the anti-affinity that
    /// `node.spread.shard` renders).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,

    /// PriorityClass of every Valkey pod; it must exist. Protects the pods from eviction under
    /// resource pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,

    /// Raw topology spread constraints rendered verbatim onto every Valkey pod. Supply your own
    /// labelSelector (for example `valkey.io/cluster: <name>`): without one the constraint
    /// matches nothing. Prefer `node.spread` and `zone.spread` for hostname and zone spreading;
    /// a constraint on `kubernetes.io/hostname` or `topology.kubernetes.io/zone` with the same
    /// whenUnsatisfiable as an enabled spread dimension is rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,

    /// Spreading across worker nodes (`kubernetes.io/hostname`).
    #[serde(default)]
    pub node: NodeAxis,

    /// Spreading across zones (`topology.kubernetes.io/zone`).
    #[serde(default)]
    pub zone: ZoneAxis,
}

/// Node axis (`kubernetes.io/hostname`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "self.spread.primaries.mode == 'Disabled' || self.spread.primaries.mode != self.spread.pods.mode"
).message(NODE_SPREAD_MESSAGE))]
pub struct NodeAxis {
    /// Spread dimensions on worker nodes. `shard` renders pod anti-affinity keeping a shard's
    /// pods on different nodes; `primaries` renders a topology spread constraint over each
    /// shard's node-index-0 pod (the primary at creation, not the live primary); `pods` renders a
    /// topology spread constraint over all pods of the cluster. `primaries` and `pods` must not
    /// both be Required or both be Preferred.
    #[serde(default)]
    pub spread: Spread,
}

/// Zone axis (`topology.kubernetes.io/zone`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "[self.spread.shard.mode, self.spread.primaries.mode, self.spread.pods.mode].filter(m, m == 'Required').size() <= 1 && \
     [self.spread.shard.mode, self.spread.primaries.mode, self.spread.pods.mode].filter(m, m == 'Preferred').size() <= 1"
).message(ZONE_SPREAD_MESSAGE))]
pub struct ZoneAxis {
    /// Spread dimensions across zones, each a topology spread constraint: `shard` balances each
    /// shard's pods, `primaries` each shard's node-index-0 pod (the primary at creation), `pods`
    /// all pods of the cluster. At most one may be Required and at most one Preferred.
    #[serde(default)]
    pub spread: Spread,
}

/// The three spread dimensions of an axis.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// Keep the pods of one shard (a primary and its replicas) apart.
    #[serde(default)]
    pub shard: SpreadRule,
    /// Spread the pod holding each shard's primary at creation (node index 0).
    #[serde(default)]
    pub primaries: SpreadRule,
    /// Spread all pods of the cluster regardless of shard.
    #[serde(default)]
    pub pods: SpreadRule,
}

/// One spread dimension.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SpreadRule {
    /// `Disabled` (default) emits nothing; `Preferred` is a soft rule (ScheduleAnyway /
    /// preferred anti-affinity); `Required` is a hard rule (DoNotSchedule / required
    /// anti-affinity) that leaves a pod Pending when it cannot be satisfied.
    #[serde(default)]
    pub mode: SpreadMode,
}

/// Strength of a spread dimension.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpreadMode {
    /// Emit nothing.
    #[default]
    Disabled,
    /// Soft rule.
    Preferred,
    /// Hard rule.
    Required,
}

impl SpreadMode {
    /// `whenUnsatisfiable` of the topology spread constraint this mode renders, if any.
    pub fn when_unsatisfiable(self) -> Option<&'static str> {
        match self {
            SpreadMode::Disabled => None,
            SpreadMode::Preferred => Some("ScheduleAnyway"),
            SpreadMode::Required => Some("DoNotSchedule"),
        }
    }

    /// Whether the dimension emits anything.
    pub fn is_enabled(self) -> bool {
        self != SpreadMode::Disabled
    }
}
