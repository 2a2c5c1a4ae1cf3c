//! Cluster helpers built on `valkey-ops`' idempotent commands: pools for the harness users,
//! forming a cluster, waiting for it to be healthy.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands::{self, AtomicMove, acl, migrate};
use valkey_ops::slots::{Slot, SlotRange};

use crate::bins::Flavor;
use crate::keys::{Move, owned_slots, plan_moves, write_keys};
use crate::server::{Server, start_servers};
use crate::tls::{TLS_SERVER_NAME, TlsFiles};
use crate::{APP_PASSWORD, APP_USER, OPERATOR_PASSWORD};

/// Operator pool (as `_operator`), optionally with TLS verifying [`TLS_SERVER_NAME`].
pub fn operator_pool(tls: Option<&TlsFiles>) -> NodePool {
    pool_for(acl::OPERATOR_USER, OPERATOR_PASSWORD, tls)
}

/// Pool for the application user (data traffic).
pub fn app_pool(tls: Option<&TlsFiles>) -> NodePool {
    pool_for(APP_USER, APP_PASSWORD, tls)
}

pub fn pool_for(user: &str, password: &str, tls: Option<&TlsFiles>) -> NodePool {
    let mut cfg = ClientConfig::new(user, password);
    if let Some(t) = tls {
        cfg = cfg.with_tls(t.ca_pem.clone(), Some(TLS_SERVER_NAME.to_owned()));
    }
    NodePool::new(cfg)
}

/// Balanced contiguous ranges for `n` primaries (the crate's initial-assignment planner).
pub fn split_slots(n: usize) -> Vec<SlotRange> {
    valkey_ops::slot_plan::initial_assignment(n).unwrap()
}

/// Polls until `f` returns `Some` (panics after `timeout`).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `cluster_state:ok` with all 16384 slots served.
pub fn cluster_healthy(o: &valkey_ops::model::NodeObservation) -> bool {
    o.cluster_info.as_ref().is_some_and(|c| c.is_healthy())
}

/// Waits until every node in `addrs` reports `cluster_state:ok`, 16384 slots and knows
/// exactly `addrs.len()` non-failed nodes.
pub async fn wait_cluster_ok(pool: &NodePool, addrs: &[String], timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let mut problems = Vec::new();
        for a in addrs {
            match commands::observe_node(pool, a).await {
                Ok(o) => {
                    let healthy = o
                        .nodes
                        .nodes
                        .iter()
                        .filter(|n| !n.flags.failing() && !n.flags.handshake)
                        .count();
                    if !cluster_healthy(&o) || healthy != addrs.len() {
                        problems.push(format!(
                            "{a}: {:?}, {healthy} healthy nodes\n{:#?}",
                            o.cluster_info,
                            o.nodes
                                .nodes
                                .iter()
                                .map(|n| (&n.id[..8], n.addr.host_port(), &n.flags, n.slot_count()))
                                .collect::<Vec<_>>()
                        ));
                    }
                }
                Err(e) => problems.push(format!("{a}: {e}")),
            }
        }
        if problems.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for cluster_state ok everywhere:\n{}",
            problems.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Forms a cluster of `primaries.len()` shards, each replica `replicas[i]` following
/// `primaries[i % primaries.len()]`, using the crate's idempotent commands.
/// Returns the primary node ids in order.
pub async fn form_cluster(
    pool: &NodePool,
    primaries: &[String],
    replicas: &[String],
) -> Vec<String> {
    let all: Vec<String> = primaries.iter().chain(replicas).cloned().collect();
    for (i, a) in all.iter().enumerate() {
        commands::ensure_config_epoch(pool, a, i as u64 + 1)
            .await
            .unwrap();
    }
    let ranges = split_slots(primaries.len());
    for (a, r) in primaries.iter().zip(&ranges) {
        commands::add_slots_range(pool, a, std::slice::from_ref(r))
            .await
            .unwrap();
    }
    join_nodes(pool, &all[0], &all[1..]).await;
    let mut ids = Vec::new();
    for p in primaries {
        ids.push(commands::node_id(pool, p).await.unwrap());
    }
    for (i, r) in replicas.iter().enumerate() {
        attach_replica(pool, r, &ids[i % ids.len()]).await;
    }
    wait_cluster_ok(pool, &all, Duration::from_secs(30)).await;
    ids
}

/// MEETs `nodes` through `seed` and waits until the seed knows them all.
pub async fn join_nodes(pool: &NodePool, seed: &str, nodes: &[String]) {
    for n in nodes {
        commands::meet(pool, seed, n.parse().unwrap())
            .await
            .unwrap();
    }
    for n in nodes {
        let id = commands::node_id(pool, n).await.unwrap();
        commands::topology::wait_known(pool, seed, &id, Duration::from_secs(20))
            .await
            .unwrap();
    }
}

/// Makes `replica` follow `primary_id`, retrying while the id is not gossiped yet.
pub async fn attach_replica(pool: &NodePool, replica: &str, primary_id: &str) {
    eventually("replicate", Duration::from_secs(20), || async {
        match commands::replicate(pool, replica, primary_id, None).await {
            Ok(_) => Some(()),
            Err(commands::CommandError::NotReady(_)) => None,
            Err(e) => panic!("replicate {replica}: {e}"),
        }
    })
    .await
}

/// Waits (up to 20 s, panicking with `what`) until `replica` reports its link to its primary
/// up and synced.
pub async fn wait_replica_synced(pool: &NodePool, replica: &str, what: &str) {
    eventually(what, Duration::from_secs(20), || async {
        commands::observe_node(pool, replica)
            .await
            .ok()?
            .replication?
            .is_synced_replica()
            .then_some(())
    })
    .await
}

/// Node id → address of every node in `addrs`.
pub async fn addrs_by_id(pool: &NodePool, addrs: &[String]) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for a in addrs {
        m.insert(commands::node_id(pool, a).await.unwrap(), a.clone());
    }
    m
}

