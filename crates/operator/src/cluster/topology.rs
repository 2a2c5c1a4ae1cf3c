//! The topology decision of one pass (pure): from the desired layout and the live view of every
//! pod, at most one step (a MEET batch, a slot assignment, replica attachments, a re-MEET of
//! moved peers, or forgetting one dead node), plus the facts the status is derived from.
//!
//! Shard membership comes from the ValkeyNode labels (shard/node index → pod → node id); roles
//! and slot ownership come only from the live `CLUSTER NODES` views, never from pod names.

use std::collections::{BTreeMap, BTreeSet};

use valkey_api::status::ShardStatus;
use valkey_ops::commands::FailoverMode;
use valkey_ops::model::{ClusterNode, ClusterNodes};
use valkey_ops::plan::{initial_assignment, plan_rebalance};
use valkey_ops::{SLOT_COUNT, SlotRange, SlotSet};

use crate::status::TopologyFacts;

/// Desired layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Number of shards.
    pub shards: i32,
    /// Replicas per shard.
    pub replicas: i32,
}

/// What one reachable pod reports.
#[derive(Clone, Debug)]
pub struct NodeView {
    /// Its `CLUSTER NODES`.
    pub nodes: ClusterNodes,
    /// `cluster_state:ok`.
    pub cluster_ok: bool,
    /// For a replica: the link to its primary is up (`master_link_status:up`).
    pub primary_link_up: bool,
    /// Replication offset it has processed (`slave_repl_offset` on a replica).
    pub repl_offset: i64,
    /// For a replica whose link is down: seconds since it broke, `-1` when this process never
    /// had a link (it holds only what it loaded at start).
    pub link_down_since: Option<i64>,
}

impl NodeView {
    fn me(&self) -> Option<&ClusterNode> {
        self.nodes.myself()
    }
}

/// One desired position (ValkeyNode) with a running pod.
#[derive(Clone, Debug)]
pub struct Member {
    /// Shard index (ValkeyNode label).
    pub shard: i32,
    /// Node index inside the shard (ValkeyNode label).
    pub index: i32,
    /// Pod name.
    pub pod: String,
    /// `ip:port` the operator dials.
    pub addr: String,
    /// The live view, `None` when the pod could not be reached.
    pub view: Option<NodeView>,
    /// The pod refused the connection: its server process is not running.
    pub refused: bool,
}

impl Member {
    fn id(&self) -> Option<&str> {
        self.view.as_ref()?.me().map(|m| m.id.as_str())
    }

    fn ip(&self) -> &str {
        self.addr
            .rsplit_once(':')
            .map_or(self.addr.as_str(), |(h, _)| h)
            .trim_matches(['[', ']'])
    }
}

/// One bounded topology step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Introduce isolated nodes (addresses) to the cluster through the seed.
    Meet {
        /// Address of the best-connected node.
        seed: String,
        /// Addresses of nodes the seed does not know.
        nodes: Vec<String>,
    },
    /// MEET again peers the seed knows under an old IP.
    ReMeet {
        /// Address of the seed.
        seed: String,
        /// New addresses of the moved peers.
        nodes: Vec<String>,
    },
    /// Assign unowned slots to shard primaries (the initial plan's ranges).
    AssignSlots {
        /// (primary address, shard index, ranges).
        assignments: Vec<(String, i32, Vec<SlotRange>)>,
    },
    /// Attach nodes as replicas of their shard's live primary.
    Replicate {
        /// (replica address, primary node id, shard index).
        attachments: Vec<(String, String, i32)>,
    },
    /// Move slots from one primary to the primaries of other shards (scale-out rebalance),
    /// one batch of the minimal-move plan.
    MigrateSlots {
        /// Address of the source primary.
        source: String,
        /// (target primary node id, target shard index, slot ranges).
        moves: Vec<(String, i32, Vec<SlotRange>)>,
    },
    /// Promote the most caught-up replica of a shard whose slot-owning primary is down, when
    /// Valkey's own election cannot succeed (`TAKEOVER`) or would only start late (`FORCE`).
    Failover {
        /// Address of the replica to promote.
        replica: String,
        /// Shard index.
        shard: i32,
        /// Node id of the failed primary.
        failed: String,
        /// `CLUSTER FAILOVER` mode.
        mode: FailoverMode,
    },
    /// Forget a failed node that is no pod's identity any more.
    Forget {
        /// Node id to forget.
        node_id: String,
        /// Addresses of all reachable members (each must forget it).
        addrs: Vec<String>,
    },
}

