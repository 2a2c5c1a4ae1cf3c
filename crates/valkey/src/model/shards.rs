//! Typed `CLUSTER SHARDS` reply (RESP2 flat arrays or RESP3 maps).

use redis::Value;

use crate::error::ParseError;
use crate::model::resp::{
    as_array, as_i64, as_pairs, opt_i64, opt_string, reject_error, req_string,
};
use crate::slots::{SlotRange, SlotSet};

/// `role` of a shard member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardRole {
    /// `master`
    Primary,
    /// `replica`
    Replica,
}

/// `health` of a shard member.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NodeHealth {
    /// `online`
    Online,
    /// `failed`
    Failed,
    /// `loading` (e.g. a replica in its initial sync)
    Loading,
    /// Any other value, verbatim.
    Other(String),
}

/// One member of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardNode {
    /// Node id.
    pub id: String,
    /// `endpoint`: the preferred address to reach the node.
    pub endpoint: Option<String>,
    /// `ip`.
    pub ip: Option<String>,
    /// `hostname` when announced.
    pub hostname: Option<String>,
    /// `port` (plaintext), absent when only TLS is served.
    pub port: Option<u16>,
    /// `tls-port` when TLS is enabled.
    pub tls_port: Option<u16>,
    /// `role`.
    pub role: ShardRole,
    /// `replication-offset`.
    pub replication_offset: i64,
    /// `health`.
    pub health: NodeHealth,
}

/// One shard: its slot ranges and members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Shard id (40 hex characters); Valkey 8.0 does not report one.
    pub id: Option<String>,
    /// Slot ranges served by the shard.
    pub slots: Vec<SlotRange>,
    /// Members (primary and replicas).
    pub nodes: Vec<ShardNode>,
}

impl Shard {
    /// The member with role primary, if any.
    pub fn primary(&self) -> Option<&ShardNode> {
        self.nodes.iter().find(|n| n.role == ShardRole::Primary)
    }

    /// The replica members.
    pub fn replicas(&self) -> impl Iterator<Item = &ShardNode> {
        self.nodes.iter().filter(|n| n.role == ShardRole::Replica)
    }

    /// Slots as a set.
    pub fn slot_set(&self) -> SlotSet {
        SlotSet::from_ranges(&self.slots)
    }
}

fn port(pairs: &[(String, &Value)], key: &str) -> Result<Option<u16>, ParseError> {
    opt_i64(pairs, key)?
        .map(|p| u16::try_from(p).map_err(|_| ParseError::field(key, p.to_string())))
        .transpose()
}

fn parse_node(v: &Value) -> Result<ShardNode, ParseError> {
    let pairs =
        as_pairs(v).ok_or_else(|| ParseError::UnexpectedReply("shard node is not a map".into()))?;
    let role = match req_string(&pairs, "role")?.as_str() {
        "master" | "primary" => ShardRole::Primary,
        "replica" | "slave" => ShardRole::Replica,
        other => return Err(ParseError::field("role", other)),
    };
    let health = match req_string(&pairs, "health")?.as_str() {
        "online" => NodeHealth::Online,
        "failed" => NodeHealth::Failed,
        "loading" => NodeHealth::Loading,
        other => NodeHealth::Other(other.to_owned()),
    };
    Ok(ShardNode {
        id: req_string(&pairs, "id")?,
        endpoint: opt_string(&pairs, "endpoint"),
        ip: opt_string(&pairs, "ip"),
        hostname: opt_string(&pairs, "hostname"),
        port: port(&pairs, "port")?,
        tls_port: port(&pairs, "tls-port")?,
        role,
        replication_offset: opt_i64(&pairs, "replication-offset")?.unwrap_or(0),
        health,
    })
}

fn parse_shard(v: &Value) -> Result<Shard, ParseError> {
    let pairs =
        as_pairs(v).ok_or_else(|| ParseError::UnexpectedReply("shard is not a map".into()))?;
    let lookup = |k: &str| crate::model::resp::lookup(&pairs, k);
    let bounds = lookup("slots")
        .and_then(as_array)
        .ok_or_else(|| ParseError::MissingField("slots".into()))?;
    if !bounds.len().is_multiple_of(2) {
        return Err(ParseError::field(
            "slots",
            format!("{} bounds", bounds.len()),
        ));
    }
    let mut slots = Vec::with_capacity(bounds.len() / 2);
    for pair in bounds.chunks_exact(2) {
        let b = |v: &Value| {
            as_i64(v)
                .and_then(|n| u16::try_from(n).ok())
                .ok_or_else(|| ParseError::InvalidSlot(format!("{v:?}")))
        };
        slots.push(SlotRange::new(b(&pair[0])?, b(&pair[1])?)?);
    }
    let nodes = lookup("nodes")
        .and_then(as_array)
        .ok_or_else(|| ParseError::MissingField("nodes".into()))?
        .iter()
        .map(parse_node)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Shard {
        id: opt_string(&pairs, "id"),
        slots,
        nodes,
    })
}

