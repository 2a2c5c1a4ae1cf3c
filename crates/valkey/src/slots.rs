//! Hash slots: inclusive [`SlotRange`]s and a compact [`SlotSet`] bitmap.

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;

/// Number of hash slots in a Valkey cluster.
pub const SLOT_COUNT: u16 = 16384;

/// A hash slot number, `0..SLOT_COUNT`.
pub type Slot = u16;

/// An inclusive range of hash slots, printed as `start-end` (or `start` when it holds one slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotRange {
    /// First slot of the range.
    pub start: Slot,
    /// Last slot of the range (inclusive).
    pub end: Slot,
}

impl SlotRange {
    /// A range `start..=end`; fails when `start > end` or `end >= SLOT_COUNT`.
    pub fn new(start: Slot, end: Slot) -> Result<Self, ParseError> {
        if start > end || end >= SLOT_COUNT {
            return Err(ParseError::InvalidSlot(format!("{start}-{end}")));
        }
        Ok(Self { start, end })
    }

    /// A range holding the single slot `slot` (which must be `< SLOT_COUNT`).
    pub fn single(slot: Slot) -> Result<Self, ParseError> {
        Self::new(slot, slot)
    }

    /// Number of slots in the range.
    pub fn len(&self) -> usize {
        (usize::from(self.end) + 1).saturating_sub(usize::from(self.start))
    }

    /// Whether the range holds no slot (only for a hand-built range with `start > end`).
    pub fn is_empty(&self) -> bool {
        self.start > self.end
    }

    /// Whether `slot` lies in the range.
    pub fn contains(&self, slot: Slot) -> bool {
        self.start <= slot && slot <= self.end
    }

    /// The slots of the range in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = Slot> + use<> {
        self.start..=self.end
    }
}

impl fmt::Display for SlotRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// Parses a slot number `< SLOT_COUNT`.
pub fn parse_slot(s: &str) -> Result<Slot, ParseError> {
    match s.trim().parse::<Slot>() {
        Ok(n) if n < SLOT_COUNT => Ok(n),
        _ => Err(ParseError::InvalidSlot(s.to_owned())),
    }
}

impl FromStr for SlotRange {
    type Err = ParseError;

    /// Parses `"0-5460"` or a single slot `"42"`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseError::InvalidSlot(s.to_owned());
        match s.split_once('-') {
            Some((a, b)) => Self::new(
                parse_slot(a).map_err(|_| bad())?,
                parse_slot(b).map_err(|_| bad())?,
            )
            .map_err(|_| bad()),
            None => Self::single(parse_slot(s)?),
        }
    }
}

/// CRC-16/XMODEM, the hash of cluster key slots.
static SLOT_CRC: crc::Crc<u16> = crc::Crc::<u16>::new(&crc::CRC_16_XMODEM);

/// The hash slot of `key`: CRC-16/XMODEM modulo 16384 of the key, or of its hash tag (the
/// bytes between the first `{` and the first `}` after it, when there are any).
pub fn key_slot(key: &[u8]) -> Slot {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let tag = &key[open + 1..];
            let close = tag.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &tag[..close])
        })
        .unwrap_or(key);
    SLOT_CRC.checksum(hashed) % SLOT_COUNT
}

const WORDS: usize = SLOT_COUNT as usize / 64;

/// A set of hash slots stored as a 16384-bit bitmap (2 KiB).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SlotSet {
    bits: Box<[u64; WORDS]>,
}

impl Default for SlotSet {
    fn default() -> Self {
        Self::new()
    }
}

impl SlotSet {
    /// The empty set.
    pub fn new() -> Self {
        Self {
            bits: Box::new([0; WORDS]),
        }
    }

    /// The set of all 16384 slots.
    pub fn full() -> Self {
        Self {
            bits: Box::new([u64::MAX; WORDS]),
        }
    }

