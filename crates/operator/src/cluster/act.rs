//! Acting: executes the one step of a pass (idempotent Valkey commands, or the ValkeyNode
//! write that authorizes a roll or removes a surplus node), reporting what happened as events
//! and as the Progressing/Degraded facts of the pass.

use std::net::SocketAddr;
use std::time::Duration;

use kube::Api;
use kube::ResourceExt;
use tracing::{info, warn};
use valkey_api::ValkeyNode;
use valkey_api::status::event;
use valkey_ops::client::NodePool;
use valkey_ops::commands::{self, CommandError, FailoverMode, KeyMigrationOptions};

use super::apply;
use super::plan::{Step, Transfer};
use crate::status::{Activity, EventSpec, FailureKind, Progress, StepFailure};

/// Longest wait for one slot-migration batch.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest wait for a replica to report itself primary after `CLUSTER FAILOVER FORCE` or
/// `TAKEOVER`.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a hand-over keeps the demoted primary running before a later pass may stop its
/// pod (the `preStop` hook's linger): clients still writing to it are redirected by its
/// `MOVED` replies instead of losing requests to a stopping server.
const HANDOVER_SETTLE: Duration =
    Duration::from_secs(crate::render::handover::LINGER_SECONDS as u64);

/// Outcome of a step.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Events to publish.
    pub events: Vec<EventSpec>,
    /// The work in progress while the step's effect is pending.
    pub progress: Option<Progress>,
    /// The failure, when the step failed.
    pub failure: Option<StepFailure>,
    /// Whether any command changed the cluster.
    pub acted: bool,
    /// What a migration batch moved.
    pub moved: Option<Moved>,
}

/// What a migration batch moved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Slots that changed owner.
    pub slots: usize,
    /// Keys moved (counted by key-by-key migration; for atomic migration, the keys its slots
    /// held when the batch started).
    pub keys: Option<u64>,
}

