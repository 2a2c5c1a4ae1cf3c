//! Slot balance (pure): every shard of the layout owns 16384/N slots ±1 and the shards being
//! removed own none. One batch of the minimal-move plan per pass, each slot moved once,
//! straight to its final owner; the next pass plans again from the live view.

use std::collections::{BTreeMap, BTreeSet};

use valkey_ops::slot_plan::{Batching, RebalancePlan, plan_rebalance};
use valkey_ops::topology::{known_by, owned_slots};
use valkey_ops::{Layout, Member, SLOT_COUNT, SlotSet, Topology};

use crate::cluster::steps::{self, Step, Transfer};

/// How the message of a drain held back for lack of memory starts (Degraded, RebalanceFailed;
/// the `DrainFailed` event is published when it first appears).
pub const NOT_ENOUGH_MEMORY: &str = "not enough memory to drain";

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
    /// The shards being drained do not fit under the `maxmemory` of the primaries that stay:
    /// nothing moves, the cluster keeps serving as it is.
    NoRoom {
        /// Slots that would change owner.
        remaining: usize,
        /// What is missing and what to do (starts with [`NOT_ENOUGH_MEMORY`]).
        reason: String,
    },
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
    match plan_rebalance(
        &o.current,
        &o.targets,
        REBALANCE_BATCH_SLOTS,
        Batching::Concurrent,
    ) {
        Ok(plan) if plan.is_empty() => Balance::Balanced,
        Ok(plan) => match drain_room(&o, &plan) {
            Ok(()) => Balance::Moving {
                remaining: plan.moved_slots(),
                draining: o.draining().collect(),
            },
            Err(reason) => Balance::NoRoom {
                remaining: plan.moved_slots(),
                reason,
            },
        },
        Err(e) => Balance::Blocked(format!("cannot plan the slot balance: {e}")),
    }
}

impl Owners<'_> {
    /// Shards outside the layout that still own slots.
    fn draining(&self) -> impl Iterator<Item = i32> + '_ {
        self.current
            .iter()
            .filter(|(s, set)| !self.targets.contains(s) && !set.is_empty())
            .map(|(s, _)| *s)
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

/// Capacity preflight of a drain: every primary that stays must have room under `maxmemory`
/// for what the plan moves into it (each source's dataset shared out by slots), less what it
/// moves out. Not checked when a receiving primary has no limit (or does not report one): its
/// room is unknown.
fn drain_room(o: &Owners<'_>, plan: &RebalancePlan<i32>) -> Result<(), String> {
    let draining: Vec<i32> = o.draining().collect();
    if draining.is_empty() {
        return Ok(());
    }
    let memory = |shard: &i32| o.primary.get(shard).and_then(|m| m.view.as_ref()?.memory);
    let mut room: BTreeMap<i32, u64> = BTreeMap::new();
    for shard in &o.targets {
        let Some(r) = memory(shard).and_then(|m| m.headroom()) else {
            return Ok(());
        };
        room.insert(*shard, r);
    }
    // Bytes moved by a move of `slots` slots out of `source`, pro rata of its dataset.
    let share = |source: &i32, slots: usize| -> i128 {
        let owned = o.current.get(source).map_or(0, SlotSet::len);
        let data = memory(source).map_or(0, |m| m.dataset());
        if owned == 0 {
            0
        } else {
            i128::from(data) * i128::try_from(slots).unwrap_or(0)
                / i128::try_from(owned).unwrap_or(1)
        }
    };
    let mut net: BTreeMap<i32, i128> = BTreeMap::new();
    for m in plan.batches.iter().flatten() {
        let bytes = share(&m.source, m.slots.len());
        *net.entry(m.target).or_default() += bytes;
        *net.entry(m.source).or_default() -= bytes;
    }
    let short: Vec<(i32, u64, u64)> = room
        .iter()
        .filter_map(|(shard, free)| {
            let need = u64::try_from(net.get(shard).copied().unwrap_or(0)).unwrap_or(0);
            (need > *free).then_some((*shard, need, *free))
        })
        .collect();
    let Some((shard, need, free)) = short.first().copied() else {
        return Ok(());
    };
    let missing: u64 = short.iter().map(|(_, n, f)| n - f).sum();
    let held: u64 = draining
        .iter()
        .filter_map(memory)
        .map(|m| m.dataset())
        .sum();
    let names: Vec<String> = draining.iter().map(ToString::to_string).collect();
    Err(format!(
        "{NOT_ENOUGH_MEMORY} shard(s) {}: they hold {}; shard {shard} would receive {} but has {} free under maxmemory ({} missing over the {} shards that stay); raise maxmemory in spec.config or keep {} shards",
        crate::text::list("shards", &names),
        mib(held),
        mib(need),
        mib(free),
        mib(missing),
        o.targets.len(),
        o.targets.len() + draining.len()
    ))
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
    open.then(|| {
        Step::FinishOpenSlots(steps::FinishOpenSlots {
            primaries: o.primary.values().map(|m| m.addr).collect(),
        })
    })
}

