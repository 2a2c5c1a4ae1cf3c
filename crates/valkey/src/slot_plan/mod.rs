//! Pure planners: initial slot assignment and rebalancing.

pub mod initial;
pub mod plan_error;
pub mod rebalance;

pub use initial::{assign_unassigned, initial_assignment};
pub use plan_error::PlanError;
pub use rebalance::{Batching, RebalancePlan, SlotMove, minimum_moves, plan_rebalance};
