//! Topology commands: MEET, SET-CONFIG-EPOCH, ADDSLOTSRANGE, REPLICATE, FAILOVER, FORGET.

use std::net::SocketAddr;
use std::time::Duration;

use tracing::{info, warn};

use super::{
    CommandError, Result, cluster_nodes, exec, myself, node_id, poll_until, poll_until_paced,
    reply_contains,
};
use crate::client::NodePool;
use crate::model::ClusterNodes;
use crate::slots::{SlotRange, SlotSet};

const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// How [`failover`] polls the promoted replica. Valkey sends the winner's announcement (a
/// `PONG` to every node, which unpauses the old primary's clients and redirects them) in the
/// event-loop iteration *after* the one that won the election; an otherwise idle new primary
/// only gets there on its next packet or timer, up to 1/`hz` s (100 ms by default) later.
/// Each poll is such a packet. During the first [`FAILOVER_EAGER_WINDOW`] (a coordinated
/// failover of a synced replica takes a few milliseconds) the next `ROLE` goes out as soon as
/// the previous one is answered, so one is always on its way when the election is won; then
/// every [`FAILOVER_FAST_POLL`] until [`FAILOVER_FAST_WINDOW`], then every [`POLL_INTERVAL`].
/// (On a busy node, as while a deleted pod stops, a 2 ms timer wakes late: in `bench_failover`
/// the hand-over of a deleted primary stalled writers a median 10 ms with a 2 ms poll and
/// under 5 ms back to back.)
const FAILOVER_EAGER_WINDOW: Duration = Duration::from_millis(50);
/// See [`FAILOVER_EAGER_WINDOW`].
const FAILOVER_FAST_POLL: Duration = Duration::from_millis(2);
/// See [`FAILOVER_EAGER_WINDOW`].
const FAILOVER_FAST_WINDOW: Duration = Duration::from_secs(1);

/// The poll interval of [`failover`], `elapsed` after the request.
fn failover_poll_interval(elapsed: Duration) -> Duration {
    if elapsed < FAILOVER_EAGER_WINDOW {
        Duration::ZERO
    } else if elapsed < FAILOVER_FAST_WINDOW {
        FAILOVER_FAST_POLL
    } else {
        POLL_INTERVAL
    }
}

/// Whether a `ROLE` reply is a primary's.
fn role_is_primary(role: &[redis::Value]) -> bool {
    match role.first() {
        Some(redis::Value::BulkString(r)) => r == b"master",
        Some(redis::Value::SimpleString(r)) => r == "master",
        _ => false,
    }
}

/// Sets the config epoch of a *fresh* node (knows no other node, epoch 0) so that every
/// primary of a new cluster starts with a distinct epoch. Returns whether it was set; a node
/// that already has that epoch or is no longer fresh is left alone (`Ok(false)`).
pub async fn ensure_config_epoch(pool: &NodePool, addr: &str, epoch: u64) -> Result<bool> {
    let nodes = cluster_nodes(pool, addr).await?;
    let me = nodes
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{addr}: no myself")))?;
    if me.config_epoch == epoch || me.config_epoch != 0 || nodes.len() > 1 {
        return Ok(false);
    }
    exec(
        pool,
        addr,
        redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(epoch),
    )
    .await?;
    Ok(true)
}

/// Prepares a fresh node (it knows only itself) as a new cluster's shard primary before it
/// meets the others, as `valkey-cli --cluster create` does: a config epoch of its own
/// ([`ensure_config_epoch`], so no two primaries of the new cluster share one) and the
/// shard's slots ([`add_slots_range`]), which the handshake then carries to every node it
/// meets. Returns the number of slots added; a node met in the meantime keeps its epoch and
/// only gets the slots no node it knows owns.
pub async fn claim_slots(
    pool: &NodePool,
    addr: &str,
    epoch: u64,
    ranges: &[SlotRange],
) -> Result<usize> {
    ensure_config_epoch(pool, addr, epoch).await?;
    add_slots_range(pool, addr, ranges).await
}

