//! A cluster view assembled from what every reachable node reports, answering the questions
//! the controllers ask (unassigned slots, slot owners, isolated/failed/stale nodes, best
//! replica, failover quorum, open slot transfers).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::info::{ClusterInfo, ReplicationInfo, ServerInfo, Version};
use crate::model::migrations::SlotMigration;
use crate::model::nodes::{ClusterNode, ClusterNodes, NodeAddr};
use crate::plan::failover::{ReplicaCandidate, choose_failover_target};
use crate::slots::{SLOT_COUNT, Slot, SlotSet};

/// What one node reported.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeObservation {
    /// Its `CLUSTER NODES` table.
    pub nodes: ClusterNodes,
    /// Its `CLUSTER INFO`, if fetched.
    pub cluster_info: Option<ClusterInfo>,
    /// Its `INFO replication`, if fetched.
    pub replication: Option<ReplicationInfo>,
    /// Its `INFO server`, if fetched.
    pub server: Option<ServerInfo>,
    /// Its `CLUSTER GETSLOTMIGRATIONS` (empty before Valkey 9 or when not fetched).
    pub migrations: Vec<SlotMigration>,
}

impl NodeObservation {
    /// An observation holding only a `CLUSTER NODES` table.
    pub fn new(nodes: ClusterNodes) -> Self {
        Self {
            nodes,
            ..Self::default()
        }
    }

    /// The observing node's own line.
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.myself()
    }
}

/// A primary with its slots and replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardView {
    /// Primary node id.
    pub primary_id: String,
    /// Primary address as announced.
    pub primary_addr: NodeAddr,
    /// Slots it owns (by the highest config epoch claim).
    pub slots: SlotSet,
    /// Ids of the replicas following it.
    pub replicas: Vec<String>,
    /// Whether a majority of reachable nodes flag the primary `fail`.
    pub failed: bool,
}

/// A node that others know under a different address than the one we reach it at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleAddress {
    /// Node id.
    pub node_id: String,
    /// The address we reached it at (the observation key).
    pub actual: String,
    /// The address the observer has for it (`ip:port`).
    pub seen: String,
    /// The observer's address (observation key).
    pub seen_by: String,
}

/// Direction of an open `SETSLOT` transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransferKind {
    /// `[slot-<-from]` on the receiving node.
    Importing,
    /// `[slot->-to]` on the sending node.
    Migrating,
}

/// An open importing/migrating slot state reported by a node about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSlot {
    /// Node holding the state.
    pub node_id: String,
    /// The slot.
    pub slot: Slot,
    /// The other node of the transfer.
    pub peer_id: String,
    /// Importing or migrating.
    pub kind: TransferKind,
}

/// The chosen replica of [`ClusterView::best_synced_replica`] and friends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaPick {
    /// Node id.
    pub node_id: String,
    /// Its address (observation key).
    pub address: String,
    /// Its replication offset.
    pub offset: i64,
}

/// The cluster as seen from all reachable nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// Observation (or error text) per address we tried, keyed by `ip:port`.
    pub observations: BTreeMap<String, Result<NodeObservation, String>>,
    merged: BTreeMap<String, ClusterNode>,
    owners: Vec<Option<u32>>,
    owner_ids: Vec<String>,
}

impl ClusterView {
    /// Assembles the view from per-address results.
    pub fn new(observations: BTreeMap<String, Result<NodeObservation, String>>) -> Self {
        // Merged table: a node's own line wins, otherwise the first report (address order).
        let mut merged: BTreeMap<String, ClusterNode> = BTreeMap::new();
        for obs in observations.values().filter_map(|o| o.as_ref().ok()) {
            for n in &obs.nodes.nodes {
                if n.flags.myself {
                    merged.insert(n.id.clone(), n.clone());
                } else {
                    merged.entry(n.id.clone()).or_insert_with(|| n.clone());
                }
            }
        }
        // Slot owners: the claim with the highest config epoch; ties to the smallest id.
        let mut owner_ids: Vec<String> = Vec::new();
        let mut index: BTreeMap<String, u32> = BTreeMap::new();
        let mut owners: Vec<Option<u32>> = vec![None; usize::from(SLOT_COUNT)];
        let mut epochs: Vec<u64> = vec![0; usize::from(SLOT_COUNT)];
        for obs in observations.values().filter_map(|o| o.as_ref().ok()) {
            for n in &obs.nodes.nodes {
                if n.slots.is_empty() {
                    continue;
                }
                let idx = *index.entry(n.id.clone()).or_insert_with(|| {
                    owner_ids.push(n.id.clone());
                    (owner_ids.len() - 1) as u32
                });
                for r in &n.slots {
                    for s in r.iter() {
                        let s = usize::from(s);
                        let better = match owners[s] {
                            None => true,
                            Some(cur) => {
                                n.config_epoch > epochs[s]
                                    || (n.config_epoch == epochs[s]
                                        && n.id < owner_ids[cur as usize])
                            }
                        };
                        if better {
                            owners[s] = Some(idx);
                            epochs[s] = n.config_epoch;
                        }
                    }
                }
            }
        }
        Self {
            observations,
            merged,
            owners,
            owner_ids,
        }
    }

