//! Idempotent cluster commands built on [`crate::client::NodePool`].
//!
//! Every command first reads the node's state and only acts when the desired state is not
//! reached yet, so each one is safe to repeat after an operator crash. Nodes are addressed by
//! `ip:port` (what the operator dials); cluster-internal references use node ids.

pub mod acl;
pub mod migrate;
pub mod observe;
pub mod settings;
pub mod topology;

use std::future::Future;
use std::time::Duration;

use redis::Cmd;

use crate::client::{ClientError, NodePool};
use crate::error::ParseError;
use crate::model::{ClusterNode, ClusterNodes};

pub use acl::{
    AclLoadOutcome, AclState, SystemUsers, acl_apply, acl_load, acl_load_unsafe, acl_revision,
    acl_state, check_user_rules, restore_system_users, system_acl_rules,
};
pub use migrate::{
    AtomicMove, KeyMigrationOptions, OpenSlot, count_keys_in_slots, finish_open_slots,
    get_slot_migrations, migrate_slot_keys, migrate_slots_atomic, open_slots,
};
pub use observe::{
    CatchUp, Position, observe_node, observe_topology, repl_offset, wait_replica_offset,
};
pub use settings::{config_set, tls_reload, wait_replicas};
pub use topology::{
    FailoverMode, add_slots_range, claim_slots, ensure_config_epoch, failover, forget_everywhere,
    meet, meet_again, replicate, reset_soft,
};

/// Errors of cluster commands.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// Talking to a node failed (unreachable, auth, or an error reply).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A reply could not be parsed.
    #[error("cannot parse reply from {addr}: {source}")]
    Parse {
        /// Node address.
        addr: String,
        /// Parse error.
        #[source]
        source: ParseError,
    },
    /// The command is unsafe in the observed state and was not sent.
    #[error("refused: {0}")]
    Refused(String),
    /// A precondition is not met yet (e.g. a node id not yet gossiped); retry later.
    #[error("not ready: {0}")]
    NotReady(String),
    /// Polling for completion ran out of time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        after: Duration,
    },
    /// The server reported that an operation failed.
    #[error("{0}")]
    Failed(String),
}

/// Result of a command.
pub type Result<T, E = CommandError> = std::result::Result<T, E>;

/// `CLUSTER NODES` of the node at `addr`, parsed.
pub async fn cluster_nodes(pool: &NodePool, addr: &str) -> Result<ClusterNodes> {
    let text: String = pool.query(addr, redis::cmd("CLUSTER").arg("NODES")).await?;
    ClusterNodes::parse(&text).map_err(|source| CommandError::Parse {
        addr: addr.to_owned(),
        source,
    })
}

/// The node's own entry from its `CLUSTER NODES`.
pub async fn myself(pool: &NodePool, addr: &str) -> Result<ClusterNode> {
    let nodes = cluster_nodes(pool, addr).await?;
    nodes.myself().cloned().ok_or_else(|| CommandError::Parse {
        addr: addr.to_owned(),
        source: ParseError::MissingField("myself".into()),
    })
}

/// The node id of the node at `addr` (`CLUSTER MYID`).
pub async fn node_id(pool: &NodePool, addr: &str) -> Result<String> {
    Ok(pool.query(addr, redis::cmd("CLUSTER").arg("MYID")).await?)
}

/// Runs `cmd` expecting a simple `OK`-like reply.
pub(crate) async fn exec(pool: &NodePool, addr: &str, cmd: &Cmd) -> Result<()> {
    let _: redis::Value = pool.query(addr, cmd).await?;
    Ok(())
}

/// Polls `check` every `interval` until it returns `Some`, or fails with [`CommandError::Timeout`].
/// Errors from `check` that mean "unreachable" are tolerated while polling; others abort.
pub(crate) async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: Duration,
    check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    poll_until_paced(what, timeout, |_| interval, check).await
}

/// [`poll_until`] with the interval chosen from the time elapsed since polling started.
pub(crate) async fn poll_until_paced<T, F, Fut>(
    what: &str,
    timeout: Duration,
    interval: impl Fn(Duration) -> Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let start = tokio::time::Instant::now();
    let deadline = start + timeout;
    loop {
        match check().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(CommandError::Client(e)) if e.is_unreachable() => {
                tracing::debug!(error = %e, what, "node unreachable while polling");
            }
            Err(e) => return Err(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(CommandError::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        tokio::time::sleep(interval(start.elapsed())).await;
    }
}

/// Whether an error reply's text contains `needle` (case-insensitive).
pub(crate) fn reply_contains(err: &ClientError, needle: &str) -> bool {
    err.server_message().is_some_and(|m| {
        m.to_ascii_lowercase()
            .contains(&needle.to_ascii_lowercase())
    })
}