/// A 3-shard cluster with one empty primary joined, from [`rig_with_new_primary`]: the four
/// servers (the new primary last), the operator and application pools, the servers'
/// addresses, the moves that rebalance the slots onto four shards, node id → address.
pub type NewPrimaryRig = (
    Vec<Server>,
    NodePool,
    NodePool,
    Vec<String>,
    Vec<Move>,
    HashMap<String, String>,
);

/// Starts three `flavor` primaries (no replicas) holding keys `0..keys` and joins a fourth,
/// empty one (see [`NewPrimaryRig`]).
pub async fn rig_with_new_primary(flavor: Flavor, keys: u64) -> NewPrimaryRig {
    let servers = start_servers(flavor, 4, None);
    let pool = operator_pool(None);
    let app = app_pool(None);
    let addrs: Vec<String> = servers.iter().map(Server::addr).collect();
    let ids = form_cluster(&pool, &addrs[..3], &[]).await;
    write_keys(&app, &addrs[0], keys).await;
    join_nodes(&pool, &addrs[0], &addrs[3..4]).await;
    wait_cluster_ok(&pool, &addrs, Duration::from_secs(30)).await;
    let new_id = commands::node_id(&pool, &addrs[3]).await.unwrap();
    let mut targets = ids.clone();
    targets.push(new_id);
    let moves = plan_moves(&owned_slots(&pool, &addrs[0]).await, &targets);
    let addr_of = addrs_by_id(&pool, &addrs).await;
    (servers, pool, app, addrs, moves, addr_of)
}

/// Runs slot `moves`, sources in parallel: on Valkey 9.1 one atomic slot migration per source
/// (each waited for up to `atomic_timeout`), on 8.0 key by key with the default options,
/// the moved slots assigned on `primaries` too.
pub async fn execute_moves(
    flavor: Flavor,
    pool: &NodePool,
    moves: &[Move],
    addr_of: &HashMap<String, String>,
    primaries: &[String],
    atomic_timeout: Duration,
) {
    match flavor {
        Flavor::V9 => {
            let mut by_src: HashMap<&str, Vec<AtomicMove>> = HashMap::new();
            for (s, d, set) in moves {
                by_src.entry(s).or_default().push(AtomicMove {
                    ranges: set.ranges().collect(),
                    target_id: d.clone(),
                });
            }
            futures::future::try_join_all(by_src.iter().map(|(s, m)| {
                commands::migrate_slots_atomic(pool, &addr_of[*s], m, atomic_timeout)
            }))
            .await
            .unwrap();
        }
        Flavor::V8 => {
            let opts = migrate::KeyMigrationOptions::default();
            futures::future::try_join_all(moves.iter().map(|(s, d, set)| {
                let slots: Vec<Slot> = set.iter().collect();
                let opts = &opts;
                async move {
                    commands::migrate_slot_keys(
                        pool,
                        &addr_of[s],
                        &addr_of[d],
                        &slots,
                        primaries,
                        opts,
                    )
                    .await
                }
            }))
            .await
            .unwrap();
        }
    }
}