impl Step {
    /// Short CamelCase name (for logs and metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Meet { .. } => "Meet",
            Self::ReMeet { .. } => "ReMeet",
            Self::AssignSlots { .. } => "AssignSlots",
            Self::Replicate { .. } => "Replicate",
            Self::MigrateSlots { .. } => "MigrateSlots",
            Self::Failover { .. } => "Failover",
            Self::Forget { .. } => "Forget",
        }
    }
}

/// The best-connected reachable member: knows the most nodes, prefers slot owners, then the
/// lowest position.
fn seed(members: &[Member]) -> Option<&Member> {
    members
        .iter()
        .filter(|m| m.view.as_ref().and_then(NodeView::me).is_some())
        .max_by_key(|m| {
            let v = m.view.as_ref().map(|v| &v.nodes);
            let known = v.map_or(0, |n| n.nodes.iter().filter(|n| !n.flags.handshake).count());
            let owns = v
                .and_then(ClusterNodes::myself)
                .is_some_and(|me| me.slot_count() > 0);
            (known, owns, -m.shard, -m.index)
        })
}

fn known_by<'a>(seed: &'a ClusterNodes, id: &str) -> Option<&'a ClusterNode> {
    seed.get(id).filter(|n| !n.flags.handshake)
}

/// The live primary of a shard: the member owning slots as a primary (in its own view), else
/// for a shard without slots whose members follow no outside node, the node-index-0 member
/// when it is a primary known to the seed.
fn shard_primary<'a>(shard: i32, members: &'a [Member], seed: &ClusterNodes) -> Option<&'a Member> {
    let in_shard = || members.iter().filter(move |m| m.shard == shard);
    let owner = in_shard()
        .filter_map(|m| {
            let me = m.view.as_ref()?.me()?;
            (me.is_primary() && me.slot_count() > 0).then_some((me.slot_count(), m))
        })
        .max_by_key(|(n, m)| (*n, -m.index))
        .map(|(_, m)| m);
    if owner.is_some() {
        return owner;
    }
    // A member replicating a node outside the shard's live members (its dead primary, which
    // may still own slots) means: wait for failover, do not crown an empty node.
    let ids: BTreeSet<&str> = in_shard().filter_map(Member::id).collect();
    let follows_outsider = in_shard().any(|m| {
        m.view.as_ref().and_then(NodeView::me).is_some_and(|me| {
            me.is_replica() && me.primary_id.as_deref().is_none_or(|p| !ids.contains(p))
        })
    });
    if follows_outsider {
        return None;
    }
    in_shard().find(|m| {
        m.index == 0
            && m.view
                .as_ref()
                .and_then(NodeView::me)
                .is_some_and(|me| me.is_primary() && known_by(seed, &me.id).is_some())
    })
}

/// Slots owned by any primary in a view.
fn owned_slots(view: &ClusterNodes) -> SlotSet {
    view.nodes
        .iter()
        .filter(|n| n.is_primary())
        .fold(SlotSet::new(), |acc, n| acc.union(&n.slot_set()))
}

