//! Removal of surplus ValkeyNodes (pure): positions outside the layout, after a lower
//! `shards` (whose slots are drained first, see [`super::rebalance`]) or a lower `replicas`.
//!
//! A surplus node that is its shard's live primary hands its slots over to a synced replica
//! inside the layout first. Surplus nodes are then retired together, and only when every slot
//! is owned, in the view of every reachable node, by a member of the layout: their nodes are
//! forgotten everywhere, then their ValkeyNodes deleted. A running pod the operator could not
//! reach in this pass is never retired (it may hold the only copy of its slots).

use std::collections::BTreeSet;

use kube::ResourceExt;
use valkey_api::ValkeyNode;
use valkey_ops::{Layout, Member, Topology};

use crate::cluster::steps::{self, Step};

/// The next removal step: a hand-over of a surplus primary, or the retirement of every
/// surplus node that can go.
pub fn surplus(layout: Layout, topology: &Topology, nodes: &[ValkeyNode]) -> Option<Step> {
    let surplus: Vec<&ValkeyNode> = nodes
        .iter()
        .filter(|n| !layout.contains(n.spec.shard_index, n.spec.node_index))
        .collect();
    if surplus.is_empty() {
        return None;
    }
    if let Some(step) = hand_over(layout, topology, &surplus) {
        return Some(step);
    }
    retire(layout, topology, &surplus)
}

/// A surplus node of a shard that stays, owning that shard's slots: hand them to the most
/// caught-up synced replica inside the layout (none synced yet: wait).
fn hand_over(layout: Layout, topology: &Topology, surplus: &[&ValkeyNode]) -> Option<Step> {
    surplus.iter().find_map(|n| {
        let (shard, index) = (n.spec.shard_index, n.spec.node_index);
        if shard >= layout.shards {
            return None;
        }
        let m = topology.at(shard, index).filter(|m| m.owns_slots())?;
        let id = m.id()?;
        let replica = topology
            .shard(shard)
            .filter(|r| layout.contains(r.shard, r.index) && r.is_synced_replica_of(id))
            .max_by_key(|r| (r.offset(), -r.index))?;
        Some(Step::HandOver(steps::HandOver {
            replica: replica.addr,
            shard,
            primary: n.name_any(),
        }))
    })
}

/// The surplus nodes that can be retired now.
fn retire(layout: Layout, topology: &Topology, surplus: &[&ValkeyNode]) -> Option<Step> {
    let inside: Vec<&Member> = topology
        .members()
        .iter()
        .filter(|m| layout.contains(m.shard, m.index))
        .collect();
    let inside_ids: BTreeSet<&str> = inside.iter().filter_map(|m| m.id()).collect();
    if inside_ids.is_empty() || topology.owned_slots().len() < usize::from(valkey_ops::SLOT_COUNT) {
        return never_joined(topology, surplus);
    }
    // Every slot owner, in every reachable view, is a member of the layout.
    let outsider_owns = topology.reachable().any(|m| {
        m.view.as_ref().is_some_and(|v| {
            v.nodes
                .nodes
                .iter()
                .any(|n| n.owns_slots() && !inside_ids.contains(n.id.as_str()))
        })
    });
    if outsider_owns {
        return never_joined(topology, surplus);
    }
    let mut forget: Vec<(bool, String)> = Vec::new();
    let mut reset = Vec::new();
    let mut names = Vec::new();
    for n in surplus {
        match topology.at(n.spec.shard_index, n.spec.node_index) {
            // Running but not observed this pass: keep it.
            Some(m) if m.view.is_none() => continue,
            Some(m) => {
                if let Some(me) = m.me() {
                    forget.push((me.is_primary(), me.id.clone()));
                }
                reset.push(m.addr);
            }
            // No running pod: it serves nothing (every slot is owned inside the layout).
            None => {}
        }
        names.push(n.name_any());
    }
    if names.is_empty() {
        return None;
    }
    // Replicas before their primary (a primary with a live follower is not forgotten).
    forget.sort();
    Some(Step::Retire(steps::Retire {
        forget: forget.into_iter().map(|(_, id)| id).collect(),
        at: inside
            .iter()
            .filter(|m| m.view.is_some())
            .map(|m| m.addr)
            .collect(),
        reset,
        names,
    }))
}