    /// A set holding exactly the given ranges.
    pub fn from_ranges<'a>(ranges: impl IntoIterator<Item = &'a SlotRange>) -> Self {
        let mut set = Self::new();
        for r in ranges {
            set.insert_range(*r);
        }
        set
    }

    /// Parses space- or comma-separated ranges such as `"0-99 200 300-400"`.
    pub fn parse(s: &str) -> Result<Self, ParseError> {
        let mut set = Self::new();
        for part in s.split(|c: char| c == ',' || c.is_whitespace()) {
            if !part.is_empty() {
                set.insert_range(part.parse()?);
            }
        }
        Ok(set)
    }

    /// Whether `slot` is in the set (false for slots `>= SLOT_COUNT`).
    pub fn contains(&self, slot: Slot) -> bool {
        slot < SLOT_COUNT && self.bits[usize::from(slot / 64)] & (1 << (slot % 64)) != 0
    }

    /// Adds `slot`; returns whether it was newly added. Slots `>= SLOT_COUNT` are ignored.
    pub fn insert(&mut self, slot: Slot) -> bool {
        if slot >= SLOT_COUNT {
            return false;
        }
        let had = self.contains(slot);
        self.bits[usize::from(slot / 64)] |= 1 << (slot % 64);
        !had
    }

    /// Removes `slot`; returns whether it was present.
    pub fn remove(&mut self, slot: Slot) -> bool {
        let had = self.contains(slot);
        if had {
            self.bits[usize::from(slot / 64)] &= !(1 << (slot % 64));
        }
        had
    }

    /// Adds every slot of `range`.
    pub fn insert_range(&mut self, range: SlotRange) {
        self.apply_range(range, |w, mask| *w |= mask);
    }

    /// Removes every slot of `range`.
    pub fn remove_range(&mut self, range: SlotRange) {
        self.apply_range(range, |w, mask| *w &= !mask);
    }

    fn apply_range(&mut self, range: SlotRange, f: impl Fn(&mut u64, u64)) {
        let end = range.end.min(SLOT_COUNT - 1);
        let mut s = range.start;
        while s <= end {
            let word = usize::from(s / 64);
            let lo = s % 64;
            let hi = if usize::from(end / 64) == word {
                end % 64
            } else {
                63
            };
            let width = hi - lo + 1;
            let mask = if width == 64 {
                u64::MAX
            } else {
                ((1u64 << width) - 1) << lo
            };
            f(&mut self.bits[word], mask);
            s = (word as u16 + 1) * 64;
        }
    }

    /// The lowest `n` slots of the set (all of them when it holds fewer).
    pub fn lowest(&self, n: usize) -> SlotSet {
        let mut out = SlotSet::new();
        let mut left = n;
        for r in self.ranges() {
            if left == 0 {
                break;
            }
            let take = r.len().min(left);
            out.insert_range(SlotRange {
                start: r.start,
                end: r.start + (take - 1) as Slot,
            });
            left -= take;
        }
        out
    }

    /// The highest `n` slots of the set (all of them when it holds fewer).
    pub fn highest(&self, n: usize) -> SlotSet {
        let skip = self.len().saturating_sub(n);
        self.difference(&self.lowest(skip))
    }

    /// Number of slots in the set.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set holds no slot.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// Whether every slot is in the set.
    pub fn is_full(&self) -> bool {
        self.bits.iter().all(|w| *w == u64::MAX)
    }

    /// The slots in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = Slot> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, w)| {
            let mut w = *w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let bit = w.trailing_zeros();
                w &= w - 1;
                Some((i * 64) as Slot + bit as Slot)
            })
        })
    }

    /// The maximal contiguous ranges of the set, in ascending order.
    pub fn ranges(&self) -> SlotRanges<'_> {
        SlotRanges { set: self, next: 0 }
    }

    /// Slots in `self` or `other`.
    pub fn union(&self, other: &SlotSet) -> SlotSet {
        self.zip(other, |a, b| a | b)
    }

    /// Slots in both `self` and `other`.
    pub fn intersection(&self, other: &SlotSet) -> SlotSet {
        self.zip(other, |a, b| a & b)
    }

    /// Slots in `self` but not in `other`.
    pub fn difference(&self, other: &SlotSet) -> SlotSet {
        self.zip(other, |a, b| a & !b)
    }

    /// Slots not in `self`.
    pub fn complement(&self) -> SlotSet {
        SlotSet::full().difference(self)
    }

    /// Whether `self` and `other` share no slot.
    pub fn is_disjoint(&self, other: &SlotSet) -> bool {
        self.intersection(other).is_empty()
    }

    fn zip(&self, other: &SlotSet, f: impl Fn(u64, u64) -> u64) -> SlotSet {
        let mut out = SlotSet::new();
        for (i, w) in out.bits.iter_mut().enumerate() {
            *w = f(self.bits[i], other.bits[i]);
        }
        out
    }
}