/// Introduces the node at `new_addr` to the cluster through `seed_addr` (`CLUSTER MEET`
/// sent to the seed). Skips when either side already knows the other or a handshake with
/// that address is in progress. Returns whether MEET was sent.
pub async fn meet(pool: &NodePool, seed_addr: &str, new: SocketAddr) -> Result<bool> {
    let new_addr = &new.to_string();
    let new_nodes = cluster_nodes(pool, new_addr).await?;
    let new_me = new_nodes
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{new_addr}: no myself")))?;
    let seed_nodes = cluster_nodes(pool, seed_addr).await?;
    let seed_me = seed_nodes
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{seed_addr}: no myself")))?;
    if seed_me.id == new_me.id {
        return Ok(false);
    }
    let ip = new.ip().to_string();
    let port = if new_me.addr.port != 0 {
        new_me.addr.port
    } else {
        new.port()
    };
    let pending = seed_nodes.nodes.iter().any(|n| {
        n.id == new_me.id || (n.flags.handshake && n.has_ip(new.ip()) && n.addr.port == port)
    });
    if pending || new_nodes.get(&seed_me.id).is_some() {
        return Ok(false);
    }
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("MEET").arg(ip).arg(port);
    if new_me.addr.cport != 0 {
        cmd.arg(new_me.addr.cport);
    }
    exec(pool, seed_addr, &cmd).await?;
    info!(seed = seed_addr, node = new_addr, id = %new_me.id, "cluster meet");
    Ok(true)
}

/// Sends `CLUSTER MEET <addr>` to `seed_addr` unconditionally: the seed knows the node under
/// an old address, and gossip alone would not update it.
pub async fn meet_again(pool: &NodePool, seed_addr: &str, addr: SocketAddr) -> Result<()> {
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("MEET").arg(addr.ip().to_string()).arg(addr.port());
    exec(pool, seed_addr, &cmd).await
}

/// How long [`replicate`] waits for the handshake of a replica it introduced to its primary.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(2);

/// Waits until the node at `addr` knows the node `id` (after MEET gossip).
pub async fn wait_known(pool: &NodePool, addr: &str, id: &str, timeout: Duration) -> Result<()> {
    poll_until(
        &format!("{addr} to know node {id}"),
        timeout,
        POLL_INTERVAL,
        || async {
            let nodes = cluster_nodes(pool, addr).await?;
            Ok(nodes.get(id).filter(|n| !n.flags.handshake).map(|_| ()))
        },
    )
    .await
}

/// Assigns `ranges` to the node at `addr` (`CLUSTER ADDSLOTSRANGE`), skipping slots it
/// already owns. Refuses if any requested slot is owned by another node in its view.
/// Returns the number of slots added.
pub async fn add_slots_range(pool: &NodePool, addr: &str, ranges: &[SlotRange]) -> Result<usize> {
    let nodes = cluster_nodes(pool, addr).await?;
    let me = nodes
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{addr}: no myself")))?;
    let wanted = SlotSet::from_ranges(ranges);
    let others = nodes
        .nodes
        .iter()
        .filter(|n| n.id != me.id)
        .fold(SlotSet::new(), |acc, n| acc.union(&n.slot_set()));
    let conflict = wanted.intersection(&others);
    if !conflict.is_empty() {
        return Err(CommandError::Refused(format!(
            "slots {conflict} are owned by other nodes"
        )));
    }
    let missing = wanted.difference(&me.slot_set());
    if missing.is_empty() {
        return Ok(0);
    }
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("ADDSLOTSRANGE");
    for r in missing.ranges() {
        cmd.arg(r.start).arg(r.end);
    }
    exec(pool, addr, &cmd).await?;
    Ok(missing.len())
}

/// Makes the node at `replica_addr` a replica of `primary_id` (`CLUSTER REPLICATE`).
/// No-op if it already is. A node that does not know the primary yet is introduced to it at
/// `primary_addr` (`CLUSTER MEET`, then a short wait for the handshake) instead of waiting for
/// gossip, which takes seconds in a large cluster. [`CommandError::NotReady`] if the node
/// still does not know the primary, or does not see it as a primary yet; refused if the node
/// is a primary that owns slots.
pub async fn replicate(
    pool: &NodePool,
    replica_addr: &str,
    primary_id: &str,
    primary_addr: Option<SocketAddr>,
) -> Result<bool> {
    let mut nodes = cluster_nodes(pool, replica_addr).await?;
    if let Some(primary) = primary_addr.filter(|_| nodes.get(primary_id).is_none()) {
        // A refusal (a handshake with that address already under way) changes nothing.
        let _ = meet_again(pool, replica_addr, primary).await;
        if wait_known(pool, replica_addr, primary_id, HANDSHAKE_WAIT)
            .await
            .is_ok()
        {
            nodes = cluster_nodes(pool, replica_addr).await?;
        }
    }
    let me = nodes
        .myself()
        .ok_or_else(|| CommandError::Failed(format!("{replica_addr}: no myself")))?;
    if me.id == primary_id {
        return Err(CommandError::Refused(format!(
            "{replica_addr} cannot replicate itself"
        )));
    }
    if me.is_replica() && me.primary_id.as_deref() == Some(primary_id) {
        return Ok(false);
    }
    match nodes.get(primary_id) {
        None => {
            return Err(CommandError::NotReady(format!(
                "{replica_addr} does not know node {primary_id} yet"
            )));
        }
        Some(p) if p.flags.handshake => {
            return Err(CommandError::NotReady(format!(
                "{replica_addr} is still in handshake with {primary_id}"
            )));
        }
        // Just promoted (a failover): this node has not heard of it through gossip yet.
        Some(p) if !p.is_primary() => {
            return Err(CommandError::NotReady(format!(
                "{replica_addr} still sees {primary_id} as a replica"
            )));
        }
        Some(_) => {}
    }
    if me.is_primary() && me.slot_count() > 0 {
        return Err(CommandError::Refused(format!(
            "{replica_addr} is a primary owning {} slots",
            me.slot_count()
        )));
    }
    exec(
        pool,
        replica_addr,
        redis::cmd("CLUSTER").arg("REPLICATE").arg(primary_id),
    )
    .await?;
    info!(
        replica = replica_addr,
        primary = primary_id,
        "cluster replicate"
    );
    Ok(true)
}

