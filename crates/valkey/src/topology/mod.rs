//! The topology model: every position of a cluster's layout with its node's live view, and the
//! questions that planning, failover, rolling updates and status ask of it (pure).
//!
//! Positions (shard index, node index) come from the orchestrator, for the operator the pod
//! labels; roles, shard membership and slot ownership come only from the nodes' own
//! `CLUSTER NODES`, never from positions. [`crate::commands::observe_node`] fills a
//! [`NodeView`].

mod member;

use std::collections::BTreeSet;

pub use member::{Layout, Member, NodeView};

use crate::model::{ClusterNode, ClusterNodes, LinkState};
use crate::slots::SlotSet;

/// The members of a cluster (every position with a running pod, reachable or not) and the
/// best-informed of them, the seed, whose `CLUSTER NODES` stands for the cluster's view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    members: Vec<Member>,
    seed: Option<usize>,
}

impl Topology {
    /// The model of `members` (ordered by position).
    pub fn new(mut members: Vec<Member>) -> Self {
        members.sort_by_key(|m| (m.shard, m.index));
        let seed = members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.me().is_some())
            .max_by_key(|(_, m)| {
                let v = m.view.as_ref().map(|v| &v.nodes);
                let known = v.map_or(0, |n| n.nodes.iter().filter(|n| !n.flags.handshake).count());
                (known, m.owns_slots(), -m.shard, -m.index)
            })
            .map(|(i, _)| i);
        Self { members, seed }
    }

    /// The members in position order.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The model restricted to the positions of `layout`.
    pub fn within(&self, layout: Layout) -> Topology {
        Topology::new(
            self.members
                .iter()
                .filter(|m| layout.contains(m.shard, m.index))
                .cloned()
                .collect(),
        )
    }

    /// The members of `shard`.
    pub fn shard(&self, shard: i32) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(move |m| m.shard == shard)
    }

    /// The member at a position.
    pub fn at(&self, shard: i32, index: i32) -> Option<&Member> {
        self.members
            .iter()
            .find(|m| m.shard == shard && m.index == index)
    }

    /// Members whose node could be reached.
    pub fn reachable(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(|m| m.view.is_some())
    }

    /// The best-connected reachable member: knows the most nodes, prefers slot owners, then the
    /// lowest position.
    pub fn seed(&self) -> Option<&Member> {
        self.seed.map(|i| &self.members[i])
    }

    /// The seed's `CLUSTER NODES`.
    pub fn seed_view(&self) -> Option<&ClusterNodes> {
        Some(&self.seed()?.view.as_ref()?.nodes)
    }

    /// Node `id` as the seed knows it (past the handshake).
    pub fn known(&self, id: &str) -> Option<&ClusterNode> {
        known_by(self.seed_view()?, id)
    }

    /// Ids of the reachable members' nodes.
    pub fn live_ids(&self) -> BTreeSet<&str> {
        self.members.iter().filter_map(Member::id).collect()
    }

    /// Slots owned by any primary in the seed's view.
    pub fn owned_slots(&self) -> SlotSet {
        self.seed_view().map(owned_slots).unwrap_or_default()
    }

    /// The member owning slots as a primary in `shard` (the most slots; ties to the lowest
    /// index): the shard's writer.
    pub fn writer(&self, shard: i32) -> Option<&Member> {
        self.shard(shard)
            .filter_map(|m| Some((m.me().filter(|me| me.owns_slots())?.slot_count(), m)))
            .max_by_key(|(n, m)| (*n, -m.index))
            .map(|(_, m)| m)
    }

    /// The live primary of `shard`: its writer; else, for a shard without slots whose members
    /// follow no node outside it, the node-index-0 member when it is a primary the seed knows.
    /// `None` while a member still replicates an outsider (its dead primary, which may still
    /// own slots): the shard waits for a failover rather than crowning an empty node.
    pub fn primary(&self, shard: i32) -> Option<&Member> {
        if let Some(w) = self.writer(shard) {
            return Some(w);
        }
        let ids: BTreeSet<&str> = self.shard(shard).filter_map(Member::id).collect();
        let follows_outsider = self.shard(shard).any(|m| {
            m.me().is_some_and(|me| {
                me.is_replica() && me.primary_id.as_deref().is_none_or(|p| !ids.contains(p))
            })
        });
        if follows_outsider {
            return None;
        }
        self.shard(shard).find(|m| {
            m.index == 0
                && m.me()
                    .is_some_and(|me| me.is_primary() && self.known(&me.id).is_some())
        })
    }

    /// Members of `primary`'s shard replicating it with their link up.
    pub fn synced_replicas<'a>(&'a self, primary: &'a Member) -> impl Iterator<Item = &'a Member> {
        let pid = primary.id();
        self.shard(primary.shard).filter(move |m| {
            m.addr != primary.addr && pid.is_some_and(|p| m.is_synced_replica_of(p))
        })
    }

    /// The most caught-up synced replica of `primary` (highest offset, ties to the lowest
    /// index): the target of a coordinated failover.
    pub fn best_synced_replica<'a>(&'a self, primary: &'a Member) -> Option<&'a Member> {
        self.best_replica_of(primary.shard, primary.id()?)
    }

    /// The most caught-up member of `shard` replicating node `primary_id` with its link up
    /// (highest offset, ties to the lowest index); the primary need not be a member (its pod
    /// may be gone or terminating).
    pub fn best_replica_of(&self, shard: i32, primary_id: &str) -> Option<&Member> {
        self.shard(shard)
            .filter(|m| m.is_synced_replica_of(primary_id))
            .max_by_key(|m| (m.offset(), -m.index))
    }

    /// Reachable members the seed does not know (not joined yet).
    pub fn unjoined(&self) -> impl Iterator<Item = &Member> {
        let seed_id = self.seed().and_then(Member::id);
        self.members.iter().filter(move |m| {
            m.id()
                .is_some_and(|id| Some(id) != seed_id && self.known(id).is_none())
        })
    }

    /// Reachable members the seed knows under another IP (their pod moved).
    pub fn moved(&self) -> impl Iterator<Item = &Member> {
        let seed_id = self.seed().and_then(Member::id);
        self.members.iter().filter(move |m| {
            m.id().is_some_and(|id| {
                Some(id) != seed_id
                    && self
                        .known(id)
                        .is_some_and(|n| !n.addr.ip.is_empty() && !n.has_ip(m.ip()))
            })
        })
    }

    /// Nodes the seed knows (past the handshake) that are no reachable member's identity: a
    /// replaced pod's old node, or a node whose pod is unreachable.
    pub fn departed(&self) -> impl Iterator<Item = &ClusterNode> {
        let live = self.live_ids();
        self.seed_view()
            .into_iter()
            .flat_map(|v| v.nodes.iter())
            .filter(move |n| !n.flags.handshake && !live.contains(n.id.as_str()))
    }

    /// Reachable members whose own line (role, primary, slots) some other reachable member
    /// does not show yet, or shows flagged `fail`: gossip has not carried the last change to
    /// every node, so a client asking that node would still be sent the old way.
    pub fn unconverged(&self) -> impl Iterator<Item = &Member> {
        self.members.iter().filter(move |m| {
            let Some(me) = m.me() else {
                return false;
            };
            self.reachable()
                .filter(|r| r.addr != m.addr)
                .filter_map(|r| r.view.as_ref())
                .any(|v| known_by(&v.nodes, &me.id).is_none_or(|seen| !shows(seen, me)))
        })
    }

    /// Whether some reachable member other than node `id` itself has a live cluster-bus link to
    /// it: connected, not suspected (`fail?`) or failed (`fail`), and no ping to it pending for
    /// longer than `stale_ping_ms` by that member's clock (a link being connected to a dead
    /// address also shows `connected`). A node heard this way is serving somewhere, whatever the
    /// operator can reach.
    pub fn heard(&self, id: &str, stale_ping_ms: u64) -> bool {
        self.reachable().filter(|m| m.id() != Some(id)).any(|m| {
            let Some(v) = m.view.as_ref() else {
                return false;
            };
            v.nodes.get(id).is_some_and(|n| {
                let ping_stale = n.ping_sent > 0
                    && v.time_ms
                        .is_some_and(|now| now.saturating_sub(n.ping_sent) > stale_ping_ms);
                n.link_state == LinkState::Connected
                    && !n.flags.pfail
                    && !n.flags.fail
                    && !ping_stale
            })
        })
    }

    /// Whether some reachable member flags node `id` `fail`: a majority of primaries agreed on
    /// its failure (Valkey sets `fail` only on a quorum of failure reports, then broadcasts it).
    pub fn agreed_failed(&self, id: &str) -> bool {
        self.reachable().any(|m| {
            m.view
                .as_ref()
                .and_then(|v| v.nodes.get(id))
                .is_some_and(|n| n.flags.fail)
        })
    }

    /// The latest time (Unix ms) any reachable member received a pong from node `id`, when
    /// any reports one.
    pub fn last_heard_ms(&self, id: &str) -> Option<u64> {
        self.reachable()
            .filter_map(|m| m.view.as_ref()?.nodes.get(id).map(|n| n.pong_recv))
            .filter(|t| *t > 0)
            .max()
    }

    /// Slots still owned (in the seed's view) by the primary that members of `shard` replicate
    /// while it is not one of them: the shard's slots while it waits for a failover.
    pub fn orphaned_slots(&self, shard: i32) -> SlotSet {
        let Some(seed) = self.seed_view() else {
            return SlotSet::new();
        };
        self.shard(shard)
            .filter_map(|m| m.me()?.primary_id.as_deref())
            .filter_map(|p| seed.get(p))
            .fold(SlotSet::new(), |acc, n| acc.union(&n.slot_set()))
    }
}

/// Whether another node's line `seen` shows node `me` as it reports itself: same role, same
/// primary, same slots, not failed.
fn shows(seen: &ClusterNode, me: &ClusterNode) -> bool {
    seen.role() == me.role()
        && seen.primary_id == me.primary_id
        && seen.slot_set() == me.slot_set()
        && !seen.flags.fail
}

/// Node `id` in `view`, past the handshake.
pub fn known_by<'a>(view: &'a ClusterNodes, id: &str) -> Option<&'a ClusterNode> {
    view.get(id).filter(|n| !n.flags.handshake)
}

/// Slots owned by any primary in a view.
pub fn owned_slots(view: &ClusterNodes) -> SlotSet {
    view.nodes
        .iter()
        .filter(|n| n.is_primary())
        .fold(SlotSet::new(), |acc, n| acc.union(&n.slot_set()))
}
