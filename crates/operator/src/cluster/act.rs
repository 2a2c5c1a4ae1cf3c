//! Executes one topology step with the idempotent Valkey commands, reporting what happened as
//! events and as the Progressing/Degraded facts of the pass.

use std::time::Duration;

use tracing::{info, warn};
use valkey_ops::client::NodePool;
use valkey_ops::commands::{self, CommandError, FailoverMode};

use super::topology::Step;
use crate::status::{EventSpec, reason};

/// Longest wait for one slot-migration batch.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest wait for a replica to report itself primary after `CLUSTER FAILOVER FORCE` or
/// `TAKEOVER`.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(10);

/// Outcome of a step.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Events to publish.
    pub events: Vec<EventSpec>,
    /// Progressing reason and message while the step's effect is pending.
    pub progress: Option<(&'static str, String)>,
    /// Degraded reason and message when the step failed.
    pub failure: Option<(&'static str, String)>,
    /// Whether any command changed the cluster.
    pub acted: bool,
}

fn host_port(addr: &str) -> (String, u16) {
    match addr.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(['[', ']']).to_owned(),
            p.parse().unwrap_or(0),
        ),
        None => (addr.to_owned(), 0),
    }
}

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// Runs `step` against the cluster.
pub async fn execute(pool: &NodePool, step: &Step) -> Outcome {
    let mut out = Outcome::default();
    match step {
        Step::Meet { seed, nodes } => {
            let mut met = 0;
            for n in nodes {
                match commands::meet(pool, seed, n).await {
                    Ok(true) => met += 1,
                    Ok(false) => {}
                    Err(e) => {
                        warn!(seed, node = %n, error = %e, "cluster meet failed");
                        out.events.push(EventSpec::warning(
                            "ClusterMeetFailed",
                            "ClusterMeet",
                            format!("meeting {n} through {seed}: {e}"),
                        ));
                        out.failure = Some((reason::NODE_ADD_FAILED, format!("meet {n}: {e}")));
                    }
                }
            }
            if met > 0 {
                out.acted = true;
                out.events.push(EventSpec::normal(
                    "ClusterMeetBatch",
                    "ClusterMeet",
                    format!("introduced {met} nodes to the cluster through {seed}"),
                ));
            }
            out.progress = Some((
                reason::ADDING_NODES,
                format!("joining {} nodes to the cluster", nodes.len()),
            ));
        }
        Step::ReMeet { seed, nodes } => {
            let mut healed = 0;
            for n in nodes {
                let (ip, port) = host_port(n);
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("MEET").arg(&ip).arg(port);
                match pool.query::<redis::Value>(seed, &cmd).await {
                    Ok(_) => healed += 1,
                    Err(e) => warn!(seed, node = %n, error = %e, "re-meet failed"),
                }
            }
            if healed > 0 {
                out.acted = true;
                out.events.push(EventSpec::normal(
                    "StaleAddressesHealed",
                    "ClusterMeet",
                    format!("re-introduced {healed} nodes at their new addresses"),
                ));
            }
            out.progress = Some((reason::RECONCILING, "healing stale node addresses".into()));
        }
        Step::AssignSlots { assignments } => {
            let mut done = Vec::new();
            for (addr, shard, ranges) in assignments {
                match commands::add_slots_range(pool, addr, ranges).await {
                    Ok(n) if n > 0 => done.push(format!("shard {shard}: {n} slots")),
                    Ok(_) => {}
                    Err(e) => {
                        warn!(addr, shard, error = %e, "slot assignment failed");
                        out.events.push(EventSpec::warning(
                            "SlotAssignmentFailed",
                            "AssignSlots",
                            format!("shard {shard} at {addr}: {e}"),
                        ));
                        out.failure = Some((
                            reason::NODE_ADD_FAILED,
                            format!("assigning slots to shard {shard}: {e}"),
                        ));
                    }
                }
            }
            if !done.is_empty() {
                out.acted = true;
                let r = plural(done.len(), "PrimaryCreated", "PrimariesCreated");
                out.events.push(EventSpec::normal(
                    r,
                    "AssignSlots",
                    format!("assigned slots: {}", done.join(", ")),
                ));
            }
            out.progress = Some((reason::ADDING_NODES, "assigning slots to primaries".into()));
        }
        Step::Replicate { attachments } => {
            let mut attached = Vec::new();
            let mut waiting = 0;
            for (addr, primary, shard) in attachments {
                match commands::replicate(pool, addr, primary).await {
                    Ok(true) => attached.push(format!("{addr} → shard {shard}")),
                    Ok(false) => {}
                    Err(CommandError::NotReady(m)) => {
                        waiting += 1;
                        info!(addr, shard, "replica waits: {m}");
                    }
                    Err(e) => {
                        warn!(addr, shard, error = %e, "replicate failed");
                        out.events.push(EventSpec::warning(
                            "ReplicaCreationFailed",
                            "Replicate",
                            format!("{addr} as replica in shard {shard}: {e}"),
                        ));
                        out.failure = Some((
                            reason::NODE_ADD_FAILED,
                            format!("attaching a replica to shard {shard}: {e}"),
                        ));
                    }
                }
            }
            if !attached.is_empty() {
                out.acted = true;
                let r = plural(attached.len(), "ReplicaCreated", "ReplicasAttached");
                out.events.push(EventSpec::normal(
                    r,
                    "Replicate",
                    format!("attached replicas: {}", attached.join(", ")),
                ));
            }
            out.progress = Some((
                reason::ADDING_NODES,
                format!(
                    "attaching {} replicas ({waiting} waiting for gossip)",
                    attachments.len()
                ),
            ));
        }
        Step::MigrateSlots { source, moves } => {
            let atomic: Vec<commands::AtomicMove> = moves
                .iter()
                .map(|(id, _, ranges)| commands::AtomicMove {
                    ranges: ranges.clone(),
                    target_id: id.clone(),
                })
                .collect();
            let shards: Vec<String> = moves.iter().map(|(_, s, _)| s.to_string()).collect();
            match commands::migrate_slots_atomic(pool, source, &atomic, MIGRATION_TIMEOUT).await {
                Ok(n) if n > 0 => {
                    out.acted = true;
                    out.events.push(EventSpec::normal(
                        "SlotsRebalancing",
                        "MigrateSlots",
                        format!(
                            "moved {n} slots from {source} to shard(s) {}",
                            shards.join(", ")
                        ),
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    warn!(source, error = %e, "slot migration failed");
                    out.events.push(EventSpec::warning(
                        "SlotRebalanceFailed",
                        "MigrateSlots",
                        format!("moving slots from {source}: {e}"),
                    ));
                    out.failure = Some((reason::REBALANCE_FAILED, format!("moving slots: {e}")));
                }
            }
            out.progress = Some((
                reason::REBALANCING_SLOTS,
                format!("moving slots to shard(s) {}", shards.join(", ")),
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
                "FailoverInitiated",
                "Failover",
                format!("shard {shard}: primary {failed} is down and {why} with {replica}"),
            ));
            match commands::failover(pool, replica, *mode, FAILOVER_TIMEOUT).await {
                Ok(promoted) => {
                    out.acted = promoted;
                    info!(replica, shard, failed, ?mode, "failover done");
                }
                Err(e @ CommandError::Timeout { .. }) => {
                    warn!(replica, shard, error = %e, "failover timed out");
                    out.events.push(EventSpec::warning(
                        "FailoverTimeout",
                        "Failover",
                        format!("shard {shard}: {replica} did not become primary: {e}"),
                    ));
                }
                Err(e) => {
                    warn!(replica, shard, error = %e, "failover failed");
                    out.events.push(EventSpec::warning(
                        "FailoverFailed",
                        "Failover",
                        format!("shard {shard}: failover ({mode:?}) by {replica}: {e}"),
                    ));
                }
            }
            out.progress = Some((
                reason::RECONCILING,
                format!("shard {shard}: promoting {replica} after its primary failed"),
            ));
        }
        Step::Forget { node_id, addrs } => {
            match commands::forget_everywhere(pool, addrs, node_id).await {
                Ok(n) if n > 0 => {
                    out.acted = true;
                    out.events.push(EventSpec::normal(
                        "StaleNodeForgotten",
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
                        "NodeForgetFailed",
                        "Forget",
                        format!("forgetting {node_id}: {e}"),
                    ));
                }
            }
            out.progress = Some((
                reason::RECONCILING,
                format!("forgetting failed node {node_id}"),
            ));
        }
    }
    out
}

/// Hands the slots of a primary about to be rolled to its replica with a coordinated
/// `CLUSTER FAILOVER` (the primary stops writes until the replica has caught up, so no
/// acknowledged write is lost).
pub async fn roll_failover(pool: &NodePool, replica: &str, shard: i32, primary: &str) -> Outcome {
    let mut out = Outcome::default();
    out.events.push(EventSpec::normal(
        "FailoverInitiated",
        "Failover",
        format!("shard {shard}: handing over to {replica} before rolling {primary}"),
    ));
    match commands::failover(pool, replica, FailoverMode::Default, FAILOVER_TIMEOUT).await {
        Ok(promoted) => {
            out.acted = promoted;
            info!(
                replica,
                shard, primary, "coordinated failover before a roll done"
            );
        }
        Err(e) => {
            warn!(replica, shard, error = %e, "coordinated failover before a roll failed");
            let reason = if matches!(e, CommandError::Timeout { .. }) {
                "FailoverTimeout"
            } else {
                "FailoverFailed"
            };
            out.events.push(EventSpec::warning(
                reason,
                "Failover",
                format!("shard {shard}: handing over to {replica} before rolling {primary}: {e}"),
            ));
        }
    }
    out.progress = Some((
        reason::UPDATING_NODES,
        format!("shard {shard}: handing over to {replica} before rolling {primary}"),
    ));
    out
}
