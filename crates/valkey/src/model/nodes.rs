//! Typed `CLUSTER NODES` output.
//!
//! Each line is
//! `<id> <ip:port@cport[,hostname]> <flags> <primary|-> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot> ... <slot>`
//! where a slot entry is `N`, `A-B`, `[N->-<node>]` (migrating) or `[N-<-<node>]` (importing).

use std::fmt;
use std::str::FromStr;

use crate::error::ParseError;
use crate::slots::{Slot, SlotRange, SlotSet, parse_slot};

/// The announced address of a node: `ip:port@cport[,hostname]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeAddr {
    /// IP address (empty when the node has no known address, `:0@0`).
    pub ip: String,
    /// Client port (0 when unknown).
    pub port: u16,
    /// Cluster bus port (0 when unknown).
    pub cport: u16,
    /// Announced hostname, if any.
    pub hostname: Option<String>,
}

impl NodeAddr {
    /// Whether the address is unknown (`:0@0`).
    pub fn is_unknown(&self) -> bool {
        self.ip.is_empty() || self.port == 0
    }

    /// `ip:port`, bracketing IPv6 addresses (`[::1]:6379`).
    pub fn host_port(&self) -> String {
        if self.ip.contains(':') {
            format!("[{}]:{}", self.ip, self.port)
        } else {
            format!("{}:{}", self.ip, self.port)
        }
    }
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}@{}", self.ip, self.port, self.cport)?;
        if let Some(h) = &self.hostname {
            write!(f, ",{h}")?;
        }
        Ok(())
    }
}

impl FromStr for NodeAddr {
    type Err = ParseError;

    /// Parses `ip:port@cport[,hostname][,aux=value...]`; aux fields are ignored.
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let bad = || ParseError::field("address", s);
        let mut parts = s.split(',');
        let main = parts.next().unwrap_or_default();
        let hostname = parts
            .next()
            .filter(|h| !h.is_empty() && !h.contains('='))
            .map(str::to_owned);
        let (hostport, cport) = match main.split_once('@') {
            Some((hp, c)) => (hp, c.parse::<u16>().map_err(|_| bad())?),
            None => (main, 0),
        };
        let (ip, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        let ip = ip.trim_start_matches('[').trim_end_matches(']').to_owned();
        Ok(Self {
            ip,
            port,
            cport,
            hostname,
        })
    }
}

/// The flags column of a `CLUSTER NODES` line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeFlags {
    /// `myself`: the node answering the command.
    pub myself: bool,
    /// `master`: the node is a primary.
    pub primary: bool,
    /// `slave`: the node is a replica.
    pub replica: bool,
    /// `fail?`: the answering node cannot reach it (possible failure).
    pub pfail: bool,
    /// `fail`: the failure was agreed by a majority of primaries.
    pub fail: bool,
    /// `handshake`: not yet trusted, first contact in progress.
    pub handshake: bool,
    /// `noaddr`: the address of the node is unknown.
    pub noaddr: bool,
    /// `nofailover`: the replica will not attempt a failover.
    pub nofailover: bool,
    /// Flags this parser does not know, kept verbatim.
    pub other: Vec<String>,
}

impl NodeFlags {
    /// Parses a comma-separated flag list (`noflags` means none).
    pub fn parse(s: &str) -> Self {
        let mut f = NodeFlags::default();
        for flag in s.split(',').filter(|x| !x.is_empty()) {
            match flag {
                "myself" => f.myself = true,
                "master" | "primary" => f.primary = true,
                "slave" | "replica" => f.replica = true,
                "fail?" => f.pfail = true,
                "fail" => f.fail = true,
                "handshake" => f.handshake = true,
                "noaddr" => f.noaddr = true,
                "nofailover" => f.nofailover = true,
                "noflags" => {}
                other => f.other.push(other.to_owned()),
            }
        }
        f
    }

    /// Whether the node is seen as failing (`fail` or `fail?`).
    pub fn failing(&self) -> bool {
        self.fail || self.pfail
    }
}

/// Role of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    /// Primary (`master`).
    Primary,
    /// Replica (`slave`).
    Replica,
    /// Neither flag set (e.g. during handshake).
    Unknown,
}

