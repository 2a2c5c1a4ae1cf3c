//! Slot balance (pure): every shard of the layout owns 16384/N slots ±1 and the shards being
//! removed own none. One batch of the minimal-move plan per pass, each slot moved once,
//! straight to its final owner; the next pass plans again from the live view.

use std::collections::{BTreeMap, BTreeSet};

use valkey_ops::plan::plan_rebalance;
use valkey_ops::topology::{known_by, owned_slots};
use valkey_ops::{Layout, Member, SLOT_COUNT, SlotSet, Topology};

use super::{Step, Transfer};

/// Slots moved per batch with atomic slot migration (Valkey 9).
pub const REBALANCE_BATCH_SLOTS: usize = 4096;

/// Slots moved per batch key by key (Valkey 8): smaller, so one pass stays short.
pub const KEY_MIGRATION_BATCH_SLOTS: usize = 1024;

/// How far the slots are from the balance of the layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Balance {
    /// Every shard of the layout owns its quota; shards being removed own nothing.
    Balanced,
    /// Slots still have to move.
    Moving {
        /// Slots that still change owner.
        remaining: usize,
        /// Shards outside the layout that still own slots (being drained).
        draining: Vec<i32>,
    },
    /// No plan can be made yet (a shard without a reachable primary, slots not all owned, a
    /// primary at a node-index being removed): the reason.
    Blocked(String),
}

impl Balance {
    /// Whether slots still have to move (or cannot be planned yet).
    pub fn is_pending(&self) -> bool {
        !matches!(self, Self::Balanced)
    }
}

/// The slot owners to balance: the writer of every shard of the layout and of every shard
/// outside it that owns slots.
struct Owners<'a> {
    current: BTreeMap<i32, SlotSet>,
    primary: BTreeMap<i32, &'a Member>,
    targets: BTreeSet<i32>,
}

fn owners(layout: Layout, topology: &Topology) -> Result<Owners<'_>, String> {
    let mut o = Owners {
        current: BTreeMap::new(),
        primary: BTreeMap::new(),
        targets: (0..layout.shards).collect(),
    };
    for shard in 0..layout.shards {
        let p = topology
            .primary(shard)
            .ok_or_else(|| format!("shard {shard} has no reachable primary"))?;
        if p.index > layout.replicas {
            return Err(format!(
                "shard {shard}'s primary is at node-index {}, which is being removed",
                p.index
            ));
        }
        o.current
            .insert(shard, p.me().map(|m| m.slot_set()).unwrap_or_default());
        o.primary.insert(shard, p);
    }
    let outside: BTreeSet<i32> = topology
        .members()
        .iter()
        .map(|m| m.shard)
        .filter(|s| *s >= layout.shards)
        .collect();
    for shard in outside {
        if let Some(w) = topology.writer(shard) {
            o.current
                .insert(shard, w.me().map(|m| m.slot_set()).unwrap_or_default());
            o.primary.insert(shard, w);
        }
    }
    Ok(o)
}

/// How far the slots of `topology` (every member, inside and outside the layout) are from
/// the balance of `layout`.
pub fn balance(layout: Layout, topology: &Topology) -> Balance {
    if topology.owned_slots().len() < usize::from(SLOT_COUNT) {
        return Balance::Blocked("not every slot has an owner yet".into());
    }
    let o = match owners(layout, topology) {
        Ok(o) => o,
        Err(e) => return Balance::Blocked(e),
    };
    match plan_rebalance(&o.current, &o.targets, REBALANCE_BATCH_SLOTS) {
        Ok(plan) if plan.is_empty() => Balance::Balanced,
        Ok(plan) => Balance::Moving {
            remaining: plan.moved_slots(),
            draining: o
                .current
                .iter()
                .filter(|(s, set)| !o.targets.contains(s) && !set.is_empty())
                .map(|(s, _)| *s)
                .collect(),
        },
        Err(e) => Balance::Blocked(format!("cannot plan the slot balance: {e}")),
    }
}

/// Whether every primary involved speaks atomic slot migration.
fn atomic(primaries: &BTreeMap<i32, &Member>) -> bool {
    primaries.values().all(|m| {
        m.view
            .as_ref()
            .and_then(|v| v.version)
            .is_some_and(|v| v.has_atomic_slot_migration())
    })
}

