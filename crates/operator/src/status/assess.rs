//! From the facts of one pass to the ValkeyCluster conditions (pure).

use crate::cluster::plan::shards::TopologyFacts;
use valkey_api::status::condition;
use valkey_ops::SLOT_COUNT;

use super::conditions::Cond;

pub use valkey_api::status::reason;

/// Why the operator is changing the cluster: a `Progressing=True` reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activity {
    /// Generic work in progress (healing addresses, forgetting nodes, failing over).
    Reconciling,
    /// Nodes are being created, met or attached.
    AddingNodes,
    /// Nodes are being rolled or updated.
    UpdatingNodes,
    /// Slots are moving between shards.
    RebalancingSlots,
}

impl Activity {
    /// The contract reason.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Reconciling => reason::RECONCILING,
            Self::AddingNodes => reason::ADDING_NODES,
            Self::UpdatingNodes => reason::UPDATING_NODES,
            Self::RebalancingSlots => reason::REBALANCING_SLOTS,
        }
    }
}

/// Work the operator did or is waiting for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// What kind of work.
    pub activity: Activity,
    /// What exactly.
    pub message: String,
}

impl Progress {
    /// Progress of `activity`.
    pub fn new(activity: Activity, message: impl Into<String>) -> Self {
        Self {
            activity,
            message: message.into(),
        }
    }
}

/// What kind of topology step failed: a `Degraded=True` reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// Joining a node (MEET, slot assignment, replica attachment) failed.
    NodeAddFailed,
    /// Moving slots failed.
    RebalanceFailed,
}

/// A topology step that failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepFailure {
    /// What kind of step.
    pub kind: FailureKind,
    /// The error.
    pub message: String,
}

impl StepFailure {
    /// A failure of `kind`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The contract reason.
    pub fn reason(&self) -> &'static str {
        match self.kind {
            FailureKind::NodeAddFailed => reason::NODE_ADD_FAILED,
            FailureKind::RebalanceFailed => reason::REBALANCE_FAILED,
        }
    }
}

/// A child object of the ValkeyCluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Child {
    /// The headless Service.
    Service,
    /// The `valkey.conf` ConfigMap.
    ConfigMap,
    /// The ACL Secret (users).
    UsersAcl,
    /// The system users Secret.
    SystemUsers,
    /// A ValkeyNode.
    ValkeyNode,
    /// The PodDisruptionBudget.
    PodDisruptionBudget,
    /// The NetworkPolicy.
    NetworkPolicy,
    /// The config-check pod.
    ConfigCheck,
}

/// A child object that could not be built or applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildFailure {
    /// Which child.
    pub child: Child,
    /// The error.
    pub message: String,
}

impl ChildFailure {
    /// A failure of `child`.
    pub fn new(child: Child, message: impl Into<String>) -> Self {
        Self {
            child,
            message: message.into(),
        }
    }

    /// The contract reason (`Ready=False`).
    pub fn reason(&self) -> &'static str {
        match self.child {
            Child::Service => reason::SERVICE_ERROR,
            Child::ConfigMap => reason::CONFIG_MAP_ERROR,
            Child::UsersAcl => reason::USERS_ACL_ERROR,
            Child::SystemUsers => reason::SYSTEM_USERS_ACL_ERROR,
            Child::ValkeyNode => reason::VALKEY_NODE_ERROR,
            Child::PodDisruptionBudget => reason::PDB_ERROR,
            Child::NetworkPolicy => reason::NETWORK_POLICY_ERROR,
            Child::ConfigCheck => reason::CONFIG_CHECK_ERROR,
        }
    }
}

/// A restore Ready waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreGate {
    /// Not finished: what it is doing.
    InProgress(String),
    /// Refused or given up: why.
    Failed(String),
}