/// State of the cluster-bus link to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// `connected`
    Connected,
    /// `disconnected`
    Disconnected,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// 40-character node id.
    pub id: String,
    /// Announced address.
    pub addr: NodeAddr,
    /// Flags.
    pub flags: NodeFlags,
    /// Id of the primary when this node is a replica.
    pub primary_id: Option<String>,
    /// Unix time in ms of the pending ping (0 when none).
    pub ping_sent: u64,
    /// Unix time in ms of the last pong received.
    pub pong_recv: u64,
    /// Configuration epoch.
    pub config_epoch: u64,
    /// Cluster-bus link state.
    pub link_state: LinkState,
    /// Owned slot ranges, as printed.
    pub slots: Vec<SlotRange>,
    /// `[slot-<-from]`: slots this node is importing, with the source node id.
    pub importing: Vec<(Slot, String)>,
    /// `[slot->-to]`: slots this node is migrating, with the target node id.
    pub migrating: Vec<(Slot, String)>,
    /// `shard-id` aux field when present (only in `nodes.conf`-style lines).
    pub shard_id: Option<String>,
}

impl ClusterNode {
    /// The node's role from its flags.
    pub fn role(&self) -> NodeRole {
        if self.flags.primary {
            NodeRole::Primary
        } else if self.flags.replica {
            NodeRole::Replica
        } else {
            NodeRole::Unknown
        }
    }

    /// Whether the node is a primary.
    pub fn is_primary(&self) -> bool {
        self.flags.primary
    }

    /// Whether the node is a replica.
    pub fn is_replica(&self) -> bool {
        self.flags.replica
    }

    /// Owned slots as a set.
    pub fn slot_set(&self) -> SlotSet {
        SlotSet::from_ranges(&self.slots)
    }

    /// Number of owned slots.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(SlotRange::len).sum()
    }

    /// Whether the node is a primary that owns at least one slot (a shard's writer).
    pub fn owns_slots(&self) -> bool {
        self.is_primary() && !self.slots.is_empty()
    }

    /// Whether the node is a replica of `primary_id`.
    pub fn replicates(&self, primary_id: &str) -> bool {
        self.is_replica() && self.primary_id.as_deref() == Some(primary_id)
    }

    /// Whether the announced IP is `ip`.
    pub fn has_ip(&self, ip: std::net::IpAddr) -> bool {
        self.addr.ip.parse::<std::net::IpAddr>() == Ok(ip)
    }

    /// Whether the address is unknown (`noaddr` flag or `:0@0`).
    pub fn has_no_address(&self) -> bool {
        self.flags.noaddr || self.addr.is_unknown()
    }

    /// Parses one `CLUSTER NODES` line.
    pub fn parse_line(line: &str) -> Result<Self, ParseError> {
        let bad = |reason: &str| ParseError::InvalidNodeLine {
            line: line.to_owned(),
            reason: reason.to_owned(),
        };
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() < 8 {
            return Err(bad("fewer than 8 fields"));
        }
        let id = fields[0].to_owned();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(bad("node id is not hexadecimal"));
        }
        let mut addr: NodeAddr = fields[1].parse().map_err(|_| bad("invalid address"))?;
        let shard_id = fields[1]
            .split(',')
            .skip(1)
            .find_map(|aux| aux.strip_prefix("shard-id="))
            .map(str::to_owned);
        if addr.hostname.as_deref() == Some("") {
            addr.hostname = None;
        }
        let flags = NodeFlags::parse(fields[2]);
        let primary_id = match fields[3] {
            "-" => None,
            p => Some(p.to_owned()),
        };
        let num = |i: usize, what: &str| -> Result<u64, ParseError> {
            fields[i].parse::<u64>().map_err(|_| bad(what))
        };
        let ping_sent = num(4, "invalid ping-sent")?;
        let pong_recv = num(5, "invalid pong-recv")?;
        let config_epoch = num(6, "invalid config-epoch")?;
        let link_state = match fields[7] {
            "connected" => LinkState::Connected,
            "disconnected" => LinkState::Disconnected,
            _ => return Err(bad("invalid link state")),
        };
        let mut slots = Vec::new();
        let mut importing = Vec::new();
        let mut migrating = Vec::new();
        for entry in &fields[8..] {
            if let Some(inner) = entry.strip_prefix('[').and_then(|e| e.strip_suffix(']')) {
                if let Some((slot, to)) = inner.split_once("->-") {
                    let slot = parse_slot(slot).map_err(|_| bad("invalid migrating slot"))?;
                    migrating.push((slot, to.to_owned()));
                } else if let Some((slot, from)) = inner.split_once("-<-") {
                    let slot = parse_slot(slot).map_err(|_| bad("invalid importing slot"))?;
                    importing.push((slot, from.to_owned()));
                } else {
                    return Err(bad("invalid slot transfer marker"));
                }
            } else {
                slots.push(entry.parse().map_err(|_| bad("invalid slot range"))?);
            }
        }
        Ok(Self {
            id,
            addr,
            flags,
            primary_id,
            ping_sent,
            pong_recv,
            config_epoch,
            link_state,
            slots,
            importing,
            migrating,
            shard_id,
        })
    }
}

