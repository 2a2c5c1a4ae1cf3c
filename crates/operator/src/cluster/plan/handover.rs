//! The hand-over of a primary whose pod is being deleted (pure).
//!
//! A pod deleted by a user, a drain or an eviction first runs the server container's `preStop`
//! hook (`render/handover.rs`): a primary that owns slots and has a replica online holds its
//! `SIGTERM` back for a bounded time. This planner sees the pod terminating and hands the
//! primary's slots to its most caught-up synced replica with a coordinated `CLUSTER FAILOVER`
//! (writes pause only while the replica catches up; no acknowledged write is lost). The hook
//! then sees the node demoted and lets the server stop as a replica, so clients are
//! redirected by `MOVED` from a live node instead of losing their connection to a primary
//! and waiting for Valkey's own election.
//!
//! The primary is found through its replicas' views (a terminating pod is no member of the
//! topology): a replica whose primary holds a terminating pod's IP, owns slots and is not
//! flagged failing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use valkey_ops::Topology;

use crate::cluster::steps::{self, Step};

/// The hand-over step for the first shard (in shard order) whose primary's pod is
/// terminating and has a synced replica, or `None`. `topology`: the members inside the layout;
/// `terminating`: IP → name of each of the cluster's pods that is being deleted and still runs.
pub fn terminating_primary(
    topology: &Topology,
    terminating: &BTreeMap<IpAddr, String>,
) -> Option<Step> {
    if terminating.is_empty() {
        return None;
    }
    // (shard, primary id, pod) of each terminating primary some replica follows.
    let primaries: BTreeSet<(i32, &str, &String)> = topology
        .members()
        .iter()
        .filter_map(|r| {
            let view = r.view.as_ref()?;
            let me = view.me()?;
            let pid = me.primary_id.as_deref().filter(|_| me.is_replica())?;
            let primary = view.nodes.get(pid)?;
            let (_, pod) = terminating.iter().find(|(ip, _)| primary.has_ip(**ip))?;
            (primary.owns_slots() && !primary.flags.failing()).then_some((r.shard, pid, pod))
        })
        .collect();
    primaries.into_iter().find_map(|(shard, pid, pod)| {
        let replica = topology.best_replica_of(shard, pid)?;
        Some(Step::HandOver(steps::HandOver {
            replica: replica.addr,
            shard,
            primary: format!("pod {pod}"),
        }))
    })
}

#[cfg(test)]
mod tests {
    use super::super::testworld::*;
    use super::*;

    fn terminating(n: u32) -> BTreeMap<IpAddr, String> {
        BTreeMap::from([(ip(n).parse().unwrap(), format!("pod-of-{n}"))])
    }

    /// The topology without node `n` (its pod terminates: not observed).
    fn without(t: &Topology, n: u32) -> Topology {
        Topology::new(
            members(t)
                .into_iter()
                .filter(|m| m.addr != addr(n))
                .collect(),
        )
    }

    #[test]
    fn a_terminating_primary_hands_over_to_its_synced_replica() {
        let t = without(&world(&formed31(), &[1, 2, 3, 4, 5, 6]), 3);
        assert_eq!(
            terminating_primary(&t, &terminating(3)),
            Some(Step::HandOver(steps::HandOver {
                replica: addr(4),
                shard: 1,
                primary: "pod pod-of-3".into(),
            }))
        );
        // After a failover moved shard 0's primary to index 1: that node's pod.
        let t = without(&world(&failed_over31(), &[1, 2, 3, 4, 5, 6]), 2);
        assert_eq!(
            terminating_primary(&t, &terminating(2)),
            Some(Step::HandOver(steps::HandOver {
                replica: addr(1),
                shard: 0,
                primary: "pod pod-of-2".into(),
            }))
        );
    }

    #[test]
    fn the_most_caught_up_replica_wins() {
        // 2 × 2: node 1's replicas are 2 (offset 20) and 3 (offset 30).
        let t = without(&world(&formed22(), &[1, 2, 3, 4, 5, 6]), 1);
        let Some(Step::HandOver(steps::HandOver { replica, .. })) =
            terminating_primary(&t, &terminating(1))
        else {
            panic!("no hand-over");
        };
        assert_eq!(replica, addr(3));
    }

    #[test]
    fn nothing_to_hand_over() {
        let t = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        // No pod terminating; a terminating replica; a terminating primary without slots.
        assert_eq!(terminating_primary(&t, &BTreeMap::new()), None);
        assert_eq!(terminating_primary(&t, &terminating(2)), None);
        let t = world(&fresh31(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(terminating_primary(&t, &terminating(1)), None);
    }

    #[test]
    fn a_replica_not_in_sync_or_a_failing_primary_waits() {
        let formed = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        let mut m = members(&without(&formed, 1));
        // Node 2 (shard 0's replica) in a full sync.
        let r = m.iter_mut().find(|m| m.addr == addr(2)).unwrap();
        r.view.as_mut().unwrap().sync_in_progress = true;
        assert_eq!(
            terminating_primary(&Topology::new(m), &terminating(1)),
            None
        );
        // The primary already flagged failing: Valkey's election or the failover rule decides.
        let mut nodes = formed31();
        nodes[0].fail = true;
        let t = world(&nodes, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(terminating_primary(&t, &terminating(1)), None);
    }
}
