//! What one node reports in one round trip (see [`crate::commands::observe_node`]).

use crate::model::info::{ClusterInfo, MemoryInfo, ReplicationInfo, ServerInfo};
use crate::model::migrations::SlotMigration;
use crate::model::nodes::{ClusterNode, ClusterNodes};

/// What one node reported.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeObservation {
    /// Its `CLUSTER NODES` table.
    pub nodes: ClusterNodes,
    /// Its `CLUSTER INFO`, if fetched.
    pub cluster_info: Option<ClusterInfo>,
    /// Its `INFO replication`, if fetched.
    pub replication: Option<ReplicationInfo>,
    /// Its `INFO server`, if fetched.
    pub server: Option<ServerInfo>,
    /// Its `INFO memory`, if fetched.
    pub memory: Option<MemoryInfo>,
    /// Its `CLUSTER GETSLOTMIGRATIONS` (empty before Valkey 9 or when not fetched).
    pub migrations: Vec<SlotMigration>,
}

impl NodeObservation {
    /// An observation holding only a `CLUSTER NODES` table.
    pub fn new(nodes: ClusterNodes) -> Self {
        Self {
            nodes,
            ..Self::default()
        }
    }

    /// The observing node's own line.
    pub fn myself(&self) -> Option<&ClusterNode> {
        self.nodes.myself()
    }
}