/// Kind of manual failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverMode {
    /// Coordinated with the primary (no data loss); the primary must be reachable.
    Default,
    /// Without the primary's agreement (primary down), still needs a majority of primaries.
    Force,
    /// Without any agreement: the replica bumps its epoch and takes over unilaterally.
    Takeover,
}

/// Promotes the replica at `replica_addr` (`CLUSTER FAILOVER [FORCE|TAKEOVER]`) and polls
/// until it reports itself primary. No-op (`Ok(false)`) if it already is a primary.
pub async fn failover(
    pool: &NodePool,
    replica_addr: &str,
    mode: FailoverMode,
    timeout: Duration,
) -> Result<bool> {
    let me = myself(pool, replica_addr).await?;
    if me.is_primary() {
        return Ok(false);
    }
    let mut cmd = redis::cmd("CLUSTER");
    cmd.arg("FAILOVER");
    match mode {
        FailoverMode::Default => {}
        FailoverMode::Force => {
            cmd.arg("FORCE");
        }
        FailoverMode::Takeover => {
            cmd.arg("TAKEOVER");
        }
    }
    match exec(pool, replica_addr, &cmd).await {
        Ok(()) => {}
        // A repeated call while a failover is still running: keep polling.
        Err(CommandError::Client(e)) if reply_contains(&e, "in progress") => {}
        Err(e) => return Err(e),
    }
    info!(replica = replica_addr, ?mode, "cluster failover requested");
    poll_until_paced(
        &format!("{replica_addr} to become primary"),
        timeout,
        failover_poll_interval,
        // `ROLE` is O(1) where `CLUSTER NODES` grows with the cluster; in cluster mode it says
        // `master` from the moment the replica took over its primary's slots.
        || async {
            let role: Vec<redis::Value> = pool.query(replica_addr, &redis::cmd("ROLE")).await?;
            Ok(role_is_primary(&role).then_some(()))
        },
    )
    .await?;
    Ok(true)
}

/// Why forgetting a node is unsafe, judged from the views of all reachable nodes.
pub fn forget_refusal(views: &[(String, ClusterNodes)], dead_id: &str) -> Option<String> {
    if let Some((addr, _)) = views
        .iter()
        .find(|(_, v)| v.myself().is_some_and(|m| m.id == dead_id))
    {
        return Some(format!("node {dead_id} is alive at {addr}"));
    }
    for (addr, nodes) in views {
        let follower = nodes.nodes.iter().find(|n| {
            n.primary_id.as_deref() == Some(dead_id)
                && n.id != dead_id
                && !n.flags.failing()
                && !n.flags.noaddr
        });
        if let Some(n) = follower {
            return Some(format!(
                "live replica {} ({}) still follows {dead_id} in the view of {addr}",
                n.id,
                n.addr.host_port()
            ));
        }
    }
    for (addr, nodes) in views {
        if let Some(n) = nodes.get(dead_id).filter(|n| n.slot_count() > 0) {
            return Some(format!(
                "{dead_id} still owns {} slots in the view of {addr}",
                n.slot_count()
            ));
        }
    }
    None
}

