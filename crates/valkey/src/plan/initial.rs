//! Initial slot assignment for a fresh cluster.

use crate::error::PlanError;
use crate::slots::{SLOT_COUNT, Slot, SlotRange};

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

    proptest! {
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
