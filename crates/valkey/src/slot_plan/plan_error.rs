//! Why a slot planner cannot plan.

/// A planner was given inputs it cannot plan for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No shard was given to own the slots.
    #[error("no target shards")]
    NoShards,
    /// More shards than slots.
    #[error("{0} shards exceed the {max} hash slots", max = crate::slots::SLOT_COUNT)]
    TooManyShards(usize),
    /// A slot is owned by two shards in the current ownership.
    #[error("slot {0} is owned by more than one shard")]
    OverlappingOwnership(crate::slots::Slot),
    /// Some slots have no owner; assign them before rebalancing.
    #[error("{0} slots are unassigned")]
    UnassignedSlots(usize),
    /// A batch must be allowed to hold at least one slot.
    #[error("batch size must be at least 1")]
    ZeroBatchSize,
}