/// Forgets `dead_id` on every node in `addrs` that still knows it (FORGET bans a node id
/// for 60 s only on the node that ran it, so every node must run it). Refused if any
/// reachable node still sees a live replica following it, it still owns slots, or it
/// answers itself. Unreachable nodes are skipped (logged). Returns how many nodes forgot it.
pub async fn forget_everywhere(pool: &NodePool, addrs: &[String], dead_id: &str) -> Result<usize> {
    let mut views = Vec::new();
    for addr in addrs {
        match cluster_nodes(pool, addr).await {
            Ok(v) => views.push((addr.clone(), v)),
            Err(CommandError::Client(e)) if e.is_unreachable() => {
                warn!(addr, error = %e, "skipping unreachable node for FORGET");
            }
            Err(e) => return Err(e),
        }
    }
    if views.is_empty() {
        return Err(CommandError::NotReady("no reachable node".into()));
    }
    if let Some(reason) = forget_refusal(&views, dead_id) {
        return Err(CommandError::Refused(reason));
    }
    let mut forgot = 0;
    for (addr, nodes) in &views {
        if nodes.get(dead_id).is_none() {
            continue;
        }
        match exec(pool, addr, redis::cmd("CLUSTER").arg("FORGET").arg(dead_id)).await {
            Ok(()) => forgot += 1,
            Err(CommandError::Client(e)) if reply_contains(&e, "unknown node") => {}
            Err(e) => return Err(e),
        }
    }
    info!(node = dead_id, forgot, "cluster forget");
    Ok(forgot)
}

/// `CLUSTER RESET SOFT` on a node leaving the cluster: it forgets every other node and stops
/// gossiping (a primary that still holds keys refuses).
pub async fn reset_soft(pool: &NodePool, addr: &str) -> Result<()> {
    exec(pool, addr, redis::cmd("CLUSTER").arg("RESET").arg("SOFT")).await?;
    info!(addr, "cluster reset soft");
    Ok(())
}

/// Id of the node at `addr` and whether `other_addr`'s view contains it.
pub async fn knows(pool: &NodePool, addr: &str, other_addr: &str) -> Result<bool> {
    let id = node_id(pool, addr).await?;
    Ok(cluster_nodes(pool, other_addr).await?.get(&id).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failover_polls_back_to_back_then_every_2ms_then_slowly() {
        let ms = Duration::from_millis;
        assert_eq!(failover_poll_interval(ms(0)), Duration::ZERO);
        assert_eq!(failover_poll_interval(ms(49)), Duration::ZERO);
        assert_eq!(failover_poll_interval(ms(50)), FAILOVER_FAST_POLL);
        assert_eq!(failover_poll_interval(ms(999)), FAILOVER_FAST_POLL);
        assert_eq!(failover_poll_interval(ms(1000)), POLL_INTERVAL);
    }

    #[test]
    fn role_reply_of_a_primary() {
        use redis::Value::{BulkString, Int, SimpleString};
        assert!(role_is_primary(&[BulkString(b"master".to_vec()), Int(0)]));
        assert!(role_is_primary(&[SimpleString("master".into())]));
        assert!(!role_is_primary(&[BulkString(b"slave".to_vec())]));
        assert!(!role_is_primary(&[]));
    }

    fn view(text: &str) -> ClusterNodes {
        ClusterNodes::parse(text).unwrap()
    }

    const DEAD: &str = "d000000000000000000000000000000000000000";

    #[test]
    fn forget_refused_while_live_replica_follows() {
        let v = view(&format!(
            "a000000000000000000000000000000000000000 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-16383\n\
             {DEAD} 127.0.0.1:3@4 master,fail - 0 0 2 disconnected\n\
             b000000000000000000000000000000000000000 127.0.0.1:5@6 slave {DEAD} 0 0 2 connected\n"
        ));
        let r = forget_refusal(&[("x".into(), v)], DEAD);
        assert!(r.unwrap().contains("live replica"));
    }

    #[test]
    fn forget_allowed_for_failed_node_without_followers() {
        let v = view(&format!(
            "a000000000000000000000000000000000000000 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-16383\n\
             {DEAD} 127.0.0.1:3@4 master,fail - 0 0 2 disconnected\n\
             b000000000000000000000000000000000000000 127.0.0.1:5@6 slave,fail {DEAD} 0 0 2 disconnected\n"
        ));
        assert_eq!(forget_refusal(&[("x".into(), v)], DEAD), None);
    }

    #[test]
    fn forget_refused_when_dead_node_owns_slots_or_is_alive() {
        let v = view(&format!(
            "a000000000000000000000000000000000000000 127.0.0.1:1@2 myself,master - 0 0 1 connected 0-100\n\
             {DEAD} 127.0.0.1:3@4 master,fail - 0 0 2 disconnected 101-16383\n"
        ));
        assert!(
            forget_refusal(&[("x".into(), v)], DEAD)
                .unwrap()
                .contains("owns")
        );
        let alive = view(&format!(
            "{DEAD} 127.0.0.1:3@4 myself,master - 0 0 2 connected\n"
        ));
        assert!(
            forget_refusal(&[("y".into(), alive)], DEAD)
                .unwrap()
                .contains("alive")
        );
    }
}