impl RestoreGate {
    /// The gate of a cluster with `spec.bootstrap` (`None` without one, or once restored).
    pub fn of(vc: &valkey_api::ValkeyCluster) -> Option<Self> {
        vc.spec.bootstrap.as_ref()?;
        let restore = vc.status.as_ref().and_then(|s| s.restore.as_ref());
        let message = restore.and_then(|r| r.message.clone());
        match restore.map(|r| r.phase) {
            Some(valkey_api::bootstrap::RestorePhase::Completed) => None,
            Some(valkey_api::bootstrap::RestorePhase::Failed) => Some(Self::Failed(
                message.unwrap_or_else(|| "the restore failed".into()),
            )),
            _ => Some(Self::InProgress(message.unwrap_or_else(|| {
                "waiting to restore spec.bootstrap.backup once the cluster has formed".into()
            }))),
        }
    }
}

/// How a Degraded `NodeAddFailed` message starts when a pod cannot be created (the event
/// `PodCreationFailed` keys on it).
pub const POD_CREATION_FAILED_PREFIX: &str = "a pod cannot be created: ";

/// Everything a pass learned that decides the conditions.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// Desired shard count.
    pub desired_shards: i32,
    /// A child object that failed to build or apply (the first one).
    pub apply_error: Option<ChildFailure>,
    /// A pod the scheduler cannot place: the scheduler's message (with the pod name).
    pub unschedulable: Option<String>,
    /// A pod its workload controller cannot create: the API server's words (with the
    /// ValkeyNode's name).
    pub pod_creation_failed: Option<String>,
    /// Explicit grace period below the recommended minimum: the warning message.
    pub grace_period_warning: Option<String>,
    /// Users whose rules allow changing ACLs: the warning message.
    pub acl_admin_warning: Option<String>,
    /// A server that refuses the operator's credentials: the message with the remedy.
    pub system_users_refused: Option<String>,
    /// `spec.config`/`spec.image` refused by the server's dry run: the warning message.
    pub invalid_config: Option<String>,
    /// What is wrong with the TLS Secret, when something is.
    pub invalid_tls: Option<String>,
    /// Claims that cannot grow to `persistence.size`: the warning message.
    pub resize_infeasible: Option<String>,
    /// Shards whose every copy was down at once, recently: what they lost
    /// (`status/shard_restart.rs`).
    pub shard_restart: Option<String>,
    /// The live topology.
    pub topology: TopologyFacts,
    /// Pods of the layout whose readiness probe has not passed (names, sorted).
    pub unready_pods: Vec<String>,
    /// `spec.bootstrap.backup` not restored yet (or refused): what `status.restore` says.
    pub restore: Option<RestoreGate>,
    /// Pods Kubernetes reports Ready that the operator cannot reach: `pod (error)`, sorted.
    pub unreachable_pods: Vec<String>,
    /// Work the operator did or is waiting for.
    pub progress: Option<Progress>,
    /// A topology step that failed.
    pub step_failure: Option<StepFailure>,
}

