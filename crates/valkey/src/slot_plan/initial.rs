//! Initial slot assignment for a fresh cluster.

use std::collections::{BTreeMap, BTreeSet};

use super::plan_error::PlanError;
use crate::slot_plan::rebalance::quotas;
use crate::slots::{SLOT_COUNT, Slot, SlotRange, SlotSet};

/// Contiguous, balanced (±1) slot ranges for `n` primaries, in order; the boundaries are
/// the rounded multiples of `16384 / n`, as `valkey-cli --cluster create` places them
/// (3 → `0-5460`, `5461-10922`, `10923-16383`).
pub fn initial_assignment(n: usize) -> Result<Vec<SlotRange>, PlanError> {
    let total = usize::from(SLOT_COUNT);
    if n == 0 {
        return Err(PlanError::NoShards);
    }
    if n > total {
        return Err(PlanError::TooManyShards(n));
    }
    // end_i = round((i + 1) * total / n) - 1, in integers
    let boundary = |i: usize| (2 * i * total + n) / (2 * n);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (start, end) = (boundary(i), boundary(i + 1) - 1);
        let range =
            SlotRange::new(start as Slot, end as Slot).map_err(|_| PlanError::TooManyShards(n))?;
        out.push(range);
    }
    Ok(out)
}

/// Hands the slots nobody owns in `current` to the `targets` that are furthest below their
/// balanced quota (lowest slots first, shards in key order) — for finishing an interrupted
/// initial `ADDSLOTSRANGE` or adopting orphaned slots. Returns the slots to add per shard;
/// a later [`plan_rebalance`](crate::slot_plan::plan_rebalance) fixes any remaining imbalance.
pub fn assign_unassigned<K: Ord + Clone>(
    current: &BTreeMap<K, SlotSet>,
    targets: &BTreeSet<K>,
) -> Result<BTreeMap<K, SlotSet>, PlanError> {
    let quotas = quotas(current, targets)?;
    let owned = current.values().fold(SlotSet::new(), |acc, s| acc.union(s));
    let mut free = owned.complement();
    let mut out = BTreeMap::new();
    for (k, q) in &quotas {
        let need = q.saturating_sub(current.get(k).map_or(0, SlotSet::len));
        if need == 0 || free.is_empty() {
            continue;
        }
        let chunk = free.lowest(need);
        free = free.difference(&chunk);
        out.insert(k.clone(), chunk);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::SlotSet;
    use proptest::prelude::*;

    #[test]
    fn three_primaries_like_valkey_cli() {
        let r: Vec<String> = initial_assignment(3)
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(r, ["0-5460", "5461-10922", "10923-16383"]);
        assert_eq!(
            initial_assignment(1).unwrap(),
            vec![SlotRange {
                start: 0,
                end: 16383
            }]
        );
        assert_eq!(initial_assignment(16384).unwrap().len(), 16384);
        assert_eq!(initial_assignment(0), Err(PlanError::NoShards));
        assert_eq!(
            initial_assignment(16385),
            Err(PlanError::TooManyShards(16385))
        );
    }

    #[test]
    fn finishes_an_interrupted_initial_assignment() {
        let ranges = initial_assignment(3).unwrap();
        // Only the first shard got its slots before the crash.
        let current = BTreeMap::from([(0u8, SlotSet::from_ranges(&ranges[..1]))]);
        let add = assign_unassigned(&current, &BTreeSet::from([0, 1, 2])).unwrap();
        // Final counts are balanced: the shard that already has the most takes the extra slot.
        let count =
            |k: u8| current.get(&k).map_or(0, SlotSet::len) + add.get(&k).map_or(0, SlotSet::len);
        assert_eq!((count(0), count(1), count(2)), (5462, 5461, 5461));
        let all = add.values().fold(current[&0].clone(), |a, s| {
            assert!(a.is_disjoint(s));
            a.union(s)
        });
        assert!(all.is_full());
        // Nothing to do once everything is assigned.
        let full = BTreeMap::from([(0u8, SlotSet::full())]);
        assert!(
            assign_unassigned(&full, &BTreeSet::from([0, 1]))
                .unwrap()
                .is_empty()
        );
    }

    proptest! {
        #[test]
        fn assign_unassigned_covers_every_free_slot(
            owned in proptest::collection::vec((0u8..4, 0u16..16384, 0u16..2000), 0..6),
            n in 1u8..6,
        ) {
            let mut current: BTreeMap<u8, SlotSet> = BTreeMap::new();
            let mut taken = SlotSet::new();
            for (k, start, len) in owned {
                let end = start.saturating_add(len).min(16383);
                let mut s = SlotSet::from_ranges([&SlotRange::new(start, end).unwrap()]);
                s = s.difference(&taken);
                taken = taken.union(&s);
                current.entry(k).or_default().extend(s.ranges());
            }
            let targets: BTreeSet<u8> = (0..n).collect();
            let add = assign_unassigned(&current, &targets).unwrap();
            let mut all = taken.clone();
            for (k, s) in &add {
                prop_assert!(targets.contains(k));
                prop_assert!(all.is_disjoint(s));
                all = all.union(s);
            }
            prop_assert!(all.is_full());
        }

        #[test]
        fn contiguous_balanced_partition(n in 1usize..=16384) {
            let ranges = initial_assignment(n).unwrap();
            prop_assert_eq!(ranges.len(), n);
            prop_assert_eq!(ranges[0].start, 0);
            prop_assert_eq!(ranges[n - 1].end, SLOT_COUNT - 1);
            for w in ranges.windows(2) {
                prop_assert_eq!(w[0].end + 1, w[1].start);
            }
            let min = ranges.iter().map(SlotRange::len).min().unwrap();
            let max = ranges.iter().map(SlotRange::len).max().unwrap();
            prop_assert!(max - min <= 1);
            prop_assert!(SlotSet::from_ranges(&ranges).is_full());
        }
    }
}
