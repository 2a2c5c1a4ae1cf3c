//! Observed types: one position of the layout with its node's live view.

use std::net::{IpAddr, SocketAddr};

use crate::model::{
    ClusterNode, ClusterNodes, ClusterState, MemoryInfo, NodeObservation, PrimaryLinkStatus,
    Version,
};

/// The desired layout of a cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Number of shards.
    pub shards: i32,
    /// Replicas per shard.
    pub replicas: i32,
}

impl Layout {
    /// Whether position (`shard`, `index`) is part of the layout.
    pub fn contains(&self, shard: i32, index: i32) -> bool {
        (0..self.shards).contains(&shard) && (0..=self.replicas).contains(&index)
    }
}

/// What one reachable node reports, reduced to what topology decisions use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// Its `CLUSTER NODES`.
    pub nodes: ClusterNodes,
    /// `cluster_state:ok`.
    pub cluster_ok: bool,
    /// For a replica: the link to its primary is up (`master_link_status:up`).
    pub primary_link_up: bool,
    /// For a replica: a full sync from its primary is running (`master_sync_in_progress:1`).
    pub sync_in_progress: bool,
    /// Replication offset it has processed (`slave_repl_offset` on a replica,
    /// `master_repl_offset` on a primary).
    pub repl_offset: i64,
    /// For a replica whose link is down: seconds since it broke, `-1` when this process never
    /// had a link (it holds only what it loaded at start).
    pub link_down_since: Option<i64>,
    /// The node's clock when it answered (Unix time in ms), when reported: the reference for
    /// `link_down_since` against the `pong_recv` times of `CLUSTER NODES`.
    pub time_ms: Option<u64>,
    /// Server version, when reported.
    pub version: Option<Version>,
    /// `INFO memory`, when reported.
    pub memory: Option<MemoryInfo>,
}

impl NodeView {
    /// The reporting node's own line.
    pub fn me(&self) -> Option<&ClusterNode> {
        self.nodes.myself()
    }

    /// A view of `nodes` with the given link state (tests and tools).
    pub fn from_nodes(nodes: ClusterNodes) -> Self {
        Self {
            nodes,
            cluster_ok: false,
            primary_link_up: false,
            sync_in_progress: false,
            repl_offset: 0,
            link_down_since: None,
            time_ms: None,
            version: None,
            memory: None,
        }
    }
}

impl From<NodeObservation> for NodeView {
    fn from(o: NodeObservation) -> Self {
        let repl = o.replication.as_ref();
        Self {
            cluster_ok: o
                .cluster_info
                .as_ref()
                .is_some_and(|c| c.state == ClusterState::Ok),
            primary_link_up: repl
                .is_some_and(|r| r.primary_link_status == Some(PrimaryLinkStatus::Up)),
            sync_in_progress: repl.is_some_and(|r| r.sync_in_progress),
            link_down_since: repl.and_then(|r| r.primary_link_down_since),
            repl_offset: repl.map_or(0, |r| r.replica_repl_offset.unwrap_or(r.master_repl_offset)),
            time_ms: o
                .server
                .as_ref()
                .and_then(|s| s.time_usec)
                .map(|t| t / 1000),
            version: o.server.as_ref().map(|s| s.version),
            memory: o.memory,
            nodes: o.nodes,
        }
    }
}

/// One position of the layout (shard index, node index) with a running pod, and what its node
/// reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Shard index.
    pub shard: i32,
    /// Node index inside the shard (0 is the primary at creation).
    pub index: i32,
    /// Pod name.
    pub pod: String,
    /// Address the operator dials.
    pub addr: SocketAddr,
    /// The live view, `None` when the node could not be reached.
    pub view: Option<NodeView>,
    /// The connection was refused: the server process is not running.
    pub refused: bool,
    /// The server refused the operator's credentials: its error reply.
    pub auth_refused: Option<String>,
    /// Why the node could not be observed (a timeout, a refused connection, ...), when not.
    pub error: Option<String>,
}

impl Member {
    /// The node's own line, when reachable.
    pub fn me(&self) -> Option<&ClusterNode> {
        self.view.as_ref()?.me()
    }

    /// The node id, when reachable.
    pub fn id(&self) -> Option<&str> {
        self.me().map(|m| m.id.as_str())
    }

    /// The pod IP.
    pub fn ip(&self) -> IpAddr {
        self.addr.ip()
    }

    /// Whether the node is a primary owning slots (in its own view).
    pub fn owns_slots(&self) -> bool {
        self.me().is_some_and(ClusterNode::owns_slots)
    }

    /// Whether the node is a replica of `primary_id` (in its own view).
    pub fn replicates(&self, primary_id: &str) -> bool {
        self.me().is_some_and(|me| me.replicates(primary_id))
    }

    /// Whether the node is a replica of `primary_id` with its link up and no full sync
    /// running: a copy that a coordinated failover can promote.
    pub fn is_synced_replica_of(&self, primary_id: &str) -> bool {
        self.view
            .as_ref()
            .is_some_and(|v| v.primary_link_up && !v.sync_in_progress)
            && self.replicates(primary_id)
    }

    /// Replication offset (0 when unreachable).
    pub fn offset(&self) -> i64 {
        self.view.as_ref().map_or(0, |v| v.repl_offset)
    }
}
