//! Which node each shard of a backup is read from (pure): from the live topology, one source
//! per primary owning slots, a synced replica when the shard has one.

use std::net::SocketAddr;

use valkey_ops::{Member, SlotRange, SlotSet, Topology};

/// Where one shard's snapshot is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSource {
    /// Slot ranges the shard owns (its primary's own view).
    pub slots: Vec<SlotRange>,
    /// Node id of the shard's primary.
    pub primary_id: String,
    /// The primary's address (a replica source is waited for until it has the primary's
    /// writes).
    pub primary_addr: SocketAddr,
    /// Pod of the node the snapshot is read from.
    pub pod: String,
    /// Its address.
    pub addr: SocketAddr,
    /// Its node id.
    pub node_id: String,
    /// Whether it is a replica (no fork on the primary) or the primary itself.
    pub from_replica: bool,
}

/// Why a backup cannot start yet (shown in its condition).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotYet {
    /// No node of the cluster answered.
    #[error("no node of the cluster could be reached")]
    Unreachable,
    /// Slots without a reachable primary.
    #[error(
        "{count} slots have no reachable primary (first: {first}); waiting until every slot has one"
    )]
    SlotsUncovered {
        /// How many.
        count: usize,
        /// The lowest.
        first: u16,
    },
    /// A slot migration is running: keys of a slot may be on two nodes.
    #[error("slot {slot} is migrating between shards; the backup starts once the migration ends")]
    Migrating {
        /// The slot.
        slot: u16,
    },
}

/// One source per slot-owning primary, ordered by lowest slot; an error while not every slot
/// has a reachable primary or a slot is migrating.
pub fn sources(topology: &Topology) -> Result<Vec<ShardSource>, NotYet> {
    if topology.reachable().next().is_none() {
        return Err(NotYet::Unreachable);
    }
    let mut covered = SlotSet::new();
    let mut out = Vec::new();
    for primary in topology.members().iter().filter(|m| m.owns_slots()) {
        let Some(me) = primary.me() else { continue };
        if let Some((slot, _)) = me.migrating.first().or(me.importing.first()) {
            return Err(NotYet::Migrating { slot: *slot });
        }
        let source: &Member = topology.best_synced_replica(primary).unwrap_or(primary);
        let mut slots = me.slots.clone();
        slots.sort_by_key(|r| r.start);
        slots.iter().for_each(|r| covered.insert_range(*r));
        out.push(ShardSource {
            slots,
            primary_id: me.id.clone(),
            primary_addr: primary.addr,
            pod: source.pod.clone(),
            addr: source.addr,
            node_id: source.id().unwrap_or_default().to_owned(),
            from_replica: source.addr != primary.addr,
        });
    }
    let missing = SlotSet::full().difference(&covered);
    if let Some(first) = missing.iter().next() {
        return Err(NotYet::SlotsUncovered {
            count: missing.len(),
            first,
        });
    }
    out.sort_by_key(|s| s.slots.first().map(|r| r.start));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::plan::testworld::*;

    #[test]
    fn each_shard_is_read_from_its_synced_replica() {
        let t = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        let got = sources(&t).unwrap();
        let picked: Vec<_> = got.iter().map(|s| (s.addr, s.from_replica)).collect();
        assert_eq!(
            picked,
            vec![(addr(2), true), (addr(4), true), (addr(6), true)]
        );
        assert_eq!(got[1].slots, vec![SlotRange::new(5461, 10922).unwrap()]);
        assert_eq!(got[1].primary_id, id(3));
        assert_eq!(got[1].node_id, id(4));
    }

    #[test]
    fn a_shard_without_a_synced_replica_is_read_from_its_primary() {
        let mut nodes = formed31();
        nodes[3].fail = true; // shard 1's replica is gone
        let t = world(&nodes, &[1, 2, 3, 4, 5, 6]);
        let got = sources(&t).unwrap();
        assert_eq!((got[1].addr, got[1].from_replica), (addr(3), false));
        assert_eq!(got[1].pod, "pod-1-0");
    }

    #[test]
    fn uncovered_slots_wait() {
        let mut nodes = formed31();
        nodes[2].fail = true; // shard 1's primary is gone, its replica not promoted yet
        let t = world(&nodes, &[1, 2, 3, 4, 5, 6]);
        assert_eq!(
            sources(&t),
            Err(NotYet::SlotsUncovered {
                count: 5462,
                first: 5461
            })
        );
    }

    #[test]
    fn nothing_reachable_waits() {
        let t = Topology::new(vec![unreachable(1, 0, 0, true)]);
        assert_eq!(sources(&t), Err(NotYet::Unreachable));
    }
}
