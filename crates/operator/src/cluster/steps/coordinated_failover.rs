//! `HandOver`: a primary about to stop (rolled, retired or its pod being deleted) hands its
//! slots to its most caught-up synced replica with a coordinated `CLUSTER FAILOVER`.

use std::net::SocketAddr;
use std::time::Duration;

use tracing::{info, warn};
use valkey_api::status::event;
use valkey_ops::client::NodePool;
use valkey_ops::commands::{self, CommandError, FailoverMode};

use super::{Act, Actor, Outcome};
use super::forced_failover::FAILOVER_TIMEOUT;
use crate::status::{Activity, EventSpec, Progress};

/// How long a hand-over keeps the demoted primary running before a later pass may stop its
/// pod (the `preStop` hook's linger): clients still writing to it are redirected by its
/// `MOVED` replies instead of losing requests to a stopping server.
const HANDOVER_SETTLE: Duration =
    Duration::from_secs(crate::render::handover::LINGER_SECONDS as u64);

/// The address of the primary `replica` follows, from its own view.
async fn old_primary_addr(pool: &NodePool, replica: &str) -> Option<String> {
    let view = commands::cluster_nodes(pool, replica).await.ok()?;
    let pid = view.myself()?.primary_id.clone()?;
    Some(view.get(&pid)?.addr.host_port())
}

/// Waits (bounded) until the old primary at `addr` no longer owns slots in its own view.
async fn demoted(pool: &NodePool, addr: &str) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        if commands::myself(pool, addr)
            .await
            .is_ok_and(|me| !me.owns_slots())
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The events' action of a hand-over. Events of the same reason and action on one object
/// within minutes form a series that keeps its first message (events.k8s.io), so a hand-over
/// must not share the action of a failover of a failed primary.
const HAND_OVER_ACTION: &str = "HandOver";

/// Hand a primary's slots over to its most caught-up synced replica with a coordinated
/// `CLUSTER FAILOVER` before its pod stops (it is rolled, retired or being deleted).
#[derive(Clone, Debug, PartialEq)]
pub struct HandOver {
    /// Address of the replica to promote.
    pub replica: SocketAddr,
    /// Shard index.
    pub shard: i32,
    /// The primary that stops afterwards: its ValkeyNode name, or `pod <name>`.
    pub primary: String,
}

impl Act for HandOver {
    /// Hands the slots of a primary about to stop (rolled, retired or its pod being deleted) to
    /// its replica with a coordinated `CLUSTER FAILOVER` (the primary stops writes until the
    /// replica has caught up, so no acknowledged write is lost).
    async fn run(&self, actor: &Actor<'_>) -> Outcome {
        let pool = actor.pool;
        let Self {
            replica,
            shard,
            primary,
        } = self;
        let (replica, shard) = (*replica, *shard);
        let mut out = Outcome::default();
        out.events.push(EventSpec::normal(
            event::FAILOVER_INITIATED,
            HAND_OVER_ACTION,
            format!("shard {shard}: handing over to {replica} before {primary} stops"),
        ));
        let addr = replica.to_string();
        let old_primary = old_primary_addr(pool, &addr).await;
        let started = std::time::Instant::now();
        match commands::failover(pool, &addr, FailoverMode::Default, FAILOVER_TIMEOUT).await {
            Ok(promoted) => {
                out.acted = promoted;
                let promoted_ms = started.elapsed().as_millis();
                let demoted_ms = match (&old_primary, promoted) {
                    (Some(old), true) => demoted(pool, old)
                        .await
                        .then(|| started.elapsed().as_millis()),
                    _ => None,
                };
                info!(%replica, shard, primary, promoted_ms, ?demoted_ms, "coordinated failover before a node stops done");
                if promoted {
                    tokio::time::sleep(HANDOVER_SETTLE).await;
                }
            }
            Err(e) => {
                warn!(%replica, shard, error = %e, "coordinated failover before a node stops failed");
                let reason = if matches!(e, CommandError::Timeout { .. }) {
                    event::FAILOVER_TIMEOUT
                } else {
                    event::FAILOVER_FAILED
                };
                out.events.push(EventSpec::warning(
                    reason,
                    HAND_OVER_ACTION,
                    format!("shard {shard}: handing over to {replica} before {primary} stops: {e}"),
                ));
            }
        }
        out.progress = Some(Progress::new(
            Activity::UpdatingNodes,
            format!("shard {shard}: handing over to {replica} before {primary} stops"),
        ));
        out
    }
}