    /// Reachable nodes: (address, observation).
    pub fn reachable(&self) -> impl Iterator<Item = (&str, &NodeObservation)> {
        self.observations
            .iter()
            .filter_map(|(a, o)| o.as_ref().ok().map(|o| (a.as_str(), o)))
    }

    /// Addresses that could not be observed, with the error text.
    pub fn unreachable(&self) -> impl Iterator<Item = (&str, &str)> {
        self.observations
            .iter()
            .filter_map(|(a, o)| o.as_ref().err().map(|e| (a.as_str(), e.as_str())))
    }

    /// Address at which node `id` was reached, if it was.
    pub fn address_of(&self, id: &str) -> Option<&str> {
        self.reachable()
            .find(|(_, o)| o.myself().is_some_and(|m| m.id == id))
            .map(|(a, _)| a)
    }

    /// Node id answering at `address`, if reachable.
    pub fn id_at(&self, address: &str) -> Option<&str> {
        match self.observations.get(address) {
            Some(Ok(o)) => o.myself().map(|m| m.id.as_str()),
            _ => None,
        }
    }

    /// All nodes known by any reachable node (own line preferred).
    pub fn nodes(&self) -> impl Iterator<Item = &ClusterNode> {
        self.merged.values()
    }

    /// The merged line of node `id`.
    pub fn node(&self, id: &str) -> Option<&ClusterNode> {
        self.merged.get(id)
    }

    /// The node id owning `slot`, if any reachable node reports an owner.
    pub fn owner_of(&self, slot: Slot) -> Option<&str> {
        self.owners
            .get(usize::from(slot))
            .copied()
            .flatten()
            .map(|i| self.owner_ids[i as usize].as_str())
    }

    /// Slots owned per node id.
    pub fn ownership(&self) -> BTreeMap<String, SlotSet> {
        let mut out: BTreeMap<String, SlotSet> = BTreeMap::new();
        for (slot, owner) in self.owners.iter().enumerate() {
            if let Some(i) = owner {
                out.entry(self.owner_ids[*i as usize].clone())
                    .or_default()
                    .insert(slot as Slot);
            }
        }
        out
    }

    /// Slots no reachable node reports an owner for.
    pub fn unassigned_slots(&self) -> SlotSet {
        self.owners
            .iter()
            .enumerate()
            .filter(|(_, o)| o.is_none())
            .map(|(s, _)| s as Slot)
            .collect()
    }

    /// Primaries (from the merged table) with their slots and replicas, by primary id.
    pub fn shards(&self) -> Vec<ShardView> {
        let ownership = self.ownership();
        let failed = self.failed_peers();
        self.merged
            .values()
            .filter(|n| n.is_primary())
            .map(|p| ShardView {
                primary_id: p.id.clone(),
                primary_addr: p.addr.clone(),
                slots: ownership.get(&p.id).cloned().unwrap_or_default(),
                replicas: self
                    .merged
                    .values()
                    .filter(|r| r.is_replica() && r.primary_id.as_deref() == Some(p.id.as_str()))
                    .map(|r| r.id.clone())
                    .collect(),
                failed: failed.contains(&p.id),
            })
            .collect()
    }

