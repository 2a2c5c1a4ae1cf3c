//! Cluster helpers built on `valkey-ops`' idempotent commands: pools for the harness users,
//! forming a cluster, waiting for it to be healthy.

use std::time::{Duration, Instant};

use valkey_ops::client::{ClientConfig, NodePool};
use valkey_ops::commands::{self, acl};
use valkey_ops::slots::SlotRange;

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
        match commands::replicate(pool, replica, primary_id).await {
            Ok(_) => Some(()),
            Err(commands::CommandError::NotReady(_)) => None,
            Err(e) => panic!("replicate {replica}: {e}"),
        }
    })
    .await
}