/// Whether `primary`'s shard has all the replicas of the layout synced: only then does it
/// receive slots, so a write to a moved slot is as safe as before the move (a new shard's
/// replica attaches and syncs first).
fn complete(layout: Layout, topology: &Topology, primary: &Member) -> bool {
    let synced = topology
        .synced_replicas(primary)
        .filter(|r| layout.contains(r.shard, r.index))
        .count();
    synced >= usize::try_from(layout.replicas).unwrap_or(0)
}

/// The next batch of the minimal-move plan, when slots are not balanced, gossip has
/// converged between each source and its target (else the migration handshake is refused)
/// and the target's replicas are synced.
pub fn rebalance_step(layout: Layout, topology: &Topology) -> Option<Step> {
    if topology.owned_slots().len() < usize::from(SLOT_COUNT) {
        return None;
    }
    let o = owners(layout, topology).ok()?;
    let by_key = !atomic(&o.primary);
    // Key by key, a batch's moves have distinct sources and targets (each is its own loop of
    // MIGRATE calls). Atomic migration lets a target import from several sources at once and
    // a source export to several targets in one command: a shard added to 64 receives from
    // all 64 in one step, not in 64.
    let (batch_slots, batching) = if by_key {
        (KEY_MIGRATION_BATCH_SLOTS, Batching::Independent)
    } else {
        (REBALANCE_BATCH_SLOTS, Batching::Concurrent)
    };
    let plan = plan_rebalance(&o.current, &o.targets, batch_slots, batching).ok()?;
    drain_room(&o, &plan).ok()?;
    let moves = plan.batches.into_iter().next().unwrap_or_default();
    let transfers: Vec<Transfer> = moves
        .iter()
        .filter_map(|m| {
            let (src, tgt) = (o.primary.get(&m.source)?, o.primary.get(&m.target)?);
            let (sv, tv) = (src.view.as_ref()?, tgt.view.as_ref()?);
            let (sid, tid) = (src.id()?, tgt.id()?);
            // Both ends serve (`cluster_state:ok`: a node just joined reports `fail` for a
            // while and would answer CLUSTERDOWN for the slots it receives).
            let converged = known_by(&tv.nodes, sid).is_some()
                && known_by(&sv.nodes, tid).is_some()
                && owned_slots(&tv.nodes).len() == usize::from(SLOT_COUNT)
                && tv.cluster_ok
                && sv.cluster_ok;
            (converged && complete(layout, topology, tgt)).then(|| Transfer {
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
    (!transfers.is_empty()).then(|| {
        Step::MigrateSlots(steps::MigrateSlots {
            transfers,
            by_key,
            others: topology.reachable().map(|m| m.addr).collect(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::super::testworld::*;
    use super::*;

    fn d(shards: i32, replicas: i32) -> Layout {
        Layout { shards, replicas }
    }

    /// Four one-node shards (primaries 1, 3, 5, 7) owning `slots`, on Valkey 9.1.
    fn four_shards(slots: [&'static str; 4]) -> Topology {
        four_shards_on(slots, "9.1.0")
    }

    /// [`four_shards`] with every server on `version`.
    fn four_shards_on(slots: [&'static str; 4], version: &str) -> Topology {
        let mut n = vec![node(1, 0, 0), node(3, 1, 0), node(5, 2, 0), node(7, 3, 0)];
        for (node, s) in n.iter_mut().zip(slots) {
            node.slots = s;
        }
        let mut m = members(&world(&n, &[1, 3, 5, 7]));
        for m in &mut m {
            m.view.as_mut().expect("view").version = Some(version.parse().expect("version"));
        }
        Topology::new(m)
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
        let Some(Step::MigrateSlots(steps::MigrateSlots {
            transfers, by_key, ..
        })) = rebalance_step(d(3, 0), &m)
        else {
            panic!("expected migration, got {:?}", rebalance_step(d(3, 0), &m))
        };
        assert!(!by_key);
        // One step takes a full batch: 2731 slots from one source, the rest of the 4096 from
        // the other.
        let sources: Vec<_> = transfers.iter().map(|t| t.source).collect();
        assert_eq!(sources, [addr(1), addr(3)]);
        for t in &transfers {
            assert_eq!((t.target_id.as_str(), t.target_shard), (id(5).as_str(), 2));
        }
        assert_eq!(
            transfers.iter().map(Transfer::slot_count).sum::<usize>(),
            REBALANCE_BATCH_SLOTS
        );
        // The others know the new primary, but it does not know them yet: wait.
        let mut mm = members(&m);
        mm[2].view = members(&world(&n, &[])).remove(2).view;
        assert_eq!(rebalance_step(d(3, 0), &Topology::new(mm)), None);
    }

    #[test]
    fn a_shard_added_to_three_receives_from_all_of_them_in_one_step() {
        // Balanced 3 x 0 and an empty fourth shard: each source gives it about 1365 slots,
        // all in one step with atomic migration; key by key, one source per step.
        let m = four_shards(["0-5461", "5462-10922", "10923-16383", ""]);
        let Some(Step::MigrateSlots(steps::MigrateSlots {
            transfers, by_key, ..
        })) = rebalance_step(d(4, 0), &m)
        else {
            panic!("expected migration")
        };
        assert!(!by_key);
        let sources: BTreeSet<i32> = transfers.iter().map(|t| t.source_shard).collect();
        assert_eq!(sources, BTreeSet::from([0, 1, 2]));
        assert!(transfers.iter().all(|t| t.target_shard == 3));
        assert_eq!(
            transfers.iter().map(Transfer::slot_count).sum::<usize>(),
            4096
        );
        let m = four_shards_on(["0-5461", "5462-10922", "10923-16383", ""], "8.0.1");
        let Some(Step::MigrateSlots(steps::MigrateSlots {
            transfers, by_key, ..
        })) = rebalance_step(d(4, 0), &m)
        else {
            panic!("expected migration")
        };
        assert!(by_key);
        assert_eq!(transfers.len(), 1);
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
        let Some(Step::MigrateSlots(steps::MigrateSlots { transfers, .. })) =
            rebalance_step(d(4, 0), &m)
        else {
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
        let Some(Step::MigrateSlots(steps::MigrateSlots { transfers, .. })) =
            rebalance_step(d(3, 0), &m)
        else {
            panic!("expected a drain")
        };
        // One step drains it onto the three others at once (atomic migration).
        assert_eq!(transfers.len(), 3);
        assert!(transfers.iter().all(|t| t.source == addr(7)));
        let targets: BTreeSet<i32> = transfers.iter().map(|t| t.target_shard).collect();
        assert_eq!(targets, BTreeSet::from([0, 1, 2]));
        assert_eq!(
            transfers.iter().map(Transfer::slot_count).sum::<usize>(),
            4096
        );
        // Drained: balanced even though the shard's node is still a member.
        let m = four_shards(["0-5461", "5462-10922", "10923-16383", ""]);
        assert_eq!(balance(d(3, 0), &m), Balance::Balanced);
    }

    #[test]
    fn a_new_shard_receives_slots_only_once_its_replicas_are_synced() {
        // 3 x 1 -> 4 x 1: shard 3 is node 7 (index 0) and node 8 (index 1).
        let mut n = formed31();
        n.push(node(7, 3, 0));
        n.push(node(8, 3, 1));
        let all = [1, 2, 3, 4, 5, 6, 7, 8];
        // Node 8 is not attached yet: nothing moves.
        assert_eq!(rebalance_step(d(4, 1), &world(&n, &all)), None);
        // Attached but still in its first sync: nothing moves.
        n[7].primary_of = Some(7);
        let mut mm = members(&world(&n, &all));
        mm[7].view.as_mut().expect("view").sync_in_progress = true;
        assert_eq!(rebalance_step(d(4, 1), &Topology::new(mm)), None);
        // Synced, but node 7 still reports cluster_state:fail: nothing moves.
        let mut mm = members(&world(&n, &all));
        mm[6].view.as_mut().expect("view").cluster_ok = false;
        assert_eq!(rebalance_step(d(4, 1), &Topology::new(mm)), None);
        // Synced and serving: shard 3 receives slots.
        let Some(Step::MigrateSlots(steps::MigrateSlots { transfers, .. })) =
            rebalance_step(d(4, 1), &world(&n, &all))
        else {
            panic!("expected migration")
        };
        assert!(
            transfers
                .iter()
                .all(|t| t.target_shard == 3 && t.slot_count() > 0)
        );
    }

    #[test]
    fn a_drain_that_does_not_fit_under_maxmemory_does_not_start() {
        let t = four_shards(["0-4095", "4096-8191", "8192-12287", "12288-16383"]);
        let mb = |n: u64| n << 20;
        // Each node: 1 MiB empty, `data` MiB of dataset, `max` MiB maxmemory.
        let with_memory = |data: [u64; 4], max: u64| {
            let mut mm = members(&t);
            for (m, d) in mm.iter_mut().zip(data) {
                m.view.as_mut().expect("view").memory = Some(valkey_ops::model::MemoryInfo {
                    used_memory: mb(1 + d),
                    used_memory_startup: mb(1),
                    maxmemory: mb(max),
                    not_counted_for_evict: 0,
                });
            }
            Topology::new(mm)
        };
        // Shard 3 holds 30 MiB; the three others have 3 x (40 - 21) = 57 MiB free: it fits.
        let fits = with_memory([20, 20, 20, 30], 40);
        assert!(matches!(balance(d(3, 0), &fits), Balance::Moving { .. }));
        assert!(rebalance_step(d(3, 0), &fits).is_some());
        // With 34 MiB each, only 3 x 5 = 15 MiB is free: 15 MiB missing, nothing moves.
        let full = with_memory([34, 34, 34, 30], 40);
        let Balance::NoRoom { remaining, reason } = balance(d(3, 0), &full) else {
            panic!("expected no room")
        };
        assert_eq!(remaining, 4096);
        assert!(reason.starts_with(NOT_ENOUGH_MEMORY), "{reason}");
        assert!(
            reason.contains("shard(s) 3") && reason.contains("15.0 MiB missing"),
            "{reason}"
        );
        assert_eq!(rebalance_step(d(3, 0), &full), None);
        // Enough room in total (69 MiB), but shard 2 (1 MiB free) cannot take its third.
        let uneven = with_memory([5, 5, 38, 30], 40);
        let Balance::NoRoom { reason, .. } = balance(d(3, 0), &uneven) else {
            panic!("expected no room on shard 2")
        };
        assert!(
            reason.contains("shard 2 would receive 10.0 MiB but has 1.0 MiB free"),
            "{reason}"
        );
        assert_eq!(rebalance_step(d(3, 0), &uneven), None);
        // Without a limit the room is unknown: the drain goes ahead.
        let unlimited = with_memory([34, 34, 34, 30], 0);
        assert!(rebalance_step(d(3, 0), &unlimited).is_some());
        // A scale-out is never held back (only drains are checked).
        let t = four_shards(["0-5461", "5462-10922", "10923-16383", ""]);
        let mut mm = members(&t);
        for m in &mut mm {
            m.view.as_mut().expect("view").memory =
                full.members()[0].view.as_ref().expect("view").memory;
        }
        assert!(rebalance_step(d(4, 0), &Topology::new(mm)).is_some());
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
        let Some(Step::MigrateSlots(steps::MigrateSlots {
            transfers, by_key, ..
        })) = rebalance_step(d(2, 0), &m)
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
            Some(Step::FinishOpenSlots(steps::FinishOpenSlots {
                primaries: vec![addr(1), addr(3)]
            }))
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
