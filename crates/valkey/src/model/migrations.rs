//! Typed `CLUSTER GETSLOTMIGRATIONS` reply (Valkey 9 atomic slot migration jobs).
//!
//! Each job is a map (RESP3) or flat key/value array (RESP2) with the fields `name`, `operation`
//! (`IMPORT`/`EXPORT`), `slot_ranges` (space-separated `a-b` ranges), `target_node`, `source_node`,
//! `create_time`, `last_update_time`, `last_ack_time`, `state`, `message`, `cow_size` and
//! `remaining_repl_size`. Finished jobs stay listed (with `success`, `failed` or `cancelled`)
//! until they age out of the server's migration log.

use redis::Value;

use crate::error::ParseError;
use crate::model::resp::{as_array, as_pairs, opt_i64, opt_string, reject_error, req_string};
use crate::slots::{SlotRange, SlotSet};

/// Direction of a migration job as seen by the answering node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigrationOperation {
    /// This node receives the slots.
    Import,
    /// This node sends the slots.
    Export,
}

/// State of a migration job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MigrationState {
    /// `success`: the target owns the slots.
    Success,
    /// `failed`: see the job message.
    Failed,
    /// `cancelled` (`CLUSTER CANCELSLOTMIGRATIONS`).
    Cancelled,
    /// Any in-progress state, verbatim (`waiting-for-ack`, `snapshotting`, `replicating`,
    /// `waiting-to-pause`, `failover-granted`, …).
    InProgress(String),
}

impl MigrationState {
    /// Parses the `state` field.
    pub fn parse(s: &str) -> Self {
        match s {
            "success" => Self::Success,
            "failed" => Self::Failed,
            "cancelled" => Self::Cancelled,
            other => Self::InProgress(other.to_owned()),
        }
    }

    /// Whether the job has finished (successfully or not).
    pub fn is_finished(&self) -> bool {
        !matches!(self, Self::InProgress(_))
    }
}

/// One slot migration job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMigration {
    /// Job name (40 hex characters; the same on source and target).
    pub name: String,
    /// Import or export, from the answering node's point of view.
    pub operation: MigrationOperation,
    /// Slot ranges of the job.
    pub slot_ranges: Vec<SlotRange>,
    /// Node id sending the slots (empty when the answering node is a replica:
    /// Valkey 9.1 omits both node ids in a replica's log).
    pub source_node: String,
    /// Node id receiving the slots (empty on a replica, see `source_node`).
    pub target_node: String,
    /// Unix seconds of creation.
    pub create_time: Option<i64>,
    /// Unix seconds of the last state change.
    pub last_update_time: Option<i64>,
    /// Unix seconds of the last ack from the peer.
    pub last_ack_time: Option<i64>,
    /// Job state.
    pub state: MigrationState,
    /// Error or status message (empty when none).
    pub message: String,
    /// Copy-on-write size of the snapshot child, bytes.
    pub cow_size: Option<i64>,
    /// Bytes still to be streamed to the target.
    pub remaining_repl_size: Option<i64>,
}

impl SlotMigration {
    /// Slots of the job as a set.
    pub fn slot_set(&self) -> SlotSet {
        SlotSet::from_ranges(&self.slot_ranges)
    }
}

