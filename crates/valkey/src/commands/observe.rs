//! Observation of one node: `CLUSTER NODES`, `CLUSTER INFO` and `INFO replication server`
//! fetched in one round trip.

use std::collections::BTreeMap;

use super::{CommandError, Result};
use crate::client::NodePool;
use crate::model::{ClusterNode, ClusterNodes};

/// What one node reports about itself and the cluster.
#[derive(Debug, Clone)]
pub struct NodeObservation {
    /// Address that was dialed.
    pub addr: String,
    /// Parsed `CLUSTER NODES` (this node's view).
    pub nodes: ClusterNodes,
    /// `CLUSTER INFO` fields (`cluster_state`, `cluster_slots_assigned`, ...).
    pub cluster_info: BTreeMap<String, String>,
    /// `INFO replication` and `INFO server` fields (`role`, `master_link_status`,
    /// `slave_repl_offset`, `valkey_version`, ...).
    pub info: BTreeMap<String, String>,
}

impl NodeObservation {
    /// This node's own entry.
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.myself()
    }

    /// Whether `cluster_state:ok`.
    pub fn cluster_ok(&self) -> bool {
        self.cluster_info.get("cluster_state").map(String::as_str) == Some("ok")
    }

    /// `cluster_slots_assigned`.
    pub fn slots_assigned(&self) -> u32 {
        self.cluster_info
            .get("cluster_slots_assigned")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Server version (`valkey_version`, else `redis_version`).
    pub fn version(&self) -> Option<&str> {
        self.info
            .get("valkey_version")
            .or_else(|| self.info.get("redis_version"))
            .map(String::as_str)
    }

    /// Major server version, if the version parses.
    pub fn major_version(&self) -> Option<u32> {
        self.version()?.split('.').next()?.parse().ok()
    }

    /// Replication offset of this node (`master_repl_offset`).
    pub fn repl_offset(&self) -> Option<u64> {
        self.info.get("master_repl_offset")?.parse().ok()
    }

    /// For a replica: whether its link to the primary is up.
    pub fn primary_link_up(&self) -> bool {
        self.info.get("master_link_status").map(String::as_str) == Some("up")
    }
}

/// Parses `key:value` lines of `INFO`-style replies (comments and blank lines skipped).
pub fn parse_info_fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Fetches one node's observation (one pipelined round trip).
pub async fn observe_node(pool: &NodePool, addr: &str) -> Result<NodeObservation> {
    let mut pipe = redis::pipe();
    pipe.cmd("CLUSTER")
        .arg("NODES")
        .cmd("CLUSTER")
        .arg("INFO")
        .cmd("INFO")
        .arg("replication")
        .arg("server");
    let (nodes, cluster_info, info): (String, String, String) = pool.pipeline(addr, &pipe).await?;
    let nodes = ClusterNodes::parse(&nodes).map_err(|source| CommandError::Parse {
        addr: addr.to_owned(),
        source,
    })?;
    Ok(NodeObservation {
        addr: addr.to_owned(),
        nodes,
        cluster_info: parse_info_fields(&cluster_info),
        info: parse_info_fields(&info),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_info_fields() {
        let m = parse_info_fields("# Replication\r\nrole:master\r\nslave0:ip=1,port=2\r\n\r\n");
        assert_eq!(m["role"], "master");
        assert_eq!(m["slave0"], "ip=1,port=2");
    }
}