/// The next step, or `None` when the topology matches the desired layout (or must wait).
///
/// `pod_ips` are the IPs of every pod of the cluster that still exists (any phase but
/// Succeeded/Failed, terminating included), when known: a primary whose IP no pod holds any
/// more is gone for certain, and its shard is failed over without waiting for Valkey's
/// failure detection.
pub fn next_step(
    desired: Desired,
    members: &[Member],
    pod_ips: Option<&BTreeSet<String>>,
) -> Option<Step> {
    let seed_m = seed(members)?;
    let seed_view = &seed_m.view.as_ref()?.nodes;
    let seed_id = seed_view.myself()?.id.clone();

    // 0. A shard without a writer that Valkey cannot fail over by itself comes first.
    if let Some(step) = failover_step(desired, members, seed_view, pod_ips) {
        return Some(step);
    }

    // 1. MEET nodes the seed does not know.
    let unknown: Vec<String> = members
        .iter()
        .filter(|m| {
            m.id()
                .is_some_and(|id| id != seed_id && known_by(seed_view, id).is_none())
        })
        .map(|m| m.addr.clone())
        .collect();
    if !unknown.is_empty() {
        return Some(Step::Meet {
            seed: seed_m.addr.clone(),
            nodes: unknown,
        });
    }

    // 2. Re-MEET peers the seed knows under another IP.
    let moved: Vec<String> = members
        .iter()
        .filter(|m| {
            m.id().is_some_and(|id| {
                id != seed_id
                    && known_by(seed_view, id)
                        .is_some_and(|n| !n.addr.ip.is_empty() && n.addr.ip != m.ip())
            })
        })
        .map(|m| m.addr.clone())
        .collect();
    if !moved.is_empty() {
        return Some(Step::ReMeet {
            seed: seed_m.addr.clone(),
            nodes: moved,
        });
    }

    // 3. Assign unowned slots of the initial plan to the shard primaries.
    let owned = owned_slots(seed_view);
    if owned.len() < usize::from(SLOT_COUNT) {
        let plan = usize::try_from(desired.shards)
            .ok()
            .and_then(|n| initial_assignment(n).ok())
            .unwrap_or_default();
        let mut assignments = Vec::new();
        for (shard, range) in (0..).zip(plan) {
            let missing = SlotSet::from_ranges(&[range]).difference(&owned);
            if missing.is_empty() {
                continue;
            }
            if let Some(p) = shard_primary(shard, members, seed_view) {
                assignments.push((p.addr.clone(), shard, missing.ranges().collect()));
            }
        }
        if !assignments.is_empty() {
            return Some(Step::AssignSlots { assignments });
        }
    }

    // 4. Attach replicas to their shard's live primary.
    let mut attachments = Vec::new();
    for shard in 0..desired.shards {
        let Some(p) = shard_primary(shard, members, seed_view) else {
            continue;
        };
        let Some(pid) = p.id() else { continue };
        for m in members
            .iter()
            .filter(|m| m.shard == shard && m.addr != p.addr)
        {
            let Some(me) = m.view.as_ref().and_then(NodeView::me) else {
                continue;
            };
            let attached = me.is_replica() && me.primary_id.as_deref() == Some(pid);
            let owns_slots = me.is_primary() && me.slot_count() > 0;
            if !attached && !owns_slots {
                attachments.push((m.addr.clone(), pid.to_owned(), shard));
            }
        }
    }
    if !attachments.is_empty() {
        return Some(Step::Replicate { attachments });
    }

    // 5. Give slots to shards that have none (scale-out), one batch of the minimal-move plan.
    if let Some(step) = rebalance_step(desired, members, seed_view) {
        return Some(step);
    }

    // 6. Forget one failed node that is no member's identity, owns no slots and has no live
    //    replica following it (the command re-checks this guard on every node).
    let live_ids: BTreeSet<&str> = members.iter().filter_map(Member::id).collect();
    let followed: BTreeSet<&str> = members
        .iter()
        .filter_map(|m| m.view.as_ref()?.me()?.primary_id.as_deref())
        .collect();
    let dead = seed_view.nodes.iter().find(|n| {
        !n.flags.myself
            && (n.flags.fail || n.flags.noaddr)
            && !live_ids.contains(n.id.as_str())
            && !followed.contains(n.id.as_str())
            && n.slot_count() == 0
    })?;
    Some(Step::Forget {
        node_id: dead.id.clone(),
        addrs: members
            .iter()
            .filter(|m| m.view.is_some())
            .map(|m| m.addr.clone())
            .collect(),
    })
}

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
fn failover_step(
    desired: Desired,
    members: &[Member],
    seed: &ClusterNodes,
    pod_ips: Option<&BTreeSet<String>>,
) -> Option<Step> {
    let live_ids: BTreeSet<&str> = members.iter().filter_map(Member::id).collect();
    // Certainly not serving: its pod is gone, or the pod at its address refuses connections.
    let gone = |n: &ClusterNode| {
        !live_ids.contains(n.id.as_str())
            && !n.addr.ip.is_empty()
            && (pod_ips.is_some_and(|ips| !ips.contains(&n.addr.ip))
                || members
                    .iter()
                    .any(|m| m.refused && m.view.is_none() && m.ip() == n.addr.ip))
    };
    let down =
        |n: &ClusterNode| !live_ids.contains(n.id.as_str()) && (n.flags.failing() || gone(n));
    let serving: Vec<&ClusterNode> = seed
        .nodes
        .iter()
        .filter(|n| n.is_primary() && n.slot_count() > 0)
        .collect();
    let alive = serving.iter().filter(|n| !down(n)).count();
    let majority = alive * 2 > serving.len();
    (0..desired.shards).find_map(|shard| {
        let in_shard = || members.iter().filter(move |m| m.shard == shard);
        let has_writer = in_shard().any(|m| {
            m.view
                .as_ref()
                .and_then(NodeView::me)
                .is_some_and(|me| me.is_primary() && me.slot_count() > 0)
        });
        if has_writer {
            return None;
        }
        in_shard()
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
                replica: m.addr.clone(),
                shard,
                failed: failed.to_owned(),
                mode,
            })
    })
}