/// Iterator over the maximal contiguous ranges of a [`SlotSet`].
#[derive(Debug)]
pub struct SlotRanges<'a> {
    set: &'a SlotSet,
    next: u32,
}

impl Iterator for SlotRanges<'_> {
    type Item = SlotRange;

    fn next(&mut self) -> Option<SlotRange> {
        let max = u32::from(SLOT_COUNT);
        let mut s = self.next;
        // Skip empty words quickly, then single slots.
        while s < max {
            let word = self.set.bits[(s / 64) as usize] >> (s % 64);
            if word == 0 {
                s = (s / 64 + 1) * 64;
                continue;
            }
            s += word.trailing_zeros();
            break;
        }
        if s >= max {
            self.next = max;
            return None;
        }
        let start = s;
        let mut e = s;
        while e + 1 < max {
            let next = e + 1;
            let word = self.set.bits[(next / 64) as usize];
            if next.is_multiple_of(64) && word == u64::MAX {
                e += 64;
                continue;
            }
            if !self.set.contains(next as Slot) {
                break;
            }
            e = next;
        }
        self.next = e + 1;
        Some(SlotRange {
            start: start as Slot,
            end: e as Slot,
        })
    }
}

impl fmt::Debug for SlotSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotSet[{self}]")
    }
}

impl fmt::Display for SlotSet {
    /// Space-separated ranges, e.g. `0-99 200 300-400` (empty string for the empty set).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl FromIterator<Slot> for SlotSet {
    fn from_iter<I: IntoIterator<Item = Slot>>(iter: I) -> Self {
        let mut set = SlotSet::new();
        for s in iter {
            set.insert(s);
        }
        set
    }
}

impl FromIterator<SlotRange> for SlotSet {
    fn from_iter<I: IntoIterator<Item = SlotRange>>(iter: I) -> Self {
        let mut set = SlotSet::new();
        for r in iter {
            set.insert_range(r);
        }
        set
    }
}

