//! Rolling updates (pure): which ValkeyNode's pending pod-template change to authorize next.
//!
//! The ValkeyNode controller holds back a pod-template change (`WorkloadRollPending`) until
//! `spec.workloadRevision` changes. This planner authorizes one node at a time, only while
//! the cluster is otherwise healthy and no authorized roll is still in flight: replicas first;
//! a primary is first demoted by a coordinated `CLUSTER FAILOVER` on its most caught-up synced
//! replica (no acknowledged write is lost), then rolled as a replica. A pending node whose pod
//! is not ready is rolled out of turn (its new template may be the fix) only when it holds no
//! copy its shard needs; a not-ready primary owning slots hands over to a synced replica first,
//! and otherwise waits, as does a replica of a shard without a writer.
//!
//! Like a StatefulSet's `minReadySeconds`, the next step of a healthy roll also waits until
//! every node has been ready for [`ROLL_SETTLE`] ([`settle_left`]).

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use valkey_api::ValkeyNode;
use valkey_api::status::node_condition::{READY, WORKLOAD_ROLL_PENDING};
use valkey_ops::{Member, Topology};

/// The next step of a rolling update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RollStep {
    /// Bump the node's `spec.workloadRevision`: its pod is replaced with the new template.
    Authorize {
        /// ValkeyNode name.
        node: String,
    },
    /// Demote a pending primary first: coordinated `CLUSTER FAILOVER` on this replica.
    Failover {
        /// Address of the replica to promote.
        replica: SocketAddr,
        /// Shard index.
        shard: i32,
        /// ValkeyNode name of the primary to be rolled afterwards.
        primary: String,
    },
}

/// How long every node must have been ready before a healthy roll takes its next step (stops
/// the next pod or hands a primary over). A pod's start brings a burst of work: its status,
/// the StatefulSet's, endpoints and the disruption budget are updated, and a replica has just
/// finished its full sync. Handing a primary over, or stopping a pod, in that burst made
/// clients' writes stall 2 to 5 times longer than the same failover at a quiet moment on a
/// 2-core node (`bench_failover`). Ready times have a resolution of one second, so the wait
/// after the last node became ready is 2 to 3 s.
pub const ROLL_SETTLE: Duration = Duration::from_secs(3);

/// How long until every node of `nodes` has been ready for [`ROLL_SETTLE`] at `now` (by its
/// `Ready` condition's last transition), `None` when they all have. A node that is not ready
/// does not count (the roll waits for it anyway).
pub fn settle_left(nodes: &[ValkeyNode], now: Timestamp) -> Option<Duration> {
    nodes
        .iter()
        .filter_map(|n| {
            let c = n
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == READY)?;
            (c.status == "True").then_some(c.last_transition_time.0)
        })
        .filter_map(|since| {
            let ready_for = Duration::try_from(now.duration_since(since)).unwrap_or_default();
            ROLL_SETTLE.checked_sub(ready_for).filter(|d| !d.is_zero())
        })
        .max()
}

/// Whether every node of `nodes` reports `Ready=True`.
pub fn all_ready(nodes: &[ValkeyNode]) -> bool {
    nodes.iter().all(|n| {
        n.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == READY && c.status == "True")
        })
    })
}

fn pending(node: &ValkeyNode) -> bool {
    node.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == WORKLOAD_ROLL_PENDING && c.status == "True")
    })
}

/// A workload that exists with another revision than the authorized one (its roll was just
/// authorized). A node whose workload was never written is being created, not rolled.
fn rolling(node: &ValkeyNode) -> bool {
    let applied = node
        .status
        .as_ref()
        .and_then(|s| s.applied_workload_revision.as_deref());
    applied.is_some() && node.spec.workload_revision.as_deref() != applied
}

/// A roll in flight, or a node that is not ready (its workload still rolling out, its pod not
/// back, or not created yet) and not itself waiting for a roll: no further roll starts.
fn in_flight(node: &ValkeyNode) -> bool {
    let ready = node.status.as_ref().is_some_and(|s| s.ready);
    rolling(node) || (!ready && !pending(node))
}