/// Slots moved per rebalance batch.
pub const REBALANCE_BATCH_SLOTS: usize = 4096;

/// A rebalance batch when every slot is owned by a live shard primary of the layout, every
/// shard has a joined primary and some shard owns no slot.
fn rebalance_step(desired: Desired, members: &[Member], seed: &ClusterNodes) -> Option<Step> {
    let mut current = BTreeMap::new();
    let mut primaries = BTreeMap::new();
    let mut views = BTreeMap::new();
    for shard in 0..desired.shards {
        let p = shard_primary(shard, members, seed)?;
        let view = p.view.as_ref()?;
        let me = view.me()?;
        current.insert(shard, me.slot_set());
        primaries.insert(shard, (p.addr.clone(), me.id.clone()));
        views.insert(shard, &view.nodes);
    }
    if current.values().all(|s| !s.is_empty()) {
        return None;
    }
    let targets: BTreeSet<i32> = current.keys().copied().collect();
    // Not a partition of all slots (some owned outside the layout or unassigned): no plan.
    let plan = plan_rebalance(&current, &targets, REBALANCE_BATCH_SLOTS).ok()?;
    let batch = plan.batches.into_iter().next()?;
    let source = batch.first()?.source;
    // Gossip must have converged between source and targets: each knows the other, and each
    // target sees every slot owned (else the migration handshake is refused).
    let (_, source_id) = primaries.get(&source)?;
    let converged = batch.iter().filter(|m| m.source == source).all(|m| {
        let (Some(tv), Some(sv), Some((_, tid))) = (
            views.get(&m.target),
            views.get(&source),
            primaries.get(&m.target),
        ) else {
            return false;
        };
        known_by(tv, source_id).is_some()
            && known_by(sv, tid).is_some()
            && owned_slots(tv).len() == usize::from(SLOT_COUNT)
    });
    if !converged {
        return None;
    }
    let moves = batch
        .iter()
        .filter(|m| m.source == source)
        .filter_map(|m| {
            let (_, id) = primaries.get(&m.target)?;
            Some((id.clone(), m.target, m.ranges()))
        })
        .collect();
    Some(Step::MigrateSlots {
        source: primaries.get(&source)?.0.clone(),
        moves,
    })
}

/// Slots still owned (in the seed's view) by the unreachable primary that members of `shard`
/// replicate: the shard's slots while it waits for a failover.
fn orphaned_slots(shard: i32, members: &[Member], seed: &ClusterNodes) -> SlotSet {
    members
        .iter()
        .filter(|m| m.shard == shard)
        .filter_map(|m| m.view.as_ref()?.me()?.primary_id.as_deref())
        .filter_map(|p| seed.get(p))
        .fold(SlotSet::new(), |acc, n| acc.union(&n.slot_set()))
}