fn parse_job(v: &Value) -> Result<SlotMigration, ParseError> {
    let pairs = as_pairs(v)
        .ok_or_else(|| ParseError::UnexpectedReply("slot migration entry is not a map".into()))?;
    let operation = match req_string(&pairs, "operation")?
        .to_ascii_uppercase()
        .as_str()
    {
        "IMPORT" => MigrationOperation::Import,
        "EXPORT" => MigrationOperation::Export,
        other => return Err(ParseError::field("operation", other)),
    };
    let ranges = req_string(&pairs, "slot_ranges")?;
    let slot_ranges = ranges
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<SlotRange>, _>>()?;
    Ok(SlotMigration {
        name: req_string(&pairs, "name")?,
        operation,
        slot_ranges,
        source_node: opt_string(&pairs, "source_node").unwrap_or_default(),
        target_node: opt_string(&pairs, "target_node").unwrap_or_default(),
        create_time: opt_i64(&pairs, "create_time")?,
        last_update_time: opt_i64(&pairs, "last_update_time")?,
        last_ack_time: opt_i64(&pairs, "last_ack_time")?,
        state: MigrationState::parse(&req_string(&pairs, "state")?),
        message: opt_string(&pairs, "message").unwrap_or_default(),
        cow_size: opt_i64(&pairs, "cow_size")?,
        remaining_repl_size: opt_i64(&pairs, "remaining_repl_size")?,
    })
}

