//! Valkey operations layer: reply parsing (`model`), the topology model (`topology`), slot
//! planners (`plan`, pure), idempotent cluster commands (`commands`) and streamed RDB
//! snapshots (`snapshot`), and RDB streams split into per-key `DUMP` payloads (`rdb`).

pub mod client;
pub mod commands;
pub mod error;
pub mod model;
pub mod rdb;
pub mod slot_plan;
pub mod slots;
pub mod snapshot;
pub mod tls;
pub mod topology;

pub use error::ParseError;
pub use model::{
    ClusterInfo, ClusterNode, ClusterNodes, ClusterState, LinkState, NodeAddr, NodeFlags,
    NodeObservation, NodeRole, PersistenceInfo, ReplicationInfo, ServerInfo, Shard, SlotMigration,
    Version,
};
pub use slot_plan::{PlanError, RebalancePlan, SlotMove, initial_assignment, plan_rebalance};
pub use slots::{SLOT_COUNT, Slot, SlotRange, SlotSet, key_slot};
pub use topology::{Layout, Member, NodeView, Topology};
