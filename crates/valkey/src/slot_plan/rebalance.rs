//! Rebalancing slots to a target set of shards with the fewest slot moves.
//!
//! Every target shard gets a quota of `16384 / n` or one more; the `16384 % n` larger quotas
//! go to the shards that already own the most slots (ties by key), which minimises the number
//! of slots that change owner. A shard then either keeps all its slots and receives the missing
//! ones, or keeps its quota and gives the rest away — never both — so every slot moves at most
//! once, directly from its current owner to its final owner (a drained shard's quota is 0).
//! A source gives the highest slots it owns, so the slots it keeps stay contiguous.
//!
//! The moves are cut into batches of at most `max_slots_per_batch` slots, in one of two ways
//! ([`Batching`]): with at most one move per source shard and per target shard (key-by-key
//! migration, where each move is its own loop of `MIGRATE` calls), or in plan order with any
//! number of moves per shard (atomic slot migration, where one target imports from several
//! sources at once and one source exports to several targets).

use std::collections::{BTreeMap, BTreeSet};

use super::plan_error::PlanError;
use crate::slots::{SLOT_COUNT, SlotRange, SlotSet};

/// Slots to move from one shard to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMove<K> {
    /// Shard currently owning the slots.
    pub source: K,
    /// Shard that will own them.
    pub target: K,
    /// The slots.
    pub slots: SlotSet,
}

impl<K> SlotMove<K> {
    /// The slots as maximal ranges (for `CLUSTER MIGRATESLOTS SLOTSRANGE`).
    pub fn ranges(&self) -> Vec<SlotRange> {
        self.slots.ranges().collect()
    }
}

/// How [`plan_rebalance`] cuts its moves into batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    /// At most one move per source and per target in a batch: the moves of a batch are
    /// independent (key-by-key `MIGRATE`, one slot at a time per pair).
    Independent,
    /// The moves in plan order, any number per source and target (atomic slot migration,
    /// Valkey 9.0+): a shard added to 64 receives from all 64 in one batch.
    Concurrent,
}

/// Result of [`plan_rebalance`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebalancePlan<K> {
    /// Final number of slots of every target shard.
    pub quotas: BTreeMap<K, usize>,
    /// Whole moves, one per (source, target) pair.
    pub moves: Vec<SlotMove<K>>,
    /// The same slots cut into batches (see [`Batching`]), to run in order.
    pub batches: Vec<Vec<SlotMove<K>>>,
}

impl<K> RebalancePlan<K> {
    /// Whether nothing has to move.
    pub fn is_empty(&self) -> bool {
        self.moves.is_empty()
    }

    /// Total number of slots that change owner.
    pub fn moved_slots(&self) -> usize {
        self.moves.iter().map(|m| m.slots.len()).sum()
    }
}

/// Checks that `current` is a partition of all 16384 slots.
pub fn check_partition<'a, K: 'a>(
    current: impl IntoIterator<Item = (&'a K, &'a SlotSet)>,
) -> Result<(), PlanError> {
    let mut seen = SlotSet::new();
    for (_, set) in current {
        if let Some(slot) = seen.intersection(set).iter().next() {
            return Err(PlanError::OverlappingOwnership(slot));
        }
        seen = seen.union(set);
    }
    if !seen.is_full() {
        return Err(PlanError::UnassignedSlots(
            usize::from(SLOT_COUNT) - seen.len(),
        ));
    }
    Ok(())
}

/// Quotas for `targets` that minimise the slots to move from `current`.
pub fn quotas<K: Ord + Clone>(
    current: &BTreeMap<K, SlotSet>,
    targets: &BTreeSet<K>,
) -> Result<BTreeMap<K, usize>, PlanError> {
    let n = targets.len();
    let total = usize::from(SLOT_COUNT);
    if n == 0 {
        return Err(PlanError::NoShards);
    }
    if n > total {
        return Err(PlanError::TooManyShards(n));
    }
    let (q, r) = (total / n, total % n);
    let count = |k: &K| current.get(k).map_or(0, SlotSet::len);
    let mut order: Vec<&K> = targets.iter().collect();
    order.sort_by(|a, b| count(b).cmp(&count(a)).then_with(|| a.cmp(b)));
    Ok(order
        .into_iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), if i < r { q + 1 } else { q }))
        .collect())
}

/// The fewest slots that must change owner to balance `current` over `targets`.
pub fn minimum_moves<K: Ord + Clone>(
    current: &BTreeMap<K, SlotSet>,
    targets: &BTreeSet<K>,
) -> Result<usize, PlanError> {
    let quotas = quotas(current, targets)?;
    Ok(quotas
        .iter()
        .map(|(k, q)| q.saturating_sub(current.get(k).map_or(0, SlotSet::len)))
        .sum())
}