/// Facts for the status and the per-shard entries, from the live views.
pub fn analyze(desired: Desired, members: &[Member]) -> (TopologyFacts, Vec<ShardStatus>) {
    let mut facts = TopologyFacts::default();
    let mut shards = Vec::new();
    let Some(seed_view) = seed(members)
        .and_then(|m| m.view.as_ref())
        .map(|v| &v.nodes)
    else {
        // Nothing reachable: every shard is missing (entries are still listed, so the status
        // stays comparable from pass to pass).
        facts.missing_shards = desired.shards;
        facts.missing_replicas = desired.shards * desired.replicas;
        shards.extend((0..desired.shards).map(|index| ShardStatus {
            index,
            ..ShardStatus::default()
        }));
        return (facts, shards);
    };
    let seed_id = seed_view.myself().map(|m| m.id.clone()).unwrap_or_default();
    facts.slots_assigned = u32::try_from(owned_slots(seed_view).len()).unwrap_or(0);
    let live: Vec<&Member> = members.iter().filter(|m| m.view.is_some()).collect();
    facts.cluster_ok = !live.is_empty()
        && live
            .iter()
            .all(|m| m.view.as_ref().is_some_and(|v| v.cluster_ok));
    facts.unjoined_nodes = i32::try_from(
        live.iter()
            .filter(|m| {
                m.id()
                    .is_some_and(|id| id != seed_id && known_by(seed_view, id).is_none())
            })
            .count(),
    )
    .unwrap_or(i32::MAX);

    let live_ids: BTreeSet<&str> = live.iter().filter_map(|m| m.id()).collect();
    facts.departed_nodes = i32::try_from(
        seed_view
            .nodes
            .iter()
            .filter(|n| !n.flags.handshake && !live_ids.contains(n.id.as_str()))
            .count(),
    )
    .unwrap_or(i32::MAX);

    for shard in 0..desired.shards {
        let primary = shard_primary(shard, members, seed_view).filter(|p| {
            p.view
                .as_ref()
                .and_then(NodeView::me)
                .is_some_and(|me| me.slot_count() > 0)
        });
        let Some(p) = primary else {
            facts.missing_shards += 1;
            facts.missing_replicas += desired.replicas;
            shards.push(ShardStatus {
                index: shard,
                slots: orphaned_slots(shard, members, seed_view)
                    .ranges()
                    .map(|r| r.to_string())
                    .collect(),
                ..ShardStatus::default()
            });
            continue;
        };
        let pid = p.id().unwrap_or_default();
        let synced = members
            .iter()
            .filter(|m| m.shard == shard && m.addr != p.addr)
            .filter(|m| {
                m.view.as_ref().is_some_and(|v| {
                    v.primary_link_up
                        && v.me().is_some_and(|me| {
                            me.is_replica() && me.primary_id.as_deref() == Some(pid)
                        })
                })
            })
            .count();
        let synced = i32::try_from(synced).unwrap_or(i32::MAX);
        facts.shards_present += 1;
        facts.missing_replicas += (desired.replicas - synced).max(0);
        if synced >= desired.replicas {
            facts.ready_shards += 1;
        }
        let slots = p
            .view
            .as_ref()
            .and_then(NodeView::me)
            .map(|me| me.slot_set().ranges().map(|r| r.to_string()).collect())
            .unwrap_or_default();
        shards.push(ShardStatus {
            index: shard,
            primary_pod: Some(p.pod.clone()),
            replicas: synced,
            slots,
        });
    }
    (facts, shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a `CLUSTER NODES` line.
    fn line(id: &str, ip: &str, flags: &str, primary: &str, slots: &str) -> String {
        format!("{id} {ip}:6379@16379 {flags} {primary} 0 0 1 connected {slots}")
    }

    fn id(n: u32) -> String {
        format!("{n:040x}")
    }

    fn ip(n: u32) -> String {
        format!("10.0.0.{n}")
    }

    /// A node of the test world: number, shard, index, role (primary id or none), slots.
    #[derive(Clone)]
    struct N {
        n: u32,
        shard: i32,
        index: i32,
        primary_of: Option<u32>,
        slots: &'static str,
        fail: bool,
    }

    fn node(n: u32, shard: i32, index: i32) -> N {
        N {
            n,
            shard,
            index,
            primary_of: None,
            slots: "",
            fail: false,
        }
    }

    /// Every node knows the nodes listed in `known` (plus itself).
    fn world(nodes: &[N], known: &[u32]) -> Vec<Member> {
        nodes
            .iter()
            .filter(|x| !x.fail)
            .map(|x| {
                let mut text = String::new();
                for y in nodes {
                    let me = y.n == x.n;
                    let linked = known.contains(&y.n) && known.contains(&x.n);
                    if !me && !linked {
                        continue;
                    }
                    let role = if y.primary_of.is_some() {
                        "slave"
                    } else {
                        "master"
                    };
                    let mut flags = if me {
                        format!("myself,{role}")
                    } else {
                        role.to_owned()
                    };
                    if y.fail {
                        flags.push_str(",fail");
                    }
                    let primary = y.primary_of.map_or("-".to_owned(), id);
                    text.push_str(&line(&id(y.n), &ip(y.n), &flags, &primary, y.slots));
                    text.push('\n');
                }
                Member {
                    shard: x.shard,
                    index: x.index,
                    pod: format!("pod-{}-{}", x.shard, x.index),
                    addr: format!("{}:6379", ip(x.n)),
                    refused: false,
                    view: Some(NodeView {
                        nodes: ClusterNodes::parse(&text).unwrap(),
                        cluster_ok: true,
                        primary_link_up: x
                            .primary_of
                            .is_some_and(|p| nodes.iter().any(|y| y.n == p && !y.fail)),
                        repl_offset: i64::from(x.n) * 10,
                        link_down_since: x.primary_of.map(|_| 1),
                    }),
                }
            })
            .collect()
    }

    const D31: Desired = Desired {
        shards: 3,
        replicas: 1,
    };

    fn fresh31() -> Vec<N> {
        vec![
            node(1, 0, 0),
            node(2, 0, 1),
            node(3, 1, 0),
            node(4, 1, 1),
            node(5, 2, 0),
            node(6, 2, 1),
        ]
    }

    fn formed31() -> Vec<N> {
        let mut n = fresh31();
        n[0].slots = "0-5460";
        n[2].slots = "5461-10922";
        n[4].slots = "10923-16383";
        n[1].primary_of = Some(1);
        n[3].primary_of = Some(3);
        n[5].primary_of = Some(5);
        n
    }

    #[test]
    fn fresh_nodes_are_met_in_one_batch() {
        let step = next_step(D31, &world(&fresh31(), &[]), None).unwrap();
        let Step::Meet { seed, nodes } = step else {
            panic!("expected meet, got {step:?}")
        };
        assert_eq!(seed, "10.0.0.1:6379");
        assert_eq!(nodes.len(), 5);
    }

    #[test]
    fn joined_nodes_get_the_initial_slot_plan_on_index_0() {
        let step = next_step(D31, &world(&fresh31(), &[1, 2, 3, 4, 5, 6]), None).unwrap();
        let Step::AssignSlots { assignments } = step else {
            panic!("expected slots, got {step:?}")
        };
        let got: Vec<(String, i32, String)> = assignments
            .iter()
            .map(|(a, s, r)| (a.clone(), *s, r.iter().map(ToString::to_string).collect()))
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
        let step = next_step(D31, &world(&n, &[1, 2, 3, 4, 5, 6]), None).unwrap();
        assert_eq!(
            step,
            Step::Replicate {
                attachments: vec![
                    ("10.0.0.2:6379".into(), id(1), 0),
                    ("10.0.0.4:6379".into(), id(3), 1),
                    ("10.0.0.6:6379".into(), id(5), 2),
                ]
            }
        );
    }

    #[test]
    fn formed_cluster_needs_nothing_and_is_ready() {
        let m = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, None), None);
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
    fn roles_come_from_the_live_view_not_the_pod_name() {
        // Failover happened in shard 0: node-index-1 is now the primary, index 0 its replica.
        let mut n = formed31();
        n[0].slots = "";
        n[0].primary_of = Some(2);
        n[1].slots = "0-5460";
        n[1].primary_of = None;
        let m = world(&n, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(next_step(D31, &m, None), None);
        let (facts, shards) = analyze(D31, &m);
        assert_eq!(facts.ready_shards, 3);
        assert_eq!(shards[0].primary_pod.as_deref(), Some("pod-0-1"));
    }

    #[test]
    fn replacement_pod_becomes_replica_of_current_primary() {
        // Shard 0's primary died and was replaced by a new node id (7) at index 0; the old
        // replica (2) took over the slots.
        let mut n = formed31();
        n[0].fail = true;
        n[0].slots = "";
        n[1].slots = "0-5460";
        n[1].primary_of = None;
        n.push(node(7, 0, 0));
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            next_step(D31, &m, None),
            Some(Step::Replicate {
                attachments: vec![("10.0.0.7:6379".into(), id(2), 0)]
            })
        );
        let (facts, _) = analyze(D31, &m);
        assert_eq!(facts.missing_replicas, 1);
    }

    #[test]
    fn dead_node_is_forgotten_once_nothing_depends_on_it() {
        let mut n = formed31();
        n[0].fail = true;
        n[0].slots = "";
        n[1].slots = "0-5460";
        n[1].primary_of = None;
        let mut n7 = node(7, 0, 0);
        n7.primary_of = Some(2);
        n.push(n7);
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        let Some(Step::Forget { node_id, addrs }) = next_step(D31, &m, None) else {
            panic!("expected forget")
        };
        assert_eq!(node_id, id(1));
        assert_eq!(addrs.len(), 6);
    }

    #[test]
    fn replica_of_a_dead_primary_waits_for_failover() {
        // Primary 1 died still owning its slots; its replica must not be re-pointed to a new
        // empty node at index 0.
        let mut n = formed31();
        n[0].fail = true;
        n.push(node(7, 0, 0));
        let m = world(&n, &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(next_step(D31, &m, None), None);
        let (facts, _) = analyze(D31, &m);
        assert_eq!(facts.missing_shards, 1);
    }

    #[test]
    fn moved_peer_is_met_again() {
        let m = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        let mut m = m;
        // Pod of node 6 restarted with its identity at a new IP.
        m[5].addr = "10.0.0.66:6379".into();
        assert_eq!(
            next_step(D31, &m, None),
            Some(Step::ReMeet {
                seed: "10.0.0.1:6379".into(),
                nodes: vec!["10.0.0.66:6379".into()]
            })
        );
    }

    #[test]
    fn new_shard_gets_slots_by_migration() {
        // 2 shards owning everything, a third (scale-out) joined with no slots.
        let mut n = vec![node(1, 0, 0), node(3, 1, 0), node(5, 2, 0)];
        n[0].slots = "0-8191";
        n[1].slots = "8192-16383";
        let d = Desired {
            shards: 3,
            replicas: 0,
        };
        let m = world(&n, &[1, 3, 5]);
        let Some(Step::MigrateSlots { source, moves }) = next_step(d, &m, None) else {
            panic!("expected migration, got {:?}", next_step(d, &m, None))
        };
        assert!(source == "10.0.0.1:6379" || source == "10.0.0.3:6379");
        assert_eq!(moves.len(), 1);
        assert_eq!(moves[0].0, id(5));
        assert_eq!(moves[0].1, 2);
        let moved: usize = moves[0].2.iter().map(SlotRange::len).sum();
        assert!(moved > 0 && moved <= REBALANCE_BATCH_SLOTS);
        // The others know the new primary, but it does not know them yet: wait.
        let mut m = world(&n, &[1, 3, 5]);
        m[2].view = world(&n, &[]).remove(2).view;
        assert_eq!(next_step(d, &m, None), None);
        // Balanced: nothing to do.
        let mut n = vec![node(1, 0, 0), node(3, 1, 0), node(5, 2, 0)];
        n[0].slots = "0-5460";
        n[1].slots = "5461-10922";
        n[2].slots = "10923-16383";
        assert_eq!(next_step(d, &world(&n, &[1, 3, 5]), None), None);
    }

    #[test]
    fn new_shard_with_replica_attached_still_gets_slots() {
        let mut n = vec![node(1, 0, 0), node(2, 0, 1), node(3, 1, 0), node(4, 1, 1)];
        n[0].slots = "0-16383";
        n[1].primary_of = Some(1);
        n[3].primary_of = Some(3);
        let d = Desired {
            shards: 2,
            replicas: 1,
        };
        let m = world(&n, &[1, 2, 3, 4]);
        let Some(Step::MigrateSlots { source, moves }) = next_step(d, &m, None) else {
            panic!("expected migration, got {:?}", next_step(d, &m, None))
        };
        assert_eq!(source, "10.0.0.1:6379");
        assert_eq!(moves[0].0, id(3));
    }

    #[test]
    fn single_primary_gets_all_slots() {
        let d = Desired {
            shards: 1,
            replicas: 0,
        };
        let m = world(&[node(1, 0, 0)], &[]);
        let Some(Step::AssignSlots { assignments }) = next_step(d, &m, None) else {
            panic!("expected slots")
        };
        assert_eq!(assignments[0].2[0].to_string(), "0-16383");
    }

    #[test]
    fn unreachable_members_are_not_acted_on() {
        let mut m = world(&fresh31(), &[]);
        for x in &mut m {
            x.view = None;
        }
        assert_eq!(next_step(D31, &m, None), None);
        let (facts, shards) = analyze(D31, &m);
        assert_eq!(facts.missing_shards, 3);
        assert_eq!(shards.len(), 3);
    }

    #[test]
    fn two_shards_losing_a_primary_take_over_on_the_most_caught_up_replica() {
        // 2 shards × 2 replicas; shard 0's primary (1) is down and replaced by node 7. One live
        // slot owner out of two is no majority: no election can succeed.
        let d = Desired {
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
                replica: "10.0.0.3:6379".into(),
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
        let mut m = world(n, &[1, 2, 3, 4, 5, 6, 7]);
        m.retain(|x| x.addr != "10.0.0.1:6379");
        for x in m.iter_mut().filter(|x| x.shard == 0) {
            if let Some(v) = x.view.as_mut() {
                v.primary_link_up = false;
            }
        }
        m
    }

    fn ips(except: u32, upto: u32) -> BTreeSet<String> {
        (1..=upto).filter(|n| *n != except).map(ip).collect()
    }

    #[test]
    fn gone_primary_pod_is_failed_over_at_once_with_force() {
        let m = primary_unreachable(&formed31());
        assert_eq!(
            next_step(D31, &m, Some(&ips(1, 6))),
            Some(Step::Failover {
                replica: "10.0.0.2:6379".into(),
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
        let d = Desired {
            shards: 2,
            replicas: 1,
        };
        let mut n = vec![node(1, 0, 0), node(2, 0, 1), node(3, 1, 0), node(4, 1, 1)];
        n[0].slots = "0-8191";
        n[2].slots = "8192-16383";
        n[1].primary_of = Some(1);
        n[3].primary_of = Some(3);
        let m = primary_unreachable(&n);
        assert_eq!(
            next_step(d, &m, Some(&ips(1, 4))),
            Some(Step::Failover {
                replica: "10.0.0.2:6379".into(),
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
            addr: "10.0.0.1:6379".into(),
            view: None,
            refused: true,
        });
        let all = ips(0, 6);
        assert!(matches!(
            next_step(D31, &m, Some(&all)),
            Some(Step::Failover {
                mode: FailoverMode::Force,
                ..
            })
        ));
        // Unreachable but not refusing (a timeout, a partition): wait for Valkey.
        if let Some(x) = m.last_mut() {
            x.refused = false;
        }
        assert_eq!(next_step(D31, &m, Some(&all)), None);
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
        assert_eq!(next_step(D31, &m, Some(&ips(1, 6))), None);
    }
}
