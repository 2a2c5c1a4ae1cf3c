//! Typed views of Valkey replies (pure parsing, no I/O).

pub mod info;
pub mod migrations;
pub mod nodes;
pub mod observation;
pub mod resp;
pub mod shards;

pub use info::{
    ClusterInfo, ClusterState, ConnectedReplica, InfoFields, MemoryInfo, PersistenceInfo,
    PrimaryLinkStatus, ReplicationInfo, ReplicationRole, ServerInfo, Version,
};
pub use migrations::{MigrationOperation, MigrationState, SlotMigration, parse_slot_migrations};
pub use nodes::{ClusterNode, ClusterNodes, LinkState, NodeAddr, NodeFlags, NodeRole};
pub use observation::NodeObservation;
pub use shards::{NodeHealth, Shard, ShardNode, ShardRole, parse_cluster_shards};
