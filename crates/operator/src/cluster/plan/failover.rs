//! Operator-driven failover (pure): when a shard's slot-owning primary is down and Valkey's own
//! election cannot succeed or would only start late, which replica to promote and how.

use std::collections::BTreeSet;
use std::net::IpAddr;

use valkey_ops::commands::FailoverMode;
use valkey_ops::model::ClusterNode;
use valkey_ops::{Layout, Topology};

use super::Step;

/// A failover the operator must drive for a shard whose slot-owning primary is down and
/// unreachable by the operator, while no replica of it has won an election yet:
///
/// - `TAKEOVER` when the slot-owning primaries still alive are no majority, so no replica
///   can win an election (for example one of two shards lost its primary). "Down" is: failing
///   in the seed's and the replica's views, or its pod is gone.
/// - `FORCE` (an election without the primary's agreement) when a majority is alive but the
///   primary is certainly not serving (its pod is gone, or the pod at its address refuses
///   connections: the process died) and Valkey has not yet flagged it `fail`: Valkey would
///   elect a replica only after its failure detection (`cluster-node-timeout` and more).
///
/// Otherwise (Valkey has flagged it `fail`, or it is only suspected) Valkey's own election
/// runs and this is `None`. The promoted replica is the most caught-up one among those that
/// streamed from the failed primary since they started.
pub fn failover_step(
    layout: Layout,
    topology: &Topology,
    pod_ips: Option<&BTreeSet<IpAddr>>,
) -> Option<Step> {
    let seed = topology.seed_view()?;
    let live_ids = topology.live_ids();
    // Certainly not serving: its pod is gone, or the pod at its address refuses connections.
    let gone = |n: &ClusterNode| {
        let Ok(ip) = n.addr.ip.parse::<IpAddr>() else {
            return false;
        };
        !live_ids.contains(n.id.as_str())
            && (pod_ips.is_some_and(|ips| !ips.contains(&ip))
                || topology
                    .members()
                    .iter()
                    .any(|m| m.refused && m.view.is_none() && m.ip() == ip))
    };
    let down =
        |n: &ClusterNode| !live_ids.contains(n.id.as_str()) && (n.flags.failing() || gone(n));
    let serving: Vec<&ClusterNode> = seed.nodes.iter().filter(|n| n.owns_slots()).collect();
    let alive = serving.iter().filter(|n| !down(n)).count();
    let majority = alive * 2 > serving.len();
    (0..layout.shards).find_map(|shard| {
        topology.writer(shard).is_none().then_some(())?;
        topology
            .shard(shard)
            .filter_map(|m| {
                let v = m.view.as_ref()?;
                let me = v.me()?;
                let failed = me.primary_id.as_deref().filter(|_| me.is_replica())?;
                let theirs = v.nodes.get(failed)?;
                let seen = seed.get(failed)?;
                // Only a replica that streamed from the failed primary in its current life
                // holds its data; one that restarted since (and loaded only its own, older
                // files, or nothing) is never promoted by the operator.
                let streamed = v.link_down_since.is_some_and(|s| s >= 0);
                if v.primary_link_up || !streamed || theirs.slot_count() == 0 {
                    return None;
                }
                let mode = if !majority && (gone(seen) || (down(seen) && theirs.flags.failing())) {
                    FailoverMode::Takeover
                } else if majority && gone(seen) && !seen.flags.fail && !theirs.flags.fail {
                    FailoverMode::Force
                } else {
                    return None;
                };
                Some((v.repl_offset, -m.index, m, failed, mode))
            })
            .max_by_key(|(offset, index, ..)| (*offset, *index))
            .map(|(_, _, m, failed, mode)| Step::Failover {
                replica: m.addr,
                shard,
                failed: failed.to_owned(),
                mode,
            })
    })
}

#[cfg(test)]
mod tests {
    use super::super::next_step;
    use super::super::testworld::*;
    use super::*;
    use valkey_ops::Member;

