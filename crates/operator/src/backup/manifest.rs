//! A backup's `manifest.json` (pure): what each shard's file holds and how to check it. It is
//! written after every shard's file, so a backup without one is incomplete.

use serde::{Deserialize, Serialize};
use valkey_ops::SlotRange;

/// The manifest format this operator writes and reads.
pub const FORMAT: u32 = 1;

/// Name of the manifest object in a backup's directory.
pub const MANIFEST_FILE: &str = "manifest.json";

/// The object name of shard `index`'s RDB in a backup's directory.
pub fn shard_file(index: usize) -> String {
    format!("shard-{index:05}.rdb")
}

/// A whole backup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The ValkeyCluster backed up, `namespace/name`.
    pub cluster: String,
    /// The ValkeyBackup's name and uid.
    pub backup: String,
    /// The ValkeyBackup's uid.
    pub backup_uid: String,
    /// The servers' Valkey version (of the first shard's source).
    pub valkey_version: String,
    /// The highest RDB format version among the files.
    pub rdb_version: u32,
    /// When the first snapshot started (RFC 3339).
    pub started_at: String,
    /// When the last snapshot ended (RFC 3339).
    pub completed_at: String,
    /// The shards, by lowest slot.
    pub shards: Vec<ShardEntry>,
}

/// One shard's file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShardEntry {
    /// Object name in the backup's directory.
    pub file: String,
    /// Slot ranges the shard owned, as `start-end`.
    pub slots: Vec<String>,
    /// Bytes of the file.
    pub bytes: u64,
    /// SHA-256 of the file, lowercase hex.
    pub sha256: String,
    /// The RDB's own CRC-64 checksum (`None` when the server wrote none).
    pub rdb_checksum: Option<u64>,
    /// RDB format version (11: `REDIS0011`, 80: `VALKEY080`).
    pub rdb_version: u32,
    /// Keys in the file (every database), counted by splitting it as a restore does (`None`:
    /// not recorded).
    pub keys: Option<u64>,
    /// The serving node's Valkey version.
    pub valkey_version: String,
    /// Pod the snapshot was read from.
    pub source_pod: String,
    /// Node id of that pod's server.
    pub source_node_id: String,
    /// Whether the source was a replica (else the primary).
    pub from_replica: bool,
    /// Replication id of the shard's history.
    pub replid: String,
    /// Replication offset the snapshot corresponds to.
    pub offset: u64,
    /// The primary's replication offset when the shard's turn began. A replica source was
    /// first waited for (up to 10 s) until it had applied the primary's stream up to it, so
    /// the file holds every write the primary had applied by then: `offset` is at least this,
    /// unless the replica was still behind when the wait ended. `None` for a primary source
    /// (its own snapshot holds its writes) and in manifests of older operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary_offset: Option<u64>,
    /// When the snapshot started (RFC 3339).
    pub started_at: String,
    /// When its last byte was stored (RFC 3339).
    pub completed_at: String,
}

impl Manifest {
    /// Total bytes of the files.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.bytes).sum()
    }

    /// Total keys, when every shard recorded its count.
    pub fn keys(&self) -> Option<u64> {
        self.shards.iter().map(|s| s.keys).sum()
    }
}

/// `start-end` of a slot range.
pub fn range_text(r: &SlotRange) -> String {
    format!("{}-{}", r.start, r.end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(keys: Option<u64>) -> ShardEntry {
        ShardEntry {
            file: shard_file(0),
            slots: vec![range_text(&SlotRange::new(0, 5460).unwrap())],
            bytes: 100,
            sha256: "ab".repeat(32),
            rdb_checksum: Some(7),
            rdb_version: 80,
            keys,
            valkey_version: "9.1.2".into(),
            source_pod: "vc-0-1".into(),
            source_node_id: "f".repeat(40),
            from_replica: true,
            replid: "e".repeat(40),
            offset: 42,
            primary_offset: Some(40),
            started_at: "2026-12-07T00:00:00Z".into(),
            completed_at: "2026-12-07T00:00:01Z".into(),
        }
    }

    #[test]
    fn round_trips_as_json_with_readable_names() {
        let m = Manifest {
            format: FORMAT,
            cluster: "ns/vc".into(),
            backup: "b1".into(),
            backup_uid: "uid".into(),
            valkey_version: "9.1.2".into(),
            rdb_version: 80,
            started_at: "2026-12-07T00:00:00Z".into(),
            completed_at: "2026-12-07T00:00:01Z".into(),
            shards: vec![entry(Some(3)), entry(Some(4))],
        };
        let json = serde_json::to_string_pretty(&m).unwrap();
        assert!(json.contains("\"rdbChecksum\": 7"), "{json}");
        assert!(json.contains("\"primaryOffset\": 40"), "{json}");
        // A manifest written before `primaryOffset` existed reads as `None`.
        let older = json.replace("\"primaryOffset\": 40,", "");
        let parsed: Manifest = serde_json::from_str(&older).unwrap();
        assert_eq!(parsed.shards[0].primary_offset, None);
        assert!(json.contains("\"slots\": [\n        \"0-5460\""), "{json}");
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
        assert_eq!((m.bytes(), m.keys()), (200, Some(7)));
        let unknown = Manifest {
            shards: vec![entry(Some(3)), entry(None)],
            ..m
        };
        assert_eq!(unknown.keys(), None);
        assert_eq!(shard_file(12), "shard-00012.rdb");
    }
}