/// Parses the reply of `CLUSTER GETSLOTMIGRATIONS` (either protocol).
pub fn parse_slot_migrations(v: &Value) -> Result<Vec<SlotMigration>, ParseError> {
    reject_error(v)?;
    as_array(v)
        .ok_or_else(|| {
            ParseError::UnexpectedReply("GETSLOTMIGRATIONS reply is not an array".into())
        })?
        .iter()
        .map(parse_job)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw replies captured from Valkey 9.1.2 on the source node after
    /// `CLUSTER MIGRATESLOTS SLOTSRANGE 1000 2999 3500 3600 NODE <id>` finished
    /// (plus two earlier jobs for slots 0-99), over RESP2 and RESP3.
    const RESP2: &[u8] = include_bytes!("testdata/mig2.bin");
    const RESP3: &[u8] = include_bytes!("testdata/mig3.bin");

    #[test]
    fn parses_real_replies() {
        let v2 = redis::parse_redis_value(RESP2).unwrap();
        let v3 = redis::parse_redis_value(RESP3).unwrap();
        let j2 = parse_slot_migrations(&v2).unwrap();
        let j3 = parse_slot_migrations(&v3).unwrap();
        assert_eq!(j2, j3);
        assert_eq!(j2.len(), 3);
        let j = &j2[0];
        assert_eq!(j.name, "8c38b441ee5065c1d3018477353aa071b7ca36dd");
        assert_eq!(j.operation, MigrationOperation::Export);
        assert_eq!(j.slot_set().to_string(), "1000-2999 3500-3600");
        assert_eq!(j.source_node, "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08");
        assert_eq!(j.target_node, "970e37735c7200f87f4dbcd084bcc611b8086a7b");
        assert_eq!(j.state, MigrationState::Success);
        assert!(j.state.is_finished());
        assert_eq!(j.message, "");
        assert_eq!(j.create_time, Some(1796206488));
        assert_eq!(j.remaining_repl_size, Some(0));
        assert_eq!(j2[1].operation, MigrationOperation::Import);
        assert_eq!(j2[1].slot_ranges, vec![SlotRange { start: 0, end: 99 }]);
    }

    /// Raw replies of Valkey 9.1.2 for `CLUSTER MIGRATESLOTS SLOTSRANGE 0 8000` of ~1M keys:
    /// right after `CLUSTER CANCELSLOTMIGRATIONS` on the source (RESP3) and on the target (RESP2),
    /// after killing the target mid-snapshot (source, RESP2), and while running (both, RESP3).
    const CANCELLED_SOURCE: &[u8] = include_bytes!("testdata/mig_cancel3.bin");
    const CANCELLED_TARGET: &[u8] = include_bytes!("testdata/mig_cancel_target2.bin");
    const TARGET_KILLED: &[u8] = include_bytes!("testdata/mig_killed2.bin");
    const RUNNING_SOURCE: &[u8] = include_bytes!("testdata/mig_running3.bin");
    const RUNNING_TARGET: &[u8] = include_bytes!("testdata/mig_running_target3.bin");

    fn jobs(raw: &[u8]) -> Vec<SlotMigration> {
        parse_slot_migrations(&redis::parse_redis_value(raw).unwrap()).unwrap()
    }

    #[test]
    fn cancelled_failed_and_running_jobs() {
        let c = jobs(CANCELLED_SOURCE);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].state, MigrationState::Cancelled);
        assert_eq!(c[0].operation, MigrationOperation::Export);
        let t = jobs(CANCELLED_TARGET);
        assert_eq!(t[0].name, c[0].name);
        assert_eq!(t[0].operation, MigrationOperation::Import);
        assert_eq!(t[0].state, MigrationState::Failed);
        assert!(t[0].message.starts_with("Connection lost to source."));

        let k = jobs(TARGET_KILLED);
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].state, MigrationState::Failed);
        assert!(k[0].message.starts_with("Connection lost to target."));
        assert_eq!(k[0].slot_set().len(), 8001);

        let r = jobs(RUNNING_SOURCE);
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0].state,
            MigrationState::InProgress("snapshotting".into())
        );
        assert!(r[1..].iter().all(|j| j.state.is_finished()));
        let rt = jobs(RUNNING_TARGET);
        assert_eq!(rt[0].name, r[0].name);
        assert_eq!(
            rt[0].state,
            MigrationState::InProgress("receiving-snapshot".into())
        );
    }

    #[test]
    fn in_progress_states_seen_on_a_real_server() {
        // Observed while polling the job above: waiting-to-snapshot, snapshotting, failover-granted.
        for s in [
            "waiting-to-snapshot",
            "snapshotting",
            "failover-granted",
            "waiting-for-ack",
        ] {
            assert_eq!(
                MigrationState::parse(s),
                MigrationState::InProgress(s.into())
            );
            assert!(!MigrationState::parse(s).is_finished());
        }
        assert!(MigrationState::parse("failed").is_finished());
        assert!(MigrationState::parse("cancelled").is_finished());
    }

    #[test]
    fn rejects_bad_entries() {
        let s = |x: &str| Value::BulkString(x.as_bytes().to_vec());
        let entry = |op: &str, ranges: &str| {
            Value::Array(vec![Value::Array(vec![
                s("name"),
                s("n"),
                s("operation"),
                s(op),
                s("slot_ranges"),
                s(ranges),
                s("target_node"),
                s("t"),
                s("source_node"),
                s("s"),
                s("state"),
                s("failed"),
                s("message"),
                s("connection lost"),
            ])])
        };
        let ok = parse_slot_migrations(&entry("IMPORT", "1-2 5")).unwrap();
        assert_eq!(ok[0].state, MigrationState::Failed);
        assert_eq!(ok[0].message, "connection lost");
        assert_eq!(ok[0].slot_set().to_string(), "1-2 5");
        assert_eq!(ok[0].cow_size, None);
        assert!(parse_slot_migrations(&entry("MOVE", "1-2")).is_err());
        assert!(parse_slot_migrations(&entry("IMPORT", "1-99999")).is_err());
        assert!(parse_slot_migrations(&Value::Int(3)).is_err());
        assert!(
            parse_slot_migrations(&Value::Array(vec![]))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn replica_entries_without_node_ids_parse() {
        // A replica of an import target (Valkey 9.1.2) lists the job without
        // source_node/target_node.
        let s = |x: &str| Value::BulkString(x.as_bytes().to_vec());
        let v = Value::Array(vec![Value::Array(vec![
            s("name"),
            s("5a0c5e3a8f0d4f2f9e63c1d3b2a1908f7e6d5c4b"),
            s("operation"),
            s("IMPORT"),
            s("slot_ranges"),
            s("0-99"),
            s("state"),
            s("success"),
        ])]);
        let jobs = parse_slot_migrations(&v).expect("parses");
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].source_node, "");
        assert_eq!(jobs[0].target_node, "");
        assert_eq!(jobs[0].state, MigrationState::Success);
    }
}