/// Parses the reply of `CLUSTER SHARDS` (either protocol).
pub fn parse_cluster_shards(v: &Value) -> Result<Vec<Shard>, ParseError> {
    reject_error(v)?;
    as_array(v)
        .ok_or_else(|| ParseError::UnexpectedReply("CLUSTER SHARDS reply is not an array".into()))?
        .iter()
        .map(parse_shard)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw replies captured from Valkey 9.1.2 (3 primaries, one replica; slots 1000-2999 and
    /// 3500-3600 had been migrated to the third shard) over RESP2 and, after `HELLO 3`, RESP3.
    const RESP2: &[u8] = include_bytes!("testdata/shards2.bin");
    const RESP3: &[u8] = include_bytes!("testdata/shards3.bin");

    fn check(shards: &[Shard]) {
        assert_eq!(shards.len(), 3);
        let s = shards
            .iter()
            .find(|s| s.id.as_deref() == Some("232e0bd9216be9ec3dac1d1759af0d6f2567eb68"))
            .unwrap();
        assert_eq!(s.slot_set().to_string(), "0-999 3000-3499 3601-5460");
        assert_eq!(s.nodes.len(), 2);
        let p = s.primary().unwrap();
        assert_eq!(p.id, "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08");
        assert_eq!(p.port, Some(17001));
        assert_eq!(p.tls_port, None);
        assert_eq!(p.ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(p.endpoint.as_deref(), Some("127.0.0.1"));
        assert_eq!(p.replication_offset, 22053616);
        assert_eq!(p.health, NodeHealth::Online);
        let r: Vec<_> = s.replicas().collect();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].id, "9b6b8a0faaf78604011daaf4daa5e85df2955fd4");
        assert_eq!(r[0].replication_offset, 22053602);
        assert_eq!(r[0].role, ShardRole::Replica);
        let total: usize = shards.iter().map(|s| s.slot_set().len()).sum();
        assert_eq!(total, 16384);
        let third = &shards[0];
        assert_eq!(
            third.slot_set().to_string(),
            "1000-2999 3500-3600 10923-16383"
        );
    }

    #[test]
    fn parses_real_resp2_and_resp3_replies() {
        let v2 = redis::parse_redis_value(RESP2).unwrap();
        let v3 = redis::parse_redis_value(RESP3).unwrap();
        assert!(matches!(&v3, Value::Array(a) if matches!(a[0], Value::Map(_))));
        let s2 = parse_cluster_shards(&v2).unwrap();
        let s3 = parse_cluster_shards(&v3).unwrap();
        check(&s2);
        assert_eq!(s2, s3);
    }

    /// Raw RESP3 reply of Valkey 9.1.2 nodes started with `--cluster-announce-hostname` and
    /// `--cluster-preferred-endpoint-type hostname`.
    const RESP3_HOSTNAMES: &[u8] = include_bytes!("testdata/shards_host3.bin");

    #[test]
    fn parses_hostname_endpoints() {
        let v = redis::parse_redis_value(RESP3_HOSTNAMES).unwrap();
        let shards = parse_cluster_shards(&v).unwrap();
        assert_eq!(shards.len(), 2);
        let p = shards[0].primary().unwrap();
        assert_eq!(p.id, "f37cb46bde8dee39094535ea21e2d78fb5e8fddb");
        assert_eq!(p.endpoint.as_deref(), Some("host-17101.example"));
        assert_eq!(p.hostname.as_deref(), Some("host-17101.example"));
        assert_eq!(p.ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(shards[0].slot_set().to_string(), "0-8191");
    }

    /// Raw RESP2 reply of Valkey 8.0.1 serving only TLS (`--port 0 --tls-port`), one primary
    /// and one replica: members have `tls-port` and no `port`, and the shard has no `id`.
    const RESP2_TLS_V8: &[u8] = include_bytes!("testdata/shards_tls2.bin");

    #[test]
    fn parses_valkey8_tls_only_reply() {
        let v = redis::parse_redis_value(RESP2_TLS_V8).unwrap();
        let shards = parse_cluster_shards(&v).unwrap();
        assert_eq!(shards.len(), 1);
        assert_eq!(shards[0].id, None);
        assert!(shards[0].slot_set().is_full());
        let p = shards[0].primary().unwrap();
        assert_eq!(p.id, "30164a1b943764bcf639e03cc3eca01508506a26");
        assert_eq!((p.port, p.tls_port), (None, Some(17301)));
        let r: Vec<_> = shards[0].replicas().collect();
        assert_eq!(r[0].tls_port, Some(17302));
    }

    #[test]
    fn rejects_bad_shapes() {
        assert!(parse_cluster_shards(&Value::Nil).is_err());
        assert!(parse_cluster_shards(&Value::Array(vec![Value::Int(1)])).is_err());
        let odd = Value::Array(vec![Value::Map(vec![
            (
                Value::SimpleString("slots".into()),
                Value::Array(vec![Value::Int(1)]),
            ),
            (Value::SimpleString("nodes".into()), Value::Array(vec![])),
            (
                Value::SimpleString("id".into()),
                Value::SimpleString("x".into()),
            ),
        ])]);
        assert!(parse_cluster_shards(&odd).is_err());
        let ok_empty = Value::Array(vec![Value::Map(vec![
            (Value::SimpleString("slots".into()), Value::Array(vec![])),
            (Value::SimpleString("nodes".into()), Value::Array(vec![])),
            (
                Value::SimpleString("id".into()),
                Value::SimpleString("x".into()),
            ),
        ])]);
        assert_eq!(parse_cluster_shards(&ok_empty).unwrap()[0].nodes.len(), 0);
    }
}