fn member_of<'a>(node: &ValkeyNode, topology: &'a Topology) -> Option<&'a Member> {
    topology.at(node.spec.shard_index, node.spec.node_index)
}

/// The roll step for a pending node whose pod is not ready, or `None` while it must wait:
///
/// - no server process (no running pod, or its port refuses connections), an empty primary, or
///   a replica of a shard that still has a writer holds no copy the shard needs: roll it now;
/// - a primary owning slots hands them over to its most caught-up synced replica first, and
///   waits while it has none (for example while its replica is in a full sync);
/// - a replica of a shard without a writer may hold the shard's last copy: wait;
/// - a pod the operator cannot reach but that does not refuse connections: wait.
fn not_ready_step(node: &ValkeyNode, topology: &Topology) -> Option<RollStep> {
    let authorize = RollStep::Authorize {
        node: node.name_any(),
    };
    let Some(m) = member_of(node, topology) else {
        return Some(authorize);
    };
    let Some(me) = m.me() else {
        return m.refused.then_some(authorize);
    };
    if me.is_replica() {
        return topology.writer(m.shard).is_some().then_some(authorize);
    }
    if !me.owns_slots() {
        return Some(authorize);
    }
    topology.best_synced_replica(m).map(|r| RollStep::Failover {
        replica: r.addr,
        shard: node.spec.shard_index,
        primary: node.name_any(),
    })
}

/// The next roll step. `healthy`: the topology needs no step and every shard has its primary
/// and synced replicas.
pub fn next_roll(nodes: &[ValkeyNode], topology: &Topology, healthy: bool) -> Option<RollStep> {
    // A node whose new spec the ValkeyNode controller has not reported on may be about to
    // wait for a roll too: deciding without it could hand a primary over before its replica
    // rolled, then hand the role back when that replica's turn comes (two failovers where one
    // does). The controller reports within a pass.
    if nodes.iter().any(|n| in_flight(n) || unobserved(n)) {
        return None;
    }
    let mut waiting: Vec<&ValkeyNode> = nodes.iter().filter(|n| pending(n)).collect();
    waiting.sort_by_key(|n| (n.spec.shard_index, n.spec.node_index));
    let authorize = |n: &ValkeyNode| RollStep::Authorize { node: n.name_any() };

    // A pod that is not ready: out of turn, when that loses no copy its shard needs.
    if let Some(step) = waiting
        .iter()
        .filter(|n| !n.status.as_ref().is_some_and(|s| s.ready))
        .find_map(|n| not_ready_step(n, topology))
    {
        return Some(step);
    }
    if !healthy {
        return None;
    }
    if let Some(n) = waiting.iter().find(|n| {
        member_of(n, topology)
            .and_then(Member::me)
            .is_some_and(|m| m.is_replica())
    }) {
        return Some(authorize(n));
    }
    let n = waiting.first()?;
    let primary = member_of(n, topology).filter(|m| m.me().is_some())?;
    match topology.best_synced_replica(primary) {
        Some(r) => Some(RollStep::Failover {
            replica: r.addr,
            shard: n.spec.shard_index,
            primary: n.name_any(),
        }),
        // A replica that is not synced yet: the primary holds the shard's last synced copy.
        None if topology
            .shard(primary.shard)
            .any(|m| m.addr != primary.addr) =>
        {
            None
        }
        // A shard without replicas cannot hand over; its pod is replaced in place.
        None => Some(authorize(n)),
    }
}

/// Whether the ValkeyNode controller has not reported on `node`'s current spec yet (its
/// `status.observedGeneration` is behind `metadata.generation`): a template change it is about
/// to hold back as `WorkloadRollPending` does not show yet. A node without any status is new,
/// not updated: the cluster's other facts (no pod, no member) already tell that.
pub fn unobserved(node: &ValkeyNode) -> bool {
    node.status
        .as_ref()
        .is_some_and(|s| node.metadata.generation.unwrap_or(0) > s.observed_generation.unwrap_or(0))
}