/// Computes the ValkeyCluster conditions from the facts of a pass.
pub fn conditions(f: &Facts) -> Vec<Cond> {
    let t = &f.topology;
    let slots_full = t.slots_assigned >= u32::from(SLOT_COUNT);
    let slots = if slots_full && t.slots_to_move > 0 {
        Cond::no(
            condition::SLOTS_ASSIGNED,
            reason::SLOTS_UNASSIGNED,
            format!(
                "all {SLOT_COUNT} slots have an owner; {} slots still move to balance {} shards",
                t.slots_to_move, f.desired_shards
            ),
        )
    } else if slots_full {
        Cond::yes(
            condition::SLOTS_ASSIGNED,
            reason::ALL_SLOTS_ASSIGNED,
            format!("all {SLOT_COUNT} slots have an owner"),
        )
    } else {
        Cond::no(
            condition::SLOTS_ASSIGNED,
            reason::SLOTS_UNASSIGNED,
            format!("{} of {SLOT_COUNT} slots have an owner", t.slots_assigned),
        )
    };

    let formed = if let Some(msg) = t.failover_stuck.as_ref().filter(|_| t.missing_shards > 0) {
        Cond::no(
            condition::CLUSTER_FORMED,
            reason::MISSING_SHARDS,
            msg.clone(),
        )
    } else if t.missing_shards > 0 {
        Cond::no(
            condition::CLUSTER_FORMED,
            reason::MISSING_SHARDS,
            format!(
                "{} of {} shards have no live primary owning slots",
                t.missing_shards, f.desired_shards
            ),
        )
    } else if t.missing_replicas > 0 || t.unjoined_nodes > 0 {
        Cond::no(
            condition::CLUSTER_FORMED,
            reason::MISSING_REPLICAS,
            missing_replicas_message(t),
        )
    } else {
        Cond::yes(
            condition::CLUSTER_FORMED,
            reason::TOPOLOGY_COMPLETE,
            format!("{} shards with all replicas joined", f.desired_shards),
        )
    };

    let ready = if let Some(e) = &f.apply_error {
        Cond::no(condition::READY, e.reason(), e.message.clone())
    } else if let Some(msg) = &f.system_users_refused {
        Cond::no(
            condition::READY,
            reason::SYSTEM_USERS_ACL_ERROR,
            msg.clone(),
        )
    } else if let Some(msg) = &f.unschedulable {
        Cond::no(condition::READY, reason::POD_UNSCHEDULABLE, msg.clone())
    } else if !f.unreachable_pods.is_empty() {
        Cond::no(
            condition::READY,
            reason::PODS_UNREACHABLE,
            format!(
                "the operator cannot reach pods that Kubernetes reports Ready: {}; check the pod \
                 network and any NetworkPolicy between the operator and the pods",
                crate::text::list("pods", &f.unreachable_pods)
            ),
        )
    } else if !formed.status {
        Cond::no(condition::READY, formed.reason, formed.message.clone())
    } else if let Some(msg) = &t.drain_no_room {
        Cond::no(condition::READY, reason::RECONCILING, msg.clone())
    } else if !slots.status {
        Cond::no(condition::READY, reason::RECONCILING, slots.message.clone())
    } else if t.surplus_nodes > 0 {
        let why = t
            .balance_blocked
            .as_deref()
            .map(|b| format!(" (waiting: {b})"))
            .unwrap_or_default();
        Cond::no(
            condition::READY,
            reason::RECONCILING,
            format!(
                "{} ValkeyNodes outside the layout are being removed{why}",
                t.surplus_nodes
            ),
        )
    } else if t.departed_nodes > 0 {
        Cond::no(
            condition::READY,
            reason::RECONCILING,
            format!(
                "{} departed nodes are still known to the cluster (forgotten once Valkey flags them failed)",
                t.departed_nodes
            ),
        )
    } else if !t.cluster_ok {
        Cond::no(
            condition::READY,
            reason::RECONCILING,
            "waiting for every node to report cluster_state:ok",
        )
    } else if t.unconverged_nodes > 0 {
        Cond::no(
            condition::READY,
            reason::RECONCILING,
            format!(
                "waiting for gossip: {} nodes' role, primary or slots are not yet shown by every node",
                t.unconverged_nodes
            ),
        )
    } else if let Some(first) = f.unready_pods.first() {
        Cond::no(
            condition::READY,
            reason::RECONCILING,
            format!(
                "waiting for {} pods to pass their readiness probe (first: {first})",
                f.unready_pods.len()
            ),
        )
    } else if let Some(gate) = &f.restore {
        match gate {
            RestoreGate::InProgress(m) => Cond::no(condition::READY, reason::RESTORING, m.clone()),
            RestoreGate::Failed(m) => Cond::no(condition::READY, reason::RESTORE_FAILED, m.clone()),
        }
    } else if let Some(p) = &f.progress {
        let r = if p.activity == Activity::UpdatingNodes {
            reason::UPDATING_NODES
        } else {
            reason::RECONCILING
        };
        Cond::no(condition::READY, r, p.message.clone())
    } else {
        Cond::yes(
            condition::READY,
            reason::CLUSTER_HEALTHY,
            format!(
                "{} shards serving all {SLOT_COUNT} slots with the desired replicas",
                f.desired_shards
            ),
        )
    };

    // The contract names only Degraded=True reasons; when nothing is impaired the condition
    // carries the Ready reason (`ClusterHealthy`, `Reconciling`, ...), so every reason a user
    // sees is one of the contract's.
    let degraded = if let Some(msg) = &f.pod_creation_failed {
        Cond::yes(condition::DEGRADED, reason::NODE_ADD_FAILED, msg.clone())
    } else if let Some(RestoreGate::Failed(msg)) = &f.restore {
        Cond::yes(condition::DEGRADED, reason::RESTORE_FAILED, msg.clone())
    } else if let Some(msg) = &f.unschedulable {
        Cond::yes(condition::DEGRADED, reason::POD_UNSCHEDULABLE, msg.clone())
    } else if let Some(e) = &f.step_failure {
        Cond::yes(condition::DEGRADED, e.reason(), e.message.clone())
    } else if let Some(msg) = &f.shard_restart {
        Cond::yes(condition::DEGRADED, reason::SHARD_RESTARTED, msg.clone())
    } else if let Some(msg) = &t.drain_no_room {
        Cond::yes(condition::DEGRADED, reason::REBALANCE_FAILED, msg.clone())
    } else if let Some(msg) = &f.invalid_tls {
        Cond::yes(condition::DEGRADED, reason::INVALID_TLS_SECRET, msg.clone())
    } else if let Some(msg) = &f.invalid_config {
        Cond::yes(condition::DEGRADED, reason::INVALID_CONFIG, msg.clone())
    } else if let Some(msg) = &f.resize_infeasible {
        Cond::yes(condition::DEGRADED, reason::RESIZE_INFEASIBLE, msg.clone())
    } else {
        Cond::no(
            condition::DEGRADED,
            ready.reason,
            "no failed operation and every pod is scheduled",
        )
    };

    let progressing = if let Some(p) = &f.progress {
        Cond::yes(
            condition::PROGRESSING,
            p.activity.reason(),
            p.message.clone(),
        )
    } else if ready.reason == reason::RESTORING {
        Cond::yes(
            condition::PROGRESSING,
            reason::RESTORING,
            ready.message.clone(),
        )
    } else if !ready.status
        && f.apply_error.is_none()
        && degraded.reason != reason::POD_UNSCHEDULABLE
        && degraded.reason != reason::RESTORE_FAILED
    {
        let r = if t.shards_present == 0 {
            reason::INITIALIZING
        } else {
            reason::RECONCILING
        };
        Cond::yes(condition::PROGRESSING, r, ready.message.clone())
    } else {
        Cond::no(
            condition::PROGRESSING,
            reason::RECONCILE_COMPLETE,
            "nothing left to do",
        )
    };

    let mut out = vec![ready, progressing, degraded, formed, slots];
    // One ConfigurationWarning: the most serious warning's reason, every warning's message.
    let warnings: Vec<(&'static str, &String)> = [
        (reason::INVALID_CONFIG, &f.invalid_config),
        (reason::RESIZE_INFEASIBLE, &f.resize_infeasible),
        (reason::GRACE_PERIOD_TOO_SHORT, &f.grace_period_warning),
        (reason::USER_CAN_CHANGE_ACLS, &f.acl_admin_warning),
    ]
    .into_iter()
    .filter_map(|(r, m)| Some((r, m.as_ref()?)))
    .collect();
    if let Some((first, _)) = warnings.first() {
        let messages: Vec<&str> = warnings.iter().map(|(_, m)| m.as_str()).collect();
        out.push(Cond::yes(
            condition::CONFIGURATION_WARNING,
            first,
            messages.join("; "),
        ));
    }
    out
}