    /// Reachable nodes (addresses) that know at most half of the reachable nodes — a fresh node
    /// that knows only itself, or one not met with the majority.
    pub fn isolated_nodes(&self) -> Vec<String> {
        let reachable_ids: BTreeSet<&str> = self
            .reachable()
            .filter_map(|(_, o)| o.myself().map(|m| m.id.as_str()))
            .collect();
        let total = reachable_ids.len();
        self.reachable()
            .filter(|(_, o)| {
                let known = o
                    .nodes
                    .nodes
                    .iter()
                    .filter(|n| !n.flags.handshake && reachable_ids.contains(n.id.as_str()))
                    .count();
                total > 1 && known * 2 <= total
            })
            .map(|(a, _)| a.to_owned())
            .collect()
    }

    /// Node ids flagged `fail` by a majority of the reachable nodes.
    pub fn failed_peers(&self) -> BTreeSet<String> {
        let observers = self.reachable().count();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, o) in self.reachable() {
            for n in o.nodes.nodes.iter().filter(|n| n.flags.fail) {
                *votes.entry(n.id.as_str()).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .filter(|(_, v)| v * 2 > observers)
            .map(|(id, _)| id.to_owned())
            .collect()
    }

    /// Node ids some reachable node flags `fail` or `fail?`.
    pub fn suspected_peers(&self) -> BTreeSet<String> {
        self.reachable()
            .flat_map(|(_, o)| o.nodes.nodes.iter())
            .filter(|n| n.flags.failing())
            .map(|n| n.id.clone())
            .collect()
    }

    /// Nodes that others know under another `ip:port` than where we reach them.
    pub fn stale_addresses(&self) -> Vec<StaleAddress> {
        let actual: BTreeMap<&str, &str> = self
            .reachable()
            .filter_map(|(a, o)| o.myself().map(|m| (m.id.as_str(), a)))
            .collect();
        let mut out = Vec::new();
        for (observer, o) in self.reachable() {
            for n in o
                .nodes
                .nodes
                .iter()
                .filter(|n| !n.flags.myself && !n.has_no_address())
            {
                if let Some(addr) = actual.get(n.id.as_str()) {
                    let seen = n.addr.host_port();
                    if seen != *addr {
                        out.push(StaleAddress {
                            node_id: n.id.clone(),
                            actual: (*addr).to_owned(),
                            seen,
                            seen_by: observer.to_owned(),
                        });
                    }
                }
            }
        }
        out
    }

    fn replica_pick(&self, primary_id: &str, link_must_be_up: bool) -> Option<ReplicaPick> {
        let mut by_id: BTreeMap<String, (&str, i64)> = BTreeMap::new();
        let candidates: Vec<ReplicaCandidate<String>> = self
            .reachable()
            .filter_map(|(a, o)| {
                let me = o.myself()?;
                let repl = o.replication.as_ref()?;
                if !me.is_replica() || me.primary_id.as_deref() != Some(primary_id) {
                    return None;
                }
                let synced = if link_must_be_up {
                    repl.is_synced_replica()
                } else {
                    !repl.sync_in_progress && repl.offset() > 0
                };
                by_id.insert(me.id.clone(), (a, repl.offset()));
                Some(ReplicaCandidate {
                    node: me.id.clone(),
                    synced,
                    offset: repl.offset(),
                })
            })
            .collect();
        let best = choose_failover_target(&candidates)?;
        let (address, offset) = by_id.get(&best.node)?;
        Some(ReplicaPick {
            node_id: best.node.clone(),
            address: (*address).to_owned(),
            offset: *offset,
        })
    }

    /// The most caught-up synced replica of `primary_id` (link up, no full sync; highest
    /// offset; ties to the smallest id) — the target of a planned failover.
    pub fn best_synced_replica(&self, primary_id: &str) -> Option<ReplicaPick> {
        self.replica_pick(primary_id, true)
    }

    /// The most caught-up replica of a dead `primary_id`: its link is down, so any replica not
    /// in a full sync and holding data qualifies (highest offset; ties to the smallest id).
    pub fn most_caught_up_replica(&self, primary_id: &str) -> Option<ReplicaPick> {
        self.replica_pick(primary_id, false)
    }

    /// Whether a majority of the slot-owning primaries is reachable and not failed, which a
    /// failover election (and `FAILOVER FORCE`) needs.
    pub fn failover_quorum(&self) -> bool {
        let owners: BTreeSet<&str> = self
            .owners
            .iter()
            .flatten()
            .map(|i| self.owner_ids[*i as usize].as_str())
            .collect();
        if owners.is_empty() {
            return false;
        }
        let failed = self.failed_peers();
        let alive = owners
            .iter()
            .filter(|id| self.address_of(id).is_some() && !failed.contains(**id))
            .count();
        alive * 2 > owners.len()
    }

    /// Open `SETSLOT IMPORTING/MIGRATING` states reported by reachable nodes about themselves.
    pub fn open_slots(&self) -> Vec<OpenSlot> {
        let mut out = Vec::new();
        for (_, o) in self.reachable() {
            let Some(me) = o.myself() else { continue };
            for (slot, peer) in &me.importing {
                out.push(OpenSlot {
                    node_id: me.id.clone(),
                    slot: *slot,
                    peer_id: peer.clone(),
                    kind: TransferKind::Importing,
                });
            }
            for (slot, peer) in &me.migrating {
                out.push(OpenSlot {
                    node_id: me.id.clone(),
                    slot: *slot,
                    peer_id: peer.clone(),
                    kind: TransferKind::Migrating,
                });
            }
        }
        out
    }

    /// Atomic migration jobs still running on any reachable node (deduplicated by name).
    pub fn active_migrations(&self) -> Vec<&SlotMigration> {
        let mut seen = BTreeSet::new();
        self.reachable()
            .flat_map(|(_, o)| o.migrations.iter())
            .filter(|m| !m.state.is_finished() && seen.insert(m.name.as_str()))
            .collect()
    }

    /// Lowest server version among reachable nodes that reported one.
    pub fn min_version(&self) -> Option<Version> {
        self.reachable()
            .filter_map(|(_, o)| o.server.as_ref().map(|s| s.version))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::nodes::tests::NODES_3X1;

    const P1: &str = "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08";
    const P2: &str = "89e2f936388011977285e48761f38f4c321dde86";
    const P3: &str = "970e37735c7200f87f4dbcd084bcc611b8086a7b";
    const R1: &str = "9b6b8a0faaf78604011daaf4daa5e85df2955fd4";

    /// Rewrites the `myself` flag so the same real table is seen from node `id`.
    fn table_as(text: &str, id: &str) -> ClusterNodes {
        let mut t = ClusterNodes::parse(text).unwrap();
        for n in &mut t.nodes {
            n.flags.myself = n.id == id;
        }
        t
    }

    fn repl(text: &str) -> Option<ReplicationInfo> {
        Some(ReplicationInfo::parse(text).unwrap())
    }

    fn healthy() -> BTreeMap<String, Result<NodeObservation, String>> {
        [(P1, 17001), (P2, 17002), (P3, 17003), (R1, 17004)]
            .into_iter()
            .map(|(id, port)| {
                (
                    format!("127.0.0.1:{port}"),
                    Ok(NodeObservation::new(table_as(NODES_3X1, id))),
                )
            })
            .collect()
    }

    #[test]
    fn healthy_cluster() {
        let v = ClusterView::new(healthy());
        assert!(v.unassigned_slots().is_empty());
        assert_eq!(v.owner_of(0), Some(P1));
        assert_eq!(v.owner_of(5461), Some(P2));
        assert_eq!(v.owner_of(16383), Some(P3));
        let shards = v.shards();
        assert_eq!(shards.len(), 3);
        let s1 = shards.iter().find(|s| s.primary_id == P1).unwrap();
        assert_eq!(s1.slots.to_string(), "0-5460");
        assert_eq!(s1.replicas, vec![R1.to_owned()]);
        assert!(v.isolated_nodes().is_empty());
        assert!(v.failed_peers().is_empty());
        assert!(v.stale_addresses().is_empty());
        assert!(v.failover_quorum());
        assert!(v.open_slots().is_empty());
        assert_eq!(v.address_of(R1), Some("127.0.0.1:17004"));
        assert_eq!(v.id_at("127.0.0.1:17002"), Some(P2));
    }

    #[test]
    fn fresh_nodes_are_isolated_and_slots_unassigned() {
        let obs: BTreeMap<_, _> = (0..3)
            .map(|i| {
                let line = format!(
                    "{:040x} :{}@{} myself,master - 0 0 0 connected",
                    i + 1,
                    7000 + i,
                    17000 + i
                );
                (
                    format!("127.0.0.1:{}", 7000 + i),
                    Ok(NodeObservation::new(ClusterNodes::parse(&line).unwrap())),
                )
            })
            .collect();
        let v = ClusterView::new(obs);
        assert_eq!(v.isolated_nodes().len(), 3);
        assert!(v.unassigned_slots().is_full());
        assert!(!v.failover_quorum());
        // A fresh node joining a formed cluster is the only isolated one.
        let mut obs = healthy();
        obs.insert(
            "127.0.0.1:17005".into(),
            Ok(NodeObservation::new(
                ClusterNodes::parse("ab01 :17005@27005 myself,master - 0 0 0 connected").unwrap(),
            )),
        );
        let v = ClusterView::new(obs);
        assert_eq!(v.isolated_nodes(), vec!["127.0.0.1:17005".to_owned()]);
    }

    /// Real tables of Valkey 9.1.2 after the primary 17003 was killed (seen by 17001 and 17002).
    const AFTER_KILL_ON_17001: &str = "\
89e2f936388011977285e48761f38f4c321dde86 127.0.0.1:17002@27002 master - 0 1796207654561 3 connected 5461-10922
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 myself,master - 0 0 4 connected 0-999 3000-3499 3601-5460
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 slave 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 0 1796207653000 4 connected
970e37735c7200f87f4dbcd084bcc611b8086a7b 127.0.0.1:17003@27003 master,fail - 1796207636373 1796207628422 5 disconnected 1000-2999 3500-3600 10923-16383
";
    const AFTER_KILL_ON_17002: &str = "\
89e2f936388011977285e48761f38f4c321dde86 127.0.0.1:17002@27002 myself,master - 0 0 3 connected 5461-10922
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 slave,fail 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 1796207665730 1796207657583 4 disconnected
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 master - 0 1796207689800 4 connected 0-999 3000-3499 3601-5460
970e37735c7200f87f4dbcd084bcc611b8086a7b 127.0.0.1:17003@27003 master,fail - 1796207635570 1796207628000 5 disconnected 1000-2999 3500-3600 10923-16383
";

    #[test]
    fn failed_primary_is_seen_and_quorum_holds() {
        let mut obs = BTreeMap::new();
        obs.insert(
            "127.0.0.1:17001".to_owned(),
            Ok(NodeObservation::new(
                ClusterNodes::parse(AFTER_KILL_ON_17001).unwrap(),
            )),
        );
        obs.insert(
            "127.0.0.1:17002".to_owned(),
            Ok(NodeObservation::new(
                ClusterNodes::parse(AFTER_KILL_ON_17002).unwrap(),
            )),
        );
        obs.insert(
            "127.0.0.1:17003".to_owned(),
            Err("connection refused".to_owned()),
        );
        let v = ClusterView::new(obs);
        assert_eq!(v.failed_peers(), BTreeSet::from([P3.to_owned()]));
        // 17004 is flagged fail only by 17002: one of two observers, no majority.
        assert!(v.suspected_peers().contains(R1));
        // The dead primary still owns its slots (no replica took over).
        assert_eq!(v.owner_of(1000), Some(P3));
        assert!(v.unassigned_slots().is_empty());
        // 2 of 3 slot-owning primaries alive.
        assert!(v.failover_quorum());
        assert_eq!(
            v.unreachable().collect::<Vec<_>>(),
            vec![("127.0.0.1:17003", "connection refused")]
        );
        assert!(v.shards().iter().any(|s| s.primary_id == P3 && s.failed));
    }

    #[test]
    fn no_quorum_when_majority_of_primaries_down() {
        let mut obs = healthy();
        obs.insert("127.0.0.1:17002".into(), Err("timeout".into()));
        obs.insert("127.0.0.1:17003".into(), Err("timeout".into()));
        assert!(!ClusterView::new(obs).failover_quorum());
    }

    #[test]
    fn higher_epoch_claim_wins() {
        // Replica R1 took over P1's slots with epoch 6; P1's stale table still claims them at 1.
        let promoted = "\
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 myself,master - 0 0 6 connected 0-5460
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 master,fail - 0 0 1 disconnected
";
        let mut obs = healthy();
        obs.insert(
            "127.0.0.1:17004".into(),
            Ok(NodeObservation::new(ClusterNodes::parse(promoted).unwrap())),
        );
        let v = ClusterView::new(obs);
        assert_eq!(v.owner_of(0), Some(R1));
        assert_eq!(v.owner_of(5461), Some(P2));
    }

    #[test]
    fn stale_address_detected() {
        let mut obs = healthy();
        // P2 now answers at a new pod IP, others still know the old one.
        let o = obs.remove("127.0.0.1:17002").unwrap();
        obs.insert("127.0.0.2:17002".into(), o);
        let v = ClusterView::new(obs);
        let stale = v.stale_addresses();
        assert_eq!(stale.len(), 3);
        assert!(stale.iter().all(|s| s.node_id == P2
            && s.actual == "127.0.0.2:17002"
            && s.seen == "127.0.0.1:17002"));
    }

    const REPL_UP: &str = "role:slave\nmaster_host:127.0.0.1\nmaster_port:17001\nmaster_link_status:up\nmaster_sync_in_progress:0\nslave_repl_offset:{}\nmaster_repl_offset:{}\n";

    #[test]
    fn best_replica_choice() {
        let second = "\
9b6b8a0faaf78604011daaf4daa5e85df2955fd5 127.0.0.1:17005@27005 myself,slave 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 0 0 1 connected
";
        let mut obs = healthy();
        if let Some(Ok(o)) = obs.get_mut("127.0.0.1:17004") {
            o.replication = repl(&REPL_UP.replace("{}", "100"));
        }
        let mut o5 = NodeObservation::new(ClusterNodes::parse(second).unwrap());
        o5.replication = repl(&REPL_UP.replace("{}", "120").replace("up", "down"));
        obs.insert("127.0.0.1:17005".into(), Ok(o5));
        let v = ClusterView::new(obs);
        let best = v.best_synced_replica(P1).unwrap();
        assert_eq!(
            (best.node_id.as_str(), best.address.as_str(), best.offset),
            (R1, "127.0.0.1:17004", 100)
        );
        // With the primary dead, the link is down everywhere: highest offset wins.
        let any = v.most_caught_up_replica(P1).unwrap();
        assert_eq!(any.address, "127.0.0.1:17005");
        assert_eq!(v.best_synced_replica(P2), None);
    }

    #[test]
    fn active_migrations_deduplicated_across_source_and_target() {
        let jobs = |raw: &[u8]| {
            crate::model::migrations::parse_slot_migrations(&redis::parse_redis_value(raw).unwrap())
                .unwrap()
        };
        let mut obs = healthy();
        // Real replies of a running job, from its source and its target.
        if let Some(Ok(o)) = obs.get_mut("127.0.0.1:17001") {
            o.migrations = jobs(include_bytes!("testdata/mig_running3.bin"));
        }
        if let Some(Ok(o)) = obs.get_mut("127.0.0.1:17002") {
            o.migrations = jobs(include_bytes!("testdata/mig_running_target3.bin"));
        }
        let v = ClusterView::new(obs);
        let active = v.active_migrations();
        assert_eq!(active.len(), 1);
        assert_eq!(active[0].name, "610a0268aff75a7f83955ce80f66b6ea26473808");
    }

    #[test]
    fn min_version_over_reachable_nodes() {
        let mut obs = healthy();
        for (addr, v) in [("127.0.0.1:17001", "9.1.2"), ("127.0.0.1:17002", "8.0.1")] {
            if let Some(Ok(o)) = obs.get_mut(addr) {
                o.server = Some(
                    ServerInfo::parse(&format!("redis_version:7.2.4\nvalkey_version:{v}\n"))
                        .unwrap(),
                );
            }
        }
        let v = ClusterView::new(obs);
        assert_eq!(v.min_version(), Some(Version::new(8, 0, 1)));
        assert!(!v.min_version().unwrap().has_atomic_slot_migration());
    }

    #[test]
    fn open_slots_reported() {
        let migrating = "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 myself,master - 0 0 1 connected 100-5460 [100->-89e2f936388011977285e48761f38f4c321dde86]";
        let mut obs = healthy();
        obs.insert(
            "127.0.0.1:17001".into(),
            Ok(NodeObservation::new(
                ClusterNodes::parse(migrating).unwrap(),
            )),
        );
        let v = ClusterView::new(obs);
        assert_eq!(
            v.open_slots(),
            vec![OpenSlot {
                node_id: P1.into(),
                slot: 100,
                peer_id: P2.into(),
                kind: TransferKind::Migrating
            }]
        );
    }
}
