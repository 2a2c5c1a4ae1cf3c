//! Pure planners: initial slot assignment, rebalancing, failover and failback choices.

pub mod initial;
pub mod rebalance;

pub use initial::initial_assignment;
pub use rebalance::{RebalancePlan, SlotMove, minimum_moves, plan_rebalance};
