//! ValkeyCluster status: conditions of the contract, the derived summary state, the status
//! object of a pass (written only when it changed) and the events of its transitions.

pub mod assess;
pub mod conditions;
pub mod events;
pub mod shard_restart;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use valkey_api::ValkeyClusterStatus;
use valkey_api::status::ShardStatus;

pub use assess::{
    Activity, Child, ChildFailure, Facts, FailureKind, POD_CREATION_FAILED_PREFIX, Progress,
    RestoreGate, StepFailure, reason,
};
pub use conditions::Cond;
pub use events::{EventSpec, transition_events};

/// Builds the status of a pass from its facts, keeping transition times of unchanged conditions.
pub fn next_status(
    previous: Option<&ValkeyClusterStatus>,
    facts: &Facts,
    shard_statuses: Vec<ShardStatus>,
    generation: Option<i64>,
    now: &Time,
) -> ValkeyClusterStatus {
    let computed = assess::conditions(facts);
    let (state, reason, message) = conditions::derive_state(&computed);
    let prev_conds = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    ValkeyClusterStatus {
        state,
        reason,
        message,
        shards: facts.topology.shards_present,
        ready_shards: facts.topology.ready_shards,
        observed_generation: generation,
        conditions: conditions::merge(prev_conds, &computed, generation, now),
        shard_statuses,
        operation: previous.and_then(|p| p.operation.clone()),
        tls: previous.and_then(|p| p.tls.clone()),
        accepted_config: previous.and_then(|p| p.accepted_config.clone()),
        rejected_config: previous.and_then(|p| p.rejected_config.clone()),
        // Written by the restore (`backup/restore.rs`), kept as it is.
        restore: previous.and_then(|p| p.restore.clone()),
    }
}

/// Whether `new` differs from `old` in anything but condition transition times.
pub fn changed(old: Option<&ValkeyClusterStatus>, new: &ValkeyClusterStatus) -> bool {
    let Some(old) = old else { return true };
    old.state != new.state
        || old.reason != new.reason
        || old.message != new.message
        || old.shards != new.shards
        || old.ready_shards != new.ready_shards
        || old.observed_generation != new.observed_generation
        || old.shard_statuses != new.shard_statuses
        || old.operation != new.operation
        || old.tls != new.tls
        || old.accepted_config != new.accepted_config
        || old.rejected_config != new.rejected_config
        || !conditions::same_ignoring_time(&old.conditions, &new.conditions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::plan::shards::TopologyFacts;
    use k8s_openapi::jiff::Timestamp;

    fn facts() -> Facts {
        Facts {
            desired_shards: 1,
            topology: TopologyFacts {
                shards_present: 1,
                ready_shards: 1,
                slots_assigned: 16384,
                cluster_ok: true,
                ..TopologyFacts::default()
            },
            ..Facts::default()
        }
    }

    #[test]
    fn unchanged_pass_writes_nothing() {
        let t1 = Time(Timestamp::from_second(100).unwrap());
        let t2 = Time(Timestamp::from_second(200).unwrap());
        let first = next_status(None, &facts(), vec![], Some(1), &t1);
        assert!(changed(None, &first));
        let second = next_status(Some(&first), &facts(), vec![], Some(1), &t2);
        assert!(!changed(Some(&first), &second));
        assert_eq!(second.conditions, first.conditions);
        let third = next_status(Some(&first), &facts(), vec![], Some(2), &t2);
        assert!(changed(Some(&first), &third));
    }
}