/// What a step acts through.
pub struct Actor<'a> {
    /// The cluster's connection pool.
    pub pool: &'a NodePool,
    /// The ValkeyNodes of the cluster's namespace; `None` where only Valkey is driven (tests
    /// of the topology loop against bare servers), and the ValkeyNode steps do nothing.
    pub nodes: Option<&'a Api<ValkeyNode>>,
}

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// Runs `step`.
pub async fn execute(actor: &Actor<'_>, step: &Step) -> Outcome {
    let pool = actor.pool;
    let mut out = Outcome::default();
    match step {
        Step::Meet { seed, nodes } => {
            let mut met = 0;
            let seed = &seed.to_string();
            for n in nodes {
                match commands::meet(pool, seed, *n).await {
                    Ok(true) => met += 1,
                    Ok(false) => {}
                    Err(e) => {
                        warn!(seed, node = %n, error = %e, "cluster meet failed");
                        out.events.push(EventSpec::warning(
                            event::CLUSTER_MEET_FAILED,
                            "ClusterMeet",
                            format!("meeting {n} through {seed}: {e}"),
                        ));
                        out.failure = Some(StepFailure::new(
                            FailureKind::NodeAddFailed,
                            format!("meet {n}: {e}"),
                        ));
                    }
                }
            }
            if met > 0 {
                out.acted = true;
                out.events.push(EventSpec::normal(
                    event::CLUSTER_MEET_BATCH,
                    "ClusterMeet",
                    format!("introduced {met} nodes to the cluster through {seed}"),
                ));
            }
            out.progress = Some(Progress::new(
                Activity::AddingNodes,
                format!("joining {} nodes to the cluster", nodes.len()),
            ));
        }
        Step::ReMeet { seed, nodes } => {
            let mut healed = 0;
            let seed = &seed.to_string();
            for n in nodes {
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("MEET").arg(n.ip().to_string()).arg(n.port());
                match pool.query::<redis::Value>(seed, &cmd).await {
                    Ok(_) => healed += 1,
                    Err(e) => warn!(seed, node = %n, error = %e, "re-meet failed"),
                }
            }
            if healed > 0 {
                out.acted = true;
                out.events.push(EventSpec::normal(
                    event::STALE_ADDRESSES_HEALED,
                    "ClusterMeet",
                    format!("re-introduced {healed} nodes at their new addresses"),
                ));
            }
            out.progress = Some(Progress::new(
                Activity::Reconciling,
                "healing stale node addresses",
            ));
        }
        Step::AssignSlots { assignments } => {
            let mut done = Vec::new();
            for (addr, shard, ranges) in assignments {
                match commands::add_slots_range(pool, &addr.to_string(), ranges).await {
                    Ok(n) if n > 0 => done.push(format!("shard {shard}: {n} slots")),
                    Ok(_) => {}
                    Err(e) => {
                        warn!(%addr, shard, error = %e, "slot assignment failed");
                        out.events.push(EventSpec::warning(
                            event::SLOT_ASSIGNMENT_FAILED,
                            "AssignSlots",
                            format!("shard {shard} at {addr}: {e}"),
                        ));
                        out.failure = Some(StepFailure::new(
                            FailureKind::NodeAddFailed,
                            format!("assigning slots to shard {shard}: {e}"),
                        ));
                    }
                }
            }
            if !done.is_empty() {
                out.acted = true;
                let r = plural(done.len(), event::PRIMARY_CREATED, event::PRIMARIES_CREATED);
                out.events.push(EventSpec::normal(
                    r,
                    "AssignSlots",
                    format!("assigned slots: {}", done.join(", ")),
                ));
            }
            out.progress = Some(Progress::new(
                Activity::AddingNodes,
                "assigning slots to primaries",
            ));
        }
        Step::Replicate { attachments } => {
            let mut attached = Vec::new();
            let mut waiting = 0;
            for (addr, primary, shard) in attachments {
                match commands::replicate(pool, &addr.to_string(), primary).await {
                    Ok(true) => attached.push(format!("{addr} → shard {shard}")),
                    Ok(false) => {}
                    Err(CommandError::NotReady(m)) => {
                        waiting += 1;
                        info!(%addr, shard, "replica waits: {m}");
                    }
                    Err(e) => {
                        warn!(%addr, shard, error = %e, "replicate failed");
                        out.events.push(EventSpec::warning(
                            event::REPLICA_CREATION_FAILED,
                            "Replicate",
                            format!("{addr} as replica in shard {shard}: {e}"),
                        ));
                        out.failure = Some(StepFailure::new(
                            FailureKind::NodeAddFailed,
                            format!("attaching a replica to shard {shard}: {e}"),
                        ));
                    }
                }
            }
            if !attached.is_empty() {
                out.acted = true;
                let r = plural(
                    attached.len(),
                    event::REPLICA_CREATED,
                    event::REPLICAS_ATTACHED,
                );
                out.events.push(EventSpec::normal(
                    r,
                    "Replicate",
                    format!("attached replicas: {}", attached.join(", ")),
                ));
            }
            out.progress = Some(Progress::new(
                Activity::AddingNodes,
                format!(
                    "attaching {} replicas ({waiting} waiting for gossip)",
                    attachments.len()
                ),
            ));
        }
        Step::MigrateSlots {
            transfers,
            by_key,
            others,
        } => out = migrate(pool, transfers, *by_key, others).await,
        Step::FinishOpenSlots { primaries } => {
            let addrs: Vec<String> = primaries.iter().map(ToString::to_string).collect();
            match commands::finish_open_slots(pool, &addrs, &KeyMigrationOptions::default()).await {
                Ok(done) => {
                    out.acted = !done.is_empty();
                    info!(slots = done.len(), "finished half-migrated slots");
                }
                Err(e) => {
                    warn!(error = %e, "finishing half-migrated slots failed");
                    out.failure = Some(StepFailure::new(
                        FailureKind::RebalanceFailed,
                        format!("finishing half-migrated slots: {e}"),
                    ));
                }
            }
            out.progress = Some(Progress::new(
                Activity::RebalancingSlots,
                "finishing slots left half-migrated",
            ));
        }
        Step::Failover {
            replica,
            shard,
            failed,
            mode,
        } => {
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
            match commands::failover(pool, &replica.to_string(), *mode, FAILOVER_TIMEOUT).await {
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
        }
        Step::Forget { node_id, addrs } => {
            let addrs: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            match commands::forget_everywhere(pool, &addrs, node_id).await {
                Ok(n) if n > 0 => {
                    out.acted = true;
                    out.events.push(EventSpec::normal(
                        event::STALE_NODE_FORGOTTEN,
                        "Forget",
                        format!("forgot failed node {node_id} on {n} nodes"),
                    ));
                }
                Ok(_) => {}
                Err(CommandError::Refused(m)) | Err(CommandError::NotReady(m)) => {
                    info!(node = %node_id, "not forgetting yet: {m}");
                }
                Err(e) => {
                    warn!(node = %node_id, error = %e, "forget failed");
                    out.events.push(EventSpec::warning(
                        event::NODE_FORGET_FAILED,
                        "Forget",
                        format!("forgetting {node_id}: {e}"),
                    ));
                }
            }
            out.progress = Some(Progress::new(
                Activity::Reconciling,
                format!("forgetting failed node {node_id}"),
            ));
        }
        Step::Retire {
            forget,
            at,
            reset,
            names,
        } => {
            let Some(nodes) = actor.nodes else {
                return out;
            };
            out = retire(pool, nodes, forget, at, reset, names).await;
        }
        Step::HandOver {
            replica,
            shard,
            primary,
        } => out = hand_over(pool, *replica, *shard, primary).await,
        Step::AuthorizeRoll { node } => {
            let Some(nodes) = actor.nodes else {
                return out;
            };
            let name = node.name_any();
            info!(node = %name, "authorizing the roll of a node");
            match apply::apply_now(nodes, node.as_ref()).await {
                Ok(_) => out.acted = true,
                Err(e) => warn!(node = %name, error = %e, "authorizing a roll failed"),
            }
        }
    }
    out
}

/// Runs the transfers of one migration batch concurrently.
async fn migrate(
    pool: &NodePool,
    transfers: &[Transfer],
    by_key: bool,
    others: &[SocketAddr],
) -> Outcome {
    let others: Vec<String> = others.iter().map(ToString::to_string).collect();
    let results = futures::future::join_all(transfers.iter().map(|t| {
        let others = &others;
        async move {
            let src = t.source.to_string();
            let slots: Vec<u16> = t.ranges.iter().flat_map(|r| r.iter()).collect();
            let r = if by_key {
                let opts = KeyMigrationOptions::default();
                let tgt = t.target.to_string();
                commands::migrate_slot_keys(pool, &src, &tgt, &slots, others, &opts)
                    .await
                    .map(|keys| (t.slot_count(), Some(keys)))
            } else {
                // The slots move with their keys in one job: count them first (best effort).
                let keys = commands::count_keys_in_slots(pool, &src, &slots).await.ok();
                let mv = [commands::AtomicMove {
                    ranges: t.ranges.clone(),
                    target_id: t.target_id.clone(),
                }];
                commands::migrate_slots_atomic(pool, &src, &mv, MIGRATION_TIMEOUT)
                    .await
                    .map(|n| (n, keys.filter(|_| n > 0)))
            };
            (t, r)
        }
    }))
    .await;
    let mut out = Outcome::default();
    let mut moved = Moved::default();
    for (t, r) in results {
        let (what, ok_reason, failed_reason) = if t.draining {
            ("draining", event::SLOTS_DRAINING, event::DRAIN_FAILED)
        } else {
            (
                "moving",
                event::SLOTS_REBALANCING,
                event::SLOT_REBALANCE_FAILED,
            )
        };
        let route = format!(
            "{} slots from shard {} ({}) to shard {} ({})",
            t.slot_count(),
            t.source_shard,
            t.source,
            t.target_shard,
            t.target
        );
        match r {
            Ok((slots, keys)) => {
                out.acted |= slots > 0;
                moved.slots += slots;
                moved.keys = match (moved.keys, keys) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                if slots > 0 {
                    out.events.push(EventSpec::normal(
                        ok_reason,
                        "MigrateSlots",
                        format!("{what} {route}"),
                    ));
                }
            }
            Err(e) => {
                warn!(source = %t.source, target = %t.target, error = %e, "slot migration failed");
                out.events.push(EventSpec::warning(
                    failed_reason,
                    "MigrateSlots",
                    format!("{what} {route}: {e}"),
                ));
                out.failure = Some(StepFailure::new(
                    FailureKind::RebalanceFailed,
                    format!("{what} {route}: {e}"),
                ));
            }
        }
    }
    let routes: Vec<String> = transfers
        .iter()
        .map(|t| format!("shard {} -> {}", t.source_shard, t.target_shard))
        .collect();
    out.progress = Some(Progress::new(
        Activity::RebalancingSlots,
        format!("moving slots: {}", routes.join(", ")),
    ));
    out.moved = Some(moved);
    out
}

/// Forgets retiring nodes on every member of the layout (replicas first), resets them so
/// they stop gossiping, then deletes their ValkeyNodes. Each part is idempotent; a failed
/// forget stops before anything is deleted.
async fn retire(
    pool: &NodePool,
    nodes: &Api<ValkeyNode>,
    forget: &[String],
    at: &[SocketAddr],
    reset: &[SocketAddr],
    names: &[String],
) -> Outcome {
    let mut out = Outcome::default();
    let at: Vec<String> = at.iter().map(ToString::to_string).collect();
    for id in forget {
        match commands::forget_everywhere(pool, &at, id).await {
            Ok(n) => out.acted |= n > 0,
            Err(e) => {
                warn!(node = %id, error = %e, "forgetting a retiring node failed");
                out.events.push(EventSpec::warning(
                    event::NODE_FORGET_FAILED,
                    "Forget",
                    format!("forgetting retiring node {id}: {e}"),
                ));
                return out;
            }
        }
    }
    for addr in reset {
        if let Err(e) = commands::reset_soft(pool, &addr.to_string()).await {
            info!(%addr, error = %e, "resetting a retiring node failed (it is deleted anyway)");
        }
    }
    for name in names {
        match apply::delete(nodes, name).await {
            Ok(true) => {
                out.acted = true;
                out.events.push(EventSpec::normal(
                    event::VALKEY_NODE_DELETED,
                    "Delete",
                    format!("deleted surplus ValkeyNode {name}"),
                ));
            }
            Ok(false) => {}
            Err(e) => warn!(node = %name, error = %e, "deleting a surplus ValkeyNode failed"),
        }
    }
    out.progress = Some(Progress::new(
        Activity::Reconciling,
        format!("removing {} surplus nodes", names.len()),
    ));
    out
}

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

/// Hands the slots of a primary about to stop (rolled, retired or its pod being deleted) to
/// its replica with a coordinated `CLUSTER FAILOVER` (the primary stops writes until the
/// replica has caught up, so no acknowledged write is lost).
async fn hand_over(pool: &NodePool, replica: SocketAddr, shard: i32, primary: &str) -> Outcome {
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
