//! `Failover`: promote the most caught-up replica of a shard whose slot-owning primary is down,
//! when Valkey's own election cannot succeed (`TAKEOVER`) or would only start late (`FORCE`).
//! When the planner may do so is the failover rule (`plan/failover.rs`).

use std::net::SocketAddr;
use std::time::Duration;

use tracing::{info, warn};
use valkey_api::status::event;
use valkey_ops::commands::{self, CommandError, FailoverMode};

use super::{Act, Actor, OperationView, Outcome};
use crate::status::{Activity, EventSpec, Progress};

/// Longest wait for a replica to report itself primary after `CLUSTER FAILOVER FORCE` or
/// `TAKEOVER` (also a coordinated hand-over's).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Promote the most caught-up replica of a shard whose slot-owning primary is down, when
/// Valkey's own election cannot succeed (`TAKEOVER`) or would only start late (`FORCE`).
#[derive(Clone, Debug, PartialEq)]
pub struct Failover {
    /// Address of the replica to promote.
    pub replica: SocketAddr,
    /// Shard index.
    pub shard: i32,
    /// Node id of the failed primary.
    pub failed: String,
    /// `CLUSTER FAILOVER` mode.
    pub mode: FailoverMode,
}

impl Act for Failover {
    fn operation_view(&self) -> Option<OperationView> {
        Some(OperationView::Own {
            shard: self.shard,
            detail: format!(
                "promoting {} ({:?}) in place of failed primary {}",
                self.replica, self.mode, self.failed
            ),
        })
    }

    /// Promotes `replica` of `shard` in place of the `failed` primary.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let Self {
            replica,
            shard,
            failed,
            mode,
        } = self;
        let (replica, shard, mode) = (*replica, *shard, *mode);
        let mut out = Outcome::default();
        let why = match mode {
            FailoverMode::Takeover => {
                "no majority of primaries is alive to elect a replica; taking over"
            }
            _ => "its pod is gone; forcing an election",
        };
        out.events.push(EventSpec::normal(
            event::FAILOVER_INITIATED,
            "Failover",
            format!("shard {shard}: primary {failed} is down and {why} with {replica}"),
        ));
        match commands::failover(pool, &replica.to_string(), mode, FAILOVER_TIMEOUT).await {
            Ok(promoted) => {
                out.acted = promoted;
                info!(%replica, shard, failed, ?mode, "failover done");
            }
            Err(e @ CommandError::Timeout { .. }) => {
                warn!(%replica, shard, error = %e, "failover timed out");
                out.events.push(EventSpec::warning(
                    event::FAILOVER_TIMEOUT,
                    "Failover",
                    format!("shard {shard}: {replica} did not become primary: {e}"),
                ));
            }
            Err(e) => {
                warn!(%replica, shard, error = %e, "failover failed");
                out.events.push(EventSpec::warning(
                    event::FAILOVER_FAILED,
                    "Failover",
                    format!("shard {shard}: failover ({mode:?}) by {replica}: {e}"),
                ));
            }
        }
        out.progress = Some(Progress::new(
            Activity::Reconciling,
            format!("shard {shard}: promoting {replica} after its primary failed"),
        ));
        out
    }
}
