//! The topology step of a pass (pure): from the desired layout and the live view of every
//! member of it, at most one step (a failover, a MEET batch, a re-MEET of moved peers, a slot
//! assignment, replica attachments, or forgetting one dead node).

use std::collections::BTreeSet;
use std::net::IpAddr;

use valkey_ops::slot_plan::initial_assignment;
use valkey_ops::{Layout, Member, SLOT_COUNT, SlotRange, SlotSet, Topology};

#[cfg(test)]
use super::failover::{FailoverTiming, failover_step};
use crate::cluster::steps::{self, Step};

/// The failover or topology step, or `None` when the topology matches the layout (or must
/// wait): the first two sub-planners of [`super::plan`], for their unit tests.
///
/// `topology` holds the members of the layout only. `pod_ips` are the IPs of every pod of the
/// cluster that still exists (any phase but Succeeded/Failed, terminating included), when
/// known: a primary whose IP no pod holds any more is gone for certain, and its shard is
/// failed over without waiting for Valkey's failure detection. `timing` bounds the staleness of
/// a replica the operator promotes.
#[cfg(test)]
pub(super) fn next_step(
    layout: Layout,
    topology: &Topology,
    pod_ips: Option<&BTreeSet<IpAddr>>,
    timing: FailoverTiming,
) -> Option<Step> {
    // A shard without a writer that Valkey cannot fail over by itself comes first.
    failover_step(layout, topology, pod_ips, timing)
        .or_else(|| topology_step(layout, topology, pod_ips, &BTreeSet::new()))
}