/// Plans the moves that balance the slots of `current` (a partition of all slots by shard key)
/// over the shards `targets` (±1), with the fewest moved slots, in batches of at most
/// `max_slots_per_batch` slots cut as `batching` says; see the module docs.
pub fn plan_rebalance<K: Ord + Clone>(
    current: &BTreeMap<K, SlotSet>,
    targets: &BTreeSet<K>,
    max_slots_per_batch: usize,
    batching: Batching,
) -> Result<RebalancePlan<K>, PlanError> {
    if max_slots_per_batch == 0 {
        return Err(PlanError::ZeroBatchSize);
    }
    check_partition(current)?;
    let quotas = quotas(current, targets)?;
    let quota = |k: &K| quotas.get(k).copied().unwrap_or(0);

    // What each source gives away (its highest slots) and what each target still needs.
    let gives: Vec<(K, SlotSet)> = current
        .iter()
        .filter(|(k, set)| set.len() > quota(k))
        .map(|(k, set)| (k.clone(), set.highest(set.len() - quota(k))))
        .collect();
    let mut needs: Vec<(K, usize)> = quotas
        .iter()
        .map(|(k, q)| {
            (
                k.clone(),
                q.saturating_sub(current.get(k).map_or(0, SlotSet::len)),
            )
        })
        .filter(|(_, need)| *need > 0)
        .collect();

    let mut moves = Vec::new();
    let mut next_target = 0;
    for (source, mut give) in gives {
        while !give.is_empty() && next_target < needs.len() {
            let (target, need) = &mut needs[next_target];
            let chunk = give.lowest(*need);
            *need -= chunk.len();
            give = give.difference(&chunk);
            moves.push(SlotMove {
                source: source.clone(),
                target: target.clone(),
                slots: chunk,
            });
            if *need == 0 {
                next_target += 1;
            }
        }
    }

    let batches = match batching {
        Batching::Independent => batch_moves(&moves, max_slots_per_batch),
        Batching::Concurrent => concurrent_batches(&moves, max_slots_per_batch),
    };
    Ok(RebalancePlan {
        quotas,
        moves,
        batches,
    })
}

/// Cuts `moves` into batches of at most `max_slots` slots with at most one move per source and
/// per target each, keeping the order of `moves`.
pub fn batch_moves<K: Ord + Clone>(
    moves: &[SlotMove<K>],
    max_slots: usize,
) -> Vec<Vec<SlotMove<K>>> {
    let max_slots = max_slots.max(1);
    let mut pending: Vec<SlotMove<K>> = moves
        .iter()
        .filter(|m| !m.slots.is_empty())
        .cloned()
        .collect();
    let mut batches = Vec::new();
    while !pending.is_empty() {
        let mut batch = Vec::new();
        let mut sources = BTreeSet::new();
        let mut targets = BTreeSet::new();
        let mut budget = max_slots;
        for m in pending.iter_mut() {
            if budget == 0 {
                break;
            }
            if sources.contains(&m.source) || targets.contains(&m.target) {
                continue;
            }
            let chunk = m.slots.lowest(budget);
            budget -= chunk.len();
            m.slots = m.slots.difference(&chunk);
            sources.insert(m.source.clone());
            targets.insert(m.target.clone());
            batch.push(SlotMove {
                source: m.source.clone(),
                target: m.target.clone(),
                slots: chunk,
            });
        }
        pending.retain(|m| !m.slots.is_empty());
        batches.push(batch);
    }
    batches
}