/// Slots left half-migrated by an interrupted key-by-key migration, on any primary: finish
/// them before planning anything else.
pub fn open_slots_step(layout: Layout, topology: &Topology) -> Option<Step> {
    let o = owners(layout, topology).ok()?;
    let open = o.primary.values().any(|m| {
        m.me()
            .is_some_and(|me| !me.migrating.is_empty() || !me.importing.is_empty())
    });
    open.then(|| Step::FinishOpenSlots {
        primaries: o.primary.values().map(|m| m.addr).collect(),
    })
}

/// The next batch of the minimal-move plan, when slots are not balanced and gossip has
/// converged between each source and its target (else the migration handshake is refused).
pub fn rebalance_step(layout: Layout, topology: &Topology) -> Option<Step> {
    if topology.owned_slots().len() < usize::from(SLOT_COUNT) {
        return None;
    }
    let o = owners(layout, topology).ok()?;
    let by_key = !atomic(&o.primary);
    let batch_slots = if by_key {
        KEY_MIGRATION_BATCH_SLOTS
    } else {
        REBALANCE_BATCH_SLOTS
    };
    let plan = plan_rebalance(&o.current, &o.targets, batch_slots).ok()?;
    let batch = plan.batches.into_iter().next()?;
    let transfers: Vec<Transfer> = batch
        .iter()
        .filter_map(|m| {
            let (src, tgt) = (o.primary.get(&m.source)?, o.primary.get(&m.target)?);
            let (sv, tv) = (src.view.as_ref()?, tgt.view.as_ref()?);
            let (sid, tid) = (src.id()?, tgt.id()?);
            let converged = known_by(&tv.nodes, sid).is_some()
                && known_by(&sv.nodes, tid).is_some()
                && owned_slots(&tv.nodes).len() == usize::from(SLOT_COUNT);
            converged.then(|| Transfer {
                source: src.addr,
                source_shard: m.source,
                target: tgt.addr,
                target_id: tid.to_owned(),
                target_shard: m.target,
                ranges: m.ranges(),
                draining: !o.targets.contains(&m.source),
            })
        })
        .collect();
    (!transfers.is_empty()).then(|| Step::MigrateSlots {
        transfers,
        by_key,
        others: topology.reachable().map(|m| m.addr).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::testworld::*;
    use super::*;

    fn d(shards: i32, replicas: i32) -> Layout {
        Layout { shards, replicas }
    }

    /// Four one-node shards (primaries 1, 3, 5, 7) owning `slots`.
    fn four_shards(slots: [&'static str; 4]) -> Topology {
        let mut n = vec![node(1, 0, 0), node(3, 1, 0), node(5, 2, 0), node(7, 3, 0)];
        for (node, s) in n.iter_mut().zip(slots) {
            node.slots = s;
        }
        world(&n, &[1, 3, 5, 7])
    }

    fn counts(t: &Topology, shards: i32) -> Vec<usize> {
        (0..shards)
            .map(|s| t.writer(s).map_or(0, Member::owns_slots_count))
            .collect()
    }

    trait Count {
        fn owns_slots_count(&self) -> usize;
    }
    impl Count for Member {
        fn owns_slots_count(&self) -> usize {
            self.me().map_or(0, |m| m.slot_count())
        }
    }

    #[test]
    fn new_shard_gets_slots_by_migration() {
        // 2 shards owning everything, a third (scale-out) joined with no slots.
        let mut n = vec![node(1, 0, 0), node(3, 1, 0), node(5, 2, 0)];
        n[0].slots = "0-8191";
        n[1].slots = "8192-16383";
        let m = world(&n, &[1, 3, 5]);
        assert_eq!(
            balance(d(3, 0), &m),
            Balance::Moving {
                remaining: 5461,
                draining: vec![]
            }
        );
        let Some(Step::MigrateSlots {
            transfers, by_key, ..
        }) = rebalance_step(d(3, 0), &m)
        else {
            panic!("expected migration, got {:?}", rebalance_step(d(3, 0), &m))
        };
        assert!(!by_key);
        assert_eq!(transfers.len(), 1);
        let t = &transfers[0];
        assert!(t.source == addr(1) || t.source == addr(3));
        assert_eq!((t.target_id.as_str(), t.target_shard), (id(5).as_str(), 2));
        assert!(t.slot_count() > 0 && t.slot_count() <= REBALANCE_BATCH_SLOTS);
        // The others know the new primary, but it does not know them yet: wait.
        let mut mm = members(&m);
        mm[2].view = members(&world(&n, &[])).remove(2).view;
        assert_eq!(rebalance_step(d(3, 0), &Topology::new(mm)), None);
    }

    #[test]
    fn an_uneven_cluster_keeps_moving_until_balanced() {
        // After a first batch of a 3 -> 4 scale-out: 5462 / 5461 / 4096 / 1365.
        let m = four_shards(["0-5461", "5462-10922", "10923-15018", "15019-16383"]);
        assert_eq!(counts(&m, 4), [5462, 5461, 4096, 1365]);
        let Balance::Moving { remaining, .. } = balance(d(4, 0), &m) else {
            panic!("not balanced yet")
        };
        assert_eq!(remaining, 2731);
        let Some(Step::MigrateSlots { transfers, .. }) = rebalance_step(d(4, 0), &m) else {
            panic!("expected migration")
        };
        assert!(transfers.iter().all(|t| t.target_shard == 3));
        // Balanced: 4096 each.
        let m = four_shards(["0-4095", "4096-8191", "8192-12287", "12288-16383"]);
        assert_eq!(balance(d(4, 0), &m), Balance::Balanced);
        assert_eq!(rebalance_step(d(4, 0), &m), None);
    }

    #[test]
    fn scale_in_drains_the_removed_shard_onto_the_others() {
        let m = four_shards(["0-4095", "4096-8191", "8192-12287", "12288-16383"]);
        assert_eq!(
            balance(d(3, 0), &m),
            Balance::Moving {
                remaining: 4096,
                draining: vec![3]
            }
        );
        let Some(Step::MigrateSlots { transfers, .. }) = rebalance_step(d(3, 0), &m) else {
            panic!("expected a drain")
        };
        assert_eq!(transfers.len(), 1);
        assert_eq!(transfers[0].source, addr(7));
        // Drained: balanced even though the shard's node is still a member.
        let m = four_shards(["0-5461", "5462-10922", "10923-16383", ""]);
        assert_eq!(balance(d(3, 0), &m), Balance::Balanced);
    }

    #[test]
    fn valkey_8_moves_key_by_key_in_smaller_batches_and_finishes_open_slots_first() {
        let mut n = vec![node(1, 0, 0), node(3, 1, 0)];
        n[0].slots = "0-16383";
        let mut mm = members(&world(&n, &[1, 3]));
        for m in &mut mm {
            m.view.as_mut().expect("view").version = Some("8.0.1".parse().expect("version"));
        }
        let m = Topology::new(mm.clone());
        let Some(Step::MigrateSlots {
            transfers, by_key, ..
        }) = rebalance_step(d(2, 0), &m)
        else {
            panic!("expected migration")
        };
        assert!(by_key);
        assert_eq!(transfers[0].slot_count(), KEY_MIGRATION_BATCH_SLOTS);
        assert_eq!(open_slots_step(d(2, 0), &m), None);
        let me = mm[0].view.as_mut().expect("view");
        let id3 = id(3);
        me.nodes
            .nodes
            .iter_mut()
            .find(|x| x.flags.myself)
            .expect("myself")
            .migrating
            .push((16383, id3));
        assert_eq!(
            open_slots_step(d(2, 0), &Topology::new(mm)),
            Some(Step::FinishOpenSlots {
                primaries: vec![addr(1), addr(3)]
            })
        );
    }

    #[test]
    fn a_primary_at_a_removed_node_index_blocks_the_balance() {
        // replicas 1 -> 0 after a failover: the primary sits at node-index 1.
        let mut n = vec![node(1, 0, 0), node(2, 0, 1)];
        n[1].slots = "0-16383";
        n[0].primary_of = Some(2);
        let m = world(&n, &[1, 2]);
        assert!(matches!(balance(d(1, 0), &m), Balance::Blocked(_)));
        assert_eq!(rebalance_step(d(1, 0), &m), None);
    }
}