/// The step after the failover: MEET, re-MEET, slot assignment, replica
/// attachment or forgetting a departed node.
///
/// `recorded` are the shards whose slots the status has recorded: a shard that ever had slots
/// is never claimed afresh (see [`fresh_claims`]).
pub(super) fn topology_step(
    layout: Layout,
    topology: &Topology,
    pod_ips: Option<&BTreeSet<IpAddr>>,
    recorded: &BTreeSet<i32>,
) -> Option<Step> {
    let seed = topology.seed()?;
    let plan = usize::try_from(layout.shards)
        .ok()
        .and_then(|n| initial_assignment(n).ok())
        .unwrap_or_default();

    // 0. A new shard's fresh primary claims its slots and a config epoch before it meets the
    //    others; the MEET of every node the seed does not know follows in the same step.
    let unknown: Vec<_> = topology.unjoined().map(|m| m.addr).collect();
    let claims = fresh_claims(topology, &plan, recorded);
    if !claims.is_empty() {
        return Some(Step::ClaimAndMeet(steps::ClaimAndMeet {
            seed: seed.addr,
            claims,
            nodes: unknown,
        }));
    }

    // 1. MEET nodes the seed does not know.
    if !unknown.is_empty() {
        return Some(Step::Meet(steps::Meet {
            seed: seed.addr,
            nodes: unknown,
        }));
    }

    // 2. Re-MEET peers the seed knows under another IP.
    let moved: Vec<_> = topology.moved().map(|m| m.addr).collect();
    if !moved.is_empty() {
        return Some(Step::ReMeet(steps::ReMeet {
            seed: seed.addr,
            nodes: moved,
        }));
    }

    // 3. Assign unowned slots of the initial plan to the shard primaries. A primary's own
    //    line is authoritative for its slots: what it claims is owned before gossip tells the
    //    seed (a large cluster would otherwise wait seconds for that between passes).
    let owned = topology
        .members()
        .iter()
        .filter_map(|m| m.me().filter(|me| me.is_primary()))
        .fold(topology.owned_slots(), |acc, me| acc.union(&me.slot_set()));
    if owned.len() < usize::from(SLOT_COUNT) {
        let mut assignments = Vec::new();
        for (shard, range) in (0..).zip(plan) {
            let missing = SlotSet::from_ranges(&[range]).difference(&owned);
            if missing.is_empty() {
                continue;
            }
            if let Some(p) = topology.primary(shard) {
                assignments.push((p.addr, shard, missing.ranges().collect()));
            }
        }
        if !assignments.is_empty() {
            return Some(Step::AssignSlots(steps::AssignSlots { assignments }));
        }
    }

    // 4. Attach replicas to their shard's live primary.
    let mut attachments = Vec::new();
    for shard in 0..layout.shards {
        let Some(p) = topology.primary(shard) else {
            continue;
        };
        let Some(pid) = p.id() else { continue };
        for m in topology.shard(shard).filter(|m| m.addr != p.addr) {
            if m.me().is_some() && !m.replicates(pid) && !m.owns_slots() {
                attachments.push((m.addr, pid.to_owned(), shard, p.addr));
            }
        }
    }
    if !attachments.is_empty() {
        return Some(Step::Replicate(steps::Replicate { attachments }));
    }

    // 5. Forget every failed node that is no member's identity, owns no slots and has no live
    //    replica following it (the command re-checks this guard on every node), in one step:
    //    after many pods were replaced, one pass clears all their old identities.
    let live_ids = topology.live_ids();
    let followed: BTreeSet<&str> = topology
        .members()
        .iter()
        .filter_map(|m| m.me()?.primary_id.as_deref())
        .collect();
    //    A node whose pod still holds its IP but neither answers nor refuses (cut off by a
    //    partition) is not forgotten: it would come back as a stranger once the partition heals.
    let cut_off = |ip: &str| {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return false;
        };
        pod_ips.is_some_and(|ips| ips.contains(&ip))
            && topology
                .members()
                .iter()
                .any(|m| m.ip() == ip && m.view.is_none() && !m.refused)
    };
    //    A node whose IP no pod of the cluster holds any more (a replaced pod's old identity)
    //    need not be failed first once every position of the layout has a reachable member:
    //    its process is gone, and no pod can come back with its identity (each position serves
    //    another one). Forgetting it at once keeps it out of `CLUSTER SLOTS`, where clients
    //    refreshing their slot map would wait for a connection to its dead address.
    let all_positions_up = (0..layout.shards).all(|shard| {
        (0..=layout.replicas).all(|index| {
            topology
                .shard(shard)
                .any(|m| m.index == index && m.view.is_some())
        })
    });
    let replaced = |ip: &str| {
        all_positions_up
            && ip
                .parse::<IpAddr>()
                .is_ok_and(|ip| pod_ips.is_some_and(|ips| !ips.contains(&ip)))
    };
    let dead: Vec<String> = topology
        .seed_view()?
        .nodes
        .iter()
        .filter(|n| {
            !n.flags.myself
                && (n.flags.fail || n.flags.noaddr || replaced(&n.addr.ip))
                && !live_ids.contains(n.id.as_str())
                && !followed.contains(n.id.as_str())
                && n.slot_count() == 0
                && !cut_off(&n.addr.ip)
        })
        .map(|n| n.id.clone())
        .collect();
    if dead.is_empty() {
        return None;
    }
    Some(Step::Forget(steps::Forget {
        node_ids: dead,
        addrs: topology.reachable().map(|m: &Member| m.addr).collect(),
    }))
}