/// The Progressing message while a rolling update is under way (nodes pending or in flight).
pub fn progress(nodes: &[ValkeyNode]) -> Option<String> {
    let waiting = nodes.iter().filter(|n| pending(n)).count();
    let rolling: Vec<String> = nodes
        .iter()
        .filter(|n| rolling(n))
        .map(ResourceExt::name_any)
        .collect();
    if waiting == 0 && rolling.is_empty() {
        return None;
    }
    Some(if rolling.is_empty() {
        format!("rolling update: {waiting} nodes waiting for their turn")
    } else {
        format!(
            "rolling update: replacing {} ({waiting} more waiting)",
            crate::text::list("nodes", &rolling)
        )
    })
}

/// `desired` with its workload revision bumped: applying it authorizes its pending pod-template
/// change.
pub fn authorized(desired: &ValkeyNode) -> ValkeyNode {
    let mut node = desired.clone();
    node.spec.workload_revision = Some(bump(desired.spec.workload_revision.as_deref()));
    node
}

/// The revision after `current` (`"1"` → `"2"`; anything unparsable restarts at `"1"` + 1).
pub fn bump(current: Option<&str>) -> String {
    let n: u64 = current.and_then(|c| c.parse().ok()).unwrap_or(1);
    (n + 1).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use valkey_ops::NodeView;
    use valkey_ops::model::ClusterNodes;

    fn vnode(shard: i32, index: i32, pending_roll: bool, ready: bool) -> ValkeyNode {
        let mut n: ValkeyNode = serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
            "metadata": {"name": format!("c-{shard}-{index}")},
            "spec": {"clusterName": "c", "shardIndex": shard, "nodeIndex": index,
                     "image": "valkey/valkey:9.0.0", "terminationGracePeriodSeconds": 30,
                     "workloadRevision": "1"},
        }))
        .expect("valkeynode");
        let mut conditions = Vec::new();
        if pending_roll {
            conditions.push(Condition {
                type_: WORKLOAD_ROLL_PENDING.into(),
                status: "True".into(),
                reason: "AwaitingWorkloadRevision".into(),
                message: String::new(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            });
        }
        n.status = Some(valkey_api::ValkeyNodeStatus {
            ready,
            applied_workload_revision: Some("1".into()),
            conditions,
            ..Default::default()
        });
        n
    }

    /// Shard 0: node `a0` primary of `a1` (index 1); shard 1: `a2` primary, `a3` replica.
    fn members() -> Topology {
        Topology::new(member_list())
    }

    fn member_list() -> Vec<Member> {
        let nodes = "a0 10.0.0.1:6379@16379 master - 0 0 1 connected 0-8191\n\
                     a1 10.0.0.2:6379@16379 slave a0 0 0 1 connected\n\
                     a2 10.0.0.3:6379@16379 master - 0 0 2 connected 8192-16383\n\
                     a3 10.0.0.4:6379@16379 slave a2 0 0 2 connected\n";
        let at = |shard: i32, index: i32, me: &str, ip: &str| {
            let text = nodes.replace(
                &format!("{me} {ip}:6379@16379 "),
                &format!("{me} {ip}:6379@16379 myself,"),
            );
            let mut view = NodeView::from_nodes(ClusterNodes::parse(&text).expect("nodes"));
            view.cluster_ok = true;
            view.primary_link_up = index == 1;
            view.repl_offset = 100;
            Member {
                shard,
                index,
                pod: format!("pod-{shard}-{index}"),
                addr: format!("{ip}:6379").parse().expect("address"),
                refused: false,
                auth_refused: None,
                error: None,
                view: Some(view),
            }
        };
        vec![
            at(0, 0, "a0", "10.0.0.1"),
            at(0, 1, "a1", "10.0.0.2"),
            at(1, 0, "a2", "10.0.0.3"),
            at(1, 1, "a3", "10.0.0.4"),
        ]
    }

    fn all_pending() -> Vec<ValkeyNode> {
        vec![
            vnode(0, 0, true, true),
            vnode(0, 1, true, true),
            vnode(1, 0, true, true),
            vnode(1, 1, true, true),
        ]
    }

    #[test]
    fn replicas_roll_first_one_at_a_time() {
        let nodes = all_pending();
        let m = members();
        assert_eq!(
            next_roll(&nodes, &m, true),
            Some(RollStep::Authorize {
                node: "c-0-1".into()
            })
        );
        // Unhealthy cluster: wait.
        assert_eq!(next_roll(&nodes, &m, false), None);
        // A roll in flight (authorized, not applied yet): wait.
        let mut busy = all_pending();
        busy[1].spec.workload_revision = Some("2".into());
        assert_eq!(next_roll(&busy, &m, true), None);
    }

    fn ready_since(mut n: ValkeyNode, since: Timestamp) -> ValkeyNode {
        if let Some(s) = n.status.as_mut() {
            s.conditions.push(Condition {
                type_: READY.into(),
                status: if s.ready { "True" } else { "False" }.into(),
                reason: "PodReady".into(),
                message: String::new(),
                last_transition_time: Time(since),
                observed_generation: None,
            });
        }
        n
    }

    #[test]
    fn the_roll_settles_after_the_last_node_became_ready() {
        let t = |s: i64| Timestamp::from_second(1_000_000 + s).expect("timestamp");
        // No Ready condition recorded (an older operator's status): nothing to wait for.
        assert_eq!(settle_left(&all_pending(), t(0)), None);
        let nodes = vec![
            ready_since(vnode(0, 0, true, true), t(0)),
            ready_since(vnode(0, 1, false, true), t(10)),
            // Not ready: the roll waits for it by itself; its transition does not count.
            ready_since(vnode(1, 0, true, false), t(12)),
        ];
        assert_eq!(settle_left(&nodes, t(11)), Some(Duration::from_secs(2)));
        assert_eq!(settle_left(&nodes, t(12)), Some(Duration::from_secs(1)));
        assert_eq!(settle_left(&nodes, t(13)), None);
        assert_eq!(settle_left(&nodes, t(60)), None);
        // A clock behind the recorded time waits the whole settle, not forever.
        assert_eq!(settle_left(&nodes, t(5)), Some(ROLL_SETTLE));
    }

    #[test]
    fn a_spec_the_node_controller_has_not_reported_on_is_unobserved() {
        let mut n = vnode(0, 0, false, true);
        // Neither side records a generation (a fixture, an older API server): observed.
        assert!(!unobserved(&n));
        n.metadata.generation = Some(4);
        assert!(unobserved(&n));
        n.status.as_mut().expect("status").observed_generation = Some(3);
        assert!(unobserved(&n));
        n.status.as_mut().expect("status").observed_generation = Some(4);
        assert!(!unobserved(&n));
        // Created, no status written yet: new, not updated.
        n.status = None;
        assert!(!unobserved(&n));
    }

    #[test]
    fn no_roll_step_while_a_node_has_not_reported_on_its_new_spec() {
        // The primary waits for its roll, its replica's new spec is not observed yet: were
        // the roll to start, the primary would be handed over first.
        let mut nodes = all_pending();
        nodes[1].metadata.generation = Some(2);
        let reported = nodes[1].status.clone();
        let status = nodes[1].status.as_mut().expect("status");
        status.conditions.clear();
        status.observed_generation = Some(1);
        assert_eq!(next_roll(&nodes, &members(), true), None);
        // Reported (waiting for its roll too): the replica goes first.
        nodes[1].status = reported.map(|s| valkey_api::ValkeyNodeStatus {
            observed_generation: Some(2),
            ..s
        });
        assert_eq!(
            next_roll(&nodes, &members(), true),
            Some(RollStep::Authorize {
                node: "c-0-1".into()
            })
        );
    }

    #[test]
    fn primary_is_failed_over_before_its_roll() {
        let nodes = vec![vnode(0, 0, true, true), vnode(0, 1, false, true)];
        assert_eq!(
            next_roll(&nodes, &members(), true),
            Some(RollStep::Failover {
                replica: "10.0.0.2:6379".parse().unwrap(),
                shard: 0,
                primary: "c-0-0".into(),
            })
        );
    }

    #[test]
    fn a_node_still_coming_back_blocks_the_next_roll() {
        let mut nodes = all_pending();
        nodes[1] = vnode(0, 1, false, false);
        assert_eq!(next_roll(&nodes, &members(), true), None);
        nodes[1].spec.workload_revision = Some("2".into());
        assert!(progress(&nodes).is_some_and(|p| p.contains("c-0-1")));
    }

    #[test]
    fn new_nodes_are_not_a_rolling_update() {
        let mut nodes = vec![vnode(0, 0, false, false), vnode(0, 1, false, false)];
        for n in &mut nodes {
            n.status = None;
        }
        assert_eq!(progress(&nodes), None);
        assert_eq!(next_roll(&nodes, &members(), true), None);
    }

    #[test]
    fn a_pending_node_whose_process_is_dead_rolls_at_once() {
        let nodes = vec![vnode(0, 0, true, true), vnode(1, 0, true, false)];
        let mut m = member_list();
        m[2].view = None;
        m[2].refused = true;
        let authorize_1_0 = Some(RollStep::Authorize {
            node: "c-1-0".into(),
        });
        assert_eq!(
            next_roll(&nodes, &Topology::new(m.clone()), false),
            authorize_1_0
        );
        // No running pod at all.
        m.remove(2);
        assert_eq!(next_roll(&nodes, &Topology::new(m), false), authorize_1_0);
    }

    #[test]
    fn a_not_ready_primary_hands_over_first_or_waits_for_its_replica_to_sync() {
        let nodes = vec![vnode(1, 0, true, false), vnode(1, 1, false, true)];
        assert_eq!(
            next_roll(&nodes, &members(), false),
            Some(RollStep::Failover {
                replica: "10.0.0.4:6379".parse().unwrap(),
                shard: 1,
                primary: "c-1-0".into(),
            })
        );
        // Its only replica is in a full sync: nothing is rolled.
        let mut m = member_list();
        m[3].view.as_mut().unwrap().sync_in_progress = true;
        assert_eq!(next_roll(&nodes, &Topology::new(m.clone()), false), None);
        assert_eq!(next_roll(&nodes, &Topology::new(m), true), None);
        // Unreachable but not refusing (a timeout): wait.
        let mut m = member_list();
        m[2].view = None;
        assert_eq!(next_roll(&nodes, &Topology::new(m), false), None);
    }

    #[test]
    fn a_not_ready_replica_rolls_at_once_only_while_its_shard_has_a_writer() {
        let nodes = vec![vnode(1, 0, false, true), vnode(1, 1, true, false)];
        let authorize = Some(RollStep::Authorize {
            node: "c-1-1".into(),
        });
        assert_eq!(next_roll(&nodes, &members(), false), authorize);
        // The shard's primary is gone: the replica may hold its last copy.
        let mut m = member_list();
        m.remove(2);
        assert_eq!(next_roll(&nodes, &Topology::new(m), false), None);
    }

    #[test]
    fn a_not_ready_empty_primary_rolls_at_once() {
        let mut m = member_list();
        let text = "e0 10.0.0.5:6379@16379 myself,master - 0 0 3 connected\n";
        m.push(Member {
            shard: 2,
            index: 0,
            pod: "pod-2-0".into(),
            addr: "10.0.0.5:6379".parse().unwrap(),
            refused: false,
            auth_refused: None,
            error: None,
            view: Some(NodeView::from_nodes(ClusterNodes::parse(text).unwrap())),
        });
        let nodes = vec![vnode(2, 0, true, false)];
        assert_eq!(
            next_roll(&nodes, &Topology::new(m), false),
            Some(RollStep::Authorize {
                node: "c-2-0".into()
            })
        );
    }

    #[test]
    fn a_ready_primary_the_operator_cannot_reach_is_not_rolled() {
        let nodes = vec![vnode(0, 0, true, true)];
        let mut m = member_list();
        m[0].view = None;
        assert_eq!(next_roll(&nodes, &Topology::new(m), true), None);
    }

    #[test]
    fn nothing_pending_nothing_to_do() {
        let nodes = vec![vnode(0, 0, false, true), vnode(0, 1, false, true)];
        assert_eq!(next_roll(&nodes, &members(), true), None);
        assert_eq!(bump(Some("1")), "2");
        assert_eq!(bump(None), "2");
    }
}
