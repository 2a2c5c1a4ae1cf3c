//! Valkey operations layer: topology model, slot planners (pure) and cluster commands.

pub mod client;
pub mod commands;
pub mod error;
pub mod model;
pub mod plan;
pub mod slots;

pub use error::{ParseError, PlanError};
pub use model::{
    ClusterInfo, ClusterNode, ClusterNodes, ClusterState, ClusterView, LinkState, NodeAddr,
    NodeFlags, NodeObservation, NodeRole, PersistenceInfo, ReplicationInfo, ServerInfo, Shard,
    ShardView, SlotMigration, Version,
};
pub use plan::{
    FailbackStep, RebalancePlan, SlotMove, choose_failover_target, initial_assignment,
    plan_failback, plan_rebalance,
};
pub use slots::{SLOT_COUNT, Slot, SlotRange, SlotSet};
