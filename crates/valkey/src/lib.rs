//! Valkey operations layer: topology model, slot planners (pure) and cluster commands.

pub mod client;
pub mod commands;
pub mod error;
pub mod model;
pub mod plan;
pub mod slots;

pub use error::{ParseError, PlanError};
pub use model::{
    ClusterInfo, ClusterNode, ClusterNodes, ClusterState, LinkState, NodeAddr, NodeFlags, NodeRole,
    PersistenceInfo, ReplicationInfo, ServerInfo, Shard, SlotMigration, Version,
};
pub use plan::{RebalancePlan, SlotMove, initial_assignment, plan_rebalance};
pub use slots::{SLOT_COUNT, Slot, SlotRange, SlotSet};