impl Extend<SlotRange> for SlotSet {
    fn extend<I: IntoIterator<Item = SlotRange>>(&mut self, iter: I) {
        for r in iter {
            self.insert_range(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn key_slots_of_known_keys() {
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"bar"), 5061);
        assert_eq!(key_slot(b""), 0);
        assert_eq!(key_slot(b"123456789"), 0x31C3 % SLOT_COUNT);
        assert_eq!(
            key_slot(b"{user1000}.following"),
            key_slot(b"{user1000}.followers")
        );
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // Only the first `{...}` counts, and an empty tag hashes the whole key.
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"{}foo"), SLOT_CRC.checksum(b"{}foo") % SLOT_COUNT);
        assert_ne!(key_slot(b"{}foo"), key_slot(b"foo"));
        assert_eq!(
            key_slot(b"foo{}{bar}"),
            SLOT_CRC.checksum(b"foo{}{bar}") % SLOT_COUNT
        );
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(
            key_slot(b"foo{bar"),
            SLOT_CRC.checksum(b"foo{bar") % SLOT_COUNT
        );
    }

    #[test]
    fn parse_and_format_ranges() {
        let r: SlotRange = "0-5460".parse().unwrap();
        assert_eq!(
            r,
            SlotRange {
                start: 0,
                end: 5460
            }
        );
        assert_eq!(r.len(), 5461);
        assert_eq!(r.to_string(), "0-5460");
        let single: SlotRange = "42".parse().unwrap();
        assert_eq!(single, SlotRange { start: 42, end: 42 });
        assert_eq!(single.to_string(), "42");
        assert_eq!("16383".parse::<SlotRange>().unwrap().len(), 1);
    }

    #[test]
    fn reject_bad_ranges() {
        for bad in [
            "", "-", "16384", "5-3", "0-16384", "a-b", "1-", "-1", "1-2-3", "  ",
        ] {
            assert!(bad.parse::<SlotRange>().is_err(), "{bad:?} accepted");
        }
        assert!(SlotRange::new(3, 2).is_err());
        assert!(SlotRange::new(0, SLOT_COUNT).is_err());
        // Hand-built invalid ranges never panic.
        let inverted = SlotRange { start: 9, end: 3 };
        assert!(inverted.is_empty());
        assert_eq!((inverted.len(), inverted.iter().count()), (0, 0));
        let mut set = SlotSet::new();
        set.insert_range(inverted);
        set.insert_range(SlotRange {
            start: 16380,
            end: u16::MAX,
        });
        set.insert_range(SlotRange {
            start: 20000,
            end: 30000,
        });
        assert_eq!(set.to_string(), "16380-16383");
    }

    #[test]
    fn set_basics() {
        let mut s = SlotSet::parse("0-99 200 300-400").unwrap();
        assert_eq!(s.len(), 100 + 1 + 101);
        assert!(s.contains(0) && s.contains(99) && !s.contains(100) && s.contains(200));
        assert_eq!(s.to_string(), "0-99 200 300-400");
        assert!(s.insert(100));
        assert!(!s.insert(100));
        assert_eq!(s.to_string(), "0-100 200 300-400");
        assert!(s.remove(0));
        assert!(!s.remove(0));
        assert!(!s.insert(SLOT_COUNT));
        assert!(!s.contains(SLOT_COUNT));
        assert_eq!(SlotSet::full().len(), 16384);
        assert!(SlotSet::full().is_full());
        assert_eq!(SlotSet::full().to_string(), "0-16383");
        assert!(SlotSet::new().is_empty());
        assert_eq!(SlotSet::new().ranges().count(), 0);
        assert_eq!(
            format!("{:?}", SlotSet::parse("1-3").unwrap()),
            "SlotSet[1-3]"
        );
    }

    #[test]
    fn lowest_and_highest() {
        let s = SlotSet::parse("0-9 20-29").unwrap();
        assert_eq!(s.lowest(12).to_string(), "0-9 20-21");
        assert_eq!(s.highest(12).to_string(), "8-9 20-29");
        assert_eq!(s.lowest(0), SlotSet::new());
        assert_eq!(s.highest(100), s);
        let mut r = SlotSet::new();
        r.insert_range(SlotRange::new(60, 200).unwrap());
        assert_eq!(r.len(), 141);
        r.remove_range(SlotRange::new(64, 191).unwrap());
        assert_eq!(r.to_string(), "60-63 192-200");
    }

    #[test]
    fn set_algebra() {
        let a = SlotSet::parse("0-9").unwrap();
        let b = SlotSet::parse("5-14").unwrap();
        assert_eq!(a.union(&b).to_string(), "0-14");
        assert_eq!(a.intersection(&b).to_string(), "5-9");
        assert_eq!(a.difference(&b).to_string(), "0-4");
        assert_eq!(a.complement().to_string(), "10-16383");
        assert!(!a.is_disjoint(&b));
        assert!(a.is_disjoint(&SlotSet::parse("10").unwrap()));
    }

    #[test]
    fn ranges_at_word_boundaries() {
        let s: SlotSet = [63u16, 64, 127, 128, 16383].into_iter().collect();
        let r: Vec<String> = s.ranges().map(|r| r.to_string()).collect();
        assert_eq!(r, ["63-64", "127-128", "16383"]);
    }

    proptest! {
        #[test]
        fn ranges_roundtrip(slots in proptest::collection::btree_set(0u16..SLOT_COUNT, 0..600)) {
            let set: SlotSet = slots.iter().copied().collect();
            prop_assert_eq!(set.len(), slots.len());
            let from_ranges: SlotSet = set.ranges().collect();
            prop_assert_eq!(&from_ranges, &set);
            // ranges are maximal and ascending
            let ranges: Vec<SlotRange> = set.ranges().collect();
            for w in ranges.windows(2) {
                prop_assert!(w[0].end + 1 < w[1].start);
            }
            prop_assert_eq!(SlotSet::parse(&set.to_string()).unwrap(), set.clone());
            prop_assert_eq!(set.iter().collect::<Vec<_>>(), slots.iter().copied().collect::<Vec<_>>());
            for n in [0, slots.len().min(1), slots.len() / 2, slots.len()] {
                let lo: Vec<Slot> = set.lowest(n).iter().collect();
                prop_assert_eq!(&lo[..], &set.iter().take(n).collect::<Vec<_>>()[..]);
                prop_assert_eq!(set.highest(n).len(), n);
                prop_assert!(set.highest(n).is_disjoint(&set.lowest(slots.len() - n)));
            }
        }
    }
}
