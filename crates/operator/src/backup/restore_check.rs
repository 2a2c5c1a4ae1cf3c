//! What a restore checks before it writes anything, and where each key goes (pure).

use std::net::SocketAddr;

use valkey_ops::model::Version;
use valkey_ops::{SLOT_COUNT, SlotSet, Topology};

use super::manifest::{FORMAT, Manifest};

/// The newest RDB format a Valkey version reads: 80 (`VALKEY080`) from 9.0, 11 before.
pub fn readable_rdb_version(v: Version) -> u32 {
    if v.major >= 9 { 80 } else { 11 }
}

/// Why a backup is refused before any key is written.
pub fn refuse(m: &Manifest, target: Version) -> Option<String> {
    if m.format > FORMAT {
        return Some(format!(
            "the manifest's format {} is newer than this operator reads ({FORMAT}): upgrade the \
             operator",
            m.format
        ));
    }
    if m.shards.is_empty() {
        return Some("the manifest lists no file".into());
    }
    let readable = readable_rdb_version(target);
    if let Some(newest) = m.shards.iter().map(|s| s.rdb_version).max()
        && newest > readable
    {
        return Some(format!(
            "the backup was written by Valkey {} (RDB version {newest}); this cluster runs \
             Valkey {}.{}.{}, which reads RDB versions up to {readable}: set spec.image to \
             Valkey {} or later",
            m.valkey_version, target.major, target.minor, target.patch, m.valkey_version
        ));
    }
    let mut covered = SlotSet::new();
    for s in &m.shards {
        for r in &s.slots {
            let Some((a, b)) = r.split_once('-') else {
                return Some(format!("{}: slot range {r:?} is not start-end", s.file));
            };
            let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) else {
                return Some(format!("{}: slot range {r:?} is not start-end", s.file));
            };
            if a > b || b >= SLOT_COUNT {
                return Some(format!("{}: slot range {r:?} is out of bounds", s.file));
            }
            for slot in a..=b {
                if !covered.insert(slot) {
                    return Some(format!("{}: slot {slot} is in two files", s.file));
                }
            }
        }
    }
    (!covered.is_full()).then(|| {
        format!(
            "the files cover {} of the {SLOT_COUNT} slots: the manifest is incomplete",
            covered.len()
        )
    })
}

/// The address of the primary owning each slot (its own view), `None` for a slot without one.
pub fn owners(topology: &Topology) -> Vec<Option<SocketAddr>> {
    let mut out = vec![None; usize::from(SLOT_COUNT)];
    for m in topology.members().iter().filter(|m| m.owns_slots()) {
        for r in m.me().map(|me| me.slots.as_slice()).unwrap_or_default() {
            for slot in r.start..=r.end {
                out[usize::from(slot)] = Some(m.addr);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::manifest::{ShardEntry, shard_file};

    fn manifest(ranges: &[&[&str]], rdb: u32) -> Manifest {
        Manifest {
            format: FORMAT,
            cluster: "ns/a".into(),
            backup: "b".into(),
            backup_uid: "u".into(),
            valkey_version: "9.1.2".into(),
            rdb_version: rdb,
            started_at: String::new(),
            completed_at: String::new(),
            shards: ranges
                .iter()
                .enumerate()
                .map(|(i, r)| ShardEntry {
                    file: shard_file(i),
                    slots: r.iter().map(|s| (*s).to_owned()).collect(),
                    bytes: 1,
                    sha256: String::new(),
                    rdb_checksum: None,
                    rdb_version: rdb,
                    keys: Some(1),
                    valkey_version: "9.1.2".into(),
                    source_pod: String::new(),
                    source_node_id: String::new(),
                    from_replica: true,
                    replid: String::new(),
                    offset: 0,
                    primary_offset: None,
                    started_at: String::new(),
                    completed_at: String::new(),
                })
                .collect(),
        }
    }

    #[test]
    fn a_newer_rdb_is_refused_with_what_to_do() {
        let m = manifest(&[&["0-8191"], &["8192-16383"]], 80);
        assert_eq!(refuse(&m, Version::new(9, 0, 0)), None);
        let why = refuse(&m, Version::new(8, 0, 1)).unwrap();
        assert!(
            why.contains("RDB version 80") && why.contains("runs Valkey 8.0.1"),
            "{why}"
        );
        assert_eq!(
            refuse(&manifest(&[&["0-16383"]], 11), Version::new(8, 0, 1)),
            None
        );
    }

    #[test]
    fn each_slot_goes_to_its_primary() {
        use crate::cluster::plan::testworld::*;
        let t = world(&formed31(), &[1, 2, 3, 4, 5, 6]);
        let o = owners(&t);
        assert_eq!(
            (o[0], o[5461], o[16383]),
            (Some(addr(1)), Some(addr(3)), Some(addr(5)))
        );
    }

    #[test]
    fn gaps_overlaps_and_bad_ranges_are_refused() {
        let gap = refuse(
            &manifest(&[&["0-100"], &["200-16383"]], 11),
            Version::new(9, 1, 0),
        );
        assert!(gap.unwrap().contains("16285 of the 16384"));
        let twice = refuse(
            &manifest(&[&["0-16383"], &["5-5"]], 11),
            Version::new(9, 1, 0),
        );
        assert!(twice.unwrap().contains("slot 5 is in two files"));
        let bad = refuse(&manifest(&[&["0-16384"]], 11), Version::new(9, 1, 0));
        assert!(bad.unwrap().contains("out of bounds"));
        assert!(refuse(&manifest(&[], 11), Version::new(9, 1, 0)).is_some());
    }
}