fn missing_replicas_message(t: &TopologyFacts) -> String {
    match (t.missing_replicas, t.unjoined_nodes) {
        (r, 0) => format!("{r} replicas are not attached and in sync"),
        (0, u) => format!("{u} nodes have not joined the cluster"),
        (r, u) => {
            format!("{r} replicas are not attached and in sync, {u} nodes have not joined")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::plan::rebalance::NOT_ENOUGH_MEMORY;
    use crate::status::conditions::derive_state;
    use valkey_api::status::ClusterState;

    fn healthy() -> Facts {
        Facts {
            desired_shards: 3,
            topology: TopologyFacts {
                shards_present: 3,
                ready_shards: 3,
                slots_assigned: 16384,
                missing_shards: 0,
                missing_replicas: 0,
                cluster_ok: true,
                unjoined_nodes: 0,
                departed_nodes: 0,
                ..TopologyFacts::default()
            },
            ..Facts::default()
        }
    }

    #[test]
    fn unbalanced_slots_and_surplus_nodes_block_ready() {
        let mut f = healthy();
        f.topology.slots_to_move = 2731;
        let c = conditions(&f);
        let slots = c
            .iter()
            .find(|c| c.type_ == condition::SLOTS_ASSIGNED)
            .expect("slots");
        assert!(!slots.status);
        assert!(slots.message.contains("2731 slots still move"));
        let ready = c
            .iter()
            .find(|c| c.type_ == condition::READY)
            .expect("ready");
        assert!(!ready.status);
        let mut f = healthy();
        f.topology.surplus_nodes = 2;
        f.topology.balance_blocked = Some("shard 3 has no reachable primary".into());
        let ready = conditions(&f)
            .into_iter()
            .find(|c| c.type_ == condition::READY)
            .expect("ready");
        assert!(!ready.status);
        assert!(ready.message.contains("2 ValkeyNodes outside the layout"));
        assert!(ready.message.contains("no reachable primary"));
    }

    #[test]
    fn a_drain_without_room_is_degraded_and_says_what_is_missing() {
        let mut f = healthy();
        f.topology.slots_to_move = 4096;
        f.topology.surplus_nodes = 1;
        f.topology.drain_no_room = Some(format!("{NOT_ENOUGH_MEMORY} shard(s) 3: 15 MiB missing"));
        let c = conditions(&f);
        let degraded = get(&c, condition::DEGRADED);
        assert!(degraded.status);
        assert_eq!(degraded.reason, reason::REBALANCE_FAILED);
        assert!(degraded.message.contains("15 MiB missing"));
        let ready = get(&c, condition::READY);
        assert!(!ready.status);
        assert_eq!(ready.message, degraded.message);
    }

    #[test]
    fn departed_node_still_known_blocks_ready() {
        let mut f = healthy();
        f.topology.departed_nodes = 1;
        let c = conditions(&f);
        let ready = c
            .iter()
            .find(|c| c.type_ == condition::READY)
            .expect("ready");
        assert!(!ready.status);
        assert_eq!(ready.reason, reason::RECONCILING);
        assert!(ready.message.contains("departed"));
    }

    #[test]
    fn ready_waits_for_the_restore_and_a_failed_one_degrades() {
        let mut f = healthy();
        f.restore = Some(RestoreGate::InProgress("file 1 of 3".into()));
        let c = conditions(&f);
        let ready = get(&c, condition::READY);
        assert_eq!((ready.status, ready.reason), (false, reason::RESTORING));
        let progressing = get(&c, condition::PROGRESSING);
        assert_eq!(
            (
                progressing.status,
                progressing.reason,
                progressing.message.as_str()
            ),
            (true, reason::RESTORING, "file 1 of 3")
        );
        assert_eq!(
            super::super::conditions::derive_state(&c).0,
            ClusterState::Reconciling
        );
        f.restore = Some(RestoreGate::Failed("tampered".into()));
        let c = conditions(&f);
        assert_eq!(get(&c, condition::READY).reason, reason::RESTORE_FAILED);
        let degraded = get(&c, condition::DEGRADED);
        assert_eq!(
            (degraded.status, degraded.reason),
            (true, reason::RESTORE_FAILED)
        );
        assert!(!get(&c, condition::PROGRESSING).status);
        assert_eq!(
            super::super::conditions::derive_state(&c).0,
            ClusterState::Degraded
        );
    }

    #[test]
    fn ready_waits_until_every_node_shows_every_role() {
        let mut f = healthy();
        f.topology.unconverged_nodes = 1;
        let c = conditions(&f);
        let ready = get(&c, condition::READY);
        assert!(!ready.status);
        assert_eq!(ready.reason, reason::RECONCILING);
        assert!(ready.message.contains("waiting for gossip: 1 nodes"));
        assert!(get(&c, condition::PROGRESSING).status);
        assert!(get(&c, condition::CLUSTER_FORMED).status);
    }

    #[test]
    fn ready_waits_for_every_pod_to_pass_its_readiness_probe() {
        let mut f = healthy();
        f.unready_pods = vec!["c-0-1".into(), "c-2-0".into()];
        let c = conditions(&f);
        let ready = get(&c, condition::READY);
        assert!(!ready.status);
        assert_eq!(
            ready.message,
            "waiting for 2 pods to pass their readiness probe (first: c-0-1)"
        );
        assert!(get(&c, condition::PROGRESSING).status);
    }

    fn get<'a>(c: &'a [Cond], t: &str) -> &'a Cond {
        c.iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn healthy_cluster_is_ready() {
        let c = conditions(&healthy());
        assert!(get(&c, condition::READY).status);
        assert_eq!(get(&c, condition::READY).reason, "ClusterHealthy");
        assert!(!get(&c, condition::PROGRESSING).status);
        assert_eq!(get(&c, condition::PROGRESSING).reason, "ReconcileComplete");
        assert!(!get(&c, condition::DEGRADED).status);
        assert_eq!(
            get(&c, condition::CLUSTER_FORMED).reason,
            "TopologyComplete"
        );
        assert_eq!(
            get(&c, condition::SLOTS_ASSIGNED).reason,
            "AllSlotsAssigned"
        );
        assert!(
            c.iter()
                .all(|c| c.type_ != condition::CONFIGURATION_WARNING)
        );
        assert_eq!(derive_state(&c).0, ClusterState::Ready);
    }

    #[test]
    fn fresh_cluster_is_initializing() {
        let f = Facts {
            desired_shards: 3,
            topology: TopologyFacts {
                missing_shards: 3,
                missing_replicas: 3,
                ..TopologyFacts::default()
            },
            ..Facts::default()
        };
        let c = conditions(&f);
        assert_eq!(get(&c, condition::READY).reason, "MissingShards");
        assert_eq!(get(&c, condition::PROGRESSING).reason, "Initializing");
        assert_eq!(get(&c, condition::SLOTS_ASSIGNED).reason, "SlotsUnassigned");
        let (state, reason, _) = derive_state(&c);
        assert_eq!(state, ClusterState::Reconciling);
        assert_eq!(reason.as_deref(), Some("Initializing"));
    }

    #[test]
    fn missing_replica_after_failover_is_reconciling() {
        let mut f = healthy();
        f.topology.missing_replicas = 1;
        f.topology.ready_shards = 2;
        let c = conditions(&f);
        assert_eq!(get(&c, condition::READY).reason, "MissingReplicas");
        assert_eq!(get(&c, condition::CLUSTER_FORMED).reason, "MissingReplicas");
        assert_eq!(get(&c, condition::PROGRESSING).reason, "Reconciling");
        assert_eq!(derive_state(&c).0, ClusterState::Reconciling);
    }

    #[test]
    fn step_in_progress_blocks_ready() {
        let mut f = healthy();
        f.progress = Some(Progress::new(Activity::AddingNodes, "meeting 2 nodes"));
        let c = conditions(&f);
        assert!(!get(&c, condition::READY).status);
        assert_eq!(get(&c, condition::PROGRESSING).reason, "AddingNodes");
        assert_eq!(derive_state(&c).1.as_deref(), Some("AddingNodes"));
    }

    #[test]
    fn unschedulable_pod_degrades_with_scheduler_message() {
        let mut f = healthy();
        f.topology.missing_replicas = 1;
        f.unschedulable = Some("pod valkey-a-0-1-0: 0/3 nodes are available".into());
        let c = conditions(&f);
        assert_eq!(get(&c, condition::DEGRADED).reason, "PodUnschedulable");
        assert_eq!(get(&c, condition::READY).reason, "PodUnschedulable");
        let (state, reason, message) = derive_state(&c);
        assert_eq!(state, ClusterState::Degraded);
        assert_eq!(reason.as_deref(), Some("PodUnschedulable"));
        assert!(message.unwrap().contains("0/3 nodes are available"));
    }

    #[test]
    fn a_pod_that_cannot_be_created_degrades_with_the_api_servers_words() {
        let mut f = healthy();
        f.topology.missing_replicas = 1;
        f.pod_creation_failed = Some(format!(
            "{POD_CREATION_FAILED_PREFIX}ValkeyNode c-0-1: violates PodSecurity"
        ));
        let c = conditions(&f);
        assert_eq!(get(&c, condition::DEGRADED).reason, "NodeAddFailed");
        let (state, reason, message) = derive_state(&c);
        assert_eq!(state, ClusterState::Degraded);
        assert_eq!(reason.as_deref(), Some("NodeAddFailed"));
        assert!(message.unwrap().contains("violates PodSecurity"));
    }

    #[test]
    fn a_server_refusing_the_operator_is_named_with_the_remedy() {
        let mut f = healthy();
        f.system_users_refused = Some("pod c-0-0 refuses the operator's credentials".into());
        let c = conditions(&f);
        let ready = get(&c, condition::READY);
        assert_eq!(ready.reason, "SystemUsersACLError");
        assert!(ready.message.contains("c-0-0"));
    }

    #[test]
    fn a_shard_restart_degrades_a_serving_cluster_and_says_what_was_lost() {
        let mut f = healthy();
        f.shard_restart = Some("every copy of shard 0 at 2027-01-15T08:00:00Z was down".into());
        let c = conditions(&f);
        assert_eq!(get(&c, condition::DEGRADED).reason, "ShardRestarted");
        assert_eq!(get(&c, condition::READY).reason, "ClusterHealthy");
        let (state, reason, message) = derive_state(&c);
        assert_eq!(state, ClusterState::Degraded);
        assert_eq!(reason.as_deref(), Some("ShardRestarted"));
        assert!(message.unwrap().contains("shard 0"));
    }

    #[test]
    fn apply_error_fails() {
        let mut f = healthy();
        f.apply_error = Some(ChildFailure::new(Child::Service, "forbidden"));
        let c = conditions(&f);
        let (state, reason, _) = derive_state(&c);
        assert_eq!(state, ClusterState::Failed);
        assert_eq!(reason.as_deref(), Some("ServiceError"));
    }

    #[test]
    fn grace_period_warning_is_a_condition_not_a_state() {
        let mut f = healthy();
        f.grace_period_warning = Some("5s < 30s".into());
        let c = conditions(&f);
        assert_eq!(
            get(&c, condition::CONFIGURATION_WARNING).reason,
            "GracePeriodTooShort"
        );
        assert_eq!(derive_state(&c).0, ClusterState::Ready);
    }
}