/// The whole `CLUSTER NODES` table as seen by one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterNodes {
    /// All lines, in the order printed.
    pub nodes: Vec<ClusterNode>,
}

impl ClusterNodes {
    /// Parses the full `CLUSTER NODES` reply (blank lines are skipped).
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        let nodes = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(ClusterNode::parse_line)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { nodes })
    }

    /// The line flagged `myself`.
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.flags.myself)
    }

    /// The node with id `id`.
    pub fn get(&self, id: &str) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// All primaries.
    pub fn primaries(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes.iter().filter(|n| n.is_primary())
    }

    /// Replicas following primary `id`.
    pub fn replicas_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a ClusterNode> + 'a {
        self.nodes
            .iter()
            .filter(move |n| n.is_replica() && n.primary_id.as_deref() == Some(id))
    }

    /// Number of nodes known.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Real output of Valkey 9.1.2 (`CLUSTER NODES` on the primary 17001 of a 3×1 cluster; 17004 replicates 17001).
    pub(crate) const NODES_3X1: &str = "\
970e37735c7200f87f4dbcd084bcc611b8086a7b 127.0.0.1:17003@27003 master - 0 1796206469243 2 connected 10923-16383
89e2f936388011977285e48761f38f4c321dde86 127.0.0.1:17002@27002 master - 0 1796206468240 3 connected 5461-10922
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 slave 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 0 1796206467237 1 connected
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 myself,master - 0 0 1 connected 0-5460
";

    /// Real output of Valkey 9.1.2 on the replica 17004.
    const NODES_ON_REPLICA: &str = "\
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 master - 0 1796206469243 1 connected 0-5460
970e37735c7200f87f4dbcd084bcc611b8086a7b 127.0.0.1:17003@27003 master - 0 1796206467236 2 connected 10923-16383
89e2f936388011977285e48761f38f4c321dde86 127.0.0.1:17002@27002 master - 0 1796206468240 3 connected 5461-10922
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 myself,slave 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 0 0 1 connected
";

    /// Real output of Valkey 9.1.2 after `CLUSTER SETSLOT 100 MIGRATING` and `101 MIGRATING` on 17001.
    const NODES_MIGRATING: &str = "\
89e2f936388011977285e48761f38f4c321dde86 127.0.0.1:17002@27002 master - 0 1796206476265 3 connected 0-99 5461-10922
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 myself,master - 0 0 1 connected 100-5460 [100->-89e2f936388011977285e48761f38f4c321dde86] [101->-89e2f936388011977285e48761f38f4c321dde86]
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 slave 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 0 1796206475261 1 connected
970e37735c7200f87f4dbcd084bcc611b8086a7b 127.0.0.1:17003@27003 master - 0 1796206474258 2 connected 10923-16383
";

    /// Real output of Valkey 9.1.2 after `CLUSTER SETSLOT 100 IMPORTING` on 17002.
    const NODES_IMPORTING: &str = "\
89e2f936388011977285e48761f38f4c321dde86 127.0.0.1:17002@27002 myself,master - 0 0 3 connected 0-99 5461-10922 [100-<-63dccb26d7f0abe3f77e9b44ae52c2d200a81e08]
9b6b8a0faaf78604011daaf4daa5e85df2955fd4 127.0.0.1:17004@27004 slave 63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 0 1796206475265 1 connected
63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 127.0.0.1:17001@27001 master - 0 1796206476269 1 connected 100-5460
970e37735c7200f87f4dbcd084bcc611b8086a7b 127.0.0.1:17003@27003 master - 0 1796206475000 2 connected 10923-16383
";

    /// Real output of a fresh Valkey 9.1.2 node that has met nobody.
    const NODES_FRESH: &str =
        "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08 :17001@27001 myself,master - 0 0 0 connected\n";

    /// Real output of Valkey 9.1.2 started with `--cluster-announce-hostname host-<port>.example`,
    /// after a `CLUSTER MEET` to a port nobody listens on (stays in handshake).
    const NODES_HOSTNAME_HANDSHAKE: &str = "\
394b85f7a3cded0c2be612c0fe5a0c4a300b07a7 127.0.0.1:17199@27199 handshake - 0 0 0 disconnected
f37cb46bde8dee39094535ea21e2d78fb5e8fddb 127.0.0.1:17101@27101,host-17101.example myself,master - 0 0 0 connected 0-8191
6e829d989e06a0f65eedfba61215b934090863ec 127.0.0.1:17102@27102,host-17102.example master - 0 1796209207462 1 connected 8192-16383
";

    /// Real output of Valkey 8.0.1 serving only TLS (`--port 0 --tls-port 17301 --tls-cluster yes`):
    /// the TLS port is printed as the node port.
    const NODES_V8_TLS: &str = "\
6b70b29860b0a6b117ce9d97bca8571f0b21f4cf 127.0.0.1:17302@27302 slave 30164a1b943764bcf639e03cc3eca01508506a26 0 1796209679048 1 connected
30164a1b943764bcf639e03cc3eca01508506a26 127.0.0.1:17301@27301 myself,master - 0 0 1 connected 0-16383
";

    #[test]
    fn parses_valkey8_tls_output() {
        let t = ClusterNodes::parse(NODES_V8_TLS).unwrap();
        let me = t.myself().unwrap();
        assert_eq!(me.addr.port, 17301);
        assert!(me.slot_set().is_full());
        assert_eq!(t.replicas_of(&me.id).count(), 1);
    }

    #[test]
    fn parses_hostnames_and_handshake() {
        let t = ClusterNodes::parse(NODES_HOSTNAME_HANDSHAKE).unwrap();
        let me = t.myself().unwrap();
        assert_eq!(me.addr.hostname.as_deref(), Some("host-17101.example"));
        assert_eq!(
            me.addr.to_string(),
            "127.0.0.1:17101@27101,host-17101.example"
        );
        assert_eq!(me.addr.host_port(), "127.0.0.1:17101");
        let hs = &t.nodes[0];
        assert!(hs.flags.handshake && !hs.flags.primary && !hs.flags.replica);
        assert_eq!(hs.role(), NodeRole::Unknown);
        assert_eq!(hs.link_state, LinkState::Disconnected);
        assert_eq!(hs.addr.hostname, None);
        assert_eq!(t.primaries().count(), 2);
    }

    #[test]
    fn parses_3x1_cluster() {
        let t = ClusterNodes::parse(NODES_3X1).unwrap();
        assert_eq!(t.len(), 4);
        let me = t.myself().unwrap();
        assert_eq!(me.id, "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08");
        assert_eq!(
            me.addr,
            NodeAddr {
                ip: "127.0.0.1".into(),
                port: 17001,
                cport: 27001,
                hostname: None
            }
        );
        assert!(me.flags.myself && me.flags.primary && !me.flags.replica);
        assert_eq!(me.role(), NodeRole::Primary);
        assert_eq!(
            me.slots,
            vec![SlotRange {
                start: 0,
                end: 5460
            }]
        );
        assert_eq!(me.slot_count(), 5461);
        assert_eq!(me.config_epoch, 1);
        assert_eq!(me.link_state, LinkState::Connected);
        let r = t.get("9b6b8a0faaf78604011daaf4daa5e85df2955fd4").unwrap();
        assert_eq!(r.role(), NodeRole::Replica);
        assert_eq!(r.primary_id.as_deref(), Some(me.id.as_str()));
        assert_eq!(r.pong_recv, 1796206467237);
        assert!(r.slots.is_empty());
        assert_eq!(t.primaries().count(), 3);
        assert_eq!(t.replicas_of(&me.id).count(), 1);
        let total: usize = t.nodes.iter().map(ClusterNode::slot_count).sum();
        assert_eq!(total, 16384);
        let on_replica = ClusterNodes::parse(NODES_ON_REPLICA).unwrap();
        let me = on_replica.myself().unwrap();
        assert!(me.flags.myself && me.flags.replica);
    }

    #[test]
    fn parses_migrating_and_importing_markers() {
        let t = ClusterNodes::parse(NODES_MIGRATING).unwrap();
        let me = t.myself().unwrap();
        assert_eq!(
            me.slots,
            vec![SlotRange {
                start: 100,
                end: 5460
            }]
        );
        let to = "89e2f936388011977285e48761f38f4c321dde86".to_owned();
        assert_eq!(me.migrating, vec![(100, to.clone()), (101, to.clone())]);
        assert!(me.importing.is_empty());
        let other = t.get(&to).unwrap();
        assert_eq!(other.slot_set().to_string(), "0-99 5461-10922");

        let t = ClusterNodes::parse(NODES_IMPORTING).unwrap();
        let me = t.myself().unwrap();
        assert_eq!(
            me.importing,
            vec![(100, "63dccb26d7f0abe3f77e9b44ae52c2d200a81e08".to_owned())]
        );
        assert!(me.migrating.is_empty());
    }

    #[test]
    fn parses_fresh_node_without_ip() {
        let t = ClusterNodes::parse(NODES_FRESH).unwrap();
        let me = t.myself().unwrap();
        assert_eq!(me.addr.ip, "");
        assert_eq!(me.addr.port, 17001);
        assert!(me.addr.is_unknown());
        assert_eq!(me.config_epoch, 0);
    }

    #[test]
    fn parses_failure_and_special_flags() {
        let line = "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca :0@0 slave,fail,noaddr,nofailover 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 1426238316232 1426238314000 5 disconnected";
        let n = ClusterNode::parse_line(line).unwrap();
        assert!(n.flags.fail && n.flags.noaddr && n.flags.nofailover && n.flags.replica);
        assert!(n.has_no_address());
        assert_eq!(n.link_state, LinkState::Disconnected);
        assert_eq!(n.ping_sent, 1426238316232);

        let line = "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30004@31004,host-4.example,shard-id=0a1b master,fail? - 1700000000000 1699999990000 7 disconnected 1 3-4";
        let n = ClusterNode::parse_line(line).unwrap();
        assert!(n.flags.pfail && !n.flags.fail && n.flags.failing());
        assert_eq!(n.addr.hostname.as_deref(), Some("host-4.example"));
        assert_eq!(n.shard_id.as_deref(), Some("0a1b"));
        assert_eq!(n.slot_set().to_string(), "1 3-4");

        let line = "3ab1e2a1d6c59b0a5ae0c1ff23b8cd0c79e49ac1 127.0.0.1:30005@31005 handshake - 1700000000000 0 0 disconnected";
        let n = ClusterNode::parse_line(line).unwrap();
        assert!(n.flags.handshake);
        assert_eq!(n.role(), NodeRole::Unknown);

        let line =
            "3ab1e2a1d6c59b0a5ae0c1ff23b8cd0c79e49ac1 ::1:30005@31005 noflags - 0 0 0 connected";
        let n = ClusterNode::parse_line(line).unwrap();
        assert_eq!(n.flags, NodeFlags::default());
        assert_eq!(n.addr.ip, "::1");
        assert_eq!(n.addr.host_port(), "[::1]:30005");
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "abc",
            "zz 127.0.0.1:1@2 master - 0 0 0 connected",
            "ab 127.0.0.1 master - 0 0 0 connected",
            "ab 127.0.0.1:1@2 master - x 0 0 connected",
            "ab 127.0.0.1:1@2 master - 0 0 0 weird",
            "ab 127.0.0.1:1@2 master - 0 0 0 connected 16384",
            "ab 127.0.0.1:1@2 master - 0 0 0 connected [5-x-y]",
            "ab 127.0.0.1:1@2 master - 0 0 0 connected [99999->-ab]",
        ] {
            assert!(ClusterNode::parse_line(bad).is_err(), "{bad:?} accepted");
        }
        assert!(ClusterNodes::parse("").unwrap().is_empty());
    }
}
