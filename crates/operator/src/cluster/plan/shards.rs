//! From the topology model of the layout to the topology facts and the per-shard status
//! entries (pure).

use valkey_api::status::ShardStatus;
use valkey_ops::{Layout, Topology};

/// What the Valkey cluster looks like, summarised from the live views.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyFacts {
    /// Shards with a live primary owning slots.
    pub shards_present: i32,
    /// Shards with a primary and the desired number of synced replicas.
    pub ready_shards: i32,
    /// Slots with an owner (as seen by the best-informed node).
    pub slots_assigned: u32,
    /// Desired shards without a live primary owning slots.
    pub missing_shards: i32,
    /// Desired replicas that are not attached and synced, summed over shards.
    pub missing_replicas: i32,
    /// Every live node reports `cluster_state:ok`.
    pub cluster_ok: bool,
    /// Live nodes whose role, primary or slots some other live node's view does not show yet
    /// (gossip still carrying a change).
    pub unconverged_nodes: i32,
    /// Live pods not yet joined to the cluster (unknown to the seed node).
    pub unjoined_nodes: i32,
    /// Nodes the cluster still knows that are no live pod's identity (a replaced pod's old
    /// node, not forgotten yet).
    pub departed_nodes: i32,
    /// Slots that still change owner before the shards are balanced (rebalance or drain).
    pub slots_to_move: u32,
    /// ValkeyNodes outside the layout (lower `shards` or `replicas`) not removed yet.
    pub surplus_nodes: i32,
    /// Why the slot balance cannot be planned yet, when it cannot.
    pub balance_blocked: Option<String>,
    /// Why a drain does not start (the shards being removed do not fit in the memory of the
    /// others): what is missing and what to do.
    pub drain_no_room: Option<String>,
    /// A shard that has waited for its writer past the failure-detection time and that the
    /// operator must not fail over: why, and what to do.
    pub failover_stuck: Option<String>,
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Facts for the status and the per-shard entries, from the live views of the layout's
/// members.
pub fn analyze(layout: Layout, topology: &Topology) -> (TopologyFacts, Vec<ShardStatus>) {
    let mut facts = TopologyFacts::default();
    if topology.seed().is_none() {
        // Nothing reachable: every shard is missing (entries are still listed, so the status
        // stays comparable from pass to pass).
        facts.missing_shards = layout.shards;
        facts.missing_replicas = layout.shards * layout.replicas;
        let shards = (0..layout.shards)
            .map(|index| ShardStatus {
                index,
                ..ShardStatus::default()
            })
            .collect();
        return (facts, shards);
    }
    facts.slots_assigned = u32::try_from(topology.owned_slots().len()).unwrap_or(0);
    facts.cluster_ok = topology
        .reachable()
        .all(|m| m.view.as_ref().is_some_and(|v| v.cluster_ok));
    facts.unjoined_nodes = count(topology.unjoined().count());
    facts.departed_nodes = count(topology.departed().count());
    facts.unconverged_nodes = count(topology.unconverged().count());

    let mut shards = Vec::new();
    for shard in 0..layout.shards {
        let Some(p) = topology.writer(shard) else {
            facts.missing_shards += 1;
            facts.missing_replicas += layout.replicas;
            shards.push(ShardStatus {
                index: shard,
                slots: topology
                    .orphaned_slots(shard)
                    .ranges()
                    .map(|r| r.to_string())
                    .collect(),
                ..ShardStatus::default()
            });
            continue;
        };
        let synced = count(topology.synced_replicas(p).count());
        facts.shards_present += 1;
        facts.missing_replicas += (layout.replicas - synced).max(0);
        if synced >= layout.replicas {
            facts.ready_shards += 1;
        }
        shards.push(ShardStatus {
            index: shard,
            primary_pod: Some(p.pod.clone()),
            replicas: synced,
            slots: p
                .me()
                .map(|me| me.slot_set().ranges().map(|r| r.to_string()).collect())
                .unwrap_or_default(),
            failback_at: None,
        });
    }
    (facts, shards)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::plan::testworld::*;

    #[test]
    fn formed_cluster_is_ready() {
        let m = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        let (facts, shards) = analyze(D31, &m);
        assert_eq!(facts.shards_present, 3);
        assert_eq!(facts.ready_shards, 3);
        assert_eq!(facts.missing_replicas, 0);
        assert_eq!(facts.slots_assigned, 16384);
        assert_eq!(shards[1].primary_pod.as_deref(), Some("pod-1-0"));
        assert_eq!(shards[1].slots, ["5461-10922"]);
        assert_eq!(shards[1].replicas, 1);
    }

    #[test]
    fn a_role_not_yet_gossiped_to_every_node_is_unconverged() {
        // Node 2 has just been attached to node 1; node 5 still lists it as an empty primary.
        let mut m = members(&world(&formed31(), &[1, 2, 3, 4, 5, 6]));
        let stale = world(&fresh31(), &[1, 2, 3, 4, 5, 6]);
        let five = m.iter_mut().find(|x| x.addr == addr(5)).expect("node 5");
        let mut view = five.view.clone().expect("view");
        let old = stale.at(0, 1).and_then(|x| x.me()).expect("node 2").clone();
        let line = view
            .nodes
            .nodes
            .iter_mut()
            .find(|n| n.id == id(2))
            .expect("line");
        line.flags.primary = true;
        line.flags.replica = false;
        line.primary_id = old.primary_id;
        five.view = Some(view);
        let (facts, _) = analyze(D31, &Topology::new(m.clone()));
        assert_eq!(facts.unconverged_nodes, 1);
        assert_eq!(facts.missing_replicas, 0);
        // A node that does not know a member at all, or sees it failed, is unconverged too.
        let five = m.iter_mut().find(|x| x.addr == addr(5)).expect("node 5");
        let view = five.view.as_mut().expect("view");
        view.nodes.nodes.retain(|n| n.id != id(2));
        view.nodes
            .nodes
            .iter_mut()
            .find(|n| n.id == id(4))
            .expect("4")
            .flags
            .fail = true;
        let (facts, _) = analyze(D31, &Topology::new(m));
        assert_eq!(facts.unconverged_nodes, 2);
        let (facts, _) = analyze(D31, &world(&formed31(), &[1, 2, 3, 4, 5, 6]));
        assert_eq!(facts.unconverged_nodes, 0);
    }

    #[test]
    fn roles_come_from_the_live_view_not_the_pod_name() {
        let n = failed_over31();
        let (facts, shards) = analyze(D31, &world(&n, &[1, 2, 3, 4, 5, 6]));
        assert_eq!(facts.ready_shards, 3);
        assert_eq!(shards[0].primary_pod.as_deref(), Some("pod-0-1"));
    }

    #[test]
    fn replacement_pod_is_a_missing_replica_until_attached() {
        let mut n = taken_over31();
        n.push(node(7, 0, 0));
        let (facts, _) = analyze(D31, &world(&n, &[1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(facts.missing_replicas, 1);
    }

    #[test]
    fn shard_of_a_dead_primary_is_missing_and_keeps_its_slots() {
        let mut n = formed31();
        n[0].fail = true;
        n.push(node(7, 0, 0));
        let (facts, shards) = analyze(D31, &world(&n, &[1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(facts.missing_shards, 1);
        assert_eq!(shards[0].slots, ["0-5460"]);
    }

    #[test]
    fn unreachable_members_make_every_shard_missing() {
        let mut m = members(&world(&fresh31(), &[]));
        for x in &mut m {
            x.view = None;
        }
        let (facts, shards) = analyze(D31, &Topology::new(m));
        assert_eq!(facts.missing_shards, 3);
        assert_eq!(shards.len(), 3);
    }
}
