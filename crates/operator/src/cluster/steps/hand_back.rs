//! `Failback`: hand a shard's primary back to its node-index-0 pod with a coordinated
//! `CLUSTER FAILOVER` once the quiet period of `spec.failback` has passed. When the planner may
//! do so is `plan/home_primaries.rs`.

use std::net::SocketAddr;

use tracing::{info, warn};
use valkey_api::status::event;
use valkey_ops::commands::{self, CommandError, FailoverMode};

use super::forced_failover::FAILOVER_TIMEOUT;
use super::{Act, Actor, OperationView, Outcome};
use crate::status::{Activity, EventSpec, Progress};

/// The events' action of a failback (its own, so a failback's events never join the series of
/// a failover of a failed primary or a hand-over).
const FAILBACK_ACTION: &str = "Failback";

/// Hand a shard's primary back to its node-index-0 pod (a synced replica of it) with a
/// coordinated `CLUSTER FAILOVER`: the primary stops writes until that replica has caught up,
/// so no acknowledged write is lost, and then serves `MOVED` to its clients.
#[derive(Clone, Debug, PartialEq)]
pub struct Failback {
    /// Address of the node-index-0 replica to promote.
    pub home: SocketAddr,
    /// Shard index.
    pub shard: i32,
    /// The node-index-0 pod.
    pub home_pod: String,
    /// The pod that holds the primary role until then.
    pub primary_pod: String,
}

impl Failback {
    fn detail(&self) -> String {
        format!(
            "shard {}: handing the primary back to {} (node-index 0) from {}",
            self.shard, self.home_pod, self.primary_pod
        )
    }
}

impl Act for Failback {
    fn operation_view(&self) -> Option<OperationView> {
        Some(OperationView::Own {
            shard: self.shard,
            detail: self.detail(),
        })
    }

    /// Promotes the node-index-0 replica with a coordinated `CLUSTER FAILOVER`.
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let mut out = Outcome::default();
        let addr = self.home.to_string();
        let started = std::time::Instant::now();
        match commands::failover(actor.pool, &addr, FailoverMode::Default, FAILOVER_TIMEOUT).await
        {
            Ok(promoted) => {
                out.acted = promoted;
                info!(home = %self.home, shard = self.shard, promoted, promoted_ms = started.elapsed().as_millis(), "failback done");
                if promoted {
                    out.events.push(EventSpec::normal(
                        event::FAILBACK_COMPLETED,
                        FAILBACK_ACTION,
                        format!(
                            "shard {}: primary handed back to {} (node-index 0) from {} in {} ms",
                            self.shard,
                            self.home_pod,
                            self.primary_pod,
                            started.elapsed().as_millis()
                        ),
                    ));
                }
            }
            Err(e) => {
                warn!(home = %self.home, shard = self.shard, error = %e, "failback failed");
                let timeout = matches!(e, CommandError::Timeout { .. });
                out.events.push(EventSpec::warning(
                    event::FAILBACK_FAILED,
                    FAILBACK_ACTION,
                    format!(
                        "{}: {e}{}",
                        self.detail(),
                        if timeout {
                            " (the replica did not report itself primary in time; the next quiet period tries again)"
                        } else {
                            ""
                        }
                    ),
                ));
            }
        }
        out.progress = Some(Progress::new(Activity::UpdatingNodes, self.detail()));
        out
    }
}