/// The claims of a new cluster's fresh shard primaries, as `valkey-cli --cluster create`
/// makes them: each index-0 node that knows only itself and owns nothing takes its shard's
/// range of the initial `plan` and the config epoch `shard + 1` before it meets the others, so
/// the handshakes carry the slots to every node (no gossip round to wait for after) and no
/// two primaries of the new cluster share an epoch. Only for a shard without a writer, whose
/// slots the status never `recorded` and whose range no reachable node shows owned by any
/// node: a shard that existed keeps the slower way (MEET, then slots to the primary the seed
/// knows).
fn fresh_claims(
    topology: &Topology,
    plan: &[SlotRange],
    recorded: &BTreeSet<i32>,
) -> Vec<steps::Claim> {
    let seen_owned = topology
        .reachable()
        .filter_map(|m| m.view.as_ref())
        .flat_map(|v| v.nodes.nodes.iter())
        .fold(SlotSet::new(), |acc, n| acc.union(&n.slot_set()));
    (0..)
        .zip(plan)
        .filter(|(shard, _)| !recorded.contains(shard) && topology.writer(*shard).is_none())
        .filter_map(|(shard, range)| {
            let m = topology.at(shard, 0)?;
            let view = m.view.as_ref()?;
            let me = m.me()?;
            let fresh = view.nodes.nodes.len() == 1 && me.is_primary() && !me.owns_slots();
            let unowned = SlotSet::from_ranges(&[*range])
                .intersection(&seen_owned)
                .is_empty();
            (fresh && unowned).then(|| steps::Claim {
                addr: m.addr,
                shard,
                ranges: vec![*range],
                epoch: u64::try_from(shard).unwrap_or(0) + 1,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::super::testworld::*;
    use super::*;

    #[test]
    fn fresh_primaries_claim_their_slots_then_everyone_is_met_in_one_step() {
        let step = next_step(
            D31,
            &world(&fresh31(), &[]),
            None,
            FailoverTiming::default(),
        )
        .unwrap();
        let Step::ClaimAndMeet(steps::ClaimAndMeet {
            seed,
            claims,
            nodes,
        }) = step
        else {
            panic!("expected claims and meet, got {step:?}")
        };
        assert_eq!(seed, addr(1));
        assert_eq!(nodes.len(), 5);
        let got: Vec<(SocketAddr, i32, String, u64)> = claims
            .iter()
            .map(|c| (c.addr, c.shard, c.ranges[0].to_string(), c.epoch))
            .collect();
        assert_eq!(
            got,
            [
                (addr(1), 0, "0-5460".to_owned(), 1),
                (addr(3), 1, "5461-10922".to_owned(), 2),
                (addr(5), 2, "10923-16383".to_owned(), 3),
            ]
        );
    }

    #[test]
    fn a_shard_that_had_slots_is_never_claimed_afresh() {
        // Shard 1's index-0 pod was replaced by a fresh node while its owner is out of reach:
        // the status recorded the shard's slots, so the fresh node is only met.
        let world = world(&fresh31(), &[]);
        let recorded: BTreeSet<i32> = [1].into();
        let step = topology_step(D31, &world, None, &recorded).unwrap();
        let Step::ClaimAndMeet(steps::ClaimAndMeet { claims, .. }) = step else {
            panic!("expected claims and meet, got {step:?}")
        };
        assert_eq!(claims.iter().map(|c| c.shard).collect::<Vec<_>>(), [0, 2]);
        let all: BTreeSet<i32> = [0, 1, 2].into();
        let step = topology_step(D31, &world, None, &all).unwrap();
        assert!(matches!(step, Step::Meet(_)), "got {step:?}");
    }

    #[test]
    fn a_range_some_node_owns_is_not_claimed() {
        // Node 2 (shard 0, index 1) owns a slot of shard 1's initial range: shard 0 has a
        // writer and shard 1's range is partly owned, so only shard 2 claims; nor does a node
        // that already knows another.
        let mut n = fresh31();
        n[1].slots = "6000";
        let step = next_step(D31, &world(&n, &[]), None, FailoverTiming::default()).unwrap();
        let Step::ClaimAndMeet(steps::ClaimAndMeet { claims, .. }) = step else {
            panic!("expected claims and meet, got {step:?}")
        };
        assert_eq!(claims.iter().map(|c| c.shard).collect::<Vec<_>>(), [2]);
        let step = next_step(
            D31,
            &world(&fresh31(), &[1, 3]),
            None,
            FailoverTiming::default(),
        )
        .unwrap();
        let Step::ClaimAndMeet(steps::ClaimAndMeet { claims, .. }) = step else {
            panic!("expected claims and meet, got {step:?}")
        };
        assert_eq!(claims.iter().map(|c| c.shard).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn joined_nodes_get_the_initial_slot_plan_on_index_0() {
        let step = next_step(
            D31,
            &world(&fresh31(), &[1, 2, 3, 4, 5, 6]),
            None,
            FailoverTiming::default(),
        )
        .unwrap();
        let Step::AssignSlots(steps::AssignSlots { assignments }) = step else {
            panic!("expected slots, got {step:?}")
        };
        let got: Vec<(String, i32, String)> = assignments
            .iter()
            .map(|(a, s, r)| {
                (
                    a.to_string(),
                    *s,
                    r.iter().map(ToString::to_string).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("10.0.0.1:6379".to_owned(), 0, "0-5460".to_owned()),
                ("10.0.0.3:6379".to_owned(), 1, "5461-10922".to_owned()),
                ("10.0.0.5:6379".to_owned(), 2, "10923-16383".to_owned()),
            ]
        );
    }

    #[test]
    fn replicas_attach_to_their_shard_primary() {
        let mut n = formed31();
        for x in &mut n {
            x.primary_of = None;
        }
        let step = next_step(
            D31,
            &world(&n, &[1, 2, 3, 4, 5, 6]),
            None,
            FailoverTiming::default(),
        )
        .unwrap();
        assert_eq!(
            step,
            Step::Replicate(steps::Replicate {
                attachments: vec![
                    (addr(2), id(1), 0, addr(1)),
                    (addr(4), id(3), 1, addr(3)),
                    (addr(6), id(5), 2, addr(5)),
                ]
            })
        );
    }

    #[test]
    fn formed_cluster_needs_nothing() {
        let m = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, None, FailoverTiming::default()), None);
    }

    #[test]
    fn roles_come_from_the_live_view_not_the_pod_name() {
        // Failover happened in shard 0: node-index-1 is now the primary, index 0 its replica.
        let n = failed_over31();
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, None, FailoverTiming::default()), None);
    }

    #[test]
    fn replacement_pod_becomes_replica_of_current_primary() {
        // Shard 0's primary died and was replaced by a new node id (7) at index 0; the old
        // replica (2) took over the slots.
        let mut n = taken_over31();
        n.push(node(7, 0, 0));
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            next_step(D31, &m, None, FailoverTiming::default()),
            Some(Step::Replicate(steps::Replicate {
                attachments: vec![(addr(7), id(2), 0, addr(2))]
            }))
        );
    }

    #[test]
    fn dead_node_is_forgotten_once_nothing_depends_on_it() {
        let mut n = taken_over31();
        let mut n7 = node(7, 0, 0);
        n7.primary_of = Some(2);
        n.push(n7);
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        let Some(Step::Forget(steps::Forget { node_ids, addrs })) =
            next_step(D31, &m, None, FailoverTiming::default())
        else {
            panic!("expected forget")
        };
        assert_eq!(node_ids, [id(1)]);
        assert_eq!(addrs.len(), 6);
    }

    #[test]
    fn a_replaced_pods_old_node_is_forgotten_without_waiting_for_fail() {
        // Shard 2's replica pod (node 6) was replaced by node 7; the others still know node 6,
        // not flagged failed yet.
        let mut n = formed31();
        let mut n7 = node(7, 2, 1);
        n7.primary_of = Some(5);
        n.push(n7);
        let all: Vec<Member> = members(&world(&n, &[1, 2, 3, 4, 5, 6, 7]))
            .into_iter()
            .filter(|m| m.addr != addr(6))
            .collect();
        let step = |m: &[Member], pods: &BTreeSet<IpAddr>| {
            next_step(
                D31,
                &Topology::new(m.to_vec()),
                Some(pods),
                FailoverTiming::default(),
            )
        };
        let Some(Step::Forget(steps::Forget { node_ids, .. })) = step(&all, &ips(6, 7)) else {
            panic!("expected forget")
        };
        assert_eq!(node_ids, [id(6)]);
        // Its pod still holds the IP (terminating): wait.
        assert_eq!(step(&all, &ips(0, 7)), None);
        // The replacement is not reachable yet (it could come back as node 6 with a
        // persistent nodes.conf): wait.
        let without7: Vec<Member> = all.iter().filter(|m| m.addr != addr(7)).cloned().collect();
        assert!(!matches!(
            step(&without7, &ips(6, 7)),
            Some(Step::Forget(steps::Forget { .. }))
        ));
    }

    #[test]
    fn every_replaced_pods_old_node_is_forgotten_in_one_step() {
        // Shards 0 and 2 lost their replica pods (nodes 2 and 6), replaced by nodes 7 and 8.
        let mut n = formed31();
        let mut n7 = node(7, 0, 1);
        n7.primary_of = Some(1);
        let mut n8 = node(8, 2, 1);
        n8.primary_of = Some(5);
        n.extend([n7, n8]);
        let all: Vec<Member> = members(&world(&n, &[1, 2, 3, 4, 5, 6, 7, 8]))
            .into_iter()
            .filter(|m| m.addr != addr(2) && m.addr != addr(6))
            .collect();
        let pods: BTreeSet<IpAddr> = [1, 3, 4, 5, 7, 8]
            .iter()
            .map(|n| ip(*n).parse().unwrap())
            .collect();
        let Some(Step::Forget(steps::Forget { node_ids, addrs })) = next_step(
            D31,
            &Topology::new(all),
            Some(&pods),
            FailoverTiming::default(),
        ) else {
            panic!("expected forget")
        };
        assert_eq!(node_ids, [id(2), id(6)]);
        assert_eq!(addrs.len(), 6);
    }

    #[test]
    fn a_failed_node_cut_off_by_a_partition_is_not_forgotten() {
        // Node 1 was demoted while partitioned: the others flag it failed, its pod (same IP)
        // neither answers nor refuses. Forgetting it would make it a stranger after healing.
        let n = taken_over31();
        let mut m = members(&world(&n, &[1, 2, 3, 4, 5, 6]));
        m.push(unreachable(1, 0, 0, false));
        let all = ips(0, 6);
        let step = |m: &[Member], pods| {
            next_step(
                D31,
                &Topology::new(m.to_vec()),
                pods,
                FailoverTiming::default(),
            )
        };
        assert_eq!(step(&m, Some(&all)), None);
        // Its process died (the pod refuses connections): forget it.
        m.last_mut().expect("member").refused = true;
        assert!(matches!(
            step(&m, Some(&all)),
            Some(Step::Forget(steps::Forget { .. }))
        ));
        // Its pod is gone.
        m.pop();
        assert!(matches!(
            step(&m, Some(&ips(1, 6))),
            Some(Step::Forget(steps::Forget { .. }))
        ));
    }

    #[test]
    fn replica_of_a_dead_primary_waits_for_failover() {
        // Primary 1 died still owning its slots; its replica must not be re-pointed to a new
        // empty node at index 0.
        let mut n = formed31();
        n[0].fail = true;
        n.push(node(7, 0, 0));
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(next_step(D31, &m, None, FailoverTiming::default()), None);
    }

    #[test]
    fn moved_peer_is_met_again() {
        let mut m = members(&world(&formed31(), &[1, 2, 3, 4, 5, 6]));
        // Pod of node 6 restarted with its identity at a new IP.
        m[5].addr = "10.0.0.66:6379".parse().unwrap();
        assert_eq!(
            next_step(D31, &Topology::new(m), None, FailoverTiming::default()),
            Some(Step::ReMeet(steps::ReMeet {
                seed: addr(1),
                nodes: vec!["10.0.0.66:6379".parse().unwrap()]
            }))
        );
    }

    #[test]
    fn single_primary_gets_all_slots() {
        let d = Layout {
            shards: 1,
            replicas: 0,
        };
        let m = world(&[node(1, 0, 0)], &[]);
        let Some(Step::ClaimAndMeet(steps::ClaimAndMeet { claims, nodes, .. })) =
            next_step(d, &m, None, FailoverTiming::default())
        else {
            panic!("expected slots")
        };
        assert_eq!(claims[0].ranges[0].to_string(), "0-16383");
        assert!(nodes.is_empty());
    }

    #[test]
    fn unreachable_members_are_not_acted_on() {
        let mut m = members(&world(&fresh31(), &[]));
        for x in &mut m {
            x.view = None;
        }
        assert_eq!(
            next_step(D31, &Topology::new(m), None, FailoverTiming::default()),
            None
        );
    }
}