/// Cuts `moves`, in order, into batches of exactly `max_slots` slots (the last one fewer),
/// splitting a move across two batches where it does not fit (its lowest slots first).
pub fn concurrent_batches<K: Clone>(
    moves: &[SlotMove<K>],
    max_slots: usize,
) -> Vec<Vec<SlotMove<K>>> {
    let max_slots = max_slots.max(1);
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut budget = max_slots;
    for m in moves {
        let mut rest = m.slots.clone();
        while !rest.is_empty() {
            let chunk = rest.lowest(budget);
            budget -= chunk.len();
            rest = rest.difference(&chunk);
            batch.push(SlotMove {
                source: m.source.clone(),
                target: m.target.clone(),
                slots: chunk,
            });
            if budget == 0 {
                batches.push(std::mem::take(&mut batch));
                budget = max_slots;
            }
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slot_plan::initial::initial_assignment;
    use proptest::prelude::*;

    /// Batching of the example tests.
    const B: Batching = Batching::Independent;

    fn from_ranges(ranges: &[SlotRange]) -> BTreeMap<u8, SlotSet> {
        ranges
            .iter()
            .enumerate()
            .map(|(i, r)| (i as u8, SlotSet::from_ranges([r])))
            .collect()
    }

    /// Applies one batch, checking each source owns what it gives.
    fn apply(owner: &mut BTreeMap<u8, SlotSet>, batch: &[SlotMove<u8>]) {
        for m in batch {
            let src = owner.entry(m.source).or_default();
            assert_eq!(
                src.intersection(&m.slots),
                m.slots,
                "source does not own the slots"
            );
            *src = src.difference(&m.slots);
            let tgt = owner.entry(m.target).or_default();
            *tgt = tgt.union(&m.slots);
        }
    }

    fn targets(keys: &[u8]) -> BTreeSet<u8> {
        keys.iter().copied().collect()
    }

    #[test]
    fn scale_out_3_to_4() {
        let cur = from_ranges(&initial_assignment(3).unwrap());
        let plan = plan_rebalance(&cur, &targets(&[0, 1, 2, 3]), 16384, B).unwrap();
        assert_eq!(plan.moved_slots(), 4096);
        assert!(plan.quotas.values().all(|q| *q == 4096));
        // Each old shard gives its highest slots to the new shard 3, so it keeps one range.
        let ranges: Vec<(u8, u8, String)> = plan
            .moves
            .iter()
            .map(|m| (m.source, m.target, m.slots.to_string()))
            .collect();
        assert_eq!(
            ranges,
            vec![
                (0, 3, "4096-5460".to_owned()),
                (1, 3, "9557-10922".to_owned()),
                (2, 3, "15019-16383".to_owned())
            ]
        );
        // One target: the three moves cannot run together.
        assert_eq!(plan.batches.len(), 3);
        let mut owner = cur.clone();
        for b in &plan.batches {
            apply(&mut owner, b);
        }
        assert_eq!(owner[&0].to_string(), "0-4095");
        assert_eq!(owner[&3].len(), 4096);
    }

    #[test]
    fn scale_in_4_to_3_sends_drained_slots_straight_to_final_owners() {
        let cur = from_ranges(&initial_assignment(4).unwrap());
        let plan = plan_rebalance(&cur, &targets(&[0, 1, 2]), 100_000, B).unwrap();
        assert_eq!(plan.moved_slots(), 4096);
        assert!(plan.moves.iter().all(|m| m.source == 3));
        assert_eq!(
            plan.quotas,
            BTreeMap::from([(0, 5462), (1, 5461), (2, 5461)])
        );
        let mut owner = cur.clone();
        for b in &plan.batches {
            apply(&mut owner, b);
        }
        assert!(owner[&3].is_empty());
    }

    #[test]
    fn balanced_cluster_needs_nothing() {
        let cur = from_ranges(&initial_assignment(5).unwrap());
        let plan = plan_rebalance(&cur, &targets(&[0, 1, 2, 3, 4]), 10, B).unwrap();
        assert!(plan.is_empty());
        assert!(plan.batches.is_empty());
    }

    #[test]
    fn batches_are_bounded_and_independent() {
        let cur = from_ranges(&initial_assignment(2).unwrap());
        let plan = plan_rebalance(&cur, &targets(&[0, 1, 2, 3, 4, 5]), 1000, B).unwrap();
        for b in &plan.batches {
            assert!(b.iter().map(|m| m.slots.len()).sum::<usize>() <= 1000);
        }
        // Two sources, four new targets: some batch runs two moves in parallel.
        assert!(plan.batches.iter().any(|b| b.len() == 2));
    }

    #[test]
    fn concurrent_batches_take_every_source_at_once() {
        let cur = from_ranges(&initial_assignment(64).unwrap());
        let plan = plan_rebalance(&cur, &(0..65).collect(), 4096, Batching::Concurrent).unwrap();
        assert_eq!(plan.batches.len(), 1);
        let sources: BTreeSet<u8> = plan.batches[0].iter().map(|m| m.source).collect();
        assert_eq!(sources.len(), 64);
        assert!(plan.batches[0].iter().all(|m| m.target == 64));
    }

    #[test]
    fn concurrent_batches_split_a_move_that_does_not_fit() {
        let cur = from_ranges(&initial_assignment(2).unwrap());
        let plan =
            plan_rebalance(&cur, &targets(&[0, 1, 2, 3]), 3000, Batching::Concurrent).unwrap();
        let sizes: Vec<Vec<usize>> = plan
            .batches
            .iter()
            .map(|b| b.iter().map(|m| m.slots.len()).collect())
            .collect();
        assert_eq!(sizes, [vec![3000], vec![1096, 1904], vec![2192]]);
    }

    #[test]
    fn rejects_bad_inputs() {
        let cur = from_ranges(&initial_assignment(2).unwrap());
        assert_eq!(
            plan_rebalance(&cur, &targets(&[]), 10, B),
            Err(PlanError::NoShards)
        );
        assert_eq!(
            plan_rebalance(&cur, &targets(&[0]), 0, B),
            Err(PlanError::ZeroBatchSize)
        );
        let mut overlap = cur.clone();
        overlap.get_mut(&1).unwrap().insert(0);
        assert_eq!(
            plan_rebalance(&overlap, &targets(&[0]), 10, B),
            Err(PlanError::OverlappingOwnership(0))
        );
        let mut missing = cur.clone();
        missing.get_mut(&1).unwrap().remove(16383);
        assert_eq!(
            plan_rebalance(&missing, &targets(&[0]), 10, B),
            Err(PlanError::UnassignedSlots(1))
        );
    }

    /// Brute force over every choice of which targets get the larger quota.
    fn brute_force_minimum(cur: &BTreeMap<u8, SlotSet>, tgt: &BTreeSet<u8>) -> usize {
        let n = tgt.len();
        let (q, r) = (16384 / n, 16384 % n);
        let keys: Vec<u8> = tgt.iter().copied().collect();
        let mut best = usize::MAX;
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != r {
                continue;
            }
            let moved: usize = keys
                .iter()
                .enumerate()
                .map(|(i, k)| {
                    let quota = if mask & (1 << i) != 0 { q + 1 } else { q };
                    quota.saturating_sub(cur.get(k).map_or(0, SlotSet::len))
                })
                .sum();
            best = best.min(moved);
        }
        best
    }

    /// A random partition of all slots over shards `0..shards` (some possibly empty).
    fn ownership() -> impl Strategy<Value = BTreeMap<u8, SlotSet>> {
        (
            1u8..8,
            proptest::collection::vec((1u16..16384, 0u8..8), 0..40),
        )
            .prop_map(|(shards, cuts)| {
                let mut points: Vec<(u16, u8)> =
                    cuts.into_iter().map(|(c, o)| (c, o % shards)).collect();
                points.sort();
                let mut owner: BTreeMap<u8, SlotSet> =
                    (0..shards).map(|k| (k, SlotSet::new())).collect();
                let mut start = 0u16;
                let mut who = 0u8;
                for (cut, next) in points {
                    if cut > start {
                        owner
                            .get_mut(&who)
                            .unwrap()
                            .insert_range(SlotRange::new(start, cut - 1).unwrap());
                        start = cut;
                    }
                    who = next;
                }
                owner
                    .get_mut(&who)
                    .unwrap()
                    .insert_range(SlotRange::new(start, 16383).unwrap());
                owner
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn rebalance_properties(
            cur in ownership(),
            keep in proptest::collection::vec(any::<bool>(), 8),
            new_shards in 0u8..4,
            max_batch in prop_oneof![1usize..50, 50usize..5000, Just(16384usize)],
            concurrent in any::<bool>(),
        ) {
            let mut tgt: BTreeSet<u8> = cur.keys().copied().filter(|k| keep[usize::from(*k)]).collect();
            tgt.extend((0..new_shards).map(|i| 100 + i));
            prop_assume!(!tgt.is_empty());
            let batching = if concurrent { Batching::Concurrent } else { Batching::Independent };
            let plan = plan_rebalance(&cur, &tgt, max_batch, batching).unwrap();

            // fewest moves: equals the brute-force optimum over quota choices
            prop_assert_eq!(plan.moved_slots(), brute_force_minimum(&cur, &tgt));
            prop_assert_eq!(plan.moved_slots(), minimum_moves(&cur, &tgt).unwrap());

            // batches hold exactly the moves' slots; each slot moves at most once
            let mut moved = SlotSet::new();
            let mut batched = 0;
            let mut owner = cur.clone();
            for (i, b) in plan.batches.iter().enumerate() {
                prop_assert!(!b.is_empty());
                let size: usize = b.iter().map(|m| m.slots.len()).sum();
                prop_assert!(size <= max_batch);
                if concurrent {
                    // Full batches, in as few steps as the slots allow.
                    prop_assert!(size == max_batch || i + 1 == plan.batches.len());
                } else {
                    // Independent moves: one per source and one per target.
                    let srcs: BTreeSet<u8> = b.iter().map(|m| m.source).collect();
                    let tgts: BTreeSet<u8> = b.iter().map(|m| m.target).collect();
                    prop_assert_eq!(srcs.len(), b.len());
                    prop_assert_eq!(tgts.len(), b.len());
                }
                for m in b {
                    prop_assert!(moved.is_disjoint(&m.slots), "slot moved twice");
                    moved = moved.union(&m.slots);
                    batched += m.slots.len();
                    // directly to the final owner: the target is a target shard and never a source
                    prop_assert!(tgt.contains(&m.target));
                    prop_assert!(!b.iter().any(|o| o.source == m.target));
                }
                apply(&mut owner, b);
                // every slot owned exactly once after every batch
                prop_assert_eq!(check_partition(&owner), Ok(()));
            }
            prop_assert_eq!(batched, plan.moved_slots());

            // final distribution balanced ±1 over the targets, nothing left on drained shards
            let counts: Vec<usize> = tgt.iter().map(|k| owner.get(k).map_or(0, SlotSet::len)).collect();
            let (min, max) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            prop_assert!(max - min <= 1);
            for (k, set) in &owner {
                if !tgt.contains(k) {
                    prop_assert!(set.is_empty());
                }
                if let Some(q) = plan.quotas.get(k) {
                    prop_assert_eq!(set.len(), *q);
                }
            }

            if concurrent {
                prop_assert_eq!(plan.batches.len(), plan.moved_slots().div_ceil(max_batch));
            }

            // re-planning from the final state moves nothing
            let again = plan_rebalance(&owner, &tgt, max_batch, batching).unwrap();
            prop_assert!(again.is_empty());
        }

        #[test]
        fn replanning_midway_moves_only_what_is_left(cur in ownership(), extra in 1u8..3, cut in 0usize..8) {
            let mut tgt: BTreeSet<u8> = cur.keys().copied().collect();
            tgt.extend((0..extra).map(|i| 100 + i));
            let plan = plan_rebalance(&cur, &tgt, 500, B).unwrap();
            let mut owner = cur.clone();
            let done = cut.min(plan.batches.len());
            let mut moved = 0;
            for b in &plan.batches[..done] {
                apply(&mut owner, b);
                moved += b.iter().map(|m| m.slots.len()).sum::<usize>();
            }
            let rest = plan_rebalance(&owner, &tgt, 500, B).unwrap();
            prop_assert_eq!(rest.moved_slots() + moved, plan.moved_slots());
        }

        /// The operator's loops: plan, run the first batch (key by key: its moves from one
        /// source), observe, plan again. Each slot changes owner at most once, the total is
        /// the minimum, and it ends balanced — for scale-out, scale-in (drain) and both at once.
        #[test]
        fn replanning_after_every_move_moves_each_slot_once(
            cur in ownership(),
            keep in proptest::collection::vec(any::<bool>(), 8),
            extra in 0u8..3,
            max_batch in 1usize..5000,
            concurrent in any::<bool>(),
        ) {
            let batching = if concurrent { Batching::Concurrent } else { Batching::Independent };
            let mut tgt: BTreeSet<u8> = cur
                .keys()
                .zip(&keep)
                .filter(|&(_, k)| *k)
                .map(|(s, _)| *s)
                .collect();
            tgt.extend((0..extra).map(|i| 100 + i));
            prop_assume!(!tgt.is_empty());
            let minimum = minimum_moves(&cur, &tgt).unwrap();
            let mut owner = cur.clone();
            let mut moved_count: BTreeMap<u16, usize> = BTreeMap::new();
            let mut total = 0;
            for _ in 0..20_000 {
                let plan = plan_rebalance(&owner, &tgt, max_batch, batching).unwrap();
                let Some(batch) = plan.batches.first() else { break };
                let source = batch[0].source;
                let step: Vec<SlotMove<u8>> = batch
                    .iter()
                    .filter(|m| concurrent || m.source == source)
                    .cloned()
                    .collect();
                for m in &step {
                    for slot in m.slots.iter() {
                        *moved_count.entry(slot).or_default() += 1;
                    }
                    total += m.slots.len();
                }
                apply(&mut owner, &step);
            }
            prop_assert!(plan_rebalance(&owner, &tgt, max_batch, batching).unwrap().is_empty());
            prop_assert!(moved_count.values().all(|&n| n == 1));
            prop_assert_eq!(total, minimum);
            let (lo, hi) = (16384 / tgt.len(), 16384usize.div_ceil(tgt.len()));
            for k in &tgt {
                let n = owner.get(k).map_or(0, SlotSet::len);
                prop_assert!(n >= lo && n <= hi, "shard {} owns {}", k, n);
            }
            prop_assert!(owner.iter().filter(|(k, _)| !tgt.contains(k)).all(|(_, s)| s.is_empty()));
        }
    }
}
