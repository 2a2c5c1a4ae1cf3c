//! `spec.failback`: handing each shard's primary back to its node-index-0 pod.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The default quiet period: ten minutes.
pub const DEFAULT_QUIET_PERIOD_SECONDS: i64 = 600;

/// The shortest quiet period admission accepts.
pub const MIN_QUIET_PERIOD_SECONDS: i64 = 5;

/// Primary failback: after a failover (a roll, a pod deleted or killed, a node lost) a shard's
/// primary runs on another pod than its node-index-0 pod, the one the `spread.primaries`
/// placement puts where it belongs. With `mode: Automatic`, once the cluster has been healthy
/// and unchanged for `quietPeriodSeconds`, the operator hands each such shard's primary back
/// to node-index 0 with a coordinated `CLUSTER FAILOVER` (writes pause only while the replica
/// catches up, as in a rolling update), one shard at a time and only when node-index 0 is a
/// synced replica. `status.shardStatuses[].failbackAt` shows when each waiting shard is due; any
/// other operation, or a new failover of the shard, restarts its wait.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FailbackSpec {
    /// `Disabled` (default): primaries stay where the last failover put them. `Automatic`:
    /// the operator hands them back to node-index 0 after the quiet period.
    #[serde(default)]
    pub mode: FailbackMode,

    /// How long, in seconds, the cluster must be healthy and unchanged (and the shard's
    /// primary the same pod) before that shard fails back. Defaults to 600; at least 5.
    #[serde(default = "quiet_period_default")]
    #[schemars(range(min = 5))]
    pub quiet_period_seconds: i64,
}

impl Default for FailbackSpec {
    fn default() -> Self {
        Self {
            mode: FailbackMode::default(),
            quiet_period_seconds: DEFAULT_QUIET_PERIOD_SECONDS,
        }
    }
}

fn quiet_period_default() -> i64 {
    DEFAULT_QUIET_PERIOD_SECONDS
}

impl FailbackSpec {
    /// The quiet period when failback is automatic, `None` when it is disabled.
    pub fn quiet_period(&self) -> Option<std::time::Duration> {
        match self.mode {
            FailbackMode::Automatic => Some(std::time::Duration::from_secs(
                self.quiet_period_seconds.max(MIN_QUIET_PERIOD_SECONDS) as u64,
            )),
            FailbackMode::Disabled => None,
        }
    }
}

/// Whether the operator hands primaries back to node-index 0.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailbackMode {
    /// Primaries stay where the last failover put them.
    #[default]
    Disabled,
    /// Primaries move back to node-index 0 after the quiet period.
    Automatic,
}