    #[test]
    fn two_shards_losing_a_primary_take_over_on_the_most_caught_up_replica() {
        // 2 shards × 2 replicas; shard 0's primary (1) is down and replaced by node 7. One live
        // slot owner out of two is no majority: no election can succeed.
        let d = Layout {
            shards: 2,
            replicas: 2,
        };
        let mut n = vec![
            node(1, 0, 0),
            node(2, 0, 1),
            node(3, 0, 2),
            node(4, 1, 0),
            node(5, 1, 1),
            node(6, 1, 2),
        ];
        n[0].slots = "0-8191";
        n[3].slots = "8192-16383";
        for (r, p) in [(1, 1), (2, 1), (4, 4), (5, 4)] {
            n[r].primary_of = Some(p);
        }
        n[0].fail = true;
        n.push(node(7, 0, 0));
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        // Node 3 has the highest replication offset in the test world.
        assert_eq!(
            next_step(d, &m, None),
            Some(Step::Failover {
                replica: addr(3),
                shard: 0,
                failed: id(1),
                mode: FailoverMode::Takeover,
            })
        );
        // Once a replica owns the slots, the shard is left to the usual steps.
        n[2].primary_of = None;
        n[2].slots = "0-8191";
        n[0].slots = "";
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert!(!matches!(
            next_step(d, &m, None),
            Some(Step::Failover { .. })
        ));
    }

    #[test]
    fn no_takeover_while_a_majority_of_primaries_is_alive() {
        // 3 shards: two live primaries out of three can elect; Valkey promotes the replica.
        let mut n = formed31();
        n[0].fail = true;
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, None), None);
    }

    /// Shard 0's primary (node 1) is unreachable, not yet flagged by Valkey, and its replica's
    /// link is down.
    fn primary_unreachable(n: &[N]) -> Vec<Member> {
        let mut m = members(&world(n, &[1, 2, 3, 4, 5, 6, 7]));
        m.retain(|x| x.addr != addr(1));
        for x in m.iter_mut().filter(|x| x.shard == 0) {
            if let Some(v) = x.view.as_mut() {
                v.primary_link_up = false;
            }
        }
        m
    }

    #[test]
    fn gone_primary_pod_is_failed_over_at_once_with_force() {
        let m = Topology::new(primary_unreachable(&formed31()));
        assert_eq!(
            next_step(D31, &m, Some(&ips(1, 6))),
            Some(Step::Failover {
                replica: addr(2),
                shard: 0,
                failed: id(1),
                mode: FailoverMode::Force,
            })
        );
        // Its pod still exists (a restart, a terminating pod handing over): wait.
        assert_eq!(next_step(D31, &m, Some(&ips(0, 6))), None);
        // Pods unknown: wait for Valkey.
        assert_eq!(next_step(D31, &m, None), None);
        // Valkey already flagged it failed: its own election runs.
        let mut n = formed31();
        n[0].fail = true;
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, Some(&ips(1, 6))), None);
    }

    #[test]
    fn gone_primary_pod_of_two_shards_is_taken_over_at_once() {
        let d = Layout {
            shards: 2,
            replicas: 1,
        };
        let mut n = vec![node(1, 0, 0), node(2, 0, 1), node(3, 1, 0), node(4, 1, 1)];
        n[0].slots = "0-8191";
        n[2].slots = "8192-16383";
        n[1].primary_of = Some(1);
        n[3].primary_of = Some(3);
        let m = Topology::new(primary_unreachable(&n));
        assert_eq!(
            next_step(d, &m, Some(&ips(1, 4))),
            Some(Step::Failover {
                replica: addr(2),
                shard: 0,
                failed: id(1),
                mode: FailoverMode::Takeover,
            })
        );
        assert_eq!(next_step(d, &m, Some(&ips(0, 4))), None);
    }

    #[test]
    fn primary_whose_pod_refuses_connections_is_failed_over_at_once() {
        // The server process of node 1 died; its pod (same IP) refuses connections.
        let mut m = primary_unreachable(&formed31());
        m.push(Member {
            shard: 0,
            index: 0,
            pod: "pod-0-0".into(),
            addr: addr(1),
            view: None,
            refused: true,
        });
        let all = ips(0, 6);
        assert!(matches!(
            next_step(D31, &Topology::new(m.clone()), Some(&all)),
            Some(Step::Failover {
                mode: FailoverMode::Force,
                ..
            })
        ));
        // Unreachable but not refusing (a timeout, a partition): wait for Valkey.
        for x in m.iter_mut().filter(|x| x.addr == addr(1)) {
            x.refused = false;
        }
        assert_eq!(next_step(D31, &Topology::new(m), Some(&all)), None);
    }

    #[test]
    fn replica_that_restarted_since_its_primary_failed_is_not_promoted() {
        // Every pod restarted (persistence): the replica loaded its own files and never
        // streamed from the primary, whose pod is still being recreated. Wait for it.
        let mut m = primary_unreachable(&formed31());
        for x in m.iter_mut().filter(|x| x.shard == 0) {
            if let Some(v) = x.view.as_mut() {
                v.link_down_since = Some(-1);
            }
        }
        assert_eq!(next_step(D31, &Topology::new(m), Some(&ips(1, 6))), None);
    }
}
