//! Pure planners: initial slot assignment, rebalancing, failover and failback choices.

pub mod failover;
pub mod initial;
pub mod rebalance;

pub use failover::{
    FailbackBlocker, FailbackStep, MemberState, ReplicaCandidate, ShardPlacement,
    choose_failover_target, plan_failback,
};
pub use initial::{assign_unassigned, initial_assignment};
pub use rebalance::{RebalancePlan, SlotMove, minimum_moves, plan_rebalance};