/// Surplus nodes that have no pod and were never seen as a cluster member (no live role was
/// ever recorded): they hold no data, so they go whatever state the cluster is in.
fn never_joined(topology: &Topology, surplus: &[&ValkeyNode]) -> Option<Step> {
    let names: Vec<String> = surplus
        .iter()
        .filter(|n| n.status.as_ref().is_none_or(|s| s.role.is_none()))
        .filter(|n| topology.at(n.spec.shard_index, n.spec.node_index).is_none())
        .map(|n| n.name_any())
        .collect();
    (!names.is_empty()).then(|| {
        Step::Retire(steps::Retire {
            forget: Vec::new(),
            at: Vec::new(),
            reset: Vec::new(),
            names,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::super::testworld::*;
    use super::*;

    fn vnode(shard: i32, index: i32) -> ValkeyNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "valkey.io/v1alpha1", "kind": "ValkeyNode",
            "metadata": {"name": format!("c-{shard}-{index}")},
            "spec": {"clusterName": "c", "shardIndex": shard, "nodeIndex": index,
                     "image": "valkey/valkey:9.0.0", "terminationGracePeriodSeconds": 30},
        }))
        .expect("valkeynode")
    }

    fn d(shards: i32, replicas: i32) -> Layout {
        Layout { shards, replicas }
    }

    #[test]
    fn a_drained_shard_is_retired_replica_first() {
        // 4 -> 3, shard 3 (nodes 7, 8) drained.
        let mut n = formed31();
        n.push(node(7, 3, 0));
        let mut r = node(8, 3, 1);
        r.primary_of = Some(7);
        n.push(r);
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let nodes = [vnode(3, 0), vnode(3, 1)];
        let Some(Step::Retire(steps::Retire {
            forget,
            at,
            reset,
            names,
        })) = surplus(D31, &m, &nodes)
        else {
            panic!("expected retirement, got {:?}", surplus(D31, &m, &nodes))
        };
        assert_eq!(forget, [id(8), id(7)]);
        assert_eq!(at.len(), 6);
        assert_eq!(reset, [addr(7), addr(8)]);
        assert_eq!(names, ["c-3-0", "c-3-1"]);
    }

    #[test]
    fn a_shard_still_owning_slots_is_not_retired() {
        let mut n = formed31();
        n[4].slots = "10923-15000";
        let mut x = node(7, 3, 0);
        x.slots = "15001-16383";
        n.push(x);
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(surplus(D31, &m, &[vnode(3, 0)]), None);
    }

    #[test]
    fn a_slot_owner_in_any_reachable_view_blocks_retirement() {
        // Node 7 gave its slots away in its own view, but node 1 still sees it owning some.
        let mut n = formed31();
        n.push(node(7, 3, 0));
        let mut mm = members(&world(&n, &[1, 2, 3, 4, 5, 6, 7]));
        let seen = mm[0]
            .view
            .as_mut()
            .and_then(|v| v.nodes.nodes.iter_mut().find(|x| x.id == id(5)))
            .expect("node 5");
        let stale = seen.clone();
        let v = mm[0].view.as_mut().expect("view");
        v.nodes.nodes.retain(|x| x.id != id(7));
        let mut seven = stale;
        seven.id = id(7);
        seven.flags.myself = false;
        v.nodes.nodes.push(seven);
        assert_eq!(surplus(D31, &Topology::new(mm), &[vnode(3, 0)]), None);
    }

    #[test]
    fn an_unreachable_running_pod_is_kept_and_a_missing_pod_goes() {
        let mut n = formed31();
        n.push(node(7, 3, 0));
        let mut mm = members(&world(&n, &[1, 2, 3, 4, 5, 6, 7]));
        mm[6].view = None;
        let nodes = [vnode(3, 0), vnode(4, 0)];
        let Some(Step::Retire(steps::Retire { forget, names, .. })) =
            surplus(D31, &Topology::new(mm), &nodes)
        else {
            panic!("expected retirement of the pod-less node")
        };
        assert!(forget.is_empty());
        assert_eq!(names, ["c-4-0"]);
    }

    #[test]
    fn a_node_that_never_joined_goes_whatever_the_cluster_state_one_that_did_stays() {
        // No pod runs at all (nothing observed, no slot owned anywhere).
        let empty = Topology::new(Vec::new());
        let never = vnode(0, 1);
        let mut joined = vnode(1, 1);
        joined.status = Some(valkey_api::ValkeyNodeStatus {
            role: Some("primary".into()),
            ..Default::default()
        });
        let Some(Step::Retire(steps::Retire { names, forget, .. })) =
            surplus(d(2, 0), &empty, &[never.clone(), joined.clone()])
        else {
            panic!("expected the never-joined node to go")
        };
        assert_eq!((names, forget.len()), (vec!["c-0-1".to_owned()], 0));
        assert_eq!(surplus(d(2, 0), &empty, &[joined]), None);
    }

    #[test]
    fn replicas_to_zero_after_a_failover_hands_over_first() {
        // Shard 0's primary sits at node-index 1 (node 2), node 1 replicates it.
        let n = failed_over31();
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        let nodes = [vnode(0, 1), vnode(1, 1), vnode(2, 1)];
        assert_eq!(
            surplus(d(3, 0), &m, &nodes),
            Some(Step::HandOver(steps::HandOver {
                replica: addr(1),
                shard: 0,
                primary: "c-0-1".into()
            }))
        );
        // Once handed over, every index-1 node retires at once.
        let m = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        let Some(Step::Retire(steps::Retire { forget, names, .. })) = surplus(d(3, 0), &m, &nodes)
        else {
            panic!("expected retirement")
        };
        assert_eq!(forget, [id(2), id(4), id(6)]);
        assert_eq!(names.len(), 3);
    }
}
